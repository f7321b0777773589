/* gpu/layers.c — the layer-kind registry (see gpu/layers.h): one row per
 * kind, the shape and parameter rules of each, and the loops every consumer
 * of the table shares. */
#include "gpu/layers.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gpu/common.h"
#include "gpu/layer_init.h"
#include "gpu/pool_rule.h"
#include "gpu/ref/layer_io.h"
#include "gpu/rng.h"

#define OFF(f) offsetof(sf_layer, f)

/* ---- fields ------------------------------------------------------------------ */

#define F_IN {"in", SF_FT_INT, OFF(in_c), 1, SF_MAX_CHANNELS, 0, SF_FF_INFERRED, NULL, \
              "input channels or features; optional, checked against the previous layer"}
#define F_OUT(what) {"out", SF_FT_INT, OFF(out_c), 1, SF_MAX_CHANNELS, 0, SF_FF_REQUIRED, NULL, what}
#define F_K {"k", SF_FT_INT, OFF(k), 1, SF_MAX_KERNEL, 0, SF_FF_REQUIRED, NULL, "kernel size (square)"}
#define F_STRIDE(def, doc) {"stride", SF_FT_INT, OFF(stride), 1, SF_MAX_KERNEL, def, 0, NULL, doc}
#define F_PAD {"pad", SF_FT_INT, OFF(pad), 0, SF_MAX_KERNEL, 0, 0, NULL, "zero padding on each side"}
#define F_BIAS {"bias", SF_FT_BOOL, OFF(bias), 0, 1, 1, 0, NULL, "a bias parameter"}
#define F_END {NULL, 0, 0, 0, 0, 0, 0, NULL, NULL}

static const char *const over_choices[] = {"features", "channels", NULL};
static const char *const gelu_choices[] = {"none", "tanh", NULL};
static const char *const depth_modes[] = {"row", NULL};

#define F_EPS(flags) {"eps", SF_FT_FLOAT, OFF(eps), 0, 1, 1e-5, SF_FF_LO_OPEN | (flags), NULL, \
                      "added to the variance before the square root"}
#define F_CEIL(flags) {"ceil_mode", SF_FT_BOOL, OFF(ceil_mode), 0, 1, 0, flags, NULL, \
                       "output size rounded up (a last window may start in the padding's reach)"}

_Static_assert(OFF(stride_w) - OFF(stride) == SF_FT_HW_WIDTH && OFF(pad_w) - OFF(pad) == SF_FT_HW_WIDTH &&
                   OFF(dilation_w) - OFF(dilation) == SF_FT_HW_WIDTH,
               "each INT_HW field's width lies SF_FT_HW_WIDTH bytes after its height");

/* conv2d's window takes PyTorch's forms: one number for both dimensions or
 * [h, w] (Inception's 1x7 and 7x1 kernels, a stride along one axis). */
static const sf_layer_field conv2d_fields[] = {
    F_IN, F_OUT("output channels"),
    {"k", SF_FT_INT_HW, OFF(k), 1, SF_MAX_KERNEL, 0, SF_FF_REQUIRED, NULL, "kernel size"},
    {"stride", SF_FT_INT_HW, OFF(stride), 1, SF_MAX_KERNEL, 1, 0, NULL, "stride"},
    {"pad", SF_FT_INT_HW, OFF(pad), 0, SF_MAX_KERNEL, 0, 0, NULL, "zero padding on each side"},
    F_BIAS,
    {"groups", SF_FT_INT, OFF(groups), 1, SF_MAX_CHANNELS, 1, SF_FF_IF_SET, NULL,
     "groups (in and out divisible by it; groups = in = out is depthwise)"},
    {"dilation", SF_FT_INT_HW, OFF(dilation), 1, SF_MAX_KERNEL, 1, SF_FF_IF_SET, NULL,
     "spacing between kernel taps"},
    F_END,
};
static const sf_layer_field bn2d_fields[] = {
    F_EPS(SF_FF_IF_SET),
    {"momentum", SF_FT_FLOAT, OFF(momentum), 0, 1, 0.1, SF_FF_LO_OPEN | SF_FF_IF_SET, NULL,
     "running statistics' update weight"},
    F_END,
};
static const sf_layer_field avgpool2d_fields[] = {
    F_K, F_STRIDE(0, "stride (default: k)"), F_PAD, F_CEIL(0),
    {"count_include_pad", SF_FT_BOOL, OFF(count_include_pad), 0, 1, 1, 0, NULL,
     "padding counts in the divisor"},
    F_END,
};
static const sf_layer_field adaptive_fields[] = {
    {"out", SF_FT_INT_PAIR, OFF(out_size), 1, SF_MAX_SPATIAL, 1, SF_FF_REQUIRED, NULL, "output [h, w]"},
    F_END,
};
/* A norm's bias may be left out (timm's MetaFormer v2 norms: LayerNorm2dNoBias,
 * LayerNormNoBias, GroupNorm1NoBias; nn.LayerNorm(bias=False)). */
#define F_NORM_BIAS(what) {"bias", SF_FT_BOOL, OFF(bias), 0, 1, 1, SF_FF_IF_SET, NULL, what}
static const sf_layer_field ln_fields[] = {
    F_EPS(0), F_NORM_BIAS("a bias parameter (false: nn.LayerNorm(bias=False), timm's LayerNorm2dNoBias)"), F_END};
static const char *const upsample_modes[] = {"nearest", "bilinear", NULL};
static const sf_layer_field upsample_fields[] = {
    {"scale", SF_FT_INT, OFF(scale), 1, SF_MAX_KERNEL, 0, SF_FF_IF_SET, NULL,
     "each input pixel becomes scale x scale output pixels (scale or size, one of them)"},
    {"size", SF_FT_INT_PAIR, OFF(out_size), 1, SF_MAX_SPATIAL, 0, SF_FF_IF_SET, NULL,
     "the output's [h, w] (PyTorch's size=)"},
    {"mode", SF_FT_ENUM, OFF(mode), 0, 1, SF_UP_NEAREST, SF_FF_IF_SET, upsample_modes,
     "PyTorch's mode: the nearest input pixel, or the bilinear blend of four"},
    {"align_corners", SF_FT_BOOL, OFF(align_corners), 0, 1, 0, SF_FF_IF_SET, NULL,
     "bilinear: the corner pixels' centres of input and output align (PyTorch's flag)"},
    F_END,
};
static const sf_layer_field gn_fields[] = {
    {"num_groups", SF_FT_INT, OFF(groups), 1, SF_MAX_CHANNELS, 0, SF_FF_REQUIRED, NULL,
     "groups the channels are split into (divides them)"},
    F_EPS(0),
    {"affine", SF_FT_BOOL, OFF(affine), 0, 1, 1, SF_FF_IF_SET, NULL,
     "a weight and a bias parameter (false: nn.GroupNorm(affine=False), nn.InstanceNorm2d's default)"},
    F_NORM_BIAS("with affine, a bias parameter beside the weight (false: timm's GroupNorm1NoBias)"),
    F_END,
};
static const sf_layer_field gelu_fields[] = {
    {"approximate", SF_FT_ENUM, OFF(approximate), 0, 1, 0, 0, gelu_choices, "\"none\" (erf) or \"tanh\""},
    F_END,
};
/* PyTorch bounds the slope of nn.LeakyReLU by nothing (a negative one or one
 * above 1 is a different function, and users train them); the float range
 * keeps the value finite once stored. */
static const sf_layer_field leaky_relu_fields[] = {
    {"negative_slope", SF_FT_FLOAT, OFF(negative_slope), -FLT_MAX, FLT_MAX, 0.01, 0, NULL,
     "the slope for x <= 0"},
    F_END,
};
/* ELU's alpha and softplus's beta and threshold: PyTorch bounds none of
 * them (a negative alpha or beta is a different function, and it runs it),
 * but softplus divides by beta, so 0 is refused (softplus_shape). */
static const sf_layer_field elu_fields[] = {
    {"alpha", SF_FT_FLOAT, OFF(alpha), -FLT_MAX, FLT_MAX, 1.0, 0, NULL,
     "the negative branch's scale: alpha * (exp(x) - 1) for x <= 0"},
    F_END,
};
static const sf_layer_field softplus_fields[] = {
    {"beta", SF_FT_FLOAT, OFF(beta), -FLT_MAX, FLT_MAX, 1.0, 0, NULL,
     "the input's scale, not 0: log1p(exp(beta * x)) / beta"},
    {"threshold", SF_FT_FLOAT, OFF(threshold), -FLT_MAX, FLT_MAX, 20.0, 0, NULL,
     "x itself where beta * x > threshold"},
    F_END,
};
/* affine: any finite scale and shift (x * 0 + c is a constant map, as in
 * PyTorch); the exporter folds a chain of arithmetic with numbers into one. */
static const sf_layer_field affine_fields[] = {
    {"scale", SF_FT_FLOAT, OFF(affine_scale), -FLT_MAX, FLT_MAX, 1.0, 0, NULL, "the factor of x"},
    {"shift", SF_FT_FLOAT, OFF(affine_shift), -FLT_MAX, FLT_MAX, 0.0, 0, NULL, "added after the product"},
    F_END,
};
static const sf_layer_field prelu_fields[] = {
    {"num_parameters", SF_FT_INT, OFF(num_parameters), 1, SF_MAX_CHANNELS, 1, 0, NULL,
     "slopes: 1 (one for every channel) or the input's channels (one each)"},
    F_END,
};
/* F.pad's pad, mode and value for the last two dimensions of a map;
 * negative pads (crops) are refused by the bounds. */
static const char *const pad_modes[] = {"constant", "reflect", "replicate", "circular", NULL};
static const sf_layer_field pad_fields[] = {
    {"pad", SF_FT_INT_QUAD, OFF(pads), 0, SF_MAX_PAD, 0, SF_FF_REQUIRED, NULL,
     "F.pad's order for the last two dimensions: columns added on the left and right, rows on top and bottom"},
    {"mode", SF_FT_ENUM, OFF(mode), 0, 3, SF_PAD_CONSTANT, 0, pad_modes,
     "F.pad's mode: a constant fill, the mirror image without the edge, the edge repeated, or the opposite side"},
    {"value", SF_FT_FLOAT, OFF(pad_value), -FLT_MAX, FLT_MAX, 0.0, SF_FF_IF_SET, NULL,
     "mode \"constant\": the fill"},
    F_END,
};
/* clamp: either bound may be left out (open-ended: torch.clamp_min,
 * clamp_max), not both (clamp_shape); the default infinities mark a side
 * left out and are never written back. */
