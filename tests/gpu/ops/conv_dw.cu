/* tests/gpu/ops/conv_dw.cu — the depthwise NHWC kernels of
 * gpu/cuda/conv_dw.h against the double-precision reference
 * (sf_ref_conv2d_gd_* with groups = c = oc): forward (with and without
 * bias), backward-data and backward-filter, fp32 (relative error: check_v)
 * and bf16 (max |out - ref| of max |ref|: check_max) within the row's tol;
 * EfficientNet-B0's
 * and MobileNet-V2's depthwise shapes scaled down (k 3, 5 and 7, stride 1
 * and 2), odd map sizes, maps narrower than a thread's strip of columns,
 * n = 1, channel counts that are a multiple of 8 (the 16-byte kernels, also
 * with several channel tiles, full and partial), not a multiple of 8 or odd
 * (the two- and one-channel-per-thread kernels), tensors one element past an
 * aligned address (the same fallback), a batch with more output rows than
 * the backward-filter has blocks, a map with many work items per block; the
 * filter gradient
 * twice, bit for bit the same; and refused shapes (an even k, stride 3, a
 * kernel larger than SF_CONV_DW_KMAX) that leave an error naming the shape.
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/conv_dw.h"

struct dw_case {
    int n, c, h, w, k, stride, pad;
};

/* One shape in one element type: every direction against the reference on
 * the same values (bf16 inputs rounded first, so they add no error), within
 * tol (check_v in fp32, check_max in bf16). mis: every tensor bound one
 * element past a 256-byte boundary. */
static void test_dw(cudaStream_t s, const dw_case &cc, sf_dtype dt, int bias, int mis, double tol)
{
    char name[200], nm[280];
    const int oh = (cc.h + 2 * cc.pad - cc.k) / cc.stride + 1, ow = (cc.w + 2 * cc.pad - cc.k) / cc.stride + 1;
    const size_t nx = (size_t)cc.n * cc.c * cc.h * cc.w, nw = (size_t)cc.c * cc.k * cc.k,
                 ny = (size_t)cc.n * cc.c * oh * ow;
    snprintf(name, sizeof name, "depthwise n%d c%d %dx%d k%d s%d p%d %s%s%s", cc.n, cc.c, cc.h, cc.w, cc.k, cc.stride,
             cc.pad, dt == SF_DT_BF16 ? "bf16" : "fp32", bias ? " bias" : "", mis ? " misaligned" : "");
    std::vector<float> x(nx), wt(nw), dy(ny), b(cc.c);
    rand_fill_dt(x, dt, 1.f);
    rand_fill_dt(wt, dt, 0.5f);
    rand_fill_dt(dy, dt, 1.f);
    rand_fill(b, 0.5f);
    std::vector<double> xd = to_d(x), wd = to_d(wt), dyd = to_d(dy), bd = to_d(b), yr(ny), dxr(nx), dwr(nw);
    const sf_ref_conv_win win = sf_ref_conv_win_square(cc.k, cc.stride, cc.pad, 1, cc.c);
    sf_ref_conv2d_gd_fwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), bias ? bd.data() : NULL, cc.c, &win,
                             yr.data());
    sf_ref_conv2d_gd_bwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), cc.c, &win, dyd.data(), dxr.data(),
                             dwr.data(), NULL);
    dbuf bx = dbuf_make(dt, nx, mis), bw = dbuf_make(dt, nw, mis), bdy = dbuf_make(dt, ny, mis),
         by = dbuf_make(dt, ny, mis), bdx = dbuf_make(dt, nx, mis), bdw = dbuf_make(dt, nw, mis);
    /* the filter [c, 1, k, k] is the same in KCRS and KRSC */
    up_dt(bx, to_nhwc(x, cc.n, cc.c, cc.h, cc.w));
    up_dt(bw, wt);
    up_dt(bdy, to_nhwc(dy, cc.n, cc.c, oh, ow));
    float *bb = dalloc<float>(cc.c);
    up(bb, b);
    float *scratch = dalloc<float>(sf_conv_dw_scratch_floats(cc.n, cc.c, oh, cc.k) + 1);
    poison_dt(by);
    poison_dt(bdx);
    poison_dt(bdw);
    int rc = sf_conv_dw_fwd(dt, bx.p, bw.p, bias ? bb : NULL, by.p, cc.n, cc.c, cc.h, cc.w, cc.k, cc.stride, cc.pad,
                            s);
    rc = rc || sf_conv_dw_bwd_data(dt, bdy.p, bw.p, bdx.p, cc.n, cc.c, cc.h, cc.w, cc.k, cc.stride, cc.pad, s);
    rc = rc || sf_conv_dw_bwd_filter(dt, bx.p, bdy.p, bdw.p, cc.n, cc.c, cc.h, cc.w, cc.k, cc.stride, cc.pad,
                                     scratch, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(name, sf_cuda_last_error());
        sf_cuda_clear_error();
    } else {
        const std::vector<float> y = to_nchw(down_dt(by, ny), cc.n, cc.c, oh, ow),
                                 dx = to_nchw(down_dt(bdx, nx), cc.n, cc.c, cc.h, cc.w), dw = down_dt(bdw, nw);
        const struct {
            const char *what;
            const std::vector<float> *got;
            const std::vector<double> *ref;
        } outs[3] = {{"fwd", &y, &yr}, {"bwd_data", &dx, &dxr}, {"bwd_filter", &dw, &dwr}};
        for (const auto &o : outs) {
            snprintf(nm, sizeof nm, "%s %s", name, o.what);
            if (dt == SF_DT_BF16)
                check_max(nm, *o.got, *o.ref, tol);
            else
                check_v(nm, *o.got, *o.ref, tol);
        }
        /* the same inputs give the same bits: the partial sums' order is the shape's */
        poison_dt(bdw);
        if (sf_conv_dw_bwd_filter(dt, bx.p, bdy.p, bdw.p, cc.n, cc.c, cc.h, cc.w, cc.k, cc.stride, cc.pad, scratch,
                                  s) == 0) {
            CU(cudaStreamSynchronize(s));
            const std::vector<float> again = down_dt(bdw, nw);
            snprintf(nm, sizeof nm, "%s bwd_filter repeats bit for bit", name);
            pass_or_fail(nm, memcmp(again.data(), dw.data(), nw * sizeof(float)) == 0,
                         "the filter gradient differs between two runs");
        } else {
            snprintf(nm, sizeof nm, "%s bwd_filter again", name);
            fail(nm, sf_cuda_last_error());
            sf_cuda_clear_error();
        }
    }
    dbuf_free(bx); dbuf_free(bw); dbuf_free(bdy); dbuf_free(by); dbuf_free(bdx); dbuf_free(bdw);
    cudaFree(bb);
    cudaFree(scratch);
}

