/* tests/gpu/ops/conv_transpose.cu — ConvTranspose2d of
 * gpu/cuda/conv_transpose.h against sf_ref_convt2d_*: forward + bias,
 * backward-data, backward-filter and bias gradient in both layouts, fp32 and
 * tf32, at W2's decoder shapes and odd ones; the plan cache; the bias/ReLU
 * epilogue on fp32 and bf16; bf16 plans (max-error criterion); the
 * per-pixel k2s2 forward of gpu/cuda/conv_patch.h (bias and ReLU inside). *
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/conv_patch.h"

/* ---- ConvTranspose2d -------------------------------------------------------- */

struct convt_case {
    int n, c, h, w, oc, k, stride, pad;
};

/* One ConvTranspose2d shape in one element type, both layouts, through the
 * plans (d.dt reaches conv.cu's plans): forward + bias, backward data,
 * backward filter (dw in dt, as the conv's w), bias gradient, against the
 * double reference. fp32: relative error < tol (check_v), then tf32 < tol_aux,
 * through the fp32 wrappers. bf16: x, w, dy rounded to bf16 and the reference
 * on those values, max |err| <= tol * max|ref| (check_max: fp32 accumulation
 * and one bf16 rounding, as test_conv's bf16 convolutions), through the _dt
 * wrappers. The bias gradient stays fp32: relative error < tol_param. */
static void test_convt(cudnnHandle_t dnn, cudaStream_t s, const op_case &kc, const convt_case &cc, sf_dtype dt)
{
    const int bf = dt == SF_DT_BF16;
    const int oh = (cc.h - 1) * cc.stride - 2 * cc.pad + cc.k, ow = (cc.w - 1) * cc.stride - 2 * cc.pad + cc.k;
    const size_t nx = (size_t)cc.n * cc.c * cc.h * cc.w, nw = (size_t)cc.c * cc.oc * cc.k * cc.k,
                 ny = (size_t)cc.n * cc.oc * oh * ow;
    std::vector<float> x(nx), wt(nw), b(cc.oc), dy(ny);
    rand_fill_dt(x, dt, 1.f);
    rand_fill_dt(wt, dt, 0.5f);
    rand_fill(b, 0.5f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> xd = to_d(x), wd = to_d(wt), bd = to_d(b), dyd = to_d(dy);
    std::vector<double> yr(ny), dxr(nx), dwr(nw), dbr(cc.oc);
    sf_ref_convt2d_fwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), bd.data(), cc.oc, cc.k, cc.stride, cc.pad,
                           yr.data());
    sf_ref_convt2d_bwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), cc.oc, cc.k, cc.stride, cc.pad, dyd.data(),
                           dxr.data(), dwr.data(), dbr.data());
    const size_t ws_bytes = (size_t)256 << 20;
    void *ws = dalloc<char>(ws_bytes);
    float *d_b = dalloc<float>(cc.oc), *d_db = dalloc<float>(cc.oc), *scr = dalloc<float>(sf_cuda_bias_grad_scratch(cc.oc));
    dbuf bx = dbuf_make(dt, nx, 0), bw = dbuf_make(dt, nw, 0), by = dbuf_make(dt, ny, 0), bdy = dbuf_make(dt, ny, 0),
         bdx = dbuf_make(dt, nx, 0), bdw = dbuf_make(dt, nw, 0);
    up(d_b, b);
    for (const sf_layout L : k_layouts)
        for (int tf32 = 0; tf32 < (bf ? 1 : 2); tf32++) {
            const int nhwc = L == SF_LAYOUT_NHWC;
            char nm[200], sub[260];
            snprintf(nm, sizeof nm, "convT n%d c%d %dx%d -> oc%d k%d s%d p%d %s %s", cc.n, cc.c, cc.h, cc.w, cc.oc,
                     cc.k, cc.stride, cc.pad, lname(L), bf ? "bf16" : tf32 ? "tf32" : "fp32");
            up_dt(bx, nhwc ? to_nhwc(x, cc.n, cc.c, cc.h, cc.w) : x);
            up_dt(bw, nhwc ? to_nhwc(wt, cc.c, cc.oc, cc.k, cc.k) : wt); /* [c][k][k][oc] */
            up_dt(bdy, nhwc ? to_nhwc(dy, cc.n, cc.oc, oh, ow) : dy);
            poison_dt(by);
            poison_dt(bdx);
            poison_dt(bdw);
            poison(d_db, cc.oc * 4);
            sf_convt_desc d = {cc.n, cc.c, cc.h, cc.w, cc.oc, cc.k, cc.stride, cc.pad, L, tf32, dt, 16, 16, 16, 0, NULL};
            sf_convt_plans pl;
            memset(&pl, 0, sizeof pl);
            if (sf_convt_plans_build(dnn, &d, SF_CONVT_DIR_ALL, ws_bytes, 1, NULL, &pl)) {
                snprintf(sub, sizeof sub, "%s plans", nm);
                fail(sub, sf_cuda_last_error());
                continue;
            }
            sf_convt_ptrs pf = {bx.p, bw.p, by.p, ws}, pd = {bdx.p, bw.p, bdy.p, ws}, pw = {bx.p, bdw.p, bdy.p, ws};
            int rc = sf_convt_run(dnn, &pl, SF_CONV_FWD, &pf);
            rc = rc || (bf ? sf_convt_bias_act_dt(&d, by.p, d_b, 0, s) : sf_convt_bias_act(&d, (float *)by.p, d_b, 0, s));
            rc = rc || sf_convt_run(dnn, &pl, SF_CONV_BWD_DATA, &pd) || sf_convt_run(dnn, &pl, SF_CONV_BWD_FILTER, &pw);
            rc = rc || (bf ? sf_convt_bias_grad_dt(&d, bdy.p, NULL, d_db, scr, s)
                           : sf_convt_bias_grad(&d, (float *)bdy.p, NULL, d_db, scr, s));
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
            const double tol = tf32 ? kc.tol_aux : kc.tol; /* bf16 runs no tf32 */
            const char *what[3] = {"fwd+bias", "bwd_data", "bwd_filter"};
            const std::vector<float> *got[3] = {&y, &dx, &dw};
            const std::vector<double> *ref[3] = {&yr, &dxr, &dwr};
            for (int k = 0; k < 3; k++)
                check_gemm(subname(nm, what[k]), dt, *got[k], *ref[k], tol);
            snprintf(sub, sizeof sub, "%s bias_grad", nm);
            check_v(sub, down(d_db, cc.oc), dbr, kc.tol_param);
            sf_convt_plans_destroy(&pl);
        }
    dbuf_free(bx); dbuf_free(bw); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx); dbuf_free(bdw);
    cudaFree(ws); cudaFree(d_b); cudaFree(d_db); cudaFree(scr);
}

