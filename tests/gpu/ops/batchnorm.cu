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
#include "tests/gpu/bn_inputs.h"
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

/* A case's activations on the device, of element type dt, each `mis`
 * elements past an aligned address: r's x and dy (or the residual) uploaded in
 * layout L, y and dx poisoned (io_make). */
static io_bufs bn_io(const bn_ref &r, sf_dtype dt, sf_layout L, int n, int c, int h, int w, int mis)
{
    return io_make(dt, to_lay(r.x, L, n, c, h, w), to_lay(r.dy, L, n, c, h, w), mis);
}

/* The eval forward's reference before any activation (NCHW), on the running
 * statistics the device's training forward left in d. */
static std::vector<double> bn_eval_ref(const bn_ref &r, const bn_dev &d, int n, int c, int h, int w)
{
    const std::vector<float> rm = down(d.rm, c), rv = down(d.rv, c);
    const size_t len = (size_t)n * c * h * w, hw = (size_t)h * w;
    std::vector<double> z(len);
    for (size_t i = 0; i < len; i++) {
        const int ch = (int)((i / hw) % c);
        z[i] = (double)r.gamma[ch] * (((double)r.x[i] - rm[ch]) / sqrt((double)rv[ch] + k_bn_eps)) + r.beta[ch];
    }
    return z;
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

    io_bufs io = bn_io(r, SF_DT_F32, L, n, c, h, w, 0);
    float *d_x = (float *)io.x.p, *d_y = (float *)io.y.p;
    bn_dev d = bn_dev_make(r, n, c, h, w, L);
    int rc = sf_cuda_bn_fwd_train(d_x, n, c, h, w, L, d.g, d.b, eps, mom, d.rm, d.rv, d.sm, d.si, d_y, relu, d.scr, s);
    if (!rc)
        rc = sf_cuda_bn_bwd(d_x, n, c, h, w, L, d.g, d.sm, d.si, (float *)io.dy.p, relu ? d_y : NULL, (float *)io.dx.p,
                            d.dg, d.db, d.scr, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        check_v(subname(nm, "train y"), from_lay(down_dt(io.y, len), L, n, c, h, w), r.yr, k.tol);
        check_bn_stats(nm, c, d, r, k.tol_param);
        check_v(subname(nm, "bwd dx"), from_lay(down_dt(io.dx, len), L, n, c, h, w), dxr, k.tol);
        check_bn_param_grads(nm, c, d, dgr, dbr, k.tol_param);
        /* eval, on the running statistics the device just updated */
        check_bn_fwd(subname(nm, "eval y"), s, io.y, L, n, c, h, w,
                     [&] { return sf_cuda_bn_fwd_eval(d_x, n, c, h, w, L, d.g, d.b, eps, d.rm, d.rv, d_y, relu, s); },
                     yer, k.tol_aux);
    }
    io_free(io);
    bn_dev_free(d);
}

/* ---- BatchNorm2d on dt ------------------------------------------------------------ */

/* The end of a _dt training case, after its backward (rc: the launch's
 * result, the stream waited for): dx (tol) and the fp32 parameter gradients
 * (tol_param) against their references, then the eval forward with the fused
 * activation act (batchnorm.h's code) on the running statistics the training
 * forward updated, against yer (tol_aux). */
