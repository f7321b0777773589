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

#include "gpu/common.h"
#include "server/clock.h"
#include "server/distributed.h"
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

/* What the engine keeps of a batch in flight beyond its timeline: an eval
 * batch's name and the logits buffer its request holds (released at
 * STEP_DONE, once the backend has written it). */
typedef struct pending_extra {
    uint64_t id;
    int eval;
    char eval_name[SF_EVAL_NAME_MAX + 1];
    void *result_owner;
    void (*release_result)(void *owner);
    int n;                     /* the batch's samples, those left out included */
    int n_undecodable;         /* samples left out: their files did not decode */
    int32_t undecodable[SF_JOB_LISTED_UNDECODABLE];
    uint8_t undecodable_format[SF_JOB_LISTED_UNDECODABLE];
    int files_named_jpeg;
} pending_extra;

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
static void fail_ring_batch(sf_engine *e, int slot, const char *code, const char *msg)
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

/* Transform-only batches run synchronously on the engine thread (the backend
 * is single-threaded by contract); the output goes to the request's buffer. */
static void run_transform(sf_engine *e, int slot)
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
         * answers 422 with this code); anything else is the service's. */
        finish_failed(e, id, rc == SF_BACKEND_BAD_INPUT ? "jpeg_undecodable" : "transform_failed", err);
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

