/* server/checkpoint.c — see checkpoint.h. */
#include "server/checkpoint.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "server/app.h"
#include "server/config.h"
#include "server/engine.h"
#include "server/http.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/safetensors.h"

#define KEY_BIT (1ull << 63)      /* operation wait keys: never an engine command id */
#define MAX_TENSORS 65536         /* tensors of one file we agree to look at */
#define MAX_HEADER (100u << 20)   /* safetensors' own bound on the JSON header */
#define IO_QUEUE_MAX 8            /* transfers waiting for the I/O thread */
#define FILE_PREFIX "ckpt-"
#define FILE_SUFFIX ".safetensors"
#define OPT_PREFIX "optim."
#define MOM_SUFFIX ".momentum_buffer"  /* SGD */
#define AVG_SUFFIX ".exp_avg"          /* AdamW: first moment */
#define SQ_SUFFIX ".exp_avg_sq"        /* AdamW: second moment */
#define RM_SUFFIX ".running_mean"
#define RV_SUFFIX ".running_var"
#define NBT_SUFFIX ".num_batches_tracked"
#define FORMAT_NAME "streamfeed.checkpoint"
#define PATH_MAX_IN 1024          /* longest path a request may give */
#define URL_MAX 2048

/* ---- errors ------------------------------------------------------------------ */

