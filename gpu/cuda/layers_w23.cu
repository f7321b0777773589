/* gpu/cuda/layers_w23.cu — the W2/W3 layers: kernels first, then launchers,
 * then the ConvTranspose2d plans over layers.cu's cuDNN convolutions.
 * Contracts in layers_w23.h.
 *
 * Element types: the activation kernels are templates on T (float or
 * __nv_bfloat16); they load T, compute in fp32 (statistics in double) and round
 * each output once to T. The fp32 launchers are the T = float instances, with
 * the arithmetic (and so the bits) they had before bf16 existed. Vector paths
 * move 16 bytes a thread (4 floats or 8 bf16) when the shape and the pointers
 * allow it, checked at run time, with a scalar fallback. */
#include "layers_w23.h"

#include <cuda_bf16.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../rng.h"

#define W_TPB 256
/* Blocks a per-channel reduction aims for, whatever the device: the partial
 * sums (and so the rounding) must depend on the shape alone. */
#define W_RED_BLOCKS 1024
/* Blocks of the cross-entropy's first pass at most (its partials' count). */
#define W_XENT_BLOCKS 1024
/* Vectors a thread of an elementwise kernel loads before it stores. */
#define W_UNROLL 4

typedef __nv_bfloat16 w_bf16;

static unsigned int w_blocks(size_t work, unsigned int tpb)
{
    size_t b = (work + tpb - 1) / tpb;
    return (unsigned int)(b ? b : 1);
}

static int w_al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static size_t w_cdiv(size_t a, size_t b) { return (a + b - 1) / b; }

/* Multiprocessors of the current device (cached per device; 132 when it cannot
 * be asked). Only elementwise grids depend on it, never a reduction's order. */
static int w_sms(void)
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

/* Grid of a grid-stride elementwise kernel over `work` items of W_TPB-thread
 * blocks: enough blocks to fill the device once, no more. */
static unsigned int w_ew_blocks(size_t work)
{
    const size_t most = (size_t)w_sms() * (2048 / W_TPB);
    const size_t b = w_cdiv(work ? work : 1, W_TPB);
    return (unsigned int)(b < most ? b : most);
}

static int w_dt_bad(const char *fn, sf_dtype dt)
{
    if (dt == SF_DT_F32 || dt == SF_DT_BF16)
        return 0;
    sf_cuda_set_error("%s:%d: %s: unknown element type %d", __FILE__, __LINE__, fn, (int)dt);
    return 1;
}

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* ---- element types -------------------------------------------------------- */

__device__ __forceinline__ float w_f(float v) { return v; }
__device__ __forceinline__ float w_f(w_bf16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T w_to(float v);
template <> __device__ __forceinline__ float w_to<float>(float v) { return v; }
template <> __device__ __forceinline__ w_bf16 w_to<w_bf16>(float v) { return __float2bfloat16_rn(v); }

/* Two bf16 packed in a 32-bit word (element 0 in the low half) <-> floats. */
__device__ __forceinline__ void w_bf2(unsigned u, float &a, float &b)
{
    a = __uint_as_float(u << 16);
    b = __uint_as_float(u & 0xffff0000u);
}
__device__ __forceinline__ unsigned w_pk2(float a, float b)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<unsigned *>(&h);
}

/* 16 bytes as V = 16/sizeof(T) floats, and back (rounding once to T). */
template <typename T> __device__ __forceinline__ void w_unpack(const uint4 &r, float *f)
{
    if constexpr (sizeof(T) == 4) {
        f[0] = __uint_as_float(r.x);
        f[1] = __uint_as_float(r.y);
        f[2] = __uint_as_float(r.z);
        f[3] = __uint_as_float(r.w);
    } else {
        w_bf2(r.x, f[0], f[1]);
        w_bf2(r.y, f[2], f[3]);
        w_bf2(r.z, f[4], f[5]);
        w_bf2(r.w, f[6], f[7]);
    }
}
template <typename T> __device__ __forceinline__ uint4 w_pack(const float *f)
{
    uint4 r;
    if constexpr (sizeof(T) == 4) {
        r.x = __float_as_uint(f[0]);
        r.y = __float_as_uint(f[1]);
        r.z = __float_as_uint(f[2]);
        r.w = __float_as_uint(f[3]);
    } else {
        r.x = w_pk2(f[0], f[1]);
        r.y = w_pk2(f[2], f[3]);
        r.z = w_pk2(f[4], f[5]);
        r.w = w_pk2(f[6], f[7]);
    }
    return r;
}

/* V elements at p as floats: V == 1, or V == 16/sizeof(T) with p 16-byte aligned. */
template <typename T, int V> __device__ __forceinline__ void w_ld(const T *p, float *f)
{
    if constexpr (V == 1) {
        f[0] = w_f(*p);
    } else {
        static_assert(V * sizeof(T) == 16, "a vector is 16 bytes");
        w_unpack<T>(*reinterpret_cast<const uint4 *>(p), f);
    }
}
template <typename T, int V> __device__ __forceinline__ void w_st(T *p, const float *f)
{
    if constexpr (V == 1) {
        *p = w_to<T>(f[0]);
    } else {
        static_assert(V * sizeof(T) == 16, "a vector is 16 bytes");
        *reinterpret_cast<uint4 *>(p) = w_pack<T>(f);
    }
}
/* V int32 (1, 4 or 8; 16-byte aligned when > 1). */
template <int V> __device__ __forceinline__ void w_ldi(const int32_t *p, int *a)
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
template <int V> __device__ __forceinline__ void w_sti(int32_t *p, const int *a)
{
    if constexpr (V == 1) {
        *p = a[0];
    } else {
#pragma unroll
        for (int q = 0; q < V / 4; q++)
            reinterpret_cast<int4 *>(p)[q] = make_int4(a[4 * q], a[4 * q + 1], a[4 * q + 2], a[4 * q + 3]);
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

/* ---- per-pixel cross-entropy --------------------------------------------- */

struct xent2d_part {
    double loss;
    long long correct;
    int bad;
    int pad_;
};

/* Pass 1: a thread per pixel (grid-stride); pixel p = (ni, sp). NCHW: class j
 * of p at ni*k*hw + j*hw + sp; NHWC: p*k + j. Writes one partial per block. */
__global__ void k_xent2d(const float *__restrict__ logits, const int32_t *__restrict__ labels, int k,
                         long long hw, long long npix, int nhwc, float *__restrict__ dlog,
                         xent2d_part *__restrict__ part)
{
    double lsum = 0.0, csum = 0.0;
    int bad = 0;
    const float inv_den = (float)npix; /* divide as the reference does */
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < npix;
         p += (long long)gridDim.x * blockDim.x) {
        long long base, cs;
        if (nhwc) {
            base = p * k;
            cs = 1;
        } else {
            const long long ni = p / hw, sp = p - ni * hw;
            base = ni * k * hw + sp;
            cs = hw;
        }
        const float *l = logits + base;
        float m = l[0];
        int arg = 0;
        for (int j = 1; j < k; j++) {
            const float v = l[j * cs];
            if (v > m) {
                m = v;
                arg = j;
            }
        }
        float se = 0.f;
        for (int j = 0; j < k; j++)
            se += expf(l[j * cs] - m);
        const float lse = m + logf(se);
        const int lab = labels[p];
        const int valid = lab >= 0 && lab < k;
        if (dlog) {
            float *d = dlog + base;
            for (int j = 0; j < k; j++) {
                const float pr = expf(l[j * cs] - lse);
                d[j * cs] = valid ? (pr - (j == lab ? 1.f : 0.f)) / inv_den : NAN;
            }
        }
        lsum += valid ? (double)(lse - l[(long long)lab * cs]) : (double)NAN;
        csum += (valid && arg == lab) ? 1.0 : 0.0;
        bad += !valid;
    }
    double b2 = (double)bad;
    block_sum2(lsum, csum);
    __shared__ double sbad;
    {
        double z = 0.0;
        block_sum2(b2, z);
        if (threadIdx.x == 0)
            sbad = b2;
    }
    if (threadIdx.x == 0) {
        part[blockIdx.x].loss = lsum;
        part[blockIdx.x].correct = (long long)csum;
        part[blockIdx.x].bad = (int)sbad;
        part[blockIdx.x].pad_ = 0;
    }
}

/* Pass 2: one block sums the partials in a fixed order. */
__global__ void k_xent2d_final(const xent2d_part *__restrict__ part, int nparts, long long npix,
                               sf_xent2d_out *__restrict__ out)
{
    double l = 0.0, c = 0.0, b = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) {
        l += part[i].loss;
        c += (double)part[i].correct;
        b += (double)part[i].bad;
    }
    block_sum2(l, c);
    double z = 0.0;
    __shared__ double sl, sc;
    if (threadIdx.x == 0) {
        sl = l;
        sc = c;
    }
    block_sum2(b, z);
    if (threadIdx.x == 0) {
        out->loss = (float)(sl / (double)npix);
        out->correct = (int64_t)sc;
        out->bad = (int32_t)b;
    }
}

/* ---- elementwise ------------------------------------------------------------ */

struct w_op_relu {
    __device__ __forceinline__ float operator()(float a, float) const { return a < 0.f ? 0.f : a; }
};
struct w_op_relu_bwd {
    __device__ __forceinline__ float operator()(float y, float d) const { return y > 0.f ? d : 0.f; }
};
struct w_op_add {
    int relu;
    __device__ __forceinline__ float operator()(float a, float b) const
    {
        const float o = a + b;
        return relu ? (o < 0.f ? 0.f : o) : o; /* NaN propagates, as torch.relu */
    }
};

/* y[i] = f(a[i], b[i]) for i < len (b unused when NIN == 1), grid-stride, V
 * elements a vector (V > 1: a, b, y 16-byte aligned; the len % V tail goes one
 * element a thread), W_UNROLL vectors loaded before any is stored. a, b and y
 * may alias (no __restrict__): each element is read before it is written, by
 * the same thread. */
template <typename T, int V, int NIN, typename F>
__global__ void k_ew(const T *a, const T *b, T *y, size_t len, F f)
{
    const size_t nvec = len / V, step = (size_t)gridDim.x * blockDim.x;
    const size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t i = t0;
    for (; i + (W_UNROLL - 1) * step < nvec; i += W_UNROLL * step) {
        float u[W_UNROLL][V], w[W_UNROLL][V];
#pragma unroll
        for (int q = 0; q < W_UNROLL; q++) {
            w_ld<T, V>(a + (i + q * step) * V, u[q]);
            if constexpr (NIN == 2)
                w_ld<T, V>(b + (i + q * step) * V, w[q]);
        }
#pragma unroll
        for (int q = 0; q < W_UNROLL; q++) {
#pragma unroll
            for (int j = 0; j < V; j++) {
                float bb = 0.f;
                if constexpr (NIN == 2)
                    bb = w[q][j];
                u[q][j] = f(u[q][j], bb);
            }
            w_st<T, V>(y + (i + q * step) * V, u[q]);
        }
    }
    for (; i < nvec; i += step) {
        float u[V], w[V];
        w_ld<T, V>(a + i * V, u);
        if constexpr (NIN == 2)
            w_ld<T, V>(b + i * V, w);
#pragma unroll
        for (int j = 0; j < V; j++) {
            float bb = 0.f;
            if constexpr (NIN == 2)
                bb = w[j];
            u[j] = f(u[j], bb);
        }
        w_st<T, V>(y + i * V, u);
    }
    if constexpr (V > 1) {
        const size_t e = nvec * V + t0;
        if (e < len)
            y[e] = w_to<T>(f(w_f(a[e]), NIN == 2 ? w_f(b[e]) : 0.f));
    }
}

/* 8 elements at p as floats (16-byte aligned p): two float4 or one uint4. */
template <typename T> __device__ __forceinline__ void w_ld8(const T *p, float *f)
{
    if constexpr (sizeof(T) == 4) {
        w_ld<T, 4>(p, f);
        w_ld<T, 4>(p + 4, f + 4);
    } else {
        w_ld<T, 8>(p, f);
    }
}
template <typename T> __device__ __forceinline__ void w_st8(T *p, const float *f)
{
    if constexpr (sizeof(T) == 4) {
        w_st<T, 4>(p, f);
        w_st<T, 4>(p + 4, f + 4);
    } else {
        w_st<T, 8>(p, f);
    }
}

/* dst[i] = (D)src[i], grid-stride; VEC: 8 elements a vector (src and dst
 * 16-byte aligned), the len % 8 tail one element a thread. */
template <typename S, typename D, int VEC>
__global__ void k_cast(const S *__restrict__ src, D *__restrict__ dst, size_t len)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    const size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if constexpr (VEC) {
        const size_t nvec = len / 8;
        size_t i = t0;
        for (; i + (W_UNROLL - 1) * step < nvec; i += W_UNROLL * step) {
            float u[W_UNROLL][8];
#pragma unroll
            for (int q = 0; q < W_UNROLL; q++)
                w_ld8<S>(src + (i + q * step) * 8, u[q]);
#pragma unroll
            for (int q = 0; q < W_UNROLL; q++)
                w_st8<D>(dst + (i + q * step) * 8, u[q]);
        }
        for (; i < nvec; i += step) {
            float u[8];
            w_ld8<S>(src + i * 8, u);
            w_st8<D>(dst + i * 8, u);
        }
        const size_t e = nvec * 8 + t0;
        if (e < len)
            dst[e] = w_to<D>(w_f(src[e]));
    } else {
        for (size_t i = t0; i < len; i += step)
            dst[i] = w_to<D>(w_f(src[i]));
    }
}

/* As layers.cu's k_fill_random (the same values), rounded to T. */
template <typename T>
__global__ void k_fill_random_t(T *__restrict__ p, size_t len, uint64_t seed, float scale)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += step)
        p[i] = w_to<T>((sf_u01(sf_hash4(seed, i, 0x5eed, 0)) * 2.f - 1.f) * scale);
}

/* ---- bias and activation (as layers.cu's, on T) ------------------------------ */

/* v[0..V) of element e of [outer, c, inner]: + bias, then ReLU. V > 1: either
 * inner == 1 and V consecutive channels, or inner % V == 0 and one channel. */
template <int V>
__device__ __forceinline__ void w_bias_act_vec(float *v, size_t e, const float *__restrict__ b, int c,
                                               size_t inner, int relu)
{
    if (b) {
        if (V > 1 && inner == 1) {
            const int ch = (int)(e % (size_t)c);
#pragma unroll
            for (int j = 0; j < V; j++)
                v[j] += b[ch + j];
        } else {
            const float bv = b[(e / inner) % (size_t)c];
#pragma unroll
            for (int j = 0; j < V; j++)
                v[j] += bv;
        }
    }
    if (relu) {
#pragma unroll
        for (int j = 0; j < V; j++)
            v[j] = v[j] < 0.f ? 0.f : v[j];
    }
}

template <typename T, int V>
__global__ void k_bias_act_t(T *__restrict__ y, const float *__restrict__ b, size_t nvec, int c, size_t inner,
                             int relu)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (W_UNROLL - 1) * step < nvec; i += W_UNROLL * step) {
        float u[W_UNROLL][V];
#pragma unroll
        for (int q = 0; q < W_UNROLL; q++)
            w_ld<T, V>(y + (i + q * step) * V, u[q]);
#pragma unroll
        for (int q = 0; q < W_UNROLL; q++) {
            w_bias_act_vec<V>(u[q], (i + q * step) * V, b, c, inner, relu);
            w_st<T, V>(y + (i + q * step) * V, u[q]);
        }
    }
    for (; i < nvec; i += step) {
        float u[V];
        w_ld<T, V>(y + i * V, u);
        w_bias_act_vec<V>(u, i * V, b, c, inner, relu);
        w_st<T, V>(y + i * V, u);
    }
}

/* Bias gradient over rows [R, C] (inner == 1), pass 1, as layers.cu's
 * k_bgrad_rows: a block covers G channel groups of V elements and a chunk of
 * rows, stepping RS = blockDim/G rows, so a warp reads consecutive addresses.
 * With y, dy is masked in place (ReLU backward) as it is read. Writes
 * partial[chunk][c]. */
