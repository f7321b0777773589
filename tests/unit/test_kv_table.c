/* tests/unit/test_kv_table.c — rank 0's rendezvous store (collective/kv_table.c):
 * its bounds (only the keys the job writes, value size, room for every one of
 * those keys), replacing a key, and a get that waits for a put or times out. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "collective/kv_table.h"

/* The tables here are for a job of WORLD ranks; values of at most MAX_VALUE
 * bytes (a job sizes its own: server/distributed.c). */
#define WORLD 4
#define MAX_VALUE 65536

static void test_the_keys_are_those_the_job_writes_and_no_other(void **state)
{
    (void)state;
    assert_null(sf_kv_key_check("gloo.rank_0", WORLD));
    assert_null(sf_kv_key_check("gloo.rank_3", WORLD));
    assert_null(sf_kv_key_check("gloo.0", WORLD));
    assert_null(sf_kv_key_check("gloo.3", WORLD));
    assert_null(sf_kv_key_check("nccl.id", WORLD));
    assert_null(sf_kv_key_check("gloo.1023", 1024));
    assert_null(sf_kv_key_check("gloo.rank_1023", 1024));
    static const char *const bad[] = {
        "gloo.4", "gloo.rank_4", "gloo.1024", "gloo.01", "gloo.00", "gloo.rank_01", "gloo.", "gloo.rank_",
        "gloo.-1", "gloo.+1", "gloo.1 ", "gloo.1x", "gloo.rank_0-A", "gloo.rank1", "gloo.99999999999999999999",
        "gloo.rank_", "nccl.id2", "nccl", "junk1", "probe", "", "a/b", "GLOO.0", "gloo..0",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *code = sf_kv_key_check(bad[i], WORLD);
        if (!code || strcmp(code, "kv_key_invalid"))
            fail_msg("key \"%s\" was taken", bad[i]);
    }
    assert_string_equal(sf_kv_key_check(NULL, WORLD), "kv_key_invalid");
}

static void test_a_job_of_any_size_has_room_for_every_key_it_writes_and_takes_no_other(void **state)
{
    (void)state;
    static const int worlds[] = {1, 2, 3, 16, 1024};
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
        const int world = worlds[w];
        sf_kv_table *t = sf_kv_table_new(world, MAX_VALUE);
        assert_non_null(t);
        assert_int_equal(sf_kv_table_world(t), world);
        /* What the ranks' collective publishes (2 keys a rank) and nccl.id. */
        int coll_keys;
        size_t coll_value;
        sf_coll_store_needs(world, &coll_keys, &coll_value);
        assert_int_equal(sf_kv_table_max_entries(t), coll_keys + 1);
        const char *code = NULL;
        char key[32];
        /* Junk first, as a client reaching the port may send: all refused. */
        for (int i = 0; i < 3 * world + 20; i++) {
            snprintf(key, sizeof key, "junk%d", i);
            assert_int_equal(sf_kv_table_put(t, key, "v", 1, &code), -1);
            assert_string_equal(code, "kv_key_invalid");
            snprintf(key, sizeof key, "gloo.%d", world + i);
            assert_int_equal(sf_kv_table_put(t, key, "v", 1, &code), -1);
            assert_string_equal(code, "kv_key_invalid");
        }
        assert_int_equal(sf_kv_table_count(t), 0);
        for (int r = 0; r < world; r++) {
            snprintf(key, sizeof key, "gloo.rank_%d", r);
            assert_int_equal(sf_kv_table_put(t, key, "127.0.0.1", 9, &code), 0);
            snprintf(key, sizeof key, "gloo.%d", r);
            assert_int_equal(sf_kv_table_put(t, key, "addresses", 9, &code), 0);
        }
        assert_int_equal(sf_kv_table_put(t, "nccl.id", "id", 2, &code), 0);
        assert_int_equal(sf_kv_table_count(t), sf_kv_job_keys(world));
        sf_kv_table_free(t);
    }
    assert_null(sf_kv_table_new(0, MAX_VALUE));
    assert_null(sf_kv_table_new(SF_KV_MAX_WORLD + 1, MAX_VALUE));
}

static void test_a_value_over_the_limit_is_refused_and_one_at_it_is_kept(void **state)
{
    (void)state;
    sf_kv_table *t = sf_kv_table_new(WORLD, MAX_VALUE);
    unsigned char *v = calloc(MAX_VALUE + 1, 1);
    const char *code = NULL;
    assert_int_equal(sf_kv_table_put(t, "gloo.2", v, MAX_VALUE + 1, &code), -1);
    assert_string_equal(code, "kv_value_too_large");
    assert_int_equal(sf_kv_table_count(t), 0);
    v[MAX_VALUE - 1] = 7;
    assert_int_equal(sf_kv_table_put(t, "gloo.2", v, MAX_VALUE, &code), 0);
    unsigned char *out = calloc(MAX_VALUE, 1);
    size_t len = 0;
    assert_int_equal(sf_kv_table_get(t, "gloo.2", out, MAX_VALUE, &len, 0), 0);
    assert_int_equal(len, MAX_VALUE);
    assert_int_equal(out[MAX_VALUE - 1], 7);
    free(out);
    free(v);
    sf_kv_table_free(t);
}

