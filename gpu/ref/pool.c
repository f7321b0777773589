/* gpu/ref/pool.c — reference MaxPool2d and global average pooling, forward and
 * backward, in float and double (_f64). Contracts in gpu/ref/ref.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "pool.c"
#include "gpu/ref/generic.h"

/* ---- the pooling layers' hooks (gpu/layers.c) ----------------------------- */

/* The argmax of every output ([nb, out_elems] int32, stored in floats' room). */
size_t sf_ref_layer_maxpool2d_save(const sf_layer *L, size_t nb) { return nb * L->out_elems; }

void sf_ref_layer_maxpool2d_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_maxpool2d_fwd_sized(io->x[0], io->n, L->in_c, L->in_h, L->in_w, L->k, L->stride, L->pad, L->out_h,
                               L->out_w, io->y, (int32_t *)io->save);
}

void sf_ref_layer_maxpool2d_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_maxpool2d_bwd(io->dy, (const int32_t *)io->save, io->n, L->in_c, L->in_h, L->in_w, L->out_h, L->out_w,
                         io->scratch);
    io->give(io, 0, io->scratch);
}

void sf_ref_layer_gap_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_avgpool_fwd(io->x[0], io->n, L->in_c, L->in_h, L->in_w, io->y);
}

void sf_ref_layer_gap_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_avgpool_bwd(io->dy, io->n, L->in_c, L->in_h, L->in_w, io->scratch);
    io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* oh = (h + 2*pad - k) / stride + 1 (floor, as ceil_mode=False). The window of
 * output (oy, ox) covers input rows oy*s-p .. oy*s-p+k-1 (same for columns);
 * taps in the padding are skipped (padding is -inf in PyTorch: it never wins).
 * The first in-input tap in row-major window order is taken, then a later tap
 * replaces it only if strictly greater or NaN (PyTorch's rule, so the first
 * maximum wins ties and a NaN propagates). A window with no tap inside the
 * input (impossible when pad <= k/2, which PyTorch requires) gives -inf and
 * argmax -1, which the backward skips. */
void SF_FN(sf_ref_maxpool2d_fwd)(const T *x, int n, int c, int h, int w, int k, int stride,
                                 int pad, T *y, int32_t *argmax)
{
    SF_FN(sf_ref_maxpool2d_fwd_sized)(x, n, c, h, w, k, stride, pad, (h + 2 * pad - k) / stride + 1,
                                      (w + 2 * pad - k) / stride + 1, y, argmax);
}

/* The same with the output size given: ceil_mode's last window may reach
 * past the input (and the padding), whose taps it skips. */
void SF_FN(sf_ref_maxpool2d_fwd_sized)(const T *x, int n, int c, int h, int w, int k, int stride, int pad,
                                       int oh, int ow, T *y, int32_t *argmax)
{
    for (size_t plane = 0; plane < (size_t)n * c; plane++) {
        const T *xp = x + plane * h * w;
        T *yp = y + plane * oh * ow;
        int32_t *ap = argmax + plane * oh * ow;
        for (int oy = 0; oy < oh; oy++) {
            for (int ox = 0; ox < ow; ox++) {
                T best = (T)-INFINITY;
                int32_t best_i = -1;
                for (int ky = 0; ky < k; ky++) {
                    const int iy = oy * stride - pad + ky;
                    if (iy < 0 || iy >= h)
                        continue;
                    for (int kx = 0; kx < k; kx++) {
                        const int ix = ox * stride - pad + kx;
                        if (ix < 0 || ix >= w)
                            continue;
                        const T v = xp[(size_t)iy * w + ix];
                        if (best_i < 0 || v > best || isnan(v)) {
                            best = v;
                            best_i = iy * w + ix;
                        }
                    }
                }
                yp[(size_t)oy * ow + ox] = best;
                ap[(size_t)oy * ow + ox] = best_i;
            }
        }
    }
}

/* dx[argmax] += dy for every output. NOTE: this one sums into dx (windows
 * overlap when stride < k, so one input can be chosen by several outputs), so
 * it zeroes the whole of dx first: the result is still written, not
 * accumulated onto what the caller had there. */
void SF_FN(sf_ref_maxpool2d_bwd)(const T *dy, const int32_t *argmax, int n, int c, int h, int w,
                                 int oh, int ow, T *dx)
{
    for (size_t i = 0; i < (size_t)n * c * h * w; i++)
        dx[i] = 0;
    for (size_t plane = 0; plane < (size_t)n * c; plane++) {
        const T *dyp = dy + plane * oh * ow;
        const int32_t *ap = argmax + plane * oh * ow;
        T *dxp = dx + plane * h * w;
        for (size_t o = 0; o < (size_t)oh * ow; o++)
            if (ap[o] >= 0)
                dxp[ap[o]] += dyp[o];
    }
}

/* y[n][c] = sum_{y,x} x[n][c][y][x] / (h*w) */
void SF_FN(sf_ref_avgpool_fwd)(const T *x, int n, int c, int h, int w, T *y)
{
    const size_t hw = (size_t)h * w;
    for (size_t plane = 0; plane < (size_t)n * c; plane++) {
        const T *xp = x + plane * hw;
        T acc = 0;
        for (size_t i = 0; i < hw; i++)
            acc += xp[i];
        y[plane] = acc / (T)hw;
    }
}

/* dx[n][c][y][x] = dy[n][c] / (h*w) */
void SF_FN(sf_ref_avgpool_bwd)(const T *dy, int n, int c, int h, int w, T *dx)
{
    const size_t hw = (size_t)h * w;
    for (size_t plane = 0; plane < (size_t)n * c; plane++) {
        const T g = dy[plane] / (T)hw;
        for (size_t i = 0; i < hw; i++)
            dx[plane * hw + i] = g;
    }
}

#endif
