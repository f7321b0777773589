/* gpu/ref/layers.h — the reference layers, forward and backward, in float
 * and in double (_f64): convolutions and linear (conv.c, conv_grouped.c,
 * conv_transpose.c, linear.c), normalisation (batchnorm.c, norm.c), pooling
 * (pool.c, avgpool.c), activations (pointwise.c, activation.c), products
 * and concatenation (pointwise.c, mul.c, concat.c), channel shuffle and
 * slice (channels.c), dropout (dropout.c),
 * token sequences (tokens.c) and self-attention (attention.c).
 * Each family file also holds its layer kinds' hooks (layer_io.h). Part of
 * gpu/ref/ref.h, whose first comment states what every reference function
 * promises. */
#ifndef SF_GPU_REF_LAYERS_H
#define SF_GPU_REF_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/upsample_rule.h"

/* ---- shared size rules -------------------------------------------------------- */
/* Output length of a convolution axis (PyTorch's formula; dilation d). */
static inline int sf_ref_conv_out(int in, int k, int stride, int pad, int d)
{
    return (in + 2 * pad - d * (k - 1) - 1) / stride + 1;
}
/* The window of a general Conv2d: kernel, stride, padding and dilation along
 * the height (h) and the width (w), and the group count. */
typedef struct sf_ref_conv_win {
    int kh, kw, sh, sw, ph, pw, dh, dw, groups;
} sf_ref_conv_win;
static inline sf_ref_conv_win sf_ref_conv_win_square(int k, int stride, int pad, int dil, int groups)
{
    const sf_ref_conv_win v = {k, k, stride, stride, pad, pad, dil, dil, groups};
    return v;
}
/* AdaptiveAvgPool2d's bin o of out over in: [floor(o*in/out), ceil((o+1)*in/out)). */
static inline int sf_ref_bin_start(int o, int in, int out) { return (int)(((long)o * in) / out); }
static inline int sf_ref_bin_end(int o, int in, int out) { return (int)((((long)o + 1) * in + out - 1) / out); }

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
/* Conv2d with groups g (c and oc divisible by g; weight [oc, c/g, kh, kw]),
 * dilation and any window (win): out size sf_ref_conv_out along each axis.
 * b, dx, db may be NULL. */
void sf_ref_conv2d_gd_fwd(const float *x, int n, int c, int h, int w, const float *wt, const float *b, int oc,
                          const sf_ref_conv_win *win, float *y);
void sf_ref_conv2d_gd_fwd_f64(const double *x, int n, int c, int h, int w, const double *wt, const double *b,
                              int oc, const sf_ref_conv_win *win, double *y);
void sf_ref_conv2d_gd_bwd(const float *x, int n, int c, int h, int w, const float *wt, int oc,
                          const sf_ref_conv_win *win, const float *dy, float *dx, float *dw, float *db);
void sf_ref_conv2d_gd_bwd_f64(const double *x, int n, int c, int h, int w, const double *wt, int oc,
                              const sf_ref_conv_win *win, const double *dy, double *dx, double *dw, double *db);
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

/* BatchNorm2d over the samples of several ranks (distributed.batchnorm sync,
 * torch.nn.SyncBatchNorm's definition): every rank's partial sums are summed
 * over the ranks between the two halves of each pass, so every rank
 * normalises with the statistics of all the samples and its input gradient is
 * that of one BatchNorm2d over them all. A rank with no samples (n 0)
 * contributes zeros and a count of 0. The sums are in double.
 *
 * Forward: sf_ref_bn2d_sync_stat_sums writes this rank's [sum x (c), sum x^2
 * (c), count (1)]; with their sums over the ranks, sf_ref_bn2d_sync_fwd
 * normalises x (mean and biased variance of all the samples), saves mean and
 * invstd, and updates the running statistics as sf_ref_bn2d_fwd_train does
 * (unbiased variance over the whole count; a total count of 0 leaves them as
 * they are). Backward: sf_ref_bn2d_sync_grad_sums writes this rank's [sum dy
 * (c), sum dy * xhat (c), count (1)] (the first two are this rank's dbeta and
 * dgamma, which the gradient all-reduce sums as any weight gradient); with
 * their sums over the ranks, sf_ref_bn2d_sync_bwd_dx writes dx. */
