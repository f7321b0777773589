/* gpu/cuda/pipeline.cu — the training step on the device. Contract in pipeline.h.
 *
 * The model's layer chain becomes a list of ops:
 *   CONV, LINEAR  cuDNN / cuBLAS, then one bias(+ReLU) epilogue kernel; a ReLU
 *                 layer that follows a conv/linear (possibly through flattens)
 *                 is fused into that epilogue and its backward into the bias
 *                 gradient pass (one read of dy and y, one write of dy). For a
 *                 conv, cuDNN's own fused conv+bias+ReLU graph replaces conv +
 *                 epilogue where it times faster (on W1 in TF32/NHWC: every
 *                 layer, 2.36 -> 2.19 ms per step on an H100).
 *   RELU          a ReLU that has no producer to fuse into.
 *   FLAT_T        flatten of an NHWC tensor with h*w > 1: a transpose to NCHW
 *                 order, so linear weights keep PyTorch's layout.
 *   VIEW          any other flatten: no data movement.
 * Gradients flow backwards through two ping-pong buffers.
 *
 * Parameters, gradients and momentum are one allocation each, carved by the
 * model's w_off/b_off. With NHWC activations the k>1 conv weights also live in
 * wdev in KRSC order at the same offsets: the forward and backward-data passes
 * read wdev, backward-filter writes its gradient into grads in KRSC order, and
 * the SGD kernel reads that gradient permuted and writes both copies.
 */
#include "pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define WS_TUNE_BYTES ((size_t)512 << 20) /* workspace limit while choosing engines */
#define WS_MIN_BYTES ((size_t)32 << 20)   /* slack for plans of other batch sizes */
#define MAX_ALLOCS 512

typedef enum op_kind { OP_CONV, OP_LINEAR, OP_RELU, OP_FLAT_T, OP_VIEW } op_kind;

typedef struct net_op {
    op_kind kind;
    int layer;          /* model layer index */
    int relu;           /* CONV/LINEAR: ReLU fused into the epilogue */
    int bias;           /* has a bias */
    int x_op;           /* op producing the input; -1: the network input */
    int need_dx;        /* some earlier op has parameters: propagate the gradient */
    int in_c, in_h, in_w, out_c, out_h, out_w;
    size_t in_elems, out_elems; /* per sample */
    float *y;           /* own output [max_batch, out_elems]; NULL for VIEW */
    float *g_in, *g_out; /* gradient of the output / of the input (NULL: none) */
    float *w_fwd;       /* weights read by forward and backward-data */
    int permuted;       /* w_fwd is the KRSC copy in wdev */
    sf_conv_desc cd;    /* n filled per shape */
    cudnnBackendDescriptor_t vp[3][SF_NET_MAX_BUF];
    cudnnBackendDescriptor_t vpf[SF_NET_MAX_BUF]; /* fused forward (binds the bias too) */
    int fusable;        /* CONV with a bias or ReLU epilogue and cfg.fuse */
} net_op;

typedef struct gen_net gen_net; /* the general path (W2/W3), below */

typedef struct net_shape {
    int n;
    sf_conv_plan plan[SF_MAX_LAYERS][3];
    cudaGraphExec_t exec[SF_NET_MAX_BUF];
} net_shape;

struct sf_cuda_net {
    sf_model m;
    sf_net_cfg cfg;
    sf_net_io io[SF_NET_MAX_BUF];
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    cudaStream_t s;

    int n_ops;
    net_op ops[SF_MAX_LAYERS];

    float *params, *grads, *mom, *wdev; /* [n_params] each; wdev only with KRSC segments */
    float *gbuf[2];                     /* [max_batch * max_act] */
    float *dlog;                        /* [max_batch * n_classes] */
    float *bg_scratch;
    size_t bg_scratch_floats;
    void *ws;           /* forward and backward-data plans (on s) */
    void *ws2;          /* backward-filter plans (on side when forked) */
    size_t ws_bytes;    /* each of ws, ws2 */
    sf_sgd_segs segs;

    cudaStream_t side;  /* backward-filter beside backward-data */
    cudaEvent_t ev_fork[SF_MAX_LAYERS], ev_join[SF_MAX_LAYERS];

    net_shape *shapes[SF_NET_MAX_SHAPES];
    int n_shapes;

    int graphs_broken;
    char graph_err[256];

    void *allocs[MAX_ALLOCS];
    int n_allocs;

    gen_net *g;         /* the general path; NULL for W1 chain models */
};

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


static int dmalloc(sf_cuda_net *net, void **p, size_t bytes)
{
    if (net->n_allocs >= MAX_ALLOCS) {
        sf_cuda_set_error("%s:%d: net: too many allocations", __FILE__, __LINE__);
        return -1;
    }
    SF_CUDA_CHECK(cudaMalloc(p, bytes ? bytes : 256));
    net->allocs[net->n_allocs++] = *p;
    return 0;
}

static int dmallocf(sf_cuda_net *net, float **p, size_t floats)
{
    return dmalloc(net, (void **)p, floats * sizeof(float));
}

static float *op_in(const sf_cuda_net *net, int i, int b);

static float *op_out(const sf_cuda_net *net, int i, int b)
{
    return net->ops[i].y ? net->ops[i].y : op_in(net, i, b);
}

static float *op_in(const sf_cuda_net *net, int i, int b)
{
    const int x = net->ops[i].x_op;
    return x < 0 ? (float *)net->io[b].x : op_out(net, x, b);
}

/* [outer, c, inner] view of an op's output. */
static void out_view(const sf_cuda_net *net, const net_op *o, int n, size_t *outer, size_t *inner)
{
    const size_t hw = (size_t)o->out_h * o->out_w;
    if (net->cfg.layout == SF_LAYOUT_NHWC) {
        *outer = (size_t)n * hw;
        *inner = 1;
    } else {
        *outer = (size_t)n;
        *inner = hw;
    }
}

/* ---- building the op list ------------------------------------------------- */

static int build_ops(sf_cuda_net *net)
{
    const sf_model *m = &net->m;
    const int nhwc = net->cfg.layout == SF_LAYOUT_NHWC;
    int n = 0, prev = -1;
    for (int li = 0; li < m->n_layers; li++) {
        const sf_layer *L = &m->layers[li];
        if (L->kind == SF_L_RELU) {
            /* Fuse into the producer when the chain since it holds only views
             * or transposes (ReLU commutes with both). */
            int p = prev;
            while (p >= 0 && (net->ops[p].kind == OP_VIEW || net->ops[p].kind == OP_FLAT_T))
                p = net->ops[p].x_op;
            if (p >= 0 && (net->ops[p].kind == OP_CONV || net->ops[p].kind == OP_LINEAR) &&
                !net->ops[p].relu) {
                /* The ops between p and here must not have copied pre-ReLU
                 * values already: a FLAT_T copy runs after p's epilogue, so it
                 * copies post-ReLU values. Nothing else copies. */
                net->ops[p].relu = 1;
                continue;
            }
        }
        net_op *o = &net->ops[n];
        memset(o, 0, sizeof *o);
        o->layer = li;
        o->x_op = prev;
        o->in_c = L->in_c;
        o->in_h = L->in_h;
        o->in_w = L->in_w;
        o->out_c = L->out_ch;
        o->out_h = L->out_h;
        o->out_w = L->out_w;
        o->in_elems = (size_t)L->in_c * L->in_h * L->in_w;
        o->out_elems = L->out_elems;
        o->bias = L->n_b > 0;
        switch (L->kind) {
        case SF_L_CONV2D: o->kind = OP_CONV; break;
        case SF_L_LINEAR: o->kind = OP_LINEAR; break;
        case SF_L_RELU: o->kind = OP_RELU; break;
        case SF_L_FLATTEN:
            o->kind = (nhwc && L->in_h * L->in_w > 1 && L->in_c > 1) ? OP_FLAT_T : OP_VIEW;
            break;
        default:
            sf_cuda_set_error("%s:%d: layer %d (%s) is not supported by the CUDA backend", __FILE__, __LINE__,
                              li, sf_layer_kind_name(L->kind));
            return -1;
        }
        prev = n++;
    }
    net->n_ops = n;
    int params_before = 0;
    for (int i = 0; i < n; i++) {
        net->ops[i].need_dx = params_before;
        if (net->ops[i].kind == OP_CONV || net->ops[i].kind == OP_LINEAR)
            params_before = 1;
    }
    return 0;
}

static int alloc_all(sf_cuda_net *net)
{
    const sf_model *m = &net->m;
    const size_t nb = (size_t)net->cfg.max_batch;
    const int nhwc = net->cfg.layout == SF_LAYOUT_NHWC;
    if (dmallocf(net, &net->params, m->n_params) || dmallocf(net, &net->grads, m->n_params) ||
        dmallocf(net, &net->mom, m->n_params))
        return -1;
    SF_CUDA_CHECK(cudaMemsetAsync(net->mom, 0, sizeof(float) * (m->n_params ? m->n_params : 1), net->s));
    SF_CUDA_CHECK(cudaMemsetAsync(net->grads, 0, sizeof(float) * (m->n_params ? m->n_params : 1), net->s));
    int max_c = 1;
    net->segs.n = 0;
    for (int i = 0; i < net->n_ops; i++) {
        net_op *o = &net->ops[i];
        const sf_layer *L = &m->layers[o->layer];
        if (o->kind == OP_CONV || o->kind == OP_LINEAR || o->kind == OP_RELU || o->kind == OP_FLAT_T)
            if (dmallocf(net, &o->y, nb * o->out_elems))
                return -1;
        if (o->out_c > max_c)
            max_c = o->out_c;
        o->fusable = o->kind == OP_CONV && net->cfg.fuse && (o->bias || o->relu);
        if (o->kind == OP_CONV && nhwc && L->k > 1 && L->in_c > 1) {
            if (net->segs.n >= SF_SGD_MAX_SEGS) {
                sf_cuda_set_error("%s:%d: too many conv layers for the SGD segment table", __FILE__, __LINE__);
                return -1;
            }
            sf_perm_seg *sg = &net->segs.s[net->segs.n++];
            sg->off = L->w_off;
            sg->len = L->n_w;
            sg->c = L->in_c;
            sg->rs = L->k * L->k;
            o->permuted = 1;
        }
    }
    if (net->segs.n > 0 && dmallocf(net, &net->wdev, m->n_params))
        return -1;
    for (int i = 0; i < net->n_ops; i++) {
        net_op *o = &net->ops[i];
        if (o->kind == OP_CONV || o->kind == OP_LINEAR) {
            const sf_layer *L = &m->layers[o->layer];
            o->w_fwd = (o->permuted ? net->wdev : net->params) + L->w_off;
        }
    }
    size_t max_act = m->max_act;
    if (dmallocf(net, &net->gbuf[0], nb * max_act) || dmallocf(net, &net->gbuf[1], nb * max_act) ||
        dmallocf(net, &net->dlog, nb * (size_t)m->n_classes))
        return -1;
    net->bg_scratch_floats = sf_cuda_bias_grad_scratch(max_c);
    if (dmallocf(net, &net->bg_scratch, net->bg_scratch_floats))
        return -1;
    return 0;
}

