/* server/checkpoint_format.c — see checkpoint_format.h. */
#include "server/checkpoint_format.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gpu/layers.h"

#define MAX_TENSORS 65536         /* tensors of one file we agree to look at */
#define OPT_PREFIX "optim."
#define MOM_SUFFIX ".momentum_buffer"  /* SGD */
#define AVG_SUFFIX ".exp_avg"          /* AdamW: first moment */
#define SQ_SUFFIX ".exp_avg_sq"        /* AdamW: second moment */
#define NBT_SUFFIX ".num_batches_tracked"
#define FORMAT_NAME "streamfeed.checkpoint"

enum { K_PARAM = 0, K_BUF, K_NBT, K_OPT1, K_OPT2, K_STEP };

/* ---- errors ------------------------------------------------------------------ */

void sf_ckpt_fail(sf_ckpt_error *e, int status, const char *code, const char *field, const char *fmt, ...)
{
    if (!e)
        return;
    e->status = status;
    snprintf(e->code, sizeof e->code, "%s", code);
    snprintf(e->field, sizeof e->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
}
#define fail sf_ckpt_fail

/* ---- the layout ---------------------------------------------------------------- */

static char *model_to_json(const sf_model *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *in = cJSON_AddArrayToObject(o, "input");
    cJSON_AddItemToArray(in, cJSON_CreateNumber(m->in_c));
    cJSON_AddItemToArray(in, cJSON_CreateNumber(m->in_h));
    cJSON_AddItemToArray(in, cJSON_CreateNumber(m->in_w));
    cJSON_AddNumberToObject(o, "classes", m->n_classes);
    cJSON *layers = cJSON_AddArrayToObject(o, "layers");
    for (int i = 0; i < m->n_layers; i++) {
        const sf_layer *L = &m->layers[i];
        cJSON *l = cJSON_CreateObject();
        cJSON_AddStringToObject(l, "type", sf_layer_kind_name(L->kind));
        cJSON_AddStringToObject(l, "name", L->name);
        if (L->n_in > 0) {
            /* Residual wiring: the inputs by name (-1: the model input). */
            cJSON *ins = cJSON_AddArrayToObject(l, "inputs");
            for (int j = 0; j < L->n_in; j++)
                cJSON_AddItemToArray(ins, L->in[j] == SF_IN_MODEL
                                              ? cJSON_CreateNumber(-1)
                                              : cJSON_CreateString(m->layers[L->in[j]].name));
        }
        sf_layer_fields_to_json(L, l);
        cJSON_AddItemToArray(layers, l);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static char *metadata_json(const sf_ckpt_layout *ck, uint64_t step, uint64_t hash, const char *backend)
{
    char buf[32];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", FORMAT_NAME);
    snprintf(buf, sizeof buf, "%d", SF_CKPT_FORMAT_VERSION);
    cJSON_AddStringToObject(o, "format_version", buf);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)step);
    cJSON_AddStringToObject(o, "step", buf);
    cJSON_AddStringToObject(o, "model", ck->model_json);
    cJSON_AddStringToObject(o, "optimizer", ck->adamw ? "adamw" : "sgd");
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)hash);
    cJSON_AddStringToObject(o, "config_hash", buf);
    cJSON_AddStringToObject(o, "backend", backend ? backend : "none");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

int sf_ckpt_n_tensors(const sf_ckpt_layout *ck, int with_opt) { return with_opt ? ck->n_desc : ck->o10; }

/* What block of the file layout desc[k] lies in (K_*) and its index there. */
static int desc_kind(const sf_ckpt_layout *ck, int k, int *idx)
{
    int kind = k < ck->bt0 ? K_PARAM : k < ck->nb0 ? K_BUF : k < ck->o10 ? K_NBT
             : k == ck->n_desc - 1 ? K_STEP : k < ck->o20 ? K_OPT1 : K_OPT2;
    int base = kind == K_PARAM ? 0 : kind == K_BUF ? ck->bt0 : kind == K_NBT ? ck->nb0
             : kind == K_OPT1 ? ck->o10 : kind == K_OPT2 ? ck->o20 : k;
    if (idx)
        *idx = k - base;
    return kind;
}

static void set_desc(sf_ckpt_layout *ck, int k, const char *name, sf_st_dtype dt, int ndim, const int64_t *shape)
{
    snprintf(ck->desc_names[k], sizeof ck->desc_names[k], "%s", name);
    ck->desc[k].name = ck->desc_names[k];
    ck->desc[k].dtype = dt;
    ck->desc[k].ndim = ndim;
    if (ndim)
        memcpy(ck->desc[k].shape, shape, (size_t)ndim * sizeof shape[0]);
}

