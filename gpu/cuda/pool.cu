/* gpu/cuda/pool.cu — kernels first, then launchers: MaxPool2d for any window
 * (ceil_mode too) plus a k3 s2 p1 path (ResNet's stem) with the same results,
 * global average pooling, AvgPool2d and AdaptiveAvgPool2d. Contracts in
 * pool.h. */
#include "gpu/cuda/pool.h"

#include "gpu/cuda/kernel_common.cuh"
#include "gpu/pool_rule.h"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* Element u of a pooling tensor [N, C, Y, X] (NHWC or NCHW; 32-bit index
 * arithmetic: the launchers keep tensors under 2^32 elements): its x, y, and
 * where its (n, c) plane starts in the other tensor of the pair, whose planes
 * hold other_hw elements, with the stride between that plane's elements. */
__device__ __forceinline__ void pool_index(unsigned u, int C, int X, int Y, int nhwc, size_t other_hw, int *x,
                                             int *y, size_t *base, size_t *step)
{
    if (nhwc) {
        const unsigned c = u % (unsigned)C;
        unsigned r = u / (unsigned)C;
        *x = (int)(r % (unsigned)X);
        r /= (unsigned)X;
        *y = (int)(r % (unsigned)Y);
        const unsigned ni = r / (unsigned)Y;
        *base = (size_t)ni * other_hw * C + c;
        *step = (size_t)C;
    } else {
        *x = (int)(u % (unsigned)X);
        unsigned r = u / (unsigned)X;
        *y = (int)(r % (unsigned)Y);
        r /= (unsigned)Y; /* ni*C + c */
        *base = (size_t)r * other_hw;
        *step = 1;
    }
}

/* The windows o0..o1 of one dimension (k taps, stride s, padding p, O
 * windows) that hold input index i: o*s - p <= i <= o*s - p + k - 1. */
__device__ __forceinline__ void pool_windows(int i, int k, int s, int p, int O, int *o0, int *o1)
{
    const int t = i + p - k + 1;
    const unsigned us = (unsigned)s;
    *o0 = t > 0 ? (int)(((unsigned)t + us - 1) / us) : 0;
    const int hi = (int)((unsigned)(i + p) / us);
    *o1 = hi > O - 1 ? O - 1 : hi;
}

/* Any window: a thread per output element. NCHW: index = ((ni*C + c)*oh + oy)*ow + ox;
 * NHWC: ((ni*oh + oy)*ow + ox)*C + c. As PyTorch: the first in-bounds input
 * starts the running maximum at -inf; a larger value or a NaN replaces it. */
template <typename T, int KT, int ST>
__global__ void k_maxpool_fwd(const T *__restrict__ x, int C, int H, int W, int k_arg, int s_arg, int pad, int OH,
                              int OW, int nhwc, size_t total, T *__restrict__ y, int32_t *__restrict__ am)
{
    /* KT, ST: the window and stride as compile-time constants, or 0 for run-time values */
    const int k = KT ? KT : k_arg, stride = ST ? ST : s_arg;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    int ox, oy;
    size_t plane, cs;
    pool_index((unsigned)i, C, OW, OH, nhwc, (size_t)H * W, &ox, &oy, &plane, &cs);
    const int ys = oy * stride - pad, xs = ox * stride - pad;
    const int y0 = ys > 0 ? ys : 0, x0 = xs > 0 ? xs : 0;
    const int y1 = ys + k < H ? ys + k : H, x1 = xs + k < W ? xs + k : W;
    float m = -INFINITY;
    int arg = y0 * W + x0;
    for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++) {
            const int idx = iy * W + ix;
            const float v = cu_f(x[plane + (size_t)idx * cs]);
            if (v > m || isnan(v)) {
                m = v;
                arg = idx;
            }
        }
    y[i] = cu_to<T>(m);
    am[i] = arg;
}

/* Any window: a thread per input element, the sum in row-major output order of
 * dy over the windows containing it whose argmax is it. dy is loaded with the
 * argmax, not after the comparison, so the two loads overlap. */
template <typename T, int KT, int ST>
__global__ void k_maxpool_bwd(const T *__restrict__ dy, const int32_t *__restrict__ am, int C, int H, int W,
                              int k_arg, int s_arg, int pad, int OH, int OW, int nhwc, size_t total,
                              T *__restrict__ dx)
{
    const int k = KT ? KT : k_arg, stride = ST ? ST : s_arg;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    int ix, iy;
    size_t obase, os;
    pool_index((unsigned)i, C, W, H, nhwc, (size_t)OH * OW, &ix, &iy, &obase, &os);
    int oy0, oy1, ox0, ox1;
    pool_windows(iy, k, stride, pad, OH, &oy0, &oy1);
    pool_windows(ix, k, stride, pad, OW, &ox0, &ox1);
    const int me = iy * W + ix;
    float s = 0.f;
    for (int oy = oy0; oy <= oy1; oy++)
        for (int ox = ox0; ox <= ox1; ox++) {
            const size_t o = obase + ((size_t)oy * OW + ox) * os;
            const int a = am[o];
            const float d = cu_f(dy[o]);
            if (a == me)
                s += d;
        }
    dx[i] = cu_to<T>(s);
}

/* Thread i of an NHWC kernel over (sample, row, column, channel vector),
 * Cv vectors a position: its vector cv, column x, row y and sample ni. */
__device__ __forceinline__ void nhwc_vec_pos(unsigned i, unsigned Cv, int X, int Y, unsigned *cv, int *x, int *y,
                                             unsigned *ni)
{
    *cv = i % Cv;
    unsigned r = i / Cv;
    *x = (int)(r % (unsigned)X);
    r /= (unsigned)X;
    *y = (int)(r % (unsigned)Y);
    *ni = r / (unsigned)Y;
}

/* Any window, NHWC, V channels a thread (V = 16/sizeof(T); C % V == 0 and
 * x, y, argmax, dy, dx 16-byte aligned): the loops of k_maxpool_fwd and
 * k_maxpool_bwd on whole 16-byte vectors, so the same comparisons and the
 * same sums in the same order, the same bits. The scalar kernels read 2 or 4
 * bytes a thread with an index division per element; these read a channel
 * vector per load (SqueezeNet's k3 s2 ceil_mode windows, VGG's k2 s2). */
