/* gpu/cuda/conv_gemm.h — pointwise convolutions (1x1, stride 1, padding 0,
 * dilation 1, one group) as cuBLAS GEMMs: the plan sf_conv_plan_build makes
 * for a direction of such a convolution when cuDNN offers no usable engine
 * for it (its heuristics list none, or every one they list fails to build).
 * sf_conv_gemm_build makes that plan without asking cuDNN first (the tests
 * of this path call it; the executor never does).
 * Callers see an ordinary sf_conv_plan: sf_conv_run, the variant packs and
 * the workspace are the same; only sf_conv_plan.gemm is set (and plan is
 * NULL). Semantics: sf_ref_conv2d_* (gpu/ref/ref.h), checked by
 * tests/gpu/ops/conv_gemm.cu.
 *
 * The products, with the weight w as the row-major [oc, c] matrix (KCRS and
 * KRSC are the same thing for k = 1) and hw = h * w:
 *   FWD         y[n] = w . x[n]                (NCHW: x[n] is [c, hw])
 *   BWD_DATA    dx[n] = w^T . dy[n]
 *   BWD_FILTER  dw = sum over n of dy[n] . x[n]^T
 * NHWC maps (and hw = 1) are one GEMM over n*hw rows in every direction.
 * NCHW maps are one strided-batched GEMM over the samples for FWD and
 * BWD_DATA. For BWD_FILTER the samples' pixels are not one strided matrix in
 * NCHW, so the per-sample products go into an fp32 workspace in one batched
 * GEMM and a kernel sums them in sample order; when the workspace limit does
 * not hold n products, one GEMM per sample accumulates (beta = 1) in sample
 * order, into dw for fp32 and into one fp32 product in the workspace for bf16
 * (then rounded once). Either way the order is fixed by the shape: no atomics,
 * equal inputs give equal bits (data-parallel ranks stay identical).
 *
 * Precision as tensor.h says and linear.h does: fp32 data in strict fp32
 * (CUBLAS_COMPUTE_32F) or TF32 (CUBLAS_COMPUTE_32F_FAST_TF32) as d->tf32
 * says; bf16 data with CUBLAS_COMPUTE_32F (tensor cores, fp32 accumulation,
 * reduced-precision split-K reductions disallowed), each output rounded once.
 * A fused forward (fuse_bias/fuse_relu, only through sf_conv_gemm_build) runs the
 * GEMM and then sf_cuda_bias_act_dt, which is what the executor does after a
 * plain plan: for bf16 the conv result is rounded to bf16 before the bias is
 * added, where cuDNN's fused graph adds it in fp32.
 *
 * cuBLAS handle: the caller's, lent through sf_conv_desc.blas (the executor
 * lends its own) with the workspace it keeps the handle bound to. A cuDNN
 * handle is never used by two threads at once (tensor.h), and neither is the
 * cuBLAS handle its caller lends with it. Each run binds the handle to the
 * cuDNN handle's current stream, to the run's part of the plan's workspace
 * and to CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION (linear.h's strict
 * mode, for every GEMM of the run), and afterwards back to the stream, the
 * lender's workspace and the math mode it had: host-side calls, no
 * allocation, no sync. So a run is capturable, follows the stream the caller
 * set on the cuDNN handle (the executor's side stream for a forked
 * backward-filter) without racing a concurrent run on another stream for a
 * workspace, and leaves the handle as the lender's other GEMMs expect it.
 */
#ifndef SF_GPU_CUDA_CONV_GEMM_H
#define SF_GPU_CUDA_CONV_GEMM_H

#include <stddef.h>

#include <cublas_v2.h>
#include <cudnn.h>

#include "gpu/cuda/conv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cuBLAS's part of a GEMM plan's workspace, at most (bytes). */
#define SF_CONV_GEMM_BLAS_WS ((size_t)4 << 20)

/* 1 when d is a pointwise convolution of a data type the GEMM path takes
 * (fp32 or bf16, any layout, any sizes that fit cuBLAS's int dimensions). */
int sf_conv_gemm_ok(const sf_conv_desc *d);

/* Builds the GEMM plan of (d, dir) into *out (zeroed first): out->gemm set,
 * out->plan NULL, engine -1, ws_bytes what the run needs (<= ws_limit),
 * tensor_core as the compute type does (TF32 or bf16), fused for a fused
 * forward. With tune non-NULL the plan is run on those buffers and timed
 * (out->ms; on the handle's stream, synchronously), else ms = -1. Build time
 * only. -1 (error set) when d is not pointwise, d->blas lends no cuBLAS
 * handle, the workspace limit does not hold the accumulator, or cuBLAS
 * fails. */
int sf_conv_gemm_build(cudnnHandle_t h, const sf_conv_desc *d, sf_conv_dir dir, size_t ws_limit,
                       const sf_conv_ptrs *tune, sf_conv_plan *out);

/* Releases what sf_conv_gemm_build made (not the lent cuBLAS handle);
 * sf_conv_plan_destroy calls it. */
void sf_conv_gemm_destroy(sf_conv_plan *p);

/* Enqueues the plan on h's current stream with the pointers of p (roles as
 * sf_conv_ptrs says; ws of at least the plan's ws_bytes, 256-byte aligned for
 * cuBLAS's part to be used). Capturable. */
int sf_conv_gemm_run(cudnnHandle_t h, const sf_conv_plan *plan, const sf_conv_ptrs *p);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_CONV_GEMM_H */
