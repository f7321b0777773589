/* gpu/cuda/groupnorm.cu — kernels first, then the launchers: GroupNorm.
 * Contract in groupnorm.h. */
#include "gpu/cuda/groupnorm.h"

#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* Element e (0 <= e < (c/g) * hw) of group gi of sample ni, in an order that
 * reads memory in sequence: channel-major in NCHW (the group's channels are
 * one contiguous run), pixel-major in NHWC (each pixel's group channels are). */
__device__ __forceinline__ size_t gn_index(size_t e, int ni, int gi, int c, int cg, size_t hw, int nhwc)
{
    if (nhwc) {
        const size_t p = e / (size_t)cg, k = e % (size_t)cg;
        return ((size_t)ni * hw + p) * (size_t)c + (size_t)gi * cg + k;
    }
    return ((size_t)ni * c + (size_t)gi * cg) * hw + e;
}

/* The channel of element e of a group (gn_index's order). */
__device__ __forceinline__ int gn_channel(size_t e, int gi, int cg, size_t hw, int nhwc)
{
    return gi * cg + (int)(nhwc ? e % (size_t)cg : e / hw);
}

/* The block-wide sums of a and b, to every thread. */
__device__ __forceinline__ void gn_sum2_all(double &a, double &b)
{
    __shared__ double r[2];
    block_sum2(a, b);
    if (threadIdx.x == 0) {
        r[0] = a;
        r[1] = b;
    }
    __syncthreads();
    a = r[0];
    b = r[1];
}

/* Block (ni, gi): statistics (two passes), saved; then y. */
template <typename T>
__global__ void __launch_bounds__(CU_TPB)
    k_gn_fwd(const T *__restrict__ x, int c, int g, size_t hw, const float *__restrict__ gamma,
             const float *__restrict__ beta, float eps, T *__restrict__ y, float *mean, float *rstd, int nhwc)
{
    const int ni = blockIdx.x / g, gi = blockIdx.x % g, cg = c / g;
    const size_t m = (size_t)cg * hw;
    double s = 0, unused = 0;
    for (size_t e = threadIdx.x; e < m; e += CU_TPB)
        s += cu_f(x[gn_index(e, ni, gi, c, cg, hw, nhwc)]);
    gn_sum2_all(s, unused);
    const float mu = (float)(s / (double)m);
    double v = 0;
    unused = 0;
    for (size_t e = threadIdx.x; e < m; e += CU_TPB) {
        const float d = cu_f(x[gn_index(e, ni, gi, c, cg, hw, nhwc)]) - mu;
        v += (double)d * d;
    }
    gn_sum2_all(v, unused);
    const float is = (float)(1.0 / sqrt(v / (double)m + (double)eps));
    if (threadIdx.x == 0) {
        mean[blockIdx.x] = mu;
        rstd[blockIdx.x] = is;
    }
    for (size_t e = threadIdx.x; e < m; e += CU_TPB) {
        const size_t i = gn_index(e, ni, gi, c, cg, hw, nhwc);
        const int ch = gn_channel(e, gi, cg, hw, nhwc);
        y[i] = cu_to<T>((cu_f(x[i]) - mu) * is * gamma[ch] + beta[ch]);
    }
}

/* Block (ni, gi): the group's two sums of u = dy * gamma, then dx. */
template <typename T>
__global__ void __launch_bounds__(CU_TPB)
    k_gn_dx(const T *__restrict__ x, const T *__restrict__ dy, int c, int g, size_t hw, const float *__restrict__ gamma,
            const float *__restrict__ mean, const float *__restrict__ rstd, T *__restrict__ dx, int nhwc)
{
    const int ni = blockIdx.x / g, gi = blockIdx.x % g, cg = c / g;
    const size_t m = (size_t)cg * hw;
    const float mu = mean[blockIdx.x], is = rstd[blockIdx.x];
    double su = 0, sux = 0;
    for (size_t e = threadIdx.x; e < m; e += CU_TPB) {
        const size_t i = gn_index(e, ni, gi, c, cg, hw, nhwc);
        const float u = cu_f(dy[i]) * gamma[gn_channel(e, gi, cg, hw, nhwc)];
        su += u;
        sux += (double)u * ((cu_f(x[i]) - mu) * is);
    }
    gn_sum2_all(su, sux);
    const float mu_u = (float)(su / (double)m), mu_ux = (float)(sux / (double)m);
    for (size_t e = threadIdx.x; e < m; e += CU_TPB) {
        const size_t i = gn_index(e, ni, gi, c, cg, hw, nhwc);
        const float u = cu_f(dy[i]) * gamma[gn_channel(e, gi, cg, hw, nhwc)];
        dx[i] = cu_to<T>(is * (u - mu_u - (cu_f(x[i]) - mu) * is * mu_ux));
    }
}

/* Block ch: dgamma[ch] = sum dy * xhat, dbeta[ch] = sum dy over the samples
 * and positions. */
template <typename T>
__global__ void __launch_bounds__(CU_TPB)
    k_gn_dparam(const T *__restrict__ x, const T *__restrict__ dy, int n, int c, int g, size_t hw,
                const float *__restrict__ mean, const float *__restrict__ rstd, float *dgamma, float *dbeta, int nhwc)
{
    const int ch = blockIdx.x, gi = ch / (c / g);
    const size_t per = (size_t)n * hw;
    double sg = 0, sb = 0;
    for (size_t e = threadIdx.x; e < per; e += CU_TPB) {
        const int ni = (int)(e / hw);
        const size_t p = e % hw;
        const size_t i = nhwc ? ((size_t)ni * hw + p) * (size_t)c + ch : ((size_t)ni * c + ch) * hw + p;
        const int st = ni * g + gi;
        const float d = cu_f(dy[i]);
        sg += (double)d * ((cu_f(x[i]) - mean[st]) * rstd[st]);
        sb += d;
    }
    block_sum2(sg, sb);
    if (threadIdx.x == 0) {
        dgamma[ch] = (float)sg;
        dbeta[ch] = (float)sb;
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

static int gn_bad(const char *fn, sf_dtype dt, int n, int c, size_t hw, int g)
{
    if (cu_dt_bad(fn, dt))
        return 1;
    if (n < 0 || c < 1 || g < 1 || c % g || hw < 1 || (long long)n * g > 0x7fffffffLL) {
        sf_cuda_set_error("%s:%d: %s: n %d, %d channels in %d groups, %zu positions", __FILE__, __LINE__, fn, n, c, g,
                          hw);
        return 1;
    }
    return 0;
}

extern "C" int sf_cuda_groupnorm_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, size_t hw, int g,
                                        const float *gamma, const float *beta, float eps, void *y, float *mean,
                                        float *rstd, cudaStream_t s)
{
    if (gn_bad("sf_cuda_groupnorm_fwd_dt", dt, n, c, hw, g))
        return -1;
    if (n == 0)
        return 0;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (dt == SF_DT_BF16)
        k_gn_fwd<cu_bf16><<<n * g, CU_TPB, 0, s>>>((const cu_bf16 *)x, c, g, hw, gamma, beta, eps, (cu_bf16 *)y, mean,
                                                    rstd, nhwc);
    else
        k_gn_fwd<float><<<n * g, CU_TPB, 0, s>>>((const float *)x, c, g, hw, gamma, beta, eps, (float *)y, mean, rstd,
                                                  nhwc);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_groupnorm_bwd_dt(sf_dtype dt, sf_layout lay, const void *x, const void *dy, int n, int c,
                                        size_t hw, int g, const float *gamma, const float *mean, const float *rstd,
                                        void *dx, float *dgamma, float *dbeta, cudaStream_t s)
{
    if (gn_bad("sf_cuda_groupnorm_bwd_dt", dt, n, c, hw, g))
        return -1;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (dt == SF_DT_BF16) {
        if (dx && n)
            k_gn_dx<cu_bf16><<<n * g, CU_TPB, 0, s>>>((const cu_bf16 *)x, (const cu_bf16 *)dy, c, g, hw, gamma, mean,
                                                       rstd, (cu_bf16 *)dx, nhwc);
        k_gn_dparam<cu_bf16><<<c, CU_TPB, 0, s>>>((const cu_bf16 *)x, (const cu_bf16 *)dy, n, c, g, hw, mean, rstd,
                                                   dgamma, dbeta, nhwc);
    } else {
        if (dx && n)
            k_gn_dx<float><<<n * g, CU_TPB, 0, s>>>((const float *)x, (const float *)dy, c, g, hw, gamma, mean, rstd,
                                                     (float *)dx, nhwc);
        k_gn_dparam<float><<<c, CU_TPB, 0, s>>>((const float *)x, (const float *)dy, n, c, g, hw, mean, rstd, dgamma,
                                                 dbeta, nhwc);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}
