/* gpu/cuda/layers.cu — kernels first, then launchers, then the cuDNN graph-API
 * plans and the cuBLAS linear layers. Contracts in layers.h. */
#include "layers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../rng.h"

/* cuDNN 9.x marks the handle attributes of op graphs and plans deprecated in
 * favour of device-property descriptors, which older 9.x releases lack; the
 * handle attributes work in every 9.x. */
#pragma nv_diag_suppress 1444
#pragma nv_diag_suppress 1215
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define TPB 256

static unsigned int blocks_for(size_t work, unsigned int tpb)
{
    size_t b = (work + tpb - 1) / tpb;
    return (unsigned int)(b ? b : 1);
}

static int is_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* Softmax cross-entropy; one block of TPB threads, a warp per sample. */
__global__ void k_xent(const float *__restrict__ logits, const int32_t *__restrict__ labels, int n,
                       int k, float *__restrict__ dlog, sf_xent_out *__restrict__ out)
{
    __shared__ float s_loss[TPB / 32];
    __shared__ int s_corr[TPB / 32], s_bad[TPB / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float wloss = 0.f;
    int wcorr = 0, wbad = 0;
    for (int s = warp; s < n; s += nw) {
        const float *l = logits + (size_t)s * k;
        /* max and its first index */
        float m = -INFINITY;
        int arg = 0x7fffffff;
        for (int j = lane; j < k; j += 32) {
            float v = l[j];
            if (v > m || (v == m && j < arg)) {
                m = v;
                arg = j;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float om = __shfl_xor_sync(0xffffffffu, m, o);
            int oa = __shfl_xor_sync(0xffffffffu, arg, o);
            if (om > m || (om == m && oa < arg)) {
                m = om;
                arg = oa;
            }
        }
        if (arg == 0x7fffffff)
            arg = 0;
        float sum = 0.f;
        for (int j = lane; j < k; j += 32)
            sum += expf(l[j] - m);
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const float lse = m + logf(sum);
        const int lab = labels[s];
        const int valid = lab >= 0 && lab < k;
        if (dlog) {
            float *d = dlog + (size_t)s * k;
            for (int j = lane; j < k; j += 32) {
                const float p = expf(l[j] - lse);
                d[j] = valid ? (p - (j == lab ? 1.f : 0.f)) / (float)n : NAN;
            }
        }
        if (lane == 0) {
            wloss += valid ? lse - l[lab] : NAN;
            wcorr += valid && arg == lab;
            wbad += !valid;
        }
    }
    if (lane == 0) {
        s_loss[warp] = wloss;
        s_corr[warp] = wcorr;
        s_bad[warp] = wbad;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        int c = 0, b = 0;
        for (int w = 0; w < nw; w++) {
            t += s_loss[w];
            c += s_corr[w];
            b += s_bad[w];
        }
        out->loss = t / (float)n;
        out->correct = c;
        out->bad = b;
        out->pad_ = 0;
    }
}

__global__ void k_labels_i32(const void *__restrict__ src, int dtype, int n, int32_t *__restrict__ dst)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    int64_t v;
    if (dtype == 0)
        v = ((const uint8_t *)src)[i];
    else if (dtype == 1)
        v = ((const int32_t *)src)[i];
    else
        v = ((const int64_t *)src)[i];
    /* Out-of-range values stay out of range (the loss reports them). */
    dst[i] = (v < INT32_MIN || v > INT32_MAX) ? -1 : (int32_t)v;
}

/* One SGD element, rounding as the reference (no contraction into FMA). */
__device__ __forceinline__ void sgd_one(float &p, float &m, float g, float lr, float mom, float wd)
{
    const float gg = __fadd_rn(g, __fmul_rn(wd, p));
    if (mom != 0.f) {
        m = __fadd_rn(__fmul_rn(mom, m), gg);
        p = __fsub_rn(p, __fmul_rn(lr, m));
    } else {
        p = __fsub_rn(p, __fmul_rn(lr, gg));
    }
}

/* Device index of model index i inside segment sg (KCRS -> KRSC). */
__device__ __forceinline__ size_t perm_index(const sf_perm_seg &sg, size_t i)
{
    const unsigned r = (unsigned)(i - sg.off);
    const unsigned crs = (unsigned)sg.c * (unsigned)sg.rs;
    const unsigned o = r / crs, rem = r - o * crs;
    const unsigned ci = rem / (unsigned)sg.rs, t = rem - ci * (unsigned)sg.rs;
    return sg.off + (size_t)o * crs + (size_t)t * sg.c + ci;
}

__device__ __forceinline__ int seg_of(const sf_sgd_segs &segs, size_t i)
{
    for (int k = 0; k < segs.n; k++)
        if (i >= segs.s[k].off && i < segs.s[k].off + segs.s[k].len)
            return k;
    return -1;
}

/* Four consecutive elements per thread. p and m are read and written as
 * float4 (the buffers are 256-byte aligned and i0 is a multiple of 4). */
__global__ void k_sgd(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ m,
                      float *__restrict__ wdev, size_t len, const sf_sgd_hyper *__restrict__ hp,
                      const __grid_constant__ sf_sgd_segs segs)
{
    const size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i0 >= len)
        return;
    const float lr = hp->lr, mom = hp->momentum, wd = hp->weight_decay;
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
        /* Without momentum the buffer is neither read nor written (plain SGD
         * moves a third less memory). */
        float4 mv = mom != 0.f ? *reinterpret_cast<const float4 *>(m + i0) : make_float4(0.f, 0.f, 0.f, 0.f);
        float4 gv;
        size_t j0 = 0, j1 = 0, j2 = 0, j3 = 0;
        if (si < 0) {
            gv = *reinterpret_cast<const float4 *>(g + i0);
        } else {
            const sf_perm_seg &sg = segs.s[si];
            j0 = perm_index(sg, i0);
            j1 = perm_index(sg, i0 + 1);
            j2 = perm_index(sg, i0 + 2);
            j3 = perm_index(sg, i0 + 3);
            gv = make_float4(g[j0], g[j1], g[j2], g[j3]);
        }
        sgd_one(pv.x, mv.x, gv.x, lr, mom, wd);
        sgd_one(pv.y, mv.y, gv.y, lr, mom, wd);
        sgd_one(pv.z, mv.z, gv.z, lr, mom, wd);
        sgd_one(pv.w, mv.w, gv.w, lr, mom, wd);
        *reinterpret_cast<float4 *>(p + i0) = pv;
        if (mom != 0.f)
            *reinterpret_cast<float4 *>(m + i0) = mv;
        if (si >= 0) {
            wdev[j0] = pv.x;
            wdev[j1] = pv.y;
            wdev[j2] = pv.z;
            wdev[j3] = pv.w;
        }
        return;
    }
    /* Tail or segment boundary: one element at a time. */
    for (size_t i = i0; i < i0 + 4 && i < len; i++) {
        const int k = seg_of(segs, i);
        const size_t j = k < 0 ? i : perm_index(segs.s[k], i);
        float pv = p[i], mv = mom != 0.f ? m[i] : 0.f;
        sgd_one(pv, mv, g[j], lr, mom, wd);
        p[i] = pv;
        if (mom != 0.f)
            m[i] = mv;
        if (k >= 0)
            wdev[j] = pv;
    }
}

