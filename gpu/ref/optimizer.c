/* gpu/ref/optimizer.c — reference SGD and AdamW updates (float: the optimizer
 * state is float in every backend). Contracts in gpu/ref/ref.h. */
#include "gpu/ref/ref.h"

#include <math.h>

/* PyTorch SGD (dampening 0, no nesterov):
 *   g = grad + wd * p;  buf = momentum * buf + g;  p -= lr * (momentum ? buf : g) */
void sf_ref_sgd(float *p, const float *grad, float *mom, size_t len, float lr, float momentum, float wd)
{
    for (size_t i = 0; i < len; i++) {
        const float g = grad[i] + wd * p[i];
        if (momentum != 0.0f) {
            mom[i] = momentum * mom[i] + g;
            p[i] = p[i] - lr * mom[i];
        } else {
            p[i] = p[i] - lr * g;
        }
    }
}

/* torch.optim.AdamW (amsgrad off, maximize off), one step t >= 1, in the order
 * of PyTorch's single-tensor implementation:
 *   p *= 1 - lr * wd                        (decoupled weight decay, before the moments)
 *   m  = b1 * m + (1 - b1) * g
 *   v  = b2 * v + (1 - b2) * g^2
 *   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * which is p -= lr * mhat / (sqrt(vhat) + eps) with eps outside the square
 * root. The bias corrections are computed in double (PyTorch computes them as
 * Python floats), the per-element arithmetic in float. Likewise the scalar
 * coefficients 1 - b1, 1 - b2 and 1 - lr*wd are formed in double from the
 * configured betas and rounded once to float, as PyTorch forms them from
 * Python floats; b1 and b2 themselves multiply in float, as PyTorch's
 * mul_(beta2) does. The betas must arrive as doubles: 1 - (float)0.999 is
 * exact in float and 1.3e-5 (relative) below 0.001, so v (not vhat, whose
 * bias correction shifts with it) would be off by that much from PyTorch's.
 * m and v start at 0. */
void sf_ref_adamw(float *p, const float *grad, float *m, float *v, size_t len, float lr, double beta1,
                  double beta2, float eps, float wd, int64_t t)
{
    const double bc1 = 1.0 - pow(beta1, (double)t);
    const double bc2 = 1.0 - pow(beta2, (double)t);
    const float step_size = (float)((double)lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float decay = (float)(1.0 - (double)lr * (double)wd);
    const float b1 = (float)beta1, b2 = (float)beta2;
    const float one_minus_b1 = (float)(1.0 - beta1);
    const float one_minus_b2 = (float)(1.0 - beta2);
    for (size_t i = 0; i < len; i++) {
        const float g = grad[i];
        p[i] = p[i] * decay;
        m[i] = b1 * m[i] + one_minus_b1 * g;
        v[i] = b2 * v[i] + one_minus_b2 * g * g;
        const float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] = p[i] - step_size * (m[i] / denom);
    }
}

/* The sum of squares is accumulated in double so that the reference norm is
 * exact to float rounding whatever the parameter count. torch's
 * clip_grad_norm_ reduces in float (per tensor, then over the tensors'
 * norms): within ~1e-7 of this on the tiny model, but on W1 on the CPU
 * (a 33.5M-element conv weight) 1.2e-4 off the float64 norm of the same
 * gradients, which this one is within 3e-8 of. */
double sf_ref_grad_norm(const float *g, size_t len)
{
    double ss = 0.0;
    for (size_t i = 0; i < len; i++)
        ss += (double)g[i] * (double)g[i];
    return sqrt(ss);
}

/* torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6),
 * clamped to 1, formed in float from the float norm, and every gradient
 * multiplied by it. A coefficient of 1 changes nothing, so it is skipped. */
void sf_ref_clip_grads(float *g, size_t len, double norm, float max_norm)
{
    sf_ref_scale_clip_grads(g, len, norm, max_norm, 1.0f);
}

void sf_ref_scale_clip_grads(float *g, size_t len, double norm, float max_norm, float factor)
{
    if (!isfinite(norm))
        return;
    float coef = factor;
    if (max_norm > 0.0f) {
        const float clip = max_norm / ((float)norm + 1e-6f);
        if (clip < 1.0f)
            coef = clip * factor;
    }
    if (coef == 1.0f)
        return;
    for (size_t i = 0; i < len; i++)
        g[i] *= coef;
}
