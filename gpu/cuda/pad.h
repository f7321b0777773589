/* gpu/cuda/pad.h — F.pad of a map's last two dimensions (nn.ZeroPad2d,
 * nn.ConstantPad2d, nn.ReflectionPad2d, nn.ReplicationPad2d,
 * nn.CircularPad2d), forward and backward, on fp32 or bf16 maps in NCHW or
 * NHWC, math in fp32. The backward gathers: each input element sums the few
 * output gradients that read it (closed form per mode), so it needs no
 * atomics and no scratch and gives the same bits every run. Contract and
 * element types: tensor.h; semantics: gpu/ref/pad.c (sf_ref_pad_fwd,
 * sf_ref_pad_bwd), checked by tests/gpu/ops/pad.cu.
 */
#ifndef SF_GPU_CUDA_PAD_H
#define SF_GPU_CUDA_PAD_H

#include <stddef.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "gpu/model.h" /* SF_PAD_*, SF_MAX_PAD; C linkage, as executor.h includes it */

/* y [n, c, top + h + bottom, left + w + right] from x [n, c, h, w] in layout
 * lay, pad = [left, right, top, bottom] (each in [0, SF_MAX_PAD]), mode
 * SF_PAD_* (gpu/model.h): value fills the border of mode constant; reflect
 * needs each pad below its axis's size, circular at most its size. Anything
 * else is refused (-1, sf_cuda_last_error naming it). */
int sf_cuda_pad_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, int h, int w, const int pad[4],
                       int mode, float value, void *y, cudaStream_t s);
/* dx [n, c, h, w] (written, not accumulated) = the sum of dy over the outputs
 * that read each input; the constant border's dy goes nowhere. The same
 * bounds as the forward. */
int sf_cuda_pad_bwd_dt(sf_dtype dt, sf_layout lay, const void *dy, int n, int c, int h, int w, const int pad[4],
                       int mode, void *dx, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_PAD_H */
