/* gpu/cuda/conv_dw.cu — depthwise NHWC convolutions as memory-bound
 * kernels (why and semantics: conv_dw.h).
 *
 * Threads: a block of DW_TPB threads takes one tile of channels (blockIdx.y)
 * and a set of pixels. Within it, cvt neighbouring threads cover the tile's
 * channels, V at a time (V = 2: a bf16x2 or float2 word per thread where the
 * channel count is even and the pointers allow it, else 1), so a warp reads
 * consecutive channels of a pixel (coalesced NHWC rows); the other threads
 * of the block take further pixels ("slots"). cvt is min(32, c / V): a map
 * with few channels (32 in EfficientNet-B0's first block) puts several
 * pixels in a warp rather than leaving lanes idle. The tile's filter sits in
 * shared memory as [tap][channel], so the taps of V channels are adjacent.
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

template <typename T>
static int dw_fwd_t(const void *x, const void *w, const float *b, void *y, const dw_shape &S, cudaStream_t s)
{
    const int V = dw_vec(sizeof(T) == 2 ? SF_DT_BF16 : SF_DT_F32, S.c, x, y), cvt = dw_cvt(S.c, V);
    const dim3 g = dw_grid((size_t)S.n * S.oh * S.ow, S.c, cvt, V);
    if (V == 2)
        k_dw_fwd<T, 2><<<g, DW_TPB, 0, s>>>((const T *)x, (const T *)w, b, (T *)y, S, cvt);
    else
        k_dw_fwd<T, 1><<<g, DW_TPB, 0, s>>>((const T *)x, (const T *)w, b, (T *)y, S, cvt);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int dw_dgrad_t(const void *dy, const void *w, void *dx, const dw_shape &S, cudaStream_t s)
{
    const int V = dw_vec(sizeof(T) == 2 ? SF_DT_BF16 : SF_DT_F32, S.c, dy, dx), cvt = dw_cvt(S.c, V);
    const dim3 g = dw_grid((size_t)S.n * S.h * S.w, S.c, cvt, V);
    if (V == 2)
        k_dw_dgrad<T, 2><<<g, DW_TPB, 0, s>>>((const T *)dy, (const T *)w, (T *)dx, S, cvt);
    else
        k_dw_dgrad<T, 1><<<g, DW_TPB, 0, s>>>((const T *)dy, (const T *)w, (T *)dx, S, cvt);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int dw_wgrad_t(const void *x, const void *dy, void *dw, float *part, const dw_shape &S, cudaStream_t s)
{
    const int V = dw_vec(sizeof(T) == 2 ? SF_DT_BF16 : SF_DT_F32, S.c, x, dy), cvt = dw_cvt(S.c, V);
    const int chunks = dw_wg_chunks(S.n, S.c, S.oh), kk = S.k * S.k;
    const dim3 g((unsigned)chunks, (unsigned)cu_cdiv((size_t)S.c, (size_t)cvt * V), 1);
    if (V == 2)
        k_dw_wgrad<T, 2><<<g, DW_TPB, 0, s>>>((const T *)x, (const T *)dy, part, S, cvt, chunks);
    else
        k_dw_wgrad<T, 1><<<g, DW_TPB, 0, s>>>((const T *)x, (const T *)dy, part, S, cvt, chunks);
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