static const char *const clamp_grad_choices[] = {"clamp", "hardtanh", "clamp_closed", NULL};
static const sf_layer_field clamp_fields[] = {
    {"min", SF_FT_FLOAT, OFF(clamp_min), -FLT_MAX, FLT_MAX, -INFINITY, SF_FF_IF_SET, NULL,
     "the lower bound (none: unbounded below)"},
    {"max", SF_FT_FLOAT, OFF(clamp_max), -FLT_MAX, FLT_MAX, INFINITY, SF_FF_IF_SET, NULL,
     "the upper bound, not below min (none: unbounded above)"},
    {"grad", SF_FT_ENUM, OFF(clamp_grad), 0, 2, SF_CLAMP_GRAD_CLAMP, 0, clamp_grad_choices,
     "whose backward: \"clamp\" and \"hardtanh\" pass dy only strictly between the bounds; at a NaN input "
     "\"clamp\" (torch.clamp, clip, clamp_min, clamp_max) passes none, \"hardtanh\" (nn.Hardtanh, F.hardtanh) "
     "passes dy; \"clamp_closed\" (torch.clamp of releases before 2.15, 2.11 among them) passes dy at the "
     "bounds too and none at a NaN"},
    F_END,
};
static const sf_layer_field dropout_fields[] = {
    {"p", SF_FT_FLOAT, OFF(p), 0, 1, 0.5, 0, NULL, "probability of an element being zeroed"},
    F_END,
};
static const sf_layer_field depth_fields[] = {
    {"p", SF_FT_FLOAT, OFF(p), 0, 1, 0, SF_FF_REQUIRED, NULL, "probability of a sample's branch being zeroed"},
    {"mode", SF_FT_ENUM, OFF(mode), 0, 0, 0, 0, depth_modes, "\"row\": per sample"},
    F_END,
};
static const sf_layer_field convt2d_fields[] = {
    F_IN, F_OUT("output channels"), F_K, F_STRIDE(1, "stride"), F_PAD, F_BIAS, F_END,
};
static const sf_layer_field linear_fields[] = {
    F_IN, F_OUT("output features"), F_BIAS,
    {"over", SF_FT_ENUM, OFF(over_channels), 0, 1, 0, SF_FF_IF_SET, over_choices,
     "\"features\" of a flat input, or \"channels\" of each pixel of a map"},
    F_END,
};
static const sf_layer_field maxpool2d_fields[] = {
    F_K, F_STRIDE(0, "stride (default: k)"), F_PAD, F_CEIL(SF_FF_IF_SET), F_END,
};
static const sf_layer_field attention_fields[] = {
    {"embed_dim", SF_FT_INT, OFF(in_c), 1, SF_MAX_CHANNELS, 0, SF_FF_INFERRED, NULL,
     "embedding dimension C; optional, checked against the input's"},
    {"num_heads", SF_FT_INT, OFF(heads), 1, SF_MAX_CHANNELS, 0, SF_FF_REQUIRED, NULL,
     "attention heads (divides embed_dim)"},
    {"dropout", SF_FT_FLOAT, OFF(p), 0, 0, 0, SF_FF_IF_SET, NULL,
     "dropout on the attention weights: 0 only (a nonzero one is refused)"},
    {"in_proj_bias", SF_FT_BOOL, OFF(bias), 0, 1, 1, SF_FF_IF_SET, NULL,
     "a bias on the q, k, v projection (timm's qkv_bias; nn.MultiheadAttention's bias)"},
    {"out_proj_bias", SF_FT_BOOL, OFF(out_bias), 0, 1, 1, SF_FF_IF_SET, NULL,
     "a bias on the output projection (nn.MultiheadAttention's bias)"},
    {"separate_qkv", SF_FT_BOOL, OFF(qkv_split), 0, 1, 0, SF_FF_IF_SET, NULL,
     "q, k and v projected by three parameters [C, C] (and biases [C]) in place of in_proj_weight [3C, C], as "
     "Hugging Face's query, key and value Linears hold them"},
    F_END,
};
static const sf_layer_field shuffle_fields[] = {
    {"groups", SF_FT_INT, OFF(groups), 1, SF_MAX_CHANNELS, 0, SF_FF_REQUIRED, NULL,
     "groups (divides the channels): the map read as [groups, C/groups] channels, transposed"},
    F_END,
};
static const sf_layer_field slice_fields[] = {
    {"start", SF_FT_INT, OFF(start), 0, SF_MAX_CHANNELS - 1, 0, SF_FF_REQUIRED, NULL, "first channel taken"},
    {"count", SF_FT_INT, OFF(count), 1, SF_MAX_CHANNELS, 0, SF_FF_REQUIRED, NULL,
     "channels taken (start + count at most the input's channels)"},
    F_END,
};
static const sf_layer_field token_mean_fields[] = {
    {"start", SF_FT_INT, OFF(start), 0, SF_MAX_SPATIAL - 1, 0, SF_FF_IF_SET, NULL,
     "first token averaged (1 leaves a class token out; less than the tokens)"},
    F_END,
};
static const sf_layer_field pixel_shuffle_fields[] = {
    {"factor", SF_FT_INT, OFF(scale), 1, 64, 0, SF_FF_REQUIRED, NULL,
     "r: each r x r block of output pixels comes from r * r channels of one input pixel"},
    F_END,
};
static const sf_layer_field grn_fields[] = {
    {"eps", SF_FT_FLOAT, OFF(eps), 0, 1, 1e-6, SF_FF_LO_OPEN | SF_FF_IF_SET, NULL,
     "added to the channels' mean norm before the division (timm's GlobalResponseNorm: 1e-6)"},
    F_END,
};
static const sf_layer_field to_map_fields[] = {
    {"size", SF_FT_INT_PAIR, OFF(out_size), 1, SF_MAX_SPATIAL, 1, SF_FF_REQUIRED, NULL,
     "the map's [h, w]; h * w is the number of tokens"},
    F_END,
};
static const sf_layer_field pixel_unshuffle_fields[] = {
    {"factor", SF_FT_INT, OFF(scale), 1, 64, 0, SF_FF_REQUIRED, NULL,
     "r (divides the input's height and width): each r x r block of input pixels becomes r * r channels"},
    F_END,
};
static const sf_layer_field no_fields[] = {F_END};
static const sf_layer_field layer_scale_fields[] = {
    {"vector", SF_FT_BOOL, OFF(vector), 0, 1, 0, SF_FF_IF_SET, NULL,
     "the parameter is [C] (x * gamma of a channels-last map, or a map times gamma.reshape(1, -1, 1, 1) as timm's "
     "ConvNeXt has it) rather than [C,1,1]; [C] on a token sequence whatever this says"},
    F_END,
};

/* The shape the module holds scale_shift's weight and bias in, C being
 * num_parameters (gpu/model.h's SF_SS_*): the checkpoint keeps it, so that
 * load_state_dict(strict=True) takes the service's tensors. */
static const char *const scale_shift_shapes[] = {"[C]", "[C,1,1]", "[1,1,C]", "[1,C,1,1]", NULL};
/* ECA's Conv1d(1, 1, k, padding=(k - 1) / 2): the output keeps the input's
 * channels, which the multiply that follows it needs. */
static const sf_layer_field channel_conv1d_fields[] = {
    {"k", SF_FT_INT, OFF(k), 1, SF_MAX_KERNEL, 0, SF_FF_REQUIRED, NULL, "kernel size (odd: 2 * pad + 1)"},
    {"pad", SF_FT_INT, OFF(pad), 0, SF_MAX_KERNEL, 0, 0, NULL, "zero padding at each end of the channels"},
    F_BIAS,
    F_END,
};
static const sf_layer_field scale_shift_fields[] = {
    {"num_parameters", SF_FT_INT, OFF(num_parameters), 1, SF_MAX_CHANNELS, 1, 0, NULL,
     "weights (and biases): 1 (one for the whole tensor, timm's LearnableAffineBlock) or the input's channels (one "
     "per channel of a map, feature or token channel: ResMLP's Affine)"},
    {"param_shape", SF_FT_ENUM, OFF(mode), 0, 3, SF_SS_C, 0, scale_shift_shapes,
     "how the module holds each parameter, C being num_parameters: \"[C]\", \"[C,1,1]\" (a map's channels), "
     "\"[1,1,C]\" (ResMLP's, over tokens) or \"[1,C,1,1]\""},
    F_BIAS,
    F_END,
};

/* ---- shape rules ------------------------------------------------------------ */

static int same_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    *out = in[0];
    return 0;
}

/* softplus divides by beta: PyTorch runs beta 0 into infinities, the
 * service refuses it. */
static int softplus_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (L->beta == 0.f) {
        sf_errf(err, errlen, "\"beta\" must not be 0 (softplus divides by it)");
        return -1;
    }
    return same_shape(L, in, n_in, out, err, errlen);
}

/* clamp needs a bound and, with two, min <= max (torch.clamp would map
 * everything to max, nn.Hardtanh refuses it). */
static int clamp_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (isinf(L->clamp_min) && isinf(L->clamp_max)) {
        sf_errf(err, errlen, "needs \"min\", \"max\" or both");
        return -1;
    }
    if (L->clamp_min > L->clamp_max) {
        sf_errf(err, errlen, "\"min\" %g is above \"max\" %g", (double)L->clamp_min, (double)L->clamp_max);
        return -1;
    }
    return same_shape(L, in, n_in, out, err, errlen);
}

/* num_parameters of nn.PReLU's slopes or of scale_shift's weights: one for
 * every channel, or one per channel of a map, feature of flat features or
 * (scale_shift) token channel; prelu's row refuses token sequences
 * (no_tokens). */
static int num_parameters_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (L->num_parameters == 0)
        L->num_parameters = 1; /* a layer built field by field */
    if (L->num_parameters != 1 && L->num_parameters != in->c) {
        sf_errf(err, errlen, "\"num_parameters\" %d must be 1 or the input's %d channels", L->num_parameters,
                in->c);
        return -1;
    }
    *out = in[0];
    return 0;
}

