/* gpu/cuda/pointwise.h — elementwise ops and the per-channel reductions that go
 * with them: bias + ReLU and its gradient, ReLU, the residual add, element type
 * casts and fills. Contract and element types: tensor.h; semantics: gpu/ref/ref.h,
 * checked by tests/gpu/ops/pointwise.cu.
 */
#ifndef SF_GPU_CUDA_POINTWISE_H
#define SF_GPU_CUDA_POINTWISE_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- pointwise ops and reductions ----------------------------------------- */
/* Tensors with a channel axis are viewed as [outer, c, inner]:
 * NCHW: outer = n, inner = h*w;  NHWC: outer = n*h*w, inner = 1;  [n, f]: outer = n, inner = 1. */

/* y = act(y + bias[c]) in place; bias may be NULL; relu 0/1. */
int sf_cuda_bias_act(float *y, const float *bias, size_t outer, int c, size_t inner, int relu,
                     cudaStream_t s);
/* y = max(x, 0) (NaN propagates, as torch.relu); x == y allowed. */
int sf_cuda_relu_fwd(const float *x, float *y, size_t len, cudaStream_t s);
/* dx = y > 0 ? dy : 0; dx == dy allowed. */
int sf_cuda_relu_bwd(const float *y, const float *dy, float *dx, size_t len, cudaStream_t s);

/* Floats of scratch sf_cuda_bias_grad needs for c channels. */
size_t sf_cuda_bias_grad_scratch(int c);
/* Backward of act(x + bias): when y (the forward output) is non-NULL, first
 * dy = y > 0 ? dy : 0 in place (relu backward); then, when db is non-NULL,
 * db[c] = sum over outer and inner of dy. Deterministic (fixed-order two-pass
 * reduction through scratch). */
int sf_cuda_bias_grad(float *dy, const float *y, size_t outer, int c, size_t inner, float *db,
                      float *scratch, cudaStream_t s);

/* ---- residual add ------------------------------------------------------------ */
/* y = a + b, or max(a + b, 0) with relu (its backward is sf_cuda_relu_bwd on y).
 * y may alias a or b. Also sums two gradient branches. */
int sf_cuda_add(const float *a, const float *b, float *y, size_t len, int relu, cudaStream_t s);

/* The launchers above on activations of element type dt (tensor.h). */
int sf_cuda_relu_fwd_dt(sf_dtype dt, const void *x, void *y, size_t len, cudaStream_t s);
int sf_cuda_relu_bwd_dt(sf_dtype dt, const void *y, const void *dy, void *dx, size_t len, cudaStream_t s);
/* The gradient of a tensor read by two layers, handed to both: d0 = d1 =
 * (y > 0 ? dy : 0) with y (a fused ReLU's output), else dy; d1 may be NULL
 * (d0 alone). One pass where a ReLU backward and two copies took three (a
 * residual add's backward). d0 may alias dy; d1 aliases neither. */
int sf_cuda_grad_fork_dt(sf_dtype dt, const void *y, const void *dy, void *d0, void *d1, size_t len, cudaStream_t s);
/* As sf_cuda_bias_act / sf_cuda_bias_grad (above); bias, db, scratch fp32. */
int sf_cuda_bias_act_dt(sf_dtype dt, void *y, const float *bias, size_t outer, int c, size_t inner, int relu,
                        cudaStream_t s);
int sf_cuda_bias_grad_dt(sf_dtype dt, void *dy, const void *y, size_t outer, int c, size_t inner, float *db,
                         float *scratch, cudaStream_t s);
int sf_cuda_add_dt(sf_dtype dt, const void *a, const void *b, void *y, size_t len, int relu, cudaStream_t s);

/* Fills with uniform values in [-scale, scale) keyed by seed (for timing on
 * real-looking data), or with one value (NaN poisoning in tests). */
int sf_cuda_fill_random(float *p, size_t len, uint64_t seed, float scale, cudaStream_t s);
int sf_cuda_fill(float *p, size_t len, float v, cudaStream_t s);
/* dst[i] = (dt)src[i] for i < len (bf16 <-> fp32, or a copy when st == dt). */
int sf_cuda_cast(const void *src, sf_dtype st, void *dst, sf_dtype dt, size_t len, cudaStream_t s);
/* Uniform values in [-scale, scale) keyed by seed, as sf_cuda_fill_random, in dt. */
int sf_cuda_fill_random_dt(sf_dtype dt, void *p, size_t len, uint64_t seed, float scale, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_POINTWISE_H */
