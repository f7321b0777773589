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

/* What run_pool brings back: ok, and y and dx in NCHW. */
struct pool_out {
    int ok;
    std::vector<float> y, dx;
};

/* Runs a pool's forward fwd(x, y) and backward bwd(dy, dx) (device pointers
 * of element type dt, `mis` elements past an aligned address) on an
 * [n, c, h, w] input x and an [n, c, oh, ow] output gradient dy stored in
 * layout L, outputs poisoned first; a failure is reported under nm. */
template <class Fwd, class Bwd>
static pool_out run_pool(const char *nm, cudaStream_t s, sf_dtype dt, sf_layout L, int n, int c, int h, int w, int oh,
                         int ow, int mis, const std::vector<float> &x, const std::vector<float> &dy, Fwd fwd, Bwd bwd)
{
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * oh * ow;
    dbuf bx = dbuf_make(dt, nx, mis), by = dbuf_make(dt, ny, mis), bdy = dbuf_make(dt, ny, mis),
         bdx = dbuf_make(dt, nx, mis);
    up_dt(bx, to_lay(x, L, n, c, h, w));
    up_dt(bdy, to_lay(dy, L, n, c, oh, ow));
    poison_dt(by);
    poison_dt(bdx);
    int rc = fwd(bx.p, by.p);
    if (!rc)
        rc = bwd(bdy.p, bdx.p);
    CU(cudaStreamSynchronize(s));
    pool_out o;
    o.ok = !rc;
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        o.y = from_lay(down_dt(by, ny), L, n, c, oh, ow);
        o.dx = from_lay(down_dt(bdx, nx), L, n, c, h, w);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
    return o;
}

/* The device's argmax (int32, stored in layout L) equals the reference's. */
static void check_argmax(const char *nm, const int32_t *d_am, const std::vector<int32_t> &amr, sf_layout L, int n,
                         int c, int oh, int ow)
{
    const size_t ny = (size_t)n * c * oh * ow;
    std::vector<int32_t> am = down(d_am, ny);
    if (L == SF_LAYOUT_NHWC)
        am = to_nchw(am, n, c, oh, ow);
    size_t diff = 0;
    for (size_t i = 0; i < ny; i++)
        diff += am[i] != amr[i];
    char sub[260];
    snprintf(sub, sizeof sub, "%s argmax (%zu of %zu differ)", nm, diff, ny);
    pass_or_fail(sub, diff == 0, "argmax differs from the reference");
}

/* Fresh inputs x (scale 1 about `offset`) and dy, as dt holds them. */
static void pool_draw(sf_dtype dt, std::vector<float> &x, std::vector<float> &dy, float offset)
{
    rand_fill_dt(x, dt, 1.f, offset);
    rand_fill_dt(dy, dt, 1.f);
}

/* ---- MaxPool2d --------------------------------------------------------------- */

/* The fp32 launchers: y within tol, argmax equal, dx within tol_aux. */
static void test_maxpool(cudaStream_t s, const op_case &kc, int n, int c, int h, int w, int k, int st, int pad,
                         sf_layout L)
{
    char nm[160];
    snprintf(nm, sizeof nm, "maxpool n%d c%d %dx%d k%d s%d p%d %s", n, c, h, w, k, st, pad, lname(L));
    const int oh = (h + 2 * pad - k) / st + 1, ow = (w + 2 * pad - k) / st + 1;
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * oh * ow;
    std::vector<float> x(nx), dy(ny);
    pool_draw(SF_DT_F32, x, dy, 0.f);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(ny), dxr(nx);
    std::vector<int32_t> amr(ny);
    sf_ref_maxpool2d_fwd_sized_f64(xd.data(), n, c, h, w, k, st, pad, oh, ow, yr.data(), amr.data());
    sf_ref_maxpool2d_bwd_f64(dyd.data(), amr.data(), n, c, h, w, oh, ow, dxr.data());
    int32_t *d_am = dalloc<int32_t>(ny);
    poison(d_am, ny * 4);
    const pool_out o = run_pool(
        nm, s, SF_DT_F32, L, n, c, h, w, oh, ow, 0, x, dy,
        [&](void *px, void *py) {
            return sf_cuda_maxpool_fwd((const float *)px, n, c, h, w, k, st, pad, L, (float *)py, d_am, s);
        },
        [&](void *pdy, void *pdx) {
            return sf_cuda_maxpool_bwd((const float *)pdy, d_am, n, c, h, w, k, st, pad, L, (float *)pdx, s);
        });
    if (o.ok) {
        check_v(subname(nm, "fwd y"), o.y, yr, kc.tol);
        check_argmax(nm, d_am, amr, L, n, c, oh, ow);
        check_v(subname(nm, "bwd dx"), o.dx, dxr, kc.tol_aux);
    }
    cudaFree(d_am);
}

