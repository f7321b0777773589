/* gpu/cuda/pointwise.cu — kernels first, then launchers: the elementwise
 * kernel behind ReLU and the residual add, bias + ReLU and its deterministic
 * per-channel gradient, element type casts and fills. Contracts in
 * pointwise.h; element types in kernel_common.cuh. */
#include "gpu/cuda/pointwise.h"

#include "gpu/rng.h"

#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

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

struct op_relu {
    __device__ __forceinline__ float operator()(float a, float) const { return a < 0.f ? 0.f : a; }
};
struct op_relu_bwd {
    __device__ __forceinline__ float operator()(float y, float d) const { return y > 0.f ? d : 0.f; }
};
struct op_add {
    int relu;
    __device__ __forceinline__ float operator()(float a, float b) const
    {
        const float o = a + b;
        return relu ? (o < 0.f ? 0.f : o) : o; /* NaN propagates, as torch.relu */
    }
};

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
        for (; i + (CU_UNROLL - 1) * step < nvec; i += CU_UNROLL * step) {
            float u[CU_UNROLL][8];
#pragma unroll
            for (int q = 0; q < CU_UNROLL; q++)
                cu_ld8<S>(src + (i + q * step) * 8, u[q]);
#pragma unroll
            for (int q = 0; q < CU_UNROLL; q++)
                cu_st8<D>(dst + (i + q * step) * 8, u[q]);
        }
        for (; i < nvec; i += step) {
            float u[8];
            cu_ld8<S>(src + i * 8, u);
            cu_st8<D>(dst + i * 8, u);
        }
        const size_t e = nvec * 8 + t0;
        if (e < len)
            dst[e] = cu_to<D>(cu_f(src[e]));
    } else {
        for (size_t i = t0; i < len; i += step)
            dst[i] = cu_to<D>(cu_f(src[i]));
    }
}

/* As k_fill_random above (the same values), rounded to T. */
template <typename T>
__global__ void k_fill_random_t(T *__restrict__ p, size_t len, uint64_t seed, float scale)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += step)
        p[i] = cu_to<T>((sf_u01(sf_hash4(seed, i, 0x5eed, 0)) * 2.f - 1.f) * scale);
}

/* v[0..V) of element e of [outer, c, inner]: + bias, then ReLU. V > 1: either
 * inner == 1 and V consecutive channels, or inner % V == 0 and one channel. */
template <int V>
__device__ __forceinline__ void bias_act_vec(float *v, size_t e, const float *__restrict__ b, int c,
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
    for (; i + (CU_UNROLL - 1) * step < nvec; i += CU_UNROLL * step) {
        float u[CU_UNROLL][V];
#pragma unroll
        for (int q = 0; q < CU_UNROLL; q++)
            cu_ld<T, V>(y + (i + q * step) * V, u[q]);
#pragma unroll
        for (int q = 0; q < CU_UNROLL; q++) {
            bias_act_vec<V>(u[q], (i + q * step) * V, b, c, inner, relu);
            cu_st<T, V>(y + (i + q * step) * V, u[q]);
        }
    }
    for (; i < nvec; i += step) {
        float u[V];
        cu_ld<T, V>(y + i * V, u);
        bias_act_vec<V>(u, i * V, b, c, inner, relu);
        cu_st<T, V>(y + i * V, u);
    }
}

/* Bias gradient over rows [R, C] (inner == 1), pass 1: a block covers G channel groups of V elements and a chunk of
 * rows, stepping RS = blockDim/G rows, so a warp reads consecutive addresses.
 * With y, dy is masked in place (ReLU backward) as it is read. Writes
 * partial[chunk][c]. */
