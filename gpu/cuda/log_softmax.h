/* gpu/cuda/log_softmax.h — log_softmax over the features of each row of a
 * flat [rows, cols] tensor, forward and backward. Contract and element types:
 * tensor.h; semantics: gpu/ref/log_softmax.c (sf_ref_log_softmax_fwd/_bwd),
 * checked by tests/gpu/ops/log_softmax.cu. A warp a row: the row's maximum,
 * then the sum of exp(x - max) in fp32 (a classifier's row is short: its
 * classes), so no scratch.
 */
#ifndef SF_GPU_CUDA_LOG_SOFTMAX_H
#define SF_GPU_CUDA_LOG_SOFTMAX_H

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = x - log(sum(exp(x))) per row. y may alias x. */
int sf_cuda_log_softmax_fwd_dt(sf_dtype dt, const void *x, void *y, int rows, int cols, cudaStream_t s);
/* dx = dy - softmax(x) * sum(dy) per row, softmax recomputed from x. dx may
 * alias dy, not x. */
int sf_cuda_log_softmax_bwd_dt(sf_dtype dt, const void *x, const void *dy, void *dx, int rows, int cols,
                               cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_LOG_SOFTMAX_H */
