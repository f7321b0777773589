/* gpu/cuda/activation.cu — kernels first, then launchers: ReLU6, sigmoid,
 * SiLU, hardswish, hardsigmoid, GELU (erf, tanh), tanh, leaky ReLU, ELU,
 * SELU, softplus, Mish, the affine layer's scale * x + shift and the clamp
 * layer's bounds, forward and backward, on fp32 or bf16 data: the
 * elementwise kernel k_ew (kernel_common.cuh) with each activation as its
 * element function. Contracts in activation.h; the formulas are
 * gpu/ref/activation.c's. */
#include "gpu/cuda/activation.h"

#include "gpu/cuda/activation.cuh"
#include "gpu/cuda/kernel_common.cuh"

extern "C" {
#include "gpu/ref/layers.h"
}

static_assert((int)SF_CUDA_ACT_RELU6 == SF_ACT_RELU6 && (int)SF_CUDA_ACT_SIGMOID == SF_ACT_SIGMOID &&
                  (int)SF_CUDA_ACT_SILU == SF_ACT_SILU && (int)SF_CUDA_ACT_HARDSWISH == SF_ACT_HARDSWISH &&
                  (int)SF_CUDA_ACT_HARDSIGMOID == SF_ACT_HARDSIGMOID && (int)SF_CUDA_ACT_GELU == SF_ACT_GELU &&
                  (int)SF_CUDA_ACT_GELU_TANH == SF_ACT_GELU_TANH && (int)SF_CUDA_ACT_TANH == SF_ACT_TANH &&
                  (int)SF_CUDA_ACT_LEAKY_RELU == SF_ACT_LEAKY_RELU && (int)SF_CUDA_ACT_ELU == SF_ACT_ELU &&
                  (int)SF_CUDA_ACT_SELU == SF_ACT_SELU && (int)SF_CUDA_ACT_SOFTPLUS == SF_ACT_SOFTPLUS &&
                  (int)SF_CUDA_ACT_MISH == SF_ACT_MISH && (int)SF_CUDA_ACT_AFFINE == SF_ACT_AFFINE &&
                  (int)SF_CUDA_ACT_CLAMP == SF_ACT_CLAMP && (int)SF_CUDA_ACT_SQUARE == SF_ACT_SQUARE,
              "the activation codes are the reference's");
static_assert(sizeof(sf_cuda_act_prm) == sizeof(sf_act_prm) &&
                  offsetof(sf_cuda_act_prm, a) == offsetof(sf_act_prm, a) &&
                  offsetof(sf_cuda_act_prm, b) == offsetof(sf_act_prm, b) &&
                  offsetof(sf_cuda_act_prm, c) == offsetof(sf_act_prm, c),
              "an activation's parameters are laid out as the reference's");
static_assert(SELU_ALPHA == (float)SF_SELU_ALPHA && SELU_SCALE == (float)SF_SELU_SCALE,
              "SELU's constants are the reference's");

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* The activation ACT as k_ew's element function (kernel_common.cuh): a
 * compile-time choice, so that k_ew's loop is straight-line code (a switch on
 * a run-time code per element kept the erf GELU's loop from being scheduled
 * across elements, and k_ew keeps CU_UNROLL vectors' loads in flight to cover
 * the erf's arithmetic). Forward: f(x); backward (a = x, b = dy): dy * f'(x).
 * The parameters (leaky ReLU's slope, ELU's alpha, softplus's beta and
 * threshold) travel in the functor, a kernel argument. */
template <int ACT> struct op_act_fwd {
    sf_cuda_act_prm prm;
    __device__ __forceinline__ float operator()(float x, float) const { return act_f_t<ACT>(x, prm); }
};
template <int ACT> struct op_act_bwd {
    sf_cuda_act_prm prm;
    __device__ __forceinline__ float operator()(float x, float d) const
    {
        if constexpr (ACT == SF_CUDA_ACT_CLAMP)
            return act_clamp_passes(x, prm) ? d : 0.f; /* PyTorch selects: +0, even where dy is not finite */
        else
            return d * act_d_t<ACT>(x, prm);
    }
};

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

template <typename T, bool BWD, int ACT>
static int act_launch_t(sf_cuda_act_prm prm, const T *x, const T *dy, T *y, size_t len, cudaStream_t s)
{
    if constexpr (BWD)
        return cu_ew_launch<T, 2>(x, dy, y, len, op_act_bwd<ACT>{prm}, s);
    else
        return cu_ew_launch<T, 1>(x, (const T *)NULL, y, len, op_act_fwd<ACT>{prm}, s);
}

