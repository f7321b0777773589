/* gpu/cuda/channels.cu — kernels first, then launchers: the channel shuffle,
 * the channel slice with its backward on concat.h's copies, and the pixel
 * shuffle between channels and space. Contracts in channels.h. */
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

/* One thread per element e of the small side, [n, c * r * r, h, w] (in
 * layout nhwc: [n, h, w, c * r * r]); its channel cs = ci * r * r + i * r + j
 * at (hh, ww) is the large side's [n, c, h * r, w * r] channel ci at
 * (hh * r + i, ww * r + j). inverse 0 writes the large side (pixel_shuffle),
 * 1 the small one (pixel_unshuffle): reads or writes stay in the small
 * side's order either way. */
template <typename T>
__global__ void k_pixel_shuffle(const T *__restrict__ x, T *__restrict__ y, size_t len, int c, int h, int w, int r,
                                int inverse, int nhwc)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    const int rr = r * r, cs_n = c * rr;
    const size_t H = (size_t)h * r, W = (size_t)w * r;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        size_t ni, hh, ww;
        int cs;
        if (nhwc) {
            cs = (int)(e % (size_t)cs_n);
            const size_t pix = e / (size_t)cs_n;
            ww = pix % (size_t)w;
            hh = (pix / (size_t)w) % (size_t)h;
            ni = pix / ((size_t)w * h);
        } else {
            ww = e % (size_t)w;
            hh = (e / (size_t)w) % (size_t)h;
            const size_t nc = e / ((size_t)w * h);
            cs = (int)(nc % (size_t)cs_n);
            ni = nc / (size_t)cs_n;
        }
        const int ci = cs / rr, i = (cs / r) % r, j = cs % r;
        const size_t oh = hh * r + i, ow = ww * r + j;
        const size_t large = nhwc ? ((ni * H + oh) * W + ow) * (size_t)c + ci
                                  : ((ni * c + ci) * H + oh) * W + ow;
        if (inverse)
            y[e] = x[large];
        else
            y[large] = x[e];
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

extern "C" int sf_cuda_pixel_shuffle_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, int h, int w,
                                        int r, int inverse, void *y, cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_pixel_shuffle_dt", dt))
        return -1;
    if (r < 1 || c < 1 || h < 1 || w < 1 || (long)c * r * r > 0x7fffffffL) {
        sf_cuda_set_error("%s:%d: pixel shuffle: factor %d of %d channels of %dx%d", __FILE__, __LINE__, r, c, h,
                          w);
        return -1;
    }
    const size_t len = (size_t)n * c * r * r * h * w;
    if (len == 0)
        return 0;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (dt == SF_DT_BF16)
        k_pixel_shuffle<cu_bf16><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const cu_bf16 *)x, (cu_bf16 *)y, len, c, h,
                                                                       w, r, inverse, nhwc);
    else
        k_pixel_shuffle<float><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const float *)x, (float *)y, len, c, h, w, r,
                                                                     inverse, nhwc);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

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
