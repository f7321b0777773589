/* gpu/cuda/executor.cu — the network executor: one forward, one loss, one
 * backward and one optimizer step for every model, on the device. Contract in
 * executor.h; the reference backend's step (gpu/ref/backend_ref.c) computes the
 * same function on the CPU.
 *
 * The model is a graph of layers (gpu/model.h): each layer reads the outputs of
 * earlier layers (or the model input) and the backward walks it in reverse.
 * Every layer but flatten (and a ReLU fused into its producer, and to_tokens
 * of an NHWC map, whose bytes are already the token sequence) owns its output;
 * every trainable layer of those owns its output gradient. The first consumer
 * (in backward order) of a tensor overwrites its gradient, later ones add
 * theirs through a scratch tensor, gtmp (a residual block's input).
 *
 * Per layer kind: conv2d and conv_transpose2d through cuDNN's graph API (plans
 * built and timed per batch size, cuDNN's fused conv+bias+ReLU forward where it
 * times faster than conv + our epilogue kernel, backward-filter on a side
 * stream beside backward-data), linear through cuBLASLt with the bias in the
 * forward GEMM's epilogue where it has a plan (else cuBLAS and our bias
 * kernel; executor_tune.cu's g_lt_wants says which), batchnorm, pooling, add,
 * ReLU and the other activations, products (mul, layer_scale, scale_shift), concat,
 * the channel shuffle and slice, dropout and the losses through our kernels (the *.cu files beside this one).
 * A Vision Transformer's token sequences ([n, t, c], token-major: an NHWC
 * [c, t, 1] map whatever the net's layout) run through the same linear,
 * layernorm, activation, add and dropout code viewed NHWC, and the token
 * kinds through tokens.h; self_attention is its input projection (cuBLAS),
 * the heads (cuDNN's fused attention, sdpa.h, in bf16 nets where its plan
 * builds, else the materialised core of attention.h) and its output
 * projection.
 * A layer of several inputs (add, mul, concat) hands each input its gradient
 * in turn, through gtmp where it is not that input's first consumer. Dropout
 * keys its draws by the batch's sequence number, read from the staged
 * sf_step_ctl in device memory so that a replayed graph draws each batch's
 * own mask.
 *
 * Inputs per batch buffer: the model input of buffer b (written by the
 * augmentation on the transform stream) and, with a frozen prefix, b's frozen
 * boundary (written by the frozen forward on the transform stream) are bound
 * by buffer, so nothing is copied into the step; the backend orders the
 * transform stream's writes of buffer b after b's previous step with events.
 *
 * Element type and layout: activations and their gradients are of type g->dt
 * (fp32, or bf16 with model.precision=bf16) in layout g->lay. The master
 * parameters, their gradients and the optimizer state are fp32 in the device
 * layout: with NHWC activations a k>1 conv weight is stored KRSC ([oc][k][k][c];
 * convT [c][k][k][oc]) where PyTorch stores KCRS, everything else in PyTorch's
 * order. PyTorch's layout exists only at the host boundary (get/set of the
 * parameters and optimizer state: checkpoints), which permutes on the host, so
 * the optimizer is one elementwise pass and no device copy of the weights is
 * kept for fp32. bf16 nets read bf16 copies of the weights (wd, refreshed
 * after each optimizer step) and write bf16 conv weight gradients (gd, cast
 * into the fp32 gradients before the optimizer). Logits are cast to fp32 for
 * the loss (and its gradient back to dt).
 *
 * ReLU fusion: a ReLU whose input is produced by a conv, convT, linear,
 * batchnorm or add that nothing else reads is folded into that layer's
 * epilogue (forward) and gradient mask (backward); the ReLU layer then only
 * aliases its producer's tensors.
 *
 * The whole step of one (buffer, batch size, optimizer on/off) is captured
 * once as a CUDA graph and replayed.
 *
 * Files: executor_plan.cu builds the layer graph when a net is created (the
 * per-layer decisions above, the buffers, the memory plan); executor_tune.cu
 * builds and times the cuDNN plans per batch size and describes them;
 * executor_grad.cu ends a training step (the gradient check's sums, the
 * data-parallel all-reduce in buckets, accumulation, the optimizer);
 * executor_state.cu moves the state across the host boundary in PyTorch's
 * layout; executor_linear.cu runs the linear layers' cuBLASLt forwards and
 * self_attention's forward and backward; executor_moves.cu the layers that
 * move values (channel shuffle and slice, upsampling); this file creates the
 * net, runs the forward, loss and backward and
 * captures the step as a CUDA graph; executor_graph.h holds what they share.
 */
#include "gpu/cuda/executor_graph.h"
#include "gpu/common.h"

#define WS_TUNE_MIN ((size_t)256 << 20) /* candidates' workspace while choosing engines: */
#define WS_TUNE_MAX ((size_t)1 << 30)   /* bounds (g_finish_create) */
#define WS_WIDE_MAX ((size_t)4 << 30)   /* the most a plan that wins by SF_CONV_WIDE_GAIN may use */
#define WS_MIN_BYTES ((size_t)32 << 20)   /* slack for plans of other batch sizes */
#define WS_SMALL_BYTES ((size_t)1 << 20)  /* the side and frozen workspaces' floor */

/* ---- the step ------------------------------------------------------------- */


/* The layout layer i's per-channel ops see its input (and output) in: a
 * token sequence is token-major, an NHWC [c, t, 1] map, whatever the net's. */
static sf_layout g_lay_of(const gen_net *g, int i) { return g->op[i].tok ? SF_LAYOUT_NHWC : g->lay; }

/* g_view in layer i's own layout (g_lay_of). */
static void g_view_of(const gen_net *g, int i, int n, size_t hw, size_t *outer, size_t *inner)
{
    *outer = g_lay_of(g, i) == SF_LAYOUT_NHWC ? (size_t)n * hw : (size_t)n;
    *inner = g_lay_of(g, i) == SF_LAYOUT_NHWC ? 1 : hw;
}

/* Channels and elements per sample of input j of layer i. */
static int g_in_c(const sf_model *m, int i, int j)
{
    sf_shape sh;
    sf_layer_in_shape(m, i, j, &sh);
    return sh.c;
}
static size_t g_in_elems(const sf_model *m, int i, int j)
{
    sf_shape sh;
    sf_layer_in_shape(m, i, j, &sh);
    return (size_t)sh.c * sh.h * sh.w;
}

/* The layout dropout keys its draws in: the reference keys an element by its
 * index in the reference's storage, which for a token sequence is the
 * token-major order it is stored in here (NCHW's "element index" rule). */
static sf_layout g_drop_lay(const gen_net *g, int i) { return g->op[i].tok ? SF_LAYOUT_NCHW : g->lay; }

/* What one of a dropout-family layer's decisions covers. */
static sf_drop_unit g_drop_unit(const sf_layer *L)
{
    return L->kind == SF_L_STOCHASTIC_DEPTH ? SF_DROP_SAMPLE : L->kind == SF_L_DROPOUT2D ? SF_DROP_CHANNEL
                                                                                         : SF_DROP_ELEMENT;
}


/* A mul layer whose second input is [C,1,1], broadcast over H,W. */
static int g_mul_bcast(const sf_model *m, int i) { return g_in_elems(m, i, 1) != m->layers[i].out_elems; }

/* Where buffer b's batch sequence number (the dropout draws' key) is read
 * from: the staged sf_step_ctl, so a captured step reads each replay's. */
static const uint64_t *g_seq(const sf_cuda_net *net, int b)
{
    return net->io[b].ctl ? &net->io[b].ctl->seq : NULL;
}

/* Forward of dropout-family layer i: its mask on x, or x itself in
 * evaluation and when frozen. */
static int g_dropout_fwd(sf_cuda_net *net, int i, int n, int b, const void *x, cudaStream_t s, int eval)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    const gop *o = &g->op[i];
    if (o->frozen || eval) {
        SF_CUDA_CHECK(cudaMemcpyAsync(o->y, x, g->es * n * L->out_elems, cudaMemcpyDeviceToDevice, s));
        return 0;
    }
    return sf_cuda_dropout_dt(g->dt, g_drop_lay(g, i), x, o->y, n, L->out_ch, (size_t)L->out_h * L->out_w, L->p,
                              net->cfg.drop_seed, g_seq(net, b), (uint64_t)i, g_drop_unit(L), s)
               ? -1
               : 0;
}


__global__ void k_x2d_out(const sf_xent2d_out *in, sf_xent_out *out)
{
    out->loss = in->loss;
    out->bad = in->bad;
    out->correct = in->correct > 0x7fffffffLL ? 0x7fffffff : (int)in->correct;
    out->correct5 = in->correct5 > 0x7fffffffLL ? 0x7fffffff : (int)in->correct5;
}


/* Batch size n's step fits the compute-stream scratch, which was sized for
 * max_batch (sf_exec_scratch_need); checked for every shape, the first
 * (max_batch) included, so a sizing that falls short of what the kernels
 * use refuses the job with this message rather than corrupting memory. */
static int g_scratch_check(const sf_cuda_net *net, int n)
{
    const size_t need = sf_exec_scratch_need(net, n);
    if (need <= net->g->scratch_bytes)
        return 0;
    sf_cuda_set_error("%s:%d: batch size %d needs %zu B of compute-stream scratch, more than the %zu B allocated",
                      __FILE__, __LINE__, n, need, net->g->scratch_bytes);
    return -1;
}

