/* gpu/ref/augment.c — the reference augmentation (semantics: gpu/aug.h).
 *
 * The CUDA backend reproduces this arithmetic; every float expression below is
 * written in the order it is evaluated, without fused multiply-adds (the build
 * is ISO C, where GCC does not contract a*b+c) except the explicit fmaf of the
 * coordinates, which both sides round once.
 *
 * Geometry, per output pixel (x, y) (gpu/aug.h map, rmap):
 *   fx = fmaf(map[0], x, fmaf(map[1], y, map[2])), fy likewise with map[3..5]:
 *   the source point with pixel centres at integers; sx = fx + 0.5, sy = fy + 0.5
 *   bilinear: u = clamp(fx, clip x range), v likewise, x0 = floor(u),
 *             x1 = min(x0 + 1, clip[2]), ax = u - x0, ...,
 *             out = (((v00*((1-ax)*(1-ay)) + v01*(ax*(1-ay))) + v10*((1-ax)*ay)) + v11*(ax*ay)) * cov
 *   nearest:  the tap (rint(v), rint(u)) clamped into the box (round half to
 *             even, as grid_sample), 0 where the rotation's coverage is 0.
 *   antialias: px = clamp(sx, box centres); taps i in [floor(px - a + 0.5),
 *             floor(px + a + 0.5)) within the box, weight tri((i + 0.5 - px) / a);
 *             out = (sum_j wy_j (sum_i wx_i v_ji)) / (sum wx * sum wy) * cov.
 *   cov (with a rotation): the coverage of the rotation's input image at
 *             (ru, rv), its pixel units with centres at integers:
 *             ru = fmaf(rmap[0], x, fmaf(rmap[1], y, rmap[2])), rv likewise
 *             (gpu/aug.h), else 1.
 * Blur: out[y][x] = sum_j w[j] * ( sum_i w[i] * in[refl(y+j-r)][refl(x+i-r)] ),
 *   r = (k-1)/2, i.e. a horizontal pass then a vertical pass with float
 *   intermediates; refl mirrors without repeating the edge (torch "reflect"),
 *   periodically when the kernel is wider than the image. in1 and out1 of
 *   sf_ref_aug_blur must not overlap (each output reads its neighbours).
 * Pointwise stages: see sf_ref_aug_pointwise.
 */
#include "gpu/ref/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/rng.h"

static float src_at(const uint8_t *src, int nhwc, int c, int h, int w, int ch, int y, int x)
{
    return nhwc ? (float)src[((size_t)y * w + x) * c + ch] : (float)src[((size_t)ch * h + y) * w + x];
}

/* The triangle filter of torch's antialiased bilinear resize. */
static float aa_tri(float d)
{
    d = fabsf(d);
    return d < 1.0f ? 1.0f - d : 0.0f;
}

/* Coverage of the rotation's input image along one axis at u (pixel units,
 * centres at integers): the bilinear weight of its pixels. */
static float cover1(float u, float n)
{
    float c = fminf(fminf(u + 1.0f, n - u), 1.0f);
    return fmaxf(c, 0.0f);
}

/* The antialiased sample at source point (sx, sy) into v[0..c): the point
 * clamped to the box's pixel centres, then the taps within the filter's
 * support, inside the box, normalised by the sum of their weights. */
