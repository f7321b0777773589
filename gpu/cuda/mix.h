/* gpu/cuda/mix.h — the batch-level mixing of the augmented batch (mixup,
 * cutmix; sf_aug_mix, gpu/aug.h), in place.
 *
 * Sample i becomes its mix with sample (i - 1) mod n of the input. Each thread
 * owns one element position across all samples and walks them from the last
 * down, keeping the last sample's original for sample 0, so the update needs no
 * second buffer. Checked against sf_ref_aug_mix by tests/gpu/test_augment.cu.
 *
 * Threads: any host thread; the call only enqueues work on `s`. Ownership: the
 * caller's device memory; nothing is allocated, nothing synchronised. Errors:
 * -1 with sf_cuda_last_error() set. SF_MIX_NONE (or n < 2) launches nothing.
 */
#ifndef SF_GPU_CUDA_MIX_H
#define SF_GPU_CUDA_MIX_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "gpu/cuda/check.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "gpu/aug.h"

/* io: float32 (bf16 = 0) or bf16 bit patterns, [n, c, out_h, out_w] when
 * out_nhwc == 0, else [n, out_h, out_w, c] (c, out_h, out_w of the plan). */
int sf_cuda_aug_mix(const sf_aug_plan *plan, const sf_aug_mix *mix, int n, void *io, int bf16, int out_nhwc,
                    cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_MIX_H */
