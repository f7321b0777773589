/* tests/gpu/ops/tokens.cu — the token-sequence layers of a Vision
 * Transformer (gpu/cuda/tokens.h) against the reference (gpu/ref/tokens.c,
 * in double): a map as tokens and back (sf_ref_transpose_f64) from NCHW and
 * NHWC maps, the class token in front (sf_ref_prepend_token_*_f64), the
 * position embedding (sf_ref_add_bcast_*_f64) and the first token as
 * features (sf_ref_select_token_*_f64), forward and backward, in fp32 and
 * bf16, on odd shapes (16 + 1 = 17 tokens of 24, ViT-B/16's 196 + 1 = 197
 * tokens of 64). Moves are exact; the parameter gradients (sums over the
 * samples in fp32) are held to 1e-6 of the reference and must be bit-equal
 * from one run to the next (no atomics).
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/tokens.h"

static std::vector<float> rnd(size_t n, sf_dtype dt)
{
    std::vector<float> v(n);
    rand_fill_dt(v, dt, 1.f);
    return v;
}

/* to_tokens: [n, c, h, w] (stored in lay) -> [n, h*w, c], and the backward. */
static void test_to_tokens(cudaStream_t s, sf_dtype dt, sf_layout lay, int n, int c, int h, int w)
{
    char nm[160], sub[220];
    snprintf(nm, sizeof nm, "to_tokens %s %s n%d c%d %dx%d", dtname(dt), lname(lay), n, c, h, w);
    const int hw = h * w;
    const size_t len = (size_t)n * c * hw;
    std::vector<float> x = rnd(len, dt), dy = rnd(len, dt);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(len), dxr(len);
    sf_ref_transpose_f64(xd.data(), n, c, hw, yr.data());   /* NCHW map -> tokens */
    sf_ref_transpose_f64(dyd.data(), n, hw, c, dxr.data()); /* tokens -> NCHW map */
    dbuf bx = dbuf_make(dt, len, 0), by = dbuf_make(dt, len, 0), bdy = dbuf_make(dt, len, 0),
         bdx = dbuf_make(dt, len, 0);
    up_dt(bx, lay == SF_LAYOUT_NHWC ? to_nhwc(x, n, c, h, w) : x);
    up_dt(bdy, dy);
    poison_dt(by);
    poison_dt(bdx);
    int rc = sf_cuda_tokens_from_map_dt(dt, lay, bx.p, n, c, hw, by.p, s);
    if (!rc)
        rc = sf_cuda_tokens_to_map_dt(dt, lay, bdy.p, n, c, hw, bdx.p, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s fwd (exact)", nm);
        check_ulp(sub, down_dt(by, len), yr, 0, 0);
        std::vector<float> dx = down_dt(bdx, len);
        snprintf(sub, sizeof sub, "%s bwd (exact)", nm);
        check_ulp(sub, lay == SF_LAYOUT_NHWC ? to_nchw(dx, n, c, h, w) : dx, dxr, 0, 0);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
}

/* Runs a parameter-gradient launcher twice on the same input and checks the
 * two results are bit-equal. */
static void check_repeat(const char *name, const float *d, size_t n, const std::vector<float> &first)
{
    std::vector<float> again(n);
    CU(cudaMemcpy(again.data(), d, n * 4, cudaMemcpyDeviceToHost));
    pass_or_fail(name, memcmp(again.data(), first.data(), n * 4) == 0, "a second run gave different bits");
}

/* class_token: [n, t, c] -> [n, t+1, c] with cls in front; dx and dcls. */
static void test_class_token(cudaStream_t s, sf_dtype dt, int n, int t, int c)
{
    char nm[160], sub[220];
    snprintf(nm, sizeof nm, "class_token %s n%d t%d+1 c%d", dtname(dt), n, t, c);
    const size_t lx = (size_t)n * t * c, ly = (size_t)n * (t + 1) * c;
    std::vector<float> x = rnd(lx, dt), dy = rnd(ly, dt), cls(c);
    rand_fill_dt(cls, dt, 1.f); /* the output holds it in dt: exact only if representable */
    std::vector<double> xd = to_d(x), dyd = to_d(dy), cd = to_d(cls), yr(ly), dxr(lx), dcr(c);
    sf_ref_prepend_token_fwd_f64(xd.data(), n, t, c, cd.data(), yr.data());
    sf_ref_prepend_token_bwd_f64(dyd.data(), n, t, c, dxr.data(), dcr.data());
    dbuf bx = dbuf_make(dt, lx, 0), by = dbuf_make(dt, ly, 0), bdy = dbuf_make(dt, ly, 0), bdx = dbuf_make(dt, lx, 0);
    float *bc = dalloc<float>(c), *bdc = dalloc<float>(c);
    up_dt(bx, x);
    up_dt(bdy, dy);
    up(bc, cls);
    poison_dt(by);
    poison_dt(bdx);
    poison_f(bdc, c);
    int rc = sf_cuda_prepend_token_fwd_dt(dt, bx.p, n, t, c, bc, by.p, s);
    if (!rc)
        rc = sf_cuda_prepend_token_bwd_dt(dt, bdy.p, n, t, c, bdx.p, bdc, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s fwd (exact)", nm);
        check_ulp(sub, down_dt(by, ly), yr, 0, 0);
        snprintf(sub, sizeof sub, "%s dx (exact)", nm);
        check_ulp(sub, down_dt(bdx, lx), dxr, 0, 0);
        std::vector<float> dc(c);
        CU(cudaMemcpy(dc.data(), bdc, c * 4, cudaMemcpyDeviceToHost));
        snprintf(sub, sizeof sub, "%s dcls", nm);
        check_ulp(sub, dc, dcr, 1e-6, 1e-6);
        rc = sf_cuda_prepend_token_bwd_dt(dt, bdy.p, n, t, c, NULL, bdc, s);
        CU(cudaStreamSynchronize(s));
        snprintf(sub, sizeof sub, "%s dcls is the same bits on a second run (no dx wanted)", nm);
        if (rc)
            fail(sub, sf_cuda_last_error());
        else
            check_repeat(sub, bdc, c, dc);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
    cudaFree(bc);
    cudaFree(bdc);
}

/* pos_embedding: y = x + p over [n, t*c]; dp = sum over n of dy. */
static void test_pos_embedding(cudaStream_t s, sf_dtype dt, int n, int t, int c)
{
    char nm[160], sub[220];
    snprintf(nm, sizeof nm, "pos_embedding %s n%d t%d c%d", dtname(dt), n, t, c);
    const size_t len = (size_t)t * c, tot = (size_t)n * len;
    std::vector<float> x = rnd(tot, dt), dy = rnd(tot, dt), p(len);
    rand_fill(p, 1.f); /* fp32 parameter, not rounded: the sum is rounded once to dt */
    std::vector<double> xd = to_d(x), dyd = to_d(dy), pd = to_d(p), yr(tot), dpr(len);
    sf_ref_add_bcast_fwd_f64(xd.data(), n, len, pd.data(), yr.data());
    sf_ref_add_bcast_bwd_f64(dyd.data(), n, len, dpr.data());
    dbuf bx = dbuf_make(dt, tot, 0), by = dbuf_make(dt, tot, 0), bdy = dbuf_make(dt, tot, 0);
    float *bp = dalloc<float>(len), *bdp = dalloc<float>(len);
    up_dt(bx, x);
    up_dt(bdy, dy);
    up(bp, p);
    poison_dt(by);
    poison_f(bdp, len);
    int rc = sf_cuda_add_bcast_fwd_dt(dt, bx.p, n, len, bp, by.p, s);
    if (!rc)
        rc = sf_cuda_add_bcast_bwd_dt(dt, bdy.p, n, len, bdp, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s fwd", nm);
        check_dt(sub, dt, down_dt(by, tot), yr, 1e-7);
        std::vector<float> dp(len);
        CU(cudaMemcpy(dp.data(), bdp, len * 4, cudaMemcpyDeviceToHost));
        snprintf(sub, sizeof sub, "%s dp", nm);
        check_ulp(sub, dp, dpr, 1e-6, 1e-6);
        rc = sf_cuda_add_bcast_bwd_dt(dt, bdy.p, n, len, bdp, s);
        CU(cudaStreamSynchronize(s));
        snprintf(sub, sizeof sub, "%s dp is the same bits on a second run", nm);
        if (rc)
            fail(sub, sf_cuda_last_error());
        else
            check_repeat(sub, bdp, len, dp);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy);
    cudaFree(bp);
    cudaFree(bdp);
}

/* select_token: [n, t, c] -> [n, c] (token 0); the backward scatters. */
static void test_select_token(cudaStream_t s, sf_dtype dt, int n, int t, int c)
{
    char nm[160], sub[220];
    snprintf(nm, sizeof nm, "select_token %s n%d t%d c%d", dtname(dt), n, t, c);
    const size_t lx = (size_t)n * t * c, ly = (size_t)n * c;
    std::vector<float> x = rnd(lx, dt), dy = rnd(ly, dt);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(ly), dxr(lx);
    sf_ref_select_token_fwd_f64(xd.data(), n, t, c, yr.data());
    sf_ref_select_token_bwd_f64(dyd.data(), n, t, c, dxr.data());
    dbuf bx = dbuf_make(dt, lx, 0), by = dbuf_make(dt, ly, 0), bdy = dbuf_make(dt, ly, 0), bdx = dbuf_make(dt, lx, 0);
    up_dt(bx, x);
    up_dt(bdy, dy);
    poison_dt(by);
    poison_dt(bdx);
    int rc = sf_cuda_select_token_fwd_dt(dt, bx.p, n, t, c, by.p, s);
    if (!rc)
        rc = sf_cuda_select_token_bwd_dt(dt, bdy.p, n, t, c, bdx.p, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s fwd (exact)", nm);
        check_ulp(sub, down_dt(by, ly), yr, 0, 0);
        snprintf(sub, sizeof sub, "%s bwd (exact, zeros elsewhere)", nm);
        check_ulp(sub, down_dt(bdx, lx), dxr, 0, 0);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
}

/* shape {n, c, h, w} */
void cmp_to_tokens(const op_case &c, const op_env &e)
{
    test_to_tokens(e.s, c.dt, c.lay, c.shape[0], c.shape[1], c.shape[2], c.shape[3]);
}
/* shape {n, t, c} for the three below */
void cmp_class_token(const op_case &c, const op_env &e) { test_class_token(e.s, c.dt, c.shape[0], c.shape[1], c.shape[2]); }
void cmp_pos_embedding(const op_case &c, const op_env &e)
{
    test_pos_embedding(e.s, c.dt, c.shape[0], c.shape[1], c.shape[2]);
}
void cmp_select_token(const op_case &c, const op_env &e) { test_select_token(e.s, c.dt, c.shape[0], c.shape[1], c.shape[2]); }
