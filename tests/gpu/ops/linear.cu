/* tests/gpu/ops/linear.cu — the cuBLAS linear layers of gpu/cuda/linear.h
 * against sf_ref_linear_*: fp32 and tf32, through the float and the _dt entry
 * points, bf16 (max-error criterion), ResNet-18's classifier,
 * a refused unknown element type, and the per-pixel layers over a map's
 * channels (sf_linear_map_*) in both layouts, fp32, tf32 and bf16, and the
 * cuBLASLt forwards with the bias in the GEMM (sf_linear_lt_*), fp32, tf32
 * and bf16, with and without a bias.
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

/* y, dx and dw within tol (relative error), the bias gradient within
 * tol_bias. via_dt: through the _dt launchers with SF_DT_F32 (which must be
 * the float functions exactly) instead of the float ones. */
static void test_linear(cublasHandle_t blas, cudaStream_t s, int n, int in, int out, int tf32, int via_dt, double tol,
                        double tol_bias)
{
    char name[160];
    snprintf(name, sizeof name, "linear n%d in%d out%d %s%s", n, in, out, tf32 ? "tf32" : "fp32",
             via_dt ? " via _dt(SF_DT_F32)" : "");
    std::vector<float> x((size_t)n * in), w((size_t)out * in), b(out), dy((size_t)n * out);
    rand_fill(x, 1.f);
    rand_fill(w, 0.5f);
    rand_fill(b, 0.5f);
    rand_fill(dy, 1.f);
    std::vector<double> xd = to_d(x), wd = to_d(w), bd = to_d(b), dyd = to_d(dy);
    std::vector<double> yr((size_t)n * out), dxr((size_t)n * in), dwr((size_t)out * in), dbr(out);
    sf_ref_linear_fwd_f64(xd.data(), n, in, wd.data(), bd.data(), out, yr.data());
    sf_ref_linear_bwd_f64(xd.data(), n, in, wd.data(), out, dyd.data(), dxr.data(), dwr.data(), dbr.data());
    float *dx = dalloc<float>(x.size()), *dw = dalloc<float>(w.size()), *db = dalloc<float>(out),
          *ddy = dalloc<float>(dy.size()), *y = dalloc<float>(yr.size()), *gx = dalloc<float>(x.size()),
          *gw = dalloc<float>(w.size()), *gb = dalloc<float>(out), *scr = dalloc<float>(sf_cuda_bias_grad_scratch(out));
    up(dx, x);
    up(dw, w);
    up(db, b);
    up(ddy, dy);
    poison_f(y, yr.size());
    poison_f(gx, x.size());
    poison_f(gw, w.size());
    poison_f(gb, out);
    int rc = (via_dt ? sf_linear_fwd_dt(blas, SF_DT_F32, dx, n, in, dw, out, y, tf32)
                     : sf_linear_fwd(blas, dx, n, in, dw, out, y, tf32)) ||
             sf_cuda_bias_act(y, db, n, out, 1, 0, s);
    const subname fwd(name, "fwd+bias"), bwd_data(name, "bwd_data"), bwd_filter(name, "bwd_filter"),
        bias_grad(name, "bias_grad");
    if (ran_ok(s, fwd, rc))
        check_f(fwd, down(y, yr.size()).data(), yr, tol);
    rc = via_dt ? sf_linear_bwd_data_dt(blas, SF_DT_F32, ddy, n, in, dw, out, gx, tf32)
                : sf_linear_bwd_data(blas, ddy, n, in, dw, out, gx, tf32);
    if (ran_ok(s, bwd_data, rc))
        check_f(bwd_data, down(gx, x.size()).data(), dxr, tol);
    rc = via_dt ? sf_linear_bwd_filter_dt(blas, SF_DT_F32, dx, n, in, ddy, out, gw, tf32)
                : sf_linear_bwd_filter(blas, dx, n, in, ddy, out, gw, tf32);
    if (ran_ok(s, bwd_filter, rc))
        check_f(bwd_filter, down(gw, w.size()).data(), dwr, tol);
    if (ran_ok(s, bias_grad, sf_cuda_bias_grad(ddy, NULL, n, out, 1, gb, scr, s)))
        check_f(bias_grad, down(gb, out).data(), dbr, tol_bias);
    cudaFree(dx); cudaFree(dw); cudaFree(db); cudaFree(ddy); cudaFree(y); cudaFree(gx); cudaFree(gw); cudaFree(gb);
    cudaFree(scr);
}