/* Forward of conv layer i on x: the thin kernel, or the depthwise kernel
 * where it timed faster (conv_dw.h), or cuDNN's plan (after the
 * space-to-depth rearrangement where chosen), with bias and ReLU inside it or
 * applied after. */
static int g_conv_fwd(sf_cuda_net *net, gshape *S, int i, int n, int b, const void *x, cudaStream_t s, cudnnHandle_t h)
{
    gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    gop *o = &g->op[i];
    const float *P = net->params;
    const sf_dtype dt = g->dt;
    size_t outer, inner;
    if (o->thin) {
        if (sf_conv_thin_fwd(dt, g->lay, x, g_wd(net, i), L->n_b ? P + L->b_off : NULL, o->y, n, L->in_c,
                             (size_t)L->in_h * L->in_w, L->out_c, o->relu, s))
            return -1;
        return 0;
    }
    if (o->s2d) {
        sf_conv_desc d;
        g_desc(net, i, n, &d);
        if (sf_conv_s2d_input(&d, x, o->s2d_x, s) || sf_conv_s2d_weight(&d, g_wd(net, i), o->s2d_w, s))
            return -1;
    }
    if (S->dw[i] & (1u << SF_CONV_FWD)) { /* depthwise kernel (conv_dw.h), then the epilogue */
        const sf_conv_ptrs p = {(void *)x, g_wd(net, i), o->y, NULL, NULL};
        if (g_conv_dw_run(net, i, n, SF_CONV_FWD, &p, s))
            return -1;
    } else if (S->cp[i][SF_CONV_FWD].fused) { /* bias and ReLU inside cuDNN's kernel */
        if (sf_conv_run(h, &S->cp[i][SF_CONV_FWD], o->vpf[b]))
            return -1;
        return 0;
    } else if (sf_conv_run(h, &S->cp[i][SF_CONV_FWD], o->vp[SF_CONV_FWD][b])) {
        return -1;
    }
    g_view(g, n, (size_t)L->out_h * L->out_w, &outer, &inner);
    if ((L->n_b || o->relu) &&
        sf_cuda_bias_act_dt(dt, o->y, L->n_b ? P + L->b_off : NULL, outer, L->out_c, inner, o->relu, s))
        return -1;
    return 0;
}

/* Forward of transposed-conv layer i on x: the patch kernel, or cuDNN's
 * plan with bias and ReLU after. */
static int g_convt_fwd(sf_cuda_net *net, gshape *S, int i, int n, int b, const void *x, cudaStream_t s,
                       cudnnHandle_t h, void *ws)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    const gop *o = &g->op[i];
    const float *P = net->params;
    const sf_dtype dt = g->dt;
    if (o->tpatch) {
        if (sf_convt_patch_fwd(dt, x, g_wd(net, i), L->n_b ? P + L->b_off : NULL, o->y, n, L->in_c, L->in_h,
                               L->in_w, L->out_c, L->k, o->relu, s))
            return -1;
        return 0;
    }
    sf_convt_ptrs p = {(void *)x, g_wd(net, i), o->y, ws};
    if (sf_convt_run(h, &S->tp[i], SF_CONV_FWD, &p))
        return -1;
    if ((L->n_b || o->relu) &&
        sf_convt_bias_act_dt(&S->tp[i].d, o->y, L->n_b ? P + L->b_off : NULL, o->relu, s))
        return -1;
    return 0;
}

/* Forward of batchnorm layer i on x: on the running statistics when frozen
 * or evaluating, otherwise on the batch's (updating the running ones). */
static int g_bn_fwd(sf_cuda_net *net, int i, int n, int b, const void *x, cudaStream_t s, int eval)
{
    gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    gop *o = &g->op[i];
    const float *P = net->params;
    const sf_dtype dt = g->dt;
    /* with bn_add, the add's output: relu?(bn(x) + its other input); with
     * bn_act, the activation's output */
    const int a = o->bn_add;
    const void *res = a ? g_in(net, a, g->op[a].src[0] == i ? 1 : 0, b) : NULL;
    void *y = a ? g->op[a].y : o->y;
    const int act = a ? (g->op[a].relu ? SF_BN_RELU : 0) : o->relu ? SF_BN_RELU : o->bn_act;
    if (o->frozen || eval) {
        if (sf_cuda_bn_fwd_eval_dt(dt, x, n, L->in_c, L->in_h, L->in_w, g->lay, P + L->w_off, P + L->b_off,
                                   L->eps, g->bufs + L->rm_off, g->bufs + L->rv_off, res, y, act, s))
            return -1;
    } else if (g->bn_sums) {
        /* SyncBatchNorm: this rank's sums, their sum over the ranks, then
         * the statistics of all the samples and the same apply (or the
         * maxpool's, bn_pool) as without sync */
        if (sf_cuda_bn_sync_fwd_sums_dt(dt, x, n, L->in_c, L->in_h, L->in_w, g->lay, g->bn_sums, g->scratch, s) ||
            g_bn_sync_reduce(net, L->in_c, s) ||
            sf_cuda_bn_sync_fwd_dt(dt, x, n, L->in_c, L->in_h, L->in_w, g->lay, P + L->w_off, P + L->b_off, L->eps,
                                   L->momentum, g->bn_sums, g->bufs + L->rm_off, g->bufs + L->rv_off, o->save,
                                   o->save + L->out_ch, res, o->bn_pool ? NULL : y, act, s))
            return -1;
    } else if (sf_cuda_bn_fwd_train_dt(dt, x, n, L->in_c, L->in_h, L->in_w, g->lay, P + L->w_off,
                                       P + L->b_off, L->eps, L->momentum, g->bufs + L->rm_off,
                                       g->bufs + L->rv_off, o->save, o->save + L->out_ch, res,
                                       o->bn_pool ? NULL : y, act, g->scratch, s)) {
        return -1;
    }
    return 0;
}

/* Forward of maxpool layer i on x, or in training on the batchnorm + ReLU
 * input it takes over (pre_bn). */
static int g_maxpool_fwd(sf_cuda_net *net, int i, int n, int b, const void *x, cudaStream_t s, int eval)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    const sf_layer *L = &m->layers[i];
    gop *o = &g->op[i];
    const float *P = net->params;
    const sf_dtype dt = g->dt;
    if (o->pre_bn && !o->frozen && !eval) { /* the batchnorm + ReLU before it, on its taps */
        const int bi = o->pre_bn - 1;
        const sf_layer *BL = &m->layers[bi];
        const sf_pool_pre_bn pre = {g->op[bi].save, g->op[bi].save + BL->out_ch, P + BL->w_off, P + BL->b_off};
        if (sf_cuda_maxpool_fwd_dt(dt, g_in(net, bi, 0, b), n, L->in_c, L->in_h, L->in_w, L->k, L->stride,
                                   L->pad, L->ceil_mode, g->lay, o->y, o->argmax, &pre, s))
            return -1;
    } else if (sf_cuda_maxpool_fwd_dt(dt, x, n, L->in_c, L->in_h, L->in_w, L->k, L->stride, L->pad,
                                      L->ceil_mode, g->lay, o->y, o->argmax, NULL, s))
        return -1;
    return 0;
}

/* Forward of layers [from, to) of buffer b for n samples on stream s with
 * handle h (workspace ws), a profile mark after each layer when pf is set. */
/* Forward of norm layer i (layernorm2d, layernorm, groupnorm; affine or not,
 * with a bias or without):
 * the means saved in o->save, the reciprocal deviations max_batch positions
 * (layer norms) or max_batch * groups (groupnorm) later; grn's norms and
 * divisors (sf_cuda_grn_save_floats). */
static int g_norm_fwd(sf_cuda_net *net, int i, int n, const void *x, cudaStream_t s)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    const gop *o = &g->op[i];
    const float *P = net->params;
    const size_t hw = (size_t)L->in_h * L->in_w;
    if (L->kind == SF_L_GRN)
        return sf_cuda_grn_fwd_dt(g->dt, g->lay, x, n, L->in_c, hw, P + L->w_off, P + L->b_off, L->eps, o->y, o->save,
                                  s);
    if (L->kind == SF_L_GROUPNORM)
        return sf_cuda_groupnorm_fwd_dt(g->dt, g->lay, x, n, L->in_c, hw, L->groups, L->n_w ? P + L->w_off : NULL,
                                        L->n_b ? P + L->b_off : NULL, L->eps, o->y, o->save,
                                        o->save + (size_t)net->cfg.max_batch * L->groups, s);
    return sf_cuda_layernorm_fwd_dt(g->dt, x, n, L->in_c, hw, g_lay_of(g, i), P + L->w_off,
                                    L->n_b ? P + L->b_off : NULL, L->eps,
                                    o->y, o->save, o->save + (size_t)net->cfg.max_batch * hw, s);
}

/* The layers whose fp32 parameters an executor file of their own runs
 * (executor_prelu.cu, executor_channel_conv1d.cu, executor_scale_shift.cu):
 * forward on x, and backward into dx (NULL: not wanted) with their
 * parameters' gradients through the compute-stream scratch. */
static int g_own_params_fwd(sf_cuda_net *net, int i, int n, const void *x, cudaStream_t s)
{
    switch (net->m.layers[i].kind) {
    case SF_L_PRELU: return g_prelu_fwd(net, i, n, x, s);
    case SF_L_CHANNEL_CONV1D: return g_channel_conv1d_fwd(net, i, n, x, s);
    default: return g_scale_shift_fwd(net, i, n, x, s); /* layer_scale, scale_shift */
    }
}