template <typename T, int V, int KT, int ST>
__global__ void __launch_bounds__(CU_TPB)
    k_maxpool_fwd_vec(const T *__restrict__ x, int C, int H, int W, int k_arg, int s_arg, int pad, int OH, int OW,
                      unsigned total, T *__restrict__ y, int32_t *__restrict__ am)
{
    const int k = KT ? KT : k_arg, stride = ST ? ST : s_arg;
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    unsigned cv, ni;
    int ox, oy;
    nhwc_vec_pos(i, (unsigned)C / V, OW, OH, &cv, &ox, &oy, &ni);
    const T *xb = x + (size_t)ni * H * W * C + cv * V;
    const int ys = oy * stride - pad, xs = ox * stride - pad;
    const int y0 = ys > 0 ? ys : 0, x0 = xs > 0 ? xs : 0;
    const int y1 = ys + k < H ? ys + k : H, x1 = xs + k < W ? xs + k : W;
    float m[V];
    int arg[V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        m[j] = -INFINITY;
        arg[j] = y0 * W + x0;
    }
    for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++) {
            const int idx = iy * W + ix;
            float v[V];
            cu_ld<T, V>(xb + (size_t)idx * C, v);
#pragma unroll
            for (int j = 0; j < V; j++)
                if (v[j] > m[j] || isnan(v[j])) {
                    m[j] = v[j];
                    arg[j] = idx;
                }
        }
    cu_st<T, V>(y + (size_t)i * V, m);
    cu_sti<V>(am + (size_t)i * V, arg);
}

template <typename T, int V, int KT, int ST>
__global__ void __launch_bounds__(CU_TPB)
    k_maxpool_bwd_vec(const T *__restrict__ dy, const int32_t *__restrict__ am, int C, int H, int W, int k_arg,
                      int s_arg, int pad, int OH, int OW, unsigned total, T *__restrict__ dx)
{
    const int k = KT ? KT : k_arg, stride = ST ? ST : s_arg;
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    unsigned cv, ni;
    int ix, iy;
    nhwc_vec_pos(i, (unsigned)C / V, W, H, &cv, &ix, &iy, &ni);
    int oy0, oy1, ox0, ox1;
    pool_windows(iy, k, stride, pad, OH, &oy0, &oy1);
    pool_windows(ix, k, stride, pad, OW, &ox0, &ox1);
    const int me = iy * W + ix;
    const size_t ob = (size_t)ni * OH * OW * C + cv * V;
    float s[V];
#pragma unroll
    for (int j = 0; j < V; j++)
        s[j] = 0.f;
    for (int oy = oy0; oy <= oy1; oy++)
        for (int ox = ox0; ox <= ox1; ox++) {
            const size_t o = ob + ((size_t)oy * OW + ox) * C;
            int a[V];
            float d[V];
            cu_ldi<V>(am + o, a);
            cu_ld<T, V>(dy + o, d);
#pragma unroll
            for (int j = 0; j < V; j++)
                if (a[j] == me)
                    s[j] += d[j];
        }
    cu_st<T, V>(dx + (size_t)i * V, s);
}

/* ---- maxpool k3 s2 p1 (ResNet's stem), the same results ---------------------- *
 * Output (oy, ox) covers inputs 2oy-1 .. 2oy+1 (rows and columns alike), so
 * input 2m lies in window m only and input 2m+1 in windows m and m+1; and
 * oh = ceil(h/2), ow = ceil(w/2). The forward takes all nine taps in flight at
 * once; the backward gives a thread the input quad (2m..2m+1, 2n..2n+1), whose
 * windows are the four outputs (m..m+1, n..n+1): four argmax and four dy loads,
 * issued together, and four outputs. */

/* NCHW forward: a thread per output. */
template <typename T>
__global__ void k_mp3_fwd_nchw(const T *__restrict__ x, int H, int W, int OH, int OW, unsigned total,
                               T *__restrict__ y, int32_t *__restrict__ am)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    const unsigned ox = i % (unsigned)OW, r = i / (unsigned)OW;
    const unsigned oy = r % (unsigned)OH, plane = r / (unsigned)OH;
    const T *xp = x + (size_t)plane * H * W;
    const int iy0 = 2 * (int)oy - 1, ix0 = 2 * (int)ox - 1;
    /* taps outside the input load the first inside one (unconditional loads,
     * all in flight together) and are skipped below */
    const int a0 = (iy0 > 0 ? iy0 : 0) * W + (ix0 > 0 ? ix0 : 0);
    float v[9];
    bool ok[9];
#pragma unroll
    for (int ky = 0; ky < 3; ky++)
#pragma unroll
        for (int kx = 0; kx < 3; kx++) {
            const int iy = iy0 + ky, ix = ix0 + kx;
            const bool in = (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
            ok[ky * 3 + kx] = in;
            v[ky * 3 + kx] = cu_f(xp[in ? iy * W + ix : a0]);
        }
    float m = -INFINITY;
    int arg = a0;
#pragma unroll
    for (int t = 0; t < 9; t++)
        if (ok[t] && (v[t] > m || isnan(v[t]))) {
            m = v[t];
            arg = (iy0 + t / 3) * W + ix0 + t % 3;
        }
    y[i] = cu_to<T>(m);
    am[i] = arg;
}

/* Two adjacent elements (p aligned to two). */
template <typename T> __device__ __forceinline__ void st2(T *p, float a, float b)
{
    if constexpr (sizeof(T) == 4)
        *reinterpret_cast<float2 *>(p) = make_float2(a, b);
    else
        *reinterpret_cast<unsigned *>(p) = cu_pk2(a, b);
}

/* The sums of the quad's four inputs from its four windows' argmax a[] and dy
 * d[] (windows 00, 01, 10, 11 = (m, n), (m, n+1), (m+1, n), (m+1, n+1); a
 * missing window has argmax -1), each in row-major window order. */
__device__ __forceinline__ void mp3_quad(const int *a, const float *d, int me00, int W, float *s)
{
    const int me01 = me00 + 1, me10 = me00 + W, me11 = me10 + 1;
    float s00 = 0.f, s01 = 0.f, s10 = 0.f, s11 = 0.f;
    if (a[0] == me00)
        s00 += d[0];
    if (a[0] == me01)
        s01 += d[0];
    if (a[1] == me01)
        s01 += d[1];
    if (a[0] == me10)
        s10 += d[0];
    if (a[2] == me10)
        s10 += d[2];
    if (a[0] == me11)
        s11 += d[0];
    if (a[1] == me11)
        s11 += d[1];
    if (a[2] == me11)
        s11 += d[2];
    if (a[3] == me11)
        s11 += d[3];
    s[0] = s00;
    s[1] = s01;
    s[2] = s10;
    s[3] = s11;
}

/* NCHW backward: a thread per input quad (m, n); PAIR: w even and dx aligned
 * to two elements, so a quad row is one two-element store. */
