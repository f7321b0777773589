/* gpu/ref/backend_ref.c — the CPU reference backend (sf_backend_i over gpu/ref).
 *
 * Synchronous: submit() runs augmentation, forward, loss, backward and the SGD
 * update at once on the calling (engine) thread, then queues the batch's
 * SLOT_FREE and STEP_DONE events, which poll() hands out. Every buffer is
 * allocated by build() for cfg->max_batch; a step allocates nothing.
 *
 * The model is a layer graph in topological order (gpu/model.h): every layer
 * but flatten (a view) owns its output buffer, and every trainable layer owns
 * a gradient buffer for its output. The backward walks the layers in reverse,
 * each one computing its input gradient into a scratch buffer and adding it to
 * its producer's gradient buffer, so a tensor feeding two consumers (a
 * residual block's input) receives the sum of both.
 *
 * Training mode: batchnorm2d normalises with the batch statistics and updates
 * the running statistics (momentum 0.1, eps 1e-5, as PyTorch), and the one
 * num_batches_tracked counter advances per training batch. Frozen layers
 * (model.freeze) run in eval mode (batchnorm uses the running statistics)
 * without gradients: no gradient buffers, no weight gradients, no optimizer
 * state for parameters [0, train_off).
 *
 * Loss: cross-entropy per sample for a classifier; per pixel (labels
 * [N,out_h,out_w], mean over pixels) for a segmentation model, whose
 * `correct` counts pixels (n_labels = N*H*W).
 *
 * Loss options (sf_batch): label smoothing and mixup/cutmix soft targets,
 * torch.nn.CrossEntropyLoss semantics (sf_ref_xent_soft); a segmentation
 * model takes smoothing, never mixing. Top-5 hits in torch.sort's stable
 * descending order.
 *
 * Evaluation batches (b->eval): the forward in eval mode, loss and hits; no
 * backward, no update of anything (running statistics and num_batches_tracked
 * included). Logits go to b->logits_out when it is set, for any batch.
 *
 * The optimizer step: the pre-clip L2 norm of the gradient about to be applied
 * (after accumulation), then, when the norm or a loss of the step is NaN/Inf,
 * a skipped step (parameters, optimizer state, step count unchanged; an
 * accumulated gradient dropped), else clip_grad_norm_ scaling and the update.
 *
 * Optimizer: SGD (momentum, weight decay; PyTorch semantics) or AdamW
 * (torch.optim.AdamW). With grad_accum_steps k > 1 the batch gradients are
 * averaged over k batches and the optimizer steps on every k-th; the step
 * count counts optimizer steps.
 *
 * Precision (model.precision): fp32 and tf32 are both computed in plain fp32
 * here (the reference does not emulate TF32's 10-bit mantissa; a CUDA tf32
 * run is compared with it under a tolerance). bf16 emulates what the CUDA
 * backend does, PyTorch autocast's semantics, by rounding to bf16 (round to
 * nearest even, sf_bf16_round) at the points where that backend stores bf16;
 * all arithmetic stays fp32, so the result is as if every kernel accumulated
 * in fp32 and rounded each output once:
 *   - master weights, their gradients and the optimizer state stay fp32;
 *   - the model input is rounded after augmentation (the transform writes
 *     bf16); every layer's output is rounded after the layer computed it in
 *     fp32 (bias included; flatten is a view);
 *   - conv2d, conv_transpose2d and linear read a bf16-rounded copy of their
 *     weights (c->wq, refreshed from the master weights by every forward);
 *     biases and batchnorm gamma/beta are read in fp32;
 *   - the loss is fp32 from the bf16 logits; the logits' gradient is rounded;
 *   - backward: a layer's output gradient is rounded once complete (after the
 *     sum of both branches at a residual fork), and every input gradient a
 *     layer produces is rounded before it is added to its producer's;
 *     conv2d/conv_transpose2d weight gradients are rounded to bf16 (cuDNN
 *     writes them in bf16) before accumulation and the optimizer; linear
 *     weight gradients, bias gradients and batchnorm gamma/beta gradients
 *     stay fp32 (computed from the bf16 tensors);
 *   - batchnorm statistics are fp32 from the bf16 input; running stats fp32.
 * Frozen layers run the same forward rounding; accumulated gradients are
 * summed in fp32. transform() (POST /v1/transform) answers the fp32
 * augmentation in every mode. The fp32 path executes no bf16 rounding at
 * all: every rounding is behind c->bf16.
 *
 * Checkpoints: get/set_opt_state are SGD's momentum buffer (zeros until a step
 * with momentum != 0) or AdamW's exp_avg, in sf_model layout with zeros for
 * frozen parameters, and the step count; get/set_opt_sq is AdamW's exp_avg_sq
 * in the same layout; get/set_buffers the running statistics and
 * num_batches_tracked. A partly accumulated gradient is not state: setting the
 * optimizer state discards it. bench runs submit's stages synchronously,
 * without events, and restores the whole training state. No device telemetry
 * (device_stats answers -1).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* clock_gettime, nanosleep (the Makefile defines it too) */
#endif
#include "gpu/batch_check.h"
#include "gpu/backend.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"
#include "gpu/layers.h"

#define REF_FIFO_CAP 4 /* events; max_inflight 1 needs 2 */

typedef struct ref_ctx {
    int built;
    sf_model m;
    sf_train_cfg cfg;
    uint64_t step;                /* optimizer steps */
    uint64_t nbt;                 /* num_batches_tracked of every batchnorm layer */
    int accum_count;              /* batches accumulated since the last optimizer step */
    int accum_nonfinite;          /* a batch of the current accumulation group had a non-finite loss */
    int accum_trained;            /* a batch of the current accumulation group trained a sample on some
                                     rank (a data-parallel round with none adds nothing) */
    char dist_err[160];           /* the failed gradient all-reduce ("" none): health reports it */
    int bf16;                     /* model.precision=bf16: activations rounded to bf16 (see the top) */
    size_t n_train;               /* trainable floats: n_params - train_off */

    float *params;                /* [n_params] */
    float *buffers;               /* [n_buffers] running statistics */
    float *grads;                 /* [n_train] this batch's gradient */
    float *gacc;                  /* [n_train] accumulated gradient (grad_accum_steps > 1), else NULL */
    float *mom;                   /* [n_train] SGD momentum / AdamW exp_avg */
    float *sq;                    /* [n_train] AdamW exp_avg_sq, else NULL */
    float *wq;                    /* bf16 only: [n_params], the conv/convT/linear weights rounded to
                                     bf16 (refreshed by every forward); other entries unused. Else NULL */
    float *input;                 /* [max_batch, in_c, in_h, in_w] augmented batch */
    float *act_buf[SF_MAX_LAYERS]; /* owned output buffers (all but flatten), else NULL */
    float *act[SF_MAX_LAYERS];    /* output of each layer (flatten aliases its input) */
    float *dact_buf[SF_MAX_LAYERS]; /* owned output gradients of trainable layers */
    float *dact[SF_MAX_LAYERS];   /* output gradient of each trainable layer (flatten aliases) */
    float *save[SF_MAX_LAYERS];   /* the row's ref_save floats (batch statistics, argmax), else NULL */
    double *bn_sums;              /* distributed.batchnorm sync: [2 * widest batchnorm + 1], else NULL */
    int bn_sync_round;            /* the step in progress normalises over every rank's samples */
    uint64_t seq;                 /* the sequence number of the batch in the step (dropout's key) */
    float *gtmp;                  /* input-gradient scratch, [max_batch * max_act] */
    float *aug_tmp;               /* one sample's geometric output (blur input) */
    size_t aug_tmp_len;           /* floats */
    uint8_t *decoded;             /* encoded batches: the decoded images, [decoded_cap] bytes */
    size_t decoded_cap;           /* 3 * cfg.jpeg_max_batch_pixels */
    int32_t *labels;              /* [max_batch] or [max_batch, out_h, out_w] */
    size_t labels_per_sample;     /* 1, or out_h*out_w for segmentation */
    /* Encoded batches with samples left out (sf_batch.skip_undecodable):
     * the kept samples' parameters and labels, in order. NULL without JPEG
     * batches. */
    sf_aug_sample *kept_samples;  /* [max_batch] */
    uint8_t *kept_labels;         /* [max_batch * labels_per_sample] labels of 8 bytes or fewer */

    sf_event fifo[REF_FIFO_CAP];
    int head, count;
} ref_ctx;



