/* tests/unit/test_ref_models.c — model features beyond a plain convolution
 * chain, through the reference backend's vtable: a residual + batchnorm
 * model's analytic gradient against finite differences of the loss, AdamW and gradient accumulation on a
 * learnable task, a segmentation model on a learnable per-pixel task, frozen
 * layers, and the batchnorm buffers. */
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
#include "gpu/rng.h"
#include "tests/unit/backend_step.h"
#include "tests/unit/small_models.h"

#define BATCH 16
#define HW 8

static char err[256];

/* Encoder (frozen in the freeze test) + decoder with a transposed conv: a
 * segmentation model of 2 classes on 8x8. */
static const char *const SEG_SPEC =
    "{\"input\":[3,8,8],\"classes\":2,\"layers\":["
    "{\"type\":\"conv2d\",\"name\":\"enc.0\",\"out\":8,\"k\":1},{\"type\":\"relu\",\"name\":\"enc.1\"},"
    "{\"type\":\"conv2d\",\"name\":\"enc.2\",\"out\":8,\"k\":2,\"stride\":2},{\"type\":\"relu\",\"name\":\"enc.3\"},"
    "{\"type\":\"conv_transpose2d\",\"name\":\"dec.0\",\"out\":8,\"k\":2,\"stride\":2},"
    "{\"type\":\"relu\",\"name\":\"dec.1\"},{\"type\":\"conv2d\",\"name\":\"dec.2\",\"out\":2,\"k\":1}]}";

typedef struct rig {
    sf_backend *be;
    sf_model m;
    sf_train_cfg cfg;
    sf_aug_pipeline p;
    sf_aug_plan plan;
    sf_aug_sample s[BATCH];
    uint8_t images[BATCH * HW * HW * 3]; /* NHWC */
    uint8_t labels[BATCH * HW * HW];     /* [N] or [N,H,W] */
} rig;

static rig *rig_new(const char *spec, const char *freeze, sf_optim opt, int accum)
{
    rig *r = calloc(1, sizeof *r);
    r->be = sf_backend_ref_new(err, sizeof err);
    assert_non_null(r->be);
    if (sf_model_from_json(spec, &r->m, err, sizeof err) != 0)
        fail_msg("spec: %s", err);
    if (freeze && sf_model_set_freeze(&r->m, freeze, err, sizeof err) != 0)
        fail_msg("freeze: %s", err);
    r->cfg.precision = SF_PREC_FP32;
    r->cfg.seed = 3;
    r->cfg.max_batch = BATCH;
    r->cfg.optim = opt;
    r->cfg.grad_accum_steps = accum;
    if (r->be->i->build(r->be, &r->m, &r->cfg, err, sizeof err) != 0)
        fail_msg("build: %s", err);
    assert_int_equal(sf_aug_parse("[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":0.00392156862745098},"
                                  "{\"op\":\"normalize\",\"mean\":[0.3],\"std\":[0.3]}]",
                                  &r->p, err, sizeof err), 0);
    assert_int_equal(sf_aug_plan_make(&r->p, HW, HW, 3, &r->plan, err, sizeof err), 0);
    return r;
}

static void rig_free(rig *r)
{
    r->be->i->destroy(r->be);
    free(r);
}

/* Classification: label q in 0..3; q < 3 brightens channel q, 3 none. */
static void make_cls_batch(rig *r, uint64_t seq)
{
    for (int i = 0; i < BATCH; i++) {
        int q = (int)(sf_hash4(11, seq, i, 0) % 4);
        r->labels[i] = (uint8_t)q;
        for (int p = 0; p < HW * HW; p++)
            for (int ch = 0; ch < 3; ch++)
                r->images[((size_t)i * HW * HW + p) * 3 + ch] =
                    (uint8_t)(sf_hash4(seq, i, p, ch) % 100 + (ch == q ? 100 : 0));
    }
}

/* Segmentation: a pixel is class 1 when it is bright (all channels). */
static void make_seg_batch(rig *r, uint64_t seq)
{
    for (int i = 0; i < BATCH; i++)
        for (int p = 0; p < HW * HW; p++) {
            int bright = (int)(sf_hash4(13, seq, i, p) % 2);
            r->labels[i * HW * HW + p] = (uint8_t)bright;
            for (int ch = 0; ch < 3; ch++)
                r->images[((size_t)i * HW * HW + p) * 3 + ch] =
                    (uint8_t)(sf_hash4(seq, i, p, ch) % 80 + (bright ? 120 : 0));
        }
}

