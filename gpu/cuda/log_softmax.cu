/* gpu/cuda/log_softmax.cu — kernels first, then the launchers: log_softmax
 * over the features of a flat tensor. Contract in log_softmax.h. */
#include "gpu/cuda/log_softmax.h"

#include <float.h>

#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* The block's reduction of v (max or sum) over CU_TPB threads, to every thread. */
template <bool MAX>
__device__ __forceinline__ float lsm_block_reduce(float v, float *sh)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? fmaxf(v, u) : v + u;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* sh is reused by the next reduction */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < CU_TPB / 32 ? sh[lane] : (MAX ? -FLT_MAX : 0.f);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? fmaxf(v, u) : v + u;
    }
    return v;
}

/* log(sum(exp(x))) of row r, to every thread of the block. */
template <typename T>
__device__ __forceinline__ float lsm_row_lse(const T *__restrict__ xr, int cols, float *sh)
{
    float mx = -FLT_MAX;
    for (int j = threadIdx.x; j < cols; j += CU_TPB)
        mx = fmaxf(mx, cu_f(xr[j]));
    mx = lsm_block_reduce<true>(mx, sh);
    float s = 0.f;
    for (int j = threadIdx.x; j < cols; j += CU_TPB)
        s += __expf(cu_f(xr[j]) - mx);
    s = lsm_block_reduce<false>(s, sh);
    return mx + __logf(s);
}

template <typename T>
__global__ void __launch_bounds__(CU_TPB) k_log_softmax_fwd(const T *x, T *y, int cols)
{
    __shared__ float sh[CU_TPB / 32];
    const size_t r = blockIdx.x;
    const T *xr = x + r * cols;
    const float lse = lsm_row_lse(xr, cols, sh);
    for (int j = threadIdx.x; j < cols; j += CU_TPB)
        y[r * cols + j] = cu_to<T>(cu_f(xr[j]) - lse);
}

template <typename T>
__global__ void __launch_bounds__(CU_TPB) k_log_softmax_bwd(const T *__restrict__ x, const T *dy, T *dx, int cols)
{
    __shared__ float sh[CU_TPB / 32];
    const size_t r = blockIdx.x;
    const T *xr = x + r * cols, *dr = dy + r * cols;
    const float lse = lsm_row_lse(xr, cols, sh);
    float s = 0.f;
    for (int j = threadIdx.x; j < cols; j += CU_TPB)
        s += cu_f(dr[j]);
    s = lsm_block_reduce<false>(s, sh);
    for (int j = threadIdx.x; j < cols; j += CU_TPB)
        dx[r * cols + j] = cu_to<T>(cu_f(dr[j]) - __expf(cu_f(xr[j]) - lse) * s);
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

static int lsm_bad(const char *fn, sf_dtype dt, int rows, int cols)
{
    if (cu_dt_bad(fn, dt))
        return 1;
    /* one block a row: the grid's x dimension holds 2^31 - 1 */
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
    if (dt == SF_DT_BF16)
        k_log_softmax_fwd<cu_bf16><<<rows, CU_TPB, 0, s>>>((const cu_bf16 *)x, (cu_bf16 *)y, cols);
    else
        k_log_softmax_fwd<float><<<rows, CU_TPB, 0, s>>>((const float *)x, (float *)y, cols);
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
    if (dt == SF_DT_BF16)
        k_log_softmax_bwd<cu_bf16><<<rows, CU_TPB, 0, s>>>((const cu_bf16 *)x, (const cu_bf16 *)dy, (cu_bf16 *)dx,
                                                            cols);
    else
        k_log_softmax_bwd<float><<<rows, CU_TPB, 0, s>>>((const float *)x, (const float *)dy, (float *)dx, cols);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}
