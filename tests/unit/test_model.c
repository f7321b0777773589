/* tests/unit/test_model.c — model presets, JSON specs, resolution, init. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/model.h"
#include "tests/unit/spec_error.h"

static char err[256];

static void seed_classifier_preset_is_the_w1_model_with_pytorch_parameter_count(void **state)
{
    static sf_model m;
    assert_int_equal(sf_model_from_preset("seed-classifier", &m, err, sizeof err), 0);
    assert_int_equal(m.in_c, 3);
    assert_int_equal(m.in_h, 256);
    assert_int_equal(m.in_w, 256);
    assert_int_equal(m.n_classes, 10);
    /* 0 conv, 1 relu, 8 convs at 2,4,..,16 with relus at 3,5,..,15, 17 flatten, 18 linear */
    assert_int_equal(m.n_layers, 19);
    assert_int_equal(m.layers[0].kind, SF_L_CONV2D);
    assert_int_equal(m.layers[0].k, 1);
    assert_int_equal(m.layers[0].out_c, 16);
    int c = 16, hw = 256;
    for (int i = 0; i < 8; i++) {
        const sf_layer *L = &m.layers[2 + 2 * i];
        assert_int_equal(L->kind, SF_L_CONV2D);
        assert_int_equal(L->in_c, c);
        assert_int_equal(L->out_c, 2 * c);
        assert_int_equal(L->k, 2);
        assert_int_equal(L->stride, 2);
        assert_int_equal(L->in_h, hw);
        assert_int_equal(L->out_h, hw / 2);
        if (i < 7)
            assert_int_equal(m.layers[3 + 2 * i].kind, SF_L_RELU);
        c *= 2;
        hw /= 2;
    }
    assert_int_equal(m.layers[16].out_c, 4096);
    assert_int_equal(m.layers[16].out_h, 1);
    assert_int_equal(m.layers[17].kind, SF_L_FLATTEN);
    assert_int_equal(m.layers[18].kind, SF_L_LINEAR);
    assert_int_equal(m.layers[18].in_c, 4096);
    assert_int_equal(m.layers[18].out_c, 10);
    assert_string_equal(m.layers[18].name, "18");
    assert_string_equal(m.layers[0].name, "0");
    /* sum(p.numel() for p in model.parameters()):
     * conv0 3*16+16 = 64; convs sum_{c=16..2048} (8c^2 + 2c) = 44738560 + 8160;
     * linear 4096*10+10 = 40970; total 44787754. */
    assert_int_equal(m.n_params, 44787754);
    /* Largest activation: conv0's output 16*256*256. */
    assert_int_equal(m.max_act, 16 * 256 * 256);
}

static void tiny_preset_resolves_to_a_small_32x32_classifier(void **state)
{
    static sf_model m;
    assert_int_equal(sf_model_from_preset("tiny", &m, err, sizeof err), 0);
    assert_int_equal(m.in_h, 32);
    assert_int_equal(m.in_w, 32);
    assert_int_equal(m.in_c, 3);
    assert_int_equal(m.n_classes, 10);
    const sf_layer *last = &m.layers[m.n_layers - 1];
    assert_int_equal(last->kind, SF_L_LINEAR);
    assert_int_equal(last->in_c, 32 * 4 * 4);
    /* 3*4+4 + (4*8*4+8) + (8*16*4+16) + (16*32*4+32) + 512*10+10 */
    assert_int_equal(m.n_params, 16 + 136 + 528 + 2080 + 5130);
    assert_int_equal(m.n_params, 7890);
}

static void parameter_offsets_are_contiguous_weight_then_bias(void **state)
{
    static sf_model m;
    assert_int_equal(sf_model_from_preset("tiny", &m, err, sizeof err), 0);
    size_t off = 0;
    for (int i = 0; i < m.n_layers; i++) {
        const sf_layer *L = &m.layers[i];
        if (L->n_w) {
            assert_int_equal(L->w_off, off);
            off += L->n_w;
        }
        if (L->n_b) {
            assert_int_equal(L->b_off, off);
            off += L->n_b;
        }
    }
    assert_int_equal(off, m.n_params);
}

