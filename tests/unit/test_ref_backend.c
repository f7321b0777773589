/* tests/unit/test_ref_backend.c — the reference backend through the
 * sf_backend_i vtable: training on a learnable task, the event protocol,
 * validation, parameters and transform. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/backend.h"
#include "gpu/ref/ref.h"
#include "gpu/rng.h"
#include "tests/unit/backend_step.h"

#define BATCH 32
#define HW 32

static char err[256];

typedef struct fixture {
    sf_backend *be;
    sf_model m;
    sf_train_cfg cfg;
    sf_aug_pipeline p;
    sf_aug_plan plan;
    sf_aug_sample s[BATCH];
    uint8_t *images; /* BATCH x HW x HW x 3, NHWC, from host_alloc */
    uint8_t labels[BATCH];
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    f->be = sf_backend_ref_new(err, sizeof err);
    assert_non_null(f->be);
    assert_string_equal(f->be->i->name(f->be), "ref");
    assert_int_equal(sf_model_from_preset("tiny", &f->m, err, sizeof err), 0);
    f->cfg.precision = SF_PREC_FP32;
    f->cfg.seed = 42;
    f->cfg.max_batch = BATCH;
    if (f->be->i->build(f->be, &f->m, &f->cfg, err, sizeof err) != 0)
        fail_msg("build: %s", err);
    /* x/255, then centred: without the normalize, the small PyTorch-style
     * initial weights leave training on a plateau at ln 4 for a long while. */
    assert_int_equal(sf_aug_parse("[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":0.00392156862745098},"
                                  "{\"op\":\"normalize\",\"mean\":[0.3],\"std\":[0.3]}]",
                                  &f->p, err, sizeof err), 0);
    assert_int_equal(sf_aug_plan_make(&f->p, HW, HW, 3, &f->plan, err, sizeof err), 0);
    f->images = f->be->i->host_alloc(f->be, BATCH * HW * HW * 3);
    assert_non_null(f->images);
    assert_int_equal((uintptr_t)f->images % 64, 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    f->be->i->host_free(f->be, f->images);
    f->be->i->destroy(f->be);
    free(f);
    return 0;
}

/* The learnable task: dim noise everywhere, one quadrant brighter; the label
 * is the bright quadrant (0..3, of the model's 10 classes). A model that only
 * learns the class prior stays at loss ln 4 = 1.39; below that it sees. */
static void make_batch(fixture *f, uint64_t seq)
{
    for (int i = 0; i < BATCH; i++) {
        int q = (int)(sf_hash4(7, seq, i, 0) % 4);
        f->labels[i] = (uint8_t)q;
        for (int y = 0; y < HW; y++)
            for (int x = 0; x < HW; x++) {
                int in_q = (y >= HW / 2) * 2 + (x >= HW / 2) == q;
                for (int ch = 0; ch < 3; ch++) {
                    uint64_t h = sf_hash4(seq, i, (uint64_t)y * HW + x, ch);
                    f->images[(((size_t)i * HW + y) * HW + x) * 3 + ch] = (uint8_t)(h % 100 + (in_q ? 90 : 0));
                }
            }
    }
}

static sf_batch batch_of(fixture *f, uint64_t seq, int n)
{
    sf_aug_gen(&f->p, &f->plan, 1, seq, n, f->s);
    sf_batch b = u8_nhwc_batch(n, HW, HW, 3, f->images, f->labels, &f->plan, f->s, 0.02f);
    b.id = 1000 + seq;
    b.seq = seq;
    b.token = (void *)(uintptr_t)(0xabc0 + seq);
    b.hyper.momentum = 0.9f;
    return b;
}

static sf_event step(fixture *f, const sf_batch *b) { return submit_step(f->be, b); }

static void training_the_tiny_preset_on_a_learnable_task_halves_the_loss(void **state)
{
    fixture *f = *state;
    const int steps = 200, win = 20;
    double first = 0, last = 0;
    int correct_last = 0;
    for (int s = 0; s < steps; s++) {
        make_batch(f, (uint64_t)s);
        sf_batch b = batch_of(f, (uint64_t)s, BATCH);
        sf_event ev = step(f, &b);
        if (ev.status != 0)
            fail_msg("step %d: %s", s, ev.err);
        assert_true(isfinite(ev.loss));
        assert_int_equal(ev.step, (uint64_t)s + 1);
        if (s == 0)
            first = ev.loss;
        if (s >= steps - win) {
            last += ev.loss;
            correct_last += ev.correct;
        }
    }
    last /= win;
    print_message("loss: first step %.4f, mean of the last %d steps %.4f, their accuracy %.3f\n", first, win,
                  last, (double)correct_last / (win * BATCH));
    assert_true(first > 1.8); /* near ln 10 at the start */
    assert_true(last < 0.5 * first);
    assert_true(last < 1.0); /* below ln 4: it sees the bright quadrant, not just the prior */
}