/* bf16 linear layer: x, w, dy bf16 (rounded on the host first), y and dx bf16,
 * dw fp32, against the double reference on the same values. y and dx: the
 * bf16 criterion (check_max within tol: fp32 accumulation plus one bf16
 * rounding). dw is fp32 with no output rounding, and each product of two bf16
 * values is exact in fp32, so only the fp32 sum's rounding is left: check_max
 * within tol_dw, which the rows set to 1e-3 (a dw rounded through bf16 on the
 * way, up to 3.9e-3, would typically fail). */
static void test_linear_bf16(cublasHandle_t blas, cudaStream_t s, int n, int in, int out, double tol, double tol_dw)
{
    char name[160];
    snprintf(name, sizeof name, "linear n%d in%d out%d bf16", n, in, out);
    std::vector<float> x((size_t)n * in), w((size_t)out * in), dy((size_t)n * out);
    rand_fill(x, 1.f);
    rand_fill(w, 0.5f);
    rand_fill(dy, 1.f);
    round_bf16(x);
    round_bf16(w);
    round_bf16(dy);
    std::vector<double> xd = to_d(x), wd = to_d(w), dyd = to_d(dy);
    std::vector<double> yr((size_t)n * out), dxr((size_t)n * in), dwr((size_t)out * in);
    sf_ref_linear_fwd_f64(xd.data(), n, in, wd.data(), NULL, out, yr.data());
    sf_ref_linear_bwd_f64(xd.data(), n, in, wd.data(), out, dyd.data(), dxr.data(), dwr.data(), NULL);
    uint16_t *bx = dalloc<uint16_t>(x.size()), *bw = dalloc<uint16_t>(w.size()), *bdy = dalloc<uint16_t>(dy.size()),
             *by = dalloc<uint16_t>(yr.size()), *bgx = dalloc<uint16_t>(x.size());
    float *gw = dalloc<float>(w.size());
    upb(bx, x);
    upb(bw, w);
    upb(bdy, dy);
    poison_b(by, yr.size());
    poison_b(bgx, x.size());
    poison_f(gw, w.size());
    const subname fwd(name, "fwd"), bwd_data(name, "bwd_data"), bwd_filter(name, "bwd_filter (fp32 dw)");
    if (ran_ok(s, fwd, sf_linear_fwd_dt(blas, SF_DT_BF16, bx, n, in, bw, out, by, 0)))
        check_max(fwd, downb(by, yr.size()), yr, tol);
    if (ran_ok(s, bwd_data, sf_linear_bwd_data_dt(blas, SF_DT_BF16, bdy, n, in, bw, out, bgx, 0)))
        check_max(bwd_data, downb(bgx, x.size()), dxr, tol);
    /* tf32 = 1 here: it must not matter for bf16 operands */
    if (ran_ok(s, bwd_filter, sf_linear_bwd_filter_dt(blas, SF_DT_BF16, bx, n, in, bdy, out, gw, 1)))
        check_max(bwd_filter, down(gw, w.size()), dwr, tol_dw);
    cudaFree(bx); cudaFree(bw); cudaFree(bdy); cudaFree(by); cudaFree(bgx); cudaFree(gw);
}

/* The _dt launchers refuse an unknown dtype with a message, touching nothing. */
static void test_linear_bad_dtype(cublasHandle_t blas)
{
    float *p = dalloc<float>(64);
    sf_cuda_clear_error();
    const int a = sf_linear_fwd_dt(blas, (sf_dtype)7, p, 2, 4, p, 4, p, 0);
    const int b = sf_linear_bwd_data_dt(blas, (sf_dtype)7, p, 2, 4, p, 4, p, 0);
    const int c = sf_linear_bwd_filter_dt(blas, (sf_dtype)7, p, 2, 4, p, 4, p, 0);
    if (a == -1 && b == -1 && c == -1 && sf_cuda_last_error()[0]) {
        printf("ok linear _dt refuse dtype 7 (%s)\n", sf_cuda_last_error());
        g_ok++;
    } else {
        fail("linear _dt refuse dtype 7", "accepted");
    }
    sf_cuda_clear_error();
    cudaFree(p);
}

