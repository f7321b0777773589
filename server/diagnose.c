/* server/diagnose.c — the caching method. See diagnose.h. */
#include "server/diagnose.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/rng.h"
#include "server/app.h"
#include "server/distributed.h"
#include "server/engine.h"
#include "server/clock.h"
#include "server/log.h"

/* The augmentation key of the diagnose batch. Job ids start at 1, so 0 is
 * never a real batch's sequence number. */
#define DIAG_SEQ 0

typedef struct diag_run {
    double seconds;
    uint64_t t_request_ns;   /* the live window ends here */
    atomic_int ran;          /* the engine began it (res is valid once done); read by
                                HTTP threads for "running" */
    atomic_int cancel;       /* sf_diagnose_cancel: stop before the next bench call */
    sf_diag_result res;
} diag_run;

/* Finished runs' results kept after a newer run replaced them: a requester
 * that was woken for its run's end may be scheduled only after another
 * request started the next one. */
enum { DIAG_DONE_KEEP = 8 };

/* The latest run and the last successful result; the host buffer is touched
 * only by the engine thread (during a run) and by shutdown (after the engine
 * stopped). */
static struct {
    pthread_mutex_t mu;
    sf_engine_cmd *cmd;      /* the latest run, one reference held here; NULL before the first */
    int harvested;           /* its result was considered for `last` */
    sf_diag_result done[DIAG_DONE_KEEP]; /* replaced runs' results, by id, oldest overwritten */
    unsigned done_next;
    sf_diag_result last;
    int have_last;
    uint8_t *buf;
    size_t buf_bytes;
} D = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const char *const STAGE_KEYS[SF_DIAG_STAGES] = {"device_augmented", "device_raw",
                                                         "host_pinned", "live"};
static const char *const STAGE_ABOUT[SF_DIAG_STAGES] = {
    "step only: an augmented batch cached on the device",
    "augment + step: a raw uint8 batch cached on the device",
    "H2D + augment + step: a raw batch in pinned host memory",
    "live: steps the engine completed before the call (HTTP, ring, H2D, augment, step)",
};

const char *sf_diag_stage_key(sf_diag_stage_id s)
{
    return (unsigned)s < SF_DIAG_STAGES ? STAGE_KEYS[s] : "unknown";
}

const char *sf_diag_verdict_code(sf_diag_verdict v)
{
    switch (v) {
    case SF_DIAG_V_AUGMENTATION: return "augmentation";
    case SF_DIAG_V_H2D: return "h2d";
    case SF_DIAG_V_INGEST: return "ingest";
    default: return "compute-bound";
    }
}

const char *sf_diag_verdict_label(sf_diag_verdict v)
{
    switch (v) {
    case SF_DIAG_V_AUGMENTATION: return "augmentation";
    case SF_DIAG_V_H2D: return "host-to-device copy";
    case SF_DIAG_V_INGEST: return "ingest: loaders or network";
    default: return "compute-bound";
    }
}

sf_diag_verdict sf_diag_decide(const double rate[SF_DIAG_STAGES], double drop[3])
{
    /* drop[k]: the share of stage k+1's rate lost by adding stage k+2
     * (augmentation, then the H2D copy, then ingest). A stage that measures
     * faster than the one before (noise) loses nothing. */
    static const sf_diag_verdict names[3] = {SF_DIAG_V_AUGMENTATION, SF_DIAG_V_H2D, SF_DIAG_V_INGEST};
    sf_diag_verdict v = SF_DIAG_V_COMPUTE;
    double worst = SF_DIAG_DROP_THRESHOLD;
    for (int k = 0; k < 3; k++) {
        double d = rate[k] > 0 ? 1.0 - rate[k + 1] / rate[k] : 0.0;
        drop[k] = d > 0 ? d : 0.0;
        if (drop[k] > worst) {
            worst = drop[k];
            v = names[k];
        }
    }
    return v;
}

/* ---- the run (engine thread) ------------------------------------------------ */