static void check_bwd_then_eval(const char *nm, cudaStream_t s, const op_case &k, sf_dtype dt, int rc,
                                const io_bufs &io, const bn_dev &d, sf_layout L, int n, int c, int h, int w, int act,
                                const std::vector<double> &dxr, const std::vector<double> &dgr,
                                const std::vector<double> &dbr, const std::vector<double> &yer)
{
    if (rc) {
        fail(subname(nm, "bwd"), sf_cuda_last_error());
        return;
    }
    check_dt(subname(nm, "bwd dx"), dt, from_lay(down_dt(io.dx, (size_t)n * c * h * w), L, n, c, h, w), dxr, k.tol);
    check_bn_param_grads(nm, c, d, dgr, dbr, k.tol_param);
    check_bn_fwd(subname(nm, "eval y"), s, io.y, L, n, c, h, w, [&] {
        return sf_cuda_bn_fwd_eval_dt(dt, io.x.p, n, c, h, w, L, d.g, d.b, k_bn_eps, d.rm, d.rv, NULL, io.y.p, act, s);
    }, yer, k.tol_aux);
}

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

    io_bufs io = bn_io(r, dt, L, n, c, h, w, mis);
    bn_dev d = bn_dev_make(r, n, c, h, w, L);
    int rc = 0;
    check_bn_fwd(subname(nm, "train y"), s, io.y, L, n, c, h, w, [&] {
        return rc = sf_cuda_bn_fwd_train_dt(dt, io.x.p, n, c, h, w, L, d.g, d.b, eps, mom, d.rm, d.rv, d.sm, d.si, NULL,
                                            io.y.p, relu, d.scr, s);
    }, r.yr, k.tol);
    if (!rc) {
        check_bn_stats(nm, c, d, r, k.tol_param);

        const std::vector<float> y = from_lay(down_dt(io.y, len), L, n, c, h, w);
        if (relu)
            for (size_t i = 0; i < len; i++)
                if (!(y[i] > 0))
                    dyd[i] = 0; /* the ReLU backward, before the BN backward */
        sf_ref_bn2d_bwd_f64(r.xd.data(), n, c, h, w, r.gd.data(), r.smr.data(), r.sir.data(), dyd.data(), dxr.data(),
                            dgr.data(), dbr.data());
        rc = sf_cuda_bn_bwd_dt(dt, io.x.p, n, c, h, w, L, d.g, d.b, d.sm, d.si, io.dy.p, relu ? io.y.p : NULL,
                               io.dx.p, d.dg, d.db, d.scr, s);
        CU(cudaStreamSynchronize(s));
        /* eval, on the running statistics the device just updated */
        std::vector<double> yer = bn_eval_ref(r, d, n, c, h, w);
        if (relu)
            for (double &v : yer)
                v = v > 0 ? v : 0;
        check_bwd_then_eval(nm, s, k, dt, rc, io, d, L, n, c, h, w, relu, dxr, dgr, dbr, yer);
    }
    io_free(io);
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
    io_bufs io = bn_io(r, dt, L, n, c, h, w, mis); /* io.dy: the residual */
    bn_dev d = bn_dev_make(r, n, c, h, w, L);
    check_bn_fwd(subname(nm, "train y"), s, io.y, L, n, c, h, w, [&] {
        return sf_cuda_bn_fwd_train_dt(dt, io.x.p, n, c, h, w, L, d.g, d.b, eps, mom, d.rm, d.rv, d.sm, d.si, io.dy.p,
                                       io.y.p, relu, d.scr, s);
    }, yt, k.tol);
    /* the eval pass uses the running statistics as the reference's */
    up(d.rm, r.rm);
    up(d.rv, r.rv);
    check_bn_fwd(subname(nm, "eval y"), s, io.y, L, n, c, h, w, [&] {
        return sf_cuda_bn_fwd_eval_dt(dt, io.x.p, n, c, h, w, L, d.g, d.b, eps, d.rm, d.rv, io.dy.p, io.y.p, relu, s);
    }, ye, k.tol_aux);
    io_free(io);
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
    const sf_layout L = SF_LAYOUT_NHWC;
    bn_dev_case t = {};
    auto bwd = [&] {
        return sf_cuda_bn_bwd_dt(SF_DT_BF16, t.x, n, c, h, w, L, t.g, t.b, t.sm, t.si, t.dy, t.y, t.dx, t.dg, t.db,
                                 t.scr, s);
    };
    int rc = bn_dev_case_make(t, SF_DT_BF16, n, c, h, w, L, s) ||
             sf_cuda_bn_fwd_train_dt(SF_DT_BF16, t.x, n, c, h, w, L, t.g, t.b, k_bn_eps, k_bn_mom, t.rm, t.rv, t.sm,
                                     t.si, NULL, t.y, 1, t.scr, s) ||
             bwd();
    CU(cudaStreamSynchronize(s));
    std::vector<char> dx0, dg0, db0;
    if (!rc) {
        dx0 = down((const char *)t.dx, t.bytes);
        dg0 = down((const char *)t.dg, c * sizeof(float));
        db0 = down((const char *)t.db, c * sizeof(float));
        poison(t.y, t.bytes);
        poison(t.dx, t.bytes);
        rc = bwd();
        CU(cudaStreamSynchronize(s));
    }
    if (rc)
        fail(nm, sf_cuda_last_error());
    else
        pass_or_fail(nm,
                     down((const char *)t.dx, t.bytes) == dx0 && down((const char *)t.dg, c * sizeof(float)) == dg0 &&
                         down((const char *)t.db, c * sizeof(float)) == db0,
                     "the gradients changed with y");
    pass_or_fail("bn backward reads y except bf16 nhwc with c % 8 == 0",
                 !sf_cuda_bn_bwd_reads_y(SF_DT_BF16, L, 64) && sf_cuda_bn_bwd_reads_y(SF_DT_BF16, L, 60) &&
                     sf_cuda_bn_bwd_reads_y(SF_DT_BF16, SF_LAYOUT_NCHW, 64) && sf_cuda_bn_bwd_reads_y(SF_DT_F32, L, 64),
                 "wrong");
    bn_dev_case_free(t);
}

