/* gpu/cuda/kernel_common.cuh — helpers the op families' kernels share (C++ and
 * CUDA only; not part of any launcher's contract): grid sizing, alignment
 * checks, element-type conversion, 16-byte vector loads and stores, and a
 * fixed-order block sum.
 *
 * Element types: the activation kernels are templates on T (float or
 * __nv_bfloat16); they load T, compute in fp32 (statistics in double) and round
 * each output once to T. The fp32 launchers are the T = float instances, with
 * the same arithmetic (and so the same bits) as a float-only kernel would do.
 * Vector paths move 16 bytes a thread (4 floats or 8 bf16) when the shape and
 * the pointers allow it, checked at run time, with a scalar fallback.
 */
#ifndef SF_GPU_CUDA_KERNEL_COMMON_CUH
#define SF_GPU_CUDA_KERNEL_COMMON_CUH

#include <cuda_bf16.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cuda/tensor.h"

#define CU_TPB 256
/* Blocks a per-channel reduction aims for, whatever the device: the partial
 * sums (and so the rounding) must depend on the shape alone. */
#define CU_RED_BLOCKS 1024
/* Blocks of the cross-entropy's first pass at most (its partials' count). */
#define CU_XENT_BLOCKS 1024
/* Vectors a thread of an elementwise kernel loads before it stores. */
#define CU_UNROLL 4

typedef __nv_bfloat16 cu_bf16;

static inline unsigned int cu_blocks(size_t work, unsigned int tpb)
{
    size_t b = (work + tpb - 1) / tpb;
    return (unsigned int)(b ? b : 1);
}

static inline int cu_al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static inline size_t cu_cdiv(size_t a, size_t b) { return (a + b - 1) / b; }
/* Whether every V-element vector of an [n, c, hw] map lies within one
 * sample's V consecutive channels (NHWC: c % V == 0) or one channel's plane
 * (NCHW: hw % V == 0): the shape a per-channel or broadcast vector kernel
 * needs. */
static inline int cu_chan_vec_ok(int nhwc, int c, size_t hw, int V)
{
    return nhwc ? c % V == 0 : hw % (size_t)V == 0;
}

/* Multiprocessors of the current device (cached per device; 132 when it cannot
 * be asked). Only elementwise grids depend on it, never a reduction's order. */
static inline int cu_sms(void)
{
    static int cache[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return 132;
    int v = __atomic_load_n(&cache[dev], __ATOMIC_RELAXED);
    if (v < 1) {
        if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v < 1)
            v = 132;
        __atomic_store_n(&cache[dev], v, __ATOMIC_RELAXED);
    }
    return v;
}

/* Grid of a grid-stride elementwise kernel over `work` items of CU_TPB-thread
 * blocks: enough blocks to fill the device once, no more. */
static inline unsigned int cu_ew_blocks(size_t work)
{
    const size_t most = (size_t)cu_sms() * (2048 / CU_TPB);
    const size_t b = cu_cdiv(work ? work : 1, CU_TPB);
    return (unsigned int)(b < most ? b : most);
}

static inline int cu_dt_bad(const char *fn, sf_dtype dt)
{
    if (dt == SF_DT_F32 || dt == SF_DT_BF16)
        return 0;
    sf_cuda_set_error("%s:%d: %s: unknown element type %d", __FILE__, __LINE__, fn, (int)dt);
    return 1;
}

/* ---- element types -------------------------------------------------------- */

__device__ __forceinline__ float cu_f(float v) { return v; }
__device__ __forceinline__ float cu_f(cu_bf16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T cu_to(float v);
template <> __device__ __forceinline__ float cu_to<float>(float v) { return v; }
template <> __device__ __forceinline__ cu_bf16 cu_to<cu_bf16>(float v) { return __float2bfloat16_rn(v); }

/* Two bf16 packed in a 32-bit word (element 0 in the low half) <-> floats. */
__device__ __forceinline__ void cu_bf2(unsigned u, float &a, float &b)
{
    a = __uint_as_float(u << 16);
    b = __uint_as_float(u & 0xffff0000u);
}
__device__ __forceinline__ unsigned cu_pk2(float a, float b)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<unsigned *>(&h);
}

