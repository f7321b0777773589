/* tests/gpu/ops/pointwise.cu — the elementwise ops of gpu/cuda/pointwise.h
 * against the reference: ReLU forward/backward, bias + ReLU and its
 * deterministic per-channel gradient (rows and planes, many chunks), the
 * residual add (in place, with ReLU), the gradient handed to an add's two
 * inputs (sf_cuda_grad_fork_dt: masked or not, one or two outputs, over dy,
 * exact); each _dt launcher in fp32 and bf16 at
 * odd lengths and one element off 16-byte alignment (bf16 outputs within half
 * an ulp: check_dt; masks exact); cast bit-exact against sf_bf16_bits; the
 * random fill in bf16. *
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

/* y, dx and dx in place within tol. */
static void test_relu(cudaStream_t s, size_t len, double tol)
{
    char nm[100];
    std::vector<float> x(len), dy(len);
    rand_fill(x, 1.f);
    rand_fill(dy, 1.f);
    std::vector<double> yr(len), dxr(len);
    std::vector<double> xd = to_d(x), dyd = to_d(dy);
    sf_ref_relu_fwd_f64(xd.data(), len, yr.data());
    sf_ref_relu_bwd_f64(yr.data(), dyd.data(), len, dxr.data());
    float *dx = dalloc<float>(len), *dyv = dalloc<float>(len), *y = dalloc<float>(len), *g = dalloc<float>(len);
    up(dx, x);
    up(dyv, dy);
    poison_f(y, len);
    poison_f(g, len);
    snprintf(nm, sizeof nm, "relu_fwd len %zu", len);
    if (ran_ok(s, nm, sf_cuda_relu_fwd(dx, y, len, s)))
        check_f(nm, down(y, len).data(), yr, tol);
    snprintf(nm, sizeof nm, "relu_bwd len %zu", len);
    if (ran_ok(s, nm, sf_cuda_relu_bwd(y, dyv, g, len, s)))
        check_f(nm, down(g, len).data(), dxr, tol);
    snprintf(nm, sizeof nm, "relu_bwd in place len %zu", len);
    if (ran_ok(s, nm, sf_cuda_relu_bwd(y, dyv, dyv, len, s)))
        check_f(nm, down(dyv, len).data(), dxr, tol);
    cudaFree(dx); cudaFree(dyv); cudaFree(y); cudaFree(g);
}

/* db within tol. */
static void test_bias_grad(cudaStream_t s, size_t outer, int c, size_t inner, double tol)
{
    char nm[120];
    snprintf(nm, sizeof nm, "bias_grad outer %zu c %d inner %zu", outer, c, inner);
    const size_t len = outer * c * inner;
    std::vector<float> dy(len);
    rand_fill(dy, 1.f);
    std::vector<double> ref(c, 0.0);
    for (size_t o = 0; o < outer; o++)
        for (int ci = 0; ci < c; ci++)
            for (size_t i = 0; i < inner; i++)
                ref[ci] += dy[(o * c + ci) * inner + i];
    float *d = dalloc<float>(len), *db = dalloc<float>(c), *scr = dalloc<float>(sf_cuda_bias_grad_scratch(c));
    up(d, dy);
    poison_f(db, c);
    if (ran_ok(s, nm, sf_cuda_bias_grad(d, NULL, outer, c, inner, db, scr, s)))
        check_f(nm, down(db, c).data(), ref, tol);
    cudaFree(d); cudaFree(db); cudaFree(scr);
}

/* ---- residual add ------------------------------------------------------------ */

/* y within tol. */
static void test_add(cudaStream_t s, size_t len, int relu, int in_place, double tol)
{
    char nm[120];
    snprintf(nm, sizeof nm, "add%s len %zu%s", relu ? "+relu" : "", len, in_place ? " in place" : "");
    std::vector<float> a(len), b(len), yf(len);
    rand_fill(a, 1.f);
    rand_fill(b, 1.f);
    sf_ref_add_fwd(a.data(), b.data(), len, yf.data());
    std::vector<double> yr = to_d(yf);
    if (relu)
        for (size_t i = 0; i < len; i++)
            yr[i] = yr[i] > 0 ? yr[i] : 0;
    float *d_a = dalloc<float>(len), *d_b = dalloc<float>(len), *d_y = dalloc<float>(len);
    up(d_a, a);
    up(d_b, b);
    poison(d_y, len * 4);
    float *out = in_place ? d_a : d_y;
    if (ran_ok(s, nm, sf_cuda_add(d_a, d_b, out, len, relu, s)))
        check_v(nm, down(out, len), yr, tol);
    cudaFree(d_a); cudaFree(d_b); cudaFree(d_y);
}

