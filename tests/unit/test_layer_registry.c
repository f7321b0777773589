/* tests/unit/test_layer_registry.c — the layer-kind registry (gpu/layers.c)
 * on the specs of tests/unit/layer_kind_specs.h and on specs it must
 * refuse: parameters and buffers named and shaped as PyTorch's state_dict,
 * the CUDA backend's check of what it runs (naming the layer and the
 * reference backend otherwise), bad fields refused naming the layer and the
 * field, fields written back into a checkpoint's spec only when set, and a
 * DenseNet-sized concat chain within the layer limit. The kernels and the
 * kinds inside models: test_ref_layer_kinds.c. */
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

#include "gpu/layers.h"
#include "gpu/model.h"
#include "tests/unit/spec_error.h"
#include "tests/unit/layer_kind_specs.h"

static char err[256];

static const sf_layer *layer_named(const sf_model *m, const char *name)
{
    for (int i = 0; i < m->n_layers; i++)
        if (!strcmp(m->layers[i].name, name))
            return &m->layers[i];
    fail_msg("no layer %s", name);
    return NULL;
}

static void parameters_are_named_and_shaped_as_pytorch_does(void **state)
{
    static sf_model m;
    sf_param_desc pd[SF_PARAM_SLOTS];
    assert_int_equal(sf_model_from_json(GROUPED_SPEC, &m, err, sizeof err), 0);
    const sf_layer *g = layer_named(&m, "g");
    assert_int_equal(sf_layer_params(g, pd), 2);
    assert_string_equal(pd[0].suffix, "weight");
    assert_int_equal(pd[0].ndim, 4);
    assert_true(pd[0].shape[0] == 6 && pd[0].shape[1] == 2 && pd[0].shape[2] == 3 && pd[0].shape[3] == 3);
    assert_int_equal(g->n_w, 6 * 2 * 9);
    assert_int_equal(g->out_h, 8); /* 8 + 4 - 2*2 - 1 + 1 */
    assert_true(layer_named(&m, "lr")->negative_slope == 0.2f);
    assert_true(layer_named(&m, "el")->alpha == 0.5f);
    assert_true(layer_named(&m, "sp")->beta == 2.f && layer_named(&m, "sp")->threshold == 2.f);
    assert_true(layer_named(&m, "af")->affine_scale == -1.5f && layer_named(&m, "af")->affine_shift == 0.25f);
    assert_int_equal(sf_layer_params(layer_named(&m, "af"), pd), 0);
    assert_int_equal(sf_layer_params(layer_named(&m, "pr"), pd), 1); /* nn.PReLU(6).weight [6] */
    assert_true(!strcmp(pd[0].suffix, "weight") && pd[0].ndim == 1 && pd[0].shape[0] == 6);
    assert_int_equal(sf_layer_params(layer_named(&m, "pr1"), pd), 1);
    assert_true(pd[0].ndim == 1 && pd[0].shape[0] == 1 && layer_named(&m, "pr1")->num_parameters == 1);
    const sf_layer *r13 = layer_named(&m, "r13"), *r31 = layer_named(&m, "r31");
    assert_int_equal(sf_layer_params(r13, pd), 2);
    assert_true(pd[0].shape[0] == 6 && pd[0].shape[1] == 6 && pd[0].shape[2] == 1 && pd[0].shape[3] == 3);
    assert_true(r13->out_h == 8 && r13->out_w == 8);
    assert_int_equal(sf_layer_params(r31, pd), 2);
    assert_true(pd[0].shape[2] == 3 && pd[0].shape[3] == 1);
    assert_true(r31->out_h == 4 && r31->out_w == 8); /* (8 + 2 - 3) / 2 + 1, 8 */
    assert_true(!sf_layer_conv_square(r13) && !sf_layer_conv_square(r31) && sf_layer_conv_square(g));
    /* channel_conv1d holds nn.Conv1d(1, 1, k)'s weight [1, 1, k] and bias [1] */
    static sf_model e;
    assert_int_equal(sf_model_from_json(ECA_SPEC, &e, err, sizeof err), 0);
    assert_int_equal(sf_layer_params(layer_named(&e, "eca.conv"), pd), 1);
    assert_true(!strcmp(pd[0].suffix, "weight") && pd[0].ndim == 3 && pd[0].shape[0] == 1 && pd[0].shape[1] == 1 &&
                pd[0].shape[2] == 3);
    assert_int_equal(sf_layer_params(layer_named(&e, "f.conv"), pd), 2);
    assert_true(pd[0].ndim == 3 && pd[0].shape[2] == 5 && !strcmp(pd[1].suffix, "bias") && pd[1].ndim == 1 &&
                pd[1].shape[0] == 1);
    assert_true(layer_named(&e, "eca.conv")->out_ch == 6 && layer_named(&e, "f.conv")->flat);
    /* a norm without a bias holds its weight alone; square holds nothing */
    static sf_model mf;
    assert_int_equal(sf_model_from_json(METAFORMER_SPEC, &mf, err, sizeof err), 0);
    for (int i = 0; i < 3; i++) {
        const sf_layer *L = layer_named(&mf, (const char *[]){"stem.norm", "norm1", "head.norm"}[i]);
        assert_int_equal(sf_layer_params(L, pd), 1);
        assert_true(!strcmp(pd[0].suffix, "weight") && pd[0].ndim == 1 && pd[0].shape[0] == (i < 2 ? 6 : 8) &&
                    L->n_b == 0);
    }
    assert_int_equal(sf_layer_params(layer_named(&mf, "act.square"), pd), 0);
    const sf_layer *bn1d = layer_named(&m, "bn1d"); /* nn.BatchNorm1d on [N, 6]: 6 channels of 1x1 */
    assert_int_equal(sf_layer_params(bn1d, pd), 2);
    assert_true(pd[0].ndim == 1 && pd[0].shape[0] == 6 && bn1d->flat && bn1d->out_ch == 6);

    assert_int_equal(sf_model_from_json(CONVNEXT_SPEC, &m, err, sizeof err), 0);
    const sf_layer *ls = layer_named(&m, "blk");
    assert_int_equal(sf_layer_params(ls, pd), 1);
    assert_string_equal(pd[0].suffix, "layer_scale");
    assert_true(pd[0].ndim == 3 && pd[0].shape[0] == 4 && pd[0].shape[1] == 1 && pd[0].shape[2] == 1);
    const sf_layer *pw = layer_named(&m, "block.3");
    assert_int_equal(sf_layer_params(pw, pd), 2);
    assert_true(pd[0].ndim == 2 && pd[0].shape[0] == 8 && pd[0].shape[1] == 4);
    assert_true(pw->out_ch == 8 && pw->out_h == 4 && pw->out_w == 4);
    assert_int_equal(sf_layer_out_is_features(pw), 0);
    const sf_layer *ln = layer_named(&m, "head.norm");
    assert_int_equal(sf_layer_params(ln, pd), 2);
    assert_true(pd[0].shape[0] == 16 && !strcmp(pd[1].suffix, "bias"));
    assert_true(fabsf(layer_named(&m, "stem.1")->eps - 1e-6f) < 1e-12f);
    /* nn.GroupNorm's weight and bias [C]; without affine none, as the
     * module's state_dict holds none */
    const sf_layer *gn = layer_named(&m, "gn"), *inorm = layer_named(&m, "inorm");
    assert_int_equal(sf_layer_params(gn, pd), 2);
    assert_true(pd[0].ndim == 1 && pd[0].shape[0] == 4 && !strcmp(pd[1].suffix, "bias") && gn->affine == 1);
    assert_int_equal(sf_layer_params(inorm, pd), 0);
    assert_true(inorm->n_w == 0 && inorm->n_b == 0 && inorm->affine == 0 && sf_layer_param_count(inorm) == 0);

    assert_int_equal(sf_model_from_json(DENSE_SPEC, &m, err, sizeof err), 0);
    assert_int_equal(layer_named(&m, "cat2")->out_ch, 8);
    assert_int_equal(layer_named(&m, "p2")->out_h, 3);
    assert_int_equal(layer_named(&m, "p3")->out_h, 2);
    assert_true(fabsf(layer_named(&m, "bn")->momentum - 0.2f) < 1e-7f);
    /* scale_shift's weight and bias in the shape the module holds them:
     * [1,C,1,1] (a map's), [1] without a bias (one value), [1,1,C] (ResMLP's) */
    assert_int_equal(sf_model_from_json("{\"input\":[4,8,8],\"classes\":4,\"layers\":["
                                        "{\"type\":\"scale_shift\",\"name\":\"ss\",\"num_parameters\":4,"
                                        "\"param_shape\":\"[1,C,1,1]\"},{\"type\":\"scale_shift\",\"name\":\"g\","
                                        "\"bias\":false},{\"type\":\"to_tokens\"},{\"type\":\"scale_shift\","
                                        "\"name\":\"t\",\"num_parameters\":4,\"param_shape\":\"[1,1,C]\"},"
                                        "{\"type\":\"token_mean\"},{\"type\":\"linear\",\"out\":4}]}",
                                        &m, err, sizeof err), 0);
    sf_param_desc ss[SF_PARAM_SLOTS];
    assert_int_equal(sf_layer_params(layer_named(&m, "ss"), ss), 2);
    assert_true(ss[0].ndim == 4 && ss[0].shape[0] == 1 && ss[0].shape[1] == 4 && ss[0].shape[3] == 1 &&
                !strcmp(ss[1].suffix, "bias") && ss[1].ndim == 4 && ss[1].shape[1] == 4);
    assert_int_equal(sf_layer_params(layer_named(&m, "g"), ss), 1);
    assert_true(ss[0].ndim == 1 && ss[0].shape[0] == 1 && !strcmp(ss[0].suffix, "weight"));
    assert_int_equal(sf_layer_params(layer_named(&m, "t"), ss), 2);
    assert_true(ss[0].ndim == 3 && ss[0].shape[0] == 1 && ss[0].shape[1] == 1 && ss[0].shape[2] == 4);
    /* a kernel larger than its 2x2 input: with ceil_mode PyTorch pools the
     * whole map into one output; without it the kernel does not fit */
    assert_int_equal(sf_model_from_json("{\"input\":[4,2,2],\"classes\":4,\"layers\":["
                                        "{\"type\":\"maxpool2d\",\"name\":\"mp\",\"k\":3,\"stride\":2,"
                                        "\"ceil_mode\":true},{\"type\":\"avgpool2d\",\"name\":\"ap\",\"k\":3,"
                                        "\"stride\":2,\"ceil_mode\":true,\"inputs\":[-1]},"
                                        "{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":4}]}",
                                        &m, err, sizeof err), 0);
    assert_true(layer_named(&m, "mp")->out_h == 1 && layer_named(&m, "mp")->out_w == 1);
    assert_true(layer_named(&m, "ap")->out_h == 1 && layer_named(&m, "ap")->out_w == 1);

    /* nn.MultiheadAttention's four parameters, contiguous in state_dict
     * order; the class token and the position embedding keyed by the
     * layer's name alone, as torchvision's VisionTransformer holds them. */
    assert_int_equal(sf_model_from_json(VIT_SPEC, &m, err, sizeof err), 0);
    const sf_layer *at = layer_named(&m, "attn");
    assert_int_equal(sf_layer_params(at, pd), 4);
    const char *const att_names[] = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
    const size_t att_n[] = {3 * 8 * 8, 3 * 8, 8 * 8, 8};
    for (int j = 0; j < 4; j++) {
        assert_string_equal(pd[j].suffix, att_names[j]);
        assert_int_equal(at->p_n[j], att_n[j]);
        assert_int_equal(at->p_off[j], j ? at->p_off[j - 1] + at->p_n[j - 1] : at->w_off);
    }
    assert_true(pd[0].ndim == 2 && pd[0].shape[0] == 24 && pd[0].shape[1] == 8);
    assert_true(at->w_off == at->p_off[0] && at->b_off == at->p_off[1] && at->n_b == 24);
    assert_int_equal(sf_layer_param_count(at), 3 * 64 + 24 + 64 + 8);
    char key[SF_LAYER_NAME_MAX + 24];
    const sf_layer *cls = layer_named(&m, "class_token");
    assert_int_equal(sf_layer_params(cls, pd), 1);
    sf_layer_param_key(cls, &pd[0], key, sizeof key);
    assert_string_equal(key, "class_token");
    assert_true(pd[0].ndim == 3 && pd[0].shape[0] == 1 && pd[0].shape[1] == 1 && pd[0].shape[2] == 8);
    const sf_layer *pe = layer_named(&m, "encoder.pos_embedding");
    assert_int_equal(sf_layer_params(pe, pd), 1);
    sf_layer_param_key(pe, &pd[0], key, sizeof key);
    assert_string_equal(key, "encoder.pos_embedding");
    assert_true(pd[0].ndim == 3 && pd[0].shape[0] == 1 && pd[0].shape[1] == 5 && pd[0].shape[2] == 8);
    sf_layer_params(at, pd);
    sf_layer_param_key(at, &pd[2], key, sizeof key);
    assert_string_equal(key, "attn.out_proj.weight");
    /* Tokens [T, C]: 4 patches, then 5 with the class token; the MLP's
     * linear layers per token; the class token out as 8 features. */
    const sf_layer *tt = layer_named(&m, "to_tokens");
    assert_true(tt->tokens && tt->out_h == 4 && tt->out_ch == 8 && tt->out_w == 1 && !tt->flat);
    assert_true(cls->tokens && cls->out_h == 5);
    const sf_layer *fc1 = layer_named(&m, "mlp.0");
    assert_true(fc1->tokens && fc1->out_h == 5 && fc1->out_ch == 16 && fc1->n_w == 16 * 8);
    assert_int_equal(sf_layer_out_is_features(fc1), 0);
    const sf_layer *sel = layer_named(&m, "select_token");
    assert_true(!sel->tokens && sel->flat && sel->out_elems == 8 && sf_layer_out_is_features(sel));
    assert_int_equal(layer_named(&m, "encoder.ln")->n_w, 8);
    /* Every kind has its row and its hooks. */
    for (int k = 0; k < SF_L_KIND_COUNT; k++) {
        const sf_layer_kind_info *info = sf_layer_info((sf_layer_kind)k);
        assert_non_null(info);
        assert_true(info->view || (info->ref_fwd && info->ref_bwd));
        assert_int_equal(sf_layer_kind_from_name(info->name), k);
    }
}

