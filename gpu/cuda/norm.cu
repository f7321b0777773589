/* gpu/cuda/norm.cu — kernels first, then launchers: LayerNorm over the
 * channels of each position, forward (statistics saved) and backward (input
 * gradient and the weight and bias gradients' partials, in one pass over
 * contiguous rows of whole 16-byte vectors and in two elsewhere, the partials
 * then reduced in a fixed order). Contracts in norm.h.
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

/* The sum over the L lanes of a group (L a power of two <= 32, groups
 * aligned in the warp; 32: the whole warp), every lane of the group
 * receiving it (butterfly: a fixed order). Every lane of the warp must call
 * it. */
__device__ __forceinline__ float group_sum(float v, int L)
{
    for (int o = L >> 1; o > 0; o >>= 1)
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
    const float mu = group_sum(s, 32) / (float)c;
    float v = 0.f;
    for (int j = lane; j < c; j += 32) {
        const float d = cu_f(p[j]) - mu;
        v += d * d;
    }
    const float r = 1.f / sqrtf(group_sum(v, 32) / (float)c + eps);
    for (int j = lane; j < c; j += 32)
        q[j] = cu_to<T>((cu_f(p[j]) - mu) * r * ga[j] + (be ? be[j] : 0.f));
    if (lane == 0) {
        mean[row] = mu;
        rstd[row] = r;
    }
}

/* Contiguous positions over 16-byte vectors, the row held in registers: a
 * group of L lanes per row of c = cv * V values (c % V == 0, cv <= L * K;
 * x, y, ga, be 16-byte aligned), lane j of the group holding vectors
 * j, j + L, ..., j + (K-1)L, so that neighbouring lanes read neighbouring 16
 * bytes. The launcher picks L and K so that few lanes idle: ConvNeXt's 96 to
 * 768 bf16 channels are 12 to 96 vectors, groups of 4 to 32 lanes of 3. A
 * warp per row reading 2-byte values read each row three times and left
 * 20 of 32 lanes idle at 96 channels. The statistics are fp32, as the scalar
 * kernel's, summed in a fixed order (lane, then the group's butterfly).
 * No __launch_bounds__: with it ptxas held the bf16 instances to 64 and 40
 * registers and spilled a few bytes of the held row. */
template <typename T, int V, int K>
__global__ void
    k_ln_fwd_rows_vec(const T *__restrict__ x, size_t rows, int c, int L, const float *__restrict__ ga,
                      const float *__restrict__ be, float eps, T *__restrict__ y, float *__restrict__ mean,
                      float *__restrict__ rstd)
{
    const size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / (unsigned)L;
    const int j = threadIdx.x & (L - 1), cv = c / V;
    const bool live = row < rows; /* lanes past the last row still join the shuffles */
    const T *p = x + row * c;
    float v[K][V];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int q = j + k * L;
        if (live && q < cv) {
            cu_ld<T, V>(p + (size_t)q * V, v[k]);
#pragma unroll
            for (int e = 0; e < V; e++)
                s += v[k][e];
        }
    }
    const float mu = group_sum(s, L) / (float)c;
    float var = 0.f;
#pragma unroll
    for (int k = 0; k < K; k++)
        if (live && j + k * L < cv)
#pragma unroll
            for (int e = 0; e < V; e++) {
                const float d = v[k][e] - mu;
                var += d * d;
            }
    const float r = 1.f / sqrtf(group_sum(var, L) / (float)c + eps);
    if (!live)
        return;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int q = j + k * L;
        if (q < cv) {
            float g[V], b[V];
            cu_ldf<V>(ga + (size_t)q * V, g);
            if (be) {
                cu_ldf<V>(be + (size_t)q * V, b);
            } else {
#pragma unroll
                for (int e = 0; e < V; e++)
                    b[e] = 0.f;
            }
#pragma unroll
            for (int e = 0; e < V; e++)
                v[k][e] = (v[k][e] - mu) * r * g[e] + b[e];
            cu_st<T, V>(y + row * c + (size_t)q * V, v[k]);
        }
    }
    if (j == 0) {
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
        y[base + (size_t)j * hw] =
            cu_to<T>((cu_f(x[base + (size_t)j * hw]) - mu) * r * ga[j] + (be ? be[j] : 0.f));
    mean[i] = mu;
    rstd[i] = r;
}

/* dx of contiguous positions, a warp per position; add: dx += the gradient
 * (summed in fp32 with what dx holds, rounded once). */
