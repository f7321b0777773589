/* gpu/layers.h — the layer-kind registry: one row per kind of layer.
 *
 * A row says everything the service knows about a kind apart from the
 * kernels themselves: its JSON name and fields (with bounds and defaults;
 * the model parser loops over them), how many inputs it takes, its shape
 * inference, its parameters and buffers (PyTorch state_dict suffixes and
 * shapes, in state_dict order, which is also their order in the flat
 * buffers), their initialisation, the reference backend's forward and
 * backward hooks (gpu/ref), and what the CUDA backend runs of it.
 * sf_model_resolve, the JSON parser, the checkpoint layout, the model spec a
 * checkpoint carries and the generated supported-op table (docs/LAYERS.md)
 * all loop over these rows, so a new kind is a row in gpu/layers.c plus its
 * op-family files (docs/DESIGN.md, "Adding a layer kind").
 *
 * Pure C, no CUDA, no HTTP. The table is constant and may be read from any
 * thread.
 */
#ifndef SF_GPU_LAYERS_H
#define SF_GPU_LAYERS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gpu/upsample_rule.h"
#include "gpu/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bounds that keep every size computation far from overflow and reject
 * absurd specs early (a model past them could not be allocated anyway). */
#define SF_MAX_CHANNELS (1 << 16)        /* channels or features of one layer */
#define SF_MAX_SPATIAL (1 << 14)         /* height or width */
#define SF_MAX_KERNEL 64                 /* kernel size, stride, padding, dilation */
#define SF_MAX_ACT ((size_t)1 << 30)     /* floats of one sample's activation */

/* How a JSON field is stored in sf_layer (at sf_layer_field.off). */
typedef enum sf_field_type {
    SF_FT_INT = 0, /* int */
    SF_FT_BOOL,    /* int, 0 or 1 */
    SF_FT_FLOAT,   /* float */
    SF_FT_ENUM,    /* int: the index of the string in choices */
    SF_FT_INT_PAIR, /* int[2] from a JSON array [a, b] */
    SF_FT_INT_HW,   /* an int for both dimensions or [h, w] (PyTorch's kernel_size, stride,
                     * padding and dilation): h at off, w SF_FT_HW_WIDTH bytes after it */
    SF_FT_INT_QUAD  /* int[4] from a JSON array [a, b, c, d] (F.pad's [left, right, top, bottom]) */
} sf_field_type;

enum {
    SF_FF_REQUIRED = 1 << 0,   /* absent is an error */
    SF_FF_INFERRED = 1 << 1,   /* optional, checked against the inferred value; not written back */
    SF_FF_IF_SET = 1 << 2,     /* written back only when it differs from its default */
    SF_FF_LO_OPEN = 1 << 4,    /* FLOAT: lo itself is out of bounds */
    SF_FF_HI_OPEN = 1 << 5,    /* FLOAT: hi itself is out of bounds */
};

typedef struct sf_layer_field {
    const char *key;            /* JSON key */
    sf_field_type type;
    size_t off;                 /* offsetof(sf_layer, ...) */
    double lo, hi;              /* bounds of a number (each element of a pair) */
    double def;                 /* value when absent (ENUM: index; PAIR: both elements) */
    int flags;                  /* SF_FF_* */
    const char *const *choices; /* ENUM: the accepted strings, NULL-terminated */
    const char *doc;            /* one line for the generated table */
} sf_layer_field;

/* Where an INT_HW field's width value lies after its height's: sf_layer
 * keeps conv2d's window as k, stride, pad, dilation, then the same four
 * along the width (gpu/layers.c asserts each pair). */
#define SF_FT_HW_WIDTH (offsetof(sf_layer, kw) - offsetof(sf_layer, k))
/* Where a two-int field (INT_PAIR, INT_HW) keeps its second value: the next
 * int, or the width's field. */
#define SF_FT_SECOND(f) ((f)->off + ((f)->type == SF_FT_INT_HW ? SF_FT_HW_WIDTH : sizeof(int)))

/* A tensor's shape per sample as the resolver tracks it. flat: the tensor is
 * a feature vector [c] (after a flatten or a linear layer), h = w = 1.
 * tokens: a token sequence [h, c] (h tokens of c values, token-major), w = 1. */
typedef struct sf_shape {
    int c, h, w, flat, tokens;
} sf_shape;

/* One parameter of a layer: its state_dict suffix and its PyTorch shape. An
 * empty suffix keys the parameter by the layer's name itself: a tensor that
 * a module holds directly rather than through a submodule
 * (VisionTransformer.class_token, Encoder.pos_embedding). */
typedef struct sf_param_desc {
    const char *suffix;
    int ndim;
    int64_t shape[4];
} sf_param_desc;

struct sf_ref_io;
typedef void (*sf_ref_layer_fn)(const struct sf_ref_io *io);