/* ---- CUDA-graph capture ---------------------------------------------------- */

/* A training forward + backward captured into a CUDA graph replays bit-equal
 * to the eager run (check_graph_replay). */
static void test_bn_graph_replay(cudaStream_t s, sf_dtype dt, sf_layout L, int n, int c, int hw, int relu)
{
    char nm[200];
    snprintf(nm, sizeof nm, "bn %s %s n%d c%d %dx%d%s fwd+bwd: captured graph replays bit-equal", dtname(dt), lname(L),
             n, c, hw, hw, relu ? " +relu" : "");
    bn_dev_case t = {};
    auto enq = [&](cudaStream_t st) {
        return sf_cuda_bn_fwd_train_dt(dt, t.x, n, c, hw, hw, L, t.g, t.b, k_bn_eps, k_bn_mom, t.rm, t.rv, t.sm, t.si,
                                       NULL, t.y, relu, t.scr, st) ||
               sf_cuda_bn_bwd_dt(dt, t.x, n, c, hw, hw, L, t.g, t.b, t.sm, t.si, t.dy, relu ? t.y : NULL, t.dx, t.dg,
                                 t.db, t.scr, st);
    };
    if (bn_dev_case_make(t, dt, n, c, hw, hw, L, s))
        fail(nm, sf_cuda_last_error());
    else
        check_graph_replay(nm, s, enq, {{t.dx, t.bytes}, {t.dg, c * sizeof(float)}, {t.db, c * sizeof(float)}});
    bn_dev_case_free(t);
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
    sf_ref_act_fwd_f64(a, sf_act_prm{}, r.yr.data(), len, yref.data());
    io_bufs io = bn_io(r, dt, L, n, c, h, w, 0);
    bn_dev d = bn_dev_make(r, n, c, h, w, L);
    int rc = 0;
    check_bn_fwd(subname(nm, "train y"), s, io.y, L, n, c, h, w, [&] {
        return rc = sf_cuda_bn_fwd_train_dt(dt, io.x.p, n, c, h, w, L, d.g, d.b, k_bn_eps, k_bn_mom, d.rm, d.rv, d.sm,
                                            d.si, NULL, io.y.p, act, d.scr, s);
    }, yref, k.tol);
    if (rc) {
        io_free(io);
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
    sf_ref_act_bwd_f64(a, sf_act_prm{}, z.data(), dyd.data(), len, g.data());
    sf_ref_bn2d_bwd_f64(r.xd.data(), n, c, h, w, r.gd.data(), r.smr.data(), r.sir.data(), g.data(), dxr.data(),
                        dgr.data(), dbr.data());
    rc = sf_cuda_bn_bwd_act_dt(dt, io.x.p, n, c, h, w, L, d.g, d.b, d.sm, d.si, io.dy.p, act, io.dx.p, d.dg, d.db,
                               d.scr, s);
    CU(cudaStreamSynchronize(s));
    /* eval, on the running statistics the device just updated */
    const std::vector<double> ze = bn_eval_ref(r, d, n, c, h, w);
    std::vector<double> yer(len);
    sf_ref_act_fwd_f64(a, sf_act_prm{}, ze.data(), len, yer.data());
    check_bwd_then_eval(nm, s, k, dt, rc, io, d, L, n, c, h, w, act, dxr, dgr, dbr, yer);
    io_free(io);
    bn_dev_free(d);
}

/* Where the row kernels do not run (fp32, or bf16 NCHW), a fused activation
 * other than ReLU is refused by the backward, naming why, and nothing is
 * written; and an act code outside batchnorm.h's (leaky ReLU's, the first
 * past SF_BN_ACT_LAST) is refused by both. */
static void test_bn_act_refused(cudaStream_t s, sf_dtype dt, sf_layout L)
{
    char nm[120];
    snprintf(nm, sizeof nm, "bn_act %s %s refused", dtname(dt), lname(L));
    const int n = 2, c = 16, h = 4, w = 4;
    const size_t len = (size_t)n * c * h * w;
    bn_ref r = bn_draw(dt, n, c, h, w);
    io_bufs io = bn_io(r, dt, L, n, c, h, w, 0);
    bn_dev d = bn_dev_make(r, n, c, h, w, L);
    const std::vector<float> before = down_dt(io.dx, len);
    const int act = SF_BN_ACT(SF_CUDA_ACT_SILU);
    int rc = sf_cuda_bn_fwd_train_dt(dt, io.x.p, n, c, h, w, L, d.g, d.b, k_bn_eps, k_bn_mom, d.rm, d.rv, d.sm, d.si,
                                     NULL, io.y.p, act, d.scr, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(subname(nm, "setup forward"), sf_cuda_last_error());
    } else {
        rc = sf_cuda_bn_bwd_act_dt(dt, io.x.p, n, c, h, w, L, d.g, d.b, d.sm, d.si, io.dy.p, act, io.dx.p, d.dg, d.db,
                                   d.scr, s);
        CU(cudaStreamSynchronize(s));
        const std::vector<float> after = down_dt(io.dx, len);
        const int same = memcmp(before.data(), after.data(), sizeof(float) * len) == 0;
        if (rc == 0 || !strstr(sf_cuda_last_error(), "row kernels") || !same)
            fail("%s: backward rc %d (%s), dx %s; want a refusal naming the row kernels and dx untouched", nm, rc,
                 sf_cuda_last_error(), same ? "untouched" : "written");
        else
            ok("%s: the backward refuses (%s)", nm, sf_cuda_last_error());
        const int bad = SF_BN_ACT(SF_CUDA_ACT_LEAKY_RELU); /* its slope is not carried */
        const int rf = sf_cuda_bn_fwd_train_dt(dt, io.x.p, n, c, h, w, L, d.g, d.b, k_bn_eps, k_bn_mom, d.rm, d.rv,
                                               d.sm, d.si, NULL, io.y.p, bad, d.scr, s);
        const int rb = sf_cuda_bn_bwd_act_dt(dt, io.x.p, n, c, h, w, L, d.g, d.b, d.sm, d.si, io.dy.p, bad, io.dx.p,
                                             d.dg, d.db, d.scr, s);
        CU(cudaStreamSynchronize(s));
        if (rf == 0 || rb == 0)
            fail("%s: act code %d accepted (forward rc %d, backward rc %d)", nm, bad, rf, rb);
        else
            ok("%s: act code %d refused io.y the forward and the backward", nm, bad);
    }
    io_free(io);
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
