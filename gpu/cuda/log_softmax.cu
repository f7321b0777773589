/* gpu/cuda/log_softmax.cu — kernels first, then the launchers: log_softmax
 * over the features of a flat tensor. Contract in log_softmax.h. */
#include "gpu/cuda/log_softmax.h"

#include <float.h>

#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* A warp a row (a classifier's row is its classes, as k_xent's in loss.cu):
 * the row's maximum, then the sum of exp(x - max), in fp32 over the lanes. */
constexpr int LSM_ROWS = CU_TPB / 32; /* rows a block */

/* The warp's reduction of v (max or sum), to every lane. */
template <bool MAX> __device__ __forceinline__ float lsm_warp(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? fmaxf(v, u) : v + u;
    }
    return v;
}

/* log(sum(exp(x))) of the row at xr, to every lane of the warp. */
template <typename T> __device__ __forceinline__ float lsm_row_lse(const T *__restrict__ xr, int cols, int lane)
{
    float mx = -FLT_MAX;
    for (int j = lane; j < cols; j += 32)
        mx = fmaxf(mx, cu_f(xr[j]));
    mx = lsm_warp<true>(mx);
    float s = 0.f;
    for (int j = lane; j < cols; j += 32)
        s += __expf(cu_f(xr[j]) - mx);
    return mx + __logf(lsm_warp<false>(s));
}

template <typename T>
__global__ void __launch_bounds__(CU_TPB) k_log_softmax_fwd(const T *x, T *y, int rows, int cols)
{
    const size_t r = (size_t)blockIdx.x * LSM_ROWS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= (size_t)rows)
        return;
    const T *xr = x + r * cols;
    const float lse = lsm_row_lse(xr, cols, lane);
    for (int j = lane; j < cols; j += 32)
        y[r * cols + j] = cu_to<T>(cu_f(xr[j]) - lse);
}

template <typename T>
__global__ void __launch_bounds__(CU_TPB)
    k_log_softmax_bwd(const T *__restrict__ x, const T *dy, T *dx, int rows, int cols)
{
    const size_t r = (size_t)blockIdx.x * LSM_ROWS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= (size_t)rows)
        return;
    const T *xr = x + r * cols, *dr = dy + r * cols;
    const float lse = lsm_row_lse(xr, cols, lane);
    float s = 0.f;
    for (int j = lane; j < cols; j += 32)
        s += cu_f(dr[j]);
    s = lsm_warp<false>(s);
    for (int j = lane; j < cols; j += 32)
        dx[r * cols + j] = cu_to<T>(cu_f(dr[j]) - __expf(cu_f(xr[j]) - lse) * s);
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

static int lsm_bad(const char *fn, sf_dtype dt, int rows, int cols)
{
    if (cu_dt_bad(fn, dt))
        return 1;
    if (rows < 0 || cols < 1) {
        sf_cuda_set_error("%s:%d: %s: %d rows of %d features", __FILE__, __LINE__, fn, rows, cols);
        return 1;
    }
    return 0;
}

extern "C" int sf_cuda_log_softmax_fwd_dt(sf_dtype dt, const void *x, void *y, int rows, int cols, cudaStream_t s)
{
    if (lsm_bad("sf_cuda_log_softmax_fwd_dt", dt, rows, cols))
        return -1;
    if (rows == 0)
        return 0;
    const unsigned blocks = (unsigned)cu_cdiv((size_t)rows, LSM_ROWS);
    if (dt == SF_DT_BF16)
        k_log_softmax_fwd<cu_bf16><<<blocks, CU_TPB, 0, s>>>((const cu_bf16 *)x, (cu_bf16 *)y, rows, cols);
    else
        k_log_softmax_fwd<float><<<blocks, CU_TPB, 0, s>>>((const float *)x, (float *)y, rows, cols);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_log_softmax_bwd_dt(sf_dtype dt, const void *x, const void *dy, void *dx, int rows, int cols,
                                          cudaStream_t s)
{
    if (lsm_bad("sf_cuda_log_softmax_bwd_dt", dt, rows, cols))
        return -1;
    if (rows == 0)
        return 0;
    const unsigned blocks = (unsigned)cu_cdiv((size_t)rows, LSM_ROWS);
    if (dt == SF_DT_BF16)
        k_log_softmax_bwd<cu_bf16><<<blocks, CU_TPB, 0, s>>>((const cu_bf16 *)x, (const cu_bf16 *)dy, (cu_bf16 *)dx,
                                                              rows, cols);
    else
        k_log_softmax_bwd<float><<<blocks, CU_TPB, 0, s>>>((const float *)x, (const float *)dy, (float *)dx, rows,
                                                            cols);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}
