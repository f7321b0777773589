/* gpu/cuda/augment.cu — the fused augmentation kernel (gpu/aug.h semantics).
 *
 * One kernel, one launch. A block of NT threads owns a TH x TW tile of one sample's
 * output, all channels:
 *
 *   A. geometry: for every pixel of the tile plus the blur's halo (R = ksize/2 on each
 *      side, its positions reflected into the image as the blur's padding), map the
 *      output pixel centre through the sample's inverse affine map and resample the
 *      uint8 source (bilinear or nearest with taps clamped into the sample's clamp
 *      box, times a rotation's coverage; or the antialias filter) into shared
 *      memory, one slot per channel ([GH][GWP], GWP odd).
 *   B. horizontal blur, channel by channel, into the slot the previous channel's
 *      geometry has just vacated (see blur_tile).
 *   C. vertical blur into registers (2 rows x 4 pixels x C channels per thread), the
 *      pointwise stages in list order, vectorised stores.
 * Without a blur, a thread resamples its own 8 pixels straight into registers and
 * only C runs. The halo is recomputed per tile rather than kept in device memory:
 * geometry costs about 120 instructions per pixel, while a float intermediate
 * would triple the device-memory traffic, so no scratch buffer is needed.
 *
 * Cost model (W1 batch: 32 x 256x256x3 NHWC, crop 128, resize 256, rotate, blur
 * k7, normalize; ncu on an H100). The kernel is bound by instruction issue and by
 * the L1 traffic of the byte gathers, not by device memory (DRAM ~3% busy):
 * 20.3M warp instructions, issue slots 58% busy, L1/TEX 74%, 4 blocks of 256
 * threads per SM (64 registers, 45 KB shared memory). Stage A is about half of
 * the instructions: 32x64 tiles with a 3-pixel halo compute 1.30 geometry pixels
 * per output pixel, each with 12 byte loads. Measured: 37 us per batch (860k
 * images/s), 3.5x the memory bound of 10.5 us (31.5 MB at the 3.0 TB/s copy rate).
 * (Those figures predate the clamp box and the rotation's coverage, which add about
 * 15 instructions per geometry pixel; the W1 kernel keeps 64 registers.)
 * Hence the instruction-count habits: no integer division in loops, branch-free
 * bilinear taps (a clamped coordinate, so every address is inside), one 64-bit add per tap
 * pointer with the channel in the load's immediate, the sample base pinned in a
 * register, mode-specialised geometry loops, compile-time blur widths k = 3..9
 * with weights and windows in registers.
 *
 * Rounding. Source coordinates, floors and tap weights are computed with explicit
 * round-to-nearest intrinsics in the reference's order (gpu/ref/augment.c, ISO C,
 * not contracted), so every pixel takes the same taps and weights as the
 * reference: one FMA there could move a coordinate across a rounding boundary and
 * change a whole pixel. The blur's and the interpolation's multiply-adds use
 * SF_MAC: one fused rounding by default (SF_AUG_FMA=1; ~1.6e-7 relative to the
 * reference, 37 us on W1), or two roundings, bit-identical to the reference, with
 * -DSF_AUG_FMA=0 (43 us on W1).
 *
 * Sources: every sample is read at src + its src_off with its own src_h x src_w
 * (ragged batches and uniform ones alike). Antialiased plans run in kernels of
 * their own (AA), whose per-pixel tap loops have data-dependent lengths.
 *
 * Threads: t = threadIdx.x; q4 = t & 7, rp = t >> 3. In C a thread owns output
 * pixels x = 4*q4 .. 4*q4+3 of tile rows 2*rp and 2*rp+1.
 */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "augment.h"
#include "aug_post.h"
#include "check.h"
#include "../rng.h"

#ifndef SF_AUG_FMA
#define SF_AUG_FMA 1
#endif
#if SF_AUG_FMA
#define SF_MAC(acc, w, x) __fmaf_rn((w), (x), (acc))
#else
#define SF_MAC(acc, w, x) __fadd_rn((acc), __fmul_rn((w), (x)))
#endif

