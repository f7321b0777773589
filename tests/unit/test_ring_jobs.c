/* tests/unit/test_ring_jobs.c — the ring of slots (server/ring.c) and the
 * job table (server/jobs.c): state transitions and counts, FIFO order,
 * blocking pops, close, the on_free callback; job ids, eviction by id % cap,
 * final states and the counts invariant. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "server/jobs.h"
#include "server/ring.h"

/* ---- helpers ----------------------------------------------------------------- */

static int allocs, frees;
static size_t last_alloc_bytes;

static void *slot_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    allocs++;
    last_alloc_bytes = bytes;
    return malloc(bytes);
}

static void slot_free(void *ctx, void *p)
{
    (void)ctx;
    frees++;
    free(p);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void expect_counts(sf_ring *r, int free_, int filling, int ready, int in_flight)
{
    int c[SF_SLOT_STATES];
    sf_ring_counts(r, c);
    assert_int_equal(c[SF_SLOT_FREE], free_);
    assert_int_equal(c[SF_SLOT_FILLING], filling);
    assert_int_equal(c[SF_SLOT_READY], ready);
    assert_int_equal(c[SF_SLOT_IN_FLIGHT], in_flight);
}

static sf_ring *new_ring(int slots)
{
    allocs = frees = 0;
    sf_ring *r = sf_ring_new(slots, 4096, slot_alloc, slot_free, NULL);
    assert_non_null(r);
    return r;
}

/* ---- ring ---------------------------------------------------------------------- */

static void test_ring_allocates_every_slot_once_and_frees_them_on_destroy(void **state)
{
    (void)state;
    sf_ring *r = new_ring(3);
    assert_int_equal(allocs, 3);
    assert_int_equal(last_alloc_bytes, 4096);
    assert_int_equal(sf_ring_slots(r), 3);
    assert_int_equal(sf_ring_slot_bytes(r), 4096);
    assert_true(sf_ring_bytes(r, 0) != sf_ring_bytes(r, 1) && sf_ring_bytes(r, 1) != sf_ring_bytes(r, 2));
    expect_counts(r, 3, 0, 0, 0);
    sf_ring_destroy(r);
    assert_int_equal(frees, 3);
}

static void test_a_slot_moves_free_filling_ready_in_flight_free(void **state)
{
    (void)state;
    sf_ring *r = new_ring(2);
    int s = sf_ring_acquire(r);
    assert_true(s >= 0 && s < 2);
    expect_counts(r, 1, 1, 0, 0);
    sf_ring_meta(r, s)->job_id = 7;
    sf_ring_commit(r, s);
    expect_counts(r, 1, 0, 1, 0);
    assert_int_equal(sf_ring_pop(r, 0), s);
    expect_counts(r, 1, 0, 0, 1);
    assert_int_equal(sf_ring_meta(r, s)->job_id, 7); /* the meta travels with the slot */
    sf_ring_release(r, s);
    expect_counts(r, 2, 0, 0, 0);
    /* An aborted upload goes straight back to FREE, and never to READY. */
    s = sf_ring_acquire(r);
    sf_ring_abort(r, s);
    expect_counts(r, 2, 0, 0, 0);
    assert_int_equal(sf_ring_pop(r, 0), -1);
    sf_ring_destroy(r);
}

static void test_acquire_returns_minus_one_when_no_slot_is_free_and_clears_the_meta(void **state)
{
    (void)state;
    sf_ring *r = new_ring(2);
    int a = sf_ring_acquire(r), b = sf_ring_acquire(r);
    assert_true(a >= 0 && b >= 0 && a != b);
    assert_int_equal(sf_ring_acquire(r), -1);
    expect_counts(r, 0, 2, 0, 0);
    sf_ring_meta(r, a)->job_id = 99;
    sf_ring_meta(r, a)->n = 5;
    sf_ring_abort(r, a);
    int c = sf_ring_acquire(r);
    assert_int_equal(c, a);
    assert_int_equal(sf_ring_meta(r, c)->job_id, 0);
    assert_int_equal(sf_ring_meta(r, c)->n, 0);
    sf_ring_destroy(r);
}

static void test_ready_slots_pop_in_commit_order_not_acquire_order(void **state)
{
    (void)state;
    sf_ring *r = new_ring(4);
    int s[4];
    for (int i = 0; i < 4; i++)
        s[i] = sf_ring_acquire(r);
    const int order[4] = {2, 0, 3, 1};
    for (int i = 0; i < 4; i++)
        sf_ring_commit(r, s[order[i]]);
    for (int i = 0; i < 4; i++)
        assert_int_equal(sf_ring_pop(r, 0), s[order[i]]);
    assert_int_equal(sf_ring_pop(r, 0), -1);
    /* Wrap around the circular queue many times. */
    for (int round = 0; round < 10; round++) {
        for (int i = 0; i < 4; i++)
            sf_ring_release(r, s[i]);
        for (int i = 0; i < 4; i++)
            s[i] = sf_ring_acquire(r);
        for (int i = 3; i >= 0; i--)
            sf_ring_commit(r, s[i]);
        for (int i = 3; i >= 0; i--)
            assert_int_equal(sf_ring_pop(r, 0), s[i]);
    }
    sf_ring_destroy(r);
}

static void test_pop_times_out_with_minus_one_after_the_timeout(void **state)
{
    (void)state;
    sf_ring *r = new_ring(2);
    double t0 = now_s();
    assert_int_equal(sf_ring_pop(r, 0), -1);
    assert_true(now_s() - t0 < 0.05);
    t0 = now_s();
    assert_int_equal(sf_ring_pop(r, 60), -1);
    double dt = now_s() - t0;
    assert_true(dt >= 0.055);
    assert_true(dt < 5.0);
    sf_ring_destroy(r);
}

typedef struct popper {
    sf_ring *r;
    int timeout_ms;
    atomic_int started;
    int got;
    double waited;
} popper;

static void *pop_thread(void *arg)
{
    popper *p = arg;
    atomic_store(&p->started, 1);
    double t0 = now_s();
    p->got = sf_ring_pop(p->r, p->timeout_ms);
    p->waited = now_s() - t0;
    return NULL;
}

static void test_close_wakes_a_blocked_pop_for_good(void **state)
{
    (void)state;
    sf_ring *r = new_ring(2);
    popper p = {.r = r, .timeout_ms = 20000, .got = 123};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, pop_thread, &p), 0);
    while (!atomic_load(&p.started))
        sched_yield();
    sf_ring_close(r);
    pthread_join(t, NULL);
    assert_int_equal(p.got, -1);
    assert_true(p.waited < 10.0); /* woken, not timed out */
    /* Closed for good: no new slot is handed out, pops do not block. */
    assert_int_equal(sf_ring_acquire(r), -1);
    double t0 = now_s();
    assert_int_equal(sf_ring_pop(r, 5000), -1);
    assert_true(now_s() - t0 < 1.0);
    sf_ring_destroy(r);
}

