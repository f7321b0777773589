/* gpu/ref/grn.c — reference Global Response Normalization (ConvNeXt V2's
 * GRN, timm's GlobalResponseNorm) over a [C, H, W] map, forward and backward
 * in float and double (_f64), and the grn layer's hooks. Contracts in
 * gpu/ref/layers.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Per-sample workspace of a few values per channel (at most 2 MB at the
 * registry's channel bound): nothing a request can grow, so running out of
 * it is the process running out of memory. */
static void *grn_work(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "gpu/ref/grn.c: out of memory for %zu bytes\n", bytes);
        abort();
    }
    return p;
}

#define SF_REF_SELF "grn.c"
#include "gpu/ref/generic.h"

/* ---- the grn layer's hooks (gpu/layers.c) ------------------------------------ */

void sf_ref_layer_grn_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_grn_fwd(io->x[0], io->n, L->out_ch, (size_t)L->out_h * L->out_w, io->w, io->b, L->eps, io->y);
}

void sf_ref_layer_grn_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_grn_bwd(io->x[0], io->n, L->out_ch, (size_t)L->out_h * L->out_w, io->w, L->eps, io->dy,
                   io->want[0] ? io->scratch : NULL, io->dw, io->db);
    if (io->want[0])
        io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* Sample ni's per-channel L2 norms over the positions, g[c], and the
 * divisor of each, their mean over the channels plus eps. Sums in double. */
static T SF_FN(grn_norms)(const T *x, int c, size_t hw, T eps, T *g)
{
    double mean = 0;
    for (int ci = 0; ci < c; ci++) {
        double s = 0;
        for (size_t p = 0; p < hw; p++)
            s += (double)x[(size_t)ci * hw + p] * x[(size_t)ci * hw + p];
        g[ci] = (T)sqrt(s);
        mean += g[ci];
    }
    return (T)(mean / c) + eps;
}

void SF_FN(sf_ref_grn_fwd)(const T *x, int n, int c, size_t hw, const T *w, const T *b, T eps, T *y)
{
    T *g = (T *)grn_work(sizeof(T) * (size_t)c);
    for (int ni = 0; ni < n; ni++) {
        const T *xs = x + (size_t)ni * c * hw;
        T *ys = y + (size_t)ni * c * hw;
        const T d = SF_FN(grn_norms)(xs, c, hw, eps, g);
        for (int ci = 0; ci < c; ci++) {
            const T f = (T)1 + w[ci] * (g[ci] / d);
            for (size_t p = 0; p < hw; p++)
                ys[(size_t)ci * hw + p] = xs[(size_t)ci * hw + p] * f + b[ci];
        }
    }
    free(g);
}

/* With nx = g / d and a[c] = w[c] * sum_p dy * x (the loss's gradient in
 * nx[c]): dL/dg[k] = a[k] / d - sum_c a[c] g[c] / (C d^2), and dg[k]/dx =
 * x / g[k] (0 where g[k] is 0, as PyTorch's norm backward). The parameters'
 * sums run over the whole batch in double. */
void SF_FN(sf_ref_grn_bwd)(const T *x, int n, int c, size_t hw, const T *w, T eps, const T *dy, T *dx, T *dw,
                           T *db)
{
    T *g = (T *)grn_work(sizeof(T) * (size_t)c);
    double *a = (double *)grn_work(sizeof(double) * (size_t)c);
    double *sw = (double *)grn_work(sizeof(double) * (size_t)c), *sb = (double *)grn_work(sizeof(double) * (size_t)c);
    for (int ci = 0; ci < c; ci++)
        sw[ci] = sb[ci] = 0;
    for (int ni = 0; ni < n; ni++) {
        const T *xs = x + (size_t)ni * c * hw, *ds = dy + (size_t)ni * c * hw;
        const T d = SF_FN(grn_norms)(xs, c, hw, eps, g);
        double ag = 0;
        for (int ci = 0; ci < c; ci++) {
            double sdx = 0, sd = 0;
            for (size_t p = 0; p < hw; p++) {
                sdx += (double)ds[(size_t)ci * hw + p] * xs[(size_t)ci * hw + p];
                sd += ds[(size_t)ci * hw + p];
            }
            sw[ci] += sdx * (g[ci] / d);
            sb[ci] += sd;
            a[ci] = w[ci] * sdx;
            ag += a[ci] * g[ci];
        }
        if (!dx)
            continue;
        T *xg = dx + (size_t)ni * c * hw;
        for (int ci = 0; ci < c; ci++) {
            const double dg = a[ci] / d - ag / ((double)c * d * d);
            const T f = (T)1 + w[ci] * (g[ci] / d), k = g[ci] > 0 ? (T)(dg / g[ci]) : (T)0;
            for (size_t p = 0; p < hw; p++)
                xg[(size_t)ci * hw + p] = ds[(size_t)ci * hw + p] * f + k * xs[(size_t)ci * hw + p];
        }
    }
    for (int ci = 0; ci < c; ci++) {
        if (dw)
            dw[ci] = (T)sw[ci];
        if (db)
            db[ci] = (T)sb[ci];
    }
    free(g);
    free(a);
    free(sw);
    free(sb);
}

#endif
