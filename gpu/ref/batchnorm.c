/* gpu/ref/batchnorm.c — reference BatchNorm2d (training forward, eval forward,
 * training backward) in float and double (_f64). Contracts in gpu/ref/ref.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

/* Generated for double too, but declared in ref.h for float only: declared
 * here so the definition has a prototype. */
void sf_ref_bn2d_fwd_eval_f64(const double *x, int n, int c, int h, int w, const double *gamma,
                              const double *beta, double eps, const double *running_mean,
                              const double *running_var, double *y);

#define SF_REF_SELF "batchnorm.c"
#include "gpu/ref/generic.h"

/* ---- batchnorm over the samples of several ranks (gpu/ref/layers.h) ------- */

void sf_ref_bn2d_sync_stat_sums(const float *x, int n, int c, int h, int w, double *sums)
{
    const size_t hw = (size_t)h * w;
    for (int ci = 0; ci < c; ci++) {
        double s = 0, sq = 0;
        for (int ni = 0; ni < n; ni++) {
            const float *xp = x + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++) {
                s += xp[i];
                sq += (double)xp[i] * xp[i];
            }
        }
        sums[ci] = s;
        sums[c + ci] = sq;
    }
    sums[2 * c] = (double)n * (double)hw;
}

/* The variance is E[x^2] - mean^2 from sums in double: a float32 input
 * carries 24 bits, so the cancellation leaves far more than float32's
 * precision unless the mean is about 2^14 standard deviations from 0. */
void sf_ref_bn2d_sync_fwd(const float *x, int n, int c, int h, int w, const float *gamma, const float *beta,
                          float eps, float momentum, const double *sums, float *running_mean, float *running_var,
                          float *save_mean, float *save_invstd, float *y)
{
    const size_t hw = (size_t)h * w;
    const double cnt = sums[2 * c];
    for (int ci = 0; ci < c; ci++) {
        const double dmean = cnt > 0 ? sums[ci] / cnt : 0.0;
        double dvar = cnt > 0 ? sums[c + ci] / cnt - dmean * dmean : 0.0;
        if (dvar < 0)
            dvar = 0;
        const float mean = (float)dmean, var = (float)dvar;
        const float invstd = 1.0f / sqrtf(var + eps);
        for (int ni = 0; ni < n; ni++) {
            const float *xp = x + ((size_t)ni * c + ci) * hw;
            float *yp = y + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++)
                yp[i] = gamma[ci] * ((xp[i] - mean) * invstd) + beta[ci];
        }
        save_mean[ci] = mean;
        save_invstd[ci] = invstd;
        if (running_mean && running_var && cnt > 0) {
            const float unbiased = cnt > 1 ? (float)(dvar * cnt / (cnt - 1)) : NAN;
            running_mean[ci] = (1.0f - momentum) * running_mean[ci] + momentum * mean;
            running_var[ci] = (1.0f - momentum) * running_var[ci] + momentum * unbiased;
        }
    }
}

void sf_ref_bn2d_sync_grad_sums(const float *x, int n, int c, int h, int w, const float *save_mean,
                                const float *save_invstd, const float *dy, double *sums)
{
    const size_t hw = (size_t)h * w;
    for (int ci = 0; ci < c; ci++) {
        const float mean = save_mean[ci], invstd = save_invstd[ci];
        double s = 0, sx = 0;
        for (int ni = 0; ni < n; ni++) {
            const float *xp = x + ((size_t)ni * c + ci) * hw;
            const float *dyp = dy + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++) {
                s += dyp[i];
                sx += (double)dyp[i] * ((xp[i] - mean) * invstd);
            }
        }
        sums[ci] = s;
        sums[c + ci] = sx;
    }
    sums[2 * c] = (double)n * (double)hw;
}

void sf_ref_bn2d_sync_bwd_dx(const float *x, int n, int c, int h, int w, const float *gamma,
                             const float *save_mean, const float *save_invstd, const float *dy, const double *sums,
                             float *dx)
{
    const size_t hw = (size_t)h * w;
    const double cnt = sums[2 * c];
    for (int ci = 0; ci < c && n > 0; ci++) {
        const float mean = save_mean[ci], invstd = save_invstd[ci];
        const float sum_dy = (float)sums[ci], sum_dy_xhat = (float)sums[c + ci];
        const float scale = (float)((double)gamma[ci] * invstd / cnt), fcnt = (float)cnt;
        for (int ni = 0; ni < n; ni++) {
            const float *xp = x + ((size_t)ni * c + ci) * hw;
            const float *dyp = dy + ((size_t)ni * c + ci) * hw;
            float *dxp = dx + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++) {
                const float xhat = (xp[i] - mean) * invstd;
                dxp[i] = scale * (fcnt * dyp[i] - sum_dy - xhat * sum_dy_xhat);
            }
        }
    }
}

/* ---- the batchnorm2d layer's hooks (gpu/layers.c) ------------------------- */

