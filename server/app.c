/* server/app.c — metric registration and readiness. */
#include "server/app.h"

#include "server/distributed.h"
#include "server/engine.h"
#include "server/evals.h"
#include "server/jobs.h"
#include "server/kept_logits.h"
#include "server/log.h"
#include "server/http.h"
#include "server/process.h"
#include "server/ring.h"

static const char *const L_ROUTE_CODE[] = {"route", "code", NULL};
static const char *const L_ROUTE[] = {"route", NULL};
static const char *const L_CODE[] = {"code", NULL};
static const char *const L_STATUS[] = {"status", NULL};
static const char *const L_REASON[] = {"reason", NULL};
static const char *const L_STATE[] = {"state", NULL};
static const char *const L_BUILD[] = {"version", "commit", "backend", NULL};
static const char *const L_GPU[] = {"gpu", NULL};
static const char *const L_DECODER[] = {"decoder", NULL};
static const char *const L_EVAL[] = {"eval", NULL};
static const char *const L_EVAL_K[] = {"eval", "k", NULL};
/* Pre-clip gradient norms span decades: 1e-3 .. 1e4, about 3 buckets a decade. */
static const double grad_norm_buckets[] = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5,
                                           10, 20, 50, 100, 200, 500, 1000, 10000};

static void collect(void *ctx)
{
    sf_app *app = ctx;
    if (app->ring) {
        int c[SF_SLOT_STATES];
        sf_ring_counts(app->ring, c);
        for (int s = 0; s < SF_SLOT_STATES; s++) {
            const char *v[] = {sf_slot_state_name((sf_slot_state)s)};
            sf_gauge_set(sf_metric_child(app->m.ring_slots, v), c[s]);
        }
    }
    if (app->http)
        sf_gauge_set(sf_metric_only(app->m.uploads_waiting), sf_http_waiting(app->http, SF_WAIT_SLOT));
    if (app->kept_logits) {
        int n;
        size_t bytes;
        sf_kept_logits_usage(app->kept_logits, &n, &bytes);
        sf_gauge_set(sf_metric_only(app->m.logits_kept), n);
        sf_gauge_set(sf_metric_only(app->m.logits_kept_bytes), (double)bytes);
    }
    if (app->jobs) {
        uint64_t c[SF_JOB_STATES], accepted;
        sf_jobs_counts(app->jobs, c, &accepted);
        /* accepted = done + failed + pending holds in every scrape: all four
         * come from one locked snapshot of the job table. */
        sf_gauge_set(sf_metric_only(app->m.batches_pending),
                     (double)(c[SF_JOB_QUEUED] + c[SF_JOB_TRANSFORMING] + c[SF_JOB_TRAINING]));
        const char *acc[] = {"accepted"}, *dn[] = {"done"}, *fl[] = {"failed"};
        sf_gauge_set(sf_metric_child(app->m.batches_received, acc), (double)accepted);
        sf_gauge_set(sf_metric_child(app->m.batches_finished, dn), (double)c[SF_JOB_DONE]);
        sf_gauge_set(sf_metric_child(app->m.batches_finished, fl), (double)c[SF_JOB_FAILED]);
    }
    sf_process_stats ps;
    if (sf_process_stats_read(&ps) == 0) {
        sf_gauge_set(sf_metric_only(app->m.process_cpu), ps.cpu_seconds);
        sf_gauge_set(sf_metric_only(app->m.process_rss), ps.resident_bytes);
        sf_gauge_set(sf_metric_only(app->m.process_vsize), ps.virtual_bytes);
        sf_gauge_set(sf_metric_only(app->m.process_fds), ps.open_fds);
        sf_gauge_set(sf_metric_only(app->m.process_max_fds), ps.max_fds);
    }
    sf_gauge_set(sf_metric_only(app->m.log_dropped), (double)sf_log_dropped());
    sf_decoder_memory dm;
    if (app->backend && app->backend->i->decoder_memory && app->backend->i->decoder_memory(app->backend, &dm) == 0) {
        sf_gauge_set(sf_metric_only(app->m.jpeg_decoder_device), (double)dm.device_bytes);
        sf_gauge_set(sf_metric_only(app->m.jpeg_decoder_pinned), (double)dm.pinned_bytes);
    }
}

