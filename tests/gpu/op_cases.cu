/* tests/gpu/op_cases.cu — the op case table (op_cases.h): every case of the
 * op families' compare-with-reference tests, one row each, built by loops
 * over element types and layouts as ggml's make_test_cases_eval builds its
 * cases. Each family's block says why its shapes are there; its compare
 * function (tests/gpu/ops/<family>.cu) says what the shape and parameters
 * mean. Every family runs in fp32 and bf16 (k_dtypes) and, where it has a
 * layout, NCHW and NHWC (k_layouts), in that order. */
#include "tests/gpu/op_cases.h"

#include "gpu/upsample_rule.h"

#include <stdio.h>

extern "C" {
#include "gpu/model.h"
}

#include "gpu/cuda/activation.h"
#include "gpu/cuda/batchnorm.h"
#include "gpu/cuda/conv.h"
#include "gpu/cuda/pad.h"

static const sf_dtype k_dtypes[] = {SF_DT_F32, SF_DT_BF16};
static const sf_layout k_layouts[] = {SF_LAYOUT_NCHW, SF_LAYOUT_NHWC};

static const char *dtype_name(sf_dtype dt) { return dt == SF_DT_BF16 ? "bf16" : "fp32"; }

std::string op_case_name(const op_case &c)
{
    std::string s = std::string(c.op) + " " + c.check + " " + dtype_name(c.dt);
    if (c.laid)
        s += c.lay == SF_LAYOUT_NHWC ? " nhwc" : " nchw";
    char b[32];
    const struct {
        const char *label;
        const std::vector<int> &v;
    } lists[] = {{" shape=[", c.shape}, {" p=[", c.p}};
    for (const auto &l : lists) {
        if (l.v.empty())
            continue;
        s += l.label;
        for (size_t i = 0; i < l.v.size(); i++) {
            snprintf(b, sizeof b, "%s%d", i ? "," : "", l.v[i]);
            s += b;
        }
        s += "]";
    }
    for (size_t i = 0; i < c.f.size(); i++) {
        snprintf(b, sizeof b, "%s%g", i ? "," : " f=[", c.f[i]);
        s += b;
    }
    if (!c.f.empty())
        s += "]";
    return s;
}

/* A row without a layout, and one with. */
static op_case row(const char *op, const char *check, op_compare run, sf_dtype dt, std::vector<int> shape,
                   std::vector<int> p, double tol, double tol_param = 0, std::vector<float> f = {},
                   double tol_aux = 0)
{
    return op_case{op, check, run, dt, 0, SF_LAYOUT_NCHW, shape, p, f, tol, tol_param, tol_aux};
}
static op_case row(const char *op, const char *check, op_compare run, sf_dtype dt, sf_layout lay,
                   std::vector<int> shape, std::vector<int> p, double tol, double tol_param = 0,
                   std::vector<float> f = {}, double tol_aux = 0)
{
    return op_case{op, check, run, dt, 1, lay, shape, p, f, tol, tol_param, tol_aux};
}

static const char *const ACT_CHECKS[] = {"relu6", "sigmoid",    "silu", "hardswish", "hardsigmoid", "gelu", "gelu_tanh",
                                         "tanh",  "leaky_relu", "elu",  "selu",      "softplus",    "mish", "affine",
                                         "clamp", "square"};
static_assert(sizeof ACT_CHECKS / sizeof ACT_CHECKS[0] == SF_CUDA_ACT_LAST + 1, "a name per activation");

/* The parameter sets (sf_cuda_act_prm's a, b) an activation's rows run at:
 * leaky ReLU at PyTorch's default slope, a GAN's 0.2, a negative one and
 * one above 1 (PyTorch bounds it by nothing); ELU at PyTorch's alpha 1,
 * 0.5, 2 and a negative one; softplus at PyTorch's beta 1 and threshold 20
 * (no input of [-8, 8] reaches the linear branch), beta 2 threshold 3 and
 * beta -0.5 threshold 1 (inputs on both sides of the threshold; a negative
 * beta's linear branch is x < -2), and a sharp beta 10 threshold 20;
 * affine (scale, shift) as the identity, x * 2 - 1 (the exporter's fold of
 * (x - 0.5) / 0.5), a negative scale (c - x / 2) and ImageNet's red
 * channel's normalisation (x - 0.485) / 0.229; clamp (min, max, rule) at
 * Hardtanh's [-1, 1] under each rule, a GAN output's [0, 1], a lower bound
 * alone (clamp_min(-0.5)) and an upper one alone (clamp_max(2)), and [0, 1]
 * and clamp_min(-0.5) under the closed clamp rule. One empty
 * set for the activations without parameters. */
static std::vector<std::vector<float>> act_prm_sets(int act)
{
    switch (act) {
    case SF_CUDA_ACT_LEAKY_RELU: return {{0.01f}, {0.2f}, {-0.5f}, {1.5f}};
    case SF_CUDA_ACT_ELU: return {{1.f}, {0.5f}, {2.f}, {-0.5f}};
    case SF_CUDA_ACT_SOFTPLUS: return {{1.f, 20.f}, {2.f, 3.f}, {-0.5f, 1.f}, {10.f, 20.f}};
    case SF_CUDA_ACT_AFFINE: return {{1.f, 0.f}, {2.f, -1.f}, {-0.5f, 0.25f}, {1.f / 0.229f, -0.485f / 0.229f}};
    case SF_CUDA_ACT_CLAMP:
        return {{-1.f, 1.f, (float)SF_CLAMP_GRAD_HARDTANH}, {0.f, 1.f, (float)SF_CLAMP_GRAD_CLAMP},
                {-1.f, 1.f, (float)SF_CLAMP_GRAD_CLAMP}, {-0.5f, INFINITY, (float)SF_CLAMP_GRAD_CLAMP},
                {-INFINITY, 2.f, (float)SF_CLAMP_GRAD_CLAMP}, {0.f, 1.f, (float)SF_CLAMP_GRAD_CLAMP_CLOSED},
                {-0.5f, INFINITY, (float)SF_CLAMP_GRAD_CLAMP_CLOSED}};
    default: return {{}};
    }
}

