/* tests/unit/test_ref_conv_linear.c — the reference Conv2d, linear layer,
 * ReLU, cross-entropy and SGD (gpu/ref/conv.c, linear.c, pointwise.c, loss.c,
 * optimizer.c): gradients against central finite differences (double), float
 * against double, SGD by hand. */
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

#define REF_CHECK_SEED 1234
#include "tests/unit/ref_check.h"

static float *to_float(const double *v, size_t n)
{
    float *f = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++)
        f[i] = (float)v[i];
    return f;
}

/* ---- conv2d --------------------------------------------------------------- */

typedef struct conv_case {
    int n, c, h, w, oc, k, stride, pad, bias;
} conv_case;

static const conv_case conv_cases[] = {
    {2, 2, 5, 6, 3, 3, 1, 1, 1}, /* same padding */
    {2, 3, 6, 4, 4, 2, 2, 0, 0}, /* the W1 downsampling conv, no bias */
    {1, 2, 7, 6, 2, 3, 2, 1, 1}, /* stride 2 with pad; some inputs unread */
    {3, 3, 4, 4, 5, 1, 1, 0, 1}, /* 1x1 */
    {1, 1, 3, 3, 2, 2, 1, 2, 1}, /* pad wider than needed: outputs that see only padding */
};

static int conv_out(int h, int k, int s, int p) { return (h + 2 * p - k) / s + 1; }

/* L = sum r * conv(x, w, b) */
static double conv_loss(const conv_case *cc, const double *x, const double *wt, const double *b,
                        const double *r, double *y)
{
    sf_ref_conv2d_fwd_f64(x, cc->n, cc->c, cc->h, cc->w, wt, b, cc->oc, cc->k, cc->stride, cc->pad, y);
    size_t ny = (size_t)cc->n * cc->oc * conv_out(cc->h, cc->k, cc->stride, cc->pad) *
                conv_out(cc->w, cc->k, cc->stride, cc->pad);
    return dot(r, y, ny);
}

/* Central difference of L with respect to each element of v. */
static void conv_fd(const conv_case *cc, double *x, double *wt, double *b, const double *r, double *y,
                    double *v, size_t nv, double *g)
{
    for (size_t i = 0; i < nv; i++) {
        double keep = v[i];
        v[i] = keep + FD_EPS;
        double lp = conv_loss(cc, x, wt, b, r, y);
        v[i] = keep - FD_EPS;
        double lm = conv_loss(cc, x, wt, b, r, y);
        v[i] = keep;
        g[i] = (lp - lm) / (2 * FD_EPS);
    }
}

static void conv2d_backward_matches_finite_differences_for_stride_pad_and_bias_variants(void **state)
{
    for (size_t ci = 0; ci < sizeof conv_cases / sizeof conv_cases[0]; ci++) {
        const conv_case *cc = &conv_cases[ci];
        int oh = conv_out(cc->h, cc->k, cc->stride, cc->pad), ow = conv_out(cc->w, cc->k, cc->stride, cc->pad);
        size_t nx = (size_t)cc->n * cc->c * cc->h * cc->w, nw = (size_t)cc->oc * cc->c * cc->k * cc->k;
        size_t ny = (size_t)cc->n * cc->oc * oh * ow;
        double *x = rand_vec(nx), *wt = rand_vec(nw), *b = cc->bias ? rand_vec(cc->oc) : NULL;
        double *r = rand_vec(ny), *y = rand_vec(ny);
        double *dx = rand_vec(nx), *dw = rand_vec(nw), *db = rand_vec(cc->oc);
        double *gx = rand_vec(nx), *gw = rand_vec(nw), *gb = rand_vec(cc->oc);

        sf_ref_conv2d_bwd_f64(x, cc->n, cc->c, cc->h, cc->w, wt, cc->oc, cc->k, cc->stride, cc->pad, r, dx, dw,
                              cc->bias ? db : NULL);
        conv_fd(cc, x, wt, b, r, y, x, nx, gx);
        conv_fd(cc, x, wt, b, r, y, wt, nw, gw);
        double ex = rel_err_d(dx, gx, nx), ew = rel_err_d(dw, gw, nw), eb = 0;
        if (cc->bias) {
            conv_fd(cc, x, wt, b, r, y, b, cc->oc, gb);
            eb = rel_err_d(db, gb, cc->oc);
        }
        if (!(ex < FD_TOL && ew < FD_TOL && eb < FD_TOL))
            fail_msg("conv case %zu: rel err dx %.3g dw %.3g db %.3g", ci, ex, ew, eb);

        /* dx may be NULL (first layer): dw and db unchanged. */
        double *dw2 = rand_vec(nw), *db2 = rand_vec(cc->oc);
        sf_ref_conv2d_bwd_f64(x, cc->n, cc->c, cc->h, cc->w, wt, cc->oc, cc->k, cc->stride, cc->pad, r, NULL,
                              dw2, cc->bias ? db2 : NULL);
        assert_memory_equal(dw, dw2, sizeof(double) * nw);
        if (cc->bias)
            assert_memory_equal(db, db2, sizeof(double) * cc->oc);

        free(x), free(wt), free(b), free(r), free(y), free(dx), free(dw), free(db);
        free(gx), free(gw), free(gb), free(dw2), free(db2);
    }
}

