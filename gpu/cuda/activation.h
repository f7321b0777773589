/* gpu/cuda/activation.h — the activations beside ReLU (ReLU6, sigmoid,
 * SiLU, hardswish, hardsigmoid, GELU erf and tanh, tanh, leaky ReLU with its
 * slope, ELU with its alpha, SELU, softplus with its beta and threshold,
 * Mish) and the affine layer's scale * x + shift, forward and backward, elementwise (so the same in either layout). Contract and
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
    SF_CUDA_ACT_ELU,        /* x > 0 ? x : alpha * expm1(x) */
    SF_CUDA_ACT_SELU,       /* scale * elu(x) at PyTorch's fixed alpha and scale */
    SF_CUDA_ACT_SOFTPLUS,   /* beta * x > threshold ? x : log1p(exp(beta * x)) / beta */
    SF_CUDA_ACT_MISH,       /* x * tanh(log1p(exp(x))) */
    SF_CUDA_ACT_AFFINE,     /* the affine layer: scale * x + shift; its derivative reads no x */
    SF_CUDA_ACT_CLAMP,      /* the clamp layer: min(max(x, a), b), -inf / +inf where a side is open */
    SF_CUDA_ACT_SQUARE,     /* x * x (the square layer); its derivative 2 * x */
} sf_cuda_act;
#define SF_CUDA_ACT_LAST SF_CUDA_ACT_SQUARE

/* An activation's parameters, by value (a kernel argument); the reference's
 * sf_act_prm (gpu/ref/layers.h), which activation.cu checks it matches.
 * The activations without parameters ignore it. */
typedef struct sf_cuda_act_prm {
    float a; /* leaky ReLU: negative_slope; ELU: alpha; softplus: beta (not 0); affine: scale; clamp: min */
    float b; /* softplus: threshold; affine: shift; clamp: max */
    int c;   /* clamp: the gradient rule, SF_CLAMP_GRAD_* (gpu/model.h) */
} sf_cuda_act_prm;

/* y = f(x) for len elements of type dt, computed in fp32; x == y allowed.
 * A NaN input gives a NaN output (as PyTorch's clamps do). */
int sf_cuda_act_fwd_dt(sf_dtype dt, sf_cuda_act act, sf_cuda_act_prm prm, const void *x, void *y, size_t len,
                       cudaStream_t s);
/* dx = dy * f'(x) (x: the forward's input) with PyTorch's choices at the
 * kinks: ReLU6 and hardsigmoid pass no gradient at their corners, hardswish
 * takes x/3 + 1/2 on [-3, 3], leaky ReLU takes the slope at 0, ELU and SELU
 * take alpha * scale * exp(x) at x <= 0 (elu_backward, is_result false),
 * softplus 1 where beta * x > threshold; affine its scale (x is not read
 * then, and may be dy); clamp dy strictly between its bounds, +0 at or
 * beyond one, and at a NaN +0 under clamp's rule, dy under hardtanh's.
 * dx == dy allowed. */
int sf_cuda_act_bwd_dt(sf_dtype dt, sf_cuda_act act, sf_cuda_act_prm prm, const void *x, const void *dy, void *dx,
                       size_t len, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_ACTIVATION_H */
