/* gpu/cuda/layers_w23.cu — the W2/W3 layers: kernels first, then launchers,
 * then the ConvTranspose2d plans over layers.cu's cuDNN convolutions.
 * Contracts in layers_w23.h. */
#include "layers_w23.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define W_TPB 256
/* Blocks a per-channel reduction aims for, whatever the device: the partial
 * sums (and so the rounding) must depend on the shape alone. */
#define W_RED_BLOCKS 1024
/* Blocks of the cross-entropy's first pass at most (its partials' count). */
#define W_XENT_BLOCKS 1024

static unsigned int w_blocks(size_t work, unsigned int tpb)
{
    size_t b = (work + tpb - 1) / tpb;
    return (unsigned int)(b ? b : 1);
}

static int w_al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static size_t w_cdiv(size_t a, size_t b) { return (a + b - 1) / b; }

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* ---- shared helpers ------------------------------------------------------ */

/* Block-wide sum of two doubles in a fixed order (warp shuffles, then warp 0
 * over the warps' results). Result valid in thread 0. */
__device__ __forceinline__ void block_sum2(double &a, double &b)
{
    __shared__ double sa[32], sb[32];
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, o);
        b += __shfl_down_sync(0xffffffffu, b, o);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads(); /* the shared arrays may be in use by a previous call */
    if (lane == 0) {
        sa[warp] = a;
        sb[warp] = b;
    }
    __syncthreads();
    if (warp == 0) {
        a = lane < nw ? sa[lane] : 0.0;
        b = lane < nw ? sb[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) {
            a += __shfl_down_sync(0xffffffffu, a, o);
            b += __shfl_down_sync(0xffffffffu, b, o);
        }
    }
}

/* ---- per-pixel cross-entropy --------------------------------------------- */

struct xent2d_part {
    double loss;
    long long correct;
    int bad;
    int pad_;
};

/* Pass 1: a thread per pixel (grid-stride); pixel p = (ni, sp). NCHW: class j
 * of p at ni*k*hw + j*hw + sp; NHWC: p*k + j. Writes one partial per block. */
__global__ void k_xent2d(const float *__restrict__ logits, const int32_t *__restrict__ labels, int k,
                         long long hw, long long npix, int nhwc, float *__restrict__ dlog,
                         xent2d_part *__restrict__ part)
{
    double lsum = 0.0, csum = 0.0;
    int bad = 0;
    const float inv_den = (float)npix; /* divide as the reference does */
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < npix;
         p += (long long)gridDim.x * blockDim.x) {
        long long base, cs;
        if (nhwc) {
            base = p * k;
            cs = 1;
        } else {
            const long long ni = p / hw, sp = p - ni * hw;
            base = ni * k * hw + sp;
            cs = hw;
        }
        const float *l = logits + base;
        float m = l[0];
        int arg = 0;
        for (int j = 1; j < k; j++) {
            const float v = l[j * cs];
            if (v > m) {
                m = v;
                arg = j;
            }
        }
        float se = 0.f;
        for (int j = 0; j < k; j++)
            se += expf(l[j * cs] - m);
        const float lse = m + logf(se);
        const int lab = labels[p];
        const int valid = lab >= 0 && lab < k;
        if (dlog) {
            float *d = dlog + base;
            for (int j = 0; j < k; j++) {
                const float pr = expf(l[j * cs] - lse);
                d[j * cs] = valid ? (pr - (j == lab ? 1.f : 0.f)) / inv_den : NAN;
            }
        }
        lsum += valid ? (double)(lse - l[(long long)lab * cs]) : (double)NAN;
        csum += (valid && arg == lab) ? 1.0 : 0.0;
        bad += !valid;
    }
    double b2 = (double)bad;
    block_sum2(lsum, csum);
    __shared__ double sbad;
    {
        double z = 0.0;
        block_sum2(b2, z);
        if (threadIdx.x == 0)
            sbad = b2;
    }
    if (threadIdx.x == 0) {
        part[blockIdx.x].loss = lsum;
        part[blockIdx.x].correct = (long long)csum;
        part[blockIdx.x].bad = (int)sbad;
        part[blockIdx.x].pad_ = 0;
    }
}

/* Pass 2: one block sums the partials in a fixed order. */
__global__ void k_xent2d_final(const xent2d_part *__restrict__ part, int nparts, long long npix,
                               sf_xent2d_out *__restrict__ out)
{
    double l = 0.0, c = 0.0, b = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) {
        l += part[i].loss;
        c += (double)part[i].correct;
        b += (double)part[i].bad;
    }
    block_sum2(l, c);
    double z = 0.0;
    __shared__ double sl, sc;
    if (threadIdx.x == 0) {
        sl = l;
        sc = c;
    }
    block_sum2(b, z);
    if (threadIdx.x == 0) {
        out->loss = (float)(sl / (double)npix);
        out->correct = (int64_t)sc;
        out->bad = (int32_t)b;
    }
}

/* ---- batchnorm ------------------------------------------------------------- */

/* The channel of element e (e a multiple of V when V == 4). */
__device__ __forceinline__ int bn_chan(unsigned e, int C, unsigned hw, int nhwc)
{
    return nhwc ? (int)(e % (unsigned)C) : (int)((e / hw) % (unsigned)C);
}

/* Per-channel statistics over an NCHW tensor, pass 1. Block (c, chunk) covers
 * the flattened (sample, spatial) range [chunk*L, chunk*L + L) of channel c.
 * mode 0 (forward): a = sum(x - shift), b = sum((x - shift)^2), shift = x's
 * first element of the channel. mode 1 (backward): a = sum(g), b = sum(g * (x -
 * mean)), g = dy masked by y > 0 when y is given. part[chunk][c][2]. */
