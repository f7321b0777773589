/* server/distributed.c — see distributed.h. */
#include "server/distributed.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collective/kv_client.h"
#include "server/clock.h"
#include "server/log.h"

/* Results of this rank's patches are kept for the requests that wait on
 * them; older ones are forgotten (their requests have long replied). */
#define PATCH_RESULTS 16

typedef struct dist_patch {
    uint64_t id;
    char *body;
    size_t len;
    int done, status;
    int unavailable; /* the job broke before the patch was applied */
    char err[512], field[128];
    char *reply; /* printed {"applied","pending_restart"} */
} dist_patch;

struct sf_distributed {
    sf_dist d;
    sf_kv_store store;      /* what the ranks use: inner, cut short by cancel */
    sf_kv_store inner;      /* the table or the HTTP client */
    atomic_int cancel;      /* the service is stopping: the join gives up */
    sf_kv_table *table;    /* rank 0 */
    sf_kv_client *client;  /* ranks > 0 */
    char host[256];
    int join_timeout_ms;
    int timeout_ms;
    char rendezvous[256];

    pthread_mutex_t mu;
    sf_dist_state state;
    int started; /* the job's agreement and rank 0's initial state are done (sf_distributed_started) */
    char reason[400];
    dist_patch queue[SF_DIST_MAX_PATCHES]; /* FIFO of this rank's patches not yet applied */
    int nqueue;
    dist_patch results[PATCH_RESULTS];     /* by id % PATCH_RESULTS */
    uint64_t next_id;
    uint64_t empty_rounds;
    double allreduce_sum;
    uint64_t allreduce_count;

    sf_metric *m_world, *m_rank, *m_empty, *m_allreduce, *m_state;
};

/* Rank 0's store takes the keys a job of its size writes and no other
 * (collective/kv_table.h: Gloo's two per rank and the NCCL unique id), with room
 * for all of them: spare room for other keys was what anyone reaching the
 * port could fill, with 10 junk keys in a job of 2 ranks, so that the next
 * rank's own key was refused and the job never formed. Values up to 64 KiB,
 * or Gloo's largest (a rank's addresses of its pairs) when that is more. */
#define KV_MIN_VALUE 65536

/* The join waits in the store's get for the other ranks' keys, up to
 * distributed.join_timeout_s: in slices, so that a shutdown ends it. */
#define JOIN_SLICE_MS 200

/* A rank > 0 publishes its address first, and the ranks of a job start in
 * any order (pods of a StatefulSet, processes of one script): rank 0 may not
 * listen yet. A set the store did not answer is tried again every
 * JOIN_RETRY_MS within distributed.join_timeout_s, as the gets wait for
 * keys, and a shutdown ends it. */
#define JOIN_RETRY_MS 100

