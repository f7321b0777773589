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
 * stream beside backward-data), linear through cuBLAS, batchnorm, pooling, add,
 * ReLU and the other activations, products (mul, layer_scale), concat,
 * dropout and the losses through our kernels (the *.cu files beside this one).
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
 * per-layer decisions above, the buffers, the memory plan); this file chooses
 * the cuDNN plans per batch size and runs the step; executor_graph.h holds
 * what both read.
 */
#include "executor_graph.h"

#define WS_TUNE_MIN ((size_t)256 << 20) /* candidates' workspace while choosing engines: */
#define WS_TUNE_MAX ((size_t)1 << 30)   /* bounds (g_finish_create) */
#define WS_MIN_BYTES ((size_t)32 << 20)   /* slack for plans of other batch sizes */
#define WS_SMALL_BYTES ((size_t)1 << 20)  /* the side and frozen workspaces' floor */

/* ---- helpers -------------------------------------------------------------- */

/* Bounded string copy that always terminates. */
static void scopy(char *d, size_t n, const char *s)
{
    size_t l = strlen(s);
    if (l >= n)
        l = n - 1;
    memcpy(d, s, l);
    d[l] = '\0';
}


/* ---- the step ------------------------------------------------------------- */

/* Diagnostics: an event after each op (sf_net_profile only). */
#define PROF_MAX 256
typedef struct prof {
    cudaEvent_t ev[PROF_MAX];
    char label[PROF_MAX][40];
    int n;
} prof;

/* An event after one layer's (or stage's) work, labelled "<phase> <kind> L<i>". */
static void g_mark(prof *pf, cudaStream_t s, const char *phase, const char *kind, int layer)
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

static const sf_sgd_segs k_no_segs = {};


/* The tensor layer s produces (through flattens) as a layer of the given
 * frozenness reads it in buffer b: the model input and the frozen boundary
 * are per buffer, everything else is one tensor. */
static void *g_act(const sf_cuda_net *net, int s, int b, int reader_frozen)
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
static void *g_in(const sf_cuda_net *net, int i, int j, int b)
{
    return g_act(net, g_src(&net->m, i, j), b, net->g->op[i].frozen);
}

static void *g_wd(const sf_cuda_net *net, int i) { return E(net->g->wd, net->m.layers[i].w_off, net->g->es); }
static void *g_gd(const sf_cuda_net *net, int i) { return E(net->g->gd, net->m.layers[i].w_off, net->g->es); }

/* [outer, c, inner] view of an activation [n, c, h*w] in the net's layout. */
static void g_view(const gen_net *g, int n, size_t hw, size_t *outer, size_t *inner)
{
    if (g->lay == SF_LAYOUT_NHWC) {
        *outer = (size_t)n * hw;
        *inner = 1;
    } else {
        *outer = (size_t)n;
        *inner = hw;
    }
}

/* The layout layer i's per-channel ops see its input (and output) in: a
 * token sequence is token-major, an NHWC [c, t, 1] map, whatever the net's. */
static sf_layout g_lay_of(const gen_net *g, int i) { return g->op[i].tok ? SF_LAYOUT_NHWC : g->lay; }

/* g_view in layer i's own layout (g_lay_of). */
static void g_view_of(const gen_net *g, int i, int n, size_t hw, size_t *outer, size_t *inner)
{
    *outer = g_lay_of(g, i) == SF_LAYOUT_NHWC ? (size_t)n * hw : (size_t)n;
    *inner = g_lay_of(g, i) == SF_LAYOUT_NHWC ? 1 : hw;
}

/* The activation an activation layer computes (activation.h). */
static sf_cuda_act g_act_kind(const sf_layer *L)
{
    switch (L->kind) {
    case SF_L_RELU6: return SF_CUDA_ACT_RELU6;
    case SF_L_SIGMOID: return SF_CUDA_ACT_SIGMOID;
    case SF_L_SILU: return SF_CUDA_ACT_SILU;
    case SF_L_HARDSWISH: return SF_CUDA_ACT_HARDSWISH;
    case SF_L_HARDSIGMOID: return SF_CUDA_ACT_HARDSIGMOID;
    default: return L->approximate ? SF_CUDA_ACT_GELU_TANH : SF_CUDA_ACT_GELU;
    }
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

/* A mul layer whose second input is [C,1,1], broadcast over H,W. */
static int g_mul_bcast(const sf_model *m, int i) { return g_in_elems(m, i, 1) != m->layers[i].out_elems; }

/* Where buffer b's batch sequence number (the dropout draws' key) is read
 * from: the staged sf_step_ctl, so a captured step reads each replay's. */
static const uint64_t *g_seq(const sf_cuda_net *net, int b)
{
    return net->io[b].ctl ? &net->io[b].ctl->seq : NULL;
}

/* The descriptor cuDNN's plans of conv layer i are built for: the layer's
 * own, or its space-to-depth form. */
static void g_conv_desc(const sf_cuda_net *net, int i, int n, sf_conv_desc *d)
{
    g_desc(net, i, n, d);
    d->groups = net->m.layers[i].groups;
    d->dilation = net->m.layers[i].dilation;
    if (net->g->op[i].s2d)
        sf_conv_s2d_desc(d, d);
}

/* Stand-ins for a convolution's activation tensors while plans are timed. */
typedef struct timing_ptrs {
    void *x, *y;
} timing_ptrs;

/* Pointers of conv/convT layer i in direction dir for buffer b (conv roles;
 * convT uses the same roles). */
static void g_ptrs(const sf_cuda_net *net, int i, int dir, int b, void *ws, sf_conv_ptrs *p)
{
    const gen_net *g = net->g;
    const gop *o = &g->op[i];
    memset(p, 0, sizeof *p);
    p->ws = ws;
    if (o->s2d) { /* forward or backward-filter: one rearranged input for every buffer */
        p->x = o->s2d_x;
        p->w = dir == SF_CONV_FWD ? o->s2d_w : o->s2d_gw;
        p->y = dir == SF_CONV_FWD ? o->y : o->dy;
    } else if (dir == SF_CONV_FWD) {
        p->x = g_in(net, i, 0, b);
        p->w = o->wal_w ? o->wal_w : g_wd(net, i);
        p->y = o->y;
    } else if (dir == SF_CONV_BWD_DATA) {
        const int s = g_owner(&net->m, g_src(&net->m, i, 0));
        p->x = o->first[0] ? g->op[s].dy : o->gtmp;
        p->w = o->wal_w ? o->wal_w : g_wd(net, i);
        p->y = o->dy;
    } else {
        p->x = g_in(net, i, 0, b);
        p->w = o->wal_gw ? o->wal_gw : g_gd(net, i);
        p->y = o->dy;
    }
}

/* Which workspace a conv/convT plan of layer i in direction dir runs with:
 * the frozen layers run on the transform stream (WS_FROZEN), a forked
 * backward-filter on the side stream (WS_SIDE), everything else on the
 * compute stream (WS_MAIN). Each is sized for the plans that use it. */
enum { WS_MAIN = 0, WS_SIDE, WS_FROZEN };
static int g_ws_kind(const sf_cuda_net *net, int i, int dir)
{
    const gop *o = &net->g->op[i];
    if (o->frozen)
        return WS_FROZEN;
    if (net->m.layers[i].kind == SF_L_CONV2D && dir == SF_CONV_BWD_FILTER && !net->cfg.no_fork && o->want[0])
        return WS_SIDE;
    return WS_MAIN;
}

static void *g_ws_of(const sf_cuda_net *net, int i, int dir)
{
    const int k = g_ws_kind(net, i, dir);
    return k == WS_FROZEN ? net->g->fws : k == WS_SIDE ? net->ws2 : net->ws;
}

static float *g_bias(const sf_cuda_net *net, int i)
{
    const sf_layer *L = &net->m.layers[i];
    return L->n_b ? net->params + L->b_off : NULL;
}

/* Time of the bias(+ReLU) epilogue kernel on conv layer i's output for n
 * samples (ms, best of 3). */
static float g_time_epilogue(sf_cuda_net *net, int i, int n, void *y)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    size_t outer, inner;
    g_view(g, n, (size_t)L->out_h * L->out_w, &outer, &inner);
    cudaEvent_t e[2];
    if (cudaEventCreate(&e[0]) != cudaSuccess || cudaEventCreate(&e[1]) != cudaSuccess)
        return 0.f;
    float best = 1e30f;
    for (int r = 0; r < 3; r++) {
        float ms = 0.f;
        cudaEventRecord(e[0], net->s);
        sf_cuda_bias_act_dt(g->dt, y, g_bias(net, i), outer, L->out_c, inner, g->op[i].relu, net->s);
        cudaEventRecord(e[1], net->s);
        if (cudaEventSynchronize(e[1]) == cudaSuccess && cudaEventElapsedTime(&ms, e[0], e[1]) == cudaSuccess &&
            ms < best)
            best = ms;
    }
    cudaEventDestroy(e[0]);
    cudaEventDestroy(e[1]);
    return best < 1e30f ? best : 0.f;
}

/* Replaces *plain with cuDNN's fused conv+bias(+ReLU) plan when one exists and
 * times faster than the plain plan plus the epilogue kernel (on W1 in TF32
 * NHWC every layer: 2.36 -> 2.19 ms per step on an H100). 0 also when no
 * fused engine exists (common for fp32 data); -1 only on a hard failure. */
