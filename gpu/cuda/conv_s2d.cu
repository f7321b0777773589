/* gpu/cuda/conv_s2d.cu — the space-to-depth rearrangements of a strided
 * convolution's input, weight and filter gradient (why and semantics:
 * conv_s2d.h). They only move elements, so they work on the elements' bits
 * (2 or 4 bytes) and are exact for either element type. The input one is a
 * thread per rearranged pixel, specialised on (s, c) so that every element's
 * channel is a constant (a generic version, dividing per element, ran at a
 * third of the memory bandwidth), or for patches (k == s) a thread per
 * vector of a contiguous run; the weight ones are a few thousand elements
 * (ViT-B/16's 590 k). */
#include "gpu/cuda/conv_s2d.h"

#include "gpu/cuda/check.h"
#include "gpu/cuda/kernel_common.cuh"

namespace {

struct s2d_geom {
    int n, c, h, w, s, p, k, k2, c2, h2, w2, oc;
};

s2d_geom geom(const sf_conv_desc *d)
{
    s2d_geom g;
    g.n = d->n, g.c = d->c, g.h = d->h, g.w = d->w, g.s = d->stride, g.p = d->pad, g.k = d->k, g.oc = d->oc;
    g.k2 = (d->k + d->stride - 1) / d->stride;
    const int v = 16 / (int)sf_dtype_size(d->dt); /* elements of 16 bytes */
    g.c2 = (d->c * d->stride * d->stride + v - 1) / v * v;
    const int oh = (d->h + 2 * d->pad - d->k) / d->stride + 1, ow = (d->w + 2 * d->pad - d->k) / d->stride + 1;
    g.h2 = oh + g.k2 - 1;
    g.w2 = ow + g.k2 - 1;
    return g;
}

/* One thread per pixel of xs: its s*s source pixels' C-element runs into
 * registers (S and C known at compile time, so the channel of each element is
 * too), then c2 elements out as 16-byte vectors. */
template <typename U, int S, int C>
__global__ void k_s2d_input(const U *__restrict__ x, U *__restrict__ xs, s2d_geom g, size_t pixels)
{
    constexpr int V = 16 / sizeof(U);
    constexpr int USED = C * S * S, C2 = (USED + V - 1) / V * V;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < pixels; e += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(e % (unsigned)g.w2);
        const size_t r = e / (unsigned)g.w2;
        const int j = (int)(r % (unsigned)g.h2);
        const size_t b = r / (unsigned)g.h2;
        union {
            uint4 v[C2 / V];
            U u[C2];
        } out;
#pragma unroll
        for (int t = USED; t < C2; t++)
            out.u[t] = 0;
#pragma unroll
        for (int dy = 0; dy < S; dy++) {
            const int row = S * j - g.p + dy;
#pragma unroll
            for (int dx = 0; dx < S; dx++) {
                const int col = S * i - g.p + dx;
                const bool in = row >= 0 && row < g.h && col >= 0 && col < g.w;
                const U *src = x + ((b * g.h + (in ? row : 0)) * g.w + (in ? col : 0)) * C;
#pragma unroll
                for (int ci = 0; ci < C; ci++)
                    out.u[(dy * S + dx) * C + ci] = in ? src[ci] : (U)0;
            }
        }
        uint4 *dst = reinterpret_cast<uint4 *>(xs + e * C2);
#pragma unroll
        for (int q = 0; q < C2 / V; q++)
            dst[q] = out.v[q];
    }
}

template <typename U, int S, int C> void s2d_input_launch(const void *x, void *xs, const s2d_geom &g, size_t pixels,
                                                          cudaStream_t s)
{
    k_s2d_input<U, S, C><<<cu_ew_blocks(pixels), CU_TPB, 0, s>>>((const U *)x, (U *)xs, g, pixels);
}