#define HEAD_TOKENS "{\"input\":[3,8,8],\"classes\":4,\"layers\":[{\"type\":\"conv2d\",\"out\":4,\"k\":4,\"stride\":4}," \
                    "{\"type\":\"to_tokens\"},"
static void the_cuda_check_names_the_layer_and_the_reference_backend(void **state)
{
    static sf_model m;
    assert_int_equal(sf_model_from_json(SE_SPEC, &m, err, sizeof err), 0);
    assert_int_equal(sf_layer_cuda_check(&m, 0, err, sizeof err), 0);
    assert_int_equal(sf_layer_cuda_check(&m, 1, err, sizeof err), 0); /* groups 4: cuDNN runs it */
    assert_int_equal(sf_layer_cuda_check(&m, 3, err, sizeof err), 0); /* adaptive_avgpool2d */
    /* The activations and the squeeze-and-excitation product run on CUDA. */
    assert_int_equal(sf_layer_cuda_check(&m, 2, err, sizeof err), 0); /* hardswish */
    assert_int_equal(sf_layer_cuda_check(&m, 5, err, sizeof err), 0); /* relu6 */
    assert_int_equal(sf_layer_cuda_check(&m, 7, err, sizeof err), 0); /* hardsigmoid */
    assert_int_equal(sf_layer_cuda_check(&m, 8, err, sizeof err), 0); /* mul */
    /* A kind the CUDA backend has no row for is refused naming the layer. */
    m.layers[2].kind = SF_L_KIND_COUNT;
    assert_int_equal(sf_layer_cuda_check(&m, 2, err, sizeof err), -1);
    assert_non_null(strstr(err, "layer 2 \"a\""));
    assert_non_null(strstr(err, "pipeline.backend=ref"));
    /* A Vision Transformer's every layer runs on CUDA (the token kinds,
     * attention, and linear, layernorm, gelu, dropout and add on tokens). */
    assert_int_equal(sf_model_from_json(VIT_SPEC, &m, err, sizeof err), 0);
    for (int i = 0; i < m.n_layers; i++)
        if (sf_layer_cuda_check(&m, i, err, sizeof err) != 0)
            fail_msg("vit layer %d refused: %s", i, err);
    /* A kind the CUDA backend runs on maps (hardswish) is refused on
     * tokens, because its row does not say it runs them too. */
    assert_int_equal(sf_model_from_json("{\"input\":[3,8,8],\"classes\":4,\"layers\":["
                                         "{\"type\":\"conv2d\",\"out\":4,\"k\":4,\"stride\":4},"
                                         "{\"type\":\"to_tokens\"},{\"type\":\"hardswish\",\"name\":\"hs\"},"
                                         "{\"type\":\"select_token\"}]}", &m, err, sizeof err), 0);
    assert_int_equal(sf_layer_cuda_check(&m, 2, err, sizeof err), -1);
    assert_non_null(strstr(err, "layer 2 \"hs\""));
    assert_non_null(strstr(err, "token sequence"));
    /* grn runs on the reference backend only: the check names the layer
     * and the reference backend. */
    assert_int_equal(sf_model_from_json("{\"input\":[3,8,8],\"classes\":4,\"layers\":["
                                        "{\"type\":\"conv2d\",\"out\":4,\"k\":1},{\"type\":\"grn\",\"name\":\"g\"},"
                                        "{\"type\":\"global_avgpool\"},{\"type\":\"flatten\"}]}", &m, err, sizeof err), 0);
    assert_int_equal(sf_layer_cuda_check(&m, 1, err, sizeof err), -1);
    assert_true(strstr(err, "layer 1 \"g\"") && strstr(err, "pipeline.backend=ref"));
    /* MetaFormer v2's every layer runs on CUDA: the norms without a bias,
     * square (on tokens too), scale_shift. */
    assert_int_equal(sf_model_from_json(METAFORMER_SPEC, &m, err, sizeof err), 0);
    for (int i = 0; i < m.n_layers; i++)
        if (sf_layer_cuda_check(&m, i, err, sizeof err) != 0)
            fail_msg("metaformer layer %d refused: %s", i, err);
    /* affine, prelu and pad run on CUDA: their rows say cuda = 1 since
     * their op tests passed on a GPU */
    assert_int_equal(sf_model_from_json(GROUPED_SPEC, &m, err, sizeof err), 0);
    const int af = (int)(layer_named(&m, "af") - m.layers);
    assert_int_equal(sf_layer_cuda_check(&m, af, err, sizeof err), 0);
    const int pr = (int)(layer_named(&m, "pr") - m.layers);
    assert_int_equal(sf_layer_cuda_check(&m, pr, err, sizeof err), 0);
    assert_int_equal(sf_model_from_json(PAD_SPEC, &m, err, sizeof err), 0);
    assert_int_equal(sf_layer_cuda_check(&m, 0, err, sizeof err), 0);
    /* clamp runs on CUDA on maps and on tokens */
    assert_int_equal(sf_model_from_json(HEAD_TOKENS "{\"type\":\"clamp\",\"name\":\"cl\",\"min\":-1,\"max\":1},"
                                        "{\"type\":\"select_token\"}]}", &m, err, sizeof err), 0);
    assert_int_equal(sf_layer_cuda_check(&m, 2, err, sizeof err), 0);
}

