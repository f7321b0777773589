/* gpu/cuda/executor_graph.h — the executor's network object and layer graph,
 * shared by the file that builds the graph (executor_plan.cu: per layer which
 * kernels run it, its buffers, the memory plan), the file that runs it
 * (executor.cu: the step, graphs) and the files beside it (executor_tune.cu:
 * plans per batch size; executor_grad.cu: the step's end; executor_state.cu:
 * the state at the host boundary). Internal to those files; the contract is
 * executor.h. */
#ifndef SF_GPU_CUDA_EXECUTOR_GRAPH_H
#define SF_GPU_CUDA_EXECUTOR_GRAPH_H

#include "gpu/cuda/conv_patch.h"
#include "gpu/cuda/conv_s2d.h"
#include "gpu/cuda/conv_thin.h"
#include "gpu/cuda/conv_dw.h"
#include "gpu/cuda/executor.h"
#include "gpu/cuda/dist_nccl.h"
#include "gpu/cuda/norm.h"
#include "gpu/cuda/sdpa.h"

extern "C" {
#include "gpu/memory_plan.h"
}
#include "gpu/layers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define MAX_ALLOCS 512

typedef struct gen_net gen_net; /* the layer graph, below */

struct sf_cuda_net {
    sf_model m;
    sf_net_cfg cfg;
    sf_net_io io[SF_NET_MAX_BUF];
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    sf_cublas_ctx blas_ctx; /* blas and its workspace, lent to GEMM conv plans (sf_conv_desc.blas) */
    cublasLtHandle_t lt;    /* the cuBLASLt linear plans' (gshape.lt); they run on s with blas_ctx.ws */
    cudaStream_t s;

    float *params, *grads, *mom; /* [n_params] each, the device layout (see the top) */
    void *ws;           /* forward and backward-data plans (on s) */
    void *ws2;          /* backward-filter plans (on side, with fork) */
    size_t ws_size[3];  /* bytes of the workspaces by kind (WS_MAIN: ws, WS_SIDE: ws2,
                           WS_FROZEN: the frozen prefix's) */

    cudaStream_t side;  /* backward-filter beside backward-data */
    cudaEvent_t ev_fork[SF_MAX_LAYERS], ev_join[SF_MAX_LAYERS];
    cudaStream_t nst;   /* the gradient check's per-layer sums, beside the rest of the backward */
    cudaEvent_t ev_norm[SF_MAX_LAYERS], ev_ndone;
    /* Data-parallel (cfg.grad_reduce): the bucketed all-reduce's stream, at
     * the device's highest priority (above the compute stream), so that a
     * bucket's reduce starts and runs while the backward still does;
     * ev_reduced[i]: the bucket closed by layer i is reduced. NULL without
     * grad_reduce. */
    cudaStream_t rst;
    cudaEvent_t ev_reduced[SF_MAX_LAYERS];
    /* distributed.batchnorm sync (cfg.stat_reduce): a batchnorm's sums are
     * written (compute stream), then reduced (reduce stream) */
    cudaEvent_t ev_bn_sums, ev_bn_reduced;

    int graphs_broken;
    char graph_err[256];

    void *allocs[MAX_ALLOCS];
    int n_allocs;
    size_t alloc_bytes; /* device memory the net holds (sf_net_describe) */

    gen_net *g;         /* the layer graph and its buffers */
};

static inline int dmalloc(sf_cuda_net *net, void **p, size_t bytes)
{
    if (net->n_allocs >= MAX_ALLOCS) {
        sf_cuda_set_error("%s:%d: net: too many allocations", __FILE__, __LINE__);
        return -1;
    }
    SF_CUDA_CHECK(cudaMalloc(p, bytes ? bytes : 256));
    net->allocs[net->n_allocs++] = *p;
    net->alloc_bytes += bytes ? bytes : 256;
    return 0;
}

static inline int dmallocf(sf_cuda_net *net, float **p, size_t floats)
{
    return dmalloc(net, (void **)p, floats * sizeof(float));
}

/* ---- the layer graph ------------------------------------------------------ */

