/* server/evals.h — named evaluations: the sample-weighted aggregates of the
 * eval batches (POST /v1/batches?mode=eval&eval=<name>) of each name.
 *
 * At most max_names names (eval.max_names) exist, so the eval metrics' label
 * cardinality is bounded. A name is reserved when its first batch is
 * accepted; its aggregates grow as its batches finish, in arrival order. A
 * name lasts until it is deleted (DELETE /v1/evals/{name}), or until a new
 * name needs its place while it has been idle (no batch pending, none
 * accepted or ended and no read, for eval.name_idle_s): the least recently
 * used idle one is evicted then, so that names a client made and left (16
 * bogus ones, say) cannot lock every new name out. When no name is idle
 * that long, the new one is refused (409 too_many_evals) rather than
 * evicting an evaluation someone is still using.
 *
 * Each accepted batch is pending until it ends, exactly once, by
 * sf_evals_add or sf_evals_add_failed: a 202 is a promise that the batch
 * counts towards its evaluation, so a name with batches pending cannot be
 * deleted (409 eval_busy). Thread-safe: HTTP threads reserve, read and
 * delete, the engine adds.
 */
#ifndef SF_EVALS_H
#define SF_EVALS_H

#include <stdint.h>

#include <cjson/cJSON.h>

#define SF_EVAL_NAME_MAX 64 /* characters of a name; [A-Za-z0-9_.-] */
#define SF_EVAL_DEFAULT_NAME "default"

typedef struct sf_eval_agg {
    char name[SF_EVAL_NAME_MAX + 1];
    uint64_t batches;       /* finished batches */
    uint64_t samples;       /* samples (pixels for a segmentation model) scored */
    double loss_sum;        /* sum over batches of the batch's mean loss times its samples */
    uint64_t correct1, correct5;
    uint64_t first_step, last_step; /* optimizer step count when its first and last batch ran */
    uint64_t failed;        /* batches that failed (bad label, decode error) */
    uint64_t pending;       /* batches accepted and not yet ended (add or add_failed) */
    uint64_t used_ns;       /* last batch accepted or ended, or read (sf_evals_get): host monotonic */
} sf_eval_agg;

typedef struct sf_evals sf_evals;

/* What becomes of an evaluation's metrics. Both run under the evaluations'
 * lock, so that a batch's metrics cannot be published after its evaluation
 * was deleted (they would come back with the old values), nor a deletion
 * forget the metrics of the next evaluation of that name. They must not
 * call back into sf_evals. */
typedef struct sf_evals_hooks {
    /* After each finished batch: the aggregates with it, and its samples
     * (decoded images; not pixels). */
    void (*publish)(void *ctx, const sf_eval_agg *after, uint64_t batch_samples);
    /* As the evaluation is deleted or evicted. */
    void (*forget)(void *ctx, const char *name);
    /* As an idle evaluation is evicted for a new name (after forget). */
    void (*evicted)(void *ctx, const char *name);
    void *ctx;
} sf_evals_hooks;

/* An idle bound that evicts nothing (eval.name_idle_s is a number of
 * seconds; the unit tests that test the refusal pass this). */
#define SF_EVALS_NEVER_EVICT UINT64_MAX

/* eval.name_idle_s as the bound sf_evals_has_room and sf_evals_reserve take. */
static inline uint64_t sf_evals_idle_ns(int name_idle_s) { return (uint64_t)name_idle_s * 1000000000ull; }

sf_evals *sf_evals_new(int max_names);
/* Set once, before any batch is accepted. */
void sf_evals_set_hooks(sf_evals *e, const sf_evals_hooks *hooks);
void sf_evals_destroy(sf_evals *e);
/* 1 when name has the syntax of an evaluation name. */
int sf_eval_name_valid(const char *name);
/* 1 when name is known, one more name fits, or an evaluation has been idle
 * for idle_ns (eval.name_idle_s) and could be evicted for it: a request's
 * early test, which reserves and evicts nothing (its batch may still be
 * refused). */
int sf_evals_has_room(sf_evals *e, const char *name, uint64_t idle_ns);
/* Makes name known (when it is not) and counts one more of its batches
 * pending, when its batch is accepted: the last check before the batch goes
 * to the ring, whose every path ends it with sf_evals_add or
 * sf_evals_add_failed. A new name when max_names are taken evicts the least
 * recently used evaluation idle for idle_ns (the forget and evicted hooks
 * run). 0, or -1 (nothing changed) when no place could be had. */
int sf_evals_reserve(sf_evals *e, const char *name, uint64_t idle_ns);
/* The message of a batch refused because max_names evaluations exist and
 * none is idle (409 too_many_evals, by the early test and at reservation
 * alike). */
void sf_evals_full_message(const sf_evals *e, char *buf, size_t cap);
/* Adds one finished batch of batch_samples images, samples scored (pixels
 * for a segmentation model), its mean loss and hits; publishes the metrics;
 * the batch is no longer pending. */
void sf_evals_add(sf_evals *e, const char *name, uint64_t batch_samples, uint64_t samples, double mean_loss,
                  uint64_t correct1, uint64_t correct5, uint64_t step);
/* An accepted batch that ended without a result (refused by the backend,
 * failed, dropped at shutdown): counted as failed, no longer pending. */
void sf_evals_add_failed(sf_evals *e, const char *name);
/* Copies one; -1 when unknown. A read is a use: it keeps the evaluation
 * from being evicted for eval.name_idle_s more. */
int sf_evals_get(sf_evals *e, const char *name, sf_eval_agg *out);
typedef enum sf_eval_delete_rc {
    SF_EVAL_DELETED = 0,  /* *out holds its final aggregates; the metrics are forgotten */
    SF_EVAL_UNKNOWN = -1, /* no such name */
    SF_EVAL_BUSY = 1,     /* out->pending of its batches have not ended: nothing changed */
} sf_eval_delete_rc;
/* Forgets an evaluation: its aggregates, its place among max_names and
 * (the forget hook) its metrics. A name with batches pending is kept. out
 * (may be NULL) receives the aggregates as they are, deleted or kept. */
sf_eval_delete_rc sf_evals_delete(sf_evals *e, const char *name, sf_eval_agg *out);
/* The JSON of GET /v1/evals/{name}. */
cJSON *sf_eval_to_json(const sf_eval_agg *a);
/* {"evals":[...], "max_names": n} in reservation order. */
cJSON *sf_evals_list_json(sf_evals *e);

#endif
