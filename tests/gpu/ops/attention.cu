/* tests/gpu/ops/attention.cu — multi-head self-attention on the device
 * against the reference (gpu/ref/attention.c, in double): the materialised
 * core (gpu/cuda/attention.h) forward (the weights and the heads' output,
 * sf_ref_attention_core_fwd_f64) and backward (the packed dqkv,
 * sf_ref_attention_core_bwd_f64), and the whole layer as the executor runs
 * it (in_proj GEMM and bias, the core, out_proj GEMM and bias, and their
 * backward through linear.h and pointwise.h) against
 * sf_ref_attention_fwd_f64 / sf_ref_attention_bwd_f64, in fp32 (strict) and
 * bf16, on odd shapes: 17 and 197 tokens, 1, 4 and 12 heads, head
 * dimensions 16 and 64.
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 *
 * Tolerances (the rows'): tol for the forward outputs and out_proj's
 * gradients, tol_aux for what passes back through the core (dqkv, dx,
 * in_proj's gradients), both through check_gemm. fp32: the norm-relative
 * error of fp32 GEMMs and a fp32 softmax over at most 197 keys against
 * double, 1e-5, and 3e-5 through the core's backward (two chained products
 * more). bf16: the inputs are bf16-rounded on both sides, but the
 * materialised core also stores the weights P (and the scores' gradient dS)
 * in bf16 between its GEMMs, where the reference keeps them exact: each is an
 * extra half-ulp (2^-9) per element that the following product averages over
 * the keys, so the outputs stay within 2e-2 of max |ref| (check_max), which
 * still catches a wrong head, stride or transpose (errors of order max |ref|).
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include <cublas_v2.h>

#include "gpu/cuda/attention.h"

static std::vector<float> rnd(size_t n, sf_dtype dt, float scale)
{
    std::vector<float> v(n);
    rand_fill_dt(v, dt, scale);
    return v;
}

static void test_core(cublasHandle_t h, cudaStream_t s, const op_case &k, sf_dtype dt, int n, int t, int heads, int d)
{
    char nm[160], sub[220];
    const int c = heads * d;
    snprintf(nm, sizeof nm, "attention core %s n%d t%d heads%d d%d", dtname(dt), n, t, heads, d);
    const size_t lq = (size_t)n * t * 3 * c, lo = (size_t)n * t * c, lp = sf_attn_p_elems(n, t, heads);
    std::vector<float> qkv = rnd(lq, dt, 1.f), d_o = rnd(lo, dt, 1.f);
    std::vector<double> qd = to_d(qkv), dod = to_d(d_o), ar(lp), orf(lo), dqr(lq);
    sf_ref_attention_core_fwd_f64(qd.data(), n, t, c, heads, ar.data(), orf.data());
    sf_ref_attention_core_bwd_f64(qd.data(), ar.data(), dod.data(), n, t, c, heads, dqr.data());
    dbuf bq = dbuf_make(dt, lq, 0), bo = dbuf_make(dt, lo, 0), bp = dbuf_make(dt, lp, 0), bdo = dbuf_make(dt, lo, 0),
         bdq = dbuf_make(dt, lq, 0);
    float *bs = dalloc<float>(lp);
    up_dt(bq, qkv);
    up_dt(bdo, d_o);
    poison_dt(bo);
    poison_dt(bp);
    poison_dt(bdq);
    poison_f(bs, lp);
    int rc = sf_attn_core_fwd(h, dt, bq.p, n, t, c, heads, bs, bp.p, bo.p, 0, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        check_gemm(subname(nm, "fwd weights"), dt, down_dt(bp, lp), ar, k.tol);
        check_gemm(subname(nm, "fwd o"), dt, down_dt(bo, lo), orf, k.tol);
        poison_f(bs, lp);
        rc = sf_attn_core_bwd(h, dt, bq.p, bp.p, bdo.p, n, t, c, heads, bs, bdq.p, 0, s);
        CU(cudaStreamSynchronize(s));
        snprintf(sub, sizeof sub, "%s bwd dqkv", nm);
        if (rc)
            fail(sub, sf_cuda_last_error());
        else
            check_gemm(sub, dt, down_dt(bdq, lq), dqr, k.tol_aux);
    }
    dbuf_free(bq); dbuf_free(bo); dbuf_free(bp); dbuf_free(bdo); dbuf_free(bdq);
    cudaFree(bs);
}

/* The whole layer in the executor's order (executor.cu, g_attention_fwd and
 * g_attention_bwd). */
