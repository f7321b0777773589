/* server/diagnose.h — the caching method (POST /v1/diagnose): where does the
 * pipeline lose time?
 *
 * One run measures the training rate of the live model from four starting
 * points, each adding one stage of the real pipeline to the one before:
 *   1. device_augmented  an augmented batch cached on the device: the step only
 *                        (the model's upper bound);
 *   2. device_raw        a raw uint8 batch cached on the device: augment + step;
 *   3. host_pinned       a raw batch in pinned host memory: H2D + augment + step;
 *   4. live              the steps the engine actually completed in the `seconds`
 *                        before the request (HTTP, ring and everything above).
 * Stages 1-3 run through the backend's bench() on the engine thread, as an
 * engine command (server/engine.h): training pauses, batches that arrive wait
 * in the ring, and the backend restores the training state (parameters,
 * optimizer state, step count) afterwards. Each of them runs about seconds/3
 * (the step count is chosen from a short calibration run, within
 * [SF_DIAG_MIN_STEPS, SF_DIAG_MAX_STEPS]), in five interleaved rounds, and its
 * rate is that of its best round: noise from other work on the machine only
 * slows a round down. Stage 4 comes from the engine's step timelines
 * (sf_engine_trace): the real traffic's rate.
 *
 * The batch is shaped like the most recent trained batch (N, H, W, C, layout,
 * label dtype), or like the model's input with N = min(32, model.max_batch)
 * before any batch was trained; it is filled with random bytes and labels, in
 * a host buffer taken once from backend->host_alloc (pinned on CUDA) and kept,
 * bounded by ring.slot_bytes.
 *
 * The verdict: the relative drop of the rate between consecutive stages,
 *   augmentation = 1 - r2/r1,  h2d = 1 - r3/r2,  ingest = 1 - r4/r3,
 * names the stage with the largest drop, or "compute-bound" when no drop
 * exceeds SF_DIAG_DROP_THRESHOLD (then the pipeline keeps the model busy and
 * only a faster step trains faster).
 *
 * Threads: sf_diagnose_start/_result/_last are called by HTTP threads; the run
 * itself is on the engine thread. One run at a time (the module keeps the run
 * in flight and the last finished one, behind a lock).
 */
#ifndef SF_DIAGNOSE_H
#define SF_DIAGNOSE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

struct sf_app;

/* A drop of the step rate between two consecutive stages larger than this
 * share names that stage; below it everywhere the pipeline is compute-bound.
 * 15 %: larger than the run-to-run noise of a seconds-long measurement
 * (a few % on a GPU, up to ~10 % on a shared CPU), small enough that a
 * stage costing a sixth of the throughput is reported. */
#define SF_DIAG_DROP_THRESHOLD 0.15
#define SF_DIAG_MIN_STEPS 5
#define SF_DIAG_MAX_STEPS 100000
#define SF_DIAG_DEFAULT_N 32

typedef enum sf_diag_stage_id {
    SF_DIAG_DEVICE_AUGMENTED = 0,
    SF_DIAG_DEVICE_RAW,
    SF_DIAG_HOST_PINNED,
    SF_DIAG_LIVE,
    SF_DIAG_STAGES
} sf_diag_stage_id;

typedef enum sf_diag_verdict {
    SF_DIAG_V_COMPUTE = 0, /* "compute-bound" */
    SF_DIAG_V_AUGMENTATION,
    SF_DIAG_V_H2D,
    SF_DIAG_V_INGEST,
} sf_diag_verdict;

typedef struct sf_diag_stage {
    int steps;             /* timed steps, all rounds (live: steps completed in the window) */
    double seconds;        /* their wall time (live: the window) */
    double steps_per_s, samples_per_s; /* the best round's (live: steps / window) */
    double ratio;          /* steps_per_s / stage 1's */
} sf_diag_stage;

typedef struct sf_diag_result {
    uint64_t id;           /* the engine command's id */
    int status;            /* 0 ok; else err says why */
    char err[256];
    double seconds;        /* requested */
    /* The batch measured. */
    int n, h, w, c, nhwc, label_dtype;
    int from_traffic;      /* 1: the shape of the last trained batch; 0: the model's input */
    sf_diag_stage stage[SF_DIAG_STAGES];
    double drop[3];        /* augmentation, h2d, ingest: 1 - r(k+1)/r(k), >= 0 */
    sf_diag_verdict verdict;
    char suggestion[400];
    double elapsed_s;      /* wall time of the run on the engine thread */
    uint64_t t_done_ns;    /* host monotonic */
    char backend[16];
} sf_diag_result;

typedef enum sf_diag_start_err {
    SF_DIAG_OK = 0,
    SF_DIAG_E_RUNNING,     /* 409 diagnose_running */
    SF_DIAG_E_NO_BACKEND,  /* 409 no_backend (sink mode) */
    SF_DIAG_E_UNSUPPORTED, /* 501 diagnose_unsupported (backend without bench) */
    SF_DIAG_E_ENGINE,      /* 503 engine_busy (stopping, or its command queue is full) */
    SF_DIAG_E_NOMEM,       /* 503 out_of_memory */
    SF_DIAG_E_JOINING,     /* 503 distributed_unavailable (a data-parallel rank still joining) */
} sf_diag_start_err;

/* Queues a run of `seconds` (already validated against config). On success
 * *id names it for sf_diagnose_result and SF_WAIT_CMD wakes. */
sf_diag_start_err sf_diagnose_start(struct sf_app *app, double seconds, uint64_t *id, char *err,
                                    size_t errlen);
/* Stops run `id` when it is queued or running, because nobody waits for
 * its result any more (its client went away): the engine ends it before
 * its next timed stretch of steps (about a fifteenth of its seconds),
 * training resumes, and its result fails with "cancelled". A run that
 * finished, or another one, is left alone. */
void sf_diagnose_cancel(uint64_t id);
/* 1 when run `id` has finished (*out filled, status says how), 0 while it is
 * queued or running, -1 when id is neither the latest run nor one of the
 * last runs it replaced. */
int sf_diagnose_result(uint64_t id, sf_diag_result *out);
/* The last finished successful run: 0 and *out, or -1 when none. *running
 * (optional) tells whether a run is queued or running now. */
int sf_diagnose_last(sf_diag_result *out, int *running);

/* The verdict from the four rates (pure; drop[3] receives the drops). */
sf_diag_verdict sf_diag_decide(const double rate[SF_DIAG_STAGES], double drop[3]);
/* "compute-bound", "augmentation", "h2d", "ingest" (the API's codes). */
const char *sf_diag_verdict_code(sf_diag_verdict v);
/* "compute-bound", "augmentation", "host-to-device copy", "ingest: loaders or network". */
const char *sf_diag_verdict_label(sf_diag_verdict v);
const char *sf_diag_stage_key(sf_diag_stage_id s);

/* The reply of POST /v1/diagnose. */
cJSON *sf_diag_result_to_json(const sf_diag_result *r);

/* Releases the kept host buffer and the last command. Call after the engine
 * stopped and before the backend is destroyed. */
void sf_diagnose_shutdown(struct sf_app *app);

#endif
