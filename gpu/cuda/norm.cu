/* gpu/cuda/norm.cu — kernels first, then launchers: LayerNorm over the
 * channels of each position, forward (statistics saved) and backward (input
 * gradient, then the weight and bias gradients reduced through scratch in a
 * fixed order). Contracts in norm.h.
 *
 * A position's c values are contiguous in NHWC maps and flat tensors (a warp
 * normalises a position, its lanes walking the channels) and hw apart in
 * NCHW maps (a thread normalises a position; neighbouring threads read
 * neighbouring pixels, so each channel's loads coalesce). */
#include "gpu/cuda/norm.h"

#include "gpu/cuda/kernel_common.cuh"

/* Chunks of positions whose weight-gradient partials the contiguous case
 * sums per chunk (a bound on its scratch, set by the shape alone). */
#define LN_CHUNKS 256
#define LN_ROWS_PER_BLOCK 8

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* The sum over a warp, every lane receiving it (butterfly: a fixed order). */
__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Contiguous positions: a warp per position of c values at row * c. */
template <typename T>
__global__ void k_ln_fwd_rows(const T *__restrict__ x, size_t rows, int c, const float *__restrict__ ga,
                              const float *__restrict__ be, float eps, T *__restrict__ y, float *__restrict__ mean,
                              float *__restrict__ rstd)
{
    const size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= rows)
        return; /* the whole warp: row is the same for its lanes */
    const T *p = x + row * c;
    T *q = y + row * c;
    float s = 0.f;
    for (int j = lane; j < c; j += 32)
        s += cu_f(p[j]);
    const float mu = warp_sum(s) / (float)c;
    float v = 0.f;
    for (int j = lane; j < c; j += 32) {
        const float d = cu_f(p[j]) - mu;
        v += d * d;
    }
    const float r = 1.f / sqrtf(warp_sum(v) / (float)c + eps);
    for (int j = lane; j < c; j += 32)
        q[j] = cu_to<T>((cu_f(p[j]) - mu) * r * ga[j] + be[j]);
    if (lane == 0) {
        mean[row] = mu;
        rstd[row] = r;
    }
}

/* NCHW positions: a thread per position (ni, pixel), its c values hw apart. */
template <typename T>
__global__ void k_ln_fwd_strided(const T *__restrict__ x, size_t pos, int c, size_t hw, const float *__restrict__ ga,
                                 const float *__restrict__ be, float eps, T *__restrict__ y, float *__restrict__ mean,
                                 float *__restrict__ rstd)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pos)
        return;
    const size_t base = (i / hw) * (size_t)c * hw + i % hw;
    float s = 0.f;
    for (int j = 0; j < c; j++)
        s += cu_f(x[base + (size_t)j * hw]);
    const float mu = s / (float)c;
    float v = 0.f;
    for (int j = 0; j < c; j++) {
        const float d = cu_f(x[base + (size_t)j * hw]) - mu;
        v += d * d;
    }
    const float r = 1.f / sqrtf(v / (float)c + eps);
    for (int j = 0; j < c; j++)
        y[base + (size_t)j * hw] = cu_to<T>((cu_f(x[base + (size_t)j * hw]) - mu) * r * ga[j] + be[j]);
    mean[i] = mu;
    rstd[i] = r;
}

/* dx of contiguous positions, a warp per position. */
template <typename T>
__global__ void k_ln_dx_rows(const T *__restrict__ x, const T *__restrict__ dy, size_t rows, int c,
                             const float *__restrict__ ga, const float *__restrict__ mean,
                             const float *__restrict__ rstd, T *__restrict__ dx)
{
    const size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    const T *p = x + row * c, *d = dy + row * c;
    const float mu = mean[row], r = rstd[row];
    float mg = 0.f, mgx = 0.f;
    for (int j = lane; j < c; j += 32) {
        const float g = cu_f(d[j]) * ga[j], xh = (cu_f(p[j]) - mu) * r;
        mg += g;
        mgx += g * xh;
    }
    mg = warp_sum(mg) / (float)c;
    mgx = warp_sum(mgx) / (float)c;
    for (int j = lane; j < c; j += 32) {
        const float xh = (cu_f(p[j]) - mu) * r;
        dx[row * c + j] = cu_to<T>(r * (cu_f(d[j]) * ga[j] - mg - xh * mgx));
    }
}