static int g_try_fused(sf_cuda_net *net, int i, int n, const sf_conv_desc *d, const sf_conv_ptrs *p,
                       size_t ws_limit, sf_conv_plan *plain)
{
    const sf_layer *L = &net->m.layers[i];
    sf_conv_desc df = *d;
    df.fuse_bias = L->n_b > 0;
    df.fuse_relu = net->g->op[i].relu;
    df.align_b = L->n_b ? sf_cuda_ptr_align(g_bias(net, i)) : 16;
    /* a bias below 16-byte alignment keeps the plain plan and the epilogue
     * kernel: cuDNN's engines are not trusted with less (see gop.wal_w) */
    if (df.align_b < 16)
        return 0;
    sf_conv_ptrs pf = *p;
    pf.b = g_bias(net, i);
    sf_conv_plan fp;
    if (sf_conv_plan_build(net->dnn, &df, SF_CONV_FWD, ws_limit, net->cfg.tune, &pf, &fp)) {
        sf_cuda_clear_error(); /* no fused engine: keep the plain plan */
        return 0;
    }
    const float plain_ms = plain->ms + g_time_epilogue(net, i, n, p->y);
    if (fp.ms >= 0.f && fp.ms < plain_ms) {
        sf_conv_plan_destroy(plain);
        *plain = fp;
    } else {
        sf_conv_plan_destroy(&fp);
    }
    return 0;
}

/* The cuDNN plans layer i needs, as a bit mask of sf_conv_dir (none for a thin
 * conv, the forward alone for a frozen one or one with the patch backward). */
static int g_dirs(const gop *o)
{
    if (o->thin)
        return 0;
    if (o->tpatch)
        return o->frozen ? 0 : o->want[0] ? 6 : 4;
    return o->frozen || o->patch ? 1 : (o->want[0] ? 7 : 5);
}

static void gshape_destroy(gshape *S)
{
    if (!S)
        return;
    for (int b = 0; b < SF_NET_MAX_BUF; b++)
        for (int k = 0; k < 2; k++)
            if (S->exec[b][k])
                cudaGraphExecDestroy(S->exec[b][k]);
    for (int i = 0; i < SF_MAX_LAYERS; i++) {
        for (int d = 0; d < 3; d++)
            sf_conv_plan_destroy(&S->cp[i][d]);
        sf_convt_plans_destroy(&S->tp[i]);
        sf_sdpa_plan_destroy(S->sdpa[i]);
    }
    free(S);
}

/* Plans for batch size n; a plan of workspace kind k may use lim[k] bytes and
 * is timed with workspace ws[k], on the layer's own tensors or, with tp, on
 * stand-ins for them (before the arenas exist). */
static int g_build_shape(sf_cuda_net *net, int n, void *const ws[3], const size_t lim[3], const timing_ptrs *tp,
                         gshape **out)
{
    gen_net *g = net->g;
    gshape *S = (gshape *)calloc(1, sizeof *S);
    if (!S) {
        sf_cuda_set_error("%s:%d: out of host memory", __FILE__, __LINE__);
        return -1;
    }
    S->n = n;
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &net->m.layers[i];
        const gop *o = &g->op[i];
        const int dirs = g_dirs(o);
        if (L->kind == SF_L_CONV2D) {
            for (int dir = 0; dir < 3; dir++) {
                if (!(dirs & (1 << dir)))
                    continue;
                const int k = g_ws_kind(net, i, dir);
                sf_conv_desc d;
                g_conv_desc(net, i, n, &d);
                sf_conv_ptrs p;
                g_ptrs(net, i, dir, 0, ws[k], &p);
                if (tp) {
                    p.x = tp->x;
                    p.y = tp->y;
                }
                /* every buffer's pointers are bound to this plan: align for the worst
                 * (arena tensors sit at 256-byte offsets: before the arena exists
                 * their NULL-based pointers show the same alignment) */
                d.align_x = d.align_w = d.align_y = 16;
                for (int b = 0; b < net->cfg.nbuf; b++) {
                    sf_conv_ptrs pb;
                    g_ptrs(net, i, dir, b, ws[k], &pb);
                    int a;
                    if ((a = sf_cuda_ptr_align(pb.x)) < d.align_x) d.align_x = a;
                    if ((a = sf_cuda_ptr_align(pb.w)) < d.align_w) d.align_w = a;
                    if ((a = sf_cuda_ptr_align(pb.y)) < d.align_y) d.align_y = a;
                }
                if (sf_conv_plan_build(net->dnn, &d, (sf_conv_dir)dir, lim[k], net->cfg.tune,
                                       net->cfg.tune > 1 ? &p : NULL, &S->cp[i][dir])) {
                    gshape_destroy(S);
                    return -1;
                }
                if (dir == SF_CONV_FWD && o->fusable && net->cfg.tune > 1 &&
                    g_try_fused(net, i, n, &d, &p, lim[k], &S->cp[i][dir])) {
                    gshape_destroy(S);
                    return -1;
                }
            }
        } else if (L->kind == SF_L_SELF_ATTENTION && o->sdpa) {
            size_t wsb = 0;
            char why[160] = "";
            if (sf_sdpa_plan_create(&S->sdpa[i], net->dnn, n, L->in_h, L->heads, L->in_c / L->heads, &wsb, why,
                                    sizeof why)) {
                S->sdpa[i] = NULL;
                sf_cuda_set_error("%s:%d: layer %d (self_attention): cuDNN's fused attention has a plan for batch "
                                  "%d but none for batch %d: %s", __FILE__, __LINE__, i, net->cfg.max_batch, n, why);
                gshape_destroy(S);
                return -1;
            }
            if (wsb > S->sdpa_ws)
                S->sdpa_ws = wsb;
        } else if (L->kind == SF_L_CONV_TRANSPOSE2D) {
            sf_convt_desc d;
            g_desc(net, i, n, &d);
            /* align over the pointers of every direction, by role */
            int ax = 16, aw = 16, ay = 16;
            for (int dir = 0; dir < 3; dir++) {
                if (!(dirs & (1 << dir)))
                    continue;
                sf_conv_ptrs p;
                g_ptrs(net, i, dir, 0, NULL, &p);
                int a;
                if ((a = sf_cuda_ptr_align(p.x)) < ax) ax = a;
                if ((a = sf_cuda_ptr_align(p.w)) < aw) aw = a;
                if ((a = sf_cuda_ptr_align(p.y)) < ay) ay = a;
            }
            d.align_x = ax;
            d.align_w = aw;
            d.align_y = ay;
            if (sf_convt_plans_build(net->dnn, &d, dirs, lim[g_ws_kind(net, i, SF_CONV_FWD)], net->cfg.tune, NULL,
                                     &S->tp[i])) {
                gshape_destroy(S);
                return -1;
            }
        }
    }
    *out = S;
    return 0;
}

static gshape *g_find(const sf_cuda_net *net, int n)
{
    for (int i = 0; i < net->g->n_shapes; i++)
        if (net->g->shapes[i]->n == n)
            return net->g->shapes[i];
    return NULL;
}

/* The workspace bytes the plans of S need, by workspace kind. */
static void g_shape_ws(const sf_cuda_net *net, const gshape *S, size_t need[3])
{
    need[0] = need[1] = need[2] = 0;
    for (int i = 0; i < net->g->nl; i++) {
        for (int d = 0; d < 3; d++) {
            const int k = g_ws_kind(net, i, d);
            if (sf_conv_plan_built(&S->cp[i][d]) && (size_t)S->cp[i][d].ws_bytes > need[k])
                need[k] = (size_t)S->cp[i][d].ws_bytes;
        }
        const int k = g_ws_kind(net, i, SF_CONV_FWD);
        if (S->tp[i].dirs && sf_convt_ws_bytes(&S->tp[i]) > need[k])
            need[k] = sf_convt_ws_bytes(&S->tp[i]);
    }
    if (S->sdpa_ws > need[WS_MAIN]) /* fused attention runs on the compute stream */
        need[WS_MAIN] = S->sdpa_ws;
}

__global__ void k_x2d_out(const sf_xent2d_out *in, sf_xent_out *out)
{
    out->loss = in->loss;
    out->bad = in->bad;
    out->correct = in->correct > 0x7fffffffLL ? 0x7fffffff : (int)in->correct;
    out->correct5 = in->correct5 > 0x7fffffffLL ? 0x7fffffff : (int)in->correct5;
}

/* acc += g / k; with count (a data-parallel step's sf_step_ctl.count) g is
 * first taken to the mean over the samples trained, as sf_cuda_grad_state
 * does without accumulation: a round in which none trained adds nothing.
 * acc_n sums the samples trained over the group, twice: it is the group
 * step's count for sf_cuda_grad_state (factor exactly 1, or a skip when no
 * round of the group trained a sample). */
__global__ void k_accum(float *__restrict__ acc, const float *__restrict__ g, size_t len, float inv_k,
                        const float *__restrict__ count, float *__restrict__ acc_n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const float w = count ? __fmul_rn(inv_k, sf_trained_factor(count)) : inv_k;
    if (count && i == 0) { /* the group's samples trained: [n, n], so that its check's factor is exactly 1 */
        acc_n[0] += count[0];
        acc_n[1] += count[0];
    }
    /* two roundings, as the reference: fused, a w that is not a power of
     * two (a round with a refused batch) would round differently */
    if (i < len)
        acc[i] = __fadd_rn(acc[i], __fmul_rn(g[i], w));
}

/* A data-parallel step's sample counts, reduced with its last bucket. */
static float *g_count(sf_cuda_net *net, int b)
{
    return net->cfg.grad_reduce && net->io[b].ctl ? (float *)net->io[b].ctl->count : NULL;
}

