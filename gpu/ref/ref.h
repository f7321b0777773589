/* gpu/ref/ref.h — the CPU reference of every op and layer.
 *
 * Plain, readable loops: this is the oracle the CUDA backend is tested against
 * (DESIGN.md §8) and the backend of machines without a GPU. No cleverness, no
 * threads, no intrinsics. Every function is pure: it reads its inputs and
 * overwrites its outputs (gradients are written, not accumulated), so a test
 * can poison an output and see that every element was produced.
 *
 * Layouts: activations NCHW float; conv weights [oc, c, k, k]; linear weights
 * [out, in] (PyTorch's layouts). Layers exist in float (the backend) and in
 * double (suffix _f64; the finite-difference tests), generated from one source
 * so the two cannot drift.
 */
#ifndef SF_GPU_REF_H
#define SF_GPU_REF_H

#include <stddef.h>
#include <stdint.h>

#include "../aug.h"

/* ---- bf16 ----------------------------------------------------------------
 * bfloat16 as the upper 16 bits of an IEEE float, rounded to nearest even
 * (as __float2bfloat16_rn; NaN stays a quiet NaN). The reference emulates
 * model.precision=bf16 by rounding tensors through these. */
static inline uint16_t sf_bf16_bits(float f)
{
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7f800000u) == 0x7f800000u && (v.u & 0x007fffffu))
        return (uint16_t)((v.u >> 16) | 0x0040u);
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}
static inline float sf_bf16_float(uint16_t b)
{
    union { uint32_t u; float f; } v = {(uint32_t)b << 16};
    return v.f;
}
static inline float sf_bf16_round(float f) { return sf_bf16_float(sf_bf16_bits(f)); }
static inline void sf_bf16_round_n(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = sf_bf16_round(p[i]);
}

/* ---- JPEG decode (jpeg.c) ------------------------------------------------- */

struct sf_batch;

/* Decodes the n files of the encoded batch b (b->jpeg) into dst, cap bytes:
 * sample i as 3-channel HWC uint8 of samples[i].src_h x src_w at byte
 * samples[i].src_off. 0, or -1 with a
 * message naming the sample. */
int sf_ref_jpeg_decode(const struct sf_batch *b, uint8_t *dst, size_t cap, char *err, size_t errlen);

/* ---- augmentation ------------------------------------------------------- */

/* Runs the whole plan on n samples. Sample i's image starts at src + s[i].src_off
 * and is s[i].src_h x src_w x plan->c, HWC when nhwc (always, for a ragged plan),
 * else CHW; for a uniform plan that is src = [n,h,w,c] or [n,c,h,w].
 * dst: float [n, c, out_h, out_w]. */
void sf_ref_augment(const sf_aug_plan *plan, const sf_aug_sample *s, int n,
                    const uint8_t *src, int nhwc, float *dst);

/* The stages, exposed for tests of single ops. */
void sf_ref_aug_geometry(const sf_aug_plan *plan, const sf_aug_sample *s,
                         const uint8_t *src1, int nhwc, float *dst1); /* one sample: src1
                                                                         is its image */
void sf_ref_aug_blur(const sf_aug_plan *plan, const sf_aug_sample *s,
                     const float *in1, float *out1);                  /* one sample */
void sf_ref_aug_pointwise(const sf_aug_plan *plan, const sf_aug_sample *s,
                          float *io1);                                /* one sample */
/* The second pass (plan->post: color_jitter, random_erasing and the stages
 * after them), in place on one sample's output; nothing when n_post = 0. */
void sf_ref_aug_post(const sf_aug_plan *plan, const sf_aug_sample *s, float *io1);
/* One pixel's hue shift at clamp bound `bound` (tests). */
void sf_ref_aug_hue(float *r, float *g, float *b, float shift, float bound);
/* random_erasing's "random" value of (y, x, channel): a standard normal. */
float sf_ref_aug_erase_noise(uint64_t erase_seed, int y, int x, int ch);
/* The batch-level mixing, in place on the n samples' output io = [n, c,
 * out_h, out_w]: sample i mixed with sample (i - 1) mod n as mix says. */
void sf_ref_aug_mix(const sf_aug_plan *plan, const sf_aug_mix *mix, int n, float *io);

/* ---- layers and optimizers (float) --------------------------------------
 * One file per op family: conv.c, conv_transpose.c, linear.c, batchnorm.c,
 * pool.c, pointwise.c (ReLU, add), loss.c (cross-entropy), optimizer.c. */
/* out spatial size: oh = (h + 2*pad - k) / stride + 1 */
void sf_ref_conv2d_fwd(const float *x, int n, int c, int h, int w,
                       const float *wt, const float *b, int oc, int k, int stride, int pad,
                       float *y);
/* dx, db may be NULL (first layer; no bias). */
void sf_ref_conv2d_bwd(const float *x, int n, int c, int h, int w,
                       const float *wt, int oc, int k, int stride, int pad,
                       const float *dy, float *dx, float *dw, float *db);
void sf_ref_linear_fwd(const float *x, int n, int in, const float *wt, const float *b,
                       int out, float *y);
