/* tests/unit/test_diagnose_trace.c — the pure parts of "seeing the pipeline":
 * the diagnose verdict rule (server/diagnose.c: sf_diag_decide), the Chrome
 * trace rendering (server/trace.c) and the nearest-rank percentile of
 * GET /v1/stats (server/stats.c). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/diagnose.h"
#include "server/stats.h"
#include "server/trace.h"

static sf_diag_verdict decide(double r1, double r2, double r3, double r4, double drop[3])
{
    const double rate[4] = {r1, r2, r3, r4};
    return sf_diag_decide(rate, drop);
}

static void test_no_drop_above_the_threshold_is_compute_bound(void **state)
{
    (void)state;
    double d[3];
    assert_int_equal(decide(500, 495, 490, 480, d), SF_DIAG_V_COMPUTE);
    assert_true(fabs(d[0] - 0.01) < 1e-12);
    /* Just under the threshold everywhere: still compute-bound. */
    double r2 = 500 * (1 - SF_DIAG_DROP_THRESHOLD + 1e-6);
    assert_int_equal(decide(500, r2, r2, r2, d), SF_DIAG_V_COMPUTE);
    assert_string_equal(sf_diag_verdict_code(SF_DIAG_V_COMPUTE), "compute-bound");
}

static void test_each_stage_is_named_by_its_own_drop(void **state)
{
    (void)state;
    double d[3];
    assert_int_equal(decide(500, 300, 295, 290, d), SF_DIAG_V_AUGMENTATION);
    assert_int_equal(decide(500, 495, 300, 295, d), SF_DIAG_V_H2D);
    assert_int_equal(decide(500, 495, 490, 100, d), SF_DIAG_V_INGEST);
    assert_true(fabs(d[2] - (1 - 100.0 / 490)) < 1e-12);
    assert_string_equal(sf_diag_verdict_label(SF_DIAG_V_INGEST), "ingest: loaders or network");
    assert_string_equal(sf_diag_verdict_label(SF_DIAG_V_H2D), "host-to-device copy");
}

static void test_the_largest_relative_drop_wins_not_the_largest_absolute_one(void **state)
{
    (void)state;
    double d[3];
    /* 1->2 loses 200 steps/s (40 %), 3->4 loses 150 of 250 (60 %). */
    assert_int_equal(decide(500, 300, 250, 100, d), SF_DIAG_V_INGEST);
    assert_true(d[0] > 0.39 && d[0] < 0.41 && d[2] > 0.59 && d[2] < 0.61);
}

static void test_a_stage_faster_than_the_one_before_loses_nothing(void **state)
{
    (void)state;
    double d[3];
    assert_int_equal(decide(400, 450, 430, 500, d), SF_DIAG_V_COMPUTE);
    assert_true(d[0] == 0 && d[2] == 0);
    assert_true(d[1] > 0.04 && d[1] < 0.05);
}

static void test_no_live_traffic_is_a_full_ingest_drop(void **state)
{
    (void)state;
    double d[3];
    assert_int_equal(decide(500, 500, 500, 0, d), SF_DIAG_V_INGEST);
    assert_true(d[2] == 1.0);
}

/* ---- trace ------------------------------------------------------------------- */

static sf_step_record rec(uint64_t id, uint64_t t)
{
    sf_step_record r;
    memset(&r, 0, sizeof r);
    r.id = id;
    r.step = id;
    r.n = 4;
    r.loss = 2.5f;
    r.t_recv_start = t;
    r.t_ready = t + 1000;
    r.t_popped = t + 3000;
    r.t_h2d_start = t + 3500;
    r.t_transform_start = t + 4500;
    r.transform_s = 2e-6;
    r.t_step_start = t + 7000;
    r.t_step_end = t + 10000;
    return r;
}

static const cJSON *find_slice(const cJSON *events, int tid, uint64_t batch)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, events)
    {
        const cJSON *ph = cJSON_GetObjectItem(e, "ph");
        if (strcmp(ph->valuestring, "X") == 0 && cJSON_GetObjectItem(e, "tid")->valueint == tid &&
            (uint64_t)cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "batch")->valuedouble == batch)
            return e;
    }
    return NULL;
}

