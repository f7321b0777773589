/* gpu/model.c — model descriptions: presets, the JSON layer list, shape
 * resolution and PyTorch-style default initialisation. See gpu/model.h.
 * What differs by layer kind (fields, shapes, parameters, initialisation)
 * is in the kind's row of gpu/layers.c; this file loops over the rows. */
#include "gpu/common.h"
#include "gpu/model.h"
#include "gpu/layers.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

/* Floats of the parameter buffer (8 GiB); the other bounds are in gpu/layers.h. */
#define MAX_PARAMS ((size_t)1 << 31)

const char *sf_layer_kind_name(sf_layer_kind k)
{
    const sf_layer_kind_info *info = sf_layer_info(k);
    return info ? info->name : "unknown";
}

int sf_layer_input(const sf_model *m, int i, int j)
{
    const sf_layer *L = &m->layers[i];
    if (L->n_in > j)
        return L->in[j];
    return i - 1; /* the previous layer; -1 (SF_IN_MODEL) for the first */
}

/* ---- resolution --------------------------------------------------------- */

/* The layer's inputs: how many, and that each names an earlier layer (or the
 * model input). */
static int check_inputs(const sf_model *m, int i, const sf_layer_kind_info *k, char *err, size_t errlen)
{
    const sf_layer *L = &m->layers[i];
    if (L->n_in < 0 || L->n_in > SF_MAX_IN || (L->n_in != 0 && (L->n_in < k->min_in || L->n_in > k->max_in))) {
        if (k->min_in == k->max_in)
            sf_errf(err, errlen, "layer %d (%s): takes %d input(s), %d named", i, k->name, k->min_in, L->n_in);
        else
            sf_errf(err, errlen, "layer %d (%s): takes %d to %d inputs, %d named", i, k->name, k->min_in,
                    k->max_in, L->n_in);
        return -1;
    }
    if (k->min_in > 1 && L->n_in < k->min_in) {
        if (k->min_in == 2 && k->max_in == 2)
            sf_errf(err, errlen, "layer %d (%s): needs two inputs (\"inputs\":[a,b])", i, k->name);
        else
            sf_errf(err, errlen, "layer %d (%s): needs %d to %d inputs (\"inputs\":[a,b,...])", i, k->name,
                    k->min_in, k->max_in);
        return -1;
    }
    for (int j = 0; j < L->n_in; j++)
        if (L->in[j] < SF_IN_MODEL || L->in[j] >= i) {
            sf_errf(err, errlen, "layer %d (%s): input %d must be an earlier layer or -1 (the model input)", i,
                    k->name, L->in[j]);
            return -1;
        }
    return 0;
}

/* Whether key is one of L's parameter or buffer keys. */
static int layer_has_key(const sf_layer *L, const char *key)
{
    const size_t n = strlen(L->name);
    if (strncmp(key, L->name, n) != 0 || (key[n] != '\0' && key[n] != '.'))
        return 0;
    sf_param_desc pd[SF_PARAM_SLOTS];
    char own[SF_PARAM_KEY_MAX];
    const int np = sf_layer_params(L, pd);
    for (int a = 0; a < np; a++) {
        sf_layer_param_key(L, &pd[a], own, sizeof own);
        if (strcmp(own, key) == 0)
            return 1;
    }
    const sf_layer_kind_info *k = sf_layer_info(L->kind);
    for (const char *const *bf = k ? k->buffers : NULL; bf && *bf; bf++)
        if (key[n] == '.' && strcmp(key + n + 1, *bf) == 0)
            return 1;
    return 0;
}

/* A renamed parameter must not take another layer's key (layer "a"
 * renaming its weight "b.weight" beside a layer named "a.b"): the
 * checkpoint would hold one name twice. Layer names are distinct and the
 * kinds' own suffixes are fixed, so only renamed keys can collide. */
static int check_renamed_keys(const sf_model *m, char *err, size_t errlen)
{
    for (int i = 0; i < m->n_layers; i++) {
        const sf_layer *L = &m->layers[i];
        sf_param_desc pd[SF_PARAM_SLOTS];
        char key[SF_PARAM_KEY_MAX];
        const int np = sf_layer_params(L, pd);
        for (int a = 0; a < np; a++) {
            if (!L->param_names[a][0])
                continue;
            sf_layer_param_key(L, &pd[a], key, sizeof key);
            for (int j = 0; j < m->n_layers; j++)
                if (j != i && layer_has_key(&m->layers[j], key)) {
                    sf_errf(err, errlen, "layer %d (%s): its parameter \"%s\" (param_names) is also a tensor "
                            "of layer %d (%s)", i, sf_layer_kind_name(L->kind), key, j, m->layers[j].name);
                    return -1;
                }
        }
    }
    return 0;
}

