/* gpu/ref/log_softmax.c — reference log_softmax over the features of a flat
 * tensor (F.log_softmax(x, dim=1) on [N, F]), forward and backward, in float
 * and double (_f64), and the log_softmax layer's hooks. Contracts in
 * gpu/ref/layers.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "log_softmax.c"
#include "gpu/ref/generic.h"

/* ---- the log_softmax layer's hooks (gpu/layers.c) ----------------------------- */

void sf_ref_layer_log_softmax_fwd(const sf_ref_io *io)
{
    sf_ref_log_softmax_fwd(io->x[0], io->n, io->L->out_ch, io->y);
}

void sf_ref_layer_log_softmax_bwd(const sf_ref_io *io)
{
    if (!io->want[0])
        return;
    sf_ref_log_softmax_bwd(io->x[0], io->dy, io->n, io->L->out_ch, io->scratch);
    io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* log(sum(exp(x[0..f)))), shifted by the row's maximum so that no exp
 * overflows (PyTorch's order: the maximum, then the sum of exp(x - max)). */
static T SF_FN(row_lse)(const T *x, int f)
{
    T mx = x[0];
    for (int j = 1; j < f; j++)
        mx = x[j] > mx ? x[j] : mx;
    T s = 0;
    for (int j = 0; j < f; j++)
        s += SF_EXP(x[j] - mx);
    return mx + SF_LOG(s);
}

/* y[i][j] = x[i][j] - log(sum_k exp(x[i][k])). */
void SF_FN(sf_ref_log_softmax_fwd)(const T *x, int n, int f, T *y)
{
    for (int i = 0; i < n; i++) {
        const T *xr = x + (size_t)i * f;
        const T lse = SF_FN(row_lse)(xr, f);
        for (int j = 0; j < f; j++)
            y[(size_t)i * f + j] = xr[j] - lse;
    }
}

/* dx[i][j] = dy[i][j] - softmax(x[i])[j] * sum_k dy[i][k]. */
void SF_FN(sf_ref_log_softmax_bwd)(const T *x, const T *dy, int n, int f, T *dx)
{
    for (int i = 0; i < n; i++) {
        const T *xr = x + (size_t)i * f, *dr = dy + (size_t)i * f;
        const T lse = SF_FN(row_lse)(xr, f);
        T sdy = 0;
        for (int j = 0; j < f; j++)
            sdy += dr[j];
        for (int j = 0; j < f; j++)
            dx[(size_t)i * f + j] = dr[j] - SF_EXP(xr[j] - lse) * sdy;
    }
}

#endif