static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static ref_ctx *ctx_of(sf_backend *be) { return (ref_ctx *)be->ctx; }

/* ---- memory ------------------------------------------------------------- */

static const char *ref_name(sf_backend *be) { return "ref"; }

static void *ref_host_alloc(sf_backend *be, size_t bytes)
{
    size_t sz = (bytes + 63) & ~(size_t)63;
    if (sz < bytes)
        return NULL; /* overflow */
    return aligned_alloc(64, sz ? sz : 64);
}

static void ref_host_free(sf_backend *be, void *p) { free(p); }

static void free_state(ref_ctx *c)
{
    free(c->params);
    free(c->buffers);
    free(c->grads);
    free(c->gacc);
    free(c->mom);
    free(c->sq);
    free(c->wq);
    free(c->input);
    for (int i = 0; i < SF_MAX_LAYERS; i++) {
        free(c->act_buf[i]);
        free(c->dact_buf[i]);
        free(c->save[i]);
    }
    free(c->gtmp);
    free(c->bn_sums);
    free(c->aug_tmp);
    free(c->decoded);
    free(c->labels);
    free(c->kept_samples);
    free(c->kept_labels);
    sf_event fifo_keep[REF_FIFO_CAP];
    memcpy(fifo_keep, c->fifo, sizeof fifo_keep);
    int head = c->head, count = c->count;
    memset(c, 0, sizeof *c);
    /* Events already queued still belong to the engine. */
    memcpy(c->fifo, fifo_keep, sizeof fifo_keep);
    c->head = head;
    c->count = count;
}

/* calloc of a * b floats with an overflow check; a zero size gives a
 * one-float block so that the pointer is never NULL on success. */
static float *alloc_floats(size_t a, size_t b)
{
    if (b != 0 && a > SIZE_MAX / sizeof(float) / b)
        return NULL;
    size_t n = a * b;
    return calloc(n ? n : 1, sizeof(float));
}

static int ref_build(sf_backend *be, const sf_model *m, const sf_train_cfg *cfg, char *err,
                     size_t errlen)
{
    ref_ctx *c = ctx_of(be);
    free_state(c);
    if (!m || !cfg) {
        sf_errf(err, errlen, "ref build: model or config missing");
        return -1;
    }
    if (cfg->max_batch < 1) {
        sf_errf(err, errlen, "ref build: max_batch %d must be >= 1", cfg->max_batch);
        return -1;
    }
    c->m = *m;
    char e2[200];
    if (sf_model_resolve(&c->m, e2, sizeof e2) != 0) {
        sf_errf(err, errlen, "ref build: %s", e2);
        memset(&c->m, 0, sizeof c->m);
        return -1;
    }
    c->cfg = *cfg;
    const size_t nb = (size_t)cfg->max_batch;
    const sf_model *mm = &c->m;
    const size_t in_elems = (size_t)mm->in_c * mm->in_h * mm->in_w;

    if (cfg->grad_accum_steps < 0 || (cfg->optim != SF_OPT_SGD && cfg->optim != SF_OPT_ADAMW)) {
        sf_errf(err, errlen, "ref build: grad_accum_steps %d or optimizer %d invalid", cfg->grad_accum_steps,
                (int)cfg->optim);
        memset(&c->m, 0, sizeof c->m);
        return -1;
    }
    c->n_train = mm->n_params - mm->train_off;
    c->labels_per_sample = mm->segmentation ? (size_t)mm->out_h * mm->out_w : 1;
    c->params = alloc_floats(mm->n_params, 1);
    c->buffers = alloc_floats(mm->n_buffers, 1);
    c->grads = alloc_floats(c->n_train + 1, 1); /* + the samples trained, all-reduced with them */
    c->gacc = cfg->grad_accum_steps > 1 ? alloc_floats(c->n_train, 1) : NULL;
    c->mom = alloc_floats(c->n_train, 1);
    c->sq = cfg->optim == SF_OPT_ADAMW ? alloc_floats(c->n_train, 1) : NULL;
    c->bf16 = cfg->precision == SF_PREC_BF16;
    c->wq = c->bf16 ? alloc_floats(mm->n_params, 1) : NULL;
    c->input = alloc_floats(nb, in_elems);
    c->gtmp = alloc_floats(nb, mm->max_act);
    if (cfg->dist && cfg->dist->world > 1 && cfg->dist->bn_sync) {
        int widest = 0;
        for (int i = 0; i < mm->n_layers; i++)
            if (sf_layer_info(mm->layers[i].kind)->buffers && mm->layers[i].out_ch > widest)
                widest = mm->layers[i].out_ch;
        c->bn_sums = calloc(2 * (size_t)widest + 1, sizeof(double));
    }
    c->aug_tmp_len = in_elems; /* the geometric output has the model's input shape */
    c->aug_tmp = alloc_floats(in_elems, 1);
    c->labels = c->labels_per_sample <= SIZE_MAX / sizeof(int32_t) / nb
                    ? calloc(nb * c->labels_per_sample, sizeof(int32_t))
                    : NULL;
    /* Untouched pages of the decode buffer cost no memory until a batch needs them. */
    if (cfg->jpeg_max_batch_pixels > 0 && (uint64_t)cfg->jpeg_max_batch_pixels <= SIZE_MAX / 3) {
        c->decoded_cap = (size_t)cfg->jpeg_max_batch_pixels * 3;
        c->decoded = malloc(c->decoded_cap);
        c->kept_samples = calloc(nb, sizeof *c->kept_samples);
        c->kept_labels = c->labels_per_sample <= SIZE_MAX / sizeof(int64_t) / nb
                             ? calloc(nb * c->labels_per_sample, sizeof(int64_t))
                             : NULL;
    }
    int ok = c->params && c->buffers && c->grads && c->mom && c->input && c->gtmp && c->aug_tmp &&
             c->labels && (!cfg->dist || cfg->dist->world <= 1 || !cfg->dist->bn_sync || c->bn_sums) &&
             (cfg->jpeg_max_batch_pixels <= 0 || (c->decoded && c->kept_samples && c->kept_labels)) &&
             (cfg->grad_accum_steps <= 1 || c->gacc) && (cfg->optim != SF_OPT_ADAMW || c->sq) &&
             (!c->bf16 || c->wq);
    for (int i = 0; ok && i < mm->n_layers; i++) {
        const sf_layer *L = &mm->layers[i];
        const int src = sf_layer_input(mm, i, 0);
        if (sf_layer_info(L->kind)->view) {
            c->act[i] = src == SF_IN_MODEL ? c->input : c->act[src];
            c->dact[i] = src >= mm->n_frozen ? c->dact[src] : NULL;
        } else {
            c->act_buf[i] = alloc_floats(nb, L->out_elems);
            c->act[i] = c->act_buf[i];
            ok = c->act[i] != NULL;
            if (ok && !L->frozen) {
                c->dact_buf[i] = alloc_floats(nb, L->out_elems);
                c->dact[i] = c->dact_buf[i];
                ok = c->dact[i] != NULL;
            }
        }
        const sf_layer_kind_info *k = sf_layer_info(L->kind);
        if (ok && k->ref_save) {
            c->save[i] = alloc_floats(k->ref_save(L, nb), 1); /* int32 state fits a float's room */
            ok = c->save[i] != NULL;
        }
    }
    if (!ok) {
        free_state(c);
        sf_errf(err, errlen, "ref build: out of memory for %s (%zu params, batch %d)", m->preset,
                m->n_params, cfg->max_batch);
        return -1;
    }
    sf_model_init_params(mm, cfg->seed, c->params);
    sf_model_init_buffers(mm, c->buffers);
    c->step = 0;
    c->nbt = 0;
    c->accum_count = 0;
    c->accum_trained = 0;
    c->built = 1;
    return 0;
}

