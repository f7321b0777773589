/* gpu/cuda/attention.cu — kernels first, then the launchers: the
 * materialised attention core. Contract in attention.h. */
#include "gpu/cuda/attention.h"

#include <math.h>

#include "gpu/cuda/kernel_common.cuh"
#include "gpu/cuda/linear.h"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

#define ATT_TPB 128

/* The sum (or maximum) of v over the block, in a fixed order, returned to
 * every thread. red: ATT_TPB / 32 floats of shared memory. */
__device__ __forceinline__ float att_block_reduce(float v, float *red, int max)
{
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_down_sync(0xffffffffu, v, o);
        v = max ? fmaxf(v, u) : v + u;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* red may still be read from the previous call */
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    float r = red[0];
    for (int k = 1; k < ATT_TPB / 32; k++)
        r = max ? fmaxf(r, red[k]) : r + red[k];
    return r;
}

/* p[row] = softmax(s[row]) over t columns; one block per row. s already
 * holds the scaled scores. */
template <typename T>
__global__ void __launch_bounds__(ATT_TPB) k_softmax_rows(const float *__restrict__ s, T *__restrict__ p, int t)
{
    __shared__ float red[ATT_TPB / 32];
    const float *sr = s + (size_t)blockIdx.x * t;
    T *pr = p + (size_t)blockIdx.x * t;
    float mx = -INFINITY;
    for (int u = threadIdx.x; u < t; u += ATT_TPB)
        mx = fmaxf(mx, sr[u]);
    mx = att_block_reduce(mx, red, 1);
    float sum = 0.f;
    for (int u = threadIdx.x; u < t; u += ATT_TPB)
        sum += expf(sr[u] - mx);
    sum = att_block_reduce(sum, red, 0);
    const float inv = 1.f / sum;
    for (int u = threadIdx.x; u < t; u += ATT_TPB)
        pr[u] = cu_to<T>(expf(sr[u] - mx) * inv);
}

/* In place per row: p = p * (dp - sum(p * dp)) * scale, the scores' gradient
 * (with the forward's scale folded in); one block per row. */
template <typename T>
__global__ void __launch_bounds__(ATT_TPB) k_softmax_bwd_rows(T *__restrict__ p, const float *__restrict__ dp, int t,
                                                              float scale)
{
    __shared__ float red[ATT_TPB / 32];
    T *pr = p + (size_t)blockIdx.x * t;
    const float *dr = dp + (size_t)blockIdx.x * t;
    float acc = 0.f;
    for (int u = threadIdx.x; u < t; u += ATT_TPB)
        acc += cu_f(pr[u]) * dr[u];
    acc = att_block_reduce(acc, red, 0);
    for (int u = threadIdx.x; u < t; u += ATT_TPB)
        pr[u] = cu_to<T>(cu_f(pr[u]) * (dr[u] - acc) * scale);
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

extern "C" size_t sf_attn_p_elems(int n, int t, int heads) { return (size_t)n * heads * t * t; }

/* One strided-batched GEMM over the samples (column-major, as cuBLAS sees
 * the row-major tensors), C = alpha op(A) op(B), both operands of type ab;
 * bf16 operands in linear.h's strict math mode. */
static cublasStatus_t att_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                               float alpha, const void *A, int lda, long long sa, const void *B, int ldb, long long sb,
                               void *C, cudaDataType_t ctype, int ldc, long long sc, int batch, cudaDataType_t ab,
                               cublasComputeType_t ct)
{
    return sf_cublas_gemm_sb(h, ta, tb, m, n, k, alpha, A, ab, lda, sa, B, ab, ldb, sb, 0.f, C, ctype, ldc, sc, batch,
                             ct);
}

static int att_shape_ok(const char *fn, int n, int t, int c, int heads)
{
    if (n < 0 || t < 1 || heads < 1 || c < heads || c % heads) {
        sf_cuda_set_error("%s:%d: %s: n %d, t %d, c %d, heads %d", __FILE__, __LINE__, fn, n, t, c, heads);
        return 0;
    }
    if ((size_t)n * heads * t > 0x7fffffffu) {
        sf_cuda_set_error("%s:%d: %s: %d x %d rows of %d is too many", __FILE__, __LINE__, fn, n, heads, t);
        return 0;
    }
    return 1;
}

/* A row-major tensor X [rows, cols] with leading dimension ld is, to cuBLAS,
 * the column-major X^T [cols, rows]. Per head j, with ld3 = 3c:
 *   S^T [t(u), t(i)] = K Q^T:      op(K)=T [d,t]^T,  op(Q)=N,   C = s (ld t)
 *   O^T [d, t]       = V^T P^T:    op(V)=N,          op(P)=N
 *   dV^T [d, t]      = dO^T P:     op(dO)=N,         op(P)=T
 *   dP^T [t, t]      = V dO^T:     op(V)=T,          op(dO)=N
 *   dQ^T [d, t]      = K^T dS^T:   op(K)=N,          op(dS)=N
 *   dK^T [d, t]      = Q^T dS:     op(Q)=N,          op(dS)=T
 * each strided over the samples (t*3c apart in qkv, t*c in o, heads*t*t in
 * p and s). */
