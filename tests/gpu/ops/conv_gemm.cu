/* tests/gpu/ops/conv_gemm.cu — pointwise convolutions as cuBLAS GEMMs
 * (gpu/cuda/conv_gemm.h), built by sf_conv_gemm_build without asking cuDNN
 * first and run through the ordinary plan, variant pack and sf_conv_run, against the double-precision reference (sf_ref_conv2d_*):
 * forward, the fused forward (bias and ReLU), backward-data and backward-filter
 * in fp32 and tf32 (relative error, check_v) and bf16 (check_max), each
 * within its row's tol,
 * NCHW and NHWC, on EfficientNet-B0's 24 -> 144 at 56x56 and RegNet-Y-400MF's
 * 104 -> 104 at 28x28 with n = 1..4 and an odd 3 -> 5 at 7x5; the NCHW filter
 * gradient in both of its forms (per-sample products summed in the workspace,
 * and one GEMM per sample when the workspace limit is small, down to none);
 * the filter gradient bit for bit again, and all three directions replayed from
 * a captured CUDA graph bit for bit; the default choice (cuDNN first, the GEMM
 * path only without an engine) building a working plan for the two shapes that
 * cuDNN 9.14 on an H200 has no fp32 engine for; a run on another stream than
 * the one the lent cuBLAS handle is bound to, which must bind it back; and the
 * refusal of a forced non-pointwise convolution. The plans run on a cuBLAS
 * handle the test makes and lends, as the executor lends its own.
 *
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/conv_gemm.h"
#include "gpu/cuda/linear.h"

/* The cuBLAS handle lent to every GEMM plan here, as the executor lends its
 * own: made by run_cases, bound to the test stream and a workspace of its own. */
static sf_cublas_ctx g_blas;

struct pw_case {
    int n, c, h, w, oc;
};

/* Precision of one run: fp32 data (strict or tf32) or bf16, and its outputs'
 * bound: relative error (check_v) in fp32 and tf32, max error of max|ref|
 * (check_max) in bf16. */
struct prec {
    sf_dtype dt;
    int tf32;
    double tol;
};

static const char *pname(prec p) { return p.dt == SF_DT_BF16 ? "bf16" : p.tf32 ? "tf32" : "fp32"; }

static void check_out(const char *nm, prec p, const std::vector<float> &got, const std::vector<double> &ref)
{
    check_gemm(nm, p.dt, got, ref, p.tol);
}

/* The inputs of one shape and the reference results on them (NCHW, KCRS). */
struct pw_data {
    std::vector<float> x, wt, b, dy;
    std::vector<double> y, ybr, dx, dw; /* y = conv, ybr = relu(conv + b) */
};

static pw_data make_data(const pw_case &cc, sf_dtype dt)
{
    const size_t hw = (size_t)cc.h * cc.w, nx = (size_t)cc.n * cc.c * hw, nw = (size_t)cc.oc * cc.c,
                 ny = (size_t)cc.n * cc.oc * hw;
    pw_data D;
    D.x.resize(nx);
    D.wt.resize(nw);
    D.b.resize(cc.oc);
    D.dy.resize(ny);
    rand_fill(D.x, 1.f);
    rand_fill(D.wt, 0.5f);
    rand_fill(D.b, 0.5f);
    rand_fill(D.dy, 1.f);
    round_dt(D.x, dt);
    round_dt(D.wt, dt);
    round_dt(D.dy, dt); /* b stays fp32: the epilogue's bias is fp32 for either dt */
    std::vector<double> xd = to_d(D.x), wd = to_d(D.wt), dyd = to_d(D.dy);
    D.y.resize(ny);
    D.ybr.resize(ny);
    D.dx.resize(nx);
    D.dw.resize(nw);
    sf_ref_conv2d_fwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), NULL, cc.oc, 1, 1, 0, D.y.data());
    sf_ref_conv2d_bwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), cc.oc, 1, 1, 0, dyd.data(), D.dx.data(),
                          D.dw.data(), NULL);
    for (int a = 0; a < cc.n; a++)
        for (int o = 0; o < cc.oc; o++)
            for (size_t i = 0; i < hw; i++) {
                const size_t e = ((size_t)a * cc.oc + o) * hw + i;
                const double v = D.y[e] + D.b[o];
                D.ybr[e] = v < 0 ? 0 : v;
            }
    return D;
}

