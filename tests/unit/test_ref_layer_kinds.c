/* tests/unit/test_ref_layer_kinds.c — the layer kinds beyond the convolution
 * chain (grouped and dilated conv2d, the activations, mul, layer_scale,
 * avgpool2d, adaptive_avgpool2d, layernorm2d, layernorm, linear over
 * channels, concat, dropout, stochastic_depth, maxpool2d's ceil_mode, a
 * Vision Transformer's to_tokens, class_token, pos_embedding,
 * self_attention, select_token, token_mean, transpose_tokens, with linear and layernorm on tokens,
 * ShuffleNet's channel_shuffle and channel_slice, pad in each mode, ECA's
 * channel_conv1d, and MetaFormer v2's square and norms without a bias):
 *   - each kernel's backward against central finite differences of its
 *     forward, in double (the _f64 functions of gpu/ref), and the float
 *     forward against the double one;
 *   - hand-computed values where PyTorch's rule is the point (pooling
 *     windows and divisors, adaptive bins, the dropout masks' rate);
 *   - each kind inside a model through the reference backend's vtable: the
 *     parameters' analytic gradient against finite differences of the loss
 *     (which checks the hooks' wiring: slices, broadcasts, several inputs),
 *     fp32 and bf16 training steps and eval mode.
 * The registry's side of these kinds (parameter names and shapes, refusals,
 * the CUDA check, fields written back): test_layer_registry.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "gpu/backend.h"
#include "gpu/layers.h"
#include "gpu/ref/ref.h"
#include "gpu/rng.h"
#include "tests/unit/backend_step.h"

#define REF_CHECK_SEED 4321
#include "tests/unit/ref_check.h"

static char err[256];

/* ---- kernels against finite differences (double) ------------------------------ */

#define MAXV 5

/* A kernel under test: up to MAXV differentiable inputs v[k] of nv[k]
 * elements, an output of ny; fwd computes y, bwd the gradients g[k] of
 * sum(dy * y). */
typedef struct kcase {
    const char *name;
    int nvars;
    size_t nv[MAXV], ny;
    double scale0;           /* v[0] drawn from [-scale0, scale0) (activations' kinks and ranges) */
    int a[16];               /* the kernel's integer arguments */
    void (*fwd)(const struct kcase *k, double *const *v, double *y);
    void (*bwd)(const struct kcase *k, double *const *v, const double *dy, double *const *g);
    void (*fwd_f32)(const struct kcase *k, float *const *v, float *y); /* NULL: no float check */
} kcase;

/* conv2d_gd: a = n c h w oc, then the window kh kw sh sw ph pw dh dw groups */
static sf_ref_conv_win gd_win(const kcase *k)
{
    const int *a = k->a + 5;
    return (sf_ref_conv_win){a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8]};
}
static void gd_fwd(const kcase *k, double *const *v, double *y)
{
    const int *a = k->a;
    const sf_ref_conv_win win = gd_win(k);
    sf_ref_conv2d_gd_fwd_f64(v[0], a[0], a[1], a[2], a[3], v[1], v[2], a[4], &win, y);
}
static void gd_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    const int *a = k->a;
    const sf_ref_conv_win win = gd_win(k);
    sf_ref_conv2d_gd_bwd_f64(v[0], a[0], a[1], a[2], a[3], v[1], a[4], &win, dy, g[0], g[1], g[2]);
}
static void gd_fwd_f32(const kcase *k, float *const *v, float *y)
{
    const int *a = k->a;
    const sf_ref_conv_win win = gd_win(k);
    sf_ref_conv2d_gd_fwd(v[0], a[0], a[1], a[2], a[3], v[1], v[2], a[4], &win, y);
}

/* activations: a = act, then its parameters (sf_act_prm: leaky_relu's
 * slope, elu's alpha, softplus's beta and threshold, affine's scale and
 * shift, clamp's min and max) in hundredths, OPEN_END for a clamp's side
 * left open (an infinite bound), then clamp's gradient rule */
#define OPEN_END 999999
static float act_hundredths(int v, float open) { return v == OPEN_END ? open : (float)v / 100.f; }
#define ACT_PRM(k) ((sf_act_prm){act_hundredths((k)->a[1], -INFINITY), act_hundredths((k)->a[2], INFINITY), (k)->a[3]})
static void act_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_act_fwd_f64(k->a[0], ACT_PRM(k), v[0], k->nv[0], y);
}
static void act_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_act_bwd_f64(k->a[0], ACT_PRM(k), v[0], dy, k->nv[0], g[0]);
}
static void act_fwd_f32(const kcase *k, float *const *v, float *y)
{
    sf_ref_act_fwd(k->a[0], ACT_PRM(k), v[0], k->nv[0], y);
}

/* mul: a = n c hw bhw */
static void mul_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_mul_fwd_f64(v[0], v[1], k->a[0], k->a[1], (size_t)k->a[2], (size_t)k->a[3], y);
}
static void mul_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_mul_bwd_f64(v[0], v[1], k->a[0], k->a[1], (size_t)k->a[2], (size_t)k->a[3], dy, g[0], g[1]);
}

/* log_softmax: a = n f */
static void lsm_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_log_softmax_fwd_f64(v[0], k->a[0], k->a[1], y);
}
static void lsm_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_log_softmax_bwd_f64(v[0], dy, k->a[0], k->a[1], g[0]);
}
static void lsm_fwd_f32(const kcase *k, float *const *v, float *y)
{
    sf_ref_log_softmax_fwd(v[0], k->a[0], k->a[1], y);
}

/* channel scale: a = n c hw */
static void cs_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_channel_scale_fwd_f64(v[0], k->a[0], k->a[1], (size_t)k->a[2], v[1], y);
}
static void cs_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_channel_scale_bwd_f64(v[0], k->a[0], k->a[1], (size_t)k->a[2], v[1], dy, g[0], g[1]);
}

/* prelu: a = n c hw np (v[1]: the slopes [np]) */
static void prelu_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_prelu_fwd_f64(v[0], k->a[0], k->a[1], (size_t)k->a[2], v[1], k->a[3], y);
}
static void prelu_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_prelu_bwd_f64(v[0], k->a[0], k->a[1], (size_t)k->a[2], v[1], k->a[3], dy, g[0], g[1]);
}
static void prelu_fwd_f32(const kcase *k, float *const *v, float *y)
{
    sf_ref_prelu_fwd(v[0], k->a[0], k->a[1], (size_t)k->a[2], v[1], k->a[3], y);
}

/* channel_conv1d: a = n c k pad (v[1]: the weight [k], v[2]: the bias [1]) */
static void cc1d_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_channel_conv1d_fwd_f64(v[0], k->a[0], k->a[1], v[1], v[2], k->a[2], k->a[3], y);
}
static void cc1d_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_channel_conv1d_bwd_f64(v[0], k->a[0], k->a[1], v[1], k->a[2], k->a[3], dy, g[0], g[1], g[2]);
}
static void cc1d_fwd_f32(const kcase *k, float *const *v, float *y)
{
    sf_ref_channel_conv1d_fwd(v[0], k->a[0], k->a[1], v[1], v[2], k->a[2], k->a[3], y);
}

/* grn: a = n c hw (v[1]: the weight [c], v[2]: the bias [c]; eps 1e-6) */
static void grn_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_grn_fwd_f64(v[0], k->a[0], k->a[1], (size_t)k->a[2], v[1], v[2], 1e-6, y);
}
static void grn_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_grn_bwd_f64(v[0], k->a[0], k->a[1], (size_t)k->a[2], v[1], 1e-6, dy, g[0], g[1], g[2]);
}
static void grn_fwd_f32(const kcase *k, float *const *v, float *y)
{
    sf_ref_grn_fwd(v[0], k->a[0], k->a[1], (size_t)k->a[2], v[1], v[2], 1e-6f, y);
}

/* avgpool2d: a = n c h w k stride pad cip oh ow */
static void ap_fwd(const kcase *k, double *const *v, double *y)
{
    const int *a = k->a;
    sf_ref_avgpool2d_fwd_f64(v[0], a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], y);
}
static void ap_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    const int *a = k->a;
    sf_ref_avgpool2d_bwd_f64(dy, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], g[0]);
}

/* adaptive: a = n c h w oh ow */
static void ad_fwd(const kcase *k, double *const *v, double *y)
{
    const int *a = k->a;
    sf_ref_adaptive_avgpool2d_fwd_f64(v[0], a[0], a[1], a[2], a[3], a[4], a[5], y);
}
static void ad_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    const int *a = k->a;
    sf_ref_adaptive_avgpool2d_bwd_f64(dy, a[0], a[1], a[2], a[3], a[4], a[5], g[0]);
}

/* layernorm: a = n c hw; v = x, gamma, beta */
static void ln_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_layernorm_fwd_f64(v[0], k->a[0], k->a[1], (size_t)k->a[2], v[1], v[2], 1e-5, y);
}
static void ln_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_layernorm_bwd_f64(v[0], k->a[0], k->a[1], (size_t)k->a[2], v[1], 1e-5, dy, g[0], g[1], g[2]);
}
static void ln_fwd_f32(const kcase *k, float *const *v, float *y)
{
    sf_ref_layernorm_fwd(v[0], k->a[0], k->a[1], (size_t)k->a[2], v[1], v[2], 1e-5f, y);
}