static int g_own_params_bwd(sf_cuda_net *net, int i, int b, int n, void *dx, cudaStream_t s)
{
    switch (net->m.layers[i].kind) {
    case SF_L_PRELU: return g_prelu_bwd(net, i, b, n, dx, s);
    case SF_L_CHANNEL_CONV1D: return g_channel_conv1d_bwd(net, i, b, n, dx, s);
    default: return g_scale_shift_bwd(net, i, b, n, dx, s); /* layer_scale, scale_shift */
    }
}

static int g_forward(sf_cuda_net *net, gshape *S, int from, int to, int n, int b, cudaStream_t s,
                     cudnnHandle_t h, void *ws, prof *pf, int eval)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    const float *P = net->params;
    const sf_dtype dt = g->dt;
    for (int i = from; i < to; i++) {
        const sf_layer *L = &m->layers[i];
        gop *o = &g->op[i];
        if (o->fused)
            continue;
        const void *x = g_in(net, i, 0, b);
        size_t outer, inner;
        switch (L->kind) {
        case SF_L_CONV2D:
            if (g_conv_fwd(net, S, i, n, b, x, s, h))
                return -1;
            break;
        case SF_L_CONV_TRANSPOSE2D:
            if (g_convt_fwd(net, S, i, n, b, x, s, h, ws))
                return -1;
            break;
        case SF_L_LINEAR: /* over features (hw = 1), per pixel over a map's channels, or per token */
            if (S->lt[i][0]) { /* one GEMM over the n * out_h * out_w rows, the bias inside */
                const int rc = g_lt_linear_fwd(net, S, i, 0, x, n * L->out_h * L->out_w, L->in_c, L->out_c, o->y, s);
                if (rc < 0)
                    return -1;
                break;
            }
            if (sf_linear_map_fwd_dt(net->blas, dt, g_lay_of(g, i), x, n, (size_t)L->out_h * L->out_w, L->in_c,
                                     g_wd(net, i), L->out_c, o->y, net->cfg.tf32))
                return -1;
            g_view_of(g, i, n, (size_t)L->out_h * L->out_w, &outer, &inner);
            if ((L->n_b || o->relu) &&
                sf_cuda_bias_act_dt(dt, o->y, L->n_b ? P + L->b_off : NULL, outer, L->out_c, inner, o->relu, s))
                return -1;
            break;
        case SF_L_LAYERNORM2D:
        case SF_L_LAYERNORM:
        case SF_L_GROUPNORM:
        case SF_L_GRN:
            if (g_norm_fwd(net, i, n, x, s))
                return -1;
            break;
        case SF_L_RELU:
            if (sf_cuda_relu_fwd_dt(dt, x, o->y, (size_t)n * L->out_elems, s))
                return -1;
            break;
        case SF_L_BATCHNORM2D:
            if (g_bn_fwd(net, i, n, b, x, s, eval))
                return -1;
            break;
        case SF_L_MAXPOOL2D:
            if (g_maxpool_fwd(net, i, n, b, x, s, eval))
                return -1;
            break;
        case SF_L_GLOBAL_AVGPOOL:
            if (sf_cuda_avgpool_fwd_dt(dt, x, n, L->in_c, L->in_h, L->in_w, g->lay, o->y, s))
                return -1;
            break;
        case SF_L_AVGPOOL2D:
            if (sf_cuda_avgpool2d_fwd_dt(dt, x, n, L->in_c, L->in_h, L->in_w, L->k, L->stride, L->pad, L->ceil_mode,
                                         L->count_include_pad, g->lay, o->y, s))
                return -1;
            break;
        case SF_L_ADAPTIVE_AVGPOOL2D:
            if (sf_cuda_adaptive_avgpool_fwd_dt(dt, x, n, L->in_c, L->in_h, L->in_w, L->out_h, L->out_w, g->lay, o->y,
                                                s))
                return -1;
            break;
        case SF_L_ADD:
            if (!o->in_bn && sf_cuda_add_dt(dt, x, g_in(net, i, 1, b), o->y, (size_t)n * L->out_elems, o->relu, s))
                return -1;
            break;
        case SF_L_MUL:
            if (sf_cuda_mul_fwd_dt(dt, g->lay, x, g_in(net, i, 1, b), o->y, n, L->out_ch, (size_t)L->out_h * L->out_w,
                                   g_mul_bcast(m, i), s))
                return -1;
            break;
        case SF_L_PRELU:
        case SF_L_CHANNEL_CONV1D:
        case SF_L_LAYER_SCALE:
        case SF_L_SCALE_SHIFT:
            if (g_own_params_fwd(net, i, n, x, s))
                return -1;
            break;
        case SF_L_DROPOUT:
        case SF_L_DROPOUT2D:
        case SF_L_STOCHASTIC_DEPTH:
            if (g_dropout_fwd(net, i, n, b, x, s, eval))
                return -1;
            break;
        case SF_L_TO_TOKENS:
        case SF_L_TO_MAP:
        case SF_L_CLASS_TOKEN:
        case SF_L_POS_EMBEDDING:
        case SF_L_SELECT_TOKEN:
        case SF_L_TOKEN_MEAN:
        case SF_L_TRANSPOSE_TOKENS:
            if (g_tokens_fwd(net, i, n, x, s))
                return -1;
            break;
        case SF_L_SELF_ATTENTION:
            if (g_attention_fwd(net, S, i, n, x, ws, s))
                return -1;
            break;
        case SF_L_CONCAT:
            for (int j = 0, c0 = 0; j < o->n_in; c0 += g_in_c(m, i, j), j++)
                if (sf_cuda_concat_put_dt(dt, g->lay, g_in(net, i, j, b), n, g_in_c(m, i, j),
                                          (size_t)L->out_h * L->out_w, L->out_ch, c0, o->y, s))
                    return -1;
            break;
        case SF_L_LOG_SOFTMAX: /* flat features: the same in either layout */
            if (sf_cuda_log_softmax_fwd_dt(dt, x, o->y, n, L->out_ch, s))
                return -1;
            break;
        default:
            if (g_is_move(L->kind)) { /* executor_moves.cu */
                if (g_moves_fwd(net, i, n, x, s))
                    return -1;
                break;
            }
            /* the activations (g_is_act); flatten, a view, runs nothing */
            if (!g_is_act(L->kind))
                continue;
            if (sf_cuda_act_fwd_dt(dt, g_act_kind(L), g_act_prm(L), x, o->y, (size_t)n * L->out_elems, s))
                return -1;
            break;
        }
        g_mark(pf, s, "fwd", sf_layer_kind_name(L->kind), i);
    }
    return 0;
}

/* Backward of norm layer i from its saved statistics: dx (NULL: not wanted)
 * and its parameters' gradients. A layer norm whose input another layer
 * also reads (add0: a transformer's residual stream) adds into that input's
 * gradient in its own pass (dx_add); groupnorm leaves the add to the caller. */
static int g_norm_bwd(sf_cuda_net *net, int i, int b, int n, void *dx, int add0, cudaStream_t s)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    const gop *o = &g->op[i];
    const size_t hw = (size_t)L->in_h * L->in_w;
    /* NULL: a groupnorm without affine has no parameters */
    const float *gamma = L->n_w ? net->params + L->w_off : NULL;
    float *dga = L->n_w ? net->grads + L->w_off : NULL, *dbe = L->n_b ? net->grads + L->b_off : NULL;
    if (L->kind == SF_L_GRN) /* as groupnorm, the add left to the caller */
        return sf_cuda_grn_bwd_dt(g->dt, g->lay, g_in(net, i, 0, b), o->dy, n, L->in_c, hw, gamma, o->save, dx, dga,
                                  dbe, g->scratch, s);
    if (L->kind == SF_L_GROUPNORM)
        return sf_cuda_groupnorm_bwd_dt(g->dt, g->lay, g_in(net, i, 0, b), o->dy, n, L->in_c, hw, L->groups, gamma,
                                        o->save, o->save + (size_t)net->cfg.max_batch * L->groups, dx, dga, dbe,
                                        g->scratch, s);
    return sf_cuda_layernorm_bwd_dt(g->dt, g_in(net, i, 0, b), o->dy, n, L->in_c, hw, g_lay_of(g, i), gamma, o->save,
                                    o->save + (size_t)net->cfg.max_batch * hw, dx && add0 ? g_owner_dy(net, i, 0) : dx,
                                    dx && add0, dga, dbe, g->scratch, s);
}

static int g_add_back(sf_cuda_net *net, int i, int j, size_t len, cudaStream_t s)
{
    void *d = g_owner_dy(net, i, j);
    return sf_cuda_add_dt(net->g->dt, d, net->g->op[i].gtmp, d, len, 0, s);
}

/* Backward of conv layer i: backward-filter and backward-data both only read
 * dy (and x, w). Unless cfg.no_fork the filter gradient runs on the side stream
 * (its own workspace, ws2) while the data gradient runs here, and the two join
 * before the next layer's backward starts. Each direction runs cuDNN's plan or,
 * where gshape.dw says so, the depthwise kernel (conv_dw.h; the filter
 * gradient's partial sums in the compute-stream scratch, which nothing else
 * uses until the join). dx: the data gradient's destination, NULL: none;
 * where S->acc[i], the plan adds it into the input's owner's gradient
 * instead (gop.vpa), and dx is not written. */
