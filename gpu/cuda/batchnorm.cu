/* gpu/cuda/batchnorm.cu — kernels first, then launchers: per-channel partial
 * sums in double over fixed chunks, their fixed-order combination, and the
 * normalisation and its backward; an NHWC row path in 16-byte vectors for bf16.
 * Contracts in batchnorm.h. */
#include "gpu/cuda/batchnorm.h"

#include <type_traits>

#include "gpu/cuda/activation.cuh"
#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* The logistic 1 / (1 + e^-v) of the fused SiLU and sigmoid, from the fast
 * intrinsics: their error (a few ulp of fp32) is far below the bf16 rounding of
 * every tensor these kernels read or write (the fused kernels are the bf16
 * NHWC row kernels only). With activation.cuh's expf and IEEE division the
 * backward of a SiLU-fused batchnorm was bound by arithmetic: 1.9 TB/s on an
 * H200 where an unfused one moved 3.6
 * (bench/results/2026-11-29-h200-families-squeeze-excitation.md). */
__device__ __forceinline__ float bn_logistic(float v) { return __fdividef(1.f, 1.f + __expf(-v)); }

/* The activation fused after the batchnorm (A, batchnorm.h's codes: not 0)
 * at z, the normalised value (plus the residual, when there is one). A is a
 * template argument of every kernel that applies one, so each activation's
 * unrolled loop holds its own arithmetic only: with a runtime code every
 * loop, ReLU's included, carries activation.cuh's whole switch, which cost
 * W3 13 % on an H200 (bench/results/2026-11-29-h200-batchnorm-activation-fusion.md). */
template <int A> __device__ __forceinline__ float bn_act_f(float z)
{
    if constexpr (A == SF_BN_RELU)
        return z > 0.f ? z : 0.f;
    else if constexpr (A == SF_BN_ACT(SF_CUDA_ACT_SILU))
        return z * bn_logistic(z);
    else if constexpr (A == SF_BN_ACT(SF_CUDA_ACT_SIGMOID))
        return bn_logistic(z);
    else
        return act_f(A - SF_BN_ACT_BASE, z);
}

/* dy's gradient through that activation at z: ReLU's mask, or g * f'(z). */
template <int A> __device__ __forceinline__ float bn_act_g(float z, float g)
{
    if constexpr (A == SF_BN_RELU) {
        return z > 0.f ? g : 0.f;
    } else if constexpr (A == SF_BN_ACT(SF_CUDA_ACT_SILU)) {
        const float sg = bn_logistic(z);
        return g * (sg * (1.f + z * (1.f - sg)));
    } else if constexpr (A == SF_BN_ACT(SF_CUDA_ACT_SIGMOID)) {
        const float sg = bn_logistic(z);
        return g * (sg * (1.f - sg));
    } else {
        return g * act_d(A - SF_BN_ACT_BASE, z);
    }
}

/* The channel of element e (e a multiple of V when V > 1). */
__device__ __forceinline__ int bn_chan(unsigned e, int C, unsigned hw, int nhwc)
{
    return nhwc ? (int)(e % (unsigned)C) : (int)((e / hw) % (unsigned)C);
}

/* Per-channel statistics over an NCHW tensor, pass 1. Block (c, chunk) covers
 * the flattened (sample, spatial) range [chunk*L, chunk*L + L) of channel c.
 * mode 0 (forward): a = sum(x - shift), b = sum((x - shift)^2), shift = x's
 * first element of the channel. mode 1 (backward): a = sum(g), b = sum(g * (x -
 * mean)), g = dy masked by y > 0 when y is given. part[chunk][c][2].
 * V = 4 (fp32) or 8 (bf16) elements of one channel a load, or 1. fp32 adds
 * every value to the double sums; bf16 first sums a vector's 8 values in fp32
 * (exact enough for 8-bit data, and 8 times fewer conversions to double). */
template <typename T, int V>
__global__ void k_bn_part_nchw(const T *__restrict__ x, const T *__restrict__ dy, const T *__restrict__ y,
                               const float *__restrict__ mean, int C, size_t hw, size_t E, size_t L, int mode,
                               double *__restrict__ part)
{
    constexpr bool F32SUM = sizeof(T) == 2 && V > 1;
    const int c = blockIdx.x;
    const size_t e0 = (size_t)blockIdx.y * L;
    const size_t e1 = e0 + L < E ? e0 + L : E;
    const float sh = mode == 0 ? cu_f(x[(size_t)c * hw]) : mean[c];
    double a = 0.0, b = 0.0;
    /* 32-bit index arithmetic: the launchers keep tensors under 2^32 elements */
    const unsigned hw32 = (unsigned)hw;
    for (unsigned e = (unsigned)e0 + threadIdx.x * V; e < (unsigned)e1; e += blockDim.x * V) {
        const unsigned ni = e / hw32, sp = e - ni * hw32;
        const size_t off = ((size_t)ni * C + c) * hw + sp;
        float xs[V];
        cu_ld<T, V>(x + off, xs);
#pragma unroll
        for (int j = 0; j < V; j++)
            xs[j] = xs[j] - sh;
        if (mode == 0) {
            if constexpr (F32SUM) {
                float sa = 0.f, sb = 0.f;
#pragma unroll
                for (int j = 0; j < V; j++) {
                    sa += xs[j];
                    sb += xs[j] * xs[j];
                }
                a += (double)sa;
                b += (double)sb;
            } else {
#pragma unroll
                for (int j = 0; j < V; j++) {
                    a += (double)xs[j];
                    b += (double)xs[j] * (double)xs[j];
                }
            }
        } else {
            float g[V];
            cu_ld<T, V>(dy + off, g);
            if (y) {
                float yv[V];
                cu_ld<T, V>(y + off, yv);
#pragma unroll
                for (int j = 0; j < V; j++)
                    g[j] = yv[j] > 0.f ? g[j] : 0.f;
            }
            if constexpr (F32SUM) {
                float sa = 0.f, sb = 0.f;
#pragma unroll
                for (int j = 0; j < V; j++) {
                    sa += g[j];
                    sb += g[j] * xs[j];
                }
                a += (double)sa;
                b += (double)sb;
            } else {
#pragma unroll
                for (int j = 0; j < V; j++) {
                    a += (double)g[j];
                    b += (double)g[j] * (double)xs[j];
                }
            }
        }
    }
    block_sum2(a, b);
    if (threadIdx.x == 0) {
        double *o = part + ((size_t)blockIdx.y * C + c) * 2;
        o[0] = a;
        o[1] = b;
    }
}

/* The same over NHWC, viewed as rows [R, C]. A block covers G channel groups
 * of V channels and the row range [chunk*rpc, +rpc), RS = blockDim/G rows at a
 * time, so a warp reads consecutive addresses. (bf16 with C % 8 == 0 and
 * aligned tensors takes k_bn_part_rows instead.) */
template <typename T, int V>
__global__ void k_bn_part_nhwc(const T *__restrict__ x, const T *__restrict__ dy, const T *__restrict__ y,
                               const float *__restrict__ mean, int C, size_t R, size_t rpc, int mode,
                               double *__restrict__ part)
{
    extern __shared__ double shd[];
    const int Cv = C / V;
    const int G = Cv < CU_TPB ? Cv : CU_TPB;
    const int RS = blockDim.x / G;
    const int tid = threadIdx.x, g = tid % G, rl = tid / G;
    const int cg = blockIdx.x * G + g;
    const size_t r0 = (size_t)blockIdx.y * rpc;
    const size_t r1 = r0 + rpc < R ? r0 + rpc : R;
    double a[V], b[V];
    float sh[V];
#pragma unroll
    for (int v = 0; v < V; v++) {
        a[v] = 0.0;
        b[v] = 0.0;
        sh[v] = 0.f;
    }
    if (cg < Cv && rl < RS) {
#pragma unroll
        for (int v = 0; v < V; v++)
            sh[v] = mode == 0 ? cu_f(x[cg * V + v]) : mean[cg * V + v];
        for (size_t r = r0 + rl; r < r1; r += RS) {
            const size_t off = r * (size_t)C + (size_t)cg * V;
            float xs[V], gs[V];
            cu_ld<T, V>(x + off, xs);
            if (mode == 1) {
                cu_ld<T, V>(dy + off, gs);
                if (y) {
                    float yv[V];
                    cu_ld<T, V>(y + off, yv);
#pragma unroll
                    for (int v = 0; v < V; v++)
                        gs[v] = yv[v] > 0.f ? gs[v] : 0.f;
                }
            }
#pragma unroll
            for (int v = 0; v < V; v++) {
                const float d = xs[v] - sh[v];
                if (mode == 0) {
                    a[v] += (double)d;
                    b[v] += (double)d * (double)d;
                } else {
                    a[v] += (double)gs[v];
                    b[v] += (double)gs[v] * (double)d;
                }
            }
        }
    }
    /* shd[(rl*G + g)*V + v][2] */
#pragma unroll
    for (int v = 0; v < V; v++) {
        shd[(tid * V + v) * 2] = a[v];
        shd[(tid * V + v) * 2 + 1] = b[v];
    }
    __syncthreads();
    for (int t = tid; t < G * V; t += blockDim.x) {
        const int gg = t / V, v = t % V;
        double sa = 0.0, sb = 0.0;
        for (int k = 0; k < RS; k++) {
            sa += shd[((k * G + gg) * V + v) * 2];
            sb += shd[((k * G + gg) * V + v) * 2 + 1];
        }
        const int cgg = blockIdx.x * G + gg;
        if (cgg < Cv) {
            double *o = part + ((size_t)blockIdx.y * C + (size_t)cgg * V + v) * 2;
            o[0] = sa;
            o[1] = sb;
        }
    }
}