/* 16 bytes as V = 16/sizeof(T) floats, and back (rounding once to T). */
template <typename T> __device__ __forceinline__ void cu_unpack(const uint4 &r, float *f)
{
    if constexpr (sizeof(T) == 4) {
        f[0] = __uint_as_float(r.x);
        f[1] = __uint_as_float(r.y);
        f[2] = __uint_as_float(r.z);
        f[3] = __uint_as_float(r.w);
    } else {
        cu_bf2(r.x, f[0], f[1]);
        cu_bf2(r.y, f[2], f[3]);
        cu_bf2(r.z, f[4], f[5]);
        cu_bf2(r.w, f[6], f[7]);
    }
}
template <typename T> __device__ __forceinline__ uint4 cu_pack(const float *f)
{
    uint4 r;
    if constexpr (sizeof(T) == 4) {
        r.x = __float_as_uint(f[0]);
        r.y = __float_as_uint(f[1]);
        r.z = __float_as_uint(f[2]);
        r.w = __float_as_uint(f[3]);
    } else {
        r.x = cu_pk2(f[0], f[1]);
        r.y = cu_pk2(f[2], f[3]);
        r.z = cu_pk2(f[4], f[5]);
        r.w = cu_pk2(f[6], f[7]);
    }
    return r;
}

/* V elements at p as floats: V == 1, or V == 16/sizeof(T) with p 16-byte aligned. */
template <typename T, int V> __device__ __forceinline__ void cu_ld(const T *p, float *f)
{
    if constexpr (V == 1) {
        f[0] = cu_f(*p);
    } else {
        static_assert(V * sizeof(T) == 16, "a vector is 16 bytes");
        cu_unpack<T>(*reinterpret_cast<const uint4 *>(p), f);
    }
}
template <typename T, int V> __device__ __forceinline__ void cu_st(T *p, const float *f)
{
    if constexpr (V == 1) {
        *p = cu_to<T>(f[0]);
    } else {
        static_assert(V * sizeof(T) == 16, "a vector is 16 bytes");
        *reinterpret_cast<uint4 *>(p) = cu_pack<T>(f);
    }
}
/* V int32 (1, 4 or 8; 16-byte aligned when > 1). */
template <int V> __device__ __forceinline__ void cu_ldi(const int32_t *p, int *a)
{
    if constexpr (V == 1) {
        a[0] = *p;
    } else {
#pragma unroll
        for (int q = 0; q < V / 4; q++) {
            const int4 t = reinterpret_cast<const int4 *>(p)[q];
            a[4 * q] = t.x;
            a[4 * q + 1] = t.y;
            a[4 * q + 2] = t.z;
            a[4 * q + 3] = t.w;
        }
    }
}
/* V fp32 values at p (V a multiple of 4, p 16-byte aligned): a parameter's
 * values for the V channels of a vector. */
template <int V> __device__ __forceinline__ void cu_ldf(const float *__restrict__ p, float *f)
{
#pragma unroll
    for (int q = 0; q < V / 4; q++) {
        const float4 t = reinterpret_cast<const float4 *>(p)[q];
        f[4 * q] = t.x;
        f[4 * q + 1] = t.y;
        f[4 * q + 2] = t.z;
        f[4 * q + 3] = t.w;
    }
}
/* A batchnorm's output before its ReLU, rounded operation by operation (no
 * contraction left to the compiler), so that every kernel that recomputes it
 * (the backward's ReLU mask, a maxpool reading the batchnorm's input) makes
 * the forward's own decisions and values. */
__device__ __forceinline__ float bn_out(float x, float mu, float iv, float ga, float be)
{
    return __fmaf_rn(__fmul_rn(__fsub_rn(x, mu), iv), ga, be);
}

template <int V> __device__ __forceinline__ void cu_sti(int32_t *p, const int *a)
{
    if constexpr (V == 1) {
        *p = a[0];
    } else {
#pragma unroll
        for (int q = 0; q < V / 4; q++)
            reinterpret_cast<int4 *>(p)[q] = make_int4(a[4 * q], a[4 * q + 1], a[4 * q + 2], a[4 * q + 3]);
    }
}

/* The V values of an [n, c] tensor b that vector i (V elements) of an
 * [n, c, hw] map broadcasts over H,W: V consecutive channels of its sample
 * (NHWC, c % V == 0, b 16-byte aligned), or its plane's one value (NCHW,
 * hw % V == 0). cv = c / V. */
