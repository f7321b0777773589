/* gpu/cuda/dropout.cu — kernels first, then the launcher: dropout and
 * stochastic depth with the reference's counter-based keys. Contract in
 * dropout.h. */
#include "gpu/cuda/dropout.h"

#include "gpu/rng.h"

#include "gpu/cuda/kernel_common.cuh"

extern "C" {
#include "gpu/ref/layers.h"
}

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* The key of element e (stored index) of a dropout's [n, c, hw] map: its
 * NCHW index, whatever the layout. */
__device__ __forceinline__ uint64_t drop_key(size_t e, int c, size_t hw, size_t per, int nhwc)
{
    if (!nhwc)
        return e;
    /* e = (n*hw + q)*c + ch -> n*c*hw + ch*hw + q */
    const size_t ni = e / per, r = e % per, q = r / (size_t)c, ch = r % (size_t)c;
    return ni * per + ch * hw + q;
}

/* The key of element e's unit: its NCHW index (an element), that index's
 * (sample, channel) pair i*c + ch (a channel), or its sample. */
__device__ __forceinline__ uint64_t unit_key(size_t e, int c, size_t hw, size_t per, int nhwc, int unit)
{
    if (unit == SF_DROP_SAMPLE)
        return e / per;
    const uint64_t k = drop_key(e, c, hw, per, nhwc);
    return unit == SF_DROP_CHANNEL ? k / hw : k;
}

__host__ __device__ __forceinline__ uint64_t unit_salt(int unit)
{
    return unit == SF_DROP_SAMPLE ? SF_REF_DEPTH_SALT : unit == SF_DROP_CHANNEL ? SF_REF_DROPOUT2D_SALT
                                                                                : SF_REF_DROPOUT_SALT;
}

/* y[e] = keep(e) ? x[e] * scale : 0, e in the stored layout; the key is that
 * of e's unit (unit_key). The scale is computed on the host as the reference
 * computes it, 1/(1-p) in fp32. The scalar path: unaligned tensors, and row
 * mode past the grid's 65 535 samples. */
template <typename T>
__global__ void k_dropout(const T *x, T *y, size_t len, int c, size_t hw, float p, float scale, uint64_t seed,
                          const uint64_t *__restrict__ seqp, uint64_t layer, int unit, int nhwc)
{
    const uint64_t seq = seqp ? *seqp : 0;
    const uint64_t key = seed ^ unit_salt(unit);
    const size_t per = (size_t)c * hw, step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        const uint64_t k = unit_key(e, c, hw, per, nhwc, unit);
        const int keep = sf_u01(sf_hash4(key, seq, layer, k)) >= p;
        y[e] = keep ? cu_to<T>(cu_f(x[e]) * scale) : cu_to<T>(0.f);
    }
}

/* Dropout and channel dropout over 16-byte vectors (x, y 16-byte aligned;
 * the len % V tail one element a thread): the same keys and decisions as
 * k_dropout, one vector a thread per step. The hashes bound this kernel,
 * not the loads, so a dropped element's load is not skipped. */
template <typename T, int V>
__global__ void __launch_bounds__(CU_TPB)
    k_dropout_vec(const T *x, T *y, size_t len, int c, size_t hw, float p, float scale, uint64_t seed,
                  const uint64_t *__restrict__ seqp, uint64_t layer, int unit, int nhwc)
{
    const uint64_t seq = seqp ? *seqp : 0, key = seed ^ unit_salt(unit);
    const size_t per = (size_t)c * hw, nvec = len / V, step = (size_t)gridDim.x * blockDim.x;
    const size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t i = t0; i < nvec; i += step) {
        float u[V];
        cu_ld<T, V>(x + i * V, u);
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int keep = sf_u01(sf_hash4(key, seq, layer, unit_key(i * V + j, c, hw, per, nhwc, unit))) >= p;
            u[j] = keep ? u[j] * scale : 0.f;
        }
        cu_st<T, V>(y + i * V, u);
    }
    const size_t e = nvec * V + t0;
    if (e < len) {
        const int keep = sf_u01(sf_hash4(key, seq, layer, unit_key(e, c, hw, per, nhwc, unit))) >= p;
        y[e] = keep ? cu_to<T>(cu_f(x[e]) * scale) : cu_to<T>(0.f);
    }
}

/* Stochastic depth: block (x, sample blockIdx.y) of a grid whose blocks
 * stride over one sample's per = c*hw elements, V a vector (V > 1: per % V
 * == 0, x and y 16-byte aligned). The sample's one decision is drawn once a
 * thread (the reference's key, sf_hash4(key, seq, layer, sample)); a dropped
 * sample's elements are written as zeros without being read, so the pass
 * moves (1 - p/2) of the bytes an elementwise pass would. */