/* Shapes, parameter and buffer sizes of layer i from its row (gpu/layers.c). */
static int resolve_layer(sf_model *m, int i, size_t *off, size_t *boff, char *err, size_t errlen)
{
    sf_layer *L = &m->layers[i];
    const sf_layer_kind_info *k = sf_layer_info(L->kind);
    if (!k) {
        sf_errf(err, errlen, "layer %d: unknown layer kind %d", i, (int)L->kind);
        return -1;
    }
    const char *kn = k->name;
    if (L->name[0] == '\0')
        snprintf(L->name, sizeof L->name, "%d", i);
    for (int j = 0; j < i; j++)
        if (strncmp(m->layers[j].name, L->name, sizeof L->name) == 0) {
            sf_errf(err, errlen, "layer %d (%s): name \"%s\" is already used by layer %d", i, kn, L->name, j);
            return -1;
        }
    if (check_inputs(m, i, k, err, errlen) != 0)
        return -1;
    sf_shape in[SF_MAX_IN];
    const int n_in = sf_layer_n_inputs(L);
    for (int j = 0; j < n_in; j++)
        sf_layer_in_shape(m, i, j, &in[j]);
    if (L->in_c != 0 && L->in_c != in[0].c) {
        sf_errf(err, errlen, "layer %d (%s): declared input %d does not match the previous output %d", i, kn,
                L->in_c, in[0].c);
        return -1;
    }
    if (k->needs_map && (in[0].flat || in[0].tokens)) {
        sf_errf(err, errlen, "layer %d (%s): input is %s; %s needs [C,H,W]", i, kn,
                in[0].flat ? "flattened" : "a token sequence", kn);
        return -1;
    }
    if (k->no_tokens && in[0].tokens) {
        sf_errf(err, errlen, "layer %d (%s): input is a token sequence; %s needs a [C,H,W] map or flat features", i,
                kn, kn);
        return -1;
    }
    L->in_c = in[0].c;
    L->in_h = in[0].h;
    L->in_w = in[0].w;
    L->n_w = L->n_b = 0;
    L->w_off = L->b_off = 0;
    L->rm_off = L->rv_off = 0;
    memset(L->p_off, 0, sizeof L->p_off);
    memset(L->p_n, 0, sizeof L->p_n);
    sf_shape out;
    char why[200];
    if (k->shape(L, in, n_in, &out, why, sizeof why) != 0) {
        sf_errf(err, errlen, "layer %d (%s): %s", i, kn, why);
        return -1;
    }
    L->out_c = L->out_ch = out.c;
    L->out_h = out.h;
    L->out_w = out.w;
    L->flat = out.flat;
    L->tokens = out.tokens;
    L->out_elems = (size_t)L->out_ch * L->out_h * L->out_w;
    if (L->out_elems > SF_MAX_ACT) {
        sf_errf(err, errlen, "layer %d (%s): output of %zu floats per sample is too large", i, kn, L->out_elems);
        return -1;
    }
    sf_param_desc pd[SF_PARAM_SLOTS];
    const int np = k->params ? k->params(L, pd) : 0;
    for (int p = 0; p < np; p++) {
        size_t cnt = 1;
        for (int d = 0; d < pd[p].ndim; d++)
            cnt *= (size_t)pd[p].shape[d];
        L->p_n[p] = cnt;
        L->p_off[p] = *off;
        if (p == 0) {
            L->n_w = cnt;
            L->w_off = *off;
        } else if (p == 1) {
            L->n_b = cnt;
            L->b_off = *off;
        }
        *off += cnt;
        if (*off > MAX_PARAMS)
            break;
    }
    if (k->buffers) {
        L->rm_off = *boff;
        L->rv_off = *boff + (size_t)L->out_ch;
        for (const char *const *b = k->buffers; *b; b++)
            *boff += (size_t)L->out_ch;
        m->n_bn++;
    }
    if (*off > MAX_PARAMS || *boff > MAX_PARAMS) {
        sf_errf(err, errlen, "layer %d (%s): model exceeds %zu parameters", i, kn, MAX_PARAMS);
        return -1;
    }
    return 0;
}

