/* gpu/cuda/conv_thin.cu — 1x1 convolutions with few input channels as
 * memory-bound kernels (why and semantics: conv_thin.h). */
#include "gpu/cuda/conv_thin.h"

#include "gpu/cuda/check.h"
#include "gpu/cuda/kernel_common.cuh"

/* Blocks of the backward's first pass: fixed, so the partial sums (and the
 * rounding) depend on the shape alone. 1024 blocks of 256 threads leave each
 * thread a few pixels at W1's 2M pixels and keep every SM busy. */
#define THIN_BWD_BLOCKS 1024

/* Blocks of the narrow backward's first pass (a constant, as above). */
#define NARROW_BWD_BLOCKS 528
#define NARROW_MAX 16 /* most input and output channels of the narrow kernels */
#define NARROW_PX 256 /* pixels per chunk of the narrow backward: one per thread */

/* The register kernels: few input channels, a few output channels. */
static int thin_reg_ok(int c, int oc) { return c >= 1 && c <= 4 && (oc == 8 || oc == 16 || oc == 32); }

/* The narrow kernels: up to 16 in and out, NCHW fp32 (see conv_thin.h). */
static int thin_narrow_ok(sf_layout lay, sf_dtype dt, int c, int oc)
{
    return lay == SF_LAYOUT_NCHW && dt == SF_DT_F32 && c >= 1 && c <= NARROW_MAX && oc >= 1 && oc <= NARROW_MAX;
}

extern "C" int sf_conv_thin_ok(sf_layout lay, sf_dtype dt, int c, int oc, int k, int stride, int pad)
{
    return k == 1 && stride == 1 && pad == 0 && (dt == SF_DT_F32 || dt == SF_DT_BF16) &&
           (thin_reg_ok(c, oc) || thin_narrow_ok(lay, dt, c, oc));
}

extern "C" size_t sf_conv_thin_scratch_floats(int c, int oc)
{
    const size_t reg = (size_t)THIN_BWD_BLOCKS * (size_t)oc * (size_t)(c + 1);
    const size_t narrow = (size_t)NARROW_BWD_BLOCKS * (size_t)oc * (size_t)(c + 1);
    return reg > narrow ? reg : narrow;
}

/* Pixel p's element j of a [p, J] (NHWC) or [n, J, hw] (NCHW) tensor. */
template <bool NHWC, int J> __device__ __forceinline__ size_t thin_at(size_t p, int j, size_t hw)
{
    if constexpr (NHWC) {
        return p * J + j;
    } else {
        const size_t n = p / hw;
        return (n * J + j) * hw + (p - n * hw);
    }
}

/* The K values of pixel p of a [.., K] tensor as floats. */
template <typename T, bool NHWC, int K> __device__ __forceinline__ void thin_ld_row(const T *t, size_t p, size_t hw,
                                                                                  float *f)
{
    if constexpr (NHWC) {
        constexpr int V = 16 / sizeof(T);
#pragma unroll
        for (int v = 0; v < K; v += V)
            cu_ld<T, V>(t + p * K + v, f + v);
    } else {
#pragma unroll
        for (int k = 0; k < K; k++)
            f[k] = cu_f(t[thin_at<false, K>(p, k, hw)]);
    }
}

template <typename T, int C, int K, bool NHWC>
__global__ void __launch_bounds__(CU_TPB) k_thin_fwd(const T *__restrict__ x, const T *__restrict__ w,
                                                     const float *__restrict__ b, T *__restrict__ y, size_t P,
                                                     size_t hw, int relu)
{
    __shared__ float sw[K * C], sb[K];
    for (int j = threadIdx.x; j < K * C; j += blockDim.x)
        sw[j] = cu_f(w[j]);
    for (int j = threadIdx.x; j < K; j += blockDim.x)
        sb[j] = b ? b[j] : 0.f;
    __syncthreads();
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < P; p += (size_t)gridDim.x * blockDim.x) {
        float xv[C];
#pragma unroll
        for (int c = 0; c < C; c++)
            xv[c] = cu_f(x[thin_at<NHWC, C>(p, c, hw)]);
        float o[K];
#pragma unroll
        for (int k = 0; k < K; k++) {
            float a = sb[k];
#pragma unroll
            for (int c = 0; c < C; c++)
                a = fmaf(sw[k * C + c], xv[c], a);
            o[k] = relu && a < 0.f ? 0.f : a;
        }
        if constexpr (NHWC) {
            constexpr int V = 16 / sizeof(T);
#pragma unroll
            for (int v = 0; v < K; v += V)
                cu_st<T, V>(y + p * K + v, o + v);
        } else {
#pragma unroll
            for (int k = 0; k < K; k++)
                y[thin_at<false, K>(p, k, hw)] = cu_to<T>(o[k]);
        }
    }
}

