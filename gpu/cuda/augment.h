/* gpu/cuda/augment.h — the fused augmentation kernels (DESIGN.md §5), C-callable.
 *
 * Implements the semantics written in gpu/aug.h, checked against sf_ref_augment
 * (gpu/ref/ref.h) by tests/gpu/test_augment.cu.
 *
 * One launch per call. Each thread block owns one output tile of one sample and
 * computes it end to end: the composed geometric map and resampling of the uint8
 * source (NHWC or NCHW), then, when the plan blurs, the separable Gaussian over a
 * shared-memory tile with its reflect-padded halo (the halo's geometry is
 * recomputed, which is cheaper than a round trip of the intermediate through
 * device memory), then the pointwise stages in list order (scale, normalize,
 * YCbCr, the dilated random mask), and one coalesced write. Device memory sees
 * the source once and the output once.
 *
 * Threads: any host thread may call; the calls only enqueue work on `s`.
 * Ownership: all pointers are the caller's device memory; nothing is allocated,
 * nothing is synchronised. Errors: -1 with sf_cuda_last_error() (check.h) set,
 * for invalid arguments or a failed launch; faults inside the kernel surface at
 * the caller's next synchronising call, as usual for CUDA.
 *
 * A plan with a second pass (sf_aug_plan.n_post > 0: color_jitter,
 * random_erasing) launches it after the kernel (gpu/cuda/aug_post.h); one
 * without launches nothing more.
 */
#ifndef SF_GPU_CUDA_AUGMENT_H
#define SF_GPU_CUDA_AUGMENT_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "gpu/cuda/check.h"

#ifdef __cplusplus
/* gpu/aug.h is a C header without its own guard: give its declarations C
 * linkage here, so a C++ file including this header first still links. */
extern "C" {
#endif

#include "gpu/aug.h"

/* Runs the plan on n samples on stream s.
 *   d_samples: device copy of the n sf_aug_sample (from sf_aug_gen).
 *   d_src:     the batch's uint8 sources; sample i's image starts at byte
 *              d_samples[i].src_off and is src_h x src_w x c, HWC when nhwc,
 *              else CHW (uniform plans: [n, in_h, in_w, c] or [n, c, in_h, in_w]).
 *              A ragged plan (gpu/aug.h) needs nhwc = 1.
 *   d_dst:     float32 [n, c, out_h, out_w] when out_nhwc == 0, else [n, out_h, out_w, c].
 * n == 0 is a no-op. Returns 0, or -1 with sf_cuda_last_error() set.
 * No allocation, no synchronisation. */
int sf_cuda_augment(const sf_aug_plan *plan, const sf_aug_sample *d_samples, int n,
                    const uint8_t *d_src, int nhwc, float *d_dst, int out_nhwc, cudaStream_t s);

/* The same with bf16 output (__nv_bfloat16 bit patterns in uint16_t storage,
 * rounded to nearest even from the float result). */
int sf_cuda_augment_bf16(const sf_aug_plan *plan, const sf_aug_sample *d_samples, int n,
                         const uint8_t *d_src, int nhwc, uint16_t *d_dst, int out_nhwc, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_AUGMENT_H */