/* Requests, uploads and the batches they bring. */
static void register_ingest_metrics(sf_app_metrics *m)
{
    m->http_requests = sf_metrics_counter("streamfeed_http_requests_total",
                                          "HTTP requests by route and status code.", L_ROUTE_CODE);
    m->http_duration = sf_metrics_histogram("streamfeed_http_request_duration_seconds",
                                            "HTTP request duration from headers to reply sent.",
                                            L_ROUTE, sf_buckets_latency, sf_buckets_latency_n);
    m->http_errors = sf_metrics_counter("streamfeed_http_errors_total",
                                        "Error replies by stable error code.", L_CODE);
    m->batches_received = sf_metrics_counter(
        "streamfeed_batches_received_total",
        "Batch uploads by outcome: accepted into the ring, or rejected.", L_STATUS);
    m->batches_finished = sf_metrics_counter(
        "streamfeed_batches_finished_total",
        "Accepted batches that finished, by status (done or failed).", L_STATUS);
    m->batches_rejected = sf_metrics_counter("streamfeed_batches_rejected_total",
                                             "Batch uploads rejected, by reason (error code).",
                                             L_REASON);
    m->batches_pending = sf_metrics_gauge(
        "streamfeed_batches_pending",
        "Accepted batches not finished yet (queued or in flight); accepted = finished + pending.",
        NULL);
    m->uploads_waiting = sf_metrics_gauge(
        "streamfeed_uploads_waiting",
        "Uploads suspended until a ring slot frees (ring.full_policy=block), each holding its connection.",
        NULL);
    m->logits_kept = sf_metrics_gauge(
        "streamfeed_logits_kept",
        "Eval batches whose logits are kept for GET /v1/batches/{id}/logits (their ?return=logits wait ran out).",
        NULL);
    m->logits_kept_bytes = sf_metrics_gauge("streamfeed_logits_kept_bytes",
                                            "Bytes of the logits kept (bounded by eval.logits_keep_bytes).", NULL);
    m->logits_evicted = sf_metrics_counter(
        "streamfeed_logits_evicted_total",
        "Kept logits let go before anyone could rely on them longer, by reason: age "
        "(eval.logits_keep_s), count (eval.logits_keep_max), bytes (eval.logits_keep_bytes).",
        L_REASON);
    m->uploads_evicted = sf_metrics_counter(
        "streamfeed_uploads_evicted_total",
        "Uploads whose ring slot was taken back because they were too slow "
        "(http.upload_min_bytes_per_s) or past http.upload_deadline_s, by reason (error code).",
        L_REASON);
    m->bytes_received = sf_metrics_counter("streamfeed_received_bytes_total",
                                           "Bytes of batch bodies received.", NULL);
}