static void test_commit_wakes_a_blocked_pop_with_that_slot(void **state)
{
    (void)state;
    sf_ring *r = new_ring(2);
    popper p = {.r = r, .timeout_ms = 20000, .got = 123};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, pop_thread, &p), 0);
    while (!atomic_load(&p.started))
        sched_yield();
    int s = sf_ring_acquire(r);
    sf_ring_commit(r, s);
    pthread_join(t, NULL);
    assert_int_equal(p.got, s);
    assert_true(p.waited < 10.0);
    expect_counts(r, 1, 0, 0, 1);
    sf_ring_destroy(r);
}

static int freed_calls;
static void on_free(void *ctx)
{
    assert_ptr_equal(ctx, &freed_calls);
    freed_calls++;
}

static void test_on_free_runs_whenever_a_slot_becomes_free(void **state)
{
    (void)state;
    sf_ring *r = new_ring(2);
    freed_calls = 0;
    sf_ring_on_free(r, on_free, &freed_calls);
    int a = sf_ring_acquire(r);
    int b = sf_ring_acquire(r);
    assert_int_equal(freed_calls, 0);
    sf_ring_abort(r, a);
    assert_int_equal(freed_calls, 1);
    sf_ring_commit(r, b);
    assert_int_equal(sf_ring_pop(r, 0), b);
    assert_int_equal(freed_calls, 1); /* commit and pop free nothing */
    sf_ring_release(r, b);
    assert_int_equal(freed_calls, 2);
    sf_ring_destroy(r);
}