/* A rank whose loss is not finite sends a NaN as its samples trained, so
 * that the all-reduced count tells every rank to skip the step
 * (sf_cuda_grad_state): the decision must not rest on this rank's loss
 * alone, or a rank whose gradient stayed finite would step while this one
 * skips, and the ranks would part. */
__global__ void k_poison_count(const float *__restrict__ loss, float *__restrict__ count)
{
    if (!isfinite(*loss))
        count[0] = __int_as_float(0x7fc00000);
}

static int g_poison_count(sf_cuda_net *net, int b, float *count, cudaStream_t s)
{
    k_poison_count<<<1, 1, 0, s>>>(&net->io[b].result->loss, count);
    SF_CUDA_CHECK(cudaGetLastError());
    return 0;
}


/* bf16: the weights' bf16 copy from the master parameters, all of them
 * (build, set_params, restore) or the trainable slice (after a step). */
static int g_refresh_wd(sf_cuda_net *net, int all, cudaStream_t s)
{
    gen_net *g = net->g;
    if (!g->wcopy)
        return 0;
    const size_t off = all ? 0 : net->m.train_off, len = net->m.n_params - off;
    if (len == 0)
        return 0;
    return sf_cuda_weights_dev(net->params + off, E(g->wd, off, g->es), g->dt, len, NULL, s);
}

/* One flat buffer between PyTorch's layout (model) and the device layout,
 * on the host: inside each segment of segs, model index off + (o*c + ci)*rs + t
 * is device index off + (o*rs + t)*c + ci; elsewhere the two agree. */
static void g_permute_host(const float *src, float *dst, size_t n, const sf_sgd_segs *segs, int to_device)
{
    memcpy(dst, src, sizeof(float) * n);
    for (int k = 0; k < segs->n; k++) {
        const sf_perm_seg *sg = &segs->s[k];
        const size_t c = (size_t)sg->c, rs = (size_t)sg->rs, oc = sg->len / (c * rs);
        for (size_t o = 0; o < oc; o++)
            for (size_t ci = 0; ci < c; ci++)
                for (size_t t = 0; t < rs; t++) {
                    const size_t mi = sg->off + (o * c + ci) * rs + t, di = sg->off + (o * rs + t) * c + ci;
                    if (to_device)
                        dst[di] = src[mi];
                    else
                        dst[mi] = src[di];
                }
    }
}

