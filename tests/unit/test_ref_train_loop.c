/* tests/unit/test_ref_train_loop.c — the reference backend's training-loop
 * options against their formulas: soft-target cross-entropy with label
 * smoothing and mixup/cutmix targets, top-5 with ties, gradient clipping,
 * evaluation batches and skipped non-finite steps. */
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

#define BATCH 8
#define HW 8
#define K 7

static char err[256];

/* The probability-target cross-entropy written out from its definition, in
 * double: t = (1-s)(lam e_y + (1-lam) e_prev) + s/k, loss_i = -sum_j t_j log p_j. */
static double closed_form_loss(const double *l, const int32_t *y, int n, int k, double s, double lam,
                               double *grad)
{
    double total = 0;
    for (int i = 0; i < n; i++) {
        double mx = l[i * k], z = 0;
        for (int j = 1; j < k; j++)
            mx = fmax(mx, l[i * k + j]);
        for (int j = 0; j < k; j++)
            z += exp(l[i * k + j] - mx);
        const int prev = y[(i + n - 1) % n];
        for (int j = 0; j < k; j++) {
            const double logp = l[i * k + j] - mx - log(z);
            const double t = (1 - s) * (lam * (j == y[i]) + (1 - lam) * (j == prev)) + s / k;
            total -= t * logp;
            grad[i * k + j] = (exp(logp) - t) / n;
        }
    }
    return total / n;
}

static void soft_target_cross_entropy_matches_the_closed_form_with_smoothing_and_mixing(void **state)
{
    const int n = 5;
    float l[5 * K];
    double ld[5 * K], g_ref[5 * K];
    int32_t y[5] = {3, 0, 6, 3, 1};
    for (int i = 0; i < n * K; i++) {
        l[i] = (float)((int)(sf_hash4(1, 2, i, 0) % 2000) - 1000) / 250.0f;
        ld[i] = l[i];
    }
    const float cases[][2] = {{0.0f, 1.0f}, {0.1f, 1.0f}, {0.0f, 0.3f}, {0.2f, 0.65f}, {0.9f, 0.01f}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const float s = cases[c][0], lam = cases[c][1];
        float loss, g[5 * K];
        int correct, correct5;
        sf_ref_xent_soft(l, y, n, K, s, lam, &loss, g, &correct, &correct5);
        const double want = closed_form_loss(ld, y, n, K, s, lam, g_ref);
        assert_true(fabs(loss - want) <= 1e-5 * fabs(want) + 1e-6);
        for (int i = 0; i < n * K; i++)
            assert_true(fabs(g[i] - g_ref[i]) <= 1e-6);
        /* The double version agrees to double rounding. */
        double lossd, gd[5 * K];
        sf_ref_xent_soft_f64(ld, y, n, K, s, lam, &lossd, gd, NULL, NULL);
        assert_true(fabs(lossd - want) <= 1e-12);
    }
    /* No smoothing and no mixing is the plain cross-entropy, bit for bit. */
    float a, b, ga[5 * K], gb[5 * K];
    int ca, cb;
    sf_ref_xent(l, y, n, K, &a, ga, &ca);
    sf_ref_xent_soft(l, y, n, K, 0.0f, 1.0f, &b, gb, &cb, NULL);
    assert_memory_equal(&a, &b, sizeof a);
    assert_memory_equal(ga, gb, sizeof ga);
    assert_int_equal(ca, cb);
}

static void label_smoothing_of_a_uniform_logit_row_costs_log_k(void **state)
{
    /* Equal logits: p = 1/k for every class, so -sum t log p = log k for any target. */
    float l[K] = {0};
    int32_t y[1] = {2};
    float loss;
    sf_ref_xent_soft(l, y, 1, K, 0.3f, 1.0f, &loss, NULL, NULL, NULL);
    assert_true(fabsf(loss - logf((float)K)) < 1e-6f);
}

