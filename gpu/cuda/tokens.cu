/* gpu/cuda/tokens.cu — kernels first, then the launchers: the token-sequence
 * layers of a Vision Transformer. Contract in tokens.h. */
#include "gpu/cuda/tokens.h"

#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

#define TR_TILE 32
#define TR_ROWS 8

/* dst[b][j][i] = src[b][i][j] for each [rows, cols] matrix b, through a
 * shared tile (padded against bank conflicts) so both sides are coalesced.
 * Grid: (cols tiles, rows tiles, batch). */
template <typename T>
__global__ void k_transpose(const T *__restrict__ src, T *__restrict__ dst, int rows, int cols)
{
    __shared__ T tile[TR_TILE][TR_TILE + 1];
    const size_t per = (size_t)rows * cols;
    const T *sb = src + blockIdx.z * per;
    T *db = dst + blockIdx.z * per;
    const int c0 = blockIdx.x * TR_TILE, r0 = blockIdx.y * TR_TILE;
    for (int k = threadIdx.y; k < TR_TILE; k += TR_ROWS) {
        const int r = r0 + k, c = c0 + threadIdx.x;
        if (r < rows && c < cols)
            tile[k][threadIdx.x] = sb[(size_t)r * cols + c];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < TR_TILE; k += TR_ROWS) {
        const int c = c0 + k, r = r0 + threadIdx.x;
        if (r < rows && c < cols)
            db[(size_t)c * rows + r] = tile[threadIdx.x][k];
    }
}

/* The copies and the broadcast add below move V elements a thread: V = 16 /
 * sizeof(T) where every row of c channels is whole 16-byte vectors and the
 * pointers are 16-byte aligned, else V = 1. Their index arithmetic is per
 * vector: one 64-bit division per element had held them to about 1 TB/s
 * (ViT-B/16 in bf16 at batch 256 on an H200: 0.14 ms to prepend the class
 * token to 77 MB of tokens). */
template <int V> __device__ __forceinline__ void tok_ldf(const float *__restrict__ p, float *f)
{
    if constexpr (V == 1)
        f[0] = *p;
    else
        cu_ldf<V>(p, f);
}

/* y [n, t+1, c] from cls and x [n, t, c]. */
template <typename T, int V>
__global__ void k_prepend_fwd(const T *__restrict__ x, const float *__restrict__ cls, T *__restrict__ y, int n,
                              int t, int c)
{
    const size_t cv = (size_t)(c / V), per = (size_t)(t + 1) * cv, len = (size_t)n * per;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        const size_t ni = e / per, r = e % per;
        float f[V];
        if (r < cv)
            tok_ldf<V>(cls + r * V, f);
        else
            cu_ld<T, V>(x + (ni * (size_t)t * cv + (r - cv)) * V, f);
        cu_st<T, V>(y + e * V, f);
    }
}

/* dx [n, t, c] from tokens 1.. of dy [n, t+1, c]. */
template <typename T, int V>
__global__ void k_prepend_bwd_dx(const T *__restrict__ dy, T *__restrict__ dx, int n, int t, int c)
{
    const size_t cv = (size_t)(c / V), per = (size_t)t * cv, len = (size_t)n * per;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        const size_t ni = e / per, r = e % per;
        float f[V];
        cu_ld<T, V>(dy + (ni * (per + cv) + cv + r) * V, f);
        cu_st<T, V>(dx + e * V, f);
    }
}

/* dp[e] = sum over ni < n, in that order, of v[ni * stride + e], e < len:
 * one thread per element, so the order is fixed by the shape alone. */
template <typename T>
__global__ void k_sum_samples(const T *__restrict__ v, int n, size_t stride, size_t len, float *__restrict__ dp)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        float acc = 0.f;
        for (int ni = 0; ni < n; ni++)
            acc += cu_f(v[(size_t)ni * stride + e]);
        dp[e] = acc;
    }
}

