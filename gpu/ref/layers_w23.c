/* gpu/ref/layers_w23.c — reference layers of W2/W3 (issue 9) in float and
 * double (_f64), generated from one source (layers_w23_impl.h) the way
 * layers.c generates the W1 layers, plus the AdamW update (float only).
 * See gpu/ref/ref.h for the contracts. */
#include "ref.h"

#include <math.h>

/* Generated for double too, but not (yet) declared in ref.h: declared here so
 * the definitions have prototypes. Move to ref.h if a caller needs them. */
void sf_ref_bn2d_fwd_eval_f64(const double *x, int n, int c, int h, int w, const double *gamma,
                              const double *beta, double eps, const double *running_mean,
                              const double *running_var, double *y);
void sf_ref_add_fwd_f64(const double *a, const double *b, size_t len, double *y);

#define T float
#define SF_FN(name) name
#define SF_EXP expf
#define SF_LOG logf
#define SF_SQRT sqrtf
#include "layers_w23_impl.h"
#undef T
#undef SF_FN
#undef SF_EXP
#undef SF_LOG
#undef SF_SQRT

#define T double
#define SF_FN(name) name##_f64
#define SF_EXP exp
#define SF_LOG log
#define SF_SQRT sqrt
#include "layers_w23_impl.h"
#undef T
#undef SF_FN
#undef SF_EXP
#undef SF_LOG
#undef SF_SQRT

/* torch.optim.AdamW (amsgrad off, maximize off), one step t >= 1, in the order
 * of PyTorch's single-tensor implementation:
 *   p *= 1 - lr * wd                        (decoupled weight decay, before the moments)
 *   m  = b1 * m + (1 - b1) * g
 *   v  = b2 * v + (1 - b2) * g^2
 *   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * which is p -= lr * mhat / (sqrt(vhat) + eps) with eps outside the square
 * root. The bias corrections are computed in double (PyTorch computes them as
 * Python floats), the per-element arithmetic in float. Likewise the scalar
 * coefficients 1 - b1, 1 - b2 and 1 - lr*wd are formed in double and rounded
 * once to float, as PyTorch forms them from Python floats: forming 1 - 0.999f
 * in float would be off by 5e-5 relative. m and v start at 0. */
void sf_ref_adamw(float *p, const float *grad, float *m, float *v, size_t len, float lr, float beta1,
                  float beta2, float eps, float wd, int64_t t)
{
    const double bc1 = 1.0 - pow((double)beta1, (double)t);
    const double bc2 = 1.0 - pow((double)beta2, (double)t);
    const float step_size = (float)((double)lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float decay = (float)(1.0 - (double)lr * (double)wd);
    const float one_minus_b1 = (float)(1.0 - (double)beta1);
    const float one_minus_b2 = (float)(1.0 - (double)beta2);
    for (size_t i = 0; i < len; i++) {
        const float g = grad[i];
        p[i] = p[i] * decay;
        m[i] = beta1 * m[i] + one_minus_b1 * g;
        v[i] = beta2 * v[i] + one_minus_b2 * g * g;
        const float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] = p[i] - step_size * (m[i] / denom);
    }
}