typedef struct sf_layer_kind_info {
    const char *name;      /* JSON "type" */
    const char *torch;     /* what it computes, in PyTorch's terms (docs) */
    int min_in, max_in;    /* inputs; 1,1 reads the previous layer unless "inputs" names one */
    int needs_map;         /* the (first) input must be a [C,H,W] map, not flattened features */
    int no_tokens;         /* the (first) input is a map or flat features, not a token sequence (whose
                              channels are its last dimension) */
    const sf_layer_field *fields; /* terminated by a row with key NULL */
    /* Output shape from the input shapes (in[0..n_in)); may fill defaults of
     * fields left 0 by a caller that built the layer field by field. Writes
     * the reason (without the "layer i (kind): " prefix) and returns -1 when
     * the layer does not fit. */
    int (*shape)(sf_layer *L, const sf_shape *in, int n_in, sf_shape *out, char *err, size_t errlen);
    /* The parameters, at most SF_PARAM_SLOTS, in state_dict order: slot j
     * becomes (p_off[j], p_n[j]), slot 0 also (w_off, n_w) and slot 1
     * (b_off, n_b). Returns how many; NULL: none. */
    int (*params)(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS]);
    const char *const *buffers; /* buffer suffixes, [out channels] each (running statistics); NULL none */
    /* Initialises the layer's parameters in params (at w_off, b_off); layer
     * index li keys the draws. NULL: no parameters. */
    void (*init)(const sf_layer *L, int li, uint64_t seed, float *params);
    /* Reference backend: forward and backward (gpu/ref/layer_io.h). */
    sf_ref_layer_fn ref_fwd, ref_bwd;
    /* Reference backend: floats of per-layer saved state for a batch of nb
     * (batch statistics, argmax indices). NULL: none. */
    size_t (*ref_save)(const sf_layer *L, size_t nb);
    int view;         /* no storage of its own: the output is its input (flatten) */
    int bf16_weights; /* precision=bf16 computes with the weight (slot 0) rounded to bf16 */
    int bf16_wgrad;   /* precision=bf16 rounds the weight gradient to bf16 (cuDNN writes it so) */
    int cuda;         /* the CUDA backend runs it (its fields at their defaults where marked) */
    int cuda_tokens;  /* ... and on token sequences too (without it, a token-sequence input is refused) */
    const char *doc;  /* one sentence for the generated table */
} sf_layer_kind_info;

/* The row of kind k; NULL for a kind outside the table. */
const sf_layer_kind_info *sf_layer_info(sf_layer_kind k);

/* The kind named s (JSON "type"); -1 when there is none. */
int sf_layer_kind_from_name(const char *s);

/* Writes "a, b, c" (every kind's name) into buf. */
void sf_layer_kind_list(char *buf, size_t len);

/* The parameters of a resolved layer (see the params hook); 0 when none. */
int sf_layer_params(const sf_layer *L, sf_param_desc pd[SF_PARAM_SLOTS]);

/* Writes the state_dict key of L's parameter pd into buf: "<name>.<suffix>",
 * or the layer's name alone where the suffix is empty. */
void sf_layer_param_key(const sf_layer *L, const sf_param_desc *pd, char *buf, size_t len);

/* Floats of all of a resolved layer's parameters. */
size_t sf_layer_param_count(const sf_layer *L);

/* 1 when the output of a resolved layer is a feature vector (flatten, linear
 * over features of a flat input, select_token), 0 when it is a [C,H,W] map
 * or a token sequence. */
int sf_layer_out_is_features(const sf_layer *L);

/* self_attention's parameter slot of projection j's (0: q, k, v; 1: the
 * output) weight (bias 0) or bias (bias 1; -1 where it has none): in_proj_weight,
 * in_proj_bias, out_proj.weight, out_proj.bias in that order, the absent
 * biases left out. With qkv_split the input projection is three slots of
 * weights, q, k, v, then three of biases: slots are contiguous in the
 * parameter buffer (sf_layer.p_off), so the weights' first slot reads as
 * in_proj_weight [3C, C] and the biases' first as in_proj_bias [3C], and
 * every backend runs the one GEMM of the stacked form. */
static inline int sf_attn_slot(const sf_layer *L, int j, int bias)
{
    const int nw = L->qkv_split ? 3 : 1, nin = nw * (1 + (L->bias != 0));
    if (!j)
        return bias ? (L->bias ? nw : -1) : 0;
    return bias ? (L->out_bias ? nin + 1 : -1) : nin;
}

/* 1 when a resolved conv2d layer has the same kernel size, stride, padding
 * and dilation along both dimensions: the CUDA backend's own convolution
 * kernels (depthwise, thin, patch, space-to-depth, 1x1 GEMM) take one value
 * of each, and cuDNN runs every other convolution. */
static inline int sf_layer_conv_square(const sf_layer *L)
{
    return L->kw == L->k && L->stride_w == L->stride && L->pad_w == L->pad && L->dilation_w == L->dilation;
}

/* The value of field f of L as a double (PAIR, INT_HW: its first element). */
double sf_layer_field_value(const sf_layer *L, const sf_layer_field *f);

/* Sets every field of L to its default (the JSON parser's starting point). */
void sf_layer_set_defaults(sf_layer *L);

/* Why the CUDA backend cannot run layer i of m: 0 when it can, else -1 with
 * a sentence naming the layer, its kind (or field) and the reference backend,
 * which runs every kind. */
int sf_layer_cuda_check(const sf_model *m, int i, char *err, size_t errlen);

/* Adds L's fields to the JSON object obj in model.spec syntax, in the row's
 * order: every field but the inferred ones ("in"), and the SF_FF_IF_SET ones
 * only when they differ from their defaults (so a model that uses none of
 * them is written as it always was). */
struct cJSON;
void sf_layer_fields_to_json(const sf_layer *L, struct cJSON *obj);

/* Writes the supported-op table (docs/LAYERS.md, `streamfeed --help-layers`)
 * generated from the rows (gpu/layers_doc.c). */
void sf_layer_kinds_markdown(FILE *out);

/* The shape per sample of input j of layer i. */
void sf_layer_in_shape(const sf_model *m, int i, int j, sf_shape *s);

/* The number of inputs layer i reads (1 unless "inputs" names more). */
int sf_layer_n_inputs(const sf_layer *L);

/* An upsample layer's rule, its resolved sizes and PyTorch's scales
 * (gpu/upsample_rule.h): what both backends' kernels take. */
sf_up_rule sf_layer_up_rule(const sf_layer *L);

#ifdef __cplusplus
}
#endif

#endif