static void aa_sample(const uint8_t *src1, int nhwc, int c, int h, int w, const sf_aug_sample *s,
                      float sx, float sy, float *v)
{
    const int xlo = s->clip[0], ylo = s->clip[1], xhi = s->clip[2], yhi = s->clip[3];
    const float ax_sup = s->aa[0], ay_sup = s->aa[1];
    const float ax_inv = 1.0f / ax_sup, ay_inv = 1.0f / ay_sup;
    const float px = fminf(fmaxf(sx, (float)xlo + 0.5f), (float)xhi + 0.5f);
    const float py = fminf(fmaxf(sy, (float)ylo + 0.5f), (float)yhi + 0.5f);
    int i0 = (int)floorf(px - ax_sup + 0.5f), i1 = (int)floorf(px + ax_sup + 0.5f);
    int j0 = (int)floorf(py - ay_sup + 0.5f), j1 = (int)floorf(py + ay_sup + 0.5f);
    i0 = i0 < xlo ? xlo : i0;
    j0 = j0 < ylo ? ylo : j0;
    i1 = i1 > xhi + 1 ? xhi + 1 : i1;
    j1 = j1 > yhi + 1 ? yhi + 1 : j1;
    float sumx = 0.0f, sumy = 0.0f;
    for (int i = i0; i < i1; i++)
        sumx += aa_tri(((float)i + 0.5f - px) * ax_inv);
    for (int j = j0; j < j1; j++)
        sumy += aa_tri(((float)j + 0.5f - py) * ay_inv);
    const float norm = sumx * sumy;
    for (int ch = 0; ch < c; ch++) {
        float acc = 0.0f;
        for (int j = j0; j < j1; j++) {
            float row = 0.0f;
            for (int i = i0; i < i1; i++)
                row += aa_tri(((float)i + 0.5f - px) * ax_inv) * src_at(src1, nhwc, c, h, w, ch, j, i);
            acc += aa_tri(((float)j + 0.5f - py) * ay_inv) * row;
        }
        v[ch] = acc / norm;
    }
}