static void submit(sf_engine *e, int slot, int64_t global_n)
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
        run_transform(e, slot);
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
    x->eval = m->eval;
    snprintf(x->eval_name, sizeof x->eval_name, "%s", m->eval_name);
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
         * /v1/transform; anything else is the service's. */
        fail_ring_batch(e, slot, rc == SF_BACKEND_BAD_INPUT ? "jpeg_undecodable" : "submit_failed", err);
        return;
    }
    /* The logits buffer stays the request's until STEP_DONE, after the slot
     * itself went back to the ring at SLOT_FREE. */
    x->result_owner = m->result_owner;
    x->release_result = m->release_result;
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
static void harvest_eval(sf_engine *e, const sf_event *ev, const sf_step_record *rec, const pending_extra *x)
{
    const sf_engine_ctx *cx = &e->cx;
    sf_job job = {0};
    if (sf_jobs_get(cx->jobs, ev->id, &job))
        job.id = ev->id;
    job.kind = SF_JOB_KIND_EVAL;
    job.n = ev->n;
    take_undecodable(&job, x, ev);
    job.trained = 1;
    snprintf(job.eval_name, sizeof job.eval_name, "%s", x->eval_name);
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
    sf_eval_agg agg;
    memset(&agg, 0, sizeof agg);
    sf_evals_add(cx->evals, x->eval_name, (uint64_t)scored, ev->loss, (uint64_t)ev->correct,
                 (uint64_t)ev->correct5, ev->step, &agg);
    sf_jobs_done(cx->jobs, &job);
    const char *name[] = {x->eval_name};
    const char *k1[] = {x->eval_name, "1"}, *k5[] = {x->eval_name, "5"};
    if (agg.samples) {
        sf_gauge_set(sf_metric_child(cx->m->eval_loss, name), agg.loss_sum / (double)agg.samples);
        sf_gauge_set(sf_metric_child(cx->m->eval_accuracy, k1), (double)agg.correct1 / (double)agg.samples);
        sf_gauge_set(sf_metric_child(cx->m->eval_accuracy, k5), (double)agg.correct5 / (double)agg.samples);
    }
    sf_counter_add(sf_metric_child(cx->m->eval_samples, name), (double)ev->n);
    account_busy(e, ev);
    sf_http_wake(*cx->http, SF_WAIT_JOB, ev->id);
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
    const int eval = x->id == ev->id && x->eval;
    if (x->id == ev->id && x->release_result) {
        x->release_result(x->result_owner);
        x->release_result = NULL;
    }
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
            sf_evals_add_failed(cx->evals, x->eval_name);
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
        harvest_eval(e, ev, rec, x);
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

static int has_cmds(sf_engine *e)
{
    pthread_mutex_lock(&e->cmd_mu);
    int n = e->ncmds;
    pthread_mutex_unlock(&e->cmd_mu);
    return n;
}

/* Runs every queued command; called with nothing in flight. */
static void run_cmds(sf_engine *e)
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

static int poll_backend(sf_engine *e, int timeout_us)
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

/* ---- data-parallel rounds (distributed.world_size > 1) --------------------------- */

/* Rank 0's training state on every rank: identical parameters from the first
 * step, also when rank 0 alone resumed from a checkpoint. */
static int broadcast_state(sf_engine *e, char *err, size_t errlen)
{
    const sf_engine_ctx *cx = &e->cx;
    sf_backend *be = cx->backend;
    sf_coll *coll = sf_distributed_coll(cx->dist);
    const size_t np = cx->model->n_params, nb = cx->model->n_buffers;
    float *buf = malloc(sizeof(float) * (np > nb ? np : nb) + 1);
    if (!buf) {
        snprintf(err, errlen, "out of memory for the parameter broadcast");
        return -1;
    }
    int rc = -1;
    uint64_t step = 0, nbt = 0;
    if (be->i->get_params(be, buf) || sf_coll_broadcast(coll, buf, sizeof(float) * np, 0, err, errlen) ||
        be->i->set_params(be, buf))
        goto out;
    if (be->i->get_opt_state(be, buf, &step) || sf_coll_broadcast(coll, buf, sizeof(float) * np, 0, err, errlen) ||
        sf_coll_broadcast(coll, &step, sizeof step, 0, err, errlen) || be->i->set_opt_state(be, buf, step))
        goto out;
    if (be->i->get_opt_sq && (be->i->get_opt_sq(be, buf) ||
                              sf_coll_broadcast(coll, buf, sizeof(float) * np, 0, err, errlen) ||
                              be->i->set_opt_sq(be, buf)))
        goto out;
    if (nb && be->i->get_buffers &&
        (be->i->get_buffers(be, buf, &nbt) || sf_coll_broadcast(coll, buf, sizeof(float) * nb, 0, err, errlen) ||
         sf_coll_broadcast(coll, &nbt, sizeof nbt, 0, err, errlen) || be->i->set_buffers(be, buf, nbt)))
        goto out;
    atomic_store(cx->step, step);
    atomic_fetch_add(cx->restore_gen, 1); /* the schedule re-bases on the broadcast step */
    rc = 0;
out:
    if (rc && !err[0])
        snprintf(err, errlen, "reading or writing the backend's state failed");
    free(buf);
    return rc;
}

/* Harvests completions until at most keep batches are in flight. */
static void settle(sf_engine *e, int keep)
{
    while (atomic_load(&e->inflight) > keep)
        poll_backend(e, 1000);
}

/* The ranks' parameter digests, min and max in one all-reduce (max of ~d is
 * ~min of d), with nothing in flight. 0, or -1 when the collective failed. */
static int verify_params(sf_engine *e, uint64_t step, char *err, size_t errlen)
{
    const sf_engine_ctx *cx = &e->cx;
    sf_backend *be = cx->backend;
    if (!be->i->param_digest)
        return 0; /* every rank has the same backend (agree_on_job) */
    /* Whether to take part is never decided by this rank's own state: the
     * others are already in the all-reduce. A digest this rank could not
     * read takes part with the value no maximum picks. */
    uint64_t dg = 0;
    const int have = be->i->param_digest(be, &dg) == 0;
    int64_t v[2] = {have ? (int64_t)dg : INT64_MIN, have ? ~(int64_t)dg : INT64_MIN};
    if (sf_coll_allreduce(sf_distributed_coll(cx->dist), v, 2, SF_COLL_I64, SF_COLL_MAX, err, errlen) != 0)
        return -1;
    const uint64_t hi = (uint64_t)v[0], lo = (uint64_t)~v[1];
    if (have && hi != lo)
        sf_distributed_diverged(cx->dist,
                                "diverged across ranks: the parameter digests differ at step %llu (this rank "
                                "%016llx, lowest %016llx, highest %016llx)",
                                (unsigned long long)step, (unsigned long long)dg, (unsigned long long)lo,
                                (unsigned long long)hi);
    return 0;
}

/* The project's byte hash (0: from its seed), kept to 62 bits so that it
 * and its negation are int64s. */
static int64_t fnv62(uint64_t h, const void *p, size_t n)
{
    return (int64_t)(sf_hash_bytes(h ? h : SF_HASH_SEED, p, n) & 0x3fffffffffffffffull);
}

static int64_t str62(const char *s) { return fnv62(0, s, strlen(s)); }

/* What sets the sequence and the sizes of the job's collectives: ranks that
 * differ in any of it would pair collectives of different sizes (Gloo then
 * aborts the process that reads the longer message) or skip one the others
 * enter. Checked once, at the join, by one all-reduce (the maximum of each
 * value and of its negation); every rank then fails the job naming the
 * first that differs, as ranks of different world sizes already do. The hot
 * ones among them (distributed.verify_every) change at a round on every rank
 * alike. */
static int agree_on_job(sf_engine *e, char *err, size_t errlen)
{
    const sf_engine_ctx *cx = &e->cx;
    const sf_model *m = cx->model;
    sf_config *c = malloc(sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    sf_config_get(c);
    uint64_t h = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const sf_layer *l = &m->layers[i];
        const int64_t shape[] = {l->kind, l->in_c, l->out_c, l->k, l->stride, l->pad, l->bias,
                                 (int64_t)l->n_w, (int64_t)l->n_b, l->frozen, l->out_h, l->out_w};
        h = (uint64_t)fnv62(h, shape, sizeof shape);
        /* The fields that leave the shapes as they are (batchnorm's eps, a
         * dropout's p, which inputs a layer reads) change the model too. */
        const int64_t more[] = {l->groups, l->dilation, l->ceil_mode, l->count_include_pad, l->out_size[0],
                                l->out_size[1], l->approximate, l->over_channels, l->mode, l->n_in};
        const float fl[] = {l->eps, l->momentum, l->p};
        h = (uint64_t)fnv62(h, more, sizeof more);
        h = (uint64_t)fnv62(h, fl, sizeof fl);
        h = (uint64_t)fnv62(h, l->in, sizeof l->in[0] * (size_t)(l->n_in > 0 ? l->n_in : 0));
    }
    const int64_t sizes[] = {m->n_layers, (int64_t)m->n_params, (int64_t)m->n_buffers, (int64_t)m->train_off};
    /* hashed: a fingerprint, not worth printing. */
    const struct {
        const char *name;
        int64_t v;
        int hashed;
    } t[] = {
        {"the model (model.preset, model.spec, model.freeze)", fnv62(h, sizes, sizeof sizes), 1},
        {"model.precision", str62(c->model.precision), 1},
        {"model.grad_accum_steps", c->model.grad_accum_steps, 0},
        {"optim.name", str62(c->optim.name), 1},
        {"distributed.verify_every", c->distributed.verify_every, 0},
        {"distributed.bucket_mb", c->distributed.bucket_mb, 0},
        {"distributed.batchnorm", str62(c->distributed.batchnorm), 1},
        {"the backend (pipeline.backend)", str62(cx->backend->i->name(cx->backend)), 1},
    };
    free(c);
    enum { N = sizeof t / sizeof t[0] };
    int64_t v[2 * N];
    for (int i = 0; i < N; i++) {
        v[i] = t[i].v;
        v[N + i] = -t[i].v;
    }
    if (sf_coll_allreduce(sf_distributed_coll(cx->dist), v, 2 * N, SF_COLL_I64, SF_COLL_MAX, err, errlen) != 0)
        return -1;
    for (int i = 0; i < N; i++) {
        if (v[i] == -v[N + i])
            continue;
        if (t[i].hashed)
            snprintf(err, errlen, "the ranks differ in %s: every rank of a job needs the same", t[i].name);
        else
            snprintf(err, errlen, "the ranks differ in %s (this rank %lld, lowest %lld, highest %lld): every rank "
                     "of a job needs the same", t[i].name, (long long)t[i].v, (long long)-v[N + i],
                     (long long)v[i]);
        return -1;
    }
    return 0;
}

/* This rank's part of a round without a batch: zero gradient, zero weight. */
static int submit_empty(sf_engine *e, int64_t global_n, char *err, size_t errlen)
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

/* A batch the job can no longer train: failed with the reason, never lost. */
static void fail_slot(sf_engine *e, int slot)
{
    char why[400];
    sf_distributed_state(e->cx.dist, why, sizeof why);
    fail_ring_batch(e, slot, "distributed_unavailable", why);
}

/* The job cannot take another step: run commands (checkpoint reads) and fail
 * every batch that reaches the ring, until the service stops. */
static void broken_loop(sf_engine *e)
{
    const sf_engine_ctx *cx = &e->cx;
    sf_http_wake(*cx->http, SF_WAIT_CMD, UINT64_MAX); /* patches that will not apply are answered */
    while (!atomic_load(&e->stop)) {
        if (has_cmds(e))
            run_cmds(e);
        int slot = sf_ring_pop(cx->ring, 100);
        if (slot >= 0)
            fail_slot(e, slot);
    }
}

/* The rounds. Each: wait up to distributed.wait_ms for a batch, then one
 * control all-reduce (the CTL_* layout below, summed); apply the patches
 * (all ranks, rank order); if anyone has a batch, every rank steps (those
 * without one with an empty contribution) and the backend all-reduces the
 * gradients; every verify_every stepping rounds compare the parameter
 * digests; a stopped rank ends the job on all unless all are shutting down.
 *
 * A round's step is submitted while the previous round's may still run
 * (ROUND_DEPTH in flight), as the single-process loop does: the next batch's
 * copy and transform, and this thread's wait and control all-reduce, go on
 * under the running step, and every rank submits the same steps in the same
 * order, so their all-reduces pair up. Whatever must see finished steps
 * (engine commands, the digest check, an idle round's replies, leaving the
 * rounds) settles first. Decisions that every rank must make alike depend on
 * the rounds alone, never on how far a rank has harvested. */
#define ROUND_DEPTH 2

/* The round's control all-reduce (a sum): whether a rank has a batch and
 * its samples, how many ranks stop (their drain is over), how many drain
 * (they had SIGTERM; a stopped rank too), how many stopped ranks must leave
 * now, then each rank's queued patch length (CTL_PATCH + rank). */
enum { CTL_BATCH, CTL_SAMPLES, CTL_STOP, CTL_DRAINING, CTL_LEAVE, CTL_PATCH };

/* A stopped rank stays in the rounds this long for the other ranks to show
 * that they are shutting down too (the signals of one job's stop reach its
 * ranks milliseconds or more apart); then, if they are not all draining,
 * it ends the job. */
#define STOP_LINGER_NS 1000000000ull
/* ... and leaves at the latest this long before its stop deadline, which
 * keeps time for its final checkpoint. */
#define STOP_RESERVE_NS 1000000000ull
#define STOP_ROUND_MS 10

/* Joins the job: the rendezvous, the agreement on the job's settings and
 * rank 0's state broadcast to every rank. -1 when the job failed (said). */
static int dist_join(sf_engine *e, char *err, size_t errlen)
{
    sf_distributed *d = e->cx.dist;
    if (sf_distributed_join(d) != 0)
        return -1;
    if (agree_on_job(e, err, errlen) != 0) {
        sf_distributed_fail(d, "%s", err);
        return -1;
    }
    if (broadcast_state(e, err, errlen) != 0) {
        sf_distributed_fail(d, "the initial parameter broadcast from rank 0 failed: %s", err);
        return -1;
    }
    sf_distributed_started(d);
    return 0;
}

/* The training batch this rank brings to the next round, or -1: it serves
 * transform-only requests, evaluation batches and commands meanwhile, for
 * distributed.wait_ms at most (STOP_ROUND_MS while a stopped rank lingers). */
static int dist_take_batch(sf_engine *e, int stopping, int someone_stopped)
{
    const sf_engine_ctx *cx = &e->cx;
    int slot = -1;
    /* Transform-only requests and evaluation batches (no gradient, no
     * step) are this rank's own business, served while it waits for a
     * training batch, but for distributed.wait_ms at most: the other
     * ranks wait in the round for this one, and a steady stream of them
     * would keep it out until their collectives time out. */
    /* While a stopped rank lingers (the last round said so), rounds come
     * every STOP_ROUND_MS at most, so that it hears within its linger
     * whether the others are shutting down too. */
    uint64_t wait_ms = (uint64_t)sf_config_cur()->distributed.wait_ms;
    if (someone_stopped && wait_ms > STOP_ROUND_MS)
        wait_ms = STOP_ROUND_MS;
    const uint64_t wait_until_ns = sf_now_ns() + wait_ms * 1000000ull;
    while (!stopping) {
        /* A command posted during the wait (a checkpoint read, say) runs
         * now: this is still between two rounds, where the top of the
         * loop runs them, and going into the round early would only
         * make it wait in the control all-reduce for the other ranks'
         * waits, up to distributed.wait_ms, before it ran. */
        if (has_cmds(e)) {
            settle(e, 0);
            run_cmds(e);
        }
        const uint64_t now = sf_now_ns();
        if (now >= wait_until_ns)
            break;
        /* With the last round's step still running, peek at the ring and
         * harvest between peeks: its reply must not wait for the next
         * batch (a client posting with ?wait=1 sends none until it has
         * it), nor for the whole wait. */
        const int busy = atomic_load(&e->inflight) > 0;
        slot = sf_ring_pop(cx->ring, busy ? 0 : (int)((wait_until_ns - now + 999999) / 1000000));
        if (slot < 0) {
            /* Early: a command's kick (it runs at the top), a stop's
             * (the round goes now), or a kick whose command already ran
             * at the top of the loop (the wait goes on: going into the
             * round would hold the next command there). On time, the
             * deadline at the top ends the wait. */
            if (has_cmds(e) || (!busy && !atomic_load(&e->stop)))
                continue;
            if (!busy)
                break;
            poll_backend(e, 1000);
            continue;
        }
        sf_slot_meta *m = sf_ring_meta(cx->ring, slot);
        if (m->kind == 1) {
            m->t_popped_ns = sf_now_ns();
            run_transform(e, slot);
        } else if (m->eval) {
            submit(e, slot, 0);
            settle(e, 0);
        } else {
            break;
        }
        slot = -1;
    }
    return slot;
}

/* The round's step, which every rank takes whether or not its batch trains
 * (its sample count is ctl[CTL_SAMPLES]), then the health and parameter
 * checks. -1 when the job failed (said). */
static int dist_round_step(sf_engine *e, const int64_t *ctl, int slot, int depth, uint64_t *stepped,
                           char *err, size_t errlen)
{
    const sf_engine_ctx *cx = &e->cx;
    sf_distributed *d = cx->dist;
    settle(e, depth - 1); /* room for this round's step */
    const int before = atomic_load(&e->inflight);
    if (slot >= 0)
        submit(e, slot, ctl[CTL_SAMPLES]); /* a batch the backend refuses is failed and released */
    /* Every rank takes the round's step whatever became of its batch
     * (the decoder refused one of its files): the other ranks are
     * already inside the step's all-reduce. A refused batch joins it
     * as an empty contribution. The samples it announced are in
     * global_n, but each rank also sums the samples it trained with
     * the gradient, so the backend applies the mean over the samples
     * trained, and every rank skips the step if none was. */
    if (atomic_load(&e->inflight) == before) {
        if (submit_empty(e, ctl[CTL_SAMPLES], err, errlen) != 0) {
            sf_distributed_fail(d, "cannot join the step: %s", err);
            return -1;
        }
        sf_distributed_count_empty(d);
    }
    (*stepped)++;
    poll_backend(e, 0);
    const int every = sf_config_cur()->distributed.verify_every;
    const int verify = every > 0 && *stepped % (uint64_t)every == 0;
    if (verify)
        settle(e, 0);
    char herr[200];
    if (cx->backend->i->health(cx->backend, herr, sizeof herr) != 0) {
        sf_distributed_fail(d, "lost the other ranks in the gradient all-reduce: %s", herr);
        return -1;
    }
    sf_distributed_observe_allreduce(d, sf_distributed_backend(d)->allreduce_s);
    if (verify && verify_params(e, atomic_load(cx->step), err, errlen) != 0) {
        sf_distributed_fail(d, "lost the other ranks in the parameter check: %s", err);
        return -1;
    }
    return 0;
}

static void dist_main(sf_engine *e)
{
    const sf_engine_ctx *cx = &e->cx;
    sf_distributed *d = cx->dist;
    const int world = sf_distributed_world(d), rank = sf_distributed_rank(d);
    const int maxq = cx->backend->i->max_inflight(cx->backend);
    const int depth = maxq < ROUND_DEPTH ? maxq : ROUND_DEPTH;
    uint64_t stepped = 0; /* rounds that took a step: the same count on every rank */
    uint64_t t_stopped = 0; /* when this rank's drain ended (its stop) */
    int all_draining = 0;   /* the last round's: every rank was shutting down */
    int someone_stopped = 0; /* the last round's: a rank had stopped */
    char err[512] = "";
    if (dist_join(e, err, sizeof err) != 0) {
        broken_loop(e);
        return;
    }
    const size_t nctl = CTL_PATCH + (size_t)world;
    int64_t *ctl = calloc(nctl, sizeof *ctl);
    if (!ctl) {
        sf_distributed_fail(d, "out of memory for the round control");
        broken_loop(e);
        return;
    }
    sf_coll *coll = sf_distributed_coll(d);
    for (;;) {
        if (has_cmds(e)) {
            settle(e, 0); /* commands run between steps */
            run_cmds(e);
        }
        const int stopping = atomic_load(&e->stop);
        int slot = dist_take_batch(e, stopping, someone_stopped);
        /* A stop that came during the wait (its kick ends the wait) goes into
         * this round, not the next: the other ranks would wait out their
         * distributed.wait_ms once more before hearing of it. */
        const int stop_now = stopping || atomic_load(&e->stop);
        const int draining = stop_now || atomic_load(cx->draining);
        /* Whether this stopped rank must leave: decided from its own clock,
         * so it goes into the all-reduce, and every rank acts on the sum. */
        int leave = 0;
        if (stop_now) {
            const uint64_t now = sf_now_ns(), dl = atomic_load(&e->stop_deadline_ns);
            if (!t_stopped)
                t_stopped = now;
            leave = (!all_draining && now >= t_stopped + STOP_LINGER_NS) ||
                    (dl && now + STOP_RESERVE_NS >= dl);
        }
        memset(ctl, 0, sizeof *ctl * nctl);
        ctl[CTL_BATCH] = slot >= 0;
        ctl[CTL_SAMPLES] = slot >= 0 ? sf_ring_meta(cx->ring, slot)->n : 0;
        ctl[CTL_STOP] = stop_now;
        ctl[CTL_DRAINING] = draining;
        ctl[CTL_LEAVE] = leave;
        ctl[CTL_PATCH + rank] = sf_distributed_patch_len(d);
        err[0] = '\0';
        if (sf_coll_allreduce(coll, ctl, nctl, SF_COLL_I64, SF_COLL_SUM, err, sizeof err) != 0 ||
            sf_distributed_apply_patches(d, ctl + CTL_PATCH, err, sizeof err) != 0) {
            sf_distributed_fail(d, "lost the other ranks: %s", err);
            sf_http_wake(*cx->http, SF_WAIT_CMD, UINT64_MAX); /* patches waiting are answered */
            if (slot >= 0)
                fail_slot(e, slot);
            break;
        }
        if (ctl[CTL_PATCH + rank] > 0)
            sf_http_wake(*cx->http, SF_WAIT_CMD, UINT64_MAX); /* this rank's patch request replies */
        if (ctl[CTL_BATCH] > 0) {
            if (dist_round_step(e, ctl, slot, depth, &stepped, err, sizeof err) != 0)
                break;
        } else {
            settle(e, 0); /* an idle round: the last steps finish and reply */
        }
        /* A rank that stops (its drain is over) ends the job for every rank,
         * after STOP_LINGER_NS, unless every rank is shutting down: then the
         * job drains as one, the stopped ranks joining with empty
         * contributions, until the last rank's drain is over too (or a
         * stopped rank's deadline comes). So a job stopped by stopping all
         * its ranks trains every batch it accepted. */
        all_draining = ctl[CTL_DRAINING] == world;
        someone_stopped = ctl[CTL_STOP] > 0;
        if (ctl[CTL_STOP] == world || ctl[CTL_LEAVE] > 0) {
            if (!stop_now)
                sf_distributed_ended(d, "%lld rank(s) shut down: the data-parallel job stopped",
                                    (long long)ctl[CTL_STOP]);
            break;
        }
    }
    /* Steps still in flight finish (or fail, once the backend's watchdog
     * gives up on a lost peer) and reply before the job is left. */
    settle(e, 0);
    free(ctl);
    sf_http_wake(*cx->http, SF_WAIT_CMD, UINT64_MAX);
    broken_loop(e);
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
        dist_main(e);
    while (!atomic_load(&e->stop)) {
        int inflight = atomic_load(&e->inflight);
        int took = 0;
        if (has_cmds(e)) {
            /* Drain the pipeline, then run the commands between two steps. */
            if (inflight == 0)
                run_cmds(e);
            else
                poll_backend(e, 1000);
            continue;
        }
        if (inflight < maxq) {
            /* With work in flight, only peek at the ring so completions are
             * harvested promptly; when idle, block on the ring's condition. */
            int slot = sf_ring_pop(cx->ring, inflight ? 0 : 100);
            if (slot >= 0) {
                submit(e, slot, 0);
                took = 1;
            }
        }
        if (atomic_load(&e->inflight) > 0) {
            int full = atomic_load(&e->inflight) >= maxq;
            poll_backend(e, took ? 0 : (full ? 2000 : 200));
        }
    }
    /* Let what was submitted finish, so no batch is left half-done; but not
     * past the stop deadline (sf_engine_stop_by), nor 100 s. */
    uint64_t dl = atomic_load(&e->stop_deadline_ns);
    for (int tries = 0; atomic_load(&e->inflight) > 0 && tries < 100000; tries++) {
        if (dl && sf_now_ns() >= dl)
            break;
        poll_backend(e, 1000);
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
            fail_ring_batch(e, slot, "shutdown", "the service stopped before this batch was trained");
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