/* Channel c's forward statistics from its sums a = sum(x - shift), b =
 * sum((x - shift)^2) over cnt values. */
template <typename T>
__device__ __forceinline__ void bn_stats_out(int c, double a, double b, double cnt, const T *__restrict__ x,
                                             size_t shift_stride, float eps, float momentum,
                                             float *__restrict__ rmean, float *__restrict__ rvar,
                                             float *__restrict__ smean, float *__restrict__ sinv)
{
    const double sh = (double)cu_f(x[(size_t)c * shift_stride]);
    const double dm = a / cnt;
    double var = b / cnt - dm * dm;
    if (var < 0.0)
        var = 0.0;
    const double mean = sh + dm;
    smean[c] = (float)mean;
    sinv[c] = (float)(1.0 / sqrt(var + (double)eps));
    const double m = (double)momentum;
    rmean[c] = (float)((1.0 - m) * (double)rmean[c] + m * mean);
    rvar[c] = (float)((1.0 - m) * (double)rvar[c] + m * var * cnt / (cnt - 1.0));
}

/* Backward: dbeta, dgamma and the coefficients of dx:
 * dx = k1 * (g - m1 - (x - mean) * k2), k1 = gamma*invstd, m1 = sum(g)/N,
 * k2 = sum(g*(x-mean)) * invstd^2 / N. coef[c][3]. */
__device__ __forceinline__ void bn_bwd_out(int c, double a, double b, double cnt, const float *__restrict__ gamma,
                                           const float *__restrict__ sinv, float *__restrict__ dgamma,
                                           float *__restrict__ dbeta, float *__restrict__ coef)
{
    const double inv = (double)sinv[c];
    dbeta[c] = (float)a;
    dgamma[c] = (float)(b * inv);
    coef[c * 3 + 0] = (float)((double)gamma[c] * inv);
    coef[c * 3 + 1] = (float)(a / cnt);
    coef[c * 3 + 2] = (float)(b * inv * inv / cnt);
}

/* Forward statistics, pass 2 (fp32): a thread per channel sums the chunks in order. */
__global__ void k_bn_stats_final(const double *__restrict__ part, int nchunks, int C, double cnt,
                                 const float *__restrict__ x, size_t shift_stride, float eps,
                                 float momentum, float *__restrict__ rmean, float *__restrict__ rvar,
                                 float *__restrict__ smean, float *__restrict__ sinv)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    double a = 0.0, b = 0.0;
    for (int k = 0; k < nchunks; k++) {
        a += part[((size_t)k * C + c) * 2];
        b += part[((size_t)k * C + c) * 2 + 1];
    }
    bn_stats_out<float>(c, a, b, cnt, x, shift_stride, eps, momentum, rmean, rvar, smean, sinv);
}

/* Backward, pass 2 (fp32): as k_bn_stats_final, then bn_bwd_out. */
__global__ void k_bn_bwd_final(const double *__restrict__ part, int nchunks, int C, double cnt,
                               const float *__restrict__ gamma, const float *__restrict__ sinv,
                               float *__restrict__ dgamma, float *__restrict__ dbeta,
                               float *__restrict__ coef)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    double a = 0.0, b = 0.0;
    for (int k = 0; k < nchunks; k++) {
        a += part[((size_t)k * C + c) * 2];
        b += part[((size_t)k * C + c) * 2 + 1];
    }
    bn_bwd_out(c, a, b, cnt, gamma, sinv, dgamma, dbeta, coef);
}

/* Channel c's two partial sums over its nchunks chunks (chunk k's pair at
 * part + (c * cs + k * ks) * 2), added by one warp in a fixed order: lane 0
 * gets the totals. */
__device__ __forceinline__ void warp_channel_sums(const double *__restrict__ part, size_t cs, size_t ks, int nchunks,
                                                  int c, int lane, double *a_out, double *b_out)
{
    double a = 0.0, b = 0.0;
    for (int k = lane; k < nchunks; k += 32) {
        const double *p = part + ((size_t)c * cs + (size_t)k * ks) * 2;
        a += p[0];
        b += p[1];
    }
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, o);
        b += __shfl_down_sync(0xffffffffu, b, o);
    }
    *a_out = a;
    *b_out = b;
}

/* Pass 2 of the bf16 paths: a warp per channel; lane l sums the partials
 * l, l+32, ... in order, then a fixed shuffle tree (deterministic, and
 * parallel where the fp32 kernels above walk up to 1024 chunks serially).
 * Channel c's partial k is part[(c*cs + k*ks)*2]. MODE 0: statistics (x:
 * the shift); 1: the backward's (sinv_in: the saved invstd). */
template <typename T, int MODE>
__global__ void k_bn_final_tree(const double *__restrict__ part, size_t cs, size_t ks, int nchunks, int C,
                                double cnt, const T *__restrict__ x, size_t shift_stride, float eps,
                                float momentum, float *__restrict__ rmean, float *__restrict__ rvar,
                                float *__restrict__ smean, float *__restrict__ sinv,
                                const float *__restrict__ gamma, const float *__restrict__ sinv_in,
                                float *__restrict__ dgamma, float *__restrict__ dbeta, float *__restrict__ coef)
{
    const int lane = threadIdx.x & 31;
    const int c = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (c >= C)
        return; /* the whole warp */
    double a, b;
    warp_channel_sums(part, cs, ks, nchunks, c, lane, &a, &b);
    if (lane == 0) {
        if constexpr (MODE == 0)
            bn_stats_out<T>(c, a, b, cnt, x, shift_stride, eps, momentum, rmean, rvar, smean, sinv);
        else
            bn_bwd_out(c, a, b, cnt, gamma, sinv_in, dgamma, dbeta, coef);
    }
}

/* y = act(((x - mean) * invstd) * gamma + beta (+ res)), elementwise; V > 1
 * when the V elements share a channel (NCHW, hw % V == 0) or are V
 * consecutive channels (NHWC, C % V == 0). eval: mean/invstd from the running
 * stats. res (NULL: none) is a residual added before the activation. */
template <typename T, int V, int A>
__global__ void k_bn_apply(const T *__restrict__ x, size_t nvec, int C, size_t hw, int nhwc,
                           const float *__restrict__ mean, const float *__restrict__ sinv,
                           const float *__restrict__ rvar, float eps, const float *__restrict__ gamma,
                           const float *__restrict__ beta, const T *__restrict__ res, T *__restrict__ y)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nvec)
        return;
    const size_t e = i * V;
    const int c0 = bn_chan((unsigned)e, C, (unsigned)hw, nhwc);
    float xv[V], rv[V];
    cu_ld<T, V>(x + e, xv);
    if (res)
        cu_ld<T, V>(res + e, rv);
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int c = (nhwc && V > 1) ? c0 + v : c0;
        const float inv = rvar ? 1.f / sqrtf(rvar[c] + eps) : sinv[c];
        float o = bn_out(xv[v], mean[c], inv, gamma[c], beta[c]);
        if (res)
            o += rv[v];
        if constexpr (A != 0)
            o = bn_act_f<A>(o);
        xv[v] = o;
    }
    cu_st<T, V>(y + e, xv);
}

/* dx = k1 * (g - m1 - (x - mean) * k2), g = dy masked by y > 0 when y. */
template <typename T, int V>
__global__ void k_bn_dx(const T *__restrict__ x, const T *__restrict__ dy, const T *__restrict__ y, size_t nvec,
                        int C, size_t hw, int nhwc, const float *__restrict__ mean, const float *__restrict__ coef,
                        T *__restrict__ dx)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nvec)
        return;
    const size_t e = i * V;
    const int c0 = bn_chan((unsigned)e, C, (unsigned)hw, nhwc);
    float xv[V], gv[V];
    cu_ld<T, V>(x + e, xv);
    cu_ld<T, V>(dy + e, gv);
    if (y) {
        float yv[V];
        cu_ld<T, V>(y + e, yv);
#pragma unroll
        for (int v = 0; v < V; v++)
            gv[v] = yv[v] > 0.f ? gv[v] : 0.f;
    }
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int c = (nhwc && V > 1) ? c0 + v : c0;
        const float k1 = coef[c * 3], m1 = coef[c * 3 + 1], k2 = coef[c * 3 + 2];
        xv[v] = k1 * (gv[v] - m1 - (xv[v] - mean[c]) * k2);
    }
    cu_st<T, V>(dx + e, xv);
}