template <typename T>
__global__ void k_ln_dx_rows(const T *__restrict__ x, const T *__restrict__ dy, size_t rows, int c,
                             const float *__restrict__ ga, const float *__restrict__ mean,
                             const float *__restrict__ rstd, T *__restrict__ dx, int add)
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
    mg = group_sum(mg, 32) / (float)c;
    mgx = group_sum(mgx, 32) / (float)c;
    for (int j = lane; j < c; j += 32) {
        const float xh = (cu_f(p[j]) - mu) * r;
        const float v = r * (cu_f(d[j]) * ga[j] - mg - xh * mgx);
        dx[row * c + j] = cu_to<T>(add ? __fadd_rn(cu_f(dx[row * c + j]), v) : v);
    }
}

/* dx and the weight-gradient partials of contiguous positions in one pass
 * over x and dy (a dx kernel and then k_ln_wgrad_rows_vec had read both
 * twice: on an H200, ViT-B/16's 768 bf16 channels over 50 432 tokens took
 * 0.185 ms a LayerNorm backward, about 2.5 TB/s). Block blockIdx.x takes the
 * chunk of rows [blockIdx.x * per, +per): its groups of L lanes walk the
 * chunk's rows, k_ln_fwd_rows_vec's groups and conditions (dy and dx 16-byte
 * aligned too), every group of the block the same number of times, so that
 * the shuffles see whole warps, each lane adding
 * dy * xhat and dy of its K vectors into registers; then the sums of the
 * groups of a warp (butterfly over the lanes L, 2L, .. apart), then of the
 * warps in warp order through shared memory, into part_g/part_b [chunk][c].
 * A fixed order throughout: the partials depend on the shape alone. c is at
 * most LN_FUSED_C (6 * 32 vectors, ln_vec_pick's bound). */
#define LN_FUSED_C 1536
template <typename T, int V, int K>
__global__ void __launch_bounds__(CU_TPB)
    k_ln_bwd_rows_vec(const T *__restrict__ x, const T *__restrict__ dy, size_t rows, int c, int L, size_t per,
                      const float *__restrict__ ga, const float *__restrict__ mean, const float *__restrict__ rstd,
                      T *__restrict__ dx, int add, float *__restrict__ part_g, float *__restrict__ part_b)
{
    __shared__ float sg[LN_FUSED_C], sb[LN_FUSED_C];
    const int j = threadIdx.x & (L - 1), grp = threadIdx.x / L, groups = CU_TPB / L, cv = c / V;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t r0 = (size_t)blockIdx.x * per, r1 = r0 + per < rows ? r0 + per : rows;
    float ag[K][V], ab[K][V];
#pragma unroll
    for (int k = 0; k < K; k++)
#pragma unroll
        for (int e = 0; e < V; e++)
            ag[k][e] = ab[k][e] = 0.f;
    for (size_t base = r0; base < r1; base += groups) {
        const size_t row = base + grp;
        const bool live = row < r1;
        const float mu = live ? mean[row] : 0.f, r = live ? rstd[row] : 0.f;
        float mg = 0.f, mgx = 0.f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int q = j + k * L;
            if (live && q < cv) {
                float xv[V], d[V], w[V];
                cu_ld<T, V>(x + row * c + (size_t)q * V, xv);
                cu_ld<T, V>(dy + row * c + (size_t)q * V, d);
                cu_ldf<V>(ga + (size_t)q * V, w);
#pragma unroll
                for (int e = 0; e < V; e++) {
                    const float xh = (xv[e] - mu) * r, g = d[e] * w[e];
                    ag[k][e] += d[e] * xh;
                    ab[k][e] += d[e];
                    mg += g;
                    mgx += g * xh;
                }
            }
        }
        mg = group_sum(mg, L) / (float)c;
        mgx = group_sum(mgx, L) / (float)c;
        if (!live)
            continue;
        /* the row again (from L1: the block's rows in flight are a few KB),
         * rather than held in registers across the shuffles, which kept one
         * block of the bf16 768-channel instance on an SM */
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int q = j + k * L;
            if (q < cv) {
                float xv[V], d[V], w[V], prior[V], o[V];
                cu_ld<T, V>(x + row * c + (size_t)q * V, xv);
                cu_ld<T, V>(dy + row * c + (size_t)q * V, d);
                cu_ldf<V>(ga + (size_t)q * V, w);
                if (add)
                    cu_ld<T, V>(dx + row * c + (size_t)q * V, prior);
#pragma unroll
                for (int e = 0; e < V; e++) {
                    o[e] = r * (d[e] * w[e] - mg - (xv[e] - mu) * r * mgx);
                    if (add) /* not fused into the product: the sum of the gradient as
                              * written alone, as an add pass after it would make */
                        o[e] = __fadd_rn(prior[e], o[e]);
                }
                cu_st<T, V>(dx + row * c + (size_t)q * V, o);
            }
        }
    }
    /* the groups of a warp, then the warps */
    for (int o = L; o < 32; o <<= 1)