/* The plan cache: a hit returns the same set, a new shape builds another. */
static void test_convt_cache(cudnnHandle_t dnn)
{
    const char *nm = "convT cache hit/miss";
    sf_convt_cache cache;
    memset(&cache, 0, sizeof cache);
    sf_convt_desc a = {2, 8, 4, 4, 4, 2, 2, 0, SF_LAYOUT_NCHW, 0, SF_DT_F32, 16, 16, 16, 0, NULL};
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

/* The convT wrappers on d->dt: bias + ReLU on the output [n, oc, oh, ow] in
 * its layout (check_dt within tol), then the bias gradient through that ReLU
 * (the masked dy exact, db within tol_param); and the fp32 wrappers refuse a
 * bf16 descriptor. */
static void test_convt_bias_dt(cudaStream_t s, const op_case &k, sf_dtype dt, sf_layout L, int oc)
{
    char nm[200];
    sf_convt_desc d;
    memset(&d, 0, sizeof d);
    d.n = 2; d.c = 3; d.h = 5; d.w = 4; d.oc = oc; d.k = 3; d.stride = 2; d.pad = 1;
    d.layout = L;
    d.dt = dt;
    const int oh = (d.h - 1) * d.stride - 2 * d.pad + d.k, ow = (d.w - 1) * d.stride - 2 * d.pad + d.k;
    snprintf(nm, sizeof nm, "convT bias_dt %s %s out [%d,%d,%d,%d]", dtname(dt), lname(L), d.n, oc, oh, ow);
    const size_t len = (size_t)d.n * oc * oh * ow;
    std::vector<float> y(len), dy(len), b(oc);
    rand_fill_dt(y, dt, 1.f);
    rand_fill_dt(dy, dt, 1.f);
    rand_fill(b, 0.5f);
    /* reference in NCHW */
    std::vector<double> yr(len), dyr(len), dbr(oc, 0.0);
    for (size_t i = 0; i < len; i++) {
        const int ch = (int)((i / ((size_t)oh * ow)) % oc);
        const double v = (double)y[i] + b[ch];
        yr[i] = v < 0 ? 0 : v;
    }
    dbuf by = dbuf_make(dt, len, 0), bdy = dbuf_make(dt, len, 0);
    float *d_b = dalloc<float>(oc), *d_db = dalloc<float>(oc), *scr = dalloc<float>(sf_cuda_bias_grad_scratch(oc));
    up_dt(by, to_lay(y, L, d.n, oc, oh, ow));
    up_dt(bdy, to_lay(dy, L, d.n, oc, oh, ow));
    up(d_b, b);
    poison(d_db, oc * 4);
    if (ran_ok(s, nm, sf_convt_bias_act_dt(&d, by.p, d_b, 1, s))) {
        const std::vector<float> got = from_lay(down_dt(by, len), L, d.n, oc, oh, ow);
        check_dt(subname(nm, "bias_act +relu"), dt, got, yr, k.tol);
        /* the backward masks with the device's own ReLU output */
        for (size_t i = 0; i < len; i++) {
            dyr[i] = got[i] > 0 ? dy[i] : 0;
            dbr[(i / ((size_t)oh * ow)) % oc] += dyr[i];
        }
        if (ran_ok(s, subname(nm, "bias_grad"), sf_convt_bias_grad_dt(&d, bdy.p, by.p, d_db, scr, s))) {
            check_ulp(subname(nm, "bias_grad dy masked (exact)"), from_lay(down_dt(bdy, len), L, d.n, oc, oh, ow), dyr,
                      0, 0);
            check_v(subname(nm, "bias_grad db"), down(d_db, oc), dbr, k.tol_param);
        }
    }
    if (dt == SF_DT_BF16) {
        char sub[260];
        snprintf(sub, sizeof sub, "%s: fp32 wrappers refuse a bf16 descriptor", nm);
        const int r1 = sf_convt_bias_act(&d, (float *)by.p, d_b, 1, s);
        const int r2 = sf_convt_bias_grad(&d, (float *)bdy.p, NULL, d_db, scr, s);
        pass_or_fail(sub, r1 == -1 && r2 == -1, "accepted");
    }
    dbuf_free(by); dbuf_free(bdy);
    cudaFree(d_b); cudaFree(d_db); cudaFree(scr);
}

/* conv_patch.h's k2s2 forward against the double reference, NCHW fp32:
 * y = relu?(convT(x) + b) within tol, an odd spatial size and a pixel count
 * that is not a multiple of the warps' 32. */
static void test_convt_patch(cudaStream_t s, double tol, int n, int c, int h, int w, int bias, int relu)
{
    const int oc = c / 2, oh = 2 * h, ow = 2 * w;
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * oc * oh * ow, nw = (size_t)c * oc * 4;
    std::vector<float> x(nx), wt(nw), b(oc);
    rand_fill(x, 1.f);
    rand_fill(wt, 0.5f);
    rand_fill(b, 0.5f);
    std::vector<double> xd = to_d(x), wd = to_d(wt), bd = to_d(b), yr(ny);
    sf_ref_convt2d_fwd_f64(xd.data(), n, c, h, w, wd.data(), bias ? bd.data() : NULL, oc, 2, 2, 0, yr.data());
    if (relu)
        for (double &v : yr)
            v = v > 0 ? v : 0;
    char name[160];
    snprintf(name, sizeof name, "convT patch fwd n%d c%d %dx%d oc%d%s%s", n, c, h, w, oc, bias ? " bias" : "",
             relu ? " relu" : "");
    float *x_ = dalloc<float>(nx), *w_ = dalloc<float>(nw), *b_ = dalloc<float>(oc), *y_ = dalloc<float>(ny);
    up(x_, x);
    up(w_, wt);
    up(b_, b);
    poison_f(y_, ny);
    const int rc = sf_convt_patch_fwd(SF_DT_F32, x_, w_, bias ? b_ : NULL, y_, n, c, h, w, oc, 2, relu, s);
    CU(cudaStreamSynchronize(s));
    if (rc)
        fail(name, sf_cuda_last_error());
    else
        check_v(name, down(y_, ny), yr, tol);
    cudaFree(x_); cudaFree(w_); cudaFree(b_); cudaFree(y_);
}

/* shape {n, c, h, w}; p {out channels, k, stride, pad}; tol, tol_param,
 * tol_aux: test_convt's comment */
void cmp_convt(const op_case &c, const op_env &e)
{
    test_convt(e.dnn, e.s, c,
               convt_case{c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], c.p[1], c.p[2], c.p[3]}, c.dt);
}
void cmp_convt_cache(const op_case &, const op_env &e) { test_convt_cache(e.dnn); }
/* p {out channels} */
void cmp_convt_bias_dt(const op_case &c, const op_env &e) { test_convt_bias_dt(e.s, c, c.dt, c.lay, c.p[0]); }
/* The k2s2 per-pixel forward. shape {n, c, h, w}; p {bias, relu} */
void cmp_convt_patch(const op_case &c, const op_env &e)
{
    test_convt_patch(e.s, c.tol, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], c.p[1]);
}
void cmp_convt_patch_rules(const op_case &, const op_env &)
{
    pass_or_fail("convT patch takes only NCHW k2s2 32->16 and 64->32",
                 sf_convt_patch_ok(SF_LAYOUT_NCHW, 32, 16, 2, 2, 0) && sf_convt_patch_ok(SF_LAYOUT_NCHW, 64, 32, 2, 2, 0) &&
                     !sf_convt_patch_ok(SF_LAYOUT_NHWC, 32, 16, 2, 2, 0) &&
                     !sf_convt_patch_ok(SF_LAYOUT_NCHW, 32, 16, 3, 2, 0) &&
                     !sf_convt_patch_ok(SF_LAYOUT_NCHW, 128, 64, 2, 2, 0),
                 "eligibility");
}
