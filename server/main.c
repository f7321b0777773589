/* server/main.c — the streamfeed process: configuration, components, signals.
 *
 * Start-up order: config -> model and augmentation (validated) -> backend ->
 * ring -> job table -> engine -> HTTP. SIGHUP re-reads the TLS certificate
 * (as does a change of its files, checked every few seconds).
 *
 * Shutdown (SIGTERM/SIGINT) keeps the promise of docs/OPERATIONS.md, all of
 * it within shutdown.grace_s of the signal:
 *   1. readiness turns false, the main port refuses new connections, uploads
 *      waiting for a slot get 503, requests begun after the signal get 503;
 *   2. the drain: requests in progress run to their end (uploads holding a
 *      slot complete and are committed, ?wait=1 replies come when their batch
 *      is trained) and every accepted batch is trained;
 *   3. commits close (a body that completes now gets 503, never a 202 that
 *      would not be trained), the last accepted batches are trained, the
 *      engine stops, requests still waiting reply, the listeners close;
 *   4. the final checkpoint is written.
 * A step or engine command still running when the grace period ends is not
 * waited for: the process exits at once without a final checkpoint. Exit
 * status 0 after a signal either way; the log says which.
 */
#include <errno.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu/backend.h"
#include "server/app.h"
#include "server/checkpoint.h"
#include "server/clock.h"
#include "server/config.h"
#include "server/diagnose.h"
#include "server/distributed.h"
#include "server/engine.h"
#include "server/evals.h"
#include "server/http.h"
#include "server/jobs.h"
#include "server/kept_logits.h"
#include "server/log.h"
#include "server/netaddr.h"
#include "server/process.h"
#include "server/ring.h"
#include "server/telemetry.h"
#include "server/upload.h"

/* How often the TLS files are checked for a change. */
#define TLS_CHECK_S 2

static void apply_log_settings(const sf_config *c)
{
    sf_log_level l;
    if (sf_log_level_parse(c->log.level, &l) == 0)
        sf_log_set_level(l);
    sf_log_set_json(strcmp(c->log.format, "json") == 0);
}

static void *cpu_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
}
static void cpu_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}
static void *be_alloc(void *ctx, size_t bytes)
{
    sf_backend *be = ctx;
    return be->i->host_alloc(be, bytes);
}
static void be_free(void *ctx, void *p)
{
    sf_backend *be = ctx;
    be->i->host_free(be, p);
}

static void on_slot_free(void *ctx)
{
    sf_app *app = ctx;
    sf_http_wake(app->http, SF_WAIT_SLOT, UINT64_MAX);
}

/* Picks the backend; *fallback receives why auto fell back to the CPU (or ""). */
static sf_backend *pick_backend(const sf_config *c, char *fallback, size_t fblen, char *err,
                                size_t errlen)
{
    fallback[0] = '\0';
    if (strcmp(c->pipeline.backend, "ref") != 0) {
        char why[256] = "";
        sf_backend *be = sf_backend_cuda_new(c->pipeline.device, why, sizeof why);
        if (be)
            return be;
        if (strcmp(c->pipeline.backend, "cuda") == 0) {
            snprintf(err, errlen, "pipeline.backend=cuda but no usable GPU: %s", why);
            return NULL;
        }
        snprintf(fallback, fblen, "%s", why);
        SF_INFO("no usable GPU (%s): using the CPU reference backend", why);
    }
    return sf_backend_ref_new(err, errlen);
}

/* The reference backend is plain loops: fine for the tiny model, seconds to
 * minutes per batch for the benchmark presets. A user who did not ask for the
 * CPU (auto fell back) and got a large model must be told, or the first batch
 * looks like a hang. GET /v1/model repeats the warning. */
static void warn_cpu_fallback(sf_app *app, const char *why)
{
    if (!why[0] || app->model.n_params < SF_CPU_LARGE_PARAMS)
        return;
    snprintf(app->model_warning, sizeof app->model_warning,
             "no usable GPU (%s): model %s (%.1f M parameters) runs on the CPU reference "
             "backend, where one batch takes seconds to minutes; for a CPU trial use "
             "--model.preset tiny, or pipeline.backend=cuda to refuse to start without a GPU",
             why, app->model.preset, (double)app->model.n_params / 1e6);
    SF_WARN("%s", app->model_warning);
}