template <int V>
__global__ void k_bn_part_nchw(const float *__restrict__ x, const float *__restrict__ dy,
                               const float *__restrict__ y, const float *__restrict__ mean, int C,
                               size_t hw, size_t E, size_t L, int mode, double *__restrict__ part)
{
    const int c = blockIdx.x;
    const size_t e0 = (size_t)blockIdx.y * L;
    const size_t e1 = e0 + L < E ? e0 + L : E;
    const float sh = mode == 0 ? x[(size_t)c * hw] : mean[c];
    double a = 0.0, b = 0.0;
    /* 32-bit index arithmetic: the launchers keep tensors under 2^32 elements */
    const unsigned hw32 = (unsigned)hw;
    for (unsigned e = (unsigned)e0 + threadIdx.x * V; e < (unsigned)e1; e += blockDim.x * V) {
        const unsigned ni = e / hw32, sp = e - ni * hw32;
        const size_t off = ((size_t)ni * C + c) * hw + sp;
        if constexpr (V == 4) {
            const float4 xv = *reinterpret_cast<const float4 *>(x + off);
            const float xs[4] = {xv.x - sh, xv.y - sh, xv.z - sh, xv.w - sh};
            if (mode == 0) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    a += (double)xs[j];
                    b += (double)xs[j] * (double)xs[j];
                }
            } else {
                float4 g = *reinterpret_cast<const float4 *>(dy + off);
                if (y) {
                    const float4 yv = *reinterpret_cast<const float4 *>(y + off);
                    g.x = yv.x > 0.f ? g.x : 0.f;
                    g.y = yv.y > 0.f ? g.y : 0.f;
                    g.z = yv.z > 0.f ? g.z : 0.f;
                    g.w = yv.w > 0.f ? g.w : 0.f;
                }
                const float gs[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    a += (double)gs[j];
                    b += (double)gs[j] * (double)xs[j];
                }
            }
        } else {
            const float xs = x[off] - sh;
            if (mode == 0) {
                a += (double)xs;
                b += (double)xs * (double)xs;
            } else {
                float g = dy[off];
                if (y)
                    g = y[off] > 0.f ? g : 0.f;
                a += (double)g;
                b += (double)g * (double)xs;
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
 * time, so a warp reads consecutive addresses. */
template <int V>
__global__ void k_bn_part_nhwc(const float *__restrict__ x, const float *__restrict__ dy,
                               const float *__restrict__ y, const float *__restrict__ mean, int C,
                               size_t R, size_t rpc, int mode, double *__restrict__ part)
{
    extern __shared__ double shd[];
    const int Cv = C / V;
    const int G = Cv < W_TPB ? Cv : W_TPB;
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
            sh[v] = mode == 0 ? x[cg * V + v] : mean[cg * V + v];
        for (size_t r = r0 + rl; r < r1; r += RS) {
            const size_t off = r * (size_t)C + (size_t)cg * V;
            float xs[V], gs[V];
            if constexpr (V == 4) {
                const float4 xv = *reinterpret_cast<const float4 *>(x + off);
                xs[0] = xv.x;
                xs[1] = xv.y;
                xs[2] = xv.z;
                xs[3] = xv.w;
                if (mode == 1) {
                    const float4 gv = *reinterpret_cast<const float4 *>(dy + off);
                    gs[0] = gv.x;
                    gs[1] = gv.y;
                    gs[2] = gv.z;
                    gs[3] = gv.w;
                    if (y) {
                        const float4 yv = *reinterpret_cast<const float4 *>(y + off);
                        gs[0] = yv.x > 0.f ? gs[0] : 0.f;
                        gs[1] = yv.y > 0.f ? gs[1] : 0.f;
                        gs[2] = yv.z > 0.f ? gs[2] : 0.f;
                        gs[3] = yv.w > 0.f ? gs[3] : 0.f;
                    }
                }
            } else {
                xs[0] = x[off];
                if (mode == 1) {
                    gs[0] = dy[off];
                    if (y)
                        gs[0] = y[off] > 0.f ? gs[0] : 0.f;
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

/* Forward statistics, pass 2: a thread per channel sums the chunks in order. */
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
    const double sh = (double)x[(size_t)c * shift_stride];
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

/* Backward, pass 2: dbeta, dgamma and the coefficients of dx:
 * dx = k1 * (g - m1 - (x - mean) * k2), k1 = gamma*invstd, m1 = sum(g)/N,
 * k2 = sum(g*(x-mean)) * invstd^2 / N. coef[c][3]. */
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
    const double inv = (double)sinv[c];
    dbeta[c] = (float)a;
    dgamma[c] = (float)(b * inv);
    coef[c * 3 + 0] = (float)((double)gamma[c] * inv);
    coef[c * 3 + 1] = (float)(a / cnt);
    coef[c * 3 + 2] = (float)(b * inv * inv / cnt);
}

/* y = act(((x - mean) * invstd) * gamma + beta), elementwise; V = 4 when the
 * four elements share a channel (NCHW, hw % 4 == 0) or are four consecutive
 * channels (NHWC, C % 4 == 0). eval: mean/invstd from the running stats. */
template <int V>
__global__ void k_bn_apply(const float *__restrict__ x, size_t nvec, int C, size_t hw, int nhwc,
                           const float *__restrict__ mean, const float *__restrict__ sinv,
                           const float *__restrict__ rvar, float eps, const float *__restrict__ gamma,
                           const float *__restrict__ beta, int relu, float *__restrict__ y)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nvec)
        return;
    const size_t e = i * V;
    const int c0 = bn_chan((unsigned)e, C, (unsigned)hw, nhwc);
    float xv[V];
    if constexpr (V == 4) {
        const float4 t = reinterpret_cast<const float4 *>(x)[i];
        xv[0] = t.x;
        xv[1] = t.y;
        xv[2] = t.z;
        xv[3] = t.w;
    } else {
        xv[0] = x[e];
    }
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int c = (nhwc && V == 4) ? c0 + v : c0;
        const float inv = rvar ? 1.f / sqrtf(rvar[c] + eps) : sinv[c];
        float o = ((xv[v] - mean[c]) * inv) * gamma[c] + beta[c];
        if (relu)
            o = o > 0.f ? o : 0.f;
        xv[v] = o;
    }
    if constexpr (V == 4)
        reinterpret_cast<float4 *>(y)[i] = make_float4(xv[0], xv[1], xv[2], xv[3]);
    else
        y[e] = xv[0];
}

/* dx = k1 * (g - m1 - (x - mean) * k2), g = dy masked by y > 0 when y. */
template <int V>
__global__ void k_bn_dx(const float *__restrict__ x, const float *__restrict__ dy,
                        const float *__restrict__ y, size_t nvec, int C, size_t hw, int nhwc,
                        const float *__restrict__ mean, const float *__restrict__ coef,
                        float *__restrict__ dx)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nvec)
        return;
    const size_t e = i * V;
    const int c0 = bn_chan((unsigned)e, C, (unsigned)hw, nhwc);
    float xv[V], gv[V];
    if constexpr (V == 4) {
        const float4 t = reinterpret_cast<const float4 *>(x)[i];
        const float4 u = reinterpret_cast<const float4 *>(dy)[i];
        xv[0] = t.x; xv[1] = t.y; xv[2] = t.z; xv[3] = t.w;
        gv[0] = u.x; gv[1] = u.y; gv[2] = u.z; gv[3] = u.w;
        if (y) {
            const float4 w = reinterpret_cast<const float4 *>(y)[i];
            gv[0] = w.x > 0.f ? gv[0] : 0.f;
            gv[1] = w.y > 0.f ? gv[1] : 0.f;
            gv[2] = w.z > 0.f ? gv[2] : 0.f;
            gv[3] = w.w > 0.f ? gv[3] : 0.f;
        }
    } else {
        xv[0] = x[e];
        gv[0] = dy[e];
        if (y)
            gv[0] = y[e] > 0.f ? gv[0] : 0.f;
    }
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int c = (nhwc && V == 4) ? c0 + v : c0;
        const float k1 = coef[c * 3], m1 = coef[c * 3 + 1], k2 = coef[c * 3 + 2];
        xv[v] = k1 * (gv[v] - m1 - (xv[v] - mean[c]) * k2);
    }
    if constexpr (V == 4)
        reinterpret_cast<float4 *>(dx)[i] = make_float4(xv[0], xv[1], xv[2], xv[3]);
    else
        dx[e] = xv[0];
}

