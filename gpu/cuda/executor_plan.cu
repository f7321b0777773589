/* gpu/cuda/executor_plan.cu — building the executor's layer graph (executor_graph.h)
 * when a net is created: which kernels run each layer (ReLU fusion into its
 * producer, the batchnorm pairings with a residual add or a maxpool, thin,
 * patch and space-to-depth convolutions), the parameters, gradients and
 * optimizer state with their device layout, the per-layer buffers, and the
 * memory plan that places activations and their gradients in two arenas by
 * liveness. Runs once per net, before any plan is chosen; executor.cu runs
 * the result. */
#include "gpu/cuda/executor_graph.h"

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

/* ---- the memory plan ------------------------------------------------------ */
/* Layer outputs (y) and output gradients (dy) live in two arenas, each tensor
 * at an offset chosen when the net is built so that two tensors share bytes
 * only when their lifetimes do not overlap. One step is a timeline of slots:
 *   trainable part: forward of layer i at slot i - nf, the loss at slot
 *     ntrain = nl - nf, the backward of layer i at ntrain + 1 + (nl - 1 - i);
 *   frozen prefix (its own arena, written on the transform stream while the
 *     compute stream runs another buffer's step): forward of layer i at slot
 *     i, the copy of its output to the buffer's boundary at slot nf.
 * A tensor lives from the slot that first writes it to the last slot that
 * reads it, both included:
 *   y of layer s: written by s's forward; read by its consumers' forwards, by
 *     the backward of a consumer that needs its input (conv, convT and linear
 *     for the weight gradient, batchnorm), by s's own backward where it is a
 *     ReLU mask (a ReLU, or a layer with a ReLU fused into it), and by the loss
 *     (the last layer);
 *   dy of layer s: written by the backward of its consumers (the first in
 *     backward order overwrites, later ones add) or the loss, read by s's
 *     backward.
 * A flatten, a fused ReLU and an NHWC to_tokens are views of their input's
 * tensors: their uses count as uses of the tensor they view. Everything a
 * layer's backward reads, the side stream's backward-filter included, is
 * joined before the next layer's backward starts, so slot granularity is
 * exact. The tensors are
 * then placed by gpu/memory_plan.h (largest first, lowest aligned offset that
 * overlaps no tensor of an overlapping lifetime). */

#define PLAN_MAX (3 * SF_MAX_LAYERS)

typedef struct plan_obj {
    sf_plan_tensor t; /* first: the arenas are placed through pointers to it */
    void **ptr;       /* where the placed pointer goes */
    int frozen;       /* which arena */
} plan_obj;

/* The layer whose tensors layer i's output lives in: through flattens and fused
 * ReLUs; -1 for the model input. */
static int g_storage(const sf_cuda_net *net, int i)
{
    const gen_net *g = net->g;
    while (i >= 0 && (net->m.layers[i].kind == SF_L_FLATTEN || g->op[i].fused))
        i = g->op[i].src[0];
    return i;
}

/* Kinds whose backward reads their inputs beside dy (an activation's
 * derivative at x: every kind g_act_reads_x names, each factor of a product,
 * the layer scale's, scale_shift's, prelu's and channel_conv1d's input for
 * their gradients);
 * conv, convT, linear and batchnorm are listed where they are used. Dropout redraws its mask, concat slices
 * dy, the channel shuffle and slice move it: none reads x. */
static int bwd_reads_inputs(sf_layer_kind k)
{
    switch (k) {
    case SF_L_MUL:
    case SF_L_LAYER_SCALE:
    case SF_L_SCALE_SHIFT:
    case SF_L_PRELU: /* its slopes' gradient and its mask */
    case SF_L_CHANNEL_CONV1D: /* its weight's gradient */
    case SF_L_LAYERNORM2D:
    case SF_L_LAYERNORM:
    case SF_L_GROUPNORM:
    case SF_L_GRN:
    case SF_L_LOG_SOFTMAX:
    case SF_L_SELF_ATTENTION: /* its input projection's weight gradient */
        return 1;
    default:
        return g_act_reads_x(k);
    }
}

static void widen(plan_obj *o, int t)
{
    if (t < o->t.t0)
        o->t.t0 = t;
    if (t > o->t.t1)
        o->t.t1 = t;
}

static int g_plan_memory(sf_cuda_net *net)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    const size_t nb = (size_t)net->cfg.max_batch, es = g->es;
    const int nl = g->nl, nf = g->nf, ntrain = nl - nf;
    plan_obj obj[PLAN_MAX];
    int yi[SF_MAX_LAYERS], di[SF_MAX_LAYERS], n = 0;
    /* F: forward slot; B: backward slot (trainable layers) */
