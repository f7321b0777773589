/* gpu/cuda/linear.cu — linear layers as cuBLAS GEMMs on row-major tensors,
 * and as cuBLASLt GEMMs with the bias and its gradient in their epilogues.
 * Contracts in linear.h. */
#include "gpu/cuda/linear.h"
#include "gpu/cuda/timing.cuh"

#include <stdio.h>

#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

static cublasComputeType_t linear_ct(int tf32)
{
    return tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

/* Operand type and compute type of a linear layer with data type dt; -1 (error
 * set) for an unknown dt. bf16: CUDA_R_16BF operands with CUBLAS_COMPUTE_32F
 * (tensor cores, fp32 accumulation; the scalars stay float). */
extern "C" int sf_cublas_types(sf_dtype dt, int tf32, const char *fn, cudaDataType_t *ab, cublasComputeType_t *ct)
{
    if (dt == SF_DT_F32) {
        *ab = CUDA_R_32F;
        *ct = linear_ct(tf32);
        return 0;
    }
    if (dt == SF_DT_BF16) {
        *ab = CUDA_R_16BF;
        *ct = CUBLAS_COMPUTE_32F;
        return 0;
    }
    sf_cuda_set_error("%s:%d: %s: dtype %d", __FILE__, __LINE__, fn, (int)dt);
    return -1;
}

extern "C" cublasStatus_t sf_cublas_strict_begin(cublasHandle_t h, cublasMath_t *saved)
{
    cublasStatus_t st = cublasGetMathMode(h, saved);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    return cublasSetMathMode(h, (cublasMath_t)(*saved | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
}

extern "C" cublasStatus_t sf_cublas_strict_end(cublasHandle_t h, cublasMath_t saved)
{
    return cublasSetMathMode(h, saved);
}

/* cublasGemmEx with the handle's math mode, or, for bf16 operands, between
 * sf_cublas_strict_begin and sf_cublas_strict_end. fp32 calls leave the
 * handle alone, so they are the calls the float functions always made. */
static cublasStatus_t gemm_ex(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const void *A, cudaDataType_t at, int lda, const void *B, cudaDataType_t bt, int ldb,
                              void *C, cudaDataType_t ctype, int ldc, cublasComputeType_t ct)
{
    const float one = 1.f, zero = 0.f;
    if (at != CUDA_R_16BF)
        return cublasGemmEx(h, ta, tb, m, n, k, &one, A, at, lda, B, bt, ldb, &zero, C, ctype, ldc, ct,
                            CUBLAS_GEMM_DEFAULT);
    cublasMath_t mode;
    cublasStatus_t st = sf_cublas_strict_begin(h, &mode);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    st = cublasGemmEx(h, ta, tb, m, n, k, &one, A, at, lda, B, bt, ldb, &zero, C, ctype, ldc, ct, CUBLAS_GEMM_DEFAULT);
    const cublasStatus_t st2 = sf_cublas_strict_end(h, mode);
    return st != CUBLAS_STATUS_SUCCESS ? st : st2;
}

extern "C" int sf_linear_fwd_dt(cublasHandle_t h, sf_dtype dt, const void *x, int n, int in, const void *w,
                                int out, void *y, int tf32)
{
    cudaDataType_t t;
    cublasComputeType_t ct;
    if (sf_cublas_types(dt, tf32, "sf_linear_fwd_dt", &t, &ct))
        return -1;
    /* y^T [out, n] = w [out, in] . x^T [in, n] */
    SF_CUBLAS_CHECK(gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, w, t, in, x, t, in, y, t, out, ct));
    return 0;
}

extern "C" int sf_linear_bwd_data_dt(cublasHandle_t h, sf_dtype dt, const void *dy, int n, int in, const void *w,
                                     int out, void *dx, int tf32)
{
    cudaDataType_t t;
    cublasComputeType_t ct;
    if (sf_cublas_types(dt, tf32, "sf_linear_bwd_data_dt", &t, &ct))
        return -1;
    /* dx^T [in, n] = w^T [in, out] . dy^T [out, n] */
    SF_CUBLAS_CHECK(gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, w, t, in, dy, t, out, dx, t, in, ct));
    return 0;
}

extern "C" int sf_linear_bwd_filter_dt(cublasHandle_t h, sf_dtype dt, const void *x, int n, int in, const void *dy,
                                       int out, float *dw, int tf32)
{
    cudaDataType_t t;
    cublasComputeType_t ct;
    if (sf_cublas_types(dt, tf32, "sf_linear_bwd_filter_dt", &t, &ct))
        return -1;
    /* dw^T [in, out] = x^T [in, n] . dy [n, out]; dw is fp32 whatever dt is
     * (bf16 A/B with an fp32 C is one of cublasGemmEx's combinations). */
    SF_CUBLAS_CHECK(gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, x, t, in, dy, t, out, dw, CUDA_R_32F, in, ct));
    return 0;
}