void sf_ref_bn2d_sync_stat_sums(const float *x, int n, int c, int h, int w, double *sums);
void sf_ref_bn2d_sync_fwd(const float *x, int n, int c, int h, int w, const float *gamma, const float *beta,
                          float eps, float momentum, const double *sums, float *running_mean, float *running_var,
                          float *save_mean, float *save_invstd, float *y);
void sf_ref_bn2d_sync_grad_sums(const float *x, int n, int c, int h, int w, const float *save_mean,
                                const float *save_invstd, const float *dy, double *sums);
void sf_ref_bn2d_sync_bwd_dx(const float *x, int n, int c, int h, int w, const float *gamma,
                             const float *save_mean, const float *save_invstd, const float *dy, const double *sums,
                             float *dx);

/* ---- pooling -------------------------------------------------------------- */
/* MaxPool2d (kernel k, stride, pad; padding never wins; PyTorch picks the
 * first maximum in row-major window order). argmax [n,c,oh,ow] receives the
 * flat index (y*w + x) of the chosen input in its plane, for the backward. */
void sf_ref_maxpool2d_fwd(const float *x, int n, int c, int h, int w, int k, int stride, int pad,
                          float *y, int32_t *argmax);
void sf_ref_maxpool2d_fwd_f64(const double *x, int n, int c, int h, int w, int k, int stride,
                              int pad, double *y, int32_t *argmax);
/* The same with the output size given (ceil_mode: the caller's size). */
void sf_ref_maxpool2d_fwd_sized(const float *x, int n, int c, int h, int w, int k, int stride, int pad, int oh,
                                int ow, float *y, int32_t *argmax);
void sf_ref_maxpool2d_fwd_sized_f64(const double *x, int n, int c, int h, int w, int k, int stride, int pad,
                                    int oh, int ow, double *y, int32_t *argmax);
void sf_ref_maxpool2d_bwd(const float *dy, const int32_t *argmax, int n, int c, int h, int w,
                          int oh, int ow, float *dx);
void sf_ref_maxpool2d_bwd_f64(const double *dy, const int32_t *argmax, int n, int c, int h, int w,
                              int oh, int ow, double *dx);
/* AdaptiveAvgPool2d(1): [n,c,h,w] -> [n,c]. */
void sf_ref_avgpool_fwd(const float *x, int n, int c, int h, int w, float *y);
void sf_ref_avgpool_fwd_f64(const double *x, int n, int c, int h, int w, double *y);
void sf_ref_avgpool_bwd(const float *dy, int n, int c, int h, int w, float *dx);
void sf_ref_avgpool_bwd_f64(const double *dy, int n, int c, int h, int w, double *dx);

/* AvgPool2d (kernel k, stride, pad, output oh x ow as the caller computed it
 * with or without ceil_mode): the window of output o spans
 * [o*s - p, min(o*s - p + k, in + p)); the divisor is that span's area with
 * count_include_pad, else the number of taps inside the input. */
void sf_ref_avgpool2d_fwd(const float *x, int n, int c, int h, int w, int k, int stride, int pad,
                          int count_include_pad, int oh, int ow, float *y);
void sf_ref_avgpool2d_fwd_f64(const double *x, int n, int c, int h, int w, int k, int stride, int pad,
                              int count_include_pad, int oh, int ow, double *y);
void sf_ref_avgpool2d_bwd(const float *dy, int n, int c, int h, int w, int k, int stride, int pad,
                          int count_include_pad, int oh, int ow, float *dx);
void sf_ref_avgpool2d_bwd_f64(const double *dy, int n, int c, int h, int w, int k, int stride, int pad,
                              int count_include_pad, int oh, int ow, double *dx);