/* Batched transpose through a padded shared-memory tile. */
__global__ void k_transpose(const float *__restrict__ src, float *__restrict__ dst, int rows, int cols)
{
    __shared__ float tile[32][33];
    const size_t b = blockIdx.z;
    const float *s = src + b * (size_t)rows * cols;
    float *d = dst + b * (size_t)rows * cols;
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        const int r = r0 + k, c = c0 + threadIdx.x;
        if (r < rows && c < cols)
            tile[k][threadIdx.x] = s[(size_t)r * cols + c];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        const int c = c0 + k, r = r0 + threadIdx.x;
        if (r < rows && c < cols)
            d[(size_t)c * rows + r] = tile[threadIdx.x][k];
    }
}

__global__ void k_fill_random(float *__restrict__ p, size_t len, uint64_t seed, float scale)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len)
        return;
    p[i] = (sf_u01(sf_hash4(seed, i, 0x5eed, 0)) * 2.f - 1.f) * scale;
}

__global__ void k_fill(float *__restrict__ p, size_t len, float v)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len)
        p[i] = v;
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

#define BGRAD_MAX_CHUNKS 512

extern "C" size_t sf_cuda_bias_grad_scratch(int c)
{
    size_t rows = (size_t)BGRAD_MAX_CHUNKS * (size_t)c;
    size_t planes = c > 1024 ? (size_t)c : 1024 + (size_t)c;
    return rows > planes ? rows : planes;
}