/* ---- distributed.batchnorm sync (torch.nn.SyncBatchNorm) ------------------- *
 * Pass 2 of the split reductions: this rank's per-channel sums in a form the
 * ranks can add (sums[2C + 1] doubles, gpu/ref's sf_ref_bn2d_sync_* layout),
 * then, from the sums of every rank, the statistics or the dx coefficients.
 * A warp per channel sums the partials as k_bn_final_tree does (channel c's
 * partial k at part[(c*cs + k*ks)*2]). MODE 0 (forward): sums[c] = sum x,
 * sums[C+c] = sum x^2, unshifted from pass 1's sums around this rank's shift
 * (in double: the shift differs between ranks, so shifted sums could not be
 * added). MODE 1 (backward): sums[c] = sum g, sums[C+c] = sum g * xhat, which
 * are also this rank's dbeta and dgamma (the gradient all-reduce adds the
 * ranks' like any weight gradient). sums[2C] = cnt, this rank's count. */
template <typename T, int MODE>
__global__ void k_bn_sync_sums(const double *__restrict__ part, size_t cs, size_t ks, int nchunks, int C,
                               double cnt, const T *__restrict__ x, size_t shift_stride,
                               const float *__restrict__ sinv, float *__restrict__ dgamma,
                               float *__restrict__ dbeta, double *__restrict__ sums)
{
    const int lane = threadIdx.x & 31;
    const int c = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (c >= C)
        return; /* the whole warp */
    double a, b;
    warp_channel_sums(part, cs, ks, nchunks, c, lane, &a, &b);
    if (lane != 0)
        return;
    if constexpr (MODE == 0) {
        const double sh = (double)cu_f(x[(size_t)c * shift_stride]);
        sums[c] = a + cnt * sh;
        sums[C + c] = b + 2.0 * sh * a + cnt * sh * sh;
    } else {
        const double bx = b * (double)sinv[c];
        dbeta[c] = (float)a;
        dgamma[c] = (float)bx;
        sums[c] = a;
        sums[C + c] = bx;
    }
    if (c == 0)
        sums[2 * C] = cnt;
}

/* The statistics of every rank's samples from their summed sums, with the
 * arithmetic of bn_stats_out (in double, rounded once to float), so that a
 * job of one rank differs from no job only by the sums: mean and biased
 * variance of the whole count, and the running statistics moved with the
 * unbiased variance (a count of 1 leaves it not finite, where PyTorch
 * refuses the batch; a total count of 0, no rank trained, leaves them as
 * they are). */
__global__ void k_bn_sync_stats(const double *__restrict__ sums, int C, float eps, float momentum,
                                float *__restrict__ rmean, float *__restrict__ rvar, float *__restrict__ smean,
                                float *__restrict__ sinv)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    const double cnt = sums[2 * C];
    const double mean = cnt > 0 ? sums[c] / cnt : 0.0;
    double var = cnt > 0 ? sums[C + c] / cnt - mean * mean : 0.0;
    if (var < 0.0)
        var = 0.0;
    smean[c] = (float)mean;
    sinv[c] = (float)(1.0 / sqrt(var + (double)eps));
    if (rmean && rvar && cnt > 0) {
        const double m = (double)momentum;
        rmean[c] = (float)((1.0 - m) * (double)rmean[c] + m * mean);
        rvar[c] = (float)((1.0 - m) * (double)rvar[c] + m * var * cnt / (cnt - 1.0));
    }
}

/* dx's coefficients (as bn_bwd_out's) from every rank's summed backward
 * sums: k1 = gamma*invstd, m1 = sum g / N, k2 = sum(g * xhat) * invstd / N. */
__global__ void k_bn_sync_coef(const double *__restrict__ sums, int C, const float *__restrict__ gamma,
                               const float *__restrict__ sinv, float *__restrict__ coef)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    const double cnt = sums[2 * C], inv = (double)sinv[c];
    coef[c * 3 + 0] = (float)((double)gamma[c] * inv);
    coef[c * 3 + 1] = cnt > 0 ? (float)(sums[c] / cnt) : 0.f;
    coef[c * 3 + 2] = cnt > 0 ? (float)(sums[C + c] * inv / cnt) : 0.f;
}

/* ---- batchnorm over NHWC rows in 16-byte vectors (the bf16 path) ------------ *
 * Rows [R, C], C % V == 0 (V = 16/sizeof(T) channels a thread), tensors
 * 16-byte aligned. A block is G threads across channel vectors by RS =
 * blockDim.x / G rows (thread t: vector g = t % G of row t / G);
 * blockIdx.y picks the block's G channel vectors (bn_rows_geom):
 * - C/V not a power of two and at most CU_TPB: G = C/V, whole rows, so a
 *   block's RS rows are one contiguous span and a warp reads 512 contiguous
 *   bytes; RS = CU_TPB / G (the block has G*RS <= CU_TPB threads).
 *   With G = the lowest set bit of C/V instead, a warp read 16 rows' 32 or 64
 *   bytes each, a row's other vectors came from other blocks at other
 *   times, and 144- to 672-channel maps moved 0.6-1.2 TB/s on an H200
 *   against 1.8-3.5 for whole rows (bench/results/2026-11-29-h200-batchnorm-rows.md);
 * - otherwise G = that lowest set bit, at most 16, and CU_TPB threads: for a
 *   power of two that is the whole row up to 16 vectors (256 bytes, two rows
 *   a warp), and maps of more than CU_TPB vectors a row are split over
 *   blockIdx.y.
 * A thread keeps its channels' parameters in registers and walks rows, so every
 * load is a full 16-byte vector. */

template <typename T> __device__ __forceinline__ uint4 ldrow(const T *p, size_t r, int C)
{
    return *reinterpret_cast<const uint4 *>(p + r * (size_t)C);
}

/* Pass 1 (MODE 0: forward statistics, 1: backward sums; as k_bn_part_nhwc,
 * except that with act the fused activation's derivative is recomputed
 * from x, the saved statistics and gamma/beta (at z = bn_out, the value the
 * forward applied it to) instead of read from y: a third less traffic, and
 * for ReLU the same decision as the forward's, whose output is > 0 exactly
 * when bn_out is (bf16 keeps fp32's exponent range, so no positive value
 * above 2^-134 rounds to zero).
 * Block (chunk, channel block) covers rows [chunk*L, +L). A thread loads U
 * rows, sums their values in fp32 and adds that into double accumulators
 * (bf16 data: the fp32 sum of U values is exact to ~1e-6 relative, and it
 * spares the double conversions, which run at a quarter of the fp32 rate).
 * Then a fixed shuffle tree over a warp's rows, and warp order through shared
 * memory. part[c][chunk][2]. */
