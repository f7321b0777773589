/* tests/gpu/test_layers.cu — every CUDA layer of gpu/cuda/layers.h against the
 * double-precision reference of gpu/ref (DESIGN.md §8).
 *
 * Fresh random inputs for every case (never zeros), outputs poisoned with NaN
 * before each run, relative error ||out - ref|| / ||ref|| with NaN failing:
 * fp32 < 1e-4 for convolutions, GEMMs and reductions, < 1e-5 for pointwise ops;
 * tf32 < 1e-3. Convolutions run in both activation layouts (NCHW with KCRS
 * filters, NHWC with KRSC filters) and both precisions, at odd sizes and with
 * stride and padding variants.
 *
 * bf16 (convolutions in both layouts and all three directions, linear layers):
 * inputs are rounded to bf16 on the host and the double reference runs on
 * those values; outputs are NaN-poisoned first; the criterion is
 * max |out - ref| <= 1e-2 * max |ref| (fp32 dw of a linear layer: 1e-3), see
 * check_max for why.
 *
 * Then, unless --quick, informational throughput of ResNet-18's convolutions
 * at batch 256 (bf16 NHWC vs tf32 NHWC vs tf32 NCHW; perf_resnet18).
 *
 * Prints "ok <case>" or "FAIL <case>: ..." per case ("info ..." and "perf ..."
 * lines are informational); exits 1 on any failure, 0 with "SKIPPED: no CUDA
 * device" when there is no GPU.
 */
extern "C" {
#include "../../gpu/ref/ref.h"
#include "../../gpu/rng.h"
}

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#include <cuda_bf16.h>

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

static uint64_t g_seed = 0x1234abcd;

/* ---- helpers -------------------------------------------------------------- */

static void rand_fill(std::vector<float> &v, float scale)
{
    uint64_t s = g_seed++;
    for (size_t i = 0; i < v.size(); i++) {
        float u = sf_u01(sf_hash4(s, i, 77, 0)) * 2.f - 1.f;
        if (u == 0.f)
            u = 0.5f; /* never zero */
        v[i] = u * scale;
    }
}


static void check_f(const char *name, const float *got, const std::vector<double> &ref, double tol)
{
    check(name, got, ref.data(), ref.size(), tol);
}

static void fail(const char *name, const char *why)
{
    g_fail++;
    printf("FAIL %s: %s\n", name, why);
}

static void poison(float *d, size_t n) { CU(cudaMemset(d, 0xff, n * 4)); } /* all-ones bits: NaN */

/* ---- bf16 data ---------------------------------------------------------------
 * Host values are rounded to bf16 first (sf_bf16_round, ref.h), so the bf16 bit
 * patterns uploaded hold exactly the values the reference is given. */