static void conv2d_float_agrees_with_double_and_writes_every_output(void **state)
{
    for (size_t ci = 0; ci < sizeof conv_cases / sizeof conv_cases[0]; ci++) {
        const conv_case *cc = &conv_cases[ci];
        int oh = conv_out(cc->h, cc->k, cc->stride, cc->pad), ow = conv_out(cc->w, cc->k, cc->stride, cc->pad);
        size_t nx = (size_t)cc->n * cc->c * cc->h * cc->w, nw = (size_t)cc->oc * cc->c * cc->k * cc->k;
        size_t ny = (size_t)cc->n * cc->oc * oh * ow;
        double *x = rand_vec(nx), *wt = rand_vec(nw), *b = rand_vec(cc->oc), *dy = rand_vec(ny);
        double *y = rand_vec(ny), *dx = rand_vec(nx), *dw = rand_vec(nw), *db = rand_vec(cc->oc);
        float *xf = to_float(x, nx), *wf = to_float(wt, nw), *bf = to_float(b, cc->oc), *dyf = to_float(dy, ny);
        /* Round the double inputs to the float values so both see the same data. */
        for (size_t i = 0; i < nx; i++) x[i] = xf[i];
        for (size_t i = 0; i < nw; i++) wt[i] = wf[i];
        for (int i = 0; i < cc->oc; i++) b[i] = bf[i];
        for (size_t i = 0; i < ny; i++) dy[i] = dyf[i];
        float *yf = malloc(sizeof(float) * ny), *dxf = malloc(sizeof(float) * nx),
              *dwf = malloc(sizeof(float) * nw), *dbf = malloc(sizeof(float) * cc->oc);
        for (size_t i = 0; i < ny; i++) yf[i] = NAN; /* poison */
        for (size_t i = 0; i < nx; i++) dxf[i] = NAN;
        for (size_t i = 0; i < nw; i++) dwf[i] = NAN;
        for (int i = 0; i < cc->oc; i++) dbf[i] = NAN;

        sf_ref_conv2d_fwd_f64(x, cc->n, cc->c, cc->h, cc->w, wt, b, cc->oc, cc->k, cc->stride, cc->pad, y);
        sf_ref_conv2d_fwd(xf, cc->n, cc->c, cc->h, cc->w, wf, bf, cc->oc, cc->k, cc->stride, cc->pad, yf);
        sf_ref_conv2d_bwd_f64(x, cc->n, cc->c, cc->h, cc->w, wt, cc->oc, cc->k, cc->stride, cc->pad, dy, dx, dw, db);
        sf_ref_conv2d_bwd(xf, cc->n, cc->c, cc->h, cc->w, wf, cc->oc, cc->k, cc->stride, cc->pad, dyf, dxf, dwf, dbf);
        double e1 = rel_err_fd(yf, y, ny), e2 = rel_err_fd(dxf, dx, nx), e3 = rel_err_fd(dwf, dw, nw),
               e4 = rel_err_fd(dbf, db, cc->oc);
        if (!(e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-5 && e4 < 1e-5))
            fail_msg("conv case %zu: float vs double rel err y %.3g dx %.3g dw %.3g db %.3g", ci, e1, e2, e3, e4);
        free(x), free(wt), free(b), free(dy), free(y), free(dx), free(dw), free(db);
        free(xf), free(wf), free(bf), free(dyf), free(yf), free(dxf), free(dwf), free(dbf);
    }
}