/* A linear layer per pixel over a map's channels ("over": "channels"): x
 * [n, in, h, w] and y [n, out, h, w] in layout lay, against the reference
 * on the pixels as rows. y and dx within tol (check_gemm: relative error in
 * fp32 and tf32, max error in bf16), the fp32 dw's relative error within
 * tol_dw. */
static void test_linear_map(cublasHandle_t blas, cudaStream_t s, sf_dtype dt, sf_layout lay, int tf32, int n, int in,
                            int out, int h, int w, double tol, double tol_dw)
{
    char name[200];
    snprintf(name, sizeof name, "linear over channels n%d in%d out%d %dx%d %s %s", n, in, out, h, w, lname(lay),
             dt == SF_DT_BF16 ? "bf16" : tf32 ? "tf32" : "fp32");
    const size_t hw = (size_t)h * w, nx = (size_t)n * in * hw, ny = (size_t)n * out * hw, nw = (size_t)out * in;
    std::vector<float> x(nx), wt(nw), dy(ny);
    rand_fill_dt(x, dt, 1.f);
    rand_fill_dt(wt, dt, 0.5f);
    rand_fill_dt(dy, dt, 1.f);
    /* the reference on the pixels as rows: NHWC is [n*hw, in] */
    std::vector<double> xr = to_d(to_nhwc(x, n, in, h, w)), dyr = to_d(to_nhwc(dy, n, out, h, w)), wd = to_d(wt);
    std::vector<double> yrows(ny), dxrows(nx), dwr(nw);
    const int rows = (int)((size_t)n * hw);
    sf_ref_linear_fwd_f64(xr.data(), rows, in, wd.data(), NULL, out, yrows.data());
    sf_ref_linear_bwd_f64(xr.data(), rows, in, wd.data(), out, dyr.data(), dxrows.data(), dwr.data(), NULL);
    const std::vector<double> yr = to_nchw(yrows, n, out, h, w), dxr = to_nchw(dxrows, n, in, h, w);
    dbuf bx = dbuf_make(dt, nx, 0), bw = dbuf_make(dt, nw, 0), bdy = dbuf_make(dt, ny, 0), by = dbuf_make(dt, ny, 0),
         bdx = dbuf_make(dt, nx, 0);
    float *gw = dalloc<float>(nw);
    up_dt(bx, to_lay(x, lay, n, in, h, w));
    up_dt(bw, wt);
    up_dt(bdy, to_lay(dy, lay, n, out, h, w));
    poison_dt(by);
    poison_dt(bdx);
    poison_f(gw, nw);
    const int rf = sf_linear_map_fwd_dt(blas, dt, lay, bx.p, n, hw, in, bw.p, out, by.p, tf32);
    const int rd = sf_linear_map_bwd_data_dt(blas, dt, lay, bdy.p, n, hw, in, bw.p, out, bdx.p, tf32);
    const int rw = sf_linear_map_bwd_filter_dt(blas, dt, lay, bx.p, n, hw, in, bdy.p, out, gw, tf32);
    CU(cudaStreamSynchronize(s));
    const subname fwd(name, "fwd"), bwd_data(name, "bwd_data"), bwd_filter(name, "bwd_filter");
    if (rf)
        fail(fwd, sf_cuda_last_error());
    else
        check_gemm(fwd, dt, from_lay(down_dt(by, ny), lay, n, out, h, w), yr, tol);
    if (rd)
        fail(bwd_data, sf_cuda_last_error());
    else
        check_gemm(bwd_data, dt, from_lay(down_dt(bdx, nx), lay, n, in, h, w), dxr, tol);
    if (rw)
        fail(bwd_filter, sf_cuda_last_error());
    else
        check_v(bwd_filter, down(gw, nw), dwr, tol_dw);
    dbuf_free(bx); dbuf_free(bw); dbuf_free(bdy); dbuf_free(by); dbuf_free(bdx);
    cudaFree(gw);
}