/* AdaptiveAvgPool2d((oh, ow)): the mean of each bin (sf_ref_bin_start/end). */
void sf_ref_adaptive_avgpool2d_fwd(const float *x, int n, int c, int h, int w, int oh, int ow, float *y);
void sf_ref_adaptive_avgpool2d_fwd_f64(const double *x, int n, int c, int h, int w, int oh, int ow, double *y);
void sf_ref_adaptive_avgpool2d_bwd(const float *dy, int n, int c, int h, int w, int oh, int ow, float *dx);
void sf_ref_adaptive_avgpool2d_bwd_f64(const double *dy, int n, int c, int h, int w, int oh, int ow, double *dx);

/* ---- layer norm ----------------------------------------------------------- */
/* LayerNorm over c at each of hw positions of [n, c, hw] (biased variance,
 * eps inside the square root): y = (x - mean) / sqrt(var + eps) * gamma[c] + beta[c]
 * (beta NULL: 0, a layer without a bias).
 * The backward writes dx and, when not NULL, dgamma and dbeta ([c]). */
void sf_ref_layernorm_fwd(const float *x, int n, int c, size_t hw, const float *gamma, const float *beta,
                          float eps, float *y);
void sf_ref_layernorm_fwd_f64(const double *x, int n, int c, size_t hw, const double *gamma, const double *beta,
                              double eps, double *y);
void sf_ref_layernorm_bwd(const float *x, int n, int c, size_t hw, const float *gamma, float eps,
                          const float *dy, float *dx, float *dgamma, float *dbeta);
void sf_ref_layernorm_bwd_f64(const double *x, int n, int c, size_t hw, const double *gamma, double eps,
                              const double *dy, double *dx, double *dgamma, double *dbeta);

/* ---- elementwise products --------------------------------------------------- */
/* y = a * b over [n, c, hw]; b is [n, c, bhw] with bhw = hw (same shape) or
 * 1 (broadcast over H,W). The backward writes da and db (either may be
 * NULL); db sums over H,W when b is broadcast. */
void sf_ref_mul_fwd(const float *a, const float *b, int n, int c, size_t hw, size_t bhw, float *y);
void sf_ref_mul_fwd_f64(const double *a, const double *b, int n, int c, size_t hw, size_t bhw, double *y);
void sf_ref_mul_bwd(const float *a, const float *b, int n, int c, size_t hw, size_t bhw, const float *dy,
                    float *da, float *db);
void sf_ref_mul_bwd_f64(const double *a, const double *b, int n, int c, size_t hw, size_t bhw, const double *dy,
                        double *da, double *db);
/* y[n][c][p] += b[c] (a per-channel shift after sf_ref_channel_scale_fwd:
 * scale_shift's forward; its bias gradient is sf_ref_bias_grad). */
void sf_ref_channel_shift(float *y, int n, int c, size_t hw, const float *b);
void sf_ref_channel_shift_f64(double *y, int n, int c, size_t hw, const double *b);
/* y = x * s[c] over [n, c, hw] (layer scale); ds[c] = sum dy * x, dx = dy * s[c] (dx may be NULL). */
void sf_ref_channel_scale_fwd(const float *x, int n, int c, size_t hw, const float *s, float *y);
void sf_ref_channel_scale_fwd_f64(const double *x, int n, int c, size_t hw, const double *s, double *y);
void sf_ref_channel_scale_bwd(const float *x, int n, int c, size_t hw, const float *s, const float *dy, float *dx,
                              float *ds);
void sf_ref_channel_scale_bwd_f64(const double *x, int n, int c, size_t hw, const double *s, const double *dy,
                                  double *dx, double *ds);

/* ---- concatenation ---------------------------------------------------------- */
/* Writes x ([n, cj, hw]) into channels [c0, c0 + cj) of y ([n, ctot, hw]);
 * take is the inverse (the backward's slice of dy); take_masked slices dy
 * through a ReLU whose output the concatenation y holds (0 where y <= 0). */