/* Backward pointers: which buffer holds each op's output gradient. */
static void assign_grads(sf_cuda_net *net)
{
    float *g = net->dlog;
    for (int i = net->n_ops - 1; i >= 0; i--) {
        net_op *o = &net->ops[i];
        float *other = g == net->gbuf[0] ? net->gbuf[1] : net->gbuf[0];
        o->g_in = g;
        o->g_out = NULL;
        switch (o->kind) {
        case OP_CONV:
        case OP_LINEAR:
        case OP_FLAT_T:
            if (o->need_dx) {
                o->g_out = other;
                g = other;
            }
            break;
        case OP_RELU:
        case OP_VIEW:
            if (o->need_dx)
                o->g_out = g; /* in place / same buffer */
            break;
        }
    }
}

static void conv_ptrs(const sf_cuda_net *net, int i, sf_conv_dir dir, int b, void *ws, sf_conv_ptrs *p)
{
    const net_op *o = &net->ops[i];
    const sf_layer *L = &net->m.layers[o->layer];
    p->ws = ws;
    switch (dir) {
    case SF_CONV_FWD:
        p->x = op_in(net, i, b);
        p->w = o->w_fwd;
        p->y = o->y;
        break;
    case SF_CONV_BWD_DATA:
        p->x = o->g_out;
        p->w = o->w_fwd;
        p->y = o->g_in;
        break;
    default:
        p->x = op_in(net, i, b);
        p->w = net->grads + L->w_off;
        p->y = o->g_in;
        break;
    }
}

static void conv_desc_of(const sf_cuda_net *net, int i, int n, sf_conv_desc *d)
{
    const net_op *o = &net->ops[i];
    const sf_layer *L = &net->m.layers[o->layer];
    memset(d, 0, sizeof *d);
    d->n = n;
    d->c = L->in_c;
    d->h = L->in_h;
    d->w = L->in_w;
    d->oc = L->out_c;
    d->k = L->k;
    d->stride = L->stride;
    d->pad = L->pad;
    d->layout = net->cfg.layout;
    d->tf32 = net->cfg.tf32;
    /* Alignment over every pointer bound to each role, in every direction and buffer. */
    int ax = 16, aw = 16, ay = 16;
    for (int b = 0; b < net->cfg.nbuf; b++)
        for (int dir = 0; dir < 3; dir++) {
            if (dir == SF_CONV_BWD_DATA && !o->g_out)
                continue;
            sf_conv_ptrs p;
            conv_ptrs(net, i, (sf_conv_dir)dir, b, NULL, &p);
            int a;
            if ((a = sf_cuda_ptr_align(p.x)) < ax) ax = a;
            if ((a = sf_cuda_ptr_align(p.w)) < aw) aw = a;
            if ((a = sf_cuda_ptr_align(p.y)) < ay) ay = a;
        }
    d->align_x = ax;
    d->align_w = aw;
    d->align_y = ay;
}

static void shape_destroy(net_shape *S)
{
    if (!S)
        return;
    for (int b = 0; b < SF_NET_MAX_BUF; b++)
        if (S->exec[b])
            cudaGraphExecDestroy(S->exec[b]);
    for (int i = 0; i < SF_MAX_LAYERS; i++)
        for (int d = 0; d < 3; d++)
            sf_conv_plan_destroy(&S->plan[i][d]);
    free(S);
}

static float *bias_of(const sf_cuda_net *net, int i)
{
    const net_op *o = &net->ops[i];
    return o->bias ? net->params + net->m.layers[o->layer].b_off : NULL;
}

