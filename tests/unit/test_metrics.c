/* tests/unit/test_metrics.c — the Prometheus registry (server/metrics.c):
 * the exact text of counters, gauges and histograms, label and help
 * escaping, the overflow child that bounds label cardinality, cumulative
 * buckets, collectors, and forgetting a child (hidden, zeroed, revived as
 * the same child, within the bound). Every test starts from an empty
 * registry. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/metrics.h"

static int reset(void **state)
{
    (void)state;
    sf_metrics_reset();
    return 0;
}

static char *render(void)
{
    size_t len = 0;
    char *txt = sf_metrics_render(&len);
    assert_non_null(txt);
    assert_int_equal(strlen(txt), len);
    return txt;
}

static int count_lines_starting(const char *txt, const char *prefix)
{
    int n = 0;
    size_t pl = strlen(prefix);
    for (const char *p = txt; p && *p;) {
        if (strncmp(p, prefix, pl) == 0)
            n++;
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return n;
}

static const char *const L_ROUTE_CODE[] = {"route", "code", NULL};
static const char *const L_KEY[] = {"key", NULL};

static void test_a_small_registry_renders_exactly_the_text_format(void **state)
{
    (void)state;
    sf_family *req = sf_metrics_counter("t_requests_total", "Requests.", L_ROUTE_CODE);
    sf_family *temp = sf_metrics_gauge("t_temp_celsius", "Temperature.", NULL);
    const double b[] = {0.5, 1, 2.5};
    sf_family *lat = sf_metrics_histogram("t_latency_seconds", "Latency.", NULL, b, 3);

    const char *a200[] = {"a", "200"}, *b404[] = {"b", "404"};
    sf_counter_inc_l(req, a200, 1);
    sf_counter_inc_l(req, a200, 2);
    sf_counter_inc_l(req, b404, 1);
    sf_gauge_set(sf_metric_only(temp), 20);
    sf_gauge_add(sf_metric_only(temp), 1.5);
    sf_metric *h = sf_metric_only(lat);
    sf_hist_observe(h, 0.25);
    sf_hist_observe(h, 0.5); /* on a bound: counted in that bucket (le is <=) */
    sf_hist_observe(h, 1.5);
    sf_hist_observe(h, 3);

    char *txt = render();
    assert_string_equal(txt,
                        "# HELP t_requests_total Requests.\n"
                        "# TYPE t_requests_total counter\n"
                        "t_requests_total{route=\"a\",code=\"200\"} 3\n"
                        "t_requests_total{route=\"b\",code=\"404\"} 1\n"
                        "# HELP t_temp_celsius Temperature.\n"
                        "# TYPE t_temp_celsius gauge\n"
                        "t_temp_celsius 21.5\n"
                        "# HELP t_latency_seconds Latency.\n"
                        "# TYPE t_latency_seconds histogram\n"
                        "t_latency_seconds_bucket{le=\"0.5\"} 2\n"
                        "t_latency_seconds_bucket{le=\"1\"} 2\n"
                        "t_latency_seconds_bucket{le=\"2.5\"} 3\n"
                        "t_latency_seconds_bucket{le=\"+Inf\"} 4\n"
                        "t_latency_seconds_sum 5.25\n"
                        "t_latency_seconds_count 4\n");
    free(txt);
    assert_true(sf_metric_value(h) == 5.25);
    assert_int_equal(sf_hist_count(h), 4);
}

static void test_a_labelled_histogram_puts_le_after_its_labels(void **state)
{
    (void)state;
    const double b[] = {1};
    sf_family *f = sf_metrics_histogram("t_dur_seconds", "D.", (const char *const[]){"route", NULL}, b, 1);
    sf_hist_observe(sf_metric_child(f, (const char *const[]){"x"}), 2);
    char *txt = render();
    assert_non_null(strstr(txt, "t_dur_seconds_bucket{route=\"x\",le=\"1\"} 0\n"
                                "t_dur_seconds_bucket{route=\"x\",le=\"+Inf\"} 1\n"
                                "t_dur_seconds_sum{route=\"x\"} 2\n"
                                "t_dur_seconds_count{route=\"x\"} 1\n"));
    free(txt);
}

static void test_label_values_escape_backslash_quote_and_newline(void **state)
{
    (void)state;
    sf_family *f = sf_metrics_counter("t_escaped_total", "Help with \\ and\nnewline \"quoted\".", L_KEY);
    sf_counter_inc_l(f, (const char *const[]){"a\\b\"c\nd"}, 1);
    char *txt = render();
    assert_non_null(strstr(txt, "t_escaped_total{key=\"a\\\\b\\\"c\\nd\"} 1\n"));
    /* HELP escapes backslash and newline only (text format 0.0.4). */
    assert_non_null(strstr(txt, "# HELP t_escaped_total Help with \\\\ and\\nnewline \"quoted\".\n"));
    free(txt);
}

