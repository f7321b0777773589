/* gpu/cuda/layout.h — moving tensors between layouts: the batched transpose
 * (NCHW <-> NHWC activations, KCRS <-> KRSC filters). Contract: tensor.h;
 * checked by tests/gpu/ops/layout.cu.
 */
#ifndef SF_GPU_CUDA_LAYOUT_H
#define SF_GPU_CUDA_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst[b][c][r] = src[b][r][c] for b < batch, r < rows, c < cols (a batched
 * transpose: NHWC <-> NCHW activations, KCRS <-> KRSC filters). */
int sf_cuda_transpose(const float *src, float *dst, int batch, int rows, int cols, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_LAYOUT_H */