int sf_model_resolve(sf_model *m, char *err, size_t errlen)
{
    if (m->in_c < 1 || m->in_h < 1 || m->in_w < 1 || m->in_c > SF_MAX_CHANNELS ||
        m->in_h > SF_MAX_SPATIAL || m->in_w > SF_MAX_SPATIAL) {
        sf_errf(err, errlen, "model input %dx%dx%d out of range (C in [1,%d], H,W in [1,%d])",
                m->in_c, m->in_h, m->in_w, SF_MAX_CHANNELS, SF_MAX_SPATIAL);
        return -1;
    }
    if (m->n_layers < 1 || m->n_layers > SF_MAX_LAYERS) {
        sf_errf(err, errlen, "model has %d layers (1..%d allowed)", m->n_layers, SF_MAX_LAYERS);
        return -1;
    }
    if (m->n_classes < 1 || m->n_classes > SF_MAX_CHANNELS) {
        sf_errf(err, errlen, "model classes %d out of range [1,%d]", m->n_classes, SF_MAX_CHANNELS);
        return -1;
    }

    if ((size_t)m->in_c * m->in_h * m->in_w > SF_MAX_ACT) {
        sf_errf(err, errlen, "model input %dx%dx%d is too large", m->in_c, m->in_h, m->in_w);
        return -1;
    }

    size_t off = 0, boff = 0;
    size_t max_act = (size_t)m->in_c * m->in_h * m->in_w;
    m->n_bn = 0;
    m->n_frozen = 0;
    m->train_off = 0;
    const size_t freeze_len = strnlen(m->freeze, sizeof m->freeze);
    if (freeze_len == sizeof m->freeze) {
        sf_errf(err, errlen, "model.freeze prefix is too long");
        return -1;
    }

    for (int i = 0; i < m->n_layers; i++) {
        sf_layer *L = &m->layers[i];
        if (resolve_layer(m, i, &off, &boff, err, errlen) != 0)
            return -1;
        if (L->out_elems > max_act)
            max_act = L->out_elems;

        /* Freezing: a leading run of layers whose names start with the prefix. */
        L->frozen = freeze_len && strncmp(L->name, m->freeze, freeze_len) == 0;
        if (L->frozen) {
            if (m->n_frozen != i) {
                sf_errf(err, errlen, "layer %d (%s): \"%s\" matches model.freeze \"%s\" but layer %d "
                        "before it does not; frozen layers must lead the network", i,
                        sf_layer_kind_name(L->kind), L->name, m->freeze, m->n_frozen);
                return -1;
            }
            m->n_frozen = i + 1;
            m->train_off = off;
        }
    }
    if (freeze_len && m->n_frozen == 0) {
        sf_errf(err, errlen, "model.freeze \"%s\" matches no layer (the first is \"%s\")", m->freeze,
                m->layers[0].name);
        return -1;
    }
    if (freeze_len && m->train_off == off) {
        sf_errf(err, errlen, "model.freeze \"%s\" leaves no trainable parameter", m->freeze);
        return -1;
    }

    if (check_renamed_keys(m, err, errlen) != 0)
        return -1;
    const sf_layer *last = &m->layers[m->n_layers - 1];
    m->segmentation = 0;
    if (last->out_elems != (size_t)m->n_classes) {
        if (!last->flat && !last->tokens && last->out_ch == m->n_classes && last->out_h * last->out_w > 1) {
            m->segmentation = 1;
        } else {
            sf_errf(err, errlen, "layer %d (%s): output has %zu values per sample but the model has %d "
                    "classes (a segmentation model ends in [classes,H,W])", m->n_layers - 1,
                    sf_layer_kind_name(last->kind), last->out_elems, m->n_classes);
            return -1;
        }
    }
    m->out_h = last->out_h;
    m->out_w = last->out_w;
    m->n_params = off;
    m->n_buffers = boff;
    m->max_act = max_act;
    return 0;
}

int sf_model_set_freeze(sf_model *m, const char *prefix, char *err, size_t errlen)
{
    if (!prefix)
        prefix = "";
    if (strlen(prefix) >= sizeof m->freeze) {
        sf_errf(err, errlen, "model.freeze \"%.40s\" is longer than %d characters", prefix,
                SF_LAYER_NAME_MAX - 1);
        return -1;
    }
    snprintf(m->freeze, sizeof m->freeze, "%s", prefix);
    return sf_model_resolve(m, err, errlen);
}

/* ---- presets ------------------------------------------------------------ */

static sf_layer *push(sf_model *m, sf_layer_kind kind)
{
    sf_layer *L = &m->layers[m->n_layers];
    memset(L, 0, sizeof *L);
    L->kind = kind;
    snprintf(L->name, sizeof L->name, "%d", m->n_layers);
    m->n_layers++;
    return L;
}

static void push_conv(sf_model *m, int in_c, int out_c, int k, int stride)
{
    sf_layer *L = push(m, SF_L_CONV2D);
    L->in_c = in_c;
    L->out_c = out_c;
    L->k = k;
    L->stride = stride;
    L->pad = 0;
    L->bias = 1;
}

static sf_layer *push_named(sf_model *m, sf_layer_kind kind, const char *name)
{
    sf_layer *L = push(m, kind);
    snprintf(L->name, sizeof L->name, "%s", name);
    return L;
}

/* A torchvision conv: bias-free, kaiming_normal_(fan_out, relu). */
static int push_tv_conv(sf_model *m, const char *name, int in_c, int out_c, int k, int stride, int pad,
                        int input)
{
    sf_layer *L = push_named(m, SF_L_CONV2D, name);
    L->in_c = in_c;
    L->out_c = out_c;
    L->k = k;
    L->stride = stride;
    L->pad = pad;
    L->bias = 0;
    L->init = SF_INIT_KAIMING_FAN_OUT;
    if (input != m->n_layers - 2) {
        L->n_in = 1;
        L->in[0] = input;
    }
    return m->n_layers - 1;
}

