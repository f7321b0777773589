/* gpu/upsample_rule.h — where an upsampled (or resized) map's output pixels read
 * their input, by PyTorch's rules (F.interpolate, modes "nearest" and
 * "bilinear"), identical on host and device: the reference
 * (gpu/ref/upsample.c) and the CUDA kernels (gpu/cuda/upsample.cu) both take
 * their indices and weights from here, so the two backends cannot disagree on
 * which input pixel a boundary output reads.
 *
 * The arithmetic is float, as PyTorch's (its "opmath" type for float, half
 * and bfloat16 alike), including the scale: in/out, or (in-1)/(out-1) with
 * align_corners. For an integer scale_factor s, PyTorch's 1/s (a double
 * rounded to float) equals float(in)/float(in*s): both are 1/s rounded once
 * (checked for s up to 64 and in up to 4096), so one rule serves a layer
 * given a scale and one given a size.
 *
 * Separable: each axis maps output index o to input indices i0 <= i1 (equal at
 * the last input, and always for nearest) with weights w0 + w1 = 1; a 2-D
 * output pixel is the product of its two axes' blends.
 */
#ifndef SF_GPU_UPSAMPLE_RULE_H
#define SF_GPU_UPSAMPLE_RULE_H

#include <math.h>

#include "gpu/host_device.h"

/* The upsample layer's modes (its "mode" field, in this order). */
enum { SF_UP_NEAREST = 0, SF_UP_BILINEAR = 1 };

/* One axis: input and output lengths and PyTorch's scale between them. */
typedef struct sf_up_axis {
    int in, out;
    float scale;
} sf_up_axis;

/* Both axes and the rule (a kernel argument, passed by value). */
typedef struct sf_up_rule {
    int bilinear;      /* SF_UP_BILINEAR, else nearest */
    int align_corners; /* bilinear only: the corner pixels' centres align */
    sf_up_axis h, w;
} sf_up_rule;

/* PyTorch's area_pixel_compute_scale / compute_scales_value for one axis. */
SF_HD sf_up_axis sf_up_axis_of(int bilinear, int align_corners, int in, int out)
{
    sf_up_axis a;
    a.in = in;
    a.out = out;
    if (bilinear && align_corners)
        a.scale = out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.f;
    else
        a.scale = (float)in / (float)out;
    return a;
}

SF_HD sf_up_rule sf_up_rule_of(int bilinear, int align_corners, int in_h, int in_w, int out_h, int out_w)
{
    sf_up_rule p;
    p.bilinear = bilinear;
    p.align_corners = align_corners;
    p.h = sf_up_axis_of(bilinear, align_corners, in_h, out_h);
    p.w = sf_up_axis_of(bilinear, align_corners, in_w, out_w);
    return p;
}

/* Output index o of axis a: the input indices it reads and their weights.
 * Nearest: floor(o * scale), clamped (nearest_neighbor_compute_source_index).
 * Bilinear: the source coordinate (o * scale, or (o + 0.5) * scale - 0.5
 * floored at 0), its integer part clamped to the last input and the fraction
 * to [0, 1] (area_pixel_compute_source_index, guard_index_and_lambda). */
SF_HD void sf_up_src(const sf_up_rule *p, const sf_up_axis *a, int o, int *i0, int *i1, float *w0, float *w1)
{
    if (!p->bilinear) {
        const int i = (int)floorf((float)o * a->scale);
        *i0 = *i1 = i < a->in - 1 ? i : a->in - 1;
        *w0 = 1.f;
        *w1 = 0.f;
        return;
    }
    float r = p->align_corners ? a->scale * (float)o : a->scale * ((float)o + 0.5f) - 0.5f;
    if (r < 0.f)
        r = 0.f;
    int i = (int)floorf(r);
    if (i > a->in - 1)
        i = a->in - 1;
    float l = r - (float)i;
    l = l < 0.f ? 0.f : (l > 1.f ? 1.f : l);
    *i0 = i;
    *i1 = i < a->in - 1 ? i + 1 : i;
    *w1 = l;
    *w0 = 1.f - l;
}

/* The weight input index i carries in output index o (0 when o does not read it). */
SF_HD float sf_up_weight(const sf_up_rule *p, const sf_up_axis *a, int o, int i)
{
    int i0, i1;
    float w0, w1;
    sf_up_src(p, a, o, &i0, &i1, &w0, &w1);
    return (i0 == i ? w0 : 0.f) + (i1 == i ? w1 : 0.f);
}

/* The first output index whose i0 is at least t (a->out when none): i0 never
 * decreases along an axis, so the outputs that read input i are those from
 * first(i - 1) (bilinear: i may be an i1; nearest: first(i)) to first(i + 1) - 1.
 * A backward pass gathers over that range instead of scattering with atomics. */
SF_HD int sf_up_first(const sf_up_rule *p, const sf_up_axis *a, int t)
{
    int lo = 0, hi = a->out;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        int i0, i1;
        float w0, w1;
        sf_up_src(p, a, mid, &i0, &i1, &w0, &w1);
        if (i0 >= t)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* [lo, hi): the output indices of axis a that read input index i. */
SF_HD void sf_up_readers(const sf_up_rule *p, const sf_up_axis *a, int i, int *lo, int *hi)
{
    *lo = sf_up_first(p, a, p->bilinear ? i - 1 : i);
    *hi = sf_up_first(p, a, i + 1);
}

#endif /* SF_GPU_UPSAMPLE_RULE_H */
