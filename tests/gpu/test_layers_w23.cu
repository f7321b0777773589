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
 *
 * Element types (the _dt launchers): every one in fp32 and bf16, both layouts
 * where a layout applies, at ResNet-18 and odd shapes (channels not a multiple
 * of 8, lengths not a multiple of 8, pointers one element off 16-byte
 * alignment for the scalar fallbacks). bf16 inputs are rounded on the host
 * (sf_bf16_round) so both sides see the same values; a bf16 output passes when
 * |got - ref| <= 2^-8 |ref| + 1e-5 max|ref| against the double reference
 * (check_dt: one rounding to nearest is at most half an ulp, <= 2^-8 of the
 * value); selections and masks (ReLU, maxpool y, masked dy) must be exact;
 * per-channel fp32 outputs (statistics, dgamma, dbeta, db) pass a norm check of
 * 1e-3 (bf16 data) or the fp32 tolerance. cast is bit-exact against
 * sf_bf16_bits; weights_dev/grads_model bit-exact against a host permutation,
 * grads_model touching nothing outside its segments. Then a bf16 NHWC
 * throughput section (BN forward/backward at ResNet-18's five BN shapes, the
 * stem maxpool, the residual add; batch 256) with a bit-equal graph replay of
 * each BN.
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

#include "../../gpu/cuda/batchnorm.h"
#include "../../gpu/cuda/conv.h"
#include "../../gpu/cuda/conv_transpose.h"
#include "../../gpu/cuda/layout.h"
#include "../../gpu/cuda/linear.h"
#include "../../gpu/cuda/loss.h"
#include "../../gpu/cuda/optimizer.h"
#include "../../gpu/cuda/pointwise.h"
#include "../../gpu/cuda/pool.h"

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

static void poison(void *d, size_t bytes) { CU(cudaMemset(d, 0xff, bytes)); } /* floats: NaN; ints: -1 */

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
            sf_convt_desc d = {cc.n, cc.c, cc.h, cc.w, cc.oc, cc.k, cc.stride, cc.pad, L, tf32, SF_DT_F32, 16, 16, 16, 0};
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
    sf_convt_desc a = {2, 8, 4, 4, 4, 2, 2, 0, SF_LAYOUT_NCHW, 0, SF_DT_F32, 16, 16, 16, 0};
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

/* ---- element types (bf16): helpers ------------------------------------------
 * bf16 cases draw float inputs, round them with sf_bf16_round (ref.h) so the
 * device and the reference see the same values, run the reference in double
 * (or float where ref.h has only that) and compare the kernel's bf16 output to
 * the unrounded reference (check_dt). */

static const char *dtname(sf_dtype dt) { return dt == SF_DT_BF16 ? "bf16" : "fp32"; }
static void round_dt(std::vector<float> &v, sf_dtype dt)
{
    if (dt == SF_DT_BF16)
        sf_bf16_round_n(v.data(), v.size());
}

/* A device tensor of n elements of dt; p is `mis` elements past the start of a
 * fresh cudaMalloc (256-byte aligned), so mis = 1 breaks 16-byte alignment. */
struct dbuf {
    char *base;
    void *p;
    size_t n;
    sf_dtype dt;
};
static dbuf dbuf_make(sf_dtype dt, size_t n, int mis)
{
    dbuf b;
    b.base = dalloc<char>((n + 8) * sf_dtype_size(dt));
    b.p = b.base + (size_t)mis * sf_dtype_size(dt);
    b.n = n;
    b.dt = dt;
    return b;
}
static void dbuf_free(dbuf &b) { cudaFree(b.base); }
static void up_dt(const dbuf &b, const std::vector<float> &h)
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
static std::vector<float> down_dt(const dbuf &b, size_t n)
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
static void poison_dt(const dbuf &b) { poison(b.p, b.n * sf_dtype_size(b.dt)); } /* 0xffff: a bf16 NaN */

/* Element by element: |got - ref| <= rel*|ref| + absf*max|ref|, NaN or Inf
 * failing; rel = absf = 0 asks for exact values. Prints the worst element. */
