/* gpu/cuda/augment_kernels.cuh — the fused augmentation kernel (gpu/aug.h semantics).
 *
 * One kernel, one launch. A block of NT threads owns a TH x TW tile of one sample's
 * output, all channels:
 *
 *   A. geometry: for every pixel of the tile plus the blur's halo (R = ksize/2 on each
 *      side, its positions reflected into the image as the blur's padding), map the
 *      output pixel through the sample's affine map (gpu/aug.h map) and resample the
 *      uint8 source (bilinear or nearest with taps clamped into the sample's clamp
 *      box, times a rotation's coverage; or the antialias filter) into shared
 *      memory, one slot per channel ([GH][GWP], 16-byte rows), a warp taking
 *      8 x 4 pixels at a time.
 *   B. horizontal blur, channel by channel, into the slot the previous channel's
 *      geometry has just vacated (see blur_tile).
 *   C. vertical blur into registers (2 rows x 4 pixels x C channels per thread), the
 *      pointwise stages in list order, vectorised stores.
 * Without a blur, a thread resamples its own 8 pixels straight into registers and
 * only C runs. The halo is recomputed per tile rather than kept in device memory:
 * a float intermediate would triple the device-memory traffic.
 *
 * Cost model (W1 batch: 32 x 256x256x3 NHWC, crop 128, resize 256, rotate, blur
 * k7, normalize to mean 0 std 1; ncu on an H100; docs/DESIGN.md §5). Device memory
 * is not the limit (the bound is 10.5 us: 31.5 MB at the 3.0 TB/s copy rate); issue
 * slots, shared-memory wavefronts and latency are. 15.9M warp instructions, issue
 * slots 59% busy, 2.8M shared-load wavefronts, 4 blocks of 256 threads per SM
 * (64 registers, 56 KB shared memory): 27.5 us per batch, 2.6x the bound, of
 * which ~4 us are the launch (first block to last: 24 us) and ~5 us the last
 * blocks' tail, when SMs hold fewer than 4 blocks. A staged bilinear geometry
 * pixel is ~55 instructions (~68 with the rotation's coverage), walk included, and
 * a 32 x 64 tile computes 1.30 of them per output pixel for the 3-pixel halo (1.37
 * with the chunks moved back inside the region). Where the warps' time goes
 * (ncu's stall samples): the geometry loops 27%, the tile's set-up 13% (the
 * sample's parameters from global memory, tile_corners), staging the footprint
 * 13% (mostly waiting for its loads), the horizontal blur 11% and its barriers
 * 8%, the vertical blur 8% (the 42 multiply-adds per pixel a 7-tap kernel on 3
 * channels needs in fp32), the stores 10%.
 * Hence the instruction-count habits: no integer division in loops (div_small),
 * branch-free bilinear taps (a clamped coordinate, so every address is inside), one
 * 64-bit add per tap pointer with the channel in the load's immediate, the sample
 * base pinned in a register, mode-specialised geometry loops, per-row parts of the
 * maps computed once per row (geom_tile_loop), floors from full-rate adds
 * (geom_at), compile-time blur widths k = 3..9 with weights and windows in
 * registers, block-uniform decisions made once per warp (tile_corners).
 *
 * Rounding. Source coordinates are two fused multiply-adds from the pixel index
 * (gpu/aug.h map, rmap), the reference's fmaf, and floors and tap weights are
 * computed with explicit round-to-nearest intrinsics in the reference's order
 * (gpu/ref/augment.c, ISO C, not contracted), so every pixel takes the same taps and
 * weights as the reference: one contraction there could move a coordinate across a
 * rounding boundary and change a whole pixel. The blur's and the interpolation's
 * multiply-adds use SF_MAC: one fused rounding by default (SF_AUG_FMA=1; ~1.6e-7
 * relative to the reference), or two roundings, bit-identical to the reference,
 * with -DSF_AUG_FMA=0 (slower).
 *
 * A rotation's tile that maps wholly inside the rotation's input (tile_corners)
 * runs the geometry loop without the coverage (W1: the 12 of 32 tiles away from
 * the border). A bilinear blur tile whose source footprint fits in STG pixels
 * stages it in shared memory as floats first (stage_tile), so its samples read
 * shared memory (one 8-byte and one 4-byte load per tap of 3 channels) instead of
 * gathering bytes through L1.
 *
 * Sources: every sample is read at src + its src_off with its own src_h x src_w
 * (ragged batches and uniform ones alike). Antialiased plans run in kernels of
 * their own (AA), whose per-pixel tap loops have data-dependent lengths; without
 * a rotation or a blur (the ImageNet recipe) the filter is separable and runs in
 * aa_separable_kernel, which computes each tap weight once per tile instead of
 * once per tap (see there and docs/DESIGN.md §5).
 *
 * Threads: t = threadIdx.x; q4 = t & 7, rp = t >> 3. In C a thread owns output
 * pixels x = 4*q4 .. 4*q4+3 of tile rows 2*rp and 2*rp+1.
 *
 * Files. The kernels are templates over the channel count, the layouts, the blur,
 * the antialias filter and the output type: 80 variants and about 280 CPU-seconds
 * of cicc and ptxas, which one compiler process could spend on one core only.
 * So this header holds them and their launchers; gpu/cuda/augment_c1.cu ..
 * augment_c4.cu each instantiate one channel count's (dispatch_c, and with it
 * 20 kernels: 50 to 85 CPU-seconds a file), which a parallel build compiles at
 * once; and gpu/cuda/augment.cu checks a call's arguments, lays out its shared
 * memory and calls the channel count's dispatch_c. Everything here is in
 * namespace sf_aug_cuda, whose dispatch_c instantiations link across those files.
 */
#ifndef SF_GPU_CUDA_AUGMENT_KERNELS_CUH
#define SF_GPU_CUDA_AUGMENT_KERNELS_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <limits.h>
#include <stdint.h>

#include "gpu/cuda/augment.h"
#include "gpu/cuda/check.h"
#include "gpu/rng.h"