static void fail(sf_ckpt_error *e, int status, const char *code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void fail(sf_ckpt_error *e, int status, const char *code, const char *field, const char *fmt, ...)
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

/* ---- the module's state ----------------------------------------------------------- */

/* One parameter tensor of the model: a slice of the flat buffer. */
typedef struct ptensor {
    char name[SF_LAYER_NAME_MAX + 24]; /* "<layer>.weight", "<layer>.running_mean" */
    int ndim;
    int64_t shape[4];
    size_t off, n;                    /* floats */
} ptensor;

/* The file's tensors, in file order (checkpoint.h):
 *   [0, n_pt)                 parameters          (flat parameter buffer)
 *   [bt0, bt0 + n_bt)         running_mean/var    (flat buffers area)
 *   [nb0, nb0 + n_bn)         num_batches_tracked (I64 [], one per batchnorm layer)
 *   [o10, o10 + n_pt)         optim.<p>.momentum_buffer | .exp_avg
 *   [o20, o20 + n_pt)         optim.<p>.exp_avg_sq (AdamW only)
 *   n_desc - 1                optim.step
 * The state_dict part ends at bt0 + n_bt + n_bn = o10. */
enum { K_PARAM = 0, K_BUF, K_NBT, K_OPT1, K_OPT2, K_STEP };

typedef struct blob blob;

struct sf_ckpt {
    sf_app *app;
    char dir[PATH_MAX];          /* realpath of checkpoint.dir; "" when unset */
    /* The model's tensors and the file layout, fixed at start. */
    ptensor pt[2 * SF_MAX_LAYERS];
    int n_pt;
    ptensor bt[2 * SF_MAX_LAYERS];   /* running_mean, running_var of each batchnorm layer */
    int n_bt;
    char bn_name[SF_MAX_LAYERS][SF_LAYER_NAME_MAX]; /* the batchnorm layers */
    int n_bn;
    int adamw;                   /* optim.name=adamw: exp_avg and exp_avg_sq */
    int bt0, nb0, o10, o20;      /* first index of each block of desc */
    sf_st_tensor_desc *desc;     /* the file's tensors, in order (see above) */
    char (*desc_names)[SF_LAYER_NAME_MAX + 40];
    int n_desc;
    size_t hdr_bytes[2];         /* reserved header (8 + JSON) without / with optimizer */
    char *model_json;            /* the model in model.spec syntax */
    /* Metrics. */
    sf_metric *m_ok, *m_failed, *m_skipped, *m_seconds, *m_last_step, *m_load_ok, *m_load_failed;
    /* The I/O thread and its queue. */
    pthread_t io;
    int io_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sf_ckpt_op *head, *tail;
    int queued, stop;
    atomic_int abort_xfer;       /* cuts URL transfers short at shutdown */
    /* Periodic saves. */
    atomic_int periodic_busy;    /* a periodic snapshot or write is under way */
    blob *periodic;              /* its buffer, reused (engine thread, I/O thread in turn) */
    atomic_int warned_no_opt;
    /* What the newest ckpt-<step> file holds, for the final save. */
    atomic_uint_least64_t state_gen; /* bumped by every restore */
    atomic_uint_least64_t saved_gen, saved_step;
    atomic_int buffers;          /* large request buffers alive */
    atomic_uint_least64_t next_key;
    int curl_ready;
};

/* ---- file buffers ---------------------------------------------------------------- */

/* A checkpoint file in memory: this struct, padding to BLOB_PREFIX, then the
 * file bytes, in one allocation, so the file pointer alone (what an HTTP reply
 * hands back to its free function) finds its owner. */
#define BLOB_PREFIX 128
struct blob {
    sf_ckpt *ck;
    uint8_t *file;               /* 8-byte length, header padded to hdr, data */
    size_t len, hdr;
    float *params, *bufs, *mom, *sq; /* into file (sq: AdamW only) */
    uint8_t *nbt_at;             /* the n_bn I64 num_batches_tracked, into file */
    uint8_t *step_at;            /* the I64 of optim.step, into file */
    uint64_t step, gen;
    int with_opt;
    int pinned;                  /* allocated by backend->host_alloc */
    int reserved;                /* holds one of SF_CKPT_MAX_BUFFERS */
};
_Static_assert(sizeof(blob) <= BLOB_PREFIX, "blob header outgrew its prefix");

static size_t data_bytes(const sf_ckpt *ck, int with_opt)
{
    const sf_model *m = &ck->app->model;
    size_t n = m->n_params * sizeof(float);
    size_t state = n + m->n_buffers * sizeof(float) + (size_t)ck->n_bn * sizeof(int64_t);
    return with_opt ? state + (ck->adamw ? 2 : 1) * n + sizeof(int64_t) : state;
}

static blob *blob_new(sf_ckpt *ck, int with_opt, int pinned, int reserved)
{
    size_t hdr = ck->hdr_bytes[with_opt ? 1 : 0];
    size_t len = hdr + data_bytes(ck, with_opt);
    size_t total = (BLOB_PREFIX + len + 63) & ~(size_t)63;
    sf_backend *be = ck->app->backend;
    uint8_t *base = pinned ? be->i->host_alloc(be, total) : aligned_alloc(64, total);
    if (!base)
        return NULL;
    blob *b = (blob *)base;
    memset(b, 0, sizeof *b);
    b->ck = ck;
    b->file = base + BLOB_PREFIX;
    b->len = len;
    b->hdr = hdr;
    const sf_model *m = &ck->app->model;
    b->params = (float *)(b->file + hdr);
    b->bufs = b->params + m->n_params;
    b->nbt_at = (uint8_t *)(b->bufs + m->n_buffers);
    b->with_opt = with_opt;
    if (with_opt) {
        b->mom = (float *)(b->nbt_at + (size_t)ck->n_bn * sizeof(int64_t));
        b->sq = ck->adamw ? b->mom + m->n_params : NULL;
        b->step_at = (uint8_t *)(b->mom + (ck->adamw ? 2 : 1) * m->n_params);
    }
    b->pinned = pinned;
    b->reserved = reserved;
    return b;
}

static void blob_free(blob *b)
{
    if (!b)
        return;
    sf_ckpt *ck = b->ck;
    if (b->reserved)
        atomic_fetch_sub(&ck->buffers, 1);
    if (b->pinned)
        ck->app->backend->i->host_free(ck->app->backend, b);
    else
        free(b);
}

/* The free function of a file handed to an HTTP reply. */
static void blob_free_file(void *file) { blob_free((blob *)((uint8_t *)file - BLOB_PREFIX)); }

int sf_ckpt_buffer_reserve(sf_app *app)
{
    sf_ckpt *ck = app->ckpt;
    if (!ck)
        return -1;
    if (atomic_fetch_add(&ck->buffers, 1) >= SF_CKPT_MAX_BUFFERS) {
        atomic_fetch_sub(&ck->buffers, 1);
        return -1;
    }
    return 0;
}

void sf_ckpt_buffer_return(sf_app *app)
{
    if (app->ckpt)
        atomic_fetch_sub(&app->ckpt->buffers, 1);
}

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
        const int convlike = L->kind == SF_L_CONV2D || L->kind == SF_L_CONV_TRANSPOSE2D;
        if (convlike || L->kind == SF_L_LINEAR) {
            cJSON_AddNumberToObject(l, "out", L->out_c);
            if (convlike) {
                cJSON_AddNumberToObject(l, "k", L->k);
                cJSON_AddNumberToObject(l, "stride", L->stride);
                cJSON_AddNumberToObject(l, "pad", L->pad);
            }
            cJSON_AddBoolToObject(l, "bias", L->bias);
        } else if (L->kind == SF_L_MAXPOOL2D) {
            cJSON_AddNumberToObject(l, "k", L->k);
            cJSON_AddNumberToObject(l, "stride", L->stride);
            cJSON_AddNumberToObject(l, "pad", L->pad);
        }
        cJSON_AddItemToArray(layers, l);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* FNV-1a 64 of the effective configuration as GET /v1/config shows it. */
static uint64_t config_hash(void)
{
    sf_config *c = malloc(sizeof *c);
    if (!c)
        return 0;
    sf_config_get(c);
    cJSON *j = sf_config_to_json(c);
    free(c);
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    uint64_t h = 1469598103934665603ull;
    for (const char *p = txt; p && *p; p++) {
        h ^= (unsigned char)*p;
        h *= 1099511628211ull;
    }
    cJSON_free(txt);
    return h;
}

static char *metadata_json(sf_ckpt *ck, uint64_t step, uint64_t hash)
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
    cJSON_AddStringToObject(o, "backend", ck->app->backend_name ? ck->app->backend_name : "none");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static int n_desc_of(const sf_ckpt *ck, int with_opt) { return with_opt ? ck->n_desc : ck->o10; }

/* What block of the file layout desc[k] lies in (K_*) and its index there. */
static int desc_kind(const sf_ckpt *ck, int k, int *idx)
{
    int kind = k < ck->bt0 ? K_PARAM : k < ck->nb0 ? K_BUF : k < ck->o10 ? K_NBT
             : k == ck->n_desc - 1 ? K_STEP : k < ck->o20 ? K_OPT1 : K_OPT2;
    int base = kind == K_PARAM ? 0 : kind == K_BUF ? ck->bt0 : kind == K_NBT ? ck->nb0
             : kind == K_OPT1 ? ck->o10 : kind == K_OPT2 ? ck->o20 : k;
    if (idx)
        *idx = k - base;
    return kind;
}

static void set_desc(sf_ckpt *ck, int k, const char *name, sf_st_dtype dt, int ndim, const int64_t *shape)
{
    snprintf(ck->desc_names[k], sizeof ck->desc_names[k], "%s", name);
    ck->desc[k].name = ck->desc_names[k];
    ck->desc[k].dtype = dt;
    ck->desc[k].ndim = ndim;
    if (ndim)
        memcpy(ck->desc[k].shape, shape, (size_t)ndim * sizeof shape[0]);
}

static int layout_init(sf_ckpt *ck, char *err, size_t errlen)
{
    const sf_model *m = &ck->app->model;
    ck->adamw = strcmp(ck->app->cfg.optim.name, "adamw") == 0;
    ck->n_pt = ck->n_bt = ck->n_bn = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const sf_layer *L = &m->layers[i];
        for (int part = 0; part < 2; part++) {
            size_t n = part ? L->n_b : L->n_w;
            if (!n)
                continue;
            ptensor *t = &ck->pt[ck->n_pt++];
            snprintf(t->name, sizeof t->name, "%s.%s", L->name, part ? "bias" : "weight");
            t->off = part ? L->b_off : L->w_off;
            t->n = n;
            if (part || L->kind == SF_L_BATCHNORM2D) {
                t->ndim = 1;
                t->shape[0] = (int64_t)n;
            } else if (L->kind == SF_L_CONV2D || L->kind == SF_L_CONV_TRANSPOSE2D) {
                /* conv_transpose2d's weight is [in_c, out_c, k, k] in PyTorch */
                int tr = L->kind == SF_L_CONV_TRANSPOSE2D;
                t->ndim = 4;
                t->shape[0] = tr ? L->in_c : L->out_c;
                t->shape[1] = tr ? L->out_c : L->in_c;
                t->shape[2] = t->shape[3] = L->k;
            } else {
                t->ndim = 2;
                t->shape[0] = L->out_c;
                t->shape[1] = L->in_c;
            }
            int64_t prod = 1;
            for (int d = 0; d < t->ndim; d++)
                prod *= t->shape[d];
            if ((size_t)prod != n) {
                snprintf(err, errlen, "parameter %s: its PyTorch shape does not hold its %zu values",
                         t->name, n);
                return -1;
            }
        }
        if (L->kind == SF_L_BATCHNORM2D) {
            snprintf(ck->bn_name[ck->n_bn++], sizeof ck->bn_name[0], "%s", L->name);
            size_t c = L->n_w;
            for (int part = 0; part < 2; part++) {
                ptensor *t = &ck->bt[ck->n_bt++];
                snprintf(t->name, sizeof t->name, "%s%s", L->name, part ? RV_SUFFIX : RM_SUFFIX);
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
        const ptensor *p = &ck->pt[i];
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
    char *meta = metadata_json(ck, UINT64_MAX, UINT64_MAX);
    for (int opt = 0; opt < 2; opt++) {
        ck->hdr_bytes[opt] = meta ? sf_st_header_build(NULL, 0, ck->desc, n_desc_of(ck, opt), meta) : 0;
        if (ck->hdr_bytes[opt] == 0) {
            cJSON_free(meta);
            snprintf(err, errlen, "cannot build a safetensors header for this model");
            return -1;
        }
    }
    cJSON_free(meta);
    return 0;
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Writes the header for step into b's reserved header space. */
static int blob_header(sf_ckpt *ck, blob *b, uint64_t step, char *err, size_t errlen)
{
    char *meta = metadata_json(ck, step, config_hash());
    size_t need = meta ? sf_st_header_build((char *)b->file, b->hdr, ck->desc,
                                            n_desc_of(ck, b->with_opt), meta)
                       : 0;
    cJSON_free(meta);
    if (need == 0 || need > b->hdr) {
        snprintf(err, errlen, "cannot build the checkpoint header");
        return -1;
    }
    memset(b->file + need, ' ', b->hdr - need);
    put_le64(b->file, b->hdr - 8);
    return 0;
}

/* ---- snapshot and restore (the engine thread, or main's before/after it) ---------- */

/* The backend can hand over the whole optimizer state (AdamW: both moments). */
static int can_read_opt(const sf_ckpt *ck)
{
    const sf_backend *be = ck->app->backend;
    return be->i->get_opt_state && (!ck->adamw || be->i->get_opt_sq);
}

static int snapshot(sf_ckpt *ck, blob *b, char *err, size_t errlen)
{
    sf_app *app = ck->app;
    sf_backend *be = app->backend;
    if (be->i->get_params(be, b->params) != 0) {
        snprintf(err, errlen, "the %s backend could not read its parameters", app->backend_name);
        return -1;
    }
    uint64_t step = atomic_load(&app->step);
    if (ck->n_bn > 0) {
        uint64_t nbt = 0;
        if (!be->i->get_buffers) {
            snprintf(err, errlen, "the %s backend cannot read its batchnorm running statistics yet",
                     app->backend_name);
            return -1;
        }
        if (be->i->get_buffers(be, b->bufs, &nbt) != 0) {
            snprintf(err, errlen, "the %s backend could not read its buffers", app->backend_name);
            return -1;
        }
        /* One counter in the service; PyTorch has one per layer: the same value in each. */
        for (int i = 0; i < ck->n_bn; i++)
            put_le64(b->nbt_at + 8 * (size_t)i, nbt);
    }
    if (b->with_opt) {
        if (!be->i->get_opt_state || (ck->adamw && !be->i->get_opt_sq)) {
            snprintf(err, errlen, "the %s backend cannot read its optimizer state yet",
                     app->backend_name);
            return -1;
        }
        if (be->i->get_opt_state(be, b->mom, &step) != 0 ||
            (ck->adamw && be->i->get_opt_sq(be, b->sq) != 0)) {
            snprintf(err, errlen, "the %s backend could not read its optimizer state",
                     app->backend_name);
            return -1;
        }
        put_le64(b->step_at, step);
    }
    b->step = step;
    b->gen = atomic_load(&ck->state_gen);
    return blob_header(ck, b, step, err, errlen);
}

/* A checkpoint read and checked against the model. */
typedef struct decoded {
    float *params;      /* n_params floats (strict reads) */
    float *bufs;        /* n_buffers floats (strict reads; partial reads when the caller fills it) */
    uint64_t nbt;       /* num_batches_tracked: the largest of the file's (PyTorch keeps one per layer) */
    int has_nbt;
    float *mom;         /* n_params floats: the file's momentum / exp_avg or zeros; NULL if not needed */
    float *sq;          /* AdamW: n_params floats, exp_avg_sq or zeros; NULL if not needed */
    int has_opt;        /* the file has optimizer tensors */
    int has_step;
    uint64_t step;
    int tensors, matched;
    uint64_t bytes;
} decoded;

static void decoded_free(decoded *d)
{
    free(d->params);
    free(d->bufs);
    free(d->mom);
    free(d->sq);
    memset(d, 0, sizeof *d);
}

static int apply(sf_ckpt *ck, const decoded *d, char *err, size_t errlen)
{
    sf_app *app = ck->app;
    sf_backend *be = app->backend;
    if (d->has_opt && (!be->i->set_opt_state || (ck->adamw && !be->i->set_opt_sq))) {
        /* Checked when the file was read; kept here so nothing half-applies. */
        snprintf(err, errlen, "the %s backend cannot restore optimizer state yet", app->backend_name);
        return -1;
    }
    if (ck->n_bn > 0 && !be->i->set_buffers) {
        snprintf(err, errlen, "the %s backend cannot restore batchnorm running statistics yet",
                 app->backend_name);
        return -1;
    }
    if (be->i->set_params(be, d->params) != 0) {
        snprintf(err, errlen, "the %s backend could not set its parameters", app->backend_name);
        return -1;
    }
    if (ck->n_bn > 0 && be->i->set_buffers(be, d->bufs, d->nbt) != 0) {
        snprintf(err, errlen, "the %s backend could not set its buffers", app->backend_name);
        return -1;
    }
    uint64_t step = d->has_step ? d->step : atomic_load(&app->step);
    if (ck->adamw && be->i->set_opt_sq && be->i->set_opt_sq(be, d->sq) != 0) {
        snprintf(err, errlen, "the %s backend could not set its optimizer state", app->backend_name);
        return -1;
    }
    if (be->i->set_opt_state) {
        if (be->i->set_opt_state(be, d->mom, step) != 0) {
            snprintf(err, errlen, "the %s backend could not set its optimizer state",
                     app->backend_name);
            return -1;
        }
        atomic_store(&app->step, step);
    } else if (!atomic_load(&ck->warned_no_opt)) {
        atomic_store(&ck->warned_no_opt, 1);
        SF_WARN("checkpoint: the %s backend has no optimizer-state interface yet: parameters "
                "restored, momentum and step count left as they were", app->backend_name);
    }
    atomic_fetch_add(&ck->state_gen, 1);
    return 0;
}

/* ---- reading safetensors -------------------------------------------------------- */

typedef struct st_entry {
    const char *name;
    sf_st_dtype dtype;
    int ndim;
    int64_t shape[8];
    uint64_t begin, end;
} st_entry;

typedef struct st_file {
    cJSON *root;
    const cJSON *meta;  /* __metadata__, or NULL */
    st_entry *ent;
    int n;
    const uint8_t *data;
    uint64_t data_len;
} st_file;

static void st_file_free(st_file *f)
{
    cJSON_Delete(f->root);
    free(f->ent);
    memset(f, 0, sizeof *f);
}

static int json_u53(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return -1;
    *out = (uint64_t)v->valuedouble;
    return 0;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const st_entry *const *)a)->name, (*(const st_entry *const *)b)->name);
}

static int cmp_begin(const void *a, const void *b)
{
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

#define INVALID(...) fail(e, 400, "checkpoint_invalid", NULL, __VA_ARGS__)

/* Parses and checks the container: the header, every entry's dtype, shape
 * and offsets, and that the entries tile the data section exactly (the
 * format's own rules), before any tensor is looked at. */
static int st_read(const uint8_t *buf, size_t len, st_file *f, sf_ckpt_error *e)
{
    memset(f, 0, sizeof *f);
    if (len < 8)
        {
        INVALID("the file is %zu bytes: shorter than the 8-byte header length", len);
        return -1;
    }
    uint64_t n = get_le64(buf);
    if (n < 2 || n > MAX_HEADER || n > len - 8)
        {
        INVALID("the header length %llu does not fit the %zu-byte file",
                       (unsigned long long)n, len);
        return -1;
    }
    f->root = cJSON_ParseWithLength((const char *)buf + 8, (size_t)n);
    if (!f->root || !cJSON_IsObject(f->root))
        {
        INVALID("the header is not a JSON object");
        return -1;
    }
    f->data = buf + 8 + n;
    f->data_len = len - 8 - n;
    int count = 0;
    for (const cJSON *it = f->root->child; it; it = it->next)
        count++;
    if (count > MAX_TENSORS + 1)
        {
        INVALID("the header lists %d entries; at most %d are read", count, MAX_TENSORS);
        return -1;
    }
    f->ent = calloc((size_t)count + 1, sizeof *f->ent);
    st_entry **byname = calloc((size_t)count + 1, sizeof *byname);
    if (!f->ent || !byname) {
        free(byname);
        fail(e, 503, "out_of_memory", NULL, "cannot index the checkpoint header");
        return -1;
    }
    int rc = -1;
    for (const cJSON *it = f->root->child; it; it = it->next) {
        const char *name = it->string;
        if (!name || !name[0]) {
            INVALID("a tensor has an empty name");
            goto out;
        }
        if (strcmp(name, "__metadata__") == 0) {
            if (f->meta || !cJSON_IsObject(it)) {
                INVALID("__metadata__ must appear once, as an object");
                goto out;
            }
            for (const cJSON *m = it->child; m; m = m->next)
                if (!cJSON_IsString(m)) {
                    INVALID("__metadata__.%.64s is not a string", m->string ? m->string : "");
                    goto out;
                }
            f->meta = it;
            continue;
        }
        st_entry *t = &f->ent[f->n];
        t->name = name;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsObject(it) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
            cJSON_GetArraySize(off) != 2) {
            INVALID("tensor %.100s: needs dtype, shape and data_offsets [begin, end]", name);
            goto out;
        }
        if (sf_st_dtype_parse(dt->valuestring, &t->dtype) != 0) {
            INVALID("tensor %.100s: unknown dtype \"%.16s\"", name, dt->valuestring);
            goto out;
        }
        t->ndim = cJSON_GetArraySize(sh);
        if (t->ndim > 8) {
            INVALID("tensor %.100s: %d dimensions (at most 8 are read)", name, t->ndim);
            goto out;
        }
        uint64_t elems = 1;
        int d = 0;
        for (const cJSON *v = sh->child; v; v = v->next, d++) {
            uint64_t dim;
            if (json_u53(v, &dim) != 0 || __builtin_mul_overflow(elems, dim, &elems)) {
                INVALID("tensor %.100s: shape[%d] is not a size", name, d);
                goto out;
            }
            t->shape[d] = (int64_t)dim;
        }
        uint64_t bytes;
        if (json_u53(off->child, &t->begin) != 0 || json_u53(off->child->next, &t->end) != 0 ||
            t->begin > t->end || t->end > f->data_len) {
            INVALID("tensor %.100s: data_offsets do not lie within the %llu-byte data section", name,
                    (unsigned long long)f->data_len);
            goto out;
        }
        int es = sf_st_dtype_size(t->dtype);
        if (es <= 0 || __builtin_mul_overflow(elems, (uint64_t)es, &bytes) ||
            bytes != t->end - t->begin) {
            INVALID("tensor %.100s: its shape and dtype make %llu bytes but data_offsets span %llu",
                    name, (unsigned long long)(es > 0 ? elems * (uint64_t)es : 0),
                    (unsigned long long)(t->end - t->begin));
            goto out;
        }
        byname[f->n] = t;
        f->n++;
    }
    qsort(byname, (size_t)f->n, sizeof *byname, cmp_name);
    for (int i = 1; i < f->n; i++)
        if (strcmp(byname[i]->name, byname[i - 1]->name) == 0) {
            INVALID("tensor %.100s appears twice", byname[i]->name);
            goto out;
        }
    /* The entries must cover the data section without a hole or an overlap. */
    qsort(byname, (size_t)f->n, sizeof *byname, cmp_begin);
    uint64_t at = 0;
    for (int i = 0; i < f->n; i++) {
        if (byname[i]->begin != at) {
            INVALID("tensor %.100s: data_offsets leave a hole or overlap at byte %llu",
                    byname[i]->name, (unsigned long long)at);
            goto out;
        }
        at = byname[i]->end;
    }
    if (at != f->data_len) {
        INVALID("the data section is %llu bytes but the tensors cover %llu",
                (unsigned long long)f->data_len, (unsigned long long)at);
        goto out;
    }
    rc = 0;
out:
    free(byname);
    if (rc)
        st_file_free(f);
    return rc;
}

static const ptensor *find_param(const sf_ckpt *ck, const char *name)
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

static int check_tensor(const st_entry *t, sf_st_dtype dtype, int ndim, const int64_t *shape,
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

enum { READ_STRICT = 0, READ_PARTIAL = 1 };

/* Reads a checkpoint against the model (checkpoint.h says what strict and
 * partial mean). Partial reads overlay matching tensors onto d->params, which
 * the caller filled; strict reads allocate d->params and d->mom. */
static int decode(sf_ckpt *ck, const uint8_t *buf, size_t len, int mode, decoded *d, sf_ckpt_error *e)
{
    const sf_model *m = &ck->app->model;
    sf_backend *be = ck->app->backend;
    st_file f;
    if (st_read(buf, len, &f, e) != 0)
        return -1;
    int rc = -1;
    unsigned char *seen = NULL;
    d->tensors = f.n;
    d->bytes = len;
    /* Metadata is ours only when it says so (PyTorch writes {"format":"pt"}). */
    const cJSON *fmt = f.meta ? cJSON_GetObjectItemCaseSensitive(f.meta, "format") : NULL;
    if (cJSON_IsString(fmt) && strcmp(fmt->valuestring, FORMAT_NAME) == 0) {
        const cJSON *ver = cJSON_GetObjectItemCaseSensitive(f.meta, "format_version");
        if (cJSON_IsString(ver) && atoi(ver->valuestring) != SF_CKPT_FORMAT_VERSION) {
            fail(e, 400, "checkpoint_version_unsupported", NULL,
                 "the checkpoint is format_version %.16s; this server reads %d", ver->valuestring,
                 SF_CKPT_FORMAT_VERSION);
            goto out;
        }
        const cJSON *model = cJSON_GetObjectItemCaseSensitive(f.meta, "model");
        if (mode == READ_STRICT && cJSON_IsString(model) && strcmp(model->valuestring, ck->model_json)) {
            fail(e, 400, "checkpoint_model_mismatch", NULL,
                 "the checkpoint was written for another model: %.200s", model->valuestring);
            goto out;
        }
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(f.meta, "step");
        char *end;
        if (cJSON_IsString(st) && st->valuestring[0]) {
            errno = 0;
            unsigned long long v = strtoull(st->valuestring, &end, 10);
            if (!errno && !*end && st->valuestring[0] != '-') {
                d->step = v;
                d->has_step = 1;
            }
        }
    }
    /* The optimizer the file's state belongs to (our metadata says it). */
    const char *file_opt = NULL;
    if (cJSON_IsString(fmt) && strcmp(fmt->valuestring, FORMAT_NAME) == 0) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(f.meta, "optimizer");
        if (cJSON_IsString(o))
            file_opt = o->valuestring;
    }
    const char *my_opt = ck->adamw ? "adamw" : "sgd";
    const int can_opt = be->i->set_opt_state && (!ck->adamw || be->i->set_opt_sq);
    if (mode == READ_STRICT) {
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
        const st_entry *t = &f.ent[i];
        int k = -1;
        for (int j = 0; j < ck->n_desc; j++)
            if (strcmp(ck->desc_names[j], t->name) == 0) {
                k = j;
                break;
            }
        if (k < 0) {
            if (mode == READ_PARTIAL)
                continue;
            /* The other optimizer's state for one of our parameters: say so. */
            if (strncmp(t->name, OPT_PREFIX, strlen(OPT_PREFIX)) == 0) {
                static const char *const sfx[] = {MOM_SUFFIX, AVG_SUFFIX, SQ_SUFFIX};
                const char *rest = t->name + strlen(OPT_PREFIX);
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
                    fail(e, 400, "checkpoint_optimizer_mismatch", t->name,
                         "tensor %s is %s state; this service trains with optim.name=%s (its state "
                         "is %s); load the parameters alone (GET ?optimizer=false, or a file "
                         "without \"" OPT_PREFIX "\" tensors) to start a new optimizer",
                         t->name, j == 0 ? "SGD" : "AdamW", my_opt,
                         ck->adamw ? OPT_PREFIX "<p>" AVG_SUFFIX ", " OPT_PREFIX "<p>" SQ_SUFFIX
                                   : OPT_PREFIX "<p>" MOM_SUFFIX);
                    goto out;
                }
            }
            fail(e, 400, "checkpoint_tensor_unknown", t->name,
                 "tensor %s is not in the model's state_dict (names are the PyTorch state_dict "
                 "names: \"%s\", ...; optimizer state under \"" OPT_PREFIX "\")",
                 t->name, ck->n_pt ? ck->pt[0].name : "");
            goto out;
        }
        int idx, kind = desc_kind(ck, k, &idx);
        if (mode == READ_PARTIAL && kind != K_PARAM && kind != K_BUF && kind != K_NBT)
            continue;
        const sf_st_tensor_desc *want = &ck->desc[k];
        if (kind == K_STEP || kind == K_NBT) {
            /* I64 []; [1] is taken too (a scalar saved as a one-element tensor). */
            int64_t none[1] = {0};
            if (!(t->dtype == SF_ST_I64 && (t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1)))) {
                check_tensor(t, SF_ST_I64, 0, none, e);
                goto out;
            }
            int64_t v = (int64_t)get_le64(f.data + t->begin);
            if (v < 0) {
                fail(e, 400, "checkpoint_tensor_mismatch", t->name, "%s is negative (%lld)", t->name,
                     (long long)v);
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
        if (check_tensor(t, SF_ST_F32, want->ndim, want->shape, e) != 0)
            goto out;
        seen[k] = 1;
        const ptensor *p = kind == K_BUF ? &ck->bt[idx] : &ck->pt[idx];
        float *dst = kind == K_PARAM ? d->params : kind == K_BUF ? d->bufs
                   : kind == K_OPT1 ? d->mom : d->sq;
        if (dst)
            memcpy(dst + p->off, f.data + t->begin, p->n * sizeof(float));
        if (kind == K_OPT1 || kind == K_OPT2)
            n_opt++;
        else if (kind == K_PARAM)
            d->matched++;
    }
    if (mode == READ_PARTIAL) {
        if (d->matched == 0) {
            fail(e, 400, "checkpoint_tensor_missing", NULL,
                 "no tensor of the file is named like a parameter of the model (\"%s\", ...)",
                 ck->n_pt ? ck->pt[0].name : "");
            goto out;
        }
        rc = 0;
        goto out;
    }
    /* The state_dict part: every parameter and buffer, as torch's strict load wants. */
    for (int k = 0; k < ck->o10; k++)
        if (!seen[k]) {
            fail(e, 400, "checkpoint_tensor_missing", ck->desc_names[k],
                 "tensor %s is missing: every tensor of the model's state_dict must be in the "
                 "checkpoint", ck->desc_names[k]);
            goto out;
        }
    if (n_opt > 0 || have_step_tensor) {
        if (file_opt && strcmp(file_opt, my_opt) != 0) {
            fail(e, 400, "checkpoint_optimizer_mismatch", "optimizer",
                 "the checkpoint holds %.16s optimizer state; this service trains with "
                 "optim.name=%s; load the parameters alone to start a new optimizer",
                 file_opt, my_opt);
            goto out;
        }
        for (int k = ck->o10; k < ck->n_desc; k++)
            if (!seen[k]) {
                fail(e, 400, "checkpoint_tensor_missing", ck->desc_names[k],
                     "tensor %s is missing: optimizer state comes for every parameter or none",
                     ck->desc_names[k]);
                goto out;
            }
        d->has_opt = 1;
        if (!can_opt) {
            fail(e, 501, "optimizer_state_unsupported", NULL,
                 "the %s backend cannot restore optimizer state yet; send the parameters alone",
                 ck->app->backend_name);
            goto out;
        }
    }
    if (ck->n_bn > 0 && !be->i->set_buffers) {
        fail(e, 501, "buffers_unsupported", NULL,
             "the %s backend cannot restore batchnorm running statistics yet", ck->app->backend_name);
        goto out;
    }
    rc = 0;
out:
    free(seen);
    st_file_free(&f);
    if (rc && mode == READ_STRICT)
        decoded_free(d);
    return rc;
}

/* ---- files ------------------------------------------------------------------------ */

static int is_url(const char *s) { return strstr(s, "://") != NULL; }

static int url_scheme_ok(const char *s)
{
    return strncasecmp(s, "http://", 7) == 0 || strncasecmp(s, "https://", 8) == 0;
}

/* The URL without its query and fragment, for messages and logs (a signed
 * URL carries its credentials there). */
static void url_redact(const char *url, char *out, size_t cap)
{
    size_t n = strcspn(url, "?#");
    snprintf(out, cap, "%.*s%s", (int)(n < 400 ? n : 400), url, url[n] ? "?…" : "");
}

static int inside_dir(const char *p, const char *dir)
{
    size_t n = strlen(dir);
    if (n == 1 && dir[0] == '/')
        return p[0] == '/';
    return strncmp(p, dir, n) == 0 && (p[n] == '\0' || p[n] == '/');
}

/* A request's path, resolved inside checkpoint.dir. for_write: the file need
 * not exist, its directory must. */
static int resolve_path(sf_ckpt *ck, const char *in, int for_write, char *out, size_t cap,
                        sf_ckpt_error *e)
{
    if (!ck->dir[0]) {
        fail(e, 409, "checkpoint_dir_unset", "path",
             "paths are resolved in checkpoint.dir, which is not set (start with --checkpoint.dir DIR)");
        return -1;
    }
    size_t n = strlen(in);
    if (n == 0 || n >= PATH_MAX_IN) {
        fail(e, 400, "path_invalid", "path", "path must be 1 to %d bytes", PATH_MAX_IN - 1);
        return -1;
    }
    for (const char *c = in; *c;) {
        size_t l = strcspn(c, "/");
        if (l == 2 && c[0] == '.' && c[1] == '.') {
            fail(e, 400, "path_not_allowed", "path", "path must not contain a \"..\" component");
            return -1;
        }
        c += l;
        while (*c == '/')
            c++;
    }
    char joined[PATH_MAX + PATH_MAX_IN + 2];
    if (in[0] == '/')
        snprintf(joined, sizeof joined, "%s", in);
    else
        snprintf(joined, sizeof joined, "%s/%s", ck->dir, in);
    char *slash = strrchr(joined, '/');
    const char *base = slash + 1;
    if (!base[0] || base[0] == '.') {
        fail(e, 400, "path_invalid", "path", "the file name must be given and not start with \".\"");
        return -1;
    }
    *slash = '\0';
    char real[PATH_MAX];
    if (!realpath(joined[0] ? joined : "/", real)) {
        if (!inside_dir(joined[0] ? joined : "/", ck->dir) && in[0] == '/')
            fail(e, 400, "path_not_allowed", "path", "%s is outside checkpoint.dir (%s)", in, ck->dir);
        else
            fail(e, for_write ? 400 : 404, for_write ? "path_invalid" : "checkpoint_not_found", "path",
                 "directory %s does not exist", joined);
        return -1;
    }
    if (!inside_dir(real, ck->dir)) {
        fail(e, 400, "path_not_allowed", "path", "%s is outside checkpoint.dir (%s)", in, ck->dir);
        return -1;
    }
    if ((size_t)snprintf(out, cap, "%s/%s", real, base) >= cap) {
        fail(e, 400, "path_invalid", "path", "path is too long");
        return -1;
    }
    if (!for_write) {
        char fr[PATH_MAX];
        struct stat st;
        if (!realpath(out, fr) || stat(fr, &st) != 0) {
            fail(e, 404, "checkpoint_not_found", "path", "no checkpoint file %s", in);
            return -1;
        }
        if (!inside_dir(fr, ck->dir)) {
            fail(e, 400, "path_not_allowed", "path", "%s leads outside checkpoint.dir (%s)", in, ck->dir);
            return -1;
        }
        if (!S_ISREG(st.st_mode)) {
            fail(e, 400, "path_invalid", "path", "%s is not a regular file", in);
            return -1;
        }
    }
    return 0;
}

static int write_all(int fd, const uint8_t *p, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Temporary files are ".<name>.tmp-<pid>-<n>" beside the target: hidden, and
 * never named like a checkpoint, so nothing ever reads one. */
static int is_tmp_name(const char *name) { return name[0] == '.' && strstr(name, ".tmp-") != NULL; }

/* tmp file, fsync, rename, fsync of the directory: the target is the old file
 * or the complete new one, whenever the process or the machine stops. */
static int write_file_atomic(const char *path, const uint8_t *data, size_t len, char *err, size_t errlen)
{
    static atomic_uint_least64_t seq;
    char dir[PATH_MAX + 96], tmp[PATH_MAX + 400];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    const char *base = path + (slash - dir) + 1;
    if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    snprintf(tmp, sizeof tmp, "%s/.%.200s.tmp-%d-%llu", dir, base, (int)getpid(),
             (unsigned long long)atomic_fetch_add(&seq, 1));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "cannot create %.300s: %s", tmp, strerror(errno));
        return -1;
    }
    const char *what = "write";
    int rc = write_all(fd, data, len);
    if (!rc) {
        what = "fsync";
        rc = fsync(fd);
    }
    int saved = errno;
    if (close(fd) != 0 && !rc) {
        what = "close";
        rc = -1;
        saved = errno;
    }
    if (!rc) {
        what = "rename";
        rc = rename(tmp, path);
        saved = errno;
    }
    if (rc) {
        unlink(tmp);
        snprintf(err, errlen, "%s of %.300s failed: %s", what, path, strerror(saved));
        return -1;
    }
    if (fsync_dir(dir) != 0) {
        snprintf(err, errlen, "fsync of directory %.300s failed: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* Reads a whole regular file of at most max bytes. */
static int read_file(const char *path, uint64_t max, uint8_t **out, size_t *len, sf_ckpt_error *e)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fail(e, errno == ENOENT ? 404 : 400, errno == ENOENT ? "checkpoint_not_found" : "path_invalid",
             "path", "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        fail(e, 400, "path_invalid", "path", "%s is not a regular file", path);
        return -1;
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        fail(e, 413, "checkpoint_too_large", NULL,
             "%s is %lld bytes; checkpoint.max_bytes is %llu", path, (long long)st.st_size,
             (unsigned long long)max);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        fail(e, 503, "out_of_memory", NULL, "cannot hold %zu bytes of %s", n, path);
        return -1;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (got != n) {
        free(buf);
        fail(e, 500, "checkpoint_read_failed", NULL, "reading %s stopped after %zu of %zu bytes",
             path, got, n);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

typedef struct ckfile {
    uint64_t step;
    char name[64];
} ckfile;

static int parse_ckpt_name(const char *name, uint64_t *step)
{
    size_t pl = strlen(FILE_PREFIX), sl = strlen(FILE_SUFFIX), n = strlen(name);
    if (n <= pl + sl || n - pl - sl > 20 || strncmp(name, FILE_PREFIX, pl) != 0 ||
        strcmp(name + n - sl, FILE_SUFFIX) != 0)
        return -1;
    uint64_t v = 0;
    for (size_t i = pl; i < n - sl; i++) {
        if (name[i] < '0' || name[i] > '9' || __builtin_mul_overflow(v, 10, &v) ||
            __builtin_add_overflow(v, (uint64_t)(name[i] - '0'), &v))
            return -1;
    }
    *step = v;
    return 0;
}

static int cmp_newest(const void *a, const void *b)
{
    const ckfile *x = a, *y = b;
    if (x->step != y->step)
        return x->step > y->step ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The ckpt-<step> files of dir, newest first; returns the count (-1 on error). */
static int list_ckpts(const char *dir, ckfile **out)
{
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0, cap = 0;
    ckfile *v = NULL;
    struct dirent *de;
    while ((de = readdir(d))) {
        uint64_t step;
        if (parse_ckpt_name(de->d_name, &step) != 0 || strlen(de->d_name) >= sizeof v->name)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            ckfile *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv)
                break;
            v = nv;
        }
        v[n].step = step;
        snprintf(v[n].name, sizeof v[n].name, "%s", de->d_name);
        n++;
    }
    closedir(d);
    if (n)
        qsort(v, (size_t)n, sizeof *v, cmp_newest);
    *out = v;
    return n;
}

/* Keeps the newest checkpoint.keep ckpt-<step> files. */
static void rotate(sf_ckpt *ck)
{
    sf_config *c = malloc(sizeof *c);
    if (!c)
        return;
    sf_config_get(c);
    int keep = c->checkpoint.keep;
    free(c);
    ckfile *v;
    int n = list_ckpts(ck->dir, &v);
    int removed = 0;
    for (int i = keep; i < n; i++) {
        char p[PATH_MAX + 80];
        snprintf(p, sizeof p, "%s/%s", ck->dir, v[i].name);
        if (unlink(p) == 0)
            removed++;
        else
            SF_WARN("checkpoint: cannot remove %s: %s", p, strerror(errno));
    }
    free(v);
    if (removed)
        fsync_dir(ck->dir);
}

static void remove_stale_tmp(sf_ckpt *ck)
{
    DIR *d = opendir(ck->dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!is_tmp_name(de->d_name))
            continue;
        char p[PATH_MAX + 300];
        snprintf(p, sizeof p, "%s/%s", ck->dir, de->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISREG(st.st_mode) && unlink(p) == 0)
            SF_INFO("checkpoint: removed %s, left by an interrupted write", p);
    }
    closedir(d);
}

/* ---- URLs (libcurl) ----------------------------------------------------------------- */

typedef struct xfer {
    sf_ckpt *ck;
    uint8_t *buf;
    size_t len, cap, max;
    int too_large;
    const uint8_t *up;
    size_t up_len, up_off;
} xfer;

static size_t on_recv(char *p, size_t sz, size_t nm, void *ud)
{
    xfer *x = ud;
    size_t n = sz * nm;
    if (n > x->max - x->len) {
        x->too_large = 1;
        return 0; /* aborts the transfer */
    }
    if (x->len + n > x->cap) {
        size_t cap = x->cap ? x->cap : (1u << 20);
        while (cap < x->len + n)
            cap *= 2;
        if (cap > x->max)
            cap = x->max;
        uint8_t *nb = realloc(x->buf, cap);
        if (!nb)
            return 0;
        x->buf = nb;
        x->cap = cap;
    }
    memcpy(x->buf + x->len, p, n);
    x->len += n;
    return n;
}

static size_t on_send(char *p, size_t sz, size_t nm, void *ud)
{
    xfer *x = ud;
    size_t n = sz * nm, left = x->up_len - x->up_off;
    if (n > left)
        n = left;
    memcpy(p, x->up + x->up_off, n);
    x->up_off += n;
    return n;
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    xfer *x = ud;
    return atomic_load(&x->ck->abort_xfer) ? 1 : 0;
}

/* One transfer: GET into x->buf (upload NULL) or PUT of upload. */
static int url_transfer(sf_ckpt *ck, const char *url, const uint8_t *upload, size_t up_len, xfer *x,
                        sf_ckpt_error *e)
{
    sf_config *c = malloc(sizeof *c);
    if (!c) {
        fail(e, 503, "out_of_memory", NULL, "out of memory");
        return -1;
    }
    sf_config_get(c);
    memset(x, 0, sizeof *x);
    x->ck = ck;
    x->max = (size_t)c->checkpoint.max_bytes;
    x->up = upload;
    x->up_len = up_len;
    char shown[512];
    url_redact(url, shown, sizeof shown);
    CURL *h = curl_easy_init();
    if (!h) {
        free(c);
        fail(e, 503, "out_of_memory", NULL, "cannot start a transfer");
        return -1;
    }
    char errbuf[CURL_ERROR_SIZE] = "";
    struct curl_slist *hdrs = NULL;
    curl_easy_setopt(h, CURLOPT_URL, url);
    /* http and https only, for the URL and for any redirect: a redirect to
     * file://, ftp://, ... fails instead of reading the local disk. */
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, upload ? 0L : 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, (long)c->checkpoint.url_timeout_s);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT,
                     (long)(c->checkpoint.url_timeout_s < 30 ? c->checkpoint.url_timeout_s : 30));
    curl_easy_setopt(h, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "streamfeed-checkpoint");
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
    if (c->checkpoint.url_token[0]) {
        /* Sent to the URL's own host only: libcurl drops it on a redirect to another. */
        curl_easy_setopt(h, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
        curl_easy_setopt(h, CURLOPT_XOAUTH2_BEARER, c->checkpoint.url_token);
    }
    if (upload) {
        hdrs = curl_slist_append(hdrs, "Content-Type: application/vnd.safetensors");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_send);
        curl_easy_setopt(h, CURLOPT_READDATA, x);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)up_len);
    } else {
        curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)x->max);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_recv);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    }
    CURLcode rc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    int timeout_s = c->checkpoint.url_timeout_s;
    free(c);
    const char *verb = upload ? "PUT" : "GET";
    if (rc == CURLE_OK && (code < 200 || code > 299)) {
        fail(e, 422, "url_fetch_failed", "url", "%s %s: the server answered %ld", verb, shown, code);
        free(x->buf);
        x->buf = NULL;
        return -1;
    }
    if (rc == CURLE_OK)
        return 0;
    if (x->too_large || rc == CURLE_FILESIZE_EXCEEDED)
        fail(e, 413, "checkpoint_too_large", "url", "GET %s: more than checkpoint.max_bytes (%zu)",
             shown, x->max);
    else if (rc == CURLE_ABORTED_BY_CALLBACK)
        fail(e, 503, "shutting_down", "url", "%s %s: cut short, the service is shutting down", verb,
             shown);
    else if (rc == CURLE_OPERATION_TIMEDOUT)
        fail(e, 422, "url_fetch_failed", "url", "%s %s: no complete transfer within %d s "
             "(checkpoint.url_timeout_s)", verb, shown, timeout_s);
    else
        fail(e, 422, "url_fetch_failed", "url", "%s %s: %s", verb, shown,
             errbuf[0] ? errbuf : curl_easy_strerror(rc));
    free(x->buf);
    x->buf = NULL;
    return -1;
}

