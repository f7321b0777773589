/* gpu/ref/activation.c — reference activations (ReLU6, sigmoid, SiLU,
 * hardswish, hardsigmoid, GELU erf and tanh, tanh, leaky ReLU with its
 * slope, ELU with its alpha, SELU, softplus with its beta and threshold,
 * Mish, the affine layer's scale * x + shift and the clamp layer's
 * bounds), forward and backward, in float and double (_f64), and their
 * layers' hooks. Contracts in gpu/ref/layers.h; formulas and edge cases are
 * PyTorch's. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <tgmath.h>

#define SF_REF_SELF "activation.c"
#include "gpu/ref/generic.h"

/* ---- the activation layers' hooks (gpu/layers.c) -------------------------- */

static int act_of(sf_layer_kind k)
{
    switch (k) {
    case SF_L_RELU6: return SF_ACT_RELU6;
    case SF_L_SIGMOID: return SF_ACT_SIGMOID;
    case SF_L_SILU: return SF_ACT_SILU;
    case SF_L_HARDSWISH: return SF_ACT_HARDSWISH;
    case SF_L_HARDSIGMOID: return SF_ACT_HARDSIGMOID;
    case SF_L_TANH: return SF_ACT_TANH;
    case SF_L_LEAKY_RELU: return SF_ACT_LEAKY_RELU;
    case SF_L_ELU: return SF_ACT_ELU;
    case SF_L_SELU: return SF_ACT_SELU;
    case SF_L_SOFTPLUS: return SF_ACT_SOFTPLUS;
    case SF_L_MISH: return SF_ACT_MISH;
    case SF_L_AFFINE: return SF_ACT_AFFINE;
    case SF_L_CLAMP: return SF_ACT_CLAMP;
    case SF_L_SQUARE: return SF_ACT_SQUARE;
    default: return SF_ACT_GELU;
    }
}

/* The activation layer L computes, and its parameters. */
static int act_of_layer(const sf_layer *L, sf_act_prm *prm)
{
    const int act = act_of(L->kind);
    *prm = (sf_act_prm){0, 0, 0};
    if (act == SF_ACT_LEAKY_RELU)
        prm->a = L->negative_slope;
    else if (act == SF_ACT_ELU)
        prm->a = L->alpha;
    else if (act == SF_ACT_SOFTPLUS)
        *prm = (sf_act_prm){L->beta, L->threshold, 0};
    else if (act == SF_ACT_AFFINE)
        *prm = (sf_act_prm){L->affine_scale, L->affine_shift, 0};
    else if (act == SF_ACT_CLAMP)
        *prm = (sf_act_prm){L->clamp_min, L->clamp_max, L->clamp_grad};
    return act == SF_ACT_GELU && L->approximate ? SF_ACT_GELU_TANH : act;
}

void sf_ref_layer_act_fwd(const sf_ref_io *io)
{
    sf_act_prm prm;
    const int act = act_of_layer(io->L, &prm);
    sf_ref_act_fwd(act, prm, io->x[0], (size_t)io->n * io->L->out_elems, io->y);
}