template <typename T, int MODE, int A>
__global__ void __launch_bounds__(CU_TPB)
    k_bn_part_rows(const T *__restrict__ x, const T *__restrict__ dy, const float *__restrict__ mean,
                   const float *__restrict__ sinv, const float *__restrict__ gamma, const float *__restrict__ beta,
                   int C, int G, size_t R, size_t L, int nchunks, double *__restrict__ part)
{
    constexpr int V = 16 / sizeof(T);
    constexpr int U = MODE == 0 ? 8 : 4;
    __shared__ double red[CU_TPB * V];
    const int tid = threadIdx.x, g = tid % G, rl = tid / G, RS = blockDim.x / G;
    const int c0 = (blockIdx.y * G + g) * V;
    const size_t r0 = (size_t)blockIdx.x * L;
    const size_t r1 = r0 + L < R ? r0 + L : R;
    const T *xp = x + c0;
    const T *dp = MODE == 1 ? dy + c0 : NULL;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    /* MODE 0: rows past the chunk read as the shift row, so they add 0 */
    uint4 pad = zero;
    float sh[V], iv[V], ga[V], be[V];
    if constexpr (MODE == 0) {
        pad = ldrow(xp, 0, C);
        cu_unpack<T>(pad, sh);
    } else {
#pragma unroll
        for (int v = 0; v < V; v++) {
            sh[v] = mean[c0 + v];
            iv[v] = A ? sinv[c0 + v] : 0.f;
            ga[v] = A ? gamma[c0 + v] : 0.f;
            be[v] = A ? beta[c0 + v] : 0.f;
        }
    }
    double da[V], db[V];
#pragma unroll
    for (int v = 0; v < V; v++) {
        da[v] = 0.0;
        db[v] = 0.0;
    }
    for (size_t r = r0 + rl; r < r1; r += (size_t)RS * U) {
        /* every load issued before any is used: rows past the chunk load
         * row r (in range) and are replaced by `pad` / zero afterwards */
        uint4 rx[U], rg[U];
        bool in[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const size_t rr = r + (size_t)u * RS;
            in[u] = rr < r1;
            const size_t rc = in[u] ? rr : r;
            rx[u] = ldrow(xp, rc, C);
            if constexpr (MODE == 1)
                rg[u] = ldrow(dp, rc, C);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (!in[u]) {
                rx[u] = pad;
                rg[u] = zero;
            }
        float fa[V], fb[V];
#pragma unroll
        for (int v = 0; v < V; v++) {
            fa[v] = 0.f;
            fb[v] = 0.f;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            float xv[V];
            cu_unpack<T>(rx[u], xv);
            if constexpr (MODE == 0) {
#pragma unroll
                for (int v = 0; v < V; v++) {
                    const float d = xv[v] - sh[v];
                    fa[v] += d;
                    fb[v] += d * d;
                }
            } else {
                float gv[V];
                cu_unpack<T>(rg[u], gv);
                if constexpr (A != 0) {
#pragma unroll
                    for (int v = 0; v < V; v++)
                        gv[v] = bn_act_g<A>(bn_out(xv[v], sh[v], iv[v], ga[v], be[v]), gv[v]);
                }
#pragma unroll
                for (int v = 0; v < V; v++) {
                    fa[v] += gv[v];
                    fb[v] += gv[v] * (xv[v] - sh[v]);
                }
            }
        }
#pragma unroll
        for (int v = 0; v < V; v++) {
            da[v] += (double)fa[v];
            db[v] += (double)fb[v];
        }
    }
    double *o = part + (size_t)blockIdx.y * G * V * nchunks * 2 + (size_t)blockIdx.x * 2;
    if (32 % G == 0) {
        /* lanes l, l+G, l+2G, ... of a warp hold the same channels */
        for (int o2 = 16; o2 >= G; o2 >>= 1) {
#pragma unroll
            for (int v = 0; v < V; v++) {
                da[v] += __shfl_down_sync(0xffffffffu, da[v], o2);
                db[v] += __shfl_down_sync(0xffffffffu, db[v], o2);
            }
        }
        const int lane = tid & 31, warp = tid >> 5;
        if (lane < G) {
#pragma unroll
            for (int v = 0; v < V; v++) {
                red[warp * (16 * V * 2) + (lane * V + v) * 2] = da[v];
                red[warp * (16 * V * 2) + (lane * V + v) * 2 + 1] = db[v];
            }
        }
        __syncthreads();
        if (tid < G * V) {
            double a = 0.0, b = 0.0;
            for (int w = 0; w < (int)(blockDim.x >> 5); w++) {
                a += red[w * (16 * V * 2) + tid * 2];
                b += red[w * (16 * V * 2) + tid * 2 + 1];
            }
            o[(size_t)tid * nchunks * 2] = a;
            o[(size_t)tid * nchunks * 2 + 1] = b;
        }
        return;
    }
    /* whole rows (G = C/V, not a power of two): rows rl = 0..RS-1 of each
     * channel vector summed in row order through shared memory, one of the
     * two sums at a time (the block's G*RS*V doubles fill red) */
#pragma unroll
    for (int k = 0; k < 2; k++) {
#pragma unroll
        for (int v = 0; v < V; v++)
            red[tid * V + v] = k ? db[v] : da[v];
        __syncthreads();
        for (int ch = tid; ch < G * V; ch += blockDim.x) {
            double a = 0.0;
            for (int q = 0; q < RS; q++)
                a += red[q * G * V + ch];
            o[(size_t)ch * nchunks * 2 + k] = a;
        }
        __syncthreads();
    }
}

/* Forward apply over rows (train: mean/sinv; eval: mean = running mean,
 * invstd from rvar), as k_bn_apply (res included). Grid (row blocks, C/V/G);
 * grid-stride over rows, CU_UNROLL rows loaded before any is stored. */
template <typename T, int A>
__global__ void __launch_bounds__(CU_TPB)
    k_bn_apply_rows(const T *__restrict__ x, size_t R, int C, int G, const float *__restrict__ mean,
                    const float *__restrict__ sinv, const float *__restrict__ rvar, float eps,
                    const float *__restrict__ gamma, const float *__restrict__ beta, const T *__restrict__ res,
                    T *__restrict__ y)
{
    constexpr int V = 16 / sizeof(T);
    const int tid = threadIdx.x, g = tid % G, rl = tid / G, RS = blockDim.x / G;
    const int c0 = (blockIdx.y * G + g) * V;
    float mu[V], iv[V], ga[V], be[V];
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int c = c0 + v;
        mu[v] = mean[c];
        iv[v] = rvar ? 1.f / sqrtf(rvar[c] + eps) : sinv[c];
        ga[v] = gamma[c];
        be[v] = beta[c];
    }
    const T *xp = x + c0, *rp = res ? res + c0 : NULL;
    T *yp = y + c0;
    const size_t step = (size_t)gridDim.x * RS;
    size_t r = (size_t)blockIdx.x * RS + rl;
    for (; r + (CU_UNROLL - 1) * step < R; r += CU_UNROLL * step) {
        uint4 raw[CU_UNROLL], rr[CU_UNROLL];
#pragma unroll
        for (int q = 0; q < CU_UNROLL; q++) {
            raw[q] = ldrow(xp, r + q * step, C);
            if (rp)
                rr[q] = ldrow(rp, r + q * step, C);
        }
#pragma unroll
        for (int q = 0; q < CU_UNROLL; q++) {
            float v[V], rv[V];
            cu_unpack<T>(raw[q], v);
            if (rp)
                cu_unpack<T>(rr[q], rv);
#pragma unroll
            for (int j = 0; j < V; j++) {
                float o = bn_out(v[j], mu[j], iv[j], ga[j], be[j]);
                if (rp)
                    o += rv[j];
                if constexpr (A != 0)
                    o = bn_act_f<A>(o);
                v[j] = o;
            }
            *reinterpret_cast<uint4 *>(yp + (r + q * step) * (size_t)C) = cu_pack<T>(v);
        }
    }
    for (; r < R; r += step) {
        float v[V], rv[V];
        cu_unpack<T>(ldrow(xp, r, C), v);
        if (rp)
            cu_unpack<T>(ldrow(rp, r, C), rv);
#pragma unroll
        for (int j = 0; j < V; j++) {
            float o = bn_out(v[j], mu[j], iv[j], ga[j], be[j]);
            if (rp)
                o += rv[j];
            if constexpr (A != 0)
                o = bn_act_f<A>(o);
            v[j] = o;
        }
        *reinterpret_cast<uint4 *>(yp + r * (size_t)C) = cu_pack<T>(v);
    }
}

/* Backward dx over rows, as k_bn_dx, with the fused activation's derivative
 * recomputed from x (as k_bn_part_rows) when act. */
template <typename T, int A>
__global__ void __launch_bounds__(CU_TPB)
    k_bn_dx_rows(const T *__restrict__ x, const T *__restrict__ dy, size_t R, int C, int G,
                 const float *__restrict__ mean, const float *__restrict__ sinv, const float *__restrict__ gamma,
                 const float *__restrict__ beta, const float *__restrict__ coef, T *__restrict__ dx)
{
    constexpr int V = 16 / sizeof(T);
    const int tid = threadIdx.x, g = tid % G, rl = tid / G, RS = blockDim.x / G;
    const int c0 = (blockIdx.y * G + g) * V;
    float mu[V], k1[V], m1[V], k2[V], iv[V], ga[V], be[V];
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int c = c0 + v;
        mu[v] = mean[c];
        k1[v] = coef[c * 3];
        m1[v] = coef[c * 3 + 1];
        k2[v] = coef[c * 3 + 2];
        iv[v] = A ? sinv[c] : 0.f;
        ga[v] = A ? gamma[c] : 0.f;
        be[v] = A ? beta[c] : 0.f;
    }
    const T *xp = x + c0, *dp = dy + c0;
    T *op = dx + c0;
    const size_t step = (size_t)gridDim.x * RS;
    size_t r = (size_t)blockIdx.x * RS + rl;
    for (; r + (CU_UNROLL - 1) * step < R; r += CU_UNROLL * step) {
        uint4 rx[CU_UNROLL], rg[CU_UNROLL];
#pragma unroll
        for (int q = 0; q < CU_UNROLL; q++) {
            rx[q] = ldrow(xp, r + q * step, C);
            rg[q] = ldrow(dp, r + q * step, C);
        }
#pragma unroll
        for (int q = 0; q < CU_UNROLL; q++) {
            float xv[V], gv[V];
            cu_unpack<T>(rx[q], xv);
            cu_unpack<T>(rg[q], gv);
#pragma unroll
            for (int j = 0; j < V; j++) {
                if constexpr (A != 0)
                    gv[j] = bn_act_g<A>(bn_out(xv[j], mu[j], iv[j], ga[j], be[j]), gv[j]);
                xv[j] = k1[j] * (gv[j] - m1[j] - (xv[j] - mu[j]) * k2[j]);
            }
            *reinterpret_cast<uint4 *>(op + (r + q * step) * (size_t)C) = cu_pack<T>(xv);
        }
    }
    for (; r < R; r += step) {
        float xv[V], gv[V];
        cu_unpack<T>(ldrow(xp, r, C), xv);
        cu_unpack<T>(ldrow(dp, r, C), gv);
#pragma unroll
        for (int j = 0; j < V; j++) {
            if constexpr (A != 0)
                gv[j] = bn_act_g<A>(bn_out(xv[j], mu[j], iv[j], ga[j], be[j]), gv[j]);
            xv[j] = k1[j] * (gv[j] - m1[j] - (xv[j] - mu[j]) * k2[j]);
        }
        *reinterpret_cast<uint4 *>(op + r * (size_t)C) = cu_pack<T>(xv);
    }
}

