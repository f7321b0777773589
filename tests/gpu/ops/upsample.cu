/* tests/gpu/ops/upsample.cu — upsampling and resizing (gpu/cuda/upsample.h)
 * against the double reference (sf_ref_upsample_fwd_f64/_bwd_f64) on the
 * same indices and weights (gpu/upsample_rule.h): nearest's forward exactly (copies),
 * bilinear's blends and every backward within the row's tolerance, fp32 and
 * bf16, NCHW and NHWC, over odd maps, up and down; bad shapes refused. The
 * rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/upsample.h"

/* shape {n, c, h, w}; p {mode (SF_UP_*), align_corners, out h, out w};
 * tol: fp32's bound of bilinear's forward and of every dx (check_dt) */
void cmp_upsample(const op_case &k, const op_env &e)
{
    const sf_dtype dt = k.dt;
    const sf_layout lay = k.lay;
    const int n = k.shape[0], c = k.shape[1], h = k.shape[2], w = k.shape[3];
    const int bil = k.p[0] == SF_UP_BILINEAR, oh = k.p[2], ow = k.p[3];
    const sf_up_rule p = sf_up_rule_of(bil, k.p[1], h, w, oh, ow);
    char nm[160];
    snprintf(nm, sizeof nm, "upsample %s %s %s%s n%d c%d %dx%d to %dx%d", dtname(dt), lname(lay),
             bil ? "bilinear" : "nearest", k.p[1] ? " align_corners" : "", n, c, h, w, oh, ow);
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * oh * ow;
    std::vector<float> x(nx), dy(ny);
    rand_fill_dt(x, dt, 1.f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> yr(ny), dxr(nx);
    sf_ref_upsample_fwd_f64(to_d(x).data(), n, c, &p, yr.data());
    sf_ref_upsample_bwd_f64(to_d(dy).data(), n, c, &p, dxr.data());
    io_bufs b = io_make(dt, to_lay(x, lay, n, c, h, w), to_lay(dy, lay, n, c, oh, ow));
    int rc = sf_cuda_upsample_fwd_dt(dt, lay, b.x.p, n, c, &p, b.y.p, e.s);
    if (!rc)
        rc = sf_cuda_upsample_bwd_dt(dt, lay, b.dy.p, n, c, &p, b.dx.p, e.s);
    CU(cudaStreamSynchronize(e.s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        const std::vector<float> y = from_lay(down_dt(b.y, ny), lay, n, c, oh, ow);
        if (bil)
            check_dt(subname(nm, "fwd"), dt, y, yr, k.tol);
        else
            check_ulp(subname(nm, "fwd (exact)"), y, yr, 0, 0);
        check_dt(subname(nm, "dx"), dt, from_lay(down_dt(b.dx, nx), lay, n, c, h, w), dxr, k.tol);
    }
    io_free(b);
}

/* No output, no channels, a negative scale and an unknown type are refused
 * with the reason. */
void cmp_upsample_refused(const op_case &, const op_env &e)
{
    float *z = dalloc<float>(16);
    sf_up_rule p = sf_up_rule_of(0, 0, 2, 2, 4, 4);
    sf_up_rule none = p;
    none.h.out = 0;
    pass_or_fail("upsample refuses an empty output",
                 sf_cuda_upsample_fwd_dt(SF_DT_F32, SF_LAYOUT_NCHW, z, 1, 1, &none, z, e.s) == -1 &&
                     strstr(sf_cuda_last_error(), "to 0x4") != NULL,
                 "accepted");
    sf_cuda_clear_error();
    pass_or_fail("upsample refuses no channels",
                 sf_cuda_upsample_bwd_dt(SF_DT_F32, SF_LAYOUT_NHWC, z, 1, 0, &p, z, e.s) == -1, "accepted");
    sf_cuda_clear_error();
    sf_up_rule neg = p;
    neg.w.scale = -1.f;
    pass_or_fail("upsample refuses a negative scale",
                 sf_cuda_upsample_bwd_dt(SF_DT_F32, SF_LAYOUT_NCHW, z, 1, 1, &neg, z, e.s) == -1, "accepted");
    sf_cuda_clear_error();
    pass_or_fail("upsample refuses an unknown type",
                 sf_cuda_upsample_fwd_dt((sf_dtype)7, SF_LAYOUT_NCHW, z, 1, 1, &p, z, e.s) == -1, "accepted");
    sf_cuda_clear_error();
    cudaFree(z);
}
