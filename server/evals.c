/* server/evals.c — see evals.h. */
#include "server/evals.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/clock.h"

struct sf_evals {
    pthread_mutex_t mu;
    int max, n;
    sf_eval_agg *a; /* [max], the first n in use, in reservation order */
    sf_evals_hooks hooks;
};

sf_evals *sf_evals_new(int max_names)
{
    sf_evals *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->max = max_names > 0 ? max_names : 1;
    e->a = calloc((size_t)e->max, sizeof *e->a);
    if (!e->a) {
        free(e);
        return NULL;
    }
    pthread_mutex_init(&e->mu, NULL);
    return e;
}

void sf_evals_set_hooks(sf_evals *e, const sf_evals_hooks *hooks)
{
    pthread_mutex_lock(&e->mu);
    e->hooks = *hooks;
    pthread_mutex_unlock(&e->mu);
}

void sf_evals_destroy(sf_evals *e)
{
    if (!e)
        return;
    pthread_mutex_destroy(&e->mu);
    free(e->a);
    free(e);
}

int sf_eval_name_valid(const char *name)
{
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len > SF_EVAL_NAME_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
              ch == '-' || ch == '.'))
            return 0;
    }
    return 1;
}

static sf_eval_agg *find(sf_evals *e, const char *name)
{
    for (int i = 0; i < e->n; i++)
        if (strcmp(e->a[i].name, name) == 0)
            return &e->a[i];
    return NULL;
}

/* The least recently used evaluation with no batch pending and unused for
 * idle_ns, or NULL. */
static sf_eval_agg *evictable(sf_evals *e, uint64_t idle_ns, uint64_t now)
{
    sf_eval_agg *oldest = NULL;
    if (idle_ns == SF_EVALS_NEVER_EVICT)
        return NULL;
    for (int i = 0; i < e->n; i++) {
        sf_eval_agg *a = &e->a[i];
        if (a->pending == 0 && now - a->used_ns >= idle_ns && (!oldest || a->used_ns < oldest->used_ns))
            oldest = a;
    }
    return oldest;
}

/* Takes a out of the table, the others keeping their reservation order
 * (GET /v1/evals); its metrics go under the lock, so that a batch of the
 * same name accepted next makes a new evaluation they cannot reach. */
static void remove_locked(sf_evals *e, sf_eval_agg *a)
{
    if (e->hooks.forget)
        e->hooks.forget(e->hooks.ctx, a->name);
    const int i = (int)(a - e->a);
    memmove(&e->a[i], &e->a[i + 1], (size_t)(e->n - i - 1) * sizeof *e->a);
    e->n--;
    memset(&e->a[e->n], 0, sizeof *e->a);
}

int sf_evals_has_room(sf_evals *e, const char *name, uint64_t idle_ns)
{
    pthread_mutex_lock(&e->mu);
    const int ok = find(e, name) != NULL || e->n < e->max || evictable(e, idle_ns, sf_now_ns()) != NULL;
    pthread_mutex_unlock(&e->mu);
    return ok;
}

void sf_evals_full_message(const sf_evals *e, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "eval.max_names (%d) evaluations exist and none has been idle for eval.name_idle_s; "
             "DELETE /v1/evals/{name} frees one",
             e->max);
}

