/* tests/gpu/ops/conv.cu — the cuDNN convolutions of gpu/cuda/conv.h against
 * the double-precision reference (sf_ref_conv2d_*), forward, backward-data and
 * backward-filter, and backward-data adding into what dx holds (beta 1): both
 * activation layouts (NCHW with KCRS filters, NHWC with KRSC filters), fp32 and tf32 (relative error), odd sizes, stride and
 * padding variants, the timed engine choice; bf16 in both layouts and all
 * three directions (max |out - ref| of max |ref|: check_max), a 2-byte
 * aligned x, and a refused unknown element type; the thin 1x1 kernels
 * (conv_thin.h: forward with bias and ReLU, the one-pass backward) in fp32
 * and bf16, both layouts, with and without bias,
 * ReLU and dx, up to the shape where the backward's block count saturates;
 * the space-to-depth form of strided few-channel convolutions (conv_s2d.h:
 * the rearranged input bit for bit against its definition, the forward and
 * the gathered filter gradient against the reference, fp32 and bf16);
 * grouped, depthwise and dilated convolutions (sf_conv_desc.groups, .dilation)
 * in every direction, fp32, tf32 and bf16, both layouts. Each case's bounds
 * are its row's (op_cases.cu), the outputs' through check_gemm. *
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/conv_patch.h"
#include "gpu/cuda/conv_s2d.h"
#include "gpu/cuda/conv_thin.h"

struct conv_case {
    int n, c, h, w, oc, k, stride, pad;
};

/* One shape in one element type and layout: forward, backward-data and
 * backward-filter against the double reference on the same values (the
 * reference's inputs rounded to bf16 first in bf16, so they add no error).
 * fp32 and tf32: relative error within tol, and also the separate bias +
 * ReLU epilogue, the bias gradient (within tol_param) and the ReLU backward
 * fused with it (dy masked within tol_aux, db within tol_param). bf16 (x, w,
 * y, dy, dx, dw all bf16; fp32 compute): max |out - ref| <= tol * max |ref|
 * (check_max); tf32 = 0 there, since the
 * tf32 flag is about fp32 data and must not keep bf16 off tensor cores. Both:
 * cuDNN's fused conv + fp32 bias + ReLU where an engine builds, and the
 * adding backward-data (against dx0 + the reference's dx, the timed engine
 * where tune > 1) where one builds. misalign: x
 * and dx are bound one element past a 256-byte boundary and declared so
 * (align_x = 2 in bf16), which checks that the alignment fields are taken in
 * bytes for bf16 too. */
