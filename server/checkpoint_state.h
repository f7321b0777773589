/* server/checkpoint_state.h — what checkpoint.c (requests, process life),
 * checkpoint_op.c (an operation's life), checkpoint_snapshot.c (the state
 * against the backend) and checkpoint_io.c (the I/O threads) share: the
 * module's state, its buffers and operations. Private to those four files. */
#ifndef SF_CHECKPOINT_STATE_H
#define SF_CHECKPOINT_STATE_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "server/app.h"
#include "server/checkpoint.h"
#include "server/checkpoint_format.h"
#include "server/metrics.h"

#define SF_CKPT_URL_MAX 2048
#define SF_CKPT_IO_QUEUE_MAX 8   /* transfers waiting for each I/O thread */

typedef struct blob blob;

/* One I/O thread and its queue. */
typedef struct sf_ckpt_queue {
    struct sf_ckpt *ck;
    pthread_t th;
    int started;
    sf_ckpt_op *head, *tail;
    int queued;
} sf_ckpt_queue;
enum { SF_CKPT_Q_FILES = 0, SF_CKPT_Q_URLS = 1, SF_CKPT_N_QUEUES };

struct sf_ckpt {
    sf_app *app;
    char dir[PATH_MAX];          /* realpath of checkpoint.dir; "" when unset */
    sf_ckpt_layout lay;          /* the model's tensors and the file layout, fixed at start */
    /* Metrics. */
    sf_metric *m_ok, *m_failed, *m_skipped, *m_seconds, *m_last_step, *m_load_ok, *m_load_failed;
    /* The I/O threads: files (periodic, final, path saves and loads) and URL
     * transfers each have their own, so a slow or hanging URL never holds a
     * save to disk. One lock and condition for both queues. */
    sf_ckpt_queue q[SF_CKPT_N_QUEUES];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    atomic_int abort_xfer;       /* cuts URL transfers short at shutdown */
    /* Periodic saves. */
    atomic_int periodic_busy;    /* a periodic snapshot or write is under way */
    blob *periodic;              /* its buffer, reused (engine thread, I/O thread in turn) */
    atomic_int warned_no_opt;
    /* What the newest ckpt-<step> file holds, for the final save. */
    atomic_uint_least64_t state_gen; /* bumped by every restore */
    atomic_uint_least64_t saved_gen, saved_step;
    atomic_int buffers;          /* large request buffers alive */
    atomic_int downloads;        /* of them, held by downloads (SF_CKPT_MAX_DOWNLOAD_BUFFERS) */
    atomic_uint_least64_t next_key;
    int curl_ready;
};

/* ---- file buffers (checkpoint_snapshot.c) ----------------------------------------- */

/* A checkpoint file in memory: this struct, padding to BLOB_PREFIX, then the
 * file bytes, in one allocation, so the file pointer alone (what an HTTP reply
 * hands back to its free function) finds its owner. */
#define BLOB_PREFIX 128
struct blob {
    sf_ckpt *ck;
    uint8_t *file;               /* 8-byte length, header padded to hdr, data */
    size_t len, hdr;
    float *params, *bufs, *mom, *sq; /* into file (sq: AdamW only) */
    uint8_t *nbt_at;             /* the n_bn I64 num_batches_tracked, into file */
    uint8_t *step_at;            /* the I64 of optim.step, into file */
    uint64_t step, gen;
    int with_opt;
    int pinned;                  /* allocated by backend->host_alloc */
    int reserved;                /* holds one of SF_CKPT_MAX_BUFFERS: BLOB_RESERVED or BLOB_DOWNLOAD */
};
enum { BLOB_UNRESERVED = 0, BLOB_RESERVED = 1, BLOB_DOWNLOAD = 2 };
_Static_assert(sizeof(blob) <= BLOB_PREFIX, "blob header outgrew its prefix");

/* A file buffer of with_opt's layout; pinned: backend->host_alloc; reserved:
 * holds one of SF_CKPT_MAX_BUFFERS (given back when freed), BLOB_DOWNLOAD one
 * of the downloads' share too. */