static void segmentation_smoothing_matches_the_per_sample_formula_per_pixel(void **state)
{
    /* One image of 1x2 pixels, 3 classes: each pixel is a sample of the 1-D loss. */
    const float l[3 * 2] = {1.0f, -2.0f, 0.5f, 0.25f, 3.0f, -1.0f}; /* [k][h*w] */
    const int32_t y[2] = {0, 2};
    float loss;
    int64_t c1, c5;
    sf_ref_xent2d_smooth(l, y, 1, 3, 1, 2, 0.2f, &loss, NULL, &c1, &c5);
    const float p0[3] = {1.0f, 0.5f, 3.0f}, p1[3] = {-2.0f, 0.25f, -1.0f};
    const float rows[2 * 3] = {p0[0], p0[1], p0[2], p1[0], p1[1], p1[2]};
    float want;
    sf_ref_xent_soft(rows, y, 2, 3, 0.2f, 1.0f, &want, NULL, NULL, NULL);
    assert_true(fabsf(loss - want) < 1e-6f);
    assert_int_equal(c1, 0); /* pixel 0: argmax class 2; pixel 1: argmax class 1 */
    assert_int_equal(c5, 2); /* 3 classes: every pixel is a top-5 hit */
}

static void top5_counts_ties_in_torch_sorts_stable_order(void **state)
{
    /* Seven classes; the label's logit ties with others. Stable descending
     * order puts the lower class index first among equals. */
    const float l[4 * K] = {
        5, 5, 5, 5, 5, 5, 1, /* label 4: classes 0-3 ahead -> 5th: hit */
        5, 5, 5, 5, 5, 5, 1, /* label 5: classes 0-4 ahead -> 6th: miss */
        9, 8, 7, 6, 0, 0, 0, /* label 6 ties with 4 and 5, which go first: 7th: miss */
        0, 0, 0, 0, 0, 0, 0, /* label 0 of all-equal logits: 1st: hit (and the top-1, the first max) */
    };
    const int32_t y[4] = {4, 5, 6, 0};
    int c1, c5;
    sf_ref_xent_soft(l, y, 4, K, 0.0f, 1.0f, NULL, NULL, &c1, &c5);
    assert_int_equal(c5, 2);
    assert_int_equal(c1, 1);
}

static void clipping_scales_by_max_norm_over_norm_plus_1e6_and_never_up(void **state)
{
    float g[4] = {3.0f, 0.0f, -4.0f, 0.0f};
    const double norm = sf_ref_grad_norm(g, 4);
    assert_true(fabs(norm - 5.0) < 1e-12);
    sf_ref_clip_grads(g, 4, norm, 1.0f);
    const float coef = 1.0f / (5.0f + 1e-6f);
    assert_true(g[0] == 3.0f * coef && g[2] == -4.0f * coef);
    float h[2] = {0.3f, 0.4f};
    sf_ref_clip_grads(h, 2, sf_ref_grad_norm(h, 2), 10.0f); /* coefficient > 1: unchanged */
    assert_true(h[0] == 0.3f && h[1] == 0.4f);
    sf_ref_clip_grads(h, 2, sf_ref_grad_norm(h, 2), 0.0f); /* 0: off */
    assert_true(h[0] == 0.3f && h[1] == 0.4f);
}

/* ---- through the backend --------------------------------------------------- */

/* A batchnorm model, so that eval mode differs from training mode. */
static const char *const BN_SPEC =
    "{\"input\":[3,8,8],\"classes\":7,\"layers\":["
    "{\"type\":\"conv2d\",\"name\":\"conv1\",\"out\":4,\"k\":3,\"pad\":1,\"bias\":false},"
    "{\"type\":\"batchnorm2d\",\"name\":\"bn1\"},{\"type\":\"relu\",\"name\":\"r1\"},"
    "{\"type\":\"global_avgpool\",\"name\":\"gap\"},{\"type\":\"flatten\",\"name\":\"flat\"},"
    "{\"type\":\"linear\",\"name\":\"fc\",\"out\":7}]}";

typedef struct rig {
    sf_backend *be;
    sf_model m;
    sf_train_cfg cfg;
    sf_aug_pipeline p;
    sf_aug_plan plan;
    sf_aug_sample s[BATCH];
    uint8_t images[BATCH * HW * HW * 3];
    uint8_t labels[BATCH];
} rig;

