/* tests/unit/test_ref_bn_pool_convt.c — the reference batchnorm2d, maxpool2d,
 * global average pool, conv_transpose2d, per-pixel cross-entropy, residual add
 * and AdamW (gpu/ref/batchnorm.c, pool.c, conv_transpose.c, loss.c,
 * pointwise.c, optimizer.c). Gradients against central finite
 * differences (double), float against double with NaN-poisoned outputs,
 * batchnorm over several ranks' samples against one batchnorm over them all,
 * and small cases computed by hand. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/ref/ref.h"
#include "gpu/rng.h"

#define REF_CHECK_SEED 4321
#include "tests/unit/ref_check.h"
#define F32_TOL 1e-5

/* The float copy of v; v is rounded to the float values so that both
 * precisions see the same data. */
static float *to_float_rounding(double *v, size_t n)
{
    float *f = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)v[i];
        v[i] = f[i];
    }
    return f;
}

static float *nan_floats(size_t n)
{
    float *f = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++)
        f[i] = NAN;
    return f;
}

/* Central differences g[i] = dL/dv[i] of a scalar loss L(ctx) that reads v. */
typedef double (*loss_fn)(void *ctx);

static void fd_grad(double *v, size_t nv, double *g, loss_fn loss, void *ctx)
{
    for (size_t i = 0; i < nv; i++) {
        const double keep = v[i];
        v[i] = keep + FD_EPS;
        const double lp = loss(ctx);
        v[i] = keep - FD_EPS;
        const double lm = loss(ctx);
        v[i] = keep;
        g[i] = (lp - lm) / (2 * FD_EPS);
    }
}

/* ---- conv_transpose2d -------------------------------------------------------- */

typedef struct convt_case {
    int n, c, h, w, oc, k, stride, pad, bias;
} convt_case;

static const convt_case convt_cases[] = {
    {2, 3, 3, 5, 4, 2, 2, 0, 1}, /* the W2 decoder: k 2 s 2, each output from one input */
    {1, 2, 4, 3, 3, 2, 2, 0, 0}, /* same, no bias */
    {2, 2, 3, 4, 3, 3, 1, 1, 1}, /* k 3 s 1 p 1: same size, overlapping taps */
    {1, 2, 3, 5, 2, 3, 2, 1, 1}, /* k 3 s 2 p 1: overlap and cropped border */
    {1, 3, 2, 3, 2, 1, 1, 0, 1}, /* 1x1 */
    {1, 1, 3, 2, 2, 2, 3, 0, 1}, /* stride > k: outputs no input reaches (bias only) */
    {1, 2, 2, 2, 2, 4, 2, 2, 1}, /* pad crops most of the scatter */
};

static int convt_out(int h, int k, int s, int p) { return (h - 1) * s - 2 * p + k; }

typedef struct convt_ctx {
    const convt_case *cc;
    double *x, *wt, *b, *r, *y;
    size_t ny;
} convt_ctx;

/* L = sum r * convt(x, w, b) */
static double convt_loss(void *p)
{
    convt_ctx *t = p;
    const convt_case *cc = t->cc;
    sf_ref_convt2d_fwd_f64(t->x, cc->n, cc->c, cc->h, cc->w, t->wt, t->b, cc->oc, cc->k, cc->stride, cc->pad,
                           t->y);
    return dot(t->r, t->y, t->ny);
}

static void conv_transpose2d_backward_matches_finite_differences_for_stride_pad_and_bias_variants(void **state)
{
    for (size_t ci = 0; ci < sizeof convt_cases / sizeof convt_cases[0]; ci++) {
        const convt_case *cc = &convt_cases[ci];
        const int oh = convt_out(cc->h, cc->k, cc->stride, cc->pad), ow = convt_out(cc->w, cc->k, cc->stride, cc->pad);
        const size_t nx = (size_t)cc->n * cc->c * cc->h * cc->w, nw = (size_t)cc->c * cc->oc * cc->k * cc->k;
        const size_t ny = (size_t)cc->n * cc->oc * oh * ow;
        convt_ctx t = {cc, rand_vec(nx), rand_vec(nw), cc->bias ? rand_vec(cc->oc) : NULL, rand_vec(ny),
                       rand_vec(ny), ny};
        double *dx = rand_vec(nx), *dw = rand_vec(nw), *db = rand_vec(cc->oc);
        double *gx = rand_vec(nx), *gw = rand_vec(nw), *gb = rand_vec(cc->oc);

        sf_ref_convt2d_bwd_f64(t.x, cc->n, cc->c, cc->h, cc->w, t.wt, cc->oc, cc->k, cc->stride, cc->pad, t.r, dx,
                               dw, cc->bias ? db : NULL);
        fd_grad(t.x, nx, gx, convt_loss, &t);
        fd_grad(t.wt, nw, gw, convt_loss, &t);
        double ex = rel_err_d(dx, gx, nx), ew = rel_err_d(dw, gw, nw), eb = 0;
        if (cc->bias) {
            fd_grad(t.b, cc->oc, gb, convt_loss, &t);
            eb = rel_err_d(db, gb, cc->oc);
        }
        if (!(ex < FD_TOL && ew < FD_TOL && eb < FD_TOL))
            fail_msg("convt case %zu: rel err dx %.3g dw %.3g db %.3g", ci, ex, ew, eb);

        /* dx and db may be NULL: dw unchanged. */
        double *dw2 = rand_vec(nw);
        sf_ref_convt2d_bwd_f64(t.x, cc->n, cc->c, cc->h, cc->w, t.wt, cc->oc, cc->k, cc->stride, cc->pad, t.r,
                               NULL, dw2, NULL);
        assert_memory_equal(dw, dw2, sizeof(double) * nw);

        free(t.x), free(t.wt), free(t.b), free(t.r), free(t.y), free(dx), free(dw), free(db);
        free(gx), free(gw), free(gb), free(dw2);
    }
}

static void conv_transpose2d_float_agrees_with_double_and_writes_every_output(void **state)
{
    for (size_t ci = 0; ci < sizeof convt_cases / sizeof convt_cases[0]; ci++) {
        const convt_case *cc = &convt_cases[ci];
        const int oh = convt_out(cc->h, cc->k, cc->stride, cc->pad), ow = convt_out(cc->w, cc->k, cc->stride, cc->pad);
        const size_t nx = (size_t)cc->n * cc->c * cc->h * cc->w, nw = (size_t)cc->c * cc->oc * cc->k * cc->k;
        const size_t ny = (size_t)cc->n * cc->oc * oh * ow;
        double *x = rand_vec(nx), *wt = rand_vec(nw), *b = rand_vec(cc->oc), *dy = rand_vec(ny);
        float *xf = to_float_rounding(x, nx), *wf = to_float_rounding(wt, nw), *bf = to_float_rounding(b, cc->oc),
              *dyf = to_float_rounding(dy, ny);
        double *y = rand_vec(ny), *dx = rand_vec(nx), *dw = rand_vec(nw), *db = rand_vec(cc->oc);
        float *yf = nan_floats(ny), *dxf = nan_floats(nx), *dwf = nan_floats(nw), *dbf = nan_floats(cc->oc);

        sf_ref_convt2d_fwd_f64(x, cc->n, cc->c, cc->h, cc->w, wt, b, cc->oc, cc->k, cc->stride, cc->pad, y);
        sf_ref_convt2d_fwd(xf, cc->n, cc->c, cc->h, cc->w, wf, bf, cc->oc, cc->k, cc->stride, cc->pad, yf);
        sf_ref_convt2d_bwd_f64(x, cc->n, cc->c, cc->h, cc->w, wt, cc->oc, cc->k, cc->stride, cc->pad, dy, dx, dw, db);
        sf_ref_convt2d_bwd(xf, cc->n, cc->c, cc->h, cc->w, wf, cc->oc, cc->k, cc->stride, cc->pad, dyf, dxf, dwf,
                           dbf);
        double e1 = rel_err_fd(yf, y, ny), e2 = rel_err_fd(dxf, dx, nx), e3 = rel_err_fd(dwf, dw, nw),
               e4 = rel_err_fd(dbf, db, cc->oc);
        if (!(e1 < F32_TOL && e2 < F32_TOL && e3 < F32_TOL && e4 < F32_TOL))
            fail_msg("convt case %zu: float vs double rel err y %.3g dx %.3g dw %.3g db %.3g", ci, e1, e2, e3, e4);
        free(x), free(wt), free(b), free(dy), free(xf), free(wf), free(bf), free(dyf);
        free(y), free(dx), free(dw), free(db), free(yf), free(dxf), free(dwf), free(dbf);
    }
}

