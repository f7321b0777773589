/* gpu/cuda/groupnorm.cu — kernels first, then the launchers: GroupNorm,
 * with or without its weight and bias. Contract in groupnorm.h.
 *
 * The parameter gradients are a two-pass reduction, as layer norm's
 * (norm.cu): each sample's positions split into chunks of at least
 * GN_CHUNK_MIN, a block per chunk writing its per-channel partial sums to
 * scratch ([chunk][c]), then a thread per channel adding the chunks in
 * order. Within a chunk a thread's channel has one group, so one mean and
 * one rstd. NHWC maps (and flat features in either layout) read rows of c
 * contiguous channels, a warp's lanes over neighbouring channels (and
 * neighbouring rows where c < 32); NCHW maps read each (sample, channel)
 * plane's contiguous run. A block per channel reading with stride c (NHWC)
 * fetched a 32-byte sector for every 2- or 4-byte value. */
#include "gpu/cuda/groupnorm.h"

#include "gpu/cuda/kernel_common.cuh"

/* A chunk of the parameter-gradient reduction holds at least GN_CHUNK_MIN
 * positions of one sample where the sample has them, and the chunks of all
 * samples number at most GN_CHUNKS unless the samples alone are more: the
 * bound on the scratch, set by the shape alone. */
#define GN_CHUNK_MIN 1024
#define GN_CHUNKS 256

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

/* Block (ni, gi): statistics (two passes), saved; then y (gamma NULL: x-hat
 * itself; beta NULL with a gamma: no shift). */
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
        const float xh = (cu_f(x[i]) - mu) * is;
        if (gamma) {
            const int ch = gn_channel(e, gi, cg, hw, nhwc);
            y[i] = cu_to<T>(beta ? xh * gamma[ch] + beta[ch] : xh * gamma[ch]);
        } else {
            y[i] = cu_to<T>(xh);
        }
    }
}

/* Block (ni, gi): the group's two sums of u = dy * gamma (dy where gamma is
 * NULL), then dx. */
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
        const float u = gamma ? cu_f(dy[i]) * gamma[gn_channel(e, gi, cg, hw, nhwc)] : cu_f(dy[i]);
        su += u;
        sux += (double)u * ((cu_f(x[i]) - mu) * is);
    }
    gn_sum2_all(su, sux);
    const float mu_u = (float)(su / (double)m), mu_ux = (float)(sux / (double)m);
    for (size_t e = threadIdx.x; e < m; e += CU_TPB) {
        const size_t i = gn_index(e, ni, gi, c, cg, hw, nhwc);
        const float u = gamma ? cu_f(dy[i]) * gamma[gn_channel(e, gi, cg, hw, nhwc)] : cu_f(dy[i]);
        dx[i] = cu_to<T>(is * (u - mu_u - (cu_f(x[i]) - mu) * is * mu_ux));
    }
}

/* Parameter-gradient partials of rows of c contiguous channels (NHWC maps,
 * flat features): block (chunk, tile of up to 32 channel vectors of V
 * channels), chunk = ni * kc + k covering positions [k * per, (k + 1) * per)
 * of sample ni. A warp's lanes are G = min(c / V, 32) vectors of RPW = 32 / G
 * consecutive rows (one contiguous span a load), the CU_TPB / 32 warps split
 * the chunk's rows, each thread keeps U rows' loads in flight, and the block
 * adds its threads' sums in a fixed order through shared memory.
 * part_g[chunk][ch] = sum dy * xhat, part_b[chunk][ch] = sum dy, in double.
 * V > 1: c % V == 0, x and dy 16-byte aligned. */
