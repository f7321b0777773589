/* tests/gpu/ops/channel_conv1d.cu — ECA's convolution across channels of
 * gpu/cuda/channel_conv1d.h against the double-precision reference
 * (gpu/ref/channel_conv1d.c): forward, dx and the weight's and bias's
 * gradients (a two-pass reduction: one chunk and many), with and without a
 * bias, kernels of 1, 3, 5 and one wider than the channels (every tap
 * reaching into the padding), in fp32 (norm check) and bf16 (each element
 * within half a bf16 ulp: check_dt; the parameters' gradients are fp32
 * either way). The layout does not enter: a pooled [c,1,1] map is the same
 * row of c in NCHW and NHWC. The rows: tests/gpu/op_cases.cu; helpers and
 * the criteria they apply: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/channel_conv1d.h"

/* Each tap's gradient sums dy * x over n * c terms of random sign (the
 * bias's, dy alone): check_param_sums (op_test.h) bounds it by their mass. */
static void check_param_grads(const char *name, const std::vector<float> &got, const std::vector<double> &ref,
                              const std::vector<double> &x, const std::vector<double> &dy, int n, int c, int k,
                              int pad, int nj, double tol)
{
    std::vector<double> mass(nj, 0.0);
    for (int ni = 0; ni < n; ni++)
        for (int i = 0; i < c; i++) {
            const double d = dy[(size_t)ni * c + i];
            for (int j = 0; j < k; j++) {
                const int s = i + j - pad;
                if (s >= 0 && s < c)
                    mass[j] += fabs(d * x[(size_t)ni * c + s]);
            }
            if (nj > k)
                mass[k] += fabs(d);
        }
    check_param_sums(name, "tap (k: the bias)", got, ref, mass, tol);
}

/* shape {n, c}; p {k, bias (0 or 1)}; tol: y and dx; tol_param: the
 * parameters' gradients (fp32 in either element type) */
void cmp_channel_conv1d(const op_case &t, const op_env &e)
{
    const cudaStream_t s = e.s;
    const sf_dtype dt = t.dt;
    const int n = t.shape[0], c = t.shape[1], k = t.p[0], bias = t.p[1], pad = (k - 1) / 2;
    char nm[160];
    snprintf(nm, sizeof nm, "channel_conv1d %s n%d c%d k%d%s", dtname(dt), n, c, k, bias ? " bias" : "");
    const size_t len = (size_t)n * c;
    std::vector<float> x(len), dy(len), w(k), b(1);
    rand_fill_dt(x, dt, 2.f);
    rand_fill_dt(dy, dt, 1.f);
    rand_fill(w, 1.f);
    rand_fill(b, 1.f);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), wd = to_d(w), bd = to_d(b), yr(len), dxr(len), dpr(k + 1);
    sf_ref_channel_conv1d_fwd_f64(xd.data(), n, c, wd.data(), bias ? bd.data() : NULL, k, pad, yr.data());
    sf_ref_channel_conv1d_bwd_f64(xd.data(), n, c, wd.data(), k, pad, dyd.data(), dxr.data(), dpr.data(),
                                  bias ? dpr.data() + k : NULL);
    dbuf bx = dbuf_make(dt, len, 0), bdy = dbuf_make(dt, len, 0), by = dbuf_make(dt, len, 0),
         bdx = dbuf_make(dt, len, 0);
    const size_t ns = sf_cuda_channel_conv1d_scratch(k);
    float *d_w = dalloc<float>(k), *d_b = dalloc<float>(1), *d_dp = dalloc<float>(k + 1), *scr = dalloc<float>(ns);
    up_dt(bx, x);
    up_dt(bdy, dy);
    up(d_w, w);
    up(d_b, b);
    poison_dt(by);
    poison_dt(bdx);
    poison_f(d_dp, k + 1);
    poison_f(scr, ns);
    const int nj = k + bias;
    int rc = sf_cuda_channel_conv1d_fwd_dt(dt, bx.p, d_w, bias ? d_b : NULL, k, pad, by.p, n, c, s);
    if (!rc)
        rc = sf_cuda_channel_conv1d_bwd_dt(dt, bx.p, d_w, k, pad, bdy.p, bdx.p, d_dp, bias ? d_dp + k : NULL, n, c,
                                           scr, s);
    if (ran_ok(s, nm, rc)) {
        check_lay(nm, "fwd", by, SF_LAYOUT_NCHW, n, c, 1, 1, yr, t.tol);
        check_lay(nm, "dx", bdx, SF_LAYOUT_NCHW, n, c, 1, 1, dxr, t.tol);
        std::vector<float> got = down(d_dp, k + 1);
        got.resize(nj);
        std::vector<double> ref(dpr.begin(), dpr.begin() + nj);
        check_param_grads(subname(nm, "dw db (fp32)"), got, ref, xd, dyd, n, c, k, pad, nj, t.tol_param);
    }
    /* without dx (the input needs no gradient): the parameters' gradients
     * alone, twice bit-identical (a fixed-order reduction) */
    const std::vector<float> first = down(d_dp, nj);
    poison_f(d_dp, k + 1);
    rc = sf_cuda_channel_conv1d_bwd_dt(dt, bx.p, d_w, k, pad, bdy.p, NULL, d_dp, bias ? d_dp + k : NULL, n, c, scr,
                                       s);
    const subname sub(nm, "dw without dx, bit-identical");
    if (ran_ok(s, sub, rc))
        pass_or_fail(sub, memcmp(first.data(), down(d_dp, nj).data(), sizeof(float) * nj) == 0,
                     "differs from the first run");
    dbuf_free(bx); dbuf_free(bdy); dbuf_free(by); dbuf_free(bdx);
    cudaFree(d_w); cudaFree(d_b); cudaFree(d_dp); cudaFree(scr);
}

/* A kernel that would not keep the channels (k != 2 * pad + 1) is refused. */
void cmp_channel_conv1d_refused(const op_case &t, const op_env &e)
{
    float *p = dalloc<float>(16);
    const int rc = sf_cuda_channel_conv1d_fwd_dt(SF_DT_F32, p, p, NULL, 4, 1, p, 1, 8, e.s);
    pass_or_fail("channel_conv1d with k 4, pad 1 is refused", rc == -1 && strstr(sf_cuda_last_error(), "2 * pad + 1"),
                 "accepted, or the error does not say why");
    cudaFree(p);
}
