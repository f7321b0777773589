/* tests/gpu/test_pool.cu — MaxPool2d and global average pooling of
 * gpu/cuda/pool.h against sf_ref_maxpool2d_* / sf_ref_avgpool_*: both layouts,
 * ResNet-18's stem (the k3 s2 p1 path) and head, odd sizes, other windows;
 * argmax and selections exact; the _dt launchers in fp32 and bf16 with
 * misaligned pointers; the pool with a pre-batchnorm + ReLU (bf16 NHWC stem)
 * bit for bit against the batchnorm's apply pass followed by the pool. *
 * Prints "ok <case>" or "FAIL <case>: ..." per case; exits 1 on any failure,
 * 0 with "SKIPPED: no CUDA device" when there is no GPU. Helpers and the
 * criteria they apply: op_test.h.
 */
#include "tests/gpu/op_test.h"

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
    sf_ref_maxpool2d_fwd_sized_f64(xd.data(), n, c, h, w, k, st, pad, oh, ow, yr.data(), amr.data());
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

/* ---- MaxPool2d and global average pooling on dt ------------------------------------- */

/* y exact (a selection), argmax equal to the reference's, dx (sums of up to
 * four dy in fp32, rounded once) by check_dt. */
/* PyTorch's pooling output size, ceil_mode included (gpu/layers.c's rule). */
static int pool_size(int in, int k, int s, int p, int ceil_mode)
{
    int out = (in + 2 * p - k + (ceil_mode ? s - 1 : 0)) / s + 1;
    if (ceil_mode && (out - 1) * s >= in + p)
        out--;
    return out;
}