template <typename T, int V>
__global__ void __launch_bounds__(CU_TPB)
    k_gn_dparam_rows(const T *__restrict__ x, const T *__restrict__ dy, int c, int g, size_t hw, size_t per, int kc,
                     const float *__restrict__ mean, const float *__restrict__ rstd, double *__restrict__ part_g,
                     double *__restrict__ part_b)
{
    constexpr int U = 4;
    constexpr int W = CU_TPB / 32;
    __shared__ double sh[CU_TPB * V];
    const int cv = c / V, G = cv < 32 ? cv : 32, RPW = 32 / G, tile = blockIdx.y, chunk = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, vi = tile * 32 + lane % G, ro = lane / G;
    const int ni = chunk / kc, cg = c / g;
    const size_t r0 = (size_t)(chunk % kc) * per, r1 = r0 + per < hw ? r0 + per : hw;
    double sg[V], sb[V];
#pragma unroll
    for (int e = 0; e < V; e++)
        sg[e] = sb[e] = 0.0;
    if (ro < RPW && vi < cv) {
        float mu[V], rs[V];
#pragma unroll
        for (int e = 0; e < V; e++) {
            const int st = ni * g + (vi * V + e) / cg;
            mu[e] = mean[st];
            rs[e] = rstd[st];
        }
        const size_t base = (size_t)ni * hw * (size_t)c + (size_t)vi * V, rstep = (size_t)W * RPW;
        size_t row = r0 + (size_t)warp * RPW + ro;
        for (; row + (U - 1) * rstep < r1; row += U * rstep) {
            float xv[U][V], dv[U][V];
#pragma unroll
            for (int u = 0; u < U; u++) {
                cu_ld<T, V>(x + base + (row + u * rstep) * (size_t)c, xv[u]);
                cu_ld<T, V>(dy + base + (row + u * rstep) * (size_t)c, dv[u]);
            }
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int e = 0; e < V; e++) {
                    sg[e] += (double)dv[u][e] * ((xv[u][e] - mu[e]) * rs[e]);
                    sb[e] += (double)dv[u][e];
                }
        }
        for (; row < r1; row += rstep) {
            float xv[V], dv[V];
            cu_ld<T, V>(x + base + row * (size_t)c, xv);
            cu_ld<T, V>(dy + base + row * (size_t)c, dv);
#pragma unroll
            for (int e = 0; e < V; e++) {
                sg[e] += (double)dv[e] * ((xv[e] - mu[e]) * rs[e]);
                sb[e] += (double)dv[e];
            }
        }
    }
    /* Thread t < G * V owns channel tile * 32 * V + t: the sums of the lanes
     * (w * 32 + r * G + t / V), element t % V, warp by warp, row by row. */
    const int t = threadIdx.x;
    const bool owner = t < G * V && tile * 32 + t / V < cv;
    double out[2] = {0.0, 0.0};
    for (int pass = 0; pass < 2; pass++) {
#pragma unroll
        for (int e = 0; e < V; e++)
            sh[threadIdx.x * V + e] = pass ? sb[e] : sg[e];
        __syncthreads();
        if (owner)
            for (int w = 0; w < W; w++)
                for (int r = 0; r < RPW; r++)
                    out[pass] += sh[(w * 32 + r * G) * V + t];
        __syncthreads();
    }
    if (owner) {
        const size_t o = (size_t)chunk * c + (size_t)tile * 32 * V + t;
        part_g[o] = out[0];
        part_b[o] = out[1];
    }
}

/* Parameter-gradient partials of NCHW maps: a block per (sample, channel,
 * chunk), blockIdx.x = (ni * c + ch) * kc + k, over positions [k * per,
 * (k + 1) * per) of the plane, threads on neighbouring runs of V positions;
 * part_g/part_b [ni * kc + k][ch] as k_gn_dparam_rows. V > 1: hw % V == 0,
 * per % V == 0, x and dy 16-byte aligned. */
