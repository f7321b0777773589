/* server/engine.c — see engine.h. */
#include "server/engine.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#include "server/clock.h"
#include "server/distributed.h"
#include "server/engine_rounds.h"
#include "server/evals.h"
#include "server/http.h"
#include "server/jobs.h"
#include "server/jpeg_header.h"
#include "server/log.h"
#include "server/lr_schedule.h"
#include "server/ring.h"

#define PLAN_CACHE 8
#define EVENTS_MAX 16
#define BUSY_WINDOW_NS 5000000000ull

typedef struct plan_entry {
    int h, w, c, eval, valid;
    sf_aug_plan plan;
} plan_entry;

#define PENDING_RECS 64 /* > any backend's max_inflight */
/* The token of an empty contribution to a data-parallel round: no ring slot. */
#define EMPTY_TOKEN ((void *)(intptr_t)-1)

/* What the engine keeps of a batch in flight beyond its timeline: the
 * samples its decoder left out. */
typedef struct pending_extra {
    uint64_t id;
    int n;                     /* the batch's samples, those left out included */
    int n_undecodable;         /* samples left out: their files did not decode */
    int32_t undecodable[SF_JOB_LISTED_UNDECODABLE];
    uint8_t undecodable_format[SF_JOB_LISTED_UNDECODABLE];
    int files_named_jpeg;
} pending_extra;

/* An eval batch in flight: the evaluation it must end exactly once
 * (sf_evals_add or sf_evals_add_failed at its STEP_DONE) and the logits
 * buffer its request holds (released then, once the backend has written
 * it). Found by id, not at id % PENDING_RECS as the records above: the
 * batch PENDING_RECS ids younger can be submitted while this one's step
 * still runs (transforms, and batches refused at submit, pass a long step),
 * and the job table forgets an id after pipeline.jobs_max more, so neither
 * can say at STEP_DONE that it was an eval batch. A record is taken only by
 * a batch the backend accepted, so at most max_inflight (< PENDING_RECS)
 * are in use. */
typedef struct inflight_eval {
    uint64_t id; /* 0: free */
    char name[SF_EVAL_NAME_MAX + 1];
    void *result_owner;
    void (*release_result)(void *owner);
} inflight_eval;

struct sf_engine {
    sf_engine_ctx cx;             /* what it needs of the process (sf_engine_start) */
    /* Commands to run between steps. */
    pthread_mutex_t cmd_mu;
    sf_engine_cmd *cmd_head, *cmd_tail;
    int ncmds;
    uint64_t next_cmd_id;
    void (*after_step)(struct sf_app *app, uint64_t step);
    uint64_t hooked_step; /* the step the hook last ran for, or training started at */
    /* Timelines: batches in flight by id % PENDING_RECS, and the last steps. */
    sf_step_record pending[PENDING_RECS];
    pending_extra extra[PENDING_RECS];
    inflight_eval evals[PENDING_RECS];
    pthread_mutex_t trace_mu;
    sf_step_record trace[SF_ENGINE_TRACE_STEPS];
    uint64_t trace_count;
    pthread_t thread;
    atomic_int running;
    atomic_int stop;
    _Atomic uint64_t stop_deadline_ns; /* the last in-flight wait ends here (0: none) */
    atomic_int inflight;
    int max_batch;
    sf_aug_sample **samples;   /* per slot: max_batch parameters, owned until SLOT_FREE */
    int *src_hw;               /* encoded batches: (h, w) of each sample, 2 * max_batch */
    sf_jpeg_file *jpeg_files;  /* encoded batches: each file's length and forms, max_batch */
    uint8_t *undecodable;      /* encoded batches: the samples the backend left out, max_batch */
    plan_entry plans[PLAN_CACHE];
    int next_plan;
    /* Busy-ratio window and starvation accounting (compute-side edges). */
    uint64_t win_start_ns;
    double win_busy_s;
    uint64_t last_step_end_ns;
    /* The learning-rate schedule's position: training batches submitted,
     * counted from sched_gen's restore (step * grad_accum_steps then),
     * so batch b belongs to optimizer step b / grad_accum_steps. */
    uint64_t sched_batches, sched_gen;
    int sched_init;
    /* The schedule parsed from the config of generation sched_cfg_gen: parsed
     * again only when a PATCH changed the config, not per batch. */
    sf_lr_sched sched;
    uint64_t sched_cfg_gen;
    /* Cached metric children for the hot path. */
    sf_metric *m_samples, *m_steps, *m_loss, *m_lr, *m_queue, *m_h2d,
        *m_transform, *m_step, *m_busy, *m_starved, *m_skipped, *m_skipped_empty, *m_grad_norm;
};

static const sf_aug_pipeline *pipeline_of(sf_engine *e, int eval)
{
    return eval ? e->cx.aug_eval : e->cx.aug;
}

static const sf_aug_plan *plan_for(sf_engine *e, int h, int w, int c, int eval, char *err, size_t errlen)
{
    for (int i = 0; i < PLAN_CACHE; i++) {
        plan_entry *p = &e->plans[i];
        if (p->valid && p->h == h && p->w == w && p->c == c && p->eval == eval)
            return &p->plan;
    }
    plan_entry *p = &e->plans[e->next_plan];
    e->next_plan = (e->next_plan + 1) % PLAN_CACHE;
    p->valid = 0;
    /* 0 x 0 names the ragged plan of encoded batches (every sample its own size). */
    if (h == 0 && w == 0 ? sf_aug_plan_make_ragged(pipeline_of(e, eval), c, &p->plan, err, errlen)
                         : sf_aug_plan_make(pipeline_of(e, eval), h, w, c, &p->plan, err, errlen))
        return NULL;
    p->eval = eval;
    p->h = h;
    p->w = w;
    p->c = c;
    p->valid = 1;
    return &p->plan;
}

