/* tests/gpu/ops/batchnorm.cu — BatchNorm2d of gpu/cuda/batchnorm.h against
 * sf_ref_bn2d_*: training forward (statistics, running statistics), eval
 * forward and training backward, with and without the fused ReLU (the
 * reference backward masks with the device's own forward output, so a bf16
 * row kernel whose recomputed mask disagreed with it would fail by ~|dy|), both
 * layouts, at ResNet-18's first and last BN shapes and odd ones; the _dt
 * launchers in fp32 and bf16 (row chunks, ragged chunks, channel counts off
 * the vector width, misaligned pointers); and a captured forward+backward
 * replaying bit-equal to the eager run (capturable, deterministic).
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

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
    rand_fill_dt(x, dt, 2.f, 3.f); /* an offset mean: the statistics must not cancel */
    rand_fill_dt(dy, dt, 1.f);
    rand_fill(gamma, 0.5f, 1.f);
    rand_fill(beta, 0.5f);
    rand_fill(rm, 0.5f);
    rand_fill(rv, 0.4f, 1.f);
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
    int rc = sf_cuda_bn_fwd_train_dt(dt, bx.p, n, c, h, w, L, d_g, d_b, eps, mom, d_rm, d_rv, d_sm, d_si, NULL, by.p, relu,
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
        rc = sf_cuda_bn_bwd_dt(dt, bx.p, n, c, h, w, L, d_g, d_b, d_sm, d_si, bdy.p, relu ? by.p : NULL, bdx.p, d_dg, d_db,
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
        rc = sf_cuda_bn_fwd_eval_dt(dt, bx.p, n, c, h, w, L, d_g, d_b, eps, d_rm, d_rv, NULL, by.p, relu, s);
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

/* The forwards with a residual (res): y = relu?(bn(x) + res) against the
 * reference batchnorm plus the add, training and eval, both layouts, the row
 * kernels and the generic ones (C % 8 != 0, misaligned). */
static void test_bn_res(cudaStream_t s, sf_dtype dt, int n, int c, int h, int w, sf_layout L, int relu, int mis)
{
    char nm[200], sub[260];
    snprintf(nm, sizeof nm, "bn_dt+res %s n%d c%d %dx%d %s%s%s", dtname(dt), n, c, h, w, lname(L),
             relu ? " +relu" : "", mis ? " misaligned" : "");
    const size_t len = (size_t)n * c * h * w;
    const float eps = 1e-5f, mom = 0.1f;
    std::vector<float> x(len), r(len), gamma(c), beta(c), rm(c), rv(c);
    rand_fill_dt(x, dt, 2.f, 3.f);
    rand_fill_dt(r, dt, 1.f);
    rand_fill(gamma, 0.5f, 1.f);
    rand_fill(beta, 0.5f);
    rand_fill(rm, 0.5f);
    rand_fill(rv, 0.4f, 1.f);
    std::vector<double> xd = to_d(x), gd = to_d(gamma), bd = to_d(beta), rmd = to_d(rm), rvd = to_d(rv), yt(len),
                        ye(len), smr(c), sir(c);
    std::vector<double> rmd2 = rmd, rvd2 = rvd;
    sf_ref_bn2d_fwd_train_f64(xd.data(), n, c, h, w, gd.data(), bd.data(), eps, mom, rmd2.data(), rvd2.data(),
                              smr.data(), sir.data(), yt.data());
    for (int b = 0; b < n; b++) /* eval: the running statistics, in double (NCHW) */
        for (int ch = 0; ch < c; ch++)
            for (int q = 0; q < h * w; q++) {
                const size_t e = ((size_t)b * c + ch) * h * w + q;
                ye[e] = (xd[e] - rmd[ch]) / sqrt(rvd[ch] + (double)eps) * gd[ch] + bd[ch];
            }
    for (size_t i = 0; i < len; i++) {
        yt[i] += r[i];
        ye[i] += r[i];
        if (relu) {
            yt[i] = yt[i] > 0 ? yt[i] : 0;
            ye[i] = ye[i] > 0 ? ye[i] : 0;
        }
    }
    const int nhwc = L == SF_LAYOUT_NHWC;
    dbuf bx = dbuf_make(dt, len, mis), br = dbuf_make(dt, len, mis), by = dbuf_make(dt, len, mis);
    float *d_g = dalloc<float>(c), *d_b = dalloc<float>(c), *d_rm = dalloc<float>(c), *d_rv = dalloc<float>(c),
          *d_sm = dalloc<float>(c), *d_si = dalloc<float>(c);
    void *scr = dalloc<char>(sf_cuda_bn_scratch_bytes(n, c, h, w, L));
    up_dt(bx, nhwc ? to_nhwc(x, n, c, h, w) : x);
    up_dt(br, nhwc ? to_nhwc(r, n, c, h, w) : r);
    up(d_g, gamma);
    up(d_b, beta);
    up(d_rm, rm);
    up(d_rv, rv);
    for (int ev = 0; ev < 2; ev++) {
        poison_dt(by);
        int rc = ev ? sf_cuda_bn_fwd_eval_dt(dt, bx.p, n, c, h, w, L, d_g, d_b, eps, d_rm, d_rv, br.p, by.p, relu, s)
                    : sf_cuda_bn_fwd_train_dt(dt, bx.p, n, c, h, w, L, d_g, d_b, eps, mom, d_rm, d_rv, d_sm, d_si,
                                              br.p, by.p, relu, scr, s);
        CU(cudaStreamSynchronize(s));
        snprintf(sub, sizeof sub, "%s %s y", nm, ev ? "eval" : "train");
        if (rc) {
            fail(sub, sf_cuda_last_error());
            continue;
        }
        std::vector<float> y = down_dt(by, len);
        if (nhwc)
            y = to_nchw(y, n, c, h, w);
        check_dt(sub, dt, y, ev ? ye : yt, 1e-4);
        if (!ev) { /* the eval pass below uses the running statistics as the reference's */
            up(d_rm, rm);
            up(d_rv, rv);
        }
    }
    dbuf_free(bx); dbuf_free(br); dbuf_free(by);
    cudaFree(d_g); cudaFree(d_b); cudaFree(d_rm); cudaFree(d_rv); cudaFree(d_sm); cudaFree(d_si); cudaFree(scr);
}

/* The bf16 NHWC row kernels recompute a fused ReLU's mask from x: the
 * backward gives the same bits whether y holds the forward's output or NaN
 * (the executor lets y's memory be reused before the backward on that
 * promise, sf_cuda_bn_bwd_reads_y), and the promise is made only there. */
static void test_bn_mask_from_x(cudaStream_t s)
{
    const char *nm = "bn bf16 nhwc +relu backward reads no y";
    const int n = 3, c = 64, h = 14, w = 10;
    const size_t len = (size_t)n * c * h * w;
    void *x = dalloc<char>(len * 2), *y = dalloc<char>(len * 2), *dy = dalloc<char>(len * 2),
         *dx = dalloc<char>(len * 2);
    float *g = dalloc<float>(c), *b = dalloc<float>(c), *rm = dalloc<float>(c), *rv = dalloc<float>(c),
          *sm = dalloc<float>(c), *si = dalloc<float>(c), *dg = dalloc<float>(c), *db = dalloc<float>(c);
    void *scr = dalloc<char>(sf_cuda_bn_scratch_bytes(n, c, h, w, SF_LAYOUT_NHWC));
    std::vector<char> dx0(len * 2), dx1(len * 2);
    std::vector<float> dg0(c), dg1(c), db0(c), db1(c);
    const sf_layout L = SF_LAYOUT_NHWC;
    int rc = sf_cuda_fill_random_dt(SF_DT_BF16, x, len, g_seed++, 2.f, s) ||
             sf_cuda_fill_random_dt(SF_DT_BF16, dy, len, g_seed++, 1.f, s) || sf_cuda_fill_random(g, c, g_seed++, 1.f, s) ||
             sf_cuda_fill_random(b, c, g_seed++, 1.f, s) || sf_cuda_fill(rm, c, 0.f, s) || sf_cuda_fill(rv, c, 1.f, s) ||
             sf_cuda_bn_fwd_train_dt(SF_DT_BF16, x, n, c, h, w, L, g, b, 1e-5f, 0.1f, rm, rv, sm, si, NULL, y, 1, scr, s) ||
             sf_cuda_bn_bwd_dt(SF_DT_BF16, x, n, c, h, w, L, g, b, sm, si, dy, y, dx, dg, db, scr, s);
    CU(cudaStreamSynchronize(s));
    if (!rc) {
        CU(cudaMemcpy(dx0.data(), dx, len * 2, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(dg0.data(), dg, c * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(db0.data(), db, c * 4, cudaMemcpyDeviceToHost));
        poison(y, len * 2);
        poison(dx, len * 2);
        rc = sf_cuda_bn_bwd_dt(SF_DT_BF16, x, n, c, h, w, L, g, b, sm, si, dy, y, dx, dg, db, scr, s);
        CU(cudaStreamSynchronize(s));
    }
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        CU(cudaMemcpy(dx1.data(), dx, len * 2, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(dg1.data(), dg, c * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(db1.data(), db, c * 4, cudaMemcpyDeviceToHost));
        pass_or_fail(nm, dx0 == dx1 && memcmp(dg0.data(), dg1.data(), c * 4) == 0 && memcmp(db0.data(), db1.data(), c * 4) == 0,
                     "the gradients changed with y");
    }
    pass_or_fail("bn backward reads y except bf16 nhwc with c % 8 == 0",
                 !sf_cuda_bn_bwd_reads_y(SF_DT_BF16, L, 64) && sf_cuda_bn_bwd_reads_y(SF_DT_BF16, L, 60) &&
                     sf_cuda_bn_bwd_reads_y(SF_DT_BF16, SF_LAYOUT_NCHW, 64) && sf_cuda_bn_bwd_reads_y(SF_DT_F32, L, 64),
                 "wrong");
    cudaFree(x); cudaFree(y); cudaFree(dy); cudaFree(dx); cudaFree(g); cudaFree(b); cudaFree(rm); cudaFree(rv);
    cudaFree(sm); cudaFree(si); cudaFree(dg); cudaFree(db); cudaFree(scr);
}

/* ---- CUDA-graph capture ---------------------------------------------------- */

/* A training forward + backward captured into a CUDA graph replays bit-equal
 * to the eager run: the launchers allocate and synchronise nothing (else the
 * capture fails) and their reductions are deterministic (else the bits differ). */
static void test_bn_graph_replay(cudaStream_t s, sf_dtype dt, sf_layout L, int n, int c, int hw, int relu)
{
    char nm[200];
    snprintf(nm, sizeof nm, "bn %s %s n%d c%d %dx%d%s fwd+bwd: captured graph replays bit-equal", dtname(dt), lname(L),
             n, c, hw, hw, relu ? " +relu" : "");
    const size_t len = (size_t)n * c * hw * hw, es = sf_dtype_size(dt);
    void *x = dalloc<char>(len * es), *y = dalloc<char>(len * es), *dy = dalloc<char>(len * es),
         *dx = dalloc<char>(len * es);
    float *g = dalloc<float>(c), *b = dalloc<float>(c), *rm = dalloc<float>(c), *rv = dalloc<float>(c),
          *sm = dalloc<float>(c), *si = dalloc<float>(c), *dg = dalloc<float>(c), *db = dalloc<float>(c);
    void *scr = dalloc<char>(sf_cuda_bn_scratch_bytes(n, c, hw, hw, L));
    auto enq = [&](cudaStream_t st) {
        return sf_cuda_bn_fwd_train_dt(dt, x, n, c, hw, hw, L, g, b, 1e-5f, 0.1f, rm, rv, sm, si, NULL, y, relu, scr, st) ||
               sf_cuda_bn_bwd_dt(dt, x, n, c, hw, hw, L, g, b, sm, si, dy, relu ? y : NULL, dx, dg, db, scr, st);
    };
    if (sf_cuda_fill_random_dt(dt, x, len, g_seed++, 2.f, s) || sf_cuda_fill_random_dt(dt, dy, len, g_seed++, 1.f, s) ||
        sf_cuda_fill_random(g, c, g_seed++, 1.f, s) || sf_cuda_fill_random(b, c, g_seed++, 1.f, s) ||
        sf_cuda_fill(rm, c, 0.f, s) || sf_cuda_fill(rv, c, 1.f, s) || enq(s)) {
        fail(nm, sf_cuda_last_error());
    } else {
        CU(cudaStreamSynchronize(s));
        std::vector<char> dx0(len * es), dx1(len * es);
        CU(cudaMemcpy(dx0.data(), dx, len * es, cudaMemcpyDeviceToHost));
        std::vector<float> dg0 = down(dg, c), db0 = down(db, c);
        cudaGraph_t gr;
        cudaGraphExec_t ge;
        CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        const int rc = enq(s);
        const cudaError_t ce = cudaStreamEndCapture(s, &gr);
        if (rc || ce != cudaSuccess || cudaGraphInstantiate(&ge, gr, 0) != cudaSuccess) {
            fail(nm, rc ? sf_cuda_last_error() : "capture failed");
        } else {
            poison(dx, len * es);
            poison_f(dg, c);
            poison_f(db, c);
            CU(cudaGraphLaunch(ge, s));
            CU(cudaStreamSynchronize(s));
            CU(cudaMemcpy(dx1.data(), dx, len * es, cudaMemcpyDeviceToHost));
            std::vector<float> dg1 = down(dg, c), db1 = down(db, c);
            pass_or_fail(nm, dx0 == dx1 && memcmp(dg0.data(), dg1.data(), c * 4) == 0 &&
                                 memcmp(db0.data(), db1.data(), c * 4) == 0,
                         "replay differs from the eager run (non-deterministic or not captured)");
            cudaGraphExecDestroy(ge);
        }
        if (ce == cudaSuccess)
            cudaGraphDestroy(gr);
    }
    cudaFree(x); cudaFree(y); cudaFree(dy); cudaFree(dx); cudaFree(g); cudaFree(b); cudaFree(rm); cudaFree(rv);
    cudaFree(sm); cudaFree(si); cudaFree(dg); cudaFree(db); cudaFree(scr);
}

/* The fp32 launchers. shape {n, c, h, w}; p {relu} */
void cmp_bn(const op_case &c, const op_env &e)
{
    test_bn(e.s, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.lay, c.p[0]);
}
/* The _dt launchers. shape {n, c, h, w}; p {relu, misaligned} */
void cmp_bn_dt(const op_case &c, const op_env &e)
{
    test_bn_dt(e.s, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.lay, c.p[0], c.p[1]);
}
/* The batchnorm with its residual add. shape {n, c, h, w}; p {relu, misaligned} */
void cmp_bn_res(const op_case &c, const op_env &e)
{
    test_bn_res(e.s, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.lay, c.p[0], c.p[1]);
}
void cmp_bn_mask_from_x(const op_case &, const op_env &e) { test_bn_mask_from_x(e.s); }
/* A captured forward+backward replays bit-equal to the eager run. shape {n,
 * c, hw (a square map's side)}; p {relu} */
void cmp_bn_graph_replay(const op_case &c, const op_env &e)
{
    test_bn_graph_replay(e.s, c.dt, c.lay, c.shape[0], c.shape[1], c.shape[2], c.p[0]);
}