/* Saved for the backward: the batch mean, then 1/sqrt(var + eps), [C] each,
 * then the number of values the statistics were taken over (of every rank
 * under distributed.batchnorm sync; the backend reads it for an empty
 * contribution's num_batches_tracked). */
size_t sf_ref_layer_bn2d_save(const sf_layer *L, size_t nb) { return 2 * (size_t)L->out_ch + 1; }

/* Training mode (of a trainable layer): batch statistics (of every rank's
 * samples when the backend hands an all-reduce), and the running ones
 * updated; else the running statistics. A failed all-reduce leaves the
 * output unwritten: the backend abandons the step. */
void sf_ref_layer_bn2d_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    const int c = L->in_c;
    if (io->train && !L->frozen && io->allreduce) {
        sf_ref_bn2d_sync_stat_sums(io->x[0], io->n, c, L->in_h, L->in_w, io->sums);
        if (io->allreduce(io, io->sums, 2 * (size_t)c + 1) != 0)
            return;
        sf_ref_bn2d_sync_fwd(io->x[0], io->n, c, L->in_h, L->in_w, io->w, io->b, L->eps, L->momentum, io->sums,
                             io->rm, io->rv, io->save, io->save + c, io->y);
        io->save[2 * c] = (float)io->sums[2 * c];
    } else if (io->train && !L->frozen) {
        sf_ref_bn2d_fwd_train(io->x[0], io->n, c, L->in_h, L->in_w, io->w, io->b, L->eps, L->momentum, io->rm,
                              io->rv, io->save, io->save + c, io->y);
        io->save[2 * c] = (float)io->n * (float)(L->in_h * L->in_w);
    } else {
        sf_ref_bn2d_fwd_eval(io->x[0], io->n, c, L->in_h, L->in_w, io->w, io->b, L->eps, io->rm, io->rv, io->y);
    }
}

/* The input gradient is computed even when no producer needs it: the
 * scratch holds it. Under sync, dgamma and dbeta are this rank's sums (the
 * gradient all-reduce adds the ranks'), dx uses the sums of all ranks. */
void sf_ref_layer_bn2d_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    const int c = L->in_c;
    if (io->allreduce) {
        sf_ref_bn2d_sync_grad_sums(io->x[0], io->n, c, L->in_h, L->in_w, io->save, io->save + c, io->dy,
                                   io->sums);
        for (int ci = 0; ci < c; ci++) {
            io->db[ci] = (float)io->sums[ci];
            io->dw[ci] = (float)io->sums[c + ci];
        }
        if (io->allreduce(io, io->sums, 2 * (size_t)c + 1) != 0)
            return;
        sf_ref_bn2d_sync_bwd_dx(io->x[0], io->n, c, L->in_h, L->in_w, io->w, io->save, io->save + c, io->dy,
                                io->sums, io->scratch);
    } else {
        sf_ref_bn2d_bwd(io->x[0], io->n, c, L->in_h, L->in_w, io->w, io->save, io->save + c, io->dy,
                        io->scratch, io->dw, io->db);
    }
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
        /* The sums in double whatever T is, as PyTorch's CPU batchnorm
         * accumulates float in double: over a channel of a few values (a
         * late stage at batch 2) the float sums' rounding is what the
         * batch statistics' gradient amplifies (googlenet at 64x64: the
         * earliest layers' first gradients 1.9e-2 from float64's with float
         * sums). */
        double sum = 0;
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++)
                sum += xp[i];
        }
        const double dmean = sum / (double)cnt;
        const T mean = (T)dmean;
        double sq = 0;
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++)
                sq += ((double)xp[i] - dmean) * ((double)xp[i] - dmean);
        }
        const T invstd = (T)(1.0 / sqrt(sq / (double)cnt + (double)eps));
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            T *yp = y + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++)
                yp[i] = gamma[ci] * ((xp[i] - mean) * invstd) + beta[ci];
        }
        save_mean[ci] = mean;
        save_invstd[ci] = invstd;
        if (running_mean && running_var) {
            const T unbiased = cnt > 1 ? (T)(sq / (double)(cnt - 1)) : (T)NAN;
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
        /* sums and dx in double whatever T is (the forward's reason): dx
         * is a difference of near-equal terms where a channel has few
         * values */
        const double mean = save_mean[ci], invstd = save_invstd[ci];
        double sum_dy = 0, sum_dy_xhat = 0;
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            const T *dyp = dy + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++) {
                sum_dy += dyp[i];
                sum_dy_xhat += (double)dyp[i] * (((double)xp[i] - mean) * invstd);
            }
        }
        dbeta[ci] = (T)sum_dy;
        dgamma[ci] = (T)sum_dy_xhat;
        const double scale = (double)gamma[ci] * invstd / (double)cnt;
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            const T *dyp = dy + ((size_t)ni * c + ci) * hw;
            T *dxp = dx + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++) {
                const double xhat = ((double)xp[i] - mean) * invstd;
                dxp[i] = (T)(scale * ((double)cnt * dyp[i] - sum_dy - xhat * sum_dy_xhat));
            }
        }
    }
}

#endif
