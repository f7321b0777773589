/* gpu/cuda/activation.cuh — the activations of activation.h as device
 * functions, f(x) and f'(x) in fp32, for the kernels that apply one inside
 * another pass: activation.cu's own, and batchnorm.cu's apply and backward
 * when an activation follows a batchnorm (the executor's fusion). The
 * formulas are gpu/ref/activation.c's. */
#ifndef SF_GPU_CUDA_ACTIVATION_CUH
#define SF_GPU_CUDA_ACTIVATION_CUH

#include <math.h>

#include "gpu/cuda/activation.h"
#include "gpu/model.h" /* SF_CLAMP_GRAD_* */

#define GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K1 0.044715f
#define INV_SQRT2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f
#define SELU_ALPHA 1.6732632423543772f /* PyTorch's (gpu/ref/layers.h SF_SELU_ALPHA) */
#define SELU_SCALE 1.0507009873554805f

/* Whether the clamp layer passes the gradient at x (gpu/model.h's
 * SF_CLAMP_GRAD_*): strictly between its bounds, an infinite bound (an
 * open side) testing nothing; at a NaN clamp's rule (x > min, x < max)
 * passes none, hardtanh's (zero where x <= min or x >= max) passes it; the
 * closed clamp rule (x >= min, x <= max) passes it at a bound, none at a
 * NaN. */
__device__ __forceinline__ bool act_clamp_passes(float v, sf_cuda_act_prm prm)
{
    const bool lo = isinf(prm.a), hi = isinf(prm.b);
    if (prm.c == SF_CLAMP_GRAD_HARDTANH)
        return (lo || !(v <= prm.a)) && (hi || !(v >= prm.b));
    if (prm.c == SF_CLAMP_GRAD_CLAMP_CLOSED)
        return (lo || v >= prm.a) && (hi || v <= prm.b);
    return (lo || v > prm.a) && (hi || v < prm.b);
}

/* f(x) for one activation chosen at compile time, so that a kernel
 * instantiated per activation runs straight-line code (no per-element switch
 * on a run-time code). prm: leaky ReLU's slope, ELU's alpha, softplus's
 * beta and threshold, affine's scale and shift, clamp's bounds and rule;
 * the others ignore it. ELU and SELU take expm1, as PyTorch's CUDA kernel
 * does. */
template <int ACT> __device__ __forceinline__ float act_f_t(float v, sf_cuda_act_prm prm)
{
    float r;
    if constexpr (ACT == SF_CUDA_ACT_RELU6)
        r = v < 0.f ? 0.f : v > 6.f ? 6.f : v;
    else if constexpr (ACT == SF_CUDA_ACT_SIGMOID)
        r = 1.f / (1.f + expf(-v));
    else if constexpr (ACT == SF_CUDA_ACT_SILU)
        r = v / (1.f + expf(-v));
    else if constexpr (ACT == SF_CUDA_ACT_HARDSWISH)
        r = v <= -3.f ? 0.f : v >= 3.f ? v : v * (v + 3.f) / 6.f;
    else if constexpr (ACT == SF_CUDA_ACT_HARDSIGMOID)
        r = v <= -3.f ? 0.f : v >= 3.f ? 1.f : v / 6.f + 0.5f;
    else if constexpr (ACT == SF_CUDA_ACT_GELU_TANH)
        r = 0.5f * v * (1.f + tanhf(GELU_K0 * (v + GELU_K1 * v * v * v)));
    else if constexpr (ACT == SF_CUDA_ACT_TANH)
        r = tanhf(v);
    else if constexpr (ACT == SF_CUDA_ACT_LEAKY_RELU)
        r = v > 0.f ? v : v * prm.a;
    else if constexpr (ACT == SF_CUDA_ACT_ELU)
        r = v > 0.f ? v : expm1f(v) * prm.a;
    else if constexpr (ACT == SF_CUDA_ACT_SELU)
        r = v > 0.f ? v * SELU_SCALE : expm1f(v) * (SELU_ALPHA * SELU_SCALE);
    else if constexpr (ACT == SF_CUDA_ACT_SOFTPLUS)
        r = v * prm.a > prm.b ? v : log1pf(expf(v * prm.a)) / prm.a;
    else if constexpr (ACT == SF_CUDA_ACT_MISH)
        r = v * tanhf(log1pf(expf(v)));
    else if constexpr (ACT == SF_CUDA_ACT_AFFINE)
        r = __fadd_rn(__fmul_rn(v, prm.a), prm.b); /* PyTorch's x * c + d: two roundings, no FMA */
    else if constexpr (ACT == SF_CUDA_ACT_CLAMP)
        r = v < prm.a ? prm.a : v > prm.b ? prm.b : v; /* -0 within the bounds stays -0, as torch's */
    else if constexpr (ACT == SF_CUDA_ACT_SQUARE)
        r = v * v;
    else
        r = 0.5f * v * (1.f + erff(v * INV_SQRT2));
    return isnan(v) ? v : r;
}

/* f'(x), the factor of dy; leaky ReLU's is the slope at 0 (PyTorch's
 * x > 0 test), tanh's 1 - tanh(x)^2 (PyTorch's 1 - y^2); ELU's and SELU's
 * elu_backward's (is_result false: alpha * scale * exp(x) at x <= 0, the
 * scale elsewhere, a NaN included), softplus's softplus_backward's, Mish's
 * mish_backward's. */
