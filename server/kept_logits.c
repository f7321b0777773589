/* server/kept_logits.c — see kept_logits.h. */
#include "server/kept_logits.h"

#include <pthread.h>
#include <stdlib.h>

#include "server/config.h"
#include "server/jobs.h"
#include "server/upload.h"

typedef struct entry {
    uint64_t id;
    uint64_t t_kept_ns;
    sf_xform_out *o;
    size_t bytes;
    struct entry *next; /* the next younger entry */
} entry;

struct sf_kept_logits {
    pthread_mutex_t mu;
    struct sf_jobs *jobs;
    sf_family *evicted;
    entry *oldest, *youngest; /* a FIFO: age, count and bytes all evict from its head */
    int count;
    size_t bytes;
};

sf_kept_logits *sf_kept_logits_new(struct sf_jobs *jobs, sf_family *evicted)
{
    sf_kept_logits *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    pthread_mutex_init(&k->mu, NULL);
    k->jobs = jobs;
    k->evicted = evicted;
    return k;
}

void sf_kept_logits_destroy(sf_kept_logits *k)
{
    if (!k)
        return;
    for (entry *e = k->oldest, *next; e; e = next) {
        next = e->next;
        sf_xform_out_release(e->o);
        free(e);
    }
    pthread_mutex_destroy(&k->mu);
    free(k);
}

static void count_eviction(sf_kept_logits *k, const char *reason)
{
    if (k->evicted) {
        const char *v[] = {reason};
        sf_counter_inc_l(k->evicted, v, 1);
    }
}

static void evict_oldest_locked(sf_kept_logits *k, const char *reason)
{
    entry *e = k->oldest;
    k->oldest = e->next;
    if (!k->oldest)
        k->youngest = NULL;
    k->count--;
    k->bytes -= e->bytes;
    sf_jobs_set_logits(k->jobs, e->id, SF_JOB_LOGITS_EXPIRED);
    count_eviction(k, reason);
    sf_xform_out_release(e->o);
    free(e);
}

static void expire_locked(sf_kept_logits *k, uint64_t now_ns)
{
    uint64_t keep_ns = (uint64_t)sf_config_cur()->eval.logits_keep_s * 1000000000ull;
    while (k->oldest && now_ns - k->oldest->t_kept_ns >= keep_ns)
        evict_oldest_locked(k, "age");
}

int sf_kept_logits_put(sf_kept_logits *k, uint64_t id, sf_xform_out *o, uint64_t now_ns)
{
    const sf_config *c = sf_config_cur();
    size_t size = sf_xform_out_size(o);
    size_t max_bytes = (size_t)c->eval.logits_keep_bytes;
    entry *e = size <= max_bytes ? malloc(sizeof *e) : NULL;
    if (!e) {
        /* The limit was lowered since the request was accepted (or no memory). */
        sf_jobs_set_logits(k->jobs, id, SF_JOB_LOGITS_EXPIRED);
        pthread_mutex_lock(&k->mu);
        count_eviction(k, "bytes");
        pthread_mutex_unlock(&k->mu);
        return -1;
    }
    sf_xform_out_retain(o);
    *e = (entry){id, now_ns, o, size, NULL};
    pthread_mutex_lock(&k->mu);
    expire_locked(k, now_ns);
    while (k->oldest && k->count + 1 > c->eval.logits_keep_max)
        evict_oldest_locked(k, "count");
    while (k->oldest && k->bytes + size > max_bytes)
        evict_oldest_locked(k, "bytes");
    if (k->youngest)
        k->youngest->next = e;
    else
        k->oldest = e;
    k->youngest = e;
    k->count++;
    k->bytes += size;
    sf_jobs_set_logits(k->jobs, id, SF_JOB_LOGITS_KEPT);
    pthread_mutex_unlock(&k->mu);
    return 0;
}

sf_xform_out *sf_kept_logits_get(sf_kept_logits *k, uint64_t id, uint64_t now_ns)
{
    sf_xform_out *o = NULL;
    pthread_mutex_lock(&k->mu);
    expire_locked(k, now_ns);
    for (entry *e = k->oldest; e; e = e->next) {
        if (e->id == id) {
            o = e->o;
            sf_xform_out_retain(o);
            break;
        }
    }
    pthread_mutex_unlock(&k->mu);
    return o;
}

void sf_kept_logits_expire(sf_kept_logits *k, uint64_t now_ns)
{
    pthread_mutex_lock(&k->mu);
    expire_locked(k, now_ns);
    pthread_mutex_unlock(&k->mu);
}

void sf_kept_logits_usage(sf_kept_logits *k, int *count, size_t *bytes)
{
    pthread_mutex_lock(&k->mu);
    *count = k->count;
    *bytes = k->bytes;
    pthread_mutex_unlock(&k->mu);
}