static size_t label_size(int dt)
{
    return dt == SF_LABEL_I64 ? 8 : dt == SF_LABEL_I32 ? 4 : 1;
}

static const char *label_dtype_name(int dt)
{
    return dt == SF_LABEL_I64 ? "I64" : dt == SF_LABEL_I32 ? "I32" : "U8";
}

/* Stage 4: the steps completed in (t_end - window, t_end]. When the trace
 * ring is full and does not reach back that far, the window starts at its
 * oldest step instead (a rate needs the whole span to be covered). */
static void live_stage(const sf_step_record *recs, int k, uint64_t t_end, double window_s,
                       sf_diag_stage *st)
{
    uint64_t w = (uint64_t)(window_s * 1e9);
    uint64_t t_begin = t_end > w ? t_end - w : 0;
    if (k == SF_ENGINE_TRACE_STEPS && recs[0].t_step_end > t_begin)
        t_begin = recs[0].t_step_end;
    long steps = 0, samples = 0;
    for (int i = 0; i < k; i++) {
        const sf_step_record *r = &recs[i];
        if (r->status == 0 && r->t_step_end > t_begin && r->t_step_end <= t_end) {
            steps++;
            samples += r->n;
        }
    }
    double secs = t_end > t_begin ? (double)(t_end - t_begin) / 1e9 : 0;
    st->steps = (int)steps;
    st->seconds = secs;
    st->steps_per_s = secs > 0 ? (double)steps / secs : 0;
    st->samples_per_s = secs > 0 ? (double)samples / secs : 0;
}

/* The host buffer for the batch: grown (never shrunk) through the backend's
 * host_alloc, so it is pinned on CUDA like a ring slot. */
static uint8_t *host_buffer(sf_app *app, size_t bytes)
{
    if (D.buf && D.buf_bytes >= bytes)
        return D.buf;
    sf_backend *be = app->backend;
    if (D.buf)
        be->i->host_free(be, D.buf);
    D.buf = be->i->host_alloc(be, bytes);
    D.buf_bytes = D.buf ? bytes : 0;
    return D.buf;
}

static void fill_random(uint8_t *p, size_t n, uint64_t seed)
{
    size_t i = 0;
    for (uint64_t ctr = 0; i + 8 <= n; i += 8, ctr++) {
        uint64_t v = sf_hash4(seed, ctr, 0, 0);
        memcpy(p + i, &v, 8);
    }
    if (i < n) {
        uint64_t v = sf_hash4(seed, n, 1, 0);
        memcpy(p + i, &v, n - i);
    }
}

/* A segmentation model scores a label per output pixel: the batch needs
 * [N, out_h, out_w] of them, not [N]. */
static size_t labels_per_sample(const sf_model *m)
{
    return m->segmentation ? (size_t)m->out_h * (size_t)m->out_w : 1;
}

static void fill_labels(uint8_t *p, size_t n, int dt, int classes, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        int64_t v = (int64_t)(sf_hash4(seed, (uint64_t)i, 2, 0) % (uint64_t)classes);
        if (dt == SF_LABEL_I64)
            memcpy(p + i * 8, &v, 8);
        else if (dt == SF_LABEL_I32) {
            int32_t x = (int32_t)v;
            memcpy(p + i * 4, &x, 4);
        } else {
            p[i] = (uint8_t)v;
        }
    }
}

static const sf_bench_mode MODES[3] = {SF_BENCH_STEP, SF_BENCH_AUG_STEP, SF_BENCH_H2D_AUG_STEP};

#define DIAG_CANCELLED "cancelled: its client went away"

/* One bench call of stage s; a run cancelled meanwhile stops before it
 * instead (each call is a short stretch: the backend restores the training
 * state at its end, so stopping between calls leaves that state whole). */