/* PyTorch's own rules: a value only with mode constant; reflect needs each
 * pad below its axis's size (the mirror leaves out the edge), circular at
 * most its size (one wrap). */
static int pad_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    const int *p = L->pads;
    if (L->mode != SF_PAD_CONSTANT && L->pad_value != 0.f) {
        sf_errf(err, errlen, "\"value\" applies to mode \"constant\" only (PyTorch refuses a value with another mode)");
        return -1;
    }
    const int strict = L->mode == SF_PAD_REFLECT;
    if (L->mode == SF_PAD_REFLECT || L->mode == SF_PAD_CIRCULAR)
        for (int j = 0; j < 4; j++) {
            const int dim = j < 2 ? in->w : in->h;
            if (strict ? p[j] >= dim : p[j] > dim) {
                sf_errf(err, errlen, "\"pad\" [%d, %d, %d, %d]: mode \"%s\" needs each pad %s the input's %s %d",
                        p[0], p[1], p[2], p[3], strict ? "reflect" : "circular", strict ? "below" : "at most",
                        j < 2 ? "width" : "height", dim);
                return -1;
            }
        }
    const long oh = (long)in->h + p[2] + p[3], ow = (long)in->w + p[0] + p[1];
    if (oh > SF_MAX_SPATIAL || ow > SF_MAX_SPATIAL || (size_t)in->c * (size_t)oh * (size_t)ow > SF_MAX_ACT) {
        sf_errf(err, errlen, "the output is a %ldx%ld map of %d channels (at most %d a side, %zu values)", oh, ow,
                in->c, SF_MAX_SPATIAL, (size_t)SF_MAX_ACT);
        return -1;
    }
    *out = (sf_shape){in->c, (int)oh, (int)ow, 0, 0};
    return 0;
}

/* Kernel, stride and padding of a convolution or pooling layer. */
static int check_window(const sf_layer *L, char *err, size_t errlen)
{
    if (L->k < 1 || L->k > SF_MAX_KERNEL || L->stride < 1 || L->stride > SF_MAX_KERNEL || L->pad < 0 ||
        L->pad > SF_MAX_KERNEL) {
        sf_errf(err, errlen, "k=%d stride=%d pad=%d out of range (k,stride in [1,%d], pad in [0,%d])", L->k,
                L->stride, L->pad, SF_MAX_KERNEL, SF_MAX_KERNEL);
        return -1;
    }
    return 0;
}

static int check_out_c(const sf_layer *L, const char *what, char *err, size_t errlen)
{
    if (L->out_c < 1 || L->out_c > SF_MAX_CHANNELS) {
        sf_errf(err, errlen, "out %s %d out of range [1,%d]", what, L->out_c, SF_MAX_CHANNELS);
        return -1;
    }
    return 0;
}

static int conv2d_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (L->groups == 0)
        L->groups = 1;
    if (L->dilation == 0)
        L->dilation = 1;
    /* A layer built field by field (the presets, the tests) sets the
     * height's values only: its window is square. A spec's kernel always has
     * a width, so kw 0 tells the two apart (a width's padding may be 0). */
    if (L->kw == 0) {
        L->kw = L->k;
        L->pad_w = L->pad;
    }
    if (L->stride_w == 0)
        L->stride_w = L->stride;
    if (L->dilation_w == 0)
        L->dilation_w = L->dilation;
    if (check_out_c(L, "channels", err, errlen) || check_window(L, err, errlen))
        return -1;
    if (L->kw < 1 || L->kw > SF_MAX_KERNEL || L->stride_w < 1 || L->stride_w > SF_MAX_KERNEL || L->pad_w < 0 ||
        L->pad_w > SF_MAX_KERNEL) {
        sf_errf(err, errlen, "k=[%d,%d] stride=[%d,%d] pad=[%d,%d] out of range (k,stride in [1,%d], pad in [0,%d])",
                L->k, L->kw, L->stride, L->stride_w, L->pad, L->pad_w, SF_MAX_KERNEL, SF_MAX_KERNEL);
        return -1;
    }
    if (L->groups < 1 || L->dilation < 1 || L->dilation > SF_MAX_KERNEL || L->dilation_w < 1 ||
        L->dilation_w > SF_MAX_KERNEL || in->c % L->groups || L->out_c % L->groups) {
        sf_errf(err, errlen, "groups %d must divide in %d and out %d, dilation [%d,%d] in [1,%d]", L->groups, in->c,
                L->out_c, L->dilation, L->dilation_w, SF_MAX_KERNEL);
        return -1;
    }
    const int eh = in->h + 2 * L->pad - (L->dilation * (L->k - 1) + 1);
    const int ew = in->w + 2 * L->pad_w - (L->dilation_w * (L->kw - 1) + 1);
    if (eh < 0 || ew < 0) {
        sf_errf(err, errlen, "kernel [%d,%d] (dilation [%d,%d]) does not fit the %dx%d input (pad [%d,%d])", L->k,
                L->kw, L->dilation, L->dilation_w, in->h, in->w, L->pad, L->pad_w);
        return -1;
    }
    *out = (sf_shape){L->out_c, eh / L->stride + 1, ew / L->stride_w + 1, 0, 0};
    return 0;
}

static int convt2d_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (check_out_c(L, "channels", err, errlen) || check_window(L, err, errlen))
        return -1;
    const long oh = (long)(in->h - 1) * L->stride - 2L * L->pad + L->k;
    const long ow = (long)(in->w - 1) * L->stride - 2L * L->pad + L->k;
    if (oh < 1 || ow < 1 || oh > SF_MAX_SPATIAL || ow > SF_MAX_SPATIAL) {
        sf_errf(err, errlen, "output %ldx%ld out of range [1,%d]", oh, ow, SF_MAX_SPATIAL);
        return -1;
    }
    *out = (sf_shape){L->out_c, (int)oh, (int)ow, 0, 0};
    return 0;
}

static int linear_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (L->over_channels) {
        if (in->flat || in->tokens) {
            sf_errf(err, errlen, "\"over\":\"channels\" needs a [C,H,W] map; the input is %s",
                    in->flat ? "flattened" : "a token sequence (a linear layer applies to each token by default)");
            return -1;
        }
        if (check_out_c(L, "features", err, errlen))
            return -1;
        *out = (sf_shape){L->out_c, in->h, in->w, 0, 0};
        return 0;
    }
    if (check_out_c(L, "features", err, errlen))
        return -1;
    if (in->tokens) {
        /* As nn.Linear on [N, T, C]: over the last dimension, token by token. */
        *out = (sf_shape){L->out_c, in->h, 1, 0, 1};
        return 0;
    }
    if (!in->flat && (in->h != 1 || in->w != 1)) {
        sf_errf(err, errlen, "input is [%d,%d,%d]; add a flatten layer before linear", in->c, in->h, in->w);
        return -1;
    }
    *out = (sf_shape){L->out_c, 1, 1, 1, 0};
    return 0;
}

/* Over the features of a flat tensor only: F.log_softmax(x, dim=1) of a
 * classifier's [N, F] logits (a map's dim 1 would be per pixel over
 * channels, which no model here needs). */
static int log_softmax_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (!in->flat) {
        sf_errf(err, errlen, "log_softmax applies over the features of a flat tensor (dim 1 of [N, F]); the input "
                "is %s (flatten it first)", in->tokens ? "a token sequence" : "a [C,H,W] map");
        return -1;
    }
    *out = in[0];
    return 0;
}

static int flatten_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    const size_t feat = (size_t)in->c * in->h * in->w;
    if (feat > SF_MAX_ACT) {
        sf_errf(err, errlen, "%zu features is too many", feat);
        return -1;
    }
    *out = (sf_shape){(int)feat, 1, 1, 1, 0};
    return 0;
}

/* A [C,H,W] map (nn.BatchNorm2d) or a flat [F] tensor, its features as
 * channels of 1x1 (nn.BatchNorm1d on [N, F]); not a token sequence
 * (no_tokens: nn.BatchNorm1d there normalises over tokens). */
static int bn2d_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (L->eps == 0.0f)
        L->eps = SF_BN_EPS;
    if (L->momentum == 0.0f)
        L->momentum = SF_BN_MOMENTUM;
    L->bias = 1;
    L->out_c = in->c;
    *out = in[0];
    return 0;
}

static int maxpool2d_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err,
                           size_t errlen)
{
    if (L->stride == 0)
        L->stride = L->k; /* PyTorch: the stride defaults to the kernel size */
    if (check_window(L, err, errlen))
        return -1;
    if (2 * L->pad > L->k) {
        sf_errf(err, errlen, "pad %d must be at most half of k=%d", L->pad, L->k);
        return -1;
    }
    const int oh = sf_pool_out_size(in->h, L->k, L->stride, L->pad, L->ceil_mode);
    const int ow = sf_pool_out_size(in->w, L->k, L->stride, L->pad, L->ceil_mode);
    if (oh < 1 || ow < 1) {
        sf_errf(err, errlen, "kernel %d does not fit the %dx%d input (pad %d)", L->k, in->h, in->w, L->pad);
        return -1;
    }
    *out = (sf_shape){in->c, oh, ow, 0, 0};
    return 0;
}

static int gap_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    L->out_c = in->c;
    *out = (sf_shape){in->c, 1, 1, 0, 0};
    return 0;
}

static int add_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (in[1].c != in[0].c || in[1].h != in[0].h || in[1].w != in[0].w || in[1].tokens != in[0].tokens) {
        sf_errf(err, errlen, "inputs have shapes [%d,%d,%d]%s and [%d,%d,%d]%s", in[0].c, in[0].h, in[0].w,
                in[0].tokens ? " (tokens)" : "", in[1].c, in[1].h, in[1].w, in[1].tokens ? " (tokens)" : "");
        return -1;
    }
    L->out_c = in->c;
    *out = in[0];
    return 0;
}

static int avgpool2d_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err,
                           size_t errlen)
{
    return maxpool2d_shape(L, in, n_in, out, err, errlen); /* the same window rules */
}

