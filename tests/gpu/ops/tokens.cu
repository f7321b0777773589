/* tests/gpu/ops/tokens.cu — the token-sequence layers of a Vision
 * Transformer (gpu/cuda/tokens.h) against the reference (gpu/ref/tokens.c,
 * in double): a map as tokens and back (sf_ref_transpose_f64) from NCHW and
 * NHWC maps, the class token in front (sf_ref_prepend_token_*_f64), the
 * position embedding (sf_ref_add_bcast_*_f64) and the first token as
 * features (sf_ref_select_token_*_f64), forward and backward, in fp32 and
 * bf16, on odd shapes (16 + 1 = 17 tokens of 24, ViT-B/16's 196 + 1 = 197
 * tokens of 64). Moves are exact; the parameter gradients (sums over the
 * samples in fp32) are held to the row's tol_param and must be bit-equal
 * from one run to the next (no atomics).
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include <cstring>

#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/tokens.h"

static std::vector<float> rnd(size_t n, sf_dtype dt)
{
    std::vector<float> v(n);
    rand_fill_dt(v, dt, 1.f);
    return v;
}

/* The whole of buffer b (n elements) equals ref exactly, under "<nm> <what>". */
static void check_exact(const char *nm, const char *what, const dbuf &b, const std::vector<double> &ref)
{
    check_ulp(subname(nm, what), down_dt(b, ref.size()), ref, 0, 0);
}

/* to_tokens: [n, c, h, w] (stored in lay) -> [n, h*w, c], and the backward;
 * exact. */
static void test_to_tokens(cudaStream_t s, sf_dtype dt, sf_layout lay, int n, int c, int h, int w)
{
    char nm[160];
    snprintf(nm, sizeof nm, "to_tokens %s %s n%d c%d %dx%d", dtname(dt), lname(lay), n, c, h, w);
    const int hw = h * w;
    const size_t len = (size_t)n * c * hw;
    std::vector<float> x = rnd(len, dt), dy = rnd(len, dt);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(len), dxr(len);
    sf_ref_transpose_f64(xd.data(), n, c, hw, yr.data());   /* NCHW map -> tokens */
    sf_ref_transpose_f64(dyd.data(), n, hw, c, dxr.data()); /* tokens -> NCHW map */
    io_bufs b = io_make(dt, to_lay(x, lay, n, c, h, w), dy);
    int rc = sf_cuda_tokens_from_map_dt(dt, lay, b.x.p, n, c, hw, b.y.p, s);
    if (!rc)
        rc = sf_cuda_tokens_to_map_dt(dt, lay, b.dy.p, n, c, hw, b.dx.p, s);
    if (ran_ok(s, nm, rc)) {
        check_exact(nm, "fwd (exact)", b.y, yr);
        check_ulp(subname(nm, "bwd (exact)"), from_lay(down_dt(b.dx, len), lay, n, c, h, w), dxr, 0, 0);
    }
    io_free(b);
}

/* A parameter gradient d (n fp32 elements) a second launch wrote is bit-equal
 * to the first's, `first`. */
static void check_repeat(const char *name, const float *d, size_t n, const std::vector<float> &first)
{
    std::vector<float> again(n);
    CU(cudaMemcpy(again.data(), d, n * 4, cudaMemcpyDeviceToHost));
    pass_or_fail(name, memcmp(again.data(), first.data(), n * 4) == 0, "a second run gave different bits");
}

/* A parameter gradient (d, fp32, against ref) within tol of the reference
 * (element by element, relative and of max|ref|), then relaunched by again()
 * and bit-equal to the first run's. */
template <class Again>
static void check_param_grad(cudaStream_t s, const char *nm, const char *what, const char *what_again, const float *d,
                             const std::vector<double> &ref, double tol, Again again)
{
    const std::vector<float> first = down(d, ref.size());
    check_ulp(subname(nm, what), first, ref, tol, tol);
    const subname sub(nm, what_again);
    if (ran_ok(s, sub, again()))
        check_repeat(sub, d, ref.size(), first);
}

/* class_token: [n, t, c] -> [n, t+1, c] with cls in front; dx and dcls.
 * The moves exact, dcls within tol_param. */