static int bench(sf_backend *be, const sf_batch *b, int s, int warmup, int steps, double *secs,
                 const atomic_int *cancel, char *err, size_t errlen)
{
    char e[200] = "";
    *secs = 0;
    if (atomic_load(cancel)) {
        snprintf(err, errlen, DIAG_CANCELLED);
        return -1;
    }
    if (be->i->bench(be, b, MODES[s], warmup, steps, secs, e, sizeof e)) {
        snprintf(err, errlen, "stage %s: %s", STAGE_KEYS[s], e[0] ? e : "bench failed");
        return -1;
    }
    if (!(*secs > 0))
        *secs = 1e-9;
    return 0;
}

/* The three cached stages. A short calibration run of each (which also warms
 * caches, clocks and lazily built state) sets its step count so that it lasts
 * about stage_s; the timed steps then run in DIAG_ROUNDS interleaved rounds
 * (1, 2, 3, 1, 2, 3, ...), and a stage's rate is its best round's. Other work
 * on the machine (a neighbour's load, a clock that drops) can only slow a
 * round down, so the best round is the stage's rate with the least of that
 * noise, and interleaving keeps a slow period from landing on one stage
 * only. On a quiet GPU the rounds agree and the best is the mean. */
#define DIAG_ROUNDS 5
static int bench_stages(sf_backend *be, const sf_batch *b, double stage_s, sf_diag_stage *st,
                        const atomic_int *cancel, char *err, size_t errlen)
{
    int per_round[3];
    for (int s = 0; s < 3; s++) {
        double secs;
        if (bench(be, b, s, 1, 2, &secs, cancel, err, errlen))
            return -1;
        double want = ceil(stage_s / (secs / 2));
        int steps = want < SF_DIAG_MIN_STEPS   ? SF_DIAG_MIN_STEPS
                    : want > SF_DIAG_MAX_STEPS ? SF_DIAG_MAX_STEPS
                                               : (int)want;
        per_round[s] = (steps + DIAG_ROUNDS - 1) / DIAG_ROUNDS;
        st[s].steps = 0;
        st[s].seconds = 0;
        st[s].steps_per_s = 0;
    }
    for (int round = 0; round < DIAG_ROUNDS; round++) {
        for (int s = 0; s < 3; s++) {
            double secs;
            if (bench(be, b, s, 1, per_round[s], &secs, cancel, err, errlen))
                return -1;
            st[s].steps += per_round[s];
            st[s].seconds += secs;
            if (per_round[s] / secs > st[s].steps_per_s)
                st[s].steps_per_s = per_round[s] / secs;
        }
    }
    for (int s = 0; s < 3; s++)
        st[s].samples_per_s = st[s].steps_per_s * b->n;
    return 0;
}

static void suggest(sf_diag_result *r)
{
    const sf_diag_stage *st = r->stage;
    switch (r->verdict) {
    case SF_DIAG_V_INGEST:
        if (st[SF_DIAG_LIVE].steps == 0)
            snprintf(r->suggestion, sizeof r->suggestion,
                     "No batch was trained in the %.3g s before the diagnosis, so ingest is all "
                     "that is missing: start the loaders (e.g. streamfeed-load) and diagnose "
                     "again while they send.",
                     st[SF_DIAG_LIVE].seconds);
        else
            snprintf(r->suggestion, sizeof r->suggestion,
                     "Batches arrive slower than the service trains them (%.1f of %.1f steps/s): "
                     "add loaders or connections (streamfeed-load --connections), check the "
                     "network bandwidth, and keep decoding and augmentation off the loaders' "
                     "critical path.",
                     st[SF_DIAG_LIVE].steps_per_s, st[SF_DIAG_HOST_PINNED].steps_per_s);
        break;
    case SF_DIAG_V_H2D:
        snprintf(r->suggestion, sizeof r->suggestion,
                 "The host-to-device copy costs %.0f%% of the rate: send uint8 images (never "
                 "float), check the PCIe link (nvidia-smi topo -m) and keep pipeline.overlap on "
                 "so the copy hides behind the previous step.",
                 100 * r->drop[1]);
        break;
    case SF_DIAG_V_AUGMENTATION:
        snprintf(r->suggestion, sizeof r->suggestion,
                 "Augmentation costs %.0f%% of the rate: make augment.pipeline cheaper (a "
                 "smaller blur kernel, fewer ops, crop before resizing) and keep "
                 "pipeline.overlap on so it runs beside the step.",
                 100 * r->drop[0]);
        break;
    default:
        snprintf(r->suggestion, sizeof r->suggestion,
                 "The pipeline keeps the model busy (no stage loses more than %.0f%% of the "
                 "rate): only a faster step trains faster, e.g. a larger batch, "
                 "model.precision tf32 or bf16, or a faster GPU.",
                 100 * SF_DIAG_DROP_THRESHOLD);
        break;
    }
}