/* groupnorm: a = n c hw g; v = x, gamma, beta, or x alone (nvars 1: without
 * affine, gamma, beta and their gradients NULL) */
static void gn_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_groupnorm_fwd_f64(v[0], k->a[0], k->a[1], (size_t)k->a[2], k->a[3], v[1], v[2], 1e-5f, y);
}
static void gn_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_groupnorm_bwd_f64(v[0], k->a[0], k->a[1], (size_t)k->a[2], k->a[3], v[1], 1e-5f, dy, g[0], g[1], g[2]);
}
static void gn_fwd_f32(const kcase *k, float *const *v, float *y)
{
    sf_ref_groupnorm_fwd(v[0], k->a[0], k->a[1], (size_t)k->a[2], k->a[3], v[1], v[2], 1e-5f, y);
}

/* upsample: a = n c h w, out h, out w, mode (SF_UP_*), align_corners */
static sf_up_rule up_rule(const kcase *k)
{
    const int *a = k->a;
    return sf_up_rule_of(a[6] == SF_UP_BILINEAR, a[7], a[2], a[3], a[4], a[5]);
}
static void up_fwd(const kcase *k, double *const *v, double *y)
{
    const sf_up_rule p = up_rule(k);
    sf_ref_upsample_fwd_f64(v[0], k->a[0], k->a[1], &p, y);
}
static void up_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    const sf_up_rule p = up_rule(k);
    sf_ref_upsample_bwd_f64(dy, k->a[0], k->a[1], &p, g[0]);
}
static void up_fwd_f32(const kcase *k, float *const *v, float *y)
{
    const sf_up_rule p = up_rule(k);
    sf_ref_upsample_fwd(v[0], k->a[0], k->a[1], &p, y);
}

/* concat of three: a = n hw c0 c1 c2 */
static void cat_fwd(const kcase *k, double *const *v, double *y)
{
    const int ct = k->a[2] + k->a[3] + k->a[4];
    for (int j = 0, c0 = 0; j < 3; c0 += k->a[2 + j], j++)
        sf_ref_concat_put_f64(v[j], k->a[0], k->a[2 + j], (size_t)k->a[1], ct, c0, y);
}
static void cat_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    const int ct = k->a[2] + k->a[3] + k->a[4];
    for (int j = 0, c0 = 0; j < 3; c0 += k->a[2 + j], j++)
        sf_ref_concat_take_f64(dy, k->a[0], k->a[2 + j], (size_t)k->a[1], ct, c0, g[j]);
}

/* channel shuffle: a = n c hw groups */
static void sh_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_channel_shuffle_f64(v[0], k->a[0], k->a[1], (size_t)k->a[2], k->a[3], y);
}
static void sh_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_channel_shuffle_f64(dy, k->a[0], k->a[1], (size_t)k->a[2], k->a[1] / k->a[3], g[0]);
}
static void sh_fwd_f32(const kcase *k, float *const *v, float *y)
{
    sf_ref_channel_shuffle(v[0], k->a[0], k->a[1], (size_t)k->a[2], k->a[3], y);
}

/* channel slice: a = n c hw start count */
static void sl_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_channel_slice_fwd_f64(v[0], k->a[0], k->a[1], (size_t)k->a[2], k->a[3], k->a[4], y);
}
static void sl_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_channel_slice_bwd_f64(dy, k->a[0], k->a[1], (size_t)k->a[2], k->a[3], k->a[4], g[0]);
}
static void sl_fwd_f32(const kcase *k, float *const *v, float *y)
{
    sf_ref_channel_slice_fwd(v[0], k->a[0], k->a[1], (size_t)k->a[2], k->a[3], k->a[4], y);
}

/* pixel shuffle: a = n c h w r inverse (c the large side's channels, h w the small side's size) */
static void ps_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_pixel_shuffle_f64(v[0], k->a[0], k->a[1], k->a[2], k->a[3], k->a[4], k->a[5], y);
}
static void ps_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_pixel_shuffle_f64(dy, k->a[0], k->a[1], k->a[2], k->a[3], k->a[4], !k->a[5], g[0]);
}
static void ps_fwd_f32(const kcase *k, float *const *v, float *y)
{
    sf_ref_pixel_shuffle(v[0], k->a[0], k->a[1], k->a[2], k->a[3], k->a[4], k->a[5], y);
}

/* pad: a = n c h w left right top bottom mode value*4 */
static void pad_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_pad_fwd_f64(v[0], k->a[0], k->a[1], k->a[2], k->a[3], k->a + 4, k->a[8], k->a[9] / 4.0, y);
}
static void pad_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_pad_bwd_f64(dy, k->a[0], k->a[1], k->a[2], k->a[3], k->a + 4, k->a[8], g[0]);
}
static void pad_fwd_f32(const kcase *k, float *const *v, float *y)
{
    sf_ref_pad_fwd(v[0], k->a[0], k->a[1], k->a[2], k->a[3], k->a + 4, k->a[8], k->a[9] / 4.0f, y);
}

/* dropout (a[0] = 0) or stochastic depth (1): a = kind n elems p*100; the backward is the forward of dy */
static void dr_fwd(const kcase *k, double *const *v, double *y)
{
    const float p = (float)k->a[3] / 100.0f;
    if (k->a[0] == 0)
        sf_ref_dropout_fwd_f64(v[0], k->a[1], (size_t)k->a[2], p, 7, 9, 3, y);
    else
        sf_ref_stochastic_depth_fwd_f64(v[0], k->a[1], (size_t)k->a[2], p, 7, 9, 3, y);
}
static void dr_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    double *d = (double *)dy;
    dr_fwd(k, &d, g[0]);
}

/* maxpool2d with the output size given (ceil_mode): a = n c h w k stride pad oh ow */
static int32_t mp_idx[4096];
static void mp_fwd(const kcase *k, double *const *v, double *y)
{
    const int *a = k->a;
    sf_ref_maxpool2d_fwd_sized_f64(v[0], a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], y, mp_idx);
}
static void mp_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    const int *a = k->a;
    double *y = malloc(sizeof(double) * k->ny);
    mp_fwd(k, v, y);
    sf_ref_maxpool2d_bwd_f64(dy, mp_idx, a[0], a[1], a[2], a[3], a[7], a[8], g[0]);
    free(y);
}

/* to_tokens: a = n rows cols ([n, C, T] to [n, T, C]); the backward transposes back */
static void tr_fwd(const kcase *k, double *const *v, double *y) { sf_ref_transpose_f64(v[0], k->a[0], k->a[1], k->a[2], y); }
static void tr_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_transpose_f64(dy, k->a[0], k->a[2], k->a[1], g[0]);
}
static void tr_fwd_f32(const kcase *k, float *const *v, float *y) { sf_ref_transpose(v[0], k->a[0], k->a[1], k->a[2], y); }

/* class token: a = n t c; v = x, cls */
static void ct_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_prepend_token_fwd_f64(v[0], k->a[0], k->a[1], k->a[2], v[1], y);
}
static void ct_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_prepend_token_bwd_f64(dy, k->a[0], k->a[1], k->a[2], g[0], g[1]);
}

/* position embedding: a = n len; v = x, p; dx is dy */
static void pe_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_add_bcast_fwd_f64(v[0], k->a[0], (size_t)k->a[1], v[1], y);
}
static void pe_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    memcpy(g[0], dy, sizeof(double) * k->nv[0]);
    sf_ref_add_bcast_bwd_f64(dy, k->a[0], (size_t)k->a[1], g[1]);
}

/* select token: a = n t c */
static void st_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_select_token_fwd_f64(v[0], k->a[0], k->a[1], k->a[2], y);
}
static void st_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_select_token_bwd_f64(dy, k->a[0], k->a[1], k->a[2], g[0]);
}

/* tokens transposed: a = n t c; [t, c] -> [c, t] and back */
static void tt_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_transpose_f64(v[0], k->a[0], k->a[1], k->a[2], y);
}
static void tt_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_transpose_f64(dy, k->a[0], k->a[2], k->a[1], g[0]);
}

/* token mean: a = n t c start */
static void tm_fwd(const kcase *k, double *const *v, double *y)
{
    sf_ref_token_mean_fwd_f64(v[0], k->a[0], k->a[1], k->a[2], k->a[3], y);
}
static void tm_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    sf_ref_token_mean_bwd_f64(dy, k->a[0], k->a[1], k->a[2], k->a[3], g[0]);
}