#define F(i) ((i) < nf ? (i) : (i) - nf)
#define B(i) (ntrain + 1 + (nl - 1 - (i)))
    for (int i = 0; i < nl; i++) {
        yi[i] = di[i] = -1;
        const sf_layer *L = &m->layers[i];
        if (L->kind == SF_L_FLATTEN || g->op[i].fused)
            continue;
        const size_t bytes = (es * nb * L->out_elems + 255) & ~(size_t)255;
        obj[n] = (plan_obj){{bytes, F(i), F(i), 0}, &g->op[i].y, g->op[i].frozen};
        yi[i] = n++;
        if (!g->op[i].frozen && !g->op[i].dy_of) {
            obj[n] = (plan_obj){{bytes, B(i), B(i), 0}, &g->op[i].dy, 0};
            di[i] = n++;
        }
        /* gradient scratch, written and read within this layer's backward:
         * the largest input whose gradient this layer adds into its owner's */
        const gop *o = &g->op[i];
        size_t gel = L->kind == SF_L_BATCHNORM2D && !o->want[0] ? (size_t)L->in_c * L->in_h * L->in_w : 0;
        for (int j = 0; j < o->n_in; j++) {
            sf_shape sj;
            sf_layer_in_shape(m, i, j, &sj);
            const size_t ej = j ? (size_t)sj.c * sj.h * sj.w : (size_t)L->in_c * L->in_h * L->in_w;
            if (o->want[j] && !o->first[j] && ej > gel)
                gel = ej;
        }
        if (!o->frozen && L->kind != SF_L_ADD && gel) {
            const size_t gb = (es * nb * gel + 255) & ~(size_t)255;
            obj[n++] = (plan_obj){{gb, B(i), B(i), 0}, &g->op[i].gtmp, 0};
        }
    }
    const int last = g_storage(net, nl - 1);
    if (last < nf || (nf > 0 && g_storage(net, nf - 1) < 0)) {
        sf_cuda_set_error("%s:%d: the model's output is not produced by a trainable layer", __FILE__, __LINE__);
        return -1;
    }
    if (nf > 0)
        widen(&obj[yi[g_storage(net, nf - 1)]], nf); /* the copy to the boundary */
    for (int i = 0; i < nl; i++) /* its batchnorm reads the shared gradient in its backward */
        if (g->op[i].dy_of) {
            di[i] = di[g->op[i].dy_of - 1];
            widen(&obj[di[i]], B(i));
        }
    widen(&obj[yi[last]], ntrain); /* the loss reads the logits */
    widen(&obj[di[last]], ntrain); /* and writes their gradient */
    for (int i = 0; i < nl; i++)
        if (g->op[i].bn_add)
            widen(&obj[yi[g->op[i].bn_add]], F(i)); /* the batchnorm writes the add's output */
    for (int c = 0; c < nl; c++) {
        const sf_layer *L = &m->layers[c];
        const gop *o = &g->op[c];
        if (L->kind == SF_L_FLATTEN || o->fused)
            continue;
        const int k = L->kind;
        const int needs_x = !o->frozen && (k == SF_L_CONV2D || k == SF_L_CONV_TRANSPOSE2D || k == SF_L_LINEAR ||
                                           k == SF_L_BATCHNORM2D || bwd_reads_inputs((sf_layer_kind)k));
        /* the ReLU mask, unless batchnorm's backward recomputes it from x (the
         * stem's 1.6 GB batchnorm output of ResNet-18 at batch 1024 then dies
         * at the maxpool's forward) */
        if (!o->frozen && (k == SF_L_RELU || o->relu) && !o->cat_mask &&
            !(k == SF_L_BATCHNORM2D && !sf_cuda_bn_bwd_reads_y(g->dt, g->lay, L->out_ch)))
            widen(&obj[yi[c]], B(c));
        for (int j = 0; j < o->n_in; j++) {
            const int s = g_storage(net, o->src[j]);
            if (s >= 0 && g->op[s].cat_mask)
                widen(&obj[yi[c]], B(c)); /* the concat's backward reads its output as their mask */
            if (s < 0 || (!o->frozen && g->op[s].frozen))
                continue; /* the model input or the frozen boundary: per buffer */
            widen(&obj[yi[s]], F(c));
            if (needs_x)
                widen(&obj[yi[s]], B(c));
            if (o->want[j])
                widen(&obj[di[s]], B(c));
        }
    }
#undef F
#undef B
    sf_plan_tensor *tr[PLAN_MAX], *fr[PLAN_MAX];
    int ntr = 0, nfr = 0;
    g->tensor_bytes = 0;
    for (int k = 0; k < n; k++) {
        g->tensor_bytes += obj[k].t.bytes;
        if (obj[k].frozen)
            fr[nfr++] = &obj[k].t;
        else
            tr[ntr++] = &obj[k].t;
    }
    g->arena_bytes = sf_plan_place(tr, ntr);
    g->farena_bytes = sf_plan_place(fr, nfr);
    g->plan = (plan_obj *)malloc(sizeof(plan_obj) * (size_t)(n ? n : 1));
    if (!g->plan) {
        sf_cuda_set_error("%s:%d: out of host memory", __FILE__, __LINE__);
        return -1;
    }
    memcpy(g->plan, obj, sizeof(plan_obj) * (size_t)n);
    g->n_plan = n;
    return 0;
}

/* Allocates the arenas the plan sized and points every tensor at its place,
 * then the views (flattens, fused ReLUs, NHWC to_tokens) at the tensors
 * they view. Until then those pointers are NULL: plans are chosen before
 * (g_finish_create). */
int sf_exec_alloc_arenas(sf_cuda_net *net)
{
    gen_net *g = net->g;
    const sf_model *m = &net->m;
    if ((g->arena_bytes && dmalloc(net, &g->arena, g->arena_bytes)) ||
        (g->farena_bytes && dmalloc(net, &g->farena, g->farena_bytes)))
        return -1;
    for (int k = 0; k < g->n_plan; k++)
        *g->plan[k].ptr = (char *)(g->plan[k].frozen ? g->farena : g->arena) + g->plan[k].t.off;
    for (int i = 0; i < g->nl; i++)
        if (g->op[i].dy_of)
            g->op[i].dy = g->op[g->op[i].dy_of - 1].dy;
    for (int i = 0; i < g->nl; i++) {
        gop *o = &g->op[i];
        if (m->layers[i].kind != SF_L_FLATTEN && !o->fused)
            continue;
        /* a flatten's output is found through g_act (it may be a per-buffer
         * tensor); a fused ReLU's or to_tokens view's is its producer's */
        o->y = m->layers[i].kind == SF_L_FLATTEN ? NULL : g->op[o->src[0]].y;
        const int ow = g_owner(m, o->src[0]);
        o->dy = ow >= g->nf ? g->op[ow].dy : NULL;
    }
    return 0;
}

