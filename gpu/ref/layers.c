/* gpu/ref/layers.c — reference layers in float and double (_f64), generated
 * from one source (layers_impl.h), plus the SGD update. See gpu/ref/ref.h. */
#include "ref.h"

#include <math.h>

/* Outputs o in [*o0, *o1) of a convolution axis (input length in, output
 * length out) whose tap at kernel offset kk reads input index
 * o*stride + kk - pad inside [0, in). */
static void tap_range(int kk, int stride, int pad, int in, int out, int *o0, int *o1)
{
    int lo = 0, hi = out;
    const int first = kk - pad;           /* input index read by o = 0 */
    if (first < 0)
        lo = (-first + stride - 1) / stride; /* smallest o with o*stride + first >= 0 */
    if (first > in - 1)
        hi = 0;
    else if ((in - 1 - first) / stride + 1 < hi)
        hi = (in - 1 - first) / stride + 1; /* largest o with o*stride + first <= in-1, plus 1 */
    if (lo > hi)
        lo = hi;
    *o0 = lo;
    *o1 = hi;
}

#define T float
#define SF_FN(name) name
#define SF_EXP expf
#define SF_LOG logf
#include "layers_impl.h"
#undef T
#undef SF_FN
#undef SF_EXP
#undef SF_LOG

#define T double
#define SF_FN(name) name##_f64
#define SF_EXP exp
#define SF_LOG log
#include "layers_impl.h"
#undef T
#undef SF_FN
#undef SF_EXP
#undef SF_LOG

/* PyTorch SGD (dampening 0, no nesterov):
 *   g = grad + wd * p;  buf = momentum * buf + g;  p -= lr * (momentum ? buf : g) */
void sf_ref_sgd(float *p, const float *grad, float *mom, size_t len, float lr, float momentum, float wd)
{
    for (size_t i = 0; i < len; i++) {
        const float g = grad[i] + wd * p[i];
        if (momentum != 0.0f) {
            mom[i] = momentum * mom[i] + g;
            p[i] = p[i] - lr * mom[i];
        } else {
            p[i] = p[i] - lr * g;
        }
    }
}