int sf_ckpt_layout_init(sf_ckpt_layout *ck, const sf_model *m, int adamw, char *err, size_t errlen)
{
    ck->model = m;
    ck->adamw = adamw;
    ck->n_pt = ck->n_bt = ck->n_bn = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const sf_layer *L = &m->layers[i];
        /* The parameters as the registry names and shapes them (gpu/layers.c). */
        sf_param_desc pd[SF_PARAM_SLOTS];
        const int np = sf_layer_params(L, pd);
        for (int part = 0; part < np; part++) {
            size_t n = L->p_n[part];
            if (!n)
                continue;
            sf_ckpt_tensor *t = &ck->pt[ck->n_pt++];
            sf_layer_param_key(L, &pd[part], t->name, sizeof t->name);
            t->off = L->p_off[part];
            t->n = n;
            t->ndim = pd[part].ndim;
            for (int d = 0; d < t->ndim; d++)
                t->shape[d] = pd[part].shape[d];
            int64_t prod = 1;
            for (int d = 0; d < t->ndim; d++)
                prod *= t->shape[d];
            if ((size_t)prod != n) {
                snprintf(err, errlen, "parameter %s: its PyTorch shape does not hold its %zu values",
                         t->name, n);
                return -1;
            }
        }
        const sf_layer_kind_info *k = sf_layer_info(L->kind);
        if (k && k->buffers) {
            snprintf(ck->bn_name[ck->n_bn++], sizeof ck->bn_name[0], "%s", L->name);
            size_t c = (size_t)L->out_ch;
            for (int part = 0; part < 2 && k->buffers[part]; part++) {
                sf_ckpt_tensor *t = &ck->bt[ck->n_bt++];
                snprintf(t->name, sizeof t->name, "%s.%s", L->name, k->buffers[part]);
                t->off = part ? L->rv_off : L->rm_off;
                t->n = c;
                t->ndim = 1;
                t->shape[0] = (int64_t)c;
            }
        }
    }
    /* The flat buffer holds each layer's weight then bias, layer by layer:
     * the file's parameter block is that buffer only if the order agrees.
     * The same holds for the buffers area (running_mean then running_var). */
    for (int i = 0; i < ck->n_pt; i++)
        if (ck->pt[i].off != (i ? ck->pt[i - 1].off + ck->pt[i - 1].n : 0)) {
            snprintf(err, errlen, "parameter %s is not contiguous with the one before it",
                     ck->pt[i].name);
            return -1;
        }
    for (int i = 0; i < ck->n_bt; i++)
        if (ck->bt[i].off != (i ? ck->bt[i - 1].off + ck->bt[i - 1].n : 0)) {
            snprintf(err, errlen, "buffer %s is not contiguous with the one before it", ck->bt[i].name);
            return -1;
        }
    if ((ck->n_pt ? ck->pt[ck->n_pt - 1].off + ck->pt[ck->n_pt - 1].n : 0) != m->n_params ||
        (ck->n_bt ? ck->bt[ck->n_bt - 1].off + ck->bt[ck->n_bt - 1].n : 0) != m->n_buffers) {
        snprintf(err, errlen, "the model's tensors do not cover its parameter and buffer areas");
        return -1;
    }
    ck->bt0 = ck->n_pt;
    ck->nb0 = ck->bt0 + ck->n_bt;
    ck->o10 = ck->nb0 + ck->n_bn;
    ck->o20 = ck->o10 + ck->n_pt;
    ck->n_desc = ck->o10 + (ck->adamw ? 2 : 1) * ck->n_pt + 1;
    ck->desc = calloc((size_t)ck->n_desc, sizeof *ck->desc);
    ck->desc_names = calloc((size_t)ck->n_desc, sizeof *ck->desc_names);
    ck->model_json = model_to_json(m);
    if (!ck->desc || !ck->desc_names || !ck->model_json) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    char name[sizeof ck->desc_names[0]];
    for (int i = 0; i < ck->n_pt; i++) {
        const sf_ckpt_tensor *p = &ck->pt[i];
        set_desc(ck, i, p->name, SF_ST_F32, p->ndim, p->shape);
        snprintf(name, sizeof name, OPT_PREFIX "%s%s", p->name, ck->adamw ? AVG_SUFFIX : MOM_SUFFIX);
        set_desc(ck, ck->o10 + i, name, SF_ST_F32, p->ndim, p->shape);
        if (ck->adamw) {
            snprintf(name, sizeof name, OPT_PREFIX "%s" SQ_SUFFIX, p->name);
            set_desc(ck, ck->o20 + i, name, SF_ST_F32, p->ndim, p->shape);
        }
    }
    for (int i = 0; i < ck->n_bt; i++)
        set_desc(ck, ck->bt0 + i, ck->bt[i].name, SF_ST_F32, 1, ck->bt[i].shape);
    for (int i = 0; i < ck->n_bn; i++) {
        snprintf(name, sizeof name, "%s" NBT_SUFFIX, ck->bn_name[i]);
        set_desc(ck, ck->nb0 + i, name, SF_ST_I64, 0, NULL);
    }
    set_desc(ck, ck->n_desc - 1, OPT_PREFIX "step", SF_ST_I64, 0, NULL);
    /* Reserve the header for the longest step count; shorter ones are padded
     * with spaces (the format allows it), so the data never moves. */
    char *meta = metadata_json(ck, UINT64_MAX, UINT64_MAX, "none");
    for (int opt = 0; opt < 2; opt++) {
        ck->hdr_bytes[opt] = meta ? sf_st_header_build(NULL, 0, ck->desc, sf_ckpt_n_tensors(ck, opt), meta) : 0;
        if (ck->hdr_bytes[opt] == 0) {
            cJSON_free(meta);
            snprintf(err, errlen, "cannot build a safetensors header for this model");
            return -1;
        }
    }
    cJSON_free(meta);
    return 0;
}