/* A shape the kernels do not take: sf_conv_dw_ok says no, and each entry
 * point returns -1 with an error that names the shape. */
static void test_dw_refused(cudaStream_t s, const dw_case &cc, const char *why)
{
    char name[200];
    snprintf(name, sizeof name, "depthwise k%d s%d p%d is refused (%s)", cc.k, cc.stride, cc.pad, why);
    sf_cuda_clear_error();
    float *buf = dalloc<float>(1 << 16);
    const int ok = sf_conv_dw_ok(SF_LAYOUT_NHWC, SF_DT_F32, cc.c, cc.c, cc.c, cc.k, cc.stride, cc.pad, 1);
    const int rf = sf_conv_dw_fwd(SF_DT_F32, buf, buf, NULL, buf, cc.n, cc.c, cc.h, cc.w, cc.k, cc.stride, cc.pad, s);
    const char *err = sf_cuda_last_error();
    char want[64];
    snprintf(want, sizeof want, "k%d s%d p%d", cc.k, cc.stride, cc.pad);
    const int named = err && strstr(err, "sf_conv_dw_fwd") && strstr(err, want);
    sf_cuda_clear_error();
    const int rd = sf_conv_dw_bwd_data(SF_DT_F32, buf, buf, buf, cc.n, cc.c, cc.h, cc.w, cc.k, cc.stride, cc.pad, s);
    sf_cuda_clear_error();
    const int rw = sf_conv_dw_bwd_filter(SF_DT_F32, buf, buf, buf, cc.n, cc.c, cc.h, cc.w, cc.k, cc.stride, cc.pad,
                                         buf, s);
    sf_cuda_clear_error();
    CU(cudaStreamSynchronize(s));
    pass_or_fail(name, !ok && rf == -1 && rd == -1 && rw == -1 && named,
                 "a shape outside the kernels was accepted (or refused without naming the function)");
    cudaFree(buf);
}

static void test_dw_ok_rules(void)
{
    /* what the executor asks before choosing the kernels */
    const int dw3 = sf_conv_dw_ok(SF_LAYOUT_NHWC, SF_DT_BF16, 32, 32, 32, 3, 1, 1, 1);
    const int nchw = sf_conv_dw_ok(SF_LAYOUT_NCHW, SF_DT_BF16, 32, 32, 32, 3, 1, 1, 1);
    const int grouped = sf_conv_dw_ok(SF_LAYOUT_NHWC, SF_DT_F32, 32, 32, 16, 3, 1, 1, 1);
    const int mult = sf_conv_dw_ok(SF_LAYOUT_NHWC, SF_DT_F32, 32, 64, 32, 3, 1, 1, 1);
    const int dil = sf_conv_dw_ok(SF_LAYOUT_NHWC, SF_DT_F32, 32, 32, 32, 3, 1, 2, 2);
    pass_or_fail("depthwise kernels take NHWC depthwise k3 and leave NCHW, grouped, multiplier 2 and dilation 2 "
                 "to cuDNN",
                 dw3 && !nchw && !grouped && !mult && !dil, "sf_conv_dw_ok answered wrongly");
}

static dw_case dw_of(const op_case &c)
{
    return dw_case{c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.p[0], c.p[1], c.p[2]};
}
/* shape {n, c, h, w}; p {k, stride, pad, bias, misaligned}; tol: the outputs'
 * bound */
void cmp_conv_dw(const op_case &c, const op_env &e) { test_dw(e.s, dw_of(c), c.dt, c.p[3], c.p[4], c.tol); }
/* shape {n, c, h, w}; p {k, stride, pad}; the check names why the shape is refused */
void cmp_conv_dw_refused(const op_case &c, const op_env &e) { test_dw_refused(e.s, dw_of(c), c.check); }
void cmp_conv_dw_rules(const op_case &, const op_env &) { test_dw_ok_rules(); }
