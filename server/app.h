/* server/app.h — the process's components, wired together once at start.
 *
 * One sf_app exists per process (main.c). Handlers reach everything through
 * req->app and keep nothing of their own. Fields are set before the HTTP
 * daemon starts and never reassigned while it runs; what changes at run time
 * (draining, readiness) is atomic.
 */
#ifndef SF_APP_H
#define SF_APP_H

#include <stdatomic.h>
#include <stdint.h>

#include "gpu/aug.h"
#include "gpu/backend.h"
#include "gpu/model.h"
#include "server/config.h"
#include "server/metrics.h"

struct sf_ring;
struct sf_jobs;
struct sf_engine;
struct sf_http;
struct sf_telemetry;
struct sf_ckpt;
struct sf_distributed;
struct sf_evals;
struct sf_kept_logits;

/* Metric families, registered once (app.c: sf_app_metrics_init). */
typedef struct sf_app_metrics {
    sf_family *http_requests, *http_duration, *http_errors;
    sf_family *batches_received, *batches_finished, *batches_rejected, *batches_pending;
    sf_family *uploads_waiting;
    sf_family *bytes_received, *samples_trained, *steps, *loss, *learning_rate;
    sf_family *ring_slots, *queue_wait, *h2d, *transform, *step;
    sf_family *compute_busy, *compute_starved, *build_info;
    sf_family *process_start, *process_cpu, *process_rss, *process_vsize, *process_fds, *process_max_fds;
    sf_family *log_dropped; /* server/log.h: lines a stalled stderr reader cost */
    sf_family *uploads_evicted;
    sf_family *logits_kept, *logits_kept_bytes, *logits_evicted; /* server/kept_logits.h */
    /* The training loop: skipped steps by reason, pre-clip gradient norms,
     * and the named evaluations (labelled eval="<name>", at most
     * eval.max_names of them). */
    sf_family *steps_skipped, *grad_norm;
    sf_family *eval_loss, *eval_accuracy, *eval_samples;
    sf_family *jpeg_batches, *jpeg_samples, *jpeg_decode_host; /* labelled decoder="..." */
    sf_family *samples_undecodable; /* samples left out of their batch: the decoder refused their files */
    /* Device telemetry (server/telemetry.c), labelled gpu="<ordinal>"; no
     * child until a valid sample, so absent without NVML. */
    sf_family *gpu_utilization, *gpu_memory_used, *gpu_memory_total, *gpu_power;
} sf_app_metrics;

typedef struct sf_app {
    sf_config cfg;              /* as started: restart-only values come from here */
    sf_model model;
    sf_aug_pipeline aug;        /* training batches (augment.pipeline or the preset's recipe) */
    sf_aug_pipeline aug_eval;   /* eval batches (augment.eval_pipeline or the preset's recipe) */
    struct sf_evals *evals;     /* named evaluations (server/evals.h) */
    sf_backend *backend;        /* NULL in sink mode */
    struct sf_ring *ring;
    struct sf_jobs *jobs;
    struct sf_kept_logits *kept_logits; /* logits of eval batches whose wait ran out */
    struct sf_engine *engine;
    struct sf_http *http;
    sf_app_metrics m;
    atomic_int draining;        /* SIGTERM received: refuse new batches */
    atomic_int closing;         /* the drain ended: commits are refused (sf_upload_close) */
    atomic_int backend_ok;      /* last health check passed */
    uint64_t t_start_ns;
    const char *backend_name;
    char *plan;                 /* the backend's description of its plan (layout, engines, fused
                                 * ops, memory), one line per item; set once at start-up, NULL
                                 * where the backend has none */
    size_t plan_device_bytes;   /* device memory the backend allocated for the model (describe) */
    struct sf_telemetry *telemetry; /* the sampler thread (server/telemetry.c); NULL until started */
    struct sf_ckpt *ckpt;       /* checkpoints (server/checkpoint.c); NULL without a backend */
    _Atomic uint64_t step;      /* optimizer steps taken, as the backend counts them: set by
                                 * every STEP_DONE and by checkpoint restores (GET /v1/model) */
    _Atomic uint64_t restore_gen; /* bumped by every checkpoint restore that sets step (the
                                   * backend's accumulation restarts): the engine then re-bases
                                   * its learning-rate schedule position on step */
    atomic_int nonfinite_in_row; /* consecutive optimizer steps skipped for a NaN/Inf */
    atomic_int diverged;        /* nonfinite_in_row reached train.max_nonfinite_in_row: readyz
                                 * false until a step trains again or a checkpoint is restored */
    char model_warning[512];    /* "" or why this model will be slow here (GET /v1/model) */
    const char *precision;      /* what the backend computes in: model.precision, or what
                                 * the backend makes of it (GET /v1/model); NULL in sink mode */
    struct sf_distributed *dist; /* this rank of a data-parallel job (server/distributed.h);
                                  * NULL with distributed.world_size 1 */
} sf_app;

/* Parameters above which a model is too large for the CPU reference backend
 * to train interactively (tiny has a few thousand; W1 44.8 M, W3 11.7 M). */
#define SF_CPU_LARGE_PARAMS 1000000u

void sf_app_metrics_init(sf_app *app);
/* Readiness: 0 ready, else fills reasons (cJSON array of strings, caller frees). */
int sf_app_ready(sf_app *app, cJSON **reasons);

#endif