/* Reads a checkpoint from a path or an http(s) URL into memory. */
static int fetch(sf_ckpt *ck, const char *where, uint8_t **buf, size_t *len, sf_ckpt_error *e)
{
    if (is_url(where)) {
        xfer x;
        if (url_transfer(ck, where, NULL, 0, &x, e) != 0)
            return -1;
        *buf = x.buf ? x.buf : malloc(1);
        *len = x.len;
        return *buf ? 0 : -1;
    }
    sf_config *c = malloc(sizeof *c);
    if (!c) {
        fail(e, 503, "out_of_memory", NULL, "out of memory");
        return -1;
    }
    sf_config_get(c);
    uint64_t max = (uint64_t)c->checkpoint.max_bytes;
    free(c);
    return read_file(where, max, buf, len, e);
}

/* ---- operations ---------------------------------------------------------------------- */

enum { OP_GET = 1, OP_PUT, OP_SAVE, OP_LOAD, OP_PERIODIC, OP_FINAL };

struct sf_ckpt_op {
    atomic_int refs;
    sf_ckpt *ck;
    int kind;
    uint64_t key;
    int stage;                 /* request side: 0, then 1 for a load's restore */
    atomic_int stage_done;     /* the current stage finished (worker side) */
    int failed;
    sf_ckpt_error err;
    blob *b;                   /* snapshot: GET, SAVE, PERIODIC */
    decoded d;                 /* restore: PUT, LOAD */
    int reserved;              /* holds a buffer reservation (LOAD) */
    char where[URL_MAX];       /* resolved path or URL; "" = default name in checkpoint.dir */
    int url;
    uint64_t t0;
    sf_ckpt_result res;
    sf_ckpt_op *next;          /* I/O queue */
};

