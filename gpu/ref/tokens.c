/* gpu/ref/tokens.c — reference token-sequence layers of a Vision
 * Transformer, forward and backward, in float and double (_f64): a map as
 * tokens (to_tokens) and back (to_map), the class token in front (class_token), the position
 * embedding (pos_embedding), the first token as features (select_token),
 * the tokens' mean (token_mean) and the sequence transposed
 * (transpose_tokens), and their hooks. A token sequence is [n, t, c], token-major. Contracts in
 * gpu/ref/layers.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "tokens.c"
#include "gpu/ref/generic.h"

/* ---- the token layers' hooks (gpu/layers.c) ------------------------------- */

/* [C, H*W] channel-major to [H*W, C] token-major: a transpose per sample. */
void sf_ref_layer_to_tokens_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_transpose(io->x[0], io->n, L->in_c, L->in_h * L->in_w, io->y);
}

void sf_ref_layer_to_tokens_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_transpose(io->dy, io->n, L->in_h * L->in_w, L->in_c, io->scratch);
    io->give(io, 0, io->scratch);
}

/* [h*w, C] token-major back to [C, h*w] channel-major: to_tokens' inverse. */
void sf_ref_layer_to_map_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_transpose(io->x[0], io->n, L->in_h, L->in_c, io->y);
}

void sf_ref_layer_to_map_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_transpose(io->dy, io->n, L->in_c, L->in_h, io->scratch);
    io->give(io, 0, io->scratch);
}

void sf_ref_layer_class_token_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_prepend_token_fwd(io->x[0], io->n, L->in_h, L->in_c, io->w, io->y);
}

void sf_ref_layer_class_token_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_prepend_token_bwd(io->dy, io->n, L->in_h, L->in_c, io->want[0] ? io->scratch : NULL, io->dw);
    if (io->want[0])
        io->give(io, 0, io->scratch);
}

void sf_ref_layer_pos_embedding_fwd(const sf_ref_io *io)
{
    sf_ref_add_bcast_fwd(io->x[0], io->n, io->L->out_elems, io->w, io->y);
}

/* The input's gradient is dy itself. */
void sf_ref_layer_pos_embedding_bwd(const sf_ref_io *io)
{
    if (io->dw)
        sf_ref_add_bcast_bwd(io->dy, io->n, io->L->out_elems, io->dw);
    io->give(io, 0, (float *)io->dy);
}

void sf_ref_layer_select_token_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_select_token_fwd(io->x[0], io->n, L->in_h, L->in_c, io->y);
}

void sf_ref_layer_select_token_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_select_token_bwd(io->dy, io->n, L->in_h, L->in_c, io->scratch);
    io->give(io, 0, io->scratch);
}

/* [T, C] to [C, T] per sample, and its gradient back. */
void sf_ref_layer_transpose_tokens_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_transpose(io->x[0], io->n, L->in_h, L->in_c, io->y);
}

void sf_ref_layer_transpose_tokens_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_transpose(io->dy, io->n, L->in_c, L->in_h, io->scratch);
    io->give(io, 0, io->scratch);
}

void sf_ref_layer_token_mean_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_token_mean_fwd(io->x[0], io->n, L->in_h, L->in_c, L->start, io->y);
}

void sf_ref_layer_token_mean_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_token_mean_bwd(io->dy, io->n, L->in_h, L->in_c, L->start, io->scratch);
    io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* y[n][j][i] = x[n][i][j] for each sample's [rows, cols] matrix. */
void SF_FN(sf_ref_transpose)(const T *x, int n, int rows, int cols, T *y)
{
    const size_t per = (size_t)rows * cols;
    for (int ni = 0; ni < n; ni++) {
        const T *xs = x + (size_t)ni * per;
        T *ys = y + (size_t)ni * per;
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++)
                ys[(size_t)j * rows + i] = xs[(size_t)i * cols + j];
    }
}