/* What self_attention layer i keeps from its forward for its backward, and
 * the sizes of the buffers all attention layers share. A bf16 net runs the
 * core as cuDNN's fused attention when a plan builds for max_batch (other
 * batch sizes get theirs in g_build_shape) and keeps only the softmax
 * statistics; otherwise the materialised core keeps the weights. */
static int g_attention_buffers(sf_cuda_net *net, int i)
{
    gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    gop *o = &g->op[i];
    const size_t nb = (size_t)net->cfg.max_batch, es = g->es;
    const int t = L->in_h, c = L->in_c, heads = L->heads;
    const size_t rows = nb * (size_t)t;
    g->n_attn++;
    o->sdpa = 0;
    if (g->dt == SF_DT_BF16) {
        sf_sdpa_plan *probe = NULL;
        size_t ws = 0;
        char why[sizeof g->sdpa_why];
        if (sf_sdpa_plan_create(&probe, net->dnn, (int)nb, t, heads, c / heads, &ws, why, sizeof why) == 0) {
            sf_sdpa_plan_destroy(probe);
            o->sdpa = 1;
            g->n_sdpa++;
        } else if (!g->sdpa_why[0]) {
            snprintf(g->sdpa_why, sizeof g->sdpa_why, "%s", why[0] ? why : "no plan");
        }
    } else if (!g->sdpa_why[0]) {
        snprintf(g->sdpa_why, sizeof g->sdpa_why, "cuDNN's fused attention is bf16 only");
    }
    if (dmalloc(net, &o->qkv, es * rows * 3 * c) || dmalloc(net, &o->att_o, es * rows * c))
        return -1;
    if (o->sdpa ? dmallocf(net, &o->att_stats, nb * heads * t)
                : dmalloc(net, &o->att_p, es * sf_attn_p_elems((int)nb, t, heads)))
        return -1;
    if (!o->sdpa && sf_attn_p_elems((int)nb, t, heads) > g->att_s_floats)
        g->att_s_floats = sf_attn_p_elems((int)nb, t, heads);
    if (es * rows * c > g->att_do_bytes)
        g->att_do_bytes = es * rows * c;
    if (es * rows * 3 * c > g->att_dqkv_bytes)
        g->att_dqkv_bytes = es * rows * 3 * c;
    return 0;
}

/* The per-layer checks: inputs, the frozen prefix's limits, the layers
 * that make the net train batchnorms. */