static void test_children_beyond_the_maximum_share_one_overflow_child(void **state)
{
    (void)state;
    sf_family *f = sf_metrics_gauge("t_many", "Many.", L_KEY);
    char v[32];
    sf_metric *first = NULL;
    for (int i = 0; i < SF_METRIC_MAX_CHILDREN; i++) {
        snprintf(v, sizeof v, "v%d", i);
        sf_metric *m = sf_metric_child(f, (const char *const[]){v});
        assert_non_null(m);
        if (!first)
            first = m;
        sf_gauge_set(m, 1);
    }
    /* The same values find the same child. */
    assert_ptr_equal(sf_metric_child(f, (const char *const[]){"v0"}), first);
    sf_metric *o1 = sf_metric_child(f, (const char *const[]){"extra-1"});
    sf_metric *o2 = sf_metric_child(f, (const char *const[]){"extra-2"});
    assert_non_null(o1);
    assert_ptr_equal(o1, o2);
    sf_gauge_add(o1, 2);
    sf_gauge_add(o2, 3);
    char *txt = render();
    assert_int_equal(count_lines_starting(txt, "t_many{"), SF_METRIC_MAX_CHILDREN + 1);
    assert_non_null(strstr(txt, "t_many{key=\"overflow\"} 5\n"));
    assert_null(strstr(txt, "extra-1"));
    free(txt);
}

static void test_buckets_are_cumulative_and_count_equals_the_inf_bucket(void **state)
{
    (void)state;
    const double b[] = {0.001, 0.01, 0.1, 1};
    sf_metric *h = sf_metric_only(sf_metrics_histogram("t_cum_seconds", "C.", NULL, b, 4));
    const double obs[] = {0.0005, 0.001, 0.002, 0.05, 0.05, 0.5, 7, 100};
    for (size_t i = 0; i < sizeof obs / sizeof obs[0]; i++)
        sf_hist_observe(h, obs[i]);
    sf_hist_observe(h, NAN); /* ignored */
    char *txt = render();
    assert_non_null(strstr(txt, "t_cum_seconds_bucket{le=\"0.001\"} 2\n"
                                "t_cum_seconds_bucket{le=\"0.01\"} 3\n"
                                "t_cum_seconds_bucket{le=\"0.1\"} 5\n"
                                "t_cum_seconds_bucket{le=\"1\"} 6\n"
                                "t_cum_seconds_bucket{le=\"+Inf\"} 8\n"));
    assert_non_null(strstr(txt, "t_cum_seconds_count 8\n"));
    free(txt);
    assert_int_equal(sf_hist_count(h), 8);
    assert_true(fabs(sf_metric_value(h) - 107.6035) < 1e-9);
}

static void test_the_latency_preset_renders_ascending_bounds(void **state)
{
    (void)state;
    assert_true(sf_buckets_latency_n > 0 && sf_buckets_latency_n <= SF_METRIC_MAX_BUCKETS);
    for (int i = 1; i < sf_buckets_latency_n; i++)
        assert_true(sf_buckets_latency[i] > sf_buckets_latency[i - 1]);
    sf_metric *h = sf_metric_only(
        sf_metrics_histogram("t_lat", "L.", NULL, sf_buckets_latency, sf_buckets_latency_n));
    sf_hist_observe(h, 0.0001);
    char *txt = render();
    assert_int_equal(count_lines_starting(txt, "t_lat_bucket{"), sf_buckets_latency_n + 1);
    assert_non_null(strstr(txt, "t_lat_bucket{le=\"0.0001\"} 1\n"));
    free(txt);
}

static void test_counters_ignore_negative_adds_and_gauges_go_both_ways(void **state)
{
    (void)state;
    sf_metric *c = sf_metric_only(sf_metrics_counter("t_c_total", "C.", NULL));
    sf_counter_add(c, 2);
    sf_counter_add(c, -1);
    assert_true(sf_metric_value(c) == 2);
    sf_metric *g = sf_metric_only(sf_metrics_gauge("t_g", "G.", NULL));
    sf_gauge_add(g, -3);
    assert_true(sf_metric_value(g) == -3);
    sf_gauge_set(g, INFINITY);
    char *txt = render();
    assert_non_null(strstr(txt, "t_g +Inf\n"));
    free(txt);
    sf_gauge_set(g, NAN);
    txt = render();
    assert_non_null(strstr(txt, "t_g NaN\n"));
    free(txt);
    /* NULL children are tolerated (a failed lookup must not crash a hot path). */
    sf_counter_add(NULL, 1);
    sf_gauge_set(NULL, 1);
    sf_hist_observe(NULL, 1);
    assert_true(sf_metric_value(NULL) == 0);
}

