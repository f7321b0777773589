/* gpu/ref/conv.c — reference Conv2d, forward and backward, in float and double
 * (_f64). Contracts in gpu/ref/ref.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

/* Outputs o in [*o0, *o1) of a convolution axis (input length in, output
 * length out) whose tap at kernel offset kk reads input index
 * o*stride + kk - pad inside [0, in). */
static void tap_range(int kk, int stride, int pad, int in, int out, int *o0, int *o1)
{
    int lo = 0, hi = out;
    const int first = kk - pad;           /* input index read by o = 0 */
    if (first < 0)
        lo = (-first + stride - 1) / stride; /* smallest o with o*stride + first >= 0 */
    if (first > in - 1)
        hi = 0;
    else if ((in - 1 - first) / stride + 1 < hi)
        hi = (in - 1 - first) / stride + 1; /* largest o with o*stride + first <= in-1, plus 1 */
    if (lo > hi)
        lo = hi;
    *o0 = lo;
    *o1 = hi;
}

#define SF_REF_SELF "conv.c"
#include "gpu/ref/generic.h"

/* ---- the conv2d layer's hooks (gpu/layers.c) ------------------------------ */

/* groups or dilation other than 1, or a window that differs between height
 * and width, take conv_grouped.c's loops. */
static int conv_general(const sf_layer *L, sf_ref_conv_win *v)
{
    *v = (sf_ref_conv_win){L->k, L->kw, L->stride, L->stride_w, L->pad, L->pad_w, L->dilation, L->dilation_w,
                           L->groups > 1 ? L->groups : 1};
    return L->groups > 1 || L->dilation > 1 || !sf_layer_conv_square(L);
}

void sf_ref_layer_conv2d_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_conv_win v;
    if (conv_general(L, &v)) {
        sf_ref_conv2d_gd_fwd(io->x[0], io->n, L->in_c, L->in_h, L->in_w, io->w, io->b, L->out_c, &v, io->y);
        return;
    }
    sf_ref_conv2d_fwd(io->x[0], io->n, L->in_c, L->in_h, L->in_w, io->w, io->b, L->out_c, L->k, L->stride,
                      L->pad, io->y);
}

void sf_ref_layer_conv2d_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    float *dx = io->want[0] ? io->scratch : NULL;
    sf_ref_conv_win v;
    if (conv_general(L, &v))
        sf_ref_conv2d_gd_bwd(io->x[0], io->n, L->in_c, L->in_h, L->in_w, io->w, L->out_c, &v, io->dy, dx, io->dw,
                             io->db);
    else
        sf_ref_conv2d_bwd(io->x[0], io->n, L->in_c, L->in_h, L->in_w, io->w, L->out_c, L->k, L->stride,
                          L->pad, io->dy, dx, io->dw, io->db);
    if (dx)
        io->give(io, 0, dx);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* tap_range (above): the outputs [o0, o1) whose tap at kernel offset kk
 * reads inside the input (o*stride + kk - pad in [0, in)); the loops below
 * visit only those, which is the same sum as skipping the zero-padded taps. */

/* y[n][o][oy][ox] = b[o] + sum_{c,ky,kx} w[o][c][ky][kx] * x[n][c][oy*s+ky-p][ox*s+kx-p]
 * (taps outside the input read 0). */