static int g_check_layers(sf_cuda_net *net)
{
    const sf_model *m = &net->m;
    gen_net *g = net->g;
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &m->layers[i];
        gop *o = &g->op[i];
        o->frozen = i < g->nf;
        o->n_in = sf_layer_n_inputs(L); /* at most SF_MAX_IN (concat) */
        for (int j = 0; j < o->n_in; j++)
            o->src[j] = g_src(m, i, j);
        if (o->frozen && (L->kind == SF_L_LINEAR || L->kind == SF_L_SELF_ATTENTION)) {
            /* their GEMMs run on the cuBLAS handle of the compute stream,
             * the frozen prefix on the transform stream */
            sf_cuda_set_error("%s:%d: layer %d: a frozen %s layer is not supported on the CUDA backend", __FILE__,
                              __LINE__, i, sf_layer_kind_name(L->kind));
            return -1;
        }
        if (o->n_in > 0) {
            sf_shape sh;
            sf_layer_in_shape(m, i, 0, &sh);
            o->tok = sh.tokens;
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
    return 0;
}

static_assert(SF_L_KIND_COUNT <= 64, "gen_net.bn_apart_kinds holds one bit per kind");

/* ReLU fusion (cfg.keep_relu turns it off, for comparisons), the
 * batchnorm pairings with a residual add or a maxpool, to_tokens views and
 * the convolution kernels each layer takes. */
static void g_choose_fusions(sf_cuda_net *net)
{
    const sf_model *m = &net->m;
    gen_net *g = net->g;
    const int fuse_on = !net->cfg.keep_relu;
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
    /* A convolution's, transposed convolution's or linear layer's fused
     * ReLU output that one concat alone reads (SqueezeNet's fire expands):
     * the concat's output holds the same values in its channels, so the
     * concat's backward applies the ReLU's mask from there and the
     * producer's own output dies at the concat's forward instead of living
     * until its backward (squeezenet1_1 at batch 256 kept both expands'
     * outputs beside their concatenation across the step's peak). */
    for (int c = 0; fuse_on && c < g->nl; c++) {
        if (m->layers[c].kind != SF_L_CONCAT || g->op[c].frozen)
            continue;
        for (int j = 0; j < g->op[c].n_in; j++) {
            const int r = g->op[c].src[j];
            if (r < 1 || m->layers[r].kind != SF_L_RELU || !g->op[r].fused || readers[r] != 1)
                continue;
            const int p = g->op[r].src[0], k = m->layers[p].kind;
            if (g->op[p].relu && !g->op[p].frozen &&
                (k == SF_L_CONV2D || k == SF_L_CONV_TRANSPOSE2D || k == SF_L_LINEAR))
                g->op[p].cat_mask = 1;
        }
    }
    /* A batchnorm followed by another activation (ReLU6, SiLU, hardswish:
     * MobileNet's and EfficientNet's pattern) applies it in its apply pass,
     * and its backward takes the activation's derivative at bn(x) from x
     * (sf_cuda_bn_bwd_act_dt): the batchnorm's own output is neither
     * written nor kept for the activation's backward, and the activation's
     * two passes go. Only where that backward runs (the bf16 NHWC row
     * kernels: where the batchnorm's backward does not read y), and not
     * under SyncBatchNorm, whose backward knows a ReLU's mask only. Leaky
     * ReLU, ELU, SELU, softplus and Mish stay layers of their own: the
     * batchnorm kernels take an activation code, not a slope, an alpha or a
     * beta, and each code they take is one more instance of every row
     * kernel (the plan text counts and names these). */
    g->n_bn_apart = 0;
    g->bn_apart_kinds = 0;
    for (int i = 0; fuse_on && !net->cfg.no_bn_fuse && !net->cfg.stat_reduce && i + 1 < g->nl; i++) {
        const sf_layer *L = &m->layers[i], *R = &m->layers[i + 1];
        if (L->kind != SF_L_BATCHNORM2D || !g_is_act(R->kind) || g->op[i + 1].src[0] != i || readers[i] != 1 ||
            g->op[i].fused || g->op[i].relu || g->op[i].frozen || g->op[i + 1].frozen || i + 1 == g->nl - 1 ||
            sf_cuda_bn_bwd_reads_y(g->dt, g->lay, L->out_ch))
            continue;
        if ((int)g_act_kind(R) > SF_BN_ACT_LAST - SF_BN_ACT_BASE) {
            g->n_bn_apart++;
            g->bn_apart_kinds |= (uint64_t)1 << R->kind;
            continue;
        }
        g->op[i].bn_act = SF_BN_ACT(g_act_kind(R));
        g->op[i + 1].fused = 1;
    }
    /* A batchnorm whose only reader is the residual add right after it
     * writes the add's output in its apply pass (bn + add + ReLU: three
     * tensor passes where the two kernels took five); the add's other
     * input comes from an earlier layer, so it is ready. */
    for (int a = 1; !net->cfg.no_bn_fuse && a < g->nl; a++) {
        const int i = a - 1;
        const gop *oa = &g->op[a], *oi = &g->op[i];
        if (m->layers[a].kind != SF_L_ADD || m->layers[i].kind != SF_L_BATCHNORM2D || oa->n_in != 2 ||
            readers[i] != 1 || oi->relu || oi->bn_act || oi->fused || oi->frozen != oa->frozen ||
            (oa->src[0] != i && oa->src[1] != i) || oa->src[0] == oa->src[1])
            continue;
        g->op[i].bn_add = a;
        g->op[a].in_bn = 1;
    }
    /* A batchnorm + ReLU whose only reader is a 3x3/2 maxpool: in training
     * the pool applies them to its taps, so the batchnorm's output (1.6 GB
     * at ResNet-18's stem, batch 1024) is neither written nor read. Only
     * where the batchnorm's backward recomputes the ReLU mask from x (it
     * has no y to read then). */
    for (int p = 2; !net->cfg.no_bn_fuse && p < g->nl; p++) {
        const sf_layer *P = &m->layers[p];
        const int r = g->op[p].src[0], i = r - 1;
        if (P->kind != SF_L_MAXPOOL2D || P->ceil_mode || r < 1 || m->layers[r].kind != SF_L_RELU ||
            !g->op[r].fused || g->op[r].src[0] != i || m->layers[i].kind != SF_L_BATCHNORM2D || !g->op[i].relu ||
            readers[r] != 1 || g->op[i].frozen || g->op[p].frozen ||
            sf_cuda_bn_bwd_reads_y(g->dt, g->lay, m->layers[i].out_ch) ||
            !sf_cuda_maxpool_pre_bn_ok(g->dt, g->lay, P->in_c, P->k, P->stride, P->pad))
            continue;
        g->op[i].bn_pool = 1;
        g->op[p].pre_bn = i + 1;
    }
    /* to_tokens of an NHWC map is a view: the map's bytes are already
     * the token-major [h*w, c] sequence, so the layer aliases its
     * producer's output and gradient like a fused ReLU and runs nothing
     * (an NCHW map is transposed by its kernel). */
    for (int i = 0; i + 1 < g->nl; i++) {
        const int src = g->op[i].src[0];
        if (m->layers[i].kind == SF_L_TO_TOKENS && g->lay == SF_LAYOUT_NHWC && src >= 0 && readers[src] == 1 &&
            m->layers[src].kind != SF_L_FLATTEN && g->op[src].frozen == g->op[i].frozen)
            g->op[i].fused = 1;
    }
    /* Grouped and dilated convolutions take cuDNN's general plans: the
     * thin, patch and space-to-depth kernels and the fused epilogue are
     * written for a plain convolution. Depthwise convolutions, most of
     * MobileNet's and EfficientNet's time, find only cuDNN's generic
     * engine 0 in NHWC (on an H200 at EfficientNet-B0's 32-channel
     * 112x112 layer, batch 256 bf16: 3.4 ms forward, 18.1 ms filter
     * gradient), so NHWC ones are also timed against conv_dw.h's
     * kernels per direction and run on the faster. NHWC is the layout the
     * backend picks for bf16 and TF32 (backend_cuda.cu); strict fp32 nets
     * keep NCHW, the parity precision, not the speed one. So the layout
     * rule has no case of its own for them. */
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &m->layers[i];
        /* a window that differs between the axes (1x7) is cuDNN's alone */
        const int square = L->kind == SF_L_CONV2D && sf_layer_conv_square(L);
        const int plain = square && L->groups <= 1 && L->dilation <= 1;
        if (L->kind == SF_L_CONV2D && !plain) {
            g->op[i].thin = g->op[i].fusable = g->op[i].patch = 0;
            /* depthwise: conv_dw.h's kernels are timed against cuDNN's plans
             * (g_build_shape), whose only NHWC engine for it is the generic one */
            g->op[i].dw = !net->cfg.no_dw && square && sf_conv_dw_ok(g->lay, g->dt, L->in_c, L->out_c, L->groups,
                                                                     L->k, L->stride, L->pad, L->dilation);
            continue;
        }
        g->op[i].thin = !net->cfg.no_thin && L->kind == SF_L_CONV2D &&
                        sf_conv_thin_ok(g->lay, g->dt, L->in_c, L->out_c, L->k, L->stride, L->pad);
        g->op[i].fusable = !net->cfg.no_fuse && L->kind == SF_L_CONV2D && !g->op[i].thin &&
                           (L->n_b || g->op[i].relu);
        g->op[i].patch = !net->cfg.no_patch && L->kind == SF_L_CONV2D && !g->op[i].frozen && g->dt == SF_DT_F32 &&
                         sf_conv_patch_ok(g->lay, L->in_c, L->in_h, L->in_w, L->out_c, L->k, L->stride, L->pad);
        g->op[i].tpatch = !net->cfg.no_patch && L->kind == SF_L_CONV_TRANSPOSE2D && g->dt == SF_DT_F32 &&
                          sf_convt_patch_ok(g->lay, L->in_c, L->out_c, L->k, L->stride, L->pad);
    }
}