static void events_come_slot_free_then_step_done_with_ids_tokens_and_timings(void **state)
{
    fixture *f = *state;
    assert_int_equal(f->be->i->max_inflight(f->be), 1);
    sf_event ev[4];
    assert_int_equal(f->be->i->poll(f->be, ev, 4, 0), 0); /* nothing yet */
    make_batch(f, 5);
    sf_batch b = batch_of(f, 5, 8);
    assert_int_equal(f->be->i->submit(f->be, &b, err, sizeof err), 0);
    /* max = 1: one event per poll, in order */
    assert_int_equal(f->be->i->poll(f->be, ev, 1, 0), 1);
    assert_int_equal(ev[0].kind, SF_EV_SLOT_FREE);
    assert_int_equal(ev[0].id, 1005);
    assert_ptr_equal(ev[0].token, (void *)(uintptr_t)(0xabc0 + 5));
    assert_int_equal(ev[0].status, 0);
    assert_int_equal(f->be->i->poll(f->be, ev, 1, 0), 1);
    assert_int_equal(ev[0].kind, SF_EV_STEP_DONE);
    assert_int_equal(ev[0].id, 1005);
    assert_ptr_equal(ev[0].token, (void *)(uintptr_t)(0xabc0 + 5));
    assert_int_equal(ev[0].status, 0);
    assert_int_equal(ev[0].n, 8);
    assert_int_equal(ev[0].step, 1);
    assert_true(ev[0].correct >= 0 && ev[0].correct <= 8);
    assert_true(ev[0].loss > 0);
    assert_true(ev[0].t_transform_start_ns > 0);
    assert_true(ev[0].t_transform_start_ns <= ev[0].t_step_start_ns);
    assert_true(ev[0].t_step_start_ns <= ev[0].t_step_end_ns);
    assert_true(ev[0].step_s > 0 && ev[0].transform_s >= 0);
    assert_int_equal(f->be->i->poll(f->be, ev, 4, 0), 0);

    /* Two batches submitted back to back (each polled fully between) keep order. */
    for (uint64_t seq = 6; seq < 8; seq++) {
        b = batch_of(f, seq, 4);
        assert_int_equal(f->be->i->submit(f->be, &b, err, sizeof err), 0);
        assert_int_equal(f->be->i->poll(f->be, ev, 4, 100), 2);
        assert_int_equal(ev[0].id, 1000 + seq);
        assert_int_equal(ev[1].id, 1000 + seq);
        assert_int_equal(ev[1].step, seq - 4);
    }
}

static void a_bad_label_fails_the_step_but_still_yields_both_events(void **state)
{
    fixture *f = *state;
    make_batch(f, 1);
    f->labels[3] = 10; /* the model has 10 classes */
    float *before = malloc(sizeof(float) * f->m.n_params), *after = malloc(sizeof(float) * f->m.n_params);
    assert_int_equal(f->be->i->get_params(f->be, before), 0);
    sf_batch b = batch_of(f, 1, BATCH);
    assert_int_equal(f->be->i->submit(f->be, &b, err, sizeof err), 0);
    sf_event ev[4];
    assert_int_equal(f->be->i->poll(f->be, ev, 4, 0), 2);
    assert_int_equal(ev[0].kind, SF_EV_SLOT_FREE);
    assert_int_equal(ev[1].kind, SF_EV_STEP_DONE);
    assert_int_not_equal(ev[1].status, 0);
    assert_non_null(strstr(ev[1].err, "label"));
    assert_int_equal(ev[1].step, 0);
    assert_int_equal(f->be->i->get_params(f->be, after), 0);
    assert_memory_equal(before, after, sizeof(float) * f->m.n_params); /* no update */
    free(before);
    free(after);
}