static void test_conv(cudnnHandle_t dnn, cudaStream_t s, const op_case &kc, const conv_case &cc, sf_dtype dt,
                      sf_layout lay, int tf32, int tune, int misalign)
{
    const int bf = dt == SF_DT_BF16, nhwc = lay == SF_LAYOUT_NHWC;
    const int oh = (cc.h + 2 * cc.pad - cc.k) / cc.stride + 1, ow = (cc.w + 2 * cc.pad - cc.k) / cc.stride + 1;
    const double tol = kc.tol;
    const size_t nx = (size_t)cc.n * cc.c * cc.h * cc.w, nw = (size_t)cc.oc * cc.c * cc.k * cc.k,
                 ny = (size_t)cc.n * cc.oc * oh * ow;
    std::vector<float> x(nx), wt(nw), b(cc.oc), dy(ny);
    rand_fill_dt(x, dt, 1.f);
    rand_fill_dt(wt, dt, 0.5f);
    rand_fill(b, 0.5f); /* b stays fp32: the epilogues' bias is an fp32 tensor */
    rand_fill_dt(dy, dt, 1.f);

    /* reference in double: the convolution, + bias, relu(conv + bias) */
    std::vector<double> xd = to_d(x), wd = to_d(wt), bd = to_d(b), dyd = to_d(dy);
    std::vector<double> yr(ny), ybr(ny), yrelu(ny), dxr(nx), dwr(nw), dbr(cc.oc);
    sf_ref_conv2d_fwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), NULL, cc.oc, cc.k, cc.stride, cc.pad,
                          yr.data());
    sf_ref_conv2d_bwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), cc.oc, cc.k, cc.stride, cc.pad, dyd.data(),
                          dxr.data(), dwr.data(), dbr.data());
    for (int a = 0; a < cc.n; a++)
        for (int o = 0; o < cc.oc; o++)
            for (int i = 0; i < oh * ow; i++) {
                const size_t e = ((size_t)a * cc.oc + o) * oh * ow + i;
                ybr[e] = yr[e] + bd[o];
                yrelu[e] = ybr[e] < 0 ? 0 : ybr[e];
            }

    char name[200], nm[300];
    snprintf(name, sizeof name, "conv n%d c%d %dx%d oc%d k%d s%d p%d %s %s%s%s", cc.n, cc.c, cc.h, cc.w, cc.oc, cc.k,
             cc.stride, cc.pad, lname(lay), bf ? "bf16" : tf32 ? "tf32" : "fp32", tune > 1 ? " tuned" : "",
             misalign ? " x@+2B" : "");
    /* compares an output, downloaded in the layout's order, with its NCHW reference */
    auto compare = [&](const char *what, std::vector<float> g, int n4, int c4, int h4, int w4,
                       const std::vector<double> &ref, double t) {
        if (nhwc)
            g = to_nchw(g, n4, c4, h4, w4);
        check_gemm(what, dt, g, ref, t);
    };
    dbuf bx = dbuf_make(dt, nx, misalign), bdx = dbuf_make(dt, nx, misalign), bw = dbuf_make(dt, nw, 0),
         by = dbuf_make(dt, ny, 0), bdy = dbuf_make(dt, ny, 0), bdw = dbuf_make(dt, nw, 0);
    float *bb = dalloc<float>(cc.oc), *db = dalloc<float>(cc.oc);
    float *scratch = dalloc<float>(sf_cuda_bias_grad_scratch(cc.oc));
    const size_t ws_bytes = (size_t)256 << 20;
    void *ws = dalloc<char>(ws_bytes);
    up_dt(bx, nhwc ? to_nhwc(x, cc.n, cc.c, cc.h, cc.w) : x);
    up_dt(bw, nhwc ? to_nhwc(wt, cc.oc, cc.c, cc.k, cc.k) : wt);
    up_dt(bdy, nhwc ? to_nhwc(dy, cc.n, cc.oc, oh, ow) : dy);
    up(bb, b);

    sf_conv_desc d;
    memset(&d, 0, sizeof d);
    d.n = cc.n; d.c = cc.c; d.h = cc.h; d.w = cc.w; d.oc = cc.oc; d.k = cc.k; d.stride = cc.stride; d.pad = cc.pad;
    d.layout = lay;
    d.tf32 = tf32;
    d.dt = dt;
    d.align_x = sf_cuda_ptr_align(bx.p);
    d.align_w = d.align_y = 16;
    if (misalign && (d.align_x != 2 || sf_cuda_ptr_align(bdx.p) != 2)) {
        snprintf(nm, sizeof nm, "%s setup", name);
        fail(nm, "x pointer is not 2-byte aligned as intended");
    }
    sf_conv_ptrs pf = {bx.p, bw.p, by.p, ws, NULL}, pd = {bdx.p, bw.p, bdy.p, ws, NULL},
                 pw = {bx.p, bdw.p, bdy.p, ws, NULL};
    const size_t outer = nhwc ? (size_t)cc.n * oh * ow : (size_t)cc.n, inner = nhwc ? 1 : (size_t)oh * ow;
    sf_conv_plan plan[3];
    memset(plan, 0, sizeof plan);
    sf_conv_vpack *vp[3] = {NULL, NULL, NULL};
    const sf_conv_ptrs *ptrs[3] = {&pf, &pd, &pw};
    static const char *dn[3] = {"fwd", "bwd_data", "bwd_filter"};
    int planned[3] = {0, 0, 0};
    for (int dir = 0; dir < 3; dir++) {
        if (sf_conv_plan_build(dnn, &d, (sf_conv_dir)dir, ws_bytes, tune, tune > 1 ? ptrs[dir] : NULL, &plan[dir]) ||
            sf_conv_vpack_make(ptrs[dir], &vp[dir])) {
            snprintf(nm, sizeof nm, "%s %s plan", name, dn[dir]);
            fail(nm, sf_cuda_last_error());
            continue;
        }
        planned[dir] = 1;
        if (plan[dir].dt != dt) {
            snprintf(nm, sizeof nm, "%s %s plan", name, dn[dir]);
            fail(nm, "plan.dt is not the descriptor's");
        }
    }
    /* forward: in fp32 with the separate bias epilogue, then with bias + ReLU
     * (whose output masks the ReLU backward below) */
    std::vector<float> yact;
    if (planned[SF_CONV_FWD]) {
        for (int relu = 0; relu < (bf ? 1 : 2); relu++) {
            poison_dt(by);
            int rc = sf_conv_run(dnn, &plan[SF_CONV_FWD], vp[SF_CONV_FWD]);
            if (!bf)
                rc = rc || sf_cuda_bias_act((float *)by.p, bb, outer, cc.oc, inner, relu, s);
            CU(cudaStreamSynchronize(s));
            if (relu)
                snprintf(nm, sizeof nm, "%s fwd+bias+relu", name);
            else
                snprintf(nm, sizeof nm, "%s %s (engine %lld%s)", name, bf ? "fwd" : "fwd+bias",
                         (long long)plan[SF_CONV_FWD].engine, plan[SF_CONV_FWD].tensor_core ? " tc" : "");
            if (rc) {
                fail(nm, sf_cuda_last_error());
                continue;
            }
            const std::vector<float> g = down_dt(by, ny);
            if (relu)
                yact = g;
            compare(nm, g, cc.n, cc.oc, oh, ow, relu ? yrelu : bf ? yr : ybr, tol);
        }
    }
    /* cuDNN's fused conv + fp32 bias + ReLU: where no engine builds, the
     * callers fall back to the plain plan and their own epilogue; in bf16 the
     * refusal must come with a message */
    {
        sf_conv_desc df = d;
        df.fuse_bias = 1;
        df.fuse_relu = 1;
        df.align_b = 16;
        sf_conv_ptrs pfb = pf;
        pfb.b = bb;
        sf_conv_plan plfu;
        sf_conv_vpack *vfu = NULL;
        snprintf(nm, sizeof nm, "%s fused fwd+bias+relu", name);
        if (sf_conv_plan_build(dnn, &df, SF_CONV_FWD, ws_bytes, tune, tune > 1 ? &pfb : NULL, &plfu) == 0) {
            if (sf_conv_vpack_make(&pfb, &vfu)) {
                fail(nm, sf_cuda_last_error());
            } else {
                poison_dt(by);
                const int rc = sf_conv_run(dnn, &plfu, vfu);
                CU(cudaStreamSynchronize(s));
                if (rc)
                    fail(nm, sf_cuda_last_error());
                else {
                    char n2[340];
                    snprintf(n2, sizeof n2, "%s (engine %lld)", nm, (long long)plfu.engine);
                    compare(n2, down_dt(by, ny), cc.n, cc.oc, oh, ow, yrelu, tol);
                }
                sf_conv_vpack_destroy(vfu);
            }
            sf_conv_plan_destroy(&plfu);
        } else {
            const char *why = sf_cuda_last_error();
            if (bf && !why[0])
                fail(nm, "plan build returned -1 without an error message");
            else
                printf("info %s: no plan, falls back (%s)\n", nm, why);
            sf_cuda_clear_error();
        }
    }
    /* backward data and backward filter */
    for (int dir = SF_CONV_BWD_DATA; dir <= SF_CONV_BWD_FILTER; dir++) {
        if (!planned[dir])
            continue;
        const dbuf &out = dir == SF_CONV_BWD_DATA ? bdx : bdw;
        const size_t nout = dir == SF_CONV_BWD_DATA ? nx : nw;
        poison_dt(out);
        const int rc = sf_conv_run(dnn, &plan[dir], vp[dir]);
        CU(cudaStreamSynchronize(s));
        snprintf(nm, sizeof nm, "%s %s (engine %lld%s)", name, dn[dir], (long long)plan[dir].engine,
                 plan[dir].tensor_core ? " tc" : "");
        if (rc)
            fail(nm, sf_cuda_last_error());
        else if (dir == SF_CONV_BWD_DATA)
            compare(nm, down_dt(out, nout), cc.n, cc.c, cc.h, cc.w, dxr, tol);
        else
            compare(nm, down_dt(out, nout), cc.oc, cc.c, cc.k, cc.k, dwr, tol);
    }
    /* backward-data adding into what dx holds (sf_conv_desc.accumulate, beta
     * 1: a residual block's input gradient); where no engine builds, the
     * executor writes the gradient apart and adds it */
    {
        sf_conv_desc da = d;
        da.accumulate = 1;
        std::vector<float> dx0(nx);
        rand_fill_dt(dx0, dt, 1.f);
        std::vector<double> sum(nx);
        for (size_t e = 0; e < nx; e++)
            sum[e] = dxr[e] + (double)dx0[e];
        sf_conv_plan pla;
        sf_conv_vpack *va = NULL;
        snprintf(nm, sizeof nm, "%s bwd_data+acc", name);
        if (sf_conv_plan_build(dnn, &da, SF_CONV_BWD_DATA, ws_bytes, tune, tune > 1 ? &pd : NULL, &pla) == 0) {
            if (!pla.accumulate)
                fail(nm, "the plan does not say it accumulates");
            if (sf_conv_vpack_make(&pd, &va)) {
                fail(nm, sf_cuda_last_error());
            } else {
                /* dx0 after the timing runs, which added into dx too */
                up_dt(bdx, nhwc ? to_nhwc(dx0, cc.n, cc.c, cc.h, cc.w) : dx0);
                const int rc = sf_conv_run(dnn, &pla, va);
                CU(cudaStreamSynchronize(s));
                if (rc) {
                    fail(nm, sf_cuda_last_error());
                } else {
                    char n2[340];
                    snprintf(n2, sizeof n2, "%s (engine %lld)", nm, (long long)pla.engine);
                    compare(n2, down_dt(bdx, nx), cc.n, cc.c, cc.h, cc.w, sum, tol);
                }
                sf_conv_vpack_destroy(va);
            }
            sf_conv_plan_destroy(&pla);
        } else {
            const char *why = sf_cuda_last_error();
            if (!why[0])
                fail(nm, "plan build returned -1 without an error message");
            else
                printf("info %s: no plan, the executor adds apart (%s)\n", nm, why);
            sf_cuda_clear_error();
        }
    }
    if (!bf && planned[SF_CONV_FWD]) {
        float *ddy = (float *)bdy.p, *y_out = (float *)by.p;
        /* bias gradient (no relu) */
        poison_f(db, cc.oc);
        int rc = sf_cuda_bias_grad(ddy, NULL, outer, cc.oc, inner, db, scratch, s);
        CU(cudaStreamSynchronize(s));
        snprintf(nm, sizeof nm, "%s bias_grad", name);
        if (rc)
            fail(nm, sf_cuda_last_error());
        else
            check_f(nm, down(db, cc.oc).data(), dbr, kc.tol_param);
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
            poison_f(db, cc.oc);
            rc = sf_cuda_bias_grad(ddy, y_out, outer, cc.oc, inner, db, scratch, s);
            CU(cudaStreamSynchronize(s));
            snprintf(nm, sizeof nm, "%s relu_bwd+bias_grad", name);
            if (rc)
                fail(nm, sf_cuda_last_error());
            else {
                compare(nm, down(ddy, ny), cc.n, cc.oc, oh, ow, dymask, kc.tol_aux);
                snprintf(nm, sizeof nm, "%s relu_bwd+bias_grad db", name);
                check_f(nm, down(db, cc.oc).data(), dbmask, kc.tol_param);
            }
        }
    }
    for (int dir = 0; dir < 3; dir++) {
        sf_conv_vpack_destroy(vp[dir]);
        sf_conv_plan_destroy(&plan[dir]);
    }
    dbuf_free(bx); dbuf_free(bdx); dbuf_free(bw); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdw);
    cudaFree(bb); cudaFree(db); cudaFree(scratch); cudaFree(ws);
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