static void test_class_token(cudaStream_t s, const op_case &k, sf_dtype dt, int n, int t, int c)
{
    char nm[160];
    snprintf(nm, sizeof nm, "class_token %s n%d t%d+1 c%d", dtname(dt), n, t, c);
    const size_t lx = (size_t)n * t * c, ly = (size_t)n * (t + 1) * c;
    std::vector<float> x = rnd(lx, dt), dy = rnd(ly, dt), cls(c);
    rand_fill_dt(cls, dt, 1.f); /* the output holds it in dt: exact only if representable */
    std::vector<double> xd = to_d(x), dyd = to_d(dy), cd = to_d(cls), yr(ly), dxr(lx), dcr(c);
    sf_ref_prepend_token_fwd_f64(xd.data(), n, t, c, cd.data(), yr.data());
    sf_ref_prepend_token_bwd_f64(dyd.data(), n, t, c, dxr.data(), dcr.data());
    io_bufs b = io_make(dt, x, dy);
    float *bc = dalloc<float>(c), *bdc = dalloc<float>(c);
    up(bc, cls);
    poison_f(bdc, c);
    int rc = sf_cuda_prepend_token_fwd_dt(dt, b.x.p, n, t, c, bc, b.y.p, s);
    if (!rc)
        rc = sf_cuda_prepend_token_bwd_dt(dt, b.dy.p, n, t, c, b.dx.p, bdc, s);
    if (ran_ok(s, nm, rc)) {
        check_exact(nm, "fwd (exact)", b.y, yr);
        check_exact(nm, "dx (exact)", b.dx, dxr);
        check_param_grad(s, nm, "dcls", "dcls is the same bits on a second run (no dx wanted)", bdc, dcr, k.tol_param,
                         [&] { return sf_cuda_prepend_token_bwd_dt(dt, b.dy.p, n, t, c, NULL, bdc, s); });
    }
    io_free(b);
    cudaFree(bc);
    cudaFree(bdc);
}

/* pos_embedding: y = x + p over [n, t*c]; dp = sum over n of dy. y by
 * check_dt within tol, dp within tol_param. */
static void test_pos_embedding(cudaStream_t s, const op_case &k, sf_dtype dt, int n, int t, int c)
{
    char nm[160];
    snprintf(nm, sizeof nm, "pos_embedding %s n%d t%d c%d", dtname(dt), n, t, c);
    const size_t len = (size_t)t * c, tot = (size_t)n * len;
    std::vector<float> x = rnd(tot, dt), dy = rnd(tot, dt), p(len);
    rand_fill(p, 1.f); /* fp32 parameter, not rounded: the sum is rounded once to dt */
    std::vector<double> xd = to_d(x), dyd = to_d(dy), pd = to_d(p), yr(tot), dpr(len);
    sf_ref_add_bcast_fwd_f64(xd.data(), n, len, pd.data(), yr.data());
    sf_ref_add_bcast_bwd_f64(dyd.data(), n, len, dpr.data());
    io_bufs b = io_make(dt, x, dy);
    float *bp = dalloc<float>(len), *bdp = dalloc<float>(len);
    up(bp, p);
    poison_f(bdp, len);
    int rc = sf_cuda_add_bcast_fwd_dt(dt, b.x.p, n, len, bp, b.y.p, s);
    if (!rc)
        rc = sf_cuda_add_bcast_bwd_dt(dt, b.dy.p, n, len, bdp, s);
    if (ran_ok(s, nm, rc)) {
        check_dt(subname(nm, "fwd"), dt, down_dt(b.y, tot), yr, k.tol);
        check_param_grad(s, nm, "dp", "dp is the same bits on a second run", bdp, dpr, k.tol_param,
                         [&] { return sf_cuda_add_bcast_bwd_dt(dt, b.dy.p, n, len, bdp, s); });
    }
    io_free(b);
    cudaFree(bp);
    cudaFree(bdp);
}