/* The callback runs outside the ring's lock: it may call back into the ring. */
static sf_ring *reentrant_ring;
static int reentrant_free_seen;
static void on_free_reenters(void *ctx)
{
    (void)ctx;
    int c[SF_SLOT_STATES];
    sf_ring_counts(reentrant_ring, c);
    reentrant_free_seen = c[SF_SLOT_FREE];
}

static void test_on_free_may_call_into_the_ring(void **state)
{
    (void)state;
    sf_ring *r = new_ring(2);
    reentrant_ring = r;
    sf_ring_on_free(r, on_free_reenters, NULL);
    int a = sf_ring_acquire(r);
    sf_ring_abort(r, a);
    assert_int_equal(reentrant_free_seen, 2);
    sf_ring_destroy(r);
}

/* ring.slot_bytes 0: one raw batch at the model's input size, at least 64
 * MiB, rounded up to MiB, at most the option's bound. */
static void test_auto_slot_bytes_hold_one_raw_batch_of_max_batch(void **state)
{
    (void)state;
    const uint64_t mib = (uint64_t)1 << 20, max = (uint64_t)16 << 30;
    /* W3: 1024 x 224x224x3 bytes + 1024 int64 labels = 147.0078 MiB -> 148 MiB */
    assert_true(sf_ring_auto_slot_bytes(1024, 3, 224, 224, 1, max) == 148 * mib);
    /* exactly 80 MiB of pixels and no label bytes beyond: 80 MiB */
    assert_true(sf_ring_auto_slot_bytes(80, 1, 1024, 1024, 0, max) == 80 * mib);
    /* small models keep 64 MiB: W1 256 x 256x256x3 (48.0 MiB), a segmentation map's labels */
    assert_true(sf_ring_auto_slot_bytes(256, 3, 256, 256, 1, max) == SF_RING_AUTO_MIN_BYTES);
    assert_true(sf_ring_auto_slot_bytes(8, 3, 256, 256, 256 * 256, max) == SF_RING_AUTO_MIN_BYTES);
    /* per-pixel int64 labels count: 32 x (3 + 8) x 512 x 512 = 88 MiB */
    assert_true(sf_ring_auto_slot_bytes(32, 3, 512, 512, 512 * 512, max) == 88 * mib);
    /* bounded by the option's maximum */
    assert_true(sf_ring_auto_slot_bytes(4096, 3, 4096, 4096, 1, max) == max);
    assert_true(sf_ring_auto_slot_bytes(0, 3, 224, 224, 1, max) == SF_RING_AUTO_MIN_BYTES);
}

static void test_slot_state_names(void **state)
{
    (void)state;
    assert_string_equal(sf_slot_state_name(SF_SLOT_FREE), "free");
    assert_string_equal(sf_slot_state_name(SF_SLOT_FILLING), "filling");
    assert_string_equal(sf_slot_state_name(SF_SLOT_READY), "ready");
    assert_string_equal(sf_slot_state_name(SF_SLOT_IN_FLIGHT), "in_flight");
    assert_string_equal(sf_slot_state_name(SF_SLOT_STATES), "unknown");
}

/* Producers and a consumer on threads: every committed slot is popped once. */
typedef struct flow {
    sf_ring *r;
    atomic_int produced, consumed;
    int per_producer;
} flow;

static void *producer(void *arg)
{
    flow *f = arg;
    for (int i = 0; i < f->per_producer;) {
        int s = sf_ring_acquire(f->r);
        if (s < 0) {
            sched_yield();
            continue;
        }
        sf_ring_commit(f->r, s);
        atomic_fetch_add(&f->produced, 1);
        i++;
    }
    return NULL;
}

static void test_producers_and_a_consumer_move_every_slot_exactly_once(void **state)
{
    (void)state;
    sf_ring *r = new_ring(3);
    flow f = {.r = r, .per_producer = 2000};
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, producer, &f);
    while (atomic_load(&f.consumed) < 3 * f.per_producer) {
        int s = sf_ring_pop(r, 1000);
        assert_true(s >= 0);
        sf_ring_release(r, s);
        atomic_fetch_add(&f.consumed, 1);
    }
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&f.produced), 3 * f.per_producer);
    expect_counts(r, 3, 0, 0, 0);
    sf_ring_destroy(r);
}