static rig *rig_new(sf_optim opt, int accum)
{
    rig *r = calloc(1, sizeof *r);
    r->be = sf_backend_ref_new(err, sizeof err);
    assert_non_null(r->be);
    if (sf_model_from_json(BN_SPEC, &r->m, err, sizeof err) != 0)
        fail_msg("spec: %s", err);
    r->cfg.precision = SF_PREC_FP32;
    r->cfg.seed = 5;
    r->cfg.max_batch = BATCH;
    r->cfg.optim = opt;
    r->cfg.grad_accum_steps = accum;
    if (r->be->i->build(r->be, &r->m, &r->cfg, err, sizeof err) != 0)
        fail_msg("build: %s", err);
    assert_int_equal(sf_aug_parse("[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":0.00392156862745098}]",
                                  &r->p, err, sizeof err), 0);
    assert_int_equal(sf_aug_plan_make(&r->p, HW, HW, 3, &r->plan, err, sizeof err), 0);
    for (int i = 0; i < BATCH; i++) {
        r->labels[i] = (uint8_t)(sf_hash4(3, i, 0, 0) % K);
        for (int e = 0; e < HW * HW * 3; e++)
            r->images[i * HW * HW * 3 + e] = (uint8_t)(sf_hash4(4, i, e, 0) % 256);
    }
    return r;
}

static void rig_free(rig *r)
{
    r->be->i->destroy(r->be);
    free(r);
}

static sf_batch batch_of(rig *r, float lr)
{
    sf_aug_gen(&r->p, &r->plan, 1, 1, BATCH, r->s);
    sf_batch b = u8_nhwc_batch(BATCH, HW, HW, 3, r->images, r->labels, &r->plan, r->s, lr);
    b.id = 1;
    b.mix_lam = 1.0f;
    return b;
}

/* One batch whose step succeeds; its loss may be NaN (the skipped-step tests). */
static sf_event run(rig *r, const sf_batch *b)
{
    sf_event ev = submit_step(r->be, b);
    assert_int_equal(ev.status, 0);
    return ev;
}

/* The whole training state, to compare before and after. */
typedef struct state_copy {
    float *p, *buf, *mom, *sq;
    uint64_t step, nbt;
} state_copy;

static state_copy snapshot(rig *r)
{
    state_copy s;
    s.p = calloc(r->m.n_params, sizeof(float));
    s.buf = calloc(r->m.n_buffers, sizeof(float));
    s.mom = calloc(r->m.n_params, sizeof(float));
    s.sq = calloc(r->m.n_params, sizeof(float));
    assert_int_equal(r->be->i->get_params(r->be, s.p), 0);
    assert_int_equal(r->be->i->get_buffers(r->be, s.buf, &s.nbt), 0);
    assert_int_equal(r->be->i->get_opt_state(r->be, s.mom, &s.step), 0);
    assert_int_equal(r->be->i->get_opt_sq(r->be, s.sq), 0);
    return s;
}

static void assert_same_state(rig *r, const state_copy *a, const state_copy *b)
{
    assert_memory_equal(a->p, b->p, sizeof(float) * r->m.n_params);
    assert_memory_equal(a->buf, b->buf, sizeof(float) * r->m.n_buffers);
    assert_memory_equal(a->mom, b->mom, sizeof(float) * r->m.n_params);
    assert_memory_equal(a->sq, b->sq, sizeof(float) * r->m.n_params);
    assert_true(a->step == b->step && a->nbt == b->nbt);
}

static void snapshot_free(state_copy *s)
{
    free(s->p);
    free(s->buf);
    free(s->mom);
    free(s->sq);
}

