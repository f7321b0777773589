/* gpu/cuda/conv_patch.cu — the one-pass backward of a non-overlapping
 * convolution (why and semantics: conv_patch.h).
 *
 * A block walks chunks of PC consecutive output pixels ("patches"). Per chunk
 * it stages dyr (dy masked by y > 0), both as [patch][o] and as [o][patch],
 * and the patches' inputs x as [patch][q] in shared memory; then every thread
 * computes a 4 patch x 4 input tile of dx (a product over the 32 outputs with
 * the weights, which stay in shared memory) and adds a 4 output x 4 input
 * tile of dW over half the chunk's patches into registers it keeps across
 * chunks. Each shared load feeds four multiply-adds (float4 operands), which
 * keeps the FMA units, not the shared-memory pipe, the limit of the compute
 * half, and three blocks per SM overlap one block's loads with another's
 * arithmetic. A patch's inputs are k runs of k*c contiguous elements (one per
 * input row it covers), and consecutive patches' runs are adjacent, so the x
 * and dx accesses of a warp cover whole 128-byte lines.
 */
#include "gpu/cuda/conv_patch.h"

#include <limits.h>

#include "gpu/cuda/check.h"
#include "gpu/cuda/kernel_common.cuh"

namespace {

constexpr int PQ = 64;  /* inputs per patch (k*k*c) */
constexpr int PO = 32;  /* outputs per patch (oc) */
constexpr int PC = 64;  /* patches per chunk */
constexpr int PT = 256; /* threads per block */
constexpr int DTS = PC + 4; /* row stride of the [o][patch] copy: 16-byte rows */
constexpr int NJ = PO * PQ + PO; /* partial sums per block: dW, then db */
/* Blocks of the first pass: a constant, so the partial sums (and the
 * rounding) depend on the shape alone; two waves of three blocks per SM on
 * a 132-SM H100. */
constexpr int PATCH_BWD_BLOCKS = 792;

static_assert(PT == (PC / 4) * (PQ / 4), "one 4 x 4 tile of dx per thread");

/* a[i][j] += u_i v_j: one float4 operand pair, sixteen multiply-adds. */
__device__ __forceinline__ void outer4(float (&a)[4][4], const float4 u, const float4 v)
{
    const float uu[4] = {u.x, u.y, u.z, u.w}, vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            a[i][j] = fmaf(uu[i], vv[j], a[i][j]);
}
static_assert(PT == 2 * (PO / 4) * (PQ / 4), "one 4 x 4 tile of dW per thread and patch parity");
static_assert(PT % (PQ / 4) == 0 && PT % (PO / 4) == 0, "a thread loads the same columns in every row");

__global__ void __launch_bounds__(PT, 3)
    k_patch_bwd(const float *__restrict__ x, const float *__restrict__ w, const float *__restrict__ y,
                const float *__restrict__ dy, float *__restrict__ dx, float *__restrict__ part, unsigned P, unsigned wo, size_t rowx, int kc)
{
    __shared__ __align__(16) float sW[PO * PQ];
    __shared__ __align__(16) float sDT[PO * DTS];
    __shared__ __align__(16) float sD[PC * PO];
    __shared__ __align__(16) float sX[PC * PQ];
    __shared__ float red[PT / 32][PO];
    const int t = threadIdx.x;
    for (int e = t; e < PO * PQ; e += PT)
        sW[e] = w[e];
    /* The thread's inputs q0..q0+3 in every role (x loads, dx and dW tiles):
     * row q0 / kc of the patch's k input rows, element q0 % kc of that row
     * (kc is a multiple of 4, so the four share a row). A patch (r, j) of
     * output row r starts at r * krow + j * kc. */
    const int q0 = 4 * (t & 15);
    const size_t xoff = (size_t)(q0 / kc) * rowx + (size_t)(q0 % kc), krow = rowx * (size_t)(PQ / kc);
    const int o4 = t & 7;                          /* dy loads: outputs 4*o4.. */
    const int pg = t >> 4;                         /* dx: patches 4*pg.. */
    const int par = t >> 7, og = (t & 127) >> 4;   /* dW: patches of parity par, outputs 4*og.. */
    float aw[4][4], ab[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        ab[i] = 0.f;
#pragma unroll
        for (int j = 0; j < 4; j++)
            aw[i][j] = 0.f;
    }
    const unsigned nch = (P + PC - 1) / PC;
    for (unsigned ch = blockIdx.x; ch < nch; ch += gridDim.x) {
        const unsigned p0 = ch * PC;
        __syncthreads(); /* the previous chunk's (and the weights') readers are done */
#pragma unroll
        for (int u = 0; u < PC * PO / 4 / PT; u++) {
            const int p = (t + PT * u) >> 3;
            const unsigned gp = p0 + p;
            float d[4] = {0.f, 0.f, 0.f, 0.f};
            if (gp < P) {
                cu_ld<float, 4>(dy + (size_t)gp * PO + 4 * o4, d);
                if (y) {
                    float yv[4];
                    cu_ld<float, 4>(y + (size_t)gp * PO + 4 * o4, yv);
#pragma unroll
                    for (int m = 0; m < 4; m++)
                        d[m] = yv[m] > 0.f ? d[m] : 0.f;
                }
            }
#pragma unroll
            for (int m = 0; m < 4; m++) {
                ab[m] += d[m];
                sDT[(4 * o4 + m) * DTS + p] = d[m];
            }
            *reinterpret_cast<float4 *>(&sD[p * PO + 4 * o4]) = make_float4(d[0], d[1], d[2], d[3]);
        }
#pragma unroll
        for (int u = 0; u < PC * PQ / 4 / PT; u++) {
            const int p = (t + PT * u) >> 4;
            const unsigned gp = p0 + p;
            float v[4] = {0.f, 0.f, 0.f, 0.f};
            if (gp < P) {
                const unsigned r = gp / wo, j = gp - r * wo;
                cu_ld<float, 4>(x + (size_t)r * krow + (size_t)j * kc + xoff, v);
            }
            *reinterpret_cast<float4 *>(&sX[p * PQ + q0]) = make_float4(v[0], v[1], v[2], v[3]);
        }
        __syncthreads();
        if (dx) {
            float a[4][4];
#pragma unroll
            for (int m = 0; m < 4; m++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    a[m][j] = 0.f;
#pragma unroll 8
            for (int o = 0; o < PO; o++) {
                outer4(a, *reinterpret_cast<const float4 *>(&sDT[o * DTS + 4 * pg]),
                       *reinterpret_cast<const float4 *>(&sW[o * PQ + q0]));
            }
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const unsigned gp = p0 + 4 * pg + m;
                if (gp < P) {
                    const unsigned r = gp / wo, j = gp - r * wo;
                    cu_st<float, 4>(dx + (size_t)r * krow + (size_t)j * kc + xoff, a[m]);
                }
            }
        }
#pragma unroll 4
        for (int p = par; p < PC; p += 2) {
            outer4(aw, *reinterpret_cast<const float4 *>(&sD[p * PO + 4 * og]),
                   *reinterpret_cast<const float4 *>(&sX[p * PQ + q0]));
        }
    }
    /* The block's partial sums. dW: the odd patches' tiles through shared
     * memory to the even ones'; db: threads with the same o4 hold the same
     * four outputs (four per warp, then eight warps). */
    float *sAcc = sX;
    __syncthreads();
    if (par == 1) {
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                sAcc[(4 * og + i) * PQ + q0 + j] = aw[i][j];
    }
#pragma unroll
    for (int m = 0; m < 4; m++) {
        float v = ab[m];
        v += __shfl_down_sync(0xffffffffu, v, 16);
        v += __shfl_down_sync(0xffffffffu, v, 8);
        if ((t & 31) < 8)
            red[t >> 5][4 * o4 + m] = v;
    }
    __syncthreads();
    float *out = part + (size_t)blockIdx.x * NJ;
    if (par == 0) {
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int e = (4 * og + i) * PQ + q0 + j;
                out[e] = aw[i][j] + sAcc[e];
            }
    }
    if (t < PO) {
        float v = 0.f;
#pragma unroll
        for (int k = 0; k < PT / 32; k++)
            v += red[k][t];
        out[PO * PQ + t] = v;
    }
}

} /* namespace */

