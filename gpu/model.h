/* gpu/model.h — the model description shared by every backend.
 *
 * A model is a list of layers in execution (topological) order over one input
 * of shape [C,H,W] (per sample). Each layer reads the output of the layer
 * before it unless it names its input(s) by index (in[]; SF_IN_MODEL is the
 * model input): that is how residual connections are written (an `add` layer
 * takes two inputs of the same shape). A tensor may feed several consumers.
 * The description is plain data: it is parsed from a preset name or a JSON
 * layer list, validated and resolved (every layer's input/output shape and its
 * parameters' offsets in one flat float buffer) once, on the host, and then
 * handed to a backend, which allocates and runs it.
 *
 * Parameters live in one flat float32 buffer; for each layer with weights the
 * weight comes first, then the bias, each contiguous in PyTorch's own layout
 * (conv2d: [out_c, in_c/groups, k, k]; conv_transpose2d: [in_c, out_c, k, k];
 * linear: [out, in]; batchnorm2d: weight = gamma [C], bias = beta [C];
 * layer_scale: its one parameter [C,1,1] in the weight's place), so a
 * state_dict tensor maps to a slice of the buffer with no transposition.
 * Every kind's fields, shapes, parameters and buffers are its row in the
 * registry (gpu/layers.h, docs/LAYERS.md).
 *
 * A tensor per sample is a [C,H,W] map (channel-major, as NCHW), a feature
 * vector [F] (flat), or a token sequence [T, C] (tokens: token-major, as
 * PyTorch's [N, T, C], so that a linear layer or a layer norm over C is one
 * over the rows of an [N*T, C] matrix). to_tokens makes one from a map;
 * select_token ends one in a feature vector.
 *
 * Buffers (state that is not trained: batchnorm2d's running_mean and
 * running_var, [C] each, in that order per layer) live in a second flat float
 * buffer of n_buffers floats (rm_off/rv_off). num_batches_tracked is one
 * counter for the whole model, kept by the backend (every batchnorm layer that
 * runs in training mode sees every training batch, so they are all equal).
 *
 * Freezing: m->freeze names a layer-name prefix; the layers whose names start
 * with it must be the first n_frozen layers of the list. They run without
 * gradients (batchnorm in eval mode) and have no gradient or optimizer state;
 * their parameters are [0, train_off) of the flat buffer.
 *
 * A model is a classifier (last output [classes], labels [N]) or a
 * segmentation model (last output [classes,H,W] with H*W > 1, labels
 * [N,H,W] = [N, out_h, out_w], per-pixel cross-entropy, pixel accuracy).
 *
 * Pure C, no CUDA, no HTTP. Thread-safety: functions are reentrant; a resolved
 * sf_model is immutable and may be read from any thread.
 */
#ifndef SF_GPU_MODEL_H
#define SF_GPU_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define SF_MAX_LAYERS 512 /* resnet18 needs 69; torchvision's densenet121 about 430 */
#define SF_MAX_IN 64      /* inputs of one layer (concat) */
#define SF_IN_MODEL (-1)  /* in[] value: the model input */
#define SF_LAYER_NAME_MAX 64 /* with its NUL; torchvision's longest layer names (regnet) reach 50 */
#define SF_PARAM_SLOTS 8  /* parameters of one layer (self_attention with separate q, k, v has eight) */
#define SF_PARAM_SUFFIX_MAX 24 /* with its NUL: a renamed parameter's state_dict suffix ("qkv.weight"); a
                                * key, name.suffix, then fits SF_PARAM_KEY_MAX */
#define SF_PARAM_KEY_MAX (SF_LAYER_NAME_MAX + SF_PARAM_SUFFIX_MAX) /* with its NUL: "<layer>.<suffix>" */
/* param_names' value for a parameter keyed by the layer's name alone (JSON ""; "." is no suffix otherwise). */
#define SF_PARAM_BARE "."