#pragma unroll
        for (int k = 0; k < K; k++)
#pragma unroll
            for (int e = 0; e < V; e++) {
                ag[k][e] += __shfl_xor_sync(0xffffffffu, ag[k][e], o);
                ab[k][e] += __shfl_xor_sync(0xffffffffu, ab[k][e], o);
            }
    for (int w = 0; w < CU_TPB / 32; w++) {
        if (warp == w && lane < L)
#pragma unroll
            for (int k = 0; k < K; k++) {
                const int q = j + k * L;
                if (q < cv)
#pragma unroll
                    for (int e = 0; e < V; e++) {
                        const int col = q * V + e;
                        sg[col] = w ? sg[col] + ag[k][e] : ag[k][e];
                        sb[col] = w ? sb[col] + ab[k][e] : ab[k][e];
                    }
            }
        __syncthreads();
    }
    for (int t = threadIdx.x; t < c; t += CU_TPB) {
        part_g[(size_t)blockIdx.x * c + t] = sg[t];
        part_b[(size_t)blockIdx.x * c + t] = sb[t];
    }
}

/* dx of NCHW positions, a thread per position. */
template <typename T>
__global__ void k_ln_dx_strided(const T *__restrict__ x, const T *__restrict__ dy, size_t pos, int c, size_t hw,
                                const float *__restrict__ ga, const float *__restrict__ mean,
                                const float *__restrict__ rstd, T *__restrict__ dx, int add)
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
        const float v = r * (cu_f(dy[e]) * ga[j] - mg - xh * mgx);
        dx[e] = cu_to<T>(add ? __fadd_rn(cu_f(dx[e]), v) : v);
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

/* Weight-gradient partials of contiguous positions over 16-byte vectors
 * (c % V == 0, x and dy 16-byte aligned): block (tile of up to 32 channel
 * vectors, chunk blockIdx.y of positions [y*per, (y+1)*per)); part_g/part_b
 * [chunk][c] as k_ln_wgrad_rows. A warp's lanes are G = min(c/V, 32) vectors
 * of 32/G consecutive rows (one contiguous span a load), the CU_TPB/32 warps
 * split the chunk's rows, each thread keeps U rows' loads in flight, and the
 * block adds its threads' sums in a fixed order through shared memory. */
template <typename T, int V>
__global__ void __launch_bounds__(CU_TPB)
    k_ln_wgrad_rows_vec(const T *__restrict__ x, const T *__restrict__ dy, size_t rows, int c, size_t per,
                        const float *__restrict__ mean, const float *__restrict__ rstd, float *__restrict__ part_g,
                        float *__restrict__ part_b)
{
    constexpr int U = 4;
    constexpr int W = CU_TPB / 32;
    __shared__ float sg[CU_TPB * V], sb[CU_TPB * V];
    const int cv = c / V, G = cv < 32 ? cv : 32, RPW = 32 / G, tile = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gi = lane % G, ro = lane / G;
    const int vi = tile * 32 + gi;
    const size_t r0 = (size_t)blockIdx.y * per, r1 = r0 + per < rows ? r0 + per : rows;
    float g[V], b[V];
#pragma unroll
    for (int e = 0; e < V; e++)
        g[e] = b[e] = 0.f;
    if (ro < RPW && vi < cv) {
        const size_t col = (size_t)vi * V, rstep = (size_t)W * RPW;
        size_t row = r0 + (size_t)warp * RPW + ro;
        for (; row + (U - 1) * rstep < r1; row += U * rstep) {
            float xv[U][V], dv[U][V], mu[U], rs[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const size_t rr = row + u * rstep;
                cu_ld<T, V>(x + rr * c + col, xv[u]);
                cu_ld<T, V>(dy + rr * c + col, dv[u]);
                mu[u] = mean[rr];
                rs[u] = rstd[rr];
            }
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int e = 0; e < V; e++) {
                    g[e] += dv[u][e] * (xv[u][e] - mu[u]) * rs[u];
                    b[e] += dv[u][e];
                }
        }
        for (; row < r1; row += rstep) {
            float xv[V], dv[V];
            cu_ld<T, V>(x + row * c + col, xv);
            cu_ld<T, V>(dy + row * c + col, dv);
            const float mu = mean[row], rs = rstd[row];
#pragma unroll
            for (int e = 0; e < V; e++) {
                g[e] += dv[e] * (xv[e] - mu) * rs;
                b[e] += dv[e];
            }
        }
    }
