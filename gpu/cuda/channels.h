/* gpu/cuda/channels.h — channel moves of a map, in either layout: ShuffleNet's
 * channel shuffle, the slice of a channel range with its backward, and the
 * pixel shuffle between channels and space.
 * Contract and element types: tensor.h; semantics: gpu/ref/channels.c
 * (sf_ref_channel_shuffle, sf_ref_channel_slice_fwd/_bwd,
 * sf_ref_pixel_shuffle), checked by
 * tests/gpu/ops/channels.cu. The maps are [n, c, hw] (NCHW) or [n, hw, c]
 * (NHWC); no scratch, no reduction.
 */
#ifndef SF_GPU_CUDA_CHANNELS_H
#define SF_GPU_CUDA_CHANNELS_H

#include <stddef.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y channel j * groups + i = x channel i * (c / groups) + j (groups divides
 * c). The backward is the same launcher on dy with groups c / groups. */
int sf_cuda_channel_shuffle_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, size_t hw, int groups,
                               void *y, cudaStream_t s);
/* y ([n, count, hw]) = x's channels [start, start + count) (x has c). */
int sf_cuda_channel_slice_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, size_t hw, int start,
                                 int count, void *y, cudaStream_t s);
/* All of dx ([n, c, hw]): dy in the channels [start, start + count), 0 in
 * the others, so that dx may be the input's whole gradient (its first
 * reader's) or the scratch the executor adds into it. */
int sf_cuda_channel_slice_bwd_dt(sf_dtype dt, sf_layout lay, const void *dy, int n, int c, size_t hw, int start,
                                 int count, void *dx, cudaStream_t s);

/* PyTorch's pixel_shuffle (inverse 0) of x, [n, c * r * r, h, w], into y,
 * [n, c, h * r, w * r]; inverse 1: pixel_unshuffle, x the large map and y
 * the small. Each is the other's backward. */
int sf_cuda_pixel_shuffle_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, int h, int w, int r,
                             int inverse, void *y, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_CHANNELS_H */