static int g_conv_bwd(sf_cuda_net *net, gshape *S, int i, int b, int n, void *dx)
{
    gop *o = &net->g->op[i];
    cudaStream_t s = net->s;
    const int want_dx = dx != NULL;
    const int fork = !net->cfg.no_fork && want_dx;
    if (fork) {
        SF_CUDA_CHECK(cudaEventRecord(net->ev_fork[i], s));
        SF_CUDA_CHECK(cudaStreamWaitEvent(net->side, net->ev_fork[i], 0));
        SF_CUDNN_CHECK(cudnnSetStream(net->dnn, net->side));
    }
    int rc;
    if (S->dw[i] & (1u << SF_CONV_BWD_FILTER)) { /* depthwise kernel (conv_dw.h), into the gradient cuDNN would write */
        const sf_conv_ptrs p = {g_in(net, i, 0, b), o->wal_gw ? o->wal_gw : g_gd(net, i), o->dy, NULL, NULL};
        rc = g_conv_dw_run(net, i, n, SF_CONV_BWD_FILTER, &p, fork ? net->side : s);
    } else {
        rc = sf_conv_run(net->dnn, &S->cp[i][SF_CONV_BWD_FILTER], o->vp[SF_CONV_BWD_FILTER][b]);
    }
    if (fork) {
        SF_CUDNN_CHECK(cudnnSetStream(net->dnn, s));
        if (!rc)
            SF_CUDA_CHECK(cudaEventRecord(net->ev_join[i], net->side));
    }
    if (rc)
        return -1;
    if (want_dx && (S->dw[i] & (1u << SF_CONV_BWD_DATA))) {
        const sf_conv_ptrs p = {dx, g_wd(net, i), o->dy, NULL, NULL};
        if (g_conv_dw_run(net, i, n, SF_CONV_BWD_DATA, &p, s))
            return -1;
    } else if (want_dx && sf_conv_run(net->dnn, &S->cp[i][SF_CONV_BWD_DATA],
                                      S->acc[i] ? o->vpa[b] : o->vp[SF_CONV_BWD_DATA][b])) {
        return -1;
    }
    if (fork)
        SF_CUDA_CHECK(cudaStreamWaitEvent(s, net->ev_join[i], 0));
    return 0;
}


/* The loss of buffer b's n samples from the last layer's output: fp32
 * logits (bf16 nets: cast into lg), the cross-entropy into io[b].result, and
 * when dlog_out is set the logits' gradient into the last layer's dy (bf16:
 * through dlg). */
static int g_loss(sf_cuda_net *net, int b, int n, int want_grad)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    cudaStream_t s = net->s;
    const sf_dtype dt = g->dt;
    const int last = g->nl - 1;
    const size_t nlog = (size_t)n * m->n_classes * (m->segmentation ? (size_t)m->out_h * m->out_w : 1);
    const float *logits = (const float *)g_act(net, last, b, 0);
    float *dlog = want_grad ? (float *)g->op[last].dy : NULL;
    if (dt != SF_DT_F32) {
        if (sf_cuda_cast(logits, dt, g->lg, SF_DT_F32, nlog, s))
            return -1;
        logits = g->lg;
        dlog = want_grad ? g->dlg : NULL;
    }
    const sf_loss_ctl *lc = net->io[b].ctl ? &net->io[b].ctl->loss : NULL;
    if (m->segmentation) {
        if (sf_cuda_xent2d(logits, net->io[b].labels, n, m->n_classes, m->out_h, m->out_w, g->lay, dlog, g->x2d,
                           g->scratch, lc, s))
            return -1;
        k_x2d_out<<<1, 1, 0, s>>>(g->x2d, net->io[b].result);
        SF_CUDA_CHECK(cudaGetLastError());
    } else if (sf_cuda_xent(logits, net->io[b].labels, n, m->n_classes, dlog, net->io[b].result, lc, s)) {
        return -1;
    }
    if (want_grad && dt != SF_DT_F32 && sf_cuda_cast(g->dlg, SF_DT_F32, g->op[last].dy, dt, nlog, s))
        return -1;
    return 0;
}

/* An evaluation step of buffer b: the forward in eval mode (batchnorm on its
 * running statistics, which stay as they are), the loss and hits; nothing
 * else is written but activations, the result and its host copy. */
static int g_eval(sf_cuda_net *net, gshape *S, int b, int n)
{
    if (g_forward(net, S, net->g->nf, net->g->nl, n, b, net->s, net->dnn, net->ws, NULL, 1) ||
        g_loss(net, b, n, 0))
        return -1;
    SF_CUDA_CHECK(cudaMemsetAsync(net->g->d_gs + b, 0, sizeof(sf_grad_state), net->s));
    SF_CUDA_CHECK(cudaMemcpyAsync(net->g->h_gs + b, net->g->d_gs + b, sizeof(sf_grad_state),
                                  cudaMemcpyDeviceToHost, net->s));
    SF_CUDA_CHECK(cudaMemcpyAsync(net->io[b].h_result, net->io[b].result, sizeof(sf_xent_out),
                                  cudaMemcpyDeviceToHost, net->s));
    return 0;
}

/* Backward of conv layer i: the thin or patch kernel, or the bias gradient
 * and cuDNN's filter and data plans (g_conv_bwd), then the weight
 * gradient's copy out of its aligned buffer or space-to-depth layout. */
static int g_conv_layer_bwd(sf_cuda_net *net, gshape *S, int i, int b, int n, const void *ymask, void *dx,
                            cudaStream_t s)
{
    gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    gop *o = &g->op[i];
    const sf_dtype dt = g->dt;
    size_t outer, inner;
    if (o->thin) {
        if (sf_conv_thin_bwd(dt, g->lay, g_in(net, i, 0, b), g_wd(net, i), ymask, o->dy, dx, g_gd(net, i),
                             L->n_b ? net->grads + L->b_off : NULL, n, L->in_c, (size_t)L->in_h * L->in_w,
                             L->out_c, (float *)g->scratch, s))
            return -1;
        return 0;
    }
    if (o->patch) {
        if (sf_conv_patch_bwd(dt, g_in(net, i, 0, b), g_wd(net, i), ymask, o->dy, dx, g_gd(net, i),
                              L->n_b ? net->grads + L->b_off : NULL, n, L->in_c, L->in_h, L->in_w, L->out_c,
                              L->k, (float *)g->scratch, s))
            return -1;
        return 0;
    }
    g_view(g, n, (size_t)L->out_h * L->out_w, &outer, &inner);
    if ((L->n_b || ymask) &&
        sf_cuda_bias_grad_dt(dt, o->dy, ymask, outer, L->out_c, inner, L->n_b ? net->grads + L->b_off : NULL,
                             (float *)g->scratch, s))
        return -1;
    if (g_conv_bwd(net, S, i, b, n, dx))
        return -1;
    if (o->wal_gw)
        SF_CUDA_CHECK(cudaMemcpyAsync(g_gd(net, i), o->wal_gw, g->es * L->n_w, cudaMemcpyDeviceToDevice, s));
    if (o->s2d) {
        sf_conv_desc d;
        g_desc(net, i, n, &d);
        if (sf_conv_s2d_wgrad(&d, o->s2d_gw, g_gd(net, i), s))
            return -1;
    }
    return 0;
}

/* Backward of transposed-conv layer i: bias gradient, then cuDNN's filter
 * and (when wanted) data plans. */
static int g_convt_bwd(sf_cuda_net *net, gshape *S, int i, int b, int n, const void *ymask, void *dx,
                       cudaStream_t s)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    const gop *o = &g->op[i];
    if ((L->n_b || ymask) &&
        sf_convt_bias_grad_dt(&S->tp[i].d, o->dy, ymask, L->n_b ? net->grads + L->b_off : NULL,
                              (float *)g->scratch, s))
        return -1;
    sf_convt_ptrs pw = {g_in(net, i, 0, b), g_gd(net, i), o->dy, net->ws};
    if (sf_convt_run(net->dnn, &S->tp[i], SF_CONV_BWD_FILTER, &pw))
        return -1;
    if (dx) {
        sf_convt_ptrs pd = {dx, g_wd(net, i), o->dy, net->ws};
        if (sf_convt_run(net->dnn, &S->tp[i], SF_CONV_BWD_DATA, &pd))
            return -1;
    }
    return 0;
}

/* Backward of linear layer i: bias gradient, weight gradient and (when
 * wanted) the input's. */
static int g_linear_bwd(sf_cuda_net *net, gshape *S, int i, int b, int n, const void *ymask, void *dx,
                        cudaStream_t s)
{
    gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    gop *o = &g->op[i];
    const sf_dtype dt = g->dt;
    const int tf32 = net->cfg.tf32;
    size_t outer, inner;
    const size_t hw = (size_t)L->out_h * L->out_w;
    const sf_layout ll = g_lay_of(g, i);
    g_view_of(g, i, n, hw, &outer, &inner);
    if ((L->n_b || ymask) &&
        sf_cuda_bias_grad_dt(dt, o->dy, ymask, outer, L->out_c, inner, L->n_b ? net->grads + L->b_off : NULL,
                             (float *)g->scratch, s))
        return -1;
    if (sf_linear_map_bwd_filter_dt(net->blas, dt, ll, g_in(net, i, 0, b), n, hw, L->in_c, o->dy, L->out_c,
                                    net->grads + L->w_off, tf32))
        return -1;
    if (dx && S->ltd[i][0]) /* one GEMM over the n * hw rows, as its forward */
        return g_lt_linear_bwd_data(net, S, i, 0, o->dy, n * (int)hw, L->in_c, L->out_c, dx, s) ? -1 : 0;
    if (dx && sf_linear_map_bwd_data_dt(net->blas, dt, ll, o->dy, n, hw, L->in_c, g_wd(net, i), L->out_c, dx,
                                        tf32))
        return -1;
    return 0;
}

