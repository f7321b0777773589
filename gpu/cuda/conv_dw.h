/* gpu/cuda/conv_dw.h — depthwise convolutions (groups = c = oc) on NHWC
 * tensors as memory-bound kernels beside cuDNN's.
 *
 * Why: cuDNN 9 offers only its generic engine 0 for NHWC depthwise
 * convolutions, and on an H200 at EfficientNet-B0's first depthwise layer
 * (32 channels, 112x112, batch 256, bf16) that engine took 3.4 ms forward,
 * 2.4 ms backward-data and 18.1 ms backward-filter, where the tensors' traffic
 * allows ~0.1 ms each (bench/results/2026-11-28-h200-families-speed.md). A
 * depthwise convolution does k*k multiply-adds per element, so it is bound by
 * memory traffic: these kernels read each input once from DRAM (the taps'
 * reuse comes from the L1/L2 caches) and write each output once.
 *
 * Layout: x, y (and dx, dy) are NHWC, [n, h, w, c]; the filter is KRSC with
 * one input channel per group, so [c, k, k] (filter element (c, ky, kx) at
 * c*k*k + ky*k + kx), as cuDNN and the executor store it for NHWC.
 *
 * Semantics: sf_ref_conv2d_gd_* (gpu/ref/layers.h) with groups = c = oc and
 * dilation 1:
 *   y[n, oy, ox, c] = b[c] + sum_{ky, kx} w[c, ky, kx] x[n, oy*s - p + ky, ox*s - p + kx, c]
 *   dx = the transpose of that map applied to dy
 *   dw[c, ky, kx] = sum_{n, oy, ox} dy[n, oy, ox, c] x[n, oy*s - p + ky, ox*s - p + kx, c]
 * (taps outside the input read 0). fp32 data is computed in fp32 (never
 * TF32); bf16 data accumulates in fp32 and rounds each stored result once.
 * The filter gradient is deterministic: each block of the first pass sums
 * its rows of the batch's output maps for one tile of channels, in an order
 * fixed by the shape, into a scratch of partial sums, and a second pass adds
 * the partial sums in a fixed order (no atomics), so the same inputs give
 * the same bits. Checked against the reference by tests/gpu/ops/conv_dw.cu.
 */
#ifndef SF_GPU_CUDA_CONV_DW_H
#define SF_GPU_CUDA_CONV_DW_H

#include <stddef.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest kernel size the kernels take (their shared-memory filter tiles
 * and per-thread accumulators are sized for it). */
#define SF_CONV_DW_KMAX 7

/* Whether the kernels take this convolution: NHWC, fp32 or bf16, groups =
 * c = oc >= 1 (channel multiplier 1), dilation 0 or 1, an odd k up to
 * SF_CONV_DW_KMAX, stride 1 or 2, 0 <= pad < k. Everything else stays on
 * cuDNN. */
int sf_conv_dw_ok(sf_layout lay, sf_dtype dt, int c, int oc, int groups, int k, int stride, int pad, int dilation);

/* Floats of scratch sf_conv_dw_bwd_filter needs for n samples of c channels
 * with output height oh and kernel size k (its partial sums). */
size_t sf_conv_dw_scratch_floats(int n, int c, int oh, int k);

/* Forward: y = conv(x, w) + b; b (fp32, [c]) may be NULL (no bias). x and y
 * have element type dt, as w does. */
int sf_conv_dw_fwd(sf_dtype dt, const void *x, const void *w, const float *b, void *y, int n, int c, int h, int w_,
                   int k, int stride, int pad, cudaStream_t s);

/* Backward-data: dx (overwritten) from dy and w. */
int sf_conv_dw_bwd_data(sf_dtype dt, const void *dy, const void *w, void *dx, int n, int c, int h, int w_, int k,
                        int stride, int pad, cudaStream_t s);

/* Backward-filter: dw (element type dt, [c, k, k], overwritten) from x and
 * dy; scratch holds sf_conv_dw_scratch_floats(n, c, oh, k) floats. */
int sf_conv_dw_bwd_filter(sf_dtype dt, const void *x, const void *dy, void *dw, int n, int c, int h, int w_, int k,
                          int stride, int pad, float *scratch, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
