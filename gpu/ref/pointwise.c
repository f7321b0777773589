/* gpu/ref/pointwise.c — reference ReLU and residual add in float and double
 * (_f64). Contracts in gpu/ref/ref.h. */
#ifndef T
#include "ref.h"

#include <math.h>

/* Generated for double too, but declared in ref.h for float only: declared
 * here so the definition has a prototype. */
void sf_ref_add_fwd_f64(const double *a, const double *b, size_t len, double *y);

#define SF_REF_SELF "pointwise.c"
#include "generic.h"

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* y = max(x, 0); NaN propagates (as torch.relu). x == y is allowed. */
void SF_FN(sf_ref_relu_fwd)(const T *x, size_t len, T *y)
{
    for (size_t i = 0; i < len; i++)
        y[i] = x[i] < (T)0 ? (T)0 : x[i];
}

/* dx = dy where y > 0, else 0. dx == dy is allowed. */
void SF_FN(sf_ref_relu_bwd)(const T *y, const T *dy, size_t len, T *dx)
{
    for (size_t i = 0; i < len; i++)
        dx[i] = y[i] > (T)0 ? dy[i] : (T)0;
}

/* y = a + b; y may be a or b (in place). The backward is dy for both inputs:
 * no function, the caller passes dy on. */
void SF_FN(sf_ref_add_fwd)(const T *a, const T *b, size_t len, T *y)
{
    for (size_t i = 0; i < len; i++)
        y[i] = a[i] + b[i];
}

#endif