/* ---- global average pooling ----------------------------------------------- */

/* The fp32 launchers: y within tol, dx within tol_aux. */
static void test_avgpool(cudaStream_t s, const op_case &kc, int n, int c, int h, int w, sf_layout L)
{
    char nm[160];
    snprintf(nm, sizeof nm, "avgpool n%d c%d %dx%d %s", n, c, h, w, lname(L));
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c;
    std::vector<float> x(nx), dy(ny);
    pool_draw(SF_DT_F32, x, dy, 0.25f);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(ny), dxr(nx);
    sf_ref_avgpool_fwd_f64(xd.data(), n, c, h, w, yr.data());
    sf_ref_avgpool_bwd_f64(dyd.data(), n, c, h, w, dxr.data());
    const pool_out o = run_pool(
        nm, s, SF_DT_F32, L, n, c, h, w, 1, 1, 0, x, dy,
        [&](void *px, void *py) { return sf_cuda_avgpool_fwd((const float *)px, n, c, h, w, L, (float *)py, s); },
        [&](void *pdy, void *pdx) { return sf_cuda_avgpool_bwd((const float *)pdy, n, c, h, w, L, (float *)pdx, s); });
    if (o.ok) {
        check_v(subname(nm, "fwd"), o.y, yr, kc.tol);
        check_v(subname(nm, "bwd"), o.dx, dxr, kc.tol_aux);
    }
}

/* ---- MaxPool2d and global average pooling on dt ------------------------------------- */

/* PyTorch's pooling output size, ceil_mode included: gpu/pool_rule.h's rule,
 * written out again so the test does not take its sizes from the code it checks. */
static int pool_size(int in, int k, int s, int p, int ceil_mode)
{
    int out = (in + 2 * p - k + (ceil_mode ? s - 1 : 0)) / s + 1;
    if (ceil_mode && (out - 1) * s >= in + p)
        out--;
    return out;
}

/* y exact (a selection), argmax equal to the reference's, dx (sums of up to
 * four dy in fp32, rounded once) by check_dt within tol_aux. */
static void test_maxpool_dt(cudaStream_t s, const op_case &kc, sf_dtype dt, int n, int c, int h, int w, int k, int st,
                            int pad, sf_layout L, int mis, int ceil_mode)
{
    char nm[200];
    snprintf(nm, sizeof nm, "maxpool_dt %s n%d c%d %dx%d k%d s%d p%d%s %s%s", dtname(dt), n, c, h, w, k, st, pad,
             ceil_mode ? " ceil_mode" : "", lname(L), mis ? " misaligned" : "");
    const int oh = pool_size(h, k, st, pad, ceil_mode), ow = pool_size(w, k, st, pad, ceil_mode);
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * oh * ow;
    std::vector<float> x(nx), dy(ny);
    pool_draw(dt, x, dy, 0.f); /* bf16 makes ties in a window common: the first maximum must win */
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(ny), dxr(nx);
    std::vector<int32_t> amr(ny);
    sf_ref_maxpool2d_fwd_sized_f64(xd.data(), n, c, h, w, k, st, pad, oh, ow, yr.data(), amr.data());
    sf_ref_maxpool2d_bwd_f64(dyd.data(), amr.data(), n, c, h, w, oh, ow, dxr.data());
    int32_t *am_mem = dalloc<int32_t>(ny + 4), *d_am = am_mem + mis;
    poison(d_am, ny * 4);
    const pool_out o = run_pool(
        nm, s, dt, L, n, c, h, w, oh, ow, mis, x, dy,
        [&](void *px, void *py) {
            return sf_cuda_maxpool_fwd_dt(dt, px, n, c, h, w, k, st, pad, ceil_mode, L, py, d_am, NULL, s);
        },
        [&](void *pdy, void *pdx) {
            return sf_cuda_maxpool_bwd_dt(dt, pdy, d_am, n, c, h, w, k, st, pad, ceil_mode, L, pdx, s);
        });
    if (o.ok) {
        check_ulp(subname(nm, "fwd y (exact)"), o.y, yr, 0, 0);
        check_argmax(nm, d_am, amr, L, n, c, oh, ow);
        check_dt(subname(nm, "bwd dx"), dt, o.dx, dxr, kc.tol_aux);
    }
    cudaFree(am_mem);
}

