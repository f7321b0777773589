/* gpu/cuda/batchnorm.h — BatchNorm2d: training forward (batch statistics,
 * running statistics updated), eval forward and the training backward, each
 * with an optional fused ReLU. Contract: tensor.h; semantics: sf_ref_bn2d_*
 * (gpu/ref/ref.h), checked by tests/gpu/ops/batchnorm.cu.
 */
#ifndef SF_GPU_CUDA_BATCHNORM_H
#define SF_GPU_CUDA_BATCHNORM_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/cuda/activation.h"
#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- BatchNorm2d ----------------------------------------------------------- */
/* x, y, dy, dx [n, c, h, w] in layout lay; per-channel arrays [c].
 * Training forward: batch mean and biased variance over (n, h, w); writes
 * save_mean, save_invstd = 1/sqrt(var + eps), updates running_mean/var as
 * PyTorch (running = (1-m)*running + m*stat, unbiased variance in running_var;
 * n*h*w must exceed 1, as PyTorch requires in training). act: the
 * activation applied to the normalised value in the same pass (a batchnorm
 * followed by it, fused): 0 none, SF_BN_RELU, or SF_BN_ACT(a) for an
 * activation a of activation.h up to SF_BN_ACT_LAST (leaky ReLU, whose
 * slope these calls do not carry, is not fused); the backward of an
 * activation other than ReLU is sf_cuda_bn_bwd_act_dt's.
 * Eval forward: normalise with the running statistics.
 * Backward of training mode: dx, dgamma, dbeta; when y (the fused ReLU output)
 * is non-NULL the ReLU backward is applied to dy on the fly (dy is not written).
 * Statistics accumulate in double: per-block partial sums of values shifted by
 * the channel's first element, combined in a fixed order. (bf16 data: each
 * thread first sums a handful of values, at most 8, in fp32, then adds that to
 * its double sums; the per-channel combination is a fixed tree. Deterministic
 * as well; not bit-equal to the fp32 path on the same values.) */
#define SF_BN_RELU 1
#define SF_BN_ACT_BASE 2
#define SF_BN_ACT(a) (SF_BN_ACT_BASE + (int)(a))
#define SF_BN_ACT_LAST SF_BN_ACT(SF_CUDA_ACT_TANH)
size_t sf_cuda_bn_scratch_bytes(int n, int c, int h, int w, sf_layout lay);
int sf_cuda_bn_fwd_train(const float *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                         const float *beta, float eps, float momentum, float *running_mean,
                         float *running_var, float *save_mean, float *save_invstd, float *y, int act,
                         void *scratch, cudaStream_t s);
int sf_cuda_bn_fwd_eval(const float *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                        const float *beta, float eps, const float *running_mean, const float *running_var,
                        float *y, int act, cudaStream_t s);
int sf_cuda_bn_bwd(const float *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                   const float *save_mean, const float *save_invstd, const float *dy, const float *y,
                   float *dx, float *dgamma, float *dbeta, void *scratch, cudaStream_t s);
/* The _dt forwards take res (NULL: none), a tensor of x's shape added to the
 * normalised value before the activation: y = act(bn(x) + res), a residual add
 * in the same pass (one rounding to dt, where BN then add round twice). The
 * training forward with y NULL computes the statistics alone (its reader
 * applies them: sf_cuda_maxpool_fwd_dt's pre-batchnorm). */
int sf_cuda_bn_fwd_train_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                            const float *gamma, const float *beta, float eps, float momentum,
                            float *running_mean, float *running_var, float *save_mean, float *save_invstd,
                            const void *res, void *y, int act, void *scratch, cudaStream_t s);
int sf_cuda_bn_fwd_eval_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                           const float *gamma, const float *beta, float eps, const float *running_mean,
                           const float *running_var, const void *res, void *y, int act, cudaStream_t s);
/* beta: the forward's (with y, the bf16 NHWC row kernels recompute the mask
 * y > 0 from x, the saved statistics, gamma and beta, with the forward's own
 * arithmetic, instead of reading y: a third less traffic; NULL: y is read). */
