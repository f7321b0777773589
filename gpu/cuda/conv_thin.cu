/* gpu/cuda/conv_thin.cu — 1x1 convolutions with few input channels as
 * memory-bound kernels (why and semantics: conv_thin.h). */
#include "conv_thin.h"

#include "check.h"
#include "kernel_common.cuh"

/* Blocks of the backward's first pass: fixed, so the partial sums (and the
 * rounding) depend on the shape alone. 1024 blocks of 256 threads leave each
 * thread a few pixels at W1's 2M pixels and keep every SM busy. */
#define THIN_BWD_BLOCKS 1024

extern "C" int sf_conv_thin_ok(int c, int oc, int k, int stride, int pad)
{
    return k == 1 && stride == 1 && pad == 0 && c >= 1 && c <= 4 && (oc == 8 || oc == 16 || oc == 32);
}

extern "C" size_t sf_conv_thin_scratch_floats(int c, int oc)
{
    return (size_t)THIN_BWD_BLOCKS * (size_t)oc * (size_t)(c + 1);
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
    if (!sf_conv_thin_ok(c, oc, 1, 1, 0) || (dt != SF_DT_F32 && dt != SF_DT_BF16)) {
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
    thin_fwd_fn f;
    thin_bwd_fn bw;
    if (thin_find("sf_conv_thin_bwd", dt, lay, c, oc, &f, &bw))
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
    return bw(x, w, y, dy, dx, dw, db, (size_t)n * hw, hw, scratch, s);
}