static sf_ckpt_op *op_new(sf_ckpt *ck, int kind)
{
    sf_ckpt_op *op = calloc(1, sizeof *op);
    if (!op)
        return NULL;
    atomic_init(&op->refs, 1);
    op->ck = ck;
    op->kind = kind;
    op->key = KEY_BIT | atomic_fetch_add(&ck->next_key, 1);
    op->t0 = sf_now_ns();
    return op;
}

static void op_ref(sf_ckpt_op *op) { atomic_fetch_add(&op->refs, 1); }

void sf_ckpt_op_release(sf_ckpt_op *op)
{
    if (!op || atomic_fetch_sub(&op->refs, 1) != 1)
        return;
    if (op->b && op->b != op->ck->periodic)
        blob_free(op->b);
    decoded_free(&op->d);
    if (op->reserved)
        atomic_fetch_sub(&op->ck->buffers, 1);
    free(op);
}

static void op_release_void(void *p) { sf_ckpt_op_release(p); }

/* Ends the current stage and wakes the request waiting on it. */
static void stage_finish(sf_ckpt_op *op)
{
    atomic_store(&op->stage_done, 1);
    sf_http_wake(op->ck->app->http, SF_WAIT_CMD, op->key);
}

static void op_fail(sf_ckpt_op *op, int status, const char *code, const char *msg)
{
    op->failed = 1;
    fail(&op->err, status, code, NULL, "%s", msg);
}