template <typename T, int PAIR>
__global__ void k_mp3_bwd_nchw(const T *__restrict__ dy, const int32_t *__restrict__ am, int H, int W, int OH,
                               int OW, unsigned total, T *__restrict__ dx)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    const unsigned qx = i % (unsigned)OW, r = i / (unsigned)OW;
    const unsigned qy = r % (unsigned)OH, plane = r / (unsigned)OH;
    const bool nx = qx + 1 < (unsigned)OW, ny = qy + 1 < (unsigned)OH;
    const size_t o = (size_t)i; /* (plane*OH + qy)*OW + qx */
    int a[4];
    float d[4];
    /* missing windows load window 00 (unconditional loads) and are masked */
    const size_t o1 = nx ? o + 1 : o, o2 = ny ? o + OW : o, o3 = (nx && ny) ? o + OW + 1 : o;
    a[0] = am[o];
    a[1] = am[o1];
    a[2] = am[o2];
    a[3] = am[o3];
    d[0] = cu_f(dy[o]);
    d[1] = cu_f(dy[o1]);
    d[2] = cu_f(dy[o2]);
    d[3] = cu_f(dy[o3]);
    if (!nx) {
        a[1] = -1;
        d[1] = 0.f;
    }
    if (!ny) {
        a[2] = -1;
        d[2] = 0.f;
    }
    if (!(nx && ny)) {
        a[3] = -1;
        d[3] = 0.f;
    }
    const int iy = 2 * (int)qy, ix = 2 * (int)qx;
    float s[4];
    mp3_quad(a, d, iy * W + ix, W, s);
    T *p = dx + (size_t)plane * H * W + (size_t)iy * W + ix;
    const bool cy = iy + 1 < H;
    if (PAIR) {
        st2<T>(p, s[0], s[1]);
        if (cy)
            st2<T>(p + W, s[2], s[3]);
    } else {
        const bool cx = ix + 1 < W;
        p[0] = cu_to<T>(s[0]);
        if (cx)
            p[1] = cu_to<T>(s[1]);
        if (cy) {
            p[W] = cu_to<T>(s[2]);
            if (cx)
                p[W + 1] = cu_to<T>(s[3]);
        }
    }
}

/* NHWC forward: a thread per (output pixel, V channels); V = 16/sizeof(T)
 * (C % V == 0, x, y, argmax 16-byte aligned) or 1. With pre (PRE), x is a
 * batchnorm's input and each tap is first the batchnorm + ReLU's output,
 * computed and rounded to T as that apply pass would have stored it, so the
 * values, the maxima and their positions are the same bits. */
template <typename T, int V, bool PRE>
__global__ void __launch_bounds__(CU_TPB)
    k_mp3_fwd_nhwc(const T *__restrict__ x, int C, int H, int W, int OH, int OW, unsigned total, T *__restrict__ y,
                   int32_t *__restrict__ am, sf_pool_pre_bn pre)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    const unsigned Cv = (unsigned)C / V;
    const unsigned cv = i % Cv;
    unsigned r = i / Cv;
    const unsigned ox = r % (unsigned)OW;
    r /= (unsigned)OW;
    const unsigned oy = r % (unsigned)OH, ni = r / (unsigned)OH;
    const T *xb = x + (size_t)ni * H * W * C + cv * V;
    const int iy0 = 2 * (int)oy - 1, ix0 = 2 * (int)ox - 1;
    const int a0 = (iy0 > 0 ? iy0 : 0) * W + (ix0 > 0 ? ix0 : 0);
    /* taps outside the input load the first inside one (unconditional loads,
     * all nine in flight together) and are skipped below */
    float v[9][V];
    bool ok[9];
#pragma unroll
    for (int ky = 0; ky < 3; ky++)
#pragma unroll
        for (int kx = 0; kx < 3; kx++) {
            const int iy = iy0 + ky, ix = ix0 + kx, t = ky * 3 + kx;
            ok[t] = (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
            cu_ld<T, V>(xb + (size_t)(ok[t] ? iy * W + ix : a0) * C, v[t]);
        }
    if constexpr (PRE) {
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int c = (int)cv * V + j;
            const float mu = pre.mean[c], iv = pre.invstd[c], ga = pre.gamma[c], be = pre.beta[c];
#pragma unroll
            for (int t = 0; t < 9; t++) {
                const float o = bn_out(v[t][j], mu, iv, ga, be);
                v[t][j] = cu_f(cu_to<T>(o > 0.f ? o : 0.f));
            }
        }
    }
    float m[V];
    int arg[V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        m[j] = -INFINITY;
        arg[j] = a0;
    }
#pragma unroll
    for (int t = 0; t < 9; t++) {
        if (!ok[t])
            continue;
        const int idx = (iy0 + t / 3) * W + ix0 + t % 3;
#pragma unroll
        for (int j = 0; j < V; j++)
            if (v[t][j] > m[j] || isnan(v[t][j])) {
                m[j] = v[t][j];
                arg[j] = idx;
            }
    }
    /* output element ((ni*OH + oy)*OW + ox)*C + cv*V == i*V */
    cu_st<T, V>(y + (size_t)i * V, m);
    cu_sti<V>(am + (size_t)i * V, arg);
}

/* NHWC backward: a thread per (input quad, V channels), V as the forward
 * (dy, argmax, dx aligned when V > 1). */
template <typename T, int V>
__global__ void __launch_bounds__(CU_TPB)
    k_mp3_bwd_nhwc(const T *__restrict__ dy, const int32_t *__restrict__ am, int C, int H, int W, int OH, int OW,
                   unsigned total, T *__restrict__ dx)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    const unsigned Cv = (unsigned)C / V;
    const unsigned cv = i % Cv;
    unsigned r = i / Cv;
    const unsigned qx = r % (unsigned)OW;
    r /= (unsigned)OW;
    const unsigned qy = r % (unsigned)OH, ni = r / (unsigned)OH;
    const bool nx = qx + 1 < (unsigned)OW, ny = qy + 1 < (unsigned)OH;
    const size_t o = (size_t)i * V; /* ((ni*OH + qy)*OW + qx)*C + cv*V */
    const size_t wo[4] = {0, (size_t)C, (size_t)OW * C, (size_t)(OW + 1) * C};
    const bool wok[4] = {true, nx, ny, nx && ny};
    /* missing windows load window 00 (unconditional loads) and are masked */
    int a[4][V];
    float d[4][V];
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const size_t ot = o + (wok[t] ? wo[t] : 0);
        cu_ldi<V>(am + ot, a[t]);
        cu_ld<T, V>(dy + ot, d[t]);
    }