/* torchvision BasicBlock "layerX.Y" reading layer `input` (c_in channels). */
static int push_basic_block(sf_model *m, const char *p, int input, int c_in, int c_out, int stride)
{
    char n[SF_LAYER_NAME_MAX];
    snprintf(n, sizeof n, "%s.conv1", p);
    push_tv_conv(m, n, c_in, c_out, 3, stride, 1, input);
    snprintf(n, sizeof n, "%s.bn1", p);
    push_named(m, SF_L_BATCHNORM2D, n);
    snprintf(n, sizeof n, "%s.relu", p);
    push_named(m, SF_L_RELU, n);
    snprintf(n, sizeof n, "%s.conv2", p);
    push_tv_conv(m, n, c_out, c_out, 3, 1, 1, m->n_layers - 1);
    snprintf(n, sizeof n, "%s.bn2", p);
    push_named(m, SF_L_BATCHNORM2D, n);
    int main_out = m->n_layers - 1, skip = input;
    if (stride != 1 || c_in != c_out) {
        snprintf(n, sizeof n, "%s.downsample.0", p);
        push_tv_conv(m, n, c_in, c_out, 1, stride, 0, input);
        snprintf(n, sizeof n, "%s.downsample.1", p);
        push_named(m, SF_L_BATCHNORM2D, n);
        skip = m->n_layers - 1;
    }
    snprintf(n, sizeof n, "%s.add", p);
    sf_layer *A = push_named(m, SF_L_ADD, n);
    A->n_in = 2;
    A->in[0] = main_out;
    A->in[1] = skip;
    snprintf(n, sizeof n, "%s.relu_out", p);
    push_named(m, SF_L_RELU, n);
    return m->n_layers - 1;
}

static void push_linear(sf_model *m, int in, int out)
{
    sf_layer *L = push(m, SF_L_LINEAR);
    L->in_c = in;
    L->out_c = out;
    L->bias = 1;
}

int sf_model_from_preset(const char *name, sf_model *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (!name) {
        sf_errf(err, errlen, "model preset name missing");
        return -1;
    }
    if (strcmp(name, "seed-classifier") == 0) {
        /* W1: Conv2d(3,16,1), ReLU, 8 x [Conv2d(c,2c,2,2), ReLU] (16 -> 4096
         * channels, 256 -> 1 spatial) without the last ReLU, Flatten,
         * Linear(4096,10). Indices 0..18 as in nn.Sequential. */
        m->in_c = 3;
        m->in_h = m->in_w = 256;
        m->n_classes = 10;
        push_conv(m, 3, 16, 1, 1);
        push(m, SF_L_RELU);
        int c = 16;
        for (int i = 0; i < 8; i++, c *= 2) {
            push_conv(m, c, 2 * c, 2, 2);
            if (i < 7)
                push(m, SF_L_RELU);
        }
        push(m, SF_L_FLATTEN);
        push_linear(m, 4096, 10);
    } else if (strcmp(name, "tiny") == 0) {
        /* 32x32x3: Conv2d(3,4,1), ReLU, 3 x [Conv2d(c,2c,2,2), ReLU]
         * (4 -> 32 channels, 32 -> 4 spatial), Flatten, Linear(512,10):
         * W1's shape in miniature: 7890 parameters, about 0.7 MFLOP per
         * sample for forward + backward, so the plain reference loops run a
         * batch-32 training step in a few milliseconds. */
        m->in_c = 3;
        m->in_h = m->in_w = 32;
        m->n_classes = 10;
        push_conv(m, 3, 4, 1, 1);
        push(m, SF_L_RELU);
        int c = 4;
        for (int i = 0; i < 3; i++, c *= 2) {
            push_conv(m, c, 2 * c, 2, 2);
            push(m, SF_L_RELU);
        }
        push(m, SF_L_FLATTEN);
        push_linear(m, 32 * 4 * 4, 10);
    } else if (strcmp(name, "seed-encdec") == 0) {
        /* W2: encoder Conv2d(3,16,1), ReLU, 4 x [Conv2d(c,2c,2,2), ReLU]
         * (16 -> 256 channels, 256 -> 16 spatial); decoder 4 x
         * [ConvTranspose2d(c,c/2,2,2), ReLU] (256 -> 16 channels, 16 -> 256
         * spatial), Conv2d(16,10,1). Names as two nn.Sequential members
         * `encoder` and `decoder` of one module: 349,114 parameters. */
        m->in_c = 3;
        m->in_h = m->in_w = 256;
        m->n_classes = 10;
        char n[SF_LAYER_NAME_MAX];
        int idx = 0, c = 16;
        sf_layer *L = push(m, SF_L_CONV2D);
        snprintf(L->name, sizeof L->name, "encoder.%d", idx++);
        L->in_c = 3, L->out_c = 16, L->k = 1, L->stride = 1, L->bias = 1;
        snprintf(n, sizeof n, "encoder.%d", idx++);
        push_named(m, SF_L_RELU, n);
        for (int i = 0; i < 4; i++, c *= 2) {
            L = push(m, SF_L_CONV2D);
            snprintf(L->name, sizeof L->name, "encoder.%d", idx++);
            L->in_c = c, L->out_c = 2 * c, L->k = 2, L->stride = 2, L->bias = 1;
            snprintf(n, sizeof n, "encoder.%d", idx++);
            push_named(m, SF_L_RELU, n);
        }
        idx = 0;
        for (int i = 0; i < 4; i++, c /= 2) {
            L = push(m, SF_L_CONV_TRANSPOSE2D);
            snprintf(L->name, sizeof L->name, "decoder.%d", idx++);
            L->in_c = c, L->out_c = c / 2, L->k = 2, L->stride = 2, L->bias = 1;
            snprintf(n, sizeof n, "decoder.%d", idx++);
            push_named(m, SF_L_RELU, n);
        }
        L = push(m, SF_L_CONV2D);
        snprintf(L->name, sizeof L->name, "decoder.%d", idx++);
        L->in_c = 16, L->out_c = 10, L->k = 1, L->stride = 1, L->bias = 1;
    } else if (strcmp(name, "resnet18") == 0) {
        /* W3: torchvision.models.resnet18(num_classes=10): conv1 7x7/2, bn1,
         * relu, maxpool 3/2 pad 1, layer1..layer4 of two BasicBlocks each
         * (64, 128, 256, 512 channels; downsample.0/1 where the stride or the
         * width changes), avgpool, flatten, fc. 11,181,642 parameters. */
        m->in_c = 3;
        m->in_h = m->in_w = 224;
        m->n_classes = 10;
        push_tv_conv(m, "conv1", 3, 64, 7, 2, 3, SF_IN_MODEL);
        push_named(m, SF_L_BATCHNORM2D, "bn1");
        push_named(m, SF_L_RELU, "relu");
        sf_layer *P = push_named(m, SF_L_MAXPOOL2D, "maxpool");
        P->k = 3, P->stride = 2, P->pad = 1;
        int x = m->n_layers - 1, c = 64;
        for (int s = 0; s < 4; s++) {
            int co = 64 << s;
            char p[SF_LAYER_NAME_MAX];
            snprintf(p, sizeof p, "layer%d.0", s + 1);
            x = push_basic_block(m, p, x, c, co, s == 0 ? 1 : 2);
            snprintf(p, sizeof p, "layer%d.1", s + 1);
            x = push_basic_block(m, p, x, co, co, 1);
            c = co;
        }
        push_named(m, SF_L_GLOBAL_AVGPOOL, "avgpool");
        push_named(m, SF_L_FLATTEN, "flatten");
        sf_layer *F = push_named(m, SF_L_LINEAR, "fc");
        F->in_c = 512, F->out_c = 10, F->bias = 1;
    } else {
        sf_errf(err, errlen, "unknown model preset \"%s\" (known: seed-classifier, seed-encdec, "
                "resnet18, tiny)", name);
        return -1;
    }
    snprintf(m->preset, sizeof m->preset, "%s", name);
    return sf_model_resolve(m, err, errlen);
}

