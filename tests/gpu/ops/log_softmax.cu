/* tests/gpu/ops/log_softmax.cu — log_softmax over features
 * (gpu/cuda/log_softmax.h) against the double reference
 * (sf_ref_log_softmax_fwd_f64/_bwd_f64): forward and input gradient, fp32
 * and bf16, a classifier's 10 classes, 1000 (many a lane; rows of a warp each,
 * a block's last rows idle), one feature (log_softmax is 0 and its gradient 0), rows of large and spread
 * values (the maximum's shift keeps exp finite), the backward in place on dy;
 * and bad shapes refused. The rows: tests/gpu/op_cases.cu; helpers and the
 * criteria they apply: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/log_softmax.h"

/* shape {rows, cols}; p {in place (dx written over dy)}; f {scale of x};
 * tol: fp32's relative error (check_dt; bf16 outputs: half an ulp) */
void cmp_log_softmax(const op_case &c, const op_env &e)
{
    const sf_dtype dt = c.dt;
    const int rows = c.shape[0], cols = c.shape[1], in_place = c.p[0];
    const size_t len = (size_t)rows * cols;
    char nm[160], sub[200];
    snprintf(nm, sizeof nm, "log_softmax %s %dx%d x*%g%s", dtname(dt), rows, cols, (double)c.f[0],
             in_place ? " dx over dy" : "");
    std::vector<float> x(len), dy(len);
    rand_fill_dt(x, dt, c.f[0]);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> yr(len), dxr(len);
    sf_ref_log_softmax_fwd_f64(to_d(x).data(), rows, cols, yr.data());
    sf_ref_log_softmax_bwd_f64(to_d(x).data(), to_d(dy).data(), rows, cols, dxr.data());
    io_bufs b = io_make(dt, x, dy);
    const dbuf &dx = in_place ? b.dy : b.dx;
    int rc = sf_cuda_log_softmax_fwd_dt(dt, b.x.p, b.y.p, rows, cols, e.s);
    if (!rc)
        rc = sf_cuda_log_softmax_bwd_dt(dt, b.x.p, b.dy.p, dx.p, rows, cols, e.s);
    CU(cudaStreamSynchronize(e.s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s fwd", nm);
        check_dt(sub, dt, down_dt(b.y, len), yr, c.tol);
        snprintf(sub, sizeof sub, "%s dx", nm);
        check_dt(sub, dt, down_dt(dx, len), dxr, c.tol);
    }
    io_free(b);
}

/* No features, a negative row count and an unknown type are refused with the
 * reason. */
void cmp_log_softmax_refused(const op_case &, const op_env &e)
{
    float *z = dalloc<float>(16);
    pass_or_fail("log_softmax refuses 0 features", sf_cuda_log_softmax_fwd_dt(SF_DT_F32, z, z, 2, 0, e.s) == -1 &&
                                                       strstr(sf_cuda_last_error(), "features") != NULL,
                 "accepted");
    sf_cuda_clear_error();
    pass_or_fail("log_softmax refuses negative rows",
                 sf_cuda_log_softmax_bwd_dt(SF_DT_F32, z, z, z, -1, 4, e.s) == -1, "accepted");
    sf_cuda_clear_error();
    pass_or_fail("log_softmax refuses an unknown type",
                 sf_cuda_log_softmax_fwd_dt((sf_dtype)7, z, z, 2, 4, e.s) == -1, "accepted");
    sf_cuda_clear_error();
    cudaFree(z);
}