/* ---- jobs ------------------------------------------------------------------------- */

static void expect_invariant(sf_jobs *j)
{
    uint64_t c[SF_JOB_STATES], accepted;
    sf_jobs_counts(j, c, &accepted);
    uint64_t sum = 0;
    for (int s = 0; s < SF_JOB_STATES; s++)
        sum += c[s];
    assert_int_equal(accepted, sum);
}

static void test_job_ids_start_at_one_and_map_to_their_entry(void **state)
{
    (void)state;
    sf_jobs *j = sf_jobs_new(64);
    assert_int_equal(sf_jobs_last_id(j), 0);
    for (uint64_t i = 1; i <= 10; i++)
        assert_int_equal(sf_jobs_create(j, (int)i, (int)(i % 2)), i);
    assert_int_equal(sf_jobs_last_id(j), 10);
    sf_job job;
    assert_int_equal(sf_jobs_get(j, 7, &job), 0);
    assert_int_equal(job.id, 7);
    assert_int_equal(job.n, 7);
    assert_int_equal(job.kind, 1);
    assert_int_equal(job.state, SF_JOB_QUEUED);
    assert_int_equal(sf_jobs_get(j, 0, &job), -1);
    assert_int_equal(sf_jobs_get(j, 11, &job), -1);
    assert_int_equal(sf_jobs_get(j, 64 + 7, &job), -1); /* same entry, another id */
    sf_jobs_destroy(j);
}

static void test_a_new_job_evicts_the_one_cap_ids_older(void **state)
{
    (void)state;
    sf_jobs *j = sf_jobs_new(4);
    sf_job job;
    for (int i = 0; i < 4; i++) {
        uint64_t id = sf_jobs_create(j, 1, 0);
        sf_jobs_done(j, &(sf_job){.id = id, .loss = (double)id});
    }
    for (uint64_t id = 1; id <= 4; id++)
        assert_int_equal(sf_jobs_get(j, id, &job), 0);
    assert_int_equal(sf_jobs_create(j, 1, 0), 5); /* 5 % 4 == 1 % 4 */
    assert_int_equal(sf_jobs_get(j, 1, &job), -1);
    assert_int_equal(sf_jobs_get(j, 5, &job), 0);
    assert_int_equal(job.state, SF_JOB_QUEUED);
    for (uint64_t id = 2; id <= 4; id++) {
        assert_int_equal(sf_jobs_get(j, id, &job), 0);
        assert_true(job.loss == (double)id);
    }
    /* Updates of an evicted job are ignored and do not touch the new one. */
    sf_jobs_fail(j, 1, "late", "late");
    assert_int_equal(sf_jobs_get(j, 5, &job), 0);
    assert_int_equal(job.state, SF_JOB_QUEUED);
    /* Counts cover every job ever created, evicted or not. */
    uint64_t c[SF_JOB_STATES], accepted;
    sf_jobs_counts(j, c, &accepted);
    assert_int_equal(accepted, 5);
    assert_int_equal(c[SF_JOB_DONE], 4);
    assert_int_equal(c[SF_JOB_QUEUED], 1);
    expect_invariant(j);
    sf_jobs_destroy(j);
}

static void test_counts_always_sum_to_the_jobs_accepted(void **state)
{
    (void)state;
    sf_jobs *j = sf_jobs_new(64);
    for (int i = 0; i < 6; i++)
        sf_jobs_create(j, 2, 0);
    expect_invariant(j);
    sf_jobs_set_state(j, 1, SF_JOB_TRANSFORMING);
    sf_jobs_set_state(j, 2, SF_JOB_TRANSFORMING);
    sf_jobs_set_state(j, 2, SF_JOB_TRAINING);
    expect_invariant(j);
    sf_jobs_done(j, &(sf_job){.id = 2, .loss = 1.5, .step = 1});
    sf_jobs_fail(j, 3, "step_failed", "boom");
    sf_jobs_done(j, &(sf_job){.id = 4});
    expect_invariant(j);
    uint64_t c[SF_JOB_STATES], accepted;
    sf_jobs_counts(j, c, &accepted);
    assert_int_equal(accepted, 6);
    assert_int_equal(c[SF_JOB_QUEUED], 2);
    assert_int_equal(c[SF_JOB_TRANSFORMING], 1);
    assert_int_equal(c[SF_JOB_TRAINING], 0);
    assert_int_equal(c[SF_JOB_DONE], 2);
    assert_int_equal(c[SF_JOB_FAILED], 1);
    sf_jobs_destroy(j);
}