/* The backward schedule: which input gradients each trainable layer
 * writes, and whether it writes them first or adds into them. */
static void g_schedule_backward(sf_cuda_net *net)
{
    const sf_model *m = &net->m;
    gen_net *g = net->g;
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

/* A residual add writes the same values, its output's gradient (ReLU-masked
 * where it has a ReLU), as the gradient of both its inputs. Where one input
 * is a batchnorm that only the add reads, that batchnorm's dy can be the
 * other input's gradient buffer instead of a copy of it: one tensor write
 * less per block (and one gradient buffer less), provided nothing changes
 * that buffer before the batchnorm's backward has read it. The other input
 * (b, layer ob) is the block's input (the previous block's ReLU, a view of
 * its add's buffer) or the shortcut's batchnorm; its
 * gradient is written first by the add and then added into by its other
 * readers, whose backward runs in descending layer order: so every other
 * reader of ob, and ob itself (whose backward ends the buffer's life), must
 * come before the batchnorm (oa) in the layer order. The batchnorm's
 * backward only reads its dy. */
/* The layer whose gradient buffer holds layer s's gradient (gop.dy_of). */
static int g_grad_root(const gen_net *g, int s)
{
    while (s >= 0 && g->op[s].dy_of)
        s = g->op[s].dy_of - 1;
    return s;
}

/* A residual stream (a transformer's x = x + f(x), ConvNeXt's) goes further:
 * an add without a ReLU keeps its output's gradient in its residual input's
 * gradient buffer, and its branch (layer oa, read by the add alone) reads it
 * there too, so the add's backward moves nothing (it had copied 77 MB per
 * block of ViT-B/16 at batch 256 in bf16, 0.065 ms each on an H200). The
 * stream's adds share one buffer. Sound because the buffer holds the
 * gradient of the stream's newest tensor at each point of the backward:
 * the branch (produced after the residual input, obs < oa) reads it first,
 * then the residual input's other readers add into it, then the residual
 * input's own backward reads it. Refused when any layer from oa on, other
 * than the add, reads a tensor whose gradient lives in that buffer: its
 * backward would write the buffer while it holds another tensor's
 * gradient. Returns 1 where the add was so aliased. */
static int g_alias_add(sf_cuda_net *net, int i, const int *readers)
{
    const sf_model *m = &net->m;
    gen_net *g = net->g;
    gop *o = &g->op[i];
    if (o->relu || o->in_bn || o->dy_of)
        return 0;
    for (int a = 0; a < 2; a++) {
        const int oa = g_owner(m, o->src[a]), ob = g_owner(m, o->src[1 - a]), obs = g_storage(net, ob);
        /* not a layer with a ReLU fused in: a conv's or linear's bias-gradient
         * pass masks its dy in place (k_bgrad_rows_t) */
        if (oa == ob || oa < g->nf || obs < g->nf || obs >= oa || g->op[oa].fused || g->op[oa].dy_of ||
            g->op[oa].relu || readers[oa] != 1)
            continue;
        const int root = g_grad_root(g, obs);
        int clash = 0;
        for (int c = oa; c < g->nl && !clash; c++) {
            if (c == i)
                continue;
            for (int j = 0; j < g->op[c].n_in; j++) {
                const int s = g_storage(net, g_owner(m, g->op[c].src[j]));
                clash |= s >= 0 && g_grad_root(g, s) == root;
            }
        }
        if (clash)
            continue;
        g->op[oa].dy_of = o->dy_of = 1 + root;
        o->grad_alias = 1;
        return 1;
    }
    return 0;
}

static void g_share_add_grads(sf_cuda_net *net)
{
    const sf_model *m = &net->m;
    gen_net *g = net->g;
    if (net->cfg.no_share)
        return;
    int readers[SF_MAX_LAYERS];
    memset(readers, 0, sizeof readers);
    for (int i = 0; i < g->nl; i++)
        for (int j = 0; j < g->op[i].n_in; j++)
            if (g_owner(m, g->op[i].src[j]) >= 0)
                readers[g_owner(m, g->op[i].src[j])]++;
    for (int i = g->nf; i < g->nl; i++) {
        const gop *o = &g->op[i];
        if (m->layers[i].kind == SF_L_ADD && !o->frozen && o->want[0] && o->want[1] && o->first[0] && o->first[1])
            g_alias_add(net, i, readers);
    }
    for (int i = g->nf; i < g->nl; i++) {
        gop *o = &g->op[i];
        if (m->layers[i].kind != SF_L_ADD || o->frozen || !o->want[0] || !o->want[1] || !o->first[0] ||
            !o->first[1] || o->grad_alias)
            continue;
        for (int a = 0; a < 2 && !o->grad_shared; a++) {
            /* obs: the layer whose buffer holds ob's gradient (a fused ReLU's is
             * its producer's: the previous block's add) */
            const int oa = g_owner(m, o->src[a]), ob = g_owner(m, o->src[1 - a]), obs = g_storage(net, ob);
            if (oa == ob || oa < g->nf || obs < g->nf || obs == oa || m->layers[oa].kind != SF_L_BATCHNORM2D ||
                g->op[oa].fused || g->op[obs].dy_of || readers[oa] != 1 || ob > oa)
                continue;
            int later = 0; /* another reader of ob whose backward would change the buffer first */
            for (int c = oa; c < g->nl && !later; c++)
                for (int j = 0; j < g->op[c].n_in; j++)
                    later |= c != i && g_owner(m, g->op[c].src[j]) == ob;
            if (later)
                continue;
            g->op[oa].dy_of = 1 + obs;
            o->grad_shared = 1 + a;
        }
    }
}

/* Layer i flattens a map with spatial extent. */
static int g_spatial_flatten(const sf_model *m, int i)
{
    return i >= 0 && m->layers[i].kind == SF_L_FLATTEN && m->layers[i].in_h * m->layers[i].in_w > 1;
}

/* Every reader of layer i's output is a linear layer (and there is one). */
static int g_read_by_linear_only(const sf_model *m, int i)
{
    int readers = 0;
    for (int j = i + 1; j < m->n_layers; j++)
        for (int k = 0; k < sf_layer_n_inputs(&m->layers[j]); k++)
            if (g_src(m, j, k) == i) {
                if (m->layers[j].kind != SF_L_LINEAR)
                    return 0;
                readers++;
            }
    return readers > 0;
}

/* Parameters, gradients and optimizer state; the trainable slice 16-byte
 * aligned; the device layout of the weights and their low-precision copies. */
static int g_alloc_params(sf_cuda_net *net)
{
    const sf_model *m = &net->m;
    gen_net *g = net->g;
    const size_t np = m->n_params;
    /* SGD's momentum buffer comes with the first step that asks for momentum
     * (sf_net_use_momentum); AdamW's first moment from the start */
    if (g_alloc_shift(net, &net->params, np, m->train_off) || g_alloc_shift(net, &net->grads, np, m->train_off) ||
        (net->cfg.adamw && g_alloc_shift(net, &net->mom, np, m->train_off)))
        return -1;
    if (net->cfg.adamw && g_alloc_shift(net, &g->sq, np, m->train_off))
        return -1;
    if (dmalloc(net, (void **)&g->skips, sizeof(unsigned)) ||
        cudaMemsetAsync(g->skips, 0, sizeof(unsigned), net->s) != cudaSuccess)
        return -1;
    if (net->cfg.accum > 1 && (g_alloc_shift(net, &g->gacc, np, m->train_off) || dmallocf(net, &g->gacc_n, 2) ||
                               cudaMemsetAsync(g->gacc_n, 0, 2 * sizeof(float), net->s) != cudaSuccess))
        return -1;
    if (dmallocf(net, &g->bufs, m->n_buffers ? m->n_buffers : 1))
        return -1;
    /* the device layout: NHWC nets store k>1 conv weights permuted, and a
     * linear weight that reads a spatial flatten [out][c][h*w] as
     * [out][h*w][c] (sf_exec_build_graph) */
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &m->layers[i];
        if (L->kind == SF_L_LINEAR && g->lay == SF_LAYOUT_NHWC && g_spatial_flatten(m, g_src(m, i, 0))) {
            const sf_layer *F = &m->layers[g_src(m, i, 0)];
            if (F->in_c > 1 && g_add_seg(&g->segs_perm, L->w_off, L->n_w, F->in_c, F->in_h * F->in_w))
                return -1;
        }
        if (L->kind != SF_L_CONV2D && L->kind != SF_L_CONV_TRANSPOSE2D)
            continue;
        /* conv [oc][c/groups][kh][kw] -> [oc][kh][kw][c/groups]; convT [c][oc][k][k] -> [c][k][k][oc]
         * (a depthwise filter, one input channel per output, is the same in both) */
        const int pc = L->kind == SF_L_CONV2D ? L->in_c / (L->groups > 1 ? L->groups : 1) : L->out_c;
        const int taps = L->k * (L->kind == SF_L_CONV2D ? L->kw : L->k);
        if (g->lay == SF_LAYOUT_NHWC && taps > 1 && pc > 1 && g_add_seg(&g->segs_perm, L->w_off, L->n_w, pc, taps))
            return -1;
        if (i >= g->nf && g_add_seg(&g->segs_gd, L->w_off - m->train_off, L->n_w, 1, (int)L->n_w))
            return -1;
    }
    g->wcopy = g->dt != SF_DT_F32;
    if (g->wcopy) {
        if (dmalloc(net, &g->wd, g->es * (np ? np : 1)) || dmalloc(net, &g->gd, g->es * (np ? np : 1)))
            return -1;
        SF_CUDA_CHECK(cudaMemsetAsync(g->gd, 0, g->es * (np ? np : 1), net->s));
    } else {
        g->wd = net->params;
        g->gd = net->grads;
    }
    return 0;
}

