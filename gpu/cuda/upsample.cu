/* gpu/cuda/upsample.cu — kernels first, then the launchers: nearest-neighbour
 * upsampling. Contract in upsample.h. */
#include "gpu/cuda/upsample.h"

#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* Output element e (stored index) of [n, c, oh, ow]: its input element. */
template <typename T>
__global__ void k_upsample_fwd(const T *__restrict__ x, T *__restrict__ y, size_t len, int c, int h, int w, int s,
                               int nhwc)
{
    const int oh = h * s, ow = w * s;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        size_t src;
        if (nhwc) { /* e = ((ni * oh + oy) * ow + ox) * c + ch */
            const size_t ch = e % c, q = e / c, ox = q % ow, r = q / ow, oy = r % oh, ni = r / oh;
            src = ((ni * h + oy / s) * w + ox / s) * c + ch;
        } else { /* e = ((ni * c + ch) * oh + oy) * ow + ox */
            const size_t ox = e % ow, q = e / ow, oy = q % oh, pl = q / oh;
            src = (pl * h + oy / s) * w + ox / s;
        }
        y[e] = x[src];
    }
}

/* Input element e (stored index) of [n, c, h, w]: the sum of its block. */
template <typename T>
__global__ void k_upsample_bwd(const T *__restrict__ dy, T *__restrict__ dx, size_t len, int c, int h, int w, int s,
                               int nhwc)
{
    const int oh = h * s, ow = w * s;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        float acc = 0.f;
        if (nhwc) { /* e = ((ni * h + iy) * w + ix) * c + ch */
            const size_t ch = e % c, q = e / c, ix = q % w, r = q / w, iy = r % h, ni = r / h;
            for (int a = 0; a < s; a++)
                for (int b = 0; b < s; b++)
                    acc += cu_f(dy[((ni * oh + iy * s + a) * ow + ix * s + b) * c + ch]);
        } else { /* e = ((ni * c + ch) * h + iy) * w + ix */
            const size_t ix = e % w, q = e / w, iy = q % h, pl = q / h;
            for (int a = 0; a < s; a++)
                for (int b = 0; b < s; b++)
                    acc += cu_f(dy[(pl * oh + iy * s + a) * ow + ix * s + b]);
        }
        dx[e] = cu_to<T>(acc);
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

/* Forward (BWD false: src x, dst y) or backward (src dy, dst dx): a thread
 * an element of dst. */
template <bool BWD>
static int up_launch(const char *fn, sf_dtype dt, sf_layout lay, const void *src, int n, int c, int h, int w, int s,
                     void *dst, cudaStream_t st)
{
    if (cu_dt_bad(fn, dt))
        return -1;
    if (n < 0 || c < 1 || h < 1 || w < 1 || s < 1) {
        sf_cuda_set_error("%s:%d: %s: n %d c %d %dx%d scale %d", __FILE__, __LINE__, fn, n, c, h, w, s);
        return -1;
    }
    const size_t len = (size_t)n * c * h * w * (BWD ? 1 : (size_t)s * s);
    if (len == 0)
        return 0;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (dt == SF_DT_BF16) {
        const cu_bf16 *a = (const cu_bf16 *)src;
        cu_bf16 *b = (cu_bf16 *)dst;
        if (BWD)
            k_upsample_bwd<cu_bf16><<<cu_ew_blocks(len), CU_TPB, 0, st>>>(a, b, len, c, h, w, s, nhwc);
        else
            k_upsample_fwd<cu_bf16><<<cu_ew_blocks(len), CU_TPB, 0, st>>>(a, b, len, c, h, w, s, nhwc);
    } else {
        const float *a = (const float *)src;
        float *b = (float *)dst;
        if (BWD)
            k_upsample_bwd<float><<<cu_ew_blocks(len), CU_TPB, 0, st>>>(a, b, len, c, h, w, s, nhwc);
        else
            k_upsample_fwd<float><<<cu_ew_blocks(len), CU_TPB, 0, st>>>(a, b, len, c, h, w, s, nhwc);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_upsample_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, int h, int w, int s,
                                       void *y, cudaStream_t st)
{
    return up_launch<false>("sf_cuda_upsample_fwd_dt", dt, lay, x, n, c, h, w, s, y, st);
}

extern "C" int sf_cuda_upsample_bwd_dt(sf_dtype dt, sf_layout lay, const void *dy, int n, int c, int h, int w, int s,
                                       void *dx, cudaStream_t st)
{
    return up_launch<true>("sf_cuda_upsample_bwd_dt", dt, lay, dy, n, c, h, w, s, dx, st);
}