/* The cuBLASLt linear forward (sf_linear_lt_*) against the double
 * reference, with the bias in its epilogue (or none), fp32, tf32 and bf16
 * (inputs rounded to bf16 first, as test_linear_bf16). bias: 0 none, 1 fp32,
 * 2 (bf16 only) a bf16 bias (b_bf16), the reference the same rounded values.
 * y within tol (check_gemm: relative error in fp32 and tf32, max error in
 * bf16, one output rounding). must: the plan must build; where cuBLASLt may have no
 * algorithm (odd shapes; an fp32 bias beside a bf16 output) the case prints
 * cuBLASLt's reason (the executor then keeps the cuBLAS path), but what
 * builds must compute the right values. A call with an input one element past a
 * 16-byte boundary must return 1 and leave the output alone, and the
 * forward must replay from a captured CUDA graph. Then the plans timed on
 * stand-ins (tune 8: the fastest of cuBLASLt's candidates) for the forward
 * and for the backward-data GEMM (dgrad, dx = dy w, no bias) against the
 * reference, within the same tol. */
/* test_linear_lt's timed plans: d as its untimed forward plan was made, on
 * bx, bw (by: its output buffer, yr the expected forward). */
static void test_linear_lt_timed(cublasLtHandle_t lt, cudaStream_t s, void *ws, sf_linear_lt_desc d, const dbuf &bx,
                                 const dbuf &bw, dbuf &by, const std::vector<double> &yr, const std::vector<float> &x,
                                 const std::vector<float> &w, const char *name, double tol)
{
    char nm[260];
    const int rows = d.rows, in = d.in, out = d.out, wide = in > out ? in : out;
    dbuf tx = dbuf_make(d.dt, (size_t)rows * wide, 0), ty = dbuf_make(d.dt, (size_t)rows * wide, 0);
    void *tws = NULL;
    CU(cudaMalloc(&tws, d.ws_bytes ? d.ws_bytes : 1));
    poison_dt(tx);
    d.tune = 8;
    d.tx = tx.p;
    d.ty = ty.p;
    d.tws = tws;
    d.ts = s;
    for (int dgrad = 0; dgrad < 2; dgrad++) {
        sf_linear_lt_desc dd = d;
        dd.dgrad = dgrad;
        if (dgrad)
            dd.b = NULL, dd.b_bf16 = 0;
        sf_linear_lt *p = NULL;
        char why[160] = "";
        snprintf(nm, sizeof nm, "%s %s, timed", name, dgrad ? "backward data" : "fwd");
        if (sf_linear_lt_create(&p, lt, &dd, why, sizeof why)) {
            fail(nm, why);
            continue;
        }
        int pick, of;
        sf_linear_lt_pick(p, &pick, &of);
        snprintf(nm, sizeof nm, "%s %s, timed (candidate %d of %d)", name, dgrad ? "backward data" : "fwd", pick, of);
        /* forward: y from x; backward data: dx = dy w with dy random [rows, out] */
        std::vector<double> dxr;
        dbuf bdy = {}, bdx = {};
        if (dgrad) {
            std::vector<float> dy((size_t)rows * out);
            rand_fill_dt(dy, d.dt, 1.f);
            std::vector<double> xd = to_d(x), wd = to_d(w), dyd = to_d(dy), dwr((size_t)out * in), dbr(out);
            dxr.resize((size_t)rows * in);
            sf_ref_linear_bwd_f64(xd.data(), rows, in, wd.data(), out, dyd.data(), dxr.data(), dwr.data(), dbr.data());
            bdy = dbuf_make(d.dt, dy.size(), 0);
            bdx = dbuf_make(d.dt, dxr.size(), 0);
            up_dt(bdy, dy);
        }
        dbuf &got = dgrad ? bdx : by;
        const std::vector<double> &want = dgrad ? dxr : yr;
        poison_dt(got);
        const int rc = dgrad ? sf_linear_lt_bwd_data(p, lt, bdy.p, bw.p, bdx.p, ws, s)
                             : sf_linear_lt_fwd(p, lt, bx.p, bw.p, by.p, ws, s);
        CU(cudaStreamSynchronize(s));
        if (rc)
            fail(nm, rc < 0 ? sf_cuda_last_error() : "returned 1 on aligned pointers");
        else
            check_gemm(nm, d.dt, down_dt(got, want.size()), want, tol);
        if (dgrad) {
            dbuf_free(bdy);
            dbuf_free(bdx);
        }
        sf_linear_lt_destroy(p);
    }
    dbuf_free(tx); dbuf_free(ty);
    cudaFree(tws);
}