extern "C" int sf_linear_fwd(cublasHandle_t h, const float *x, int n, int in, const float *w, int out,
                             float *y, int tf32)
{
    return sf_linear_fwd_dt(h, SF_DT_F32, x, n, in, w, out, y, tf32);
}

extern "C" int sf_linear_bwd_data(cublasHandle_t h, const float *dy, int n, int in, const float *w,
                                  int out, float *dx, int tf32)
{
    return sf_linear_bwd_data_dt(h, SF_DT_F32, dy, n, in, w, out, dx, tf32);
}

extern "C" int sf_linear_bwd_filter(cublasHandle_t h, const float *x, int n, int in, const float *dy,
                                    int out, float *dw, int tf32)
{
    return sf_linear_bwd_filter_dt(h, SF_DT_F32, x, n, in, dy, out, dw, tf32);
}

/* ---- per pixel over a map's channels --------------------------------------- */

extern "C" cublasStatus_t sf_cublas_gemm_sb(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                            int n, int k, float alpha, const void *A, cudaDataType_t at, int lda,
                                            long long sa, const void *B, cudaDataType_t bt, int ldb, long long sb,
                                            float beta, void *C, cudaDataType_t ctype, int ldc, long long sc,
                                            int batch, cublasComputeType_t ct)
{
    if (at != CUDA_R_16BF)
        return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &alpha, A, at, lda, sa, B, bt, ldb, sb, &beta, C, ctype,
                                          ldc, sc, batch, ct, CUBLAS_GEMM_DEFAULT);
    cublasMath_t mode;
    cublasStatus_t st = sf_cublas_strict_begin(h, &mode);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    st = cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &alpha, A, at, lda, sa, B, bt, ldb, sb, &beta, C, ctype, ldc,
                                    sc, batch, ct, CUBLAS_GEMM_DEFAULT);
    const cublasStatus_t st2 = sf_cublas_strict_end(h, mode);
    return st != CUBLAS_STATUS_SUCCESS ? st : st2;
}

/* A map's positions as the rows of one GEMM: NHWC maps and flat tensors
 * (hw = 1), whose channels are contiguous per position. */
static int map_rows(sf_layout lay, int n, size_t hw, const char *fn, int *rows)
{
    if (n < 1 || hw < 1 || (double)n * hw > 2147483647.0) {
        sf_cuda_set_error("%s:%d: %s: n=%d hw=%zu", __FILE__, __LINE__, fn, n, hw);
        return -1;
    }
    *rows = (int)((size_t)n * hw);
    return lay == SF_LAYOUT_NHWC || hw == 1;
}

extern "C" int sf_linear_map_fwd_dt(cublasHandle_t h, sf_dtype dt, sf_layout lay, const void *x, int n, size_t hw,
                                    int in, const void *w, int out, void *y, int tf32)
{
    const char *fn = "sf_linear_map_fwd_dt";
    int rows;
    const int flat = map_rows(lay, n, hw, fn, &rows);
    if (flat < 0)
        return -1;
    if (flat)
        return sf_linear_fwd_dt(h, dt, x, rows, in, w, out, y, tf32);
    cudaDataType_t t;
    cublasComputeType_t ct;
    if (sf_cublas_types(dt, tf32, fn, &t, &ct))
        return -1;
    /* per sample, column-major: y_n^T [hw, out] = x_n^T [hw, in] . w^T [in, out] */
    const int p = (int)hw;
    SF_CUBLAS_CHECK(sf_cublas_gemm_sb(h, CUBLAS_OP_N, CUBLAS_OP_N, p, out, in, 1.f, x, t, p, (long long)in * p, w, t,
                                      in, 0, 0.f, y, t, p, (long long)out * p, n, ct));
    return 0;
}

