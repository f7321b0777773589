/* gpu/cuda/mix.cu — mixup and cutmix on the augmented batch, in place
 * (sf_ref_aug_mix, gpu/aug.h semantics; see mix.h for the scheme).
 *
 * MixUp computes (1 - lam) * x_{i-1} + lam * x_i with two roundings and a
 * rounded sum, as the reference (torchvision's roll(1).mul_(1 - lam)
 * .add_(x.mul(lam))); CutMix copies. In float32 both round as the reference
 * does; bf16 rounds the result once more.
 */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "gpu/cuda/mix.h"
#include "gpu/cuda/check.h"

namespace {

constexpr int NT = 256;

__device__ __forceinline__ float ld(const float *p) { return *p; }
__device__ __forceinline__ float ld(const uint16_t *p) { return __bfloat162float(__ushort_as_bfloat16(*p)); }
__device__ __forceinline__ void st(float *p, float v) { *p = v; }
__device__ __forceinline__ void st(uint16_t *p, float v) { *p = __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

template <typename T>
__global__ void __launch_bounds__(NT) mix_kernel(const __grid_constant__ sf_aug_mix M, int n, int c, int oh, int ow,
                                                 int nhwc, T *io)
{
    const size_t plane = (size_t)oh * ow, sz = plane * c;
    const size_t e = (size_t)blockIdx.x * NT + threadIdx.x;
    if (e >= sz)
        return;
    if (M.kind == SF_MIX_CUTMIX) {
        const size_t pix = nhwc ? e / c : e % plane;
        const int y = (int)(pix / ow), x = (int)(pix % ow);
        if (x < M.box[0] || x >= M.box[2] || y < M.box[1] || y >= M.box[3])
            return;
    }
    const float lam = M.lam, oml = __fsub_rn(1.0f, M.lam);
    const float last = ld(io + (size_t)(n - 1) * sz + e);
    for (int i = n - 1; i >= 0; --i) {
        T *d = io + (size_t)i * sz + e;
        const float prev = i > 0 ? ld(d - sz) : last;
        st(d, M.kind == SF_MIX_MIXUP ? __fadd_rn(__fmul_rn(prev, oml), __fmul_rn(ld(d), lam)) : prev);
    }
}

} // namespace

extern "C" int sf_cuda_aug_mix(const sf_aug_plan *plan, const sf_aug_mix *mix, int n, void *io, int bf16,
                               int out_nhwc, cudaStream_t s)
{
    if (!plan || !mix || mix->kind == SF_MIX_NONE || n < 2)
        return 0;
    if (!io || (mix->kind != SF_MIX_MIXUP && mix->kind != SF_MIX_CUTMIX) || plan->c < 1 || plan->out_h < 1 ||
        plan->out_w < 1) {
        sf_cuda_set_error("%s:%d: sf_cuda_aug_mix: invalid arguments (kind %d, c %d, %dx%d)", __FILE__, __LINE__,
                          (int)mix->kind, plan->c, plan->out_h, plan->out_w);
        return -1;
    }
    const size_t sz = (size_t)plan->c * plan->out_h * plan->out_w;
    const unsigned blocks = (unsigned)((sz + NT - 1) / NT);
    if (bf16)
        mix_kernel<uint16_t><<<blocks, NT, 0, s>>>(*mix, n, plan->c, plan->out_h, plan->out_w, out_nhwc,
                                                   (uint16_t *)io);
    else
        mix_kernel<float><<<blocks, NT, 0, s>>>(*mix, n, plan->c, plan->out_h, plan->out_w, out_nhwc, (float *)io);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}
