/* gpu/cuda/grn.cu — kernels first, then launchers: Global Response
 * Normalization, forward and backward (contracts in grn.h).
 *
 * The per-(sample, channel) sums (the norms, and the backward's sums of dy * x
 * and dy) take a block per NCHW plane, or per sample and 32 channels of an
 * NHWC map (a lane a channel, the warps striding the rows); each thread sums
 * in a fixed order, then the block in a fixed order. The per-sample steps
 * (the divisor, the input gradient's coefficients) take a block per sample;
 * the parameters' gradients a thread per channel walking the samples. */
#include "gpu/cuda/grn.h"

#include "gpu/cuda/kernel_common.cuh"

#define GRN_WARPS (CU_TPB / 32)

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* The block's CU_TPB partials v summed in thread order; thread 0 gets it. */
__device__ __forceinline__ float grn_block_sum(float v, float *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    float s = 0.f;
    if (threadIdx.x == 0)
        for (int t = 0; t < CU_TPB; t++)
            s += sh[t];
    __syncthreads();
    return s;
}

/* Per (sample, channel): s0 = sum of a * b over the positions, and (TWO)
 * s1 = sum of b. The norms: a = b = x; the backward: a = x, b = dy. */
template <typename T, bool TWO>
__global__ void __launch_bounds__(CU_TPB)
    k_grn_sums_nchw(const T *__restrict__ a, const T *__restrict__ b, size_t hw, float *__restrict__ s0,
                    float *__restrict__ s1)
{
    __shared__ float sh[CU_TPB];
    const size_t plane = blockIdx.x;
    const T *pa = a + plane * hw, *pb = b + plane * hw;
    float u = 0.f, v = 0.f;
    for (size_t p = threadIdx.x; p < hw; p += CU_TPB) {
        const float fb = cu_f(pb[p]);
        u += cu_f(pa[p]) * fb;
        v += fb;
    }
    u = grn_block_sum(u, sh);
    if (TWO)
        v = grn_block_sum(v, sh);
    if (threadIdx.x == 0) {
        s0[plane] = u;
        if (TWO)
            s1[plane] = v;
    }
}

template <typename T, bool TWO>
__global__ void __launch_bounds__(CU_TPB)
    k_grn_sums_nhwc(const T *__restrict__ a, const T *__restrict__ b, int c, size_t hw, float *__restrict__ s0,
                    float *__restrict__ s1)
{
    __shared__ float su[GRN_WARPS][32], sv[GRN_WARPS][32];
    const int tiles = (c + 31) / 32;
    const int ni = blockIdx.x / tiles, ch = (blockIdx.x % tiles) * 32 + (threadIdx.x & 31), w = threadIdx.x >> 5;
    float u = 0.f, v = 0.f;
    if (ch < c) {
        const size_t base = (size_t)ni * hw * c + ch;
        for (size_t p = w; p < hw; p += GRN_WARPS) {
            const float fb = cu_f(b[base + p * c]);
            u += cu_f(a[base + p * c]) * fb;
            v += fb;
        }
    }
    su[w][threadIdx.x & 31] = u;
    sv[w][threadIdx.x & 31] = v;
    __syncthreads();
    if (w != 0 || ch >= c)
        return;
    float tu = 0.f, tv = 0.f;
    for (int k = 0; k < GRN_WARPS; k++) {
        tu += su[k][threadIdx.x];
        tv += sv[k][threadIdx.x];
    }
    s0[(size_t)ni * c + ch] = tu;
    if (TWO)
        s1[(size_t)ni * c + ch] = tv;
}

/* Block ni: the norms g = sqrt(the sums of squares in place), and d[ni] = their
 * mean plus eps. */
__global__ void __launch_bounds__(CU_TPB) k_grn_norms(float *__restrict__ g, float *__restrict__ d, int c, float eps)
{
    __shared__ float sh[CU_TPB];
    float *gs = g + (size_t)blockIdx.x * c;
    float s = 0.f;
    for (int ci = threadIdx.x; ci < c; ci += CU_TPB) {
        const float v = sqrtf(gs[ci]);
        gs[ci] = v;
        s += v;
    }
    s = grn_block_sum(s, sh);
    if (threadIdx.x == 0)
        d[blockIdx.x] = s / (float)c + eps;
}

/* The channel of element e of an [n, c, hw] tensor, and its (sample, channel) row. */
__device__ __forceinline__ size_t grn_row(size_t e, int c, size_t hw, int nhwc, int *ch)
{
    if (nhwc) {
        *ch = (int)(e % (size_t)c);
        return (e / ((size_t)c * hw)) * c + *ch;
    }
    const size_t r = e / hw;
    *ch = (int)(r % (size_t)c);
    return r;
}