#define HEAD "{\"input\":[4,8,8],\"classes\":4,\"layers\":["
static void bad_specs_of_these_kinds_fail_naming_the_layer_and_field(void **state)
{
    expect_json_error(HEAD "{\"type\":\"conv2d\",\"out\":6,\"k\":1,\"groups\":3}]}", "layer 0", "groups");
    expect_json_error(HEAD "{\"type\":\"conv2d\",\"out\":4,\"k\":1,\"dilation\":0}]}", "layer 0", "dilation");
    expect_json_error(HEAD "{\"type\":\"conv2d\",\"out\":4,\"k\":[0,3]}]}", "layer 0", "\"k\"");
    expect_json_error(HEAD "{\"type\":\"conv2d\",\"out\":4,\"k\":[1,3,3]}]}", "layer 0", "[h, w]");
    expect_json_error(HEAD "{\"type\":\"conv2d\",\"out\":4,\"k\":[1,3],\"pad\":[0,-1]}]}", "layer 0", "\"pad\"");
    expect_json_error(HEAD "{\"type\":\"conv2d\",\"out\":4,\"k\":[1,3],\"stride\":[1.5,1]}]}", "layer 0",
                      "\"stride\"");
    expect_json_error(HEAD "{\"type\":\"conv2d\",\"out\":4,\"k\":[1,9]}]}", "layer 0", "does not fit");
    expect_json_error(HEAD "{\"type\":\"maxpool2d\",\"k\":[2,3]}]}", "layer 0", "\"k\"");
    expect_json_error(HEAD "{\"type\":\"scale_shift\",\"num_parameters\":3}]}", "layer 0", "num_parameters");
    expect_json_error(HEAD "{\"type\":\"scale_shift\",\"param_shape\":\"[C,C]\"}]}", "layer 0", "param_shape");
    expect_json_error("{\"input\":[4,2,2],\"classes\":4,\"layers\":[{\"type\":\"maxpool2d\",\"k\":3,"
                      "\"stride\":2}]}", "layer 0", "does not fit");
    expect_json_error("{\"input\":[4,2,2],\"classes\":4,\"layers\":[{\"type\":\"maxpool2d\",\"k\":4,"
                      "\"stride\":2,\"ceil_mode\":true}]}", "layer 0", "does not fit");
    expect_json_error(HEAD "{\"type\":\"relu\"},{\"type\":\"maxpool2d\",\"k\":2},"
                      "{\"type\":\"concat\",\"inputs\":[0,1]}]}", "layer 2", "equal H,W");
    expect_json_error(HEAD "{\"type\":\"relu\"},{\"type\":\"concat\",\"inputs\":[0]}]}", "layer 1", "concat");
    expect_json_error(HEAD "{\"type\":\"relu\"},{\"type\":\"maxpool2d\",\"k\":2},"
                      "{\"type\":\"mul\",\"inputs\":[0,1]}]}", "layer 2", "[4,1,1]");
    expect_json_error(HEAD "{\"type\":\"stochastic_depth\",\"p\":0.1,\"mode\":\"batch\"}]}", "layer 0", "\"row\"");
    expect_json_error(HEAD "{\"type\":\"stochastic_depth\"}]}", "layer 0", "\"p\"");
    expect_json_error(HEAD "{\"type\":\"dropout\",\"p\":1.5}]}", "layer 0", "\"p\"");
    expect_json_error(HEAD "{\"type\":\"dropout2d\",\"p\":-0.1}]}", "layer 0", "\"p\"");
    expect_json_error(HEAD "{\"type\":\"log_softmax\"}]}", "layer 0", "flatten it first");
    expect_json_error(HEAD "{\"type\":\"groupnorm\",\"num_groups\":3}]}", "layer 0", "divide");
    expect_json_error(HEAD "{\"type\":\"groupnorm\"}]}", "layer 0", "\"num_groups\"");
    expect_json_error(HEAD "{\"type\":\"groupnorm\",\"num_groups\":4,\"affine\":2}]}", "layer 0", "\"affine\"");
    expect_json_error(HEAD "{\"type\":\"groupnorm\",\"num_groups\":4,\"affine\":\"no\"}]}", "layer 0",
                      "\"affine\"");
    expect_json_error(HEAD "{\"type\":\"relu\",\"affine\":false}]}", "layer 0", "\"affine\"");
    expect_json_error(HEAD "{\"type\":\"upsample\",\"scale\":0}]}", "layer 0", "\"scale\"");
    expect_json_error(HEAD "{\"type\":\"pixel_shuffle\",\"factor\":3}]}", "layer 0", "divide");
    expect_json_error(HEAD "{\"type\":\"pixel_shuffle\"}]}", "layer 0", "\"factor\"");
    expect_json_error(HEAD "{\"type\":\"pixel_unshuffle\",\"factor\":3}]}", "layer 0", "divide");
    expect_json_error(HEAD "{\"type\":\"pixel_unshuffle\",\"factor\":0}]}", "layer 0", "\"factor\"");
    expect_json_error(HEAD "{\"type\":\"upsample\",\"scale\":64},{\"type\":\"upsample\",\"scale\":64}]}", "layer 1",
                      "at most");
    expect_json_error(HEAD "{\"type\":\"flatten\"},{\"type\":\"upsample\",\"scale\":2}]}", "layer 1", "flattened");
    expect_json_error(HEAD "{\"type\":\"upsample\"}]}", "layer 0", "one of them");
    expect_json_error(HEAD "{\"type\":\"upsample\",\"scale\":2,\"size\":[8,8]}]}", "layer 0", "one of them");
    expect_json_error(HEAD "{\"type\":\"upsample\",\"size\":[0,8]}]}", "layer 0", "\"size\"");
    expect_json_error(HEAD "{\"type\":\"upsample\",\"size\":[8]}]}", "layer 0", "\"size\"");
    expect_json_error(HEAD "{\"type\":\"upsample\",\"scale\":2,\"mode\":\"bicubic\"}]}", "layer 0",
                      "\"bilinear\"");
    expect_json_error(HEAD "{\"type\":\"upsample\",\"scale\":2,\"align_corners\":true}]}", "layer 0",
                      "\"align_corners\"");
    expect_json_error(HEAD "{\"type\":\"to_tokens\"},{\"type\":\"groupnorm\",\"num_groups\":1}]}", "layer 1",
                      "token sequence");
    expect_json_error(HEAD "{\"type\":\"flatten\"},{\"type\":\"dropout2d\"}]}", "layer 1", "flattened");
    expect_json_error(HEAD "{\"type\":\"gelu\",\"approximate\":\"fast\"}]}", "layer 0", "approximate");
    expect_json_error(HEAD "{\"type\":\"leaky_relu\",\"negative_slope\":\"0.2\"}]}", "layer 0", "negative_slope");
    expect_json_error(HEAD "{\"type\":\"leaky_relu\",\"negative_slope\":1e39}]}", "layer 0", "negative_slope");
    expect_json_error(HEAD "{\"type\":\"elu\",\"alpha\":\"1\"}]}", "layer 0", "alpha");
    expect_json_error(HEAD "{\"type\":\"elu\",\"alpha\":-1e39}]}", "layer 0", "alpha");
    expect_json_error(HEAD "{\"type\":\"selu\",\"alpha\":2}]}", "layer 0", "alpha");
    expect_json_error(HEAD "{\"type\":\"softplus\",\"beta\":0}]}", "layer 0", "\"beta\" must not be 0");
    expect_json_error(HEAD "{\"type\":\"softplus\",\"beta\":1e39}]}", "layer 0", "beta");
    expect_json_error(HEAD "{\"type\":\"softplus\",\"threshold\":1e39}]}", "layer 0", "threshold");
    expect_json_error(HEAD "{\"type\":\"affine\",\"scale\":\"2\"}]}", "layer 0", "scale");
    expect_json_error(HEAD "{\"type\":\"affine\",\"scale\":1e39}]}", "layer 0", "scale");
    expect_json_error(HEAD "{\"type\":\"affine\",\"shift\":-1e39}]}", "layer 0", "shift");
    expect_json_error(HEAD "{\"type\":\"affine\",\"bias\":1}]}", "layer 0", "bias");
    expect_json_error(HEAD "{\"type\":\"clamp\"}]}", "layer 0", "needs \"min\", \"max\" or both");
    expect_json_error(HEAD "{\"type\":\"clamp\",\"grad\":\"hardtanh\"}]}", "layer 0", "needs \"min\"");
    expect_json_error(HEAD "{\"type\":\"clamp\",\"min\":1,\"max\":0.5}]}", "layer 0", "\"min\" 1 is above \"max\" 0.5");
    expect_json_error(HEAD "{\"type\":\"clamp\",\"min\":1e39}]}", "layer 0", "min");
    expect_json_error(HEAD "{\"type\":\"clamp\",\"max\":-1e39}]}", "layer 0", "max");
    expect_json_error(HEAD "{\"type\":\"clamp\",\"min\":0,\"grad\":\"closed\"}]}", "layer 0", "grad");
    expect_json_error(HEAD "{\"type\":\"prelu\",\"num_parameters\":2}]}", "layer 0", "1 or the input's 4");
    /* channel_conv1d: a pooled map or features only, a kernel that keeps the channels */
    expect_json_error(HEAD "{\"type\":\"channel_conv1d\",\"k\":3,\"pad\":1}]}", "layer 0", "[C,1,1] map");
    expect_json_error(HEAD "{\"type\":\"global_avgpool\"},{\"type\":\"channel_conv1d\",\"k\":3}]}", "layer 1",
                      "2 * pad + 1");
    expect_json_error(HEAD "{\"type\":\"global_avgpool\"},{\"type\":\"channel_conv1d\",\"pad\":1}]}", "layer 1",
                      "\"k\"");
    expect_json_error(HEAD "{\"type\":\"to_tokens\"},{\"type\":\"channel_conv1d\",\"k\":1}]}", "layer 1",
                      "token sequence");
    /* to_map: a token sequence whose count its size holds, back into a map */
    expect_json_error(HEAD "{\"type\":\"to_map\",\"size\":[8,8]}]}", "layer 0", "not a token sequence");
    expect_json_error(HEAD "{\"type\":\"to_tokens\"},{\"type\":\"to_map\"}]}", "layer 1", "\"size\"");
    expect_json_error(HEAD "{\"type\":\"to_tokens\"},{\"type\":\"to_map\",\"size\":[4,8]}]}", "layer 1",
                      "size [4, 8] holds 32 tokens; the input has 64");
    /* pad: F.pad's bounds (input 8x8), crops and what PyTorch refuses */
    expect_json_error(HEAD "{\"type\":\"pad\"}]}", "layer 0", "missing \"pad\"");
    expect_json_error(HEAD "{\"type\":\"pad\",\"pad\":[1,1,1]}]}", "layer 0", "[left, right, top, bottom]");
    expect_json_error(HEAD "{\"type\":\"pad\",\"pad\":[-1,0,0,0]}]}", "layer 0", "\"pad\" must be");
    expect_json_error(HEAD "{\"type\":\"pad\",\"pad\":[0,1025,0,0]}]}", "layer 0", "[0,1024]");
    expect_json_error(HEAD "{\"type\":\"pad\",\"pad\":[1,1.5,0,0]}]}", "layer 0", "\"pad\"");
    expect_json_error(HEAD "{\"type\":\"pad\",\"pad\":[0,0,8,0],\"mode\":\"reflect\"}]}", "layer 0",
                      "below the input's height 8");
    expect_json_error(HEAD "{\"type\":\"pad\",\"pad\":[0,9,0,0],\"mode\":\"circular\"}]}", "layer 0",
                      "at most the input's width 8");
    expect_json_error(HEAD "{\"type\":\"pad\",\"pad\":[1,1,1,1],\"mode\":\"reflect\",\"value\":1}]}",
                      "layer 0", "\"value\" applies to mode \"constant\"");
    expect_json_error(HEAD "{\"type\":\"pad\",\"pad\":[1,1,1,1],\"mode\":\"symmetric\"}]}", "layer 0",
                      "\"mode\" must be one of");
    expect_json_error(HEAD "{\"type\":\"pad\",\"pad\":[1,1,1,1],\"value\":1e39}]}", "layer 0", "\"value\"");
    expect_json_error(HEAD "{\"type\":\"flatten\"},{\"type\":\"pad\",\"pad\":[1,1,1,1]}]}", "layer 1",
                      "flattened");
    expect_json_error(HEAD "{\"type\":\"prelu\",\"num_parameters\":0}]}", "layer 0", "num_parameters");
    expect_json_error(HEAD "{\"type\":\"to_tokens\"},{\"type\":\"prelu\"}]}", "layer 1", "token sequence");
    expect_json_error(HEAD "{\"type\":\"layernorm\"}]}", "layer 0", "layernorm2d");
    expect_json_error(HEAD "{\"type\":\"batchnorm2d\",\"eps\":0}]}", "layer 0", "eps");
    expect_json_error(HEAD "{\"type\":\"to_tokens\"},{\"type\":\"batchnorm2d\"}]}", "layer 1", "token sequence");
    expect_json_error(HEAD "{\"type\":\"adaptive_avgpool2d\",\"out\":[0,1]}]}", "layer 0", "\"out\"");
    expect_json_error(HEAD "{\"type\":\"adaptive_avgpool2d\",\"out\":3}]}", "layer 0", "\"out\"");
    expect_json_error(HEAD "{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":4,\"over\":\"channels\"}]}",
                      "layer 1", "flattened");
    expect_json_error(HEAD "{\"type\":\"maxpool2d\",\"k\":2,\"dilation\":2}]}", "layer 0", "dilation");
    expect_json_error(HEAD "{\"type\":\"avgpool2d\",\"k\":2,\"pad\":2}]}", "layer 0", "pad");
    expect_json_error(HEAD "{\"type\":\"channel_shuffle\",\"groups\":3}]}", "layer 0", "groups 3");
    expect_json_error(HEAD "{\"type\":\"channel_shuffle\"}]}", "layer 0", "\"groups\"");
    expect_json_error(HEAD "{\"type\":\"channel_slice\",\"start\":3,\"count\":2}]}", "layer 0", "[3, 5)");
    expect_json_error(HEAD "{\"type\":\"channel_slice\",\"start\":0}]}", "layer 0", "\"count\"");
    expect_json_error(HEAD "{\"type\":\"flatten\"},{\"type\":\"channel_slice\",\"start\":0,\"count\":1}]}",
                      "layer 1", "flattened");
    /* Token sequences: the kinds that need one, and those that need a map. */
#define TOK HEAD "{\"type\":\"to_tokens\"},"
    expect_json_error(HEAD "{\"type\":\"class_token\"}]}", "layer 0", "token sequence");
    expect_json_error(HEAD "{\"type\":\"self_attention\",\"num_heads\":1}]}", "layer 0", "token sequence");
    expect_json_error(HEAD "{\"type\":\"flatten\"},{\"type\":\"select_token\"}]}", "layer 1", "token sequence");
    expect_json_error(TOK "{\"type\":\"self_attention\",\"num_heads\":3}]}", "layer 1", "num_heads");
    expect_json_error(TOK "{\"type\":\"self_attention\"}]}", "layer 1", "num_heads");
    expect_json_error(TOK "{\"type\":\"self_attention\",\"num_heads\":2,\"dropout\":0.1}]}", "layer 1",
                      "dropout");
    expect_json_error(TOK "{\"type\":\"self_attention\",\"num_heads\":2,\"embed_dim\":8}]}", "layer 1",
                      "does not match");
    expect_json_error(TOK "{\"type\":\"conv2d\",\"out\":4,\"k\":1}]}", "layer 1", "token sequence");
    expect_json_error(TOK "{\"type\":\"global_avgpool\"}]}", "layer 1", "token sequence");
    expect_json_error(TOK "{\"type\":\"linear\",\"out\":4,\"over\":\"channels\"}]}", "layer 1", "token sequence");
    expect_json_error(TOK "{\"type\":\"layernorm2d\"}]}", "layer 1", "token sequence");
    expect_json_error(TOK "{\"type\":\"concat\",\"inputs\":[0,0]}]}", "layer 1", "token sequence");
    expect_json_error(TOK "{\"type\":\"add\",\"inputs\":[-1,0]}]}", "layer 1", "tokens");
    expect_json_error("{\"input\":[4,200,200],\"classes\":4,\"layers\":[{\"type\":\"to_tokens\"}]}", "layer 0",
                      "tokens is too many");
    /* A model may not end in a token sequence: it is no classifier's [K]. */
    expect_json_error("{\"input\":[4,2,2],\"classes\":4,\"layers\":[{\"type\":\"to_tokens\"}]}", "layer 0",
                      "classes");
#undef TOK
}

