/* gpu/ref/concat.c — reference concatenation along channels (torch.cat(dim=1))
 * of k tensors of equal H,W, forward and the backward's slicing, in float
 * and double (_f64), and the concat hooks. Contracts in gpu/ref/layers.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "concat.c"
#include "gpu/ref/generic.h"

/* ---- the concat layer's hooks (gpu/layers.c) ------------------------------ */

/* Channels of input j (its elements over the layer's H*W). */
static int concat_c(const sf_ref_io *io, int j)
{
    return (int)(sf_ref_in_elems(io, j) / ((size_t)io->L->out_h * io->L->out_w));
}

void sf_ref_layer_concat_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    const size_t hw = (size_t)L->out_h * L->out_w;
    int c0 = 0;
    for (int j = 0; j < L->n_in; j++) {
        const int cj = concat_c(io, j);
        sf_ref_concat_put(io->x[j], io->n, cj, hw, L->out_ch, c0, io->y);
        c0 += cj;
    }
}

void sf_ref_layer_concat_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    const size_t hw = (size_t)L->out_h * L->out_w;
    int c0 = 0;
    for (int j = 0; j < L->n_in; j++) {
        const int cj = concat_c(io, j);
        if (io->want[j]) {
            sf_ref_concat_take(io->dy, io->n, cj, hw, L->out_ch, c0, io->scratch);
            io->give(io, j, io->scratch);
        }
        c0 += cj;
    }
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* y[n][c0 + c][p] = x[n][c][p] for c < cj (y has ctot channels). */
void SF_FN(sf_ref_concat_put)(const T *x, int n, int cj, size_t hw, int ctot, int c0, T *y)
{
    for (int ni = 0; ni < n; ni++)
        for (size_t e = 0; e < (size_t)cj * hw; e++)
            y[((size_t)ni * ctot + c0) * hw + e] = x[(size_t)ni * cj * hw + e];
}

/* The inverse: dx[n][c][p] = dy[n][c0 + c][p]. */
void SF_FN(sf_ref_concat_take)(const T *dy, int n, int cj, size_t hw, int ctot, int c0, T *dx)
{
    for (int ni = 0; ni < n; ni++)
        for (size_t e = 0; e < (size_t)cj * hw; e++)
            dx[(size_t)ni * cj * hw + e] = dy[((size_t)ni * ctot + c0) * hw + e];
}

/* The inverse through a ReLU whose output the concatenation y holds:
 * dx[n][c][p] = y[n][c0 + c][p] > 0 ? dy[n][c0 + c][p] : 0 (torch's
 * threshold_backward: 0 where y is 0 or NaN). */
void SF_FN(sf_ref_concat_take_masked)(const T *dy, const T *y, int n, int cj, size_t hw, int ctot, int c0, T *dx)
{
    for (int ni = 0; ni < n; ni++)
        for (size_t e = 0; e < (size_t)cj * hw; e++) {
            const size_t w = ((size_t)ni * ctot + c0) * hw + e;
            dx[(size_t)ni * cj * hw + e] = y[w] > 0 ? dy[w] : 0;
        }
}

#endif
