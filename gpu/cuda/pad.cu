/* gpu/cuda/pad.cu — kernels first, then launchers: F.pad's forward (one
 * thread per output element) and its backward as a gather (one thread per
 * input element, summing the output gradients that read it in a fixed
 * order: deterministic, no atomics). Contracts in pad.h; the arithmetic is
 * gpu/ref/pad.c's.
 *
 * On NHWC every channel of a pixel reads the same source pixel, so the NHWC
 * kernels move a pixel's channels in vectors of up to 16 bytes with 32-bit
 * index arithmetic: a TF-"same" pad of EfficientNet's 112x112x96 bf16 maps
 * at batch 256 ran at a seventh of the copy bandwidth one element (and five
 * 64-bit divisions) a thread. */
#include "gpu/cuda/pad.h"

#include <string.h>

#include "gpu/cuda/kernel_common.cuh"

/* A map's sizes and its pads, by value into the kernels. */
struct pad_geom {
    int c, h, w, oh, ow;
    int l, r, t, b; /* left, right, top, bottom */
    int mode;       /* SF_PAD_* */
};

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* The input index output index o of an axis reads (input size in, padded by
 * lo before it), or -1 where mode constant fills it: sf_ref_pad_src. */
__device__ __forceinline__ int pad_src(int o, int lo, int in, int mode)
{
    const int i = o - lo;
    if (i >= 0 && i < in)
        return i;
    switch (mode) {
    case SF_PAD_REFLECT: return i < 0 ? -i : 2 * (in - 1) - i;
    case SF_PAD_REPLICATE: return i < 0 ? 0 : in - 1;
    case SF_PAD_CIRCULAR: return i < 0 ? i + in : i - in;
    default: return -1;
    }
}

/* The output indices of one axis that read input index i, as at most three
 * ranges [a[k], e[k]) (the inverse of pad_src): i itself shifted by lo; a
 * mirror on either side (reflect), the whole border of an edge
 * (replicate), the wrapped copy on either side (circular). Returns how
 * many. */
__device__ __forceinline__ int pad_readers(int i, int lo, int hi, int in, int mode, int a[3], int e[3])
{
    int k = 0;
    a[k] = lo + i, e[k] = lo + i + 1, k++;
    switch (mode) {
    case SF_PAD_REFLECT:
        if (i >= 1 && i <= lo)
            a[k] = lo - i, e[k] = lo - i + 1, k++;
        if (i <= in - 2 && i >= in - 1 - hi)
            a[k] = lo + 2 * (in - 1) - i, e[k] = a[k] + 1, k++;
        break;
    case SF_PAD_REPLICATE:
        if (i == 0 && lo > 0)
            a[k] = 0, e[k] = lo, k++;
        if (i == in - 1 && hi > 0)
            a[k] = lo + in, e[k] = lo + in + hi, k++;
        break;
    case SF_PAD_CIRCULAR:
        if (i >= in - lo)
            a[k] = lo + i - in, e[k] = a[k] + 1, k++;
        if (i < hi)
            a[k] = lo + in + i, e[k] = a[k] + 1, k++;
        break;
    default:
        break;
    }
    return k;
}

/* Element (ni, ci, y, x) of an [n, c, hh, ww] map in either layout. */
__device__ __forceinline__ size_t pad_at(int nhwc, size_t ni, int ci, int c, int y, int x, int hh, int ww)
{
    return nhwc ? ((ni * hh + y) * ww + x) * (size_t)c + ci : ((ni * c + ci) * hh + y) * ww + x;
}