static void test_a_key_set_again_is_replaced(void **state)
{
    (void)state;
    sf_kv_table *t = sf_kv_table_new(WORLD, MAX_VALUE);
    const char *code = NULL;
    assert_int_equal(sf_kv_table_put(t, "gloo.rank_3", "old", 3, &code), 0);
    assert_int_equal(sf_kv_table_put(t, "gloo.rank_3", "newer", 5, &code), 0);
    assert_int_equal(sf_kv_table_count(t), 1);
    char out[8] = "";
    size_t len = 0;
    assert_int_equal(sf_kv_table_get(t, "gloo.rank_3", out, sizeof out, &len, 0), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(out, "newer", 5);
    sf_kv_table_free(t);
}

static void test_a_get_copies_at_most_its_capacity_and_reports_the_full_length(void **state)
{
    (void)state;
    sf_kv_table *t = sf_kv_table_new(WORLD, MAX_VALUE);
    const char *code = NULL;
    assert_int_equal(sf_kv_table_put(t, "gloo.1", "abcdef", 6, &code), 0);
    char out[4] = {0};
    size_t len = 0;
    assert_int_equal(sf_kv_table_get(t, "gloo.1", out, 3, &len, 0), 0);
    assert_int_equal(len, 6);
    assert_memory_equal(out, "abc", 3);
    assert_int_equal(out[3], 0);
    assert_int_equal(sf_kv_table_get(t, "bad key", out, 3, &len, 0), -1);
    assert_int_equal(sf_kv_table_get(t, "gloo.4", out, 3, &len, 0), -1); /* no rank of the job */
    sf_kv_table_free(t);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void test_a_get_of_a_missing_key_times_out_after_its_timeout(void **state)
{
    (void)state;
    sf_kv_table *t = sf_kv_table_new(WORLD, MAX_VALUE);
    char out[4];
    size_t len = 0;
    uint64_t t0 = now_ms();
    assert_int_equal(sf_kv_table_get(t, "gloo.rank_2", out, sizeof out, &len, 100), 1);
    uint64_t took = now_ms() - t0;
    assert_true(took >= 100 && took < 5000);
    assert_int_equal(sf_kv_table_get(t, "gloo.rank_2", out, sizeof out, &len, 0), 1);
    sf_kv_table_free(t);
}

static void *put_later(void *arg)
{
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
    const char *code;
    sf_kv_table_put(arg, "gloo.rank_1", "x", 1, &code);
    return NULL;
}

static void test_a_waiting_get_returns_when_another_thread_puts_the_key(void **state)
{
    (void)state;
    sf_kv_table *t = sf_kv_table_new(WORLD, MAX_VALUE);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, put_later, t), 0);
    char out[4];
    size_t len = 0;
    uint64_t t0 = now_ms();
    assert_int_equal(sf_kv_table_get(t, "gloo.rank_1", out, sizeof out, &len, 10000), 0);
    assert_true(now_ms() - t0 < 10000);
    assert_int_equal(len, 1);
    pthread_join(th, NULL);
    sf_kv_table_free(t);
}

static void test_the_local_store_interface_reads_what_it_wrote(void **state)
{
    (void)state;
    sf_kv_table *t = sf_kv_table_new(WORLD, MAX_VALUE);
    sf_kv_store s = sf_kv_table_store(t);
    assert_int_equal(s.set(s.ctx, "nccl.id", "nccl", 4), 0);
    assert_int_equal(s.set(s.ctx, "bad/key", "x", 1), -1);
    assert_int_equal(s.set(s.ctx, "id", "x", 1), -1);
    char out[8];
    size_t len = 0;
    assert_int_equal(s.get(s.ctx, "nccl.id", out, sizeof out, &len, 0), 0);
    assert_memory_equal(out, "nccl", 4);
    sf_kv_table_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_keys_are_those_the_job_writes_and_no_other),
        cmocka_unit_test(test_a_job_of_any_size_has_room_for_every_key_it_writes_and_takes_no_other),
        cmocka_unit_test(test_a_value_over_the_limit_is_refused_and_one_at_it_is_kept),
        cmocka_unit_test(test_a_key_set_again_is_replaced),
        cmocka_unit_test(test_a_get_copies_at_most_its_capacity_and_reports_the_full_length),
        cmocka_unit_test(test_a_get_of_a_missing_key_times_out_after_its_timeout),
        cmocka_unit_test(test_a_waiting_get_returns_when_another_thread_puts_the_key),
        cmocka_unit_test(test_the_local_store_interface_reads_what_it_wrote),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