/* The thin 1x1 kernels against the double reference: y = relu?(conv + b),
 * then dw, db, dx from dy masked by y > 0 where the ReLU is fused; each
 * within tol (check_gemm). */
static void test_conv_thin(cudaStream_t s, double tol, int n, int c, int h, int w, int oc, sf_dtype dt, sf_layout lay,
                           int bias, int relu, int want_dx)
{
    const size_t hw = (size_t)h * w, nx = (size_t)n * c * hw, ny = (size_t)n * oc * hw, nw = (size_t)oc * c;
    const int bf = dt == SF_DT_BF16, nhwc = lay == SF_LAYOUT_NHWC;
    std::vector<float> x(nx), wt(nw), b(oc), dy(ny);
    rand_fill(x, 1.f);
    rand_fill(wt, 0.5f);
    rand_fill(b, 0.5f);
    rand_fill(dy, 1.f);
    if (bf) {
        round_bf16(x);
        round_bf16(wt);
        round_bf16(dy);
    }
    std::vector<double> xd = to_d(x), wd = to_d(wt), bd = to_d(b), yr(ny), dyr = to_d(dy), dxr(nx), dwr(nw),
                        dbr(oc, 0.0);
    sf_ref_conv2d_fwd_f64(xd.data(), n, c, h, w, wd.data(), bias ? bd.data() : NULL, oc, 1, 1, 0, yr.data());
    for (size_t e = 0; e < ny; e++) {
        if (relu && yr[e] < 0)
            yr[e] = 0;
        if (relu && !(yr[e] > 0))
            dyr[e] = 0;
    }
    sf_ref_conv2d_bwd_f64(xd.data(), n, c, h, w, wd.data(), oc, 1, 1, 0, dyr.data(), dxr.data(), dwr.data(), NULL);
    for (int a = 0; a < n; a++)
        for (int o = 0; o < oc; o++)
            for (size_t i = 0; i < hw; i++)
                dbr[o] += dyr[((size_t)a * oc + o) * hw + i];
    char name[200], nm[260];
    snprintf(name, sizeof name, "conv thin n%d c%d %dx%d oc%d %s %s%s%s%s", n, c, h, w, oc, lname(lay),
             bf ? "bf16" : "fp32", bias ? " bias" : "", relu ? " relu" : "", want_dx ? " dx" : "");
    std::vector<float> xl = nhwc ? to_nhwc(x, n, c, h, w) : x, dyl = nhwc ? to_nhwc(dy, n, oc, h, w) : dy;
    const size_t es = bf ? 2 : 4;
    void *dx_ = dalloc<char>(nx * es), *dy_ = dalloc<char>(ny * es), *dx2 = dalloc<char>(nx * es),
         *dw_ = dalloc<char>(nw * es), *y_ = dalloc<char>(ny * es), *w_ = dalloc<char>(nw * es);
    float *b_ = dalloc<float>(oc), *db_ = dalloc<float>(oc),
          *scratch = dalloc<float>(sf_conv_thin_scratch_floats(c, oc));
    if (bf) {
        upb((uint16_t *)dx_, xl);
        upb((uint16_t *)w_, wt);
        upb((uint16_t *)dy_, dyl);
        poison_b((uint16_t *)dx2, nx);
        poison_b((uint16_t *)dw_, nw);
    } else {
        up((float *)dx_, xl);
        up((float *)w_, wt);
        up((float *)dy_, dyl);
        poison_f((float *)dx2, nx);
        poison_f((float *)dw_, nw);
    }
    up(b_, b);
    poison_f(db_, oc);
    int rc = sf_conv_thin_fwd(dt, lay, dx_, w_, bias ? b_ : NULL, y_, n, c, hw, oc, relu, s);
    rc = rc || sf_conv_thin_bwd(dt, lay, dx_, w_, relu ? y_ : NULL, dy_, want_dx ? dx2 : NULL, dw_, bias ? db_ : NULL,
                                n, c, hw, oc, scratch, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(name, sf_cuda_last_error());
        return;
    }
    std::vector<float> y = bf ? downb((const uint16_t *)y_, ny) : down((const float *)y_, ny);
    std::vector<float> gdx = bf ? downb((const uint16_t *)dx2, nx) : down((const float *)dx2, nx);
    std::vector<float> gdw = bf ? downb((const uint16_t *)dw_, nw) : down((const float *)dw_, nw);
    std::vector<float> gdb = down(db_, oc);
    if (nhwc) {
        y = to_nchw(y, n, oc, h, w);
        gdx = to_nchw(gdx, n, c, h, w);
    }
    struct {
        const char *what;
        const std::vector<float> *got;
        const std::vector<double> *ref;
        int on;
    } outs[4] = {{"y", &y, &yr, 1}, {"dw", &gdw, &dwr, 1}, {"db", &gdb, &dbr, bias}, {"dx", &gdx, &dxr, want_dx}};
    for (auto &o : outs) {
        if (!o.on)
            continue;
        snprintf(nm, sizeof nm, "%s %s", name, o.what);
        check_gemm(nm, dt, *o.got, *o.ref, tol);
    }
    /* the same inputs give the same bits (the block count depends on the shape) */
    std::vector<float> dw_again;
    if (sf_conv_thin_bwd(dt, lay, dx_, w_, relu ? y_ : NULL, dy_, NULL, dw_, bias ? db_ : NULL, n, c, hw, oc, scratch,
                         s) == 0) {
        CU(cudaStreamSynchronize(s));
        std::vector<float> again = bf ? downb((const uint16_t *)dw_, nw) : down((const float *)dw_, nw);
        snprintf(nm, sizeof nm, "%s dw repeats bit for bit", name);
        pass_or_fail(nm, memcmp(again.data(), gdw.data(), nw * sizeof(float)) == 0, "dw differs between two runs");
    }
    cudaFree(dx_); cudaFree(dy_); cudaFree(dx2); cudaFree(dw_); cudaFree(y_); cudaFree(w_);
    cudaFree(b_); cudaFree(db_); cudaFree(scratch);
}

