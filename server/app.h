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
#include "server/app_metrics.h"
#include "server/metrics.h"
#include "server/upload.h"

struct sf_ring;
struct sf_jobs;
struct sf_engine;
struct sf_http;
struct sf_telemetry;
struct sf_ckpt;
struct sf_distributed;
struct sf_evals;
struct sf_kept_logits;

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
    sf_upload_ctx upload;       /* what uploads need of the above (server/upload.h), set
                                 * before the HTTP daemon starts */
    sf_uploads uploads;         /* what every upload shares (slot holders, commits in
                                 * progress), owned here, reached through upload.shared */
} sf_app;

/* Parameters above which a model is too large for the CPU reference backend
 * to train interactively (tiny has a few thousand; W1 44.8 M, W3 11.7 M). */
#define SF_CPU_LARGE_PARAMS 1000000u

void sf_app_metrics_init(sf_app *app);
/* Makes app->evals publish and forget the eval metrics (after both exist). */
void sf_app_evals_attach(sf_app *app);
/* Readiness: 0 ready, else fills reasons (cJSON array of strings, caller frees). */
int sf_app_ready(sf_app *app, cJSON **reasons);

#endif
