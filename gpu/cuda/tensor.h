/* gpu/cuda/tensor.h — what the CUDA op families share: the layout and element
 * type of device tensors, and the contract every launcher keeps.
 *
 * One header per op family declares its launchers: conv.h (cuDNN
 * convolutions), conv_gemm.h (pointwise convolutions as cuBLAS GEMMs where
 * cuDNN has no engine), conv_transpose.h, linear.h (cuBLAS), batchnorm.h, norm.h
 * (layer norm), pool.h (max, average, adaptive and global average pooling),
 * pointwise.h (bias, ReLU, add, cast, fill), activation.h (ReLU6, sigmoid,
 * SiLU, hardswish, hardsigmoid, GELU), mul.h (products: broadcast multiply,
 * layer scale), concat.h, channels.h (channel shuffle and slice), dropout.h
 * (dropout, stochastic depth), loss.h
 * (cross-entropy, per sample and per pixel), optimizer.h (SGD, AdamW, the
 * device copies of the weights) and layout.h (transposes).
 *
 * Each function there is a launcher: it takes an explicit stream (or a library
 * handle already bound to one), enqueues work, checks the launch and returns
 * 0, or -1 with sf_cuda_last_error() (check.h) set. Nothing allocates device
 * memory or synchronises the host, except the plan builders
 * (sf_conv_plan_build, sf_convt_plans_build), which run at build time only
 * (they may time candidate engines on the handle's stream); so every launcher
 * can be captured into a CUDA graph. Scratch memory is the caller's: each
 * launcher that needs some says how much through a *_scratch function of the
 * same shape. Every reduction is deterministic: partial sums land in scratch in
 * a fixed order set by the shape alone, and are combined in that order (no
 * atomics), so equal inputs give bit-equal outputs.
 *
 * Layouts. Activations are NCHW or NHWC (sf_layout); a cuDNN convolution on NHWC
 * activations takes its filter as KRSC ([oc][k][k][c]), on NCHW as KCRS
 * ([oc][c][k][k], PyTorch's layout). Linear layers use PyTorch's row-major
 * [out, in] weights and [n, features] activations in either layout.
 *
 * Precision. fp32 data is computed in strict fp32, or with TF32 tensor cores
 * where the caller allows it (tf32 flags). bf16 data (sf_dtype) is computed
 * as PyTorch autocast does: bf16 operands, tensor cores allowed, fp32
 * accumulation, each output rounded to bf16 once (the tf32 flags do not apply).
 * The _dt launchers take the activation tensors (x, y, dy, dx, a, b) with
 * element type dt through void pointers; per-channel parameters, biases,
 * statistics, scratch and parameter gradients stay fp32. Arithmetic is fp32
 * (statistics as in the fp32 versions) and each output is rounded once to dt.
 * The fp32 launchers are the dt == SF_DT_F32 case of these.
 *
 * Semantics are those of gpu/ref/ref.h; tests/gpu/ops/<family>.cu checks each
 * family against it. Threads: any host thread may call a launcher; a handle or
 * a plan set must not be used by two threads at once.
 */
#ifndef SF_GPU_CUDA_TENSOR_H
#define SF_GPU_CUDA_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "gpu/cuda/check.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sf_layout { SF_LAYOUT_NCHW = 0, SF_LAYOUT_NHWC = 1 } sf_layout;

/* Element type of activations (and of the weight copies convolutions read):
 * fp32, or bf16 (__nv_bfloat16 bit patterns, rounded to nearest even; math and
 * accumulation in fp32, as autocast). Zero (a memset descriptor) is fp32. */
typedef enum sf_dtype { SF_DT_F32 = 0, SF_DT_BF16 = 1 } sf_dtype;
static inline size_t sf_dtype_size(sf_dtype t) { return t == SF_DT_BF16 ? 2 : 4; }

/* Largest power of two <= 16 dividing the address (for sf_conv_desc.align_*). */
int sf_cuda_ptr_align(const void *p);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_TENSOR_H */