static void conv_transpose2d_of_a_1x1_input_with_k2_s2_places_the_kernel_per_output_channel(void **state)
{
    /* x: n 1, c 2, 1x1 = {2, -1}; weight [c=2][oc=2][2][2]; bias {0.5, -3}.
     * y[o][ky][kx] = b[o] + 2 * w[0][o][ky][kx] - 1 * w[1][o][ky][kx]. */
    const float x[2] = {2.0f, -1.0f};
    const float wt[2 * 2 * 4] = {
        1, 2, 3, 4,     /* w[0][0] */
        10, 20, 30, 40, /* w[0][1] */
        0.5f, 0, 0, 1,  /* w[1][0] */
        0, 0, 5, 0,     /* w[1][1] */
    };
    const float b[2] = {0.5f, -3.0f};
    float y[2 * 4];
    for (int i = 0; i < 8; i++)
        y[i] = NAN;
    sf_ref_convt2d_fwd(x, 1, 2, 1, 1, wt, b, 2, 2, 2, 0, y);
    const float want[8] = {
        0.5f + 2 - 0.5f, 0.5f + 4, 0.5f + 6, 0.5f + 8 - 1, /* o = 0 */
        -3 + 20, -3 + 40, -3 + 60 - 5, -3 + 80,           /* o = 1 */
    };
    for (int i = 0; i < 8; i++)
        assert_float_equal(y[i], want[i], 0);

    /* Two input pixels in a row, k 2 s 2: their 2x2 blocks tile without overlap. */
    const float x2[2] = {1.0f, 3.0f}, w2[4] = {1, 2, 3, 4};
    float y2[2 * 4];
    sf_ref_convt2d_fwd(x2, 1, 1, 1, 2, w2, NULL, 1, 2, 2, 0, y2);
    const float want2[8] = {1, 2, 3, 6, 3, 4, 9, 12};
    for (int i = 0; i < 8; i++)
        assert_float_equal(y2[i], want2[i], 0);
}

/* conv_transpose2d with weight [c][oc][k][k] is the input gradient of conv2d
 * whose weight [O=c][C=oc][k][k] is the same array (when the conv's output
 * size divides evenly, so that the transpose lands back on h x w). */