/* ---- JSON --------------------------------------------------------------- */

/* Reads an integer field. Returns 1 when present and valid, 0 when absent,
 * -1 (err filled) when present but not an integer in [lo, hi]. */
static int json_int(const cJSON *obj, const char *key, int lo, int hi, int *out,
                    const char *what, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble < lo || v->valuedouble > hi) {
        sf_errf(err, errlen, "%s: \"%s\" must be an integer in [%d,%d]", what, key, lo, hi);
        return -1;
    }
    *out = (int)v->valuedouble;
    return 1;
}

/* "inputs": [a, b, ...], each an earlier layer's index, its name, or -1 for
 * the model input. Names are looked up among the layers parsed before. */
static int parse_inputs(const cJSON *ji, const sf_model *m, int idx, sf_layer *L, const char *what,
                        char *err, size_t errlen)
{
    int n = cJSON_IsArray(ji) ? cJSON_GetArraySize(ji) : -1;
    if (n < 1 || n > SF_MAX_IN) {
        sf_errf(err, errlen, "%s: \"inputs\" must be an array of 1 to %d layer indices or names", what,
                SF_MAX_IN);
        return -1;
    }
    int j = 0;
    for (const cJSON *v = ji->child; v; v = v->next, j++) {
        if (cJSON_IsString(v)) {
            int found = -2;
            for (int k = 0; k < idx; k++)
                if (strcmp(m->layers[k].name, v->valuestring) == 0)
                    found = k;
            if (found < -1) {
                sf_errf(err, errlen, "%s: input \"%.40s\" names no earlier layer", what, v->valuestring);
                return -1;
            }
            L->in[j] = found;
        } else if (cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && v->valuedouble >= -1 &&
                   v->valuedouble < idx) {
            L->in[j] = (int)v->valuedouble;
        } else {
            sf_errf(err, errlen, "%s: input %d must be an earlier layer's index (0..%d), its name, or -1 "
                    "(the model input)", what, j, idx - 1);
            return -1;
        }
    }
    L->n_in = n;
    return 0;
}

/* Reads field f of a layer object into L (the default when absent).
 * 0, or -1 with err naming the field and its bounds. */