void sf_ref_aug_geometry(const sf_aug_plan *plan, const sf_aug_sample *s, const uint8_t *src1,
                         int nhwc, float *dst1)
{
    const int c = plan->c, h = s->src_h, w = s->src_w;
    const int oh = plan->out_h, ow = plan->out_w;
    if (plan->ragged)
        nhwc = 1; /* ragged images are HWC by definition (gpu/aug.h) */
    const size_t plane = (size_t)oh * ow;

    if (!plan->has_geom) { /* out == in: uint8 -> float and NCHW */
        for (int ch = 0; ch < c; ch++)
            for (int y = 0; y < h; y++)
                for (int x = 0; x < w; x++)
                    dst1[ch * plane + (size_t)y * ow + x] = src_at(src1, nhwc, c, h, w, ch, y, x);
        return;
    }
    const int xlo = s->clip[0], ylo = s->clip[1], xhi = s->clip[2], yhi = s->clip[3];

    for (int y = 0; y < oh; y++) {
        for (int x = 0; x < ow; x++) {
            /* The source point, centres at integers (gpu/aug.h map), and at
             * i + 0.5 for the antialias filter. */
            const float fx = fmaf(s->map[0], (float)x, fmaf(s->map[1], (float)y, s->map[2]));
            const float fy = fmaf(s->map[3], (float)x, fmaf(s->map[4], (float)y, s->map[5]));
            const float sx = fx + 0.5f, sy = fy + 0.5f;
            const size_t o = (size_t)y * ow + x;
            /* The coverage of the rotation's input at this point (1 without one). */
            float cov = 1.0f;
            if (plan->has_rot && !plan->antialias) {
                const float ru = fmaf(s->rmap[0], (float)x, fmaf(s->rmap[1], (float)y, s->rmap[2]));
                const float rv = fmaf(s->rmap[3], (float)x, fmaf(s->rmap[4], (float)y, s->rmap[5]));
                if (plan->interp == SF_INTERP_NEAREST) {
                    const float rx = rintf(ru), ry = rintf(rv);
                    /* The comparisons are false for NaN too. */
                    cov = rx >= 0.0f && rx <= s->rot_w - 1.0f && ry >= 0.0f && ry <= s->rot_h - 1.0f;
                } else {
                    cov = cover1(ru, s->rot_w) * cover1(rv, s->rot_h);
                }
            }

            if (plan->interp == SF_INTERP_NEAREST) {
                /* The nearest pixel, clamped into the box (fmaxf also maps NaN). */
                const float rx = fminf(fmaxf(rintf(fx), (float)xlo), (float)xhi);
                const float ry = fminf(fmaxf(rintf(fy), (float)ylo), (float)yhi);
                for (int ch = 0; ch < c; ch++)
                    dst1[ch * plane + o] =
                        cov != 0.0f ? src_at(src1, nhwc, c, h, w, ch, (int)ry, (int)rx) : 0.0f;
                continue;
            }

            if (plan->antialias && !plan->has_rot) {
                float v[SF_AUG_MAX_C];
                aa_sample(src1, nhwc, c, h, w, s, sx, sy, v);
                for (int ch = 0; ch < c; ch++)
                    dst1[ch * plane + o] = v[ch];
                continue;
            }
            if (plan->antialias) {
                /* As torchvision: the rotation's bilinear taps on its input
                 * image, zero outside it, each pixel of which is the
                 * antialiased sample of the source at its centre. */
                const float ru = fmaf(s->rmap[0], (float)x, fmaf(s->rmap[1], (float)y, s->rmap[2]));
                const float rv = fmaf(s->rmap[3], (float)x, fmaf(s->rmap[4], (float)y, s->rmap[5]));
                float acc[SF_AUG_MAX_C] = {0};
                if (ru > -1.0f && ru < s->rot_w && rv > -1.0f && rv < s->rot_h) {
                    const float x0f = floorf(ru), y0f = floorf(rv);
                    const float ax = ru - x0f, ay = rv - y0f;
                    const float wx[2] = {1.0f - ax, ax}, wy[2] = {1.0f - ay, ay};
                    for (int t = 0; t < 4; t++) {
                        const float tx = x0f + (float)(t & 1), ty = y0f + (float)(t >> 1);
                        const float wt = wx[t & 1] * wy[t >> 1];
                        float v[SF_AUG_MAX_C] = {0};
                        if (tx >= 0.0f && tx < s->rot_w && ty >= 0.0f && ty < s->rot_h)
                            aa_sample(src1, nhwc, c, h, w, s, s->pre[0] * (tx + 0.5f) + s->pre[1],
                                      s->pre[2] * (ty + 0.5f) + s->pre[3], v);
                        for (int ch = 0; ch < c; ch++)
                            acc[ch] += v[ch] * wt;
                    }
                }
                for (int ch = 0; ch < c; ch++)
                    dst1[ch * plane + o] = acc[ch];
                continue;
            }

            /* Bilinear with the taps clamped into the box: clamping the
             * coordinate first is the same (both taps of a clamped side are the
             * edge pixel) and keeps every tap index valid. */
            const float u = fminf(fmaxf(fx, (float)xlo), (float)xhi);
            const float v = fminf(fmaxf(fy, (float)ylo), (float)yhi);
            const float x0f = floorf(u), y0f = floorf(v);
            const float ax = u - x0f, ay = v - y0f;
            const int x0 = (int)x0f, y0 = (int)y0f;
            const int x1 = x0 < xhi ? x0 + 1 : x0, y1 = y0 < yhi ? y0 + 1 : y0;
            const float w00 = (1.0f - ax) * (1.0f - ay);
            const float w01 = ax * (1.0f - ay);
            const float w10 = (1.0f - ax) * ay;
            const float w11 = ax * ay;
            for (int ch = 0; ch < c; ch++) {
                const float v00 = src_at(src1, nhwc, c, h, w, ch, y0, x0);
                const float v01 = src_at(src1, nhwc, c, h, w, ch, y0, x1);
                const float v10 = src_at(src1, nhwc, c, h, w, ch, y1, x0);
                const float v11 = src_at(src1, nhwc, c, h, w, ch, y1, x1);
                dst1[ch * plane + o] = (v00 * w00 + v01 * w01 + v10 * w10 + v11 * w11) * cov;
            }
        }
    }
}

/* torch "reflect" padding index: ... 2 1 | 0 1 2 ... n-1 | n-2 n-3 ... */
static int reflect(int i, int n)
{
    if (n == 1)
        return 0;
    const int period = 2 * (n - 1);
    i %= period;
    if (i < 0)
        i += period;
    return i < n ? i : period - i;
}

