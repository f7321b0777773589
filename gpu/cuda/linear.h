/* gpu/cuda/linear.h — fully connected layers through cuBLAS (forward,
 * backward-data, backward-filter) in fp32, TF32 or bf16, and through cuBLASLt
 * with the bias and its gradient inside the GEMMs. Contract: tensor.h;
 * semantics: sf_ref_linear_* (gpu/ref/ref.h), checked by tests/gpu/ops/linear.cu.
 */
#ifndef SF_GPU_CUDA_LINEAR_H
#define SF_GPU_CUDA_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include <cublasLt.h>
#include <cublas_v2.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Operand type and compute type of a cuBLAS GEMM on elements of type dt, as
 * every GEMM of the CUDA backend chooses them (fp32: CUBLAS_COMPUTE_32F, or
 * CUBLAS_COMPUTE_32F_FAST_TF32 with tf32; bf16: CUDA_R_16BF operands with
 * CUBLAS_COMPUTE_32F); -1 with the error set (naming fn) for another dt. */
int sf_cublas_types(sf_dtype dt, int tf32, const char *fn, cudaDataType_t *ab, cublasComputeType_t *ct);

/* A cuBLAS handle and the workspace its owner keeps it bound to between calls
 * (cublasSetWorkspace; the owner binds its stream too). Code that runs on a
 * lent handle with another stream and workspace for a call (conv_gemm.h)
 * takes this rather than the bare handle, so that it can bind the handle
 * back afterwards: cublasSetStream resets the workspace, and cuBLAS has no
 * call that reads it. */
typedef struct sf_cublas_ctx {
    cublasHandle_t h;
    void *ws;
    size_t ws_bytes;
} sf_cublas_ctx;

/* ---- the math mode of bf16 GEMMs ------------------------------------------- */
/* A cuBLAS GEMM on bf16 operands runs with
 * CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION added to the handle's math
 * mode: without it a split-K GEMM may sum its partial products in the output
 * type (bf16), which is not "fp32 accumulation, one rounding".
 * sf_cublas_strict_begin adds the flag and keeps the mode it found in *saved;
 * sf_cublas_strict_end sets that mode again. Host-side handle state only: no
 * allocation, capturable. */
cublasStatus_t sf_cublas_strict_begin(cublasHandle_t h, cublasMath_t *saved);
cublasStatus_t sf_cublas_strict_end(cublasHandle_t h, cublasMath_t saved);

/* cublasGemmStridedBatchedEx, C = alpha op(A) op(B) + beta C (column-major),
 * with the handle's math mode for fp32 operands and between
 * sf_cublas_strict_begin and sf_cublas_strict_end for bf16 ones
 * (at == CUDA_R_16BF); CUBLAS_GEMM_DEFAULT. */
cublasStatus_t sf_cublas_gemm_sb(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                 float alpha, const void *A, cudaDataType_t at, int lda, long long sa, const void *B,
                                 cudaDataType_t bt, int ldb, long long sb, float beta, void *C, cudaDataType_t ctype,
                                 int ldc, long long sc, int batch, cublasComputeType_t ct);

/* ---- linear layers (cuBLAS) ------------------------------------------------ */
/* Row-major x [n, in], w [out, in], y [n, out]; outputs overwritten.
 * tf32: CUBLAS_COMPUTE_32F_FAST_TF32, else CUBLAS_COMPUTE_32F. The handle needs a
 * workspace (cublasSetWorkspace) to be capturable; nothing here allocates. */
int sf_linear_fwd(cublasHandle_t h, const float *x, int n, int in, const float *w, int out,
                  float *y, int tf32);                      /* y = x w^T (bias separately) */
int sf_linear_bwd_data(cublasHandle_t h, const float *dy, int n, int in, const float *w, int out,
                       float *dx, int tf32);                /* dx = dy w */
int sf_linear_bwd_filter(cublasHandle_t h, const float *x, int n, int in, const float *dy, int out,
                         float *dw, int tf32);              /* dw = dy^T x */
/* The same with x, w, y, dy, dx of element type dt (bf16: cublasGemmEx with
 * CUDA_R_16BF operands and CUBLAS_COMPUTE_32F, i.e. tensor cores, fp32
 * accumulation, each output rounded once: the call adds
 * CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION to the handle's math mode
 * and restores the mode after); dw is always fp32 (the master
 * gradient: CUDA_R_32F output from bf16 operands); tf32 only matters for
 * SF_DT_F32, where these are exactly the float functions above (which call
 * them). -1 for an unknown dt. */
int sf_linear_fwd_dt(cublasHandle_t h, sf_dtype dt, const void *x, int n, int in, const void *w, int out,
                     void *y, int tf32);
int sf_linear_bwd_data_dt(cublasHandle_t h, sf_dtype dt, const void *dy, int n, int in, const void *w, int out,
                          void *dx, int tf32);
int sf_linear_bwd_filter_dt(cublasHandle_t h, sf_dtype dt, const void *x, int n, int in, const void *dy, int out,
                            float *dw, int tf32);