template <typename T, int V>
__global__ void k_bgrad_rows_t(T *dy, const T *__restrict__ y, size_t R, int C, size_t rows_per_chunk,
                               float *__restrict__ partial)
{
    extern __shared__ float shf[];
    const int Cv = C / V;
    const int G = Cv < W_TPB ? Cv : W_TPB;
    const int RS = blockDim.x / G;
    const int tid = threadIdx.x;
    const int g = tid % G, rl = tid / G;
    const int cg = blockIdx.x * G + g;
    const size_t r0 = (size_t)blockIdx.y * rows_per_chunk;
    const size_t r1 = r0 + rows_per_chunk < R ? r0 + rows_per_chunk : R;
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        acc[v] = 0.f;
    if (cg < Cv && rl < RS) {
        for (size_t r = r0 + rl; r < r1; r += RS) {
            const size_t e = r * (size_t)C + (size_t)cg * V;
            float d[V];
            w_ld<T, V>(dy + e, d);
            if (y) {
                float a[V];
                w_ld<T, V>(y + e, a);
#pragma unroll
                for (int v = 0; v < V; v++)
                    d[v] = a[v] > 0.f ? d[v] : 0.f;
                w_st<T, V>(dy + e, d);
            }
#pragma unroll
            for (int v = 0; v < V; v++)
                acc[v] += d[v];
        }
    }
#pragma unroll
    for (int v = 0; v < V; v++)
        shf[tid * V + v] = acc[v];
    __syncthreads();
    for (int t = tid; t < G * V; t += blockDim.x) {
        const int gg = t / V, v = t % V;
        float s = 0.f;
        for (int k = 0; k < RS; k++)
            s += shf[(k * G + gg) * V + v];
        const int cgg = blockIdx.x * G + gg;
        if (cgg < Cv)
            partial[(size_t)blockIdx.y * C + (size_t)cgg * V + v] = s;
    }
}

/* Bias gradient over planes [N, C, inner] (inner > 1), pass 1, as layers.cu's
 * k_bgrad_planes: block (c, chunk of samples). Writes partial[chunk][c]. */
template <typename T, int V>
__global__ void k_bgrad_planes_t(T *dy, const T *__restrict__ y, size_t N, int C, size_t inner,
                                 size_t n_per_chunk, float *__restrict__ partial)
{
    __shared__ float sh[W_TPB / 32];
    const int c = blockIdx.x;
    const size_t n0 = (size_t)blockIdx.y * n_per_chunk;
    const size_t n1 = n0 + n_per_chunk < N ? n0 + n_per_chunk : N;
    const size_t iv = inner / V;
    float acc = 0.f;
    for (size_t n = n0; n < n1; n++) {
        const size_t base = (n * (size_t)C + c) * inner;
        for (size_t i = threadIdx.x; i < iv; i += blockDim.x) {
            const size_t e = base + i * V;
            float d[V];
            w_ld<T, V>(dy + e, d);
            if (y) {
                float a[V];
                w_ld<T, V>(y + e, a);
#pragma unroll
                for (int v = 0; v < V; v++)
                    d[v] = a[v] > 0.f ? d[v] : 0.f;
                w_st<T, V>(dy + e, d);
            }
            if constexpr (V == 8)
                acc += ((d[0] + d[1]) + (d[2] + d[3])) + ((d[4] + d[5]) + (d[6] + d[7]));
            else if constexpr (V == 4)
                acc += (d[0] + d[1]) + (d[2] + d[3]);
            else
                acc += d[0];
        }
    }
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            s += sh[w];
        partial[(size_t)blockIdx.y * C + c] = s;
    }
}

/* Pass 2: db[c] = sum over chunks, in chunk order. */
__global__ void k_bgrad_final_t(const float *__restrict__ partial, int nchunks, int C, float *__restrict__ db)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float s = 0.f;
    for (int k = 0; k < nchunks; k++)
        s += partial[(size_t)k * C + c];
    db[c] = s;
}

/* ---- batchnorm ------------------------------------------------------------- */

/* The channel of element e (e a multiple of V when V > 1). */
__device__ __forceinline__ int bn_chan(unsigned e, int C, unsigned hw, int nhwc)
{
    return nhwc ? (int)(e % (unsigned)C) : (int)((e / hw) % (unsigned)C);
}

/* Per-channel statistics over an NCHW tensor, pass 1. Block (c, chunk) covers
 * the flattened (sample, spatial) range [chunk*L, chunk*L + L) of channel c.
 * mode 0 (forward): a = sum(x - shift), b = sum((x - shift)^2), shift = x's
 * first element of the channel. mode 1 (backward): a = sum(g), b = sum(g * (x -
 * mean)), g = dy masked by y > 0 when y is given. part[chunk][c][2].
 * V = 4 (fp32) or 8 (bf16) elements of one channel a load, or 1. fp32 adds
 * every value to the double sums; bf16 first sums a vector's 8 values in fp32
 * (exact enough for 8-bit data, and 8 times fewer conversions to double). */
template <typename T, int V>
__global__ void k_bn_part_nchw(const T *__restrict__ x, const T *__restrict__ dy, const T *__restrict__ y,
                               const float *__restrict__ mean, int C, size_t hw, size_t E, size_t L, int mode,
                               double *__restrict__ part)
{
    constexpr bool F32SUM = sizeof(T) == 2 && V > 1;
    const int c = blockIdx.x;
    const size_t e0 = (size_t)blockIdx.y * L;
    const size_t e1 = e0 + L < E ? e0 + L : E;
    const float sh = mode == 0 ? w_f(x[(size_t)c * hw]) : mean[c];
    double a = 0.0, b = 0.0;
    /* 32-bit index arithmetic: the launchers keep tensors under 2^32 elements */
    const unsigned hw32 = (unsigned)hw;
    for (unsigned e = (unsigned)e0 + threadIdx.x * V; e < (unsigned)e1; e += blockDim.x * V) {
        const unsigned ni = e / hw32, sp = e - ni * hw32;
        const size_t off = ((size_t)ni * C + c) * hw + sp;
        float xs[V];
        w_ld<T, V>(x + off, xs);
#pragma unroll
        for (int j = 0; j < V; j++)
            xs[j] = xs[j] - sh;
        if (mode == 0) {
            if constexpr (F32SUM) {
                float sa = 0.f, sb = 0.f;
#pragma unroll
                for (int j = 0; j < V; j++) {
                    sa += xs[j];
                    sb += xs[j] * xs[j];
                }
                a += (double)sa;
                b += (double)sb;
            } else {
#pragma unroll
                for (int j = 0; j < V; j++) {
                    a += (double)xs[j];
                    b += (double)xs[j] * (double)xs[j];
                }
            }
        } else {
            float g[V];
            w_ld<T, V>(dy + off, g);
            if (y) {
                float yv[V];
                w_ld<T, V>(y + off, yv);
#pragma unroll
                for (int j = 0; j < V; j++)
                    g[j] = yv[j] > 0.f ? g[j] : 0.f;
            }
            if constexpr (F32SUM) {
                float sa = 0.f, sb = 0.f;
#pragma unroll
                for (int j = 0; j < V; j++) {
                    sa += g[j];
                    sb += g[j] * xs[j];
                }
                a += (double)sa;
                b += (double)sb;
            } else {
#pragma unroll
                for (int j = 0; j < V; j++) {
                    a += (double)g[j];
                    b += (double)g[j] * (double)xs[j];
                }
            }
        }
    }
    block_sum2(a, b);
    if (threadIdx.x == 0) {
        double *o = part + ((size_t)blockIdx.y * C + c) * 2;
        o[0] = a;
        o[1] = b;
    }
}

/* The same over NHWC, viewed as rows [R, C]. A block covers G channel groups
 * of V channels and the row range [chunk*rpc, +rpc), RS = blockDim/G rows at a
 * time, so a warp reads consecutive addresses. (bf16 with C % 8 == 0 and
 * aligned tensors takes k_bn_part_rows instead.) */
template <typename T, int V>
__global__ void k_bn_part_nhwc(const T *__restrict__ x, const T *__restrict__ dy, const T *__restrict__ y,
                               const float *__restrict__ mean, int C, size_t R, size_t rpc, int mode,
                               double *__restrict__ part)
{
    extern __shared__ double shd[];
    const int Cv = C / V;
    const int G = Cv < W_TPB ? Cv : W_TPB;
    const int RS = blockDim.x / G;
    const int tid = threadIdx.x, g = tid % G, rl = tid / G;
    const int cg = blockIdx.x * G + g;
    const size_t r0 = (size_t)blockIdx.y * rpc;
    const size_t r1 = r0 + rpc < R ? r0 + rpc : R;
    double a[V], b[V];
    float sh[V];
#pragma unroll
    for (int v = 0; v < V; v++) {
        a[v] = 0.0;
        b[v] = 0.0;
        sh[v] = 0.f;
    }
    if (cg < Cv && rl < RS) {
#pragma unroll
        for (int v = 0; v < V; v++)
            sh[v] = mode == 0 ? w_f(x[cg * V + v]) : mean[cg * V + v];
        for (size_t r = r0 + rl; r < r1; r += RS) {
            const size_t off = r * (size_t)C + (size_t)cg * V;
            float xs[V], gs[V];
            w_ld<T, V>(x + off, xs);
            if (mode == 1) {
                w_ld<T, V>(dy + off, gs);
                if (y) {
                    float yv[V];
                    w_ld<T, V>(y + off, yv);
#pragma unroll
                    for (int v = 0; v < V; v++)
                        gs[v] = yv[v] > 0.f ? gs[v] : 0.f;
                }
            }
#pragma unroll
            for (int v = 0; v < V; v++) {
                const float d = xs[v] - sh[v];
                if (mode == 0) {
                    a[v] += (double)d;
                    b[v] += (double)d * (double)d;
                } else {
                    a[v] += (double)gs[v];
                    b[v] += (double)gs[v] * (double)d;
                }
            }
        }
    }
    /* shd[(rl*G + g)*V + v][2] */
#pragma unroll
    for (int v = 0; v < V; v++) {
        shd[(tid * V + v) * 2] = a[v];
        shd[(tid * V + v) * 2 + 1] = b[v];
    }
    __syncthreads();
    for (int t = tid; t < G * V; t += blockDim.x) {
        const int gg = t / V, v = t % V;
        double sa = 0.0, sb = 0.0;
        for (int k = 0; k < RS; k++) {
            sa += shd[((k * G + gg) * V + v) * 2];
            sb += shd[((k * G + gg) * V + v) * 2 + 1];
        }
        const int cgg = blockIdx.x * G + gg;
        if (cgg < Cv) {
            double *o = part + ((size_t)blockIdx.y * C + (size_t)cgg * V + v) * 2;
            o[0] = sa;
            o[1] = sb;
        }
    }
}

/* Channel c's forward statistics from its sums a = sum(x - shift), b =
 * sum((x - shift)^2) over cnt values. */
template <typename T>
__device__ __forceinline__ void bn_stats_out(int c, double a, double b, double cnt, const T *__restrict__ x,
                                             size_t shift_stride, float eps, float momentum,
                                             float *__restrict__ rmean, float *__restrict__ rvar,
                                             float *__restrict__ smean, float *__restrict__ sinv)
{
    const double sh = (double)w_f(x[(size_t)c * shift_stride]);
    const double dm = a / cnt;
    double var = b / cnt - dm * dm;
    if (var < 0.0)
        var = 0.0;
    const double mean = sh + dm;
    smean[c] = (float)mean;
    sinv[c] = (float)(1.0 / sqrt(var + (double)eps));
    const double m = (double)momentum;
    rmean[c] = (float)((1.0 - m) * (double)rmean[c] + m * mean);
    rvar[c] = (float)((1.0 - m) * (double)rvar[c] + m * var * cnt / (cnt - 1.0));
}

/* Backward: dbeta, dgamma and the coefficients of dx:
 * dx = k1 * (g - m1 - (x - mean) * k2), k1 = gamma*invstd, m1 = sum(g)/N,
 * k2 = sum(g*(x-mean)) * invstd^2 / N. coef[c][3]. */
__device__ __forceinline__ void bn_bwd_out(int c, double a, double b, double cnt, const float *__restrict__ gamma,
                                           const float *__restrict__ sinv, float *__restrict__ dgamma,
                                           float *__restrict__ dbeta, float *__restrict__ coef)
{
    const double inv = (double)sinv[c];
    dbeta[c] = (float)a;
    dgamma[c] = (float)(b * inv);
    coef[c * 3 + 0] = (float)((double)gamma[c] * inv);
    coef[c * 3 + 1] = (float)(a / cnt);
    coef[c * 3 + 2] = (float)(b * inv * inv / cnt);
}

/* Forward statistics, pass 2 (fp32): a thread per channel sums the chunks in order. */
__global__ void k_bn_stats_final(const double *__restrict__ part, int nchunks, int C, double cnt,
                                 const float *__restrict__ x, size_t shift_stride, float eps,
                                 float momentum, float *__restrict__ rmean, float *__restrict__ rvar,
                                 float *__restrict__ smean, float *__restrict__ sinv)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    double a = 0.0, b = 0.0;
    for (int k = 0; k < nchunks; k++) {
        a += part[((size_t)k * C + c) * 2];
        b += part[((size_t)k * C + c) * 2 + 1];
    }
    bn_stats_out<float>(c, a, b, cnt, x, shift_stride, eps, momentum, rmean, rvar, smean, sinv);
}

/* Backward, pass 2 (fp32): as k_bn_stats_final, then bn_bwd_out. */
__global__ void k_bn_bwd_final(const double *__restrict__ part, int nchunks, int C, double cnt,
                               const float *__restrict__ gamma, const float *__restrict__ sinv,
                               float *__restrict__ dgamma, float *__restrict__ dbeta,
                               float *__restrict__ coef)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    double a = 0.0, b = 0.0;
    for (int k = 0; k < nchunks; k++) {
        a += part[((size_t)k * C + c) * 2];
        b += part[((size_t)k * C + c) * 2 + 1];
    }
    bn_bwd_out(c, a, b, cnt, gamma, sinv, dgamma, dbeta, coef);
}

/* Pass 2 of the bf16 paths: a warp per channel; lane l sums the partials
 * l, l+32, ... in order, then a fixed shuffle tree (deterministic, and
 * parallel where the fp32 kernels above walk up to 1024 chunks serially).
 * Channel c's partial k is part[(c*cs + k*ks)*2]. MODE 0: statistics (x:
 * the shift); 1: the backward's (sinv_in: the saved invstd). */
template <typename T, int MODE>
__global__ void k_bn_final_tree(const double *__restrict__ part, size_t cs, size_t ks, int nchunks, int C,
                                double cnt, const T *__restrict__ x, size_t shift_stride, float eps,
                                float momentum, float *__restrict__ rmean, float *__restrict__ rvar,
                                float *__restrict__ smean, float *__restrict__ sinv,
                                const float *__restrict__ gamma, const float *__restrict__ sinv_in,
                                float *__restrict__ dgamma, float *__restrict__ dbeta, float *__restrict__ coef)
{
    const int lane = threadIdx.x & 31;
    const int c = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (c >= C)
        return; /* the whole warp */
    double a = 0.0, b = 0.0;
    for (int k = lane; k < nchunks; k += 32) {
        const double *p = part + ((size_t)c * cs + (size_t)k * ks) * 2;
        a += p[0];
        b += p[1];
    }
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, o);
        b += __shfl_down_sync(0xffffffffu, b, o);
    }
    if (lane == 0) {
        if constexpr (MODE == 0)
            bn_stats_out<T>(c, a, b, cnt, x, shift_stride, eps, momentum, rmean, rvar, smean, sinv);
        else
            bn_bwd_out(c, a, b, cnt, gamma, sinv_in, dgamma, dbeta, coef);
    }
}

/* y = act(((x - mean) * invstd) * gamma + beta), elementwise; V > 1 when the
 * V elements share a channel (NCHW, hw % V == 0) or are V consecutive
 * channels (NHWC, C % V == 0). eval: mean/invstd from the running stats. */
