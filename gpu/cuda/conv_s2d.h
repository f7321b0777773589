/* gpu/cuda/conv_s2d.h — a strided convolution over few input channels run as
 * the stride-1 convolution of its space-to-depth rearrangement (ResNet's stem:
 * 3 -> 64 channels, 7x7, stride 2, at 224x224).
 *
 * Why: with 3 input channels cuDNN pads the NHWC input to 8 channels in a
 * separate pass and runs an Ampere-generation implicit GEMM whose reduction is
 * 8 x 49 long: on an H100 at batch 1024 in bf16 that was 0.87 ms of padding,
 * 7.6 ms forward and 4.6 ms filter gradient, over a fifth of ResNet-18's step,
 * for 0.24 TFLOP of useful work. Gathering each s x s block of input pixels
 * into the channels of one pixel turns the same convolution into a stride-1
 * one with ceil(k/s) x ceil(k/s) taps over c*s*s channels (12 -> 16), which
 * cuDNN runs on its Hopper kernels.
 *
 * The rearrangement (s = stride, p = pad, k2 = ceil(k/s), oh/ow the output
 * size): xs is [n, oh+k2-1, ow+k2-1, c2] NHWC with
 *   xs[b, j, i, (dy*s + dx)*c + ci] = x[b, s*j - p + dy, s*i - p + dx, ci]
 * (zero outside x, and in channels c*s*s .. c2-1), and the weight ws is
 * [oc, k2, k2, c2] (KRSC) with
 *   ws[o, by, bx, (dy*s + dx)*c + ci] = w[o, by*s + dy, bx*s + dx, ci]
 * (zero where by*s+dy or bx*s+dx reaches k). Output pixel (j, i) of the
 * stride-1, unpadded convolution of xs with ws then sums exactly the products
 * of output pixel (j, i) of the original, so y is the same tensor, and the
 * filter gradient of w is ws's gathered back (the rearrangement is a linear
 * embedding; its padded entries' gradients are dropped). c2 is c*s*s rounded
 * up to 16 bytes of elements. Only the forward and the filter gradient: the
 * input gradient of such a layer (a stem reading the model input) is not
 * wanted. Checked against the reference by tests/gpu/ops/conv.cu.
 *
 * A kernel that tiles its input (k == stride: the patch embedding of ViT,
 * ConvNeXt and Swin) is the case k2 = 1: the rearranged convolution is
 * pointwise over c*s*s channels, a GEMM that cuDNN runs on tensor cores
 * with no padding pass. As it is, ViT-B/16's 3 -> 768 16x16 stride-16 layer
 * at batch 256 in bf16 took 1.62 ms forward (engine 45, of 8 timed) and
 * 0.68 ms filter gradient on an H200, for 59 GFLOP. Its pixels hold too many
 * elements (768) for the rearrangement to gather them in registers, so that
 * case copies the s source rows of each patch as contiguous runs instead.
 */
#ifndef SF_GPU_CUDA_CONV_S2D_H
#define SF_GPU_CUDA_CONV_S2D_H

#include <stddef.h>

#include "gpu/cuda/conv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest patch (k == stride) the rearrangement takes. */
#define SF_S2D_PATCH_MAX 32

/* Whether the rearrangement applies: NHWC and either stride 2..4, k >
 * stride, c * stride^2 <= 16, or k == stride in 2..SF_S2D_PATCH_MAX over at
 * most 4 channels (images' RGB or RGBA). */
int sf_conv_s2d_ok(sf_layout lay, int c, int k, int stride);

/* The stride-1 convolution on the rearranged tensors: d's batch, output
 * channels, type and alignments; c2, oh+k2-1, ow+k2-1, k2, stride 1, pad 0. */
void sf_conv_s2d_desc(const sf_conv_desc *d, sf_conv_desc *out);

/* Elements of the rearranged input (for d->n samples) and of the weight. */
size_t sf_conv_s2d_x_elems(const sf_conv_desc *d);
size_t sf_conv_s2d_w_elems(const sf_conv_desc *d);

/* xs = the rearrangement of x [d->n, h, w, c] (16-byte aligned xs). */
int sf_conv_s2d_input(const sf_conv_desc *d, const void *x, void *xs, cudaStream_t s);
/* ws = the rearrangement of the KRSC weight w. */
int sf_conv_s2d_weight(const sf_conv_desc *d, const void *w, void *ws, cudaStream_t s);
/* dw (KRSC) = the filter gradient dws of the rearranged weight, gathered back. */
int sf_conv_s2d_wgrad(const sf_conv_desc *d, const void *dws, void *dw, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_CONV_S2D_H */