namespace {

#ifndef SF_AUG_TH
#define SF_AUG_TH 64
#endif
constexpr int TW = 32;        /* tile width (output pixels) */
constexpr int TH = SF_AUG_TH; /* tile height: 64 (a build knob for benchmarks: 32) */
constexpr int NT = (TW / 4) * (TH / 2); /* threads per block: 256 */
constexpr int HS = TW + 4; /* row stride of H in floats: 16-byte rows that rotate banks */
static_assert((TW / 4) * (TH / 2) == NT, "one thread per 2 x 4 output pixels");

/* ---- small device helpers ------------------------------------------------ */

/* Reflect padding as torch's "reflect" (the edge is not repeated): -1 -> 1,
 * n -> n-2. Folds repeatedly, so any index maps into [0, n). */
__device__ __forceinline__ int reflect_idx(int i, int n)
{
    if ((unsigned)i < (unsigned)n) return i;
    if (n == 1) return 0;
    const int p = 2 * (n - 1);
    i %= p;
    if (i < 0) i += p;
    return i < n ? i : p - i;
}

/* inv[0]*ox + inv[1]*oy + inv[2], left to right, without contraction. */
__device__ __forceinline__ float affine_rn(float a, float b, float c, float ox, float oy)
{
    return __fadd_rn(__fadd_rn(__fmul_rn(a, ox), __fmul_rn(b, oy)), c);
}

__device__ __forceinline__ float u8f(uint8_t b) { return __uint2float_rn((uint32_t)b); }

/* Channel ch of the pixel at p (NHWC: p[ch]; NCHW: planes `plane` bytes apart).
 * The pointer is formed first so that NHWC's channel offset folds into the
 * load's immediate (a 32-bit o + ch could wrap, which stops the compiler). */
template <int C, bool NHWC>
__device__ __forceinline__ float tap(const uint8_t *__restrict__ p, int ch, size_t plane)
{
    return u8f(__ldg(NHWC ? p + ch : p + ch * plane));
}

/* Resampling modes; a template parameter so the per-pixel loop carries no mode
 * branches. GEO_ROT marks a rotation, whose coverage multiplies the sample. */
enum GeoMode {
    GEO_IDENTITY = 0, GEO_NEAREST = 1, GEO_BILINEAR = 2, GEO_AA = 3, GEO_AA_ROT = 4,
    GEO_ROT = 8
};

__host__ __device__ __forceinline__ int geo_mode(const sf_aug_plan &P)
{
    if (!P.has_geom) return GEO_IDENTITY;
    const int rot = P.has_rot ? GEO_ROT : 0;
    if (P.interp == SF_INTERP_NEAREST) return GEO_NEAREST | rot;
    if (P.antialias) return P.has_rot ? GEO_AA_ROT : GEO_AA;
    return GEO_BILINEAR | rot;
}

/* One sample's geometry, read once per thread from its sf_aug_sample. */
struct Geo {
    float inv[6];
    int xlo, ylo, xhi, yhi;         /* clamp box */
    float rot[4], pre[4], rw, rh;   /* rotation input <-> source, its size */
    float ax, ay, axi, ayi;         /* antialias supports and their inverses */
};

__device__ __forceinline__ void load_geo(const sf_aug_sample *S, Geo &g)
{
#pragma unroll
    for (int k = 0; k < 6; ++k) g.inv[k] = S->inv[k];
    g.xlo = S->clip[0]; g.ylo = S->clip[1]; g.xhi = S->clip[2]; g.yhi = S->clip[3];
#pragma unroll
    for (int k = 0; k < 4; ++k) { g.rot[k] = S->rot[k]; g.pre[k] = S->pre[k]; }
    g.rw = S->rot_w; g.rh = S->rot_h;
    g.ax = S->aa[0]; g.ay = S->aa[1];
    g.axi = __fdiv_rn(1.f, g.ax); g.ayi = __fdiv_rn(1.f, g.ay);
}

/* Coverage of the rotation's input along one axis (gpu/ref/augment.c cover1). */
__device__ __forceinline__ float cover1(float u, float n)
{
    return fmaxf(fminf(fminf(__fadd_rn(u, 1.f), __fsub_rn(n, u)), 1.f), 0.f);
}

/* torch's antialias triangle filter. */
__device__ __forceinline__ float aa_tri(float d)
{
    d = fabsf(d);
    return d < 1.f ? __fsub_rn(1.f, d) : 0.f;
}

/* The antialiased sample at source point (sx, sy) (gpu/ref/augment.c aa_sample):
 * the point clamped to the box's pixel centres, the taps of the filter's support
 * inside the box, normalised by the product of the weight sums. The loop bounds
 * vary per pixel; the work per image is about 4 taps per source pixel. */
template <int C, bool NHWC>
__device__ __forceinline__ void aa_sample(const Geo &g, const uint8_t *__restrict__ s, int W, int H,
                                          float sx, float sy, float (&v)[C])
{
    constexpr int px = NHWC ? C : 1;
    const uint32_t row = (uint32_t)W * px;
    const size_t plane = (size_t)W * H;
    const float pxf = fminf(fmaxf(sx, __fadd_rn((float)g.xlo, 0.5f)), __fadd_rn((float)g.xhi, 0.5f));
    const float pyf = fminf(fmaxf(sy, __fadd_rn((float)g.ylo, 0.5f)), __fadd_rn((float)g.yhi, 0.5f));
    const int i0 = max((int)floorf(__fadd_rn(__fsub_rn(pxf, g.ax), 0.5f)), g.xlo);
    const int i1 = min((int)floorf(__fadd_rn(__fadd_rn(pxf, g.ax), 0.5f)), g.xhi + 1);
    const int j0 = max((int)floorf(__fadd_rn(__fsub_rn(pyf, g.ay), 0.5f)), g.ylo);
    const int j1 = min((int)floorf(__fadd_rn(__fadd_rn(pyf, g.ay), 0.5f)), g.yhi + 1);
    float sumx = 0.f, sumy = 0.f;
    for (int i = i0; i < i1; ++i)
        sumx = __fadd_rn(sumx, aa_tri(__fmul_rn(__fsub_rn(__fadd_rn((float)i, 0.5f), pxf), g.axi)));
    for (int j = j0; j < j1; ++j)
        sumy = __fadd_rn(sumy, aa_tri(__fmul_rn(__fsub_rn(__fadd_rn((float)j, 0.5f), pyf), g.ayi)));
    float acc[C];
#pragma unroll
    for (int c = 0; c < C; ++c) acc[c] = 0.f;
    for (int j = j0; j < j1; ++j) {
        const float wy = aa_tri(__fmul_rn(__fsub_rn(__fadd_rn((float)j, 0.5f), pyf), g.ayi));
        float r[C];
#pragma unroll
        for (int c = 0; c < C; ++c) r[c] = 0.f;
        const uint8_t *p = s + (uint32_t)j * row + (uint32_t)i0 * px;
        for (int i = i0; i < i1; ++i, p += px) {
            const float wx = aa_tri(__fmul_rn(__fsub_rn(__fadd_rn((float)i, 0.5f), pxf), g.axi));
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const float t = tap<C, NHWC>(p, c, plane);
                r[c] = SF_MAC(r[c], wx, t);
            }
        }
#pragma unroll
        for (int c = 0; c < C; ++c) acc[c] = SF_MAC(acc[c], wy, r[c]);
    }
    const float norm = __fmul_rn(sumx, sumy);
#pragma unroll
    for (int c = 0; c < C; ++c) v[c] = __fdiv_rn(acc[c], norm);
}

/* Resamples output pixel (x, y) of one sample (x, y inside the output image):
 * s is the sample's source image (W x H), g its geometry. Taps clamp into the
 * clamp box; a rotation's coverage multiplies the result (gpu/aug.h). */
