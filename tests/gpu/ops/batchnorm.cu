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
#include "gpu/cuda/activation.h"
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

/* ---- BatchNorm2d ----------------------------------------------------------- */

/* Poisons y, runs launch() (a forward writing y, stored in layout L) and
 * checks y against the NCHW reference ref under the name given. */
template <class Launch>
static void check_bn_fwd(const char *name, cudaStream_t s, const dbuf &y, sf_layout L, int n, int c, int h, int w,
                         Launch launch, const std::vector<double> &ref, double tol)
{
    poison_dt(y);
    const int rc = launch();
    CU(cudaStreamSynchronize(s));
    if (rc)
        fail(name, sf_cuda_last_error());
    else
        check_dt(name, y.dt, from_lay(down_dt(y, (size_t)n * c * h * w), L, n, c, h, w), ref, tol);
}

/* A case's inputs, drawn in this order: x (an offset mean: the statistics
 * must not cancel) and a second activation (dy, or the residual) as dt holds
 * them, then the fp32 parameters and running statistics; and the double
 * reference's training forward on them: y (NCHW, before any ReLU), the saved
 * statistics and the updated running ones. */
struct bn_ref {
    std::vector<float> x, dy, gamma, beta, rm, rv;
    std::vector<double> xd, gd, yr, smr, sir, rmr, rvr;
};
static const float k_bn_eps = 1e-5f, k_bn_mom = 0.1f;

static bn_ref bn_draw(sf_dtype dt, int n, int c, int h, int w)
{
    const size_t len = (size_t)n * c * h * w;
    bn_ref r;
    r.x.resize(len);
    r.dy.resize(len);
    r.gamma.resize(c);
    r.beta.resize(c);
    r.rm.resize(c);
    r.rv.resize(c);
    rand_fill_dt(r.x, dt, 2.f, 3.f);
    rand_fill_dt(r.dy, dt, 1.f);
    rand_fill(r.gamma, 0.5f, 1.f);
    rand_fill(r.beta, 0.5f);
    rand_fill(r.rm, 0.5f);
    rand_fill(r.rv, 0.4f, 1.f);
    r.xd = to_d(r.x);
    r.gd = to_d(r.gamma);
    r.rmr = to_d(r.rm);
    r.rvr = to_d(r.rv);
    r.yr.resize(len);
    r.smr.resize(c);
    r.sir.resize(c);
    const std::vector<double> bd = to_d(r.beta);
    sf_ref_bn2d_fwd_train_f64(r.xd.data(), n, c, h, w, r.gd.data(), bd.data(), k_bn_eps, k_bn_mom, r.rmr.data(),
                              r.rvr.data(), r.smr.data(), r.sir.data(), r.yr.data());
    return r;
}

/* The per-channel fp32 tensors on the device: gamma, beta and the running
 * statistics uploaded, the saved statistics and the parameter gradients
 * poisoned; and the launchers' scratch. */
struct bn_dev {
    float *g, *b, *rm, *rv, *sm, *si, *dg, *db;
    void *scr;
};
static bn_dev bn_dev_make(const bn_ref &r, int n, int c, int h, int w, sf_layout L)
{
    bn_dev d;
    float **all[] = {&d.g, &d.b, &d.rm, &d.rv, &d.sm, &d.si, &d.dg, &d.db};
    for (float **p : all)
        *p = dalloc<float>(c);
    d.scr = dalloc<char>(sf_cuda_bn_scratch_bytes(n, c, h, w, L));
    up(d.g, r.gamma);
    up(d.b, r.beta);
    up(d.rm, r.rm);
    up(d.rv, r.rv);
    for (float *p : {d.sm, d.si, d.dg, d.db})
        poison_f(p, c);
    return d;
}
static void bn_dev_free(bn_dev &d)
{
    for (float *p : {d.g, d.b, d.rm, d.rv, d.sm, d.si, d.dg, d.db})
        cudaFree(p);
    cudaFree(d.scr);
}

/* The training forward's per-channel fp32 outputs: the saved statistics and
 * the running statistics it updated. */
static void check_bn_stats(const char *nm, int c, const bn_dev &d, const bn_ref &r, double tol)
{
    check_v(subname(nm, "save_mean"), down(d.sm, c), r.smr, tol);
    check_v(subname(nm, "save_invstd"), down(d.si, c), r.sir, tol);
    check_v(subname(nm, "running_mean"), down(d.rm, c), r.rmr, tol);
    check_v(subname(nm, "running_var"), down(d.rv, c), r.rvr, tol);
}

