/* tests/gpu/op_test.h — what the op families' compare functions
 * (tests/gpu/ops/<family>.cu, run by test_ops from the case table
 * tests/gpu/op_cases.cu) share beside gpu_test.h: fresh random inputs, NaN poisoning, the fp32/tf32
 * relative-error checks, and the bf16 helpers (host rounding so both sides see
 * the same values, bf16 uploads and downloads, the max-error and per-element
 * criteria). Header-only, and every family file includes it, so its
 * mutable state (the input seed) is an inline variable that they share.
 *
 * Every CUDA op runs against the double-precision reference of gpu/ref
 * (DESIGN.md section 8) on fresh random inputs (never zeros), outputs poisoned
 * with NaN before each run, NaN or Inf anywhere failing.
 */
#ifndef SF_TESTS_GPU_OP_TEST_H
#define SF_TESTS_GPU_OP_TEST_H

extern "C" {
#include "gpu/ref/ref.h"
#include "gpu/rng.h"
}

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <initializer_list>
#include <vector>

#include <cuda_bf16.h>

#include "tests/gpu/gpu_test.h"

#include "gpu/cuda/batchnorm.h"
#include "gpu/cuda/conv.h"
#include "gpu/cuda/conv_transpose.h"
#include "gpu/cuda/layout.h"
#include "gpu/cuda/linear.h"
#include "gpu/cuda/loss.h"
#include "gpu/cuda/optimizer.h"
#include "gpu/cuda/pointwise.h"
#include "gpu/cuda/pool.h"

/* The next input's seed; test_ops sets it from each case's name. */
inline uint64_t g_seed = 0x9e3779b9;

/* ---- helpers -------------------------------------------------------------- */

static __attribute__((unused)) void rand_fill(std::vector<float> &v, float scale, float offset = 0.f)
{
    uint64_t s = g_seed++;
    for (size_t i = 0; i < v.size(); i++) {
        float u = sf_u01(sf_hash4(s, i, 91, 0)) * 2.f - 1.f;
        if (u == 0.f)
            u = 0.5f; /* never zero */
        v[i] = offset + u * scale;
    }
}

static __attribute__((unused)) void check_f(const char *name, const float *got, const std::vector<double> &ref, double tol)
{
    check(name, got, ref.data(), ref.size(), tol);
}

static __attribute__((unused)) void check_v(const char *name, const std::vector<float> &got, const std::vector<double> &ref, double tol)
{
    if (got.size() != ref.size()) {
        g_fail++;
        printf("FAIL %s: size %zu vs %zu\n", name, got.size(), ref.size());
        return;
    }
    check(name, got.data(), ref.data(), ref.size(), tol);
}

static __attribute__((unused)) void fail(const char *name, const char *why)
{
    g_fail++;
    printf("FAIL %s: %s\n", name, why);
}

/* The name of one of a case's outputs: "<nm> <what>", for the check_*
 * functions' name argument. */
struct subname {
    char s[320];
    subname(const char *nm, const char *what) { snprintf(s, sizeof s, "%s %s", nm, what); }
    operator const char *() const { return s; }
};

static __attribute__((unused)) void pass_or_fail(const char *name, int ok, const char *why)
{
    if (ok) {
        g_ok++;
        printf("ok %s\n", name);
    } else {
        fail(name, why);
    }
}


/* Waits for stream s; returns 1 when the launches before it succeeded (rc,
 * their launchers' or'ed results, is 0), else reports their error under name
 * and returns 0. */
static __attribute__((unused)) int ran_ok(cudaStream_t s, const char *name, int rc)
{
    CU(cudaStreamSynchronize(s));
    if (rc)
        fail(name, sf_cuda_last_error());
    return !rc;
}

/* A device region a replay check compares: bytes from p. */
struct dev_region {
    void *p;
    size_t bytes;
};

