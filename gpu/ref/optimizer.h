/* gpu/ref/optimizer.h — the reference optimizers (optimizer.c): gradient
 * norm and clipping, SGD and AdamW with PyTorch semantics. Part of
 * gpu/ref/ref.h, whose first comment states what every reference function
 * promises. */
#ifndef SF_GPU_REF_OPTIMIZER_H
#define SF_GPU_REF_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>

/* The global L2 norm of len gradient floats (accumulated in double), and
 * torch.nn.utils.clip_grad_norm_'s scaling: when max_norm > 0 and the norm
 * is finite, g *= min(1, max_norm / (norm + 1e-6)). Returns the pre-clip norm
 * (NaN or Inf when a gradient is).
 * sf_ref_scale_clip_grads is the same for the gradient factor * g (a
 * data-parallel step whose summed gradient is a mean over more samples than
 * were trained): norm is that gradient's (factor * ||g||), and g is
 * multiplied by factor * min(1, max_norm / (norm + 1e-6)) in one rounding;
 * with factor 1 it is sf_ref_clip_grads. */
double sf_ref_grad_norm(const float *g, size_t len);
void sf_ref_clip_grads(float *g, size_t len, double norm, float max_norm);
void sf_ref_scale_clip_grads(float *g, size_t len, double norm, float max_norm, float factor);
/* SGD with PyTorch semantics (dampening 0, nesterov off):
 *   g = grad + wd * p;  buf = momentum * buf + g (buf starts at 0);
 *   p -= lr * (momentum ? buf : g).  mom may be NULL when momentum == 0. */
void sf_ref_sgd(float *p, const float *grad, float *mom, size_t len,
                float lr, float momentum, float wd);
/* AdamW with PyTorch semantics (torch.optim.AdamW, amsgrad off): step t >= 1
 * (already incremented); p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
 * p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps). The betas are the
 * configured doubles (1 - b and 1 - b^t are formed from them). */
void sf_ref_adamw(float *p, const float *grad, float *m, float *v, size_t len, float lr, double beta1,
                  double beta2, float eps, float wd, int64_t t);

#endif