static int run_stages(sf_app *app, diag_run *run, char *err, size_t errlen)
{
    sf_diag_result *res = &run->res;
    const sf_model *m = &app->model;
    sf_backend *be = app->backend;
    int rc = -1;
    sf_step_record *recs = malloc(sizeof *recs * SF_ENGINE_TRACE_STEPS);
    sf_aug_sample *samples = NULL;
    if (!recs) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int k = sf_engine_trace(app->engine, recs, SF_ENGINE_TRACE_STEPS);
    live_stage(recs, k, run->t_request_ns, run->seconds, &res->stage[SF_DIAG_LIVE]);

    /* The batch: the most recent trained batch's shape, else the model's input. */
    res->from_traffic = 0;
    for (int i = k - 1; i >= 0; i--) {
        const sf_step_record *r = &recs[i];
        if (r->status == 0 && r->n > 0 && r->h > 0 && r->w > 0 && r->c > 0 && r->label_dtype >= 0) {
            res->n = r->n;
            res->h = r->h;
            res->w = r->w;
            res->c = r->c;
            res->nhwc = r->nhwc;
            res->label_dtype = r->label_dtype;
            res->from_traffic = 1;
            break;
        }
    }
    const size_t slot_bytes = (size_t)app->cfg.ring.slot_bytes;
    if (!res->from_traffic) {
        res->n = app->cfg.model.max_batch < SF_DIAG_DEFAULT_N ? app->cfg.model.max_batch
                                                                : SF_DIAG_DEFAULT_N;
        res->h = m->in_h;
        res->w = m->in_w;
        res->c = m->in_c;
        res->nhwc = 1;
        res->label_dtype = SF_LABEL_I64;
        size_t per = (size_t)res->h * res->w * res->c + 8 * labels_per_sample(m);
        if ((size_t)res->n * per > slot_bytes)
            res->n = (int)(slot_bytes / per);
        if (res->n < 1) {
            snprintf(err, errlen,
                     "one %dx%dx%d sample does not fit in ring.slot_bytes (%zu): post a batch first",
                     res->h, res->w, res->c, slot_bytes);
            goto out;
        }
    }
    sf_aug_plan plan;
    char e[256];
    if (sf_aug_plan_make(&app->aug, res->h, res->w, res->c, &plan, e, sizeof e)) {
        snprintf(err, errlen, "%s batch of %dx%dx%d: %s",
                 res->from_traffic ? "the last" : "no batch was trained yet and the model's input as a",
                 res->h, res->w, res->c, e);
        goto out;
    }
    if (!res->from_traffic &&
        (plan.out_h != m->in_h || plan.out_w != m->in_w || plan.c != m->in_c)) {
        snprintf(err, errlen,
                 "no batch was trained yet, and the model's input %dx%dx%d does not augment to "
                 "itself (%dx%dx%d): post a batch first",
                 m->in_h, m->in_w, m->in_c, plan.out_h, plan.out_w, plan.c);
        goto out;
    }
    const size_t img = (size_t)res->n * res->h * res->w * res->c;
    const size_t lab_off = (img + 63) & ~(size_t)63;
    const size_t n_labels = (size_t)res->n * labels_per_sample(m);
    const size_t need = lab_off + n_labels * label_size(res->label_dtype);
    if (need > slot_bytes + 64) {
        snprintf(err, errlen, "the batch needs %zu bytes, more than ring.slot_bytes (%zu)", need,
                 slot_bytes);
        goto out;
    }
    uint8_t *buf = host_buffer(app, need);
    samples = calloc((size_t)res->n, sizeof *samples);
    if (!buf || !samples) {
        snprintf(err, errlen, "cannot allocate %zu bytes of host memory for the batch", need);
        goto out;
    }
    uint64_t seed = sf_mix64(run->t_request_ns);
    fill_random(buf, img, seed);
    fill_labels(buf + lab_off, n_labels, res->label_dtype, m->n_classes, seed);
    sf_config c;
    sf_config_get(&c);
    sf_aug_gen(&app->aug, &plan, (uint64_t)c.augment.seed, DIAG_SEQ, res->n, samples);

    sf_batch b;
    memset(&b, 0, sizeof b);
    b.id = 0;
    b.seq = DIAG_SEQ;
    b.n = res->n;
    b.h = res->h;
    b.w = res->w;
    b.c = res->c;
    b.nhwc = res->nhwc;
    b.images = buf;
    b.label_dtype = (sf_label_dtype)res->label_dtype;
    b.labels = buf + lab_off;
    b.plan = &plan;
    b.samples = samples;
    /* The measured pipeline is the configured one, batch-level mixing included. */
    sf_aug_gen_mix(&app->aug, &plan, (uint64_t)c.augment.seed, DIAG_SEQ, res->n, &b.mix);
    b.mix_lam = sf_aug_mix_loss_lam(&b.mix);
    b.hyper.lr = (float)c.optim.lr;
    b.hyper.momentum = (float)c.optim.momentum;
    b.hyper.weight_decay = (float)c.optim.weight_decay;
    b.t_ready_ns = sf_now_ns();

    if (bench_stages(be, &b, run->seconds / 3, res->stage, &run->cancel, err, errlen))
        goto out;
    double rate[SF_DIAG_STAGES];
    for (int s = 0; s < SF_DIAG_STAGES; s++) {
        rate[s] = res->stage[s].steps_per_s;
        res->stage[s].ratio = rate[0] > 0 ? rate[s] / rate[0] : 0;
    }
    res->verdict = sf_diag_decide(rate, res->drop);
    suggest(res);
    rc = 0;
out:
    free(samples);
    free(recs);
    return rc;
}