/* Time of our bias(+ReLU) epilogue on op i's output for n samples (ms, best of 3). */
static float time_epilogue(sf_cuda_net *net, int i, int n)
{
    const net_op *o = &net->ops[i];
    size_t outer, inner;
    out_view(net, o, n, &outer, &inner);
    cudaEvent_t e[2];
    if (cudaEventCreate(&e[0]) != cudaSuccess || cudaEventCreate(&e[1]) != cudaSuccess)
        return 0.f;
    float best = 1e30f;
    for (int r = 0; r < 3; r++) {
        float ms = 0.f;
        cudaEventRecord(e[0], net->s);
        sf_cuda_bias_act(o->y, bias_of(net, i), outer, o->out_c, inner, o->relu, net->s);
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
 * times faster than the plain plan plus our epilogue kernel. 0 also when no
 * fused engine exists (common for fp32 data); -1 only on a hard failure. */
static int try_fused(sf_cuda_net *net, int i, int n, const sf_conv_desc *d, const sf_conv_ptrs *p, size_t ws_limit,
                     sf_conv_plan *plain)
{
    const net_op *o = &net->ops[i];
    sf_conv_desc df = *d;
    df.fuse_bias = o->bias;
    df.fuse_relu = o->relu;
    df.align_b = o->bias ? sf_cuda_ptr_align(bias_of(net, i)) : 16;
    sf_conv_ptrs pf = *p;
    pf.b = bias_of(net, i);
    sf_conv_plan fp;
    if (sf_conv_plan_build(net->dnn, &df, SF_CONV_FWD, ws_limit, net->cfg.tune, &pf, &fp)) {
        sf_cuda_clear_error(); /* no fused engine: keep the plain plan */
        return 0;
    }
    const float plain_ms = plain->ms + time_epilogue(net, i, n);
    if (fp.ms >= 0.f && fp.ms < plain_ms) {
        sf_conv_plan_destroy(plain);
        *plain = fp;
    } else {
        sf_conv_plan_destroy(&fp);
    }
    return 0;
}

/* Plans for batch size n, timed on buffer 0's pointers with workspace ws. */
static int build_shape(sf_cuda_net *net, int n, void *ws, size_t ws_limit, net_shape **out)
{
    net_shape *S = (net_shape *)calloc(1, sizeof *S);
    if (!S) {
        sf_cuda_set_error("%s:%d: out of host memory", __FILE__, __LINE__);
        return -1;
    }
    S->n = n;
    for (int i = 0; i < net->n_ops; i++) {
        if (net->ops[i].kind != OP_CONV)
            continue;
        for (int dir = 0; dir < 3; dir++) {
            if (dir == SF_CONV_BWD_DATA && !net->ops[i].g_out)
                continue;
            sf_conv_desc d;
            conv_desc_of(net, i, n, &d);
            sf_conv_ptrs p;
            conv_ptrs(net, i, (sf_conv_dir)dir, 0, ws, &p);
            if (sf_conv_plan_build(net->dnn, &d, (sf_conv_dir)dir, ws_limit, net->cfg.tune,
                                   net->cfg.tune > 1 ? &p : NULL, &S->plan[i][dir])) {
                shape_destroy(S);
                return -1;
            }
            if (dir == SF_CONV_FWD && net->ops[i].fusable && net->cfg.tune > 1 && try_fused(net, i, n, &d, &p, ws_limit, &S->plan[i][dir])) {
                shape_destroy(S);
                return -1;
            }
        }
    }
    *out = S;
    return 0;
}

static net_shape *find_shape(const sf_cuda_net *net, int n)
{
    for (int i = 0; i < net->n_shapes; i++)
        if (net->shapes[i]->n == n)
            return net->shapes[i];
    return NULL;
}

static int make_vpacks(sf_cuda_net *net)
{
    for (int i = 0; i < net->n_ops; i++) {
        if (net->ops[i].kind != OP_CONV)
            continue;
        for (int dir = 0; dir < 3; dir++) {
            if (dir == SF_CONV_BWD_DATA && !net->ops[i].g_out)
                continue;
            for (int b = 0; b < net->cfg.nbuf; b++) {
                sf_conv_ptrs p;
                conv_ptrs(net, i, (sf_conv_dir)dir, b, dir == SF_CONV_BWD_FILTER ? net->ws2 : net->ws, &p);
                if (sf_conv_vpack_make(&p, &net->ops[i].vp[dir][b]))
                    return -1;
                if (dir == SF_CONV_FWD && net->ops[i].fusable) {
                    p.b = bias_of(net, i);
                    if (sf_conv_vpack_make(&p, &net->ops[i].vpf[b]))
                        return -1;
                }
            }
        }
    }
    return 0;
}

static int g_refresh_wd(sf_cuda_net *net, int all, cudaStream_t s);

/* Copies the k>1 conv weights into wdev in KRSC order (the general path: its
 * device weights, all of them). */
static int refresh_wdev(sf_cuda_net *net)
{
    if (net->g)
        return g_refresh_wd(net, 1, net->s);
    for (int k = 0; k < net->segs.n; k++) {
        const sf_perm_seg *sg = &net->segs.s[k];
        const int oc = (int)(sg->len / ((size_t)sg->c * sg->rs));
        if (sf_cuda_transpose(net->params + sg->off, net->wdev + sg->off, oc, sg->c, sg->rs, net->s))
            return -1;
    }
    return 0;
}

/* ---- the step ------------------------------------------------------------- */

/* Diagnostics: an event after each op (sf_net_profile only). */
#define PROF_MAX 256
typedef struct prof {
    cudaEvent_t ev[PROF_MAX];
    char label[PROF_MAX][40];
    int n;
} prof;

static void mark(prof *pf, cudaStream_t s, const char *what, int i, int layer)
{
    if (!pf || pf->n >= PROF_MAX)
        return;
    snprintf(pf->label[pf->n], sizeof pf->label[0], "%s op%d L%d", what, i, layer);
    cudaEventRecord(pf->ev[pf->n], s);
    pf->n++;
}

static int enqueue_step(sf_cuda_net *net, const net_shape *S, int b, int n, prof *pf)
{
    const sf_model *m = &net->m;
    const int tf32 = net->cfg.tf32;
    cudaStream_t s = net->s;

    /* forward */
    for (int i = 0; i < net->n_ops; i++) {
        const net_op *o = &net->ops[i];
        const sf_layer *L = &m->layers[o->layer];
        float *x = op_in(net, i, b);
        switch (o->kind) {
        case OP_CONV: {
            const sf_conv_plan *pl = &S->plan[i][SF_CONV_FWD];
            if (pl->fused) { /* bias and ReLU inside cuDNN's kernel */
                if (sf_conv_run(net->dnn, pl, o->vpf[b]))
                    return -1;
                break;
            }
            if (sf_conv_run(net->dnn, pl, o->vp[SF_CONV_FWD][b]))
                return -1;
            size_t outer, inner;
            out_view(net, o, n, &outer, &inner);
            if (sf_cuda_bias_act(o->y, o->bias ? net->params + L->b_off : NULL, outer, o->out_c, inner,
                                 o->relu, s))
                return -1;
            break;
        }
        case OP_LINEAR:
            if (sf_linear_fwd(net->blas, x, n, L->in_c, o->w_fwd, L->out_c, o->y, tf32) ||
                sf_cuda_bias_act(o->y, o->bias ? net->params + L->b_off : NULL, (size_t)n, L->out_c, 1,
                                 o->relu, s))
                return -1;
            break;
        case OP_RELU:
            if (sf_cuda_relu_fwd(x, o->y, (size_t)n * o->out_elems, s))
                return -1;
            break;
        case OP_FLAT_T: /* [n, hw, c] -> [n, c, hw] */
            if (sf_cuda_transpose(x, o->y, n, o->in_h * o->in_w, o->in_c, s))
                return -1;
            break;
        case OP_VIEW:
            break;
        }
        mark(pf, s, o->kind == OP_CONV ? "fwd conv" : o->kind == OP_LINEAR ? "fwd linear" : "fwd other", i, o->layer);
    }

    /* loss */
    const float *logits = op_out(net, net->n_ops - 1, b);
    if (sf_cuda_xent(logits, net->io[b].labels, n, m->n_classes, net->dlog, net->io[b].result, s))
        return -1;
    mark(pf, s, "xent", -1, -1);

    /* backward */
    for (int i = net->n_ops - 1; i >= 0; i--) {
        const net_op *o = &net->ops[i];
        const sf_layer *L = &m->layers[o->layer];
        switch (o->kind) {
        case OP_CONV: {
            size_t outer, inner;
            out_view(net, o, n, &outer, &inner);
            if ((o->relu || o->bias) &&
                sf_cuda_bias_grad(o->g_in, o->relu ? o->y : NULL, outer, o->out_c, inner,
                                  o->bias ? net->grads + L->b_off : NULL, net->bg_scratch, s))
                return -1;
            /* Backward-filter and backward-data both only read dy (and x, w):
             * with fork, the filter gradient runs on the side stream while the
             * data gradient runs here; they join before the next layer's
             * backward, whose data gradient overwrites this layer's dy. */
            const int fork = net->cfg.fork && o->g_out;
            if (fork) {
                SF_CUDA_CHECK(cudaEventRecord(net->ev_fork[i], s));
                SF_CUDA_CHECK(cudaStreamWaitEvent(net->side, net->ev_fork[i], 0));
                SF_CUDNN_CHECK(cudnnSetStream(net->dnn, net->side));
            }
            int rc = sf_conv_run(net->dnn, &S->plan[i][SF_CONV_BWD_FILTER], o->vp[SF_CONV_BWD_FILTER][b]);
            if (fork) {
                SF_CUDNN_CHECK(cudnnSetStream(net->dnn, s));
                if (!rc)
                    SF_CUDA_CHECK(cudaEventRecord(net->ev_join[i], net->side));
            }
            if (rc)
                return -1;
            if (o->g_out && sf_conv_run(net->dnn, &S->plan[i][SF_CONV_BWD_DATA], o->vp[SF_CONV_BWD_DATA][b]))
                return -1;
            if (fork)
                SF_CUDA_CHECK(cudaStreamWaitEvent(s, net->ev_join[i], 0));
            break;
        }
        case OP_LINEAR:
            if ((o->relu || o->bias) &&
                sf_cuda_bias_grad(o->g_in, o->relu ? o->y : NULL, (size_t)n, L->out_c, 1,
                                  o->bias ? net->grads + L->b_off : NULL, net->bg_scratch, s))
                return -1;
            if (sf_linear_bwd_filter(net->blas, op_in(net, i, b), n, L->in_c, o->g_in, L->out_c,
                                     net->grads + L->w_off, tf32))
                return -1;
            if (o->g_out && sf_linear_bwd_data(net->blas, o->g_in, n, L->in_c, o->w_fwd, L->out_c, o->g_out, tf32))
                return -1;
            break;
        case OP_RELU:
            if (o->g_out && sf_cuda_relu_bwd(o->y, o->g_in, o->g_out, (size_t)n * o->out_elems, s))
                return -1;
            break;
        case OP_FLAT_T: /* [n, c, hw] -> [n, hw, c] */
            if (o->g_out && sf_cuda_transpose(o->g_in, o->g_out, n, o->in_c, o->in_h * o->in_w, s))
                return -1;
            break;
        case OP_VIEW:
            break;
        }
        mark(pf, s, o->kind == OP_CONV ? "bwd conv" : o->kind == OP_LINEAR ? "bwd linear" : "bwd other", i, o->layer);
    }

    /* optimizer, then the result to the host */
    if (sf_cuda_sgd(net->params, net->grads, net->mom, net->wdev, m->n_params, net->io[b].hyper, &net->segs, s))
        return -1;
    mark(pf, s, "sgd", -1, -1);
    SF_CUDA_CHECK(cudaMemcpyAsync(net->io[b].h_result, net->io[b].result, sizeof(sf_xent_out),
                                  cudaMemcpyDeviceToHost, s));
    return 0;
}

static int capture(sf_cuda_net *net, net_shape *S, int b, int n)
{
    cudaGraph_t g = NULL;
    SF_CUDA_CHECK(cudaStreamBeginCapture(net->s, cudaStreamCaptureModeThreadLocal));
    int rc = enqueue_step(net, S, b, n, NULL);
    char msg[SF_CUDA_ERR_LEN];
    scopy(msg, sizeof msg, sf_cuda_last_error());
    cudaError_t e = cudaStreamEndCapture(net->s, &g);
    if (rc != 0 || e != cudaSuccess) {
        if (g)
            cudaGraphDestroy(g);
        cudaGetLastError(); /* the capture error is reported, not sticky */
        sf_cuda_set_error("%s:%d: graph capture of the step failed: %s", __FILE__, __LINE__,
                          rc ? msg : cudaGetErrorString(e));
        return -1;
    }
    e = cudaGraphInstantiate(&S->exec[b], g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        S->exec[b] = NULL;
        sf_cuda_set_error("%s:%d: cudaGraphInstantiate: %s", __FILE__, __LINE__, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

/* ---- the general path: a layer-graph executor (W2/W3) --------------------- */
/* Every layer but flatten (and a ReLU fused into its producer) owns its
 * output; every trainable layer of those owns its output gradient. The
 * trainable part reads copies of its inputs (x0: the model input; bin: the
 * frozen boundary), so each cuDNN plan binds one set of pointers whatever the
 * buffer b. The backward walks the layers in reverse; the first consumer (in
 * backward order) of a tensor overwrites its gradient, later ones add theirs
 * through gtmp (a residual block's input).
 *
 * Element type and layout (issue 9): activations and their gradients are of
 * type g->dt (fp32, or bf16 with model.precision=bf16) in layout g->lay.
 * The master parameters, their gradients and the optimizer state stay fp32 in
 * model layout; convolutions read a device copy of the weights (wd: dt, conv
 * weights permuted to KRSC in NHWC) that the step refreshes after the
 * optimizer, and write their weight gradients into gd (same layout), which
 * sf_cuda_grads_model folds into the fp32 gradients before the optimizer.
 * With fp32 NCHW, wd and gd are the parameters and gradients themselves.
 * Logits are cast to fp32 for the loss (and its gradient back to dt).
 *
 * ReLU fusion: a ReLU whose input is produced by a conv, convT, linear,
 * batchnorm or add that nothing else reads is folded into that layer's
 * epilogue (forward) and gradient mask (backward); the ReLU layer then only
 * aliases its producer's tensors. */

typedef struct gop {
    int frozen;
    int src[2], n_in;
    int first[2];        /* backward: this consumer writes (1) or adds into (0) the gradient of src[j] */
    int want[2];         /* backward: src[j] needs a gradient */
    int relu;            /* the next layer's ReLU is fused here */
    int fused;           /* this ReLU is fused into the previous layer: y/dy alias it */
    void *y;             /* output (flatten, fused ReLU: alias) */
    void *dy;            /* output gradient (trainable; aliases as y), else NULL */
    float *save;         /* batchnorm: [2C] mean, invstd */
    int32_t *argmax;     /* maxpool */
    cudnnBackendDescriptor_t vp[3]; /* conv: variant packs (fixed pointers) */
} gop;

typedef struct gshape {
    int n;
    sf_conv_plan cp[SF_MAX_LAYERS][3];
    sf_convt_plans tp[SF_MAX_LAYERS];
    cudaGraphExec_t exec[SF_NET_MAX_BUF][2];
} gshape;

struct gen_net {
    gop op[SF_MAX_LAYERS];
    int nl, nf;          /* layers, frozen layers */
    sf_dtype dt;         /* activations */
    size_t es;           /* bytes per activation element */
    sf_layout lay;
    void *x0, *bin;      /* model input copy; trainable copy of the frozen boundary */
    void *bnd[SF_NET_MAX_BUF]; /* frozen boundary per buffer */
    size_t bnd_elems;    /* per sample */
    float *sq, *gacc, *bufs;
    void *gtmp;
    void *wd, *gd;       /* device weights / conv weight gradients (dt, device layout) */
    int wsep;            /* wd, gd are copies (else params, grads) */
    sf_sgd_segs segs_all;   /* conv/convT weights, model offsets */
    sf_sgd_segs segs_train; /* trainable ones, offsets from train_off */
    float *lg, *dlg;     /* fp32 logits and their gradient (dt != fp32) */
    void *scratch;       /* bn, xent2d, bias-grad scratch (compute stream) */
    size_t scratch_bytes;
    sf_xent2d_out *x2d;
    void *fws;           /* frozen workspace (transform stream) */
    int has_bn_train;
    uint64_t nbt, nbt_saved;
    gshape *shapes[SF_NET_MAX_SHAPES];
    int n_shapes;
};

static const sf_sgd_segs k_no_segs = {};

static inline void *E(const void *p, size_t i, size_t es) { return (char *)p + i * es; }

static int g_src(const sf_model *m, int i, int j) { return sf_layer_input(m, i, j); }

/* The layer that owns the buffer layer i's output lives in (through flattens); -1: model input. */
static int g_owner(const sf_model *m, int i)
{
    while (i >= 0 && m->layers[i].kind == SF_L_FLATTEN)
        i = g_src(m, i, 0);
    return i;
}

/* Input j of layer i as the layer reads it. */
static void *g_in(const sf_cuda_net *net, int i, int j)
{
    const gen_net *g = net->g;
    const int s = g_src(&net->m, i, j);
    if (s < 0)
        return g->x0;
    if (!g->op[i].frozen && g->op[s].frozen)
        return g->bin;
    return g->op[s].y;
}

static void *g_wd(const sf_cuda_net *net, const sf_layer *L) { return E(net->g->wd, L->w_off, net->g->es); }
static void *g_gd(const sf_cuda_net *net, const sf_layer *L) { return E(net->g->gd, L->w_off, net->g->es); }

/* The model input of buffer b into x0, on stream s. */
static int g_load_input(sf_cuda_net *net, int b, int n, cudaStream_t s)
{
    const sf_model *m = &net->m;
    SF_CUDA_CHECK(cudaMemcpyAsync(net->g->x0, net->io[b].x, net->g->es * (size_t)n * m->in_c * m->in_h * m->in_w,
                                  cudaMemcpyDeviceToDevice, s));
    return 0;
}

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

static int needs_general(const sf_model *m, const sf_net_cfg *cfg)
{
    if (m->freeze[0] || m->n_frozen > 0 || m->segmentation || cfg->adamw || cfg->accum > 1 || cfg->dt != SF_DT_F32)
        return 1;
    for (int i = 0; i < m->n_layers; i++) {
        const sf_layer *L = &m->layers[i];
        if (L->kind != SF_L_CONV2D && L->kind != SF_L_RELU && L->kind != SF_L_FLATTEN && L->kind != SF_L_LINEAR)
            return 1;
        if (L->n_in != 0 && !(L->n_in == 1 && L->in[0] == i - 1))
            return 1;
    }
    return 0;
}

static void g_convd(const sf_cuda_net *net, int i, int n, sf_conv_desc *d)
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
}

static void g_convtd(const sf_cuda_net *net, int i, int n, sf_convt_desc *d)
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
}

/* Pointers of conv/convT layer i in direction dir (conv roles; convT uses the same roles). */
static void g_ptrs(const sf_cuda_net *net, int i, int dir, void *ws, sf_conv_ptrs *p)
{
    const gen_net *g = net->g;
    const gop *o = &g->op[i];
    const sf_layer *L = &net->m.layers[i];
    memset(p, 0, sizeof *p);
    p->ws = ws;
    if (dir == SF_CONV_FWD) {
        p->x = g_in(net, i, 0);
        p->w = g_wd(net, L);
        p->y = o->y;
    } else if (dir == SF_CONV_BWD_DATA) {
        const int s = g_owner(&net->m, g_src(&net->m, i, 0));
        p->x = o->first[0] ? g->op[s].dy : g->gtmp;
        p->w = g_wd(net, L);
        p->y = o->dy;
    } else {
        p->x = g_in(net, i, 0);
        p->w = g_gd(net, L);
        p->y = o->dy;
    }
}

static int g_dirs(const gop *o) { return o->frozen ? 1 : (o->want[0] ? 7 : 5); }

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
    }
    free(S);
}

static int g_build_shape(sf_cuda_net *net, int n, void *ws, size_t ws_limit, gshape **out)
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
                sf_conv_desc d;
                g_convd(net, i, n, &d);
                sf_conv_ptrs p;
                g_ptrs(net, i, dir, ws, &p);
                d.align_x = sf_cuda_ptr_align(p.x);
                d.align_w = sf_cuda_ptr_align(p.w);
                d.align_y = sf_cuda_ptr_align(p.y);
                if (sf_conv_plan_build(net->dnn, &d, (sf_conv_dir)dir, ws_limit, net->cfg.tune,
                                       net->cfg.tune > 1 ? &p : NULL, &S->cp[i][dir])) {
                    gshape_destroy(S);
                    return -1;
                }
            }
        } else if (L->kind == SF_L_CONV_TRANSPOSE2D) {
            sf_convt_desc d;
            g_convtd(net, i, n, &d);
            /* align over the pointers of every direction, by role */
            int ax = 16, aw = 16, ay = 16;
            for (int dir = 0; dir < 3; dir++) {
                if (!(dirs & (1 << dir)))
                    continue;
                sf_conv_ptrs p;
                g_ptrs(net, i, dir, ws, &p);
                int a;
                if ((a = sf_cuda_ptr_align(p.x)) < ax) ax = a;
                if ((a = sf_cuda_ptr_align(p.w)) < aw) aw = a;
                if ((a = sf_cuda_ptr_align(p.y)) < ay) ay = a;
            }
            d.align_x = ax;
            d.align_w = aw;
            d.align_y = ay;
            if (sf_convt_plans_build(net->dnn, &d, dirs, ws_limit, net->cfg.tune, NULL, &S->tp[i])) {
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

static size_t g_shape_ws(const sf_cuda_net *net, const gshape *S)
{
    size_t mx = 0;
    for (int i = 0; i < net->g->nl; i++) {
        for (int d = 0; d < 3; d++)
            if (S->cp[i][d].plan && (size_t)S->cp[i][d].ws_bytes > mx)
                mx = (size_t)S->cp[i][d].ws_bytes;
        if (S->tp[i].dirs && sf_convt_ws_bytes(&S->tp[i]) > mx)
            mx = sf_convt_ws_bytes(&S->tp[i]);
    }
    return mx;
}

__global__ void k_x2d_out(const sf_xent2d_out *in, sf_xent_out *out)
{
    out->loss = in->loss;
    out->bad = in->bad;
    out->correct = in->correct > 0x7fffffffLL ? 0x7fffffff : (int)in->correct;
    out->pad_ = 0;
}

__global__ void k_accum(float *__restrict__ acc, const float *__restrict__ g, size_t len, float inv_k)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len)
        acc[i] += g[i] * inv_k;
}