/* Calls f with act as a compile-time constant (std::integral_constant), the
 * kernels' template argument A: one instantiation per batchnorm.h code. */
template <class F> static void bn_with_act(int act, F f)
{
    switch (act) {
    case 0: f(std::integral_constant<int, 0>()); break;
    case SF_BN_RELU: f(std::integral_constant<int, SF_BN_RELU>()); break;
    case SF_BN_ACT(SF_CUDA_ACT_RELU6): f(std::integral_constant<int, SF_BN_ACT(SF_CUDA_ACT_RELU6)>()); break;
    case SF_BN_ACT(SF_CUDA_ACT_SIGMOID): f(std::integral_constant<int, SF_BN_ACT(SF_CUDA_ACT_SIGMOID)>()); break;
    case SF_BN_ACT(SF_CUDA_ACT_SILU): f(std::integral_constant<int, SF_BN_ACT(SF_CUDA_ACT_SILU)>()); break;
    case SF_BN_ACT(SF_CUDA_ACT_HARDSWISH): f(std::integral_constant<int, SF_BN_ACT(SF_CUDA_ACT_HARDSWISH)>()); break;
    case SF_BN_ACT(SF_CUDA_ACT_HARDSIGMOID):
        f(std::integral_constant<int, SF_BN_ACT(SF_CUDA_ACT_HARDSIGMOID)>());
        break;
    case SF_BN_ACT(SF_CUDA_ACT_GELU): f(std::integral_constant<int, SF_BN_ACT(SF_CUDA_ACT_GELU)>()); break;
    case SF_BN_ACT(SF_CUDA_ACT_GELU_TANH):
        f(std::integral_constant<int, SF_BN_ACT(SF_CUDA_ACT_GELU_TANH)>());
        break;
    default: f(std::integral_constant<int, SF_BN_ACT(SF_CUDA_ACT_TANH)>()); break;
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

/* The chunking of the per-channel reductions: a function of the shape only. */
typedef struct bn_plan {
    int nhwc;
    size_t hw, E;     /* E = n*h*w elements per channel (= rows R for NHWC) */
    int nchunks;
    size_t L;         /* NCHW: elements per chunk (a multiple of 4); NHWC: rows per chunk */
} bn_plan;

static bn_plan bn_plan_of(int n, int c, int h, int w, sf_layout lay)
{
    bn_plan p;
    p.nhwc = lay == SF_LAYOUT_NHWC;
    p.hw = (size_t)h * w;
    p.E = (size_t)n * p.hw;
    if (!p.nhwc) {
        size_t want = cu_cdiv(CU_RED_BLOCKS, (size_t)c);
        const size_t most = cu_cdiv(p.E, 2048); /* at least 2048 elements a block */
        if (want > most)
            want = most;
        if (want < 1)
            want = 1;
        p.L = (cu_cdiv(p.E, want) + 3) & ~(size_t)3;
        p.nchunks = (int)cu_cdiv(p.E, p.L);
    } else {
        const size_t gx = cu_cdiv((size_t)c, 4 * CU_TPB); /* blocks across channels */
        size_t want = cu_cdiv(CU_RED_BLOCKS, gx);
        const size_t most = cu_cdiv(p.E, 64); /* at least 64 rows a block */
        if (want > most)
            want = most;
        if (want < 1)
            want = 1;
        p.L = cu_cdiv(p.E, want);
        p.nchunks = (int)cu_cdiv(p.E, p.L);
    }
    return p;
}

/* The bf16 plan: never more chunks than the fp32 plan of the shape (whose
 * partials sf_cuda_bn_scratch_bytes sizes). NCHW chunks hold whole 16-byte
 * vectors (a multiple of 8 elements); the NHWC row kernels (rows) take at
 * least 128 rows a chunk, so the partials stay a few percent of the data. */
static void bn_plan_bf16(bn_plan *p, int rows)
{
    if (!p->nhwc)
        p->L = (p->L + 7) & ~(size_t)7;
    else if (rows && p->L < 128)
        p->L = 128;
    p->nchunks = (int)cu_cdiv(p->E, p->L);
}

extern "C" size_t sf_cuda_bn_scratch_bytes(int n, int c, int h, int w, sf_layout lay)
{
    const bn_plan p = bn_plan_of(n, c, h, w, lay);
    /* partials [nchunks][c][2] doubles, then coef [c][3] floats */
    return sizeof(double) * 2 * (size_t)p.nchunks * c + sizeof(float) * 3 * (size_t)c + 16;
}

static int bn_check(const char *fn, int n, int c, int h, int w)
{
    if (n < 1 || c < 1 || h < 1 || w < 1 || (double)n * c * h * w >= 4294967296.0) {
        sf_cuda_set_error("%s:%d: %s: n=%d c=%d h=%d w=%d", __FILE__, __LINE__, fn, n, c, h, w);
        return -1;
    }
    return 0;
}

/* Launches pass 1 of a per-channel reduction (mode 0 forward, 1 backward)
 * with the generic kernels: part[chunk][c]. */
template <typename T>
static int bn_partials(const bn_plan &p, const T *x, const T *dy, const T *y, const float *mean, int c, int mode,
                       double *part, cudaStream_t s)
{
    constexpr int VEC = 16 / sizeof(T);
    const int al = cu_al16(x) && (mode == 0 || (cu_al16(dy) && (!y || cu_al16(y))));
    if (!p.nhwc) {
        dim3 grid((unsigned)c, (unsigned)p.nchunks);
        if (p.hw % VEC == 0 && al)
            k_bn_part_nchw<T, VEC><<<grid, CU_TPB, 0, s>>>(x, dy, y, mean, c, p.hw, p.E, p.L, mode, part);
        else
            k_bn_part_nchw<T, 1><<<grid, CU_TPB, 0, s>>>(x, dy, y, mean, c, p.hw, p.E, p.L, mode, part);
    } else {
        /* fp32: 4 channels a thread when they fit; bf16 comes here only
         * when the row kernels cannot take it, one channel a thread */
        const int V = (sizeof(T) == 4 && c % 4 == 0 && al) ? 4 : 1;
        const int Cv = c / V;
        const int G = Cv < CU_TPB ? Cv : CU_TPB;
        const int RS = CU_TPB / G;
        dim3 grid((unsigned)((Cv + G - 1) / G), (unsigned)p.nchunks);
        const unsigned threads = (unsigned)(G * RS);
        const size_t shm = sizeof(double) * 2 * threads * V;
        if constexpr (sizeof(T) == 4) {
            if (V == 4) {
                k_bn_part_nhwc<T, 4><<<grid, threads, shm, s>>>(x, dy, y, mean, c, p.E, p.L, mode, part);
                SF_CUDA_CHECK_LAUNCH();
                return 0;
            }
        }
        k_bn_part_nhwc<T, 1><<<grid, threads, shm, s>>>(x, dy, y, mean, c, p.E, p.L, mode, part);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* Whether the generic elementwise kernels can take V elements at a time. */
static int bn_vec(const bn_plan &p, int c, int V, const void *a, const void *b, const void *d, const void *e)
{
    const int shape = p.nhwc ? c % V == 0 : p.hw % (size_t)V == 0;
    return shape && cu_al16(a) && cu_al16(b) && (!d || cu_al16(d)) && (!e || cu_al16(e));
}

/* The NHWC row kernels' block (k_bn_*_rows; the geometry is described above
 * k_bn_part_rows): G channel vectors across, `threads` threads, gy blocks
 * across the channels. */
typedef struct bn_rows_geo {
    int G, threads;
    unsigned gy;
} bn_rows_geo;

static bn_rows_geo bn_rows_geom(int c, int V)
{
    const int cv = c / V, low = cv & -cv;
    bn_rows_geo r;
    if (cv != low && cv <= CU_TPB) {
        r.G = cv;
        r.threads = cv * (CU_TPB / cv);
    } else {
        r.G = low < 16 ? low : 16;
        r.threads = CU_TPB;
    }
    r.gy = (unsigned)(cv / r.G);
    return r;
}

/* The shape half of the row kernels' condition (the bf16 row kernels). */
static int bn_rows_shape(int nhwc, int c) { return nhwc && c % 8 == 0 && bn_rows_geom(c, 8).gy <= 65535; }

/* Whether the row kernels take a bf16 tensor: NHWC, C % 8 == 0, aligned. */
static int bn_rows_ok(const bn_plan &p, int c, const void *a, const void *b, const void *d, const void *e)
{
    return bn_rows_shape(p.nhwc, c) && cu_al16(a) && cu_al16(b) && (!d || cu_al16(d)) && (!e || cu_al16(e));
}

extern "C" int sf_cuda_bn_bwd_reads_y(sf_dtype dt, sf_layout lay, int c)
{
    return !(dt == SF_DT_BF16 && bn_rows_shape(lay == SF_LAYOUT_NHWC, c));
}

/* Grid of the elementwise row kernels: ~16 rows a thread, but at least a
 * device's worth of blocks when there are rows for them. */
static dim3 bn_rows_grid(size_t R, const bn_rows_geo &g)
{
    const int RS = g.threads / g.G;
    size_t gx = cu_cdiv(R, (size_t)RS * 16);
    const size_t fill = cu_cdiv((size_t)cu_sms() * (2048 / g.threads), g.gy);
    const size_t most = cu_cdiv(R, (size_t)RS);
    if (gx < fill)
        gx = fill;
    if (gx > most)
        gx = most;
    if (gx > 0x7fffffffu)
        gx = 0x7fffffffu;
    return dim3((unsigned)gx, g.gy);
}

/* Pass 1 of the backward sums on the row kernels, act's derivative
 * recomputed from x: part[c][chunk]. */
template <typename T>
static void bn_bwd_partials_rows(const bn_plan &p, int c, int act, const T *x, const T *dy, const float *mean,
                                 const float *sinv, const float *gamma, const float *beta, double *part,
                                 cudaStream_t s)
{
    if constexpr (sizeof(T) == 2) {
        const bn_rows_geo g = bn_rows_geom(c, 16 / sizeof(T));
        bn_with_act(act, [&](auto a) {
            k_bn_part_rows<T, 1, decltype(a)::value><<<dim3((unsigned)p.nchunks, g.gy), g.threads, 0, s>>>(
                x, dy, mean, sinv, gamma, beta, c, g.G, p.E, p.L, p.nchunks, part);
        });
    }
}

/* The normalisation y = act(bn(x) (+ res)) with mean/sinv (training) or
 * the running statistics (rvar given: eval), on the row kernels where they
 * take the tensors, else the generic elementwise ones. */
template <typename T>
static int bn_apply_t(const bn_plan &p, const T *x, int c, const float *mean, const float *sinv, const float *rvar,
                      float eps, const float *gamma, const float *beta, const T *res, T *y, int act, cudaStream_t s)
{
    constexpr bool BF = sizeof(T) == 2;
    constexpr int VEC = 16 / sizeof(T);
    const size_t len = (size_t)c * p.E;
    if (act < 0 || act > SF_BN_ACT_LAST) {
        sf_cuda_set_error("%s:%d: batchnorm: act %d is no fused activation", __FILE__, __LINE__, act);
        return -1;
    }
    const int rows = BF && bn_rows_ok(p, c, x, y, res, NULL), vec = !rows && bn_vec(p, c, VEC, x, y, res, NULL);
    bn_with_act(act, [&](auto a) {
        constexpr int A = decltype(a)::value;
        if (rows) {
            if constexpr (BF) {
                const bn_rows_geo g = bn_rows_geom(c, VEC);
                k_bn_apply_rows<T, A><<<bn_rows_grid(p.E, g), g.threads, 0, s>>>(x, p.E, c, g.G, mean, sinv, rvar,
                                                                                  eps, gamma, beta, res, y);
            }
        } else if (vec) {
            k_bn_apply<T, VEC, A><<<cu_blocks(len / VEC, CU_TPB), CU_TPB, 0, s>>>(x, len / VEC, c, p.hw, p.nhwc, mean,
                                                                                sinv, rvar, eps, gamma, beta, res, y);
        } else {
            k_bn_apply<T, 1, A><<<cu_blocks(len, CU_TPB), CU_TPB, 0, s>>>(x, len, c, p.hw, p.nhwc, mean, sinv, rvar,
                                                                        eps, gamma, beta, res, y);
        }
    });
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* dx from the coefficients coef[c][3] (rows: the bf16 NHWC row kernel, which
 * recomputes a ReLU mask from x; else the generic kernel, which reads y). */
template <typename T>
static int bn_dx_t(const bn_plan &p, int rows, const T *x, int c, const float *gamma, const float *beta,
                   const float *save_mean, const float *save_invstd, const T *dy, const T *y, int act,
                   const float *coef, T *dx, cudaStream_t s)
{
    constexpr bool BF = sizeof(T) == 2;
    constexpr int VEC = 16 / sizeof(T);
    const size_t len = (size_t)c * p.E;
    if (rows) {
        if constexpr (BF) {
            const bn_rows_geo g = bn_rows_geom(c, VEC);
            bn_with_act(act, [&](auto a) {
                k_bn_dx_rows<T, decltype(a)::value><<<bn_rows_grid(p.E, g), g.threads, 0, s>>>(
                    x, dy, p.E, c, g.G, save_mean, save_invstd, gamma, beta, coef, dx);
            });
        }
    } else if (bn_vec(p, c, VEC, x, dy, dx, y))
        k_bn_dx<T, VEC><<<cu_blocks(len / VEC, CU_TPB), CU_TPB, 0, s>>>(x, dy, y, len / VEC, c, p.hw, p.nhwc,
                                                                    save_mean, coef, dx);
    else
        k_bn_dx<T, 1><<<cu_blocks(len, CU_TPB), CU_TPB, 0, s>>>(x, dy, y, len, c, p.hw, p.nhwc, save_mean, coef, dx);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* The statistics' first pass: x's per-chunk (shifted) sums into part, by
 * rows of channels (bf16 with rows set: part[c][chunk]) or by the generic
 * chunks (part[chunk][c]). */
template <typename T>
static int bn_stat_partials(const bn_plan &p, int c, const T *x, int rows, double *part, cudaStream_t s)
{
    if (rows) {
        if constexpr (sizeof(T) == 2) {
            const bn_rows_geo g = bn_rows_geom(c, 16 / sizeof(T));
            k_bn_part_rows<T, 0, 0><<<dim3((unsigned)p.nchunks, g.gy), g.threads, 0, s>>>(
                x, NULL, NULL, NULL, NULL, NULL, c, g.G, p.E, p.L, p.nchunks, part);
            SF_CUDA_CHECK_LAUNCH();
        }
        return 0;
    }
    return bn_partials<T>(p, x, NULL, NULL, NULL, c, 0, part, s) ? -1 : 0;
}

template <typename T>
static int bn_fwd_train_t(const char *fn, const T *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                          const float *beta, float eps, float momentum, float *running_mean, float *running_var,
                          float *save_mean, float *save_invstd, const T *res, T *y, int act, void *scratch,
                          cudaStream_t s)
{
    constexpr bool BF = sizeof(T) == 2;
    if (bn_check(fn, n, c, h, w))
        return -1;
    bn_plan p = bn_plan_of(n, c, h, w, lay);
    if (p.E < 2) {
        sf_cuda_set_error("%s:%d: %s: one value per channel (n*h*w=%zu)", __FILE__, __LINE__, fn, p.E);
        return -1;
    }
    const int rows = BF && bn_rows_ok(p, c, x, y, res, NULL);
    if (BF)
        bn_plan_bf16(&p, rows);
    double *part = (double *)scratch;
    if (bn_stat_partials<T>(p, c, x, rows, part, s))
        return -1;
    if constexpr (BF) {
        /* rows: part[c][chunk]; generic: part[chunk][c] */
        k_bn_final_tree<T, 0><<<cu_blocks((size_t)c * 32, CU_TPB), CU_TPB, 0, s>>>(
            part, rows ? (size_t)p.nchunks : 1, rows ? 1 : (size_t)c, p.nchunks, c, (double)p.E, x,
            p.nhwc ? 1 : p.hw, eps, momentum, running_mean, running_var, save_mean, save_invstd, NULL, NULL, NULL,
            NULL, NULL);
    } else {
        k_bn_stats_final<<<cu_blocks((size_t)c, CU_TPB), CU_TPB, 0, s>>>(part, p.nchunks, c, (double)p.E, x,
                                                                       p.nhwc ? 1 : p.hw, eps, momentum,
                                                                       running_mean, running_var, save_mean,
                                                                       save_invstd);
    }
    SF_CUDA_CHECK_LAUNCH();
    if (!y) /* the statistics only: the reader applies the normalisation itself */
        return 0;
    return bn_apply_t<T>(p, x, c, save_mean, save_invstd, NULL, eps, gamma, beta, res, y, act, s);
}

template <typename T>
static int bn_fwd_eval_t(const char *fn, const T *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                         const float *beta, float eps, const float *running_mean, const float *running_var,
                         const T *res, T *y, int act, cudaStream_t s)
{
    if (bn_check(fn, n, c, h, w))
        return -1;
    const bn_plan p = bn_plan_of(n, c, h, w, lay);
    return bn_apply_t<T>(p, x, c, running_mean, NULL, running_var, eps, gamma, beta, res, y, act, s);
}

template <typename T>
static int bn_bwd_t(const char *fn, const T *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                    const float *beta, const float *save_mean, const float *save_invstd, const T *dy, const T *y,
                    int act, T *dx, float *dgamma, float *dbeta, void *scratch, cudaStream_t s)
{
    constexpr bool BF = sizeof(T) == 2;
    if (bn_check(fn, n, c, h, w))
        return -1;
    bn_plan p = bn_plan_of(n, c, h, w, lay);
    /* the row kernels recompute the activation's derivative (they need beta
     * for it); the others read a ReLU's mask from y, and know no other */
    const int rows = BF && (!act || beta) && bn_rows_ok(p, c, x, dy, dx, NULL);
    if (act > SF_BN_RELU && !rows) {
        sf_cuda_set_error("%s:%d: %s: a fused activation other than ReLU needs the bf16 NHWC row kernels (c %% 8 "
                          "== 0, beta, 16-byte aligned x, dy and dx); c=%d", __FILE__, __LINE__, fn, c);
        return -1;
    }
    if (BF)
        bn_plan_bf16(&p, rows);
    double *part = (double *)scratch;
    float *coef = (float *)(part + 2 * (size_t)p.nchunks * c);
    if (rows) {
        bn_bwd_partials_rows<T>(p, c, act, x, dy, save_mean, save_invstd, gamma, beta, part, s);
        SF_CUDA_CHECK_LAUNCH();
    } else if (bn_partials<T>(p, x, dy, y, save_mean, c, 1, part, s)) {
        return -1;
    }
    if constexpr (BF)
        k_bn_final_tree<T, 1><<<cu_blocks((size_t)c * 32, CU_TPB), CU_TPB, 0, s>>>(
            part, rows ? (size_t)p.nchunks : 1, rows ? 1 : (size_t)c, p.nchunks, c, (double)p.E, x, 0, 0.f, 0.f,
            NULL, NULL, NULL, NULL, gamma, save_invstd, dgamma, dbeta, coef);
    else
        k_bn_bwd_final<<<cu_blocks((size_t)c, CU_TPB), CU_TPB, 0, s>>>(part, p.nchunks, c, (double)p.E, gamma,
                                                                     save_invstd, dgamma, dbeta, coef);
    SF_CUDA_CHECK_LAUNCH();
    return bn_dx_t<T>(p, rows, x, c, gamma, beta, save_mean, save_invstd, dy, y, act, coef, dx, s);
}

extern "C" int sf_cuda_bn_fwd_train(const float *x, int n, int c, int h, int w, sf_layout lay,
                                    const float *gamma, const float *beta, float eps, float momentum,
                                    float *running_mean, float *running_var, float *save_mean,
                                    float *save_invstd, float *y, int act, void *scratch, cudaStream_t s)
{
    return bn_fwd_train_t<float>("sf_cuda_bn_fwd_train", x, n, c, h, w, lay, gamma, beta, eps, momentum,
                                 running_mean, running_var, save_mean, save_invstd, NULL, y, act, scratch, s);
}

extern "C" int sf_cuda_bn_fwd_eval(const float *x, int n, int c, int h, int w, sf_layout lay,
                                   const float *gamma, const float *beta, float eps, const float *running_mean,
                                   const float *running_var, float *y, int act, cudaStream_t s)
{
    return bn_fwd_eval_t<float>("sf_cuda_bn_fwd_eval", x, n, c, h, w, lay, gamma, beta, eps, running_mean,
                                running_var, NULL, y, act, s);
}

extern "C" int sf_cuda_bn_bwd(const float *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                              const float *save_mean, const float *save_invstd, const float *dy,
                              const float *y, float *dx, float *dgamma, float *dbeta, void *scratch,
                              cudaStream_t s)
{
    return bn_bwd_t<float>("sf_cuda_bn_bwd", x, n, c, h, w, lay, gamma, NULL, save_mean, save_invstd, dy, y,
                           y ? SF_BN_RELU : 0, dx,
                           dgamma, dbeta, scratch, s);
}

extern "C" int sf_cuda_bn_fwd_train_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                       const float *gamma, const float *beta, float eps, float momentum,
                                       float *running_mean, float *running_var, float *save_mean,
                                       float *save_invstd, const void *res, void *y, int act, void *scratch,
                                       cudaStream_t s)
{
    const char *fn = "sf_cuda_bn_fwd_train_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return bn_fwd_train_t<cu_bf16>(fn, (const cu_bf16 *)x, n, c, h, w, lay, gamma, beta, eps, momentum,
                                      running_mean, running_var, save_mean, save_invstd, (const cu_bf16 *)res,
                                      (cu_bf16 *)y, act, scratch, s);
    return bn_fwd_train_t<float>(fn, (const float *)x, n, c, h, w, lay, gamma, beta, eps, momentum, running_mean,
                                 running_var, save_mean, save_invstd, (const float *)res, (float *)y, act, scratch,
                                 s);
}

extern "C" int sf_cuda_bn_fwd_eval_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                      const float *gamma, const float *beta, float eps, const float *running_mean,
                                      const float *running_var, const void *res, void *y, int act, cudaStream_t s)
{
    const char *fn = "sf_cuda_bn_fwd_eval_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return bn_fwd_eval_t<cu_bf16>(fn, (const cu_bf16 *)x, n, c, h, w, lay, gamma, beta, eps, running_mean,
                                     running_var, (const cu_bf16 *)res, (cu_bf16 *)y, act, s);
    return bn_fwd_eval_t<float>(fn, (const float *)x, n, c, h, w, lay, gamma, beta, eps, running_mean, running_var,
                                (const float *)res, (float *)y, act, s);
}

extern "C" int sf_cuda_bn_bwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                 const float *gamma, const float *beta, const float *save_mean,
                                 const float *save_invstd, const void *dy, const void *y, void *dx, float *dgamma,
                                 float *dbeta, void *scratch, cudaStream_t s)
{
    const char *fn = "sf_cuda_bn_bwd_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return bn_bwd_t<cu_bf16>(fn, (const cu_bf16 *)x, n, c, h, w, lay, gamma, beta, save_mean, save_invstd,
                                (const cu_bf16 *)dy, (const cu_bf16 *)y, y ? SF_BN_RELU : 0, (cu_bf16 *)dx, dgamma,
                                dbeta, scratch, s);
    return bn_bwd_t<float>(fn, (const float *)x, n, c, h, w, lay, gamma, beta, save_mean, save_invstd,
                           (const float *)dy, (const float *)y, y ? SF_BN_RELU : 0, (float *)dx, dgamma, dbeta, scratch,
                           s);
}