#pragma unroll
    for (int e = 0; e < V; e++) {
        sg[threadIdx.x * V + e] = g[e];
        sb[threadIdx.x * V + e] = b[e];
    }
    __syncthreads();
    const int t = threadIdx.x;
    if (t >= G * V || tile * 32 + t / V >= cv)
        return;
    float gs = 0.f, bs = 0.f;
    for (int w = 0; w < W; w++)
        for (int r = 0; r < RPW; r++) {
            gs += sg[(w * 32 + r * G) * V + t];
            bs += sb[(w * 32 + r * G) * V + t];
        }
    const size_t o = (size_t)blockIdx.y * c + (size_t)tile * 32 * V + t;
    part_g[o] = gs;
    part_b[o] = bs;
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

/* dgamma[j], dbeta[j] (dbeta NULL: a bias-free norm's, not written; its
 * partials cost one add per value, not worth a second kernel family): the
 * chunks' partials summed in a fixed order. A block
 * per 32 channels: warp w sums chunks w, w + 8, ... of its lane's channel,
 * then the warps' sums are added in warp order. (A thread per channel
 * walking all the chunks waited on 256 dependent loads in a row.) */
__global__ void __launch_bounds__(CU_TPB)
    k_ln_wgrad_sum(const float *__restrict__ part_g, const float *__restrict__ part_b, int chunks, int c,
                   float *__restrict__ dgamma, float *__restrict__ dbeta)
{
    constexpr int W = CU_TPB / 32;
    __shared__ float sg[W][32], sb[W][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, j = blockIdx.x * 32 + lane;
    float g = 0.f, b = 0.f;
    if (j < c)
        for (int k = warp; k < chunks; k += W) {
            g += part_g[(size_t)k * c + j];
            b += part_b[(size_t)k * c + j];
        }
    sg[warp][lane] = g;
    sb[warp][lane] = b;
    __syncthreads();
    if (warp || j >= c)
        return;
    for (int w = 1; w < W; w++) {
        g += sg[w][lane];
        b += sb[w][lane];
    }
    dgamma[j] = g;
    if (dbeta)
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

/* The vector row kernels' shape: groups of L lanes holding K vectors each,
 * the fewest lanes a row that leave each at most 4 vectors (6 past 128
 * vectors: rows of up to 768 fp32 or 1 536 bf16 channels); 0 where the row
 * is not whole vectors or too long for the registers (the scalar kernels
 * then). */
struct ln_vec_shape {
    int L, K;
};
template <typename T> static ln_vec_shape ln_vec_pick(int c)
{
    constexpr int V = 16 / sizeof(T);
    if (c % V)
        return {0, 0};
    const int cv = c / V;
    for (int L = 1; L <= 32; L <<= 1)
        if (cv <= 4 * L)
            return {L, (cv + L - 1) / L};
    return cv <= 6 * 32 ? ln_vec_shape{32, 6} : ln_vec_shape{0, 0};
}

/* Launches KERN<T, V, K> (a vector row kernel) for the picked K: one instance a K. */
#define LN_VEC_SWITCH(KERN, K, GRID, ...)                                                                              \
    switch (K) {                                                                                                       \
    case 1: KERN<T, V, 1><<<GRID, CU_TPB, 0, s>>>(__VA_ARGS__); break;                                                 \
    case 2: KERN<T, V, 2><<<GRID, CU_TPB, 0, s>>>(__VA_ARGS__); break;                                                 \
    case 3: KERN<T, V, 3><<<GRID, CU_TPB, 0, s>>>(__VA_ARGS__); break;                                                 \
    case 4: KERN<T, V, 4><<<GRID, CU_TPB, 0, s>>>(__VA_ARGS__); break;                                                 \
    default: KERN<T, V, 6><<<GRID, CU_TPB, 0, s>>>(__VA_ARGS__); break;                                                \
    }

template <typename T>
static int ln_fwd_t(const T *x, int n, int c, size_t hw, sf_layout lay, const float *ga, const float *be, float eps,
                    T *y, float *mean, float *rstd, cudaStream_t s)
{
    constexpr int V = 16 / sizeof(T);
    const size_t pos = (size_t)n * hw;
    const ln_vec_shape vs = ln_vec_pick<T>(c);
    if (ln_strided(lay, hw)) {
        k_ln_fwd_strided<T><<<cu_blocks(pos, CU_TPB), CU_TPB, 0, s>>>(x, pos, c, hw, ga, be, eps, y, mean, rstd);
    } else if (vs.L && cu_al16(x) && cu_al16(y) && cu_al16(ga) && cu_al16(be)) {
        const unsigned grid = cu_blocks(pos * vs.L, CU_TPB);
        LN_VEC_SWITCH(k_ln_fwd_rows_vec, vs.K, grid, x, pos, c, vs.L, ga, be, eps, y, mean, rstd);
    } else
        k_ln_fwd_rows<T><<<cu_blocks(pos * 32, CU_TPB), CU_TPB, 0, s>>>(x, pos, c, ga, be, eps, y, mean, rstd);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int ln_bwd_t(const T *x, const T *dy, int n, int c, size_t hw, sf_layout lay, const float *ga,
                    const float *mean, const float *rstd, T *dx, int dx_add, float *dgamma, float *dbeta,
                    void *scratch, cudaStream_t s)
{
    constexpr int V = 16 / sizeof(T);
    const size_t pos = (size_t)n * hw;
    const int strided = ln_strided(lay, hw), chunks = ln_chunks(n, hw, lay);
    const ln_vec_shape vs = ln_vec_pick<T>(c);
    float *part_g = (float *)scratch, *part_b = part_g + (size_t)chunks * c;
    int parts = chunks; /* the partials' rows written */
    const bool one_pass = dx && !strided && vs.L && cu_al16(x) && cu_al16(dy) && cu_al16(dx) && cu_al16(ga);
    if (one_pass) {
        /* one pass: chunks of whole groups' rows, at most as many as the other path's */
        const size_t groups = (size_t)(CU_TPB / vs.L);
        const size_t per = cu_cdiv(cu_cdiv(pos, (size_t)chunks), groups) * groups;
        parts = (int)cu_cdiv(pos, per);
        LN_VEC_SWITCH(k_ln_bwd_rows_vec, vs.K, (unsigned)parts, x, dy, pos, c, vs.L, per, ga, mean, rstd, dx, dx_add,
                      part_g, part_b);
    } else if (dx && strided) {
        k_ln_dx_strided<T><<<cu_blocks(pos, CU_TPB), CU_TPB, 0, s>>>(x, dy, pos, c, hw, ga, mean, rstd, dx, dx_add);
    } else if (dx) { /* misaligned, or rows that are not whole vectors or too long for the registers */
        k_ln_dx_rows<T><<<cu_blocks(pos * 32, CU_TPB), CU_TPB, 0, s>>>(x, dy, pos, c, ga, mean, rstd, dx, dx_add);
    }
    SF_CUDA_CHECK_LAUNCH();
    if (one_pass) {
        /* the partials are written */
    } else if (strided) {
        k_ln_wgrad_strided<T><<<(unsigned)((size_t)n * c), CU_TPB, 0, s>>>(x, dy, c, hw, mean, rstd, part_g, part_b);
    } else if (c % V == 0 && cu_al16(x) && cu_al16(dy)) {
        const size_t per = cu_cdiv(pos, (size_t)chunks);
        const dim3 grid((unsigned)cu_cdiv((size_t)(c / V), 32), (unsigned)chunks);
        k_ln_wgrad_rows_vec<T, V><<<grid, CU_TPB, 0, s>>>(x, dy, pos, c, per, mean, rstd, part_g, part_b);
    } else {
        const size_t per = cu_cdiv(pos, (size_t)chunks);
        const dim3 grid((unsigned)cu_cdiv((size_t)c, 32), (unsigned)chunks), block(32, LN_ROWS_PER_BLOCK);
        k_ln_wgrad_rows<T><<<grid, block, 0, s>>>(x, dy, pos, c, per, mean, rstd, part_g, part_b);
    }
    SF_CUDA_CHECK_LAUNCH();
    k_ln_wgrad_sum<<<(unsigned)cu_cdiv((size_t)c, 32), CU_TPB, 0, s>>>(part_g, part_b, parts, c, dgamma, dbeta);
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
                                        void *dx, int dx_add, float *dgamma, float *dbeta, void *scratch,
                                        cudaStream_t s)
{
    const char *fn = "sf_cuda_layernorm_bwd_dt";
    if (cu_dt_bad(fn, dt) || ln_check(fn, n, c, hw))
        return -1;
    if (dt == SF_DT_BF16)
        return ln_bwd_t<cu_bf16>((const cu_bf16 *)x, (const cu_bf16 *)dy, n, c, hw, lay, gamma, mean, rstd,
                                 (cu_bf16 *)dx, dx_add, dgamma, dbeta, scratch, s);
    return ln_bwd_t<float>((const float *)x, (const float *)dy, n, c, hw, lay, gamma, mean, rstd, (float *)dx, dx_add,
                           dgamma, dbeta, scratch, s);
}