template <int C, bool NHWC, int MODE>
__device__ __forceinline__ void geom_px(const Geo &g, const uint8_t *__restrict__ s, int W, int H,
                                        int x, int y, float (&v)[C])
{
    const size_t plane = (size_t)W * H;
    constexpr int px = NHWC ? C : 1; /* elements per pixel step */
    const uint32_t row = (uint32_t)W * px; /* elements per row step */
    constexpr int BASE = MODE & 7;
    constexpr bool ROT = (MODE & GEO_ROT) != 0;
    if constexpr (BASE == GEO_IDENTITY) { /* out shape == in shape */
        const uint8_t *p = s + ((uint32_t)y * row + (uint32_t)x * px);
#pragma unroll
        for (int c = 0; c < C; ++c) v[c] = tap<C, NHWC>(p, c, plane);
        return;
    }
    const float ox = __fadd_rn((float)x, 0.5f), oy = __fadd_rn((float)y, 0.5f);
    const float sx = affine_rn(g.inv[0], g.inv[1], g.inv[2], ox, oy);
    const float sy = affine_rn(g.inv[3], g.inv[4], g.inv[5], ox, oy);
    if constexpr (BASE == GEO_AA) {
        aa_sample<C, NHWC>(g, s, W, H, sx, sy, v);
        return;
    }
    /* The point in the rotation's input image (pixel centres at integers). */
    float ru = 0.f, rv = 0.f;
    if constexpr (ROT || BASE == GEO_AA_ROT) {
        ru = __fsub_rn(__fadd_rn(__fmul_rn(g.rot[0], sx), g.rot[1]), 0.5f);
        rv = __fsub_rn(__fadd_rn(__fmul_rn(g.rot[2], sy), g.rot[3]), 0.5f);
    }
    if constexpr (BASE == GEO_AA_ROT) {
        /* The rotation's bilinear taps on its input image, zero outside it, each
         * the antialiased sample of the source at that pixel's centre. */
        float acc[C];
#pragma unroll
        for (int c = 0; c < C; ++c) acc[c] = 0.f;
        if (ru > -1.f && ru < g.rw && rv > -1.f && rv < g.rh) {
            const float x0f = floorf(ru), y0f = floorf(rv);
            const float ax = __fsub_rn(ru, x0f), ay = __fsub_rn(rv, y0f);
            const float wx[2] = {__fsub_rn(1.f, ax), ax}, wy[2] = {__fsub_rn(1.f, ay), ay};
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const float tx = __fadd_rn(x0f, (float)(t & 1)), ty = __fadd_rn(y0f, (float)(t >> 1));
                const float wt = __fmul_rn(wx[t & 1], wy[t >> 1]);
                float tv[C];
#pragma unroll
                for (int c = 0; c < C; ++c) tv[c] = 0.f;
                if (tx >= 0.f && tx < g.rw && ty >= 0.f && ty < g.rh)
                    aa_sample<C, NHWC>(g, s, W, H,
                                       __fadd_rn(__fmul_rn(g.pre[0], __fadd_rn(tx, 0.5f)), g.pre[1]),
                                       __fadd_rn(__fmul_rn(g.pre[2], __fadd_rn(ty, 0.5f)), g.pre[3]), tv);
#pragma unroll
                for (int c = 0; c < C; ++c) acc[c] = SF_MAC(acc[c], tv[c], wt);
            }
        }
#pragma unroll
        for (int c = 0; c < C; ++c) v[c] = acc[c];
        return;
    }
    const float fx = __fsub_rn(sx, 0.5f), fy = __fsub_rn(sy, 0.5f);
    if constexpr (BASE == GEO_NEAREST) {
        /* The nearest pixel clamped into the box (fmaxf also maps NaN inside);
         * 0 where the rotation's nearest pixel is outside its input. */
        const float rx = fminf(fmaxf(rintf(fx), (float)g.xlo), (float)g.xhi);
        const float ry = fminf(fmaxf(rintf(fy), (float)g.ylo), (float)g.yhi);
        bool in = true;
        if constexpr (ROT) {
            const float qx = rintf(ru), qy = rintf(rv);
            in = qx >= 0.f && qx <= __fsub_rn(g.rw, 1.f) && qy >= 0.f && qy <= __fsub_rn(g.rh, 1.f);
        }
        const uint8_t *p = s + ((uint32_t)(int)ry * row + (uint32_t)(int)rx * px);
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const float t = tap<C, NHWC>(p, c, plane);
            v[c] = in ? t : 0.f;
        }
        return;
    }
    /* Bilinear with the coordinate clamped into the box, the same as clamping
     * each tap (both taps of a clamped side are the edge pixel), so every
     * address is inside and the tap pointers need no masks. */
    const float u = fminf(fmaxf(fx, (float)g.xlo), (float)g.xhi);
    const float w_ = fminf(fmaxf(fy, (float)g.ylo), (float)g.yhi);
    const float x0f = floorf(u), y0f = floorf(w_);
    const int x0 = (int)x0f, y0 = (int)y0f; /* inside the box, so >= 0 */
    const float ax = __fsub_rn(u, x0f), ay = __fsub_rn(w_, y0f);
    const float bx = __fsub_rn(1.f, ax), by = __fsub_rn(1.f, ay);
    const float w00 = __fmul_rn(bx, by), w01 = __fmul_rn(ax, by);
    const float w10 = __fmul_rn(bx, ay), w11 = __fmul_rn(ax, ay);
    /* Offsets are unsigned (never negative), so each pointer is one 64-bit add. */
    const uint8_t *q00 = s + ((uint32_t)y0 * row + (uint32_t)x0 * px);
    const uint32_t dx = x0 < g.xhi ? (uint32_t)px : 0u, dy = y0 < g.yhi ? row : 0u;
    const uint8_t *q01 = q00 + dx, *q10 = q00 + dy, *q11 = q10 + dx;
    float cov = 1.f;
    if constexpr (ROT) cov = __fmul_rn(cover1(ru, g.rw), cover1(rv, g.rh));
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const float p00 = tap<C, NHWC>(q00, c, plane);
        const float p01 = tap<C, NHWC>(q01, c, plane);
        const float p10 = tap<C, NHWC>(q10, c, plane);
        const float p11 = tap<C, NHWC>(q11, c, plane);
        const float b = SF_MAC(SF_MAC(SF_MAC(__fmul_rn(p00, w00), w01, p01), w10, p10), w11, p11);
        v[c] = ROT ? __fmul_rn(b, cov) : b;
    }
}