void sf_ckpt_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

uint64_t sf_ckpt_get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}


int sf_ckpt_header_write(const sf_ckpt_layout *ck, uint8_t *file, size_t hdr, int with_opt,
                         uint64_t step, uint64_t config_hash, const char *backend, char *err,
                         size_t errlen)
{
    char *meta = metadata_json(ck, step, config_hash, backend);
    size_t need = meta ? sf_st_header_build((char *)file, hdr, ck->desc, sf_ckpt_n_tensors(ck, with_opt), meta)
                       : 0;
    cJSON_free(meta);
    if (need == 0 || need > hdr) {
        snprintf(err, errlen, "cannot build the checkpoint header");
        return -1;
    }
    memset(file + need, ' ', hdr - need);
    sf_ckpt_put_le64(file, hdr - 8);
    return 0;
}

size_t sf_ckpt_data_bytes(const sf_ckpt_layout *L, int with_opt)
{
    const sf_model *m = L->model;
    size_t n = m->n_params * sizeof(float);
    size_t state = n + m->n_buffers * sizeof(float) + (size_t)L->n_bn * sizeof(int64_t);
    return with_opt ? state + (L->adamw ? 2 : 1) * n + sizeof(int64_t) : state;
}

uint64_t sf_ckpt_max_file_bytes(const sf_ckpt_layout *L)
{
    /* 256 bytes per tensor: a header entry with the longest name and offsets
     * is under 200; 1 MiB more for __metadata__. */
    return (uint64_t)sf_ckpt_file_bytes(L, 1) + (uint64_t)L->n_desc * 256 + ((uint64_t)1 << 20);
}

size_t sf_ckpt_file_bytes(const sf_ckpt_layout *L, int with_opt)
{
    return L->hdr_bytes[with_opt ? 1 : 0] + sf_ckpt_data_bytes(L, with_opt);
}

/* ---- reading ---------------------------------------------------------------------- */

void sf_ckpt_decoded_free(sf_ckpt_decoded *d)
{
    free(d->params);
    free(d->bufs);
    free(d->mom);
    free(d->sq);
    memset(d, 0, sizeof *d);
}


static const sf_ckpt_tensor *find_param(const sf_ckpt_layout *ck, const char *name)
{
    for (int i = 0; i < ck->n_pt; i++)
        if (strcmp(ck->pt[i].name, name) == 0)
            return &ck->pt[i];
    return NULL;
}

static void shape_text(char *out, size_t cap, int ndim, const int64_t *shape)
{
    size_t o = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < cap)
        snprintf(out + o, cap - o, "]");
}

static int check_tensor(const sf_st_entry *t, sf_st_dtype dtype, int ndim, const int64_t *shape,
                        sf_ckpt_error *e)
{
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (t->dtype == dtype && same)
        return 0;
    char want[96], got[96];
    shape_text(want, sizeof want, ndim, shape);
    shape_text(got, sizeof got, t->ndim, t->shape);
    fail(e, 400, "checkpoint_tensor_mismatch", t->name,
         "tensor %s is %s %s; the model needs %s %s", t->name, sf_st_dtype_name(t->dtype), got,
         sf_st_dtype_name(dtype), want);
    return -1;
}