/* enq(st) enqueues an op's launches on st and returns their or'ed results.
 * Runs them on s (after what the caller enqueued there), keeps the bytes of
 * outs, captures enq into a CUDA graph, poisons outs and replays the graph:
 * one check under name that the replay writes the same bits. It passes when
 * the launchers allocate and synchronise nothing (else the capture fails)
 * and their reductions are deterministic (else the bits differ). */
template <class Enqueue>
static void check_graph_replay(const char *name, cudaStream_t s, Enqueue enq, std::initializer_list<dev_region> outs)
{
    if (!ran_ok(s, name, enq(s)))
        return;
    std::vector<std::vector<char>> eager;
    for (const dev_region &o : outs)
        eager.push_back(down((const char *)o.p, o.bytes));
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    const int rc = enq(s);
    const cudaError_t ce = cudaStreamEndCapture(s, &gr);
    if (rc || ce != cudaSuccess || cudaGraphInstantiate(&ge, gr, 0) != cudaSuccess) {
        fail(name, rc ? sf_cuda_last_error() : "capture failed");
    } else {
        for (const dev_region &o : outs)
            poison(o.p, o.bytes);
        CU(cudaGraphLaunch(ge, s));
        CU(cudaStreamSynchronize(s));
        int same = 1;
        size_t i = 0;
        for (const dev_region &o : outs)
            same &= down((const char *)o.p, o.bytes) == eager[i++];
        pass_or_fail(name, same, "replay differs from the eager run (non-deterministic or not captured)");
        cudaGraphExecDestroy(ge);
    }
    if (ce == cudaSuccess)
        cudaGraphDestroy(gr);
}

/* A float tensor of n elements filled with all-ones bits: NaN. */
static __attribute__((unused)) void poison_f(float *d, size_t n) { poison(d, n * 4); }

static __attribute__((unused)) const char *lname(sf_layout l) { return l == SF_LAYOUT_NHWC ? "nhwc" : "nchw"; }

/* An NCHW host tensor in layout lay, and back. */
static __attribute__((unused)) std::vector<float> to_lay(const std::vector<float> &v, sf_layout lay, int n, int c, int h,
                                                         int w)
{
    return lay == SF_LAYOUT_NHWC ? to_nhwc(v, n, c, h, w) : v;
}
static __attribute__((unused)) std::vector<float> from_lay(const std::vector<float> &v, sf_layout lay, int n, int c,
                                                           int h, int w)
{
    return lay == SF_LAYOUT_NHWC ? to_nchw(v, n, c, h, w) : v;
}

/* ---- bf16 data ---------------------------------------------------------------
 * Host values are rounded to bf16 first (sf_bf16_round, ref.h), so the bf16 bit
 * patterns uploaded hold exactly the values the reference is given. */