void sf_ref_linear_bwd(const float *x, int n, int in, const float *wt, int out,
                       const float *dy, float *dx, float *dw, float *db);
/* The bias gradient of linear, conv and transposed conv layers: db[o] is the
 * sum of dy [n, c, hw] over the batch and the hw positions of channel o. */
void sf_ref_bias_grad(const float *dy, int n, int c, size_t hw, float *db);
void sf_ref_relu_fwd(const float *x, size_t len, float *y);
/* dx = dy where y > 0, else 0 (y is the forward output). */
void sf_ref_relu_bwd(const float *y, const float *dy, size_t len, float *dx);
/* Softmax cross-entropy, mean over the batch. labels in [0,k). Writes the
 * mean loss, dlogits = (softmax - onehot)/n (may be NULL), and the number of
 * samples whose argmax equals the label (may be NULL). */
void sf_ref_xent(const float *logits, const int32_t *labels, int n, int k,
                 float *loss, float *dlogits, int *correct);
/* Soft-target softmax cross-entropy, mean over the batch, as
 * torch.nn.CrossEntropyLoss(label_smoothing=s) on the probability targets
 * torchvision.transforms.v2 MixUp/CutMix make: the target of sample i is
 *   t = (1-s) * (lam*onehot(y_i) + (1-lam)*onehot(y_{(i-1) mod n})) + s/k,
 *   loss_i = logsumexp(l_i) - sum_j t_j l_ij,  dlogits = (softmax - t) / n.
 * lam = 1 (or 0, or outside (0,1]) is no mixing; s = 0 no smoothing. correct
 * counts samples whose first argmax is y_i, correct5 those whose y_i is among
 * the 5 largest logits in the order of torch.sort(descending=True,
 * stable=True), ties to the lower class index (every sample with k <= 5).
 * dlogits, correct, correct5 may be NULL. */
void sf_ref_xent_soft(const float *logits, const int32_t *labels, int n, int k, float smoothing, float lam,
                      float *loss, float *dlogits, int *correct, int *correct5);
/* The global L2 norm of len gradient floats (accumulated in double), and
 * torch.nn.utils.clip_grad_norm_'s scaling: when max_norm > 0 and the norm
 * is finite, g *= min(1, max_norm / (norm + 1e-6)). Returns the pre-clip norm
 * (NaN or Inf when a gradient is). */
double sf_ref_grad_norm(const float *g, size_t len);
void sf_ref_clip_grads(float *g, size_t len, double norm, float max_norm);
/* SGD with PyTorch semantics (dampening 0, nesterov off):
 *   g = grad + wd * p;  buf = momentum * buf + g (buf starts at 0);
 *   p -= lr * (momentum ? buf : g).  mom may be NULL when momentum == 0. */
void sf_ref_sgd(float *p, const float *grad, float *mom, size_t len,
                float lr, float momentum, float wd);

/* ConvTranspose2d (PyTorch semantics, output_padding 0, dilation 1, groups 1):
 * weight [c, oc, k, k] (PyTorch's layout for ConvTranspose2d: in, out, kh, kw);
 * out size oh = (h - 1) * stride - 2 * pad + k. b may be NULL. */
void sf_ref_convt2d_fwd(const float *x, int n, int c, int h, int w, const float *wt, const float *b,
                        int oc, int k, int stride, int pad, float *y);
/* dx, db may be NULL. */
void sf_ref_convt2d_bwd(const float *x, int n, int c, int h, int w, const float *wt, int oc, int k,
                        int stride, int pad, const float *dy, float *dx, float *dw, float *db);
/* Per-pixel softmax cross-entropy: logits [n, k, h, w], labels [n, h, w] in
 * [0, k); mean over the n*h*w pixels (PyTorch CrossEntropyLoss on [N,K,H,W]).
 * dlogits (may be NULL) = (softmax - onehot) / (n*h*w); correct (may be NULL)
 * counts pixels whose argmax equals the label. */
void sf_ref_xent2d(const float *logits, const int32_t *labels, int n, int k, int h, int w,
                   float *loss, float *dlogits, int64_t *correct);
/* The same with label smoothing s (per pixel, as sf_ref_xent_soft without
 * mixing); correct5 (may be NULL) counts pixels whose label is in the top 5. */
void sf_ref_xent2d_smooth(const float *logits, const int32_t *labels, int n, int k, int h, int w, float smoothing,
                          float *loss, float *dlogits, int64_t *correct, int64_t *correct5);
/* BatchNorm2d, training mode: per-channel batch mean and biased variance over
 * (n,h,w) normalise x; y = gamma * xhat + beta. Writes save_mean and
 * save_invstd ([c], for the backward) and updates running_mean/running_var
 * with PyTorch's rule (momentum m, unbiased variance for running_var):
 * running = (1 - m) * running + m * batch_stat. eps as PyTorch (1e-5 default). */
void sf_ref_bn2d_fwd_train(const float *x, int n, int c, int h, int w, const float *gamma,
                           const float *beta, float eps, float momentum, float *running_mean,
                           float *running_var, float *save_mean, float *save_invstd, float *y);