static void conv_transpose2d_forward_is_conv2d_input_gradient_with_the_same_weight(void **state)
{
    const struct {
        int n, C, H, W, O, k, s, p;
    } cases[] = {{2, 3, 8, 6, 4, 2, 2, 0}, {1, 2, 5, 7, 3, 3, 1, 1}, {1, 2, 7, 5, 2, 3, 2, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int n = cases[i].n, C = cases[i].C, H = cases[i].H, W = cases[i].W, O = cases[i].O, k = cases[i].k,
                  s = cases[i].s, p = cases[i].p;
        const int oh = (H + 2 * p - k) / s + 1, ow = (W + 2 * p - k) / s + 1;
        assert_int_equal(convt_out(oh, k, s, p), H);
        assert_int_equal(convt_out(ow, k, s, p), W);
        const size_t nx = (size_t)n * C * H * W, nw = (size_t)O * C * k * k, ny = (size_t)n * O * oh * ow;
        double *x = rand_vec(nx), *wt = rand_vec(nw), *dy = rand_vec(ny);
        double *dx = rand_vec(nx), *dw = rand_vec(nw), *yt = rand_vec(nx);
        sf_ref_conv2d_bwd_f64(x, n, C, H, W, wt, O, k, s, p, dy, dx, dw, NULL);
        sf_ref_convt2d_fwd_f64(dy, n, O, oh, ow, wt, NULL, C, k, s, p, yt);
        double e = rel_err_d(yt, dx, nx);
        if (!(e < 1e-12))
            fail_msg("case %zu: convt vs conv2d dx rel err %.3g", i, e);
        free(x), free(wt), free(dy), free(dx), free(dw), free(yt);
    }
}

/* ---- per-pixel cross-entropy ---------------------------------------------------- */

typedef struct xent2d_ctx {
    const double *l;
    const int32_t *lab;
    int n, k, h, w;
} xent2d_ctx;

static double xent2d_loss(void *p)
{
    xent2d_ctx *t = p;
    double loss;
    sf_ref_xent2d_f64(t->l, t->lab, t->n, t->k, t->h, t->w, &loss, NULL, NULL);
    return loss;
}

static void per_pixel_xent_gradient_matches_finite_differences_and_equals_per_sample_xent_over_pixels(void **state)
{
    enum { N = 2, K = 5, H = 3, W = 4, HW = H * W, NL = N * K * HW, NP = N * HW };
    double l[NL], d[NL], g[NL], loss;
    int32_t lab[NP];
    for (int i = 0; i < NL; i++)
        l[i] = 3.0 * rnd();
    for (int i = 0; i < NP; i++)
        lab[i] = (int32_t)((i * 7 + 3) % K);
    int64_t correct = -1;
    sf_ref_xent2d_f64(l, lab, N, K, H, W, &loss, d, &correct);
    xent2d_ctx t = {l, lab, N, K, H, W};
    fd_grad(l, NL, g, xent2d_loss, &t);
    double e = rel_err_d(d, g, NL);
    if (!(e < FD_TOL))
        fail_msg("xent2d rel err %.3g", e);

    /* The same pixels as rows [n*h*w, k] through the per-sample xent: same mean
     * loss, same gradient (both divide by the number of rows = pixels). */
    double rows[NL], drows[NL], loss_rows;
    for (int ni = 0; ni < N; ni++)
        for (int j = 0; j < K; j++)
            for (int pix = 0; pix < HW; pix++)
                rows[(ni * HW + pix) * K + j] = l[(ni * K + j) * HW + pix];
    int correct_rows = -1;
    sf_ref_xent_f64(rows, lab, NP, K, &loss_rows, drows, &correct_rows);
    assert_true(fabs(loss - loss_rows) < 1e-12 * fabs(loss_rows));
    assert_int_equal(correct, correct_rows);
    for (int ni = 0; ni < N; ni++)
        for (int j = 0; j < K; j++)
            for (int pix = 0; pix < HW; pix++)
                assert_true(fabs(d[(ni * K + j) * HW + pix] - drows[(ni * HW + pix) * K + j]) < 1e-15);

    /* float agrees, every gradient element written */
    float *lf = to_float_rounding(l, NL), *df = nan_floats(NL), lossf = NAN;
    int64_t cf = -1;
    sf_ref_xent2d_f64(l, lab, N, K, H, W, &loss, d, &correct);
    sf_ref_xent2d(lf, lab, N, K, H, W, &lossf, df, &cf);
    assert_true(fabs(lossf - loss) < F32_TOL * fabs(loss));
    assert_true(rel_err_fd(df, d, NL) < F32_TOL);
    assert_true(cf == correct);
    free(lf), free(df);
}

static void per_pixel_xent_is_stable_for_large_logits_and_nan_for_a_bad_label(void **state)
{
    /* n 1, k 3, 1x2: pixel 0 logits {1000, 0, -1000}, pixel 1 {88, 89, 90} */
    float l[6] = {1000.0f, 88.0f, 0.0f, 89.0f, -1000.0f, 90.0f}, d[6], loss;
    int32_t lab[2] = {0, 2};
    int64_t correct;
    sf_ref_xent2d(l, lab, 1, 3, 1, 2, &loss, d, &correct);
    assert_true(isfinite(loss));
    assert_true(correct == 2);
    for (int i = 0; i < 6; i++)
        assert_true(isfinite(d[i]));
    int32_t bad[2] = {0, 3};
    sf_ref_xent2d(l, bad, 1, 3, 1, 2, &loss, d, &correct);
    assert_true(isnan(loss));
    assert_true(correct == 1);
    assert_true(isnan(d[1]) && isnan(d[3]) && isnan(d[5]));
    assert_true(isfinite(d[0]) && isfinite(d[2]) && isfinite(d[4]));
}

static void per_pixel_xent_mean_over_a_w2_sized_batch_is_the_float_rounding_of_the_exact_mean(void **state)
{
    /* W2's loss: 10 classes over 2 x 256 x 256 pixels. A float running sum of
     * 131072 losses of about 2.3 drifted by 8.7e-5 (relative) from the exact
     * mean; summed in double the float result is within a rounding of it. */
    enum { N = 2, K = 10, H = 256, W = 256, NL = N * K * H * W, NP = N * H * W };
    double *l = malloc(sizeof(double) * NL), loss = NAN;
    int32_t *lab = malloc(sizeof(int32_t) * NP);
    for (int i = 0; i < NL; i++)
        l[i] = 0.1 * rnd();
    for (int i = 0; i < NP; i++)
        lab[i] = (int32_t)((i * 7 + 3) % K);
    float *lf = to_float_rounding(l, NL), lossf = NAN;
    sf_ref_xent2d_f64(l, lab, N, K, H, W, &loss, NULL, NULL);
    sf_ref_xent2d(lf, lab, N, K, H, W, &lossf, NULL, NULL);
    if (!(fabs(lossf - loss) <= 1e-7 * fabs(loss)))
        fail_msg("float mean %.9g, double %.9g: %.3g relative", lossf, loss, fabs(lossf - loss) / fabs(loss));
    free(l);
    free(lab);
    free(lf);
}

/* ---- batchnorm2d ------------------------------------------------------------------ */

typedef struct bn_ctx {
    int n, c, h, w;
    double *x, *gamma, *beta, *r, *y;
    double *rm, *rv, *sm, *si; /* scratch: running stats are updated on every call */
} bn_ctx;

/* L = sum r * bn_train(x, gamma, beta): the batch statistics move with x. */
static double bn_loss(void *p)
{
    bn_ctx *t = p;
    for (int i = 0; i < t->c; i++)
        t->rm[i] = 0, t->rv[i] = 1;
    sf_ref_bn2d_fwd_train_f64(t->x, t->n, t->c, t->h, t->w, t->gamma, t->beta, 1e-5, 0.1, t->rm, t->rv, t->sm,
                              t->si, t->y);
    return dot(t->r, t->y, (size_t)t->n * t->c * t->h * t->w);
}

static const int bn_shapes[][4] = {
    {2, 3, 3, 5}, /* odd spatial */
    {4, 2, 1, 1}, /* ResNet's last stage on small images: one pixel per sample */
    {1, 2, 2, 3}, /* batch of one: statistics over space only */
    {3, 1, 5, 3},
};

static void batchnorm2d_backward_matches_finite_differences_through_the_training_mode_forward(void **state)
{
    for (size_t si = 0; si < sizeof bn_shapes / sizeof bn_shapes[0]; si++) {
        const int n = bn_shapes[si][0], c = bn_shapes[si][1], h = bn_shapes[si][2], w = bn_shapes[si][3];
        const size_t nx = (size_t)n * c * h * w;
        bn_ctx t = {n, c, h, w, rand_vec(nx), rand_vec(c), rand_vec(c), rand_vec(nx), rand_vec(nx),
                    rand_vec(c), rand_vec(c), rand_vec(c), rand_vec(c)};
        for (size_t i = 0; i < nx; i++)
            t.x[i] = 2.0 * t.x[i] + 0.5; /* a non-zero mean */
        double *dx = rand_vec(nx), *dg = rand_vec(c), *dbt = rand_vec(c);
        double *gx = rand_vec(nx), *gg = rand_vec(c), *gbt = rand_vec(c);
        bn_loss(&t); /* fills sm, si for this x */
        sf_ref_bn2d_bwd_f64(t.x, n, c, h, w, t.gamma, t.sm, t.si, t.r, dx, dg, dbt);
        fd_grad(t.x, nx, gx, bn_loss, &t);
        fd_grad(t.gamma, c, gg, bn_loss, &t);
        fd_grad(t.beta, c, gbt, bn_loss, &t);
        double ex = rel_err_d(dx, gx, nx), eg = rel_err_d(dg, gg, c), eb = rel_err_d(dbt, gbt, c);
        if (!(ex < FD_TOL && eg < FD_TOL && eb < FD_TOL))
            fail_msg("bn shape %zu: rel err dx %.3g dgamma %.3g dbeta %.3g", si, ex, eg, eb);
        free(t.x), free(t.gamma), free(t.beta), free(t.r), free(t.y), free(t.rm), free(t.rv), free(t.sm), free(t.si);
        free(dx), free(dg), free(dbt), free(gx), free(gg), free(gbt);
    }
}

static void batchnorm2d_float_agrees_with_double_and_writes_every_output(void **state)
{
    for (size_t si = 0; si < sizeof bn_shapes / sizeof bn_shapes[0]; si++) {
        const int n = bn_shapes[si][0], c = bn_shapes[si][1], h = bn_shapes[si][2], w = bn_shapes[si][3];
        const size_t nx = (size_t)n * c * h * w;
        double *x = rand_vec(nx), *gamma = rand_vec(c), *beta = rand_vec(c), *dy = rand_vec(nx);
        double *rm = rand_vec(c), *rv = rand_vec(c);
        for (int i = 0; i < c; i++)
            rv[i] = 1.5 + rv[i];
        float *xf = to_float_rounding(x, nx), *gf = to_float_rounding(gamma, c), *bf = to_float_rounding(beta, c),
              *dyf = to_float_rounding(dy, nx), *rmf = to_float_rounding(rm, c), *rvf = to_float_rounding(rv, c);
        double *y = rand_vec(nx), *sm = rand_vec(c), *sinv = rand_vec(c), *dx = rand_vec(nx), *dg = rand_vec(c),
               *db = rand_vec(c);
        float *yf = nan_floats(nx), *smf = nan_floats(c), *sinvf = nan_floats(c), *dxf = nan_floats(nx),
              *dgf = nan_floats(c), *dbf = nan_floats(c), *yef = nan_floats(nx);

        sf_ref_bn2d_fwd_train_f64(x, n, c, h, w, gamma, beta, 1e-5, 0.1, rm, rv, sm, sinv, y);
        sf_ref_bn2d_fwd_train(xf, n, c, h, w, gf, bf, 1e-5f, 0.1f, rmf, rvf, smf, sinvf, yf);
        sf_ref_bn2d_bwd_f64(x, n, c, h, w, gamma, sm, sinv, dy, dx, dg, db);
        sf_ref_bn2d_bwd(xf, n, c, h, w, gf, smf, sinvf, dyf, dxf, dgf, dbf);
        double e[8] = {rel_err_fd(yf, y, nx),   rel_err_fd(smf, sm, c),  rel_err_fd(sinvf, sinv, c),
                       rel_err_fd(rmf, rm, c),  rel_err_fd(rvf, rv, c),  rel_err_fd(dxf, dx, nx),
                       rel_err_fd(dgf, dg, c),  rel_err_fd(dbf, db, c)};
        for (int i = 0; i < 8; i++)
            if (!(e[i] < F32_TOL))
                fail_msg("bn shape %zu output %d: float vs double rel err %.3g", si, i, e[i]);

        /* Eval mode with the batch's own mean and biased variance reproduces
         * the training output. */
        float *bvar = malloc(sizeof(float) * c);
        for (int i = 0; i < c; i++)
            bvar[i] = (float)(1.0 / ((double)sinvf[i] * sinvf[i]) - 1e-5);
        sf_ref_bn2d_fwd_eval(xf, n, c, h, w, gf, bf, 1e-5f, smf, bvar, yef);
        for (size_t i = 0; i < nx; i++)
            assert_true(fabsf(yef[i] - yf[i]) < 1e-4f);
        free(x), free(gamma), free(beta), free(dy), free(rm), free(rv), free(xf), free(gf), free(bf), free(dyf);
        free(rmf), free(rvf), free(y), free(sm), free(sinv), free(dx), free(dg), free(db), free(yf), free(smf);
        free(sinvf), free(dxf), free(dgf), free(dbf), free(yef), free(bvar);
    }
}

static void batchnorm2d_running_statistics_follow_pytorchs_update_on_a_tiny_example(void **state)
{
    /* n 2, c 2, 1x2. Channel 0 sees {1, 2} and {3, 6}: mean 3, biased var
     * (4 + 1 + 0 + 9) / 4 = 3.5, unbiased 14 / 3. Channel 1 sees {5, 5, 5, 5}:
     * mean 5, var 0 (so invstd = 1 / sqrt(eps) and y = beta). */
    const float x[8] = {1, 2, 5, 5, 3, 6, 5, 5};
    const float gamma[2] = {2.0f, 0.5f}, beta[2] = {0.1f, -1.0f}, eps = 1e-5f, mom = 0.1f;
    float rm[2] = {0.5f, 1.0f}, rv[2] = {2.0f, 1.0f}, sm[2], sinv[2], y[8];
    sf_ref_bn2d_fwd_train(x, 2, 2, 1, 2, gamma, beta, eps, mom, rm, rv, sm, sinv, y);
    assert_float_equal(sm[0], 3.0f, 0);
    assert_float_equal(sm[1], 5.0f, 0);
    const double inv0 = 1.0 / sqrt(3.5 + 1e-5), inv1 = 1.0 / sqrt(1e-5);
    assert_float_equal(sinv[0], (float)inv0, 1e-6);
    assert_float_equal(sinv[1], (float)inv1, 1e-3);
    /* running = 0.9 * running + 0.1 * batch stat (unbiased variance):
     * mean (0.45 + 0.3, 0.9 + 0.5) = (0.75, 1.4);
     * var  (1.8 + 0.1 * 14/3, 0.9 + 0) = (2.2666667, 0.9) */
    assert_float_equal(rm[0], 0.75f, 1e-6);
    assert_float_equal(rm[1], 1.4f, 1e-6);
    assert_float_equal(rv[0], 2.2666667f, 1e-6);
    assert_float_equal(rv[1], 0.9f, 1e-6);
    /* y = gamma * (x - mean) * invstd + beta */
    const double want[8] = {2 * (1 - 3) * inv0 + 0.1, 2 * (2 - 3) * inv0 + 0.1, -1, -1,
                            2 * (3 - 3) * inv0 + 0.1, 2 * (6 - 3) * inv0 + 0.1, -1, -1};
    for (int i = 0; i < 8; i++)
        assert_float_equal(y[i], (float)want[i], 1e-6);

    /* Eval mode with the updated running stats: gamma * (x - rm) / sqrt(rv + eps) + beta. */
    float ye[8];
    for (int i = 0; i < 8; i++)
        ye[i] = NAN;
    sf_ref_bn2d_fwd_eval(x, 2, 2, 1, 2, gamma, beta, eps, rm, rv, ye);
    const double e0 = 1.0 / sqrt(14.0 / 3 * 0.1 + 1.8 + 1e-5), e1 = 1.0 / sqrt(0.9 + 1e-5);
    const double want_e[8] = {2 * (1 - 0.75) * e0 + 0.1, 2 * (2 - 0.75) * e0 + 0.1, 0.5 * (5 - 1.4) * e1 - 1,
                              0.5 * (5 - 1.4) * e1 - 1,  2 * (3 - 0.75) * e0 + 0.1, 2 * (6 - 0.75) * e0 + 0.1,
                              0.5 * (5 - 1.4) * e1 - 1,  0.5 * (5 - 1.4) * e1 - 1};
    for (int i = 0; i < 8; i++)
        assert_float_equal(ye[i], (float)want_e[i], 1e-6);

    /* A second step folds in again: rm0 = 0.9 * 0.75 + 0.1 * 3 = 0.975. */
    sf_ref_bn2d_fwd_train(x, 2, 2, 1, 2, gamma, beta, eps, mom, rm, rv, sm, sinv, y);
    assert_float_equal(rm[0], 0.975f, 1e-6);
    assert_float_equal(rv[0], (float)(0.9 * (1.8 + 0.1 * 14.0 / 3) + 0.1 * 14.0 / 3), 1e-6);
}

/* distributed.batchnorm sync: a batch split over three ranks (the last with
 * no samples), their sums added as the all-reduce adds them, must give what
 * one batchnorm over the whole batch gives (the double reference): outputs,
 * saved statistics, every rank's running statistics, dx, and dgamma/dbeta
 * as the sums of the ranks' own. A round with no samples anywhere leaves the
 * running statistics as they were. */
static void batchnorm2d_over_ranks_equals_one_batchnorm_over_their_samples_and_an_empty_rank_adds_nothing(
    void **state)
{
    for (size_t si = 0; si < sizeof bn_shapes / sizeof bn_shapes[0]; si++) {
        const int n = bn_shapes[si][0], c = bn_shapes[si][1], h = bn_shapes[si][2], w = bn_shapes[si][3];
        const size_t per = (size_t)c * h * w, nx = (size_t)n * per;
        double *x = rand_vec(nx), *gamma = rand_vec(c), *beta = rand_vec(c), *dy = rand_vec(nx);
        double *rm = rand_vec(c), *rv = rand_vec(c);
        for (size_t i = 0; i < nx; i++)
            x[i] = 2.0 * x[i] + 0.5;
        for (int i = 0; i < c; i++)
            rv[i] = 1.5 + rv[i];
        float *xf = to_float_rounding(x, nx), *gf = to_float_rounding(gamma, c), *bf = to_float_rounding(beta, c),
              *dyf = to_float_rounding(dy, nx), *rmf = to_float_rounding(rm, c), *rvf = to_float_rounding(rv, c);
        double *y = rand_vec(nx), *sm = rand_vec(c), *sinv = rand_vec(c), *dx = rand_vec(nx), *dg = rand_vec(c),
               *db = rand_vec(c);
        sf_ref_bn2d_fwd_train_f64(x, n, c, h, w, gamma, beta, 1e-5, 0.1, rm, rv, sm, sinv, y);
        sf_ref_bn2d_bwd_f64(x, n, c, h, w, gamma, sm, sinv, dy, dx, dg, db);

        enum { R = 3 };
        const int cnt[R] = {n / 2, n - n / 2, 0}, first[R] = {0, n / 2, n};
        double *part = malloc(sizeof(double) * (2 * c + 1)), *sum = calloc(2 * c + 1, sizeof(double));
        float *yf = nan_floats(nx), *dxf = nan_floats(nx), *dgf = calloc(c, sizeof(float)),
              *dbf = calloc(c, sizeof(float));
        float *rmr[R], *rvr[R], *smr[R], *sir[R];
        for (int r = 0; r < R; r++) {
            sf_ref_bn2d_sync_stat_sums(xf + first[r] * per, cnt[r], c, h, w, part);
            for (int i = 0; i < 2 * c + 1; i++)
                sum[i] += part[i];
        }
        assert_true(sum[2 * c] == (double)n * h * w);
        for (int r = 0; r < R; r++) {
            rmr[r] = malloc(sizeof(float) * c), rvr[r] = malloc(sizeof(float) * c);
            smr[r] = nan_floats(c), sir[r] = nan_floats(c);
            memcpy(rmr[r], rmf, sizeof(float) * c);
            memcpy(rvr[r], rvf, sizeof(float) * c);
            sf_ref_bn2d_sync_fwd(xf + first[r] * per, cnt[r], c, h, w, gf, bf, 1e-5f, 0.1f, sum, rmr[r], rvr[r],
                                 smr[r], sir[r], yf + first[r] * per);
        }
        memset(sum, 0, sizeof(double) * (2 * c + 1));
        for (int r = 0; r < R; r++) {
            sf_ref_bn2d_sync_grad_sums(xf + first[r] * per, cnt[r], c, h, w, smr[r], sir[r], dyf + first[r] * per,
                                       part);
            for (int i = 0; i < c; i++) {
                dbf[i] += (float)part[i];
                dgf[i] += (float)part[c + i];
            }
            for (int i = 0; i < 2 * c + 1; i++)
                sum[i] += part[i];
        }
        for (int r = 0; r < R; r++)
            sf_ref_bn2d_sync_bwd_dx(xf + first[r] * per, cnt[r], c, h, w, gf, smr[r], sir[r], dyf + first[r] * per,
                                    sum, dxf + first[r] * per);
        double e[5] = {rel_err_fd(yf, y, nx), rel_err_fd(dxf, dx, nx), rel_err_fd(dgf, dg, c),
                       rel_err_fd(dbf, db, c), 0};
        for (int r = 0; r < R; r++) {
            const double er[4] = {rel_err_fd(smr[r], sm, c), rel_err_fd(sir[r], sinv, c), rel_err_fd(rmr[r], rm, c),
                                  rel_err_fd(rvr[r], rv, c)};
            for (int i = 0; i < 4; i++)
                e[4] = er[i] > e[4] ? er[i] : e[4];
        }
        for (int i = 0; i < 5; i++)
            if (!(e[i] < F32_TOL))
                fail_msg("bn shape %zu output %d: ranks vs one batch rel err %.3g", si, i, e[i]);

        /* No rank has a sample: nothing moves. */
        memset(sum, 0, sizeof(double) * (2 * c + 1));
        memcpy(rmr[0], rmf, sizeof(float) * c);
        memcpy(rvr[0], rvf, sizeof(float) * c);
        sf_ref_bn2d_sync_fwd(xf, 0, c, h, w, gf, bf, 1e-5f, 0.1f, sum, rmr[0], rvr[0], smr[0], sir[0], yf);
        assert_memory_equal(rmr[0], rmf, sizeof(float) * c);
        assert_memory_equal(rvr[0], rvf, sizeof(float) * c);

        for (int r = 0; r < R; r++)
            free(rmr[r]), free(rvr[r]), free(smr[r]), free(sir[r]);
        free(x), free(gamma), free(beta), free(dy), free(rm), free(rv), free(xf), free(gf), free(bf), free(dyf);
        free(rmf), free(rvf), free(y), free(sm), free(sinv), free(dx), free(dg), free(db), free(part), free(sum);
        free(yf), free(dxf), free(dgf), free(dbf);
    }
}

/* ---- maxpool2d ----------------------------------------------------------------------- */

typedef struct pool_case {
    int n, c, h, w, k, stride, pad;
} pool_case;

static const pool_case pool_cases[] = {
    {2, 2, 5, 7, 2, 2, 0}, /* k 2 s 2, odd sizes: last row/column unread */
    {1, 3, 7, 6, 3, 2, 1}, /* ResNet's stem pool: k 3 s 2 p 1 */
    {2, 1, 5, 5, 3, 1, 1}, /* overlapping windows: one input chosen by several outputs */
    {1, 2, 4, 5, 2, 1, 1}, /* pad 1 with k 2 */
    {1, 1, 6, 7, 3, 3, 0},
};

static int pool_out(int h, int k, int s, int p) { return (h + 2 * p - k) / s + 1; }

/* Distinct values spaced 2/len apart, in scrambled order: no ties within FD_EPS. */
static double *distinct_vec(size_t len)
{
    double *v = malloc(sizeof(double) * len);
    for (size_t i = 0; i < len; i++)
        v[i] = 2.0 * (double)((i * 7919 + 13) % len) / (double)len - 1.0;
    return v;
}

typedef struct pool_ctx {
    const pool_case *pc;
    double *x, *r, *y;
    int32_t *arg;
    size_t ny;
} pool_ctx;

static double pool_loss(void *p)
{
    pool_ctx *t = p;
    const pool_case *pc = t->pc;
    sf_ref_maxpool2d_fwd_f64(t->x, pc->n, pc->c, pc->h, pc->w, pc->k, pc->stride, pc->pad, t->y, t->arg);
    return dot(t->r, t->y, t->ny);
}

static void maxpool2d_backward_matches_finite_differences_and_overwrites_dx(void **state)
{
    for (size_t ci = 0; ci < sizeof pool_cases / sizeof pool_cases[0]; ci++) {
        const pool_case *pc = &pool_cases[ci];
        const int oh = pool_out(pc->h, pc->k, pc->stride, pc->pad), ow = pool_out(pc->w, pc->k, pc->stride, pc->pad);
        const size_t nx = (size_t)pc->n * pc->c * pc->h * pc->w, ny = (size_t)pc->n * pc->c * oh * ow;
        pool_ctx t = {pc, distinct_vec(nx), rand_vec(ny), rand_vec(ny), malloc(sizeof(int32_t) * ny), ny};
        pool_loss(&t);
        double *dx = malloc(sizeof(double) * nx), *gx = rand_vec(nx);
        for (size_t i = 0; i < nx; i++)
            dx[i] = NAN; /* the backward zeroes dx before scattering */
        sf_ref_maxpool2d_bwd_f64(t.r, t.arg, pc->n, pc->c, pc->h, pc->w, oh, ow, dx);
        fd_grad(t.x, nx, gx, pool_loss, &t);
        double e = rel_err_d(dx, gx, nx);
        if (!(e < FD_TOL))
            fail_msg("maxpool case %zu: rel err dx %.3g", ci, e);
        free(t.x), free(t.r), free(t.y), free(t.arg), free(dx), free(gx);
    }
}

static void maxpool2d_float_agrees_with_double_and_chooses_the_same_inputs(void **state)
{
    for (size_t ci = 0; ci < sizeof pool_cases / sizeof pool_cases[0]; ci++) {
        const pool_case *pc = &pool_cases[ci];
        const int oh = pool_out(pc->h, pc->k, pc->stride, pc->pad), ow = pool_out(pc->w, pc->k, pc->stride, pc->pad);
        const size_t nx = (size_t)pc->n * pc->c * pc->h * pc->w, ny = (size_t)pc->n * pc->c * oh * ow;
        double *x = rand_vec(nx), *dy = rand_vec(ny), *y = rand_vec(ny), *dx = rand_vec(nx);
        float *xf = to_float_rounding(x, nx), *dyf = to_float_rounding(dy, ny), *yf = nan_floats(ny),
              *dxf = nan_floats(nx);
        int32_t *arg = malloc(sizeof(int32_t) * ny), *argf = malloc(sizeof(int32_t) * ny);
        for (size_t i = 0; i < ny; i++)
            argf[i] = -7;
        sf_ref_maxpool2d_fwd_f64(x, pc->n, pc->c, pc->h, pc->w, pc->k, pc->stride, pc->pad, y, arg);
        sf_ref_maxpool2d_fwd(xf, pc->n, pc->c, pc->h, pc->w, pc->k, pc->stride, pc->pad, yf, argf);
        sf_ref_maxpool2d_bwd_f64(dy, arg, pc->n, pc->c, pc->h, pc->w, oh, ow, dx);
        sf_ref_maxpool2d_bwd(dyf, argf, pc->n, pc->c, pc->h, pc->w, oh, ow, dxf);
        for (size_t i = 0; i < ny; i++) {
            assert_true(yf[i] == (float)y[i]); /* a max of rounded values is exact */
            assert_int_equal(argf[i], arg[i]);
        }
        assert_true(rel_err_fd(dxf, dx, nx) < F32_TOL);
        free(x), free(dy), free(y), free(dx), free(xf), free(dyf), free(yf), free(dxf), free(arg), free(argf);
    }
}

static void maxpool2d_picks_the_first_maximum_on_ties_and_padding_never_wins(void **state)
{
    /* 3x3 plane, k 2 s 1: windows (row-major taps)
     *   (0,0) {5,7,7,1} -> first 7, index 1     (0,1) {7,7,1,7} -> index 1
     *   (1,0) {7,1,0,0} -> index 3              (1,1) {1,7,0,0} -> index 5 */
    const float x[9] = {5, 7, 7, 7, 1, 7, 0, 0, 0};
    float y[4];
    int32_t arg[4];
    sf_ref_maxpool2d_fwd(x, 1, 1, 3, 3, 2, 1, 0, y, arg);
    const int32_t want_arg[4] = {1, 1, 3, 5};
    for (int i = 0; i < 4; i++) {
        assert_float_equal(y[i], 7.0f, 0);
        assert_int_equal(arg[i], want_arg[i]);
    }
    /* Backward: input 1 was chosen twice, its gradient is the sum; the rest 0. */
    const float dy[4] = {1, 2, 3, 4};
    float dx[9];
    for (int i = 0; i < 9; i++)
        dx[i] = NAN;
    sf_ref_maxpool2d_bwd(dy, arg, 1, 1, 3, 3, 2, 2, dx);
    const float want_dx[9] = {0, 3, 0, 3, 0, 4, 0, 0, 0};
    for (int i = 0; i < 9; i++)
        assert_float_equal(dx[i], want_dx[i], 0);

    /* All equal and negative, k 3 s 2 p 1 (the ResNet stem pool): a zero pad
     * would win, PyTorch's -inf pad does not. Each window takes its first
     * in-input tap: output (r, c) -> input (max(2r-1, 0), max(2c-1, 0)). */
    float xn[5 * 5], yn[3 * 3];
    int32_t an[3 * 3];
    for (int i = 0; i < 25; i++)
        xn[i] = -3.0f;
    sf_ref_maxpool2d_fwd(xn, 1, 1, 5, 5, 3, 2, 1, yn, an);
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 3; c++) {
            assert_float_equal(yn[r * 3 + c], -3.0f, 0);
            const int iy = 2 * r - 1 < 0 ? 0 : 2 * r - 1, ix = 2 * c - 1 < 0 ? 0 : 2 * c - 1;
            assert_int_equal(an[r * 3 + c], iy * 5 + ix);
        }

    /* -inf inputs still choose a real input; NaN propagates (as PyTorch). */
    const float xi[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    sf_ref_maxpool2d_fwd(xi, 1, 1, 2, 2, 2, 2, 0, y, arg);
    assert_true(isinf(y[0]) && y[0] < 0);
    assert_int_equal(arg[0], 0);
    const float xnan[4] = {1, NAN, 2, 0};
    sf_ref_maxpool2d_fwd(xnan, 1, 1, 2, 2, 2, 2, 0, y, arg);
    assert_true(isnan(y[0]));
    assert_int_equal(arg[0], 1);
}

/* ---- global average pool ---------------------------------------------------------------- */

typedef struct avg_ctx {
    int n, c, h, w;
    double *x, *r, *y;
} avg_ctx;

static double avg_loss(void *p)
{
    avg_ctx *t = p;
    sf_ref_avgpool_fwd_f64(t->x, t->n, t->c, t->h, t->w, t->y);
    return dot(t->r, t->y, (size_t)t->n * t->c);
}

static void global_avgpool_backward_matches_finite_differences_and_float_agrees(void **state)
{
    const int shapes[][4] = {{2, 3, 3, 5}, {1, 4, 1, 1}, {3, 2, 7, 7}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int n = shapes[si][0], c = shapes[si][1], h = shapes[si][2], w = shapes[si][3];
        const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c;
        avg_ctx t = {n, c, h, w, rand_vec(nx), rand_vec(ny), rand_vec(ny)};
        double *dx = rand_vec(nx), *gx = rand_vec(nx);
        sf_ref_avgpool_bwd_f64(t.r, n, c, h, w, dx);
        fd_grad(t.x, nx, gx, avg_loss, &t);
        double e = rel_err_d(dx, gx, nx);
        if (!(e < FD_TOL))
            fail_msg("avgpool shape %zu: rel err dx %.3g", si, e);

        /* by hand: plane 0's mean */
        avg_loss(&t);
        double s = 0;
        for (int i = 0; i < h * w; i++)
            s += t.x[i];
        assert_true(fabs(t.y[0] - s / (h * w)) < 1e-14);

        float *xf = to_float_rounding(t.x, nx), *rf = to_float_rounding(t.r, ny), *yf = nan_floats(ny),
              *dxf = nan_floats(nx);
        avg_loss(&t);
        sf_ref_avgpool_bwd_f64(t.r, n, c, h, w, dx);
        sf_ref_avgpool_fwd(xf, n, c, h, w, yf);
        sf_ref_avgpool_bwd(rf, n, c, h, w, dxf);
        assert_true(rel_err_fd(yf, t.y, ny) < F32_TOL);
        assert_true(rel_err_fd(dxf, dx, nx) < F32_TOL);
        free(t.x), free(t.r), free(t.y), free(dx), free(gx), free(xf), free(rf), free(yf), free(dxf);
    }
}

/* ---- residual add ------------------------------------------------------------------------- */

static void residual_add_sums_elementwise_and_may_write_in_place(void **state)
{
    float a[5] = {1, -2, 0.5f, 3, 0}, y[5];
    const float b0[5] = {0.25f, 2, -0.5f, 1e-3f, -7};
    float b[5];
    memcpy(b, b0, sizeof b);
    for (int i = 0; i < 5; i++)
        y[i] = NAN;
    sf_ref_add_fwd(a, b, 5, y);
    const float want[5] = {1.25f, 0, 0, 3.001f, -7};
    for (int i = 0; i < 5; i++)
        assert_float_equal(y[i], want[i], 1e-6);
    sf_ref_add_fwd(a, b, 5, a); /* y == a */
    assert_memory_equal(a, y, sizeof a);
    sf_ref_add_fwd(y, b, 5, b); /* y == b */
    for (int i = 0; i < 5; i++)
        assert_float_equal(b[i], y[i] + b0[i], 0);
}

/* ---- AdamW ---------------------------------------------------------------------------------- */

static void adamw_matches_hand_computed_values_over_two_steps_with_decoupled_weight_decay(void **state)
{
    /* lr 0.01, betas (0.9, 0.999), eps 1e-8, wd 0.1; p0 = (1, -2, 0.5).
     *
     * Step 1, g = (0.1, -0.2, 0): p *= 1 - lr*wd = 0.999 -> (0.999, -1.998, 0.4995);
     *   m = 0.1 g = (0.01, -0.02, 0); v = 0.001 g^2 = (1e-5, 4e-5, 0);
     *   mhat = m / 0.1 = g, vhat = v / 0.001 = g^2, so the step is lr * g / (|g| + eps):
     *   p = (0.999 - 0.01 * 0.1/(0.1+1e-8), -1.998 + 0.01 * 0.2/(0.2+1e-8), 0.4995)
     *     = (0.989000001, -1.9880000005, 0.4995).
     *   Element 2 has g = 0: only the decoupled decay moves it (Adam with L2
     *   decay would instead step it by lr * sign(p) = 0.01).
     *
     * Step 2, g = (-0.3, 0.1, 0.5): p *= 0.999 -> (0.988011000999, -1.986012001, 0.4990005);
     *   m = 0.9 m + 0.1 g = (-0.021, -0.008, 0.05);
     *   v = 0.999 v + 0.001 g^2 = (9.999e-5, 4.996e-5, 2.5e-4);
     *   bias corrections 1 - 0.9^2 = 0.19, 1 - 0.999^2 = 0.001999;
     *   mhat = (-0.1105263158, -0.04210526316, 0.2631578947);
     *   sqrt(vhat) = (0.223651537, 0.1580901523, 0.3536418121);
     *   step = lr * mhat / (sqrt(vhat) + eps) = (-0.004941898112, -0.002663370228, 0.007441368025);
     *   p = (0.9929528991, -1.983348631, 0.491559132). */
    float p[3] = {1.0f, -2.0f, 0.5f}, m[3] = {0, 0, 0}, v[3] = {0, 0, 0};
    const float g1[3] = {0.1f, -0.2f, 0.0f}, g2[3] = {-0.3f, 0.1f, 0.5f};
    const float lr = 0.01f, eps = 1e-8f, wd = 0.1f;
    const double b1 = 0.9, b2 = 0.999; /* the configured doubles, as PyTorch's Python floats */

    sf_ref_adamw(p, g1, m, v, 3, lr, b1, b2, eps, wd, 1);
    assert_float_equal(m[0], 0.01f, 1e-7);
    assert_float_equal(m[1], -0.02f, 1e-7);
    assert_float_equal(m[2], 0.0f, 0);
    /* 1 - b2 is float(0.001), as PyTorch's value=1 - beta2: v is within float
     * rounding of the real-number value. (Formed from (float)0.999 it was
     * 1.3e-5 below it: exp_avg_sq differed from PyTorch's by that much.) */
    assert_float_equal(v[0], 1e-5f, 3e-7 * 1e-5);
    assert_float_equal(v[1], 4e-5f, 3e-7 * 4e-5);
    assert_float_equal(v[2], 0.0f, 0);
    assert_float_equal(p[0], 0.989000001f, 1e-6);
    assert_float_equal(p[1], -1.9880000005f, 1e-6);
    assert_float_equal(p[2], 0.4995f, 1e-7);

    sf_ref_adamw(p, g2, m, v, 3, lr, b1, b2, eps, wd, 2);
    assert_float_equal(m[0], -0.021f, 1e-7);
    assert_float_equal(m[1], -0.008f, 1e-7);
    assert_float_equal(m[2], 0.05f, 1e-7);
    assert_float_equal(v[0], 9.999e-5f, 5e-7 * 9.999e-5);
    assert_float_equal(v[1], 4.996e-5f, 5e-7 * 4.996e-5);
    assert_float_equal(v[2], 2.5e-4f, 5e-7 * 2.5e-4);
    assert_float_equal(p[0], 0.9929528991f, 2e-6);
    assert_float_equal(p[1], -1.983348631f, 2e-6);
    assert_float_equal(p[2], 0.491559132f, 2e-6);
}

static void adamw_with_zero_gradient_only_decays_the_weights(void **state)
{
    /* m = v = 0 and g = 0: the Adam step is 0 / (0 + eps) = 0, so each step is
     * exactly p *= 1 - lr * wd, whatever the step count. */
    float p[2] = {4.0f, -1.0f}, m[2] = {0, 0}, v[2] = {0, 0};
    const float g[2] = {0, 0};
    for (int64_t t = 1; t <= 3; t++)
        sf_ref_adamw(p, g, m, v, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.5f, t);
    assert_float_equal(p[0], 4.0f * 0.95f * 0.95f * 0.95f, 1e-6);
    assert_float_equal(p[1], -1.0f * 0.95f * 0.95f * 0.95f, 1e-6);
    /* wd 0: no decay, no movement */
    sf_ref_adamw(p, g, m, v, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 4);
    assert_float_equal(p[0], 4.0f * 0.95f * 0.95f * 0.95f, 1e-6);
}

/* ---- against PyTorch ------------------------------------------------------------------------ */

/* Expected numbers printed by torch 2.15.0 (CPU, float32) from the same inputs:
 * nn.ConvTranspose2d, nn.BatchNorm2d (train step, backward of sum(r*y), eval),
 * F.cross_entropy on [N,K,H,W], optim.AdamW. (MaxPool2d(return_indices=True)
 * gave exactly the indices asserted in the ties/padding test above.) */
static void layers_agree_with_numbers_printed_by_pytorch_2_15(void **state)
{
    /* ConvTranspose2d(2, 2, k 3, s 2, p 1): x [1,2,2,3] = ((i*7)%11 - 5)/4,
     * weight [2,2,3,3] = ((i*5)%13 - 6)/8, bias (0.25, -0.5) -> y [1,2,3,5]. */
    float x[12], wt[36], y[30];
    const float b[2] = {0.25f, -0.5f};
    for (int i = 0; i < 12; i++)
        x[i] = (float)((i * 7) % 11 - 5) / 4.0f;
    for (int i = 0; i < 36; i++)
        wt[i] = (float)((i * 5) % 13 - 6) / 8.0f;
    for (int i = 0; i < 30; i++)
        y[i] = NAN;
    sf_ref_convt2d_fwd(x, 1, 2, 2, 3, wt, b, 2, 3, 2, 1, y);
    const float want_convt[30] = {0.09375f, -0.3125f, 0.3125f,  1.5f,     0.1875f,   -0.3125f,  0.6875f,  0.46875f,
                                  0.09375f, 0.21875f, 0.40625f, 1.6875f,  0.28125f,  1.4375f,   0.15625f, 1.1875f,
                                  -0.46875f, -0.875f, -0.8125f, -0.875f,  0.65625f,  -1.21875f, -0.71875f, -0.875f,
                                  -0.71875f, -0.875f, -0.8125f, -0.875f,  -0.8125f,  -0.875f};
    for (int i = 0; i < 30; i++)
        assert_float_equal(y[i], want_convt[i], 1e-6);

    /* BatchNorm2d(2, eps 1e-5, momentum 0.1), the tiny example of the running
     * statistics test; r = (1, -2, 0.5, 3, -1, 0.25, 2, -0.5). PyTorch's CPU
     * kernel computes y as x * (gamma*invstd) + (beta - mean*gamma*invstd), so
     * in channel 1 (invstd 316) it rounds to -1.0000153 where the oracle's
     * gamma * ((x - mean) * invstd) + beta is exactly -1: compared at 3e-5. */
    const float xb[8] = {1, 2, 5, 5, 3, 6, 5, 5}, r[8] = {1, -2, 0.5f, 3, -1, 0.25f, 2, -0.5f};
    const float gamma[2] = {2.0f, 0.5f}, beta[2] = {0.1f, -1.0f};
    float rm[2] = {0.5f, 1.0f}, rv[2] = {2.0f, 1.0f}, sm[2], sinv[2], yb[8], dx[8], dg[2], db[2], ye[8];
    sf_ref_bn2d_fwd_train(xb, 2, 2, 1, 2, gamma, beta, 1e-5f, 0.1f, rm, rv, sm, sinv, yb);
    sf_ref_bn2d_bwd(xb, 2, 2, 1, 2, gamma, sm, sinv, r, dx, dg, db);
    sf_ref_bn2d_fwd_eval(xb, 2, 2, 1, 2, gamma, beta, 1e-5f, rm, rv, ye);
    const float want_y[8] = {-2.03808689f, -0.969043493f, -1.00001526f, -1.00001526f,
                             0.0999999046f, 3.3071301f,    -1.00001526f, -1.00001526f};
    const float want_dx[8] = {1.65128994f, -1.6131103f, -118.585403f, 276.69928f,
                              -0.601336896f, 0.56315732f, 118.585403f, -276.69928f};
    const float want_ye[8] = {0.432104886f, 1.76052427f, 0.897356033f, 0.897356033f,
                              3.08894372f,  7.07420206f, 0.897356033f, 0.897356033f};
    for (int i = 0; i < 8; i++) {
        assert_float_equal(yb[i], want_y[i], 3e-5);
        assert_float_equal(dx[i], want_dx[i], 1e-5 * fabsf(want_dx[i]));
        assert_float_equal(ye[i], want_ye[i], 1e-6);
    }
    assert_float_equal(rm[0], 0.75f, 1e-7);
    assert_float_equal(rm[1], 1.39999998f, 1e-7);
    assert_float_equal(rv[0], 2.26666665f, 1e-7);
    assert_float_equal(rv[1], 0.899999976f, 1e-7);
    assert_float_equal(dg[0], 0.400891274f, 1e-6);
    assert_float_equal(dg[1], 0.0f, 1e-6);
    assert_float_equal(db[0], -1.75f, 1e-6);
    assert_float_equal(db[1], 5.0f, 1e-6);

    /* F.cross_entropy on logits [1,3,2,2], labels [[0,1],[2,1]]. */
    const float l[12] = {0.5f, -1, 2, 0.25f, 1.5f, 0, -0.5f, 1, -2, 0.75f, 0, 0.5f};
    const int32_t lab[4] = {0, 1, 2, 1};
    const float want_dl[12] = {-0.184216872f, 0.0263911188f, 0.205352247f,  0.0568049476f,
                               0.178817078f,  -0.178261518f, 0.0168563388f, -0.129743934f,
                               0.00539980782f, 0.1518704f,   -0.222208589f, 0.0729389936f};
    float loss = NAN, dl[12];
    int64_t correct = -1;
    sf_ref_xent2d(l, lab, 1, 3, 2, 2, &loss, dl, &correct);
    assert_float_equal(loss, 1.37802577f, 1e-6);
    for (int i = 0; i < 12; i++)
        assert_float_equal(dl[i], want_dl[i], 1e-7);
    assert_true(correct == 1); /* per-pixel argmaxes 1, 2, 0, 1 against labels 0, 1, 2, 1 */

    /* optim.AdamW(lr 0.01, betas (0.9, 0.999), eps 1e-8, weight_decay 0.1), the
     * two steps of the hand-computed AdamW test. */
    float p[3] = {1.0f, -2.0f, 0.5f}, m[3] = {0, 0, 0}, v[3] = {0, 0, 0};
    sf_ref_adamw(p, (const float[3]){0.1f, -0.2f, 0.0f}, m, v, 3, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 1);
    assert_float_equal(p[0], 0.989000022f, 1e-7);
    assert_float_equal(p[1], -1.98800004f, 1e-7);
    assert_float_equal(p[2], 0.499500006f, 1e-7);
    sf_ref_adamw(p, (const float[3]){-0.3f, 0.1f, 0.5f}, m, v, 3, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 2);
    assert_float_equal(p[0], 0.992952943f, 2e-7);
    assert_float_equal(p[1], -1.98334873f, 2e-7);
    assert_float_equal(p[2], 0.491559148f, 2e-7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(conv_transpose2d_backward_matches_finite_differences_for_stride_pad_and_bias_variants),
        cmocka_unit_test(conv_transpose2d_float_agrees_with_double_and_writes_every_output),
        cmocka_unit_test(conv_transpose2d_of_a_1x1_input_with_k2_s2_places_the_kernel_per_output_channel),
        cmocka_unit_test(conv_transpose2d_forward_is_conv2d_input_gradient_with_the_same_weight),
        cmocka_unit_test(per_pixel_xent_gradient_matches_finite_differences_and_equals_per_sample_xent_over_pixels),
        cmocka_unit_test(per_pixel_xent_is_stable_for_large_logits_and_nan_for_a_bad_label),
        cmocka_unit_test(per_pixel_xent_mean_over_a_w2_sized_batch_is_the_float_rounding_of_the_exact_mean),
        cmocka_unit_test(batchnorm2d_backward_matches_finite_differences_through_the_training_mode_forward),
        cmocka_unit_test(batchnorm2d_float_agrees_with_double_and_writes_every_output),
        cmocka_unit_test(batchnorm2d_running_statistics_follow_pytorchs_update_on_a_tiny_example),
        cmocka_unit_test(batchnorm2d_over_ranks_equals_one_batchnorm_over_their_samples_and_an_empty_rank_adds_nothing),
        cmocka_unit_test(maxpool2d_backward_matches_finite_differences_and_overwrites_dx),
        cmocka_unit_test(maxpool2d_float_agrees_with_double_and_chooses_the_same_inputs),
        cmocka_unit_test(maxpool2d_picks_the_first_maximum_on_ties_and_padding_never_wins),
        cmocka_unit_test(global_avgpool_backward_matches_finite_differences_and_float_agrees),
        cmocka_unit_test(residual_add_sums_elementwise_and_may_write_in_place),
        cmocka_unit_test(adamw_matches_hand_computed_values_over_two_steps_with_decoupled_weight_decay),
        cmocka_unit_test(adamw_with_zero_gradient_only_decays_the_weights),
        cmocka_unit_test(layers_agree_with_numbers_printed_by_pytorch_2_15),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