/* self-attention: a = n t c heads; v = x, in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias */
typedef struct att_state {
    double *qkv, *a, *o, *d_o, *dqkv;
} att_state;
static att_state att_new(const kcase *k)
{
    const size_t n = (size_t)k->a[0], t = (size_t)k->a[1], c = (size_t)k->a[2], h = (size_t)k->a[3];
    att_state s = {malloc(sizeof(double) * n * t * 3 * c), malloc(sizeof(double) * n * h * t * t),
                   malloc(sizeof(double) * n * t * c), malloc(sizeof(double) * n * t * c),
                   malloc(sizeof(double) * n * t * 3 * c)};
    return s;
}
static void att_free(att_state *s)
{
    free(s->qkv);
    free(s->a);
    free(s->o);
    free(s->d_o);
    free(s->dqkv);
}
static void sa_fwd(const kcase *k, double *const *v, double *y)
{
    att_state s = att_new(k);
    sf_ref_attention_fwd_f64(v[0], k->a[0], k->a[1], k->a[2], k->a[3], v[1], v[2], v[3], v[4], s.qkv, s.a, s.o, y);
    att_free(&s);
}
static void sa_bwd(const kcase *k, double *const *v, const double *dy, double *const *g)
{
    att_state s = att_new(k);
    double *y = malloc(sizeof(double) * k->ny);
    sf_ref_attention_fwd_f64(v[0], k->a[0], k->a[1], k->a[2], k->a[3], v[1], v[2], v[3], v[4], s.qkv, s.a, s.o, y);
    sf_ref_attention_bwd_f64(v[0], k->a[0], k->a[1], k->a[2], k->a[3], v[1], v[3], s.qkv, s.a, s.o, dy, s.d_o, s.dqkv,
                             g[0], g[1], g[2], g[3], g[4]);
    free(y);
    att_free(&s);
}
static void sa_fwd_f32(const kcase *k, float *const *v, float *y)
{
    const size_t n = (size_t)k->a[0], t = (size_t)k->a[1], c = (size_t)k->a[2], h = (size_t)k->a[3];
    float *qkv = malloc(sizeof(float) * n * t * 3 * c), *a = malloc(sizeof(float) * n * h * t * t),
          *o = malloc(sizeof(float) * n * t * c);
    sf_ref_attention_fwd(v[0], k->a[0], k->a[1], k->a[2], k->a[3], v[1], v[2], v[3], v[4], qkv, a, o, y);
    free(qkv);
    free(a);
    free(o);
}

