/* gpu/cuda/norm.h — LayerNorm over the channels of each position: a [C,H,W]
 * map's channels per pixel (torchvision's LayerNorm2d, in NCHW or NHWC) and
 * a flat tensor's features (nn.LayerNorm(F), hw = 1), forward and backward.
 * Contract: tensor.h; semantics: sf_ref_layernorm_* (gpu/ref/layers.h),
 * checked by tests/gpu/ops/norm.cu.
 */
#ifndef SF_GPU_CUDA_NORM_H
#define SF_GPU_CUDA_NORM_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x, y [n, c, hw] in layout lay (element type dt; hw = 1 is a flat [n, c]
 * tensor, the same in either layout). Each of the n*hw positions is
 * normalised over its c values: y = (x - mean) * rstd * gamma[c] + beta[c]
 * with the biased variance and rstd = 1/sqrt(var + eps), computed in fp32
 * (two passes, as the reference). mean and rstd ([n*hw] fp32 each, position
 * order n, then the pixel) are saved for the backward. gamma, beta fp32 [c];
 * beta NULL: no shift (nn.LayerNorm(bias=False), timm's LayerNorm2dNoBias). */
int sf_cuda_layernorm_fwd_dt(sf_dtype dt, const void *x, int n, int c, size_t hw, sf_layout lay, const float *gamma,
                             const float *beta, float eps, void *y, float *mean, float *rstd, cudaStream_t s);

/* Scratch bytes of sf_cuda_layernorm_bwd_dt for this shape (grows with n). */
size_t sf_cuda_layernorm_scratch_bytes(int n, int c, size_t hw, sf_layout lay);

/* dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)) with g = dy * gamma
 * and xhat = (x - mean) * rstd from the saved statistics; dx may be NULL (no
 * input gradient wanted). dx_add: dx += that instead, summed in fp32 with
 * what dx holds and rounded once, so that an input another layer also reads
 * (a transformer's residual stream) takes this gradient in the same pass
 * rather than through a scratch buffer and an add. dgamma[c] = sum dy * xhat and dbeta[c] = sum dy over
 * the positions, written (not added) in fp32, reduced in a fixed order through
 * scratch (sf_cuda_layernorm_scratch_bytes); dbeta NULL: a bias-free norm's,
 * not written. */
int sf_cuda_layernorm_bwd_dt(sf_dtype dt, const void *x, const void *dy, int n, int c, size_t hw, sf_layout lay,
                             const float *gamma, const float *mean, const float *rstd, void *dx, int dx_add,
                             float *dgamma, float *dbeta, void *scratch, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_NORM_H */
