/* tests/gpu/ops/prelu.cu — PReLU of gpu/cuda/prelu.h against the
 * double-precision reference (gpu/ref/prelu.c): forward, dx and the slopes'
 * gradient (a two-pass reduction: one chunk and many, more channels than a
 * block, one slope over everything), with one slope and one per channel, on
 * inputs that include exact zeros (whose dx is a * dy and whose share of the
 * slope's gradient is 0, as PyTorch's prelu_backward), in fp32 (norm check)
 * and bf16 (each element within half a bf16 ulp: check_dt; the slopes'
 * gradient is fp32 either way), NCHW and NHWC, at odd sizes and flat
 * features (h = w = 1). The rows: tests/gpu/op_cases.cu; helpers and the
 * criteria they apply: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/prelu.h"

/* A slope's gradient: x * dy summed where x <= 0, 131 072 terms for one
 * slope over [4, 16, 64, 64]; check_param_sums (op_test.h) bounds it by
 * their mass. */
static void check_slopes_grad(const char *name, const std::vector<float> &got, const std::vector<double> &ref,
                              const std::vector<double> &x, const std::vector<double> &dy, int n, int c, size_t hw,
                              int np, double tol)
{
    std::vector<double> mass(np, 0.0);
    for (size_t i = 0; i < (size_t)n * c * hw; i++)
        if (!(x[i] > 0.0))
            mass[np == 1 ? 0 : (i / hw) % c] += fabs(x[i] * dy[i]);
    check_param_sums(name, "slope", got, ref, mass, tol);
}

/* shape {n, c, h, w}; p {slopes: 1, or 0 for one per channel}; tol: y and
 * dx; tol_param: dw (fp32 in either element type) */
void cmp_prelu(const op_case &k, const op_env &e)
{
    const cudaStream_t s = e.s;
    const sf_dtype dt = k.dt;
    const sf_layout lay = k.lay;
    const int n = k.shape[0], c = k.shape[1], h = k.shape[2], w = k.shape[3];
    const int np = k.p[0] == 1 ? 1 : c;
    char nm[160];
    snprintf(nm, sizeof nm, "prelu %s %s n%d c%d %dx%d, %d slope%s", dtname(dt), lname(lay), n, c, h, w, np,
             np == 1 ? "" : "s");
    const size_t hw = (size_t)h * w, len = (size_t)n * c * hw;
    std::vector<float> x(len), a(np), dy(len);
    rand_fill_dt(x, dt, 2.f);
    for (size_t i = 0; i < len; i += 7)
        x[i] = 0.f; /* the kink: PyTorch's x > 0 test */
    rand_fill(a, 0.5f, 0.25f); /* fp32, as the parameter is; negative slopes among them */
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> xd = to_d(x), ad = to_d(a), dyd = to_d(dy), yr(len), dxr(len), dar(np);
    sf_ref_prelu_fwd_f64(xd.data(), n, c, hw, ad.data(), np, yr.data());
    sf_ref_prelu_bwd_f64(xd.data(), n, c, hw, ad.data(), np, dyd.data(), dxr.data(), dar.data());
    dbuf bx = dbuf_make(dt, len, 0), bdy = dbuf_make(dt, len, 0), by = dbuf_make(dt, len, 0),
         bdx = dbuf_make(dt, len, 0);
    float *d_a = dalloc<float>(np), *d_da = dalloc<float>(np), *scr = dalloc<float>(sf_cuda_prelu_scratch(c));
    up_dt(bx, to_lay(x, lay, n, c, h, w));
    up_dt(bdy, to_lay(dy, lay, n, c, h, w));
    up(d_a, a);
    poison_dt(by);
    poison_dt(bdx);
    poison_f(d_da, np);
    poison_f(scr, sf_cuda_prelu_scratch(c));
    int rc = sf_cuda_prelu_fwd_dt(dt, lay, bx.p, d_a, np, by.p, n, c, hw, s);
    if (!rc)
        rc = sf_cuda_prelu_bwd_dt(dt, lay, bx.p, d_a, np, bdy.p, bdx.p, d_da, n, c, hw, scr, s);
    if (ran_ok(s, nm, rc)) {
        check_lay(nm, "fwd", by, lay, n, c, h, w, yr, k.tol);
        check_lay(nm, "dx", bdx, lay, n, c, h, w, dxr, k.tol);
        check_slopes_grad(subname(nm, "dw (fp32)"), down(d_da, np), dar, xd, dyd, n, c, hw, np, k.tol_param);
    }
    /* without dx (the layer's input needs no gradient): dw alone, twice
     * bit-identical (a fixed-order reduction) */
    const std::vector<float> first = down(d_da, np);
    poison_f(d_da, np);
    rc = sf_cuda_prelu_bwd_dt(dt, lay, bx.p, d_a, np, bdy.p, NULL, d_da, n, c, hw, scr, s);
    const subname sub(nm, "dw without dx, bit-identical");
    if (ran_ok(s, sub, rc))
        pass_or_fail(sub, memcmp(first.data(), down(d_da, np).data(), sizeof(float) * np) == 0,
                     "differs from the first run");
    dbuf_free(bx); dbuf_free(bdy); dbuf_free(by); dbuf_free(bdx);
    cudaFree(d_a); cudaFree(d_da); cudaFree(scr);
}

/* A slope count other than 1 or the channels is refused, naming both. */
void cmp_prelu_refused(const op_case &k, const op_env &e)
{
    float *p = dalloc<float>(16);
    const int rc = sf_cuda_prelu_fwd_dt(SF_DT_F32, SF_LAYOUT_NCHW, p, p, 3, p, 1, 4, 4, e.s);
    pass_or_fail("prelu with 3 slopes for 4 channels is refused", rc == -1 && strstr(sf_cuda_last_error(), "3 slopes"),
                 "accepted, or the error does not name the slopes");
    cudaFree(p);
}
