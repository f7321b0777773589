/* gpu/ref/upsample.c — reference nearest-neighbour upsampling of a map by an
 * integer factor (nn.Upsample(scale_factor=s, mode="nearest")), forward and
 * backward, in float and double (_f64), and the upsample layer's hooks.
 * Contracts in gpu/ref/layers.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "upsample.c"
#include "gpu/ref/generic.h"

/* ---- the upsample layer's hooks (gpu/layers.c) -------------------------------- */

void sf_ref_layer_upsample_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_upsample_fwd(io->x[0], io->n, L->in_c, L->in_h, L->in_w, L->scale, io->y);
}

void sf_ref_layer_upsample_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_upsample_bwd(io->dy, io->n, L->in_c, L->in_h, L->in_w, L->scale, io->scratch);
    io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* y[n][c][oy][ox] = x[n][c][oy / s][ox / s] over the (h*s) x (w*s) output. */
void SF_FN(sf_ref_upsample_fwd)(const T *x, int n, int c, int h, int w, int s, T *y)
{
    const int oh = h * s, ow = w * s;
    for (size_t pl = 0; pl < (size_t)n * c; pl++)
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++)
                y[(pl * oh + oy) * ow + ox] = x[(pl * h + oy / s) * w + ox / s];
}

/* dx[n][c][iy][ix] = the sum of dy over the s x s output pixels it became. */
void SF_FN(sf_ref_upsample_bwd)(const T *dy, int n, int c, int h, int w, int s, T *dx)
{
    const int oh = h * s, ow = w * s;
    for (size_t pl = 0; pl < (size_t)n * c; pl++)
        for (int iy = 0; iy < h; iy++)
            for (int ix = 0; ix < w; ix++) {
                T acc = 0;
                for (int a = 0; a < s; a++)
                    for (int b = 0; b < s; b++)
                        acc += dy[(pl * oh + (size_t)iy * s + a) * ow + (size_t)ix * s + b];
                dx[(pl * h + iy) * w + ix] = acc;
            }
}

#endif