template <typename T, int V>
__global__ void k_bgrad_rows_t(T *dy, const T *__restrict__ y, size_t R, int C, size_t rows_per_chunk,
                               float *__restrict__ partial)
{
    extern __shared__ float shf[];
    const int Cv = C / V;
    const int G = Cv < CU_TPB ? Cv : CU_TPB;
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
            cu_ld<T, V>(dy + e, d);
            if (y) {
                float a[V];
                cu_ld<T, V>(y + e, a);
#pragma unroll
                for (int v = 0; v < V; v++)
                    d[v] = a[v] > 0.f ? d[v] : 0.f;
                cu_st<T, V>(dy + e, d);
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

/* Bias gradient over planes [N, C, inner] (inner > 1), pass 1: block (c, chunk of samples). Writes partial[chunk][c]. */
template <typename T, int V>
__global__ void k_bgrad_planes_t(T *dy, const T *__restrict__ y, size_t N, int C, size_t inner,
                                 size_t n_per_chunk, float *__restrict__ partial)
{
    __shared__ float sh[CU_TPB / 32];
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
            cu_ld<T, V>(dy + e, d);
            if (y) {
                float a[V];
                cu_ld<T, V>(y + e, a);
#pragma unroll
                for (int v = 0; v < V; v++)
                    d[v] = a[v] > 0.f ? d[v] : 0.f;
                cu_st<T, V>(dy + e, d);
            }
            if constexpr (V == 8)
                acc += ((d[0] + d[1]) + (d[2] + d[3])) + ((d[4] + d[5]) + (d[6] + d[7]));
            else if constexpr (V == 4)
                acc += (d[0] + d[1]) + (d[2] + d[3]);
            else
                acc += d[0];
        }
    }
    const float s = cu_block_sum(acc, sh);
    if (threadIdx.x == 0)
        partial[(size_t)blockIdx.y * C + c] = s;
}

/* Pass 2 is k_sum_partials (kernel_common.cuh): one warp per channel sums
 * its chunks' partials in chunk order (a thread per channel walking 512
 * chunks one after another took ~20 us per layer on an H100 at W1's shapes). */

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

/* The chunk counts below stay within sf_cuda_bias_grad_scratch(c):
 * rows at most BGRAD_MAX_CHUNKS chunks of c, planes at most 1024/c chunks. */
#define BGRAD_MAX_CHUNKS 512

extern "C" size_t sf_cuda_bias_grad_scratch(int c)
{
    size_t rows = (size_t)BGRAD_MAX_CHUNKS * (size_t)c;
    size_t planes = c > 1024 ? (size_t)c : 1024 + (size_t)c;
    return rows > planes ? rows : planes;
}