/* Backward of add layer i over in_len elements. */
static int g_add_bwd(sf_cuda_net *net, int i, size_t in_len, cudaStream_t s)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    gop *o = &g->op[i];
    const sf_dtype dt = g->dt;
    /* The (ReLU-masked) gradient goes to both inputs: to the ones this
     * layer writes first in one pass (a ResNet block's add writes both
     * of its inputs' gradients: one pass instead of a mask pass and two
     * copies), then into the ones already written, straight into their
     * owners' gradients (an add has no gtmp: g_dst's scratch is not
     * there for it). An input a later layer also reads (a feature
     * pyramid's or a U-Net's skip taken from a residual block's input)
     * is one of those. */
    if (o->grad_alias) /* its gradient is already both inputs' (g_alias_add) */
        return 0;
    void *cp[2] = {NULL, NULL}, *sum[2] = {NULL, NULL};
    int nc = 0, ns = 0;
    for (int j = 0; j < 2; j++) {
        if (!o->want[j] || j + 1 == o->grad_shared) /* its owner reads the other's (gop.dy_of) */
            continue;
        void *d = g->op[g_owner(m, o->src[j])].dy;
        if (o->first[j])
            cp[nc++] = d;
        else
            sum[ns++] = d;
    }
    const void *src = o->dy;
    if (nc || o->relu) {
        void *d0 = nc ? cp[0] : o->dy;
        if (sf_cuda_grad_fork_dt(dt, o->relu ? o->y : NULL, o->dy, d0, cp[1], in_len, s))
            return -1;
        src = d0;
    }
    for (int k = 0; k < ns; k++)
        if (sf_cuda_add_dt(dt, sum[k], src, sum[k], in_len, 0, s))
            return -1;
    return 0;
}

/* Backward of mul layer i; add0: whether dx is added back into its owner's. */
static int g_mul_bwd(sf_cuda_net *net, int i, int b, int n, void *dx, int add0, size_t in_len,
                     cudaStream_t s)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    const sf_layer *L = &m->layers[i];
    gop *o = &g->op[i];
    const sf_dtype dt = g->dt;
    /* input 0's gradient is added into its owner's before input 1's
     * may take gtmp (x * x reads one tensor twice) */
    const void *xa = g_in(net, i, 0, b), *xb = g_in(net, i, 1, b);
    const size_t hw = (size_t)L->out_h * L->out_w;
    const int bc = g_mul_bcast(m, i);
    int add1 = 0;
    void *d1 = g_dst(net, i, 1, &add1);
    if ((dx && (sf_cuda_mul_bwd_dt(dt, g->lay, xa, xb, o->dy, dx, NULL, n, L->out_ch, hw, bc, s) ||
                (add0 && g_add_back(net, i, 0, in_len, s)))) ||
        (d1 && (sf_cuda_mul_bwd_dt(dt, g->lay, xa, xb, o->dy, NULL, d1, n, L->out_ch, hw, bc, s) ||
                (add1 && g_add_back(net, i, 1, (size_t)n * g_in_elems(m, i, 1), s)))))
        return -1;
    return 0;
}

/* Backward of concat layer i. */
static int g_concat_bwd(sf_cuda_net *net, int i, int n, cudaStream_t s)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    const sf_layer *L = &m->layers[i];
    gop *o = &g->op[i];
    const sf_dtype dt = g->dt;
    /* each input's slice of dy, one input after another (gtmp is shared) */
    for (int j = 0, c0 = 0; j < o->n_in; c0 += g_in_c(m, i, j), j++) {
        int addj = 0;
        void *d = g_dst(net, i, j, &addj);
        const int cj = g_in_c(m, i, j), r = o->src[j];
        const size_t hw = (size_t)L->out_h * L->out_w;
        const int masked = r >= 0 && g->op[r].fused && g->op[g->op[r].src[0]].cat_mask;
        if (d && ((masked ? sf_cuda_concat_take_masked_dt(dt, g->lay, o->dy, o->y, n, cj, hw, L->out_ch, c0, d, s)
                          : sf_cuda_concat_take_dt(dt, g->lay, o->dy, n, cj, hw, L->out_ch, c0, d, s)) ||
                  (addj && g_add_back(net, i, j, (size_t)n * cj * hw, s))))
            return -1;
    }
    return 0;
}

/* Batchnorm layer i's backward into bdx (its own gtmp when nothing reads
 * dx: the kernels write it either way). */
static int g_bn_bwd(sf_cuda_net *net, int i, int b, int n, const void *ymask, void *bdx, cudaStream_t s)
{
    gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    const gop *o = &g->op[i];
    const float *P = net->params;
    const sf_dtype dt = g->dt;
    const void *bx = g_in(net, i, 0, b);
    if (g->bn_sums && !o->frozen) {
        /* SyncBatchNorm: dgamma and dbeta are this rank's sums (the buckets
         * add the ranks' as any weight gradient's); dx takes the sums of
         * every rank */
        if (sf_cuda_bn_sync_bwd_sums_dt(dt, bx, n, L->in_c, L->in_h, L->in_w, g->lay, P + L->w_off, P + L->b_off,
                                        o->save, o->save + L->out_ch, o->dy, ymask, bdx, net->grads + L->w_off,
                                        net->grads + L->b_off, g->bn_sums, g->scratch, s) ||
            g_bn_sync_reduce(net, L->in_c, s) ||
            sf_cuda_bn_sync_bwd_dx_dt(dt, bx, n, L->in_c, L->in_h, L->in_w, g->lay, P + L->w_off, P + L->b_off,
                                      o->save, o->save + L->out_ch, o->dy, ymask, bdx, g->bn_sums, g->scratch, s))
            return -1;
        return 0;
    }
    if (o->bn_act) { /* the fused activation's derivative taken from x */
        if (sf_cuda_bn_bwd_act_dt(dt, bx, n, L->in_c, L->in_h, L->in_w, g->lay, P + L->w_off, P + L->b_off, o->save,
                                  o->save + L->out_ch, o->dy, o->bn_act, bdx, net->grads + L->w_off,
                                  net->grads + L->b_off, g->scratch, s))
            return -1;
        return 0;
    }
    if (sf_cuda_bn_bwd_dt(dt, bx, n, L->in_c, L->in_h, L->in_w, g->lay, P + L->w_off, P + L->b_off, o->save,
                          o->save + L->out_ch, o->dy, ymask, bdx, net->grads + L->w_off, net->grads + L->b_off,
                          g->scratch, s))
        return -1;
    return 0;
}

/* Backward of buffer b's n samples, from the last layer's dy down to the
 * first trainable layer, each layer's gradients reduced or normed as they
 * are complete. */