static int post_cmd(sf_ckpt *ck, int (*fn)(sf_app *, void *, char *, size_t), sf_ckpt_op *op,
                    sf_ckpt_error *e)
{
    sf_app *app = ck->app;
    if (!app->engine || atomic_load(&app->draining)) {
        fail(e, 503, "shutting_down", NULL, "the service is shutting down");
        return -1;
    }
    op_ref(op);
    sf_engine_cmd *c = sf_engine_cmd_new(fn, op, op_release_void);
    if (!c) {
        sf_ckpt_op_release(op);
        fail(e, 503, "out_of_memory", NULL, "out of memory");
        return -1;
    }
    if (sf_engine_post(app->engine, c) != 0) {
        sf_engine_cmd_release(c); /* frees the command and its reference to op */
        fail(e, 503, "engine_busy", NULL,
             "the engine is stopping or has %d commands queued; retry later", SF_ENGINE_MAX_CMDS);
        return -1;
    }
    sf_engine_cmd_release(c); /* the engine holds its own reference */
    return 0;
}

static int io_enqueue(sf_ckpt *ck, sf_ckpt_op *op)
{
    pthread_mutex_lock(&ck->mu);
    if (!ck->io_started || ck->stop || ck->queued >= IO_QUEUE_MAX) {
        pthread_mutex_unlock(&ck->mu);
        return -1;
    }
    op_ref(op);
    op->next = NULL;
    if (ck->tail)
        ck->tail->next = op;
    else
        ck->head = op;
    ck->tail = op;
    ck->queued++;
    pthread_cond_signal(&ck->cv);
    pthread_mutex_unlock(&ck->mu);
    return 0;
}

