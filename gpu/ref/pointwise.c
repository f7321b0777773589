/* gpu/ref/pointwise.c — reference ReLU and residual add in float and double
 * (_f64). Contracts in gpu/ref/ref.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

/* Generated for double too, but declared in ref.h for float only: declared
 * here so the definition has a prototype. */
void sf_ref_add_fwd_f64(const double *a, const double *b, size_t len, double *y);

#define SF_REF_SELF "pointwise.c"
#include "gpu/ref/generic.h"

/* ---- the relu and add layers' hooks (gpu/layers.c) ------------------------ */

size_t sf_ref_in_elems(const sf_ref_io *io, int j)
{
    const int src = sf_layer_input(io->m, io->li, j);
    return src == SF_IN_MODEL ? (size_t)io->m->in_c * io->m->in_h * io->m->in_w : io->m->layers[src].out_elems;
}

void sf_ref_layer_relu_fwd(const sf_ref_io *io)
{
    sf_ref_relu_fwd(io->x[0], (size_t)io->n * io->L->out_elems, io->y);
}

void sf_ref_layer_relu_bwd(const sf_ref_io *io)
{
    if (!io->want[0])
        return;
    sf_ref_relu_bwd(io->y, io->dy, (size_t)io->n * io->L->out_elems, io->scratch);
    io->give(io, 0, io->scratch);
}

void sf_ref_layer_add_fwd(const sf_ref_io *io)
{
    sf_ref_add_fwd(io->x[0], io->x[1], (size_t)io->n * io->L->out_elems, io->y);
}

/* dy passes unchanged to both inputs. */
void sf_ref_layer_add_bwd(const sf_ref_io *io)
{
    io->give(io, 0, (float *)io->dy);
    io->give(io, 1, (float *)io->dy);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* y = max(x, 0); NaN propagates (as torch.relu). x == y is allowed. */
void SF_FN(sf_ref_relu_fwd)(const T *x, size_t len, T *y)
{
    for (size_t i = 0; i < len; i++)
        y[i] = x[i] < (T)0 ? (T)0 : x[i];
}

/* dx = dy where y > 0, else 0. dx == dy is allowed. */
void SF_FN(sf_ref_relu_bwd)(const T *y, const T *dy, size_t len, T *dx)
{
    for (size_t i = 0; i < len; i++)
        dx[i] = y[i] > (T)0 ? dy[i] : (T)0;
}

/* y = a + b; y may be a or b (in place). The backward is dy for both inputs:
 * no function, the caller passes dy on. */
void SF_FN(sf_ref_add_fwd)(const T *a, const T *b, size_t len, T *y)
{
    for (size_t i = 0; i < len; i++)
        y[i] = a[i] + b[i];
}

#endif