static void submit_rejects_wrong_shapes_and_oversized_batches_without_events(void **state)
{
    fixture *f = *state;
    make_batch(f, 1);
    sf_event ev[4];

    sf_batch b = batch_of(f, 1, BATCH);
    b.n = BATCH + 1; /* n > max_batch */
    assert_int_equal(f->be->i->submit(f->be, &b, err, sizeof err), -1);
    assert_non_null(strstr(err, "max_batch"));

    /* The plan's output (16x16 after a crop) is not the model's 32x32 input. */
    static sf_aug_pipeline p2;
    static sf_aug_plan plan2;
    assert_int_equal(sf_aug_parse("[{\"op\":\"random_crop\",\"size\":[16,16]}]", &p2, err, sizeof err), 0);
    assert_int_equal(sf_aug_plan_make(&p2, HW, HW, 3, &plan2, err, sizeof err), 0);
    b = batch_of(f, 1, 4);
    sf_aug_gen(&p2, &plan2, 1, 1, 4, f->s);
    b.plan = &plan2;
    assert_int_equal(f->be->i->submit(f->be, &b, err, sizeof err), -1);
    assert_non_null(strstr(err, "does not match the model input"));

    /* Images whose shape is not the plan's. */
    b = batch_of(f, 1, 4);
    b.h = 31;
    assert_int_equal(f->be->i->submit(f->be, &b, err, sizeof err), -1);
    assert_non_null(strstr(err, "plan"));

    assert_int_equal(f->be->i->poll(f->be, ev, 4, 0), 0);
    assert_int_equal(f->be->i->health(f->be, err, sizeof err), 0);
}

static void labels_of_every_dtype_give_the_same_step(void **state)
{
    fixture *f = *state;
    make_batch(f, 3);
    float *p0 = malloc(sizeof(float) * f->m.n_params), *p1 = malloc(sizeof(float) * f->m.n_params);
    assert_int_equal(f->be->i->get_params(f->be, p0), 0);
    int32_t l32[BATCH];
    int64_t l64[BATCH];
    for (int i = 0; i < BATCH; i++) {
        l32[i] = f->labels[i];
        l64[i] = f->labels[i];
    }
    float loss[3];
    for (int d = 0; d < 3; d++) {
        assert_int_equal(f->be->i->set_params(f->be, p0), 0);
        sf_batch b = batch_of(f, 3, BATCH);
        b.label_dtype = d == 0 ? SF_LABEL_U8 : d == 1 ? SF_LABEL_I32 : SF_LABEL_I64;
        b.labels = d == 0 ? (const void *)f->labels : d == 1 ? (const void *)l32 : (const void *)l64;
        sf_event ev = step(f, &b);
        assert_int_equal(ev.status, 0);
        loss[d] = ev.loss;
        assert_int_equal(f->be->i->get_params(f->be, p1), 0);
        assert_memory_not_equal(p0, p1, sizeof(float) * f->m.n_params);
    }
    assert_true(loss[0] == loss[1] && loss[1] == loss[2]);
    free(p0);
    free(p1);
}