/* Allocation shifted so that p + off (floats) is 16-byte aligned (cudaMalloc is 256-aligned). */
static int g_alloc_shift(sf_cuda_net *net, float **p, size_t floats, size_t off)
{
    float *raw;
    if (dmallocf(net, &raw, floats + 4))
        return -1;
    const size_t sh = (4 - off % 4) % 4;
    *p = raw + sh;
    SF_CUDA_CHECK(cudaMemsetAsync(raw, 0, sizeof(float) * (floats + 4), net->s));
    return 0;
}

/* The device copy of the weights from the master parameters: all of them
 * (build, set_params, restore) or the trainable slice (after a step). */
static int g_refresh_wd(sf_cuda_net *net, int all, cudaStream_t s)
{
    gen_net *g = net->g;
    if (!g->wsep)
        return 0;
    const size_t off = all ? 0 : net->m.train_off, len = net->m.n_params - off;
    if (len == 0)
        return 0;
    return sf_cuda_weights_dev(net->params + off, E(g->wd, off, g->es), g->dt, len,
                               all ? &g->segs_all : &g->segs_train, s);
}

static int g_add_seg(sf_sgd_segs *sg, size_t off, size_t len, int c, int rs)
{
    if (sg->n >= SF_SGD_MAX_SEGS) {
        sf_cuda_set_error("%s:%d: more than %d convolution weights", __FILE__, __LINE__, SF_SGD_MAX_SEGS);
        return -1;
    }
    sf_perm_seg *p = &sg->s[sg->n++];
    p->off = off;
    p->len = len;
    p->c = c;
    p->rs = rs;
    return 0;
}