void sf_ref_layer_act_bwd(const sf_ref_io *io)
{
    if (!io->want[0])
        return;
    sf_act_prm prm;
    const int act = act_of_layer(io->L, &prm);
    sf_ref_act_bwd(act, prm, io->x[0], io->dy, (size_t)io->n * io->L->out_elems, io->scratch);
    io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* y = f(x) elementwise; x == y is allowed. ELU and SELU take expm1 (as
 * PyTorch's CUDA kernel; its CPU one's exp - 1 differs by a rounding), their
 * x > 0 branch, and softplus its linear branch where beta * x > threshold,
 * as PyTorch's kernels test. */
void SF_FN(sf_ref_act_fwd)(int act, sf_act_prm prm, const T *x, size_t len, T *y)
{
    const T k0 = (T)0.7978845608028654, k1 = (T)0.044715; /* sqrt(2/pi); GELU's tanh form */
    /* SELU's coefficients as PyTorch forms them: the negative branch's is alpha * scale */
    const T sa = (T)SF_SELU_ALPHA * (T)SF_SELU_SCALE, ss = (T)SF_SELU_SCALE;
    const T pa = (T)prm.a, pb = (T)prm.b;
    for (size_t i = 0; i < len; i++) {
        const T v = x[i];
        T r;
        switch (act) {
        case SF_ACT_RELU6: r = v < (T)0 ? (T)0 : v > (T)6 ? (T)6 : v; break;
        case SF_ACT_SIGMOID: r = (T)1 / ((T)1 + exp(-v)); break;
        case SF_ACT_SILU: r = v / ((T)1 + exp(-v)); break;
        case SF_ACT_HARDSWISH: r = v <= (T)-3 ? (T)0 : v >= (T)3 ? v : v * (v + (T)3) / (T)6; break;
        case SF_ACT_HARDSIGMOID: r = v <= (T)-3 ? (T)0 : v >= (T)3 ? (T)1 : v / (T)6 + (T)0.5; break;
        case SF_ACT_GELU_TANH: r = (T)0.5 * v * ((T)1 + tanh(k0 * (v + k1 * v * v * v))); break;
        case SF_ACT_TANH: r = tanh(v); break;
        case SF_ACT_LEAKY_RELU: r = v > (T)0 ? v : v * pa; break;
        case SF_ACT_ELU: r = v > (T)0 ? v : expm1(v) * pa; break;
        case SF_ACT_SELU: r = v > (T)0 ? v * ss : expm1(v) * sa; break;
        case SF_ACT_SOFTPLUS: r = v * pa > pb ? v : log1p(exp(v * pa)) / pa; break;
        case SF_ACT_MISH: r = v * tanh(log1p(exp(v))); break;
        case SF_ACT_AFFINE: r = v * pa + pb; break; /* PyTorch's x * c + d: two roundings */
        case SF_ACT_SQUARE: r = v * v; break;
        case SF_ACT_CLAMP: r = v < pa ? pa : v > pb ? pb : v; break; /* -0 within [0, 1] stays -0, as torch's */
        default: r = (T)0.5 * v * ((T)1 + erf(v * (T)0.7071067811865476)); break;
        }
        if (isnan(v))
            r = v; /* NaN propagates through the clamps too */
        y[i] = r;
    }
}

/* dx = dy * f'(x), with PyTorch's choices at the kinks (ReLU6 and
 * hardsigmoid pass no gradient at their corners; hardswish takes x/3 + 1/2
 * on [-3, 3]; leaky ReLU takes the slope at 0, as leaky_relu_backward's
 * x > 0 test does). tanh's 1 - tanh(x)^2 is PyTorch's 1 - y^2 at the y its
 * forward wrote. ELU and SELU are elu_backward's is_result = false branch
 * (what autograd calls for F.elu and torch.selu): x <= 0 takes
 * alpha * scale * exp(x), so the gradient at 0 is alpha * scale, and a NaN
 * takes the scale; softplus is softplus_backward's (1 where
 * beta * x > threshold, else z / (z + 1), z = exp(beta * x)); Mish is
 * mish_backward's tanh(sp) + x * sigmoid(x) * (1 - tanh(sp)^2), sp the
 * softplus of x; affine's is its scale wherever x is (x may be dy then);
 * clamp's is 1 strictly between its bounds and 0 at or beyond one, an
 * open-ended side (an infinite bound) testing nothing, and at a NaN 0 under
 * clamp's rule, 1 under hardtanh's; under the closed clamp rule 1 at the
 * bounds too (gpu/model.h's SF_CLAMP_GRAD_*).
 * dx == dy is allowed. */
void SF_FN(sf_ref_act_bwd)(int act, sf_act_prm prm, const T *x, const T *dy, size_t len, T *dx)
{
    const T k0 = (T)0.7978845608028654, k1 = (T)0.044715;
    const T sa = (T)SF_SELU_ALPHA * (T)SF_SELU_SCALE, ss = (T)SF_SELU_SCALE;
    const T pa = (T)prm.a, pb = (T)prm.b;
    for (size_t i = 0; i < len; i++) {
        const T v = x[i];
        T d;
        switch (act) {
        case SF_ACT_RELU6: d = v > (T)0 && v < (T)6 ? (T)1 : (T)0; break;
        case SF_ACT_SIGMOID: {
            const T s = (T)1 / ((T)1 + exp(-v));
            d = s * ((T)1 - s);
            break;
        }
        case SF_ACT_SILU: {
            const T s = (T)1 / ((T)1 + exp(-v));
            d = s * ((T)1 + v * ((T)1 - s));
            break;
        }
        case SF_ACT_HARDSWISH: d = v < (T)-3 ? (T)0 : v <= (T)3 ? v / (T)3 + (T)0.5 : (T)1; break;
        case SF_ACT_HARDSIGMOID: d = v > (T)-3 && v < (T)3 ? (T)1 / (T)6 : (T)0; break;
        case SF_ACT_GELU_TANH: {
            const T t = tanh(k0 * (v + k1 * v * v * v));
            d = (T)0.5 * ((T)1 + t) + (T)0.5 * v * ((T)1 - t * t) * k0 * ((T)1 + (T)3 * k1 * v * v);
            break;
        }
        case SF_ACT_TANH: {
            const T t = tanh(v);
            d = (T)1 - t * t;
            break;
        }
        case SF_ACT_LEAKY_RELU: d = v > (T)0 ? (T)1 : pa; break;
        case SF_ACT_ELU: d = v <= (T)0 ? pa * exp(v) : (T)1; break;
        case SF_ACT_SELU: d = v <= (T)0 ? sa * exp(v) : ss; break;
        case SF_ACT_SOFTPLUS: {
            const T z = exp(v * pa);
            d = v * pa > pb ? (T)1 : z / (z + (T)1);
            break;
        }
        case SF_ACT_MISH: {
            const T s = (T)1 / ((T)1 + exp(-v)), t = tanh(log1p(exp(v)));
            d = t + v * s * ((T)1 - t * t);
            break;
        }
        case SF_ACT_AFFINE: d = pa; break;
        case SF_ACT_SQUARE: d = (T)2 * v; break; /* PyTorch's pow_backward: 2 * x * dy */
        case SF_ACT_CLAMP: {
            /* clamp tests x > min and x < max (a NaN fails both), hardtanh
             * zeroes where x <= min or x >= max (a NaN passes), the closed
             * clamp tests x >= min and x <= max (a NaN fails both); PyTorch
             * selects (where), so a stopped gradient is +0 even where dy is
             * not finite */
            const int lo = isinf(pa), hi = isinf(pb);
            const int in = prm.c == SF_CLAMP_GRAD_HARDTANH       ? (lo || !(v <= pa)) && (hi || !(v >= pb))
                           : prm.c == SF_CLAMP_GRAD_CLAMP_CLOSED ? (lo || v >= pa) && (hi || v <= pb)
                                                                 : (lo || v > pa) && (hi || v < pb);
            dx[i] = in ? dy[i] : (T)0;
            continue;
        }
        default:
            d = (T)0.5 * ((T)1 + erf(v * (T)0.7071067811865476)) +
                v * exp((T)-0.5 * v * v) * (T)0.3989422804014327; /* 1/sqrt(2 pi) */
            break;
        }
        dx[i] = dy[i] * d;
    }
}

#endif