/* dx of NCHW positions, a thread per position. */
template <typename T>
__global__ void k_ln_dx_strided(const T *__restrict__ x, const T *__restrict__ dy, size_t pos, int c, size_t hw,
                                const float *__restrict__ ga, const float *__restrict__ mean,
                                const float *__restrict__ rstd, T *__restrict__ dx)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pos)
        return;
    const size_t base = (i / hw) * (size_t)c * hw + i % hw;
    const float mu = mean[i], r = rstd[i];
    float mg = 0.f, mgx = 0.f;
    for (int j = 0; j < c; j++) {
        const size_t e = base + (size_t)j * hw;
        const float g = cu_f(dy[e]) * ga[j], xh = (cu_f(x[e]) - mu) * r;
        mg += g;
        mgx += g * xh;
    }
    mg /= (float)c;
    mgx /= (float)c;
    for (int j = 0; j < c; j++) {
        const size_t e = base + (size_t)j * hw;
        const float xh = (cu_f(x[e]) - mu) * r;
        dx[e] = cu_to<T>(r * (cu_f(dy[e]) * ga[j] - mg - xh * mgx));
    }
}

/* Weight-gradient partials of contiguous positions: block (32, LN_ROWS_PER_BLOCK)
 * covers 32 channels of chunk blockIdx.y (positions [y*per, (y+1)*per));
 * part_g/part_b [chunk][c]. */
template <typename T>
__global__ void k_ln_wgrad_rows(const T *__restrict__ x, const T *__restrict__ dy, size_t rows, int c, size_t per,
                                const float *__restrict__ mean, const float *__restrict__ rstd,
                                float *__restrict__ part_g, float *__restrict__ part_b)
{
    __shared__ float sg[LN_ROWS_PER_BLOCK][32], sb[LN_ROWS_PER_BLOCK][32];
    const int col = blockIdx.x * 32 + threadIdx.x;
    const size_t r0 = (size_t)blockIdx.y * per;
    const size_t r1 = r0 + per < rows ? r0 + per : rows;
    float g = 0.f, b = 0.f;
    if (col < c)
        for (size_t row = r0 + threadIdx.y; row < r1; row += LN_ROWS_PER_BLOCK) {
            const size_t e = row * c + col;
            const float d = cu_f(dy[e]);
            g += d * (cu_f(x[e]) - mean[row]) * rstd[row];
            b += d;
        }
    sg[threadIdx.y][threadIdx.x] = g;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
        for (int k = 1; k < LN_ROWS_PER_BLOCK; k++) {
            g += sg[k][threadIdx.x];
            b += sb[k][threadIdx.x];
        }
        part_g[(size_t)blockIdx.y * c + col] = g;
        part_b[(size_t)blockIdx.y * c + col] = b;
    }
}

/* Weight-gradient partials of NCHW positions: a block per (sample, channel)
 * plane, blockIdx.x = ni * c + channel; part_g/part_b [ni][c]. */
template <typename T>
__global__ void k_ln_wgrad_strided(const T *__restrict__ x, const T *__restrict__ dy, int c, size_t hw,
                                   const float *__restrict__ mean, const float *__restrict__ rstd,
                                   float *__restrict__ part_g, float *__restrict__ part_b)
{
    __shared__ float sg[CU_TPB], sb[CU_TPB];
    const size_t plane = blockIdx.x, ni = plane / c;
    const T *xp = x + plane * hw, *dp = dy + plane * hw;
    const float *mu = mean + ni * hw, *rs = rstd + ni * hw;
    float g = 0.f, b = 0.f;
    for (size_t p = threadIdx.x; p < hw; p += CU_TPB) {
        const float d = cu_f(dp[p]);
        g += d * (cu_f(xp[p]) - mu[p]) * rs[p];
        b += d;
    }
    sg[threadIdx.x] = g;
    sb[threadIdx.x] = b;
    __syncthreads();
    for (int w = CU_TPB / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            sg[threadIdx.x] += sg[threadIdx.x + w];
            sb[threadIdx.x] += sb[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        part_g[plane] = sg[0];
        part_b[plane] = sb[0];
    }
}

/* dgamma[j], dbeta[j]: the chunks' partials summed in chunk order. */
__global__ void k_ln_wgrad_sum(const float *__restrict__ part_g, const float *__restrict__ part_b, int chunks, int c,
                               float *__restrict__ dgamma, float *__restrict__ dbeta)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c)
        return;
    float g = 0.f, b = 0.f;
    for (int k = 0; k < chunks; k++) {
        g += part_g[(size_t)k * c + j];
        b += part_b[(size_t)k * c + j];
    }
    dgamma[j] = g;
    dbeta[j] = b;
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

static int ln_strided(sf_layout lay, size_t hw) { return lay == SF_LAYOUT_NCHW && hw > 1; }

/* Chunks of the weight-gradient partials: the samples (NCHW maps) or up to
 * LN_CHUNKS runs of positions. */
static int ln_chunks(int n, size_t hw, sf_layout lay)
{
    if (ln_strided(lay, hw))
        return n;
    const size_t rows = (size_t)n * hw;
    return (int)(rows < LN_CHUNKS ? rows : LN_CHUNKS);
}

