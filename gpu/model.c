/* gpu/model.c — model descriptions: presets, the JSON layer list, shape
 * resolution and PyTorch-style default initialisation. See gpu/model.h. */
#include "gpu/common.h"
#include "model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "rng.h"

/* Bounds that keep every size computation far from overflow and reject
 * absurd specs early (a model past them could not be allocated anyway). */
#define MAX_CHANNELS (1 << 16)      /* channels or features of one layer */
#define MAX_SPATIAL (1 << 14)       /* input height/width */
#define MAX_KERNEL 64
#define MAX_PARAMS ((size_t)1 << 31) /* floats of the parameter buffer (8 GiB) */
#define MAX_ACT ((size_t)1 << 30)    /* floats of one sample's activation */



static const char *const kind_names[SF_L_KIND_COUNT] = {
    [SF_L_CONV2D] = "conv2d",
    [SF_L_RELU] = "relu",
    [SF_L_FLATTEN] = "flatten",
    [SF_L_LINEAR] = "linear",
    [SF_L_CONV_TRANSPOSE2D] = "conv_transpose2d",
    [SF_L_BATCHNORM2D] = "batchnorm2d",
    [SF_L_MAXPOOL2D] = "maxpool2d",
    [SF_L_GLOBAL_AVGPOOL] = "global_avgpool",
};

const char *sf_layer_kind_name(sf_layer_kind k)
{
    if ((int)k < 0 || k >= SF_L_KIND_COUNT)
        return "unknown";
    return kind_names[k];
}

static int kind_supported(sf_layer_kind k)
{
    return k == SF_L_CONV2D || k == SF_L_RELU || k == SF_L_FLATTEN || k == SF_L_LINEAR;
}

/* ---- resolution --------------------------------------------------------- */