static void finish_failed(sf_engine *e, uint64_t id, const char *code, const char *msg)
{
    sf_jobs_fail(e->cx.jobs, id, code, msg);
    sf_http_wake(*e->cx.http, SF_WAIT_JOB, id);
}

/* An accepted batch in the ring that will not run: its result and slot go
 * back, an eval batch counts as a failure of its evaluation (GET /v1/evals'
 * failed_batches), and the batch reports why. */
void engine_fail_batch(sf_engine *e, int slot, const char *code, const char *msg)
{
    const sf_engine_ctx *cx = &e->cx;
    sf_slot_meta *m = sf_ring_meta(cx->ring, slot);
    const uint64_t id = m->job_id;
    if (m->eval)
        sf_evals_add_failed(cx->evals, m->eval_name);
    if (m->release_result)
        m->release_result(m->result_owner);
    sf_ring_release(cx->ring, slot);
    finish_failed(e, id, code, msg);
}

/* Sink mode: check the slot and mark the batch done without computing. */
static void run_sink(sf_engine *e, int slot)
{
    sf_slot_meta *m = sf_ring_meta(e->cx.ring, slot);
    /* Eval batches need a backend (handlers/batches.c refuses them in sink
     * mode); should one come, it still ends, unevaluated, so that its
     * evaluation is not pending for good. */
    if (m->eval)
        sf_evals_add_failed(e->cx.evals, m->eval_name);
    sf_job job = {0};
    job.id = m->job_id;
    job.n = m->n;
    job.kind = m->kind;
    job.queue_s = (double)(m->t_popped_ns - m->t_ready_ns) / 1e9;
    if (m->release_result)
        m->release_result(m->result_owner);
    sf_ring_release(e->cx.ring, slot);
    sf_jobs_done(e->cx.jobs, &job);
    sf_http_wake(*e->cx.http, SF_WAIT_JOB, job.id);
}

/* The learning rate of the optimizer step the next training batch belongs
 * to. With gradient accumulation the backend steps with the hyperparameters
 * of the group's last batch; every batch of a group gets the same step index,
 * so a PATCH of the schedule applies from the next optimizer step. */
static double sched_lr(sf_engine *e, const sf_config *c)
{
    const sf_engine_ctx *cx = &e->cx;
    uint64_t k = c->model.grad_accum_steps > 1 ? (uint64_t)c->model.grad_accum_steps : 1;
    uint64_t gen = atomic_load(cx->restore_gen);
    if (!e->sched_init || gen != e->sched_gen) {
        /* Start-up or a restore: nothing is in flight and the backend's
         * accumulation starts afresh at its step count. */
        e->sched_init = 1;
        e->sched_gen = gen;
        e->sched_batches = atomic_load(cx->step) * k;
    }
    /* The generation is read before the config it labels: a PATCH in between
     * leaves a newer config under an older number, parsed again next batch. */
    const uint64_t cfg_gen = sf_config_generation();
    if (e->sched_cfg_gen != cfg_gen) {
        char err[160];
        if (sf_lr_sched_from_config(sf_config_cur(), &e->sched, err, sizeof err) != 0)
            return c->optim.lr; /* unreachable: the config check refused it */
        e->sched_cfg_gen = cfg_gen;
    }
    return sf_lr_at(&e->sched, e->sched_batches / k);
}

/* The optimizer's settings of a step: every rank of a data-parallel job,
 * with a batch or an empty contribution, must step with the same ones. */
static void fill_hyper(sf_hyper *h, const sf_config *c, double lr)
{
    h->lr = (float)lr;
    h->momentum = (float)c->optim.momentum;
    h->weight_decay = (float)c->optim.weight_decay;
    h->beta1 = c->optim.beta1;
    h->beta2 = c->optim.beta2;
    h->eps = (float)c->optim.eps;
    h->clip_grad_norm = (float)c->optim.clip_grad_norm;
}

/* The backend marks each sample it left out with 1; each mark becomes 1 +
 * its file's format, which names the sample's code (jpeg_undecodable,
 * png_undecodable, webp_undecodable). */
static void mark_formats(sf_engine *e, int slot)
{
    sf_slot_meta *m = sf_ring_meta(e->cx.ring, slot);
    const sf_jpeg_info *ji = (const sf_jpeg_info *)(const void *)(sf_ring_bytes(e->cx.ring, slot) + m->jpeg_info_off);
    for (int i = 0; i < m->n; i++)
        if (e->undecodable[i])
            e->undecodable[i] = (uint8_t)(1 + ji[i].format);
}