static int ln_check(const char *fn, int n, int c, size_t hw)
{
    if (n < 1 || c < 1 || hw < 1 || (double)n * c * hw >= 9.0e15) {
        sf_cuda_set_error("%s:%d: %s: n=%d c=%d hw=%zu", __FILE__, __LINE__, fn, n, c, hw);
        return -1;
    }
    return 0;
}

extern "C" size_t sf_cuda_layernorm_scratch_bytes(int n, int c, size_t hw, sf_layout lay)
{
    return 2 * sizeof(float) * (size_t)ln_chunks(n, hw, lay) * (size_t)c;
}

template <typename T>
static int ln_fwd_t(const T *x, int n, int c, size_t hw, sf_layout lay, const float *ga, const float *be, float eps,
                    T *y, float *mean, float *rstd, cudaStream_t s)
{
    const size_t pos = (size_t)n * hw;
    if (ln_strided(lay, hw))
        k_ln_fwd_strided<T><<<cu_blocks(pos, CU_TPB), CU_TPB, 0, s>>>(x, pos, c, hw, ga, be, eps, y, mean, rstd);
    else
        k_ln_fwd_rows<T><<<cu_blocks(pos * 32, CU_TPB), CU_TPB, 0, s>>>(x, pos, c, ga, be, eps, y, mean, rstd);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int ln_bwd_t(const T *x, const T *dy, int n, int c, size_t hw, sf_layout lay, const float *ga,
                    const float *mean, const float *rstd, T *dx, float *dgamma, float *dbeta, void *scratch,
                    cudaStream_t s)
{
    const size_t pos = (size_t)n * hw;
    const int strided = ln_strided(lay, hw), chunks = ln_chunks(n, hw, lay);
    if (dx) {
        if (strided)
            k_ln_dx_strided<T><<<cu_blocks(pos, CU_TPB), CU_TPB, 0, s>>>(x, dy, pos, c, hw, ga, mean, rstd, dx);
        else
            k_ln_dx_rows<T><<<cu_blocks(pos * 32, CU_TPB), CU_TPB, 0, s>>>(x, dy, pos, c, ga, mean, rstd, dx);
        SF_CUDA_CHECK_LAUNCH();
    }
    float *part_g = (float *)scratch, *part_b = part_g + (size_t)chunks * c;
    if (strided) {
        k_ln_wgrad_strided<T><<<(unsigned)((size_t)n * c), CU_TPB, 0, s>>>(x, dy, c, hw, mean, rstd, part_g, part_b);
    } else {
        const size_t per = cu_cdiv(pos, (size_t)chunks);
        const dim3 grid((unsigned)cu_cdiv((size_t)c, 32), (unsigned)chunks), block(32, LN_ROWS_PER_BLOCK);
        k_ln_wgrad_rows<T><<<grid, block, 0, s>>>(x, dy, pos, c, per, mean, rstd, part_g, part_b);
    }
    SF_CUDA_CHECK_LAUNCH();
    k_ln_wgrad_sum<<<cu_blocks((size_t)c, CU_TPB), CU_TPB, 0, s>>>(part_g, part_b, chunks, c, dgamma, dbeta);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_layernorm_fwd_dt(sf_dtype dt, const void *x, int n, int c, size_t hw, sf_layout lay,
                                        const float *gamma, const float *beta, float eps, void *y, float *mean,
                                        float *rstd, cudaStream_t s)
{
    const char *fn = "sf_cuda_layernorm_fwd_dt";
    if (cu_dt_bad(fn, dt) || ln_check(fn, n, c, hw))
        return -1;
    if (dt == SF_DT_BF16)
        return ln_fwd_t<cu_bf16>((const cu_bf16 *)x, n, c, hw, lay, gamma, beta, eps, (cu_bf16 *)y, mean, rstd, s);
    return ln_fwd_t<float>((const float *)x, n, c, hw, lay, gamma, beta, eps, (float *)y, mean, rstd, s);
}

extern "C" int sf_cuda_layernorm_bwd_dt(sf_dtype dt, const void *x, const void *dy, int n, int c, size_t hw,
                                        sf_layout lay, const float *gamma, const float *mean, const float *rstd,
                                        void *dx, float *dgamma, float *dbeta, void *scratch, cudaStream_t s)
{
    const char *fn = "sf_cuda_layernorm_bwd_dt";
    if (cu_dt_bad(fn, dt) || ln_check(fn, n, c, hw))
        return -1;
    if (dt == SF_DT_BF16)
        return ln_bwd_t<cu_bf16>((const cu_bf16 *)x, (const cu_bf16 *)dy, n, c, hw, lay, gamma, mean, rstd,
                                 (cu_bf16 *)dx, dgamma, dbeta, scratch, s);
    return ln_bwd_t<float>((const float *)x, (const float *)dy, n, c, hw, lay, gamma, mean, rstd, (float *)dx, dgamma,
                           dbeta, scratch, s);
}