static void expect_fields_json(const sf_layer *L, const char *want)
{
    cJSON *o = cJSON_CreateObject();
    sf_layer_fields_to_json(L, o);
    char *got = cJSON_PrintUnformatted(o);
    if (strcmp(got, want))
        fail_msg("%s fields written as %s, want %s", L->name, got, want);
    cJSON_free(got);
    cJSON_Delete(o);
}

/* A checkpoint's metadata carries the model spec, compared as a string when
 * a checkpoint is loaded: fields without SF_FF_IF_SET are always written, the
 * SF_FF_IF_SET ones only when set, so a model that sets none of those reads
 * back the same string from files written by builds without them. */
static void fields_marked_if_set_are_written_back_only_when_set(void **state)
{
    /* to_map's size, its shape and its CUDA check */
    {
        sf_model tm;
        assert_int_equal(sf_model_from_json(HEAD "{\"type\":\"to_tokens\"},{\"type\":\"to_map\",\"size\":[2,32]},"
                                            "{\"type\":\"conv2d\",\"out\":4,\"k\":1}]}", &tm, err,
                                            sizeof err), 0);
        const sf_layer *tl = &tm.layers[1];
        assert_true(tl->out_ch == 4 && tl->out_h == 2 && tl->out_w == 32 && !tl->tokens && !tl->flat);
        assert_int_equal(sf_layer_cuda_check(&tm, 1, err, sizeof err), 0);
        expect_fields_json(tl, "{\"size\":[2,32]}");
    }
    static sf_model m;
    assert_int_equal(sf_model_from_json(HEAD "{\"type\":\"conv2d\",\"out\":4,\"k\":3,\"pad\":1,\"bias\":false},"
                                        "{\"type\":\"batchnorm2d\"},{\"type\":\"maxpool2d\",\"k\":2},"
                                        "{\"type\":\"conv2d\",\"out\":4,\"k\":1,\"groups\":2},"
                                        "{\"type\":\"batchnorm2d\",\"momentum\":0.5},"
                                        "{\"type\":\"maxpool2d\",\"k\":2,\"ceil_mode\":true},"
                                        "{\"type\":\"avgpool2d\",\"k\":1},"
                                        "{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":4},"
                                        "{\"type\":\"leaky_relu\"},{\"type\":\"leaky_relu\",\"negative_slope\":-2},"
                                        "{\"type\":\"elu\"},{\"type\":\"softplus\"},"
                                        "{\"type\":\"softplus\",\"beta\":-0.5,\"threshold\":3},"
                                        "{\"type\":\"selu\"},{\"type\":\"mish\"},{\"type\":\"affine\"},"
                                        "{\"type\":\"affine\",\"scale\":2,\"shift\":-1},"
                                        "{\"type\":\"prelu\"},{\"type\":\"prelu\",\"num_parameters\":4}]}",
                                        &m, err, sizeof err), 0);
    expect_fields_json(&m.layers[0], "{\"out\":4,\"k\":3,\"stride\":1,\"pad\":1,\"bias\":false}");
    expect_fields_json(&m.layers[1], "{}");
    expect_fields_json(&m.layers[2], "{\"k\":2,\"stride\":2,\"pad\":0}");
    expect_fields_json(&m.layers[3], "{\"out\":4,\"k\":1,\"stride\":1,\"pad\":0,\"bias\":true,\"groups\":2}");
    expect_fields_json(&m.layers[4], "{\"momentum\":0.5}");
    expect_fields_json(&m.layers[5], "{\"k\":2,\"stride\":2,\"pad\":0,\"ceil_mode\":true}");
    expect_fields_json(&m.layers[6], "{\"k\":1,\"stride\":1,\"pad\":0,\"ceil_mode\":false,\"count_include_pad\":true}");
    expect_fields_json(&m.layers[8], "{\"out\":4,\"bias\":true}");
    expect_fields_json(&m.layers[9], "{\"negative_slope\":0.00999999977648258}");
    expect_fields_json(&m.layers[10], "{\"negative_slope\":-2}");
    expect_fields_json(&m.layers[11], "{\"alpha\":1}");
    expect_fields_json(&m.layers[12], "{\"beta\":1,\"threshold\":20}");
    expect_fields_json(&m.layers[13], "{\"beta\":-0.5,\"threshold\":3}");
    expect_fields_json(&m.layers[14], "{}");
    expect_fields_json(&m.layers[15], "{}");
    expect_fields_json(&m.layers[16], "{\"scale\":1,\"shift\":0}");
    expect_fields_json(&m.layers[17], "{\"scale\":2,\"shift\":-1}");
    expect_fields_json(&m.layers[18], "{\"num_parameters\":1}");
    expect_fields_json(&m.layers[19], "{\"num_parameters\":4}");
    /* clamp: a bound only when given (an open side is none), its rule always */
    assert_int_equal(sf_model_from_json(HEAD "{\"type\":\"clamp\",\"min\":0},{\"type\":\"clamp\",\"max\":0.5},"
                                        "{\"type\":\"clamp\",\"min\":-1,\"max\":1,\"grad\":\"hardtanh\"},"
                                        "{\"type\":\"clamp\",\"min\":2,\"max\":2}]}", &m, err, sizeof err), 0);
    expect_fields_json(&m.layers[0], "{\"min\":0,\"grad\":\"clamp\"}");
    expect_fields_json(&m.layers[1], "{\"max\":0.5,\"grad\":\"clamp\"}");
    expect_fields_json(&m.layers[2], "{\"min\":-1,\"max\":1,\"grad\":\"hardtanh\"}");
    expect_fields_json(&m.layers[3], "{\"min\":2,\"max\":2,\"grad\":\"clamp\"}");
    assert_true(isinf(m.layers[0].clamp_max) && m.layers[0].clamp_max > 0 && isinf(m.layers[1].clamp_min) &&
                m.layers[1].clamp_min < 0 && m.layers[2].clamp_grad == SF_CLAMP_GRAD_HARDTANH);
    /* pad: its pads and mode always, its value only when set; the shape is F.pad's */
    assert_int_equal(sf_model_from_json(HEAD "{\"type\":\"pad\",\"pad\":[0,1,0,1]},"
                                        "{\"type\":\"pad\",\"pad\":[3,2,1,0],\"mode\":\"constant\",\"value\":-0.5},"
                                        "{\"type\":\"pad\",\"pad\":[1,1,1,1],\"mode\":\"reflect\"},"
                                        "{\"type\":\"global_avgpool\"},{\"type\":\"flatten\"}]}",
                                        &m, err, sizeof err), 0);
    expect_fields_json(&m.layers[0], "{\"pad\":[0,1,0,1],\"mode\":\"constant\"}");
    expect_fields_json(&m.layers[1], "{\"pad\":[3,2,1,0],\"mode\":\"constant\",\"value\":-0.5}");
    expect_fields_json(&m.layers[2], "{\"pad\":[1,1,1,1],\"mode\":\"reflect\"}");
    assert_true(m.layers[0].out_h == 9 && m.layers[0].out_w == 9 && m.layers[1].out_h == 10 &&
                m.layers[1].out_w == 14 && m.layers[2].out_h == 12 && m.layers[2].out_w == 16 &&
                m.layers[2].out_ch == 4 && m.n_params == 0);
    /* groupnorm's affine only when false: a spec of an affine one reads back as it did before the field */
    assert_int_equal(sf_model_from_json(HEAD "{\"type\":\"groupnorm\",\"num_groups\":2},"
                                        "{\"type\":\"groupnorm\",\"num_groups\":4,\"affine\":true},"
                                        "{\"type\":\"groupnorm\",\"num_groups\":4,\"affine\":false,\"eps\":0.5},"
                                        "{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":4}]}",
                                        &m, err, sizeof err), 0);
    expect_fields_json(&m.layers[0], "{\"num_groups\":2,\"eps\":9.99999974737875e-06}");
    expect_fields_json(&m.layers[1], "{\"num_groups\":4,\"eps\":9.99999974737875e-06}");
    expect_fields_json(&m.layers[2], "{\"num_groups\":4,\"eps\":0.5,\"affine\":false}");
    /* a window that differs between the axes is written as [h, w], one that does not as one number */
    assert_int_equal(sf_model_from_json(HEAD "{\"type\":\"conv2d\",\"out\":4,\"k\":[1,3],\"pad\":[0,1]},"
                                        "{\"type\":\"conv2d\",\"out\":4,\"k\":[3,3],\"stride\":[2,1],"
                                        "\"dilation\":[2,2]},"
                                        "{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":4}]}",
                                        &m, err, sizeof err), 0);
    expect_fields_json(&m.layers[0], "{\"out\":4,\"k\":[1,3],\"stride\":1,\"pad\":[0,1],\"bias\":true}");
    expect_fields_json(&m.layers[1], "{\"out\":4,\"k\":3,\"stride\":[2,1],\"pad\":0,\"bias\":true,\"dilation\":2}");
}

