/* gpu/cuda/conv_patch.h — convolutions whose kernel tiles their input
 * without overlap (kernel == stride, no padding): the backward of W1's
 * stride-2 conv and the forward of W2's stride-2 transposed convs.
 *
 * The backward of a convolution whose kernel tiles its input without overlap (kernel size == stride, no padding) and whose
 * patches are short (k*k*c == 64 inputs, 32 outputs: W1's 16 -> 32 k2s2 at
 * 256x256), as one pass instead of cuDNN's three.
 *
 * Why: such a layer is a per-patch matrix product, dx[p] = dyr[p] W and
 * dW += dyr[p]^T x[p], with 2 * 64 * 32 multiply-adds per patch each way on
 * 64 + 32 elements, so it is bound by memory traffic. cuDNN runs it as a
 * ReLU-mask/bias-gradient pass over dy, a data-gradient kernel and a filter-
 * gradient kernel that each read dy (and the latter x) again: on an H100 at
 * W1's shape in TF32 that was 0.07 + 0.26 ms (data, engine 58 with a 200 MB
 * workspace) + 0.18 ms (filter, beside it) for ~0.13 ms of memory traffic.
 * Here one kernel reads x, y (the ReLU mask) and dy once, writes dx once and
 * leaves per-block partial sums of dW and db, which a second small kernel adds
 * in a fixed order.
 *
 * Semantics: sf_ref_conv2d_bwd_* with stride == k, pad 0 (gpu/ref/layers.h),
 * behind a fused bias and ReLU, in NHWC:
 *   dyr        = relu ? (y > 0 ? dy : 0) : dy
 *   dx[p, q]   = sum_o w[o, q] dyr[p, o]
 *   dw[o, q]   = sum_p dyr[p, o] x[p, q];   db[o] = sum_p dyr[p, o]
 * where p runs over the output pixels of all n images and q = (a, b, ci)
 * over the k x k x c inputs of p's patch; w is KRSC ([oc][k][k][c], the
 * executor's NHWC weight layout), in fp32 (not TF32). fp32 only: for bf16
 * data cuDNN's kernels move half the bytes on tensor cores, and this pass
 * measured no faster there (W1 bf16 on an H100: 867 steps/s with it, 879
 * without). The block count is a constant, so the sums (and their rounding) depend on the shape
 * alone and repeat bit for bit. Checked against the reference by
 * tests/gpu/ops/conv.cu.
 */
#ifndef SF_GPU_CUDA_CONV_PATCH_H
#define SF_GPU_CUDA_CONV_PATCH_H

#include <stddef.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the kernels take this convolution: NHWC, stride == k >= 2, pad 0,
 * h and w multiples of k, k*k*c == 64, k*c a multiple of 4, oc == 32. */
int sf_conv_patch_ok(sf_layout lay, int c, int h, int w, int oc, int k, int stride, int pad);

/* Floats of scratch sf_conv_patch_bwd needs at most (its partial sums). */
size_t sf_conv_patch_scratch_floats(int c, int oc, int k);

/* Backward, dt == SF_DT_F32: y is the forward output when a ReLU was fused
 * (its mask), else NULL. Writes dw (KRSC), db (NULL: no bias) and dx (NULL:
 * not wanted). x, y, dy and dx are 16-byte aligned; scratch holds
 * sf_conv_patch_scratch_floats(c, oc, k) floats. */
int sf_conv_patch_bwd(sf_dtype dt, const void *x, const void *w, const void *y, const void *dy, void *dx, void *dw,
                      float *db, int n, int c, int h, int wd, int oc, int k, float *scratch, cudaStream_t s);

/* The forward of a transposed convolution with kernel == stride == 2, no
 * padding, NCHW, fp32, 32 -> 16 or 64 -> 32 channels (W2's last two decoder
 * layers): y = relu?(convT(x, w) + b), w in PyTorch's [c][oc][2][2], b NULL
 * for no bias; sf_ref_convt2d_fwd semantics (gpu/ref/layers.h), computed in
 * fp32. Why: each input pixel owns its own 2 x 2 block of every output
 * channel, so the layer is a per-pixel product writing 4 * oc / c times the
 * bytes it reads, yet cuDNN ran it in NCHW as a layout conversion, an NHWC
 * data-gradient kernel, a conversion back and a bias/ReLU pass (2.0 ms for
 * W2's last layer at batch 128 on an H100, against ~0.27 ms of memory
 * traffic). One kernel with the bias and ReLU inside. y is 8-byte aligned. */
int sf_convt_patch_ok(sf_layout lay, int c, int oc, int k, int stride, int pad);
int sf_convt_patch_fwd(sf_dtype dt, const void *x, const void *w, const float *b, void *y, int n, int c, int h,
                       int wd, int oc, int k, int relu, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_CONV_PATCH_H */