static sf_batch batch_of(rig *r, uint64_t seq, float lr, float momentum)
{
    sf_aug_gen(&r->p, &r->plan, 1, seq, BATCH, r->s);
    sf_batch b = u8_nhwc_batch(BATCH, HW, HW, 3, r->images, r->labels, &r->plan, r->s, lr);
    b.id = seq + 1;
    b.seq = seq;
    b.hyper.momentum = momentum;
    return b;
}

static sf_event step(rig *r, const sf_batch *b) { return trained_step(r->be, b); }

/* Trains `steps` batches; returns mean loss of the last 10 over the first 10. */
static double train_ratio(rig *r, int steps, int seg, float lr, float momentum, sf_event *last)
{
    double first = 0, tail = 0;
    for (int s = 0; s < steps; s++) {
        if (seg)
            make_seg_batch(r, (uint64_t)s);
        else
            make_cls_batch(r, (uint64_t)s);
        sf_batch b = batch_of(r, (uint64_t)s, lr, momentum);
        sf_event ev = step(r, &b);
        if (s < 10)
            first += ev.loss;
        if (s >= steps - 10)
            tail += ev.loss;
        if (last)
            *last = ev;
    }
    return tail / first;
}

static void residual_bn_backward_matches_finite_differences_of_the_loss(void **state)
{
    rig *r = rig_new(RES_SPEC, NULL, SF_OPT_SGD, 1);
    const size_t np = r->m.n_params;
    float *p0 = malloc(np * sizeof *p0), *p1 = malloc(np * sizeof *p1), *pp = malloc(np * sizeof *pp);
    assert_int_equal(r->be->i->get_params(r->be, p0), 0);
    make_cls_batch(r, 5);
    /* SGD with lr 1, no momentum, no decay: p1 = p0 - grad. */
    sf_batch b = batch_of(r, 5, 1.0f, 0.0f);
    step(r, &b);
    assert_int_equal(r->be->i->get_params(r->be, p1), 0);
    b.hyper.lr = 0.0f; /* probes: the loss only */
    int checked = 0, bad = 0;
    for (size_t e = 0; e < np; e += 7) {
        const double h = 2e-3;
        memcpy(pp, p0, np * sizeof *pp);
        pp[e] = (float)(p0[e] + h);
        r->be->i->set_params(r->be, pp);
        double lp = step(r, &b).loss;
        pp[e] = (float)(p0[e] - h);
        r->be->i->set_params(r->be, pp);
        double lm = step(r, &b).loss;
        double fd = (lp - lm) / (2 * h), an = (double)p0[e] - (double)p1[e];
        if (fabs(fd - an) > 2e-3 + 0.05 * fabs(an)) {
            if (bad++ < 5)
                print_error("param %zu: analytic %.6g finite difference %.6g\n", e, an, fd);
        }
        checked++;
    }
    assert_true(checked > 40);
    assert_int_equal(bad, 0);
    free(p0);
    free(p1);
    free(pp);
    rig_free(r);
}

static void adamw_trains_the_residual_model_below_half_the_loss(void **state)
{
    rig *r = rig_new(RES_SPEC, NULL, SF_OPT_ADAMW, 1);
    sf_event last;
    double ratio = train_ratio(r, 150, 0, 0.01f, 0.0f, &last);
    if (ratio >= 0.5)
        fail_msg("AdamW: loss ratio last/first %.3f", ratio);
    assert_int_equal(last.step, 150);
    /* AdamW's moments are state: both read back non-zero. */
    float *m1 = calloc(r->m.n_params, sizeof *m1), *m2 = calloc(r->m.n_params, sizeof *m2);
    uint64_t st = 0;
    assert_int_equal(r->be->i->get_opt_state(r->be, m1, &st), 0);
    assert_int_equal(r->be->i->get_opt_sq(r->be, m2), 0);
    assert_int_equal(st, 150);
    double s1 = 0, s2 = 0;
    for (size_t e = 0; e < r->m.n_params; e++)
        s1 += fabs(m1[e]), s2 += m2[e];
    assert_true(s1 > 0 && s2 > 0);
    free(m1);
    free(m2);
    rig_free(r);
}

static void grad_accumulation_steps_every_k_batches_and_still_learns(void **state)
{
    rig *r = rig_new(RES_SPEC, NULL, SF_OPT_ADAMW, 3);
    sf_event last;
    double ratio = train_ratio(r, 240, 0, 0.01f, 0.0f, &last);
    if (ratio >= 0.5)
        fail_msg("accumulation: loss ratio last/first %.3f", ratio);
    assert_int_equal(last.step, 80); /* optimizer steps, not batches */
    rig_free(r);
}