typedef enum sf_layer_kind {
    SF_L_CONV2D = 0,   /* in_c -> out_c, kernel k, stride, pad, optional bias */
    SF_L_RELU,
    SF_L_FLATTEN,      /* [C,H,W] -> [C*H*W] (a view, no data movement) */
    SF_L_LINEAR,       /* in_c -> out_c features, optional bias */
    /* Kinds beyond the convolution chain (transposed convolutions, batchnorm,
     * pooling, residual adds); both backends run every kind. */
    SF_L_CONV_TRANSPOSE2D, /* in_c -> out_c, kernel k, stride, pad, optional bias */
    SF_L_BATCHNORM2D,  /* per-channel; weight (gamma) and bias (beta) always present */
    SF_L_MAXPOOL2D,    /* kernel k, stride, pad */
    SF_L_GLOBAL_AVGPOOL, /* [C,H,W] -> [C,1,1] (AdaptiveAvgPool2d(1)) */
    SF_L_ADD,          /* two inputs of the same shape -> their sum */
    SF_L_RELU6,
    SF_L_SIGMOID,
    SF_L_SILU,
    SF_L_HARDSWISH,
    SF_L_HARDSIGMOID,
    SF_L_GELU,         /* erf, or the tanh approximation */
    SF_L_TANH,
    SF_L_LEAKY_RELU,   /* x > 0 ? x : negative_slope * x */
    SF_L_ELU,          /* x > 0 ? x : alpha * (exp(x) - 1) */
    SF_L_SELU,         /* scale * elu(x) at PyTorch's fixed alpha and scale */
    SF_L_SOFTPLUS,     /* log1p(exp(beta * x)) / beta; x where beta * x > threshold */
    SF_L_MISH,         /* x * tanh(softplus(x)) */
    SF_L_MUL,          /* a * b, b of a's shape or [C,1,1] (broadcast over H,W) */
    SF_L_LAYER_SCALE,  /* x * p, p a parameter [C,1,1] */
    SF_L_AVGPOOL2D,    /* kernel k, stride, pad, ceil_mode, count_include_pad */
    SF_L_ADAPTIVE_AVGPOOL2D, /* [C,H,W] -> [C,h,w] (PyTorch's bins) */
    SF_L_LAYERNORM2D,  /* LayerNorm over the channels of each pixel */
    SF_L_LAYERNORM,    /* LayerNorm over the features of a flat tensor */
    SF_L_CONCAT,       /* 2..SF_MAX_IN inputs of equal H,W -> along channels */
    SF_L_DROPOUT,      /* training: elementwise keep/drop and 1/(1-p); eval: identity */
    SF_L_STOCHASTIC_DEPTH, /* training: per-sample keep/drop ("row"); eval: identity */
    /* Token sequences [T, C] per sample (Vision Transformers). */
    SF_L_TO_TOKENS,    /* [C,H,W] -> [H*W, C] tokens */
    SF_L_CLASS_TOKEN,  /* [T, C] -> [T+1, C]: a parameter [1,1,C] in front */
    SF_L_POS_EMBEDDING, /* [T, C] + a parameter [1,T,C] */
    SF_L_SELF_ATTENTION, /* multi-head self-attention over [T, C] (nn.MultiheadAttention) */
    SF_L_SELECT_TOKEN, /* [T, C] -> [C]: token 0 */
    /* Channel moves of a map (ShuffleNetV2). */
    SF_L_CHANNEL_SHUFFLE, /* output channel j*groups + i is input channel i*(C/groups) + j */
    SF_L_CHANNEL_SLICE, /* channels [start, start + count) of a map */
    SF_L_DROPOUT2D, /* training: per-(sample, channel) keep/drop (nn.Dropout2d); eval: identity */
    SF_L_LOG_SOFTMAX, /* F.log_softmax over the features of a flat [F] tensor */
    SF_L_GROUPNORM, /* nn.GroupNorm: per sample and group of channels; weight, bias [C] unless affine 0 */
    SF_L_UPSAMPLE, /* upsampling (or resizing) of a map, nearest or bilinear */
    SF_L_PIXEL_SHUFFLE, /* [C*r*r, H, W] -> [C, H*r, W*r] (nn.PixelShuffle) */
    SF_L_PIXEL_UNSHUFFLE, /* [C, H*r, W*r] -> [C*r*r, H, W] (nn.PixelUnshuffle), its inverse */
    SF_L_AFFINE,   /* x * scale + shift elementwise (two numbers, no parameters) */
    SF_L_PRELU,    /* x > 0 ? x : a * x, a a parameter [num_parameters]: one slope, or one per channel */
    SF_L_PAD,      /* F.pad of a map's width and height: constant, reflect, replicate or circular */
    SF_L_CLAMP,    /* min(max(x, min), max) elementwise, either bound optional (torch.clamp, nn.Hardtanh) */
    SF_L_TOKEN_MEAN, /* [T, C] -> [C]: the mean of tokens start..T-1 (x[:, start:].mean(dim=1)) */
    SF_L_TRANSPOSE_TOKENS, /* [T, C] -> [C, T]: x.transpose(1, 2) of a token sequence (MLP-Mixer's token mixing) */
    SF_L_SCALE_SHIFT, /* x * weight + bias, learnable: one of each, or one per channel (timm's LearnableAffineBlock) */
    SF_L_CHANNEL_CONV1D, /* nn.Conv1d(1, 1, k) across the channels of a [C,1,1] map or [F] features (ECA) */
    SF_L_SQUARE,   /* x * x (torch.square, x ** 2: timm's StarReLU and SquaredReLU) */
    SF_L_TO_MAP,   /* [h*w, C] tokens -> [C, h, w]: to_tokens' inverse (CAFormer's attention on a map) */
    SF_L_GRN,      /* Global Response Normalization of a map (ConvNeXt V2); weight, bias [C] */
    /* Every kind's row (fields, shapes, parameters, hooks) is in gpu/layers.c. */
    SF_L_KIND_COUNT
} sf_layer_kind;

