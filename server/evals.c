/* server/evals.c — see evals.h. */
#include "server/evals.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int sf_evals_has_room(sf_evals *e, const char *name)
{
    pthread_mutex_lock(&e->mu);
    const int ok = find(e, name) != NULL || e->n < e->max;
    pthread_mutex_unlock(&e->mu);
    return ok;
}

void sf_evals_full_message(const sf_evals *e, char *buf, size_t cap)
{
    snprintf(buf, cap, "eval.max_names (%d) evaluations exist; this one would be one more", e->max);
}

int sf_evals_reserve(sf_evals *e, const char *name)
{
    pthread_mutex_lock(&e->mu);
    int rc = 0;
    sf_eval_agg *known = find(e, name);
    if (known) {
        known->pending++;
    } else if (e->n >= e->max) {
        rc = -1;
    } else {
        sf_eval_agg *a = &e->a[e->n++];
        memset(a, 0, sizeof *a);
        snprintf(a->name, sizeof a->name, "%s", name);
        a->pending = 1;
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
        /* Under the lock: a batch of the same name accepted next makes a
         * new evaluation whose metrics this cannot reach. */
        if (e->hooks.forget)
            e->hooks.forget(e->hooks.ctx, a->name);
        /* The others keep their reservation order (GET /v1/evals). */
        const int i = (int)(a - e->a);
        memmove(&e->a[i], &e->a[i + 1], (size_t)(e->n - i - 1) * sizeof *e->a);
        e->n--;
        memset(&e->a[e->n], 0, sizeof *e->a);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int sf_evals_get(sf_evals *e, const char *name, sf_eval_agg *out)
{
    pthread_mutex_lock(&e->mu);
    sf_eval_agg *a = find(e, name);
    if (a)
        *out = *a;
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
