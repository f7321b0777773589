/* tests/gpu/ops/activation.cu — the activations of gpu/cuda/activation.h
 * (ReLU6, sigmoid, SiLU, hardswish, hardsigmoid, GELU erf and tanh, tanh,
 * leaky ReLU at several slopes, negative and above 1 included, ELU at
 * several alphas, SELU, softplus at several betas and thresholds, Mish,
 * affine at several scales and shifts, clamp at two bounds, one and under
 * each gradient rule) against
 * the double-precision reference (sf_ref_act_fwd_f64, sf_ref_act_bwd_f64):
 * forward and backward, fp32 (norm check 1e-5) and bf16 (each element within
 * half a bf16 ulp: check_dt), at odd lengths (the 3x3x7x5 map of the layer
 * tests), a length that leaves a vector tail, one element off 16-byte
 * alignment, in place, and 9 000 003 elements (the kernels' unrolled loop). The activations are elementwise, so one run
 * covers both layouts. Inputs span [-8, 8], so every branch of the clamps is
 * taken; a NaN input must give a NaN output. The rows: tests/gpu/op_cases.cu;
 * helpers and the criteria they apply: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/activation.h"
#include "gpu/model.h" /* SF_CLAMP_GRAD_* */

static const char *const ACT_NAMES[] = {"relu6", "sigmoid",    "silu", "hardswish", "hardsigmoid", "gelu", "gelu_tanh",
                                        "tanh",  "leaky_relu", "elu",  "selu",      "softplus",    "mish", "affine",
                                        "clamp", "square"};
static_assert(sizeof ACT_NAMES / sizeof ACT_NAMES[0] == SF_CUDA_ACT_LAST + 1, "a name per activation");

/* The clamp rule's name in the spec (gpu/layers.c's grad choices). */
static const char *clamp_rule_name(int c)
{
    return c == SF_CLAMP_GRAD_HARDTANH ? "hardtanh" : c == SF_CLAMP_GRAD_CLAMP_CLOSED ? "clamp_closed" : "clamp";
}

/* shape {len}; p {activation (sf_cuda_act), misaligned by one element, in
 * place}; f {the parameters: sf_cuda_act_prm's a, b, c (the rule)} (empty,
 * or those absent: 0, unread) */