template <typename T>
__global__ void k_pad_fwd(const T *__restrict__ x, T *__restrict__ y, size_t len, pad_geom g, float value, int nhwc)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        int ci, r, q;
        size_t ni;
        if (nhwc) {
            ci = (int)(e % (size_t)g.c);
            const size_t pix = e / (size_t)g.c;
            q = (int)(pix % (size_t)g.ow);
            r = (int)((pix / (size_t)g.ow) % (size_t)g.oh);
            ni = pix / ((size_t)g.ow * g.oh);
        } else {
            q = (int)(e % (size_t)g.ow);
            r = (int)((e / (size_t)g.ow) % (size_t)g.oh);
            const size_t nc = e / ((size_t)g.ow * g.oh);
            ci = (int)(nc % (size_t)g.c);
            ni = nc / (size_t)g.c;
        }
        const int sr = pad_src(r, g.t, g.h, g.mode), sq = pad_src(q, g.l, g.w, g.mode);
        y[e] = sr < 0 || sq < 0 ? cu_to<T>(value) : x[pad_at(nhwc, ni, ci, g.c, sr, sq, g.h, g.w)];
    }
}

/* NHWC, one thread per vector V of a pixel's channels (cv vectors a pixel,
 * len of them in all, below 2^31): the forward of every mode. fill: value
 * as a vector of elements. */
template <typename V>
__global__ void k_pad_fwd_nhwc(const V *__restrict__ x, V *__restrict__ y, unsigned len, unsigned cv, pad_geom g,
                               V fill)
{
    const unsigned step = gridDim.x * blockDim.x;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        const unsigned pix = e / cv, ow = (unsigned)g.ow, oh = (unsigned)g.oh;
        const unsigned q = pix % ow, rn = pix / ow, r = rn % oh, ni = rn / oh;
        const int sr = pad_src((int)r, g.t, g.h, g.mode), sq = pad_src((int)q, g.l, g.w, g.mode);
        y[e] = sr < 0 || sq < 0 ? fill : x[((ni * (unsigned)g.h + (unsigned)sr) * (unsigned)g.w + (unsigned)sq) * cv +
                                           e % cv];
    }
}

/* NHWC, mode constant: each input pixel is read by exactly one output
 * pixel, so its gradient is that pixel's, moved as the forward moves it. */
template <typename V>
__global__ void k_pad_bwd_nhwc_constant(const V *__restrict__ dy, V *__restrict__ dx, unsigned len, unsigned cv,
                                        pad_geom g)
{
    const unsigned step = gridDim.x * blockDim.x;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        const unsigned pix = e / cv, w = (unsigned)g.w, h = (unsigned)g.h;
        const unsigned iw = pix % w, hn = pix / w, ih = hn % h, ni = hn / h;
        dx[e] = dy[((ni * (unsigned)g.oh + ih + (unsigned)g.t) * (unsigned)g.ow + iw + (unsigned)g.l) * cv + e % cv];
    }
}

/* One thread per input element: the sum, in a fixed order (row ranges,
 * then rows, then column ranges, then columns), of dy over the outputs that
 * read it. */