void sf_ref_aug_blur(const sf_aug_plan *plan, const sf_aug_sample *s, const float *in1, float *out1)
{
    const int c = plan->c, oh = plan->out_h, ow = plan->out_w, k = plan->blur_ksize;
    const size_t plane = (size_t)oh * ow;
    if (k <= 1) {
        /* No blur, or a 1-tap kernel whose normalised weight is 1. */
        if (out1 != in1)
            memcpy(out1, in1, sizeof(float) * plane * c);
        return;
    }
    const int r = (k - 1) / 2;
    for (int ch = 0; ch < c; ch++) {
        const float *ip = in1 + ch * plane;
        for (int y = 0; y < oh; y++) {
            for (int x = 0; x < ow; x++) {
                float acc = 0.0f;
                for (int j = 0; j < k; j++) {
                    const float *row = ip + (size_t)reflect(y + j - r, oh) * ow;
                    float hsum = 0.0f; /* the horizontal pass at (row, x) */
                    for (int i = 0; i < k; i++)
                        hsum += s->blur_w[i] * row[reflect(x + i - r, ow)];
                    acc += s->blur_w[j] * hsum;
                }
                out1[ch * plane + (size_t)y * ow + x] = acc;
            }
        }
    }
}

/* The mask bit of (y, x) after `dilate` 4-neighbour dilations: some seed
 * pixel lies within Manhattan distance `dilate` (inside the image). */
static int masked(uint64_t mask_seed, float ratio, int dilate, int h, int w, int y, int x)
{
    for (int dy = -dilate; dy <= dilate; dy++) {
        const int yy = y + dy;
        if (yy < 0 || yy >= h)
            continue;
        const int rx = dilate - abs(dy);
        for (int dx = -rx; dx <= rx; dx++) {
            const int xx = x + dx;
            if (xx < 0 || xx >= w)
                continue;
            if (sf_u01(sf_hash4(mask_seed, (uint64_t)yy, (uint64_t)xx, 0)) < ratio)
                return 1;
        }
    }
    return 0;
}

void sf_ref_aug_pointwise(const sf_aug_plan *plan, const sf_aug_sample *s, float *io1)
{
    const int c = plan->c, oh = plan->out_h, ow = plan->out_w;
    const size_t plane = (size_t)oh * ow;
    for (int st = 0; st < plan->n_pw; st++) {
        const sf_aug_pw *pw = &plan->pw[st];
        switch (pw->kind) {
        case SF_PW_SCALE:
            for (size_t i = 0; i < plane * c; i++)
                io1[i] = io1[i] * pw->a[0];
            break;
        case SF_PW_NORMALIZE:
            for (int ch = 0; ch < c; ch++)
                for (size_t i = 0; i < plane; i++)
                    io1[ch * plane + i] = (io1[ch * plane + i] - pw->a[ch]) * pw->b[ch];
            break;
        case SF_PW_YCBCR: {
            /* BT.601 full range (JPEG); a[0] is the chroma offset (128 on the
             * 0..255 scale). Needs c == 3 (checked by the plan). */
            const float off = pw->a[0];
            for (size_t i = 0; i < plane; i++) {
                const float r = io1[i], g = io1[plane + i], b = io1[2 * plane + i];
                io1[i] = 0.299f * r + 0.587f * g + 0.114f * b;
                io1[plane + i] = off - 0.168736f * r - 0.331264f * g + 0.5f * b;
                io1[2 * plane + i] = off + 0.5f * r - 0.418688f * g - 0.081312f * b;
            }
            break;
        }
        case SF_PW_MASK: {
            const float ratio = pw->a[0];
            const int dilate = (int)pw->b[0];
            for (int y = 0; y < oh; y++)
                for (int x = 0; x < ow; x++)
                    if (masked(s->mask_seed, ratio, dilate, oh, ow, y, x))
                        for (int ch = 0; ch < c; ch++)
                            io1[ch * plane + (size_t)y * ow + x] = 0.0f;
            break;
        }
        case SF_PW_JITTER:
        case SF_PW_ERASE:
            break; /* second-pass stages (sf_ref_aug_post); the plan never lists them here */
        }
    }
}

/* ---- the second pass: color_jitter, random_erasing and what follows ------ */

static float clampf(float v, float hi)
{
    return fminf(fmaxf(v, 0.0f), hi);
}

/* torchvision's rgb_to_grayscale weights, in its order of evaluation. */
static float gray3(float r, float g, float b)
{
    return r * 0.2989f + g * 0.587f + b * 0.114f;
}