static void round_bf16(std::vector<float> &v) { sf_bf16_round_n(v.data(), v.size()); }
static void upb(uint16_t *d, const std::vector<float> &h)
{
    std::vector<uint16_t> b(h.size());
    for (size_t i = 0; i < h.size(); i++)
        b[i] = sf_bf16_bits(h[i]);
    CU(cudaMemcpy(d, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
}
static std::vector<float> downb(const uint16_t *d, size_t n)
{
    std::vector<uint16_t> b(n);
    CU(cudaMemcpy(b.data(), d, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++)
        h[i] = sf_bf16_float(b[i]);
    return h;
}
static void poison_b(uint16_t *d, size_t n) { CU(cudaMemset(d, 0xff, n * 2)); } /* 0xffff: a bf16 NaN */

/* The bf16 criterion: max |got - ref| <= tol * max |ref|, NaN or Inf anywhere
 * failing. ref is the double-precision reference on the bf16-rounded inputs,
 * so the inputs contribute no error; what is left is fp32 accumulation (relative
 * ~1e-6 here) and, for a bf16 output, its one rounding to nearest, at most
 * half an ulp, 2^-8 ~ 3.9e-3 of the element, so of max |ref|. tol 1e-2 leaves
 * a factor 2.5 over that and still catches a wrong layout, a dropped tap, a
 * channel mix-up or a half-written output (errors of order max |ref|). */
static void check_max(const char *name, const std::vector<float> &got, const std::vector<double> &ref, double tol)
{
    size_t bad = 0, first = 0, worst = 0;
    double err = 0, scale = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        scale = fmax(scale, fabs(ref[i]));
        if (!isfinite(got[i])) {
            if (!bad++)
                first = i;
            continue;
        }
        const double e = fabs((double)got[i] - ref[i]);
        if (e > err) {
            err = e;
            worst = i;
        }
    }
    char why[200];
    if (bad) {
        snprintf(why, sizeof why, "%zu of %zu elements not finite (first at %zu: %g, ref %g)", bad, ref.size(), first,
                 got[first], ref[first]);
        fail(name, why);
    } else if (err > tol * scale || scale == 0) {
        snprintf(why, sizeof why, "max err %.3e > %.0e * max|ref| %.3e (worst [%zu] %g vs %g)", err, tol, scale, worst,
                 got[worst], ref[worst]);
        fail(name, why);
    } else {
        printf("ok %s (max err %.2e of max|ref| %.3g)\n", name, err / scale, scale);
        g_ok++;
    }
}

/* ---- convolution ----------------------------------------------------------- */

struct conv_case {
    int n, c, h, w, oc, k, stride, pad;
};

static void test_conv(cudnnHandle_t dnn, cudaStream_t s, const conv_case &cc, sf_layout lay, int tf32, int tune)
{
    char name[200];
    const char *ln = lay == SF_LAYOUT_NHWC ? "nhwc" : "nchw";
    const char *pn = tf32 ? "tf32" : "fp32";
    const int oh = (cc.h + 2 * cc.pad - cc.k) / cc.stride + 1, ow = (cc.w + 2 * cc.pad - cc.k) / cc.stride + 1;
    const double tol = tf32 ? 1e-3 : 1e-4;
    const size_t nx = (size_t)cc.n * cc.c * cc.h * cc.w, nw = (size_t)cc.oc * cc.c * cc.k * cc.k,
                 ny = (size_t)cc.n * cc.oc * oh * ow;
    std::vector<float> x(nx), wt(nw), b(cc.oc), dy(ny);
    rand_fill(x, 1.f);
    rand_fill(wt, 0.5f);
    rand_fill(b, 0.5f);
    rand_fill(dy, 1.f);

    /* reference in double */
    std::vector<double> xd = to_d(x), wd = to_d(wt), bd = to_d(b), dyd = to_d(dy);
    std::vector<double> yr(ny), dxr(nx), dwr(nw), dbr(cc.oc);
    sf_ref_conv2d_fwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), bd.data(), cc.oc, cc.k, cc.stride, cc.pad,
                          yr.data());
    sf_ref_conv2d_bwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), cc.oc, cc.k, cc.stride, cc.pad, dyd.data(),
                          dxr.data(), dwr.data(), dbr.data());
    std::vector<double> yrelu(ny);
    for (size_t i = 0; i < ny; i++)
        yrelu[i] = yr[i] < 0 ? 0 : yr[i];

    const int nhwc = lay == SF_LAYOUT_NHWC;
    std::vector<float> xl = nhwc ? to_nhwc(x, cc.n, cc.c, cc.h, cc.w) : x;
    std::vector<float> wl = nhwc ? to_nhwc(wt, cc.oc, cc.c, cc.k, cc.k) : wt;
    std::vector<float> dyl = nhwc ? to_nhwc(dy, cc.n, cc.oc, oh, ow) : dy;
    float *dx_in = dalloc<float>(nx), *dw_in = dalloc<float>(nw), *db_in = dalloc<float>(cc.oc),
          *ddy = dalloc<float>(ny), *dy_out = dalloc<float>(ny), *ddx = dalloc<float>(nx), *ddw = dalloc<float>(nw),
          *ddb = dalloc<float>(cc.oc);
    float *scratch = dalloc<float>(sf_cuda_bias_grad_scratch(cc.oc));
    const size_t ws_bytes = (size_t)256 << 20;
    void *ws = dalloc<char>(ws_bytes);
    up(dx_in, xl);
    up(dw_in, wl);
    up(db_in, b);
    up(ddy, dyl);

    sf_conv_desc d;
    memset(&d, 0, sizeof d);
    d.n = cc.n; d.c = cc.c; d.h = cc.h; d.w = cc.w; d.oc = cc.oc; d.k = cc.k; d.stride = cc.stride; d.pad = cc.pad;
    d.layout = lay;
    d.tf32 = tf32;
    d.align_x = d.align_w = d.align_y = 16;
    sf_conv_ptrs pf = {dx_in, dw_in, dy_out, ws, NULL}, pd = {ddx, dw_in, ddy, ws, NULL}, pw = {dx_in, ddw, ddy, ws, NULL};
    sf_conv_plan plf, pld, plw;
    const size_t outer = nhwc ? (size_t)cc.n * oh * ow : (size_t)cc.n, inner = nhwc ? 1 : (size_t)oh * ow;
    snprintf(name, sizeof name, "conv n%d c%d %dx%d oc%d k%d s%d p%d %s %s%s", cc.n, cc.c, cc.h, cc.w, cc.oc, cc.k,
             cc.stride, cc.pad, ln, pn, tune > 1 ? " tuned" : "");
    char nm[260];
    cudnnBackendDescriptor_t vf = NULL, vd = NULL, vw = NULL;
    if (sf_conv_plan_build(dnn, &d, SF_CONV_FWD, ws_bytes, tune, tune > 1 ? &pf : NULL, &plf) ||
        sf_conv_plan_build(dnn, &d, SF_CONV_BWD_DATA, ws_bytes, tune, tune > 1 ? &pd : NULL, &pld) ||
        sf_conv_plan_build(dnn, &d, SF_CONV_BWD_FILTER, ws_bytes, tune, tune > 1 ? &pw : NULL, &plw) ||
        sf_conv_vpack_make(&pf, &vf) || sf_conv_vpack_make(&pd, &vd) || sf_conv_vpack_make(&pw, &vw)) {
        snprintf(nm, sizeof nm, "%s plans", name);
        fail(nm, sf_cuda_last_error());
    } else {
        /* forward + bias */
        poison(dy_out, ny);
        int rc = sf_conv_run(dnn, &plf, vf) || sf_cuda_bias_act(dy_out, db_in, outer, cc.oc, inner, 0, s);
        CU(cudaStreamSynchronize(s));
        snprintf(nm, sizeof nm, "%s fwd+bias (engine %lld%s)", name, (long long)plf.engine, plf.tensor_core ? " tc" : "");
        if (rc)
            fail(nm, sf_cuda_last_error());
        else {
            std::vector<float> y = down(dy_out, ny);
            if (nhwc)
                y = to_nchw(y, cc.n, cc.oc, oh, ow);
            check_f(nm, y.data(), yr, tol);
        }
        /* forward + bias + relu */
        poison(dy_out, ny);
        rc = sf_conv_run(dnn, &plf, vf) || sf_cuda_bias_act(dy_out, db_in, outer, cc.oc, inner, 1, s);
        CU(cudaStreamSynchronize(s));
        snprintf(nm, sizeof nm, "%s fwd+bias+relu", name);
        std::vector<float> yact;
        if (rc)
            fail(nm, sf_cuda_last_error());
        else {
            yact = down(dy_out, ny);
            std::vector<float> y = nhwc ? to_nchw(yact, cc.n, cc.oc, oh, ow) : yact;
            check_f(nm, y.data(), yrelu, tol);
        }
        /* cuDNN's fused conv + bias + ReLU, when an engine exists for this case */
        {
            sf_conv_desc df = d;
            df.fuse_bias = 1;
            df.fuse_relu = 1;
            df.align_b = 16;
            sf_conv_ptrs pfb = pf;
            pfb.b = db_in;
            sf_conv_plan plfu;
            cudnnBackendDescriptor_t vfu = NULL;
            snprintf(nm, sizeof nm, "%s fused fwd+bias+relu", name);
            if (sf_conv_plan_build(dnn, &df, SF_CONV_FWD, ws_bytes, tune, tune > 1 ? &pfb : NULL, &plfu) == 0) {
                if (sf_conv_vpack_make(&pfb, &vfu)) {
                    fail(nm, sf_cuda_last_error());
                } else {
                    poison(dy_out, ny);
                    rc = sf_conv_run(dnn, &plfu, vfu);
                    CU(cudaStreamSynchronize(s));
                    if (rc)
                        fail(nm, sf_cuda_last_error());
                    else {
                        std::vector<float> y = down(dy_out, ny);
                        if (nhwc)
                            y = to_nchw(y, cc.n, cc.oc, oh, ow);
                        char n2[300];
                        snprintf(n2, sizeof n2, "%s (engine %lld)", nm, (long long)plfu.engine);
                        check_f(n2, y.data(), yrelu, tol);
                    }
                    sf_conv_vpack_destroy(vfu);
                }
                sf_conv_plan_destroy(&plfu);
            } else {
                printf("info %s: no cuDNN engine\n", nm);
                sf_cuda_clear_error();
            }
        }
        /* backward data */
        poison(ddx, nx);
        rc = sf_conv_run(dnn, &pld, vd);
        CU(cudaStreamSynchronize(s));
        snprintf(nm, sizeof nm, "%s bwd_data (engine %lld%s)", name, (long long)pld.engine, pld.tensor_core ? " tc" : "");
        if (rc)
            fail(nm, sf_cuda_last_error());
        else {
            std::vector<float> g = down(ddx, nx);
            if (nhwc)
                g = to_nchw(g, cc.n, cc.c, cc.h, cc.w);
            check_f(nm, g.data(), dxr, tol);
        }
        /* backward filter */
        poison(ddw, nw);
        rc = sf_conv_run(dnn, &plw, vw);
        CU(cudaStreamSynchronize(s));
        snprintf(nm, sizeof nm, "%s bwd_filter (engine %lld%s)", name, (long long)plw.engine, plw.tensor_core ? " tc" : "");
        if (rc)
            fail(nm, sf_cuda_last_error());
        else {
            std::vector<float> g = down(ddw, nw);
            if (nhwc)
                g = to_nchw(g, cc.oc, cc.c, cc.k, cc.k);
            check_f(nm, g.data(), dwr, tol);
        }
        /* bias gradient (no relu) */
        poison(ddb, cc.oc);
        rc = sf_cuda_bias_grad(ddy, NULL, outer, cc.oc, inner, ddb, scratch, s);
        CU(cudaStreamSynchronize(s));
        snprintf(nm, sizeof nm, "%s bias_grad", name);
        if (rc)
            fail(nm, sf_cuda_last_error());
        else
            check_f(nm, down(ddb, cc.oc).data(), dbr, 1e-5);
        /* relu backward fused with the bias gradient, in place on dy */
        if (!yact.empty()) {
            /* The mask comes from the GPU's own forward output, so that values
             * near zero cannot flip between the two. */
            std::vector<float> ya = nhwc ? to_nchw(yact, cc.n, cc.oc, oh, ow) : yact;
            std::vector<double> dymask(ny), dbmask(cc.oc, 0.0);
            for (int o = 0; o < cc.oc; o++)
                for (int a = 0; a < cc.n; a++)
                    for (int i = 0; i < oh * ow; i++) {
                        size_t e = ((size_t)a * cc.oc + o) * oh * ow + i;
                        dymask[e] = ya[e] > 0 ? dyd[e] : 0;
                        dbmask[o] += dymask[e];
                    }
            poison(ddb, cc.oc);
            rc = sf_cuda_bias_grad(ddy, dy_out, outer, cc.oc, inner, ddb, scratch, s);
            CU(cudaStreamSynchronize(s));
            snprintf(nm, sizeof nm, "%s relu_bwd+bias_grad", name);
            if (rc)
                fail(nm, sf_cuda_last_error());
            else {
                std::vector<float> g = down(ddy, ny);
                if (nhwc)
                    g = to_nchw(g, cc.n, cc.oc, oh, ow);
                check_f(nm, g.data(), dymask, 1e-6);
                snprintf(nm, sizeof nm, "%s relu_bwd+bias_grad db", name);
                check_f(nm, down(ddb, cc.oc).data(), dbmask, 1e-5);
            }
        }
    }
    sf_conv_vpack_destroy(vf);
    sf_conv_vpack_destroy(vd);
    sf_conv_vpack_destroy(vw);
    sf_conv_plan_destroy(&plf);
    sf_conv_plan_destroy(&pld);
    sf_conv_plan_destroy(&plw);
    cudaFree(dx_in); cudaFree(dw_in); cudaFree(db_in); cudaFree(ddy); cudaFree(dy_out); cudaFree(ddx);
    cudaFree(ddw); cudaFree(ddb); cudaFree(scratch); cudaFree(ws);
}