static int g_backward(sf_cuda_net *net, gshape *S, int b, int n, prof *pf)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    cudaStream_t s = net->s;
    const sf_dtype dt = g->dt;
    const int last = g->nl - 1;
    for (int i = last; i >= g->nf; i--) {
        const sf_layer *L = &m->layers[i];
        gop *o = &g->op[i];
        if (o->fused)
            continue;
        const size_t in_len = (size_t)n * L->in_c * L->in_h * L->in_w;
        const void *ymask = o->relu && !o->cat_mask ? o->y : NULL; /* cat_mask: dy comes masked */
        int add0 = 0;
        void *dx = g_dst(net, i, 0, &add0);
        switch (L->kind) {
        case SF_L_CONV2D:
            if (g_conv_layer_bwd(net, S, i, b, n, ymask, dx, s))
                return -1;
            add0 = add0 && !S->acc[i]; /* the plan added it into the owner's gradient */
            break;
        case SF_L_CONV_TRANSPOSE2D:
            if (g_convt_bwd(net, S, i, b, n, ymask, dx, s))
                return -1;
            break;
        case SF_L_LINEAR:
            if (g_linear_bwd(net, S, i, b, n, ymask, dx, s))
                return -1;
            break;
        case SF_L_LAYERNORM2D:
        case SF_L_LAYERNORM:
        case SF_L_GROUPNORM:
        case SF_L_GRN:
            if (g_norm_bwd(net, i, b, n, dx, add0, s))
                return -1;
            add0 = add0 && (L->kind == SF_L_GROUPNORM || L->kind == SF_L_GRN);
            break;
        case SF_L_RELU:
            if (dx && sf_cuda_relu_bwd_dt(dt, o->y, o->dy, dx, in_len, s))
                return -1;
            break;
        case SF_L_BATCHNORM2D:
            if (g_bn_bwd(net, i, b, n, ymask, dx ? dx : o->gtmp, s))
                return -1;
            break;
        case SF_L_MAXPOOL2D:
            if (dx && sf_cuda_maxpool_bwd_dt(dt, o->dy, o->argmax, n, L->in_c, L->in_h, L->in_w, L->k, L->stride,
                                             L->pad, L->ceil_mode, g->lay, dx, s))
                return -1;
            break;
        case SF_L_GLOBAL_AVGPOOL:
            /* a squeeze-and-excitation map's multiply has written its
             * gradient already: added in the pooling's own pass */
            if (dx && (add0 ? sf_cuda_avgpool_bwd_add_dt(dt, o->dy, n, L->in_c, L->in_h, L->in_w, g->lay,
                                                         g_owner_dy(net, i, 0), s)
                            : sf_cuda_avgpool_bwd_dt(dt, o->dy, n, L->in_c, L->in_h, L->in_w, g->lay, dx, s)))
                return -1;
            add0 = 0;
            break;
        case SF_L_AVGPOOL2D:
            if (dx && sf_cuda_avgpool2d_bwd_dt(dt, o->dy, n, L->in_c, L->in_h, L->in_w, L->k, L->stride, L->pad,
                                               L->ceil_mode, L->count_include_pad, g->lay, dx, s))
                return -1;
            break;
        case SF_L_ADAPTIVE_AVGPOOL2D:
            if (dx && sf_cuda_adaptive_avgpool_bwd_dt(dt, o->dy, n, L->in_c, L->in_h, L->in_w, L->out_h, L->out_w,
                                                      g->lay, dx, s))
                return -1;
            break;
        case SF_L_ADD:
            if (g_add_bwd(net, i, in_len, s))
                return -1;
            g_mark(pf, s, "bwd", sf_layer_kind_name(L->kind), i);
            continue;
        case SF_L_MUL:
            if (g_mul_bwd(net, i, b, n, dx, add0, in_len, s))
                return -1;
            add0 = 0;
            break;
        case SF_L_PRELU:
        case SF_L_CHANNEL_CONV1D:
        case SF_L_LAYER_SCALE:
        case SF_L_SCALE_SHIFT:
            if (g_own_params_bwd(net, i, b, n, dx, s))
                return -1;
            break;
        case SF_L_DROPOUT:
        case SF_L_DROPOUT2D:
        case SF_L_STOCHASTIC_DEPTH: /* the forward's mask, drawn again, on dy */
            if (dx && sf_cuda_dropout_dt(dt, g_drop_lay(g, i), o->dy, dx, n, L->out_ch, (size_t)L->out_h * L->out_w,
                                         L->p, net->cfg.drop_seed, g_seq(net, b), (uint64_t)i, g_drop_unit(L), s))
                return -1;
            break;
        case SF_L_TO_TOKENS:
        case SF_L_TO_MAP:
        case SF_L_CLASS_TOKEN:
        case SF_L_POS_EMBEDDING:
        case SF_L_SELECT_TOKEN:
        case SF_L_TOKEN_MEAN:
        case SF_L_TRANSPOSE_TOKENS:
            if (g_tokens_bwd(net, i, n, dx, in_len, s))
                return -1;
            break;
        case SF_L_SELF_ATTENTION:
            if (g_attention_bwd(net, S, i, b, n, dx, s))
                return -1;
            break;
        case SF_L_CONCAT:
            if (g_concat_bwd(net, i, n, s))
                return -1;
            add0 = 0;
            break;
        case SF_L_LOG_SOFTMAX:
            if (dx && sf_cuda_log_softmax_bwd_dt(dt, g_in(net, i, 0, b), o->dy, dx, n, L->out_ch, s))
                return -1;
            break;
        default:
            if (g_is_move(L->kind)) {
                if (dx && g_moves_bwd(net, i, n, dx, s))
                    return -1;
                break;
            }
            /* the activations (g_is_act); no other kind has a backward */
            if (!g_is_act(L->kind))
                continue;
            const void *ax = g_act_reads_x(L->kind) ? g_in(net, i, 0, b) : o->dy; /* affine keeps no x */
            if (dx && sf_cuda_act_bwd_dt(dt, g_act_kind(L), g_act_prm(L), ax, o->dy, dx, in_len, s))
                return -1;
            break;
        }
        if (dx && add0 && g_add_back(net, i, 0, in_len, s))
            return -1;
        g_mark(pf, s, "bwd", sf_layer_kind_name(L->kind), i);
        if (!g->gacc && (net->cfg.grad_reduce ? g_reduce_bucket(net, b, i) : g_norm_layer(net, i)))
            return -1;
    }
    return 0;
}

/* A training step of buffer b's n samples: forward, loss and backward, then
 * the step's end (g_opt_tail: the gradient check, accumulation and, with
 * do_opt, the optimizer). */
static int g_step(sf_cuda_net *net, gshape *S, int b, int n, int do_opt, prof *pf)
{
    gen_net *g = net->g;
    cudaStream_t s = net->s;
    if (g_forward(net, S, g->nf, g->nl, n, b, s, net->dnn, net->ws, pf, 0))
        return -1;
    /* loss, in fp32 */
    if (g_loss(net, b, n, 1))
        return -1;
    g_mark(pf, s, "loss", "", -1);
    if (g_backward(net, S, b, n, pf))
        return -1;
    return g_opt_tail(net, b, do_opt, 1, pf);
}