void sf_ref_concat_put(const float *x, int n, int cj, size_t hw, int ctot, int c0, float *y);
void sf_ref_concat_put_f64(const double *x, int n, int cj, size_t hw, int ctot, int c0, double *y);
void sf_ref_concat_take(const float *dy, int n, int cj, size_t hw, int ctot, int c0, float *dx);
void sf_ref_concat_take_f64(const double *dy, int n, int cj, size_t hw, int ctot, int c0, double *dx);
void sf_ref_concat_take_masked(const float *dy, const float *y, int n, int cj, size_t hw, int ctot, int c0,
                               float *dx);
void sf_ref_concat_take_masked_f64(const double *dy, const double *y, int n, int cj, size_t hw, int ctot, int c0,
                                   double *dx);

/* ---- channel moves ----------------------------------------------------------- */
/* ShuffleNet's shuffle of [n, c, hw] by g groups (g divides c): y channel
 * j * g + i is x channel i * (c / g) + j. Its inverse (the backward) is the
 * shuffle by c / g. */
void sf_ref_channel_shuffle(const float *x, int n, int c, size_t hw, int g, float *y);
void sf_ref_channel_shuffle_f64(const double *x, int n, int c, size_t hw, int g, double *y);
/* The channels [start, start + count) of x ([n, c, hw]) into y ([n, count,
 * hw]); the backward writes all of dx ([n, c, hw]): dy in those channels,
 * 0 elsewhere. */
void sf_ref_channel_slice_fwd(const float *x, int n, int c, size_t hw, int start, int count, float *y);
void sf_ref_channel_slice_fwd_f64(const double *x, int n, int c, size_t hw, int start, int count, double *y);
void sf_ref_channel_slice_bwd(const float *dy, int n, int c, size_t hw, int start, int count, float *dx);
void sf_ref_channel_slice_bwd_f64(const double *dy, int n, int c, size_t hw, int start, int count, double *dx);
/* PyTorch's pixel_shuffle of a map of c * r * r channels of h x w into c
 * channels of (h * r) x (w * r): output (c, h * r + i, w * r + j) is input
 * channel c * r * r + i * r + j at (h, w). inverse 1: pixel_unshuffle, x the
 * [c, h * r, w * r] map and y the [c * r * r, h, w] one. Each is the other's
 * backward. NCHW. */
void sf_ref_pixel_shuffle(const float *x, int n, int c, int h, int w, int r, int inverse, float *y);
void sf_ref_pixel_shuffle_f64(const double *x, int n, int c, int h, int w, int r, int inverse, double *y);

/* ---- pad (pad.c) ---------------------------------------------------------------- */
/* F.pad of the last two dimensions of x [n, c, h, w] by pad = [left, right,
 * top, bottom] (each >= 0) into y [n, c, top + h + bottom, left + w + right]
 * in mode SF_PAD_* (gpu/model.h): the constant value, reflect (pads below the
 * axis's size), replicate, or circular (pads at most the axis's size). */
void sf_ref_pad_fwd(const float *x, int n, int c, int h, int w, const int pad[4], int mode, float value, float *y);
void sf_ref_pad_fwd_f64(const double *x, int n, int c, int h, int w, const int pad[4], int mode, double value,
                        double *y);
/* Its backward: dx [n, c, h, w] (written) sums the dy of every output that
 * read each input; the constant border's dy goes nowhere. */
void sf_ref_pad_bwd(const float *dy, int n, int c, int h, int w, const int pad[4], int mode, float *dx);
void sf_ref_pad_bwd_f64(const double *dy, int n, int c, int h, int w, const int pad[4], int mode, double *dx);
/* The input index output index o of one axis reads (input size in, padded by
 * lo before it), or -1 where mode constant fills it. */
int sf_ref_pad_src(int o, int lo, int in, int mode);

/* ---- upsample ------------------------------------------------------------------- */
/* Upsampling (or resizing) of x [n, c, p->h.in, p->w.in] into y [n, c,
 * p->h.out, p->w.out], nearest or bilinear by PyTorch's rules (gpu/upsample_rule.h);
 * the backward adds each output's dy into the inputs it read, with its
 * weights, in output order (PyTorch's CPU order). */
