/* gpu/cuda/conv_dw.cu — depthwise NHWC convolutions as memory-bound
 * kernels (why and semantics: conv_dw.h).
 *
 * Two families. The 16-byte kernels (k_dw_corr16, k_dw_dgrad2_16 and
 * k_dw_wgrad16, each described where it is defined) take every call whose
 * channel count is a multiple of 8 (bf16) or 4 (fp32), whose tensors start
 * on 16-byte boundaries and whose k is 3, 5 or 7: all of EfficientNet-B0's
 * and MobileNet-V2's depthwise layers. The general kernels take the rest
 * (k = 1, other channel counts, tensors off a 16-byte boundary, more work
 * items than an int indexes); their per-pixel 64-bit index divisions and
 * runtime tap loops cost more instructions than the bytes they move.
 *
 * The general kernels' threads: a block of DW_TPB threads takes one tile
 * of channels (blockIdx.y) and a set of pixels. Within it, cvt neighbouring
 * threads cover the tile's channels, V at a time (V = 2: a bf16x2 or float2
 * word per thread where the channel count is even and the pointers allow
 * it, else 1), so a warp reads consecutive channels of a pixel (coalesced
 * NHWC rows); the other threads of the block take further pixels ("slots").
 * cvt is min(32, c / V): a map with few channels (32 in EfficientNet-B0's
 * first block) puts several pixels in a warp rather than leaving lanes
 * idle. The tile's filter sits in shared memory as [tap][channel], so the
 * taps of V channels are adjacent; the 16-byte kernels share this layout.
 */
#include "gpu/cuda/conv_dw.h"

#include "gpu/cuda/check.h"
#include "gpu/cuda/kernel_common.cuh"

#define DW_TPB 256
#define DW_KMAX SF_CONV_DW_KMAX
#define DW_VMAX 2
/* Blocks of the backward-filter's first pass at most, over all channel
 * tiles: a constant, so the partial sums (and the rounding) depend on the
 * shape alone. 1024 blocks keep an H200's 132 SMs busy. */
#define DW_WG_BLOCKS 1024
/* Channels of one tile in the backward-filter's chunk count (the widest
 * tile, 32 threads of 2 channels): fixed, so the count does not depend on
 * which V a call runs with. */
#define DW_WG_TILE 64
/* Most blocks along the pixels of the forward and backward-data (grid-stride
 * loops beyond). */
#define DW_MAX_GX 8192
/* Pixels per thread along a row in the 16-byte kernels: enough that the
 * shared input columns of neighbouring outputs are loaded once, few enough
 * that the sums stay in registers at k = 7 (DW_TW * V + k * V floats). */
#define DW_TW 4
/* Most channels of one tile in the 16-byte kernels (their filter tile in
 * shared memory is DW_KMAX^2 * DW_TC16 floats, 25 KB). */
#define DW_TC16 128
/* Most work items of the 16-byte kernels: their item indices, plus one
 * grid's stride, stay within int. */
#define DW_ITEMS_MAX ((size_t)1 << 30)

typedef struct dw_shape {
    int n, c, h, w, k, s, p, oh, ow;
} dw_shape;

static int dw_out(int h, int k, int s, int p) { return (h + 2 * p - k) / s + 1; }

extern "C" int sf_conv_dw_ok(sf_layout lay, sf_dtype dt, int c, int oc, int groups, int k, int stride, int pad,
                             int dilation)
{
    return lay == SF_LAYOUT_NHWC && (dt == SF_DT_F32 || dt == SF_DT_BF16) && c >= 1 && oc == c && groups == c &&
           dilation <= 1 && k >= 1 && k <= DW_KMAX && (k & 1) && (stride == 1 || stride == 2) && pad >= 0 && pad < k;
}

/* The backward-filter's chunks of output rows: enough blocks over all tiles,
 * never more chunks than rows. */
static int dw_wg_chunks(int n, int c, int oh)
{
    const size_t rows = (size_t)n * (size_t)oh;
    const size_t tiles = cu_cdiv((size_t)c, DW_WG_TILE);
    size_t ch = DW_WG_BLOCKS / tiles;
    if (ch < 1)
        ch = 1;
    if (ch > rows)
        ch = rows;
    return ch < 1 ? 1 : (int)ch;
}

extern "C" size_t sf_conv_dw_scratch_floats(int n, int c, int oh, int k)
{
    if (n < 1 || c < 1 || oh < 1 || k < 1)
        return 0;
    return (size_t)dw_wg_chunks(n, c, oh) * (size_t)c * (size_t)k * (size_t)k;
}

/* V channels at p as floats, and back (rounding once to T). */
template <typename T, int V> __device__ __forceinline__ void dw_ld(const T *p, float *f)
{
    if constexpr (V == 1) {
        f[0] = cu_f(p[0]);
    } else if constexpr (sizeof(T) == 4) {
        const float2 v = *reinterpret_cast<const float2 *>(p);
        f[0] = v.x;
        f[1] = v.y;
    } else {
        cu_bf2(*reinterpret_cast<const unsigned *>(p), f[0], f[1]);
    }
}

