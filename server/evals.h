/* server/evals.h — named evaluations: the sample-weighted aggregates of the
 * eval batches (POST /v1/batches?mode=eval&eval=<name>) of each name.
 *
 * At most max_names names (eval.max_names) exist; a request naming one more
 * is refused (409 too_many_evals) rather than evicting an evaluation someone
 * is still reading, so the eval metrics' label cardinality is bounded. A name
 * is reserved when its first batch is accepted; its aggregates grow as its
 * batches finish, in arrival order. Thread-safe: HTTP threads reserve and
 * read, the engine adds.
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
} sf_eval_agg;

typedef struct sf_evals sf_evals;

sf_evals *sf_evals_new(int max_names);
void sf_evals_destroy(sf_evals *e);
/* 1 when name has the syntax of an evaluation name. */
int sf_eval_name_valid(const char *name);
/* 1 when name is known or one more name fits: a request's early test, which
 * reserves nothing (its batch may still be refused). */
int sf_evals_has_room(sf_evals *e, const char *name);
/* Makes name known (no-op when it is), when its batch is accepted. 0, or -1
 * when max_names are taken. */
int sf_evals_reserve(sf_evals *e, const char *name);
/* The message of a batch refused because max_names evaluations exist (409
 * too_many_evals, by the early test and at reservation alike). */
void sf_evals_full_message(const sf_evals *e, char *buf, size_t cap);
/* Adds one finished batch of samples scored (its mean loss and hits). */
void sf_evals_add(sf_evals *e, const char *name, uint64_t samples, double mean_loss, uint64_t correct1,
                  uint64_t correct5, uint64_t step, sf_eval_agg *after);
void sf_evals_add_failed(sf_evals *e, const char *name);
/* Copies one; -1 when unknown. */
int sf_evals_get(sf_evals *e, const char *name, sf_eval_agg *out);
/* The JSON of GET /v1/evals/{name}. */
cJSON *sf_eval_to_json(const sf_eval_agg *a);
/* {"evals":[...], "max_names": n} in reservation order. */
cJSON *sf_evals_list_json(sf_evals *e);

#endif