/* First pass of the backward: each block sums its pixels' dw and db terms into
 * part[block][oc*c + oc] and writes dx for its pixels. */
template <typename T, int C, int K, bool NHWC>
__global__ void __launch_bounds__(CU_TPB) k_thin_bwd(const T *__restrict__ x, const T *__restrict__ w,
                                                     const T *__restrict__ y, const T *__restrict__ dy,
                                                     T *__restrict__ dx, float *__restrict__ part, size_t P,
                                                     size_t hw)
{
    constexpr int NJ = K * C + K;
    __shared__ float sw[K * C];
    __shared__ float red[CU_TPB / 32][NJ];
    for (int j = threadIdx.x; j < K * C; j += blockDim.x)
        sw[j] = cu_f(w[j]);
    __syncthreads();
    float aw[K * C], ab[K];
#pragma unroll
    for (int j = 0; j < K * C; j++)
        aw[j] = 0.f;
#pragma unroll
    for (int k = 0; k < K; k++)
        ab[k] = 0.f;
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < P; p += (size_t)gridDim.x * blockDim.x) {
        float xv[C], d[K];
#pragma unroll
        for (int c = 0; c < C; c++)
            xv[c] = cu_f(x[thin_at<NHWC, C>(p, c, hw)]);
        thin_ld_row<T, NHWC, K>(dy, p, hw, d);
        if (y) {
            float yv[K];
            thin_ld_row<T, NHWC, K>(y, p, hw, yv);
#pragma unroll
            for (int k = 0; k < K; k++)
                d[k] = yv[k] > 0.f ? d[k] : 0.f;
        }
#pragma unroll
        for (int k = 0; k < K; k++) {
            ab[k] += d[k];
#pragma unroll
            for (int c = 0; c < C; c++)
                aw[k * C + c] = fmaf(d[k], xv[c], aw[k * C + c]);
        }
        if (dx) {
#pragma unroll
            for (int c = 0; c < C; c++) {
                float a = 0.f;
#pragma unroll
                for (int k = 0; k < K; k++)
                    a = fmaf(sw[k * C + c], d[k], a);
                dx[thin_at<NHWC, C>(p, c, hw)] = cu_to<T>(a);
            }
        }
    }
    /* the block's sums: within each warp by shuffles, then across warps */
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        float v = j < K * C ? aw[j] : ab[j - K * C];
#pragma unroll
        for (int o = 16; o; o >>= 1)
            v += __shfl_down_sync(0xffffffffu, v, o);
        if (lane == 0)
            red[wid][j] = v;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < NJ; j += blockDim.x) {
        float v = 0.f;
        for (int k = 0; k < (int)(blockDim.x >> 5); k++)
            v += red[k][j];
        part[(size_t)blockIdx.x * NJ + j] = v;
    }
}

/* ---- the narrow kernels: NCHW fp32, up to 16 in and out channels ----------
 * Forward: a thread per pixel, as k_thin_fwd with run-time channel counts.
 * Backward: a block takes chunks of NARROW_PX consecutive pixels; each thread
 * loads its pixel's dy (masked) and x into registers and shared memory,
 * writes its dx from registers, and adds its dy to its bias sums; then thread
 * j < oc * c adds pixel sums of dy[o] x[c] for weight (o, c) = (j / c, j % c)
 * from shared memory (float4 rows) into one register kept across chunks.
 * Holding all oc * c weight sums per thread, as k_thin_bwd does, would take
 * up to 256 registers. */