/* scale_shift's parameter shapes (its "param_shape" field, in this order). */
enum { SF_SS_C = 0, SF_SS_C11 = 1, SF_SS_11C = 2, SF_SS_1C11 = 3 };

typedef struct sf_layer {
    sf_layer_kind kind;
    char name[SF_LAYER_NAME_MAX]; /* state_dict prefix: "0", "2", ... for Sequential presets */
    /* Per parameter slot, the state_dict suffix in place of the kind's own where
     * the module holding the parameters names them otherwise ("param_names":
     * timm's Attention holds nn.MultiheadAttention's in_proj_weight as
     * qkv.weight); "" keeps the kind's. */
    char param_names[SF_PARAM_SLOTS][SF_PARAM_SUFFIX_MAX];
    int in_c, out_c;              /* channels (conv) or features (linear) */
    int k, stride, pad;           /* conv, pools: kernel, stride, padding (conv2d: along the height) */
    int dilation;                 /* conv2d: spacing of the kernel's taps along the height (1: plain) */
    int kw, stride_w, pad_w;      /* conv2d: the same four along the width, in the same order (a 1x7 */
    int dilation_w;               /* kernel is k 1, kw 7); set to the height's values when kw is 0, so code
                                   * that builds a square layer field by field leaves them 0 */
    int bias;                     /* 1 when the layer has a bias */
    int groups;                   /* conv2d (1 = a plain convolution); channel_shuffle */
    int ceil_mode;                /* maxpool2d, avgpool2d: output size rounded up */
    int count_include_pad;        /* avgpool2d: padding counts in the divisor */
    int out_size[2];              /* adaptive_avgpool2d, upsample: output [h, w] (upsample: 0 0 when
                                   * given by scale) */
    int approximate;              /* gelu: 0 erf, 1 tanh */
    float negative_slope;         /* leaky_relu: the slope below 0 (any finite value, as PyTorch) */
    float alpha;                  /* elu: the negative branch's scale (any finite value) */
    float beta, threshold;        /* softplus: the input's scale (not 0), the linear branch's bound */
    float affine_scale, affine_shift; /* affine: y = affine_scale * x + affine_shift (any finite values) */
    int num_parameters;           /* prelu, scale_shift: 1 (shared by every channel) or the input's channels */
    int pads[4];                  /* pad: [left, right, top, bottom], F.pad's order for the last two dims */
    float pad_value;              /* pad: the constant mode's fill (any finite value) */
    float clamp_min, clamp_max;   /* clamp: the bounds, finite, min <= max; -inf / +inf where a side is open-ended */
    int clamp_grad;               /* clamp: whose gradient, SF_CLAMP_GRAD_CLAMP or SF_CLAMP_GRAD_HARDTANH */
    int over_channels;            /* linear: applied per pixel over the channels of a map */
    float eps, momentum;          /* batchnorm2d, layernorm2d, layernorm */
    int affine;                   /* groupnorm: 1 with a weight and a bias (nn.GroupNorm's affine), 0 without */
    int vector;                   /* layer_scale: its parameter held as [C] (timm's LayerScale, ConvNeXt's original
                                   * gamma), not [C,1,1]; always so on a token sequence */
    float p;                      /* dropout, stochastic_depth: drop probability */
    int mode;                     /* stochastic_depth: 0 "row" (the one mode run); upsample: SF_UP_*;
                                   * pad: SF_PAD_*; scale_shift: SF_SS_* */
    int align_corners;            /* upsample (bilinear): the corner pixels' centres align, as PyTorch's flag */
    int heads;                    /* self_attention: number of heads (divides the embedding dimension) */
    int out_bias;                 /* self_attention: 1 when the output projection has a bias (bias: the
                                   * input projection's) */
    int qkv_split;                /* self_attention: q, k and v projections as three parameters each
                                   * (separate_qkv; sf_attn_slot) */
    int start, count;             /* channel_slice: the channels [start, start + count) of its input;
                                   * token_mean: the first token averaged */
    int scale;                    /* upsample: each input pixel becomes scale x scale output pixels (0: by size);
                                   * pixel_shuffle, pixel_unshuffle: the factor r */
    int n_in;                     /* inputs named explicitly (0: the previous layer; add: 2) */
    int in[SF_MAX_IN];            /* input layer indices (< this index) or SF_IN_MODEL */
    int init;                     /* SF_INIT_*: weight initialisation */
    /* Filled by sf_model_resolve: */
    int in_h, in_w, out_h, out_w; /* spatial sizes; 1x1 for flattened tensors */
    int out_ch;                   /* channels/features of the output */
    size_t w_off, b_off;          /* offsets (floats) into the flat parameter buffer */
    size_t n_w, n_b;              /* element counts; 0 where absent */
    /* Every parameter slot of the layer (slot 0 is the weight, slot 1 the
     * bias, as above; self_attention has up to eight: sf_attn_slot), contiguous
     * in slot order. */
    size_t p_off[SF_PARAM_SLOTS], p_n[SF_PARAM_SLOTS];
    size_t out_elems;             /* elements of the output per sample */
    size_t rm_off, rv_off;        /* batchnorm2d: running_mean/var offsets in the buffers */
    int flat;                     /* 1: the output is a feature vector (flatten, linear) */
    int tokens;                   /* 1: the output is a token sequence [T, C] (out_ch = C, out_h = T, out_w = 1),
                                   * token-major: the C values of a token are contiguous */
    int frozen;                   /* 1: runs without gradients (model.freeze) */
} sf_layer;