/* ---- linear ---------------------------------------------------------------- */

static double linear_loss(int n, int in, int out, const double *x, const double *wt, const double *b,
                          const double *r, double *y)
{
    sf_ref_linear_fwd_f64(x, n, in, wt, b, out, y);
    return dot(r, y, (size_t)n * out);
}

static void linear_backward_matches_finite_differences_with_and_without_bias(void **state)
{
    for (int with_bias = 0; with_bias <= 1; with_bias++) {
        const int n = 3, in = 7, out = 4;
        double *x = rand_vec(n * in), *wt = rand_vec(out * in), *b = with_bias ? rand_vec(out) : NULL;
        double *r = rand_vec(n * out), *y = rand_vec(n * out);
        double *dx = rand_vec(n * in), *dw = rand_vec(out * in), *db = rand_vec(out);
        double *g = rand_vec(n * in + out * in + out);
        sf_ref_linear_bwd_f64(x, n, in, wt, out, r, dx, dw, with_bias ? db : NULL);

        double *vs[3] = {x, wt, b};
        size_t ns[3] = {(size_t)n * in, (size_t)out * in, with_bias ? (size_t)out : 0};
        double *an[3] = {dx, dw, db};
        for (int v = 0; v < 3; v++) {
            for (size_t i = 0; i < ns[v]; i++) {
                double keep = vs[v][i];
                vs[v][i] = keep + FD_EPS;
                double lp = linear_loss(n, in, out, x, wt, b, r, y);
                vs[v][i] = keep - FD_EPS;
                double lm = linear_loss(n, in, out, x, wt, b, r, y);
                vs[v][i] = keep;
                g[i] = (lp - lm) / (2 * FD_EPS);
            }
            double e = rel_err_d(an[v], g, ns[v]);
            if (!(e < FD_TOL))
                fail_msg("linear bias=%d tensor %d: rel err %.3g", with_bias, v, e);
        }
        free(x), free(wt), free(b), free(r), free(y), free(dx), free(dw), free(db), free(g);
    }
}

static void linear_float_agrees_with_double_and_writes_every_output(void **state)
{
    const int n = 4, in = 33, out = 9;
    double *x = rand_vec(n * in), *wt = rand_vec(out * in), *b = rand_vec(out), *dy = rand_vec(n * out);
    float *xf = to_float(x, n * in), *wf = to_float(wt, out * in), *bf = to_float(b, out), *dyf = to_float(dy, n * out);
    for (int i = 0; i < n * in; i++) x[i] = xf[i];
    for (int i = 0; i < out * in; i++) wt[i] = wf[i];
    for (int i = 0; i < out; i++) b[i] = bf[i];
    for (int i = 0; i < n * out; i++) dy[i] = dyf[i];
    double y[4 * 9], dx[4 * 33], dw[9 * 33], db[9];
    float yf[4 * 9], dxf[4 * 33], dwf[9 * 33], dbf[9];
    for (size_t i = 0; i < sizeof yf / sizeof yf[0]; i++) yf[i] = NAN;
    for (size_t i = 0; i < sizeof dxf / sizeof dxf[0]; i++) dxf[i] = NAN;
    for (size_t i = 0; i < sizeof dwf / sizeof dwf[0]; i++) dwf[i] = NAN;
    for (size_t i = 0; i < sizeof dbf / sizeof dbf[0]; i++) dbf[i] = NAN;
    sf_ref_linear_fwd_f64(x, n, in, wt, b, out, y);
    sf_ref_linear_fwd(xf, n, in, wf, bf, out, yf);
    sf_ref_linear_bwd_f64(x, n, in, wt, out, dy, dx, dw, db);
    sf_ref_linear_bwd(xf, n, in, wf, out, dyf, dxf, dwf, dbf);
    assert_true(rel_err_fd(yf, y, n * out) < 1e-5);
    assert_true(rel_err_fd(dxf, dx, n * in) < 1e-5);
    assert_true(rel_err_fd(dwf, dw, out * in) < 1e-5);
    assert_true(rel_err_fd(dbf, db, out) < 1e-5);
    free(x), free(wt), free(b), free(dy), free(xf), free(wf), free(bf), free(dyf);
}