static int g_create(sf_cuda_net *net)
{
    const sf_model *m = &net->m;
    const size_t nb = (size_t)net->cfg.max_batch;
    gen_net *g = (gen_net *)calloc(1, sizeof *g);
    if (!g) {
        sf_cuda_set_error("%s:%d: out of host memory", __FILE__, __LINE__);
        return -1;
    }
    net->g = g;
    g->nl = m->n_layers;
    g->nf = m->n_frozen;
    g->dt = net->cfg.dt;
    g->es = sf_dtype_size(g->dt);
    g->lay = net->cfg.layout;
    /* A flatten of a tensor with spatial extent flattens in NCHW order
     * (PyTorch's): such a model runs NCHW. */
    for (int i = 0; i < g->nl; i++)
        if (m->layers[i].kind == SF_L_FLATTEN && m->layers[i].in_h * m->layers[i].in_w > 1)
            g->lay = SF_LAYOUT_NCHW;
    net->cfg.layout = g->lay;
    /* checks */
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &m->layers[i];
        gop *o = &g->op[i];
        o->frozen = i < g->nf;
        o->n_in = L->kind == SF_L_ADD ? 2 : 1;
        for (int j = 0; j < o->n_in; j++)
            o->src[j] = g_src(m, i, j);
        if (o->frozen && L->kind == SF_L_LINEAR) {
            sf_cuda_set_error("%s:%d: layer %d: a frozen linear layer is not supported on the CUDA backend",
                              __FILE__, __LINE__, i);
            return -1;
        }
        if (L->kind == SF_L_BATCHNORM2D && !o->frozen)
            g->has_bn_train = 1;
        for (int j = 0; j < o->n_in; j++) {
            const int s = o->src[j];
            if (!o->frozen && g->nf > 0 && (s < 0 || (s < g->nf && s != g->nf - 1))) {
                sf_cuda_set_error("%s:%d: layer %d reads a frozen tensor other than the last frozen layer's output",
                                  __FILE__, __LINE__, i);
                return -1;
            }
        }
    }
    if (g->nf > 0 && m->layers[g->nf - 1].kind == SF_L_FLATTEN) {
        sf_cuda_set_error("%s:%d: the last frozen layer is a flatten", __FILE__, __LINE__);
        return -1;
    }
    /* ReLU fusion (SF_CUDA_FUSE_RELU=0 turns it off, for comparisons) */
    {
        const char *fe = getenv("SF_CUDA_FUSE_RELU");
        const int fuse_on = !(fe && strcmp(fe, "0") == 0);
        int readers[SF_MAX_LAYERS];
        memset(readers, 0, sizeof readers);
        for (int i = 0; i < g->nl; i++)
            for (int j = 0; j < g->op[i].n_in; j++)
                if (g->op[i].src[j] >= 0)
                    readers[g->op[i].src[j]]++;
        for (int i = 0; fuse_on && i + 1 < g->nl; i++) {
            const sf_layer *L = &m->layers[i], *R = &m->layers[i + 1];
            const int k = L->kind;
            if (R->kind != SF_L_RELU || g->op[i + 1].src[0] != i || readers[i] != 1 || g->op[i].fused ||
                g->op[i].frozen != g->op[i + 1].frozen || i + 1 == g->nl - 1)
                continue;
            if (k == SF_L_CONV2D || k == SF_L_CONV_TRANSPOSE2D || k == SF_L_LINEAR || k == SF_L_BATCHNORM2D ||
                k == SF_L_ADD) {
                g->op[i].relu = 1;
                g->op[i + 1].fused = 1;
            }
        }
    }
    /* backward schedule */
    {
        int written[SF_MAX_LAYERS];
        memset(written, 0, sizeof written);
        for (int i = g->nl - 1; i >= g->nf; i--) {
            gop *o = &g->op[i];
            if (m->layers[i].kind == SF_L_FLATTEN)
                continue;
            for (int j = 0; j < o->n_in; j++) {
                const int ow = g_owner(m, o->src[j]);
                o->want[j] = ow >= g->nf;
                if (o->want[j]) {
                    o->first[j] = !written[ow];
                    written[ow] = 1;
                }
            }
        }
    }
    /* parameters and optimizer state; the trainable slice 16-byte aligned */
    const size_t np = m->n_params;
    if (g_alloc_shift(net, &net->params, np, m->train_off) || g_alloc_shift(net, &net->grads, np, m->train_off) ||
        g_alloc_shift(net, &net->mom, np, m->train_off))
        return -1;
    if (net->cfg.adamw && g_alloc_shift(net, &g->sq, np, m->train_off))
        return -1;
    if (net->cfg.accum > 1 && g_alloc_shift(net, &g->gacc, np, m->train_off))
        return -1;
    if (dmallocf(net, &g->bufs, m->n_buffers ? m->n_buffers : 1))
        return -1;
    /* device weights: conv weights permuted (NHWC) and/or in bf16 */
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &m->layers[i];
        if (L->kind != SF_L_CONV2D && L->kind != SF_L_CONV_TRANSPOSE2D)
            continue;
        const int nhwc = g->lay == SF_LAYOUT_NHWC && L->k > 1;
        /* conv [oc][c][k][k] -> [oc][k][k][c]; convT [c][oc][k][k] -> [c][k][k][oc] */
        const int c = !nhwc ? 1 : L->kind == SF_L_CONV2D ? L->in_c : L->out_c;
        const int rs = !nhwc ? (int)L->n_w : L->k * L->k;
        if (g_add_seg(&g->segs_all, L->w_off, L->n_w, c, rs))
            return -1;
        if (i >= g->nf && g_add_seg(&g->segs_train, L->w_off - m->train_off, L->n_w, c, rs))
            return -1;
    }
    g->wsep = g->dt != SF_DT_F32 || g->lay == SF_LAYOUT_NHWC;
    if (g->wsep) {
        if (dmalloc(net, &g->wd, g->es * (np ? np : 1)) || dmalloc(net, &g->gd, g->es * (np ? np : 1)))
            return -1;
        SF_CUDA_CHECK(cudaMemsetAsync(g->gd, 0, g->es * (np ? np : 1), net->s));
    } else {
        g->wd = net->params;
        g->gd = net->grads;
    }
    /* activations */
    const size_t es = g->es;
    size_t in_elems = (size_t)m->in_c * m->in_h * m->in_w;
    if (dmalloc(net, &g->x0, es * nb * in_elems))
        return -1;
    /* the frozen boundary first: a flatten after it aliases bin */
    if (g->nf > 0) {
        const sf_layer *L = &m->layers[g->nf - 1];
        g->bnd_elems = L->out_elems;
        if (dmalloc(net, &g->bin, es * nb * L->out_elems))
            return -1;
        for (int b = 0; b < net->cfg.nbuf; b++)
            if (dmalloc(net, &g->bnd[b], es * nb * L->out_elems))
                return -1;
    }
    int max_c = 1;
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &m->layers[i];
        gop *o = &g->op[i];
        if (L->out_ch > max_c)
            max_c = L->out_ch;
        if (L->in_c > max_c)
            max_c = L->in_c;
        if (L->kind == SF_L_FLATTEN || o->fused) {
            o->y = g_in(net, i, 0);
            const int ow = g_owner(m, o->src[0]);
            o->dy = ow >= g->nf ? g->op[ow].dy : NULL;
            continue;
        }
        if (dmalloc(net, &o->y, es * nb * L->out_elems))
            return -1;
        if (!o->frozen && dmalloc(net, &o->dy, es * nb * L->out_elems))
            return -1;
        if (L->kind == SF_L_BATCHNORM2D && dmallocf(net, &o->save, 2 * (size_t)L->out_ch))
            return -1;
        if (L->kind == SF_L_MAXPOOL2D && dmalloc(net, (void **)&o->argmax, sizeof(int32_t) * nb * L->out_elems))
            return -1;
    }
    if (dmalloc(net, &g->gtmp, es * nb * m->max_act))
        return -1;
    if (g->dt != SF_DT_F32) {
        const size_t lsz = nb * (size_t)m->n_classes * (m->segmentation ? (size_t)m->out_h * m->out_w : 1);
        if (dmallocf(net, &g->lg, lsz) || dmallocf(net, &g->dlg, lsz))
            return -1;
    }
    /* compute-stream scratch: bn, xent2d, bias grad (never used at once) */
    size_t sc = sizeof(float) * sf_cuda_bias_grad_scratch(max_c);
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &m->layers[i];
        if (L->kind == SF_L_BATCHNORM2D) {
            size_t b = sf_cuda_bn_scratch_bytes((int)nb, L->in_c, L->in_h, L->in_w, g->lay);
            if (b > sc)
                sc = b;
        }
    }
    if (m->segmentation) {
        size_t b = sf_cuda_xent2d_scratch_bytes((int)nb, m->out_h, m->out_w);
        if (b > sc)
            sc = b;
    }
    g->scratch_bytes = sc;
    if (dmalloc(net, &g->scratch, sc) || dmalloc(net, (void **)&g->x2d, sizeof(sf_xent2d_out)))
        return -1;
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
            sf_conv_ptrs p;
            g_ptrs(net, i, dir, g->op[i].frozen ? g->fws : net->ws, &p);
            if (sf_conv_vpack_make(&p, &g->op[i].vp[dir]))
                return -1;
        }
    }
    return 0;
}

/* Forward of layers [from, to) for n samples on stream s with handle h (workspace ws). */
static int g_forward(sf_cuda_net *net, gshape *S, int from, int to, int n, cudaStream_t s, cudnnHandle_t h,
                     void *ws)
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
        const void *x = g_in(net, i, 0);
        size_t outer, inner;
        switch (L->kind) {
        case SF_L_CONV2D:
            g_view(g, n, (size_t)L->out_h * L->out_w, &outer, &inner);
            if (sf_conv_run(h, &S->cp[i][SF_CONV_FWD], o->vp[SF_CONV_FWD]))
                return -1;
            if ((L->n_b || o->relu) &&
                sf_cuda_bias_act_dt(dt, o->y, L->n_b ? P + L->b_off : NULL, outer, L->out_c, inner, o->relu, s))
                return -1;
            break;
        case SF_L_CONV_TRANSPOSE2D: {
            sf_convt_ptrs p = {(void *)x, g_wd(net, L), o->y, ws};
            if (sf_convt_run(h, &S->tp[i], SF_CONV_FWD, &p))
                return -1;
            if ((L->n_b || o->relu) &&
                sf_convt_bias_act_dt(&S->tp[i].d, o->y, L->n_b ? P + L->b_off : NULL, o->relu, s))
                return -1;
            break;
        }
        case SF_L_LINEAR:
            if (sf_linear_fwd_dt(net->blas, dt, x, n, L->in_c, g_wd(net, L), L->out_c, o->y, net->cfg.tf32))
                return -1;
            if ((L->n_b || o->relu) &&
                sf_cuda_bias_act_dt(dt, o->y, L->n_b ? P + L->b_off : NULL, (size_t)n, L->out_c, 1, o->relu, s))
                return -1;
            break;
        case SF_L_RELU:
            if (sf_cuda_relu_fwd_dt(dt, x, o->y, (size_t)n * L->out_elems, s))
                return -1;
            break;
        case SF_L_BATCHNORM2D:
            if (o->frozen) {
                if (sf_cuda_bn_fwd_eval_dt(dt, x, n, L->in_c, L->in_h, L->in_w, g->lay, P + L->w_off, P + L->b_off,
                                           SF_BN_EPS, g->bufs + L->rm_off, g->bufs + L->rv_off, o->y, o->relu, s))
                    return -1;
            } else if (sf_cuda_bn_fwd_train_dt(dt, x, n, L->in_c, L->in_h, L->in_w, g->lay, P + L->w_off,
                                               P + L->b_off, SF_BN_EPS, SF_BN_MOMENTUM, g->bufs + L->rm_off,
                                               g->bufs + L->rv_off, o->save, o->save + L->out_ch, o->y, o->relu,
                                               g->scratch, s)) {
                return -1;
            }
            break;
        case SF_L_MAXPOOL2D:
            if (sf_cuda_maxpool_fwd_dt(dt, x, n, L->in_c, L->in_h, L->in_w, L->k, L->stride, L->pad, g->lay, o->y,
                                       o->argmax, s))
                return -1;
            break;
        case SF_L_GLOBAL_AVGPOOL:
            if (sf_cuda_avgpool_fwd_dt(dt, x, n, L->in_c, L->in_h, L->in_w, g->lay, o->y, s))
                return -1;
            break;
        case SF_L_ADD:
            if (sf_cuda_add_dt(dt, x, g_in(net, i, 1), o->y, (size_t)n * L->out_elems, o->relu, s))
                return -1;
            break;
        default: /* flatten */
            break;
        }
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
    return g->gtmp;
}

