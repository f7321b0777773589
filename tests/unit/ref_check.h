/* tests/unit/ref_check.h — helpers shared by the reference-layer tests:
 * deterministic random vectors, dot products and relative errors (NaN never
 * passes). Define REF_CHECK_SEED before including to pick the stream. */
#ifndef SF_TESTS_REF_CHECK_H
#define SF_TESTS_REF_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "gpu/rng.h"

#ifndef REF_CHECK_SEED
#define REF_CHECK_SEED 1234
#endif

#define FD_EPS 1e-5
#define FD_TOL 1e-6

static uint64_t rng_ctr;

/* Uniform in [-1, 1), keyed by a running counter. */
static inline double rnd(void) { return 2.0 * sf_u01(sf_hash4(REF_CHECK_SEED, rng_ctr++, 0, 0)) - 1.0; }

static inline double *rand_vec(size_t n)
{
    double *v = malloc(sizeof(double) * (n ? n : 1));
    for (size_t i = 0; i < n; i++)
        v[i] = rnd();
    return v;
}

static inline double dot(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* ||a - b|| / ||b|| (b is the reference); 0 when both are 0; NaN never passes. */
static inline double rel_err_d(const double *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i]))
            return INFINITY;
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den == 0 ? sqrt(num) : sqrt(num / den);
}

static inline double rel_err_fd(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i]))
            return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den == 0 ? sqrt(num) : sqrt(num / den);
}

#endif