extern "C" int sf_cuda_xent(const float *logits, const int32_t *labels, int n, int k, float *dlogits,
                            sf_xent_out *out, cudaStream_t s)
{
    if (n < 1 || k < 1) {
        sf_cuda_set_error("%s:%d: sf_cuda_xent: n=%d k=%d", __FILE__, __LINE__, n, k);
        return -1;
    }
    k_xent<<<1, TPB, 0, s>>>(logits, labels, n, k, dlogits, out);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_labels_i32(const void *src, int dtype, int n, int32_t *dst, cudaStream_t s)
{
    if (n <= 0)
        return 0;
    if (dtype < 0 || dtype > 2) {
        sf_cuda_set_error("%s:%d: sf_cuda_labels_i32: dtype %d", __FILE__, __LINE__, dtype);
        return -1;
    }
    k_labels_i32<<<blocks_for((size_t)n, TPB), TPB, 0, s>>>(src, dtype, n, dst);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_sgd(float *p, const float *g, float *m, float *wdev, size_t len,
                           const sf_sgd_hyper *d_hyper, const sf_sgd_segs *segs, cudaStream_t s)
{
    if (len == 0)
        return 0;
    if (!is_aligned16(p) || !is_aligned16(m) || !is_aligned16(g)) {
        sf_cuda_set_error("%s:%d: sf_cuda_sgd: buffers must be 16-byte aligned", __FILE__, __LINE__);
        return -1;
    }
    if (segs->n > 0 && !wdev) {
        sf_cuda_set_error("%s:%d: sf_cuda_sgd: permuted segments need wdev", __FILE__, __LINE__);
        return -1;
    }
    k_sgd<<<blocks_for((len + 3) / 4, TPB), TPB, 0, s>>>(p, g, m, wdev, len, d_hyper, *segs);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_transpose(const float *src, float *dst, int batch, int rows, int cols,
                                 cudaStream_t s)
{
    if (batch <= 0 || rows <= 0 || cols <= 0)
        return 0;
    for (int b0 = 0; b0 < batch; b0 += 65535) {
        const int nb = batch - b0 < 65535 ? batch - b0 : 65535;
        const size_t off = (size_t)b0 * rows * cols;
        dim3 grid((unsigned)((cols + 31) / 32), (unsigned)((rows + 31) / 32), (unsigned)nb);
        k_transpose<<<grid, dim3(32, 8), 0, s>>>(src + off, dst + off, rows, cols);
        SF_CUDA_CHECK_LAUNCH();
    }
    return 0;
}

extern "C" int sf_cuda_fill_random(float *p, size_t len, uint64_t seed, float scale, cudaStream_t s)
{
    if (len == 0)
        return 0;
    k_fill_random<<<blocks_for(len, TPB), TPB, 0, s>>>(p, len, seed, scale);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_fill(float *p, size_t len, float v, cudaStream_t s)
{
    if (len == 0)
        return 0;
    k_fill<<<blocks_for(len, TPB), TPB, 0, s>>>(p, len, v);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ======================================================================== */
/* linear layers (cuBLAS)                                                   */
/* ======================================================================== */
/* Row-major [r, c] is column-major [c, r]; each product below is written for
 * the column-major views. */

static cublasComputeType_t linear_ct(int tf32)
{
    return tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

/* Operand type and compute type of a linear layer with data type dt; -1 (error
 * set) for an unknown dt. bf16: CUDA_R_16BF operands with CUBLAS_COMPUTE_32F
 * (tensor cores, fp32 accumulation; the scalars stay float). */
static int linear_types(sf_dtype dt, int tf32, const char *fn, cudaDataType_t *ab, cublasComputeType_t *ct)
{
    if (dt == SF_DT_F32) {
        *ab = CUDA_R_32F;
        *ct = linear_ct(tf32);
        return 0;
    }
    if (dt == SF_DT_BF16) {
        *ab = CUDA_R_16BF;
        *ct = CUBLAS_COMPUTE_32F;
        return 0;
    }
    sf_cuda_set_error("%s:%d: %s: dtype %d", __FILE__, __LINE__, fn, (int)dt);
    return -1;
}

/* cublasGemmEx with the handle's math mode, plus, for bf16 operands,
 * CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION for the call: without it a
 * split-K GEMM may sum its partial products in the output type (bf16), which
 * is not "fp32 accumulation, one rounding". The mode is restored afterwards
 * (host-side handle state only: no allocation, capturable). fp32 calls leave
 * the handle alone, so they are the calls the float functions always made. */
static cublasStatus_t gemm_ex(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const void *A, cudaDataType_t at, int lda, const void *B, cudaDataType_t bt, int ldb,
                              void *C, cudaDataType_t ctype, int ldc, cublasComputeType_t ct)
{
    const float one = 1.f, zero = 0.f;
    if (at != CUDA_R_16BF)
        return cublasGemmEx(h, ta, tb, m, n, k, &one, A, at, lda, B, bt, ldb, &zero, C, ctype, ldc, ct,
                            CUBLAS_GEMM_DEFAULT);
    cublasMath_t mode;
    cublasStatus_t st = cublasGetMathMode(h, &mode);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    st = cublasSetMathMode(h, (cublasMath_t)(mode | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    st = cublasGemmEx(h, ta, tb, m, n, k, &one, A, at, lda, B, bt, ldb, &zero, C, ctype, ldc, ct, CUBLAS_GEMM_DEFAULT);
    const cublasStatus_t st2 = cublasSetMathMode(h, mode);
    return st != CUBLAS_STATUS_SUCCESS ? st : st2;
}

extern "C" int sf_linear_fwd_dt(cublasHandle_t h, sf_dtype dt, const void *x, int n, int in, const void *w,
                                int out, void *y, int tf32)
{
    cudaDataType_t t;
    cublasComputeType_t ct;
    if (linear_types(dt, tf32, "sf_linear_fwd_dt", &t, &ct))
        return -1;
    /* y^T [out, n] = w [out, in] . x^T [in, n] */
    SF_CUBLAS_CHECK(gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, w, t, in, x, t, in, y, t, out, ct));
    return 0;
}

extern "C" int sf_linear_bwd_data_dt(cublasHandle_t h, sf_dtype dt, const void *dy, int n, int in, const void *w,
                                     int out, void *dx, int tf32)
{
    cudaDataType_t t;
    cublasComputeType_t ct;
    if (linear_types(dt, tf32, "sf_linear_bwd_data_dt", &t, &ct))
        return -1;
    /* dx^T [in, n] = w^T [in, out] . dy^T [out, n] */
    SF_CUBLAS_CHECK(gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, w, t, in, dy, t, out, dx, t, in, ct));
    return 0;
}

extern "C" int sf_linear_bwd_filter_dt(cublasHandle_t h, sf_dtype dt, const void *x, int n, int in, const void *dy,
                                       int out, float *dw, int tf32)
{
    cudaDataType_t t;
    cublasComputeType_t ct;
    if (linear_types(dt, tf32, "sf_linear_bwd_filter_dt", &t, &ct))
        return -1;
    /* dw^T [in, out] = x^T [in, n] . dy [n, out]; dw is fp32 whatever dt is
     * (bf16 A/B with an fp32 C is one of cublasGemmEx's combinations). */
    SF_CUBLAS_CHECK(gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, x, t, in, dy, t, out, dw, CUDA_R_32F, in, ct));
    return 0;
}

extern "C" int sf_linear_fwd(cublasHandle_t h, const float *x, int n, int in, const float *w, int out,
                             float *y, int tf32)
{
    return sf_linear_fwd_dt(h, SF_DT_F32, x, n, in, w, out, y, tf32);
}

extern "C" int sf_linear_bwd_data(cublasHandle_t h, const float *dy, int n, int in, const float *w,
                                  int out, float *dx, int tf32)
{
    return sf_linear_bwd_data_dt(h, SF_DT_F32, dy, n, in, w, out, dx, tf32);
}

extern "C" int sf_linear_bwd_filter(cublasHandle_t h, const float *x, int n, int in, const float *dy,
                                    int out, float *dw, int tf32)
{
    return sf_linear_bwd_filter_dt(h, SF_DT_F32, x, n, in, dy, out, dw, tf32);
}

/* ======================================================================== */
/* convolutions (cuDNN graph API)                                           */
/* ======================================================================== */

extern "C" int sf_cuda_ptr_align(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int al = 16;
    while (al > 1 && (a % (uintptr_t)al) != 0)
        al >>= 1;
    return al;
}

static void dims_strides(int64_t n, int64_t c, int64_t h, int64_t w, sf_layout l, int64_t dims[4],
                         int64_t str[4])
{
    dims[0] = n;
    dims[1] = c;
    dims[2] = h;
    dims[3] = w;
    if (l == SF_LAYOUT_NHWC) {
        str[0] = h * w * c;
        str[1] = 1;
        str[2] = w * c;
        str[3] = c;
    } else {
        str[0] = c * h * w;
        str[1] = h * w;
        str[2] = w;
        str[3] = 1;
    }
}

static int keep(sf_conv_plan *p, cudnnBackendDescriptor_t d)
{
    if (p->n_keep >= SF_CONV_KEEP) {
        sf_cuda_set_error("%s:%d: conv plan: too many descriptors", __FILE__, __LINE__);
        cudnnBackendDestroyDescriptor(d);
        return -1;
    }
    p->keep[p->n_keep++] = d;
    return 0;
}

static cudnnDataType_t cudnn_type(sf_dtype dt)
{
    return dt == SF_DT_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

static int make_tensor_v(sf_conv_plan *p, int64_t uid, cudnnDataType_t dt, const int64_t dims[4],
                         const int64_t str[4], int64_t align, bool is_virtual, cudnnBackendDescriptor_t *out);

static int make_tensor(sf_conv_plan *p, int64_t uid, cudnnDataType_t dt, const int64_t dims[4],
                       const int64_t str[4], int64_t align, cudnnBackendDescriptor_t *out)
{
    return make_tensor_v(p, uid, dt, dims, str, align, false, out);
}

/* align: bytes (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), whatever the element type. */
static int make_tensor_v(sf_conv_plan *p, int64_t uid, cudnnDataType_t dt, const int64_t dims[4],
                         const int64_t str[4], int64_t align, bool is_virtual, cudnnBackendDescriptor_t *out)
{
    cudnnBackendDescriptor_t t;
    SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t));
    if (keep(p, t))
        return -1;
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
    if (is_virtual)
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual));
    SF_CUDNN_CHECK(cudnnBackendFinalize(t));
    *out = t;
    return 0;
}

/* Builds the graph of (d, dir) into p->keep (the convolution, and for a fused
 * forward the pointwise epilogue); returns the graph. x, w, y have type d->dt;
 * the compute type, the virtual intermediates, the bias and the pointwise math
 * are fp32. */
static int build_graph(cudnnHandle_t h, const sf_conv_desc *d, sf_conv_dir dir, sf_conv_plan *p,
                       cudnnBackendDescriptor_t *graph_out)
{
    const int64_t oh = (d->h + 2 * d->pad - d->k) / d->stride + 1;
    const int64_t ow = (d->w + 2 * d->pad - d->k) / d->stride + 1;
    int64_t xd[4], xs[4], wd[4], ws[4], yd[4], ys[4];
    dims_strides(d->n, d->c, d->h, d->w, d->layout, xd, xs);
    dims_strides(d->oc, d->c, d->k, d->k, d->layout, wd, ws); /* KCRS or KRSC */
    dims_strides(d->n, d->oc, oh, ow, d->layout, yd, ys);
    cudnnBackendDescriptor_t tx, tw, ty, ty_out = NULL;
    const int fused = dir == SF_CONV_FWD && (d->fuse_bias || d->fuse_relu);
    const cudnnDataType_t et = cudnn_type(d->dt);
    if (make_tensor(p, 1, et, xd, xs, d->align_x, &tx) || make_tensor(p, 2, et, wd, ws, d->align_w, &tw))
        return -1;
    if (fused) {
        /* conv -> fp32 virtual tensor -> (+ fp32 bias) -> (relu) -> y (type dt) */
        if (make_tensor_v(p, 10, CUDNN_DATA_FLOAT, yd, ys, 16, true, &ty) ||
            make_tensor(p, 3, et, yd, ys, d->align_y, &ty_out))
            return -1;
    } else if (make_tensor(p, 3, et, yd, ys, d->align_y, &ty)) {
        return -1;
    }

    cudnnBackendDescriptor_t conv;
    SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &conv));
    if (keep(p, conv))
        return -1;
    const int64_t nsp = 2;
    const cudnnDataType_t ct = CUDNN_DATA_FLOAT; /* fp32 accumulation for fp32 and bf16 data */
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t pad[2] = {d->pad, d->pad}, str[2] = {d->stride, d->stride}, dil[2] = {1, 1};
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &nsp));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, str));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil));
    SF_CUDNN_CHECK(cudnnBackendFinalize(conv));

    cudnnBackendDescriptor_t op;
    const float alpha = 1.f, beta = 0.f;
    if (dir == SF_CONV_FWD) {
        SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &op));
        if (keep(p, op))
            return -1;
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tx));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tw));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ty));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta));
    } else if (dir == SF_CONV_BWD_DATA) {
        SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, &op));
        if (keep(p, op))
            return -1;
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tx));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tw));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ty));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, CUDNN_TYPE_FLOAT, 1, &beta));
    } else {
        SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, &op));
        if (keep(p, op))
            return -1;
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tx));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tw));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ty));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha));
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, CUDNN_TYPE_FLOAT, 1, &beta));
    }
    SF_CUDNN_CHECK(cudnnBackendFinalize(op));

    cudnnBackendDescriptor_t ops[3] = {op, NULL, NULL};
    int64_t n_ops = 1;
    if (fused) {
        cudnnBackendDescriptor_t cur = ty;
        for (int stage = 0; stage < 2; stage++) {
            if ((stage == 0 && !d->fuse_bias) || (stage == 1 && !d->fuse_relu))
                continue;
            const int last = stage == 1 || !d->fuse_relu;
            cudnnBackendDescriptor_t out_t = ty_out, bt = NULL;
            if (!last && make_tensor_v(p, 11, CUDNN_DATA_FLOAT, yd, ys, 16, true, &out_t))
                return -1;
            if (stage == 0) {
                int64_t bd[4] = {1, d->oc, 1, 1}, bs[4];
                bs[0] = d->oc;
                bs[1] = 1;
                bs[2] = d->layout == SF_LAYOUT_NHWC ? d->oc : 1;
                bs[3] = d->layout == SF_LAYOUT_NHWC ? d->oc : 1;
                if (make_tensor(p, 4, CUDNN_DATA_FLOAT, bd, bs, d->align_b, &bt))
                    return -1;
            }
            cudnnBackendDescriptor_t pw, pop;
            const cudnnPointwiseMode_t mode = stage == 0 ? CUDNN_POINTWISE_ADD : CUDNN_POINTWISE_RELU_FWD;
            const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
            SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw));
            if (keep(p, pw))
                return -1;
            SF_CUDNN_CHECK(cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
            SF_CUDNN_CHECK(cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec));
            SF_CUDNN_CHECK(cudnnBackendFinalize(pw));
            SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &pop));
            if (keep(p, pop))
                return -1;
            SF_CUDNN_CHECK(cudnnBackendSetAttribute(pop, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw));
            SF_CUDNN_CHECK(cudnnBackendSetAttribute(pop, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cur));
            if (bt)
                SF_CUDNN_CHECK(cudnnBackendSetAttribute(pop, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bt));
            SF_CUDNN_CHECK(cudnnBackendSetAttribute(pop, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &out_t));
            SF_CUDNN_CHECK(cudnnBackendFinalize(pop));
            ops[n_ops++] = pop;
            cur = out_t;
        }
    }

    cudnnBackendDescriptor_t graph;
    SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph));
    if (keep(p, graph))
        return -1;
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n_ops, ops));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
    SF_CUDNN_CHECK(cudnnBackendFinalize(graph));
    *graph_out = graph;
    return 0;
}