/* ---- relu ------------------------------------------------------------------ */

static void relu_backward_matches_finite_differences_away_from_zero(void **state)
{
    enum { N = 50 };
    double x[N], y[N], r[N], dx[N], g[N];
    for (int i = 0; i < N; i++) {
        double v = rnd();
        x[i] = v >= 0 ? v + 0.1 : v - 0.1; /* |x| >= 0.1: no kink within eps */
        r[i] = rnd();
    }
    sf_ref_relu_fwd_f64(x, N, y);
    sf_ref_relu_bwd_f64(y, r, N, dx);
    for (int i = 0; i < N; i++) {
        double keep = x[i], yp, ym;
        x[i] = keep + FD_EPS;
        sf_ref_relu_fwd_f64(&x[i], 1, &yp);
        x[i] = keep - FD_EPS;
        sf_ref_relu_fwd_f64(&x[i], 1, &ym);
        x[i] = keep;
        g[i] = r[i] * (yp - ym) / (2 * FD_EPS);
    }
    assert_true(rel_err_d(dx, g, N) < FD_TOL);

    /* float version: same values, in place allowed */
    float xf[N], yf[N], rf[N], dxf[N];
    for (int i = 0; i < N; i++) {
        xf[i] = (float)x[i];
        rf[i] = (float)r[i];
    }
    sf_ref_relu_fwd(xf, N, yf);
    sf_ref_relu_bwd(yf, rf, N, dxf);
    for (int i = 0; i < N; i++) {
        assert_true(yf[i] == (float)y[i]);
        assert_true(dxf[i] == (float)dx[i]);
    }
    sf_ref_relu_fwd(xf, N, xf);
    assert_memory_equal(xf, yf, sizeof xf);
    /* NaN propagates forward, as torch.relu */
    float nanv = NAN, out;
    sf_ref_relu_fwd(&nanv, 1, &out);
    assert_true(isnan(out));
}

/* ---- cross-entropy ----------------------------------------------------------- */

static void xent_backward_matches_finite_differences_and_counts_correct(void **state)
{
    const int n = 5, k = 7;
    double l[5 * 7], d[5 * 7], g[5 * 7], loss, lp, lm;
    int32_t lab[5] = {0, 6, 3, 3, 1};
    for (int i = 0; i < n * k; i++)
        l[i] = 3.0 * rnd();
    int correct = -1;
    sf_ref_xent_f64(l, lab, n, k, &loss, d, &correct);
    for (int i = 0; i < n * k; i++) {
        double keep = l[i];
        l[i] = keep + FD_EPS;
        sf_ref_xent_f64(l, lab, n, k, &lp, NULL, NULL);
        l[i] = keep - FD_EPS;
        sf_ref_xent_f64(l, lab, n, k, &lm, NULL, NULL);
        l[i] = keep;
        g[i] = (lp - lm) / (2 * FD_EPS);
    }
    double e = rel_err_d(d, g, n * k);
    if (!(e < FD_TOL))
        fail_msg("xent rel err %.3g", e);

    /* loss by hand: mean of logsumexp - logit[label]; correct by argmax */
    double want = 0;
    int want_correct = 0;
    for (int i = 0; i < n; i++) {
        double s = 0;
        int arg = 0;
        for (int j = 0; j < k; j++) {
            s += exp(l[i * k + j]);
            if (l[i * k + j] > l[i * k + arg])
                arg = j;
        }
        want += log(s) - l[i * k + lab[i]];
        want_correct += arg == lab[i];
    }
    assert_true(fabs(loss - want / n) < 1e-12);
    assert_int_equal(correct, want_correct);

    /* float agrees */
    float lf[5 * 7], df[5 * 7], lossf;
    int cf;
    for (int i = 0; i < n * k; i++) {
        lf[i] = (float)l[i];
        l[i] = lf[i];
        df[i] = NAN;
    }
    sf_ref_xent_f64(l, lab, n, k, &loss, d, &correct);
    sf_ref_xent(lf, lab, n, k, &lossf, df, &cf);
    assert_true(fabs(lossf - loss) < 1e-5 * fabs(loss));
    assert_true(rel_err_fd(df, d, n * k) < 1e-5);
    assert_int_equal(cf, correct);
}

