/* gpu/ref/conv_grouped.c — reference Conv2d with groups, dilation and
 * non-square windows, forward and backward, in float and double (_f64).
 * Contracts in gpu/ref/layers.h. The plain square convolution (groups 1,
 * dilation 1) keeps its own loops in conv.c, which this generalises. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "conv_grouped.c"
#include "gpu/ref/generic.h"

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* y[n][o][oy][ox] = b[o] + sum_{ci<c/g, ky, kx} w[o][ci][ky][kx] *
 *                   x[n][(o / (oc/g)) * (c/g) + ci][oy*sh - ph + ky*dh][ox*sw - pw + kx*dw]
 * (taps outside the input read 0). */
void SF_FN(sf_ref_conv2d_gd_fwd)(const T *x, int n, int c, int h, int w, const T *wt, const T *b, int oc,
                                 const sf_ref_conv_win *v, T *y)
{
    const int kh = v->kh, kw = v->kw;
    const int oh = sf_ref_conv_out(h, kh, v->sh, v->ph, v->dh), ow = sf_ref_conv_out(w, kw, v->sw, v->pw, v->dw);
    const int cg = c / v->groups, ocg = oc / v->groups;
    for (int ni = 0; ni < n; ni++)
        for (int o = 0; o < oc; o++) {
            const T *xg = x + ((size_t)ni * c + (size_t)(o / ocg) * cg) * h * w;
            T *yp = y + ((size_t)ni * oc + o) * oh * ow;
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++) {
                    T acc = b ? b[o] : (T)0;
                    for (int ci = 0; ci < cg; ci++)
                        for (int ky = 0; ky < kh; ky++) {
                            const int iy = oy * v->sh - v->ph + ky * v->dh;
                            if (iy < 0 || iy >= h)
                                continue;
                            for (int kx = 0; kx < kw; kx++) {
                                const int ix = ox * v->sw - v->pw + kx * v->dw;
                                if (ix < 0 || ix >= w)
                                    continue;
                                acc += wt[(((size_t)o * cg + ci) * kh + ky) * kw + kx] *
                                       xg[((size_t)ci * h + iy) * w + ix];
                            }
                        }
                    yp[(size_t)oy * ow + ox] = acc;
                }
        }
}

/* db[o] = sum dy[.][o]; dw[o][ci][ky][kx] = sum_{n,oy,ox} dy * x at the tap;
 * dx = the transpose (zeroed first; dx and db may be NULL). */
void SF_FN(sf_ref_conv2d_gd_bwd)(const T *x, int n, int c, int h, int w, const T *wt, int oc,
                                 const sf_ref_conv_win *v, const T *dy, T *dx, T *dw, T *db)
{
    const int kh = v->kh, kw = v->kw;
    const int oh = sf_ref_conv_out(h, kh, v->sh, v->ph, v->dh), ow = sf_ref_conv_out(w, kw, v->sw, v->pw, v->dw);
    const int cg = c / v->groups, ocg = oc / v->groups;
    if (db)
        SF_FN(sf_ref_bias_grad)(dy, n, oc, (size_t)oh * ow, db);
    for (size_t i = 0; i < (size_t)oc * cg * kh * kw; i++)
        dw[i] = 0;
    if (dx)
        for (size_t i = 0; i < (size_t)n * c * h * w; i++)
            dx[i] = 0;
    for (int ni = 0; ni < n; ni++)
        for (int o = 0; o < oc; o++) {
            const size_t xoff = ((size_t)ni * c + (size_t)(o / ocg) * cg) * h * w;
            const T *xg = x + xoff;
            const T *dyp = dy + ((size_t)ni * oc + o) * oh * ow;
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++) {
                    const T g = dyp[(size_t)oy * ow + ox];
                    for (int ci = 0; ci < cg; ci++)
                        for (int ky = 0; ky < kh; ky++) {
                            const int iy = oy * v->sh - v->ph + ky * v->dh;
                            if (iy < 0 || iy >= h)
                                continue;
                            for (int kx = 0; kx < kw; kx++) {
                                const int ix = ox * v->sw - v->pw + kx * v->dw;
                                if (ix < 0 || ix >= w)
                                    continue;
                                const size_t wi = (((size_t)o * cg + ci) * kh + ky) * kw + kx;
                                const size_t xi = ((size_t)ci * h + iy) * w + ix;
                                dw[wi] += g * xg[xi];
                                if (dx)
                                    dx[xoff + xi] += g * wt[wi];
                            }
                        }
                }
        }
}

#endif
