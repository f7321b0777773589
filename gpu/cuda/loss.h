/* gpu/cuda/loss.h — softmax cross-entropy over [n, k] logits and per pixel over
 * [n, k, h, w] logits, and the label conversion they read. Contract: tensor.h;
 * semantics: sf_ref_xent / sf_ref_xent2d (gpu/ref/ref.h), checked by
 * tests/gpu/ops/loss.cu.
 */
#ifndef SF_GPU_CUDA_LOSS_H
#define SF_GPU_CUDA_LOSS_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The per-batch loss settings, read from device memory (a captured graph
 * picks up new values): label smoothing s in [0, 1) (torch.nn.CrossEntropyLoss)
 * and the mixing weight lam (1, or 0, or out of (0, 1]: no mixing; else the
 * target of sample i is lam*onehot(y_i) + (1-lam)*onehot(y_{(i-1) mod n}), the
 * labels rolled by one as torchvision.transforms.v2 MixUp/CutMix make them;
 * smoothing applies on top). grad_scale multiplies dlogits (0 reads as 1):
 * a rank of a data-parallel job weighs its gradient by its share of the
 * job's samples (n / global_n) here, once, rather than in a pass over the
 * whole gradient before the all-reduce, since every parameter's gradient is
 * linear in dlogits. NULL pointer: s = 0, no mixing, scale 1. */
typedef struct sf_loss_ctl {
    float label_smoothing, mix_lam, grad_scale;
} sf_loss_ctl;

/* Softmax cross-entropy over logits [n, k] with int32 labels, as
 * sf_ref_xent_soft: target t = (1-s)*(lam*onehot(y) + (1-lam)*onehot(y2)) + s/k,
 * out->loss = mean of logsumexp(l) - sum_j t_j l_j, out->correct = samples
 * whose (first) argmax is the label, out->correct5 = samples whose label is
 * among the 5 largest logits (ties to the lower class index; every sample
 * when k <= 5), out->bad = labels outside [0, k) (their loss and gradient
 * are NaN); dlogits = (softmax - t) / n. Without smoothing and mixing the
 * arithmetic is the plain one (logsumexp - l_y). One block; deterministic. */
typedef struct sf_xent_out {
    float loss;
    int correct;
    int bad;
    int correct5;
} sf_xent_out;
int sf_cuda_xent(const float *logits, const int32_t *labels, int n, int k, float *dlogits,
                 sf_xent_out *out, const sf_loss_ctl *ctl, cudaStream_t s);

/* Labels to int32. dtype: 0 uint8, 1 int32, 2 int64 (sf_label_dtype). */
int sf_cuda_labels_i32(const void *src, int dtype, int n, int32_t *dst, cudaStream_t s);

/* ---- per-pixel softmax cross-entropy -------------------------------------- */
/* logits [n, k, h, w] (NCHW) or [n, h, w, k] (NHWC), labels int32 [n, h, w].
 * dlogits (may be NULL; same layout) = (softmax - t) / (n*h*w) with the target
 * t = (1-s)*onehot + s/k (ctl's label smoothing s; its mixing does not apply
 * per pixel; NULL: s = 0), as sf_ref_xent2d_smooth.
 * out (device): loss = mean over pixels, correct = pixels whose first argmax is
 * the label, correct5 = pixels whose label is in the top 5 (as sf_xent),
 * bad = labels outside [0, k) (their loss and gradient are NaN).
 * Deterministic: per-block partials in scratch, then one block sums them in
 * block order. */
typedef struct sf_xent2d_out {
    float loss;
    int32_t bad;
    int64_t correct, correct5;
} sf_xent2d_out;
size_t sf_cuda_xent2d_scratch_bytes(int n, int h, int w);
int sf_cuda_xent2d(const float *logits, const int32_t *labels, int n, int k, int h, int w, sf_layout lay,
                   float *dlogits, sf_xent2d_out *out, void *scratch, const sf_loss_ctl *ctl, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_LOSS_H */
