/* gpu/ref/activation.c — reference activations without parameters (ReLU6,
 * sigmoid, SiLU, hardswish, hardsigmoid, GELU erf and tanh, tanh, leaky
 * ReLU with its slope), forward and
 * backward, in float and double (_f64), and their layers' hooks. Contracts
 * in gpu/ref/layers.h; formulas and edge cases are PyTorch's. */
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
    default: return SF_ACT_GELU;
    }
}

void sf_ref_layer_act_fwd(const sf_ref_io *io)
{
    const int act = act_of(io->L->kind);
    sf_ref_act_fwd(act == SF_ACT_GELU && io->L->approximate ? SF_ACT_GELU_TANH : act, io->L->negative_slope, io->x[0],
                   (size_t)io->n * io->L->out_elems, io->y);
}

void sf_ref_layer_act_bwd(const sf_ref_io *io)
{
    if (!io->want[0])
        return;
    const int act = act_of(io->L->kind);
    sf_ref_act_bwd(act == SF_ACT_GELU && io->L->approximate ? SF_ACT_GELU_TANH : act, io->L->negative_slope,
                   io->x[0], io->dy,
                   (size_t)io->n * io->L->out_elems, io->scratch);
    io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* y = f(x) elementwise; x == y is allowed. */
void SF_FN(sf_ref_act_fwd)(int act, float slope, const T *x, size_t len, T *y)
{
    const T k0 = (T)0.7978845608028654, k1 = (T)0.044715; /* sqrt(2/pi); GELU's tanh form */
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
        case SF_ACT_LEAKY_RELU: r = v > (T)0 ? v : v * (T)slope; break;
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
 * forward wrote. dx == dy is allowed. */
void SF_FN(sf_ref_act_bwd)(int act, float slope, const T *x, const T *dy, size_t len, T *dx)
{
    const T k0 = (T)0.7978845608028654, k1 = (T)0.044715;
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
        case SF_ACT_LEAKY_RELU: d = v > (T)0 ? (T)1 : (T)slope; break;
        default:
            d = (T)0.5 * ((T)1 + erf(v * (T)0.7071067811865476)) +
                v * exp((T)-0.5 * v * v) * (T)0.3989422804014327; /* 1/sqrt(2 pi) */
            break;
        }
        dx[i] = dy[i] * d;
    }
}

#endif