static int g_add_back(sf_cuda_net *net, int i, int j, size_t len, cudaStream_t s)
{
    void *d = net->g->op[g_owner(&net->m, net->g->op[i].src[j])].dy;
    return sf_cuda_add_dt(net->g->dt, d, net->g->gtmp, d, len, 0, s);
}

static int g_step(sf_cuda_net *net, gshape *S, int b, int n, int do_opt)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    cudaStream_t s = net->s;
    const float *P = net->params;
    const int tf32 = net->cfg.tf32;
    const sf_dtype dt = g->dt;
    const size_t es = g->es;
    /* the trainable part's input */
    if (g->nf > 0)
        SF_CUDA_CHECK(cudaMemcpyAsync(g->bin, g->bnd[b], es * (size_t)n * g->bnd_elems, cudaMemcpyDeviceToDevice, s));
    else if (g_load_input(net, b, n, s))
        return -1;
    if (g_forward(net, S, g->nf, g->nl, n, s, net->dnn, net->ws))
        return -1;
    /* loss, in fp32 */
    const int last = g->nl - 1;
    const size_t nlog = (size_t)n * m->n_classes * (m->segmentation ? (size_t)m->out_h * m->out_w : 1);
    const float *logits = (const float *)g->op[last].y;
    float *dlog = (float *)g->op[last].dy;
    if (dt != SF_DT_F32) {
        if (sf_cuda_cast(g->op[last].y, dt, g->lg, SF_DT_F32, nlog, s))
            return -1;
        logits = g->lg;
        dlog = g->dlg;
    }
    if (m->segmentation) {
        if (sf_cuda_xent2d(logits, net->io[b].labels, n, m->n_classes, m->out_h, m->out_w, g->lay, dlog, g->x2d,
                           g->scratch, s))
            return -1;
        k_x2d_out<<<1, 1, 0, s>>>(g->x2d, net->io[b].result);
        SF_CUDA_CHECK(cudaGetLastError());
    } else if (sf_cuda_xent(logits, net->io[b].labels, n, m->n_classes, dlog, net->io[b].result, s)) {
        return -1;
    }
    if (dt != SF_DT_F32 && sf_cuda_cast(g->dlg, SF_DT_F32, g->op[last].dy, dt, nlog, s))
        return -1;
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
            g_view(g, n, (size_t)L->out_h * L->out_w, &outer, &inner);
            if ((L->n_b || o->relu) &&
                sf_cuda_bias_grad_dt(dt, o->dy, ymask, outer, L->out_c, inner, L->n_b ? net->grads + L->b_off : NULL,
                                     (float *)g->scratch, s))
                return -1;
            if (sf_conv_run(net->dnn, &S->cp[i][SF_CONV_BWD_FILTER], o->vp[SF_CONV_BWD_FILTER]))
                return -1;
            if (dx && sf_conv_run(net->dnn, &S->cp[i][SF_CONV_BWD_DATA], o->vp[SF_CONV_BWD_DATA]))
                return -1;
            break;
        case SF_L_CONV_TRANSPOSE2D: {
            if ((L->n_b || o->relu) &&
                sf_convt_bias_grad_dt(&S->tp[i].d, o->dy, ymask, L->n_b ? net->grads + L->b_off : NULL,
                                      (float *)g->scratch, s))
                return -1;
            sf_convt_ptrs pf = {g_in(net, i, 0), g_gd(net, L), o->dy, net->ws};
            if (sf_convt_run(net->dnn, &S->tp[i], SF_CONV_BWD_FILTER, &pf))
                return -1;
            if (dx) {
                sf_convt_ptrs pd = {dx, g_wd(net, L), o->dy, net->ws};
                if (sf_convt_run(net->dnn, &S->tp[i], SF_CONV_BWD_DATA, &pd))
                    return -1;
            }
            break;
        }
        case SF_L_LINEAR:
            if ((L->n_b || o->relu) &&
                sf_cuda_bias_grad_dt(dt, o->dy, ymask, (size_t)n, L->out_c, 1, L->n_b ? net->grads + L->b_off : NULL,
                                     (float *)g->scratch, s))
                return -1;
            if (sf_linear_bwd_filter_dt(net->blas, dt, g_in(net, i, 0), n, L->in_c, o->dy, L->out_c,
                                        net->grads + L->w_off, tf32))
                return -1;
            if (dx && sf_linear_bwd_data_dt(net->blas, dt, o->dy, n, L->in_c, g_wd(net, L), L->out_c, dx, tf32))
                return -1;
            break;
        case SF_L_RELU:
            if (dx && sf_cuda_relu_bwd_dt(dt, o->y, o->dy, dx, in_len, s))
                return -1;
            break;
        case SF_L_BATCHNORM2D:
            if (sf_cuda_bn_bwd_dt(dt, g_in(net, i, 0), n, L->in_c, L->in_h, L->in_w, g->lay, P + L->w_off, o->save,
                                  o->save + L->out_ch, o->dy, ymask, dx ? dx : g->gtmp, net->grads + L->w_off,
                                  net->grads + L->b_off, g->scratch, s))
                return -1;
            break;
        case SF_L_MAXPOOL2D:
            if (dx && sf_cuda_maxpool_bwd_dt(dt, o->dy, o->argmax, n, L->in_c, L->in_h, L->in_w, L->k, L->stride,
                                             L->pad, g->lay, dx, s))
                return -1;
            break;
        case SF_L_GLOBAL_AVGPOOL:
            if (dx && sf_cuda_avgpool_bwd_dt(dt, o->dy, n, L->in_c, L->in_h, L->in_w, g->lay, dx, s))
                return -1;
            break;
        case SF_L_ADD:
            if (o->relu && sf_cuda_relu_bwd_dt(dt, o->y, o->dy, o->dy, in_len, s))
                return -1;
            for (int j = 0; j < 2; j++) {
                int addj = 0;
                void *d = g_dst(net, i, j, &addj);
                if (!d)
                    continue;
                if (addj) {
                    void *t = g->op[g_owner(m, o->src[j])].dy;
                    if (sf_cuda_add_dt(dt, t, o->dy, t, in_len, 0, s))
                        return -1;
                } else {
                    SF_CUDA_CHECK(cudaMemcpyAsync(d, o->dy, es * in_len, cudaMemcpyDeviceToDevice, s));
                }
            }
            continue;
        default:
            continue;
        }
        if (dx && add0 && g_add_back(net, i, 0, in_len, s))
            return -1;
    }
    /* optimizer over the trainable slice */
    const size_t off = m->train_off, len = m->n_params - m->train_off;
    if (g->wsep && sf_cuda_grads_model(E(g->gd, off, es), dt, net->grads + off, &g->segs_train, s))
        return -1;
    const float *grad = net->grads + off;
    if (g->gacc) {
        const float inv_k = 1.0f / (float)net->cfg.accum;
        k_accum<<<(unsigned)((len + 255) / 256 ? (len + 255) / 256 : 1), 256, 0, s>>>(g->gacc + off, net->grads + off,
                                                                                    len, inv_k);
        SF_CUDA_CHECK(cudaGetLastError());
        grad = g->gacc + off;
    }
    if (do_opt) {
        if (net->cfg.adamw) {
            if (sf_cuda_adamw(net->params + off, grad, net->mom + off, g->sq + off, NULL, len, net->io[b].adamw, NULL,
                              s))
                return -1;
        } else if (sf_cuda_sgd(net->params + off, grad, net->mom + off, NULL, len, net->io[b].hyper, &k_no_segs, s)) {
            return -1;
        }
        if (g->gacc)
            SF_CUDA_CHECK(cudaMemsetAsync(g->gacc + off, 0, sizeof(float) * len, s));
        if (g_refresh_wd(net, 0, s))
            return -1;
    }
    SF_CUDA_CHECK(cudaMemcpyAsync(net->io[b].h_result, net->io[b].result, sizeof(sf_xent_out),
                                  cudaMemcpyDeviceToHost, s));
    return 0;
}

