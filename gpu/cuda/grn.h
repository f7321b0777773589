/* gpu/cuda/grn.h — Global Response Normalization (ConvNeXt V2's GRN) of a
 * [c, hw] map per sample, in either layout, on fp32 or bf16 activations with
 * fp32 parameters, math in fp32: each channel's L2 norm over its positions,
 * their mean per sample, the scaled and shifted product, and the backward
 * through all of it. Every sum is a fixed-order reduction (no atomics), so a
 * replay is bit-equal. Contract and element types: tensor.h; semantics:
 * gpu/ref/grn.c (sf_ref_grn_fwd/_bwd), checked by tests/gpu/ops/grn.cu.
 */
#ifndef SF_GPU_CUDA_GRN_H
#define SF_GPU_CUDA_GRN_H

#include <stddef.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Floats the forward saves for the backward: the norms [n * c], then each
 * sample's divisor (the norms' mean plus eps) [n]. */
size_t sf_cuda_grn_save_floats(int n, int c);
/* Scratch bytes of sf_cuda_grn_bwd_dt: three [n * c] fp32 arrays. */
size_t sf_cuda_grn_scratch_bytes(int n, int c);

/* y = x * (1 + w[c] * g[n][c] / d[n]) + b[c] with g the L2 norm of channel c
 * over the hw positions and d[n] the mean of g[n][.] plus eps; g and d into
 * save (sf_cuda_grn_save_floats). y may not alias x. */
int sf_cuda_grn_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, size_t hw, const float *w,
                       const float *b, float eps, void *y, float *save, cudaStream_t s);
/* From the forward's save: dx (NULL: not wanted) = dy * (1 + w g / d) +
 * k[n][c] * x with k = (w sum(dy x) / d - sum_c(w sum(dy x) g) / (c d^2)) / g
 * (0 where g is 0); dw[c] = sum over n of sum(dy x) g / d and db[c] = the sum
 * of dy (fp32, written; both NULL: none). scratch: sf_cuda_grn_scratch_bytes. */
int sf_cuda_grn_bwd_dt(sf_dtype dt, sf_layout lay, const void *x, const void *dy, int n, int c, size_t hw,
                       const float *w, const float *save, void *dx, float *dw, float *db, void *scratch,
                       cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_GRN_H */
