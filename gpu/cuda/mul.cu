/* gpu/cuda/mul.cu — kernels first, then launchers: elementwise
 * multiplication (same shape, or broadcast over H,W) and the per-channel
 * scale (and shift) by parameters, with their gradients and deterministic
 * reductions.
 * Contracts in mul.h; the arithmetic is gpu/ref/mul.c's. */
#include "gpu/cuda/mul.h"

#include <type_traits>

#include "gpu/cuda/kernel_common.cuh"

/* Chunks of the per-channel reduction's first pass at most: the partial sums
 * then fit sf_cuda_channel_scale_scratch. */
#define CS_MAX_CHUNKS 512

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* The channel of element e of an [n, c, hw] map in layout nhwc. */
__device__ __forceinline__ int chan_of(size_t e, int c, size_t hw, int nhwc)
{
    return nhwc ? (int)(e % (size_t)c) : (int)((e / hw) % (size_t)c);
}

/* The index into a broadcast [n, c] tensor of element e of the map. */
__device__ __forceinline__ size_t bcast_of(size_t e, int c, size_t hw, int nhwc)
{
    return nhwc ? (e / (hw * (size_t)c)) * (size_t)c + e % (size_t)c : e / hw;
}

/* y[e] = a[e] * b[bcast ? bcast_of(e) : e]: the forward, and the backward's
 * da = dy * b (dy in a's place) and same-shape db = dy * a. y may alias a. */
template <typename T>
__global__ void k_mul(const T *a, const T *__restrict__ b, T *y, size_t len, int c, size_t hw, int bcast, int nhwc)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        const float bv = cu_f(b[bcast ? bcast_of(e, c, hw, nhwc) : e]);
        y[e] = cu_to<T>(cu_f(a[e]) * bv);
    }
}

/* k_mul over 16-byte vectors of V = 16/sizeof(T) elements (a, b, y 16-byte
 * aligned; with bcast, NHWC needs c % V == 0 and NCHW hw % V == 0, so a
 * vector's broadcast values are V consecutive channels of one sample, or one
 * plane's single value). y may alias a. */
template <typename T, int V>
__global__ void k_mul_vec(const T *a, const T *__restrict__ b, T *y, size_t nvec, int c, size_t hw, int bcast,
                          int nhwc)
{
    const size_t step = (size_t)gridDim.x * blockDim.x, cv = (size_t)c / V;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += step) {
        float av[V], bv[V];
        cu_ld<T, V>(a + i * V, av);
        if (bcast)
            cu_ld_bcast<T, V>(b, i, c, cv, hw, nhwc, bv);
        else
            cu_ld<T, V>(b + i * V, bv);
#pragma unroll
        for (int v = 0; v < V; v++)
            av[v] *= bv[v];
        cu_st<T, V>(y + i * V, av);
    }
}

/* db[n][c] = sum over p of dy * a, NCHW: one warp per (n, c), lanes striding
 * p, then a fixed-order shuffle sum. */
template <typename T>
__global__ void k_mul_db_planes(const T *__restrict__ a, const T *__restrict__ dy, T *__restrict__ db, size_t nc,
                                size_t hw)
{
    const size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= nc)
        return;
    float acc = 0.f;
    for (size_t p = lane; p < hw; p += 32)
        acc += cu_f(dy[w * hw + p]) * cu_f(a[w * hw + p]);
#pragma unroll
    for (int o = 16; o; o >>= 1)
        acc += __shfl_down_sync(0xffffffffu, acc, o);
    if (lane == 0)
        db[w] = cu_to<T>(acc);
}

/* y[e] = x[e] * scale[channel of e] (+ shift[channel of e] where shift is
 * not NULL: one fused multiply-add in fp32, rounded once to T). */
template <typename T>
__global__ void k_chan_scale(const T *x, const float *__restrict__ scale, const float *__restrict__ shift, T *y,
                             size_t len, int c, size_t hw, int nhwc)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        const int ci = chan_of(e, c, hw, nhwc);
        y[e] = cu_to<T>(shift ? fmaf(cu_f(x[e]), scale[ci], shift[ci]) : cu_f(x[e]) * scale[ci]);
    }
}

