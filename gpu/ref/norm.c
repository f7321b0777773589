/* gpu/ref/norm.c — reference LayerNorm over the channels of each position,
 * forward and backward, in float and double (_f64), and the hooks of
 * layernorm2d (a [C,H,W] map, torchvision's LayerNorm2d) and layernorm (a
 * flat [F] tensor, or each token of a [T, F] sequence: nn.LayerNorm(F)).
 * Contracts in gpu/ref/layers.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "norm.c"
#include "gpu/ref/generic.h"

/* ---- the layer norm layers' hooks (gpu/layers.c) -------------------------- */

/* Both kinds: [n, C, hw] normalised over C (hw = 1 for a flat tensor); a
 * token sequence [n, T, C] is n*T rows of C. */
static void ln_layout(const sf_ref_io *io, int *rows, size_t *hw)
{
    const sf_layer *L = io->L;
    *rows = L->tokens ? io->n * L->in_h : io->n;
    *hw = L->tokens ? 1 : (size_t)L->in_h * L->in_w;
}

void sf_ref_layer_layernorm_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    int rows;
    size_t hw;
    ln_layout(io, &rows, &hw);
    sf_ref_layernorm_fwd(io->x[0], rows, L->in_c, hw, io->w, io->b, L->eps, io->y);
}

/* The input gradient is computed even when no producer needs it (the
 * weight gradients come from the same pass). */
void sf_ref_layer_layernorm_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    int rows;
    size_t hw;
    ln_layout(io, &rows, &hw);
    sf_ref_layernorm_bwd(io->x[0], rows, L->in_c, hw, io->w, L->eps, io->dy, io->scratch, io->dw, io->db);
    io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* Mean and 1/sqrt(biased variance + eps) over the c values at stride hw
 * from p (two passes, as PyTorch's reference). */
static void SF_FN(ln_stats)(const T *p, int c, size_t hw, T eps, T *mean, T *invstd)
{
    T s = 0;
    for (int ci = 0; ci < c; ci++)
        s += p[(size_t)ci * hw];
    const T mu = s / (T)c;
    T v = 0;
    for (int ci = 0; ci < c; ci++) {
        const T d = p[(size_t)ci * hw] - mu;
        v += d * d;
    }
    *mean = mu;
    *invstd = (T)1 / SF_SQRT(v / (T)c + eps);
}

/* y[n][c][p] = (x - mean[n][p]) * invstd[n][p] * gamma[c] + beta[c] (beta NULL: 0). */
void SF_FN(sf_ref_layernorm_fwd)(const T *x, int n, int c, size_t hw, const T *gamma, const T *beta, T eps, T *y)
{
    for (int ni = 0; ni < n; ni++)
        for (size_t p = 0; p < hw; p++) {
            const T *xp = x + (size_t)ni * c * hw + p;
            T *yp = y + (size_t)ni * c * hw + p;
            T mu, is;
            SF_FN(ln_stats)(xp, c, hw, eps, &mu, &is);
            for (int ci = 0; ci < c; ci++)
                yp[(size_t)ci * hw] = (xp[(size_t)ci * hw] - mu) * is * gamma[ci] + (beta ? beta[ci] : (T)0);
        }
}

/* With xhat = (x - mean) * invstd and g = dy * gamma:
 * dx = invstd * (g - mean_c(g) - xhat * mean_c(g * xhat));
 * dgamma[c] = sum_{n,p} dy * xhat; dbeta[c] = sum_{n,p} dy. dgamma, dbeta may be NULL. */
void SF_FN(sf_ref_layernorm_bwd)(const T *x, int n, int c, size_t hw, const T *gamma, T eps, const T *dy, T *dx,
                                 T *dgamma, T *dbeta)
{
    for (int ci = 0; ci < c; ci++) {
        if (dgamma)
            dgamma[ci] = 0;
        if (dbeta)
            dbeta[ci] = 0;
    }
    for (int ni = 0; ni < n; ni++)
        for (size_t p = 0; p < hw; p++) {
            const size_t base = (size_t)ni * c * hw + p;
            T mu, is;
            SF_FN(ln_stats)(x + base, c, hw, eps, &mu, &is);
            T mg = 0, mgx = 0;
            for (int ci = 0; ci < c; ci++) {
                const size_t e = base + (size_t)ci * hw;
                const T xh = (x[e] - mu) * is, g = dy[e] * gamma[ci];
                mg += g;
                mgx += g * xh;
                if (dgamma)
                    dgamma[ci] += dy[e] * xh;
                if (dbeta)
                    dbeta[ci] += dy[e];
            }
            mg /= (T)c;
            mgx /= (T)c;
            for (int ci = 0; ci < c; ci++) {
                const size_t e = base + (size_t)ci * hw;
                const T xh = (x[e] - mu) * is;
                dx[e] = is * (dy[e] * gamma[ci] - mg - xh * mgx);
            }
        }
}

#endif