static int adaptive_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (L->out_size[0] < 1 || L->out_size[1] < 1 || L->out_size[0] > SF_MAX_SPATIAL || L->out_size[1] > SF_MAX_SPATIAL) {
        sf_errf(err, errlen, "output %dx%d out of range [1,%d]", L->out_size[0], L->out_size[1], SF_MAX_SPATIAL);
        return -1;
    }
    *out = (sf_shape){in->c, L->out_size[0], L->out_size[1], 0, 0};
    return 0;
}

static int ln2d_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (L->eps == 0.0f)
        L->eps = 1e-5f;
    *out = in[0];
    return 0;
}

/* By scale (each side times it) or by size, not both; align_corners only
 * where PyTorch takes it (bilinear). A size may shrink a side, as
 * F.interpolate's may. */
static int upsample_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    const int sized = L->out_size[0] > 0;
    if (sized == (L->scale > 0)) {
        sf_errf(err, errlen, "give \"scale\" or \"size\", one of them");
        return -1;
    }
    if (L->align_corners && L->mode != SF_UP_BILINEAR) {
        sf_errf(err, errlen, "\"align_corners\" applies to mode \"bilinear\" only (PyTorch refuses it for "
                "\"nearest\")");
        return -1;
    }
    const long oh = sized ? L->out_size[0] : (long)in->h * L->scale;
    const long ow = sized ? L->out_size[1] : (long)in->w * L->scale;
    if (oh > SF_MAX_SPATIAL || ow > SF_MAX_SPATIAL || (size_t)in->c * (size_t)oh * (size_t)ow > SF_MAX_ACT) {
        sf_errf(err, errlen, "the output is a %ldx%ld map of %d channels (at most %d a side, %zu values)", oh, ow,
                in->c, SF_MAX_SPATIAL, (size_t)SF_MAX_ACT);
        return -1;
    }
    *out = (sf_shape){in->c, (int)oh, (int)ow, 0, 0};
    return 0;
}

sf_up_rule sf_layer_up_rule(const sf_layer *L)
{
    return sf_up_rule_of(L->mode == SF_UP_BILINEAR, L->align_corners, L->in_h, L->in_w, L->out_h, L->out_w);
}

/* A [C,H,W] map or flat [C] features (nn.GroupNorm takes [N, C, *]; no_tokens). */
static int gn_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (L->groups < 1 || in->c % L->groups) {
        sf_errf(err, errlen, "num_groups %d must divide the %d channels", L->groups, in->c);
        return -1;
    }
    *out = in[0];
    return 0;
}

/* A flat [F] tensor, a [F,1,1] map (a pooled one not yet flattened), or
 * each token of a token sequence [T, F] (nn.LayerNorm over the last dimension). */
static int ln_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (!in->flat && !in->tokens && (in->h != 1 || in->w != 1)) {
        sf_errf(err, errlen, "input is [%d,%d,%d]; layernorm normalises flat features (layernorm2d a map's "
                "channels)", in->c, in->h, in->w);
        return -1;
    }
    return ln2d_shape(L, in, n_in, out, err, errlen);
}

static int mul_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    const sf_shape *a = &in[0], *b = &in[1];
    const int same = b->c == a->c && b->h == a->h && b->w == a->w && b->flat == a->flat && b->tokens == a->tokens;
    const int bcast = b->c == a->c && b->h == 1 && b->w == 1 && !a->flat && !b->flat && !a->tokens && !b->tokens;
    if (!same && !bcast) {
        sf_errf(err, errlen, "inputs have shapes [%d,%d,%d] and [%d,%d,%d]; the second must be the first's "
                "shape or [%d,1,1]", a->c, a->h, a->w, b->c, b->h, b->w, a->c);
        return -1;
    }
    *out = *a;
    return 0;
}

static int concat_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    long c = 0;
    for (int j = 0; j < n_in; j++) {
        if (in[j].tokens) {
            sf_errf(err, errlen, "input %d is a token sequence; concat joins maps or features along channels", j);
            return -1;
        }
        if (in[j].h != in[0].h || in[j].w != in[0].w || in[j].flat != in[0].flat) {
            sf_errf(err, errlen, "input %d is [%d,%d,%d] but input 0 is [%d,%d,%d]; concat needs equal H,W", j,
                    in[j].c, in[j].h, in[j].w, in[0].c, in[0].h, in[0].w);
            return -1;
        }
        c += in[j].c;
    }
    if (c > (long)SF_MAX_ACT) {
        sf_errf(err, errlen, "%ld channels is too many", c);
        return -1;
    }
    *out = (sf_shape){(int)c, in[0].h, in[0].w, in[0].flat, 0};
    return 0;
}

/* The input of a kind that reads a token sequence. */
static int need_tokens(const sf_shape *in, const char *hint, char *err, size_t errlen)
{
    if (!in->tokens) {
        sf_errf(err, errlen, "input is [%d,%d,%d]%s, not a token sequence [T, C]; %s", in->c, in->h, in->w,
                in->flat ? " (flat)" : "", hint);
        return -1;
    }
    return 0;
}

/* torchvision's patch embedding: conv_proj's [C, n_h, n_w] output as
 * x.reshape(n, C, n_h * n_w).permute(0, 2, 1), n_h * n_w tokens of C. */
static int to_tokens_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if ((long)in->h * in->w > SF_MAX_SPATIAL) {
        sf_errf(err, errlen, "%dx%d = %ld tokens is too many (at most %d)", in->h, in->w, (long)in->h * in->w,
                SF_MAX_SPATIAL);
        return -1;
    }
    L->out_c = in->c;
    *out = (sf_shape){in->c, in->h * in->w, 1, 0, 1};
    return 0;
}

/* A token sequence [h*w, C] as the map [C, h, w] it was made from. */
static int to_map_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (need_tokens(in, "to_map turns a token sequence back into a map", err, errlen))
        return -1;
    if ((long)L->out_size[0] * L->out_size[1] != in->h) {
        sf_errf(err, errlen, "size [%d, %d] holds %ld tokens; the input has %d", L->out_size[0], L->out_size[1],
                (long)L->out_size[0] * L->out_size[1], in->h);
        return -1;
    }
    L->out_c = in->c;
    *out = (sf_shape){in->c, L->out_size[0], L->out_size[1], 0, 0};
    return 0;
}

static int class_token_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (need_tokens(in, "to_tokens makes one", err, errlen))
        return -1;
    if (in->h + 1 > SF_MAX_SPATIAL) {
        sf_errf(err, errlen, "%d tokens is too many (at most %d)", in->h + 1, SF_MAX_SPATIAL);
        return -1;
    }
    L->out_c = in->c;
    *out = (sf_shape){in->c, in->h + 1, 1, 0, 1};
    return 0;
}

static int tokens_same_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (need_tokens(in, "to_tokens makes one", err, errlen))
        return -1;
    L->out_c = in->c;
    *out = in[0];
    return 0;
}

static int attention_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (need_tokens(in, "to_tokens makes one", err, errlen))
        return -1;
    if (L->heads < 1 || in->c % L->heads) {
        sf_errf(err, errlen, "num_heads %d must divide embed_dim %d", L->heads, in->c);
        return -1;
    }
    if (L->p != 0.0f) {
        sf_errf(err, errlen, "dropout %g on the attention weights is not supported (0 only)", (double)L->p);
        return -1;
    }
    L->out_c = in->c;
    *out = in[0];
    return 0;
}

static int select_token_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (need_tokens(in, "select_token ends a token sequence", err, errlen))
        return -1;
    L->out_c = in->c;
    *out = (sf_shape){in->c, 1, 1, 1, 0};
    return 0;
}

/* [T, C] tokens as [C, T]: C tokens of T features, so that a linear layer
 * mixes the tokens (MLP-Mixer). */
static int transpose_tokens_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err,
                                  size_t errlen)
{
    if (need_tokens(in, "transpose_tokens swaps a token sequence's two dimensions", err, errlen))
        return -1;
    if (in->c > SF_MAX_SPATIAL) {
        sf_errf(err, errlen, "%d features become %d tokens, too many (at most %d)", in->c, in->c, SF_MAX_SPATIAL);
        return -1;
    }
    L->out_c = in->h;
    *out = (sf_shape){in->h, in->c, 1, 0, 1};
    return 0;
}

/* A pooled map [C,1,1] or flat features [F]: both hold a sample's C values
 * in a row in either layout, which the convolution runs along. */
static int channel_conv1d_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (in->tokens || (!in->flat && (in->h != 1 || in->w != 1))) {
        sf_errf(err, errlen, "the input is [%d,%d,%d]%s; channel_conv1d runs across the channels of a [C,1,1] map "
                "or of flat features", in->c, in->h, in->w, in->tokens ? " tokens" : "");
        return -1;
    }
    if (L->k != 2 * L->pad + 1) {
        sf_errf(err, errlen, "k %d and pad %d: k must be 2 * pad + 1, so that the output keeps the input's %d "
                "channels", L->k, L->pad, in->c);
        return -1;
    }
    *out = in[0];
    return 0;
}

static int token_mean_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (need_tokens(in, "token_mean averages a token sequence", err, errlen))
        return -1;
    if (L->start >= in->h) {
        sf_errf(err, errlen, "start %d leaves none of the %d tokens to average", L->start, in->h);
        return -1;
    }
    L->out_c = in->c;
    *out = (sf_shape){in->c, 1, 1, 1, 0};
    return 0;
}

/* A channel scale of a map or of each token; flat features have no layout
 * it was written for (a Linear's output scales by a [F] vector with mul). */
static int layer_scale_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (in->flat) {
        sf_errf(err, errlen, "input is flat features [%d]; layer_scale scales the channels of a [C,H,W] map or of "
                "each token of a token sequence", in->c);
        return -1;
    }
    *out = in[0];
    return 0;
}

static int shuffle_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (L->groups < 1 || in->c % L->groups) {
        sf_errf(err, errlen, "groups %d must divide the input's %d channels", L->groups, in->c);
        return -1;
    }
    *out = in[0];
    return 0;
}

static int pixel_shuffle_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err,
                               size_t errlen)
{
    const int r = L->scale, rr = r * r;
    if (r < 1 || in->c % rr) {
        sf_errf(err, errlen, "factor %d: its square must divide the input's %d channels", r, in->c);
        return -1;
    }
    const long oh = (long)in->h * r, ow = (long)in->w * r;
    if (oh > SF_MAX_SPATIAL || ow > SF_MAX_SPATIAL) {
        sf_errf(err, errlen, "the output is a %ldx%ld map (at most %d a side)", oh, ow, SF_MAX_SPATIAL);
        return -1;
    }
    *out = (sf_shape){in->c / rr, (int)oh, (int)ow, 0, 0};
    return 0;
}