static const kcase kcases[] = {
    {"conv2d groups 2 dilation 2 pad 2", 3, {2 * 4 * 6 * 6, 6 * 2 * 9, 6}, 2 * 6 * 6 * 6, 1,
     {2, 4, 6, 6, 6, 3, 3, 1, 1, 2, 2, 2, 2, 2}, gd_fwd, gd_bwd, gd_fwd_f32},
    {"conv2d depthwise stride 2 pad 1", 3, {2 * 3 * 5 * 6, 3 * 1 * 9, 3}, 2 * 3 * 3 * 3, 1,
     {2, 3, 5, 6, 3, 3, 3, 2, 2, 1, 1, 1, 1, 3}, gd_fwd, gd_bwd, gd_fwd_f32},
    {"conv2d groups 2 without bias", 2, {1 * 4 * 5 * 5, 4 * 2 * 4}, 1 * 4 * 4 * 4, 1,
     {1, 4, 5, 5, 4, 2, 2, 1, 1, 0, 0, 1, 1, 2}, gd_fwd, gd_bwd, gd_fwd_f32},
    /* Inception's 1xk kernel padded along the width only */
    {"conv2d 1x3 kernel pad [0,1]", 3, {2 * 3 * 5 * 6, 4 * 3 * 1 * 3, 4}, 2 * 4 * 5 * 6, 1,
     {2, 3, 5, 6, 4, 1, 3, 1, 1, 0, 1, 1, 1, 1}, gd_fwd, gd_bwd, gd_fwd_f32},
    /* every part of the window different along the two axes */
    {"conv2d 3x2 stride [2,1] pad [1,0] dilation [1,2] groups 2", 3, {1 * 4 * 7 * 6, 2 * 2 * 3 * 2, 2},
     1 * 2 * 4 * 4, 1, {1, 4, 7, 6, 2, 3, 2, 2, 1, 1, 0, 1, 2, 2}, gd_fwd, gd_bwd, gd_fwd_f32},
    /* a classifier's logits, spread over +-30 (the maximum's shift keeps exp finite), and one feature */
    {"log_softmax", 1, {3 * 10}, 3 * 10, 30, {3, 10}, lsm_fwd, lsm_bwd, lsm_fwd_f32},
    {"log_softmax of one feature", 1, {4}, 4, 2, {4, 1}, lsm_fwd, lsm_bwd, lsm_fwd_f32},
    {"relu6", 1, {64}, 64, 8, {SF_ACT_RELU6}, act_fwd, act_bwd, act_fwd_f32},
    {"sigmoid", 1, {64}, 64, 6, {SF_ACT_SIGMOID}, act_fwd, act_bwd, act_fwd_f32},
    {"silu", 1, {64}, 64, 6, {SF_ACT_SILU}, act_fwd, act_bwd, act_fwd_f32},
    {"hardswish", 1, {64}, 64, 5, {SF_ACT_HARDSWISH}, act_fwd, act_bwd, act_fwd_f32},
    {"hardsigmoid", 1, {64}, 64, 5, {SF_ACT_HARDSIGMOID}, act_fwd, act_bwd, act_fwd_f32},
    {"gelu", 1, {64}, 64, 4, {SF_ACT_GELU}, act_fwd, act_bwd, act_fwd_f32},
    {"gelu tanh", 1, {64}, 64, 4, {SF_ACT_GELU_TANH}, act_fwd, act_bwd, act_fwd_f32},
    {"tanh", 1, {64}, 64, 4, {SF_ACT_TANH}, act_fwd, act_bwd, act_fwd_f32},
    {"leaky_relu 0.01", 1, {64}, 64, 4, {SF_ACT_LEAKY_RELU, 1}, act_fwd, act_bwd, act_fwd_f32},
    {"leaky_relu 0.2", 1, {64}, 64, 4, {SF_ACT_LEAKY_RELU, 20}, act_fwd, act_bwd, act_fwd_f32},
    {"leaky_relu -0.5", 1, {64}, 64, 4, {SF_ACT_LEAKY_RELU, -50}, act_fwd, act_bwd, act_fwd_f32},
    {"leaky_relu 1.5", 1, {64}, 64, 4, {SF_ACT_LEAKY_RELU, 150}, act_fwd, act_bwd, act_fwd_f32},
    /* elu at PyTorch's default alpha, below and above 1, and a negative one */
    {"elu 1", 1, {64}, 64, 4, {SF_ACT_ELU, 100}, act_fwd, act_bwd, act_fwd_f32},
    {"elu 0.5", 1, {64}, 64, 4, {SF_ACT_ELU, 50}, act_fwd, act_bwd, act_fwd_f32},
    {"elu 2", 1, {64}, 64, 4, {SF_ACT_ELU, 200}, act_fwd, act_bwd, act_fwd_f32},
    {"elu -0.5", 1, {64}, 64, 4, {SF_ACT_ELU, -50}, act_fwd, act_bwd, act_fwd_f32},
    {"selu", 1, {64}, 64, 4, {SF_ACT_SELU}, act_fwd, act_bwd, act_fwd_f32},
    /* softplus at PyTorch's defaults (beta 1, threshold 20: no input reaches
     * the linear branch), and where inputs on both sides of the threshold
     * are drawn: beta 2 threshold 3, a negative beta (-0.5, threshold 1:
     * the linear branch is x < -2), a sharp one (beta 10, threshold 20) */
    {"softplus 1 20", 1, {64}, 64, 4, {SF_ACT_SOFTPLUS, 100, 2000}, act_fwd, act_bwd, act_fwd_f32},
    {"softplus 2 3", 1, {64}, 64, 4, {SF_ACT_SOFTPLUS, 200, 300}, act_fwd, act_bwd, act_fwd_f32},
    {"softplus -0.5 1", 1, {64}, 64, 4, {SF_ACT_SOFTPLUS, -50, 100}, act_fwd, act_bwd, act_fwd_f32},
    {"softplus 10 20", 1, {64}, 64, 4, {SF_ACT_SOFTPLUS, 1000, 2000}, act_fwd, act_bwd, act_fwd_f32},
    {"mish", 1, {64}, 64, 6, {SF_ACT_MISH}, act_fwd, act_bwd, act_fwd_f32},
    /* affine (scale, shift): x * 2 - 1 (the fold of (x - 0.5) / 0.5), a
     * negative scale, a scale below 1 with a positive shift */
    {"affine 2 -1", 1, {64}, 64, 4, {SF_ACT_AFFINE, 200, -100}, act_fwd, act_bwd, act_fwd_f32},
    {"affine -1 0.5", 1, {64}, 64, 4, {SF_ACT_AFFINE, -100, 50}, act_fwd, act_bwd, act_fwd_f32},
    {"affine 0.25 3", 1, {64}, 64, 4, {SF_ACT_AFFINE, 25, 300}, act_fwd, act_bwd, act_fwd_f32},
    /* clamp (min, max, rule): both bounds, one side open each way, and
     * hardtanh's rule (which differs from clamp's only at a NaN) */
    {"clamp -0.5 0.75", 1, {64}, 64, 2, {SF_ACT_CLAMP, -50, 75, SF_CLAMP_GRAD_CLAMP}, act_fwd, act_bwd, act_fwd_f32},
    {"clamp min 0.25", 1, {64}, 64, 2, {SF_ACT_CLAMP, 25, OPEN_END, SF_CLAMP_GRAD_CLAMP}, act_fwd, act_bwd,
     act_fwd_f32},
    {"clamp max -0.3", 1, {64}, 64, 2, {SF_ACT_CLAMP, OPEN_END, -30, SF_CLAMP_GRAD_CLAMP}, act_fwd, act_bwd,
     act_fwd_f32},
    {"square", 1, {64}, 64, 3, {SF_ACT_SQUARE}, act_fwd, act_bwd, act_fwd_f32},
    {"hardtanh -1 1", 1, {64}, 64, 2, {SF_ACT_CLAMP, -100, 100, SF_CLAMP_GRAD_HARDTANH}, act_fwd, act_bwd,
     act_fwd_f32},
    {"mul same shape", 2, {2 * 3 * 5, 2 * 3 * 5}, 2 * 3 * 5, 1, {2, 3, 5, 5}, mul_fwd, mul_bwd, NULL},
    {"mul broadcast [C,1,1]", 2, {2 * 3 * 5, 2 * 3}, 2 * 3 * 5, 1, {2, 3, 5, 1}, mul_fwd, mul_bwd, NULL},
    {"layer scale", 2, {2 * 4 * 6, 4}, 2 * 4 * 6, 1, {2, 4, 6}, cs_fwd, cs_bwd, NULL},
    /* prelu: a slope per channel of a map, one for all of them, one per
     * feature of flat features */
    {"prelu per channel", 2, {2 * 3 * 5, 3}, 2 * 3 * 5, 2, {2, 3, 5, 3}, prelu_fwd, prelu_bwd, prelu_fwd_f32},
    {"prelu one slope", 2, {2 * 3 * 5, 1}, 2 * 3 * 5, 2, {2, 3, 5, 1}, prelu_fwd, prelu_bwd, prelu_fwd_f32},
    {"prelu per feature", 2, {4 * 6, 6}, 4 * 6, 2, {4, 6, 1, 6}, prelu_fwd, prelu_bwd, prelu_fwd_f32},
    /* channel_conv1d: ECA's k 3 and 5, and a kernel wider than the channels */
    {"channel_conv1d k3", 3, {2 * 8, 3, 1}, 2 * 8, 1, {2, 8, 3, 1}, cc1d_fwd, cc1d_bwd, cc1d_fwd_f32},
    {"channel_conv1d k5", 3, {3 * 6, 5, 1}, 3 * 6, 1, {3, 6, 5, 2}, cc1d_fwd, cc1d_bwd, cc1d_fwd_f32},
    {"channel_conv1d k7 over 3 channels", 3, {2 * 3, 7, 1}, 2 * 3, 1, {2, 3, 7, 3}, cc1d_fwd, cc1d_bwd,
     cc1d_fwd_f32},
    {"avgpool2d k3 s2 p1 ceil, count_include_pad", 1, {2 * 2 * 6 * 6}, 2 * 2 * 4 * 4, 1,
     {2, 2, 6, 6, 3, 2, 1, 1, 4, 4}, ap_fwd, ap_bwd, NULL},
    {"avgpool2d k3 s2 p1 ceil, padding not counted", 1, {2 * 2 * 6 * 6}, 2 * 2 * 4 * 4, 1,
     {2, 2, 6, 6, 3, 2, 1, 0, 4, 4}, ap_fwd, ap_bwd, NULL},
    {"adaptive_avgpool2d 7x5 to 3x2", 1, {2 * 2 * 7 * 5}, 2 * 2 * 3 * 2, 1, {2, 2, 7, 5, 3, 2}, ad_fwd, ad_bwd, NULL},
    {"layernorm over channels", 3, {2 * 5 * 6, 5, 5}, 2 * 5 * 6, 2, {2, 5, 6}, ln_fwd, ln_bwd, ln_fwd_f32},
    {"layernorm over features", 3, {3 * 7, 7, 7}, 3 * 7, 2, {3, 7, 1}, ln_fwd, ln_bwd, ln_fwd_f32},
    {"groupnorm, 6 channels in 3 groups", 3, {2 * 6 * 5, 6, 6}, 2 * 6 * 5, 2, {2, 6, 5, 3}, gn_fwd, gn_bwd,
     gn_fwd_f32},
    {"groupnorm of flat features in 2 groups", 3, {3 * 4, 4, 4}, 3 * 4, 2, {3, 4, 1, 2}, gn_fwd, gn_bwd, gn_fwd_f32},
    {"upsample by 2 of an odd map", 1, {2 * 3 * 3 * 5}, 2 * 3 * 6 * 10, 1, {2, 3, 3, 5, 6, 10, 0, 0}, up_fwd, up_bwd,
     up_fwd_f32},
    {"upsample by 3", 1, {1 * 2 * 2 * 2}, 1 * 2 * 6 * 6, 1, {1, 2, 2, 2, 6, 6, 0, 0}, up_fwd, up_bwd, up_fwd_f32},
    {"upsample nearest to a size down", 1, {2 * 2 * 7 * 5}, 2 * 2 * 3 * 4, 1, {2, 2, 7, 5, 3, 4, 0, 0}, up_fwd, up_bwd,
     up_fwd_f32},
    {"upsample bilinear by 2", 1, {2 * 3 * 3 * 5}, 2 * 3 * 6 * 10, 1, {2, 3, 3, 5, 6, 10, 1, 0}, up_fwd, up_bwd,
     up_fwd_f32},
    {"upsample bilinear align_corners to an odd size", 1, {1 * 2 * 4 * 3}, 1 * 2 * 9 * 7, 1, {1, 2, 4, 3, 9, 7, 1, 1},
     up_fwd, up_bwd, up_fwd_f32},
    {"upsample bilinear down", 1, {1 * 2 * 9 * 8}, 1 * 2 * 4 * 3, 1, {1, 2, 9, 8, 4, 3, 1, 0}, up_fwd, up_bwd,
     up_fwd_f32},
    {"groupnorm in one group (LayerNorm over C,H,W)", 3, {2 * 3 * 4, 3, 3}, 2 * 3 * 4, 2, {2, 3, 4, 1}, gn_fwd,
     gn_bwd, gn_fwd_f32},
    /* nn.InstanceNorm2d's default and GroupNorm(affine=False): no parameters */
    {"groupnorm without affine, a group per channel", 1, {2 * 4 * 5}, 2 * 4 * 5, 2, {2, 4, 5, 4}, gn_fwd, gn_bwd,
     gn_fwd_f32},
    {"groupnorm without affine of flat features in 2 groups", 1, {3 * 6}, 3 * 6, 2, {3, 6, 1, 2}, gn_fwd, gn_bwd,
     gn_fwd_f32},
    {"concat of three", 3, {2 * 2 * 4, 2 * 1 * 4, 2 * 3 * 4}, 2 * 6 * 4, 1, {2, 4, 2, 1, 3}, cat_fwd, cat_bwd, NULL},
    {"dropout p 0.3", 1, {3 * 20}, 3 * 20, 1, {0, 3, 20, 30}, dr_fwd, dr_bwd, NULL},
    {"stochastic depth p 0.5", 1, {8 * 6}, 8 * 6, 1, {1, 8, 6, 50}, dr_fwd, dr_bwd, NULL},
    {"maxpool2d k3 s2 ceil", 1, {2 * 2 * 6 * 6}, 2 * 2 * 3 * 3, 1, {2, 2, 6, 6, 3, 2, 0, 3, 3}, mp_fwd, mp_bwd, NULL},
    {"to_tokens", 1, {2 * 3 * 4}, 2 * 3 * 4, 1, {2, 3, 4}, tr_fwd, tr_bwd, tr_fwd_f32},
    {"grn (ConvNeXt V2)", 3, {2 * 4 * 6, 4, 4}, 2 * 4 * 6, 1, {2, 4, 6}, grn_fwd, grn_bwd, grn_fwd_f32},
    {"grn of a one-position map", 3, {3 * 5, 5, 5}, 3 * 5, 1, {3, 5, 1}, grn_fwd, grn_bwd, grn_fwd_f32},
    {"class token", 2, {2 * 3 * 4, 4}, 2 * 4 * 4, 1, {2, 3, 4}, ct_fwd, ct_bwd, NULL},
    {"position embedding", 2, {3 * 10, 10}, 3 * 10, 1, {3, 10}, pe_fwd, pe_bwd, NULL},
    {"select token", 1, {2 * 3 * 4}, 2 * 4, 1, {2, 3, 4}, st_fwd, st_bwd, NULL},
    {"token mean", 1, {2 * 3 * 4}, 2 * 4, 1, {2, 3, 4, 0}, tm_fwd, tm_bwd, NULL},
    {"tokens transposed", 1, {2 * 3 * 5}, 2 * 3 * 5, 1, {2, 3, 5}, tt_fwd, tt_bwd, NULL},
    {"token mean from token 1", 1, {2 * 5 * 3}, 2 * 3, 1, {2, 5, 3, 1}, tm_fwd, tm_bwd, NULL},
    {"self-attention, 2 heads", 5, {2 * 5 * 4, 3 * 4 * 4, 3 * 4, 4 * 4, 4}, 2 * 5 * 4, 2, {2, 5, 4, 2}, sa_fwd,
     sa_bwd, sa_fwd_f32},
    {"channel shuffle 6 by 2", 1, {2 * 6 * 5}, 2 * 6 * 5, 1, {2, 6, 5, 2}, sh_fwd, sh_bwd, sh_fwd_f32},
    {"channel shuffle 12 by 3", 1, {1 * 12 * 3}, 1 * 12 * 3, 1, {1, 12, 3, 3}, sh_fwd, sh_bwd, sh_fwd_f32},
    {"channel slice [2, 5) of 7", 1, {2 * 7 * 3}, 2 * 3 * 3, 1, {2, 7, 3, 2, 3}, sl_fwd, sl_bwd, sl_fwd_f32},
    {"channel slice [0, 1) of 3", 1, {3 * 3 * 2}, 3 * 1 * 2, 1, {3, 3, 2, 0, 1}, sl_fwd, sl_bwd, sl_fwd_f32},
    {"pixel shuffle 2 of 12 3x2", 1, {2 * 12 * 3 * 2}, 2 * 12 * 3 * 2, 1, {2, 3, 3, 2, 2, 0}, ps_fwd, ps_bwd,
     ps_fwd_f32},
    {"pixel unshuffle 3 of 2 9x6", 1, {1 * 2 * 9 * 6}, 1 * 2 * 9 * 6, 1, {1, 2, 3, 2, 3, 1}, ps_fwd, ps_bwd,
     ps_fwd_f32},
    /* pad: each mode, asymmetric; reflect's and circular's largest pads */
    {"pad constant 0.5 [1, 2, 0, 1]", 1, {2 * 2 * 3 * 4}, 2 * 2 * 4 * 7, 1, {2, 2, 3, 4, 1, 2, 0, 1, SF_PAD_CONSTANT, 2},
     pad_fwd, pad_bwd, pad_fwd_f32},
    {"pad reflect 3 of 4x5", 1, {1 * 2 * 4 * 5}, 1 * 2 * 10 * 11, 1, {1, 2, 4, 5, 3, 3, 3, 3, SF_PAD_REFLECT, 0},
     pad_fwd, pad_bwd, pad_fwd_f32},
    {"pad replicate [2, 0, 1, 3]", 1, {2 * 2 * 3 * 4}, 2 * 2 * 7 * 6, 1, {2, 2, 3, 4, 2, 0, 1, 3, SF_PAD_REPLICATE, 0},
     pad_fwd, pad_bwd, pad_fwd_f32},
    {"pad circular [4, 1, 3, 2] of 3x4", 1, {1 * 2 * 3 * 4}, 1 * 2 * 8 * 9, 1,
     {1, 2, 3, 4, 4, 1, 3, 2, SF_PAD_CIRCULAR, 0}, pad_fwd, pad_bwd, pad_fwd_f32},
    {"self-attention, 1 head of 6", 5, {1 * 3 * 6, 3 * 6 * 6, 3 * 6, 6 * 6, 6}, 1 * 3 * 6, 2, {1, 3, 6, 1}, sa_fwd,
     sa_bwd, sa_fwd_f32},
};