typedef struct gop {
    int frozen;
    int src[SF_MAX_IN], n_in;
    int first[SF_MAX_IN]; /* backward: this consumer writes (1) or adds into (0) the gradient of src[j] */
    int want[SF_MAX_IN];  /* backward: src[j] needs a gradient */
    int dy_of;            /* 1 + the layer whose gradient buffer is this layer's dy (0: its own):
                             a batchnorm read only by a residual add whose other input's gradient
                             is the same values, or a residual stream's add and its branch
                             (g_share_add_grads); always a lower layer, itself not aliased */
    int grad_shared;      /* add: 1 + the input whose owner reads the other input's gradient
                             (dy_of), so the add writes one gradient, not two (0: both) */
    int grad_alias;       /* add: its gradient, its branch's and its residual input's are one
                             buffer (dy_of, g_alias_add): its backward moves nothing */
    int relu;            /* the next layer's ReLU is fused here */
    int cat_mask;        /* with relu: the ReLU's output is read by one concat alone, whose
                            backward applies the mask from its own output; this layer's
                            backward takes dy masked, and its output dies at the concat */
    int bn_act;          /* batchnorm: the next layer's other activation is fused here, its
                          * batchnorm.h code SF_BN_ACT(a); 0: none */
    int fused;           /* this ReLU is fused into the previous layer, or this to_tokens is a
                            view of its NHWC input: y/dy alias the input's */
    void *y;             /* output (flatten, fused ReLU: alias) */
    void *dy;            /* output gradient (trainable; aliases as y), else NULL */
    float *save;         /* batchnorm: [2C] mean, invstd; layernorm2d, layernorm: [2 * max_batch * H*W]
                            mean, rstd per position */
    int32_t *argmax;     /* maxpool */
    void *gtmp;          /* an input gradient before it is added to its owner's (this layer
                            is not that input's first consumer; sized for the largest such
                            input, used by one input after another), or a batchnorm's
                            unwanted dx: only live during this layer's backward */
    int thin;            /* conv run by conv_thin.h's kernels (no cuDNN plans) */
    int patch;           /* conv whose backward is conv_patch.h's one pass (a forward plan only) */
    int tpatch;          /* convT whose forward is conv_patch.h's kernel (backward plans only) */
    int dw;              /* depthwise conv that conv_dw.h's kernels take: timed against cuDNN's
                            plans per batch size and direction (gshape.dw says which ran faster) */
    int bn_add;          /* batchnorm: the index of the residual add whose output its forward
                            writes, relu?(bn(x) + the add's other input) (0: none) */
    int in_bn;           /* add computed by the batchnorm before it (bn_add): no forward of its own */
    int bn_pool;         /* batchnorm + ReLU read only by a maxpool that applies them to its taps
                            (training forward: the batchnorm computes its statistics alone) */
    int pre_bn;          /* maxpool: 1 + the index of that batchnorm (0: none; a model may start
                            with the batchnorm) */
    int s2d;             /* conv run as its space-to-depth form (conv_s2d.h): its plans are the
                            rearranged convolution's, on the three tensors below */
    void *s2d_x;         /* the rearranged input (max_batch samples), written by the forward,
                            read by the backward-filter */
    void *s2d_w, *s2d_gw; /* the rearranged weight (rebuilt each forward) and its gradient */
    /* conv whose weight or weight gradient sits below 16-byte alignment in the
     * flat parameter buffers (after a tensor of an odd number of 8-byte pairs,
     * such as a squeeze-and-excitation bias of 6 or 26): 16-byte aligned copies
     * that cuDNN reads and writes instead. cuDNN 9.14's weight-gradient engines
     * write 16-byte vectors whatever alignment the tensor declares (seen with
     * compute-sanitizer on efficientnet_b0, fp32, H200), which faults and
     * leaves the context unusable. wal_w is refreshed wherever the weights
     * change (g_refresh_wal: after each optimizer step, set_params, restore);
     * wal_gw is copied into the gradient after each backward-filter. */
    void *wal_w, *wal_gw;
    int fusable;         /* conv with a bias or fused ReLU: cuDNN's fused forward may replace
                            conv + epilogue kernel (kept per shape where it times faster) */
    /* conv: variant packs per batch buffer (a layer reading the model input or
     * the frozen boundary binds buffer b's tensor, so no input is copied) */
    sf_conv_vpack *vp[3][SF_NET_MAX_BUF];
    sf_conv_vpack *vpf[SF_NET_MAX_BUF]; /* fused forward (binds the bias too) */
    sf_conv_vpack *vpa[SF_NET_MAX_BUF]; /* g_acc_ok: backward-data bound to the input's owner's
                                           gradient, for the plan that adds into it */
    int tok;             /* input 0 is a token sequence [n, t, c]: token-major whatever the net's
                            layout (a [c, t, 1] map in NHWC), so per-channel ops view it NHWC */
    /* self_attention: what its forward keeps for its backward (max_batch
     * samples each): the packed projection qkv [n*t, 3c], the heads' output
     * o [n*t, c], and either the attention weights p [n, heads, t, t]
     * (materialised core) or the softmax statistics [n, heads, t] (cuDNN's
     * fused attention, sdpa = 1) */
    void *qkv, *att_o, *att_p;
    float *att_stats;
    int sdpa;
} gop;