static void unknown_preset_is_rejected_by_name(void **state)
{
    static sf_model m;
    assert_int_equal(sf_model_from_preset("resnet9000", &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "resnet9000"));
}

static void json_spec_parses_and_infers_input_channels(void **state)
{
    static sf_model m;
    const char *js = "{\"input\":[3,8,8],\"classes\":4,\"layers\":["
                     "{\"type\":\"conv2d\",\"out\":5,\"k\":3,\"stride\":1,\"pad\":1,\"bias\":false},"
                     "{\"type\":\"relu\"},"
                     "{\"type\":\"conv2d\",\"out\":6,\"k\":2,\"stride\":2},"
                     "{\"type\":\"flatten\"},"
                     "{\"type\":\"linear\",\"out\":4,\"name\":\"head\"}]}";
    assert_int_equal(sf_model_from_json(js, &m, err, sizeof err), 0);
    assert_string_equal(m.preset, "custom");
    assert_int_equal(m.n_layers, 5);
    assert_int_equal(m.layers[0].in_c, 3);
    assert_int_equal(m.layers[0].out_h, 8);
    assert_int_equal(m.layers[0].bias, 0);
    assert_int_equal(m.layers[0].n_b, 0);
    assert_int_equal(m.layers[2].in_c, 5);
    assert_int_equal(m.layers[2].out_h, 4);
    assert_int_equal(m.layers[3].out_ch, 6 * 4 * 4);
    assert_int_equal(m.layers[4].in_c, 96);
    assert_string_equal(m.layers[4].name, "head");
    assert_string_equal(m.layers[1].name, "1");
    assert_int_equal(m.n_params, 5 * 3 * 9 + (6 * 5 * 4 + 6) + (96 * 4 + 4));
}

static void invalid_json_specs_fail_naming_the_layer_index_and_type(void **state)
{
    /* unknown layer type */
    expect_json_error("{\"input\":[3,8,8],\"classes\":2,\"layers\":[{\"type\":\"conv2d\",\"out\":2,\"k\":1},"
                      "{\"type\":\"softmax\"}]}", "layer 1", "softmax");
    /* zero channels */
    expect_json_error("{\"input\":[3,8,8],\"classes\":2,\"layers\":[{\"type\":\"relu\"},"
                      "{\"type\":\"conv2d\",\"out\":0,\"k\":1}]}", "layer 1", "conv2d");
    /* kernel that does not fit */
    expect_json_error("{\"input\":[3,4,4],\"classes\":2,\"layers\":[{\"type\":\"conv2d\",\"out\":2,\"k\":5},"
                      "{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":2}]}", "layer 0", "conv2d");
    /* linear without flatten on a spatial input */
    expect_json_error("{\"input\":[3,4,4],\"classes\":2,\"layers\":[{\"type\":\"linear\",\"out\":2}]}",
                      "layer 0", "linear");
    /* last width != classes */
    expect_json_error("{\"input\":[3,4,4],\"classes\":3,\"layers\":[{\"type\":\"flatten\"},"
                      "{\"type\":\"linear\",\"out\":2}]}", "layer 1", "classes");
    /* declared in does not match */
    expect_json_error("{\"input\":[3,4,4],\"classes\":2,\"layers\":[{\"type\":\"flatten\"},"
                      "{\"type\":\"linear\",\"in\":47,\"out\":2}]}", "layer 1", "linear");
    /* unknown field (a typo must not be ignored) */
    expect_json_error("{\"input\":[3,4,4],\"classes\":2,\"layers\":[{\"type\":\"conv2d\",\"out\":2,\"k\":1,"
                      "\"stirde\":2}]}", "layer 0", "stirde");
    /* two layers with one state_dict name */
    expect_json_error("{\"input\":[3,4,4],\"classes\":48,\"layers\":[{\"type\":\"relu\",\"name\":\"a\"},"
                      "{\"type\":\"flatten\",\"name\":\"a\"}]}", "layer 1", "already used");
    /* missing k */
    expect_json_error("{\"input\":[3,4,4],\"classes\":2,\"layers\":[{\"type\":\"conv2d\",\"out\":2}]}",
                      "layer 0", "\"k\"");
    /* non-integer */
    expect_json_error("{\"input\":[3,4,4],\"classes\":2,\"layers\":[{\"type\":\"conv2d\",\"out\":2.5,\"k\":1}]}",
                      "layer 0", "out");
    /* not JSON, not an object, bad input */
    expect_json_error("{\"input\":", "JSON", NULL);
    expect_json_error("[1,2]", "object", NULL);
    expect_json_error("{\"input\":[3,4],\"classes\":2,\"layers\":[{\"type\":\"flatten\"}]}", "input", NULL);
    expect_json_error("{\"input\":[3,4,4],\"layers\":[{\"type\":\"flatten\"}]}", "classes", NULL);
}