static double loss_of(const kcase *k, double *const *v, const double *r, double *y)
{
    k->fwd(k, v, y);
    return dot(r, y, k->ny);
}

static void each_kernels_backward_matches_finite_differences(void **state)
{
    for (size_t ci = 0; ci < sizeof kcases / sizeof kcases[0]; ci++) {
        const kcase *k = &kcases[ci];
        double *v[MAXV] = {0}, *g[MAXV] = {0};
        for (int j = 0; j < k->nvars; j++) {
            v[j] = rand_vec(k->nv[j]);
            g[j] = calloc(k->nv[j], sizeof(double));
            if (j == 0)
                for (size_t e = 0; e < k->nv[0]; e++)
                    v[0][e] *= k->scale0;
        }
        double *r = rand_vec(k->ny), *y = calloc(k->ny, sizeof(double));
        k->bwd(k, v, r, g);
        for (int j = 0; j < k->nvars; j++) {
            double *fd = calloc(k->nv[j], sizeof(double));
            for (size_t e = 0; e < k->nv[j]; e++) {
                const double keep = v[j][e];
                v[j][e] = keep + FD_EPS;
                const double lp = loss_of(k, v, r, y);
                v[j][e] = keep - FD_EPS;
                const double lm = loss_of(k, v, r, y);
                v[j][e] = keep;
                fd[e] = (lp - lm) / (2 * FD_EPS);
            }
            const double rel = rel_err_d(g[j], fd, k->nv[j]);
            if (!(rel < FD_TOL))
                fail_msg("%s: gradient of input %d differs from finite differences (relative %.3g)", k->name, j, rel);
            free(fd);
        }
        if (k->fwd_f32) {
            float *vf[MAXV] = {0};
            for (int j = 0; j < k->nvars; j++) {
                vf[j] = malloc(sizeof(float) * k->nv[j]);
                for (size_t e = 0; e < k->nv[j]; e++) {
                    vf[j][e] = (float)v[j][e];
                    v[j][e] = (double)vf[j][e]; /* the same inputs in both precisions */
                }
            }
            float *yf = malloc(sizeof(float) * k->ny);
            k->fwd(k, v, y);
            k->fwd_f32(k, vf, yf);
            const double rel = rel_err_fd(yf, y, k->ny);
            if (!(rel < 1e-5))
                fail_msg("%s: float forward differs from double by %.3g", k->name, rel);
            for (int j = 0; j < k->nvars; j++)
                free(vf[j]);
            free(yf);
        }
        for (int j = 0; j < k->nvars; j++) {
            free(v[j]);
            free(g[j]);
        }
        free(r);
        free(y);
    }
}

/* ---- hand-computed values ------------------------------------------------------- */

/* Where finite differences cannot look: leaky_relu at exactly 0 (and at a
 * NaN) passes dy * slope, as PyTorch's leaky_relu_backward, which tests
 * x > 0; a NaN stays NaN through its forward; tanh saturates to 1 with a
 * zero gradient. */
static void leaky_relu_and_tanh_follow_pytorch_at_zero_nan_and_saturation(void **state)
{
    const float x[4] = {0.f, -0.f, NAN, 30.f}, dy[4] = {2.f, 2.f, 1.f, 1.f};
    float y[4], dx[4];
    sf_ref_act_fwd(SF_ACT_LEAKY_RELU, (sf_act_prm){0.2f, 0.f, 0}, x, 4, y);
    assert_true(y[0] == 0.f && y[1] == 0.f && isnan(y[2]) && y[3] == 30.f);
    sf_ref_act_bwd(SF_ACT_LEAKY_RELU, (sf_act_prm){0.2f, 0.f, 0}, x, dy, 4, dx);
    assert_true(dx[0] == 0.4f && dx[1] == 0.4f && dx[2] == 0.2f && dx[3] == 1.f);
    sf_ref_act_fwd(SF_ACT_TANH, (sf_act_prm){0}, x, 4, y);
    assert_true(y[0] == 0.f && isnan(y[2]) && y[3] == 1.f);
    sf_ref_act_bwd(SF_ACT_TANH, (sf_act_prm){0}, x, dy, 4, dx);
    assert_true(dx[0] == 2.f && isnan(dx[2]) && dx[3] == 0.f);
}

/* Where finite differences cannot look: PReLU at 0, -0 and a NaN, as
 * PyTorch's F.prelu and its prelu_backward give (dy = 2, slope 0.25): x = 0
 * and -0 pass a * dy and add nothing to the slope's gradient, a NaN passes
 * a * dy and makes the slope's gradient NaN. */
static void prelu_follows_pytorch_at_zero_and_nan(void **state)
{
    const float x[5] = {0.f, -0.f, -1.f, 2.f, NAN}, dy[5] = {2.f, 2.f, 2.f, 2.f, 2.f}, a = 0.25f;
    float y[5], dx[5], da;
    sf_ref_prelu_fwd(x, 1, 1, 5, &a, 1, y);
    assert_true(y[0] == 0.f && y[1] == 0.f && signbit(y[1]) && y[2] == -0.25f && y[3] == 2.f && isnan(y[4]));
    sf_ref_prelu_bwd(x, 1, 1, 4, &a, 1, dy, dx, &da);
    assert_true(dx[0] == 0.5f && dx[1] == 0.5f && dx[2] == 0.5f && dx[3] == 2.f);
    assert_true(da == -2.f); /* only x = -1 adds: -1 * 2 */
    sf_ref_prelu_bwd(x, 1, 1, 5, &a, 1, dy, dx, &da);
    assert_true(dx[4] == 0.5f && isnan(da));
}

