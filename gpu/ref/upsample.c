/* gpu/ref/upsample.c — reference upsampling (and resizing) of a map,
 * nearest or bilinear by PyTorch's rules (nn.Upsample, F.interpolate; the
 * indices and weights from gpu/upsample_rule.h), forward and backward, in float and
 * double (_f64), and the upsample layer's hooks. Contracts in
 * gpu/ref/layers.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>
#include <string.h>

#define SF_REF_SELF "upsample.c"
#include "gpu/ref/generic.h"

/* ---- the upsample layer's hooks (gpu/layers.c) -------------------------------- */

void sf_ref_layer_upsample_fwd(const sf_ref_io *io)
{
    const sf_up_rule p = sf_layer_up_rule(io->L);
    sf_ref_upsample_fwd(io->x[0], io->n, io->L->in_c, &p, io->y);
}

void sf_ref_layer_upsample_bwd(const sf_ref_io *io)
{
    if (!io->want[0])
        return;
    const sf_up_rule p = sf_layer_up_rule(io->L);
    sf_ref_upsample_bwd(io->dy, io->n, io->L->in_c, &p, io->scratch);
    io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* y[n][c][oy][ox] = the pixel output (oy, ox) reads (nearest), or the blend
 * along y of the blends along x of the four it reads (bilinear). */
void SF_FN(sf_ref_upsample_fwd)(const T *x, int n, int c, const sf_up_rule *p, T *y)
{
    const int h = p->h.in, w = p->w.in, oh = p->h.out, ow = p->w.out;
    for (size_t pl = 0; pl < (size_t)n * c; pl++)
        for (int oy = 0; oy < oh; oy++) {
            int y0, y1;
            float a0, a1;
            sf_up_src(p, &p->h, oy, &y0, &y1, &a0, &a1);
            const T *r0 = x + (pl * h + y0) * w, *r1 = x + (pl * h + y1) * w;
            for (int ox = 0; ox < ow; ox++) {
                int x0, x1;
                float b0, b1;
                sf_up_src(p, &p->w, ox, &x0, &x1, &b0, &b1);
                y[(pl * oh + oy) * ow + ox] =
                    !p->bilinear ? r0[x0] /* a copy: no 0 * inf */
                                 : (T)a0 * ((T)b0 * r0[x0] + (T)b1 * r0[x1]) + (T)a1 * ((T)b0 * r1[x0] + (T)b1 * r1[x1]);
            }
        }
}

/* dx = 0, then each output's dy added into the four inputs it read, with
 * the forward's weights, outputs in raster order. */
void SF_FN(sf_ref_upsample_bwd)(const T *dy, int n, int c, const sf_up_rule *p, T *dx)
{
    const int h = p->h.in, w = p->w.in, oh = p->h.out, ow = p->w.out;
    memset(dx, 0, sizeof *dx * (size_t)n * c * h * w);
    for (size_t pl = 0; pl < (size_t)n * c; pl++)
        for (int oy = 0; oy < oh; oy++) {
            int y0, y1;
            float a0, a1;
            sf_up_src(p, &p->h, oy, &y0, &y1, &a0, &a1);
            T *r0 = dx + (pl * h + y0) * w, *r1 = dx + (pl * h + y1) * w;
            for (int ox = 0; ox < ow; ox++) {
                int x0, x1;
                float b0, b1;
                sf_up_src(p, &p->w, ox, &x0, &x1, &b0, &b1);
                const T g = dy[(pl * oh + oy) * ow + ox];
                if (!p->bilinear) {
                    r0[x0] += g;
                    continue;
                }
                r0[x0] += (T)a0 * (T)b0 * g;
                r0[x1] += (T)a0 * (T)b1 * g;
                r1[x0] += (T)a1 * (T)b0 * g;
                r1[x1] += (T)a1 * (T)b1 * g;
            }
        }
}

#endif