/* Activations: the frozen prefix's boundary buffers, the memory plan and
 * each layer's own buffers. */
static int g_alloc_layer_buffers(sf_cuda_net *net)
{
    const sf_model *m = &net->m;
    const size_t nb = (size_t)net->cfg.max_batch;
    gen_net *g = net->g;
    const size_t es = g->es;
    if (g->nf > 0) {
        const sf_layer *L = &m->layers[g->nf - 1];
        g->bnd_elems = L->out_elems;
        for (int b = 0; b < net->cfg.nbuf; b++)
            if (dmalloc(net, &g->bnd[b], es * nb * L->out_elems))
                return -1;
    }
    if (g_plan_memory(net))
        return -1;
    if (net->cfg.stat_reduce && g->has_bn_train) {
        int widest = 0;
        for (int i = 0; i < g->nl; i++)
            if (m->layers[i].kind == SF_L_BATCHNORM2D && !g->op[i].frozen && m->layers[i].in_c > widest)
                widest = m->layers[i].in_c;
        if (dmalloc(net, (void **)&g->bn_sums, sizeof(double) * (2 * (size_t)widest + 1)) ||
            dmalloc(net, (void **)&g->nbt_empty, 2 * sizeof(unsigned long long)))
            return -1;
        SF_CUDA_CHECK(cudaMemsetAsync(g->nbt_empty, 0, 2 * sizeof(unsigned long long), net->s));
    }
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &m->layers[i];
        gop *o = &g->op[i];
        if (L->kind == SF_L_FLATTEN || o->fused)
            continue;
        if (L->kind == SF_L_BATCHNORM2D && dmallocf(net, &o->save, 2 * (size_t)L->out_ch))
            return -1;
        if ((L->kind == SF_L_LAYERNORM2D || L->kind == SF_L_LAYERNORM) &&
            dmallocf(net, &o->save, 2 * nb * L->in_h * L->in_w))
            return -1;
        if (L->kind == SF_L_GROUPNORM && dmallocf(net, &o->save, 2 * nb * (size_t)L->groups))
            return -1;
        if (L->kind == SF_L_GRN && dmallocf(net, &o->save, sf_cuda_grn_save_floats((int)nb, L->in_c)))
            return -1;
        if (o->s2d) {
            sf_conv_desc d;
            g_desc(net, i, (int)nb, &d);
            if (dmalloc(net, &o->s2d_x, es * sf_conv_s2d_x_elems(&d)) ||
                dmalloc(net, &o->s2d_w, es * sf_conv_s2d_w_elems(&d)) ||
                dmalloc(net, &o->s2d_gw, es * sf_conv_s2d_w_elems(&d)))
                return -1;
            SF_CUDA_CHECK(cudaMemsetAsync(o->s2d_x, 0, es * sf_conv_s2d_x_elems(&d), net->s));
        }
        if (L->kind == SF_L_CONV2D && !o->s2d && !o->thin &&
            (sf_cuda_ptr_align(E(g->wd, L->w_off, es)) < 16 || sf_cuda_ptr_align(E(g->gd, L->w_off, es)) < 16)) {
            if (dmalloc(net, &o->wal_w, es * L->n_w) ||
                (!o->frozen && !o->patch && dmalloc(net, &o->wal_gw, es * L->n_w)))
                return -1;
            g->n_wal++;
        }
        if (L->kind == SF_L_MAXPOOL2D && dmalloc(net, (void **)&o->argmax, sizeof(int32_t) * nb * L->out_elems))
            return -1;
        if (L->kind == SF_L_SELF_ATTENTION && g_attention_buffers(net, i))
            return -1;
    }
    if (g->n_attn && (dmalloc(net, &g->att_do, g->att_do_bytes) || dmalloc(net, &g->att_dqkv, g->att_dqkv_bytes) ||
                      dmallocf(net, &g->att_s, g->att_s_floats)))
        return -1;
    return 0;
}