/* The backward's parameter gradients (fp32). */
static void check_bn_param_grads(const char *nm, int c, const bn_dev &d, const std::vector<double> &dgr,
                                 const std::vector<double> &dbr, double tol)
{
    check_v(subname(nm, "bwd dgamma"), down(d.dg, c), dgr, tol);
    check_v(subname(nm, "bwd dbeta"), down(d.db, c), dbr, tol);
}

/* The fp32 launchers: training forward and backward, then eval on the
 * running statistics the device updated. tol: y and dx; tol_param: the
 * per-channel outputs (statistics and parameter gradients); tol_aux: the
 * eval forward. */
static void test_bn(cudaStream_t s, const op_case &k, int n, int c, int h, int w, sf_layout L, int relu)
{
    char nm[160];
    snprintf(nm, sizeof nm, "bn n%d c%d %dx%d %s%s", n, c, h, w, lname(L), relu ? " +relu" : "");
    const size_t len = (size_t)n * c * h * w;
    const float eps = k_bn_eps, mom = k_bn_mom;
    bn_ref r = bn_draw(SF_DT_F32, n, c, h, w);
    std::vector<double> dyd = to_d(r.dy), dxr(len), dgr(c), dbr(c);
    if (relu) {
        for (size_t i = 0; i < len; i++)
            if (!(r.yr[i] > 0)) {
                r.yr[i] = 0;
                dyd[i] = 0; /* the ReLU backward, before the BN backward */
            }
    }
    sf_ref_bn2d_bwd_f64(r.xd.data(), n, c, h, w, r.gd.data(), r.smr.data(), r.sir.data(), dyd.data(), dxr.data(),
                        dgr.data(), dbr.data());
    /* eval mode, float reference, on the updated running statistics */
    std::vector<float> rm2(c), rv2(c), ye(len);
    for (int i = 0; i < c; i++) {
        rm2[i] = (float)r.rmr[i];
        rv2[i] = (float)r.rvr[i];
    }
    sf_ref_bn2d_fwd_eval(r.x.data(), n, c, h, w, r.gamma.data(), r.beta.data(), eps, rm2.data(), rv2.data(), ye.data());
    std::vector<double> yer = to_d(ye);
    if (relu)
        for (size_t i = 0; i < len; i++)
            yer[i] = yer[i] > 0 ? yer[i] : 0;

    dbuf bx = dbuf_make(SF_DT_F32, len, 0), bdy = dbuf_make(SF_DT_F32, len, 0), by = dbuf_make(SF_DT_F32, len, 0),
         bdx = dbuf_make(SF_DT_F32, len, 0);
    float *d_x = (float *)bx.p, *d_y = (float *)by.p;
    bn_dev d = bn_dev_make(r, n, c, h, w, L);
    up_dt(bx, to_lay(r.x, L, n, c, h, w));
    up_dt(bdy, to_lay(r.dy, L, n, c, h, w));
    poison_dt(by);
    poison_dt(bdx);
    int rc = sf_cuda_bn_fwd_train(d_x, n, c, h, w, L, d.g, d.b, eps, mom, d.rm, d.rv, d.sm, d.si, d_y, relu, d.scr, s);
    if (!rc)
        rc = sf_cuda_bn_bwd(d_x, n, c, h, w, L, d.g, d.sm, d.si, (float *)bdy.p, relu ? d_y : NULL, (float *)bdx.p,
                            d.dg, d.db, d.scr, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        check_v(subname(nm, "train y"), from_lay(down_dt(by, len), L, n, c, h, w), r.yr, k.tol);
        check_bn_stats(nm, c, d, r, k.tol_param);
        check_v(subname(nm, "bwd dx"), from_lay(down_dt(bdx, len), L, n, c, h, w), dxr, k.tol);
        check_bn_param_grads(nm, c, d, dgr, dbr, k.tol_param);
        /* eval, on the running statistics the device just updated */
        check_bn_fwd(subname(nm, "eval y"), s, by, L, n, c, h, w,
                     [&] { return sf_cuda_bn_fwd_eval(d_x, n, c, h, w, L, d.g, d.b, eps, d.rm, d.rv, d_y, relu, s); },
                     yer, k.tol_aux);
    }
    dbuf_free(bx); dbuf_free(bdy); dbuf_free(by); dbuf_free(bdx);
    bn_dev_free(d);
}

