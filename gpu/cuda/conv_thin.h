/* gpu/cuda/conv_thin.h — 1x1, stride-1, unpadded convolutions with few
 * channels (a stem that lifts RGB to a handful of channels, W1's 3 -> 16 at
 * 256x256; a segmentation head, W2's 16 -> 10) as memory-bound kernels
 * instead of cuDNN's.
 *
 * Why: such a layer does 2*c*oc flops per pixel (96 for 3 -> 16) on
 * (c + oc) elements, so it is bound by memory traffic, yet cuDNN runs it as an
 * implicit GEMM with K = c = 3 and its backward as a weight-gradient GEMM with
 * a split-K reduction plus a separate bias-gradient/ReLU-mask pass over dy: on
 * an H100 at W1's shape that was 0.18 ms forward and 0.27-0.40 ms backward
 * against ~0.03 and ~0.05 ms of memory traffic. Here the forward reads x once
 * and writes y once (bias and ReLU in the same pass), and the backward reads
 * x, y (the ReLU mask) and dy once and produces the weight gradient, the bias
 * gradient and (when wanted) dx in that one pass, with per-block partial sums
 * reduced by a second small kernel.
 *
 * Semantics: sf_ref_conv2d_* with k = 1 (gpu/ref/ref.h) plus bias and ReLU:
 *   y[p, o]  = relu?(b[o] + sum_c w[o, c] x[p, c])
 *   dyr      = relu ? (y > 0 ? dy : 0) : dy
 *   dw[o, c] = sum_p dyr[p, o] x[p, c];  db[o] = sum_p dyr[p, o]
 *   dx[p, c] = sum_o w[o, c] dyr[p, o]
 * over pixels p of all n images, in NHWC ([p, c]) or NCHW ([n, c, hw]); w is
 * [oc, c] (the same in either layout for k = 1). fp32 data is computed in fp32
 * (not TF32); bf16 data accumulates in fp32 and rounds the stored results.
 * The sums run in an order fixed by the shape (the block count depends on the
 * shape and the scratch, never on the device), so results repeat bit for bit.
 * Checked against the reference by tests/gpu/ops/conv.cu.
 */
#ifndef SF_GPU_CUDA_CONV_THIN_H
#define SF_GPU_CUDA_CONV_THIN_H

#include <stddef.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the kernels take this convolution: k == 1, stride 1, pad 0, fp32
 * or bf16, and either 1 <= c <= 4 with oc one of 8, 16, 32 (any layout), or,
 * NCHW fp32, up to 16 input and 16 output channels (the narrow kernels: a
 * segmentation head such as W2's 16 -> 10 at 256x256, which cuDNN's NCHW
 * fp32 engines ran at 1.5 ms forward and 2.0 ms backward on an H100 at batch
 * 128, ~0.8 ms of memory traffic in all). */
int sf_conv_thin_ok(sf_layout lay, sf_dtype dt, int c, int oc, int k, int stride, int pad);

/* Floats of scratch sf_conv_thin_bwd needs at most (its partial sums). */
size_t sf_conv_thin_scratch_floats(int c, int oc);

/* Forward: y = relu?(conv(x, w) + b); b may be NULL (no bias). */
int sf_conv_thin_fwd(sf_dtype dt, sf_layout lay, const void *x, const void *w, const float *b, void *y, int n,
                     int c, size_t hw, int oc, int relu, cudaStream_t s);

/* Backward: y is the forward output when a ReLU was fused (its mask), else
 * NULL. Writes dw (element type dt, [oc, c]), db (fp32, NULL: no bias) and dx
 * (NULL: not wanted). scratch holds sf_conv_thin_scratch_floats(c, oc) floats. */
int sf_conv_thin_bwd(sf_dtype dt, sf_layout lay, const void *x, const void *w, const void *y, const void *dy,
                     void *dx, void *dw, float *db, int n, int c, size_t hw, int oc, float *scratch,
                     cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