#pragma unroll
    for (int t = 1; t < 4; t++)
        if (!wok[t]) {
#pragma unroll
            for (int j = 0; j < V; j++) {
                a[t][j] = -1;
                d[t][j] = 0.f;
            }
        }
    const int iy = 2 * (int)qy, ix = 2 * (int)qx;
    const int me00 = iy * W + ix;
    float s[4][V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int aj[4] = {a[0][j], a[1][j], a[2][j], a[3][j]};
        const float dj[4] = {d[0][j], d[1][j], d[2][j], d[3][j]};
        float sj[4];
        mp3_quad(aj, dj, me00, W, sj);
        s[0][j] = sj[0];
        s[1][j] = sj[1];
        s[2][j] = sj[2];
        s[3][j] = sj[3];
    }
    T *p = dx + (((size_t)ni * H + iy) * W + ix) * C + cv * V;
    const bool cx = ix + 1 < W, cy = iy + 1 < H;
    cu_st<T, V>(p, s[0]);
    if (cx)
        cu_st<T, V>(p + C, s[1]);
    if (cy) {
        cu_st<T, V>(p + (size_t)W * C, s[2]);
        if (cx)
            cu_st<T, V>(p + (size_t)(W + 1) * C, s[3]);
    }
}

/* NCHW: a warp per (n, c) plane. */
template <typename T>
__global__ void k_avgpool_fwd_nchw(const T *__restrict__ x, size_t planes, int hw, T *__restrict__ y)
{
    const size_t wid = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (wid >= planes)
        return;
    const T *p = x + wid * (size_t)hw;
    float s = 0.f;
    for (int j = lane; j < hw; j += 32)
        s += cu_f(p[j]);
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0)
        y[wid] = cu_to<T>(s / (float)hw);
}

/* dx = dy / hw broadcast over the plane; ADD: dx += that, in the same pass. */
template <typename T, bool ADD>
__global__ void k_avgpool_bwd(const T *__restrict__ dy, size_t total, int C, int hw, int nhwc, T *__restrict__ dx)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    size_t o;
    if (nhwc)
        o = (i / ((size_t)hw * C)) * C + i % C;
    else
        o = i / hw;
    const float g = cu_f(dy[o]) / (float)hw;
    dx[i] = cu_to<T>(ADD ? cu_f(dx[i]) + g : g);
}

/* k_avgpool_bwd over 16-byte vectors (dy, dx aligned; NHWC c % V == 0,
 * NCHW hw % V == 0): a vector's values come from V consecutive channels of
 * one sample, or from one plane's single value. */
template <typename T, int V, bool ADD>
__global__ void k_avgpool_bwd_vec(const T *__restrict__ dy, size_t nvec, int C, size_t hw, int nhwc,
                                  T *__restrict__ dx)
{
    const size_t step = (size_t)gridDim.x * blockDim.x, cv = (size_t)C / V;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += step) {
        float v[V];
        cu_ld_bcast<T, V>(dy, i, C, cv, hw, nhwc, v);
#pragma unroll
        for (int j = 0; j < V; j++)
            v[j] = v[j] / (float)hw;
        if constexpr (ADD) {
            float d[V];
            cu_ld<T, V>(dx + i * V, d);
#pragma unroll
            for (int j = 0; j < V; j++)
                v[j] = d[j] + v[j];
        }
        cu_st<T, V>(dx + i * V, v);
    }
}

/* ---- AvgPool2d and AdaptiveAvgPool2d ------------------------------------------ */

/* PyTorch's avg_pool2d window of output o: [o*s - p, min(o*s - p + k, in + p)),
 * whose length is the divisor with count_include_pad; the taps are its part
 * inside [0, in), whose size is the divisor without it. */
__device__ __forceinline__ void avg_window(int o, int k, int s, int p, int in, int *a, int *b, int *span)
{
    const int lo = o * s - p;
    const int hi = lo + k < in + p ? lo + k : in + p;
    *span = hi - lo;
    *a = lo > 0 ? lo : 0;
    *b = hi < in ? hi : in;
}

__device__ __forceinline__ float avg_divisor(int oy, int ox, int k, int s, int p, int H, int W, int cip)
{
    int y0, y1, sy, x0, x1, sx;
    avg_window(oy, k, s, p, H, &y0, &y1, &sy);
    avg_window(ox, k, s, p, W, &x0, &x1, &sx);
    return (float)(cip ? sy * sx : (y1 - y0) * (x1 - x0));
}

/* A thread per output element; the taps summed in row-major order in fp32. */
template <typename T>
__global__ void k_avgpool2d_fwd(const T *__restrict__ x, int C, int H, int W, int k, int stride, int pad, int cip,
                                int OH, int OW, int nhwc, size_t total, T *__restrict__ y)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    int ox, oy;
    size_t plane, cs;
    pool_index((unsigned)i, C, OW, OH, nhwc, (size_t)H * W, &ox, &oy, &plane, &cs);
    int y0, y1, sy, x0, x1, sx;
    avg_window(oy, k, stride, pad, H, &y0, &y1, &sy);
    avg_window(ox, k, stride, pad, W, &x0, &x1, &sx);
    float acc = 0.f;
    for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++)
            acc += cu_f(x[plane + ((size_t)iy * W + ix) * cs]);
    const int div = cip ? sy * sx : (y1 - y0) * (x1 - x0);
    y[i] = cu_to<T>(div > 0 ? acc / (float)div : 0.f);
}

/* A thread per input element: the sum, in row-major output order, of dy/divisor
 * over the windows that hold it (a gather: no zeroing, no atomics). */
template <typename T>
__global__ void k_avgpool2d_bwd(const T *__restrict__ dy, int C, int H, int W, int k, int stride, int pad, int cip,
                                int OH, int OW, int nhwc, size_t total, T *__restrict__ dx)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    int ix, iy;
    size_t obase, os;
    pool_index((unsigned)i, C, W, H, nhwc, (size_t)OH * OW, &ix, &iy, &obase, &os);
    int oy0, oy1, ox0, ox1;
    pool_windows(iy, k, stride, pad, OH, &oy0, &oy1);
    pool_windows(ix, k, stride, pad, OW, &ox0, &ox1);
    float s = 0.f;
    for (int oy = oy0; oy <= oy1; oy++)
        for (int ox = ox0; ox <= ox1; ox++) {
            const float div = avg_divisor(oy, ox, k, stride, pad, H, W, cip);
            if (div > 0.f)
                s += cu_f(dy[obase + ((size_t)oy * OW + ox) * os]) / div;
        }
    dx[i] = cu_to<T>(s);
}

/* Vector i of an NHWC tensor [N, Y, X, Cv vectors]: its channel vector, x, y
 * and sample. */
__device__ __forceinline__ void nhwc_vec_at(unsigned i, unsigned Cv, int X, int Y, unsigned *cv, int *x, int *y,
                                            unsigned *ni)
{
    *cv = i % Cv;
    unsigned r = i / Cv;
    *x = (int)(r % (unsigned)X);
    r /= (unsigned)X;
    *y = (int)(r % (unsigned)Y);
    *ni = r / (unsigned)Y;
}

