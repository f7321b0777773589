/* server/engine.h — the engine thread: READY slots in, trained batches out.
 *
 * One engine per backend (per GPU). It pops READY slots in FIFO order, draws
 * each batch's augmentation parameters on the host (gpu/aug.h), submits the
 * batch to the backend, and harvests completions by polling, so that up to
 * backend->max_inflight batches overlap (transform of N+1 during the step of
 * N). It is the only thread that calls the backend after start-up. Results go
 * to the job table and the metrics; requests waiting on a job are woken.
 *
 * Ingestion never waits on the engine: HTTP threads only touch the ring.
 */
#ifndef SF_ENGINE_H
#define SF_ENGINE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/aug.h"
#include "gpu/backend.h"
#include "gpu/model.h"
#include "server/app_metrics.h"
#include "server/config.h"

struct sf_app;
struct sf_ring;
struct sf_jobs;
struct sf_evals;
struct sf_distributed;
struct sf_http;
typedef struct sf_engine sf_engine;

/* What the engine needs of the process: pointers into the app, which
 * outlives the engine. The app pointer itself is only handed to commands
 * and the after-step hook. */
typedef struct sf_engine_ctx {
    struct sf_app *app;
    const sf_config *cfg;            /* as started */
    const sf_model *model;
    const sf_aug_pipeline *aug, *aug_eval; /* training and eval batches */
    sf_backend *backend;
    struct sf_ring *ring;
    struct sf_jobs *jobs;
    struct sf_evals *evals;
    struct sf_distributed *dist;     /* NULL outside a data-parallel job */
    struct sf_http *const *http;     /* the daemon, once started: requests to wake */
    const sf_app_metrics *m;
    _Atomic uint64_t *step;          /* optimizer steps, as the backend counts them */
    _Atomic uint64_t *restore_gen;   /* bumped by restores that set step */
    atomic_int *nonfinite_in_row, *diverged; /* the non-finite streak and its verdict */
    atomic_int *draining;            /* SIGTERM received */
    atomic_int *backend_ok;          /* the last health check passed */
} sf_engine_ctx;

/* Work that must run on the engine thread between steps, with nothing in
 * flight (the backend is single-threaded by contract, and a checkpoint must
 * see the parameters after a completed step, never a torn state): state
 * snapshots and restores, diagnose runs. Training pauses while it runs;
 * batches arriving meanwhile wait in the ring.
 *
 * A command is shared by its poster (an HTTP request, which may go away) and
 * the engine: each holds a reference and sf_engine_cmd_release frees it with
 * its argument when the last one lets go. When fn has run, the engine sets
 * done and wakes requests waiting on (SF_WAIT_CMD, id). */
typedef struct sf_engine_cmd {
    int (*fn)(struct sf_app *app, void *arg, char *err, size_t errlen);
    void *arg;
    void (*free_arg)(void *arg);
    uint64_t id;
    atomic_int done;
    int status;
    char err[256];
    atomic_int refs;
    struct sf_engine_cmd *next;
} sf_engine_cmd;

sf_engine_cmd *sf_engine_cmd_new(int (*fn)(struct sf_app *, void *, char *, size_t), void *arg,
                                 void (*free_arg)(void *));
/* Queues the command (the engine takes its own reference). Returns -1 when
 * the engine is stopping or SF_ENGINE_MAX_CMDS are already queued. */
int sf_engine_post(sf_engine *e, sf_engine_cmd *c);
void sf_engine_cmd_release(sf_engine_cmd *c);
#define SF_ENGINE_MAX_CMDS 16

/* Called on the engine thread after every trained step (e.g. periodic checkpoints). */
void sf_engine_set_after_step(sf_engine *e, void (*fn)(struct sf_app *app, uint64_t step));

/* One step's timeline, host monotonic nanoseconds (0 = unknown). */
typedef struct sf_step_record {
    uint64_t id, step;
    int n, status;
    float loss;
    uint64_t t_recv_start, t_ready, t_popped;       /* HTTP body, ring wait */
    uint64_t t_h2d_start, t_transform_start, t_step_start, t_step_end;
    double h2d_s, transform_s, step_s;
    int h, w, c, nhwc;      /* the batch's image shape and layout (diagnose reuses it) */
    int label_dtype;        /* sf_label_dtype, -1 when the batch had no labels */
} sf_step_record;
#define SF_ENGINE_TRACE_STEPS 1024

/* Copies the last (at most max) step records, oldest first; returns the count. */
int sf_engine_trace(sf_engine *e, sf_step_record *out, int max);

/* Starts the engine thread; ctx is copied. */
sf_engine *sf_engine_start(const sf_engine_ctx *ctx, char *err, size_t errlen);
int sf_engine_running(sf_engine *e);
/* Stops the thread after the batches already submitted finish; READY slots
 * not yet taken are failed with "shutdown". */
void sf_engine_stop(sf_engine *e);
/* The same, waiting for the thread no later than deadline_ns (sf_now_ns
 * clock). Returns 0 when stopped (e is freed), or -1 when the thread is still
 * in a step or a command at the deadline: then nothing is freed, the thread
 * still owns the backend, and the caller must exit without touching either. */
int sf_engine_stop_by(sf_engine *e, uint64_t deadline_ns);

#endif
