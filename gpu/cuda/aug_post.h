/* gpu/cuda/aug_post.h — the second per-sample pass of the augmentation:
 * color_jitter, random_erasing and the pointwise stages listed after them
 * (sf_aug_plan.post, gpu/aug.h), in place on the fused kernel's output.
 *
 * Checked against sf_ref_aug_post (gpu/ref/augment.c) by tests/gpu/test_augment.cu.
 * sf_cuda_augment and sf_cuda_augment_bf16 call it after their kernel, so a
 * caller of those needs nothing more; a plan with n_post = 0 launches nothing.
 *
 * Threads: any host thread; the call only enqueues work on `s`. Ownership: the
 * caller's device memory; nothing is allocated, nothing synchronised. Errors:
 * -1 with sf_cuda_last_error() set.
 */
#ifndef SF_GPU_CUDA_AUG_POST_H
#define SF_GPU_CUDA_AUG_POST_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "gpu/cuda/check.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "gpu/aug.h"

/* io: the n samples' output, float32 (bf16 = 0) or bf16 bit patterns
 * (bf16 = 1), [n, c, out_h, out_w] when out_nhwc == 0, else [n, out_h, out_w, c].
 * d_samples: the device copy of the n sf_aug_sample. */
int sf_cuda_aug_post(const sf_aug_plan *plan, const sf_aug_sample *d_samples, int n, void *io, int bf16,
                     int out_nhwc, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_AUG_POST_H */