template <typename T, int V> __device__ __forceinline__ void dw_st(T *p, const float *f)
{
    if constexpr (V == 1) {
        p[0] = cu_to<T>(f[0]);
    } else if constexpr (sizeof(T) == 4) {
        *reinterpret_cast<float2 *>(p) = make_float2(f[0], f[1]);
    } else {
        *reinterpret_cast<unsigned *>(p) = cu_pk2(f[0], f[1]);
    }
}

/* The tile's filter into sw as [tap][channel of the tile] (zero past c). */
template <typename T>
__device__ __forceinline__ void dw_load_filter(const T *__restrict__ w, float *sw, int c0, int tc, int c, int kk)
{
    for (int j = threadIdx.x; j < kk * tc; j += blockDim.x) {
        const int t = j / tc, cl = j - t * tc, ch = c0 + cl;
        sw[j] = ch < c ? cu_f(w[(size_t)ch * kk + t]) : 0.f;
    }
}

/* Forward: a thread per (output pixel, V channels). */
template <typename T, int V>
__global__ void __launch_bounds__(DW_TPB) k_dw_fwd(const T *__restrict__ x, const T *__restrict__ w,
                                                   const float *__restrict__ b, T *__restrict__ y, dw_shape S, int cvt)
{
    __shared__ float sw[DW_KMAX * DW_KMAX * 32 * DW_VMAX];
    const int kk = S.k * S.k, tc = cvt * V, c0 = blockIdx.y * tc, slots = DW_TPB / cvt;
    dw_load_filter<T>(w, sw, c0, tc, S.c, kk);
    __syncthreads();
    const int cv = threadIdx.x % cvt, slot = threadIdx.x / cvt, c = c0 + cv * V;
    if (slot >= slots || c >= S.c)
        return;
    float bv[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        bv[v] = b ? b[c + v] : 0.f;
    const size_t P = (size_t)S.n * S.oh * S.ow;
    for (size_t p = (size_t)blockIdx.x * slots + slot; p < P; p += (size_t)gridDim.x * slots) {
        const size_t r = p / S.ow;
        const int ox = (int)(p - r * S.ow), oy = (int)(r % S.oh), ni = (int)(r / S.oh);
        float acc[V];
#pragma unroll
        for (int v = 0; v < V; v++)
            acc[v] = bv[v];
        const int iy0 = oy * S.s - S.p, ix0 = ox * S.s - S.p;
        for (int ky = 0; ky < S.k; ky++) {
            const int iy = iy0 + ky;
            if ((unsigned)iy >= (unsigned)S.h)
                continue;
            const T *xr = x + ((size_t)ni * S.h + iy) * S.w * S.c + c;
            const float *wr = sw + ky * S.k * tc + cv * V;
            for (int kx = 0; kx < S.k; kx++) {
                const int ix = ix0 + kx;
                if ((unsigned)ix >= (unsigned)S.w)
                    continue;
                float xv[V];
                dw_ld<T, V>(xr + (size_t)ix * S.c, xv);
#pragma unroll
                for (int v = 0; v < V; v++)
                    acc[v] = fmaf(wr[kx * tc + v], xv[v], acc[v]);
            }
        }
        dw_st<T, V>(y + p * S.c + c, acc);
    }
}

/* Backward-data: a thread per (input pixel, V channels), gathering the
 * output pixels whose taps cover it. */
template <typename T, int V>
__global__ void __launch_bounds__(DW_TPB) k_dw_dgrad(const T *__restrict__ dy, const T *__restrict__ w,
                                                     T *__restrict__ dx, dw_shape S, int cvt)
{
    __shared__ float sw[DW_KMAX * DW_KMAX * 32 * DW_VMAX];
    const int kk = S.k * S.k, tc = cvt * V, c0 = blockIdx.y * tc, slots = DW_TPB / cvt;
    dw_load_filter<T>(w, sw, c0, tc, S.c, kk);
    __syncthreads();
    const int cv = threadIdx.x % cvt, slot = threadIdx.x / cvt, c = c0 + cv * V;
    if (slot >= slots || c >= S.c)
        return;
    const size_t P = (size_t)S.n * S.h * S.w;
    for (size_t p = (size_t)blockIdx.x * slots + slot; p < P; p += (size_t)gridDim.x * slots) {
        const size_t r = p / S.w;
        const int ix = (int)(p - r * S.w), iy = (int)(r % S.h), ni = (int)(r / S.h);
        float acc[V];
#pragma unroll
        for (int v = 0; v < V; v++)
            acc[v] = 0.f;
        for (int ky = 0; ky < S.k; ky++) {
            const int ty = iy + S.p - ky;
            if (ty < 0 || ty % S.s)
                continue;
            const int oy = ty / S.s;
            if (oy >= S.oh)
                continue;
            const T *dr = dy + ((size_t)ni * S.oh + oy) * S.ow * S.c + c;
            const float *wr = sw + ky * S.k * tc + cv * V;
            for (int kx = 0; kx < S.k; kx++) {
                const int tx = ix + S.p - kx;
                if (tx < 0 || tx % S.s)
                    continue;
                const int ox = tx / S.s;
                if (ox >= S.ow)
                    continue;
                float g[V];
                dw_ld<T, V>(dr + (size_t)ox * S.c, g);
#pragma unroll
                for (int v = 0; v < V; v++)
                    acc[v] = fmaf(wr[kx * tc + v], g[v], acc[v]);
            }
        }
        dw_st<T, V>(dx + p * S.c + c, acc);
    }
}

/* Backward-filter, first pass: block (chunk, tile) sums dy * x over the
 * output rows [r0, r1) of the chunk for the tile's channels. Thread
 * (slot, ky, cv) holds the sums of filter row ky (k taps) of its V channels
 * over the pixels slot, slot + slots, ...; the block then adds the slots'
 * sums in slot order and writes part[chunk][c * k*k + tap]. */
template <typename T, int V>
__global__ void __launch_bounds__(DW_TPB) k_dw_wgrad(const T *__restrict__ x, const T *__restrict__ dy,
                                                     float *__restrict__ part, dw_shape S, int cvt, int chunks)
{
    __shared__ float red[DW_TPB * DW_VMAX * DW_KMAX];
    const int k = S.k, kk = k * k, tc = cvt * V;
    const int cv = threadIdx.x % cvt, rest = threadIdx.x / cvt, ky = rest % k, slot = rest / k;
    const int slots = DW_TPB / (cvt * k), c = blockIdx.y * tc + cv * V;
    const int active = slot < slots && c < S.c;
    const size_t rows = (size_t)S.n * S.oh, chunk = blockIdx.x;
    const size_t r0 = chunk * rows / chunks, r1 = (chunk + 1) * rows / chunks;
    const size_t npx = (r1 - r0) * S.ow;
    float acc[V][DW_KMAX];
#pragma unroll
    for (int v = 0; v < V; v++)
#pragma unroll
        for (int kx = 0; kx < DW_KMAX; kx++)
            acc[v][kx] = 0.f;
    if (active) {
        for (size_t q = slot; q < npx; q += slots) {
            const size_t qr = q / S.ow, r = r0 + qr;
            const int ox = (int)(q - qr * S.ow), oy = (int)(r % S.oh), ni = (int)(r / S.oh);
            const int iy = oy * S.s - S.p + ky;
            if ((unsigned)iy >= (unsigned)S.h)
                continue;
            float g[V];
            dw_ld<T, V>(dy + (r * S.ow + ox) * S.c + c, g);
            const T *xr = x + ((size_t)ni * S.h + iy) * S.w * S.c + c;
            const int ix0 = ox * S.s - S.p;
#pragma unroll
            for (int kx = 0; kx < DW_KMAX; kx++) {
                const int ix = ix0 + kx;
                if (kx >= k || (unsigned)ix >= (unsigned)S.w)
                    continue;
                float xv[V];
                dw_ld<T, V>(xr + (size_t)ix * S.c, xv);
#pragma unroll
                for (int v = 0; v < V; v++)
                    acc[v][kx] = fmaf(g[v], xv[v], acc[v][kx]);
            }
        }
    }
    float *mine = red + (size_t)threadIdx.x * (V * DW_KMAX);
#pragma unroll
    for (int v = 0; v < V; v++)
#pragma unroll
        for (int kx = 0; kx < DW_KMAX; kx++)
            mine[v * DW_KMAX + kx] = acc[v][kx];
    __syncthreads();
    if (slot != 0 || !active)
        return;
    float *out = part + chunk * (size_t)S.c * kk;
#pragma unroll
    for (int v = 0; v < V; v++)
        for (int kx = 0; kx < k; kx++) {
            float sum = 0.f;
            for (int sl = 0; sl < slots; sl++)
                sum += red[(size_t)((sl * k + ky) * cvt + cv) * (V * DW_KMAX) + v * DW_KMAX + kx];
            out[(size_t)(c + v) * kk + ky * k + kx] = sum;
        }
}

/* ---- 16-byte kernels ---------------------------------------------------------
 * Where the channel count is a multiple of V = 16 / sizeof(T) (8 bf16 or 4
 * fp32 channels) and the tensors start on 16-byte boundaries, each thread
 * moves 16 bytes per load, and k (3, 5, 7) and the stride are template
 * constants, so the tap loops unroll and need no division. A thread takes a
 * strip of DW_TW neighbouring pixels of one row: it loads each input column
 * the strip's taps touch once (DW_TW + k - 1 columns per filter row at stride
 * 1 instead of DW_TW * k) and keeps the strip's sums in registers. A work
 * item (row, strip) is found from its index with three 32-bit divisions,
 * paid once per DW_TW * V outputs. The channel tile is at most DW_TC16
 * channels, so the tile's filter fits in static shared memory at k = 7. */

/* Filter row ky of V channels (cl .. cl + V - 1 of the tile) from sw. */
template <int K, int V>
__device__ __forceinline__ void dw_row16(const float *sw, int ky, int tc, int cl, float (&wr)[K][V])
{
#pragma unroll
    for (int kx = 0; kx < K; kx++) {
        const float4 *p = reinterpret_cast<const float4 *>(sw + (ky * K + kx) * tc + cl);
#pragma unroll
        for (int h = 0; h < V / 4; h++) {
            const float4 q = p[h];
            wr[kx][4 * h] = q.x;
            wr[kx][4 * h + 1] = q.y;
            wr[kx][4 * h + 2] = q.z;
            wr[kx][4 * h + 3] = q.w;
        }
    }
}

/* The tile's filter into sw as [tap][channel of the tile] (zero past c);
 * FLIP stores tap t at kk - 1 - t (the filter turned by 180 degrees). */
template <typename T, bool FLIP>
__device__ __forceinline__ void dw_load_filter16(const T *__restrict__ w, float *sw, int c0, int tc, int c, int kk)
{
    for (int j = threadIdx.x; j < kk * tc; j += blockDim.x) {
        const int t = j / tc, cl = j - t * tc, ch = c0 + cl, src = FLIP ? kk - 1 - t : t;
        sw[j] = ch < c ? cu_f(w[(size_t)ch * kk + src]) : 0.f;
    }
}

/* A correlation y[n, oy, ox] = b + sum w[ky, kx] x[n, oy*S - p + ky, ox*S - p + kx]
 * over G (input G.h x G.w, output G.oh x G.ow, pad G.p): the forward, and
 * with FLIP (the filter turned) and pad k - 1 - p over dy the stride-1
 * backward-data. Thread (cv, slot) takes items slot + blockIdx.x * slots,
 * then every gridDim.x * slots further; item q is output row r = q / nst
 * (r = n * oh + oy) and its strip q % nst of DW_TW columns. */
template <typename T, int K, int S, bool FLIP>
__global__ void __launch_bounds__(DW_TPB) k_dw_corr16(const T *__restrict__ x, const T *__restrict__ w,
                                                      const float *__restrict__ b, T *__restrict__ y, dw_shape G,
                                                      int cvt, int items)
{
    constexpr int V = 16 / sizeof(T), U = S * (DW_TW - 1) + K;
    __shared__ __align__(16) float sw[DW_KMAX * DW_KMAX * DW_TC16];
    const int tc = cvt * V, c0 = blockIdx.y * tc, slots = DW_TPB / cvt;
    dw_load_filter16<T, FLIP>(w, sw, c0, tc, G.c, K * K);
    __syncthreads();
    const int cv = threadIdx.x % cvt, slot = threadIdx.x / cvt, cl = cv * V, c = c0 + cl;
    if (slot >= slots || c >= G.c)
        return;
    float bv[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        bv[v] = b ? b[c + v] : 0.f;
    const int nst = (G.ow + DW_TW - 1) / DW_TW;
    for (int q = blockIdx.x * slots + slot; q < items; q += gridDim.x * slots) {
        const int r = q / nst, ox0 = (q - r * nst) * DW_TW, oy = r % G.oh, ni = r / G.oh;
        float acc[DW_TW][V];
#pragma unroll
        for (int t = 0; t < DW_TW; t++)
#pragma unroll
            for (int v = 0; v < V; v++)
                acc[t][v] = bv[v];
        const int iy0 = oy * S - G.p, ix0 = ox0 * S - G.p;
#pragma unroll
        for (int ky = 0; ky < K; ky++) {
            const int iy = iy0 + ky;
            if ((unsigned)iy >= (unsigned)G.h)
                continue;
            const T *xr = x + ((size_t)ni * G.h + iy) * G.w * G.c + c;
            float wr[K][V];
            dw_row16<K, V>(sw, ky, tc, cl, wr);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int ix = ix0 + u;
                if ((unsigned)ix >= (unsigned)G.w)
                    continue;
                float xv[V];
                cu_ld<T, V>(xr + (size_t)ix * G.c, xv);
#pragma unroll
                for (int t = 0; t < DW_TW; t++) {
                    const int kx = u - S * t; /* a constant once unrolled */
                    if (kx < 0 || kx >= K)
                        continue;
#pragma unroll
                    for (int v = 0; v < V; v++)
                        acc[t][v] = fmaf(wr[kx][v], xv[v], acc[t][v]);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < DW_TW; t++)
            if (ox0 + t < G.ow)
                cu_st<T, V>(y + ((size_t)r * G.ow + ox0 + t) * G.c + c, acc[t]);
    }
}

/* Stride-2 backward-data: only the taps whose output pixel exists are
 * gathered. Input pixel (iy, ix) is hit by filter row ky where iy + p - ky is
 * even (ky = ky0, ky0 + 2, ... with ky0 = (iy + p) & 1, output row
 * (iy + p - ky) / 2), and likewise along x. A strip is DW_TW input columns of
 * one parity rho (ix = rho + 2m, m = m0 .. m0 + DW_TW - 1): they share the
 * hitting taps kx = kx0 + 2e (kx0 = (rho + p) & 1), and tap e of column m
 * reads output column B + m - e (B = (rho + p - kx0) / 2), so the strip's
 * DW_TW * E taps read DW_TW + E - 1 consecutive output columns. Item q is
 * input row r = q / (2 * nst) (r = n * h + iy), parity and strip from the
 * rest. */
template <typename T, int K>
__global__ void __launch_bounds__(DW_TPB) k_dw_dgrad2_16(const T *__restrict__ dy, const T *__restrict__ w,
                                                         T *__restrict__ dx, dw_shape G, int cvt, int items)
{
    constexpr int V = 16 / sizeof(T), E = (K + 1) / 2;
    __shared__ __align__(16) float sw[DW_KMAX * DW_KMAX * DW_TC16];
    const int tc = cvt * V, c0 = blockIdx.y * tc, slots = DW_TPB / cvt;
    dw_load_filter16<T, false>(w, sw, c0, tc, G.c, K * K);
    __syncthreads();
    const int cv = threadIdx.x % cvt, slot = threadIdx.x / cvt, cl = cv * V, c = c0 + cl;
    if (slot >= slots || c >= G.c)
        return;
    const int nst = ((G.w + 1) / 2 + DW_TW - 1) / DW_TW;
    for (int q = blockIdx.x * slots + slot; q < items; q += gridDim.x * slots) {
        const int r = q / (2 * nst), rest = q - r * (2 * nst), rho = rest / nst;
        const int m0 = (rest - rho * nst) * DW_TW, iy = r % G.h, ni = r / G.h;
        const int ky0 = (iy + G.p) & 1, kx0 = (rho + G.p) & 1, B = (rho + G.p - kx0) >> 1;
        const int oyb = (iy + G.p - ky0) >> 1;
        float acc[DW_TW][V];
#pragma unroll
        for (int t = 0; t < DW_TW; t++)
#pragma unroll
            for (int v = 0; v < V; v++)
                acc[t][v] = 0.f;
#pragma unroll
        for (int f = 0; f < E; f++) {
            const int ky = ky0 + 2 * f, oy = oyb - f;
            if (ky >= K || (unsigned)oy >= (unsigned)G.oh)
                continue;
            const T *dr = dy + ((size_t)ni * G.oh + oy) * G.ow * G.c + c;
            /* taps kx0, kx0 + 2, ... of row ky: tap e is kx0 + 2e */
            float wr[E][V];
#pragma unroll
            for (int e = 0; e < E; e++) {
                const int kx = kx0 + 2 * e;
#pragma unroll
                for (int v = 0; v < V; v++) {
                    wr[e][v] = 0.f;
                    if (kx < K)
                        wr[e][v] = sw[(ky * K + kx) * tc + cl + v];
                }
            }
#pragma unroll
            for (int u = 1 - E; u < DW_TW; u++) {
                const int ox = B + m0 + u;
                if ((unsigned)ox >= (unsigned)G.ow)
                    continue;
                float g[V];
                cu_ld<T, V>(dr + (size_t)ox * G.c, g);
#pragma unroll
                for (int t = 0; t < DW_TW; t++) {
                    const int e = t - u; /* a constant once unrolled */
                    if (e < 0 || e >= E || kx0 + 2 * e >= K)
                        continue;
#pragma unroll
                    for (int v = 0; v < V; v++)
                        acc[t][v] = fmaf(wr[e][v], g[v], acc[t][v]);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < DW_TW; t++) {
            const int ix = rho + 2 * (m0 + t);
            if (ix < G.w)
                cu_st<T, V>(dx + ((size_t)r * G.w + ix) * G.c + c, acc[t]);
        }
    }
}

/* Backward-filter, first pass, in 16-byte vectors: as k_dw_wgrad, block
 * (chunk, tile) sums over the output rows [r0, r1) of its chunk, thread
 * (slot, ky, cv) holding filter row ky of its V channels, but a thread's
 * items are (row, strip of DW_TW output columns): it loads the strip's dy
 * once and each input column its taps touch once. The slots' sums are then
 * added in slot order, one channel of the V at a time through shared
 * memory, into part[chunk][c * k*k + tap]. The order of every sum is fixed
 * by the shape. */
template <typename T, int K, int S>
__global__ void __launch_bounds__(DW_TPB) k_dw_wgrad16(const T *__restrict__ x, const T *__restrict__ dy,
                                                       float *__restrict__ part, dw_shape G, int cvt, int chunks)
{
    constexpr int V = 16 / sizeof(T), U = S * (DW_TW - 1) + K;
    __shared__ float red[DW_TPB * DW_KMAX];
    const int tc = cvt * V;
    const int cv = threadIdx.x % cvt, rest = threadIdx.x / cvt, ky = rest % K, slot = rest / K;
    const int slots = DW_TPB / (cvt * K), c = blockIdx.y * tc + cv * V;
    const int active = slot < slots && c < G.c;
    const size_t rows = (size_t)G.n * G.oh, chunk = blockIdx.x;
    const int r0 = (int)(chunk * rows / chunks), r1 = (int)((chunk + 1) * rows / chunks);
    const int nst = (G.ow + DW_TW - 1) / DW_TW, items = (r1 - r0) * nst;
    float acc[K][V];
#pragma unroll
    for (int kx = 0; kx < K; kx++)
#pragma unroll
        for (int v = 0; v < V; v++)
            acc[kx][v] = 0.f;
    if (active) {
        for (int q = slot; q < items; q += slots) {
            const int qr = q / nst, r = r0 + qr, ox0 = (q - qr * nst) * DW_TW, oy = r % G.oh, ni = r / G.oh;
            const int iy = oy * S - G.p + ky;
            if ((unsigned)iy >= (unsigned)G.h)
                continue;
            const int nt = G.ow - ox0 < DW_TW ? G.ow - ox0 : DW_TW;
            float g[DW_TW][V];
#pragma unroll
            for (int t = 0; t < DW_TW; t++) {
                if (t < nt) {
                    cu_ld<T, V>(dy + ((size_t)r * G.ow + ox0 + t) * G.c + c, g[t]);
                } else {
#pragma unroll
                    for (int v = 0; v < V; v++)
                        g[t][v] = 0.f;
                }
            }
            const T *xr = x + ((size_t)ni * G.h + iy) * G.w * G.c + c;
            const int ix0 = ox0 * S - G.p;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int ix = ix0 + u;
                if ((unsigned)ix >= (unsigned)G.w)
                    continue;
                float xv[V];
                cu_ld<T, V>(xr + (size_t)ix * G.c, xv);
#pragma unroll
                for (int t = 0; t < DW_TW; t++) {
                    const int kx = u - S * t; /* a constant once unrolled */
                    if (kx < 0 || kx >= K || t >= nt)
                        continue;
#pragma unroll
                    for (int v = 0; v < V; v++)
                        acc[kx][v] = fmaf(g[t][v], xv[v], acc[kx][v]);
                }
            }
        }
    }
    float *mine = red + (size_t)threadIdx.x * DW_KMAX;
    float *out = part + chunk * (size_t)G.c * (K * K);
#pragma unroll
    for (int v = 0; v < V; v++) {
        __syncthreads(); /* the previous channel's sums have been read */
#pragma unroll
        for (int kx = 0; kx < K; kx++)
            mine[kx] = acc[kx][v];
        __syncthreads();
        if (slot == 0 && active)
            for (int kx = 0; kx < K; kx++) {
                float sum = 0.f;
                for (int sl = 0; sl < slots; sl++)
                    sum += red[(size_t)((sl * K + ky) * cvt + cv) * DW_KMAX + kx];
                out[(size_t)(c + v) * (K * K) + ky * K + kx] = sum;
            }
    }
}

/* ---- launchers -------------------------------------------------------------- */

static int dw_check(const char *fn, sf_dtype dt, int n, int c, int h, int w, int k, int stride, int pad, dw_shape *S)
{
    if (!sf_conv_dw_ok(SF_LAYOUT_NHWC, dt, c, c, c, k, stride, pad, 1) || n < 0 || h < 1 || w < 1 ||
        h + 2 * pad < k || w + 2 * pad < k) {
        sf_cuda_set_error("%s:%d: %s: no depthwise kernel for n%d c%d %dx%d k%d s%d p%d (dtype %d)", __FILE__,
                          __LINE__, fn, n, c, h, w, k, stride, pad, (int)dt);
        return -1;
    }
    S->n = n;
    S->c = c;
    S->h = h;
    S->w = w;
    S->k = k;
    S->s = stride;
    S->p = pad;
    S->oh = dw_out(h, k, stride, pad);
    S->ow = dw_out(w, k, stride, pad);
    return 0;
}

/* V = 2 where the channel count is even and every pointer read or written
 * in words holds whole words of two elements. */
static int dw_vec(sf_dtype dt, int c, const void *a, const void *b)
{
    const uintptr_t m = (uintptr_t)(2 * sf_dtype_size(dt) - 1);
    return (c & 1) == 0 && ((uintptr_t)a & m) == 0 && ((uintptr_t)b & m) == 0 ? 2 : 1;
}

static int dw_cvt(int c, int V)
{
    const int cv = (c + V - 1) / V;
    return cv < 32 ? cv : 32;
}

/* Grid of the forward and backward-data over P pixels. */
static dim3 dw_grid(size_t P, int c, int cvt, int V)
{
    const size_t slots = DW_TPB / cvt, tiles = cu_cdiv((size_t)c, (size_t)cvt * V);
    size_t gx = cu_cdiv(P, slots);
    if (gx > DW_MAX_GX)
        gx = DW_MAX_GX;
    return dim3((unsigned)gx, (unsigned)tiles, 1);
}

/* V of the 16-byte kernels for this call (16 / element size), or 0 where
 * they do not apply: a channel count that is not a multiple of V, a tensor
 * read or written in vectors that does not start on a 16-byte boundary, or a
 * kernel size they are not built for (1). */
static int dw_v16(sf_dtype dt, int c, int k, const void *a, const void *b)
{
    const int V = 16 / (int)sf_dtype_size(dt);
    return c % V == 0 && (k == 3 || k == 5 || k == 7) && ((uintptr_t)a & 15) == 0 && ((uintptr_t)b & 15) == 0 ? V
                                                                                                            : 0;
}

/* Threads across one channel tile of the 16-byte kernels: all c / V vectors
 * where they fit in DW_TC16 channels, else a divisor of c / V between half
 * and all of DW_TC16 / V (so every tile is full), else DW_TC16 / V with a
 * partial last tile. */
static int dw_cvt16(int c, int V)
{
    const int cv = c / V, cap = DW_TC16 / V;
    if (cv <= cap)
        return cv;
    for (int d = cap; d >= cap / 2; d--)
        if (cv % d == 0)
            return d;
    return cap;
}

/* Grid of the 16-byte forward and backward-data over `items` work items. */
static dim3 dw_grid16(size_t items, int c, int cvt, int V)
{
    const size_t slots = DW_TPB / cvt, tiles = cu_cdiv((size_t)c, (size_t)cvt * V);
    size_t gx = cu_cdiv(items, slots);
    if (gx > DW_MAX_GX)
        gx = DW_MAX_GX;
    return dim3((unsigned)gx, (unsigned)tiles, 1);
}

/* FLIP comes only with stride 1 (the stride-1 backward-data), so no turned
 * stride-2 kernel is built. */
template <typename T, int K, bool FLIP>
static void dw_corr16_k(const T *x, const T *w, const float *b, T *y, const dw_shape &G, int cvt, int items,
                        cudaStream_t s)
{
    const dim3 g = dw_grid16((size_t)items, G.c, cvt, 16 / sizeof(T));
    if (G.s == 1)
        k_dw_corr16<T, K, 1, FLIP><<<g, DW_TPB, 0, s>>>(x, w, b, y, G, cvt, items);
    else if constexpr (!FLIP)
        k_dw_corr16<T, K, 2, false><<<g, DW_TPB, 0, s>>>(x, w, b, y, G, cvt, items);
}

/* The correlation G (k_dw_corr16) in 16-byte vectors, or 0 without a launch
 * where its work items do not fit the kernels' int indices. */
template <typename T, bool FLIP>
static int dw_corr16(const void *x, const void *w, const float *b, void *y, const dw_shape &G, cudaStream_t s)
{
    const int V = 16 / sizeof(T), cvt = dw_cvt16(G.c, V);
    const size_t items = (size_t)G.n * G.oh * cu_cdiv((size_t)G.ow, DW_TW);
    if (items > DW_ITEMS_MAX)
        return 0;
    const T *xt = (const T *)x, *wt = (const T *)w;
    T *yt = (T *)y;
    if (G.k == 3)
        dw_corr16_k<T, 3, FLIP>(xt, wt, b, yt, G, cvt, (int)items, s);
    else if (G.k == 5)
        dw_corr16_k<T, 5, FLIP>(xt, wt, b, yt, G, cvt, (int)items, s);
    else
        dw_corr16_k<T, 7, FLIP>(xt, wt, b, yt, G, cvt, (int)items, s);
    return 1;
}

template <typename T>
static int dw_fwd_t(const void *x, const void *w, const float *b, void *y, const dw_shape &S, cudaStream_t s)
{
    if (dw_v16(sizeof(T) == 2 ? SF_DT_BF16 : SF_DT_F32, S.c, S.k, x, y) && dw_corr16<T, false>(x, w, b, y, S, s)) {
        SF_CUDA_CHECK_LAUNCH();
        return 0;
    }
    const int V = dw_vec(sizeof(T) == 2 ? SF_DT_BF16 : SF_DT_F32, S.c, x, y), cvt = dw_cvt(S.c, V);
    const dim3 g = dw_grid((size_t)S.n * S.oh * S.ow, S.c, cvt, V);
    if (V == 2)
        k_dw_fwd<T, 2><<<g, DW_TPB, 0, s>>>((const T *)x, (const T *)w, b, (T *)y, S, cvt);
    else
        k_dw_fwd<T, 1><<<g, DW_TPB, 0, s>>>((const T *)x, (const T *)w, b, (T *)y, S, cvt);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* Stride-2 backward-data in 16-byte vectors (k_dw_dgrad2_16), or 0 without
 * a launch where its work items do not fit the kernel's int indices. */
template <typename T>
static int dw_dgrad2_16(const void *dy, const void *w, void *dx, const dw_shape &S, cudaStream_t s)
{
    const int V = 16 / sizeof(T), cvt = dw_cvt16(S.c, V);
    const size_t items = (size_t)S.n * S.h * 2 * cu_cdiv((size_t)(S.w + 1) / 2, DW_TW);
    if (items > DW_ITEMS_MAX)
        return 0;
    const dim3 g = dw_grid16(items, S.c, cvt, V);
    const T *dyt = (const T *)dy, *wt = (const T *)w;
    T *dxt = (T *)dx;
    if (S.k == 3)
        k_dw_dgrad2_16<T, 3><<<g, DW_TPB, 0, s>>>(dyt, wt, dxt, S, cvt, (int)items);
    else if (S.k == 5)
        k_dw_dgrad2_16<T, 5><<<g, DW_TPB, 0, s>>>(dyt, wt, dxt, S, cvt, (int)items);
    else
        k_dw_dgrad2_16<T, 7><<<g, DW_TPB, 0, s>>>(dyt, wt, dxt, S, cvt, (int)items);
    return 1;
}

template <typename T>
static int dw_dgrad_t(const void *dy, const void *w, void *dx, const dw_shape &S, cudaStream_t s)
{
    if (dw_v16(sizeof(T) == 2 ? SF_DT_BF16 : SF_DT_F32, S.c, S.k, dy, dx)) {
        int done;
        if (S.s == 1) {
            /* stride 1: dx is dy correlated with the turned filter at pad
             * k - 1 - p, whose output map is exactly h x w */
            dw_shape G = S;
            G.h = S.oh;
            G.w = S.ow;
            G.p = S.k - 1 - S.p;
            G.oh = S.h;
            G.ow = S.w;
            done = dw_corr16<T, true>(dy, w, NULL, dx, G, s);
        } else {
            done = dw_dgrad2_16<T>(dy, w, dx, S, s);
        }
        if (done) {
            SF_CUDA_CHECK_LAUNCH();
            return 0;
        }
    }
    const int V = dw_vec(sizeof(T) == 2 ? SF_DT_BF16 : SF_DT_F32, S.c, dy, dx), cvt = dw_cvt(S.c, V);
    const dim3 g = dw_grid((size_t)S.n * S.h * S.w, S.c, cvt, V);
    if (V == 2)
        k_dw_dgrad<T, 2><<<g, DW_TPB, 0, s>>>((const T *)dy, (const T *)w, (T *)dx, S, cvt);
    else
        k_dw_dgrad<T, 1><<<g, DW_TPB, 0, s>>>((const T *)dy, (const T *)w, (T *)dx, S, cvt);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T, int K>
static void dw_wgrad16_k(const T *x, const T *dy, float *part, const dw_shape &S, int cvt, int chunks, cudaStream_t s)
{
    const dim3 g((unsigned)chunks, (unsigned)cu_cdiv((size_t)S.c, (size_t)cvt * (16 / sizeof(T))), 1);
    if (S.s == 1)
        k_dw_wgrad16<T, K, 1><<<g, DW_TPB, 0, s>>>(x, dy, part, S, cvt, chunks);
    else
        k_dw_wgrad16<T, K, 2><<<g, DW_TPB, 0, s>>>(x, dy, part, S, cvt, chunks);
}

template <typename T>
static int dw_wgrad_t(const void *x, const void *dy, void *dw, float *part, const dw_shape &S, cudaStream_t s)
{
    const int chunks = dw_wg_chunks(S.n, S.c, S.oh), kk = S.k * S.k;
    const size_t items = (size_t)S.n * S.oh * cu_cdiv((size_t)S.ow, DW_TW);
    if (dw_v16(sizeof(T) == 2 ? SF_DT_BF16 : SF_DT_F32, S.c, S.k, x, dy) && items <= DW_ITEMS_MAX) {
        const int cvt = dw_cvt16(S.c, 16 / sizeof(T));
        const T *xt = (const T *)x, *dyt = (const T *)dy;
        if (S.k == 3)
            dw_wgrad16_k<T, 3>(xt, dyt, part, S, cvt, chunks, s);
        else if (S.k == 5)
            dw_wgrad16_k<T, 5>(xt, dyt, part, S, cvt, chunks, s);
        else
            dw_wgrad16_k<T, 7>(xt, dyt, part, S, cvt, chunks, s);
    } else {
        const int V = dw_vec(sizeof(T) == 2 ? SF_DT_BF16 : SF_DT_F32, S.c, x, dy), cvt = dw_cvt(S.c, V);
        const dim3 g((unsigned)chunks, (unsigned)cu_cdiv((size_t)S.c, (size_t)cvt * V), 1);
        if (V == 2)
            k_dw_wgrad<T, 2><<<g, DW_TPB, 0, s>>>((const T *)x, (const T *)dy, part, S, cvt, chunks);
        else
            k_dw_wgrad<T, 1><<<g, DW_TPB, 0, s>>>((const T *)x, (const T *)dy, part, S, cvt, chunks);
    }
    SF_CUDA_CHECK_LAUNCH();
    const int nj = S.c * kk;
    k_sum_partials<T><<<cu_blocks((size_t)nj * 32, CU_TPB), CU_TPB, 0, s>>>(part, chunks, nj, nj, (T *)dw, NULL);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_conv_dw_fwd(sf_dtype dt, const void *x, const void *w, const float *b, void *y, int n, int c, int h,
                              int w_, int k, int stride, int pad, cudaStream_t s)
{
    dw_shape S;
    if (dw_check("sf_conv_dw_fwd", dt, n, c, h, w_, k, stride, pad, &S))
        return -1;
    if (n == 0)
        return 0;
    return dt == SF_DT_BF16 ? dw_fwd_t<cu_bf16>(x, w, b, y, S, s) : dw_fwd_t<float>(x, w, b, y, S, s);
}

extern "C" int sf_conv_dw_bwd_data(sf_dtype dt, const void *dy, const void *w, void *dx, int n, int c, int h, int w_,
                                   int k, int stride, int pad, cudaStream_t s)
{
    dw_shape S;
    if (dw_check("sf_conv_dw_bwd_data", dt, n, c, h, w_, k, stride, pad, &S))
        return -1;
    if (n == 0)
        return 0;
    return dt == SF_DT_BF16 ? dw_dgrad_t<cu_bf16>(dy, w, dx, S, s) : dw_dgrad_t<float>(dy, w, dx, S, s);
}

extern "C" int sf_conv_dw_bwd_filter(sf_dtype dt, const void *x, const void *dy, void *dw, int n, int c, int h,
                                     int w_, int k, int stride, int pad, float *scratch, cudaStream_t s)
{
    dw_shape S;
    if (dw_check("sf_conv_dw_bwd_filter", dt, n, c, h, w_, k, stride, pad, &S))
        return -1;
    if (n == 0) { /* no pixels: the gradient is zero */
        SF_CUDA_CHECK(cudaMemsetAsync(dw, 0, (size_t)c * k * k * sf_dtype_size(dt), s));
        return 0;
    }
    return dt == SF_DT_BF16 ? dw_wgrad_t<cu_bf16>(x, dy, dw, scratch, S, s)
                            : dw_wgrad_t<float>(x, dy, dw, scratch, S, s);
}