/* y = x + p over n samples of len elements (len % V == 0), p fp32 [len]. */
template <typename T, int V>
__global__ void k_add_bcast(const T *__restrict__ x, const float *__restrict__ p, T *__restrict__ y, int n,
                            size_t len)
{
    const size_t lv = len / V, tot = (size_t)n * lv, step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < tot; e += step) {
        float f[V], q[V];
        cu_ld<T, V>(x + e * V, f);
        tok_ldf<V>(p + (e % lv) * V, q);
#pragma unroll
        for (int j = 0; j < V; j++)
            f[j] += q[j];
        cu_st<T, V>(y + e * V, f);
    }
}

template <typename T>
__global__ void k_select_fwd(const T *__restrict__ x, T *__restrict__ y, int n, int t, int c)
{
    const size_t len = (size_t)n * c, step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step)
        y[e] = x[(e / c) * (size_t)t * c + e % c];
}

/* dx [n, t, c]: token 0 from dy [n, c], the others zero. */
template <typename T, int V>
__global__ void k_select_bwd(const T *__restrict__ dy, T *__restrict__ dx, int n, int t, int c)
{
    const size_t cv = (size_t)(c / V), per = (size_t)t * cv, len = (size_t)n * per;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        const size_t ni = e / per, r = e % per;
        float f[V];
        if (r < cv) {
            cu_ld<T, V>(dy + (ni * cv + r) * V, f);
        } else {
#pragma unroll
            for (int j = 0; j < V; j++)
                f[j] = 0.f;
        }
        cu_st<T, V>(dx + e * V, f);
    }
}

/* y[n][c] = the mean of x[n][start..t-1][c]: a thread per (sample, channel)
 * walks the tokens, consecutive threads reading consecutive channels of a
 * token; the sum in fp32, then one division (PyTorch's mean). */
template <typename T>
__global__ void k_token_mean_fwd(const T *__restrict__ x, T *__restrict__ y, int n, int t, int c, int start)
{
    const size_t len = (size_t)n * c, step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        const T *xs = x + (e / c) * (size_t)t * c + e % c;
        float acc = 0.f;
        for (int ti = start; ti < t; ti++)
            acc += cu_f(xs[(size_t)ti * c]);
        y[e] = cu_to<T>(acc / (float)(t - start));
    }
}

template <typename T>
__global__ void k_token_mean_bwd(const T *__restrict__ dy, T *__restrict__ dx, int n, int t, int c, int start)
{
    const size_t per = (size_t)t * c, len = (size_t)n * per, step = (size_t)gridDim.x * blockDim.x;
    const float inv = 1.f / (float)(t - start);
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        const size_t ni = e / per, r = e % per;
        dx[e] = r < (size_t)start * c ? cu_to<T>(0.f) : cu_to<T>(cu_f(dy[ni * c + r % c]) * inv);
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

template <typename T> static int transpose(const void *src, void *dst, int batch, int rows, int cols, cudaStream_t s)
{
    if ((size_t)batch * rows * cols == 0)
        return 0;
    if (batch > 65535) {
        sf_cuda_set_error("%s:%d: transpose: %d matrices (at most 65535)", __FILE__, __LINE__, batch);
        return -1;
    }
    const dim3 grid((unsigned)cu_cdiv((size_t)cols, TR_TILE), (unsigned)cu_cdiv((size_t)rows, TR_TILE),
                    (unsigned)batch),
        block(TR_TILE, TR_ROWS);
    k_transpose<T><<<grid, block, 0, s>>>((const T *)src, (T *)dst, rows, cols);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* [n, rows, cols] -> [n, cols, rows] in element type dt. */
static int transpose_dt(sf_dtype dt, const void *src, void *dst, int n, int rows, int cols, cudaStream_t s)
{
    return dt == SF_DT_BF16 ? transpose<cu_bf16>(src, dst, n, rows, cols, s)
                            : transpose<float>(src, dst, n, rows, cols, s);
}

static int tokens_move(sf_dtype dt, sf_layout lay, const void *src, int n, int c, size_t hw, void *dst, int to_tokens,
                       cudaStream_t s)
{
    if (cu_dt_bad(to_tokens ? "sf_cuda_tokens_from_map_dt" : "sf_cuda_tokens_to_map_dt", dt))
        return -1;
    if (lay == SF_LAYOUT_NHWC) {
        if (src != dst)
            SF_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * c * hw * sf_dtype_size(dt), cudaMemcpyDeviceToDevice,
                                          s));
        return 0;
    }
    return to_tokens ? transpose_dt(dt, src, dst, n, c, (int)hw, s) : transpose_dt(dt, src, dst, n, (int)hw, c, s);
}