/* ---- maxpool ----------------------------------------------------------------- */

/* A thread per output element. NCHW: index = ((ni*C + c)*oh + oy)*ow + ox;
 * NHWC: ((ni*oh + oy)*ow + ox)*C + c. As PyTorch: the first in-bounds input
 * starts the running maximum at -inf; a larger value or a NaN replaces it. */
template <int KT, int ST>
__global__ void k_maxpool_fwd(const float *__restrict__ x, int C, int H, int W, int k_arg, int s_arg,
                              int pad, int OH, int OW, int nhwc, size_t total, float *__restrict__ y,
                              int32_t *__restrict__ am)
{
    /* KT, ST: the window and stride as compile-time constants (ResNet's 3/2),
     * or 0 for run-time values */
    const int k = KT ? KT : k_arg, stride = ST ? ST : s_arg;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    /* 32-bit index arithmetic: the launchers keep tensors under 2^32 elements */
    const unsigned u = (unsigned)i;
    int ox, oy;
    size_t plane, cs;
    if (nhwc) {
        const unsigned c = u % (unsigned)C;
        unsigned r = u / (unsigned)C;
        ox = (int)(r % (unsigned)OW);
        r /= (unsigned)OW;
        oy = (int)(r % (unsigned)OH);
        const unsigned ni = r / (unsigned)OH;
        plane = (size_t)ni * H * W * C + c;
        cs = (size_t)C;
    } else {
        ox = (int)(u % (unsigned)OW);
        unsigned r = u / (unsigned)OW;
        oy = (int)(r % (unsigned)OH);
        r /= (unsigned)OH; /* ni*C + c */
        plane = (size_t)r * H * W;
        cs = 1;
    }
    const int ys = oy * stride - pad, xs = ox * stride - pad;
    const int y0 = ys > 0 ? ys : 0, x0 = xs > 0 ? xs : 0;
    const int y1 = ys + k < H ? ys + k : H, x1 = xs + k < W ? xs + k : W;
    float m = -INFINITY;
    int arg = y0 * W + x0;
    for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++) {
            const int idx = iy * W + ix;
            const float v = x[plane + (size_t)idx * cs];
            if (v > m || isnan(v)) {
                m = v;
                arg = idx;
            }
        }
    y[i] = m;
    am[i] = arg;
}

/* A thread per input element: the sum, in row-major output order, of dy over
 * the windows containing it whose argmax is it. */
template <int KT, int ST>
__global__ void k_maxpool_bwd(const float *__restrict__ dy, const int32_t *__restrict__ am, int C, int H,
                              int W, int k_arg, int s_arg, int pad, int OH, int OW, int nhwc, size_t total,
                              float *__restrict__ dx)
{
    /* as k_maxpool_fwd: constant window and stride turn the divisions below
     * into shifts, which is most of this kernel's time */
    const int k = KT ? KT : k_arg, stride = ST ? ST : s_arg;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    const unsigned u = (unsigned)i;
    int ix, iy;
    size_t obase, os;
    if (nhwc) {
        const unsigned c = u % (unsigned)C;
        unsigned r = u / (unsigned)C;
        ix = (int)(r % (unsigned)W);
        r /= (unsigned)W;
        iy = (int)(r % (unsigned)H);
        const unsigned ni = r / (unsigned)H;
        obase = (size_t)ni * OH * OW * C + c;
        os = (size_t)C;
    } else {
        ix = (int)(u % (unsigned)W);
        unsigned r = u / (unsigned)W;
        iy = (int)(r % (unsigned)H);
        r /= (unsigned)H;
        obase = (size_t)r * OH * OW;
        os = 1;
    }
    /* oy*stride - pad <= iy <= oy*stride - pad + k - 1 */
    const int ty = iy + pad - k + 1, tx = ix + pad - k + 1;
    const unsigned us = (unsigned)stride;
    int oy0 = ty > 0 ? (int)(((unsigned)ty + us - 1) / us) : 0;
    int ox0 = tx > 0 ? (int)(((unsigned)tx + us - 1) / us) : 0;
    int oy1 = (int)((unsigned)(iy + pad) / us), ox1 = (int)((unsigned)(ix + pad) / us);
    if (oy1 > OH - 1)
        oy1 = OH - 1;
    if (ox1 > OW - 1)
        ox1 = OW - 1;
    const int me = iy * W + ix;
    float s = 0.f;
    for (int oy = oy0; oy <= oy1; oy++)
        for (int ox = ox0; ox <= ox1; ox++) {
            const size_t o = obase + ((size_t)oy * OW + ox) * os;
            if (am[o] == me)
                s += dy[o];
        }
    dx[i] = s;
}