/* k_chan_scale over 16-byte vectors of V = 16/sizeof(T) elements (x, y
 * 16-byte aligned): NHWC with c % V == 0 (a vector is V consecutive channels,
 * their scales one or two float4 loads of the 16-byte aligned parameter), or
 * NCHW with hw % V == 0 (a vector lies in one channel's plane). y may alias
 * x. The same product, so the same bits, as k_chan_scale. */
template <typename T, int V>
__global__ void __launch_bounds__(CU_TPB)
    k_chan_scale_vec(const T *x, const float *__restrict__ scale, const float *__restrict__ shift, T *y, size_t nvec,
                     int c, size_t hw, int nhwc)
{
    const size_t step = (size_t)gridDim.x * blockDim.x, cv = (size_t)c / V;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += step) {
        float u[V], sv[V], bv[V];
        cu_ld<T, V>(x + i * V, u);
        if (nhwc) {
            cu_ldf<V>(scale + (i % cv) * V, sv);
            if (shift)
                cu_ldf<V>(shift + (i % cv) * V, bv);
        } else {
            const size_t ci = (i * V / hw) % (size_t)c;
            const float one = scale[ci], b = shift ? shift[ci] : 0.f;
#pragma unroll
            for (int v = 0; v < V; v++) {
                sv[v] = one;
                bv[v] = b;
            }
        }
        if (shift) {
#pragma unroll
            for (int v = 0; v < V; v++)
                u[v] = fmaf(u[v], sv[v], bv[v]);
        } else {
#pragma unroll
            for (int v = 0; v < V; v++)
                u[v] *= sv[v];
        }
        cu_st<T, V>(y + i * V, u);
    }
}

/* The scale's gradient's term, dy * x, and the shift's, dy: summed per
 * channel by kernel_common.cuh's k_chan_sum_planes and k_chan_sum_rows (pass
 * 1) where the vector kernel below does not apply. */
struct cs_term {
    __device__ float operator()(float x, float d) const { return d * x; }
};
struct cs_shift_term {
    __device__ float operator()(float x, float d) const { return d; }
};

/* Pass 1, NHWC over 16-byte vectors (c % V == 0, x and dy 16-byte
 * aligned): block (tile of up to 32 channel vectors, chunk of rows) sums its
 * chunk's rows (of dy * x, or of dy alone when !PROD) by cu_rows_sum_tile
 * into partial[chunk][c]. A thread per channel walking the chunk's rows one
 * 2-byte load at a time kept too few bytes in flight (96 channels: 96
 * threads a chunk). */
template <typename T, int V, bool PROD>
__global__ void __launch_bounds__(CU_TPB)
    k_cs_grad_rows_vec(const T *__restrict__ x, const T *__restrict__ dy, size_t R, int c, size_t rows_per_chunk,
                       float *__restrict__ partial)
{
    const size_t r0 = (size_t)blockIdx.y * rows_per_chunk;
    const size_t r1 = r0 + rows_per_chunk < R ? r0 + rows_per_chunk : R;
    const size_t off = r0 * (size_t)c;
    float sum;
    const bool mine = PROD ? cu_rows_sum_tile<T, V, true>(x + off, dy + off, c, r1 - r0, (int)blockIdx.x, sum)
                           : cu_rows_sum_tile<T, V, false>(dy + off, dy, c, r1 - r0, (int)blockIdx.x, sum);
    if (mine)
        partial[(size_t)blockIdx.y * c + (size_t)blockIdx.x * 32 * V + threadIdx.x] = sum;
}

/* Pass 2 is k_sum_partials (kernel_common.cuh). */

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

/* y = a * b (b broadcast over H,W when bcast) on the vector kernel where the
 * shape and alignment let it, else the scalar one. */
template <typename T>
static void mul_launch(sf_layout lay, const T *a, const T *b, T *y, size_t len, int c, size_t hw, int bcast,
                       cudaStream_t s)
{
    constexpr int V = 16 / sizeof(T);
    const int nhwc = lay == SF_LAYOUT_NHWC;
    const int shape = !bcast ? len % V == 0 : cu_chan_vec_ok(nhwc, c, hw, V);
    if (shape && cu_al16(a) && cu_al16(b) && cu_al16(y))
        k_mul_vec<T, V><<<cu_ew_blocks(len / V), CU_TPB, 0, s>>>(a, b, y, len / V, c, hw, bcast, nhwc);
    else
        k_mul<T><<<cu_ew_blocks(len), CU_TPB, 0, s>>>(a, b, y, len, c, hw, bcast, nhwc);
}