extern "C" int sf_cuda_tokens_from_map_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, size_t hw,
                                          void *y, cudaStream_t s)
{
    return tokens_move(dt, lay, x, n, c, hw, y, 1, s);
}

extern "C" int sf_cuda_tokens_to_map_dt(sf_dtype dt, sf_layout lay, const void *dy, int n, int c, size_t hw,
                                        void *dx, cudaStream_t s)
{
    return tokens_move(dt, lay, dy, n, c, hw, dx, 0, s);
}

/* The grid of a grid-stride kernel over len elements. */
#define TOK_GRID(len) cu_ew_blocks(len), CU_TPB, 0, s

/* Launches KERN<T, V> over len elements: whole 16-byte vectors where `vec`
 * holds (the caller's shape and alignment test), else single elements. */
#define TOK_LAUNCH(KERN, T, vec, len, ...)                                                                             \
    do {                                                                                                               \
        constexpr int V_ = 16 / (int)sizeof(T);                                                                        \
        if (vec)                                                                                                       \
            KERN<T, V_><<<TOK_GRID((len) / V_)>>>(__VA_ARGS__);                                                        \
        else                                                                                                           \
            KERN<T, 1><<<TOK_GRID(len)>>>(__VA_ARGS__);                                                                \
    } while (0)

/* Rows of c channels are whole 16-byte vectors of dt and every pointer is 16-byte aligned. */
static int tok_vec(sf_dtype dt, size_t c, const void *a, const void *b, const void *p = NULL)
{
    return c % (16 / sf_dtype_size(dt)) == 0 && cu_al16(a) && cu_al16(b) && (!p || cu_al16(p));
}