int sf_evals_reserve(sf_evals *e, const char *name, uint64_t idle_ns)
{
    pthread_mutex_lock(&e->mu);
    int rc = 0;
    const uint64_t now = sf_now_ns();
    sf_eval_agg *known = find(e, name), *idle = NULL;
    if (known) {
        known->pending++;
        known->used_ns = now;
    } else if (e->n >= e->max && !(idle = evictable(e, idle_ns, now))) {
        rc = -1;
    } else {
        if (idle) {
            char gone[SF_EVAL_NAME_MAX + 1];
            snprintf(gone, sizeof gone, "%s", idle->name);
            remove_locked(e, idle);
            if (e->hooks.evicted)
                e->hooks.evicted(e->hooks.ctx, gone);
        }
        sf_eval_agg *a = &e->a[e->n++];
        memset(a, 0, sizeof *a);
        snprintf(a->name, sizeof a->name, "%s", name);
        a->pending = 1;
        a->used_ns = now;
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* One batch of a ended. A batch ends once (sf_evals_reserve's contract); a
 * count already at zero stays there rather than wrap and keep the name
 * from being deleted for good. */
static void batch_ended(sf_eval_agg *a)
{
    if (a->pending > 0)
        a->pending--;
    a->used_ns = sf_now_ns();
}

void sf_evals_add(sf_evals *e, const char *name, uint64_t batch_samples, uint64_t samples, double mean_loss,
                  uint64_t correct1, uint64_t correct5, uint64_t step)
{
    pthread_mutex_lock(&e->mu);
    sf_eval_agg *a = find(e, name);
    if (a) {
        if (a->batches == 0)
            a->first_step = step;
        a->last_step = step;
        a->batches++;
        a->samples += samples;
        a->loss_sum += mean_loss * (double)samples;
        a->correct1 += correct1;
        a->correct5 += correct5;
        /* Published before the batch stops being pending: a DELETE that
         * sees no batch pending finds the metrics already final. */
        if (e->hooks.publish)
            e->hooks.publish(e->hooks.ctx, a, batch_samples);
        batch_ended(a);
    }
    pthread_mutex_unlock(&e->mu);
}

void sf_evals_add_failed(sf_evals *e, const char *name)
{
    pthread_mutex_lock(&e->mu);
    sf_eval_agg *a = find(e, name);
    if (a) {
        a->failed++;
        batch_ended(a);
    }
    pthread_mutex_unlock(&e->mu);
}

sf_eval_delete_rc sf_evals_delete(sf_evals *e, const char *name, sf_eval_agg *out)
{
    pthread_mutex_lock(&e->mu);
    sf_eval_agg *a = find(e, name);
    sf_eval_delete_rc rc = SF_EVAL_UNKNOWN;
    if (a && out)
        *out = *a;
    if (a && a->pending > 0) {
        rc = SF_EVAL_BUSY;
    } else if (a) {
        rc = SF_EVAL_DELETED;
        remove_locked(e, a);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int sf_evals_get(sf_evals *e, const char *name, sf_eval_agg *out)
{
    pthread_mutex_lock(&e->mu);
    sf_eval_agg *a = find(e, name);
    if (a) {
        a->used_ns = sf_now_ns();
        *out = *a;
    }
    pthread_mutex_unlock(&e->mu);
    return a ? 0 : -1;
}

cJSON *sf_eval_to_json(const sf_eval_agg *a)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", a->name);
    cJSON_AddNumberToObject(o, "batches", (double)a->batches);
    cJSON_AddNumberToObject(o, "samples", (double)a->samples);
    cJSON_AddNumberToObject(o, "failed_batches", (double)a->failed);
    /* what a DELETE waits for (409 eval_busy until it is 0) */
    cJSON_AddNumberToObject(o, "pending_batches", (double)a->pending);
    if (a->samples) {
        cJSON_AddNumberToObject(o, "loss", a->loss_sum / (double)a->samples);
        cJSON_AddNumberToObject(o, "top1", (double)a->correct1 / (double)a->samples);
        cJSON_AddNumberToObject(o, "top5", (double)a->correct5 / (double)a->samples);
        cJSON_AddNumberToObject(o, "first_step", (double)a->first_step);
        cJSON_AddNumberToObject(o, "last_step", (double)a->last_step);
    } else {
        cJSON_AddNullToObject(o, "loss");
        cJSON_AddNullToObject(o, "top1");
        cJSON_AddNullToObject(o, "top5");
        cJSON_AddNullToObject(o, "first_step");
        cJSON_AddNullToObject(o, "last_step");
    }
    return o;
}

cJSON *sf_evals_list_json(sf_evals *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "evals");
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n; i++)
        cJSON_AddItemToArray(arr, sf_eval_to_json(&e->a[i]));
    cJSON_AddNumberToObject(o, "max_names", e->max);
    pthread_mutex_unlock(&e->mu);
    return o;
}