/* ---- bf16 convolution ------------------------------------------------------- */

/* One shape in bf16 (x, w, y, dy, dx, dw all bf16; fp32 compute), both layouts,
 * against the double reference on the same bf16 values (check_max, tol 1e-2).
 * The reference runs once per shape. misalign: x and dx are bound 2 bytes past
 * a 256-byte boundary and declared so (align_x = 2), which checks that the
 * alignment fields are taken in bytes for bf16 too. tf32 = 0 throughout: the
 * tf32 flag is about fp32 data and must not keep bf16 off tensor cores. */
static void test_conv_bf16(cudnnHandle_t dnn, cudaStream_t s, const conv_case &cc, int tune, int misalign)
{
    const int oh = (cc.h + 2 * cc.pad - cc.k) / cc.stride + 1, ow = (cc.w + 2 * cc.pad - cc.k) / cc.stride + 1;
    const double tol = 1e-2;
    const size_t nx = (size_t)cc.n * cc.c * cc.h * cc.w, nw = (size_t)cc.oc * cc.c * cc.k * cc.k,
                 ny = (size_t)cc.n * cc.oc * oh * ow;
    std::vector<float> x(nx), wt(nw), b(cc.oc), dy(ny);
    rand_fill(x, 1.f);
    rand_fill(wt, 0.5f);
    rand_fill(b, 0.5f);
    rand_fill(dy, 1.f);
    round_bf16(x);
    round_bf16(wt);
    round_bf16(dy); /* b stays fp32: the fused epilogue's bias is an fp32 tensor */

    std::vector<double> xd = to_d(x), wd = to_d(wt), bd = to_d(b), dyd = to_d(dy);
    std::vector<double> yr(ny), ybr(ny), dxr(nx), dwr(nw);
    sf_ref_conv2d_fwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), NULL, cc.oc, cc.k, cc.stride, cc.pad,
                          yr.data());
    sf_ref_conv2d_bwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), cc.oc, cc.k, cc.stride, cc.pad, dyd.data(),
                          dxr.data(), dwr.data(), NULL);
    /* relu(conv + b) for the fused epilogue */
    for (int a = 0; a < cc.n; a++)
        for (int o = 0; o < cc.oc; o++)
            for (int i = 0; i < oh * ow; i++) {
                const size_t e = ((size_t)a * cc.oc + o) * oh * ow + i;
                const double v = yr[e] + bd[o];
                ybr[e] = v < 0 ? 0 : v;
            }

    for (int lay = 0; lay < 2; lay++) {
        const int nhwc = lay == SF_LAYOUT_NHWC;
        char name[200], nm[300];
        snprintf(name, sizeof name, "conv n%d c%d %dx%d oc%d k%d s%d p%d %s bf16%s%s", cc.n, cc.c, cc.h, cc.w, cc.oc,
                 cc.k, cc.stride, cc.pad, nhwc ? "nhwc" : "nchw", tune > 1 ? " tuned" : "",
                 misalign ? " x@+2B" : "");
        std::vector<float> xl = nhwc ? to_nhwc(x, cc.n, cc.c, cc.h, cc.w) : x;
        std::vector<float> wl = nhwc ? to_nhwc(wt, cc.oc, cc.c, cc.k, cc.k) : wt;
        std::vector<float> dyl = nhwc ? to_nhwc(dy, cc.n, cc.oc, oh, ow) : dy;
        const size_t off = misalign ? 1 : 0; /* elements: 2 bytes */
        uint16_t *bx_mem = dalloc<uint16_t>(nx + off), *bdx_mem = dalloc<uint16_t>(nx + off);
        uint16_t *bx = bx_mem + off, *bdx = bdx_mem + off;
        uint16_t *bw = dalloc<uint16_t>(nw), *by = dalloc<uint16_t>(ny), *bdy = dalloc<uint16_t>(ny),
                 *bdw = dalloc<uint16_t>(nw);
        float *bb = dalloc<float>(cc.oc);
        const size_t ws_bytes = (size_t)256 << 20;
        void *ws = dalloc<char>(ws_bytes);
        upb(bx, xl);
        upb(bw, wl);
        upb(bdy, dyl);
        up(bb, b);

        sf_conv_desc d;
        memset(&d, 0, sizeof d);
        d.n = cc.n; d.c = cc.c; d.h = cc.h; d.w = cc.w; d.oc = cc.oc; d.k = cc.k; d.stride = cc.stride; d.pad = cc.pad;
        d.layout = (sf_layout)lay;
        d.tf32 = 0;
        d.dt = SF_DT_BF16;
        d.align_x = sf_cuda_ptr_align(bx);
        d.align_w = d.align_y = 16;
        if (misalign && (d.align_x != 2 || sf_cuda_ptr_align(bdx) != 2)) {
            snprintf(nm, sizeof nm, "%s setup", name);
            fail(nm, "x pointer is not 2-byte aligned as intended");
        }
        sf_conv_ptrs pf = {bx, bw, by, ws, NULL}, pd = {bdx, bw, bdy, ws, NULL}, pw = {bx, bdw, bdy, ws, NULL};
        sf_conv_plan plan[3];
        memset(plan, 0, sizeof plan);
        cudnnBackendDescriptor_t vp[3] = {NULL, NULL, NULL};
        const sf_conv_ptrs *ptrs[3] = {&pf, &pd, &pw};
        static const char *dn[3] = {"fwd", "bwd_data", "bwd_filter"};
        for (int dir = 0; dir < 3; dir++) {
            if (sf_conv_plan_build(dnn, &d, (sf_conv_dir)dir, ws_bytes, tune, tune > 1 ? ptrs[dir] : NULL, &plan[dir]) ||
                sf_conv_vpack_make(ptrs[dir], &vp[dir])) {
                snprintf(nm, sizeof nm, "%s %s plan", name, dn[dir]);
                fail(nm, sf_cuda_last_error());
                continue;
            }
            if (plan[dir].dt != SF_DT_BF16) {
                snprintf(nm, sizeof nm, "%s %s plan", name, dn[dir]);
                fail(nm, "plan.dt is not SF_DT_BF16");
            }
            uint16_t *outp = dir == SF_CONV_FWD ? by : dir == SF_CONV_BWD_DATA ? bdx : bdw;
            const size_t nout = dir == SF_CONV_FWD ? ny : dir == SF_CONV_BWD_DATA ? nx : nw;
            poison_b(outp, nout);
            const int rc = sf_conv_run(dnn, &plan[dir], vp[dir]);
            CU(cudaStreamSynchronize(s));
            snprintf(nm, sizeof nm, "%s %s (engine %lld%s)", name, dn[dir], (long long)plan[dir].engine,
                     plan[dir].tensor_core ? " tc" : "");
            if (rc) {
                fail(nm, sf_cuda_last_error());
                continue;
            }
            std::vector<float> g = downb(outp, nout);
            if (dir == SF_CONV_FWD) {
                if (nhwc)
                    g = to_nchw(g, cc.n, cc.oc, oh, ow);
                check_max(nm, g, yr, tol);
            } else if (dir == SF_CONV_BWD_DATA) {
                if (nhwc)
                    g = to_nchw(g, cc.n, cc.c, cc.h, cc.w);
                check_max(nm, g, dxr, tol);
            } else {
                if (nhwc)
                    g = to_nchw(g, cc.oc, cc.c, cc.k, cc.k);
                check_max(nm, g, dwr, tol);
            }
        }
        /* The fused conv + fp32 bias + ReLU with a bf16 output: it must either
         * compute the right thing or refuse at build time with a message (the
         * callers then fall back to the plain plan and their own epilogue). */
        {
            sf_conv_desc df = d;
            df.fuse_bias = 1;
            df.fuse_relu = 1;
            df.align_b = 16;
            sf_conv_ptrs pfb = pf;
            pfb.b = bb;
            sf_conv_plan plfu;
            cudnnBackendDescriptor_t vfu = NULL;
            snprintf(nm, sizeof nm, "%s fused fwd+bias+relu", name);
            if (sf_conv_plan_build(dnn, &df, SF_CONV_FWD, ws_bytes, tune, tune > 1 ? &pfb : NULL, &plfu) == 0) {
                if (sf_conv_vpack_make(&pfb, &vfu)) {
                    fail(nm, sf_cuda_last_error());
                } else {
                    poison_b(by, ny);
                    const int rc = sf_conv_run(dnn, &plfu, vfu);
                    CU(cudaStreamSynchronize(s));
                    if (rc)
                        fail(nm, sf_cuda_last_error());
                    else {
                        std::vector<float> g = downb(by, ny);
                        if (nhwc)
                            g = to_nchw(g, cc.n, cc.oc, oh, ow);
                        char n2[340];
                        snprintf(n2, sizeof n2, "%s (engine %lld)", nm, (long long)plfu.engine);
                        check_max(n2, g, ybr, tol);
                    }
                    sf_conv_vpack_destroy(vfu);
                }
                sf_conv_plan_destroy(&plfu);
            } else {
                const char *why = sf_cuda_last_error();
                if (!why[0])
                    fail(nm, "plan build returned -1 without an error message");
                else
                    printf("info %s: no plan, falls back (%s)\n", nm, why);
                sf_cuda_clear_error();
            }
        }
        for (int dir = 0; dir < 3; dir++) {
            sf_conv_vpack_destroy(vp[dir]);
            sf_conv_plan_destroy(&plan[dir]);
        }
        cudaFree(bx_mem); cudaFree(bdx_mem); cudaFree(bw); cudaFree(by); cudaFree(bdy); cudaFree(bdw); cudaFree(bb);
        cudaFree(ws);
    }
}