static int ref_max_inflight(sf_backend *be) { return 1; }

/* ---- the step ----------------------------------------------------------- */

static void push_event(ref_ctx *c, const sf_event *ev)
{
    /* Room is checked by submit before anything runs. */
    c->fifo[(c->head + c->count) % REF_FIFO_CAP] = *ev;
    c->count++;
}

/* The stages of sf_ref_augment, with preallocated scratch, then the batch's
 * mixing. */
static void augment(ref_ctx *c, const sf_batch *b, float *out)
{
    const sf_aug_plan *plan = b->plan;
    const size_t out_sz = (size_t)plan->c * plan->out_h * plan->out_w;
    for (int i = 0; i < b->n; i++) {
        float *d = out + out_sz * i;
        if (plan->blur_ksize > 1) {
            sf_ref_aug_geometry(plan, &b->samples[i], b->images + b->samples[i].src_off, b->nhwc, c->aug_tmp);
            sf_ref_aug_blur(plan, &b->samples[i], c->aug_tmp, d);
        } else {
            sf_ref_aug_geometry(plan, &b->samples[i], b->images + b->samples[i].src_off, b->nhwc, d);
        }
        sf_ref_aug_pointwise(plan, &b->samples[i], d);
        sf_ref_aug_post(plan, &b->samples[i], d);
    }
    sf_ref_aug_mix(plan, &b->mix, b->n, out);
}

static const float *in_act(ref_ctx *c, int i, int j)
{
    int src = sf_layer_input(&c->m, i, j);
    return src == SF_IN_MODEL ? c->input : c->act[src];
}

/* ---- bf16 emulation (model.precision=bf16; no-ops otherwise) ------------- */

/* Rounds len floats to bf16 in place when the model runs in bf16. */
static void to_bf16(const ref_ctx *c, float *p, size_t len)
{
    if (c->bf16)
        sf_bf16_round_n(p, len);
}

/* The model input of b: augmented in fp32, then stored as the transform
 * writes it (bf16 in bf16 mode). */
static void make_input(ref_ctx *c, const sf_batch *b)
{
    augment(c, b, c->input);
    to_bf16(c, c->input, (size_t)b->n * c->m.in_c * c->m.in_h * c->m.in_w);
}

/* The weights conv2d, conv_transpose2d and linear compute with: the fp32
 * master weights, or in bf16 mode their bf16-rounded copy in c->wq (refreshed
 * from the master weights by every forward; biases and batchnorm parameters
 * are read from the master weights in both modes). The row's bf16_weights
 * says which kinds compute so. */
static const float *weights_of(const ref_ctx *c, const sf_layer *L)
{
    const sf_layer_kind_info *k = sf_layer_info(L->kind);
    return (c->bf16 && k->bf16_weights ? c->wq : c->params) + L->w_off;
}

static void refresh_bf16_weights(ref_ctx *c)
{
    if (!c->bf16)
        return;
    for (int i = 0; i < c->m.n_layers; i++) {
        const sf_layer *L = &c->m.layers[i];
        if (!sf_layer_info(L->kind)->bf16_weights)
            continue;
        for (size_t e = 0; e < L->n_w; e++)
            c->wq[L->w_off + e] = sf_bf16_round(c->params[L->w_off + e]);
    }
}

/* sf_ref_io.allreduce under distributed.batchnorm sync: a batchnorm's
 * per-channel sums over the ranks (Gloo, f64). Every rank's step makes the
 * same calls in the same order (forward in layer order, backward in
 * reverse; an empty contribution through bn_sync_empty), so they pair. */
static int bn_allreduce(const sf_ref_io *io, double *buf, size_t count)
{
    ref_ctx *c = (ref_ctx *)io->ctx;
    if (c->dist_err[0])
        return -1; /* an earlier collective of this step failed: the communicator is gone */
    char err[sizeof c->dist_err];
    if (sf_coll_allreduce(c->cfg.dist->coll, buf, count, SF_COLL_F64, SF_COLL_SUM, err, sizeof err) != 0) {
        snprintf(c->dist_err, sizeof c->dist_err, "%s", err);
        return -1;
    }
    return 0;
}

/* The hooks' view of layer i (gpu/ref/layer_io.h): inputs, output, weights,
 * running statistics and saved state. */
static void io_of(ref_ctx *c, int i, int n, sf_ref_io *io)
{
    const sf_model *m = &c->m;
    const sf_layer *L = &m->layers[i];
    memset(io, 0, sizeof *io);
    io->m = m;
    io->L = L;
    io->li = i;
    io->n = n;
    io->bf16 = c->bf16;
    /* Each rank of a data-parallel job draws its own dropout masks: its
     * samples are others than the other ranks' at the same batch index. */
    io->seed = c->cfg.seed ^ (c->cfg.dist ? (uint64_t)c->cfg.dist->rank << 48 : 0);
    io->seq = c->seq;
    const int n_in = sf_layer_n_inputs(L);
    for (int j = 0; j < n_in; j++)
        io->x[j] = in_act(c, i, j);
    io->y = c->act[i];
    io->w = L->n_w ? weights_of(c, L) : NULL;
    io->b = L->n_b ? c->params + L->b_off : NULL;
    for (int j = 0; j < SF_PARAM_SLOTS; j++)
        io->p[j] = L->p_n[j] ? c->params + L->p_off[j] : NULL;
    io->rm = sf_layer_info(L->kind)->buffers ? c->buffers + L->rm_off : NULL;
    io->rv = io->rm ? c->buffers + L->rv_off : NULL;
    io->save = c->save[i];
    io->scratch = c->gtmp;
    if (c->bn_sync_round && sf_layer_info(L->kind)->buffers && !L->frozen) {
        io->allreduce = bn_allreduce;
        io->sums = c->bn_sums;
    }
    io->ctx = c;
}

/* Forward of the n samples in c->input. train: batchnorm of trainable layers
 * uses batch statistics and updates the running ones. */
static void forward(ref_ctx *c, int n, int train)
{
    const sf_model *m = &c->m;
    int bn_trained = 0;
    refresh_bf16_weights(c);
    sf_ref_io io;
    for (int i = 0; i < m->n_layers; i++) {
        const sf_layer *L = &m->layers[i];
        const sf_layer_kind_info *k = sf_layer_info(L->kind);
        if (k->view)
            continue; /* flatten: a view */
        io_of(c, i, n, &io);
        io.train = train;
        k->ref_fwd(&io);
        if (train && !L->frozen && k->buffers)
            bn_trained = 1;
        /* The output is stored in bf16 (computed in fp32, bias included). */
        to_bf16(c, c->act[i], (size_t)n * L->out_elems);
    }
    if (bn_trained)
        c->nbt++;
}