/* k: do_opt (0, 1) for a training step, 2 for an evaluation step. */
static int g_capture(sf_cuda_net *net, gshape *S, int b, int n, int k)
{
    cudaGraph_t gr = NULL;
    SF_CUDA_CHECK(cudaStreamBeginCapture(net->s, cudaStreamCaptureModeThreadLocal));
    int rc = k == 2 ? g_eval(net, S, b, n) : g_step(net, S, b, n, k, NULL);
    char msg[SF_CUDA_ERR_LEN];
    sf_scopy(msg, sizeof msg, sf_cuda_last_error());
    cudaError_t e = cudaStreamEndCapture(net->s, &gr);
    if (rc != 0 || e != cudaSuccess) {
        if (gr)
            cudaGraphDestroy(gr);
        cudaGetLastError();
        sf_cuda_set_error("%s:%d: graph capture of the step failed: %s", __FILE__, __LINE__,
                          rc ? msg : cudaGetErrorString(e));
        return -1;
    }
    /* Each kernel keeps the priority of the stream it was captured from (the
     * norm stream's lowest, the reduce stream's highest) instead of all
     * running at the launch stream's. */
    e = cudaGraphInstantiate(&S->exec[b][k], gr, cudaGraphInstantiateFlagUseNodePriority);
    cudaGraphDestroy(gr);
    if (e != cudaSuccess) {
        S->exec[b][k] = NULL;
        sf_cuda_set_error("%s:%d: cudaGraphInstantiate: %s", __FILE__, __LINE__, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

/* sf_net_create's general half: after sf_exec_build_graph. */
static int g_finish_create(sf_cuda_net *net)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    const size_t nb = (size_t)net->cfg.max_batch;
    cudaStream_t s = net->s;
    float *hp = (float *)malloc(sizeof(float) * (m->n_params ? m->n_params : 1) + sizeof(float) * (m->n_buffers + 1));
    const sf_dtype dt = g->dt;
    if (!hp) {
        sf_cuda_set_error("%s:%d: out of host memory", __FILE__, __LINE__);
        return -1;
    }
    sf_model_init_params(m, net->cfg.seed, hp);
    if (sf_net_set_params(net, hp)) {
        free(hp);
        return -1;
    }
    sf_model_init_buffers(m, hp);
    SF_CUDA_CHECK(cudaMemcpyAsync(g->bufs, hp, sizeof(float) * m->n_buffers, cudaMemcpyHostToDevice, s));
    SF_CUDA_CHECK(cudaStreamSynchronize(s));
    free(hp);
    for (int b = 0; b < net->cfg.nbuf; b++)
        if (sf_cuda_fill_random_dt(dt, net->io[b].x, nb * m->in_c * m->in_h * m->in_w, 6 + 16 * b, 1.f, s) ||
            (g->bnd[b] && sf_cuda_fill_random_dt(dt, g->bnd[b], nb * g->bnd_elems, 7 + 16 * b, 1.f, s)))
            return -1;
    /* Plans are chosen before the arenas exist, on one temporary block that
     * holds the candidates' workspace and two stand-ins on which every
     * convolution is timed (its input or input gradient, and its output or
     * output gradient), so the process's peak device memory is the larger of
     * this phase and the steady state, not their sum. The candidates may use
     * twice the largest activation tensor of workspace, between WS_TUNE_MIN
     * and WS_TUNE_MAX and at most 1/16 of free memory: ResNet-18's stem at
     * batch 1024, run as it is (executor switch no_s2d), runs best on an
     * engine that wants about 820 MB (with 512 MiB it ran at 571 samples/s
     * instead of 21k); W1's engines want at most 201 MB. That bound is the
     * plans' preferred workspace (sf_conv_desc.ws_prefer); a plan may use up
     * to twice the largest conv input or output, at most WS_WIDE_MAX and 1/16
     * of free memory, when it times SF_CONV_WIDE_GAIN faster than every plan
     * within it: VGG-11's 64->128 3x3 at 112x112, batch 256, has tensor-core
     * engines only above 1 GiB. */
    size_t in_max = 0, out_max = 0;
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &m->layers[i];
        if (L->kind != SF_L_CONV2D && L->kind != SF_L_CONV_TRANSPOSE2D)
            continue;
        size_t ib = (g->es * nb * L->in_c * L->in_h * L->in_w + 255) & ~(size_t)255;
        if (g->op[i].s2d) {
            sf_conv_desc d;
            g_desc(net, i, (int)nb, &d);
            const size_t sb = (g->es * sf_conv_s2d_x_elems(&d) + 255) & ~(size_t)255;
            if (sb > ib)
                ib = sb;
        }
        const size_t ob = (g->es * nb * L->out_elems + 255) & ~(size_t)255;
        if (ib > in_max)
            in_max = ib;
        if (ob > out_max)
            out_max = ob;
    }
    size_t tune_bytes = 2 * g->es * nb * m->max_act, fr = 0, tot = 0;
    if (tune_bytes < WS_TUNE_MIN)
        tune_bytes = WS_TUNE_MIN;
    if (tune_bytes > WS_TUNE_MAX)
        tune_bytes = WS_TUNE_MAX;
    const int have_free = cudaMemGetInfo(&fr, &tot) == cudaSuccess && fr / 16 >= WS_TUNE_MIN;
    if (have_free && tune_bytes > fr / 16)
        tune_bytes = fr / 16;
    size_t wide_bytes = 2 * (in_max > out_max ? in_max : out_max);
    if (wide_bytes > WS_WIDE_MAX)
        wide_bytes = WS_WIDE_MAX;
    if (have_free && wide_bytes > fr / 16)
        wide_bytes = fr / 16;
    if (wide_bytes < tune_bytes)
        wide_bytes = tune_bytes;
    char *tmp = NULL;
    if (cudaMalloc((void **)&tmp, in_max + out_max + wide_bytes) != cudaSuccess) {
        cudaGetLastError();
        tune_bytes = wide_bytes = WS_TUNE_MIN;
        SF_CUDA_CHECK(cudaMalloc((void **)&tmp, in_max + out_max + wide_bytes));
    }
    g->ws_prefer = tune_bytes;
    gshape *S = NULL;
    const timing_ptrs tp = {tmp, tmp + in_max};
    void *const tws[3] = {tmp + in_max + out_max, tmp + in_max + out_max, tmp + in_max + out_max};
    const size_t tlim[3] = {wide_bytes, wide_bytes, wide_bytes};
    int rc = g_scratch_check(net, net->cfg.max_batch) ? -1 : g_build_shape(net, net->cfg.max_batch, tws, tlim, &tp, &S);
    cudaFree(tmp);
    if (rc)
        return -1;
    if (sf_exec_alloc_arenas(net)) {
        gshape_destroy(S);
        return -1;
    }
    if ((g->arena && sf_cuda_fill_random_dt(dt, g->arena, g->arena_bytes / g->es, 8, 1.f, s)) ||
        (g->farena && sf_cuda_fill_random_dt(dt, g->farena, g->farena_bytes / g->es, 9, 1.f, s))) {
        gshape_destroy(S);
        return -1;
    }
    /* Each workspace holds what its plans chose; the compute stream's also
     * keeps WS_MIN_BYTES of slack for the plans of other batch sizes (the
     * others' plans for a new size are chosen among the engines that fit
     * what is there). The side stream's exists only with fork, the frozen
     * prefix's only with frozen layers. */
    size_t need[3];
    g_shape_ws(net, S, need);
    for (int k = 0; k < 3; k++) {
        const size_t floor = k == WS_MAIN ? WS_MIN_BYTES : WS_SMALL_BYTES;
        net->ws_size[k] = need[k] > floor ? need[k] : floor;
    }
    if (dmalloc(net, &net->ws, net->ws_size[WS_MAIN]) ||
        (!net->cfg.no_fork && dmalloc(net, &net->ws2, net->ws_size[WS_SIDE])) ||
        (g->nf > 0 && dmalloc(net, &g->fws, net->ws_size[WS_FROZEN]))) {
        gshape_destroy(S);
        return -1;
    }
    g->shapes[g->n_shapes++] = S;
    if (g_vpacks(net))
        return -1;
    SF_CUDA_CHECK(cudaStreamSynchronize(s));
    return 0;
}

static void g_destroy(sf_cuda_net *net)
{
    gen_net *g = net->g;
    if (!g)
        return;
    cudaDeviceSynchronize();
    free(g->plan);
    if (g->h_gs)
        cudaFreeHost(g->h_gs);
    if (g->h_ar)
        cudaFreeHost(g->h_ar);
    for (int i = 0; i < g->n_shapes; i++)
        gshape_destroy(g->shapes[i]);
    for (int i = 0; i < SF_MAX_LAYERS; i++)
        for (int b = 0; b < SF_NET_MAX_BUF; b++) {
            for (int d = 0; d < 3; d++)
                sf_conv_vpack_destroy(g->op[i].vp[d][b]);
            sf_conv_vpack_destroy(g->op[i].vpf[b]);
            sf_conv_vpack_destroy(g->op[i].vpa[b]);
        }
    free(g);
    net->g = NULL;
}

static int g_prepare(sf_cuda_net *net, int n)
{
    gen_net *g = net->g;
    if (g_find(net, n))
        return 0;
    if (g->n_shapes >= SF_NET_MAX_SHAPES) {
        sf_cuda_set_error("%s:%d: more than %d distinct batch sizes", __FILE__, __LINE__, SF_NET_MAX_SHAPES);
        return -1;
    }
    if (g_scratch_check(net, n))
        return -1;
    /* Timing runs write activations the transform stream's frozen forward
     * also writes: everything queued finishes first (a new batch size only). */
    SF_CUDA_CHECK(cudaDeviceSynchronize());
    gshape *S;
    void *const ws[3] = {net->ws, net->ws2 ? net->ws2 : net->ws, g->fws ? g->fws : net->ws};
    if (g_build_shape(net, n, ws, net->ws_size, NULL, &S))
        return -1;
    size_t need[3];
    g_shape_ws(net, S, need);
    if (need[0] > net->ws_size[0] || need[1] > net->ws_size[1] || need[2] > net->ws_size[2]) {
        gshape_destroy(S);
        sf_cuda_set_error("%s:%d: batch size %d: plans need more workspace", __FILE__, __LINE__, n);
        return -1;
    }
    SF_CUDA_CHECK(cudaDeviceSynchronize());
    g->shapes[g->n_shapes++] = S;
    return 0;
}

/* k: do_opt (0, 1) for a training step, 2 for an evaluation step. */
static int g_step_public(sf_cuda_net *net, int b, int n, int graph, int k)
{
    gen_net *g = net->g;
    gshape *S = g_find(net, n);
    if (!S || b < 0 || b >= net->cfg.nbuf) {
        sf_cuda_set_error("%s:%d: sf_net_step: batch size %d not prepared or buffer %d", __FILE__, __LINE__, n, b);
        return -1;
    }
    if (g->has_bn_train && k != 2)
        g->nbt++;
    if (graph && !net->graphs_broken) {
        if (!S->exec[b][k] && g_capture(net, S, b, n, k)) {
            net->graphs_broken = 1;
            sf_scopy(net->graph_err, sizeof net->graph_err, sf_cuda_last_error());
        }
        if (S->exec[b][k]) {
            SF_CUDA_CHECK(cudaGraphLaunch(S->exec[b][k], net->s));
            return 0;
        }
    }
    return k == 2 ? g_eval(net, S, b, n) : g_step(net, S, b, n, k, NULL);
}

static int g_frozen_fwd(sf_cuda_net *net, int b, int n, cudaStream_t ts)
{
    gen_net *g = net->g;
    if (g->nf == 0)
        return 0;
    gshape *S = g_find(net, n);
    if (!S || b < 0 || b >= net->cfg.nbuf) {
        sf_cuda_set_error("%s:%d: sf_net_frozen_fwd: batch size %d not prepared or buffer %d", __FILE__, __LINE__,
                          n, b);
        return -1;
    }
    /* The net's handle, moved to the transform stream for the frozen layers
     * (one thread enqueues both streams; the compute stream gets it back). */
    SF_CUDNN_CHECK(cudnnSetStream(net->dnn, ts));
    int rc = g_forward(net, S, 0, g->nf, n, b, ts, net->dnn, g->fws, NULL, 0);
    SF_CUDNN_CHECK(cudnnSetStream(net->dnn, net->s));
    if (rc)
        return -1;
    SF_CUDA_CHECK(cudaMemcpyAsync(g->bnd[b], g->op[g->nf - 1].y, g->es * (size_t)n * g->bnd_elems,
                                  cudaMemcpyDeviceToDevice, ts));
    return 0;
}

/* ---- public --------------------------------------------------------------- */

extern "C" int sf_net_create(sf_cuda_net **out, const sf_model *m, const sf_net_cfg *cfg,
                             const sf_net_io *io, cudnnHandle_t dnn, const sf_cublas_ctx *blas, cudaStream_t s)
{
    *out = NULL;
    if (cfg->nbuf < 1 || cfg->nbuf > SF_NET_MAX_BUF || cfg->max_batch < 1) {
        sf_cuda_set_error("%s:%d: net: nbuf %d (1..%d), max_batch %d", __FILE__, __LINE__, cfg->nbuf,
                          SF_NET_MAX_BUF, cfg->max_batch);
        return -1;
    }
    sf_cuda_net *net = (sf_cuda_net *)calloc(1, sizeof *net);
    if (!net) {
        sf_cuda_set_error("%s:%d: out of host memory", __FILE__, __LINE__);
        return -1;
    }
    net->m = *m;
    net->cfg = *cfg;
    memcpy(net->io, io, sizeof(sf_net_io) * (size_t)cfg->nbuf);
    net->dnn = dnn;
    net->blas = blas->h;
    net->blas_ctx = *blas;
    net->s = s;
    if (cublasLtCreate(&net->lt) != CUBLAS_STATUS_SUCCESS) {
        sf_cuda_set_error("%s:%d: cublasLtCreate failed", __FILE__, __LINE__);
        net->lt = NULL;
        sf_net_destroy(net);
        return -1;
    }
    /* The side stream (forked backward-filter) shares the compute stream's priority. */
    int prio = 0;
    cudaStreamGetPriority(s, &prio);
    if (cudaStreamCreateWithPriority(&net->side, cudaStreamNonBlocking, prio) != cudaSuccess) {
        sf_cuda_set_error("%s:%d: side stream: %s", __FILE__, __LINE__, cudaGetErrorString(cudaGetLastError()));
        net->side = NULL;
        sf_net_destroy(net);
        return -1;
    }
    /* The gradient check's sums run at the lowest priority (the backend's
     * compute stream is above them), so the backward's kernels go first. */
    int lo = 0, hi = 0;
    cudaDeviceGetStreamPriorityRange(&lo, &hi);
    if (cudaStreamCreateWithPriority(&net->nst, cudaStreamNonBlocking, lo) != cudaSuccess ||
        cudaEventCreateWithFlags(&net->ev_ndone, cudaEventDisableTiming) != cudaSuccess) {
        sf_cuda_set_error("%s:%d: norm stream: %s", __FILE__, __LINE__, cudaGetErrorString(cudaGetLastError()));
        sf_net_destroy(net);
        return -1;
    }
    /* The all-reduce at the device's highest priority, above the compute
     * stream (the backend leaves it that level where the device has one):
     * the collective's thread blocks are dispatched before the backward's
     * next ones, so each bucket's sum ends sooner and the last one, which
     * the update waits for, is less late. */
    if (cfg->grad_reduce && cudaStreamCreateWithPriority(&net->rst, cudaStreamNonBlocking, hi) != cudaSuccess) {
        sf_cuda_set_error("%s:%d: reduce stream: %s", __FILE__, __LINE__, cudaGetErrorString(cudaGetLastError()));
        net->rst = NULL;
        sf_net_destroy(net);
        return -1;
    }
    /* SyncBatchNorm's all-reduces take their turn on the reduce stream */
    if (cfg->stat_reduce &&
        (!net->rst || cudaEventCreateWithFlags(&net->ev_bn_sums, cudaEventDisableTiming) != cudaSuccess ||
         cudaEventCreateWithFlags(&net->ev_bn_reduced, cudaEventDisableTiming) != cudaSuccess)) {
        sf_cuda_set_error("%s:%d: batchnorm sync: %s", __FILE__, __LINE__,
                          net->rst ? cudaGetErrorString(cudaGetLastError()) : "needs grad_reduce");
        sf_net_destroy(net);
        return -1;
    }
    for (int i = 0; i < m->n_layers; i++)
        if ((net->rst && cudaEventCreateWithFlags(&net->ev_reduced[i], cudaEventDisableTiming) != cudaSuccess) ||
            cudaEventCreateWithFlags(&net->ev_fork[i], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&net->ev_join[i], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&net->ev_norm[i], cudaEventDisableTiming) != cudaSuccess) {
            sf_cuda_set_error("%s:%d: events: %s", __FILE__, __LINE__, cudaGetErrorString(cudaGetLastError()));
            sf_net_destroy(net);
            return -1;
        }
    if (sf_exec_build_graph(net) || g_finish_create(net)) {
        sf_net_destroy(net);
        return -1;
    }
    *out = net;
    return 0;
}

extern "C" void sf_net_destroy(sf_cuda_net *net)
{
    if (!net)
        return;
    if (net->s)
        cudaStreamSynchronize(net->s);
    g_destroy(net);
    if (net->lt)
        cublasLtDestroy(net->lt);
    if (net->side) {
        cudaStreamSynchronize(net->side);
        cudaStreamDestroy(net->side);
    }
    if (net->nst) {
        cudaStreamSynchronize(net->nst);
        cudaStreamDestroy(net->nst);
    }
    if (net->rst) {
        cudaStreamSynchronize(net->rst);
        cudaStreamDestroy(net->rst);
    }
    if (net->ev_ndone)
        cudaEventDestroy(net->ev_ndone);
    if (net->ev_bn_sums)
        cudaEventDestroy(net->ev_bn_sums);
    if (net->ev_bn_reduced)
        cudaEventDestroy(net->ev_bn_reduced);
    for (int i = 0; i < SF_MAX_LAYERS; i++) {
        if (net->ev_fork[i])
            cudaEventDestroy(net->ev_fork[i]);
        if (net->ev_join[i])
            cudaEventDestroy(net->ev_join[i]);
        if (net->ev_norm[i])
            cudaEventDestroy(net->ev_norm[i]);
        if (net->ev_reduced[i])
            cudaEventDestroy(net->ev_reduced[i]);
    }
    for (int i = 0; i < net->n_allocs; i++)
        cudaFree(net->allocs[i]);
    free(net);
}

extern "C" sf_layout sf_net_layout(const sf_cuda_net *net) { return net->cfg.layout; }
extern "C" sf_dtype sf_net_dtype(const sf_cuda_net *net) { return net->g->dt; }

extern "C" int sf_net_prepare(sf_cuda_net *net, int n)
{
    if (n < 1 || n > net->cfg.max_batch) {
        sf_cuda_set_error("%s:%d: batch of %d samples (max_batch %d)", __FILE__, __LINE__, n,
                          net->cfg.max_batch);
        return -1;
    }
    return g_prepare(net, n);
}

extern "C" int sf_net_eval(sf_cuda_net *net, int b, int n, int graph) { return g_step_public(net, b, n, graph, 2); }

extern "C" const sf_grad_state *sf_net_grad_state(const sf_cuda_net *net, int b)
{
    return b >= 0 && b < net->cfg.nbuf ? net->g->h_gs + b : NULL;
}

extern "C" double sf_net_allreduce_s(const sf_cuda_net *net, int b)
{
    return b >= 0 && b < net->cfg.nbuf ? (double)net->g->h_ar[b] * 1e-9 : 0.0;
}

extern "C" int sf_net_copy_logits(sf_cuda_net *net, int b, int n, float *host)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    const size_t hw = m->segmentation ? (size_t)m->out_h * m->out_w : 1;
    const size_t nlog = (size_t)n * m->n_classes * hw;
    if (b < 0 || b >= net->cfg.nbuf || n < 1 || n > net->cfg.max_batch) {
        sf_cuda_set_error("%s:%d: sf_net_copy_logits: buffer %d, batch size %d", __FILE__, __LINE__, b, n);
        return -1;
    }
    /* the last step's fp32 logits (bf16 nets: their cast), in the net's layout */
    const float *src = g->dt != SF_DT_F32 ? g->lg : (const float *)g_act(net, g->nl - 1, b, 0);
    if (g->lgt) { /* NHWC segmentation: [n, hw, k] -> sf_model's [n, k, hw] */
        if (sf_cuda_transpose(src, g->lgt, n, (int)hw, m->n_classes, net->s))
            return -1;
        src = g->lgt;
    }
    SF_CUDA_CHECK(cudaMemcpyAsync(host, src, sizeof(float) * nlog, cudaMemcpyDeviceToHost, net->s));
    return 0;
}