/* The one-pass backward of a non-overlapping convolution against the double
 * reference: y = relu?(conv + b) from the reference (the kernel's input
 * mask), then dw, db, dx from dy masked by y > 0, within tol. fp32, NHWC,
 * weights KRSC on the device. */
static void test_conv_patch(cudaStream_t s, double tol, int n, int c, int h, int w, int k, int bias, int relu,
                            int want_dx)
{
    const int oc = 32, oh = h / k, ow = w / k;
    const size_t hw = (size_t)h * w, nx = (size_t)n * c * hw, ny = (size_t)n * oc * oh * ow,
                 nw = (size_t)oc * c * k * k, ohw = (size_t)oh * ow;
    std::vector<float> x(nx), wt(nw), b(oc), dy(ny), y(ny);
    rand_fill(x, 1.f);
    rand_fill(wt, 0.5f);
    rand_fill(b, 0.5f);
    rand_fill(dy, 1.f);
    std::vector<double> xd = to_d(x), wd = to_d(wt), bd = to_d(b), yr(ny), dyr = to_d(dy), dxr(nx), dwr(nw),
                        dbr(oc, 0.0);
    sf_ref_conv2d_fwd_f64(xd.data(), n, c, h, w, wd.data(), bias ? bd.data() : NULL, oc, k, k, 0, yr.data());
    for (size_t e = 0; e < ny; e++) {
        y[e] = relu && yr[e] < 0 ? 0.f : (float)yr[e];
        if (relu && !(y[e] > 0.f))
            dyr[e] = 0;
    }
    sf_ref_conv2d_bwd_f64(xd.data(), n, c, h, w, wd.data(), oc, k, k, 0, dyr.data(), dxr.data(), dwr.data(), NULL);
    for (int a = 0; a < n; a++)
        for (int o = 0; o < oc; o++)
            for (size_t i = 0; i < ohw; i++)
                dbr[o] += dyr[((size_t)a * oc + o) * ohw + i];
    char name[200], nm[260];
    snprintf(name, sizeof name, "conv patch n%d c%d %dx%d k%d%s%s%s", n, c, h, w, k, bias ? " bias" : "",
             relu ? " relu" : "", want_dx ? " dx" : "");
    float *x_ = dalloc<float>(nx), *dy_ = dalloc<float>(ny), *dx_ = dalloc<float>(nx), *dw_ = dalloc<float>(nw),
          *y_ = dalloc<float>(ny), *w_ = dalloc<float>(nw), *db_ = dalloc<float>(oc),
          *scratch = dalloc<float>(sf_conv_patch_scratch_floats(c, oc, k));
    up(x_, to_nhwc(x, n, c, h, w));
    up(w_, to_nhwc(wt, oc, c, k, k)); /* KCRS -> KRSC */
    up(dy_, to_nhwc(dy, n, oc, oh, ow));
    up(y_, to_nhwc(y, n, oc, oh, ow));
    poison_f(dx_, nx);
    poison_f(dw_, nw);
    poison_f(db_, oc);
    int rc = sf_conv_patch_bwd(SF_DT_F32, x_, w_, relu ? y_ : NULL, dy_, want_dx ? dx_ : NULL, dw_,
                               bias ? db_ : NULL, n, c, h, w, oc, k, scratch, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(name, sf_cuda_last_error());
    } else {
        const std::vector<float> gwk = down(dw_, nw), gdw = to_nchw(gwk, oc, c, k, k), gdb = down(db_, oc),
                                 gdx = to_nchw(down(dx_, nx), n, c, h, w);
        struct {
            const char *what;
            const std::vector<float> *got;
            const std::vector<double> *ref;
            int on;
        } outs[3] = {{"dw", &gdw, &dwr, 1}, {"db", &gdb, &dbr, bias}, {"dx", &gdx, &dxr, want_dx}};
        for (auto &o : outs) {
            if (!o.on)
                continue;
            snprintf(nm, sizeof nm, "%s %s", name, o.what);
            check_v(nm, *o.got, *o.ref, tol);
        }
        /* the same inputs give the same bits (the block count is a constant) */
        if (sf_conv_patch_bwd(SF_DT_F32, x_, w_, relu ? y_ : NULL, dy_, NULL, dw_, bias ? db_ : NULL, n, c, h, w,
                              oc, k, scratch, s) == 0) {
            CU(cudaStreamSynchronize(s));
            const std::vector<float> again = down(dw_, nw);
            snprintf(nm, sizeof nm, "%s dw repeats bit for bit", name);
            pass_or_fail(nm, memcmp(again.data(), gwk.data(), nw * sizeof(float)) == 0,
                         "dw differs between two runs");
        }
    }
    cudaFree(x_); cudaFree(dy_); cudaFree(dx_); cudaFree(dw_); cudaFree(y_); cudaFree(w_);
    cudaFree(db_); cudaFree(scratch);
}