void sf_ref_upsample_fwd(const float *x, int n, int c, const sf_up_rule *p, float *y);
void sf_ref_upsample_fwd_f64(const double *x, int n, int c, const sf_up_rule *p, double *y);
void sf_ref_upsample_bwd(const float *dy, int n, int c, const sf_up_rule *p, float *dx);
void sf_ref_upsample_bwd_f64(const double *dy, int n, int c, const sf_up_rule *p, double *dx);

/* ---- groupnorm ------------------------------------------------------------------ */
/* nn.GroupNorm(g, c) of x [n, c, hw] (NCHW; hw = 1 for flat features): each
 * sample's g groups of c / g channels normalised over their (c / g) * hw
 * values with the biased variance, then gamma[c] and beta[c]; gamma and beta
 * NULL: none (affine=False, nn.InstanceNorm2d's default). The backward
 * writes dx and the parameter gradients (dgamma, dbeta NULL: none),
 * statistics recomputed from x. */
void sf_ref_groupnorm_fwd(const float *x, int n, int c, size_t hw, int g, const float *gamma, const float *beta,
                          float eps, float *y);
void sf_ref_groupnorm_fwd_f64(const double *x, int n, int c, size_t hw, int g, const double *gamma,
                              const double *beta, float eps, double *y);
void sf_ref_groupnorm_bwd(const float *x, int n, int c, size_t hw, int g, const float *gamma, float eps,
                          const float *dy, float *dx, float *dgamma, float *dbeta);
void sf_ref_groupnorm_bwd_f64(const double *x, int n, int c, size_t hw, int g, const double *gamma, float eps,
                              const double *dy, double *dx, double *dgamma, double *dbeta);

/* ---- log_softmax ---------------------------------------------------------------- */
/* F.log_softmax(x, dim=1) of [n, f] features: y = x - log(sum(exp(x))) per
 * row; the backward dx = dy - softmax(x) * sum(dy) per row, from x. */
void sf_ref_log_softmax_fwd(const float *x, int n, int f, float *y);
void sf_ref_log_softmax_fwd_f64(const double *x, int n, int f, double *y);
void sf_ref_log_softmax_bwd(const float *x, const float *dy, int n, int f, float *dx);
void sf_ref_log_softmax_bwd_f64(const double *x, const double *dy, int n, int f, double *dx);

/* ---- dropout ------------------------------------------------------------------ */
/* Training-mode dropout of [n, elems] (element-wise), channel dropout
 * (channel-wise) and stochastic depth (row mode: sample-wise): kept values
 * scaled by 1/(1-p), the decisions keyed by (seed, seq, layer, element,
 * channel or sample) through gpu/rng.h. The backward is the same function
 * applied to dy. */
#define SF_REF_DROPOUT_SALT 0x64726f706f7574ull /* "dropout" */
#define SF_REF_DEPTH_SALT 0x7364657074680aull   /* "sdepth" */
#define SF_REF_DROPOUT2D_SALT 0x64726f7032640aull /* "drop2d" */
void sf_ref_dropout_fwd(const float *x, int n, size_t elems, float p, uint64_t seed, uint64_t seq, uint64_t layer,
                        float *y);
void sf_ref_dropout_fwd_f64(const double *x, int n, size_t elems, float p, uint64_t seed, uint64_t seq,
                            uint64_t layer, double *y);
void sf_ref_stochastic_depth_fwd(const float *x, int n, size_t elems, float p, uint64_t seed, uint64_t seq,
                                 uint64_t layer, float *y);
void sf_ref_stochastic_depth_fwd_f64(const double *x, int n, size_t elems, float p, uint64_t seed, uint64_t seq,
                                     uint64_t layer, double *y);
/* Channel dropout (nn.Dropout2d) of [n, c, hw]: channel ch of sample i is
 * kept whole when sf_u01(hash(seed ^ SF_REF_DROPOUT2D_SALT, seq, layer,
 * i*c + ch)) >= p. */