static void count_save(sf_ckpt *ck, int ok, uint64_t t0, uint64_t step)
{
    sf_counter_add(ok ? ck->m_ok : ck->m_failed, 1);
    if (ok) {
        sf_hist_observe(ck->m_seconds, (double)(sf_now_ns() - t0) / 1e9);
        sf_gauge_set(ck->m_last_step, (double)step);
    }
}

/* Writes op->b where op says: a path, a URL, or ckpt-<step> in checkpoint.dir
 * (then rotated). Runs on the I/O thread, or on main's at shutdown. */
static int write_blob(sf_ckpt *ck, sf_ckpt_op *op)
{
    blob *b = op->b;
    int rc;
    char err[512] = "";
    if (op->url) {
        xfer x;
        rc = url_transfer(ck, op->where, b->file, b->len, &x, &op->err);
        if (rc)
            op->failed = 1;
        url_redact(op->where, op->res.where, sizeof op->res.where);
        op->res.url = 1;
    } else {
        char path[PATH_MAX + 80];
        if (op->where[0])
            snprintf(path, sizeof path, "%s", op->where);
        else
            snprintf(path, sizeof path, "%s/" FILE_PREFIX "%010llu" FILE_SUFFIX, ck->dir,
                     (unsigned long long)b->step);
        rc = write_file_atomic(path, b->file, b->len, err, sizeof err);
        snprintf(op->res.where, sizeof op->res.where, "%.2000s", path);
        if (rc) {
            op_fail(op, 500, "checkpoint_write_failed", err);
        } else if (!op->where[0]) {
            atomic_store(&ck->saved_step, b->step);
            atomic_store(&ck->saved_gen, b->gen);
            rotate(ck);
        }
    }
    count_save(ck, rc == 0, op->t0, b->step);
    op->res.step = b->step;
    op->res.bytes = b->len;
    op->res.tensors = n_desc_of(ck, b->with_opt);
    op->res.optimizer = b->with_opt;
    op->res.seconds = (double)(sf_now_ns() - op->t0) / 1e9;
    if (rc && op->kind != OP_GET)
        SF_WARN("checkpoint: saving step %llu to %s failed: %s", (unsigned long long)b->step,
                op->res.where, op->err.msg);
    else if (op->kind == OP_PERIODIC || op->kind == OP_FINAL)
        SF_INFO("checkpoint: step %llu saved to %s (%zu bytes, %.3f s)", (unsigned long long)b->step,
                op->res.where, b->len, op->res.seconds);
    return rc;
}

/* The newest ckpt-<step> of checkpoint.dir that reads as a checkpoint;
 * corrupt files are skipped with a warning, any other failure stops. */