/* ---- linear layers with the bias inside the GEMM (cuBLASLt) ---------------- */
/* The forward y = x w^T + b as one cublasLtMatmul with CUBLASLT_EPILOGUE_BIAS.
 * Row-major as above; the same operand and compute types as the cuBLAS
 * functions (sf_cublas_types), the bias fp32 whatever dt is (a bf16 forward
 * may instead read a bf16 bias, b_bf16, as autocast's linear does). Without a
 * bias (b NULL) the GEMM has the default epilogue. A bf16 forward excludes
 * the reduction schemes that sum split-K partials in the output type (the Lt
 * form of CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION).
 *
 * The weight gradient stays a cuBLAS GEMM beside the bias-gradient kernel:
 * on the H200, vit_b_16 bf16 batch 256 trained about 1 % slower per step with
 * the weight gradient and bias gradient as one cublasLtMatmul (epilogue
 * BGRADB) than with the two apart
 * (bench/results/2026-11-29-h200-depthwise-and-cublaslt.md).
 *
 * A plan holds the descriptors and the algorithm that
 * cublasLtMatmulAlgoGetHeuristic picked for one shape and direction, once:
 * running it is one capturable cublasLtMatmul that allocates nothing. The
 * bias pointer is bound at creation, because the heuristic takes its
 * alignment from it; the weight and activation pointers are passed per
 * call, and a call with a pointer less aligned than the plan assumed (the
 * weight's at creation, align_act for the activations) returns 1 without
 * running, so that the caller takes the cuBLAS path. */

typedef struct sf_linear_lt_desc {
    sf_dtype dt;
    int tf32;         /* fp32: TF32 tensor cores */
    int rows, in, out; /* x [rows, in], w [out, in], y [rows, out] */
    const void *b;    /* the bias [out], fp32 or (b_bf16) bf16 (NULL: none) */
    int b_bf16;       /* with dt bf16: b holds bf16 values */
    const void *w;    /* the weight the calls pass (its alignment is planned for) */
    int align_act;    /* bytes every activation pointer (x, y) is aligned to, 1..256 */
    size_t ws_bytes;  /* the workspace each call passes */
    int dgrad;        /* 1: the backward-data GEMM dx [rows, in] = dy [rows, out] w instead (b unused) */
    /* Timing: with tune > 1 and the stand-ins below, up to tune (at most 8)
     * of cuBLASLt's candidate algorithms run on them and the fastest is kept
     * (its first candidate is up to a quarter slower on some of ViT-B's
     * shapes); else its first candidate, untimed. */
    int tune;
    const void *tx;   /* the GEMM's input, [rows, in] (dgrad: [rows, out]) */
    void *ty;         /* its output, [rows, out] (dgrad: [rows, in]) */
    void *tws;        /* a workspace of ws_bytes */
    cudaStream_t ts;
} sf_linear_lt_desc;

typedef struct sf_linear_lt sf_linear_lt;

/* Plans the forward of d: 0, or -1 with the reason in why (cuBLASLt has no
 * algorithm for the shape, types and epilogue; a call failed) and nothing
 * kept. No device work. */
int sf_linear_lt_create(sf_linear_lt **out, cublasLtHandle_t lt, const sf_linear_lt_desc *d, char *why,
                        size_t why_len);
void sf_linear_lt_destroy(sf_linear_lt *p);
/* y = x w^T (+ b) on stream s with workspace ws (the plan's ws_bytes): 0,
 * 1 (a pointer below the planned alignment: nothing ran), -1 (error set). */
int sf_linear_lt_fwd(const sf_linear_lt *p, cublasLtHandle_t lt, const void *x, const void *w, void *y, void *ws,
                     cudaStream_t s);
/* dx = dy w for a plan made with dgrad; returns as sf_linear_lt_fwd. */
int sf_linear_lt_bwd_data(const sf_linear_lt *p, cublasLtHandle_t lt, const void *dy, const void *w, void *dx,
                          void *ws, cudaStream_t s);
/* Which of cuBLASLt's candidates the plan runs (0: its first) and of how many it timed. */
void sf_linear_lt_pick(const sf_linear_lt *p, int *pick, int *of);

/* ---- per pixel over a map's channels (linear "over": "channels") ------------ */
/* x [n, in, hw], y and dy [n, out, hw] in layout lay (hw = 1: flat tensors,
 * the functions above); w [out, in], dw fp32 [out, in], as above. NHWC maps
 * are one GEMM over n*hw rows; NCHW maps one strided-batched GEMM per
 * direction over the samples, and for the weight gradient one GEMM per sample
 * accumulating into dw (beta = 1 after the first). */
int sf_linear_map_fwd_dt(cublasHandle_t h, sf_dtype dt, sf_layout lay, const void *x, int n, size_t hw, int in,
                         const void *w, int out, void *y, int tf32);
int sf_linear_map_bwd_data_dt(cublasHandle_t h, sf_dtype dt, sf_layout lay, const void *dy, int n, size_t hw, int in,
                              const void *w, int out, void *dx, int tf32);
int sf_linear_map_bwd_filter_dt(cublasHandle_t h, sf_dtype dt, sf_layout lay, const void *x, int n, size_t hw,
                                int in, const void *dy, int out, float *dw, int tf32);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_LINEAR_H */
