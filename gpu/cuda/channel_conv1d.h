/* gpu/cuda/channel_conv1d.h — ECA's one-channel 1-D convolution across each
 * sample's c values (a pooled [c,1,1] map or [c] features: the same row of c
 * in NCHW and NHWC), on fp32 or bf16 activations with fp32 parameters, math
 * in fp32; the backward's input gradient and the parameters' gradient, a
 * fixed-order two-pass reduction through the caller's scratch (no atomics:
 * deterministic). Contract and element types: tensor.h; semantics:
 * gpu/ref/channel_conv1d.c, checked by tests/gpu/ops/channel_conv1d.cu.
 */
#ifndef SF_GPU_CUDA_CHANNEL_CONV1D_H
#define SF_GPU_CUDA_CHANNEL_CONV1D_H

#include <stddef.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[n][i] = (b ? b[0] : 0) + sum over j < k of w[j] * x[n][i + j - pad], x
 * zero outside [0, c); k = 2 * pad + 1. y may not alias x. */
int sf_cuda_channel_conv1d_fwd_dt(sf_dtype dt, const void *x, const float *w, const float *b, int k, int pad,
                                  void *y, int n, int c, cudaStream_t s);
/* Floats of scratch sf_cuda_channel_conv1d_bwd_dt needs for a kernel of k
 * (the executor's compute-stream scratch holds it: sf_exec_scratch_need). */
size_t sf_cuda_channel_conv1d_scratch(int k);
/* dx[n][i] = sum over j of w[j] * dy[n][i - j + pad] when dx is non-NULL;
 * dw[j] = sum over n and i of dy[n][i] * x[n][i + j - pad] and, when db is
 * non-NULL, db[0] = the sum of dy (fp32, written, not accumulated). dx may
 * alias neither x nor dy. */
int sf_cuda_channel_conv1d_bwd_dt(sf_dtype dt, const void *x, const float *w, int k, int pad, const void *dy,
                                  void *dx, float *dw, float *db, int n, int c, float *scratch, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_CHANNEL_CONV1D_H */