template <typename T, int V>
__global__ void k_bn_apply(const T *__restrict__ x, size_t nvec, int C, size_t hw, int nhwc,
                           const float *__restrict__ mean, const float *__restrict__ sinv,
                           const float *__restrict__ rvar, float eps, const float *__restrict__ gamma,
                           const float *__restrict__ beta, int relu, T *__restrict__ y)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nvec)
        return;
    const size_t e = i * V;
    const int c0 = bn_chan((unsigned)e, C, (unsigned)hw, nhwc);
    float xv[V];
    w_ld<T, V>(x + e, xv);
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int c = (nhwc && V > 1) ? c0 + v : c0;
        const float inv = rvar ? 1.f / sqrtf(rvar[c] + eps) : sinv[c];
        float o = ((xv[v] - mean[c]) * inv) * gamma[c] + beta[c];
        if (relu)
            o = o > 0.f ? o : 0.f;
        xv[v] = o;
    }
    w_st<T, V>(y + e, xv);
}

/* dx = k1 * (g - m1 - (x - mean) * k2), g = dy masked by y > 0 when y. */
template <typename T, int V>
__global__ void k_bn_dx(const T *__restrict__ x, const T *__restrict__ dy, const T *__restrict__ y, size_t nvec,
                        int C, size_t hw, int nhwc, const float *__restrict__ mean, const float *__restrict__ coef,
                        T *__restrict__ dx)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nvec)
        return;
    const size_t e = i * V;
    const int c0 = bn_chan((unsigned)e, C, (unsigned)hw, nhwc);
    float xv[V], gv[V];
    w_ld<T, V>(x + e, xv);
    w_ld<T, V>(dy + e, gv);
    if (y) {
        float yv[V];
        w_ld<T, V>(y + e, yv);
#pragma unroll
        for (int v = 0; v < V; v++)
            gv[v] = yv[v] > 0.f ? gv[v] : 0.f;
    }
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int c = (nhwc && V > 1) ? c0 + v : c0;
        const float k1 = coef[c * 3], m1 = coef[c * 3 + 1], k2 = coef[c * 3 + 2];
        xv[v] = k1 * (gv[v] - m1 - (xv[v] - mean[c]) * k2);
    }
    w_st<T, V>(dx + e, xv);
}

/* ---- batchnorm over NHWC rows in 16-byte vectors (the bf16 path) ------------ *
 * Rows [R, C], C % V == 0 (V = 16/sizeof(T) channels a thread), tensors
 * 16-byte aligned. A block is G threads across channel vectors (G = the lowest
 * set bit of C/V, at most 16: a power of two dividing C/V and 32) by
 * RS = 256/G rows; blockIdx.y picks the block's G channel vectors. A thread
 * keeps its channels' parameters in registers and walks rows, so every load is
 * a full 16-byte vector and a warp reads whole cache lines. */

template <typename T> __device__ __forceinline__ uint4 w_ldrow(const T *p, size_t r, int C)
{
    return *reinterpret_cast<const uint4 *>(p + r * (size_t)C);
}

/* Pass 1 (MODE 0: forward statistics, 1: backward sums; as k_bn_part_nhwc).
 * Block (chunk, channel block) covers rows [chunk*L, +L). A thread loads U
 * rows, sums their values in fp32 and adds that into double accumulators
 * (bf16 data: the fp32 sum of U values is exact to ~1e-6 relative, and it
 * spares the double conversions, which run at a quarter of the fp32 rate).
 * Then a fixed shuffle tree over a warp's rows, and warp order through shared
 * memory. part[c][chunk][2]. */
template <typename T, int MODE>
__global__ void __launch_bounds__(W_TPB)
    k_bn_part_rows(const T *__restrict__ x, const T *__restrict__ dy, const T *__restrict__ y,
                   const float *__restrict__ mean, int C, int G, size_t R, size_t L, int nchunks,
                   double *__restrict__ part)
{
    constexpr int V = 16 / sizeof(T);
    constexpr int U = MODE == 0 ? 8 : 4;
    __shared__ double red[W_TPB / 32][16 * V * 2];
    const int tid = threadIdx.x, g = tid & (G - 1), rl = tid / G, RS = W_TPB / G;
    const int c0 = (blockIdx.y * G + g) * V;
    const size_t r0 = (size_t)blockIdx.x * L;
    const size_t r1 = r0 + L < R ? r0 + L : R;
    const T *xp = x + c0;
    const T *dp = MODE == 1 ? dy + c0 : NULL;
    const T *yp = y ? y + c0 : NULL;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    /* MODE 0: rows past the chunk read as the shift row, so they add 0 */
    uint4 pad = zero;
    float sh[V];
    if constexpr (MODE == 0) {
        pad = w_ldrow(xp, 0, C);
        w_unpack<T>(pad, sh);
    } else {
#pragma unroll
        for (int v = 0; v < V; v++)
            sh[v] = mean[c0 + v];
    }
    double da[V], db[V];
#pragma unroll
    for (int v = 0; v < V; v++) {
        da[v] = 0.0;
        db[v] = 0.0;
    }
    for (size_t r = r0 + rl; r < r1; r += (size_t)RS * U) {
        /* every load issued before any is used: rows past the chunk load
         * row r (in range) and are replaced by `pad` / zero afterwards */
        uint4 rx[U], rg[U], ry[U];
        bool in[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const size_t rr = r + (size_t)u * RS;
            in[u] = rr < r1;
            const size_t rc = in[u] ? rr : r;
            rx[u] = w_ldrow(xp, rc, C);
            if constexpr (MODE == 1) {
                rg[u] = w_ldrow(dp, rc, C);
                ry[u] = yp ? w_ldrow(yp, rc, C) : zero;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (!in[u]) {
                rx[u] = pad;
                rg[u] = zero;
                ry[u] = zero;
            }
        float fa[V], fb[V];
#pragma unroll
        for (int v = 0; v < V; v++) {
            fa[v] = 0.f;
            fb[v] = 0.f;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            float xv[V];
            w_unpack<T>(rx[u], xv);
            if constexpr (MODE == 0) {
#pragma unroll
                for (int v = 0; v < V; v++) {
                    const float d = xv[v] - sh[v];
                    fa[v] += d;
                    fb[v] += d * d;
                }
            } else {
                float gv[V];
                w_unpack<T>(rg[u], gv);
                if (yp) {
                    float yv[V];
                    w_unpack<T>(ry[u], yv);
#pragma unroll
                    for (int v = 0; v < V; v++)
                        gv[v] = yv[v] > 0.f ? gv[v] : 0.f;
                }
#pragma unroll
                for (int v = 0; v < V; v++) {
                    fa[v] += gv[v];
                    fb[v] += gv[v] * (xv[v] - sh[v]);
                }
            }
        }
#pragma unroll
        for (int v = 0; v < V; v++) {
            da[v] += (double)fa[v];
            db[v] += (double)fb[v];
        }
    }
    /* lanes l, l+G, l+2G, ... of a warp hold the same channels */
    for (int o = 16; o >= G; o >>= 1) {
#pragma unroll
        for (int v = 0; v < V; v++) {
            da[v] += __shfl_down_sync(0xffffffffu, da[v], o);
            db[v] += __shfl_down_sync(0xffffffffu, db[v], o);
        }
    }
    const int lane = tid & 31, warp = tid >> 5;
    if (lane < G) {
#pragma unroll
        for (int v = 0; v < V; v++) {
            red[warp][(lane * V + v) * 2] = da[v];
            red[warp][(lane * V + v) * 2 + 1] = db[v];
        }
    }
    __syncthreads();
    if (tid < G * V) {
        double a = 0.0, b = 0.0;
        for (int w = 0; w < W_TPB / 32; w++) {
            a += red[w][tid * 2];
            b += red[w][tid * 2 + 1];
        }
        const size_t c = (size_t)blockIdx.y * G * V + tid; /* (blockIdx.y*G + tid/V)*V + tid%V */
        double *o = part + (c * (size_t)nchunks + blockIdx.x) * 2;
        o[0] = a;
        o[1] = b;
    }
}

/* Forward apply over rows (train: mean/sinv; eval: mean = running mean,
 * invstd from rvar), as k_bn_apply. Grid (row blocks, C/V/G); grid-stride over
 * rows, W_UNROLL rows loaded before any is stored. */
template <typename T>
__global__ void __launch_bounds__(W_TPB)
    k_bn_apply_rows(const T *__restrict__ x, size_t R, int C, int G, const float *__restrict__ mean,
                    const float *__restrict__ sinv, const float *__restrict__ rvar, float eps,
                    const float *__restrict__ gamma, const float *__restrict__ beta, int relu, T *__restrict__ y)
{
    constexpr int V = 16 / sizeof(T);
    const int tid = threadIdx.x, g = tid & (G - 1), rl = tid / G, RS = W_TPB / G;
    const int c0 = (blockIdx.y * G + g) * V;
    float mu[V], iv[V], ga[V], be[V];
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int c = c0 + v;
        mu[v] = mean[c];
        iv[v] = rvar ? 1.f / sqrtf(rvar[c] + eps) : sinv[c];
        ga[v] = gamma[c];
        be[v] = beta[c];
    }
    const T *xp = x + c0;
    T *yp = y + c0;
    const size_t step = (size_t)gridDim.x * RS;
    size_t r = (size_t)blockIdx.x * RS + rl;
    for (; r + (W_UNROLL - 1) * step < R; r += W_UNROLL * step) {
        uint4 raw[W_UNROLL];
#pragma unroll
        for (int q = 0; q < W_UNROLL; q++)
            raw[q] = w_ldrow(xp, r + q * step, C);
#pragma unroll
        for (int q = 0; q < W_UNROLL; q++) {
            float v[V];
            w_unpack<T>(raw[q], v);
#pragma unroll
            for (int j = 0; j < V; j++) {
                float o = ((v[j] - mu[j]) * iv[j]) * ga[j] + be[j];
                v[j] = relu ? (o > 0.f ? o : 0.f) : o;
            }
            *reinterpret_cast<uint4 *>(yp + (r + q * step) * (size_t)C) = w_pack<T>(v);
        }
    }
    for (; r < R; r += step) {
        float v[V];
        w_unpack<T>(w_ldrow(xp, r, C), v);
#pragma unroll
        for (int j = 0; j < V; j++) {
            float o = ((v[j] - mu[j]) * iv[j]) * ga[j] + be[j];
            v[j] = relu ? (o > 0.f ? o : 0.f) : o;
        }
        *reinterpret_cast<uint4 *>(yp + r * (size_t)C) = w_pack<T>(v);
    }
}

/* Backward dx over rows, as k_bn_dx. */
template <typename T>
__global__ void __launch_bounds__(W_TPB)
    k_bn_dx_rows(const T *__restrict__ x, const T *__restrict__ dy, const T *__restrict__ y, size_t R, int C,
                 int G, const float *__restrict__ mean, const float *__restrict__ coef, T *__restrict__ dx)
{
    constexpr int V = 16 / sizeof(T);
    const int tid = threadIdx.x, g = tid & (G - 1), rl = tid / G, RS = W_TPB / G;
    const int c0 = (blockIdx.y * G + g) * V;
    float mu[V], k1[V], m1[V], k2[V];
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int c = c0 + v;
        mu[v] = mean[c];
        k1[v] = coef[c * 3];
        m1[v] = coef[c * 3 + 1];
        k2[v] = coef[c * 3 + 2];
    }
    const T *xp = x + c0, *dp = dy + c0, *yp = y ? y + c0 : NULL;
    T *op = dx + c0;
    const size_t step = (size_t)gridDim.x * RS;
    size_t r = (size_t)blockIdx.x * RS + rl;
    for (; r + (W_UNROLL - 1) * step < R; r += W_UNROLL * step) {
        uint4 rx[W_UNROLL], rg[W_UNROLL], ry[W_UNROLL];
#pragma unroll
        for (int q = 0; q < W_UNROLL; q++) {
            rx[q] = w_ldrow(xp, r + q * step, C);
            rg[q] = w_ldrow(dp, r + q * step, C);
            if (yp)
                ry[q] = w_ldrow(yp, r + q * step, C);
        }
#pragma unroll
        for (int q = 0; q < W_UNROLL; q++) {
            float xv[V], gv[V];
            w_unpack<T>(rx[q], xv);
            w_unpack<T>(rg[q], gv);
            if (yp) {
                float yv[V];
                w_unpack<T>(ry[q], yv);
#pragma unroll
                for (int j = 0; j < V; j++)
                    gv[j] = yv[j] > 0.f ? gv[j] : 0.f;
            }
#pragma unroll
            for (int j = 0; j < V; j++)
                xv[j] = k1[j] * (gv[j] - m1[j] - (xv[j] - mu[j]) * k2[j]);
            *reinterpret_cast<uint4 *>(op + (r + q * step) * (size_t)C) = w_pack<T>(xv);
        }
    }
    for (; r < R; r += step) {
        float xv[V], gv[V];
        w_unpack<T>(w_ldrow(xp, r, C), xv);
        w_unpack<T>(w_ldrow(dp, r, C), gv);
        if (yp) {
            float yv[V];
            w_unpack<T>(w_ldrow(yp, r, C), yv);
#pragma unroll
            for (int j = 0; j < V; j++)
                gv[j] = yv[j] > 0.f ? gv[j] : 0.f;
        }
#pragma unroll
        for (int j = 0; j < V; j++)
            xv[j] = k1[j] * (gv[j] - m1[j] - (xv[j] - mu[j]) * k2[j]);
        *reinterpret_cast<uint4 *>(op + r * (size_t)C) = w_pack<T>(xv);
    }
}

/* ---- maxpool ----------------------------------------------------------------- */

/* Element u of a pooling tensor [N, C, Y, X] (NHWC or NCHW; 32-bit index
 * arithmetic: the launchers keep tensors under 2^32 elements): its x, y, and
 * where its (n, c) plane starts in the other tensor of the pair, whose planes
 * hold other_hw elements, with the stride between that plane's elements. */
__device__ __forceinline__ void w_pool_index(unsigned u, int C, int X, int Y, int nhwc, size_t other_hw, int *x,
                                             int *y, size_t *base, size_t *step)
{
    if (nhwc) {
        const unsigned c = u % (unsigned)C;
        unsigned r = u / (unsigned)C;
        *x = (int)(r % (unsigned)X);
        r /= (unsigned)X;
        *y = (int)(r % (unsigned)Y);
        const unsigned ni = r / (unsigned)Y;
        *base = (size_t)ni * other_hw * C + c;
        *step = (size_t)C;
    } else {
        *x = (int)(u % (unsigned)X);
        unsigned r = u / (unsigned)X;
        *y = (int)(r % (unsigned)Y);
        r /= (unsigned)Y; /* ni*C + c */
        *base = (size_t)r * other_hw;
        *step = 1;
    }
}

/* Any window: a thread per output element. NCHW: index = ((ni*C + c)*oh + oy)*ow + ox;
 * NHWC: ((ni*oh + oy)*ow + ox)*C + c. As PyTorch: the first in-bounds input
 * starts the running maximum at -inf; a larger value or a NaN replaces it. */
template <typename T, int KT, int ST>
__global__ void k_maxpool_fwd(const T *__restrict__ x, int C, int H, int W, int k_arg, int s_arg, int pad, int OH,
                              int OW, int nhwc, size_t total, T *__restrict__ y, int32_t *__restrict__ am)
{
    /* KT, ST: the window and stride as compile-time constants, or 0 for run-time values */
    const int k = KT ? KT : k_arg, stride = ST ? ST : s_arg;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    int ox, oy;
    size_t plane, cs;
    w_pool_index((unsigned)i, C, OW, OH, nhwc, (size_t)H * W, &ox, &oy, &plane, &cs);
    const int ys = oy * stride - pad, xs = ox * stride - pad;
    const int y0 = ys > 0 ? ys : 0, x0 = xs > 0 ? xs : 0;
    const int y1 = ys + k < H ? ys + k : H, x1 = xs + k < W ? xs + k : W;
    float m = -INFINITY;
    int arg = y0 * W + x0;
    for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++) {
            const int idx = iy * W + ix;
            const float v = w_f(x[plane + (size_t)idx * cs]);
            if (v > m || isnan(v)) {
                m = v;
                arg = idx;
            }
        }
    y[i] = w_to<T>(m);
    am[i] = arg;
}