template <typename T>
__global__ void k_pad_bwd(const T *__restrict__ dy, T *__restrict__ dx, size_t len, pad_geom g, int nhwc)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < len; e += step) {
        int ci, ih, iw;
        size_t ni;
        if (nhwc) {
            ci = (int)(e % (size_t)g.c);
            const size_t pix = e / (size_t)g.c;
            iw = (int)(pix % (size_t)g.w);
            ih = (int)((pix / (size_t)g.w) % (size_t)g.h);
            ni = pix / ((size_t)g.w * g.h);
        } else {
            iw = (int)(e % (size_t)g.w);
            ih = (int)((e / (size_t)g.w) % (size_t)g.h);
            const size_t nc = e / ((size_t)g.w * g.h);
            ci = (int)(nc % (size_t)g.c);
            ni = nc / (size_t)g.c;
        }
        int ra[3], re[3], ca[3], ce[3];
        const int nr = pad_readers(ih, g.t, g.b, g.h, g.mode, ra, re);
        const int nq = pad_readers(iw, g.l, g.r, g.w, g.mode, ca, ce);
        float acc = 0.f;
        for (int i = 0; i < nr; i++)
            for (int r = ra[i]; r < re[i]; r++)
                for (int j = 0; j < nq; j++)
                    for (int q = ca[j]; q < ce[j]; q++)
                        acc += cu_f(dy[pad_at(nhwc, ni, ci, g.c, r, q, g.oh, g.ow)]);
        dx[e] = cu_to<T>(acc);
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

/* The geometry of a pad, or -1 with the reason set: F.pad's bounds. */
static int pad_geom_of(const char *fn, sf_dtype dt, int n, int c, int h, int w, const int pad[4], int mode,
                       pad_geom *g)
{
    if (cu_dt_bad(fn, dt))
        return -1;
    if (n < 0 || c < 1 || h < 1 || w < 1 || mode < SF_PAD_CONSTANT || mode > SF_PAD_CIRCULAR) {
        sf_cuda_set_error("%s:%d: %s: mode %d of %d channels of %dx%d", __FILE__, __LINE__, fn, mode, c, h, w);
        return -1;
    }
    for (int j = 0; j < 4; j++) {
        const int dim = j < 2 ? w : h;
        const int over = mode == SF_PAD_REFLECT ? pad[j] >= dim : mode == SF_PAD_CIRCULAR ? pad[j] > dim : 0;
        if (pad[j] < 0 || pad[j] > SF_MAX_PAD || over) {
            sf_cuda_set_error("%s:%d: %s: pad [%d, %d, %d, %d] of mode %d on a %dx%d map", __FILE__, __LINE__, fn,
                              pad[0], pad[1], pad[2], pad[3], mode, h, w);
            return -1;
        }
    }
    *g = pad_geom{c, h, w, h + pad[2] + pad[3], w + pad[0] + pad[1], pad[0], pad[1], pad[2], pad[3], mode};
    return 0;
}

/* The widest vector (16, 8, 4 or 2 bytes) that a pixel's channels (c of
 * them) and both pointers divide, and the vectors a pixel and in all; 0
 * where NHWC's vector kernels do not apply (NCHW, or 2^31 vectors and
 * more). */
static int pad_vec(sf_layout lay, sf_dtype dt, size_t pixels, int c, const void *a, const void *b, unsigned *cv,
                   unsigned *len)
{
    if (lay != SF_LAYOUT_NHWC)
        return 0;
    const size_t bytes = (size_t)c * sf_dtype_size(dt);
    const int al = sf_cuda_ptr_align(a) < sf_cuda_ptr_align(b) ? sf_cuda_ptr_align(a) : sf_cuda_ptr_align(b);
    for (int v = al; v >= 2; v /= 2)
        if (bytes % v == 0 && pixels * (bytes / v) < (1u << 31)) {
            *cv = (unsigned)(bytes / v);
            *len = (unsigned)(pixels * *cv);
            return v;
        }
    return 0;
}

/* value as a vector of vb bytes of the element type's bits. */
template <typename V> static V pad_fill(sf_dtype dt, float value, int vb)
{
    V v;
    unsigned char *p = (unsigned char *)&v;
    memset(p, 0, sizeof v);
    if (dt == SF_DT_BF16) {
        const cu_bf16 b = __float2bfloat16_rn(value);
        for (int i = 0; i + 2 <= vb; i += 2)
            memcpy(p + i, &b, 2);
    } else {
        for (int i = 0; i + 4 <= vb; i += 4)
            memcpy(p + i, &value, 4);
    }
    return v;
}

/* The NHWC forward at vb bytes a vector. */
static void pad_fwd_nhwc(int vb, sf_dtype dt, const void *x, void *y, unsigned len, unsigned cv, const pad_geom &g,
                         float value, cudaStream_t s)
{
    const unsigned b = cu_ew_blocks(len);
    switch (vb) {
    case 16:
        k_pad_fwd_nhwc<uint4><<<b, CU_TPB, 0, s>>>((const uint4 *)x, (uint4 *)y, len, cv, g,
                                                   pad_fill<uint4>(dt, value, 16));
        break;
    case 8:
        k_pad_fwd_nhwc<uint2><<<b, CU_TPB, 0, s>>>((const uint2 *)x, (uint2 *)y, len, cv, g,
                                                   pad_fill<uint2>(dt, value, 8));
        break;
    case 4:
        k_pad_fwd_nhwc<unsigned><<<b, CU_TPB, 0, s>>>((const unsigned *)x, (unsigned *)y, len, cv, g,
                                                      pad_fill<unsigned>(dt, value, 4));
        break;
    default:
        k_pad_fwd_nhwc<unsigned short><<<b, CU_TPB, 0, s>>>((const unsigned short *)x, (unsigned short *)y, len, cv,
                                                            g, pad_fill<unsigned short>(dt, value, 2));
        break;
    }
}

/* The NHWC backward of mode constant at vb bytes a vector. */
static void pad_bwd_nhwc_constant(int vb, const void *dy, void *dx, unsigned len, unsigned cv, const pad_geom &g,
                                  cudaStream_t s)
{
    const unsigned b = cu_ew_blocks(len);
    switch (vb) {
    case 16: k_pad_bwd_nhwc_constant<uint4><<<b, CU_TPB, 0, s>>>((const uint4 *)dy, (uint4 *)dx, len, cv, g); break;
    case 8: k_pad_bwd_nhwc_constant<uint2><<<b, CU_TPB, 0, s>>>((const uint2 *)dy, (uint2 *)dx, len, cv, g); break;
    case 4:
        k_pad_bwd_nhwc_constant<unsigned><<<b, CU_TPB, 0, s>>>((const unsigned *)dy, (unsigned *)dx, len, cv, g);
        break;
    default:
        k_pad_bwd_nhwc_constant<unsigned short><<<b, CU_TPB, 0, s>>>((const unsigned short *)dy,
                                                                     (unsigned short *)dx, len, cv, g);
        break;
    }
}

extern "C" int sf_cuda_pad_fwd_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, int h, int w,
                                  const int pad[4], int mode, float value, void *y, cudaStream_t s)
{
    pad_geom g;
    if (pad_geom_of("sf_cuda_pad_fwd_dt", dt, n, c, h, w, pad, mode, &g))
        return -1;
    const size_t len = (size_t)n * c * g.oh * g.ow;
    if (len == 0)
        return 0;
    unsigned cv, vlen;
    const int vb = pad_vec(lay, dt, (size_t)n * g.oh * g.ow, c, x, y, &cv, &vlen);
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (vb)
        pad_fwd_nhwc(vb, dt, x, y, vlen, cv, g, value, s);
    else if (dt == SF_DT_BF16)
        k_pad_fwd<cu_bf16><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const cu_bf16 *)x, (cu_bf16 *)y, len, g, value,
                                                                 nhwc);
    else
        k_pad_fwd<float><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const float *)x, (float *)y, len, g, value, nhwc);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_pad_bwd_dt(sf_dtype dt, sf_layout lay, const void *dy, int n, int c, int h, int w,
                                  const int pad[4], int mode, void *dx, cudaStream_t s)
{
    pad_geom g;
    if (pad_geom_of("sf_cuda_pad_bwd_dt", dt, n, c, h, w, pad, mode, &g))
        return -1;
    const size_t len = (size_t)n * c * h * w;
    if (len == 0)
        return 0;
    unsigned cv, vlen;
    const int vb = mode == SF_PAD_CONSTANT ? pad_vec(lay, dt, (size_t)n * h * w, c, dy, dx, &cv, &vlen) : 0;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (vb)
        pad_bwd_nhwc_constant(vb, dy, dx, vlen, cv, g, s);
    else if (dt == SF_DT_BF16)
        k_pad_bwd<cu_bf16><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const cu_bf16 *)dy, (cu_bf16 *)dx, len, g, nhwc);
    else
        k_pad_bwd<float><<<cu_ew_blocks(len), CU_TPB, 0, s>>>((const float *)dy, (float *)dx, len, g, nhwc);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}