/* The gradient slice of a parameter at offset off (a trainable layer's). */
static float *grad_at(ref_ctx *c, size_t off) { return c->grads + (off - c->m.train_off); }

/* Adds len floats of src into the output gradient of layer src_layer, when
 * that layer is trainable (a frozen producer or the model input needs none). */
static void add_into(ref_ctx *c, int src_layer, const float *src, size_t len)
{
    if (src_layer < 0 || !c->dact[src_layer])
        return;
    float *d = c->dact[src_layer];
    for (size_t e = 0; e < len; e++)
        d[e] += src[e];
}

/* sf_ref_io.give: input j's gradient g, stored in bf16 under precision=bf16,
 * added into its producer's output gradient. */
static void give_grad(const sf_ref_io *io, int j, float *g)
{
    if (!io->want[j])
        return;
    ref_ctx *c = (ref_ctx *)io->ctx;
    const size_t len = (size_t)io->n * sf_ref_in_elems(io, j);
    to_bf16(c, g, len);
    add_into(c, sf_layer_input(&c->m, io->li, j), g, len);
}

/* Backward from dlogits (already in the last layer's dact): weight gradients
 * into c->grads, input gradients summed into the producers' dact. */
static void backward(ref_ctx *c, int n)
{
    const sf_model *m = &c->m;
    sf_ref_io io;
    for (int i = m->n_layers - 1; i >= m->n_frozen; i--) {
        const sf_layer *L = &m->layers[i];
        const sf_layer_kind_info *k = sf_layer_info(L->kind);
        if (k->view)
            continue; /* flatten: its gradient buffer is its input's */
        /* bf16: the output gradient is complete here (every consumer has
         * added its part; two at a residual fork): stored in bf16. */
        to_bf16(c, c->dact[i], (size_t)n * L->out_elems);
        io_of(c, i, n, &io);
        io.dy = c->dact[i];
        io.dw = L->n_w ? grad_at(c, L->w_off) : NULL;
        io.db = L->n_b ? grad_at(c, L->b_off) : NULL;
        for (int j = 0; j < SF_PARAM_SLOTS; j++)
            io.dp[j] = L->p_n[j] ? grad_at(c, L->p_off[j]) : NULL;
        io.give = give_grad;
        const int n_in = sf_layer_n_inputs(L);
        for (int j = 0; j < n_in; j++) {
            const int src = sf_layer_input(m, i, j);
            io.want[j] = src >= 0 && c->dact[src]; /* the model input and frozen layers need none */
        }
        k->ref_bwd(&io);
        if (k->bf16_wgrad && io.dw)
            to_bf16(c, io.dw, L->n_w); /* cuDNN writes bf16 weight gradients */
    }
}

static int check_batch(ref_ctx *c, const sf_batch *b, int need_model, char *err, size_t errlen)
{
    if (need_model && !c->built) {
        sf_errf(err, errlen, "ref: no model built");
        return -1;
    }
    return sf_batch_check(b, need_model ? &c->m : NULL, c->cfg.max_batch, "ref", err, errlen);
}

/* Labels to int32; returns the index of the first out-of-range label or -1. */
static long long convert_labels(ref_ctx *c, const sf_batch *b, int64_t *bad_value)
{
    const size_t count = (size_t)b->n * c->labels_per_sample;
    for (size_t i = 0; i < count; i++) {
        int64_t v;
        switch (b->label_dtype) {
        case SF_LABEL_U8: v = ((const uint8_t *)b->labels)[i]; break;
        case SF_LABEL_I32: v = ((const int32_t *)b->labels)[i]; break;
        default: v = ((const int64_t *)b->labels)[i]; break;
        }
        if (v < 0 || v >= c->m.n_classes) {
            *bad_value = v;
            return (long long)i;
        }
        c->labels[i] = (int32_t)v;
    }
    return -1;
}

/* The optimizer update on gradient g (n_train floats); counts the step. */
static void opt_step(ref_ctx *c, const float *g, const sf_hyper *h)
{
    float *p = c->params + c->m.train_off;
    c->step++;
    if (c->cfg.optim == SF_OPT_ADAMW)
        sf_ref_adamw(p, g, c->mom, c->sq, c->n_train, h->lr, h->beta1, h->beta2, h->eps, h->weight_decay,
                     (int64_t)c->step);
    else
        sf_ref_sgd(p, g, c->mom, c->n_train, h->lr, h->momentum, h->weight_decay);
}

/* What one batch's forward (and step) measured. */
typedef struct step_out {
    float loss;
    int correct, correct5;
    float grad_norm; /* pre-clip, of the gradients applied; 0 when no optimizer step ran */
    int skipped;     /* the optimizer step was skipped for a non-finite loss or gradient */
} step_out;

/* The loss of the logits in the last layer's output against c->labels, with
 * b's label smoothing and mixing; the logits' gradient into dlogits when not
 * NULL. Segmentation models take no mixing (every pixel has its own label). */
static void loss_of(ref_ctx *c, int n, const sf_batch *b, float *dlogits, step_out *o)
{
    const sf_model *m = &c->m;
    const float *logits = c->act[m->n_layers - 1];
    if (m->segmentation) {
        int64_t corr = 0, corr5 = 0;
        sf_ref_xent2d_smooth(logits, c->labels, n, m->n_classes, m->out_h, m->out_w, b->label_smoothing,
                             &o->loss, dlogits, &corr, &corr5);
        o->correct = corr > INT32_MAX ? INT32_MAX : (int)corr;
        o->correct5 = corr5 > INT32_MAX ? INT32_MAX : (int)corr5;
    } else {
        sf_ref_xent_soft(logits, c->labels, n, m->n_classes, b->label_smoothing, b->eval ? 1.0f : b->mix_lam,
                         &o->loss, dlogits, &o->correct, &o->correct5);
    }
}

/* The optimizer step on the gradient g about to be applied: its pre-clip
 * norm, and a skip (nothing changes, the step count included) when it or a
 * loss of the step was not finite; else clipping and the update. */
static void apply_step(ref_ctx *c, float *g, int nonfinite, float factor, const sf_hyper *h, step_out *o)
{
    if (factor == 0.0f) {
        o->skipped = SF_SKIP_EMPTY;
        o->grad_norm = 0.0f;
        return;
    }
    const double norm = sf_ref_grad_norm(g, c->n_train) * (double)factor;
    if (nonfinite || !isfinite(norm)) {
        o->skipped = SF_SKIP_NONFINITE;
        o->grad_norm = 0.0f;
        return;
    }
    o->grad_norm = (float)norm;
    sf_ref_scale_clip_grads(g, c->n_train, norm, h->clip_grad_norm, factor);
    opt_step(c, g, h);
}

/* Forward, loss, backward and (every grad_accum_steps batches) the optimizer
 * update of the n samples in c->input with the labels in c->labels. A
 * non-finite loss in any batch of an accumulation group skips the group's
 * step, and the group's accumulated gradient is dropped either way (as a
 * torch loop's zero_grad after a GradScaler-skipped step). */
/* Data-parallel training: this rank's mean gradient of n samples becomes its
 * share n / global_n of the global mean, and the SUM over the ranks (Gloo, on
 * every rank the same result: the ring all-reduce adds in one order and
 * broadcasts the sums) is the gradient every rank applies. A rank whose loss
 * was not finite sends a NaN, so that every rank skips the step together.
 * The samples each rank trained travel as one more element of the same
 * message: *factor is global_n over their sum (1 when every announced batch
 * trained; 0 when none did), the factor from the sum to the mean over the
 * samples trained. 0, or -1 with dist_err set when a peer is gone. */
