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
    const float s = cu_block_sum(acc, sh);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = s;
}

/* Pass 1, a slope per channel: kernel_common.cuh's k_chan_sum_planes (NCHW)
 * and k_chan_sum_rows (NHWC or flat features) of this term. */
struct prelu_term {
    __device__ float operator()(float x, float d) const { return prelu_g(x, d); }
};

/* Pass 2 is k_sum_partials (kernel_common.cuh). */

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

/* One slope needs PR_MAX_CHUNKS, less than either of the per-channel passes. */
extern "C" size_t sf_cuda_prelu_scratch(int c) { return cu_chan_sum_scratch(c, PR_MAX_CHUNKS); }

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
        const size_t R = (size_t)n * hw;
        size_t rpc;
        const int nchunks = cu_row_chunks(R, PR_MAX_CHUNKS, &rpc);
        const dim3 grid(cu_blocks((size_t)c, CU_TPB), (unsigned)nchunks);
        k_chan_sum_rows<T><<<grid, CU_TPB, 0, s>>>(x, dy, R, c, rpc, scratch, prelu_term());
        return nchunks;
    }
    int npc;
    const int nchunks = cu_plane_chunks(n, c, &npc);
    k_chan_sum_planes<T><<<dim3((unsigned)c, (unsigned)nchunks), CU_TPB, 0, s>>>(x, dy, n, c, hw, npc, scratch,
                                                                                 prelu_term());
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
