/* gpu/ref/loss.c — reference softmax cross-entropy, per sample and per pixel,
 * in float and double (_f64). Contracts in gpu/ref/ref.h. */
#ifndef T
#include "ref.h"

#include <math.h>

#define SF_REF_SELF "loss.c"
#include "generic.h"

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* loss = mean_n ( logsumexp(l[n]) - l[n][label] );  dl = (softmax - onehot) / n.
 * A label outside [0,k) makes the loss NaN (and that sample's gradient NaN). */
void SF_FN(sf_ref_xent)(const T *logits, const int32_t *labels, int n, int k, T *loss, T *dlogits,
                        int *correct)
{
    T total = 0;
    int right = 0;
    for (int ni = 0; ni < n; ni++) {
        const T *l = logits + (size_t)ni * k;
        const int32_t lab = labels[ni];
        const int valid = lab >= 0 && lab < k;
        int arg = 0;
        T m = l[0];
        for (int j = 1; j < k; j++)
            if (l[j] > m) {
                m = l[j];
                arg = j;
            }
        T sum = 0;
        for (int j = 0; j < k; j++)
            sum += SF_EXP(l[j] - m);
        const T lse = m + SF_LOG(sum);
        total += valid ? lse - l[lab] : (T)NAN;
        right += valid && arg == lab;
        if (dlogits) {
            T *d = dlogits + (size_t)ni * k;
            for (int j = 0; j < k; j++) {
                const T p = SF_EXP(l[j] - lse);
                d[j] = valid ? (p - (j == lab ? (T)1 : (T)0)) / (T)n : (T)NAN;
            }
        }
    }
    if (loss)
        *loss = total / (T)n;
    if (correct)
        *correct = right;
}

/* For every pixel (n, y, x): the k logits l[n][j][y][x] (stride h*w apart),
 *   loss = mean over the n*h*w pixels of ( logsumexp_j l - l[label] ),
 *   dl[n][j][y][x] = (softmax_j - [j == label]) / (n*h*w).
 * The argmax is the first maximum (as torch.argmax). A label outside [0,k)
 * makes the loss NaN and that pixel's gradient NaN (as sf_ref_xent). */
void SF_FN(sf_ref_xent2d)(const T *logits, const int32_t *labels, int n, int k, int h, int w,
                          T *loss, T *dlogits, int64_t *correct)
{
    const size_t hw = (size_t)h * w;
    const size_t pixels = (size_t)n * hw;
    T total = 0;
    int64_t right = 0;
    for (int ni = 0; ni < n; ni++) {
        for (size_t pix = 0; pix < hw; pix++) {
            const T *l = logits + (size_t)ni * k * hw + pix; /* l[j * hw] is class j */
            const int32_t lab = labels[(size_t)ni * hw + pix];
            const int valid = lab >= 0 && lab < k;
            int arg = 0;
            T m = l[0];
            for (int j = 1; j < k; j++)
                if (l[j * hw] > m) {
                    m = l[j * hw];
                    arg = j;
                }
            T sum = 0;
            for (int j = 0; j < k; j++)
                sum += SF_EXP(l[j * hw] - m);
            const T lse = m + SF_LOG(sum);
            total += valid ? lse - l[(size_t)lab * hw] : (T)NAN;
            right += valid && arg == lab;
            if (dlogits) {
                T *d = dlogits + (size_t)ni * k * hw + pix;
                for (int j = 0; j < k; j++) {
                    const T p = SF_EXP(l[j * hw] - lse);
                    d[j * hw] = valid ? (p - (j == lab ? (T)1 : (T)0)) / (T)pixels : (T)NAN;
                }
            }
        }
    }
    if (loss)
        *loss = total / (T)pixels;
    if (correct)
        *correct = right;
}

#endif