static void test_maxpool_dt(cudaStream_t s, sf_dtype dt, int n, int c, int h, int w, int k, int st, int pad,
                            sf_layout L, int mis, int ceil_mode = 0)
{
    char nm[200], sub[260];
    snprintf(nm, sizeof nm, "maxpool_dt %s n%d c%d %dx%d k%d s%d p%d%s %s%s", dtname(dt), n, c, h, w, k, st, pad,
             ceil_mode ? " ceil_mode" : "", lname(L), mis ? " misaligned" : "");
    const int oh = pool_size(h, k, st, pad, ceil_mode), ow = pool_size(w, k, st, pad, ceil_mode);
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * oh * ow;
    std::vector<float> x(nx), dy(ny);
    rand_fill_dt(x, dt, 1.f); /* bf16 makes ties in a window common: the first maximum must win */
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(ny), dxr(nx);
    std::vector<int32_t> amr(ny);
    sf_ref_maxpool2d_fwd_sized_f64(xd.data(), n, c, h, w, k, st, pad, oh, ow, yr.data(), amr.data());
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
    int rc = sf_cuda_maxpool_fwd_dt(dt, bx.p, n, c, h, w, k, st, pad, ceil_mode, L, by.p, d_am, NULL, s);
    if (!rc)
        rc = sf_cuda_maxpool_bwd_dt(dt, bdy.p, d_am, n, c, h, w, k, st, pad, ceil_mode, L, bdx.p, s);
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
    rand_fill_dt(x, dt, 1.f, 0.25f);
    rand_fill_dt(dy, dt, 1.f);
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

/* ---- AvgPool2d and AdaptiveAvgPool2d on dt ------------------------------------------ */

/* Forward and backward against the double reference; both are sums of at
 * most k*k terms in fp32 (then rounded once to dt): check_dt. */
static void test_avgpool2d_dt(cudaStream_t s, sf_dtype dt, int n, int c, int h, int w, int k, int st, int pad,
                              int ceil_mode, int cip, sf_layout L)
{
    char nm[200], sub[260];
    snprintf(nm, sizeof nm, "avgpool2d %s n%d c%d %dx%d k%d s%d p%d%s%s %s", dtname(dt), n, c, h, w, k, st, pad,
             ceil_mode ? " ceil_mode" : "", cip ? " count_include_pad" : " exclude_pad", lname(L));
    const int oh = pool_size(h, k, st, pad, ceil_mode), ow = pool_size(w, k, st, pad, ceil_mode);
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * oh * ow;
    std::vector<float> x(nx), dy(ny);
    rand_fill_dt(x, dt, 1.f, 0.25f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(ny), dxr(nx);
    sf_ref_avgpool2d_fwd_f64(xd.data(), n, c, h, w, k, st, pad, cip, oh, ow, yr.data());
    sf_ref_avgpool2d_bwd_f64(dyd.data(), n, c, h, w, k, st, pad, cip, oh, ow, dxr.data());
    const int nhwc = L == SF_LAYOUT_NHWC;
    dbuf bx = dbuf_make(dt, nx, 0), by = dbuf_make(dt, ny, 0), bdy = dbuf_make(dt, ny, 0), bdx = dbuf_make(dt, nx, 0);
    up_dt(bx, nhwc ? to_nhwc(x, n, c, h, w) : x);
    up_dt(bdy, nhwc ? to_nhwc(dy, n, c, oh, ow) : dy);
    poison_dt(by);
    poison_dt(bdx);
    int rc = sf_cuda_avgpool2d_fwd_dt(dt, bx.p, n, c, h, w, k, st, pad, ceil_mode, cip, L, by.p, s);
    if (!rc)
        rc = sf_cuda_avgpool2d_bwd_dt(dt, bdy.p, n, c, h, w, k, st, pad, ceil_mode, cip, L, bdx.p, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> y = down_dt(by, ny), dx = down_dt(bdx, nx);
        if (nhwc) {
            y = to_nchw(y, n, c, oh, ow);
            dx = to_nchw(dx, n, c, h, w);
        }
        snprintf(sub, sizeof sub, "%s fwd", nm);
        check_dt(sub, dt, y, yr, 1e-5);
        snprintf(sub, sizeof sub, "%s bwd", nm);
        check_dt(sub, dt, dx, dxr, 1e-5);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
}

static void test_adaptive_dt(cudaStream_t s, sf_dtype dt, int n, int c, int h, int w, int oh, int ow, sf_layout L)
{
    char nm[200], sub[260];
    snprintf(nm, sizeof nm, "adaptive_avgpool2d %s n%d c%d %dx%d -> %dx%d %s", dtname(dt), n, c, h, w, oh, ow,
             lname(L));
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * oh * ow;
    std::vector<float> x(nx), dy(ny);
    rand_fill_dt(x, dt, 1.f, 0.25f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(ny), dxr(nx);
    sf_ref_adaptive_avgpool2d_fwd_f64(xd.data(), n, c, h, w, oh, ow, yr.data());
    sf_ref_adaptive_avgpool2d_bwd_f64(dyd.data(), n, c, h, w, oh, ow, dxr.data());
    const int nhwc = L == SF_LAYOUT_NHWC;
    dbuf bx = dbuf_make(dt, nx, 0), by = dbuf_make(dt, ny, 0), bdy = dbuf_make(dt, ny, 0), bdx = dbuf_make(dt, nx, 0);
    up_dt(bx, nhwc ? to_nhwc(x, n, c, h, w) : x);
    up_dt(bdy, nhwc ? to_nhwc(dy, n, c, oh, ow) : dy);
    poison_dt(by);
    poison_dt(bdx);
    int rc = sf_cuda_adaptive_avgpool_fwd_dt(dt, bx.p, n, c, h, w, oh, ow, L, by.p, s);
    if (!rc)
        rc = sf_cuda_adaptive_avgpool_bwd_dt(dt, bdy.p, n, c, h, w, oh, ow, L, bdx.p, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> y = down_dt(by, ny), dx = down_dt(bdx, nx);
        if (nhwc) {
            y = to_nchw(y, n, c, oh, ow);
            dx = to_nchw(dx, n, c, h, w);
        }
        snprintf(sub, sizeof sub, "%s fwd", nm);
        check_dt(sub, dt, y, yr, 1e-5);
        snprintf(sub, sizeof sub, "%s bwd", nm);
        check_dt(sub, dt, dx, dxr, 1e-5);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
}

/* The stem's pool with the batchnorm + ReLU applied to its taps equals, bit
 * for bit (values and argmax), the batchnorm's training apply pass followed
 * by the plain pool; unsupported shapes and types are refused. */
static void test_maxpool_pre_bn(cudaStream_t s, int n, int c, int h, int w)
{
    char nm[160];
    snprintf(nm, sizeof nm, "maxpool k3 s2 p1 with pre-batchnorm n%d c%d %dx%d bf16 nhwc", n, c, h, w);
    const sf_layout L = SF_LAYOUT_NHWC;
    const int OH = (h + 2 - 3) / 2 + 1, OW = (w + 2 - 3) / 2 + 1;
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * OH * OW;
    void *x = dalloc<char>(nx * 2), *ybn = dalloc<char>(nx * 2), *y1 = dalloc<char>(ny * 2), *y2 = dalloc<char>(ny * 2);
    int32_t *a1 = dalloc<int32_t>(ny), *a2 = dalloc<int32_t>(ny);
    float *g = dalloc<float>(c), *b = dalloc<float>(c), *rm = dalloc<float>(c), *rv = dalloc<float>(c),
          *sm = dalloc<float>(c), *si = dalloc<float>(c);
    void *scr = dalloc<char>(sf_cuda_bn_scratch_bytes(n, c, h, w, L));
    int rc = sf_cuda_fill_random_dt(SF_DT_BF16, x, nx, g_seed++, 2.f, s) || sf_cuda_fill_random(g, c, g_seed++, 1.f, s) ||
             sf_cuda_fill_random(b, c, g_seed++, 1.f, s) || sf_cuda_fill(rm, c, 0.f, s) || sf_cuda_fill(rv, c, 1.f, s) ||
             sf_cuda_bn_fwd_train_dt(SF_DT_BF16, x, n, c, h, w, L, g, b, 1e-5f, 0.1f, rm, rv, sm, si, NULL, ybn, 1, scr,
                                     s) ||
             sf_cuda_maxpool_fwd_dt(SF_DT_BF16, ybn, n, c, h, w, 3, 2, 1, 0, L, y1, a1, NULL, s);
    const sf_pool_pre_bn pre = {sm, si, g, b};
    if (!rc) {
        poison(y2, ny * 2);
        poison(a2, ny * 4);
        rc = sf_cuda_maxpool_fwd_dt(SF_DT_BF16, x, n, c, h, w, 3, 2, 1, 0, L, y2, a2, &pre, s);
    }
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<char> h1(ny * 2), h2(ny * 2);
        std::vector<int32_t> g1(ny), g2(ny);
        CU(cudaMemcpy(h1.data(), y1, ny * 2, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(h2.data(), y2, ny * 2, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(g1.data(), a1, ny * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(g2.data(), a2, ny * 4, cudaMemcpyDeviceToHost));
        pass_or_fail(nm, h1 == h2 && g1 == g2, "differs from the batchnorm's output pooled");
    }
    pass_or_fail("maxpool pre-batchnorm: only bf16 nhwc, c % 8 == 0, 3x3/2 pad 1",
                 sf_cuda_maxpool_pre_bn_ok(SF_DT_BF16, L, 64, 3, 2, 1) &&
                     !sf_cuda_maxpool_pre_bn_ok(SF_DT_F32, L, 64, 3, 2, 1) &&
                     !sf_cuda_maxpool_pre_bn_ok(SF_DT_BF16, SF_LAYOUT_NCHW, 64, 3, 2, 1) &&
                     !sf_cuda_maxpool_pre_bn_ok(SF_DT_BF16, L, 60, 3, 2, 1) &&
                     !sf_cuda_maxpool_pre_bn_ok(SF_DT_BF16, L, 64, 2, 2, 0),
                 "wrong");
    rc = sf_cuda_maxpool_fwd_dt(SF_DT_F32, x, 1, 8, 4, 4, 3, 2, 1, 0, L, y2, a2, &pre, s);
    pass_or_fail("maxpool pre-batchnorm refuses fp32", rc != 0, "accepted");
    sf_cuda_clear_error();
    cudaFree(x); cudaFree(ybn); cudaFree(y1); cudaFree(y2); cudaFree(a1); cudaFree(a2); cudaFree(g); cudaFree(b);
    cudaFree(rm); cudaFree(rv); cudaFree(sm); cudaFree(si); cudaFree(scr);
}

static void run_cases(cudaStream_t s)
{
    for (int lay = 0; lay < 2; lay++) {
        const sf_layout L = (sf_layout)lay;
        test_maxpool(s, 2, 64, 112, 112, 3, 2, 1, L); /* ResNet-18's stem */
        test_maxpool(s, 3, 5, 13, 11, 3, 2, 1, L);
        test_maxpool(s, 2, 3, 9, 9, 2, 2, 0, L);
        test_maxpool(s, 1, 4, 7, 8, 3, 1, 1, L);
        test_maxpool(s, 2, 3, 10, 10, 5, 3, 2, L);

        test_avgpool(s, 4, 512, 7, 7, L); /* ResNet-18's head */
        test_avgpool(s, 3, 5, 3, 5, L);
        test_avgpool(s, 4, 7, 1, 1, L);
        test_avgpool(s, 2, 40, 56, 56, L); /* many rows per sample, a partial channel tile */
    }
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout L : k_layouts) {
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
            test_avgpool_dt(s, dt, 2, 40, 56, 56, L);

            /* ceil_mode: a last window that starts inside the input but runs past it */
            test_maxpool_dt(s, dt, 2, 5, 8, 8, 3, 2, 1, L, 0, 1);   /* 5x5, not the stem's 4x4 */
            test_maxpool_dt(s, dt, 2, 3, 10, 11, 2, 2, 0, L, 0, 1); /* 5x6 */
            test_maxpool_dt(s, dt, 1, 4, 13, 13, 3, 2, 0, L, 0, 1); /* 6x6, no change by ceil */

            for (int ceil = 0; ceil < 2; ceil++)
                for (int cip = 0; cip < 2; cip++) {
                    test_avgpool2d_dt(s, dt, 2, 5, 9, 11, 3, 2, 1, ceil, cip, L); /* odd sizes */
                    test_avgpool2d_dt(s, dt, 2, 5, 8, 8, 3, 2, 1, ceil, cip, L);  /* ceil: 5x5, a clipped window */
                    test_avgpool2d_dt(s, dt, 2, 3, 8, 7, 2, 2, 1, ceil, cip, L);
                    test_avgpool2d_dt(s, dt, 1, 16, 10, 10, 3, 3, 0, ceil, cip, L);
                }
            test_avgpool2d_dt(s, dt, 2, 64, 28, 28, 2, 2, 0, 0, 1, L); /* DenseNet's transition */
            test_adaptive_dt(s, dt, 2, 5, 7, 11, 3, 5, L);  /* overlapping bins */
            test_adaptive_dt(s, dt, 2, 4, 5, 4, 7, 6, L);   /* upsampling: bins of one input */
            test_adaptive_dt(s, dt, 3, 16, 13, 13, 1, 1, L);
            test_adaptive_dt(s, dt, 2, 8, 14, 14, 7, 7, L); /* VGG's head */
        }

    test_maxpool_pre_bn(s, 2, 64, 112, 112); /* ResNet-18's stem */
    test_maxpool_pre_bn(s, 3, 16, 9, 10);     /* odd sizes */
}

int main(void)
{
    return run_op_test("test_pool", run_cases);
}