/* A: the geometry of a blur tile and its halo, GH x GW pixels into slots 1..C
 * (channel c at G + c*slot, row stride GWP), walked with an incremental (row,
 * column) instead of a division per pixel. Only edge tiles (a block-uniform test)
 * need the reflect padding. */
template <int C, bool NHWC, int MODE>
__device__ __forceinline__ void geom_tile(const sf_aug_plan &P, const Geo &g,
                                          const uint8_t *__restrict__ s, int W, int H, float *G, int slot,
                                          int R, int GH, int GW, int GWP, int tx0, int ty0)
{
    const int OW = P.out_w, OH = P.out_h;
    const bool interior = ty0 - R >= 0 && ty0 + TH + R <= OH && tx0 - R >= 0 && tx0 + TW + R <= OW;
    const int dr = NT / GW, dq = NT - dr * GW;
    int r = threadIdx.x / GW, q = threadIdx.x - r * GW;
    while (r < GH) {
        int y = ty0 - R + r, x = tx0 - R + q;
        if (!interior) {
            y = reflect_idx(y, OH);
            x = reflect_idx(x, OW);
        }
        float gv[C];
        geom_px<C, NHWC, MODE>(g, s, W, H, x, y, gv);
        float *o = G + r * GWP + q;
#pragma unroll
        for (int c = 0; c < C; ++c) o[c * slot] = gv[c];
        r += dr;
        q += dq;
        if (q >= GW) { q -= GW; ++r; }
    }
}

/* The thread's 2 x 4 pixels without a blur; out-of-image pixels of an edge tile
 * are computed at a clamped position and never stored. */
template <int C, bool NHWC, int MODE>
__device__ __forceinline__ void geom_direct(const sf_aug_plan &P, const Geo &g,
                                            const uint8_t *__restrict__ s, int W, int H, int xb, int yb,
                                            float (&v)[C][2][4])
{
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const int y = min(yb + rr, P.out_h - 1);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float gv[C];
            geom_px<C, NHWC, MODE>(g, s, W, H, min(xb + j, P.out_w - 1), y, gv);
#pragma unroll
            for (int c = 0; c < C; ++c) v[c][rr][j] = gv[c];
        }
    }
}

/* ---- the dilated random mask ------------------------------------------------ */

/* Pixel (y, x) is masked when some pixel within Manhattan distance d (inside the
 * image) has bit sf_u01(sf_hash4(seed, y', x', 0)) < ratio — what d iterations of
 * 4-neighbour dilation give, since a monotone path between two pixels of a
 * rectangle stays inside it. For the tile at (tx0, ty0): bits over the tile plus a
 * d-wide border; hd = horizontal distance to the nearest set bit (d+1 if none
 * within d); then per pixel: min over dy of |dy| + hd <= d. Fills m for the
 * thread's 2 x 4 pixels. All threads of the block call it (it synchronises). */
__device__ void tile_mask(uint8_t *bits, uint16_t *hd, uint64_t seed, float ratio, int d,
                          int tx0, int ty0, int OW, int OH, int rp, int x0, bool (&m)[2][4])
{
    const int BW = TW + 2 * d, BH = TH + 2 * d;
    __syncthreads(); /* a previous mask stage may still read bits / hd */
    for (int i = threadIdx.x; i < BW * BH; i += NT) {
        const int r = i / BW, q = i - r * BW;
        const int y = ty0 - d + r, x = tx0 - d + q;
        uint8_t b = 0;
        if (y >= 0 && y < OH && x >= 0 && x < OW)
            b = sf_u01(sf_hash4(seed, (uint64_t)y, (uint64_t)x, 0)) < ratio;
        bits[i] = b;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < BH * TW; i += NT) {
        const int r = i / TW, q = i - r * TW;
        const uint8_t *row = bits + r * BW + q + d; /* row[0] is column q of the tile */
        int best = d + 1;
        for (int k = 0; k <= d; ++k)
            if (row[-k] | row[k]) { best = k; break; }
        hd[i] = (uint16_t)best;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint16_t *col = hd + (2 * rp + rr + d) * TW + x0 + j;
            bool hit = false;
            for (int dy = -d; dy <= d && !hit; ++dy)
                hit = abs(dy) + (int)col[dy * TW] <= d;
            m[rr][j] = hit;
        }
}

/* ---- pointwise stages ---------------------------------------------------------- */

