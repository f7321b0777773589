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

/* ---- augmentation ------------------------------------------------------- */

/* Runs the whole plan on n samples. src: uint8, [n,h,w,c] when nhwc, else
 * [n,c,h,w], h/w/c = plan->in_h/in_w/c. dst: float [n, c, out_h, out_w]. */
void sf_ref_augment(const sf_aug_plan *plan, const sf_aug_sample *s, int n,
                    const uint8_t *src, int nhwc, float *dst);

/* The stages, exposed for tests of single ops. */
void sf_ref_aug_geometry(const sf_aug_plan *plan, const sf_aug_sample *s,
                         const uint8_t *src1, int nhwc, float *dst1); /* one sample */
void sf_ref_aug_blur(const sf_aug_plan *plan, const sf_aug_sample *s,
                     const float *in1, float *out1);                  /* one sample */
void sf_ref_aug_pointwise(const sf_aug_plan *plan, const sf_aug_sample *s,
                          float *io1);                                /* one sample */

/* ---- layers (float) ----------------------------------------------------- */
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
void sf_ref_relu_fwd(const float *x, size_t len, float *y);
/* dx = dy where y > 0, else 0 (y is the forward output). */
void sf_ref_relu_bwd(const float *y, const float *dy, size_t len, float *dx);
/* Softmax cross-entropy, mean over the batch. labels in [0,k). Writes the
 * mean loss, dlogits = (softmax - onehot)/n (may be NULL), and the number of
 * samples whose argmax equals the label (may be NULL). */
void sf_ref_xent(const float *logits, const int32_t *labels, int n, int k,
                 float *loss, float *dlogits, int *correct);
/* SGD with PyTorch semantics (dampening 0, nesterov off):
 *   g = grad + wd * p;  buf = momentum * buf + g (buf starts at 0);
 *   p -= lr * (momentum ? buf : g).  mom may be NULL when momentum == 0. */
void sf_ref_sgd(float *p, const float *grad, float *mom, size_t len,
                float lr, float momentum, float wd);

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
void sf_ref_relu_fwd_f64(const double *x, size_t len, double *y);
void sf_ref_relu_bwd_f64(const double *y, const double *dy, size_t len, double *dx);
void sf_ref_xent_f64(const double *logits, const int32_t *labels, int n, int k,
                     double *loss, double *dlogits, int *correct);

#endif