/* Whether sf_cuda_bn_bwd_dt reads y (a fused ReLU's output) for tensors of
 * this type, layout and channel count; 0: it recomputes the mask from x (bf16
 * NHWC, c % 8 == 0, given beta and 16-byte aligned x, dy and dx) and takes y
 * only as the sign that there is a ReLU, so y need not outlive its readers in
 * the forward. */
int sf_cuda_bn_bwd_reads_y(sf_dtype dt, sf_layout lay, int c);
int sf_cuda_bn_bwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                      const float *beta, const float *save_mean, const float *save_invstd, const void *dy,
                      const void *y, void *dx, float *dgamma, float *dbeta, void *scratch, cudaStream_t s);
/* The backward of a batchnorm whose forward applied activation act (any code
 * but 0; ReLU as sf_cuda_bn_bwd_dt with y): dy goes through the activation's
 * derivative at bn(x), recomputed from x, the saved statistics, gamma and
 * beta, so neither the activation's input nor its output is read. Only where
 * sf_cuda_bn_bwd_reads_y is 0 (bf16 NHWC, c % 8 == 0, 16-byte aligned x, dy
 * and dx); elsewhere it fails naming why. Checked against the reference's
 * batchnorm then activation by tests/gpu/ops/batchnorm.cu. */
int sf_cuda_bn_bwd_act_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay, const float *gamma,
                          const float *beta, const float *save_mean, const float *save_invstd, const void *dy,
                          int act, void *dx, float *dgamma, float *dbeta, void *scratch, cudaStream_t s);

/* ---- distributed.batchnorm sync (torch.nn.SyncBatchNorm) ------------------- */
/* The training forward and backward split where the ranks' sums are added
 * (semantics: gpu/ref's sf_ref_bn2d_sync_*, the statistics in double as
 * sf_cuda_bn_fwd_train's; checked against them and against BatchNorm2d over
 * every rank's samples by tests/gpu/test_batchnorm_sync.cu). sums: 2c + 1
 * doubles on the device, this rank's [per-channel sum (c), per-channel
 * second sum (c), count (1)]; the caller sums them over the ranks in place
 * between the two halves of each pass. n may be 0 (a rank's round without a
 * batch): its sums are zeros and a count of 0, and it computes the
 * statistics alone. The halves use the scratch (sf_cuda_bn_scratch_bytes),
 * so nothing else may write it between the backward's two.
 * Forward: sf_cuda_bn_sync_fwd_sums_dt writes [sum x, sum x^2, n*h*w];
 * sf_cuda_bn_sync_fwd_dt takes the summed sums: save_mean, save_invstd
 * (mean and biased variance of every rank's samples), the running
 * statistics moved with the unbiased variance over the whole count (left as
 * they are when it is 0), and y = act(bn(x) + res) as
 * sf_cuda_bn_fwd_train_dt (y NULL: the statistics alone, for a maxpool that
 * applies them).
 * Backward (the arguments of sf_cuda_bn_bwd_dt): sf_cuda_bn_sync_bwd_sums_dt
 * writes [sum dy, sum dy * xhat, n*h*w] and this rank's dbeta and dgamma
 * (those same sums; the gradient all-reduce adds the ranks'), dx only
 * deciding the kernels; sf_cuda_bn_sync_bwd_dx_dt writes dx from the summed
 * sums. */
int sf_cuda_bn_sync_fwd_sums_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                double *sums, void *scratch, cudaStream_t s);
int sf_cuda_bn_sync_fwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                           const float *gamma, const float *beta, float eps, float momentum, const double *sums,
                           float *running_mean, float *running_var, float *save_mean, float *save_invstd,
                           const void *res, void *y, int act, cudaStream_t s);
int sf_cuda_bn_sync_bwd_sums_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                const float *gamma, const float *beta, const float *save_mean,
                                const float *save_invstd, const void *dy, const void *y, const void *dx,
                                float *dgamma, float *dbeta, double *sums, void *scratch, cudaStream_t s);
int sf_cuda_bn_sync_bwd_dx_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                              const float *gamma, const float *beta, const float *save_mean,
                              const float *save_invstd, const void *dy, const void *y, void *dx, const double *sums,
                              void *scratch, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_BATCHNORM_H */
