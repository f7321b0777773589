/* tests/unit/test_evals.c — the named evaluations (server/evals.c): a name
 * reserved by its batches, each pending until it ends once (added or
 * failed); a delete refused while any is pending and otherwise freeing the
 * name's place for another; a deleted name made again from zero; the bound
 * of eval.max_names; the metrics hooks, run under the lock and before a
 * batch stops being pending; and no batch lost to a delete racing the
 * engine. */
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

#include "server/evals.h"

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

static void test_a_reserved_batch_is_pending_until_it_is_added_or_failed(void **state)
{
    (void)state;
    sf_evals *e = sf_evals_new(4);
    assert_int_equal(sf_evals_pending(e, "a"), 0);
    assert_int_equal(sf_evals_reserve(e, "a"), 0);
    assert_int_equal(sf_evals_reserve(e, "a"), 0);
    assert_int_equal(sf_evals_reserve(e, "a"), 0);
    assert_int_equal(sf_evals_pending(e, "a"), 3);
    sf_evals_add(e, "a", 2, 2, 1.5, 1, 2, 7);
    sf_evals_add_failed(e, "a");
    assert_int_equal(sf_evals_pending(e, "a"), 1);
    sf_eval_agg g;
    assert_int_equal(sf_evals_get(e, "a", &g), 0);
    assert_int_equal(g.batches, 1);
    assert_int_equal(g.failed, 1);
    assert_int_equal(g.pending, 1);
    sf_evals_add(e, "a", 2, 2, 0.5, 2, 2, 8);
    assert_int_equal(sf_evals_pending(e, "a"), 0);
    /* A batch ends once: one more end does not wrap the count below zero
     * (which would keep the name from ever being deleted). */
    sf_evals_add_failed(e, "a");
    assert_int_equal(sf_evals_pending(e, "a"), 0);
    sf_evals_destroy(e);
}

static void test_a_delete_with_batches_pending_is_refused_and_changes_nothing(void **state)
{
    (void)state;
    sf_evals *e = sf_evals_new(4);
    assert_int_equal(sf_evals_reserve(e, "a"), 0);
    sf_evals_add(e, "a", 4, 4, 2.0, 1, 3, 5);
    assert_int_equal(sf_evals_reserve(e, "a"), 0);
    assert_int_equal(sf_evals_reserve(e, "a"), 0);
    sf_eval_agg out;
    uint64_t pending = 0;
    assert_int_equal(sf_evals_delete(e, "a", &out, &pending), SF_EVAL_BUSY);
    assert_int_equal(pending, 2);
    sf_eval_agg g;
    assert_int_equal(sf_evals_get(e, "a", &g), 0);
    assert_int_equal(g.batches, 1);
    assert_int_equal(g.pending, 2);
    sf_evals_add(e, "a", 4, 4, 1.0, 4, 4, 6);
    assert_int_equal(sf_evals_delete(e, "a", &out, &pending), SF_EVAL_BUSY);
    assert_int_equal(pending, 1);
    sf_evals_add_failed(e, "a");
    /* Now it goes, and the reply is the evaluation as it ended. */
    assert_int_equal(sf_evals_delete(e, "a", &out, &pending), SF_EVAL_DELETED);
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
    assert_int_equal(sf_evals_delete(e, "a", &out, &pending), SF_EVAL_UNKNOWN);
    assert_int_equal(sf_evals_delete(e, "nobody", &out, &pending), SF_EVAL_UNKNOWN);
    sf_evals_destroy(e);
}

