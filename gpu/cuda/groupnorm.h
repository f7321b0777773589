/* gpu/cuda/groupnorm.h — GroupNorm (nn.GroupNorm, with or without its weight
 * and bias; nn.InstanceNorm2d is a group per channel) over a [C,H,W] map or
 * flat features, in either layout, forward and backward. Contract and
 * element types: tensor.h; semantics: gpu/ref/groupnorm.c
 * (sf_ref_groupnorm_fwd/_bwd), checked by tests/gpu/ops/groupnorm.cu. A
 * block per (sample, group) for the statistics, the output and the input
 * gradient; the parameter gradients a two-pass reduction over chunks of each
 * sample's positions through scratch, in a fixed order (no atomics), so a
 * replay is bit-equal. Sums in double, the rest in fp32.
 */
#ifndef SF_GPU_CUDA_GROUPNORM_H
#define SF_GPU_CUDA_GROUPNORM_H

#include <stddef.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x, y [n, c, hw] in layout lay (hw = 1: flat features, the same in either).
 * Each sample's g groups of c / g channels: y = (x - mean) * rstd * gamma[c] +
 * beta[c], the biased variance, rstd = 1/sqrt(var + eps); mean and rstd
 * ([n * g] fp32, sample-major) saved for the backward. gamma, beta fp32 [c];
 * beta NULL: no shift (a bias-free norm, timm's GroupNorm1NoBias); both NULL:
 * y = (x - mean) * rstd (affine=False). */
int sf_cuda_groupnorm_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, size_t hw, int g,
                             const float *gamma, const float *beta, float eps, void *y, float *mean, float *rstd,
                             cudaStream_t s);
/* Scratch bytes of sf_cuda_groupnorm_bwd_dt's parameter gradients for this
 * shape, in either layout (0 for n = 0; never less for a larger n, so the
 * size at the largest batch serves every batch). */
size_t sf_cuda_groupnorm_scratch_bytes(int n, int c, size_t hw);

/* dx = rstd * (u - mean(u) - xhat * mean(u * xhat)) over each group with u =
 * dy * gamma[c] (dy where gamma is NULL; dx NULL: not wanted); dgamma[c] =
 * sum dy * xhat and dbeta[c] = sum dy over the samples and positions,
 * written in fp32 through scratch (sf_cuda_groupnorm_scratch_bytes); dbeta
 * NULL: a bias-free norm's weight gradient alone; both NULL: no parameter
 * gradients, and scratch unused. */
int sf_cuda_groupnorm_bwd_dt(sf_dtype dt, sf_layout lay, const void *x, const void *dy, int n, int c, size_t hw,
                             int g, const float *gamma, const float *mean, const float *rstd, void *dx, float *dgamma,
                             float *dbeta, void *scratch, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_GROUPNORM_H */