static void test_layer(cublasHandle_t h, cudaStream_t s, const op_case &k, sf_dtype dt, int n, int t, int heads,
                       int d)
{
    char nm[160];
    const int c = heads * d, rows = n * t;
    snprintf(nm, sizeof nm, "self_attention layer %s n%d t%d heads%d d%d", dtname(dt), n, t, heads, d);
    const size_t lx = (size_t)rows * c, lq = lx * 3, lp = sf_attn_p_elems(n, t, heads);
    const float wb = 1.f / sqrtf((float)c);
    std::vector<float> x = rnd(lx, dt, 1.f), dy = rnd(lx, dt, 1.f), win = rnd((size_t)3 * c * c, dt, wb),
                       wout = rnd((size_t)c * c, dt, wb), bin = rnd((size_t)3 * c, SF_DT_F32, 0.1f),
                       bout = rnd((size_t)c, SF_DT_F32, 0.1f);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), wid = to_d(win), wod = to_d(wout), bid = to_d(bin),
                        bod = to_d(bout), qr(lq), ar(lp), orf(lx), yr(lx), dor(lx), dqr(lq), dxr(lx),
                        dwir((size_t)3 * c * c), dbir((size_t)3 * c), dwor((size_t)c * c), dbor(c);
    sf_ref_attention_fwd_f64(xd.data(), n, t, c, heads, wid.data(), bid.data(), wod.data(), bod.data(), qr.data(),
                             ar.data(), orf.data(), yr.data());
    sf_ref_attention_bwd_f64(xd.data(), n, t, c, heads, wid.data(), wod.data(), qr.data(), ar.data(), orf.data(),
                             dyd.data(), dor.data(), dqr.data(), dxr.data(), dwir.data(), dbir.data(), dwor.data(),
                             dbor.data());
    dbuf bx = dbuf_make(dt, lx, 0), by = dbuf_make(dt, lx, 0), bdy = dbuf_make(dt, lx, 0), bdx = dbuf_make(dt, lx, 0),
         bq = dbuf_make(dt, lq, 0), bo = dbuf_make(dt, lx, 0), bp = dbuf_make(dt, lp, 0), bdo = dbuf_make(dt, lx, 0),
         bdq = dbuf_make(dt, lq, 0), bwi = dbuf_make(dt, (size_t)3 * c * c, 0), bwo = dbuf_make(dt, (size_t)c * c, 0);
    float *bs = dalloc<float>(lp), *bbi = dalloc<float>(3 * c), *bbo = dalloc<float>(c),
          *gwi = dalloc<float>((size_t)3 * c * c), *gbi = dalloc<float>(3 * c), *gwo = dalloc<float>((size_t)c * c),
          *gbo = dalloc<float>(c), *scr = dalloc<float>(sf_cuda_bias_grad_scratch(3 * c));
    up_dt(bx, x);
    up_dt(bdy, dy);
    up_dt(bwi, win);
    up_dt(bwo, wout);
    up(bbi, bin);
    up(bbo, bout);
    poison_dt(by);
    poison_dt(bdx);
    poison_f(gwi, (size_t)3 * c * c);
    poison_f(gwo, (size_t)c * c);
    poison_f(gbi, 3 * c);
    poison_f(gbo, c);
    int rc = sf_linear_fwd_dt(h, dt, bx.p, rows, c, bwi.p, 3 * c, bq.p, 0) ||
             sf_cuda_bias_act_dt(dt, bq.p, bbi, (size_t)rows, 3 * c, 1, 0, s) ||
             sf_attn_core_fwd(h, dt, bq.p, n, t, c, heads, bs, bp.p, bo.p, 0, s) ||
             sf_linear_fwd_dt(h, dt, bo.p, rows, c, bwo.p, c, by.p, 0) ||
             sf_cuda_bias_act_dt(dt, by.p, bbo, (size_t)rows, c, 1, 0, s) ||
             sf_cuda_bias_grad_dt(dt, bdy.p, NULL, (size_t)rows, c, 1, gbo, scr, s) ||
             sf_linear_bwd_filter_dt(h, dt, bo.p, rows, c, bdy.p, c, gwo, 0) ||
             sf_linear_bwd_data_dt(h, dt, bdy.p, rows, c, bwo.p, c, bdo.p, 0) ||
             sf_attn_core_bwd(h, dt, bq.p, bp.p, bdo.p, n, t, c, heads, bs, bdq.p, 0, s) ||
             sf_cuda_bias_grad_dt(dt, bdq.p, NULL, (size_t)rows, 3 * c, 1, gbi, scr, s) ||
             sf_linear_bwd_filter_dt(h, dt, bx.p, rows, c, bdq.p, 3 * c, gwi, 0) ||
             sf_linear_bwd_data_dt(h, dt, bdq.p, rows, c, bwi.p, 3 * c, bdx.p, 0);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        const struct {
            const char *what;
            std::vector<float> got;
            const std::vector<double> *ref;
            double tol;
        } out[] = {
            {"y", down_dt(by, lx), &yr, k.tol},
            {"dx", down_dt(bdx, lx), &dxr, k.tol_aux},
            {"in_proj_weight grad", down(gwi, (size_t)3 * c * c), &dwir, k.tol_aux},
            {"in_proj_bias grad", down(gbi, (size_t)3 * c), &dbir, k.tol_aux},
            {"out_proj.weight grad", down(gwo, (size_t)c * c), &dwor, k.tol},
            {"out_proj.bias grad", down(gbo, (size_t)c), &dbor, k.tol},
        };
        for (const auto &e : out)
            check_gemm(subname(nm, e.what), dt, e.got, *e.ref, e.tol);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx); dbuf_free(bq); dbuf_free(bo);
    dbuf_free(bp); dbuf_free(bdo); dbuf_free(bdq); dbuf_free(bwi); dbuf_free(bwo);
    float *fl[] = {bs, bbi, bbo, gwi, gbi, gwo, gbo, scr};
    for (float *p : fl)
        cudaFree(p);
}

/* shape {n, tokens, heads, head dimension}; tol, tol_aux: the file's
 * comment */
void cmp_attention_core(const op_case &c, const op_env &e)
{
    test_core(e.blas, e.s, c, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3]);
}
void cmp_attention_layer(const op_case &c, const op_env &e)
{
    test_layer(e.blas, e.s, c, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3]);
}
/* shape {n, tokens, embedding, heads}: heads that do not divide the embedding */
void cmp_attention_refused(const op_case &c, const op_env &e)
{
    const int rc = sf_attn_core_fwd(e.blas, SF_DT_F32, NULL, c.shape[0], c.shape[1], c.shape[2], c.shape[3], NULL, NULL,
                                    NULL, 0, e.s);
    pass_or_fail("heads that do not divide the embedding are refused", rc == -1, "accepted");
}