static void build_initialises_params_from_the_seed_and_get_set_round_trip(void **state)
{
    fixture *f = *state;
    size_t n = f->m.n_params;
    float *a = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
    sf_model_init_params(&f->m, f->cfg.seed, want);
    assert_int_equal(f->be->i->get_params(f->be, a), 0);
    assert_memory_equal(a, want, sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        a[i] = (float)i * 1e-6f;
    assert_int_equal(f->be->i->set_params(f->be, a), 0);
    assert_int_equal(f->be->i->get_params(f->be, want), 0);
    assert_memory_equal(a, want, sizeof(float) * n);
    /* Rebuilding replaces all state: params from the seed again. */
    assert_int_equal(f->be->i->build(f->be, &f->m, &f->cfg, err, sizeof err), 0);
    sf_model_init_params(&f->m, f->cfg.seed, want);
    assert_int_equal(f->be->i->get_params(f->be, a), 0);
    assert_memory_equal(a, want, sizeof(float) * n);
    free(a);
    free(want);
}

static void transform_equals_the_reference_augmentation(void **state)
{
    fixture *f = *state;
    make_batch(f, 9);
    static sf_aug_pipeline p;
    static sf_aug_plan plan;
    assert_int_equal(sf_aug_parse("[{\"op\":\"random_crop\",\"size\":[24,24]},{\"op\":\"resize\",\"size\":[32,32]},"
                                  "{\"op\":\"random_rotation\",\"degrees\":45},"
                                  "{\"op\":\"gaussian_blur\",\"kernel_size\":5},"
                                  "{\"op\":\"normalize\",\"mean\":[100],\"std\":[50]},"
                                  "{\"op\":\"random_mask\",\"ratio\":0.02,\"dilate\":1}]",
                                  &p, err, sizeof err), 0);
    assert_int_equal(sf_aug_plan_make(&p, HW, HW, 3, &plan, err, sizeof err), 0);
    sf_batch b = batch_of(f, 9, 6);
    sf_aug_gen(&p, &plan, 3, 9, 6, f->s);
    b.plan = &plan;
    size_t out = (size_t)6 * 3 * HW * HW;
    float *x = malloc(sizeof(float) * out), *y = malloc(sizeof(float) * out);
    for (size_t i = 0; i < out; i++)
        x[i] = NAN;
    assert_int_equal(f->be->i->transform(f->be, &b, x, err, sizeof err), 0);
    sf_ref_augment(&plan, f->s, 6, f->images, 1, y);
    assert_memory_equal(x, y, sizeof(float) * out);
    sf_event ev[2];
    assert_int_equal(f->be->i->poll(f->be, ev, 2, 0), 0); /* transform yields no events */
    free(x);
    free(y);
}

/* Steps seq [from, to) of the learnable task; the losses into loss[] when given. */
static void train_range(fixture *f, uint64_t from, uint64_t to, float *loss)
{
    for (uint64_t s = from; s < to; s++) {
        make_batch(f, s);
        sf_batch b = batch_of(f, s, BATCH);
        b.hyper.weight_decay = s % 2 ? 1e-3f : 0.0f; /* hyper-parameters change between steps */
        sf_event ev = step(f, &b);
        if (ev.status != 0)
            fail_msg("step %llu: %s", (unsigned long long)s, ev.err);
        if (loss)
            loss[s - from] = ev.loss;
    }
}

static void opt_state_is_zero_momentum_and_step_0_after_build(void **state)
{
    fixture *f = *state;
    const size_t n = f->m.n_params;
    float *mom = malloc(sizeof(float) * n), *zero = calloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++)
        mom[i] = NAN;
    uint64_t st = 99;
    assert_int_equal(f->be->i->get_opt_state(f->be, mom, &st), 0);
    assert_int_equal(st, 0);
    assert_memory_equal(mom, zero, sizeof(float) * n);
    /* Plain SGD (momentum 0) leaves the buffer untouched: still zeros. */
    make_batch(f, 1);
    sf_batch b = batch_of(f, 1, BATCH);
    b.hyper.momentum = 0.0f;
    sf_event ev = step(f, &b);
    assert_int_equal(ev.status, 0);
    assert_int_equal(f->be->i->get_opt_state(f->be, mom, &st), 0);
    assert_int_equal(st, 1);
    assert_memory_equal(mom, zero, sizeof(float) * n);
    free(mom);
    free(zero);
}