/* Element e's factor 1 + w g / d, its (sample, channel) row r and channel. */
__device__ __forceinline__ float grn_factor(size_t e, int c, size_t hw, int nhwc, const float *__restrict__ w,
                                            const float *__restrict__ g, const float *__restrict__ d, size_t *r,
                                            int *ch)
{
    *r = grn_row(e, c, hw, nhwc, ch);
    return 1.f + w[*ch] * (g[*r] / d[*r / c]);
}

/* y = x * (1 + w g / d) + b. */
template <typename T>
__global__ void k_grn_apply(const T *__restrict__ x, size_t len, int c, size_t hw, int nhwc,
                            const float *__restrict__ w, const float *__restrict__ b, const float *__restrict__ g,
                            const float *__restrict__ d, T *__restrict__ y)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        int ch;
        size_t r;
        const float f = grn_factor(e, c, hw, nhwc, w, g, d, &r, &ch);
        y[e] = cu_to<T>(cu_f(x[e]) * f + b[ch]);
    }
}

/* Block ni: k[ni][c] from the sums of dy * x (sdx), the norms and d. */
__global__ void __launch_bounds__(CU_TPB)
    k_grn_coef(const float *__restrict__ sdx, const float *__restrict__ g, const float *__restrict__ d,
               const float *__restrict__ w, int c, float *__restrict__ k)
{
    __shared__ float sh[CU_TPB];
    __shared__ float ag_sh;
    const size_t o = (size_t)blockIdx.x * c;
    float s = 0.f;
    for (int ci = threadIdx.x; ci < c; ci += CU_TPB)
        s += w[ci] * sdx[o + ci] * g[o + ci];
    s = grn_block_sum(s, sh);
    if (threadIdx.x == 0)
        ag_sh = s;
    __syncthreads();
    const float dn = d[blockIdx.x], ag = ag_sh;
    for (int ci = threadIdx.x; ci < c; ci += CU_TPB) {
        const float gi = g[o + ci];
        const float dg = w[ci] * sdx[o + ci] / dn - ag / ((float)c * dn * dn);
        k[o + ci] = gi > 0.f ? dg / gi : 0.f;
    }
}

/* dx = dy * (1 + w g / d) + k x. */
template <typename T>
__global__ void k_grn_dx(const T *__restrict__ x, const T *__restrict__ dy, size_t len, int c, size_t hw, int nhwc,
                         const float *__restrict__ w, const float *__restrict__ g, const float *__restrict__ d,
                         const float *__restrict__ k, T *__restrict__ dx)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        int ch;
        size_t r;
        const float f = grn_factor(e, c, hw, nhwc, w, g, d, &r, &ch);
        dx[e] = cu_to<T>(cu_f(dy[e]) * f + k[r] * cu_f(x[e]));
    }
}

/* Channel ch: dw = sum over the samples of sdx g / d, db = of sd. */
__global__ void k_grn_dparams(const float *__restrict__ sdx, const float *__restrict__ sd,
                              const float *__restrict__ g, const float *__restrict__ d, int n, int c,
                              float *__restrict__ dw, float *__restrict__ db)
{
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c)
        return;
    float sw = 0.f, sb = 0.f;
    for (int ni = 0; ni < n; ni++) {
        const size_t r = (size_t)ni * c + ch;
        sw += sdx[r] * (g[r] / d[ni]);
        sb += sd[r];
    }
    dw[ch] = sw;
    db[ch] = sb;
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

extern "C" size_t sf_cuda_grn_save_floats(int n, int c) { return n > 0 && c > 0 ? (size_t)n * c + n : 0; }

extern "C" size_t sf_cuda_grn_scratch_bytes(int n, int c) { return 3 * sizeof(float) * (size_t)(n > 0 ? n : 0) * c; }

static int grn_bad(const char *fn, sf_dtype dt, int n, int c, size_t hw)
{
    if (cu_dt_bad(fn, dt))
        return 1;
    if (n < 0 || c < 1 || hw < 1 || (long long)n * c > 0x7fffffffLL || (double)n * c * hw >= 9.0e15) {
        sf_cuda_set_error("%s:%d: %s: n %d, %d channels, %zu positions", __FILE__, __LINE__, fn, n, c, hw);
        return 1;
    }
    return 0;
}

