/* gpu/ref/batchnorm.c — reference BatchNorm2d (training forward, eval forward,
 * training backward) in float and double (_f64). Contracts in gpu/ref/ref.h. */
#ifndef T
#include "ref.h"
#include "layer_io.h"

#include <math.h>

/* Generated for double too, but declared in ref.h for float only: declared
 * here so the definition has a prototype. */
void sf_ref_bn2d_fwd_eval_f64(const double *x, int n, int c, int h, int w, const double *gamma,
                              const double *beta, double eps, const double *running_mean,
                              const double *running_var, double *y);

#define SF_REF_SELF "batchnorm.c"
#include "generic.h"

/* ---- the batchnorm2d layer's hooks (gpu/layers.c) ------------------------- */

/* Saved for the backward: the batch mean, then 1/sqrt(var + eps), [C] each. */
size_t sf_ref_layer_bn2d_save(const sf_layer *L, size_t nb) { return 2 * (size_t)L->out_ch; }

/* Training mode (of a trainable layer): batch statistics, and the running
 * ones updated; else the running statistics. */
void sf_ref_layer_bn2d_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (io->train && !L->frozen)
        sf_ref_bn2d_fwd_train(io->x[0], io->n, L->in_c, L->in_h, L->in_w, io->w, io->b, L->eps, L->momentum,
                              io->rm, io->rv, io->save, io->save + L->out_ch, io->y);
    else
        sf_ref_bn2d_fwd_eval(io->x[0], io->n, L->in_c, L->in_h, L->in_w, io->w, io->b, L->eps, io->rm, io->rv,
                             io->y);
}

/* The input gradient is computed even when no producer needs it: the
 * scratch holds it. */
void sf_ref_layer_bn2d_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_bn2d_bwd(io->x[0], io->n, L->in_c, L->in_h, L->in_w, io->w, io->save, io->save + L->out_ch, io->dy,
                    io->scratch, io->dw, io->db);
    io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* Training mode. Per channel, over the cnt = n*h*w values:
 *   mean = sum x / cnt;  var = sum (x - mean)^2 / cnt  (biased, two passes);
 *   invstd = 1 / sqrt(var + eps);  y = gamma * (x - mean) * invstd + beta;
 *   running_mean = (1 - m) * running_mean + m * mean;
 *   running_var  = (1 - m) * running_var  + m * var * cnt / (cnt - 1)  (unbiased).
 * PyTorch refuses cnt == 1 in training ("Expected more than 1 value per
 * channel"); here the unbiased variance is then NaN, so running_var becomes
 * NaN rather than silently wrong. running_mean/running_var may both be NULL
 * (track_running_stats=False). */
void SF_FN(sf_ref_bn2d_fwd_train)(const T *x, int n, int c, int h, int w, const T *gamma,
                                  const T *beta, T eps, T momentum, T *running_mean,
                                  T *running_var, T *save_mean, T *save_invstd, T *y)
{
    const size_t hw = (size_t)h * w;
    const size_t cnt = (size_t)n * hw;
    for (int ci = 0; ci < c; ci++) {
        T sum = 0;
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++)
                sum += xp[i];
        }
        const T mean = sum / (T)cnt;
        T sq = 0;
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++)
                sq += (xp[i] - mean) * (xp[i] - mean);
        }
        const T var = sq / (T)cnt;
        const T invstd = (T)1 / SF_SQRT(var + eps);
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            T *yp = y + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++)
                yp[i] = gamma[ci] * ((xp[i] - mean) * invstd) + beta[ci];
        }
        save_mean[ci] = mean;
        save_invstd[ci] = invstd;
        if (running_mean && running_var) {
            const T unbiased = cnt > 1 ? sq / (T)(cnt - 1) : (T)NAN;
            running_mean[ci] = ((T)1 - momentum) * running_mean[ci] + momentum * mean;
            running_var[ci] = ((T)1 - momentum) * running_var[ci] + momentum * unbiased;
        }
    }
}

/* Eval mode: y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta. */
void SF_FN(sf_ref_bn2d_fwd_eval)(const T *x, int n, int c, int h, int w, const T *gamma,
                                 const T *beta, T eps, const T *running_mean, const T *running_var,
                                 T *y)
{
    const size_t hw = (size_t)h * w;
    for (int ci = 0; ci < c; ci++) {
        const T invstd = (T)1 / SF_SQRT(running_var[ci] + eps);
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            T *yp = y + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++)
                yp[i] = gamma[ci] * ((xp[i] - running_mean[ci]) * invstd) + beta[ci];
        }
    }
}

/* Backward of training mode (the batch statistics depend on x). Per channel,
 * with xhat = (x - mean) * invstd over the cnt = n*h*w values:
 *   dbeta  = sum dy;  dgamma = sum dy * xhat;
 *   dx     = gamma * invstd / cnt * (cnt * dy - dbeta - xhat * dgamma). */
void SF_FN(sf_ref_bn2d_bwd)(const T *x, int n, int c, int h, int w, const T *gamma,
                            const T *save_mean, const T *save_invstd, const T *dy, T *dx,
                            T *dgamma, T *dbeta)
{
    const size_t hw = (size_t)h * w;
    const size_t cnt = (size_t)n * hw;
    for (int ci = 0; ci < c; ci++) {
        const T mean = save_mean[ci], invstd = save_invstd[ci];
        T sum_dy = 0, sum_dy_xhat = 0;
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            const T *dyp = dy + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++) {
                sum_dy += dyp[i];
                sum_dy_xhat += dyp[i] * ((xp[i] - mean) * invstd);
            }
        }
        dbeta[ci] = sum_dy;
        dgamma[ci] = sum_dy_xhat;
        const T scale = gamma[ci] * invstd / (T)cnt;
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            const T *dyp = dy + ((size_t)ni * c + ci) * hw;
            T *dxp = dx + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++) {
                const T xhat = (xp[i] - mean) * invstd;
                dxp[i] = scale * ((T)cnt * dyp[i] - sum_dy - xhat * sum_dy_xhat);
            }
        }
    }
}

#endif
