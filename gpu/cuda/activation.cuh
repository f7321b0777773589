/* gpu/cuda/activation.cuh — the activations of activation.h as device
 * functions, f(x) and f'(x) in fp32, for the kernels that apply one inside
 * another pass: activation.cu's own, and batchnorm.cu's apply and backward
 * when an activation follows a batchnorm (the executor's fusion). The
 * formulas are gpu/ref/activation.c's. */
#ifndef SF_GPU_CUDA_ACTIVATION_CUH
#define SF_GPU_CUDA_ACTIVATION_CUH

#include <math.h>

#include "gpu/cuda/activation.h"

#define GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K1 0.044715f
#define INV_SQRT2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

/* f(x) for one activation chosen at compile time, so that a kernel
 * instantiated per activation runs straight-line code (no per-element switch
 * on a run-time code). slope: leaky ReLU's; the others ignore it. */
template <int ACT> __device__ __forceinline__ float act_f_t(float v, float slope)
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
        r = v > 0.f ? v : v * slope;
    else
        r = 0.5f * v * (1.f + erff(v * INV_SQRT2));
    return isnan(v) ? v : r;
}

/* f'(x), the factor of dy; leaky ReLU's is the slope at 0 (PyTorch's
 * x > 0 test), tanh's 1 - tanh(x)^2 (PyTorch's 1 - y^2). */
template <int ACT> __device__ __forceinline__ float act_d_t(float v, float slope)
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
        return v > 0.f ? 1.f : slope;
    } else {
        return 0.5f * (1.f + erff(v * INV_SQRT2)) + v * expf(-0.5f * v * v) * INV_SQRT_2PI;
    }
}

/* The same with the activation chosen at run time, for the kernels that
 * apply one inside another pass (batchnorm.cu's fused activation): the
 * activations without a parameter only. Leaky ReLU, whose slope these do
 * not carry, is never fused (executor_plan.cu's g_choose_fusions). */
__device__ __forceinline__ float act_f(int act, float v)
{
    switch (act) {
    case SF_CUDA_ACT_RELU6: return act_f_t<SF_CUDA_ACT_RELU6>(v, 0.f);
    case SF_CUDA_ACT_SIGMOID: return act_f_t<SF_CUDA_ACT_SIGMOID>(v, 0.f);
    case SF_CUDA_ACT_SILU: return act_f_t<SF_CUDA_ACT_SILU>(v, 0.f);
    case SF_CUDA_ACT_HARDSWISH: return act_f_t<SF_CUDA_ACT_HARDSWISH>(v, 0.f);
    case SF_CUDA_ACT_HARDSIGMOID: return act_f_t<SF_CUDA_ACT_HARDSIGMOID>(v, 0.f);
    case SF_CUDA_ACT_GELU_TANH: return act_f_t<SF_CUDA_ACT_GELU_TANH>(v, 0.f);
    case SF_CUDA_ACT_TANH: return act_f_t<SF_CUDA_ACT_TANH>(v, 0.f);
    default: return act_f_t<SF_CUDA_ACT_GELU>(v, 0.f);
    }
}

__device__ __forceinline__ float act_d(int act, float v)
{
    switch (act) {
    case SF_CUDA_ACT_RELU6: return act_d_t<SF_CUDA_ACT_RELU6>(v, 0.f);
    case SF_CUDA_ACT_SIGMOID: return act_d_t<SF_CUDA_ACT_SIGMOID>(v, 0.f);
    case SF_CUDA_ACT_SILU: return act_d_t<SF_CUDA_ACT_SILU>(v, 0.f);
    case SF_CUDA_ACT_HARDSWISH: return act_d_t<SF_CUDA_ACT_HARDSWISH>(v, 0.f);
    case SF_CUDA_ACT_HARDSIGMOID: return act_d_t<SF_CUDA_ACT_HARDSIGMOID>(v, 0.f);
    case SF_CUDA_ACT_GELU_TANH: return act_d_t<SF_CUDA_ACT_GELU_TANH>(v, 0.f);
    case SF_CUDA_ACT_TANH: return act_d_t<SF_CUDA_ACT_TANH>(v, 0.f);
    default: return act_d_t<SF_CUDA_ACT_GELU>(v, 0.f);
    }
}

#endif /* SF_GPU_CUDA_ACTIVATION_CUH */