/* Device state buffer <-> host, in PyTorch's layout. Synchronous. */
static int g_state_to_host(sf_cuda_net *net, const float *dev, float *host)
{
    const size_t n = net->m.n_params;
    float *tmp = (float *)malloc(sizeof(float) * (n ? n : 1));
    if (!tmp) {
        sf_cuda_set_error("%s:%d: out of host memory", __FILE__, __LINE__);
        return -1;
    }
    if (cudaMemcpyAsync(tmp, dev, sizeof(float) * n, cudaMemcpyDeviceToHost, net->s) != cudaSuccess ||
        cudaStreamSynchronize(net->s) != cudaSuccess) {
        free(tmp);
        sf_cuda_set_error("%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    g_permute_host(tmp, host, n, &net->g->segs_perm, 0);
    free(tmp);
    return 0;
}

static int g_state_from_host(sf_cuda_net *net, float *dev, const float *host)
{
    const size_t n = net->m.n_params;
    float *tmp = (float *)malloc(sizeof(float) * (n ? n : 1));
    if (!tmp) {
        sf_cuda_set_error("%s:%d: out of host memory", __FILE__, __LINE__);
        return -1;
    }
    g_permute_host(host, tmp, n, &net->g->segs_perm, 1);
    /* On the net's stream, synchronised before the host buffer goes: a plain
     * cudaMemcpy from pageable memory may return before its DMA lands, and
     * the stream does not wait for the legacy stream. */
    cudaError_t e = cudaStreamSynchronize(net->s);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dev, tmp, sizeof(float) * n, cudaMemcpyHostToDevice, net->s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(net->s);
    free(tmp);
    if (e != cudaSuccess) {
        sf_cuda_set_error("%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

/* Scratch of batch size n fits (sized for max_batch; checked per shape). */
static int g_scratch_fits(const sf_cuda_net *net, int n)
{
    const sf_model *m = &net->m;
    for (int i = 0; i < m->n_layers; i++) {
        const sf_layer *L = &m->layers[i];
        if (L->kind == SF_L_BATCHNORM2D &&
            sf_cuda_bn_scratch_bytes(n, L->in_c, L->in_h, L->in_w, net->g->lay) > net->g->scratch_bytes)
            return 0;
        if ((L->kind == SF_L_LAYERNORM2D || L->kind == SF_L_LAYERNORM) &&
            sf_cuda_layernorm_scratch_bytes(n, L->in_c, (size_t)L->in_h * L->in_w, g_lay_of(net->g, i)) >
                net->g->scratch_bytes)
            return 0;
    }
    if (m->segmentation && sf_cuda_xent2d_scratch_bytes(n, m->out_h, m->out_w) > net->g->scratch_bytes)
        return 0;
    return 1;
}

static int g_vpacks(sf_cuda_net *net)
{
    gen_net *g = net->g;
    for (int i = 0; i < g->nl; i++) {
        if (net->m.layers[i].kind != SF_L_CONV2D)
            continue;
        const int dirs = g_dirs(&g->op[i]);
        for (int dir = 0; dir < 3; dir++) {
            if (!(dirs & (1 << dir)))
                continue;
            for (int b = 0; b < net->cfg.nbuf; b++) {
                sf_conv_ptrs p;
                g_ptrs(net, i, dir, b, g_ws_of(net, i, dir), &p);
                if (sf_conv_vpack_make(&p, &g->op[i].vp[dir][b]))
                    return -1;
                if (dir == SF_CONV_FWD && g->op[i].fusable) {
                    p.b = g_bias(net, i);
                    if (sf_conv_vpack_make(&p, &g->op[i].vpf[b]))
                        return -1;
                }
            }
        }
    }
    return 0;
}

/* A weight slot of layer i as the GEMMs read it (bf16 nets: its bf16 copy). */
static const void *g_wslot(const sf_cuda_net *net, int i, int j)
{
    return E(net->g->wd, net->m.layers[i].p_off[j], net->g->es);
}

/* A failed call into cuDNN's fused attention, with the reason it gave or ours. */
static int g_sdpa_failed(int i, const char *what)
{
    if (!sf_cuda_last_error()[0])
        sf_cuda_set_error("%s:%d: layer %d (self_attention): cuDNN's fused attention %s failed", __FILE__, __LINE__,
                          i, what);
    return -1;
}

/* self_attention layer i (nn.MultiheadAttention): qkv = x W_in^T + b_in over
 * the n*t tokens, the heads (cuDNN's fused attention or the materialised
 * core), y = o W_out^T + b_out. qkv and o stay for the backward. */
static int g_attention_fwd(sf_cuda_net *net, gshape *S, int i, int n, const void *x, void *ws, cudaStream_t s)
{
    gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    gop *o = &g->op[i];
    const int t = L->in_h, c = L->in_c, rows = n * t, tf32 = net->cfg.tf32;
    const float *P = net->params;
    if (sf_linear_fwd_dt(net->blas, g->dt, x, rows, c, g_wslot(net, i, 0), 3 * c, o->qkv, tf32) ||
        sf_cuda_bias_act_dt(g->dt, o->qkv, P + L->p_off[1], (size_t)rows, 3 * c, 1, 0, s))
        return -1;
    if (o->sdpa) {
        if (sf_sdpa_fwd(S->sdpa[i], net->dnn, o->qkv, o->att_o, o->att_stats, ws, s))
            return g_sdpa_failed(i, "forward");
    } else if (sf_attn_core_fwd(net->blas, g->dt, o->qkv, n, t, c, L->heads, g->att_s, o->att_p, o->att_o, tf32, s)) {
        return -1;
    }
    return sf_linear_fwd_dt(net->blas, g->dt, o->att_o, rows, c, g_wslot(net, i, 2), c, o->y, tf32) ||
                   sf_cuda_bias_act_dt(g->dt, o->y, P + L->p_off[3], (size_t)rows, c, 1, 0, s)
               ? -1
               : 0;
}

/* Its backward from the forward's qkv and o (and weights or statistics):
 * the output projection's gradients and dO, the heads' dqkv, the input
 * projection's gradients and, when wanted, dx. */
static int g_attention_bwd(sf_cuda_net *net, gshape *S, int i, int b, int n, void *dx, cudaStream_t s)
{
    gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    gop *o = &g->op[i];
    const int t = L->in_h, c = L->in_c, rows = n * t, tf32 = net->cfg.tf32;
    const sf_dtype dt = g->dt;
    float *G = net->grads;
    if (sf_cuda_bias_grad_dt(dt, o->dy, NULL, (size_t)rows, c, 1, G + L->p_off[3], (float *)g->scratch, s) ||
        sf_linear_bwd_filter_dt(net->blas, dt, o->att_o, rows, c, o->dy, c, G + L->p_off[2], tf32) ||
        sf_linear_bwd_data_dt(net->blas, dt, o->dy, rows, c, g_wslot(net, i, 2), c, g->att_do, tf32))
        return -1;
    if (o->sdpa) {
        if (sf_sdpa_bwd(S->sdpa[i], net->dnn, o->qkv, o->att_o, g->att_do, o->att_stats, g->att_dqkv, net->ws, s))
            return g_sdpa_failed(i, "backward");
    } else if (sf_attn_core_bwd(net->blas, dt, o->qkv, o->att_p, g->att_do, n, t, c, L->heads, g->att_s, g->att_dqkv,
                                tf32, s)) {
        return -1;
    }
    if (sf_cuda_bias_grad_dt(dt, g->att_dqkv, NULL, (size_t)rows, 3 * c, 1, G + L->p_off[1], (float *)g->scratch, s) ||
        sf_linear_bwd_filter_dt(net->blas, dt, g_in(net, i, 0, b), rows, c, g->att_dqkv, 3 * c, G + L->p_off[0],
                                tf32))
        return -1;
    return dx && sf_linear_bwd_data_dt(net->blas, dt, g->att_dqkv, rows, c, g_wslot(net, i, 0), 3 * c, dx, tf32) ? -1
                                                                                                                : 0;
}

/* Forward of layers [from, to) of buffer b for n samples on stream s with
 * handle h (workspace ws), a profile mark after each layer when pf is set. */
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
            if (o->thin) {
                if (sf_conv_thin_fwd(dt, g->lay, x, g_wd(net, i), L->n_b ? P + L->b_off : NULL, o->y, n, L->in_c,
                                     (size_t)L->in_h * L->in_w, L->out_c, o->relu, s))
                    return -1;
                break;
            }
            if (o->s2d) {
                sf_conv_desc d;
                g_desc(net, i, n, &d);
                if (sf_conv_s2d_input(&d, x, o->s2d_x, s) || sf_conv_s2d_weight(&d, g_wd(net, i), o->s2d_w, s))
                    return -1;
            }
            if (o->wal_w)
                SF_CUDA_CHECK(cudaMemcpyAsync(o->wal_w, g_wd(net, i), g->es * L->n_w, cudaMemcpyDeviceToDevice, s));
            if (S->cp[i][SF_CONV_FWD].fused) { /* bias and ReLU inside cuDNN's kernel */
                if (sf_conv_run(h, &S->cp[i][SF_CONV_FWD], o->vpf[b]))
                    return -1;
                break;
            }
            g_view(g, n, (size_t)L->out_h * L->out_w, &outer, &inner);
            if (sf_conv_run(h, &S->cp[i][SF_CONV_FWD], o->vp[SF_CONV_FWD][b]))
                return -1;
            if ((L->n_b || o->relu) &&
                sf_cuda_bias_act_dt(dt, o->y, L->n_b ? P + L->b_off : NULL, outer, L->out_c, inner, o->relu, s))
                return -1;
            break;
        case SF_L_CONV_TRANSPOSE2D: {
            if (o->tpatch) {
                if (sf_convt_patch_fwd(dt, x, g_wd(net, i), L->n_b ? P + L->b_off : NULL, o->y, n, L->in_c, L->in_h,
                                       L->in_w, L->out_c, L->k, o->relu, s))
                    return -1;
                break;
            }
            sf_convt_ptrs p = {(void *)x, g_wd(net, i), o->y, ws};
            if (sf_convt_run(h, &S->tp[i], SF_CONV_FWD, &p))
                return -1;
            if ((L->n_b || o->relu) &&
                sf_convt_bias_act_dt(&S->tp[i].d, o->y, L->n_b ? P + L->b_off : NULL, o->relu, s))
                return -1;
            break;
        }
        case SF_L_LINEAR: /* over features (hw = 1), per pixel over a map's channels, or per token */
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
            if (sf_cuda_layernorm_fwd_dt(dt, x, n, L->in_c, (size_t)L->in_h * L->in_w, g_lay_of(g, i), P + L->w_off,
                                         P + L->b_off, L->eps, o->y, o->save,
                                         o->save + (size_t)net->cfg.max_batch * L->in_h * L->in_w, s))
                return -1;
            break;
        case SF_L_RELU:
            if (sf_cuda_relu_fwd_dt(dt, x, o->y, (size_t)n * L->out_elems, s))
                return -1;
            break;
        case SF_L_BATCHNORM2D: {
            /* with bn_add, the add's output: relu?(bn(x) + its other input) */
            const int a = o->bn_add;
            const void *res = a ? g_in(net, a, g->op[a].src[0] == i ? 1 : 0, b) : NULL;
            void *y = a ? g->op[a].y : o->y;
            const int relu = a ? g->op[a].relu : o->relu;
            if (o->frozen || eval) {
                if (sf_cuda_bn_fwd_eval_dt(dt, x, n, L->in_c, L->in_h, L->in_w, g->lay, P + L->w_off, P + L->b_off,
                                           L->eps, g->bufs + L->rm_off, g->bufs + L->rv_off, res, y, relu, s))
                    return -1;
            } else if (sf_cuda_bn_fwd_train_dt(dt, x, n, L->in_c, L->in_h, L->in_w, g->lay, P + L->w_off,
                                               P + L->b_off, L->eps, L->momentum, g->bufs + L->rm_off,
                                               g->bufs + L->rv_off, o->save, o->save + L->out_ch, res,
                                               o->bn_pool ? NULL : y, relu, g->scratch, s)) {
                return -1;
            }
            break;
        }
        case SF_L_MAXPOOL2D:
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
        case SF_L_RELU6:
        case SF_L_SIGMOID:
        case SF_L_SILU:
        case SF_L_HARDSWISH:
        case SF_L_HARDSIGMOID:
        case SF_L_GELU:
            if (sf_cuda_act_fwd_dt(dt, g_act_kind(L), x, o->y, (size_t)n * L->out_elems, s))
                return -1;
            break;
        case SF_L_MUL:
            if (sf_cuda_mul_fwd_dt(dt, g->lay, x, g_in(net, i, 1, b), o->y, n, L->out_ch, (size_t)L->out_h * L->out_w,
                                   g_mul_bcast(m, i), s))
                return -1;
            break;
        case SF_L_LAYER_SCALE:
            if (sf_cuda_channel_scale_fwd_dt(dt, g->lay, x, P + L->w_off, o->y, n, L->out_ch,
                                             (size_t)L->out_h * L->out_w, s))
                return -1;
            break;
        case SF_L_DROPOUT:
        case SF_L_STOCHASTIC_DEPTH: /* identity in evaluation and when frozen */
            if (o->frozen || eval)
                SF_CUDA_CHECK(cudaMemcpyAsync(o->y, x, g->es * n * L->out_elems, cudaMemcpyDeviceToDevice, s));
            else if (sf_cuda_dropout_dt(dt, g_drop_lay(g, i), x, o->y, n, L->out_ch, (size_t)L->out_h * L->out_w,
                                        L->p, net->cfg.drop_seed, g_seq(net, b), (uint64_t)i,
                                        L->kind == SF_L_STOCHASTIC_DEPTH, s))
                return -1;
            break;
        case SF_L_TO_TOKENS:
            if (sf_cuda_tokens_from_map_dt(dt, g->lay, x, n, L->in_c, (size_t)L->in_h * L->in_w, o->y, s))
                return -1;
            break;
        case SF_L_CLASS_TOKEN:
            if (sf_cuda_prepend_token_fwd_dt(dt, x, n, L->in_h, L->in_c, P + L->w_off, o->y, s))
                return -1;
            break;
        case SF_L_POS_EMBEDDING:
            if (sf_cuda_add_bcast_fwd_dt(dt, x, n, L->out_elems, P + L->w_off, o->y, s))
                return -1;
            break;
        case SF_L_SELECT_TOKEN:
            if (sf_cuda_select_token_fwd_dt(dt, x, n, L->in_h, L->in_c, o->y, s))
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
        default: /* flatten */
            continue;
        }
        g_mark(pf, s, "fwd", sf_layer_kind_name(L->kind), i);
    }
    return 0;
}

/* dst for input j of layer i's gradient (NULL: none wanted) and whether to add it after. */
static void *g_dst(sf_cuda_net *net, int i, int j, int *add_after)
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

static int g_add_back(sf_cuda_net *net, int i, int j, size_t len, cudaStream_t s)
{
    void *d = net->g->op[g_owner(&net->m, net->g->op[i].src[j])].dy;
    return sf_cuda_add_dt(net->g->dt, d, net->g->op[i].gtmp, d, len, 0, s);
}

/* Backward of conv layer i: backward-filter and backward-data both only read
 * dy (and x, w). Unless cfg.no_fork the filter gradient runs on the side stream
 * (its own workspace, ws2) while the data gradient runs here, and the two join
 * before the next layer's backward starts. */
static int g_conv_bwd(sf_cuda_net *net, gshape *S, int i, int b, int want_dx)
{
    gop *o = &net->g->op[i];
    cudaStream_t s = net->s;
    const int fork = !net->cfg.no_fork && want_dx;
    if (fork) {
        SF_CUDA_CHECK(cudaEventRecord(net->ev_fork[i], s));
        SF_CUDA_CHECK(cudaStreamWaitEvent(net->side, net->ev_fork[i], 0));
        SF_CUDNN_CHECK(cudnnSetStream(net->dnn, net->side));
    }
    int rc = sf_conv_run(net->dnn, &S->cp[i][SF_CONV_BWD_FILTER], o->vp[SF_CONV_BWD_FILTER][b]);
    if (fork) {
        SF_CUDNN_CHECK(cudnnSetStream(net->dnn, s));
        if (!rc)
            SF_CUDA_CHECK(cudaEventRecord(net->ev_join[i], net->side));
    }
    if (rc)
        return -1;
    if (want_dx && sf_conv_run(net->dnn, &S->cp[i][SF_CONV_BWD_DATA], o->vp[SF_CONV_BWD_DATA][b]))
        return -1;
    if (fork)
        SF_CUDA_CHECK(cudaStreamWaitEvent(s, net->ev_join[i], 0));
    return 0;
}

/* Floats of a layer's parameters after its weight: the bias and any further
 * slots, contiguous from b_off (sf_layer.p_off). */
static size_t g_after_weight(const sf_layer *L) { return sf_layer_param_count(L) - L->n_w; }

/* The gradient check's sums of layer i's gradients into its slot, on the
 * norm stream: bf16 conv weights are read where the backward wrote them
 * (bf16), everything else in fp32. */
static int g_layer_sumsq(sf_cuda_net *net, int i)
{
    gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    const int in_gd = g->wcopy && (L->kind == SF_L_CONV2D || L->kind == SF_L_CONV_TRANSPOSE2D);
    /* the slots after the bias (self_attention's output projection) follow it */
    return sf_cuda_sumsq(in_gd ? g_gd(net, i) : (const void *)(net->grads + L->w_off), in_gd ? g->dt : SF_DT_F32,
                         L->n_w, net->grads + L->b_off, g_after_weight(L),
                         g->sq_part + (size_t)g->slot[i] * SF_SUMSQ_BLOCKS, net->nst);
}

/* The gradient check's sums for layer i, whose gradients the compute stream
 * has just completed (its backward-filter joined): on the norm stream, so
 * they overlap the rest of the backward (W1's largest layer holds 75 % of
 * its parameters and finishes first). */
static int g_norm_layer(sf_cuda_net *net, int i)
{
    if (net->g->slot[i] < 0)
        return 0;
    SF_CUDA_CHECK(cudaEventRecord(net->ev_norm[i], net->s));
    SF_CUDA_CHECK(cudaStreamWaitEvent(net->nst, net->ev_norm[i], 0));
    return g_layer_sumsq(net, i);
}

/* The reduce stream's clock around each bucket's all-reduce (d_ar, per
 * buffer): stamps in the stream rather than events, because they are
 * captured into the step's CUDA graph like the all-reduce itself, and they
 * measure the collective alone, not the reduce stream's waits for the
 * backward between buckets. */
static __device__ unsigned long long clock_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__global__ void k_ar_begin(unsigned long long *t) { t[0] = clock_ns(); }
__global__ void k_ar_end(unsigned long long *t) { t[1] += clock_ns() - t[0]; }

/* One all-reduce of buffer b's step, timed into d_ar[b]. */
static int g_timed_reduce(sf_cuda_net *net, int b, const sf_grad_piece *pc, int np, cudaStream_t s)
{
    unsigned long long *t = net->g->d_ar + 2 * b;
    k_ar_begin<<<1, 1, 0, s>>>(t);
    SF_CUDA_CHECK(cudaGetLastError());
    if (net->cfg.grad_reduce(net->cfg.grad_reduce_ctx, pc, np, s))
        return -1;
    k_ar_end<<<1, 1, 0, s>>>(t);
    SF_CUDA_CHECK(cudaGetLastError());
    return 0;
}

/* The all-reduce of the bucket that layer i's backward closes (rb_top),
 * data-parallel training without accumulation: on the reduce stream once the
 * compute stream has completed layer i's backward, so the backward of the
 * layers below runs meanwhile; then, on the norm stream, the gradient check's
 * sums of each of its layers, now of the reduced gradient. The pieces are
 * the gradients where the backward wrote them: a bf16 net's convolution
 * weights in bf16 (no conversion pass; the update reads them there as
 * without a job), the rest fp32, adjacent fp32 runs merged. */
static int g_reduce_bucket(sf_cuda_net *net, int b, int i)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    const int top = g->rb_top[i];
    if (top < 0)
        return 0;
    SF_CUDA_CHECK(cudaEventRecord(net->ev_norm[i], net->s));
    SF_CUDA_CHECK(cudaStreamWaitEvent(net->rst, net->ev_norm[i], 0));
    sf_grad_piece *pc = g->pieces;
    int np = 0;
    for (int j = i; j <= top; j++) {
        const sf_layer *L = &m->layers[j];
        if (g->slot[j] < 0)
            continue;
        const int in_gd = g->wcopy && (L->kind == SF_L_CONV2D || L->kind == SF_L_CONV_TRANSPOSE2D);
        struct {
            size_t off, len;
            int bf;
        } part[2] = {{L->w_off, L->n_w, in_gd}, {L->b_off, g_after_weight(L), 0}};
        for (int k = 0; k < 2; k++) {
            if (!part[k].len)
                continue;
            float *f = net->grads + part[k].off;
            if (!part[k].bf && np > 0 && pc[np - 1].dt == SF_DT_F32 && (float *)pc[np - 1].p + pc[np - 1].len == f) {
                pc[np - 1].len += part[k].len;
                continue;
            }
            pc[np].p = part[k].bf ? g_gd(net, j) : (void *)f;
            pc[np].len = part[k].len;
            pc[np].dt = part[k].bf ? g->dt : SF_DT_F32;
            np++;
        }
    }
    float *count = g_count(net, b);
    if (i == g->rb_last && count && np > 0 && g_poison_count(net, b, count, net->rst))
        return -1;
    if (i == g->rb_last && count && np > 0) {
        pc[np].p = count;
        pc[np].len = 1;
        pc[np].dt = SF_DT_F32;
        np++;
    }
    if (np > 0 && g_timed_reduce(net, b, pc, np, net->rst))
        return -1;
    SF_CUDA_CHECK(cudaEventRecord(net->ev_reduced[i], net->rst));
    SF_CUDA_CHECK(cudaStreamWaitEvent(net->nst, net->ev_reduced[i], 0));
    for (int j = i; j <= top; j++)
        if (g->slot[j] >= 0 && g_layer_sumsq(net, j))
            return -1;
    return 0;
}

/* The end of a training step: the gradient check (norm, clipping
 * coefficient, non-finite skip: sf_grad_state), accumulation, the optimizer
 * (do_opt) and the results' copies to the host. Without accumulation the
 * per-layer sums were made during the backward (g_norm_layer); with it, the
 * check is of the accumulated gradient, at the step that applies it. convert:
 * the bf16 conv weight gradients still need their fp32 copy. With
 * data-parallel training (grad_reduce) the gradient is all-reduced first, and
 * the check, clipping and update are of the all-reduced gradient. */
static int g_opt_tail(sf_cuda_net *net, int b, int do_opt, int convert, prof *pf)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    cudaStream_t s = net->s;
    const sf_dtype dt = g->dt;
    const size_t es = g->es;
    const size_t off = m->train_off, len = m->n_params - m->train_off;
    const sf_step_ctl *ctl = net->io[b].ctl;
    const float *max_norm = ctl ? &ctl->clip_grad_norm : NULL;
    const float *loss = &net->io[b].result->loss;
    sf_grad_state *gs = g->d_gs + b;
    const int reduce = net->cfg.grad_reduce != NULL;
    float *count = g_count(net, b);
    /* Without accumulation the per-layer sums were made during the
     * backward, after each bucket's all-reduce in a data-parallel job. */
    if (!g->gacc) {
        SF_CUDA_CHECK(cudaEventRecord(net->ev_ndone, net->nst));
        SF_CUDA_CHECK(cudaStreamWaitEvent(s, net->ev_ndone, 0));
        if (sf_cuda_grad_state(g->sq_part, g->n_slots * SF_SUMSQ_BLOCKS, max_norm, loss, count, gs, g->skips, s))
            return -1;
    }
    if (g->wcopy && do_opt && !net->cfg.adamw && !g->gacc) {
        /* bf16 SGD: gradients from both copies, update, bf16 weights, one pass */
        if (sf_cuda_sgd_mixed(net->params + off, net->grads + off, E(g->gd, off, es), dt, &g->segs_gd,
                              net->mom ? net->mom + off : NULL, E(g->wd, off, es), len, net->io[b].hyper, gs, s))
            return -1;
        g_mark(pf, s, "optimizer", "", -1);
    } else {
        /* bf16: the conv weight gradients into the fp32 gradients (the linear
         * layers wrote theirs there in fp32) */
        if (convert && g->wcopy &&
            sf_cuda_grads_model(E(g->gd, off, es), dt, net->grads + off, &g->segs_gd, s))
            return -1;
        /* Data-parallel with accumulation: every rank's share of this
         * batch's global mean, summed, then accumulated; the check is of the
         * accumulated sum, below. */
        const sf_grad_piece all[2] = {{net->grads + off, len, SF_DT_F32}, {count, 1, SF_DT_F32}};
        if (reduce && g->gacc && count && g_poison_count(net, b, count, s))
            return -1;
        if (reduce && g->gacc && g_timed_reduce(net, b, all, count ? 2 : 1, s))
            return -1;
        const float *grad = net->grads + off;
        if (g->gacc) {
            const float inv_k = 1.0f / (float)net->cfg.accum;
            k_accum<<<(unsigned)((len + 255) / 256 ? (len + 255) / 256 : 1), 256, 0, s>>>(
                g->gacc + off, net->grads + off, len, inv_k, count, g->gacc_n);
            SF_CUDA_CHECK(cudaGetLastError());
            grad = g->gacc + off;
            if (do_opt) {
                if (sf_cuda_sumsq(grad, SF_DT_F32, len, NULL, 0, g->sq_part, s) ||
                    sf_cuda_grad_state(g->sq_part, SF_SUMSQ_BLOCKS, max_norm, loss, count ? g->gacc_n : NULL, gs,
                                       g->skips, s))
                    return -1;
            } else {
                SF_CUDA_CHECK(cudaMemsetAsync(gs, 0, sizeof *gs, s));
            }
        }
        if (do_opt) {
            if (net->cfg.adamw) {
                if (sf_cuda_adamw(net->params + off, grad, net->mom + off, g->sq + off, NULL, len, net->io[b].adamw,
                                  NULL, gs, g->skips, s))
                    return -1;
            } else if (sf_cuda_sgd(net->params + off, grad, net->mom + off, NULL, len, net->io[b].hyper, &k_no_segs,
                                   gs, s)) {
                return -1;
            }
            if (g->gacc) {
                SF_CUDA_CHECK(cudaMemsetAsync(g->gacc + off, 0, sizeof(float) * len, s));
                SF_CUDA_CHECK(cudaMemsetAsync(g->gacc_n, 0, 2 * sizeof(float), s));
            }
            /* a skipped step left the weights as they were: their copy too */
            if (g_refresh_wd(net, 0, s))
                return -1;
            g_mark(pf, s, "optimizer", "", -1);
        }
    }
    /* rank 0's running statistics to every rank, once this step's forward
     * has moved them (captured in the step's graph like the all-reduce) */
    if (reduce && net->cfg.buf_broadcast && g->has_bn_train && m->n_buffers &&
        net->cfg.buf_broadcast(net->cfg.grad_reduce_ctx, g->bufs, m->n_buffers, s))
        return -1;
    SF_CUDA_CHECK(cudaMemcpyAsync(g->h_gs + b, gs, sizeof *gs, cudaMemcpyDeviceToHost, s));
    SF_CUDA_CHECK(cudaMemcpyAsync(net->io[b].h_result, net->io[b].result, sizeof(sf_xent_out),
                                  cudaMemcpyDeviceToHost, s));
    if (reduce) {
        /* every bucket's end is behind this stream's wait for the norm
         * stream (ev_ndone) or on it (accumulation) */
        SF_CUDA_CHECK(cudaMemcpyAsync(g->h_ar + b, g->d_ar + 2 * b + 1, sizeof *g->h_ar, cudaMemcpyDeviceToHost, s));
        SF_CUDA_CHECK(cudaMemsetAsync(g->d_ar + 2 * b + 1, 0, sizeof *g->d_ar, s));
    }
    return 0;
}

