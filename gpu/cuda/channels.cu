/* gpu/cuda/channels.cu — kernels first, then launchers: the channel shuffle
 * and the channel slice with its backward. Contracts in channels.h. */
#include "gpu/cuda/channels.h"

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

/* Forward: one thread per element e of the [n, count, hw] slice, read from
 * channel start + k of the [n, c, hw] map. */
template <typename T>
__global__ void k_channel_slice_fwd(const T *__restrict__ x, T *__restrict__ y, size_t len, int c, size_t hw,
                                    int start, int count, int nhwc)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        size_t src;
        if (nhwc) {
            src = (e / (size_t)count) * (size_t)c + (size_t)start + e % (size_t)count;
        } else {
            const size_t per = (size_t)count * hw, ni = e / per;
            src = (ni * (size_t)c + (size_t)start) * hw + e % per;
        }
        y[e] = x[src];
    }
}

/* Backward: one thread per element e of the [n, c, hw] input gradient, dy
 * inside the slice's channels and 0 outside. */
template <typename T>
__global__ void k_channel_slice_bwd(const T *__restrict__ dy, T *__restrict__ dx, size_t len, int c, size_t hw,
                                    int start, int count, int nhwc)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        int ch;
        size_t src;
        if (nhwc) {
            const size_t row = e / (size_t)c;
            ch = (int)(e % (size_t)c);
            src = row * (size_t)count + (size_t)(ch - start);
        } else {
            const size_t chw = (size_t)c * hw, ni = e / chw, r = e % chw;
            ch = (int)(r / hw);
            src = (ni * (size_t)count + (size_t)(ch - start)) * hw + r % hw;
        }
        dx[e] = ch >= start && ch < start + count ? dy[src] : cu_to<T>(0.0f);
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

/* The slice's forward (the count channels from start of x) or backward
 * (dy into those channels of dx, zero in the others), a thread an output
 * element: the two kernels take the same arguments. */
template <bool BWD>
static int slice_launch(const char *fn, sf_dtype dt, sf_layout lay, const void *in, int n, int c, size_t hw,
                        int start, int count, void *out, cudaStream_t s)
{
    if (slice_bad(fn, dt, c, start, count))
        return -1;
    const size_t len = (size_t)n * (BWD ? c : count) * hw;
    if (len == 0)
        return 0;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    const unsigned grid = cu_ew_blocks(len);
    if (dt == SF_DT_BF16) {
        auto k = BWD ? k_channel_slice_bwd<cu_bf16> : k_channel_slice_fwd<cu_bf16>;
        k<<<grid, CU_TPB, 0, s>>>((const cu_bf16 *)in, (cu_bf16 *)out, len, c, hw, start, count, nhwc);
    } else {
        auto k = BWD ? k_channel_slice_bwd<float> : k_channel_slice_fwd<float>;
        k<<<grid, CU_TPB, 0, s>>>((const float *)in, (float *)out, len, c, hw, start, count, nhwc);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_channel_slice_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, size_t hw,
                                            int start, int count, void *y, cudaStream_t s)
{
    return slice_launch<false>("sf_cuda_channel_slice_fwd_dt", dt, lay, x, n, c, hw, start, count, y, s);
}

extern "C" int sf_cuda_channel_slice_bwd_dt(sf_dtype dt, sf_layout lay, const void *dy, int n, int c, size_t hw,
                                            int start, int count, void *dx, cudaStream_t s)
{
    return slice_launch<true>("sf_cuda_channel_slice_bwd_dt", dt, lay, dy, n, c, hw, start, count, dx, s);
}
