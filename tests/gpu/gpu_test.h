/* tests/gpu/gpu_test.h — what every GPU test program shares beside
 * gpu/cuda/program.h (CU, device buffers, the test stream, the SKIPPED line
 * without a device, a host clock, which the benchmarks share too): the
 * ok/FAIL counters and lines (shared by every file linked into one program),
 * a test's main() (run_op_test: the SKIPPED line, the cases, the last device
 * check, the summary line and the exit status; finish for the programs that
 * write their own), NCHW <-> NHWC on the host, the pair of backends a backend
 * test compares, and the relative-error check against a double-precision
 * reference (DESIGN.md §8: NaN or Inf anywhere fails, the worst elements are
 * printed), and the -l / -s options of the programs whose main() runs named
 * sections (test_sections). Header-only. */
#ifndef SF_TESTS_GPU_TEST_H
#define SF_TESTS_GPU_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <initializer_list>
#include <string>
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

/* ---- sections: -l and -s ------------------------------------------------------ */

/* The programs whose main() runs numbered sections (test_backend,
 * test_backend_models, test_train_loop, test_jpeg_decode) name them, so that
 * one can run alone, as test_ops runs one op family (-o): compute-sanitizer
 * takes longer over a whole program than one GPU call may run, and
 * tests/gpu/sanitize_tests.sh runs one process per section instead.
 *
 *   -l                       print the section names, one a line (those -s
 *                            selects, when given), and run nothing: no device
 *                            is needed, and no SKIPPED line is printed
 *   -s NAME[,NAME...]        run only these sections, in the program's order;
 *                            repeatable. A name the program has not is an
 *                            error: it and the list go to stderr, exit 2
 *   (none)                   every section, as before sections had names
 *
 * A section that needs what an earlier one made (a model, batches) makes it
 * when it runs first; the summary line and the exit status (1 on any FAIL)
 * stay each program's own. Usage in main():
 *
 *   test_sections sec("test_x", {"first", "second"});
 *   const int rc = sec.args(argc, argv);
 *   if (rc >= 0)
 *       return rc;
 *   ...
 *   if (sec.run("first")) { ... }
 */
struct test_sections {
    const char *program;
    std::vector<const char *> names;
    std::vector<char> on; /* per name: selected */

    test_sections(const char *prog, std::initializer_list<const char *> list)
        : program(prog), names(list), on(names.size(), 1)
    {
    }

    int index(const char *name) const
    {
        for (size_t i = 0; i < names.size(); i++)
            if (!strcmp(names[i], name))
                return (int)i;
        return -1;
    }

    void print_names(FILE *f, int selected_only) const
    {
        for (size_t i = 0; i < names.size(); i++)
            if (!selected_only || on[i])
                fprintf(f, "%s\n", names[i]);
    }

    int usage(const char *why, const char *own_usage) const
    {
        fprintf(stderr, "%s: %s\nusage: %s [-l] [-s SECTION[,SECTION...]]...%s%s\n", program, why, program,
                own_usage && *own_usage ? " " : "", own_usage ? own_usage : "");
        return 2;
    }

    /* Reads argv: -1 when the selected sections are to run, else the exit
     * status main() returns at once (0 after -l, 2 on a bad option or an
     * unknown section). own: options the program reads itself (flags
     * without a value, e.g. "--full"), passed over here; own_usage: how the
     * usage line shows them. */
    int args(int argc, char **argv, std::initializer_list<const char *> own = {}, const char *own_usage = NULL)
    {
        int list = 0, chosen = 0;
        for (int i = 1; i < argc; i++) {
            const char *a = argv[i];
            int mine = 0;
            for (const char *o : own)
                mine |= !strcmp(a, o);
            if (mine)
                continue;
            if (!strcmp(a, "-l")) {
                list = 1;
                continue;
            }
            if (strcmp(a, "-s") != 0)
                return usage((std::string(a[0] == '-' ? "unknown option " : "unexpected argument ") + a).c_str(),
                             own_usage);
            if (i + 1 >= argc)
                return usage("-s without a section name (-l lists them)", own_usage);
            if (!chosen)
                on.assign(names.size(), 0);
            chosen = 1;
            const std::string v = argv[++i];
            for (size_t at = 0; at <= v.size();) {
                size_t comma = v.find(',', at);
                if (comma == std::string::npos)
                    comma = v.size();
                const std::string name = v.substr(at, comma - at);
                const int k = index(name.c_str());
                if (k < 0) {
                    fprintf(stderr, "%s: no section \"%s\"; its sections:\n", program, name.c_str());
                    print_names(stderr, 0);
                    return 2;
                }
                on[k] = 1;
                at = comma + 1;
            }
        }
        if (list) {
            print_names(stdout, 1);
            return 0;
        }
        return -1;
    }

    /* Whether section `name` runs. A name missing from the program's list is
     * a mistake in the program, which stops it. */
    bool run(const char *name) const
    {
        const int k = index(name);
        if (k < 0) {
            fprintf(stderr, "%s: section \"%s\" is not in the program's list\n", program, name);
            abort();
        }
        return on[k] != 0;
    }
};

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