static void xent_is_stable_for_large_logits_and_nan_for_a_bad_label(void **state)
{
    float l[2 * 3] = {1000.0f, 0.0f, -1000.0f, 88.0f, 89.0f, 90.0f}, d[6], loss;
    int32_t lab[2] = {0, 2};
    int correct;
    sf_ref_xent(l, lab, 2, 3, &loss, d, &correct);
    assert_true(isfinite(loss));
    assert_int_equal(correct, 2);
    for (int i = 0; i < 6; i++)
        assert_true(isfinite(d[i]));
    int32_t bad[2] = {0, 3};
    sf_ref_xent(l, bad, 2, 3, &loss, d, &correct);
    assert_true(isnan(loss));
    assert_int_equal(correct, 1);
}

/* ---- sgd -------------------------------------------------------------------- */

static void sgd_matches_hand_computed_values_with_momentum_and_weight_decay_over_two_steps(void **state)
{
    float p[2] = {1.0f, -2.0f}, mom[2] = {0, 0};
    const float g1[2] = {0.5f, 0.25f}, g2[2] = {-1.0f, 0.5f};
    const float lr = 0.1f, m = 0.9f, wd = 0.01f;
    /* step 1: g = grad + wd p = (0.51, 0.23); buf = g; p -= lr buf -> (0.949, -2.023) */
    sf_ref_sgd(p, g1, mom, 2, lr, m, wd);
    assert_float_equal(mom[0], 0.51f, 1e-6);
    assert_float_equal(mom[1], 0.23f, 1e-6);
    assert_float_equal(p[0], 0.949f, 1e-6);
    assert_float_equal(p[1], -2.023f, 1e-6);
    /* step 2: g = (-1 + 0.00949, 0.5 - 0.02023) = (-0.99051, 0.47977);
     * buf = 0.9 buf + g = (-0.53151, 0.68677); p -= 0.1 buf -> (1.002151, -2.091677) */
    sf_ref_sgd(p, g2, mom, 2, lr, m, wd);
    assert_float_equal(mom[0], -0.53151f, 1e-6);
    assert_float_equal(mom[1], 0.68677f, 1e-6);
    assert_float_equal(p[0], 1.002151f, 1e-6);
    assert_float_equal(p[1], -2.091677f, 1e-6);
}

static void sgd_without_momentum_is_plain_gradient_descent_and_needs_no_buffer(void **state)
{
    float p[3] = {1.0f, 2.0f, -3.0f};
    const float g[3] = {0.5f, -1.0f, 0.0f};
    sf_ref_sgd(p, g, NULL, 3, 0.1f, 0.0f, 0.0f);
    assert_float_equal(p[0], 0.95f, 1e-7);
    assert_float_equal(p[1], 2.1f, 1e-7);
    assert_float_equal(p[2], -3.0f, 0);
    /* weight decay alone shrinks towards 0: p -= lr * wd * p */
    sf_ref_sgd(p, (const float[3]){0, 0, 0}, NULL, 3, 0.5f, 0.0f, 0.1f);
    assert_float_equal(p[2], -3.0f * 0.95f, 1e-6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(conv2d_backward_matches_finite_differences_for_stride_pad_and_bias_variants),
        cmocka_unit_test(conv2d_float_agrees_with_double_and_writes_every_output),
        cmocka_unit_test(linear_backward_matches_finite_differences_with_and_without_bias),
        cmocka_unit_test(linear_float_agrees_with_double_and_writes_every_output),
        cmocka_unit_test(relu_backward_matches_finite_differences_away_from_zero),
        cmocka_unit_test(xent_backward_matches_finite_differences_and_counts_correct),
        cmocka_unit_test(xent_is_stable_for_large_logits_and_nan_for_a_bad_label),
        cmocka_unit_test(sgd_matches_hand_computed_values_with_momentum_and_weight_decay_over_two_steps),
        cmocka_unit_test(sgd_without_momentum_is_plain_gradient_descent_and_needs_no_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