static void a_densenet_sized_concat_chain_fits_the_layer_limit(void **state)
{
    /* 430 layers: 1x1 convs of the input and concats of up to 32 earlier
     * ones (a dense block's growing input list), then flatten and linear. */
    const int nl = 430;
    const size_t cap = 64 + (size_t)nl * 200;
    char *js = malloc(cap);
    size_t at = (size_t)snprintf(js, cap, "{\"input\":[2,2,2],\"classes\":2,\"layers\":["
                                          "{\"type\":\"conv2d\",\"out\":1,\"k\":1}");
    for (int i = 1; i < nl - 2; i++) {
        if (i % 2) {
            at += (size_t)snprintf(js + at, cap - at, ",{\"type\":\"conv2d\",\"out\":1,\"k\":1,\"inputs\":[-1]}");
            continue;
        }
        at += (size_t)snprintf(js + at, cap - at, ",{\"type\":\"concat\",\"inputs\":[0");
        for (int j = i - 1, n = 1; j >= 1 && n < 32; j -= 2, n++)
            at += (size_t)snprintf(js + at, cap - at, ",%d", j);
        at += (size_t)snprintf(js + at, cap - at, "]}");
    }
    snprintf(js + at, cap - at, ",{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":2}]}");
    static sf_model m;
    if (sf_model_from_json(js, &m, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(m.n_layers, nl);
    assert_int_equal(m.layers[nl - 4].kind, SF_L_CONCAT);
    assert_int_equal(m.layers[nl - 4].n_in, 32);
    assert_int_equal(m.layers[nl - 4].out_ch, 32);
    free(js);
}

/* self_attention without a projection's bias (timm's qkv_bias=False,
 * nn.MultiheadAttention(bias=False)): the slots left out, the others in
 * their order and sizes, the fields written back only when false, and a
 * param_names entry for the absent bias refused. */
static void attention_biases_may_be_left_out(void **state)
{
    static sf_model m;
    char err[256] = "";
#define ATT(fields) "{\"input\":[3,8,8],\"classes\":4,\"layers\":[" \
                    "{\"type\":\"conv2d\",\"name\":\"stem\",\"out\":8,\"k\":4,\"stride\":4}," \
                    "{\"type\":\"to_tokens\",\"name\":\"tok\"}," \
                    "{\"type\":\"self_attention\",\"name\":\"a\",\"num_heads\":2" fields "}," \
                    "{\"type\":\"select_token\",\"name\":\"sel\"},{\"type\":\"linear\",\"name\":\"head\",\"out\":4}]}"
    sf_param_desc pd[SF_PARAM_SLOTS];
    char key[SF_PARAM_KEY_MAX];
    assert_int_equal(sf_model_from_json(ATT(",\"in_proj_bias\":false"), &m, err, sizeof err), 0);
    const sf_layer *at = layer_named(&m, "a");
    assert_int_equal(sf_layer_params(at, pd), 3);
    const char *const three[] = {"a.in_proj_weight", "a.out_proj.weight", "a.out_proj.bias"};
    for (int j = 0; j < 3; j++) {
        sf_layer_param_key(at, &pd[j], key, sizeof key);
        assert_string_equal(key, three[j]);
    }
    assert_true(at->p_n[0] == 192 && at->p_n[1] == 64 && at->p_n[2] == 8 && sf_layer_param_count(at) == 264);
    assert_true(sf_attn_slot(at, 0, 0) == 0 && sf_attn_slot(at, 0, 1) == -1 && sf_attn_slot(at, 1, 0) == 1 &&
                sf_attn_slot(at, 1, 1) == 2);
    expect_fields_json(at, "{\"num_heads\":2,\"in_proj_bias\":false}");
    assert_int_equal(sf_model_from_json(ATT(",\"in_proj_bias\":false,\"out_proj_bias\":false"), &m, err, sizeof err),
                     0);
    at = layer_named(&m, "a");
    assert_int_equal(sf_layer_params(at, pd), 2);
    sf_layer_param_key(at, &pd[1], key, sizeof key);
    assert_string_equal(key, "a.out_proj.weight");
    assert_true(sf_attn_slot(at, 1, 0) == 1 && sf_attn_slot(at, 1, 1) == -1 && sf_layer_param_count(at) == 256);
    assert_int_equal(sf_model_from_json(ATT(""), &m, err, sizeof err), 0);
    at = layer_named(&m, "a");
    assert_int_equal(sf_layer_params(at, pd), 4);
    assert_true(sf_attn_slot(at, 0, 1) == 1 && sf_attn_slot(at, 1, 0) == 2 && sf_attn_slot(at, 1, 1) == 3);
    expect_fields_json(at, "{\"num_heads\":2}");
    expect_json_error(ATT(",\"in_proj_bias\":false,\"param_names\":{\"in_proj_bias\":\"qkv.bias\"}"), "layer 2",
                      "not one of its parameters");
    expect_json_error(ATT(",\"out_proj_bias\":2"), "layer 2", "out_proj_bias");
    /* separate_qkv: q, k and v as three weights, then three biases, one
     * after another in the buffer, so that the first of each reads as the
     * stacked in_proj_weight [3C, C] and in_proj_bias [3C]; Hugging Face's
     * names through param_names. */
    assert_int_equal(sf_model_from_json(ATT(",\"separate_qkv\":true,\"param_names\":{\"q_proj.weight\":"
                                            "\"attention.query.weight\",\"out_proj.bias\":\"output.dense.bias\"}"),
                                        &m, err, sizeof err),
                     0);
    at = layer_named(&m, "a");
    assert_int_equal(sf_layer_params(at, pd), 8);
    const char *const eight[] = {"a.attention.query.weight", "a.k_proj.weight", "a.v_proj.weight", "a.q_proj.bias",
                                 "a.k_proj.bias", "a.v_proj.bias", "a.out_proj.weight", "a.output.dense.bias"};
    for (int j = 0; j < 8; j++) {
        sf_layer_param_key(at, &pd[j], key, sizeof key);
        assert_string_equal(key, eight[j]);
        assert_int_equal(at->p_n[j], j < 3 || j == 6 ? 64 : 8);
        if (j > 0)
            assert_true(at->p_off[j] == at->p_off[j - 1] + at->p_n[j - 1]);
    }
    assert_true(sf_attn_slot(at, 0, 0) == 0 && sf_attn_slot(at, 0, 1) == 3 && sf_attn_slot(at, 1, 0) == 6 &&
                sf_attn_slot(at, 1, 1) == 7 && sf_layer_param_count(at) == 4 * 64 + 4 * 8);
    expect_fields_json(at, "{\"param_names\":{\"q_proj.weight\":\"attention.query.weight\",\"out_proj.bias\":"
                           "\"output.dense.bias\"},\"num_heads\":2,\"separate_qkv\":true}");
    assert_int_equal(sf_model_from_json(ATT(",\"separate_qkv\":true,\"in_proj_bias\":false"), &m, err, sizeof err),
                     0);
    at = layer_named(&m, "a");
    assert_int_equal(sf_layer_params(at, pd), 5);
    assert_true(sf_attn_slot(at, 0, 1) == -1 && sf_attn_slot(at, 1, 0) == 3 && sf_attn_slot(at, 1, 1) == 4 &&
                sf_layer_param_count(at) == 4 * 64 + 8);
    expect_json_error(ATT(",\"param_names\":{\"q_proj.weight\":\"query.weight\"}"), "layer 2",
                      "not one of its parameters");
#undef ATT
}

/* "param_names": a layer's parameters under the names the module holding
 * them gives them (timm's Attention: qkv.weight for in_proj_weight), in
 * the checkpoint's keys and written back with the layer; a name that is
 * not the kind's parameter, a malformed or repeated one, or one that takes
 * another tensor's key is refused naming the layer. */
static void parameters_keep_the_names_param_names_gives_them(void **state)
{
    static sf_model m;
    char err[256] = "";
    const char *spec = "{\"input\":[3,8,8],\"classes\":4,\"layers\":["
                       "{\"type\":\"conv2d\",\"name\":\"stem\",\"out\":8,\"k\":4,\"stride\":4},"
                       "{\"type\":\"to_tokens\",\"name\":\"tok\"},"
                       "{\"type\":\"self_attention\",\"name\":\"blocks.0.attn\",\"num_heads\":2,"
                       "\"param_names\":{\"in_proj_weight\":\"qkv.weight\",\"in_proj_bias\":\"qkv.bias\","
                       "\"out_proj.weight\":\"proj.weight\",\"out_proj.bias\":\"proj.bias\"}},"
                       "{\"type\":\"layer_scale\",\"name\":\"blocks.0.ls1\",\"param_names\":{\"layer_scale\":\"gamma\"}},"
                       "{\"type\":\"select_token\",\"name\":\"sel\"},"
                       "{\"type\":\"linear\",\"name\":\"head\",\"out\":4,\"param_names\":{\"bias\":\"b\"}}]}";
    assert_int_equal(sf_model_from_json(spec, &m, err, sizeof err), 0);
    sf_param_desc pd[SF_PARAM_SLOTS];
    char key[SF_PARAM_KEY_MAX];
    const sf_layer *at = layer_named(&m, "blocks.0.attn");
    assert_int_equal(sf_layer_params(at, pd), 4);
    const char *const want[] = {"blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight",
                                "blocks.0.attn.proj.bias"};
    for (int j = 0; j < 4; j++) {
        sf_layer_param_key(at, &pd[j], key, sizeof key);
        assert_string_equal(key, want[j]);
    }
    assert_true(pd[0].shape[0] == 24 && pd[0].shape[1] == 8 && at->p_n[2] == 64);
    /* timm's LayerScale: on tokens the scale is [C], keyed gamma */
    const sf_layer *ls = layer_named(&m, "blocks.0.ls1");
    assert_int_equal(sf_layer_params(ls, pd), 1);
    sf_layer_param_key(ls, &pd[0], key, sizeof key);
    assert_string_equal(key, "blocks.0.ls1.gamma");
    assert_true(pd[0].ndim == 1 && pd[0].shape[0] == 8 && ls->tokens && ls->n_w == 8);
    const sf_layer *head = layer_named(&m, "head");
    assert_int_equal(sf_layer_params(head, pd), 2);
    sf_layer_param_key(head, &pd[0], key, sizeof key);
    assert_string_equal(key, "head.weight");
    sf_layer_param_key(head, &pd[1], key, sizeof key);
    assert_string_equal(key, "head.b");
    /* Written back under the kind's own names, so the spec reads back. */
    expect_fields_json(head, "{\"param_names\":{\"bias\":\"b\"},\"out\":4,\"bias\":true}");
    /* "" keys a parameter by the layer's name itself (ResMLP's block holds
     * ls1 and ls2 directly: two layers, blocks.0.ls1 and blocks.0.ls2), and
     * is written back as "" */
    static sf_model bare;
    assert_int_equal(sf_model_from_json("{\"input\":[3,8,8],\"classes\":4,\"layers\":[{\"type\":\"conv2d\","
                                        "\"name\":\"stem\",\"out\":8,\"k\":4,\"stride\":4},{\"type\":\"layer_scale\","
                                        "\"name\":\"blocks.0.ls1\",\"param_names\":{\"layer_scale\":\"\"}},"
                                        "{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":4}]}",
                                        &bare, err, sizeof err), 0);
    const sf_layer *ls1 = layer_named(&bare, "blocks.0.ls1");
    assert_int_equal(sf_layer_params(ls1, pd), 1);
    sf_layer_param_key(ls1, &pd[0], key, sizeof key);
    assert_string_equal(key, "blocks.0.ls1");
    expect_fields_json(ls1, "{\"param_names\":{\"layer_scale\":\"\"}}");