int sf_model_resolve(sf_model *m, char *err, size_t errlen)
{
    if (m->in_c < 1 || m->in_h < 1 || m->in_w < 1 || m->in_c > MAX_CHANNELS ||
        m->in_h > MAX_SPATIAL || m->in_w > MAX_SPATIAL) {
        sf_errf(err, errlen, "model input %dx%dx%d out of range (C in [1,%d], H,W in [1,%d])",
                m->in_c, m->in_h, m->in_w, MAX_CHANNELS, MAX_SPATIAL);
        return -1;
    }
    if (m->n_layers < 1 || m->n_layers > SF_MAX_LAYERS) {
        sf_errf(err, errlen, "model has %d layers (1..%d allowed)", m->n_layers, SF_MAX_LAYERS);
        return -1;
    }
    if (m->n_classes < 1 || m->n_classes > MAX_CHANNELS) {
        sf_errf(err, errlen, "model classes %d out of range [1,%d]", m->n_classes, MAX_CHANNELS);
        return -1;
    }

    if ((size_t)m->in_c * m->in_h * m->in_w > MAX_ACT) {
        sf_errf(err, errlen, "model input %dx%dx%d is too large", m->in_c, m->in_h, m->in_w);
        return -1;
    }

    int c = m->in_c, h = m->in_h, w = m->in_w;
    int flat = 0; /* 1 after a flatten: the tensor is [features] */
    size_t off = 0;
    size_t max_act = (size_t)c * h * w;

    for (int i = 0; i < m->n_layers; i++) {
        sf_layer *L = &m->layers[i];
        const char *kn = sf_layer_kind_name(L->kind);
        if ((int)L->kind < 0 || L->kind >= SF_L_KIND_COUNT) {
            sf_errf(err, errlen, "layer %d: unknown layer kind %d", i, (int)L->kind);
            return -1;
        }
        if (!kind_supported(L->kind)) {
            sf_errf(err, errlen, "layer %d (%s): not supported yet", i, kn);
            return -1;
        }
        if (L->name[0] == '\0')
            snprintf(L->name, sizeof L->name, "%d", i);
        for (int j = 0; j < i; j++)
            if (strncmp(m->layers[j].name, L->name, sizeof L->name) == 0) {
                sf_errf(err, errlen, "layer %d (%s): name \"%s\" is already used by layer %d", i, kn,
                        L->name, j);
                return -1;
            }
        if (L->in_c != 0 && L->in_c != c) {
            sf_errf(err, errlen, "layer %d (%s): declared input %d does not match the previous output %d",
                    i, kn, L->in_c, c);
            return -1;
        }
        L->in_c = c;
        L->in_h = h;
        L->in_w = w;
        L->n_w = L->n_b = 0;
        L->w_off = L->b_off = 0;

        switch (L->kind) {
        case SF_L_CONV2D: {
            if (flat) {
                sf_errf(err, errlen, "layer %d (%s): input is flattened; conv2d needs [C,H,W]", i, kn);
                return -1;
            }
            if (L->out_c < 1 || L->out_c > MAX_CHANNELS) {
                sf_errf(err, errlen, "layer %d (%s): out channels %d out of range [1,%d]", i, kn,
                        L->out_c, MAX_CHANNELS);
                return -1;
            }
            if (L->k < 1 || L->k > MAX_KERNEL || L->stride < 1 || L->stride > MAX_KERNEL ||
                L->pad < 0 || L->pad > MAX_KERNEL) {
                sf_errf(err, errlen, "layer %d (%s): k=%d stride=%d pad=%d out of range "
                        "(k,stride in [1,%d], pad in [0,%d])", i, kn, L->k, L->stride, L->pad,
                        MAX_KERNEL, MAX_KERNEL);
                return -1;
            }
            int eh = h + 2 * L->pad - L->k, ew = w + 2 * L->pad - L->k;
            if (eh < 0 || ew < 0) {
                sf_errf(err, errlen, "layer %d (%s): kernel %d does not fit the %dx%d input (pad %d)",
                        i, kn, L->k, h, w, L->pad);
                return -1;
            }
            L->out_h = eh / L->stride + 1;
            L->out_w = ew / L->stride + 1;
            L->out_ch = L->out_c;
            L->n_w = (size_t)L->out_c * c * L->k * L->k;
            L->n_b = L->bias ? (size_t)L->out_c : 0;
            break;
        }
        case SF_L_RELU:
            L->out_c = c;
            L->out_h = h;
            L->out_w = w;
            L->out_ch = c;
            break;
        case SF_L_FLATTEN: {
            size_t feat = (size_t)c * h * w;
            if (feat > MAX_ACT) {
                sf_errf(err, errlen, "layer %d (%s): %zu features is too many", i, kn, feat);
                return -1;
            }
            L->out_c = (int)feat;
            L->out_h = L->out_w = 1;
            L->out_ch = (int)feat;
            break;
        }
        case SF_L_LINEAR:
            if (!flat && (h != 1 || w != 1)) {
                sf_errf(err, errlen, "layer %d (%s): input is [%d,%d,%d]; add a flatten layer before linear",
                        i, kn, c, h, w);
                return -1;
            }
            if (L->out_c < 1 || L->out_c > MAX_CHANNELS) {
                sf_errf(err, errlen, "layer %d (%s): out features %d out of range [1,%d]", i, kn,
                        L->out_c, MAX_CHANNELS);
                return -1;
            }
            L->out_h = L->out_w = 1;
            L->out_ch = L->out_c;
            L->n_w = (size_t)L->out_c * c;
            L->n_b = L->bias ? (size_t)L->out_c : 0;
            break;
        default:
            sf_errf(err, errlen, "layer %d (%s): not supported yet", i, kn);
            return -1;
        }

        L->out_elems = (size_t)L->out_ch * L->out_h * L->out_w;
        if (L->out_elems > MAX_ACT) {
            sf_errf(err, errlen, "layer %d (%s): output of %zu floats per sample is too large", i, kn,
                    L->out_elems);
            return -1;
        }
        if (L->n_w) {
            L->w_off = off;
            off += L->n_w;
        }
        if (L->n_b) {
            L->b_off = off;
            off += L->n_b;
        }
        if (off > MAX_PARAMS) {
            sf_errf(err, errlen, "layer %d (%s): model exceeds %zu parameters", i, kn, MAX_PARAMS);
            return -1;
        }
        if (L->out_elems > max_act)
            max_act = L->out_elems;

        if (L->kind == SF_L_FLATTEN)
            flat = 1;
        c = L->out_ch;
        h = L->out_h;
        w = L->out_w;
    }

    const sf_layer *last = &m->layers[m->n_layers - 1];
    if (last->out_elems != (size_t)m->n_classes) {
        sf_errf(err, errlen, "layer %d (%s): output has %zu values per sample but the model has %d classes",
                m->n_layers - 1, sf_layer_kind_name(last->kind), last->out_elems, m->n_classes);
        return -1;
    }
    m->n_params = off;
    m->max_act = max_act;
    return 0;
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
    } else {
        sf_errf(err, errlen, "unknown model preset \"%s\" (known: seed-classifier, tiny)", name);
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

static int parse_kind(const char *s, sf_layer_kind *k)
{
    for (int i = 0; i < SF_L_KIND_COUNT; i++)
        if (strcmp(s, kind_names[i]) == 0) {
            *k = (sf_layer_kind)i;
            return 0;
        }
    return -1;
}

static int key_allowed(const char *key, const char *const *allowed)
{
    for (; *allowed; allowed++)
        if (strcmp(key, *allowed) == 0)
            return 1;
    return 0;
}

static int parse_layer(const cJSON *jl, int idx, sf_layer *L, char *err, size_t errlen)
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
    if (parse_kind(jt->valuestring, &L->kind) != 0) {
        sf_errf(err, errlen, "layer %d (%.40s): unknown layer type (known: conv2d, relu, flatten, linear)",
                idx, jt->valuestring);
        return -1;
    }
    snprintf(what, sizeof what, "layer %d (%s)", idx, sf_layer_kind_name(L->kind));
    if (!kind_supported(L->kind)) {
        sf_errf(err, errlen, "%s: not supported yet", what);
        return -1;
    }

    static const char *const conv_keys[] = {"type", "name", "in", "out", "k", "stride", "pad", "bias", NULL};
    static const char *const lin_keys[] = {"type", "name", "in", "out", "bias", NULL};
    static const char *const plain_keys[] = {"type", "name", NULL};
    const char *const *allowed = L->kind == SF_L_CONV2D ? conv_keys
                                 : L->kind == SF_L_LINEAR ? lin_keys
                                                          : plain_keys;
    for (const cJSON *it = jl->child; it; it = it->next) {
        if (!it->string || !key_allowed(it->string, allowed)) {
            sf_errf(err, errlen, "%s: unknown field \"%.40s\"", what, it->string ? it->string : "");
            return -1;
        }
    }

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

    if (L->kind == SF_L_CONV2D || L->kind == SF_L_LINEAR) {
        int r; /* "in" is optional; resolve checks it against the previous layer */
        if (json_int(jl, "in", 1, MAX_CHANNELS, &L->in_c, what, err, errlen) < 0)
            return -1;
        if ((r = json_int(jl, "out", 1, MAX_CHANNELS, &L->out_c, what, err, errlen)) <= 0) {
            if (r == 0)
                sf_errf(err, errlen, "%s: missing \"out\" (a positive integer)", what);
            return -1;
        }
        L->bias = 1;
        const cJSON *jb = cJSON_GetObjectItemCaseSensitive(jl, "bias");
        if (jb) {
            if (!cJSON_IsBool(jb)) {
                sf_errf(err, errlen, "%s: \"bias\" must be true or false", what);
                return -1;
            }
            L->bias = cJSON_IsTrue(jb);
        }
    }
    if (L->kind == SF_L_CONV2D) {
        int r;
        if ((r = json_int(jl, "k", 1, MAX_KERNEL, &L->k, what, err, errlen)) <= 0) {
            if (r == 0)
                sf_errf(err, errlen, "%s: missing \"k\" (kernel size)", what);
            return -1;
        }
        L->stride = 1;
        L->pad = 0;
        if (json_int(jl, "stride", 1, MAX_KERNEL, &L->stride, what, err, errlen) < 0 ||
            json_int(jl, "pad", 0, MAX_KERNEL, &L->pad, what, err, errlen) < 0)
            return -1;
    }
    return 0;
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
        int hi = d == 0 ? MAX_CHANNELS : MAX_SPATIAL;
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
    int r = json_int(root, "classes", 1, MAX_CHANNELS, &m->n_classes, "model spec", err, errlen);
    if (r == 0)
        sf_errf(err, errlen, "model spec: missing \"classes\" (an integer in [1,%d])", MAX_CHANNELS);
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
        if (parse_layer(it, idx, &m->layers[idx], err, errlen) != 0)
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
        if (L->n_w == 0 && L->n_b == 0)
            continue;
        size_t fan_in = L->kind == SF_L_CONV2D ? (size_t)L->in_c * L->k * L->k : (size_t)L->in_c;
        double bound = 1.0 / sqrt((double)fan_in);
        /* Element e of the layer: weight elements first, then bias elements;
         * u in [0,1) -> value in [-bound, bound). */
        for (size_t e = 0; e < L->n_w + L->n_b; e++) {
            double u = sf_u01(sf_hash4(seed, (uint64_t)li, (uint64_t)e, 0));
            float v = (float)((2.0 * u - 1.0) * bound);
            if (e < L->n_w)
                params[L->w_off + e] = v;
            else
                params[L->b_off + (e - L->n_w)] = v;
        }
    }
}