typedef struct gshape {
    int n;
    sf_conv_plan cp[SF_MAX_LAYERS][3];
    unsigned char dw[SF_MAX_LAYERS];         /* bit d (sf_conv_dir): direction d of this depthwise conv
                                                runs conv_dw.h's kernel, which timed faster than cp */
    float dw_ms[SF_MAX_LAYERS][3];           /* those kernels' measured times (ms; 0: not timed) */
    unsigned char acc[SF_MAX_LAYERS];        /* 1: cp[i][SF_CONV_BWD_DATA] adds into the input's owner's
                                                gradient (beta 1, bound by gop.vpa), which timed faster
                                                than writing gtmp and adding it (g_try_acc) */
    sf_convt_plans tp[SF_MAX_LAYERS];
    cudaGraphExec_t exec[SF_NET_MAX_BUF][3]; /* [b][k]: k = do_opt (training), 2 (evaluation) */
    sf_sdpa_plan *sdpa[SF_MAX_LAYERS];       /* self_attention layers with sdpa: their fused plans */
    size_t sdpa_ws;                          /* the largest of their workspaces (the main one) */
    /* cuBLASLt forward plans (linear.h) by layer and projection (a linear
     * layer's 0; self_attention's input projection 0, output projection 1);
     * NULL: the cuBLAS path */
    sf_linear_lt *lt[SF_MAX_LAYERS][2];
    sf_linear_lt *ltd[SF_MAX_LAYERS][2];     /* their backward-data GEMMs on cuBLASLt (NULL: cuBLAS) */
    int lt_n, lt_of;                         /* forward GEMMs on cuBLASLt, of those it was tried for */
    int lt_timed, lt_other;                  /* plans whose algorithm was timed; of them, not cuBLASLt's first */
    int lt_b16;                              /* forward plans on the bias's bf16 copy (fp32 had none) */
    int lt_plain;                            /* forward plans of GEMMs without a bias (no epilogue) */
    char lt_why[200];                        /* why the first of the others is not ("" when none) */
} gshape;