int sf_net_step_empty(sf_cuda_net *net, int b, int do_opt)
{
    if (b < 0 || b >= net->cfg.nbuf) {
        sf_cuda_set_error("%s:%d: sf_net_step_empty: buffer %d", __FILE__, __LINE__, b);
        return -1;
    }
    const sf_model *m = &net->m;
    const size_t off = m->train_off, len = m->n_params - m->train_off;
    SF_CUDA_CHECK(cudaMemsetAsync(net->grads + off, 0, sizeof(float) * len, net->s));
    if (net->g->wcopy)
        SF_CUDA_CHECK(cudaMemsetAsync(E(net->g->gd, off, net->g->es), 0, net->g->es * len, net->s));
    SF_CUDA_CHECK(cudaMemsetAsync(net->io[b].result, 0, sizeof(sf_xent_out), net->s));
    /* the same buckets, in the same order, as the other ranks' backward */
    if (net->cfg.grad_reduce && !net->g->gacc)
        for (int i = net->g->nl - 1; i >= net->g->nf; i--)
            if (g_reduce_bucket(net, b, i))
                return -1;
    return g_opt_tail(net, b, do_opt, 0, NULL);
}

int sf_net_param_digest(sf_cuda_net *net, uint64_t *digest)
{
    return sf_cuda_digest(net->params, net->m.n_params, digest, net->s);
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

static int g_step(sf_cuda_net *net, gshape *S, int b, int n, int do_opt, prof *pf)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    cudaStream_t s = net->s;
    const float *P = net->params;
    const int tf32 = net->cfg.tf32;
    const sf_dtype dt = g->dt;
    if (g_forward(net, S, g->nf, g->nl, n, b, s, net->dnn, net->ws, pf, 0))
        return -1;
    /* loss, in fp32 */
    const int last = g->nl - 1;
    if (g_loss(net, b, n, 1))
        return -1;
    g_mark(pf, s, "loss", "", -1);
    /* backward */
    for (int i = last; i >= g->nf; i--) {
        const sf_layer *L = &m->layers[i];
        gop *o = &g->op[i];
        if (o->fused)
            continue;
        const size_t in_len = (size_t)n * L->in_c * L->in_h * L->in_w;
        const void *ymask = o->relu ? o->y : NULL;
        int add0 = 0;
        void *dx = g_dst(net, i, 0, &add0);
        size_t outer, inner;
        switch (L->kind) {
        case SF_L_CONV2D:
            if (o->thin) {
                if (sf_conv_thin_bwd(dt, g->lay, g_in(net, i, 0, b), g_wd(net, i), ymask, o->dy, dx, g_gd(net, i),
                                     L->n_b ? net->grads + L->b_off : NULL, n, L->in_c, (size_t)L->in_h * L->in_w,
                                     L->out_c, (float *)g->scratch, s))
                    return -1;
                break;
            }
            if (o->patch) {
                if (sf_conv_patch_bwd(dt, g_in(net, i, 0, b), g_wd(net, i), ymask, o->dy, dx, g_gd(net, i),
                                      L->n_b ? net->grads + L->b_off : NULL, n, L->in_c, L->in_h, L->in_w, L->out_c,
                                      L->k, (float *)g->scratch, s))
                    return -1;
                break;
            }
            g_view(g, n, (size_t)L->out_h * L->out_w, &outer, &inner);
            if ((L->n_b || o->relu) &&
                sf_cuda_bias_grad_dt(dt, o->dy, ymask, outer, L->out_c, inner, L->n_b ? net->grads + L->b_off : NULL,
                                     (float *)g->scratch, s))
                return -1;
            if (g_conv_bwd(net, S, i, b, dx != NULL))
                return -1;
            if (o->wal_gw)
                SF_CUDA_CHECK(cudaMemcpyAsync(g_gd(net, i), o->wal_gw, g->es * L->n_w, cudaMemcpyDeviceToDevice, s));
            if (o->s2d) {
                sf_conv_desc d;
                g_desc(net, i, n, &d);
                if (sf_conv_s2d_wgrad(&d, o->s2d_gw, g_gd(net, i), s))
                    return -1;
            }
            break;
        case SF_L_CONV_TRANSPOSE2D: {
            if ((L->n_b || o->relu) &&
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
            break;
        }
        case SF_L_LINEAR: {
            const size_t hw = (size_t)L->out_h * L->out_w;
            const sf_layout ll = g_lay_of(g, i);
            g_view_of(g, i, n, hw, &outer, &inner);
            if ((L->n_b || o->relu) &&
                sf_cuda_bias_grad_dt(dt, o->dy, ymask, outer, L->out_c, inner, L->n_b ? net->grads + L->b_off : NULL,
                                     (float *)g->scratch, s))
                return -1;
            if (sf_linear_map_bwd_filter_dt(net->blas, dt, ll, g_in(net, i, 0, b), n, hw, L->in_c, o->dy, L->out_c,
                                            net->grads + L->w_off, tf32))
                return -1;
            if (dx && sf_linear_map_bwd_data_dt(net->blas, dt, ll, o->dy, n, hw, L->in_c, g_wd(net, i), L->out_c, dx,
                                                tf32))
                return -1;
            break;
        }
        case SF_L_LAYERNORM2D:
        case SF_L_LAYERNORM:
            if (sf_cuda_layernorm_bwd_dt(dt, g_in(net, i, 0, b), o->dy, n, L->in_c, (size_t)L->in_h * L->in_w,
                                         g_lay_of(g, i),
                                         P + L->w_off, o->save,
                                         o->save + (size_t)net->cfg.max_batch * L->in_h * L->in_w, dx,
                                         net->grads + L->w_off, net->grads + L->b_off, g->scratch, s))
                return -1;
            break;
        case SF_L_RELU:
            if (dx && sf_cuda_relu_bwd_dt(dt, o->y, o->dy, dx, in_len, s))
                return -1;
            break;
        case SF_L_BATCHNORM2D:
            if (sf_cuda_bn_bwd_dt(dt, g_in(net, i, 0, b), n, L->in_c, L->in_h, L->in_w, g->lay, P + L->w_off,
                                  P + L->b_off, o->save,
                                  o->save + L->out_ch, o->dy, ymask, dx ? dx : o->gtmp, net->grads + L->w_off,
                                  net->grads + L->b_off, g->scratch, s))
                return -1;
            break;
        case SF_L_MAXPOOL2D:
            if (dx && sf_cuda_maxpool_bwd_dt(dt, o->dy, o->argmax, n, L->in_c, L->in_h, L->in_w, L->k, L->stride,
                                             L->pad, L->ceil_mode, g->lay, dx, s))
                return -1;
            break;
        case SF_L_GLOBAL_AVGPOOL:
            if (dx && sf_cuda_avgpool_bwd_dt(dt, o->dy, n, L->in_c, L->in_h, L->in_w, g->lay, dx, s))
                return -1;
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
        case SF_L_ADD: {
            /* The (ReLU-masked) gradient goes to both inputs: to the ones this
             * layer writes first in one pass (a ResNet block's add writes both
             * of its inputs' gradients: one pass instead of a mask pass and two
             * copies), then into the ones already written. */
            void *cp[2] = {NULL, NULL}, *sum[2] = {NULL, NULL};
            int nc = 0, ns = 0;
            for (int j = 0; j < 2; j++) {
                int addj = 0;
                void *d = g_dst(net, i, j, &addj);
                if (!d)
                    continue;
                if (addj)
                    sum[ns++] = g->op[g_owner(m, o->src[j])].dy;
                else
                    cp[nc++] = d;
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
            g_mark(pf, s, "bwd", sf_layer_kind_name(L->kind), i);
            continue;
        }
        case SF_L_RELU6:
        case SF_L_SIGMOID:
        case SF_L_SILU:
        case SF_L_HARDSWISH:
        case SF_L_HARDSIGMOID:
        case SF_L_GELU:
            if (dx && sf_cuda_act_bwd_dt(dt, g_act_kind(L), g_in(net, i, 0, b), o->dy, dx, in_len, s))
                return -1;
            break;
        case SF_L_MUL: {
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
            add0 = 0;
            break;
        }
        case SF_L_LAYER_SCALE:
            if (sf_cuda_channel_scale_bwd_dt(dt, g->lay, g_in(net, i, 0, b), P + L->w_off, o->dy, dx,
                                             net->grads + L->w_off, n, L->out_ch, (size_t)L->out_h * L->out_w,
                                             (float *)g->scratch, s))
                return -1;
            break;
        case SF_L_DROPOUT:
        case SF_L_STOCHASTIC_DEPTH: /* the forward's mask, drawn again, on dy */
            if (dx && sf_cuda_dropout_dt(dt, g_drop_lay(g, i), o->dy, dx, n, L->out_ch, (size_t)L->out_h * L->out_w,
                                         L->p, net->cfg.drop_seed, g_seq(net, b), (uint64_t)i,
                                         L->kind == SF_L_STOCHASTIC_DEPTH, s))
                return -1;
            break;
        case SF_L_TO_TOKENS:
            if (dx && sf_cuda_tokens_to_map_dt(dt, g->lay, o->dy, n, L->in_c, (size_t)L->in_h * L->in_w, dx, s))
                return -1;
            break;
        case SF_L_CLASS_TOKEN:
            if (sf_cuda_prepend_token_bwd_dt(dt, o->dy, n, L->in_h, L->in_c, dx, net->grads + L->w_off, s))
                return -1;
            break;
        case SF_L_POS_EMBEDDING: /* the input's gradient is dy itself */
            if (sf_cuda_add_bcast_bwd_dt(dt, o->dy, n, L->out_elems, net->grads + L->w_off, s))
                return -1;
            if (dx)
                SF_CUDA_CHECK(cudaMemcpyAsync(dx, o->dy, g->es * in_len, cudaMemcpyDeviceToDevice, s));
            break;
        case SF_L_SELECT_TOKEN:
            if (dx && sf_cuda_select_token_bwd_dt(dt, o->dy, n, L->in_h, L->in_c, dx, s))
                return -1;
            break;
        case SF_L_SELF_ATTENTION:
            if (g_attention_bwd(net, S, i, b, n, dx, s))
                return -1;
            break;
        case SF_L_CONCAT:
            /* each input's slice of dy, one input after another (gtmp is shared) */
            for (int j = 0, c0 = 0; j < o->n_in; c0 += g_in_c(m, i, j), j++) {
                int addj = 0;
                void *d = g_dst(net, i, j, &addj);
                const int cj = g_in_c(m, i, j);
                const size_t hw = (size_t)L->out_h * L->out_w;
                if (d && (sf_cuda_concat_take_dt(dt, g->lay, o->dy, n, cj, hw, L->out_ch, c0, d, s) ||
                          (addj && g_add_back(net, i, j, (size_t)n * cj * hw, s))))
                    return -1;
            }
            add0 = 0;
            break;
        default:
            continue;
        }
        if (dx && add0 && g_add_back(net, i, 0, in_len, s))
            return -1;
        g_mark(pf, s, "bwd", sf_layer_kind_name(L->kind), i);
        if (!g->gacc && (net->cfg.grad_reduce ? g_reduce_bucket(net, b, i) : g_norm_layer(net, i)))
            return -1;
    }
    return g_opt_tail(net, b, do_opt, 1, pf);
}

/* k: do_opt (0, 1) for a training step, 2 for an evaluation step. */
static int g_capture(sf_cuda_net *net, gshape *S, int b, int n, int k)
{
    cudaGraph_t gr = NULL;
    SF_CUDA_CHECK(cudaStreamBeginCapture(net->s, cudaStreamCaptureModeThreadLocal));
    int rc = k == 2 ? g_eval(net, S, b, n) : g_step(net, S, b, n, k, NULL);
    char msg[SF_CUDA_ERR_LEN];
    scopy(msg, sizeof msg, sf_cuda_last_error());
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
     * instead of 21k); W1's engines want at most 201 MB. */
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
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tune_bytes > fr / 16 && fr / 16 >= WS_TUNE_MIN)
        tune_bytes = fr / 16;
    char *tmp = NULL;
    if (cudaMalloc((void **)&tmp, in_max + out_max + tune_bytes) != cudaSuccess) {
        cudaGetLastError();
        tune_bytes = WS_TUNE_MIN;
        SF_CUDA_CHECK(cudaMalloc((void **)&tmp, in_max + out_max + tune_bytes));
    }
    gshape *S = NULL;
    const timing_ptrs tp = {tmp, tmp + in_max};
    void *const tws[3] = {tmp + in_max + out_max, tmp + in_max + out_max, tmp + in_max + out_max};
    const size_t tlim[3] = {tune_bytes, tune_bytes, tune_bytes};
    int rc = g_build_shape(net, net->cfg.max_batch, tws, tlim, &tp, &S);
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
    if (!g_scratch_fits(net, n)) {
        sf_cuda_set_error("%s:%d: batch size %d needs more scratch than max_batch's", __FILE__, __LINE__, n);
        return -1;
    }
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
            scopy(net->graph_err, sizeof net->graph_err, sf_cuda_last_error());
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
                             const sf_net_io *io, cudnnHandle_t dnn, cublasHandle_t blas, cudaStream_t s)
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
    net->blas = blas;
    net->s = s;
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

