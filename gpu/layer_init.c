/* gpu/layer_init.c — the layer kinds' parameter initialisations (see
 * gpu/layer_init.h). */
#include "gpu/layer_init.h"

#include <math.h>
#include <stddef.h>

#include "gpu/layers.h"
#include "gpu/rng.h"

/* A standard normal from two counter-based uniforms (Box-Muller). */
static double normal01(uint64_t seed, uint64_t li, uint64_t e)
{
    double u1 = sf_u01(sf_hash4(seed, li, e, 1)), u2 = sf_u01(sf_hash4(seed, li, e, 2));
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* PyTorch's default for Conv2d, ConvTranspose2d and Linear
 * (kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the
 * same bound for the bias), or torchvision's kaiming_normal_(fan_out, relu)
 * with a zero bias when the layer asks for it. Element e of the layer counts
 * the weight's elements first, then the bias's. */
static void init_fan_in(const sf_layer *L, int li, uint64_t seed, float *params, size_t fan_in)
{
    if (L->init == SF_INIT_KAIMING_FAN_OUT) {
        const double sd = sqrt(2.0 / ((double)L->out_c * L->k * (L->kw ? L->kw : L->k)));
        for (size_t e = 0; e < L->n_w; e++)
            params[L->w_off + e] = (float)(sd * normal01(seed, (uint64_t)li, e));
        for (size_t e = 0; e < L->n_b; e++)
            params[L->b_off + e] = 0.0f;
        return;
    }
    const double bound = 1.0 / sqrt((double)fan_in);
    for (size_t e = 0; e < L->n_w + L->n_b; e++) {
        const double u = sf_u01(sf_hash4(seed, (uint64_t)li, (uint64_t)e, 0));
        const float v = (float)((2.0 * u - 1.0) * bound);
        if (e < L->n_w)
            params[L->w_off + e] = v;
        else
            params[L->b_off + (e - L->n_w)] = v;
    }
}

void sf_init_conv2d(const sf_layer *L, int li, uint64_t seed, float *params)
{
    init_fan_in(L, li, seed, params, (size_t)(L->in_c / (L->groups > 1 ? L->groups : 1)) * L->k * L->kw);
}

/* PyTorch computes a transposed convolution's fan_in from weight.size(1). */
void sf_init_convt2d(const sf_layer *L, int li, uint64_t seed, float *params)
{
    init_fan_in(L, li, seed, params, (size_t)L->out_c * L->k * L->k);
}

void sf_init_linear(const sf_layer *L, int li, uint64_t seed, float *params)
{
    init_fan_in(L, li, seed, params, (size_t)L->in_c);
}

/* Normalisation layers: weight 1, bias 0. */
void sf_init_ones_zeros(const sf_layer *L, int li, uint64_t seed, float *params)
{
    for (size_t e = 0; e < L->n_w; e++)
        params[L->w_off + e] = 1.0f;
    for (size_t e = 0; e < L->n_b; e++)
        params[L->b_off + e] = 0.0f;
}

/* torchvision's CNBlock: torch.ones(dim, 1, 1) * layer_scale (1e-6). */
void sf_init_layer_scale(const sf_layer *L, int li, uint64_t seed, float *params)
{
    for (size_t e = 0; e < L->n_w; e++)
        params[L->w_off + e] = 1e-6f;
}

/* nn.Conv1d's init: fan_in = in_channels * k = k. */
void sf_init_channel_conv1d(const sf_layer *L, int li, uint64_t seed, float *params)
{
    init_fan_in(L, li, seed, params, (size_t)L->k);
}

/* nn.PReLU's init: every slope 0.25. */
void sf_init_prelu(const sf_layer *L, int li, uint64_t seed, float *params)
{
    for (size_t e = 0; e < L->n_w; e++)
        params[L->w_off + e] = 0.25f;
}

void sf_init_zeros(const sf_layer *L, int li, uint64_t seed, float *params)
{
    for (int j = 0; j < SF_PARAM_SLOTS; j++)
        for (size_t e = 0; e < L->p_n[j]; e++)
            params[L->p_off[j] + e] = 0.0f;
}

/* torchvision's Encoder: pos_embedding ~ N(0, 0.02^2). */
void sf_init_pos_embedding(const sf_layer *L, int li, uint64_t seed, float *params)
{
    for (size_t e = 0; e < L->n_w; e++)
        params[L->w_off + e] = (float)(0.02 * normal01(seed, (uint64_t)li, e));
}

/* nn.MultiheadAttention._reset_parameters: xavier_uniform_ in_proj_weight
 * (fan_in C, fan_out 3C), zero biases; out_proj.weight keeps nn.Linear's
 * default, U(-1/sqrt(C), 1/sqrt(C)). Element e counts the slots in order. */
void sf_init_attention(const sf_layer *L, int li, uint64_t seed, float *params)
{
    const double c = (double)L->in_c;
    double bound[SF_PARAM_SLOTS] = {0};
    for (int k = 0; k < (L->qkv_split ? 3 : 1); k++)
        bound[sf_attn_slot(L, 0, 0) + k] = sqrt(6.0 / (c + 3.0 * c));
    bound[sf_attn_slot(L, 1, 0)] = 1.0 / sqrt(c);
    size_t e = 0;
    for (int j = 0; j < SF_PARAM_SLOTS; j++)
        for (size_t i = 0; i < L->p_n[j]; i++, e++) {
            const double u = sf_u01(sf_hash4(seed, (uint64_t)li, (uint64_t)e, 0));
            params[L->p_off[j] + i] = (float)((2.0 * u - 1.0) * bound[j]);
        }
}

