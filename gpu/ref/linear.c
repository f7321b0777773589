/* gpu/ref/linear.c — reference linear layer, forward and backward, in float and
 * double (_f64). Contracts in gpu/ref/ref.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "linear.c"
#include "gpu/ref/generic.h"

/* ---- the linear layer's hooks (gpu/layers.c) ------------------------------ */

/* The rows the layer maps: each sample's features, or each token of a
 * token sequence (L->tokens: the input and the output are [n, T, C]). */
static int linear_rows(const sf_ref_io *io) { return io->L->tokens ? io->n * io->L->in_h : io->n; }

/* Over the channels of a map ("over":"channels") the layer is a 1x1
 * convolution with the same [out, in] weight. */
void sf_ref_layer_linear_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (L->over_channels) {
        sf_ref_conv2d_fwd(io->x[0], io->n, L->in_c, L->in_h, L->in_w, io->w, io->b, L->out_c, 1, 1, 0, io->y);
        return;
    }
    sf_ref_linear_fwd(io->x[0], linear_rows(io), L->in_c, io->w, io->b, L->out_c, io->y);
}

/* The weight and bias gradients stay fp32 under precision=bf16 (cuBLAS
 * writes them so). */
void sf_ref_layer_linear_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    float *dx = io->want[0] ? io->scratch : NULL;
    if (L->over_channels)
        sf_ref_conv2d_bwd(io->x[0], io->n, L->in_c, L->in_h, L->in_w, io->w, L->out_c, 1, 1, 0, io->dy, dx, io->dw,
                          io->db);
    else
        sf_ref_linear_bwd(io->x[0], linear_rows(io), L->in_c, io->w, L->out_c, io->dy, dx, io->dw, io->db);
    if (dx)
        io->give(io, 0, dx);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* y[n][o] = b[o] + sum_i w[o][i] * x[n][i] */
void SF_FN(sf_ref_linear_fwd)(const T *x, int n, int in, const T *wt, const T *b, int out, T *y)
{
    for (int ni = 0; ni < n; ni++) {
        const T *xn = x + (size_t)ni * in;
        for (int o = 0; o < out; o++) {
            const T *wo = wt + (size_t)o * in;
            T acc = 0;
            for (int i = 0; i < in; i++)
                acc += wo[i] * xn[i];
            y[(size_t)ni * out + o] = (b ? b[o] : (T)0) + acc;
        }
    }
}

/* dx[n][i] = sum_o dy[n][o] w[o][i];  dw[o][i] = sum_n dy[n][o] x[n][i];  db[o] = sum_n dy[n][o] */
void SF_FN(sf_ref_linear_bwd)(const T *x, int n, int in, const T *wt, int out, const T *dy, T *dx,
                              T *dw, T *db)
{
    if (dx) {
        for (int ni = 0; ni < n; ni++) {
            T *dxn = dx + (size_t)ni * in;
            for (int i = 0; i < in; i++)
                dxn[i] = 0;
            for (int o = 0; o < out; o++) {
                const T g = dy[(size_t)ni * out + o];
                const T *wo = wt + (size_t)o * in;
                for (int i = 0; i < in; i++)
                    dxn[i] += g * wo[i];
            }
        }
    }
    for (int o = 0; o < out; o++) {
        T *dwo = dw + (size_t)o * in;
        for (int i = 0; i < in; i++)
            dwo[i] = 0;
        for (int ni = 0; ni < n; ni++) {
            const T g = dy[(size_t)ni * out + o];
            const T *xn = x + (size_t)ni * in;
            for (int i = 0; i < in; i++)
                dwo[i] += g * xn[i];
        }
    }
    if (db)
        SF_FN(sf_ref_bias_grad)(dy, n, out, 1, db);
}

/* db[o] = sum_{n,i} dy[n][o][i] over the hw positions i of each channel,
 * accumulated in double (see generic.h) */
void SF_FN(sf_ref_bias_grad)(const T *dy, int n, int c, size_t hw, T *db)
{
    for (int o = 0; o < c; o++) {
        double acc = 0;
        for (int ni = 0; ni < n; ni++) {
            const T *dyp = dy + ((size_t)ni * c + o) * hw;
            for (size_t i = 0; i < hw; i++)
                acc += dyp[i];
        }
        db[o] = acc;
    }
}

#endif