/* The space-to-depth form (conv_s2d.h) of a strided convolution over few
 * channels, NHWC: the rearranged input equals its definition bit for bit, and
 * the stride-1 convolution of the rearranged tensors (cuDNN plans built on
 * sf_conv_s2d_desc) gives the reference's forward, and its filter gradient
 * gathered back the reference's dw. */
static void test_conv_s2d(cudnnHandle_t dnn, cudaStream_t s, const conv_case &cc, sf_dtype dt, double tol)
{
    char name[200], nm[300];
    snprintf(name, sizeof name, "conv s2d n%d c%d %dx%d oc%d k%d s%d p%d %s", cc.n, cc.c, cc.h, cc.w, cc.oc, cc.k,
             cc.stride, cc.pad, dtname(dt));
    const int oh = (cc.h + 2 * cc.pad - cc.k) / cc.stride + 1, ow = (cc.w + 2 * cc.pad - cc.k) / cc.stride + 1;
    const size_t nx = (size_t)cc.n * cc.c * cc.h * cc.w, nw = (size_t)cc.oc * cc.c * cc.k * cc.k,
                 ny = (size_t)cc.n * cc.oc * oh * ow;
    std::vector<float> x(nx), wt(nw), dy(ny);
    rand_fill_dt(x, dt, 1.f);
    rand_fill_dt(wt, dt, 0.5f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> xd = to_d(x), wd = to_d(wt), dyd = to_d(dy);
    std::vector<double> yr(ny), dxr(nx), dwr(nw);
    sf_ref_conv2d_fwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), NULL, cc.oc, cc.k, cc.stride, cc.pad,
                          yr.data());
    sf_ref_conv2d_bwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), cc.oc, cc.k, cc.stride, cc.pad, dyd.data(),
                          dxr.data(), dwr.data(), NULL);
    std::vector<float> xl = to_nhwc(x, cc.n, cc.c, cc.h, cc.w), wl = to_nhwc(wt, cc.oc, cc.c, cc.k, cc.k),
                       dyl = to_nhwc(dy, cc.n, cc.oc, oh, ow);

    sf_conv_desc d;
    memset(&d, 0, sizeof d);
    d.n = cc.n; d.c = cc.c; d.h = cc.h; d.w = cc.w; d.oc = cc.oc; d.k = cc.k; d.stride = cc.stride; d.pad = cc.pad;
    /* the width's window spelled out, as the executor's descs have it */
    d.kw = cc.k; d.stride_w = cc.stride; d.pad_w = cc.pad; d.dilation_w = 1;
    d.layout = SF_LAYOUT_NHWC;
    d.dt = dt;
    d.align_x = d.align_w = d.align_y = 16;
    sf_conv_desc d2;
    sf_conv_s2d_desc(&d, &d2);
    const size_t nxs = sf_conv_s2d_x_elems(&d), nws = sf_conv_s2d_w_elems(&d);
    if (nxs != (size_t)d2.n * d2.c * d2.h * d2.w || nws != (size_t)d2.oc * d2.c * d2.k * d2.k || d2.stride != 1 ||
        !sf_conv_square(&d2) ||
        d2.pad != 0 || (d2.h - d2.k + 1) != oh || (d2.w - d2.k + 1) != ow || d2.c < cc.c * cc.stride * cc.stride ||
        (d2.c * (int)sf_dtype_size(dt)) % 16) {
        snprintf(nm, sizeof nm, "%s desc", name);
        fail(nm, "the rearranged shape does not match the original's output");
        return;
    }
    dbuf bx = dbuf_make(dt, nx, 0), bw = dbuf_make(dt, nw, 0), bdy = dbuf_make(dt, ny, 0), by = dbuf_make(dt, ny, 0),
         bdw = dbuf_make(dt, nw, 0), bxs = dbuf_make(dt, nxs, 0), bws = dbuf_make(dt, nws, 0),
         bdws = dbuf_make(dt, nws, 0);
    up_dt(bx, xl);
    up_dt(bw, wl);
    up_dt(bdy, dyl);
    poison_dt(bxs);
    poison_dt(bws);
    const size_t ws_bytes = (size_t)64 << 20;
    void *ws = dalloc<char>(ws_bytes);
    int rc = sf_conv_s2d_input(&d, bx.p, bxs.p, s) || sf_conv_s2d_weight(&d, bw.p, bws.p, s);
    CU(cudaStreamSynchronize(s));
    snprintf(nm, sizeof nm, "%s rearranged input and weight", name);
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        /* the definitions of conv_s2d.h, on the host */
        const int S = cc.stride, C2 = d2.c, K2 = d2.k;
        std::vector<float> xs_ref(nxs, 0.f), ws_ref(nws, 0.f);
        for (int b = 0; b < cc.n; b++)
            for (int j = 0; j < d2.h; j++)
                for (int i = 0; i < d2.w; i++)
                    for (int dy_ = 0; dy_ < S; dy_++)
                        for (int dx_ = 0; dx_ < S; dx_++)
                            for (int ci = 0; ci < cc.c; ci++) {
                                const int r = S * j - cc.pad + dy_, q = S * i - cc.pad + dx_;
                                if (r >= 0 && r < cc.h && q >= 0 && q < cc.w)
                                    xs_ref[(((size_t)b * d2.h + j) * d2.w + i) * C2 + (dy_ * S + dx_) * cc.c + ci] =
                                        xl[(((size_t)b * cc.h + r) * cc.w + q) * cc.c + ci];
                            }
        for (int o = 0; o < cc.oc; o++)
            for (int by_ = 0; by_ < K2; by_++)
                for (int bx_ = 0; bx_ < K2; bx_++)
                    for (int dy_ = 0; dy_ < S; dy_++)
                        for (int dx_ = 0; dx_ < S; dx_++)
                            for (int ci = 0; ci < cc.c; ci++) {
                                const int r = by_ * S + dy_, q = bx_ * S + dx_;
                                if (r < cc.k && q < cc.k)
                                    ws_ref[(((size_t)o * K2 + by_) * K2 + bx_) * C2 + (dy_ * S + dx_) * cc.c + ci] =
                                        wl[(((size_t)o * cc.k + r) * cc.k + q) * cc.c + ci];
                            }
        std::vector<float> gx = down_dt(bxs, nxs), gw = down_dt(bws, nws);
        pass_or_fail(nm, memcmp(gx.data(), xs_ref.data(), nxs * 4) == 0 && memcmp(gw.data(), ws_ref.data(), nws * 4) == 0,
                     "differs from the definition");
    }
    sf_conv_ptrs pf = {bxs.p, bws.p, by.p, ws, NULL}, pw = {bxs.p, bdws.p, bdy.p, ws, NULL};
    const sf_conv_ptrs *ptrs[3] = {&pf, NULL, &pw};
    for (int dir = 0; dir < 3; dir += 2) {
        sf_conv_plan plan;
        sf_conv_vpack *vp = NULL;
        snprintf(nm, sizeof nm, "%s %s", name, dir == SF_CONV_FWD ? "fwd" : "wgrad gathered");
        if (sf_conv_plan_build(dnn, &d2, (sf_conv_dir)dir, ws_bytes, 4, ptrs[dir], &plan) ||
            sf_conv_vpack_make(ptrs[dir], &vp)) {
            fail(nm, sf_cuda_last_error());
            sf_cuda_clear_error();
            continue;
        }
        poison_dt(dir == SF_CONV_FWD ? by : bdw);
        rc = sf_conv_run(dnn, &plan, vp);
        if (!rc && dir == SF_CONV_BWD_FILTER)
            rc = sf_conv_s2d_wgrad(&d, bdws.p, bdw.p, s);
        CU(cudaStreamSynchronize(s));
        if (rc) {
            fail(nm, sf_cuda_last_error());
        } else if (dir == SF_CONV_FWD) {
            check_gemm(nm, dt, to_nchw(down_dt(by, ny), cc.n, cc.oc, oh, ow), yr, tol);
        } else {
            check_gemm(nm, dt, to_nchw(down_dt(bdw, nw), cc.oc, cc.c, cc.k, cc.k), dwr, tol);
        }
        sf_conv_vpack_destroy(vp);
        sf_conv_plan_destroy(&plan);
    }
    dbuf_free(bx); dbuf_free(bw); dbuf_free(bdy); dbuf_free(by); dbuf_free(bdw); dbuf_free(bxs); dbuf_free(bws);
    dbuf_free(bdws);
    cudaFree(ws);
}