/* Eval mode: normalise with the running statistics. */
void sf_ref_bn2d_fwd_eval(const float *x, int n, int c, int h, int w, const float *gamma,
                          const float *beta, float eps, const float *running_mean,
                          const float *running_var, float *y);
/* Backward of training mode: dx, dgamma, dbeta from dy and the saved stats. */
void sf_ref_bn2d_bwd(const float *x, int n, int c, int h, int w, const float *gamma,
                     const float *save_mean, const float *save_invstd, const float *dy, float *dx,
                     float *dgamma, float *dbeta);
/* MaxPool2d (kernel k, stride, pad; padding never wins; PyTorch picks the
 * first maximum in row-major window order). argmax [n,c,oh,ow] receives the
 * flat index (y*w + x) of the chosen input in its plane, for the backward. */
void sf_ref_maxpool2d_fwd(const float *x, int n, int c, int h, int w, int k, int stride, int pad,
                          float *y, int32_t *argmax);
void sf_ref_maxpool2d_bwd(const float *dy, const int32_t *argmax, int n, int c, int h, int w,
                          int oh, int ow, float *dx);
/* AdaptiveAvgPool2d(1): [n,c,h,w] -> [n,c]. */
void sf_ref_avgpool_fwd(const float *x, int n, int c, int h, int w, float *y);
void sf_ref_avgpool_bwd(const float *dy, int n, int c, int h, int w, float *dx);
/* Residual add: y = a + b (len elements); its backward passes dy to both. */
void sf_ref_add_fwd(const float *a, const float *b, size_t len, float *y);
/* AdamW with PyTorch semantics (torch.optim.AdamW, amsgrad off): step t >= 1
 * (already incremented); p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
 * p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps). */
void sf_ref_adamw(float *p, const float *grad, float *m, float *v, size_t len, float lr, float beta1,
                  float beta2, float eps, float wd, int64_t t);

/* ---- layers (double), same semantics ----------------------------------- */
void sf_ref_conv2d_fwd_f64(const double *x, int n, int c, int h, int w,
                           const double *wt, const double *b, int oc, int k, int stride,
                           int pad, double *y);
void sf_ref_conv2d_bwd_f64(const double *x, int n, int c, int h, int w,
                           const double *wt, int oc, int k, int stride, int pad,
                           const double *dy, double *dx, double *dw, double *db);
void sf_ref_linear_fwd_f64(const double *x, int n, int in, const double *wt,
                           const double *b, int out, double *y);
void sf_ref_linear_bwd_f64(const double *x, int n, int in, const double *wt, int out,
                           const double *dy, double *dx, double *dw, double *db);
void sf_ref_bias_grad_f64(const double *dy, int n, int c, size_t hw, double *db);
void sf_ref_relu_fwd_f64(const double *x, size_t len, double *y);
void sf_ref_relu_bwd_f64(const double *y, const double *dy, size_t len, double *dx);
void sf_ref_xent_f64(const double *logits, const int32_t *labels, int n, int k,
                     double *loss, double *dlogits, int *correct);
void sf_ref_xent_soft_f64(const double *logits, const int32_t *labels, int n, int k, double smoothing,
                          double lam, double *loss, double *dlogits, int *correct, int *correct5);
void sf_ref_convt2d_fwd_f64(const double *x, int n, int c, int h, int w, const double *wt,
                            const double *b, int oc, int k, int stride, int pad, double *y);
void sf_ref_convt2d_bwd_f64(const double *x, int n, int c, int h, int w, const double *wt, int oc,
                            int k, int stride, int pad, const double *dy, double *dx, double *dw,
                            double *db);
void sf_ref_xent2d_f64(const double *logits, const int32_t *labels, int n, int k, int h, int w,
                       double *loss, double *dlogits, int64_t *correct);
void sf_ref_xent2d_smooth_f64(const double *logits, const int32_t *labels, int n, int k, int h, int w,
                              double smoothing, double *loss, double *dlogits, int64_t *correct,
                              int64_t *correct5);
void sf_ref_bn2d_fwd_train_f64(const double *x, int n, int c, int h, int w, const double *gamma,
                               const double *beta, double eps, double momentum,
                               double *running_mean, double *running_var, double *save_mean,
                               double *save_invstd, double *y);
void sf_ref_bn2d_bwd_f64(const double *x, int n, int c, int h, int w, const double *gamma,
                         const double *save_mean, const double *save_invstd, const double *dy,
                         double *dx, double *dgamma, double *dbeta);
void sf_ref_maxpool2d_fwd_f64(const double *x, int n, int c, int h, int w, int k, int stride,
                              int pad, double *y, int32_t *argmax);
void sf_ref_maxpool2d_bwd_f64(const double *dy, const int32_t *argmax, int n, int c, int h, int w,
                              int oh, int ow, double *dx);
void sf_ref_avgpool_fwd_f64(const double *x, int n, int c, int h, int w, double *y);
void sf_ref_avgpool_bwd_f64(const double *dy, int n, int c, int h, int w, double *dx);

#endif
