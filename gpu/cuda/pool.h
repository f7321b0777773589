/* gpu/cuda/pool.h — MaxPool2d (with its argmax), global average pooling,
 * AvgPool2d and AdaptiveAvgPool2d, forward and backward. Contract: tensor.h;
 * semantics: sf_ref_maxpool2d_*, sf_ref_avgpool_*, sf_ref_avgpool2d_* and
 * sf_ref_adaptive_avgpool2d_* (gpu/ref/layers.h), checked by
 * tests/gpu/ops/pool.cu.
 */
#ifndef SF_GPU_CUDA_POOL_H
#define SF_GPU_CUDA_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- MaxPool2d --------------------------------------------------------------- */
/* oh = (h + 2*pad - k)/stride + 1. argmax [n, c, oh, ow] (NCHW) or [n, oh, ow, c]
 * (NHWC) holds the flat index y*w + x of the chosen input in its plane (first
 * maximum in row-major window order; padding never wins; NaN wins and
 * propagates, as PyTorch). The backward is a gather: each dx element sums, in
 * row-major order, the dy of the windows that chose it, so it writes every
 * element, needs no zeroing and no atomics. Requires pad <= k/2 (PyTorch's
 * own limit), so every window holds at least one input. */
int sf_cuda_maxpool_fwd(const float *x, int n, int c, int h, int w, int k, int stride, int pad,
                        sf_layout lay, float *y, int32_t *argmax, cudaStream_t s);
int sf_cuda_maxpool_bwd(const float *dy, const int32_t *argmax, int n, int c, int h, int w, int k,
                        int stride, int pad, sf_layout lay, float *dx, cudaStream_t s);

/* ---- global average pooling -------------------------------------------------- */
/* [n, c, h, w] (layout lay) -> [n, c]; the backward spreads dy/(h*w). */
int sf_cuda_avgpool_fwd(const float *x, int n, int c, int h, int w, sf_layout lay, float *y, cudaStream_t s);
int sf_cuda_avgpool_bwd(const float *dy, int n, int c, int h, int w, sf_layout lay, float *dx,
                        cudaStream_t s);
/* A training batchnorm + ReLU in front of the pool, applied to each tap as
 * its apply pass would (gpu/cuda/batchnorm.h; the values rounded to dt as
 * stored), so the pool reads the batchnorm's input and the batchnorm's output
 * is never written: its saved statistics and its parameters, [c] each. */
typedef struct sf_pool_pre_bn {
    const float *mean, *invstd, *gamma, *beta;
} sf_pool_pre_bn;
/* Whether sf_cuda_maxpool_fwd_dt takes a pre-batchnorm: bf16 NHWC, c % 8 == 0,
 * 3x3 stride 2 pad 1 (ResNet's stem), 16-byte aligned tensors. */
int sf_cuda_maxpool_pre_bn_ok(sf_dtype dt, sf_layout lay, int c, int k, int stride, int pad);
/* pre: NULL, or the batchnorm + ReLU that x goes through first (above; only
 * where ceil_mode gives the floor size). ceil_mode: the output size is
 * PyTorch's with ceil_mode=True (rounded up, the last window starting inside
 * the input or its left padding, clipped to the input). */
int sf_cuda_maxpool_fwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, int k, int stride, int pad,
                           int ceil_mode, sf_layout lay, void *y, int32_t *argmax, const sf_pool_pre_bn *pre,
                           cudaStream_t s);
int sf_cuda_maxpool_bwd_dt(sf_dtype dt, const void *dy, const int32_t *argmax, int n, int c, int h, int w, int k,
                           int stride, int pad, int ceil_mode, sf_layout lay, void *dx, cudaStream_t s);
int sf_cuda_avgpool_fwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay, void *y,
                           cudaStream_t s);
int sf_cuda_avgpool_bwd_dt(sf_dtype dt, const void *dy, int n, int c, int h, int w, sf_layout lay, void *dx,
                           cudaStream_t s);
/* dx += the global average pooling's backward of dy, in one pass: the
 * executor's form where another reader's backward has written dx already. */
int sf_cuda_avgpool_bwd_add_dt(sf_dtype dt, const void *dy, int n, int c, int h, int w, sf_layout lay, void *dx,
                               cudaStream_t s);

/* ---- AvgPool2d ------------------------------------------------------------------- */
/* Semantics: sf_ref_avgpool2d_* (gpu/ref/layers.h): output size as MaxPool2d's
 * above (ceil_mode), the window of output o is [o*s - p, min(o*s - p + k, h + p)),
 * its divisor that span's area with count_include_pad, else the taps inside
 * the input. Requires pad <= k/2. The backward is a gather (each dx element
 * sums dy/divisor over the windows holding it): it writes every element. */
int sf_cuda_avgpool2d_fwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, int k, int stride, int pad,
                             int ceil_mode, int count_include_pad, sf_layout lay, void *y, cudaStream_t s);
int sf_cuda_avgpool2d_bwd_dt(sf_dtype dt, const void *dy, int n, int c, int h, int w, int k, int stride, int pad,
                             int ceil_mode, int count_include_pad, sf_layout lay, void *dx, cudaStream_t s);

/* ---- AdaptiveAvgPool2d((oh, ow)) ----------------------------------------------------- */
/* [n, c, h, w] -> [n, c, oh, ow] (layout lay), the mean of PyTorch's bins
 * [floor(o*h/oh), ceil((o+1)*h/oh)) (sf_ref_adaptive_avgpool2d_*); the
 * backward is a gather and writes every element. */
int sf_cuda_adaptive_avgpool_fwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, int oh, int ow,
                                    sf_layout lay, void *y, cudaStream_t s);
int sf_cuda_adaptive_avgpool_bwd_dt(sf_dtype dt, const void *dy, int n, int c, int h, int w, int oh, int ow,
                                    sf_layout lay, void *dx, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_POOL_H */
