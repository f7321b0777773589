/* gpu/ref/loss.c — reference softmax cross-entropy, per sample and per pixel,
 * in float and double (_f64). Contracts in gpu/ref/ref.h. */
#ifndef T
#include "gpu/ref/ref.h"

#include <math.h>

#define SF_REF_SELF "loss.c"
#include "gpu/ref/generic.h"

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* Whether class lab of the k logits l[j * stride] is among the 5 largest in
 * the order of torch.sort(descending=True, stable=True): ties go to the lower
 * class index. With k <= 5 every class is. A NaN logit of lab never is. */
static int SF_FN(top5_hit)(const T *l, size_t stride, int k, int lab)
{
    if (k <= 5)
        return 1;
    const T v = l[(size_t)lab * stride];
    if (v != v)
        return 0;
    int ahead = 0;
    for (int j = 0; j < k && ahead < 5; j++) {
        const T u = l[(size_t)j * stride];
        ahead += u > v || (u == v && j < lab);
    }
    return ahead < 5;
}

/* The soft-target cross-entropy of one sample's k logits l[j * stride]:
 * target t_j = (1-s) * (lam*[j == y] + (1-lam)*[j == y2]) + s/k;
 * loss = logsumexp(l) - sum_j t_j l_j; d[j * stride] = (softmax_j - t_j) * scale
 * (d may be NULL). Returns the loss; *arg gets the first maximum. */
static T SF_FN(soft_xent_one)(const T *l, size_t stride, int k, int y, int y2, T s, T lam, T scale, T *d,
                              int *arg)
{
    int a = 0;
    T m = l[0];
    T suml = 0;
    for (int j = 0; j < k; j++) {
        const T v = l[(size_t)j * stride];
        suml += v;
        if (j > 0 && v > m) {
            m = v;
            a = j;
        }
    }
    T sum = 0;
    for (int j = 0; j < k; j++)
        sum += SF_EXP(l[(size_t)j * stride] - m);
    const T lse = m + SF_LOG(sum);
    const T one = (T)1 - s;
    const T dot = one * (lam * l[(size_t)y * stride] + ((T)1 - lam) * l[(size_t)y2 * stride]) + s * suml / (T)k;
    if (d) {
        for (int j = 0; j < k; j++) {
            const T t = one * ((j == y ? lam : (T)0) + (j == y2 ? (T)1 - lam : (T)0)) + s / (T)k;
            d[(size_t)j * stride] = (SF_EXP(l[(size_t)j * stride] - lse) - t) * scale;
        }
    }
    *arg = a;
    return lse - dot;
}

/* See ref.h. A label outside [0,k) makes the loss NaN (and that sample's
 * gradient NaN). The per-sample losses are summed in double (as the per-pixel
 * ones below), so the mean is the float rounding of the exact mean. */
void SF_FN(sf_ref_xent_soft)(const T *logits, const int32_t *labels, int n, int k, T smoothing, T lam, T *loss,
                             T *dlogits, int *correct, int *correct5)
{
    double total = 0;
    int right = 0, right5 = 0;
    if (lam <= (T)0 || lam > (T)1)
        lam = 1; /* 0 reads as "no mixing" (backend.h) */
    for (int ni = 0; ni < n; ni++) {
        const T *l = logits + (size_t)ni * k;
        const int32_t lab = labels[ni];
        /* Without mixing the rolled label plays no part (and is not checked). */
        const int32_t prev = lam < (T)1 ? labels[(ni + n - 1) % n] : lab;
        T *d = dlogits ? dlogits + (size_t)ni * k : NULL;
        if (lab < 0 || lab >= k || prev < 0 || prev >= k) {
            total += NAN;
            for (int j = 0; d && j < k; j++)
                d[j] = (T)NAN;
            continue;
        }
        int arg = 0;
        total += SF_FN(soft_xent_one)(l, 1, k, lab, prev, smoothing, lam, (T)1 / (T)n, d,
                                      &arg);
        right += arg == lab;
        right5 += SF_FN(top5_hit)(l, 1, k, lab);
    }
    if (loss)
        *loss = (T)(total / n);
    if (correct)
        *correct = right;
    if (correct5)
        *correct5 = right5;
}

/* loss = mean_n ( logsumexp(l[n]) - l[n][label] );  dl = (softmax - onehot) / n. */
void SF_FN(sf_ref_xent)(const T *logits, const int32_t *labels, int n, int k, T *loss, T *dlogits,
                        int *correct)
{
    SF_FN(sf_ref_xent_soft)(logits, labels, n, k, (T)0, (T)1, loss, dlogits, correct, NULL);
}

/* See ref.h: per pixel, with label smoothing s; the argmax is the first
 * maximum (as torch.argmax). A label outside [0,k) makes the loss NaN and
 * that pixel's gradient NaN (as sf_ref_xent). The pixels' losses are summed
 * in double: a float running sum over W2's 65536 pixels per image drifts by
 * about 1e-4 relative (8.7e-5 measured on two images against PyTorch in
 * float64, whose float32 loss is within 1.2e-7), and the CUDA kernel sums its
 * blocks' partial sums in double too. */
void SF_FN(sf_ref_xent2d_smooth)(const T *logits, const int32_t *labels, int n, int k, int h, int w,
                                 T smoothing, T *loss, T *dlogits, int64_t *correct, int64_t *correct5)
{
    const size_t hw = (size_t)h * w;
    const size_t pixels = (size_t)n * hw;
    double total = 0;
    int64_t right = 0, right5 = 0;
    for (int ni = 0; ni < n; ni++) {
        for (size_t pix = 0; pix < hw; pix++) {
            const T *l = logits + (size_t)ni * k * hw + pix; /* l[j * hw] is class j */
            const int32_t lab = labels[(size_t)ni * hw + pix];
            T *d = dlogits ? dlogits + (size_t)ni * k * hw + pix : NULL;
            if (lab < 0 || lab >= k) {
                total += NAN;
                for (int j = 0; d && j < k; j++)
                    d[j * hw] = (T)NAN;
                continue;
            }
            int arg = 0;
            total += SF_FN(soft_xent_one)(l, hw, k, lab, lab, smoothing, (T)1, (T)1 / (T)pixels, d, &arg);
            right += arg == lab;
            right5 += SF_FN(top5_hit)(l, hw, k, lab);
        }
    }
    if (loss)
        *loss = (T)(total / (double)pixels);
    if (correct)
        *correct = right;
    if (correct5)
        *correct5 = right5;
}

void SF_FN(sf_ref_xent2d)(const T *logits, const int32_t *labels, int n, int k, int h, int w,
                          T *loss, T *dlogits, int64_t *correct)
{
    SF_FN(sf_ref_xent2d_smooth)(logits, labels, n, k, h, w, (T)0, loss, dlogits, correct, NULL);
}

#endif