/* ---- global average pooling ----------------------------------------------- */

/* NCHW: a warp per (n, c) plane. */
__global__ void k_avgpool_fwd_nchw(const float *__restrict__ x, size_t planes, int hw, float *__restrict__ y)
{
    const size_t wid = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (wid >= planes)
        return;
    const float *p = x + wid * (size_t)hw;
    float s = 0.f;
    for (int j = lane; j < hw; j += 32)
        s += p[j];
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0)
        y[wid] = s / (float)hw;
}

/* NHWC: a thread per (n, c), walking the hw rows (coalesced across c). */
__global__ void k_avgpool_fwd_nhwc(const float *__restrict__ x, int N, int C, int hw, float *__restrict__ y)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C)
        return;
    const size_t ni = i / C, c = i % C;
    const float *p = x + ni * (size_t)hw * C + c;
    float s = 0.f;
    for (int j = 0; j < hw; j++)
        s += p[(size_t)j * C];
    y[i] = s / (float)hw;
}

__global__ void k_avgpool_bwd(const float *__restrict__ dy, size_t total, int C, int hw, int nhwc,
                              float *__restrict__ dx)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    size_t o;
    if (nhwc)
        o = (i / ((size_t)hw * C)) * C + i % C;
    else
        o = i / hw;
    dx[i] = dy[o] / (float)hw;
}

/* ---- residual add ------------------------------------------------------------ */

/* a, b, y may alias (no __restrict__). */
template <int V>
__global__ void k_add(const float *a, const float *b, float *y, size_t nvec, int relu)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nvec)
        return;
    if constexpr (V == 4) {
        const float4 u = reinterpret_cast<const float4 *>(a)[i];
        const float4 v = reinterpret_cast<const float4 *>(b)[i];
        float4 o = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
        if (relu) {
            o.x = o.x > 0.f ? o.x : 0.f;
            o.y = o.y > 0.f ? o.y : 0.f;
            o.z = o.z > 0.f ? o.z : 0.f;
            o.w = o.w > 0.f ? o.w : 0.f;
        }
        reinterpret_cast<float4 *>(y)[i] = o;
    } else {
        float o = a[i] + b[i];
        if (relu)
            o = o > 0.f ? o : 0.f;
        y[i] = o;
    }
}

/* ---- AdamW ------------------------------------------------------------------- */

/* One element in the order of PyTorch's single-tensor AdamW, rounding as the
 * reference (no contraction into FMA), so equal inputs give bit-equal results. */
__device__ __forceinline__ void adamw_one(float &p, float &m, float &v, float g, const sf_adamw_hyper &h)
{
    p = __fmul_rn(p, __fsub_rn(1.f, __fmul_rn(h.lr, h.weight_decay)));
    m = __fadd_rn(__fmul_rn(h.beta1, m), __fmul_rn(__fsub_rn(1.f, h.beta1), g));
    v = __fadd_rn(__fmul_rn(h.beta2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.f, h.beta2), g), g));
    const float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), h.bc2_sqrt), h.eps);
    p = __fsub_rn(p, __fmul_rn(h.step_size, __fdiv_rn(m, den)));
}

/* Device index of model index i inside segment sg (KCRS -> KRSC), as layers.cu. */
__device__ __forceinline__ size_t w_perm_index(const sf_perm_seg &sg, size_t i)
{
    const unsigned r = (unsigned)(i - sg.off);
    const unsigned crs = (unsigned)sg.c * (unsigned)sg.rs;
    const unsigned o = r / crs, rem = r - o * crs;
    const unsigned ci = rem / (unsigned)sg.rs, t = rem - ci * (unsigned)sg.rs;
    return sg.off + (size_t)o * crs + (size_t)t * sg.c + ci;
}

/* Four consecutive elements per thread; a segment boundary or the tail goes
 * one element at a time. */