/* One kernel per activation: the run-time code picks the instance once here. */
template <typename T, bool BWD>
static int act_launch(int act, sf_cuda_act_prm prm, const void *x, const void *dy, void *y, size_t len,
                      cudaStream_t s)
{
    const T *xp = (const T *)x, *dp = (const T *)dy;
    T *yp = (T *)y;
    switch (act) {
    case SF_CUDA_ACT_RELU6: return act_launch_t<T, BWD, SF_CUDA_ACT_RELU6>(prm, xp, dp, yp, len, s);
    case SF_CUDA_ACT_SIGMOID: return act_launch_t<T, BWD, SF_CUDA_ACT_SIGMOID>(prm, xp, dp, yp, len, s);
    case SF_CUDA_ACT_SILU: return act_launch_t<T, BWD, SF_CUDA_ACT_SILU>(prm, xp, dp, yp, len, s);
    case SF_CUDA_ACT_HARDSWISH: return act_launch_t<T, BWD, SF_CUDA_ACT_HARDSWISH>(prm, xp, dp, yp, len, s);
    case SF_CUDA_ACT_HARDSIGMOID: return act_launch_t<T, BWD, SF_CUDA_ACT_HARDSIGMOID>(prm, xp, dp, yp, len, s);
    case SF_CUDA_ACT_GELU_TANH: return act_launch_t<T, BWD, SF_CUDA_ACT_GELU_TANH>(prm, xp, dp, yp, len, s);
    case SF_CUDA_ACT_TANH: return act_launch_t<T, BWD, SF_CUDA_ACT_TANH>(prm, xp, dp, yp, len, s);
    case SF_CUDA_ACT_LEAKY_RELU: return act_launch_t<T, BWD, SF_CUDA_ACT_LEAKY_RELU>(prm, xp, dp, yp, len, s);
    case SF_CUDA_ACT_ELU: return act_launch_t<T, BWD, SF_CUDA_ACT_ELU>(prm, xp, dp, yp, len, s);
    case SF_CUDA_ACT_SELU: return act_launch_t<T, BWD, SF_CUDA_ACT_SELU>(prm, xp, dp, yp, len, s);
    case SF_CUDA_ACT_SOFTPLUS: return act_launch_t<T, BWD, SF_CUDA_ACT_SOFTPLUS>(prm, xp, dp, yp, len, s);
    case SF_CUDA_ACT_MISH: return act_launch_t<T, BWD, SF_CUDA_ACT_MISH>(prm, xp, dp, yp, len, s);
    case SF_CUDA_ACT_AFFINE: return act_launch_t<T, BWD, SF_CUDA_ACT_AFFINE>(prm, xp, dp, yp, len, s);
    case SF_CUDA_ACT_CLAMP: return act_launch_t<T, BWD, SF_CUDA_ACT_CLAMP>(prm, xp, dp, yp, len, s);
    case SF_CUDA_ACT_SQUARE: return act_launch_t<T, BWD, SF_CUDA_ACT_SQUARE>(prm, xp, dp, yp, len, s);
    default: return act_launch_t<T, BWD, SF_CUDA_ACT_GELU>(prm, xp, dp, yp, len, s);
    }
}

static int act_bad(const char *fn, sf_cuda_act act)
{
    if ((int)act >= 0 && act <= SF_CUDA_ACT_LAST)
        return 0;
    sf_cuda_set_error("%s:%d: %s: unknown activation %d", __FILE__, __LINE__, fn, (int)act);
    return 1;
}

extern "C" int sf_cuda_act_fwd_dt(sf_dtype dt, sf_cuda_act act, sf_cuda_act_prm prm, const void *x, void *y,
                                  size_t len, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_act_fwd_dt", dt) || act_bad("sf_cuda_act_fwd_dt", act))
        return -1;
    return dt == SF_DT_BF16 ? act_launch<cu_bf16, false>(act, prm, x, NULL, y, len, s)
                            : act_launch<float, false>(act, prm, x, NULL, y, len, s);
}

extern "C" int sf_cuda_act_bwd_dt(sf_dtype dt, sf_cuda_act act, sf_cuda_act_prm prm, const void *x, const void *dy,
                                  void *dx, size_t len, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_act_bwd_dt", dt) || act_bad("sf_cuda_act_bwd_dt", act))
        return -1;
    return dt == SF_DT_BF16 ? act_launch<cu_bf16, true>(act, prm, x, dy, dx, len, s)
                            : act_launch<float, true>(act, prm, x, dy, dx, len, s);
}