extern "C" int sf_linear_map_bwd_data_dt(cublasHandle_t h, sf_dtype dt, sf_layout lay, const void *dy, int n,
                                         size_t hw, int in, const void *w, int out, void *dx, int tf32)
{
    const char *fn = "sf_linear_map_bwd_data_dt";
    int rows;
    const int flat = map_rows(lay, n, hw, fn, &rows);
    if (flat < 0)
        return -1;
    if (flat)
        return sf_linear_bwd_data_dt(h, dt, dy, rows, in, w, out, dx, tf32);
    cudaDataType_t t;
    cublasComputeType_t ct;
    if (sf_cublas_types(dt, tf32, fn, &t, &ct))
        return -1;
    /* per sample, column-major: dx_n^T [hw, in] = dy_n^T [hw, out] . w [out, in] */
    const int p = (int)hw;
    SF_CUBLAS_CHECK(sf_cublas_gemm_sb(h, CUBLAS_OP_N, CUBLAS_OP_T, p, in, out, 1.f, dy, t, p, (long long)out * p, w, t,
                                      in, 0, 0.f, dx, t, p, (long long)in * p, n, ct));
    return 0;
}

extern "C" int sf_linear_map_bwd_filter_dt(cublasHandle_t h, sf_dtype dt, sf_layout lay, const void *x, int n,
                                           size_t hw, int in, const void *dy, int out, float *dw, int tf32)
{
    const char *fn = "sf_linear_map_bwd_filter_dt";
    int rows;
    const int flat = map_rows(lay, n, hw, fn, &rows);
    if (flat < 0)
        return -1;
    if (flat)
        return sf_linear_bwd_filter_dt(h, dt, x, rows, in, dy, out, dw, tf32);
    cudaDataType_t t;
    cublasComputeType_t ct;
    if (sf_cublas_types(dt, tf32, fn, &t, &ct))
        return -1;
    /* dw^T [in, out] = sum over samples of x_n [in, hw] . dy_n^T [hw, out]: in
     * NCHW the samples' pixels are not one matrix, so one GEMM per sample
     * accumulates into dw (fp32) in sample order. */
    const size_t es = sf_dtype_size(dt), p = hw;
    for (int ni = 0; ni < n; ni++)
        SF_CUBLAS_CHECK(sf_cublas_gemm_sb(h, CUBLAS_OP_T, CUBLAS_OP_N, in, out, (int)p, 1.f,
                                          (const char *)x + es * ni * in * p, t, (int)p, 0,
                                          (const char *)dy + es * ni * out * p, t, (int)p, 0, ni ? 1.f : 0.f, dw,
                                          CUDA_R_32F, in, 0, 1, ct));
    return 0;
}

/* ---- linear layers with the bias inside the GEMM (cuBLASLt) ----------------- */

struct sf_linear_lt {
    cublasLtMatmulDesc_t md;
    cublasLtMatrixLayout_t a, b, c; /* c describes both C and D (beta = 0: C is never read) */
    cublasLtMatmulAlgo_t algo;
    size_t ws_bytes;
    uint32_t al_a, al_b, al_d; /* the operands' alignments the algorithm was chosen for (bytes) */
    int pick, of;              /* the candidate kept, of those timed (1: untimed) */
};

extern "C" void sf_linear_lt_destroy(sf_linear_lt *p)
{
    if (!p)
        return;
    if (p->md) cublasLtMatmulDescDestroy(p->md);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    free(p);
}

/* A cuBLASLt call made while planning: on failure the reason goes to why
 * (the caller falls back rather than failing) and the plan is dropped. */
#define LT_PLAN(call)                                                                                  \
    do {                                                                                               \
        const cublasStatus_t st_ = (call);                                                             \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                            \
            snprintf(why, why_len, "%s: %s", #call, cublasGetStatusString(st_));                       \
            sf_linear_lt_destroy(p);                                                                   \
            return -1;                                                                                 \
        }                                                                                              \
    } while (0)

static uint32_t lt_align(const void *ptr, int cap)
{
    uintptr_t a = (uintptr_t)ptr;
    uint32_t al = 1;
    while (al < (uint32_t)cap && !(a & al))
        al <<= 1;
    return al;
}

