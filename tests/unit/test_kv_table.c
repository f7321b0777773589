/* tests/unit/test_kv_table.c — rank 0's rendezvous store (dist/kv_table.c):
 * its bounds (key length and characters, value size, entry count), replacing
 * a key, and a get that waits for a put or times out. */
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

#include "dist/kv_table.h"

/* The bounds of the tables here (a job sizes its own: server/distributed.c). */
#define MAX_ENTRIES 256
#define MAX_VALUE 65536

static void test_keys_are_one_to_63_safe_characters(void **state)
{
    (void)state;
    char longest[SF_KV_MAX_KEY + 2];
    memset(longest, 'k', sizeof longest);
    longest[SF_KV_MAX_KEY] = '\0';
    assert_null(sf_kv_key_check(longest));
    assert_null(sf_kv_key_check("gloo.rank_0-A"));
    longest[SF_KV_MAX_KEY] = 'k';
    longest[SF_KV_MAX_KEY + 1] = '\0';
    assert_string_equal(sf_kv_key_check(longest), "kv_key_invalid");
    assert_string_equal(sf_kv_key_check(""), "kv_key_invalid");
    assert_string_equal(sf_kv_key_check("a/b"), "kv_key_invalid");
    assert_string_equal(sf_kv_key_check("a b"), "kv_key_invalid");
}

static void test_a_value_over_the_limit_is_refused_and_one_at_it_is_kept(void **state)
{
    (void)state;
    sf_kv_table *t = sf_kv_table_new(MAX_ENTRIES, MAX_VALUE);
    unsigned char *v = calloc(MAX_VALUE + 1, 1);
    const char *code = NULL;
    assert_int_equal(sf_kv_table_put(t, "big", v, MAX_VALUE + 1, &code), -1);
    assert_string_equal(code, "kv_value_too_large");
    assert_int_equal(sf_kv_table_count(t), 0);
    v[MAX_VALUE - 1] = 7;
    assert_int_equal(sf_kv_table_put(t, "big", v, MAX_VALUE, &code), 0);
    unsigned char *out = calloc(MAX_VALUE, 1);
    size_t len = 0;
    assert_int_equal(sf_kv_table_get(t, "big", out, MAX_VALUE, &len, 0), 0);
    assert_int_equal(len, MAX_VALUE);
    assert_int_equal(out[MAX_VALUE - 1], 7);
    free(out);
    free(v);
    sf_kv_table_free(t);
}

static void test_the_table_refuses_a_new_key_when_full_but_replaces_an_old_one(void **state)
{
    (void)state;
    sf_kv_table *t = sf_kv_table_new(MAX_ENTRIES, MAX_VALUE);
    const char *code = NULL;
    char key[32];
    for (int i = 0; i < MAX_ENTRIES; i++) {
        snprintf(key, sizeof key, "k%d", i);
        assert_int_equal(sf_kv_table_put(t, key, "v", 1, &code), 0);
    }
    assert_int_equal(sf_kv_table_put(t, "one-more", "v", 1, &code), -1);
    assert_string_equal(code, "kv_full");
    assert_int_equal(sf_kv_table_put(t, "k3", "new", 3, &code), 0);
    assert_int_equal(sf_kv_table_count(t), MAX_ENTRIES);
    char out[8] = "";
    size_t len = 0;
    assert_int_equal(sf_kv_table_get(t, "k3", out, sizeof out, &len, 0), 0);
    assert_int_equal(len, 3);
    assert_memory_equal(out, "new", 3);
    sf_kv_table_free(t);
}

static void test_a_get_copies_at_most_its_capacity_and_reports_the_full_length(void **state)
{
    (void)state;
    sf_kv_table *t = sf_kv_table_new(MAX_ENTRIES, MAX_VALUE);
    const char *code = NULL;
    assert_int_equal(sf_kv_table_put(t, "k", "abcdef", 6, &code), 0);
    char out[4] = {0};
    size_t len = 0;
    assert_int_equal(sf_kv_table_get(t, "k", out, 3, &len, 0), 0);
    assert_int_equal(len, 6);
    assert_memory_equal(out, "abc", 3);
    assert_int_equal(out[3], 0);
    assert_int_equal(sf_kv_table_get(t, "bad key", out, 3, &len, 0), -1);
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
    sf_kv_table *t = sf_kv_table_new(MAX_ENTRIES, MAX_VALUE);
    char out[4];
    size_t len = 0;
    uint64_t t0 = now_ms();
    assert_int_equal(sf_kv_table_get(t, "never", out, sizeof out, &len, 100), 1);
    uint64_t took = now_ms() - t0;
    assert_true(took >= 100 && took < 5000);
    assert_int_equal(sf_kv_table_get(t, "never", out, sizeof out, &len, 0), 1);
    sf_kv_table_free(t);
}

static void *put_later(void *arg)
{
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
    const char *code;
    sf_kv_table_put(arg, "late", "x", 1, &code);
    return NULL;
}

static void test_a_waiting_get_returns_when_another_thread_puts_the_key(void **state)
{
    (void)state;
    sf_kv_table *t = sf_kv_table_new(MAX_ENTRIES, MAX_VALUE);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, put_later, t), 0);
    char out[4];
    size_t len = 0;
    uint64_t t0 = now_ms();
    assert_int_equal(sf_kv_table_get(t, "late", out, sizeof out, &len, 10000), 0);
    assert_true(now_ms() - t0 < 10000);
    assert_int_equal(len, 1);
    pthread_join(th, NULL);
    sf_kv_table_free(t);
}

static void test_the_local_store_interface_reads_what_it_wrote(void **state)
{
    (void)state;
    sf_kv_table *t = sf_kv_table_new(MAX_ENTRIES, MAX_VALUE);
    sf_kv_store s = sf_kv_table_store(t);
    assert_int_equal(s.set(s.ctx, "id", "nccl", 4), 0);
    assert_int_equal(s.set(s.ctx, "bad/key", "x", 1), -1);
    char out[8];
    size_t len = 0;
    assert_int_equal(s.get(s.ctx, "id", out, sizeof out, &len, 0), 0);
    assert_memory_equal(out, "nccl", 4);
    sf_kv_table_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys_are_one_to_63_safe_characters),
        cmocka_unit_test(test_a_value_over_the_limit_is_refused_and_one_at_it_is_kept),
        cmocka_unit_test(test_the_table_refuses_a_new_key_when_full_but_replaces_an_old_one),
        cmocka_unit_test(test_a_get_copies_at_most_its_capacity_and_reports_the_full_length),
        cmocka_unit_test(test_a_get_of_a_missing_key_times_out_after_its_timeout),
        cmocka_unit_test(test_a_waiting_get_returns_when_another_thread_puts_the_key),
        cmocka_unit_test(test_the_local_store_interface_reads_what_it_wrote),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
