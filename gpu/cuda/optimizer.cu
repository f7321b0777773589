/* gpu/cuda/optimizer.cu — kernels first, then launchers: SGD and AdamW over one
 * flat buffer (reading gradients and writing the device weight copy through
 * the KCRS -> KRSC segments), and the weight/gradient copies between model and
 * device layout. Contracts in optimizer.h. */
#include "gpu/cuda/optimizer.h"

#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* One SGD element, rounding as the reference (no contraction into FMA). */
__device__ __forceinline__ void sgd_one(float &p, float &m, float g, float lr, float mom, float wd)
{
    const float gg = __fadd_rn(g, __fmul_rn(wd, p));
    if (mom != 0.f) {
        m = __fadd_rn(__fmul_rn(mom, m), gg);
        p = __fsub_rn(p, __fmul_rn(lr, m));
    } else {
        p = __fsub_rn(p, __fmul_rn(lr, gg));
    }
}

/* The gradient check of this step (sf_cuda_grad_state): 1 when the step is
 * skipped, else the clipping coefficient in *coef (1 without a check). */
__device__ __forceinline__ int grad_skip(const sf_grad_state *gs, float *coef)
{
    *coef = 1.f;
    if (!gs)
        return 0;
    if (gs->skip)
        return 1;
    *coef = gs->scale;
    return 0;
}

/* clip_grad_norm_ multiplies every gradient by its coefficient in place (one
 * rounding); a coefficient of 1 leaves the gradient as it is. */
__device__ __forceinline__ float scale1(float g, float c) { return c == 1.f ? g : __fmul_rn(g, c); }
__device__ __forceinline__ void scale4(float4 &g, float c)
{
    g.x = scale1(g.x, c);
    g.y = scale1(g.y, c);
    g.z = scale1(g.z, c);
    g.w = scale1(g.w, c);
}

/* Device index of model index i inside segment sg (KCRS -> KRSC). */
__device__ __forceinline__ size_t perm_index(const sf_perm_seg &sg, size_t i)
{
    const unsigned r = (unsigned)(i - sg.off);
    const unsigned crs = (unsigned)sg.c * (unsigned)sg.rs;
    const unsigned o = r / crs, rem = r - o * crs;
    const unsigned ci = rem / (unsigned)sg.rs, t = rem - ci * (unsigned)sg.rs;
    return sg.off + (size_t)o * crs + (size_t)t * sg.c + ci;
}

/* The kernels get their segments sorted by offset and disjoint (segs_sorted
 * on the host), so a lookup is a binary search: a net has a segment per
 * convolution, and DenseNet-121's 120 would cost every thread 120 compares
 * in a linear scan. */
__device__ __forceinline__ int seg_of(const sf_sgd_segs &segs, size_t i)
{
    int lo = 0, hi = segs.n - 1;
    while (lo <= hi) {
        const int mid = (lo + hi) >> 1;
        if (i < segs.s[mid].off)
            hi = mid - 1;
        else if (i >= segs.s[mid].off + segs.s[mid].len)
            lo = mid + 1;
        else
            return mid;
    }
    return -1;
}

/* The segment the four elements from i0 fall in (-1: none), and whether they
 * straddle its edge (then each element is looked up on its own). */
__device__ __forceinline__ int seg_of4(const sf_sgd_segs &segs, size_t i0, int *straddle)
{
    *straddle = 0;
    int lo = 0, hi = segs.n; /* the first segment that ends after i0 */
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (segs.s[mid].off + segs.s[mid].len > i0)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo == segs.n)
        return -1;
    const size_t a = segs.s[lo].off, b = a + segs.s[lo].len;
    if (a >= i0 + 4)
        return -1;
    *straddle = !(i0 >= a && i0 + 4 <= b);
    return lo;
}

/* Four consecutive elements per thread. p and m are read and written as
 * float4 (the buffers are 256-byte aligned and i0 is a multiple of 4). */