/* NHWC over 16-byte vectors of V channels (C % V == 0, x and y aligned): a
 * thread per (output pixel, V channels), summing the taps in the order of
 * k_avgpool2d_fwd, so that the results are the same bits. A thread per
 * element redid the index arithmetic (three divisions, the window) for each
 * of the V channels: ResNet-D's 2x2 shortcut pool over a 56x56x256 bf16 map
 * took 0.71 ms on an H200, a ninth of its memory speed. */
template <typename T, int V>
__global__ void __launch_bounds__(CU_TPB)
    k_avgpool2d_fwd_nhwc(const T *__restrict__ x, int C, int H, int W, int k, int stride, int pad, int cip, int OH,
                         int OW, unsigned total, T *__restrict__ y)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    unsigned cv, ni;
    int ox, oy;
    nhwc_vec_at(i, (unsigned)C / V, OW, OH, &cv, &ox, &oy, &ni);
    int y0, y1, sy, x0, x1, sx;
    avg_window(oy, k, stride, pad, H, &y0, &y1, &sy);
    avg_window(ox, k, stride, pad, W, &x0, &x1, &sx);
    const T *xb = x + (size_t)ni * H * W * C + cv * V;
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; j++)
        acc[j] = 0.f;
    for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++) {
            float v[V];
            cu_ld<T, V>(xb + ((size_t)iy * W + ix) * C, v);
#pragma unroll
            for (int j = 0; j < V; j++)
                acc[j] += v[j];
        }
    const int div = cip ? sy * sx : (y1 - y0) * (x1 - x0);
#pragma unroll
    for (int j = 0; j < V; j++)
        acc[j] = div > 0 ? acc[j] / (float)div : 0.f;
    cu_st<T, V>(y + (size_t)i * V, acc); /* ((ni*OH + oy)*OW + ox)*C + cv*V == i*V */
}

/* The backward of k_avgpool2d_fwd_nhwc: a thread per (input pixel, V
 * channels), gathering as k_avgpool2d_bwd does and in its order. */
template <typename T, int V>
__global__ void __launch_bounds__(CU_TPB)
    k_avgpool2d_bwd_nhwc(const T *__restrict__ dy, int C, int H, int W, int k, int stride, int pad, int cip, int OH,
                         int OW, unsigned total, T *__restrict__ dx)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    unsigned cv, ni;
    int ix, iy;
    nhwc_vec_at(i, (unsigned)C / V, W, H, &cv, &ix, &iy, &ni);
    int oy0, oy1, ox0, ox1;
    pool_windows(iy, k, stride, pad, OH, &oy0, &oy1);
    pool_windows(ix, k, stride, pad, OW, &ox0, &ox1);
    const T *db = dy + (size_t)ni * OH * OW * C + cv * V;
    float s[V];
#pragma unroll
    for (int j = 0; j < V; j++)
        s[j] = 0.f;
    for (int oy = oy0; oy <= oy1; oy++)
        for (int ox = ox0; ox <= ox1; ox++) {
            const float div = avg_divisor(oy, ox, k, stride, pad, H, W, cip);
            if (div > 0.f) {
                float v[V];
                cu_ld<T, V>(db + ((size_t)oy * OW + ox) * C, v);
#pragma unroll
                for (int j = 0; j < V; j++)
                    s[j] += v[j] / div;
            }
        }
    cu_st<T, V>(dx + (size_t)i * V, s);
}

/* AdaptiveAvgPool2d's bins (sf_ref_bin_start/end): output o of out covers
 * [floor(o*in/out), ceil((o+1)*in/out)). */
__device__ __forceinline__ int bin_start(int o, int in, int out) { return (int)(((long long)o * in) / out); }
__device__ __forceinline__ int bin_end(int o, int in, int out)
{
    return (int)((((long long)o + 1) * in + out - 1) / out);
}

template <typename T>
__global__ void k_adaptive_avgpool_fwd(const T *__restrict__ x, int C, int H, int W, int OH, int OW, int nhwc,
                                       size_t total, T *__restrict__ y)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    int ox, oy;
    size_t plane, cs;
    pool_index((unsigned)i, C, OW, OH, nhwc, (size_t)H * W, &ox, &oy, &plane, &cs);
    const int y0 = bin_start(oy, H, OH), y1 = bin_end(oy, H, OH);
    const int x0 = bin_start(ox, W, OW), x1 = bin_end(ox, W, OW);
    float acc = 0.f;
    for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++)
            acc += cu_f(x[plane + ((size_t)iy * W + ix) * cs]);
    y[i] = cu_to<T>(acc / (float)((y1 - y0) * (x1 - x0)));
}

/* A thread per input element: the bins holding input i are the outputs o
 * with floor(i*out/in) <= o and bin_start(o) <= i (bins are monotonic). */
template <typename T>
__global__ void k_adaptive_avgpool_bwd(const T *__restrict__ dy, int C, int H, int W, int OH, int OW, int nhwc,
                                       size_t total, T *__restrict__ dx)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    int ix, iy;
    size_t obase, os;
    pool_index((unsigned)i, C, W, H, nhwc, (size_t)OH * OW, &ix, &iy, &obase, &os);
    const int oy0 = (int)(((long long)iy * OH) / H), ox0 = (int)(((long long)ix * OW) / W);
    float s = 0.f;
    for (int oy = oy0; oy < OH && bin_start(oy, H, OH) <= iy; oy++) {
        if (bin_end(oy, H, OH) <= iy)
            continue;
        const int sy = bin_end(oy, H, OH) - bin_start(oy, H, OH);
        for (int ox = ox0; ox < OW && bin_start(ox, W, OW) <= ix; ox++) {
            if (bin_end(ox, W, OW) <= ix)
                continue;
            const int sx = bin_end(ox, W, OW) - bin_start(ox, W, OW);
            s += cu_f(dy[obase + ((size_t)oy * OW + ox) * os]) / (float)(sy * sx);
        }
    }
    dx[i] = cu_to<T>(s);
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

static int pool_check(const char *fn, int n, int c, int h, int w, int k, int stride, int pad, int ceil_mode, int *oh,
                      int *ow)
{
    if (n < 1 || c < 1 || h < 1 || w < 1 || k < 1 || stride < 1 || pad < 0 || 2 * pad > k ||
        (double)n * c * h * w >= 4294967296.0 || (double)h * w >= 2147483648.0 ||
        sf_pool_out_size(h, k, stride, pad, ceil_mode) < 1 || sf_pool_out_size(w, k, stride, pad, ceil_mode) < 1) {
        sf_cuda_set_error("%s:%d: %s: n=%d c=%d %dx%d k=%d stride=%d pad=%d", __FILE__, __LINE__, fn, n, c, h, w,
                          k, stride, pad);
        return -1;
    }
    *oh = sf_pool_out_size(h, k, stride, pad, ceil_mode);
    *ow = sf_pool_out_size(w, k, stride, pad, ceil_mode);
    return 0;
}

