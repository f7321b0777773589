/* collective/collective.h — collectives over host buffers between the ranks of one
 * data-parallel job (a C API over Gloo, collective/collective_gloo.cc).
 *
 * Neither gpu/ nor server/: the reference backend all-reduces its gradients
 * with it, the engine agrees on each round with it, and neither sees Gloo.
 *
 * Ranks find each other through a key-value store (sf_kv_store): rank 0
 * serves it over the service's own HTTP (collective/kv_table.c behind
 * handlers/distributed.c), the others reach it with libcurl
 * (collective/kv_client.c). Gloo publishes each rank's listening address in it and
 * connects a full mesh of TCP pairs.
 *
 * Every call is bounded by the timeout given to sf_coll_new and returns -1
 * with a reason when a peer dies, closes its connection or does not answer in
 * time: never a hang. After an error the communicator is unusable (Gloo's
 * pairs are closed); the caller reports the job as broken.
 *
 * Threads: one communicator is used by one thread at a time (the engine).
 */
#ifndef SF_DIST_COLLECTIVE_H
#define SF_DIST_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The rendezvous store. set publishes a value under key: 0; 1 when the
 * store did not answer at all (rank 0 not listening yet: the caller may try
 * again); -1 when it refused, with a reason the implementation keeps. get
 * waits up to timeout_ms for the key to exist and copies at most cap bytes of
 * its value into buf, its full length into *len (0 found, 1 timed out, -1
 * error). */
typedef struct sf_kv_store {
    void *ctx;
    int (*set)(void *ctx, const char *key, const void *val, size_t len);
    int (*get)(void *ctx, const char *key, void *buf, size_t cap, size_t *len, int timeout_ms);
} sf_kv_store;

typedef struct sf_coll sf_coll;

/* What the store must hold for a job of world ranks: how many keys every
 * rank publishes together, and the largest value (a rank's addresses of its
 * pairs with every other rank). */
void sf_coll_store_needs(int world, int *keys, size_t *value_bytes);

typedef enum sf_coll_dtype { SF_COLL_F32 = 0, SF_COLL_F64, SF_COLL_I64 } sf_coll_dtype;
typedef enum sf_coll_op { SF_COLL_SUM = 0, SF_COLL_MIN, SF_COLL_MAX } sf_coll_op;

/* Joins the job as rank of world: publishes this rank's address (a TCP
 * listener on host, "" for the machine's name) in store and connects to every
 * other rank, waiting at most timeout_ms for them. NULL with a reason in err. */
sf_coll *sf_coll_new(int rank, int world, const char *host, const sf_kv_store *store, int timeout_ms,
                     char *err, size_t errlen);
/* Replaces the bound of every later call (the join may need longer than a step). */
void sf_coll_set_timeout(sf_coll *c, int timeout_ms);
/* In place: buf holds count elements on every rank and, after, their reduction. */
int sf_coll_allreduce(sf_coll *c, void *buf, size_t count, sf_coll_dtype t, sf_coll_op op, char *err,
                      size_t errlen);
/* In place: bytes of root's buf are copied into every rank's buf. */
int sf_coll_broadcast(sf_coll *c, void *buf, size_t bytes, int root, char *err, size_t errlen);
void sf_coll_free(sf_coll *c);

/* What a backend is told about the job (sf_train_cfg.dist): NULL or world 1
 * is a single process. coll is set once every rank joined, before the first
 * step; the backend all-reduces its gradients with it (the reference
 * backend) or builds its device communicator from store (NCCL). */
typedef struct sf_dist {
    int rank, world;
    const sf_kv_store *store;
    sf_coll *coll;
    int timeout_ms;          /* bound of one collective call */
    size_t bucket_bytes;     /* CUDA: all-reduce bucket (distributed.bucket_mb) */
    int bn_broadcast;        /* 1: rank 0's batchnorm running statistics go to every rank after each
                                round (distributed.batchnorm broadcast) */
    int bn_sync;             /* 1: training batchnorm normalises with the statistics of every rank's
                                samples, and its backward's per-channel sums are all-reduced
                                (distributed.batchnorm sync, torch.nn.SyncBatchNorm) */
    double allreduce_s;      /* seconds the backend spent in its last gradient all-reduce */
} sf_dist;

#ifdef __cplusplus
}
#endif
#endif
