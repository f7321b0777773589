/* gpu/cuda/layers_w23.h — the CUDA layers W2 and W3 add (issue 9):
 * ConvTranspose2d through cuDNN, per-pixel cross-entropy, BatchNorm2d,
 * MaxPool2d, global average pooling, the residual add, and AdamW.
 *
 * Same contract as layers.h: every function is a launcher that takes an explicit
 * stream (or a cuDNN handle bound to one), enqueues, checks the launch and
 * returns 0, or -1 with sf_cuda_last_error() set. Nothing here allocates device
 * memory or synchronises the host, except sf_convt_plans_build (build time), so
 * every launcher can be captured into a CUDA graph. Scratch memory is the
 * caller's: each launcher that needs some says how much through a *_scratch
 * function of the same shape. Every reduction is deterministic: partial sums
 * land in scratch in a fixed order set by the shape alone, and are combined in
 * that order (no atomics), so equal inputs give bit-equal outputs.
 *
 * Layouts: activations NCHW or NHWC (sf_layout of layers.h). Semantics are those
 * of gpu/ref/ref.h ("layers of W2/W3"), which tests/gpu/test_layers_w23.cu checks.
 * Threads: as layers.h (a handle or a plan set is used by one thread at a time).
 */
#ifndef SF_GPU_CUDA_LAYERS_W23_H
#define SF_GPU_CUDA_LAYERS_W23_H

#include <stddef.h>
#include <stdint.h>

#include "layers.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- ConvTranspose2d (cuDNN graph API) ------------------------------------ */
/* ConvTranspose2d(c -> oc, k, stride, pad) with weight [c, oc, k, k] is the
 * adjoint of Conv2d(oc -> c) with the same weight read as KCRS ([K=c][C=oc]):
 *   convT forward      = conv backward-data (convT x plays conv dy, convT y conv dx)
 *   convT backward-data = conv forward       (convT dy is conv x, convT dx conv y)
 *   convT backward-filter = conv backward-filter (x = convT dy, dy = convT x)
 * so the plans are sf_conv_plan (layers.h) built for that conv. Output size
 * oh = (h - 1)*stride - 2*pad + k (output_padding 0), as ref.h.
 * Weight layout on the device: NCHW activations take PyTorch's [c][oc][k][k];
 * NHWC activations take [c][k][k][oc] (the conv's KRSC). */

typedef struct sf_convt_desc {
    int n, c, h, w;          /* input [n, c, h, w] */
    int oc, k, stride, pad;  /* output channels, square kernel, symmetric padding */
    sf_layout layout;
    int tf32;                /* allow TF32 tensor-core engines */
    sf_dtype dt;             /* x, w, y element type (layers.h) */
    int align_x, align_w, align_y; /* byte alignment (1..16) of the pointers bound
                                      to x (input or its grad), w, y (output or its grad) */
    int allow_rtc;           /* as sf_conv_desc.allow_rtc */
} sf_convt_desc;

/* Pointers by role, the same in every direction (compare sf_conv_ptrs):
 *   FWD:        x (read)        w (read)        y (written)
 *   BWD_DATA:   x = dx (written) w (read)       y = dy (read)
 *   BWD_FILTER: x (read)        w = dw (written) y = dy (read)
 * Outputs are overwritten. ws: workspace of at least the plan's ws_bytes. */
typedef struct sf_convt_ptrs {
    void *x, *w, *y, *ws;
} sf_convt_ptrs;

/* Directions to build, as a mask: a frozen layer needs only the forward. */
#define SF_CONVT_DIR_FWD (1 << SF_CONV_FWD)
#define SF_CONVT_DIR_BWD_DATA (1 << SF_CONV_BWD_DATA)
#define SF_CONVT_DIR_BWD_FILTER (1 << SF_CONV_BWD_FILTER)
#define SF_CONVT_DIR_ALL 7

/* The plans of one convT shape, owned by the caller (zero it before the first
 * build). plan[dir] is indexed by sf_conv_dir in the convT's own sense. Each
 * direction also caches one variant pack and the pointers it binds, so a run
 * with the same pointers (the steady state, and any captured graph) allocates
 * nothing. */
typedef struct sf_convt_plans {
    sf_convt_desc d;
    int dirs;                               /* built directions (mask) */
    sf_conv_plan plan[3];
    cudnnBackendDescriptor_t vp[3];         /* cached variant pack, or NULL */
    sf_convt_ptrs vp_ptrs[3];               /* the pointers vp[dir] binds */
} sf_convt_plans;