static sf_conv_desc make_desc(const pw_case &cc, sf_layout lay, prec p)
{
    sf_conv_desc d;
    memset(&d, 0, sizeof d);
    d.n = cc.n; d.c = cc.c; d.h = cc.h; d.w = cc.w; d.oc = cc.oc; d.k = 1; d.stride = 1; d.pad = 0;
    d.layout = lay;
    d.dt = p.dt;
    d.tf32 = p.tf32;
    d.align_x = d.align_w = d.align_y = 16;
    d.blas = &g_blas;
    return d;
}

/* The device tensors of one shape in one layout and element type. */
struct pw_bufs {
    dbuf x, w, y, dy, dx, dw;
    float *b;
    void *ws;
    size_t ws_bytes;
};

static pw_bufs make_bufs(const pw_case &cc, sf_layout lay, sf_dtype dt, const pw_data &D)
{
    const size_t hw = (size_t)cc.h * cc.w, nx = (size_t)cc.n * cc.c * hw, nw = (size_t)cc.oc * cc.c,
                 ny = (size_t)cc.n * cc.oc * hw;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    pw_bufs B;
    B.x = dbuf_make(dt, nx, 0);
    B.w = dbuf_make(dt, nw, 0);
    B.y = dbuf_make(dt, ny, 0);
    B.dy = dbuf_make(dt, ny, 0);
    B.dx = dbuf_make(dt, nx, 0);
    B.dw = dbuf_make(dt, nw, 0);
    B.b = dalloc<float>(cc.oc);
    B.ws_bytes = (size_t)64 << 20;
    B.ws = dalloc<char>(B.ws_bytes);
    up_dt(B.x, nhwc ? to_nhwc(D.x, cc.n, cc.c, cc.h, cc.w) : D.x);
    up_dt(B.w, D.wt); /* [oc, c, 1, 1]: KCRS and KRSC are the same */
    up_dt(B.dy, nhwc ? to_nhwc(D.dy, cc.n, cc.oc, cc.h, cc.w) : D.dy);
    up(B.b, D.b);
    return B;
}

static void free_bufs(pw_bufs &B)
{
    dbuf_free(B.x); dbuf_free(B.w); dbuf_free(B.y); dbuf_free(B.dy); dbuf_free(B.dx); dbuf_free(B.dw);
    cudaFree(B.b);
    cudaFree(B.ws);
}

/* Output of direction dir, downloaded and put back into NCHW. */
static std::vector<float> result(const pw_case &cc, sf_layout lay, const pw_bufs &B, int dir)
{
    const size_t hw = (size_t)cc.h * cc.w;
    const int nhwc = lay == SF_LAYOUT_NHWC;
    if (dir == SF_CONV_FWD) {
        std::vector<float> g = down_dt(B.y, (size_t)cc.n * cc.oc * hw);
        return nhwc ? to_nchw(g, cc.n, cc.oc, cc.h, cc.w) : g;
    }
    if (dir == SF_CONV_BWD_DATA) {
        std::vector<float> g = down_dt(B.dx, (size_t)cc.n * cc.c * hw);
        return nhwc ? to_nchw(g, cc.n, cc.c, cc.h, cc.w) : g;
    }
    return down_dt(B.dw, (size_t)cc.oc * cc.c);
}

static sf_conv_ptrs ptrs_of(const pw_bufs &B, int dir)
{
    sf_conv_ptrs p;
    memset(&p, 0, sizeof p);
    p.ws = B.ws;
    p.x = dir == SF_CONV_BWD_DATA ? B.dx.p : B.x.p;
    p.w = dir == SF_CONV_BWD_FILTER ? B.dw.p : B.w.p;
    p.y = dir == SF_CONV_FWD ? B.y.p : B.dy.p;
    return p;
}

static const char *dir_name[3] = {"fwd", "bwd_data", "bwd_filter"};

/* Builds (d, dir) with ws_limit, as the GEMM plan (want_gemm) or as the
 * executor does (sf_conv_plan_build, cuDNN first; tune: timing up to 4
 * candidates on B, else taking the first), runs it once on B and checks it
 * against D; returns 0 when it ran. *plan_out keeps the plan and *vp_out the
 * pack when non-NULL (the caller destroys them), else they are destroyed
 * here. */