static int parse_field(const cJSON *jl, const sf_layer_field *f, sf_layer *L, const char *what, char *err,
                       size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(jl, f->key);
    char *p = (char *)L + f->off;
    if (!v) {
        if (f->flags & SF_FF_REQUIRED) {
            if (strcmp(f->key, "k") == 0)
                sf_errf(err, errlen, "%s: missing \"k\" (kernel size)", what);
            else if (f->type == SF_FT_INT && f->lo >= 1)
                sf_errf(err, errlen, "%s: missing \"%s\" (a positive integer)", what, f->key);
            else
                sf_errf(err, errlen, "%s: missing \"%s\"", what, f->key);
            return -1;
        }
        return 0; /* sf_layer_set_defaults put the default there */
    }
    switch (f->type) {
    case SF_FT_INT: {
        int x;
        if (json_int(jl, f->key, (int)f->lo, (int)f->hi, &x, what, err, errlen) < 0)
            return -1;
        *(int *)p = x;
        return 0;
    }
    case SF_FT_BOOL:
        if (!cJSON_IsBool(v)) {
            sf_errf(err, errlen, "%s: \"%s\" must be true or false", what, f->key);
            return -1;
        }
        *(int *)p = cJSON_IsTrue(v);
        return 0;
    case SF_FT_FLOAT: {
        const double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
        const int lo_ok = (f->flags & SF_FF_LO_OPEN) ? d > f->lo : d >= f->lo;
        const int hi_ok = (f->flags & SF_FF_HI_OPEN) ? d < f->hi : d <= f->hi;
        if (!cJSON_IsNumber(v) || !isfinite(d) || !lo_ok || !hi_ok) {
            sf_errf(err, errlen, "%s: \"%s\" must be a number in %c%g,%g%c", what, f->key,
                    (f->flags & SF_FF_LO_OPEN) ? '(' : '[', f->lo, f->hi, (f->flags & SF_FF_HI_OPEN) ? ')' : ']');
            return -1;
        }
        *(float *)p = (float)d;
        return 0;
    }
    case SF_FT_ENUM:
        for (int c = 0; cJSON_IsString(v) && f->choices[c]; c++)
            if (strcmp(v->valuestring, f->choices[c]) == 0) {
                *(int *)p = c;
                return 0;
            }
        {
            char list[160] = "";
            size_t at = 0;
            for (int c = 0; f->choices[c] && at < sizeof list; c++)
                at += (size_t)snprintf(list + at, sizeof list - at, "%s\"%s\"", c ? ", " : "", f->choices[c]);
            sf_errf(err, errlen, "%s: \"%s\" must be one of %s", what, f->key, list);
        }
        return -1;
    case SF_FT_INT_PAIR: /* [h, w] */
    case SF_FT_INT_HW: { /* one integer for both dimensions, or [h, w] */
        const int pair = cJSON_IsArray(v), scalar_ok = f->type == SF_FT_INT_HW;
        int ok = pair ? cJSON_GetArraySize(v) == 2 : scalar_ok;
        int xy[2] = {0, 0};
        for (int d = 0; ok && d < 2; d++) {
            const cJSON *e = pair ? cJSON_GetArrayItem(v, d) : v;
            ok = cJSON_IsNumber(e) && e->valuedouble == floor(e->valuedouble) && e->valuedouble >= f->lo &&
                 e->valuedouble <= f->hi;
            if (ok)
                xy[d] = (int)e->valuedouble;
        }
        if (!ok) {
            sf_errf(err, errlen, scalar_ok ? "%s: \"%s\" must be an integer in [%g,%g] or [h, w] of them"
                                           : "%s: \"%s\" must be [h, w], integers in [%g,%g]",
                    what, f->key, f->lo, f->hi);
            return -1;
        }
        *(int *)p = xy[0];
        *(int *)((char *)L + SF_FT_SECOND(f)) = xy[1];
        return 0;
    }
    case SF_FT_INT_QUAD: { /* [a, b, c, d], stored as int[4] */
        int ok = cJSON_IsArray(v) && cJSON_GetArraySize(v) == 4, q[4] = {0, 0, 0, 0};
        for (int d = 0; ok && d < 4; d++) {
            const cJSON *e = cJSON_GetArrayItem(v, d);
            ok = cJSON_IsNumber(e) && e->valuedouble == floor(e->valuedouble) && e->valuedouble >= f->lo &&
                 e->valuedouble <= f->hi;
            if (ok)
                q[d] = (int)e->valuedouble;
        }
        if (!ok) {
            sf_errf(err, errlen, "%s: \"%s\" must be [left, right, top, bottom], integers in [%g,%g]", what,
                    f->key, f->lo, f->hi);
            return -1;
        }
        memcpy(p, q, sizeof q);
        return 0;
    }
    }
    return -1;
}

/* A renamed parameter's suffix: 1 to SF_PARAM_SUFFIX_MAX - 1 letters,
 * digits, '_' and '.', with no '.' at either end and no two together (a
 * state_dict key's path segments). */
static int valid_suffix(const char *s)
{
    const size_t n = strlen(s);
    if (n == 0 || n >= SF_PARAM_SUFFIX_MAX || s[0] == '.' || s[n - 1] == '.' || strstr(s, ".."))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '.'))
            return 0;
    return 1;
}

