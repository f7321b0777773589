/* server/checkpoint_format.h — the checkpoint file format (checkpoint.h
 * describes it): the model's tensors laid out as a PyTorch state_dict plus the
 * optimizer state, the header written for a snapshot, and the decoder that
 * checks a file against the model.
 *
 * Pure functions of a layout and bytes: nothing here touches a backend, a
 * thread, a file or the network, so the decoder can be fuzzed on its own
 * (tests/fuzz/fuzz_checkpoint.c). The safetensors container itself is read by
 * server/safetensors.c (sf_st_file_read), the project's one reader.
 */
#ifndef SF_CHECKPOINT_FORMAT_H
#define SF_CHECKPOINT_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/model.h"
#include "server/safetensors.h"

#define SF_CKPT_FORMAT_VERSION 1

/* The largest count a checkpoint may carry (optim.step, num_batches_tracked,
 * __metadata__.step). Replies give the step count as a cJSON number, printed
 * with 15 significant digits when that reads back within a relative epsilon:
 * exact digits below 10^15 only (1e+15 and up in exponent form, rounded from
 * 2^52), so the bound is 10^15 - 1 rather than 2^53 - 1. So far below 2^63 no
 * count of training steps can wrap the I64 tensors a save writes. */
#define SF_CKPT_MAX_COUNT UINT64_C(999999999999999)
#define SF_CKPT_MAX_COUNT_WHY                                                                  \
    "above 10^15 - 1 (999999999999999), the largest count a checkpoint may carry: replies "  \
    "(GET /v1/model, batches) give step counts as JSON numbers, exact below 10^15 only"

/* Why an operation failed: an HTTP status, a stable code, the tensor or
 * field to blame ("" if none) and a sentence. */
typedef struct sf_ckpt_error {
    int status;
    char code[48];
    char field[160];
    char msg[480];
} sf_ckpt_error;

/* Fills e (when not NULL): status, stable code, the field or tensor to blame
 * (NULL: none) and a sentence. */
void sf_ckpt_fail(sf_ckpt_error *e, int status, const char *code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* One tensor of the model: a slice of the flat parameter or buffers area. */
typedef struct sf_ckpt_tensor {
    char name[SF_PARAM_KEY_MAX]; /* "<layer>.weight", "<layer>.running_mean", "<layer>.qkv.weight" */
    int ndim;
    int64_t shape[4];
    size_t off, n;                    /* floats */
} sf_ckpt_tensor;

/* The file's tensors, in file order (checkpoint.h):
 *   [0, n_pt)                 parameters          (flat parameter buffer)
 *   [bt0, bt0 + n_bt)         running_mean/var    (flat buffers area)
 *   [nb0, nb0 + n_bn)         num_batches_tracked (I64 [], one per batchnorm layer)
 *   [o10, o10 + n_pt)         optim.<p>.momentum_buffer | .exp_avg
 *   [o20, o20 + n_pt)         optim.<p>.exp_avg_sq (AdamW only)
 *   n_desc - 1                optim.step
 * The state_dict part ends at bt0 + n_bt + n_bn = o10. */
typedef struct sf_ckpt_layout {
    const sf_model *model;
    sf_ckpt_tensor pt[2 * SF_MAX_LAYERS];
    int n_pt;
    sf_ckpt_tensor bt[2 * SF_MAX_LAYERS]; /* running_mean, running_var of each batchnorm layer */
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
} sf_ckpt_layout;

/* Builds the layout of model m (kept by pointer); 0, or -1 with err. The
 * layout lives as long as the process (the checkpoint module keeps it until
 * exit, since requests may hold operations that point into it). */
int sf_ckpt_layout_init(sf_ckpt_layout *L, const sf_model *m, int adamw, char *err, size_t errlen);
/* Tensors in a file with or without the optimizer state. */
int sf_ckpt_n_tensors(const sf_ckpt_layout *L, int with_opt);
/* Bytes of the data section, and of the whole file (reserved header included). */
size_t sf_ckpt_data_bytes(const sf_ckpt_layout *L, int with_opt);
size_t sf_ckpt_file_bytes(const sf_ckpt_layout *L, int with_opt);
#define SF_CKPT_MAX_HEADER ((uint64_t)100 << 20) /* safetensors' own bound on the JSON header */
/* The largest file that can be a checkpoint of this model: its whole state
 * with the optimizer's, and a header with room for another writer's layout
 * (PyTorch's) — names, offsets and metadata — beside ours. A strict read of
 * anything longer fails, so a body or download is refused as soon as it is
 * (or announces to be) longer. */
uint64_t sf_ckpt_max_file_bytes(const sf_ckpt_layout *L);

/* Writes the header for step into file[0, hdr) (hdr: the reserved size),
 * padded with spaces so the data never moves. 0, or -1 with err. */
int sf_ckpt_header_write(const sf_ckpt_layout *L, uint8_t *file, size_t hdr, int with_opt,
                         uint64_t step, uint64_t config_hash, const char *backend, char *err,
                         size_t errlen);

void sf_ckpt_put_le64(uint8_t *p, uint64_t v);
uint64_t sf_ckpt_get_le64(const uint8_t *p);

/* What the backend can restore, for the decoder's 501s. */
typedef struct sf_ckpt_caps {
    int opt;              /* optimizer state (both AdamW moments) */
    int buffers;          /* batchnorm running statistics */
    const char *backend;  /* its name, for messages */
} sf_ckpt_caps;

/* A checkpoint read and checked against the model. */
typedef struct sf_ckpt_decoded {
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
} sf_ckpt_decoded;

void sf_ckpt_decoded_free(sf_ckpt_decoded *d);

enum { SF_CKPT_READ_STRICT = 0, SF_CKPT_READ_PARTIAL = 1 };

/* Reads a checkpoint against the model (checkpoint.h says what strict and
 * partial mean). Partial reads overlay matching tensors onto d->params (and
 * d->bufs when not NULL), which the caller filled; strict reads allocate
 * d->params, d->bufs, and d->mom/d->sq when caps->opt. Every F32 value taken
 * must be finite: a NaN or an infinity is 400 checkpoint_not_finite naming the
 * tensor. 0, or -1 with e (a strict read then frees what it allocated). */
int sf_ckpt_decode(const sf_ckpt_layout *L, const sf_ckpt_caps *caps, const uint8_t *buf, size_t len,
                   int mode, sf_ckpt_decoded *d, sf_ckpt_error *e);

#endif