static int run_checked(cudnnHandle_t dnn, cudaStream_t s, const pw_case &cc, sf_layout lay, prec p,
                       const sf_conv_desc &d, int dir, size_t ws_limit, const pw_bufs &B, const pw_data &D,
                       const char *name, int want_gemm, int tune, sf_conv_plan *plan_out, sf_conv_vpack **vp_out)
{
    char nm[300];
    sf_conv_ptrs ptr = ptrs_of(B, dir);
    if (d.fuse_bias)
        ptr.b = B.b;
    sf_conv_plan plan;
    sf_conv_vpack *vp = NULL;
    const int fused = dir == SF_CONV_FWD && (d.fuse_bias || d.fuse_relu);
    snprintf(nm, sizeof nm, "%s %s%s", name, dir_name[dir], fused ? "+bias+relu" : "");
    const sf_conv_ptrs *tp = tune ? &ptr : NULL;
    const int brc = want_gemm ? sf_conv_gemm_build(dnn, &d, (sf_conv_dir)dir, ws_limit, tp, &plan)
                              : sf_conv_plan_build(dnn, &d, (sf_conv_dir)dir, ws_limit, tune ? 4 : 1, tp, &plan);
    if (brc || sf_conv_vpack_make(&ptr, &vp)) {
        fail(nm, sf_cuda_last_error());
        sf_cuda_clear_error();
        return -1;
    }
    if ((want_gemm && (!plan.gemm || plan.plan)) || (plan.gemm && ((size_t)plan.ws_bytes > ws_limit ||
                                                                  plan.fused != fused || (tune && plan.ms < 0.f)))) {
        fail(nm, "not a GEMM plan where one was asked for, or a GEMM plan with the fused flag wrong, over the "
                 "workspace limit or untimed though tuned");
        sf_conv_vpack_destroy(vp);
        sf_conv_plan_destroy(&plan);
        return -1;
    }
    const dbuf &out = dir == SF_CONV_FWD ? B.y : dir == SF_CONV_BWD_DATA ? B.dx : B.dw;
    poison_dt(out);
    const int rc = sf_conv_run(dnn, &plan, vp);
    CU(cudaStreamSynchronize(s));
    char n2[340];
    snprintf(n2, sizeof n2, "%s (%s, ws %lld B)", nm, plan.gemm ? "gemm" : "cuDNN", (long long)plan.ws_bytes);
    if (rc) {
        fail(n2, sf_cuda_last_error());
        sf_cuda_clear_error();
    } else {
        const std::vector<double> &ref = dir == SF_CONV_FWD ? (fused ? D.ybr : D.y) : dir == SF_CONV_BWD_DATA ? D.dx : D.dw;
        check_out(n2, p, result(cc, lay, B, dir), ref);
    }
    if (plan_out && !rc) {
        *plan_out = plan;
        *vp_out = vp;
    } else {
        sf_conv_vpack_destroy(vp);
        sf_conv_plan_destroy(&plan);
    }
    return rc;
}

/* Every direction of one shape forced onto the GEMM path, in one layout and
 * precision: the three directions and the fused forward against the
 * reference; for NCHW with n > 1 the filter gradient again with a workspace
 * limit too small for the per-sample products (one GEMM per sample: bf16
 * keeps one fp32 product, fp32 needs none, so a zero limit); the filter
 * gradient again bit for bit; and the three directions captured into a CUDA
 * graph whose replay gives the same bits. */