/* ---- BatchNorm2d on dt ------------------------------------------------------------ */

/* Training forward (optionally with the fused ReLU), backward, then eval on
 * the running statistics the device updated. The backward's reference masks dy
 * with the device's own ReLU output (a value the two sides round to opposite
 * sides of zero would otherwise flip a mask bit). tol: y and dx (check_dt);
 * tol_param: the per-channel fp32 outputs (statistics and parameter
 * gradients), a bound per element type; tol_aux: the eval forward. mis:
 * every activation pointer one element off 16-byte alignment (the scalar
 * fallbacks). */
static void test_bn_dt(cudaStream_t s, const op_case &k, sf_dtype dt, int n, int c, int h, int w, sf_layout L,
                       int relu, int mis)
{
    char nm[200];
    snprintf(nm, sizeof nm, "bn_dt %s n%d c%d %dx%d %s%s%s", dtname(dt), n, c, h, w, lname(L), relu ? " +relu" : "",
             mis ? " misaligned" : "");
    const size_t len = (size_t)n * c * h * w;
    const float eps = k_bn_eps, mom = k_bn_mom;
    bn_ref r = bn_draw(dt, n, c, h, w);
    std::vector<double> dyd = to_d(r.dy), dxr(len), dgr(c), dbr(c);
    if (relu)
        for (size_t i = 0; i < len; i++)
            r.yr[i] = r.yr[i] > 0 ? r.yr[i] : 0;

    dbuf bx = dbuf_make(dt, len, mis), by = dbuf_make(dt, len, mis), bdy = dbuf_make(dt, len, mis),
         bdx = dbuf_make(dt, len, mis);
    bn_dev d = bn_dev_make(r, n, c, h, w, L);
    up_dt(bx, to_lay(r.x, L, n, c, h, w));
    up_dt(bdy, to_lay(r.dy, L, n, c, h, w));
    poison_dt(bdx);
    int rc = 0;
    check_bn_fwd(subname(nm, "train y"), s, by, L, n, c, h, w, [&] {
        return rc = sf_cuda_bn_fwd_train_dt(dt, bx.p, n, c, h, w, L, d.g, d.b, eps, mom, d.rm, d.rv, d.sm, d.si, NULL,
                                            by.p, relu, d.scr, s);
    }, r.yr, k.tol);
    if (!rc) {
        check_bn_stats(nm, c, d, r, k.tol_param);

        const std::vector<float> y = from_lay(down_dt(by, len), L, n, c, h, w);
        if (relu)
            for (size_t i = 0; i < len; i++)
                if (!(y[i] > 0))
                    dyd[i] = 0; /* the ReLU backward, before the BN backward */
        sf_ref_bn2d_bwd_f64(r.xd.data(), n, c, h, w, r.gd.data(), r.smr.data(), r.sir.data(), dyd.data(), dxr.data(),
                            dgr.data(), dbr.data());
        rc = sf_cuda_bn_bwd_dt(dt, bx.p, n, c, h, w, L, d.g, d.b, d.sm, d.si, bdy.p, relu ? by.p : NULL, bdx.p, d.dg,
                               d.db, d.scr, s);
        CU(cudaStreamSynchronize(s));
        if (rc) {
            fail(subname(nm, "bwd"), sf_cuda_last_error());
        } else {
            check_dt(subname(nm, "bwd dx"), dt, from_lay(down_dt(bdx, len), L, n, c, h, w), dxr, k.tol);
            check_bn_param_grads(nm, c, d, dgr, dbr, k.tol_param);

            /* eval, on the running statistics the device just updated */
            std::vector<float> rm2 = down(d.rm, c), rv2 = down(d.rv, c);
            std::vector<double> yer(len);
            const size_t hw = (size_t)h * w;
            for (size_t i = 0; i < len; i++) {
                const int ch = (int)((i / hw) % c);
                const double v =
                    (double)r.gamma[ch] * (((double)r.x[i] - rm2[ch]) / sqrt((double)rv2[ch] + eps)) + r.beta[ch];
                yer[i] = relu ? (v > 0 ? v : 0) : v;
            }
            check_bn_fwd(subname(nm, "eval y"), s, by, L, n, c, h, w, [&] {
                return sf_cuda_bn_fwd_eval_dt(dt, bx.p, n, c, h, w, L, d.g, d.b, eps, d.rm, d.rv, NULL, by.p, relu, s);
            }, yer, k.tol_aux);
        }
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
    bn_dev_free(d);
}

/* The forwards with a residual (res): y = relu?(bn(x) + res) against the
 * reference batchnorm plus the add, training and eval, both layouts, the row
 * kernels and the generic ones (C % 8 != 0, misaligned). tol: the training
 * forward (check_dt); tol_aux: the eval forward. */
static void test_bn_res(cudaStream_t s, const op_case &k, sf_dtype dt, int n, int c, int h, int w, sf_layout L,
                        int relu, int mis)
{
    char nm[200];
    snprintf(nm, sizeof nm, "bn_dt+res %s n%d c%d %dx%d %s%s%s", dtname(dt), n, c, h, w, lname(L),
             relu ? " +relu" : "", mis ? " misaligned" : "");
    const size_t len = (size_t)n * c * h * w;
    const float eps = k_bn_eps, mom = k_bn_mom;
    bn_ref r = bn_draw(dt, n, c, h, w); /* dy holds the residual */
    std::vector<double> yt = r.yr, ye(len);
    for (int b = 0; b < n; b++) /* eval: the running statistics before the update, in double (NCHW) */
        for (int ch = 0; ch < c; ch++)
            for (int q = 0; q < h * w; q++) {
                const size_t e = ((size_t)b * c + ch) * h * w + q;
                ye[e] = (r.xd[e] - (double)r.rm[ch]) / sqrt((double)r.rv[ch] + (double)eps) * r.gd[ch] + r.beta[ch];
            }
    for (size_t i = 0; i < len; i++) {
        yt[i] += r.dy[i];
        ye[i] += r.dy[i];
        if (relu) {
            yt[i] = yt[i] > 0 ? yt[i] : 0;
            ye[i] = ye[i] > 0 ? ye[i] : 0;
        }
    }
    dbuf bx = dbuf_make(dt, len, mis), br = dbuf_make(dt, len, mis), by = dbuf_make(dt, len, mis);
    bn_dev d = bn_dev_make(r, n, c, h, w, L);
    up_dt(bx, to_lay(r.x, L, n, c, h, w));
    up_dt(br, to_lay(r.dy, L, n, c, h, w));
    check_bn_fwd(subname(nm, "train y"), s, by, L, n, c, h, w, [&] {
        return sf_cuda_bn_fwd_train_dt(dt, bx.p, n, c, h, w, L, d.g, d.b, eps, mom, d.rm, d.rv, d.sm, d.si, br.p, by.p,
                                       relu, d.scr, s);
    }, yt, k.tol);
    /* the eval pass uses the running statistics as the reference's */
    up(d.rm, r.rm);
    up(d.rv, r.rv);
    check_bn_fwd(subname(nm, "eval y"), s, by, L, n, c, h, w, [&] {
        return sf_cuda_bn_fwd_eval_dt(dt, bx.p, n, c, h, w, L, d.g, d.b, eps, d.rm, d.rv, br.p, by.p, relu, s);
    }, ye, k.tol_aux);
    dbuf_free(bx); dbuf_free(br); dbuf_free(by);
    bn_dev_free(d);
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

/* A batchnorm with another activation fused (act, SF_BN_ACT of batchnorm.h),
 * bf16 NHWC (the row kernels, where sf_cuda_bn_bwd_act_dt runs): the
 * training forward against the reference batchnorm then activation; the
 * backward against the reference activation backward then batchnorm
 * backward, the activation's derivative taken at the normalised value the
 * device computes (bn_out's arithmetic from the device's own statistics, so
 * a value next to a kink of ReLU6 or hardswish cannot land on the other
 * side in the reference); then the eval forward. tol: y and dx;
 * tol_param: the per-channel outputs; tol_aux: the eval forward. */
static void test_bn_act(cudaStream_t s, const op_case &k, sf_dtype dt, int n, int c, int h, int w, sf_layout L,
                        int a)
{
    char nm[200];
    snprintf(nm, sizeof nm, "bn_act %s n%d c%d %dx%d %s act %d", dtname(dt), n, c, h, w, lname(L), a);
    const int act = SF_BN_ACT(a);
    const size_t len = (size_t)n * c * h * w, hw = (size_t)h * w;
    bn_ref r = bn_draw(dt, n, c, h, w);
    std::vector<double> yref(len), dxr(len), dgr(c), dbr(c);
    sf_ref_act_fwd_f64(a, r.yr.data(), len, yref.data());
    dbuf bx = dbuf_make(dt, len, 0), by = dbuf_make(dt, len, 0), bdy = dbuf_make(dt, len, 0),
         bdx = dbuf_make(dt, len, 0);
    bn_dev d = bn_dev_make(r, n, c, h, w, L);
    up_dt(bx, to_lay(r.x, L, n, c, h, w));
    up_dt(bdy, to_lay(r.dy, L, n, c, h, w));
    poison_dt(bdx);
    int rc = 0;
    check_bn_fwd(subname(nm, "train y"), s, by, L, n, c, h, w, [&] {
        return rc = sf_cuda_bn_fwd_train_dt(dt, bx.p, n, c, h, w, L, d.g, d.b, k_bn_eps, k_bn_mom, d.rm, d.rv, d.sm,
                                            d.si, NULL, by.p, act, d.scr, s);
    }, yref, k.tol);
    if (rc) {
        dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
        bn_dev_free(d);
        return;
    }
    check_bn_stats(nm, c, d, r, k.tol_param);
    const std::vector<float> sm = down(d.sm, c), si = down(d.si, c);
    std::vector<double> z(len), g(len);
    for (size_t i = 0; i < len; i++) {
        const int ch = (int)((i / hw) % c);
        volatile float dv = r.x[i] - sm[ch];
        volatile float sv = dv * si[ch];
        z[i] = (double)fmaf(sv, r.gamma[ch], r.beta[ch]);
    }
    const std::vector<double> dyd = to_d(r.dy);
    sf_ref_act_bwd_f64(a, z.data(), dyd.data(), len, g.data());
    sf_ref_bn2d_bwd_f64(r.xd.data(), n, c, h, w, r.gd.data(), r.smr.data(), r.sir.data(), g.data(), dxr.data(),
                        dgr.data(), dbr.data());
    rc = sf_cuda_bn_bwd_act_dt(dt, bx.p, n, c, h, w, L, d.g, d.b, d.sm, d.si, bdy.p, act, bdx.p, d.dg, d.db, d.scr,
                               s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(subname(nm, "bwd"), sf_cuda_last_error());
    } else {
        check_dt(subname(nm, "bwd dx"), dt, from_lay(down_dt(bdx, len), L, n, c, h, w), dxr, k.tol);
        check_bn_param_grads(nm, c, d, dgr, dbr, k.tol_param);
        /* eval, on the running statistics the device just updated */
        const std::vector<float> rm2 = down(d.rm, c), rv2 = down(d.rv, c);
        std::vector<double> ze(len), yer(len);
        for (size_t i = 0; i < len; i++) {
            const int ch = (int)((i / hw) % c);
            ze[i] = (double)r.gamma[ch] * (((double)r.x[i] - rm2[ch]) / sqrt((double)rv2[ch] + k_bn_eps)) +
                    r.beta[ch];
        }
        sf_ref_act_fwd_f64(a, ze.data(), len, yer.data());
        check_bn_fwd(subname(nm, "eval y"), s, by, L, n, c, h, w, [&] {
            return sf_cuda_bn_fwd_eval_dt(dt, bx.p, n, c, h, w, L, d.g, d.b, k_bn_eps, d.rm, d.rv, NULL, by.p, act, s);
        }, yer, k.tol_aux);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
    bn_dev_free(d);
}

/* Where the row kernels do not run (fp32, or bf16 NCHW), a fused activation
 * other than ReLU is refused by the backward, naming why, and nothing is
 * written; and an act code outside batchnorm.h's is refused by both. */
static void test_bn_act_refused(cudaStream_t s, sf_dtype dt, sf_layout L)
{
    char nm[120];
    snprintf(nm, sizeof nm, "bn_act %s %s refused", dtname(dt), lname(L));
    const int n = 2, c = 16, h = 4, w = 4;
    const size_t len = (size_t)n * c * h * w;
    bn_ref r = bn_draw(dt, n, c, h, w);
    dbuf bx = dbuf_make(dt, len, 0), by = dbuf_make(dt, len, 0), bdy = dbuf_make(dt, len, 0),
         bdx = dbuf_make(dt, len, 0);
    bn_dev d = bn_dev_make(r, n, c, h, w, L);
    up_dt(bx, to_lay(r.x, L, n, c, h, w));
    up_dt(bdy, to_lay(r.dy, L, n, c, h, w));
    poison_dt(bdx);
    const std::vector<float> before = down_dt(bdx, len);
    const int act = SF_BN_ACT(SF_CUDA_ACT_SILU);
    int rc = sf_cuda_bn_fwd_train_dt(dt, bx.p, n, c, h, w, L, d.g, d.b, k_bn_eps, k_bn_mom, d.rm, d.rv, d.sm, d.si,
                                     NULL, by.p, act, d.scr, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(subname(nm, "setup forward"), sf_cuda_last_error());
    } else {
        rc = sf_cuda_bn_bwd_act_dt(dt, bx.p, n, c, h, w, L, d.g, d.b, d.sm, d.si, bdy.p, act, bdx.p, d.dg, d.db,
                                   d.scr, s);
        CU(cudaStreamSynchronize(s));
        const std::vector<float> after = down_dt(bdx, len);
        const int same = memcmp(before.data(), after.data(), sizeof(float) * len) == 0;
        if (rc == 0 || !strstr(sf_cuda_last_error(), "row kernels") || !same)
            fail("%s: backward rc %d (%s), dx %s; want a refusal naming the row kernels and dx untouched", nm, rc,
                 sf_cuda_last_error(), same ? "untouched" : "written");
        else
            ok("%s: the backward refuses (%s)", nm, sf_cuda_last_error());
        const int bad = SF_BN_ACT(SF_CUDA_ACT_GELU_TANH) + 1;
        const int rf = sf_cuda_bn_fwd_train_dt(dt, bx.p, n, c, h, w, L, d.g, d.b, k_bn_eps, k_bn_mom, d.rm, d.rv,
                                               d.sm, d.si, NULL, by.p, bad, d.scr, s);
        const int rb = sf_cuda_bn_bwd_act_dt(dt, bx.p, n, c, h, w, L, d.g, d.b, d.sm, d.si, bdy.p, bad, bdx.p, d.dg,
                                             d.db, d.scr, s);
        CU(cudaStreamSynchronize(s));
        if (rf == 0 || rb == 0)
            fail("%s: act code %d accepted (forward rc %d, backward rc %d)", nm, bad, rf, rb);
        else
            ok("%s: act code %d refused by the forward and the backward", nm, bad);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
    bn_dev_free(d);
}

/* The fp32 launchers. shape {n, c, h, w}; p {relu}; tol, tol_param,
 * tol_aux: test_bn's comment */
void cmp_bn(const op_case &c, const op_env &e)
{
    test_bn(e.s, c, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.lay, c.p[0]);
}
/* The _dt launchers. shape {n, c, h, w}; p {relu, misaligned}; tol,
 * tol_param, tol_aux: test_bn_dt's comment */
void cmp_bn_dt(const op_case &c, const op_env &e)
{
    test_bn_dt(e.s, c, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.lay, c.p[0], c.p[1]);
}
/* The batchnorm with its residual add. shape {n, c, h, w}; p {relu,
 * misaligned}; tol, tol_aux: test_bn_res's comment */
void cmp_bn_res(const op_case &c, const op_env &e)
{
    test_bn_res(e.s, c, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.lay, c.p[0], c.p[1]);
}
void cmp_bn_mask_from_x(const op_case &, const op_env &e) { test_bn_mask_from_x(e.s); }
/* A captured forward+backward replays bit-equal to the eager run. shape {n,
 * c, hw (a square map's side)}; p {relu} */
void cmp_bn_graph_replay(const op_case &c, const op_env &e)
{
    test_bn_graph_replay(e.s, c.dt, c.lay, c.shape[0], c.shape[1], c.shape[2], c.p[0]);
}
/* A batchnorm with another activation fused. shape {n, c, h, w}; p {the
 * activation, activation.h's code}; tol, tol_param, tol_aux: test_bn_act's
 * comment */
void cmp_bn_act(const op_case &c, const op_env &e)
{
    test_bn_act(e.s, c, c.dt, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.lay, c.p[0]);
}
void cmp_bn_act_refused(const op_case &c, const op_env &e) { test_bn_act_refused(e.s, c.dt, c.lay); }