struct gen_net {
    gop op[SF_MAX_LAYERS];
    int nl, nf;          /* layers, frozen layers */
    sf_dtype dt;         /* activations */
    size_t es;           /* bytes per activation element */
    sf_layout lay;
    void *bnd[SF_NET_MAX_BUF]; /* frozen boundary per buffer: the frozen forward of buffer b
                                  (transform stream) writes it, the step of b reads it */
    size_t bnd_elems;    /* per sample */
    size_t ws_prefer;    /* the conv plans' preferred workspace bound (sf_conv_desc.ws_prefer;
                            g_finish_create) */
    float *sq, *gacc, *bufs;
    unsigned *skips;     /* the steps skipped so far (sf_cuda_grad_state counts, AdamW reads;
                            zeroed by sf_net_reset_skips) */
    float *gacc_n;       /* with gacc: [2], the samples the ranks trained in the group so far, twice
                            (sf_grad_state's count for the group's step: 0 skips it) */
    void *wd, *gd;       /* bf16 nets: bf16 copies of the weights and of the conv weight
                            gradients (device layout); else the parameters and gradients */
    int wcopy;           /* wd, gd are those copies */
    sf_sgd_segs segs_perm;  /* the weights stored permuted (model offsets): what the host
                               boundary permutes */
    sf_sgd_segs segs_gd;    /* bf16: the trainable conv/convT weights, whose gradients gd
                               holds (offsets from train_off, identity segments) */
    float *lg, *dlg;     /* fp32 logits and their gradient (dt != fp32) */
    void *scratch;       /* bn, xent2d, bias-grad scratch (compute stream) */
    size_t scratch_bytes;
    sf_xent2d_out *x2d;
    void *fws;           /* frozen workspace (transform stream) */
    /* the memory plan (g_plan_memory): layer outputs and output gradients in
     * two arenas, placed by liveness */
    void *arena, *farena;            /* trainable part (compute stream), frozen prefix (transform) */
    size_t arena_bytes, farena_bytes;
    size_t tensor_bytes;             /* what one buffer per tensor would have taken */
    struct plan_obj *plan;           /* the placements, until sf_exec_alloc_arenas applies them */
    int n_plan;
    int has_bn_train;
    uint64_t nbt, nbt_saved;
    /* distributed.batchnorm sync (cfg.stat_reduce, and a trainable
     * batchnorm): [2 * widest trainable batchnorm + 1] doubles, the sums of
     * the batchnorm in progress (sf_cuda_bn_sync_*), reduced in place; the
     * compute stream's, like scratch. NULL: batchnorm over this rank's batch */
    double *bn_sums;
    /* with bn_sums: [2], the rounds this rank joined without a batch in
     * which some rank trained a sample (their batchnorms counted samples),
     * live and at the last save_state: num_batches_tracked moves with them
     * as on the ranks that trained, which the host cannot know when it
     * enqueues the round. sf_net_get_buffers adds them to nbt. */
    unsigned long long *nbt_empty;
    /* the gradient check (sf_grad_state): each trainable layer with
     * parameters has a slot of SF_SUMSQ_BLOCKS partial sums of squares,
     * computed on the norm stream as soon as its backward is done */
    int slot[SF_MAX_LAYERS];         /* -1: no parameters to check */
    int rb_top[SF_MAX_LAYERS];       /* the all-reduce bucket closed by layer i's backward: its layers
                                        are i .. rb_top[i] (its first in the backward's order); -1 none */
    int rb_last;                     /* the bucket reduced last (closed by the lowest trainable layer
                                        with parameters), which also carries sf_step_ctl.count */
    sf_grad_piece pieces[2 * SF_MAX_LAYERS + 1]; /* one bucket's pieces (g_reduce_bucket), count included */
    int n_slots;
    float *sq_part;                  /* [max(n_slots, 1) * SF_SUMSQ_BLOCKS] */
    sf_grad_state *d_gs;             /* [nbuf] this buffer's last check */
    sf_grad_state *h_gs;             /* [nbuf] pinned copies, written at the end of each step */
    unsigned long long *d_ar;        /* [nbuf][2] data-parallel: the reduce stream's clock (ns) at the start
                                        of the bucket in flight, and the sum of this step's buckets' spans */
    unsigned long long *h_ar;        /* [nbuf] pinned: that sum, copied at the end of each step */
    float *lgt;                      /* NHWC segmentation: logits transposed to NCHW for the host */
    /* self_attention, only live within one layer's forward or backward on
     * the compute stream: the materialised core's fp32 scores (and dP), the
     * gradient of the heads' output, and that of the packed projection,
     * each sized for the largest attention layer at max_batch */
    float *att_s;
    void *att_do, *att_dqkv;
    size_t att_s_floats, att_do_bytes, att_dqkv_bytes;
    int n_attn, n_sdpa;              /* attention layers; of them, on cuDNN's fused attention */
    int n_wal;                       /* convs on aligned weight copies (gop.wal_w) */
    int n_bn_apart;                  /* batchnorms followed by an activation the fused kernels do not take
                                        (leaky_relu, elu, selu, softplus, mish), left unfused */
    uint64_t bn_apart_kinds;         /* those activations' kinds, 1 << kind each (the plan text names them) */
    char sdpa_why[160];              /* why the others are not ("" when all are) */
    gshape *shapes[SF_NET_MAX_SHAPES];
    int n_shapes;
};