/* k3 s2 p1 takes the stem kernels (oh = ceil(h/2): one quad of inputs per
 * output in the backward); other windows the generic ones, on channel vectors
 * where the NHWC map allows. */
template <typename T>
static int maxpool_fwd_t(const char *fn, const T *x, int n, int c, int h, int w, int k, int stride, int pad,
                         int ceil_mode, sf_layout lay, T *y, int32_t *argmax, const sf_pool_pre_bn *pre,
                         cudaStream_t s)
{
    constexpr int VEC = 16 / sizeof(T);
    int oh, ow;
    if (pool_check(fn, n, c, h, w, k, stride, pad, ceil_mode, &oh, &ow))
        return -1;
    /* the stem kernels assume the floor size; a ceil_mode size that differs
     * takes the generic kernels, which clip the last window to the input */
    const int floor_size = oh == sf_pool_out_size(h, k, stride, pad, 0) && ow == sf_pool_out_size(w, k, stride, pad, 0);
    const int nhwc = lay == SF_LAYOUT_NHWC;
    const sf_pool_pre_bn none = {NULL, NULL, NULL, NULL};
    if (pre) {
        if (!floor_size ||
            !sf_cuda_maxpool_pre_bn_ok(sizeof(T) == 2 ? SF_DT_BF16 : SF_DT_F32, lay, c, k, stride, pad) ||
            !cu_al16(x) || !cu_al16(y) || !cu_al16(argmax)) {
            sf_cuda_set_error("%s:%d: %s: no batchnorm-fused kernel for c%d k%d s%d p%d (layout %d) or unaligned "
                              "tensors", __FILE__, __LINE__, fn, c, k, stride, pad, (int)lay);
            return -1;
        }
        const unsigned total = (unsigned)((size_t)n * oh * ow * (c / VEC));
        k_mp3_fwd_nhwc<T, VEC, true><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(x, c, h, w, oh, ow, total, y, argmax,
                                                                               *pre);
        SF_CUDA_CHECK_LAUNCH();
        return 0;
    }
    /* channel vectors: NHWC, whole vectors, every tensor 16-byte aligned */
    const int vec = nhwc && c % VEC == 0 && cu_al16(x) && cu_al16(y) && cu_al16(argmax);
    if (k == 3 && stride == 2 && pad == 1 && floor_size) {
        if (vec) {
            const unsigned total = (unsigned)((size_t)n * oh * ow * (c / VEC));
            k_mp3_fwd_nhwc<T, VEC, false><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(x, c, h, w, oh, ow, total, y,
                                                                                    argmax, none);
        } else if (nhwc) {
            const unsigned total = (unsigned)((size_t)n * oh * ow * c);
            k_mp3_fwd_nhwc<T, 1, false><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(x, c, h, w, oh, ow, total, y,
                                                                                  argmax, none);
        } else {
            const unsigned total = (unsigned)((size_t)n * c * oh * ow);
            k_mp3_fwd_nchw<T><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(x, h, w, oh, ow, total, y, argmax);
        }
    } else if (vec) {
        const unsigned total = (unsigned)((size_t)n * oh * ow * (c / VEC));
        if (k == 3 && stride == 2)
            k_maxpool_fwd_vec<T, VEC, 3, 2><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(x, c, h, w, k, stride, pad, oh,
                                                                                     ow, total, y, argmax);
        else if (k == 2 && stride == 2)
            k_maxpool_fwd_vec<T, VEC, 2, 2><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(x, c, h, w, k, stride, pad, oh,
                                                                                     ow, total, y, argmax);
        else
            k_maxpool_fwd_vec<T, VEC, 0, 0><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(x, c, h, w, k, stride, pad, oh,
                                                                                     ow, total, y, argmax);
    } else {
        const size_t total = (size_t)n * c * oh * ow;
        if (k == 3 && stride == 2)
            k_maxpool_fwd<T, 3, 2><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(x, c, h, w, k, stride, pad, oh, ow,
                                                                            nhwc, total, y, argmax);
        else
            k_maxpool_fwd<T, 0, 0><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(x, c, h, w, k, stride, pad, oh, ow,
                                                                            nhwc, total, y, argmax);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int maxpool_bwd_t(const char *fn, const T *dy, const int32_t *argmax, int n, int c, int h, int w, int k,
                         int stride, int pad, int ceil_mode, sf_layout lay, T *dx, cudaStream_t s)
{
    constexpr int VEC = 16 / sizeof(T);
    int oh, ow;
    if (pool_check(fn, n, c, h, w, k, stride, pad, ceil_mode, &oh, &ow))
        return -1;
    const int floor_size = oh == sf_pool_out_size(h, k, stride, pad, 0) && ow == sf_pool_out_size(w, k, stride, pad, 0);
    const int nhwc = lay == SF_LAYOUT_NHWC;
    const int vec = nhwc && c % VEC == 0 && cu_al16(dy) && cu_al16(argmax) && cu_al16(dx);
    if (k == 3 && stride == 2 && pad == 1 && floor_size) {
        if (vec) {
            const unsigned total = (unsigned)((size_t)n * oh * ow * (c / VEC));
            k_mp3_bwd_nhwc<T, VEC><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(dy, argmax, c, h, w, oh, ow, total, dx);
        } else if (nhwc) {
            const unsigned total = (unsigned)((size_t)n * oh * ow * c);
            k_mp3_bwd_nhwc<T, 1><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(dy, argmax, c, h, w, oh, ow, total, dx);
        } else {
            const unsigned total = (unsigned)((size_t)n * c * oh * ow);
            if (w % 2 == 0 && ((uintptr_t)dx % (2 * sizeof(T))) == 0)
                k_mp3_bwd_nchw<T, 1><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(dy, argmax, h, w, oh, ow, total, dx);
            else
                k_mp3_bwd_nchw<T, 0><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(dy, argmax, h, w, oh, ow, total, dx);
        }
    } else if (vec) {
        const unsigned total = (unsigned)((size_t)n * h * w * (c / VEC));
        if (k == 3 && stride == 2)
            k_maxpool_bwd_vec<T, VEC, 3, 2><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(dy, argmax, c, h, w, k, stride,
                                                                                     pad, oh, ow, total, dx);
        else if (k == 2 && stride == 2)
            k_maxpool_bwd_vec<T, VEC, 2, 2><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(dy, argmax, c, h, w, k, stride,
                                                                                     pad, oh, ow, total, dx);
        else
            k_maxpool_bwd_vec<T, VEC, 0, 0><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(dy, argmax, c, h, w, k, stride,
                                                                                     pad, oh, ow, total, dx);
    } else {
        const size_t total = (size_t)n * c * h * w;
        if (k == 3 && stride == 2)
            k_maxpool_bwd<T, 3, 2><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(dy, argmax, c, h, w, k, stride, pad, oh,
                                                                            ow, nhwc, total, dx);
        else
            k_maxpool_bwd<T, 0, 0><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(dy, argmax, c, h, w, k, stride, pad, oh,
                                                                            ow, nhwc, total, dx);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_maxpool_fwd(const float *x, int n, int c, int h, int w, int k, int stride, int pad,
                                   sf_layout lay, float *y, int32_t *argmax, cudaStream_t s)
{
    return maxpool_fwd_t<float>("sf_cuda_maxpool_fwd", x, n, c, h, w, k, stride, pad, 0, lay, y, argmax, NULL, s);
}

extern "C" int sf_cuda_maxpool_bwd(const float *dy, const int32_t *argmax, int n, int c, int h, int w, int k,
                                   int stride, int pad, sf_layout lay, float *dx, cudaStream_t s)
{
    return maxpool_bwd_t<float>("sf_cuda_maxpool_bwd", dy, argmax, n, c, h, w, k, stride, pad, 0, lay, dx, s);
}

extern "C" int sf_cuda_maxpool_pre_bn_ok(sf_dtype dt, sf_layout lay, int c, int k, int stride, int pad)
{
    return dt == SF_DT_BF16 && lay == SF_LAYOUT_NHWC && c % 8 == 0 && k == 3 && stride == 2 && pad == 1;
}

extern "C" int sf_cuda_maxpool_fwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, int k, int stride,
                                      int pad, int ceil_mode, sf_layout lay, void *y, int32_t *argmax,
                                      const sf_pool_pre_bn *pre, cudaStream_t s)
{
    const char *fn = "sf_cuda_maxpool_fwd_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return maxpool_fwd_t<cu_bf16>(fn, (const cu_bf16 *)x, n, c, h, w, k, stride, pad, ceil_mode, lay, (cu_bf16 *)y,
                                     argmax, pre, s);
    return maxpool_fwd_t<float>(fn, (const float *)x, n, c, h, w, k, stride, pad, ceil_mode, lay, (float *)y, argmax,
                                pre, s);
}

extern "C" int sf_cuda_maxpool_bwd_dt(sf_dtype dt, const void *dy, const int32_t *argmax, int n, int c, int h, int w,
                                      int k, int stride, int pad, int ceil_mode, sf_layout lay, void *dx,
                                      cudaStream_t s)
{
    const char *fn = "sf_cuda_maxpool_bwd_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return maxpool_bwd_t<cu_bf16>(fn, (const cu_bf16 *)dy, argmax, n, c, h, w, k, stride, pad, ceil_mode, lay,
                                     (cu_bf16 *)dx, s);
    return maxpool_bwd_t<float>(fn, (const float *)dy, argmax, n, c, h, w, k, stride, pad, ceil_mode, lay, (float *)dx,
                                s);
}

template <typename T>
static int avgpool_fwd_t(const char *fn, const T *x, int n, int c, int h, int w, sf_layout lay, T *y,
                         cudaStream_t s)
{
    if (n < 1 || c < 1 || h < 1 || w < 1) {
        sf_cuda_set_error("%s:%d: %s: n=%d c=%d h=%d w=%d", __FILE__, __LINE__, fn, n, c, h, w);
        return -1;
    }
    const size_t planes = (size_t)n * c;
    if (lay == SF_LAYOUT_NHWC)
        cu_nhwc_rows_sum<T, false>(x, (const T *)NULL, y, n, c, (size_t)h * w, 1.f / (float)(h * w), s);
    else
        k_avgpool_fwd_nchw<T><<<cu_blocks(planes * 32, CU_TPB), CU_TPB, 0, s>>>(x, planes, h * w, y);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* add: dx += the gradient (a tensor another reader's backward wrote), one pass
 * where writing it apart and adding took three. */
template <typename T>
static int avgpool_bwd_t(const char *fn, const T *dy, int n, int c, int h, int w, sf_layout lay, int add, T *dx,
                         cudaStream_t s)
{
    if (n < 1 || c < 1 || h < 1 || w < 1) {
        sf_cuda_set_error("%s:%d: %s: n=%d c=%d h=%d w=%d", __FILE__, __LINE__, fn, n, c, h, w);
        return -1;
    }
    const size_t total = (size_t)n * c * h * w, hw = (size_t)h * w;
    constexpr int V = 16 / sizeof(T);
    const int nhwc = lay == SF_LAYOUT_NHWC;
    const bool vec = cu_chan_vec_ok(nhwc, c, hw, V) && cu_al16(dy) && cu_al16(dx);
    if (vec && add)
        k_avgpool_bwd_vec<T, V, true><<<cu_ew_blocks(total / V), CU_TPB, 0, s>>>(dy, total / V, c, hw, nhwc, dx);
    else if (vec)
        k_avgpool_bwd_vec<T, V, false><<<cu_ew_blocks(total / V), CU_TPB, 0, s>>>(dy, total / V, c, hw, nhwc, dx);
    else if (add)
        k_avgpool_bwd<T, true><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(dy, total, c, h * w, nhwc, dx);
    else
        k_avgpool_bwd<T, false><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(dy, total, c, h * w, nhwc, dx);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_avgpool_fwd(const float *x, int n, int c, int h, int w, sf_layout lay, float *y,
                                   cudaStream_t s)
{
    return avgpool_fwd_t<float>("sf_cuda_avgpool_fwd", x, n, c, h, w, lay, y, s);
}

extern "C" int sf_cuda_avgpool_bwd(const float *dy, int n, int c, int h, int w, sf_layout lay, float *dx,
                                   cudaStream_t s)
{
    return avgpool_bwd_t<float>("sf_cuda_avgpool_bwd", dy, n, c, h, w, lay, 0, dx, s);
}

extern "C" int sf_cuda_avgpool_fwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, sf_layout lay,
                                      void *y, cudaStream_t s)
{
    const char *fn = "sf_cuda_avgpool_fwd_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return avgpool_fwd_t<cu_bf16>(fn, (const cu_bf16 *)x, n, c, h, w, lay, (cu_bf16 *)y, s);
    return avgpool_fwd_t<float>(fn, (const float *)x, n, c, h, w, lay, (float *)y, s);
}

static int avgpool_bwd_dt(const char *fn, sf_dtype dt, const void *dy, int n, int c, int h, int w, sf_layout lay,
                          int add, void *dx, cudaStream_t s)
{
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return avgpool_bwd_t<cu_bf16>(fn, (const cu_bf16 *)dy, n, c, h, w, lay, add, (cu_bf16 *)dx, s);
    return avgpool_bwd_t<float>(fn, (const float *)dy, n, c, h, w, lay, add, (float *)dx, s);
}

extern "C" int sf_cuda_avgpool_bwd_dt(sf_dtype dt, const void *dy, int n, int c, int h, int w, sf_layout lay,
                                      void *dx, cudaStream_t s)
{
    return avgpool_bwd_dt("sf_cuda_avgpool_bwd_dt", dt, dy, n, c, h, w, lay, 0, dx, s);
}

extern "C" int sf_cuda_avgpool_bwd_add_dt(sf_dtype dt, const void *dy, int n, int c, int h, int w, sf_layout lay,
                                          void *dx, cudaStream_t s)
{
    return avgpool_bwd_dt("sf_cuda_avgpool_bwd_add_dt", dt, dy, n, c, h, w, lay, 1, dx, s);
}

/* ---- AvgPool2d and AdaptiveAvgPool2d ---------------------------------------------- */

/* The sizes the avg_pool2d launchers accept: the window rules of
 * gpu/layers.c (pad <= k/2, so every window holds an input) and 32-bit
 * element indices. */
template <typename T>
static int avgpool2d_t(const char *fn, int bwd, const T *in, int n, int c, int h, int w, int k, int stride, int pad,
                       int ceil_mode, int count_include_pad, sf_layout lay, T *out, cudaStream_t s)
{
    int oh, ow;
    if (pool_check(fn, n, c, h, w, k, stride, pad, ceil_mode, &oh, &ow))
        return -1;
    if ((double)n * c * oh * ow >= 4294967296.0) {
        sf_cuda_set_error("%s:%d: %s: output n=%d c=%d %dx%d too large", __FILE__, __LINE__, fn, n, c, oh, ow);
        return -1;
    }
    const int nhwc = lay == SF_LAYOUT_NHWC, cip = count_include_pad != 0;
    constexpr int V = 16 / sizeof(T);
    if (nhwc && c % V == 0 && cu_al16(in) && cu_al16(out)) {
        const size_t total = (size_t)n * (c / V) * (bwd ? (size_t)h * w : (size_t)oh * ow);
        if (bwd)
            k_avgpool2d_bwd_nhwc<T, V><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(in, c, h, w, k, stride, pad, cip,
                                                                                  oh, ow, (unsigned)total, out);
        else
            k_avgpool2d_fwd_nhwc<T, V><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(in, c, h, w, k, stride, pad, cip,
                                                                                  oh, ow, (unsigned)total, out);
    } else if (bwd) {
        const size_t total = (size_t)n * c * h * w;
        k_avgpool2d_bwd<T><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(in, c, h, w, k, stride, pad, cip, oh, ow, nhwc,
                                                                      total, out);
    } else {
        const size_t total = (size_t)n * c * oh * ow;
        k_avgpool2d_fwd<T><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(in, c, h, w, k, stride, pad, cip, oh, ow, nhwc,
                                                                      total, out);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_avgpool2d_fwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, int k, int stride,
                                        int pad, int ceil_mode, int count_include_pad, sf_layout lay, void *y,
                                        cudaStream_t s)
{
    const char *fn = "sf_cuda_avgpool2d_fwd_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return avgpool2d_t<cu_bf16>(fn, 0, (const cu_bf16 *)x, n, c, h, w, k, stride, pad, ceil_mode,
                                    count_include_pad, lay, (cu_bf16 *)y, s);
    return avgpool2d_t<float>(fn, 0, (const float *)x, n, c, h, w, k, stride, pad, ceil_mode, count_include_pad, lay,
                              (float *)y, s);
}

extern "C" int sf_cuda_avgpool2d_bwd_dt(sf_dtype dt, const void *dy, int n, int c, int h, int w, int k, int stride,
                                        int pad, int ceil_mode, int count_include_pad, sf_layout lay, void *dx,
                                        cudaStream_t s)
{
    const char *fn = "sf_cuda_avgpool2d_bwd_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return avgpool2d_t<cu_bf16>(fn, 1, (const cu_bf16 *)dy, n, c, h, w, k, stride, pad, ceil_mode,
                                    count_include_pad, lay, (cu_bf16 *)dx, s);
    return avgpool2d_t<float>(fn, 1, (const float *)dy, n, c, h, w, k, stride, pad, ceil_mode, count_include_pad, lay,
                              (float *)dx, s);
}

template <typename T>
static int adaptive_t(const char *fn, int bwd, const T *in, int n, int c, int h, int w, int oh, int ow, sf_layout lay,
                      T *out, cudaStream_t s)
{
    if (n < 1 || c < 1 || h < 1 || w < 1 || oh < 1 || ow < 1 || (double)n * c * h * w >= 4294967296.0 ||
        (double)n * c * oh * ow >= 4294967296.0) {
        sf_cuda_set_error("%s:%d: %s: n=%d c=%d %dx%d -> %dx%d", __FILE__, __LINE__, fn, n, c, h, w, oh, ow);
        return -1;
    }
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (bwd) {
        const size_t total = (size_t)n * c * h * w;
        k_adaptive_avgpool_bwd<T><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(in, c, h, w, oh, ow, nhwc, total, out);
    } else {
        const size_t total = (size_t)n * c * oh * ow;
        k_adaptive_avgpool_fwd<T><<<cu_blocks(total, CU_TPB), CU_TPB, 0, s>>>(in, c, h, w, oh, ow, nhwc, total, out);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_adaptive_avgpool_fwd_dt(sf_dtype dt, const void *x, int n, int c, int h, int w, int oh, int ow,
                                               sf_layout lay, void *y, cudaStream_t s)
{
    const char *fn = "sf_cuda_adaptive_avgpool_fwd_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return adaptive_t<cu_bf16>(fn, 0, (const cu_bf16 *)x, n, c, h, w, oh, ow, lay, (cu_bf16 *)y, s);
    return adaptive_t<float>(fn, 0, (const float *)x, n, c, h, w, oh, ow, lay, (float *)y, s);
}

extern "C" int sf_cuda_adaptive_avgpool_bwd_dt(sf_dtype dt, const void *dy, int n, int c, int h, int w, int oh,
                                               int ow, sf_layout lay, void *dx, cudaStream_t s)
{
    const char *fn = "sf_cuda_adaptive_avgpool_bwd_dt";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (dt == SF_DT_BF16)
        return adaptive_t<cu_bf16>(fn, 1, (const cu_bf16 *)dy, n, c, h, w, oh, ow, lay, (cu_bf16 *)dx, s);
    return adaptive_t<float>(fn, 1, (const float *)dy, n, c, h, w, oh, ow, lay, (float *)dx, s);
}