static int allreduce_grads(ref_ctx *c, int n, int64_t global_n, int bad_loss, float *factor)
{
    const sf_dist *d = c->cfg.dist;
    *factor = 1.0f;
    if (!d || d->world <= 1 || global_n <= 0)
        return 0;
    if (!c->bn_sync_round) { /* under sync the loss gradient was scaled (train_step) */
        const float share = (float)n / (float)global_n;
        for (size_t e = 0; e < c->n_train; e++)
            c->grads[e] *= share;
    }
    if (bad_loss && c->n_train)
        c->grads[0] = NAN;
    c->grads[c->n_train] = (float)n;
    sf_dist *dm = (sf_dist *)d; /* the backend reports its all-reduce time in it (engine thread only) */
    const uint64_t t0 = now_ns();
    char err[sizeof c->dist_err];
    int rc = sf_coll_allreduce(d->coll, c->grads, c->n_train + 1, SF_COLL_F32, SF_COLL_SUM, err, sizeof err);
    dm->allreduce_s = (double)(now_ns() - t0) * 1e-9;
    if (rc != 0) {
        snprintf(c->dist_err, sizeof c->dist_err, "%s", err);
        return rc;
    }
    /* the same float operations as the CUDA gradient check (sf_cuda_grad_state) */
    const float trained = c->grads[c->n_train], announced = (float)global_n;
    *factor = trained > 0.0f ? announced / trained : 0.0f;
    return 0;
}

/* Batchnorm's running statistics and num_batches_tracked from rank 0 to
 * every rank, after a data-parallel round's forward has moved each rank's
 * with its own batch (sf_dist.bn_broadcast; PyTorch DDP's broadcast_buffers
 * sends rank 0's at each forward, and since training normalises with the
 * batch's statistics the two orders train the same and keep the same rank-0
 * state). Every rank calls it in every round, an empty contribution too, so
 * the collectives pair. 0, or -1 with dist_err set. */
static int broadcast_buffers(ref_ctx *c, const sf_batch *b)
{
    const sf_dist *d = c->cfg.dist;
    if (!d || d->world <= 1 || b->global_n <= 0 || !d->bn_broadcast || c->m.n_buffers == 0)
        return 0;
    char err[sizeof c->dist_err];
    if (sf_coll_broadcast(d->coll, c->buffers, sizeof(float) * c->m.n_buffers, 0, err, sizeof err) != 0 ||
        sf_coll_broadcast(d->coll, &c->nbt, sizeof c->nbt, 0, err, sizeof err) != 0) {
        snprintf(c->dist_err, sizeof c->dist_err, "%s", err);
        return -1;
    }
    return 0;
}

/* An empty contribution's part of a round under distributed.batchnorm sync:
 * each trainable batchnorm's forward and backward with 0 samples, so that
 * every rank makes the same all-reduces (zeros and a count of 0 from this
 * one) and moves its running statistics and num_batches_tracked with the
 * job's statistics as the ranks that trained do (not when no rank trained a
 * sample: then no batchnorm saw any). */
static void bn_sync_empty(ref_ctx *c)
{
    const sf_model *m = &c->m;
    sf_ref_io io;
    int counted = 0;
    for (int i = m->n_frozen; i < m->n_layers; i++) {
        const sf_layer *L = &m->layers[i];
        const sf_layer_kind_info *k = sf_layer_info(L->kind);
        if (!k->buffers || L->frozen)
            continue;
        io_of(c, i, 0, &io);
        io.train = 1;
        k->ref_fwd(&io);
        counted |= c->save[i][2 * L->out_ch] > 0.0f;
    }
    if (counted)
        c->nbt++;
    for (int i = m->n_layers - 1; i >= m->n_frozen; i--) {
        const sf_layer *L = &m->layers[i];
        const sf_layer_kind_info *k = sf_layer_info(L->kind);
        if (!k->buffers || L->frozen)
            continue;
        io_of(c, i, 0, &io);
        io.dy = c->dact[i];
        io.dw = grad_at(c, L->w_off);
        io.db = grad_at(c, L->b_off);
        io.give = give_grad;
        k->ref_bwd(&io);
    }
}

/* With b->global_n > 0 (a data-parallel round) the gradient is all-reduced
 * before accumulation and the optimizer, and n may be 0: zero gradients
 * through the same all-reduce and optimizer step. 0, or -1 when the
 * all-reduce failed (then nothing was updated). */
static int train_step(ref_ctx *c, int n, const sf_batch *b, step_out *o)
{
    c->seq = b->seq;
    const sf_model *m = &c->m;
    const int last = m->n_layers - 1;
    memset(o, 0, sizeof *o);
    int bad_loss = 0;
    /* Only a round's step synchronises: diagnose's replays (global_n 0) run
     * this rank's step alone. */
    c->bn_sync_round = c->bn_sums && b->global_n > 0;
    if (n > 0) {
        forward(c, n, 1);
        for (int i = m->n_frozen; i < m->n_layers; i++)
            if (c->dact_buf[i])
                memset(c->dact_buf[i], 0, sizeof(float) * (size_t)n * m->layers[i].out_elems);
        loss_of(c, n, b, c->dact[last], o);
        bad_loss = !isfinite(o->loss);
        /* Under sync the backward's batchnorm sums add every rank's output
         * gradients, so each rank's must already be its share n / global_n
         * of the job's mean loss (not scaled after the backward). */
        if (c->bn_sync_round) {
            const float share = (float)n / (float)b->global_n;
            float *dl = c->dact[last];
            for (size_t e = 0; e < (size_t)n * m->layers[last].out_elems; e++)
                dl[e] *= share;
        }
        /* bf16: the loss is fp32 from the bf16 logits; their gradient is stored in bf16. */
        to_bf16(c, c->dact[last], (size_t)n * m->layers[last].out_elems);
        backward(c, n);
    } else {
        memset(c->grads, 0, sizeof(float) * c->n_train);
        if (c->bn_sync_round)
            bn_sync_empty(c);
    }
    if (c->dist_err[0] && c->bn_sync_round)
        return -1; /* a batchnorm all-reduce failed */
    float factor;
    if (allreduce_grads(c, n, b->global_n, bad_loss, &factor) != 0 || broadcast_buffers(c, b) != 0)
        return -1;
    const int k = c->cfg.grad_accum_steps > 1 ? c->cfg.grad_accum_steps : 1;
    if (k == 1) {
        apply_step(c, c->grads, bad_loss, factor, &b->hyper, o);
        return 0;
    }
    /* Each batch of the group adds its mean over the samples trained, 1/k
     * of it (a round in which none trained adds nothing; a group in which
     * none did is skipped, SF_SKIP_EMPTY, as CUDA's k_accum / gacc_n). */
    const float inv_k = 1.0f / (float)k, w = inv_k * factor;
    for (size_t e = 0; e < c->n_train; e++)
        c->gacc[e] += c->grads[e] * w;
    c->accum_nonfinite |= bad_loss;
    c->accum_trained |= factor != 0.0f;
    if (++c->accum_count == k) {
        /* a group in which no rank trained a sample is skipped, as one round is without accumulation */
        apply_step(c, c->gacc, c->accum_nonfinite, c->accum_trained ? 1.0f : 0.0f, &b->hyper, o);
        memset(c->gacc, 0, sizeof(float) * c->n_train);
        c->accum_count = 0;
        c->accum_nonfinite = 0;
        c->accum_trained = 0;
    }
    return 0;
}