template <int C>
__device__ __forceinline__ void pointwise(const sf_aug_plan &P, float (&v)[C][2][4],
                                          uint8_t *bits, uint16_t *hd, uint64_t seed,
                                          int tx0, int ty0, int rp, int x0)
{
    for (int si = 0; si < P.n_pw; ++si) {
        const sf_aug_pw &pw = P.pw[si];
        switch (pw.kind) {
        case SF_PW_SCALE: {
            const float a = pw.a[0];
#pragma unroll
            for (int c = 0; c < C; ++c)
#pragma unroll
                for (int k = 0; k < 8; ++k) v[c][k / 4][k % 4] = __fmul_rn(v[c][k / 4][k % 4], a);
            break;
        }
        case SF_PW_NORMALIZE:
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const float a = pw.a[c], b = pw.b[c];
#pragma unroll
                for (int k = 0; k < 8; ++k)
                    v[c][k / 4][k % 4] = __fmul_rn(__fsub_rn(v[c][k / 4][k % 4], a), b);
            }
            break;
        case SF_PW_YCBCR:
            if constexpr (C == 3) {
                /* BT.601 full range (JPEG); the chroma offset is a[0] (128 times the
                 * to_dtype scales before it; see sf_aug_plan_make). */
                const float off = pw.a[0];
#pragma unroll
                for (int k = 0; k < 8; ++k) {
                    float &r = v[0][k / 4][k % 4], &g = v[1][k / 4][k % 4], &b = v[2][k / 4][k % 4];
                    const float y = __fadd_rn(__fadd_rn(__fmul_rn(0.299f, r), __fmul_rn(0.587f, g)),
                                              __fmul_rn(0.114f, b));
                    const float cb = __fadd_rn(__fsub_rn(__fsub_rn(off, __fmul_rn(0.168736f, r)),
                                                         __fmul_rn(0.331264f, g)),
                                               __fmul_rn(0.5f, b));
                    const float cr = __fsub_rn(__fsub_rn(__fadd_rn(off, __fmul_rn(0.5f, r)),
                                                         __fmul_rn(0.418688f, g)),
                                               __fmul_rn(0.081312f, b));
                    r = y; g = cb; b = cr;
                }
            }
            break;
        case SF_PW_MASK: {
            bool m[2][4];
            tile_mask(bits, hd, seed, pw.a[0], (int)pw.b[0], tx0, ty0, P.out_w, P.out_h, rp, x0, m);
#pragma unroll
            for (int k = 0; k < 8; ++k)
                if (m[k / 4][k % 4])
#pragma unroll
                    for (int c = 0; c < C; ++c) v[c][k / 4][k % 4] = 0.f;
            break;
        }
        }
    }
}

/* ---- output stores ----------------------------------------------------------- */

__device__ __forceinline__ void put1(float *p, float v) { *p = v; }
__device__ __forceinline__ void put1(uint16_t *p, float v)
{
    *p = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}
/* Four consecutive output elements at an address aligned to 4 elements. */
__device__ __forceinline__ void put4(float *p, float a, float b, float c, float d)
{
    *reinterpret_cast<float4 *>(p) = make_float4(a, b, c, d);
}
__device__ __forceinline__ void put4(uint16_t *p, float a, float b, float c, float d)
{
    *reinterpret_cast<uint2 *>(p) = make_uint2(pack_bf16(a, b), pack_bf16(c, d));
}

/* Stores 4 pixels (x0..x0+3 of row y) of sample n; v[c][j]. vec: every output row
 * starts on a 4-element boundary (checked on the host), so full groups use vector
 * stores. */
template <int C, typename OutT>
__device__ __forceinline__ void store4(OutT *__restrict__ dst, const float (&v)[C][2][4], int rr,
                                       int n, int y, int x0, int OH, int OW, bool out_nhwc, bool vec)
{
    if (y >= OH || x0 >= OW) return;
    const bool full = vec && x0 + 4 <= OW;
    if (!out_nhwc) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
            OutT *p = dst + (((size_t)n * C + c) * OH + y) * OW + x0;
            if (full) {
                put4(p, v[c][rr][0], v[c][rr][1], v[c][rr][2], v[c][rr][3]);
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (x0 + j < OW) put1(p + j, v[c][rr][j]);
            }
        }
    } else {
        OutT *p = dst + (((size_t)n * OH + y) * OW + x0) * C;
        if (full) {
            /* 4 pixels x C channels are 4C contiguous elements: C groups of 4. */
#pragma unroll
            for (int g = 0; g < C; ++g) {
                const int e = 4 * g;
                put4(p + e, v[(e + 0) % C][rr][(e + 0) / C], v[(e + 1) % C][rr][(e + 1) / C],
                     v[(e + 2) % C][rr][(e + 2) / C], v[(e + 3) % C][rr][(e + 3) / C]);
            }
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (x0 + j < OW)
#pragma unroll
                    for (int c = 0; c < C; ++c) put1(p + j * C + c, v[c][rr][j]);
        }
    }
}

/* ---- blur passes ---------------------------------------------------------------- */

/* B then C for a compile-time kernel width K (R = K/2), or a run-time one (K == 0,
 * width kr). Shared memory holds C+1 slots of `slot` floats: channel c's geometry
 * ([GH][GWP]) in slot c+1; B writes channel c's horizontal pass ([GH][HS]) into
 * slot c, which held channel c-1's geometry (slot 0 is spare) — a barrier after
 * each channel instead of a second set of C buffers, so more blocks fit on an SM.
 * Ends with v[c][rr][j] = the blurred value of tile row 2*rp+rr, column 4*q4+j.
 * Sums run over the taps in order, as the reference's. */