void SF_FN(sf_ref_conv2d_fwd)(const T *x, int n, int c, int h, int w, const T *wt, const T *b,
                              int oc, int k, int stride, int pad, T *y)
{
    const int oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
    for (int ni = 0; ni < n; ni++) {
        const T *xn = x + (size_t)ni * c * h * w;
        for (int o = 0; o < oc; o++) {
            T *yp = y + ((size_t)ni * oc + o) * oh * ow;
            for (int i = 0; i < oh * ow; i++)
                yp[i] = b ? b[o] : (T)0;
            for (int ci = 0; ci < c; ci++) {
                const T *xp = xn + (size_t)ci * h * w;
                for (int ky = 0; ky < k; ky++) {
                    int oy0, oy1;
                    tap_range(ky, stride, pad, h, oh, &oy0, &oy1);
                    for (int kx = 0; kx < k; kx++) {
                        int ox0, ox1;
                        tap_range(kx, stride, pad, w, ow, &ox0, &ox1);
                        const T wv = wt[(((size_t)o * c + ci) * k + ky) * k + kx];
                        for (int oy = oy0; oy < oy1; oy++) {
                            const T *xrow = xp + (size_t)(oy * stride + ky - pad) * w + (kx - pad);
                            T *yrow = yp + (size_t)oy * ow;
                            for (int ox = ox0; ox < ox1; ox++)
                                yrow[ox] += wv * xrow[ox * stride];
                        }
                    }
                }
            }
        }
    }
}

/* db[o] = sum dy[n][o][.][.]
 * dw[o][c][ky][kx] = sum_{n,oy,ox} dy[n][o][oy][ox] * x[n][c][iy][ix]
 * dx[n][c][iy][ix] = sum_{o,ky,kx} w[o][c][ky][kx] * dy[n][o][oy][ox]  over the taps that read it */
void SF_FN(sf_ref_conv2d_bwd)(const T *x, int n, int c, int h, int w, const T *wt, int oc, int k,
                              int stride, int pad, const T *dy, T *dx, T *dw, T *db)
{
    const int oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
    if (db)
        SF_FN(sf_ref_bias_grad)(dy, n, oc, (size_t)oh * ow, db);
    for (int o = 0; o < oc; o++) {
        for (int ci = 0; ci < c; ci++) {
            for (int ky = 0; ky < k; ky++) {
                int oy0, oy1;
                tap_range(ky, stride, pad, h, oh, &oy0, &oy1);
                for (int kx = 0; kx < k; kx++) {
                    int ox0, ox1;
                    tap_range(kx, stride, pad, w, ow, &ox0, &ox1);
                    T acc = 0;
                    for (int ni = 0; ni < n; ni++) {
                        const T *dyp = dy + ((size_t)ni * oc + o) * oh * ow;
                        const T *xp = x + ((size_t)ni * c + ci) * h * w;
                        for (int oy = oy0; oy < oy1; oy++) {
                            const T *xrow = xp + (size_t)(oy * stride + ky - pad) * w + (kx - pad);
                            const T *dyrow = dyp + (size_t)oy * ow;
                            for (int ox = ox0; ox < ox1; ox++)
                                acc += dyrow[ox] * xrow[ox * stride];
                        }
                    }
                    dw[(((size_t)o * c + ci) * k + ky) * k + kx] = acc;
                }
            }
        }
    }
    if (!dx)
        return;
    for (size_t i = 0; i < (size_t)n * c * h * w; i++)
        dx[i] = 0;
    for (int ni = 0; ni < n; ni++) {
        T *dxn = dx + (size_t)ni * c * h * w;
        for (int o = 0; o < oc; o++) {
            const T *dyp = dy + ((size_t)ni * oc + o) * oh * ow;
            for (int ci = 0; ci < c; ci++) {
                T *dxp = dxn + (size_t)ci * h * w;
                for (int ky = 0; ky < k; ky++) {
                    int oy0, oy1;
                    tap_range(ky, stride, pad, h, oh, &oy0, &oy1);
                    for (int kx = 0; kx < k; kx++) {
                        int ox0, ox1;
                        tap_range(kx, stride, pad, w, ow, &ox0, &ox1);
                        const T wv = wt[(((size_t)o * c + ci) * k + ky) * k + kx];
                        for (int oy = oy0; oy < oy1; oy++) {
                            T *dxrow = dxp + (size_t)(oy * stride + ky - pad) * w + (kx - pad);
                            const T *dyrow = dyp + (size_t)oy * ow;
                            for (int ox = ox0; ox < ox1; ox++)
                                dxrow[ox * stride] += wv * dyrow[ox];
                        }
                    }
                }
            }
        }
    }
}

#endif