template <typename T, int V>
__global__ void __launch_bounds__(CU_TPB)
    k_depth_rows(const T *x, T *y, size_t per, float p, float scale, uint64_t seed,
                 const uint64_t *__restrict__ seqp, uint64_t layer)
{
    const uint64_t seq = seqp ? *seqp : 0;
    const size_t ni = blockIdx.y, pv = per / V, step = (size_t)gridDim.x * blockDim.x;
    const int keep = sf_u01(sf_hash4(seed ^ SF_REF_DEPTH_SALT, seq, layer, (uint64_t)ni)) >= p;
    const T *xs = x + ni * per;
    T *ys = y + ni * per;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (!keep) {
        float z[V];
#pragma unroll
        for (int j = 0; j < V; j++)
            z[j] = 0.f;
        for (; i < pv; i += step)
            cu_st<T, V>(ys + i * V, z);
        return;
    }
    for (; i + (CU_UNROLL - 1) * step < pv; i += CU_UNROLL * step) {
        float u[CU_UNROLL][V];
#pragma unroll
        for (int q = 0; q < CU_UNROLL; q++)
            cu_ld<T, V>(xs + (i + q * step) * V, u[q]);
#pragma unroll
        for (int q = 0; q < CU_UNROLL; q++) {
#pragma unroll
            for (int j = 0; j < V; j++)
                u[q][j] *= scale;
            cu_st<T, V>(ys + (i + q * step) * V, u[q]);
        }
    }
    for (; i < pv; i += step) {
        float u[V];
        cu_ld<T, V>(xs + i * V, u);
#pragma unroll
        for (int j = 0; j < V; j++)
            u[j] *= scale;
        cu_st<T, V>(ys + i * V, u);
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

/* Stochastic depth on k_depth_rows (false where n exceeds the grid's y
 * limit): enough blocks a sample to fill the device once in all. */
template <typename T>
static bool depth_rows_launch(const T *x, T *y, int n, size_t per, float p, float scale, uint64_t seed,
                              const uint64_t *seq, uint64_t layer, cudaStream_t s)
{
    constexpr int VEC = 16 / sizeof(T);
    if (n > 65535)
        return false;
    const int vec = per % VEC == 0 && cu_al16(x) && cu_al16(y);
    const size_t work = vec ? per / VEC : per, most = cu_ew_blocks(work * (size_t)n);
    const size_t per_sample = cu_cdiv(most, (size_t)n), need = cu_cdiv(work, CU_TPB);
    const dim3 grid((unsigned)(per_sample < need ? per_sample : need), (unsigned)n);
    if (vec)
        k_depth_rows<T, VEC><<<grid, CU_TPB, 0, s>>>(x, y, per, p, scale, seed, seq, layer);
    else
        k_depth_rows<T, 1><<<grid, CU_TPB, 0, s>>>(x, y, per, p, scale, seed, seq, layer);
    return true;
}

template <typename T>
static void dropout_launch(sf_layout lay, const void *x, void *y, int n, int c, size_t hw, float p, float scale,
                           uint64_t seed, const uint64_t *seq, uint64_t layer, sf_drop_unit unit, cudaStream_t s)
{
    constexpr int VEC = 16 / sizeof(T);
    const size_t len = (size_t)n * c * hw;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    const T *xp = (const T *)x;
    T *yp = (T *)y;
    const int rows = unit == SF_DROP_SAMPLE;
    if (rows && depth_rows_launch<T>(xp, yp, n, (size_t)c * hw, p, scale, seed, seq, layer, s))
        return;
    if (!rows && cu_al16(x) && cu_al16(y))
        k_dropout_vec<T, VEC><<<cu_ew_blocks(len / VEC), CU_TPB, 0, s>>>(xp, yp, len, c, hw, p, scale, seed, seq,
                                                                          layer, (int)unit, nhwc);
    else
        k_dropout<T><<<cu_ew_blocks(len), CU_TPB, 0, s>>>(xp, yp, len, c, hw, p, scale, seed, seq, layer, (int)unit,
                                                          nhwc);
}

extern "C" int sf_cuda_dropout_dt(sf_dtype dt, sf_layout lay, const void *x, void *y, int n, int c, size_t hw,
                                  float p, uint64_t seed, const uint64_t *seq, uint64_t layer, sf_drop_unit unit,
                                  cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_dropout_dt", dt))
        return -1;
    if (unit != SF_DROP_ELEMENT && unit != SF_DROP_SAMPLE && unit != SF_DROP_CHANNEL) {
        sf_cuda_set_error("%s:%d: sf_cuda_dropout_dt: unit %d unknown", __FILE__, __LINE__, (int)unit);
        return -1;
    }
    if (!(p >= 0.f && p <= 1.f)) {
        sf_cuda_set_error("%s:%d: sf_cuda_dropout_dt: p %g outside [0, 1]", __FILE__, __LINE__, (double)p);
        return -1;
    }
    const size_t len = (size_t)n * c * hw;
    if (len == 0)
        return 0;
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    if (dt == SF_DT_BF16)
        dropout_launch<cu_bf16>(lay, x, y, n, c, hw, p, scale, seed, seq, layer, unit, s);
    else
        dropout_launch<float>(lay, x, y, n, c, hw, p, scale, seed, seq, layer, unit, s);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}
