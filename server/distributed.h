/* server/distributed.h — this process as one rank of a data-parallel job
 * (distributed.world_size > 1): the rendezvous store, the join, the state
 * readiness reports, and the hot-config patches the ranks apply together.
 *
 * The engine's rounds (server/engine_rounds.c) drive it: every optimizer step is a
 * round all ranks enter together, agreeing first, in one small all-reduce,
 * on who has a batch and of how many samples, whether to stop, and which
 * PATCH /v1/config bodies to apply (docs/DESIGN.md, "Data-parallel
 * training"). Nothing here runs with world_size 1: app->dist is NULL.
 *
 * Threads: new/free on the main thread; join and the round helpers on the
 * engine thread; the state, the patch queue and the store's table from any
 * thread (HTTP handlers).
 */
#ifndef SF_SERVER_DISTRIBUTED_H
#define SF_SERVER_DISTRIBUTED_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "collective/collective.h"
#include "collective/kv_table.h"
#include "server/config.h"
#include "server/metrics.h"

typedef enum sf_dist_state {
    SF_DIST_JOINING = 0, /* waiting for every rank (distributed.join_timeout_s) */
    SF_DIST_JOINED,      /* training in rounds */
    SF_DIST_BROKEN,      /* a peer died, timed out or left, or the join failed: no more training */
    SF_DIST_DIVERGED,    /* the parameter digests differ: training goes on, /readyz is false */
} sf_dist_state;

/* Pending PATCH /v1/config bodies of this rank, applied on every rank at one
 * round. Bounded: a full queue refuses the PATCH (503). */
#define SF_DIST_MAX_PATCHES 8

typedef struct sf_distributed sf_distributed;

/* NULL (nothing to do) for world_size 1; else the job's state, the store
 * (rank 0: its table; others: an HTTP client of distributed.rendezvous) and
 * the metrics. NULL with err on failure. */
sf_distributed *sf_distributed_new(const sf_config *c, char *err, size_t errlen);
void sf_distributed_free(sf_distributed *d);

/* What the backend is built with (sf_train_cfg.dist). */
const sf_dist *sf_distributed_backend(sf_distributed *d);
/* Rank 0's table for /v1/distributed/kv (NULL on other ranks). */
sf_kv_table *sf_distributed_table(sf_distributed *d);
int sf_distributed_rank(const sf_distributed *d);
int sf_distributed_world(const sf_distributed *d);

/* Engine thread: joins the job (bounded by distributed.join_timeout_s) and
 * sets the collective's bound to distributed.timeout_s. 0, or -1 (BROKEN,
 * reason naming the rendezvous address). */
int sf_distributed_join(sf_distributed *d);
sf_coll *sf_distributed_coll(sf_distributed *d);
/* Any thread: a join in progress gives up (the service is stopping). */
void sf_distributed_cancel(sf_distributed *d);
/* The same, only while the job is still joining: a shutdown began, and the
 * batches accepted meanwhile could not train before every rank joined; they
 * fail now instead of holding the drain for the whole grace period. */
void sf_distributed_cancel_join(sf_distributed *d);

/* The state and, unless JOINED, why (for /readyz and the logs). */
sf_dist_state sf_distributed_state(sf_distributed *d, char *reason, size_t len);
/* The engine, once the ranks agreed on the job and hold rank 0's initial
 * state: only then is the rank ready (a rank that reported ready at its
 * join showed its own state until the broadcast). */
void sf_distributed_started(sf_distributed *d);
/* Joined, agreed and holding rank 0's state, and not broken since. */
int sf_distributed_ready(sf_distributed *d);
/* Marks the job BROKEN (first reason wins) and logs it loudly. */
void sf_distributed_fail(sf_distributed *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same for an orderly end (a rank shut down): logged as a warning. */
void sf_distributed_ended(sf_distributed *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sf_distributed_diverged(sf_distributed *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- hot-config patches ------------------------------------------------- */
/* Queues a validated merge-patch body; *id names it for the result. -1 when
 * the queue is full or the job cannot train (the reply says which). */
int sf_distributed_patch_post(sf_distributed *d, const char *body, size_t len, uint64_t *id, char *err,
                              size_t errlen);
/* 1 done (*status 0 applied, else err/field say why; *reply a JSON object
 * {"applied","pending_restart"} the caller frees), 0 not yet, -1 unknown id
 * or the job broke before it was applied (err says so). */
int sf_distributed_patch_result(sf_distributed *d, uint64_t id, int *status, char *err, size_t errlen,
                                char *field, size_t fieldlen, cJSON **reply);
/* Engine thread, in a round: the length of this rank's oldest queued patch
 * (0 none). */
int64_t sf_distributed_patch_len(sf_distributed *d);
/* Engine thread, in a round: lens[r] is rank r's patch length (from the
 * control all-reduce). Broadcasts each and applies them in rank order on
 * this rank; every rank does the same, so all change at this step boundary.
 * 0, or -1 when a collective failed. */
int sf_distributed_apply_patches(sf_distributed *d, const int64_t *lens, char *err, size_t errlen);

/* ---- metrics ------------------------------------------------------------- */
void sf_distributed_count_empty(sf_distributed *d);
void sf_distributed_observe_allreduce(sf_distributed *d, double seconds);
/* The gradient all-reduces so far: their count and total seconds (diagnose). */
void sf_distributed_allreduce_totals(sf_distributed *d, uint64_t *rounds, double *seconds);
/* Stats: rank, world_size, state, reason, empty contributions, all-reduce time. */
void sf_distributed_to_json(sf_distributed *d, cJSON *obj);

#endif