#ifndef SF_AUG_FMA
#define SF_AUG_FMA 1
#endif
#if SF_AUG_FMA
#define SF_MAC(acc, w, x) __fmaf_rn((w), (x), (acc))
#else
#define SF_MAC(acc, w, x) __fadd_rn((acc), __fmul_rn((w), (x)))
#endif

namespace sf_aug_cuda {

#ifndef SF_AUG_TH
#define SF_AUG_TH 64
#endif
constexpr int TW = 32;        /* tile width (output pixels) */
constexpr int TH = SF_AUG_TH; /* tile height: 64 (a build knob for benchmarks: 32) */
constexpr int NT = (TW / 4) * (TH / 2); /* threads per block: 256 */
constexpr int HS = TW + 4; /* row stride of H in floats: 16-byte rows that rotate banks */
static_assert((TW / 4) * (TH / 2) == NT, "one thread per 2 x 4 output pixels");

/* ---- small device helpers ------------------------------------------------ */

/* Row stride in floats of a blur tile's geometry ([GH][GWP], GW = TW + 2R
 * columns): 16-byte rows for the horizontal pass's vector loads, and 40 (8 mod
 * 32 banks) up to R = 4, so that the geometry's 8 x 4 warp chunks store to 32
 * distinct banks. */
__host__ __device__ constexpr int g_stride(int R)
{
    return TW + 2 * R <= 40 ? 40 : (TW + 2 * R + 3) & ~3;
}

/* Reflect padding as torch's "reflect" (the edge is not repeated): -1 -> 1,
 * n -> n-2. Folds repeatedly, so any index maps into [0, n). */
__device__ __forceinline__ int reflect_idx(int i, int n)
{
    if ((unsigned)i < (unsigned)n) return i;
    if (n == 1) return 0;
    /* One fold covers every index a blur's halo reaches while the kernel is
     * narrower than the image; the division below is for wider ones. */
    const int f = i < 0 ? -i : 2 * (n - 1) - i;
    if ((unsigned)f < (unsigned)n) return f;
    const int p = 2 * (n - 1);
    i %= p;
    if (i < 0) i += p;
    return i < n ? i : p - i;
}

/* a / b for 0 <= a <= NT and 1 <= b <= 2^16, as a reciprocal and a multiply:
 * (a + 0.5) / b lies at least 0.5 / b from an integer, far more than the
 * approximate division's few-ulp error, so the truncation is exact. The
 * integer division it replaces is ~25 instructions, run once per thread per
 * tile walk. */
__device__ __forceinline__ int div_small(int a, int b)
{
    return (int)__fdividef((float)a + 0.5f, (float)b);
}

/* m[0]*x + m[1]*y + m[2] as gpu/aug.h's map: fmaf(m[0], x, fmaf(m[1], y, m[2])),
 * each fused multiply-add rounded once, as the reference's fmaf. */
__device__ __forceinline__ float affine_px(const float *m, float x, float y)
{
    return __fmaf_rn(m[0], x, __fmaf_rn(m[1], y, m[2]));
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
    float map[6], rmap[6];          /* output pixel -> source, -> rotation input */
    int xlo, ylo, xhi, yhi;         /* clamp box */
    float pre[4], rw, rh;           /* rotation input -> source, its size */
    float ax, ay, axi, ayi;         /* antialias supports and their inverses */
};

__device__ __forceinline__ void load_geo(const sf_aug_sample *S, Geo &g)
{
#pragma unroll
    for (int k = 0; k < 6; ++k) {
        g.map[k] = S->map[k];
        g.rmap[k] = S->rmap[k];
    }
    g.xlo = S->clip[0]; g.ylo = S->clip[1]; g.xhi = S->clip[2]; g.yhi = S->clip[3];
#pragma unroll
    for (int k = 0; k < 4; ++k) g.pre[k] = S->pre[k];
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

/* A tile's source footprint staged in shared memory as floats (stage_tile):
 * source pixel (bx0 + i, by0 + j), its coordinates clamped into the clamp box,
 * is entry j * sb + i of each plane, rows sb >= bw entries apart (geom_tile).
 * Channels go in pairs, one float2 plane per pair (channels 2k, 2k+1 at
 * p + 2k*STG), and an odd last channel in a float plane after them: a bilinear
 * tap of 3 channels is one 8-byte and one 4-byte shared load instead of three
 * 4-byte ones. */
constexpr int STG = 1800; /* staged pixels: a 42 x 42 footprint, W1's at 45 degrees */
struct Stage {
    int sb; /* row stride in entries */
    /* Shared-memory byte addresses for geom_at, mod 2^32: the float2 planes'
     * and the float plane's entry 0, each less (F23 + by0) * sb + F23 + bx0
     * entries, and a row of each in bytes. */
    uint32_t a2, a1, row2, row1;
};

/* The bit pattern of 2^23 as a float: __float_as_int(2^23 + k) == F23 + k for
 * integers 0 <= k < 2^23. */
constexpr int F23 = 0x4B000000;

/* Shared loads at a 32-bit shared-memory address plus a constant: the staged
 * taps' addresses are formed in 32 bits from the floors' bit patterns
 * (geom_at), which C++ pointer arithmetic would not allow. */
template <int OFF>
__device__ __forceinline__ float2 lds2(uint32_t a)
{
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2+%3];" : "=f"(v.x), "=f"(v.y) : "r"(a), "n"(OFF));
    return v;
}
template <int OFF>
__device__ __forceinline__ float lds1(uint32_t a)
{
    float v;
    asm volatile("ld.shared.f32 %0, [%1+%2];" : "=f"(v) : "r"(a), "n"(OFF));
    return v;
}

/* Channels of the staged pixel at byte addresses a2 (float2 planes) and a1
 * (float plane), plus OFF2 / OFF1 bytes (layout: Stage). */
template <int C, int OFF2, int OFF1>
__device__ __forceinline__ void st_tap(uint32_t a2, uint32_t a1, float (&v)[C])
{
    static_assert(C <= 4, "two channel pairs at most");
    if constexpr (C >= 2) {
        const float2 t = lds2<OFF2>(a2);
        v[0] = t.x;
        v[1] = t.y;
    }
    if constexpr (C >= 4) {
        const float2 t = lds2<OFF2 + 2 * STG * 4>(a2);
        v[2] = t.x;
        v[3] = t.y;
    }
    if constexpr (C & 1) v[C - 1] = lds1<OFF1>(a1);
}

template <int C>
__device__ __forceinline__ void st_put(float *St, int i, const float (&v)[C])
{
#pragma unroll
    for (int k = 0; k + 1 < C; k += 2)
        reinterpret_cast<float2 *>(St + k * STG)[i] = make_float2(v[k], v[k + 1]);
    if constexpr (C & 1) St[(C - 1) * STG + i] = v[C - 1];
}

/* The sample whose source point is (fx, fy) and, for a rotation, whose point in
 * the rotation's input image is (ru, rv) (pixel centres at integers; gpu/aug.h
 * map and rmap at an output pixel): s is the sample's source image (W x H), g
 * its geometry. Taps clamp into the clamp box; a rotation's coverage multiplies
 * the result (gpu/aug.h). Not for GEO_IDENTITY (geom_px). */
template <int C, bool NHWC, int MODE, bool ST = false>
__device__ __forceinline__ void geom_at(const Geo &g, const uint8_t *__restrict__ s, int W, int H,
                                        float fx, float fy, float ru, float rv, float (&v)[C],
                                        const Stage &st = Stage{})
{
    const size_t plane = (size_t)W * H;
    constexpr int px = NHWC ? C : 1; /* elements per pixel step */
    const uint32_t row = (uint32_t)W * px; /* elements per row step */
    constexpr int BASE = MODE & 7;
    constexpr bool ROT = (MODE & GEO_ROT) != 0;
    static_assert(BASE != GEO_IDENTITY, "the identity reads pixel indices: geom_px");
    if constexpr (BASE == GEO_AA) {
        aa_sample<C, NHWC>(g, s, W, H, __fadd_rn(fx, 0.5f), __fadd_rn(fy, 0.5f), v);
        return;
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
    /* Inside the box, so 0 <= u < 2^23. The staged path takes the floors as
     * u + 2^23 rounded down, exactly 2^23 + floor(u), an integer whose low
     * mantissa bits are floor(u): the floor as a float and (in the staged
     * entry's address) as an int from full-rate adds instead of quarter-rate
     * conversions. The global path's byte addresses want the ints themselves:
     * one conversion each way. */
    float tu = 0.f, tw = 0.f, x0f, y0f;
    int x0 = 0, y0 = 0;
    if constexpr (ST) {
        tu = __fadd_rd(u, 0x1p23f);
        tw = __fadd_rd(w_, 0x1p23f);
        x0f = __fsub_rn(tu, 0x1p23f);
        y0f = __fsub_rn(tw, 0x1p23f);
    } else {
        x0 = __float2int_rd(u);
        y0 = __float2int_rd(w_);
        x0f = __int2float_rn(x0);
        y0f = __int2float_rn(y0);
    }
    const float ax = __fsub_rn(u, x0f), ay = __fsub_rn(w_, y0f);
    const float bx = __fsub_rn(1.f, ax), by = __fsub_rn(1.f, ay);
    const float w00 = __fmul_rn(bx, by), w01 = __fmul_rn(ax, by);
    const float w10 = __fmul_rn(bx, ay), w11 = __fmul_rn(ax, ay);
    if constexpr (ST) {
        /* The same taps from the staged footprint: (x0, y0) lies inside it, and
         * its last column and row repeat the clamp box's edge where the box
         * ends, so tap x0 + 1 is the pixel (or the edge) the global path reads. */
        /* Entry (y0 - by0) * sb + x0 - bx0 from the floors' bit patterns: one
         * multiply-add, the tile's constant folded into the base addresses
         * (unsigned: the intermediate wraps, the address does not). */
        const uint32_t j = (uint32_t)__float_as_int(tw) * (uint32_t)st.sb + (uint32_t)__float_as_int(tu);
        const uint32_t a2 = st.a2 + 8u * j, a1 = st.a1 + 4u * j;
        float p00[C], p01[C], p10[C], p11[C];
        st_tap<C, 0, 0>(a2, a1, p00);
        st_tap<C, 8, 4>(a2, a1, p01);
        st_tap<C, 0, 0>(a2 + st.row2, a1 + st.row1, p10);
        st_tap<C, 8, 4>(a2 + st.row2, a1 + st.row1, p11);
        float cov = 1.f;
        if constexpr (ROT) cov = __fmul_rn(cover1(ru, g.rw), cover1(rv, g.rh));
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const float b = SF_MAC(SF_MAC(SF_MAC(__fmul_rn(p00[c], w00), w01, p01[c]), w10, p10[c]), w11, p11[c]);
            v[c] = ROT ? __fmul_rn(b, cov) : b;
        }
        return;
    }
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

/* Resamples output pixel (x, y) of one sample (x, y inside the output image). */
template <int C, bool NHWC, int MODE, bool ST = false>
__device__ __forceinline__ void geom_px(const Geo &g, const uint8_t *__restrict__ s, int W, int H,
                                        int x, int y, float (&v)[C], const Stage &st = Stage{})
{
    constexpr int BASE = MODE & 7;
    if constexpr (BASE == GEO_IDENTITY) { /* out shape == in shape */
        constexpr int px = NHWC ? C : 1;
        const uint8_t *p = s + ((uint32_t)y * W * px + (uint32_t)x * px);
#pragma unroll
        for (int c = 0; c < C; ++c) v[c] = tap<C, NHWC>(p, c, (size_t)W * H);
    } else {
        const float xf = (float)x, yf = (float)y;
        float ru = 0.f, rv = 0.f;
        if constexpr ((MODE & GEO_ROT) != 0 || BASE == GEO_AA_ROT) {
            ru = affine_px(g.rmap, xf, yf);
            rv = affine_px(g.rmap + 3, xf, yf);
        }
        geom_at<C, NHWC, MODE, ST>(g, s, W, H, affine_px(g.map, xf, yf), affine_px(g.map + 3, xf, yf), ru, rv,
                                   v, st);
    }
}

/* The output pixels [lo, hi] of one axis that a tile starting at t0 (n pixels
 * wide, reading r more on each side, reflected into [0, size)) may compute.
 * Returns 0 when the reflection folds more than once (a blur wider than the
 * image), where the range is not worth bounding. */
__device__ __forceinline__ int tile_span(int t0, int n, int r, int size, int &lo, int &hi)
{
    const int a = t0 - r, b = t0 + n + r - 1; /* before reflection */
    if (a < -(size - 1) || b > 2 * (size - 1)) return 0;
    hi = min(b, size - 1);                           /* left reflections land in [0, r] */
    lo = max(0, min(a, 2 * (size - 1) - b));         /* right ones in [2(size-1)-b, size-2] */
    return 1;
}

/* A: the geometry of a blur tile and its halo, GH x GW pixels into slots 1..C
 * (channel c at G + c*slot, row stride GWP), walked with an incremental (row,
 * column) instead of a division per pixel. Only edge tiles (a block-uniform test)
 * need the reflect padding. A rotation's tile that lies wholly inside the
 * rotation's input runs the loop without it (tile_corners). */
template <int C, bool NHWC, int MODE, bool ST>
__device__ __forceinline__ void geom_tile_loop(const sf_aug_plan &P, const Geo &g,
                                               const uint8_t *__restrict__ s, int W, int H, float *G,
                                               int slot, int R, int GH, int GW, int GWP, int tx0, int ty0,
                                               const float *xt, const Stage &st);

/* What the corners of a tile's output span [xlo, xhi] x [ylo, yhi] decide,
 * block-uniform:
 *  covered: every output pixel centre of the span maps inside the rotation's
 *    input image by more than a hundredth of a pixel, where its coverage (and
 *    the nearest-pixel test) is exactly 1 and the per-pixel rotation arithmetic
 *    can be skipped (17 of a bilinear geometry sample's 79 instructions on
 *    sm_90). The map is affine, so the span's image is the parallelogram of its
 *    corners; the margin covers the few-ulp difference between this and the
 *    per-pixel rounding.
 *  fits, (bx0, by0, bw, bh): the source pixels a bilinear tile may read, as a
 *    box [bx0, bx0 + bw - 1] x [by0, by0 + bh - 1] whose last column and row are
 *    the taps' right and lower neighbours: the corners' floored tap coordinates
 *    (they bound every pixel's) one pixel wider on each side for the per-pixel
 *    rounding, clamped into the clamp box. fits = 0 when it exceeds STG pixels
 *    (a shrink, or a strong rotation of a large tile) or a corner's coordinate
 *    is not finite.
 * Lane k of every quad of lanes computes corner k, and votes and two shuffles
 * combine them: each thread evaluating all four corners was a tenth of the
 * blur kernel's instructions (each thread resamples only ~10 pixels). Every
 * lane of the warp must call it. */
struct Corners {
    bool covered, fits;
    int bx0, by0, bw, bh;
};

__device__ __forceinline__ Corners tile_corners(const Geo &g, int xlo, int xhi, int ylo, int yhi, bool rot,
                                                bool box)
{
    constexpr unsigned ALL = 0xffffffffu;
    const int k = threadIdx.x & 3;
    const float x = (float)(k & 1 ? xhi : xlo), y = (float)(k & 2 ? yhi : ylo);
    Corners c{false, false, 0, 0, 0, 0};
    if (rot) {
        const float ru = affine_px(g.rmap, x, y), rv = affine_px(g.rmap + 3, x, y);
        c.covered = __all_sync(ALL, ru >= 0.01f && ru <= g.rw - 1.01f && rv >= 0.01f && rv <= g.rh - 1.01f);
    }
    if (box) {
        const float fx = affine_px(g.map, x, y), fy = affine_px(g.map + 3, x, y);
        /* Finite corners make every pixel's coordinate finite. */
        const bool num = __all_sync(ALL, fabsf(fx) <= 1e30f && fabsf(fy) <= 1e30f);
        float mnx = fx, mxx = fx, mny = fy, mxy = fy;
#pragma unroll
        for (int m = 1; m <= 2; m <<= 1) {
            mnx = fminf(mnx, __shfl_xor_sync(ALL, mnx, m));
            mxx = fmaxf(mxx, __shfl_xor_sync(ALL, mxx, m));
            mny = fminf(mny, __shfl_xor_sync(ALL, mny, m));
            mxy = fmaxf(mxy, __shfl_xor_sync(ALL, mxy, m));
        }
        /* Clamped first, so the floors are small integers. */
        const float xl = (float)g.xlo, xh = (float)g.xhi, yl = (float)g.ylo, yh = (float)g.yhi;
        c.bx0 = max((int)floorf(fminf(fmaxf(mnx, xl), xh)) - 1, g.xlo);
        c.by0 = max((int)floorf(fminf(fmaxf(mny, yl), yh)) - 1, g.ylo);
        c.bw = min((int)floorf(fminf(fmaxf(mxx, xl), xh)) + 1, g.xhi) - c.bx0 + 2;
        c.bh = min((int)floorf(fminf(fmaxf(mxy, yl), yh)) + 1, g.yhi) - c.by0 + 2;
        c.fits = num && c.bw * c.bh <= STG;
    }
    return c;
}

/* Copies the box of tile_corners into St (layout: Stage), all threads of the
 * block, walked as geom_tile_loop walks its tile, two pixels per step so that
 * each thread has both pixels' loads in flight. */
template <int C, bool NHWC>
__device__ __forceinline__ void stage_tile(float *St, const Geo &g, const uint8_t *__restrict__ s, int W,
                                           int H, int bx0, int by0, int bw, int bh, int sb)
{
    const size_t plane = (size_t)W * H;
    constexpr int px = NHWC ? C : 1;
    const uint32_t row = (uint32_t)W * px;
    const int dr = div_small(NT, bw), dq = NT - dr * bw;
    int r = div_small(threadIdx.x, bw), q = threadIdx.x - r * bw;
    while (r < bh) {
        int r2 = r + dr, q2 = q + dq;
        if (q2 >= bw) { q2 -= bw; ++r2; }
        const bool two = r2 < bh;
        const uint8_t *p = s + ((uint32_t)min(by0 + r, g.yhi) * row + (uint32_t)min(bx0 + q, g.xhi) * px);
        const uint8_t *p2 = s + ((uint32_t)min(by0 + (two ? r2 : r), g.yhi) * row +
                                 (uint32_t)min(bx0 + (two ? q2 : q), g.xhi) * px);
        float a[C], b[C];
#pragma unroll
        for (int c = 0; c < C; ++c) {
            a[c] = tap<C, NHWC>(p, c, plane);
            b[c] = tap<C, NHWC>(p2, c, plane);
        }
        st_put<C>(St, r * sb + q, a);
        if (two) st_put<C>(St, r2 * sb + q2, b);
        r = r2 + dr;
        q = q2 + dq;
        if (q >= bw) { q -= bw; ++r; }
    }
}

/* St: STG * C floats of shared memory for the staged footprint, or NULL. A
 * bilinear tile whose footprint fits is staged first: its 12 taps per pixel
 * become shared loads at fixed offsets instead of byte gathers through L1,
 * each with its conversion and 64-bit address (docs/DESIGN.md §5). */
template <int C, bool NHWC, int MODE>
__device__ __forceinline__ void geom_tile(const sf_aug_plan &P, const Geo &g,
                                          const uint8_t *__restrict__ s, int W, int H, float *G, int slot,
                                          int R, int GH, int GW, int GWP, int tx0, int ty0, float *St,
                                          float *xt)
{
    constexpr int NOROT = MODE & ~GEO_ROT;
    /* The region's columns as output x coordinates, reflected: the walk reads
     * each pixel's from here (one shared load) instead of reflecting and
     * converting it per pixel. Read after the barrier below. */
    if (threadIdx.x < GW) {
        const int x = tx0 - R + (int)threadIdx.x;
        xt[threadIdx.x] = (float)reflect_idx(x, P.out_w);
    }
    int xlo = 0, xhi = 0, ylo = 0, yhi = 0;
    const bool span = tile_span(tx0, TW, R, P.out_w, xlo, xhi) && tile_span(ty0, TH, R, P.out_h, ylo, yhi);
    constexpr bool BIL = (MODE & 7) == GEO_BILINEAR;
    Corners k{false, false, 0, 0, 0, 0};
    if (span) k = tile_corners(g, xlo, xhi, ylo, yhi, (MODE & GEO_ROT) != 0, BIL && St);
    const bool covered = k.covered;
    if constexpr (BIL) {
        if (k.fits) {
            /* Rows sb = 5 or 11 (mod 16) entries apart where that fits: the
             * taps of a warp's 8 x 4 pixels span a few rows of a few entries,
             * and rows that shift the banks by 5 or 11 entries (10 or 22
             * words of a float2 plane) put them in distinct banks, where
             * the unpadded width left 2-3 way conflicts (W1: the kernel's
             * shared-load bank conflicts 692k -> 238k wavefronts of 3.2M ->
             * 2.8M, for ~10 % more staged entries; 2 % faster). */
            const int pad = min((5 - k.bw) & 15, (11 - k.bw) & 15);
            const int sb = (k.bw + pad) * k.bh <= STG ? k.bw + pad : k.bw;
            const uint32_t off = ((uint32_t)F23 + (uint32_t)k.by0) * (uint32_t)sb + (uint32_t)F23 + (uint32_t)k.bx0;
            const uint32_t base = (uint32_t)__cvta_generic_to_shared(St);
            const Stage st{sb, base - 8u * off, base + 4u * (C - 1) * STG - 4u * off, 8u * (uint32_t)sb,
                           4u * (uint32_t)sb};
            stage_tile<C, NHWC>(St, g, s, W, H, k.bx0, k.by0, k.bw, k.bh, sb);
            __syncthreads(); /* the footprint (and xt) are read by every thread's pixels */
            if (covered)
                geom_tile_loop<C, NHWC, NOROT, true>(P, g, s, W, H, G, slot, R, GH, GW, GWP, tx0, ty0, xt, st);
            else
                geom_tile_loop<C, NHWC, MODE, true>(P, g, s, W, H, G, slot, R, GH, GW, GWP, tx0, ty0, xt, st);
            return;
        }
    }
    __syncthreads(); /* xt */
    if (covered)
        geom_tile_loop<C, NHWC, NOROT, false>(P, g, s, W, H, G, slot, R, GH, GW, GWP, tx0, ty0, xt, Stage{});
    else
        geom_tile_loop<C, NHWC, MODE, false>(P, g, s, W, H, G, slot, R, GH, GW, GWP, tx0, ty0, xt, Stage{});
}

template <int C, bool NHWC, int MODE, bool ST>
__device__ __forceinline__ void geom_tile_loop(const sf_aug_plan &P, const Geo &g,
                                               const uint8_t *__restrict__ s, int W, int H, float *G,
                                               int slot, int R, int GH, int GW, int GWP, int tx0, int ty0,
                                               const float *xt, const Stage &st)
{
    constexpr int BASE = MODE & 7;
    constexpr bool RMAP = (MODE & GEO_ROT) != 0 || BASE == GEO_AA_ROT;
    /* Only edge tiles need the reflect padding (the columns' is in xt). */
    const bool in_y = ty0 - R >= 0 && ty0 + TH + R <= P.out_h;
    /* A warp takes 8 x 4 pixels at a time: its 32 samples' taps then fall in a
     * few source rows and mostly share shared-memory words (broadcasts), where
     * a 32 x 1 run reads about twice as many words, and its stores hit 32
     * distinct banks (g_stride). The region is CY bands of 4 rows, each CX
     * chunks of 8 columns; the last chunk of a row or band is moved back inside
     * the region (GW >= 8, GH >= 4), so every lane has a pixel and a few are
     * computed twice (the same value stored twice). Warp w takes chunks
     * [w S / 8, (w+1) S / 8) in band order, so the warps' shares differ by at
     * most one chunk, and it walks them along the band: the row's part of each
     * map, fmaf(m[1], y, m[2]), and the row's reflection are computed once per
     * band, leaving one fused multiply-add per coordinate per pixel — the same
     * roundings as affine_px, so the same taps as the reference. */
    constexpr int NW = NT / 32;
    const int lx = threadIdx.x & 7, ly = (threadIdx.x >> 3) & 3, wp = threadIdx.x >> 5;
    const int CX = (GW + 7) >> 3, S = CX * ((GH + 3) >> 2);
    int k = wp * S / NW;
    const int k1 = (wp + 1) * S / NW;
    int band = div_small(k, CX);
    int q = min(8 * (k - band * CX), GW - 8) + lx; /* the lane's column */
    const int qlast = GW - 8 + lx;
    while (k < k1) {
        const int r = min(4 * band, GH - 4) + ly;
        int y = ty0 - R + r;
        if (!in_y) y = reflect_idx(y, P.out_h);
        const float yf = (float)y;
        const float mx = __fmaf_rn(g.map[1], yf, g.map[2]), my = __fmaf_rn(g.map[4], yf, g.map[5]);
        float rx = 0.f, ry = 0.f;
        if constexpr (RMAP) {
            rx = __fmaf_rn(g.rmap[1], yf, g.rmap[2]);
            ry = __fmaf_rn(g.rmap[4], yf, g.rmap[5]);
        }
        float *o = G + r * GWP;
        /* This band's chunks of the warp's share. */
        const int kend = min(k1, (band + 1) * CX);
        for (; k < kend; ++k) {
            float gv[C];
            if constexpr (BASE == GEO_IDENTITY) {
                geom_px<C, NHWC, MODE>(g, s, W, H, (int)xt[q], y, gv);
            } else {
                const float xf = xt[q];
                float ru = 0.f, rv = 0.f;
                if constexpr (RMAP) {
                    ru = __fmaf_rn(g.rmap[0], xf, rx);
                    rv = __fmaf_rn(g.rmap[3], xf, ry);
                }
                geom_at<C, NHWC, MODE, ST>(g, s, W, H, __fmaf_rn(g.map[0], xf, mx), __fmaf_rn(g.map[3], xf, my),
                                           ru, rv, gv, st);
            }
#pragma unroll
            for (int c = 0; c < C; ++c) o[q + c * slot] = gv[c];
            q = min(q + 8, qlast);
        }
        ++band;
        q = lx;
    }
}

/* The thread's 2 x 4 pixels without a blur; out-of-image pixels of an edge tile
 * are computed at a clamped position and never stored. */
template <int C, bool NHWC, int MODE>
__device__ __forceinline__ void geom_direct_px(const sf_aug_plan &P, const Geo &g,
                                               const uint8_t *__restrict__ s, int W, int H, int xb,
                                               int yb, float (&v)[C][2][4]);

template <int C, bool NHWC, int MODE>
__device__ __forceinline__ void geom_direct(const sf_aug_plan &P, const Geo &g,
                                            const uint8_t *__restrict__ s, int W, int H, int xb, int yb,
                                            float (&v)[C][2][4])
{
    if constexpr ((MODE & GEO_ROT) != 0) {
        /* The block's tile, clamped into the image as the pixels are. */
        const int tx0 = blockIdx.x * TW, ty0 = blockIdx.y * TH;
        if (tile_corners(g, tx0, min(tx0 + TW, P.out_w) - 1, ty0, min(ty0 + TH, P.out_h) - 1, true, false)
                .covered) {
            geom_direct_px<C, NHWC, MODE & ~GEO_ROT>(P, g, s, W, H, xb, yb, v);
            return;
        }
    }
    geom_direct_px<C, NHWC, MODE>(P, g, s, W, H, xb, yb, v);
}

template <int C, bool NHWC, int MODE>
__device__ __forceinline__ void geom_direct_px(const sf_aug_plan &P, const Geo &g,
                                               const uint8_t *__restrict__ s, int W, int H, int xb,
                                               int yb, float (&v)[C][2][4])
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
 * thread's 2 x 4 pixels. All threads of the block call it (it synchronises).
 * Static: every file that includes this header has its own copy, as of the
 * inline helpers, rather than one definition that the others would clash with. */
static __device__ void tile_mask(uint8_t *bits, uint16_t *hd, uint64_t seed, float ratio, int d,
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
    /* B: horizontal pass. Thread (t >> 3, q4) takes rows t>>3, +32, ...; each
     * quarter warp (8 threads) reads one row's 32 consecutive floats per 16-byte
     * load, without bank conflicts. */
    for (int c = 0; c < C; ++c) {
        const float *G = slots + (c + 1) * slot;
        float *Hb = slots + c * slot;
        for (int r = threadIdx.x >> 3; r < GH; r += NT / 8) {
            const float *g = G + r * GWP + 4 * q4;
            float a0, a1, a2, a3;
            if constexpr (K > 0) {
                /* The K + 3 inputs of 4 outputs in 16-byte loads (rows are
                 * 16-byte aligned, and 4*q4 + 4*NW <= GWP). */
                constexpr int NW = (K + 6) / 4;
                float win[4 * NW];
#pragma unroll
                for (int k = 0; k < NW; ++k) {
                    const float4 t = reinterpret_cast<const float4 *>(g)[k];
                    win[4 * k] = t.x; win[4 * k + 1] = t.y; win[4 * k + 2] = t.z; win[4 * k + 3] = t.w;
                }
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
    int slot;       /* floats per blur slot: GH * max(GWP, HS), a multiple of 4 */
    unsigned off_g, off_bits, off_hd; /* byte offsets into dynamic shared memory */
    unsigned off_st; /* the staged footprint (BLUR, bilinear), 0 when none */
};

/* Plain kernels of up to 3 channels keep to 64 registers, 4 blocks of NT
 * threads per SM: ptxas fits the clamped taps and the rotation's coverage
 * (which would take some to 78 registers) in that without spills. With 4 channels
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
        const int GH = TH + 2 * R, GW = TW + 2 * R, GWP = g_stride(R);
        float *wk = reinterpret_cast<float *>(smem);
        float *slots = reinterpret_cast<float *>(smem + L.off_g);
        const int slot = L.slot;
        if (threadIdx.x < K) wk[threadIdx.x] = S->blur_w[threadIdx.x];

        float *G = slots + slot; /* channel c's geometry in slot c+1 */
        /* The staged footprint: L.off_st up to the end of slot 0, which the
         * horizontal pass fills only after the geometry is done. */
        float *St = L.off_st ? reinterpret_cast<float *>(smem + L.off_st) : nullptr;
#define SF_GEO_TILE(M) geom_tile<C, NHWC, M>(P, g, s, W, H, G, slot, R, GH, GW, GWP, tx0, ty0, St, wk + 32)
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

/* ---- the separable antialias filter ----------------------------------------- */

/* Without a rotation the composed map is axis-aligned (map[1] = map[3] = 0: crops,
 * resizes and flips scale and shift each axis on its own), so the antialiased
 * sample of output pixel (x, y) is
 *   v = sum_j wy(y, j) * sum_i wx(x, i) * src[j][i]  /  (sumx(x) * sumy(y)),
 * where the x taps and weights depend on the output column only and the y taps
 * on the output row only. aa_sample, run per pixel, recomputes both sets of
 * weights for every pixel and every tap (the x weights once per tap row), about
 * 20 instructions per tap and 16 taps per pixel at a 2x shrink. This kernel
 * computes them once per tile: tables of the TW columns' and TH rows' tap
 * ranges, weights and reciprocal weight sums (AA_K taps each), then
 *   1. horizontal pass: for every source row j the tile's rows reach, and every
 *      tile column, Hs[c][j][x] = sum_i wx * src[j][i] — the reference's inner
 *      sum, in its order;
 *   2. vertical pass: each thread's 2 x 4 pixels sum wy * Hs over their rows;
 * then the pointwise stages and the stores of augment_kernel. At a shrink of a
 * per axis a tile costs (a*TH + 2a) rows x TW columns x 2a taps horizontally and
 * TH x TW x 2a taps vertically: per output pixel and channel about 2a^2 + 2a
 * tap-multiply-adds (each a byte load, a conversion and an FMA horizontally,
 * a quarter of a 16-byte shared load and an FMA vertically) instead of 4a^2
 * taps with their weights recomputed. For the ImageNet recipe (a ~1.7) that is
 * about 9 instead of 48 weighted taps per pixel and channel.
 * The sums run in the reference's order; only the final division becomes a
 * multiplication by the reciprocal sums (a few ulp, far below the 1e-5 the
 * tests allow). A sample whose map is not axis-aligned, whose taps per axis
 * exceed AA_K, or whose rows exceed the AA_ROWS rows of Hs (a shrink beyond
 * about 2.6) takes the per-pixel path (geom_direct) in the same block. */
constexpr int AA_K = 16;     /* taps per axis held in the tables */
/* Source rows of the horizontal pass held in Hs: a 64-row tile at a shrink up
 * to 2.6 (a portrait 560-pixel side to 224), and 3 blocks of 3 channels per SM
 * (73 KB each). */
constexpr int AA_ROWS = 176;

template <int C, bool NHWC, typename OutT>
__global__ void __launch_bounds__(NT, C > 3 ? 2 : 3)
aa_separable_kernel(const __grid_constant__ sf_aug_plan P, const __grid_constant__ Launch L,
                    const sf_aug_sample *__restrict__ samples, const uint8_t *__restrict__ src,
                    OutT *__restrict__ dst)
{
    extern __shared__ __align__(16) unsigned char smem[];
    /* Tables, transposed ([k][column], [k][row]) so a warp's 32 columns or rows
     * read 32 banks. */
    float *xw = reinterpret_cast<float *>(smem);          /* [AA_K][TW] */
    float *yw = xw + AA_K * TW;                           /* [AA_K][TH] */
    float *xr = yw + AA_K * TH;                           /* [TW] 1 / sumx */
    float *yr = xr + TW;                                  /* [TH] 1 / sumy */
    int *xi0 = reinterpret_cast<int *>(yr + TH);          /* [TW] first tap */
    int *xn = xi0 + TW;                                   /* [TW] taps */
    int *yj0 = xn + TW;                                   /* [TH] */
    int *yn = yj0 + TH;                                   /* [TH] */
    int *flags = yn + TH;                                 /* [3]: jlo, jhi, overflow */
    float *Hs = reinterpret_cast<float *>(smem + L.off_g); /* [C][AA_ROWS][TW] */

    const int n = blockIdx.z;
    const int tx0 = blockIdx.x * TW, ty0 = blockIdx.y * TH;
    const int OW = P.out_w, OH = P.out_h;
    const sf_aug_sample *S = samples + n;
    Geo g;
    load_geo(S, g);
    const uint8_t *s = src + S->src_off;
    const int W = S->src_w, H = S->src_h;
    asm("" : "+l"(s));
    const int t = threadIdx.x, q4 = t & 7, rp = t >> 3;
    float v[C][2][4];

    if (t == 0) { flags[0] = INT_MAX; flags[1] = INT_MIN; flags[2] = 0; }
    __syncthreads();
    /* Threads 0..TW-1 build the column tables, TW..TW+TH-1 the row tables, with
     * aa_sample's arithmetic. Columns and rows past the image are built at the
     * last one (their pixels are computed and never stored). */
    if (t < TW + TH) {
        const bool col = t < TW;
        const int e = col ? t : t - TW;
        const float o = (float)(col ? min(tx0 + e, OW - 1) : min(ty0 + e, OH - 1));
        /* With map[1] = 0 (map[3] = 0) fx (fy) does not depend on the other
         * coordinate (fmaf(0, y, c) == c): the same float as geom_px gives at
         * every pixel. */
        const float sc = __fadd_rn(col ? affine_px(g.map, o, 0.f) : affine_px(g.map + 3, 0.f, o), 0.5f);
        const int lo = col ? g.xlo : g.ylo, hi = col ? g.xhi : g.yhi;
        const float a = col ? g.ax : g.ay, ai = col ? g.axi : g.ayi;
        const float pc = fminf(fmaxf(sc, __fadd_rn((float)lo, 0.5f)), __fadd_rn((float)hi, 0.5f));
        const int i0 = max((int)floorf(__fadd_rn(__fsub_rn(pc, a), 0.5f)), lo);
        const int i1 = min((int)floorf(__fadd_rn(__fadd_rn(pc, a), 0.5f)), hi + 1);
        const int stride = col ? TW : TH;
        float *w = (col ? xw : yw) + e;
        float sum = 0.f;
        for (int i = i0; i < i1; ++i) {
            const float wi = aa_tri(__fmul_rn(__fsub_rn(__fadd_rn((float)i, 0.5f), pc), ai));
            sum = __fadd_rn(sum, wi);
            if (i - i0 < AA_K) w[(i - i0) * stride] = wi;
        }
        (col ? xr : yr)[e] = __frcp_rn(sum);
        (col ? xi0 : yj0)[e] = i0;
        (col ? xn : yn)[e] = i1 - i0;
        if (i1 - i0 > AA_K) flags[2] = 1;
        if (!col) {
            atomicMin(&flags[0], i0);
            atomicMax(&flags[1], i1);
        }
    }
    __syncthreads();
    const int jlo = flags[0], nrows = flags[1] - jlo;
    const bool separable = g.map[1] == 0.f && g.map[3] == 0.f && flags[2] == 0 && nrows <= AA_ROWS;

    if (separable) {
        /* 1: horizontal pass. A warp takes one source row, its lanes the tile's
         * 32 columns, whose taps lie within about 32a pixels of the row: a few
         * cache lines per load instruction. */
        constexpr int px = NHWC ? C : 1;
        const uint32_t row = (uint32_t)W * px;
        const size_t plane = (size_t)W * H;
        const int x = t % TW;
        const int i0 = xi0[x], nx = xn[x];
        for (int r = t / TW; r < nrows; r += NT / TW) {
            const uint8_t *p = s + ((uint32_t)(jlo + r) * row + (uint32_t)i0 * px);
            float acc[C];
#pragma unroll
            for (int c = 0; c < C; ++c) acc[c] = 0.f;
            for (int k = 0; k < nx; ++k, p += px) {
                const float w = xw[k * TW + x];
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    const float tv = tap<C, NHWC>(p, c, plane);
                    acc[c] = SF_MAC(acc[c], w, tv);
                }
            }
#pragma unroll
            for (int c = 0; c < C; ++c) Hs[(c * AA_ROWS + r) * TW + x] = acc[c];
        }
        __syncthreads();
        /* 2: vertical pass, 16-byte loads of 4 columns per row. */
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const int yl = 2 * rp + rr;
            const int j0 = yj0[yl] - jlo, ny = yn[yl];
            float a[C][4];
#pragma unroll
            for (int c = 0; c < C; ++c)
#pragma unroll
                for (int j = 0; j < 4; ++j) a[c][j] = 0.f;
            for (int k = 0; k < ny; ++k) {
                const float w = yw[k * TH + yl];
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    const float4 h = *reinterpret_cast<const float4 *>(Hs + (c * AA_ROWS + j0 + k) * TW + 4 * q4);
                    a[c][0] = SF_MAC(a[c][0], w, h.x); a[c][1] = SF_MAC(a[c][1], w, h.y);
                    a[c][2] = SF_MAC(a[c][2], w, h.z); a[c][3] = SF_MAC(a[c][3], w, h.w);
                }
            }
            const float ry = yr[yl];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float rn = __fmul_rn(xr[4 * q4 + j], ry);
#pragma unroll
                for (int c = 0; c < C; ++c) v[c][rr][j] = __fmul_rn(a[c][j], rn);
            }
        }
    } else {
        geom_direct<C, NHWC, GEO_AA>(P, g, s, W, H, tx0 + 4 * q4, ty0 + 2 * rp, v);
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

/* Shared memory of aa_separable_kernel ahead of the mask's: the tables, then Hs. */
constexpr size_t AA_TABLE_BYTES = sizeof(float) * (AA_K * (TW + TH) + TW + TH) + sizeof(int) * (2 * (TW + TH) + 4);

/* ---- launchers ------------------------------------------------------------- */

/* The plans aa_separable_kernel runs: the antialias filter on an axis-aligned
 * map (no rotation), no blur tile. */
inline bool aa_separable(const sf_aug_plan &P)
{
    return geo_mode(P) == GEO_AA && !(P.blur_ksize > 1);
}

template <int C, bool NHWC, bool BLUR, typename OutT>
int launch_one(const sf_aug_plan *plan, const Launch &L, size_t smem, dim3 grid,
               const sf_aug_sample *d_samples, const uint8_t *d_src, OutT *d_dst, cudaStream_t s)
{
    const int mode = geo_mode(*plan);
    auto k = mode == GEO_AA || mode == GEO_AA_ROT ? augment_kernel<C, NHWC, BLUR, true, OutT>
                                                  : augment_kernel<C, NHWC, BLUR, false, OutT>;
    if (aa_separable(*plan)) k = aa_separable_kernel<C, NHWC, OutT>;
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

/* Instantiated in gpu/cuda/augment_c<C>.cu, one file per channel count; every
 * other file that includes this header links to those. */
#define SF_AUG_DISPATCH_C(C, OutT)                                                             \
    template int dispatch_c<C, OutT>(const sf_aug_plan *, const Launch &, size_t, dim3, bool, int, \
                                     const sf_aug_sample *, const uint8_t *, OutT *, cudaStream_t)
extern SF_AUG_DISPATCH_C(1, float);
extern SF_AUG_DISPATCH_C(1, uint16_t);
extern SF_AUG_DISPATCH_C(2, float);
extern SF_AUG_DISPATCH_C(2, uint16_t);
extern SF_AUG_DISPATCH_C(3, float);
extern SF_AUG_DISPATCH_C(3, uint16_t);
extern SF_AUG_DISPATCH_C(4, float);
extern SF_AUG_DISPATCH_C(4, uint16_t);

} // namespace sf_aug_cuda

#endif /* SF_GPU_CUDA_AUGMENT_KERNELS_CUH */