/* ---- grouped, depthwise and dilated convolutions ------------------------------ */

/* One grouped (groups g; g = c = oc is depthwise), dilated and/or
 * rectangular (Inception's 1x7) convolution through cuDNN's graph API,
 * forward, backward-data and backward-filter, against the double reference
 * (sf_ref_conv2d_gd_*). The filter is [oc, c/g, kh, kw] (KCRS; KRSC with
 * NHWC). Within tol (check_gemm), as the plain convolutions. */
static void test_conv_gd(cudnnHandle_t dnn, cudaStream_t s, sf_dtype dt, sf_layout lay, int tf32, int n, int c, int h,
                         int w, int oc, const sf_ref_conv_win &v, double tol)
{
    char name[260], nm[340];
    const int cg = c / v.groups, kh = v.kh, kw = v.kw;
    const int oh = sf_ref_conv_out(h, kh, v.sh, v.ph, v.dh), ow = sf_ref_conv_out(w, kw, v.sw, v.pw, v.dw);
    const size_t nx = (size_t)n * c * h * w, nw = (size_t)oc * cg * kh * kw, ny = (size_t)n * oc * oh * ow;
    snprintf(name, sizeof name, "conv groups %d dilation %dx%d n%d c%d %dx%d oc%d k%dx%d s%dx%d p%dx%d %s %s", v.groups,
             v.dh, v.dw, n, c, h, w, oc, kh, kw, v.sh, v.sw, v.ph, v.pw, lname(lay),
             dt == SF_DT_BF16 ? "bf16" : tf32 ? "tf32" : "fp32");
    std::vector<float> x(nx), wt(nw), dy(ny);
    rand_fill_dt(x, dt, 1.f);
    rand_fill_dt(wt, dt, 0.5f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> xd = to_d(x), wd = to_d(wt), dyd = to_d(dy), yr(ny), dxr(nx), dwr(nw);
    sf_ref_conv2d_gd_fwd_f64(xd.data(), n, c, h, w, wd.data(), NULL, oc, &v, yr.data());
    sf_ref_conv2d_gd_bwd_f64(xd.data(), n, c, h, w, wd.data(), oc, &v, dyd.data(), dxr.data(), dwr.data(), NULL);
    const int nhwc = lay == SF_LAYOUT_NHWC;
    dbuf bx = dbuf_make(dt, nx, 0), bw = dbuf_make(dt, nw, 0), bdy = dbuf_make(dt, ny, 0), by = dbuf_make(dt, ny, 0),
         bdx = dbuf_make(dt, nx, 0), bdw = dbuf_make(dt, nw, 0);
    up_dt(bx, nhwc ? to_nhwc(x, n, c, h, w) : x);
    up_dt(bw, nhwc ? to_nhwc(wt, oc, cg, kh, kw) : wt);
    up_dt(bdy, nhwc ? to_nhwc(dy, n, oc, oh, ow) : dy);
    const size_t ws_bytes = (size_t)256 << 20;
    void *ws = dalloc<char>(ws_bytes);
    sf_conv_desc d;
    memset(&d, 0, sizeof d);
    d.n = n; d.c = c; d.h = h; d.w = w; d.oc = oc; d.k = kh; d.stride = v.sh; d.pad = v.ph;
    d.kw = kw; d.stride_w = v.sw; d.pad_w = v.pw;
    d.groups = v.groups;
    d.dilation = v.dh;
    d.dilation_w = v.dw;
    d.layout = lay;
    d.tf32 = tf32;
    d.dt = dt;
    d.align_x = d.align_w = d.align_y = 16;
    const sf_conv_ptrs ptr[3] = {{bx.p, bw.p, by.p, ws, NULL}, {bdx.p, bw.p, bdy.p, ws, NULL},
                                 {bx.p, bdw.p, bdy.p, ws, NULL}};
    static const char *dir_name[3] = {"fwd", "bwd_data", "bwd_filter"};
    for (int dir = 0; dir < 3; dir++) {
        sf_conv_plan plan;
        sf_conv_vpack *vp = NULL;
        if (sf_conv_plan_build(dnn, &d, (sf_conv_dir)dir, ws_bytes, 1, NULL, &plan) ||
            sf_conv_vpack_make(&ptr[dir], &vp)) {
            snprintf(nm, sizeof nm, "%s %s plan", name, dir_name[dir]);
            fail(nm, sf_cuda_last_error());
            sf_cuda_clear_error();
            continue;
        }
        const dbuf &out = dir == 0 ? by : dir == 1 ? bdx : bdw;
        poison_dt(out);
        const int rc = sf_conv_run(dnn, &plan, vp);
        CU(cudaStreamSynchronize(s));
        snprintf(nm, sizeof nm, "%s %s (engine %lld%s)", name, dir_name[dir], (long long)plan.engine,
                 plan.tensor_core ? " tc" : "");
        if (rc) {
            fail(nm, sf_cuda_last_error());
        } else {
            std::vector<float> g;
            const std::vector<double> &ref = dir == 0 ? yr : dir == 1 ? dxr : dwr;
            if (dir == 0)
                g = nhwc ? to_nchw(down_dt(by, ny), n, oc, oh, ow) : down_dt(by, ny);
            else if (dir == 1)
                g = nhwc ? to_nchw(down_dt(bdx, nx), n, c, h, w) : down_dt(bdx, nx);
            else
                g = nhwc ? to_nchw(down_dt(bdw, nw), oc, cg, kh, kw) : down_dt(bdw, nw);
            check_gemm(nm, dt, g, ref, tol);
        }
        sf_conv_vpack_destroy(vp);
        sf_conv_plan_destroy(&plan);
    }
    dbuf_free(bx); dbuf_free(bw); dbuf_free(bdy); dbuf_free(by); dbuf_free(bdx); dbuf_free(bdw);
    cudaFree(ws);
}

static conv_case conv_of(const op_case &c)
{
    return conv_case{c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], c.p[1], c.p[2], c.p[3]};
}
/* shape {n, c, h, w}; p {out channels, k, stride, pad, tf32, engine configs
 * timed (tune), x misaligned}; tol, tol_param, tol_aux: test_conv's comment
 * (the families below: tol, their outputs') */