static int fill_batch(sf_engine *e, int slot, sf_batch *b, int train, char *err, size_t errlen)
{
    const sf_engine_ctx *cx = &e->cx;
    sf_slot_meta *m = sf_ring_meta(cx->ring, slot);
    uint8_t *bytes = sf_ring_bytes(cx->ring, slot);
    if (m->n > e->max_batch) {
        snprintf(err, errlen, "batch of %d exceeds model.max_batch %d", m->n, e->max_batch);
        return -1;
    }
    const int eval = m->kind == 0 && m->eval;
    const sf_aug_plan *plan = plan_for(e, m->h, m->w, m->c, eval, err, errlen);
    if (!plan)
        return -1;
    const sf_aug_pipeline *pipe = pipeline_of(e, eval);
    sf_aug_sample *smp = e->samples[slot];
    /* The batch sequence number keys the augmentation RNG: the job id is
     * monotonic and unique, so a run is reproducible from the seed. */
    if (m->encoded) {
        /* Each decoded image's size, from the headers the upload read. */
        const sf_jpeg_info *ji = (const sf_jpeg_info *)(const void *)(bytes + m->jpeg_info_off);
        for (int i = 0; i < m->n; i++) {
            e->src_hw[2 * i] = ji[i].h;
            e->src_hw[2 * i + 1] = ji[i].w;
            e->jpeg_files[i].len = ji[i].data_len;
            e->jpeg_files[i].forms = sf_jpeg_forms(&ji[i]);
            /* The upload kept an orientation other than 1 only under
             * decode.exif_orientation apply, with the turned size above. */
            e->jpeg_files[i].orientation = ji[i].orientation;
            if (ji[i].orientation > 1)
                e->jpeg_files[i].forms |= SF_JPEG_FORM_ORIENTED;
        }
        sf_aug_gen_ragged(pipe, plan, (uint64_t)cx->cfg->augment.seed, m->job_id, m->n, e->src_hw, smp);
    } else {
        sf_aug_gen(pipe, plan, (uint64_t)cx->cfg->augment.seed, m->job_id, m->n, smp);
    }
    const sf_config *c = sf_config_cur();
    memset(b, 0, sizeof *b);
    b->id = m->job_id;
    b->seq = m->job_id;
    b->token = (void *)(intptr_t)slot;
    b->n = m->n;
    b->h = m->h;
    b->w = m->w;
    b->c = m->c;
    b->nhwc = m->nhwc;
    if (m->encoded) {
        b->jpeg = bytes;
        b->jpeg_off = (const int64_t *)(const void *)(bytes + m->jpeg_offsets_off);
        b->jpeg_files = e->jpeg_files;
        b->skip_undecodable = strcmp(c->decode.on_undecodable, "skip") == 0;
        b->undecodable = e->undecodable;
        memset(e->undecodable, 0, (size_t)m->n);
        b->jpeg_forms = m->jpeg_forms;
        b->decoded_bytes = m->decoded_bytes;
    } else {
        b->images = bytes;
    }
    b->label_dtype = m->label_dtype < 0 ? SF_LABEL_U8 : (sf_label_dtype)m->label_dtype;
    b->labels = m->label_dtype < 0 ? NULL : bytes + m->labels_off;
    b->plan = plan;
    b->samples = smp;
    /* The batch-level mixing, keyed like the samples; its lam is the loss's.
     * A transform mixes too: it shows what a training step would see; an
     * eval batch never does (its pipeline refuses mixup and cutmix). */
    sf_aug_gen_mix(pipe, plan, (uint64_t)cx->cfg->augment.seed, m->job_id, eval ? 0 : m->n, &b->mix);
    /* An eval batch takes no step: it neither uses nor advances the schedule. */
    const int step = train && !eval;
    double lr = step ? sched_lr(e, c) : c->optim.lr;
    fill_hyper(&b->hyper, c, lr);
    b->label_smoothing = (float)c->loss.label_smoothing;
    b->mix_lam = sf_aug_mix_loss_lam(&b->mix);
    b->eval = eval;
    b->logits_out = eval ? m->result : NULL;
    b->t_ready_ns = m->t_ready_ns;
    if (step)
        sf_gauge_set(e->m_lr, lr);
    return 0;
}

/* The error code of a batch whose submit() or transform() returned rc != 0:
 * a file the decoder refuses is the client's (jpeg_undecodable); a decoder
 * that could not be made is the device memory's, counted, and the next
 * encoded batch tries again (jpeg_decoder_unavailable); anything else is
 * the backend's (other). */
static const char *failure_code(sf_engine *e, int rc, const char *other)
{
    if (rc == SF_BACKEND_BAD_INPUT)
        return "jpeg_undecodable";
    if (rc == SF_BACKEND_NO_DECODER) {
        sf_counter_add(sf_metric_only(e->cx.m->jpeg_decoder_unavailable), 1);
        return "jpeg_decoder_unavailable";
    }
    return other;
}

/* Transform-only batches run synchronously on the engine thread (the backend
 * is single-threaded by contract); the output goes to the request's buffer. */
void engine_run_transform(sf_engine *e, int slot)
{
    const sf_engine_ctx *cx = &e->cx;
    sf_slot_meta *m = sf_ring_meta(cx->ring, slot);
    sf_batch b;
    char err[256];
    uint64_t id = m->job_id;
    void *owner = m->result_owner;
    void (*release)(void *) = m->release_result;
    int rc = fill_batch(e, slot, &b, 0, err, sizeof err) ? -1 : 0;
    if (!rc)
        rc = cx->backend->i->transform(cx->backend, &b, m->result, err, sizeof err);
    sf_job job = {0};
    if (m->encoded && (rc == 0 || rc == SF_BACKEND_BAD_INPUT)) {
        mark_formats(e, slot);
        sf_job_set_undecodable(&job, e->undecodable, m->n);
        job.files_named_jpeg = m->files_named_jpeg;
        sf_counter_add(sf_metric_only(cx->m->samples_undecodable), job.n_undecodable);
    }
    if (rc) {
        sf_ring_release(cx->ring, slot);
        if (release)
            release(owner);
        /* A file the decoder refuses is the client's error (POST /v1/transform
         * answers 422 with this code); a decoder that could not be made, 503;
         * anything else is the service's. */
        finish_failed(e, id, failure_code(e, rc, "transform_failed"), err);
        return;
    }
    job.id = id;
    job.n = m->n;
    job.kind = 1;
    job.queue_s = (double)(m->t_popped_ns - m->t_ready_ns) / 1e9;
    job.transform_s = (double)(sf_now_ns() - m->t_popped_ns) / 1e9;
    sf_ring_release(cx->ring, slot);
    if (release)
        release(owner);
    sf_jobs_done(cx->jobs, &job);
    sf_http_wake(*cx->http, SF_WAIT_JOB, id);
}