static int diag_fn(sf_app *app, void *arg, char *err, size_t errlen)
{
    diag_run *run = arg;
    sf_diag_result *res = &run->res;
    uint64_t t0 = sf_now_ns();
    atomic_store(&run->ran, 1);
    snprintf(res->backend, sizeof res->backend, "%s", app->backend_name ? app->backend_name : "");
    res->status = run_stages(app, run, err, errlen);
    if (res->status)
        snprintf(res->err, sizeof res->err, "%s", err);
    res->t_done_ns = sf_now_ns();
    res->elapsed_s = (double)(res->t_done_ns - t0) / 1e9;
    if (res->status && atomic_load(&run->cancel))
        SF_INFO("diagnose %s after %.2fs", res->err, (double)(sf_now_ns() - t0) / 1e9);
    else if (res->status)
        SF_WARN("diagnose failed: %s", res->err);
    else
        SF_INFO("diagnose: %s (%.1f / %.1f / %.1f / %.1f steps/s) in %.2fs",
                sf_diag_verdict_label(res->verdict), res->stage[0].steps_per_s,
                res->stage[1].steps_per_s, res->stage[2].steps_per_s, res->stage[3].steps_per_s,
                res->elapsed_s);
    return res->status;
}

/* ---- requests (HTTP threads) ------------------------------------------------ */