static void restoring_params_and_opt_state_continues_training_bit_exactly(void **state)
{
    fixture *f = *state;
    const size_t n = f->m.n_params, bytes = sizeof(float) * n;
    const int k = 6, m = 5;
    float *p0 = malloc(bytes), *m0 = malloc(bytes), *p1 = malloc(bytes), *m1 = malloc(bytes), *p2 = malloc(bytes),
          *m2 = malloc(bytes), *zero = calloc(n, sizeof(float));
    float loss1[5], loss2[5];
    uint64_t s0 = 0, s1 = 0, s2 = 0;

    train_range(f, 0, (uint64_t)k, NULL);
    assert_int_equal(f->be->i->get_params(f->be, p0), 0);
    assert_int_equal(f->be->i->get_opt_state(f->be, m0, &s0), 0);
    assert_int_equal(s0, (uint64_t)k);
    assert_memory_not_equal(m0, zero, bytes); /* momentum 0.9 was used */

    train_range(f, (uint64_t)k, (uint64_t)(k + m), loss1);
    assert_int_equal(f->be->i->get_params(f->be, p1), 0);
    assert_int_equal(f->be->i->get_opt_state(f->be, m1, &s1), 0);
    assert_int_equal(s1, (uint64_t)(k + m));

    /* Back to the snapshot in the same backend: the same m batches give the
     * same bits, and the step counter continues from k. */
    assert_int_equal(f->be->i->set_params(f->be, p0), 0);
    assert_int_equal(f->be->i->set_opt_state(f->be, m0, s0), 0);
    make_batch(f, (uint64_t)k);
    sf_batch b = batch_of(f, (uint64_t)k, BATCH);
    b.hyper.weight_decay = k % 2 ? 1e-3f : 0.0f;
    sf_event ev = step(f, &b);
    assert_int_equal(ev.step, (uint64_t)k + 1);
    loss2[0] = ev.loss;
    train_range(f, (uint64_t)k + 1, (uint64_t)(k + m), loss2 + 1);
    assert_int_equal(f->be->i->get_params(f->be, p2), 0);
    assert_int_equal(f->be->i->get_opt_state(f->be, m2, &s2), 0);
    assert_memory_equal(loss1, loss2, sizeof loss1);
    assert_memory_equal(p1, p2, bytes);
    assert_memory_equal(m1, m2, bytes);
    assert_int_equal(s2, s1);

    /* Into a freshly built backend (another seed): the same again. */
    sf_backend *be2 = sf_backend_ref_new(err, sizeof err);
    assert_non_null(be2);
    sf_train_cfg cfg2 = f->cfg;
    cfg2.seed = 7;
    assert_int_equal(be2->i->build(be2, &f->m, &cfg2, err, sizeof err), 0);
    assert_int_equal(be2->i->set_params(be2, p0), 0);
    assert_int_equal(be2->i->set_opt_state(be2, m0, s0), 0);
    sf_backend *keep = f->be;
    f->be = be2;
    train_range(f, (uint64_t)k, (uint64_t)(k + m), loss2);
    assert_int_equal(be2->i->get_params(be2, p2), 0);
    assert_int_equal(be2->i->get_opt_state(be2, m2, &s2), 0);
    f->be = keep;
    be2->i->destroy(be2);
    assert_memory_equal(loss1, loss2, sizeof loss1);
    assert_memory_equal(p1, p2, bytes);
    assert_memory_equal(m1, m2, bytes);
    assert_int_equal(s2, s1);

    /* The momentum matters: restoring the parameters alone (zero momentum)
     * gives other parameters. */
    assert_int_equal(f->be->i->set_params(f->be, p0), 0);
    assert_int_equal(f->be->i->set_opt_state(f->be, zero, s0), 0);
    train_range(f, (uint64_t)k, (uint64_t)(k + m), NULL);
    assert_int_equal(f->be->i->get_params(f->be, p2), 0);
    assert_memory_not_equal(p1, p2, bytes);

    free(p0);
    free(m0);
    free(p1);
    free(m1);
    free(p2);
    free(m2);
    free(zero);
}

static void bench_times_every_mode_and_leaves_the_training_state_unchanged(void **state)
{
    fixture *f = *state;
    const size_t n = f->m.n_params, bytes = sizeof(float) * n;
    float *p0 = malloc(bytes), *m0 = malloc(bytes), *p1 = malloc(bytes), *m1 = malloc(bytes);
    uint64_t s0 = 0, s1 = 0;
    train_range(f, 0, 3, NULL); /* non-trivial momentum and step count */
    assert_int_equal(f->be->i->get_params(f->be, p0), 0);
    assert_int_equal(f->be->i->get_opt_state(f->be, m0, &s0), 0);
    assert_int_equal(s0, 3);

    make_batch(f, 50);
    sf_batch b = batch_of(f, 50, BATCH);
    const sf_bench_mode modes[3] = {SF_BENCH_STEP, SF_BENCH_AUG_STEP, SF_BENCH_H2D_AUG_STEP};
    const char *names[3] = {"step", "aug+step", "h2d+aug+step"};
    for (int i = 0; i < 3; i++) {
        double sec = -1;
        if (f->be->i->bench(f->be, &b, modes[i], 1, 4, &sec, err, sizeof err) != 0)
            fail_msg("bench %s: %s", names[i], err);
        assert_true(sec > 0);
        print_message("ref bench %s: %.1f steps/s (tiny, batch %d)\n", names[i], 4 / sec, BATCH);
        assert_int_equal(f->be->i->get_params(f->be, p1), 0);
        assert_int_equal(f->be->i->get_opt_state(f->be, m1, &s1), 0);
        assert_memory_equal(p0, p1, bytes);
        assert_memory_equal(m0, m1, bytes);
        assert_int_equal(s1, s0);
        sf_event ev[4];
        assert_int_equal(f->be->i->poll(f->be, ev, 4, 0), 0); /* bench yields no events */
    }

    /* Training after a bench is training as if there had been none. */
    float lossa[2], lossb[2];
    train_range(f, 3, 5, lossa);
    assert_int_equal(f->be->i->get_params(f->be, p1), 0);
    assert_int_equal(f->be->i->set_params(f->be, p0), 0);
    assert_int_equal(f->be->i->set_opt_state(f->be, m0, s0), 0);
    train_range(f, 3, 5, lossb);
    assert_int_equal(f->be->i->get_params(f->be, p0), 0);
    assert_memory_equal(lossa, lossb, sizeof lossa);
    assert_memory_equal(p0, p1, bytes);

    /* Errors: an unknown mode, no timed steps, a bad label. */
    double sec = 0;
    assert_int_equal(f->be->i->bench(f->be, &b, (sf_bench_mode)9, 0, 1, &sec, err, sizeof err), -1);
    assert_non_null(strstr(err, "mode"));
    assert_int_equal(f->be->i->bench(f->be, &b, SF_BENCH_STEP, 0, 0, &sec, err, sizeof err), -1);
    f->labels[0] = 10;
    assert_int_equal(f->be->i->bench(f->be, &b, SF_BENCH_STEP, 0, 1, &sec, err, sizeof err), -1);
    assert_non_null(strstr(err, "label"));
    free(p0);
    free(m0);
    free(p1);
    free(m1);
}