/* An evaluation batch: the forward in eval mode (batchnorm on its running
 * statistics, which stay as they are) and the loss; no backward, no step. */
static void eval_step(ref_ctx *c, int n, const sf_batch *b, step_out *o)
{
    c->seq = b->seq;
    memset(o, 0, sizeof *o);
    forward(c, n, 0);
    loss_of(c, n, b, NULL, o);
}

static size_t label_bytes(sf_label_dtype d)
{
    return d == SF_LABEL_U8 ? 1 : d == SF_LABEL_I32 ? 4 : 8;
}

/* An encoded batch decoded into c->decoded, as the raw batch *raw (b itself
 * when it is not encoded). With b->skip_undecodable the samples whose files
 * libjpeg-turbo refuses are marked in b->undecodable and left out of *raw:
 * the kept samples' parameters and labels, in order, are copied into
 * c->kept_samples and c->kept_labels, and raw->n counts them. 0;
 * SF_BACKEND_BAD_INPUT with err naming the (first) sample when a file's data
 * is refused and the batch cannot go on (no skipping, or nothing left); -1
 * when the buffer is too small. */
static int decode(ref_ctx *c, const sf_batch *b, sf_batch *raw, char *err, size_t errlen)
{
    *raw = *b;
    if (b->undecodable)
        memset(b->undecodable, 0, (size_t)b->n);
    if (!b->jpeg)
        return 0;
    if (!c->decoded || b->decoded_bytes > c->decoded_cap) {
        sf_errf(err, errlen, "ref: the decoded batch needs %zu bytes; the decode buffer holds %zu "
                "(jpeg.max_batch_pixels)", b->decoded_bytes, c->decoded_cap);
        return -1;
    }
    const int skip = b->skip_undecodable && b->undecodable && c->kept_samples && b->n <= c->cfg.max_batch;
    const int rc = sf_ref_image_decode_some(b, NULL, c->decoded, c->decoded_cap, skip ? b->undecodable : NULL,
                                           err, errlen);
    if (rc < 0)
        return -1;
    if (rc > 0 && (!skip || rc == b->n))
        return SF_BACKEND_BAD_INPUT;
    raw->images = c->decoded;
    raw->jpeg = NULL;
    raw->jpeg_off = NULL;
    raw->jpeg_files = NULL;
    if (rc == 0)
        return 0;
    const size_t lsz = b->labels ? label_bytes(b->label_dtype) * c->labels_per_sample : 0;
    int k = 0;
    for (int i = 0; i < b->n; i++) {
        if (b->undecodable[i])
            continue;
        c->kept_samples[k] = b->samples[i];
        if (lsz)
            memcpy(c->kept_labels + (size_t)k * lsz, (const uint8_t *)b->labels + (size_t)i * lsz, lsz);
        k++;
    }
    raw->n = k;
    raw->samples = c->kept_samples;
    raw->labels = lsz ? c->kept_labels : b->labels;
    return 0;
}

/* An empty contribution to a data-parallel round (sf_batch.n == 0). */
static int submit_empty(ref_ctx *c, const sf_batch *b, char *err, size_t errlen)
{
    if (!c->built || !c->cfg.dist || c->cfg.dist->world <= 1 || b->global_n <= 0 || b->eval) {
        sf_errf(err, errlen, "ref: a batch of 0 samples outside a data-parallel round");
        return -1;
    }
    if (c->count + 2 > REF_FIFO_CAP) {
        sf_errf(err, errlen, "ref: %d events not yet polled; poll before submitting more", c->count);
        return -1;
    }
    sf_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = SF_EV_SLOT_FREE;
    ev.id = b->id;
    ev.token = b->token;
    push_event(c, &ev);
    const uint64_t t0 = now_ns();
    step_out o;
    memset(&ev, 0, sizeof ev);
    ev.kind = SF_EV_STEP_DONE;
    ev.id = b->id;
    ev.token = b->token;
    if (train_step(c, 0, b, &o) != 0) {
        ev.status = -1;
        snprintf(ev.err, sizeof ev.err, "%s", c->dist_err);
    } else {
        ev.grad_norm = o.grad_norm;
        ev.skipped = o.skipped;
    }
    const uint64_t t1 = now_ns();
    ev.step = c->step;
    ev.t_h2d_start_ns = ev.t_transform_start_ns = ev.t_step_start_ns = t0;
    ev.t_step_end_ns = t1;
    ev.step_s = (double)(t1 - t0) * 1e-9;
    push_event(c, &ev);
    return 0;
}

static int ref_submit(sf_backend *be, const sf_batch *b_in, char *err, size_t errlen)
{
    ref_ctx *c = ctx_of(be);
    if (b_in && b_in->n == 0 && b_in->global_n > 0)
        return submit_empty(c, b_in, err, errlen);
    if (check_batch(c, b_in, 1, err, errlen) != 0)
        return -1;
    if (c->count + 2 > REF_FIFO_CAP) {
        sf_errf(err, errlen, "ref: %d events not yet polled; poll before submitting more", c->count);
        return -1;
    }
    sf_event ev;

    const uint64_t t0 = now_ns();
    sf_batch raw;
    /* A file the decoder refuses fails the submission itself, before any
     * event, as on the CUDA backend: the engine then knows at once that this
     * batch takes no step (in a data-parallel round it joins the step with
     * an empty contribution instead, so the ranks' collectives still pair). */
    const int drc = decode(c, b_in, &raw, err, errlen);
    if (drc != 0)
        return drc == SF_BACKEND_BAD_INPUT ? SF_BACKEND_BAD_INPUT : -1;
    const uint64_t t_decoded = now_ns();
    const sf_batch *b = &raw;
    const int n = b->n; /* the samples decoded: all, or those kept */
    int64_t bad = 0;
    make_input(c, b);
    const long long bad_at = convert_labels(c, b, &bad);
    const uint64_t t1 = now_ns();

    /* The slot's bytes (images, labels, samples) are consumed. */
    memset(&ev, 0, sizeof ev);
    ev.kind = SF_EV_SLOT_FREE;
    ev.id = b->id;
    ev.token = b->token;
    push_event(c, &ev);

    memset(&ev, 0, sizeof ev);
    ev.kind = SF_EV_STEP_DONE;
    ev.id = b->id;
    ev.token = b->token;
    ev.n = n;
    if (bad_at >= 0) {
        ev.status = -1;
        snprintf(ev.err, sizeof ev.err, "ref: label %lld at element %lld of the labels is outside [0,%d)",
                 (long long)bad, bad_at, c->m.n_classes);
        /* In a data-parallel round the other ranks are inside the step's
         * all-reduce: this rank joins it with an empty contribution. */
        step_out none;
        if (b->global_n > 0 && !b->eval && train_step(c, 0, b, &none) != 0)
            snprintf(ev.err, sizeof ev.err, "%s", c->dist_err);
        ev.step = c->step;
        ev.t_h2d_start_ns = t0;
        ev.t_transform_start_ns = t0;
        ev.t_step_start_ns = ev.t_step_end_ns = t1;
        ev.transform_s = (double)(t1 - t0) * 1e-9;
        push_event(c, &ev);
        return 0;
    }

    step_out o;
    if (b->eval) {
        eval_step(c, n, b, &o);
    } else if (train_step(c, n, b, &o) != 0) {
        ev.status = -1;
        snprintf(ev.err, sizeof ev.err, "%s", c->dist_err);
    }
    if (b->logits_out) {
        /* A sample left out has a row of NaN: no logits were computed for it. */
        const size_t row = c->m.layers[c->m.n_layers - 1].out_elems;
        const float *src = c->act[c->m.n_layers - 1];
        for (int i = 0, k = 0; i < b_in->n; i++) {
            float *dst = b->logits_out + (size_t)i * row;
            if (b_in->undecodable && b_in->undecodable[i] && n < b_in->n) {
                for (size_t e = 0; e < row; e++)
                    dst[e] = NAN;
            } else {
                memcpy(dst, src + (size_t)k * row, sizeof(float) * row);
                k++;
            }
        }
    }
    const uint64_t t2 = now_ns();

    ev.loss = o.loss;
    ev.correct = o.correct;
    ev.correct5 = o.correct5;
    ev.grad_norm = o.grad_norm;
    ev.skipped = o.skipped;
    ev.eval = b->eval;
    if (b_in->jpeg) {
        snprintf(ev.decoder, sizeof ev.decoder, "libjpeg-turbo");
        ev.decode_host_s = (double)(t_decoded - t0) * 1e-9;
    }
    ev.n_labels = (int64_t)n * (int64_t)c->labels_per_sample;
    ev.step = c->step;
    /* No host-to-device copy on the CPU: a zero-length h2d stage. */
    ev.h2d_s = 0.0;
    ev.t_h2d_start_ns = t0;
    ev.t_transform_start_ns = t0;
    ev.transform_s = (double)(t1 - t0) * 1e-9;
    ev.t_step_start_ns = t1;
    ev.t_step_end_ns = t2;
    ev.step_s = (double)(t2 - t1) * 1e-9;
    push_event(c, &ev);
    return 0;
}