template <typename T, int V>
__device__ __forceinline__ void cu_ld_bcast(const T *b, size_t i, int c, size_t cv, size_t hw, int nhwc, float *f)
{
    if (nhwc) {
        cu_ld<T, V>(b + (i / (hw * cv)) * (size_t)c + (i % cv) * V, f);
    } else {
        const float s = cu_f(b[i * V / hw]);
#pragma unroll
        for (int v = 0; v < V; v++)
            f[v] = s;
    }
}

/* 8 elements at p as floats (16-byte aligned p): two float4 or one uint4. */
template <typename T> __device__ __forceinline__ void cu_ld8(const T *p, float *f)
{
    if constexpr (sizeof(T) == 4) {
        cu_ld<T, 4>(p, f);
        cu_ld<T, 4>(p + 4, f + 4);
    } else {
        cu_ld<T, 8>(p, f);
    }
}
template <typename T> __device__ __forceinline__ void cu_st8(T *p, const float *f)
{
    if constexpr (sizeof(T) == 4) {
        cu_st<T, 4>(p, f);
        cu_st<T, 4>(p + 4, f + 4);
    } else {
        cu_st<T, 8>(p, f);
    }
}

/* ---- shared helpers ------------------------------------------------------ */

/* Block-wide sum of two doubles in a fixed order (warp shuffles, then warp 0
 * over the warps' results). Result valid in thread 0. */
__device__ __forceinline__ void block_sum2(double &a, double &b)
{
    __shared__ double sa[32], sb[32];
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, o);
        b += __shfl_down_sync(0xffffffffu, b, o);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads(); /* the shared arrays may be in use by a previous call */
    if (lane == 0) {
        sa[warp] = a;
        sb[warp] = b;
    }
    __syncthreads();
    if (warp == 0) {
        a = lane < nw ? sa[lane] : 0.0;
        b = lane < nw ? sb[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) {
            a += __shfl_down_sync(0xffffffffu, a, o);
            b += __shfl_down_sync(0xffffffffu, b, o);
        }
    }
}

/* The block-wide sum of every thread's v, in a fixed order (warp shuffles,
 * then thread 0 over the warps in warp order), so that it does not depend
 * on scheduling; valid in thread 0. sh: CU_TPB / 32 floats of shared memory.
 * Every thread of the block calls it (it synchronises the block). */
__device__ __forceinline__ float cu_block_sum(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            s += sh[w];
    return s;
}

/* The second pass of a two-pass reduction whose first pass left nblk rows of
 * nj partial sums (part[block][j]): one warp per output, in a fixed order.
 * Outputs j < nw go to dw (type T), the rest to db[j - nw] (fp32; NULL: not
 * wanted). Launch with 32 * nj threads. */
template <typename T>
__global__ void k_sum_partials(const float *__restrict__ part, int nblk, int nw, int nj, T *__restrict__ dw,
                               float *__restrict__ db)
{
    const int j = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (j >= nj)
        return;
    float v = 0.f;
    for (int k = lane; k < nblk; k += 32)
        v += part[(size_t)k * nj + j];
#pragma unroll
    for (int o = 16; o; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane)
        return;
    if (j < nw)
        dw[j] = cu_to<T>(v);
    else if (db)
        db[j - nw] = v;
}

/* The first pass of a per-channel two-pass reduction of term(x, dy) over a
 * map [n, c, hw] (a layer scale's or a PReLU slope's gradient), for
 * k_sum_partials to finish. Each block sums in a fixed order (warp
 * shuffles, then thread 0 over the warps), so the result does not depend on
 * scheduling. */

/* NCHW: block (channel, chunk of samples) sums its samples' planes into
 * partial[chunk][c]. */
template <typename T, typename F>
__global__ void k_chan_sum_planes(const T *__restrict__ x, const T *__restrict__ dy, int n, int c, size_t hw,
                                  int n_per_chunk, float *__restrict__ partial, F term)
{
    __shared__ float sh[CU_TPB / 32];
    const int ci = blockIdx.x;
    const int n0 = blockIdx.y * n_per_chunk, n1 = n0 + n_per_chunk < n ? n0 + n_per_chunk : n;
    float acc = 0.f;
    for (int ni = n0; ni < n1; ni++) {
        const size_t base = ((size_t)ni * c + ci) * hw;
        for (size_t p = threadIdx.x; p < hw; p += blockDim.x)
            acc += term(cu_f(x[base + p]), cu_f(dy[base + p]));
    }
    const float s = cu_block_sum(acc, sh);
    if (threadIdx.x == 0)
        partial[(size_t)blockIdx.y * c + ci] = s;
}