static int pixel_unshuffle_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err,
                                 size_t errlen)
{
    const int r = L->scale;
    if (r < 1 || in->h % r || in->w % r) {
        sf_errf(err, errlen, "factor %d must divide the input's height %d and width %d", r, in->h, in->w);
        return -1;
    }
    if ((long)in->c * r * r > SF_MAX_CHANNELS) {
        sf_errf(err, errlen, "the output has %ld channels (at most %d)", (long)in->c * r * r, SF_MAX_CHANNELS);
        return -1;
    }
    *out = (sf_shape){in->c * r * r, in->h / r, in->w / r, 0, 0};
    return 0;
}

static int slice_shape(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen)
{
    if (L->start < 0 || L->count < 1 || (long)L->start + L->count > in->c) {
        sf_errf(err, errlen, "channels [%d, %ld) are not within the input's %d", L->start,
                (long)L->start + L->count, in->c);
        return -1;
    }
    *out = (sf_shape){L->count, in->h, in->w, 0, 0};
    return 0;
}

/* ---- parameters ---------------------------------------------------------------- */

static void pd_set(sf_param_desc *p, const char *suffix, int ndim, int64_t a, int64_t b, int64_t c, int64_t d)
{
    p->suffix = suffix;
    p->ndim = ndim;
    p->shape[0] = a, p->shape[1] = b, p->shape[2] = c, p->shape[3] = d;
}

static int conv2d_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS])
{
    pd_set(&pd[0], "weight", 4, L->out_c, L->in_c / (L->groups > 1 ? L->groups : 1), L->k, L->kw);
    pd_set(&pd[1], "bias", 1, L->out_c, 0, 0, 0);
    return L->bias ? 2 : 1;
}

/* PyTorch's ConvTranspose2d weight is [in, out, k, k]. */
static int convt2d_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS])
{
    pd_set(&pd[0], "weight", 4, L->in_c, L->out_c, L->k, L->k);
    pd_set(&pd[1], "bias", 1, L->out_c, 0, 0, 0);
    return L->bias ? 2 : 1;
}

static int linear_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS])
{
    pd_set(&pd[0], "weight", 2, L->out_c, L->in_c, 0, 0);
    pd_set(&pd[1], "bias", 1, L->out_c, 0, 0, 0);
    return L->bias ? 2 : 1;
}

/* weight (gamma) and bias (beta), [C] each. */
static int affine_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS])
{
    pd_set(&pd[0], "weight", 1, L->out_ch, 0, 0, 0);
    pd_set(&pd[1], "bias", 1, L->out_ch, 0, 0, 0);
    return 2;
}

/* layernorm, layernorm2d: weight [C], and bias [C] unless the layer leaves it out. */
static int ln_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS])
{
    return affine_params(L, pd) - !L->bias;
}

/* groupnorm: as layernorm's where affine, none without (nn.GroupNorm's
 * state_dict then holds nothing for the layer). */
static int gn_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS])
{
    return L->affine ? ln_params(L, pd) : 0;
}

/* ConvNeXt's CNBlock.layer_scale, [C,1,1]. */
static int layer_scale_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS])
{
    if (L->vector || L->tokens)
        pd_set(&pd[0], "layer_scale", 1, L->out_ch, 0, 0, 0);
    else
        pd_set(&pd[0], "layer_scale", 3, L->out_ch, 1, 1, 0);
    return 1;
}

/* nn.PReLU.weight [num_parameters]. */
static int prelu_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS])
{
    pd_set(&pd[0], "weight", 1, L->num_parameters, 0, 0, 0);
    return 1;
}

/* weight and bias, each num_parameters values held in param_shape's
 * dimensions (SF_SS_*: [C], [C,1,1], [1,1,C], [1,C,1,1]). */
static int scale_shift_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS])
{
    const int64_t c = L->num_parameters, d[4][4] = {{c, 0, 0, 0}, {c, 1, 1, 0}, {1, 1, c, 0}, {1, c, 1, 1}};
    const int ndim[4] = {1, 3, 3, 4}, m = L->mode;
    for (int j = 0; j < 1 + (L->bias != 0); j++)
        pd_set(&pd[j], j ? "bias" : "weight", ndim[m], d[m][0], d[m][1], d[m][2], d[m][3]);
    return 1 + (L->bias != 0);
}

/* nn.Conv1d(1, 1, k): weight [1, 1, k], bias [1]. */
static int channel_conv1d_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS])
{
    pd_set(&pd[0], "weight", 3, 1, 1, L->k, 0);
    pd_set(&pd[1], "bias", 1, 1, 0, 0, 0);
    return L->bias ? 2 : 1;
}

/* VisionTransformer.class_token [1,1,C], keyed by the layer's name. */
static int class_token_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS])
{
    pd_set(&pd[0], "", 3, 1, 1, L->out_ch, 0);
    return 1;
}

/* torchvision's Encoder.pos_embedding [1,T,C], keyed by the layer's name. */
static int pos_embedding_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS])
{
    pd_set(&pd[0], "", 3, 1, L->out_h, L->out_ch, 0);
    return 1;
}

/* nn.MultiheadAttention with one embedding dimension and biases, in its
 * state_dict order; with separate_qkv, q, k and v as three weights then
 * three biases (sf_attn_slot says why that order). */
static int attention_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS])
{
    static const char *const w3[3] = {"q_proj.weight", "k_proj.weight", "v_proj.weight"};
    static const char *const b3[3] = {"q_proj.bias", "k_proj.bias", "v_proj.bias"};
    const int64_t c = L->in_c;
    const int nw = L->qkv_split ? 3 : 1;
    for (int k = 0; k < nw; k++) {
        pd_set(&pd[sf_attn_slot(L, 0, 0) + k], L->qkv_split ? w3[k] : "in_proj_weight", 2, L->qkv_split ? c : 3 * c,
               c, 0, 0);
        if (L->bias)
            pd_set(&pd[sf_attn_slot(L, 0, 1) + k], L->qkv_split ? b3[k] : "in_proj_bias", 1,
                   L->qkv_split ? c : 3 * c, 0, 0, 0);
    }
    pd_set(&pd[sf_attn_slot(L, 1, 0)], "out_proj.weight", 2, c, c, 0, 0);
    if (L->out_bias)
        pd_set(&pd[sf_attn_slot(L, 1, 1)], "out_proj.bias", 1, c, 0, 0, 0);
    return sf_attn_slot(L, 1, 0) + 1 + (L->out_bias != 0);
}

static const char *const bn_buffers[] = {"running_mean", "running_var", NULL};

/* ---- the table ------------------------------------------------------------------ */

