/* gpu/ref/groupnorm.c — reference GroupNorm (nn.GroupNorm, with or without
 * its weight and bias) over a [C,H,W] map or flat [C] features, forward and
 * backward, in float and double (_f64), and the groupnorm layer's hooks.
 * Contracts in gpu/ref/layers.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "groupnorm.c"
#include "gpu/ref/generic.h"

/* ---- the groupnorm layer's hooks (gpu/layers.c) ------------------------------ */

void sf_ref_layer_groupnorm_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_groupnorm_fwd(io->x[0], io->n, L->in_c, (size_t)L->in_h * L->in_w, L->groups, io->w, io->b, L->eps,
                         io->y);
}

/* The input gradient is computed even when no producer needs it (the
 * weight gradients come from the same pass). Without affine io->w, io->dw
 * and io->db are NULL (the layer has no parameters). */
void sf_ref_layer_groupnorm_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_groupnorm_bwd(io->x[0], io->n, L->in_c, (size_t)L->in_h * L->in_w, L->groups, io->w, L->eps, io->dy,
                         io->scratch, io->dw, io->db);
    io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* Mean and 1/sqrt(biased variance + eps) of the m values from p (one group
 * of one sample: its channels are contiguous in NCHW), two passes. */
static void SF_FN(gn_stats)(const T *p, size_t m, T eps, T *mean, T *invstd)
{
    T s = 0;
    for (size_t e = 0; e < m; e++)
        s += p[e];
    const T mu = s / (T)m;
    T v = 0;
    for (size_t e = 0; e < m; e++)
        v += (p[e] - mu) * (p[e] - mu);
    *mean = mu;
    *invstd = (T)1 / SF_SQRT(v / (T)m + eps);
}

/* y = (x - mean) * invstd * gamma[c] + beta[c] (gamma, beta NULL: 1 and 0),
 * the statistics of each sample's group of c / g channels. */
void SF_FN(sf_ref_groupnorm_fwd)(const T *x, int n, int c, size_t hw, int g, const T *gamma, const T *beta, float eps,
                                 T *y)
{
    const int cg = c / g;
    const size_t m = (size_t)cg * hw;
    for (int ni = 0; ni < n; ni++)
        for (int gi = 0; gi < g; gi++) {
            const size_t o = ((size_t)ni * c + (size_t)gi * cg) * hw;
            T mu, is;
            SF_FN(gn_stats)(x + o, m, (T)eps, &mu, &is);
            for (int k = 0; k < cg; k++) {
                const int ch = gi * cg + k;
                const T ga = gamma ? gamma[ch] : (T)1, be = beta ? beta[ch] : (T)0;
                for (size_t p = 0; p < hw; p++) {
                    const size_t e = o + (size_t)k * hw + p;
                    y[e] = (x[e] - mu) * is * ga + be;
                }
            }
        }
}

/* dx = invstd * (u - mean(u) - xhat * mean(u * xhat)) over each group, with
 * u = dy * gamma[c] (dy where gamma is NULL); dgamma[c] = sum dy * xhat,
 * dbeta[c] = sum dy over the samples and positions (written; NULL: none). */
void SF_FN(sf_ref_groupnorm_bwd)(const T *x, int n, int c, size_t hw, int g, const T *gamma, float eps, const T *dy,
                                 T *dx, T *dgamma, T *dbeta)
{
    const int cg = c / g;
    const size_t m = (size_t)cg * hw;
    for (int ch = 0; ch < c; ch++) {
        if (dgamma)
            dgamma[ch] = 0;
        if (dbeta)
            dbeta[ch] = 0;
    }
    for (int ni = 0; ni < n; ni++)
        for (int gi = 0; gi < g; gi++) {
            const size_t o = ((size_t)ni * c + (size_t)gi * cg) * hw;
            T mu, is;
            SF_FN(gn_stats)(x + o, m, (T)eps, &mu, &is);
            T su = 0, sux = 0;
            for (int k = 0; k < cg; k++) {
                const int ch = gi * cg + k;
                const T ga = gamma ? gamma[ch] : (T)1;
                for (size_t p = 0; p < hw; p++) {
                    const size_t e = o + (size_t)k * hw + p;
                    const T xh = (x[e] - mu) * is, u = dy[e] * ga;
                    su += u;
                    sux += u * xh;
                    if (dgamma) {
                        dgamma[ch] += dy[e] * xh;
                        if (dbeta)
                            dbeta[ch] += dy[e];
                    }
                }
            }
            su /= (T)m;
            sux /= (T)m;
            for (int k = 0; k < cg; k++) {
                const int ch = gi * cg + k;
                const T ga = gamma ? gamma[ch] : (T)1;
                for (size_t p = 0; p < hw; p++) {
                    const size_t e = o + (size_t)k * hw + p;
                    const T xh = (x[e] - mu) * is;
                    dx[e] = is * (dy[e] * ga - su - xh * sux);
                }
            }
        }
}

#endif