/* Build-time refusals: an unknown dtype is an error with a message, not a plan. */
static void test_conv_bad_dtype(cudnnHandle_t dnn)
{
    sf_conv_desc d;
    memset(&d, 0, sizeof d);
    d.n = 1; d.c = 8; d.h = 8; d.w = 8; d.oc = 8; d.k = 3; d.stride = 1; d.pad = 1;
    d.layout = SF_LAYOUT_NHWC;
    d.dt = (sf_dtype)7;
    d.align_x = d.align_w = d.align_y = 16;
    sf_conv_plan p;
    sf_cuda_clear_error();
    const int rc = sf_conv_plan_build(dnn, &d, SF_CONV_FWD, 1 << 20, 1, NULL, &p);
    if (rc == -1 && sf_cuda_last_error()[0] && !p.plan) {
        printf("ok conv plan refuses dtype 7 (%s)\n", sf_cuda_last_error());
        g_ok++;
    } else {
        fail("conv plan refuses dtype 7", rc ? "no message" : "built a plan");
        if (!rc)
            sf_conv_plan_destroy(&p);
    }
    sf_cuda_clear_error();
}

/* ---- linear ---------------------------------------------------------------- */

/* via_dt: through the _dt launchers with SF_DT_F32 (which must be the float
 * functions exactly) instead of the float ones. */
static void test_linear(cublasHandle_t blas, cudaStream_t s, int n, int in, int out, int tf32, int via_dt)
{
    char name[160], nm[200];
    snprintf(name, sizeof name, "linear n%d in%d out%d %s%s", n, in, out, tf32 ? "tf32" : "fp32",
             via_dt ? " via _dt(SF_DT_F32)" : "");
    const double tol = tf32 ? 1e-3 : 1e-4;
    std::vector<float> x((size_t)n * in), w((size_t)out * in), b(out), dy((size_t)n * out);
    rand_fill(x, 1.f);
    rand_fill(w, 0.5f);
    rand_fill(b, 0.5f);
    rand_fill(dy, 1.f);
    std::vector<double> xd = to_d(x), wd = to_d(w), bd = to_d(b), dyd = to_d(dy);
    std::vector<double> yr((size_t)n * out), dxr((size_t)n * in), dwr((size_t)out * in), dbr(out);
    sf_ref_linear_fwd_f64(xd.data(), n, in, wd.data(), bd.data(), out, yr.data());
    sf_ref_linear_bwd_f64(xd.data(), n, in, wd.data(), out, dyd.data(), dxr.data(), dwr.data(), dbr.data());
    float *dx = dalloc<float>(x.size()), *dw = dalloc<float>(w.size()), *db = dalloc<float>(out),
          *ddy = dalloc<float>(dy.size()), *y = dalloc<float>(yr.size()), *gx = dalloc<float>(x.size()),
          *gw = dalloc<float>(w.size()), *gb = dalloc<float>(out), *scr = dalloc<float>(sf_cuda_bias_grad_scratch(out));
    up(dx, x);
    up(dw, w);
    up(db, b);
    up(ddy, dy);
    poison(y, yr.size());
    poison(gx, x.size());
    poison(gw, w.size());
    poison(gb, out);
    int rc = (via_dt ? sf_linear_fwd_dt(blas, SF_DT_F32, dx, n, in, dw, out, y, tf32)
                     : sf_linear_fwd(blas, dx, n, in, dw, out, y, tf32)) ||
             sf_cuda_bias_act(y, db, n, out, 1, 0, s);
    CU(cudaStreamSynchronize(s));
    snprintf(nm, sizeof nm, "%s fwd+bias", name);
    if (rc)
        fail(nm, sf_cuda_last_error());
    else
        check_f(nm, down(y, yr.size()).data(), yr, tol);
    rc = via_dt ? sf_linear_bwd_data_dt(blas, SF_DT_F32, ddy, n, in, dw, out, gx, tf32)
                : sf_linear_bwd_data(blas, ddy, n, in, dw, out, gx, tf32);
    CU(cudaStreamSynchronize(s));
    snprintf(nm, sizeof nm, "%s bwd_data", name);
    if (rc)
        fail(nm, sf_cuda_last_error());
    else
        check_f(nm, down(gx, x.size()).data(), dxr, tol);
    rc = via_dt ? sf_linear_bwd_filter_dt(blas, SF_DT_F32, dx, n, in, ddy, out, gw, tf32)
                : sf_linear_bwd_filter(blas, dx, n, in, ddy, out, gw, tf32);
    CU(cudaStreamSynchronize(s));
    snprintf(nm, sizeof nm, "%s bwd_filter", name);
    if (rc)
        fail(nm, sf_cuda_last_error());
    else
        check_f(nm, down(gw, w.size()).data(), dwr, tol);
    rc = sf_cuda_bias_grad(ddy, NULL, n, out, 1, gb, scr, s);
    CU(cudaStreamSynchronize(s));
    snprintf(nm, sizeof nm, "%s bias_grad", name);
    if (rc)
        fail(nm, sf_cuda_last_error());
    else
        check_f(nm, down(gb, out).data(), dbr, 1e-5);
    cudaFree(dx); cudaFree(dw); cudaFree(db); cudaFree(ddy); cudaFree(y); cudaFree(gx); cudaFree(gw); cudaFree(gb);
    cudaFree(scr);
}

