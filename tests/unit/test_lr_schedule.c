/* tests/unit/test_lr_schedule.c — learning-rate schedules (server/lr_schedule.c)
 * against torch.optim.lr_scheduler's closed forms. The expected numbers were
 * computed in Python with the formulas of torch's source (StepLR, MultiStepLR,
 * CosineAnnealingLR._get_closed_form_lr, OneCycleLR.get_lr with
 * _annealing_cos, LinearLR + SequentialLR), not with this module's code;
 * torch itself was not importable where they were written. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "server/config.h"
#include "server/lr_schedule.h"

typedef struct point {
    uint64_t t;
    double lr;
} point;

static sf_lr_sched sched_of(const char *const *kv)
{
    static sf_config c;
    sf_config_defaults(&c);
    char err[256];
    for (; kv[0]; kv += 2)
        if (sf_config_set_text(&c, kv[0], kv[1], err, sizeof err) != 0)
            fail_msg("%s=%s: %s", kv[0], kv[1], err);
    sf_lr_sched s;
    if (sf_lr_sched_from_config(&c, &s, err, sizeof err) != 0)
        fail_msg("%s", err);
    return s;
}

static void expect(const sf_lr_sched *s, const point *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double got = sf_lr_at(s, p[i].t);
        if (fabs(got - p[i].lr) > 1e-15 + 1e-12 * fabs(p[i].lr))
            fail_msg("step %llu: lr %.17g, expected %.17g", (unsigned long long)p[i].t, got, p[i].lr);
    }
}

static void constant_schedule_returns_optim_lr_at_every_step(void **state)
{
    (void)state;
    sf_lr_sched s = sched_of((const char *const[]){"optim.lr", "0.03", NULL});
    const point p[] = {{0, 0.03}, {1, 0.03}, {1000000, 0.03}};
    expect(&s, p, 3);
}

static void step_schedule_matches_torch_steplr(void **state)
{
    (void)state;
    sf_lr_sched s = sched_of((const char *const[]){"optim.lr", "0.1", "optim.schedule", "step",
                                                   "optim.step_size", "3", "optim.gamma", "0.5", NULL});
    const point p[] = {{0, 0.1}, {2, 0.1}, {3, 0.05}, {7, 0.025}};
    expect(&s, p, 4);
}

static void multistep_schedule_matches_torch_multisteplr(void **state)
{
    (void)state;
    sf_lr_sched s = sched_of((const char *const[]){"optim.lr", "0.1", "optim.schedule", "multistep",
                                                   "optim.milestones", "[2, 5]", NULL});
    const point p[] = {{0, 0.1},
                       {1, 0.1},
                       {2, 0.010000000000000002},
                       {4, 0.010000000000000002},
                       {5, 0.0010000000000000002},
                       {9, 0.0010000000000000002}};
    expect(&s, p, 6);
}

static void cosine_schedule_matches_torch_closed_form_past_t_max(void **state)
{
    (void)state;
    sf_lr_sched s = sched_of((const char *const[]){"optim.lr", "0.1", "optim.schedule", "cosine",
                                                   "optim.t_max", "10", "optim.eta_min", "0.001", NULL});
    const point p[] = {{0, 0.1}, {1, 0.09757729755661011}, {5, 0.0505}, {10, 0.001}, {13, 0.021404630011522575}};
    expect(&s, p, 5);
}

static void one_cycle_schedule_matches_torch_onecyclelr_cos(void **state)
{
    (void)state;
    sf_lr_sched s = sched_of((const char *const[]){"optim.schedule", "one_cycle", "optim.max_lr", "0.01",
                                                   "optim.total_steps", "10", "optim.pct_start", "0.3", NULL});
    /* Steps 0 .. total_steps-1 are torch's values. At total_steps torch
     * evaluates the annealing past its end and gives 0.000495 (pytorch issue
     * 91765), raising one step later; here the cycle's last value, min_lr,
     * holds from then on: a service that keeps training after the cycle must
     * not go back up to 5 % of max_lr. */
    const point p[] = {{0, 0.0003999999999999993}, {1, 0.0052}, {2, 0.01}, {3, 0.009504846320134737},
                       {9, 4e-08}, {10, 4e-08}, {11, 4e-08}, {1000000, 4e-08}};
    expect(&s, p, 8);
}

