/* tests/gpu/ops/grn.cu — Global Response Normalization (gpu/cuda/grn.h)
 * against the double reference (sf_ref_grn_fwd_f64/_bwd_f64): the output,
 * the saved norms and divisors, dx (or none written when not wanted) and the
 * weight's and bias's gradients, fp32 and bf16, NCHW and NHWC, ConvNeXt V2's
 * shapes at a small size (its MLP's 4x channels, a 7x7 last stage), odd
 * sizes, a channel count past one NHWC tile, a one-position map, a channel
 * of zeros (its norm 0: no gradient through it, as PyTorch's), whose
 * backward captured into a CUDA graph replays bit-equal; bad arguments
 * refused. The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/grn.h"

/* shape {n, c, h, w}; p {dx wanted, a zero channel (absent: none)}; f
 * {eps}; tol: the output and dx (check_dt), tol_param: the saved statistics
 * and the parameters' gradients */
void cmp_grn(const op_case &k, const op_env &e)
{
    const cudaStream_t s = e.s;
    const sf_dtype dt = k.dt;
    const sf_layout lay = k.lay;
    const int n = k.shape[0], c = k.shape[1], h = k.shape[2], w = k.shape[3], want_dx = k.p[0];
    const int zero = k.p.size() > 1 ? k.p[1] : 0;
    const float eps = k.f[0];
    char nm[200];
    snprintf(nm, sizeof nm, "grn %s %s n%d c%d %dx%d eps %g%s%s", dtname(dt), lname(lay), n, c, h, w, eps,
             want_dx ? "" : " no dx", zero ? " zero channel" : "");
    const size_t hw = (size_t)h * w, nx = (size_t)n * c * hw, ns = sf_cuda_grn_save_floats(n, c);
    std::vector<float> x(nx), dy(nx), wt(c), bs(c);
    rand_fill_dt(x, dt, 2.f);
    rand_fill_dt(dy, dt, 1.f);
    rand_fill(wt, 1.f);
    rand_fill(bs, 0.5f);
    if (zero)
        for (int ni = 0; ni < n; ni++)
            for (size_t p = 0; p < hw; p++)
                x[((size_t)ni * c + 1) * hw + p] = 0.f;
    std::vector<double> xd = to_d(x), dyd = to_d(dy), wd = to_d(wt), bd = to_d(bs), yr(nx), dxr(nx), dwr(c), dbr(c),
                        sr(ns);
    sf_ref_grn_fwd_f64(xd.data(), n, c, hw, wd.data(), bd.data(), eps, yr.data());
    sf_ref_grn_bwd_f64(xd.data(), n, c, hw, wd.data(), eps, dyd.data(), dxr.data(), dwr.data(), dbr.data());
    for (int ni = 0; ni < n; ni++) { /* the saved norms and divisors */
        double mean = 0;
        for (int ci = 0; ci < c; ci++) {
            double q = 0;
            for (size_t p = 0; p < hw; p++)
                q += xd[((size_t)ni * c + ci) * hw + p] * xd[((size_t)ni * c + ci) * hw + p];
            sr[(size_t)ni * c + ci] = sqrt(q);
            mean += sqrt(q);
        }
        sr[(size_t)n * c + ni] = mean / c + eps;
    }
    const int nhwc = lay == SF_LAYOUT_NHWC;
    io_bufs b = io_make(dt, nhwc ? to_nhwc(x, n, c, h, w) : x, nhwc ? to_nhwc(dy, n, c, h, w) : dy);
    float *d_w = dalloc<float>(c), *d_b = dalloc<float>(c), *d_s = dalloc<float>(ns), *d_dw = dalloc<float>(c),
          *d_db = dalloc<float>(c);
    char *scr = dalloc<char>(sf_cuda_grn_scratch_bytes(n, c));
    up(d_w, wt);
    up(d_b, bs);
    int rc = sf_cuda_grn_fwd_dt(dt, lay, b.x.p, n, c, hw, d_w, d_b, eps, b.y.p, d_s, s);
    auto bwd = [&](cudaStream_t st) {
        return sf_cuda_grn_bwd_dt(dt, lay, b.x.p, b.dy.p, n, c, hw, d_w, d_s, want_dx ? b.dx.p : NULL, d_dw, d_db,
                                  scr, st);
    };
    if (!rc)
        rc = bwd(s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        check_lay(nm, "fwd y", b.y, lay, n, c, h, w, yr, k.tol);
        check_v(subname(nm, "fwd saved norms and divisors"), down(d_s, ns), sr, k.tol_param);
        check_dx_lay(nm, b.dx, lay, n, c, h, w, dxr, want_dx, k.tol);
        check_v(subname(nm, "bwd dweight"), down(d_dw, c), dwr, k.tol_param);
        check_v(subname(nm, "bwd dbias"), down(d_db, c), dbr, k.tol_param);
        check_graph_replay(subname(nm, "bwd: captured graph replays bit-equal"), s, bwd,
                           {{d_dw, c * sizeof(float)}, {d_db, c * sizeof(float)}});
    }
    io_free(b);
    cudaFree(d_w); cudaFree(d_b); cudaFree(d_s); cudaFree(d_dw); cudaFree(d_db); cudaFree(scr);
}

/* No channels, an unknown type, a weight gradient without the bias's and
 * parameter gradients without scratch are refused with the reason. */
void cmp_grn_refused(const op_case &, const op_env &e)
{
    float *z = dalloc<float>(64);
    pass_or_fail("grn refuses no channels",
                 sf_cuda_grn_fwd_dt(SF_DT_F32, SF_LAYOUT_NCHW, z, 2, 0, 4, z, z, 1e-6f, z, z, e.s) == -1, "accepted");
    sf_cuda_clear_error();
    pass_or_fail("grn refuses an unknown type",
                 sf_cuda_grn_fwd_dt((sf_dtype)7, SF_LAYOUT_NCHW, z, 2, 4, 4, z, z, 1e-6f, z, z, e.s) == -1,
                 "accepted");
    sf_cuda_clear_error();
    const int lone = sf_cuda_grn_bwd_dt(SF_DT_F32, SF_LAYOUT_NHWC, z, z, 2, 4, 1, z, z, z, z, NULL, z, e.s);
    pass_or_fail("grn refuses a weight gradient without the bias's",
                 lone == -1 && strstr(sf_cuda_last_error(), "bias") != NULL, "accepted");
    sf_cuda_clear_error();
    const int bare = sf_cuda_grn_bwd_dt(SF_DT_F32, SF_LAYOUT_NHWC, z, z, 2, 4, 1, z, z, z, z, z, NULL, e.s);
    pass_or_fail("grn refuses parameter gradients without scratch",
                 bare == -1 && strstr(sf_cuda_last_error(), "scratch") != NULL, "accepted");
    sf_cuda_clear_error();
    cudaFree(z);
}