/* Training, evaluation, the pipeline's stages and JPEG decoding. */
static void register_training_metrics(sf_app_metrics *m)
{
    m->samples_trained = sf_metrics_counter("streamfeed_samples_trained_total",
                                            "Samples that went through a training step.", NULL);
    m->steps = sf_metrics_counter("streamfeed_steps_total", "Optimizer steps taken.", NULL);
    m->loss = sf_metrics_gauge("streamfeed_loss", "Loss of the last training step.", NULL);
    m->steps_skipped = sf_metrics_counter(
        "streamfeed_steps_skipped_total",
        "Optimizer steps skipped, by reason: nonfinite (a NaN/Inf loss or gradient), no_samples (a "
        "data-parallel step in which every rank's batch was refused after its round began); the weights, "
        "optimizer state and step count stayed as they were.",
        L_REASON);
    m->grad_norm = sf_metrics_histogram("streamfeed_grad_norm",
                                        "Global L2 norm of the gradients of each optimizer step, before "
                                        "clipping (optim.clip_grad_norm).",
                                        NULL, grad_norm_buckets,
                                        (int)(sizeof grad_norm_buckets / sizeof grad_norm_buckets[0]));
    m->eval_loss = sf_metrics_gauge("streamfeed_eval_loss",
                                    "Sample-weighted mean loss of all batches of the named evaluation.",
                                    L_EVAL);
    m->eval_accuracy = sf_metrics_gauge(
        "streamfeed_eval_accuracy",
        "Top-k accuracy (k=\"1\" or \"5\") over all batches of the named evaluation.", L_EVAL_K);
    m->eval_samples = sf_metrics_counter("streamfeed_eval_samples_total",
                                         "Samples scored by eval batches (no training), by evaluation name.",
                                         L_EVAL);
    m->evals_evicted = sf_metrics_counter(
        "streamfeed_evals_evicted_total",
        "Evaluations evicted, aggregates and series, to make room for a new name once eval.max_names "
        "existed: the least recently used one idle for eval.name_idle_s.",
        NULL);
    /* Their children are set through the evaluations' hooks only (below), so
     * the names of deleted evaluations do not fill the families for good. */
    sf_metrics_reuse_forgotten(m->eval_loss);
    sf_metrics_reuse_forgotten(m->eval_accuracy);
    sf_metrics_reuse_forgotten(m->eval_samples);
    m->learning_rate = sf_metrics_gauge("streamfeed_learning_rate", "Current learning rate.", NULL);
    m->ring_slots = sf_metrics_gauge("streamfeed_ring_slots", "Ring slots by state.", L_STATE);
    m->queue_wait = sf_metrics_histogram("streamfeed_queue_wait_seconds",
                                         "Time a batch waited READY in the ring before the engine took it.",
                                         NULL, sf_buckets_latency, sf_buckets_latency_n);
    m->h2d = sf_metrics_histogram("streamfeed_h2d_seconds", "Host-to-device copy time per batch.",
                                  NULL, sf_buckets_latency, sf_buckets_latency_n);
    m->transform = sf_metrics_histogram("streamfeed_transform_seconds",
                                        "Augmentation time per batch.", NULL, sf_buckets_latency,
                                        sf_buckets_latency_n);
    m->step = sf_metrics_histogram("streamfeed_step_seconds",
                                   "Training step time (forward, backward, optimizer) per batch.",
                                   NULL, sf_buckets_latency, sf_buckets_latency_n);
    m->compute_busy = sf_metrics_gauge("streamfeed_compute_busy_ratio",
                                       "Share of wall time the compute stream was busy, last window.",
                                       NULL);
    m->compute_starved = sf_metrics_counter(
        "streamfeed_compute_starved_seconds_total",
        "Time the compute side waited with no batch ready while training.", NULL);
    m->jpeg_batches = sf_metrics_counter(
        "streamfeed_jpeg_batches_total",
        "JPEG batches decoded (trained or evaluated), by the decoder that ran them (hardware, "
        "gpu_hybrid, hybrid: nvJPEG's backends on CUDA; libjpeg-turbo on the reference backend).",
        L_DECODER);
    m->jpeg_samples = sf_metrics_counter("streamfeed_jpeg_samples_total",
                                         "JPEG samples decoded (trained or evaluated), by the decoder that ran them.", L_DECODER);
    m->jpeg_decode_host = sf_metrics_counter(
        "streamfeed_jpeg_decode_host_seconds_total",
        "Host time the engine thread spent issuing JPEG decodes, by decoder (on CUDA the nvJPEG call, "
        "which includes the hybrid backends' CPU Huffman decoding; the whole decode on the reference "
        "backend).",
        L_DECODER);
    m->samples_undecodable = sf_metrics_counter(
        "streamfeed_samples_undecodable_total",
        "Samples left out of their batch (trained, evaluated or transformed) because the decoder refused "
        "their files' data (decode.on_undecodable skip); a batch of which none decoded counts its samples "
        "too, and fails with jpeg_undecodable.",
        NULL);
    m->jpeg_decoder_unavailable = sf_metrics_counter(
        "streamfeed_jpeg_decoder_unavailable_total",
        "Encoded batches (trained, evaluated or transformed) that failed with jpeg_decoder_unavailable: the "
        "decoder, made by the first encoded batch, could not be made (the device memory it needs held by "
        "training, most often). Nothing of such a batch ran; the next encoded batch tries again.",
        NULL);
    /* 0 from the start, not absent: a failure is a rise from zero. */
    sf_counter_add(sf_metric_only(m->jpeg_decoder_unavailable), 0);
    m->jpeg_decoder_device = sf_metrics_gauge(
        "streamfeed_jpeg_decoder_device_bytes",
        "Device memory the encoded batches' decoder holds now (CUDA: its staging areas and nvJPEG's "
        "buffers): 0 until the first encoded batch makes it, so a job that posts raw pixels holds none. "
        "Absent on the reference backend, which decodes into the batch's own buffers.",
        NULL);
    m->jpeg_decoder_pinned = sf_metrics_gauge(
        "streamfeed_jpeg_decoder_pinned_bytes",
        "Pinned host memory the encoded batches' decoder holds now (CUDA: nvJPEG's pinned buffers); 0 until "
        "the first encoded batch makes it. Absent on the reference backend.",
        NULL);
}