static void warmup_then_cosine_matches_torch_sequentiallr(void **state)
{
    (void)state;
    sf_lr_sched s = sched_of((const char *const[]){"optim.lr", "0.2", "optim.schedule", "cosine",
                                                   "optim.t_max", "8", "optim.warmup_steps", "4",
                                                   "optim.warmup_start_factor", "0.25", NULL});
    const point p[] = {{0, 0.05},
                       {1, 0.08750000000000001},
                       {2, 0.125},
                       {3, 0.1625},
                       {4, 0.2},
                       {5, 0.19238795325112867},
                       {6, 0.17071067811865476},
                       {7, 0.138268343236509},
                       {8, 0.1},
                       {9, 0.06173165676349103},
                       {10, 0.029289321881345254},
                       {11, 0.007612046748871327},
                       {12, 0.0},
                       {13, 0.007612046748871316}};
    expect(&s, p, 14);
}

static void inconsistent_schedules_are_refused_by_the_config_check(void **state)
{
    (void)state;
    static const char *const bad[][2] = {
        {"optim.milestones", "[5, 2]"},
        {"optim.milestones", "[1, x]"},
        {"optim.milestones", "[-1]"},
        {"optim.milestones", "[1,]"},
        {"optim.milestones", "{}"},
    };
    sf_config c;
    char err[256], field[64];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sf_config_defaults(&c);
        /* Text that is not JSON fails when set; the rest in the check. */
        if (sf_config_set_text(&c, bad[i][0], bad[i][1], err, sizeof err) == 0 &&
            sf_config_validate(&c, err, sizeof err, field, sizeof field) == 0)
            fail_msg("%s=%s accepted", bad[i][0], bad[i][1]);
        assert_non_null(strstr(err, "milestones"));
    }
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "optim.schedule", "cosine", err, sizeof err), 0);
    assert_int_not_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), 0);
    assert_non_null(strstr(err, "t_max"));
    assert_int_equal(sf_config_set_text(&c, "optim.t_max", "100", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), 0);
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "optim.warmup_steps", "5", err, sizeof err), 0);
    assert_int_equal(sf_config_set_text(&c, "optim.schedule", "one_cycle", err, sizeof err), 0);
    assert_int_equal(sf_config_set_text(&c, "optim.total_steps", "100", err, sizeof err), 0);
    assert_int_not_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), 0);
    assert_int_equal(sf_config_set_text(&c, "optim.warmup_steps", "0", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), 0);
    /* One cycle needs two phases of positive length: 1 < pct_start * total_steps < total_steps. */
    assert_int_equal(sf_config_set_text(&c, "optim.total_steps", "3", err, sizeof err), 0);
    assert_int_not_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), 0);
    /* 65 milestones: one more than the bound. */
    char many[1024] = "[";
    for (int i = 0; i <= SF_LR_MAX_MILESTONES; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%s%d", i ? "," : "", i);
    strcat(many, "]");
    int64_t ms[SF_LR_MAX_MILESTONES];
    assert_int_equal(sf_lr_parse_milestones(many, ms, err, sizeof err), -1);
    assert_int_equal(sf_lr_parse_milestones(" [ ] ", ms, err, sizeof err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(constant_schedule_returns_optim_lr_at_every_step),
        cmocka_unit_test(step_schedule_matches_torch_steplr),
        cmocka_unit_test(multistep_schedule_matches_torch_multisteplr),
        cmocka_unit_test(cosine_schedule_matches_torch_closed_form_past_t_max),
        cmocka_unit_test(one_cycle_schedule_matches_torch_onecyclelr_cos),
        cmocka_unit_test(warmup_then_cosine_matches_torch_sequentiallr),
        cmocka_unit_test(inconsistent_schedules_are_refused_by_the_config_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