/* ---- average pooling on dt: global, AvgPool2d, AdaptiveAvgPool2d ----------- */

/* Forward and backward against the double reference ref(xd, dyd, yr, dxr);
 * both are sums in fp32 (then rounded once to dt): check_dt, y within tol, dx
 * within tol_aux. The inputs draw about 0.25. */
template <class Ref, class Fwd, class Bwd>
static void test_avg_dt(cudaStream_t s, const op_case &kc, const char *nm, sf_dtype dt, sf_layout L, int n, int c,
                        int h, int w, int oh, int ow, Ref ref, Fwd fwd, Bwd bwd)
{
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * oh * ow;
    std::vector<float> x(nx), dy(ny);
    pool_draw(dt, x, dy, 0.25f);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(ny), dxr(nx);
    ref(xd.data(), dyd.data(), yr.data(), dxr.data());
    const pool_out o = run_pool(nm, s, dt, L, n, c, h, w, oh, ow, 0, x, dy, fwd, bwd);
    if (o.ok) {
        check_dt(subname(nm, "fwd"), dt, o.y, yr, kc.tol);
        check_dt(subname(nm, "bwd"), dt, o.dx, dxr, kc.tol_aux);
    }
}

static void test_avgpool_dt(cudaStream_t s, const op_case &kc, sf_dtype dt, int n, int c, int h, int w, sf_layout L)
{
    char nm[200];
    snprintf(nm, sizeof nm, "avgpool_dt %s n%d c%d %dx%d %s", dtname(dt), n, c, h, w, lname(L));
    test_avg_dt(
        s, kc, nm, dt, L, n, c, h, w, 1, 1,
        [&](const double *x, const double *dy, double *y, double *dx) {
            sf_ref_avgpool_fwd_f64(x, n, c, h, w, y);
            sf_ref_avgpool_bwd_f64(dy, n, c, h, w, dx);
        },
        [&](void *x, void *y) { return sf_cuda_avgpool_fwd_dt(dt, x, n, c, h, w, L, y, s); },
        [&](void *dy, void *dx) { return sf_cuda_avgpool_bwd_dt(dt, dy, n, c, h, w, L, dx, s); });
}

/* The add form of the backward (the executor's, where another reader wrote
 * the input's gradient first): dx starts as d0, as dt holds it, and must end
 * as d0 + the reference backward, within tol_aux. */
