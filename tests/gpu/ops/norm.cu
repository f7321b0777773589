/* tests/gpu/ops/norm.cu — the LayerNorm kernels of gpu/cuda/norm.h against
 * sf_ref_layernorm_* in double: layernorm2d (a map's channels per pixel, NCHW
 * and NHWC) and layernorm (a flat tensor's features, hw = 1), fp32 and bf16,
 * forward (y and the saved mean and rstd) and backward (dx, dweight, dbias;
 * and without dx), ConvNeXt's shapes at a small size, odd sizes, more
 * positions than the weight gradient's chunks, a channel count past one
 * warp's stride, each lane grouping of the vector row kernels, one element
 * off 16-byte alignment, and a norm without a bias (no shift, no bias
 * gradient: nn.LayerNorm(bias=False), timm's LayerNorm2dNoBias). The rows: tests/gpu/op_cases.cu; helpers and the criteria
 * they apply: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/norm.h"

/* shape {n, c, h, w}; p {dx wanted, x, y, dy and dx one element off 16-byte
 * alignment (absent: aligned), dx added to what it holds (dx_add; absent:
 * written), no bias (absent: a bias)}; f {eps}. fp32: y, dx, the saved mean
 * and rstd within tol, dweight and dbias within tol_param; bf16 (inputs
 * rounded, so the reference sees the same values): y and dx by check_dt (half
 * a bf16 ulp), the fp32 weight gradients within tol_param. */
void cmp_layernorm(const op_case &k, const op_env &e)
{
    const cudaStream_t s = e.s;
    const sf_dtype dt = k.dt;
    const sf_layout lay = k.lay;
    const int n = k.shape[0], c = k.shape[1], h = k.shape[2], w = k.shape[3], want_dx = k.p[0];
    const int mis = k.p.size() > 1 ? k.p[1] : 0;
    const int add = k.p.size() > 2 ? k.p[2] : 0;
    const int bias = k.p.size() > 3 ? !k.p[3] : 1;
    const float eps = k.f[0];
    char nm[200], sub[260];
    snprintf(nm, sizeof nm, "layernorm%s %s n%d c%d %dx%d eps %g %s%s%s%s%s", h * w > 1 ? "2d" : "", dtname(dt), n,
             c, h, w, eps, lname(lay), want_dx ? "" : " no dx", mis ? " misaligned" : "", add ? " dx added" : "",
             bias ? "" : " no bias");
    const size_t hw = (size_t)h * w, nx = (size_t)n * c * hw, pos = (size_t)n * hw;
    std::vector<float> x(nx), dy(nx), ga(c), be(c);
    rand_fill_dt(x, dt, 2.f, 0.5f);
    rand_fill_dt(dy, dt, 1.f);
    rand_fill(ga, 0.5f, 1.f);
    rand_fill(be, 0.5f);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), gd = to_d(ga), bd = to_d(be), yr(nx), dxr(nx), dgr(c), dbr(c);
    sf_ref_layernorm_fwd_f64(xd.data(), n, c, hw, gd.data(), bias ? bd.data() : NULL, (double)eps, yr.data());
    sf_ref_layernorm_bwd_f64(xd.data(), n, c, hw, gd.data(), (double)eps, dyd.data(), dxr.data(), dgr.data(),
                             dbr.data());
    /* dx_add: what dx held before (as its dtype holds it), plus the gradient */
    std::vector<float> prior(nx);
    if (add) {
        rand_fill_dt(prior, dt, 1.f);
        for (size_t i = 0; i < nx; i++)
            dxr[i] += prior[i];
    }
    std::vector<double> mr(pos), rr(pos);
    for (int ni = 0; ni < n; ni++)
        for (size_t p = 0; p < hw; p++) {
            double sum = 0, v = 0;
            for (int ci = 0; ci < c; ci++)
                sum += xd[((size_t)ni * c + ci) * hw + p];
            const double mu = sum / c;
            for (int ci = 0; ci < c; ci++) {
                const double d = xd[((size_t)ni * c + ci) * hw + p] - mu;
                v += d * d;
            }
            mr[(size_t)ni * hw + p] = mu;
            rr[(size_t)ni * hw + p] = 1.0 / sqrt(v / c + eps);
        }
    const int nhwc = lay == SF_LAYOUT_NHWC;
    dbuf bx = dbuf_make(dt, nx, mis), by = dbuf_make(dt, nx, mis), bdy = dbuf_make(dt, nx, mis),
         bdx = dbuf_make(dt, nx, mis);
    float *dga = dalloc<float>(c), *dbe = dalloc<float>(c), *dm = dalloc<float>(pos), *dr = dalloc<float>(pos),
          *ddg = dalloc<float>(c), *ddb = dalloc<float>(c);
    void *scr = dalloc<char>(sf_cuda_layernorm_scratch_bytes(n, c, hw, lay));
    up_dt(bx, nhwc ? to_nhwc(x, n, c, h, w) : x);
    up_dt(bdy, nhwc ? to_nhwc(dy, n, c, h, w) : dy);
    up(dga, ga);
    up(dbe, be);
    poison_dt(by);
    if (add)
        up_dt(bdx, nhwc ? to_nhwc(prior, n, c, h, w) : prior);
    else
        poison_dt(bdx);
    poison_f(dm, pos);
    poison_f(dr, pos);
    poison_f(ddg, c);
    poison_f(ddb, c);
    int rc = sf_cuda_layernorm_fwd_dt(dt, bx.p, n, c, hw, lay, dga, bias ? dbe : NULL, eps, by.p, dm, dr, s);
    if (!rc)
        rc = sf_cuda_layernorm_bwd_dt(dt, bx.p, bdy.p, n, c, hw, lay, dga, dm, dr, want_dx ? bdx.p : NULL, add, ddg,
                                      bias ? ddb : NULL, scr, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> y = down_dt(by, nx), dx = down_dt(bdx, nx);
        if (nhwc) {
            y = to_nchw(y, n, c, h, w);
            dx = to_nchw(dx, n, c, h, w);
        }
        snprintf(sub, sizeof sub, "%s fwd y", nm);
        check_dt(sub, dt, y, yr, k.tol);
        snprintf(sub, sizeof sub, "%s fwd saved mean", nm);
        check_v(sub, down(dm, pos), mr, k.tol);
        snprintf(sub, sizeof sub, "%s fwd saved rstd", nm);
        check_v(sub, down(dr, pos), rr, k.tol);
        if (want_dx) {
            snprintf(sub, sizeof sub, "%s bwd dx", nm);
            check_dt(sub, dt, dx, dxr, k.tol);
        } else {
            /* dx NULL: the kernel must not have written the poisoned buffer */
            size_t written = 0;
            for (float v : dx)
                written += !isnan(v);
            snprintf(sub, sizeof sub, "%s bwd leaves dx alone", nm);
            pass_or_fail(sub, written == 0, "dx written");
        }
        snprintf(sub, sizeof sub, "%s bwd dweight", nm);
        check_v(sub, down(ddg, c), dgr, k.tol_param);
        if (bias) {
            snprintf(sub, sizeof sub, "%s bwd dbias", nm);
            check_v(sub, down(ddb, c), dbr, k.tol_param);
        }
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
    cudaFree(dga); cudaFree(dbe); cudaFree(dm); cudaFree(dr); cudaFree(ddg); cudaFree(ddb); cudaFree(scr);
}
