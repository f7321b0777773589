/* gpu/ref/layers.h — the reference layers, forward and backward, in float
 * and in double (_f64): convolutions and linear (conv.c, conv_transpose.c,
 * linear.c), batchnorm (batchnorm.c), pooling (pool.c), ReLU and the residual
 * add (pointwise.c). Part of gpu/ref/ref.h, whose first comment states what
 * every reference function promises. */
#ifndef SF_GPU_REF_LAYERS_H
#define SF_GPU_REF_LAYERS_H

#include <stddef.h>
#include <stdint.h>

/* ---- convolutions and linear --------------------------------------------- */
/* out spatial size: oh = (h + 2*pad - k) / stride + 1 */
void sf_ref_conv2d_fwd(const float *x, int n, int c, int h, int w,
                       const float *wt, const float *b, int oc, int k, int stride, int pad,
                       float *y);
void sf_ref_conv2d_fwd_f64(const double *x, int n, int c, int h, int w,
                           const double *wt, const double *b, int oc, int k, int stride,
                           int pad, double *y);
/* dx, db may be NULL (first layer; no bias). */
void sf_ref_conv2d_bwd(const float *x, int n, int c, int h, int w,
                       const float *wt, int oc, int k, int stride, int pad,
                       const float *dy, float *dx, float *dw, float *db);
void sf_ref_conv2d_bwd_f64(const double *x, int n, int c, int h, int w,
                           const double *wt, int oc, int k, int stride, int pad,
                           const double *dy, double *dx, double *dw, double *db);
/* ConvTranspose2d (PyTorch semantics, output_padding 0, dilation 1, groups 1):
 * weight [c, oc, k, k] (PyTorch's layout for ConvTranspose2d: in, out, kh, kw);
 * out size oh = (h - 1) * stride - 2 * pad + k. b may be NULL. */
void sf_ref_convt2d_fwd(const float *x, int n, int c, int h, int w, const float *wt, const float *b,
                        int oc, int k, int stride, int pad, float *y);
void sf_ref_convt2d_fwd_f64(const double *x, int n, int c, int h, int w, const double *wt,
                            const double *b, int oc, int k, int stride, int pad, double *y);
/* dx, db may be NULL. */
void sf_ref_convt2d_bwd(const float *x, int n, int c, int h, int w, const float *wt, int oc, int k,
                        int stride, int pad, const float *dy, float *dx, float *dw, float *db);
void sf_ref_convt2d_bwd_f64(const double *x, int n, int c, int h, int w, const double *wt, int oc,
                            int k, int stride, int pad, const double *dy, double *dx, double *dw,
                            double *db);
void sf_ref_linear_fwd(const float *x, int n, int in, const float *wt, const float *b,
                       int out, float *y);
void sf_ref_linear_fwd_f64(const double *x, int n, int in, const double *wt,
                           const double *b, int out, double *y);
void sf_ref_linear_bwd(const float *x, int n, int in, const float *wt, int out,
                       const float *dy, float *dx, float *dw, float *db);
void sf_ref_linear_bwd_f64(const double *x, int n, int in, const double *wt, int out,
                           const double *dy, double *dx, double *dw, double *db);
/* The bias gradient of linear, conv and transposed conv layers: db[o] is the
 * sum of dy [n, c, hw] over the batch and the hw positions of channel o. */
void sf_ref_bias_grad(const float *dy, int n, int c, size_t hw, float *db);
void sf_ref_bias_grad_f64(const double *dy, int n, int c, size_t hw, double *db);

/* ---- batchnorm ------------------------------------------------------------ */
/* BatchNorm2d, training mode: per-channel batch mean and biased variance over
 * (n,h,w) normalise x; y = gamma * xhat + beta. Writes save_mean and
 * save_invstd ([c], for the backward) and updates running_mean/running_var
 * with PyTorch's rule (momentum m, unbiased variance for running_var):
 * running = (1 - m) * running + m * batch_stat. eps as PyTorch (1e-5 default). */
void sf_ref_bn2d_fwd_train(const float *x, int n, int c, int h, int w, const float *gamma,
                           const float *beta, float eps, float momentum, float *running_mean,
                           float *running_var, float *save_mean, float *save_invstd, float *y);
void sf_ref_bn2d_fwd_train_f64(const double *x, int n, int c, int h, int w, const double *gamma,
                               const double *beta, double eps, double momentum,
                               double *running_mean, double *running_var, double *save_mean,
                               double *save_invstd, double *y);
/* Eval mode: normalise with the running statistics. */
void sf_ref_bn2d_fwd_eval(const float *x, int n, int c, int h, int w, const float *gamma,
                          const float *beta, float eps, const float *running_mean,
                          const float *running_var, float *y);
/* Backward of training mode: dx, dgamma, dbeta from dy and the saved stats. */
void sf_ref_bn2d_bwd(const float *x, int n, int c, int h, int w, const float *gamma,
                     const float *save_mean, const float *save_invstd, const float *dy, float *dx,
                     float *dgamma, float *dbeta);
void sf_ref_bn2d_bwd_f64(const double *x, int n, int c, int h, int w, const double *gamma,
                         const double *save_mean, const double *save_invstd, const double *dy,
                         double *dx, double *dgamma, double *dbeta);

/* ---- pooling -------------------------------------------------------------- */
/* MaxPool2d (kernel k, stride, pad; padding never wins; PyTorch picks the
 * first maximum in row-major window order). argmax [n,c,oh,ow] receives the
 * flat index (y*w + x) of the chosen input in its plane, for the backward. */
void sf_ref_maxpool2d_fwd(const float *x, int n, int c, int h, int w, int k, int stride, int pad,
                          float *y, int32_t *argmax);
void sf_ref_maxpool2d_fwd_f64(const double *x, int n, int c, int h, int w, int k, int stride,
                              int pad, double *y, int32_t *argmax);
void sf_ref_maxpool2d_bwd(const float *dy, const int32_t *argmax, int n, int c, int h, int w,
                          int oh, int ow, float *dx);
void sf_ref_maxpool2d_bwd_f64(const double *dy, const int32_t *argmax, int n, int c, int h, int w,
                              int oh, int ow, double *dx);
/* AdaptiveAvgPool2d(1): [n,c,h,w] -> [n,c]. */
void sf_ref_avgpool_fwd(const float *x, int n, int c, int h, int w, float *y);
void sf_ref_avgpool_fwd_f64(const double *x, int n, int c, int h, int w, double *y);
void sf_ref_avgpool_bwd(const float *dy, int n, int c, int h, int w, float *dx);
void sf_ref_avgpool_bwd_f64(const double *dy, int n, int c, int h, int w, double *dx);

/* ---- pointwise ------------------------------------------------------------ */
void sf_ref_relu_fwd(const float *x, size_t len, float *y);
void sf_ref_relu_fwd_f64(const double *x, size_t len, double *y);
/* dx = dy where y > 0, else 0 (y is the forward output). */
void sf_ref_relu_bwd(const float *y, const float *dy, size_t len, float *dx);
void sf_ref_relu_bwd_f64(const double *y, const double *dy, size_t len, double *dx);
/* Residual add: y = a + b (len elements); its backward passes dy to both. */
void sf_ref_add_fwd(const float *a, const float *b, size_t len, float *y);

#endif