static void test_a_labelled_family_without_children_renders_only_help_and_type(void **state)
{
    (void)state;
    sf_metrics_counter("t_unseen_total", "Unseen.", L_KEY);
    char *txt = render();
    assert_string_equal(txt, "# HELP t_unseen_total Unseen.\n# TYPE t_unseen_total counter\n");
    free(txt);
}

static void test_registering_a_name_twice_returns_the_same_family(void **state)
{
    (void)state;
    sf_family *a = sf_metrics_counter("t_twice_total", "T.", NULL);
    sf_family *b = sf_metrics_counter("t_twice_total", "T.", NULL);
    assert_ptr_equal(a, b);
    sf_counter_add(sf_metric_only(a), 1);
    sf_counter_add(sf_metric_only(b), 1);
    char *txt = render();
    assert_int_equal(count_lines_starting(txt, "# TYPE t_twice_total"), 1);
    assert_non_null(strstr(txt, "t_twice_total 2\n"));
    free(txt);
}

static int collected;
static void collect(void *ctx)
{
    collected++;
    sf_gauge_set(sf_metric_only(ctx), 42);
}

static void test_collectors_run_before_each_render(void **state)
{
    (void)state;
    collected = 0;
    sf_family *g = sf_metrics_gauge("t_collected", "C.", NULL);
    sf_metrics_on_collect(collect, g);
    char *txt = render();
    assert_int_equal(collected, 1);
    assert_non_null(strstr(txt, "t_collected 42\n"));
    free(txt);
    free(render());
    assert_int_equal(collected, 2);
    /* Reset forgets collectors too. */
    sf_metrics_reset();
    free(render());
    assert_int_equal(collected, 2);
}

/* Concurrent updates on one child are not lost (lock-free atomics). */
static void *add_many(void *arg)
{
    for (int i = 0; i < 100000; i++) {
        sf_counter_add(arg, 1);
    }
    return NULL;
}

static void test_concurrent_counter_adds_are_not_lost(void **state)
{
    (void)state;
    sf_metric *c = sf_metric_only(sf_metrics_counter("t_conc_total", "C.", NULL));
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, add_many, c);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_true(sf_metric_value(c) == 400000);
}

static void test_a_forgotten_child_is_not_rendered_and_comes_back_from_zero_as_the_same_child(void **state)
{
    (void)state;
    sf_family *f = sf_metrics_counter("t_forget_total", "F.", L_ROUTE_CODE);
    const double b[] = {1};
    sf_family *h = sf_metrics_histogram("t_forget_seconds", "H.", L_KEY, b, 1);
    const char *a[] = {"a", "200"}, *keep[] = {"b", "200"}, *k[] = {"x"};
    sf_metric *ma = sf_metric_child(f, a);
    sf_counter_add(ma, 7);
    sf_counter_add(sf_metric_child(f, keep), 2);
    sf_metric *mh = sf_metric_child(h, k);
    sf_hist_observe(mh, 0.5);
    sf_hist_observe(mh, 2);

    sf_metric_forget(f, a);
    sf_metric_forget(h, k);
    sf_metric_forget(f, (const char *const[]){"never", "seen"}); /* no such child: nothing */
    char *txt = render();
    assert_null(strstr(txt, "route=\"a\""));
    assert_non_null(strstr(txt, "t_forget_total{route=\"b\",code=\"200\"} 2\n"));
    assert_int_equal(count_lines_starting(txt, "t_forget_seconds"), 0);
    assert_null(strstr(txt, "never"));
    free(txt);
    assert_true(sf_metric_value(ma) == 0);
    assert_int_equal(sf_hist_count(mh), 0);

    /* A pointer kept from before may still be updated: not shown, and
     * dropped when the labels are asked for again. */
    sf_counter_add(ma, 5);
    txt = render();
    assert_null(strstr(txt, "route=\"a\""));
    free(txt);
    sf_metric *again = sf_metric_child(f, a);
    assert_ptr_equal(again, ma);
    assert_ptr_equal(sf_metric_child(h, k), mh);
    sf_counter_add(again, 1);
    txt = render();
    assert_non_null(strstr(txt, "t_forget_total{route=\"a\",code=\"200\"} 1\n"));
    assert_non_null(strstr(txt, "t_forget_seconds_count{key=\"x\"} 0\n"));
    free(txt);
}

/* Label values that come and go: without reuse, a forgotten child keeps its
 * place (a kept pointer may be behind it) and new values overflow; with it,
 * a new value takes a forgotten child's memory. Never more than the bound. */
static void fill(sf_family *f)
{
    char v[32];
    for (int i = 0; i < SF_METRIC_MAX_CHILDREN; i++) {
        snprintf(v, sizeof v, "v%d", i);
        sf_gauge_set(sf_metric_child(f, (const char *const[]){v}), 1);
    }
}

