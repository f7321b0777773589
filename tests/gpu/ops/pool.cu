/* tests/gpu/ops/pool.cu — MaxPool2d and global average pooling of
 * gpu/cuda/pool.h against sf_ref_maxpool2d_* / sf_ref_avgpool_*: both layouts,
 * ResNet-18's stem (the k3 s2 p1 path) and head, odd sizes, other windows;
 * argmax and selections exact; the _dt launchers in fp32 and bf16 with
 * misaligned pointers; the pool with a pre-batchnorm + ReLU (bf16 NHWC stem)
 * bit for bit against the batchnorm's apply pass followed by the pool. *
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
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

/* The fp32 launchers. shape {n, c, h, w}; p {k, stride, pad} */
void cmp_maxpool(const op_case &c, const op_env &e)
{
    test_maxpool(e.s, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], c.p[1], c.p[2], c.lay);
}
/* shape {n, c, h, w} */
void cmp_avgpool(const op_case &c, const op_env &e)
{
    test_avgpool(e.s, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.lay);
}
/* The _dt launchers. shape {n, c, h, w}; p {k, stride, pad, misaligned, ceil_mode} */
void cmp_maxpool_dt(const op_case &c, const op_env &e)
{
    test_maxpool_dt(e.s, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], c.p[1], c.p[2], c.lay, c.p[3],
                    c.p[4]);
}
/* shape {n, c, h, w} */
void cmp_avgpool_dt(const op_case &c, const op_env &e)
{
    test_avgpool_dt(e.s, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.lay);
}
/* shape {n, c, h, w}; p {k, stride, pad, ceil_mode, count_include_pad} */
void cmp_avgpool2d_dt(const op_case &c, const op_env &e)
{
    test_avgpool2d_dt(e.s, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], c.p[1], c.p[2], c.p[3], c.p[4],
                      c.lay);
}
/* shape {n, c, h, w}; p {output h, output w} */
void cmp_adaptive_dt(const op_case &c, const op_env &e)
{
    test_adaptive_dt(e.s, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], c.p[1], c.lay);
}
/* shape {n, c, h, w} */
void cmp_maxpool_pre_bn(const op_case &c, const op_env &e)
{
    test_maxpool_pre_bn(e.s, c.shape[0], c.shape[1], c.shape[2], c.shape[3]);
}
