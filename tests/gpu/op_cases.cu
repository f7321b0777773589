/* tests/gpu/op_cases.cu — the op case table (op_cases.h): every case of the
 * op families' compare-with-reference tests, one row each, built by loops
 * over element types and layouts as ggml's make_test_cases_eval builds its
 * cases. Each family's block says why its shapes are there; its compare
 * function (tests/gpu/ops/<family>.cu) says what the shape and parameters
 * mean. Every family runs in fp32 and bf16 (k_dtypes) and, where it has a
 * layout, NCHW and NHWC (k_layouts), in that order. */
#include "tests/gpu/op_cases.h"

#include <stdio.h>

extern "C" {
#include "gpu/model.h"
}

#include "gpu/cuda/activation.h"

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
                   std::vector<int> p, double tol, double tol_param = 0, std::vector<float> f = {})
{
    return op_case{op, check, run, dt, 0, SF_LAYOUT_NCHW, shape, p, f, tol, tol_param};
}
static op_case row(const char *op, const char *check, op_compare run, sf_dtype dt, sf_layout lay,
                   std::vector<int> shape, std::vector<int> p, double tol, double tol_param = 0,
                   std::vector<float> f = {})
{
    return op_case{op, check, run, dt, 1, lay, shape, p, f, tol, tol_param};
}

static const char *const ACT_CHECKS[] = {"relu6", "sigmoid", "silu", "hardswish", "hardsigmoid", "gelu", "gelu_tanh"};

std::vector<op_case> op_cases()
{
    std::vector<op_case> t;

    /* activation: the odd 3x3x7x5 map of the layer tests, a length that
     * leaves a vector tail one element off 16-byte alignment, and 2^16 in
     * place; elementwise, so one run covers both layouts */
    for (const sf_dtype dt : k_dtypes) {
        for (int act = 0; act <= SF_CUDA_ACT_GELU_TANH; act++) {
            t.push_back(row("activation", ACT_CHECKS[act], cmp_activation, dt, {3 * 3 * 7 * 5}, {act, 0, 0}, 1e-5));
            t.push_back(row("activation", ACT_CHECKS[act], cmp_activation, dt, {4099}, {act, 1, 0}, 1e-5));
            t.push_back(row("activation", ACT_CHECKS[act], cmp_activation, dt, {1 << 16}, {act, 0, 1}, 1e-5));
        }
        t.push_back(row("activation", "nan", cmp_activation_nan, dt, {}, {}, 0));
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

    /* mul: the odd sizes of the layer tests, an SE block's shape scaled
     * down, flat features (hw = 1: both forms agree), many rows per sample
     * with a partial channel tile; channel_scale (ConvNeXt's layer scale):
     * many chunks, more channels than a block, more rows than chunks */
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout lay : k_layouts) {
            for (int bc = 0; bc < 2; bc++) {
                t.push_back(row("mul", "mul", cmp_mul, dt, lay, {3, 3, 7, 5}, {bc}, 1e-6, 1e-5));
                t.push_back(row("mul", "mul", cmp_mul, dt, lay, {4, 40, 14, 14}, {bc}, 1e-6, 1e-5));
                t.push_back(row("mul", "mul", cmp_mul, dt, lay, {5, 17, 1, 1}, {bc}, 1e-6, 1e-5));
                t.push_back(row("mul", "mul", cmp_mul, dt, lay, {2, 40, 56, 56}, {bc}, 1e-6, 1e-5));
            }
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {3, 3, 7, 5}, {}, 1e-6, 1e-5));
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {8, 96, 14, 14}, {}, 1e-6, 1e-5));
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {2, 1100, 3, 3}, {}, 1e-6, 1e-5));
            t.push_back(row("mul", "channel_scale", cmp_channel_scale, dt, lay, {600, 4, 1, 1}, {}, 1e-6, 1e-5));
        }

    /* norm: layernorm2d at ConvNeXt's stem and block norm (96 channels),
     * odd sizes and channels, more positions than LN_CHUNKS, c > 32; then
     * layernorm over flat features (ConvNeXt's head: 768), hw = 1. The fp32
     * weight gradients of a bf16 run sum bf16-rounded products: 1e-4. */
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
        }

    return t;
}