void sf_ref_dropout2d_fwd(const float *x, int n, int c, size_t hw, float p, uint64_t seed, uint64_t seq,
                          uint64_t layer, float *y);
void sf_ref_dropout2d_fwd_f64(const double *x, int n, int c, size_t hw, float p, uint64_t seed, uint64_t seq,
                              uint64_t layer, double *y);

/* ---- activations ---------------------------------------------------------------- */
/* Elementwise activations; the backward takes the forward's input x:
 * dx = dy * f'(x) with PyTorch's choices at the kinks (and PyTorch's
 * formulas: ELU's and SELU's elu_backward with is_result false, softplus's
 * threshold test, Mish's mish_backward). prm holds the parameters of those
 * that have them; the others ignore it. SF_ACT_AFFINE is the affine
 * layer's scale * x + shift, whose derivative (the scale) reads no x.
 * SF_ACT_CLAMP is the clamp layer's min(max(x, a), b), a = -inf or b = +inf
 * where that side is open-ended, with the gradient rule c
 * (SF_CLAMP_GRAD_*, gpu/model.h). */
enum { SF_ACT_RELU6 = 0, SF_ACT_SIGMOID, SF_ACT_SILU, SF_ACT_HARDSWISH, SF_ACT_HARDSIGMOID, SF_ACT_GELU,
       SF_ACT_GELU_TANH, SF_ACT_TANH, SF_ACT_LEAKY_RELU, SF_ACT_ELU, SF_ACT_SELU, SF_ACT_SOFTPLUS, SF_ACT_MISH,
       SF_ACT_AFFINE, SF_ACT_CLAMP, SF_ACT_SQUARE };
/* An activation's parameters, by value (gpu/cuda/activation.h's
 * sf_cuda_act_prm is laid out alike). */
typedef struct sf_act_prm {
    float a; /* leaky_relu: negative_slope; elu: alpha; softplus: beta (not 0); affine: scale; clamp: min */
    float b; /* softplus: threshold; affine: shift; clamp: max */
    int c;   /* clamp: the gradient rule, SF_CLAMP_GRAD_* */
} sf_act_prm;
/* SELU's fixed constants, PyTorch's (torch.nn.functional.selu). */
#define SF_SELU_ALPHA 1.6732632423543772848170429916717
#define SF_SELU_SCALE 1.0507009873554804934193349852946
void sf_ref_act_fwd(int act, sf_act_prm prm, const float *x, size_t len, float *y);
void sf_ref_act_fwd_f64(int act, sf_act_prm prm, const double *x, size_t len, double *y);
void sf_ref_act_bwd(int act, sf_act_prm prm, const float *x, const float *dy, size_t len, float *dx);
void sf_ref_act_bwd_f64(int act, sf_act_prm prm, const double *x, const double *dy, size_t len, double *dx);

/* ---- PReLU (prelu.c) ------------------------------------------------------------ */
/* y = x > 0 ? x : a * x over [n, c, hw], a = w[0] when np == 1, else w[channel]
 * (np == c). y may alias x. */
void sf_ref_prelu_fwd(const float *x, int n, int c, size_t hw, const float *w, int np, float *y);
void sf_ref_prelu_fwd_f64(const double *x, int n, int c, size_t hw, const double *w, int np, double *y);
/* PyTorch's prelu_backward: dx = x > 0 ? dy : a * dy (dx may be NULL); dw[j]
 * (written) = sum over n and hw of (x > 0 ? 0 : x * dy), per channel or over
 * every channel when np == 1, in a fixed order. */
void sf_ref_prelu_bwd(const float *x, int n, int c, size_t hw, const float *w, int np, const float *dy, float *dx,
                      float *dw);
void sf_ref_prelu_bwd_f64(const double *x, int n, int c, size_t hw, const double *w, int np, const double *dy,
                          double *dx, double *dw);