extern "C" int sf_cuda_bn_bwd_act_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                     const float *gamma, const float *beta, const float *save_mean,
                                     const float *save_invstd, const void *dy, int act, void *dx, float *dgamma,
                                     float *dbeta, void *scratch, cudaStream_t s)
{
    const char *fn = "sf_cuda_bn_bwd_act_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (act < SF_BN_RELU || act > SF_BN_ACT_LAST) {
        sf_cuda_set_error("%s:%d: %s: act %d is no fused activation", __FILE__, __LINE__, fn, act);
        return -1;
    }
    if (dt == SF_DT_BF16)
        return bn_bwd_t<cu_bf16>(fn, (const cu_bf16 *)x, n, c, h, w, lay, gamma, beta, save_mean, save_invstd,
                                (const cu_bf16 *)dy, NULL, act, (cu_bf16 *)dx, dgamma, dbeta, scratch, s);
    return bn_bwd_t<float>(fn, (const float *)x, n, c, h, w, lay, gamma, beta, save_mean, save_invstd,
                           (const float *)dy, NULL, act, (float *)dx, dgamma, dbeta, scratch, s);
}

/* ---- distributed.batchnorm sync ----------------------------------------------- */

/* n == 0 (a rank's round without a batch) contributes zeros and a count of 0. */
static int bn_sync_zero(const char *fn, int c, double *sums, cudaStream_t s)
{
    if (c < 1) {
        sf_cuda_set_error("%s:%d: %s: c=%d", __FILE__, __LINE__, fn, c);
        return -1;
    }
    SF_CUDA_CHECK(cudaMemsetAsync(sums, 0, sizeof(double) * (2 * (size_t)c + 1), s));
    return 0;
}

