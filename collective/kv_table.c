/* collective/kv_table.c — see kv_table.h. */
#include "collective/kv_table.h"
#include "server/clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct kv_entry {
    char key[SF_KV_MAX_KEY + 1];
    unsigned char *val;
    size_t len;
} kv_entry;

struct sf_kv_table {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled on every put, for waiting gets */
    kv_entry *e;       /* max_entries */
    int n, max_entries; /* max_entries: every key of the job (sf_kv_job_keys) */
    int world;
    size_t max_value;
};

int sf_kv_job_keys(int world) { return 2 * world + 1; }

sf_kv_table *sf_kv_table_new(int world, size_t max_value)
{
    if (world < 1 || world > SF_KV_MAX_WORLD)
        return NULL;
    sf_kv_table *t = calloc(1, sizeof *t);
    const int max_entries = sf_kv_job_keys(world);
    if (!t || !(t->e = calloc((size_t)max_entries, sizeof *t->e))) {
        free(t);
        return NULL;
    }
    t->world = world;
    t->max_entries = max_entries;
    t->max_value = max_value;
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &a);
    pthread_condattr_destroy(&a);
    return t;
}

void sf_kv_table_free(sf_kv_table *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n; i++)
        free(t->e[i].val);
    free(t->e);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

int sf_kv_table_world(const sf_kv_table *t) { return t->world; }
int sf_kv_table_max_entries(const sf_kv_table *t) { return t->max_entries; }
size_t sf_kv_table_max_value(const sf_kv_table *t) { return t->max_value; }

/* 1 when s is a rank of a job of world ranks, in decimal without leading
 * zeros: one spelling per rank, so the keys that take a rank are finite. */
static int is_rank(const char *s, int world)
{
    if (!*s || (s[0] == '0' && s[1]))
        return 0;
    long n = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return 0;
        n = n * 10 + (*s - '0');
        if (n >= world)
            return 0;
    }
    return 1;
}

const char *sf_kv_key_check(const char *key, int world)
{
    if (!key)
        return "kv_key_invalid";
    if (!strcmp(key, "nccl.id"))
        return NULL;
    if (!strncmp(key, "gloo.rank_", 10) && is_rank(key + 10, world))
        return NULL;
    if (!strncmp(key, "gloo.", 5) && is_rank(key + 5, world))
        return NULL;
    return "kv_key_invalid";
}

static kv_entry *find(sf_kv_table *t, const char *key)
{
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->e[i].key, key))
            return &t->e[i];
    return NULL;
}

int sf_kv_table_put(sf_kv_table *t, const char *key, const void *val, size_t len, const char **code)
{
    const char *bad = sf_kv_key_check(key, t->world);
    if (bad || len > t->max_value) {
        *code = bad ? bad : "kv_value_too_large";
        return -1;
    }
    unsigned char *copy = malloc(len ? len : 1);
    if (!copy) {
        *code = "out_of_memory";
        return -1;
    }
    if (len)
        memcpy(copy, val, len);
    pthread_mutex_lock(&t->mu);
    kv_entry *e = find(t, key);
    if (!e) {
        if (t->n == t->max_entries) {
            pthread_mutex_unlock(&t->mu);
            free(copy);
            *code = "kv_full";
            return -1;
        }
        e = &t->e[t->n++];
        strcpy(e->key, key);
    } else {
        free(e->val);
    }
    e->val = copy;
    e->len = len;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

int sf_kv_table_get(sf_kv_table *t, const char *key, void *buf, size_t cap, size_t *len, int timeout_ms)
{
    if (sf_kv_key_check(key, t->world))
        return -1;
    const struct timespec until = sf_deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&t->mu);
    kv_entry *e;
    while (!(e = find(t, key))) {
        if (timeout_ms <= 0 || pthread_cond_timedwait(&t->cv, &t->mu, &until) == ETIMEDOUT) {
            e = find(t, key);
            break;
        }
    }
    if (!e) {
        pthread_mutex_unlock(&t->mu);
        return 1;
    }
    memcpy(buf, e->val, e->len < cap ? e->len : cap);
    *len = e->len;
    pthread_mutex_unlock(&t->mu);
    return 0;
}

int sf_kv_table_count(sf_kv_table *t)
{
    pthread_mutex_lock(&t->mu);
    int n = t->n;
    pthread_mutex_unlock(&t->mu);
    return n;
}

static int store_set(void *ctx, const char *key, const void *val, size_t len)
{
    const char *code;
    return sf_kv_table_put(ctx, key, val, len, &code);
}

static int store_get(void *ctx, const char *key, void *buf, size_t cap, size_t *len, int timeout_ms)
{
    return sf_kv_table_get(ctx, key, buf, cap, len, timeout_ms);
}

sf_kv_store sf_kv_table_store(sf_kv_table *t)
{
    sf_kv_store s = {t, store_set, store_get};
    return s;
}