static inline void *E(const void *p, size_t i, size_t es) { return (char *)p + i * es; }

static inline int g_src(const sf_model *m, int i, int j) { return sf_layer_input(m, i, j); }

/* Whether kind is an activation of activation.h (not ReLU; affine's
 * scale * x + shift and clamp among them). */
static inline int g_is_act(int kind)
{
    return kind == SF_L_RELU6 || kind == SF_L_SIGMOID || kind == SF_L_SILU || kind == SF_L_HARDSWISH ||
           kind == SF_L_HARDSIGMOID || kind == SF_L_GELU || kind == SF_L_TANH || kind == SF_L_LEAKY_RELU ||
           kind == SF_L_ELU || kind == SF_L_SELU || kind == SF_L_SOFTPLUS || kind == SF_L_MISH ||
           kind == SF_L_AFFINE || kind == SF_L_CLAMP || kind == SF_L_SQUARE;
}

/* Whether an activation's backward reads its input: all but affine, whose
 * derivative is its scale, so the memory plan need not keep that input
 * (the backward hands the launcher dy in its place). */
static inline int g_act_reads_x(int kind) { return g_is_act(kind) && kind != SF_L_AFFINE; }

/* The activation an activation layer computes (activation.h). */
static inline sf_cuda_act g_act_kind(const sf_layer *L)
{
    switch (L->kind) {
    case SF_L_RELU6: return SF_CUDA_ACT_RELU6;
    case SF_L_SIGMOID: return SF_CUDA_ACT_SIGMOID;
    case SF_L_SILU: return SF_CUDA_ACT_SILU;
    case SF_L_HARDSWISH: return SF_CUDA_ACT_HARDSWISH;
    case SF_L_HARDSIGMOID: return SF_CUDA_ACT_HARDSIGMOID;
    case SF_L_TANH: return SF_CUDA_ACT_TANH;
    case SF_L_LEAKY_RELU: return SF_CUDA_ACT_LEAKY_RELU;
    case SF_L_ELU: return SF_CUDA_ACT_ELU;
    case SF_L_SELU: return SF_CUDA_ACT_SELU;
    case SF_L_SOFTPLUS: return SF_CUDA_ACT_SOFTPLUS;
    case SF_L_MISH: return SF_CUDA_ACT_MISH;
    case SF_L_AFFINE: return SF_CUDA_ACT_AFFINE;
    case SF_L_CLAMP: return SF_CUDA_ACT_CLAMP;
    case SF_L_SQUARE: return SF_CUDA_ACT_SQUARE;
    default: return L->approximate ? SF_CUDA_ACT_GELU_TANH : SF_CUDA_ACT_GELU;
    }
}

/* The parameters of activation layer L (activation.h); zero for those that have none. */
static inline sf_cuda_act_prm g_act_prm(const sf_layer *L)
{
    sf_cuda_act_prm p = {0.f, 0.f, 0};
    if (L->kind == SF_L_LEAKY_RELU)
        p.a = L->negative_slope;
    else if (L->kind == SF_L_ELU)
        p.a = L->alpha;
    else if (L->kind == SF_L_SOFTPLUS)
        p.a = L->beta, p.b = L->threshold;
    else if (L->kind == SF_L_AFFINE)
        p.a = L->affine_scale, p.b = L->affine_shift;
    else if (L->kind == SF_L_CLAMP)
        p.a = L->clamp_min, p.b = L->clamp_max, p.c = L->clamp_grad;
    return p;
}

/* The widest bias gradient layer L's backward reduces through the
 * compute-stream scratch (sf_cuda_bias_grad_scratch of it): its output or
 * input channels, or the attention input projection's 3c. The scratch is
 * sized from this and every batch is checked against it, so both read the
 * one definition. */
static inline int g_bias_grad_c(const sf_layer *L)
{
    int c = L->out_ch > L->in_c ? L->out_ch : L->in_c;
    if (L->kind == SF_L_SELF_ATTENTION && 3 * L->in_c > c)
        c = 3 * L->in_c;
    return c > 1 ? c : 1;
}

/* The layer that owns the buffer layer i's output lives in (through flattens); -1: model input. */
static inline int g_owner(const sf_model *m, int i)
{
    while (i >= 0 && m->layers[i].kind == SF_L_FLATTEN)
        i = g_src(m, i, 0);
    return i;
}