/* ---- relu, add, cast, random fill on dt --------------------------------------- */

static void test_relu_dt(cudaStream_t s, sf_dtype dt, size_t len, int mis, int in_place)
{
    char nm[160], sub[220];
    snprintf(nm, sizeof nm, "relu_dt %s len %zu%s%s", dtname(dt), len, mis ? " misaligned" : "",
             in_place ? " in place" : "");
    std::vector<float> x(len), dy(len);
    rand_fill_dt(x, dt, 1.f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> yr(len), dxr(len);
    for (size_t i = 0; i < len; i++) {
        yr[i] = x[i] < 0 ? 0 : x[i];
        dxr[i] = yr[i] > 0 ? dy[i] : 0;
    }
    dbuf bx = dbuf_make(dt, len, mis), by = dbuf_make(dt, len, mis), bdy = dbuf_make(dt, len, mis),
         bdx = dbuf_make(dt, len, 0);
    up_dt(bx, x);
    up_dt(bdy, dy);
    poison_dt(by);
    poison_dt(bdx);
    const dbuf &yo = in_place ? bx : by, &dxo = in_place ? bdy : bdx;
    int rc = sf_cuda_relu_fwd_dt(dt, bx.p, yo.p, len, s);
    if (!rc)
        rc = sf_cuda_relu_bwd_dt(dt, yo.p, bdy.p, dxo.p, len, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s fwd (exact)", nm);
        check_ulp(sub, down_dt(yo, len), yr, 0, 0);
        snprintf(sub, sizeof sub, "%s bwd (exact)", nm);
        check_ulp(sub, down_dt(dxo, len), dxr, 0, 0);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
}

/* sf_cuda_grad_fork_dt: d0 = d1 = (y > 0 ? dy : 0) with a mask, else dy,
 * exactly (the reference's ReLU backward); d1 NULL, d0 over dy, misaligned. */
static void test_grad_fork_dt(cudaStream_t s, sf_dtype dt, size_t len, int relu, int two, int in_place, int mis)
{
    char nm[200];
    snprintf(nm, sizeof nm, "grad_fork %s len %zu%s%s%s%s", dtname(dt), len, relu ? " relu" : "", two ? " two" : "",
             in_place ? " over dy" : "", mis ? " misaligned" : "");
    std::vector<float> y(len), dy(len);
    rand_fill(y, 1.f);
    rand_fill(dy, 1.f);
    for (auto &v : y)
        v = v < 0 ? 0 : v; /* a ReLU's output */
    round_dt(y, dt);
    round_dt(dy, dt);
    std::vector<double> yd = to_d(y), dyd = to_d(dy), r(len);
    if (relu)
        sf_ref_relu_bwd_f64(yd.data(), dyd.data(), len, r.data());
    else
        r = dyd;
    dbuf by = dbuf_make(dt, len, mis), bdy = dbuf_make(dt, len, mis), b0 = dbuf_make(dt, len, mis),
         b1 = dbuf_make(dt, len, mis);
    up_dt(by, y);
    up_dt(bdy, dy);
    poison_dt(b0);
    poison_dt(b1);
    const dbuf &d0 = in_place ? bdy : b0;
    const int rc = sf_cuda_grad_fork_dt(dt, relu ? by.p : NULL, bdy.p, d0.p, two ? b1.p : NULL, len, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        char sub[260];
        snprintf(sub, sizeof sub, "%s d0 (exact)", nm);
        check_ulp(sub, down_dt(d0, len), r, 0, 0);
        if (two) {
            snprintf(sub, sizeof sub, "%s d1 (exact)", nm);
            check_ulp(sub, down_dt(b1, len), r, 0, 0);
        } else {
            std::vector<float> g = down_dt(b1, len);
            size_t kept = 0;
            for (float v : g)
                kept += v != v; /* still the NaN poison */
            snprintf(sub, sizeof sub, "%s d1 NULL leaves the other buffer alone", nm);
            pass_or_fail(sub, kept == len, "written");
        }
    }
    dbuf_free(by); dbuf_free(bdy); dbuf_free(b0); dbuf_free(b1);
}

/* y by check_dt, fp32 within tol. */
static void test_add_dt(cudaStream_t s, sf_dtype dt, size_t len, int relu, int in_place, int mis, double tol)
{
    char nm[160];
    snprintf(nm, sizeof nm, "add_dt %s%s len %zu%s%s", dtname(dt), relu ? " +relu" : "", len,
             in_place ? " in place" : "", mis ? " misaligned" : "");
    std::vector<float> a(len), b(len);
    rand_fill_dt(a, dt, 1.f);
    rand_fill_dt(b, dt, 1.f);
    std::vector<double> yr(len);
    for (size_t i = 0; i < len; i++) {
        const double v = (double)a[i] + b[i];
        yr[i] = relu ? (v > 0 ? v : 0) : v;
    }
    dbuf ba = dbuf_make(dt, len, 0), bb = dbuf_make(dt, len, mis), by = dbuf_make(dt, len, 0);
    up_dt(ba, a);
    up_dt(bb, b);
    poison_dt(by);
    const dbuf &out = in_place ? ba : by;
    if (ran_ok(s, nm, sf_cuda_add_dt(dt, ba.p, bb.p, out.p, len, relu, s)))
        check_dt(nm, dt, down_dt(out, len), yr, tol);
    dbuf_free(ba); dbuf_free(bb); dbuf_free(by);
}

/* fp32 -> bf16 bit-exact against sf_bf16_bits (ties to even, subnormals,
 * overflow to inf; a NaN must stay a NaN), bf16 -> fp32 exact (every bit
 * pattern), and the two same-type copies. */
static void test_cast(cudaStream_t s, size_t len, int mis_src, int mis_dst)
{
    char nm[160], sub[220];
    snprintf(nm, sizeof nm, "cast len %zu src+%d dst+%d", len, mis_src, mis_dst);
    std::vector<float> f(len);
    rand_fill(f, 1.f);
    for (size_t i = 0; i < len; i++) /* spread the exponents over 2^-30 .. 2^30 */
        f[i] = ldexpf(f[i], (int)(sf_hash4(g_seed, i, 7, 0) % 61) - 30);
    g_seed++;
    const float special[] = {0.f,        -0.f,          1.f,       -1.f,      1.00390625f /* 1+2^-8: tie to 1 */,
                             1.01171875f /* 1+3*2^-8: tie to even, up */, 1e-40f, -1e-41f, 3.4028235e38f,
                             -3.3961e38f, INFINITY,     -INFINITY, 65504.f,   1.17549435e-38f, NAN};
    for (size_t i = 0; i < sizeof special / sizeof special[0] && i < len; i++)
        f[i] = special[i];
    std::vector<uint16_t> bits(len);
    for (size_t i = 0; i < len; i++)
        bits[i] = (uint16_t)(sf_hash4(g_seed, i, 8, 0) & 0xffff); /* every pattern, NaNs included */
    g_seed++;

    dbuf sf = dbuf_make(SF_DT_F32, len, mis_src), sb = dbuf_make(SF_DT_BF16, len, mis_src);
    dbuf df = dbuf_make(SF_DT_F32, len, mis_dst), db = dbuf_make(SF_DT_BF16, len, mis_dst);
    CU(cudaMemcpy(sf.p, f.data(), len * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(sb.p, bits.data(), len * 2, cudaMemcpyHostToDevice));
    struct {
        const char *what;
        const dbuf *src, *dst;
    } runs[4] = {{"fp32->bf16", &sf, &db}, {"bf16->fp32", &sb, &df}, {"fp32->fp32", &sf, &df}, {"bf16->bf16", &sb, &db}};
    for (int r = 0; r < 4; r++) {
        snprintf(sub, sizeof sub, "%s %s", nm, runs[r].what);
        poison_dt(*runs[r].dst);
        const int rc = sf_cuda_cast(runs[r].src->p, runs[r].src->dt, runs[r].dst->p, runs[r].dst->dt, len, s);
        CU(cudaStreamSynchronize(s));
        if (rc) {
            fail(sub, sf_cuda_last_error());
            continue;
        }
        size_t bad = 0, first = 0;
        if (runs[r].dst->dt == SF_DT_BF16) {
            std::vector<uint16_t> got(len);
            CU(cudaMemcpy(got.data(), db.p, len * 2, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < len; i++) {
                const uint16_t want = runs[r].src->dt == SF_DT_F32 ? sf_bf16_bits(f[i]) : bits[i];
                const int got_nan = (got[i] & 0x7f80) == 0x7f80 && (got[i] & 0x7f);
                const int want_nan = (want & 0x7f80) == 0x7f80 && (want & 0x7f);
                if (want_nan ? !got_nan : got[i] != want)
                    if (!bad++)
                        first = i;
            }
        } else {
            std::vector<uint32_t> got(len);
            CU(cudaMemcpy(got.data(), df.p, len * 4, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < len; i++) {
                uint32_t want;
                if (runs[r].src->dt == SF_DT_BF16)
                    want = (uint32_t)bits[i] << 16;
                else
                    memcpy(&want, &f[i], 4);
                const int got_nan = (got[i] & 0x7f800000u) == 0x7f800000u && (got[i] & 0x7fffffu);
                const int want_nan = (want & 0x7f800000u) == 0x7f800000u && (want & 0x7fffffu);
                if (want_nan ? !got_nan : got[i] != want)
                    if (!bad++)
                        first = i;
            }
        }
        char why[160];
        snprintf(why, sizeof why, "%zu of %zu elements differ from the host conversion (first at %zu)", bad, len, first);
        pass_or_fail(sub, bad == 0, why);
    }
    dbuf_free(sf); dbuf_free(sb); dbuf_free(df); dbuf_free(db);
}

/* sf_cuda_fill_random_dt: fp32 equals sf_cuda_fill_random bit for bit, bf16 is
 * its rounding (sf_bf16_bits). */
static void test_fill_random_dt(cudaStream_t s, size_t len)
{
    char nm[160];
    snprintf(nm, sizeof nm, "fill_random_dt len %zu", len);
    float *ref = dalloc<float>(len);
    dbuf bf = dbuf_make(SF_DT_F32, len, 0), bb = dbuf_make(SF_DT_BF16, len, 1);
    poison_dt(bf);
    poison_dt(bb);
    int rc = sf_cuda_fill_random(ref, len, 77, 2.5f, s);
    if (!rc)
        rc = sf_cuda_fill_random_dt(SF_DT_F32, bf.p, len, 77, 2.5f, s);
    if (!rc)
        rc = sf_cuda_fill_random_dt(SF_DT_BF16, bb.p, len, 77, 2.5f, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> r = down(ref, len), gf(len);
        std::vector<uint16_t> gb(len);
        CU(cudaMemcpy(gf.data(), bf.p, len * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(gb.data(), bb.p, len * 2, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t i = 0; i < len; i++)
            bad += memcmp(&gf[i], &r[i], 4) != 0 || gb[i] != sf_bf16_bits(r[i]) || !(fabsf(r[i]) <= 2.5f);
        pass_or_fail(nm, bad == 0, "differs from sf_cuda_fill_random (or its bf16 rounding)");
    }
    cudaFree(ref);
    dbuf_free(bf); dbuf_free(bb);
}

/* ---- bias and activation on dt -------------------------------------------------- */
/* [outer, c, inner]: inner == 1 is the NHWC (and [n, f]) view, inner > 1 NCHW. */

/* y by check_dt, fp32 within tol. */
static void test_bias_act_dt(cudaStream_t s, sf_dtype dt, size_t outer, int c, size_t inner, int relu, int bias,
                             int mis, double tol)
{
    char nm[200];
    snprintf(nm, sizeof nm, "bias_act_dt %s [%zu,%d,%zu]%s%s%s", dtname(dt), outer, c, inner, bias ? " +bias" : "",
             relu ? " +relu" : "", mis ? " misaligned" : "");
    const size_t len = outer * c * inner;
    std::vector<float> y(len), b(c);
    rand_fill_dt(y, dt, 1.f);
    rand_fill(b, 0.5f); /* fp32, as the bias is */
    std::vector<double> yr(len);
    for (size_t i = 0; i < len; i++) {
        double v = (double)y[i] + (bias ? (double)b[(i / inner) % c] : 0.0);
        yr[i] = relu ? (v < 0 ? 0 : v) : v;
    }
    dbuf by = dbuf_make(dt, len, mis);
    float *d_b = dalloc<float>(c);
    up_dt(by, y);
    up(d_b, b);
    if (ran_ok(s, nm, sf_cuda_bias_act_dt(dt, by.p, bias ? d_b : NULL, outer, c, inner, relu, s)))
        check_dt(nm, dt, down_dt(by, len), yr, tol);
    dbuf_free(by);
    cudaFree(d_b);
}

/* dy masked in place by y > 0 (when with_y; exact), db = sum of the masked dy
 * per channel (when with_db; fp32, norm check within tol_db for both element
 * types: the sums run in fp32 either way). */
static void test_bias_grad_dt(cudaStream_t s, sf_dtype dt, size_t outer, int c, size_t inner, int with_y,
                              int with_db, int mis, double tol_db)
{
    char nm[200], sub[260];
    snprintf(nm, sizeof nm, "bias_grad_dt %s [%zu,%d,%zu]%s%s%s", dtname(dt), outer, c, inner, with_y ? " relu-mask" : "",
             with_db ? "" : " no db", mis ? " misaligned" : "");
    const size_t len = outer * c * inner;
    std::vector<float> dy(len), y(len);
    rand_fill_dt(dy, dt, 1.f);
    rand_fill_dt(y, dt, 1.f);
    std::vector<double> dyr(len), dbr(c, 0.0);
    for (size_t i = 0; i < len; i++) {
        dyr[i] = with_y ? (y[i] > 0 ? dy[i] : 0) : dy[i];
        dbr[(i / inner) % c] += dyr[i];
    }
    dbuf bdy = dbuf_make(dt, len, mis), by = dbuf_make(dt, len, mis);
    float *d_db = dalloc<float>(c), *scr = dalloc<float>(sf_cuda_bias_grad_scratch(c));
    up_dt(bdy, dy);
    up_dt(by, y);
    poison(d_db, c * 4);
    const int rc = sf_cuda_bias_grad_dt(dt, bdy.p, with_y ? by.p : NULL, outer, c, inner, with_db ? d_db : NULL, scr, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s dy (exact)", nm);
        check_ulp(sub, down_dt(bdy, len), dyr, 0, 0);
        if (with_db) {
            snprintf(sub, sizeof sub, "%s db", nm);
            check_v(sub, down(d_db, c), dbr, tol_db);
        }
    }
    dbuf_free(bdy); dbuf_free(by);
    cudaFree(d_db); cudaFree(scr);
}

/* The fp32 launchers. shape {length}; tol: the outputs (in every check here
 * that has a bound; the others are exact) */
void cmp_relu(const op_case &c, const op_env &e) { test_relu(e.s, (size_t)c.shape[0], c.tol); }
/* shape {outer, c, inner} */
void cmp_bias_grad(const op_case &c, const op_env &e)
{
    test_bias_grad(e.s, (size_t)c.shape[0], c.shape[1], (size_t)c.shape[2], c.tol);
}
/* shape {length}; p {relu, in place} */
void cmp_add(const op_case &c, const op_env &e) { test_add(e.s, (size_t)c.shape[0], c.p[0], c.p[1], c.tol); }
/* The _dt launchers. shape {length}; p {misaligned, in place} */
void cmp_relu_dt(const op_case &c, const op_env &e) { test_relu_dt(e.s, c.dt, (size_t)c.shape[0], c.p[0], c.p[1]); }
/* shape {length}; p {relu, in place, misaligned} */
void cmp_add_dt(const op_case &c, const op_env &e)
{
    test_add_dt(e.s, c.dt, (size_t)c.shape[0], c.p[0], c.p[1], c.p[2], c.tol);
}
/* shape {length}; p {relu, two gradients, in place, misaligned} */
void cmp_grad_fork_dt(const op_case &c, const op_env &e)
{
    test_grad_fork_dt(e.s, c.dt, (size_t)c.shape[0], c.p[0], c.p[1], c.p[2], c.p[3]);
}
/* shape {outer, c, inner}; p {relu, bias, misaligned} */
void cmp_bias_act_dt(const op_case &c, const op_env &e)
{
    test_bias_act_dt(e.s, c.dt, (size_t)c.shape[0], c.shape[1], (size_t)c.shape[2], c.p[0], c.p[1], c.p[2], c.tol);
}
/* shape {outer, c, inner}; p {with y (the ReLU mask), with db, misaligned};
 * tol_param: db */
void cmp_bias_grad_dt(const op_case &c, const op_env &e)
{
    test_bias_grad_dt(e.s, c.dt, (size_t)c.shape[0], c.shape[1], (size_t)c.shape[2], c.p[0], c.p[1], c.p[2],
                      c.tol_param);
}
/* shape {length}; p {source misaligned by, destination misaligned by} */
void cmp_cast(const op_case &c, const op_env &e) { test_cast(e.s, (size_t)c.shape[0], c.p[0], c.p[1]); }
/* shape {length} */
void cmp_fill_random_dt(const op_case &c, const op_env &e) { test_fill_random_dt(e.s, (size_t)c.shape[0]); }