extern "C" int sf_net_get_params(sf_cuda_net *net, float *host) { return g_state_to_host(net, net->params, host); }

extern "C" int sf_net_set_params(sf_cuda_net *net, const float *host)
{
    if (g_state_from_host(net, net->params, host) || g_refresh_wd(net, 1, net->s))
        return -1;
    SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    return 0;
}

/* SGD keeps a momentum buffer only once a step asks for momentum, as
 * torch.optim.SGD does: a model trained without momentum saves 4 bytes per
 * parameter. The graphs captured before baked the absent buffer into the
 * optimizer's launch, so they are dropped and captured again (an exec still
 * running is freed when it completes). */
extern "C" int sf_net_use_momentum(sf_cuda_net *net)
{
    gen_net *g = net->g;
    if (net->mom)
        return 0;
    if (g_alloc_shift(net, &net->mom, net->m.n_params, net->m.train_off))
        return -1;
    for (int k = 0; k < g->n_shapes; k++)
        for (int b = 0; b < SF_NET_MAX_BUF; b++)
            for (int o = 0; o < 2; o++)
                if (g->shapes[k]->exec[b][o]) {
                    cudaGraphExecDestroy(g->shapes[k]->exec[b][o]);
                    g->shapes[k]->exec[b][o] = NULL;
                }
    return 0;
}