/* dst for input j of layer i's gradient (NULL: none wanted) and whether to add it after. */
static inline void *g_dst(sf_cuda_net *net, int i, int j, int *add_after)
{
    gen_net *g = net->g;
    const gop *o = &g->op[i];
    *add_after = 0;
    if (!o->want[j])
        return NULL;
    if (o->first[j])
        return g->op[g_owner(&net->m, o->src[j])].dy;
    *add_after = 1;
    return o->gtmp;
}

/* The gradient of layer i's input j as its owner holds it. */
static inline void *g_owner_dy(sf_cuda_net *net, int i, int j)
{
    return net->g->op[g_owner(&net->m, net->g->op[i].src[j])].dy;
}

/* The descriptor of conv or convT layer i for n samples (sf_conv_desc and
 * sf_convt_desc name these fields alike); alignments are filled by the caller. */
template <typename Desc> static inline void g_desc(const sf_cuda_net *net, int i, int n, Desc *d)
{
    const sf_layer *L = &net->m.layers[i];
    memset(d, 0, sizeof *d);
    d->n = n;
    d->c = L->in_c;
    d->h = L->in_h;
    d->w = L->in_w;
    d->oc = L->out_c;
    d->k = L->k;
    d->stride = L->stride;
    d->pad = L->pad;
    d->layout = net->g->lay;
    d->tf32 = net->cfg.tf32;
    d->dt = net->g->dt;
    d->allow_rtc = net->cfg.allow_rtc;
    d->blas = &net->blas_ctx;
}

/* Allocation shifted so that p + off (floats) is 16-byte aligned (cudaMalloc
 * is 256-aligned). */
static inline int g_alloc_shift(sf_cuda_net *net, float **p, size_t floats, size_t off)
{
    float *raw;
    if (dmallocf(net, &raw, floats + 4))
        return -1;
    const size_t sh = (4 - off % 4) % 4;
    *p = raw + sh;
    SF_CUDA_CHECK(cudaMemsetAsync(raw, 0, sizeof(float) * (floats + 4), net->s));
    return 0;
}

/* Diagnostics: an event after each op (sf_net_profile only); enough for a
 * mark per layer and direction of the largest exported family (DenseNet-121,
 * 427 layers), the loss and the optimizer. */
#define PROF_MAX 1024
typedef struct prof {
    cudaEvent_t ev[PROF_MAX];
    char label[PROF_MAX][40];
    int n;
} prof;

/* An event after one layer's (or stage's) work, labelled "<phase> <kind> L<i>". */
static inline void g_mark(prof *pf, cudaStream_t s, const char *phase, const char *kind, int layer)
{
    if (!pf || pf->n >= PROF_MAX)
        return;
    if (layer >= 0)
        snprintf(pf->label[pf->n], sizeof pf->label[0], "%s %s L%d", phase, kind, layer);
    else
        snprintf(pf->label[pf->n], sizeof pf->label[0], "%s", phase);
    cudaEventRecord(pf->ev[pf->n], s);
    pf->n++;
}

/* The tensor layer s produces (through flattens) as a layer of the given
 * frozenness reads it in buffer b: the model input and the frozen boundary
 * are per buffer, everything else is one tensor. */
static inline void *g_act(const sf_cuda_net *net, int s, int b, int reader_frozen)
{
    const gen_net *g = net->g;
    const int ow = g_owner(&net->m, s);
    if (ow < 0)
        return net->io[b].x;
    if (!reader_frozen && g->op[ow].frozen)
        return g->bnd[b];
    return g->op[ow].y;
}

/* Input j of layer i as the layer reads it in buffer b. */
static inline void *g_in(const sf_cuda_net *net, int i, int j, int b)
{
    return g_act(net, g_src(&net->m, i, j), b, net->g->op[i].frozen);
}

static inline void *g_wd(const sf_cuda_net *net, int i) { return E(net->g->wd, net->m.layers[i].w_off, net->g->es); }
static inline void *g_gd(const sf_cuda_net *net, int i) { return E(net->g->gd, net->m.layers[i].w_off, net->g->es); }

