/* gpu/cuda/activation.cu — kernels first, then launchers: ReLU6, sigmoid,
 * SiLU, hardswish, hardsigmoid and GELU (erf, tanh), forward and backward,
 * one grid-stride kernel each on fp32 or bf16 data. Contracts in
 * activation.h; the formulas are gpu/ref/activation.c's. */
#include "gpu/cuda/activation.h"

#include "gpu/cuda/activation.cuh"
#include "gpu/cuda/kernel_common.cuh"

extern "C" {
#include "gpu/ref/layers.h"
}

static_assert((int)SF_CUDA_ACT_RELU6 == SF_ACT_RELU6 && (int)SF_CUDA_ACT_SIGMOID == SF_ACT_SIGMOID &&
                  (int)SF_CUDA_ACT_SILU == SF_ACT_SILU && (int)SF_CUDA_ACT_HARDSWISH == SF_ACT_HARDSWISH &&
                  (int)SF_CUDA_ACT_HARDSIGMOID == SF_ACT_HARDSIGMOID && (int)SF_CUDA_ACT_GELU == SF_ACT_GELU &&
                  (int)SF_CUDA_ACT_GELU_TANH == SF_ACT_GELU_TANH,
              "the activation codes are the reference's");

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* y[i] = f(x[i]) (BWD: y[i] = dy[i] * f'(x[i])) for the activation ACT, a
 * compile-time choice, so the loop is straight-line code (a switch on a
 * run-time code per element kept the erf GELU's loop from being scheduled
 * across elements). Grid-stride, V elements a vector (V > 1: every pointer
 * 16-byte aligned; the len % V tail one element a thread), CU_UNROLL vectors
 * loaded before any is stored, so that enough loads are in flight to cover
 * the erf's arithmetic. x, dy and y may alias: each element is read before it
 * is written, by the same thread. */
template <typename T, int V, bool BWD, int ACT>
__global__ void __launch_bounds__(CU_TPB) k_act(const T *x, const T *dy, T *y, size_t len)
{
    const size_t nvec = len / V, step = (size_t)gridDim.x * blockDim.x;
    const size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t i = t0;
    for (; i + (CU_UNROLL - 1) * step < nvec; i += CU_UNROLL * step) {
        float u[CU_UNROLL][V], d[CU_UNROLL][V];
#pragma unroll
        for (int q = 0; q < CU_UNROLL; q++) {
            cu_ld<T, V>(x + (i + q * step) * V, u[q]);
            if constexpr (BWD)
                cu_ld<T, V>(dy + (i + q * step) * V, d[q]);
        }
#pragma unroll
        for (int q = 0; q < CU_UNROLL; q++) {
#pragma unroll
            for (int j = 0; j < V; j++) {
                if constexpr (BWD)
                    u[q][j] = d[q][j] * act_d_t<ACT>(u[q][j]);
                else
                    u[q][j] = act_f_t<ACT>(u[q][j]);
            }
            cu_st<T, V>(y + (i + q * step) * V, u[q]);
        }
    }
    for (; i < nvec; i += step) {
        float u[V], d[V];
        cu_ld<T, V>(x + i * V, u);
        if constexpr (BWD)
            cu_ld<T, V>(dy + i * V, d);
#pragma unroll
        for (int j = 0; j < V; j++) {
            if constexpr (BWD)
                u[j] = d[j] * act_d_t<ACT>(u[j]);
            else
                u[j] = act_f_t<ACT>(u[j]);
        }
        cu_st<T, V>(y + i * V, u);
    }
    if constexpr (V > 1) {
        const size_t e = nvec * V + t0;
        if (e < len) {
            const float v = cu_f(x[e]);
            y[e] = cu_to<T>(BWD ? cu_f(dy[e]) * act_d_t<ACT>(v) : act_f_t<ACT>(v));
        }
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

template <typename T, bool BWD, int ACT>
static void act_launch_t(const T *x, const T *dy, T *y, size_t len, int vec, cudaStream_t s)
{
    constexpr int VEC = 16 / sizeof(T);
    if (vec)
        k_act<T, VEC, BWD, ACT><<<cu_ew_blocks(len / VEC), CU_TPB, 0, s>>>(x, dy, y, len);
    else
        k_act<T, 1, BWD, ACT><<<cu_ew_blocks(len), CU_TPB, 0, s>>>(x, dy, y, len);
}

/* One kernel per activation: the run-time code picks the instance once here. */
template <typename T, bool BWD>
static int act_launch(int act, const void *x, const void *dy, void *y, size_t len, cudaStream_t s)
{
    if (len == 0)
        return 0;
    const T *xp = (const T *)x, *dp = (const T *)dy;
    T *yp = (T *)y;
    const int vec = cu_al16(x) && (!BWD || cu_al16(dy)) && cu_al16(y);
    switch (act) {
    case SF_CUDA_ACT_RELU6: act_launch_t<T, BWD, SF_CUDA_ACT_RELU6>(xp, dp, yp, len, vec, s); break;
    case SF_CUDA_ACT_SIGMOID: act_launch_t<T, BWD, SF_CUDA_ACT_SIGMOID>(xp, dp, yp, len, vec, s); break;
    case SF_CUDA_ACT_SILU: act_launch_t<T, BWD, SF_CUDA_ACT_SILU>(xp, dp, yp, len, vec, s); break;
    case SF_CUDA_ACT_HARDSWISH: act_launch_t<T, BWD, SF_CUDA_ACT_HARDSWISH>(xp, dp, yp, len, vec, s); break;
    case SF_CUDA_ACT_HARDSIGMOID: act_launch_t<T, BWD, SF_CUDA_ACT_HARDSIGMOID>(xp, dp, yp, len, vec, s); break;
    case SF_CUDA_ACT_GELU_TANH: act_launch_t<T, BWD, SF_CUDA_ACT_GELU_TANH>(xp, dp, yp, len, vec, s); break;
    default: act_launch_t<T, BWD, SF_CUDA_ACT_GELU>(xp, dp, yp, len, vec, s); break;
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

static int act_bad(const char *fn, sf_cuda_act act)
{
    if ((int)act >= 0 && act <= SF_CUDA_ACT_GELU_TANH)
        return 0;
    sf_cuda_set_error("%s:%d: %s: unknown activation %d", __FILE__, __LINE__, fn, (int)act);
    return 1;
}

extern "C" int sf_cuda_act_fwd_dt(sf_dtype dt, sf_cuda_act act, const void *x, void *y, size_t len, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_act_fwd_dt", dt) || act_bad("sf_cuda_act_fwd_dt", act))
        return -1;
    return dt == SF_DT_BF16 ? act_launch<cu_bf16, false>(act, x, NULL, y, len, s)
                            : act_launch<float, false>(act, x, NULL, y, len, s);
}

extern "C" int sf_cuda_act_bwd_dt(sf_dtype dt, sf_cuda_act act, const void *x, const void *dy, void *dx, size_t len,
                                  cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_act_bwd_dt", dt) || act_bad("sf_cuda_act_bwd_dt", act))
        return -1;
    return dt == SF_DT_BF16 ? act_launch<cu_bf16, true>(act, x, dy, dx, len, s)
                            : act_launch<float, true>(act, x, dy, dx, len, s);
}