static void an_eval_batch_changes_nothing_and_uses_the_running_statistics(void **state)
{
    rig *r = rig_new(SF_OPT_ADAMW, 1);
    sf_batch b = batch_of(r, 0.01f);
    run(r, &b); /* one training step: running statistics and moments are not initial any more */
    state_copy before = snapshot(r);
    sf_batch e = b;
    e.eval = 1;
    float logits[BATCH * K], again[BATCH * K];
    e.logits_out = logits;
    sf_event ev = run(r, &e);
    assert_int_equal(ev.eval, 1);
    assert_true(ev.grad_norm == 0.0f && ev.skipped == 0);
    assert_true(ev.step == before.step);
    state_copy after = snapshot(r);
    assert_same_state(r, &before, &after);
    /* A second eval gives the same logits, loss and hits. */
    e.logits_out = again;
    sf_event ev2 = run(r, &e);
    assert_memory_equal(logits, again, sizeof logits);
    assert_memory_equal(&ev.loss, &ev2.loss, sizeof ev.loss);
    assert_int_equal(ev.correct, ev2.correct);
    assert_int_equal(ev.correct5, ev2.correct5);
    /* The loss and hits are those of the returned logits. */
    int32_t y[BATCH];
    for (int i = 0; i < BATCH; i++)
        y[i] = r->labels[i];
    float want;
    int c1, c5;
    sf_ref_xent_soft(logits, y, BATCH, K, 0.0f, 1.0f, &want, NULL, &c1, &c5);
    assert_memory_equal(&ev.loss, &want, sizeof want);
    assert_int_equal(ev.correct, c1);
    assert_int_equal(ev.correct5, c5);
    /* Eval mode: batchnorm reads the running statistics, so a training-mode
     * forward of the same batch (batch statistics) gives other logits. */
    sf_batch t = b;
    float train_logits[BATCH * K];
    t.logits_out = train_logits;
    t.hyper.lr = 0.0f;
    run(r, &t);
    assert_true(memcmp(train_logits, logits, sizeof logits) != 0);
    snapshot_free(&before);
    snapshot_free(&after);
    rig_free(r);
}

static void a_tiny_max_norm_scales_the_sgd_step_by_the_clip_coefficient(void **state)
{
    /* SGD without momentum or weight decay: the step is -lr * g * coef. */
    rig *a = rig_new(SF_OPT_SGD, 1), *c = rig_new(SF_OPT_SGD, 1);
    state_copy p0 = snapshot(a);
    sf_batch b = batch_of(a, 1.0f);
    sf_event ea = run(a, &b);
    sf_batch bc = batch_of(c, 1.0f);
    bc.hyper.clip_grad_norm = 1e-3f;
    sf_event ec = run(c, &bc);
    assert_true(ea.grad_norm > 1e-2f);
    assert_memory_equal(&ea.grad_norm, &ec.grad_norm, sizeof ea.grad_norm); /* pre-clip */
    state_copy pa = snapshot(a), pc = snapshot(c);
    const float coef = 1e-3f / (ec.grad_norm + 1e-6f);
    for (size_t i = 0; i < a->m.n_params; i++) {
        const float g = p0.p[i] - pa.p[i]; /* lr 1: the unclipped gradient */
        const float want = p0.p[i] - 1.0f * (g * coef);
        assert_true(fabsf(pc.p[i] - want) <= 1e-6f * fabsf(p0.p[i]) + 1e-9f);
    }
    snapshot_free(&p0);
    snapshot_free(&pa);
    snapshot_free(&pc);
    rig_free(a);
    rig_free(c);
}

static void label_smoothing_and_mixing_reach_the_step_loss(void **state)
{
    rig *r = rig_new(SF_OPT_SGD, 1);
    sf_batch b = batch_of(r, 0.0f);
    b.eval = 1;
    float logits[BATCH * K];
    b.logits_out = logits;
    run(r, &b);
    int32_t y[BATCH];
    for (int i = 0; i < BATCH; i++)
        y[i] = r->labels[i];
    /* A training batch with lr 0 computes the training-mode forward; compare
     * its loss with the formula on the logits it returns. */
    sf_batch t = batch_of(r, 0.0f);
    t.label_smoothing = 0.25f;
    t.mix_lam = 0.7f;
    t.logits_out = logits;
    sf_event ev = run(r, &t);
    float want;
    sf_ref_xent_soft(logits, y, BATCH, K, 0.25f, 0.7f, &want, NULL, NULL, NULL);
    assert_memory_equal(&ev.loss, &want, sizeof want);
    float plain;
    sf_ref_xent_soft(logits, y, BATCH, K, 0.0f, 1.0f, &plain, NULL, NULL, NULL);
    assert_true(fabsf(plain - want) > 1e-3f);
    rig_free(r);
}