static int read_newest(sf_ckpt *ck, decoded *d, char *chosen, size_t cap, sf_ckpt_error *e)
{
    ckfile *v;
    int n = list_ckpts(ck->dir, &v);
    if (n < 0) {
        fail(e, 500, "checkpoint_read_failed", NULL, "cannot list %s: %s", ck->dir, strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char p[PATH_MAX + 80];
        snprintf(p, sizeof p, "%s/%s", ck->dir, v[i].name);
        uint8_t *buf = NULL;
        size_t len = 0;
        int rc = fetch(ck, p, &buf, &len, e);
        if (rc == 0) {
            rc = decode(ck, buf, len, READ_STRICT, d, e);
            free(buf);
        }
        if (rc == 0) {
            snprintf(chosen, cap, "%s", p);
            free(v);
            return 0;
        }
        if (strcmp(e->code, "checkpoint_invalid") != 0 && strcmp(e->code, "checkpoint_read_failed") != 0) {
            char msg[sizeof e->msg];
            snprintf(msg, sizeof msg, "%s", e->msg);
            snprintf(e->msg, sizeof e->msg, "%.200s: %.270s", p, msg);
            free(v);
            return -1;
        }
        SF_WARN("checkpoint: skipping %s: %s", p, e->msg);
    }
    free(v);
    fail(e, 404, "checkpoint_not_found", NULL, "no valid " FILE_PREFIX "<step>" FILE_SUFFIX " in %s",
         ck->dir);
    return -1;
}

static void io_read(sf_ckpt *ck, sf_ckpt_op *op)
{
    if (!op->where[0]) {
        if (read_newest(ck, &op->d, op->res.where, sizeof op->res.where, &op->err) != 0)
            op->failed = 1;
    } else {
        uint8_t *buf = NULL;
        size_t len = 0;
        if (fetch(ck, op->where, &buf, &len, &op->err) != 0 ||
            decode(ck, buf, len, READ_STRICT, &op->d, &op->err) != 0)
            op->failed = 1;
        free(buf);
        op->res.url = op->url;
        if (op->url)
            url_redact(op->where, op->res.where, sizeof op->res.where);
        else
            snprintf(op->res.where, sizeof op->res.where, "%s", op->where);
    }
    if (op->failed)
        sf_counter_add(ck->m_load_failed, 1);
}

static void *io_main(void *arg)
{
    sf_ckpt *ck = arg;
    pthread_mutex_lock(&ck->mu);
    for (;;) {
        while (!ck->head && !ck->stop)
            pthread_cond_wait(&ck->cv, &ck->mu);
        if (ck->stop)
            break;
        sf_ckpt_op *op = ck->head;
        ck->head = op->next;
        if (!ck->head)
            ck->tail = NULL;
        ck->queued--;
        pthread_mutex_unlock(&ck->mu);
        if (op->kind == OP_LOAD) {
            io_read(ck, op);
            stage_finish(op);
        } else {
            write_blob(ck, op);
            if (op->kind == OP_PERIODIC)
                atomic_store(&ck->periodic_busy, 0);
            else
                stage_finish(op);
        }
        sf_ckpt_op_release(op);
        pthread_mutex_lock(&ck->mu);
    }
    /* Stopping: what is still queued fails. */
    while (ck->head) {
        sf_ckpt_op *op = ck->head;
        ck->head = op->next;
        ck->queued--;
        if (op->kind != OP_PERIODIC) {
            op_fail(op, 503, "shutting_down", "the service is shutting down");
            stage_finish(op);
        }
        sf_ckpt_op_release(op);
    }
    ck->tail = NULL;
    pthread_mutex_unlock(&ck->mu);
    return NULL;
}

/* Engine commands: run between two steps with nothing in flight. */
static int cmd_snapshot(sf_app *app, void *arg, char *err, size_t errlen)
{
    sf_ckpt_op *op = arg;
    sf_ckpt *ck = op->ck;
    if (op->kind == OP_PERIODIC && !op->b) {
        /* Periodic saves turned on at run time: the buffer comes now, once. */
        if (!ck->periodic) {
            ck->periodic = blob_new(ck, can_read_opt(ck), 0, 0);
        }
        op->b = ck->periodic;
        if (!op->b) {
            snprintf(err, errlen, "out of memory for the periodic checkpoint buffer");
            count_save(ck, 0, 0, 0);
            SF_WARN("checkpoint: %s", err);
            atomic_store(&ck->periodic_busy, 0);
            return -1;
        }
    }
    if (snapshot(ck, op->b, err, errlen) != 0) {
        if (op->kind == OP_PERIODIC) {
            count_save(ck, 0, 0, 0);
            SF_WARN("checkpoint: periodic save failed: %s", err);
            atomic_store(&ck->periodic_busy, 0);
        } else {
            op_fail(op, 500, "checkpoint_failed", err);
            stage_finish(op);
        }
        return -1;
    }
    if (op->kind == OP_GET) {
        op->res.step = op->b->step;
        op->res.bytes = op->b->len;
        op->res.tensors = n_desc_of(ck, op->b->with_opt);
        op->res.optimizer = op->b->with_opt;
        stage_finish(op);
        return 0;
    }
    /* The file is written on the I/O thread: training goes on meanwhile. */
    if (io_enqueue(ck, op) != 0) {
        snprintf(err, errlen, "the checkpoint writer is stopping or busy");
        if (op->kind == OP_PERIODIC) {
            count_save(ck, 0, 0, 0);
            atomic_store(&ck->periodic_busy, 0);
        } else {
            op_fail(op, 503, "checkpoint_busy", err);
            stage_finish(op);
        }
        return -1;
    }
    return 0;
}

static int cmd_apply(sf_app *app, void *arg, char *err, size_t errlen)
{
    sf_ckpt_op *op = arg;
    int rc = apply(op->ck, &op->d, err, errlen);
    if (rc)
        op_fail(op, 500, "checkpoint_failed", err);
    sf_counter_add(rc ? op->ck->m_load_failed : op->ck->m_load_ok, 1);
    op->res.step = atomic_load(&app->step);
    op->res.bytes = op->d.bytes;
    op->res.tensors = op->d.tensors;
    op->res.optimizer = op->d.has_opt;
    stage_finish(op);
    return rc;
}

/* ---- the periodic hook ---------------------------------------------------------- */

static void after_step(sf_app *app, uint64_t step)
{
    sf_ckpt *ck = app->ckpt;
    if (!ck || !ck->dir[0])
        return;
    sf_config *c = malloc(sizeof *c);
    if (!c)
        return;
    sf_config_get(c);
    int64_t every = c->checkpoint.every_steps;
    free(c);
    if (every <= 0 || step % (uint64_t)every != 0)
        return;
    if (atomic_exchange(&ck->periodic_busy, 1)) {
        /* The last one is still being written: this one is skipped, not queued,
         * so a slow disk costs checkpoints, never training time or memory. */
        sf_counter_add(ck->m_skipped, 1);
        return;
    }
    sf_ckpt_op *op = op_new(ck, OP_PERIODIC);
    sf_ckpt_error e;
    if (!op || post_cmd(ck, cmd_snapshot, op, &e) != 0) {
        /* Out of memory, or the engine is stopping (the final save follows). */
        atomic_store(&ck->periodic_busy, 0);
        sf_counter_add(ck->m_skipped, 1);
    }
    sf_ckpt_op_release(op);
}

/* ---- request operations ----------------------------------------------------------- */

static int usable(sf_app *app, sf_ckpt_error *e)
{
    if (!app->backend || !app->ckpt) {
        fail(e, 409, "no_backend", NULL, "checkpoints need a compute backend (pipeline.mode=train)");
        return -1;
    }
    if (atomic_load(&app->draining)) {
        fail(e, 503, "shutting_down", NULL, "the service is shutting down");
        return -1;
    }
    return 0;
}

static int opt_readable(sf_app *app, int with_opt, sf_ckpt_error *e)
{
    if (app->ckpt->n_bn > 0 && !app->backend->i->get_buffers) {
        fail(e, 501, "buffers_unsupported", NULL,
             "the %s backend cannot read its batchnorm running statistics yet", app->backend_name);
        return -1;
    }
    if (with_opt && !can_read_opt(app->ckpt)) {
        fail(e, 501, "optimizer_state_unsupported", "optimizer",
             "the %s backend cannot read its optimizer state yet; ask for the parameters alone "
             "(optimizer=false)", app->backend_name);
        return -1;
    }
    return 0;
}

sf_ckpt_op *sf_ckpt_get(sf_app *app, int with_opt, sf_ckpt_error *e)
{
    if (usable(app, e) || opt_readable(app, with_opt, e))
        return NULL;
    sf_ckpt *ck = app->ckpt;
    if (sf_ckpt_buffer_reserve(app) != 0) {
        fail(e, 503, "checkpoint_busy", NULL, "%d checkpoint buffers are in use; retry later",
             SF_CKPT_MAX_BUFFERS);
        return NULL;
    }
    sf_ckpt_op *op = op_new(ck, OP_GET);
    blob *b = op ? blob_new(ck, with_opt, 0, 1) : NULL;
    if (!b) {
        sf_ckpt_buffer_return(app);
        sf_ckpt_op_release(op);
        fail(e, 503, "out_of_memory", NULL, "cannot allocate %zu bytes for the checkpoint",
             ck->hdr_bytes[1] + data_bytes(ck, with_opt));
        return NULL;
    }
    op->b = b;
    if (post_cmd(ck, cmd_snapshot, op, e) != 0) {
        sf_ckpt_op_release(op);
        return NULL;
    }
    return op;
}

sf_ckpt_op *sf_ckpt_put(sf_app *app, const uint8_t *body, size_t len, sf_ckpt_error *e)
{
    if (usable(app, e))
        return NULL;
    sf_ckpt *ck = app->ckpt;
    sf_ckpt_op *op = op_new(ck, OP_PUT);
    if (!op) {
        fail(e, 503, "out_of_memory", NULL, "out of memory");
        return NULL;
    }
    /* Validated here, on the request's thread: a bad file changes nothing. */
    if (decode(ck, body, len, READ_STRICT, &op->d, e) != 0) {
        sf_counter_add(ck->m_load_failed, 1);
        sf_ckpt_op_release(op);
        return NULL;
    }
    op->stage = 1;
    if (post_cmd(ck, cmd_apply, op, e) != 0) {
        sf_ckpt_op_release(op);
        return NULL;
    }
    return op;
}

static int target_of(sf_ckpt *ck, sf_ckpt_op *op, const char *path, const char *url, int for_write,
                     sf_ckpt_error *e)
{
    if (path && url) {
        fail(e, 400, "request_invalid", "url", "give \"path\" or \"url\", not both");
        return -1;
    }
    if (url) {
        if (strlen(url) >= URL_MAX) {
            fail(e, 400, "request_invalid", "url", "url is longer than %d bytes", URL_MAX - 1);
            return -1;
        }
        if (!url_scheme_ok(url)) {
            fail(e, 400, "url_scheme_not_allowed", "url", "only http:// and https:// URLs are allowed");
            return -1;
        }
        snprintf(op->where, sizeof op->where, "%s", url);
        op->url = 1;
        return 0;
    }
    if (path)
        return resolve_path(ck, path, for_write, op->where, sizeof op->where, e);
    if (!ck->dir[0]) {
        fail(e, 409, "checkpoint_dir_unset", "path",
             "without \"path\" or \"url\" the file is in checkpoint.dir, which is not set");
        return -1;
    }
    op->where[0] = '\0';
    return 0;
}

sf_ckpt_op *sf_ckpt_save(sf_app *app, const char *path, const char *url, int with_opt,
                         sf_ckpt_error *e)
{
    if (usable(app, e) || opt_readable(app, with_opt, e))
        return NULL;
    sf_ckpt *ck = app->ckpt;
    sf_ckpt_op *op = op_new(ck, OP_SAVE);
    if (!op) {
        fail(e, 503, "out_of_memory", NULL, "out of memory");
        return NULL;
    }
    if (target_of(ck, op, path, url, 1, e) != 0) {
        sf_ckpt_op_release(op);
        return NULL;
    }
    if (sf_ckpt_buffer_reserve(app) != 0) {
        sf_ckpt_op_release(op);
        fail(e, 503, "checkpoint_busy", NULL, "%d checkpoint buffers are in use; retry later",
             SF_CKPT_MAX_BUFFERS);
        return NULL;
    }
    op->b = blob_new(ck, with_opt, 0, 1);
    if (!op->b) {
        sf_ckpt_buffer_return(app);
        sf_ckpt_op_release(op);
        fail(e, 503, "out_of_memory", NULL, "cannot allocate the checkpoint buffer");
        return NULL;
    }
    if (post_cmd(ck, cmd_snapshot, op, e) != 0) {
        sf_ckpt_op_release(op);
        return NULL;
    }
    return op;
}

sf_ckpt_op *sf_ckpt_load(sf_app *app, const char *path, const char *url, sf_ckpt_error *e)
{
    if (usable(app, e))
        return NULL;
    sf_ckpt *ck = app->ckpt;
    sf_ckpt_op *op = op_new(ck, OP_LOAD);
    if (!op) {
        fail(e, 503, "out_of_memory", NULL, "out of memory");
        return NULL;
    }
    if (target_of(ck, op, path, url, 0, e) != 0) {
        sf_ckpt_op_release(op);
        return NULL;
    }
    if (sf_ckpt_buffer_reserve(app) != 0) {
        sf_ckpt_op_release(op);
        fail(e, 503, "checkpoint_busy", NULL, "%d checkpoint buffers are in use; retry later",
             SF_CKPT_MAX_BUFFERS);
        return NULL;
    }
    op->reserved = 1;
    if (io_enqueue(ck, op) != 0) {
        sf_ckpt_op_release(op);
        fail(e, 503, "checkpoint_busy", NULL, "the checkpoint I/O queue is full or stopping");
        return NULL;
    }
    return op;
}

int sf_ckpt_op_advance(sf_app *app, sf_ckpt_op *op)
{
    if (!atomic_load(&op->stage_done))
        return 0;
    if (op->failed)
        return 1;
    if (op->kind == OP_LOAD && op->stage == 0) {
        /* Read and checked on the I/O thread; restored between two steps. */
        op->stage = 1;
        atomic_store(&op->stage_done, 0);
        if (post_cmd(op->ck, cmd_apply, op, &op->err) != 0) {
            op->failed = 1;
            atomic_store(&op->stage_done, 1);
            return 1;
        }
        return 0;
    }
    op->res.seconds = (double)(sf_now_ns() - op->t0) / 1e9;
    return 1;
}

uint64_t sf_ckpt_op_key(const sf_ckpt_op *op) { return op->key; }

const sf_ckpt_error *sf_ckpt_op_error(const sf_ckpt_op *op) { return op->failed ? &op->err : NULL; }

void sf_ckpt_op_result(const sf_ckpt_op *op, sf_ckpt_result *out) { *out = op->res; }

int sf_ckpt_op_take_file(sf_ckpt_op *op, void **data, size_t *len, void (**free_fn)(void *))
{
    if (op->kind != OP_GET || !op->b || op->failed || !atomic_load(&op->stage_done))
        return -1;
    *data = op->b->file;
    *len = op->b->len;
    *free_fn = blob_free_file;
    op->b = NULL;
    return 0;
}

/* ---- process life ---------------------------------------------------------------------- */

static void register_metrics(sf_ckpt *ck)
{
    static const char *const L_STATUS[] = {"status", NULL};
    sf_family *total = sf_metrics_counter(
        "streamfeed_checkpoints_total",
        "Checkpoints written, by status: ok, failed, or skipped (a periodic save due while the "
        "last one was still being written).",
        L_STATUS);
    sf_family *loads = sf_metrics_counter("streamfeed_checkpoint_loads_total",
                                          "Checkpoints restored (PUT, load, resume), by status.",
                                          L_STATUS);
    sf_family *secs = sf_metrics_histogram(
        "streamfeed_checkpoint_seconds",
        "Time to take a checkpoint: snapshot between two steps, serialise, write and fsync.", NULL,
        sf_buckets_latency, sf_buckets_latency_n);
    sf_family *last = sf_metrics_gauge("streamfeed_checkpoint_last_step",
                                       "Step count of the last checkpoint written.", NULL);
    const char *ok[] = {"ok"}, *failed[] = {"failed"}, *skipped[] = {"skipped"};
    if (!ck) {
        /* Sink mode: the families exist and read 0. */
        sf_metric_child(total, ok);
        sf_metric_child(total, failed);
        sf_metric_child(total, skipped);
        sf_metric_child(loads, ok);
        sf_metric_child(loads, failed);
        sf_metric_only(secs);
        sf_metric_only(last);
        return;
    }
    ck->m_ok = sf_metric_child(total, ok);
    ck->m_failed = sf_metric_child(total, failed);
    ck->m_skipped = sf_metric_child(total, skipped);
    ck->m_load_ok = sf_metric_child(loads, ok);
    ck->m_load_failed = sf_metric_child(loads, failed);
    ck->m_seconds = sf_metric_only(secs);
    ck->m_last_step = sf_metric_only(last);
}

static int open_dir(sf_ckpt *ck, const char *dir, char *err, size_t errlen)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "checkpoint.dir %s: cannot create it: %s", dir, strerror(errno));
        return -1;
    }
    if (!realpath(dir, ck->dir)) {
        snprintf(err, errlen, "checkpoint.dir %s: %s", dir, strerror(errno));
        ck->dir[0] = '\0';
        return -1;
    }
    struct stat st;
    if (stat(ck->dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(ck->dir, W_OK | X_OK) != 0) {
        snprintf(err, errlen, "checkpoint.dir %s is not a writable directory", ck->dir);
        ck->dir[0] = '\0';
        return -1;
    }
    remove_stale_tmp(ck);
    return 0;
}