/* "param_names": {"in_proj_weight": "qkv.weight", ...}, the state_dict
 * suffixes of the layer's parameters where the module holding them names
 * them otherwise than the kind does (timm's Attention holds
 * nn.MultiheadAttention's projections as its Linear submodules qkv and
 * proj); "" keys the parameter by the layer's name itself (a parameter a
 * module holds directly beside others of its kind: ResMLP's block holds
 * ls1 and ls2, two layer scales named blocks.0.ls1 and blocks.0.ls2). Keys
 * are the kind's own suffixes (docs/LAYERS.md), each once; the layer's
 * suffixes stay distinct, its buffers' included. Fields are parsed first:
 * which parameters a layer has depends on them (a bias). */
static int parse_param_names(const cJSON *jp, sf_layer *L, const char *what, char *err, size_t errlen)
{
    sf_param_desc pd[SF_PARAM_SLOTS];
    const int np = sf_layer_params(L, pd);
    char own[200] = "";
    for (int j = 0, at = 0; j < np && at < (int)sizeof own; j++)
        if (pd[j].suffix[0])
            at += snprintf(own + at, sizeof own - (size_t)at, "%s%s", at ? ", " : "", pd[j].suffix);
    if (!cJSON_IsObject(jp) || !jp->child || !own[0]) {
        sf_errf(err, errlen, "%s: \"param_names\" must map some of its parameters (%s) to the names the "
                "module gives them, e.g. {\"weight\": \"proj.weight\"}", what, own[0] ? own : "it has none");
        return -1;
    }
    for (const cJSON *it = jp->child; it; it = it->next) {
        int j = 0;
        while (j < np && !(pd[j].suffix[0] && it->string && strcmp(pd[j].suffix, it->string) == 0))
            j++;
        if (j == np) {
            sf_errf(err, errlen, "%s: \"param_names\": \"%.40s\" is not one of its parameters (%s)", what,
                    it->string ? it->string : "", own);
            return -1;
        }
        if (L->param_names[j][0]) {
            sf_errf(err, errlen, "%s: \"param_names\" names \"%s\" twice", what, pd[j].suffix);
            return -1;
        }
        const int bare = cJSON_IsString(it) && !it->valuestring[0];
        if (!cJSON_IsString(it) || (!bare && !valid_suffix(it->valuestring))) {
            sf_errf(err, errlen, "%s: \"param_names\".\"%s\" must be 1 to %d letters, digits, '_' and '.' "
                    "(no '.' at either end or two together), or \"\" for the layer's name itself", what,
                    pd[j].suffix, SF_PARAM_SUFFIX_MAX - 1);
            return -1;
        }
        snprintf(L->param_names[j], sizeof L->param_names[j], "%s", bare ? SF_PARAM_BARE : it->valuestring);
    }
    const sf_layer_kind_info *k = sf_layer_info(L->kind);
    const int np2 = sf_layer_params(L, pd);
    for (int a = 0; a < np2; a++) {
        for (int b = a + 1; b < np2; b++)
            if (strcmp(pd[a].suffix, pd[b].suffix) == 0) {
                sf_errf(err, errlen, "%s: \"param_names\" gives two parameters the name \"%s\"", what,
                        pd[a].suffix);
                return -1;
            }
        for (const char *const *bf = k->buffers; bf && *bf; bf++)
            if (strcmp(pd[a].suffix, *bf) == 0) {
                sf_errf(err, errlen, "%s: \"param_names\" gives a parameter its buffer's name \"%s\"", what,
                        *bf);
                return -1;
            }
    }
    return 0;
}

static int parse_layer(const cJSON *jl, int idx, const sf_model *m, sf_layer *L, char *err,
                       size_t errlen)
{
    char what[64];
    memset(L, 0, sizeof *L);
    if (!cJSON_IsObject(jl)) {
        sf_errf(err, errlen, "layer %d: must be an object", idx);
        return -1;
    }
    const cJSON *jt = cJSON_GetObjectItemCaseSensitive(jl, "type");
    if (!cJSON_IsString(jt)) {
        sf_errf(err, errlen, "layer %d: missing string \"type\"", idx);
        return -1;
    }
    const int kind = sf_layer_kind_from_name(jt->valuestring);
    if (kind < 0) {
        char known[512];
        sf_layer_kind_list(known, sizeof known);
        sf_errf(err, errlen, "layer %d (%.40s): unknown layer type (known: %s)", idx, jt->valuestring, known);
        return -1;
    }
    L->kind = (sf_layer_kind)kind;
    const sf_layer_kind_info *k = sf_layer_info(L->kind);
    snprintf(what, sizeof what, "layer %d (%s)", idx, k->name);

    for (const cJSON *it = jl->child; it; it = it->next) {
        int known = it->string && (!strcmp(it->string, "type") || !strcmp(it->string, "name") ||
                                   !strcmp(it->string, "inputs") || !strcmp(it->string, "param_names"));
        for (const sf_layer_field *f = k->fields; !known && it->string && f->key; f++)
            known = strcmp(it->string, f->key) == 0;
        if (!known) {
            sf_errf(err, errlen, "%s: unknown field \"%.40s\"", what, it->string ? it->string : "");
            return -1;
        }
    }
    const cJSON *ji = cJSON_GetObjectItemCaseSensitive(jl, "inputs");
    if (ji && parse_inputs(ji, m, idx, L, what, err, errlen) != 0)
        return -1;

    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(jl, "name");
    if (jn) {
        if (!cJSON_IsString(jn) || jn->valuestring[0] == '\0' ||
            strlen(jn->valuestring) >= SF_LAYER_NAME_MAX) {
            sf_errf(err, errlen, "%s: \"name\" must be a non-empty string shorter than %d", what,
                    SF_LAYER_NAME_MAX);
            return -1;
        }
        snprintf(L->name, sizeof L->name, "%s", jn->valuestring);
    } else {
        snprintf(L->name, sizeof L->name, "%d", idx);
    }
    /* Every field starts at its default; "in" stays 0 (inferred). */
    sf_layer_set_defaults(L);
    for (const sf_layer_field *f = k->fields; f->key; f++)
        if (parse_field(jl, f, L, what, err, errlen) != 0)
            return -1;
    const cJSON *jp = cJSON_GetObjectItemCaseSensitive(jl, "param_names");
    return jp ? parse_param_names(jp, L, what, err, errlen) : 0;
}