/* The compute-stream scratch a step of n samples uses: the largest of the
 * bn, layernorm, groupnorm, layer scale, prelu, xent2d, bias-gradient, thin,
 * patch and depthwise conv partials (never used at once: a depthwise filter gradient on the side
 * stream overlaps only its own layer's data gradient, which uses none). The
 * allocation sizes it at max_batch and every batch size's plan checks it
 * (executor.cu, g_prepare), so a kernel whose partials outgrow the block
 * refuses the batch size instead of writing past it. */
size_t sf_exec_scratch_need(const sf_cuda_net *net, int n)
{
    const sf_model *m = &net->m;
    const gen_net *g = net->g;
    size_t sc = 0;
#define WANT(bytes)                                                                                                    \
    do {                                                                                                               \
        const size_t b_ = (bytes);                                                                                     \
        if (b_ > sc)                                                                                                   \
            sc = b_;                                                                                                   \
    } while (0)
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &m->layers[i];
        WANT(sizeof(float) * sf_cuda_bias_grad_scratch(g_bias_grad_c(L)));
        if (g->op[i].thin)
            WANT(sizeof(float) * sf_conv_thin_scratch_floats(L->in_c, L->out_c));
        if (g->op[i].patch)
            WANT(sizeof(float) * sf_conv_patch_scratch_floats(L->in_c, L->out_c, L->k));
        if (g->op[i].dw)
            WANT(sizeof(float) * sf_conv_dw_scratch_floats(n, L->in_c, L->out_h, L->k));
        if (L->kind == SF_L_BATCHNORM2D)
            WANT(sf_cuda_bn_scratch_bytes(n, L->in_c, L->in_h, L->in_w, g->lay));
        if (L->kind == SF_L_LAYERNORM2D || L->kind == SF_L_LAYERNORM) {
            const sf_layout ll = g->op[i].tok ? SF_LAYOUT_NHWC : g->lay; /* tokens: NHWC [c, t, 1] */
            WANT(sf_cuda_layernorm_scratch_bytes(n, L->in_c, (size_t)L->in_h * L->in_w, ll));
        }
        if (L->kind == SF_L_LAYER_SCALE || L->kind == SF_L_SCALE_SHIFT)
            WANT(sizeof(float) * sf_cuda_channel_scale_scratch(L->out_ch));
        if (L->kind == SF_L_PRELU)
            WANT(sizeof(float) * sf_cuda_prelu_scratch(L->out_ch));
        if (L->kind == SF_L_CHANNEL_CONV1D)
            WANT(sizeof(float) * sf_cuda_channel_conv1d_scratch(L->k));
        if (L->kind == SF_L_GROUPNORM && L->n_w)
            WANT(sf_cuda_groupnorm_scratch_bytes(n, L->in_c, (size_t)L->in_h * L->in_w));
        if (L->kind == SF_L_GRN)
            WANT(sf_cuda_grn_scratch_bytes(n, L->in_c));
    }
    if (m->segmentation)
        WANT(sf_cuda_xent2d_scratch_bytes(n, m->out_h, m->out_w));
#undef WANT
    return sc;
}

/* The low-precision nets' fp32 logits and their gradient, and the
 * compute-stream scratch. */