static int resume(sf_ckpt *ck, int *resumed, char *err, size_t errlen)
{
    decoded d = {0};
    sf_ckpt_error e = {0};
    char chosen[PATH_MAX + 80];
    *resumed = 0;
    if (read_newest(ck, &d, chosen, sizeof chosen, &e) != 0) {
        if (e.status == 404) {
            SF_INFO("checkpoint.resume: no checkpoint in %s: starting from the initialisation", ck->dir);
            return 0;
        }
        snprintf(err, errlen, "checkpoint.resume: %s", e.msg);
        sf_counter_add(ck->m_load_failed, 1);
        return -1;
    }
    int rc = apply(ck, &d, err, errlen);
    if (rc == 0) {
        SF_INFO("checkpoint.resume: restored %s (step %llu%s)", chosen,
                (unsigned long long)atomic_load(&ck->app->step),
                d.has_opt ? ", optimizer state included" : ", no optimizer state in the file");
        atomic_store(&ck->saved_step, atomic_load(&ck->app->step));
        atomic_store(&ck->saved_gen, atomic_load(&ck->state_gen));
        *resumed = 1;
    }
    sf_counter_add(rc ? ck->m_load_failed : ck->m_load_ok, 1);
    decoded_free(&d);
    return rc;
}

static int init_from(sf_ckpt *ck, const char *src, char *err, size_t errlen)
{
    sf_app *app = ck->app;
    char shown[512];
    if (is_url(src) && !url_scheme_ok(src)) {
        snprintf(err, errlen, "model.init_from: only http:// and https:// URLs are allowed");
        return -1;
    }
    if (is_url(src))
        url_redact(src, shown, sizeof shown);
    else
        snprintf(shown, sizeof shown, "%.500s", src);
    uint8_t *buf = NULL;
    size_t len = 0;
    sf_ckpt_error e = {0};
    decoded d = {0};
    d.params = malloc(app->model.n_params * sizeof(float));
    int rc = -1;
    if (!d.params || app->backend->i->get_params(app->backend, d.params) != 0) {
        snprintf(err, errlen, "model.init_from: cannot read the initial parameters");
        goto out;
    }
    /* Batchnorm running statistics named in the file initialise theirs too (a
     * pre-trained backbone runs with its own statistics). */
    sf_backend *be = app->backend;
    int bufs = ck->n_bn > 0 && be->i->get_buffers && be->i->set_buffers;
    if (bufs) {
        d.bufs = malloc(app->model.n_buffers * sizeof(float));
        if (!d.bufs || be->i->get_buffers(be, d.bufs, &d.nbt) != 0) {
            snprintf(err, errlen, "model.init_from: cannot read the initial buffers");
            goto out;
        }
    }
    if (fetch(ck, src, &buf, &len, &e) != 0 || decode(ck, buf, len, READ_PARTIAL, &d, &e) != 0) {
        snprintf(err, errlen, "model.init_from %s: %s", shown, e.msg);
        goto out;
    }
    if (be->i->set_params(be, d.params) != 0 || (bufs && be->i->set_buffers(be, d.bufs, d.nbt) != 0)) {
        snprintf(err, errlen, "model.init_from: the backend could not set its parameters");
        goto out;
    }
    atomic_fetch_add(&ck->state_gen, 1);
    SF_INFO("model.init_from: %d of %d parameter tensors initialised from %s (%d tensors in the file)",
            d.matched, ck->n_pt, shown, d.tensors);
    rc = 0;
out:
    free(buf);
    decoded_free(&d);
    return rc;
}

int sf_ckpt_start(sf_app *app, char *err, size_t errlen)
{
    if (!app->backend) {
        register_metrics(NULL);
        return 0;
    }
    sf_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    ck->app = app;
    pthread_mutex_init(&ck->mu, NULL);
    pthread_cond_init(&ck->cv, NULL);
    atomic_init(&ck->next_key, 1);
    app->ckpt = ck;
    register_metrics(ck);
    if (layout_init(ck, err, errlen) != 0)
        return -1;
    const sf_config *c = &app->cfg;
    if (c->checkpoint.dir[0] && open_dir(ck, c->checkpoint.dir, err, errlen) != 0)
        return -1;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        snprintf(err, errlen, "libcurl could not be initialised");
        return -1;
    }
    ck->curl_ready = 1;
    int resumed = 0;
    if (c->checkpoint.resume && resume(ck, &resumed, err, errlen) != 0)
        return -1;
    if (c->checkpoint.init_from[0]) {
        if (resumed)
            SF_INFO("model.init_from ignored: the state was resumed from a checkpoint");
        else if (init_from(ck, c->checkpoint.init_from, err, errlen) != 0)
            return -1;
    }
    if (!resumed) {
        atomic_store(&ck->saved_step, atomic_load(&app->step));
        atomic_store(&ck->saved_gen, atomic_load(&ck->state_gen));
    }
    /* Periodic saves configured from the start get their buffer now, in memory
     * the backend copies to fastest (pinned on CUDA). */
    if (ck->dir[0] && c->checkpoint.every_steps > 0) {
        ck->periodic = blob_new(ck, can_read_opt(ck), 1, 0);
        if (!ck->periodic) {
            snprintf(err, errlen, "cannot allocate %zu bytes for periodic checkpoints",
                     ck->hdr_bytes[1] + data_bytes(ck, 1));
            return -1;
        }
    }
    if (pthread_create(&ck->io, NULL, io_main, ck) != 0) {
        snprintf(err, errlen, "cannot start the checkpoint I/O thread");
        return -1;
    }
    ck->io_started = 1;
    return 0;
}

void sf_ckpt_attach(sf_app *app)
{
    if (app->ckpt && app->engine)
        sf_engine_set_after_step(app->engine, after_step);
}

static void final_save(sf_ckpt *ck)
{
    sf_app *app = ck->app;
    sf_config *c = malloc(sizeof *c);
    if (!c)
        return;
    sf_config_get(c);
    int on = c->checkpoint.on_shutdown;
    free(c);
    if (!ck->dir[0] || !on)
        return;
    uint64_t step = atomic_load(&app->step);
    if (step == atomic_load(&ck->saved_step) && atomic_load(&ck->state_gen) == atomic_load(&ck->saved_gen)) {
        SF_INFO("checkpoint: nothing new since step %llu: no final checkpoint needed",
                (unsigned long long)step);
        return;
    }
    int with_opt = can_read_opt(ck);
    sf_ckpt_op *op = op_new(ck, OP_FINAL);
    if (!op)
        return;
    if (ck->periodic && ck->periodic->with_opt == with_opt) {
        op->b = ck->periodic;
    } else {
        op->b = blob_new(ck, with_opt, 0, 0);
        if (!op->b) {
            SF_WARN("checkpoint: no memory for the final checkpoint");
            sf_ckpt_op_release(op);
            return;
        }
    }
    char err[256];
    /* The engine has stopped: nothing is in flight, the backend is ours. */
    if (snapshot(ck, op->b, err, sizeof err) != 0) {
        SF_WARN("checkpoint: final save failed: %s", err);
        count_save(ck, 0, 0, 0);
    } else {
        write_blob(ck, op);
    }
    sf_ckpt_op_release(op);
}

void sf_ckpt_shutdown(sf_app *app)
{
    sf_ckpt *ck = app->ckpt;
    if (!ck)
        return;
    if (ck->io_started) {
        pthread_mutex_lock(&ck->mu);
        ck->stop = 1;
        atomic_store(&ck->abort_xfer, 1);
        pthread_cond_broadcast(&ck->cv);
        pthread_mutex_unlock(&ck->mu);
        pthread_join(ck->io, NULL);
        ck->io_started = 0;
    }
    if (app->backend)
        final_save(ck);
    /* Requests may still hold operations (and GET replies their files): those
     * release themselves; the module's own state goes now. Each of them holds
     * a pointer to ck, so ck itself is kept until exit. */
    if (ck->periodic) {
        blob_free(ck->periodic);
        ck->periodic = NULL;
    }
    if (ck->curl_ready)
        curl_global_cleanup();
    ck->curl_ready = 0;
}