/* Milliseconds of one run of p with algorithm a on d's stand-ins: the best
 * of three after one untimed; a negative value where it failed. */
static float lt_time(const sf_linear_lt *p, cublasLtHandle_t lt, const sf_linear_lt_desc *d,
                     const cublasLtMatmulAlgo_t *a)
{
    const float one = 1.f, zero = 0.f;
    int bad = 0;
    auto run = [&] {
        bad |= cublasLtMatmul(lt, p->md, &one, d->w, p->a, d->tx, p->b, &zero, d->ty, p->c, d->ty, p->c, a, d->tws,
                              p->ws_bytes, d->ts) != CUBLAS_STATUS_SUCCESS;
    };
    run();
    const float ms = bad ? 0.f : sf_time_best3(d->ts, run);
    cudaGetLastError(); /* a failed candidate leaves nothing for the next call to report */
    return bad || ms <= 0.f ? -1.f : ms;
}

/* Keeps the fastest of cuBLASLt's n candidates for p (each valid for its
 * shape, types, alignments and workspace), timed on d's stand-ins. */
static void lt_pick(sf_linear_lt *p, cublasLtHandle_t lt, const sf_linear_lt_desc *d,
                    const cublasLtMatmulHeuristicResult_t *cand, int n)
{
    float best = -1.f;
    for (int k = 0; k < n; k++) {
        if (cand[k].state != CUBLAS_STATUS_SUCCESS)
            continue;
        const float ms = lt_time(p, lt, d, &cand[k].algo);
        if (ms >= 0.f && (best < 0.f || ms < best)) {
            best = ms;
            p->algo = cand[k].algo;
            p->pick = k;
        }
    }
    p->of = n;
}

extern "C" void sf_linear_lt_pick(const sf_linear_lt *p, int *pick, int *of)
{
    *pick = p ? p->pick : 0;
    *of = p ? p->of : 0;
}