template <typename T>
static int bn_sync_fwd_sums_t(const char *fn, const T *x, int n, int c, int h, int w, sf_layout lay, double *sums,
                              void *scratch, cudaStream_t s)
{
    constexpr bool BF = sizeof(T) == 2;
    if (n == 0)
        return bn_sync_zero(fn, c, sums, s);
    if (bn_check(fn, n, c, h, w))
        return -1;
    bn_plan p = bn_plan_of(n, c, h, w, lay);
    const int rows = BF && bn_rows_ok(p, c, x, x, NULL, NULL);
    if (BF)
        bn_plan_bf16(&p, rows);
    double *part = (double *)scratch;
    if (bn_stat_partials<T>(p, c, x, rows, part, s))
        return -1;
    /* rows: part[c][chunk]; generic: part[chunk][c] */
    k_bn_sync_sums<T, 0><<<cu_blocks((size_t)c * 32, CU_TPB), CU_TPB, 0, s>>>(
        part, rows ? (size_t)p.nchunks : 1, rows ? 1 : (size_t)c, p.nchunks, c, (double)p.E, x, p.nhwc ? 1 : p.hw,
        NULL, NULL, NULL, sums);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int bn_sync_fwd_t(const char *fn, const T *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                         const float *beta, float eps, float momentum, const double *sums, float *running_mean,
                         float *running_var, float *save_mean, float *save_invstd, const T *res, T *y, int act,
                         cudaStream_t s)
{
    if (n == 0 ? c < 1 : bn_check(fn, n, c, h, w) != 0) {
        sf_cuda_set_error("%s:%d: %s: n=%d c=%d h=%d w=%d", __FILE__, __LINE__, fn, n, c, h, w);
        return -1;
    }
    k_bn_sync_stats<<<cu_blocks((size_t)c, CU_TPB), CU_TPB, 0, s>>>(sums, c, eps, momentum, running_mean,
                                                                   running_var, save_mean, save_invstd);
    SF_CUDA_CHECK_LAUNCH();
    if (n == 0 || !y)
        return 0;
    const bn_plan p = bn_plan_of(n, c, h, w, lay);
    return bn_apply_t<T>(p, x, c, save_mean, save_invstd, NULL, eps, gamma, beta, res, y, act, s);
}

/* stage 0: this rank's backward sums (and dgamma, dbeta); 1: dx from the sums
 * of every rank. Both make the same row-kernel decision, so the ReLU mask is
 * taken the same way in both. */
template <typename T>
static int bn_sync_bwd_t(int stage, const char *fn, const T *x, int n, int c, int h, int w, sf_layout lay,
                         const float *gamma, const float *beta, const float *save_mean, const float *save_invstd,
                         const T *dy, const T *y, T *dx, float *dgamma, float *dbeta, double *sums_out,
                         const double *sums_in, void *scratch, cudaStream_t s)
{
    constexpr bool BF = sizeof(T) == 2;
    if (n == 0)
        return stage == 0 ? bn_sync_zero(fn, c, sums_out, s) : 0;
    if (bn_check(fn, n, c, h, w))
        return -1;
    bn_plan p = bn_plan_of(n, c, h, w, lay);
    const int rows = BF && (!y || beta) && bn_rows_ok(p, c, x, dy, dx, NULL);
    if (BF)
        bn_plan_bf16(&p, rows);
    double *part = (double *)scratch;
    float *coef = (float *)(part + 2 * (size_t)p.nchunks * c);
    if (stage == 1) {
        k_bn_sync_coef<<<cu_blocks((size_t)c, CU_TPB), CU_TPB, 0, s>>>(sums_in, c, gamma, save_invstd, coef);
        SF_CUDA_CHECK_LAUNCH();
        return bn_dx_t<T>(p, rows, x, c, gamma, beta, save_mean, save_invstd, dy, y, y ? SF_BN_RELU : 0, coef, dx,
                          s);
    }
    if (rows) {
        bn_bwd_partials_rows<T>(p, c, y ? SF_BN_RELU : 0, x, dy, save_mean, save_invstd, gamma, beta, part, s);
        SF_CUDA_CHECK_LAUNCH();
    } else if (bn_partials<T>(p, x, dy, y, save_mean, c, 1, part, s)) {
        return -1;
    }
    k_bn_sync_sums<T, 1><<<cu_blocks((size_t)c * 32, CU_TPB), CU_TPB, 0, s>>>(
        part, rows ? (size_t)p.nchunks : 1, rows ? 1 : (size_t)c, p.nchunks, c, (double)p.E, x, 0, save_invstd,
        dgamma, dbeta, sums_out);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_bn_sync_fwd_sums_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                           double *sums, void *scratch, cudaStream_t s)
{
    const char *fn = "sf_cuda_bn_sync_fwd_sums_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return bn_sync_fwd_sums_t<cu_bf16>(fn, (const cu_bf16 *)x, n, c, h, w, lay, sums, scratch, s);
    return bn_sync_fwd_sums_t<float>(fn, (const float *)x, n, c, h, w, lay, sums, scratch, s);
}

extern "C" int sf_cuda_bn_sync_fwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                      const float *gamma, const float *beta, float eps, float momentum,
                                      const double *sums, float *running_mean, float *running_var, float *save_mean,
                                      float *save_invstd, const void *res, void *y, int act, cudaStream_t s)
{
    const char *fn = "sf_cuda_bn_sync_fwd_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return bn_sync_fwd_t<cu_bf16>(fn, (const cu_bf16 *)x, n, c, h, w, lay, gamma, beta, eps, momentum, sums,
                                     running_mean, running_var, save_mean, save_invstd, (const cu_bf16 *)res,
                                     (cu_bf16 *)y, act, s);
    return bn_sync_fwd_t<float>(fn, (const float *)x, n, c, h, w, lay, gamma, beta, eps, momentum, sums, running_mean,
                                running_var, save_mean, save_invstd, (const float *)res, (float *)y, act, s);
}