static void test_gemm(cudnnHandle_t dnn, cudaStream_t s, const pw_case &cc, sf_layout lay, prec p, const pw_data &D)
{
    char name[200], nm[300];
    snprintf(name, sizeof name, "conv gemm n%d c%d %dx%d oc%d %s %s", cc.n, cc.c, cc.h, cc.w, cc.oc, lname(lay),
             pname(p));
    pw_bufs B = make_bufs(cc, lay, p.dt, D);
    sf_conv_desc d = make_desc(cc, lay, p);
    sf_conv_plan plan[3];
    sf_conv_vpack *vp[3] = {NULL, NULL, NULL};
    memset(plan, 0, sizeof plan);
    int built = 0;
    for (int dir = 0; dir < 3; dir++)
        if (run_checked(dnn, s, cc, lay, p, d, dir, B.ws_bytes, B, D, name, 1, 0, &plan[dir], &vp[dir]) == 0)
            built |= 1 << dir;

    sf_conv_desc df = d;
    df.fuse_bias = 1;
    df.fuse_relu = 1;
    df.align_b = 16;
    run_checked(dnn, s, cc, lay, p, df, SF_CONV_FWD, B.ws_bytes, B, D, name, 1, 0, NULL, NULL);

    /* below n products (in 256-byte units, as the plan counts them): bf16
     * needs one fp32 product, fp32 nothing */
    const size_t one = (sizeof(float) * (size_t)cc.c * cc.oc + 255) & ~(size_t)255,
                 all = (sizeof(float) * (size_t)cc.n * cc.c * cc.oc + 255) & ~(size_t)255;
    const size_t lim = p.dt == SF_DT_BF16 ? one : 0;
    if (lay == SF_LAYOUT_NCHW && cc.n > 1 && all > lim) {
        snprintf(nm, sizeof nm, "%s per-sample, ws limit %zu", name, lim);
        run_checked(dnn, s, cc, lay, p, d, SF_CONV_BWD_FILTER, lim, B, D, nm, 1, 0, NULL, NULL);
    }

    if (built & 4) {
        const size_t nw = (size_t)cc.oc * cc.c, wb = nw * sf_dtype_size(p.dt);
        std::vector<char> w0(wb), w1(wb);
        /* run again first: the per-sample form above left its own sums in dw */
        int rc = sf_conv_run(dnn, &plan[2], vp[2]);
        CU(cudaStreamSynchronize(s));
        CU(cudaMemcpy(w0.data(), B.dw.p, wb, cudaMemcpyDeviceToHost));
        poison_dt(B.dw);
        rc = rc ? rc : sf_conv_run(dnn, &plan[2], vp[2]);
        CU(cudaStreamSynchronize(s));
        CU(cudaMemcpy(w1.data(), B.dw.p, wb, cudaMemcpyDeviceToHost));
        snprintf(nm, sizeof nm, "%s bwd_filter repeats bit for bit", name);
        pass_or_fail(nm, rc == 0 && w0 == w1, rc ? sf_cuda_last_error() : "dw differs between two runs");
    }

    if (built == 7) {
        /* the eager results, then the same three runs from a graph; the eager
         * runs are made again here because the fused forward above left its
         * bias and ReLU in y */
        std::vector<char> ref[3], got[3];
        const dbuf *outs[3] = {&B.y, &B.dx, &B.dw};
        int erc = 0;
        for (int dir = 0; dir < 3 && !erc; dir++)
            erc = sf_conv_run(dnn, &plan[dir], vp[dir]);
        CU(cudaStreamSynchronize(s));
        if (erc)
            fail(name, sf_cuda_last_error());
        for (int dir = 0; dir < 3; dir++) {
            ref[dir].resize(outs[dir]->n * sf_dtype_size(p.dt));
            CU(cudaMemcpy(ref[dir].data(), outs[dir]->p, ref[dir].size(), cudaMemcpyDeviceToHost));
        }
        snprintf(nm, sizeof nm, "%s captured in a CUDA graph, replayed bit for bit", name);
        cudaGraph_t gr;
        cudaGraphExec_t ge;
        CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        int rc = 0;
        for (int dir = 0; dir < 3 && !rc; dir++)
            rc = sf_conv_run(dnn, &plan[dir], vp[dir]);
        const cudaError_t ce = cudaStreamEndCapture(s, &gr);
        if (rc || ce != cudaSuccess || cudaGraphInstantiate(&ge, gr, 0) != cudaSuccess) {
            fail(nm, rc ? sf_cuda_last_error() : "capture failed");
            sf_cuda_clear_error();
            cudaGetLastError();
        } else {
            for (int dir = 0; dir < 3; dir++)
                poison_dt(*outs[dir]);
            CU(cudaGraphLaunch(ge, s));
            CU(cudaStreamSynchronize(s));
            int same = 1;
            for (int dir = 0; dir < 3; dir++) {
                got[dir].resize(ref[dir].size());
                CU(cudaMemcpy(got[dir].data(), outs[dir]->p, got[dir].size(), cudaMemcpyDeviceToHost));
                same = same && got[dir] == ref[dir];
            }
            pass_or_fail(nm, same, "replay differs from the eager runs");
            cudaGraphExecDestroy(ge);
        }
        if (ce == cudaSuccess)
            cudaGraphDestroy(gr);
    }
    for (int dir = 0; dir < 3; dir++) {
        sf_conv_vpack_destroy(vp[dir]);
        sf_conv_plan_destroy(&plan[dir]);
    }
    free_bufs(B);
}

