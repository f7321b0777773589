/* gpu/ref/loss.h — the reference losses (loss.c): softmax cross-entropy per
 * sample and per pixel, with label smoothing and mixed targets, in float and
 * double (_f64). Part of gpu/ref/ref.h, whose first comment states what every
 * reference function promises. */
#ifndef SF_GPU_REF_LOSS_H
#define SF_GPU_REF_LOSS_H

#include <stddef.h>
#include <stdint.h>

/* Softmax cross-entropy, mean over the batch. labels in [0,k). Writes the
 * mean loss, dlogits = (softmax - onehot)/n (may be NULL), and the number of
 * samples whose argmax equals the label (may be NULL). */
void sf_ref_xent(const float *logits, const int32_t *labels, int n, int k,
                 float *loss, float *dlogits, int *correct);
void sf_ref_xent_f64(const double *logits, const int32_t *labels, int n, int k,
                     double *loss, double *dlogits, int *correct);
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
void sf_ref_xent_soft_f64(const double *logits, const int32_t *labels, int n, int k, double smoothing,
                          double lam, double *loss, double *dlogits, int *correct, int *correct5);
/* Per-pixel softmax cross-entropy: logits [n, k, h, w], labels [n, h, w] in
 * [0, k); mean over the n*h*w pixels (PyTorch CrossEntropyLoss on [N,K,H,W]).
 * dlogits (may be NULL) = (softmax - onehot) / (n*h*w); correct (may be NULL)
 * counts pixels whose argmax equals the label. */
void sf_ref_xent2d(const float *logits, const int32_t *labels, int n, int k, int h, int w,
                   float *loss, float *dlogits, int64_t *correct);
void sf_ref_xent2d_f64(const double *logits, const int32_t *labels, int n, int k, int h, int w,
                       double *loss, double *dlogits, int64_t *correct);
/* The same with label smoothing s (per pixel, as sf_ref_xent_soft without
 * mixing); correct5 (may be NULL) counts pixels whose label is in the top 5. */
void sf_ref_xent2d_smooth(const float *logits, const int32_t *labels, int n, int k, int h, int w, float smoothing,
                          float *loss, float *dlogits, int64_t *correct, int64_t *correct5);
void sf_ref_xent2d_smooth_f64(const double *logits, const int32_t *labels, int n, int k, int h, int w,
                              double smoothing, double *loss, double *dlogits, int64_t *correct,
                              int64_t *correct5);

#endif