void engine_submit(sf_engine *e, int slot, int64_t global_n)
{
    const sf_engine_ctx *cx = &e->cx;
    sf_slot_meta *m = sf_ring_meta(cx->ring, slot);
    m->t_popped_ns = sf_now_ns();
    sf_hist_observe(e->m_queue, (double)(m->t_popped_ns - m->t_ready_ns) / 1e9);
    if (!cx->backend) {
        run_sink(e, slot);
        return;
    }
    if (m->kind == 1) {
        engine_run_transform(e, slot);
        return;
    }
    sf_batch b;
    char err[256];
    uint64_t id = m->job_id;
    sf_jobs_set_state(cx->jobs, id, SF_JOB_TRANSFORMING);
    sf_step_record *rec = &e->pending[id % PENDING_RECS];
    memset(rec, 0, sizeof *rec);
    rec->id = id;
    rec->n = m->n;
    rec->h = m->h;
    rec->w = m->w;
    rec->c = m->c;
    rec->nhwc = m->nhwc;
    rec->label_dtype = m->label_dtype;
    rec->t_recv_start = m->t_filling_ns;
    rec->t_ready = m->t_ready_ns;
    rec->t_popped = m->t_popped_ns;
    pending_extra *x = &e->extra[id % PENDING_RECS];
    memset(x, 0, sizeof *x);
    x->id = id;
    inflight_eval *ie = NULL;
    for (int i = 0; m->eval && i < PENDING_RECS && !ie; i++)
        if (!e->evals[i].id)
            ie = &e->evals[i];
    if (m->eval && !ie) { /* cannot happen: more in flight than any backend takes */
        engine_fail_batch(e, slot, "submit_failed", "too many eval batches in flight");
        return;
    }
    int rc = fill_batch(e, slot, &b, 1, err, sizeof err) ? -1 : 0;
    if (!rc) {
        b.global_n = global_n;
        rc = cx->backend->i->submit(cx->backend, &b, err, sizeof err);
    }
    x->n = m->n;
    if (m->encoded && (rc == 0 || rc == SF_BACKEND_BAD_INPUT)) {
        /* The samples the backend left out, known once submit returned. */
        sf_job marks = {0};
        mark_formats(e, slot);
        sf_job_set_undecodable(&marks, e->undecodable, m->n);
        x->n_undecodable = marks.n_undecodable;
        memcpy(x->undecodable, marks.undecodable, sizeof x->undecodable);
        memcpy(x->undecodable_format, marks.undecodable_format, sizeof x->undecodable_format);
        x->files_named_jpeg = m->files_named_jpeg;
        sf_counter_add(sf_metric_only(cx->m->samples_undecodable), marks.n_undecodable);
    }
    if (rc) {
        /* A file the decoder refuses is the client's error, as on POST
         * /v1/transform; a decoder that could not be made is said so;
         * anything else is the service's. */
        engine_fail_batch(e, slot, failure_code(e, rc, "submit_failed"), err);
        return;
    }
    /* The logits buffer stays the request's until STEP_DONE, after the slot
     * itself went back to the ring at SLOT_FREE. */
    if (ie) {
        ie->id = id;
        snprintf(ie->name, sizeof ie->name, "%s", m->eval_name);
        ie->result_owner = m->result_owner;
        ie->release_result = m->release_result;
    }
    if (!m->eval)
        e->sched_batches++;
    atomic_fetch_add(&e->inflight, 1);
}

static void account_busy(sf_engine *e, const sf_event *ev)
{
    uint64_t now = sf_now_ns();
    if (!e->win_start_ns)
        e->win_start_ns = now;
    e->win_busy_s += ev->step_s;
    /* Starvation: the compute side sat idle between two steps while batches
     * were flowing. Gaps over a second are an idle service, not starvation. */
    if (ev->t_step_start_ns && e->last_step_end_ns && ev->t_step_start_ns > e->last_step_end_ns) {
        double gap = (double)(ev->t_step_start_ns - e->last_step_end_ns) / 1e9;
        if (gap < 1.0)
            sf_counter_add(e->m_starved, gap);
    }
    if (ev->t_step_end_ns)
        e->last_step_end_ns = ev->t_step_end_ns;
    if (now - e->win_start_ns >= BUSY_WINDOW_NS) {
        double wall = (double)(now - e->win_start_ns) / 1e9;
        double r = e->win_busy_s / wall;
        sf_gauge_set(e->m_busy, r > 1 ? 1 : r);
        e->win_start_ns = now;
        e->win_busy_s = 0;
    }
}

/* Non-finite steps and gradient norms. A skipped step is no step: the
 * counter of steps taken stays, the skip is counted by reason, and
 * train.max_nonfinite_in_row non-finite ones in a row make the service
 * unready ("diverged"); a step that trains again clears that. A batch in the
 * middle of an accumulation group takes no optimizer step (grad_norm 0, not
 * skipped) and changes neither. (A data-parallel step in which no rank
 * trained a sample, SF_SKIP_EMPTY, has only empty contributions: harvest
 * counts it with them.) */