extern "C" int sf_net_get_momentum(sf_cuda_net *net, float *host)
{
    if (!net->mom) {
        memset(host, 0, sizeof(float) * net->m.n_params);
        return 0;
    }
    return g_state_to_host(net, net->mom, host);
}

extern "C" int sf_net_set_momentum(sf_cuda_net *net, const float *host)
{
    if (!net->mom) {
        size_t i = 0;
        while (i < net->m.n_params && host[i] == 0.f)
            i++;
        if (i == net->m.n_params)
            return 0; /* all zeros: the state of a net without a buffer */
        if (sf_net_use_momentum(net))
            return -1;
    }
    return g_state_from_host(net, net->mom, host);
}

extern "C" size_t sf_net_state_floats(const sf_cuda_net *net)
{
    const gen_net *g = net->g;
    return 2 * net->m.n_params + net->m.n_buffers + (g->sq ? net->m.n_params : 0) + (g->gacc ? net->m.n_params + 2 : 0);
}

extern "C" int sf_net_save_state(sf_cuda_net *net, float *dev)
{
    gen_net *g = net->g;
    const size_t n = net->m.n_params;
    SF_CUDA_CHECK(cudaMemcpyAsync(dev, net->params, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
    if (net->mom)
        SF_CUDA_CHECK(cudaMemcpyAsync(dev + n, net->mom, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
    else
        SF_CUDA_CHECK(cudaMemsetAsync(dev + n, 0, sizeof(float) * n, net->s));
    float *d = dev + 2 * n;
    if (net->m.n_buffers)
        SF_CUDA_CHECK(cudaMemcpyAsync(d, g->bufs, sizeof(float) * net->m.n_buffers, cudaMemcpyDeviceToDevice, net->s));
    d += net->m.n_buffers;
    if (g->sq) {
        SF_CUDA_CHECK(cudaMemcpyAsync(d, g->sq, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
        d += n;
    }
    if (g->gacc) {
        SF_CUDA_CHECK(cudaMemcpyAsync(d, g->gacc, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
        SF_CUDA_CHECK(cudaMemcpyAsync(d + n, g->gacc_n, 2 * sizeof(float), cudaMemcpyDeviceToDevice, net->s));
    }
    g->nbt_saved = g->nbt;
    return 0;
}

extern "C" int sf_net_restore_state(sf_cuda_net *net, const float *dev)
{
    gen_net *g = net->g;
    const size_t n = net->m.n_params;
    SF_CUDA_CHECK(cudaMemcpyAsync(net->params, dev, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
    if (net->mom) /* else it was never used, before the snapshot or since */
        SF_CUDA_CHECK(cudaMemcpyAsync(net->mom, dev + n, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
    const float *d = dev + 2 * n;
    if (net->m.n_buffers)
        SF_CUDA_CHECK(cudaMemcpyAsync(g->bufs, d, sizeof(float) * net->m.n_buffers, cudaMemcpyDeviceToDevice, net->s));
    d += net->m.n_buffers;
    if (g->sq) {
        SF_CUDA_CHECK(cudaMemcpyAsync(g->sq, d, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
        d += n;
    }
    if (g->gacc) {
        SF_CUDA_CHECK(cudaMemcpyAsync(g->gacc, d, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
        SF_CUDA_CHECK(cudaMemcpyAsync(g->gacc_n, d + n, 2 * sizeof(float), cudaMemcpyDeviceToDevice, net->s));
    }
    g->nbt = g->nbt_saved;
    return g_refresh_wd(net, 1, net->s);
}

extern "C" int sf_net_frozen_fwd(sf_cuda_net *net, int b, int n, cudaStream_t s) { return g_frozen_fwd(net, b, n, s); }

extern "C" int sf_net_get_buffers(sf_cuda_net *net, float *host, uint64_t *nbt)
{
    if (net->m.n_buffers) {
        SF_CUDA_CHECK(cudaMemcpyAsync(host, net->g->bufs, sizeof(float) * net->m.n_buffers, cudaMemcpyDeviceToHost,
                                      net->s));
        SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    }
    if (nbt)
        *nbt = net->g->nbt;
    return 0;
}

extern "C" int sf_net_set_buffers(sf_cuda_net *net, const float *host, uint64_t nbt)
{
    if (host && net->m.n_buffers) {
        SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
        SF_CUDA_CHECK(cudaMemcpyAsync(net->g->bufs, host, sizeof(float) * net->m.n_buffers, cudaMemcpyHostToDevice,
                                      net->s));
        SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    }
    net->g->nbt = nbt;
    return 0;
}

extern "C" int sf_net_get_sq(sf_cuda_net *net, float *host)
{
    if (!net->g->sq) {
        memset(host, 0, sizeof(float) * net->m.n_params);
        return 0;
    }
    return g_state_to_host(net, net->g->sq, host);
}

extern "C" int sf_net_set_sq(sf_cuda_net *net, const float *host)
{
    if (!net->g->sq)
        return 0;
    return g_state_from_host(net, net->g->sq, host);
}

extern "C" int sf_net_reset_accum(sf_cuda_net *net)
{
    if (net->g->gacc) {
        SF_CUDA_CHECK(cudaMemsetAsync(net->g->gacc, 0, sizeof(float) * net->m.n_params, net->s));
        SF_CUDA_CHECK(cudaMemsetAsync(net->g->gacc_n, 0, 2 * sizeof(float), net->s));
        SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    }
    return 0;
}

extern "C" int sf_net_reset_skips(sf_cuda_net *net)
{
    SF_CUDA_CHECK(cudaMemsetAsync(net->g->skips, 0, sizeof(unsigned), net->s));
    SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    return 0;
}

/* One line per conv/convT plan of batch size n, then the net's summary. */
extern "C" void sf_net_describe(const sf_cuda_net *net, int n, char *buf, size_t len)
{
    static const char *dn[3] = {"fwd", "dgrad", "wgrad"};
    const gen_net *g = net->g;
    const gshape *S = g_find(net, n);
    size_t at = 0;
    if (!S)
        return;
    for (int i = 0; i < g->nl && at < len; i++) {
        const sf_layer *L = &net->m.layers[i];
        if (L->kind != SF_L_CONV2D && L->kind != SF_L_CONV_TRANSPOSE2D)
            continue;
        if (g->op[i].thin) {
            int w = snprintf(buf + at, len - at,
                             "layer %d %s %d->%d k%d s%d %dx%d fwd+dgrad+wgrad: thin 1x1 kernels%s\n", i,
                             sf_layer_kind_name(L->kind), L->in_c, L->out_c, L->k, L->stride, L->in_h, L->in_w,
                             g->op[i].relu ? " (bias and ReLU inside)" : "");
            if (w < 0)
                break;
            at += (size_t)w;
            continue;
        }
        if (g->op[i].patch || g->op[i].tpatch) {
            int w = snprintf(buf + at, len - at, "layer %d %s %d->%d k%d s%d %dx%d %s: %s patch kernel%s\n", i,
                             sf_layer_kind_name(L->kind), L->in_c, L->out_c, L->k, L->stride, L->in_h, L->in_w,
                             g->op[i].patch ? "dgrad+wgrad" : "fwd", g->op[i].patch ? "one-pass" : "per-pixel",
                             !g->op[i].relu ? "" : g->op[i].patch ? " (ReLU mask and bias gradient inside)"
                                                                   : " (bias and ReLU inside)");
            if (w < 0)
                break;
            at += (size_t)w;
        }
        if (g->op[i].s2d) {
            sf_conv_desc d, d2;
            g_desc(net, i, n, &d);
            sf_conv_s2d_desc(&d, &d2);
            int w = snprintf(buf + at, len - at, "layer %d %s %d->%d k%d s%d %dx%d fwd+wgrad: space-to-depth, as %d->%d k%d s1 %dx%d\n",
                             i, sf_layer_kind_name(L->kind), L->in_c, L->out_c, L->k, L->stride, L->in_h, L->in_w,
                             d2.c, d2.oc, d2.k, d2.h, d2.w);
            if (w < 0)
                break;
            at += (size_t)w;
        }
        for (int d = 0; d < 3 && at < len; d++) {
            const sf_conv_plan *p = L->kind == SF_L_CONV2D ? &S->cp[i][d] : &S->tp[i].plan[d];
            if (!sf_conv_plan_built(p))
                continue;
            /* a pointwise conv without a usable cuDNN engine runs as cuBLAS GEMMs (conv_gemm.h) */
            int w = p->gemm
                        ? snprintf(buf + at, len - at,
                                   "layer %d %s %d->%d k%d s%d %dx%d %s%s: engine cuBLAS GEMM (pointwise, no cuDNN "
                                   "engine) %s ws %lld B, %.3f ms\n",
                                   i, sf_layer_kind_name(L->kind), L->in_c, L->out_c, L->k, L->stride, L->in_h,
                                   L->in_w, dn[d], p->fused ? "+bias/relu" : "", sf_conv_prec_name(p->dt, p->tensor_core),
                                   (long long)p->ws_bytes, p->ms)
                        : snprintf(buf + at, len - at, "layer %d %s %d->%d k%d s%d %dx%d %s%s: engine %lld%s ws %lld B, %.3f ms (of %d)\n",
                             i, sf_layer_kind_name(L->kind), L->in_c, L->out_c, L->k, L->stride, L->in_h, L->in_w,
                             dn[d], p->fused ? "+bias/relu fused" : "", (long long)p->engine, p->tensor_core ? " tc" : "", (long long)p->ws_bytes, p->ms,
                             p->tried);
            if (w < 0)
                break;
            at += (size_t)w;
        }
    }
    if (at < len && g->n_attn) {
        int w = snprintf(buf + at, len - at, "attention: %d of %d self_attention layers on cuDNN's fused attention%s%s\n",
                         g->n_sdpa, g->n_attn, g->n_sdpa < g->n_attn ? ", the others on the materialised core: " : "",
                         g->n_sdpa < g->n_attn ? g->sdpa_why : "");
        if (w > 0)
            at += (size_t)w;
    }
    if (at < len && g->n_wal) {
        int w = snprintf(buf + at, len - at,
                         "alignment: %d conv layers run cuDNN on 16-byte aligned copies of their weights (their "
                         "weights sit below that alignment in the parameter buffer)\n", g->n_wal);
        if (w > 0)
            at += (size_t)w;
    }
    if (at < len) {
        int w = snprintf(buf + at, len - at,
                         "memory plan: layer outputs, gradients and gradient scratch in %zu B (trainable arena) "
                         "+ %zu B (frozen arena), %zu B as one buffer each\n",
                         g->arena_bytes, g->farena_bytes, g->tensor_bytes);
        if (w > 0)
            at += (size_t)w;
    }
    if (at < len)
        snprintf(buf + at, len - at,
                 "batch %d, layout %s, %s; the net holds %zu B of device memory in %d allocations (workspaces: "
                 "compute %zu B, side %zu B, frozen %zu B)%s%s\n",
                 n, g->lay == SF_LAYOUT_NHWC ? "nhwc" : "nchw",
                 g->dt == SF_DT_BF16 ? "bf16" : net->cfg.tf32 ? "tf32" : "fp32", net->alloc_bytes, net->n_allocs,
                 net->ws_size[WS_MAIN], net->ws2 ? net->ws_size[WS_SIDE] : 0, g->fws ? net->ws_size[WS_FROZEN] : 0,
                 net->graphs_broken ? ", graphs off: " : "", net->graphs_broken ? net->graph_err : "");
}

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