void cmp_conv(const op_case &c, const op_env &e)
{
    test_conv(e.dnn, e.s, c, conv_of(c), c.dt, c.lay, c.p[4], c.p[5], c.p[6]);
}
void cmp_conv_bad_dtype(const op_case &, const op_env &e) { test_conv_bad_dtype(e.dnn); }
/* Thin 1x1 and narrow kernels. shape {n, c, h, w}; p {out channels, bias, relu, dx wanted} */
void cmp_conv_thin(const op_case &c, const op_env &e)
{
    test_conv_thin(e.s, c.tol, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], c.dt, c.lay, c.p[1], c.p[2],
                   c.p[3]);
}
void cmp_conv_thin_rules(const op_case &, const op_env &)
{
    const sf_layout NC = SF_LAYOUT_NCHW, NH = SF_LAYOUT_NHWC;
    pass_or_fail("conv thin eligibility: 1-4 in to 8/16/32 out anywhere, up to 16 x 16 NCHW fp32 only",
                 sf_conv_thin_ok(NH, SF_DT_BF16, 3, 16, 1, 1, 0) && !sf_conv_thin_ok(NH, SF_DT_F32, 5, 16, 1, 1, 0) &&
                     !sf_conv_thin_ok(NH, SF_DT_F32, 3, 16, 2, 2, 0) && sf_conv_thin_ok(NC, SF_DT_F32, 16, 10, 1, 1, 0) &&
                     !sf_conv_thin_ok(NC, SF_DT_BF16, 16, 10, 1, 1, 0) &&
                     !sf_conv_thin_ok(NC, SF_DT_F32, 17, 10, 1, 1, 0) && !sf_conv_thin_ok(NC, SF_DT_F32, 16, 17, 1, 1, 0),
                 "eligibility");
}
/* The one-pass backward of non-overlapping convolutions. shape {n, c, h, w};
 * p {k, bias, relu, dx wanted} */
