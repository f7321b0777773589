/* tests/unit/test_evals.c — the named evaluations (server/evals.c): a name
 * reserved by its batches, each pending until it ends once (added or
 * failed); a delete refused while any is pending and otherwise freeing the
 * name's place for another; a deleted name made again from zero; the bound
 * of eval.max_names, and the least recently used idle name evicted for a
 * new one; the metrics hooks, run under the lock and before a
 * batch stops being pending; no batch lost to a delete racing the
 * engine; and the engine (server/engine.c, on a stub backend) ending every
 * accepted eval batch of its evaluation once, whatever became of the
 * records it keeps by batch id. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <time.h>

#include "gpu/backend.h"
#include "server/app.h"
#include "server/engine.h"
#include "server/evals.h"
#include "server/jobs.h"
#include "server/ring.h"

static int names_in(sf_evals *e, char *out, size_t cap)
{
    cJSON *o = sf_evals_list_json(e);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "evals");
    size_t len = 0;
    out[0] = '\0';
    const cJSON *it;
    int n = 0;
    cJSON_ArrayForEach(it, arr)
    {
        const char *name = cJSON_GetObjectItemCaseSensitive(it, "name")->valuestring;
        len += (size_t)snprintf(out + len, cap - len, "%s%s", n ? "," : "", name);
        n++;
    }
    cJSON_Delete(o);
    return n;
}

/* Batches of name accepted and not yet ended, as GET shows them (0 when
 * unknown). */
static uint64_t pending_of(sf_evals *e, const char *name)
{
    sf_eval_agg a;
    return sf_evals_get(e, name, &a) ? 0 : a.pending;
}

static void test_a_reserved_batch_is_pending_until_it_is_added_or_failed(void **state)
{
    (void)state;
    sf_evals *e = sf_evals_new(4);
    assert_int_equal(pending_of(e, "a"), 0);
    assert_int_equal(sf_evals_reserve(e, "a", SF_EVALS_NEVER_EVICT), 0);
    assert_int_equal(sf_evals_reserve(e, "a", SF_EVALS_NEVER_EVICT), 0);
    assert_int_equal(sf_evals_reserve(e, "a", SF_EVALS_NEVER_EVICT), 0);
    assert_int_equal(pending_of(e, "a"), 3);
    sf_evals_add(e, "a", 2, 2, 1.5, 1, 2, 7);
    sf_evals_add_failed(e, "a");
    assert_int_equal(pending_of(e, "a"), 1);
    sf_eval_agg g;
    assert_int_equal(sf_evals_get(e, "a", &g), 0);
    assert_int_equal(g.batches, 1);
    assert_int_equal(g.failed, 1);
    assert_int_equal(g.pending, 1);
    sf_evals_add(e, "a", 2, 2, 0.5, 2, 2, 8);
    assert_int_equal(pending_of(e, "a"), 0);
    /* A batch ends once: one more end does not wrap the count below zero
     * (which would keep the name from ever being deleted). */
    sf_evals_add_failed(e, "a");
    assert_int_equal(pending_of(e, "a"), 0);
    sf_evals_destroy(e);
}