static void test_final_states_are_final(void **state)
{
    (void)state;
    sf_jobs *j = sf_jobs_new(64);
    uint64_t a = sf_jobs_create(j, 1, 0), b = sf_jobs_create(j, 1, 0);
    sf_jobs_done(j, &(sf_job){.id = a, .loss = 0.5});
    sf_jobs_fail(j, a, "x", "y");
    sf_jobs_set_state(j, a, SF_JOB_TRAINING);
    sf_jobs_done(j, &(sf_job){.id = a, .loss = 9});
    sf_job job;
    sf_jobs_get(j, a, &job);
    assert_int_equal(job.state, SF_JOB_DONE);
    assert_true(job.loss == 0.5);
    sf_jobs_fail(j, b, "step_failed", "a message");
    sf_jobs_done(j, &(sf_job){.id = b});
    sf_jobs_get(j, b, &job);
    assert_int_equal(job.state, SF_JOB_FAILED);
    assert_string_equal(job.err_code, "step_failed");
    assert_string_equal(job.err_msg, "a message");
    expect_invariant(j);
    sf_jobs_destroy(j);
}

static void test_done_copies_the_result_but_keeps_kind_and_acceptance_time(void **state)
{
    (void)state;
    sf_jobs *j = sf_jobs_new(64);
    uint64_t id = sf_jobs_create(j, 3, 1);
    sf_job before;
    sf_jobs_get(j, id, &before);
    assert_true(before.t_accepted_ns > 0);
    sf_jobs_done(j, &(sf_job){.id = id, .n = 3, .kind = 0, .step = 12, .loss = 0.25, .accuracy = 0.75,
                              .queue_s = 0.001, .step_s = 0.002});
    sf_job job;
    sf_jobs_get(j, id, &job);
    assert_int_equal(job.state, SF_JOB_DONE);
    assert_int_equal(job.kind, 1);
    assert_int_equal(job.t_accepted_ns, before.t_accepted_ns);
    assert_int_equal(job.step, 12);
    assert_true(job.loss == 0.25 && job.accuracy == 0.75 && job.queue_s == 0.001);
    sf_jobs_destroy(j);
}

static const cJSON *item(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    assert_non_null(v);
    return v;
}