/* bf16 linear layer: x, w, dy bf16 (rounded on the host first), y and dx bf16,
 * dw fp32, against the double reference on the same values. y and dx: the
 * bf16 criterion (check_max, 1e-2: fp32 accumulation plus one bf16 rounding).
 * dw is fp32 with no output rounding, and each product of two bf16 values is
 * exact in fp32, so only the fp32 sum's rounding is left: tol 1e-3 of max|ref|
 * (a dw rounded through bf16 on the way, up to 3.9e-3, would typically fail). */
static void test_linear_bf16(cublasHandle_t blas, cudaStream_t s, int n, int in, int out)
{
    char name[160], nm[200];
    snprintf(name, sizeof name, "linear n%d in%d out%d bf16", n, in, out);
    std::vector<float> x((size_t)n * in), w((size_t)out * in), dy((size_t)n * out);
    rand_fill(x, 1.f);
    rand_fill(w, 0.5f);
    rand_fill(dy, 1.f);
    round_bf16(x);
    round_bf16(w);
    round_bf16(dy);
    std::vector<double> xd = to_d(x), wd = to_d(w), dyd = to_d(dy);
    std::vector<double> yr((size_t)n * out), dxr((size_t)n * in), dwr((size_t)out * in);
    sf_ref_linear_fwd_f64(xd.data(), n, in, wd.data(), NULL, out, yr.data());
    sf_ref_linear_bwd_f64(xd.data(), n, in, wd.data(), out, dyd.data(), dxr.data(), dwr.data(), NULL);
    uint16_t *bx = dalloc<uint16_t>(x.size()), *bw = dalloc<uint16_t>(w.size()), *bdy = dalloc<uint16_t>(dy.size()),
             *by = dalloc<uint16_t>(yr.size()), *bgx = dalloc<uint16_t>(x.size());
    float *gw = dalloc<float>(w.size());
    upb(bx, x);
    upb(bw, w);
    upb(bdy, dy);
    poison_b(by, yr.size());
    poison_b(bgx, x.size());
    poison(gw, w.size());
    int rc = sf_linear_fwd_dt(blas, SF_DT_BF16, bx, n, in, bw, out, by, 0);
    CU(cudaStreamSynchronize(s));
    snprintf(nm, sizeof nm, "%s fwd", name);
    if (rc)
        fail(nm, sf_cuda_last_error());
    else
        check_max(nm, downb(by, yr.size()), yr, 1e-2);
    rc = sf_linear_bwd_data_dt(blas, SF_DT_BF16, bdy, n, in, bw, out, bgx, 0);
    CU(cudaStreamSynchronize(s));
    snprintf(nm, sizeof nm, "%s bwd_data", name);
    if (rc)
        fail(nm, sf_cuda_last_error());
    else
        check_max(nm, downb(bgx, x.size()), dxr, 1e-2);
    /* tf32 = 1 here: it must not matter for bf16 operands */
    rc = sf_linear_bwd_filter_dt(blas, SF_DT_BF16, bx, n, in, bdy, out, gw, 1);
    CU(cudaStreamSynchronize(s));
    snprintf(nm, sizeof nm, "%s bwd_filter (fp32 dw)", name);
    if (rc)
        fail(nm, sf_cuda_last_error());
    else
        check_max(nm, down(gw, w.size()), dwr, 1e-3);
    cudaFree(bx); cudaFree(bw); cudaFree(bdy); cudaFree(by); cudaFree(bgx); cudaFree(gw);
}

/* The _dt launchers refuse an unknown dtype with a message, touching nothing. */
static void test_linear_bad_dtype(cublasHandle_t blas)
{
    float *p = dalloc<float>(64);
    sf_cuda_clear_error();
    const int a = sf_linear_fwd_dt(blas, (sf_dtype)7, p, 2, 4, p, 4, p, 0);
    const int b = sf_linear_bwd_data_dt(blas, (sf_dtype)7, p, 2, 4, p, 4, p, 0);
    const int c = sf_linear_bwd_filter_dt(blas, (sf_dtype)7, p, 2, 4, p, 4, p, 0);
    if (a == -1 && b == -1 && c == -1 && sf_cuda_last_error()[0]) {
        printf("ok linear _dt refuse dtype 7 (%s)\n", sf_cuda_last_error());
        g_ok++;
    } else {
        fail("linear _dt refuse dtype 7", "accepted");
    }
    sf_cuda_clear_error();
    cudaFree(p);
}

/* ---- pointwise, reductions, loss, optimizer -------------------------------- */

static void test_relu(cudaStream_t s, size_t len)
{
    char nm[100];
    std::vector<float> x(len), dy(len);
    rand_fill(x, 1.f);
    rand_fill(dy, 1.f);
    std::vector<double> yr(len), dxr(len);
    std::vector<double> xd = to_d(x), dyd = to_d(dy);
    sf_ref_relu_fwd_f64(xd.data(), len, yr.data());
    sf_ref_relu_bwd_f64(yr.data(), dyd.data(), len, dxr.data());
    float *dx = dalloc<float>(len), *dyv = dalloc<float>(len), *y = dalloc<float>(len), *g = dalloc<float>(len);
    up(dx, x);
    up(dyv, dy);
    poison(y, len);
    poison(g, len);
    int rc = sf_cuda_relu_fwd(dx, y, len, s);
    CU(cudaStreamSynchronize(s));
    snprintf(nm, sizeof nm, "relu_fwd len %zu", len);
    if (rc) fail(nm, sf_cuda_last_error()); else check_f(nm, down(y, len).data(), yr, 1e-5);
    rc = sf_cuda_relu_bwd(y, dyv, g, len, s);
    CU(cudaStreamSynchronize(s));
    snprintf(nm, sizeof nm, "relu_bwd len %zu", len);
    if (rc) fail(nm, sf_cuda_last_error()); else check_f(nm, down(g, len).data(), dxr, 1e-5);
    rc = sf_cuda_relu_bwd(y, dyv, dyv, len, s); /* in place */
    CU(cudaStreamSynchronize(s));
    snprintf(nm, sizeof nm, "relu_bwd in place len %zu", len);
    if (rc) fail(nm, sf_cuda_last_error()); else check_f(nm, down(dyv, len).data(), dxr, 1e-5);
    cudaFree(dx); cudaFree(dyv); cudaFree(y); cudaFree(g);
}

static void test_bias_grad(cudaStream_t s, size_t outer, int c, size_t inner)
{
    char nm[120];
    snprintf(nm, sizeof nm, "bias_grad outer %zu c %d inner %zu", outer, c, inner);
    const size_t len = outer * c * inner;
    std::vector<float> dy(len);
    rand_fill(dy, 1.f);
    std::vector<double> ref(c, 0.0);
    for (size_t o = 0; o < outer; o++)
        for (int ci = 0; ci < c; ci++)
            for (size_t i = 0; i < inner; i++)
                ref[ci] += dy[(o * c + ci) * inner + i];
    float *d = dalloc<float>(len), *db = dalloc<float>(c), *scr = dalloc<float>(sf_cuda_bias_grad_scratch(c));
    up(d, dy);
    poison(db, c);
    int rc = sf_cuda_bias_grad(d, NULL, outer, c, inner, db, scr, s);
    CU(cudaStreamSynchronize(s));
    if (rc) fail(nm, sf_cuda_last_error()); else check_f(nm, down(db, c).data(), ref, 1e-5);
    cudaFree(d); cudaFree(db); cudaFree(scr);
}