template <typename T, int V>
__global__ void __launch_bounds__(CU_TPB)
    k_gn_dparam_planes(const T *__restrict__ x, const T *__restrict__ dy, int c, int g, size_t hw, size_t per,
                       int kc, const float *__restrict__ mean, const float *__restrict__ rstd,
                       double *__restrict__ part_g, double *__restrict__ part_b)
{
    const size_t plane = blockIdx.x / (unsigned)kc;
    const int k = (int)(blockIdx.x % (unsigned)kc), ch = (int)(plane % (size_t)c), ni = (int)(plane / (size_t)c);
    const int st = ni * g + ch / (c / g);
    const float mu = mean[st], rs = rstd[st];
    const size_t r0 = (size_t)k * per, r1 = r0 + per < hw ? r0 + per : hw;
    const T *xp = x + plane * hw, *dp = dy + plane * hw;
    double sg = 0.0, sb = 0.0;
#pragma unroll 4
    for (size_t p = r0 + (size_t)threadIdx.x * V; p < r1; p += (size_t)CU_TPB * V) {
        float xv[V], dv[V];
        cu_ld<T, V>(xp + p, xv);
        cu_ld<T, V>(dp + p, dv);
#pragma unroll
        for (int e = 0; e < V; e++) {
            sg += (double)dv[e] * ((xv[e] - mu) * rs);
            sb += (double)dv[e];
        }
    }
    block_sum2(sg, sb);
    if (threadIdx.x == 0) {
        const size_t o = ((size_t)ni * kc + k) * c + ch;
        part_g[o] = sg;
        part_b[o] = sb;
    }
}

/* dgamma[ch], dbeta[ch] (dbeta NULL: a bias-free norm's, not written): the
 * chunks' partials summed in chunk order (none: zeros), rounded once to fp32. */
__global__ void k_gn_dparam_sum(const double *__restrict__ part_g, const double *__restrict__ part_b, int chunks,
                                int c, float *__restrict__ dgamma, float *__restrict__ dbeta)
{
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c)
        return;
    double sg = 0.0, sb = 0.0;
    for (int k = 0; k < chunks; k++) {
        sg += part_g[(size_t)k * c + ch];
        sb += part_b[(size_t)k * c + ch];
    }
    dgamma[ch] = (float)sg;
    if (dbeta)
        dbeta[ch] = (float)sb;
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

/* How the parameter-gradient reduction splits each sample's hw positions:
 * kc chunks of per positions (a multiple of 8, so that a chunk of an NCHW
 * plane starts on a 16-byte vector), the last one shorter. */
struct gn_split {
    int kc;
    size_t per;
};
static gn_split gn_split_of(int n, size_t hw)
{
    const size_t most = n >= GN_CHUNKS ? 1 : (size_t)(GN_CHUNKS / (n > 0 ? n : 1));
    const size_t want = cu_cdiv(hw, GN_CHUNK_MIN) < most ? cu_cdiv(hw, GN_CHUNK_MIN) : most;
    const size_t per = cu_cdiv(cu_cdiv(hw, want), 8) * 8;
    return gn_split{(int)cu_cdiv(hw, per), per};
}

static int gn_bad(const char *fn, sf_dtype dt, int n, int c, size_t hw, int g)
{
    if (cu_dt_bad(fn, dt))
        return 1;
    if (n < 0 || c < 1 || g < 1 || c % g || hw < 1 || (long long)n * g > 0x7fffffffLL ||
        (double)n * c * hw >= 9.0e15) {
        sf_cuda_set_error("%s:%d: %s: n %d, %d channels in %d groups, %zu positions", __FILE__, __LINE__, fn, n, c, g,
                          hw);
        return 1;
    }
    return 0;
}

/* A bound on gn_split_of's n * kc chunks that never falls as n grows (n * kc
 * itself does: 128 samples of 2 chunks, 129 of one), so that the scratch
 * sized at the largest batch holds every smaller batch's partials. */
extern "C" size_t sf_cuda_groupnorm_scratch_bytes(int n, int c, size_t hw)
{
    if (n < 1 || c < 1 || hw < 1)
        return 0;
    const size_t most = (size_t)(n > GN_CHUNKS ? n : GN_CHUNKS), by_size = (size_t)n * cu_cdiv(hw, GN_CHUNK_MIN);
    return 2 * sizeof(double) * (by_size < most ? by_size : most) * (size_t)c;
}