static void resnet18_and_seed_encdec_presets_resolve_with_pytorch_parameter_counts(void **state)
{
    static sf_model m;
    assert_int_equal(sf_model_from_preset("resnet18", &m, err, sizeof err), 0);
    assert_int_equal(m.n_params, 11181642); /* torchvision resnet18(num_classes=10) */
    assert_int_equal(m.n_bn, 20);
    assert_int_equal(m.n_buffers, 2 * 4800); /* running_mean + running_var of 4800 channels */
    assert_int_equal(m.segmentation, 0);
    assert_string_equal(m.layers[0].name, "conv1");
    int found = 0;
    for (int i = 0; i < m.n_layers; i++)
        if (!strcmp(m.layers[i].name, "layer2.0.downsample.1")) {
            found = 1;
            assert_int_equal(m.layers[i].kind, SF_L_BATCHNORM2D);
            assert_int_equal(m.layers[i].out_h, 28);
        }
    assert_true(found);
    assert_string_equal(m.layers[m.n_layers - 1].name, "fc");

    assert_int_equal(sf_model_from_preset("seed-encdec", &m, err, sizeof err), 0);
    assert_int_equal(m.n_params, 349114);
    assert_int_equal(m.segmentation, 1);
    assert_int_equal(m.out_h, 256);
    assert_int_equal(m.out_w, 256);
    assert_string_equal(m.layers[9].name, "encoder.9");
    assert_string_equal(m.layers[10].name, "decoder.0");
    assert_int_equal(m.layers[10].kind, SF_L_CONV_TRANSPOSE2D);
    assert_int_equal(sf_model_set_freeze(&m, "encoder", err, sizeof err), 0);
    assert_int_equal(m.n_frozen, 10);
    assert_int_equal(m.train_off, 174624);
}

static void freeze_must_name_a_leading_run_of_layers(void **state)
{
    static sf_model m;
    assert_int_equal(sf_model_from_preset("seed-encdec", &m, err, sizeof err), 0);
    assert_int_equal(sf_model_set_freeze(&m, "decoder", err, sizeof err), -1);
    assert_non_null(strstr(err, "must lead"));
    assert_int_equal(sf_model_set_freeze(&m, "nope", err, sizeof err), -1);
    assert_int_equal(sf_model_set_freeze(&m, "e", err, sizeof err), 0); /* a prefix of "encoder." */
    assert_int_equal(sf_model_set_freeze(&m, "", err, sizeof err), 0);
    assert_int_equal(m.n_frozen, 0);
    assert_int_equal(m.train_off, 0);
}