template <int ACT> __device__ __forceinline__ float act_d_t(float v, sf_cuda_act_prm prm)
{
    if constexpr (ACT == SF_CUDA_ACT_RELU6) {
        return v > 0.f && v < 6.f ? 1.f : 0.f;
    } else if constexpr (ACT == SF_CUDA_ACT_SIGMOID) {
        const float s = 1.f / (1.f + expf(-v));
        return s * (1.f - s);
    } else if constexpr (ACT == SF_CUDA_ACT_SILU) {
        const float s = 1.f / (1.f + expf(-v));
        return s * (1.f + v * (1.f - s));
    } else if constexpr (ACT == SF_CUDA_ACT_HARDSWISH) {
        return v < -3.f ? 0.f : v <= 3.f ? v / 3.f + 0.5f : 1.f;
    } else if constexpr (ACT == SF_CUDA_ACT_HARDSIGMOID) {
        return v > -3.f && v < 3.f ? 1.f / 6.f : 0.f;
    } else if constexpr (ACT == SF_CUDA_ACT_GELU_TANH) {
        const float t = tanhf(GELU_K0 * (v + GELU_K1 * v * v * v));
        return 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * GELU_K0 * (1.f + 3.f * GELU_K1 * v * v);
    } else if constexpr (ACT == SF_CUDA_ACT_TANH) {
        const float t = tanhf(v);
        return 1.f - t * t;
    } else if constexpr (ACT == SF_CUDA_ACT_LEAKY_RELU) {
        return v > 0.f ? 1.f : prm.a;
    } else if constexpr (ACT == SF_CUDA_ACT_ELU) {
        return v <= 0.f ? prm.a * expf(v) : 1.f;
    } else if constexpr (ACT == SF_CUDA_ACT_SELU) {
        return v <= 0.f ? (SELU_ALPHA * SELU_SCALE) * expf(v) : SELU_SCALE;
    } else if constexpr (ACT == SF_CUDA_ACT_SOFTPLUS) {
        const float z = expf(v * prm.a);
        return v * prm.a > prm.b ? 1.f : z / (z + 1.f);
    } else if constexpr (ACT == SF_CUDA_ACT_MISH) {
        const float s = 1.f / (1.f + expf(-v)), t = tanhf(log1pf(expf(v)));
        return t + v * s * (1.f - t * t);
    } else if constexpr (ACT == SF_CUDA_ACT_AFFINE) {
        return prm.a;
    } else if constexpr (ACT == SF_CUDA_ACT_CLAMP) {
        return act_clamp_passes(v, prm) ? 1.f : 0.f;
    } else if constexpr (ACT == SF_CUDA_ACT_SQUARE) {
        return 2.f * v; /* PyTorch's pow_backward: 2 * x * dy */
    } else {
        return 0.5f * (1.f + erff(v * INV_SQRT2)) + v * expf(-0.5f * v * v) * INV_SQRT_2PI;
    }
}

/* The same with the activation chosen at run time, for the kernels that
 * apply one inside another pass (batchnorm.cu's fused activation): ReLU6 up
 * to tanh only (batchnorm.h's SF_BN_ACT_LAST). Leaky ReLU, ELU, SELU,
 * softplus, Mish, affine, clamp and square are never fused (g_choose_fusions):
 * the fused kernels carry no parameters, and each activation they take is
 * one more instance of every batchnorm row kernel. */
__device__ __forceinline__ float act_f(int act, float v)
{
    const sf_cuda_act_prm p0 = {0.f, 0.f, 0};
    switch (act) {
    case SF_CUDA_ACT_RELU6: return act_f_t<SF_CUDA_ACT_RELU6>(v, p0);
    case SF_CUDA_ACT_SIGMOID: return act_f_t<SF_CUDA_ACT_SIGMOID>(v, p0);
    case SF_CUDA_ACT_SILU: return act_f_t<SF_CUDA_ACT_SILU>(v, p0);
    case SF_CUDA_ACT_HARDSWISH: return act_f_t<SF_CUDA_ACT_HARDSWISH>(v, p0);
    case SF_CUDA_ACT_HARDSIGMOID: return act_f_t<SF_CUDA_ACT_HARDSIGMOID>(v, p0);
    case SF_CUDA_ACT_GELU_TANH: return act_f_t<SF_CUDA_ACT_GELU_TANH>(v, p0);
    case SF_CUDA_ACT_TANH: return act_f_t<SF_CUDA_ACT_TANH>(v, p0);
    default: return act_f_t<SF_CUDA_ACT_GELU>(v, p0);
    }
}

__device__ __forceinline__ float act_d(int act, float v)
{
    const sf_cuda_act_prm p0 = {0.f, 0.f, 0};
    switch (act) {
    case SF_CUDA_ACT_RELU6: return act_d_t<SF_CUDA_ACT_RELU6>(v, p0);
    case SF_CUDA_ACT_SIGMOID: return act_d_t<SF_CUDA_ACT_SIGMOID>(v, p0);
    case SF_CUDA_ACT_SILU: return act_d_t<SF_CUDA_ACT_SILU>(v, p0);
    case SF_CUDA_ACT_HARDSWISH: return act_d_t<SF_CUDA_ACT_HARDSWISH>(v, p0);
    case SF_CUDA_ACT_HARDSIGMOID: return act_d_t<SF_CUDA_ACT_HARDSIGMOID>(v, p0);
    case SF_CUDA_ACT_GELU_TANH: return act_d_t<SF_CUDA_ACT_GELU_TANH>(v, p0);
    case SF_CUDA_ACT_TANH: return act_d_t<SF_CUDA_ACT_TANH>(v, p0);
    default: return act_d_t<SF_CUDA_ACT_GELU>(v, p0);
    }
}

#endif /* SF_GPU_CUDA_ACTIVATION_CUH */