static void account_step(sf_engine *e, const sf_event *ev)
{
    const sf_engine_ctx *cx = &e->cx;
    if (ev->skipped) {
        sf_counter_add(e->m_skipped, 1);
        int in_row = atomic_fetch_add(cx->nonfinite_in_row, 1) + 1;
        if (in_row >= sf_config_cur()->train.max_nonfinite_in_row && !atomic_exchange(cx->diverged, 1))
            SF_WARN("diverged: %d optimizer steps in a row skipped for a NaN/Inf loss or gradient "
                     "(train.max_nonfinite_in_row); readyz is false until a checkpoint is restored",
                     in_row);
        return;
    }
    sf_counter_add(e->m_steps, 1);
    if (ev->grad_norm > 0.0f) {
        sf_hist_observe(e->m_grad_norm, ev->grad_norm);
        atomic_store(cx->nonfinite_in_row, 0);
        if (atomic_exchange(cx->diverged, 0))
            SF_INFO("a step trained again after a divergence: ready");
    }
}

/* The after-step hook (periodic checkpoints) runs once per optimizer step:
 * a batch inside an accumulation group, or a skipped step, leaves the step
 * count where it was, and the hook saw that step already. */
static void step_taken(sf_engine *e, uint64_t step)
{
    if (!e->after_step || step == e->hooked_step)
        return;
    e->hooked_step = step;
    e->after_step(e->cx.app, step);
}

/* A job's samples left out (their files did not decode), from the record
 * submit kept: the job's n counts them, the event's n only those decoded. */
static void take_undecodable(sf_job *job, const pending_extra *x, const sf_event *ev)
{
    if (x->id != ev->id || x->n_undecodable == 0)
        return;
    job->n = x->n;
    job->n_undecodable = x->n_undecodable;
    memcpy(job->undecodable, x->undecodable, sizeof job->undecodable);
    memcpy(job->undecodable_format, x->undecodable_format, sizeof job->undecodable_format);
    job->files_named_jpeg = x->files_named_jpeg;
}

/* An eval batch's result: its reply, its evaluation's aggregates and metrics.
 * No step was taken: the step count and the training metrics stay. */
static void harvest_eval(sf_engine *e, const sf_event *ev, const sf_step_record *rec, const pending_extra *x,
                         const char *eval_name)
{
    const sf_engine_ctx *cx = &e->cx;
    sf_job job = {0};
    if (sf_jobs_get(cx->jobs, ev->id, &job))
        job.id = ev->id;
    job.kind = SF_JOB_KIND_EVAL;
    job.n = ev->n;
    take_undecodable(&job, x, ev);
    job.trained = 1;
    snprintf(job.eval_name, sizeof job.eval_name, "%s", eval_name);
    if (rec->id == ev->id && rec->t_popped >= rec->t_ready)
        job.queue_s = (double)(rec->t_popped - rec->t_ready) / 1e9;
    job.step = ev->step;
    job.loss = ev->loss;
    const int64_t scored = ev->n_labels > 0 ? ev->n_labels : ev->n;
    job.accuracy = scored ? (double)ev->correct / (double)scored : 0;
    job.top5 = scored ? (double)ev->correct5 / (double)scored : 0;
    job.h2d_s = ev->h2d_s;
    job.transform_s = ev->transform_s;
    job.step_s = ev->step_s;
    job.t_done_ns = sf_now_ns();
    /* The evaluation first (its metrics too, server/app.c's publish hook),
     * then the job: a client that saw its batch done may delete the
     * evaluation at once, and finds nothing of the batch pending. */
    sf_evals_add(cx->evals, eval_name, (uint64_t)ev->n, (uint64_t)scored, ev->loss, (uint64_t)ev->correct,
                 (uint64_t)ev->correct5, ev->step);
    sf_jobs_done(cx->jobs, &job);
    account_busy(e, ev);
    sf_http_wake(*cx->http, SF_WAIT_JOB, ev->id);
}

/* At a batch's STEP_DONE: the evaluation it belongs to (copied to name),
 * or 0 for a training batch. An eval batch's record goes, and with it the
 * engine's hold on its logits buffer. */
static int eval_of(sf_engine *e, const sf_event *ev, char *name, size_t cap)
{
    for (int i = 0; i < PENDING_RECS; i++) {
        inflight_eval *ie = &e->evals[i];
        if (ie->id != ev->id)
            continue;
        snprintf(name, cap, "%s", ie->name);
        if (ie->release_result)
            ie->release_result(ie->result_owner);
        memset(ie, 0, sizeof *ie);
        return 1;
    }
    return 0;
}