extern "C" int sf_linear_lt_create(sf_linear_lt **out, cublasLtHandle_t lt, const sf_linear_lt_desc *d, char *why,
                                   size_t why_len)
{
    *out = NULL;
    cudaDataType_t t;
    cublasComputeType_t ct;
    if (sf_cublas_types(d->dt, d->tf32, "sf_linear_lt_create", &t, &ct)) {
        snprintf(why, why_len, "%s", sf_cuda_last_error());
        return -1;
    }
    if (d->rows < 1 || d->in < 1 || d->out < 1 || d->align_act < 1 || d->align_act > 256 ||
        (d->align_act & (d->align_act - 1)) || (d->b_bf16 && d->dt != SF_DT_BF16)) {
        snprintf(why, why_len, "shape %d x %d -> %d, activation alignment %d, bf16 bias %d", d->rows, d->in, d->out,
                 d->align_act, d->b_bf16);
        return -1;
    }
    sf_linear_lt *p = (sf_linear_lt *)calloc(1, sizeof *p);
    if (!p) {
        snprintf(why, why_len, "out of host memory");
        return -1;
    }
    p->ws_bytes = d->ws_bytes;
    const void *bias = d->dgrad ? NULL : d->b;
    const cublasOperation_t opn = CUBLAS_OP_N, opt = CUBLAS_OP_T;
    const cudaDataType_t bt = d->b_bf16 ? CUDA_R_16BF : CUDA_R_32F, dtype = t;
    const cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    LT_PLAN(cublasLtMatmulDescCreate(&p->md, ct, CUDA_R_32F));
    /* column-major, as the cuBLAS functions above: y^T [out, rows] =
     * (w [in, out])^T . x^T [in, rows]; dgrad: dx^T [in, rows] = w [in, out] . dy^T [out, rows] */
    LT_PLAN(cublasLtMatmulDescSetAttribute(p->md, CUBLASLT_MATMUL_DESC_TRANSA, d->dgrad ? &opn : &opt, sizeof opt));
    LT_PLAN(cublasLtMatmulDescSetAttribute(p->md, CUBLASLT_MATMUL_DESC_TRANSB, &opn, sizeof opn));
    LT_PLAN(cublasLtMatmulDescSetAttribute(p->md, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias) {
        LT_PLAN(cublasLtMatmulDescSetAttribute(p->md, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        const int32_t bt32 = (int32_t)bt; /* fp32 even beside bf16 outputs unless b_bf16 (default: D's type) */
        LT_PLAN(cublasLtMatmulDescSetAttribute(p->md, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt32, sizeof bt32));
    }
    const int k_in = d->dgrad ? d->out : d->in, m_out = d->dgrad ? d->in : d->out; /* B's rows, D's rows */
    LT_PLAN(cublasLtMatrixLayoutCreate(&p->a, t, (uint64_t)d->in, (uint64_t)d->out, d->in));
    LT_PLAN(cublasLtMatrixLayoutCreate(&p->b, t, (uint64_t)k_in, (uint64_t)d->rows, k_in));
    LT_PLAN(cublasLtMatrixLayoutCreate(&p->c, dtype, (uint64_t)m_out, (uint64_t)d->rows, m_out));
    cublasLtMatmulPreference_t pref = NULL;
    LT_PLAN(cublasLtMatmulPreferenceCreate(&pref));
    /* Alignments: the weight's (A) own, the activations' as the caller
     * guarantees them; cuBLASLt assumes 256 bytes for an operand it is told
     * nothing of. */
    const uint32_t aact = (uint32_t)d->align_act;
    const uint32_t aw = lt_align(d->w, 256), ad = aact;
    p->al_a = aw;
    p->al_b = aact;
    p->al_d = ad;
    const uint64_t wsb = d->ws_bytes;
    /* a bf16 output keeps "fp32 accumulation, one rounding": no split-K
     * partials summed in the output type */
    const uint32_t red = dtype == CUDA_R_16BF ? (uint32_t)(CUBLASLT_REDUCTION_SCHEME_NONE |
                                                           CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
                                              : (uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                                             sizeof wsb);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof aw);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &aact,
                                                  sizeof aact);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red,
                                                  sizeof red);
    enum { CANDIDATES = 8 };
    cublasLtMatmulHeuristicResult_t cand[CANDIDATES];
    const int want = d->tune > 1 && d->tx && d->ty && d->tws ? (d->tune < CANDIDATES ? d->tune : CANDIDATES) : 1;
    int found = 0;
    memset(cand, 0, sizeof cand);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(lt, p->md, p->a, p->b, p->c, p->c, pref, want, cand, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    const cublasLtMatmulHeuristicResult_t &res = cand[0];
    if (st != CUBLAS_STATUS_SUCCESS || found < 1 || res.state != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, why_len, "no cuBLASLt algorithm for %d x %d -> %d %s%s (%s)", d->rows, d->in, d->out,
                 d->dt == SF_DT_BF16 ? "bf16" : d->tf32 ? "tf32" : "fp32",
                 !bias ? "" : d->b_bf16 ? " +bf16 bias" : " +fp32 bias",
                 cublasGetStatusString(st != CUBLAS_STATUS_SUCCESS ? st : found < 1 ? CUBLAS_STATUS_NOT_SUPPORTED
                                                                                     : res.state));
        sf_linear_lt_destroy(p);
        return -1;
    }
    p->algo = res.algo;
    p->of = 1;
    if (found > 1)
        lt_pick(p, lt, d, cand, found);
    *out = p;
    return 0;
}

static int lt_run(const sf_linear_lt *p, cublasLtHandle_t lt, const void *A, const void *B, void *D, void *ws,
                  cudaStream_t s)
{
    const float one = 1.f, zero = 0.f;
    if (lt_align(A, 256) < p->al_a || lt_align(B, 256) < p->al_b || lt_align(D, 256) < p->al_d)
        return 1;
    SF_CUBLAS_CHECK(cublasLtMatmul(lt, p->md, &one, A, p->a, B, p->b, &zero, D, p->c, D, p->c, &p->algo, ws,
                                   p->ws_bytes, s));
    return 0;
}

extern "C" int sf_linear_lt_fwd(const sf_linear_lt *p, cublasLtHandle_t lt, const void *x, const void *w, void *y,
                                void *ws, cudaStream_t s)
{
    return lt_run(p, lt, w, x, y, ws, s);
}

extern "C" int sf_linear_lt_bwd_data(const sf_linear_lt *p, cublasLtHandle_t lt, const void *dy, const void *w,
                                     void *dx, void *ws, cudaStream_t s)
{
    return lt_run(p, lt, w, dy, dx, ws, s);
}