static void test_a_delete_with_batches_pending_is_refused_and_changes_nothing(void **state)
{
    (void)state;
    sf_evals *e = sf_evals_new(4);
    assert_int_equal(sf_evals_reserve(e, "a", SF_EVALS_NEVER_EVICT), 0);
    sf_evals_add(e, "a", 4, 4, 2.0, 1, 3, 5);
    assert_int_equal(sf_evals_reserve(e, "a", SF_EVALS_NEVER_EVICT), 0);
    assert_int_equal(sf_evals_reserve(e, "a", SF_EVALS_NEVER_EVICT), 0);
    sf_eval_agg out;
    assert_int_equal(sf_evals_delete(e, "a", &out), SF_EVAL_BUSY);
    assert_int_equal(out.pending, 2);
    sf_eval_agg g;
    assert_int_equal(sf_evals_get(e, "a", &g), 0);
    assert_int_equal(g.batches, 1);
    assert_int_equal(g.pending, 2);
    sf_evals_add(e, "a", 4, 4, 1.0, 4, 4, 6);
    assert_int_equal(sf_evals_delete(e, "a", &out), SF_EVAL_BUSY);
    assert_int_equal(out.pending, 1);
    sf_evals_add_failed(e, "a");
    /* Now it goes, and the reply is the evaluation as it ended. */
    assert_int_equal(sf_evals_delete(e, "a", &out), SF_EVAL_DELETED);
    assert_string_equal(out.name, "a");
    assert_int_equal(out.batches, 2);
    assert_int_equal(out.samples, 8);
    assert_int_equal(out.failed, 1);
    assert_int_equal(out.correct1, 5);
    assert_int_equal(out.first_step, 5);
    assert_int_equal(out.last_step, 6);
    assert_true(out.loss_sum == 12.0);
    assert_int_equal(out.pending, 0);
    assert_int_equal(sf_evals_get(e, "a", &g), -1);
    assert_int_equal(sf_evals_delete(e, "a", &out), SF_EVAL_UNKNOWN);
    assert_int_equal(sf_evals_delete(e, "nobody", &out), SF_EVAL_UNKNOWN);
    sf_evals_destroy(e);
}

static void test_a_deleted_name_frees_its_place_and_comes_back_from_zero(void **state)
{
    (void)state;
    sf_evals *e = sf_evals_new(3);
    const char *names[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sf_evals_reserve(e, names[i], SF_EVALS_NEVER_EVICT), 0);
        sf_evals_add(e, names[i], 1, 1, 1.0, 1, 1, (uint64_t)i);
    }
    /* Full: one more name is refused, by the early test and the reservation,
     * and the refusal leaves nothing pending. */
    assert_int_equal(sf_evals_has_room(e, "d", SF_EVALS_NEVER_EVICT), 0);
    assert_int_equal(sf_evals_reserve(e, "d", SF_EVALS_NEVER_EVICT), -1);
    assert_int_equal(pending_of(e, "d"), 0);
    assert_int_equal(sf_evals_has_room(e, "b", SF_EVALS_NEVER_EVICT), 1);

    sf_eval_agg out;
    assert_int_equal(sf_evals_delete(e, "b", &out), SF_EVAL_DELETED);
    char list[64];
    /* The others keep their order. */
    assert_int_equal(names_in(e, list, sizeof list), 2);
    assert_string_equal(list, "a,c");
    assert_int_equal(sf_evals_has_room(e, "d", SF_EVALS_NEVER_EVICT), 1);
    assert_int_equal(sf_evals_reserve(e, "d", SF_EVALS_NEVER_EVICT), 0);
    assert_int_equal(names_in(e, list, sizeof list), 3);
    assert_string_equal(list, "a,c,d");
    assert_int_equal(sf_evals_reserve(e, "b", SF_EVALS_NEVER_EVICT), -1);

    /* Made again after a delete, a name starts from zero. */
    sf_evals_add(e, "d", 1, 1, 1.0, 1, 1, 9);
    assert_int_equal(sf_evals_delete(e, "c", &out), SF_EVAL_DELETED);
    assert_int_equal(sf_evals_reserve(e, "b", SF_EVALS_NEVER_EVICT), 0);
    sf_eval_agg g;
    assert_int_equal(sf_evals_get(e, "b", &g), 0);
    assert_int_equal(g.batches, 0);
    assert_int_equal(g.samples, 0);
    assert_int_equal(g.failed, 0);
    assert_int_equal(g.pending, 1);
    sf_evals_add(e, "b", 2, 2, 3.0, 0, 1, 11);
    assert_int_equal(sf_evals_get(e, "b", &g), 0);
    assert_int_equal(g.batches, 1);
    assert_int_equal(g.first_step, 11);
    assert_true(g.loss_sum == 6.0);
    sf_evals_destroy(e);
}

static int evictions;
static char last_evicted[SF_EVAL_NAME_MAX + 1];
static void count_eviction(void *ctx, const char *name)
{
    (void)ctx;
    evictions++;
    snprintf(last_evicted, sizeof last_evicted, "%s", name);
}