__global__ void __launch_bounds__(CU_TPB) k_narrow_fwd(const float *__restrict__ x, const float *__restrict__ w,
                                                       const float *__restrict__ b, float *__restrict__ y, size_t P,
                                                       size_t hw, int C, int K, int relu)
{
    __shared__ float sw[NARROW_MAX * NARROW_MAX], sb[NARROW_MAX];
    for (int j = threadIdx.x; j < K * C; j += blockDim.x)
        sw[j] = w[j];
    for (int j = threadIdx.x; j < K; j += blockDim.x)
        sb[j] = b ? b[j] : 0.f;
    __syncthreads();
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < P; p += (size_t)gridDim.x * blockDim.x) {
        const size_t n = p / hw, q = p - n * hw;
        const float *xp = x + n * C * hw + q;
        float *yp = y + n * K * hw + q;
        float xv[NARROW_MAX];
#pragma unroll
        for (int c = 0; c < NARROW_MAX; c++)
            xv[c] = c < C ? xp[c * hw] : 0.f;
#pragma unroll
        for (int o = 0; o < NARROW_MAX; o++) {
            if (o >= K)
                break;
            float a = sb[o];
#pragma unroll
            for (int c = 0; c < NARROW_MAX; c++)
                if (c < C)
                    a = fmaf(sw[o * C + c], xv[c], a);
            yp[o * hw] = relu && a < 0.f ? 0.f : a;
        }
    }
}

__global__ void __launch_bounds__(NARROW_PX)
    k_narrow_bwd(const float *__restrict__ x, const float *__restrict__ w, const float *__restrict__ y,
                 const float *__restrict__ dy, float *__restrict__ dx, float *__restrict__ part, size_t P, size_t hw,
                 int C, int K)
{
    constexpr int RS = NARROW_PX + 4; /* row stride: 16-byte rows */
    __shared__ __align__(16) float sx[NARROW_MAX * RS];
    __shared__ __align__(16) float sd[NARROW_MAX * RS];
    __shared__ float sw[NARROW_MAX * NARROW_MAX];
    __shared__ float red[NARROW_PX / 32][NARROW_MAX];
    const int t = threadIdx.x, NW = K * C;
    for (int j = t; j < NW; j += blockDim.x)
        sw[j] = w[j];
    const int wo = t < NW ? t / C : 0, wc = t < NW ? t - wo * C : 0;
    float aw = 0.f, ab[NARROW_MAX];
#pragma unroll
    for (int o = 0; o < NARROW_MAX; o++)
        ab[o] = 0.f;
    const size_t nch = (P + NARROW_PX - 1) / NARROW_PX;
    for (size_t ch = blockIdx.x; ch < nch; ch += gridDim.x) {
        __syncthreads(); /* the previous chunk's readers (and sw's writers) are done */
        const size_t p = ch * NARROW_PX + t;
        const bool in = p < P;
        const size_t n = in ? p / hw : 0, q = in ? p - n * hw : 0;
        float d[NARROW_MAX], xv[NARROW_MAX];
#pragma unroll
        for (int o = 0; o < NARROW_MAX; o++) {
            float v = 0.f;
            if (o < K && in) {
                const size_t at = (n * K + o) * hw + q;
                v = dy[at];
                if (y && !(y[at] > 0.f))
                    v = 0.f;
            }
            d[o] = v;
            ab[o] += v;
            if (o < K)
                sd[o * RS + t] = v;
        }
#pragma unroll
        for (int c = 0; c < NARROW_MAX; c++) {
            xv[c] = c < C && in ? x[(n * C + c) * hw + q] : 0.f;
            if (c < C)
                sx[c * RS + t] = xv[c];
        }
        __syncthreads();
        if (dx && in) {
#pragma unroll
            for (int c = 0; c < NARROW_MAX; c++) {
                if (c >= C)
                    break;
                float a = 0.f;
#pragma unroll
                for (int o = 0; o < NARROW_MAX; o++)
                    if (o < K)
                        a = fmaf(sw[o * C + c], d[o], a);
                dx[(n * C + c) * hw + q] = a;
            }
        }
        if (t < NW) {
            const float4 *xr = reinterpret_cast<const float4 *>(sx + wc * RS);
            const float4 *dr = reinterpret_cast<const float4 *>(sd + wo * RS);
#pragma unroll 8
            for (int i = 0; i < NARROW_PX / 4; i++) {
                const float4 a = xr[i], e = dr[i];
                aw = fmaf(e.x, a.x, aw);
                aw = fmaf(e.y, a.y, aw);
                aw = fmaf(e.z, a.z, aw);
                aw = fmaf(e.w, a.w, aw);
            }
        }
    }
    /* the block's sums: weights as they are, biases within each warp by
     * shuffles, then across warps */
    float *out = part + (size_t)blockIdx.x * (NW + K);
    if (t < NW)
        out[t] = aw;
    const int lane = t & 31, wid = t >> 5;
#pragma unroll
    for (int o = 0; o < NARROW_MAX; o++) {
        float v = ab[o];
#pragma unroll
        for (int k = 16; k; k >>= 1)
            v += __shfl_down_sync(0xffffffffu, v, k);
        if (lane == 0)
            red[wid][o] = v;
    }
    __syncthreads();
    if (t < K) {
        float v = 0.f;
        for (int k = 0; k < NARROW_PX / 32; k++)
            v += red[k][t];
        out[NW + t] = v;
    }
}