/* --version: the only flag answered before the configuration is read. */
static int print_version(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--version")) {
            printf("streamfeed %s (commit %s, backend built: %s)\n", SF_VERSION, SF_COMMIT,
                   SF_BACKEND_BUILT);
            return 1;
        }
    }
    return 0;
}

/* The line tests and scripts read the bound port from (http.port=0): plain
 * text, or one JSON object in log.format=json so a log collector parses it. */
static void print_listening(const sf_app *app)
{
    char host[300], url[400];
    sf_netaddr_url_host(app->cfg.http.host, host, sizeof host);
    /* Tests and scripts read the bound port from this line (http.port=0). */
    snprintf(url, sizeof url, "%s://%s:%d", sf_http_tls(app->http) ? "https" : "http", host, sf_http_port(app->http));
    if (strcmp(app->cfg.log.format, "json") == 0) {
        char when[64];
        sf_log_time(when, sizeof when);
        printf("{\"time\":\"%s\",\"level\":\"info\",\"msg\":\"streamfeed listening on %s\","
               "\"url\":\"%s\",\"port\":%d}\n",
               when, url, url, sf_http_port(app->http));
    } else {
        printf("streamfeed listening on %s\n", url);
    }
    fflush(stdout);
}

static sf_precision precision_of(const char *s)
{
    return !strcmp(s, "fp32") ? SF_PREC_FP32 : !strcmp(s, "bf16") ? SF_PREC_BF16 : SF_PREC_TF32;
}

static int build_model(sf_app *app, char *err, size_t errlen)
{
    const sf_config *c = &app->cfg;
    int rc = sf_config_model(c, &app->model, err, errlen);
    if (rc == 0 && c->model.freeze[0])
        rc = sf_model_set_freeze(&app->model, c->model.freeze, err, errlen);
    if (rc)
        return -1;
    if (sf_aug_parse(sf_config_train_pipeline(c), &app->aug, err, errlen))
        return -1;
    if (sf_aug_parse(sf_config_eval_pipeline(c), &app->aug_eval, err, errlen))
        return -1;
    if (!app->backend)
        return 0;
    sf_train_cfg tc = {0};
    tc.precision = precision_of(c->model.precision);
    tc.seed = (uint64_t)c->model.seed;
    tc.max_batch = c->model.max_batch;
    tc.overlap = c->pipeline.overlap;
    tc.cuda_graphs = c->pipeline.cuda_graphs;
    tc.device = c->pipeline.device;
    tc.optim = strcmp(c->optim.name, "adamw") == 0 ? SF_OPT_ADAMW : SF_OPT_SGD;
    tc.grad_accum_steps = c->model.grad_accum_steps;
    tc.jpeg_max_batch_pixels = c->jpeg.max_batch_pixels;
    tc.jpeg_decoder = !strcmp(c->jpeg.decoder, "hardware")     ? SF_JPEG_DECODER_HARDWARE
                      : !strcmp(c->jpeg.decoder, "gpu_hybrid") ? SF_JPEG_DECODER_GPU_HYBRID
                      : !strcmp(c->jpeg.decoder, "hybrid")     ? SF_JPEG_DECODER_HYBRID
                                                               : SF_JPEG_DECODER_AUTO;
    tc.layout = !strcmp(c->pipeline.layout, "nchw")   ? SF_ACT_LAYOUT_NCHW
                : !strcmp(c->pipeline.layout, "nhwc") ? SF_ACT_LAYOUT_NHWC
                                                      : SF_ACT_LAYOUT_AUTO;
    tc.tune_configs = c->pipeline.cudnn_tune_configs;
    tc.dist = app->dist ? sf_distributed_backend(app->dist) : NULL;
    if (app->backend->i->build(app->backend, &app->model, &tc, err, errlen))
        return -1;
    /* The plan the backend chose, for GET /v1/model: fixed from here on. */
    if (app->backend->i->describe) {
        size_t cap = 1 << 16;
        char *d = malloc(cap);
        if (d && app->backend->i->describe(app->backend, d, cap, &app->plan_device_bytes) == 0)
            app->plan = d;
        else
            free(d);
    }
    return 0;
}

/* The HTTP timer's tick: slow uploads lose their slot, old kept logits go. */
static void every_second(void *ctx)
{
    sf_app *app = ctx;
    sf_upload_sweep(app);
    sf_kept_logits_expire(app->kept_logits, sf_now_ns());
}