/* Any window: a thread per input element, the sum in row-major output order of
 * dy over the windows containing it whose argmax is it. dy is loaded with the
 * argmax, not after the comparison, so the two loads overlap. */
template <typename T, int KT, int ST>
__global__ void k_maxpool_bwd(const T *__restrict__ dy, const int32_t *__restrict__ am, int C, int H, int W,
                              int k_arg, int s_arg, int pad, int OH, int OW, int nhwc, size_t total,
                              T *__restrict__ dx)
{
    const int k = KT ? KT : k_arg, stride = ST ? ST : s_arg;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    int ix, iy;
    size_t obase, os;
    w_pool_index((unsigned)i, C, W, H, nhwc, (size_t)OH * OW, &ix, &iy, &obase, &os);
    /* oy*stride - pad <= iy <= oy*stride - pad + k - 1 */
    const int ty = iy + pad - k + 1, tx = ix + pad - k + 1;
    const unsigned us = (unsigned)stride;
    int oy0 = ty > 0 ? (int)(((unsigned)ty + us - 1) / us) : 0;
    int ox0 = tx > 0 ? (int)(((unsigned)tx + us - 1) / us) : 0;
    int oy1 = (int)((unsigned)(iy + pad) / us), ox1 = (int)((unsigned)(ix + pad) / us);
    if (oy1 > OH - 1)
        oy1 = OH - 1;
    if (ox1 > OW - 1)
        ox1 = OW - 1;
    const int me = iy * W + ix;
    float s = 0.f;
    for (int oy = oy0; oy <= oy1; oy++)
        for (int ox = ox0; ox <= ox1; ox++) {
            const size_t o = obase + ((size_t)oy * OW + ox) * os;
            const int a = am[o];
            const float d = w_f(dy[o]);
            if (a == me)
                s += d;
        }
    dx[i] = w_to<T>(s);
}

/* ---- maxpool k3 s2 p1 (ResNet's stem), the same results ---------------------- *
 * Output (oy, ox) covers inputs 2oy-1 .. 2oy+1 (rows and columns alike), so
 * input 2m lies in window m only and input 2m+1 in windows m and m+1; and
 * oh = ceil(h/2), ow = ceil(w/2). The forward takes all nine taps in flight at
 * once; the backward gives a thread the input quad (2m..2m+1, 2n..2n+1), whose
 * windows are the four outputs (m..m+1, n..n+1): four argmax and four dy loads,
 * issued together, and four outputs. */

/* NCHW forward: a thread per output. */
template <typename T>
__global__ void k_mp3_fwd_nchw(const T *__restrict__ x, int H, int W, int OH, int OW, unsigned total,
                               T *__restrict__ y, int32_t *__restrict__ am)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    const unsigned ox = i % (unsigned)OW, r = i / (unsigned)OW;
    const unsigned oy = r % (unsigned)OH, plane = r / (unsigned)OH;
    const T *xp = x + (size_t)plane * H * W;
    const int iy0 = 2 * (int)oy - 1, ix0 = 2 * (int)ox - 1;
    /* taps outside the input load the first inside one (unconditional loads,
     * all in flight together) and are skipped below */
    const int a0 = (iy0 > 0 ? iy0 : 0) * W + (ix0 > 0 ? ix0 : 0);
    float v[9];
    bool ok[9];
#pragma unroll
    for (int ky = 0; ky < 3; ky++)
#pragma unroll
        for (int kx = 0; kx < 3; kx++) {
            const int iy = iy0 + ky, ix = ix0 + kx;
            const bool in = (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
            ok[ky * 3 + kx] = in;
            v[ky * 3 + kx] = w_f(xp[in ? iy * W + ix : a0]);
        }
    float m = -INFINITY;
    int arg = a0;
#pragma unroll
    for (int t = 0; t < 9; t++)
        if (ok[t] && (v[t] > m || isnan(v[t]))) {
            m = v[t];
            arg = (iy0 + t / 3) * W + ix0 + t % 3;
        }
    y[i] = w_to<T>(m);
    am[i] = arg;
}

/* Two adjacent elements (p aligned to two). */
template <typename T> __device__ __forceinline__ void w_st2(T *p, float a, float b)
{
    if constexpr (sizeof(T) == 4)
        *reinterpret_cast<float2 *>(p) = make_float2(a, b);
    else
        *reinterpret_cast<unsigned *>(p) = w_pk2(a, b);
}

/* The sums of the quad's four inputs from its four windows' argmax a[] and dy
 * d[] (windows 00, 01, 10, 11 = (m, n), (m, n+1), (m+1, n), (m+1, n+1); a
 * missing window has argmax -1), each in row-major window order. */
__device__ __forceinline__ void mp3_quad(const int *a, const float *d, int me00, int W, float *s)
{
    const int me01 = me00 + 1, me10 = me00 + W, me11 = me10 + 1;
    float s00 = 0.f, s01 = 0.f, s10 = 0.f, s11 = 0.f;
    if (a[0] == me00)
        s00 += d[0];
    if (a[0] == me01)
        s01 += d[0];
    if (a[1] == me01)
        s01 += d[1];
    if (a[0] == me10)
        s10 += d[0];
    if (a[2] == me10)
        s10 += d[2];
    if (a[0] == me11)
        s11 += d[0];
    if (a[1] == me11)
        s11 += d[1];
    if (a[2] == me11)
        s11 += d[2];
    if (a[3] == me11)
        s11 += d[3];
    s[0] = s00;
    s[1] = s01;
    s[2] = s10;
    s[3] = s11;
}

/* NCHW backward: a thread per input quad (m, n); PAIR: w even and dx aligned
 * to two elements, so a quad row is one two-element store. */
template <typename T, int PAIR>
__global__ void k_mp3_bwd_nchw(const T *__restrict__ dy, const int32_t *__restrict__ am, int H, int W, int OH,
                               int OW, unsigned total, T *__restrict__ dx)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    const unsigned qx = i % (unsigned)OW, r = i / (unsigned)OW;
    const unsigned qy = r % (unsigned)OH, plane = r / (unsigned)OH;
    const bool nx = qx + 1 < (unsigned)OW, ny = qy + 1 < (unsigned)OH;
    const size_t o = (size_t)i; /* (plane*OH + qy)*OW + qx */
    int a[4];
    float d[4];
    /* missing windows load window 00 (unconditional loads) and are masked */
    const size_t o1 = nx ? o + 1 : o, o2 = ny ? o + OW : o, o3 = (nx && ny) ? o + OW + 1 : o;
    a[0] = am[o];
    a[1] = am[o1];
    a[2] = am[o2];
    a[3] = am[o3];
    d[0] = w_f(dy[o]);
    d[1] = w_f(dy[o1]);
    d[2] = w_f(dy[o2]);
    d[3] = w_f(dy[o3]);
    if (!nx) {
        a[1] = -1;
        d[1] = 0.f;
    }
    if (!ny) {
        a[2] = -1;
        d[2] = 0.f;
    }
    if (!(nx && ny)) {
        a[3] = -1;
        d[3] = 0.f;
    }
    const int iy = 2 * (int)qy, ix = 2 * (int)qx;
    float s[4];
    mp3_quad(a, d, iy * W + ix, W, s);
    T *p = dx + (size_t)plane * H * W + (size_t)iy * W + ix;
    const bool cy = iy + 1 < H;
    if (PAIR) {
        w_st2<T>(p, s[0], s[1]);
        if (cy)
            w_st2<T>(p + W, s[2], s[3]);
    } else {
        const bool cx = ix + 1 < W;
        p[0] = w_to<T>(s[0]);
        if (cx)
            p[1] = w_to<T>(s[1]);
        if (cy) {
            p[W] = w_to<T>(s[2]);
            if (cx)
                p[W + 1] = w_to<T>(s[3]);
        }
    }
}

/* NHWC forward: a thread per (output pixel, V channels); V = 16/sizeof(T)
 * (C % V == 0, x, y, argmax 16-byte aligned) or 1. */
template <typename T, int V>
__global__ void __launch_bounds__(W_TPB)
    k_mp3_fwd_nhwc(const T *__restrict__ x, int C, int H, int W, int OH, int OW, unsigned total, T *__restrict__ y,
                   int32_t *__restrict__ am)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    const unsigned Cv = (unsigned)C / V;
    const unsigned cv = i % Cv;
    unsigned r = i / Cv;
    const unsigned ox = r % (unsigned)OW;
    r /= (unsigned)OW;
    const unsigned oy = r % (unsigned)OH, ni = r / (unsigned)OH;
    const T *xb = x + (size_t)ni * H * W * C + cv * V;
    const int iy0 = 2 * (int)oy - 1, ix0 = 2 * (int)ox - 1;
    const int a0 = (iy0 > 0 ? iy0 : 0) * W + (ix0 > 0 ? ix0 : 0);
    /* taps outside the input load the first inside one (unconditional loads,
     * all nine in flight together) and are skipped below */
    float v[9][V];
    bool ok[9];
#pragma unroll
    for (int ky = 0; ky < 3; ky++)
#pragma unroll
        for (int kx = 0; kx < 3; kx++) {
            const int iy = iy0 + ky, ix = ix0 + kx, t = ky * 3 + kx;
            ok[t] = (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
            w_ld<T, V>(xb + (size_t)(ok[t] ? iy * W + ix : a0) * C, v[t]);
        }
    float m[V];
    int arg[V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        m[j] = -INFINITY;
        arg[j] = a0;
    }
#pragma unroll
    for (int t = 0; t < 9; t++) {
        if (!ok[t])
            continue;
        const int idx = (iy0 + t / 3) * W + ix0 + t % 3;
#pragma unroll
        for (int j = 0; j < V; j++)
            if (v[t][j] > m[j] || isnan(v[t][j])) {
                m[j] = v[t][j];
                arg[j] = idx;
            }
    }
    /* output element ((ni*OH + oy)*OW + ox)*C + cv*V == i*V */
    w_st<T, V>(y + (size_t)i * V, m);
    w_sti<V>(am + (size_t)i * V, arg);
}

/* NHWC backward: a thread per (input quad, V channels), V as the forward
 * (dy, argmax, dx aligned when V > 1). */
template <typename T, int V>
__global__ void __launch_bounds__(W_TPB)
    k_mp3_bwd_nhwc(const T *__restrict__ dy, const int32_t *__restrict__ am, int C, int H, int W, int OH, int OW,
                   unsigned total, T *__restrict__ dx)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    const unsigned Cv = (unsigned)C / V;
    const unsigned cv = i % Cv;
    unsigned r = i / Cv;
    const unsigned qx = r % (unsigned)OW;
    r /= (unsigned)OW;
    const unsigned qy = r % (unsigned)OH, ni = r / (unsigned)OH;
    const bool nx = qx + 1 < (unsigned)OW, ny = qy + 1 < (unsigned)OH;
    const size_t o = (size_t)i * V; /* ((ni*OH + qy)*OW + qx)*C + cv*V */
    const size_t wo[4] = {0, (size_t)C, (size_t)OW * C, (size_t)(OW + 1) * C};
    const bool wok[4] = {true, nx, ny, nx && ny};
    /* missing windows load window 00 (unconditional loads) and are masked */
    int a[4][V];
    float d[4][V];
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const size_t ot = o + (wok[t] ? wo[t] : 0);
        w_ldi<V>(am + ot, a[t]);
        w_ld<T, V>(dy + ot, d[t]);
    }
#pragma unroll
    for (int t = 1; t < 4; t++)
        if (!wok[t]) {
#pragma unroll
            for (int j = 0; j < V; j++) {
                a[t][j] = -1;
                d[t][j] = 0.f;
            }
        }
    const int iy = 2 * (int)qy, ix = 2 * (int)qx;
    const int me00 = iy * W + ix;
    float s[4][V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int aj[4] = {a[0][j], a[1][j], a[2][j], a[3][j]};
        const float dj[4] = {d[0][j], d[1][j], d[2][j], d[3][j]};
        float sj[4];
        mp3_quad(aj, dj, me00, W, sj);
        s[0][j] = sj[0];
        s[1][j] = sj[1];
        s[2][j] = sj[2];
        s[3][j] = sj[3];
    }
    T *p = dx + (((size_t)ni * H + iy) * W + ix) * C + cv * V;
    const bool cx = ix + 1 < W, cy = iy + 1 < H;
    w_st<T, V>(p, s[0]);
    if (cx)
        w_st<T, V>(p + C, s[1]);
    if (cy) {
        w_st<T, V>(p + (size_t)W * C, s[2]);
        if (cx)
            w_st<T, V>(p + (size_t)(W + 1) * C, s[3]);
    }
}

/* ---- global average pooling ----------------------------------------------- */

/* NCHW: a warp per (n, c) plane. */
template <typename T>
__global__ void k_avgpool_fwd_nchw(const T *__restrict__ x, size_t planes, int hw, T *__restrict__ y)
{
    const size_t wid = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (wid >= planes)
        return;
    const T *p = x + wid * (size_t)hw;
    float s = 0.f;
    for (int j = lane; j < hw; j += 32)
        s += w_f(p[j]);
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0)
        y[wid] = w_to<T>(s / (float)hw);
}

/* NHWC: a thread per (n, c), walking the hw rows (coalesced across c). */
template <typename T>
__global__ void k_avgpool_fwd_nhwc(const T *__restrict__ x, int N, int C, int hw, T *__restrict__ y)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C)
        return;
    const size_t ni = i / C, c = i % C;
    const T *p = x + ni * (size_t)hw * C + c;
    float s = 0.f;
    for (int j = 0; j < hw; j++)
        s += w_f(p[(size_t)j * C]);
    y[i] = w_to<T>(s / (float)hw);
}

template <typename T>
__global__ void k_avgpool_bwd(const T *__restrict__ dy, size_t total, int C, int hw, int nhwc, T *__restrict__ dx)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    size_t o;
    if (nhwc)
        o = (i / ((size_t)hw * C)) * C + i % C;
    else
        o = i / hw;
    dx[i] = w_to<T>(w_f(dy[o]) / (float)hw);
}

/* ---- AdamW ------------------------------------------------------------------- */

/* One element in the order of PyTorch's single-tensor AdamW, rounding as the
 * reference (no contraction into FMA), so equal inputs give bit-equal results. */
__device__ __forceinline__ void adamw_one(float &p, float &m, float &v, float g, const sf_adamw_hyper &h)
{
    p = __fmul_rn(p, __fsub_rn(1.f, __fmul_rn(h.lr, h.weight_decay)));
    m = __fadd_rn(__fmul_rn(h.beta1, m), __fmul_rn(__fsub_rn(1.f, h.beta1), g));
    v = __fadd_rn(__fmul_rn(h.beta2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.f, h.beta2), g), g));
    const float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), h.bc2_sqrt), h.eps);
    p = __fsub_rn(p, __fmul_rn(h.step_size, __fdiv_rn(m, den)));
}

/* Device index of model index i inside segment sg (KCRS -> KRSC), as layers.cu. */
__device__ __forceinline__ size_t w_perm_index(const sf_perm_seg &sg, size_t i)
{
    const unsigned r = (unsigned)(i - sg.off);
    const unsigned crs = (unsigned)sg.c * (unsigned)sg.rs;
    const unsigned o = r / crs, rem = r - o * crs;
    const unsigned ci = rem / (unsigned)sg.rs, t = rem - ci * (unsigned)sg.rs;
    return sg.off + (size_t)o * crs + (size_t)t * sg.c + ci;
}

/* Four consecutive elements per thread; a segment boundary or the tail goes
 * one element at a time. */