/* The grayscale mean of the image (its one channel when c == 1): the gray
 * values are summed in double, as float32 sums differ with the order. */
static float gray_mean(const float *io1, int c, size_t plane)
{
    double sum = 0.0;
    for (size_t i = 0; i < plane; i++)
        sum += c == 3 ? gray3(io1[i], io1[plane + i], io1[2 * plane + i]) : io1[i];
    return (float)(sum / (double)plane);
}

/* One pixel's hue shift at clamp bound `bound`. */
static void hue_shift(float *r, float *g, float *b, float shift, float bound)
{
    /* torchvision's _rgb_to_hsv, the shift, and _hsv_to_rgb, with its clamps
     * to [0, 1] at [0, bound] (the conversion is homogeneous in the values). */
    const float R = *r, G = *g, B = *b;
    const float maxc = fmaxf(fmaxf(R, G), B), minc = fminf(fminf(R, G), B);
    const int eqc = maxc == minc;
    const float cr = maxc - minc;
    const float sat = cr / (eqc ? 1.0f : maxc);
    const float crd = eqc ? 1.0f : cr;
    const float rc = (maxc - R) / crd, gc = (maxc - G) / crd, bc = (maxc - B) / crd;
    float h;
    if (maxc == R)
        h = bc - gc;
    else if (maxc == G)
        h = (rc + 2.0f) - bc;
    else
        h = (gc + 4.0f) - rc;
    h = fmodf(h * (1.0f / 6.0f) + 1.0f, 1.0f);
    h = h + shift;
    h = h - floorf(h); /* torch.remainder(h, 1) */
    const float h6 = h * 6.0f, fi = floorf(h6), f = h6 - fi;
    int i = (int)fi % 6;
    if (i < 0)
        i += 6;
    const float sxf = sat * f, oms = 1.0f - sat;
    const float v = maxc;
    const float q = clampf((1.0f - sxf) * v, bound);
    const float t = clampf((sxf + oms) * v, bound);
    const float pp = clampf(oms * v, bound);
    const float vr[6] = {v, q, pp, pp, t, v}, vg[6] = {t, v, v, q, pp, pp}, vb[6] = {pp, pp, t, v, v, q};
    *r = vr[i];
    *g = vg[i];
    *b = vb[i];
}

/* One colour adjustment f (0 brightness, 1 contrast, 2 saturation, 3 hue)
 * of factor x over the image, each followed by the clamp to [0, bound]. */
static void jitter_one(float *io1, int c, size_t plane, int f, float x, float bound)
{
    switch (f) {
    case 0:
        for (size_t i = 0; i < plane * c; i++)
            io1[i] = clampf(io1[i] * x, bound);
        break;
    case 1: {
        const float mean = gray_mean(io1, c, plane);
        const float mw = mean * (1.0f - x);
        for (size_t i = 0; i < plane * c; i++)
            io1[i] = clampf(io1[i] * x + mw, bound);
        break;
    }
    case 2:
        if (c != 3)
            break; /* as torchvision (and PIL): no saturation in one channel */
        for (size_t i = 0; i < plane; i++) {
            const float gw = gray3(io1[i], io1[plane + i], io1[2 * plane + i]) * (1.0f - x);
            for (int ch = 0; ch < 3; ch++)
                io1[ch * plane + i] = clampf(io1[ch * plane + i] * x + gw, bound);
        }
        break;
    default:
        if (c != 3)
            break;
        for (size_t i = 0; i < plane; i++)
            hue_shift(&io1[i], &io1[plane + i], &io1[2 * plane + i], x, bound);
        break;
    }
}