static void test_a_new_name_evicts_the_least_recently_used_idle_one_never_one_with_batches_pending(void **state)
{
    (void)state;
    sf_evals *e = sf_evals_new(3);
    const sf_evals_hooks hooks = {.evicted = count_eviction};
    sf_evals_set_hooks(e, &hooks);
    evictions = 0;
    const uint64_t any_idle = 0;
    assert_int_equal(sf_evals_reserve(e, "a", any_idle), 0);
    assert_int_equal(sf_evals_reserve(e, "b", any_idle), 0);
    assert_int_equal(sf_evals_reserve(e, "c", any_idle), 0);
    /* Every one has a batch pending: none may go. */
    assert_int_equal(sf_evals_has_room(e, "d", any_idle), 0);
    assert_int_equal(sf_evals_reserve(e, "d", any_idle), -1);
    sf_evals_add(e, "a", 1, 1, 1.0, 1, 1, 1);
    sf_evals_add(e, "b", 1, 1, 1.0, 1, 1, 2);
    sf_evals_add_failed(e, "c");
    /* A read is a use: a, read after b ended, is no longer the oldest. */
    sf_eval_agg g;
    assert_int_equal(sf_evals_get(e, "a", &g), 0);
    /* A bound not yet reached evicts nothing. */
    assert_int_equal(sf_evals_has_room(e, "d", 3600ull * 1000000000ull), 0);
    assert_int_equal(sf_evals_reserve(e, "d", 3600ull * 1000000000ull), -1);
    assert_int_equal(sf_evals_reserve(e, "d", SF_EVALS_NEVER_EVICT), -1);
    assert_int_equal(evictions, 0);
    assert_int_equal(sf_evals_has_room(e, "d", any_idle), 1);
    assert_int_equal(sf_evals_reserve(e, "d", any_idle), 0);
    assert_int_equal(evictions, 1);
    assert_string_equal(last_evicted, "b");
    assert_int_equal(sf_evals_get(e, "b", &g), -1);
    char list[64];
    assert_int_equal(names_in(e, list, sizeof list), 3);
    assert_string_equal(list, "a,c,d");
    sf_evals_destroy(e);
}

static void test_every_place_can_be_freed_and_taken_again(void **state)
{
    (void)state;
    enum { MAX = 16 };
    sf_evals *e = sf_evals_new(MAX);
    char name[16];
    /* Epochs: a new name each, deleted once finished; never refused. */
    for (int epoch = 0; epoch < 5 * MAX; epoch++) {
        snprintf(name, sizeof name, "epoch-%d", epoch);
        assert_int_equal(sf_evals_reserve(e, name, SF_EVALS_NEVER_EVICT), 0);
        sf_evals_add(e, name, 1, 1, 1.0, 1, 1, (uint64_t)epoch);
        /* Keep the last few: the list is full at times. */
        if (epoch >= MAX - 1) {
            snprintf(name, sizeof name, "epoch-%d", epoch - (MAX - 1));
            assert_int_equal(sf_evals_delete(e, name, NULL), SF_EVAL_DELETED);
        }
    }
    char list[512];
    assert_int_equal(names_in(e, list, sizeof list), MAX - 1);
    sf_evals_destroy(e);
}

/* The hooks see each batch's aggregates with the batch still pending (so a
 * delete cannot run between publishing and ending it), and the name of a
 * deleted evaluation. */
typedef struct hook_log {
    int published, forgotten;
    uint64_t pending_at_publish, batches_at_publish, batch_samples;
    char forgot[SF_EVAL_NAME_MAX + 1];
} hook_log;

static void on_publish(void *ctx, const sf_eval_agg *a, uint64_t batch_samples)
{
    hook_log *l = ctx;
    l->published++;
    l->pending_at_publish = a->pending;
    l->batches_at_publish = a->batches;
    l->batch_samples = batch_samples;
}

static void on_forget(void *ctx, const char *name)
{
    hook_log *l = ctx;
    l->forgotten++;
    snprintf(l->forgot, sizeof l->forgot, "%s", name);
}