static void test_xent(cudaStream_t s, int n, int k)
{
    char nm[100];
    std::vector<float> l((size_t)n * k);
    rand_fill(l, 3.f);
    std::vector<int32_t> lab(n);
    for (int i = 0; i < n; i++)
        lab[i] = (int32_t)(sf_hash4(g_seed, i, 5, 5) % (uint64_t)k);
    g_seed++;
    std::vector<double> ld = to_d(l), dref((size_t)n * k);
    double lref;
    int cref;
    sf_ref_xent_f64(ld.data(), lab.data(), n, k, &lref, dref.data(), &cref);
    float *dl = dalloc<float>(l.size()), *dd = dalloc<float>(l.size());
    int32_t *dlab = dalloc<int32_t>(n);
    sf_xent_out *out = dalloc<sf_xent_out>(1);
    up(dl, l);
    CU(cudaMemcpy(dlab, lab.data(), 4 * n, cudaMemcpyHostToDevice));
    poison(dd, l.size());
    CU(cudaMemset(out, 0xff, sizeof *out));
    int rc = sf_cuda_xent(dl, dlab, n, k, dd, out, s);
    CU(cudaStreamSynchronize(s));
    snprintf(nm, sizeof nm, "xent n%d k%d", n, k);
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        sf_xent_out h;
        CU(cudaMemcpy(&h, out, sizeof h, cudaMemcpyDeviceToHost));
        char n2[140];
        snprintf(n2, sizeof n2, "%s loss", nm);
        check(n2, &h.loss, &lref, 1, 1e-5);
        snprintf(n2, sizeof n2, "%s dlogits", nm);
        check_f(n2, down(dd, l.size()).data(), dref, 1e-5);
        snprintf(n2, sizeof n2, "%s correct", nm);
        if (h.correct == cref && h.bad == 0) {
            printf("ok %s (%d)\n", n2, cref);
            g_ok++;
        } else {
            char why[80];
            snprintf(why, sizeof why, "correct %d vs %d, bad %d", h.correct, cref, h.bad);
            fail(n2, why);
        }
    }
    cudaFree(dl); cudaFree(dd); cudaFree(dlab); cudaFree(out);
}

static void test_labels(cudaStream_t s)
{
    const int n = 37;
    uint8_t u8[n];
    int32_t i32[n];
    int64_t i64[n];
    for (int i = 0; i < n; i++) {
        u8[i] = (uint8_t)(i * 7 % 10);
        i32[i] = i * 3 % 10;
        i64[i] = i * 5 % 10;
    }
    const void *src[3] = {u8, i32, i64};
    const size_t sz[3] = {1, 4, 8};
    for (int d = 0; d < 3; d++) {
        void *dsrc = dalloc<char>(n * sz[d]);
        int32_t *dst = dalloc<int32_t>(n);
        CU(cudaMemcpy(dsrc, src[d], n * sz[d], cudaMemcpyHostToDevice));
        CU(cudaMemset(dst, 0xff, 4 * n));
        int rc = sf_cuda_labels_i32(dsrc, d, n, dst, s);
        CU(cudaStreamSynchronize(s));
        int32_t got[n];
        CU(cudaMemcpy(got, dst, 4 * n, cudaMemcpyDeviceToHost));
        int ok = rc == 0;
        for (int i = 0; ok && i < n; i++) {
            int64_t want = d == 0 ? u8[i] : d == 1 ? i32[i] : i64[i];
            ok = got[i] == want;
        }
        char nm[60];
        snprintf(nm, sizeof nm, "labels_i32 dtype %d", d);
        if (ok) {
            printf("ok %s\n", nm);
            g_ok++;
        } else {
            fail(nm, "mismatch");
        }
        cudaFree(dsrc);
        cudaFree(dst);
    }
}

/* SGD over a flat buffer with KRSC segments; compared bit for bit with sf_ref_sgd. */
static void test_sgd(cudaStream_t s, float momentum)
{
    char nm[100];
    snprintf(nm, sizeof nm, "sgd momentum %g with KRSC segments", momentum);
    /* layout: 13 loose floats, a conv weight [6][5][2][2] at 13, 7 floats, a conv
     * weight [4][3][3][3] at 140, then loose floats to an odd total. */
    sf_sgd_segs segs;
    memset(&segs, 0, sizeof segs);
    segs.n = 2;
    segs.s[0].off = 13; segs.s[0].len = 6 * 5 * 4; segs.s[0].c = 5; segs.s[0].rs = 4;
    segs.s[1].off = 140; segs.s[1].len = 4 * 3 * 9; segs.s[1].c = 3; segs.s[1].rs = 9;
    const size_t len = 100003;
    std::vector<float> p(len), g(len), m(len);
    rand_fill(p, 1.f);
    rand_fill(g, 1.f);
    rand_fill(m, 1.f);
    /* device-layout gradient */
    std::vector<float> gdev = g;
    auto perm = [&](const sf_perm_seg &sg, size_t i) {
        size_t r = i - sg.off, crs = (size_t)sg.c * sg.rs, o = r / crs, rem = r % crs, ci = rem / sg.rs, t = rem % sg.rs;
        return sg.off + o * crs + t * sg.c + ci;
    };
    for (int k = 0; k < segs.n; k++)
        for (size_t i = segs.s[k].off; i < segs.s[k].off + segs.s[k].len; i++)
            gdev[perm(segs.s[k], i)] = g[i];
    const float lr = 0.05f, wd = 1e-3f;
    std::vector<float> pr = p, mr = m;
    sf_ref_sgd(pr.data(), g.data(), mr.data(), len, lr, momentum, wd);
    float *dp = dalloc<float>(len), *dg = dalloc<float>(len), *dm = dalloc<float>(len), *dw = dalloc<float>(len);
    sf_sgd_hyper *hp = dalloc<sf_sgd_hyper>(1);
    sf_sgd_hyper h = {lr, momentum, wd, 0.f};
    CU(cudaMemcpy(hp, &h, sizeof h, cudaMemcpyHostToDevice));
    up(dp, p);
    up(dg, gdev);
    up(dm, m);
    poison(dw, len);
    int rc = sf_cuda_sgd(dp, dg, dm, dw, len, hp, &segs, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> pg = down(dp, len), mg = down(dm, len), wg = down(dw, len);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < len; i++)
            if (memcmp(&pg[i], &pr[i], 4) || (momentum != 0.f && memcmp(&mg[i], &mr[i], 4))) {
                if (!bad++)
                    first = i;
            }
        for (int k = 0; k < segs.n; k++)
            for (size_t i = segs.s[k].off; i < segs.s[k].off + segs.s[k].len; i++)
                if (memcmp(&wg[perm(segs.s[k], i)], &pr[i], 4)) {
                    if (!bad++)
                        first = i;
                }
        if (!bad) {
            printf("ok %s (bit-exact)\n", nm);
            g_ok++;
        } else {
            char why[160];
            snprintf(why, sizeof why, "%zu elements differ, first %zu: p %g vs %g", bad, first, pg[first], pr[first]);
            fail(nm, why);
        }
    }
    cudaFree(dp); cudaFree(dg); cudaFree(dm); cudaFree(dw); cudaFree(hp);
}