extern "C" int sf_cuda_fill_random(float *p, size_t len, uint64_t seed, float scale, cudaStream_t s)
{
    if (len == 0)
        return 0;
    k_fill_random<<<cu_blocks(len, CU_TPB), CU_TPB, 0, s>>>(p, len, seed, scale);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_fill(float *p, size_t len, float v, cudaStream_t s)
{
    if (len == 0)
        return 0;
    k_fill<<<cu_blocks(len, CU_TPB), CU_TPB, 0, s>>>(p, len, v);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_add(const float *a, const float *b, float *y, size_t len, int relu, cudaStream_t s)
{
    op_add op;
    op.relu = relu;
    return cu_ew_launch<float, 2>(a, b, y, len, op, s);
}

extern "C" int sf_cuda_add_dt(sf_dtype dt, const void *a, const void *b, void *y, size_t len, int relu,
                              cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_add_dt", dt))
        return -1;
    op_add op;
    op.relu = relu;
    if (dt == SF_DT_BF16)
        return cu_ew_launch<cu_bf16, 2>((const cu_bf16 *)a, (const cu_bf16 *)b, (cu_bf16 *)y, len, op, s);
    return cu_ew_launch<float, 2>((const float *)a, (const float *)b, (float *)y, len, op, s);
}

extern "C" int sf_cuda_relu_fwd_dt(sf_dtype dt, const void *x, void *y, size_t len, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_relu_fwd_dt", dt))
        return -1;
    if (dt == SF_DT_BF16)
        return cu_ew_launch<cu_bf16, 1>((const cu_bf16 *)x, (const cu_bf16 *)NULL, (cu_bf16 *)y, len, op_relu(), s);
    return cu_ew_launch<float, 1>((const float *)x, (const float *)NULL, (float *)y, len, op_relu(), s);
}

extern "C" int sf_cuda_relu_bwd_dt(sf_dtype dt, const void *y, const void *dy, void *dx, size_t len, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_relu_bwd_dt", dt))
        return -1;
    if (dt == SF_DT_BF16)
        return cu_ew_launch<cu_bf16, 2>((const cu_bf16 *)y, (const cu_bf16 *)dy, (cu_bf16 *)dx, len, op_relu_bwd(), s);
    return cu_ew_launch<float, 2>((const float *)y, (const float *)dy, (float *)dx, len, op_relu_bwd(), s);
}

struct op_first {
    __device__ __forceinline__ float operator()(float a, float) const { return a; }
};

template <typename T>
static int grad_fork(const void *y, const void *dy, void *d0, void *d1, size_t len, cudaStream_t s)
{
    const T *yp = (const T *)y, *dp = (const T *)dy;
    T *p0 = (T *)d0, *p1 = (T *)d1;
    if (y)
        return d1 ? cu_ew_launch<T, 2, true>(yp, dp, p0, len, op_relu_bwd(), s, p1)
                  : cu_ew_launch<T, 2>(yp, dp, p0, len, op_relu_bwd(), s);
    return d1 ? cu_ew_launch<T, 1, true>(dp, (const T *)NULL, p0, len, op_first(), s, p1)
              : cu_ew_launch<T, 1>(dp, (const T *)NULL, p0, len, op_first(), s);
}

extern "C" int sf_cuda_grad_fork_dt(sf_dtype dt, const void *y, const void *dy, void *d0, void *d1, size_t len,
                                    cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_grad_fork_dt", dt))
        return -1;
    return dt == SF_DT_BF16 ? grad_fork<cu_bf16>(y, dy, d0, d1, len, s) : grad_fork<float>(y, dy, d0, d1, len, s);
}

/* ---- bias and activation on an element type ---------------------------------- */

template <typename T>
static int bias_act_t(T *y, const float *bias, size_t outer, int c, size_t inner, int relu, cudaStream_t s)
{
    constexpr int VEC = 16 / sizeof(T);
    const size_t len = outer * (size_t)c * inner;
    if (len == 0 || (!bias && !relu))
        return 0;
    if (cu_al16(y) && ((inner == 1 && c % VEC == 0) || inner % VEC == 0))
        k_bias_act_t<T, VEC><<<cu_ew_blocks(len / VEC), CU_TPB, 0, s>>>(y, bias, len / VEC, c, inner, relu);
    else
        k_bias_act_t<T, 1><<<cu_ew_blocks(len), CU_TPB, 0, s>>>(y, bias, len, c, inner, relu);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

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
        return y ? cu_ew_launch<T, 2>(y, (const T *)dy, dy, len, op_relu_bwd(), s) : 0;
    int nchunks;
    if (inner == 1) {
        const int V = (c % VEC == 0 && cu_al16(dy) && (!y || cu_al16(y))) ? VEC : 1;
        const int Cv = c / V;
        const int G = Cv < CU_TPB ? Cv : CU_TPB;
        const int RS = CU_TPB / G;
        const unsigned gx = (unsigned)((Cv + G - 1) / G);
        size_t want = 1024 / gx;
        if (want < 1)
            want = 1;
        if (want > BGRAD_MAX_CHUNKS)
            want = BGRAD_MAX_CHUNKS;
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
        const int V = (inner % VEC == 0 && cu_al16(dy) && (!y || cu_al16(y))) ? VEC : 1;
        size_t want = c >= 1024 ? 1 : 1024 / (size_t)c;
        if (want > outer)
            want = outer;
        if (want < 1)
            want = 1;
        const size_t npc = (outer + want - 1) / want;
        nchunks = (int)((outer + npc - 1) / npc);
        dim3 grid((unsigned)c, (unsigned)nchunks);
        if (V == VEC)
            k_bgrad_planes_t<T, VEC><<<grid, CU_TPB, 0, s>>>(dy, y, outer, c, inner, npc, scratch);
        else
            k_bgrad_planes_t<T, 1><<<grid, CU_TPB, 0, s>>>(dy, y, outer, c, inner, npc, scratch);
    }
    SF_CUDA_CHECK_LAUNCH();
    k_sum_partials<float><<<cu_blocks((size_t)c * 32, CU_TPB), CU_TPB, 0, s>>>(scratch, nchunks, 0, c, NULL, db);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_bias_act_dt(sf_dtype dt, void *y, const float *bias, size_t outer, int c, size_t inner,
                                   int relu, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_bias_act_dt", dt))
        return -1;
    if (dt == SF_DT_BF16)
        return bias_act_t<cu_bf16>((cu_bf16 *)y, bias, outer, c, inner, relu, s);
    return bias_act_t<float>((float *)y, bias, outer, c, inner, relu, s);
}

extern "C" int sf_cuda_bias_grad_dt(sf_dtype dt, void *dy, const void *y, size_t outer, int c, size_t inner,
                                    float *db, float *scratch, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_bias_grad_dt", dt))
        return -1;
    if (dt == SF_DT_BF16)
        return bias_grad_t<cu_bf16>((cu_bf16 *)dy, (const cu_bf16 *)y, outer, c, inner, db, scratch, s);
    return bias_grad_t<float>((float *)dy, (const float *)y, outer, c, inner, db, scratch, s);
}

/* The fp32 launchers are the float case of the templates above: one
 * implementation of each kernel. */
extern "C" int sf_cuda_bias_act(float *y, const float *bias, size_t outer, int c, size_t inner, int relu,
                                cudaStream_t s)
{
    return bias_act_t<float>(y, bias, outer, c, inner, relu, s);
}

extern "C" int sf_cuda_relu_fwd(const float *x, float *y, size_t len, cudaStream_t s)
{
    return cu_ew_launch<float, 1>(x, (const float *)NULL, y, len, op_relu(), s);
}

extern "C" int sf_cuda_relu_bwd(const float *y, const float *dy, float *dx, size_t len, cudaStream_t s)
{
    return cu_ew_launch<float, 2>(y, dy, dx, len, op_relu_bwd(), s);
}

extern "C" int sf_cuda_bias_grad(float *dy, const float *y, size_t outer, int c, size_t inner, float *db,
                                 float *scratch, cudaStream_t s)
{
    return bias_grad_t<float>(dy, y, outer, c, inner, db, scratch, s);
}

extern "C" int sf_cuda_cast(const void *src, sf_dtype st, void *dst, sf_dtype dt, size_t len, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_cast", st) || cu_dt_bad("sf_cuda_cast", dt))
        return -1;
    if (len == 0)
        return 0;
    if (st == dt) {
        if (src != dst)
            SF_CUDA_CHECK(cudaMemcpyAsync(dst, src, len * sf_dtype_size(st), cudaMemcpyDeviceToDevice, s));
        return 0;
    }
    const int vec = cu_al16(src) && cu_al16(dst);
    const unsigned nb = cu_ew_blocks(vec ? len / 8 : len);
    if (st == SF_DT_F32) {
        if (vec)
            k_cast<float, cu_bf16, 1><<<nb, CU_TPB, 0, s>>>((const float *)src, (cu_bf16 *)dst, len);
        else
            k_cast<float, cu_bf16, 0><<<nb, CU_TPB, 0, s>>>((const float *)src, (cu_bf16 *)dst, len);
    } else {
        if (vec)
            k_cast<cu_bf16, float, 1><<<nb, CU_TPB, 0, s>>>((const cu_bf16 *)src, (float *)dst, len);
        else
            k_cast<cu_bf16, float, 0><<<nb, CU_TPB, 0, s>>>((const cu_bf16 *)src, (float *)dst, len);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_fill_random_dt(sf_dtype dt, void *p, size_t len, uint64_t seed, float scale, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_fill_random_dt", dt))
        return -1;
    if (len == 0)
        return 0;
    if (dt == SF_DT_BF16)
        k_fill_random_t<cu_bf16><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((cu_bf16 *)p, len, seed, scale);
    else
        k_fill_random_t<float><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((float *)p, len, seed, scale);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}
