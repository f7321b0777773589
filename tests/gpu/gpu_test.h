/* tests/gpu/gpu_test.h — what every GPU test program shares beside
 * gpu/cuda/program.h (CU, device buffers, the test stream, the SKIPPED line
 * without a device, a host clock, which the benchmarks share too): the
 * ok/FAIL counters and lines (shared by every file linked into one program),
 * a test's main() (run_op_test: the SKIPPED line, the cases, the last device
 * check, the summary line and the exit status; finish for the programs that
 * write their own), NCHW <-> NHWC on the host, the pair of backends a backend
 * test compares, and the relative-error check against a double-precision
 * reference (DESIGN.md §8: NaN or Inf anywhere fails, the worst elements are
 * printed). Header-only. */
#ifndef SF_TESTS_GPU_TEST_H
#define SF_TESTS_GPU_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <vector>

#include <cuda_runtime.h>

#include "gpu/cuda/program.h"

/* Inline, so that the op case driver (test_ops) and the family files it links
 * count in one pair. */
inline int g_fail = 0, g_ok = 0;

static void ok(const char *fmt, ...) __attribute__((format(printf, 1, 2), unused));
static void ok(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("ok ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    g_ok++;
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), unused));
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    g_fail++;
}

static __attribute__((unused)) std::vector<double> to_d(const std::vector<float> &v)
{
    return std::vector<double>(v.begin(), v.end());
}

/* ||got - ref|| / ||ref|| < tol, with NaN or Inf anywhere failing. Prints the
 * three worst elements on failure. */
static __attribute__((unused)) void check(const char *name, const float *got, const double *ref, size_t n,
                                          double tol)
{
    double num = 0, den = 0;
    size_t bad_nan = 0, first_nan = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            if (!bad_nan)
                first_nan = i;
            bad_nan++;
            continue;
        }
        double d = got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    double rel = bad_nan ? INFINITY : (den > 0 ? sqrt(num / den) : sqrt(num));
    if (rel < tol) {
        printf("ok %s (rel %.2e)\n", name, rel);
        g_ok++;
        return;
    }
    g_fail++;
    if (bad_nan) {
        printf("FAIL %s: %zu of %zu elements not finite (first at %zu: %g, ref %g)\n", name, bad_nan, n,
               first_nan, got[first_nan], ref[first_nan]);
        return;
    }
    printf("FAIL %s: rel %.3e >= %.1e; worst:", name, rel, tol);
    size_t w[3] = {0, 0, 0};
    double we[3] = {-1, -1, -1};
    for (size_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]);
        for (int k = 0; k < 3; k++)
            if (e > we[k]) {
                for (int j = 2; j > k; j--) {
                    we[j] = we[j - 1];
                    w[j] = w[j - 1];
                }
                we[k] = e;
                w[k] = i;
                break;
            }
    }
    for (int k = 0; k < 3; k++)
        if (we[k] >= 0)
            printf(" [%zu] %g vs %g;", w[k], got[w[k]], ref[w[k]]);
    printf("\n");
}


/* ---- the end of every GPU test program --------------------------------------- */

/* The summary line every GPU test program ends with, and its exit status:
 * 1 when any check failed. */
static __attribute__((unused)) int report(const char *program)
{
    printf("%s: %d ok, %d failed\n", program, g_ok, g_fail);
    return g_fail ? 1 : 0;
}

/* The end of an op test's main(): waits for the device, so that a fault in
 * a kernel launched last (an illegal address, a trap) is a FAIL line rather
 * than lost with the process, then prints the summary line. */
static __attribute__((unused)) int finish(const char *program)
{
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("FAIL device: %s\n", cudaGetErrorString(e));
        g_fail++;
    }
    return report(program);
}

/* The whole of a test's main() when its cases need only the test stream
 * (test_augment's): the SKIPPED line without a device, else the cases on the
 * test stream, then finish(). */
static __attribute__((unused)) int run_op_test(const char *program, void (*cases)(cudaStream_t s))
{
    if (skip_without_device())
        return 0;
    cases(test_stream());
    return finish(program);
}

/* ---- device calls and host layouts ------------------------------------------ */
/* DEV_OK expects the including file's fail(name, why). */
#define DEV_OK(call, name)                                                                          \
    do {                                                                                             \
        if ((call) != 0) {                                                                           \
            fail(name, sf_cuda_last_error());                                                        \
            return;                                                                                  \
        }                                                                                            \
    } while (0)
/* NCHW <-> NHWC on the host (also [a][b][k][k] <-> [a][k][k][b]). */
template <typename T> static std::vector<T> to_nhwc(const std::vector<T> &x, int n, int c, int h, int w)
{
    std::vector<T> y(x.size());
    for (int a = 0; a < n; a++)
        for (int ci = 0; ci < c; ci++)
            for (int i = 0; i < h * w; i++)
                y[((size_t)a * h * w + i) * c + ci] = x[((size_t)a * c + ci) * h * w + i];
    return y;
}
template <typename T> static std::vector<T> to_nchw(const std::vector<T> &y, int n, int c, int h, int w)
{
    std::vector<T> x(y.size());
    for (int a = 0; a < n; a++)
        for (int ci = 0; ci < c; ci++)
            for (int i = 0; i < h * w; i++)
                x[((size_t)a * c + ci) * h * w + i] = y[((size_t)a * h * w + i) * c + ci];
    return x;
}

#ifdef SF_GPU_MODEL_H
/* The resnet18 preset at hw x hw input (the GPU tests train it at 64x64 to
 * stay quick). 0, or -1 with a FAIL line printed. */
static __attribute__((unused)) int resnet18_at(int hw, sf_model *m)
{
    char err[300];
    if (sf_model_from_preset("resnet18", m, err, sizeof err)) {
        printf("FAIL resnet18: %s\n", err);
        return -1;
    }
    m->in_h = m->in_w = hw;
    if (sf_model_resolve(m, err, sizeof err)) {
        printf("FAIL resnet18 at %dx%d: %s\n", hw, hw, err);
        return -1;
    }
    return 0;
}
#endif

#ifdef SF_GPU_BACKEND_H
/* The CUDA backend on device 0 and the reference backend, the pair every
 * backend test compares. 0, or -1 with a FAIL line printed. */
static __attribute__((unused)) int cuda_and_ref_backends(sf_backend **cu, sf_backend **ref)
{
    char err[300];
    *cu = sf_backend_cuda_new(0, err, sizeof err);
    *ref = sf_backend_ref_new(err, sizeof err);
    if (!*cu || !*ref) {
        printf("FAIL backends: %s\n", err);
        return -1;
    }
    return 0;
}

/* The backend's build options a test varies between cases: the activation
 * layout and the cuDNN tuning budget (what pipeline.layout and
 * pipeline.cudnn_tune_configs set in the server). test_build applies them to
 * every build, so a case sets them before it builds and puts them back after. */
static sf_act_layout g_layout = SF_ACT_LAYOUT_AUTO;
static int g_tune_configs = 0;
static int test_build(sf_backend *be, const sf_model *m, const sf_train_cfg *cfg, char *err, size_t errlen)
{
    sf_train_cfg c = *cfg;
    c.layout = g_layout;
    c.tune_configs = g_tune_configs;
    return be->i->build(be, m, &c, err, errlen);
}
#endif

#endif
