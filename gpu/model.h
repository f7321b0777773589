/* gpu/model.h — the model description shared by every backend.
 *
 * A model is a chain of layers over one input of shape [C,H,W] (per sample).
 * The description is plain data: it is parsed from a preset name or a JSON
 * layer list, validated and resolved (every layer's input/output shape and its
 * parameters' offsets in one flat float buffer) once, on the host, and then
 * handed to a backend, which allocates and runs it.
 *
 * Parameters live in one flat float32 buffer; for each layer with weights the
 * weight comes first, then the bias, each contiguous in PyTorch's own layout
 * (conv2d: [out_c, in_c, k, k]; linear: [out, in]), so a state_dict tensor maps
 * to a slice of the buffer with no transposition.
 *
 * Pure C, no CUDA, no HTTP. Thread-safety: functions are reentrant; a resolved
 * sf_model is immutable and may be read from any thread.
 */
#ifndef SF_GPU_MODEL_H
#define SF_GPU_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define SF_MAX_LAYERS 64
#define SF_LAYER_NAME_MAX 48

typedef enum sf_layer_kind {
    SF_L_CONV2D = 0,   /* in_c -> out_c, kernel k, stride, pad, optional bias */
    SF_L_RELU,
    SF_L_FLATTEN,      /* [C,H,W] -> [C*H*W] (a view, no data movement) */
    SF_L_LINEAR,       /* in_c -> out_c features, optional bias */
    /* Reserved for the W2/W3 issue; parsers reject them until implemented. */
    SF_L_CONV_TRANSPOSE2D,
    SF_L_BATCHNORM2D,
    SF_L_MAXPOOL2D,
    SF_L_GLOBAL_AVGPOOL,
    SF_L_KIND_COUNT
} sf_layer_kind;

typedef struct sf_layer {
    sf_layer_kind kind;
    char name[SF_LAYER_NAME_MAX]; /* state_dict prefix: "0", "2", ... for Sequential presets */
    int in_c, out_c;              /* channels (conv) or features (linear) */
    int k, stride, pad;           /* conv only */
    int bias;                     /* 1 when the layer has a bias */
    /* Filled by sf_model_resolve: */
    int in_h, in_w, out_h, out_w; /* spatial sizes; 1x1 for flattened tensors */
    int out_ch;                   /* channels/features of the output */
    size_t w_off, b_off;          /* offsets (floats) into the flat parameter buffer */
    size_t n_w, n_b;              /* element counts; 0 where absent */
    size_t out_elems;             /* elements of the output per sample */
} sf_layer;

typedef struct sf_model {
    char preset[32];     /* preset name, or "custom" */
    int in_c, in_h, in_w; /* input per sample, NCHW */
    int n_classes;       /* logits of the last layer */
    int n_layers;
    sf_layer layers[SF_MAX_LAYERS];
    /* Filled by sf_model_resolve: */
    size_t n_params;     /* total floats of the flat parameter buffer */
    size_t max_act;      /* largest per-sample activation (floats) of any layer */
} sf_model;

/* Fills *m from a preset name: "seed-classifier" (W1 of shared/WORKLOADS.md,
 * 256x256x3 input) or "tiny" (32x32x3 input, few channels, for CPU tests and
 * the CPU demo). Resolves it. Returns 0, or -1 with a message in err. */
int sf_model_from_preset(const char *name, sf_model *m, char *err, size_t errlen);

/* Fills *m from a JSON object:
 *   {"input":[C,H,W], "classes":K, "layers":[{"type":"conv2d","out":16,"k":1,
 *    "stride":1,"pad":0,"bias":true}, {"type":"relu"}, {"type":"flatten"},
 *    {"type":"linear","out":10}]}
 * in_c of each layer is inferred from the previous one. Resolves it.
 * Invalid specs (unknown layer, zero channels, a shape that does not fit, the
 * last layer's width != classes) fail naming the offending layer index and type. */
int sf_model_from_json(const char *json, sf_model *m, char *err, size_t errlen);

/* Computes shapes, parameter offsets and sizes. Called by both constructors;
 * exposed for models built field by field in tests. */
int sf_model_resolve(sf_model *m, char *err, size_t errlen);

/* Initialises params (n_params floats) as PyTorch's default initialisation does
 * for Conv2d and Linear (kaiming_uniform_(a=sqrt(5)) for weights, i.e.
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for biases), drawing
 * from the counter-based generator of gpu/rng.h keyed by seed. Deterministic. */
void sf_model_init_params(const sf_model *m, uint64_t seed, float *params);

/* Short human-readable name of a layer kind ("conv2d", ...). */
const char *sf_layer_kind_name(sf_layer_kind k);

#endif