static void test_job_json_has_numbers_when_done_and_nulls_before(void **state)
{
    (void)state;
    sf_job q = {.id = 3, .state = SF_JOB_QUEUED, .n = 4, .kind = 0};
    cJSON *o = sf_job_to_json(&q);
    assert_int_equal(item(o, "id")->valueint, 3);
    assert_string_equal(item(o, "state")->valuestring, "queued");
    assert_string_equal(item(o, "kind")->valuestring, "train");
    assert_true(cJSON_IsNull(item(o, "loss")) && cJSON_IsNull(item(o, "step")));
    assert_true(cJSON_IsNull(item(item(o, "timings"), "step_s")));
    assert_true(cJSON_IsNull(item(o, "error")));
    cJSON_Delete(o);

    sf_job d = {.id = 4, .state = SF_JOB_DONE, .n = 4, .kind = 0, .trained = 1, .step = 9, .loss = 0.5,
                .accuracy = 1, .queue_s = 0.25, .step_s = 0.125};
    o = sf_job_to_json(&d);
    assert_string_equal(item(o, "state")->valuestring, "done");
    assert_int_equal(item(o, "step")->valueint, 9);
    assert_true(item(o, "loss")->valuedouble == 0.5);
    assert_true(item(item(o, "timings"), "queue_s")->valuedouble == 0.25);
    assert_true(item(item(o, "timings"), "step_s")->valuedouble == 0.125);
    cJSON_Delete(o);

    /* Done without a step (sink mode): no loss to report. */
    sf_job sink = {.id = 7, .state = SF_JOB_DONE, .n = 2, .kind = 0, .queue_s = 0.5};
    o = sf_job_to_json(&sink);
    assert_true(cJSON_IsNull(item(o, "loss")) && cJSON_IsNull(item(o, "step")));
    assert_true(item(item(o, "timings"), "queue_s")->valuedouble == 0.5);
    cJSON_Delete(o);

    sf_job t = {.id = 5, .state = SF_JOB_DONE, .n = 1, .kind = 1, .transform_s = 0.5};
    o = sf_job_to_json(&t);
    assert_string_equal(item(o, "kind")->valuestring, "transform");
    assert_true(cJSON_IsNull(item(o, "loss")) && cJSON_IsNull(item(item(o, "timings"), "step_s")));
    assert_true(item(item(o, "timings"), "transform_s")->valuedouble == 0.5);
    cJSON_Delete(o);

    sf_job f = {.id = 6, .state = SF_JOB_FAILED, .n = 1};
    snprintf(f.err_code, sizeof f.err_code, "step_failed");
    snprintf(f.err_msg, sizeof f.err_msg, "no");
    o = sf_job_to_json(&f);
    assert_string_equal(item(o, "state")->valuestring, "failed");
    assert_string_equal(item(item(o, "error"), "code")->valuestring, "step_failed");
    assert_string_equal(item(item(o, "error"), "message")->valuestring, "no");
    cJSON_Delete(o);
}

static void test_job_state_names(void **state)
{
    (void)state;
    const char *want[] = {"queued", "transforming", "training", "done", "failed"};
    for (int s = 0; s < SF_JOB_STATES; s++)
        assert_string_equal(sf_job_state_name((sf_job_state)s), want[s]);
    assert_string_equal(sf_job_state_name(SF_JOB_STATES), "unknown");
}

static void *create_many(void *arg)
{
    for (int i = 0; i < 1000; i++)
        sf_jobs_create(arg, 1, 0);
    return NULL;
}

static void test_concurrent_creates_get_unique_ids(void **state)
{
    (void)state;
    sf_jobs *j = sf_jobs_new(8192);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, create_many, j);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(sf_jobs_last_id(j), 4000);
    sf_job job;
    for (uint64_t id = 1; id <= 4000; id++) {
        assert_int_equal(sf_jobs_get(j, id, &job), 0);
        assert_int_equal(job.id, id);
    }
    expect_invariant(j);
    sf_jobs_destroy(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_allocates_every_slot_once_and_frees_them_on_destroy),
        cmocka_unit_test(test_a_slot_moves_free_filling_ready_in_flight_free),
        cmocka_unit_test(test_acquire_returns_minus_one_when_no_slot_is_free_and_clears_the_meta),
        cmocka_unit_test(test_ready_slots_pop_in_commit_order_not_acquire_order),
        cmocka_unit_test(test_pop_times_out_with_minus_one_after_the_timeout),
        cmocka_unit_test(test_close_wakes_a_blocked_pop_for_good),
        cmocka_unit_test(test_commit_wakes_a_blocked_pop_with_that_slot),
        cmocka_unit_test(test_on_free_runs_whenever_a_slot_becomes_free),
        cmocka_unit_test(test_on_free_may_call_into_the_ring),
        cmocka_unit_test(test_auto_slot_bytes_hold_one_raw_batch_of_max_batch),
        cmocka_unit_test(test_slot_state_names),
        cmocka_unit_test(test_producers_and_a_consumer_move_every_slot_exactly_once),
        cmocka_unit_test(test_job_ids_start_at_one_and_map_to_their_entry),
        cmocka_unit_test(test_a_new_job_evicts_the_one_cap_ids_older),
        cmocka_unit_test(test_counts_always_sum_to_the_jobs_accepted),
        cmocka_unit_test(test_final_states_are_final),
        cmocka_unit_test(test_done_copies_the_result_but_keeps_kind_and_acceptance_time),
        cmocka_unit_test(test_job_json_has_numbers_when_done_and_nulls_before),
        cmocka_unit_test(test_job_state_names),
        cmocka_unit_test(test_concurrent_creates_get_unique_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