static void harvest(sf_engine *e, const sf_event *ev)
{
    const sf_engine_ctx *cx = &e->cx;
    if (ev->token == EMPTY_TOKEN) {
        /* An empty contribution: no slot, no job; the step count moves, and
         * the step is the job's like any other (rank 0's periodic
         * checkpoints fall on it too). */
        if (ev->kind == SF_EV_STEP_DONE) {
            atomic_fetch_sub(&e->inflight, 1);
            if (ev->status == 0) {
                if (ev->skipped == SF_SKIP_EMPTY) /* the round's batches were all refused */
                    sf_counter_add(e->m_skipped_empty, 1);
                atomic_store(cx->step, ev->step);
                step_taken(e, ev->step);
            }
        }
        return;
    }
    int slot = (int)(intptr_t)ev->token;
    if (ev->kind == SF_EV_SLOT_FREE) {
        /* The H2D copy is complete: the host bytes may be reused. */
        sf_ring_release(cx->ring, slot);
        sf_jobs_set_state(cx->jobs, ev->id, SF_JOB_TRAINING);
        return;
    }
    atomic_fetch_sub(&e->inflight, 1);
    pending_extra *x = &e->extra[ev->id % PENDING_RECS];
    char eval_name[SF_EVAL_NAME_MAX + 1];
    const int eval = eval_of(e, ev, eval_name, sizeof eval_name);
    sf_step_record *rec = &e->pending[ev->id % PENDING_RECS];
    if (rec->id == ev->id) {
        rec->step = ev->step;
        rec->status = ev->status;
        rec->loss = ev->loss;
        rec->t_h2d_start = ev->t_h2d_start_ns;
        rec->t_transform_start = ev->t_transform_start_ns;
        rec->t_step_start = ev->t_step_start_ns;
        rec->t_step_end = ev->t_step_end_ns;
        rec->h2d_s = ev->h2d_s;
        rec->transform_s = ev->transform_s;
        rec->step_s = ev->step_s;
        pthread_mutex_lock(&e->trace_mu);
        e->trace[e->trace_count % SF_ENGINE_TRACE_STEPS] = *rec;
        e->trace_count++;
        pthread_mutex_unlock(&e->trace_mu);
    }
    if (ev->status != 0) {
        SF_WARN("batch %llu failed: %s", (unsigned long long)ev->id, ev->err);
        /* A batch that failed inside a data-parallel round may still have
         * joined the round's step (the reference backend's labels check):
         * the step count follows the backend's. */
        if (ev->step > atomic_load(cx->step)) {
            atomic_store(cx->step, ev->step);
            step_taken(e, ev->step);
        }
        if (eval)
            sf_evals_add_failed(cx->evals, eval_name);
        finish_failed(e, ev->id, "step_failed", ev->err);
        char herr[160];
        if (cx->backend->i->health(cx->backend, herr, sizeof herr)) {
            atomic_store(cx->backend_ok, 0);
            SF_ERROR("backend unhealthy: %s", herr);
        }
        return;
    }
    if (ev->decoder[0]) {
        /* Which decoder ran each JPEG batch, trained or evaluated:
         * the choice is per batch. */
        char dec[sizeof ev->decoder + 1];
        snprintf(dec, sizeof dec, "%.*s", (int)sizeof ev->decoder, ev->decoder);
        const char *lv[] = {dec};
        sf_counter_add(sf_metric_child(cx->m->jpeg_batches, lv), 1);
        /* On CUDA the files nvJPEG does not take were decoded on the host:
         * their samples count under libjpeg-turbo. */
        const int on_host = ev->decoded_on_host > 0 && ev->decoded_on_host <= ev->n &&
                            strcmp(dec, "libjpeg-turbo") != 0 ? ev->decoded_on_host : 0;
        sf_counter_add(sf_metric_child(cx->m->jpeg_samples, lv), ev->n - on_host);
        if (on_host) {
            const char *host[] = {"libjpeg-turbo"};
            sf_counter_add(sf_metric_child(cx->m->jpeg_samples, host), on_host);
        }
        sf_counter_add(sf_metric_child(cx->m->jpeg_decode_host, lv), ev->decode_host_s);
    }
    if (eval) {
        harvest_eval(e, ev, rec, x, eval_name);
        return;
    }
    sf_job job = {0};
    if (sf_jobs_get(cx->jobs, ev->id, &job))
        job.id = ev->id;
    job.n = ev->n;
    take_undecodable(&job, x, ev);
    job.trained = 1;
    job.skipped = ev->skipped;
    if (rec->id == ev->id && rec->t_popped >= rec->t_ready)
        job.queue_s = (double)(rec->t_popped - rec->t_ready) / 1e9;
    job.step = ev->step;
    job.loss = ev->loss;
    /* Pixel accuracy for a segmentation model: n_labels counts the pixels. */
    const int64_t scored = ev->n_labels > 0 ? ev->n_labels : ev->n;
    job.accuracy = scored ? (double)ev->correct / (double)scored : 0;
    job.h2d_s = ev->h2d_s;
    job.transform_s = ev->transform_s;
    job.step_s = ev->step_s;
    job.t_done_ns = sf_now_ns();
    sf_jobs_done(cx->jobs, &job);
    sf_counter_add(e->m_samples, ev->n);
    account_step(e, ev);
    atomic_store(cx->step, ev->step); /* the backend's count: continues after a restore */
    sf_gauge_set(e->m_loss, ev->loss);
    sf_hist_observe(e->m_h2d, ev->h2d_s);
    sf_hist_observe(e->m_transform, ev->transform_s);
    sf_hist_observe(e->m_step, ev->step_s);
    account_busy(e, ev);
    sf_http_wake(*cx->http, SF_WAIT_JOB, ev->id);
    step_taken(e, ev->step);
}

/* ---- commands -------------------------------------------------------------- */

sf_engine_cmd *sf_engine_cmd_new(int (*fn)(struct sf_app *, void *, char *, size_t), void *arg,
                                 void (*free_arg)(void *))
{
    sf_engine_cmd *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->fn = fn;
    c->arg = arg;
    c->free_arg = free_arg;
    atomic_init(&c->refs, 1);
    return c;
}