__global__ void k_adamw(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ m,
                        float *__restrict__ v, float *__restrict__ wdev, size_t len,
                        const sf_adamw_hyper *__restrict__ hp, const __grid_constant__ sf_sgd_segs segs)
{
    const size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i0 >= len)
        return;
    const sf_adamw_hyper h = *hp;
    int si = -1, straddle = 0;
    for (int k = 0; k < segs.n; k++) {
        const size_t a = segs.s[k].off, b = a + segs.s[k].len;
        if (i0 + 4 > a && i0 < b) {
            si = k;
            straddle = !(i0 >= a && i0 + 4 <= b);
            break;
        }
    }
    if (i0 + 4 <= len && !straddle) {
        float4 pv = *reinterpret_cast<const float4 *>(p + i0);
        float4 mv = *reinterpret_cast<const float4 *>(m + i0);
        float4 vv = *reinterpret_cast<const float4 *>(v + i0);
        float4 gv;
        size_t j[4] = {0, 0, 0, 0};
        if (si < 0) {
            gv = *reinterpret_cast<const float4 *>(g + i0);
        } else {
#pragma unroll
            for (int q = 0; q < 4; q++)
                j[q] = w_perm_index(segs.s[si], i0 + q);
            gv = make_float4(g[j[0]], g[j[1]], g[j[2]], g[j[3]]);
        }
        adamw_one(pv.x, mv.x, vv.x, gv.x, h);
        adamw_one(pv.y, mv.y, vv.y, gv.y, h);
        adamw_one(pv.z, mv.z, vv.z, gv.z, h);
        adamw_one(pv.w, mv.w, vv.w, gv.w, h);
        *reinterpret_cast<float4 *>(p + i0) = pv;
        *reinterpret_cast<float4 *>(m + i0) = mv;
        *reinterpret_cast<float4 *>(v + i0) = vv;
        if (si >= 0) {
            wdev[j[0]] = pv.x;
            wdev[j[1]] = pv.y;
            wdev[j[2]] = pv.z;
            wdev[j[3]] = pv.w;
        }
        return;
    }
    for (size_t i = i0; i < i0 + 4 && i < len; i++) {
        int k = -1;
        for (int q = 0; q < segs.n; q++)
            if (i >= segs.s[q].off && i < segs.s[q].off + segs.s[q].len) {
                k = q;
                break;
            }
        const size_t jj = k < 0 ? i : w_perm_index(segs.s[k], i);
        float pv = p[i], mv = m[i], vv = v[i];
        adamw_one(pv, mv, vv, g[jj], h);
        p[i] = pv;
        m[i] = mv;
        v[i] = vv;
        if (k >= 0)
            wdev[jj] = pv;
    }
}

/* ---- weights: model layout <-> device layout --------------------------------- */

/* The segments of an sf_sgd_segs, checked and sorted by offset on the host
 * (w_perm_prep): [off, end) with c*rs dividing end - off, no overlaps. grp:
 * for sf_cuda_grads_model, the prefix count of the 8-element groups (aligned
 * to 8 in model space) each segment touches. */
struct w_perm_tab {
    int n, pad_;
    unsigned long long off[SF_SGD_MAX_SEGS], end[SF_SGD_MAX_SEGS];
    unsigned c[SF_SGD_MAX_SEGS], rs[SF_SGD_MAX_SEGS];
    unsigned long long grp[SF_SGD_MAX_SEGS + 1];
};

struct w_perm_smem {
    unsigned long long off[SF_SGD_MAX_SEGS], end[SF_SGD_MAX_SEGS], grp[SF_SGD_MAX_SEGS + 1];
    unsigned c[SF_SGD_MAX_SEGS], rs[SF_SGD_MAX_SEGS];
};

/* Copies the table to shared memory (segment lookups by data-dependent index
 * would serialise on the constant bank); call from every thread. */
__device__ __forceinline__ void w_perm_load(const w_perm_tab &tab, w_perm_smem &sm)
{
    for (int k = threadIdx.x; k < tab.n; k += blockDim.x) {
        sm.off[k] = tab.off[k];
        sm.end[k] = tab.end[k];
        sm.c[k] = tab.c[k];
        sm.rs[k] = tab.rs[k];
    }
    for (int k = threadIdx.x; k <= tab.n; k += blockDim.x)
        sm.grp[k] = tab.grp[k];
    __syncthreads();
}

/* wd[j] for the 8 device indices j0 .. j0+7 (< len): p at the model index of j
 * inside a segment (j = off + (o*rs + t)*c + ci <- off + (o*c + ci)*rs + t),
 * p[j] outside, rounded to T. VST: wd 16-byte aligned (8-element stores). */
