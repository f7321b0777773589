/* gpu/cuda/prelu.cu — kernels first, then launchers: PReLU's forward, its
 * input gradient and its slopes' gradient (a fixed-order two-pass
 * reduction, as the layer scale's in mul.cu). Contracts in prelu.h; the
 * arithmetic is gpu/ref/prelu.c's. */
#include "gpu/cuda/prelu.h"

#include "gpu/cuda/kernel_common.cuh"

/* Chunks of the slopes' reduction's first pass at most: the partial sums
 * then fit sf_cuda_prelu_scratch. */
#define PR_MAX_CHUNKS 512

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* The slope of element e of an [n, c, hw] map: 0 with one slope, else its
 * channel's. */
__device__ __forceinline__ int prelu_j(size_t e, int c, size_t hw, int nhwc, int np)
{
    return np == 1 ? 0 : nhwc ? (int)(e % (size_t)c) : (int)((e / hw) % (size_t)c);
}

/* One element's share of the slope's gradient: x * dy where x is not
 * positive (a NaN included), as PyTorch's prelu_backward. */
__device__ __forceinline__ float prelu_g(float v, float d) { return v > 0.f ? 0.f : v * d; }

/* The sum of acc over a block of CU_TPB threads in a fixed order, in
 * thread 0. */
__device__ __forceinline__ float block_sum(float acc, float *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = acc;
    __syncthreads();
    float s = 0.f;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            s += sh[w];
    return s;
}

template <typename T>
__global__ void k_prelu_fwd(const T *x, const float *__restrict__ w, T *y, size_t len, int c, size_t hw, int nhwc,
                            int np)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        const float v = cu_f(x[e]);
        y[e] = cu_to<T>(v > 0.f ? v : w[prelu_j(e, c, hw, nhwc, np)] * v);
    }
}

/* dx = x > 0 ? dy : a * dy; dx may alias dy. */
template <typename T>
__global__ void k_prelu_dx(const T *__restrict__ x, const float *__restrict__ w, const T *dy, T *dx, size_t len,
                           int c, size_t hw, int nhwc, int np)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        const float d = cu_f(dy[e]);
        dx[e] = cu_to<T>(cu_f(x[e]) > 0.f ? d : w[prelu_j(e, c, hw, nhwc, np)] * d);
    }
}

/* The slopes' gradient, pass 1, one slope: block b sums the elements
 * [b * per_chunk, (b + 1) * per_chunk) into partial[b]. */
template <typename T>
__global__ void k_prelu_dw_flat(const T *__restrict__ x, const T *__restrict__ dy, size_t len, size_t per_chunk,
                                float *__restrict__ partial)
{
    __shared__ float sh[CU_TPB / 32];
    const size_t e0 = (size_t)blockIdx.x * per_chunk, e1 = e0 + per_chunk < len ? e0 + per_chunk : len;
    float acc = 0.f;
    for (size_t e = e0 + threadIdx.x; e < e1; e += blockDim.x)
        acc += prelu_g(cu_f(x[e]), cu_f(dy[e]));
    const float s = block_sum(acc, sh);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = s;
}

/* Pass 1, a slope per channel, NCHW: block (channel, chunk of samples) sums
 * its samples' planes into partial[chunk][c]. */
template <typename T>
__global__ void k_prelu_dw_planes(const T *__restrict__ x, const T *__restrict__ dy, int n, int c, size_t hw,
                                  int n_per_chunk, float *__restrict__ partial)
{
    __shared__ float sh[CU_TPB / 32];
    const int ci = blockIdx.x;
    const int n0 = blockIdx.y * n_per_chunk, n1 = n0 + n_per_chunk < n ? n0 + n_per_chunk : n;
    float acc = 0.f;
    for (int ni = n0; ni < n1; ni++) {
        const size_t base = ((size_t)ni * c + ci) * hw;
        for (size_t p = threadIdx.x; p < hw; p += blockDim.x)
            acc += prelu_g(cu_f(x[base + p]), cu_f(dy[base + p]));
    }
    const float s = block_sum(acc, sh);
    if (threadIdx.x == 0)
        partial[(size_t)blockIdx.y * c + ci] = s;
}

/* Pass 1, a slope per channel, NHWC or flat features: rows [R, c]; thread
 * (channel) of block (channel group, chunk of rows) sums its chunk's rows
 * into partial[chunk][c]. */
template <typename T>
__global__ void k_prelu_dw_rows(const T *__restrict__ x, const T *__restrict__ dy, size_t R, int c,
                                size_t rows_per_chunk, float *__restrict__ partial)
{
    const int ci = blockIdx.x * blockDim.x + threadIdx.x;
    if (ci >= c)
        return;
    const size_t r0 = (size_t)blockIdx.y * rows_per_chunk;
    const size_t r1 = r0 + rows_per_chunk < R ? r0 + rows_per_chunk : R;
    float acc = 0.f;
    for (size_t r = r0; r < r1; r++)
        acc += prelu_g(cu_f(x[r * (size_t)c + ci]), cu_f(dy[r * (size_t)c + ci]));
    partial[(size_t)blockIdx.y * c + ci] = acc;
}

/* Pass 2 is k_sum_partials (kernel_common.cuh). */

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

