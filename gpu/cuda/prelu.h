/* gpu/cuda/prelu.h — PReLU (nn.PReLU, F.prelu): x where x > 0, else a * x,
 * with one fp32 slope shared by every channel (np = 1) or one per channel
 * (np = c), on fp32 or bf16 activations in NCHW or NHWC (flat features: an
 * [n, c, 1] map, the same in either), math in fp32; the backward's input
 * gradient and the slopes' gradient, a fixed-order two-pass reduction
 * through the caller's scratch (no atomics: deterministic). Contract and
 * element types: tensor.h; semantics: gpu/ref/prelu.c (sf_ref_prelu_fwd,
 * sf_ref_prelu_bwd), checked by tests/gpu/ops/prelu.cu.
 */
#ifndef SF_GPU_CUDA_PRELU_H
#define SF_GPU_CUDA_PRELU_H

#include <stddef.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = x > 0 ? x : w[np == 1 ? 0 : channel] * x over an [n, c, hw] map in
 * layout lay (w fp32, [np], np 1 or c). A NaN stays NaN. y may alias x. */
int sf_cuda_prelu_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, const float *w, int np, void *y, int n, int c,
                         size_t hw, cudaStream_t s);
/* Floats of scratch sf_cuda_prelu_bwd_dt needs for c channels, either np
 * (the executor's compute-stream scratch holds it: sf_exec_scratch_need). */
size_t sf_cuda_prelu_scratch(int c);
/* PyTorch's prelu_backward: dx = x > 0 ? dy : a * dy when dx is non-NULL
 * (0, -0 and a NaN take a * dy); dw[j] = sum over n and hw of
 * (x > 0 ? 0 : x * dy), per channel or over all of them when np == 1 (fp32,
 * written, not accumulated). dx may alias dy, not x. */
int sf_cuda_prelu_bwd_dt(sf_dtype dt, sf_layout lay, const void *x, const float *w, int np, const void *dy, void *dx,
                         float *dw, int n, int c, size_t hw, float *scratch, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_PRELU_H */
