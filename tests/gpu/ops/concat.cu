/* tests/gpu/ops/concat.cu — concatenation along channels (gpu/cuda/concat.h)
 * against the reference (sf_ref_concat_put_f64, sf_ref_concat_take_f64): the
 * inputs put into their channels of the output and the output gradient
 * sliced back to each input, plain and through the ReLU mask of the output
 * (sf_ref_concat_take_masked_f64), exactly (copies), in fp32 and bf16, NCHW and
 * NHWC, with 2, 3 and SF_MAX_IN inputs of odd channel counts (n=3, 7x5), on
 * flat features (hw = 1), and a slice outside the output refused. The rows:
 * tests/gpu/op_cases.cu; helpers and the criteria they apply: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/concat.h"

extern "C" {
#include "gpu/model.h"
}

/* shape {n, h, w}; p {each input's channels}; tol 0 (copies: exact) */
void cmp_concat(const op_case &c, const op_env &e)
{
    const cudaStream_t s = e.s;
    const sf_dtype dt = c.dt;
    const sf_layout lay = c.lay;
    const int n = c.shape[0], h = c.shape[1], w = c.shape[2];
    const std::vector<int> &cs = c.p;
    char nm[200], sub[260];
    int ctot = 0;
    for (int cj : cs)
        ctot += cj;
    snprintf(nm, sizeof nm, "concat %s %s n%d of %zu inputs (%d channels) %dx%d", dtname(dt), lname(lay), n,
             cs.size(), ctot, h, w);
    const size_t hw = (size_t)h * w, len = (size_t)n * ctot * hw;
    std::vector<double> yr(len), dyd;
    std::vector<float> dy(len);
    rand_fill_dt(dy, dt, 1.f);
    dyd = to_d(dy);
    dbuf by = dbuf_make(dt, len, 0), bdy = dbuf_make(dt, len, 0);
    poison_dt(by);
    up_dt(bdy, to_lay(dy, lay, n, ctot, h, w));
    std::vector<dbuf> bx, bdx, bdm;
    std::vector<std::vector<double>> dxr, dmr;
    int c0 = 0, rc = 0;
    for (size_t j = 0; j < cs.size(); j++) {
        const size_t lj = (size_t)n * cs[j] * hw;
        std::vector<float> x(lj);
        rand_fill_dt(x, dt, 1.f);
        for (size_t i = 0; i < lj; i += 5)
            x[i] = 0.f; /* the masked slice's kink: y = 0 passes no gradient */
        std::vector<double> xd = to_d(x), g(lj);
        sf_ref_concat_put_f64(xd.data(), n, cs[j], hw, ctot, c0, yr.data());
        sf_ref_concat_take_f64(dyd.data(), n, cs[j], hw, ctot, c0, g.data());
        dxr.push_back(g);
        bx.push_back(dbuf_make(dt, lj, 0));
        bdx.push_back(dbuf_make(dt, lj, 0));
        bdm.push_back(dbuf_make(dt, lj, 0));
        up_dt(bx.back(), to_lay(x, lay, n, cs[j], h, w));
        poison_dt(bdx.back());
        poison_dt(bdm.back());
        if (!rc)
            rc = sf_cuda_concat_put_dt(dt, lay, bx.back().p, n, cs[j], hw, ctot, c0, by.p, s);
        if (!rc)
            rc = sf_cuda_concat_take_dt(dt, lay, bdy.p, n, cs[j], hw, ctot, c0, bdx.back().p, s);
        c0 += cs[j];
    }
    /* the slices through the ReLU mask of the finished concatenation */
    c0 = 0;
    for (size_t j = 0; j < cs.size(); j++) {
        std::vector<double> g((size_t)n * cs[j] * hw);
        sf_ref_concat_take_masked_f64(dyd.data(), yr.data(), n, cs[j], hw, ctot, c0, g.data());
        dmr.push_back(g);
        if (!rc)
            rc = sf_cuda_concat_take_masked_dt(dt, lay, bdy.p, by.p, n, cs[j], hw, ctot, c0, bdm[j].p, s);
        c0 += cs[j];
    }
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s fwd (exact)", nm);
        check_ulp(sub, from_lay(down_dt(by, len), lay, n, ctot, h, w), yr, c.tol, c.tol);
        for (size_t j = 0; j < cs.size(); j++) {
            snprintf(sub, sizeof sub, "%s dx%zu (exact)", nm, j);
            check_ulp(sub, from_lay(down_dt(bdx[j], bdx[j].n), lay, n, cs[j], h, w), dxr[j], c.tol, c.tol);
            snprintf(sub, sizeof sub, "%s dx%zu through the ReLU mask of y (exact)", nm, j);
            check_ulp(sub, from_lay(down_dt(bdm[j], bdm[j].n), lay, n, cs[j], h, w), dmr[j], c.tol, c.tol);
        }
    }
    for (auto &b : bx)
        dbuf_free(b);
    for (auto &b : bdx)
        dbuf_free(b);
    for (auto &b : bdm)
        dbuf_free(b);
    dbuf_free(by); dbuf_free(bdy);
}

/* A slice past the output's channels is refused. shape {n, channels, hw};
 * p {the output's channels, the slice's first channel} */
void cmp_concat_refused(const op_case &c, const op_env &e)
{
    float *p = dalloc<float>(64);
    const int rc = sf_cuda_concat_put_dt(SF_DT_F32, SF_LAYOUT_NCHW, p, c.shape[0], c.shape[1], c.shape[2], c.p[0],
                                         c.p[1], p + 16, e.s);
    pass_or_fail("a slice past the output's channels is refused", rc == -1, "accepted");
    cudaFree(p);
}