__global__ void k_adamw(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ m,
                        float *__restrict__ v, float *__restrict__ wdev, size_t len,
                        const sf_adamw_hyper *__restrict__ hp, const __grid_constant__ sf_sgd_segs segs)
{
    const size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i0 >= len)
        return;
    const sf_adamw_hyper h = *hp;
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
        float4 mv = *reinterpret_cast<const float4 *>(m + i0);
        float4 vv = *reinterpret_cast<const float4 *>(v + i0);
        float4 gv;
        size_t j[4] = {0, 0, 0, 0};
        if (si < 0) {
            gv = *reinterpret_cast<const float4 *>(g + i0);
        } else {
#pragma unroll
            for (int q = 0; q < 4; q++)
                j[q] = w_perm_index(segs.s[si], i0 + q);
            gv = make_float4(g[j[0]], g[j[1]], g[j[2]], g[j[3]]);
        }
        adamw_one(pv.x, mv.x, vv.x, gv.x, h);
        adamw_one(pv.y, mv.y, vv.y, gv.y, h);
        adamw_one(pv.z, mv.z, vv.z, gv.z, h);
        adamw_one(pv.w, mv.w, vv.w, gv.w, h);
        *reinterpret_cast<float4 *>(p + i0) = pv;
        *reinterpret_cast<float4 *>(m + i0) = mv;
        *reinterpret_cast<float4 *>(v + i0) = vv;
        if (si >= 0) {
            wdev[j[0]] = pv.x;
            wdev[j[1]] = pv.y;
            wdev[j[2]] = pv.z;
            wdev[j[3]] = pv.w;
        }
        return;
    }
    for (size_t i = i0; i < i0 + 4 && i < len; i++) {
        int k = -1;
        for (int q = 0; q < segs.n; q++)
            if (i >= segs.s[q].off && i < segs.s[q].off + segs.s[q].len) {
                k = q;
                break;
            }
        const size_t jj = k < 0 ? i : w_perm_index(segs.s[k], i);
        float pv = p[i], mv = m[i], vv = v[i];
        adamw_one(pv, mv, vv, g[jj], h);
        p[i] = pv;
        m[i] = mv;
        v[i] = vv;
        if (k >= 0)
            wdev[jj] = pv;
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

/* ---- per-pixel cross-entropy --------------------------------------------- */

static int xent2d_blocks(long long npix)
{
    size_t b = w_blocks((size_t)npix, W_TPB);
    return (int)(b < W_XENT_BLOCKS ? b : W_XENT_BLOCKS);
}

extern "C" size_t sf_cuda_xent2d_scratch_bytes(int n, int h, int w)
{
    return sizeof(xent2d_part) * (size_t)xent2d_blocks((long long)n * h * w);
}

extern "C" int sf_cuda_xent2d(const float *logits, const int32_t *labels, int n, int k, int h, int w,
                              sf_layout lay, float *dlogits, sf_xent2d_out *out, void *scratch,
                              cudaStream_t s)
{
    if (n < 1 || k < 1 || h < 1 || w < 1) {
        sf_cuda_set_error("%s:%d: sf_cuda_xent2d: n=%d k=%d h=%d w=%d", __FILE__, __LINE__, n, k, h, w);
        return -1;
    }
    const long long npix = (long long)n * h * w;
    const int nb = xent2d_blocks(npix);
    xent2d_part *part = (xent2d_part *)scratch;
    k_xent2d<<<nb, W_TPB, 0, s>>>(logits, labels, k, (long long)h * w, npix, lay == SF_LAYOUT_NHWC, dlogits,
                                  part);
    SF_CUDA_CHECK_LAUNCH();
    k_xent2d_final<<<1, W_TPB, 0, s>>>(part, nb, npix, out);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ---- batchnorm ------------------------------------------------------------- */

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
        size_t want = w_cdiv(W_RED_BLOCKS, (size_t)c);
        const size_t most = w_cdiv(p.E, 2048); /* at least 2048 elements a block */
        if (want > most)
            want = most;
        if (want < 1)
            want = 1;
        p.L = (w_cdiv(p.E, want) + 3) & ~(size_t)3;
        p.nchunks = (int)w_cdiv(p.E, p.L);
    } else {
        const size_t gx = w_cdiv((size_t)c, 4 * W_TPB); /* blocks across channels */
        size_t want = w_cdiv(W_RED_BLOCKS, gx);
        const size_t most = w_cdiv(p.E, 64); /* at least 64 rows a block */
        if (want > most)
            want = most;
        if (want < 1)
            want = 1;
        p.L = w_cdiv(p.E, want);
        p.nchunks = (int)w_cdiv(p.E, p.L);
    }
    return p;
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

/* Launches pass 1 of a per-channel reduction (mode 0 forward, 1 backward). */
static int bn_partials(const bn_plan &p, const float *x, const float *dy, const float *y, const float *mean,
                       int c, int mode, double *part, cudaStream_t s)
{
    if (!p.nhwc) {
        const int V = (p.hw % 4 == 0 && w_al16(x) && (mode == 0 || (w_al16(dy) && (!y || w_al16(y))))) ? 4 : 1;
        dim3 grid((unsigned)c, (unsigned)p.nchunks);
        if (V == 4)
            k_bn_part_nchw<4><<<grid, W_TPB, 0, s>>>(x, dy, y, mean, c, p.hw, p.E, p.L, mode, part);
        else
            k_bn_part_nchw<1><<<grid, W_TPB, 0, s>>>(x, dy, y, mean, c, p.hw, p.E, p.L, mode, part);
    } else {
        const int V = (c % 4 == 0 && w_al16(x) && (mode == 0 || (w_al16(dy) && (!y || w_al16(y))))) ? 4 : 1;
        const int Cv = c / V;
        const int G = Cv < W_TPB ? Cv : W_TPB;
        const int RS = W_TPB / G;
        dim3 grid((unsigned)((Cv + G - 1) / G), (unsigned)p.nchunks);
        const unsigned threads = (unsigned)(G * RS);
        const size_t shm = sizeof(double) * 2 * threads * V;
        if (V == 4)
            k_bn_part_nhwc<4><<<grid, threads, shm, s>>>(x, dy, y, mean, c, p.E, p.L, mode, part);
        else
            k_bn_part_nhwc<1><<<grid, threads, shm, s>>>(x, dy, y, mean, c, p.E, p.L, mode, part);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* Whether the elementwise kernels can take four elements at a time. */
static int bn_vec4(const bn_plan &p, int c, const void *a, const void *b, const void *d, const void *e)
{
    const int shape = p.nhwc ? c % 4 == 0 : p.hw % 4 == 0;
    return shape && w_al16(a) && w_al16(b) && (!d || w_al16(d)) && (!e || w_al16(e));
}

extern "C" int sf_cuda_bn_fwd_train(const float *x, int n, int c, int h, int w, sf_layout lay,
                                    const float *gamma, const float *beta, float eps, float momentum,
                                    float *running_mean, float *running_var, float *save_mean,
                                    float *save_invstd, float *y, int relu, void *scratch, cudaStream_t s)
{
    if (bn_check("sf_cuda_bn_fwd_train", n, c, h, w))
        return -1;
    const bn_plan p = bn_plan_of(n, c, h, w, lay);
    if (p.E < 2) {
        sf_cuda_set_error("%s:%d: sf_cuda_bn_fwd_train: one value per channel (n*h*w=%zu)", __FILE__, __LINE__,
                          p.E);
        return -1;
    }
    double *part = (double *)scratch;
    if (bn_partials(p, x, NULL, NULL, NULL, c, 0, part, s))
        return -1;
    k_bn_stats_final<<<w_blocks((size_t)c, W_TPB), W_TPB, 0, s>>>(part, p.nchunks, c, (double)p.E, x,
                                                                   p.nhwc ? 1 : p.hw, eps, momentum,
                                                                   running_mean, running_var, save_mean,
                                                                   save_invstd);
    SF_CUDA_CHECK_LAUNCH();
    const size_t len = (size_t)c * p.E;
    if (bn_vec4(p, c, x, y, NULL, NULL))
        k_bn_apply<4><<<w_blocks(len / 4, W_TPB), W_TPB, 0, s>>>(x, len / 4, c, p.hw, p.nhwc, save_mean,
                                                                 save_invstd, NULL, eps, gamma, beta, relu, y);
    else
        k_bn_apply<1><<<w_blocks(len, W_TPB), W_TPB, 0, s>>>(x, len, c, p.hw, p.nhwc, save_mean, save_invstd,
                                                             NULL, eps, gamma, beta, relu, y);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_bn_fwd_eval(const float *x, int n, int c, int h, int w, sf_layout lay,
                                   const float *gamma, const float *beta, float eps, const float *running_mean,
                                   const float *running_var, float *y, int relu, cudaStream_t s)
{
    if (bn_check("sf_cuda_bn_fwd_eval", n, c, h, w))
        return -1;
    const bn_plan p = bn_plan_of(n, c, h, w, lay);
    const size_t len = (size_t)c * p.E;
    if (bn_vec4(p, c, x, y, NULL, NULL))
        k_bn_apply<4><<<w_blocks(len / 4, W_TPB), W_TPB, 0, s>>>(x, len / 4, c, p.hw, p.nhwc, running_mean,
                                                                 NULL, running_var, eps, gamma, beta, relu, y);
    else
        k_bn_apply<1><<<w_blocks(len, W_TPB), W_TPB, 0, s>>>(x, len, c, p.hw, p.nhwc, running_mean, NULL,
                                                             running_var, eps, gamma, beta, relu, y);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_bn_bwd(const float *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                              const float *save_mean, const float *save_invstd, const float *dy,
                              const float *y, float *dx, float *dgamma, float *dbeta, void *scratch,
                              cudaStream_t s)
{
    if (bn_check("sf_cuda_bn_bwd", n, c, h, w))
        return -1;
    const bn_plan p = bn_plan_of(n, c, h, w, lay);
    double *part = (double *)scratch;
    float *coef = (float *)(part + 2 * (size_t)p.nchunks * c);
    if (bn_partials(p, x, dy, y, save_mean, c, 1, part, s))
        return -1;
    k_bn_bwd_final<<<w_blocks((size_t)c, W_TPB), W_TPB, 0, s>>>(part, p.nchunks, c, (double)p.E, gamma,
                                                                 save_invstd, dgamma, dbeta, coef);
    SF_CUDA_CHECK_LAUNCH();
    const size_t len = (size_t)c * p.E;
    if (bn_vec4(p, c, x, dy, dx, y))
        k_bn_dx<4><<<w_blocks(len / 4, W_TPB), W_TPB, 0, s>>>(x, dy, y, len / 4, c, p.hw, p.nhwc, save_mean,
                                                              coef, dx);
    else
        k_bn_dx<1><<<w_blocks(len, W_TPB), W_TPB, 0, s>>>(x, dy, y, len, c, p.hw, p.nhwc, save_mean, coef, dx);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ---- maxpool ----------------------------------------------------------------- */

static int pool_check(const char *fn, int n, int c, int h, int w, int k, int stride, int pad, int *oh, int *ow)
{
    if (n < 1 || c < 1 || h < 1 || w < 1 || k < 1 || stride < 1 || pad < 0 || 2 * pad > k ||
        (double)n * c * h * w >= 4294967296.0 ||
        h + 2 * pad < k || w + 2 * pad < k) {
        sf_cuda_set_error("%s:%d: %s: n=%d c=%d %dx%d k=%d stride=%d pad=%d", __FILE__, __LINE__, fn, n, c, h, w,
                          k, stride, pad);
        return -1;
    }
    *oh = (h + 2 * pad - k) / stride + 1;
    *ow = (w + 2 * pad - k) / stride + 1;
    return 0;
}

extern "C" int sf_cuda_maxpool_fwd(const float *x, int n, int c, int h, int w, int k, int stride, int pad,
                                   sf_layout lay, float *y, int32_t *argmax, cudaStream_t s)
{
    int oh, ow;
    if (pool_check("sf_cuda_maxpool_fwd", n, c, h, w, k, stride, pad, &oh, &ow))
        return -1;
    const size_t total = (size_t)n * c * oh * ow;
    if (k == 3 && stride == 2)
        k_maxpool_fwd<3, 2><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(x, c, h, w, k, stride, pad, oh, ow,
                                                                    lay == SF_LAYOUT_NHWC, total, y, argmax);
    else
        k_maxpool_fwd<0, 0><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(x, c, h, w, k, stride, pad, oh, ow,
                                                                    lay == SF_LAYOUT_NHWC, total, y, argmax);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_maxpool_bwd(const float *dy, const int32_t *argmax, int n, int c, int h, int w, int k,
                                   int stride, int pad, sf_layout lay, float *dx, cudaStream_t s)
{
    int oh, ow;
    if (pool_check("sf_cuda_maxpool_bwd", n, c, h, w, k, stride, pad, &oh, &ow))
        return -1;
    const size_t total = (size_t)n * c * h * w;
    if (k == 3 && stride == 2)
        k_maxpool_bwd<3, 2><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(dy, argmax, c, h, w, k, stride, pad, oh, ow,
                                                                    lay == SF_LAYOUT_NHWC, total, dx);
    else
        k_maxpool_bwd<0, 0><<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(dy, argmax, c, h, w, k, stride, pad, oh, ow,
                                                                    lay == SF_LAYOUT_NHWC, total, dx);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ---- global average pooling ----------------------------------------------- */

extern "C" int sf_cuda_avgpool_fwd(const float *x, int n, int c, int h, int w, sf_layout lay, float *y,
                                   cudaStream_t s)
{
    if (n < 1 || c < 1 || h < 1 || w < 1) {
        sf_cuda_set_error("%s:%d: sf_cuda_avgpool_fwd: n=%d c=%d h=%d w=%d", __FILE__, __LINE__, n, c, h, w);
        return -1;
    }
    const size_t planes = (size_t)n * c;
    if (lay == SF_LAYOUT_NHWC)
        k_avgpool_fwd_nhwc<<<w_blocks(planes, W_TPB), W_TPB, 0, s>>>(x, n, c, h * w, y);
    else
        k_avgpool_fwd_nchw<<<w_blocks(planes * 32, W_TPB), W_TPB, 0, s>>>(x, planes, h * w, y);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_avgpool_bwd(const float *dy, int n, int c, int h, int w, sf_layout lay, float *dx,
                                   cudaStream_t s)
{
    if (n < 1 || c < 1 || h < 1 || w < 1) {
        sf_cuda_set_error("%s:%d: sf_cuda_avgpool_bwd: n=%d c=%d h=%d w=%d", __FILE__, __LINE__, n, c, h, w);
        return -1;
    }
    const size_t total = (size_t)n * c * h * w;
    k_avgpool_bwd<<<w_blocks(total, W_TPB), W_TPB, 0, s>>>(dy, total, c, h * w, lay == SF_LAYOUT_NHWC, dx);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ---- residual add ------------------------------------------------------------ */

extern "C" int sf_cuda_add(const float *a, const float *b, float *y, size_t len, int relu, cudaStream_t s)
{
    if (len == 0)
        return 0;
    if (len % 4 == 0 && w_al16(a) && w_al16(b) && w_al16(y))
        k_add<4><<<w_blocks(len / 4, W_TPB), W_TPB, 0, s>>>(a, b, y, len / 4, relu);
    else
        k_add<1><<<w_blocks(len, W_TPB), W_TPB, 0, s>>>(a, b, y, len, relu);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ---- AdamW ------------------------------------------------------------------- */

extern "C" void sf_adamw_hyper_at(sf_adamw_hyper *h, int64_t t)
{
    /* in double, as PyTorch computes them in Python floats */
    const double bc1 = 1.0 - pow((double)h->beta1, (double)t);
    const double bc2 = 1.0 - pow((double)h->beta2, (double)t);
    h->step_size = (float)((double)h->lr / bc1);
    h->bc2_sqrt = (float)sqrt(bc2);
    h->pad_ = 0.f;
}

extern "C" int sf_cuda_adamw(float *p, const float *g, float *m, float *v, float *wdev, size_t len,
                             const sf_adamw_hyper *d_hyper, const sf_sgd_segs *segs, cudaStream_t s)
{
    if (len == 0)
        return 0;
    if (!w_al16(p) || !w_al16(g) || !w_al16(m) || !w_al16(v)) {
        sf_cuda_set_error("%s:%d: sf_cuda_adamw: buffers must be 16-byte aligned", __FILE__, __LINE__);
        return -1;
    }
    sf_sgd_segs none;
    none.n = 0;
    const sf_sgd_segs *sg = segs ? segs : &none;
    if (sg->n > 0 && !wdev) {
        sf_cuda_set_error("%s:%d: sf_cuda_adamw: permuted segments need wdev", __FILE__, __LINE__);
        return -1;
    }
    k_adamw<<<w_blocks((len + 3) / 4, W_TPB), W_TPB, 0, s>>>(p, g, m, v, wdev, len, d_hyper, *sg);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ======================================================================== */
/* ConvTranspose2d: plans over layers.cu's convolutions                     */
/* ======================================================================== */

/* The conv direction that computes each convT direction (see the header). */
static const sf_conv_dir convt_as_conv[3] = {SF_CONV_BWD_DATA, SF_CONV_FWD, SF_CONV_BWD_FILTER};

static int convt_out(const sf_convt_desc *d, int *oh, int *ow)
{
    *oh = (d->h - 1) * d->stride - 2 * d->pad + d->k;
    *ow = (d->w - 1) * d->stride - 2 * d->pad + d->k;
    return *oh >= 1 && *ow >= 1;
}

/* The convolution whose adjoint the convT is: input [n, oc, oh, ow], weight
 * [c][oc][k][k] as KCRS, output [n, c, h, w]. */
static int convt_conv_desc(const sf_convt_desc *d, sf_conv_desc *cd)
{
    int oh, ow;
    if (d->n < 1 || d->c < 1 || d->h < 1 || d->w < 1 || d->oc < 1 || d->k < 1 || d->stride < 1 || d->pad < 0 ||
        !convt_out(d, &oh, &ow)) {
        sf_cuda_set_error("%s:%d: convT n=%d c=%d %dx%d oc=%d k=%d s=%d p=%d: bad shape", __FILE__, __LINE__,
                          d->n, d->c, d->h, d->w, d->oc, d->k, d->stride, d->pad);
        return -1;
    }
    memset(cd, 0, sizeof *cd);
    cd->n = d->n;
    cd->c = d->oc;
    cd->h = oh;
    cd->w = ow;
    cd->oc = d->c;
    cd->k = d->k;
    cd->stride = d->stride;
    cd->pad = d->pad;
    cd->layout = d->layout;
    cd->tf32 = d->tf32;
    cd->align_x = d->align_y;
    cd->align_w = d->align_w;
    cd->align_y = d->align_x;
    return 0;
}

static sf_conv_ptrs convt_conv_ptrs(const sf_convt_ptrs *p)
{
    sf_conv_ptrs q;
    q.x = p->y;
    q.w = p->w;
    q.y = p->x;
    q.ws = p->ws;
    q.b = NULL;
    return q;
}

extern "C" void sf_convt_plans_destroy(sf_convt_plans *p)
{
    if (!p)
        return;
    for (int i = 0; i < 3; i++) {
        if (p->vp[i])
            sf_conv_vpack_destroy(p->vp[i]);
        sf_conv_plan_destroy(&p->plan[i]);
    }
    memset(p, 0, sizeof *p);
}

extern "C" int sf_convt_plans_build(cudnnHandle_t h, const sf_convt_desc *d, int dirs, size_t ws_limit,
                                    int max_candidates, const sf_convt_ptrs *tune, sf_convt_plans *out)
{
    memset(out, 0, sizeof *out);
    sf_conv_desc cd;
    if (convt_conv_desc(d, &cd))
        return -1;
    out->d = *d;
    sf_conv_ptrs tp;
    if (tune)
        tp = convt_conv_ptrs(tune);
    for (int dir = 0; dir < 3; dir++) {
        if (!(dirs & (1 << dir)))
            continue;
        if (sf_conv_plan_build(h, &cd, convt_as_conv[dir], ws_limit, max_candidates, tune ? &tp : NULL,
                               &out->plan[dir])) {
            sf_convt_plans_destroy(out);
            return -1;
        }
        out->dirs |= 1 << dir;
    }
    return 0;
}

extern "C" size_t sf_convt_ws_bytes(const sf_convt_plans *p)
{
    size_t m = 0;
    for (int i = 0; i < 3; i++)
        if ((p->dirs & (1 << i)) && (size_t)p->plan[i].ws_bytes > m)
            m = (size_t)p->plan[i].ws_bytes;
    return m;
}

extern "C" int sf_convt_run(cudnnHandle_t h, sf_convt_plans *p, sf_conv_dir dir, const sf_convt_ptrs *ptrs)
{
    if ((int)dir < 0 || (int)dir > 2 || !(p->dirs & (1 << dir))) {
        sf_cuda_set_error("%s:%d: sf_convt_run: direction %d not built", __FILE__, __LINE__, (int)dir);
        return -1;
    }
    if (!p->vp[dir] || memcmp(&p->vp_ptrs[dir], ptrs, sizeof *ptrs) != 0) {
        if (p->vp[dir]) {
            sf_conv_vpack_destroy(p->vp[dir]);
            p->vp[dir] = NULL;
        }
        const sf_conv_ptrs q = convt_conv_ptrs(ptrs);
        if (sf_conv_vpack_make(&q, &p->vp[dir]))
            return -1;
        p->vp_ptrs[dir] = *ptrs;
    }
    return sf_conv_run(h, &p->plan[dir], p->vp[dir]);
}

extern "C" sf_convt_plans *sf_convt_cache_get(cudnnHandle_t h, sf_convt_cache *c, const sf_convt_desc *d,
                                              int dirs, size_t ws_limit, int max_candidates)
{
    for (int i = 0; i < c->n; i++)
        if (memcmp(&c->e[i].d, d, sizeof *d) == 0 && (c->e[i].dirs & dirs) == dirs)
            return &c->e[i];
    /* A set of this shape lacking a direction is rebuilt in place with the union. */
    int slot = -1;
    for (int i = 0; i < c->n; i++)
        if (memcmp(&c->e[i].d, d, sizeof *d) == 0) {
            dirs |= c->e[i].dirs;
            sf_convt_plans_destroy(&c->e[i]);
            slot = i;
            break;
        }
    if (slot < 0) {
        if (c->n >= SF_CONVT_CACHE_MAX) {
            sf_cuda_set_error("%s:%d: sf_convt_cache_get: cache full (%d shapes)", __FILE__, __LINE__,
                              SF_CONVT_CACHE_MAX);
            return NULL;
        }
        slot = c->n;
    }
    if (sf_convt_plans_build(h, d, dirs, ws_limit, max_candidates, NULL, &c->e[slot])) {
        /* keep the cache dense: move the last entry into a freed middle slot */
        if (slot < c->n) {
            c->n--;
            if (slot != c->n) {
                c->e[slot] = c->e[c->n];
                memset(&c->e[c->n], 0, sizeof c->e[c->n]);
            }
        }
        return NULL;
    }
    if (slot == c->n)
        c->n++;
    return &c->e[slot];
}

extern "C" void sf_convt_cache_destroy(sf_convt_cache *c)
{
    for (int i = 0; i < c->n; i++)
        sf_convt_plans_destroy(&c->e[i]);
    c->n = 0;
}

extern "C" int sf_convt_bias_act(const sf_convt_desc *d, float *y, const float *b, int relu, cudaStream_t s)
{
    int oh, ow;
    if (!convt_out(d, &oh, &ow)) {
        sf_cuda_set_error("%s:%d: sf_convt_bias_act: bad shape", __FILE__, __LINE__);
        return -1;
    }
    if (d->layout == SF_LAYOUT_NHWC)
        return sf_cuda_bias_act(y, b, (size_t)d->n * oh * ow, d->oc, 1, relu, s);
    return sf_cuda_bias_act(y, b, (size_t)d->n, d->oc, (size_t)oh * ow, relu, s);
}

extern "C" int sf_convt_bias_grad(const sf_convt_desc *d, float *dy, const float *y, float *db, float *scratch,
                                  cudaStream_t s)
{
    int oh, ow;
    if (!convt_out(d, &oh, &ow)) {
        sf_cuda_set_error("%s:%d: sf_convt_bias_grad: bad shape", __FILE__, __LINE__);
        return -1;
    }
    if (d->layout == SF_LAYOUT_NHWC)
        return sf_cuda_bias_grad(dy, y, (size_t)d->n * oh * ow, d->oc, 1, db, scratch, s);
    return sf_cuda_bias_grad(dy, y, (size_t)d->n, d->oc, (size_t)oh * ow, db, scratch, s);
}