/* The default choice (sf_conv_plan_build), timed as the executor builds it: cuDNN
 * first, the GEMM path only where no engine is usable, at EfficientNet-B0's
 * 24 -> 144 forward and RegNet-Y-400MF's 104 -> 104 filter gradient in
 * strict fp32 NCHW (cuDNN 9.14 on an H200 has engines for both once their
 * pointers are 16-byte aligned); either way a plan must build and be right. */
static void test_fallback(cudnnHandle_t dnn, cudaStream_t s, const pw_case &cc, int dir, double tol)
{
    const prec p = {SF_DT_F32, 0, tol};
    const pw_data D = make_data(cc, p.dt);
    pw_bufs B = make_bufs(cc, SF_LAYOUT_NCHW, p.dt, D);
    char name[200];
    snprintf(name, sizeof name, "conv default plan n%d c%d %dx%d oc%d nchw fp32", cc.n, cc.c, cc.h, cc.w, cc.oc);
    const sf_conv_desc d = make_desc(cc, SF_LAYOUT_NCHW, p);
    sf_conv_plan plan;
    memset(&plan, 0, sizeof plan);
    sf_conv_vpack *vp = NULL;
    if (run_checked(dnn, s, cc, SF_LAYOUT_NCHW, p, d, dir, B.ws_bytes, B, D, name, 0, 1, &plan, &vp) == 0) {
        printf("info %s %s: %s\n", name, dir_name[dir],
               plan.gemm ? "cuDNN has no usable engine: GEMM path" : "a cuDNN engine");
        sf_conv_vpack_destroy(vp);
        sf_conv_plan_destroy(&plan);
    }
    free_bufs(B);
}

/* A run on the lent handle follows the cuDNN handle's stream (here another
 * stream than the one the handle is lent on), gives the reference's result
 * there, and leaves the handle on its own stream with the math mode it had. */
static void test_lend_binds_back(cudnnHandle_t dnn, cudaStream_t s, double tol)
{
    const char *nm = "conv gemm run on another stream binds the lent cuBLAS handle back";
    const pw_case cc = {2, 24, 7, 5, 16};
    const prec p = {SF_DT_F32, 0, tol};
    const pw_data D = make_data(cc, p.dt);
    pw_bufs B = make_bufs(cc, SF_LAYOUT_NCHW, p.dt, D);
    const sf_conv_desc d = make_desc(cc, SF_LAYOUT_NCHW, p);
    sf_conv_ptrs ptr = ptrs_of(B, SF_CONV_BWD_FILTER);
    sf_conv_plan plan;
    sf_conv_vpack *vp = NULL;
    cudaStream_t other;
    CU(cudaStreamCreate(&other)); /* blocking, as test_stream: it waits for the NaN fill */
    CU(cudaStreamSynchronize(s)); /* the uploads */
    if (sf_conv_gemm_build(dnn, &d, SF_CONV_BWD_FILTER, B.ws_bytes, NULL, &plan) ||
        sf_conv_vpack_make(&ptr, &vp)) {
        fail(nm, sf_cuda_last_error());
        sf_cuda_clear_error();
    } else {
        poison_dt(B.dw);
        cublasMath_t before = CUBLAS_PEDANTIC_MATH, mode = CUBLAS_DEFAULT_MATH;
        const int got_before = cublasGetMathMode(g_blas.h, &before) == CUBLAS_STATUS_SUCCESS;
        cudnnSetStream(dnn, other);
        const int rc = sf_conv_run(dnn, &plan, vp);
        cudnnSetStream(dnn, s);
        CU(cudaStreamSynchronize(other));
        cudaStream_t now = NULL;
        const int back = got_before && cublasGetStream(g_blas.h, &now) == CUBLAS_STATUS_SUCCESS && now == s &&
                         cublasGetMathMode(g_blas.h, &mode) == CUBLAS_STATUS_SUCCESS && mode == before;
        pass_or_fail(nm, rc == 0 && back, rc ? sf_cuda_last_error() : "the handle's stream or math mode changed");
        if (rc == 0)
            check_out("conv gemm bwd_filter run on another stream", p,
                      result(cc, SF_LAYOUT_NCHW, B, SF_CONV_BWD_FILTER), D.dw);
        sf_cuda_clear_error();
        sf_conv_vpack_destroy(vp);
        sf_conv_plan_destroy(&plan);
    }
    CU(cudaStreamDestroy(other));
    free_bufs(B);
}

