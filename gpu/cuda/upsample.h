/* gpu/cuda/upsample.h — upsampling (or resizing) of a map, nearest or
 * bilinear by PyTorch's rules (gpu/upsample_rule.h), in either layout, forward and
 * backward. Contract and element types: tensor.h; semantics: gpu/ref/upsample.c
 * (sf_ref_upsample_fwd/_bwd), checked by tests/gpu/ops/upsample.cu. A thread
 * an output element forward; backward a thread an input element, which
 * gathers the outputs that read it (gpu/upsample_rule.h's sf_up_readers) in a
 * fixed order: no atomics, the same sums every run.
 */
#ifndef SF_GPU_CUDA_UPSAMPLE_H
#define SF_GPU_CUDA_UPSAMPLE_H

#include "gpu/cuda/tensor.h"
#include "gpu/upsample_rule.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y [n, c, p->h.out, p->w.out] from x [n, c, p->h.in, p->w.in]. */
int sf_cuda_upsample_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, const sf_up_rule *p, void *y,
                            cudaStream_t st);
/* dx [n, c, h.in, w.in]: each input pixel's weighted share of dy [n, c, h.out, w.out]. */
int sf_cuda_upsample_bwd_dt(sf_dtype dt, sf_layout lay, const void *dy, int n, int c, const sf_up_rule *p, void *dx,
                            cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_UPSAMPLE_H */