/* Copies the latest run's result into `last` once it finished well. */
static void harvest_locked(void)
{
    if (!D.cmd || D.harvested || !atomic_load(&D.cmd->done))
        return;
    diag_run *run = D.cmd->arg;
    if (run->ran && run->res.status == 0) {
        D.last = run->res;
        D.last.id = D.cmd->id;
        D.have_last = 1;
    }
    D.harvested = 1;
}

/* The result of a finished run, as its requester gets it. */
static void result_of(const sf_engine_cmd *cmd, sf_diag_result *out)
{
    const diag_run *run = cmd->arg;
    if (run->ran) {
        *out = run->res;
    } else {
        /* The engine stopped before running it. */
        memset(out, 0, sizeof *out);
        out->status = cmd->status ? cmd->status : -1;
        snprintf(out->err, sizeof out->err, "%s", cmd->err);
        out->seconds = run->seconds;
    }
    out->id = cmd->id;
}

sf_diag_start_err sf_diagnose_start(sf_app *app, double seconds, uint64_t *id, char *err,
                                    size_t errlen)
{
    if (!app->backend) {
        snprintf(err, errlen, "diagnose needs a compute backend (pipeline.mode=train)");
        return SF_DIAG_E_NO_BACKEND;
    }
    if (!app->backend->i->bench) {
        snprintf(err, errlen, "the %s backend does not implement the caching method (bench) yet",
                 app->backend_name ? app->backend_name : "current");
        return SF_DIAG_E_UNSUPPORTED;
    }
    if (app->dist && sf_distributed_state(app->dist, NULL, 0) == SF_DIST_JOINING) {
        /* The engine runs no command until every rank has joined: queued
         * now, the run would wait out the whole join window. */
        snprintf(err, errlen, "this rank is still joining its data-parallel job (distributed.join_timeout_s); "
                              "diagnose runs once every rank has joined");
        return SF_DIAG_E_JOINING;
    }
    pthread_mutex_lock(&D.mu);
    if (D.cmd && !atomic_load(&D.cmd->done)) {
        uint64_t running = D.cmd->id;
        pthread_mutex_unlock(&D.mu);
        snprintf(err, errlen, "diagnose %llu is running; one runs at a time",
                 (unsigned long long)running);
        return SF_DIAG_E_RUNNING;
    }
    harvest_locked();
    diag_run *run = calloc(1, sizeof *run);
    sf_engine_cmd *cmd = run ? sf_engine_cmd_new(diag_fn, run, free) : NULL;
    if (!cmd) {
        pthread_mutex_unlock(&D.mu);
        free(run);
        snprintf(err, errlen, "out of memory");
        return SF_DIAG_E_NOMEM;
    }
    run->seconds = seconds;
    run->res.seconds = seconds;
    run->t_request_ns = sf_now_ns();
    if (!app->engine || sf_engine_post(app->engine, cmd) != 0) {
        pthread_mutex_unlock(&D.mu);
        sf_engine_cmd_release(cmd);
        snprintf(err, errlen, "the engine is stopping or has too many commands queued");
        return SF_DIAG_E_ENGINE;
    }
    if (D.cmd) {
        result_of(D.cmd, &D.done[D.done_next++ % DIAG_DONE_KEEP]);
        sf_engine_cmd_release(D.cmd);
    }
    D.cmd = cmd;
    D.harvested = 0;
    *id = cmd->id;
    pthread_mutex_unlock(&D.mu);
    return SF_DIAG_OK;
}

void sf_diagnose_cancel(uint64_t id)
{
    pthread_mutex_lock(&D.mu);
    if (D.cmd && D.cmd->id == id && !atomic_load(&D.cmd->done))
        atomic_store(&((diag_run *)D.cmd->arg)->cancel, 1);
    pthread_mutex_unlock(&D.mu);
}