extern "C" size_t sf_cuda_prelu_scratch(int c)
{
    const size_t rows = (size_t)PR_MAX_CHUNKS * (size_t)c, planes = c > 1024 ? (size_t)c : 1024 + (size_t)c;
    return rows > planes ? rows : planes; /* one slope: PR_MAX_CHUNKS, less than either */
}

static int prelu_bad(const char *fn, sf_dtype dt, int np, int c)
{
    if (cu_dt_bad(fn, dt))
        return 1;
    if (np == 1 || np == c)
        return 0;
    sf_cuda_set_error("%s:%d: %s: %d slopes for %d channels (1 or the channels)", __FILE__, __LINE__, fn, np, c);
    return 1;
}

template <typename T>
static int prelu_fwd_t(sf_layout lay, const void *x, const float *w, int np, void *y, int n, int c, size_t hw,
                       cudaStream_t s)
{
    const size_t len = (size_t)n * c * hw;
    if (len == 0)
        return 0;
    k_prelu_fwd<T><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const T *)x, w, (T *)y, len, c, hw,
                                                         lay == SF_LAYOUT_NHWC || hw == 1, np);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* The slopes' gradient's first pass; returns the chunks it left. */
template <typename T>
static int prelu_dw_pass1(const T *x, const T *dy, int np, int n, int c, size_t hw, int nhwc, float *scratch,
                          cudaStream_t s)
{
    const size_t len = (size_t)n * c * hw;
    if (np == 1) {
        const size_t per = cu_cdiv(len, PR_MAX_CHUNKS) > CU_TPB ? cu_cdiv(len, PR_MAX_CHUNKS) : CU_TPB;
        const int nchunks = (int)cu_cdiv(len, per);
        k_prelu_dw_flat<T><<<(unsigned)nchunks, CU_TPB, 0, s>>>(x, dy, len, per, scratch);
        return nchunks;
    }
    if (nhwc) { /* rows [n*hw, c] */
        const size_t R = (size_t)n * hw, want = R < PR_MAX_CHUNKS ? R : PR_MAX_CHUNKS;
        const size_t rpc = (R + want - 1) / want;
        const int nchunks = (int)((R + rpc - 1) / rpc);
        const dim3 grid(cu_blocks((size_t)c, CU_TPB), (unsigned)nchunks);
        k_prelu_dw_rows<T><<<grid, CU_TPB, 0, s>>>(x, dy, R, c, rpc, scratch);
        return nchunks;
    }
    int want = c >= 1024 ? 1 : 1024 / c;
    if (want > n)
        want = n;
    const int npc = (n + want - 1) / want;
    const int nchunks = (n + npc - 1) / npc;
    k_prelu_dw_planes<T><<<dim3((unsigned)c, (unsigned)nchunks), CU_TPB, 0, s>>>(x, dy, n, c, hw, npc, scratch);
    return nchunks;
}

template <typename T>
static int prelu_bwd_t(sf_layout lay, const void *x, const float *w, int np, const void *dy, void *dx, float *dw,
                       int n, int c, size_t hw, float *scratch, cudaStream_t s)
{
    const size_t len = (size_t)n * c * hw;
    const int nhwc = lay == SF_LAYOUT_NHWC || hw == 1; /* flat features: rows of c in either layout */
    if (len == 0) {
        SF_CUDA_CHECK(cudaMemsetAsync(dw, 0, sizeof(float) * (size_t)np, s));
        return 0;
    }
    const int nchunks = prelu_dw_pass1<T>((const T *)x, (const T *)dy, np, n, c, hw, nhwc, scratch, s);
    SF_CUDA_CHECK_LAUNCH();
    k_sum_partials<float><<<cu_blocks((size_t)np * 32, CU_TPB), CU_TPB, 0, s>>>(scratch, nchunks, 0, np, NULL, dw);
    SF_CUDA_CHECK_LAUNCH();
    if (dx) {
        k_prelu_dx<T><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const T *)x, w, (const T *)dy, (T *)dx, len, c, hw, nhwc,
                                                            np);
        SF_CUDA_CHECK_LAUNCH();
    }
    return 0;
}

extern "C" int sf_cuda_prelu_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, const float *w, int np, void *y,
                                    int n, int c, size_t hw, cudaStream_t s)
{
    if (prelu_bad("sf_cuda_prelu_fwd_dt", dt, np, c))
        return -1;
    return dt == SF_DT_BF16 ? prelu_fwd_t<cu_bf16>(lay, x, w, np, y, n, c, hw, s)
                            : prelu_fwd_t<float>(lay, x, w, np, y, n, c, hw, s);
}

extern "C" int sf_cuda_prelu_bwd_dt(sf_dtype dt, sf_layout lay, const void *x, const float *w, int np,
                                    const void *dy, void *dx, float *dw, int n, int c, size_t hw, float *scratch,
                                    cudaStream_t s)
{
    if (prelu_bad("sf_cuda_prelu_bwd_dt", dt, np, c))
        return -1;
    return dt == SF_DT_BF16 ? prelu_bwd_t<cu_bf16>(lay, x, w, np, dy, dx, dw, n, c, hw, scratch, s)
                            : prelu_bwd_t<float>(lay, x, w, np, dy, dx, dw, n, c, hw, scratch, s);
}