extern "C" int sf_cuda_groupnorm_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, size_t hw, int g,
                                        const float *gamma, const float *beta, float eps, void *y, float *mean,
                                        float *rstd, cudaStream_t s)
{
    if (gn_bad("sf_cuda_groupnorm_fwd_dt", dt, n, c, hw, g))
        return -1;
    if (beta && !gamma) {
        sf_cuda_set_error("%s:%d: sf_cuda_groupnorm_fwd_dt: a bias without a weight", __FILE__, __LINE__);
        return -1;
    }
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

/* The parameter gradients into dgamma, dbeta through scratch: the partials
 * (rows or planes kernel, 16-byte vectors where the shape and the pointers
 * allow), then their sum. */
template <typename T>
static int gn_dparam_t(sf_layout lay, const T *x, const T *dy, int n, int c, size_t hw, int g, const float *mean,
                       const float *rstd, float *dgamma, float *dbeta, void *scratch, cudaStream_t s)
{
    constexpr int V = 16 / sizeof(T);
    const gn_split sp = gn_split_of(n, hw);
    const int chunks = n * sp.kc;
    double *part_g = (double *)scratch, *part_b = part_g + (size_t)chunks * c;
    const bool al = cu_al16(x) && cu_al16(dy);
    if (n > 0 && (lay == SF_LAYOUT_NHWC || hw == 1)) {
        const bool vec = al && c % V == 0;
        const dim3 grid((unsigned)chunks, (unsigned)cu_cdiv((size_t)(vec ? c / V : c), 32));
        if (vec)
            k_gn_dparam_rows<T, V><<<grid, CU_TPB, 0, s>>>(x, dy, c, g, hw, sp.per, sp.kc, mean, rstd, part_g, part_b);
        else
            k_gn_dparam_rows<T, 1><<<grid, CU_TPB, 0, s>>>(x, dy, c, g, hw, sp.per, sp.kc, mean, rstd, part_g, part_b);
        SF_CUDA_CHECK_LAUNCH();
    } else if (n > 0) {
        const unsigned grid = (unsigned)((size_t)chunks * c);
        if (al && hw % V == 0)
            k_gn_dparam_planes<T, V><<<grid, CU_TPB, 0, s>>>(x, dy, c, g, hw, sp.per, sp.kc, mean, rstd, part_g,
                                                             part_b);
        else
            k_gn_dparam_planes<T, 1><<<grid, CU_TPB, 0, s>>>(x, dy, c, g, hw, sp.per, sp.kc, mean, rstd, part_g,
                                                             part_b);
        SF_CUDA_CHECK_LAUNCH();
    }
    k_gn_dparam_sum<<<cu_blocks((size_t)c, CU_TPB), CU_TPB, 0, s>>>(part_g, part_b, chunks, c, dgamma, dbeta);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_groupnorm_bwd_dt(sf_dtype dt, sf_layout lay, const void *x, const void *dy, int n, int c,
                                        size_t hw, int g, const float *gamma, const float *mean, const float *rstd,
                                        void *dx, float *dgamma, float *dbeta, void *scratch, cudaStream_t s)
{
    const char *fn = "sf_cuda_groupnorm_bwd_dt";
    if (gn_bad(fn, dt, n, c, hw, g))
        return -1;
    if ((dbeta && !dgamma) || (dgamma && n > 0 && !scratch)) {
        sf_cuda_set_error("%s:%d: %s: a bias gradient without a weight gradient, or either without scratch", __FILE__,
                          __LINE__, fn);
        return -1;
    }
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (dx && n) {
        if (dt == SF_DT_BF16)
            k_gn_dx<cu_bf16><<<n * g, CU_TPB, 0, s>>>((const cu_bf16 *)x, (const cu_bf16 *)dy, c, g, hw, gamma, mean,
                                                       rstd, (cu_bf16 *)dx, nhwc);
        else
            k_gn_dx<float><<<n * g, CU_TPB, 0, s>>>((const float *)x, (const float *)dy, c, g, hw, gamma, mean, rstd,
                                                     (float *)dx, nhwc);
        SF_CUDA_CHECK_LAUNCH();
    }
    if (!dgamma)
        return 0;
    if (dt == SF_DT_BF16)
        return gn_dparam_t<cu_bf16>(lay, (const cu_bf16 *)x, (const cu_bf16 *)dy, n, c, hw, g, mean, rstd, dgamma,
                                    dbeta, scratch, s);
    return gn_dparam_t<float>(lay, (const float *)x, (const float *)dy, n, c, hw, g, mean, rstd, dgamma, dbeta,
                              scratch, s);
}
