/* gpu/cuda/loss.h — softmax cross-entropy over [n, k] logits and per pixel over
 * [n, k, h, w] logits, and the label conversion they read. Contract: tensor.h;
 * semantics: sf_ref_xent / sf_ref_xent2d (gpu/ref/ref.h), checked by
 * tests/gpu/test_loss.cu.
 */
#ifndef SF_GPU_CUDA_LOSS_H
#define SF_GPU_CUDA_LOSS_H

#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Softmax cross-entropy over logits [n, k] with int32 labels, as sf_ref_xent:
 * out->loss = mean loss, out->correct = samples whose (first) argmax is the
 * label, out->bad = labels outside [0, k) (their loss and gradient are NaN);
 * dlogits = (softmax - onehot) / n. One block; deterministic. */
typedef struct sf_xent_out {
    float loss;
    int correct;
    int bad;
    int pad_;
} sf_xent_out;
int sf_cuda_xent(const float *logits, const int32_t *labels, int n, int k, float *dlogits,
                 sf_xent_out *out, cudaStream_t s);

/* Labels to int32. dtype: 0 uint8, 1 int32, 2 int64 (sf_label_dtype). */
int sf_cuda_labels_i32(const void *src, int dtype, int n, int32_t *dst, cudaStream_t s);

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

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_LOSS_H */