static const sf_layer_kind_info kinds[SF_L_KIND_COUNT] = {
    [SF_L_CONV2D] = {
        .name = "conv2d", .torch = "nn.Conv2d", .min_in = 1, .max_in = 1, .needs_map = 1,
        .fields = conv2d_fields, .shape = conv2d_shape, .params = conv2d_params, .init = sf_init_conv2d,
        .ref_fwd = sf_ref_layer_conv2d_fwd, .ref_bwd = sf_ref_layer_conv2d_bwd,
        .bf16_weights = 1, .bf16_wgrad = 1, .cuda = 1,
        .doc = "2-D convolution, grouped (depthwise) and dilated, square or [h, w] windows; weight "
               "[out, in/groups, kh, kw]"},
    [SF_L_RELU] = {
        .name = "relu", .torch = "nn.ReLU", .min_in = 1, .max_in = 1, .fields = no_fields,
        .shape = same_shape, .ref_fwd = sf_ref_layer_relu_fwd, .ref_bwd = sf_ref_layer_relu_bwd, .cuda = 1,
        .cuda_tokens = 1, .doc = "max(x, 0)"},
    [SF_L_FLATTEN] = {
        .name = "flatten", .torch = "nn.Flatten", .min_in = 1, .max_in = 1, .fields = no_fields,
        .shape = flatten_shape, .view = 1, .cuda = 1,
        .doc = "[C,H,W] to [C*H*W] features (a view, no copy)"},
    [SF_L_LINEAR] = {
        .name = "linear", .torch = "nn.Linear", .min_in = 1, .max_in = 1, .fields = linear_fields,
        .shape = linear_shape, .params = linear_params, .init = sf_init_linear,
        .ref_fwd = sf_ref_layer_linear_fwd, .ref_bwd = sf_ref_layer_linear_bwd, .bf16_weights = 1, .cuda = 1,
        .cuda_tokens = 1,
        .doc = "fully connected layer over flat features, or per pixel over a map's channels; weight [out, in]"},
    [SF_L_CONV_TRANSPOSE2D] = {
        .name = "conv_transpose2d", .torch = "nn.ConvTranspose2d", .min_in = 1, .max_in = 1, .needs_map = 1,
        .fields = convt2d_fields, .shape = convt2d_shape, .params = convt2d_params, .init = sf_init_convt2d,
        .ref_fwd = sf_ref_layer_convt2d_fwd, .ref_bwd = sf_ref_layer_convt2d_bwd,
        .bf16_weights = 1, .bf16_wgrad = 1, .cuda = 1,
        .doc = "transposed 2-D convolution; weight [in, out, k, k]"},
    [SF_L_BATCHNORM2D] = {
        .name = "batchnorm2d", .torch = "nn.BatchNorm2d, nn.BatchNorm1d", .min_in = 1, .max_in = 1, .no_tokens = 1,
        .fields = bn2d_fields, .shape = bn2d_shape, .params = affine_params, .buffers = bn_buffers,
        .init = sf_init_ones_zeros, .ref_fwd = sf_ref_layer_bn2d_fwd, .ref_bwd = sf_ref_layer_bn2d_bwd,
        .ref_save = sf_ref_layer_bn2d_save, .cuda = 1,
        .doc = "batch normalisation per channel of a map, or per feature of flat features (nn.BatchNorm1d on "
               "[N, F]); running statistics as buffers"},
    [SF_L_MAXPOOL2D] = {
        .name = "maxpool2d", .torch = "nn.MaxPool2d", .min_in = 1, .max_in = 1, .needs_map = 1,
        .fields = maxpool2d_fields, .shape = maxpool2d_shape, .ref_fwd = sf_ref_layer_maxpool2d_fwd,
        .ref_bwd = sf_ref_layer_maxpool2d_bwd, .ref_save = sf_ref_layer_maxpool2d_save, .cuda = 1,
        .doc = "max pooling; padding never wins"},
    [SF_L_GLOBAL_AVGPOOL] = {
        .name = "global_avgpool", .torch = "nn.AdaptiveAvgPool2d(1)", .min_in = 1, .max_in = 1,
        .needs_map = 1, .fields = no_fields, .shape = gap_shape, .ref_fwd = sf_ref_layer_gap_fwd,
        .ref_bwd = sf_ref_layer_gap_bwd, .cuda = 1,
        .doc = "mean over H and W: [C,H,W] to [C,1,1]"},
    [SF_L_ADD] = {
        .name = "add", .torch = "a + b", .min_in = 2, .max_in = 2, .fields = no_fields, .shape = add_shape,
        .ref_fwd = sf_ref_layer_add_fwd, .ref_bwd = sf_ref_layer_add_bwd, .cuda = 1, .cuda_tokens = 1,
        .doc = "elementwise sum of two inputs of one shape (residual connections)"},
#define ACT_ROW(kind, nm, tch, flds, shp, tok, what)                                                       \
    [kind] = {.name = nm, .torch = tch, .min_in = 1, .max_in = 1, .fields = flds, .shape = shp,             \
              .ref_fwd = sf_ref_layer_act_fwd, .ref_bwd = sf_ref_layer_act_bwd, .cuda = 1, .cuda_tokens = tok, \
              .doc = what}
#define ACT(kind, nm, tch, flds, tok, what) ACT_ROW(kind, nm, tch, flds, same_shape, tok, what)
    ACT(SF_L_RELU6, "relu6", "nn.ReLU6", no_fields, 0, "min(max(x, 0), 6)"),
    ACT(SF_L_SIGMOID, "sigmoid", "nn.Sigmoid", no_fields, 0, "1 / (1 + exp(-x))"),
    ACT(SF_L_SILU, "silu", "nn.SiLU", no_fields, 0, "x * sigmoid(x)"),
    ACT(SF_L_HARDSWISH, "hardswish", "nn.Hardswish", no_fields, 0, "x * relu6(x + 3) / 6"),
    ACT(SF_L_HARDSIGMOID, "hardsigmoid", "nn.Hardsigmoid", no_fields, 0, "relu6(x + 3) / 6"),
    ACT(SF_L_GELU, "gelu", "nn.GELU", gelu_fields, 1, "x * Phi(x), exact (erf) or the tanh approximation"),
    ACT(SF_L_TANH, "tanh", "nn.Tanh", no_fields, 0, "tanh(x)"),
    ACT(SF_L_LEAKY_RELU, "leaky_relu", "nn.LeakyReLU", leaky_relu_fields, 0,
        "x for x > 0, else negative_slope * x (the gradient at 0 is negative_slope, as PyTorch's)"),
    ACT(SF_L_ELU, "elu", "nn.ELU", elu_fields, 0,
        "x for x > 0, else alpha * (exp(x) - 1) (the gradient at 0 is alpha, as PyTorch's)"),
    ACT(SF_L_SELU, "selu", "nn.SELU", no_fields, 0,
        "scale * elu(x) at PyTorch's alpha 1.6732632423543772 and scale 1.0507009873554805"),
    ACT_ROW(SF_L_SOFTPLUS, "softplus", "nn.Softplus", softplus_fields, softplus_shape, 0,
            "log1p(exp(beta * x)) / beta, and x where beta * x > threshold"),
    ACT(SF_L_MISH, "mish", "nn.Mish", no_fields, 0, "x * tanh(softplus(x))"),
#undef ACT
#undef ACT_ROW
    /* Elementwise like the activations (their hooks and kernels, SF_ACT_AFFINE),
     * but its backward reads no input. */
    [SF_L_AFFINE] = {
        .name = "affine", .torch = "x * scale + shift", .min_in = 1, .max_in = 1, .fields = affine_fields,
        .shape = same_shape, .ref_fwd = sf_ref_layer_act_fwd, .ref_bwd = sf_ref_layer_act_bwd, .cuda = 1,
        .cuda_tokens = 1,
        .doc = "scale * x + shift elementwise, on maps, features or tokens: the exporter's one layer for a chain "
               "of arithmetic with numbers on a tensor (x * c, x / c, x + c, c - x, -x, as (x - 0.5) / 0.5); "
               "the gradient is scale * dy"},
    /* Elementwise on the activations' hooks and kernels (SF_ACT_CLAMP). */
    [SF_L_CLAMP] = {
        .name = "clamp", .torch = "torch.clamp, nn.Hardtanh", .min_in = 1, .max_in = 1, .fields = clamp_fields,
        .shape = clamp_shape, .ref_fwd = sf_ref_layer_act_fwd, .ref_bwd = sf_ref_layer_act_bwd, .cuda = 1,
        .cuda_tokens = 1,
        .doc = "min(max(x, min), max) elementwise (a NaN stays NaN), on maps, features or tokens: the "
               "exporter's layer for torch.clamp, clip, clamp_min, clamp_max, nn.Hardtanh and F.hardtanh at "
               "bounds other than ReLU's and ReLU6's; the gradient is dy strictly between the bounds, 0 at or "
               "beyond one (at a bound too under \"clamp_closed\", torch.clamp's rule before torch 2.15)"},
    /* On the activations' hooks and kernels (SF_ACT_SQUARE, SF_CUDA_ACT_SQUARE). */
    [SF_L_SQUARE] = {
        .name = "square", .torch = "torch.square, x ** 2", .min_in = 1, .max_in = 1, .fields = no_fields,
        .shape = same_shape, .ref_fwd = sf_ref_layer_act_fwd, .ref_bwd = sf_ref_layer_act_bwd, .cuda = 1,
        .cuda_tokens = 1,
        .doc = "x * x elementwise, on maps, features or tokens (timm's StarReLU is relu, square, then a "
               "one-value scale_shift; its SquaredReLU relu, square); the gradient is 2 * x * dy"},
    [SF_L_TO_MAP] = {
        .name = "to_map", .torch = "x.transpose(1, 2).reshape(n, C, h, w) of tokens [N, h * w, C]", .min_in = 1,
        .max_in = 1, .fields = to_map_fields, .shape = to_map_shape, .ref_fwd = sf_ref_layer_to_map_fwd,
        .ref_bwd = sf_ref_layer_to_map_bwd, .cuda = 1, .cuda_tokens = 1,
        .doc = "a token sequence [h * w, C] as the [C, h, w] map it was made from, the inverse of to_tokens "
               "(CAFormer's attention over a channels-last map: x.reshape(B, H * W, C), attention, then "
               "reshape(B, H, W, C) back)"},
    /* Its CUDA kernels (gpu/cuda/grn.cu, tests/gpu/ops/grn.cu) and the
     * executor's hooks are written, but the row says cuda 0 until they have
     * passed on a GPU: the CUDA backend refuses the layer by name, pointing
     * at pipeline.backend=ref. */
    [SF_L_GRN] = {
        .name = "grn", .torch = "timm's GlobalResponseNorm (ConvNeXt V2's GRN)", .min_in = 1, .max_in = 1,
        .needs_map = 1, .fields = grn_fields, .shape = same_shape, .params = affine_params, .init = sf_init_zeros,
        .ref_fwd = sf_ref_layer_grn_fwd, .ref_bwd = sf_ref_layer_grn_bwd,
        .doc = "per sample, each channel's L2 norm over the positions g, divided by the channels' mean of it "
               "plus eps (nx); x + weight * x * nx + bias; weight, bias [C] (zeros at the start, as timm's)"},
    [SF_L_MUL] = {
        .name = "mul", .torch = "a * b", .min_in = 2, .max_in = 2, .fields = no_fields, .shape = mul_shape,
        .ref_fwd = sf_ref_layer_mul_fwd, .ref_bwd = sf_ref_layer_mul_bwd, .cuda = 1,
        .doc = "elementwise product; b of a's shape or [C,1,1] broadcast over H,W (squeeze-and-excitation)"},
    [SF_L_LAYER_SCALE] = {
        .name = "layer_scale", .torch = "x * layer_scale (ConvNeXt CNBlock), x * gamma (timm's LayerScale)",
        .min_in = 1, .max_in = 1, .fields = layer_scale_fields, .shape = layer_scale_shape,
        .params = layer_scale_params, .init = sf_init_layer_scale, .ref_fwd = sf_ref_layer_layer_scale_fwd,
        .ref_bwd = sf_ref_layer_layer_scale_bwd, .cuda = 1, .cuda_tokens = 1,
        .doc = "per-channel scale of a map or of each token by a parameter <name>.layer_scale, [C,1,1] on a map "
               "(`vector`: [C]) and [C] on tokens (initialised to 1e-6; `param_names` keys it as the module does, "
               "`gamma`)"},
    [SF_L_PRELU] = {
        .name = "prelu", .torch = "nn.PReLU(num_parameters), F.prelu", .min_in = 1, .max_in = 1, .no_tokens = 1,
        .fields = prelu_fields, .shape = num_parameters_shape, .params = prelu_params, .init = sf_init_prelu,
        .ref_fwd = sf_ref_layer_prelu_fwd, .ref_bwd = sf_ref_layer_prelu_bwd, .cuda = 1,
        .doc = "x where x > 0, else a * x: one slope a for every channel, or one per channel of a map or feature "
               "of flat features; weight [num_parameters] (initialised to 0.25, nn.PReLU's init). As PyTorch's "
               "prelu_backward, x = 0 takes a * dy, and a's gradient sums x * dy where x is not positive"},
    [SF_L_PAD] = {
        .name = "pad", .torch = "nn.ZeroPad2d, nn.ConstantPad2d, nn.ReflectionPad2d, nn.ReplicationPad2d, "
        "nn.CircularPad2d, F.pad of the last two dimensions", .min_in = 1, .max_in = 1, .needs_map = 1,
        .fields = pad_fields, .shape = pad_shape, .ref_fwd = sf_ref_layer_pad_fwd, .ref_bwd = sf_ref_layer_pad_bwd,
        .cuda = 1,
        .doc = "[C, H, W] to [C, top + H + bottom, left + W + right], the border filled by the mode as F.pad "
               "fills it; the backward adds each output's gradient into the input it was read from (the "
               "constant border passes none)"},
    [SF_L_AVGPOOL2D] = {
        .name = "avgpool2d", .torch = "nn.AvgPool2d", .min_in = 1, .max_in = 1, .needs_map = 1,
        .fields = avgpool2d_fields, .shape = avgpool2d_shape, .ref_fwd = sf_ref_layer_avgpool2d_fwd,
        .ref_bwd = sf_ref_layer_avgpool2d_bwd, .cuda = 1, .doc = "average pooling"},
    [SF_L_ADAPTIVE_AVGPOOL2D] = {
        .name = "adaptive_avgpool2d", .torch = "nn.AdaptiveAvgPool2d((h, w))", .min_in = 1, .max_in = 1,
        .needs_map = 1, .fields = adaptive_fields, .shape = adaptive_shape,
        .ref_fwd = sf_ref_layer_adaptive_avgpool2d_fwd, .ref_bwd = sf_ref_layer_adaptive_avgpool2d_bwd, .cuda = 1,
        .doc = "average pooling to an output size, PyTorch's bins"},
    [SF_L_LAYERNORM2D] = {
        .name = "layernorm2d", .torch = "torchvision LayerNorm2d", .min_in = 1, .max_in = 1, .needs_map = 1,
        .fields = ln_fields, .shape = ln2d_shape, .params = ln_params, .init = sf_init_ones_zeros,
        .ref_fwd = sf_ref_layer_layernorm_fwd, .ref_bwd = sf_ref_layer_layernorm_bwd, .cuda = 1,
        .doc = "LayerNorm over the channels of each pixel; weight, bias [C] (`bias`: false leaves it out)"},
    [SF_L_LAYERNORM] = {
        .name = "layernorm", .torch = "nn.LayerNorm(F)", .min_in = 1, .max_in = 1, .fields = ln_fields,
        .shape = ln_shape, .params = ln_params, .init = sf_init_ones_zeros,
        .ref_fwd = sf_ref_layer_layernorm_fwd, .ref_bwd = sf_ref_layer_layernorm_bwd, .cuda = 1, .cuda_tokens = 1,
        .doc = "LayerNorm over the features of a flat tensor; weight, bias [F] (`bias`: false leaves it out)"},
    [SF_L_CONCAT] = {
        .name = "concat", .torch = "torch.cat(dim=1)", .min_in = 2, .max_in = SF_MAX_IN, .fields = no_fields,
        .shape = concat_shape, .ref_fwd = sf_ref_layer_concat_fwd, .ref_bwd = sf_ref_layer_concat_bwd,
        .cuda = 1, .doc = "concatenation along channels of inputs of equal H,W"},
    [SF_L_DROPOUT] = {
        .name = "dropout", .torch = "nn.Dropout", .min_in = 1, .max_in = 1, .fields = dropout_fields,
        .shape = same_shape, .ref_fwd = sf_ref_layer_dropout_fwd, .ref_bwd = sf_ref_layer_dropout_bwd,
        .cuda = 1, .cuda_tokens = 1,
        .doc = "training: zero elements with probability p, scale by 1/(1-p), from the service's seeded RNG; "
               "eval: identity"},
    [SF_L_STOCHASTIC_DEPTH] = {
        .name = "stochastic_depth", .torch = "torchvision StochasticDepth(p, \"row\"), timm DropPath", .min_in = 1,
        .max_in = 1, .fields = depth_fields, .shape = same_shape, .ref_fwd = sf_ref_layer_dropout_fwd,
        .ref_bwd = sf_ref_layer_dropout_bwd, .cuda = 1, .cuda_tokens = 1,
        .doc = "training: zero a sample with probability p, scale by 1/(1-p); eval: identity. One decision "
               "covers the whole sample, so a map in either layout, a token sequence (timm's DropPath in a "
               "ViT block) and features are alike"},
    [SF_L_DROPOUT2D] = {
        .name = "dropout2d", .torch = "nn.Dropout2d", .min_in = 1, .max_in = 1, .needs_map = 1,
        .fields = dropout_fields, .shape = same_shape, .ref_fwd = sf_ref_layer_dropout_fwd,
        .ref_bwd = sf_ref_layer_dropout_bwd, .cuda = 1,
        .doc = "training: zero a whole channel of a sample with probability p, scale by 1/(1-p), from the "
               "service's seeded RNG; eval: identity"},
    [SF_L_UPSAMPLE] = {
        .name = "upsample", .torch = "nn.Upsample, F.interpolate (modes nearest, bilinear)", .min_in = 1,
        .max_in = 1, .needs_map = 1, .fields = upsample_fields, .shape = upsample_shape,
        .ref_fwd = sf_ref_layer_upsample_fwd, .ref_bwd = sf_ref_layer_upsample_bwd, .cuda = 1,
        .doc = "upsampling by an integer factor or resizing to a size, by PyTorch's index and weight rules "
               "(a generator's or a decoder's upsampling, a segmentation head's resize to the input); its "
               "gradient gathers each input pixel's share of the outputs that read it"},
    [SF_L_GROUPNORM] = {
        .name = "groupnorm", .torch = "nn.GroupNorm", .min_in = 1, .max_in = 1, .no_tokens = 1, .fields = gn_fields,
        .shape = gn_shape, .params = gn_params, .init = sf_init_ones_zeros, .ref_fwd = sf_ref_layer_groupnorm_fwd,
        .ref_bwd = sf_ref_layer_groupnorm_bwd, .cuda = 1,
        .doc = "GroupNorm: each sample's channels in num_groups groups, each normalised over its channels and "
               "positions (no running statistics: the same in training and eval); weight, bias [C] where affine "
               "(`bias`: false leaves the bias out; nn.InstanceNorm2d is a group per channel)"},
    [SF_L_LOG_SOFTMAX] = {
        .name = "log_softmax", .torch = "nn.LogSoftmax(dim=1), F.log_softmax(x, dim=1) on [N, F]", .min_in = 1,
        .max_in = 1, .fields = no_fields, .shape = log_softmax_shape, .ref_fwd = sf_ref_layer_log_softmax_fwd,
        .ref_bwd = sf_ref_layer_log_softmax_bwd, .cuda = 1,
        .doc = "x - log(sum(exp(x))) over the features of each sample. As the last layer its output is "
               "log-probabilities, and the service's cross-entropy on them is nn.NLLLoss on the module's output, "
               "as a PyTorch script that ends in log_softmax trains"},
    [SF_L_TO_TOKENS] = {
        .name = "to_tokens", .torch = "x.reshape(n, C, h * w).permute(0, 2, 1) (VisionTransformer)", .min_in = 1,
        .max_in = 1, .needs_map = 1, .fields = no_fields, .shape = to_tokens_shape,
        .ref_fwd = sf_ref_layer_to_tokens_fwd, .ref_bwd = sf_ref_layer_to_tokens_bwd, .cuda = 1,
        .doc = "a [C,H,W] map (the patch embedding's convolution) as a sequence of H*W tokens of C: [H*W, C]. "
               "On a token sequence, linear and layernorm apply to each token's C values (as nn.Linear and "
               "nn.LayerNorm over the last dimension of [N, T, C]); activations, dropout and add elementwise"},
    [SF_L_CLASS_TOKEN] = {
        .name = "class_token", .torch = "torch.cat([class_token.expand(n, -1, -1), x], dim=1)", .min_in = 1,
        .max_in = 1, .fields = no_fields, .shape = class_token_shape, .params = class_token_params,
        .init = sf_init_zeros, .ref_fwd = sf_ref_layer_class_token_fwd, .ref_bwd = sf_ref_layer_class_token_bwd,
        .cuda = 1, .cuda_tokens = 1,
        .doc = "a parameter [1,1,C] in front of the tokens: [T, C] to [T+1, C]; its state_dict key is the layer's "
               "name (`class_token`, initialised to 0)"},
    [SF_L_POS_EMBEDDING] = {
        .name = "pos_embedding", .torch = "x + pos_embedding (torchvision Encoder)", .min_in = 1, .max_in = 1,
        .fields = no_fields, .shape = tokens_same_shape, .params = pos_embedding_params,
        .init = sf_init_pos_embedding, .ref_fwd = sf_ref_layer_pos_embedding_fwd,
        .ref_bwd = sf_ref_layer_pos_embedding_bwd, .cuda = 1, .cuda_tokens = 1,
        .doc = "adds a parameter [1,T,C] to the tokens; its state_dict key is the layer's name "
               "(`encoder.pos_embedding`, initialised from N(0, 0.02^2))"},
    [SF_L_SELF_ATTENTION] = {
        .name = "self_attention", .torch = "nn.MultiheadAttention(C, heads, batch_first=True)(x, x, x)",
        .min_in = 1, .max_in = 1, .fields = attention_fields, .shape = attention_shape,
        .params = attention_params, .init = sf_init_attention, .ref_fwd = sf_ref_layer_attention_fwd,
        .ref_bwd = sf_ref_layer_attention_bwd, .ref_save = sf_ref_layer_attention_save,
        .cuda = 1, .cuda_tokens = 1,
        .doc = "multi-head self-attention over the tokens, softmax(q k^T / sqrt(C / heads)) v per head, no mask; "
               "in_proj_weight [3C, C] (q, k, v), in_proj_bias [3C], out_proj.weight [C, C], out_proj.bias [C] "
               "(either bias left out by in_proj_bias / out_proj_bias false); with separate_qkv, q_proj.weight, "
               "k_proj.weight, v_proj.weight [C, C] and q_proj.bias, k_proj.bias, v_proj.bias [C] in that order in "
               "place of in_proj_weight and in_proj_bias"},
    [SF_L_SELECT_TOKEN] = {
        .name = "select_token", .torch = "x[:, 0]", .min_in = 1, .max_in = 1, .fields = no_fields,
        .shape = select_token_shape, .ref_fwd = sf_ref_layer_select_token_fwd,
        .ref_bwd = sf_ref_layer_select_token_bwd, .cuda = 1, .cuda_tokens = 1,
        .doc = "the first token (the class token) of a sequence as features: [T, C] to [C]"},
    [SF_L_TRANSPOSE_TOKENS] = {
        .name = "transpose_tokens", .torch = "x.transpose(1, 2) of tokens [N, T, C]", .min_in = 1, .max_in = 1,
        .fields = no_fields, .shape = transpose_tokens_shape, .ref_fwd = sf_ref_layer_transpose_tokens_fwd,
        .ref_bwd = sf_ref_layer_transpose_tokens_bwd, .cuda = 1, .cuda_tokens = 1,
        .doc = "a token sequence [T, C] as C tokens of T features, [C, T], so that a linear layer or a layer "
               "norm after it works across the tokens (MLP-Mixer's token mixing; a second one turns it back)"},
    [SF_L_SCALE_SHIFT] = {
        .name = "scale_shift", .torch = "x * weight + bias, learnable (timm's LearnableAffineBlock, ResMLP's Affine)",
        .min_in = 1, .max_in = 1, .fields = scale_shift_fields, .shape = num_parameters_shape,
        .params = scale_shift_params, .init = sf_init_ones_zeros, .ref_fwd = sf_ref_layer_scale_shift_fwd,
        .ref_bwd = sf_ref_layer_scale_shift_bwd, .cuda = 1, .cuda_tokens = 1,
        .doc = "x * weight + bias with learnable weight and bias (`bias`: false leaves it out): one of each for the "
               "whole tensor, or one per channel of a map, of flat features or of each token, held in "
               "`param_shape`; initialised to 1 and 0; `param_names` keys them as the module does (timm's `scale`, "
               "ResMLP's `alpha` and `beta`)"},
    [SF_L_CHANNEL_CONV1D] = {
        .name = "channel_conv1d", .torch = "nn.Conv1d(1, 1, k) across the channels (ECA's x.mean((2, 3)).view(n, 1, -1))",
        .min_in = 1, .max_in = 1, .no_tokens = 1, .fields = channel_conv1d_fields, .shape = channel_conv1d_shape,
        .params = channel_conv1d_params, .init = sf_init_channel_conv1d, .ref_fwd = sf_ref_layer_channel_conv1d_fwd,
        .ref_bwd = sf_ref_layer_channel_conv1d_bwd, .cuda = 1,
        .doc = "a one-channel 1-D convolution along the C values of a [C,1,1] map or of [C] features, zero-padded by "
               "`pad` at each end (ECA's channel attention, whose sigmoid then scales the map): y[c] = bias + "
               "sum over j of weight[j] * x[c + j - pad]; weight [1, 1, k], bias [1]"},
    [SF_L_TOKEN_MEAN] = {
        .name = "token_mean", .torch = "x[:, start:].mean(dim=1)", .min_in = 1, .max_in = 1,
        .fields = token_mean_fields, .shape = token_mean_shape, .ref_fwd = sf_ref_layer_token_mean_fwd,
        .ref_bwd = sf_ref_layer_token_mean_bwd, .cuda = 1, .cuda_tokens = 1,
        .doc = "the mean of the tokens from `start` on as features: [T, C] to [C] (a ViT's average pooling, "
               "the class token left out with start 1)"},
    [SF_L_CHANNEL_SHUFFLE] = {
        .name = "channel_shuffle",
        .torch = "nn.ChannelShuffle, x.view(n, g, C/g, h, w).transpose(1, 2) then back to [n, C, h, w]",
        .min_in = 1, .max_in = 1, .needs_map = 1, .fields = shuffle_fields, .shape = shuffle_shape,
        .ref_fwd = sf_ref_layer_channel_shuffle_fwd, .ref_bwd = sf_ref_layer_channel_shuffle_bwd, .cuda = 1,
        .doc = "output channel j * groups + i is input channel i * (C / groups) + j (ShuffleNet's shuffle)"},
    [SF_L_CHANNEL_SLICE] = {
        .name = "channel_slice", .torch = "x[:, start:start + count], one piece of x.chunk / x.split(dim=1)",
        .min_in = 1, .max_in = 1, .needs_map = 1, .fields = slice_fields, .shape = slice_shape,
        .ref_fwd = sf_ref_layer_channel_slice_fwd, .ref_bwd = sf_ref_layer_channel_slice_bwd, .cuda = 1,
        .doc = "the channels [start, start + count) of a map; its input's gradient is zero outside them"},
    [SF_L_PIXEL_SHUFFLE] = {
        .name = "pixel_shuffle", .torch = "nn.PixelShuffle, F.pixel_shuffle", .min_in = 1, .max_in = 1,
        .needs_map = 1, .fields = pixel_shuffle_fields, .shape = pixel_shuffle_shape,
        .ref_fwd = sf_ref_layer_pixel_shuffle_fwd, .ref_bwd = sf_ref_layer_pixel_shuffle_bwd, .cuda = 1,
        .doc = "[C * r * r, H, W] to [C, H * r, W * r]: output (c, h * r + i, w * r + j) is input channel "
               "c * r * r + i * r + j at (h, w), as PyTorch's (super-resolution's sub-pixel convolution)"},
    [SF_L_PIXEL_UNSHUFFLE] = {
        .name = "pixel_unshuffle", .torch = "nn.PixelUnshuffle, F.pixel_unshuffle", .min_in = 1, .max_in = 1,
        .needs_map = 1, .fields = pixel_unshuffle_fields, .shape = pixel_unshuffle_shape,
        .ref_fwd = sf_ref_layer_pixel_unshuffle_fwd, .ref_bwd = sf_ref_layer_pixel_unshuffle_bwd, .cuda = 1,
        .doc = "[C, H * r, W * r] to [C * r * r, H, W], the inverse of pixel_shuffle"},
};