/* ---- Global Response Normalization (grn.c) ------------------------------------ */
/* ConvNeXt V2's GRN on [n, c, hw]: per sample, g[c] = the L2 norm of channel
 * c over its positions, nx[c] = g[c] / (mean over the channels of g + eps),
 * y = x + w[c] * x * nx[c] + b[c] (w, b [c]). The backward writes dx (NULL:
 * not wanted) and, when not NULL, dw and db ([c]). */
void sf_ref_grn_fwd(const float *x, int n, int c, size_t hw, const float *w, const float *b, float eps, float *y);
void sf_ref_grn_fwd_f64(const double *x, int n, int c, size_t hw, const double *w, const double *b, double eps,
                        double *y);
void sf_ref_grn_bwd(const float *x, int n, int c, size_t hw, const float *w, float eps, const float *dy, float *dx,
                    float *dw, float *db);
void sf_ref_grn_bwd_f64(const double *x, int n, int c, size_t hw, const double *w, double eps, const double *dy,
                        double *dx, double *dw, double *db);

/* ---- a convolution across channels (channel_conv1d.c) -------------------------- */
/* ECA's Conv1d(1, 1, k, padding=pad) along each sample's c values (a pooled
 * [c,1,1] map or [c] features): y[n][i] = (b ? b[0] : 0) + sum over j < k of
 * w[j] * x[n][i + j - pad], x zero outside [0, c); k = 2 * pad + 1. */
void sf_ref_channel_conv1d_fwd(const float *x, int n, int c, const float *w, const float *b, int k, int pad,
                               float *y);
void sf_ref_channel_conv1d_fwd_f64(const double *x, int n, int c, const double *w, const double *b, int k, int pad,
                                   double *y);
/* Its backward: dx[n][i] = sum over j of w[j] * dy[n][i - j + pad] (dx may be
 * NULL); dw[j] = sum over n and i of dy[n][i] * x[n][i + j - pad] and
 * db[0] = the sum of dy (NULL: no bias), written, in a fixed order. */
void sf_ref_channel_conv1d_bwd(const float *x, int n, int c, const float *w, int k, int pad, const float *dy,
                               float *dx, float *dw, float *db);
void sf_ref_channel_conv1d_bwd_f64(const double *x, int n, int c, const double *w, int k, int pad, const double *dy,
                                   double *dx, double *dw, double *db);

/* ---- token sequences (tokens.c) ------------------------------------------------ */
/* A token sequence is [n, t, c], token-major. */
/* y[n][j][i] = x[n][i][j] for each sample's [rows, cols] matrix (a map's
 * [C, H*W] as [H*W, C] tokens; the backward is the transpose back). */
void sf_ref_transpose(const float *x, int n, int rows, int cols, float *y);
void sf_ref_transpose_f64(const double *x, int n, int rows, int cols, double *y);
/* Class token: y[n] = [cls; x[n]] ([n, t+1, c]); the backward writes
 * dcls = sum_n dy[n][0] and dx[n] = dy[n][1..t] (either may be NULL). */
void sf_ref_prepend_token_fwd(const float *x, int n, int t, int c, const float *cls, float *y);
void sf_ref_prepend_token_fwd_f64(const double *x, int n, int t, int c, const double *cls, double *y);
void sf_ref_prepend_token_bwd(const float *dy, int n, int t, int c, float *dx, float *dcls);
void sf_ref_prepend_token_bwd_f64(const double *dy, int n, int t, int c, double *dx, double *dcls);
/* Position embedding: y[n] = x[n] + p over [n, len]; dp = sum_n dy[n] (dx is dy). */
void sf_ref_add_bcast_fwd(const float *x, int n, size_t len, const float *p, float *y);
void sf_ref_add_bcast_fwd_f64(const double *x, int n, size_t len, const double *p, double *y);
void sf_ref_add_bcast_bwd(const float *dy, int n, size_t len, float *dp);
void sf_ref_add_bcast_bwd_f64(const double *dy, int n, size_t len, double *dp);
/* y[n] = x[n][0] ([n, c]); the backward puts dy[n] in token 0 and zeroes the rest. */
void sf_ref_select_token_fwd(const float *x, int n, int t, int c, float *y);
void sf_ref_select_token_fwd_f64(const double *x, int n, int t, int c, double *y);
void sf_ref_select_token_bwd(const float *dy, int n, int t, int c, float *dx);
void sf_ref_select_token_bwd_f64(const double *dy, int n, int t, int c, double *dx);
/* y [n, c] = the mean of tokens start..t-1 of x [n, t, c]; the backward
 * spreads dy / (t - start) over those tokens, the others' gradient 0. */