extern "C" int sf_cuda_prepend_token_fwd_dt(sf_dtype dt, const void *x, int n, int t, int c, const float *cls,
                                            void *y, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_prepend_token_fwd_dt", dt))
        return -1;
    const size_t len = (size_t)n * (t + 1) * c;
    if (len == 0)
        return 0;
    const int vec = tok_vec(dt, (size_t)c, x, y, cls);
    if (dt == SF_DT_BF16)
        TOK_LAUNCH(k_prepend_fwd, cu_bf16, vec, len, (const cu_bf16 *)x, cls, (cu_bf16 *)y, n, t, c);
    else
        TOK_LAUNCH(k_prepend_fwd, float, vec, len, (const float *)x, cls, (float *)y, n, t, c);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_prepend_token_bwd_dt(sf_dtype dt, const void *dy, int n, int t, int c, void *dx, float *dcls,
                                            cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_prepend_token_bwd_dt", dt))
        return -1;
    const size_t len = (size_t)n * t * c;
    if (dx && len) {
        const int vec = tok_vec(dt, (size_t)c, dy, dx);
        if (dt == SF_DT_BF16)
            TOK_LAUNCH(k_prepend_bwd_dx, cu_bf16, vec, len, (const cu_bf16 *)dy, (cu_bf16 *)dx, n, t, c);
        else
            TOK_LAUNCH(k_prepend_bwd_dx, float, vec, len, (const float *)dy, (float *)dx, n, t, c);
        SF_CUDA_CHECK_LAUNCH();
    }
    if (dcls && c > 0) {
        const size_t stride = (size_t)(t + 1) * c;
        if (dt == SF_DT_BF16)
            k_sum_samples<cu_bf16><<<TOK_GRID((size_t)c)>>>((const cu_bf16 *)dy, n, stride, (size_t)c, dcls);
        else
            k_sum_samples<float><<<TOK_GRID((size_t)c)>>>((const float *)dy, n, stride, (size_t)c, dcls);
        SF_CUDA_CHECK_LAUNCH();
    }
    return 0;
}

extern "C" int sf_cuda_add_bcast_fwd_dt(sf_dtype dt, const void *x, int n, size_t len, const float *p, void *y,
                                        cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_add_bcast_fwd_dt", dt))
        return -1;
    const size_t tot = (size_t)n * len;
    if (tot == 0)
        return 0;
    const int vec = tok_vec(dt, len, x, y, p);
    if (dt == SF_DT_BF16)
        TOK_LAUNCH(k_add_bcast, cu_bf16, vec, tot, (const cu_bf16 *)x, p, (cu_bf16 *)y, n, len);
    else
        TOK_LAUNCH(k_add_bcast, float, vec, tot, (const float *)x, p, (float *)y, n, len);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_add_bcast_bwd_dt(sf_dtype dt, const void *dy, int n, size_t len, float *dp, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_add_bcast_bwd_dt", dt))
        return -1;
    if (len == 0)
        return 0;
    if (dt == SF_DT_BF16)
        k_sum_samples<cu_bf16><<<TOK_GRID(len)>>>((const cu_bf16 *)dy, n, len, len, dp);
    else
        k_sum_samples<float><<<TOK_GRID(len)>>>((const float *)dy, n, len, len, dp);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_select_token_fwd_dt(sf_dtype dt, const void *x, int n, int t, int c, void *y, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_select_token_fwd_dt", dt))
        return -1;
    const size_t len = (size_t)n * c;
    if (len == 0)
        return 0;
    if (dt == SF_DT_BF16)
        k_select_fwd<cu_bf16><<<TOK_GRID(len)>>>((const cu_bf16 *)x, (cu_bf16 *)y, n, t, c);
    else
        k_select_fwd<float><<<TOK_GRID(len)>>>((const float *)x, (float *)y, n, t, c);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_select_token_bwd_dt(sf_dtype dt, const void *dy, int n, int t, int c, void *dx, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_select_token_bwd_dt", dt))
        return -1;
    const size_t len = (size_t)n * t * c;
    if (len == 0)
        return 0;
    const int vec = tok_vec(dt, (size_t)c, dy, dx);
    if (dt == SF_DT_BF16)
        TOK_LAUNCH(k_select_bwd, cu_bf16, vec, len, (const cu_bf16 *)dy, (cu_bf16 *)dx, n, t, c);
    else
        TOK_LAUNCH(k_select_bwd, float, vec, len, (const float *)dy, (float *)dx, n, t, c);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* 1 where a token_mean launch has work, 0 where it has none, -1 (with the
 * error set) where its element type or its first token is refused. */
static int token_mean_args(const char *fn, sf_dtype dt, size_t len, int t, int start)
{
    if (cu_dt_bad(fn, dt))
        return -1;
    if (len && (start < 0 || start >= t)) {
        sf_cuda_set_error("%s:%d: token_mean from token %d of %d: none to average", __FILE__, __LINE__, start, t);
        return -1;
    }
    return len > 0;
}

extern "C" int sf_cuda_token_mean_fwd_dt(sf_dtype dt, const void *x, int n, int t, int c, int start, void *y,
                                         cudaStream_t s)
{
    const size_t len = (size_t)n * c;
    const int rc = token_mean_args("sf_cuda_token_mean_fwd_dt", dt, len, t, start);
    if (rc <= 0)
        return rc;
    if (dt == SF_DT_BF16)
        k_token_mean_fwd<cu_bf16><<<TOK_GRID(len)>>>((const cu_bf16 *)x, (cu_bf16 *)y, n, t, c, start);
    else
        k_token_mean_fwd<float><<<TOK_GRID(len)>>>((const float *)x, (float *)y, n, t, c, start);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_token_mean_bwd_dt(sf_dtype dt, const void *dy, int n, int t, int c, int start, void *dx,
                                         cudaStream_t s)
{
    const size_t len = (size_t)n * t * c;
    const int rc = token_mean_args("sf_cuda_token_mean_bwd_dt", dt, len, t, start);
    if (rc <= 0)
        return rc;
    if (dt == SF_DT_BF16)
        k_token_mean_bwd<cu_bf16><<<TOK_GRID(len)>>>((const cu_bf16 *)dy, (cu_bf16 *)dx, n, t, c, start);
    else
        k_token_mean_bwd<float><<<TOK_GRID(len)>>>((const float *)dy, (float *)dx, n, t, c, start);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}