/* NHWC or flat features, rows [R, c]: thread (channel) of block (channel
 * group, chunk of rows) sums its chunk's rows into partial[chunk][c]. */
template <typename T, typename F>
__global__ void k_chan_sum_rows(const T *__restrict__ x, const T *__restrict__ dy, size_t R, int c,
                                size_t rows_per_chunk, float *__restrict__ partial, F term)
{
    const int ci = blockIdx.x * blockDim.x + threadIdx.x;
    if (ci >= c)
        return;
    const size_t r0 = (size_t)blockIdx.y * rows_per_chunk;
    const size_t r1 = r0 + rows_per_chunk < R ? r0 + rows_per_chunk : R;
    float acc = 0.f;
    for (size_t r = r0; r < r1; r++)
        acc += term(cu_f(x[r * (size_t)c + ci]), cu_f(dy[r * (size_t)c + ci]));
    partial[(size_t)blockIdx.y * c + ci] = acc;
}

/* The chunks of those kernels: rows in at most max_chunks chunks of
 * *per rows each; samples in chunks of *per samples, enough of them that
 * about 1024 blocks run over c channels. Each returns how many chunks. */
static inline int cu_row_chunks(size_t R, size_t max_chunks, size_t *per)
{
    const size_t want = R < max_chunks ? R : max_chunks;
    *per = cu_cdiv(R, want);
    return (int)cu_cdiv(R, *per);
}

static inline int cu_plane_chunks(int n, int c, int *per)
{
    int want = c >= 1024 ? 1 : 1024 / c;
    if (want > n)
        want = n;
    *per = (n + want - 1) / want;
    return (n + *per - 1) / *per;
}

/* The per-channel scratch those chunks need: max_chunks rows of c, or about
 * 1024 planes' worth. */
static inline size_t cu_chan_sum_scratch(int c, size_t max_chunks)
{
    const size_t rows = max_chunks * (size_t)c, planes = c > 1024 ? (size_t)c : 1024 + (size_t)c;
    return rows > planes ? rows : planes;
}

/* Sums over the hw rows of each (sample, channel) of an NHWC map [n, hw, c]:
 * y[ni][ci] = scale * sum over p of a[ni][p][ci] (times b[ni][p][ci] when
 * PROD). One thread per (row stride, channel) of block (sample, tile of 32
 * channels): lanes read neighbouring channels of one row, blockDim.y warps
 * split the rows, and warp 0 adds the warps' sums in a fixed order, so the
 * result does not depend on scheduling. A thread per (sample, channel) walking
 * every row instead leaves the GPU nearly idle on early squeeze-and-excitation
 * maps (8 192 threads each reading 12 544 rows in EfficientNet-B0's first
 * block). */
template <typename T, bool PROD>
__global__ void k_nhwc_rows_sum(const T *__restrict__ a, const T *__restrict__ b, T *__restrict__ y, int c,
                                size_t hw, float scale)
{
    __shared__ float sh[32][33];
    const int tiles = (c + 31) / 32;
    const int ni = (int)(blockIdx.x / tiles), ci = (int)(blockIdx.x % tiles) * 32 + threadIdx.x;
    float acc = 0.f;
    if (ci < c) {
        const size_t base = (size_t)ni * hw * (size_t)c + (size_t)ci;
        for (size_t p = threadIdx.y; p < hw; p += blockDim.y) {
            const size_t e = base + p * (size_t)c;
            acc += PROD ? cu_f(a[e]) * cu_f(b[e]) : cu_f(a[e]);
        }
    }
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y != 0 || ci >= c)
        return;
    float s = 0.f;
    for (int w = 0; w < (int)blockDim.y; w++)
        s += sh[w][threadIdx.x];
    y[(size_t)ni * c + ci] = cu_to<T>(s * scale);
}

