/* gpu/cuda/linear.cu — linear layers as cuBLAS GEMMs on row-major tensors.
 * Contracts in linear.h. */
#include "linear.h"

#include "kernel_common.cuh"

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