static int g_alloc_scratch(sf_cuda_net *net)
{
    const sf_model *m = &net->m;
    const size_t nb = (size_t)net->cfg.max_batch;
    gen_net *g = net->g;
    if (g->dt != SF_DT_F32) {
        const size_t lsz = nb * (size_t)m->n_classes * (m->segmentation ? (size_t)m->out_h * m->out_w : 1);
        if (dmallocf(net, &g->lg, lsz) || dmallocf(net, &g->dlg, lsz))
            return -1;
    }
    const size_t sc = sf_exec_scratch_need(net, net->cfg.max_batch);
    g->scratch_bytes = sc;
    if (dmalloc(net, &g->scratch, sc) || dmalloc(net, (void **)&g->x2d, sizeof(sf_xent2d_out)))
        return -1;
    return 0;
}

/* The gradient check's slots, the all-reduce's buckets and the
 * per-buffer gradient state on both sides. */
static int g_plan_grad_check(sf_cuda_net *net)
{
    const sf_model *m = &net->m;
    const size_t nb = (size_t)net->cfg.max_batch;
    gen_net *g = net->g;
    g->n_slots = 0;
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &m->layers[i];
        g->slot[i] = i >= g->nf && sf_layer_param_count(L) > 0 ? g->n_slots++ : -1;
    }
    /* The all-reduce's buckets, in the backward's order (decreasing i): a
     * bucket closes at the layer that brings it to grad_bucket_bytes, the
     * last one at the lowest trainable layer with parameters. The layers'
     * parameters are laid out in increasing i, so a bucket is one range. */
    int top = -1, lowest = -1;
    size_t bytes = 0;
    for (int i = g->nl - 1; i >= 0; i--) {
        g->rb_top[i] = -1;
        if (g->slot[i] < 0)
            continue;
        const sf_layer *L = &m->layers[i];
        top = top < 0 ? i : top;
        bytes += sizeof(float) * sf_layer_param_count(L);
        lowest = i;
        if (net->cfg.grad_bucket_bytes > 0 && bytes >= net->cfg.grad_bucket_bytes) {
            g->rb_top[i] = top;
            top = -1;
            bytes = 0;
        }
    }
    if (top >= 0)
        g->rb_top[lowest] = top;
    g->rb_last = lowest;
    if (dmallocf(net, &g->sq_part, (size_t)(g->n_slots > 0 ? g->n_slots : 1) * SF_SUMSQ_BLOCKS) ||
        dmalloc(net, (void **)&g->d_gs, sizeof(sf_grad_state) * (size_t)net->cfg.nbuf) ||
        dmalloc(net, (void **)&g->d_ar, 2 * sizeof(unsigned long long) * (size_t)net->cfg.nbuf))
        return -1;
    SF_CUDA_CHECK(cudaMemsetAsync(g->d_gs, 0, sizeof(sf_grad_state) * (size_t)net->cfg.nbuf, net->s));
    SF_CUDA_CHECK(cudaMemsetAsync(g->d_ar, 0, 2 * sizeof(unsigned long long) * (size_t)net->cfg.nbuf, net->s));
    SF_CUDA_CHECK(cudaHostAlloc((void **)&g->h_gs, sizeof(sf_grad_state) * (size_t)net->cfg.nbuf, 0));
    memset(g->h_gs, 0, sizeof(sf_grad_state) * (size_t)net->cfg.nbuf);
    SF_CUDA_CHECK(cudaHostAlloc((void **)&g->h_ar, sizeof(unsigned long long) * (size_t)net->cfg.nbuf, 0));
    memset(g->h_ar, 0, sizeof(unsigned long long) * (size_t)net->cfg.nbuf);
    if (m->segmentation && g->lay == SF_LAYOUT_NHWC &&
        dmallocf(net, &g->lgt, nb * (size_t)m->n_classes * m->out_h * m->out_w))
        return -1;
    return 0;
}

/* The layer graph of net->m: per-layer decisions, parameters and their
 * layout, buffers, and the memory plan (executor_graph.h). */
int sf_exec_build_graph(sf_cuda_net *net)
{
    const sf_model *m = &net->m;
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
    /* A flatten of a map with spatial extent flattens in NCHW order
     * (PyTorch's). Where only linear layers read it (VGG's classifier, the
     * tutorials' conv-flatten-linear nets), an NHWC net stores those layers'
     * weights with their columns in (h, w, c) order, the NHWC map's flatten
     * order (g_alloc_params); any other reader makes the model run NCHW. */
    for (int i = 0; i < g->nl; i++)
        if (g_spatial_flatten(m, i) && !g_read_by_linear_only(m, i))
            g->lay = SF_LAYOUT_NCHW;
    net->cfg.layout = g->lay;
    if (g_check_layers(net))
        return -1;
    g_choose_fusions(net);
    g_schedule_backward(net);
    g_share_add_grads(net);
    /* space-to-depth: a trainable strided conv over few channels whose input
     * gradient nobody wants (a stem or patch embedding reading the model
     * input), in bf16 nets (where it was measured; fp32 and TF32 nets keep
     * cuDNN's plain plan). Such a conv is never a thin one (stride >= 2) nor
     * a patch one (fp32 only). */
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &m->layers[i];
        g->op[i].s2d = !net->cfg.no_s2d && L->kind == SF_L_CONV2D && sf_layer_conv_square(L) && L->groups <= 1 &&
                       L->dilation <= 1 &&
                       g->dt == SF_DT_BF16 && !g->op[i].frozen &&
                       !g->op[i].want[0] && sf_conv_s2d_ok(g->lay, L->in_c, L->k, L->stride);
    }
    if (g_alloc_params(net))
        return -1;
    if (g_alloc_layer_buffers(net) || g_alloc_scratch(net))
        return -1;
    return g_plan_grad_check(net);
}