/* The build, the process (as every Prometheus client library exports them),
 * the log and the device. */
static void register_process_metrics(sf_app_metrics *m)
{
    m->build_info = sf_metrics_gauge("streamfeed_build_info",
                                     "Version, commit and backend of this process; always 1.", L_BUILD);
    /* The process_* families every Prometheus client library exports, so the
     * usual dashboards and alerts (restarts, memory, fd exhaustion) just work. */
    m->process_start = sf_metrics_gauge("process_start_time_seconds",
                                        "Start time of the process since the Unix epoch in seconds.",
                                        NULL);
    m->process_cpu = sf_metrics_counter("process_cpu_seconds_total",
                                        "Total user and system CPU time spent in seconds.", NULL);
    m->process_rss = sf_metrics_gauge("process_resident_memory_bytes", "Resident memory size in bytes.",
                                      NULL);
    m->process_vsize = sf_metrics_gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                                        NULL);
    m->process_fds = sf_metrics_gauge("process_open_fds", "Number of open file descriptors.", NULL);
    m->process_max_fds = sf_metrics_gauge("process_max_fds",
                                          "Maximum number of open file descriptors.", NULL);
    m->log_dropped = sf_metrics_counter(
        "streamfeed_log_lines_dropped_total",
        "Log lines dropped because stderr (a pipe or socket) was read more slowly than they came; "
        "the service never waits for the reader.",
        NULL);
    m->gpu_utilization = sf_metrics_gauge(
        "streamfeed_gpu_utilization_ratio",
        "Share of the driver's last sample period the GPU was busy (NVML), sampled every "
        "metrics.gpu_sample_ms; absent without NVML.",
        L_GPU);
    m->gpu_memory_used = sf_metrics_gauge("streamfeed_gpu_memory_used_bytes",
                                          "GPU memory in use, all processes (NVML); absent without NVML.",
                                          L_GPU);
    m->gpu_memory_total = sf_metrics_gauge("streamfeed_gpu_memory_total_bytes",
                                           "Total GPU memory (NVML); absent without NVML.", L_GPU);
    m->gpu_power = sf_metrics_gauge("streamfeed_gpu_power_watts",
                                    "GPU power draw (NVML); absent without NVML.", L_GPU);
}

/* The children that render from the start: build_info and the start time
 * set, the unlabelled and the known labelled children at 0. */
static void create_initial_children(sf_app *app, sf_app_metrics *m)
{
    const char *bv[] = {SF_VERSION, SF_COMMIT, app->backend_name ? app->backend_name : "none"};
    sf_gauge_set(sf_metric_child(m->build_info, bv), 1);
    sf_gauge_set(sf_metric_only(m->process_start), sf_process_start_time());
    /* Create the unlabelled children so they render as 0 from the start. */
    sf_metric_only(m->bytes_received);
    sf_metric_only(m->samples_trained);
    sf_metric_only(m->steps);
    sf_metric_only(m->compute_starved);
    sf_metric_only(m->grad_norm);
    const char *nonfinite[] = {"nonfinite"}, *no_samples[] = {"no_samples"};
    sf_metric_child(m->steps_skipped, nonfinite);
    sf_metric_child(m->steps_skipped, no_samples);
    const char *acc[] = {"accepted"}, *rej[] = {"rejected"}, *dn[] = {"done"}, *fl[] = {"failed"};
    sf_metric_child(m->batches_received, acc);
    sf_metric_child(m->batches_received, rej);
    sf_metric_child(m->batches_finished, dn);
    sf_metric_child(m->batches_finished, fl);
    const char *ev_slow[] = {"upload_too_slow"}, *ev_late[] = {"upload_deadline_exceeded"};
    sf_metric_child(m->uploads_evicted, ev_slow);
    sf_metric_child(m->uploads_evicted, ev_late);
    sf_metric_only(m->uploads_waiting);
    sf_metric_only(m->logits_kept);
    sf_metric_only(m->logits_kept_bytes);
    const char *lg_age[] = {"age"}, *lg_count[] = {"count"}, *lg_bytes[] = {"bytes"};
    sf_metric_child(m->logits_evicted, lg_age);
    sf_metric_child(m->logits_evicted, lg_count);
    sf_metric_child(m->logits_evicted, lg_bytes);
    sf_metric_only(m->queue_wait);
    sf_metric_only(m->h2d);
    sf_metric_only(m->transform);
    sf_metric_only(m->step);
}