#define PN(layer) HEAD "{\"type\":\"conv2d\",\"name\":\"c\",\"out\":4,\"k\":1" layer "}," \
                   "{\"type\":\"conv2d\",\"name\":\"c.x\",\"out\":4,\"k\":1}]}"
    expect_json_error(PN(",\"param_names\":{\"wait\":\"w\"}"), "layer 0 (conv2d)", "not one of its parameters");
    expect_json_error(PN(",\"param_names\":{\"weight\":\"a..b\"}"), "layer 0", "\"weight\" must be 1 to 23");
    expect_json_error(PN(",\"param_names\":{\"weight\":\".w\"}"), "layer 0", "\"weight\" must be");
    expect_json_error(PN(",\"param_names\":{\"weight\":\"w/x\"}"), "layer 0", "\"weight\" must be");
    expect_json_error(PN(",\"param_names\":{\"weight\":\"aaaaaaaaaaaaaaaaaaaaaaaa\"}"), "layer 0", "must be 1 to 23");
    expect_json_error(PN(",\"param_names\":{\"weight\":7}"), "layer 0", "\"weight\" must be");
    expect_json_error(PN(",\"param_names\":{\"weight\":\"bias\"}"), "layer 0", "two parameters the name \"bias\"");
    expect_json_error(PN(",\"param_names\":{\"weight\":\"\",\"bias\":\"\"}"), "layer 0", "two parameters the name");
    expect_json_error(PN(",\"param_names\":{\"weight\":\"a\",\"weight\":\"b\"}"), "layer 0", "twice");
    expect_json_error(PN(",\"param_names\":{}"), "layer 0", "must map some of its parameters (weight, bias)");
    expect_json_error(PN(",\"param_names\":[\"w\"]"), "layer 0", "param_names");
    expect_json_error(PN(",\"bias\":false,\"param_names\":{\"bias\":\"b\"}"), "layer 0", "(weight)");
    /* layer c's weight renamed x.weight is layer c.x's weight */
    expect_json_error(PN(",\"param_names\":{\"weight\":\"x.weight\"}"), "layer 0 (conv2d)",
                      "\"c.x.weight\" (param_names) is also a tensor of layer 1 (c.x)");