void sf_engine_cmd_release(sf_engine_cmd *c)
{
    if (c && atomic_fetch_sub(&c->refs, 1) == 1) {
        if (c->free_arg)
            c->free_arg(c->arg);
        free(c);
    }
}

int sf_engine_post(sf_engine *e, sf_engine_cmd *c)
{
    pthread_mutex_lock(&e->cmd_mu);
    if (atomic_load(&e->stop) || !atomic_load(&e->running) || e->ncmds >= SF_ENGINE_MAX_CMDS) {
        pthread_mutex_unlock(&e->cmd_mu);
        return -1;
    }
    c->id = ++e->next_cmd_id;
    c->next = NULL;
    atomic_fetch_add(&c->refs, 1);
    if (e->cmd_tail)
        e->cmd_tail->next = c;
    else
        e->cmd_head = c;
    e->cmd_tail = c;
    e->ncmds++;
    pthread_mutex_unlock(&e->cmd_mu);
    /* The engine may be blocked on the ring's condition: wake it. */
    sf_ring_kick(e->cx.ring);
    return 0;
}

int engine_has_cmds(sf_engine *e)
{
    pthread_mutex_lock(&e->cmd_mu);
    int n = e->ncmds;
    pthread_mutex_unlock(&e->cmd_mu);
    return n;
}

/* Runs every queued command; called with nothing in flight. */
void engine_run_cmds(sf_engine *e)
{
    for (;;) {
        pthread_mutex_lock(&e->cmd_mu);
        sf_engine_cmd *c = e->cmd_head;
        if (c) {
            e->cmd_head = c->next;
            if (!e->cmd_head)
                e->cmd_tail = NULL;
            e->ncmds--;
        }
        pthread_mutex_unlock(&e->cmd_mu);
        if (!c)
            return;
        c->status = c->fn(e->cx.app, c->arg, c->err, sizeof c->err);
        atomic_store(&c->done, 1);
        sf_http_wake(*e->cx.http, SF_WAIT_CMD, c->id);
        sf_engine_cmd_release(c);
    }
}

void sf_engine_set_after_step(sf_engine *e, void (*fn)(struct sf_app *app, uint64_t step))
{
    e->after_step = fn;
}

int sf_engine_trace(sf_engine *e, sf_step_record *out, int max)
{
    pthread_mutex_lock(&e->trace_mu);
    uint64_t have = e->trace_count < SF_ENGINE_TRACE_STEPS ? e->trace_count : SF_ENGINE_TRACE_STEPS;
    uint64_t n = (uint64_t)max < have ? (uint64_t)max : have;
    for (uint64_t i = 0; i < n; i++)
        out[i] = e->trace[(e->trace_count - n + i) % SF_ENGINE_TRACE_STEPS];
    pthread_mutex_unlock(&e->trace_mu);
    return (int)n;
}

const sf_engine_ctx *engine_ctx(sf_engine *e) { return &e->cx; }

int engine_inflight(sf_engine *e) { return atomic_load(&e->inflight); }

int engine_stopping(sf_engine *e) { return atomic_load(&e->stop); }

uint64_t engine_stop_deadline_ns(sf_engine *e) { return atomic_load(&e->stop_deadline_ns); }

int engine_poll(sf_engine *e, int timeout_us)
{
    sf_backend *be = e->cx.backend;
    if (!be || atomic_load(&e->inflight) == 0)
        return 0;
    sf_event ev[EVENTS_MAX];
    int n = be->i->poll(be, ev, EVENTS_MAX, timeout_us);
    for (int i = 0; i < n; i++)
        harvest(e, &ev[i]);
    return n;
}

/* This rank's part of a round without a batch: zero gradient, zero weight. */
int engine_submit_empty(sf_engine *e, int64_t global_n, char *err, size_t errlen)
{
    const sf_config *c = sf_config_cur();
    sf_batch b;
    memset(&b, 0, sizeof b);
    b.token = EMPTY_TOKEN;
    b.global_n = global_n;
    const double lr = sched_lr(e, c);
    fill_hyper(&b.hyper, c, lr);
    b.t_ready_ns = sf_now_ns();
    sf_gauge_set(e->m_lr, lr);
    if (e->cx.backend->i->submit(e->cx.backend, &b, err, errlen))
        return -1;
    e->sched_batches++;
    atomic_fetch_add(&e->inflight, 1);
    return 0;
}

static void *engine_main(void *arg)
{
    sf_engine *e = arg;
    const sf_engine_ctx *cx = &e->cx;
    int maxq = cx->backend ? cx->backend->i->max_inflight(cx->backend) : 1;
    /* The step it starts from (resumed or 0) was not taken here. */
    e->hooked_step = atomic_load(cx->step);
    atomic_store(&e->running, 1);
    if (cx->dist && cx->backend)
        engine_rounds(e);
    while (!atomic_load(&e->stop)) {
        int inflight = atomic_load(&e->inflight);
        int took = 0;
        if (engine_has_cmds(e)) {
            /* Drain the pipeline, then run the commands between two steps. */
            if (inflight == 0)
                engine_run_cmds(e);
            else
                engine_poll(e, 1000);
            continue;
        }
        if (inflight < maxq) {
            /* With work in flight, only peek at the ring so completions are
             * harvested promptly; when idle, block on the ring's condition. */
            int slot = sf_ring_pop(cx->ring, inflight ? 0 : 100);
            if (slot >= 0) {
                engine_submit(e, slot, 0);
                took = 1;
            }
        }
        if (atomic_load(&e->inflight) > 0) {
            int full = atomic_load(&e->inflight) >= maxq;
            engine_poll(e, took ? 0 : (full ? 2000 : 200));
        }
    }
    /* Let what was submitted finish, so no batch is left half-done; but not
     * past the stop deadline (sf_engine_stop_by), nor 100 s. */
    uint64_t dl = atomic_load(&e->stop_deadline_ns);
    for (int tries = 0; atomic_load(&e->inflight) > 0 && tries < 100000; tries++) {
        if (dl && sf_now_ns() >= dl)
            break;
        engine_poll(e, 1000);
    }
    atomic_store(&e->running, 0);
    return NULL;
}