static void check_ulp(const char *name, const std::vector<float> &got, const std::vector<double> &ref, double rel,
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
static void check_dt(const char *name, sf_dtype dt, const std::vector<float> &got, const std::vector<double> &ref,
                     double tol32)
{
    if (dt == SF_DT_F32)
        check_v(name, got, ref, tol32);
    else
        check_ulp(name, got, ref, 1.0 / 256, 1e-5);
}

/* ---- relu, add, cast, random fill on dt --------------------------------------- */

static void test_relu_dt(cudaStream_t s, sf_dtype dt, size_t len, int mis, int in_place)
{
    char nm[160], sub[220];
    snprintf(nm, sizeof nm, "relu_dt %s len %zu%s%s", dtname(dt), len, mis ? " misaligned" : "",
             in_place ? " in place" : "");
    std::vector<float> x(len), dy(len);
    rand_fill(x, 1.f);
    rand_fill(dy, 1.f);
    round_dt(x, dt);
    round_dt(dy, dt);
    std::vector<double> yr(len), dxr(len);
    for (size_t i = 0; i < len; i++) {
        yr[i] = x[i] < 0 ? 0 : x[i];
        dxr[i] = yr[i] > 0 ? dy[i] : 0;
    }
    dbuf bx = dbuf_make(dt, len, mis), by = dbuf_make(dt, len, mis), bdy = dbuf_make(dt, len, mis),
         bdx = dbuf_make(dt, len, 0);
    up_dt(bx, x);
    up_dt(bdy, dy);
    poison_dt(by);
    poison_dt(bdx);
    const dbuf &yo = in_place ? bx : by, &dxo = in_place ? bdy : bdx;
    int rc = sf_cuda_relu_fwd_dt(dt, bx.p, yo.p, len, s);
    if (!rc)
        rc = sf_cuda_relu_bwd_dt(dt, yo.p, bdy.p, dxo.p, len, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s fwd (exact)", nm);
        check_ulp(sub, down_dt(yo, len), yr, 0, 0);
        snprintf(sub, sizeof sub, "%s bwd (exact)", nm);
        check_ulp(sub, down_dt(dxo, len), dxr, 0, 0);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
}

static void test_add_dt(cudaStream_t s, sf_dtype dt, size_t len, int relu, int in_place, int mis)
{
    char nm[160];
    snprintf(nm, sizeof nm, "add_dt %s%s len %zu%s%s", dtname(dt), relu ? " +relu" : "", len,
             in_place ? " in place" : "", mis ? " misaligned" : "");
    std::vector<float> a(len), b(len);
    rand_fill(a, 1.f);
    rand_fill(b, 1.f);
    round_dt(a, dt);
    round_dt(b, dt);
    std::vector<double> yr(len);
    for (size_t i = 0; i < len; i++) {
        const double v = (double)a[i] + b[i];
        yr[i] = relu ? (v > 0 ? v : 0) : v;
    }
    dbuf ba = dbuf_make(dt, len, 0), bb = dbuf_make(dt, len, mis), by = dbuf_make(dt, len, 0);
    up_dt(ba, a);
    up_dt(bb, b);
    poison_dt(by);
    const dbuf &out = in_place ? ba : by;
    const int rc = sf_cuda_add_dt(dt, ba.p, bb.p, out.p, len, relu, s);
    CU(cudaStreamSynchronize(s));
    if (rc)
        fail(nm, sf_cuda_last_error());
    else
        check_dt(nm, dt, down_dt(out, len), yr, 1e-6);
    dbuf_free(ba); dbuf_free(bb); dbuf_free(by);
}

/* fp32 -> bf16 bit-exact against sf_bf16_bits (ties to even, subnormals,
 * overflow to inf; a NaN must stay a NaN), bf16 -> fp32 exact (every bit
 * pattern), and the two same-type copies. */
static void test_cast(cudaStream_t s, size_t len, int mis_src, int mis_dst)
{
    char nm[160], sub[220];
    snprintf(nm, sizeof nm, "cast len %zu src+%d dst+%d", len, mis_src, mis_dst);
    std::vector<float> f(len);
    rand_fill(f, 1.f);
    for (size_t i = 0; i < len; i++) /* spread the exponents over 2^-30 .. 2^30 */
        f[i] = ldexpf(f[i], (int)(sf_hash4(g_seed, i, 7, 0) % 61) - 30);
    g_seed++;
    const float special[] = {0.f,        -0.f,          1.f,       -1.f,      1.00390625f /* 1+2^-8: tie to 1 */,
                             1.01171875f /* 1+3*2^-8: tie to even, up */, 1e-40f, -1e-41f, 3.4028235e38f,
                             -3.3961e38f, INFINITY,     -INFINITY, 65504.f,   1.17549435e-38f, NAN};
    for (size_t i = 0; i < sizeof special / sizeof special[0] && i < len; i++)
        f[i] = special[i];
    std::vector<uint16_t> bits(len);
    for (size_t i = 0; i < len; i++)
        bits[i] = (uint16_t)(sf_hash4(g_seed, i, 8, 0) & 0xffff); /* every pattern, NaNs included */
    g_seed++;

    dbuf sf = dbuf_make(SF_DT_F32, len, mis_src), sb = dbuf_make(SF_DT_BF16, len, mis_src);
    dbuf df = dbuf_make(SF_DT_F32, len, mis_dst), db = dbuf_make(SF_DT_BF16, len, mis_dst);
    CU(cudaMemcpy(sf.p, f.data(), len * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(sb.p, bits.data(), len * 2, cudaMemcpyHostToDevice));
    struct {
        const char *what;
        const dbuf *src, *dst;
    } runs[4] = {{"fp32->bf16", &sf, &db}, {"bf16->fp32", &sb, &df}, {"fp32->fp32", &sf, &df}, {"bf16->bf16", &sb, &db}};
    for (int r = 0; r < 4; r++) {
        snprintf(sub, sizeof sub, "%s %s", nm, runs[r].what);
        poison_dt(*runs[r].dst);
        const int rc = sf_cuda_cast(runs[r].src->p, runs[r].src->dt, runs[r].dst->p, runs[r].dst->dt, len, s);
        CU(cudaStreamSynchronize(s));
        if (rc) {
            fail(sub, sf_cuda_last_error());
            continue;
        }
        size_t bad = 0, first = 0;
        if (runs[r].dst->dt == SF_DT_BF16) {
            std::vector<uint16_t> got(len);
            CU(cudaMemcpy(got.data(), db.p, len * 2, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < len; i++) {
                const uint16_t want = runs[r].src->dt == SF_DT_F32 ? sf_bf16_bits(f[i]) : bits[i];
                const int got_nan = (got[i] & 0x7f80) == 0x7f80 && (got[i] & 0x7f);
                const int want_nan = (want & 0x7f80) == 0x7f80 && (want & 0x7f);
                if (want_nan ? !got_nan : got[i] != want)
                    if (!bad++)
                        first = i;
            }
        } else {
            std::vector<uint32_t> got(len);
            CU(cudaMemcpy(got.data(), df.p, len * 4, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < len; i++) {
                uint32_t want;
                if (runs[r].src->dt == SF_DT_BF16)
                    want = (uint32_t)bits[i] << 16;
                else
                    memcpy(&want, &f[i], 4);
                const int got_nan = (got[i] & 0x7f800000u) == 0x7f800000u && (got[i] & 0x7fffffu);
                const int want_nan = (want & 0x7f800000u) == 0x7f800000u && (want & 0x7fffffu);
                if (want_nan ? !got_nan : got[i] != want)
                    if (!bad++)
                        first = i;
            }
        }
        char why[160];
        snprintf(why, sizeof why, "%zu of %zu elements differ from the host conversion (first at %zu)", bad, len, first);
        pass_or_fail(sub, bad == 0, why);
    }
    dbuf_free(sf); dbuf_free(sb); dbuf_free(df); dbuf_free(db);
}

/* sf_cuda_fill_random_dt: fp32 equals sf_cuda_fill_random bit for bit, bf16 is
 * its rounding (sf_bf16_bits). */
static void test_fill_random_dt(cudaStream_t s, size_t len)
{
    char nm[160];
    snprintf(nm, sizeof nm, "fill_random_dt len %zu", len);
    float *ref = dalloc<float>(len);
    dbuf bf = dbuf_make(SF_DT_F32, len, 0), bb = dbuf_make(SF_DT_BF16, len, 1);
    poison_dt(bf);
    poison_dt(bb);
    int rc = sf_cuda_fill_random(ref, len, 77, 2.5f, s);
    if (!rc)
        rc = sf_cuda_fill_random_dt(SF_DT_F32, bf.p, len, 77, 2.5f, s);
    if (!rc)
        rc = sf_cuda_fill_random_dt(SF_DT_BF16, bb.p, len, 77, 2.5f, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> r = down(ref, len), gf(len);
        std::vector<uint16_t> gb(len);
        CU(cudaMemcpy(gf.data(), bf.p, len * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(gb.data(), bb.p, len * 2, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t i = 0; i < len; i++)
            bad += memcmp(&gf[i], &r[i], 4) != 0 || gb[i] != sf_bf16_bits(r[i]) || !(fabsf(r[i]) <= 2.5f);
        pass_or_fail(nm, bad == 0, "differs from sf_cuda_fill_random (or its bf16 rounding)");
    }
    cudaFree(ref);
    dbuf_free(bf); dbuf_free(bb);
}

/* ---- bias and activation on dt -------------------------------------------------- */
/* [outer, c, inner]: inner == 1 is the NHWC (and [n, f]) view, inner > 1 NCHW. */

static void test_bias_act_dt(cudaStream_t s, sf_dtype dt, size_t outer, int c, size_t inner, int relu, int bias,
                             int mis)
{
    char nm[200];
    snprintf(nm, sizeof nm, "bias_act_dt %s [%zu,%d,%zu]%s%s%s", dtname(dt), outer, c, inner, bias ? " +bias" : "",
             relu ? " +relu" : "", mis ? " misaligned" : "");
    const size_t len = outer * c * inner;
    std::vector<float> y(len), b(c);
    rand_fill(y, 1.f);
    rand_fill(b, 0.5f); /* fp32, as the bias is */
    round_dt(y, dt);
    std::vector<double> yr(len);
    for (size_t i = 0; i < len; i++) {
        double v = (double)y[i] + (bias ? (double)b[(i / inner) % c] : 0.0);
        yr[i] = relu ? (v < 0 ? 0 : v) : v;
    }
    dbuf by = dbuf_make(dt, len, mis);
    float *d_b = dalloc<float>(c);
    up_dt(by, y);
    up(d_b, b);
    const int rc = sf_cuda_bias_act_dt(dt, by.p, bias ? d_b : NULL, outer, c, inner, relu, s);
    CU(cudaStreamSynchronize(s));
    if (rc)
        fail(nm, sf_cuda_last_error());
    else
        check_dt(nm, dt, down_dt(by, len), yr, 1e-6);
    dbuf_free(by);
    cudaFree(d_b);
}

/* dy masked in place by y > 0 (when with_y; exact), db = sum of the masked dy
 * per channel (when with_db; fp32, norm check 1e-4 for both element types: the
 * sums run in fp32 either way). */
static void test_bias_grad_dt(cudaStream_t s, sf_dtype dt, size_t outer, int c, size_t inner, int with_y,
                              int with_db, int mis)
{
    char nm[200], sub[260];
    snprintf(nm, sizeof nm, "bias_grad_dt %s [%zu,%d,%zu]%s%s%s", dtname(dt), outer, c, inner, with_y ? " relu-mask" : "",
             with_db ? "" : " no db", mis ? " misaligned" : "");
    const size_t len = outer * c * inner;
    std::vector<float> dy(len), y(len);
    rand_fill(dy, 1.f);
    rand_fill(y, 1.f);
    round_dt(dy, dt);
    round_dt(y, dt);
    std::vector<double> dyr(len), dbr(c, 0.0);
    for (size_t i = 0; i < len; i++) {
        dyr[i] = with_y ? (y[i] > 0 ? dy[i] : 0) : dy[i];
        dbr[(i / inner) % c] += dyr[i];
    }
    dbuf bdy = dbuf_make(dt, len, mis), by = dbuf_make(dt, len, mis);
    float *d_db = dalloc<float>(c), *scr = dalloc<float>(sf_cuda_bias_grad_scratch(c));
    up_dt(bdy, dy);
    up_dt(by, y);
    poison(d_db, c * 4);
    const int rc = sf_cuda_bias_grad_dt(dt, bdy.p, with_y ? by.p : NULL, outer, c, inner, with_db ? d_db : NULL, scr, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s dy (exact)", nm);
        check_ulp(sub, down_dt(bdy, len), dyr, 0, 0);
        if (with_db) {
            snprintf(sub, sizeof sub, "%s db", nm);
            check_v(sub, down(d_db, c), dbr, 1e-4);
        }
    }
    dbuf_free(bdy); dbuf_free(by);
    cudaFree(d_db); cudaFree(scr);
}

/* The convT wrappers on d->dt: bias + ReLU on the output [n, oc, oh, ow] in
 * its layout, then the bias gradient through that ReLU; and the fp32 wrappers
 * refuse a bf16 descriptor. */
static void test_convt_bias_dt(cudaStream_t s, sf_dtype dt, sf_layout L, int oc)
{
    char nm[200], sub[260];
    sf_convt_desc d;
    memset(&d, 0, sizeof d);
    d.n = 2; d.c = 3; d.h = 5; d.w = 4; d.oc = oc; d.k = 3; d.stride = 2; d.pad = 1;
    d.layout = L;
    d.dt = dt;
    const int oh = (d.h - 1) * d.stride - 2 * d.pad + d.k, ow = (d.w - 1) * d.stride - 2 * d.pad + d.k;
    snprintf(nm, sizeof nm, "convT bias_dt %s %s out [%d,%d,%d,%d]", dtname(dt), lname(L), d.n, oc, oh, ow);
    const size_t len = (size_t)d.n * oc * oh * ow;
    std::vector<float> y(len), dy(len), b(oc);
    rand_fill(y, 1.f);
    rand_fill(dy, 1.f);
    rand_fill(b, 0.5f);
    round_dt(y, dt);
    round_dt(dy, dt);
    /* reference in NCHW */
    std::vector<double> yr(len), dyr(len), dbr(oc, 0.0);
    for (size_t i = 0; i < len; i++) {
        const int ch = (int)((i / ((size_t)oh * ow)) % oc);
        const double v = (double)y[i] + b[ch];
        yr[i] = v < 0 ? 0 : v;
    }
    const int nhwc = L == SF_LAYOUT_NHWC;
    dbuf by = dbuf_make(dt, len, 0), bdy = dbuf_make(dt, len, 0);
    float *d_b = dalloc<float>(oc), *d_db = dalloc<float>(oc), *scr = dalloc<float>(sf_cuda_bias_grad_scratch(oc));
    up_dt(by, nhwc ? to_nhwc(y, d.n, oc, oh, ow) : y);
    up_dt(bdy, nhwc ? to_nhwc(dy, d.n, oc, oh, ow) : dy);
    up(d_b, b);
    poison(d_db, oc * 4);
    int rc = sf_convt_bias_act_dt(&d, by.p, d_b, 1, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> got = down_dt(by, len);
        if (nhwc)
            got = to_nchw(got, d.n, oc, oh, ow);
        snprintf(sub, sizeof sub, "%s bias_act +relu", nm);
        check_dt(sub, dt, got, yr, 1e-6);
        /* the backward masks with the device's own ReLU output */
        for (size_t i = 0; i < len; i++) {
            dyr[i] = got[i] > 0 ? dy[i] : 0;
            dbr[(i / ((size_t)oh * ow)) % oc] += dyr[i];
        }
        rc = sf_convt_bias_grad_dt(&d, bdy.p, by.p, d_db, scr, s);
        CU(cudaStreamSynchronize(s));
        snprintf(sub, sizeof sub, "%s bias_grad", nm);
        if (rc) {
            fail(sub, sf_cuda_last_error());
        } else {
            std::vector<float> g = down_dt(bdy, len);
            if (nhwc)
                g = to_nchw(g, d.n, oc, oh, ow);
            snprintf(sub, sizeof sub, "%s bias_grad dy masked (exact)", nm);
            check_ulp(sub, g, dyr, 0, 0);
            snprintf(sub, sizeof sub, "%s bias_grad db", nm);
            check_v(sub, down(d_db, oc), dbr, 1e-4);
        }
    }
    if (dt == SF_DT_BF16) {
        snprintf(sub, sizeof sub, "%s: fp32 wrappers refuse a bf16 descriptor", nm);
        const int r1 = sf_convt_bias_act(&d, (float *)by.p, d_b, 1, s);
        const int r2 = sf_convt_bias_grad(&d, (float *)bdy.p, NULL, d_db, scr, s);
        pass_or_fail(sub, r1 == -1 && r2 == -1, "accepted");
    }
    dbuf_free(by); dbuf_free(bdy);
    cudaFree(d_b); cudaFree(d_db); cudaFree(scr);
}

/* A bf16 ConvTranspose2d through the plans (d.dt = SF_DT_BF16 reaches the conv
 * plans of layers.cu): forward + bias (sf_convt_bias_act_dt), backward data,
 * backward filter (dw bf16, as the conv's w), bias gradient; x, w, dy rounded
 * to bf16, double reference on those values; max |err| <= 1e-2 max|ref| (fp32
 * accumulation and one bf16 rounding, as test_layers' bf16 convolutions). */
static void check_max(const char *name, const std::vector<float> &got, const std::vector<double> &ref, double tol)
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

static void test_convt_bf16(cudnnHandle_t dnn, cudaStream_t s, const convt_case &cc)
{
    const int oh = (cc.h - 1) * cc.stride - 2 * cc.pad + cc.k, ow = (cc.w - 1) * cc.stride - 2 * cc.pad + cc.k;
    const size_t nx = (size_t)cc.n * cc.c * cc.h * cc.w, nw = (size_t)cc.c * cc.oc * cc.k * cc.k,
                 ny = (size_t)cc.n * cc.oc * oh * ow;
    std::vector<float> x(nx), wt(nw), b(cc.oc), dy(ny);
    rand_fill(x, 1.f);
    rand_fill(wt, 0.5f);
    rand_fill(b, 0.5f);
    rand_fill(dy, 1.f);
    round_dt(x, SF_DT_BF16);
    round_dt(wt, SF_DT_BF16);
    round_dt(dy, SF_DT_BF16);
    std::vector<double> xd = to_d(x), wd = to_d(wt), bd = to_d(b), dyd = to_d(dy);
    std::vector<double> yr(ny), dxr(nx), dwr(nw), dbr(cc.oc);
    sf_ref_convt2d_fwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), bd.data(), cc.oc, cc.k, cc.stride, cc.pad,
                           yr.data());
    sf_ref_convt2d_bwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), cc.oc, cc.k, cc.stride, cc.pad, dyd.data(),
                           dxr.data(), dwr.data(), dbr.data());
    const size_t ws_bytes = (size_t)256 << 20;
    void *ws = dalloc<char>(ws_bytes);
    float *d_b = dalloc<float>(cc.oc), *d_db = dalloc<float>(cc.oc), *scr = dalloc<float>(sf_cuda_bias_grad_scratch(cc.oc));
    dbuf bx = dbuf_make(SF_DT_BF16, nx, 0), bw = dbuf_make(SF_DT_BF16, nw, 0), by = dbuf_make(SF_DT_BF16, ny, 0),
         bdy = dbuf_make(SF_DT_BF16, ny, 0), bdx = dbuf_make(SF_DT_BF16, nx, 0), bdw = dbuf_make(SF_DT_BF16, nw, 0);
    up(d_b, b);
    for (int lay = 0; lay < 2; lay++) {
        const sf_layout L = (sf_layout)lay;
        const int nhwc = L == SF_LAYOUT_NHWC;
        char nm[200], sub[260];
        snprintf(nm, sizeof nm, "convT n%d c%d %dx%d -> oc%d k%d s%d p%d %s bf16", cc.n, cc.c, cc.h, cc.w, cc.oc, cc.k,
                 cc.stride, cc.pad, lname(L));
        up_dt(bx, nhwc ? to_nhwc(x, cc.n, cc.c, cc.h, cc.w) : x);
        up_dt(bw, nhwc ? to_nhwc(wt, cc.c, cc.oc, cc.k, cc.k) : wt);
        up_dt(bdy, nhwc ? to_nhwc(dy, cc.n, cc.oc, oh, ow) : dy);
        poison_dt(by);
        poison_dt(bdx);
        poison_dt(bdw);
        poison(d_db, cc.oc * 4);
        sf_convt_desc d = {cc.n, cc.c, cc.h, cc.w, cc.oc, cc.k, cc.stride, cc.pad, L, 0, SF_DT_BF16, 16, 16, 16, 0};
        sf_convt_plans pl;
        memset(&pl, 0, sizeof pl);
        if (sf_convt_plans_build(dnn, &d, SF_CONVT_DIR_ALL, ws_bytes, 1, NULL, &pl)) {
            snprintf(sub, sizeof sub, "%s plans", nm);
            fail(sub, sf_cuda_last_error());
            continue;
        }
        sf_convt_ptrs pf = {bx.p, bw.p, by.p, ws}, pd = {bdx.p, bw.p, bdy.p, ws}, pw = {bx.p, bdw.p, bdy.p, ws};
        int rc = sf_convt_run(dnn, &pl, SF_CONV_FWD, &pf) || sf_convt_bias_act_dt(&d, by.p, d_b, 0, s) ||
                 sf_convt_run(dnn, &pl, SF_CONV_BWD_DATA, &pd) || sf_convt_run(dnn, &pl, SF_CONV_BWD_FILTER, &pw) ||
                 sf_convt_bias_grad_dt(&d, bdy.p, NULL, d_db, scr, s);
        CU(cudaStreamSynchronize(s));
        if (rc) {
            fail(nm, sf_cuda_last_error());
            sf_convt_plans_destroy(&pl);
            continue;
        }
        std::vector<float> y = down_dt(by, ny), dx = down_dt(bdx, nx), dw = down_dt(bdw, nw);
        if (nhwc) {
            y = to_nchw(y, cc.n, cc.oc, oh, ow);
            dx = to_nchw(dx, cc.n, cc.c, cc.h, cc.w);
            dw = to_nchw(dw, cc.c, cc.oc, cc.k, cc.k);
        }
        snprintf(sub, sizeof sub, "%s fwd+bias", nm);
        check_max(sub, y, yr, 1e-2);
        snprintf(sub, sizeof sub, "%s bwd_data", nm);
        check_max(sub, dx, dxr, 1e-2);
        snprintf(sub, sizeof sub, "%s bwd_filter", nm);
        check_max(sub, dw, dwr, 1e-2);
        snprintf(sub, sizeof sub, "%s bias_grad", nm);
        check_v(sub, down(d_db, cc.oc), dbr, 1e-4);
        sf_convt_plans_destroy(&pl);
    }
    dbuf_free(bx); dbuf_free(bw); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx); dbuf_free(bdw);
    cudaFree(ws); cudaFree(d_b); cudaFree(d_db); cudaFree(scr);
}

/* ---- BatchNorm2d on dt ------------------------------------------------------------ */

/* Training forward (optionally with the fused ReLU), backward, then eval on
 * the running statistics the device updated. The backward's reference masks dy
 * with the device's own ReLU output (a value the two sides round to opposite
 * sides of zero would otherwise flip a mask bit). Per-channel fp32 outputs:
 * norm check, 1e-4 (fp32 data) or 1e-3 (bf16 data). mis: every activation
 * pointer one element off 16-byte alignment (the scalar fallbacks). */
static void test_bn_dt(cudaStream_t s, sf_dtype dt, int n, int c, int h, int w, sf_layout L, int relu, int mis)
{
    char nm[200], sub[260];
    snprintf(nm, sizeof nm, "bn_dt %s n%d c%d %dx%d %s%s%s", dtname(dt), n, c, h, w, lname(L), relu ? " +relu" : "",
             mis ? " misaligned" : "");
    const size_t len = (size_t)n * c * h * w;
    const float eps = 1e-5f, mom = 0.1f;
    const double tolc = dt == SF_DT_BF16 ? 1e-3 : 1e-4;
    std::vector<float> x(len), dy(len), gamma(c), beta(c), rm(c), rv(c);
    rand_fill(x, 2.f, 3.f); /* an offset mean: the statistics must not cancel */
    rand_fill(dy, 1.f);
    rand_fill(gamma, 0.5f, 1.f);
    rand_fill(beta, 0.5f);
    rand_fill(rm, 0.5f);
    rand_fill(rv, 0.4f, 1.f);
    round_dt(x, dt);
    round_dt(dy, dt);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), gd = to_d(gamma), bd = to_d(beta), rmd = to_d(rm),
                        rvd = to_d(rv), yr(len), smr(c), sir(c), dxr(len), dgr(c), dbr(c);
    sf_ref_bn2d_fwd_train_f64(xd.data(), n, c, h, w, gd.data(), bd.data(), eps, mom, rmd.data(), rvd.data(),
                              smr.data(), sir.data(), yr.data());
    if (relu)
        for (size_t i = 0; i < len; i++)
            yr[i] = yr[i] > 0 ? yr[i] : 0;

    const int nhwc = L == SF_LAYOUT_NHWC;
    dbuf bx = dbuf_make(dt, len, mis), by = dbuf_make(dt, len, mis), bdy = dbuf_make(dt, len, mis),
         bdx = dbuf_make(dt, len, mis);
    float *d_g = dalloc<float>(c), *d_b = dalloc<float>(c), *d_rm = dalloc<float>(c), *d_rv = dalloc<float>(c),
          *d_sm = dalloc<float>(c), *d_si = dalloc<float>(c), *d_dg = dalloc<float>(c), *d_db = dalloc<float>(c);
    void *scr = dalloc<char>(sf_cuda_bn_scratch_bytes(n, c, h, w, L));
    up_dt(bx, nhwc ? to_nhwc(x, n, c, h, w) : x);
    up_dt(bdy, nhwc ? to_nhwc(dy, n, c, h, w) : dy);
    up(d_g, gamma);
    up(d_b, beta);
    up(d_rm, rm);
    up(d_rv, rv);
    poison_dt(by);
    poison_dt(bdx);
    poison(d_sm, c * 4);
    poison(d_si, c * 4);
    poison(d_dg, c * 4);
    poison(d_db, c * 4);
    int rc = sf_cuda_bn_fwd_train_dt(dt, bx.p, n, c, h, w, L, d_g, d_b, eps, mom, d_rm, d_rv, d_sm, d_si, by.p, relu,
                                     scr, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
        goto done;
    }
    {
        std::vector<float> y = down_dt(by, len);
        if (nhwc)
            y = to_nchw(y, n, c, h, w);
        snprintf(sub, sizeof sub, "%s train y", nm);
        check_dt(sub, dt, y, yr, 1e-4);
        snprintf(sub, sizeof sub, "%s save_mean", nm);
        check_v(sub, down(d_sm, c), smr, tolc);
        snprintf(sub, sizeof sub, "%s save_invstd", nm);
        check_v(sub, down(d_si, c), sir, tolc);
        snprintf(sub, sizeof sub, "%s running_mean", nm);
        check_v(sub, down(d_rm, c), rmd, tolc);
        snprintf(sub, sizeof sub, "%s running_var", nm);
        check_v(sub, down(d_rv, c), rvd, tolc);

        if (relu)
            for (size_t i = 0; i < len; i++)
                if (!(y[i] > 0))
                    dyd[i] = 0; /* the ReLU backward, before the BN backward */
        sf_ref_bn2d_bwd_f64(xd.data(), n, c, h, w, gd.data(), smr.data(), sir.data(), dyd.data(), dxr.data(),
                            dgr.data(), dbr.data());
        rc = sf_cuda_bn_bwd_dt(dt, bx.p, n, c, h, w, L, d_g, d_sm, d_si, bdy.p, relu ? by.p : NULL, bdx.p, d_dg, d_db,
                               scr, s);
        CU(cudaStreamSynchronize(s));
        snprintf(sub, sizeof sub, "%s bwd", nm);
        if (rc) {
            fail(sub, sf_cuda_last_error());
            goto done;
        }
        std::vector<float> dx = down_dt(bdx, len);
        if (nhwc)
            dx = to_nchw(dx, n, c, h, w);
        snprintf(sub, sizeof sub, "%s bwd dx", nm);
        check_dt(sub, dt, dx, dxr, 1e-4);
        snprintf(sub, sizeof sub, "%s bwd dgamma", nm);
        check_v(sub, down(d_dg, c), dgr, tolc);
        snprintf(sub, sizeof sub, "%s bwd dbeta", nm);
        check_v(sub, down(d_db, c), dbr, tolc);

        /* eval, on the running statistics the device just updated */
        std::vector<float> rm2 = down(d_rm, c), rv2 = down(d_rv, c);
        std::vector<double> yer(len);
        const size_t hw = (size_t)h * w;
        for (size_t i = 0; i < len; i++) {
            const int ch = (int)((i / hw) % c);
            const double v = (double)gamma[ch] * (((double)x[i] - rm2[ch]) / sqrt((double)rv2[ch] + eps)) + beta[ch];
            yer[i] = relu ? (v > 0 ? v : 0) : v;
        }
        poison_dt(by);
        rc = sf_cuda_bn_fwd_eval_dt(dt, bx.p, n, c, h, w, L, d_g, d_b, eps, d_rm, d_rv, by.p, relu, s);
        CU(cudaStreamSynchronize(s));
        snprintf(sub, sizeof sub, "%s eval y", nm);
        if (rc) {
            fail(sub, sf_cuda_last_error());
        } else {
            std::vector<float> y2 = down_dt(by, len);
            if (nhwc)
                y2 = to_nchw(y2, n, c, h, w);
            check_dt(sub, dt, y2, yer, 1e-5);
        }
    }
done:
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
    cudaFree(d_g); cudaFree(d_b); cudaFree(d_rm); cudaFree(d_rv); cudaFree(d_sm); cudaFree(d_si); cudaFree(d_dg);
    cudaFree(d_db); cudaFree(scr);
}

/* ---- MaxPool2d and global average pooling on dt ------------------------------------- */

/* y exact (a selection), argmax equal to the reference's, dx (sums of up to
 * four dy in fp32, rounded once) by check_dt. */
static void test_maxpool_dt(cudaStream_t s, sf_dtype dt, int n, int c, int h, int w, int k, int st, int pad,
                            sf_layout L, int mis)
{
    char nm[200], sub[260];
    snprintf(nm, sizeof nm, "maxpool_dt %s n%d c%d %dx%d k%d s%d p%d %s%s", dtname(dt), n, c, h, w, k, st, pad,
             lname(L), mis ? " misaligned" : "");
    const int oh = (h + 2 * pad - k) / st + 1, ow = (w + 2 * pad - k) / st + 1;
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * oh * ow;
    std::vector<float> x(nx), dy(ny);
    rand_fill(x, 1.f);
    rand_fill(dy, 1.f);
    round_dt(x, dt); /* bf16 makes ties in a window common: the first maximum must win */
    round_dt(dy, dt);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(ny), dxr(nx);
    std::vector<int32_t> amr(ny);
    sf_ref_maxpool2d_fwd_f64(xd.data(), n, c, h, w, k, st, pad, yr.data(), amr.data());
    sf_ref_maxpool2d_bwd_f64(dyd.data(), amr.data(), n, c, h, w, oh, ow, dxr.data());
    const int nhwc = L == SF_LAYOUT_NHWC;
    dbuf bx = dbuf_make(dt, nx, mis), by = dbuf_make(dt, ny, mis), bdy = dbuf_make(dt, ny, mis),
         bdx = dbuf_make(dt, nx, mis);
    int32_t *am_mem = dalloc<int32_t>(ny + 4), *d_am = am_mem + mis;
    up_dt(bx, nhwc ? to_nhwc(x, n, c, h, w) : x);
    up_dt(bdy, nhwc ? to_nhwc(dy, n, c, oh, ow) : dy);
    poison_dt(by);
    poison_dt(bdx);
    poison(d_am, ny * 4);
    int rc = sf_cuda_maxpool_fwd_dt(dt, bx.p, n, c, h, w, k, st, pad, L, by.p, d_am, s);
    if (!rc)
        rc = sf_cuda_maxpool_bwd_dt(dt, bdy.p, d_am, n, c, h, w, k, st, pad, L, bdx.p, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> y = down_dt(by, ny), dx = down_dt(bdx, nx);
        std::vector<int32_t> am = down(d_am, ny);
        if (nhwc) {
            y = to_nchw(y, n, c, oh, ow);
            dx = to_nchw(dx, n, c, h, w);
            am = to_nchw(am, n, c, oh, ow);
        }
        size_t diff = 0;
        for (size_t i = 0; i < ny; i++)
            diff += am[i] != amr[i];
        snprintf(sub, sizeof sub, "%s fwd y (exact)", nm);
        check_ulp(sub, y, yr, 0, 0);
        snprintf(sub, sizeof sub, "%s argmax (%zu of %zu differ)", nm, diff, ny);
        pass_or_fail(sub, diff == 0, "argmax differs from the reference");
        snprintf(sub, sizeof sub, "%s bwd dx", nm);
        check_dt(sub, dt, dx, dxr, 1e-5);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
    cudaFree(am_mem);
}

static void test_avgpool_dt(cudaStream_t s, sf_dtype dt, int n, int c, int h, int w, sf_layout L)
{
    char nm[200], sub[260];
    snprintf(nm, sizeof nm, "avgpool_dt %s n%d c%d %dx%d %s", dtname(dt), n, c, h, w, lname(L));
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c;
    std::vector<float> x(nx), dy(ny);
    rand_fill(x, 1.f, 0.25f);
    rand_fill(dy, 1.f);
    round_dt(x, dt);
    round_dt(dy, dt);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(ny), dxr(nx);
    sf_ref_avgpool_fwd_f64(xd.data(), n, c, h, w, yr.data());
    sf_ref_avgpool_bwd_f64(dyd.data(), n, c, h, w, dxr.data());
    const int nhwc = L == SF_LAYOUT_NHWC;
    dbuf bx = dbuf_make(dt, nx, 0), by = dbuf_make(dt, ny, 0), bdy = dbuf_make(dt, ny, 0), bdx = dbuf_make(dt, nx, 0);
    up_dt(bx, nhwc ? to_nhwc(x, n, c, h, w) : x);
    up_dt(bdy, dy);
    poison_dt(by);
    poison_dt(bdx);
    int rc = sf_cuda_avgpool_fwd_dt(dt, bx.p, n, c, h, w, L, by.p, s);
    if (!rc)
        rc = sf_cuda_avgpool_bwd_dt(dt, bdy.p, n, c, h, w, L, bdx.p, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> dx = down_dt(bdx, nx);
        if (nhwc)
            dx = to_nchw(dx, n, c, h, w);
        snprintf(sub, sizeof sub, "%s fwd", nm);
        check_dt(sub, dt, down_dt(by, ny), yr, 1e-4);
        snprintf(sub, sizeof sub, "%s bwd", nm);
        check_dt(sub, dt, dx, dxr, 1e-5);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
}

/* ---- weights: model layout <-> device layout ------------------------------------ */

/* Model index i of segment g -> its device index (the permutation of ref: KCRS -> KRSC). */
static size_t perm_dev_of_model(const sf_perm_seg &g, size_t i)
{
    const size_t r = i - g.off, crs = (size_t)g.c * g.rs;
    const size_t o = r / crs, rem = r % crs, ci = rem / g.rs, t = rem % g.rs;
    return g.off + (o * g.rs + t) * g.c + ci;
}

/* A pretend parameter buffer: segments listed out of order, gaps between
 * them (identity), two c == 1 segments (identity inside a segment), a 1x1 conv
 * (rs 1), segments meeting inside one 8-element group, and with big the shapes
 * of ResNet-18's 3x3 convolutions. weights_dev must write all len elements
 * (bits equal to the host permutation, rounded by sf_bf16_bits for bf16);
 * grads_model must write exactly the segments (bits of the device gradient)
 * and leave every other element of g as it was. */
static void test_weights_perm(cudaStream_t s, sf_dtype dt, int mis, int big)
{
    char nm[200], sub[260];
    snprintf(nm, sizeof nm, "weights_dev/grads_model %s%s%s", dtname(dt), big ? " resnet-sized" : "",
             mis ? " misaligned" : "");
    struct shape {
        int oc, c, rs;
        size_t gap; /* identity elements before the segment */
    };
    std::vector<shape> sh = {
        {4, 3, 9, 5},   /* conv 4x3x3x3 after 5 loose elements */
        {8, 1, 9, 0},   /* c == 1: identity */
        {8, 16, 1, 3},  /* 1x1 conv */
        {16, 8, 4, 0},  /* 2x2 (a convT-like block), meets the previous one */
        {3, 5, 25, 13}, /* 5x5 */
        {10, 1, 1, 1},  /* c == 1, rs == 1 */
    };
    if (big) {
        sh.push_back({64, 64, 9, 64});
        sh.push_back({128, 64, 9, 128});
        sh.push_back({128, 128, 9, 0});
        sh.push_back({512, 256, 9, 512});
    }
    sf_sgd_segs segs;
    memset(&segs, 0, sizeof segs);
    std::vector<sf_perm_seg> list;
    size_t len = 0;
    for (const shape &q : sh) {
        len += q.gap;
        sf_perm_seg g;
        g.off = len;
        g.len = (size_t)q.oc * q.c * q.rs;
        g.c = q.c;
        g.rs = q.rs;
        list.push_back(g);
        len += g.len;
    }
    len += 7; /* a tail */
    /* out of order: the kernels must not assume sorted segments */
    segs.n = (int)list.size();
    for (size_t k = 0; k < list.size(); k++)
        segs.s[k] = list[(k * 7 + 3) % list.size()]; /* 7 is prime to 6 and 10 */

    std::vector<float> p(len);
    rand_fill(p, 1.f);
    std::vector<size_t> dev_of(len); /* model index -> device index */
    std::vector<char> inseg(len, 0);
    for (size_t i = 0; i < len; i++)
        dev_of[i] = i;
    for (const sf_perm_seg &g : list)
        for (size_t i = g.off; i < g.off + g.len; i++) {
            dev_of[i] = perm_dev_of_model(g, i);
            inseg[i] = 1;
        }
    float *pmem = dalloc<float>(len + 4), *d_p = pmem + mis;
    up(d_p, p);
    dbuf bw = dbuf_make(dt, len, mis);
    poison_dt(bw);
    int rc = sf_cuda_weights_dev(d_p, bw.p, dt, len, &segs, s);
    CU(cudaStreamSynchronize(s));
    snprintf(sub, sizeof sub, "%s: weights_dev len %zu, %d segments", nm, len, segs.n);
    if (rc) {
        fail(sub, sf_cuda_last_error());
    } else {
        size_t bad = 0, first = 0;
        if (dt == SF_DT_BF16) {
            std::vector<uint16_t> got(len);
            CU(cudaMemcpy(got.data(), bw.p, len * 2, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < len; i++)
                if (got[dev_of[i]] != sf_bf16_bits(p[i]) && !bad++)
                    first = i;
        } else {
            std::vector<float> got = down((const float *)bw.p, len);
            for (size_t i = 0; i < len; i++)
                if (memcmp(&got[dev_of[i]], &p[i], 4) != 0 && !bad++)
                    first = i;
        }
        char why[200];
        snprintf(why, sizeof why, "%zu of %zu elements differ (first: model index %zu, device %zu)", bad, len, first,
                 dev_of[first]);
        pass_or_fail(sub, bad == 0, why);
    }

    /* grads_model: a device gradient of dt; g holds a sentinel everywhere */
    std::vector<float> gdv(len);
    rand_fill(gdv, 0.1f);
    round_dt(gdv, dt);
    dbuf bg = dbuf_make(dt, len, mis);
    up_dt(bg, gdv);
    const float sentinel = -12345.678f;
    std::vector<float> g0(len, sentinel);
    float *gmem = dalloc<float>(len + 4), *d_g = gmem + mis;
    up(d_g, g0);
    rc = sf_cuda_grads_model(bg.p, dt, d_g, &segs, s);
    CU(cudaStreamSynchronize(s));
    snprintf(sub, sizeof sub, "%s: grads_model writes the segments only", nm);
    if (rc) {
        fail(sub, sf_cuda_last_error());
    } else {
        std::vector<float> got = down(d_g, len);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < len; i++) {
            const float want = inseg[i] ? gdv[dev_of[i]] : sentinel;
            if (memcmp(&got[i], &want, 4) != 0 && !bad++)
                first = i;
        }
        char why[200];
        snprintf(why, sizeof why, "%zu of %zu elements differ (first: model index %zu%s)", bad, len, first,
                 inseg[first] ? "" : ", outside the segments");
        pass_or_fail(sub, bad == 0, why);
    }

    /* no segments: weights_dev is a plain conversion, grads_model writes nothing */
    poison_dt(bw);
    up(d_g, g0);
    rc = sf_cuda_weights_dev(d_p, bw.p, dt, len, NULL, s) || sf_cuda_grads_model(bg.p, dt, d_g, NULL, s);
    CU(cudaStreamSynchronize(s));
    snprintf(sub, sizeof sub, "%s: no segments (identity, nothing written)", nm);
    if (rc) {
        fail(sub, sf_cuda_last_error());
    } else {
        std::vector<float> w = down_dt(bw, len), g = down(d_g, len);
        size_t bad = 0;
        for (size_t i = 0; i < len; i++)
            bad += w[i] != (dt == SF_DT_BF16 ? sf_bf16_round(p[i]) : p[i]) || memcmp(&g[i], &sentinel, 4) != 0;
        pass_or_fail(sub, bad == 0, "differs");
    }

    /* malformed segments are refused */
    {
        sf_sgd_segs bad1 = segs, bad2 = segs, bad3 = segs;
        bad1.s[0].off = len - 1;             /* past the end */
        bad2.s[1] = bad2.s[0];               /* two identical: overlap */
        bad3.s[0].len += 1;                  /* list[3]: c*rs = 32 no longer divides it */
        const int r1 = sf_cuda_weights_dev(d_p, bw.p, dt, len, &bad1, s);
        const int r2 = sf_cuda_grads_model(bg.p, dt, d_g, &bad2, s);
        const int r3 = sf_cuda_weights_dev(d_p, bw.p, dt, len, &bad3, s);
        snprintf(sub, sizeof sub, "%s: malformed segments refused", nm);
        pass_or_fail(sub, r1 == -1 && r2 == -1 && r3 == -1, "accepted");
    }
    dbuf_free(bw); dbuf_free(bg);
    cudaFree(pmem); cudaFree(gmem);
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
static double bench_resnet(cudaStream_t s)
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
        return 0;
    }
    CU(cudaStreamSynchronize(s));

    cudaGraphExec_t gcopy;
    if (capture(s, enq_copy, &c, &gcopy)) {
        fail("bench copy capture", "capture failed");
        return 0;
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
    return copy_gbs;
}

/* ---- bf16 NHWC throughput at ResNet-18's batch-256 shapes ------------------ */

struct bf_ctx {
    int n, c, h, w, relu;
    sf_layout L;
    void *x, *y, *dy, *dx;
    float *g, *b, *rm, *rv, *sm, *si, *dg, *db;
    int32_t *am;
    void *scr;
};

static int enq_bf_bn_fwd(void *v, cudaStream_t s)
{
    bf_ctx *c = (bf_ctx *)v;
    return sf_cuda_bn_fwd_train_dt(SF_DT_BF16, c->x, c->n, c->c, c->h, c->w, c->L, c->g, c->b, 1e-5f, 0.1f, c->rm,
                                   c->rv, c->sm, c->si, c->y, c->relu, c->scr, s);
}
static int enq_bf_bn_bwd(void *v, cudaStream_t s)
{
    bf_ctx *c = (bf_ctx *)v;
    return sf_cuda_bn_bwd_dt(SF_DT_BF16, c->x, c->n, c->c, c->h, c->w, c->L, c->g, c->sm, c->si, c->dy,
                             c->relu ? c->y : NULL, c->dx, c->dg, c->db, c->scr, s);
}
static int enq_bf_bn(void *v, cudaStream_t s) { return enq_bf_bn_fwd(v, s) || enq_bf_bn_bwd(v, s); }
static int enq_bf_mp_fwd(void *v, cudaStream_t s)
{
    bf_ctx *c = (bf_ctx *)v;
    return sf_cuda_maxpool_fwd_dt(SF_DT_BF16, c->x, c->n, c->c, c->h, c->w, 3, 2, 1, c->L, c->y, c->am, s);
}
static int enq_bf_mp_bwd(void *v, cudaStream_t s)
{
    bf_ctx *c = (bf_ctx *)v;
    return sf_cuda_maxpool_bwd_dt(SF_DT_BF16, c->dy, c->am, c->n, c->c, c->h, c->w, 3, 2, 1, c->L, c->dx, s);
}
static int enq_bf_add(void *v, cudaStream_t s)
{
    bf_ctx *c = (bf_ctx *)v;
    return sf_cuda_add_dt(SF_DT_BF16, c->x, c->dy, c->y, (size_t)c->n * c->c * c->h * c->w, 1, s);
}

/* Times a captured enqueue; NAN when it cannot be captured (reported). */
static float bf_time(cudaStream_t s, enqueue_fn fn, void *ctx, const char *what, int reps)
{
    cudaGraphExec_t ge;
    if (capture(s, fn, ctx, &ge)) {
        fail(what, "capture failed");
        return NAN;
    }
    const float ms = time_ms(s, ge, reps);
    cudaGraphExecDestroy(ge);
    return ms;
}

static void bf_line(const char *what, float ms, double bytes, double copy_gbs, const char *note)
{
    if (!(ms > 0))
        return;
    const double gbs = bytes / (ms * 1e6);
    printf("throughput: %s: %.3f ms, %.0f GB/s (%.0f%% of copy%s%s)\n", what, ms, gbs, 100.0 * gbs / copy_gbs,
           note ? "; " : "", note ? note : "");
}

/* bf16, NHWC (the target configuration) at batch 256: BN forward (training,
 * +ReLU and without) and backward at ResNet-18's five BN shapes, maxpool
 * k3 s2 p1 of the stem (NHWC and NCHW), and the residual add (+ReLU) at the
 * BN shapes. A captured BN forward+backward must replay bit-equal to the
 * eager run. Bytes are what each kernel must move (tensor passes x 2 bytes;
 * argmax int32), over the device-to-device copy bandwidth measured above. */
static void bench_bf16(cudaStream_t s, double copy_gbs)
{
    const int N = 256;
    struct {
        int c, hw;
    } shapes[5] = {{64, 112}, {64, 56}, {128, 28}, {256, 14}, {512, 7}};
    const size_t big = (size_t)N * 64 * 112 * 112, pooled = (size_t)N * 64 * 56 * 56;
    bf_ctx c;
    memset(&c, 0, sizeof c);
    c.x = dalloc<char>(big * 2);
    c.y = dalloc<char>(big * 2);
    c.dy = dalloc<char>(big * 2);
    c.dx = dalloc<char>(big * 2);
    c.am = dalloc<int32_t>(pooled);
    c.g = dalloc<float>(512); c.b = dalloc<float>(512); c.rm = dalloc<float>(512); c.rv = dalloc<float>(512);
    c.sm = dalloc<float>(512); c.si = dalloc<float>(512); c.dg = dalloc<float>(512); c.db = dalloc<float>(512);
    size_t scr_b = 0;
    for (int k = 0; k < 5; k++) {
        const size_t b = sf_cuda_bn_scratch_bytes(N, shapes[k].c, shapes[k].hw, shapes[k].hw, SF_LAYOUT_NHWC);
        scr_b = b > scr_b ? b : scr_b;
    }
    c.scr = dalloc<char>(scr_b);
    if (sf_cuda_fill_random_dt(SF_DT_BF16, c.x, big, 21, 2.f, s) ||
        sf_cuda_fill_random_dt(SF_DT_BF16, c.dy, big, 22, 1.f, s) || sf_cuda_fill(c.g, 512, 1.f, s) ||
        sf_cuda_fill(c.b, 512, 0.f, s) || sf_cuda_fill(c.rm, 512, 0.f, s) || sf_cuda_fill(c.rv, 512, 1.f, s)) {
        fail("bench bf16 setup", sf_cuda_last_error());
        return;
    }
    CU(cudaStreamSynchronize(s));
    c.L = SF_LAYOUT_NHWC;
    c.n = N;
    char nm[200];
    for (int k = 0; k < 5; k++) {
        c.c = shapes[k].c;
        c.h = c.w = shapes[k].hw;
        const size_t len = (size_t)N * c.c * c.h * c.w;
        for (int relu = 1; relu >= 0; relu--) {
            c.relu = relu;
            snprintf(nm, sizeof nm, "bn bf16 nhwc n%d c%d %dx%d%s", N, c.c, c.h, c.w, relu ? " +relu" : "");
            /* eager, then a captured replay: bit-equal (deterministic) */
            if (enq_bf_bn(&c, s)) {
                fail(nm, sf_cuda_last_error());
                continue;
            }
            CU(cudaStreamSynchronize(s));
            std::vector<uint16_t> dx0(len), dx1(len);
            std::vector<float> dg0 = down(c.dg, c.c);
            CU(cudaMemcpy(dx0.data(), c.dx, len * 2, cudaMemcpyDeviceToHost));
            cudaGraphExec_t ge;
            char sub[260];
            snprintf(sub, sizeof sub, "%s fwd+bwd: captured graph replays bit-equal", nm);
            if (capture(s, enq_bf_bn, &c, &ge)) {
                fail(sub, "capture failed");
                continue;
            }
            poison(c.dx, len * 2);
            CU(cudaGraphLaunch(ge, s));
            CU(cudaStreamSynchronize(s));
            cudaGraphExecDestroy(ge);
            CU(cudaMemcpy(dx1.data(), c.dx, len * 2, cudaMemcpyDeviceToHost));
            std::vector<float> dg1 = down(c.dg, c.c);
            pass_or_fail(sub, dx0 == dx1 && memcmp(dg0.data(), dg1.data(), c.c * 4) == 0,
                         "replay differs from the eager run (non-deterministic)");
            const float fms = bf_time(s, enq_bf_bn_fwd, &c, nm, 20), bms = bf_time(s, enq_bf_bn_bwd, &c, nm, 20);
            snprintf(sub, sizeof sub, "%s fwd", nm);
            bf_line(sub, fms, 3.0 * len * 2, copy_gbs, "3 passes: x, x, y");
            snprintf(sub, sizeof sub, "%s bwd", nm);
            bf_line(sub, bms, (relu ? 7.0 : 5.0) * len * 2, copy_gbs,
                    relu ? "7 passes: x, dy, y, then x, dy, y, dx" : "5 passes: x, dy, then x, dy, dx");
        }
        snprintf(nm, sizeof nm, "add+relu bf16 n%d c%d %dx%d", N, c.c, c.h, c.w);
        bf_line(nm, bf_time(s, enq_bf_add, &c, nm, 20), 3.0 * len * 2, copy_gbs, "a, b, y");
    }
    /* maxpool k3 s2 p1: 112x112 -> 56x56, c 64 */
    c.c = 64;
    c.h = c.w = 112;
    for (int lay = 1; lay >= 0; lay--) {
        c.L = (sf_layout)lay;
        snprintf(nm, sizeof nm, "maxpool fwd bf16 %s n%d c64 112x112 k3s2p1", lname(c.L), N);
        bf_line(nm, bf_time(s, enq_bf_mp_fwd, &c, nm, 20), 2.0 * big + 2.0 * pooled + 4.0 * pooled, copy_gbs,
                "x, y, argmax");
        snprintf(nm, sizeof nm, "maxpool bwd bf16 %s n%d c64 112x112 k3s2p1", lname(c.L), N);
        bf_line(nm, bf_time(s, enq_bf_mp_bwd, &c, nm, 20), 2.0 * pooled + 4.0 * pooled + 2.0 * big, copy_gbs,
                "dy, argmax, dx");
    }
    cudaFree(c.x); cudaFree(c.y); cudaFree(c.dy); cudaFree(c.dx); cudaFree(c.am); cudaFree(c.g); cudaFree(c.b);
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

    /* element types (bf16), and the _dt launchers with SF_DT_F32 */
    for (int t = 0; t < 2; t++) {
        const sf_dtype dt = (sf_dtype)t;
        test_relu_dt(s, dt, 1001, 0, 0);
        test_relu_dt(s, dt, 1 << 16, 0, 1);
        test_relu_dt(s, dt, 4099, 1, 0);
        test_relu_dt(s, dt, 5, 0, 0);
        test_add_dt(s, dt, 1001, 0, 0, 0);
        test_add_dt(s, dt, 1 << 16, 1, 1, 0);
        test_add_dt(s, dt, 999, 1, 0, 1);
        test_add_dt(s, dt, 7, 0, 1, 0);
        test_bias_act_dt(s, dt, 37, 64, 1, 1, 1, 0);   /* NHWC view, vector path */
        test_bias_act_dt(s, dt, 3, 16, 49, 1, 1, 0);   /* NCHW view, inner odd */
        test_bias_act_dt(s, dt, 2, 5, 64, 0, 1, 0);    /* NCHW view, inner % 8 == 0 */
        test_bias_act_dt(s, dt, 19, 12, 1, 1, 1, 0);   /* channels not a multiple of 8 */
        test_bias_act_dt(s, dt, 11, 24, 1, 1, 0, 1);   /* ReLU only, misaligned */
        test_bias_grad_dt(s, dt, 301, 64, 1, 1, 1, 0); /* rows, vector path */
        test_bias_grad_dt(s, dt, 1000, 8, 1, 0, 1, 0); /* rows, many chunks */
        test_bias_grad_dt(s, dt, 57, 13, 1, 1, 1, 0);  /* rows, scalar */
        test_bias_grad_dt(s, dt, 4, 6, 64, 1, 1, 0);   /* planes, vector */
        test_bias_grad_dt(s, dt, 5, 7, 9, 1, 1, 1);    /* planes, scalar, misaligned */
        test_bias_grad_dt(s, dt, 9, 16, 1, 1, 0, 0);   /* mask only (no db) */
        test_bias_grad_dt(s, dt, 3, 2100, 1, 0, 1, 0); /* more channels than a block */
        for (int lay = 0; lay < 2; lay++) {
            const sf_layout L = (sf_layout)lay;
            test_convt_bias_dt(s, dt, L, 5);
            test_convt_bias_dt(s, dt, L, 16);

            test_bn_dt(s, dt, 2, 64, 56, 56, L, 1, 0); /* ResNet-18's first BN, batch 2 */
            test_bn_dt(s, dt, 4, 512, 7, 7, L, 0, 0);  /* its last */
            test_bn_dt(s, dt, 2, 128, 28, 28, L, 1, 0);
            test_bn_dt(s, dt, 16, 64, 32, 32, L, 1, 0); /* many row chunks */
            test_bn_dt(s, dt, 3, 64, 13, 11, L, 0, 0);  /* a ragged last chunk */
            test_bn_dt(s, dt, 3, 24, 5, 5, L, 1, 0);    /* C/8 odd: one channel group a block */
            test_bn_dt(s, dt, 8, 40, 13, 13, L, 1, 0);
            test_bn_dt(s, dt, 2, 16, 8, 8, L, 0, 0);
            test_bn_dt(s, dt, 4, 3, 5, 7, L, 0, 0);     /* C % 8 != 0: scalar */
            test_bn_dt(s, dt, 3, 6, 1, 1, L, 0, 0);
            test_bn_dt(s, dt, 2, 64, 9, 9, L, 1, 1);    /* misaligned: scalar fallback */

            test_maxpool_dt(s, dt, 2, 64, 112, 112, 3, 2, 1, L, 0); /* ResNet-18's stem */
            test_maxpool_dt(s, dt, 3, 5, 13, 11, 3, 2, 1, L, 0);    /* odd sizes, C % 8 != 0 */
            test_maxpool_dt(s, dt, 2, 16, 9, 10, 3, 2, 1, L, 0);    /* odd h, vector channels */
            test_maxpool_dt(s, dt, 2, 16, 12, 12, 3, 2, 1, L, 1);   /* misaligned */
            test_maxpool_dt(s, dt, 2, 8, 11, 11, 3, 2, 0, L, 0);    /* k3 s2 without padding */
            test_maxpool_dt(s, dt, 2, 3, 9, 9, 2, 2, 0, L, 0);
            test_maxpool_dt(s, dt, 1, 4, 7, 8, 3, 1, 1, L, 0);
            test_maxpool_dt(s, dt, 2, 8, 10, 10, 5, 3, 2, L, 0);

            test_avgpool_dt(s, dt, 4, 512, 7, 7, L);
            test_avgpool_dt(s, dt, 3, 5, 3, 5, L);
        }
        test_weights_perm(s, dt, 0, 0);
        test_weights_perm(s, dt, 1, 0);
        test_weights_perm(s, dt, 0, 1);
    }
    test_cast(s, 1001, 0, 0);
    test_cast(s, 1 << 16, 0, 0);
    test_cast(s, 333, 1, 0);
    test_cast(s, 40, 0, 3);
    test_fill_random_dt(s, 100003);
    const convt_case ct_bf16[] = {
        {2, 64, 16, 16, 32, 2, 2, 0}, /* W2's decoder */
        {2, 3, 5, 7, 4, 3, 2, 1},     /* odd sizes, padding */
        {3, 5, 6, 5, 7, 3, 1, 1},     /* stride 1 */
    };
    for (const convt_case &cc : ct_bf16)
        test_convt_bf16(dnn, s, cc);

    const double copy_gbs = bench_resnet(s);
    if (copy_gbs > 0)
        bench_bf16(s, copy_gbs);

    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("FAIL device: %s\n", cudaGetErrorString(e));
        g_fail++;
    }
    printf("test_layers_w23: %d ok, %d failed\n", g_ok, g_fail);
    return g_fail ? 1 : 0;
}