/* y[n][0][:] = cls; y[n][1 + i][:] = x[n][i][:] (x: [n, t, c], y: [n, t+1, c]). */
void SF_FN(sf_ref_prepend_token_fwd)(const T *x, int n, int t, int c, const T *cls, T *y)
{
    for (int ni = 0; ni < n; ni++) {
        T *ys = y + (size_t)ni * (t + 1) * c;
        const T *xs = x + (size_t)ni * t * c;
        for (int ci = 0; ci < c; ci++)
            ys[ci] = cls[ci];
        for (size_t e = 0; e < (size_t)t * c; e++)
            ys[c + e] = xs[e];
    }
}

/* dcls = sum_n dy[n][0][:]; dx[n][i] = dy[n][1 + i] (dx, dcls may be NULL). */
void SF_FN(sf_ref_prepend_token_bwd)(const T *dy, int n, int t, int c, T *dx, T *dcls)
{
    if (dcls)
        for (int ci = 0; ci < c; ci++) {
            T acc = 0;
            for (int ni = 0; ni < n; ni++)
                acc += dy[(size_t)ni * (t + 1) * c + ci];
            dcls[ci] = acc;
        }
    if (dx)
        for (int ni = 0; ni < n; ni++)
            for (size_t e = 0; e < (size_t)t * c; e++)
                dx[(size_t)ni * t * c + e] = dy[(size_t)ni * (t + 1) * c + c + e];
}

/* y[n][e] = x[n][e] + p[e] over [n, len]. */
void SF_FN(sf_ref_add_bcast_fwd)(const T *x, int n, size_t len, const T *p, T *y)
{
    for (int ni = 0; ni < n; ni++)
        for (size_t e = 0; e < len; e++)
            y[(size_t)ni * len + e] = x[(size_t)ni * len + e] + p[e];
}

/* dp[e] = sum_n dy[n][e]. */
void SF_FN(sf_ref_add_bcast_bwd)(const T *dy, int n, size_t len, T *dp)
{
    for (size_t e = 0; e < len; e++) {
        T acc = 0;
        for (int ni = 0; ni < n; ni++)
            acc += dy[(size_t)ni * len + e];
        dp[e] = acc;
    }
}

/* y[n][:] = x[n][0][:] (x: [n, t, c], y: [n, c]). */
void SF_FN(sf_ref_select_token_fwd)(const T *x, int n, int t, int c, T *y)
{
    for (int ni = 0; ni < n; ni++)
        for (int ci = 0; ci < c; ci++)
            y[(size_t)ni * c + ci] = x[(size_t)ni * t * c + ci];
}

/* dx[n][0][:] = dy[n][:], every other token's gradient 0. */
void SF_FN(sf_ref_select_token_bwd)(const T *dy, int n, int t, int c, T *dx)
{
    for (int ni = 0; ni < n; ni++) {
        T *ds = dx + (size_t)ni * t * c;
        for (size_t e = 0; e < (size_t)t * c; e++)
            ds[e] = 0;
        for (int ci = 0; ci < c; ci++)
            ds[ci] = dy[(size_t)ni * c + ci];
    }
}

/* y[n][:] = the sum of x[n][start..t-1][:] over the tokens, divided by their
 * count (as PyTorch's mean: a sum, then one division). */
void SF_FN(sf_ref_token_mean_fwd)(const T *x, int n, int t, int c, int start, T *y)
{
    for (int ni = 0; ni < n; ni++)
        for (int ci = 0; ci < c; ci++) {
            T acc = 0;
            for (int ti = start; ti < t; ti++)
                acc += x[((size_t)ni * t + ti) * c + ci];
            y[(size_t)ni * c + ci] = acc / (T)(t - start);
        }
}

void SF_FN(sf_ref_token_mean_bwd)(const T *dy, int n, int t, int c, int start, T *dx)
{
    for (int ni = 0; ni < n; ni++)
        for (int ti = 0; ti < t; ti++)
            for (int ci = 0; ci < c; ci++)
                dx[((size_t)ni * t + ti) * c + ci] = ti < start ? 0 : dy[(size_t)ni * c + ci] / (T)(t - start);
}

#endif