template <typename T, int VST>
__global__ void __launch_bounds__(W_TPB)
    k_weights_dev(const float *__restrict__ p, T *__restrict__ wd, size_t len, const __grid_constant__ w_perm_tab tab)
{
    __shared__ w_perm_smem sm;
    w_perm_load(tab, sm);
    const size_t j0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (j0 >= len)
        return;
    const int n = tab.n;
    /* the last segment starting at or before j0, or -1 */
    int s = -1;
    {
        int lo = 0, hi = n - 1;
        while (lo <= hi) {
            const int mid = (lo + hi) >> 1;
            if (sm.off[mid] <= j0) {
                s = mid;
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
    }
    float v[8];
    int cur = -1;                 /* the segment the counters below belong to */
    unsigned o = 0, t = 0, ci = 0; /* device order: ci fastest, then t, then o */
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const size_t j = j0 + q;
        v[q] = 0.f;
        if (j >= len)
            continue;
        while (s + 1 < n && sm.off[s + 1] <= j)
            s++;
        size_t src = j;
        if (s >= 0 && j < sm.end[s]) {
            const unsigned c = sm.c[s], rs = sm.rs[s];
            if (cur != s) {
                const unsigned rel = (unsigned)(j - sm.off[s]), crs = c * rs;
                o = rel / crs;
                const unsigned rem = rel - o * crs;
                t = rem / c;
                ci = rem - t * c;
                cur = s;
            }
            src = sm.off[s] + ((size_t)o * c + ci) * rs + t;
            if (++ci == c) {
                ci = 0;
                if (++t == rs) {
                    t = 0;
                    o++;
                }
            }
        }
        v[q] = p[src];
    }
    if (VST && j0 + 8 <= len) {
        w_st8<T>(wd + j0, v);
    } else {
        for (int q = 0; q < 8 && j0 + q < len; q++)
            wd[j0 + q] = w_to<T>(v[q]);
    }
}

/* g[i] = (float)gd[device index of i] for the model indices i of group q (8
 * elements aligned to 8 in model space) that lie inside its segment; nothing
 * else is written. VST: g 16-byte aligned (a group fully inside a segment is
 * two float4 stores). */
template <typename T, int VST>
__global__ void __launch_bounds__(W_TPB)
    k_grads_model(const T *__restrict__ gd, float *__restrict__ g, const __grid_constant__ w_perm_tab tab)
{
    __shared__ w_perm_smem sm;
    w_perm_load(tab, sm);
    const unsigned long long q = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int n = tab.n;
    if (q >= sm.grp[n])
        return;
    /* the segment whose groups hold q: grp[s] <= q < grp[s+1] */
    int s = 0;
    {
        int lo = 0, hi = n - 1;
        while (lo <= hi) {
            const int mid = (lo + hi) >> 1;
            if (sm.grp[mid] <= q) {
                s = mid;
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
    }
    const size_t off = sm.off[s], end = sm.end[s];
    const unsigned c = sm.c[s], rs = sm.rs[s];
    const size_t i0 = (off & ~(size_t)7) + (size_t)(q - sm.grp[s]) * 8;
    const size_t first = i0 > off ? i0 : off;
    /* model order: t fastest, then ci, then o */
    const unsigned rel = (unsigned)(first - off), crs = c * rs;
    unsigned o = rel / crs;
    const unsigned rem = rel - o * crs;
    unsigned ci = rem / rs, t = rem - ci * rs;
    float v[8];
    bool in[8];
    bool all = true;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const size_t i = i0 + k;
        in[k] = i >= off && i < end;
        all = all && in[k];
        v[k] = 0.f;
        if (!in[k])
            continue;
        v[k] = w_f(gd[off + ((size_t)o * rs + t) * c + ci]);
        if (++t == rs) {
            t = 0;
            if (++ci == c) {
                ci = 0;
                o++;
            }
        }
    }
    if (VST && all) {
        w_st8<float>(g + i0, v);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (in[k])
                g[i0 + k] = v[k];
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

/* ---- per-pixel cross-entropy --------------------------------------------- */

static int xent2d_blocks(long long npix)
{
    size_t b = w_blocks((size_t)npix, W_TPB);
    return (int)(b < W_XENT_BLOCKS ? b : W_XENT_BLOCKS);
}

extern "C" size_t sf_cuda_xent2d_scratch_bytes(int n, int h, int w)
{
    return sizeof(xent2d_part) * (size_t)xent2d_blocks((long long)n * h * w);
}

extern "C" int sf_cuda_xent2d(const float *logits, const int32_t *labels, int n, int k, int h, int w,
                              sf_layout lay, float *dlogits, sf_xent2d_out *out, void *scratch,
                              cudaStream_t s)
{
    if (n < 1 || k < 1 || h < 1 || w < 1) {
        sf_cuda_set_error("%s:%d: sf_cuda_xent2d: n=%d k=%d h=%d w=%d", __FILE__, __LINE__, n, k, h, w);
        return -1;
    }
    const long long npix = (long long)n * h * w;
    const int nb = xent2d_blocks(npix);
    xent2d_part *part = (xent2d_part *)scratch;
    k_xent2d<<<nb, W_TPB, 0, s>>>(logits, labels, k, (long long)h * w, npix, lay == SF_LAYOUT_NHWC, dlogits,
                                  part);
    SF_CUDA_CHECK_LAUNCH();
    k_xent2d_final<<<1, W_TPB, 0, s>>>(part, nb, npix, out);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ---- batchnorm ------------------------------------------------------------- */

/* The chunking of the per-channel reductions: a function of the shape only. */
typedef struct bn_plan {
    int nhwc;
    size_t hw, E;     /* E = n*h*w elements per channel (= rows R for NHWC) */
    int nchunks;
    size_t L;         /* NCHW: elements per chunk (a multiple of 4); NHWC: rows per chunk */
} bn_plan;

static bn_plan bn_plan_of(int n, int c, int h, int w, sf_layout lay)
{
    bn_plan p;
    p.nhwc = lay == SF_LAYOUT_NHWC;
    p.hw = (size_t)h * w;
    p.E = (size_t)n * p.hw;
    if (!p.nhwc) {
        size_t want = w_cdiv(W_RED_BLOCKS, (size_t)c);
        const size_t most = w_cdiv(p.E, 2048); /* at least 2048 elements a block */
        if (want > most)
            want = most;
        if (want < 1)
            want = 1;
        p.L = (w_cdiv(p.E, want) + 3) & ~(size_t)3;
        p.nchunks = (int)w_cdiv(p.E, p.L);
    } else {
        const size_t gx = w_cdiv((size_t)c, 4 * W_TPB); /* blocks across channels */
        size_t want = w_cdiv(W_RED_BLOCKS, gx);
        const size_t most = w_cdiv(p.E, 64); /* at least 64 rows a block */
        if (want > most)
            want = most;
        if (want < 1)
            want = 1;
        p.L = w_cdiv(p.E, want);
        p.nchunks = (int)w_cdiv(p.E, p.L);
    }
    return p;
}

/* The bf16 plan: never more chunks than the fp32 plan of the shape (whose
 * partials sf_cuda_bn_scratch_bytes sizes). NCHW chunks hold whole 16-byte
 * vectors (a multiple of 8 elements); the NHWC row kernels (rows) take at
 * least 128 rows a chunk, so the partials stay a few percent of the data. */
static void bn_plan_bf16(bn_plan *p, int rows)
{
    if (!p->nhwc)
        p->L = (p->L + 7) & ~(size_t)7;
    else if (rows && p->L < 128)
        p->L = 128;
    p->nchunks = (int)w_cdiv(p->E, p->L);
}

extern "C" size_t sf_cuda_bn_scratch_bytes(int n, int c, int h, int w, sf_layout lay)
{
    const bn_plan p = bn_plan_of(n, c, h, w, lay);
    /* partials [nchunks][c][2] doubles, then coef [c][3] floats */
    return sizeof(double) * 2 * (size_t)p.nchunks * c + sizeof(float) * 3 * (size_t)c + 16;
}

static int bn_check(const char *fn, int n, int c, int h, int w)
{
    if (n < 1 || c < 1 || h < 1 || w < 1 || (double)n * c * h * w >= 4294967296.0) {
        sf_cuda_set_error("%s:%d: %s: n=%d c=%d h=%d w=%d", __FILE__, __LINE__, fn, n, c, h, w);
        return -1;
    }
    return 0;
}

/* Launches pass 1 of a per-channel reduction (mode 0 forward, 1 backward)
 * with the generic kernels: part[chunk][c]. */
template <typename T>
static int bn_partials(const bn_plan &p, const T *x, const T *dy, const T *y, const float *mean, int c, int mode,
                       double *part, cudaStream_t s)
{
    constexpr int VEC = 16 / sizeof(T);
    const int al = w_al16(x) && (mode == 0 || (w_al16(dy) && (!y || w_al16(y))));
    if (!p.nhwc) {
        dim3 grid((unsigned)c, (unsigned)p.nchunks);
        if (p.hw % VEC == 0 && al)
            k_bn_part_nchw<T, VEC><<<grid, W_TPB, 0, s>>>(x, dy, y, mean, c, p.hw, p.E, p.L, mode, part);
        else
            k_bn_part_nchw<T, 1><<<grid, W_TPB, 0, s>>>(x, dy, y, mean, c, p.hw, p.E, p.L, mode, part);
    } else {
        /* fp32: 4 channels a thread when they fit; bf16 comes here only
         * when the row kernels cannot take it, one channel a thread */
        const int V = (sizeof(T) == 4 && c % 4 == 0 && al) ? 4 : 1;
        const int Cv = c / V;
        const int G = Cv < W_TPB ? Cv : W_TPB;
        const int RS = W_TPB / G;
        dim3 grid((unsigned)((Cv + G - 1) / G), (unsigned)p.nchunks);
        const unsigned threads = (unsigned)(G * RS);
        const size_t shm = sizeof(double) * 2 * threads * V;
        if constexpr (sizeof(T) == 4) {
            if (V == 4) {
                k_bn_part_nhwc<T, 4><<<grid, threads, shm, s>>>(x, dy, y, mean, c, p.E, p.L, mode, part);
                SF_CUDA_CHECK_LAUNCH();
                return 0;
            }
        }
        k_bn_part_nhwc<T, 1><<<grid, threads, shm, s>>>(x, dy, y, mean, c, p.E, p.L, mode, part);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* Whether the generic elementwise kernels can take V elements at a time. */
static int bn_vec(const bn_plan &p, int c, int V, const void *a, const void *b, const void *d, const void *e)
{
    const int shape = p.nhwc ? c % V == 0 : p.hw % (size_t)V == 0;
    return shape && w_al16(a) && w_al16(b) && (!d || w_al16(d)) && (!e || w_al16(e));
}

/* The NHWC row kernels (k_bn_*_rows): threads across channel vectors in a block. */
static int bn_rows_G(int c, int V)
{
    const int cv = c / V;
    const int low = cv & -cv;
    return low < 16 ? low : 16;
}

/* Whether the row kernels take a bf16 tensor: NHWC, C % 8 == 0, aligned. */
static int bn_rows_ok(const bn_plan &p, int c, const void *a, const void *b, const void *d, const void *e)
{
    return p.nhwc && c % 8 == 0 && c / 8 / bn_rows_G(c, 8) <= 65535 && w_al16(a) && w_al16(b) &&
           (!d || w_al16(d)) && (!e || w_al16(e));
}

/* Grid of the elementwise row kernels: ~16 rows a thread, but at least a
 * device's worth of blocks when there are rows for them. */
static dim3 bn_rows_grid(size_t R, int c, int V)
{
    const int G = bn_rows_G(c, V), RS = W_TPB / G;
    const unsigned gy = (unsigned)(c / V / G);
    size_t gx = w_cdiv(R, (size_t)RS * 16);
    const size_t fill = w_cdiv((size_t)w_sms() * (2048 / W_TPB), gy);
    const size_t most = w_cdiv(R, (size_t)RS);
    if (gx < fill)
        gx = fill;
    if (gx > most)
        gx = most;
    if (gx > 0x7fffffffu)
        gx = 0x7fffffffu;
    return dim3((unsigned)gx, gy);
}

template <typename T>
static int bn_fwd_train_t(const char *fn, const T *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                          const float *beta, float eps, float momentum, float *running_mean, float *running_var,
                          float *save_mean, float *save_invstd, T *y, int relu, void *scratch, cudaStream_t s)
{
    constexpr bool BF = sizeof(T) == 2;
    constexpr int VEC = 16 / sizeof(T);
    if (bn_check(fn, n, c, h, w))
        return -1;
    bn_plan p = bn_plan_of(n, c, h, w, lay);
    if (p.E < 2) {
        sf_cuda_set_error("%s:%d: %s: one value per channel (n*h*w=%zu)", __FILE__, __LINE__, fn, p.E);
        return -1;
    }
    const int rows = BF && bn_rows_ok(p, c, x, y, NULL, NULL);
    if (BF)
        bn_plan_bf16(&p, rows);
    double *part = (double *)scratch;
    if (rows) {
        if constexpr (BF) {
            dim3 grid((unsigned)p.nchunks, (unsigned)(c / VEC / bn_rows_G(c, VEC)));
            k_bn_part_rows<T, 0><<<grid, W_TPB, 0, s>>>(x, NULL, NULL, NULL, c, bn_rows_G(c, VEC), p.E, p.L,
                                                        p.nchunks, part);
            SF_CUDA_CHECK_LAUNCH();
        }
    } else if (bn_partials<T>(p, x, NULL, NULL, NULL, c, 0, part, s)) {
        return -1;
    }
    if constexpr (BF) {
        /* rows: part[c][chunk]; generic: part[chunk][c] */
        k_bn_final_tree<T, 0><<<w_blocks((size_t)c * 32, W_TPB), W_TPB, 0, s>>>(
            part, rows ? (size_t)p.nchunks : 1, rows ? 1 : (size_t)c, p.nchunks, c, (double)p.E, x,
            p.nhwc ? 1 : p.hw, eps, momentum, running_mean, running_var, save_mean, save_invstd, NULL, NULL, NULL,
            NULL, NULL);
    } else {
        k_bn_stats_final<<<w_blocks((size_t)c, W_TPB), W_TPB, 0, s>>>(part, p.nchunks, c, (double)p.E, x,
                                                                       p.nhwc ? 1 : p.hw, eps, momentum,
                                                                       running_mean, running_var, save_mean,
                                                                       save_invstd);
    }
    SF_CUDA_CHECK_LAUNCH();
    const size_t len = (size_t)c * p.E;
    if (rows) {
        if constexpr (BF)
            k_bn_apply_rows<T><<<bn_rows_grid(p.E, c, VEC), W_TPB, 0, s>>>(
                x, p.E, c, bn_rows_G(c, VEC), save_mean, save_invstd, NULL, eps, gamma, beta, relu, y);
    } else if (bn_vec(p, c, VEC, x, y, NULL, NULL))
        k_bn_apply<T, VEC><<<w_blocks(len / VEC, W_TPB), W_TPB, 0, s>>>(x, len / VEC, c, p.hw, p.nhwc, save_mean,
                                                                       save_invstd, NULL, eps, gamma, beta, relu, y);
    else
        k_bn_apply<T, 1><<<w_blocks(len, W_TPB), W_TPB, 0, s>>>(x, len, c, p.hw, p.nhwc, save_mean, save_invstd,
                                                                NULL, eps, gamma, beta, relu, y);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int bn_fwd_eval_t(const char *fn, const T *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                         const float *beta, float eps, const float *running_mean, const float *running_var, T *y,
                         int relu, cudaStream_t s)
{
    constexpr bool BF = sizeof(T) == 2;
    constexpr int VEC = 16 / sizeof(T);
    if (bn_check(fn, n, c, h, w))
        return -1;
    const bn_plan p = bn_plan_of(n, c, h, w, lay);
    const size_t len = (size_t)c * p.E;
    if (BF && bn_rows_ok(p, c, x, y, NULL, NULL)) {
        if constexpr (BF)
            k_bn_apply_rows<T><<<bn_rows_grid(p.E, c, VEC), W_TPB, 0, s>>>(
                x, p.E, c, bn_rows_G(c, VEC), running_mean, NULL, running_var, eps, gamma, beta, relu, y);
    } else if (bn_vec(p, c, VEC, x, y, NULL, NULL))
        k_bn_apply<T, VEC><<<w_blocks(len / VEC, W_TPB), W_TPB, 0, s>>>(
            x, len / VEC, c, p.hw, p.nhwc, running_mean, NULL, running_var, eps, gamma, beta, relu, y);
    else
        k_bn_apply<T, 1><<<w_blocks(len, W_TPB), W_TPB, 0, s>>>(x, len, c, p.hw, p.nhwc, running_mean, NULL,
                                                                running_var, eps, gamma, beta, relu, y);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int bn_bwd_t(const char *fn, const T *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                    const float *save_mean, const float *save_invstd, const T *dy, const T *y, T *dx, float *dgamma,
                    float *dbeta, void *scratch, cudaStream_t s)
{
    constexpr bool BF = sizeof(T) == 2;
    constexpr int VEC = 16 / sizeof(T);
    if (bn_check(fn, n, c, h, w))
        return -1;
    bn_plan p = bn_plan_of(n, c, h, w, lay);
    const int rows = BF && bn_rows_ok(p, c, x, dy, dx, y);
    if (BF)
        bn_plan_bf16(&p, rows);
    double *part = (double *)scratch;
    float *coef = (float *)(part + 2 * (size_t)p.nchunks * c);
    if (rows) {
        if constexpr (BF) {
            dim3 grid((unsigned)p.nchunks, (unsigned)(c / VEC / bn_rows_G(c, VEC)));
            k_bn_part_rows<T, 1><<<grid, W_TPB, 0, s>>>(x, dy, y, save_mean, c, bn_rows_G(c, VEC), p.E, p.L,
                                                        p.nchunks, part);
            SF_CUDA_CHECK_LAUNCH();
        }
    } else if (bn_partials<T>(p, x, dy, y, save_mean, c, 1, part, s)) {
        return -1;
    }
    if constexpr (BF)
        k_bn_final_tree<T, 1><<<w_blocks((size_t)c * 32, W_TPB), W_TPB, 0, s>>>(
            part, rows ? (size_t)p.nchunks : 1, rows ? 1 : (size_t)c, p.nchunks, c, (double)p.E, x, 0, 0.f, 0.f,
            NULL, NULL, NULL, NULL, gamma, save_invstd, dgamma, dbeta, coef);
    else
        k_bn_bwd_final<<<w_blocks((size_t)c, W_TPB), W_TPB, 0, s>>>(part, p.nchunks, c, (double)p.E, gamma,
                                                                     save_invstd, dgamma, dbeta, coef);
    SF_CUDA_CHECK_LAUNCH();
    const size_t len = (size_t)c * p.E;
    if (rows) {
        if constexpr (BF)
            k_bn_dx_rows<T><<<bn_rows_grid(p.E, c, VEC), W_TPB, 0, s>>>(x, dy, y, p.E, c, bn_rows_G(c, VEC),
                                                                        save_mean, coef, dx);
    } else if (bn_vec(p, c, VEC, x, dy, dx, y))
        k_bn_dx<T, VEC><<<w_blocks(len / VEC, W_TPB), W_TPB, 0, s>>>(x, dy, y, len / VEC, c, p.hw, p.nhwc,
                                                                    save_mean, coef, dx);
    else
        k_bn_dx<T, 1><<<w_blocks(len, W_TPB), W_TPB, 0, s>>>(x, dy, y, len, c, p.hw, p.nhwc, save_mean, coef, dx);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_bn_fwd_train(const float *x, int n, int c, int h, int w, sf_layout lay,
                                    const float *gamma, const float *beta, float eps, float momentum,
                                    float *running_mean, float *running_var, float *save_mean,
                                    float *save_invstd, float *y, int relu, void *scratch, cudaStream_t s)
{
    return bn_fwd_train_t<float>("sf_cuda_bn_fwd_train", x, n, c, h, w, lay, gamma, beta, eps, momentum,
                                 running_mean, running_var, save_mean, save_invstd, y, relu, scratch, s);
}

extern "C" int sf_cuda_bn_fwd_eval(const float *x, int n, int c, int h, int w, sf_layout lay,
                                   const float *gamma, const float *beta, float eps, const float *running_mean,
                                   const float *running_var, float *y, int relu, cudaStream_t s)
{
    return bn_fwd_eval_t<float>("sf_cuda_bn_fwd_eval", x, n, c, h, w, lay, gamma, beta, eps, running_mean,
                                running_var, y, relu, s);
}

extern "C" int sf_cuda_bn_bwd(const float *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                              const float *save_mean, const float *save_invstd, const float *dy,
                              const float *y, float *dx, float *dgamma, float *dbeta, void *scratch,
                              cudaStream_t s)
{
    return bn_bwd_t<float>("sf_cuda_bn_bwd", x, n, c, h, w, lay, gamma, save_mean, save_invstd, dy, y, dx, dgamma,
                           dbeta, scratch, s);
}

extern "C" int sf_cuda_bn_fwd_train_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                       const float *gamma, const float *beta, float eps, float momentum,
                                       float *running_mean, float *running_var, float *save_mean,
                                       float *save_invstd, void *y, int relu, void *scratch, cudaStream_t s)
{
    const char *fn = "sf_cuda_bn_fwd_train_dt";
    if (w_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return bn_fwd_train_t<w_bf16>(fn, (const w_bf16 *)x, n, c, h, w, lay, gamma, beta, eps, momentum,
                                      running_mean, running_var, save_mean, save_invstd, (w_bf16 *)y, relu,
                                      scratch, s);
    return bn_fwd_train_t<float>(fn, (const float *)x, n, c, h, w, lay, gamma, beta, eps, momentum, running_mean,
                                 running_var, save_mean, save_invstd, (float *)y, relu, scratch, s);
}

extern "C" int sf_cuda_bn_fwd_eval_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                      const float *gamma, const float *beta, float eps, const float *running_mean,
                                      const float *running_var, void *y, int relu, cudaStream_t s)
{
    const char *fn = "sf_cuda_bn_fwd_eval_dt";
    if (w_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return bn_fwd_eval_t<w_bf16>(fn, (const w_bf16 *)x, n, c, h, w, lay, gamma, beta, eps, running_mean,
                                     running_var, (w_bf16 *)y, relu, s);
    return bn_fwd_eval_t<float>(fn, (const float *)x, n, c, h, w, lay, gamma, beta, eps, running_mean, running_var,
                                (float *)y, relu, s);
}

extern "C" int sf_cuda_bn_bwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                 const float *gamma, const float *save_mean, const float *save_invstd, const void *dy,
                                 const void *y, void *dx, float *dgamma, float *dbeta, void *scratch, cudaStream_t s)
{
    const char *fn = "sf_cuda_bn_bwd_dt";
    if (w_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return bn_bwd_t<w_bf16>(fn, (const w_bf16 *)x, n, c, h, w, lay, gamma, save_mean, save_invstd,
                                (const w_bf16 *)dy, (const w_bf16 *)y, (w_bf16 *)dx, dgamma, dbeta, scratch, s);
    return bn_bwd_t<float>(fn, (const float *)x, n, c, h, w, lay, gamma, save_mean, save_invstd, (const float *)dy,
                           (const float *)y, (float *)dx, dgamma, dbeta, scratch, s);
}

/* ---- maxpool ----------------------------------------------------------------- */

static int pool_check(const char *fn, int n, int c, int h, int w, int k, int stride, int pad, int *oh, int *ow)
{
    if (n < 1 || c < 1 || h < 1 || w < 1 || k < 1 || stride < 1 || pad < 0 || 2 * pad > k ||
        (double)n * c * h * w >= 4294967296.0 || (double)h * w >= 2147483648.0 ||
        h + 2 * pad < k || w + 2 * pad < k) {
        sf_cuda_set_error("%s:%d: %s: n=%d c=%d %dx%d k=%d stride=%d pad=%d", __FILE__, __LINE__, fn, n, c, h, w,
                          k, stride, pad);
        return -1;
    }
    *oh = (h + 2 * pad - k) / stride + 1;
    *ow = (w + 2 * pad - k) / stride + 1;
    return 0;
}

/* k3 s2 p1 takes the stem kernels (oh = ceil(h/2): one quad of inputs per
 * output in the backward); other windows the generic ones. */
template <typename T>
static int maxpool_fwd_t(const char *fn, const T *x, int n, int c, int h, int w, int k, int stride, int pad,
                         sf_layout lay, T *y, int32_t *argmax, cudaStream_t s)
{
    constexpr int VEC = 16 / sizeof(T);
    int oh, ow;
    if (pool_check(fn, n, c, h, w, k, stride, pad, &oh, &ow))
        return -1;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (k == 3 && stride == 2 && pad == 1) {
        if (nhwc && c % VEC == 0 && w_al16(x) && w_al16(y) && w_al16(argmax)) {
            const unsigned total = (unsigned)((size_t)n * oh * ow * (c / VEC));
            k_mp3_fwd_nhwc<T, VEC><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(x, c, h, w, oh, ow, total, y, argmax);
        } else if (nhwc) {
            const unsigned total = (unsigned)((size_t)n * oh * ow * c);
            k_mp3_fwd_nhwc<T, 1><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(x, c, h, w, oh, ow, total, y, argmax);
        } else {
            const unsigned total = (unsigned)((size_t)n * c * oh * ow);
            k_mp3_fwd_nchw<T><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(x, h, w, oh, ow, total, y, argmax);
        }
    } else {
        const size_t total = (size_t)n * c * oh * ow;
        if (k == 3 && stride == 2)
            k_maxpool_fwd<T, 3, 2><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(x, c, h, w, k, stride, pad, oh, ow,
                                                                            nhwc, total, y, argmax);
        else
            k_maxpool_fwd<T, 0, 0><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(x, c, h, w, k, stride, pad, oh, ow,
                                                                            nhwc, total, y, argmax);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int maxpool_bwd_t(const char *fn, const T *dy, const int32_t *argmax, int n, int c, int h, int w, int k,
                         int stride, int pad, sf_layout lay, T *dx, cudaStream_t s)
{
    constexpr int VEC = 16 / sizeof(T);
    int oh, ow;
    if (pool_check(fn, n, c, h, w, k, stride, pad, &oh, &ow))
        return -1;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (k == 3 && stride == 2 && pad == 1) {
        if (nhwc && c % VEC == 0 && w_al16(dy) && w_al16(argmax) && w_al16(dx)) {
            const unsigned total = (unsigned)((size_t)n * oh * ow * (c / VEC));
            k_mp3_bwd_nhwc<T, VEC><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(dy, argmax, c, h, w, oh, ow, total, dx);
        } else if (nhwc) {
            const unsigned total = (unsigned)((size_t)n * oh * ow * c);
            k_mp3_bwd_nhwc<T, 1><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(dy, argmax, c, h, w, oh, ow, total, dx);
        } else {
            const unsigned total = (unsigned)((size_t)n * c * oh * ow);
            if (w % 2 == 0 && ((uintptr_t)dx % (2 * sizeof(T))) == 0)
                k_mp3_bwd_nchw<T, 1><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(dy, argmax, h, w, oh, ow, total, dx);
            else
                k_mp3_bwd_nchw<T, 0><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(dy, argmax, h, w, oh, ow, total, dx);
        }
    } else {
        const size_t total = (size_t)n * c * h * w;
        if (k == 3 && stride == 2)
            k_maxpool_bwd<T, 3, 2><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(dy, argmax, c, h, w, k, stride, pad, oh,
                                                                            ow, nhwc, total, dx);
        else
            k_maxpool_bwd<T, 0, 0><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(dy, argmax, c, h, w, k, stride, pad, oh,
                                                                            ow, nhwc, total, dx);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_maxpool_fwd(const float *x, int n, int c, int h, int w, int k, int stride, int pad,
                                   sf_layout lay, float *y, int32_t *argmax, cudaStream_t s)
{
    return maxpool_fwd_t<float>("sf_cuda_maxpool_fwd", x, n, c, h, w, k, stride, pad, lay, y, argmax, s);
}

extern "C" int sf_cuda_maxpool_bwd(const float *dy, const int32_t *argmax, int n, int c, int h, int w, int k,
                                   int stride, int pad, sf_layout lay, float *dx, cudaStream_t s)
{
    return maxpool_bwd_t<float>("sf_cuda_maxpool_bwd", dy, argmax, n, c, h, w, k, stride, pad, lay, dx, s);
}

extern "C" int sf_cuda_maxpool_fwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, int k, int stride,
                                      int pad, sf_layout lay, void *y, int32_t *argmax, cudaStream_t s)
{
    const char *fn = "sf_cuda_maxpool_fwd_dt";
    if (w_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return maxpool_fwd_t<w_bf16>(fn, (const w_bf16 *)x, n, c, h, w, k, stride, pad, lay, (w_bf16 *)y, argmax,
                                     s);
    return maxpool_fwd_t<float>(fn, (const float *)x, n, c, h, w, k, stride, pad, lay, (float *)y, argmax, s);
}

extern "C" int sf_cuda_maxpool_bwd_dt(sf_dtype dt, const void *dy, const int32_t *argmax, int n, int c, int h, int w,
                                      int k, int stride, int pad, sf_layout lay, void *dx, cudaStream_t s)
{
    const char *fn = "sf_cuda_maxpool_bwd_dt";
    if (w_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return maxpool_bwd_t<w_bf16>(fn, (const w_bf16 *)dy, argmax, n, c, h, w, k, stride, pad, lay, (w_bf16 *)dx,
                                     s);
    return maxpool_bwd_t<float>(fn, (const float *)dy, argmax, n, c, h, w, k, stride, pad, lay, (float *)dx, s);
}

/* ---- global average pooling ----------------------------------------------- */

template <typename T>
static int avgpool_fwd_t(const char *fn, const T *x, int n, int c, int h, int w, sf_layout lay, T *y,
                         cudaStream_t s)
{
    if (n < 1 || c < 1 || h < 1 || w < 1) {
        sf_cuda_set_error("%s:%d: %s: n=%d c=%d h=%d w=%d", __FILE__, __LINE__, fn, n, c, h, w);
        return -1;
    }
    const size_t planes = (size_t)n * c;
    if (lay == SF_LAYOUT_NHWC)
        k_avgpool_fwd_nhwc<T><<<w_blocks(planes, W_TPB), W_TPB, 0, s>>>(x, n, c, h * w, y);
    else
        k_avgpool_fwd_nchw<T><<<w_blocks(planes * 32, W_TPB), W_TPB, 0, s>>>(x, planes, h * w, y);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int avgpool_bwd_t(const char *fn, const T *dy, int n, int c, int h, int w, sf_layout lay, T *dx,
                         cudaStream_t s)
{
    if (n < 1 || c < 1 || h < 1 || w < 1) {
        sf_cuda_set_error("%s:%d: %s: n=%d c=%d h=%d w=%d", __FILE__, __LINE__, fn, n, c, h, w);
        return -1;
    }
    const size_t total = (size_t)n * c * h * w;
    k_avgpool_bwd<T><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(dy, total, c, h * w, lay == SF_LAYOUT_NHWC, dx);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_avgpool_fwd(const float *x, int n, int c, int h, int w, sf_layout lay, float *y,
                                   cudaStream_t s)
{
    return avgpool_fwd_t<float>("sf_cuda_avgpool_fwd", x, n, c, h, w, lay, y, s);
}

extern "C" int sf_cuda_avgpool_bwd(const float *dy, int n, int c, int h, int w, sf_layout lay, float *dx,
                                   cudaStream_t s)
{
    return avgpool_bwd_t<float>("sf_cuda_avgpool_bwd", dy, n, c, h, w, lay, dx, s);
}

extern "C" int sf_cuda_avgpool_fwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                      void *y, cudaStream_t s)
{
    const char *fn = "sf_cuda_avgpool_fwd_dt";
    if (w_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return avgpool_fwd_t<w_bf16>(fn, (const w_bf16 *)x, n, c, h, w, lay, (w_bf16 *)y, s);
    return avgpool_fwd_t<float>(fn, (const float *)x, n, c, h, w, lay, (float *)y, s);
}

extern "C" int sf_cuda_avgpool_bwd_dt(sf_dtype dt, const void *dy, int n, int c, int h, int w, sf_layout lay,
                                      void *dx, cudaStream_t s)
{
    const char *fn = "sf_cuda_avgpool_bwd_dt";
    if (w_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return avgpool_bwd_t<w_bf16>(fn, (const w_bf16 *)dy, n, c, h, w, lay, (w_bf16 *)dx, s);
    return avgpool_bwd_t<float>(fn, (const float *)dy, n, c, h, w, lay, (float *)dx, s);
}

/* ---- elementwise: residual add, ReLU ------------------------------------------ */

/* Launches k_ew over len elements: 16-byte vectors when every pointer is
 * 16-byte aligned, else one element a thread. */
template <typename T, int NIN, typename F>
static int ew_launch(const T *a, const T *b, T *y, size_t len, F f, cudaStream_t s)
{
    constexpr int VEC = 16 / sizeof(T);
    if (len == 0)
        return 0;
    if (w_al16(a) && (NIN == 1 || w_al16(b)) && w_al16(y))
        k_ew<T, VEC, NIN, F><<<w_ew_blocks(len / VEC), W_TPB, 0, s>>>(a, b, y, len, f);
    else
        k_ew<T, 1, NIN, F><<<w_ew_blocks(len), W_TPB, 0, s>>>(a, b, y, len, f);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_add(const float *a, const float *b, float *y, size_t len, int relu, cudaStream_t s)
{
    w_op_add op;
    op.relu = relu;
    return ew_launch<float, 2>(a, b, y, len, op, s);
}

extern "C" int sf_cuda_add_dt(sf_dtype dt, const void *a, const void *b, void *y, size_t len, int relu,
                              cudaStream_t s)
{
    if (w_dt_bad("sf_cuda_add_dt", dt))
        return -1;
    w_op_add op;
    op.relu = relu;
    if (dt == SF_DT_BF16)
        return ew_launch<w_bf16, 2>((const w_bf16 *)a, (const w_bf16 *)b, (w_bf16 *)y, len, op, s);
    return ew_launch<float, 2>((const float *)a, (const float *)b, (float *)y, len, op, s);
}

extern "C" int sf_cuda_relu_fwd_dt(sf_dtype dt, const void *x, void *y, size_t len, cudaStream_t s)
{
    if (w_dt_bad("sf_cuda_relu_fwd_dt", dt))
        return -1;
    if (dt == SF_DT_BF16)
        return ew_launch<w_bf16, 1>((const w_bf16 *)x, (const w_bf16 *)NULL, (w_bf16 *)y, len, w_op_relu(), s);
    return ew_launch<float, 1>((const float *)x, (const float *)NULL, (float *)y, len, w_op_relu(), s);
}

extern "C" int sf_cuda_relu_bwd_dt(sf_dtype dt, const void *y, const void *dy, void *dx, size_t len, cudaStream_t s)
{
    if (w_dt_bad("sf_cuda_relu_bwd_dt", dt))
        return -1;
    if (dt == SF_DT_BF16)
        return ew_launch<w_bf16, 2>((const w_bf16 *)y, (const w_bf16 *)dy, (w_bf16 *)dx, len, w_op_relu_bwd(), s);
    return ew_launch<float, 2>((const float *)y, (const float *)dy, (float *)dx, len, w_op_relu_bwd(), s);
}

/* ---- bias and activation on an element type ---------------------------------- */

template <typename T>
static int bias_act_t(T *y, const float *bias, size_t outer, int c, size_t inner, int relu, cudaStream_t s)
{
    constexpr int VEC = 16 / sizeof(T);
    const size_t len = outer * (size_t)c * inner;
    if (len == 0 || (!bias && !relu))
        return 0;
    if (w_al16(y) && ((inner == 1 && c % VEC == 0) || inner % VEC == 0))
        k_bias_act_t<T, VEC><<<w_ew_blocks(len / VEC), W_TPB, 0, s>>>(y, bias, len / VEC, c, inner, relu);
    else
        k_bias_act_t<T, 1><<<w_ew_blocks(len), W_TPB, 0, s>>>(y, bias, len, c, inner, relu);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* The chunk counts below stay within layers.cu's sf_cuda_bias_grad_scratch(c):
 * rows at most W_BGRAD_MAX_CHUNKS chunks of c, planes at most 1024/c chunks. */
#define W_BGRAD_MAX_CHUNKS 512

template <typename T>
static int bias_grad_t(T *dy, const T *y, size_t outer, int c, size_t inner, float *db, float *scratch,
                       cudaStream_t s)
{
    constexpr int VEC = 16 / sizeof(T);
    const size_t len = outer * (size_t)c * inner;
    if (len == 0) {
        if (db)
            SF_CUDA_CHECK(cudaMemsetAsync(db, 0, sizeof(float) * (size_t)c, s));
        return 0;
    }
    if (!db)
        return y ? ew_launch<T, 2>(y, (const T *)dy, dy, len, w_op_relu_bwd(), s) : 0;
    int nchunks;
    if (inner == 1) {
        const int V = (c % VEC == 0 && w_al16(dy) && (!y || w_al16(y))) ? VEC : 1;
        const int Cv = c / V;
        const int G = Cv < W_TPB ? Cv : W_TPB;
        const int RS = W_TPB / G;
        const unsigned gx = (unsigned)((Cv + G - 1) / G);
        size_t want = 1024 / gx;
        if (want < 1)
            want = 1;
        if (want > W_BGRAD_MAX_CHUNKS)
            want = W_BGRAD_MAX_CHUNKS;
        const size_t max_useful = (outer + RS - 1) / RS; /* at least one row per thread row */
        if (want > max_useful)
            want = max_useful;
        if (want < 1)
            want = 1;
        const size_t rpc = (outer + want - 1) / want;
        nchunks = (int)((outer + rpc - 1) / rpc);
        dim3 grid(gx, (unsigned)nchunks);
        const unsigned threads = (unsigned)(G * RS);
        const size_t shm = sizeof(float) * threads * V;
        if (V == VEC)
            k_bgrad_rows_t<T, VEC><<<grid, threads, shm, s>>>(dy, y, outer, c, rpc, scratch);
        else
            k_bgrad_rows_t<T, 1><<<grid, threads, shm, s>>>(dy, y, outer, c, rpc, scratch);
    } else {
        const int V = (inner % VEC == 0 && w_al16(dy) && (!y || w_al16(y))) ? VEC : 1;
        size_t want = c >= 1024 ? 1 : 1024 / (size_t)c;
        if (want > outer)
            want = outer;
        if (want < 1)
            want = 1;
        const size_t npc = (outer + want - 1) / want;
        nchunks = (int)((outer + npc - 1) / npc);
        dim3 grid((unsigned)c, (unsigned)nchunks);
        if (V == VEC)
            k_bgrad_planes_t<T, VEC><<<grid, W_TPB, 0, s>>>(dy, y, outer, c, inner, npc, scratch);
        else
            k_bgrad_planes_t<T, 1><<<grid, W_TPB, 0, s>>>(dy, y, outer, c, inner, npc, scratch);
    }
    SF_CUDA_CHECK_LAUNCH();
    k_bgrad_final_t<<<w_blocks((size_t)c, W_TPB), W_TPB, 0, s>>>(scratch, nchunks, c, db);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_bias_act_dt(sf_dtype dt, void *y, const float *bias, size_t outer, int c, size_t inner,
                                   int relu, cudaStream_t s)
{
    if (w_dt_bad("sf_cuda_bias_act_dt", dt))
        return -1;
    if (dt == SF_DT_BF16)
        return bias_act_t<w_bf16>((w_bf16 *)y, bias, outer, c, inner, relu, s);
    return bias_act_t<float>((float *)y, bias, outer, c, inner, relu, s);
}

extern "C" int sf_cuda_bias_grad_dt(sf_dtype dt, void *dy, const void *y, size_t outer, int c, size_t inner,
                                    float *db, float *scratch, cudaStream_t s)
{
    if (w_dt_bad("sf_cuda_bias_grad_dt", dt))
        return -1;
    if (dt == SF_DT_BF16)
        return bias_grad_t<w_bf16>((w_bf16 *)dy, (const w_bf16 *)y, outer, c, inner, db, scratch, s);
    return bias_grad_t<float>((float *)dy, (const float *)y, outer, c, inner, db, scratch, s);
}

/* The fp32 launchers of layers.h (the W1 op-list path's epilogues) are the
 * float case of the templates above: one implementation of each kernel. */
extern "C" int sf_cuda_bias_act(float *y, const float *bias, size_t outer, int c, size_t inner, int relu,
                                cudaStream_t s)
{
    return bias_act_t<float>(y, bias, outer, c, inner, relu, s);
}

extern "C" int sf_cuda_relu_fwd(const float *x, float *y, size_t len, cudaStream_t s)
{
    return ew_launch<float, 1>(x, (const float *)NULL, y, len, w_op_relu(), s);
}

extern "C" int sf_cuda_relu_bwd(const float *y, const float *dy, float *dx, size_t len, cudaStream_t s)
{
    return ew_launch<float, 2>(y, dy, dx, len, w_op_relu_bwd(), s);
}

extern "C" int sf_cuda_bias_grad(float *dy, const float *y, size_t outer, int c, size_t inner, float *db,
                                 float *scratch, cudaStream_t s)
{
    return bias_grad_t<float>(dy, y, outer, c, inner, db, scratch, s);
}

/* ---- element type conversion, random fill --------------------------------- */

extern "C" int sf_cuda_cast(const void *src, sf_dtype st, void *dst, sf_dtype dt, size_t len, cudaStream_t s)
{
    if (w_dt_bad("sf_cuda_cast", st) || w_dt_bad("sf_cuda_cast", dt))
        return -1;
    if (len == 0)
        return 0;
    if (st == dt) {
        if (src != dst)
            SF_CUDA_CHECK(cudaMemcpyAsync(dst, src, len * sf_dtype_size(st), cudaMemcpyDeviceToDevice, s));
        return 0;
    }
    const int vec = w_al16(src) && w_al16(dst);
    const unsigned nb = w_ew_blocks(vec ? len / 8 : len);
    if (st == SF_DT_F32) {
        if (vec)
            k_cast<float, w_bf16, 1><<<nb, W_TPB, 0, s>>>((const float *)src, (w_bf16 *)dst, len);
        else
            k_cast<float, w_bf16, 0><<<nb, W_TPB, 0, s>>>((const float *)src, (w_bf16 *)dst, len);
    } else {
        if (vec)
            k_cast<w_bf16, float, 1><<<nb, W_TPB, 0, s>>>((const w_bf16 *)src, (float *)dst, len);
        else
            k_cast<w_bf16, float, 0><<<nb, W_TPB, 0, s>>>((const w_bf16 *)src, (float *)dst, len);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_fill_random_dt(sf_dtype dt, void *p, size_t len, uint64_t seed, float scale, cudaStream_t s)
{
    if (w_dt_bad("sf_cuda_fill_random_dt", dt))
        return -1;
    if (len == 0)
        return 0;
    if (dt == SF_DT_BF16)
        k_fill_random_t<w_bf16><<<w_ew_blocks(len), W_TPB, 0, s>>>((w_bf16 *)p, len, seed, scale);
    else
        k_fill_random_t<float><<<w_ew_blocks(len), W_TPB, 0, s>>>((float *)p, len, seed, scale);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ---- weights: model layout <-> device layout --------------------------------- */

/* Checks segs and fills the sorted table: every non-empty segment has c, rs
 * >= 1, a length that is a multiple of c*rs and under 2^32, and no two
 * overlap; with total != 0 they also end within total. */
static int w_perm_prep(const char *fn, const sf_sgd_segs *segs, size_t total, w_perm_tab *t)
{
    memset(t, 0, sizeof *t);
    if (!segs)
        return 0;
    if (segs->n < 0 || segs->n > SF_SGD_MAX_SEGS) {
        sf_cuda_set_error("%s:%d: %s: %d segments (at most %d)", __FILE__, __LINE__, fn, segs->n, SF_SGD_MAX_SEGS);
        return -1;
    }
    int n = 0;
    for (int k = 0; k < segs->n; k++) {
        const sf_perm_seg *g = &segs->s[k];
        if (g->len == 0)
            continue;
        const unsigned long long crs = (unsigned long long)(g->c > 0 ? g->c : 0) * (unsigned long long)(g->rs > 0 ? g->rs : 0);
        if (g->c < 1 || g->rs < 1 || crs > UINT_MAX || g->len % crs != 0 || g->len > UINT_MAX ||
            g->off + g->len < g->off || (total && g->off + g->len > total)) {
            sf_cuda_set_error("%s:%d: %s: segment %d (off %zu len %zu c %d rs %d) is not a whole [o][c][rs] block%s",
                              __FILE__, __LINE__, fn, k, g->off, g->len, g->c, g->rs,
                              total ? " inside the buffer" : "");
            return -1;
        }
        /* insertion by offset */
        int j = n++;
        while (j > 0 && t->off[j - 1] > g->off) {
            t->off[j] = t->off[j - 1];
            t->end[j] = t->end[j - 1];
            t->c[j] = t->c[j - 1];
            t->rs[j] = t->rs[j - 1];
            j--;
        }
        t->off[j] = g->off;
        t->end[j] = g->off + g->len;
        t->c[j] = (unsigned)g->c;
        t->rs[j] = (unsigned)g->rs;
    }
    t->n = n;
    t->grp[0] = 0;
    for (int k = 0; k < n; k++) {
        if (k + 1 < n && t->end[k] > t->off[k + 1]) {
            sf_cuda_set_error("%s:%d: %s: segments at %llu and %llu overlap", __FILE__, __LINE__, fn, t->off[k],
                              t->off[k + 1]);
            return -1;
        }
        t->grp[k + 1] = t->grp[k] + (t->end[k] + 7) / 8 - t->off[k] / 8;
    }
    return 0;
}

extern "C" int sf_cuda_weights_dev(const float *p, void *wd, sf_dtype dt, size_t len, const sf_sgd_segs *segs,
                                   cudaStream_t s)
{
    const char *fn = "sf_cuda_weights_dev";
    if (w_dt_bad(fn, dt))
        return -1;
    if (len == 0)
        return 0;
    w_perm_tab tab;
    if (w_perm_prep(fn, segs, len, &tab))
        return -1;
    const unsigned nb = w_blocks(w_cdiv(len, 8), W_TPB);
    const int vst = w_al16(wd);
    if (dt == SF_DT_BF16) {
        if (vst)
            k_weights_dev<w_bf16, 1><<<nb, W_TPB, 0, s>>>(p, (w_bf16 *)wd, len, tab);
        else
            k_weights_dev<w_bf16, 0><<<nb, W_TPB, 0, s>>>(p, (w_bf16 *)wd, len, tab);
    } else {
        if (vst)
            k_weights_dev<float, 1><<<nb, W_TPB, 0, s>>>(p, (float *)wd, len, tab);
        else
            k_weights_dev<float, 0><<<nb, W_TPB, 0, s>>>(p, (float *)wd, len, tab);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_grads_model(const void *gd, sf_dtype dt, float *g, const sf_sgd_segs *segs, cudaStream_t s)
{
    const char *fn = "sf_cuda_grads_model";
    if (w_dt_bad(fn, dt))
        return -1;
    w_perm_tab tab;
    if (w_perm_prep(fn, segs, 0, &tab))
        return -1;
    const unsigned long long groups = tab.grp[tab.n];
    if (groups == 0)
        return 0;
    const unsigned nb = w_blocks((size_t)groups, W_TPB);
    const int vst = w_al16(g);
    if (dt == SF_DT_BF16) {
        if (vst)
            k_grads_model<w_bf16, 1><<<nb, W_TPB, 0, s>>>((const w_bf16 *)gd, g, tab);
        else
            k_grads_model<w_bf16, 0><<<nb, W_TPB, 0, s>>>((const w_bf16 *)gd, g, tab);
    } else {
        if (vst)
            k_grads_model<float, 1><<<nb, W_TPB, 0, s>>>((const float *)gd, g, tab);
        else
            k_grads_model<float, 0><<<nb, W_TPB, 0, s>>>((const float *)gd, g, tab);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ---- AdamW ------------------------------------------------------------------- */

extern "C" void sf_adamw_hyper_at(sf_adamw_hyper *h, int64_t t)
{
    /* in double, as PyTorch computes them in Python floats */
    const double bc1 = 1.0 - pow((double)h->beta1, (double)t);
    const double bc2 = 1.0 - pow((double)h->beta2, (double)t);
    h->step_size = (float)((double)h->lr / bc1);
    h->bc2_sqrt = (float)sqrt(bc2);
    h->pad_ = 0.f;
}

extern "C" int sf_cuda_adamw(float *p, const float *g, float *m, float *v, float *wdev, size_t len,
                             const sf_adamw_hyper *d_hyper, const sf_sgd_segs *segs, cudaStream_t s)
{
    if (len == 0)
        return 0;
    if (!w_al16(p) || !w_al16(g) || !w_al16(m) || !w_al16(v)) {
        sf_cuda_set_error("%s:%d: sf_cuda_adamw: buffers must be 16-byte aligned", __FILE__, __LINE__);
        return -1;
    }
    sf_sgd_segs none;
    none.n = 0;
    const sf_sgd_segs *sg = segs ? segs : &none;
    if (sg->n > 0 && !wdev) {
        sf_cuda_set_error("%s:%d: sf_cuda_adamw: permuted segments need wdev", __FILE__, __LINE__);
        return -1;
    }
    k_adamw<<<w_blocks((len + 3) / 4, W_TPB), W_TPB, 0, s>>>(p, g, m, v, wdev, len, d_hyper, *sg);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ======================================================================== */
/* ConvTranspose2d: plans over layers.cu's convolutions                     */
/* ======================================================================== */

/* The conv direction that computes each convT direction (see the header). */
static const sf_conv_dir convt_as_conv[3] = {SF_CONV_BWD_DATA, SF_CONV_FWD, SF_CONV_BWD_FILTER};

static int convt_out(const sf_convt_desc *d, int *oh, int *ow)
{
    *oh = (d->h - 1) * d->stride - 2 * d->pad + d->k;
    *ow = (d->w - 1) * d->stride - 2 * d->pad + d->k;
    return *oh >= 1 && *ow >= 1;
}

/* The convolution whose adjoint the convT is: input [n, oc, oh, ow], weight
 * [c][oc][k][k] as KCRS, output [n, c, h, w]. */
static int convt_conv_desc(const sf_convt_desc *d, sf_conv_desc *cd)
{
    int oh, ow;
    if (d->n < 1 || d->c < 1 || d->h < 1 || d->w < 1 || d->oc < 1 || d->k < 1 || d->stride < 1 || d->pad < 0 ||
        !convt_out(d, &oh, &ow) || (d->dt != SF_DT_F32 && d->dt != SF_DT_BF16)) {
        sf_cuda_set_error("%s:%d: convT n=%d c=%d %dx%d oc=%d k=%d s=%d p=%d dt=%d: bad shape", __FILE__, __LINE__,
                          d->n, d->c, d->h, d->w, d->oc, d->k, d->stride, d->pad, (int)d->dt);
        return -1;
    }
    memset(cd, 0, sizeof *cd);
    cd->n = d->n;
    cd->c = d->oc;
    cd->h = oh;
    cd->w = ow;
    cd->oc = d->c;
    cd->k = d->k;
    cd->stride = d->stride;
    cd->pad = d->pad;
    cd->layout = d->layout;
    cd->tf32 = d->tf32;
    cd->dt = d->dt; /* x, w, y of the convT are y, w, x of the conv: one element type */
    cd->align_x = d->align_y;
    cd->align_w = d->align_w;
    cd->align_y = d->align_x;
    cd->allow_rtc = d->allow_rtc;
    return 0;
}

static sf_conv_ptrs convt_conv_ptrs(const sf_convt_ptrs *p)
{
    sf_conv_ptrs q;
    q.x = p->y;
    q.w = p->w;
    q.y = p->x;
    q.ws = p->ws;
    q.b = NULL;
    return q;
}

extern "C" void sf_convt_plans_destroy(sf_convt_plans *p)
{
    if (!p)
        return;
    for (int i = 0; i < 3; i++) {
        if (p->vp[i])
            sf_conv_vpack_destroy(p->vp[i]);
        sf_conv_plan_destroy(&p->plan[i]);
    }
    memset(p, 0, sizeof *p);
}

extern "C" int sf_convt_plans_build(cudnnHandle_t h, const sf_convt_desc *d, int dirs, size_t ws_limit,
                                    int max_candidates, const sf_convt_ptrs *tune, sf_convt_plans *out)
{
    memset(out, 0, sizeof *out);
    sf_conv_desc cd;
    if (convt_conv_desc(d, &cd))
        return -1;
    out->d = *d;
    sf_conv_ptrs tp;
    if (tune)
        tp = convt_conv_ptrs(tune);
    for (int dir = 0; dir < 3; dir++) {
        if (!(dirs & (1 << dir)))
            continue;
        if (sf_conv_plan_build(h, &cd, convt_as_conv[dir], ws_limit, max_candidates, tune ? &tp : NULL,
                               &out->plan[dir])) {
            sf_convt_plans_destroy(out);
            return -1;
        }
        out->dirs |= 1 << dir;
    }
    return 0;
}

extern "C" size_t sf_convt_ws_bytes(const sf_convt_plans *p)
{
    size_t m = 0;
    for (int i = 0; i < 3; i++)
        if ((p->dirs & (1 << i)) && (size_t)p->plan[i].ws_bytes > m)
            m = (size_t)p->plan[i].ws_bytes;
    return m;
}

extern "C" int sf_convt_run(cudnnHandle_t h, sf_convt_plans *p, sf_conv_dir dir, const sf_convt_ptrs *ptrs)
{
    if ((int)dir < 0 || (int)dir > 2 || !(p->dirs & (1 << dir))) {
        sf_cuda_set_error("%s:%d: sf_convt_run: direction %d not built", __FILE__, __LINE__, (int)dir);
        return -1;
    }
    if (!p->vp[dir] || memcmp(&p->vp_ptrs[dir], ptrs, sizeof *ptrs) != 0) {
        if (p->vp[dir]) {
            sf_conv_vpack_destroy(p->vp[dir]);
            p->vp[dir] = NULL;
        }
        const sf_conv_ptrs q = convt_conv_ptrs(ptrs);
        if (sf_conv_vpack_make(&q, &p->vp[dir]))
            return -1;
        p->vp_ptrs[dir] = *ptrs;
    }
    return sf_conv_run(h, &p->plan[dir], p->vp[dir]);
}

/* The key is the whole descriptor (memcmp: every field, dt included; the
 * struct is all ints, no padding), so a bf16 and an fp32 set of one shape are
 * two entries. */
extern "C" sf_convt_plans *sf_convt_cache_get(cudnnHandle_t h, sf_convt_cache *c, const sf_convt_desc *d,
                                              int dirs, size_t ws_limit, int max_candidates)
{
    for (int i = 0; i < c->n; i++)
        if (memcmp(&c->e[i].d, d, sizeof *d) == 0 && (c->e[i].dirs & dirs) == dirs)
            return &c->e[i];
    /* A set of this shape lacking a direction is rebuilt in place with the union. */
    int slot = -1;
    for (int i = 0; i < c->n; i++)
        if (memcmp(&c->e[i].d, d, sizeof *d) == 0) {
            dirs |= c->e[i].dirs;
            sf_convt_plans_destroy(&c->e[i]);
            slot = i;
            break;
        }
    if (slot < 0) {
        if (c->n >= SF_CONVT_CACHE_MAX) {
            sf_cuda_set_error("%s:%d: sf_convt_cache_get: cache full (%d shapes)", __FILE__, __LINE__,
                              SF_CONVT_CACHE_MAX);
            return NULL;
        }
        slot = c->n;
    }
    if (sf_convt_plans_build(h, d, dirs, ws_limit, max_candidates, NULL, &c->e[slot])) {
        /* keep the cache dense: move the last entry into a freed middle slot */
        if (slot < c->n) {
            c->n--;
            if (slot != c->n) {
                c->e[slot] = c->e[c->n];
                memset(&c->e[c->n], 0, sizeof c->e[c->n]);
            }
        }
        return NULL;
    }
    if (slot == c->n)
        c->n++;
    return &c->e[slot];
}

extern "C" void sf_convt_cache_destroy(sf_convt_cache *c)
{
    for (int i = 0; i < c->n; i++)
        sf_convt_plans_destroy(&c->e[i]);
    c->n = 0;
}

/* The convT output's view for the bias: [n*oh*ow, oc, 1] (NHWC) or [n, oc, oh*ow]. */
static int convt_bias_view(const char *fn, const sf_convt_desc *d, size_t *outer, size_t *inner)
{
    int oh, ow;
    if (!convt_out(d, &oh, &ow)) {
        sf_cuda_set_error("%s:%d: %s: bad shape", __FILE__, __LINE__, fn);
        return -1;
    }
    if (d->layout == SF_LAYOUT_NHWC) {
        *outer = (size_t)d->n * oh * ow;
        *inner = 1;
    } else {
        *outer = (size_t)d->n;
        *inner = (size_t)oh * ow;
    }
    return 0;
}

/* The fp32 wrappers take fp32 tensors: a bf16 descriptor needs the _dt ones. */
static int convt_f32_only(const char *fn, const sf_convt_desc *d)
{
    if (d->dt == SF_DT_F32)
        return 0;
    sf_cuda_set_error("%s:%d: %s: descriptor of element type %d (use %s_dt)", __FILE__, __LINE__, fn, (int)d->dt, fn);
    return -1;
}

extern "C" int sf_convt_bias_act(const sf_convt_desc *d, float *y, const float *b, int relu, cudaStream_t s)
{
    size_t outer, inner;
    if (convt_f32_only("sf_convt_bias_act", d) || convt_bias_view("sf_convt_bias_act", d, &outer, &inner))
        return -1;
    return sf_cuda_bias_act(y, b, outer, d->oc, inner, relu, s);
}

extern "C" int sf_convt_bias_grad(const sf_convt_desc *d, float *dy, const float *y, float *db, float *scratch,
                                  cudaStream_t s)
{
    size_t outer, inner;
    if (convt_f32_only("sf_convt_bias_grad", d) || convt_bias_view("sf_convt_bias_grad", d, &outer, &inner))
        return -1;
    return sf_cuda_bias_grad(dy, y, outer, d->oc, inner, db, scratch, s);
}

extern "C" int sf_convt_bias_act_dt(const sf_convt_desc *d, void *y, const float *b, int relu, cudaStream_t s)
{
    size_t outer, inner;
    if (convt_bias_view("sf_convt_bias_act_dt", d, &outer, &inner))
        return -1;
    return sf_cuda_bias_act_dt(d->dt, y, b, outer, d->oc, inner, relu, s);
}

extern "C" int sf_convt_bias_grad_dt(const sf_convt_desc *d, void *dy, const void *y, float *db, float *scratch,
                                     cudaStream_t s)
{
    size_t outer, inner;
    if (convt_bias_view("sf_convt_bias_grad_dt", d, &outer, &inner))
        return -1;
    return sf_cuda_bias_grad_dt(d->dt, dy, y, outer, d->oc, inner, db, scratch, s);
}