static int ref_poll(sf_backend *be, sf_event *ev, int max, int timeout_us)
{
    ref_ctx *c = ctx_of(be);
    if (c->count == 0) {
        /* Nothing can complete while we wait (the backend is synchronous),
         * but the contract lets poll block up to timeout_us; do so, so that
         * an idle engine loop does not spin. */
        if (timeout_us > 0) {
            struct timespec ts = {timeout_us / 1000000, (long)(timeout_us % 1000000) * 1000};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
        }
        return 0;
    }
    int k = 0;
    while (k < max && c->count > 0) {
        ev[k++] = c->fifo[c->head];
        c->head = (c->head + 1) % REF_FIFO_CAP;
        c->count--;
    }
    return k;
}

static int ref_transform(sf_backend *be, const sf_batch *b_in, float *out, char *err, size_t errlen)
{
    ref_ctx *c = ctx_of(be);
    if (check_batch(c, b_in, 0, err, errlen) != 0)
        return -1;
    if (!out) {
        sf_errf(err, errlen, "ref: output buffer missing");
        return -1;
    }
    sf_batch raw;
    const int drc = decode(c, b_in, &raw, err, errlen);
    if (drc != 0)
        return drc;
    const sf_batch *b = &raw;
    if (b->plan->blur_ksize > 1 &&
        (size_t)b->plan->c * b->plan->out_h * b->plan->out_w > c->aug_tmp_len) {
        /* Not the model's shape (or no model): the stages' one-off path. */
        sf_ref_augment(b->plan, b->samples, b->n, b->images, b->nhwc, out);
        sf_ref_aug_mix(b->plan, &b->mix, b->n, out);
    } else {
        augment(c, b, out);
    }
    if (b->n < b_in->n) {
        /* The kept samples' rows move to their places, from the last one
         * down (a row only ever moves up the buffer), and a row left out
         * becomes zeros. */
        const size_t row = (size_t)b->plan->c * b->plan->out_h * b->plan->out_w;
        for (int i = b_in->n - 1, k = b->n - 1; i >= 0; i--) {
            if (b_in->undecodable[i]) {
                memset(out + (size_t)i * row, 0, sizeof(float) * row);
            } else {
                if (k != i)
                    memmove(out + (size_t)i * row, out + (size_t)k * row, sizeof(float) * row);
                k--;
            }
        }
    }
    return 0;
}

static int ref_get_params(sf_backend *be, float *dst)
{
    ref_ctx *c = ctx_of(be);
    if (!c->built)
        return -1;
    memcpy(dst, c->params, sizeof(float) * c->m.n_params);
    return 0;
}

static int ref_set_params(sf_backend *be, const float *src)
{
    ref_ctx *c = ctx_of(be);
    if (!c->built)
        return -1;
    memcpy(c->params, src, sizeof(float) * c->m.n_params);
    return 0;
}

static int ref_health(sf_backend *be, char *err, size_t errlen)
{
    ref_ctx *c = ctx_of(be);
    if (!c->dist_err[0])
        return 0;
    sf_errf(err, errlen, "%s", c->dist_err);
    return -1;
}

/* FNV-1a over the parameter bytes: cheap, and any differing bit changes it. */
static int ref_param_digest(sf_backend *be, uint64_t *digest)
{
    ref_ctx *c = ctx_of(be);
    if (!c->built)
        return -1;
    *digest = sf_hash_bytes(SF_HASH_SEED, c->params, sizeof(float) * c->m.n_params);
    return 0;
}

/* ---- optimizer state ------------------------------------------------------ */

/* The moment buffers cover the trainable parameters only; in sf_model layout
 * the frozen ones [0, train_off) read as zeros. The momentum buffer is zeroed
 * by build and touched only by steps with momentum != 0 (or AdamW steps). */
static void put_model_layout(const ref_ctx *c, const float *src, float *dst)
{
    memset(dst, 0, sizeof(float) * c->m.train_off);
    if (src)
        memcpy(dst + c->m.train_off, src, sizeof(float) * c->n_train);
    else
        memset(dst + c->m.train_off, 0, sizeof(float) * c->n_train);
}

/* The inverse: the trainable part of src (model layout) into dst, zeros
 * when src is NULL. */
static void take_model_layout(const ref_ctx *c, const float *src, float *dst)
{
    if (src)
        memcpy(dst, src + c->m.train_off, sizeof(float) * c->n_train);
    else
        memset(dst, 0, sizeof(float) * c->n_train);
}

static int ref_get_opt_state(sf_backend *be, float *momentum, uint64_t *step)
{
    ref_ctx *c = ctx_of(be);
    if (!c->built)
        return -1;
    if (momentum)
        put_model_layout(c, c->mom, momentum);
    if (step)
        *step = c->step;
    return 0;
}

static int ref_set_opt_state(sf_backend *be, const float *momentum, uint64_t step)
{
    ref_ctx *c = ctx_of(be);
    if (!c->built)
        return -1;
    take_model_layout(c, momentum, c->mom);
    c->step = step;
    if (c->gacc)
        memset(c->gacc, 0, sizeof(float) * c->n_train);
    c->accum_count = 0;
    c->accum_nonfinite = 0;
    c->accum_trained = 0;
    return 0;
}

static int ref_get_opt_sq(sf_backend *be, float *exp_avg_sq)
{
    ref_ctx *c = ctx_of(be);
    if (!c->built || !exp_avg_sq)
        return -1;
    put_model_layout(c, c->sq, exp_avg_sq);
    return 0;
}

static int ref_set_opt_sq(sf_backend *be, const float *exp_avg_sq)
{
    ref_ctx *c = ctx_of(be);
    if (!c->built)
        return -1;
    if (!c->sq)
        return 0; /* SGD: nothing to set */
    take_model_layout(c, exp_avg_sq, c->sq);
    return 0;
}