__global__ void k_sgd(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ m,
                      float *__restrict__ wdev, size_t len, const sf_sgd_hyper *__restrict__ hp,
                      const __grid_constant__ sf_sgd_segs segs, const sf_grad_state *__restrict__ gs)
{
    const size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i0 >= len)
        return;
    float coef;
    if (grad_skip(gs, &coef))
        return;
    const float lr = hp->lr, mom = hp->momentum, wd = hp->weight_decay;
    int straddle;
    const int si = seg_of4(segs, i0, &straddle);
    if (i0 + 4 <= len && !straddle) {
        float4 pv = *reinterpret_cast<const float4 *>(p + i0);
        /* Without momentum the buffer is neither read nor written (plain SGD
         * moves a third less memory). */
        float4 mv = mom != 0.f ? *reinterpret_cast<const float4 *>(m + i0) : make_float4(0.f, 0.f, 0.f, 0.f);
        float4 gv;
        size_t j0 = 0, j1 = 0, j2 = 0, j3 = 0;
        if (si < 0) {
            gv = *reinterpret_cast<const float4 *>(g + i0);
        } else {
            const sf_perm_seg &sg = segs.s[si];
            j0 = perm_index(sg, i0);
            j1 = perm_index(sg, i0 + 1);
            j2 = perm_index(sg, i0 + 2);
            j3 = perm_index(sg, i0 + 3);
            gv = make_float4(g[j0], g[j1], g[j2], g[j3]);
        }
        scale4(gv, coef);
        sgd_one(pv.x, mv.x, gv.x, lr, mom, wd);
        sgd_one(pv.y, mv.y, gv.y, lr, mom, wd);
        sgd_one(pv.z, mv.z, gv.z, lr, mom, wd);
        sgd_one(pv.w, mv.w, gv.w, lr, mom, wd);
        *reinterpret_cast<float4 *>(p + i0) = pv;
        if (mom != 0.f)
            *reinterpret_cast<float4 *>(m + i0) = mv;
        if (si >= 0) {
            wdev[j0] = pv.x;
            wdev[j1] = pv.y;
            wdev[j2] = pv.z;
            wdev[j3] = pv.w;
        }
        return;
    }
    /* Tail or segment boundary: one element at a time. */
    for (size_t i = i0; i < i0 + 4 && i < len; i++) {
        const int k = seg_of(segs, i);
        const size_t j = k < 0 ? i : perm_index(segs.s[k], i);
        float pv = p[i], mv = mom != 0.f ? m[i] : 0.f;
        sgd_one(pv, mv, scale1(g[j], coef), lr, mom, wd);
        p[i] = pv;
        if (mom != 0.f)
            m[i] = mv;
        if (k >= 0)
            wdev[j] = pv;
    }
}

/* SGD of a bf16 net in one pass (sf_cuda_sgd_mixed): the gradient of an
 * element inside segs is read from gd (the convolutions' weight gradients, in
 * the net's element type), elsewhere from g; the updated weight is also
 * written to wd in the net's element type. Four elements per thread as k_sgd. */
template <typename T>
__global__ void k_sgd_mixed(float *__restrict__ p, const float *__restrict__ g, const T *__restrict__ gd,
                            float *__restrict__ m, T *__restrict__ wd, size_t len, const sf_sgd_hyper *__restrict__ hp,
                            const __grid_constant__ sf_sgd_segs segs, const sf_grad_state *__restrict__ gs)
{
    const size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i0 >= len)
        return;
    float coef;
    if (grad_skip(gs, &coef))
        return;
    const float lr = hp->lr, mom = hp->momentum, wdk = hp->weight_decay;
    int straddle;
    const int si = seg_of4(segs, i0, &straddle);
    if (i0 + 4 <= len && !straddle) {
        float4 pv = *reinterpret_cast<const float4 *>(p + i0);
        float4 mv = mom != 0.f ? *reinterpret_cast<const float4 *>(m + i0) : make_float4(0.f, 0.f, 0.f, 0.f);
        float4 gv;
        if (si < 0)
            gv = *reinterpret_cast<const float4 *>(g + i0);
        else
            gv = make_float4(cu_f(gd[i0]), cu_f(gd[i0 + 1]), cu_f(gd[i0 + 2]), cu_f(gd[i0 + 3]));
        scale4(gv, coef);
        sgd_one(pv.x, mv.x, gv.x, lr, mom, wdk);
        sgd_one(pv.y, mv.y, gv.y, lr, mom, wdk);
        sgd_one(pv.z, mv.z, gv.z, lr, mom, wdk);
        sgd_one(pv.w, mv.w, gv.w, lr, mom, wdk);
        *reinterpret_cast<float4 *>(p + i0) = pv;
        if (mom != 0.f)
            *reinterpret_cast<float4 *>(m + i0) = mv;
        wd[i0] = cu_to<T>(pv.x);
        wd[i0 + 1] = cu_to<T>(pv.y);
        wd[i0 + 2] = cu_to<T>(pv.z);
        wd[i0 + 3] = cu_to<T>(pv.w);
        return;
    }
    for (size_t i = i0; i < i0 + 4 && i < len; i++) {
        const int k = seg_of(segs, i);
        float pv = p[i], mv = mom != 0.f ? m[i] : 0.f;
        sgd_one(pv, mv, scale1(k < 0 ? g[i] : cu_f(gd[i]), coef), lr, mom, wdk);
        p[i] = pv;
        if (mom != 0.f)
            m[i] = mv;
        wd[i] = cu_to<T>(pv);
    }
}

