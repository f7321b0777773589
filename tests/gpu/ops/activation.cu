/* tests/gpu/ops/activation.cu — the activations of gpu/cuda/activation.h
 * (ReLU6, sigmoid, SiLU, hardswish, hardsigmoid, GELU erf and tanh, tanh,
 * leaky ReLU at several slopes, negative and above 1 included, ELU at
 * several alphas, SELU, softplus at several betas and thresholds, Mish,
 * affine at several scales and shifts) against
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

static const char *const ACT_NAMES[] = {"relu6", "sigmoid",    "silu", "hardswish", "hardsigmoid", "gelu", "gelu_tanh",
                                        "tanh",  "leaky_relu", "elu",  "selu",      "softplus",    "mish", "affine"};
static_assert(sizeof ACT_NAMES / sizeof ACT_NAMES[0] == SF_CUDA_ACT_LAST + 1, "a name per activation");

/* shape {len}; p {activation (sf_cuda_act), misaligned by one element, in
 * place}; f {the parameters: sf_cuda_act_prm's a, b} (empty, or b absent:
 * 0, unread) */
void cmp_activation(const op_case &c, const op_env &e)
{
    const cudaStream_t s = e.s;
    const sf_dtype dt = c.dt;
    const int act = c.p[0], mis = c.p[1], in_place = c.p[2];
    const sf_cuda_act_prm prm = {c.f.size() > 0 ? c.f[0] : 0.f, c.f.size() > 1 ? c.f[1] : 0.f};
    const sf_act_prm rprm = {prm.a, prm.b};
    const size_t len = (size_t)c.shape[0];
    char nm[160], sub[220], at[48] = "";
    if (c.f.size() == 1)
        snprintf(at, sizeof at, " at %g", (double)prm.a);
    else if (c.f.size() > 1)
        snprintf(at, sizeof at, " at %g,%g", (double)prm.a, (double)prm.b);
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
 * 0.2, shift 0). */
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
        const int rc = sf_cuda_act_fwd_dt(dt, (sf_cuda_act)act, sf_cuda_act_prm{0.2f, 0.f}, bx.p, by.p, len, s);
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