/* Where finite differences cannot look: x exactly at a bound, beyond it,
 * -0, infinities and NaN, as torch 2.15 gives them for torch.clamp(x, -1,
 * 1), x.clamp_min(0), x.clamp(max=1), F.hardtanh(x, -1, 1) and
 * F.hardtanh(x, 0, 1) (dy = 3; dy = inf at x = 2, where every rule here
 * stops the gradient and PyTorch's select gives 0, not inf * 0): no rule
 * passes the gradient at a bound, clamp's passes none at a NaN and
 * hardtanh's passes dy there; an open-ended side passes -inf or +inf
 * through with its gradient; -0 within the bounds stays -0. And as torch
 * 2.11 gives torch.clamp(x, -1, 1) and x.clamp_min(0): the closed rule,
 * dy at a bound (-0 too, at a bound of 0) and none at a NaN. */
static void clamp_follows_pytorch_at_the_bounds_infinities_and_nan(void **state)
{
    const float x[10] = {-2.f, -1.f, -0.5f, 0.f, -0.f, 1.f, 2.f, NAN, INFINITY, -INFINITY};
    const float dy[10] = {3, 3, 3, 3, 3, 3, INFINITY, 3, 3, 3};
    const float I = INFINITY;
    const struct {
        const char *name;
        sf_act_prm prm;
        float y[10], dx[10];
    } cases[] = {
        {"clamp -1 1", {-1.f, 1.f, SF_CLAMP_GRAD_CLAMP},
         {-1, -1, -0.5f, 0, -0.f, 1, 1, NAN, 1, -1}, {0, 0, 3, 3, 3, 0, 0, 0, 0, 0}},
        {"clamp_min 0", {0.f, I, SF_CLAMP_GRAD_CLAMP},
         {0, 0, 0, 0, -0.f, 1, 2, NAN, I, 0}, {0, 0, 0, 0, 0, 3, I, 0, 3, 0}},
        {"clamp_max 1", {-I, 1.f, SF_CLAMP_GRAD_CLAMP},
         {-2, -1, -0.5f, 0, -0.f, 1, 1, NAN, 1, -I}, {3, 3, 3, 3, 3, 0, 0, 0, 0, 3}},
        {"hardtanh -1 1", {-1.f, 1.f, SF_CLAMP_GRAD_HARDTANH},
         {-1, -1, -0.5f, 0, -0.f, 1, 1, NAN, 1, -1}, {0, 0, 3, 3, 3, 0, 0, 3, 0, 0}},
        {"hardtanh 0 1", {0.f, 1.f, SF_CLAMP_GRAD_HARDTANH},
         {0, 0, 0, 0, -0.f, 1, 1, NAN, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 3, 0, 0}},
        /* torch 2.11's torch.clamp and clamp_min: dy at a bound too */
        {"clamp_closed -1 1", {-1.f, 1.f, SF_CLAMP_GRAD_CLAMP_CLOSED},
         {-1, -1, -0.5f, 0, -0.f, 1, 1, NAN, 1, -1}, {0, 3, 3, 3, 3, 3, 0, 0, 0, 0}},
        {"clamp_closed min 0", {0.f, I, SF_CLAMP_GRAD_CLAMP_CLOSED},
         {0, 0, 0, 0, -0.f, 1, 2, NAN, I, 0}, {0, 0, 0, 3, 3, 3, I, 0, 3, 0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float y[10], dx[10];
        sf_ref_act_fwd(SF_ACT_CLAMP, cases[c].prm, x, 10, y);
        sf_ref_act_bwd(SF_ACT_CLAMP, cases[c].prm, x, dy, 10, dx);
        for (int i = 0; i < 10; i++) {
            const float w = cases[c].y[i];
            if (isnan(w) ? !isnan(y[i]) : (y[i] != w || signbit(y[i]) != signbit(w)))
                fail_msg("%s forward element %d: %g, PyTorch's %g", cases[c].name, i, y[i], w);
            if (dx[i] != cases[c].dx[i] || signbit(dx[i]))
                fail_msg("%s backward element %d: %g, PyTorch's %g", cases[c].name, i, dx[i], cases[c].dx[i]);
        }
    }
}

/* Within a float rounding or two of what PyTorch 2.x's CPU kernels and
 * autograd give (NaN where they give NaN). */
static void expect_near(const char *what, const float *got, const float *want, int n)
{
    for (int i = 0; i < n; i++)
        if (isnan(want[i]) ? !isnan(got[i]) : !(fabsf(got[i] - want[i]) <= 3e-7f * fmaxf(1.f, fabsf(want[i]))))
            fail_msg("%s element %d: %.9g, PyTorch's %.9g", what, i, got[i], want[i]);
}

/* Where finite differences cannot look, the values F.elu(x, 0.5),
 * torch.selu, F.softplus (beta 2, threshold 10; beta -1, threshold 20),
 * F.mish and their input gradients (dy = 1) take at 0, -0, NaN, -1, 2, 30
 * and -30 in PyTorch: ELU's and SELU's gradient at 0 is alpha * scale and
 * at a NaN the scale (elu_backward's x <= 0 test, is_result false);
 * softplus gives x itself where beta * x > threshold, a negative beta's
 * branch included (-30 at beta -1); Mish saturates to x with gradient 1. */
static void elu_selu_softplus_mish_follow_pytorch_at_zero_nan_and_saturation(void **state)
{
    const float x[7] = {0.f, -0.f, NAN, -1.f, 2.f, 30.f, -30.f}, dy[7] = {1, 1, 1, 1, 1, 1, 1};
    float y[7], dx[7];
    const struct {
        const char *name;
        int act;
        sf_act_prm prm;
        float y[7], dx[7];
    } cases[] = {
        {"elu 0.5", SF_ACT_ELU, {0.5f, 0.f, 0},
         {0.f, -0.f, NAN, -0.316060275f, 2.f, 30.f, -0.5f},
         {0.5f, 0.5f, 1.f, 0.183939725f, 1.f, 1.f, 4.67881146e-14f}},
        {"selu", SF_ACT_SELU, {0.f, 0.f, 0},
         {0.f, -0.f, NAN, -1.11133075f, 2.10140204f, 31.5210304f, -1.75809932f},
         {1.75809932f, 1.75809932f, 1.05070102f, 0.64676863f, 1.05070102f, 1.05070102f, 1.64516309e-13f}},
        {"softplus 2 10", SF_ACT_SOFTPLUS, {2.f, 10.f, 0},
         {0.346573591f, 0.346573591f, NAN, 0.0634640008f, 2.00907493f, 30.f, 4.37825545e-27f},
         {0.5f, 0.5f, NAN, 0.119202919f, 0.982013762f, 1.f, 8.75651089e-27f}},
        {"softplus -1 20", SF_ACT_SOFTPLUS, {-1.f, 20.f, 0},
         {-0.693147182f, -0.693147182f, NAN, -1.31326163f, -0.126928002f, -9.35762291e-14f, -30.f},
         {0.5f, 0.5f, NAN, 0.731058598f, 0.119202919f, 9.35762291e-14f, 1.f}},
        {"mish", SF_ACT_MISH, {0.f, 0.f, 0},
         {0.f, -0.f, NAN, -0.303401440f, 1.94395900f, 30.f, -2.80728695e-12f},
         {0.600000024f, 0.600000024f, NAN, 0.0592167303f, 1.06931794f, 1.f, -2.71371098e-12f}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char what[64];
        sf_ref_act_fwd(cases[c].act, cases[c].prm, x, 7, y);
        snprintf(what, sizeof what, "%s forward", cases[c].name);
        expect_near(what, y, cases[c].y, 7);
        sf_ref_act_bwd(cases[c].act, cases[c].prm, x, dy, 7, dx);
        snprintf(what, sizeof what, "%s backward", cases[c].name);
        expect_near(what, dx, cases[c].dx, 7);
    }
}

static void avgpool_divisors_and_adaptive_bins_follow_pytorch(void **state)
{
    /* 1x1x3x3 of ones, k2 s2 p1 ceil: output 2x2 (PyTorch: ceil((3+2-2)/2)+1 = 3, the
     * last window starts at 4 >= 3+1, so 2). */
    double x[9], y[4];
    for (int i = 0; i < 9; i++)
        x[i] = 1;
    sf_ref_avgpool2d_fwd_f64(x, 1, 1, 3, 3, 2, 2, 1, 1, 2, 2, y);
    /* With padding counted: corner window covers 1 real tap of 4. */
    assert_true(fabs(y[0] - 0.25) < 1e-12 && fabs(y[1] - 0.5) < 1e-12 && fabs(y[3] - 1.0) < 1e-12);
    sf_ref_avgpool2d_fwd_f64(x, 1, 1, 3, 3, 2, 2, 1, 0, 2, 2, y);
    for (int i = 0; i < 4; i++)
        assert_true(fabs(y[i] - 1.0) < 1e-12);
    /* Adaptive 5 -> 3: bins [0,2), [1,4), [3,5) (overlapping). */
    double r[5] = {1, 2, 3, 4, 5}, o[3];
    sf_ref_adaptive_avgpool2d_fwd_f64(r, 1, 1, 1, 5, 1, 3, o);
    assert_true(fabs(o[0] - 1.5) < 1e-12 && fabs(o[1] - 3.0) < 1e-12 && fabs(o[2] - 4.5) < 1e-12);
}

/* torchvision's channel_shuffle(x, 3) of 6 channels: view [3, 2], transpose
 * to [2, 3], so the channels come out as 0, 2, 4, 1, 3, 5; the slice's
 * gradient is zero outside its channels. */
static void channel_shuffle_and_slice_follow_pytorch(void **state)
{
    double x[6 * 2], y[6 * 2], back[6 * 2];
    for (int i = 0; i < 12; i++)
        x[i] = i;
    sf_ref_channel_shuffle_f64(x, 1, 6, 2, 3, y);
    const int order[6] = {0, 2, 4, 1, 3, 5};
    for (int c = 0; c < 6; c++)
        for (int p = 0; p < 2; p++)
            assert_true(y[c * 2 + p] == x[order[c] * 2 + p]);
    sf_ref_channel_shuffle_f64(y, 1, 6, 2, 2, back);
    assert_memory_equal(back, x, sizeof x);
    double d[2 * 2] = {1, 2, 3, 4}, dx[6 * 2];
    sf_ref_channel_slice_bwd_f64(d, 1, 6, 2, 3, 2, dx);
    const double want[12] = {0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 0, 0};
    assert_memory_equal(dx, want, sizeof want);
}

/* PyTorch's pixel_shuffle(x, 2) of 4 channels of 1x2: output pixel (h, w)
 * of the 2x4 map is input channel (h % 2) * 2 + w % 2 at (0, w / 2), so the
 * first row reads channels 0, 1, 0, 1 and the second 2, 3, 2, 3;
 * pixel_unshuffle undoes it. */
static void pixel_shuffle_follows_pytorch(void **state)
{
    double x[4 * 2], y[2 * 4], back[4 * 2];
    for (int i = 0; i < 8; i++)
        x[i] = i; /* channel c at (0, w) is 2 c + w */
    sf_ref_pixel_shuffle_f64(x, 1, 1, 1, 2, 2, 0, y);
    const double want[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    assert_memory_equal(y, want, sizeof want);
    sf_ref_pixel_shuffle_f64(y, 1, 1, 1, 2, 2, 1, back);
    assert_memory_equal(back, x, sizeof x);
}

/* F.pad(x, (2, 1, 1, 1), mode) of x = [[1, 2, 3], [4, 5, 6]] and its
 * gradient under dy = 1 (how many outputs read each input), as PyTorch 2.15
 * gives them: reflect mirrors without the edge, replicate repeats it,
 * circular wraps, constant fills (0.5) and passes the border no gradient. */
static void pad_follows_pytorch_in_each_mode(void **state)
{
    const double x[6] = {1, 2, 3, 4, 5, 6};
    const int pad[4] = {2, 1, 1, 1};
    double ones[24], y[24], dx[6];
    for (int i = 0; i < 24; i++)
        ones[i] = 1;
    static const struct {
        int mode;
        double y[24], dx[6];
    } want[] = {
        {SF_PAD_REFLECT, {6, 5, 4, 5, 6, 5, 3, 2, 1, 2, 3, 2, 6, 5, 4, 5, 6, 5, 3, 2, 1, 2, 3, 2}, {2, 6, 4, 2, 6, 4}},
        {SF_PAD_REPLICATE, {1, 1, 1, 2, 3, 3, 1, 1, 1, 2, 3, 3, 4, 4, 4, 5, 6, 6, 4, 4, 4, 5, 6, 6}, {6, 2, 4, 6, 2, 4}},
        {SF_PAD_CIRCULAR, {5, 6, 4, 5, 6, 4, 2, 3, 1, 2, 3, 1, 5, 6, 4, 5, 6, 4, 2, 3, 1, 2, 3, 1}, {4, 4, 4, 4, 4, 4}},
        {SF_PAD_CONSTANT, {.5, .5, .5, .5, .5, .5, .5, .5, 1, 2, 3, .5, .5, .5, 4, 5, 6, .5, .5, .5, .5, .5, .5, .5},
         {1, 1, 1, 1, 1, 1}},
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        sf_ref_pad_fwd_f64(x, 1, 1, 2, 3, pad, want[k].mode, 0.5, y);
        assert_memory_equal(y, want[k].y, sizeof y);
        sf_ref_pad_bwd_f64(ones, 1, 1, 2, 3, pad, want[k].mode, dx);
        assert_memory_equal(dx, want[k].dx, sizeof dx);
    }
}

static void dropout_keeps_about_one_minus_p_and_scales_the_kept(void **state)
{
    enum { N = 20000 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N), *y2 = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++)
        x[i] = 1.0f;
    sf_ref_dropout_fwd(x, 1, N, 0.25f, 5, 6, 2, y);
    int kept = 0;
    for (int i = 0; i < N; i++) {
        if (y[i] != 0.0f) {
            kept++;
            assert_true(fabsf(y[i] - 1.0f / 0.75f) < 1e-6f);
        }
    }
    assert_true(kept > 0.72 * N && kept < 0.78 * N);
    /* The same keys draw the same mask; another batch another one. */
    sf_ref_dropout_fwd(x, 1, N, 0.25f, 5, 6, 2, y2);
    assert_memory_equal(y, y2, sizeof(float) * N);
    sf_ref_dropout_fwd(x, 1, N, 0.25f, 5, 7, 2, y2);
    assert_true(memcmp(y, y2, sizeof(float) * N) != 0);
    /* p = 1 zeroes everything, p = 0 is the identity. */
    sf_ref_dropout_fwd(x, 1, N, 1.0f, 5, 6, 2, y);
    for (int i = 0; i < N; i++)
        assert_true(y[i] == 0.0f);
    sf_ref_stochastic_depth_fwd(x, 4, N / 4, 0.0f, 5, 6, 2, y);
    assert_memory_equal(x, y, sizeof(float) * N);
    /* Channel dropout: 10 samples of 200 channels of 10 values; a channel
     * is kept or dropped whole, about 3 in 4 kept, its own keys. */
    sf_ref_dropout2d_fwd(x, 10, 200, 10, 0.25f, 5, 6, 2, y);
    int kept_ch = 0;
    for (int u = 0; u < 2000; u++) {
        for (int e = 1; e < 10; e++)
            assert_true(y[u * 10 + e] == y[u * 10]);
        kept_ch += y[u * 10] != 0.0f;
        assert_true(y[u * 10] == 0.0f || fabsf(y[u * 10] - 1.0f / 0.75f) < 1e-6f);
    }
    assert_true(kept_ch > 0.70 * 2000 && kept_ch < 0.80 * 2000);
    sf_ref_dropout2d_fwd(x, 10, 200, 10, 0.25f, 5, 7, 2, y2);
    assert_true(memcmp(y, y2, sizeof(float) * N) != 0);
    sf_ref_dropout2d_fwd(x, 10, 200, 10, 0.0f, 5, 6, 2, y);
    assert_memory_equal(x, y, sizeof(float) * N);
    free(x);
    free(y);
    free(y2);
}

/* ---- the kinds inside models, through the reference backend ------------------- */

#define BATCH 16
#define HW 8

#include "tests/unit/layer_kind_specs.h"

static const char *const *const SPECS[] = {&GROUPED_SPEC, &SE_SPEC, &CONVNEXT_SPEC, &DENSE_SPEC, &VIT_SPEC,
                                           &SHUFFLE_SPEC, &PAD_SPEC, &ECA_SPEC, &METAFORMER_SPEC};
static const char *const SPEC_NAMES[] = {"grouped", "squeeze-excitation", "convnext", "densenet", "vit",
                                         "shufflenet", "pad", "eca", "metaformer"};

typedef struct rig {
    sf_backend *be;
    sf_model m;
    sf_train_cfg cfg;
    sf_aug_pipeline p;
    sf_aug_plan plan;
    sf_aug_sample s[BATCH];
    uint8_t images[BATCH * HW * HW * 3];
    uint8_t labels[BATCH];
} rig;

static rig *rig_new_on_rank(const char *spec, sf_precision prec, const sf_dist *dist)
{
    rig *r = calloc(1, sizeof *r);
    r->be = sf_backend_ref_new(err, sizeof err);
    assert_non_null(r->be);
    if (sf_model_from_json(spec, &r->m, err, sizeof err) != 0)
        fail_msg("spec: %s", err);
    r->cfg.precision = prec;
    r->cfg.seed = 3;
    r->cfg.max_batch = BATCH;
    r->cfg.optim = SF_OPT_SGD;
    r->cfg.dist = dist;
    if (r->be->i->build(r->be, &r->m, &r->cfg, err, sizeof err) != 0)
        fail_msg("build: %s", err);
    assert_int_equal(sf_aug_parse("[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":0.00392156862745098},"
                                  "{\"op\":\"normalize\",\"mean\":[0.3],\"std\":[0.3]}]",
                                  &r->p, err, sizeof err), 0);
    assert_int_equal(sf_aug_plan_make(&r->p, HW, HW, 3, &r->plan, err, sizeof err), 0);
    return r;
}

static rig *rig_new(const char *spec, sf_precision prec) { return rig_new_on_rank(spec, prec, NULL); }

static void rig_free(rig *r)
{
    r->be->i->destroy(r->be);
    free(r);
}

static sf_batch batch_of(rig *r, uint64_t seq, float lr)
{
    for (int i = 0; i < BATCH; i++) {
        const int q = (int)(sf_hash4(11, seq, i, 0) % 4);
        r->labels[i] = (uint8_t)q;
        for (int p = 0; p < HW * HW; p++)
            for (int ch = 0; ch < 3; ch++)
                r->images[((size_t)i * HW * HW + p) * 3 + ch] =
                    (uint8_t)(sf_hash4(seq, i, p, ch) % 100 + (ch == q ? 100 : 0));
    }
    sf_aug_gen(&r->p, &r->plan, 1, seq, BATCH, r->s);
    sf_batch b = u8_nhwc_batch(BATCH, HW, HW, 3, r->images, r->labels, &r->plan, r->s, lr);
    b.id = seq + 1;
    b.seq = seq;
    return b;
}

/* SGD with lr 1 and no momentum takes p1 = p0 - grad; each probed
 * parameter's finite difference of the loss (same batch, so the same dropout
 * masks) must agree. */
static void each_kind_trains_in_a_model_with_gradients_matching_finite_differences(void **state)
{
    for (size_t si = 0; si < sizeof SPECS / sizeof SPECS[0]; si++) {
        rig *r = rig_new(*SPECS[si], SF_PREC_FP32);
        const size_t np = r->m.n_params;
        float *p0 = malloc(np * sizeof *p0), *p1 = malloc(np * sizeof *p1), *pp = malloc(np * sizeof *pp);
        assert_int_equal(r->be->i->get_params(r->be, p0), 0);
        sf_batch b = batch_of(r, 5, 1.0f);
        trained_step(r->be, &b);
        assert_int_equal(r->be->i->get_params(r->be, p1), 0);
        b.hyper.lr = 0.0f;
        int checked = 0, bad = 0;
        for (size_t e = 0; e < np; e += 3) {
            const double h = 2e-3;
            memcpy(pp, p0, np * sizeof *pp);
            pp[e] = (float)(p0[e] + h);
            r->be->i->set_params(r->be, pp);
            const double lp = trained_step(r->be, &b).loss;
            pp[e] = (float)(p0[e] - h);
            r->be->i->set_params(r->be, pp);
            const double lm = trained_step(r->be, &b).loss;
            const double fd = (lp - lm) / (2 * h), an = (double)p0[e] - (double)p1[e];
            if (fabs(fd - an) > 2e-3 + 0.05 * fabs(an) && bad++ < 5)
                print_error("%s: param %zu: analytic %.6g finite difference %.6g\n", SPEC_NAMES[si], e, an, fd);
            checked++;
        }
        if (bad)
            fail_msg("%s: %d of %d parameters' gradients differ from finite differences", SPEC_NAMES[si], bad,
                     checked);
        assert_true(checked > 10);
        free(p0);
        free(p1);
        free(pp);
        rig_free(r);
    }
}

/* bf16 runs every kind of these models: finite losses close to fp32's from the same
 * initial weights, and the logits are bf16 values. */
static void each_kind_trains_in_bf16_close_to_fp32(void **state)
{
    for (size_t si = 0; si < sizeof SPECS / sizeof SPECS[0]; si++) {
        rig *a = rig_new(*SPECS[si], SF_PREC_FP32), *z = rig_new(*SPECS[si], SF_PREC_BF16);
        float logits[BATCH * 4];
        for (uint64_t s = 0; s < 3; s++) {
            sf_batch b = batch_of(a, s, 0.05f);
            const double la = trained_step(a->be, &b).loss;
            sf_batch bz = batch_of(z, s, 0.05f);
            bz.logits_out = logits;
            const double lz = trained_step(z->be, &bz).loss;
            if (fabs(la - lz) > 0.05 * fabs(la) + 0.02)
                fail_msg("%s step %d: bf16 loss %.5f, fp32 %.5f", SPEC_NAMES[si], (int)s, lz, la);
            for (int i = 0; i < BATCH * 4; i++)
                assert_true(logits[i] == sf_bf16_round(logits[i]));
        }
        rig_free(a);
        rig_free(z);
    }
}

/* Eval mode: dropout and stochastic depth are the identity, so the same
 * batch gives the same logits twice and training draws differ by batch. */
static void dropout_and_stochastic_depth_are_identity_in_eval(void **state)
{
    for (int si = 2; si <= 3; si++) {
        rig *r = rig_new(*SPECS[si], SF_PREC_FP32);
        float l1[BATCH * 4], l2[BATCH * 4], l3[BATCH * 4];
        sf_batch b = batch_of(r, 1, 0.0f);
        b.eval = 1;
        b.logits_out = l1;
        submit_step(r->be, &b);
        b.seq = 2; /* another batch sequence: eval draws nothing */
        b.logits_out = l2;
        submit_step(r->be, &b);
        assert_memory_equal(l1, l2, sizeof l1);
        b.eval = 0;
        b.logits_out = l3; /* training with lr 0: the masks show in the logits */
        trained_step(r->be, &b);
        assert_true(memcmp(l1, l3, sizeof l1) != 0);
        rig_free(r);
    }
}

/* Ranks of a data-parallel job train different samples at the same batch
 * index: each draws its own masks, and each rank's draws are reproducible.
 * (world 1 keeps the reference from all-reducing: only the rank differs.) */
static void each_rank_draws_its_own_dropout_masks(void **state)
{
    static const sf_dist rank0 = {.rank = 0, .world = 1}, rank1 = {.rank = 1, .world = 1};
    float l[3][BATCH * 4];
    const sf_dist *ranks[3] = {&rank0, &rank1, &rank1};
    for (int k = 0; k < 3; k++) {
        rig *r = rig_new_on_rank(DENSE_SPEC, SF_PREC_FP32, ranks[k]);
        sf_batch b = batch_of(r, 1, 0.0f);
        b.logits_out = l[k];
        trained_step(r->be, &b);
        rig_free(r);
    }
    assert_true(memcmp(l[0], l[1], sizeof l[0]) != 0);
    assert_memory_equal(l[1], l[2], sizeof l[1]);
}

/* A parameter's gradient that is one sum over a whole activation tensor (a
 * one-value scale_shift: timm's LearnableAffineBlock) is accumulated in
 * double by the float reference: a float running sum over 2^20 terms drifts
 * by about sqrt(n) of its own rounding steps (tens of units here, on a sum
 * near 2^19), where PyTorch's blocked float sums and the CUDA kernels' tree
 * stay within a few of its last bits. */
static void one_value_parameter_gradients_sum_a_whole_tensor_to_float_precision(void **state)
{
    (void)state;
    const size_t hw = (size_t)1 << 20;
    float *x = malloc(hw * sizeof *x), *dy = malloc(hw * sizeof *dy);
    assert_non_null(x);
    assert_non_null(dy);
    uint32_t r = 12345u;
    double want_s = 0, want_b = 0;
    for (size_t i = 0; i < hw; i++) {
        r = r * 1664525u + 1013904223u;
        x[i] = 1.0f + (float)(r >> 8) / 16777216.0f; /* [1, 2) */
        r = r * 1664525u + 1013904223u;
        dy[i] = (float)(r >> 8) / 16777216.0f; /* [0, 1) */
        want_s += (double)dy[i] * x[i];
        want_b += dy[i];
    }
    const float one = 1.0f;
    float ds, db;
    sf_ref_channel_scale_bwd(x, 1, 1, hw, &one, dy, NULL, &ds);
    sf_ref_bias_grad(dy, 1, 1, hw, &db);
    assert_true(fabs(ds - want_s) <= 1e-6 * want_s);
    assert_true(fabs(db - want_b) <= 1e-6 * want_b);
    free(x);
    free(dy);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(each_kernels_backward_matches_finite_differences),
        cmocka_unit_test(leaky_relu_and_tanh_follow_pytorch_at_zero_nan_and_saturation),
        cmocka_unit_test(elu_selu_softplus_mish_follow_pytorch_at_zero_nan_and_saturation),
        cmocka_unit_test(prelu_follows_pytorch_at_zero_and_nan),
        cmocka_unit_test(one_value_parameter_gradients_sum_a_whole_tensor_to_float_precision),
        cmocka_unit_test(clamp_follows_pytorch_at_the_bounds_infinities_and_nan),
        cmocka_unit_test(avgpool_divisors_and_adaptive_bins_follow_pytorch),
        cmocka_unit_test(channel_shuffle_and_slice_follow_pytorch),
        cmocka_unit_test(pixel_shuffle_follows_pytorch),
        cmocka_unit_test(pad_follows_pytorch_in_each_mode),
        cmocka_unit_test(dropout_keeps_about_one_minus_p_and_scales_the_kept),
        cmocka_unit_test(each_kind_trains_in_a_model_with_gradients_matching_finite_differences),
        cmocka_unit_test(each_kind_trains_in_bf16_close_to_fp32),
        cmocka_unit_test(dropout_and_stochastic_depth_are_identity_in_eval),
        cmocka_unit_test(each_rank_draws_its_own_dropout_masks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
