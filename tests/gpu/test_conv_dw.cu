/* tests/gpu/test_conv_dw.cu — the depthwise NHWC kernels of
 * gpu/cuda/conv_dw.h against the double-precision reference
 * (sf_ref_conv2d_gd_* with groups = c = oc): forward (with and without
 * bias), backward-data and backward-filter, fp32 (relative error < 1e-5)
 * and bf16 (max |out - ref| <= 1e-2 max |ref|: check_max); EfficientNet-B0's
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
 * Prints "ok <case>" or "FAIL <case>: ..." per case; exits 1 on any
 * failure, 0 with "SKIPPED: no CUDA device" when there is no GPU. Helpers
 * and the criteria they apply: op_test.h.
 */
#include "tests/gpu/op_test.h"

#include "gpu/cuda/conv_dw.h"

struct dw_case {
    int n, c, h, w, k, stride, pad;
};

/* One shape in one element type: every direction against the reference on
 * the same values (bf16 inputs rounded first, so they add no error). mis:
 * every tensor bound one element past a 256-byte boundary. */
static void test_dw(cudaStream_t s, const dw_case &cc, sf_dtype dt, int bias, int mis)
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
    sf_ref_conv2d_gd_fwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), bias ? bd.data() : NULL, cc.c, cc.k,
                             cc.stride, cc.pad, 1, cc.c, yr.data());
    sf_ref_conv2d_gd_bwd_f64(xd.data(), cc.n, cc.c, cc.h, cc.w, wd.data(), cc.c, cc.k, cc.stride, cc.pad, 1, cc.c,
                             dyd.data(), dxr.data(), dwr.data(), NULL);
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
                check_max(nm, *o.got, *o.ref, 1e-2);
            else
                check_v(nm, *o.got, *o.ref, 1e-5);
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

static void run_cases(cudaStream_t s)
{
    static const dw_case cases[] = {
        {2, 32, 14, 14, 3, 1, 1},  /* EfficientNet-B0 / MobileNet-V2 first block, scaled down */
        {2, 96, 15, 15, 3, 2, 1},  /* MobileNet-V2 strided, odd map, two channel tiles */
        {2, 40, 13, 11, 5, 2, 2},  /* EfficientNet-B0 k5 strided, odd sizes */
        {3, 24, 9, 10, 5, 1, 2},   /* k5 stride 1 */
        {2, 144, 8, 7, 3, 1, 1},   /* more than two tiles, odd width */
        {2, 20, 12, 9, 7, 1, 3},   /* k7 (ConvNeXt-like), 20 channels: not a multiple of 8 */
        {2, 7, 11, 13, 3, 1, 1},   /* odd channel count: one channel per thread */
        {1, 13, 10, 9, 3, 2, 0},   /* odd channels, stride 2, no padding */
        {3, 1, 17, 5, 3, 1, 1},    /* one channel */
        {8, 16, 150, 20, 3, 1, 1}, /* 1200 output rows: more than the filter gradient's 1024 chunks */
        /* the 16-byte kernels (channels a multiple of 8, or of 4 in fp32): k7 at both strides,
         * n = 1, maps narrower than one strip of four columns and not a multiple of it */
        {2, 64, 9, 11, 7, 2, 3},   /* k7 stride 2, odd map */
        {2, 48, 10, 13, 7, 1, 3},  /* k7 stride 1 */
        {1, 40, 7, 7, 5, 1, 2},    /* EfficientNet-B0's 7x7 k5, one sample */
        {2, 16, 5, 5, 5, 2, 0},    /* stride 2, no padding, a 1x1 output */
        {2, 8, 8, 8, 7, 2, 6},     /* pad k - 1: output pixels that see one input column */
        {1, 24, 3, 3, 3, 1, 0},    /* a 1x1 output */
        /* more channels than one 128-channel tile: 272 = 8 * 34 has no divisor of the tile
         * width between 8 and 16 vectors (a partial last tile in bf16); 336 = 8 * 42 splits
         * into three full tiles of 14 vectors */
        {2, 272, 7, 7, 5, 1, 2},
        {1, 336, 5, 6, 3, 2, 1},
        {2, 672, 14, 14, 5, 2, 2}, /* EfficientNet-B0's widest strided k5 */
        {4, 8, 180, 180, 3, 2, 1}, /* 130k input pixels, few channels: many work items per block */
    };
    for (const auto &cc : cases)
        for (int dt = 0; dt < 2; dt++)
            test_dw(s, cc, dt ? SF_DT_BF16 : SF_DT_F32, 0, 0);
    /* bias, and tensors one element past an aligned address (even channels: the pair
     * kernels would read split words, so they fall back to one channel per thread) */
    test_dw(s, cases[0], SF_DT_F32, 1, 0);
    test_dw(s, cases[2], SF_DT_BF16, 1, 0);
    test_dw(s, cases[0], SF_DT_BF16, 0, 1);
    test_dw(s, cases[1], SF_DT_F32, 1, 1);
    test_dw(s, cases[10], SF_DT_BF16, 1, 1);
    test_dw(s, cases[11], SF_DT_BF16, 1, 0);
    test_dw_refused(s, {2, 8, 8, 8, 4, 1, 1}, "even k");
    test_dw_refused(s, {2, 8, 8, 8, 3, 3, 1}, "stride 3");
    test_dw_refused(s, {2, 8, 12, 12, 9, 1, 4}, "k above SF_CONV_DW_KMAX");
    test_dw_ok_rules();
}

int main(void) { return run_op_test("test_conv_dw", run_cases); }
