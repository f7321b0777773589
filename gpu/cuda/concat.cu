/* gpu/cuda/concat.cu — kernels first, then launchers: the copy of one input
 * into its channels of a concatenation, and back. Contracts in concat.h. */
#include "gpu/cuda/concat.h"

#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* For every element e of the [n, cj, hw] slice (in layout nhwc): the index of
 * the same element in the [n, ctot, hw] concatenation. PUT copies slice ->
 * whole, else whole -> slice, through the ReLU mask of mask (the
 * concatenation's own output: 0 where it is not above 0) when that is
 * non-NULL. */
template <typename T, bool PUT>
__global__ void k_concat(const T *__restrict__ src, T *__restrict__ dst, const T *__restrict__ mask, size_t len,
                         int cj, size_t hw, int ctot, int c0, int nhwc)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        size_t w;
        if (nhwc) { /* e = (n*hw + p)*cj + c */
            const size_t row = e / (size_t)cj, c = e % (size_t)cj;
            w = row * (size_t)ctot + (size_t)c0 + c;
        } else { /* e = (n*cj + c)*hw + p */
            const size_t per = (size_t)cj * hw, ni = e / per, r = e % per;
            w = (ni * (size_t)ctot + (size_t)c0) * hw + r;
        }
        if constexpr (PUT)
            dst[w] = src[e];
        else
            dst[e] = !mask || cu_f(mask[w]) > 0.f ? src[w] : cu_to<T>(0.f);
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

template <bool PUT>
static int concat_launch(sf_dtype dt, sf_layout lay, const void *src, const void *mask, int n, int cj, size_t hw,
                         int ctot, int c0, void *dst, cudaStream_t s)
{
    if (cu_dt_bad(PUT ? "sf_cuda_concat_put_dt" : "sf_cuda_concat_take_dt", dt))
        return -1;
    if (cj < 0 || c0 < 0 || c0 + cj > ctot) {
        sf_cuda_set_error("%s:%d: concat: channels [%d, %d) outside %d", __FILE__, __LINE__, c0, c0 + cj, ctot);
        return -1;
    }
    const size_t len = (size_t)n * cj * hw;
    if (len == 0)
        return 0;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (dt == SF_DT_BF16)
        k_concat<cu_bf16, PUT><<<cu_ew_blocks(len), CU_TPB, 0, s>>>(
            (const cu_bf16 *)src, (cu_bf16 *)dst, (const cu_bf16 *)mask, len, cj, hw, ctot, c0, nhwc);
    else
        k_concat<float, PUT><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const float *)src, (float *)dst,
                                                                   (const float *)mask, len, cj, hw, ctot, c0, nhwc);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_concat_put_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int cj, size_t hw, int ctot,
                                     int c0, void *y, cudaStream_t s)
{
    return concat_launch<true>(dt, lay, x, NULL, n, cj, hw, ctot, c0, y, s);
}

extern "C" int sf_cuda_concat_take_dt(sf_dtype dt, sf_layout lay, const void *dy, int n, int cj, size_t hw, int ctot,
                                      int c0, void *dx, cudaStream_t s)
{
    return concat_launch<false>(dt, lay, dy, NULL, n, cj, hw, ctot, c0, dx, s);
}

extern "C" int sf_cuda_concat_take_masked_dt(sf_dtype dt, sf_layout lay, const void *dy, const void *y, int n,
                                             int cj, size_t hw, int ctot, int c0, void *dx, cudaStream_t s)
{
    return concat_launch<false>(dt, lay, dy, y, n, cj, hw, ctot, c0, dx, s);
}