const sf_layer_kind_info *sf_layer_info(sf_layer_kind k)
{
    if ((int)k < 0 || k >= SF_L_KIND_COUNT || !kinds[k].name)
        return NULL;
    return &kinds[k];
}

int sf_layer_kind_from_name(const char *s)
{
    for (int i = 0; i < SF_L_KIND_COUNT; i++)
        if (kinds[i].name && strcmp(s, kinds[i].name) == 0)
            return i;
    return -1;
}

void sf_layer_kind_list(char *buf, size_t len)
{
    size_t at = 0;
    if (len)
        buf[0] = '\0';
    for (int i = 0; i < SF_L_KIND_COUNT && at < len; i++) {
        int w = snprintf(buf + at, len - at, "%s%s", at ? ", " : "", kinds[i].name);
        if (w < 0)
            break;
        at += (size_t)w;
    }
}

int sf_layer_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS])
{
    const sf_layer_kind_info *k = sf_layer_info(L->kind);
    const int np = k && k->params ? k->params(L, pd) : 0;
    for (int j = 0; j < np; j++)
        if (L->param_names[j][0])
            pd[j].suffix = strcmp(L->param_names[j], SF_PARAM_BARE) ? L->param_names[j] : "";
    return np;
}

void sf_layer_param_key(const sf_layer *L, const sf_param_desc *pd, char *buf, size_t len)
{
    if (pd->suffix[0])
        snprintf(buf, len, "%s.%s", L->name, pd->suffix);
    else
        snprintf(buf, len, "%s", L->name);
}