static int store_set(void *ctx, const char *key, const void *val, size_t len)
{
    sf_distributed *d = ctx;
    const uint64_t end = sf_now_ns() + (uint64_t)d->join_timeout_ms * 1000000ull;
    for (;;) {
        int rc = d->inner.set(d->inner.ctx, key, val, len);
        if (rc != 1)
            return rc;
        if (atomic_load(&d->cancel) || sf_now_ns() >= end)
            return -1;
        struct timespec ts = {0, JOIN_RETRY_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static int store_get(void *ctx, const char *key, void *buf, size_t cap, size_t *len, int timeout_ms)
{
    sf_distributed *d = ctx;
    for (int left = timeout_ms;;) {
        if (atomic_load(&d->cancel))
            return -1;
        int slice = left < JOIN_SLICE_MS ? left : JOIN_SLICE_MS;
        int rc = d->inner.get(d->inner.ctx, key, buf, cap, len, slice);
        if (rc != 1 || (left -= slice) <= 0)
            return rc;
    }
}

void sf_distributed_cancel(sf_distributed *d)
{
    if (d)
        atomic_store(&d->cancel, 1);
}

void sf_distributed_cancel_join(sf_distributed *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    if (d->state == SF_DIST_JOINING)
        atomic_store(&d->cancel, 1);
    pthread_mutex_unlock(&d->mu);
}

sf_distributed *sf_distributed_new(const sf_config *c, char *err, size_t errlen)
{
    if (c->distributed.world_size <= 1)
        return NULL;
    sf_distributed *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&d->mu, NULL);
    d->d.rank = c->distributed.rank;
    d->d.world = c->distributed.world_size;
    d->d.timeout_ms = c->distributed.timeout_s * 1000;
    d->d.bucket_bytes = (size_t)c->distributed.bucket_mb << 20;
    d->d.bn_broadcast = strcmp(c->distributed.batchnorm, "broadcast") == 0;
    d->d.bn_sync = strcmp(c->distributed.batchnorm, "sync") == 0;
    if (!c->http.token[0])
        SF_WARN("distributed: this job runs without http.token (distributed.allow_no_token): any client that "
                "reaches rank 0's port can write its rendezvous store and break the job");
    d->timeout_ms = d->d.timeout_ms;
    d->join_timeout_ms = c->distributed.join_timeout_s * 1000;
    snprintf(d->host, sizeof d->host, "%s", c->distributed.host);
    snprintf(d->rendezvous, sizeof d->rendezvous, "%s", c->distributed.rendezvous);
    if (d->d.rank == 0) {
        int keys;
        size_t value;
        sf_coll_store_needs(d->d.world, &keys, &value);
        if (keys >= sf_kv_job_keys(d->d.world)) { /* the collective writes keys the store does not take */
            snprintf(err, errlen, "the rendezvous store takes %d keys for %d ranks, the collective writes %d",
                     sf_kv_job_keys(d->d.world), d->d.world, keys);
            sf_distributed_free(d);
            return NULL;
        }
        d->table = sf_kv_table_new(d->d.world, value > KV_MIN_VALUE ? value : KV_MIN_VALUE);
        if (!d->table) {
            snprintf(err, errlen, "out of memory");
            sf_distributed_free(d);
            return NULL;
        }
        d->inner = sf_kv_table_store(d->table);
        snprintf(d->rendezvous, sizeof d->rendezvous, "this process (rank 0)");
    } else {
        d->client = sf_kv_client_new(c->distributed.rendezvous, c->http.token, err, errlen);
        if (!d->client) {
            sf_distributed_free(d);
            return NULL;
        }
        d->inner = sf_kv_client_store(d->client);
    }
    d->store.ctx = d;
    d->store.set = store_set;
    d->store.get = store_get;
    d->d.store = &d->store;
    d->state = SF_DIST_JOINING;
    snprintf(d->reason, sizeof d->reason, "joining the data-parallel job (rank %d of %d)", d->d.rank, d->d.world);

    d->m_world = sf_metric_only(sf_metrics_gauge("streamfeed_distributed_world_size",
                                                 "Ranks of the data-parallel job (distributed.world_size).", NULL));
    d->m_rank = sf_metric_only(sf_metrics_gauge("streamfeed_distributed_rank", "This process's rank.", NULL));
    d->m_state = sf_metric_only(sf_metrics_gauge(
        "streamfeed_distributed_healthy",
        "1 while the ranks train together with identical parameters; 0 while joining, after a peer was lost "
        "or when the parameter digests differ (/readyz says why).",
        NULL));
    d->m_empty = sf_metric_only(sf_metrics_counter(
        "streamfeed_distributed_empty_contributions_total",
        "Rounds this rank joined without a batch (after distributed.wait_ms): zero gradient, zero weight.",
        NULL));
    d->m_allreduce = sf_metric_only(sf_metrics_counter(
        "streamfeed_distributed_allreduce_seconds_total",
        "Seconds this rank spent in the gradient all-reduce (CUDA: the collectives on the GPU, "
        "beside the backward; its count: GET /v1/stats distributed.allreduce_rounds).", NULL));
    sf_gauge_set(d->m_world, d->d.world);
    sf_gauge_set(d->m_rank, d->d.rank);
    sf_gauge_set(d->m_state, 0);
    return d;
}

void sf_distributed_free(sf_distributed *d)
{
    if (!d)
        return;
    if (d->d.coll)
        sf_coll_free(d->d.coll);
    for (int i = 0; i < d->nqueue; i++)
        free(d->queue[i].body);
    for (int i = 0; i < PATCH_RESULTS; i++)
        free(d->results[i].reply);
    sf_kv_table_free(d->table);
    sf_kv_client_free(d->client);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

void sf_distributed_started(sf_distributed *d)
{
    pthread_mutex_lock(&d->mu);
    d->started = 1;
    pthread_mutex_unlock(&d->mu);
}

int sf_distributed_ready(sf_distributed *d)
{
    pthread_mutex_lock(&d->mu);
    const int ready = d->state == SF_DIST_JOINED && d->started;
    pthread_mutex_unlock(&d->mu);
    return ready;
}

const sf_dist *sf_distributed_backend(sf_distributed *d) { return &d->d; }
sf_kv_table *sf_distributed_table(sf_distributed *d) { return d ? d->table : NULL; }
int sf_distributed_rank(const sf_distributed *d) { return d ? d->d.rank : 0; }
int sf_distributed_world(const sf_distributed *d) { return d ? d->d.world : 1; }
sf_coll *sf_distributed_coll(sf_distributed *d) { return d->d.coll; }

int sf_distributed_join(sf_distributed *d)
{
    char err[512];
    SF_INFO("distributed: rank %d of %d joining through %s (distributed.join_timeout_s %d)", d->d.rank,
            d->d.world, d->rendezvous, d->join_timeout_ms / 1000);
    sf_coll *c = sf_coll_new(d->d.rank, d->d.world, d->host, &d->store, d->join_timeout_ms, err, sizeof err);
    if (!c && atomic_load(&d->cancel)) {
        sf_distributed_ended(d, "the service stopped before every rank joined");
        return -1;
    }
    if (!c) {
        char detail[512] = "";
        if (d->client)
            sf_kv_client_error(d->client, detail, sizeof detail);
        sf_distributed_fail(d, "could not join the data-parallel job through the rendezvous %s: %s%s%s",
                            d->rendezvous, err, detail[0] ? "; last store error: " : "", detail);
        return -1;
    }
    sf_coll_set_timeout(c, d->timeout_ms);
    pthread_mutex_lock(&d->mu);
    d->d.coll = c;
    if (d->state == SF_DIST_JOINING) {
        d->state = SF_DIST_JOINED;
        d->reason[0] = '\0';
        /* A cancel_join that came as the join succeeded has nothing left to
         * end; left set, it would cut short the store's later gets (the
         * NCCL id, read once the job's settings are agreed). */
        atomic_store(&d->cancel, 0);
    }
    pthread_mutex_unlock(&d->mu);
    sf_gauge_set(d->m_state, 1);
    SF_INFO("distributed: rank %d of %d joined", d->d.rank, d->d.world);
    return 0;
}

sf_dist_state sf_distributed_state(sf_distributed *d, char *reason, size_t len)
{
    pthread_mutex_lock(&d->mu);
    sf_dist_state s = d->state;
    if (reason && len)
        snprintf(reason, len, "%s", d->state == SF_DIST_JOINED && !d->started
                                        ? "joined; agreeing on the job with the other ranks and taking rank 0's state"
                                        : d->reason);
    pthread_mutex_unlock(&d->mu);
    /* While joining, what the rank waits for is what an operator needs
     * (rank 0 not listening, a key not published yet). */
    if (s == SF_DIST_JOINING && reason && len && d->client) {
        char detail[512];
        sf_kv_client_error(d->client, detail, sizeof detail);
        size_t n = strlen(reason);
        if (detail[0] && n + 1 < len)
            snprintf(reason + n, len - n, "; last store error: %s", detail);
    }
    return s;
}

static void set_state(sf_distributed *d, sf_dist_state s, int loud, const char *fmt, va_list ap)
{
    char msg[sizeof d->reason];
    vsnprintf(msg, sizeof msg, fmt, ap);
    pthread_mutex_lock(&d->mu);
    int first = d->state != SF_DIST_BROKEN;
    if (first) {
        d->state = s;
        snprintf(d->reason, sizeof d->reason, "%s", msg);
    }
    /* A broken job applies no more patches: their requests are answered,
     * as well as the one a failed round had taken from the queue. */
    if (s == SF_DIST_BROKEN) {
        for (int i = 0; i < d->nqueue; i++)
            free(d->queue[i].body);
        d->nqueue = 0;
        for (int i = 0; i < PATCH_RESULTS; i++) {
            dist_patch *r = &d->results[i];
            if (!r->id || r->done)
                continue;
            r->done = r->unavailable = 1;
            snprintf(r->err, sizeof r->err, "not applied: %s", msg);
        }
    }
    pthread_mutex_unlock(&d->mu);
    sf_gauge_set(d->m_state, 0);
    if (first && loud)
        SF_ERROR("distributed: rank %d of %d: %s", d->d.rank, d->d.world, msg);
    else if (first)
        SF_WARN("distributed: rank %d of %d: %s", d->d.rank, d->d.world, msg);
}

void sf_distributed_fail(sf_distributed *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_state(d, SF_DIST_BROKEN, 1, fmt, ap);
    va_end(ap);
}

void sf_distributed_ended(sf_distributed *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_state(d, SF_DIST_BROKEN, 0, fmt, ap);
    va_end(ap);
}

void sf_distributed_diverged(sf_distributed *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_state(d, SF_DIST_DIVERGED, 1, fmt, ap);
    va_end(ap);
}

/* ---- patches ----------------------------------------------------------------- */

int sf_distributed_patch_post(sf_distributed *d, const char *body, size_t len, uint64_t *id, char *err,
                              size_t errlen)
{
    pthread_mutex_lock(&d->mu);
    if (d->state == SF_DIST_BROKEN || d->state == SF_DIST_JOINING) {
        snprintf(err, errlen, "the data-parallel job is not training: %s", d->reason);
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    if (d->nqueue == SF_DIST_MAX_PATCHES) {
        snprintf(err, errlen, "%d configuration patches are already waiting for the next step", d->nqueue);
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    char *copy = malloc(len + 1);
    if (!copy) {
        pthread_mutex_unlock(&d->mu);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(copy, body, len);
    copy[len] = '\0';
    dist_patch *p = &d->queue[d->nqueue++];
    memset(p, 0, sizeof *p);
    p->id = ++d->next_id;
    p->body = copy;
    p->len = len;
    dist_patch *r = &d->results[p->id % PATCH_RESULTS];
    free(r->reply);
    memset(r, 0, sizeof *r);
    r->id = p->id;
    *id = p->id;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

int sf_distributed_patch_result(sf_distributed *d, uint64_t id, int *status, char *err, size_t errlen,
                                char *field, size_t fieldlen, cJSON **reply)
{
    pthread_mutex_lock(&d->mu);
    dist_patch *r = &d->results[id % PATCH_RESULTS];
    int rc = 0;
    if (r->id != id) {
        snprintf(err, errlen, "configuration patch %llu was forgotten", (unsigned long long)id);
        rc = -1;
    } else if (r->unavailable) {
        snprintf(err, errlen, "%s", r->err);
        rc = -1;
    } else if (r->done) {
        *status = r->status;
        snprintf(err, errlen, "%s", r->err);
        snprintf(field, fieldlen, "%s", r->field);
        *reply = r->reply ? cJSON_Parse(r->reply) : NULL;
        rc = 1;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

int64_t sf_distributed_patch_len(sf_distributed *d)
{
    pthread_mutex_lock(&d->mu);
    int64_t n = d->nqueue ? (int64_t)d->queue[0].len : 0;
    pthread_mutex_unlock(&d->mu);
    return n;
}

/* Records the outcome of this rank's own patch for the request waiting on it. */
static void record_result(sf_distributed *d, uint64_t id, int status, const char *err, const char *field,
                          char *reply)
{
    pthread_mutex_lock(&d->mu);
    dist_patch *r = &d->results[id % PATCH_RESULTS];
    if (r->id == id) {
        r->done = 1;
        r->status = status;
        snprintf(r->err, sizeof r->err, "%s", err);
        snprintf(r->field, sizeof r->field, "%s", field);
        free(r->reply);
        r->reply = reply;
        reply = NULL;
    }
    pthread_mutex_unlock(&d->mu);
    free(reply);
}

/* Applies one rank's patch, which every rank found valid, on this rank;
 * records the outcome when the patch is this rank's own (mine != NULL). */
static void apply_one(sf_distributed *d, const cJSON *patch, const dist_patch *mine)
{
    cJSON *applied = NULL, *pending = NULL;
    char err[512] = "", field[128] = "";
    int rc = sf_config_patch(patch, &applied, &pending, err, sizeof err, field, sizeof field);
    char *reply = NULL;
    if (rc == 0) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "applied", applied ? applied : cJSON_CreateObject());
        cJSON_AddItemToObject(o, "pending_restart", pending ? pending : cJSON_CreateObject());
        reply = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
    } else {
        cJSON_Delete(applied);
        cJSON_Delete(pending);
        SF_WARN("distributed: a configuration patch every rank had checked was refused here: %s", err);
    }
    if (mine)
        record_result(d, mine->id, rc, err, field, reply);
    else
        free(reply);
}

/* The refusing rank's reason, sent to every rank with the patch's outcome. */
typedef struct refusal {
    char err[400];
    char field[128];
} refusal;

/* Rank r's patch (buf, len), on every rank: each checks it against its own
 * config, since ranks may differ in restart-only options (only rank 0 has a
 * checkpoint.dir, say) and a patch one rank refuses must apply on none, or
 * the ranks would train on with different hot options. One all-reduce (min)
 * names the lowest refusing rank, which then broadcasts why. 0, or -1 when
 * a collective failed. */
static int decide_and_apply(sf_distributed *d, int r, const char *buf, size_t len, const dist_patch *mine,
                            char *err, size_t errlen)
{
    const int world = d->d.world, rank = d->d.rank;
    refusal why = {{0}, {0}};
    cJSON *patch = cJSON_ParseWithLength(buf, len);
    if (!patch)
        snprintf(why.err, sizeof why.err, "the patch is not valid JSON");
    int ok = patch && sf_config_patch_check(patch, why.err, sizeof why.err, why.field, sizeof why.field) == 0;
    int64_t refuser = ok ? world : rank;
    if (sf_coll_allreduce(d->d.coll, &refuser, 1, SF_COLL_I64, SF_COLL_MIN, err, errlen) != 0) {
        cJSON_Delete(patch);
        return -1;
    }
    if (refuser == world) {
        apply_one(d, patch, mine);
        cJSON_Delete(patch);
        return 0;
    }
    cJSON_Delete(patch);
    if (sf_coll_broadcast(d->d.coll, &why, sizeof why, (int)refuser, err, errlen) != 0)
        return -1;
    why.err[sizeof why.err - 1] = why.field[sizeof why.field - 1] = '\0';
    char msg[512];
    snprintf(msg, sizeof msg, "rank %lld of the data-parallel job refused it, so no rank applied it: %s",
             (long long)refuser, why.err);
    if (mine)
        record_result(d, mine->id, -1, msg, why.field, NULL);
    else if (refuser == rank)
        SF_WARN("distributed: rank %d's configuration patch is refused here, so no rank applies it: %s", r,
                why.err);
    return 0;
}

int sf_distributed_apply_patches(sf_distributed *d, const int64_t *lens, char *err, size_t errlen)
{
    int any = 0;
    for (int r = 0; r < d->d.world; r++) {
        if (lens[r] <= 0)
            continue;
        char *buf = malloc((size_t)lens[r] + 1);
        if (!buf) {
            snprintf(err, errlen, "out of memory for a %lld-byte configuration patch", (long long)lens[r]);
            return -1;
        }
        dist_patch mine = {0};
        if (r == d->d.rank) {
            pthread_mutex_lock(&d->mu);
            mine = d->queue[0];
            memmove(d->queue, d->queue + 1, sizeof d->queue[0] * (size_t)(d->nqueue - 1));
            d->nqueue--;
            pthread_mutex_unlock(&d->mu);
            memcpy(buf, mine.body, (size_t)lens[r]);
            free(mine.body);
        }
        if (sf_coll_broadcast(d->d.coll, buf, (size_t)lens[r], r, err, errlen) != 0 ||
            decide_and_apply(d, r, buf, (size_t)lens[r], r == d->d.rank ? &mine : NULL, err, errlen) != 0) {
            free(buf);
            return -1;
        }
        free(buf);
        any = 1;
    }
    /* The requests reply once every rank applied the patches (a broadcast's
     * root may finish before its receivers did): one more tiny all-reduce. */
    int64_t done = 1;
    return any ? sf_coll_allreduce(d->d.coll, &done, 1, SF_COLL_I64, SF_COLL_SUM, err, errlen) : 0;
}

/* ---- metrics ----------------------------------------------------------------- */

void sf_distributed_count_empty(sf_distributed *d)
{
    sf_counter_add(d->m_empty, 1);
    pthread_mutex_lock(&d->mu);
    d->empty_rounds++;
    pthread_mutex_unlock(&d->mu);
}

void sf_distributed_observe_allreduce(sf_distributed *d, double seconds)
{
    sf_counter_add(d->m_allreduce, seconds);
    pthread_mutex_lock(&d->mu);
    d->allreduce_sum += seconds;
    d->allreduce_count++;
    pthread_mutex_unlock(&d->mu);
}

void sf_distributed_allreduce_totals(sf_distributed *d, uint64_t *rounds, double *seconds)
{
    pthread_mutex_lock(&d->mu);
    *rounds = d->allreduce_count;
    *seconds = d->allreduce_sum;
    pthread_mutex_unlock(&d->mu);
}

void sf_distributed_to_json(sf_distributed *d, cJSON *o)
{
    static const char *const names[] = {"joining", "training", "broken", "diverged"};
    pthread_mutex_lock(&d->mu);
    cJSON_AddStringToObject(o, "state", names[d->state]);
    if (d->reason[0])
        cJSON_AddStringToObject(o, "reason", d->reason);
    cJSON_AddNumberToObject(o, "empty_contributions", (double)d->empty_rounds);
    cJSON_AddNumberToObject(o, "allreduce_rounds", (double)d->allreduce_count);
    cJSON_AddNumberToObject(o, "allreduce_mean_s", d->allreduce_count ? d->allreduce_sum / (double)d->allreduce_count : 0);
    pthread_mutex_unlock(&d->mu);
}