static void a_non_finite_loss_skips_the_step_and_the_next_batch_trains(void **state)
{
    rig *r = rig_new(SF_OPT_ADAMW, 1);
    sf_batch b = batch_of(r, 0.01f);
    run(r, &b);
    state_copy good = snapshot(r);
    /* A NaN weight makes every logit and so the loss NaN. */
    float *p = calloc(r->m.n_params, sizeof(float));
    memcpy(p, good.p, sizeof(float) * r->m.n_params);
    p[r->m.n_params - 1] = NAN; /* the last bias of fc */
    assert_int_equal(r->be->i->set_params(r->be, p), 0);
    sf_event ev = run(r, &b);
    assert_int_equal(ev.skipped, 1);
    assert_true(isnan(ev.loss));
    assert_true(ev.grad_norm == 0.0f);
    assert_true(ev.step == good.step);
    state_copy after = snapshot(r);
    assert_memory_equal(after.mom, good.mom, sizeof(float) * r->m.n_params);
    assert_memory_equal(after.sq, good.sq, sizeof(float) * r->m.n_params);
    assert_true(after.step == good.step);
    assert_true(isnan(after.p[r->m.n_params - 1]));
    /* Restore the weights: the next batch trains and counts its step. */
    assert_int_equal(r->be->i->set_params(r->be, good.p), 0);
    sf_event ok = run(r, &b);
    assert_int_equal(ok.skipped, 0);
    assert_true(isfinite(ok.loss) && ok.grad_norm > 0.0f);
    assert_true(ok.step == good.step + 1);
    free(p);
    snapshot_free(&good);
    snapshot_free(&after);
    rig_free(r);
}

static void a_non_finite_batch_drops_its_whole_accumulation_group(void **state)
{
    rig *r = rig_new(SF_OPT_SGD, 2);
    state_copy s0 = snapshot(r);
    sf_batch b = batch_of(r, 0.1f);
    float *p = calloc(r->m.n_params, sizeof(float));
    memcpy(p, s0.p, sizeof(float) * r->m.n_params);
    p[r->m.n_params - 1] = INFINITY;
    assert_int_equal(r->be->i->set_params(r->be, p), 0);
    sf_event e1 = run(r, &b); /* mid-group: no optimizer step yet */
    assert_int_equal(e1.skipped, 0);
    assert_true(!isfinite(e1.loss));
    assert_int_equal(r->be->i->set_params(r->be, s0.p), 0);
    sf_event e2 = run(r, &b); /* the group's end: the step is skipped */
    assert_int_equal(e2.skipped, 1);
    assert_true(e2.step == 0);
    /* The next group starts clean: two finite batches step once. */
    run(r, &b);
    sf_event e4 = run(r, &b);
    assert_int_equal(e4.skipped, 0);
    assert_true(e4.step == 1 && e4.grad_norm > 0.0f);
    free(p);
    snapshot_free(&s0);
    rig_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(soft_target_cross_entropy_matches_the_closed_form_with_smoothing_and_mixing),
        cmocka_unit_test(label_smoothing_of_a_uniform_logit_row_costs_log_k),
        cmocka_unit_test(segmentation_smoothing_matches_the_per_sample_formula_per_pixel),
        cmocka_unit_test(top5_counts_ties_in_torch_sorts_stable_order),
        cmocka_unit_test(clipping_scales_by_max_norm_over_norm_plus_1e6_and_never_up),
        cmocka_unit_test(an_eval_batch_changes_nothing_and_uses_the_running_statistics),
        cmocka_unit_test(a_tiny_max_norm_scales_the_sgd_step_by_the_clip_coefficient),
        cmocka_unit_test(label_smoothing_and_mixing_reach_the_step_loss),
        cmocka_unit_test(a_non_finite_loss_skips_the_step_and_the_next_batch_trains),
        cmocka_unit_test(a_non_finite_batch_drops_its_whole_accumulation_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