static int narrow_fwd(const void *x, const void *w, const float *b, void *y, size_t P, size_t hw, int c, int oc,
                      int relu, cudaStream_t s)
{
    k_narrow_fwd<<<cu_ew_blocks(P), CU_TPB, 0, s>>>((const float *)x, (const float *)w, b, (float *)y, P, hw, c, oc,
                                                    relu);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

static int narrow_bwd(const void *x, const void *w, const void *y, const void *dy, void *dx, void *dw, float *db,
                      size_t P, size_t hw, int c, int oc, float *part, cudaStream_t s)
{
    const size_t want = cu_cdiv(P, NARROW_PX);
    const int nblk = (int)(want < NARROW_BWD_BLOCKS ? want : NARROW_BWD_BLOCKS), nj = oc * c + oc;
    k_narrow_bwd<<<nblk, NARROW_PX, 0, s>>>((const float *)x, (const float *)w, (const float *)y, (const float *)dy,
                                            (float *)dx, part, P, hw, c, oc);
    SF_CUDA_CHECK_LAUNCH();
    k_sum_partials<float><<<cu_blocks((size_t)nj * 32, CU_TPB), CU_TPB, 0, s>>>(part, nblk, oc * c, nj, (float *)dw,
                                                                               db);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T, int C, int K, bool NHWC>
static int thin_fwd(const void *x, const void *w, const float *b, void *y, size_t P, size_t hw, int relu,
                    cudaStream_t s)
{
    k_thin_fwd<T, C, K, NHWC><<<cu_ew_blocks(P), CU_TPB, 0, s>>>((const T *)x, (const T *)w, b, (T *)y, P, hw, relu);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T, int C, int K, bool NHWC>
static int thin_bwd(const void *x, const void *w, const void *y, const void *dy, void *dx, void *dw, float *db,
                    size_t P, size_t hw, float *part, cudaStream_t s)
{
    const size_t want = cu_cdiv(P, CU_TPB);
    const int nblk = (int)(want < THIN_BWD_BLOCKS ? want : THIN_BWD_BLOCKS);
    constexpr int NJ = K * C + K;
    k_thin_bwd<T, C, K, NHWC><<<nblk, CU_TPB, 0, s>>>((const T *)x, (const T *)w, (const T *)y, (const T *)dy,
                                                      (T *)dx, part, P, hw);
    SF_CUDA_CHECK_LAUNCH();
    k_sum_partials<T><<<cu_blocks((size_t)NJ * 32, CU_TPB), CU_TPB, 0, s>>>(part, nblk, K * C, NJ, (T *)dw, db);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* One table of instantiations: (dtype, c, oc, layout) -> the launchers. */
typedef int (*thin_fwd_fn)(const void *, const void *, const float *, void *, size_t, size_t, int, cudaStream_t);
typedef int (*thin_bwd_fn)(const void *, const void *, const void *, const void *, void *, void *, float *, size_t,
                           size_t, float *, cudaStream_t);

template <typename T, int C, int K> static void thin_pick(int nhwc, thin_fwd_fn *f, thin_bwd_fn *b)
{
    *f = nhwc ? thin_fwd<T, C, K, true> : thin_fwd<T, C, K, false>;
    *b = nhwc ? thin_bwd<T, C, K, true> : thin_bwd<T, C, K, false>;
}

template <typename T, int C> static void thin_pick_k(int oc, int nhwc, thin_fwd_fn *f, thin_bwd_fn *b)
{
    if (oc == 8)
        thin_pick<T, C, 8>(nhwc, f, b);
    else if (oc == 16)
        thin_pick<T, C, 16>(nhwc, f, b);
    else
        thin_pick<T, C, 32>(nhwc, f, b);
}

template <typename T> static void thin_pick_c(int c, int oc, int nhwc, thin_fwd_fn *f, thin_bwd_fn *b)
{
    switch (c) {
    case 1: thin_pick_k<T, 1>(oc, nhwc, f, b); break;
    case 2: thin_pick_k<T, 2>(oc, nhwc, f, b); break;
    case 3: thin_pick_k<T, 3>(oc, nhwc, f, b); break;
    default: thin_pick_k<T, 4>(oc, nhwc, f, b); break;
    }
}

static int thin_find(const char *fn, sf_dtype dt, sf_layout lay, int c, int oc, thin_fwd_fn *f, thin_bwd_fn *b)
{
    if (!thin_reg_ok(c, oc) || (dt != SF_DT_F32 && dt != SF_DT_BF16)) {
        sf_cuda_set_error("%s:%d: %s: no kernel for %d -> %d channels (dtype %d)", __FILE__, __LINE__, fn, c, oc,
                          (int)dt);
        return -1;
    }
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (dt == SF_DT_BF16)
        thin_pick_c<cu_bf16>(c, oc, nhwc, f, b);
    else
        thin_pick_c<float>(c, oc, nhwc, f, b);
    return 0;
}

extern "C" int sf_conv_thin_fwd(sf_dtype dt, sf_layout lay, const void *x, const void *w, const float *b, void *y,
                                int n, int c, size_t hw, int oc, int relu, cudaStream_t s)
{
    if (!thin_reg_ok(c, oc) && thin_narrow_ok(lay, dt, c, oc))
        return n < 1 || hw == 0 ? 0 : narrow_fwd(x, w, b, y, (size_t)n * hw, hw, c, oc, relu, s);
    thin_fwd_fn f;
    thin_bwd_fn bw;
    if (thin_find("sf_conv_thin_fwd", dt, lay, c, oc, &f, &bw))
        return -1;
    if (n < 1 || hw == 0)
        return 0;
    if (lay == SF_LAYOUT_NHWC && !cu_al16(y)) {
        sf_cuda_set_error("%s:%d: sf_conv_thin_fwd: y must be 16-byte aligned", __FILE__, __LINE__);
        return -1;
    }
    return f(x, w, b, y, (size_t)n * hw, hw, relu, s);
}

extern "C" int sf_conv_thin_bwd(sf_dtype dt, sf_layout lay, const void *x, const void *w, const void *y,
                                const void *dy, void *dx, void *dw, float *db, int n, int c, size_t hw, int oc,
                                float *scratch, cudaStream_t s)
{
    const int narrow = !thin_reg_ok(c, oc) && thin_narrow_ok(lay, dt, c, oc);
    thin_fwd_fn f;
    thin_bwd_fn bw;
    if (!narrow && thin_find("sf_conv_thin_bwd", dt, lay, c, oc, &f, &bw))
        return -1;
    if (lay == SF_LAYOUT_NHWC && (!cu_al16(dy) || (y && !cu_al16(y)))) {
        sf_cuda_set_error("%s:%d: sf_conv_thin_bwd: dy and y must be 16-byte aligned", __FILE__, __LINE__);
        return -1;
    }
    if (n < 1 || hw == 0) {
        /* no pixels: the gradients are zero */
        SF_CUDA_CHECK(cudaMemsetAsync(dw, 0, (size_t)oc * c * sf_dtype_size(dt), s));
        if (db)
            SF_CUDA_CHECK(cudaMemsetAsync(db, 0, sizeof(float) * oc, s));
        return 0;
    }
    if (narrow)
        return narrow_bwd(x, w, y, dy, dx, dw, db, (size_t)n * hw, hw, c, oc, scratch, s);
    return bw(x, w, y, dy, dx, dw, db, (size_t)n * hw, hw, scratch, s);
}