static void test_avgpool_bwd_add_dt(cudaStream_t s, const op_case &kc, sf_dtype dt, int n, int c, int h, int w,
                                    sf_layout L)
{
    char nm[200];
    snprintf(nm, sizeof nm, "avgpool_bwd_add %s n%d c%d %dx%d %s", dtname(dt), n, c, h, w, lname(L));
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c;
    std::vector<float> d0(nx), dy(ny);
    rand_fill_dt(d0, dt, 1.f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> dyd = to_d(dy), dxr(nx);
    sf_ref_avgpool_bwd_f64(dyd.data(), n, c, h, w, dxr.data());
    for (size_t i = 0; i < nx; i++)
        dxr[i] += d0[i];
    dbuf bdy = dbuf_make(dt, ny, 0), bdx = dbuf_make(dt, nx, 0);
    up_dt(bdy, to_lay(dy, L, n, c, 1, 1));
    up_dt(bdx, to_lay(d0, L, n, c, h, w));
    const int rc = sf_cuda_avgpool_bwd_add_dt(dt, bdy.p, n, c, h, w, L, bdx.p, s);
    CU(cudaStreamSynchronize(s));
    if (rc)
        fail(nm, sf_cuda_last_error());
    else
        check_dt(nm, dt, from_lay(down_dt(bdx, nx), L, n, c, h, w), dxr, kc.tol_aux);
    dbuf_free(bdy);
    dbuf_free(bdx);
}

static void test_avgpool2d_dt(cudaStream_t s, const op_case &kc, sf_dtype dt, int n, int c, int h, int w, int k,
                              int st, int pad, int ceil_mode, int cip, sf_layout L)
{
    char nm[200];
    snprintf(nm, sizeof nm, "avgpool2d %s n%d c%d %dx%d k%d s%d p%d%s%s %s", dtname(dt), n, c, h, w, k, st, pad,
             ceil_mode ? " ceil_mode" : "", cip ? " count_include_pad" : " exclude_pad", lname(L));
    const int oh = pool_size(h, k, st, pad, ceil_mode), ow = pool_size(w, k, st, pad, ceil_mode);
    test_avg_dt(
        s, kc, nm, dt, L, n, c, h, w, oh, ow,
        [&](const double *x, const double *dy, double *y, double *dx) {
            sf_ref_avgpool2d_fwd_f64(x, n, c, h, w, k, st, pad, cip, oh, ow, y);
            sf_ref_avgpool2d_bwd_f64(dy, n, c, h, w, k, st, pad, cip, oh, ow, dx);
        },
        [&](void *x, void *y) {
            return sf_cuda_avgpool2d_fwd_dt(dt, x, n, c, h, w, k, st, pad, ceil_mode, cip, L, y, s);
        },
        [&](void *dy, void *dx) {
            return sf_cuda_avgpool2d_bwd_dt(dt, dy, n, c, h, w, k, st, pad, ceil_mode, cip, L, dx, s);
        });
}

static void test_adaptive_dt(cudaStream_t s, const op_case &kc, sf_dtype dt, int n, int c, int h, int w, int oh, int ow,
                             sf_layout L)
{
    char nm[200];
    snprintf(nm, sizeof nm, "adaptive_avgpool2d %s n%d c%d %dx%d -> %dx%d %s", dtname(dt), n, c, h, w, oh, ow,
             lname(L));
    test_avg_dt(
        s, kc, nm, dt, L, n, c, h, w, oh, ow,
        [&](const double *x, const double *dy, double *y, double *dx) {
            sf_ref_adaptive_avgpool2d_fwd_f64(x, n, c, h, w, oh, ow, y);
            sf_ref_adaptive_avgpool2d_bwd_f64(dy, n, c, h, w, oh, ow, dx);
        },
        [&](void *x, void *y) { return sf_cuda_adaptive_avgpool_fwd_dt(dt, x, n, c, h, w, oh, ow, L, y, s); },
        [&](void *dy, void *dx) { return sf_cuda_adaptive_avgpool_bwd_dt(dt, dy, n, c, h, w, oh, ow, L, dx, s); });
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

/* The fp32 launchers. shape {n, c, h, w}; p {k, stride, pad}; tol: y;
 * tol_aux: dx (the same in the families below) */
void cmp_maxpool(const op_case &c, const op_env &e)
{
    test_maxpool(e.s, c, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], c.p[1], c.p[2], c.lay);
}
/* shape {n, c, h, w} */
void cmp_avgpool(const op_case &c, const op_env &e)
{
    test_avgpool(e.s, c, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.lay);
}
/* The _dt launchers. shape {n, c, h, w}; p {k, stride, pad, misaligned, ceil_mode} */
void cmp_maxpool_dt(const op_case &c, const op_env &e)
{
    test_maxpool_dt(e.s, c, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], c.p[1], c.p[2], c.lay, c.p[3],
                    c.p[4]);
}
/* shape {n, c, h, w} */
void cmp_avgpool_dt(const op_case &c, const op_env &e)
{
    test_avgpool_dt(e.s, c, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.lay);
    test_avgpool_bwd_add_dt(e.s, c, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.lay);
}
/* shape {n, c, h, w}; p {k, stride, pad, ceil_mode, count_include_pad} */
void cmp_avgpool2d_dt(const op_case &c, const op_env &e)
{
    test_avgpool2d_dt(e.s, c, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], c.p[1], c.p[2], c.p[3],
                      c.p[4], c.lay);
}
/* shape {n, c, h, w}; p {output h, output w} */
void cmp_adaptive_dt(const op_case &c, const op_env &e)
{
    test_adaptive_dt(e.s, c, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], c.p[1], c.lay);
}
/* shape {n, c, h, w} */
void cmp_maxpool_pre_bn(const op_case &c, const op_env &e)
{
    test_maxpool_pre_bn(e.s, c.shape[0], c.shape[1], c.shape[2], c.shape[3]);
}