extern "C" int sf_cuda_bn_sync_bwd_sums_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                           const float *gamma, const float *beta, const float *save_mean,
                                           const float *save_invstd, const void *dy, const void *y, const void *dx,
                                           float *dgamma, float *dbeta, double *sums, void *scratch, cudaStream_t s)
{
    const char *fn = "sf_cuda_bn_sync_bwd_sums_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return bn_sync_bwd_t<cu_bf16>(0, fn, (const cu_bf16 *)x, n, c, h, w, lay, gamma, beta, save_mean, save_invstd,
                                     (const cu_bf16 *)dy, (const cu_bf16 *)y, (cu_bf16 *)dx, dgamma, dbeta, sums,
                                     NULL, scratch, s);
    return bn_sync_bwd_t<float>(0, fn, (const float *)x, n, c, h, w, lay, gamma, beta, save_mean, save_invstd,
                                (const float *)dy, (const float *)y, (float *)dx, dgamma, dbeta, sums, NULL, scratch,
                                s);
}

extern "C" int sf_cuda_bn_sync_bwd_dx_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                         const float *gamma, const float *beta, const float *save_mean,
                                         const float *save_invstd, const void *dy, const void *y, void *dx,
                                         const double *sums, void *scratch, cudaStream_t s)
{
    const char *fn = "sf_cuda_bn_sync_bwd_dx_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return bn_sync_bwd_t<cu_bf16>(1, fn, (const cu_bf16 *)x, n, c, h, w, lay, gamma, beta, save_mean, save_invstd,
                                     (const cu_bf16 *)dy, (const cu_bf16 *)y, (cu_bf16 *)dx, NULL, NULL, NULL, sums,
                                     scratch, s);
    return bn_sync_bwd_t<float>(1, fn, (const float *)x, n, c, h, w, lay, gamma, beta, save_mean, save_invstd,
                                (const float *)dy, (const float *)y, (float *)dx, NULL, NULL, NULL, sums, scratch, s);
}