/* Heuristic results of one mode: *cfgs (count *n), caller destroys. */
static int heuristics(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                      cudnnBackendDescriptor_t **cfgs, int64_t *n)
{
    *cfgs = NULL;
    *n = 0;
    cudnnBackendDescriptor_t heur;
    SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
    cudnnStatus_t st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendFinalize(heur);
    int64_t count = 0;
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                      0, &count, NULL);
    if (st != CUDNN_STATUS_SUCCESS || count <= 0) {
        cudnnBackendDestroyDescriptor(heur);
        return 0; /* no results from this mode: not an error by itself */
    }
    cudnnBackendDescriptor_t *v = (cudnnBackendDescriptor_t *)calloc((size_t)count, sizeof *v);
    if (!v) {
        cudnnBackendDestroyDescriptor(heur);
        sf_cuda_set_error("%s:%d: conv heuristics: out of memory", __FILE__, __LINE__);
        return -1;
    }
    int64_t made = 0;
    for (; made < count; made++)
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &v[made]) != CUDNN_STATUS_SUCCESS)
            break;
    int64_t got = 0;
    st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                  made, &got, v);
    cudnnBackendDestroyDescriptor(heur);
    if (st != CUDNN_STATUS_SUCCESS)
        got = 0;
    for (int64_t i = got; i < made; i++)
        cudnnBackendDestroyDescriptor(v[i]);
    *cfgs = v;
    *n = got;
    return 0;
}