/* Builds the plans of the directions in `dirs`, as sf_conv_plan_build does
 * (ws_limit, max_candidates; tune non-NULL times the candidates on those
 * buffers, synchronously). Build time only. On failure nothing is kept. */
int sf_convt_plans_build(cudnnHandle_t h, const sf_convt_desc *d, int dirs, size_t ws_limit,
                         int max_candidates, const sf_convt_ptrs *tune, sf_convt_plans *out);
void sf_convt_plans_destroy(sf_convt_plans *p);
/* Largest workspace any built direction needs (bytes). */
size_t sf_convt_ws_bytes(const sf_convt_plans *p);

/* Enqueues direction dir on the handle's stream. Rebinds the cached variant
 * pack when the pointers differ from the last call's (host allocation: do it
 * at build time or before capture, not in the hot loop). Capturable. */
int sf_convt_run(cudnnHandle_t h, sf_convt_plans *p, sf_conv_dir dir, const sf_convt_ptrs *ptrs);

/* A small cache of plan sets keyed by shape (the batch size is part of it), for
 * callers that meet a few shapes. The caller owns and zeroes it. */
#define SF_CONVT_CACHE_MAX 16
typedef struct sf_convt_cache {
    int n;
    sf_convt_plans e[SF_CONVT_CACHE_MAX];
} sf_convt_cache;
/* The plan set of d (all of `dirs` built), building it on a miss; NULL with the
 * error set when it cannot be built or the cache is full. */
sf_convt_plans *sf_convt_cache_get(cudnnHandle_t h, sf_convt_cache *c, const sf_convt_desc *d, int dirs,
                                   size_t ws_limit, int max_candidates);
void sf_convt_cache_destroy(sf_convt_cache *c);

/* Bias of the convT output y [n, oc, oh, ow] (in its layout): y += b[oc], with an
 * optional ReLU (a wrapper over sf_cuda_bias_act). These two fp32 wrappers
 * refuse a descriptor whose dt is not SF_DT_F32 (the _dt ones below take it). */
int sf_convt_bias_act(const sf_convt_desc *d, float *y, const float *b, int relu, cudaStream_t s);
/* db[oc] = sum of dy over n, oh, ow; when y (the ReLU output) is non-NULL, dy is
 * first masked in place (ReLU backward). Deterministic; scratch of
 * sf_cuda_bias_grad_scratch(oc) floats (a wrapper over sf_cuda_bias_grad). */
int sf_convt_bias_grad(const sf_convt_desc *d, float *dy, const float *y, float *db, float *scratch,
                       cudaStream_t s);

/* ---- per-pixel softmax cross-entropy -------------------------------------- */
/* logits [n, k, h, w] (NCHW) or [n, h, w, k] (NHWC), labels int32 [n, h, w].
 * dlogits (may be NULL; same layout) = (softmax - onehot) / (n*h*w).
 * out (device): loss = mean over pixels, correct = pixels whose first argmax is
 * the label, bad = labels outside [0, k) (their loss and gradient are NaN).
 * Deterministic: per-block partials in scratch, then one block sums them in
 * block order. */
typedef struct sf_xent2d_out {
    float loss;
    int32_t bad;
    int64_t correct;
} sf_xent2d_out;
size_t sf_cuda_xent2d_scratch_bytes(int n, int h, int w);
int sf_cuda_xent2d(const float *logits, const int32_t *labels, int n, int k, int h, int w, sf_layout lay,
                   float *dlogits, sf_xent2d_out *out, void *scratch, cudaStream_t s);

/* ---- BatchNorm2d ----------------------------------------------------------- */
/* x, y, dy, dx [n, c, h, w] in layout lay; per-channel arrays [c].
 * Training forward: batch mean and biased variance over (n, h, w); writes
 * save_mean, save_invstd = 1/sqrt(var + eps), updates running_mean/var as
 * PyTorch (running = (1-m)*running + m*stat, unbiased variance in running_var;
 * n*h*w must exceed 1, as PyTorch requires in training). relu: y = max(y, 0)
 * fused (BN followed by ReLU).
 * Eval forward: normalise with the running statistics.
 * Backward of training mode: dx, dgamma, dbeta; when y (the fused ReLU output)
 * is non-NULL the ReLU backward is applied to dy on the fly (dy is not written).
 * Statistics accumulate in double: per-block partial sums of values shifted by
 * the channel's first element, combined in a fixed order. (bf16 data: each
 * thread first sums a handful of values, at most 8, in fp32, then adds that to
 * its double sums; the per-channel combination is a fixed tree. Deterministic
 * as well; not bit-equal to the fp32 path on the same values.) */