void cmp_activation(const op_case &c, const op_env &e)
{
    const cudaStream_t s = e.s;
    const sf_dtype dt = c.dt;
    const int act = c.p[0], mis = c.p[1], in_place = c.p[2];
    const sf_cuda_act_prm prm = {c.f.size() > 0 ? c.f[0] : 0.f, c.f.size() > 1 ? c.f[1] : 0.f,
                                 c.f.size() > 2 ? (int)c.f[2] : 0};
    const sf_act_prm rprm = {prm.a, prm.b, prm.c};
    const size_t len = (size_t)c.shape[0];
    char nm[160], sub[220], at[48] = "";
    if (c.f.size() == 1)
        snprintf(at, sizeof at, " at %g", (double)prm.a);
    else if (c.f.size() == 2)
        snprintf(at, sizeof at, " at %g,%g", (double)prm.a, (double)prm.b);
    else if (c.f.size() > 2)
        snprintf(at, sizeof at, " at %g,%g %s", (double)prm.a, (double)prm.b,
                 clamp_rule_name(prm.c));
    snprintf(nm, sizeof nm, "%s%s %s len %zu%s%s", ACT_NAMES[act], at, dtname(dt), len, mis ? " misaligned" : "",
             in_place ? " in place" : "");
    std::vector<float> x(len), dy(len);
    rand_fill_dt(x, dt, 8.f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(len), dxr(len);
    sf_ref_act_fwd_f64(act, rprm, xd.data(), len, yr.data());
    sf_ref_act_bwd_f64(act, rprm, xd.data(), dyd.data(), len, dxr.data());
    dbuf bx = dbuf_make(dt, len, mis), by = dbuf_make(dt, len, mis), bdy = dbuf_make(dt, len, mis),
         bdx = dbuf_make(dt, len, mis);
    up_dt(bx, x);
    up_dt(bdy, dy);
    poison_dt(by);
    poison_dt(bdx);
    /* in place: the forward over a copy of x in y (the backward still needs
     * x), the backward over dy */
    if (in_place)
        up_dt(by, x);
    const dbuf &yo = by, &dxo = in_place ? bdy : bdx;
    int rc = sf_cuda_act_fwd_dt(dt, (sf_cuda_act)act, prm, in_place ? by.p : bx.p, yo.p, len, s);
    if (!rc)
        rc = sf_cuda_act_bwd_dt(dt, (sf_cuda_act)act, prm, bx.p, bdy.p, dxo.p, len, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s fwd", nm);
        check_dt(sub, dt, down_dt(yo, len), yr, c.tol);
        snprintf(sub, sizeof sub, "%s bwd", nm);
        check_dt(sub, dt, down_dt(dxo, len), dxr, c.tol);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
}

/* A NaN input stays NaN through every activation, the clamps included
 * (leaky ReLU at the slope 0.2, ELU at alpha 0.2, softplus at beta 0.2 and
 * threshold 0: -7 on its log branch, 7 on its linear one; affine at scale
 * 0.2, shift 0; clamp to [0.2, 0.5]). */
void cmp_activation_nan(const op_case &c, const op_env &e)
{
    const cudaStream_t s = e.s;
    const sf_dtype dt = c.dt;
    const size_t len = 5;
    std::vector<float> x = {NAN, -7.f, 7.f, 0.5f, NAN};
    dbuf bx = dbuf_make(dt, len, 0), by = dbuf_make(dt, len, 0);
    up_dt(bx, x);
    for (int act = 0; act <= SF_CUDA_ACT_LAST; act++) {
        char nm[120];
        snprintf(nm, sizeof nm, "%s %s propagates NaN", ACT_NAMES[act], dtname(dt));
        CU(cudaMemset(by.p, 0, len * sf_dtype_size(dt)));
        const sf_cuda_act_prm prm = {0.2f, act == SF_CUDA_ACT_CLAMP ? 0.5f : 0.f, 0};
        const int rc = sf_cuda_act_fwd_dt(dt, (sf_cuda_act)act, prm, bx.p, by.p, len, s);
        CU(cudaStreamSynchronize(s));
        if (rc) {
            fail(nm, sf_cuda_last_error());
            continue;
        }
        const std::vector<float> y = down_dt(by, len);
        pass_or_fail(nm, isnan(y[0]) && isnan(y[4]) && isfinite(y[1]) && isfinite(y[2]) && isfinite(y[3]),
                     "a NaN was clamped, or a finite input gave a non-finite output");
    }
    dbuf_free(bx); dbuf_free(by);
}

/* The clamp at the points random inputs do not reach: x exactly at each
 * bound, beyond both, -0, +-inf and NaN, with dy = inf where the gradient
 * is stopped (x = 2) and 3 elsewhere, against the reference exactly (NaN
 * for NaN, the sign of a zero): no gradient at a bound (dy there under the
 * closed clamp rule), none at a NaN under clamp's rules and dy there under
 * hardtanh's, an open side passing infinities with their gradient. f {min, max, rule}, as cmp_activation. */
void cmp_clamp_edges(const op_case &c, const op_env &e)
{
    const cudaStream_t s = e.s;
    const sf_dtype dt = c.dt;
    const sf_cuda_act_prm prm = {c.f[0], c.f[1], (int)c.f[2]};
    const sf_act_prm rprm = {prm.a, prm.b, prm.c};
    std::vector<float> x = {-2.f, -1.f, -0.5f, 0.f, -0.f, 0.5f, 1.f, 2.f, NAN, INFINITY, -INFINITY};
    if (isfinite(prm.a))
        x.push_back(prm.a);
    if (isfinite(prm.b))
        x.push_back(prm.b);
    const size_t len = x.size();
    std::vector<float> dy(len, 3.f);
    dy[7] = INFINITY; /* x = 2: beyond every upper bound these rows use, or an open side's pass-through */
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(len), dxr(len);
    sf_ref_act_fwd_f64(SF_ACT_CLAMP, rprm, xd.data(), len, yr.data());
    sf_ref_act_bwd_f64(SF_ACT_CLAMP, rprm, xd.data(), dyd.data(), len, dxr.data());
    dbuf bx = dbuf_make(dt, len, 0), by = dbuf_make(dt, len, 0), bdy = dbuf_make(dt, len, 0),
         bdx = dbuf_make(dt, len, 0);
    up_dt(bx, x);
    up_dt(bdy, dy);
    poison_dt(by);
    poison_dt(bdx);
    int rc = sf_cuda_act_fwd_dt(dt, SF_CUDA_ACT_CLAMP, prm, bx.p, by.p, len, s);
    if (!rc)
        rc = sf_cuda_act_bwd_dt(dt, SF_CUDA_ACT_CLAMP, prm, bx.p, bdy.p, bdx.p, len, s);
    CU(cudaStreamSynchronize(s));
    char nm[160];
    snprintf(nm, sizeof nm, "clamp %g,%g %s %s at its bounds, -0, inf and NaN", (double)prm.a, (double)prm.b,
             clamp_rule_name(prm.c), dtname(dt));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        const std::vector<float> y = down_dt(by, len), dx = down_dt(bdx, len);
        size_t bad = len;
        for (size_t i = 0; i < len && bad == len; i++) {
            const float yw = (float)yr[i], dw = (float)dxr[i];
            const bool y_ok = isnan(yw) ? isnan(y[i]) : y[i] == yw && signbit(y[i]) == signbit(yw);
            const bool d_ok = dx[i] == dw && signbit(dx[i]) == signbit(dw);
            if (!y_ok || !d_ok)
                bad = i;
        }
        char why[200] = "";
        if (bad < len)
            snprintf(why, sizeof why, "x = %g: y %g dx %g, the reference's %g and %g", (double)x[bad],
                     (double)y[bad], (double)dx[bad], yr[bad], dxr[bad]);
        pass_or_fail(nm, bad == len, why);
    }
    dbuf_free(bx); dbuf_free(by); dbuf_free(bdy); dbuf_free(bdx);
}

/* An unknown activation is refused, naming it. p {the activation's number} */
void cmp_activation_refused(const op_case &c, const op_env &e)
{
    float *p = dalloc<float>(4);
    const int rc = sf_cuda_act_fwd_dt(SF_DT_F32, (sf_cuda_act)c.p[0], sf_cuda_act_prm{}, p, p, 4, e.s);
    char named[40];
    snprintf(named, sizeof named, "activation %d", c.p[0]);
    pass_or_fail("an unknown activation is refused", rc == -1 && strstr(sf_cuda_last_error(), named),
                 "accepted, or the error does not name it");
    cudaFree(p);
}