/* The factors of one step (sf_adamw_hyper, its step number chosen). */
struct adamw_step {
    float beta1, beta2, eps, decay, one_minus_beta1, one_minus_beta2, step_size, bc2_sqrt;
};

__device__ __forceinline__ adamw_step adamw_at(const sf_adamw_hyper *hp, const unsigned *skips)
{
    const sf_adamw_hyper &h = *hp;
    unsigned k = skips ? *skips - h.skips_counted : 0u;
    k = k < SF_ADAMW_BEHIND ? k : SF_ADAMW_BEHIND - 1;
    return {h.beta1, h.beta2, h.eps, h.decay, h.one_minus_beta1, h.one_minus_beta2, h.step_size[k], h.bc2_sqrt[k]};
}

/* One element in the order of PyTorch's single-tensor AdamW, rounding as the
 * reference (no contraction into FMA), so equal inputs give bit-equal results. */
__device__ __forceinline__ void adamw_one(float &p, float &m, float &v, float g, const adamw_step &h)
{
    p = __fmul_rn(p, h.decay);
    m = __fadd_rn(__fmul_rn(h.beta1, m), __fmul_rn(h.one_minus_beta1, g));
    v = __fadd_rn(__fmul_rn(h.beta2, v), __fmul_rn(__fmul_rn(h.one_minus_beta2, g), g));
    const float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), h.bc2_sqrt), h.eps);
    p = __fsub_rn(p, __fmul_rn(h.step_size, __fdiv_rn(m, den)));
}

/* Four consecutive elements per thread; a segment boundary or the tail goes
 * one element at a time. */
__global__ void k_adamw(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ m,
                        float *__restrict__ v, float *__restrict__ wdev, size_t len,
                        const sf_adamw_hyper *__restrict__ hp, const __grid_constant__ sf_sgd_segs segs,
                        const sf_grad_state *__restrict__ gs, const unsigned *__restrict__ skips)
{
    const size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i0 >= len)
        return;
    float coef;
    if (grad_skip(gs, &coef))
        return;
    const adamw_step h = adamw_at(hp, skips);
    int straddle;
    const int si = seg_of4(segs, i0, &straddle);
    if (i0 + 4 <= len && !straddle) {
        float4 pv = *reinterpret_cast<const float4 *>(p + i0);
        float4 mv = *reinterpret_cast<const float4 *>(m + i0);
        float4 vv = *reinterpret_cast<const float4 *>(v + i0);
        float4 gv;
        size_t j[4] = {0, 0, 0, 0};
        if (si < 0) {
            gv = *reinterpret_cast<const float4 *>(g + i0);
        } else {
#pragma unroll
            for (int q = 0; q < 4; q++)
                j[q] = perm_index(segs.s[si], i0 + q);
            gv = make_float4(g[j[0]], g[j[1]], g[j[2]], g[j[3]]);
        }
        scale4(gv, coef);
        adamw_one(pv.x, mv.x, vv.x, gv.x, h);
        adamw_one(pv.y, mv.y, vv.y, gv.y, h);
        adamw_one(pv.z, mv.z, vv.z, gv.z, h);
        adamw_one(pv.w, mv.w, vv.w, gv.w, h);
        *reinterpret_cast<float4 *>(p + i0) = pv;
        *reinterpret_cast<float4 *>(m + i0) = mv;
        *reinterpret_cast<float4 *>(v + i0) = vv;
        if (si >= 0) {
            wdev[j[0]] = pv.x;
            wdev[j[1]] = pv.y;
            wdev[j[2]] = pv.z;
            wdev[j[3]] = pv.w;
        }
        return;
    }
    for (size_t i = i0; i < i0 + 4 && i < len; i++) {
        const int k = seg_of(segs, i);
        const size_t jj = k < 0 ? i : perm_index(segs.s[k], i);
        float pv = p[i], mv = m[i], vv = v[i];
        adamw_one(pv, mv, vv, scale1(g[jj], coef), h);
        p[i] = pv;
        m[i] = mv;
        v[i] = vv;
        if (k >= 0)
            wdev[jj] = pv;
    }
}