/* A NaN or an infinity in a weight trains into NaN everywhere, silently
 * (the loss reads null, the service stays ready): every F32 value taken from
 * a file must be finite. The values are read through memcpy because the data
 * section need not be aligned. */
static int check_finite(const sf_st_entry *t, const uint8_t *data, sf_ckpt_error *e)
{
    const uint8_t *p = data + t->begin;
    size_t n = (size_t)(t->end - t->begin) / sizeof(float);
    for (size_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, p + i * sizeof v, sizeof v);
        if (!isfinite(v)) {
            fail(e, 400, "checkpoint_not_finite", t->name,
                 "tensor %s holds %s at element %zu: every value of a checkpoint must be finite",
                 t->name, isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf", i);
            return -1;
        }
    }
    return 0;
}

/* Our __metadata__: the format version, the model (strict reads), the step
 * count. 0, or -1 with e. */
static int read_metadata(const sf_ckpt_layout *ck, const sf_st_file *f, int mode, sf_ckpt_decoded *d,
                         sf_ckpt_error *e)
{
    /* The whole value is the version, in decimal digits: "1abc" or " 1" is
     * not version 1 (a reader that took its leading number would load a file
     * whose writer meant something else by it). */
    const char *ver = sf_st_file_meta(f, "format_version");
    if (ver) {
        const size_t len = strlen(ver);
        if (len == 0 || len > 9 || ver[strspn(ver, "0123456789")] != '\0') {
            fail(e, 400, "checkpoint_version_unsupported", "format_version",
                 "__metadata__.format_version \"%.16s%s\" is not a version number (a decimal integer); "
                 "this server reads %d",
                 ver, len > 16 ? "..." : "", SF_CKPT_FORMAT_VERSION);
            return -1;
        }
        if (strtol(ver, NULL, 10) != SF_CKPT_FORMAT_VERSION) {
            fail(e, 400, "checkpoint_version_unsupported", "format_version",
                 "the checkpoint is format_version %s; this server reads %d", ver, SF_CKPT_FORMAT_VERSION);
            return -1;
        }
    }
    const char *model = sf_st_file_meta(f, "model");
    if (mode == SF_CKPT_READ_STRICT && model && strcmp(model, ck->model_json)) {
        fail(e, 400, "checkpoint_model_mismatch", NULL,
             "the checkpoint was written for another model: %.200s", model);
        return -1;
    }
    /* Digits only: strtoull alone reads " -1" as 2^64 - 1. Anything else
     * is not a step count and is left unread. */
    const char *st = sf_st_file_meta(f, "step");
    if (st && st[0] && st[strspn(st, "0123456789")] == '\0') {
        errno = 0;
        unsigned long long v = strtoull(st, NULL, 10);
        if (errno == ERANGE || v > SF_CKPT_MAX_COUNT) {
            fail(e, 400, "checkpoint_tensor_mismatch", "step",
                 "__metadata__.step %.24s%s is " SF_CKPT_MAX_COUNT_WHY, st, strlen(st) > 24 ? "..." : "");
            return -1;
        }
        d->step = v;
        d->has_step = 1;
    }
    return 0;
}

/* Whether name is another optimizer's state for one of the model's
 * parameters (e filled: checkpoint_optimizer_mismatch). */
static int other_optimizer_state(const sf_ckpt_layout *ck, const char *name, const char *my_opt,
                                 sf_ckpt_error *e)
{
    if (strncmp(name, OPT_PREFIX, strlen(OPT_PREFIX)) == 0) {
        static const char *const sfx[] = {MOM_SUFFIX, AVG_SUFFIX, SQ_SUFFIX};
        const char *rest = name + strlen(OPT_PREFIX);
        size_t rl = strlen(rest);
        for (int j = 0; j < 3; j++) {
            size_t sl = strlen(sfx[j]);
            char pname[sizeof ck->pt[0].name];
            if (rl <= sl || rl - sl >= sizeof pname || strcmp(rest + rl - sl, sfx[j]) != 0)
                continue;
            memcpy(pname, rest, rl - sl);
            pname[rl - sl] = '\0';
            if (!find_param(ck, pname))
                continue;
            fail(e, 400, "checkpoint_optimizer_mismatch", name,
                 "tensor %s is %s state; this service trains with optim.name=%s (its state "
                 "is %s); load the parameters alone (GET ?optimizer=false, or a file "
                 "without \"" OPT_PREFIX "\" tensors) to start a new optimizer",
                 name, j == 0 ? "SGD" : "AdamW", my_opt,
                 ck->adamw ? OPT_PREFIX "<p>" AVG_SUFFIX ", " OPT_PREFIX "<p>" SQ_SUFFIX
                           : OPT_PREFIX "<p>" MOM_SUFFIX);
            return 1;
        }
    }
    return 0;
}