template <typename U, int S> void s2d_input_c(const void *x, void *xs, const s2d_geom &g, size_t pixels, cudaStream_t s)
{
    switch (g.c) {
    case 1: s2d_input_launch<U, S, 1>(x, xs, g, pixels, s); break;
    case 2: s2d_input_launch<U, S, 2>(x, xs, g, pixels, s); break;
    case 3: s2d_input_launch<U, S, 3>(x, xs, g, pixels, s); break;
    default: s2d_input_launch<U, S, 4>(x, xs, g, pixels, s); break;
    }
}

/* A kernel that tiles its input (k == s): each pixel of xs is its s source
 * rows of s*c elements one after the other, each row one contiguous run in x
 * and in xs,
 *   xs[pix(b, j, i) * c2 + dy*s*c + t] = x[((b*h + s*j - p + dy)*w + s*i - p)*c + t],
 * 0 <= t < s*c (zero where the source pixel is outside x; the channels past
 * c*s*s are zeroed apart, by s2d_input). Too many elements a pixel
 * (768 for ViT's 16x16 patches of 3 channels) for k_s2d_input's registers, so
 * a thread per VT-sized chunk of a run: VT a whole number of elements that
 * divides the run, the row stride and the alignments (16 bytes for ViT's
 * bf16 runs of 96 bytes), or one element where padding needs per-element
 * bounds. */
template <typename U, typename VT, typename I>
__global__ void k_s2d_runs(const U *__restrict__ x, U *__restrict__ xs, s2d_geom g, I chunks, int per_run)
{
    constexpr int E = (int)(sizeof(VT) / sizeof(U));
    const int run = g.s * g.c;
    for (I e = (I)blockIdx.x * blockDim.x + threadIdx.x; e < chunks; e += (I)gridDim.x * blockDim.x) {
        const int q = (int)(e % (I)per_run);
        I r = e / (I)per_run;
        const int dy = (int)(r % (I)g.s);
        r /= (I)g.s;
        const int i = (int)(r % (I)g.w2);
        r /= (I)g.w2;
        const int j = (int)(r % (I)g.h2);
        const size_t b = (size_t)(r / (I)g.h2);
        const int row = g.s * j - g.p + dy, col0 = g.s * i - g.p;
        U *dst = xs + ((b * g.h2 + j) * g.w2 + i) * g.c2 + (size_t)dy * run + (size_t)q * E;
        if constexpr (E > 1) { /* no padding: the whole run is inside x */
            *reinterpret_cast<VT *>(dst) =
                *reinterpret_cast<const VT *>(x + ((b * g.h + row) * g.w + col0) * g.c + (size_t)q * E);
        } else {
            const int col = col0 + q / g.c, ci = q % g.c;
            const bool in = row >= 0 && row < g.h && col >= 0 && col < g.w;
            *dst = in ? x[((b * g.h + row) * g.w + col) * g.c + ci] : (U)0;
        }
    }
}

template <typename U, typename VT>
void s2d_runs_launch(const void *x, void *xs, const s2d_geom &g, size_t pixels, cudaStream_t s)
{
    const int per_run = (int)((size_t)g.s * g.c * sizeof(U) / sizeof(VT));
    const size_t chunks = pixels * (size_t)g.s * (size_t)per_run;
    /* 32-bit index arithmetic where it holds the count: a 64-bit division
     * costs several times a 32-bit one, and this kernel does four a chunk */
    if (chunks < ((size_t)1 << 32) - (size_t)cu_ew_blocks(chunks) * CU_TPB)
        k_s2d_runs<U, VT, uint32_t>
            <<<cu_ew_blocks(chunks), CU_TPB, 0, s>>>((const U *)x, (U *)xs, g, (uint32_t)chunks, per_run);
    else
        k_s2d_runs<U, VT, size_t><<<cu_ew_blocks(chunks), CU_TPB, 0, s>>>((const U *)x, (U *)xs, g, chunks, per_run);
}

/* The widest chunk (16, 8 or 4 bytes) that divides a run, the row stride and
 * x's alignment; single elements with padding. */
