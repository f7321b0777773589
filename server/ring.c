/* server/ring.c — see ring.h. */
#include "server/ring.h"
#include "server/clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct sf_ring {
    pthread_mutex_t mu;
    pthread_cond_t ready_cv;
    int n;
    size_t slot_bytes;
    uint8_t **bytes;
    sf_slot_meta *meta;
    sf_slot_state *state;
    int *fifo;          /* READY slots in commit order: a circular queue of n entries */
    int head, count;
    int closed;
    int kicked;         /* one pop returns early (sf_ring_kick) */
    int counts[SF_SLOT_STATES];
    sf_ring_alloc_fn alloc;
    sf_ring_free_fn free_fn;
    void *ctx;
    void (*on_free)(void *);
    void *on_free_ctx;
};

sf_ring *sf_ring_new(int slots, size_t slot_bytes, sf_ring_alloc_fn alloc, sf_ring_free_fn free_fn,
                     void *ctx)
{
    sf_ring *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->n = slots;
    r->slot_bytes = slot_bytes;
    r->alloc = alloc;
    r->free_fn = free_fn;
    r->ctx = ctx;
    r->bytes = calloc((size_t)slots, sizeof *r->bytes);
    r->meta = calloc((size_t)slots, sizeof *r->meta);
    r->state = calloc((size_t)slots, sizeof *r->state);
    r->fifo = calloc((size_t)slots, sizeof *r->fifo);
    if (!r->bytes || !r->meta || !r->state || !r->fifo)
        goto fail;
    for (int i = 0; i < slots; i++)
        if (!(r->bytes[i] = alloc(ctx, slot_bytes)))
            goto fail;
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->ready_cv, &ca);
    pthread_condattr_destroy(&ca);
    r->counts[SF_SLOT_FREE] = slots;
    return r;
fail:
    if (r->bytes)
        for (int i = 0; i < slots; i++)
            if (r->bytes[i])
                free_fn(ctx, r->bytes[i]);
    free(r->bytes);
    free(r->meta);
    free(r->state);
    free(r->fifo);
    free(r);
    return NULL;
}

void sf_ring_destroy(sf_ring *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n; i++)
        r->free_fn(r->ctx, r->bytes[i]);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->ready_cv);
    free(r->bytes);
    free(r->meta);
    free(r->state);
    free(r->fifo);
    free(r);
}

int sf_ring_slots(const sf_ring *r) { return r->n; }
size_t sf_ring_slot_bytes(const sf_ring *r) { return r->slot_bytes; }

uint64_t sf_ring_auto_slot_bytes(int max_batch, int c, int h, int w, uint64_t label_elems, uint64_t max_bytes)
{
    const uint64_t mib = (uint64_t)1 << 20;
    const uint64_t per = (uint64_t)(c > 0 ? c : 0) * (uint64_t)(h > 0 ? h : 0) * (uint64_t)(w > 0 ? w : 0) +
                         8 * label_elems;
    uint64_t need = per * (uint64_t)(max_batch > 0 ? max_batch : 0);
    need = need < SF_RING_AUTO_MIN_BYTES ? SF_RING_AUTO_MIN_BYTES : (need + mib - 1) / mib * mib;
    return need > max_bytes ? max_bytes : need;
}
uint8_t *sf_ring_bytes(sf_ring *r, int slot) { return r->bytes[slot]; }
sf_slot_meta *sf_ring_meta(sf_ring *r, int slot) { return &r->meta[slot]; }

static void move(sf_ring *r, int slot, sf_slot_state to)
{
    r->counts[r->state[slot]]--;
    r->state[slot] = to;
    r->counts[to]++;
}

int sf_ring_acquire(sf_ring *r)
{
    pthread_mutex_lock(&r->mu);
    int got = -1;
    if (!r->closed) {
        for (int i = 0; i < r->n; i++) {
            if (r->state[i] == SF_SLOT_FREE) {
                move(r, i, SF_SLOT_FILLING);
                memset(&r->meta[i], 0, sizeof r->meta[i]);
                got = i;
                break;
            }
        }
    }
    pthread_mutex_unlock(&r->mu);
    return got;
}

void sf_ring_commit(sf_ring *r, int slot)
{
    pthread_mutex_lock(&r->mu);
    move(r, slot, SF_SLOT_READY);
    r->fifo[(r->head + r->count) % r->n] = slot;
    r->count++;
    pthread_cond_signal(&r->ready_cv);
    pthread_mutex_unlock(&r->mu);
}

static void to_free(sf_ring *r, int slot)
{
    pthread_mutex_lock(&r->mu);
    move(r, slot, SF_SLOT_FREE);
    void (*fn)(void *) = r->on_free;
    void *ctx = r->on_free_ctx;
    pthread_mutex_unlock(&r->mu);
    if (fn)
        fn(ctx);
}

void sf_ring_abort(sf_ring *r, int slot) { to_free(r, slot); }
void sf_ring_release(sf_ring *r, int slot) { to_free(r, slot); }

int sf_ring_pop(sf_ring *r, int timeout_ms)
{
    pthread_mutex_lock(&r->mu);
    if (r->count == 0 && timeout_ms > 0 && !r->closed) {
        const struct timespec dl = sf_deadline_after_ms(timeout_ms);
        while (r->count == 0 && !r->closed && !r->kicked)
            if (pthread_cond_timedwait(&r->ready_cv, &r->mu, &dl) == ETIMEDOUT)
                break;
    }
    r->kicked = 0;
    int slot = -1;
    if (r->count > 0) {
        slot = r->fifo[r->head];
        r->head = (r->head + 1) % r->n;
        r->count--;
        move(r, slot, SF_SLOT_IN_FLIGHT);
    }
    pthread_mutex_unlock(&r->mu);
    return slot;
}

void sf_ring_kick(sf_ring *r)
{
    pthread_mutex_lock(&r->mu);
    r->kicked = 1;
    pthread_cond_broadcast(&r->ready_cv);
    pthread_mutex_unlock(&r->mu);
}

void sf_ring_close(sf_ring *r)
{
    pthread_mutex_lock(&r->mu);
    r->closed = 1;
    pthread_cond_broadcast(&r->ready_cv);
    pthread_mutex_unlock(&r->mu);
}

void sf_ring_counts(sf_ring *r, int counts[SF_SLOT_STATES])
{
    pthread_mutex_lock(&r->mu);
    memcpy(counts, r->counts, sizeof r->counts);
    pthread_mutex_unlock(&r->mu);
}

void sf_ring_on_free(sf_ring *r, void (*fn)(void *ctx), void *ctx)
{
    pthread_mutex_lock(&r->mu);
    r->on_free = fn;
    r->on_free_ctx = ctx;
    pthread_mutex_unlock(&r->mu);
}

const char *sf_slot_state_name(sf_slot_state s)
{
    static const char *const names[] = {"free", "filling", "ready", "in_flight"};
    return (unsigned)s < SF_SLOT_STATES ? names[s] : "unknown";
}