/* The per-channel sums over `rows` rows of c channels (row stride c, c % V
 * == 0, a and b 16-byte aligned) starting at a (times b when PROD), for the
 * up to 32 channel vectors of tile `tile`, by one block of CU_TPB threads. A
 * warp's lanes are G = min(c/V, 32) vectors of 32/G consecutive rows, so its
 * loads are one contiguous span; the CU_TPB/32 warps split the rows, each
 * thread keeps 8 rows' loads in flight, and the block adds its threads' sums
 * in a fixed order through shared memory, so the result does not depend on
 * scheduling. Returns true in the threads t < G*V whose channel
 * tile*32*V + t exists, with that channel's sum in out. Every thread of the
 * block must call it (it synchronises the block). */
template <typename T, int V, bool PROD>
__device__ __forceinline__ bool cu_rows_sum_tile(const T *__restrict__ a, const T *__restrict__ b, int c, size_t rows,
                                                 int tile, float &out)
{
    constexpr int U = 8;
    constexpr int W = CU_TPB / 32;
    __shared__ float sh[CU_TPB * V];
    const int cv = c / V, G = cv < 32 ? cv : 32, RPW = 32 / G;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane % G, ro = lane / G;
    const int vi = tile * 32 + g;
    const bool live = ro < RPW && vi < cv;
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        acc[v] = 0.f;
    if (live) {
        const size_t base = (size_t)vi * V;
        const size_t rstep = (size_t)W * RPW;
        size_t p = (size_t)warp * RPW + ro;
        for (; p + (U - 1) * rstep < rows; p += U * rstep) {
            float xa[U][V], xb[U][V];
#pragma unroll
            for (int u = 0; u < U; u++) {
                cu_ld<T, V>(a + base + (p + u * rstep) * (size_t)c, xa[u]);
                if constexpr (PROD)
                    cu_ld<T, V>(b + base + (p + u * rstep) * (size_t)c, xb[u]);
            }
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int v = 0; v < V; v++)
                    acc[v] += PROD ? xa[u][v] * xb[u][v] : xa[u][v];
        }
        for (; p < rows; p += rstep) {
            float xa[V], xb[V];
            cu_ld<T, V>(a + base + p * (size_t)c, xa);
            if constexpr (PROD)
                cu_ld<T, V>(b + base + p * (size_t)c, xb);
#pragma unroll
            for (int v = 0; v < V; v++)
                acc[v] += PROD ? xa[v] * xb[v] : xa[v];
        }
    }
#pragma unroll
    for (int v = 0; v < V; v++)
        sh[threadIdx.x * V + v] = acc[v];
    __syncthreads();
    const int t = threadIdx.x;
    if (t >= G * V || tile * 32 + t / V >= cv)
        return false;
    float sum = 0.f;
    for (int w = 0; w < W; w++)
        for (int r = 0; r < RPW; r++)
            sum += sh[(w * 32 + r * G) * V + t];
    out = sum;
    return true;
}

/* k_nhwc_rows_sum over 16-byte vectors (c % V == 0, a and b 16-byte
 * aligned): block (sample, tile of up to 32 channel vectors) sums its
 * sample's hw rows by cu_rows_sum_tile. The scalar kernel's 2-byte loads over
 * 32 channels a row left squeeze-and-excitation maps at about 1.1 TB/s on an
 * H200. */
template <typename T, int V, bool PROD>
__global__ void __launch_bounds__(CU_TPB)
    k_nhwc_rows_sum_vec(const T *__restrict__ a, const T *__restrict__ b, T *__restrict__ y, int c, size_t hw,
                        float scale)
{
    const int tiles = (c / V + 31) / 32;
    const int ni = (int)(blockIdx.x / tiles), tile = (int)(blockIdx.x % tiles);
    const size_t off = (size_t)ni * hw * (size_t)c;
    float sum = 0.f;
    if (cu_rows_sum_tile<T, V, PROD>(a + off, b + (PROD ? off : 0), c, hw, tile, sum))
        y[(size_t)ni * c + (size_t)tile * 32 * V + threadIdx.x] = cu_to<T>(sum * scale);
}

/* y[i] = f(a[i], b[i]) for i < len (b unused when NIN == 1), and the same
 * value into y2[i] when Y2 (a compile-time choice, so the single-output ops'
 * stores carry no test); grid-stride, V elements a vector (V > 1: a, b, y, y2
 * 16-byte aligned; the len % V tail goes one element a thread), CU_UNROLL
 * vectors loaded before any is stored. a, b and y may alias (no __restrict__):
 * each element is read before it is written, by the same thread. */
