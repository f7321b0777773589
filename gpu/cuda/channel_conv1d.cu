/* gpu/cuda/channel_conv1d.cu — kernels first, then launchers: ECA's
 * one-channel 1-D convolution across a sample's channels, its input
 * gradient and its parameters' gradient (a fixed-order two-pass reduction,
 * as prelu.cu's). Contracts in channel_conv1d.h; the arithmetic is
 * gpu/ref/channel_conv1d.c's. The tensors are small (a batch of pooled
 * channels), so one thread per output value reading its k taps suffices. */
#include "gpu/cuda/channel_conv1d.h"

#include "gpu/cuda/kernel_common.cuh"

/* Chunks of the parameters' reduction's first pass at most, per tap. */
#define CC_MAX_CHUNKS 256

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* out[n][i] = (b ? b[0] : 0) + sum over j of w[j] * in[n][i + sign * (j - pad)]:
 * the forward with sign 1, the input gradient (the kernel flipped) with
 * sign -1. */
template <typename T>
__global__ void k_cc1d(const T *__restrict__ in, const float *__restrict__ w, const float *__restrict__ b, T *out,
                       size_t len, int c, int k, int pad, int sign)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        const int i = (int)(e % (size_t)c);
        const size_t row = e - (size_t)i;
        float acc = b ? b[0] : 0.f;
        for (int j = 0; j < k; j++) {
            const int s = i + sign * (j - pad);
            if (s >= 0 && s < c)
                acc += w[j] * cu_f(in[row + (size_t)s]);
        }
        out[e] = cu_to<T>(acc);
    }
}

/* The parameters' gradient, pass 1: block (chunk, j) sums the elements
 * [chunk * per_chunk, ...) of dy times x shifted by tap j (j == k: the
 * bias, times 1) into partial[chunk][j] of k + 1. */
template <typename T>
__global__ void k_cc1d_dw(const T *__restrict__ x, const T *__restrict__ dy, size_t len, int c, int k, int pad,
                          size_t per_chunk, float *__restrict__ partial)
{
    __shared__ float sh[CU_TPB / 32];
    const int j = blockIdx.y;
    const size_t e0 = (size_t)blockIdx.x * per_chunk, e1 = e0 + per_chunk < len ? e0 + per_chunk : len;
    float acc = 0.f;
    for (size_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
        const float d = cu_f(dy[e]);
        if (j == k) {
            acc += d;
            continue;
        }
        const int i = (int)(e % (size_t)c), s = i + j - pad;
        if (s >= 0 && s < c)
            acc += d * cu_f(x[e - (size_t)i + (size_t)s]);
    }
    const float sum = cu_block_sum(acc, sh);
    if (threadIdx.x == 0)
        partial[(size_t)blockIdx.x * (k + 1) + j] = sum;
}

/* Pass 2 is k_sum_partials (kernel_common.cuh). */

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

extern "C" size_t sf_cuda_channel_conv1d_scratch(int k) { return (size_t)CC_MAX_CHUNKS * (size_t)(k + 1); }

static int cc1d_bad(const char *fn, sf_dtype dt, int k, int pad)
{
    if (cu_dt_bad(fn, dt))
        return 1;
    if (k >= 1 && k == 2 * pad + 1)
        return 0;
    sf_cuda_set_error("%s:%d: %s: k %d, pad %d (k must be 2 * pad + 1)", __FILE__, __LINE__, fn, k, pad);
    return 1;
}

template <typename T>
static int cc1d_fwd_t(const void *x, const float *w, const float *b, int k, int pad, void *y, int n, int c,
                      cudaStream_t s)
{
    const size_t len = (size_t)n * c;
    if (len == 0)
        return 0;
    k_cc1d<T><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const T *)x, w, b, (T *)y, len, c, k, pad, 1);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int cc1d_bwd_t(const void *x, const float *w, int k, int pad, const void *dy, void *dx, float *dw, float *db,
                      int n, int c, float *scratch, cudaStream_t s)
{
    const size_t len = (size_t)n * c;
    if (len == 0) {
        SF_CUDA_CHECK(cudaMemsetAsync(dw, 0, sizeof(float) * (size_t)k, s));
        if (db)
            SF_CUDA_CHECK(cudaMemsetAsync(db, 0, sizeof(float), s));
        return 0;
    }
    const size_t per = cu_cdiv(len, CC_MAX_CHUNKS) > CU_TPB ? cu_cdiv(len, CC_MAX_CHUNKS) : CU_TPB;
    const int nchunks = (int)cu_cdiv(len, per);
    k_cc1d_dw<T><<<dim3((unsigned)nchunks, (unsigned)(k + 1)), CU_TPB, 0, s>>>((const T *)x, (const T *)dy, len, c, k,
                                                                             pad, per, scratch);
    SF_CUDA_CHECK_LAUNCH();
    k_sum_partials<float><<<cu_blocks((size_t)(k + 1) * 32, CU_TPB), CU_TPB, 0, s>>>(scratch, nchunks, k, k + 1, dw,
                                                                                     db);
    SF_CUDA_CHECK_LAUNCH();
    if (dx) {
        k_cc1d<T><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const T *)dy, w, NULL, (T *)dx, len, c, k, pad, -1);
        SF_CUDA_CHECK_LAUNCH();
    }
    return 0;
}

extern "C" int sf_cuda_channel_conv1d_fwd_dt(sf_dtype dt, const void *x, const float *w, const float *b, int k,
                                             int pad, void *y, int n, int c, cudaStream_t s)
{
    if (cc1d_bad("sf_cuda_channel_conv1d_fwd_dt", dt, k, pad))
        return -1;
    return dt == SF_DT_BF16 ? cc1d_fwd_t<cu_bf16>(x, w, b, k, pad, y, n, c, s)
                            : cc1d_fwd_t<float>(x, w, b, k, pad, y, n, c, s);
}

extern "C" int sf_cuda_channel_conv1d_bwd_dt(sf_dtype dt, const void *x, const float *w, int k, int pad,
                                             const void *dy, void *dx, float *dw, float *db, int n, int c,
                                             float *scratch, cudaStream_t s)
{
    if (cc1d_bad("sf_cuda_channel_conv1d_bwd_dt", dt, k, pad))
        return -1;
    return dt == SF_DT_BF16 ? cc1d_bwd_t<cu_bf16>(x, w, k, pad, dy, dx, dw, db, n, c, scratch, s)
                            : cc1d_bwd_t<float>(x, w, k, pad, dy, dx, dw, db, n, c, scratch, s);
}