float sf_ref_aug_erase_noise(uint64_t erase_seed, int y, int x, int ch)
{
    /* Box-Muller in double from two 24-bit uniforms, so host and device
     * agree to the float rounding of the result. */
    const uint64_t h = sf_hash4(erase_seed, (uint64_t)y, (uint64_t)x, (uint64_t)ch);
    const double u1 = 1.0 - (double)sf_u01(h);            /* (0, 1] */
    const double u2 = (double)((h >> 16) & 0xFFFFFFull) * (1.0 / 16777216.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void sf_ref_aug_post(const sf_aug_plan *plan, const sf_aug_sample *s, float *io1)
{
    const int c = plan->c, oh = plan->out_h, ow = plan->out_w;
    const size_t plane = (size_t)oh * ow;
    for (int st = 0; st < plan->n_post; st++) {
        const sf_aug_pw *pw = &plan->post[st];
        switch (pw->kind) {
        case SF_PW_JITTER:
            for (int k = 0; k < 4; k++) {
                const int f = s->jitter_order[k] & 3;
                if (pw->a[f] != 0.0f)
                    jitter_one(io1, c, plane, f, s->jitter[f], pw->b[0]);
            }
            break;
        case SF_PW_ERASE: {
            const int x0 = s->erase[0], y0 = s->erase[1], ew = s->erase[2], eh = s->erase[3];
            for (int ch = 0; ch < c; ch++)
                for (int y = y0; y < y0 + eh; y++)
                    for (int x = x0; x < x0 + ew; x++)
                        io1[ch * plane + (size_t)y * ow + x] =
                            pw->b[0] != 0.0f ? sf_ref_aug_erase_noise(s->erase_seed, y, x, ch) : pw->a[ch];
            break;
        }
        default: {
            /* The affine stages, as in the first pass. */
            sf_aug_plan one = *plan;
            one.n_pw = 1;
            one.pw[0] = *pw;
            sf_ref_aug_pointwise(&one, s, io1);
            break;
        }
        }
    }
}

void sf_ref_aug_mix(const sf_aug_plan *plan, const sf_aug_mix *mix, int n, float *io)
{
    if (mix->kind == SF_MIX_NONE || n < 2)
        return;
    const int c = plan->c, ow = plan->out_w;
    const size_t plane = (size_t)plan->out_h * ow, sz = plane * c;
    const float lam = mix->lam, oml = 1.0f - mix->lam;
    /* Sample i takes from sample i - 1 (mod n): per element position, walk
     * down from the last sample, keeping its original for sample 0 (no
     * second buffer, as the CUDA kernel). */
    for (size_t e = 0; e < sz; e++) {
        if (mix->kind == SF_MIX_CUTMIX) {
            const size_t pix = e % plane;
            const int y = (int)(pix / ow), x = (int)(pix % ow);
            if (x < mix->box[0] || x >= mix->box[2] || y < mix->box[1] || y >= mix->box[3])
                continue;
        }
        const float last = io[sz * (size_t)(n - 1) + e];
        for (int i = n - 1; i >= 0; i--) {
            float *d = io + sz * (size_t)i + e;
            const float prev = i > 0 ? d[-(ptrdiff_t)sz] : last;
            /* v2.MixUp: input.roll(1, 0).mul_(1 - lam).add_(input.mul(lam)) */
            *d = mix->kind == SF_MIX_MIXUP ? prev * oml + *d * lam : prev;
        }
    }
}

void sf_ref_augment(const sf_aug_plan *plan, const sf_aug_sample *s, int n, const uint8_t *src,
                    int nhwc, float *dst)
{
    const size_t out_sz = (size_t)plan->c * plan->out_h * plan->out_w;
    float *tmp = NULL;
    if (plan->blur_ksize > 1) {
        /* The blur reads neighbours, so it needs the geometric output apart.
         * (The reference backend passes preallocated scratch to the stages
         * itself; this entry point is for tests and one-off calls.) */
        tmp = malloc(sizeof(float) * out_sz);
        if (!tmp) {
            for (size_t i = 0; i < out_sz * (size_t)n; i++)
                dst[i] = NAN; /* visible, never silently wrong */
            return;
        }
    }
    for (int i = 0; i < n; i++) {
        float *d = dst + out_sz * i;
        if (tmp) {
            sf_ref_aug_geometry(plan, &s[i], src + s[i].src_off, nhwc, tmp);
            sf_ref_aug_blur(plan, &s[i], tmp, d);
        } else {
            sf_ref_aug_geometry(plan, &s[i], src + s[i].src_off, nhwc, d);
        }
        sf_ref_aug_pointwise(plan, &s[i], d);
        sf_ref_aug_post(plan, &s[i], d);
    }
    free(tmp);
}