size_t sf_cuda_bn_scratch_bytes(int n, int c, int h, int w, sf_layout lay);
int sf_cuda_bn_fwd_train(const float *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                         const float *beta, float eps, float momentum, float *running_mean,
                         float *running_var, float *save_mean, float *save_invstd, float *y, int relu,
                         void *scratch, cudaStream_t s);
int sf_cuda_bn_fwd_eval(const float *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                        const float *beta, float eps, const float *running_mean, const float *running_var,
                        float *y, int relu, cudaStream_t s);
int sf_cuda_bn_bwd(const float *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                   const float *save_mean, const float *save_invstd, const float *dy, const float *y,
                   float *dx, float *dgamma, float *dbeta, void *scratch, cudaStream_t s);

/* ---- MaxPool2d --------------------------------------------------------------- */
/* oh = (h + 2*pad - k)/stride + 1. argmax [n, c, oh, ow] (NCHW) or [n, oh, ow, c]
 * (NHWC) holds the flat index y*w + x of the chosen input in its plane (first
 * maximum in row-major window order; padding never wins; NaN wins and
 * propagates, as PyTorch). The backward is a gather: each dx element sums, in
 * row-major order, the dy of the windows that chose it, so it writes every
 * element, needs no zeroing and no atomics. Requires pad <= k/2 (PyTorch's
 * own limit), so every window holds at least one input. */
int sf_cuda_maxpool_fwd(const float *x, int n, int c, int h, int w, int k, int stride, int pad,
                        sf_layout lay, float *y, int32_t *argmax, cudaStream_t s);
int sf_cuda_maxpool_bwd(const float *dy, const int32_t *argmax, int n, int c, int h, int w, int k,
                        int stride, int pad, sf_layout lay, float *dx, cudaStream_t s);

/* ---- global average pooling -------------------------------------------------- */
/* [n, c, h, w] (layout lay) -> [n, c]; the backward spreads dy/(h*w). */
int sf_cuda_avgpool_fwd(const float *x, int n, int c, int h, int w, sf_layout lay, float *y, cudaStream_t s);
int sf_cuda_avgpool_bwd(const float *dy, int n, int c, int h, int w, sf_layout lay, float *dx,
                        cudaStream_t s);

/* ---- residual add ------------------------------------------------------------ */
/* y = a + b, or max(a + b, 0) with relu (its backward is sf_cuda_relu_bwd on y).
 * y may alias a or b. Also sums two gradient branches. */
int sf_cuda_add(const float *a, const float *b, float *y, size_t len, int relu, cudaStream_t s);

/* ---- AdamW ------------------------------------------------------------------- */
/* torch.optim.AdamW (amsgrad off), as sf_ref_adamw, over one flat buffer in one
 * launch:  p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
 *          p -= step_size * m / (sqrt(v)/bc2_sqrt + eps)
 * with step_size = lr/(1 - b1^t), bc2_sqrt = sqrt(1 - b2^t) computed on the
 * host in double (sf_adamw_hyper_at). The hyper-parameters are read from device
 * memory so a captured graph picks up a new step: the host refreshes the struct
 * and copies it before each replay. segs: as sf_cuda_sgd (conv weights kept in
 * KRSC device layout; g read and wdev written at the device index); NULL or
 * n == 0 for none. p, m, v in model layout, 16-byte aligned. */
typedef struct sf_adamw_hyper {
    float lr, beta1, beta2, eps, weight_decay;
    float step_size, bc2_sqrt; /* of step t: filled by sf_adamw_hyper_at */
    float pad_;
} sf_adamw_hyper;
/* Fills step_size and bc2_sqrt for step t >= 1 from lr, beta1, beta2. */
void sf_adamw_hyper_at(sf_adamw_hyper *h, int64_t t);
int sf_cuda_adamw(float *p, const float *g, float *m, float *v, float *wdev, size_t len,
                  const sf_adamw_hyper *d_hyper, const sf_sgd_segs *segs, cudaStream_t s);

/* ---- element types (bf16, issue 9) ------------------------------------------
 * The _dt launchers take the activation tensors (x, y, dy, dx, a, b) with
 * element type dt through void pointers; per-channel parameters, biases,
 * statistics, scratch and parameter gradients stay fp32. Arithmetic is fp32
 * (the statistics as in the fp32 versions) and each output is rounded once to
 * dt. The fp32 launchers above are the dt == SF_DT_F32 case of these. */