template <int C, int K>
__device__ __forceinline__ void blur_tile(float *slots, int slot, const float *wk, int kr,
                                          int GH, int GWP, int rp, int q4, float (&v)[C][2][4])
{
    constexpr int KR = K ? K : 1; /* register copy of the weights when K is known */
    float wr[KR];
#pragma unroll
    for (int k = 0; k < KR; ++k) wr[k] = wk[k];
#define SF_W(k) (K ? wr[(K ? (k) : 0)] : wk[k])
    const int KK = K ? K : kr;
    /* B: horizontal pass. Thread (t >> 3, q4) takes rows t>>3, +32, ...; the odd G
     * stride puts a warp's 32 lanes (8 columns x 4 rows) on distinct banks. */
    for (int c = 0; c < C; ++c) {
        const float *G = slots + (c + 1) * slot;
        float *Hb = slots + c * slot;
        for (int r = threadIdx.x >> 3; r < GH; r += NT / 8) {
            const float *g = G + r * GWP + 4 * q4;
            float a0, a1, a2, a3;
            if constexpr (K > 0) {
                float win[K + 3];
#pragma unroll
                for (int k = 0; k < K + 3; ++k) win[k] = g[k];
                a0 = __fmul_rn(wr[0], win[0]); a1 = __fmul_rn(wr[0], win[1]);
                a2 = __fmul_rn(wr[0], win[2]); a3 = __fmul_rn(wr[0], win[3]);
#pragma unroll
                for (int k = 1; k < K; ++k) {
                    a0 = SF_MAC(a0, wr[k], win[k]);     a1 = SF_MAC(a1, wr[k], win[k + 1]);
                    a2 = SF_MAC(a2, wr[k], win[k + 2]); a3 = SF_MAC(a3, wr[k], win[k + 3]);
                }
            } else {
                float x0 = g[0], x1 = g[1], x2 = g[2], x3 = g[3];
                a0 = __fmul_rn(wk[0], x0); a1 = __fmul_rn(wk[0], x1);
                a2 = __fmul_rn(wk[0], x2); a3 = __fmul_rn(wk[0], x3);
                for (int k = 1; k < KK; ++k) {
                    x0 = x1; x1 = x2; x2 = x3; x3 = g[k + 3]; /* <= g[2R + 3]: the row's end */
                    const float w = wk[k];
                    a0 = SF_MAC(a0, w, x0); a1 = SF_MAC(a1, w, x1);
                    a2 = SF_MAC(a2, w, x2); a3 = SF_MAC(a3, w, x3);
                }
            }
            *reinterpret_cast<float4 *>(Hb + r * HS + 4 * q4) = make_float4(a0, a1, a2, a3);
        }
        __syncthreads(); /* slot c+1 is read by every thread before c+1's pass overwrites it */
    }
    /* C: vertical pass. Output rows 2rp and 2rp+1 read H rows 2rp .. 2rp+K: row i
     * feeds the first with weight i and the second with weight i-1. */
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const float *h = slots + c * slot + 2 * rp * HS + 4 * q4;
        float a[4], b[4];
        float4 t = *reinterpret_cast<const float4 *>(h);
        a[0] = __fmul_rn(SF_W(0), t.x); a[1] = __fmul_rn(SF_W(0), t.y);
        a[2] = __fmul_rn(SF_W(0), t.z); a[3] = __fmul_rn(SF_W(0), t.w);
        t = *reinterpret_cast<const float4 *>(h + HS);
        a[0] = SF_MAC(a[0], SF_W(1), t.x); a[1] = SF_MAC(a[1], SF_W(1), t.y);
        a[2] = SF_MAC(a[2], SF_W(1), t.z); a[3] = SF_MAC(a[3], SF_W(1), t.w);
        b[0] = __fmul_rn(SF_W(0), t.x); b[1] = __fmul_rn(SF_W(0), t.y);
        b[2] = __fmul_rn(SF_W(0), t.z); b[3] = __fmul_rn(SF_W(0), t.w);
#pragma unroll
        for (int i = 2; i < KK; ++i) {
            t = *reinterpret_cast<const float4 *>(h + i * HS);
            a[0] = SF_MAC(a[0], SF_W(i), t.x); a[1] = SF_MAC(a[1], SF_W(i), t.y);
            a[2] = SF_MAC(a[2], SF_W(i), t.z); a[3] = SF_MAC(a[3], SF_W(i), t.w);
            b[0] = SF_MAC(b[0], SF_W(i - 1), t.x); b[1] = SF_MAC(b[1], SF_W(i - 1), t.y);
            b[2] = SF_MAC(b[2], SF_W(i - 1), t.z); b[3] = SF_MAC(b[3], SF_W(i - 1), t.w);
        }
        t = *reinterpret_cast<const float4 *>(h + KK * HS);
        b[0] = SF_MAC(b[0], SF_W(KK - 1), t.x); b[1] = SF_MAC(b[1], SF_W(KK - 1), t.y);
        b[2] = SF_MAC(b[2], SF_W(KK - 1), t.z); b[3] = SF_MAC(b[3], SF_W(KK - 1), t.w);
#pragma unroll
        for (int j = 0; j < 4; ++j) { v[c][0][j] = a[j]; v[c][1][j] = b[j]; }
    }
#undef SF_W
}

/* ---- the kernel ------------------------------------------------------------ */

/* Calls CALL(mode) with the plan's resampling mode as a compile-time constant.
 * The antialias modes live in kernels of their own (AA): their variable-length
 * tap loops need more registers, which would otherwise cap the occupancy of the
 * plain modes' kernels (64 registers, 4 blocks per SM) as well. */
#define SF_GEO_SWITCH(AA, mode, CALL)                                              \
    if constexpr (AA) {                                                            \
        if ((mode) == GEO_AA_ROT) CALL(GEO_AA_ROT);                                \
        else CALL(GEO_AA);                                                         \
    } else {                                                                       \
        switch (mode) {                                                            \
        case GEO_IDENTITY: CALL(GEO_IDENTITY); break;                              \
        case GEO_NEAREST: CALL(GEO_NEAREST); break;                                \
        case GEO_NEAREST | GEO_ROT: CALL(GEO_NEAREST | GEO_ROT); break;            \
        case GEO_BILINEAR | GEO_ROT: CALL(GEO_BILINEAR | GEO_ROT); break;          \
        default: CALL(GEO_BILINEAR); break;                                        \
        }                                                                          \
    }

struct Launch {
    int out_nhwc;   /* output layout */
    int vec;        /* rows of the output are 4-element aligned */
    int R;          /* blur radius (BLUR only) */
    int mask_d;     /* dilation of the mask stage, -1 when none */
    int slot;       /* floats per blur slot: GH * max(GW|1, HS), a multiple of 4 */
    unsigned off_g, off_bits, off_hd; /* byte offsets into dynamic shared memory */
};

/* Plain kernels of up to 3 channels keep to 64 registers, 4 blocks of NT
 * threads per SM, as before the clamped taps and the rotation's coverage (which
 * pushed some to 78 registers; ptxas fits them without spills). With 4 channels
 * that bound spills, and the antialias loops want more: those kernels get 2
 * blocks per SM (128 registers). */