static void test_a_deleted_name_frees_its_place_and_comes_back_from_zero(void **state)
{
    (void)state;
    sf_evals *e = sf_evals_new(3);
    const char *names[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sf_evals_reserve(e, names[i]), 0);
        sf_evals_add(e, names[i], 1, 1, 1.0, 1, 1, (uint64_t)i);
    }
    /* Full: one more name is refused, by the early test and the reservation,
     * and the refusal leaves nothing pending. */
    assert_int_equal(sf_evals_has_room(e, "d"), 0);
    assert_int_equal(sf_evals_reserve(e, "d"), -1);
    assert_int_equal(sf_evals_pending(e, "d"), 0);
    assert_int_equal(sf_evals_has_room(e, "b"), 1);

    sf_eval_agg out;
    assert_int_equal(sf_evals_delete(e, "b", &out, NULL), SF_EVAL_DELETED);
    char list[64];
    /* The others keep their order. */
    assert_int_equal(names_in(e, list, sizeof list), 2);
    assert_string_equal(list, "a,c");
    assert_int_equal(sf_evals_has_room(e, "d"), 1);
    assert_int_equal(sf_evals_reserve(e, "d"), 0);
    assert_int_equal(names_in(e, list, sizeof list), 3);
    assert_string_equal(list, "a,c,d");
    assert_int_equal(sf_evals_reserve(e, "b"), -1);

    /* Made again after a delete, a name starts from zero. */
    sf_evals_add(e, "d", 1, 1, 1.0, 1, 1, 9);
    assert_int_equal(sf_evals_delete(e, "c", &out, NULL), SF_EVAL_DELETED);
    assert_int_equal(sf_evals_reserve(e, "b"), 0);
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

static void test_every_place_can_be_freed_and_taken_again(void **state)
{
    (void)state;
    enum { MAX = 16 };
    sf_evals *e = sf_evals_new(MAX);
    char name[16];
    /* Epochs: a new name each, deleted once finished; never refused. */
    for (int epoch = 0; epoch < 5 * MAX; epoch++) {
        snprintf(name, sizeof name, "epoch-%d", epoch);
        assert_int_equal(sf_evals_reserve(e, name), 0);
        sf_evals_add(e, name, 1, 1, 1.0, 1, 1, (uint64_t)epoch);
        /* Keep the last few: the list is full at times. */
        if (epoch >= MAX - 1) {
            snprintf(name, sizeof name, "epoch-%d", epoch - (MAX - 1));
            assert_int_equal(sf_evals_delete(e, name, NULL, NULL), SF_EVAL_DELETED);
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
    const sf_evals_hooks hooks = {on_publish, on_forget, &log};
    sf_evals_set_hooks(e, &hooks);
    assert_int_equal(sf_evals_reserve(e, "x"), 0);
    sf_evals_add(e, "x", 3, 3 * 64, 1.0, 1, 1, 1);
    assert_int_equal(log.published, 1);
    assert_int_equal(log.pending_at_publish, 1);
    assert_int_equal(log.batches_at_publish, 1);
    assert_int_equal(log.batch_samples, 3);
    /* A failed batch has no result to publish. */
    assert_int_equal(sf_evals_reserve(e, "x"), 0);
    sf_evals_add_failed(e, "x");
    assert_int_equal(log.published, 1);
    /* Neither a busy nor an unknown delete forgets anything. */
    assert_int_equal(sf_evals_reserve(e, "x"), 0);
    assert_int_equal(sf_evals_delete(e, "x", NULL, NULL), SF_EVAL_BUSY);
    assert_int_equal(sf_evals_delete(e, "y", NULL, NULL), SF_EVAL_UNKNOWN);
    assert_int_equal(log.forgotten, 0);
    sf_evals_add_failed(e, "x");
    assert_int_equal(sf_evals_delete(e, "x", NULL, NULL), SF_EVAL_DELETED);
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
        assert_int_equal(sf_evals_reserve(e, "epoch"), 0);
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
        uint64_t pending;
        sf_eval_delete_rc rc = sf_evals_delete(e, "epoch", &out, &pending);
        if (rc == SF_EVAL_DELETED) {
            batches += out.batches;
            failed += out.failed;
            deletes++;
        } else if (rc == SF_EVAL_BUSY) {
            assert_true(pending > 0 && pending <= THREADS);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_reserved_batch_is_pending_until_it_is_added_or_failed),
        cmocka_unit_test(test_a_delete_with_batches_pending_is_refused_and_changes_nothing),
        cmocka_unit_test(test_a_deleted_name_frees_its_place_and_comes_back_from_zero),
        cmocka_unit_test(test_every_place_can_be_freed_and_taken_again),
        cmocka_unit_test(test_the_hooks_publish_before_the_batch_ends_and_forget_on_delete),
        cmocka_unit_test(test_no_batch_is_lost_to_a_delete_racing_the_engine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
