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

/* y[e] = keep(e) ? x[e] * scale : 0, e in the stored layout; the key is the
 * element's NCHW index (dropout) or its sample (rows). The scale is computed
 * on the host as the reference computes it, 1/(1-p) in fp32. */
template <typename T>
__global__ void k_dropout(const T *x, T *y, size_t len, int c, size_t hw, float p, float scale, uint64_t seed,
                          const uint64_t *__restrict__ seqp, uint64_t layer, int rows, int nhwc)
{
    const uint64_t seq = seqp ? *seqp : 0;
    const uint64_t key = seed ^ (rows ? SF_REF_DEPTH_SALT : SF_REF_DROPOUT_SALT);
    const size_t per = (size_t)c * hw, step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        const size_t ni = e / per;
        uint64_t k;
        if (rows) {
            k = ni;
        } else if (nhwc) { /* e = (n*hw + q)*c + ch -> n*c*hw + ch*hw + q */
            const size_t r = e % per, q = r / (size_t)c, ch = r % (size_t)c;
            k = ni * per + ch * hw + q;
        } else {
            k = e;
        }
        const int keep = sf_u01(sf_hash4(key, seq, layer, k)) >= p;
        y[e] = keep ? cu_to<T>(cu_f(x[e]) * scale) : cu_to<T>(0.f);
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

extern "C" int sf_cuda_dropout_dt(sf_dtype dt, sf_layout lay, const void *x, void *y, int n, int c, size_t hw,
                                  float p, uint64_t seed, const uint64_t *seq, uint64_t layer, int rows,
                                  cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_dropout_dt", dt))
        return -1;
    if (!(p >= 0.f && p <= 1.f)) {
        sf_cuda_set_error("%s:%d: sf_cuda_dropout_dt: p %g outside [0, 1]", __FILE__, __LINE__, (double)p);
        return -1;
    }
    const size_t len = (size_t)n * c * hw;
    if (len == 0)
        return 0;
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (dt == SF_DT_BF16)
        k_dropout<cu_bf16><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const cu_bf16 *)x, (cu_bf16 *)y, len, c, hw, p, scale,
                                                                 seed, seq, layer, rows, nhwc);
    else
        k_dropout<float><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const float *)x, (float *)y, len, c, hw, p, scale, seed,
                                                               seq, layer, rows, nhwc);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}