static uint64_t pending_batches(sf_app *app)
{
    uint64_t counts[SF_JOB_STATES], accepted;
    sf_jobs_counts(app->jobs, counts, &accepted);
    return counts[SF_JOB_QUEUED] + counts[SF_JOB_TRANSFORMING] + counts[SF_JOB_TRAINING];
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits until no accepted batch is pending (and, with requests_too, no request
 * is in progress on the main port) or the deadline; returns whether that holds. */
static int wait_for(sf_app *app, int requests_too, uint64_t deadline_ns)
{
    for (;;) {
        int idle = pending_batches(app) == 0 && (!requests_too || sf_http_active(app->http) == 0);
        if (idle)
            return 1;
        if (sf_now_ns() >= deadline_ns)
            return 0;
        sleep_ms(10);
    }
}

/* Steps 1 to 3 of the shutdown (see the top of this file) after signal sig.
 * Returns 0 when the engine stopped, -1 when it was still busy at the
 * deadline. */
static int drain_and_stop(sf_app *app, int sig, uint64_t t_signal_ns)
{
    sf_config c;
    sf_config_get(&c);
    uint64_t grace_ns = (uint64_t)c.shutdown.grace_s * 1000000000ull;
    uint64_t deadline = t_signal_ns + grace_ns;
    /* The stop after the drain (engine, replies, listeners) gets the last
     * quarter of the grace period, at most a second, so that the whole
     * shutdown ends within it. */
    uint64_t reserve = grace_ns / 4 < 1000000000ull ? grace_ns / 4 : 1000000000ull;
    uint64_t drain_end = deadline - reserve;

    /* 1. The log line comes once both hold, so that whoever reads it finds
     * readiness false and the main port refusing. */
    atomic_store(&app->draining, 1);
    sf_distributed_cancel_join(app->dist);
    sf_http_quiesce(app->http);
    SF_INFO("signal %d: draining (grace %ds)", sig, c.shutdown.grace_s);
    sf_http_wake(app->http, SF_WAIT_SLOT, UINT64_MAX);
    /* 2. */
    int drained = wait_for(app, 1, drain_end);
    /* 3. Requests begun before the signal may still commit a batch until
     * commits close; those batches are trained within the reserve. */
    sf_upload_close(app);
    drained = wait_for(app, 0, drain_end) && drained;
    if (!drained) {
        SF_WARN("grace period (%ds) over with %d requests in progress and %llu batches "
                "unfinished: the requests are cut, the batches reported failed",
                c.shutdown.grace_s, sf_http_active(app->http),
                (unsigned long long)pending_batches(app));
    }
    int stopped = sf_engine_stop_by(app->engine, deadline) == 0;
    if (stopped)
        app->engine = NULL;
    /* Requests still waiting (on failed batches, on commands) reply now;
     * give the replies until the deadline to go out. */
    sf_http_wake_all(app->http);
    while (sf_http_active(app->http) > 0 && sf_now_ns() < deadline)
        sleep_ms(5);
    return stopped ? 0 : -1;
}

/* A start-up failure: its message, in order after the lines logged before
 * it (through the log writer when there is one: exit flushes it, for
 * SF_LOG_EXIT_FLUSH_MS at most), then the exit status to return. */
static int start_failed(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int start_failed(int rc, const char *fmt, ...)
{
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sf_log_raw("streamfeed: %s", msg);
    return rc;
}

/* The engine thread, given what it needs of the app. */
static sf_engine *start_engine(sf_app *app, char *err, size_t errlen)
{
    const sf_engine_ctx ctx = {
        .app = app, .cfg = &app->cfg, .model = &app->model, .aug = &app->aug, .aug_eval = &app->aug_eval,
        .backend = app->backend, .ring = app->ring, .jobs = app->jobs, .evals = app->evals,
        .dist = app->dist, .http = &app->http, .m = &app->m, .step = &app->step,
        .restore_gen = &app->restore_gen, .nonfinite_in_row = &app->nonfinite_in_row,
        .diverged = &app->diverged, .draining = &app->draining, .backend_ok = &app->backend_ok};
    return sf_engine_start(&ctx, err, errlen);
}

/* The HTTP daemon, given what it needs of the app; it publishes itself in
 * app->http before it listens. Uploads' context is set first: the daemon's
 * requests and sweep reach it. */
static sf_http *start_http(sf_app *app, char *err, size_t errlen)
{
    sf_uploads_init(&app->uploads);
    app->upload = (sf_upload_ctx){
        .cfg = &app->cfg, .model = &app->model, .aug = &app->aug, .aug_eval = &app->aug_eval,
        .backend = app->backend, .ring = app->ring, .jobs = app->jobs, .evals = app->evals,
        .dist = app->dist, .http = &app->http, .m = &app->m, .draining = &app->draining,
        .closing = &app->closing, .shared = &app->uploads};
    const sf_http_ctx ctx = {.app = app, .cfg = &app->cfg, .draining = &app->draining,
                             .requests = app->m.http_requests, .duration = app->m.http_duration,
                             .errors = app->m.http_errors, .publish = &app->http};
    return sf_http_start(&ctx, err, errlen);
}

/* Serves until SIGTERM or SIGINT, which it returns: SIGHUP reloads the TLS
 * certificate, and every TLS_CHECK_S the files are looked at for a renewal. */
static int wait_for_stop_signal(sf_app *app, const sigset_t *sigs)
{
    for (;;) {
        struct timespec tick = {TLS_CHECK_S, 0};
        int sig = sigtimedwait(sigs, NULL, &tick);
        if (sig == SIGHUP) {
            if (sf_http_tls(app->http))
                sf_http_tls_reload(app->http, 1);
            else
                SF_INFO("SIGHUP: no TLS certificate to reload (http.tls_cert is not set)");
            continue;
        }
        if (sig < 0) {
            if (errno == EAGAIN)
                sf_http_tls_reload(app->http, 0); /* a certificate renewed on disk */
            continue;
        }
        return sig;
    }
}

int main(int argc, char **argv)
{
    static sf_app app; /* large (model description); static keeps it off the stack */
    char err[1024], fallback[256] = "";
    if (print_version(argc, argv))
        return 0;
    int rc = sf_config_load(&app.cfg, argc, argv, err, sizeof err);
    if (rc == 1)
        return 0;
    if (rc) {
        fprintf(stderr, "streamfeed: %s\n", err);
        return 2;
    }
    apply_log_settings(&app.cfg);
    const char *env_warnings[16];
    for (int i = 0, n = sf_config_env_warnings(env_warnings, 16); i < n; i++)
        SF_WARN("%s", env_warnings[i]);
    sf_config_live_init(&app.cfg);
    sf_config_on_change(apply_log_settings);
    app.t_start_ns = sf_now_ns();
    sf_process_start_time(); /* process_start_time_seconds: now, before the backend's slow start */

    /* Signals are taken by sigwait in this thread only: block them before any
     * other thread starts so they inherit the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* From here a stalled reader of stderr costs log lines, not progress. */
    sf_log_start();

    int sink = strcmp(app.cfg.pipeline.mode, "sink") == 0;
    if (!sink) {
        app.backend = pick_backend(&app.cfg, fallback, sizeof fallback, err, sizeof err);
        if (!app.backend)
            return start_failed(1, "%s", err);
        app.backend_name = app.backend->i->name(app.backend);
        sf_precision asked = precision_of(app.cfg.model.precision);
        sf_precision used = app.backend->i->precision_in_force
                                ? app.backend->i->precision_in_force(app.backend, asked)
                                : asked;
        static const char *const names[] = {[SF_PREC_FP32] = "fp32", [SF_PREC_TF32] = "tf32",
                                            [SF_PREC_BF16] = "bf16"};
        app.precision = names[used];
    } else {
        app.backend_name = "sink";
    }
    /* A rank of a data-parallel job: the store and the job's state exist
     * before the backend is built (it keeps a pointer); the ranks join on the
     * engine thread once the HTTP listener serves rank 0's store. */
    if (app.cfg.distributed.world_size > 1) {
        if (sink)
            return start_failed(2, "distributed.world_size > 1 needs a backend (pipeline.mode=train)");
        app.dist = sf_distributed_new(&app.cfg, err, sizeof err);
        if (!app.dist)
            return start_failed(1, "distributed: %s", err);
    }
    if (build_model(&app, err, sizeof err))
        return start_failed(1, "model: %s", err);
    warn_cpu_fallback(&app, fallback);
    atomic_store(&app.backend_ok, 1);
    sf_app_metrics_init(&app);
    /* Resume or model.init_from: the backend is built, the engine not started yet. */
    if (sf_ckpt_start(&app, err, sizeof err))
        return start_failed(1, "checkpoint: %s", err);

    /* ring.slot_bytes 0: a slot holds one raw batch of model.max_batch at
     * the model's input size (W3's 1024 224x224 images need 147 MiB), so a
     * large batch needs no hand-set size; the live config shows the bytes. */
    if (app.cfg.ring.slot_bytes == 0) {
        const sf_model *m = &app.model;
        const sf_cfg_option *o = sf_config_find("ring.slot_bytes");
        app.cfg.ring.slot_bytes = (int64_t)sf_ring_auto_slot_bytes(
            app.cfg.model.max_batch, m->in_c, m->in_h, m->in_w,
            m->segmentation ? (uint64_t)m->out_h * (uint64_t)m->out_w : 1, (uint64_t)o->max);
        sf_config_live_init(&app.cfg);
    }
    app.ring = app.backend ? sf_ring_new(app.cfg.ring.slots, (size_t)app.cfg.ring.slot_bytes,
                                         be_alloc, be_free, app.backend)
                           : sf_ring_new(app.cfg.ring.slots, (size_t)app.cfg.ring.slot_bytes,
                                         cpu_alloc, cpu_free, NULL);
    app.jobs = sf_jobs_new(app.cfg.pipeline.jobs_max);
    app.evals = sf_evals_new(app.cfg.eval.max_names);
    app.kept_logits = sf_kept_logits_new(app.jobs, app.m.logits_evicted);
    if (!app.ring || !app.jobs || !app.evals || !app.kept_logits)
        return start_failed(1, "cannot allocate %d ring slots of %lld bytes", app.cfg.ring.slots,
                            (long long)app.cfg.ring.slot_bytes);
    sf_app_evals_attach(&app);
    sf_ring_on_free(app.ring, on_slot_free, &app);
    app.engine = start_engine(&app, err, sizeof err);
    if (!app.engine)
        return start_failed(1, "%s", err);
    sf_ckpt_attach(&app); /* periodic checkpoints */
    /* The sampler (GPU readings, throughput history) before the daemon, so
     * app.telemetry is set before any handler can read it. */
    app.telemetry = sf_telemetry_start(&app, err, sizeof err);
    if (!app.telemetry)
        return start_failed(1, "%s", err);
    if (!start_http(&app, err, sizeof err))
        return start_failed(1, "%s", err);
    sf_http_set_tick(app.http, every_second, &app);
    SF_INFO("streamfeed %s: backend %s, model %s (%zu parameters), %d ring slots of %lld bytes",
            SF_VERSION, app.backend_name, app.model.preset, app.model.n_params, app.cfg.ring.slots,
            (long long)app.cfg.ring.slot_bytes);
    if (sf_http_metrics_port(app.http))
        SF_INFO("metrics and probes on http://%s:%d (GET /metrics, /healthz, /readyz)",
                app.cfg.http.host, sf_http_metrics_port(app.http));
    print_listening(&app);

    int sig = wait_for_stop_signal(&app, &sigs);
    uint64_t t_signal = sf_now_ns();
    if (drain_and_stop(&app, sig, t_signal) != 0) {
        /* The engine thread is inside a step or a command and owns the
         * backend: nothing can be saved or freed safely. */
        SF_WARN("a training step or engine command was still running when the grace period "
                "ended: exiting without waiting for it and without a final checkpoint (the "
                "newest periodic checkpoint stands)");
        fflush(stdout);
        sf_log_flush(SF_LOG_EXIT_FLUSH_MS);
        _exit(0);
    }
    /* No engine thread any more: the final checkpoint reads the backend from here. */
    sf_ckpt_shutdown(&app);
    sf_http_stop(app.http);
    /* Both call into the backend: before it is destroyed. */
    sf_telemetry_stop(app.telemetry);
    app.telemetry = NULL;
    sf_diagnose_shutdown(&app);
    sf_ring_destroy(app.ring);
    sf_kept_logits_destroy(app.kept_logits); /* before the job table it marks */
    sf_jobs_destroy(app.jobs);
    sf_evals_destroy(app.evals);
    if (app.backend)
        app.backend->i->destroy(app.backend);
    free(app.plan);
    sf_distributed_free(app.dist);
    sf_metrics_reset();
    /* A stderr pipe read slowly (or only from now on, as a supervisor that
     * collects the output at exit reads it) can still hold the ring full of
     * lines logged before the signal: wait, bounded, for them to go out, so
     * that the last line says the service stopped instead of being dropped
     * with them. */
    sf_log_flush(SF_LOG_EXIT_FLUSH_MS);
    SF_INFO("stopped");
    return 0;
}