/* select_token: [n, t, c] -> [n, c] (token 0); the backward scatters; exact. */
static void test_select_token(cudaStream_t s, sf_dtype dt, int n, int t, int c)
{
    char nm[160];
    snprintf(nm, sizeof nm, "select_token %s n%d t%d c%d", dtname(dt), n, t, c);
    const size_t lx = (size_t)n * t * c, ly = (size_t)n * c;
    std::vector<float> x = rnd(lx, dt), dy = rnd(ly, dt);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(ly), dxr(lx);
    sf_ref_select_token_fwd_f64(xd.data(), n, t, c, yr.data());
    sf_ref_select_token_bwd_f64(dyd.data(), n, t, c, dxr.data());
    io_bufs b = io_make(dt, x, dy);
    int rc = sf_cuda_select_token_fwd_dt(dt, b.x.p, n, t, c, b.y.p, s);
    if (!rc)
        rc = sf_cuda_select_token_bwd_dt(dt, b.dy.p, n, t, c, b.dx.p, s);
    if (ran_ok(s, nm, rc)) {
        check_exact(nm, "fwd (exact)", b.y, yr);
        check_exact(nm, "bwd (exact, zeros elsewhere)", b.dx, dxr);
    }
    io_free(b);
}

/* token_mean: [n, t, c] -> [n, c], the mean of tokens start..t-1; the
 * backward spreads dy / (t - start) over them. Both by check_dt within tol
 * (fp32: the sum's rounding; bf16: half an ulp), the left-out tokens'
 * gradient exactly 0. */
static void test_token_mean(cudaStream_t s, const op_case &k, sf_dtype dt, int n, int t, int c, int start)
{
    char nm[160];
    snprintf(nm, sizeof nm, "token_mean %s n%d t%d c%d start%d", dtname(dt), n, t, c, start);
    const size_t lx = (size_t)n * t * c, ly = (size_t)n * c;
    std::vector<float> x = rnd(lx, dt), dy = rnd(ly, dt);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(ly), dxr(lx);
    sf_ref_token_mean_fwd_f64(xd.data(), n, t, c, start, yr.data());
    sf_ref_token_mean_bwd_f64(dyd.data(), n, t, c, start, dxr.data());
    io_bufs b = io_make(dt, x, dy);
    int rc = sf_cuda_token_mean_fwd_dt(dt, b.x.p, n, t, c, start, b.y.p, s);
    if (!rc)
        rc = sf_cuda_token_mean_bwd_dt(dt, b.dy.p, n, t, c, start, b.dx.p, s);
    if (ran_ok(s, nm, rc)) {
        check_dt(subname(nm, "fwd"), dt, down_dt(b.y, ly), yr, k.tol);
        const std::vector<float> dx = down_dt(b.dx, lx);
        check_dt(subname(nm, "bwd"), dt, dx, dxr, k.tol);
        size_t nonzero = 0;
        for (int ni = 0; ni < n; ni++)
            for (size_t e = 0; e < (size_t)start * c; e++)
                nonzero += dx[(size_t)ni * t * c + e] != 0.f;
        pass_or_fail(subname(nm, "the left-out tokens' gradient is 0"), nonzero == 0, "some are not");
    }
    /* no token to average: refused, naming the op */
    const int refused = sf_cuda_token_mean_fwd_dt(dt, b.x.p, n, t, c, t, b.y.p, s) == -1 &&
                        strstr(sf_cuda_last_error(), "token_mean");
    pass_or_fail(subname(nm, "start = t is refused naming token_mean"), refused, "accepted");
    sf_cuda_clear_error();
    io_free(b);
}

/* shape {n, c, h, w} */
void cmp_to_tokens(const op_case &c, const op_env &e)
{
    test_to_tokens(e.s, c.dt, c.lay, c.shape[0], c.shape[1], c.shape[2], c.shape[3]);
}
/* shape {n, t, c} for the three below; tol: pos_embedding's y (the moves are
 * exact); tol_param: the parameter gradients dcls and dp */
void cmp_class_token(const op_case &c, const op_env &e)
{
    test_class_token(e.s, c, c.dt, c.shape[0], c.shape[1], c.shape[2]);
}
void cmp_pos_embedding(const op_case &c, const op_env &e)
{
    test_pos_embedding(e.s, c, c.dt, c.shape[0], c.shape[1], c.shape[2]);
}
void cmp_select_token(const op_case &c, const op_env &e) { test_select_token(e.s, c.dt, c.shape[0], c.shape[1], c.shape[2]); }
/* shape {n, t, c}, p {start}; tol: y and dx in fp32 */
void cmp_token_mean(const op_case &c, const op_env &e)
{
    test_token_mean(e.s, c, c.dt, c.shape[0], c.shape[1], c.shape[2], c.p[0]);
}