/* A pad layer's mode (F.pad's): a constant fill, the mirror image without
 * the edge (reflect), the edge repeated (replicate), or the opposite side
 * (circular). */
enum { SF_PAD_CONSTANT = 0, SF_PAD_REFLECT, SF_PAD_REPLICATE, SF_PAD_CIRCULAR };
#define SF_MAX_PAD 1024 /* a pad layer's pad on one side */

/* A clamp layer's gradient rule, named for the PyTorch op whose backward it
 * is. Both pass dy only strictly between the bounds (none at a bound: torch
 * 2.15's clamp_backward, clamp_min's self > min and clamp_max's self < max
 * test strictly, as hardtanh_backward does); they differ at a NaN input,
 * where torch.clamp/clip/clamp_min/clamp_max pass nothing and
 * nn.Hardtanh/F.hardtanh (and relu6) pass dy (hardtanh_backward zeroes only
 * where x <= min or x >= max). An open-ended side tests nothing.
 * SF_CLAMP_GRAD_CLAMP_CLOSED is torch.clamp's backward in the PyTorch
 * releases before that (2.11 among them): dy where min <= x <= max, at a
 * bound too, none at a NaN; the exporter writes the rule of the torch that
 * exports (client/python/streamfeed/export_folds.py). */
enum { SF_CLAMP_GRAD_CLAMP = 0, SF_CLAMP_GRAD_HARDTANH, SF_CLAMP_GRAD_CLAMP_CLOSED };