/* The parameter slot of projection j's weight (bias 0) or bias (bias 1; -1:
 * none) of layer i: a linear layer's 0 and 1, self_attention's sf_attn_slot. */
static inline int g_proj_slot(const sf_layer *L, int j, int bias)
{
    if (L->kind == SF_L_SELF_ATTENTION)
        return sf_attn_slot(L, j, bias);
    return bias ? (L->n_b ? 1 : -1) : 0;
}

/* A weight slot of layer i as the GEMMs read it (bf16 nets: its bf16 copy). */
static inline const void *g_wslot(const sf_cuda_net *net, int i, int j)
{
    return E(net->g->wd, net->m.layers[i].p_off[j], net->g->es);
}

/* executor_linear.cu: projection j of layer i on cuBLASLt with its bias (or
 * cuBLAS and the bias kernel), and self_attention layer i's forward and
 * backward. */
int g_lt_linear_fwd(sf_cuda_net *net, gshape *S, int i, int j, const void *x, int rows, int in, int out, void *y,
                    cudaStream_t s);
int g_lt_linear_bwd_data(sf_cuda_net *net, gshape *S, int i, int j, const void *dy, int rows, int in, int out,
                         void *dx, cudaStream_t s);
int g_attention_fwd(sf_cuda_net *net, gshape *S, int i, int n, const void *x, void *ws, cudaStream_t s);
int g_attention_bwd(sf_cuda_net *net, gshape *S, int i, int b, int n, void *dx, cudaStream_t s);

/* executor_moves.cu: the layers that move values without arithmetic beyond a
 * sum (channel_shuffle, channel_slice, upsample), forward from x into the
 * layer's output and backward from its dy into dx. */
int g_is_move(sf_layer_kind k);
/* The token-sequence kinds of layer i over n samples (executor_moves.cu):
 * forward from x into its output; backward into dx (NULL: not wanted;
 * in_len its elements) and the layer's parameter gradient. */
int g_tokens_fwd(sf_cuda_net *net, int i, int n, const void *x, cudaStream_t s);
int g_tokens_bwd(sf_cuda_net *net, int i, int n, void *dx, size_t in_len, cudaStream_t s);
int g_moves_fwd(sf_cuda_net *net, int i, int n, const void *x, cudaStream_t s);
int g_moves_bwd(sf_cuda_net *net, int i, int n, void *dx, cudaStream_t s);
/* executor_channel_conv1d.cu: channel_conv1d layer i's forward on x, and
 * its backward into dx (NULL: no input gradient) with its parameters'
 * gradients. */
int g_channel_conv1d_fwd(sf_cuda_net *net, int i, int n, const void *x, cudaStream_t s);
int g_channel_conv1d_bwd(sf_cuda_net *net, int i, int b, int n, void *dx, cudaStream_t s);
/* executor_prelu.cu: prelu layer i's forward on x, and its backward into dx
 * (NULL: not wanted) and its slopes' gradient (through the scratch). */
int g_prelu_fwd(sf_cuda_net *net, int i, int n, const void *x, cudaStream_t s);
int g_prelu_bwd(sf_cuda_net *net, int i, int b, int n, void *dx, cudaStream_t s);
/* executor_scale_shift.cu: scale_shift or layer_scale layer i's forward on
 * x, and its backward into dx (NULL: not wanted) and its parameters'
 * gradients (through the scratch). */
int g_scale_shift_fwd(sf_cuda_net *net, int i, int n, const void *x, cudaStream_t s);
int g_scale_shift_bwd(sf_cuda_net *net, int i, int b, int n, void *dx, cudaStream_t s);
/* executor_pad.cu: pad layer i's forward on x, and its backward into dx,
 * the input's whole gradient (a move: g_moves_fwd/_bwd call these). */
int g_pad_fwd(sf_cuda_net *net, int i, int n, const void *x, cudaStream_t s);
int g_pad_bwd(sf_cuda_net *net, int i, int n, void *dx, cudaStream_t s);

/* [outer, c, inner] view of an activation [n, c, h*w] in the net's layout. */
static inline void g_view(const gen_net *g, int n, size_t hw, size_t *outer, size_t *inner)
{
    if (g->lay == SF_LAYOUT_NHWC) {
        *outer = (size_t)n * hw;
        *inner = 1;
    } else {
        *outer = (size_t)n;
        *inner = hw;
    }
}