size_t sf_layer_param_count(const sf_layer *L)
{
    size_t n = 0;
    for (int j = 0; j < SF_PARAM_SLOTS; j++)
        n += L->p_n[j];
    return n;
}

int sf_layer_out_is_features(const sf_layer *L)
{
    return L->kind == SF_L_FLATTEN || L->kind == SF_L_SELECT_TOKEN || L->kind == SF_L_TOKEN_MEAN ||
           (L->kind == SF_L_LINEAR && !L->over_channels && !L->tokens);
}

int sf_layer_n_inputs(const sf_layer *L) { return L->n_in > 0 ? L->n_in : 1; }

double sf_layer_field_value(const sf_layer *L, const sf_layer_field *f)
{
    const char *p = (const char *)L + f->off;
    if (f->type == SF_FT_FLOAT)
        return *(const float *)p;
    return *(const int *)p;
}

void sf_layer_set_defaults(sf_layer *L)
{
    const sf_layer_kind_info *k = sf_layer_info(L->kind);
    if (!k)
        return;
    for (const sf_layer_field *f = k->fields; f->key; f++) {
        char *p = (char *)L + f->off;
        if (f->type == SF_FT_FLOAT) {
            *(float *)p = (float)f->def;
        } else if (f->type == SF_FT_INT_PAIR || f->type == SF_FT_INT_HW) {
            *(int *)p = *(int *)((char *)L + SF_FT_SECOND(f)) = (int)f->def;
        } else if (f->type == SF_FT_INT_QUAD) {
            for (int j = 0; j < 4; j++)
                ((int *)p)[j] = (int)f->def;
        } else {
            *(int *)p = (int)f->def;
        }
    }
}

void sf_layer_in_shape(const sf_model *m, int i, int j, sf_shape *s)
{
    const int src = sf_layer_input(m, i, j);
    if (src == SF_IN_MODEL) {
        *s = (sf_shape){m->in_c, m->in_h, m->in_w, 0, 0};
    } else {
        const sf_layer *P = &m->layers[src];
        *s = (sf_shape){P->out_ch, P->out_h, P->out_w, P->flat, P->tokens};
    }
}

int sf_layer_cuda_check(const sf_model *m, int i, char *err, size_t errlen)
{
    const sf_layer *L = &m->layers[i];
    const sf_layer_kind_info *k = sf_layer_info(L->kind);
    if (!k || !k->cuda) {
        sf_errf(err, errlen, "layer %d \"%s\" (%s): the CUDA backend has no %s layer; the reference backend "
                "(pipeline.backend=ref) runs it", i, L->name, k ? k->name : "unknown", k ? k->name : "this");
        return -1;
    }
    for (int j = 0; j < sf_layer_n_inputs(L) && !k->cuda_tokens; j++) {
        sf_shape s;
        sf_layer_in_shape(m, i, j, &s);
        if (s.tokens) {
            sf_errf(err, errlen, "layer %d \"%s\" (%s): the CUDA backend runs no %s layer on a token sequence; "
                    "the reference backend (pipeline.backend=ref) runs it", i, L->name, k->name, k->name);
            return -1;
        }
    }
    return 0;
}
