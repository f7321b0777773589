/* gpu/cuda/optimizer.h — the parameter updates (SGD with momentum, AdamW) over
 * one flat parameter buffer, and the copies between the fp32 master weights in
 * model layout and the device copy convolutions read. Contract: tensor.h;
 * semantics: sf_ref_sgd / sf_ref_adamw / sf_ref_grad_norm / sf_ref_clip_grads
 * (gpu/ref/ref.h), checked by
 * tests/gpu/ops/optimizer.cu.
 */
#ifndef SF_GPU_CUDA_OPTIMIZER_H
#define SF_GPU_CUDA_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* SGD with PyTorch semantics, as sf_ref_sgd, over one flat buffer of len
 * floats, in one launch; the hyper-parameters are read from device memory so a
 * captured graph picks up new values.
 *   p, m: parameters and momentum in model layout (PyTorch's).
 *   g:    gradients, in model layout except inside `segs`.
 *   segs: conv weights kept in KRSC device layout for NHWC convolutions: inside
 *         segment s, model index off + (o*c + ci)*rs + t  (t = ky*k + kx) holds
 *         device index off + (o*rs + t)*c + ci; g is read at the device index and
 *         the updated weight is also written to wdev at the device index.
 * The arithmetic rounds as the reference does (no fused multiply-add), so equal
 * gradients give bit-equal parameters. */
/* The gradient check before an optimizer step, in device memory, read by the
 * update kernels below (NULL there: no check, no scaling):
 *   norm   the L2 norm of the gradients about to be applied (pre-clip);
 *   skip   SF_GRAD_SKIP_NONFINITE when the norm or the step's loss is
 *          NaN/Inf (or SF_GRAD_SKIP_EMPTY, below): the update kernels then
 *          change nothing (parameters, momentum, moments, weight copies);
 *   scale  torch.nn.utils.clip_grad_norm_'s coefficient,
 *          min(1, max_norm / (norm + 1e-6)), or 1 without clipping; each
 *          gradient is multiplied by it (one rounding) before the update.
 * sf_cuda_sumsq writes SF_SUMSQ_BLOCKS partial sums of squares of a (element
 * type ta, na elements) and b (fp32, nb elements) to part, in an order fixed
 * by the sizes; sf_cuda_grad_state sums nparts partials (in double, fixed
 * order) and fills out from them, *max_norm (device; NULL or <= 0: no
 * clipping) and *loss (device; NULL: not checked). So equal gradients give
 * equal bits. */
/* count (device; NULL: none) is a data-parallel step's [samples trained,
 * samples announced] (sf_step_ctl.count): when they differ the summed
 * gradient is a mean over the announced samples, and norm and scale take
 * the factor announced / trained (exactly 1 when they are equal, so the
 * bits are those of no count); no sample trained skips the step with
 * skip = SF_GRAD_SKIP_EMPTY. */
typedef struct sf_grad_state {
    float norm, scale;
    int skip, pad_;
} sf_grad_state;
#define SF_GRAD_SKIP_NONFINITE 1
#define SF_GRAD_SKIP_EMPTY 2
#ifdef __CUDACC__
/* The factor from a data-parallel count's summed gradient (a mean over the
 * samples announced) to the mean over the samples trained: announced /
 * trained, exactly 1 when they are equal, 0 when none was trained. The
 * reference backend's allreduce_grads forms it the same way. */
__device__ __forceinline__ float sf_trained_factor(const float *count)
{
    return count[0] > 0.f ? __fdiv_rn(count[1], count[0]) : 0.f;
}
#endif
#define SF_SUMSQ_BLOCKS 1024
int sf_cuda_sumsq(const void *a, sf_dtype ta, size_t na, const float *b, size_t nb, float *part, cudaStream_t s);
/* skips (device; NULL: none): the count of skipped steps, incremented here
 * when this one is skipped (sf_cuda_adamw reads it). */
int sf_cuda_grad_state(const float *part, int nparts, const float *max_norm, const float *loss, const float *count,
                       sf_grad_state *out, unsigned *skips, cudaStream_t s);

typedef struct sf_sgd_hyper {
    float lr, momentum, weight_decay, pad_;
} sf_sgd_hyper;
typedef struct sf_perm_seg {
    size_t off, len; /* floats, model offsets */
    int c, rs;       /* input channels, kernel taps (k*k) */
} sf_perm_seg;
/* A segment per convolution weight (SF_MAX_LAYERS bounds them); an
 * sf_sgd_segs travels as a kernel parameter (12 KB at 512: CUDA 12.1+ takes up
 * to 32 KB) and perm_tab's copy in shared memory is 16 KB. */
#define SF_SGD_MAX_SEGS 512
typedef struct sf_sgd_segs {
    int n;
    sf_perm_seg s[SF_SGD_MAX_SEGS];
} sf_sgd_segs;
int sf_cuda_sgd(float *p, const float *g, float *m, float *wdev, size_t len,
                const sf_sgd_hyper *d_hyper, const sf_sgd_segs *segs, const sf_grad_state *gs, cudaStream_t s);

/* SGD of a bf16 net in one pass, the same arithmetic as sf_cuda_grads_model,
 * then sf_cuda_sgd (no segments), then sf_cuda_weights_dev (no segments): the
 * gradient of element i is (float)gd[i] inside one of segs (identity segments,
 * c == 1: the convolution weights, whose gradients cuDNN writes in bf16) and
 * g[i] elsewhere; p (and m when the momentum is not 0) are updated and
 * wd[i] = (bf16)p[i] for all len elements. Three passes over 44.8 M
 * parameters took 0.37 ms of W1's 1.55 ms bf16 step on an H100; this one moves
 * half the bytes. p, g, m 16-byte aligned; dt must be SF_DT_BF16. */
int sf_cuda_sgd_mixed(float *p, const float *g, const void *gd, sf_dtype dt, const sf_sgd_segs *segs, float *m,
                      void *wd, size_t len, const sf_sgd_hyper *d_hyper, const sf_grad_state *gs,
                      cudaStream_t s);

/* ---- AdamW ------------------------------------------------------------------- */
/* torch.optim.AdamW (amsgrad off), as sf_ref_adamw, over one flat buffer in one
 * launch:  p *= decay;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
 *          p -= step_size * m / (sqrt(v)/bc2_sqrt + eps)
 * where decay = 1 - lr*wd, 1 - b1, 1 - b2, step_size = lr/(1 - b1^t) and
 * bc2_sqrt = sqrt(1 - b2^t) are formed on the host in double from the
 * configured (double) betas by sf_adamw_hyper_at, as PyTorch forms them from
 * Python floats: 1 - (float)0.999 would be 1.3e-5 below PyTorch's 1 - beta2.
 * The hyper-parameters are read from device memory so a captured graph picks
 * up a new step: the host refreshes the struct and copies it before each
 * replay. segs: as sf_cuda_sgd (conv weights kept in KRSC device layout; g read
 * and wdev written at the device index); NULL or n == 0 for none. p, m, v in
 * model layout, 16-byte aligned.
 *
 * The step number: a skipped step does not count (torch.optim.AdamW never
 * sees it), but a batch is staged while the steps queued ahead of it may
 * still be skipped. So the struct holds the factors of step t (the host's
 * count when it staged the batch) and of the SF_ADAMW_BEHIND - 1 numbers
 * below it, and skips_counted, the skips the host had counted into t; the
 * update takes step t - k, k = *skips (sf_cuda_grad_state's count on the
 * device) - skips_counted: the skips made ahead of this step that t did not
 * know of. k is below the number of batches in flight (SF_NET_MAX_BUF). */
#define SF_ADAMW_BEHIND 4
typedef struct sf_adamw_hyper {
    float beta1, beta2, eps;
    float decay;                           /* 1 - lr * weight_decay */
    float one_minus_beta1, one_minus_beta2;
    float step_size[SF_ADAMW_BEHIND];      /* of step max(t - k, 1) */
    float bc2_sqrt[SF_ADAMW_BEHIND];
    unsigned skips_counted;
} sf_adamw_hyper;
/* Fills every field for step t >= 1, skips_counted as above. */
void sf_adamw_hyper_at(sf_adamw_hyper *h, float lr, double beta1, double beta2, float eps, float weight_decay,
                       int64_t t, unsigned skips_counted);
/* skips: the device's count of skipped steps (NULL: step t). */
int sf_cuda_adamw(float *p, const float *g, float *m, float *v, float *wdev, size_t len,
                  const sf_adamw_hyper *d_hyper, const sf_sgd_segs *segs, const sf_grad_state *gs,
                  const unsigned *skips, cudaStream_t s);

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

#endif /* SF_GPU_CUDA_OPTIMIZER_H */