static void test_linear_lt(cublasLtHandle_t lt, cudaStream_t s, void *ws, size_t ws_bytes, sf_dtype dt, int tf32,
                           int rows, int in, int out, int bias, int must, double tol)
{
    char name[200], nm[260];
    snprintf(name, sizeof name, "linear cuBLASLt rows%d in%d out%d %s %s", rows, in, out,
             dt == SF_DT_BF16 ? "bf16" : tf32 ? "tf32" : "fp32",
             bias == 2 ? "+bf16 bias" : bias ? "+fp32 bias" : "no bias");
    std::vector<float> x((size_t)rows * in), w((size_t)out * in), b(out);
    rand_fill_dt(x, dt, 1.f);
    rand_fill_dt(w, dt, 0.5f);
    rand_fill(b, 0.5f);
    if (bias == 2)
        round_bf16(b);
    std::vector<double> xd = to_d(x), wd = to_d(w), bd = to_d(b);
    std::vector<double> yr((size_t)rows * out);
    sf_ref_linear_fwd_f64(xd.data(), rows, in, wd.data(), bias ? bd.data() : NULL, out, yr.data());
    dbuf bx = dbuf_make(dt, x.size(), 0), bw = dbuf_make(dt, w.size(), 0), by = dbuf_make(dt, yr.size(), 0),
         bxm = dbuf_make(dt, x.size(), 1), bb16 = dbuf_make(SF_DT_BF16, out, 0);
    float *db = dalloc<float>(out);
    up_dt(bx, x);
    up_dt(bxm, x);
    up_dt(bw, w);
    up(db, b);
    up_dt(bb16, b);
    poison_dt(by);
    sf_linear_lt_desc d;
    memset(&d, 0, sizeof d);
    d.dt = dt;
    d.tf32 = tf32;
    d.rows = rows;
    d.in = in;
    d.out = out;
    d.b = bias == 2 ? bb16.p : bias ? (const void *)db : NULL;
    d.b_bf16 = bias == 2;
    d.w = bw.p;
    d.align_act = 16;
    d.ws_bytes = ws_bytes;
    sf_linear_lt *pf = NULL;
    char why[160] = "";
    const int cf = sf_linear_lt_create(&pf, lt, &d, why, sizeof why);
    snprintf(nm, sizeof nm, "%s fwd", name);
    if (cf && must) {
        fail(nm, why);
    } else if (cf) {
        printf("ok %s: no plan, the cuBLAS path (%s)\n", nm, why);
        g_ok++;
    } else {
        const int rc = sf_linear_lt_fwd(pf, lt, bx.p, bw.p, by.p, ws, s);
        CU(cudaStreamSynchronize(s));
        if (rc)
            fail(nm, rc < 0 ? sf_cuda_last_error() : "returned 1 on aligned pointers");
        else
            check_gemm(nm, dt, down_dt(by, yr.size()), yr, tol);
        /* misaligned input: refused, nothing written */
        poison_dt(by);
        const int rm = sf_linear_lt_fwd(pf, lt, bxm.p, bw.p, by.p, ws, s);
        CU(cudaStreamSynchronize(s));
        const std::vector<float> ym = down_dt(by, yr.size());
        size_t written = 0;
        for (size_t i = 0; i < ym.size(); i++)
            written += isfinite(ym[i]) != 0;
        snprintf(nm, sizeof nm, "%s refuses an input below 16-byte alignment", name);
        pass_or_fail(nm, rm == 1 && written == 0, "ran (or failed) on a misaligned input");
        /* captured once, replayed */
        cudaGraph_t gr = NULL;
        cudaGraphExec_t ge = NULL;
        int rcg = -1;
        CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        rcg = sf_linear_lt_fwd(pf, lt, bx.p, bw.p, by.p, ws, s);
        CU(cudaStreamEndCapture(s, &gr));
        snprintf(nm, sizeof nm, "%s from a CUDA graph", name);
        if (rcg || cudaGraphInstantiate(&ge, gr, 0) != cudaSuccess || cudaGraphLaunch(ge, s) != cudaSuccess) {
            fail(nm, rcg ? sf_cuda_last_error() : "instantiate or launch failed");
        } else {
            CU(cudaStreamSynchronize(s));
            check_gemm(nm, dt, down_dt(by, yr.size()), yr, tol);
        }
        if (ge)
            cudaGraphExecDestroy(ge);
        if (gr)
            cudaGraphDestroy(gr);
    }
    sf_linear_lt_destroy(pf);
    if (!cf)
        test_linear_lt_timed(lt, s, ws, d, bx, bw, by, yr, x, w, name, tol);
    dbuf_free(bx); dbuf_free(bxm); dbuf_free(bw); dbuf_free(by); dbuf_free(bb16);
    cudaFree(db);
}