static int g_capture(sf_cuda_net *net, gshape *S, int b, int n, int do_opt)
{
    cudaGraph_t gr = NULL;
    SF_CUDA_CHECK(cudaStreamBeginCapture(net->s, cudaStreamCaptureModeThreadLocal));
    int rc = g_step(net, S, b, n, do_opt);
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
    e = cudaGraphInstantiate(&S->exec[b][do_opt], gr, 0);
    cudaGraphDestroy(gr);
    if (e != cudaSuccess) {
        S->exec[b][do_opt] = NULL;
        sf_cuda_set_error("%s:%d: cudaGraphInstantiate: %s", __FILE__, __LINE__, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

/* sf_net_create's general half: after g_create. */
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
    SF_CUDA_CHECK(cudaMemcpyAsync(net->params, hp, sizeof(float) * m->n_params, cudaMemcpyHostToDevice, s));
    if (g_refresh_wd(net, 1, s)) {
        free(hp);
        return -1;
    }
    SF_CUDA_CHECK(cudaStreamSynchronize(s));
    sf_model_init_buffers(m, hp);
    SF_CUDA_CHECK(cudaMemcpyAsync(g->bufs, hp, sizeof(float) * m->n_buffers, cudaMemcpyHostToDevice, s));
    SF_CUDA_CHECK(cudaStreamSynchronize(s));
    free(hp);
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &m->layers[i];
        if (L->kind == SF_L_FLATTEN || g->op[i].fused)
            continue;
        if (sf_cuda_fill_random_dt(dt, g->op[i].y, nb * L->out_elems, 11 + i, 1.f, s))
            return -1;
        if (g->op[i].dy && sf_cuda_fill_random_dt(dt, g->op[i].dy, nb * L->out_elems, 111 + i, 1e-3f, s))
            return -1;
    }
    if (sf_cuda_fill_random_dt(dt, g->x0, nb * m->in_c * m->in_h * m->in_w, 6, 1.f, s) ||
        (g->bin && sf_cuda_fill_random_dt(dt, g->bin, nb * g->bnd_elems, 7, 1.f, s)) ||
        sf_cuda_fill_random_dt(dt, g->gtmp, nb * m->max_act, 8, 1e-3f, s))
        return -1;
    /* The engines large batches run best on may want more workspace than the
     * W1 path's 512 MiB (ResNet-18 at batch 1024): let the candidates use up
     * to 1/16 of free device memory, at most 4 GiB; the net then keeps only
     * what the chosen plans need. */
    size_t tune_bytes = WS_TUNE_BYTES, fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && fr / 16 > tune_bytes)
        tune_bytes = fr / 16 < ((size_t)4 << 30) ? fr / 16 : ((size_t)4 << 30);
    void *tune_ws = NULL;
    if (cudaMalloc(&tune_ws, tune_bytes) != cudaSuccess) {
        cudaGetLastError();
        tune_ws = NULL;
        if (cudaMalloc(&tune_ws, WS_TUNE_BYTES) == cudaSuccess)
            tune_bytes = WS_TUNE_BYTES;
        else
            cudaGetLastError(), tune_ws = NULL;
    }
    gshape *S = NULL;
    int rc = g_build_shape(net, net->cfg.max_batch, tune_ws, tune_ws ? tune_bytes : 0, &S);
    if (tune_ws)
        cudaFree(tune_ws);
    if (rc)
        return -1;
    size_t mx = g_shape_ws(net, S);
    net->ws_bytes = mx > WS_MIN_BYTES ? mx : WS_MIN_BYTES;
    if (dmalloc(net, &net->ws, net->ws_bytes) || dmalloc(net, &g->fws, net->ws_bytes)) {
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
    for (int i = 0; i < g->n_shapes; i++)
        gshape_destroy(g->shapes[i]);
    for (int i = 0; i < SF_MAX_LAYERS; i++)
        for (int d = 0; d < 3; d++)
            sf_conv_vpack_destroy(g->op[i].vp[d]);
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
    if (g_build_shape(net, n, net->ws, net->ws_bytes, &S))
        return -1;
    if (g_shape_ws(net, S) > net->ws_bytes) {
        gshape_destroy(S);
        sf_cuda_set_error("%s:%d: batch size %d: plans need more workspace", __FILE__, __LINE__, n);
        return -1;
    }
    SF_CUDA_CHECK(cudaDeviceSynchronize());
    g->shapes[g->n_shapes++] = S;
    return 0;
}

static int g_step_public(sf_cuda_net *net, int b, int n, int graph, int do_opt)
{
    gen_net *g = net->g;
    gshape *S = g_find(net, n);
    if (!S || b < 0 || b >= net->cfg.nbuf) {
        sf_cuda_set_error("%s:%d: sf_net_step: batch size %d not prepared or buffer %d", __FILE__, __LINE__, n, b);
        return -1;
    }
    do_opt = do_opt ? 1 : 0;
    if (g->has_bn_train)
        g->nbt++;
    if (graph && !net->graphs_broken) {
        if (!S->exec[b][do_opt] && g_capture(net, S, b, n, do_opt)) {
            net->graphs_broken = 1;
            scopy(net->graph_err, sizeof net->graph_err, sf_cuda_last_error());
        }
        if (S->exec[b][do_opt]) {
            SF_CUDA_CHECK(cudaGraphLaunch(S->exec[b][do_opt], net->s));
            return 0;
        }
    }
    return g_step(net, S, b, n, do_opt);
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
    if (g_load_input(net, b, n, ts))
        return -1;
    /* The net's handle, moved to the transform stream for the frozen layers
     * (one thread enqueues both streams; the compute stream gets it back). */
    SF_CUDNN_CHECK(cudnnSetStream(net->dnn, ts));
    int rc = g_forward(net, S, 0, g->nf, n, ts, net->dnn, g->fws);
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

    float *hp = NULL;
    void *tune_ws = NULL;
    net_shape *S = NULL;
    size_t max_ws = 0;
    int prio = 0;
    if (needs_general(m, cfg)) {
        if (g_create(net) || g_finish_create(net)) {
            sf_net_destroy(net);
            return -1;
        }
        *out = net;
        return 0;
    }
    if (build_ops(net) || alloc_all(net))
        goto fail;
    /* The side stream shares the compute stream's priority. */
    cudaStreamGetPriority(s, &prio);
    if (cudaStreamCreateWithPriority(&net->side, cudaStreamNonBlocking, prio) != cudaSuccess) {
        sf_cuda_set_error("%s:%d: side stream: %s", __FILE__, __LINE__, cudaGetErrorString(cudaGetLastError()));
        net->side = NULL;
        goto fail;
    }
    for (int i = 0; i < net->n_ops; i++)
        if (cudaEventCreateWithFlags(&net->ev_fork[i], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&net->ev_join[i], cudaEventDisableTiming) != cudaSuccess) {
            sf_cuda_set_error("%s:%d: events: %s", __FILE__, __LINE__, cudaGetErrorString(cudaGetLastError()));
            goto fail;
        }
    assign_grads(net);

    /* Parameters: PyTorch's initialisation on the host, then the device copy. */
    hp = (float *)malloc(sizeof(float) * (m->n_params ? m->n_params : 1));
    if (!hp) {
        sf_cuda_set_error("%s:%d: out of host memory", __FILE__, __LINE__);
        goto fail;
    }
    sf_model_init_params(m, cfg->seed, hp);
    if (sf_net_set_params(net, hp))
        goto fail;
    free(hp);
    hp = NULL;

    /* Real-looking data in every buffer the timing runs read (never zeros). */
    for (int i = 0; i < net->n_ops; i++)
        if (net->ops[i].y &&
            sf_cuda_fill_random(net->ops[i].y, (size_t)cfg->max_batch * net->ops[i].out_elems, 11 + i, 1.f, s))
            goto fail;
    if (sf_cuda_fill_random(net->gbuf[0], (size_t)cfg->max_batch * m->max_act, 3, 1e-3f, s) ||
        sf_cuda_fill_random(net->gbuf[1], (size_t)cfg->max_batch * m->max_act, 4, 1e-3f, s) ||
        sf_cuda_fill_random(net->dlog, (size_t)cfg->max_batch * m->n_classes, 5, 1e-3f, s) ||
        sf_cuda_fill_random((float *)io[0].x, (size_t)cfg->max_batch * m->in_c * m->in_h * m->in_w, 6, 1.f, s))
        goto fail;

    /* Plans for max_batch with a generous workspace, then one workspace sized
     * for the largest chosen plan (and some slack for other batch sizes). */
    if (cudaMalloc(&tune_ws, WS_TUNE_BYTES) != cudaSuccess) {
        cudaGetLastError();
        tune_ws = NULL;
    }
    if (build_shape(net, cfg->max_batch, tune_ws, tune_ws ? WS_TUNE_BYTES : 0, &S))
        goto fail;
    if (tune_ws) {
        cudaFree(tune_ws);
        tune_ws = NULL;
    }
    for (int i = 0; i < net->n_ops; i++)
        for (int d = 0; d < 3; d++)
            if (S->plan[i][d].plan && (size_t)S->plan[i][d].ws_bytes > max_ws)
                max_ws = (size_t)S->plan[i][d].ws_bytes;
    net->ws_bytes = max_ws > WS_MIN_BYTES ? max_ws : WS_MIN_BYTES;
    if (dmalloc(net, &net->ws, net->ws_bytes) || dmalloc(net, &net->ws2, net->ws_bytes))
        goto fail;
    net->shapes[net->n_shapes++] = S;
    S = NULL;
    if (make_vpacks(net))
        goto fail;
    SF_CUDA_CHECK(cudaStreamSynchronize(s));
    *out = net;
    return 0;
fail:
    free(hp);
    if (tune_ws)
        cudaFree(tune_ws);
    shape_destroy(S);
    sf_net_destroy(net);
    return -1;
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
    for (int i = 0; i < SF_MAX_LAYERS; i++) {
        if (net->ev_fork[i])
            cudaEventDestroy(net->ev_fork[i]);
        if (net->ev_join[i])
            cudaEventDestroy(net->ev_join[i]);
    }
    for (int i = 0; i < net->n_shapes; i++)
        shape_destroy(net->shapes[i]);
    for (int i = 0; i < net->n_ops; i++)
        for (int d = 0; d < 3; d++)
            for (int b = 0; b < SF_NET_MAX_BUF; b++) {
                sf_conv_vpack_destroy(net->ops[i].vp[d][b]);
                if (d == 0)
                    sf_conv_vpack_destroy(net->ops[i].vpf[b]);
            }
    for (int i = 0; i < net->n_allocs; i++)
        cudaFree(net->allocs[i]);
    free(net);
}

extern "C" sf_layout sf_net_layout(const sf_cuda_net *net) { return net->cfg.layout; }
extern "C" sf_dtype sf_net_dtype(const sf_cuda_net *net) { return net->g ? net->g->dt : SF_DT_F32; }

extern "C" int sf_net_prepare(sf_cuda_net *net, int n)
{
    if (n < 1 || n > net->cfg.max_batch) {
        sf_cuda_set_error("%s:%d: batch of %d samples (max_batch %d)", __FILE__, __LINE__, n,
                          net->cfg.max_batch);
        return -1;
    }
    if (net->g)
        return g_prepare(net, n);
    if (find_shape(net, n))
        return 0;
    if (net->n_shapes >= SF_NET_MAX_SHAPES) {
        sf_cuda_set_error("%s:%d: more than %d distinct batch sizes", __FILE__, __LINE__, SF_NET_MAX_SHAPES);
        return -1;
    }
    /* Timing runs write activations and gradient scratch only (never the
     * parameters), after the steps already queued on the stream. */
    net_shape *S;
    if (build_shape(net, n, net->ws, net->ws_bytes, &S))
        return -1;
    SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    net->shapes[net->n_shapes++] = S;
    return 0;
}

extern "C" int sf_net_step(sf_cuda_net *net, int b, int n, int graph)
{
    if (net->g)
        return g_step_public(net, b, n, graph, 1);
    net_shape *S = find_shape(net, n);
    if (!S || b < 0 || b >= net->cfg.nbuf) {
        sf_cuda_set_error("%s:%d: sf_net_step: batch size %d not prepared or buffer %d", __FILE__, __LINE__,
                          n, b);
        return -1;
    }
    if (graph && !net->graphs_broken) {
        if (!S->exec[b] && capture(net, S, b, n)) {
            net->graphs_broken = 1;
            scopy(net->graph_err, sizeof net->graph_err, sf_cuda_last_error());
        }
        if (S->exec[b]) {
            SF_CUDA_CHECK(cudaGraphLaunch(S->exec[b], net->s));
            return 0;
        }
    }
    return enqueue_step(net, S, b, n, NULL);
}

extern "C" const char *sf_net_graph_error(const sf_cuda_net *net) { return net->graph_err; }

extern "C" int sf_net_get_params(sf_cuda_net *net, float *host)
{
    SF_CUDA_CHECK(cudaMemcpyAsync(host, net->params, sizeof(float) * net->m.n_params, cudaMemcpyDeviceToHost,
                                  net->s));
    SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    return 0;
}

extern "C" int sf_net_set_params(sf_cuda_net *net, const float *host)
{
    /* On the net's stream: a plain cudaMemcpy from pageable memory may return
     * before its DMA lands, and the stream does not wait for the legacy stream. */
    SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    SF_CUDA_CHECK(cudaMemcpyAsync(net->params, host, sizeof(float) * net->m.n_params, cudaMemcpyHostToDevice,
                                  net->s));
    if (refresh_wdev(net))
        return -1;
    SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    return 0;
}

extern "C" int sf_net_get_momentum(sf_cuda_net *net, float *host)
{
    SF_CUDA_CHECK(cudaMemcpyAsync(host, net->mom, sizeof(float) * net->m.n_params, cudaMemcpyDeviceToHost, net->s));
    SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    return 0;
}

extern "C" int sf_net_set_momentum(sf_cuda_net *net, const float *host)
{
    /* As sf_net_set_params: on the net's stream, from pageable memory. */
    SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    SF_CUDA_CHECK(cudaMemcpyAsync(net->mom, host, sizeof(float) * net->m.n_params, cudaMemcpyHostToDevice, net->s));
    SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    return 0;
}

extern "C" size_t sf_net_state_floats(const sf_cuda_net *net)
{
    size_t f = 2 * net->m.n_params;
    if (net->g)
        f += net->m.n_buffers + (net->g->sq ? net->m.n_params : 0) + (net->g->gacc ? net->m.n_params : 0);
    return f;
}

extern "C" int sf_net_save_state(sf_cuda_net *net, float *dev)
{
    const size_t n = net->m.n_params;
    SF_CUDA_CHECK(cudaMemcpyAsync(dev, net->params, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
    SF_CUDA_CHECK(cudaMemcpyAsync(dev + n, net->mom, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
    if (net->g) {
        gen_net *g = net->g;
        float *d = dev + 2 * n;
        if (net->m.n_buffers)
            SF_CUDA_CHECK(cudaMemcpyAsync(d, g->bufs, sizeof(float) * net->m.n_buffers, cudaMemcpyDeviceToDevice,
                                          net->s));
        d += net->m.n_buffers;
        if (g->sq) {
            SF_CUDA_CHECK(cudaMemcpyAsync(d, g->sq, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
            d += n;
        }
        if (g->gacc)
            SF_CUDA_CHECK(cudaMemcpyAsync(d, g->gacc, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
        g->nbt_saved = g->nbt;
    }
    return 0;
}

extern "C" int sf_net_restore_state(sf_cuda_net *net, const float *dev)
{
    const size_t n = net->m.n_params;
    SF_CUDA_CHECK(cudaMemcpyAsync(net->params, dev, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
    SF_CUDA_CHECK(cudaMemcpyAsync(net->mom, dev + n, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
    if (net->g) {
        gen_net *g = net->g;
        const float *d = dev + 2 * n;
        if (net->m.n_buffers)
            SF_CUDA_CHECK(cudaMemcpyAsync(g->bufs, d, sizeof(float) * net->m.n_buffers, cudaMemcpyDeviceToDevice,
                                          net->s));
        d += net->m.n_buffers;
        if (g->sq) {
            SF_CUDA_CHECK(cudaMemcpyAsync(g->sq, d, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
            d += n;
        }
        if (g->gacc)
            SF_CUDA_CHECK(cudaMemcpyAsync(g->gacc, d, sizeof(float) * n, cudaMemcpyDeviceToDevice, net->s));
        g->nbt = g->nbt_saved;
    }
    return refresh_wdev(net);
}

extern "C" int sf_net_general(const sf_cuda_net *net) { return net->g != NULL; }
extern "C" int sf_net_has_frozen(const sf_cuda_net *net) { return net->g && net->g->nf > 0; }
extern "C" int sf_net_frozen_fwd(sf_cuda_net *net, int b, int n, cudaStream_t s)
{
    return net->g ? g_frozen_fwd(net, b, n, s) : 0;
}
extern "C" int sf_net_step_ex(sf_cuda_net *net, int b, int n, int graph, int do_opt)
{
    if (net->g)
        return g_step_public(net, b, n, graph, do_opt);
    return sf_net_step(net, b, n, graph);
}

extern "C" int sf_net_get_buffers(sf_cuda_net *net, float *host, uint64_t *nbt)
{
    if (net->g && net->m.n_buffers) {
        SF_CUDA_CHECK(cudaMemcpyAsync(host, net->g->bufs, sizeof(float) * net->m.n_buffers, cudaMemcpyDeviceToHost,
                                      net->s));
        SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    }
    if (nbt)
        *nbt = net->g ? net->g->nbt : 0;
    return 0;
}

extern "C" int sf_net_set_buffers(sf_cuda_net *net, const float *host, uint64_t nbt)
{
    if (!net->g)
        return 0;
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
    if (!net->g || !net->g->sq) {
        memset(host, 0, sizeof(float) * net->m.n_params);
        return 0;
    }
    SF_CUDA_CHECK(cudaMemcpyAsync(host, net->g->sq, sizeof(float) * net->m.n_params, cudaMemcpyDeviceToHost, net->s));
    SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    return 0;
}

extern "C" int sf_net_set_sq(sf_cuda_net *net, const float *host)
{
    if (!net->g || !net->g->sq)
        return 0;
    SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    SF_CUDA_CHECK(cudaMemcpyAsync(net->g->sq, host, sizeof(float) * net->m.n_params, cudaMemcpyHostToDevice, net->s));
    SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    return 0;
}

extern "C" int sf_net_reset_accum(sf_cuda_net *net)
{
    if (net->g && net->g->gacc) {
        SF_CUDA_CHECK(cudaMemsetAsync(net->g->gacc, 0, sizeof(float) * net->m.n_params, net->s));
        SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    }
    return 0;
}

/* sf_net_describe of the general path: every conv/convT plan of shape n. */
static void g_describe(const sf_cuda_net *net, int n, char *buf, size_t len)
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
        for (int d = 0; d < 3 && at < len; d++) {
            const sf_conv_plan *p = L->kind == SF_L_CONV2D ? &S->cp[i][d] : &S->tp[i].plan[d];
            if (!p->plan)
                continue;
            int w = snprintf(buf + at, len - at, "layer %d %s %d->%d k%d s%d %dx%d %s: engine %lld%s ws %lld B, %.3f ms (of %d)\n",
                             i, sf_layer_kind_name(L->kind), L->in_c, L->out_c, L->k, L->stride, L->in_h, L->in_w,
                             dn[d], (long long)p->engine, p->tensor_core ? " tc" : "", (long long)p->ws_bytes, p->ms,
                             p->tried);
            if (w < 0)
                break;
            at += (size_t)w;
        }
    }
    if (at < len)
        snprintf(buf + at, len - at, "general path: batch %d, workspaces 2 x %zu B, layout %s, %s%s%s\n", n,
                 net->ws_bytes, g->lay == SF_LAYOUT_NHWC ? "nhwc" : "nchw",
                 g->dt == SF_DT_BF16 ? "bf16" : net->cfg.tf32 ? "tf32" : "fp32", net->graphs_broken ? ", graphs off: " : "",
                 net->graphs_broken ? net->graph_err : "");
}

extern "C" void sf_net_describe(const sf_cuda_net *net, int n, char *buf, size_t len)
{
    static const char *dn[3] = {"fwd", "dgrad", "wgrad"};
    size_t at = 0;
    buf[0] = '\0';
    if (net->g) {
        g_describe(net, n, buf, len);
        return;
    }
    const net_shape *S = find_shape(net, n);
    if (!S)
        return;
    for (int i = 0; i < net->n_ops && at < len; i++) {
        if (net->ops[i].kind != OP_CONV)
            continue;
        for (int d = 0; d < 3 && at < len; d++) {
            const sf_conv_plan *p = &S->plan[i][d];
            if (!p->plan)
                continue;
            int w = snprintf(buf + at, len - at, "conv%d(layer %d) %s%s: engine %lld%s ws %lld B, %.3f ms (of %d)\n",
                             i, net->ops[i].layer, dn[d], p->fused ? "+bias/relu fused" : "", (long long)p->engine,
                             p->tensor_core ? " tc" : "", (long long)p->ws_bytes, p->ms, p->tried);
            if (w < 0)
                break;
            at += (size_t)w;
        }
    }
    if (at < len)
        snprintf(buf + at, len - at, "workspaces 2 x %zu B, layout %s, %s%s%s\n", net->ws_bytes,
                 net->cfg.layout == SF_LAYOUT_NHWC ? "nhwc" : "nchw", net->cfg.tf32 ? "tf32" : "fp32",
                 net->graphs_broken ? ", graphs off: " : "", net->graphs_broken ? net->graph_err : "");
}

extern "C" int sf_net_profile(sf_cuda_net *net, int b, int n, char *buf, size_t len)
{
    if (net->g) {
        sf_cuda_set_error("%s:%d: sf_net_profile: not available on the general (W2/W3) path", __FILE__, __LINE__);
        return -1;
    }
    net_shape *S = find_shape(net, n);
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
    if (cudaEventRecord(start, net->s) != cudaSuccess || enqueue_step(net, S, b, n, pf) != 0 ||
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
