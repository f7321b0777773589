/* gpu/cuda/activation.h — the activations without parameters beside ReLU
 * (ReLU6, sigmoid, SiLU, hardswish, hardsigmoid, GELU erf and tanh, tanh,
 * leaky ReLU with its slope), forward
 * and backward, elementwise (so the same in either layout). Contract and
 * element types: tensor.h; semantics: gpu/ref/activation.c (sf_ref_act_fwd,
 * sf_ref_act_bwd), checked by tests/gpu/ops/activation.cu.
 */
#ifndef SF_GPU_CUDA_ACTIVATION_H
#define SF_GPU_CUDA_ACTIVATION_H

#include <stddef.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which activation: the reference's codes (SF_ACT_* of gpu/ref/layers.h),
 * which activation.cu checks these equal. */
typedef enum sf_cuda_act {
    SF_CUDA_ACT_RELU6 = 0,
    SF_CUDA_ACT_SIGMOID,
    SF_CUDA_ACT_SILU,
    SF_CUDA_ACT_HARDSWISH,
    SF_CUDA_ACT_HARDSIGMOID,
    SF_CUDA_ACT_GELU,      /* x * Phi(x) through erf */
    SF_CUDA_ACT_GELU_TANH, /* GELU's tanh approximation */
    SF_CUDA_ACT_TANH,
    SF_CUDA_ACT_LEAKY_RELU, /* x > 0 ? x : slope * x */
} sf_cuda_act;

/* y = f(x) for len elements of type dt, computed in fp32; x == y allowed.
 * slope: leaky ReLU's negative_slope (the others ignore it). A NaN input
 * gives a NaN output (as PyTorch's clamps do). */
int sf_cuda_act_fwd_dt(sf_dtype dt, sf_cuda_act act, float slope, const void *x, void *y, size_t len,
                       cudaStream_t s);
/* dx = dy * f'(x) (x: the forward's input) with PyTorch's choices at the
 * kinks: ReLU6 and hardsigmoid pass no gradient at their corners, hardswish
 * takes x/3 + 1/2 on [-3, 3], leaky ReLU takes the slope at 0. dx == dy
 * allowed. */
int sf_cuda_act_bwd_dt(sf_dtype dt, sf_cuda_act act, float slope, const void *x, const void *dy, void *dx,
                       size_t len, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_ACTIVATION_H */