/* Weight initialisation of conv2d (and conv_transpose2d, linear). */
enum { SF_INIT_DEFAULT = 0,       /* PyTorch's default (kaiming_uniform_(a=sqrt(5))) */
       SF_INIT_KAIMING_FAN_OUT }; /* torchvision ResNet: kaiming_normal_(fan_out, relu), no bias */

#define SF_BN_EPS 1e-5f
#define SF_BN_MOMENTUM 0.1f

typedef struct sf_model {
    char preset[32];     /* preset name, or "custom" */
    int in_c, in_h, in_w; /* input per sample, NCHW */
    int n_classes;       /* logits of the last layer */
    int n_layers;
    sf_layer layers[SF_MAX_LAYERS];
    /* Filled by sf_model_resolve: */
    size_t n_params;     /* total floats of the flat parameter buffer */
    size_t max_act;      /* largest per-sample activation (floats) of any layer */
    size_t n_buffers;    /* floats of the flat buffer area (running stats) */
    int n_bn;            /* batchnorm2d layers */
    int segmentation;    /* 1: last output is [classes,H,W], labels [N,H,W] */
    int out_h, out_w;    /* spatial size of the last output (labels of a segmentation model) */
    char freeze[SF_LAYER_NAME_MAX]; /* layer-name prefix of the frozen layers; "" none */
    int n_frozen;        /* the first n_frozen layers are frozen */
    size_t train_off;    /* first trainable parameter; [train_off, n_params) trains */
} sf_model;

/* Fills *m from a preset name: "seed-classifier" (W1 of shared/WORKLOADS.md,
 * 256x256x3 input), "seed-encdec" (W2: a segmentation model, 256x256x3 input,
 * layers named as the fields of `class EncDec(nn.Module)` with two
 * nn.Sequential members: "encoder.0".."encoder.9", "decoder.0".."decoder.8";
 * model.freeze=encoder freezes the encoder), "resnet18" (W3: torchvision's
 * resnet18(num_classes=10), 224x224x3 input, torchvision's state_dict names)
 * or "tiny" (32x32x3 input, few channels, for CPU tests and the CPU demo).
 * Resolves it. Returns 0, or -1 with a message in err. */
int sf_model_from_preset(const char *name, sf_model *m, char *err, size_t errlen);

/* Fills *m from a JSON object:
 *   {"input":[C,H,W], "classes":K, "layers":[{"type":"conv2d","out":16,"k":1,
 *    "stride":1,"pad":0,"bias":true}, {"type":"relu"}, {"type":"flatten"},
 *    {"type":"linear","out":10}]}
 * in_c of each layer is inferred from the previous one. Resolves it.
 * Invalid specs (unknown layer, zero channels, a shape that does not fit, the
 * last layer's width != classes) fail naming the offending layer index and type. */
int sf_model_from_json(const char *json, sf_model *m, char *err, size_t errlen);

/* Sets m->freeze to prefix ("" or NULL: nothing frozen) and resolves again;
 * fails when the matching layers are not a leading run of the list, when none
 * matches, or when nothing would be left to train. */
int sf_model_set_freeze(sf_model *m, const char *prefix, char *err, size_t errlen);

/* Computes shapes, parameter offsets and sizes. Called by both constructors;
 * exposed for models built field by field in tests. */
int sf_model_resolve(sf_model *m, char *err, size_t errlen);

/* Initialises params (n_params floats) as PyTorch's default initialisation does
 * for Conv2d and Linear (kaiming_uniform_(a=sqrt(5)) for weights, i.e.
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for biases), drawing
 * from the counter-based generator of gpu/rng.h keyed by seed. Deterministic.
 * SF_INIT_KAIMING_FAN_OUT layers draw N(0, 2/(out_c*k*k)) instead; batchnorm2d
 * has weight 1, bias 0. conv_transpose2d's fan_in is out_c*k*k (PyTorch
 * computes it from weight.size(1)). */
void sf_model_init_params(const sf_model *m, uint64_t seed, float *params);

/* Initialises the buffers (n_buffers floats): running_mean 0, running_var 1. */
void sf_model_init_buffers(const sf_model *m, float *buffers);

/* The input layer index of input j of layer i (SF_IN_MODEL: the model input). */
int sf_layer_input(const sf_model *m, int i, int j);

/* Short human-readable name of a layer kind ("conv2d", ...). */
const char *sf_layer_kind_name(sf_layer_kind k);

#endif
