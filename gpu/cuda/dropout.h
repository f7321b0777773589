/* gpu/cuda/dropout.h — training-mode dropout (element-wise), channel
 * dropout (nn.Dropout2d: channel-wise) and stochastic depth (row mode:
 * sample-wise), in either layout, drawing the keep/drop
 * decisions from the counter-based generator of gpu/rng.h with the
 * reference's keys, so that both backends drop the same elements. Contract
 * and element types: tensor.h; semantics: gpu/ref/dropout.c
 * (sf_ref_dropout_fwd, sf_ref_dropout2d_fwd, sf_ref_stochastic_depth_fwd), checked by
 * tests/gpu/ops/dropout.cu.
 *
 * Keys: element e of the batch in NCHW order (n*c*hw + c*hw + p, whatever
 * the layout the tensor is stored in) is kept when
 * sf_u01(sf_hash4(seed ^ SF_REF_DROPOUT_SALT, seq, layer, e)) >= p; channel
 * ch of sample i when sf_u01(sf_hash4(seed ^ SF_REF_DROPOUT2D_SALT, seq, layer,
 * i*c + ch)) >= p; sample i when sf_u01(sf_hash4(seed ^ SF_REF_DEPTH_SALT, seq,
 * layer, i)) >= p. Kept
 * values are scaled by 1/(1-p) (p = 1 drops everything). The backward is the
 * same call on dy: it draws the same mask, so no mask is stored.
 *
 * seq is read from device memory by the kernel (NULL: 0), so a step captured
 * into a CUDA graph draws each replay's batch's own mask.
 */
#ifndef SF_GPU_CUDA_DROPOUT_H
#define SF_GPU_CUDA_DROPOUT_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What one keep/drop decision covers. */
typedef enum sf_drop_unit {
    SF_DROP_ELEMENT = 0, /* dropout */
    SF_DROP_SAMPLE = 1,  /* stochastic depth, row mode */
    SF_DROP_CHANNEL = 2  /* nn.Dropout2d */
} sf_drop_unit;

/* y = the mask applied to x ([n, c, hw] in layout lay; a flat [n, f] tensor
 * is the map with hw = 1), one decision per unit. y may alias x. */
int sf_cuda_dropout_dt(sf_dtype dt, sf_layout lay, const void *x, void *y, int n, int c, size_t hw, float p,
                       uint64_t seed, const uint64_t *seq, uint64_t layer, sf_drop_unit unit, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_DROPOUT_H */