/* A strict read's completeness: every state_dict tensor seen, optimizer
 * state for every parameter or none and of this service's optimizer, and
 * what the backend can restore. 0, or -1 with e. */
static int check_complete(const sf_ckpt_layout *ck, const sf_ckpt_caps *caps, const unsigned char *seen,
                          int has_opt_tensors, const char *file_opt, sf_ckpt_decoded *d, sf_ckpt_error *e)
{
    const char *my_opt = ck->adamw ? "adamw" : "sgd";
    /* The state_dict part: every parameter and buffer, as torch's strict load wants. */
    for (int k = 0; k < ck->o10; k++)
        if (!seen[k]) {
            fail(e, 400, "checkpoint_tensor_missing", ck->desc_names[k],
                 "tensor %s is missing: every tensor of the model's state_dict must be in the "
                 "checkpoint", ck->desc_names[k]);
            return -1;
        }
    if (has_opt_tensors) {
        if (file_opt && strcmp(file_opt, my_opt) != 0) {
            fail(e, 400, "checkpoint_optimizer_mismatch", "optimizer",
                 "the checkpoint holds %.16s optimizer state; this service trains with "
                 "optim.name=%s; load the parameters alone to start a new optimizer",
                 file_opt, my_opt);
            return -1;
        }
        for (int k = ck->o10; k < ck->n_desc; k++)
            if (!seen[k]) {
                fail(e, 400, "checkpoint_tensor_missing", ck->desc_names[k],
                     "tensor %s is missing: optimizer state comes for every parameter or none",
                     ck->desc_names[k]);
                return -1;
            }
        d->has_opt = 1;
        if (!caps->opt) {
            fail(e, 501, "optimizer_state_unsupported", NULL,
                 "the %s backend cannot restore optimizer state yet; send the parameters alone",
                 caps->backend);
            return -1;
        }
    }
    if (ck->n_bn > 0 && !caps->buffers) {
        fail(e, 501, "buffers_unsupported", NULL,
             "the %s backend cannot restore batchnorm running statistics yet", caps->backend);
        return -1;
    }
    return 0;
}

