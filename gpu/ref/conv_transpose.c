/* gpu/ref/conv_transpose.c — reference ConvTranspose2d, forward and backward,
 * in float and double (_f64). Contracts in gpu/ref/ref.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "conv_transpose.c"
#include "gpu/ref/generic.h"

/* ---- the conv_transpose2d layer's hooks (gpu/layers.c) -------------------- */

void sf_ref_layer_convt2d_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_convt2d_fwd(io->x[0], io->n, L->in_c, L->in_h, L->in_w, io->w, io->b, L->out_c, L->k, L->stride,
                       L->pad, io->y);
}

void sf_ref_layer_convt2d_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    float *dx = io->want[0] ? io->scratch : NULL;
    sf_ref_convt2d_bwd(io->x[0], io->n, L->in_c, L->in_h, L->in_w, io->w, L->out_c, L->k, L->stride, L->pad,
                       io->dy, dx, io->dw, io->db);
    if (dx)
        io->give(io, 0, dx);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* The adjoint of conv2d: every input pixel scatters its kernel into the output.
 *   y[n][o][iy*s+ky-p][ix*s+kx-p] += x[n][c][iy][ix] * w[c][o][ky][kx]
 * over all c, iy, ix, ky, kx whose target lies inside the output, starting
 * from y = b[o] (or 0). Taps that land in the cropped border (the -p) are
 * dropped, which is what PyTorch's padding means for a transposed conv. */
void SF_FN(sf_ref_convt2d_fwd)(const T *x, int n, int c, int h, int w, const T *wt, const T *b,
                               int oc, int k, int stride, int pad, T *y)
{
    const int oh = (h - 1) * stride - 2 * pad + k, ow = (w - 1) * stride - 2 * pad + k;
    for (int ni = 0; ni < n; ni++) {
        for (int o = 0; o < oc; o++) {
            T *yp = y + ((size_t)ni * oc + o) * oh * ow;
            for (int i = 0; i < oh * ow; i++)
                yp[i] = b ? b[o] : (T)0;
            for (int ci = 0; ci < c; ci++) {
                const T *xp = x + ((size_t)ni * c + ci) * h * w;
                const T *wp = wt + ((size_t)ci * oc + o) * k * k;
                for (int iy = 0; iy < h; iy++) {
                    for (int ix = 0; ix < w; ix++) {
                        const T xv = xp[(size_t)iy * w + ix];
                        for (int ky = 0; ky < k; ky++) {
                            const int oy = iy * stride + ky - pad;
                            if (oy < 0 || oy >= oh)
                                continue;
                            for (int kx = 0; kx < k; kx++) {
                                const int ox = ix * stride + kx - pad;
                                if (ox < 0 || ox >= ow)
                                    continue;
                                yp[(size_t)oy * ow + ox] += xv * wp[ky * k + kx];
                            }
                        }
                    }
                }
            }
        }
    }
}

/* With oy = iy*s+ky-p, ox = ix*s+kx-p (inside the output only):
 *   db[o]             = sum_{n,oy,ox} dy[n][o][oy][ox]
 *   dw[c][o][ky][kx]  = sum_{n,iy,ix} x[n][c][iy][ix] * dy[n][o][oy][ox]
 *   dx[n][c][iy][ix]  = sum_{o,ky,kx} w[c][o][ky][kx] * dy[n][o][oy][ox]
 * (dx is conv2d's forward of dy with the same weight, no bias.) */
void SF_FN(sf_ref_convt2d_bwd)(const T *x, int n, int c, int h, int w, const T *wt, int oc, int k,
                               int stride, int pad, const T *dy, T *dx, T *dw, T *db)
{
    const int oh = (h - 1) * stride - 2 * pad + k, ow = (w - 1) * stride - 2 * pad + k;
    if (db)
        SF_FN(sf_ref_bias_grad)(dy, n, oc, (size_t)oh * ow, db);
    for (int ci = 0; ci < c; ci++) {
        for (int o = 0; o < oc; o++) {
            for (int ky = 0; ky < k; ky++) {
                for (int kx = 0; kx < k; kx++) {
                    T acc = 0;
                    for (int ni = 0; ni < n; ni++) {
                        const T *xp = x + ((size_t)ni * c + ci) * h * w;
                        const T *dyp = dy + ((size_t)ni * oc + o) * oh * ow;
                        for (int iy = 0; iy < h; iy++) {
                            const int oy = iy * stride + ky - pad;
                            if (oy < 0 || oy >= oh)
                                continue;
                            for (int ix = 0; ix < w; ix++) {
                                const int ox = ix * stride + kx - pad;
                                if (ox < 0 || ox >= ow)
                                    continue;
                                acc += xp[(size_t)iy * w + ix] * dyp[(size_t)oy * ow + ox];
                            }
                        }
                    }
                    dw[(((size_t)ci * oc + o) * k + ky) * k + kx] = acc;
                }
            }
        }
    }
    if (!dx)
        return;
    for (int ni = 0; ni < n; ni++) {
        for (int ci = 0; ci < c; ci++) {
            T *dxp = dx + ((size_t)ni * c + ci) * h * w;
            for (int iy = 0; iy < h; iy++) {
                for (int ix = 0; ix < w; ix++) {
                    T acc = 0;
                    for (int o = 0; o < oc; o++) {
                        const T *dyp = dy + ((size_t)ni * oc + o) * oh * ow;
                        const T *wp = wt + ((size_t)ci * oc + o) * k * k;
                        for (int ky = 0; ky < k; ky++) {
                            const int oy = iy * stride + ky - pad;
                            if (oy < 0 || oy >= oh)
                                continue;
                            for (int kx = 0; kx < k; kx++) {
                                const int ox = ix * stride + kx - pad;
                                if (ox < 0 || ox >= ow)
                                    continue;
                                acc += wp[ky * k + kx] * dyp[(size_t)oy * ow + ox];
                            }
                        }
                    }
                    dxp[(size_t)iy * w + ix] = acc;
                }
            }
        }
    }
}

#endif