sf_engine *sf_engine_start(const sf_engine_ctx *ctx, char *err, size_t errlen)
{
    sf_engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    e->cx = *ctx;
    const sf_engine_ctx *cx = &e->cx;
    e->max_batch = cx->cfg->model.max_batch;
    pthread_mutex_init(&e->cmd_mu, NULL);
    pthread_mutex_init(&e->trace_mu, NULL);
    int slots = sf_ring_slots(cx->ring);
    e->src_hw = calloc(2 * (size_t)e->max_batch, sizeof *e->src_hw);
    e->jpeg_files = calloc((size_t)e->max_batch, sizeof *e->jpeg_files);
    e->undecodable = calloc((size_t)e->max_batch, 1);
    e->samples = e->src_hw && e->jpeg_files && e->undecodable ? calloc((size_t)slots, sizeof *e->samples) : NULL;
    for (int i = 0; i < slots; i++) {
        if (!e->samples || !(e->samples[i] = calloc((size_t)e->max_batch, sizeof(sf_aug_sample)))) {
            snprintf(err, errlen, "out of memory for augmentation parameters");
            sf_engine_stop(e);
            return NULL;
        }
    }
    const sf_app_metrics *mm = cx->m;
    e->m_samples = sf_metric_only(mm->samples_trained);
    e->m_steps = sf_metric_only(mm->steps);
    e->m_loss = sf_metric_only(mm->loss);
    e->m_lr = sf_metric_only(mm->learning_rate);
    e->m_queue = sf_metric_only(mm->queue_wait);
    e->m_h2d = sf_metric_only(mm->h2d);
    e->m_transform = sf_metric_only(mm->transform);
    e->m_step = sf_metric_only(mm->step);
    e->m_busy = sf_metric_only(mm->compute_busy);
    e->m_starved = sf_metric_only(mm->compute_starved);
    const char *nonfinite[] = {"nonfinite"}, *no_samples[] = {"no_samples"};
    e->m_skipped = sf_metric_child(mm->steps_skipped, nonfinite);
    e->m_skipped_empty = sf_metric_child(mm->steps_skipped, no_samples);
    e->m_grad_norm = sf_metric_only(mm->grad_norm);
    if (pthread_create(&e->thread, NULL, engine_main, e)) {
        snprintf(err, errlen, "cannot start the engine thread");
        sf_engine_stop(e);
        return NULL;
    }
    while (!atomic_load(&e->running))
        sched_yield();
    return e;
}

int sf_engine_running(sf_engine *e) { return e && atomic_load(&e->running); }

void sf_engine_stop(sf_engine *e) { (void)sf_engine_stop_by(e, 0); }

int sf_engine_stop_by(sf_engine *e, uint64_t deadline_ns)
{
    if (!e)
        return 0;
    if (e->thread) {
        atomic_store(&e->stop_deadline_ns, deadline_ns);
        atomic_store(&e->stop, 1);
        sf_distributed_cancel(e->cx.dist); /* a join still waiting for peers ends */
        sf_ring_kick(e->cx.ring);
        if (!deadline_ns) {
            pthread_join(e->thread, NULL);
        } else {
            /* pthread_timedjoin_np takes a CLOCK_REALTIME instant. */
            uint64_t now = sf_now_ns();
            uint64_t left = deadline_ns > now ? deadline_ns - now : 0;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t at = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + left;
            ts.tv_sec = (time_t)(at / 1000000000ull);
            ts.tv_nsec = (long)(at % 1000000000ull);
            if (pthread_timedjoin_np(e->thread, NULL, &ts) != 0)
                return -1;
        }
    }
    /* Commands still queued are answered as failed: their requests wait. */
    for (;;) {
        pthread_mutex_lock(&e->cmd_mu);
        sf_engine_cmd *c = e->cmd_head;
        if (c) {
            e->cmd_head = c->next;
            e->ncmds--;
        }
        pthread_mutex_unlock(&e->cmd_mu);
        if (!c)
            break;
        c->status = -1;
        snprintf(c->err, sizeof c->err, "the service is shutting down");
        atomic_store(&c->done, 1);
        sf_http_wake(*e->cx.http, SF_WAIT_CMD, c->id);
        sf_engine_cmd_release(c);
    }
    /* Fail what is still READY: those batches were accepted and must be
     * reported, never silently dropped. */
    if (e->cx.ring) {
        int slot;
        while ((slot = sf_ring_pop(e->cx.ring, 0)) >= 0)
            engine_fail_batch(e, slot, "shutdown", "the service stopped before this batch was trained");
    }
    if (e->samples) {
        int slots = sf_ring_slots(e->cx.ring);
        for (int i = 0; i < slots; i++)
            free(e->samples[i]);
        free(e->samples);
    }
    free(e->src_hw);
    free(e->jpeg_files);
    free(e->undecodable);
    free(e);
    return 0;
}