extern "C" int sf_net_step(sf_cuda_net *net, int b, int n, int graph, int do_opt)
{
    return g_step_public(net, b, n, graph, do_opt ? 1 : 0);
}

extern "C" const char *sf_net_graph_error(const sf_cuda_net *net) { return net->graph_err; }


extern "C" int sf_net_frozen_fwd(sf_cuda_net *net, int b, int n, cudaStream_t s) { return g_frozen_fwd(net, b, n, s); }


extern "C" size_t sf_net_device_bytes(const sf_cuda_net *net) { return net->alloc_bytes; }

extern "C" int sf_net_profile(sf_cuda_net *net, int b, int n, char *buf, size_t len)
{
    gshape *S = g_find(net, n);
    if (!S || b < 0 || b >= net->cfg.nbuf) {
        sf_cuda_set_error("%s:%d: sf_net_profile: batch size %d not prepared", __FILE__, __LINE__, n);
        return -1;
    }
    prof *pf = (prof *)calloc(1, sizeof *pf);
    cudaEvent_t start;
    if (!pf) {
        sf_cuda_set_error("%s:%d: out of host memory", __FILE__, __LINE__);
        return -1;
    }
    int rc = -1;
    int made = 0;
    if (cudaEventCreate(&start) != cudaSuccess)
        goto out;
    for (; made < PROF_MAX; made++)
        if (cudaEventCreate(&pf->ev[made]) != cudaSuccess)
            break;
    if (net->g->has_bn_train)
        net->g->nbt++; /* a real step: the running statistics move */
    if (cudaEventRecord(start, net->s) != cudaSuccess ||
        g_step(net, S, b, n, 1, pf) != 0 ||
        cudaStreamSynchronize(net->s) != cudaSuccess)
        goto out_ev;
    {
        size_t at = 0;
        float total = 0.f;
        buf[0] = '\0';
        for (int i = 0; i < pf->n && at < len; i++) {
            float ms = 0.f;
            cudaEventElapsedTime(&ms, i ? pf->ev[i - 1] : start, pf->ev[i]);
            total += ms;
            int w = snprintf(buf + at, len - at, "  %-24s %8.3f ms\n", pf->label[i], ms);
            if (w < 0)
                break;
            at += (size_t)w;
        }
        if (at < len)
            snprintf(buf + at, len - at, "  %-24s %8.3f ms\n", "total", total);
    }
    rc = 0;
out_ev:
    cudaEventDestroy(start);
out:
    for (int i = 0; i < made; i++)
        cudaEventDestroy(pf->ev[i]);
    free(pf);
    return rc;
}
