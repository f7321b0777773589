/* gpu/ref/prelu.c — reference PReLU (nn.PReLU, F.prelu): x where x > 0,
 * else a * x, with one slope a shared by every channel or one per channel,
 * forward and backward in float and double (_f64), and the prelu layer's
 * hooks. Contracts in gpu/ref/layers.h; the choices at 0 and at a NaN are
 * PyTorch's prelu_backward's. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "prelu.c"
#include "gpu/ref/generic.h"

/* ---- the prelu layer's hooks (gpu/layers.c) --------------------------------- */

/* A map [C,H,W] or flat features [F] (F channels of 1x1): its channels and
 * positions. */
void sf_ref_layer_prelu_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_prelu_fwd(io->x[0], io->n, L->out_ch, (size_t)L->out_h * L->out_w, io->w, L->num_parameters, io->y);
}

void sf_ref_layer_prelu_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_prelu_bwd(io->x[0], io->n, L->out_ch, (size_t)L->out_h * L->out_w, io->w, L->num_parameters, io->dy,
                     io->want[0] ? io->scratch : NULL, io->dw);
    if (io->want[0])
        io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* y = x > 0 ? x : a * x, a = w[0] when np == 1, else w[channel] (np == c),
 * on [n, c, hw]. A NaN stays NaN; -0 gives a * -0 (PyTorch's forward). y may
 * alias x. */
void SF_FN(sf_ref_prelu_fwd)(const T *x, int n, int c, size_t hw, const T *w, int np, T *y)
{
    for (int ni = 0; ni < n; ni++)
        for (int ci = 0; ci < c; ci++) {
            const T a = w[np == 1 ? 0 : ci];
            for (size_t p = 0; p < hw; p++) {
                const size_t e = ((size_t)ni * c + ci) * hw + p;
                y[e] = x[e] > (T)0 ? x[e] : a * x[e];
            }
        }
}

/* PyTorch's prelu_backward: dx = dy where x > 0, else a * dy (at 0, -0 and
 * a NaN too); dw[j] = sum over the batch and positions of (x > 0 ? 0 :
 * x * dy), per channel, or over every channel into dw[0] when np == 1, in
 * a fixed order (channel, sample, position). dx may be NULL. */
void SF_FN(sf_ref_prelu_bwd)(const T *x, int n, int c, size_t hw, const T *w, int np, const T *dy, T *dx, T *dw)
{
    for (int j = 0; j < np; j++)
        dw[j] = 0;
    for (int ci = 0; ci < c; ci++) {
        const int j = np == 1 ? 0 : ci;
        const T a = w[j];
        double acc = 0; /* a parameter's gradient: see generic.h */
        for (int ni = 0; ni < n; ni++)
            for (size_t p = 0; p < hw; p++) {
                const size_t e = ((size_t)ni * c + ci) * hw + p;
                const int pos = x[e] > (T)0;
                if (!pos)
                    acc += (double)x[e] * dy[e];
                if (dx)
                    dx[e] = pos ? dy[e] : a * dy[e];
            }
        dw[j] += (T)acc;
    }
}

#endif