void sf_app_metrics_init(sf_app *app)
{
    sf_app_metrics *m = &app->m;
    register_ingest_metrics(m);
    register_training_metrics(m);
    register_process_metrics(m);
    create_initial_children(app, m);
    sf_metrics_on_collect(collect, app);
}

/* An evaluation's metrics, from its aggregates after each batch (under the
 * evaluations' lock: server/evals.h says why). */
static void publish_eval(void *ctx, const sf_eval_agg *a, uint64_t batch_samples)
{
    const sf_app_metrics *m = ctx;
    const char *name[] = {a->name};
    const char *k1[] = {a->name, "1"}, *k5[] = {a->name, "5"};
    if (a->samples) {
        sf_gauge_set(sf_metric_child(m->eval_loss, name), a->loss_sum / (double)a->samples);
        sf_gauge_set(sf_metric_child(m->eval_accuracy, k1), (double)a->correct1 / (double)a->samples);
        sf_gauge_set(sf_metric_child(m->eval_accuracy, k5), (double)a->correct5 / (double)a->samples);
    }
    sf_counter_add(sf_metric_child(m->eval_samples, name), (double)batch_samples);
}

/* A deleted evaluation's series go; a new evaluation of that name starts
 * them from zero. */
static void forget_eval(void *ctx, const char *eval)
{
    const sf_app_metrics *m = ctx;
    const char *name[] = {eval};
    const char *k1[] = {eval, "1"}, *k5[] = {eval, "5"};
    sf_metric_forget(m->eval_loss, name);
    sf_metric_forget(m->eval_accuracy, k1);
    sf_metric_forget(m->eval_accuracy, k5);
    sf_metric_forget(m->eval_samples, name);
}

static void count_evicted_eval(void *ctx, const char *eval)
{
    const sf_app_metrics *m = ctx;
    sf_counter_add(sf_metric_only(m->evals_evicted), 1);
    SF_INFO("evaluation \"%s\" evicted, idle for eval.name_idle_s, to make room for a new name", eval);
}

void sf_app_evals_attach(sf_app *app)
{
    const sf_evals_hooks hooks = {publish_eval, forget_eval, count_evicted_eval, &app->m};
    sf_evals_set_hooks(app->evals, &hooks);
}

const sf_upload_ctx *sf_upload_ctx_of(struct sf_app *app) { return &app->upload; }

int sf_app_ready(sf_app *app, cJSON **reasons)
{
    cJSON *r = cJSON_CreateArray();
    if (atomic_load(&app->draining))
        cJSON_AddItemToArray(r, cJSON_CreateString("shutting down: draining queued batches"));
    if (!app->ring)
        cJSON_AddItemToArray(r, cJSON_CreateString("ring not allocated"));
    if (!app->engine || !sf_engine_running(app->engine))
        cJSON_AddItemToArray(r, cJSON_CreateString("engine not running"));
    if (app->backend && !atomic_load(&app->backend_ok))
        cJSON_AddItemToArray(r, cJSON_CreateString("backend unhealthy (see logs)"));
    if (app->dist) {
        char why[400];
        sf_distributed_state(app->dist, why, sizeof why);
        if (!sf_distributed_ready(app->dist))
            cJSON_AddItemToArray(r, cJSON_CreateString(why));
    }
    if (atomic_load(&app->diverged))
        cJSON_AddItemToArray(r, cJSON_CreateString("diverged: train.max_nonfinite_in_row optimizer steps in a "
                                                   "row were skipped for a NaN/Inf loss or gradient; "
                                                   "restore a checkpoint"));
    int n = cJSON_GetArraySize(r);
    *reasons = r;
    return n ? -1 : 0;
}