/* Reads the engine's notes: returns 1 when the config is acceptable for data
 * of type dt (the rule is spelled out at sf_conv_plan_build in layers.h):
 *   REDUCED_PRECISION_REDUCTION  never (accumulation below fp32);
 *   DOWN_CONVERT_INPUTS          never (fp32 operands narrowed to fp16/bf16, or
 *                                bf16 operands narrowed further, e.g. to fp16,
 *                                which loses bf16's range);
 *   TENSOR_CORE                  bf16: always (bf16 MMA, fp32 accumulation);
 *                                fp32: only with tf32 (the MMA is TF32);
 *   RUNTIME_COMPILATION          only with allow_rtc.
 * *tc reports the TENSOR_CORE note whether or not the config is kept. */
static int cfg_ok(cudnnBackendDescriptor_t cfg, sf_dtype dt, int tf32, int allow_rtc, int64_t *engine_idx, int *tc)
{
    cudnnBackendDescriptor_t eng;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS)
        return 0;
    int64_t cnt = 0;
    int ok = cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                      &cnt, &eng) == CUDNN_STATUS_SUCCESS;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    cudnnBackendBehaviorNote_t beh[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    int64_t nn = 0, nb = 0;
    *tc = 0;
    *engine_idx = -1;
    if (ok) {
        if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                     CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes) != CUDNN_STATUS_SUCCESS)
            nn = 0;
        if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                     CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &nb, beh) != CUDNN_STATUS_SUCCESS)
            nb = 0;
        cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, engine_idx);
    }
    const int tc_allowed = dt == SF_DT_BF16 || tf32;
    for (int64_t i = 0; ok && i < nn; i++) {
        if (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
            notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
            ok = 0;
        if (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE) {
            *tc = 1;
            if (!tc_allowed)
                ok = 0;
        }
    }
    for (int64_t i = 0; ok && i < nb; i++)
        if (beh[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION && !allow_rtc)
            ok = 0;
    cudnnBackendDestroyDescriptor(eng);
    return ok;
}

/* Times one plan on the handle's stream: median of 3 after a warm-up; <0 on failure. */
static float time_plan(cudnnHandle_t h, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t vp)
{
    cudaStream_t s;
    if (cudnnGetStream(h, &s) != CUDNN_STATUS_SUCCESS)
        return -1.f;
    if (cudnnBackendExecute(h, plan, vp) != CUDNN_STATUS_SUCCESS)
        return -1.f;
    if (cudaStreamSynchronize(s) != cudaSuccess)
        return -1.f;
    cudaEvent_t e[4];
    for (int i = 0; i < 4; i++)
        if (cudaEventCreate(&e[i]) != cudaSuccess) {
            for (int j = 0; j < i; j++)
                cudaEventDestroy(e[j]);
            return -1.f;
        }
    float t[3] = {-1.f, -1.f, -1.f};
    int ok = cudaEventRecord(e[0], s) == cudaSuccess;
    for (int r = 0; ok && r < 3; r++) {
        ok = cudnnBackendExecute(h, plan, vp) == CUDNN_STATUS_SUCCESS &&
             cudaEventRecord(e[r + 1], s) == cudaSuccess;
    }
    ok = ok && cudaEventSynchronize(e[3]) == cudaSuccess;
    for (int r = 0; ok && r < 3; r++)
        ok = cudaEventElapsedTime(&t[r], e[r], e[r + 1]) == cudaSuccess;
    for (int i = 0; i < 4; i++)
        cudaEventDestroy(e[i]);
    if (!ok)
        return -1.f;
    /* median of three */
    float a = t[0], b = t[1], c = t[2];
    if (a > b) { float x = a; a = b; b = x; }
    if (b > c) { float x = b; b = c; c = x; }
    if (a > b) { float x = a; a = b; b = x; }
    return b;
}

extern "C" void sf_conv_plan_destroy(sf_conv_plan *p)
{
    if (!p)
        return;
    if (p->plan)
        cudnnBackendDestroyDescriptor(p->plan);
    for (int i = p->n_keep - 1; i >= 0; i--)
        cudnnBackendDestroyDescriptor(p->keep[i]);
    memset(p, 0, sizeof *p);
}


extern "C" int sf_conv_plan_build(cudnnHandle_t h, const sf_conv_desc *d, sf_conv_dir dir, size_t ws_limit,
                                  int max_candidates, const sf_conv_ptrs *tune, sf_conv_plan *out)
{
    memset(out, 0, sizeof *out);
    out->ms = -1.f;
    out->engine = -1;
    static const char *dir_name[3] = {"fwd", "bwd_data", "bwd_filter"};
    if ((unsigned)dir > SF_CONV_BWD_FILTER || (d->dt != SF_DT_F32 && d->dt != SF_DT_BF16)) {
        sf_cuda_set_error("%s:%d: sf_conv_plan_build: direction %d, dtype %d", __FILE__, __LINE__, (int)dir,
                          (int)d->dt);
        return -1;
    }
    out->dt = d->dt;
    cudnnBackendDescriptor_t graph;
    if (build_graph(h, d, dir, out, &graph)) {
        /* cuDNN rejected a descriptor (for a bf16 fused graph: possibly the
         * mixed-type epilogue); name the convolution in the message. */
        char why[SF_CUDA_ERR_LEN];
        snprintf(why, sizeof why, "%s", sf_cuda_last_error());
        sf_cuda_set_error("conv %s%s n=%d c=%d %dx%d oc=%d k=%d s=%d p=%d %s %s: graph rejected: %s", dir_name[dir],
                          dir == SF_CONV_FWD && (d->fuse_bias || d->fuse_relu) ? "+bias/relu" : "", d->n, d->c,
                          d->h, d->w, d->oc, d->k, d->stride, d->pad, d->layout == SF_LAYOUT_NHWC ? "nhwc" : "nchw",
                          sf_conv_prec_name(d->dt, d->tf32), why);
        sf_conv_plan_destroy(out);
        return -1;
    }
    const int allow_rtc = d->allow_rtc;
    if (max_candidates < 1)
        max_candidates = 1;

    cudnnBackendDescriptor_t vp = NULL;
    if (tune && sf_conv_vpack_make(tune, &vp)) {
        sf_conv_plan_destroy(out);
        return -1;
    }

    cudnnBackendDescriptor_t best = NULL, best_cfg = NULL;
    float best_ms = 0.f;
    int tried = 0;
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int mi = 0; mi < 2 && !best; mi++) {
        cudnnBackendDescriptor_t *cfgs = NULL;
        int64_t ncfg = 0;
        if (heuristics(graph, modes[mi], &cfgs, &ncfg)) {
            if (vp)
                sf_conv_vpack_destroy(vp);
            sf_conv_plan_destroy(out);
            return -1;
        }
        for (int64_t i = 0; i < ncfg; i++) {
            int64_t eidx;
            int tc;
            int use = tried < max_candidates && cfg_ok(cfgs[i], d->dt, d->tf32, allow_rtc, &eidx, &tc);
            cudnnBackendDescriptor_t plan = NULL;
            if (use && cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS)
                use = 0;
            if (use)
                use = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) == CUDNN_STATUS_SUCCESS &&
                      cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]) == CUDNN_STATUS_SUCCESS &&
                      cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS;
            int64_t wsb = 0, cnt = 0;
            if (use)
                use = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &wsb) == CUDNN_STATUS_SUCCESS &&
                      wsb >= 0 && (size_t)wsb <= ws_limit;
            float ms = 0.f;
            if (use) {
                tried++;
                if (vp) {
                    ms = time_plan(h, plan, vp);
                    use = ms >= 0.f;
                }
            }
            if (use && (!best || ms < best_ms)) {
                if (best)
                    cudnnBackendDestroyDescriptor(best);
                if (best_cfg)
                    cudnnBackendDestroyDescriptor(best_cfg);
                best = plan;
                best_cfg = cfgs[i];
                cfgs[i] = NULL;
                best_ms = ms;
                out->ws_bytes = wsb;
                out->engine = eidx;
                out->tensor_core = tc;
                out->ms = vp ? ms : -1.f;
            } else if (plan) {
                cudnnBackendDestroyDescriptor(plan);
            }
            if (!vp && best)
                break; /* untimed: the heuristics' first usable config */
        }
        for (int64_t i = 0; i < ncfg; i++)
            if (cfgs[i])
                cudnnBackendDestroyDescriptor(cfgs[i]);
        free(cfgs);
    }
    if (vp)
        sf_conv_vpack_destroy(vp);
    out->tried = tried;
    out->fused = dir == SF_CONV_FWD && (d->fuse_bias || d->fuse_relu);
    if (!best) {
        sf_cuda_set_error("%s:%d: conv %s%s n=%d c=%d %dx%d oc=%d k=%d s=%d p=%d %s %s: no usable cuDNN engine "
                          "(workspace limit %zu bytes)",
                          __FILE__, __LINE__, dir_name[dir], out->fused ? "+bias/relu" : "", d->n, d->c, d->h,
                          d->w, d->oc, d->k, d->stride,
                          d->pad, d->layout == SF_LAYOUT_NHWC ? "nhwc" : "nchw", sf_conv_prec_name(d->dt, d->tf32),
                          ws_limit);
        sf_conv_plan_destroy(out);
        return -1;
    }
    if (keep(out, best_cfg)) {
        cudnnBackendDestroyDescriptor(best);
        sf_conv_plan_destroy(out);
        return -1;
    }
    out->plan = best;
    return 0;
}

