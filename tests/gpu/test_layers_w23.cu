/* tests/gpu/test_layers_w23.cu — the W2/W3 CUDA layers of gpu/cuda/layers_w23.h
 * against the reference of gpu/ref (DESIGN.md §8).
 *
 * Fresh random inputs for every case (never zeros), outputs poisoned with NaN
 * before each run, relative error ||out - ref|| / ||ref|| with NaN failing:
 * fp32 < 1e-5 pointwise, < 1e-4 reductions and convolutions; tf32 < 1e-3.
 * The reference runs in double where ref.h declares a double version, else in
 * float. Every layer runs in both activation layouts, at odd sizes and at the
 * shapes of W2's decoder and ResNet-18. Then: a CUDA-graph capture of the BN and
 * maxpool steps replays bit-equal to the eager run (capturable, deterministic),
 * and a throughput line for BN forward+backward and maxpool at ResNet-18's
 * batch-256 shapes, against a device-to-device copy timed in the same run.
 *
 * Prints "ok <case>" or "FAIL <case>: ..." per case; exits 1 on any failure,
 * 0 with "SKIPPED: no CUDA device" when there is no GPU.
 */
extern "C" {
#include "../../gpu/ref/ref.h"
#include "../../gpu/rng.h"
}

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "gpu_test.h"

#include "../../gpu/cuda/layers_w23.h"

static uint64_t g_seed = 0x9e3779b9;

/* ---- helpers -------------------------------------------------------------- */

static void rand_fill(std::vector<float> &v, float scale, float offset = 0.f)
{
    uint64_t s = g_seed++;
    for (size_t i = 0; i < v.size(); i++) {
        float u = sf_u01(sf_hash4(s, i, 91, 0)) * 2.f - 1.f;
        if (u == 0.f)
            u = 0.5f; /* never zero */
        v[i] = offset + u * scale;
    }
}


static void check_v(const char *name, const std::vector<float> &got, const std::vector<double> &ref, double tol)
{
    if (got.size() != ref.size()) {
        g_fail++;
        printf("FAIL %s: size %zu vs %zu\n", name, got.size(), ref.size());
        return;
    }
    check(name, got.data(), ref.data(), ref.size(), tol);
}

static void fail(const char *name, const char *why)
{
    g_fail++;
    printf("FAIL %s: %s\n", name, why);
}

static void pass_or_fail(const char *name, int ok, const char *why)
{
    if (ok) {
        g_ok++;
        printf("ok %s\n", name);
    } else {
        fail(name, why);
    }
}

#define DEV_OK(call, name)                                                                          \
    do {                                                                                             \
        if ((call) != 0) {                                                                           \
            fail(name, sf_cuda_last_error());                                                        \
            return;                                                                                  \
        }                                                                                            \
    } while (0)