static void json_specs_with_new_kinds_and_residual_inputs_parse(void **state)
{
    static sf_model m;
    const char *js =
        "{\"input\":[3,8,8],\"classes\":4,\"layers\":["
        "{\"type\":\"conv2d\",\"name\":\"stem\",\"out\":4,\"k\":3,\"pad\":1,\"bias\":false},"
        "{\"type\":\"batchnorm2d\",\"name\":\"bn\"},{\"type\":\"relu\"},"
        "{\"type\":\"conv2d\",\"out\":4,\"k\":3,\"pad\":1},"
        "{\"type\":\"add\",\"inputs\":[\"2\",3]},"
        "{\"type\":\"maxpool2d\",\"k\":2},"
        "{\"type\":\"conv_transpose2d\",\"out\":2,\"k\":2,\"stride\":2},"
        "{\"type\":\"global_avgpool\"},{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":4}]}";
    if (sf_model_from_json(js, &m, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(m.layers[4].n_in, 2);
    assert_int_equal(m.layers[4].in[0], 2);
    assert_int_equal(m.layers[4].in[1], 3);
    assert_int_equal(m.layers[5].out_h, 4);        /* maxpool stride defaults to k */
    assert_int_equal(m.layers[6].out_h, 8);        /* (4-1)*2 + 2 */
    assert_int_equal(m.layers[6].n_w, 4 * 2 * 2 * 2); /* [in, out, k, k] */
    assert_int_equal(m.layers[1].n_w, 4);
    assert_int_equal(m.n_buffers, 8);
    assert_int_equal(m.n_params, 4 * 3 * 9 + 8 + (4 * 4 * 9 + 4) + (32 + 2) + (2 * 4 + 4));
    /* A segmentation spec ends in [classes,H,W]. */
    assert_int_equal(sf_model_from_json("{\"input\":[3,8,8],\"classes\":3,\"layers\":["
                                        "{\"type\":\"conv2d\",\"out\":3,\"k\":1}]}", &m, err, sizeof err), 0);
    assert_int_equal(m.segmentation, 1);
}

static void bad_residual_batchnorm_and_pooling_specs_fail_naming_the_layer(void **state)
{
    /* add needs two inputs */
    expect_json_error("{\"input\":[3,8,8],\"classes\":3,\"layers\":[{\"type\":\"conv2d\",\"out\":3,\"k\":1},"
                      "{\"type\":\"add\"}]}", "layer 1", "add");
    /* add of different shapes */
    expect_json_error("{\"input\":[3,8,8],\"classes\":3,\"layers\":[{\"type\":\"conv2d\",\"out\":3,\"k\":2,"
                      "\"stride\":2},{\"type\":\"add\",\"inputs\":[0,-1]}]}", "layer 1", "shapes");
    /* an input that is not earlier */
    expect_json_error("{\"input\":[3,8,8],\"classes\":3,\"layers\":[{\"type\":\"relu\",\"inputs\":[0]},"
                      "{\"type\":\"conv2d\",\"out\":3,\"k\":1}]}", "layer 0", "relu");
    expect_json_error("{\"input\":[3,8,8],\"classes\":3,\"layers\":[{\"type\":\"relu\"},"
                      "{\"type\":\"add\",\"inputs\":[\"zz\",0]}]}", "layer 1", "zz");
    /* maxpool on a flattened tensor; pad too large */
    expect_json_error("{\"input\":[3,8,8],\"classes\":3,\"layers\":[{\"type\":\"flatten\"},"
                      "{\"type\":\"batchnorm2d\"}]}", "layer 1", "batchnorm2d");
    expect_json_error("{\"input\":[3,8,8],\"classes\":3,\"layers\":[{\"type\":\"maxpool2d\",\"k\":2,"
                      "\"pad\":2},{\"type\":\"conv2d\",\"out\":3,\"k\":1}]}", "layer 0", "maxpool2d");
    /* unknown field of a new kind */
    expect_json_error("{\"input\":[3,8,8],\"classes\":3,\"layers\":[{\"type\":\"batchnorm2d\",\"k\":3},"
                      "{\"type\":\"conv2d\",\"out\":3,\"k\":1}]}", "layer 0", "\"k\"");
}

static void more_than_max_layers_is_rejected(void **state)
{
    size_t cap = 64 + 20 * (SF_MAX_LAYERS + 2);
    char *js = malloc(cap);
    strcpy(js, "{\"input\":[2,1,1],\"classes\":2,\"layers\":[");
    for (int i = 0; i < SF_MAX_LAYERS + 1; i++)
        strcat(js, i ? ",{\"type\":\"relu\"}" : "{\"type\":\"relu\"}");
    strcat(js, "]}");
    expect_json_error(js, "layers", NULL);
    free(js);
}

static void layer_kind_names_are_stable(void **state)
{
    assert_string_equal(sf_layer_kind_name(SF_L_CONV2D), "conv2d");
    assert_string_equal(sf_layer_kind_name(SF_L_LINEAR), "linear");
    assert_string_equal(sf_layer_kind_name(SF_L_GLOBAL_AVGPOOL), "global_avgpool");
    assert_string_equal(sf_layer_kind_name((sf_layer_kind)99), "unknown");
}

static void init_is_deterministic_and_within_pytorch_bounds(void **state)
{
    static sf_model m;
    assert_int_equal(sf_model_from_preset("tiny", &m, err, sizeof err), 0);
    float *a = malloc(sizeof(float) * m.n_params), *b = malloc(sizeof(float) * m.n_params),
          *c = malloc(sizeof(float) * m.n_params);
    sf_model_init_params(&m, 42, a);
    sf_model_init_params(&m, 42, b);
    sf_model_init_params(&m, 43, c);
    assert_memory_equal(a, b, sizeof(float) * m.n_params);
    size_t same = 0;
    for (size_t i = 0; i < m.n_params; i++)
        same += a[i] == c[i];
    assert_true(same < m.n_params / 100);

    for (int li = 0; li < m.n_layers; li++) {
        const sf_layer *L = &m.layers[li];
        if (!L->n_w)
            continue;
        double fan_in = L->kind == SF_L_CONV2D ? (double)L->in_c * L->k * L->k : L->in_c;
        float bound = (float)(1.0 / sqrt(fan_in));
        double sum = 0, sumsq = 0, maxabs = 0;
        for (size_t e = 0; e < L->n_w + L->n_b; e++) {
            float v = e < L->n_w ? a[L->w_off + e] : a[L->b_off + e - L->n_w];
            assert_true(fabsf(v) <= bound);
            sum += v;
            sumsq += (double)v * v;
            if (fabs(v) > maxabs)
                maxabs = fabs(v);
        }
        double n = (double)(L->n_w + L->n_b);
        /* Uniform on [-b,b]: mean 0, variance b^2/3; loose checks when n is large. */
        if (n >= 500) {
            assert_true(fabs(sum / n) < 0.1 * bound);
            double var = sumsq / n;
            assert_true(fabs(var / (bound * bound / 3.0) - 1.0) < 0.15);
            assert_true(maxabs > 0.9 * bound);
        }
    }
    free(a);
    free(b);
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(seed_classifier_preset_is_the_w1_model_with_pytorch_parameter_count),
        cmocka_unit_test(tiny_preset_resolves_to_a_small_32x32_classifier),
        cmocka_unit_test(parameter_offsets_are_contiguous_weight_then_bias),
        cmocka_unit_test(unknown_preset_is_rejected_by_name),
        cmocka_unit_test(json_spec_parses_and_infers_input_channels),
        cmocka_unit_test(invalid_json_specs_fail_naming_the_layer_index_and_type),
        cmocka_unit_test(resnet18_and_seed_encdec_presets_resolve_with_pytorch_parameter_counts),
        cmocka_unit_test(freeze_must_name_a_leading_run_of_layers),
        cmocka_unit_test(json_specs_with_new_kinds_and_residual_inputs_parse),
        cmocka_unit_test(bad_residual_batchnorm_and_pooling_specs_fail_naming_the_layer),
        cmocka_unit_test(more_than_max_layers_is_rejected),
        cmocka_unit_test(layer_kind_names_are_stable),
        cmocka_unit_test(init_is_deterministic_and_within_pytorch_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