static void test_trace_has_named_tracks_and_slices_in_microseconds_from_the_first_edge(void **state)
{
    (void)state;
    sf_step_record r[2] = {rec(7, 5000000), rec(8, 5006000)};
    cJSON *t = sf_trace_render(r, 2, "cuda", 0);
    char *txt = cJSON_PrintUnformatted(t);
    cJSON *back = cJSON_Parse(txt); /* it is JSON */
    assert_non_null(back);
    const cJSON *events = cJSON_GetObjectItem(back, "traceEvents");
    assert_string_equal(cJSON_GetObjectItem(back, "displayTimeUnit")->valuestring, "ms");
    int names = 0, slices = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, events)
    {
        const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring;
        const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
        if (strcmp(ph, "M") == 0 && strcmp(name, "thread_name") == 0) {
            int tid = cJSON_GetObjectItem(e, "tid")->valueint;
            assert_true(tid >= 1 && tid <= SF_TRACE_TRACKS);
            assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "name")->valuestring,
                                sf_trace_track_names[tid - 1]);
            names++;
        } else if (strcmp(ph, "M") == 0 && strcmp(name, "process_name") == 0) {
            assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "name")->valuestring,
                                "streamfeed gpu0");
        } else if (strcmp(ph, "X") == 0) {
            slices++;
        }
    }
    assert_int_equal(names, 5);
    assert_int_equal(slices, 10);
    const cJSON *recv = find_slice(events, 1, 7), *comp = find_slice(events, 5, 8);
    assert_non_null(recv);
    assert_non_null(comp);
    assert_true(cJSON_GetObjectItem(recv, "ts")->valuedouble == 0);
    assert_true(fabs(cJSON_GetObjectItem(recv, "dur")->valuedouble - 1.0) < 1e-9);
    /* Batch 8 started 6 µs after batch 7; its step starts 7 µs after that. */
    assert_true(fabs(cJSON_GetObjectItem(comp, "ts")->valuedouble - 13.0) < 1e-9);
    assert_true(fabs(cJSON_GetObjectItem(comp, "dur")->valuedouble - 3.0) < 1e-9);
    const cJSON *args = cJSON_GetObjectItem(comp, "args");
    assert_int_equal(cJSON_GetObjectItem(args, "step")->valueint, 8);
    assert_true(fabs(cJSON_GetObjectItem(args, "loss")->valuedouble - 2.5) < 1e-9);
    const cJSON *xf = find_slice(events, 4, 7);
    assert_true(fabs(cJSON_GetObjectItem(xf, "ts")->valuedouble - 4.5) < 1e-9);
    assert_true(fabs(cJSON_GetObjectItem(xf, "dur")->valuedouble - 2.0) < 1e-9);
    cJSON_Delete(back);
    free(txt);
    cJSON_Delete(t);
}

static void test_trace_leaves_out_slices_whose_edges_are_unknown(void **state)
{
    (void)state;
    sf_step_record r = rec(3, 1000000);
    r.t_h2d_start = 0; /* the backend did not report it */
    r.t_step_end = r.t_step_start - 1; /* nonsense: ends before it starts */
    cJSON *t = sf_trace_render(&r, 1, "cuda", 2);
    const cJSON *events = cJSON_GetObjectItem(t, "traceEvents");
    assert_null(find_slice(events, 3, 3));
    assert_null(find_slice(events, 5, 3));
    assert_non_null(find_slice(events, 1, 3));
    assert_non_null(find_slice(events, 4, 3));
    char *txt = cJSON_PrintUnformatted(t);
    assert_non_null(strstr(txt, "streamfeed gpu2"));
    free(txt);
    cJSON_Delete(t);
}

static void test_percentile_is_the_nearest_rank(void **state)
{
    (void)state;
    double v[] = {5, 1, 4, 2, 3};
    assert_true(sf_stats_percentile(v, 5, 0.5) == 3);
    assert_true(sf_stats_percentile(v, 5, 0.99) == 5);
    assert_true(sf_stats_percentile(v, 5, 0.0) == 1);
    double one[] = {7};
    assert_true(sf_stats_percentile(one, 1, 0.5) == 7);
    double hundred[100];
    for (int i = 0; i < 100; i++)
        hundred[i] = 100 - i;
    assert_true(sf_stats_percentile(hundred, 100, 0.99) == 99);
    assert_true(sf_stats_percentile(hundred, 100, 0.5) == 50);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_drop_above_the_threshold_is_compute_bound),
        cmocka_unit_test(test_each_stage_is_named_by_its_own_drop),
        cmocka_unit_test(test_the_largest_relative_drop_wins_not_the_largest_absolute_one),
        cmocka_unit_test(test_a_stage_faster_than_the_one_before_loses_nothing),
        cmocka_unit_test(test_no_live_traffic_is_a_full_ingest_drop),
        cmocka_unit_test(test_trace_has_named_tracks_and_slices_in_microseconds_from_the_first_edge),
        cmocka_unit_test(test_trace_leaves_out_slices_whose_edges_are_unknown),
        cmocka_unit_test(test_percentile_is_the_nearest_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