/* Stand-ins for a convolution's activation tensors while plans are timed. */
typedef struct timing_ptrs {
    void *x, *y;
} timing_ptrs;

/* Which workspace a conv/convT plan of layer i in direction dir runs with:
 * the frozen layers run on the transform stream (WS_FROZEN), a forked
 * backward-filter on the side stream (WS_SIDE), everything else on the
 * compute stream (WS_MAIN). Each is sized for the plans that use it. */
enum { WS_MAIN = 0, WS_SIDE, WS_FROZEN };

/* executor_tune.cu: the cuDNN plans of one batch size (a gshape), built and
 * timed when the net is created or a batch size is first prepared, and
 * described for diagnostics. Plans for batch size n; a plan of workspace kind
 * k may use lim[k] bytes and is timed with workspace ws[k], on the layer's own
 * tensors or, with tp, on stand-ins for them (before the arenas exist). */
int g_build_shape(sf_cuda_net *net, int n, void *const ws[3], const size_t lim[3], const timing_ptrs *tp,
                  gshape **out);
void gshape_destroy(gshape *S);
/* The plans of batch size n; NULL when that size is not prepared. */
gshape *g_find(const sf_cuda_net *net, int n);
/* The workspace bytes the plans of S need, by workspace kind. */
void g_shape_ws(const sf_cuda_net *net, const gshape *S, size_t need[3]);
/* Direction dir of depthwise conv layer i on conv_dw.h's kernel for n
 * samples, on the conv roles' pointers (x, w, y of sf_conv_ptrs), without
 * bias or ReLU; the filter gradient uses the compute-stream scratch. */
int g_conv_dw_run(sf_cuda_net *net, int i, int n, int dir, const sf_conv_ptrs *p, cudaStream_t s);
/* The conv layers' variant packs (their tensor pointers per buffer), once
 * the arenas exist. */
int g_vpacks(sf_cuda_net *net);
/* Whether conv layer i's data gradient may be accumulated into its input's
 * owner's gradient by cuDNN's plan (beta 1) in place of gtmp and an add: the
 * layer is not that input's first consumer, runs cuDNN's backward-data plan
 * (not the thin, patch, space-to-depth or depthwise paths) and the switch
 * allows it. */
int g_acc_ok(const sf_cuda_net *net, int i);

/* executor_grad.cu: the end of a training step. The gradient check's sums of
 * layer i once the backward completed it (g_norm_layer), the data-parallel
 * all-reduce of the bucket layer i closes (g_reduce_bucket), then the check,
 * accumulation, optimizer and results' copies (g_opt_tail); g_refresh_wd
 * rewrites a bf16 net's weight copy from the master parameters (all of them,
 * or the trainable slice), g_refresh_wal the aligned conv weight copies
 * (gop.wal_w) likewise. 0, or -1 with sf_cuda_last_error() set. */
int g_norm_layer(sf_cuda_net *net, int i);
int g_reduce_bucket(sf_cuda_net *net, int b, int i);
/* distributed.batchnorm sync: the sums of c channels in bn_sums, which stream
 * s (the compute stream) has just written, added over the ranks on the
 * reduce stream; s waits for them. */
int g_bn_sync_reduce(sf_cuda_net *net, int c, cudaStream_t s);
int g_opt_tail(sf_cuda_net *net, int b, int do_opt, int convert, prof *pf);
int g_refresh_wd(sf_cuda_net *net, int all, cudaStream_t s);
int g_refresh_wal(sf_cuda_net *net, int all, cudaStream_t s);

/* executor_plan.cu: the layer graph of net->m (the per-layer decisions, the
 * parameters and their optimizer state, the buffers, the memory plan's
 * placements); then, once plans are chosen, the arenas those placements
 * point into. 0, or -1 with sf_cuda_last_error() set. */
int sf_exec_build_graph(sf_cuda_net *net);
int sf_exec_alloc_arenas(sf_cuda_net *net);
size_t sf_exec_scratch_need(const sf_cuda_net *net, int n);

#endif /* SF_GPU_CUDA_EXECUTOR_GRAPH_H */