template <int C, bool NHWC, bool BLUR, bool AA, typename OutT>
__global__ void __launch_bounds__(NT, (AA || C > 3) ? 2 : 4)
augment_kernel(const __grid_constant__ sf_aug_plan P, const __grid_constant__ Launch L,
               const sf_aug_sample *__restrict__ samples, const uint8_t *__restrict__ src,
               OutT *__restrict__ dst)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const int n = blockIdx.z;
    const int tx0 = blockIdx.x * TW, ty0 = blockIdx.y * TH;
    const int OW = P.out_w, OH = P.out_h;
    const sf_aug_sample *S = samples + n;
    Geo g;
    load_geo(S, g);
    /* Every sample is addressed through its own offset and size (uniform batches
     * included, where they equal n*h*w*c and the plan's size): one load per
     * thread, outside the pixel loops, and ragged sources cost nothing extra. */
    const uint8_t *s = src + S->src_off;
    const int W = S->src_w, H = S->src_h;
    /* Keep the sample's base in a register: without this the compiler may reload
     * or recompute it for every pixel of the geometry loop. */
    asm("" : "+l"(s));
    const int q4 = threadIdx.x & 7, rp = threadIdx.x >> 3;
    float v[C][2][4];

    if constexpr (BLUR) {
        const int R = L.R, K = 2 * R + 1;
        const int GH = TH + 2 * R, GW = TW + 2 * R, GWP = GW | 1; /* odd stride: see blur_tile */
        float *wk = reinterpret_cast<float *>(smem);
        float *slots = reinterpret_cast<float *>(smem + L.off_g);
        const int slot = L.slot;
        if (threadIdx.x < K) wk[threadIdx.x] = S->blur_w[threadIdx.x];

        float *G = slots + slot; /* channel c's geometry in slot c+1 */
#define SF_GEO_TILE(M) geom_tile<C, NHWC, M>(P, g, s, W, H, G, slot, R, GH, GW, GWP, tx0, ty0)
        SF_GEO_SWITCH(AA, geo_mode(P), SF_GEO_TILE);
#undef SF_GEO_TILE
        __syncthreads();
        switch (R) {
        case 1: blur_tile<C, 3>(slots, slot, wk, K, GH, GWP, rp, q4, v); break;
        case 2: blur_tile<C, 5>(slots, slot, wk, K, GH, GWP, rp, q4, v); break;
        case 3: blur_tile<C, 7>(slots, slot, wk, K, GH, GWP, rp, q4, v); break;
        case 4: blur_tile<C, 9>(slots, slot, wk, K, GH, GWP, rp, q4, v); break;
        default: blur_tile<C, 0>(slots, slot, wk, K, GH, GWP, rp, q4, v); break;
        }
    } else {
        const int xb = tx0 + 4 * q4, yb = ty0 + 2 * rp;
#define SF_GEO_DIRECT(M) geom_direct<C, NHWC, M>(P, g, s, W, H, xb, yb, v)
        SF_GEO_SWITCH(AA, geo_mode(P), SF_GEO_DIRECT);
#undef SF_GEO_DIRECT
    }

    if (P.n_pw > 0) {
        const uint64_t seed = P.has_mask ? S->mask_seed : 0;
        pointwise<C>(P, v, reinterpret_cast<uint8_t *>(smem + L.off_bits),
                     reinterpret_cast<uint16_t *>(smem + L.off_hd), seed, tx0, ty0, rp, 4 * q4);
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
        store4<C, OutT>(dst, v, rr, n, ty0 + 2 * rp + rr, tx0 + 4 * q4, OH, OW, L.out_nhwc != 0,
                        L.vec != 0);
}

/* ---- launchers ------------------------------------------------------------- */