extern "C" int sf_conv_patch_ok(sf_layout lay, int c, int h, int w, int oc, int k, int stride, int pad)
{
    return lay == SF_LAYOUT_NHWC && k >= 2 && stride == k && pad == 0 && c >= 1 && k * k * c == PQ &&
           (k * c) % 4 == 0 && oc == PO && h >= k && w >= k && h % k == 0 && w % k == 0;
}

extern "C" size_t sf_conv_patch_scratch_floats(int c, int oc, int k)
{
    (void)c;
    (void)oc;
    (void)k;
    return (size_t)PATCH_BWD_BLOCKS * NJ;
}

extern "C" int sf_conv_patch_bwd(sf_dtype dt, const void *x, const void *w, const void *y, const void *dy, void *dx,
                                 void *dw, float *db, int n, int c, int h, int wd, int oc, int k, float *scratch,
                                 cudaStream_t s)
{
    if (!sf_conv_patch_ok(SF_LAYOUT_NHWC, c, h, wd, oc, k, k, 0) || dt != SF_DT_F32) {
        sf_cuda_set_error("%s:%d: sf_conv_patch_bwd: no kernel for %d -> %d channels, k%d, %dx%d (dtype %d)",
                          __FILE__, __LINE__, c, oc, k, h, wd, (int)dt);
        return -1;
    }
    if (!cu_al16(x) || !cu_al16(dy) || (y && !cu_al16(y)) || (dx && !cu_al16(dx))) {
        sf_cuda_set_error("%s:%d: sf_conv_patch_bwd: x, y, dy and dx must be 16-byte aligned", __FILE__,
                          __LINE__);
        return -1;
    }
    const size_t P = (size_t)(n < 0 ? 0 : n) * (size_t)(h / k) * (size_t)(wd / k);
    if (P == 0) {
        /* no pixels: the gradients are zero */
        SF_CUDA_CHECK(cudaMemsetAsync(dw, 0, sizeof(float) * oc * PQ, s));
        if (db)
            SF_CUDA_CHECK(cudaMemsetAsync(db, 0, sizeof(float) * oc, s));
        return 0;
    }
    if (P > (size_t)UINT_MAX - PC) {
        sf_cuda_set_error("%s:%d: sf_conv_patch_bwd: %zu output pixels, more than the kernel indexes", __FILE__,
                          __LINE__, P);
        return -1;
    }
    const unsigned nch = (unsigned)((P + PC - 1) / PC);
    const int nblk = (int)(nch < PATCH_BWD_BLOCKS ? nch : PATCH_BWD_BLOCKS);
    k_patch_bwd<<<nblk, PT, 0, s>>>((const float *)x, (const float *)w, (const float *)y, (const float *)dy,
                                    (float *)dx, scratch, (unsigned)P, (unsigned)(wd / k), (size_t)wd * c, k * c);
    SF_CUDA_CHECK_LAUNCH();
    k_sum_partials<float><<<cu_blocks((size_t)NJ * 32, CU_TPB), CU_TPB, 0, s>>>(scratch, nblk, PO * PQ, NJ,
                                                                               (float *)dw, db);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ---- the transposed convolution's forward, NCHW ---------------------------- */

namespace {

constexpr int TCO = 8; /* output channels per thread */

/* Each warp takes 32 consecutive input pixels and TCO output channels; warps
 * next to each other take the other channel groups of the same pixels, so
 * their x loads hit in cache. A lane multiplies its pixel's CI inputs by the
 * weights (shared memory, float4 per (ci, co): the 2 x 2 outputs) into
 * TCO x 4 accumulators and stores each output row pair as float2. */
template <int CI, int CO>
__global__ void __launch_bounds__(CU_TPB)
    k_convt_patch_fwd(const float *__restrict__ x, const float *__restrict__ w, const float *__restrict__ b,
                      float *__restrict__ y, size_t P, unsigned hw, unsigned wi, int relu)
{
    static_assert(CO % TCO == 0, "whole channel groups");
    constexpr int G = CO / TCO;
    __shared__ __align__(16) float sw[CI * CO * 4];
    __shared__ float sb[CO];
    for (int e = threadIdx.x; e < CI * CO * 4; e += blockDim.x)
        sw[e] = w[e];
    for (int e = threadIdx.x; e < CO; e += blockDim.x)
        sb[e] = b ? b[e] : 0.f;
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const size_t items = (P + 31) / 32 * G;
    const size_t wstep = (size_t)gridDim.x * (blockDim.x >> 5);
    for (size_t it = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); it < items; it += wstep) {
        const int g = (int)(it % G);
        const size_t pix = it / G * 32 + lane;
        if (pix >= P)
            continue;
        const size_t n = pix / hw;
        const unsigned p = (unsigned)(pix - n * hw), i = p / wi, j = p - i * wi;
        const float *xp = x + n * CI * hw + p;
        float a[TCO][4];
#pragma unroll
        for (int c = 0; c < TCO; c++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                a[c][q] = 0.f;
#pragma unroll 8
        for (int ci = 0; ci < CI; ci++) {
            const float xv = __ldg(xp + (size_t)ci * hw);
            const float4 *wr = reinterpret_cast<const float4 *>(sw + (ci * CO + g * TCO) * 4);
#pragma unroll
            for (int c = 0; c < TCO; c++) {
                const float4 wv = wr[c];
                a[c][0] = fmaf(xv, wv.x, a[c][0]);
                a[c][1] = fmaf(xv, wv.y, a[c][1]);
                a[c][2] = fmaf(xv, wv.z, a[c][2]);
                a[c][3] = fmaf(xv, wv.w, a[c][3]);
            }
        }
        const size_t ow = 2 * (size_t)wi, ohw = 4 * (size_t)hw;
        float *yp = y + (n * CO + (size_t)g * TCO) * ohw + (2 * (size_t)i) * ow + 2 * (size_t)j;
#pragma unroll
        for (int c = 0; c < TCO; c++) {
            float v[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                v[q] = a[c][q] + sb[g * TCO + c];
                if (relu)
                    v[q] = fmaxf(v[q], 0.f);
            }
            *reinterpret_cast<float2 *>(yp + c * ohw) = make_float2(v[0], v[1]);
            *reinterpret_cast<float2 *>(yp + c * ohw + ow) = make_float2(v[2], v[3]);
        }
    }
}

template <int CI, int CO>
int convt_patch_fwd(const float *x, const float *w, const float *b, float *y, size_t P, unsigned hw, unsigned wi,
                    int relu, cudaStream_t s)
{
    const size_t warps = (P + 31) / 32 * (CO / TCO);
    const size_t most = (size_t)cu_sms() * 8; /* a full device of 256-thread blocks, 2048 threads per SM */
    const size_t want = cu_cdiv(warps, CU_TPB / 32);
    k_convt_patch_fwd<CI, CO><<<(unsigned)(want < most ? want : most), CU_TPB, 0, s>>>(x, w, b, y, P, hw, wi, relu);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

} /* namespace */

extern "C" int sf_convt_patch_ok(sf_layout lay, int c, int oc, int k, int stride, int pad)
{
    return lay == SF_LAYOUT_NCHW && k == 2 && stride == 2 && pad == 0 && ((c == 32 && oc == 16) || (c == 64 && oc == 32));
}

extern "C" int sf_convt_patch_fwd(sf_dtype dt, const void *x, const void *w, const float *b, void *y, int n, int c,
                                  int h, int wd, int oc, int k, int relu, cudaStream_t s)
{
    if (!sf_convt_patch_ok(SF_LAYOUT_NCHW, c, oc, k, k, 0) || dt != SF_DT_F32 || h < 1 || wd < 1) {
        sf_cuda_set_error("%s:%d: sf_convt_patch_fwd: no kernel for %d -> %d channels, k%d, %dx%d (dtype %d)",
                          __FILE__, __LINE__, c, oc, k, h, wd, (int)dt);
        return -1;
    }
    if ((uintptr_t)y & 7u) {
        sf_cuda_set_error("%s:%d: sf_convt_patch_fwd: y must be 8-byte aligned", __FILE__, __LINE__);
        return -1;
    }
    const size_t P = (size_t)(n < 0 ? 0 : n) * h * wd;
    if (P == 0)
        return 0;
    if (c == 32)
        return convt_patch_fwd<32, 16>((const float *)x, (const float *)w, b, (float *)y, P, (unsigned)(h * wd),
                                       (unsigned)wd, relu, s);
    return convt_patch_fwd<64, 32>((const float *)x, (const float *)w, b, (float *)y, P, (unsigned)(h * wd),
                                   (unsigned)wd, relu, s);
}