/* A plan asked of an unknown element type or an impossible shape is refused
 * with a reason, and no plan is kept. */
static void test_linear_lt_refuses(cublasLtHandle_t lt)
{
    sf_linear_lt_desc d;
    memset(&d, 0, sizeof d);
    d.dt = (sf_dtype)7;
    d.rows = d.in = d.out = 8;
    d.align_act = 16;
    sf_linear_lt *p = (sf_linear_lt *)&d;
    char why[160] = "";
    const int a = sf_linear_lt_create(&p, lt, &d, why, sizeof why);
    const int a_ok = a == -1 && p == NULL && why[0];
    d.dt = SF_DT_F32;
    d.rows = 0;
    why[0] = '\0';
    const int b = sf_linear_lt_create(&p, lt, &d, why, sizeof why);
    const int b_ok = b == -1 && p == NULL && why[0];
    d.rows = 8;
    d.b_bf16 = 1; /* a bf16 bias beside fp32 operands */
    why[0] = '\0';
    const int c = sf_linear_lt_create(&p, lt, &d, why, sizeof why);
    pass_or_fail("linear cuBLASLt refuses dtype 7, 0 rows and a bf16 bias in fp32",
                 a_ok && b_ok && c == -1 && p == NULL && why[0], "accepted");
    sf_cuda_clear_error();
}

/* shape {n, in, out}; p {tf32, through the _dt launcher}; tol: y, dx and dw;
 * tol_param: the bias gradient */
void cmp_linear(const op_case &c, const op_env &e)
{
    test_linear(e.blas, e.s, c.shape[0], c.shape[1], c.shape[2], c.p[0], c.p[1], c.tol, c.tol_param);
}
/* shape {n, in, out}; tol: y and dx; tol_param: the fp32 dw */
void cmp_linear_bf16(const op_case &c, const op_env &e)
{
    test_linear_bf16(e.blas, e.s, c.shape[0], c.shape[1], c.shape[2], c.tol, c.tol_param);
}
void cmp_linear_bad_dtype(const op_case &, const op_env &e) { test_linear_bad_dtype(e.blas); }
/* Per pixel over channels. shape {n, in, out, h, w}; p {tf32}; tol: y and
 * dx; tol_param: the fp32 dw */
void cmp_linear_map(const op_case &c, const op_env &e)
{
    test_linear_map(e.blas, e.s, c.dt, c.lay, c.p[0], c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.shape[4],
                    c.tol, c.tol_param);
}
/* The cuBLASLt forward with the bias epilogue. shape {rows, in, out}; p
 * {tf32, bias (2: its bf16 copy), whether the plan must build (test_linear_lt)};
 * tol: y */
void cmp_linear_lt(const op_case &c, const op_env &e)
{
    test_linear_lt(e.lt, e.s, e.ws, e.ws_bytes, c.dt, c.p[0], c.shape[0], c.shape[1], c.shape[2], c.p[1], c.p[2],
                   c.tol);
}
void cmp_linear_lt_refuses(const op_case &, const op_env &e) { test_linear_lt_refuses(e.lt); }
