/* tests/gpu/test_concat.cu — concatenation along channels (gpu/cuda/concat.h)
 * against the reference (sf_ref_concat_put_f64, sf_ref_concat_take_f64): the
 * inputs put into their channels of the output and the output gradient
 * sliced back to each input, exactly (copies), in fp32 and bf16, NCHW and
 * NHWC, with 2, 3 and SF_MAX_IN inputs of odd channel counts (n=3, 7x5), on
 * flat features (hw = 1), and a slice outside the output refused.
 * Prints "ok <case>" or "FAIL <case>: ..." per case; exits 1 on any failure,
 * 0 with "SKIPPED: no CUDA device" when there is no GPU. Helpers and the
 * criteria they apply: op_test.h.
 */
#include "tests/gpu/op_test.h"

#include "gpu/cuda/concat.h"

extern "C" {
#include "gpu/model.h"
}

static std::vector<float> to_lay(const std::vector<float> &v, sf_layout lay, int n, int c, int h, int w)
{
    return lay == SF_LAYOUT_NHWC ? to_nhwc(v, n, c, h, w) : v;
}
static std::vector<float> from_lay(const std::vector<float> &v, sf_layout lay, int n, int c, int h, int w)
{
    return lay == SF_LAYOUT_NHWC ? to_nchw(v, n, c, h, w) : v;
}

static void test_concat(cudaStream_t s, sf_dtype dt, sf_layout lay, int n, const std::vector<int> &cs, int h, int w)
{
    char nm[200], sub[260];
    int ctot = 0;
    for (int c : cs)
        ctot += c;
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
    std::vector<dbuf> bx, bdx;
    std::vector<std::vector<double>> dxr;
    int c0 = 0, rc = 0;
    for (size_t j = 0; j < cs.size(); j++) {
        const size_t lj = (size_t)n * cs[j] * hw;
        std::vector<float> x(lj);
        rand_fill_dt(x, dt, 1.f);
        std::vector<double> xd = to_d(x), g(lj);
        sf_ref_concat_put_f64(xd.data(), n, cs[j], hw, ctot, c0, yr.data());
        sf_ref_concat_take_f64(dyd.data(), n, cs[j], hw, ctot, c0, g.data());
        dxr.push_back(g);
        bx.push_back(dbuf_make(dt, lj, 0));
        bdx.push_back(dbuf_make(dt, lj, 0));
        up_dt(bx.back(), to_lay(x, lay, n, cs[j], h, w));
        poison_dt(bdx.back());
        if (!rc)
            rc = sf_cuda_concat_put_dt(dt, lay, bx.back().p, n, cs[j], hw, ctot, c0, by.p, s);
        if (!rc)
            rc = sf_cuda_concat_take_dt(dt, lay, bdy.p, n, cs[j], hw, ctot, c0, bdx.back().p, s);
        c0 += cs[j];
    }
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s fwd (exact)", nm);
        check_ulp(sub, from_lay(down_dt(by, len), lay, n, ctot, h, w), yr, 0, 0);
        for (size_t j = 0; j < cs.size(); j++) {
            snprintf(sub, sizeof sub, "%s dx%zu (exact)", nm, j);
            check_ulp(sub, from_lay(down_dt(bdx[j], bdx[j].n), lay, n, cs[j], h, w), dxr[j], 0, 0);
        }
    }
    for (auto &b : bx)
        dbuf_free(b);
    for (auto &b : bdx)
        dbuf_free(b);
    dbuf_free(by); dbuf_free(bdy);
}

static void run_cases(cudaStream_t s)
{
    std::vector<int> many(SF_MAX_IN);
    for (int j = 0; j < SF_MAX_IN; j++)
        many[j] = 1 + j % 3;
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts) {
            test_concat(s, dt, lay, 3, {3, 2}, 7, 5);
            test_concat(s, dt, lay, 3, {3, 1, 5}, 7, 5);
            test_concat(s, dt, lay, 2, many, 3, 3);   /* SF_MAX_IN inputs (DenseNet's dense blocks) */
            test_concat(s, dt, lay, 5, {7, 4}, 1, 1); /* flat features */
        }
    {
        float *p = dalloc<float>(64);
        const int rc = sf_cuda_concat_put_dt(SF_DT_F32, SF_LAYOUT_NCHW, p, 1, 3, 4, 4, 2, p + 16, s);
        pass_or_fail("a slice past the output's channels is refused", rc == -1, "accepted");
        cudaFree(p);
    }
}

int main(void)
{
    return run_op_test("test_concat", run_cases);
}
