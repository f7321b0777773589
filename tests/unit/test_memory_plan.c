/* tests/unit/test_memory_plan.c — the placement of tensors by lifetime
 * (gpu/memory_plan.h) that the CUDA executor's memory plan rests on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "gpu/memory_plan.h"

static size_t place_all(sf_plan_tensor *t, int n)
{
    sf_plan_tensor *p[64];
    for (int i = 0; i < n; i++)
        p[i] = &t[i];
    return sf_plan_place(p, n);
}

/* Every pair that is alive at once occupies disjoint bytes; every offset is aligned. */
static void assert_valid(const sf_plan_tensor *t, int n, size_t arena)
{
    for (int i = 0; i < n; i++) {
        assert_int_equal(t[i].off % SF_PLAN_ALIGN, 0);
        assert_true(t[i].off + t[i].bytes <= arena);
        for (int j = 0; j < i; j++) {
            const int together = !(t[i].t1 < t[j].t0 || t[j].t1 < t[i].t0);
            const int disjoint = t[i].off + t[i].bytes <= t[j].off || t[j].off + t[j].bytes <= t[i].off;
            if (together)
                assert_true(disjoint);
        }
    }
}

static void tensors_alive_one_after_another_share_their_bytes(void **state)
{
    (void)state;
    sf_plan_tensor t[3] = {{1024, 0, 1, 0}, {1024, 2, 3, 0}, {512, 4, 4, 0}};
    size_t arena = place_all(t, 3);
    assert_int_equal(arena, 1024);
    assert_int_equal(t[0].off, 0);
    assert_int_equal(t[1].off, 0);
    assert_valid(t, 3, arena);
}

static void tensors_alive_at_once_get_disjoint_aligned_bytes(void **state)
{
    (void)state;
    /* the shared slot 2 puts all three in one slot; 300 rounds up to 512 */
    sf_plan_tensor t[3] = {{300, 0, 2, 0}, {1024, 2, 5, 0}, {256, 1, 2, 0}};
    size_t arena = place_all(t, 3);
    assert_valid(t, 3, arena);
    assert_int_equal(arena, 1024 + 512 + 256);
}

static void an_empty_plan_takes_no_bytes(void **state)
{
    (void)state;
    assert_int_equal(sf_plan_place(NULL, 0), 0);
}

static void random_lifetimes_always_give_a_valid_plan_no_larger_than_the_sum(void **state)
{
    (void)state;
    srand(7);
    for (int round = 0; round < 200; round++) {
        sf_plan_tensor t[40];
        const int n = 1 + rand() % 40;
        size_t sum = 0;
        for (int i = 0; i < n; i++) {
            int a = rand() % 30, b = rand() % 30;
            t[i].t0 = a < b ? a : b;
            t[i].t1 = a < b ? b : a;
            t[i].bytes = (size_t)(1 + rand() % 64) * SF_PLAN_ALIGN;
            t[i].off = 0;
            sum += t[i].bytes;
        }
        size_t arena = place_all(t, n);
        assert_valid(t, n, arena);
        assert_true(arena <= sum);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tensors_alive_one_after_another_share_their_bytes),
        cmocka_unit_test(tensors_alive_at_once_get_disjoint_aligned_bytes),
        cmocka_unit_test(an_empty_plan_takes_no_bytes),
        cmocka_unit_test(random_lifetimes_always_give_a_valid_plan_no_larger_than_the_sum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