int sf_ckpt_decode(const sf_ckpt_layout *ck, const sf_ckpt_caps *caps, const uint8_t *buf, size_t len,
                   int mode, sf_ckpt_decoded *d, sf_ckpt_error *e)
{
    const sf_model *m = ck->model;
    sf_st_file f;
    if (sf_st_file_read(&f, buf, len, SF_CKPT_MAX_HEADER, MAX_TENSORS) != 0) {
        if (f.err == SF_ST_E_OUT_OF_MEMORY)
            fail(e, 503, "out_of_memory", NULL, "cannot index the checkpoint header: %s", f.msg);
        else
            fail(e, 400, "checkpoint_invalid", NULL, "not a safetensors file (%s): %s",
                 sf_st_error_name(f.err), f.msg);
        return -1;
    }
    int rc = -1;
    unsigned char *seen = NULL;
    d->tensors = f.n;
    d->bytes = len;
    /* Metadata is ours only when it says so (PyTorch writes {"format":"pt"}). */
    const char *fmt = sf_st_file_meta(&f, "format");
    const int ours = fmt && strcmp(fmt, FORMAT_NAME) == 0;
    if (ours && read_metadata(ck, &f, mode, d, e) != 0)
        goto out;
    /* The optimizer the file's state belongs to (our metadata says it). */
    const char *file_opt = ours ? sf_st_file_meta(&f, "optimizer") : NULL;
    const char *my_opt = ck->adamw ? "adamw" : "sgd";
    const int can_opt = caps->opt;
    if (mode == SF_CKPT_READ_STRICT) {
        d->params = malloc(m->n_params * sizeof(float));
        d->bufs = m->n_buffers ? malloc(m->n_buffers * sizeof(float)) : NULL;
        d->mom = can_opt ? calloc(m->n_params, sizeof(float)) : NULL;
        d->sq = can_opt && ck->adamw ? calloc(m->n_params, sizeof(float)) : NULL;
        if (!d->params || (m->n_buffers && !d->bufs) || (can_opt && !d->mom) ||
            (can_opt && ck->adamw && !d->sq)) {
            fail(e, 503, "out_of_memory", NULL, "cannot hold the checkpoint's %zu parameters",
                 m->n_params);
            goto out;
        }
    }
    seen = calloc((size_t)ck->n_desc, 1);
    if (!seen) {
        fail(e, 503, "out_of_memory", NULL, "cannot index the checkpoint");
        goto out;
    }
    int n_opt = 0, have_step_tensor = 0;
    for (int i = 0; i < f.n; i++) {
        const sf_st_entry *t = &f.tensors[i];
        int k = -1;
        for (int j = 0; j < ck->n_desc; j++)
            if (strcmp(ck->desc_names[j], t->name) == 0) {
                k = j;
                break;
            }
        if (k < 0) {
            if (mode == SF_CKPT_READ_PARTIAL)
                continue;
            /* The other optimizer's state for one of our parameters: say so. */
            if (other_optimizer_state(ck, t->name, my_opt, e))
                goto out;
            fail(e, 400, "checkpoint_tensor_unknown", t->name,
                 "tensor %s is not in the model's state_dict (names are the PyTorch state_dict "
                 "names: \"%s\", ...; optimizer state under \"" OPT_PREFIX "\")",
                 t->name, ck->n_pt ? ck->pt[0].name : "");
            goto out;
        }
        int idx, kind = desc_kind(ck, k, &idx);
        if (mode == SF_CKPT_READ_PARTIAL && kind != K_PARAM && kind != K_BUF && kind != K_NBT)
            continue;
        const sf_st_tensor_desc *want = &ck->desc[k];
        if (kind == K_STEP || kind == K_NBT) {
            /* I64 []; [1] is taken too (a scalar saved as a one-element tensor). */
            int64_t none[1] = {0};
            if (!(t->dtype == SF_ST_I64 && (t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1)))) {
                check_tensor(t, SF_ST_I64, 0, none, e);
                goto out;
            }
            int64_t v = (int64_t)sf_ckpt_get_le64(f.data + t->begin);
            if (v < 0) {
                fail(e, 400, "checkpoint_tensor_mismatch", t->name, "%s is negative (%lld)", t->name,
                     (long long)v);
                goto out;
            }
            if ((uint64_t)v > SF_CKPT_MAX_COUNT) {
                fail(e, 400, "checkpoint_tensor_mismatch", t->name, "%s is %lld, " SF_CKPT_MAX_COUNT_WHY,
                     t->name, (long long)v);
                goto out;
            }
            seen[k] = 1;
            if (kind == K_STEP) {
                d->step = (uint64_t)v;
                d->has_step = 1;
                have_step_tensor = 1;
            } else if (!d->has_nbt || (uint64_t)v > d->nbt) {
                d->nbt = (uint64_t)v;
                d->has_nbt = 1;
            }
            continue;
        }
        if (check_tensor(t, SF_ST_F32, want->ndim, want->shape, e) != 0 || check_finite(t, f.data, e) != 0)
            goto out;
        seen[k] = 1;
        const sf_ckpt_tensor *p = kind == K_BUF ? &ck->bt[idx] : &ck->pt[idx];
        float *dst = kind == K_PARAM ? d->params : kind == K_BUF ? d->bufs
                   : kind == K_OPT1 ? d->mom : d->sq;
        if (dst)
            memcpy(dst + p->off, f.data + t->begin, p->n * sizeof(float));
        if (kind == K_OPT1 || kind == K_OPT2)
            n_opt++;
        else if (kind == K_PARAM)
            d->matched++;
    }
    if (mode == SF_CKPT_READ_PARTIAL) {
        if (d->matched == 0) {
            fail(e, 400, "checkpoint_tensor_missing", NULL,
                 "no tensor of the file is named like a parameter of the model (\"%s\", ...)",
                 ck->n_pt ? ck->pt[0].name : "");
            goto out;
        }
        rc = 0;
        goto out;
    }
    if (check_complete(ck, caps, seen, n_opt > 0 || have_step_tensor, file_opt, d, e) != 0)
        goto out;
    rc = 0;
out:
    free(seen);
    sf_st_file_free(&f);
    if (rc && mode == SF_CKPT_READ_STRICT)
        sf_ckpt_decoded_free(d);
    return rc;
}