void cmp_conv_patch(const op_case &c, const op_env &e)
{
    test_conv_patch(e.s, c.tol, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], c.p[1], c.p[2], c.p[3]);
}
void cmp_conv_patch_refuses_bf16(const op_case &, const op_env &e)
{
    float *z = dalloc<float>(64 * 32 * 2);
    pass_or_fail("conv patch refuses bf16 data",
                 sf_conv_patch_bwd(SF_DT_BF16, z, z, NULL, z, NULL, z, NULL, 1, 16, 2, 2, 32, 2, z, e.s) != 0,
                 "accepted bf16");
    sf_cuda_clear_error();
    cudaFree(z);
}
void cmp_conv_patch_rules(const op_case &, const op_env &)
{
    pass_or_fail("conv patch takes only non-overlapping 64-input, 32-output NHWC patches",
                 sf_conv_patch_ok(SF_LAYOUT_NHWC, 16, 256, 256, 32, 2, 2, 0) &&
                     !sf_conv_patch_ok(SF_LAYOUT_NCHW, 16, 256, 256, 32, 2, 2, 0) &&
                     !sf_conv_patch_ok(SF_LAYOUT_NHWC, 16, 255, 256, 32, 2, 2, 0) &&
                     !sf_conv_patch_ok(SF_LAYOUT_NHWC, 16, 256, 256, 32, 2, 1, 0) &&
                     !sf_conv_patch_ok(SF_LAYOUT_NHWC, 32, 256, 256, 64, 2, 2, 0) &&
                     !sf_conv_patch_ok(SF_LAYOUT_NHWC, 16, 256, 256, 32, 2, 2, 1),
                 "eligibility");
}
/* Space-to-depth. shape {n, c, h, w}; p {out channels, k, stride, pad} */
void cmp_conv_s2d(const op_case &c, const op_env &e) { test_conv_s2d(e.dnn, e.s, conv_of(c), c.dt, c.tol); }
void cmp_conv_s2d_rules(const op_case &, const op_env &)
{
    pass_or_fail("conv s2d takes NHWC strided convolutions over few channels",
                 sf_conv_s2d_ok(SF_LAYOUT_NHWC, 3, 7, 2) && sf_conv_s2d_ok(SF_LAYOUT_NHWC, 4, 3, 2) &&
                     sf_conv_s2d_ok(SF_LAYOUT_NHWC, 1, 5, 4) && !sf_conv_s2d_ok(SF_LAYOUT_NCHW, 3, 7, 2) &&
                     !sf_conv_s2d_ok(SF_LAYOUT_NHWC, 5, 7, 2) && !sf_conv_s2d_ok(SF_LAYOUT_NHWC, 3, 3, 1) &&
                     !sf_conv_s2d_ok(SF_LAYOUT_NHWC, 1, 9, 5) && !sf_conv_s2d_ok(SF_LAYOUT_NHWC, 3, 2, 3),
                 "eligibility");
    pass_or_fail("conv s2d takes NHWC patches (k == stride) over at most 4 channels",
                 sf_conv_s2d_ok(SF_LAYOUT_NHWC, 3, 16, 16) && sf_conv_s2d_ok(SF_LAYOUT_NHWC, 3, 4, 4) &&
                     sf_conv_s2d_ok(SF_LAYOUT_NHWC, 3, 2, 2) && sf_conv_s2d_ok(SF_LAYOUT_NHWC, 4, 32, 32) &&
                     !sf_conv_s2d_ok(SF_LAYOUT_NHWC, 5, 16, 16) && !sf_conv_s2d_ok(SF_LAYOUT_NHWC, 3, 33, 33) &&
                     !sf_conv_s2d_ok(SF_LAYOUT_NCHW, 3, 16, 16) && !sf_conv_s2d_ok(SF_LAYOUT_NHWC, 3, 1, 1),
                 "patch eligibility");
}
/* Grouped, depthwise and dilated. shape {n, c, h, w}; p {out channels, k,
 * stride, pad, tf32, groups, dilation} */
void cmp_conv_gd(const op_case &c, const op_env &e)
{
    const sf_ref_conv_win v = sf_ref_conv_win_square(c.p[1], c.p[2], c.p[3], c.p[6], c.p[5]);
    test_conv_gd(e.dnn, e.s, c.dt, c.lay, c.p[4], c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], v, c.tol);
}
/* Windows that differ between the axes. shape {n, c, h, w}; p {out
 * channels, kh, kw, stride h, stride w, pad h, pad w, dilation h, dilation w,
 * groups, tf32} */
void cmp_conv_rect(const op_case &c, const op_env &e)
{
    const sf_ref_conv_win v = {c.p[1], c.p[2], c.p[3], c.p[4], c.p[5], c.p[6], c.p[7], c.p[8], c.p[9]};
    test_conv_gd(e.dnn, e.s, c.dt, c.lay, c.p[10], c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], v, c.tol);
}