/* The per-(sample, channel) sums s0 (of a * b) and s1 (of b, when wanted). */
template <typename T>
static void grn_sums(sf_layout lay, const T *a, const T *b, int n, int c, size_t hw, float *s0, float *s1,
                     cudaStream_t s)
{
    if (lay == SF_LAYOUT_NHWC && hw > 1) {
        const unsigned grid = (unsigned)n * (unsigned)((c + 31) / 32);
        if (s1)
            k_grn_sums_nhwc<T, true><<<grid, CU_TPB, 0, s>>>(a, b, c, hw, s0, s1);
        else
            k_grn_sums_nhwc<T, false><<<grid, CU_TPB, 0, s>>>(a, b, c, hw, s0, s1);
    } else if (s1) {
        k_grn_sums_nchw<T, true><<<(unsigned)((size_t)n * c), CU_TPB, 0, s>>>(a, b, hw, s0, s1);
    } else {
        k_grn_sums_nchw<T, false><<<(unsigned)((size_t)n * c), CU_TPB, 0, s>>>(a, b, hw, s0, s1);
    }
}

template <typename T>
static int grn_fwd_t(sf_layout lay, const T *x, int n, int c, size_t hw, const float *w, const float *b, float eps,
                     T *y, float *save, cudaStream_t s)
{
    float *g = save, *d = save + (size_t)n * c;
    const size_t len = (size_t)n * c * hw;
    grn_sums<T>(lay, x, x, n, c, hw, g, NULL, s);
    SF_CUDA_CHECK_LAUNCH();
    k_grn_norms<<<(unsigned)n, CU_TPB, 0, s>>>(g, d, c, eps);
    SF_CUDA_CHECK_LAUNCH();
    k_grn_apply<T><<<cu_ew_blocks(len), CU_TPB, 0, s>>>(x, len, c, hw, lay == SF_LAYOUT_NHWC, w, b, g, d, y);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int grn_bwd_t(sf_layout lay, const T *x, const T *dy, int n, int c, size_t hw, const float *w,
                     const float *save, T *dx, float *dw, float *db, float *scratch, cudaStream_t s)
{
    const float *g = save, *d = save + (size_t)n * c;
    float *sdx = scratch, *sd = scratch + (size_t)n * c, *k = scratch + 2 * (size_t)n * c;
    const size_t len = (size_t)n * c * hw;
    grn_sums<T>(lay, x, dy, n, c, hw, sdx, sd, s);
    SF_CUDA_CHECK_LAUNCH();
    if (dx) {
        k_grn_coef<<<(unsigned)n, CU_TPB, 0, s>>>(sdx, g, d, w, c, k);
        SF_CUDA_CHECK_LAUNCH();
        k_grn_dx<T><<<cu_ew_blocks(len), CU_TPB, 0, s>>>(x, dy, len, c, hw, lay == SF_LAYOUT_NHWC, w, g, d, k, dx);
        SF_CUDA_CHECK_LAUNCH();
    }
    if (dw) {
        k_grn_dparams<<<cu_blocks((size_t)c, CU_TPB), CU_TPB, 0, s>>>(sdx, sd, g, d, n, c, dw, db);
        SF_CUDA_CHECK_LAUNCH();
    }
    return 0;
}

extern "C" int sf_cuda_grn_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, size_t hw, const float *w,
                                  const float *b, float eps, void *y, float *save, cudaStream_t s)
{
    if (grn_bad("sf_cuda_grn_fwd_dt", dt, n, c, hw))
        return -1;
    if (n == 0)
        return 0;
    if (dt == SF_DT_BF16)
        return grn_fwd_t<cu_bf16>(lay, (const cu_bf16 *)x, n, c, hw, w, b, eps, (cu_bf16 *)y, save, s);
    return grn_fwd_t<float>(lay, (const float *)x, n, c, hw, w, b, eps, (float *)y, save, s);
}

extern "C" int sf_cuda_grn_bwd_dt(sf_dtype dt, sf_layout lay, const void *x, const void *dy, int n, int c, size_t hw,
                                  const float *w, const float *save, void *dx, float *dw, float *db, void *scratch,
                                  cudaStream_t s)
{
    const char *fn = "sf_cuda_grn_bwd_dt";
    if (grn_bad(fn, dt, n, c, hw))
        return -1;
    if (!dw != !db || (n > 0 && !scratch)) {
        sf_cuda_set_error("%s:%d: %s: the weight and bias gradients need each other, and scratch", __FILE__,
                          __LINE__, fn);
        return -1;
    }
    if (n == 0)
        return 0;
    if (dt == SF_DT_BF16)
        return grn_bwd_t<cu_bf16>(lay, (const cu_bf16 *)x, (const cu_bf16 *)dy, n, c, hw, w, save, (cu_bf16 *)dx, dw,
                                  db, (float *)scratch, s);
    return grn_bwd_t<float>(lay, (const float *)x, (const float *)dy, n, c, hw, w, save, (float *)dx, dw, db,
                            (float *)scratch, s);
}
