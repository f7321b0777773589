/* server/upload.h — a batch body streamed from the socket into a ring slot.
 *
 * Shared by POST /v1/batches (train) and POST /v1/transform (augment only).
 * The body goes through the incremental safetensors parser; once its header is
 * valid a ring slot is acquired (or the request is suspended until one frees,
 * or refused with 429/503 per ring.full_policy) and every data byte is copied
 * once, straight into the slot. When the body has ended the slot is committed
 * (READY) with a new job id. A failure or a client that goes away releases the
 * slot; nothing half-written ever becomes READY.
 *
 * Every rejection replies with its own error code and is counted in
 * streamfeed_batches_rejected_total{reason=code}.
 *
 * A slot is held only by an upload that moves: once it has a slot, an upload
 * must keep an average of http.upload_min_bytes_per_s (after a 5 s allowance)
 * and end within http.upload_deadline_s. sf_upload_sweep, run every second,
 * frees the slot of one that does not and closes its connection (no reply can
 * be sent mid-body; the code, upload_too_slow or upload_deadline_exceeded, is
 * in the request's log line and in streamfeed_uploads_evicted_total{reason}).
 *
 * Shutdown: sf_upload_close makes every later commit answer 503 and waits for
 * the commits in progress, so that no batch gets a 202 after the engine
 * stopped taking batches (docs/OPERATIONS.md).
 */
#ifndef SF_UPLOAD_H
#define SF_UPLOAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "gpu/aug.h"
#include "gpu/backend.h"
#include "gpu/model.h"
#include "server/app_metrics.h"
#include "server/config.h"
#include "server/http.h"
#include "server/safetensors.h"

struct sf_ring;
struct sf_jobs;
struct sf_evals;
struct sf_distributed;

/* What every upload of the process shares: the uploads that hold a ring slot
 * (the sweep walks them) and the count of commits in progress (sf_upload_close
 * waits for it). Lock order: an upload's mu, then holders_mu; the sweep, which
 * takes them the other way round, only tries an upload's mu (an upload busy
 * on its thread is moving anyway). The app owns one; sf_uploads_init makes
 * it empty. */
typedef struct sf_uploads {
    pthread_mutex_t holders_mu;
    struct sf_upload *holders; /* a list through sf_upload.hprev/hnext */
    atomic_int committing;
} sf_uploads;

void sf_uploads_init(sf_uploads *s);

/* What uploads need of the process: pointers into the app, set before the
 * HTTP daemon starts. */
typedef struct sf_upload_ctx {
    const sf_config *cfg;            /* as started */
    const sf_model *model;
    const sf_aug_pipeline *aug, *aug_eval; /* training and eval batches */
    sf_backend *backend;             /* NULL in sink mode */
    struct sf_ring *ring;
    struct sf_jobs *jobs;
    struct sf_evals *evals;
    struct sf_distributed *dist;     /* NULL outside a data-parallel job */
    struct sf_http *const *http;     /* the daemon: requests to wake */
    const sf_app_metrics *m;
    atomic_int *draining;            /* SIGTERM received: waits for a slot end */
    atomic_int *closing;             /* the drain ended: commits are refused */
    sf_uploads *shared;              /* the slot holders and commits in progress */
} sf_upload_ctx;

/* The upload context of the process app is. Requests, stream callbacks and
 * the sweep carry the app pointer; the composition root (app.c) maps it to
 * the context, so that this module does not depend on the whole app. */
const sf_upload_ctx *sf_upload_ctx_of(struct sf_app *app);

typedef struct sf_xform_out sf_xform_out;

typedef struct sf_upload {
    sf_st_parser parser;
    int kind;              /* 0 train, 1 transform */
    int eval;              /* kind 0 with ?mode=eval: an eval batch (eval augmentation, no step) */
    int want_logits;       /* ?return=logits: out holds the logits reply */
    char eval_name[65];    /* the evaluation (?eval=, SF_EVAL_NAME_MAX) */
    int slot;              /* -1 until acquired */
    int committed;
    uint64_t job_id;
    uint64_t t_wait_start_ns;
    sf_xform_out *out;     /* transform: the reply buffer (shared with the engine) */
    /* Slot holding, watched by sf_upload_sweep. mu is held by the request's
     * thread while it works on the upload, and tried by the sweep. */
    pthread_mutex_t mu;
    sf_req *req;
    uint64_t t_slot_ns;    /* when the slot was taken */
    uint64_t slot_bytes;   /* body bytes consumed since then */
    const char *evicted;   /* the eviction's code, or NULL */
    struct sf_upload *hprev, *hnext;
    int holding;           /* in the list of slot holders */
} sf_upload;

/* Stream callbacks (sf_stream_ops) for a route of the given kind. */
int sf_upload_on_data(sf_req *r, int kind, const uint8_t *data, size_t *len);
void sf_upload_on_done(sf_req *r, int ok);
/* Counts a refused upload in batches_rejected_total{reason} (and received{rejected}). */
void sf_upload_on_rejected(sf_req *r, const char *reason);
/* Called when the body has ended: validates the end of the body and commits
 * the slot. Returns 0 with the job id, or -1 after an error reply. */
int sf_upload_commit(sf_req *r, uint64_t *job_id);
/* The largest batch body: one ring slot of data (ring.slot_bytes) plus its
 * header (limits.max_tensor_header_bytes); SF_UPLOAD_MAX_BODY_OPTION names
 * them for a 413. */
uint64_t sf_upload_max_body(struct sf_app *app);
#define SF_UPLOAD_MAX_BODY_OPTION "ring.slot_bytes, a restart option, plus limits.max_tensor_header_bytes"
/* Evicts slot holders that are too slow or past their deadline (see above).
 * ctx is the sf_app; called by the HTTP timer thread (sf_http_set_tick). */
void sf_upload_sweep(void *ctx);
/* From now on commits are refused with 503 shutting_down; returns once no
 * commit is in progress. */
void sf_upload_close(struct sf_app *app);

/* Transform output: the safetensors reply ("images" F32 [N,C,H,W]), header
 * included. Valid once the job is done. */
int sf_upload_transform_reply(sf_req *r);

/* The reply buffer (transform output or logits), shared by the request, the
 * engine and server/kept_logits.c: each holder takes a reference and lets it
 * go; the last one frees it. */
void sf_xform_out_retain(sf_xform_out *o);
void sf_xform_out_release(sf_xform_out *o);
/* Stops counting o's bytes against the bound of replies not yet read (503
 * transform_busy / logits_busy): no client of this request will read it.
 * Its wait ran out, and what is kept for a later GET is bounded by
 * eval.logits_keep_* instead; or its client went away. The buffer itself
 * lives on while a reference holds it (the engine's is bounded by the ring).
 * Idempotent; the reference's holder may call it from any thread. */
void sf_xform_out_release_share(sf_xform_out *o);
/* Its size: the safetensors header and data. */
size_t sf_xform_out_size(const sf_xform_out *o);
/* Replies 200 with it as safetensors; the reply holds a reference until sent. */
int sf_xform_out_reply(sf_req *r, sf_xform_out *o);

#endif
