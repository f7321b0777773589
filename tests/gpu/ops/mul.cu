/* tests/gpu/ops/mul.cu — the products of gpu/cuda/mul.h against the
 * double-precision reference (gpu/ref/mul.c): a * b with b of a's shape and
 * broadcast over H,W (squeeze-and-excitation), forward, da and db (the
 * broadcast one summed over H,W), and the per-channel scale by a parameter
 * (ConvNeXt's layer scale), forward, dx and the parameter's gradient (a
 * two-pass reduction: one and many chunks, more channels than a block; at
 * ConvNeXt's 96, 192 and 768 channels, and one element off 16-byte alignment).
 * Each in fp32 (norm check) and bf16 (each element within half a bf16 ulp:
 * check_dt; the parameter gradient is fp32 either way), in NCHW and NHWC, at
 * odd sizes (n=3, C=3, 7x5) and larger ones. The rows: tests/gpu/op_cases.cu;
 * helpers and the criteria they apply: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/mul.h"

/* shape {n, c, h, w}; p {b broadcast over H,W}; tol: y and da; tol_param: db
 * (a sum over H,W when broadcast) */
void cmp_mul(const op_case &k, const op_env &e)
{
    const cudaStream_t s = e.s;
    const sf_dtype dt = k.dt;
    const sf_layout lay = k.lay;
    const int n = k.shape[0], c = k.shape[1], h = k.shape[2], w = k.shape[3], bcast = k.p[0];
    char nm[160];
    snprintf(nm, sizeof nm, "mul %s %s n%d c%d %dx%d%s", dtname(dt), lname(lay), n, c, h, w,
             bcast ? " b broadcast" : "");
    const size_t hw = (size_t)h * w, len = (size_t)n * c * hw, blen = bcast ? (size_t)n * c : len;
    std::vector<float> a(len), b(blen), dy(len);
    rand_fill_dt(a, dt, 1.f);
    rand_fill_dt(b, dt, 1.f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> ad = to_d(a), bd = to_d(b), dyd = to_d(dy), yr(len), dar(len), dbr(blen);
    const size_t bhw = bcast ? 1 : hw;
    sf_ref_mul_fwd_f64(ad.data(), bd.data(), n, c, hw, bhw, yr.data());
    sf_ref_mul_bwd_f64(ad.data(), bd.data(), n, c, hw, bhw, dyd.data(), dar.data(), dbr.data());
    dbuf ba = dbuf_make(dt, len, 0), bb = dbuf_make(dt, blen, 0), bdy = dbuf_make(dt, len, 0),
         by = dbuf_make(dt, len, 0), bda = dbuf_make(dt, len, 0), bdb = dbuf_make(dt, blen, 0);
    const int bh = bcast ? 1 : h, bw = bcast ? 1 : w;
    up_dt(ba, to_lay(a, lay, n, c, h, w));
    up_dt(bb, to_lay(b, lay, n, c, bh, bw));
    up_dt(bdy, to_lay(dy, lay, n, c, h, w));
    poison_dt(by);
    poison_dt(bda);
    poison_dt(bdb);
    int rc = sf_cuda_mul_fwd_dt(dt, lay, ba.p, bb.p, by.p, n, c, hw, bcast, s);
    if (!rc) /* the executor asks for each input's gradient in its own call */
        rc = sf_cuda_mul_bwd_dt(dt, lay, ba.p, bb.p, bdy.p, bda.p, NULL, n, c, hw, bcast, s);
    if (!rc)
        rc = sf_cuda_mul_bwd_dt(dt, lay, ba.p, bb.p, bdy.p, NULL, bdb.p, n, c, hw, bcast, s);
    if (ran_ok(s, nm, rc)) {
        check_lay(nm, "fwd", by, lay, n, c, h, w, yr, k.tol);
        check_lay(nm, "da", bda, lay, n, c, h, w, dar, k.tol);
        check_lay(nm, "db", bdb, lay, n, c, bh, bw, dbr, k.tol_param);
    }
    /* both gradients in one call */
    poison_dt(bda);
    poison_dt(bdb);
    rc = sf_cuda_mul_bwd_dt(dt, lay, ba.p, bb.p, bdy.p, bda.p, bdb.p, n, c, hw, bcast, s);
    if (ran_ok(s, subname(nm, "da and db in one call"), rc)) {
        check_lay(nm, "db beside da in one call", bdb, lay, n, c, bh, bw, dbr, k.tol_param);
        check_lay(nm, "da beside db in one call", bda, lay, n, c, h, w, dar, k.tol);
    }
    dbuf_free(ba); dbuf_free(bb); dbuf_free(bdy); dbuf_free(by); dbuf_free(bda); dbuf_free(bdb);
}

/* shape {n, c, h, w}; p {x, y, dy and dx one element off 16-byte alignment,
 * a shift too (scale_shift's bias)} (none: aligned, no shift); tol: y and dx;
 * tol_param: dscale and dshift (fp32 in either element type) */
void cmp_channel_scale(const op_case &k, const op_env &e)
{
    const cudaStream_t s = e.s;
    const sf_dtype dt = k.dt;
    const sf_layout lay = k.lay;
    const int n = k.shape[0], c = k.shape[1], h = k.shape[2], w = k.shape[3], mis = k.p.empty() ? 0 : k.p[0];
    const int shift = k.p.size() > 1 && k.p[1];
    char nm[160];
    snprintf(nm, sizeof nm, "channel_scale %s %s n%d c%d %dx%d%s%s", dtname(dt), lname(lay), n, c, h, w,
             mis ? " misaligned" : "", shift ? " with shift" : "");
    const size_t hw = (size_t)h * w, len = (size_t)n * c * hw;
    std::vector<float> x(len), sc(c), sh(c), dy(len);
    rand_fill_dt(x, dt, 1.f);
    rand_fill(sc, 1.f); /* fp32, as the parameters are */
    rand_fill(sh, 1.f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> xd = to_d(x), sd = to_d(sc), shd = to_d(sh), dyd = to_d(dy), yr(len), dxr(len), dsr(c),
                        dshr(c);
    sf_ref_channel_scale_fwd_f64(xd.data(), n, c, hw, sd.data(), yr.data());
    if (shift)
        sf_ref_channel_shift_f64(yr.data(), n, c, hw, shd.data());
    sf_ref_channel_scale_bwd_f64(xd.data(), n, c, hw, sd.data(), dyd.data(), dxr.data(), dsr.data());
    sf_ref_bias_grad_f64(dyd.data(), n, c, hw, dshr.data());
    dbuf bx = dbuf_make(dt, len, mis), bdy = dbuf_make(dt, len, mis), by = dbuf_make(dt, len, mis),
         bdx = dbuf_make(dt, len, mis);
    float *d_s = dalloc<float>(c), *d_ds = dalloc<float>(c), *d_sh = dalloc<float>(c), *d_dsh = dalloc<float>(c),
          *scr = dalloc<float>(sf_cuda_channel_scale_scratch(c));
    up_dt(bx, to_lay(x, lay, n, c, h, w));
    up_dt(bdy, to_lay(dy, lay, n, c, h, w));
    up(d_s, sc);
    up(d_sh, sh);
    poison_dt(by);
    poison_dt(bdx);
    poison_f(d_ds, c);
    poison_f(d_dsh, c);
    poison_f(scr, sf_cuda_channel_scale_scratch(c));
    int rc = sf_cuda_channel_scale_fwd_dt(dt, lay, bx.p, d_s, shift ? d_sh : NULL, by.p, n, c, hw, s);
    if (!rc)
        rc = sf_cuda_channel_scale_bwd_dt(dt, lay, bx.p, d_s, bdy.p, bdx.p, d_ds, shift ? d_dsh : NULL, n, c, hw,
                                          scr, s);
    if (ran_ok(s, nm, rc)) {
        check_lay(nm, "fwd", by, lay, n, c, h, w, yr, k.tol);
        check_lay(nm, "dx", bdx, lay, n, c, h, w, dxr, k.tol);
        check_v(subname(nm, "dscale (fp32)"), down(d_ds, c), dsr, k.tol_param);
        if (shift)
            check_v(subname(nm, "dshift (fp32)"), down(d_dsh, c), dshr, k.tol_param);
    }
    /* without dx (the layer's input needs no gradient): dscale alone, twice
     * bit-identical (a fixed-order reduction) */
    const std::vector<float> first = down(d_ds, c);
    poison_f(d_ds, c);
    rc = sf_cuda_channel_scale_bwd_dt(dt, lay, bx.p, d_s, bdy.p, NULL, d_ds, NULL, n, c, hw, scr, s);
    const subname sub(nm, "dscale without dx, bit-identical");
    if (ran_ok(s, sub, rc))
        pass_or_fail(sub, memcmp(first.data(), down(d_ds, c).data(), sizeof(float) * c) == 0,
                     "differs from the first run");
    dbuf_free(bx); dbuf_free(bdy); dbuf_free(by); dbuf_free(bdx);
    cudaFree(d_s); cudaFree(d_ds); cudaFree(d_sh); cudaFree(d_dsh); cudaFree(scr);
}