template <typename U> void s2d_runs(const void *x, void *xs, const s2d_geom &g, size_t pixels, cudaStream_t s)
{
    const size_t run = (size_t)g.s * g.c * sizeof(U), stride = (size_t)g.w * g.c * sizeof(U);
    const uintptr_t a = (uintptr_t)x;
    const auto fits = [&](size_t v) { return g.p == 0 && run % v == 0 && stride % v == 0 && a % v == 0; };
    if (fits(16))
        s2d_runs_launch<U, uint4>(x, xs, g, pixels, s);
    else if (fits(8))
        s2d_runs_launch<U, uint2>(x, xs, g, pixels, s);
    else if (sizeof(U) < 4 && fits(4))
        s2d_runs_launch<U, uint32_t>(x, xs, g, pixels, s);
    else
        s2d_runs_launch<U, U>(x, xs, g, pixels, s);
}

template <typename U> int s2d_input(const void *x, void *xs, const s2d_geom &g, size_t pixels, cudaStream_t s)
{
    if (g.k == g.s) {
        s2d_runs<U>(x, xs, g, pixels, s);
        /* the channels past the runs (c2 > c*s*s), zero as k_s2d_input writes them */
        const size_t used = (size_t)g.c * g.s * g.s;
        if ((size_t)g.c2 > used)
            SF_CUDA_CHECK(cudaMemset2DAsync((U *)xs + used, (size_t)g.c2 * sizeof(U), 0,
                                            ((size_t)g.c2 - used) * sizeof(U), pixels, s));
        return 0;
    }
    /* sf_conv_s2d_ok: c * s * s <= 16 */
    if (g.s == 2)
        s2d_input_c<U, 2>(x, xs, g, pixels, s);
    else if (g.s == 3)
        s2d_input_launch<U, 3, 1>(x, xs, g, pixels, s);
    else
        s2d_input_launch<U, 4, 1>(x, xs, g, pixels, s);
    return 0;
}

/* One thread per element of ws. */
template <typename U> __global__ void k_s2d_weight(const U *__restrict__ w, U *__restrict__ ws, s2d_geom g, int len)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= len)
        return;
    const int ch = e % g.c2, bx = (e / g.c2) % g.k2, by = (e / (g.c2 * g.k2)) % g.k2, o = e / (g.c2 * g.k2 * g.k2);
    U val = 0;
    if (ch < g.c * g.s * g.s) {
        const int sub = ch / g.c, ci = ch - sub * g.c;
        const int r = by * g.s + sub / g.s, q = bx * g.s + sub % g.s;
        if (r < g.k && q < g.k)
            val = w[((o * g.k + r) * g.k + q) * g.c + ci];
    }
    ws[e] = val;
}

/* One thread per element of dw. */
template <typename U> __global__ void k_s2d_wgrad(const U *__restrict__ dws, U *__restrict__ dw, s2d_geom g, int len)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= len)
        return;
    const int ci = e % g.c, q = (e / g.c) % g.k, r = (e / (g.c * g.k)) % g.k, o = e / (g.c * g.k * g.k);
    const int sub = (r % g.s) * g.s + q % g.s;
    dw[e] = dws[((o * g.k2 + r / g.s) * g.k2 + q / g.s) * g.c2 + sub * g.c + ci];
}

int bad(const char *fn, const sf_conv_desc *d)
{
    if (!sf_conv_s2d_ok(d->layout, d->c, d->k, d->stride) || (d->dt != SF_DT_F32 && d->dt != SF_DT_BF16) ||
        d->n < 0 || d->h < 1 || d->w < 1 || d->oc < 1 || d->pad < 0 || d->h + 2 * d->pad < d->k ||
        d->w + 2 * d->pad < d->k) {
        sf_cuda_set_error("%s:%d: %s: no space-to-depth form for c%d %dx%d k%d s%d p%d (layout %d, dtype %d)",
                          __FILE__, __LINE__, fn, d->c, d->h, d->w, d->k, d->stride, d->pad, (int)d->layout,
                          (int)d->dt);
        return 1;
    }
    return 0;
}

} /* namespace */

