/* gpu/ref/channels.c — reference channel moves of a map: ShuffleNet's
 * channel shuffle, the slice of a channel range (x.chunk, x.split,
 * x[:, a:b]) and the pixel shuffle between channels and space, forward and
 * backward, in float and double (_f64), and the channel_shuffle,
 * channel_slice, pixel_shuffle and pixel_unshuffle hooks. Contracts in
 * gpu/ref/layers.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "channels.c"
#include "gpu/ref/generic.h"

/* ---- the channel_shuffle and channel_slice layers' hooks (gpu/layers.c) ---- */

void sf_ref_layer_channel_shuffle_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_channel_shuffle(io->x[0], io->n, L->out_ch, (size_t)L->out_h * L->out_w, L->groups, io->y);
}

/* A shuffle by g is undone by a shuffle by C/g. */
void sf_ref_layer_channel_shuffle_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_channel_shuffle(io->dy, io->n, L->out_ch, (size_t)L->out_h * L->out_w, L->out_ch / L->groups,
                           io->scratch);
    io->give(io, 0, io->scratch);
}

void sf_ref_layer_channel_slice_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_channel_slice_fwd(io->x[0], io->n, L->in_c, (size_t)L->out_h * L->out_w, L->start, L->count, io->y);
}

void sf_ref_layer_channel_slice_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_channel_slice_bwd(io->dy, io->n, L->in_c, (size_t)L->out_h * L->out_w, L->start, L->count,
                             io->scratch);
    io->give(io, 0, io->scratch);
}

/* pixel_shuffle's small side is its input, pixel_unshuffle's its output;
 * the backward of each is the other. */
void sf_ref_layer_pixel_shuffle_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_pixel_shuffle(io->x[0], io->n, L->out_ch, L->in_h, L->in_w, L->scale, 0, io->y);
}

void sf_ref_layer_pixel_shuffle_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_pixel_shuffle(io->dy, io->n, L->out_ch, L->in_h, L->in_w, L->scale, 1, io->scratch);
    io->give(io, 0, io->scratch);
}

void sf_ref_layer_pixel_unshuffle_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_pixel_shuffle(io->x[0], io->n, L->in_c, L->out_h, L->out_w, L->scale, 1, io->y);
}

void sf_ref_layer_pixel_unshuffle_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_pixel_shuffle(io->dy, io->n, L->in_c, L->out_h, L->out_w, L->scale, 0, io->scratch);
    io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* y[n][j * g + i][p] = x[n][i * (c / g) + j][p]: PyTorch's
 * x.view(n, g, c / g, h, w).transpose(1, 2).reshape(n, c, h, w). */
void SF_FN(sf_ref_channel_shuffle)(const T *x, int n, int c, size_t hw, int g, T *y)
{
    const int per = c / g;
    for (int ni = 0; ni < n; ni++)
        for (int i = 0; i < g; i++)
            for (int j = 0; j < per; j++) {
                const T *src = x + ((size_t)ni * c + (size_t)i * per + j) * hw;
                T *dst = y + ((size_t)ni * c + (size_t)j * g + i) * hw;
                for (size_t p = 0; p < hw; p++)
                    dst[p] = src[p];
            }
}

/* y[n][k][p] = x[n][start + k][p] for k < count (x has c channels): the
 * take of one input's channels out of a concatenation (concat.c). */
void SF_FN(sf_ref_channel_slice_fwd)(const T *x, int n, int c, size_t hw, int start, int count, T *y)
{
    SF_FN(sf_ref_concat_take)(x, n, count, hw, c, start, y);
}

/* dx ([n, c, hw]) is dy in the channels [start, start + count) and 0 in
 * every other: the whole input gradient, as the backend adds it. */
void SF_FN(sf_ref_channel_slice_bwd)(const T *dy, int n, int c, size_t hw, int start, int count, T *dx)
{
    for (size_t e = 0; e < (size_t)n * c * hw; e++)
        dx[e] = (T)0;
    SF_FN(sf_ref_concat_put)(dy, n, count, hw, c, start, dx);
}

/* The small side is [n, c * r * r, h, w], the large one [n, c, h * r, w * r];
 * inverse 0 writes the large from the small (PyTorch's pixel_shuffle),
 * inverse 1 the small from the large (pixel_unshuffle). */
void SF_FN(sf_ref_pixel_shuffle)(const T *x, int n, int c, int h, int w, int r, int inverse, T *y)
{
    const size_t H = (size_t)h * r, W = (size_t)w * r;
    for (int ni = 0; ni < n; ni++)
        for (int ci = 0; ci < c; ci++)
            for (int i = 0; i < r; i++)
                for (int j = 0; j < r; j++)
                    for (int hh = 0; hh < h; hh++)
                        for (int ww = 0; ww < w; ww++) {
                            const size_t small =
                                ((((size_t)ni * c + ci) * r * r + (size_t)i * r + j) * h + hh) * w + ww;
                            const size_t large =
                                (((size_t)ni * c + ci) * H + (size_t)hh * r + i) * W + (size_t)ww * r + j;
                            if (inverse)
                                y[small] = x[large];
                            else
                                y[large] = x[small];
                        }
}

#endif