int sf_model_from_json(const char *json, sf_model *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (!json) {
        sf_errf(err, errlen, "model spec missing");
        return -1;
    }
    cJSON *root = cJSON_Parse(json);
    int rc = -1;
    if (!root) {
        sf_errf(err, errlen, "model spec is not valid JSON");
        return -1;
    }
    if (!cJSON_IsObject(root)) {
        sf_errf(err, errlen, "model spec must be a JSON object");
        goto out;
    }
    for (const cJSON *it = root->child; it; it = it->next) {
        if (!it->string || (strcmp(it->string, "input") && strcmp(it->string, "classes") &&
                            strcmp(it->string, "layers"))) {
            sf_errf(err, errlen, "model spec: unknown field \"%.40s\" (known: input, classes, layers)",
                    it->string ? it->string : "");
            goto out;
        }
    }
    const cJSON *jin = cJSON_GetObjectItemCaseSensitive(root, "input");
    if (!cJSON_IsArray(jin) || cJSON_GetArraySize(jin) != 3) {
        sf_errf(err, errlen, "model spec: \"input\" must be [C,H,W]");
        goto out;
    }
    int dims[3];
    for (int d = 0; d < 3; d++) {
        const cJSON *v = cJSON_GetArrayItem(jin, d);
        int hi = d == 0 ? SF_MAX_CHANNELS : SF_MAX_SPATIAL;
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 ||
            v->valuedouble > hi) {
            sf_errf(err, errlen, "model spec: \"input\"[%d] must be an integer in [1,%d]", d, hi);
            goto out;
        }
        dims[d] = (int)v->valuedouble;
    }
    m->in_c = dims[0];
    m->in_h = dims[1];
    m->in_w = dims[2];
    int r = json_int(root, "classes", 1, SF_MAX_CHANNELS, &m->n_classes, "model spec", err, errlen);
    if (r == 0)
        sf_errf(err, errlen, "model spec: missing \"classes\" (an integer in [1,%d])", SF_MAX_CHANNELS);
    if (r <= 0)
        goto out;
    const cJSON *jl = cJSON_GetObjectItemCaseSensitive(root, "layers");
    if (!cJSON_IsArray(jl)) {
        sf_errf(err, errlen, "model spec: \"layers\" must be an array");
        goto out;
    }
    int nl = cJSON_GetArraySize(jl);
    if (nl < 1 || nl > SF_MAX_LAYERS) {
        sf_errf(err, errlen, "model spec: %d layers (1..%d allowed)", nl, SF_MAX_LAYERS);
        goto out;
    }
    /* in_c is inferred, and every shape error is found, by sf_model_resolve,
     * which walks the layers in order and names the first that fails. */
    int idx = 0;
    for (const cJSON *it = jl->child; it; it = it->next, idx++)
        if (parse_layer(it, idx, m, &m->layers[idx], err, errlen) != 0)
            goto out;
    m->n_layers = nl;
    snprintf(m->preset, sizeof m->preset, "custom");
    rc = sf_model_resolve(m, err, errlen);
out:
    cJSON_Delete(root);
    return rc;
}

/* ---- initialisation ----------------------------------------------------- */

void sf_model_init_params(const sf_model *m, uint64_t seed, float *params)
{
    for (int li = 0; li < m->n_layers; li++) {
        const sf_layer *L = &m->layers[li];
        const sf_layer_kind_info *k = sf_layer_info(L->kind);
        if ((L->n_w || L->n_b) && k && k->init)
            k->init(L, li, seed, params);
    }
}

void sf_model_init_buffers(const sf_model *m, float *buffers)
{
    for (int li = 0; li < m->n_layers; li++) {
        const sf_layer *L = &m->layers[li];
        const sf_layer_kind_info *k = sf_layer_info(L->kind);
        if (!k || !k->buffers)
            continue;
        for (int ch = 0; ch < L->out_ch; ch++) {
            buffers[L->rm_off + (size_t)ch] = 0.0f;
            buffers[L->rv_off + (size_t)ch] = 1.0f;
        }
    }
}