int sf_diagnose_result(uint64_t id, sf_diag_result *out)
{
    pthread_mutex_lock(&D.mu);
    if (!D.cmd || D.cmd->id != id) {
        for (unsigned i = 0; i < DIAG_DONE_KEEP; i++)
            if (D.done[i].id == id && id) {
                *out = D.done[i];
                pthread_mutex_unlock(&D.mu);
                return 1;
            }
        pthread_mutex_unlock(&D.mu);
        return -1;
    }
    if (!atomic_load(&D.cmd->done)) {
        pthread_mutex_unlock(&D.mu);
        return 0;
    }
    harvest_locked();
    result_of(D.cmd, out);
    pthread_mutex_unlock(&D.mu);
    return 1;
}

int sf_diagnose_last(sf_diag_result *out, int *running)
{
    pthread_mutex_lock(&D.mu);
    harvest_locked();
    if (running)
        /* Running means the engine has begun it, with nothing in flight:
         * a queued diagnose still lets batches the engine already took
         * train first. */
        *running = D.cmd && atomic_load(&((diag_run *)D.cmd->arg)->ran) && !atomic_load(&D.cmd->done);
    int rc = -1;
    if (D.have_last) {
        *out = D.last;
        rc = 0;
    }
    pthread_mutex_unlock(&D.mu);
    return rc;
}

cJSON *sf_diag_result_to_json(const sf_diag_result *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)r->id);
    cJSON_AddNumberToObject(o, "seconds", r->seconds);
    cJSON_AddStringToObject(o, "backend", r->backend);
    cJSON *b = cJSON_AddObjectToObject(o, "batch");
    cJSON_AddNumberToObject(b, "n", r->n);
    cJSON_AddNumberToObject(b, "h", r->h);
    cJSON_AddNumberToObject(b, "w", r->w);
    cJSON_AddNumberToObject(b, "c", r->c);
    cJSON_AddStringToObject(b, "layout", r->nhwc ? "NHWC" : "NCHW");
    cJSON_AddStringToObject(b, "label_dtype", label_dtype_name(r->label_dtype));
    cJSON_AddStringToObject(b, "source", r->from_traffic ? "last_batch" : "model_input");
    cJSON *st = cJSON_AddArrayToObject(o, "stages");
    for (int s = 0; s < SF_DIAG_STAGES; s++) {
        const sf_diag_stage *x = &r->stage[s];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "stage", STAGE_KEYS[s]);
        cJSON_AddStringToObject(j, "description", STAGE_ABOUT[s]);
        cJSON_AddNumberToObject(j, "steps", x->steps);
        cJSON_AddNumberToObject(j, "seconds", x->seconds);
        cJSON_AddNumberToObject(j, "steps_per_s", x->steps_per_s);
        cJSON_AddNumberToObject(j, "samples_per_s", x->samples_per_s);
        cJSON_AddNumberToObject(j, "ratio", x->ratio);
        cJSON_AddItemToArray(st, j);
    }
    cJSON *d = cJSON_AddObjectToObject(o, "drops");
    cJSON_AddNumberToObject(d, "augmentation", r->drop[0]);
    cJSON_AddNumberToObject(d, "h2d", r->drop[1]);
    cJSON_AddNumberToObject(d, "ingest", r->drop[2]);
    cJSON_AddNumberToObject(o, "threshold", SF_DIAG_DROP_THRESHOLD);
    cJSON_AddStringToObject(o, "verdict", sf_diag_verdict_code(r->verdict));
    cJSON_AddStringToObject(o, "bottleneck", sf_diag_verdict_label(r->verdict));
    cJSON_AddStringToObject(o, "suggestion", r->suggestion);
    cJSON_AddNumberToObject(o, "elapsed_s", r->elapsed_s);
    return o;
}

void sf_diagnose_shutdown(sf_app *app)
{
    pthread_mutex_lock(&D.mu);
    if (D.cmd)
        sf_engine_cmd_release(D.cmd);
    D.cmd = NULL;
    D.harvested = 0;
    D.have_last = 0;
    if (D.buf && app->backend)
        app->backend->i->host_free(app->backend, D.buf);
    D.buf = NULL;
    D.buf_bytes = 0;
    pthread_mutex_unlock(&D.mu);
}
