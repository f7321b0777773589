/* gpu/cuda/concat.h — concatenation along channels (torch.cat(dim=1)) of
 * maps of equal H,W, and the backward's slicing, in either layout. Contract
 * and element types: tensor.h; semantics: gpu/ref/concat.c
 * (sf_ref_concat_put, sf_ref_concat_take), checked by
 * tests/gpu/ops/concat.cu.
 *
 * The concatenation y has ctot channels; input j is the channels
 * [c0, c0 + cj) of it. A flat [n, f] tensor is the map with hw = 1.
 */
#ifndef SF_GPU_CUDA_CONCAT_H
#define SF_GPU_CUDA_CONCAT_H

#include <stddef.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[:, c0 + c, :] = x[:, c, :] for c < cj: one input's part of the
 * concatenation. */
int sf_cuda_concat_put_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int cj, size_t hw, int ctot, int c0,
                          void *y, cudaStream_t s);
/* The inverse: dx[:, c, :] = dy[:, c0 + c, :] for c < cj. */
int sf_cuda_concat_take_dt(sf_dtype dt, sf_layout lay, const void *dy, int n, int cj, size_t hw, int ctot, int c0,
                           void *dx, cudaStream_t s);
/* The inverse through a ReLU whose output the concatenation y holds:
 * dx[:, c, :] = y[:, c0 + c, :] > 0 ? dy[:, c0 + c, :] : 0 (a NaN in y gives
 * 0, as torch's threshold_backward). The executor takes this for an input
 * made by a layer with a fused ReLU that nothing else reads, whose own
 * output then need not live until its backward. */
int sf_cuda_concat_take_masked_dt(sf_dtype dt, sf_layout lay, const void *dy, const void *y, int n, int cj,
                                  size_t hw, int ctot, int c0, void *dx, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_CONCAT_H */