extern "C" int sf_conv_vpack_make(const sf_conv_ptrs *p, cudnnBackendDescriptor_t *vp)
{
    cudnnBackendDescriptor_t v;
    SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &v));
    void *ptrs[4] = {p->x, p->w, p->y, p->b};
    const int64_t uids[4] = {1, 2, 3, 4};
    const int64_t np = p->b ? 4 : 3;
    void *ws = p->ws;
    cudnnStatus_t st = cudnnBackendSetAttribute(v, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, np, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(v, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, np, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(v, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendFinalize(v);
    if (st != CUDNN_STATUS_SUCCESS) {
        cudnnBackendDestroyDescriptor(v);
        sf_cuda_set_error("%s:%d: variant pack: %s", __FILE__, __LINE__, cudnnGetErrorString(st));
        return -1;
    }
    *vp = v;
    return 0;
}

extern "C" void sf_conv_vpack_destroy(cudnnBackendDescriptor_t vp)
{
    if (vp)
        cudnnBackendDestroyDescriptor(vp);
}

extern "C" int sf_conv_run(cudnnHandle_t h, const sf_conv_plan *p, cudnnBackendDescriptor_t vp)
{
    if (!p->plan || !vp) {
        sf_cuda_set_error("%s:%d: sf_conv_run: plan or variant pack missing", __FILE__, __LINE__);
        return -1;
    }
    SF_CUDNN_CHECK(cudnnBackendExecute(h, p->plan, vp));
    return 0;
}