static void device_stats_is_absent_on_the_cpu(void **state)
{
    fixture *f = *state;
    sf_device_stats ds;
    memset(&ds, 0x5a, sizeof ds);
    assert_int_equal(f->be->i->device_stats(f->be, &ds), -1);
    assert_int_equal(ds.valid, 0);
}

static void backend_without_a_model_refuses_to_submit(void **state)
{
    sf_backend *be = sf_backend_ref_new(err, sizeof err);
    assert_non_null(be);
    static fixture f;
    assert_int_equal(sf_aug_parse("[]", &f.p, err, sizeof err), 0);
    assert_int_equal(sf_aug_plan_make(&f.p, HW, HW, 3, &f.plan, err, sizeof err), 0);
    static uint8_t img[HW * HW * 3];
    f.images = img;
    sf_batch b = batch_of(&f, 0, 1);
    assert_int_equal(be->i->submit(be, &b, err, sizeof err), -1);
    assert_non_null(strstr(err, "model"));
    float buf[1];
    uint64_t st;
    double sec;
    assert_int_equal(be->i->get_params(be, buf), -1);
    assert_int_equal(be->i->get_opt_state(be, buf, &st), -1);
    assert_int_equal(be->i->set_opt_state(be, buf, 0), -1);
    assert_int_equal(be->i->bench(be, &b, SF_BENCH_STEP, 0, 1, &sec, err, sizeof err), -1);
    assert_non_null(strstr(err, "model"));
    be->i->destroy(be);
}

static void cuda_constructor_explains_why_it_is_unavailable(void **state)
{
#ifndef SF_HAVE_CUDA
    err[0] = 0;
    assert_null(sf_backend_cuda_new(0, err, sizeof err));
    assert_non_null(strstr(err, "without CUDA"));
#else
    skip();
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(training_the_tiny_preset_on_a_learnable_task_halves_the_loss, setup, teardown),
        cmocka_unit_test_setup_teardown(events_come_slot_free_then_step_done_with_ids_tokens_and_timings, setup, teardown),
        cmocka_unit_test_setup_teardown(a_bad_label_fails_the_step_but_still_yields_both_events, setup, teardown),
        cmocka_unit_test_setup_teardown(submit_rejects_wrong_shapes_and_oversized_batches_without_events, setup, teardown),
        cmocka_unit_test_setup_teardown(labels_of_every_dtype_give_the_same_step, setup, teardown),
        cmocka_unit_test_setup_teardown(build_initialises_params_from_the_seed_and_get_set_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(transform_equals_the_reference_augmentation, setup, teardown),
        cmocka_unit_test_setup_teardown(opt_state_is_zero_momentum_and_step_0_after_build, setup, teardown),
        cmocka_unit_test_setup_teardown(restoring_params_and_opt_state_continues_training_bit_exactly, setup, teardown),
        cmocka_unit_test_setup_teardown(bench_times_every_mode_and_leaves_the_training_state_unchanged, setup, teardown),
        cmocka_unit_test_setup_teardown(device_stats_is_absent_on_the_cpu, setup, teardown),
        cmocka_unit_test(backend_without_a_model_refuses_to_submit),
        cmocka_unit_test(cuda_constructor_explains_why_it_is_unavailable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
