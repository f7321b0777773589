/* gpu/cuda/mul.h — elementwise multiplication by a tensor of the same shape
 * or by one broadcast over H,W ([n, C, 1, 1]: squeeze-and-excitation), and by
 * a per-channel parameter (ConvNeXt's layer scale), forward and backward, in
 * either layout. Contract and element types: tensor.h; semantics:
 * gpu/ref/mul.c, checked by tests/gpu/ops/mul.cu.
 *
 * a, x, y and their gradients are [n, c, hw] maps in layout lay (a flat
 * [n, f] tensor is the map with c = f, hw = 1). A broadcast b is [n, c]: the
 * same bytes in either layout.
 */
#ifndef SF_GPU_CUDA_MUL_H
#define SF_GPU_CUDA_MUL_H

#include <stddef.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = a * b; bcast 0: b is a's shape, 1: b is [n, c] broadcast over hw.
 * y may alias a. */
int sf_cuda_mul_fwd_dt(sf_dtype dt, sf_layout lay, const void *a, const void *b, void *y, int n, int c, size_t hw,
                       int bcast, cudaStream_t s);
/* da = dy * b (broadcast as in the forward) when da is non-NULL; db = dy * a
 * when db is non-NULL, summed over hw when b is broadcast (in fp32, in a fixed
 * order: deterministic). Neither output may alias an input. */
int sf_cuda_mul_bwd_dt(sf_dtype dt, sf_layout lay, const void *a, const void *b, const void *dy, void *da, void *db,
                       int n, int c, size_t hw, int bcast, cudaStream_t s);

/* y = x * scale[c], or fmaf(x, scale[c], shift[c]) where shift is not NULL
 * (scale and shift fp32, [c]). y may alias x. A scale (and shift) of one
 * value for the whole tensor is c = 1 with hw the elements of a sample, in
 * either layout. */
int sf_cuda_channel_scale_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, const float *scale, const float *shift,
                                 void *y, int n, int c, size_t hw, cudaStream_t s);
/* Floats of scratch sf_cuda_channel_scale_bwd_dt needs for c channels (at
 * most sf_cuda_bias_grad_scratch(c), pointwise.h: the executor's scratch
 * holds it). */
size_t sf_cuda_channel_scale_scratch(int c);
/* dx = dy * scale[c] when dx is non-NULL; dscale[c] = sum over n and hw of
 * dy * x, and dshift[c] = the sum of dy where dshift is not NULL (fp32,
 * written, not accumulated; fixed-order two-pass reductions through scratch:
 * deterministic). dx may not alias x or dy. */
int sf_cuda_channel_scale_bwd_dt(sf_dtype dt, sf_layout lay, const void *x, const float *scale, const void *dy,
                                 void *dx, float *dscale, float *dshift, int n, int c, size_t hw, float *scratch,
                                 cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_MUL_H */
