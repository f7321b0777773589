/* gpu/ref/layer_io.h — what the reference backend hands a layer kind's
 * forward and backward hooks (the ref_fwd/ref_bwd of its row in
 * gpu/layers.c), and the hooks of every kind.
 *
 * The backend (gpu/ref/backend_ref.c) owns every buffer; a hook reads its
 * inputs and writes its output (forward) or its weight gradients and input
 * gradients (backward), float32 throughout. bf16 emulation stays in the
 * backend: it rounds every output after the forward hook, hands the hook the
 * bf16-rounded weight when the row says bf16_weights, and rounds each input
 * gradient in give() before adding it to its producer's.
 */
#ifndef SF_GPU_REF_LAYER_IO_H
#define SF_GPU_REF_LAYER_IO_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/layers.h"
#include "gpu/model.h"

typedef struct sf_ref_io {
    const sf_model *m;
    const sf_layer *L;
    int li;                  /* layer index */
    int n;                   /* samples */
    int train;               /* training-mode forward: batch statistics, dropout draws */
    int bf16;                /* model.precision=bf16 (for kinds whose arithmetic depends on it) */
    uint64_t seed, seq;      /* the keys of dropout draws: the run's seed and the batch's sequence */
    const float *x[SF_MAX_IN]; /* the inputs, [n, in elems] each */
    float *y;                /* the output, [n, out_elems] */
    const float *w;          /* slot-0 parameter as computed with (bf16 copy when the row says so) */
    const float *b;          /* slot-1 parameter (fp32), or NULL */
    const float *p[SF_PARAM_SLOTS]; /* every parameter slot (fp32), NULL where absent */
    float *rm, *rv;          /* running statistics (batchnorm2d), else NULL */
    float *save;             /* the row's ref_save floats, else NULL */
    /* backward */
    const float *dy;         /* [n, out_elems], complete */
    float *dw, *db;          /* weight/bias gradients to write (not accumulate), NULL when absent */
    float *dp[SF_PARAM_SLOTS]; /* every slot's gradient to write (dp[0] is dw, dp[1] db), NULL when absent */
    unsigned char want[SF_MAX_IN]; /* input j needs its gradient */
    float *scratch;          /* [n * max_act] floats for an input gradient */
    /* Adds g ([n, elems of input j]) into input j's gradient, rounding it to
     * bf16 in place first under precision=bf16. Does nothing when input j
     * needs no gradient. g may be scratch, or dy itself. */
    void (*give)(const struct sf_ref_io *io, int j, float *g);
    /* distributed.batchnorm sync, in a data-parallel round's training step:
     * sums the count doubles of buf over the job's ranks in place (0, or -1
     * when the collective failed; the backend keeps the reason and abandons
     * the step). NULL otherwise. sums: room for 2 * channels + 1 doubles. */
    int (*allreduce)(const struct sf_ref_io *io, double *buf, size_t count);
    double *sums;
    void *ctx;               /* the backend's */
} sf_ref_io;

/* Elements per sample of input j of io's layer. */
size_t sf_ref_in_elems(const sf_ref_io *io, int j);

/* The hooks, by op family (the file that holds them). */
/* conv.c */
void sf_ref_layer_conv2d_fwd(const sf_ref_io *io);
void sf_ref_layer_conv2d_bwd(const sf_ref_io *io);
/* conv_transpose.c */
void sf_ref_layer_convt2d_fwd(const sf_ref_io *io);
void sf_ref_layer_convt2d_bwd(const sf_ref_io *io);
/* linear.c */
void sf_ref_layer_linear_fwd(const sf_ref_io *io);
void sf_ref_layer_linear_bwd(const sf_ref_io *io);
/* batchnorm.c */
void sf_ref_layer_bn2d_fwd(const sf_ref_io *io);
void sf_ref_layer_bn2d_bwd(const sf_ref_io *io);
size_t sf_ref_layer_bn2d_save(const sf_layer *L, size_t nb);
/* pool.c */
void sf_ref_layer_maxpool2d_fwd(const sf_ref_io *io);
void sf_ref_layer_maxpool2d_bwd(const sf_ref_io *io);
size_t sf_ref_layer_maxpool2d_save(const sf_layer *L, size_t nb);
void sf_ref_layer_gap_fwd(const sf_ref_io *io);
void sf_ref_layer_gap_bwd(const sf_ref_io *io);
/* pointwise.c */
void sf_ref_layer_relu_fwd(const sf_ref_io *io);
void sf_ref_layer_relu_bwd(const sf_ref_io *io);
void sf_ref_layer_add_fwd(const sf_ref_io *io);
void sf_ref_layer_add_bwd(const sf_ref_io *io);