static void test_forgotten_children_stay_within_the_bound_and_are_reused_only_when_declared(void **state)
{
    (void)state;
    sf_family *held = sf_metrics_gauge("t_held", "Held.", L_KEY);
    fill(held);
    sf_metric *v7 = sf_metric_child(held, (const char *const[]){"v7"});
    sf_metric_forget(held, (const char *const[]){"v7"});
    sf_metric *o = sf_metric_child(held, (const char *const[]){"new"});
    assert_ptr_not_equal(o, v7);
    sf_gauge_set(o, 3);

    sf_family *fresh = sf_metrics_gauge("t_fresh", "Fresh.", L_KEY);
    sf_metrics_reuse_forgotten(fresh);
    fill(fresh);
    sf_metric *f7 = sf_metric_child(fresh, (const char *const[]){"v7"});
    sf_metric_forget(fresh, (const char *const[]){"v7"});
    sf_metric *n = sf_metric_child(fresh, (const char *const[]){"new"});
    assert_ptr_equal(n, f7);
    sf_gauge_set(n, 4);
    /* No forgotten child left: one more overflows. */
    sf_gauge_set(sf_metric_child(fresh, (const char *const[]){"newer"}), 5);

    char *txt = render();
    assert_int_equal(count_lines_starting(txt, "t_held{"), SF_METRIC_MAX_CHILDREN); /* v7 hidden, + overflow */
    assert_null(strstr(txt, "t_held{key=\"v7\"}"));
    assert_non_null(strstr(txt, "t_held{key=\"overflow\"} 3\n"));
    assert_int_equal(count_lines_starting(txt, "t_fresh{"), SF_METRIC_MAX_CHILDREN + 1);
    assert_null(strstr(txt, "t_fresh{key=\"v7\"}"));
    assert_non_null(strstr(txt, "t_fresh{key=\"new\"} 4\n"));
    assert_non_null(strstr(txt, "t_fresh{key=\"overflow\"} 5\n"));
    free(txt);
}

/* Forgetting and reviving while another thread renders: no crash, no torn
 * line (run under the sanitizers by make sanitize-unit). */
static atomic_int churn_stop;

static void *churn(void *arg)
{
    sf_family *f = arg;
    const char *v[] = {"churn"};
    while (!atomic_load(&churn_stop)) {
        sf_counter_add(sf_metric_child(f, v), 1);
        sf_metric_forget(f, v);
    }
    return NULL;
}

static void test_forgetting_is_safe_while_rendering(void **state)
{
    (void)state;
    sf_family *f = sf_metrics_counter("t_churn_total", "C.", L_KEY);
    atomic_store(&churn_stop, 0);
    pthread_t t;
    pthread_create(&t, NULL, churn, f);
    for (int i = 0; i < 200; i++) {
        char *txt = render();
        const char *line = strstr(txt, "t_churn_total{");
        /* Rendered only while alive, and then as a whole line. */
        static const char whole[] = "t_churn_total{key=\"churn\"} ";
        if (line)
            assert_true(strncmp(line, whole, sizeof whole - 1) == 0 && strchr(line, '\n'));
        free(txt);
    }
    atomic_store(&churn_stop, 1);
    pthread_join(t, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_a_small_registry_renders_exactly_the_text_format, reset),
        cmocka_unit_test_setup(test_a_labelled_histogram_puts_le_after_its_labels, reset),
        cmocka_unit_test_setup(test_label_values_escape_backslash_quote_and_newline, reset),
        cmocka_unit_test_setup(test_children_beyond_the_maximum_share_one_overflow_child, reset),
        cmocka_unit_test_setup(test_buckets_are_cumulative_and_count_equals_the_inf_bucket, reset),
        cmocka_unit_test_setup(test_the_latency_preset_renders_ascending_bounds, reset),
        cmocka_unit_test_setup(test_counters_ignore_negative_adds_and_gauges_go_both_ways, reset),
        cmocka_unit_test_setup(test_a_labelled_family_without_children_renders_only_help_and_type, reset),
        cmocka_unit_test_setup(test_registering_a_name_twice_returns_the_same_family, reset),
        cmocka_unit_test_setup(test_collectors_run_before_each_render, reset),
        cmocka_unit_test_setup(test_concurrent_counter_adds_are_not_lost, reset),
        cmocka_unit_test_setup(test_a_forgotten_child_is_not_rendered_and_comes_back_from_zero_as_the_same_child,
                               reset),
        cmocka_unit_test_setup(test_forgotten_children_stay_within_the_bound_and_are_reused_only_when_declared,
                               reset),
        cmocka_unit_test_setup(test_forgetting_is_safe_while_rendering, reset),
    };
    return cmocka_run_group_tests(tests, NULL, reset);
}