extern "C" int sf_conv_s2d_ok(sf_layout lay, int c, int k, int stride)
{
    if (lay != SF_LAYOUT_NHWC || c < 1)
        return 0;
    if (k == stride) /* patches: the rearranged convolution is pointwise */
        return stride >= 2 && stride <= SF_S2D_PATCH_MAX && c <= 4;
    return stride >= 2 && stride <= 4 && k > stride && c * stride * stride <= 16;
}

extern "C" void sf_conv_s2d_desc(const sf_conv_desc *d, sf_conv_desc *out)
{
    const s2d_geom g = geom(d);
    *out = *d;
    out->c = g.c2;
    out->h = g.h2;
    out->w = g.w2;
    out->k = g.k2;
    out->stride = 1;
    out->pad = 0;
    /* square along the width too (0: as along the height): the caller's
     * desc may spell its width's window out, which no longer applies */
    out->kw = out->stride_w = out->pad_w = out->dilation_w = 0;
}

extern "C" size_t sf_conv_s2d_x_elems(const sf_conv_desc *d)
{
    const s2d_geom g = geom(d);
    return (size_t)(d->n < 0 ? 0 : d->n) * g.h2 * g.w2 * g.c2;
}

extern "C" size_t sf_conv_s2d_w_elems(const sf_conv_desc *d)
{
    const s2d_geom g = geom(d);
    return (size_t)g.oc * g.k2 * g.k2 * g.c2;
}

extern "C" int sf_conv_s2d_input(const sf_conv_desc *d, const void *x, void *xs, cudaStream_t s)
{
    if (bad("sf_conv_s2d_input", d))
        return -1;
    if (!cu_al16(xs)) {
        sf_cuda_set_error("%s:%d: sf_conv_s2d_input: xs must be 16-byte aligned", __FILE__, __LINE__);
        return -1;
    }
    const s2d_geom g = geom(d);
    const size_t pixels = (size_t)g.n * g.h2 * g.w2;
    if (pixels == 0)
        return 0;
    if (d->dt == SF_DT_BF16 ? s2d_input<uint16_t>(x, xs, g, pixels, s) : s2d_input<uint32_t>(x, xs, g, pixels, s))
        return -1;
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_conv_s2d_weight(const sf_conv_desc *d, const void *w, void *ws, cudaStream_t s)
{
    if (bad("sf_conv_s2d_weight", d))
        return -1;
    const s2d_geom g = geom(d);
    const int len = (int)sf_conv_s2d_w_elems(d);
    if (d->dt == SF_DT_BF16)
        k_s2d_weight<uint16_t><<<cu_blocks(len, CU_TPB), CU_TPB, 0, s>>>((const uint16_t *)w, (uint16_t *)ws, g, len);
    else
        k_s2d_weight<uint32_t><<<cu_blocks(len, CU_TPB), CU_TPB, 0, s>>>((const uint32_t *)w, (uint32_t *)ws, g, len);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_conv_s2d_wgrad(const sf_conv_desc *d, const void *dws, void *dw, cudaStream_t s)
{
    if (bad("sf_conv_s2d_wgrad", d))
        return -1;
    const s2d_geom g = geom(d);
    const int len = d->oc * d->k * d->k * d->c;
    if (d->dt == SF_DT_BF16)
        k_s2d_wgrad<uint16_t><<<cu_blocks(len, CU_TPB), CU_TPB, 0, s>>>((const uint16_t *)dws, (uint16_t *)dw, g, len);
    else
        k_s2d_wgrad<uint32_t><<<cu_blocks(len, CU_TPB), CU_TPB, 0, s>>>((const uint32_t *)dws, (uint32_t *)dw, g, len);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}