static void test_transpose(cudaStream_t s, int batch, int rows, int cols)
{
    char nm[80];
    snprintf(nm, sizeof nm, "transpose %dx%dx%d", batch, rows, cols);
    const size_t len = (size_t)batch * rows * cols;
    std::vector<float> x(len);
    rand_fill(x, 1.f);
    std::vector<double> ref(len);
    for (int b = 0; b < batch; b++)
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++)
                ref[((size_t)b * cols + c) * rows + r] = x[((size_t)b * rows + r) * cols + c];
    float *dx = dalloc<float>(len), *dy = dalloc<float>(len);
    up(dx, x);
    poison(dy, len);
    int rc = sf_cuda_transpose(dx, dy, batch, rows, cols, s);
    CU(cudaStreamSynchronize(s));
    if (rc) fail(nm, sf_cuda_last_error()); else check_f(nm, down(dy, len).data(), ref, 1e-7);
    cudaFree(dx);
    cudaFree(dy);
}

/* ---- throughput (informational) ---------------------------------------------
 * ResNet-18's convolutions at batch 256 with their true spatial sizes (224x224
 * input: stem 224 -> 112, layer1 56, layer2 28, layer3 14, layer4 7), each
 * direction, in bf16 NHWC (KRSC), tf32 NHWC and tf32 NCHW (KCRS), with plans
 * chosen as the backend does (SF_CUDNN_TUNE's default of 8 candidates timed,
 * 512 MiB workspace limit). Prints time, engine and TFLOP/s; asserts nothing.
 * Skipped with --quick. */

__global__ void k_fill_bf16(uint16_t *p, size_t len, uint64_t seed)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len)
        p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(sf_u01(sf_hash4(seed, i, 0xbf16, 0)) * 2.f - 1.f));
}

struct rn_conv {
    const char *name;
    int c, h, oc, k, stride, pad;
    int count; /* convolutions of this shape in ResNet-18 */
};

static const rn_conv g_rn18[] = {
    {"conv1 7x7/2", 3, 224, 64, 7, 2, 3, 1},
    {"layer1 3x3", 64, 56, 64, 3, 1, 1, 4},
    {"layer2.0 3x3/2", 64, 56, 128, 3, 2, 1, 1},
    {"layer2.0 down 1x1/2", 64, 56, 128, 1, 2, 0, 1},
    {"layer2 3x3", 128, 28, 128, 3, 1, 1, 3},
    {"layer3.0 3x3/2", 128, 28, 256, 3, 2, 1, 1},
    {"layer3.0 down 1x1/2", 128, 28, 256, 1, 2, 0, 1},
    {"layer3 3x3", 256, 14, 256, 3, 1, 1, 3},
    {"layer4.0 3x3/2", 256, 14, 512, 3, 2, 1, 1},
    {"layer4.0 down 1x1/2", 256, 14, 512, 1, 2, 0, 1},
    {"layer4 3x3", 512, 7, 512, 3, 1, 1, 3},
};

static void perf_resnet18(cudnnHandle_t dnn, cudaStream_t s, int batch)
{
    const int nshape = (int)(sizeof g_rn18 / sizeof g_rn18[0]);
    size_t mx = 0, my = 0, mw = 0;
    for (int i = 0; i < nshape; i++) {
        const rn_conv &r = g_rn18[i];
        const size_t oh = (size_t)(r.h + 2 * r.pad - r.k) / r.stride + 1;
        mx = std::max(mx, (size_t)batch * r.c * r.h * r.h);
        my = std::max(my, (size_t)batch * r.oc * oh * oh);
        mw = std::max(mw, (size_t)r.oc * r.c * r.k * r.k);
    }
    /* Buffers sized for fp32; bf16 uses the first half of each. */
    float *x = dalloc<float>(mx), *dx = dalloc<float>(mx), *y = dalloc<float>(my), *dy = dalloc<float>(my),
          *w = dalloc<float>(mw), *dw = dalloc<float>(mw);
    const size_t ws_bytes = (size_t)512 << 20;
    void *ws = dalloc<char>(ws_bytes);
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    struct cfg_t {
        const char *name;
        sf_dtype dt;
        sf_layout lay;
        int tf32;
    } cfgs[3] = {{"bf16 nhwc", SF_DT_BF16, SF_LAYOUT_NHWC, 0},
                 {"tf32 nhwc", SF_DT_F32, SF_LAYOUT_NHWC, 1},
                 {"tf32 nchw", SF_DT_F32, SF_LAYOUT_NCHW, 1}};
    static const char *dn[3] = {"fwd", "dgrad", "wgrad"};
    double total_ms[3] = {0, 0, 0};
    int total_ok[3] = {1, 1, 1};
    printf("perf: ResNet-18 convolutions, batch %d, 224x224; plans tuned over 8 candidates, ws <= 512 MiB\n", batch);
    const uint64_t t0 = now_ns();
    for (int ci = 0; ci < 3; ci++) {
        /* fresh random data per configuration (the data type differs) */
        const cfg_t &cf = cfgs[ci];
        if (cf.dt == SF_DT_BF16) {
            uint16_t *bufs[6] = {(uint16_t *)x, (uint16_t *)dx, (uint16_t *)y, (uint16_t *)dy, (uint16_t *)w,
                                 (uint16_t *)dw};
            const size_t lens[6] = {mx, mx, my, my, mw, mw};
            for (int k = 0; k < 6; k++) {
                k_fill_bf16<<<(unsigned)((lens[k] + 255) / 256), 256, 0, s>>>(bufs[k], lens[k], 100 + k);
                CU(cudaGetLastError());
            }
        } else {
            float *bufs[6] = {x, dx, y, dy, w, dw};
            const size_t lens[6] = {mx, mx, my, my, mw, mw};
            for (int k = 0; k < 6; k++)
                if (sf_cuda_fill_random(bufs[k], lens[k], 100 + k, 1.f, s)) {
                    printf("info perf: fill: %s\n", sf_cuda_last_error());
                    return;
                }
        }
        CU(cudaStreamSynchronize(s));
        for (int i = 0; i < nshape; i++) {
            const rn_conv &r = g_rn18[i];
            const int oh = (r.h + 2 * r.pad - r.k) / r.stride + 1;
            const double flop = 2.0 * batch * oh * oh * (double)r.oc * r.c * r.k * r.k;
            sf_conv_desc d;
            memset(&d, 0, sizeof d);
            d.n = batch; d.c = r.c; d.h = r.h; d.w = r.h; d.oc = r.oc; d.k = r.k; d.stride = r.stride; d.pad = r.pad;
            d.layout = cf.lay;
            d.tf32 = cf.tf32;
            d.dt = cf.dt;
            d.align_x = d.align_w = d.align_y = 16;
            sf_conv_ptrs pf = {x, w, y, ws, NULL}, pd = {dx, w, dy, ws, NULL}, pw = {x, dw, dy, ws, NULL};
            const sf_conv_ptrs *ptrs[3] = {&pf, &pd, &pw};
            for (int dir = 0; dir < 3; dir++) {
                sf_conv_plan p;
                cudnnBackendDescriptor_t vp = NULL;
                if (sf_conv_plan_build(dnn, &d, (sf_conv_dir)dir, ws_bytes, 8, ptrs[dir], &p)) {
                    printf("info perf %-20s %s %s: no plan (%s)\n", r.name, dn[dir], cf.name, sf_cuda_last_error());
                    sf_cuda_clear_error();
                    total_ok[ci] = 0;
                    continue;
                }
                if (sf_conv_vpack_make(ptrs[dir], &vp)) {
                    printf("info perf %-20s %s %s: %s\n", r.name, dn[dir], cf.name, sf_cuda_last_error());
                    sf_cuda_clear_error();
                    sf_conv_plan_destroy(&p);
                    total_ok[ci] = 0;
                    continue;
                }
                /* one warm-up, then enough runs for ~20 ms (at least 3, at most 50) */
                int rc = sf_conv_run(dnn, &p, vp);
                CU(cudaStreamSynchronize(s));
                const int reps = p.ms > 0.f ? std::min(50, std::max(3, (int)(20.f / p.ms))) : 5;
                CU(cudaEventRecord(e0, s));
                for (int k = 0; k < reps && !rc; k++)
                    rc = sf_conv_run(dnn, &p, vp);
                CU(cudaEventRecord(e1, s));
                CU(cudaEventSynchronize(e1));
                float ms = 0.f;
                CU(cudaEventElapsedTime(&ms, e0, e1));
                ms /= (float)reps;
                if (rc) {
                    printf("info perf %-20s %s %s: run failed (%s)\n", r.name, dn[dir], cf.name, sf_cuda_last_error());
                    sf_cuda_clear_error();
                    total_ok[ci] = 0;
                } else {
                    printf("perf %-20s n%d %3d->%-3d %3dx%-3d %-5s %s: %8.3f ms %7.1f TFLOP/s  engine %lld%s (%s, of %d)\n",
                           r.name, batch, r.c, r.oc, r.h, r.h, dn[dir], cf.name, ms, flop / (ms * 1e-3) / 1e12,
                           (long long)p.engine, p.tensor_core ? " tc" : "", sf_conv_prec_name(p.dt, p.tensor_core),
                           p.tried);
                    /* the network never needs the stem's input gradient */
                    if (!(i == 0 && dir == SF_CONV_BWD_DATA))
                        total_ms[ci] += ms * r.count;
                }
                fflush(stdout);
                sf_conv_vpack_destroy(vp);
                sf_conv_plan_destroy(&p);
            }
        }
    }
    for (int ci = 0; ci < 3; ci++)
        printf("perf ResNet-18 conv total (fwd + dgrad + wgrad, layer counts, no stem dgrad), batch %d, %s: %.2f ms%s\n",
               batch, cfgs[ci].name, total_ms[ci], total_ok[ci] ? "" : " (incomplete: some plans missing)");
    printf("perf: %.1f s including plan tuning\n", (double)(now_ns() - t0) * 1e-9);
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    cudaFree(x); cudaFree(dx); cudaFree(y); cudaFree(dy); cudaFree(w); cudaFree(dw); cudaFree(ws);
}

