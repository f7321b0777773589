/* tests/gpu/ops/upsample.cu — nearest-neighbour upsampling
 * (gpu/cuda/upsample.h) against the double reference
 * (sf_ref_upsample_fwd_f64/_bwd_f64): the forward exactly (copies) and the
 * backward's block sums, fp32 and bf16, NCHW and NHWC, factors 1, 2 and 3 over
 * odd maps; bad shapes refused. The rows: tests/gpu/op_cases.cu; helpers and
 * criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/upsample.h"

/* shape {n, c, h, w}; p {scale}; tol: dx's (check_dt; the forward is exact) */
void cmp_upsample(const op_case &k, const op_env &e)
{
    const sf_dtype dt = k.dt;
    const sf_layout lay = k.lay;
    const int n = k.shape[0], c = k.shape[1], h = k.shape[2], w = k.shape[3], sc = k.p[0];
    const int oh = h * sc, ow = w * sc;
    char nm[160];
    snprintf(nm, sizeof nm, "upsample %s %s n%d c%d %dx%d x%d", dtname(dt), lname(lay), n, c, h, w, sc);
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * oh * ow;
    std::vector<float> x(nx), dy(ny);
    rand_fill_dt(x, dt, 1.f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> yr(ny), dxr(nx);
    sf_ref_upsample_fwd_f64(to_d(x).data(), n, c, h, w, sc, yr.data());
    sf_ref_upsample_bwd_f64(to_d(dy).data(), n, c, h, w, sc, dxr.data());
    io_bufs b = io_make(dt, to_lay(x, lay, n, c, h, w), to_lay(dy, lay, n, c, oh, ow));
    int rc = sf_cuda_upsample_fwd_dt(dt, lay, b.x.p, n, c, h, w, sc, b.y.p, e.s);
    if (!rc)
        rc = sf_cuda_upsample_bwd_dt(dt, lay, b.dy.p, n, c, h, w, sc, b.dx.p, e.s);
    CU(cudaStreamSynchronize(e.s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        check_ulp(subname(nm, "fwd (exact)"), from_lay(down_dt(b.y, ny), lay, n, c, oh, ow), yr, 0, 0);
        check_dt(subname(nm, "dx"), dt, from_lay(down_dt(b.dx, nx), lay, n, c, h, w), dxr, k.tol);
    }
    io_free(b);
}

/* A scale below 1, no channels and an unknown type are refused with the reason. */
void cmp_upsample_refused(const op_case &, const op_env &e)
{
    float *z = dalloc<float>(16);
    pass_or_fail("upsample refuses scale 0",
                 sf_cuda_upsample_fwd_dt(SF_DT_F32, SF_LAYOUT_NCHW, z, 1, 1, 2, 2, 0, z, e.s) == -1 &&
                     strstr(sf_cuda_last_error(), "scale") != NULL,
                 "accepted");
    sf_cuda_clear_error();
    pass_or_fail("upsample refuses no channels",
                 sf_cuda_upsample_bwd_dt(SF_DT_F32, SF_LAYOUT_NHWC, z, 1, 0, 2, 2, 2, z, e.s) == -1, "accepted");
    sf_cuda_clear_error();
    pass_or_fail("upsample refuses an unknown type",
                 sf_cuda_upsample_fwd_dt((sf_dtype)7, SF_LAYOUT_NCHW, z, 1, 1, 2, 2, 2, z, e.s) == -1, "accepted");
    sf_cuda_clear_error();
    cudaFree(z);
}