static __attribute__((unused)) void round_bf16(std::vector<float> &v) { sf_bf16_round_n(v.data(), v.size()); }
static __attribute__((unused)) void upb(uint16_t *d, const std::vector<float> &h)
{
    std::vector<uint16_t> b(h.size());
    for (size_t i = 0; i < h.size(); i++)
        b[i] = sf_bf16_bits(h[i]);
    CU(cudaMemcpy(d, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
}
static __attribute__((unused)) std::vector<float> downb(const uint16_t *d, size_t n)
{
    std::vector<uint16_t> b(n);
    CU(cudaMemcpy(b.data(), d, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++)
        h[i] = sf_bf16_float(b[i]);
    return h;
}
static __attribute__((unused)) void poison_b(uint16_t *d, size_t n) { CU(cudaMemset(d, 0xff, n * 2)); } /* 0xffff: a bf16 NaN */

/* The bf16 criterion: max |got - ref| <= tol * max |ref|, NaN or Inf anywhere
 * failing. ref is the double-precision reference on the bf16-rounded inputs,
 * so the inputs contribute no error; what is left is fp32 accumulation (relative
 * ~1e-6 here) and, for a bf16 output, its one rounding to nearest, at most
 * half an ulp, 2^-8 ~ 3.9e-3 of the element, so of max |ref|. tol 1e-2 leaves
 * a factor 2.5 over that and still catches a wrong layout, a dropped tap, a
 * channel mix-up or a half-written output (errors of order max |ref|). */
static __attribute__((unused)) void check_max(const char *name, const std::vector<float> &got, const std::vector<double> &ref, double tol)
{
    double err = 0, scale = 0;
    size_t nonfin = 0, worst = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        scale = fmax(scale, fabs(ref[i]));
        if (!isfinite(got[i])) {
            nonfin++;
            continue;
        }
        const double e = fabs((double)got[i] - ref[i]);
        if (e > err) {
            err = e;
            worst = i;
        }
    }
    char why[200];
    if (nonfin || got.size() != ref.size()) {
        snprintf(why, sizeof why, "%zu of %zu elements not finite (or size %zu)", nonfin, ref.size(), got.size());
        fail(name, why);
    } else if (err > tol * scale || scale == 0) {
        snprintf(why, sizeof why, "max err %.3e > %.0e * max|ref| %.3e (worst [%zu] %g vs %g)", err, tol, scale, worst,
                 got[worst], ref[worst]);
        fail(name, why);
    } else {
        g_ok++;
        printf("ok %s (max err %.2e of max|ref| %.3g)\n", name, err / scale, scale);
    }
}

/* ---- element types (bf16): helpers ------------------------------------------
 * bf16 cases draw float inputs, round them with sf_bf16_round (ref.h) so the
 * device and the reference see the same values, run the reference in double
 * (or float where ref.h has only that) and compare the kernel's bf16 output to
 * the unrounded reference (check_dt). */

/* Every op family runs in both element types and, where it has a layout,
 * both activation layouts, in this order (the order of the case lines). */
static const sf_dtype k_dtypes[] = {SF_DT_F32, SF_DT_BF16};
static const sf_layout k_layouts[] = {SF_LAYOUT_NCHW, SF_LAYOUT_NHWC};

static __attribute__((unused)) const char *dtname(sf_dtype dt) { return dt == SF_DT_BF16 ? "bf16" : "fp32"; }
static __attribute__((unused)) void round_dt(std::vector<float> &v, sf_dtype dt)
{
    if (dt == SF_DT_BF16)
        sf_bf16_round_n(v.data(), v.size());
}

/* Fresh random inputs (rand_fill) as element type dt holds them (round_dt). */
static __attribute__((unused)) void rand_fill_dt(std::vector<float> &v, sf_dtype dt, float scale, float offset = 0.f)
{
    rand_fill(v, scale, offset);
    round_dt(v, dt);
}

/* A device tensor of n elements of dt; p is `mis` elements past the start of a
 * fresh cudaMalloc (256-byte aligned), so mis = 1 breaks 16-byte alignment. */
struct dbuf {
    char *base;
    void *p;
    size_t n;
    sf_dtype dt;
};
static __attribute__((unused)) dbuf dbuf_make(sf_dtype dt, size_t n, int mis)
{
    dbuf b;
    b.base = dalloc<char>((n + 8) * sf_dtype_size(dt));
    b.p = b.base + (size_t)mis * sf_dtype_size(dt);
    b.n = n;
    b.dt = dt;
    return b;
}
static __attribute__((unused)) void dbuf_free(dbuf &b) { cudaFree(b.base); }
static __attribute__((unused)) void up_dt(const dbuf &b, const std::vector<float> &h)
{
    if (b.dt == SF_DT_BF16) {
        std::vector<uint16_t> u(h.size());
        for (size_t i = 0; i < h.size(); i++)
            u[i] = sf_bf16_bits(h[i]);
        CU(cudaMemcpy(b.p, u.data(), u.size() * 2, cudaMemcpyHostToDevice));
    } else {
        CU(cudaMemcpy(b.p, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    }
}
static __attribute__((unused)) std::vector<float> down_dt(const dbuf &b, size_t n)
{
    std::vector<float> h(n);
    if (b.dt == SF_DT_BF16) {
        std::vector<uint16_t> u(n);
        CU(cudaMemcpy(u.data(), b.p, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++)
            h[i] = sf_bf16_float(u[i]);
    } else {
        CU(cudaMemcpy(h.data(), b.p, n * 4, cudaMemcpyDeviceToHost));
    }
    return h;
}
static __attribute__((unused)) void poison_dt(const dbuf &b) { poison(b.p, b.n * sf_dtype_size(b.dt)); } /* 0xffff: a bf16 NaN */

/* A forward's and its backward's device tensors of element type dt, each
 * `mis` elements past an aligned address: x and dy uploaded as given (already
 * in their layout), y (as many elements as dy) and dx (as many as x)
 * poisoned. */
struct io_bufs {
    dbuf x, y, dy, dx;
};
static __attribute__((unused)) io_bufs io_make(sf_dtype dt, const std::vector<float> &x, const std::vector<float> &dy,
                                               int mis = 0)
{
    io_bufs b = {dbuf_make(dt, x.size(), mis), dbuf_make(dt, dy.size(), mis), dbuf_make(dt, dy.size(), mis),
                 dbuf_make(dt, x.size(), mis)};
    up_dt(b.x, x);
    up_dt(b.dy, dy);
    poison_dt(b.y);
    poison_dt(b.dx);
    return b;
}
static __attribute__((unused)) void io_free(io_bufs &b)
{
    dbuf_free(b.x);
    dbuf_free(b.y);
    dbuf_free(b.dy);
    dbuf_free(b.dx);
}

/* Element by element: |got - ref| <= rel*|ref| + absf*max|ref|, NaN or Inf
 * failing; rel = absf = 0 asks for exact values. Prints the worst element. */
static __attribute__((unused)) void check_ulp(const char *name, const std::vector<float> &got, const std::vector<double> &ref, double rel,
                      double absf)
{
    if (got.size() != ref.size()) {
        g_fail++;
        printf("FAIL %s: size %zu vs %zu\n", name, got.size(), ref.size());
        return;
    }
    double scale = 0;
    for (size_t i = 0; i < ref.size(); i++)
        scale = fmax(scale, fabs(ref[i]));
    const double abst = absf * scale;
    size_t bad = 0, nonfin = 0, worst = 0;
    double wr = -1; /* worst error over its allowance */
    for (size_t i = 0; i < ref.size(); i++) {
        if (!isfinite(got[i])) {
            if (!nonfin++)
                worst = i;
            continue;
        }
        const double e = fabs((double)got[i] - ref[i]), allow = rel * fabs(ref[i]) + abst;
        if (e > allow)
            bad++;
        const double r = allow > 0 ? e / allow : (e > 0 ? INFINITY : 0);
        if (!nonfin && r > wr) {
            wr = r;
            worst = i;
        }
    }
    if (nonfin) {
        g_fail++;
        printf("FAIL %s: %zu of %zu elements not finite (first at %zu: %g, ref %g)\n", name, nonfin, ref.size(), worst,
               got[worst], ref[worst]);
    } else if (bad) {
        g_fail++;
        printf("FAIL %s: %zu of %zu elements beyond %g*|ref| + %g; worst [%zu] %.9g vs %.9g\n", name, bad, ref.size(),
               rel, abst, worst, got[worst], ref[worst]);
    } else {
        g_ok++;
        printf("ok %s (worst %.2f of the allowance)\n", name, wr < 0 ? 0.0 : wr);
    }
}

/* The bf16 output criterion: |got - ref| <= 2^-8 |ref| + 1e-5 max|ref|.
 * ref is the double reference on the same bf16-rounded inputs, so what is left
 * is the kernel's fp32 arithmetic (~1e-6 relative) and the output's one
 * rounding to nearest even: at most half an ulp, and half a bf16 ulp is at
 * most 2^-8 of the value (8 significant bits). The absolute term, 1e-5 of the
 * largest reference value, covers fp32 error on values near zero (BN's dx
 * cancels terms of order max|ref|). fp32 outputs keep the suite's norm check
 * (check_v) with the fp32 tolerance tol32. */
static __attribute__((unused)) void check_dt(const char *name, sf_dtype dt, const std::vector<float> &got, const std::vector<double> &ref,
                     double tol32)
{
    if (dt == SF_DT_F32)
        check_v(name, got, ref, tol32);
    else
        check_ulp(name, got, ref, 1.0 / 256, 1e-5);
}

/* The criterion of the GEMM and convolution families, one bound for either
 * element type: fp32 data by relative error below tol (check_v), bf16 data by
 * max |got - ref| <= tol * max |ref| (check_max). */
static __attribute__((unused)) void check_gemm(const char *name, sf_dtype dt, const std::vector<float> &got,
                                               const std::vector<double> &ref, double tol)
{
    if (dt == SF_DT_F32)
        check_v(name, got, ref, tol);
    else
        check_max(name, got, ref, tol);
}

/* check_dt on an [n, c, h, w] output b stored in layout lay, under the name
 * "<nm> <what>". */
static __attribute__((unused)) void check_lay(const char *nm, const char *what, const dbuf &b, sf_layout lay, int n,
                                              int c, int h, int w, const std::vector<double> &ref, double tol32)
{
    check_dt(subname(nm, what), b.dt, from_lay(down_dt(b, (size_t)n * c * h * w), lay, n, c, h, w), ref, tol32);
}

/* An input gradient dx stored in layout lay: check_lay's criterion where it
 * was wanted, else that its poisoned buffer was left alone (no element
 * written). */
static __attribute__((unused)) void check_dx_lay(const char *nm, const dbuf &dx, sf_layout lay, int n, int c, int h,
                                                 int w, const std::vector<double> &ref, int wanted, double tol32)
{
    if (wanted) {
        check_lay(nm, "bwd dx", dx, lay, n, c, h, w, ref, tol32);
        return;
    }
    size_t written = 0;
    for (const float v : down_dt(dx, (size_t)n * c * h * w))
        written += !isnan(v);
    pass_or_fail(subname(nm, "bwd leaves dx alone"), written == 0, "dx written");
}

/* A parameter's gradient is a sum of many terms of random sign, far smaller
 * than the sum of their sizes (its mass): fp32 accumulation in any order is
 * off by a few ulps of the mass, not of the result. Each got[j] passes
 * within tol of ref[j] or 1e-7 of mass[j] (under two fp32 ulps of it),
 * where one lost or doubled term of average size is 1 / terms of the mass,
 * far beyond it; a NaN fails. what names element j in a failure ("slope",
 * "tap"). */
static __attribute__((unused)) void check_param_sums(const char *name, const char *what,
                                                     const std::vector<float> &got, const std::vector<double> &ref,
                                                     const std::vector<double> &mass, double tol)
{
    size_t worst = 0;
    double wr = 0.0;
    for (size_t j = 0; j < ref.size(); j++) {
        const double allow = fmax(tol * fabs(ref[j]), 1e-7 * mass[j]), e = fabs((double)got[j] - ref[j]);
        double r = allow > 0 ? e / allow : (e > 0 ? INFINITY : 0);
        if (r != r)
            r = INFINITY;
        if (r > wr) {
            wr = r;
            worst = j;
        }
    }
    if (wr > 1.0) {
        g_fail++;
        printf("FAIL %s: %s %zu %.9g vs %.9g, %.3g of the allowance (tol %g of the value, 1e-7 of the terms' "
               "mass %.6g)\n", name, what, worst, got[worst], ref[worst], wr, tol, mass[worst]);
    } else {
        g_ok++;
        printf("ok %s (worst %.2f of the allowance)\n", name, wr);
    }
}

#endif
