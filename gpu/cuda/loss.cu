/* gpu/cuda/loss.cu — kernels first, then launchers: softmax cross-entropy (a
 * warp per sample), per-pixel cross-entropy (block partials combined in block
 * order) and the label conversion. Contracts in loss.h. */
#include "gpu/cuda/loss.h"

#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* Softmax cross-entropy; one block of CU_TPB threads, a warp per sample. */
__global__ void k_xent(const float *__restrict__ logits, const int32_t *__restrict__ labels, int n,
                       int k, float *__restrict__ dlog, sf_xent_out *__restrict__ out,
                       const sf_loss_ctl *__restrict__ ctl)
{
    __shared__ float s_loss[CU_TPB / 32];
    __shared__ int s_corr[CU_TPB / 32], s_corr5[CU_TPB / 32], s_bad[CU_TPB / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float sm = ctl ? ctl->label_smoothing : 0.f;
    float lam = ctl ? ctl->mix_lam : 1.f;
    if (!(lam > 0.f && lam <= 1.f))
        lam = 1.f; /* 0 reads as "no mixing" (gpu/backend.h) */
    const int plain = sm == 0.f && lam == 1.f;
    const float gsc = ctl && ctl->grad_scale != 0.f ? ctl->grad_scale : 1.f;
    float wloss = 0.f;
    int wcorr = 0, wcorr5 = 0, wbad = 0;
    for (int s = warp; s < n; s += nw) {
        const float *l = logits + (size_t)s * k;
        /* max and its first index */
        float m = -INFINITY;
        int arg = 0x7fffffff;
        for (int j = lane; j < k; j += 32) {
            float v = l[j];
            if (v > m || (v == m && j < arg)) {
                m = v;
                arg = j;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float om = __shfl_xor_sync(0xffffffffu, m, o);
            int oa = __shfl_xor_sync(0xffffffffu, arg, o);
            if (om > m || (om == m && oa < arg)) {
                m = om;
                arg = oa;
            }
        }
        if (arg == 0x7fffffff)
            arg = 0;
        float sum = 0.f, suml = 0.f;
        for (int j = lane; j < k; j += 32) {
            sum += expf(l[j] - m);
            suml += l[j];
        }
        for (int o = 16; o > 0; o >>= 1) {
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
            suml += __shfl_xor_sync(0xffffffffu, suml, o);
        }
        const float lse = m + logf(sum);
        const int lab = labels[s];
        /* mixing pairs sample s with s-1 (labels rolled by one, as torchvision v2) */
        const int lab2 = lam < 1.f ? labels[(s + n - 1) % n] : lab;
        const int valid = lab >= 0 && lab < k && lab2 >= 0 && lab2 < k;
        /* top 5 in torch.sort(descending, stable) order: ties go to the lower index */
        int ahead = 0;
        const float v = valid ? l[lab] : 0.f;
        if (valid && k > 5)
            for (int j = lane; j < k; j += 32)
                ahead += l[j] > v || (l[j] == v && j < lab);
        for (int o = 16; o > 0; o >>= 1)
            ahead += __shfl_xor_sync(0xffffffffu, ahead, o);
        const float one = 1.f - sm, sk = sm / (float)k;
        if (dlog) {
            float *d = dlog + (size_t)s * k;
            for (int j = lane; j < k; j += 32) {
                const float p = expf(l[j] - lse);
                const float t = plain ? (j == lab ? 1.f : 0.f)
                                      : one * ((j == lab ? lam : 0.f) + (j == lab2 ? 1.f - lam : 0.f)) + sk;
                d[j] = valid ? (p - t) / (float)n * gsc : NAN;
            }
        }
        if (lane == 0) {
            float dot = 0.f;
            if (valid)
                dot = plain ? l[lab] : one * (lam * l[lab] + (1.f - lam) * l[lab2]) + sm * suml / (float)k;
            wloss += valid ? lse - dot : NAN;
            wcorr += valid && arg == lab;
            wcorr5 += valid && (k <= 5 || (v == v && ahead < 5));
            wbad += !valid;
        }
    }
    if (lane == 0) {
        s_loss[warp] = wloss;
        s_corr[warp] = wcorr;
        s_corr5[warp] = wcorr5;
        s_bad[warp] = wbad;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        int c = 0, c5 = 0, b = 0;
        for (int w = 0; w < nw; w++) {
            t += s_loss[w];
            c += s_corr[w];
            c5 += s_corr5[w];
            b += s_bad[w];
        }
        out->loss = t / (float)n;
        out->correct = c;
        out->bad = b;
        out->correct5 = c5;
    }
}

__global__ void k_labels_i32(const void *__restrict__ src, int dtype, int n, int32_t *__restrict__ dst)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    int64_t v;
    if (dtype == 0)
        v = ((const uint8_t *)src)[i];
    else if (dtype == 1)
        v = ((const int32_t *)src)[i];
    else
        v = ((const int64_t *)src)[i];
    /* Out-of-range values stay out of range (the loss reports them). */
    dst[i] = (v < INT32_MIN || v > INT32_MAX) ? -1 : (int32_t)v;
}

struct xent2d_part {
    double loss;
    long long correct, correct5;
    int bad;
    int pad_;
};

/* Pass 1: a thread per pixel (grid-stride); pixel p = (ni, sp). NCHW: class j
 * of p at ni*k*hw + j*hw + sp; NHWC: p*k + j. Writes one partial per block. */
__global__ void k_xent2d(const float *__restrict__ logits, const int32_t *__restrict__ labels, int k,
                         long long hw, long long npix, int nhwc, float *__restrict__ dlog,
                         xent2d_part *__restrict__ part, const sf_loss_ctl *__restrict__ ctl)
{
    double lsum = 0.0, csum = 0.0, c5sum = 0.0;
    int bad = 0;
    const float sm = ctl ? ctl->label_smoothing : 0.f, one = 1.f - sm, sk = sm / (float)k;
    const float inv_den = (float)npix; /* divide as the reference does */
    const float gsc = ctl && ctl->grad_scale != 0.f ? ctl->grad_scale : 1.f;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < npix;
         p += (long long)gridDim.x * blockDim.x) {
        long long base, cs;
        if (nhwc) {
            base = p * k;
            cs = 1;
        } else {
            const long long ni = p / hw, sp = p - ni * hw;
            base = ni * k * hw + sp;
            cs = hw;
        }
        const float *l = logits + base;
        float m = l[0];
        int arg = 0;
        for (int j = 1; j < k; j++) {
            const float v = l[j * cs];
            if (v > m) {
                m = v;
                arg = j;
            }
        }
        float se = 0.f, suml = 0.f;
        for (int j = 0; j < k; j++) {
            se += expf(l[j * cs] - m);
            suml += l[j * cs];
        }
        const float lse = m + logf(se);
        const int lab = labels[p];
        const int valid = lab >= 0 && lab < k;
        if (dlog) {
            float *d = dlog + base;
            for (int j = 0; j < k; j++) {
                const float pr = expf(l[j * cs] - lse);
                const float t = sm == 0.f ? (j == lab ? 1.f : 0.f) : one * (j == lab ? 1.f : 0.f) + sk;
                d[j * cs] = valid ? (pr - t) / inv_den * gsc : NAN;
            }
        }
        float dot = 0.f;
        int hit5 = 0;
        if (valid) {
            const float v = l[(long long)lab * cs];
            dot = sm == 0.f ? v : one * v + sm * suml / (float)k;
            int ahead = 0;
            for (int j = 0; j < k && ahead < 5; j++)
                ahead += l[j * cs] > v || (l[j * cs] == v && j < lab);
            hit5 = k <= 5 || (v == v && ahead < 5);
        }
        lsum += valid ? (double)(lse - dot) : (double)NAN;
        csum += (valid && arg == lab) ? 1.0 : 0.0;
        c5sum += hit5 ? 1.0 : 0.0;
        bad += !valid;
    }
    double b2 = (double)bad;
    block_sum2(lsum, csum);
    __shared__ double sbad, sc5;
    {
        __syncthreads();
        block_sum2(b2, c5sum);
        if (threadIdx.x == 0) {
            sbad = b2;
            sc5 = c5sum;
        }
    }
    if (threadIdx.x == 0) {
        part[blockIdx.x].loss = lsum;
        part[blockIdx.x].correct = (long long)csum;
        part[blockIdx.x].correct5 = (long long)sc5;
        part[blockIdx.x].bad = (int)sbad;
        part[blockIdx.x].pad_ = 0;
    }
}