static void batchnorm_running_stats_and_num_batches_tracked_advance_in_training(void **state)
{
    rig *r = rig_new(RES_SPEC, NULL, SF_OPT_SGD, 1);
    float buf[16];
    uint64_t nbt = 99;
    assert_int_equal(r->m.n_buffers, 16);
    assert_int_equal(r->be->i->get_buffers(r->be, buf, &nbt), 0);
    assert_int_equal(nbt, 0);
    assert_true(buf[0] == 0.0f && buf[4] == 1.0f); /* bn1: mean 0, var 1 */
    train_ratio(r, 12, 0, 0.05f, 0.9f, NULL);
    assert_int_equal(r->be->i->get_buffers(r->be, buf, &nbt), 0);
    assert_int_equal(nbt, 12);
    assert_true(buf[0] != 0.0f && buf[4] != 1.0f);
    /* set_buffers round-trips. */
    buf[3] = 0.25f;
    assert_int_equal(r->be->i->set_buffers(r->be, buf, 7), 0);
    float back[16];
    assert_int_equal(r->be->i->get_buffers(r->be, back, &nbt), 0);
    assert_int_equal(nbt, 7);
    assert_memory_equal(back, buf, sizeof buf);
    rig_free(r);
}

static void segmentation_model_learns_a_per_pixel_task(void **state)
{
    rig *r = rig_new(SEG_SPEC, NULL, SF_OPT_SGD, 1);
    assert_int_equal(r->m.segmentation, 1);
    sf_event last;
    double ratio = train_ratio(r, 200, 1, 0.1f, 0.9f, &last);
    if (ratio >= 0.5)
        fail_msg("segmentation: loss ratio last/first %.3f", ratio);
    assert_int_equal(last.n_labels, BATCH * HW * HW);
    assert_true((double)last.correct / (double)last.n_labels > 0.9); /* pixel accuracy */
    rig_free(r);
}

static void frozen_layers_stay_bit_identical_and_have_no_optimizer_state(void **state)
{
    rig *r = rig_new(SEG_SPEC, "enc", SF_OPT_SGD, 1);
    const size_t np = r->m.n_params, frozen = r->m.train_off;
    assert_int_equal(r->m.n_frozen, 4);
    assert_int_equal(frozen, (8 * 3 + 8) + (8 * 8 * 4 + 8));
    float *before = malloc(np * sizeof *before), *after = malloc(np * sizeof *after);
    float *mom = malloc(np * sizeof *mom);
    assert_int_equal(r->be->i->get_params(r->be, before), 0);
    double ratio = train_ratio(r, 60, 1, 0.1f, 0.9f, NULL);
    assert_int_equal(r->be->i->get_params(r->be, after), 0);
    assert_memory_equal(before, after, frozen * sizeof(float));
    assert_memory_not_equal(before + frozen, after + frozen, (np - frozen) * sizeof(float));
    assert_true(ratio < 1.0); /* the decoder alone still learns */
    uint64_t st;
    assert_int_equal(r->be->i->get_opt_state(r->be, mom, &st), 0);
    for (size_t e = 0; e < frozen; e++)
        assert_true(mom[e] == 0.0f);
    free(before);
    free(after);
    free(mom);
    rig_free(r);
}

static void labels_outside_the_classes_fail_the_segmentation_step(void **state)
{
    rig *r = rig_new(SEG_SPEC, NULL, SF_OPT_SGD, 1);
    make_seg_batch(r, 1);
    r->labels[BATCH * HW * HW - 1] = 2;
    sf_batch b = batch_of(r, 1, 0.1f, 0.0f);
    assert_int_equal(r->be->i->submit(r->be, &b, err, sizeof err), 0);
    sf_event ev[4];
    assert_int_equal(r->be->i->poll(r->be, ev, 4, 0), 2);
    assert_int_not_equal(ev[1].status, 0);
    assert_non_null(strstr(ev[1].err, "outside"));
    rig_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(residual_bn_backward_matches_finite_differences_of_the_loss),
        cmocka_unit_test(adamw_trains_the_residual_model_below_half_the_loss),
        cmocka_unit_test(grad_accumulation_steps_every_k_batches_and_still_learns),
        cmocka_unit_test(batchnorm_running_stats_and_num_batches_tracked_advance_in_training),
        cmocka_unit_test(segmentation_model_learns_a_per_pixel_task),
        cmocka_unit_test(frozen_layers_stay_bit_identical_and_have_no_optimizer_state),
        cmocka_unit_test(labels_outside_the_classes_fail_the_segmentation_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
