/* gpu/cuda/upsample.h — nearest-neighbour upsampling of a map by an integer
 * factor, in either layout, forward and backward. Contract and element types:
 * tensor.h; semantics: gpu/ref/upsample.c (sf_ref_upsample_fwd/_bwd), checked
 * by tests/gpu/ops/upsample.cu. A thread an output element forward, a thread
 * an input element backward (its s x s sum in a fixed order: no atomics).
 */
#ifndef SF_GPU_CUDA_UPSAMPLE_H
#define SF_GPU_CUDA_UPSAMPLE_H

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y [n, c, h*s, w*s] = x [n, c, h, w] with each pixel repeated s x s. */
int sf_cuda_upsample_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, int h, int w, int s, void *y,
                            cudaStream_t st);
/* dx [n, c, h, w] = the sum of dy [n, c, h*s, w*s] over each pixel's block. */
int sf_cuda_upsample_bwd_dt(sf_dtype dt, sf_layout lay, const void *dy, int n, int c, int h, int w, int s, void *dx,
                            cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_UPSAMPLE_H */