/* The segments of an sf_sgd_segs, checked and sorted by offset on the host
 * (perm_prep): [off, end) with c*rs dividing end - off, no overlaps. grp:
 * for sf_cuda_grads_model, the prefix count of the 8-element groups (aligned
 * to 8 in model space) each segment touches. */
struct perm_tab {
    int n, pad_;
    unsigned long long off[SF_SGD_MAX_SEGS], end[SF_SGD_MAX_SEGS];
    unsigned c[SF_SGD_MAX_SEGS], rs[SF_SGD_MAX_SEGS];
    unsigned long long grp[SF_SGD_MAX_SEGS + 1];
};

struct perm_smem {
    unsigned long long off[SF_SGD_MAX_SEGS], end[SF_SGD_MAX_SEGS], grp[SF_SGD_MAX_SEGS + 1];
    unsigned c[SF_SGD_MAX_SEGS], rs[SF_SGD_MAX_SEGS];
};

/* Copies the table to shared memory (segment lookups by data-dependent index
 * would serialise on the constant bank); call from every thread. */
__device__ __forceinline__ void perm_load(const perm_tab &tab, perm_smem &sm)
{
    for (int k = threadIdx.x; k < tab.n; k += blockDim.x) {
        sm.off[k] = tab.off[k];
        sm.end[k] = tab.end[k];
        sm.c[k] = tab.c[k];
        sm.rs[k] = tab.rs[k];
    }
    for (int k = threadIdx.x; k <= tab.n; k += blockDim.x)
        sm.grp[k] = tab.grp[k];
    __syncthreads();
}

/* wd[j] for the 8 device indices j0 .. j0+7 (< len): p at the model index of j
 * inside a segment (j = off + (o*rs + t)*c + ci <- off + (o*c + ci)*rs + t),
 * p[j] outside, rounded to T. VST: wd 16-byte aligned (8-element stores). */