int main(int argc, char **argv)
{
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("SKIPPED: no CUDA device\n");
        return 0;
    }
    CU(cudaSetDevice(0));
    /* A blocking stream: the uploads and NaN fills below go through the legacy
     * stream (cudaMemcpy, cudaMemset), which such a stream waits for. */
    cudaStream_t s;
    CU(cudaStreamCreate(&s));
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    if (cudnnCreate(&dnn) != CUDNN_STATUS_SUCCESS || cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
        printf("FAIL setup: cudnnCreate/cublasCreate\n");
        return 1;
    }
    cudnnSetStream(dnn, s);
    cublasSetStream(blas, s);
    void *bws = dalloc<char>((size_t)32 << 20);
    cublasSetWorkspace(blas, bws, (size_t)32 << 20);
    printf("cuDNN %zu, cuBLAS handle ready\n", cudnnGetVersion());

    const conv_case cases[] = {
        {3, 16, 32, 32, 32, 2, 2, 0},  /* a W1 block */
        {4, 3, 20, 20, 16, 1, 1, 0},   /* W1's first conv */
        {2, 3, 17, 13, 5, 3, 1, 1},    /* odd sizes, padding */
        {2, 7, 9, 11, 6, 3, 2, 1},     /* stride and padding */
        {3, 5, 15, 14, 4, 5, 3, 2},    /* k5 s3 p2 */
        {5, 64, 4, 4, 128, 2, 2, 0},   /* deep, tiny spatial */
        {32, 256, 2, 2, 512, 2, 2, 0}, /* W1's tail shape, 1x1 output */
    };
    for (const conv_case &cc : cases)
        for (int lay = 0; lay < 2; lay++)
            for (int tf32 = 0; tf32 < 2; tf32++)
                test_conv(dnn, s, cc, (sf_layout)lay, tf32, 1);
    /* the timed choice among several engines, as the backend builds it */
    test_conv(dnn, s, cases[0], SF_LAYOUT_NHWC, 1, 4);
    test_conv(dnn, s, cases[3], SF_LAYOUT_NCHW, 0, 4);

    /* bf16 convolutions: small and odd shapes, then ResNet-18's shapes with
     * batch and spatial size scaled down (stem 7x7/2 3->64, 3x3 64->64, 3x3/2
     * 64->128, 1x1/2 64->128 downsample, 3x3 512->512 at 7x7) */
    const conv_case bf16_cases[] = {
        {3, 16, 32, 32, 32, 2, 2, 0},  /* a W1 block */
        {2, 3, 17, 13, 5, 3, 1, 1},    /* odd sizes, padding, 3 channels */
        {2, 7, 9, 11, 6, 3, 2, 1},     /* stride and padding, odd channels */
        {5, 64, 4, 4, 128, 2, 2, 0},   /* deep, tiny spatial */
        {2, 3, 32, 32, 64, 7, 2, 3},   /* ResNet-18 stem (224 -> 32) */
        {2, 64, 14, 14, 64, 3, 1, 1},  /* layer1 3x3 (56 -> 14) */
        {2, 64, 14, 14, 128, 3, 2, 1}, /* layer2.0 3x3/2 */
        {2, 64, 14, 14, 128, 1, 2, 0}, /* layer2.0 downsample 1x1/2 */
        {2, 512, 7, 7, 512, 3, 1, 1},  /* layer4 3x3 at its true 7x7 */
    };
    for (const conv_case &cc : bf16_cases)
        test_conv_bf16(dnn, s, cc, 1, 0);
    /* the timed choice, and an x pointer aligned to 2 bytes only */
    test_conv_bf16(dnn, s, bf16_cases[5], 4, 0);
    test_conv_bf16(dnn, s, conv_case{2, 16, 12, 12, 16, 3, 1, 1}, 1, 1);
    test_conv_bad_dtype(dnn);

    for (int tf32 = 0; tf32 < 2; tf32++)
        for (int via_dt = 0; via_dt < 2; via_dt++) {
            test_linear(blas, s, 5, 37, 11, tf32, via_dt);
            test_linear(blas, s, 32, 4096, 10, tf32, via_dt);
            test_linear(blas, s, 3, 1, 7, tf32, via_dt);
        }
    test_linear_bf16(blas, s, 5, 37, 11);
    test_linear_bf16(blas, s, 3, 1, 7);
    test_linear_bf16(blas, s, 32, 4096, 10);
    test_linear_bf16(blas, s, 256, 512, 1000); /* ResNet-18's classifier */
    test_linear_bad_dtype(blas);
    test_relu(s, 1001);
    test_relu(s, 1 << 16);
    test_bias_grad(s, 100003, 16, 1);
    test_bias_grad(s, 7, 4096, 1);
    test_bias_grad(s, 33, 3, 1);
    test_bias_grad(s, 3, 5, 17);
    test_bias_grad(s, 32, 16, 4096);
    test_bias_grad(s, 9, 10, 1);
    test_xent(s, 37, 10);
    test_xent(s, 5, 1000);
    test_xent(s, 300, 3);
    test_labels(s);
    test_sgd(s, 0.9f);
    test_sgd(s, 0.f);
    test_transpose(s, 3, 37, 45);
    test_transpose(s, 2, 4096, 3);

    if (!quick)
        perf_resnet18(dnn, s, 256);

    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("FAIL device: %s\n", cudaGetErrorString(e));
        g_fail++;
    }
    printf("test_layers: %d ok, %d failed\n", g_ok, g_fail);
    return g_fail ? 1 : 0;
}