std::vector<op_case> op_cases()
{
    std::vector<op_case> t;

    /* activation: the odd 3x3x7x5 map of the layer tests, a length that
     * leaves a vector tail one element off 16-byte alignment, 2^16 in place,
     * and 9 000 003 elements: more vectors than CU_UNROLL passes of a full
     * grid (132 SMs), so each activation's unrolled loop, its remainder loop
     * and the vector tail all run; elementwise, so one run covers both
     * layouts */
    for (const sf_dtype dt : k_dtypes) {
        for (int act = 0; act <= SF_CUDA_ACT_LAST; act++) {
            const std::vector<std::vector<float>> sets = act_prm_sets(act);
            for (const std::vector<float> &f : sets) {
                t.push_back(row("activation", ACT_CHECKS[act], cmp_activation, dt, {3 * 3 * 7 * 5}, {act, 0, 0}, 1e-5,
                                0, f));
                t.push_back(row("activation", ACT_CHECKS[act], cmp_activation, dt, {4099}, {act, 1, 0}, 1e-5, 0, f));
                t.push_back(row("activation", ACT_CHECKS[act], cmp_activation, dt, {1 << 16}, {act, 0, 1}, 1e-5, 0, f));
            }
            /* the long row at the second set (leaky ReLU's 0.2, ELU's 0.5,
             * softplus's beta 2 threshold 3, affine's x * 2 - 1, clamp's [0, 1]) */
            t.push_back(row("activation", ACT_CHECKS[act], cmp_activation, dt, {9000003}, {act, 0, 0}, 1e-5, 0,
                            sets[sets.size() > 1 ? 1 : 0]));
        }
        t.push_back(row("activation", "nan", cmp_activation_nan, dt, {}, {}, 0));
        /* the clamp's bounds, -0, infinities and NaN under each of its sets */
        for (const std::vector<float> &f : act_prm_sets(SF_CUDA_ACT_CLAMP))
            t.push_back(row("activation", "clamp_edges", cmp_clamp_edges, dt, {}, {}, 0, 0, f));
    }
    t.push_back(row("activation", "refused", cmp_activation_refused, SF_DT_F32, {4}, {99}, 0));

    /* concat: 2, 3 and SF_MAX_IN inputs (DenseNet's dense blocks) of odd
     * channel counts, and flat features; copies, so exact */
    std::vector<int> many(SF_MAX_IN);
    for (int j = 0; j < SF_MAX_IN; j++)
        many[j] = 1 + j % 3;
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts) {
            t.push_back(row("concat", "put_take", cmp_concat, dt, lay, {3, 7, 5}, {3, 2}, 0));
            t.push_back(row("concat", "put_take", cmp_concat, dt, lay, {3, 7, 5}, {3, 1, 5}, 0));
            t.push_back(row("concat", "put_take", cmp_concat, dt, lay, {2, 3, 3}, many, 0));
            t.push_back(row("concat", "put_take", cmp_concat, dt, lay, {5, 1, 1}, {7, 4}, 0));
        }
    t.push_back(row("concat", "refused", cmp_concat_refused, SF_DT_F32, SF_LAYOUT_NCHW, {1, 3, 4}, {4, 2}, 0));

    /* channels: ShuffleNetV2's shuffle in 2 groups, and in 3 of an odd
     * channel count; groups = channels (the identity); slices at the start,
     * in the middle and at the end of odd maps, one channel alone, and a
     * 1x1 map; copies, so exact */
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts) {
            t.push_back(row("channels", "shuffle", cmp_channel_shuffle, dt, lay, {3, 10, 7, 5}, {2}, 0));
            t.push_back(row("channels", "shuffle", cmp_channel_shuffle, dt, lay, {2, 21, 3, 3}, {3}, 0));
            t.push_back(row("channels", "shuffle", cmp_channel_shuffle, dt, lay, {2, 5, 1, 1}, {5}, 0));
            t.push_back(row("channels", "slice", cmp_channel_slice, dt, lay, {3, 7, 5, 3}, {0, 3}, 0));
            t.push_back(row("channels", "slice", cmp_channel_slice, dt, lay, {3, 7, 5, 3}, {2, 4}, 0));
            t.push_back(row("channels", "slice", cmp_channel_slice, dt, lay, {2, 9, 3, 7}, {8, 1}, 0));
            t.push_back(row("channels", "slice", cmp_channel_slice, dt, lay, {5, 6, 1, 1}, {1, 5}, 0));
            /* pixel shuffles: ESPCN's factor 3 onto 3 channels of an odd
             * map, factor 2 of many channels, and their inverses */
            for (int inv = 0; inv <= 1; inv++) {
                t.push_back(row("channels", "pixel_shuffle", cmp_pixel_shuffle, dt, lay, {2, 3, 5, 7}, {3, inv}, 0));
                t.push_back(row("channels", "pixel_shuffle", cmp_pixel_shuffle, dt, lay, {3, 33, 4, 3}, {2, inv}, 0));
            }
        }
    t.push_back(row("channels", "refused", cmp_channels_refused, SF_DT_F32, {6}, {4, 5, 2}, 0));

    /* log_softmax over features: a classifier's 10 classes, 1000 (many a
     * warp's lane), one feature, values spread over +-40 (exp of the
     * unshifted values would overflow in fp32 past 88), the backward in place
     * on dy; fp32 outputs within 1e-5 relative (the fast exp and log) */
    for (const sf_dtype dt : k_dtypes) {
        t.push_back(row("log_softmax", "rows", cmp_log_softmax, dt, {8, 10}, {0}, 1e-5, 0, {3.f}));
        t.push_back(row("log_softmax", "rows", cmp_log_softmax, dt, {3, 1000}, {0}, 1e-5, 0, {1.f}));
        t.push_back(row("log_softmax", "rows", cmp_log_softmax, dt, {5, 1}, {0}, 1e-5, 0, {1.f}));
        t.push_back(row("log_softmax", "rows", cmp_log_softmax, dt, {4, 37}, {1}, 1e-5, 0, {40.f}));
    }
    t.push_back(row("log_softmax", "refused", cmp_log_softmax_refused, SF_DT_F32, {}, {}, 0));

    /* groupnorm: 32 groups of a ResNet-like map, groups of one channel, one
     * group, odd sizes with dx not wanted, flat features, data shifted by 50
     * (the two-pass statistics); without affine (p[2] 0: nn.InstanceNorm2d's
     * default, GroupNorm(affine=False) without dx, flat features); the
     * parameter gradients' chunks: 3 a sample with a short last one (2115
     * positions), 2 of vector runs (NCHW 1152 positions), 160 channels in
     * groups of 20 (two tiles of fp32 vectors, bf16 vectors across groups;
     * fp32 vectors cross the groups of 2 of the first row), 260 samples (more
     * than the 256 chunks); fp32 parameter gradients of bf16 runs sum
     * bf16-rounded products: 1e-4 */
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts) {
            const double tp = dt == SF_DT_F32 ? 1e-5 : 1e-4;
            t.push_back(row("groupnorm", "groups", cmp_groupnorm, dt, lay, {2, 64, 14, 14}, {32, 1}, 1e-5, tp,
                            {1e-5f, 0.f}));
            t.push_back(row("groupnorm", "groups", cmp_groupnorm, dt, lay, {3, 6, 5, 7}, {6, 1}, 1e-5, tp, {1e-5f, 0.f}));
            t.push_back(row("groupnorm", "groups", cmp_groupnorm, dt, lay, {2, 12, 9, 11}, {1, 1}, 1e-5, tp,
                            {1e-6f, 0.f}));
            t.push_back(row("groupnorm", "groups", cmp_groupnorm, dt, lay, {3, 10, 3, 5}, {5, 0}, 1e-5, tp,
                            {1e-5f, 0.f}));
            t.push_back(row("groupnorm", "groups", cmp_groupnorm, dt, lay, {4, 24, 1, 1}, {4, 1}, 1e-5, tp, {1e-5f, 0.f}));
            t.push_back(row("groupnorm", "groups", cmp_groupnorm, dt, lay, {2, 16, 8, 8}, {4, 1}, 1e-5, tp,
                            {1e-5f, 50.f}));
            t.push_back(row("groupnorm", "no affine", cmp_groupnorm, dt, lay, {2, 32, 16, 16}, {32, 1, 0}, 1e-5, tp,
                            {1e-5f, 0.f}));
            t.push_back(row("groupnorm", "no affine", cmp_groupnorm, dt, lay, {3, 10, 3, 5}, {5, 0, 0}, 1e-5, tp,
                            {1e-5f, 0.f}));
            t.push_back(row("groupnorm", "no affine", cmp_groupnorm, dt, lay, {4, 24, 1, 1}, {4, 1, 0}, 1e-5, tp,
                            {1e-5f, 0.f}));
            t.push_back(row("groupnorm", "chunks", cmp_groupnorm, dt, lay, {2, 12, 45, 47}, {3, 1}, 1e-5, tp,
                            {1e-5f, 0.f}));
            t.push_back(row("groupnorm", "chunks", cmp_groupnorm, dt, lay, {2, 16, 32, 36}, {4, 1}, 1e-5, tp,
                            {1e-5f, 0.f}));
            t.push_back(row("groupnorm", "chunks", cmp_groupnorm, dt, lay, {2, 160, 5, 5}, {8, 1}, 1e-5, tp,
                            {1e-5f, 0.f}));
            t.push_back(row("groupnorm", "chunks", cmp_groupnorm, dt, lay, {260, 8, 3, 3}, {2, 1}, 1e-5, tp,
                            {1e-5f, 0.f}));
            /* a weight without a bias (p[2] 2: PoolFormer v2's GroupNorm1NoBias,
             * one group): the statistics, dx not wanted, the chunked weight
             * gradient */
            t.push_back(row("groupnorm", "no bias", cmp_groupnorm, dt, lay, {2, 64, 14, 14}, {1, 1, 2}, 1e-5, tp,
                            {1e-5f, 0.f}));
            t.push_back(row("groupnorm", "no bias", cmp_groupnorm, dt, lay, {3, 10, 3, 5}, {5, 0, 2}, 1e-5, tp,
                            {1e-5f, 0.f}));
            t.push_back(row("groupnorm", "no bias", cmp_groupnorm, dt, lay, {2, 12, 45, 47}, {3, 1, 2}, 1e-5, tp,
                            {1e-5f, 0.f}));
        }
    t.push_back(row("groupnorm", "refused", cmp_groupnorm_refused, SF_DT_F32, {}, {}, 0));

    /* grn: ConvNeXt V2's last stage at a small size (64 channels of 7x7),
     * odd sizes, 40 channels (past one NHWC tile) without dx, a one-position
     * map, a channel of zeros; fp32 sums of bf16 inputs: 1e-4 */
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts) {
            const double tp = dt == SF_DT_F32 ? 1e-5 : 1e-4;
            t.push_back(row("grn", "grn", cmp_grn, dt, lay, {2, 64, 7, 7}, {1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("grn", "grn", cmp_grn, dt, lay, {3, 5, 5, 7}, {1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("grn", "grn", cmp_grn, dt, lay, {2, 40, 9, 9}, {0}, 1e-5, tp, {1e-6f}));
            t.push_back(row("grn", "grn", cmp_grn, dt, lay, {4, 12, 1, 1}, {1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("grn", "grn", cmp_grn, dt, lay, {2, 8, 6, 6}, {1, 1}, 1e-5, tp, {1e-5f}));
        }
    t.push_back(row("grn", "refused", cmp_grn_refused, SF_DT_F32, {}, {}, 0));

    /* upsample: nearest by factors 1 (a copy), 2 and 3 of odd maps and to
     * sizes up and down (the forward exact); bilinear by 2 with and without
     * align_corners, up to an odd size, down (inputs no output reads: dx 0),
     * to one pixel with align_corners (scale 0), and 7x7 to 224x224 (a
     * segmentation head's resize: 64 outputs a row reading each input).
     * p {mode, align_corners, out h, out w}; fp32's 1e-6 */
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts) {
            const int N = SF_UP_NEAREST, B = SF_UP_BILINEAR;
            t.push_back(row("upsample", "nearest", cmp_upsample, dt, lay, {2, 3, 5, 7}, {N, 0, 5, 7}, 1e-6));
            t.push_back(row("upsample", "nearest", cmp_upsample, dt, lay, {2, 5, 7, 3}, {N, 0, 14, 6}, 1e-6));
            t.push_back(row("upsample", "nearest", cmp_upsample, dt, lay, {3, 16, 4, 4}, {N, 0, 12, 12}, 1e-6));
            t.push_back(row("upsample", "nearest", cmp_upsample, dt, lay, {2, 3, 5, 7}, {N, 0, 8, 11}, 1e-6));
            t.push_back(row("upsample", "nearest", cmp_upsample, dt, lay, {2, 3, 9, 7}, {N, 0, 4, 5}, 1e-6));
            t.push_back(row("upsample", "bilinear", cmp_upsample, dt, lay, {2, 5, 7, 3}, {B, 0, 14, 6}, 1e-6));
            t.push_back(row("upsample", "bilinear", cmp_upsample, dt, lay, {2, 5, 7, 3}, {B, 1, 14, 6}, 1e-6));
            t.push_back(row("upsample", "bilinear", cmp_upsample, dt, lay, {2, 3, 5, 7}, {B, 0, 13, 9}, 1e-6));
            t.push_back(row("upsample", "bilinear", cmp_upsample, dt, lay, {2, 3, 5, 7}, {B, 1, 13, 9}, 1e-6));
            t.push_back(row("upsample", "bilinear", cmp_upsample, dt, lay, {2, 3, 9, 11}, {B, 0, 4, 6}, 1e-6));
            t.push_back(row("upsample", "bilinear", cmp_upsample, dt, lay, {2, 3, 4, 5}, {B, 1, 1, 1}, 1e-6));
            t.push_back(row("upsample", "bilinear", cmp_upsample, dt, lay, {2, 21, 7, 7}, {B, 0, 224, 224}, 1e-6));
        }
    t.push_back(row("upsample", "refused", cmp_upsample_refused, SF_DT_F32, {}, {}, 0));

    /* mul: the odd sizes of the layer tests, an SE block's shape scaled
     * down, flat features (hw = 1: both forms agree), many rows per sample
     * with a partial channel tile, more channel vectors than a tile (272:
     * 34 bf16 vectors, a full tile and a partial one) on an odd plane;
     * channel_scale (ConvNeXt's layer scale): many chunks, more channels
     * than a block, more rows than chunks; ConvNeXt's 192 channels on a
     * 16x16 plane (the vector forward in either layout), its 768, 96 channels
     * with enough rows a chunk for the gradient's 8-row loads in flight
     * (136 a chunk), and 96 channels one element off 16-byte alignment (the
     * scalar kernels) */
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts) {
            for (int bc = 0; bc < 2; bc++) {
                t.push_back(row("mul", "mul", cmp_mul, dt, lay, {3, 3, 7, 5}, {bc}, 1e-6, 1e-5));
                t.push_back(row("mul", "mul", cmp_mul, dt, lay, {4, 40, 14, 14}, {bc}, 1e-6, 1e-5));
                t.push_back(row("mul", "mul", cmp_mul, dt, lay, {5, 17, 1, 1}, {bc}, 1e-6, 1e-5));
                t.push_back(row("mul", "mul", cmp_mul, dt, lay, {2, 40, 56, 56}, {bc}, 1e-6, 1e-5));
                t.push_back(row("mul", "mul", cmp_mul, dt, lay, {2, 272, 9, 9}, {bc}, 1e-6, 1e-5));
            }
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {3, 3, 7, 5}, {}, 1e-6, 1e-5));
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {8, 96, 14, 14}, {}, 1e-6, 1e-5));
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {2, 1100, 3, 3}, {}, 1e-6, 1e-5));
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {600, 4, 1, 1}, {}, 1e-6, 1e-5));
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {4, 192, 16, 16}, {}, 1e-6, 1e-5));
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {2, 768, 7, 7}, {}, 1e-6, 1e-5));
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {4, 96, 128, 136}, {}, 1e-6, 1e-5));
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {2, 96, 14, 14}, {1}, 1e-6, 1e-5));
            /* with a shift (scale_shift): per channel on vectors and scalars, a
             * token-like [rows, c] one, and one value for a sample's elements
             * (c = 1, the executor's one-parameter layer) */
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {8, 96, 14, 14}, {0, 1}, 1e-6, 1e-5));
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {3, 3, 7, 5}, {0, 1}, 1e-6, 1e-5));
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {2, 96, 14, 14}, {1, 1}, 1e-6, 1e-5));
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {600, 24, 1, 1}, {0, 1}, 1e-6, 1e-5));
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {4, 1, 96, 28}, {0, 1}, 1e-6, 1e-5));
        }

    /* prelu: the odd sizes of the layer tests with a slope per channel and
     * one for all, more channels than a block, flat features with more rows
     * than chunks (a slope per feature and one), one slope over a map with
     * more elements than chunks of a block each, and a slope per channel
     * at a MobileNet-sized map; then a slope count other than 1 or C */
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts) {
            for (const int one : {0, 1}) {
                t.push_back(row("prelu", "prelu", cmp_prelu, dt, lay, {3, 3, 7, 5}, {one}, 1e-6, 1e-5));
                t.push_back(row("prelu", "prelu", cmp_prelu, dt, lay, {600, 4, 1, 1}, {one}, 1e-6, 1e-5));
            }
            t.push_back(row("prelu", "prelu", cmp_prelu, dt, lay, {2, 1100, 3, 3}, {0}, 1e-6, 1e-5));
            t.push_back(row("prelu", "prelu", cmp_prelu, dt, lay, {5, 17, 1, 1}, {0}, 1e-6, 1e-5));
            t.push_back(row("prelu", "prelu", cmp_prelu, dt, lay, {4, 16, 64, 64}, {1}, 1e-6, 1e-5));
            t.push_back(row("prelu", "prelu", cmp_prelu, dt, lay, {8, 96, 14, 14}, {0}, 1e-6, 1e-5));
        }
    t.push_back(row("prelu", "refused", cmp_prelu_refused, SF_DT_F32, {}, {}, 0));

    /* channel_conv1d: ECA's kernels (3 and 5) over a small batch and over
     * ResNet-50's pooled 2048 channels at batch 256 (many chunks), k 1, a
     * kernel wider than the channels, with and without a bias; then a
     * kernel that would not keep the channels */
    for (const sf_dtype dt : k_dtypes)
        for (const int bias : {0, 1}) {
            t.push_back(row("channel_conv1d", "channel_conv1d", cmp_channel_conv1d, dt, {3, 64}, {3, bias}, 1e-6,
                            1e-5));
            t.push_back(row("channel_conv1d", "channel_conv1d", cmp_channel_conv1d, dt, {256, 2048}, {5, bias},
                            1e-6, 1e-5));
            t.push_back(row("channel_conv1d", "channel_conv1d", cmp_channel_conv1d, dt, {5, 7}, {9, bias}, 1e-6,
                            1e-5));
            t.push_back(row("channel_conv1d", "channel_conv1d", cmp_channel_conv1d, dt, {2, 33}, {1, bias}, 1e-6,
                            1e-5));
        }
    t.push_back(row("channel_conv1d", "refused", cmp_channel_conv1d_refused, SF_DT_F32, {}, {}, 0));

    /* pad: each mode symmetric and asymmetric on an odd map (CycleGAN's
     * reflect 3, TensorFlow's "same" as a zero pad of one on the right and
     * bottom, a constant 0.5), reflect's largest pads (one below each
     * side), circular's (each side's size), replicate along an axis of one
     * (its one row is both edges), and a map of many channels; then pads
     * past a mode's bounds. The forward is exact; dx sums a few values */
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts) {
            const double tol = 1e-6;
            t.push_back(row("pad", "constant", cmp_pad, dt, lay, {2, 3, 5, 7}, {1, 1, 1, 1, SF_PAD_CONSTANT}, tol));
            t.push_back(row("pad", "constant", cmp_pad, dt, lay, {2, 3, 5, 7}, {0, 1, 0, 1, SF_PAD_CONSTANT}, tol));
            t.push_back(row("pad", "constant", cmp_pad, dt, lay, {2, 3, 5, 7}, {1, 3, 2, 0, SF_PAD_CONSTANT}, tol, 0,
                            {0.5f}));
            t.push_back(row("pad", "reflect", cmp_pad, dt, lay, {2, 3, 5, 7}, {3, 3, 3, 3, SF_PAD_REFLECT}, tol));
            t.push_back(row("pad", "reflect", cmp_pad, dt, lay, {2, 5, 6, 9}, {1, 2, 4, 0, SF_PAD_REFLECT}, tol));
            t.push_back(row("pad", "reflect", cmp_pad, dt, lay, {1, 2, 4, 5}, {4, 4, 3, 3, SF_PAD_REFLECT}, tol));
            t.push_back(row("pad", "replicate", cmp_pad, dt, lay, {2, 3, 5, 7}, {2, 1, 0, 3, SF_PAD_REPLICATE}, tol));
            t.push_back(row("pad", "replicate", cmp_pad, dt, lay, {2, 3, 1, 4}, {2, 2, 3, 1, SF_PAD_REPLICATE}, tol));
            t.push_back(row("pad", "circular", cmp_pad, dt, lay, {2, 3, 5, 7}, {1, 2, 3, 0, SF_PAD_CIRCULAR}, tol));
            t.push_back(row("pad", "circular", cmp_pad, dt, lay, {2, 2, 4, 3}, {3, 3, 4, 4, SF_PAD_CIRCULAR}, tol));
            t.push_back(row("pad", "reflect", cmp_pad, dt, lay, {4, 33, 32, 32}, {1, 1, 1, 1, SF_PAD_REFLECT}, tol));
            /* channel counts whose NHWC pixels move in 16-, 8- and 4-byte
             * vectors: EfficientNet's TF-"same" pad of 96 channels, a
             * constant fill in vectors, reflect's forward in vectors */
            t.push_back(row("pad", "constant", cmp_pad, dt, lay, {2, 96, 9, 9}, {0, 1, 0, 1, SF_PAD_CONSTANT}, tol));
            t.push_back(row("pad", "constant", cmp_pad, dt, lay, {2, 24, 5, 6}, {1, 2, 0, 1, SF_PAD_CONSTANT}, tol, 0,
                            {0.5f}));
            t.push_back(row("pad", "constant", cmp_pad, dt, lay, {3, 2, 4, 5}, {2, 0, 1, 1, SF_PAD_CONSTANT}, tol));
            t.push_back(row("pad", "reflect", cmp_pad, dt, lay, {2, 16, 6, 5}, {1, 2, 2, 1, SF_PAD_REFLECT}, tol));
        }
    t.push_back(row("pad", "refused", cmp_pad_refused, SF_DT_F32, {}, {}, 0));

    /* norm: layernorm2d at ConvNeXt's stem and block norm (96 channels),
     * odd sizes and channels, more positions than LN_CHUNKS, c > 32; then
     * layernorm over flat features (ConvNeXt's head: 768), hw = 1; then
     * the vector row kernels' shapes: ConvNeXt's 192 channels, 256 (bf16:
     * groups of 8 lanes of 4 vectors), 1024 and 1536 flat features (bf16:
     * 32 lanes of 4 and of 6; fp32: past the registers, the scalar kernels),
     * 96 channels with enough positions a chunk (72) for the weight
     * gradient's loads in flight, and 96 channels one element off 16-byte
     * alignment (the scalar kernels). The fp32 weight gradients of a bf16 run
     * sum bf16-rounded products: 1e-4. */
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts) {
            const double tp = dt == SF_DT_F32 ? 1e-5 : 1e-4;
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {2, 96, 14, 14}, {1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {3, 5, 7, 9}, {1}, 1e-5, tp, {1e-5f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {4, 37, 17, 13}, {1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {2, 8, 5, 5}, {0}, 1e-5, tp, {1e-5f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {5, 768, 1, 1}, {1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {3, 7, 1, 1}, {1}, 1e-5, tp, {1e-5f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {300, 16, 1, 1}, {0}, 1e-5, tp, {1e-5f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {2, 192, 7, 7}, {1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {3, 256, 5, 5}, {1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {2, 1024, 1, 1}, {1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {2, 1536, 1, 1}, {1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {4, 96, 64, 72}, {1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {2, 96, 14, 14}, {1, 1}, 1e-5, tp, {1e-6f}));
            /* dx added to what it holds (a residual stream's gradient): each
             * dx kernel (vector rows, strided NCHW maps, scalar rows when
             * misaligned or past the registers) */
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {5, 768, 1, 1}, {1, 0, 1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {2, 96, 14, 14}, {1, 0, 1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {2, 96, 14, 14}, {1, 1, 1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {2, 1536, 1, 1}, {1, 0, 1}, 1e-5, tp, {1e-6f}));
            /* the one-pass backward (dx and the weight-gradient partials
             * together): a lane a row with 256 rows a block, ViT's 768
             * channels over whole and partial chunks, several rows a group
             * with dx added */
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {600, 16, 1, 1}, {1}, 1e-5, tp, {1e-5f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {2, 768, 20, 20}, {1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "layernorm", cmp_layernorm, dt, lay, {4, 768, 24, 24}, {1, 0, 1}, 1e-5, tp, {1e-6f}));
            /* without a bias (p[3]: ConvFormer's LayerNorm2dNoBias,
             * nn.LayerNorm(bias=False)): vector rows, strided NCHW maps,
             * odd channels (scalar rows), misaligned, flat features with dx
             * added, the one-pass backward */
            t.push_back(row("norm", "no bias", cmp_layernorm, dt, lay, {2, 96, 14, 14}, {1, 0, 0, 1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "no bias", cmp_layernorm, dt, lay, {3, 5, 7, 9}, {1, 0, 0, 1}, 1e-5, tp, {1e-5f}));
            t.push_back(row("norm", "no bias", cmp_layernorm, dt, lay, {2, 96, 14, 14}, {1, 1, 0, 1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "no bias", cmp_layernorm, dt, lay, {5, 768, 1, 1}, {1, 0, 1, 1}, 1e-5, tp, {1e-6f}));
            t.push_back(row("norm", "no bias", cmp_layernorm, dt, lay, {2, 768, 20, 20}, {1, 0, 0, 1}, 1e-5, tp, {1e-6f}));
        }

    /* layout: the batched transpose at a square-tile and a ragged shape */
    t.push_back(row("layout", "transpose", cmp_transpose, SF_DT_F32, {3, 37, 45}, {}, 1e-7));
    t.push_back(row("layout", "transpose", cmp_transpose, SF_DT_F32, {2, 4096, 3}, {}, 1e-7));

    /* tokens: ViT-B/16's 196 patches (of 64 channels here), odd shapes and
     * flat maps; 16 + 1 and 196 + 1 tokens; the moves are exact (0), the
     * position embedding's sum within 1e-7, the parameter gradients within
     * 1e-6 */
    for (const sf_dtype dt : k_dtypes) {
        for (const sf_layout lay : k_layouts) {
            t.push_back(row("tokens", "to_tokens", cmp_to_tokens, dt, lay, {3, 7, 5, 3}, {}, 0));
            t.push_back(row("tokens", "to_tokens", cmp_to_tokens, dt, lay, {2, 64, 14, 14}, {}, 0));
            t.push_back(row("tokens", "to_tokens", cmp_to_tokens, dt, lay, {2, 33, 1, 1}, {}, 0));
        }
        t.push_back(row("tokens", "class_token", cmp_class_token, dt, {3, 16, 24}, {}, 0, 1e-6));
        t.push_back(row("tokens", "class_token", cmp_class_token, dt, {2, 196, 64}, {}, 0, 1e-6));
        t.push_back(row("tokens", "pos_embedding", cmp_pos_embedding, dt, {3, 17, 24}, {}, 1e-7, 1e-6));
        t.push_back(row("tokens", "pos_embedding", cmp_pos_embedding, dt, {5, 197, 64}, {}, 1e-7, 1e-6));
        t.push_back(row("tokens", "select_token", cmp_select_token, dt, {3, 17, 24}, {}, 0));
        t.push_back(row("tokens", "select_token", cmp_select_token, dt, {2, 197, 64}, {}, 0));
        /* channels that are not whole 16-byte vectors: the element-wise kernels */
        t.push_back(row("tokens", "class_token", cmp_class_token, dt, {3, 5, 7}, {}, 0, 1e-6));
        t.push_back(row("tokens", "pos_embedding", cmp_pos_embedding, dt, {3, 5, 7}, {}, 1e-7, 1e-6));
        t.push_back(row("tokens", "select_token", cmp_select_token, dt, {3, 5, 7}, {}, 0));
        t.push_back(row("tokens", "token_mean", cmp_token_mean, dt, {3, 17, 24}, {0}, 1e-6));
        t.push_back(row("tokens", "token_mean", cmp_token_mean, dt, {2, 197, 64}, {1}, 1e-6));
        t.push_back(row("tokens", "token_mean", cmp_token_mean, dt, {4, 5, 7}, {4}, 1e-6));
    }

    /* dropout, stochastic depth and channel dropout, bit for bit with the reference: the odd
     * sizes at p 0, 0.3 and 1, more samples in place, flat features, and a
     * captured launch replayed after the sequence changed; then one element
     * off 16-byte alignment (the scalar kernel), 4 samples of 96x150x160
     * (stochastic depth's unrolled loop: more vectors a sample than
     * CU_UNROLL passes of its blocks), and more samples than a grid's 65 535
     * rows (stochastic depth's scalar kernel) */
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts)
            for (int unit = 0; unit < 3; unit++) { /* sf_drop_unit */
                for (const float p : {0.f, 0.3f, 1.f})
                    t.push_back(row("dropout", "dropout", cmp_dropout, dt, lay, {3, 3, 7, 5}, {unit, 0}, 0, 0, {p}));
                t.push_back(row("dropout", "dropout", cmp_dropout, dt, lay, {16, 24, 9, 11}, {unit, 1}, 0, 0, {0.5f}));
                t.push_back(row("dropout", "dropout", cmp_dropout, dt, lay, {5, 37, 1, 1}, {unit, 0}, 0, 0, {0.3f}));
                t.push_back(row("dropout", "graph_replay", cmp_dropout_graph_replay, dt, lay, {}, {unit}, 0));
                t.push_back(row("dropout", "dropout", cmp_dropout, dt, lay, {16, 24, 9, 11}, {unit, 0, 1}, 0, 0, {0.5f}));
                t.push_back(row("dropout", "dropout", cmp_dropout, dt, lay, {4, 96, 150, 160}, {unit, 0}, 0, 0, {0.3f}));
                t.push_back(row("dropout", "dropout", cmp_dropout, dt, lay, {70000, 1, 1, 1}, {unit, 0}, 0, 0, {0.3f}));
            }
    t.push_back(row("dropout", "null_seq", cmp_dropout_null_seq, SF_DT_F32, {}, {}, 0));

    /* pool: ResNet-18's stem and head, odd sizes (C % 8 != 0, odd h),
     * misaligned tensors, k3 s2 without padding, other windows on channel
     * vectors, many rows per sample with
     * a partial channel tile; ceil_mode with a last window that starts
     * inside the input and runs past it; avgpool2d with and without the
     * padding counted (DenseNet's transition); adaptive bins that overlap
     * and that upsample (VGG's head); the maxpool that follows a batchnorm.
     * Tolerances: y, then dx (0: y exact, maxpool_dt's selection) */
    for (const sf_layout lay : k_layouts) {
        t.push_back(
            row("pool", "maxpool", cmp_maxpool, SF_DT_F32, lay, {2, 64, 112, 112}, {3, 2, 1}, 1e-6, 0, {}, 1e-5));
        t.push_back(row("pool", "maxpool", cmp_maxpool, SF_DT_F32, lay, {3, 5, 13, 11}, {3, 2, 1}, 1e-6, 0, {}, 1e-5));
        t.push_back(row("pool", "maxpool", cmp_maxpool, SF_DT_F32, lay, {2, 3, 9, 9}, {2, 2, 0}, 1e-6, 0, {}, 1e-5));
        t.push_back(row("pool", "maxpool", cmp_maxpool, SF_DT_F32, lay, {1, 4, 7, 8}, {3, 1, 1}, 1e-6, 0, {}, 1e-5));
        t.push_back(row("pool", "maxpool", cmp_maxpool, SF_DT_F32, lay, {2, 3, 10, 10}, {5, 3, 2}, 1e-6, 0, {}, 1e-5));
        t.push_back(row("pool", "avgpool", cmp_avgpool, SF_DT_F32, lay, {4, 512, 7, 7}, {}, 1e-4, 0, {}, 1e-5));
        t.push_back(row("pool", "avgpool", cmp_avgpool, SF_DT_F32, lay, {3, 5, 3, 5}, {}, 1e-4, 0, {}, 1e-5));
        t.push_back(row("pool", "avgpool", cmp_avgpool, SF_DT_F32, lay, {4, 7, 1, 1}, {}, 1e-4, 0, {}, 1e-5));
        t.push_back(row("pool", "avgpool", cmp_avgpool, SF_DT_F32, lay, {2, 40, 56, 56}, {}, 1e-4, 0, {}, 1e-5));
    }
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts) {
            const int mp[][9] = {
                /* n, c, h, w, k, stride, pad, misaligned, ceil_mode */
                {2, 64, 112, 112, 3, 2, 1, 0, 0}, {3, 5, 13, 11, 3, 2, 1, 0, 0}, {2, 16, 9, 10, 3, 2, 1, 0, 0},
                {2, 16, 12, 12, 3, 2, 1, 1, 0},   {2, 8, 11, 11, 3, 2, 0, 0, 0}, {2, 3, 9, 9, 2, 2, 0, 0, 0},
                {1, 4, 7, 8, 3, 1, 1, 0, 0},      {2, 8, 10, 10, 5, 3, 2, 0, 0},
                /* NHWC channel vectors on the generic windows: SqueezeNet's k3 s2
                 * ceil_mode (a last window past the input), VGG's k2 s2, a
                 * stride-1 window, and a misaligned map (the scalar kernels) */
                {2, 64, 28, 28, 3, 2, 0, 0, 1},  {2, 64, 28, 28, 2, 2, 0, 0, 0}, {2, 16, 9, 9, 3, 1, 1, 0, 0},
                {2, 16, 12, 12, 2, 2, 0, 1, 0},
                /* ceil_mode windows larger than the map (one output over a
                 * 2x2 or 1x1 input), on channel vectors and on the scalar
                 * kernels */
                {2, 16, 2, 2, 3, 2, 0, 0, 1},    {2, 5, 2, 2, 3, 2, 0, 0, 1},    {2, 16, 1, 1, 2, 2, 0, 0, 1},
            };
            for (const auto &m : mp)
                t.push_back(row("pool", "maxpool_dt", cmp_maxpool_dt, dt, lay, {m[0], m[1], m[2], m[3]},
                                {m[4], m[5], m[6], m[7], m[8]}, 0, 0, {}, 1e-5));
            t.push_back(row("pool", "avgpool_dt", cmp_avgpool_dt, dt, lay, {4, 512, 7, 7}, {}, 1e-4, 0, {}, 1e-5));
            t.push_back(row("pool", "avgpool_dt", cmp_avgpool_dt, dt, lay, {3, 5, 3, 5}, {}, 1e-4, 0, {}, 1e-5));
            t.push_back(row("pool", "avgpool_dt", cmp_avgpool_dt, dt, lay, {2, 40, 56, 56}, {}, 1e-4, 0, {}, 1e-5));
            t.push_back(row("pool", "avgpool_dt", cmp_avgpool_dt, dt, lay, {2, 272, 9, 9}, {}, 1e-4, 0, {}, 1e-5));
            t.push_back(
                row("pool", "maxpool_dt", cmp_maxpool_dt, dt, lay, {2, 5, 8, 8}, {3, 2, 1, 0, 1}, 0, 0, {}, 1e-5));
            t.push_back(
                row("pool", "maxpool_dt", cmp_maxpool_dt, dt, lay, {2, 3, 10, 11}, {2, 2, 0, 0, 1}, 0, 0, {}, 1e-5));
            t.push_back(
                row("pool", "maxpool_dt", cmp_maxpool_dt, dt, lay, {1, 4, 13, 13}, {3, 2, 0, 0, 1}, 0, 0, {}, 1e-5));
            for (int ceil = 0; ceil < 2; ceil++)
                for (int cip = 0; cip < 2; cip++) {
                    t.push_back(row("pool", "avgpool2d_dt", cmp_avgpool2d_dt, dt, lay, {2, 5, 9, 11},
                                    {3, 2, 1, ceil, cip}, 1e-5, 0, {}, 1e-5));
                    t.push_back(row("pool", "avgpool2d_dt", cmp_avgpool2d_dt, dt, lay, {2, 5, 8, 8},
                                    {3, 2, 1, ceil, cip}, 1e-5, 0, {}, 1e-5));
                    t.push_back(row("pool", "avgpool2d_dt", cmp_avgpool2d_dt, dt, lay, {2, 3, 8, 7},
                                    {2, 2, 1, ceil, cip}, 1e-5, 0, {}, 1e-5));
                    t.push_back(row("pool", "avgpool2d_dt", cmp_avgpool2d_dt, dt, lay, {1, 16, 10, 10},
                                    {3, 3, 0, ceil, cip}, 1e-5, 0, {}, 1e-5));
                }
            t.push_back(row("pool", "avgpool2d_dt", cmp_avgpool2d_dt, dt, lay, {2, 64, 28, 28}, {2, 2, 0, 0, 1}, 1e-5,
                            0, {}, 1e-5));
            /* ResNet-D's shortcut pool (k2 s2, ceil_mode, the padding not
             * counted) over an odd map, and overlapping padded windows, on
             * NHWC channel vectors */
            t.push_back(row("pool", "avgpool2d_dt", cmp_avgpool2d_dt, dt, lay, {2, 64, 7, 7}, {2, 2, 0, 1, 0}, 1e-5,
                            0, {}, 1e-5));
            t.push_back(row("pool", "avgpool2d_dt", cmp_avgpool2d_dt, dt, lay, {2, 24, 9, 9}, {3, 2, 1, 0, 0}, 1e-5,
                            0, {}, 1e-5));
            for (int cip = 0; cip < 2; cip++) /* a ceil_mode window larger than the 2x2 map */
                t.push_back(row("pool", "avgpool2d_dt", cmp_avgpool2d_dt, dt, lay, {2, 16, 2, 2}, {3, 2, 0, 1, cip},
                                1e-5, 0, {}, 1e-5));
            t.push_back(row("pool", "adaptive_dt", cmp_adaptive_dt, dt, lay, {2, 5, 7, 11}, {3, 5}, 1e-5, 0, {}, 1e-5));
            t.push_back(row("pool", "adaptive_dt", cmp_adaptive_dt, dt, lay, {2, 4, 5, 4}, {7, 6}, 1e-5, 0, {}, 1e-5));
            t.push_back(
                row("pool", "adaptive_dt", cmp_adaptive_dt, dt, lay, {3, 16, 13, 13}, {1, 1}, 1e-5, 0, {}, 1e-5));
            t.push_back(
                row("pool", "adaptive_dt", cmp_adaptive_dt, dt, lay, {2, 8, 14, 14}, {7, 7}, 1e-5, 0, {}, 1e-5));
        }
    t.push_back(row("pool", "maxpool_pre_bn", cmp_maxpool_pre_bn, SF_DT_F32, {2, 64, 112, 112}, {}, 0));
    t.push_back(row("pool", "maxpool_pre_bn", cmp_maxpool_pre_bn, SF_DT_F32, {3, 16, 9, 10}, {}, 0));

    /* loss (fp32): cross-entropy with hard labels, with soft targets (label
     * smoothing, mixing, ties, k <= 5 where every sample is a top-5 hit, a
     * data-parallel rank's gradient scale), label checks, and the per-pixel
     * form (W2's head, odd sizes, one class, a bad label, smoothing, a
     * rank's scale). Tolerances: the loss, then the logits' gradient (the
     * last number) */
    t.push_back(row("loss", "xent", cmp_xent, SF_DT_F32, {37, 10}, {}, 1e-5, 0, {}, 1e-5));
    t.push_back(row("loss", "xent", cmp_xent, SF_DT_F32, {5, 1000}, {}, 1e-5, 0, {}, 1e-5));
    t.push_back(row("loss", "xent", cmp_xent, SF_DT_F32, {300, 3}, {}, 1e-5, 0, {}, 1e-5));
    t.push_back(row("loss", "xent_soft", cmp_xent_soft, SF_DT_F32, {37, 10}, {0}, 1e-5, 0, {0.1f, 1.f, 0.f}, 1e-5));
    t.push_back(row("loss", "xent_soft", cmp_xent_soft, SF_DT_F32, {37, 10}, {0}, 1e-5, 0, {0.f, 0.6f, 0.f}, 1e-5));
    t.push_back(row("loss", "xent_soft", cmp_xent_soft, SF_DT_F32, {64, 1000}, {0}, 1e-5, 0, {0.1f, 0.35f, 0.f}, 1e-5));
    t.push_back(row("loss", "xent_soft", cmp_xent_soft, SF_DT_F32, {50, 20}, {1}, 1e-5, 0, {0.2f, 0.8f, 0.f}, 1e-5));
    t.push_back(row("loss", "xent_soft", cmp_xent_soft, SF_DT_F32, {9, 4}, {0}, 1e-5, 0, {0.1f, 0.5f, 0.f}, 1e-5));
    t.push_back(row("loss", "xent_soft", cmp_xent_soft, SF_DT_F32, {37, 10}, {0}, 1e-5, 0, {0.f, 1.f, 0.25f}, 1e-5));
    t.push_back(
        row("loss", "xent_soft", cmp_xent_soft, SF_DT_F32, {64, 1000}, {0}, 1e-5, 0, {0.1f, 0.35f, 0.4f}, 1e-5));
    t.push_back(row("loss", "labels", cmp_labels, SF_DT_F32, {}, {}, 0));
    for (const sf_layout lay : k_layouts) {
        t.push_back(
            row("loss", "xent2d", cmp_xent2d, SF_DT_F32, lay, {2, 10, 256, 256}, {0}, 1e-4, 0, {0.f, 0.f}, 1e-5));
        t.push_back(row("loss", "xent2d", cmp_xent2d, SF_DT_F32, lay, {3, 7, 13, 11}, {0}, 1e-4, 0, {0.f, 0.f}, 1e-5));
        t.push_back(row("loss", "xent2d", cmp_xent2d, SF_DT_F32, lay, {1, 3, 5, 1}, {0}, 1e-4, 0, {0.f, 0.f}, 1e-5));
        t.push_back(row("loss", "xent2d", cmp_xent2d, SF_DT_F32, lay, {2, 1, 3, 3}, {0}, 1e-4, 0, {0.f, 0.f}, 1e-5));
        t.push_back(row("loss", "xent2d", cmp_xent2d, SF_DT_F32, lay, {2, 5, 4, 4}, {1}, 1e-4, 0, {0.f, 0.f}, 1e-5));
        t.push_back(row("loss", "xent2d", cmp_xent2d, SF_DT_F32, lay, {3, 7, 13, 11}, {0}, 1e-4, 0, {0.1f, 0.f}, 1e-5));
        t.push_back(
            row("loss", "xent2d", cmp_xent2d, SF_DT_F32, lay, {2, 21, 16, 16}, {0}, 1e-4, 0, {0.05f, 0.f}, 1e-5));
        t.push_back(
            row("loss", "xent2d", cmp_xent2d, SF_DT_F32, lay, {3, 7, 13, 11}, {0}, 1e-4, 0, {0.f, 0.25f}, 1e-5));
    }

    /* pointwise: the fp32 launchers (ReLU, bias gradient over rows and
     * planes, add with ReLU and in place), then in each element type the
     * _dt launchers at vector tails, misaligned and in place: ReLU, add,
     * the gradient fork, bias + activation and the bias gradient (NHWC and
     * NCHW views, more channels than a block), then casts and the random
     * fill. Tolerances: the outputs (fp32; bf16 within half an ulp); the
     * bias gradient of bias_grad_dt (fp32 sums in either element type); 0:
     * exact (masks, moves, casts) */
    t.push_back(row("pointwise", "relu", cmp_relu, SF_DT_F32, {1001}, {}, 1e-5));
    t.push_back(row("pointwise", "relu", cmp_relu, SF_DT_F32, {1 << 16}, {}, 1e-5));
    for (const auto &b : std::vector<std::vector<int>>{{100003, 16, 1}, {7, 4096, 1}, {33, 3, 1}, {3, 5, 17},
                                                       {32, 16, 4096}, {9, 10, 1}})
        t.push_back(row("pointwise", "bias_grad", cmp_bias_grad, SF_DT_F32, b, {}, 1e-5));
    t.push_back(row("pointwise", "add", cmp_add, SF_DT_F32, {1001}, {0, 0}, 1e-6));
    t.push_back(row("pointwise", "add", cmp_add, SF_DT_F32, {1 << 16}, {0, 1}, 1e-6));
    t.push_back(row("pointwise", "add", cmp_add, SF_DT_F32, {1 << 16}, {1, 0}, 1e-6));
    t.push_back(row("pointwise", "add", cmp_add, SF_DT_F32, {999}, {1, 1}, 1e-6));
    for (const sf_dtype dt : k_dtypes) {
        t.push_back(row("pointwise", "relu_dt", cmp_relu_dt, dt, {1001}, {0, 0}, 0));
        t.push_back(row("pointwise", "relu_dt", cmp_relu_dt, dt, {1 << 16}, {0, 1}, 0));
        t.push_back(row("pointwise", "relu_dt", cmp_relu_dt, dt, {4099}, {1, 0}, 0));
        t.push_back(row("pointwise", "relu_dt", cmp_relu_dt, dt, {5}, {0, 0}, 0));
        t.push_back(row("pointwise", "add_dt", cmp_add_dt, dt, {1001}, {0, 0, 0}, 1e-6));
        t.push_back(row("pointwise", "add_dt", cmp_add_dt, dt, {1 << 16}, {1, 1, 0}, 1e-6));
        t.push_back(row("pointwise", "add_dt", cmp_add_dt, dt, {999}, {1, 0, 1}, 1e-6));
        t.push_back(row("pointwise", "add_dt", cmp_add_dt, dt, {7}, {0, 1, 0}, 1e-6));
        for (int v = 0; v < 8; v++)
            t.push_back(row("pointwise", "grad_fork_dt", cmp_grad_fork_dt, dt, {v & 4 ? 1001 : 1 << 16},
                            {v & 1, (v >> 1) & 1, v == 6, v == 5}, 0));
        /* NHWC view with the vector path, NCHW view with an odd inner size
         * and with inner % 8 == 0, channels not a multiple of 8, ReLU alone
         * misaligned */
        for (const auto &b : std::vector<std::vector<int>>{{37, 64, 1, 1, 1, 0}, {3, 16, 49, 1, 1, 0}, {2, 5, 64, 0, 1, 0},
                                                           {19, 12, 1, 1, 1, 0}, {11, 24, 1, 1, 0, 1}})
            t.push_back(
                row("pointwise", "bias_act_dt", cmp_bias_act_dt, dt, {b[0], b[1], b[2]}, {b[3], b[4], b[5]}, 1e-6));
        /* rows (vector, many chunks, scalar), planes (vector, scalar
         * misaligned), the mask alone, more channels than a block */
        for (const auto &b : std::vector<std::vector<int>>{{301, 64, 1, 1, 1, 0}, {1000, 8, 1, 0, 1, 0},
                                                           {57, 13, 1, 1, 1, 0}, {4, 6, 64, 1, 1, 0},
                                                           {5, 7, 9, 1, 1, 1}, {9, 16, 1, 1, 0, 0},
                                                           {3, 2100, 1, 0, 1, 0}})
            t.push_back(row("pointwise", "bias_grad_dt", cmp_bias_grad_dt, dt, {b[0], b[1], b[2]}, {b[3], b[4], b[5]},
                            0, 1e-4));
    }
    t.push_back(row("pointwise", "cast", cmp_cast, SF_DT_F32, {1001}, {0, 0}, 0));
    t.push_back(row("pointwise", "cast", cmp_cast, SF_DT_F32, {1 << 16}, {0, 0}, 0));
    t.push_back(row("pointwise", "cast", cmp_cast, SF_DT_F32, {333}, {1, 0}, 0));
    t.push_back(row("pointwise", "cast", cmp_cast, SF_DT_F32, {40}, {0, 3}, 0));
    t.push_back(row("pointwise", "fill_random_dt", cmp_fill_random_dt, SF_DT_F32, {100003}, {}, 0));

    /* optimizer: SGD with and without momentum over one and many segments,
     * with fp32 masters of bf16 weights, AdamW with and without weight
     * decay (permuted segments too), and the weights' layout permutation;
     * bit for bit (0), AdamW's state within 1e-5 */
    t.push_back(row("optimizer", "sgd", cmp_sgd, SF_DT_F32, {}, {0}, 0, 0, {0.9f}));
    t.push_back(row("optimizer", "sgd", cmp_sgd, SF_DT_F32, {}, {1}, 0, 0, {0.9f}));
    t.push_back(row("optimizer", "sgd", cmp_sgd, SF_DT_F32, {}, {0}, 0, 0, {0.f}));
    t.push_back(row("optimizer", "sgd_mixed", cmp_sgd_mixed, SF_DT_F32, {}, {}, 0, 0, {0.9f}));
    t.push_back(row("optimizer", "sgd_mixed", cmp_sgd_mixed, SF_DT_F32, {}, {}, 0, 0, {0.f}));
    t.push_back(row("optimizer", "adamw", cmp_adamw, SF_DT_F32, {10007}, {0}, 1e-5, 0, {0.01f}));
    t.push_back(row("optimizer", "adamw", cmp_adamw, SF_DT_F32, {1 << 16}, {0}, 1e-5, 0, {0.f}));
    t.push_back(row("optimizer", "adamw", cmp_adamw, SF_DT_F32, {64}, {1}, 1e-5, 0, {0.05f}));
    for (const sf_dtype dt : k_dtypes) {
        t.push_back(row("optimizer", "weights_perm", cmp_weights_perm, dt, {}, {0, 0}, 0));
        t.push_back(row("optimizer", "weights_perm", cmp_weights_perm, dt, {}, {1, 0}, 0));
        t.push_back(row("optimizer", "weights_perm", cmp_weights_perm, dt, {}, {0, 1}, 0));
    }

    /* conv_dw (depthwise NHWC): EfficientNet-B0's and MobileNet-V2's
     * shapes scaled down, k3, k5 and k7 at both strides, odd maps and
     * channel counts, one channel, more output rows than the filter
     * gradient's chunks; the 16-byte kernels (channels a multiple of 8, or
     * of 4 in fp32) at n = 1 and maps narrower than one strip; more
     * channels than one 128-channel tile (272: a partial last tile in bf16;
     * 336: three full tiles); many work items per block. Then bias, and
     * tensors one element past an aligned address; shapes the kernels
     * refuse; the rules the executor asks. */
    const int dw[][7] = {
        /* n, c, h, w, k, stride, pad */
        {2, 32, 14, 14, 3, 1, 1}, {2, 96, 15, 15, 3, 2, 1}, {2, 40, 13, 11, 5, 2, 2},   {3, 24, 9, 10, 5, 1, 2},
        {2, 144, 8, 7, 3, 1, 1},  {2, 20, 12, 9, 7, 1, 3},  {2, 7, 11, 13, 3, 1, 1},    {1, 13, 10, 9, 3, 2, 0},
        {3, 1, 17, 5, 3, 1, 1},   {8, 16, 150, 20, 3, 1, 1}, {2, 64, 9, 11, 7, 2, 3},   {2, 48, 10, 13, 7, 1, 3},
        {1, 40, 7, 7, 5, 1, 2},   {2, 16, 5, 5, 5, 2, 0},   {2, 8, 8, 8, 7, 2, 6},      {1, 24, 3, 3, 3, 1, 0},
        {2, 272, 7, 7, 5, 1, 2},  {1, 336, 5, 6, 3, 2, 1},  {2, 672, 14, 14, 5, 2, 2}, {4, 8, 180, 180, 3, 2, 1},
    };
    auto dw_row = [&](const int *d, sf_dtype dt, int bias, int mis) {
        /* fp32: relative error; bf16: max error of max|ref| */
        t.push_back(row("conv_dw", "depthwise", cmp_conv_dw, dt, SF_LAYOUT_NHWC, {d[0], d[1], d[2], d[3]},
                        {d[4], d[5], d[6], bias, mis}, dt == SF_DT_BF16 ? 1e-2 : 1e-5));
    };
    for (const auto &d : dw)
        for (const sf_dtype dt : k_dtypes)
            dw_row(d, dt, 0, 0);
    dw_row(dw[0], SF_DT_F32, 1, 0);
    dw_row(dw[2], SF_DT_BF16, 1, 0);
    dw_row(dw[0], SF_DT_BF16, 0, 1);
    dw_row(dw[1], SF_DT_F32, 1, 1);
    dw_row(dw[10], SF_DT_BF16, 1, 1);
    dw_row(dw[11], SF_DT_BF16, 1, 0);
    t.push_back(row("conv_dw", "even k", cmp_conv_dw_refused, SF_DT_F32, SF_LAYOUT_NHWC, {2, 8, 8, 8}, {4, 1, 1}, 0));
    t.push_back(row("conv_dw", "stride 3", cmp_conv_dw_refused, SF_DT_F32, SF_LAYOUT_NHWC, {2, 8, 8, 8}, {3, 3, 1}, 0));
    t.push_back(row("conv_dw", "k above SF_CONV_DW_KMAX", cmp_conv_dw_refused, SF_DT_F32, SF_LAYOUT_NHWC,
                    {2, 8, 12, 12}, {9, 1, 4}, 0));
    t.push_back(row("conv_dw", "rules", cmp_conv_dw_rules, SF_DT_F32, {}, {}, 0));

    /* attention: the materialised core and the whole layer, fp32 then
     * bf16, at 17 and 197 tokens (ViT-B/16), 50 (ViT-B/32), 1, 4 and 12
     * heads, head dimensions 16 and 64; heads that do not divide the
     * embedding refused. Tolerances (attention.cu's comment says why):
     * the forward outputs and out_proj's gradients, then what passes back
     * through the core; fp32 relative error, bf16 max error of max|ref| */
    for (const sf_dtype dt : k_dtypes) {
        const double tf = dt == SF_DT_F32 ? 1e-5 : 2e-2, tb = dt == SF_DT_F32 ? 3e-5 : 2e-2;
        for (const auto &a : std::vector<std::vector<int>>{{3, 17, 1, 16}, {2, 17, 4, 16}, {2, 17, 4, 64},
                                                           {1, 197, 12, 64}, {2, 50, 12, 64}})
            t.push_back(row("attention", "core", cmp_attention_core, dt, a, {}, tf, 0, {}, tb));
        t.push_back(row("attention", "layer", cmp_attention_layer, dt, {2, 17, 4, 16}, {}, tf, 0, {}, tb));
        t.push_back(row("attention", "layer", cmp_attention_layer, dt, {1, 197, 12, 64}, {}, tf, 0, {}, tb));
    }
    t.push_back(row("attention", "refused", cmp_attention_refused, SF_DT_F32, {1, 17, 30, 4}, {}, 0));

    /* sdpa (cuDNN's fused attention, bf16): a head dimension above 128
     * refused, then the transformers' sequence lengths (17, 50, 197, 64),
     * heads 1, 4 and 12, head dimensions 16, 32 and 64, batches 1 to 8.
     * Tolerances (sdpa.cu says why), max error of max|ref|: O, the fp32
     * softmax statistics, dQ dK dV */
    t.push_back(row("sdpa", "refused", cmp_sdpa_refused, SF_DT_BF16, {2, 64, 2, 160}, {}, 0));
    for (const auto &a : std::vector<std::vector<int>>{{1, 17, 1, 16}, {4, 17, 4, 16}, {2, 50, 4, 32}, {8, 50, 12, 64},
                                                       {3, 197, 12, 64}, {1, 197, 1, 32}, {8, 64, 4, 16},
                                                       {5, 64, 12, 64}, {2, 64, 1, 64}})
        t.push_back(row("sdpa", "sdpa", cmp_sdpa, SF_DT_BF16, a, {}, 1e-2, 1e-4, {}, 2e-2));

    /* linear: cuBLAS with and without TF32, through the fp32 and the _dt
     * launchers; bf16 (ResNet-18's classifier among them); per pixel over
     * channels (ConvNeXt's pointwise 96 -> 384 at a small size, odd sizes,
     * one pixel) in fp32, tf32 and bf16; cuBLASLt with the bias epilogues at
     * vit_b_16's GEMMs at 2 samples (394 token rows) and the small ViT's, and
     * shapes not multiples of 8 or 16. Tolerances: the outputs (relative
     * error in fp32 and tf32, max error of max|ref| in bf16: one output
     * rounding), then the fp32 parameter gradients (bias; bf16's dw, whose
     * products are exact in fp32, so only the sum's rounding is left) */
    const double lin_tol[3] = {1e-4, 1e-3, 1e-2}; /* fp32, tf32, bf16 */
    for (int tf32 = 0; tf32 < 2; tf32++)
        for (int via_dt = 0; via_dt < 2; via_dt++)
            for (const auto &a : std::vector<std::vector<int>>{{5, 37, 11}, {32, 4096, 10}, {3, 1, 7}})
                t.push_back(row("linear", "linear", cmp_linear, SF_DT_F32, a, {tf32, via_dt}, lin_tol[tf32], 1e-5));
    for (const auto &a : std::vector<std::vector<int>>{{5, 37, 11}, {3, 1, 7}, {32, 4096, 10}, {256, 512, 1000}})
        t.push_back(row("linear", "linear", cmp_linear_bf16, SF_DT_BF16, a, {}, 1e-2, 1e-3));
    t.push_back(row("linear", "bad_dtype", cmp_linear_bad_dtype, SF_DT_F32, {}, {}, 0));
    for (int k = 0; k < 3; k++)
        for (const sf_layout lay : k_layouts) {
            const sf_dtype dt = k == 2 ? SF_DT_BF16 : SF_DT_F32;
            const int tf32 = k == 1;
            const double tw = k == 2 ? 1e-3 : lin_tol[k]; /* dw: relative error */
            t.push_back(row("linear", "map", cmp_linear_map, dt, lay, {2, 96, 384, 7, 7}, {tf32}, lin_tol[k], tw));
            t.push_back(row("linear", "map", cmp_linear_map, dt, lay, {3, 5, 7, 9, 11}, {tf32}, lin_tol[k], tw));
            t.push_back(row("linear", "map", cmp_linear_map, dt, lay, {4, 6, 3, 1, 1}, {tf32}, lin_tol[k], tw));
        }
    for (int k = 0; k < 3; k++) {
        const sf_dtype dt = k == 2 ? SF_DT_BF16 : SF_DT_F32;
        const int tf32 = k == 1;
        for (int bias = dt == SF_DT_BF16 ? 2 : 1; bias >= 0; bias--) {
            /* bf16 with an fp32 bias may have no plan: the executor then
             * reads the bias's bf16 copy (bias 2), which must build */
            const int must = dt != SF_DT_BF16 || bias != 1;
            for (const auto &a : std::vector<std::vector<int>>{{394, 768, 2304}, {394, 3072, 768}, {8, 64, 10},
                                                               {136, 64, 192}})
                t.push_back(row("linear", "lt", cmp_linear_lt, dt, a, {tf32, bias, must}, lin_tol[k]));
            t.push_back(row("linear", "lt", cmp_linear_lt, dt, {37, 13, 11}, {tf32, bias, 0}, lin_tol[k]));
            t.push_back(row("linear", "lt", cmp_linear_lt, dt, {5, 1, 7}, {tf32, bias, 0}, lin_tol[k]));
        }
    }
    t.push_back(row("linear", "lt_refuses", cmp_linear_lt_refuses, SF_DT_F32, {}, {}, 0));

    /* conv_transpose: W2's decoder at batch 2, odd sizes with padding,
     * stride 1, k4 s3, k5 s2 p2 (fp32 through the plans, both layouts);
     * the plan cache; the bias in each element type and layout; bf16 at
     * W2's decoder and odd sizes; the k2s2 per-pixel forward at W2's last
     * two decoder layers and odd sizes, and its eligibility. Tolerances:
     * the outputs (fp32 relative error; bf16 max error, of max|ref|), the
     * bias gradient, and tf32's outputs where the case runs tf32 too */
    const int ct[][8] = {
        /* n, c, h, w, out channels, k, stride, pad */
        {2, 256, 16, 16, 128, 2, 2, 0}, {2, 128, 32, 32, 64, 2, 2, 0}, {2, 64, 64, 64, 32, 2, 2, 0},
        {2, 32, 128, 128, 16, 2, 2, 0}, {2, 3, 5, 7, 4, 3, 2, 1},      {3, 5, 6, 5, 7, 3, 1, 1},
        {2, 4, 4, 3, 3, 4, 3, 0},       {1, 6, 3, 3, 2, 5, 2, 2},
    };
    for (const auto &a : ct)
        t.push_back(row("conv_transpose", "convt", cmp_convt, SF_DT_F32, {a[0], a[1], a[2], a[3]},
                        {a[4], a[5], a[6], a[7]}, 1e-4, 1e-4, {}, 1e-3));
    t.push_back(row("conv_transpose", "cache", cmp_convt_cache, SF_DT_F32, {}, {}, 0));
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts) {
            t.push_back(row("conv_transpose", "bias_dt", cmp_convt_bias_dt, dt, lay, {}, {5}, 1e-6, 1e-4));
            t.push_back(row("conv_transpose", "bias_dt", cmp_convt_bias_dt, dt, lay, {}, {16}, 1e-6, 1e-4));
        }
    const int ct_bf16[][8] = {{2, 64, 16, 16, 32, 2, 2, 0}, {2, 3, 5, 7, 4, 3, 2, 1}, {3, 5, 6, 5, 7, 3, 1, 1}};
    for (const auto &a : ct_bf16)
        t.push_back(row("conv_transpose", "convt", cmp_convt, SF_DT_BF16, {a[0], a[1], a[2], a[3]},
                        {a[4], a[5], a[6], a[7]}, 1e-2, 1e-4));
    for (const auto &a : std::vector<std::vector<int>>{{2, 32, 128, 128}, {2, 64, 64, 64}, {3, 32, 5, 7}, {1, 64, 3, 11}})
        for (int v = 0; v < 4; v++)
            t.push_back(
                row("conv_transpose", "patch", cmp_convt_patch, SF_DT_F32, SF_LAYOUT_NCHW, a, {v & 1, v >> 1}, 1e-5));
    t.push_back(row("conv_transpose", "patch_rules", cmp_convt_patch_rules, SF_DT_F32, {}, {}, 0));

    /* conv_gemm (1x1 convolutions as cuBLAS GEMMs): EfficientNet-B0's
     * expansion 24 -> 144 at 56x56 and RegNet-Y-400MF's 104 -> 104 at 28x28,
     * one to four samples, and an odd small shape, in fp32, tf32 and bf16,
     * both layouts; the fallback to cuDNN, the lent handle bound back, and
     * what the GEMM path refuses */
    std::vector<std::vector<int>> pw;
    for (int n = 1; n <= 4; n++) {
        pw.push_back({n, 24, 56, 56, 144});
        pw.push_back({n, 104, 28, 28, 104});
    }
    pw.push_back({1, 3, 7, 5, 5});
    pw.push_back({3, 3, 7, 5, 5});
    const double pw_tol[3] = {1e-4, 1e-3, 1e-2}; /* fp32, tf32 (relative error); bf16 (max error) */
    for (const auto &a : pw)
        for (int k = 0; k < 3; k++)
            for (const sf_layout lay : k_layouts)
                t.push_back(row("conv_gemm", "gemm", cmp_conv_gemm, k == 2 ? SF_DT_BF16 : SF_DT_F32, lay,
                                {a[0], a[1], a[2], a[3]}, {a[4], k == 1}, pw_tol[k]));
    t.push_back(
        row("conv_gemm", "fallback", cmp_conv_gemm_fallback, SF_DT_F32, {2, 24, 56, 56}, {144, SF_CONV_FWD}, 1e-4));
    t.push_back(row("conv_gemm", "fallback", cmp_conv_gemm_fallback, SF_DT_F32, {2, 104, 28, 28},
                    {104, SF_CONV_BWD_FILTER}, 1e-4));
    t.push_back(row("conv_gemm", "lend_binds_back", cmp_conv_gemm_lend_binds_back, SF_DT_F32, {}, {}, 1e-4));
    t.push_back(row("conv_gemm", "refuses", cmp_conv_gemm_refuses, SF_DT_F32, {}, {}, 0));

    /* conv (cuDNN): a W1 block, W1's first conv, odd sizes with padding,
     * stride, k5 s3 p2, deep and tiny spatial, W1's tail (1x1 output), fp32
     * and tf32 in both layouts; the timed choice among several engines;
     * bf16 at small and odd shapes and ResNet-18's shapes scaled down (stem
     * 7x7/2, 3x3, 3x3/2, 1x1/2 downsample, 3x3 512 at 7x7), the timed choice
     * and an x aligned to 2 bytes only; an unknown element type refused */
    const int cv[][8] = {
        /* n, c, h, w, out channels, k, stride, pad */
        {3, 16, 32, 32, 32, 2, 2, 0}, {4, 3, 20, 20, 16, 1, 1, 0}, {2, 3, 17, 13, 5, 3, 1, 1},
        {2, 7, 9, 11, 6, 3, 2, 1},    {3, 5, 15, 14, 4, 5, 3, 2},  {5, 64, 4, 4, 128, 2, 2, 0},
        {32, 256, 2, 2, 512, 2, 2, 0},
    };
    /* p {out channels, k, stride, pad, tf32, tune, misaligned}. Tolerances:
     * the outputs (fp32 and tf32 relative error, bf16 max error of
     * max|ref|), the fp32 bias gradients, the ReLU backward's masked dy */
    const double cv_tol[3] = {1e-4, 1e-3, 1e-2}; /* fp32, tf32, bf16 */
    auto conv_row = [&](const int *a, sf_dtype dt, sf_layout lay, int tf32, int tune, int mis) {
        t.push_back(row("conv", "conv", cmp_conv, dt, lay, {a[0], a[1], a[2], a[3]},
                        {a[4], a[5], a[6], a[7], tf32, tune, mis}, cv_tol[dt == SF_DT_BF16 ? 2 : tf32], 1e-5, {},
                        1e-6));
    };
    for (const auto &a : cv)
        for (const sf_layout lay : k_layouts)
            for (int tf32 = 0; tf32 < 2; tf32++)
                conv_row(a, SF_DT_F32, lay, tf32, 1, 0);
    conv_row(cv[0], SF_DT_F32, SF_LAYOUT_NHWC, 1, 4, 0);
    conv_row(cv[3], SF_DT_F32, SF_LAYOUT_NCHW, 0, 4, 0);
    const int cv_bf16[][8] = {
        {3, 16, 32, 32, 32, 2, 2, 0},  {2, 3, 17, 13, 5, 3, 1, 1},    {2, 7, 9, 11, 6, 3, 2, 1},
        {5, 64, 4, 4, 128, 2, 2, 0},   {2, 3, 32, 32, 64, 7, 2, 3},   {2, 64, 14, 14, 64, 3, 1, 1},
        {2, 64, 14, 14, 128, 3, 2, 1}, {2, 64, 14, 14, 128, 1, 2, 0}, {2, 512, 7, 7, 512, 3, 1, 1},
    };
    for (const auto &a : cv_bf16)
        for (const sf_layout lay : k_layouts)
            conv_row(a, SF_DT_BF16, lay, 0, 1, 0);
    for (const sf_layout lay : k_layouts)
        conv_row(cv_bf16[5], SF_DT_BF16, lay, 0, 4, 0);
    const int cv_mis[8] = {2, 16, 12, 12, 16, 3, 1, 1};
    for (const sf_layout lay : k_layouts)
        conv_row(cv_mis, SF_DT_BF16, lay, 0, 1, 1);
    t.push_back(row("conv", "bad_dtype", cmp_conv_bad_dtype, SF_DT_F32, {}, {}, 0));

    /* conv thin 1x1 kernels: W1's stem, every channel count they take, odd
     * sizes, 5x256x256 (more pixels than the backward's blocks x threads);
     * the narrow kernels (NCHW fp32, up to 16 in and out): W2's head, odd
     * channel counts and sizes, more pixels than the backward's blocks x
     * 256; p {out channels, bias, relu, dx wanted}; every output within
     * 1e-5 (fp32 relative error) or 1e-2 (bf16 max error) */
    for (const auto &a : std::vector<std::vector<int>>{{4, 3, 20, 20, 16}, {2, 1, 7, 9, 8}, {3, 4, 5, 13, 32},
                                                       {2, 2, 16, 16, 8}, {5, 3, 256, 256, 16}})
        for (const sf_dtype dt : k_dtypes)
            for (const sf_layout lay : k_layouts)
                for (int v = 0; v < 4; v++)
                    t.push_back(row("conv", "thin", cmp_conv_thin, dt, lay, {a[0], a[1], a[2], a[3]},
                                    {a[4], v & 1, (v >> 1) & 1, v != 1}, dt == SF_DT_BF16 ? 1e-2 : 1e-5));
    for (const auto &a : std::vector<std::vector<int>>{{2, 16, 9, 13, 10}, {3, 7, 5, 5, 16}, {1, 16, 3, 3, 1},
                                                       {2, 5, 20, 20, 12}, {3, 16, 256, 256, 10}})
        for (int v = 0; v < 4; v++)
            t.push_back(row("conv", "thin", cmp_conv_thin, SF_DT_F32, SF_LAYOUT_NCHW, {a[0], a[1], a[2], a[3]},
                            {a[4], v & 1, (v >> 1) & 1, v != 1}, 1e-5));
    t.push_back(row("conv", "thin_rules", cmp_conv_thin_rules, SF_DT_F32, {}, {}, 0));

    /* conv patch (the one-pass backward of non-overlapping convolutions):
     * W1's 16 -> 32 k2s2, its other shapes (k4 over 4 channels, k8 over 1),
     * one image, a ragged last chunk, W1's full 256x256 (more chunks than
     * blocks); p {k, bias, relu, dx wanted}; within 1e-5 (relative error) */
    for (const auto &a : std::vector<std::vector<int>>{{2, 16, 16, 16, 2}, {1, 16, 6, 10, 2}, {3, 4, 16, 8, 4},
                                                       {2, 1, 16, 24, 8}, {3, 16, 256, 256, 2}})
        for (int v = 0; v < 4; v++)
            t.push_back(row("conv", "patch", cmp_conv_patch, SF_DT_F32, SF_LAYOUT_NHWC, {a[0], a[1], a[2], a[3]},
                            {a[4], v & 1, (v >> 1) & 1, v != 1}, 1e-5));
    t.push_back(row("conv", "patch_refuses_bf16", cmp_conv_patch_refuses_bf16, SF_DT_BF16, {}, {}, 0));
    t.push_back(row("conv", "patch_rules", cmp_conv_patch_rules, SF_DT_F32, {}, {}, 0));

    /* conv s2d (space-to-depth): ResNet's stem (at a small size and at
     * 224), odd sizes, a 3x3 and a 5x5 over one and four channels, stride
     * 3, patches; the forward and the gathered filter gradient within 1e-4
     * (fp32 relative error) or 1e-2 (bf16 max error) */
    const int s2d[][8] = {{2, 3, 32, 32, 64, 7, 2, 3}, {1, 3, 33, 31, 16, 7, 2, 3}, {2, 1, 20, 20, 8, 3, 2, 1},
                          {1, 4, 17, 18, 8, 5, 2, 2},  {2, 1, 16, 17, 8, 5, 3, 1},  {3, 3, 224, 224, 64, 7, 2, 3},
                          /* patches (k == s): ViT's 16x16 (runs of 16 bytes in bf16), ConvNeXt's
                           * 4x4 with rows left over (8-byte runs in bf16), 2x2 over RGBA, 14x14
                           * over one channel with padding (element by element, 196 -> 200
                           * channels in bf16) */
                          {2, 3, 64, 48, 32, 16, 16, 0}, {2, 3, 34, 30, 24, 4, 4, 0}, {2, 4, 20, 22, 8, 2, 2, 0},
                          {1, 1, 30, 30, 8, 14, 14, 1}};
    for (const auto &a : s2d)
        for (const sf_dtype dt : k_dtypes)
            t.push_back(row("conv", "s2d", cmp_conv_s2d, dt, SF_LAYOUT_NHWC, {a[0], a[1], a[2], a[3]},
                            {a[4], a[5], a[6], a[7]}, dt == SF_DT_BF16 ? 1e-2 : 1e-4));
    t.push_back(row("conv", "s2d_rules", cmp_conv_s2d_rules, SF_DT_F32, {}, {}, 0));

    /* conv grouped (2 groups, 4 -> 6 channels), depthwise (groups = c:
     * MobileNet's 3x3, ConvNeXt's 7x7 pad 3, a strided one), dilation 2
     * (with groups too), odd sizes; fp32 and tf32 in both layouts, bf16 in
     * both; p {out channels, k, stride, pad, tf32, groups, dilation} */
    const int gd[][10] = {
        {2, 4, 9, 11, 6, 3, 1, 1, 2, 1},     {2, 8, 13, 12, 8, 3, 1, 1, 8, 1}, {2, 16, 10, 9, 16, 3, 2, 1, 16, 1},
        {2, 12, 14, 14, 12, 7, 1, 3, 12, 1}, {2, 5, 15, 13, 7, 3, 1, 2, 1, 2}, {2, 6, 16, 17, 9, 3, 2, 2, 3, 2},
    };
    for (const auto &a : gd)
        for (const sf_layout lay : k_layouts) {
            for (int tf32 = 0; tf32 < 2; tf32++)
                t.push_back(row("conv", "grouped_dilated", cmp_conv_gd, SF_DT_F32, lay, {a[0], a[1], a[2], a[3]},
                                {a[4], a[5], a[6], a[7], tf32, a[8], a[9]}, cv_tol[tf32]));
            t.push_back(row("conv", "grouped_dilated", cmp_conv_gd, SF_DT_BF16, lay, {a[0], a[1], a[2], a[3]},
                            {a[4], a[5], a[6], a[7], 0, a[8], a[9]}, cv_tol[2]));
        }

    /* conv with windows that differ between the axes: Inception's 1x7 and
     * 7x1 (padded along their own axis) and 1x3, a 3x5 strided along the
     * height only, a 1x3 dilated along the width in two groups, at odd
     * sizes; p {out channels, kh, kw, sh, sw, ph, pw, dh, dw, groups} */
    const int rect[][14] = {
        {2, 8, 17, 17, 12, 1, 7, 1, 1, 0, 3, 1, 1, 1}, {2, 12, 17, 15, 8, 7, 1, 1, 1, 3, 0, 1, 1, 1},
        {2, 6, 9, 11, 10, 1, 3, 1, 1, 0, 1, 1, 1, 1},  {2, 5, 13, 12, 7, 3, 5, 2, 1, 1, 2, 1, 1, 1},
        {2, 6, 10, 14, 8, 1, 3, 1, 1, 0, 2, 1, 2, 2},
    };
    for (const auto &a : rect)
        for (const sf_layout lay : k_layouts) {
            for (int tf32 = 0; tf32 < 2; tf32++)
                t.push_back(row("conv", "rectangular", cmp_conv_rect, SF_DT_F32, lay, {a[0], a[1], a[2], a[3]},
                                {a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], tf32}, cv_tol[tf32]));
            t.push_back(row("conv", "rectangular", cmp_conv_rect, SF_DT_BF16, lay, {a[0], a[1], a[2], a[3]},
                            {a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], 0}, cv_tol[2]));
        }

    /* batchnorm (BatchNorm2d): the fp32 launchers at ResNet-18's first BN
     * (batch 2) and its last, odd ones, with the fused ReLU; then the _dt
     * launchers in fp32 and bf16: many row chunks, a ragged last chunk, C/8
     * odd (one channel group a block), C/8 not a power of two (whole rows a
     * block: 18 and 144 vectors; 257, more than a block's threads, split over
     * blocks), C % 8 != 0 (scalar), misaligned (the
     * scalar fallback), and with the residual add; the ReLU mask taken from
     * x; a captured forward+backward replaying bit-equal to the eager run.
     * Tolerances: y and dx; the per-channel fp32 outputs (statistics and
     * parameter gradients); the eval forward (bn, bn_dt), which bn_res holds
     * to y's bound */
    for (const sf_layout lay : k_layouts)
        for (const auto &a : std::vector<std::vector<int>>{{2, 64, 56, 56, 0}, {4, 512, 7, 7, 0}, {4, 3, 5, 7, 0},
                                                           {3, 6, 1, 1, 0}, {8, 16, 13, 13, 1}, {2, 128, 28, 28, 1}})
            t.push_back(row("batchnorm", "bn", cmp_bn, SF_DT_F32, lay, {a[0], a[1], a[2], a[3]}, {a[4]}, 1e-4, 1e-4,
                            {}, 1e-5));
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts) {
            const double tc = dt == SF_DT_F32 ? 1e-4 : 1e-3; /* the per-channel fp32 outputs */
            /* n, c, h, w, relu, misaligned */
            const int bn[][6] = {{2, 64, 56, 56, 1, 0}, {4, 512, 7, 7, 0, 0}, {2, 128, 28, 28, 1, 0},
                                 {16, 64, 32, 32, 1, 0}, {3, 64, 13, 11, 0, 0}, {3, 24, 5, 5, 1, 0},
                                 {8, 40, 13, 13, 1, 0}, {2, 16, 8, 8, 0, 0},   {4, 3, 5, 7, 0, 0},
                                 {4, 144, 28, 28, 1, 0}, {2, 1152, 7, 7, 0, 0}, {2, 2056, 3, 3, 1, 0}};
            for (const auto &a : bn)
                t.push_back(row("batchnorm", "bn_dt", cmp_bn_dt, dt, lay, {a[0], a[1], a[2], a[3]}, {a[4], a[5]}, 1e-4,
                                tc, {}, 1e-5));
            const int res[][6] = {{2, 64, 14, 14, 1, 0}, {3, 128, 7, 9, 0, 0}, {2, 24, 5, 5, 1, 1}, {2, 3, 5, 7, 1, 0}};
            for (const auto &a : res)
                t.push_back(row("batchnorm", "bn_res", cmp_bn_res, dt, lay, {a[0], a[1], a[2], a[3]}, {a[4], a[5]},
                                1e-4, 0, {}, 1e-4));
            t.push_back(row("batchnorm", "bn_dt", cmp_bn_dt, dt, lay, {3, 6, 1, 1}, {0, 0}, 1e-4, tc, {}, 1e-5));
            t.push_back(row("batchnorm", "bn_dt", cmp_bn_dt, dt, lay, {2, 64, 9, 9}, {1, 1}, 1e-4, tc, {}, 1e-5));
        }
    t.push_back(row("batchnorm", "mask_from_x", cmp_bn_mask_from_x, SF_DT_F32, {}, {}, 0));
    /* another activation fused (bf16 NHWC, the row kernels): every
     * activation of activation.h at EfficientNet's 96-channel expansion
     * shape scaled down, and ReLU6 and hardswish also at a many-chunk one;
     * then the refusals where the row kernels do not run (leaky ReLU, whose
     * slope the fused kernels do not carry, among them) */
    for (int a = SF_CUDA_ACT_RELU6; a <= SF_BN_ACT_LAST - SF_BN_ACT_BASE; a++)
        t.push_back(row("batchnorm", "bn_act", cmp_bn_act, SF_DT_BF16, SF_LAYOUT_NHWC, {2, 96, 14, 14}, {a}, 1e-4,
                        1e-3, {}, 1e-5));
    for (const int a : {(int)SF_CUDA_ACT_RELU6, (int)SF_CUDA_ACT_HARDSWISH, (int)SF_CUDA_ACT_SILU})
        t.push_back(row("batchnorm", "bn_act", cmp_bn_act, SF_DT_BF16, SF_LAYOUT_NHWC, {16, 40, 28, 28}, {a}, 1e-4,
                        1e-3, {}, 1e-5));
    t.push_back(row("batchnorm", "act_refused", cmp_bn_act_refused, SF_DT_F32, SF_LAYOUT_NHWC, {}, {}, 0));
    t.push_back(row("batchnorm", "act_refused", cmp_bn_act_refused, SF_DT_BF16, SF_LAYOUT_NCHW, {}, {}, 0));
    for (const sf_layout lay : k_layouts)
        t.push_back(row("batchnorm", "graph_replay", cmp_bn_graph_replay, SF_DT_F32, lay, {32, 64, 28}, {0}, 0));
    t.push_back(row("batchnorm", "graph_replay", cmp_bn_graph_replay, SF_DT_BF16, SF_LAYOUT_NHWC, {32, 64, 28}, {1}, 0));
    t.push_back(row("batchnorm", "graph_replay", cmp_bn_graph_replay, SF_DT_BF16, SF_LAYOUT_NHWC, {32, 512, 7}, {0}, 0));

    return t;
}