static int ref_get_buffers(sf_backend *be, float *dst, uint64_t *num_batches_tracked)
{
    ref_ctx *c = ctx_of(be);
    if (!c->built)
        return -1;
    if (dst)
        memcpy(dst, c->buffers, sizeof(float) * c->m.n_buffers);
    if (num_batches_tracked)
        *num_batches_tracked = c->nbt;
    return 0;
}

static int ref_set_buffers(sf_backend *be, const float *src, uint64_t num_batches_tracked)
{
    ref_ctx *c = ctx_of(be);
    if (!c->built)
        return -1;
    if (src)
        memcpy(c->buffers, src, sizeof(float) * c->m.n_buffers);
    else
        sf_model_init_buffers(&c->m, c->buffers);
    c->nbt = num_batches_tracked;
    return 0;
}

/* ---- the caching method ----------------------------------------------------- */

/* The stages of submit, synchronously, without events: each timed step runs
 * from the stage that mode names on the CPU's "device" (host memory):
 *   SF_BENCH_STEP          b augmented once into c->input; the step alone.
 *   SF_BENCH_AUG_STEP      b's images copied once to a private buffer; then
 *                          augmentation (and label conversion) + step.
 *   SF_BENCH_H2D_AUG_STEP  exactly submit's path from the slot's bytes (there
 *                          is no host-to-device copy on the CPU).
 * Parameters, momentum and the step count are restored afterwards. */
static int ref_bench(sf_backend *be, const sf_batch *b, sf_bench_mode mode, int warmup, int steps,
                     double *seconds, char *err, size_t errlen)
{
    ref_ctx *c = ctx_of(be);
    if (check_batch(c, b, 1, err, errlen) != 0)
        return -1;
    if (mode != SF_BENCH_STEP && mode != SF_BENCH_AUG_STEP && mode != SF_BENCH_H2D_AUG_STEP) {
        sf_errf(err, errlen, "ref bench: unknown mode %d", (int)mode);
        return -1;
    }
    if (warmup < 0 || steps < 1 || !seconds) {
        sf_errf(err, errlen, "ref bench: warmup %d must be >= 0 and steps %d >= 1", warmup, steps);
        return -1;
    }
    int64_t bad = 0;
    const long long bad_at = convert_labels(c, b, &bad);
    if (bad_at >= 0) {
        sf_errf(err, errlen, "ref bench: label %lld at element %lld is outside [0,%d)", (long long)bad, bad_at,
                c->m.n_classes);
        return -1;
    }
    const size_t np = c->m.n_params, nt = c->n_train, nbuf = c->m.n_buffers;
    const size_t img_bytes = (size_t)b->n * b->h * b->w * b->c;
    /* Saved: parameters, buffers, momentum, AdamW's second moment, the accumulated gradient. */
    float *save_p = alloc_floats(np, 1), *save_m = alloc_floats(nt, 1), *save_b = alloc_floats(nbuf, 1);
    float *save_sq = c->sq ? alloc_floats(nt, 1) : NULL, *save_acc = c->gacc ? alloc_floats(nt, 1) : NULL;
    uint8_t *raw = mode == SF_BENCH_AUG_STEP ? malloc(img_bytes ? img_bytes : 1) : NULL;
    if (!save_p || !save_m || !save_b || (c->sq && !save_sq) || (c->gacc && !save_acc) ||
        (mode == SF_BENCH_AUG_STEP && !raw)) {
        free(save_p);
        free(save_m);
        free(save_b);
        free(save_sq);
        free(save_acc);
        free(raw);
        sf_errf(err, errlen, "ref bench: out of memory");
        return -1;
    }
    memcpy(save_p, c->params, sizeof(float) * np);
    memcpy(save_m, c->mom, sizeof(float) * nt);
    memcpy(save_b, c->buffers, sizeof(float) * nbuf);
    if (c->sq)
        memcpy(save_sq, c->sq, sizeof(float) * nt);
    if (c->gacc)
        memcpy(save_acc, c->gacc, sizeof(float) * nt);
    const uint64_t save_step = c->step, save_nbt = c->nbt;
    const int save_accum = c->accum_count, save_accum_nonfinite = c->accum_nonfinite,
              save_accum_trained = c->accum_trained;

    sf_batch cached = *b;
    if (mode == SF_BENCH_AUG_STEP) {
        memcpy(raw, b->images, img_bytes);
        cached.images = raw;
    }
    if (mode == SF_BENCH_STEP)
        make_input(c, b);
    uint64_t t0 = 0;
    for (int i = 0; i < warmup + steps; i++) {
        if (i == warmup)
            t0 = now_ns();
        if (mode != SF_BENCH_STEP) {
            make_input(c, &cached);
            convert_labels(c, &cached, &bad);
        }
        step_out o;
        /* Local (global_n 0: no all-reduce): the caching method times this rank's step alone. */
        (void)train_step(c, b->n, b, &o);
    }
    const uint64_t t1 = now_ns();
    double s = (double)(t1 - t0) * 1e-9;
    *seconds = s > 0 ? s : 1e-9; /* a clock that did not move still ran the steps */

    memcpy(c->params, save_p, sizeof(float) * np);
    memcpy(c->mom, save_m, sizeof(float) * nt);
    memcpy(c->buffers, save_b, sizeof(float) * nbuf);
    if (c->sq)
        memcpy(c->sq, save_sq, sizeof(float) * nt);
    if (c->gacc)
        memcpy(c->gacc, save_acc, sizeof(float) * nt);
    c->step = save_step;
    c->nbt = save_nbt;
    c->accum_count = save_accum;
    c->accum_nonfinite = save_accum_nonfinite;
    c->accum_trained = save_accum_trained;
    free(save_p);
    free(save_m);
    free(save_b);
    free(save_sq);
    free(save_acc);
    free(raw);
    return 0;
}

/* No device telemetry on the CPU. */
static int ref_device_stats(sf_backend *be, sf_device_stats *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    return -1;
}

static void ref_destroy(sf_backend *be)
{
    if (!be)
        return;
    ref_ctx *c = ctx_of(be);
    if (c) {
        free_state(c);
        free(c);
    }
    free(be);
}

/* TF32 is a tensor-core format; the reference's loops compute in fp32 (see
 * the top), so that is what a tf32 model trains in here. */
static sf_precision ref_precision_in_force(sf_backend *be, sf_precision asked)
{
    return asked == SF_PREC_TF32 ? SF_PREC_FP32 : asked;
}

static const sf_backend_i ref_vtable = {
    .name = ref_name,
    .host_alloc = ref_host_alloc,
    .host_free = ref_host_free,
    .build = ref_build,
    .max_inflight = ref_max_inflight,
    .submit = ref_submit,
    .poll = ref_poll,
    .transform = ref_transform,
    .get_params = ref_get_params,
    .set_params = ref_set_params,
    .health = ref_health,
    .destroy = ref_destroy,
    .get_opt_state = ref_get_opt_state,
    .set_opt_state = ref_set_opt_state,
    .bench = ref_bench,
    .device_stats = ref_device_stats,
    .get_buffers = ref_get_buffers,
    .set_buffers = ref_set_buffers,
    .get_opt_sq = ref_get_opt_sq,
    .set_opt_sq = ref_set_opt_sq,
    .param_digest = ref_param_digest,
    .precision_in_force = ref_precision_in_force,
};

sf_backend *sf_backend_ref_new(char *err, size_t errlen)
{
    sf_backend *be = calloc(1, sizeof *be);
    ref_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        sf_errf(err, errlen, "ref: out of memory");
        return NULL;
    }
    be->i = &ref_vtable;
    be->ctx = c;
    return be;
}
