/* gpu/ref/avgpool.c — reference AvgPool2d (kernel, stride, padding,
 * ceil_mode, count_include_pad) and AdaptiveAvgPool2d to an output size,
 * forward and backward, in float and double (_f64), and their layers' hooks.
 * Contracts in gpu/ref/layers.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "avgpool.c"
#include "gpu/ref/generic.h"

/* ---- the average pooling layers' hooks (gpu/layers.c) --------------------- */

void sf_ref_layer_avgpool2d_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_avgpool2d_fwd(io->x[0], io->n, L->in_c, L->in_h, L->in_w, L->k, L->stride, L->pad, L->count_include_pad,
                         L->out_h, L->out_w, io->y);
}

void sf_ref_layer_avgpool2d_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_avgpool2d_bwd(io->dy, io->n, L->in_c, L->in_h, L->in_w, L->k, L->stride, L->pad, L->count_include_pad,
                         L->out_h, L->out_w, io->scratch);
    io->give(io, 0, io->scratch);
}

void sf_ref_layer_adaptive_avgpool2d_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_adaptive_avgpool2d_fwd(io->x[0], io->n, L->in_c, L->in_h, L->in_w, L->out_h, L->out_w, io->y);
}

void sf_ref_layer_adaptive_avgpool2d_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_adaptive_avgpool2d_bwd(io->dy, io->n, L->in_c, L->in_h, L->in_w, L->out_h, L->out_w, io->scratch);
    io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* PyTorch's window of output o (avg_pool2d): [o*s - p, min(o*s - p + k, in + p)),
 * whose length is the divisor with count_include_pad; clipped to [0, in)
 * for the taps and the divisor without it. */
static void SF_FN(avg_window)(int o, int k, int s, int p, int in, int *a, int *b, int *span)
{
    int lo = o * s - p, hi = lo + k;
    if (hi > in + p)
        hi = in + p;
    *span = hi - lo;
    *a = lo < 0 ? 0 : lo;
    *b = hi > in ? in : hi;
}

void SF_FN(sf_ref_avgpool2d_fwd)(const T *x, int n, int c, int h, int w, int k, int stride, int pad,
                                 int count_include_pad, int oh, int ow, T *y)
{
    for (size_t plane = 0; plane < (size_t)n * c; plane++) {
        const T *xp = x + plane * h * w;
        T *yp = y + plane * oh * ow;
        for (int oy = 0; oy < oh; oy++) {
            int y0, y1, sy;
            SF_FN(avg_window)(oy, k, stride, pad, h, &y0, &y1, &sy);
            for (int ox = 0; ox < ow; ox++) {
                int x0, x1, sx;
                SF_FN(avg_window)(ox, k, stride, pad, w, &x0, &x1, &sx);
                T acc = 0;
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++)
                        acc += xp[(size_t)iy * w + ix];
                const int div = count_include_pad ? sy * sx : (y1 - y0) * (x1 - x0);
                yp[(size_t)oy * ow + ox] = div > 0 ? acc / (T)div : (T)0;
            }
        }
    }
}

/* dx = each output's dy / divisor spread over its window's taps (zeroed first). */
void SF_FN(sf_ref_avgpool2d_bwd)(const T *dy, int n, int c, int h, int w, int k, int stride, int pad,
                                 int count_include_pad, int oh, int ow, T *dx)
{
    for (size_t i = 0; i < (size_t)n * c * h * w; i++)
        dx[i] = 0;
    for (size_t plane = 0; plane < (size_t)n * c; plane++) {
        T *dxp = dx + plane * h * w;
        const T *dyp = dy + plane * oh * ow;
        for (int oy = 0; oy < oh; oy++) {
            int y0, y1, sy;
            SF_FN(avg_window)(oy, k, stride, pad, h, &y0, &y1, &sy);
            for (int ox = 0; ox < ow; ox++) {
                int x0, x1, sx;
                SF_FN(avg_window)(ox, k, stride, pad, w, &x0, &x1, &sx);
                const int div = count_include_pad ? sy * sx : (y1 - y0) * (x1 - x0);
                if (div <= 0)
                    continue;
                const T g = dyp[(size_t)oy * ow + ox] / (T)div;
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++)
                        dxp[(size_t)iy * w + ix] += g;
            }
        }
    }
}

/* AdaptiveAvgPool2d's bins: output o of out covers [floor(o*in/out), ceil((o+1)*in/out)). */
void SF_FN(sf_ref_adaptive_avgpool2d_fwd)(const T *x, int n, int c, int h, int w, int oh, int ow, T *y)
{
    for (size_t plane = 0; plane < (size_t)n * c; plane++) {
        const T *xp = x + plane * h * w;
        T *yp = y + plane * oh * ow;
        for (int oy = 0; oy < oh; oy++) {
            const int y0 = sf_ref_bin_start(oy, h, oh), y1 = sf_ref_bin_end(oy, h, oh);
            for (int ox = 0; ox < ow; ox++) {
                const int x0 = sf_ref_bin_start(ox, w, ow), x1 = sf_ref_bin_end(ox, w, ow);
                T acc = 0;
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++)
                        acc += xp[(size_t)iy * w + ix];
                yp[(size_t)oy * ow + ox] = acc / (T)((y1 - y0) * (x1 - x0));
            }
        }
    }
}

void SF_FN(sf_ref_adaptive_avgpool2d_bwd)(const T *dy, int n, int c, int h, int w, int oh, int ow, T *dx)
{
    for (size_t i = 0; i < (size_t)n * c * h * w; i++)
        dx[i] = 0;
    for (size_t plane = 0; plane < (size_t)n * c; plane++) {
        T *dxp = dx + plane * h * w;
        const T *dyp = dy + plane * oh * ow;
        for (int oy = 0; oy < oh; oy++) {
            const int y0 = sf_ref_bin_start(oy, h, oh), y1 = sf_ref_bin_end(oy, h, oh);
            for (int ox = 0; ox < ow; ox++) {
                const int x0 = sf_ref_bin_start(ox, w, ow), x1 = sf_ref_bin_end(ox, w, ow);
                const T g = dyp[(size_t)oy * ow + ox] / (T)((y1 - y0) * (x1 - x0));
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++)
                        dxp[(size_t)iy * w + ix] += g;
            }
        }
    }
}

#endif