template <typename T, int V, int NIN, typename F, bool Y2 = false>
__global__ void k_ew(const T *a, const T *b, T *y, T *y2, size_t len, F f)
{
    const size_t nvec = len / V, step = (size_t)gridDim.x * blockDim.x;
    const size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t i = t0;
    for (; i + (CU_UNROLL - 1) * step < nvec; i += CU_UNROLL * step) {
        float u[CU_UNROLL][V], w[CU_UNROLL][V];
#pragma unroll
        for (int q = 0; q < CU_UNROLL; q++) {
            cu_ld<T, V>(a + (i + q * step) * V, u[q]);
            if constexpr (NIN == 2)
                cu_ld<T, V>(b + (i + q * step) * V, w[q]);
        }
#pragma unroll
        for (int q = 0; q < CU_UNROLL; q++) {
#pragma unroll
            for (int j = 0; j < V; j++) {
                float bb = 0.f;
                if constexpr (NIN == 2)
                    bb = w[q][j];
                u[q][j] = f(u[q][j], bb);
            }
            cu_st<T, V>(y + (i + q * step) * V, u[q]);
            if constexpr (Y2)
                cu_st<T, V>(y2 + (i + q * step) * V, u[q]);
        }
    }
    for (; i < nvec; i += step) {
        float u[V], w[V];
        cu_ld<T, V>(a + i * V, u);
        if constexpr (NIN == 2)
            cu_ld<T, V>(b + i * V, w);
#pragma unroll
        for (int j = 0; j < V; j++) {
            float bb = 0.f;
            if constexpr (NIN == 2)
                bb = w[j];
            u[j] = f(u[j], bb);
        }
        cu_st<T, V>(y + i * V, u);
        if constexpr (Y2)
            cu_st<T, V>(y2 + i * V, u);
    }
    if constexpr (V > 1) {
        const size_t e = nvec * V + t0;
        if (e < len) {
            y[e] = cu_to<T>(f(cu_f(a[e]), NIN == 2 ? cu_f(b[e]) : 0.f));
            if constexpr (Y2)
                y2[e] = y[e];
        }
    }
}

/* Launches k_ew over len elements (Y2: into y2 as well, a compile-time
 * choice so that single-output callers instantiate no second kernel):
 * 16-byte vectors when every pointer is 16-byte aligned, else one element a
 * thread. */
template <typename T, int NIN, bool Y2 = false, typename F>
static inline int cu_ew_launch(const T *a, const T *b, T *y, size_t len, F f, cudaStream_t s, T *y2 = NULL)
{
    constexpr int VEC = 16 / sizeof(T);
    if (len == 0)
        return 0;
    const bool vec = cu_al16(a) && (NIN == 1 || cu_al16(b)) && cu_al16(y) && (!Y2 || cu_al16(y2));
    if (vec)
        k_ew<T, VEC, NIN, F, Y2><<<cu_ew_blocks(len / VEC), CU_TPB, 0, s>>>(a, b, y, y2, len, f);
    else
        k_ew<T, 1, NIN, F, Y2><<<cu_ew_blocks(len), CU_TPB, 0, s>>>(a, b, y, y2, len, f);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* Launches the vector kernel where the shape and alignment let it, else
 * k_nhwc_rows_sum: a warp of rows per 8 rows of the map, at most 32. */
template <typename T, bool PROD>
static inline void cu_nhwc_rows_sum(const T *a, const T *b, T *y, int n, int c, size_t hw, float scale,
                                    cudaStream_t s)
{
    constexpr int V = 16 / sizeof(T);
    if (c % V == 0 && cu_al16(a) && (!PROD || cu_al16(b))) {
        const unsigned tiles = (unsigned)((c / V + 31) / 32);
        k_nhwc_rows_sum_vec<T, V, PROD><<<(unsigned)n * tiles, CU_TPB, 0, s>>>(a, b, y, c, hw, scale);
        return;
    }
    const size_t warps = hw / 8 < 1 ? 1 : hw / 8 > 32 ? 32 : hw / 8;
    const dim3 block(32, (unsigned)warps);
    k_nhwc_rows_sum<T, PROD><<<(unsigned)((size_t)n * ((c + 31) / 32)), block, 0, s>>>(a, b, y, c, hw, scale);
}

#endif /* SF_GPU_CUDA_KERNEL_COMMON_CUH */