static void test_the_hooks_publish_before_the_batch_ends_and_forget_on_delete(void **state)
{
    (void)state;
    hook_log log = {0};
    sf_evals *e = sf_evals_new(2);
    const sf_evals_hooks hooks = {.publish = on_publish, .forget = on_forget, .ctx = &log};
    sf_evals_set_hooks(e, &hooks);
    assert_int_equal(sf_evals_reserve(e, "x", SF_EVALS_NEVER_EVICT), 0);
    sf_evals_add(e, "x", 3, 3 * 64, 1.0, 1, 1, 1);
    assert_int_equal(log.published, 1);
    assert_int_equal(log.pending_at_publish, 1);
    assert_int_equal(log.batches_at_publish, 1);
    assert_int_equal(log.batch_samples, 3);
    /* A failed batch has no result to publish. */
    assert_int_equal(sf_evals_reserve(e, "x", SF_EVALS_NEVER_EVICT), 0);
    sf_evals_add_failed(e, "x");
    assert_int_equal(log.published, 1);
    /* Neither a busy nor an unknown delete forgets anything. */
    assert_int_equal(sf_evals_reserve(e, "x", SF_EVALS_NEVER_EVICT), 0);
    assert_int_equal(sf_evals_delete(e, "x", NULL), SF_EVAL_BUSY);
    assert_int_equal(sf_evals_delete(e, "y", NULL), SF_EVAL_UNKNOWN);
    assert_int_equal(log.forgotten, 0);
    sf_evals_add_failed(e, "x");
    assert_int_equal(sf_evals_delete(e, "x", NULL), SF_EVAL_DELETED);
    assert_int_equal(log.forgotten, 1);
    assert_string_equal(log.forgot, "x");
    sf_evals_destroy(e);
}

/* HTTP threads accept batches of one name (reserve), the engine ends them
 * (add), a client deletes the evaluation whenever it can: every batch is
 * counted in exactly one of the evaluations that name had. */
enum { THREADS = 3, BATCHES = 20000 };
static atomic_int racers_done;

static void *accept_and_finish(void *arg)
{
    sf_evals *e = arg;
    for (int i = 0; i < BATCHES; i++) {
        assert_int_equal(sf_evals_reserve(e, "epoch", SF_EVALS_NEVER_EVICT), 0);
        if (i % 3 == 0)
            sf_evals_add_failed(e, "epoch");
        else
            sf_evals_add(e, "epoch", 1, 1, 1.0, 1, 1, (uint64_t)i);
    }
    atomic_fetch_add(&racers_done, 1);
    return NULL;
}

static void test_no_batch_is_lost_to_a_delete_racing_the_engine(void **state)
{
    (void)state;
    sf_evals *e = sf_evals_new(1);
    atomic_store(&racers_done, 0);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, accept_and_finish, e);
    uint64_t batches = 0, failed = 0, deletes = 0, busy = 0;
    for (;;) {
        const int done = atomic_load(&racers_done) == THREADS;
        sf_eval_agg out;
        sf_eval_delete_rc rc = sf_evals_delete(e, "epoch", &out);
        if (rc == SF_EVAL_DELETED) {
            batches += out.batches;
            failed += out.failed;
            deletes++;
        } else if (rc == SF_EVAL_BUSY) {
            assert_true(out.pending > 0 && out.pending <= THREADS);
            busy++;
        }
        if (done && rc == SF_EVAL_UNKNOWN)
            break;
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(batches + failed, (uint64_t)THREADS * BATCHES);
    assert_true(deletes >= 1);
    print_message("deletes %llu, refused busy %llu\n", (unsigned long long)deletes, (unsigned long long)busy);
    sf_evals_destroy(e);
}


/* ---- the engine ends each eval batch once ------------------------------- */

/* A backend whose steps finish when the test says: every batch yields its
 * SLOT_FREE at once and its STEP_DONE, in submission order, once released. */
