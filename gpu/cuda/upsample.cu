/* gpu/cuda/upsample.cu — kernels first, then the launchers: upsampling and
 * resizing, nearest or bilinear. Contract in upsample.h. */
#include "gpu/cuda/upsample.h"

#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* The element of plane pl (n * c + ch in NCHW; n in NHWC) at (yy, xx) of a
 * [rows, cols] map of c channels. */
__device__ __forceinline__ size_t up_at(int nhwc, size_t ni, int ch, int c, int yy, int xx, int rows, int cols)
{
    return nhwc ? ((ni * rows + yy) * cols + xx) * c + ch : ((ni * c + ch) * rows + yy) * cols + xx;
}

/* Output element e (stored index): nearest copies its pixel; bilinear blends
 * four, along x first, in the reference's order. */
template <typename T>
__global__ void k_upsample_fwd(const T *__restrict__ x, T *__restrict__ y, size_t len, int c, sf_up_rule p, int nhwc)
{
    const int oh = p.h.out, ow = p.w.out, h = p.h.in, w = p.w.in;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        int ch, ox, oy;
        size_t ni;
        if (nhwc) {
            ch = (int)(e % c);
            const size_t q = e / c;
            ox = (int)(q % ow);
            oy = (int)(q / ow % oh);
            ni = q / ow / oh;
        } else {
            ox = (int)(e % ow);
            const size_t q = e / ow;
            oy = (int)(q % oh);
            ch = (int)(q / oh % c);
            ni = q / oh / c;
        }
        int y0, y1, x0, x1;
        float a0, a1, b0, b1;
        sf_up_src(&p, &p.h, oy, &y0, &y1, &a0, &a1);
        sf_up_src(&p, &p.w, ox, &x0, &x1, &b0, &b1);
        if (!p.bilinear) { /* a copy: no 0 * inf */
            y[e] = x[up_at(nhwc, ni, ch, c, y0, x0, h, w)];
            continue;
        }
        const float v00 = cu_f(x[up_at(nhwc, ni, ch, c, y0, x0, h, w)]);
        const float v01 = cu_f(x[up_at(nhwc, ni, ch, c, y0, x1, h, w)]);
        const float v10 = cu_f(x[up_at(nhwc, ni, ch, c, y1, x0, h, w)]);
        const float v11 = cu_f(x[up_at(nhwc, ni, ch, c, y1, x1, h, w)]);
        y[e] = cu_to<T>(a0 * (b0 * v00 + b1 * v01) + a1 * (b0 * v10 + b1 * v11));
    }
}

/* Input element e (stored index): the weighted sum of dy over the outputs
 * that read it, rows then columns in ascending order. */
template <typename T>
__global__ void k_upsample_bwd(const T *__restrict__ dy, T *__restrict__ dx, size_t len, int c, sf_up_rule p,
                               int nhwc)
{
    const int oh = p.h.out, ow = p.w.out, h = p.h.in, w = p.w.in;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        int ch, ix, iy;
        size_t ni;
        if (nhwc) {
            ch = (int)(e % c);
            const size_t q = e / c;
            ix = (int)(q % w);
            iy = (int)(q / w % h);
            ni = q / w / h;
        } else {
            ix = (int)(e % w);
            const size_t q = e / w;
            iy = (int)(q % h);
            ch = (int)(q / h % c);
            ni = q / h / c;
        }
        int ylo, yhi, xlo, xhi;
        sf_up_readers(&p, &p.h, iy, &ylo, &yhi);
        sf_up_readers(&p, &p.w, ix, &xlo, &xhi);
        float acc = 0.f;
        for (int oy = ylo; oy < yhi; oy++) {
            const float wy = sf_up_weight(&p, &p.h, oy, iy);
            if (wy == 0.f)
                continue;
            float row = 0.f;
            for (int ox = xlo; ox < xhi; ox++) {
                const float wx = sf_up_weight(&p, &p.w, ox, ix);
                if (wx != 0.f)
                    row += wx * cu_f(dy[up_at(nhwc, ni, ch, c, oy, ox, oh, ow)]);
            }
            acc += wy * row;
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
static int up_launch(const char *fn, sf_dtype dt, sf_layout lay, const void *src, int n, int c, const sf_up_rule *p,
                     void *dst, cudaStream_t st)
{
    if (cu_dt_bad(fn, dt))
        return -1;
    if (!p || n < 0 || c < 1 || p->h.in < 1 || p->w.in < 1 || p->h.out < 1 || p->w.out < 1 ||
        !(p->h.scale >= 0.f) || !(p->w.scale >= 0.f)) {
        sf_cuda_set_error("%s:%d: %s: n %d c %d, %dx%d to %dx%d", __FILE__, __LINE__, fn, n, c, p ? p->h.in : 0,
                          p ? p->w.in : 0, p ? p->h.out : 0, p ? p->w.out : 0);
        return -1;
    }
    const size_t len = (size_t)n * c * (BWD ? (size_t)p->h.in * p->w.in : (size_t)p->h.out * p->w.out);
    if (len == 0)
        return 0;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (dt == SF_DT_BF16) {
        const cu_bf16 *a = (const cu_bf16 *)src;
        cu_bf16 *b = (cu_bf16 *)dst;
        if (BWD)
            k_upsample_bwd<cu_bf16><<<cu_ew_blocks(len), CU_TPB, 0, st>>>(a, b, len, c, *p, nhwc);
        else
            k_upsample_fwd<cu_bf16><<<cu_ew_blocks(len), CU_TPB, 0, st>>>(a, b, len, c, *p, nhwc);
    } else {
        const float *a = (const float *)src;
        float *b = (float *)dst;
        if (BWD)
            k_upsample_bwd<float><<<cu_ew_blocks(len), CU_TPB, 0, st>>>(a, b, len, c, *p, nhwc);
        else
            k_upsample_fwd<float><<<cu_ew_blocks(len), CU_TPB, 0, st>>>(a, b, len, c, *p, nhwc);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_upsample_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, const sf_up_rule *p,
                                       void *y, cudaStream_t st)
{
    return up_launch<false>("sf_cuda_upsample_fwd_dt", dt, lay, x, n, c, p, y, st);
}

extern "C" int sf_cuda_upsample_bwd_dt(sf_dtype dt, sf_layout lay, const void *dy, int n, int c, const sf_up_rule *p,
                                       void *dx, cudaStream_t st)
{
    return up_launch<true>("sf_cuda_upsample_bwd_dt", dt, lay, dy, n, c, p, dx, st);
}