/* Building the GEMM plan of a convolution that is not pointwise is an error
 * with a message, not a plan. */
static void test_refuses(cudnnHandle_t dnn)
{
    static const struct {
        int k, stride, pad, groups;
        const char *what;
    } bad[] = {{3, 1, 1, 1, "3x3"}, {1, 2, 0, 1, "stride 2"}, {1, 1, 1, 1, "padding 1"}, {1, 1, 0, 2, "2 groups"}};
    for (const auto &b : bad) {
        const pw_case cc = {2, 8, 8, 8, 8};
        sf_conv_desc d = make_desc(cc, SF_LAYOUT_NCHW, prec{SF_DT_F32, 0, 0});
        d.k = b.k;
        d.stride = b.stride;
        d.pad = b.pad;
        d.groups = b.groups;
        sf_conv_plan p;
        sf_cuda_clear_error();
        const int rc = sf_conv_gemm_build(dnn, &d, SF_CONV_FWD, 1 << 20, NULL, &p);
        char nm[200];
        snprintf(nm, sizeof nm, "conv gemm forced refuses a %s convolution", b.what);
        pass_or_fail(nm, rc == -1 && sf_cuda_last_error()[0] && !sf_conv_plan_built(&p),
                     rc ? "no message" : "built a plan");
        if (!rc)
            sf_conv_plan_destroy(&p);
        sf_cuda_clear_error();
    }
    pass_or_fail("conv gemm takes only pointwise fp32/bf16 convolutions",
                 [] {
                     const pw_case cc = {2, 8, 8, 8, 8};
                     sf_conv_desc d = make_desc(cc, SF_LAYOUT_NHWC, prec{SF_DT_BF16, 0, 0});
                     const int yes = sf_conv_gemm_ok(&d);
                     d.dilation = 2;
                     const int dil = sf_conv_gemm_ok(&d);
                     d.dilation = 1;
                     d.dt = (sf_dtype)7;
                     return yes && !dil && !sf_conv_gemm_ok(&d);
                 }(),
                 "eligibility");
}

/* The driver's cuBLAS handle and workspace, lent to the plans as the
 * executor lends its own. */
static void lend(const op_env &e) { g_blas = sf_cublas_ctx{e.blas, e.ws, e.ws_bytes}; }

/* shape {n, c, h, w}; p {out channels, tf32}; tol: the outputs' bound (prec):
 * every direction against the reference on one draw of the inputs */
void cmp_conv_gemm(const op_case &c, const op_env &e)
{
    lend(e);
    const pw_case cc = {c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0]};
    const prec p = {c.dt, c.p[1], c.tol};
    test_gemm(e.dnn, e.s, cc, c.lay, p, make_data(cc, p.dt));
}
/* shape {n, c, h, w}; p {out channels, direction (sf_conv_dir)}; tol: the
 * output's bound (fp32) */
void cmp_conv_gemm_fallback(const op_case &c, const op_env &e)
{
    lend(e);
    test_fallback(e.dnn, e.s, pw_case{c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0]}, c.p[1], c.tol);
}
/* tol: the filter gradient's bound (fp32) */
void cmp_conv_gemm_lend_binds_back(const op_case &c, const op_env &e)
{
    lend(e);
    test_lend_binds_back(e.dnn, e.s, c.tol);
}
void cmp_conv_gemm_refuses(const op_case &, const op_env &e)
{
    lend(e);
    test_refuses(e.dnn);
}
