/* gpu/ref/mul.c — reference elementwise multiplication by a tensor of the
 * same shape or one broadcast over H,W ([C,1,1]: squeeze-and-excitation),
 * and by a per-channel parameter (ConvNeXt's layer scale), forward and
 * backward, in float and double (_f64), and the mul, layer_scale and
 * scale_shift hooks.
 * Contracts in gpu/ref/layers.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "mul.c"
#include "gpu/ref/generic.h"

/* ---- the mul and layer_scale layers' hooks (gpu/layers.c) ----------------- */

/* b's elements per channel: hw (same shape) or 1 (broadcast over H,W). */
static size_t mul_b_hw(const sf_ref_io *io)
{
    return sf_ref_in_elems(io, 1) == io->L->out_elems ? (size_t)io->L->in_h * io->L->in_w : 1;
}

void sf_ref_layer_mul_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_mul_fwd(io->x[0], io->x[1], io->n, L->in_c, (size_t)L->in_h * L->in_w, mul_b_hw(io), io->y);
}

void sf_ref_layer_mul_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    const size_t hw = (size_t)L->in_h * L->in_w, bhw = mul_b_hw(io);
    if (io->want[0]) {
        sf_ref_mul_bwd(io->x[0], io->x[1], io->n, L->in_c, hw, bhw, io->dy, io->scratch, NULL);
        io->give(io, 0, io->scratch);
    }
    if (io->want[1]) {
        sf_ref_mul_bwd(io->x[0], io->x[1], io->n, L->in_c, hw, bhw, io->dy, NULL, io->scratch);
        io->give(io, 1, io->scratch);
    }
}

/* A token sequence [n, t, c] is token-major: n * t rows of c channels,
 * each a [c, 1] map to the channel scale. */
static int scale_rows(const sf_ref_io *io) { return io->L->tokens ? io->n * io->L->in_h : io->n; }
static size_t scale_hw(const sf_layer *L) { return L->tokens ? 1 : (size_t)L->in_h * L->in_w; }

void sf_ref_layer_layer_scale_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_channel_scale_fwd(io->x[0], scale_rows(io), L->in_c, scale_hw(L), io->w, io->y);
}

void sf_ref_layer_layer_scale_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_channel_scale_bwd(io->x[0], scale_rows(io), L->in_c, scale_hw(L), io->w, io->dy,
                             io->want[0] ? io->scratch : NULL, io->dw);
    if (io->want[0])
        io->give(io, 0, io->scratch);
}

/* scale_shift: one weight for the whole tensor is one channel of all of a
 * sample's elements; per channel, as layer_scale's rows. */
static void scale_shift_dims(const sf_ref_io *io, int *rows, int *c, size_t *hw)
{
    const sf_layer *L = io->L;
    if (L->num_parameters == 1) {
        *rows = io->n, *c = 1, *hw = L->out_elems;
    } else {
        *rows = scale_rows(io), *c = L->in_c, *hw = scale_hw(L);
    }
}

void sf_ref_layer_scale_shift_fwd(const sf_ref_io *io)
{
    int rows, c;
    size_t hw;
    scale_shift_dims(io, &rows, &c, &hw);
    sf_ref_channel_scale_fwd(io->x[0], rows, c, hw, io->w, io->y);
    if (io->b)
        sf_ref_channel_shift(io->y, rows, c, hw, io->b);
}

void sf_ref_layer_scale_shift_bwd(const sf_ref_io *io)
{
    int rows, c;
    size_t hw;
    scale_shift_dims(io, &rows, &c, &hw);
    sf_ref_channel_scale_bwd(io->x[0], rows, c, hw, io->w, io->dy, io->want[0] ? io->scratch : NULL, io->dw);
    if (io->db)
        sf_ref_bias_grad(io->dy, rows, c, hw, io->db);
    if (io->want[0])
        io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* y[n][c][p] = a[n][c][p] * b[n][c][bhw == 1 ? 0 : p]. */
void SF_FN(sf_ref_mul_fwd)(const T *a, const T *b, int n, int c, size_t hw, size_t bhw, T *y)
{
    for (size_t nc = 0; nc < (size_t)n * c; nc++)
        for (size_t p = 0; p < hw; p++)
            y[nc * hw + p] = a[nc * hw + p] * b[nc * bhw + (bhw == 1 ? 0 : p)];
}

/* da = dy * b (broadcast); db = dy * a, summed over H,W when b is broadcast.
 * Either output may be NULL. */
void SF_FN(sf_ref_mul_bwd)(const T *a, const T *b, int n, int c, size_t hw, size_t bhw, const T *dy, T *da, T *db)
{
    for (size_t nc = 0; nc < (size_t)n * c; nc++) {
        T acc = 0;
        for (size_t p = 0; p < hw; p++) {
            const size_t e = nc * hw + p;
            if (da)
                da[e] = dy[e] * b[nc * bhw + (bhw == 1 ? 0 : p)];
            if (db && bhw != 1)
                db[e] = dy[e] * a[e];
            acc += dy[e] * a[e];
        }
        if (db && bhw == 1)
            db[nc] = acc;
    }
}

/* y[n][c][p] = x[n][c][p] * s[c]. */
void SF_FN(sf_ref_channel_scale_fwd)(const T *x, int n, int c, size_t hw, const T *s, T *y)
{
    for (int ni = 0; ni < n; ni++)
        for (int ci = 0; ci < c; ci++)
            for (size_t p = 0; p < hw; p++) {
                const size_t e = ((size_t)ni * c + ci) * hw + p;
                y[e] = x[e] * s[ci];
            }
}

/* y[n][c][p] += b[c]. */
void SF_FN(sf_ref_channel_shift)(T *y, int n, int c, size_t hw, const T *b)
{
    for (int ni = 0; ni < n; ni++)
        for (int ci = 0; ci < c; ci++)
            for (size_t p = 0; p < hw; p++)
                y[((size_t)ni * c + ci) * hw + p] += b[ci];
}

/* dx = dy * s[c] (dx may be NULL); ds[c] = sum_{n,p} dy * x, accumulated in
 * double (see generic.h). */
void SF_FN(sf_ref_channel_scale_bwd)(const T *x, int n, int c, size_t hw, const T *s, const T *dy, T *dx, T *ds)
{
    for (int ci = 0; ci < c; ci++) {
        double acc = 0;
        for (int ni = 0; ni < n; ni++)
            for (size_t p = 0; p < hw; p++) {
                const size_t e = ((size_t)ni * c + ci) * hw + p;
                acc += (double)dy[e] * x[e];
                if (dx)
                    dx[e] = dy[e] * s[ci];
            }
        ds[ci] = acc;
    }
}

#endif
