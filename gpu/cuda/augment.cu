/* gpu/cuda/augment.cu — the fused augmentation's launchers (gpu/cuda/augment.h).
 *
 * Checks a call's plan and pointers, lays out the kernel's dynamic shared memory
 * (the blur's weights and slots, the staged footprint, the mask's bits) and
 * calls the channel count's dispatch_c, which picks the kernel variant and
 * launches it. The kernels and what they cost are in
 * gpu/cuda/augment_kernels.cuh, compiled in gpu/cuda/augment_c1.cu .. augment_c4.cu.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "gpu/cuda/augment.h"
#include "gpu/cuda/augment_kernels.cuh"
#include "gpu/cuda/aug_post.h"
#include "gpu/cuda/check.h"

namespace {

using namespace sf_aug_cuda;

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
    /* The blur's weights (32 floats) and its region's column coordinates (64:
     * TW + 2 * R <= 62, geom_tile's xt). */
    size_t off = (blur ? 96 : 32) * sizeof(float);
    if (aa_separable(*plan)) {
        L.off_g = (unsigned)align16(AA_TABLE_BYTES);
        off = align16(L.off_g + sizeof(float) * (size_t)C * AA_ROWS * TW);
    } else if (blur) {
        const int GH = TH + 2 * L.R, GWP = g_stride(L.R);
        const int sw = ((GWP > HS ? GWP : HS) + 3) & ~3;
        L.slot = GH * sw;
        if (plan->has_geom && plan->interp == SF_INTERP_BILINEAR && !plan->antialias) {
            /* The staged footprint (geom_tile) takes slot 0, idle until the
             * horizontal pass, and as much more as it needs just before it:
             * 10 KB for W1, which keeps 4 blocks per SM. */
            const int more = (STG * C - L.slot + 3) & ~3;
            L.off_st = (unsigned)off;
            off += sizeof(float) * (size_t)(more > 0 ? more : 0);
        }
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