template <typename T>
static int mul_fwd_t(sf_layout lay, const void *a, const void *b, void *y, int n, int c, size_t hw, int bcast,
                     cudaStream_t s)
{
    const size_t len = (size_t)n * c * hw;
    if (len == 0)
        return 0;
    mul_launch<T>(lay, (const T *)a, (const T *)b, (T *)y, len, c, hw, bcast, s);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int mul_bwd_t(sf_layout lay, const void *a, const void *b, const void *dy, void *da, void *db, int n, int c,
                     size_t hw, int bcast, cudaStream_t s)
{
    const size_t len = (size_t)n * c * hw;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (len == 0)
        return 0;
    if (da) {
        mul_launch<T>(lay, (const T *)dy, (const T *)b, (T *)da, len, c, hw, bcast, s);
        SF_CUDA_CHECK_LAUNCH();
    }
    if (!db)
        return 0;
    if (!bcast)
        mul_launch<T>(lay, (const T *)dy, (const T *)a, (T *)db, len, c, hw, 0, s);
    else if (nhwc)
        cu_nhwc_rows_sum<T, true>((const T *)a, (const T *)dy, (T *)db, n, c, hw, 1.f, s);
    else
        k_mul_db_planes<T><<<cu_blocks((size_t)n * c * 32, CU_TPB), CU_TPB, 0, s>>>((const T *)a, (const T *)dy,
                                                                                   (T *)db, (size_t)n * c, hw);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_mul_fwd_dt(sf_dtype dt, sf_layout lay, const void *a, const void *b, void *y, int n, int c,
                                  size_t hw, int bcast, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_mul_fwd_dt", dt))
        return -1;
    return dt == SF_DT_BF16 ? mul_fwd_t<cu_bf16>(lay, a, b, y, n, c, hw, bcast, s)
                            : mul_fwd_t<float>(lay, a, b, y, n, c, hw, bcast, s);
}

extern "C" int sf_cuda_mul_bwd_dt(sf_dtype dt, sf_layout lay, const void *a, const void *b, const void *dy, void *da,
                                  void *db, int n, int c, size_t hw, int bcast, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_mul_bwd_dt", dt))
        return -1;
    return dt == SF_DT_BF16 ? mul_bwd_t<cu_bf16>(lay, a, b, dy, da, db, n, c, hw, bcast, s)
                            : mul_bwd_t<float>(lay, a, b, dy, da, db, n, c, hw, bcast, s);
}

extern "C" size_t sf_cuda_channel_scale_scratch(int c) { return cu_chan_sum_scratch(c, CS_MAX_CHUNKS); }

/* y = x * scale[channel] (+ shift[channel]) on the vector kernel where the
 * shape and alignment let it, else the scalar one. */
template <typename T>
static void chan_scale_launch(const T *x, const float *scale, const float *shift, T *y, size_t len, int c, size_t hw,
                              int nhwc, cudaStream_t s)
{
    constexpr int V = 16 / sizeof(T);
    if (hw == 1) /* flat features: either layout is rows of c channels */
        nhwc = 1;
    const int shape = cu_chan_vec_ok(nhwc, c, hw, V) && (!nhwc || (cu_al16(scale) && (!shift || cu_al16(shift))));
    if (shape && cu_al16(x) && cu_al16(y))
        k_chan_scale_vec<T, V><<<cu_ew_blocks(len / V), CU_TPB, 0, s>>>(x, scale, shift, y, len / V, c, hw, nhwc);
    else
        k_chan_scale<T><<<cu_ew_blocks(len), CU_TPB, 0, s>>>(x, scale, shift, y, len, c, hw, nhwc);
}

template <typename T>
static int chan_scale_fwd_t(sf_layout lay, const void *x, const float *scale, const float *shift, void *y, int n,
                            int c, size_t hw, cudaStream_t s)
{
    const size_t len = (size_t)n * c * hw;
    if (len == 0)
        return 0;
    chan_scale_launch<T>((const T *)x, scale, shift, (T *)y, len, c, hw, lay == SF_LAYOUT_NHWC, s);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* out[c] = the per-channel sum of dy * x (PROD) or of dy, through scratch:
 * pass 1 into chunks' partials, pass 2 adding them in a fixed order. */
template <typename T, bool PROD>
static int chan_sum(int nhwc, const T *x, const T *dy, float *out, int n, int c, size_t hw, float *scratch,
                    cudaStream_t s)
{
    using Term = typename std::conditional<PROD, cs_term, cs_shift_term>::type;
    int nchunks;
    if (nhwc || hw == 1) { /* rows [n*hw, c] */
        const size_t R = (size_t)n * hw;
        size_t rpc;
        nchunks = cu_row_chunks(R, CS_MAX_CHUNKS, &rpc);
        constexpr int V = 16 / sizeof(T);
        if (c % V == 0 && cu_al16(x) && cu_al16(dy)) {
            const dim3 grid((unsigned)cu_cdiv((size_t)(c / V), 32), (unsigned)nchunks);
            k_cs_grad_rows_vec<T, V, PROD><<<grid, CU_TPB, 0, s>>>(x, dy, R, c, rpc, scratch);
        } else {
            const dim3 grid(cu_blocks((size_t)c, CU_TPB), (unsigned)nchunks);
            k_chan_sum_rows<T><<<grid, CU_TPB, 0, s>>>(x, dy, R, c, rpc, scratch, Term());
        }
    } else {
        int npc;
        nchunks = cu_plane_chunks(n, c, &npc);
        dim3 grid((unsigned)c, (unsigned)nchunks);
        k_chan_sum_planes<T><<<grid, CU_TPB, 0, s>>>(x, dy, n, c, hw, npc, scratch, Term());
    }
    SF_CUDA_CHECK_LAUNCH();
    k_sum_partials<float><<<cu_blocks((size_t)c * 32, CU_TPB), CU_TPB, 0, s>>>(scratch, nchunks, 0, c, NULL, out);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int chan_scale_bwd_t(sf_layout lay, const void *x, const float *scale, const void *dy, void *dx, float *ds,
                            float *dshift, int n, int c, size_t hw, float *scratch, cudaStream_t s)
{
    const size_t len = (size_t)n * c * hw;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (len == 0) {
        SF_CUDA_CHECK(cudaMemsetAsync(ds, 0, sizeof(float) * (size_t)c, s));
        if (dshift)
            SF_CUDA_CHECK(cudaMemsetAsync(dshift, 0, sizeof(float) * (size_t)c, s));
        return 0;
    }
    if (chan_sum<T, true>(nhwc, (const T *)x, (const T *)dy, ds, n, c, hw, scratch, s))
        return -1;
    /* the same scratch, after the scale's pass 2 on this stream */
    if (dshift && chan_sum<T, false>(nhwc, (const T *)x, (const T *)dy, dshift, n, c, hw, scratch, s))
        return -1;
    if (dx) {
        chan_scale_launch<T>((const T *)dy, scale, NULL, (T *)dx, len, c, hw, nhwc, s);
        SF_CUDA_CHECK_LAUNCH();
    }
    return 0;
}

extern "C" int sf_cuda_channel_scale_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, const float *scale,
                                            const float *shift, void *y, int n, int c, size_t hw, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_channel_scale_fwd_dt", dt))
        return -1;
    return dt == SF_DT_BF16 ? chan_scale_fwd_t<cu_bf16>(lay, x, scale, shift, y, n, c, hw, s)
                            : chan_scale_fwd_t<float>(lay, x, scale, shift, y, n, c, hw, s);
}

extern "C" int sf_cuda_channel_scale_bwd_dt(sf_dtype dt, sf_layout lay, const void *x, const float *scale,
                                            const void *dy, void *dx, float *dscale, float *dshift, int n, int c,
                                            size_t hw, float *scratch, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_channel_scale_bwd_dt", dt))
        return -1;
    return dt == SF_DT_BF16
               ? chan_scale_bwd_t<cu_bf16>(lay, x, scale, dy, dx, dscale, dshift, n, c, hw, scratch, s)
               : chan_scale_bwd_t<float>(lay, x, scale, dy, dx, dscale, dshift, n, c, hw, scratch, s);
}