extern "C" int sf_attn_core_fwd(cublasHandle_t h, sf_dtype dt, const void *qkv, int n, int t, int c, int heads,
                                float *s, void *p, void *o, int tf32, cudaStream_t st)
{
    cudaDataType_t ab;
    cublasComputeType_t ct;
    if (sf_cublas_types(dt, tf32, "sf_attn_core_fwd", &ab, &ct) || !att_shape_ok("sf_attn_core_fwd", n, t, c, heads))
        return -1;
    if (n == 0)
        return 0;
    const size_t es = sf_dtype_size(dt);
    const int d = c / heads, ld3 = 3 * c;
    const long long sq = (long long)t * ld3, sp = (long long)heads * t * t, so = (long long)t * c;
    const float scale = 1.f / sqrtf((float)d);
    for (int j = 0; j < heads; j++) {
        const char *q = (const char *)qkv + es * (size_t)j * d, *k = q + es * c;
        SF_CUBLAS_CHECK(att_gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, t, t, d, scale, k, ld3, sq, q, ld3, sq,
                                 s + (size_t)j * t * t, CUDA_R_32F, t, sp, n, ab, ct));
    }
    const unsigned rows = (unsigned)((size_t)n * heads * t);
    if (dt == SF_DT_BF16)
        k_softmax_rows<cu_bf16><<<rows, ATT_TPB, 0, st>>>(s, (cu_bf16 *)p, t);
    else
        k_softmax_rows<float><<<rows, ATT_TPB, 0, st>>>(s, (float *)p, t);
    SF_CUDA_CHECK_LAUNCH();
    for (int j = 0; j < heads; j++) {
        const char *v = (const char *)qkv + es * ((size_t)j * d + 2 * (size_t)c);
        SF_CUBLAS_CHECK(att_gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, d, t, t, 1.f, v, ld3, sq,
                                 (const char *)p + es * (size_t)j * t * t, t, sp, (char *)o + es * (size_t)j * d, ab, c,
                                 so, n, ab, ct));
    }
    return 0;
}

extern "C" int sf_attn_core_bwd(cublasHandle_t h, sf_dtype dt, const void *qkv, void *p, const void *d_o, int n, int t,
                                int c, int heads, float *s, void *dqkv, int tf32, cudaStream_t st)
{
    cudaDataType_t ab;
    cublasComputeType_t ct;
    if (sf_cublas_types(dt, tf32, "sf_attn_core_bwd", &ab, &ct) || !att_shape_ok("sf_attn_core_bwd", n, t, c, heads))
        return -1;
    if (n == 0)
        return 0;
    const size_t es = sf_dtype_size(dt);
    const int d = c / heads, ld3 = 3 * c;
    const long long sq = (long long)t * ld3, sp = (long long)heads * t * t, so = (long long)t * c;
    const float scale = 1.f / sqrtf((float)d);
    /* dV = P^T dO and dP = dO V^T while P still holds the weights */
    for (int j = 0; j < heads; j++) {
        const size_t qo = (size_t)j * d;
        const char *v = (const char *)qkv + es * (qo + 2 * (size_t)c), *go = (const char *)d_o + es * qo;
        const char *pj = (const char *)p + es * (size_t)j * t * t;
        SF_CUBLAS_CHECK(att_gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, d, t, t, 1.f, go, c, so, pj, t, sp,
                                 (char *)dqkv + es * (qo + 2 * (size_t)c), ab, ld3, sq, n, ab, ct));
        SF_CUBLAS_CHECK(att_gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, t, t, d, 1.f, v, ld3, sq, go, c, so,
                                 s + (size_t)j * t * t, CUDA_R_32F, t, sp, n, ab, ct));
    }
    const unsigned rows = (unsigned)((size_t)n * heads * t);
    if (dt == SF_DT_BF16)
        k_softmax_bwd_rows<cu_bf16><<<rows, ATT_TPB, 0, st>>>((cu_bf16 *)p, s, t, scale);
    else
        k_softmax_bwd_rows<float><<<rows, ATT_TPB, 0, st>>>((float *)p, s, t, scale);
    SF_CUDA_CHECK_LAUNCH();
    /* dQ = dS K, dK = dS^T Q (the scale is in dS) */
    for (int j = 0; j < heads; j++) {
        const size_t qo = (size_t)j * d;
        const char *q = (const char *)qkv + es * qo, *k = q + es * c;
        const char *pj = (const char *)p + es * (size_t)j * t * t;
        SF_CUBLAS_CHECK(att_gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, d, t, t, 1.f, k, ld3, sq, pj, t, sp,
                                 (char *)dqkv + es * qo, ab, ld3, sq, n, ab, ct));
        SF_CUBLAS_CHECK(att_gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, d, t, t, 1.f, q, ld3, sq, pj, t, sp,
                                 (char *)dqkv + es * (qo + (size_t)c), ab, ld3, sq, n, ab, ct));
    }
    return 0;
}