#define CU(call)                                                                                     \
    do {                                                                                             \
        cudaError_t e_ = (call);                                                                     \
        if (e_ != cudaSuccess) {                                                                     \
            printf("FAIL cuda: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

template <typename T> static T *dalloc(size_t n)
{
    T *p = NULL;
    CU(cudaMalloc((void **)&p, (n ? n : 1) * sizeof(T)));
    return p;
}

template <typename T> static void up(T *d, const std::vector<T> &h)
{
    CU(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T> static std::vector<T> down(const T *d, size_t n)
{
    std::vector<T> h(n);
    CU(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
static void poison(void *d, size_t bytes) { CU(cudaMemset(d, 0xff, bytes)); } /* floats: NaN; ints: -1 */

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

static const char *lname(sf_layout l) { return l == SF_LAYOUT_NHWC ? "nhwc" : "nchw"; }

/* ---- ConvTranspose2d -------------------------------------------------------- */

struct convt_case {
    int n, c, h, w, oc, k, stride, pad;
};

static void test_convt(cudnnHandle_t dnn, cudaStream_t s, const convt_case &cc)
{
    const int oh = (cc.h - 1) * cc.stride - 2 * cc.pad + cc.k, ow = (cc.w - 1) * cc.stride - 2 * cc.pad + cc.k;
    const size_t nx = (size_t)cc.n * cc.c * cc.h * cc.w, nw = (size_t)cc.c * cc.oc * cc.k * cc.k,
                 ny = (size_t)cc.n * cc.oc * oh * ow;
    std::vector<float> x(nx), wt(nw), b(cc.oc), dy(ny);
    rand_fill(x, 1.f);
    rand_fill(wt, 0.5f);
    rand_fill(b, 0.5f);
    rand_fill(dy, 1.f);
    std::vector<double> xd = to_d(x), wd = to_d(wt), bd = to_d(b), dyd = to_d(dy);
    std::vector<double> yr(ny), dxr(nx), dwr(nw), dbr(cc.oc);
    sf_ref_convt2d_fwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), bd.data(), cc.oc, cc.k, cc.stride, cc.pad,
                           yr.data());
    sf_ref_convt2d_bwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), cc.oc, cc.k, cc.stride, cc.pad, dyd.data(),
                           dxr.data(), dwr.data(), dbr.data());

    float *d_x = dalloc<float>(nx), *d_w = dalloc<float>(nw), *d_b = dalloc<float>(cc.oc),
          *d_y = dalloc<float>(ny), *d_dy = dalloc<float>(ny), *d_dx = dalloc<float>(nx),
          *d_dw = dalloc<float>(nw), *d_db = dalloc<float>(cc.oc);
    float *scratch = dalloc<float>(sf_cuda_bias_grad_scratch(cc.oc));
    const size_t ws_bytes = (size_t)256 << 20;
    void *ws = dalloc<char>(ws_bytes);
    for (int lay = 0; lay < 2; lay++)
        for (int tf32 = 0; tf32 < 2; tf32++) {
            const sf_layout L = (sf_layout)lay;
            const int nhwc = L == SF_LAYOUT_NHWC;
            char nm[200];
            snprintf(nm, sizeof nm, "convT n%d c%d %dx%d -> oc%d k%d s%d p%d %s %s", cc.n, cc.c, cc.h, cc.w, cc.oc,
                     cc.k, cc.stride, cc.pad, lname(L), tf32 ? "tf32" : "fp32");
            const double tol = tf32 ? 1e-3 : 1e-4;
            up(d_x, nhwc ? to_nhwc(x, cc.n, cc.c, cc.h, cc.w) : x);
            up(d_w, nhwc ? to_nhwc(wt, cc.c, cc.oc, cc.k, cc.k) : wt); /* [c][k][k][oc] */
            up(d_b, b);
            up(d_dy, nhwc ? to_nhwc(dy, cc.n, cc.oc, oh, ow) : dy);
            poison(d_y, ny * 4);
            poison(d_dx, nx * 4);
            poison(d_dw, nw * 4);
            poison(d_db, cc.oc * 4);
            sf_convt_desc d = {cc.n, cc.c, cc.h, cc.w, cc.oc, cc.k, cc.stride, cc.pad, L, tf32, SF_DT_F32, 16, 16, 16};
            sf_convt_plans pl;
            memset(&pl, 0, sizeof pl);
            if (sf_convt_plans_build(dnn, &d, SF_CONVT_DIR_ALL, ws_bytes, 1, NULL, &pl)) {
                fail(nm, sf_cuda_last_error());
                continue;
            }
            sf_convt_ptrs pf = {d_x, d_w, d_y, ws}, pd = {d_dx, d_w, d_dy, ws}, pw = {d_x, d_dw, d_dy, ws};
            int rc = sf_convt_run(dnn, &pl, SF_CONV_FWD, &pf) || sf_convt_bias_act(&d, d_y, d_b, 0, s) ||
                     sf_convt_run(dnn, &pl, SF_CONV_BWD_DATA, &pd) || sf_convt_run(dnn, &pl, SF_CONV_BWD_FILTER, &pw) ||
                     sf_convt_bias_grad(&d, d_dy, NULL, d_db, scratch, s);
            CU(cudaStreamSynchronize(s));
            if (rc) {
                fail(nm, sf_cuda_last_error());
                sf_convt_plans_destroy(&pl);
                continue;
            }
            std::vector<float> y = down(d_y, ny), dx = down(d_dx, nx), dw = down(d_dw, nw), db = down(d_db, cc.oc);
            if (nhwc) {
                y = to_nchw(y, cc.n, cc.oc, oh, ow);
                dx = to_nchw(dx, cc.n, cc.c, cc.h, cc.w);
                dw = to_nchw(dw, cc.c, cc.oc, cc.k, cc.k);
            }
            char sub[260];
            snprintf(sub, sizeof sub, "%s fwd+bias", nm);
            check_v(sub, y, yr, tol);
            snprintf(sub, sizeof sub, "%s bwd_data", nm);
            check_v(sub, dx, dxr, tol);
            snprintf(sub, sizeof sub, "%s bwd_filter", nm);
            check_v(sub, dw, dwr, tol);
            snprintf(sub, sizeof sub, "%s bias_grad", nm);
            check_v(sub, db, dbr, 1e-4);
            sf_convt_plans_destroy(&pl);
        }
    cudaFree(d_x); cudaFree(d_w); cudaFree(d_b); cudaFree(d_y); cudaFree(d_dy); cudaFree(d_dx);
    cudaFree(d_dw); cudaFree(d_db); cudaFree(scratch); cudaFree(ws);
}

/* The plan cache: a hit returns the same set, a new shape builds another. */
static void test_convt_cache(cudnnHandle_t dnn)
{
    const char *nm = "convT cache hit/miss";
    sf_convt_cache cache;
    memset(&cache, 0, sizeof cache);
    sf_convt_desc a = {2, 8, 4, 4, 4, 2, 2, 0, SF_LAYOUT_NCHW, 0, SF_DT_F32, 16, 16, 16};
    sf_convt_desc b = a;
    b.n = 3;
    sf_convt_plans *p1 = sf_convt_cache_get(dnn, &cache, &a, SF_CONVT_DIR_FWD, (size_t)64 << 20, 1);
    sf_convt_plans *p2 = sf_convt_cache_get(dnn, &cache, &b, SF_CONVT_DIR_ALL, (size_t)64 << 20, 1);
    sf_convt_plans *p3 = sf_convt_cache_get(dnn, &cache, &a, SF_CONVT_DIR_FWD, (size_t)64 << 20, 1);
    sf_convt_plans *p4 = sf_convt_cache_get(dnn, &cache, &a, SF_CONVT_DIR_ALL, (size_t)64 << 20, 1);
    pass_or_fail(nm, p1 && p2 && p3 == p1 && p2 != p1 && p4 == p1 && p4->dirs == SF_CONVT_DIR_ALL && cache.n == 2,
                 sf_cuda_last_error());
    sf_convt_cache_destroy(&cache);
}

/* ---- per-pixel cross-entropy --------------------------------------------- */

static void test_xent2d(cudaStream_t s, int n, int k, int h, int w, sf_layout L, int bad_label)
{
    char nm[160];
    snprintf(nm, sizeof nm, "xent2d n%d k%d %dx%d %s%s", n, k, h, w, lname(L), bad_label ? " bad-label" : "");
    const size_t npix = (size_t)n * h * w, nl = npix * k;
    std::vector<float> lg(nl);
    rand_fill(lg, 3.f);
    std::vector<int32_t> lab(npix);
    for (size_t i = 0; i < npix; i++)
        lab[i] = (int32_t)(sf_hash4(g_seed, i, 5, 0) % (uint64_t)k);
    g_seed++;
    if (bad_label)
        lab[npix / 2] = k;
    std::vector<double> lgd = to_d(lg), dr(nl);
    double lr;
    int64_t cr;
    sf_ref_xent2d_f64(lgd.data(), lab.data(), n, k, h, w, &lr, dr.data(), &cr);
    const int nhwc = L == SF_LAYOUT_NHWC;
    float *d_l = dalloc<float>(nl), *d_d = dalloc<float>(nl);
    int32_t *d_lab = dalloc<int32_t>(npix);
    sf_xent2d_out *d_out = dalloc<sf_xent2d_out>(1);
    void *scr = dalloc<char>(sf_cuda_xent2d_scratch_bytes(n, h, w));
    up(d_l, nhwc ? to_nhwc(lg, n, k, h, w) : lg);
    up(d_lab, lab);
    poison(d_d, nl * 4);
    poison(d_out, sizeof(sf_xent2d_out));
    int rc = sf_cuda_xent2d(d_l, d_lab, n, k, h, w, L, d_d, d_out, scr, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        sf_xent2d_out o = down(d_out, 1)[0];
        std::vector<float> dg = down(d_d, nl);
        if (nhwc)
            dg = to_nchw(dg, n, k, h, w);
        char sub[220];
        if (bad_label) {
            size_t nan_grad = 0;
            for (int j = 0; j < k; j++) {
                const size_t pix = npix / 2, ni = pix / ((size_t)h * w), sp = pix % ((size_t)h * w);
                nan_grad += isnan(dg[(ni * k + j) * h * w + sp]) != 0;
            }
            snprintf(sub, sizeof sub, "%s: NaN loss, bad=1, NaN gradient of that pixel", nm);
            pass_or_fail(sub, isnan(o.loss) && o.bad == 1 && nan_grad == (size_t)k, "not reported");
        } else {
            snprintf(sub, sizeof sub, "%s loss", nm);
            float lf = o.loss;
            check(sub, &lf, &lr, 1, 1e-4);
            snprintf(sub, sizeof sub, "%s correct %lld of %zu", nm, (long long)o.correct, npix);
            pass_or_fail(sub, o.correct == cr && o.bad == 0, "count differs from the reference");
            snprintf(sub, sizeof sub, "%s dlogits", nm);
            check_v(sub, dg, dr, 1e-5);
        }
    }
    cudaFree(d_l); cudaFree(d_d); cudaFree(d_lab); cudaFree(d_out); cudaFree(scr);
}

/* ---- BatchNorm2d ----------------------------------------------------------- */

static void test_bn(cudaStream_t s, int n, int c, int h, int w, sf_layout L, int relu)
{
    char nm[160];
    snprintf(nm, sizeof nm, "bn n%d c%d %dx%d %s%s", n, c, h, w, lname(L), relu ? " +relu" : "");
    const size_t len = (size_t)n * c * h * w;
    const float eps = 1e-5f, mom = 0.1f;
    std::vector<float> x(len), dy(len), gamma(c), beta(c), rm(c), rv(c);
    rand_fill(x, 2.f, 3.f); /* an offset mean: the statistics must not cancel */
    rand_fill(dy, 1.f);
    rand_fill(gamma, 0.5f, 1.f);
    rand_fill(beta, 0.5f);
    rand_fill(rm, 0.5f);
    rand_fill(rv, 0.4f, 1.f);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), gd = to_d(gamma), bd = to_d(beta), rmd = to_d(rm),
                        rvd = to_d(rv), yr(len), smr(c), sir(c), dxr(len), dgr(c), dbr(c);
    sf_ref_bn2d_fwd_train_f64(xd.data(), n, c, h, w, gd.data(), bd.data(), eps, mom, rmd.data(), rvd.data(),
                              smr.data(), sir.data(), yr.data());
    if (relu) {
        for (size_t i = 0; i < len; i++)
            if (!(yr[i] > 0)) {
                yr[i] = 0;
                dyd[i] = 0; /* the ReLU backward, before the BN backward */
            }
    }
    sf_ref_bn2d_bwd_f64(xd.data(), n, c, h, w, gd.data(), smr.data(), sir.data(), dyd.data(), dxr.data(),
                        dgr.data(), dbr.data());
    /* eval mode, float reference, on the updated running statistics */
    std::vector<float> rm2(c), rv2(c), ye(len);
    for (int i = 0; i < c; i++) {
        rm2[i] = (float)rmd[i];
        rv2[i] = (float)rvd[i];
    }
    sf_ref_bn2d_fwd_eval(x.data(), n, c, h, w, gamma.data(), beta.data(), eps, rm2.data(), rv2.data(), ye.data());
    std::vector<double> yer = to_d(ye);
    if (relu)
        for (size_t i = 0; i < len; i++)
            yer[i] = yer[i] > 0 ? yer[i] : 0;

    const int nhwc = L == SF_LAYOUT_NHWC;
    float *d_x = dalloc<float>(len), *d_dy = dalloc<float>(len), *d_y = dalloc<float>(len),
          *d_dx = dalloc<float>(len), *d_g = dalloc<float>(c), *d_b = dalloc<float>(c), *d_rm = dalloc<float>(c),
          *d_rv = dalloc<float>(c), *d_sm = dalloc<float>(c), *d_si = dalloc<float>(c), *d_dg = dalloc<float>(c),
          *d_db = dalloc<float>(c);
    void *scr = dalloc<char>(sf_cuda_bn_scratch_bytes(n, c, h, w, L));
    up(d_x, nhwc ? to_nhwc(x, n, c, h, w) : x);
    up(d_dy, nhwc ? to_nhwc(dy, n, c, h, w) : dy);
    up(d_g, gamma);
    up(d_b, beta);
    up(d_rm, rm);
    up(d_rv, rv);
    poison(d_y, len * 4);
    poison(d_dx, len * 4);
    poison(d_sm, c * 4);
    poison(d_si, c * 4);
    poison(d_dg, c * 4);
    poison(d_db, c * 4);
    int rc = sf_cuda_bn_fwd_train(d_x, n, c, h, w, L, d_g, d_b, eps, mom, d_rm, d_rv, d_sm, d_si, d_y, relu, scr, s);
    if (!rc)
        rc = sf_cuda_bn_bwd(d_x, n, c, h, w, L, d_g, d_sm, d_si, d_dy, relu ? d_y : NULL, d_dx, d_dg, d_db, scr, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> y = down(d_y, len), dx = down(d_dx, len);
        if (nhwc) {
            y = to_nchw(y, n, c, h, w);
            dx = to_nchw(dx, n, c, h, w);
        }
        char sub[220];
        snprintf(sub, sizeof sub, "%s train y", nm);
        check_v(sub, y, yr, 1e-4);
        snprintf(sub, sizeof sub, "%s save_mean", nm);
        check_v(sub, down(d_sm, c), smr, 1e-4);
        snprintf(sub, sizeof sub, "%s save_invstd", nm);
        check_v(sub, down(d_si, c), sir, 1e-4);
        snprintf(sub, sizeof sub, "%s running_mean", nm);
        check_v(sub, down(d_rm, c), rmd, 1e-4);
        snprintf(sub, sizeof sub, "%s running_var", nm);
        check_v(sub, down(d_rv, c), rvd, 1e-4);
        snprintf(sub, sizeof sub, "%s bwd dx", nm);
        check_v(sub, dx, dxr, 1e-4);
        snprintf(sub, sizeof sub, "%s bwd dgamma", nm);
        check_v(sub, down(d_dg, c), dgr, 1e-4);
        snprintf(sub, sizeof sub, "%s bwd dbeta", nm);
        check_v(sub, down(d_db, c), dbr, 1e-4);
        /* eval, on the running statistics the device just updated */
        poison(d_y, len * 4);
        rc = sf_cuda_bn_fwd_eval(d_x, n, c, h, w, L, d_g, d_b, eps, d_rm, d_rv, d_y, relu, s);
        CU(cudaStreamSynchronize(s));
        snprintf(sub, sizeof sub, "%s eval y", nm);
        if (rc) {
            fail(sub, sf_cuda_last_error());
        } else {
            std::vector<float> y2 = down(d_y, len);
            if (nhwc)
                y2 = to_nchw(y2, n, c, h, w);
            check_v(sub, y2, yer, 1e-5);
        }
    }
    cudaFree(d_x); cudaFree(d_dy); cudaFree(d_y); cudaFree(d_dx); cudaFree(d_g); cudaFree(d_b);
    cudaFree(d_rm); cudaFree(d_rv); cudaFree(d_sm); cudaFree(d_si); cudaFree(d_dg); cudaFree(d_db); cudaFree(scr);
}

/* ---- MaxPool2d --------------------------------------------------------------- */

static void test_maxpool(cudaStream_t s, int n, int c, int h, int w, int k, int st, int pad, sf_layout L)
{
    char nm[160];
    snprintf(nm, sizeof nm, "maxpool n%d c%d %dx%d k%d s%d p%d %s", n, c, h, w, k, st, pad, lname(L));
    const int oh = (h + 2 * pad - k) / st + 1, ow = (w + 2 * pad - k) / st + 1;
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * oh * ow;
    std::vector<float> x(nx), dy(ny);
    rand_fill(x, 1.f);
    rand_fill(dy, 1.f);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(ny), dxr(nx);
    std::vector<int32_t> amr(ny);
    sf_ref_maxpool2d_fwd_f64(xd.data(), n, c, h, w, k, st, pad, yr.data(), amr.data());
    sf_ref_maxpool2d_bwd_f64(dyd.data(), amr.data(), n, c, h, w, oh, ow, dxr.data());
    const int nhwc = L == SF_LAYOUT_NHWC;
    float *d_x = dalloc<float>(nx), *d_y = dalloc<float>(ny), *d_dy = dalloc<float>(ny), *d_dx = dalloc<float>(nx);
    int32_t *d_am = dalloc<int32_t>(ny);
    up(d_x, nhwc ? to_nhwc(x, n, c, h, w) : x);
    up(d_dy, nhwc ? to_nhwc(dy, n, c, oh, ow) : dy);
    poison(d_y, ny * 4);
    poison(d_am, ny * 4);
    poison(d_dx, nx * 4);
    int rc = sf_cuda_maxpool_fwd(d_x, n, c, h, w, k, st, pad, L, d_y, d_am, s);
    if (!rc)
        rc = sf_cuda_maxpool_bwd(d_dy, d_am, n, c, h, w, k, st, pad, L, d_dx, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> y = down(d_y, ny), dx = down(d_dx, nx);
        std::vector<int32_t> am = down(d_am, ny);
        if (nhwc) {
            y = to_nchw(y, n, c, oh, ow);
            dx = to_nchw(dx, n, c, h, w);
            am = to_nchw(am, n, c, oh, ow);
        }
        size_t diff = 0;
        for (size_t i = 0; i < ny; i++)
            diff += am[i] != amr[i];
        char sub[220];
        snprintf(sub, sizeof sub, "%s fwd y", nm);
        check_v(sub, y, yr, 1e-6);
        snprintf(sub, sizeof sub, "%s argmax (%zu of %zu differ)", nm, diff, ny);
        pass_or_fail(sub, diff == 0, "argmax differs from the reference");
        snprintf(sub, sizeof sub, "%s bwd dx", nm);
        check_v(sub, dx, dxr, 1e-5);
    }
    cudaFree(d_x); cudaFree(d_y); cudaFree(d_dy); cudaFree(d_dx); cudaFree(d_am);
}

/* ---- global average pooling ----------------------------------------------- */

static void test_avgpool(cudaStream_t s, int n, int c, int h, int w, sf_layout L)
{
    char nm[160];
    snprintf(nm, sizeof nm, "avgpool n%d c%d %dx%d %s", n, c, h, w, lname(L));
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c;
    std::vector<float> x(nx), dy(ny);
    rand_fill(x, 1.f, 0.25f);
    rand_fill(dy, 1.f);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(ny), dxr(nx);
    sf_ref_avgpool_fwd_f64(xd.data(), n, c, h, w, yr.data());
    sf_ref_avgpool_bwd_f64(dyd.data(), n, c, h, w, dxr.data());
    const int nhwc = L == SF_LAYOUT_NHWC;
    float *d_x = dalloc<float>(nx), *d_y = dalloc<float>(ny), *d_dy = dalloc<float>(ny), *d_dx = dalloc<float>(nx);
    up(d_x, nhwc ? to_nhwc(x, n, c, h, w) : x);
    up(d_dy, dy);
    poison(d_y, ny * 4);
    poison(d_dx, nx * 4);
    int rc = sf_cuda_avgpool_fwd(d_x, n, c, h, w, L, d_y, s);
    if (!rc)
        rc = sf_cuda_avgpool_bwd(d_dy, n, c, h, w, L, d_dx, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> dx = down(d_dx, nx);
        if (nhwc)
            dx = to_nchw(dx, n, c, h, w);
        char sub[220];
        snprintf(sub, sizeof sub, "%s fwd", nm);
        check_v(sub, down(d_y, ny), yr, 1e-4);
        snprintf(sub, sizeof sub, "%s bwd", nm);
        check_v(sub, dx, dxr, 1e-5);
    }
    cudaFree(d_x); cudaFree(d_y); cudaFree(d_dy); cudaFree(d_dx);
}

/* ---- residual add ------------------------------------------------------------ */

static void test_add(cudaStream_t s, size_t len, int relu, int in_place)
{
    char nm[120];
    snprintf(nm, sizeof nm, "add%s len %zu%s", relu ? "+relu" : "", len, in_place ? " in place" : "");
    std::vector<float> a(len), b(len), yf(len);
    rand_fill(a, 1.f);
    rand_fill(b, 1.f);
    sf_ref_add_fwd(a.data(), b.data(), len, yf.data());
    std::vector<double> yr = to_d(yf);
    if (relu)
        for (size_t i = 0; i < len; i++)
            yr[i] = yr[i] > 0 ? yr[i] : 0;
    float *d_a = dalloc<float>(len), *d_b = dalloc<float>(len), *d_y = dalloc<float>(len);
    up(d_a, a);
    up(d_b, b);
    poison(d_y, len * 4);
    float *out = in_place ? d_a : d_y;
    int rc = sf_cuda_add(d_a, d_b, out, len, relu, s);
    CU(cudaStreamSynchronize(s));
    if (rc)
        fail(nm, sf_cuda_last_error());
    else
        check_v(nm, down(out, len), yr, 1e-6);
    cudaFree(d_a); cudaFree(d_b); cudaFree(d_y);
}

/* ---- AdamW ------------------------------------------------------------------- */

/* Three steps against sf_ref_adamw; also reports how many parameters are
 * bit-equal (the kernel rounds as the reference does). With perm, one segment
 * of the buffer holds a conv weight whose gradient the device keeps in KRSC. */
static void test_adamw(cudaStream_t s, size_t len, float wd, int perm)
{
    char nm[120];
    snprintf(nm, sizeof nm, "adamw len %zu wd %g%s", len, wd, perm ? " permuted segment" : "");
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    std::vector<float> p(len), m(len, 0.f), v(len, 0.f), g(len);
    rand_fill(p, 1.f);
    float *d_p = dalloc<float>(len), *d_m = dalloc<float>(len), *d_v = dalloc<float>(len), *d_g = dalloc<float>(len),
          *d_w = dalloc<float>(len);
    sf_adamw_hyper *d_h = dalloc<sf_adamw_hyper>(1);
    up(d_p, p);
    CU(cudaMemset(d_m, 0, len * 4));
    CU(cudaMemset(d_v, 0, len * 4));
    poison(d_w, len * 4);
    sf_sgd_segs segs;
    memset(&segs, 0, sizeof segs);
    const int oc = 4, ci = 3, rs = 4; /* a [4][3][2][2] conv weight at offset 8 */
    if (perm) {
        segs.n = 1;
        segs.s[0].off = 8;
        segs.s[0].len = (size_t)oc * ci * rs;
        segs.s[0].c = ci;
        segs.s[0].rs = rs;
    }
    int rc = 0;
    for (int64_t t = 1; t <= 3 && !rc; t++) {
        rand_fill(g, 0.1f);
        std::vector<float> gdev = g;
        if (perm)
            for (int o = 0; o < oc; o++)
                for (int c = 0; c < ci; c++)
                    for (int r = 0; r < rs; r++)
                        gdev[8 + ((size_t)o * rs + r) * ci + c] = g[8 + ((size_t)o * ci + c) * rs + r];
        up(d_g, gdev);
        sf_adamw_hyper h = {lr, b1, b2, eps, wd, 0.f, 0.f, 0.f};
        sf_adamw_hyper_at(&h, t);
        CU(cudaMemcpy(d_h, &h, sizeof h, cudaMemcpyHostToDevice));
        rc = sf_cuda_adamw(d_p, d_g, d_m, d_v, d_w, len, d_h, perm ? &segs : NULL, s);
        sf_ref_adamw(p.data(), g.data(), m.data(), v.data(), len, lr, b1, b2, eps, wd, t);
    }
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> pg = down(d_p, len), mg = down(d_m, len), vg = down(d_v, len);
        size_t same = 0;
        for (size_t i = 0; i < len; i++)
            same += memcmp(&pg[i], &p[i], 4) == 0;
        char sub[200];
        snprintf(sub, sizeof sub, "%s p (%zu of %zu bit-equal)", nm, same, len);
        check_v(sub, pg, to_d(p), 1e-5);
        snprintf(sub, sizeof sub, "%s m", nm);
        check_v(sub, mg, to_d(m), 1e-5);
        snprintf(sub, sizeof sub, "%s v", nm);
        check_v(sub, vg, to_d(v), 1e-5);
        if (perm) {
            std::vector<float> wdv = down(d_w, len);
            int okw = 1;
            for (int o = 0; o < oc; o++)
                for (int c = 0; c < ci; c++)
                    for (int r = 0; r < rs; r++)
                        okw &= memcmp(&wdv[8 + ((size_t)o * rs + r) * ci + c], &pg[8 + ((size_t)o * ci + c) * rs + r],
                                      4) == 0;
            snprintf(sub, sizeof sub, "%s: KRSC copy of the updated weight", nm);
            pass_or_fail(sub, okw, "wdev differs from p at the device index");
        }
    }
    cudaFree(d_p); cudaFree(d_m); cudaFree(d_v); cudaFree(d_g); cudaFree(d_w); cudaFree(d_h);
}

/* ---- capture and throughput at ResNet-18's batch-256 shapes -------------- */

static float time_ms(cudaStream_t s, cudaGraphExec_t ge, int reps)
{
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    CU(cudaGraphLaunch(ge, s)); /* warm-up */
    CU(cudaEventRecord(a, s));
    for (int r = 0; r < reps; r++)
        CU(cudaGraphLaunch(ge, s));
    CU(cudaEventRecord(b, s));
    CU(cudaEventSynchronize(b));
    float ms = 0.f;
    CU(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / reps;
}

typedef int (*enqueue_fn)(void *ctx, cudaStream_t s);

/* Captures fn into a graph (the kernels must be capturable: no sync, no alloc). */
static int capture(cudaStream_t s, enqueue_fn fn, void *ctx, cudaGraphExec_t *ge)
{
    cudaGraph_t g;
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    int rc = fn(ctx, s);
    cudaError_t e = cudaStreamEndCapture(s, &g);
    if (rc || e != cudaSuccess)
        return -1;
    e = cudaGraphInstantiate(ge, g, 0);
    cudaGraphDestroy(g);
    return e == cudaSuccess ? 0 : -1;
}

struct rn_ctx {
    int n, c, h, w;
    sf_layout L;
    float *x, *y, *dy, *dx, *g, *b, *rm, *rv, *sm, *si, *dg, *db, *copy_dst;
    int32_t *am;
    void *scr;
    int pk, ps, pp; /* maxpool */
    size_t copy_bytes;
};

static int enq_bn(void *v, cudaStream_t s)
{
    rn_ctx *c = (rn_ctx *)v;
    return sf_cuda_bn_fwd_train(c->x, c->n, c->c, c->h, c->w, c->L, c->g, c->b, 1e-5f, 0.1f, c->rm, c->rv, c->sm,
                                c->si, c->y, 0, c->scr, s) ||
           sf_cuda_bn_bwd(c->x, c->n, c->c, c->h, c->w, c->L, c->g, c->sm, c->si, c->dy, NULL, c->dx, c->dg, c->db,
                          c->scr, s);
}
static int enq_mp_fwd(void *v, cudaStream_t s)
{
    rn_ctx *c = (rn_ctx *)v;
    return sf_cuda_maxpool_fwd(c->x, c->n, c->c, c->h, c->w, c->pk, c->ps, c->pp, c->L, c->y, c->am, s);
}
static int enq_mp_bwd(void *v, cudaStream_t s)
{
    rn_ctx *c = (rn_ctx *)v;
    return sf_cuda_maxpool_bwd(c->dy, c->am, c->n, c->c, c->h, c->w, c->pk, c->ps, c->pp, c->L, c->dx, s);
}
static int enq_copy(void *v, cudaStream_t s)
{
    rn_ctx *c = (rn_ctx *)v;
    return cudaMemcpyAsync(c->copy_dst, c->x, c->copy_bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess ? 0 : -1;
}

/* BN at 56x56x64 and maxpool k3 s2 p1 of 112x112x64, batch 256, both layouts:
 * a captured graph of each must replay bit-equal to the eager run, and the
 * achieved bandwidth (bytes each kernel must move, over time) is printed next
 * to a device-to-device copy of the largest tensor. */
static void bench_resnet(cudaStream_t s)
{
    const int N = 256, C = 64;
    const size_t big = (size_t)N * C * 112 * 112, bn_len = (size_t)N * C * 56 * 56;
    rn_ctx c;
    memset(&c, 0, sizeof c);
    c.x = dalloc<float>(big);
    c.dx = dalloc<float>(big);
    c.y = dalloc<float>(bn_len);
    c.dy = dalloc<float>(bn_len);
    c.am = dalloc<int32_t>(bn_len);
    c.g = dalloc<float>(C); c.b = dalloc<float>(C); c.rm = dalloc<float>(C); c.rv = dalloc<float>(C);
    c.sm = dalloc<float>(C); c.si = dalloc<float>(C); c.dg = dalloc<float>(C); c.db = dalloc<float>(C);
    c.copy_dst = c.dx;
    c.copy_bytes = big * 4;
    size_t scr_b = sf_cuda_bn_scratch_bytes(N, C, 56, 56, SF_LAYOUT_NCHW);
    size_t scr_b2 = sf_cuda_bn_scratch_bytes(N, C, 56, 56, SF_LAYOUT_NHWC);
    c.scr = dalloc<char>(scr_b > scr_b2 ? scr_b : scr_b2);
    if (sf_cuda_fill_random(c.x, big, 11, 1.f, s) || sf_cuda_fill_random(c.dy, bn_len, 12, 1.f, s) ||
        sf_cuda_fill(c.g, C, 1.f, s) || sf_cuda_fill(c.b, C, 0.f, s) || sf_cuda_fill(c.rm, C, 0.f, s) ||
        sf_cuda_fill(c.rv, C, 1.f, s)) {
        fail("bench setup", sf_cuda_last_error());
        return;
    }
    CU(cudaStreamSynchronize(s));

    cudaGraphExec_t gcopy;
    if (capture(s, enq_copy, &c, &gcopy)) {
        fail("bench copy capture", "capture failed");
        return;
    }
    const float copy_ms = time_ms(s, gcopy, 10);
    const double copy_gbs = 2.0 * c.copy_bytes / (copy_ms * 1e6);
    printf("throughput: device-to-device copy of %.0f MB: %.3f ms, %.0f GB/s (read + write)\n", c.copy_bytes / 1e6,
           copy_ms, copy_gbs);
    cudaGraphExecDestroy(gcopy);

    for (int lay = 0; lay < 2; lay++) {
        c.L = (sf_layout)lay;
        char nm[160];
        /* BN forward + backward at 56x56x64 */
        c.n = N; c.c = C; c.h = 56; c.w = 56;
        if (enq_bn(&c, s)) {
            fail("bench bn eager", sf_cuda_last_error());
            continue;
        }
        CU(cudaStreamSynchronize(s));
        std::vector<float> dx0 = down(c.dx, bn_len), dg0 = down(c.dg, C);
        cudaGraphExec_t gbn;
        snprintf(nm, sizeof nm, "bn fwd+bwd n256 c64 56x56 %s: captured graph replays bit-equal", lname(c.L));
        if (capture(s, enq_bn, &c, &gbn)) {
            fail(nm, "capture failed");
            continue;
        }
        poison(c.dx, bn_len * 4);
        CU(cudaGraphLaunch(gbn, s));
        CU(cudaStreamSynchronize(s));
        std::vector<float> dx1 = down(c.dx, bn_len), dg1 = down(c.dg, C);
        pass_or_fail(nm, memcmp(dx0.data(), dx1.data(), bn_len * 4) == 0 && memcmp(dg0.data(), dg1.data(), C * 4) == 0,
                     "replay differs from the eager run (non-deterministic)");
        const float bn_ms = time_ms(s, gbn, 20);
        /* fwd: x twice (stats, normalise) + y; bwd: x, dy twice (sums, dx) + dx */
        const double bn_bytes = 8.0 * bn_len * 4;
        printf("throughput: bn fwd+bwd n256 c64 56x56 %s: %.3f ms, %.0f GB/s (%.0f%% of copy; 8 tensor passes)\n",
               lname(c.L), bn_ms, bn_bytes / (bn_ms * 1e6), 100.0 * bn_bytes / (bn_ms * 1e6) / copy_gbs);
        cudaGraphExecDestroy(gbn);

        /* maxpool k3 s2 p1: 112x112 -> 56x56 */
        c.h = 112; c.w = 112; c.pk = 3; c.ps = 2; c.pp = 1;
        cudaGraphExec_t gf, gb;
        if (capture(s, enq_mp_fwd, &c, &gf) || capture(s, enq_mp_bwd, &c, &gb)) {
            fail("bench maxpool capture", sf_cuda_last_error());
            continue;
        }
        const float f_ms = time_ms(s, gf, 20), b_ms = time_ms(s, gb, 20);
        const double f_bytes = (double)big * 4 + 2.0 * bn_len * 4, b_bytes = 2.0 * bn_len * 4 + (double)big * 4;
        printf("throughput: maxpool fwd n256 c64 112x112 k3s2p1 %s: %.3f ms, %.0f GB/s (%.0f%% of copy)\n", lname(c.L),
               f_ms, f_bytes / (f_ms * 1e6), 100.0 * f_bytes / (f_ms * 1e6) / copy_gbs);
        printf("throughput: maxpool bwd n256 c64 112x112 k3s2p1 %s: %.3f ms, %.0f GB/s (%.0f%% of copy)\n", lname(c.L),
               b_ms, b_bytes / (b_ms * 1e6), 100.0 * b_bytes / (b_ms * 1e6) / copy_gbs);
        cudaGraphExecDestroy(gf);
        cudaGraphExecDestroy(gb);
    }
    cudaFree(c.x); cudaFree(c.dx); cudaFree(c.y); cudaFree(c.dy); cudaFree(c.am); cudaFree(c.g); cudaFree(c.b);
    cudaFree(c.rm); cudaFree(c.rv); cudaFree(c.sm); cudaFree(c.si); cudaFree(c.dg); cudaFree(c.db); cudaFree(c.scr);
}

int main(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("SKIPPED: no CUDA device\n");
        return 0;
    }
    CU(cudaSetDevice(0));
    /* A blocking stream: the uploads and NaN fills go through the legacy stream
     * (cudaMemcpy, cudaMemset), which such a stream waits for. */
    cudaStream_t s;
    CU(cudaStreamCreate(&s));
    cudnnHandle_t dnn;
    if (cudnnCreate(&dnn) != CUDNN_STATUS_SUCCESS) {
        printf("FAIL setup: cudnnCreate\n");
        return 1;
    }
    cudnnSetStream(dnn, s);
    printf("cuDNN %zu\n", cudnnGetVersion());

    const convt_case ct[] = {
        {2, 256, 16, 16, 128, 2, 2, 0}, /* W2's decoder, batch 2 */
        {2, 128, 32, 32, 64, 2, 2, 0},
        {2, 64, 64, 64, 32, 2, 2, 0},
        {2, 32, 128, 128, 16, 2, 2, 0},
        {2, 3, 5, 7, 4, 3, 2, 1},       /* odd sizes, padding */
        {3, 5, 6, 5, 7, 3, 1, 1},       /* stride 1 */
        {2, 4, 4, 3, 3, 4, 3, 0},       /* k4 s3 */
        {1, 6, 3, 3, 2, 5, 2, 2},       /* k5 s2 p2 */
    };
    for (const convt_case &cc : ct)
        test_convt(dnn, s, cc);
    test_convt_cache(dnn);

    for (int lay = 0; lay < 2; lay++) {
        const sf_layout L = (sf_layout)lay;
        test_xent2d(s, 2, 10, 256, 256, L, 0); /* W2's head */
        test_xent2d(s, 3, 7, 13, 11, L, 0);
        test_xent2d(s, 1, 3, 5, 1, L, 0);
        test_xent2d(s, 2, 1, 3, 3, L, 0);
        test_xent2d(s, 2, 5, 4, 4, L, 1);

        test_bn(s, 2, 64, 56, 56, L, 0); /* ResNet-18's first BN, batch 2 */
        test_bn(s, 4, 512, 7, 7, L, 0);  /* its last */
        test_bn(s, 4, 3, 5, 7, L, 0);
        test_bn(s, 3, 6, 1, 1, L, 0);
        test_bn(s, 8, 16, 13, 13, L, 1);
        test_bn(s, 2, 128, 28, 28, L, 1);

        test_maxpool(s, 2, 64, 112, 112, 3, 2, 1, L); /* ResNet-18's stem */
        test_maxpool(s, 3, 5, 13, 11, 3, 2, 1, L);
        test_maxpool(s, 2, 3, 9, 9, 2, 2, 0, L);
        test_maxpool(s, 1, 4, 7, 8, 3, 1, 1, L);
        test_maxpool(s, 2, 3, 10, 10, 5, 3, 2, L);

        test_avgpool(s, 4, 512, 7, 7, L); /* ResNet-18's head */
        test_avgpool(s, 3, 5, 3, 5, L);
        test_avgpool(s, 4, 7, 1, 1, L);
    }
    test_add(s, 1001, 0, 0);
    test_add(s, 1 << 16, 0, 1);
    test_add(s, 1 << 16, 1, 0);
    test_add(s, 999, 1, 1);
    test_adamw(s, 10007, 0.01f, 0);
    test_adamw(s, 1 << 16, 0.f, 0);
    test_adamw(s, 64, 0.05f, 1);

    bench_resnet(s);

    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("FAIL device: %s\n", cudaGetErrorString(e));
        g_fail++;
    }
    printf("test_layers_w23: %d ok, %d failed\n", g_ok, g_fail);
    return g_fail ? 1 : 0;
}