blob *sf_ckpt_blob_new(sf_ckpt *ck, int with_opt, int pinned, int reserved);
void sf_ckpt_blob_free(blob *b);
/* The free function of a file handed to an HTTP reply. */
void sf_ckpt_blob_free_file(void *file);
/* The backend can hand over the whole optimizer state (AdamW: both moments). */
int sf_ckpt_can_read_opt(const sf_ckpt *ck);
/* Engine thread (or main's before/after it): the state into b, a decoded file
 * into the backend. 0, or -1 with err. */
int sf_ckpt_snapshot(sf_ckpt *ck, blob *b, char *err, size_t errlen);
int sf_ckpt_apply(sf_ckpt *ck, const sf_ckpt_decoded *d, char *err, size_t errlen);

/* ---- operations (checkpoint_op.c) ------------------------------------------------------ */

enum { OP_GET = 1, OP_PUT, OP_SAVE, OP_LOAD, OP_PERIODIC, OP_FINAL };

struct sf_ckpt_op {
    atomic_int refs;
    sf_ckpt *ck;
    int kind;
    uint64_t key;
    int stage;                 /* request side: 0, then 1 for a load's restore */
    atomic_int stage_done;     /* the current stage finished (worker side) */
    int failed;
    sf_ckpt_error err;
    blob *b;                   /* snapshot: GET, SAVE, PERIODIC */
    sf_ckpt_decoded d;         /* restore: PUT, LOAD */
    int reserved;              /* holds a buffer reservation (LOAD) */
    char where[SF_CKPT_URL_MAX]; /* resolved path or URL; "" = default name in checkpoint.dir */
    int url;
    uint64_t t0;
    sf_ckpt_result res;
    sf_ckpt_op *next;          /* I/O queue */
};

sf_ckpt_op *sf_ckpt_op_new(sf_ckpt *ck, int kind);
void sf_ckpt_op_ref(sf_ckpt_op *op);
/* Ends the current stage and wakes the request waiting on it. */
void sf_ckpt_stage_finish(sf_ckpt_op *op);
void sf_ckpt_op_fail(sf_ckpt_op *op, int status, const char *code, const char *msg);

/* ---- the I/O threads (checkpoint_io.c) ---------------------------------------------- */

/* Starts the I/O threads; 0, or -1 with err. */
int sf_ckpt_io_start(sf_ckpt *ck, char *err, size_t errlen);
/* Stops them: a write in progress completes, a URL transfer is cut short,
 * queued operations fail with 503 shutting_down. */
void sf_ckpt_io_stop(sf_ckpt *ck);
/* Queues op for its I/O thread (URL or files; a reference is taken); -1 when
 * stopping or full. */
int sf_ckpt_io_enqueue(sf_ckpt *ck, sf_ckpt_op *op);
void sf_ckpt_count_save(sf_ckpt *ck, int ok, uint64_t t0, uint64_t step);
/* Writes op->b where op says; on an I/O thread, or main's at shutdown. */
int sf_ckpt_write_blob(sf_ckpt *ck, sf_ckpt_op *op);
/* Reads a file against the model and what this backend can restore. */
int sf_ckpt_decode_for(sf_ckpt *ck, const uint8_t *buf, size_t len, int mode, sf_ckpt_decoded *d,
                       sf_ckpt_error *e);
/* Reads a checkpoint from a path or an http(s) URL and decodes it (mode:
 * SF_CKPT_READ_*), bounded by checkpoint.max_bytes and, for strict reads, by
 * the largest file this model's state can be. from_operator 1: the
 * operator's model.init_from (symbolic links followed, URL rules not
 * applied); 0: names from requests and listings. */
int sf_ckpt_read_source(sf_ckpt *ck, const char *where, int from_operator, int mode, sf_ckpt_decoded *d,
                        sf_ckpt_error *e);
/* The newest ckpt-<step> of checkpoint.dir that reads as a checkpoint:
 * corrupt files and symbolic links are skipped with a warning, and with
 * skip_incompatible files of another model or optimizer too (loudly); any
 * other failure stops. ckpt-* links are never followed out of the directory. */
int sf_ckpt_read_newest(sf_ckpt *ck, int skip_incompatible, sf_ckpt_decoded *d, char *chosen, size_t cap,
                        sf_ckpt_error *e);

#endif