/* Pass 2: one block sums the partials in a fixed order. */
__global__ void k_xent2d_final(const xent2d_part *__restrict__ part, int nparts, long long npix,
                               sf_xent2d_out *__restrict__ out)
{
    double l = 0.0, c = 0.0, b = 0.0, c5 = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) {
        l += part[i].loss;
        c += (double)part[i].correct;
        c5 += (double)part[i].correct5;
        b += (double)part[i].bad;
    }
    block_sum2(l, c);
    __shared__ double sl, sc;
    if (threadIdx.x == 0) {
        sl = l;
        sc = c;
    }
    __syncthreads();
    block_sum2(b, c5);
    if (threadIdx.x == 0) {
        out->loss = (float)(sl / (double)npix);
        out->correct = (int64_t)sc;
        out->correct5 = (int64_t)c5;
        out->bad = (int32_t)b;
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

extern "C" int sf_cuda_xent(const float *logits, const int32_t *labels, int n, int k, float *dlogits,
                            sf_xent_out *out, const sf_loss_ctl *ctl, cudaStream_t s)
{
    if (n < 1 || k < 1) {
        sf_cuda_set_error("%s:%d: sf_cuda_xent: n=%d k=%d", __FILE__, __LINE__, n, k);
        return -1;
    }
    k_xent<<<1, CU_TPB, 0, s>>>(logits, labels, n, k, dlogits, out, ctl);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int sf_cuda_labels_i32(const void *src, int dtype, int n, int32_t *dst, cudaStream_t s)
{
    if (n <= 0)
        return 0;
    if (dtype < 0 || dtype > 2) {
        sf_cuda_set_error("%s:%d: sf_cuda_labels_i32: dtype %d", __FILE__, __LINE__, dtype);
        return -1;
    }
    k_labels_i32<<<cu_blocks((size_t)n, CU_TPB), CU_TPB, 0, s>>>(src, dtype, n, dst);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

static int xent2d_blocks(long long npix)
{
    size_t b = cu_blocks((size_t)npix, CU_TPB);
    return (int)(b < CU_XENT_BLOCKS ? b : CU_XENT_BLOCKS);
}

extern "C" size_t sf_cuda_xent2d_scratch_bytes(int n, int h, int w)
{
    return sizeof(xent2d_part) * (size_t)xent2d_blocks((long long)n * h * w);
}

extern "C" int sf_cuda_xent2d(const float *logits, const int32_t *labels, int n, int k, int h, int w,
                              sf_layout lay, float *dlogits, sf_xent2d_out *out, void *scratch,
                              const sf_loss_ctl *ctl, cudaStream_t s)
{
    if (n < 1 || k < 1 || h < 1 || w < 1) {
        sf_cuda_set_error("%s:%d: sf_cuda_xent2d: n=%d k=%d h=%d w=%d", __FILE__, __LINE__, n, k, h, w);
        return -1;
    }
    const long long npix = (long long)n * h * w;
    const int nb = xent2d_blocks(npix);
    xent2d_part *part = (xent2d_part *)scratch;
    k_xent2d<<<nb, CU_TPB, 0, s>>>(logits, labels, k, (long long)h * w, npix, lay == SF_LAYOUT_NHWC, dlogits,
                                  part, ctl);
    SF_CUDA_CHECK_LAUNCH();
    k_xent2d_final<<<1, CU_TPB, 0, s>>>(part, nb, npix, out);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}