template <typename T, int VST>
__global__ void __launch_bounds__(CU_TPB)
    k_weights_dev(const float *__restrict__ p, T *__restrict__ wd, size_t len, const __grid_constant__ perm_tab tab)
{
    __shared__ perm_smem sm;
    perm_load(tab, sm);
    const size_t j0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (j0 >= len)
        return;
    const int n = tab.n;
    /* the last segment starting at or before j0, or -1 */
    int s = -1;
    {
        int lo = 0, hi = n - 1;
        while (lo <= hi) {
            const int mid = (lo + hi) >> 1;
            if (sm.off[mid] <= j0) {
                s = mid;
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
    }
    float v[8];
    int cur = -1;                 /* the segment the counters below belong to */
    unsigned o = 0, t = 0, ci = 0; /* device order: ci fastest, then t, then o */
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const size_t j = j0 + q;
        v[q] = 0.f;
        if (j >= len)
            continue;
        while (s + 1 < n && sm.off[s + 1] <= j)
            s++;
        size_t src = j;
        if (s >= 0 && j < sm.end[s]) {
            const unsigned c = sm.c[s], rs = sm.rs[s];
            if (cur != s) {
                const unsigned rel = (unsigned)(j - sm.off[s]), crs = c * rs;
                o = rel / crs;
                const unsigned rem = rel - o * crs;
                t = rem / c;
                ci = rem - t * c;
                cur = s;
            }
            src = sm.off[s] + ((size_t)o * c + ci) * rs + t;
            if (++ci == c) {
                ci = 0;
                if (++t == rs) {
                    t = 0;
                    o++;
                }
            }
        }
        v[q] = p[src];
    }
    if (VST && j0 + 8 <= len) {
        cu_st8<T>(wd + j0, v);
    } else {
        for (int q = 0; q < 8 && j0 + q < len; q++)
            wd[j0 + q] = cu_to<T>(v[q]);
    }
}

/* g[i] = (float)gd[device index of i] for the model indices i of group q (8
 * elements aligned to 8 in model space) that lie inside its segment; nothing
 * else is written. VST: g 16-byte aligned (a group fully inside a segment is
 * two float4 stores). */
template <typename T, int VST>
__global__ void __launch_bounds__(CU_TPB)
    k_grads_model(const T *__restrict__ gd, float *__restrict__ g, const __grid_constant__ perm_tab tab)
{
    __shared__ perm_smem sm;
    perm_load(tab, sm);
    const unsigned long long q = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int n = tab.n;
    if (q >= sm.grp[n])
        return;
    /* the segment whose groups hold q: grp[s] <= q < grp[s+1] */
    int s = 0;
    {
        int lo = 0, hi = n - 1;
        while (lo <= hi) {
            const int mid = (lo + hi) >> 1;
            if (sm.grp[mid] <= q) {
                s = mid;
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
    }
    const size_t off = sm.off[s], end = sm.end[s];
    const unsigned c = sm.c[s], rs = sm.rs[s];
    const size_t i0 = (off & ~(size_t)7) + (size_t)(q - sm.grp[s]) * 8;
    const size_t first = i0 > off ? i0 : off;
    /* model order: t fastest, then ci, then o */
    const unsigned rel = (unsigned)(first - off), crs = c * rs;
    unsigned o = rel / crs;
    const unsigned rem = rel - o * crs;
    unsigned ci = rem / rs, t = rem - ci * rs;
    float v[8];
    bool in[8];
    bool all = true;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const size_t i = i0 + k;
        in[k] = i >= off && i < end;
        all = all && in[k];
        v[k] = 0.f;
        if (!in[k])
            continue;
        v[k] = cu_f(gd[off + ((size_t)o * rs + t) * c + ci]);
        if (++t == rs) {
            t = 0;
            if (++ci == c) {
                ci = 0;
                o++;
            }
        }
    }
    if (VST && all) {
        cu_st8<float>(g + i0, v);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (in[k])
                g[i0 + k] = v[k];
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

/* segs as the kernels' binary search needs them: sorted by offset and
 * disjoint. The executor builds them in offset order, so the usual answer is
 * segs itself after one pass; a list out of order is sorted into scratch.
 * NULL (the error set) when there are too many or two overlap. */
static const sf_sgd_segs *segs_sorted(const char *fn, const sf_sgd_segs *in, sf_sgd_segs *scratch)
{
    if (in->n < 0 || in->n > SF_SGD_MAX_SEGS) {
        sf_cuda_set_error("%s:%d: %s: %d segments (at most %d)", __FILE__, __LINE__, fn, in->n, SF_SGD_MAX_SEGS);
        return NULL;
    }
    const sf_sgd_segs *out = in;
    for (int k = 0; k + 1 < in->n && out == in; k++)
        if (in->s[k].off > in->s[k + 1].off)
            out = scratch;
    if (out == scratch) {
        scratch->n = in->n;
        for (int k = 0; k < in->n; k++) {
            int j = k;
            for (; j > 0 && scratch->s[j - 1].off > in->s[k].off; j--)
                scratch->s[j] = scratch->s[j - 1];
            scratch->s[j] = in->s[k];
        }
    }
    for (int k = 0; k + 1 < out->n; k++)
        if (out->s[k].off + out->s[k].len > out->s[k + 1].off) {
            sf_cuda_set_error("%s:%d: %s: segments at %zu and %zu overlap", __FILE__, __LINE__, fn, out->s[k].off,
                              out->s[k + 1].off);
            return NULL;
        }
    return out;
}

extern "C" int sf_cuda_sgd(float *p, const float *g, float *m, float *wdev, size_t len,
                           const sf_sgd_hyper *d_hyper, const sf_sgd_segs *segs, const sf_grad_state *gs,
                           cudaStream_t s)
{
    if (len == 0)
        return 0;
    if (!cu_al16(p) || !cu_al16(m) || !cu_al16(g)) {
        sf_cuda_set_error("%s:%d: sf_cuda_sgd: buffers must be 16-byte aligned", __FILE__, __LINE__);
        return -1;
    }
    if (segs->n > 0 && !wdev) {
        sf_cuda_set_error("%s:%d: sf_cuda_sgd: permuted segments need wdev", __FILE__, __LINE__);
        return -1;
    }
    sf_sgd_segs sorted; /* 12 KB on the stack, used only for a list out of order */
    const sf_sgd_segs *ks = segs_sorted("sf_cuda_sgd", segs, &sorted);
    if (!ks)
        return -1;
    k_sgd<<<cu_blocks((len + 3) / 4, CU_TPB), CU_TPB, 0, s>>>(p, g, m, wdev, len, d_hyper, *ks, gs);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_sgd_mixed(float *p, const float *g, const void *gd, sf_dtype dt, const sf_sgd_segs *segs,
                                 float *m, void *wd, size_t len, const sf_sgd_hyper *d_hyper,
                                 const sf_grad_state *gs, cudaStream_t s)
{
    if (dt != SF_DT_BF16 || !segs || segs->n < 0 || segs->n > SF_SGD_MAX_SEGS || !cu_al16(p) ||
        (m && !cu_al16(m)) || !cu_al16(g)) {
        sf_cuda_set_error("%s:%d: sf_cuda_sgd_mixed: bf16 data, at most %d segments and 16-byte aligned p, g, m",
                          __FILE__, __LINE__, SF_SGD_MAX_SEGS);
        return -1;
    }
    for (int k = 0; k < segs->n; k++)
        if (segs->s[k].c != 1 || segs->s[k].off + segs->s[k].len > len) {
            sf_cuda_set_error("%s:%d: sf_cuda_sgd_mixed: segment %d is not an identity segment inside the buffer",
                              __FILE__, __LINE__, k);
            return -1;
        }
    if (len == 0)
        return 0;
    sf_sgd_segs sorted;
    const sf_sgd_segs *ks = segs_sorted("sf_cuda_sgd_mixed", segs, &sorted);
    if (!ks)
        return -1;
    k_sgd_mixed<cu_bf16><<<cu_blocks((len + 3) / 4, CU_TPB), CU_TPB, 0, s>>>(p, g, (const cu_bf16 *)gd, m,
                                                                           (cu_bf16 *)wd, len, d_hyper, *ks, gs);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* Checks segs and fills the sorted table: every non-empty segment has c, rs
 * >= 1, a length that is a multiple of c*rs and under 2^32, and no two
 * overlap; with total != 0 they also end within total. */
static int perm_prep(const char *fn, const sf_sgd_segs *segs, size_t total, perm_tab *t)
{
    memset(t, 0, sizeof *t);
    if (!segs)
        return 0;
    if (segs->n < 0 || segs->n > SF_SGD_MAX_SEGS) {
        sf_cuda_set_error("%s:%d: %s: %d segments (at most %d)", __FILE__, __LINE__, fn, segs->n, SF_SGD_MAX_SEGS);
        return -1;
    }
    int n = 0;
    for (int k = 0; k < segs->n; k++) {
        const sf_perm_seg *g = &segs->s[k];
        if (g->len == 0)
            continue;
        const unsigned long long crs = (unsigned long long)(g->c > 0 ? g->c : 0) * (unsigned long long)(g->rs > 0 ? g->rs : 0);
        if (g->c < 1 || g->rs < 1 || crs > UINT_MAX || g->len % crs != 0 || g->len > UINT_MAX ||
            g->off + g->len < g->off || (total && g->off + g->len > total)) {
            sf_cuda_set_error("%s:%d: %s: segment %d (off %zu len %zu c %d rs %d) is not a whole [o][c][rs] block%s",
                              __FILE__, __LINE__, fn, k, g->off, g->len, g->c, g->rs,
                              total ? " inside the buffer" : "");
            return -1;
        }
        /* insertion by offset */
        int j = n++;
        while (j > 0 && t->off[j - 1] > g->off) {
            t->off[j] = t->off[j - 1];
            t->end[j] = t->end[j - 1];
            t->c[j] = t->c[j - 1];
            t->rs[j] = t->rs[j - 1];
            j--;
        }
        t->off[j] = g->off;
        t->end[j] = g->off + g->len;
        t->c[j] = (unsigned)g->c;
        t->rs[j] = (unsigned)g->rs;
    }
    t->n = n;
    t->grp[0] = 0;
    for (int k = 0; k < n; k++) {
        if (k + 1 < n && t->end[k] > t->off[k + 1]) {
            sf_cuda_set_error("%s:%d: %s: segments at %llu and %llu overlap", __FILE__, __LINE__, fn, t->off[k],
                              t->off[k + 1]);
            return -1;
        }
        t->grp[k + 1] = t->grp[k] + (t->end[k] + 7) / 8 - t->off[k] / 8;
    }
    return 0;
}

extern "C" int sf_cuda_weights_dev(const float *p, void *wd, sf_dtype dt, size_t len, const sf_sgd_segs *segs,
                                   cudaStream_t s)
{
    const char *fn = "sf_cuda_weights_dev";
    if (cu_dt_bad(fn, dt))
        return -1;
    if (len == 0)
        return 0;
    perm_tab tab;
    if (perm_prep(fn, segs, len, &tab))
        return -1;
    const unsigned nb = cu_blocks(cu_cdiv(len, 8), CU_TPB);
    const int vst = cu_al16(wd);
    if (dt == SF_DT_BF16) {
        if (vst)
            k_weights_dev<cu_bf16, 1><<<nb, CU_TPB, 0, s>>>(p, (cu_bf16 *)wd, len, tab);
        else
            k_weights_dev<cu_bf16, 0><<<nb, CU_TPB, 0, s>>>(p, (cu_bf16 *)wd, len, tab);
    } else {
        if (vst)
            k_weights_dev<float, 1><<<nb, CU_TPB, 0, s>>>(p, (float *)wd, len, tab);
        else
            k_weights_dev<float, 0><<<nb, CU_TPB, 0, s>>>(p, (float *)wd, len, tab);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_grads_model(const void *gd, sf_dtype dt, float *g, const sf_sgd_segs *segs, cudaStream_t s)
{
    const char *fn = "sf_cuda_grads_model";
    if (cu_dt_bad(fn, dt))
        return -1;
    perm_tab tab;
    if (perm_prep(fn, segs, 0, &tab))
        return -1;
    const unsigned long long groups = tab.grp[tab.n];
    if (groups == 0)
        return 0;
    const unsigned nb = cu_blocks((size_t)groups, CU_TPB);
    const int vst = cu_al16(g);
    if (dt == SF_DT_BF16) {
        if (vst)
            k_grads_model<cu_bf16, 1><<<nb, CU_TPB, 0, s>>>((const cu_bf16 *)gd, g, tab);
        else
            k_grads_model<cu_bf16, 0><<<nb, CU_TPB, 0, s>>>((const cu_bf16 *)gd, g, tab);
    } else {
        if (vst)
            k_grads_model<float, 1><<<nb, CU_TPB, 0, s>>>((const float *)gd, g, tab);
        else
            k_grads_model<float, 0><<<nb, CU_TPB, 0, s>>>((const float *)gd, g, tab);
    }
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" void sf_adamw_hyper_at(sf_adamw_hyper *h, float lr, double beta1, double beta2, float eps,
                                  float weight_decay, int64_t t, unsigned skips_counted)
{
    /* in double, as PyTorch computes them in Python floats (sf_ref_adamw) */
    h->beta1 = (float)beta1;
    h->beta2 = (float)beta2;
    h->eps = eps;
    h->decay = (float)(1.0 - (double)lr * (double)weight_decay);
    h->one_minus_beta1 = (float)(1.0 - beta1);
    h->one_minus_beta2 = (float)(1.0 - beta2);
    for (int k = 0; k < SF_ADAMW_BEHIND; k++) {
        const double tk = (double)(t - k > 1 ? t - k : 1);
        h->step_size[k] = (float)((double)lr / (1.0 - pow(beta1, tk)));
        h->bc2_sqrt[k] = (float)sqrt(1.0 - pow(beta2, tk));
    }
    h->skips_counted = skips_counted;
}

extern "C" int sf_cuda_adamw(float *p, const float *g, float *m, float *v, float *wdev, size_t len,
                             const sf_adamw_hyper *d_hyper, const sf_sgd_segs *segs, const sf_grad_state *gs,
                             const unsigned *skips, cudaStream_t s)
{
    if (len == 0)
        return 0;
    if (!cu_al16(p) || !cu_al16(g) || !cu_al16(m) || !cu_al16(v)) {
        sf_cuda_set_error("%s:%d: sf_cuda_adamw: buffers must be 16-byte aligned", __FILE__, __LINE__);
        return -1;
    }
    sf_sgd_segs none;
    none.n = 0;
    const sf_sgd_segs *sg = segs ? segs : &none;
    if (sg->n > 0 && !wdev) {
        sf_cuda_set_error("%s:%d: sf_cuda_adamw: permuted segments need wdev", __FILE__, __LINE__);
        return -1;
    }
    sf_sgd_segs sorted;
    const sf_sgd_segs *ks = segs_sorted("sf_cuda_adamw", sg, &sorted);
    if (!ks)
        return -1;
    k_adamw<<<cu_blocks((len + 3) / 4, CU_TPB), CU_TPB, 0, s>>>(p, g, m, v, wdev, len, d_hyper, *ks, gs, skips);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ======================================================================== */
/* the gradient check: sum of squares, norm, clipping coefficient, skip      */
/* ======================================================================== */

/* Four independent loads in flight per thread over a fixed grid of 1024
 * blocks. Measured on W1 (H100): a single dependent chain per thread over 128
 * blocks read the 134 MB last-layer gradient at ~0.1 TB/s (0.5 ms a step);
 * 128 blocks with eight loads each finished later beside the backward and
 * slowed it more (507 vs 514 steps/s TF32, 837 vs 873 bf16) than 1024
 * blocks that finish fast. */
template <typename T>
__global__ void __launch_bounds__(CU_TPB) k_sumsq(const T *__restrict__ a, size_t na, const float *__restrict__ b,
                                                  size_t nb, float *__restrict__ part)
{
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const size_t S = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * S < na; i += 4 * S) {
        float v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            v[u] = cu_f(a[i + u * S]);
#pragma unroll
        for (int u = 0; u < 4; u++)
            acc[u] = fmaf(v[u], v[u], acc[u]);
    }
    for (; i < na; i += S) {
        const float v = cu_f(a[i]);
        acc[0] = fmaf(v, v, acc[0]);
    }
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < nb; j += S)
        acc[1] = fmaf(b[j], b[j], acc[1]);
    float t = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    __shared__ float red[CU_TPB / 32];
    const float u = cu_block_sum(t, red);
    if (threadIdx.x == 0)
        part[blockIdx.x] = u;
}

__global__ void k_grad_state(const float *__restrict__ part, int nparts, const float *__restrict__ max_norm,
                             const float *__restrict__ loss, const float *__restrict__ count,
                             sf_grad_state *__restrict__ out, unsigned *__restrict__ skips)
{
    double a = 0.0, z = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x)
        a += (double)part[i];
    block_sum2(a, z);
    if (threadIdx.x != 0)
        return;
    sf_grad_state st;
    st.pad_ = 0;
    /* 1 without a count, and with one whose samples all trained: the same bits */
    const float f = count ? sf_trained_factor(count) : 1.f;
    if (count && isnan(count[0])) {
        /* a rank's loss was not finite (the executor's k_poison_count): every rank skips */
        st.norm = __int_as_float(0x7fc00000);
        st.scale = 1.f;
        st.skip = SF_GRAD_SKIP_NONFINITE;
    } else if (f == 0.f) {
        st.norm = 0.f;
        st.scale = 1.f;
        st.skip = SF_GRAD_SKIP_EMPTY;
    } else {
        const float norm = (float)(sqrt(a) * (double)f);
        const float lv = loss ? *loss : 0.f;
        st.norm = norm;
        st.skip = !isfinite(norm) || !isfinite(lv) ? SF_GRAD_SKIP_NONFINITE : 0;
        st.scale = f;
        const float mx = max_norm ? *max_norm : 0.f;
        if (!st.skip && mx > 0.f) {
            /* torch.nn.utils.clip_grad_norm_: max_norm / (total_norm + 1e-6), clamped to 1 */
            const float c = __fdiv_rn(mx, __fadd_rn(norm, 1e-6f));
            st.scale = c < 1.f ? __fmul_rn(c, f) : f;
        }
    }
    *out = st;
    if (st.skip && skips)
        *skips += 1u;
}

extern "C" int sf_cuda_sumsq(const void *a, sf_dtype ta, size_t na, const float *b, size_t nb, float *part,
                             cudaStream_t s)
{
    if (cu_dt_bad("sf_cuda_sumsq", ta))
        return -1;
    if (ta == SF_DT_BF16)
        k_sumsq<cu_bf16><<<SF_SUMSQ_BLOCKS, CU_TPB, 0, s>>>((const cu_bf16 *)a, na, b, nb, part);
    else
        k_sumsq<float><<<SF_SUMSQ_BLOCKS, CU_TPB, 0, s>>>((const float *)a, na, b, nb, part);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_grad_state(const float *part, int nparts, const float *max_norm, const float *loss,
                                  const float *count, sf_grad_state *out, unsigned *skips, cudaStream_t s)
{
    if (nparts < 0) {
        sf_cuda_set_error("%s:%d: sf_cuda_grad_state: %d partial sums", __FILE__, __LINE__, nparts);
        return -1;
    }
    k_grad_state<<<1, CU_TPB, 0, s>>>(part, nparts, max_norm, loss, count, out, skips);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}