int sf_cuda_relu_fwd_dt(sf_dtype dt, const void *x, void *y, size_t len, cudaStream_t s);
int sf_cuda_relu_bwd_dt(sf_dtype dt, const void *y, const void *dy, void *dx, size_t len, cudaStream_t s);
/* As sf_cuda_bias_act / sf_cuda_bias_grad (layers.h); bias, db, scratch fp32. */
int sf_cuda_bias_act_dt(sf_dtype dt, void *y, const float *bias, size_t outer, int c, size_t inner, int relu,
                        cudaStream_t s);
int sf_cuda_bias_grad_dt(sf_dtype dt, void *dy, const void *y, size_t outer, int c, size_t inner, float *db,
                         float *scratch, cudaStream_t s);
int sf_convt_bias_act_dt(const sf_convt_desc *d, void *y, const float *b, int relu, cudaStream_t s);   /* d->dt */
int sf_convt_bias_grad_dt(const sf_convt_desc *d, void *dy, const void *y, float *db, float *scratch,
                          cudaStream_t s);                                                           /* d->dt */
int sf_cuda_bn_fwd_train_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                            const float *gamma, const float *beta, float eps, float momentum,
                            float *running_mean, float *running_var, float *save_mean, float *save_invstd,
                            void *y, int relu, void *scratch, cudaStream_t s);
int sf_cuda_bn_fwd_eval_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                           const float *gamma, const float *beta, float eps, const float *running_mean,
                           const float *running_var, void *y, int relu, cudaStream_t s);
int sf_cuda_bn_bwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                      const float *save_mean, const float *save_invstd, const void *dy, const void *y, void *dx,
                      float *dgamma, float *dbeta, void *scratch, cudaStream_t s);
int sf_cuda_maxpool_fwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, int k, int stride, int pad,
                           sf_layout lay, void *y, int32_t *argmax, cudaStream_t s);
int sf_cuda_maxpool_bwd_dt(sf_dtype dt, const void *dy, const int32_t *argmax, int n, int c, int h, int w, int k,
                           int stride, int pad, sf_layout lay, void *dx, cudaStream_t s);
int sf_cuda_avgpool_fwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay, void *y,
                           cudaStream_t s);
int sf_cuda_avgpool_bwd_dt(sf_dtype dt, const void *dy, int n, int c, int h, int w, sf_layout lay, void *dx,
                           cudaStream_t s);
int sf_cuda_add_dt(sf_dtype dt, const void *a, const void *b, void *y, size_t len, int relu, cudaStream_t s);

/* dst[i] = (dt)src[i] for i < len (bf16 <-> fp32, or a copy when st == dt). */
int sf_cuda_cast(const void *src, sf_dtype st, void *dst, sf_dtype dt, size_t len, cudaStream_t s);
/* Uniform values in [-scale, scale) keyed by seed, as sf_cuda_fill_random, in dt. */
int sf_cuda_fill_random_dt(sf_dtype dt, void *p, size_t len, uint64_t seed, float scale, cudaStream_t s);

/* Weights between the model layout of the master parameters (fp32, PyTorch's
 * order) and the device copy convolutions read (element type dt; inside each
 * segment of segs permuted as sf_cuda_sgd describes: model index
 * off + (o*c + ci)*rs + t <-> device index off + (o*rs + t)*c + ci, which is
 * KCRS -> KRSC for a conv weight and [c][oc][k][k] -> [c][k][k][oc] for a convT
 * weight; a segment with c == 1 is an identity copy). One launch each.
 *   sf_cuda_weights_dev: wd[device index] = (dt)p[model index] for all len
 *     elements (identity outside the segments).
 *   sf_cuda_grads_model: g[model index] = (float)gd[device index] inside the
 *     segments only (elements outside them are not touched).
 * segs may be NULL (no segments); their order in segs does not matter. -1 when a
 * segment is malformed: c or rs < 1, len not a multiple of c*rs or >= 2^32,
 * two segments overlapping, or (weights_dev) a segment reaching past len. */
int sf_cuda_weights_dev(const float *p, void *wd, sf_dtype dt, size_t len, const sf_sgd_segs *segs, cudaStream_t s);
int sf_cuda_grads_model(const void *gd, sf_dtype dt, float *g, const sf_sgd_segs *segs, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_LAYERS_W23_H */