enum { STUB_MAX = 256 };
static struct {
    pthread_mutex_t mu;
    uint64_t id[STUB_MAX];
    void *token[STUB_MAX];
    int n[STUB_MAX], eval[STUB_MAX], freed[STUB_MAX];
    int count, done;        /* submitted; STEP_DONE given */
    uint64_t released_upto; /* STEP_DONE may go for ids <= this */
} stub = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int stub_max_inflight(sf_backend *be) { return 3; }

static int stub_submit(sf_backend *be, const sf_batch *b, char *err, size_t errlen)
{
    pthread_mutex_lock(&stub.mu);
    const int i = stub.count++;
    stub.id[i] = b->id;
    stub.token[i] = b->token;
    stub.n[i] = b->n;
    stub.eval[i] = b->eval;
    stub.freed[i] = 0;
    pthread_mutex_unlock(&stub.mu);
    return 0;
}

static int stub_poll(sf_backend *be, sf_event *ev, int max, int timeout_us)
{
    int k = 0;
    pthread_mutex_lock(&stub.mu);
    for (int i = 0; i < stub.count && k < max; i++) {
        if (!stub.freed[i]) {
            stub.freed[i] = 1;
            ev[k++] = (sf_event){.kind = SF_EV_SLOT_FREE, .id = stub.id[i], .token = stub.token[i]};
        }
    }
    while (stub.done < stub.count && stub.id[stub.done] <= stub.released_upto && k < max) {
        const int i = stub.done++;
        ev[k++] = (sf_event){.kind = SF_EV_STEP_DONE, .id = stub.id[i], .token = stub.token[i], .n = stub.n[i],
                             .loss = 1.0f, .correct = stub.n[i], .correct5 = stub.n[i], .eval = stub.eval[i]};
    }
    pthread_mutex_unlock(&stub.mu);
    if (!k) {
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return k;
}

static int stub_health(sf_backend *be, char *err, size_t errlen) { return 0; }

static const sf_backend_i stub_i = {.max_inflight = stub_max_inflight, .submit = stub_submit,
                                    .poll = stub_poll, .health = stub_health};
static sf_backend stub_backend = {&stub_i, NULL};
static sf_app app;

static void *slot_alloc(void *ctx, size_t bytes) { return aligned_alloc(64, (bytes + 63) & ~(size_t)63); }
static void slot_free(void *ctx, void *p) { free(p); }

static void sleep_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* What an upload does once it accepts a batch (server/upload.c): its job,
 * its evaluation reserved, the slot READY. n over model.max_batch makes a
 * batch the engine fails before the backend sees it. */
static uint64_t accept_batch(int eval, const char *name, int n)
{
    int slot;
    for (int tries = 0; (slot = sf_ring_acquire(app.ring)) < 0; tries++) {
        assert_true(tries < 10000);
        sleep_ms(1);
    }
    sf_slot_meta *m = sf_ring_meta(app.ring, slot);
    memset(m, 0, sizeof *m);
    m->kind = 0;
    m->eval = eval;
    snprintf(m->eval_name, sizeof m->eval_name, "%s", eval ? name : "");
    m->n = n;
    m->h = m->w = 8;
    m->c = 1;
    m->nhwc = 1;
    m->label_dtype = -1;
    m->used = (size_t)n * 64;
    if (eval)
        assert_int_equal(sf_evals_reserve(app.evals, name, SF_EVALS_NEVER_EVICT), 0);
    m->job_id = sf_jobs_create(app.jobs, n, eval ? SF_JOB_KIND_EVAL : 0);
    if (eval)
        sf_jobs_set_eval_name(app.jobs, m->job_id, name);
    m->t_ready_ns = m->t_filling_ns = 1;
    sf_ring_commit(app.ring, slot);
    return m->job_id;
}

static int job_state(uint64_t id)
{
    sf_job j;
    return sf_jobs_get(app.jobs, id, &j) == 0 ? (int)j.state : -1;
}

static void wait_state(uint64_t id, int state)
{
    for (int tries = 0; job_state(id) != state; tries++) {
        assert_true(tries < 10000);
        sleep_ms(1);
    }
}

/* An eval batch in flight through a long step while PENDING_RECS (64) ids
 * pass (transforms, batches refused at once: none waits for the step), the
 * last of them a batch submitted beside it, which takes its engine record;
 * with pipeline.jobs_max 64 (the least allowed) the job table forgot it too.
 * It must still end its evaluation: a name with a batch pending for good
 * could never be deleted. */
static void test_the_engine_ends_an_eval_batch_whose_records_were_taken(void **state)
{
    (void)state;
    sf_config_defaults(&app.cfg);
    app.cfg.model.max_batch = 4;
    app.cfg.pipeline.jobs_max = 64;
    sf_config_live_init(&app.cfg);
    char err[256];
    const char *aug = "[{\"op\":\"to_dtype\",\"scale\":0.00392157},{\"op\":\"normalize\",\"mean\":[0.5],\"std\":[0.25]}]";
    assert_int_equal(sf_aug_parse(aug, &app.aug, err, sizeof err), 0);
    assert_int_equal(sf_aug_parse(aug, &app.aug_eval, err, sizeof err), 0);
    sf_app_metrics_init(&app);
    app.ring = sf_ring_new(4, 4096, slot_alloc, slot_free, NULL);
    app.jobs = sf_jobs_new(app.cfg.pipeline.jobs_max);
    app.evals = sf_evals_new(4);
    sf_app_evals_attach(&app);
    atomic_store(&app.backend_ok, 1);
    app.backend = &stub_backend;
    const sf_engine_ctx ctx = {
        .app = &app, .cfg = &app.cfg, .model = &app.model, .aug = &app.aug, .aug_eval = &app.aug_eval,
        .backend = app.backend, .ring = app.ring, .jobs = app.jobs, .evals = app.evals,
        .http = &app.http, .m = &app.m, .step = &app.step, .restore_gen = &app.restore_gen,
        .nonfinite_in_row = &app.nonfinite_in_row, .diverged = &app.diverged, .draining = &app.draining,
        .backend_ok = &app.backend_ok};
    sf_engine *e = sf_engine_start(&ctx, err, sizeof err);
    assert_non_null(e);

    const uint64_t held = accept_batch(1, "held", 2);
    wait_state(held, SF_JOB_TRAINING); /* submitted; its step does not end yet */
    uint64_t last = held;
    while (last < held + 63)
        wait_state(last = accept_batch(0, NULL, 99), SF_JOB_FAILED); /* over model.max_batch */
    const uint64_t beside = accept_batch(0, NULL, 2);
    assert_int_equal(beside % 64, held % 64);
    wait_state(beside, SF_JOB_TRAINING);

    pthread_mutex_lock(&stub.mu);
    stub.released_upto = beside;
    pthread_mutex_unlock(&stub.mu);
    wait_state(beside, SF_JOB_DONE);

    sf_eval_agg a;
    assert_int_equal(sf_evals_get(app.evals, "held", &a), 0);
    assert_int_equal(a.pending, 0);
    assert_int_equal(a.batches, 1);
    assert_int_equal(a.samples, 2);
    assert_int_equal(sf_evals_delete(app.evals, "held", NULL), SF_EVAL_DELETED);

    sf_engine_stop(e);
    sf_evals_destroy(app.evals);
    sf_jobs_destroy(app.jobs);
    sf_ring_destroy(app.ring);
    sf_metrics_reset();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_reserved_batch_is_pending_until_it_is_added_or_failed),
        cmocka_unit_test(test_a_delete_with_batches_pending_is_refused_and_changes_nothing),
        cmocka_unit_test(test_a_deleted_name_frees_its_place_and_comes_back_from_zero),
        cmocka_unit_test(test_a_new_name_evicts_the_least_recently_used_idle_one_never_one_with_batches_pending),
        cmocka_unit_test(test_every_place_can_be_freed_and_taken_again),
        cmocka_unit_test(test_the_hooks_publish_before_the_batch_ends_and_forget_on_delete),
        cmocka_unit_test(test_no_batch_is_lost_to_a_delete_racing_the_engine),
        cmocka_unit_test(test_the_engine_ends_an_eval_batch_whose_records_were_taken),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