/* conv_grouped.c is reached through the conv2d hooks (groups or dilation > 1). */
/* activation.c: relu6, sigmoid, silu, hardswish, hardsigmoid, gelu */
void sf_ref_layer_act_fwd(const sf_ref_io *io);
void sf_ref_layer_act_bwd(const sf_ref_io *io);
/* prelu.c */
void sf_ref_layer_prelu_fwd(const sf_ref_io *io);
void sf_ref_layer_prelu_bwd(const sf_ref_io *io);
/* grn.c */
void sf_ref_layer_grn_fwd(const sf_ref_io *io);
void sf_ref_layer_grn_bwd(const sf_ref_io *io);
/* channel_conv1d.c */
void sf_ref_layer_channel_conv1d_fwd(const sf_ref_io *io);
void sf_ref_layer_channel_conv1d_bwd(const sf_ref_io *io);
/* mul.c */
void sf_ref_layer_mul_fwd(const sf_ref_io *io);
void sf_ref_layer_mul_bwd(const sf_ref_io *io);
void sf_ref_layer_layer_scale_fwd(const sf_ref_io *io);
void sf_ref_layer_layer_scale_bwd(const sf_ref_io *io);
void sf_ref_layer_scale_shift_fwd(const sf_ref_io *io);
void sf_ref_layer_scale_shift_bwd(const sf_ref_io *io);
/* avgpool.c */
void sf_ref_layer_avgpool2d_fwd(const sf_ref_io *io);
void sf_ref_layer_avgpool2d_bwd(const sf_ref_io *io);
void sf_ref_layer_adaptive_avgpool2d_fwd(const sf_ref_io *io);
void sf_ref_layer_adaptive_avgpool2d_bwd(const sf_ref_io *io);
/* norm.c: layernorm2d, layernorm */
void sf_ref_layer_layernorm_fwd(const sf_ref_io *io);
void sf_ref_layer_layernorm_bwd(const sf_ref_io *io);
/* concat.c */
void sf_ref_layer_concat_fwd(const sf_ref_io *io);
void sf_ref_layer_concat_bwd(const sf_ref_io *io);
/* dropout.c: dropout, stochastic_depth */
void sf_ref_layer_dropout_fwd(const sf_ref_io *io);
void sf_ref_layer_dropout_bwd(const sf_ref_io *io);
/* tokens.c: to_tokens, class_token, pos_embedding, select_token */
void sf_ref_layer_to_tokens_fwd(const sf_ref_io *io);
void sf_ref_layer_to_tokens_bwd(const sf_ref_io *io);
void sf_ref_layer_to_map_fwd(const sf_ref_io *io);
void sf_ref_layer_to_map_bwd(const sf_ref_io *io);
void sf_ref_layer_class_token_fwd(const sf_ref_io *io);
void sf_ref_layer_class_token_bwd(const sf_ref_io *io);
void sf_ref_layer_pos_embedding_fwd(const sf_ref_io *io);
void sf_ref_layer_pos_embedding_bwd(const sf_ref_io *io);
void sf_ref_layer_select_token_fwd(const sf_ref_io *io);
void sf_ref_layer_select_token_bwd(const sf_ref_io *io);
void sf_ref_layer_token_mean_fwd(const sf_ref_io *io);
void sf_ref_layer_transpose_tokens_fwd(const sf_ref_io *io);
void sf_ref_layer_transpose_tokens_bwd(const sf_ref_io *io);
void sf_ref_layer_token_mean_bwd(const sf_ref_io *io);
/* attention.c: self_attention */
void sf_ref_layer_attention_fwd(const sf_ref_io *io);
void sf_ref_layer_attention_bwd(const sf_ref_io *io);
size_t sf_ref_layer_attention_save(const sf_layer *L, size_t nb);
/* upsample.c: upsample */
void sf_ref_layer_upsample_fwd(const sf_ref_io *io);
void sf_ref_layer_upsample_bwd(const sf_ref_io *io);
/* groupnorm.c: groupnorm */
void sf_ref_layer_groupnorm_fwd(const sf_ref_io *io);
void sf_ref_layer_groupnorm_bwd(const sf_ref_io *io);
/* log_softmax.c: log_softmax */
void sf_ref_layer_log_softmax_fwd(const sf_ref_io *io);
void sf_ref_layer_log_softmax_bwd(const sf_ref_io *io);
/* channels.c: channel_shuffle, channel_slice, pixel_shuffle, pixel_unshuffle */
void sf_ref_layer_channel_shuffle_fwd(const sf_ref_io *io);
void sf_ref_layer_channel_shuffle_bwd(const sf_ref_io *io);
void sf_ref_layer_channel_slice_fwd(const sf_ref_io *io);
void sf_ref_layer_channel_slice_bwd(const sf_ref_io *io);
void sf_ref_layer_pixel_shuffle_fwd(const sf_ref_io *io);
void sf_ref_layer_pixel_shuffle_bwd(const sf_ref_io *io);
void sf_ref_layer_pixel_unshuffle_fwd(const sf_ref_io *io);
void sf_ref_layer_pixel_unshuffle_bwd(const sf_ref_io *io);
/* pad.c */
void sf_ref_layer_pad_fwd(const sf_ref_io *io);
void sf_ref_layer_pad_bwd(const sf_ref_io *io);

#endif