void sf_ref_token_mean_fwd(const float *x, int n, int t, int c, int start, float *y);
void sf_ref_token_mean_fwd_f64(const double *x, int n, int t, int c, int start, double *y);
void sf_ref_token_mean_bwd(const float *dy, int n, int t, int c, int start, float *dx);
void sf_ref_token_mean_bwd_f64(const double *dy, int n, int t, int c, int start, double *dx);

/* ---- multi-head self-attention (attention.c) ------------------------------------ */
/* Over x [n, t, c] with h heads of d = c / h: qkv = x w_in^T + b_in
 * ([n, t, 3c]: q, k, v side by side), per head a = softmax(q k^T / sqrt(d))
 * ([n, h, t, t]) and o = a v ([n, t, c], the heads side by side), then
 * y = o w_out^T + b_out. w_in [3c, c], b_in [3c], w_out [c, c], b_out [c]:
 * nn.MultiheadAttention's in_proj and out_proj. The core functions are the
 * middle step alone. The backward takes the forward's qkv, a and o; d_o
 * ([n, t, c]) and dqkv ([n, t, 3c]) are its work space; dx may be NULL. */
void sf_ref_attention_core_fwd(const float *qkv, int n, int t, int c, int h, float *a, float *o);
void sf_ref_attention_core_fwd_f64(const double *qkv, int n, int t, int c, int h, double *a, double *o);
void sf_ref_attention_core_bwd(const float *qkv, const float *a, const float *d_o, int n, int t, int c, int h,
                               float *dqkv);
void sf_ref_attention_core_bwd_f64(const double *qkv, const double *a, const double *d_o, int n, int t, int c, int h,
                                   double *dqkv);
void sf_ref_attention_fwd(const float *x, int n, int t, int c, int h, const float *w_in, const float *b_in,
                          const float *w_out, const float *b_out, float *qkv, float *a, float *o, float *y);
void sf_ref_attention_fwd_f64(const double *x, int n, int t, int c, int h, const double *w_in, const double *b_in,
                              const double *w_out, const double *b_out, double *qkv, double *a, double *o,
                              double *y);
void sf_ref_attention_bwd(const float *x, int n, int t, int c, int h, const float *w_in, const float *w_out,
                          const float *qkv, const float *a, const float *o, const float *dy, float *d_o, float *dqkv,
                          float *dx, float *dw_in, float *db_in, float *dw_out, float *db_out);
void sf_ref_attention_bwd_f64(const double *x, int n, int t, int c, int h, const double *w_in, const double *w_out,
                              const double *qkv, const double *a, const double *o, const double *dy, double *d_o,
                              double *dqkv, double *dx, double *dw_in, double *db_in, double *dw_out,
                              double *db_out);

/* ---- pointwise ------------------------------------------------------------ */
void sf_ref_relu_fwd(const float *x, size_t len, float *y);
void sf_ref_relu_fwd_f64(const double *x, size_t len, double *y);
/* dx = dy where y > 0, else 0 (y is the forward output). */
void sf_ref_relu_bwd(const float *y, const float *dy, size_t len, float *dx);
void sf_ref_relu_bwd_f64(const double *y, const double *dy, size_t len, double *dx);
/* Residual add: y = a + b (len elements); its backward passes dy to both. */
void sf_ref_add_fwd(const float *a, const float *b, size_t len, float *y);

#endif