#undef PN
    expect_json_error(HEAD "{\"type\":\"relu\",\"param_names\":{\"weight\":\"w\"}}]}", "layer 0 (relu)",
                      "it has none");
    expect_json_error(HEAD "{\"type\":\"batchnorm2d\",\"param_names\":{\"weight\":\"running_var\"}}]}",
                      "layer 0", "its buffer's name \"running_var\"");
    /* transpose_tokens: 4 tokens of 8 as 8 tokens of 4; only of tokens */
    assert_int_equal(sf_model_from_json("{\"input\":[3,8,8],\"classes\":8,\"layers\":[{\"type\":\"conv2d\","
                                        "\"out\":8,\"k\":4,\"stride\":4},{\"type\":\"to_tokens\"},"
                                        "{\"type\":\"transpose_tokens\",\"name\":\"tt\"},"
                                        "{\"type\":\"linear\",\"name\":\"mix\",\"out\":6},"
                                        "{\"type\":\"transpose_tokens\"},{\"type\":\"select_token\"}]}",
                                        &m, err, sizeof err), 0);
    const sf_layer *tt = layer_named(&m, "tt");
    assert_true(tt->tokens && tt->in_h == 4 && tt->in_c == 8 && tt->out_h == 8 && tt->out_ch == 4);
    assert_true(layer_named(&m, "mix")->out_h == 8 && layer_named(&m, "mix")->out_ch == 6);
    assert_true(m.layers[4].tokens && m.layers[4].out_h == 6 && m.layers[4].out_ch == 8);
    expect_json_error(HEAD "{\"type\":\"transpose_tokens\"}]}", "layer 0 (transpose_tokens)", "token sequence");
    /* a map's layer scale is [C,1,1], or [C] with "vector"; flat features have none */
    assert_int_equal(sf_model_from_json(HEAD "{\"type\":\"layer_scale\",\"name\":\"a\"},"
                                        "{\"type\":\"layer_scale\",\"name\":\"b\",\"vector\":true}]}",
                                        &m, err, sizeof err), 0);
    assert_true(sf_layer_params(layer_named(&m, "a"), pd) == 1 && pd[0].ndim == 3 && pd[0].shape[0] == 4 &&
                pd[0].shape[1] == 1 && pd[0].shape[2] == 1);
    assert_true(sf_layer_params(layer_named(&m, "b"), pd) == 1 && pd[0].ndim == 1 && pd[0].shape[0] == 4);
    expect_fields_json(layer_named(&m, "b"), "{\"vector\":true}");
    expect_json_error("{\"input\":[4,2,2],\"classes\":16,\"layers\":[{\"type\":\"flatten\"},"
                      "{\"type\":\"layer_scale\"}]}", "layer 1 (layer_scale)", "flat features");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parameters_are_named_and_shaped_as_pytorch_does),
        cmocka_unit_test(the_cuda_check_names_the_layer_and_the_reference_backend),
        cmocka_unit_test(bad_specs_of_these_kinds_fail_naming_the_layer_and_field),
        cmocka_unit_test(fields_marked_if_set_are_written_back_only_when_set),
        cmocka_unit_test(parameters_keep_the_names_param_names_gives_them),
        cmocka_unit_test(attention_biases_may_be_left_out),
        cmocka_unit_test(a_densenet_sized_concat_chain_fits_the_layer_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
