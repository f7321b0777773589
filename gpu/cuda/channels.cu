/* gpu/cuda/channels.cu — kernels first, then launchers: the channel shuffle,
 * and the channel slice with its backward on concat.h's copies. Contracts in
 * channels.h. */
#include "gpu/cuda/channels.h"

#include "gpu/cuda/concat.h"

#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* One thread per output element e of [n, c, hw] (in layout nhwc): its
 * channel oc = j * g + i reads channel i * (c / g) + j of the same pixel. */
template <typename T>
__global__ void k_channel_shuffle(const T *__restrict__ x, T *__restrict__ y, size_t len, int c, size_t hw, int g,
                                  int nhwc)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    const int per = c / g;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        size_t src;
        if (nhwc) {
            const size_t row = e / (size_t)c;
            const int oc = (int)(e % (size_t)c);
            src = row * (size_t)c + (size_t)((oc % g) * per + oc / g);
        } else {
            const size_t chw = (size_t)c * hw, ni = e / chw, r = e % chw;
            const int oc = (int)(r / hw);
            src = ni * chw + (size_t)((oc % g) * per + oc / g) * hw + r % hw;
        }
        y[e] = x[src];
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

extern "C" int sf_cuda_channel_shuffle_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, size_t hw,
                                          int groups, void *y, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_channel_shuffle_dt", dt))
        return -1;
    if (groups < 1 || c < 1 || c % groups) {
        sf_cuda_set_error("%s:%d: channel shuffle: %d groups do not divide %d channels", __FILE__, __LINE__, groups,
                          c);
        return -1;
    }
    const size_t len = (size_t)n * c * hw;
    if (len == 0)
        return 0;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (dt == SF_DT_BF16)
        k_channel_shuffle<cu_bf16><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const cu_bf16 *)x, (cu_bf16 *)y, len, c,
                                                                         hw, groups, nhwc);
    else
        k_channel_shuffle<float><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const float *)x, (float *)y, len, c, hw,
                                                                       groups, nhwc);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

static int slice_bad(const char *fn, sf_dtype dt, int c, int start, int count)
{
    if (cu_dt_bad(fn, dt))
        return 1;
    if (start < 0 || count < 1 || (long)start + count > c) {
        sf_cuda_set_error("%s: channels [%d, %ld) outside %d", fn, start, (long)start + count, c);
        return 1;
    }
    return 0;
}

/* A slice of channels is one input of a concatenation seen from the other
 * side: its forward is concat.h's take of those channels, and its backward
 * the put of dy into them over a zeroed input gradient. */
extern "C" int sf_cuda_channel_slice_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, size_t hw,
                                            int start, int count, void *y, cudaStream_t s)
{
    if (slice_bad("sf_cuda_channel_slice_fwd_dt", dt, c, start, count))
        return -1;
    return sf_cuda_concat_take_dt(dt, lay, x, n, count, hw, c, start, y, s);
}

extern "C" int sf_cuda_channel_slice_bwd_dt(sf_dtype dt, sf_layout lay, const void *dy, int n, int c, size_t hw,
                                            int start, int count, void *dx, cudaStream_t s)
{
    if (slice_bad("sf_cuda_channel_slice_bwd_dt", dt, c, start, count))
        return -1;
    const size_t len = (size_t)n * c * hw;
    if (len)
        SF_CUDA_CHECK(cudaMemsetAsync(dx, 0, len * sf_dtype_size(dt), s));
    return sf_cuda_concat_put_dt(dt, lay, dy, n, count, hw, c, start, dx, s);
}