template <int C, bool NHWC, bool BLUR, typename OutT>
int launch_one(const sf_aug_plan *plan, const Launch &L, size_t smem, dim3 grid,
               const sf_aug_sample *d_samples, const uint8_t *d_src, OutT *d_dst, cudaStream_t s)
{
    const int mode = geo_mode(*plan);
    auto k = mode == GEO_AA || mode == GEO_AA_ROT ? augment_kernel<C, NHWC, BLUR, true, OutT>
                                                  : augment_kernel<C, NHWC, BLUR, false, OutT>;
    if (smem > 48 * 1024) {
        int dev = 0, maxs = 0;
        SF_CUDA_CHECK(cudaGetDevice(&dev));
        SF_CUDA_CHECK(cudaDeviceGetAttribute(&maxs, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        if (smem > (size_t)maxs) {
            sf_cuda_set_error("%s:%d: sf_cuda_augment: tile needs %zu bytes of shared memory, "
                              "device allows %d (blur_ksize %d, largest dilate %d)",
                              __FILE__, __LINE__, smem, maxs, plan->blur_ksize, L.mask_d);
            return -1;
        }
        SF_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    }
    k<<<grid, NT, smem, s>>>(*plan, L, d_samples, d_src, d_dst);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <int C, typename OutT>
int dispatch_c(const sf_aug_plan *plan, const Launch &L, size_t smem, dim3 grid, bool blur,
               int nhwc, const sf_aug_sample *d_samples, const uint8_t *d_src, OutT *d_dst,
               cudaStream_t s)
{
    if (nhwc)
        return blur ? launch_one<C, true, true, OutT>(plan, L, smem, grid, d_samples, d_src, d_dst, s)
                    : launch_one<C, true, false, OutT>(plan, L, smem, grid, d_samples, d_src, d_dst, s);
    return blur ? launch_one<C, false, true, OutT>(plan, L, smem, grid, d_samples, d_src, d_dst, s)
                : launch_one<C, false, false, OutT>(plan, L, smem, grid, d_samples, d_src, d_dst, s);
}

size_t align16(size_t x) { return (x + 15) & ~(size_t)15; }

template <typename OutT>
int augment_any(const char *fn, const sf_aug_plan *plan, const sf_aug_sample *d_samples, int n,
                const uint8_t *d_src, int nhwc, OutT *d_dst, int out_nhwc, cudaStream_t s)
{
#define SF_AUG_REJECT(...)                                                                   \
    do {                                                                                     \
        char m_[256];                                                                        \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                                \
        sf_cuda_set_error("%s:%d: %s: %s", __FILE__, __LINE__, fn, m_);                      \
        return -1;                                                                           \
    } while (0)
    if (!plan) SF_AUG_REJECT("plan is NULL");
    if (n < 0 || n > 65535) SF_AUG_REJECT("n = %d outside [0, 65535]", n);
    if (n == 0) return 0;
    if (!d_samples || !d_src || !d_dst) SF_AUG_REJECT("NULL device pointer");
    const int C = plan->c;
    if (C < 1 || C > SF_AUG_MAX_C) SF_AUG_REJECT("c = %d outside [1, %d]", C, SF_AUG_MAX_C);
    if ((!plan->ragged && (plan->in_h < 1 || plan->in_w < 1)) || plan->out_h < 1 || plan->out_w < 1)
        SF_AUG_REJECT("empty image (%dx%d -> %dx%d)", plan->in_h, plan->in_w, plan->out_h, plan->out_w);
    if (plan->ragged && (!plan->has_geom || !nhwc))
        SF_AUG_REJECT("ragged sources need the geometric map and HWC images (has_geom %d, nhwc %d)",
                      plan->has_geom, nhwc);
    if (!plan->has_geom && (plan->in_h != plan->out_h || plan->in_w != plan->out_w))
        SF_AUG_REJECT("identity geometry with different in/out shapes");
    if (plan->interp != SF_INTERP_BILINEAR && plan->interp != SF_INTERP_NEAREST)
        SF_AUG_REJECT("unknown interp %d", (int)plan->interp);
    const int ks = plan->blur_ksize;
    if (ks < 0 || ks > SF_AUG_MAX_KSIZE || (ks > 0 && ks % 2 == 0))
        SF_AUG_REJECT("blur_ksize %d is not 0 or odd <= %d", ks, SF_AUG_MAX_KSIZE);
    if (plan->n_pw < 0 || plan->n_pw > SF_AUG_MAX_OPS) SF_AUG_REJECT("n_pw = %d", plan->n_pw);
    Launch L{};
    L.out_nhwc = out_nhwc != 0;
    L.R = ks > 1 ? ks / 2 : 0;
    L.mask_d = -1;
    for (int i = 0; i < plan->n_pw; ++i) {
        const sf_aug_pw &pw = plan->pw[i];
        if (pw.kind < SF_PW_SCALE || pw.kind > SF_PW_MASK) SF_AUG_REJECT("unknown pointwise kind %d", (int)pw.kind);
        if (pw.kind == SF_PW_YCBCR && C != 3) SF_AUG_REJECT("color_convert needs c == 3, got %d", C);
        if (pw.kind == SF_PW_MASK) {
            const int d = (int)pw.b[0];
            if (d < 0 || d > 1024) SF_AUG_REJECT("mask dilate %d outside [0, 1024]", d);
            if (d > L.mask_d) L.mask_d = d;
        }
    }
    if (L.mask_d >= 0 && !plan->has_mask) SF_AUG_REJECT("mask stage but has_mask == 0");
    /* Vector stores need every output row to start on a 4-element boundary. */
    const size_t row_elems = (size_t)plan->out_w * (out_nhwc ? C : 1);
    L.vec = row_elems % 4 == 0 && ((uintptr_t)d_dst % (4 * sizeof(OutT))) == 0;

    const bool blur = ks > 1; /* a 1-tap kernel's normalised weight is 1: no blur */
    size_t off = 32 * sizeof(float); /* blur weights */
    if (blur) {
        const int GH = TH + 2 * L.R, GWP = (TW + 2 * L.R) | 1;
        const int sw = ((GWP > HS ? GWP : HS) + 3) & ~3;
        L.slot = GH * sw;
        L.off_g = (unsigned)off;
        off = align16(off + sizeof(float) * (size_t)(C + 1) * L.slot);
    }
    if (L.mask_d >= 0) {
        const size_t d = (size_t)L.mask_d;
        L.off_bits = (unsigned)off;
        off = align16(off + (TW + 2 * d) * (TH + 2 * d));
        L.off_hd = (unsigned)off;
        off = align16(off + sizeof(uint16_t) * TW * (TH + 2 * d));
    }
    const dim3 grid((plan->out_w + TW - 1) / TW, (plan->out_h + TH - 1) / TH, n);
    if (grid.y > 65535) SF_AUG_REJECT("out_h %d too large", plan->out_h);
    switch (C) {
    case 1: return dispatch_c<1, OutT>(plan, L, off, grid, blur, nhwc, d_samples, d_src, d_dst, s);
    case 2: return dispatch_c<2, OutT>(plan, L, off, grid, blur, nhwc, d_samples, d_src, d_dst, s);
    case 3: return dispatch_c<3, OutT>(plan, L, off, grid, blur, nhwc, d_samples, d_src, d_dst, s);
    default: return dispatch_c<4, OutT>(plan, L, off, grid, blur, nhwc, d_samples, d_src, d_dst, s);
    }
#undef SF_AUG_REJECT
}

} // namespace

extern "C" int sf_cuda_augment(const sf_aug_plan *plan, const sf_aug_sample *d_samples, int n,
                               const uint8_t *d_src, int nhwc, float *d_dst, int out_nhwc, cudaStream_t s)
{
    /* The second pass (color_jitter, random_erasing) when the plan has one. */
    return augment_any<float>("sf_cuda_augment", plan, d_samples, n, d_src, nhwc, d_dst, out_nhwc, s) ||
                   sf_cuda_aug_post(plan, d_samples, n, d_dst, 0, out_nhwc, s)
               ? -1
               : 0;
}

extern "C" int sf_cuda_augment_bf16(const sf_aug_plan *plan, const sf_aug_sample *d_samples, int n,
                                    const uint8_t *d_src, int nhwc, uint16_t *d_dst, int out_nhwc,
                                    cudaStream_t s)
{
    return augment_any<uint16_t>("sf_cuda_augment_bf16", plan, d_samples, n, d_src, nhwc, d_dst,
                                 out_nhwc, s) ||
                   sf_cuda_aug_post(plan, d_samples, n, d_dst, 1, out_nhwc, s)
               ? -1
               : 0;
}
