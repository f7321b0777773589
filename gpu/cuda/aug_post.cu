/* gpu/cuda/aug_post.cu — color_jitter, random_erasing and the stages after
 * them: the second per-sample pass (gpu/aug.h semantics, sf_ref_aug_post).
 *
 * One block per sample. The stages flatten into a sequence of micro-ops (the
 * jitter's four adjustments in the sample's order, the others one each). All
 * of them are per pixel except contrast, which needs the grayscale mean of the
 * image as it stands before it; so the sequence splits at each contrast, and
 * each segment is one pass over the sample's pixels that applies its micro-ops
 * in registers and, when a contrast follows, sums the gray values it writes
 * (in double, as the reference, then a block reduction). A list with only
 * brightness, saturation, hue and erasing is one read and one write per pixel.
 *
 * Arithmetic follows the reference's order with explicit round-to-nearest
 * intrinsics (no fused multiply-adds), so a pixel differs from the reference
 * only by the contrast mean's summation order and, for "random" erasing, the
 * device's double log/cos against the host's (DESIGN.md §5 tolerances).
 */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "gpu/cuda/aug_post.h"
#include "gpu/cuda/check.h"
#include "gpu/rng.h"

namespace {

constexpr int NT = 256;
constexpr int MAX_MICRO = SF_AUG_MAX_OPS + 3; /* one jitter of four, the rest one each */

__device__ __forceinline__ float ld(const float *p) { return *p; }
__device__ __forceinline__ float ld(const uint16_t *p)
{
    return __bfloat162float(__ushort_as_bfloat16(*p));
}
__device__ __forceinline__ void st(float *p, float v) { *p = v; }
__device__ __forceinline__ void st(uint16_t *p, float v)
{
    *p = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__device__ __forceinline__ float clampb(float v, float hi) { return fminf(fmaxf(v, 0.0f), hi); }

/* r*0.2989 + g*0.587 + b*0.114, in the reference's order. */
__device__ __forceinline__ float gray3(float r, float g, float b)
{
    return __fadd_rn(__fadd_rn(__fmul_rn(r, 0.2989f), __fmul_rn(g, 0.587f)), __fmul_rn(b, 0.114f));
}

/* x*f + m, two roundings. */
__device__ __forceinline__ float blend(float x, float f, float m) { return __fadd_rn(__fmul_rn(x, f), m); }

/* gpu/ref/augment.c's hue_shift, line for line. */
__device__ void hue_shift(float &r, float &g, float &b, float shift, float bound)
{
    const float R = r, G = g, B = b;
    const float maxc = fmaxf(fmaxf(R, G), B), minc = fminf(fminf(R, G), B);
    const bool eqc = maxc == minc;
    const float cr = __fsub_rn(maxc, minc);
    const float sat = __fdiv_rn(cr, eqc ? 1.0f : maxc);
    const float crd = eqc ? 1.0f : cr;
    const float rc = __fdiv_rn(__fsub_rn(maxc, R), crd), gc = __fdiv_rn(__fsub_rn(maxc, G), crd),
                bc = __fdiv_rn(__fsub_rn(maxc, B), crd);
    float h;
    if (maxc == R)
        h = __fsub_rn(bc, gc);
    else if (maxc == G)
        h = __fsub_rn(__fadd_rn(rc, 2.0f), bc);
    else
        h = __fsub_rn(__fadd_rn(gc, 4.0f), rc);
    h = fmodf(__fadd_rn(__fmul_rn(h, 1.0f / 6.0f), 1.0f), 1.0f);
    h = __fadd_rn(h, shift);
    h = __fsub_rn(h, floorf(h));
    const float h6 = __fmul_rn(h, 6.0f), fi = floorf(h6), f = __fsub_rn(h6, fi);
    int i = (int)fi % 6;
    if (i < 0)
        i += 6;
    const float sxf = __fmul_rn(sat, f), oms = __fsub_rn(1.0f, sat);
    const float v = maxc;
    const float q = clampb(__fmul_rn(__fsub_rn(1.0f, sxf), v), bound);
    const float t = clampb(__fmul_rn(__fadd_rn(sxf, oms), v), bound);
    const float p = clampb(__fmul_rn(oms, v), bound);
    switch (i) {
    case 0: r = v; g = t; b = p; break;
    case 1: r = q; g = v; b = p; break;
    case 2: r = p; g = v; b = t; break;
    case 3: r = p; g = q; b = v; break;
    case 4: r = t; g = p; b = v; break;
    default: r = v; g = p; b = q; break;
    }
}

/* sf_ref_aug_erase_noise. */
__device__ __forceinline__ float erase_noise(uint64_t seed, int y, int x, int ch)
{
    const uint64_t h = sf_hash4(seed, (uint64_t)y, (uint64_t)x, (uint64_t)ch);
    const double u1 = 1.0 - (double)sf_u01(h);
    const double u2 = (double)((h >> 16) & 0xFFFFFFull) * (1.0 / 16777216.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Micro-op m: stage index in the low byte, the jitter adjustment (0..3) or
 * 0xFF in the high byte. */
struct Micro {
    uint8_t stage[MAX_MICRO], sub[MAX_MICRO];
    int n;
};

__device__ __forceinline__ bool is_contrast(const sf_aug_plan &P, const Micro &M, int m)
{
    return P.post[M.stage[m]].kind == SF_PW_JITTER && M.sub[m] == 1;
}

template <int C>
__device__ __forceinline__ void apply(const sf_aug_plan &P, const sf_aug_sample &S, const Micro &M, int m,
                                      float (&v)[C], int y, int x, float mean)
{
    const sf_aug_pw &pw = P.post[M.stage[m]];
    switch (pw.kind) {
    case SF_PW_SCALE:
#pragma unroll
        for (int ch = 0; ch < C; ++ch)
            v[ch] = __fmul_rn(v[ch], pw.a[0]);
        break;
    case SF_PW_NORMALIZE:
#pragma unroll
        for (int ch = 0; ch < C; ++ch)
            v[ch] = __fmul_rn(__fsub_rn(v[ch], pw.a[ch]), pw.b[ch]);
        break;
    case SF_PW_YCBCR:
        if (C == 3) {
            const float r = v[0], g = v[1], b = v[2 % C], off = pw.a[0];
            v[0] = __fadd_rn(__fadd_rn(__fmul_rn(0.299f, r), __fmul_rn(0.587f, g)), __fmul_rn(0.114f, b));
            v[1] = __fadd_rn(__fsub_rn(__fsub_rn(off, __fmul_rn(0.168736f, r)), __fmul_rn(0.331264f, g)),
                             __fmul_rn(0.5f, b));
            v[2 % C] = __fsub_rn(__fsub_rn(__fadd_rn(off, __fmul_rn(0.5f, r)), __fmul_rn(0.418688f, g)),
                                 __fmul_rn(0.081312f, b));
        }
        break;
    case SF_PW_JITTER: {
        const int f = M.sub[m];
        const float k = S.jitter[f], bound = pw.b[0];
        if (f == 0) {
#pragma unroll
            for (int ch = 0; ch < C; ++ch)
                v[ch] = clampb(__fmul_rn(v[ch], k), bound);
        } else if (f == 1) {
            const float mw = __fmul_rn(mean, __fsub_rn(1.0f, k));
#pragma unroll
            for (int ch = 0; ch < C; ++ch)
                v[ch] = clampb(blend(v[ch], k, mw), bound);
        } else if (C == 3 && f == 2) {
            const float gw = __fmul_rn(gray3(v[0], v[1], v[2 % C]), __fsub_rn(1.0f, k));
#pragma unroll
            for (int ch = 0; ch < C; ++ch)
                v[ch] = clampb(blend(v[ch], k, gw), bound);
        } else if (C == 3 && f == 3) {
            hue_shift(v[0], v[1], v[2 % C], k, bound);
        }
        break;
    }
    case SF_PW_ERASE:
        if (x >= S.erase[0] && x < S.erase[0] + S.erase[2] && y >= S.erase[1] && y < S.erase[1] + S.erase[3]) {
#pragma unroll
            for (int ch = 0; ch < C; ++ch)
                v[ch] = pw.b[0] != 0.0f ? erase_noise(S.erase_seed, y, x, ch) : pw.a[ch];
        }
        break;
    default: /* SF_PW_MASK: refused after these ops by the plan */
        break;
    }
}

/* One pass over the sample: micro-ops [m0, m1) on every pixel (stored when
 * m1 > m0); when `reduce`, returns to every thread the mean gray value of the
 * result. */
template <int C, typename T>
__device__ float pass(const sf_aug_plan &P, const sf_aug_sample &S, const Micro &M, int m0, int m1, bool reduce,
                      float mean, T *base, bool nhwc)
{
    __shared__ double part[NT / 32];
    const int OW = P.out_w;
    const int plane = P.out_h * OW;
    double sum = 0.0;
    for (int pix = threadIdx.x; pix < plane; pix += NT) {
        const int y = pix / OW, x = pix - y * OW;
        float v[C];
#pragma unroll
        for (int ch = 0; ch < C; ++ch)
            v[ch] = ld(nhwc ? base + (size_t)pix * C + ch : base + (size_t)ch * plane + pix);
        for (int m = m0; m < m1; ++m)
            apply<C>(P, S, M, m, v, y, x, mean);
        if (m1 > m0) {
#pragma unroll
            for (int ch = 0; ch < C; ++ch)
                st(nhwc ? base + (size_t)pix * C + ch : base + (size_t)ch * plane + pix, v[ch]);
        }
        if (reduce) {
            /* The stored value: a bf16 output is what the next op reads. */
            float g[C];
#pragma unroll
            for (int ch = 0; ch < C; ++ch)
                g[ch] = ld(nhwc ? base + (size_t)pix * C + ch : base + (size_t)ch * plane + pix);
            sum += C == 3 ? (double)gray3(g[0], g[1 % C], g[2 % C]) : (double)g[0];
        }
    }
    if (!reduce)
        return mean;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_down_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = sum;
    __syncthreads();
    double total = 0.0;
#pragma unroll
    for (int w = 0; w < NT / 32; ++w)
        total += part[w];
    __syncthreads(); /* part is reused by the next reduction */
    return (float)(total / (double)plane);
}

template <int C, typename T>
__global__ void __launch_bounds__(NT) post_kernel(const __grid_constant__ sf_aug_plan P,
                                                  const sf_aug_sample *__restrict__ samples, T *io, int nhwc)
{
    const sf_aug_sample &S = samples[blockIdx.x];
    T *base = io + (size_t)blockIdx.x * C * P.out_h * P.out_w;
    Micro M;
    M.n = 0;
    for (int st = 0; st < P.n_post; ++st) {
        if (P.post[st].kind == SF_PW_JITTER) {
            for (int k = 0; k < 4; ++k) {
                const int f = S.jitter_order[k] & 3;
                if (P.post[st].a[f] != 0.0f) {
                    M.stage[M.n] = (uint8_t)st;
                    M.sub[M.n++] = (uint8_t)f;
                }
            }
        } else {
            M.stage[M.n] = (uint8_t)st;
            M.sub[M.n++] = 0xFF;
        }
    }
    float mean = 0.0f;
    if (M.n > 0 && is_contrast(P, M, 0))
        mean = pass<C, T>(P, S, M, 0, 0, true, mean, base, nhwc != 0);
    for (int m = 0; m < M.n;) {
        int end = m + 1;
        while (end < M.n && !is_contrast(P, M, end))
            ++end;
        mean = pass<C, T>(P, S, M, m, end, end < M.n, mean, base, nhwc != 0);
        m = end;
    }
}

template <typename T>
int launch(const sf_aug_plan *plan, const sf_aug_sample *d_samples, int n, T *io, int out_nhwc, cudaStream_t s)
{
    switch (plan->c) {
    case 1: post_kernel<1, T><<<n, NT, 0, s>>>(*plan, d_samples, io, out_nhwc); break;
    case 2: post_kernel<2, T><<<n, NT, 0, s>>>(*plan, d_samples, io, out_nhwc); break;
    case 3: post_kernel<3, T><<<n, NT, 0, s>>>(*plan, d_samples, io, out_nhwc); break;
    default: post_kernel<4, T><<<n, NT, 0, s>>>(*plan, d_samples, io, out_nhwc); break;
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

} // namespace

extern "C" int sf_cuda_aug_post(const sf_aug_plan *plan, const sf_aug_sample *d_samples, int n, void *io, int bf16,
                                int out_nhwc, cudaStream_t s)
{
    if (!plan || plan->n_post <= 0 || n <= 0)
        return 0;
    if (plan->n_post > SF_AUG_MAX_OPS || plan->c < 1 || plan->c > SF_AUG_MAX_C || !d_samples || !io ||
        n > 2147483647 / 2) {
        sf_cuda_set_error("%s:%d: sf_cuda_aug_post: invalid arguments (n_post %d, c %d, n %d)", __FILE__,
                          __LINE__, plan->n_post, plan->c, n);
        return -1;
    }
    for (int i = 0; i < plan->n_post; ++i)
        if (plan->post[i].kind == SF_PW_MASK || plan->post[i].kind > SF_PW_ERASE) {
            sf_cuda_set_error("%s:%d: sf_cuda_aug_post: stage %d of kind %d cannot run in the second pass",
                              __FILE__, __LINE__, i, (int)plan->post[i].kind);
            return -1;
        }
    return bf16 ? launch<uint16_t>(plan, d_samples, n, (uint16_t *)io, out_nhwc, s)
                : launch<float>(plan, d_samples, n, (float *)io, out_nhwc, s);
}
