/* gpu/cuda/executor_tune.cu — the cuDNN plans of each batch size: per
 * conv/convT layer and direction, cuDNN's engines are built and timed (the
 * fused conv+bias(+ReLU) forward where it beats the plain plan plus our
 * epilogue), sized against the workspaces, bound to the layers' tensors as
 * variant packs, and described for diagnostics. executor.cu runs the plans.
 */
#include "gpu/cuda/executor_graph.h"
#include "gpu/cuda/timing.cuh"
#include <stdarg.h>

/* The descriptor cuDNN's plans of conv layer i are built for: the layer's
 * own, or its space-to-depth form. */
static void g_conv_desc(const sf_cuda_net *net, int i, int n, sf_conv_desc *d)
{
    g_desc(net, i, n, d);
    d->groups = net->m.layers[i].groups;
    d->dilation = net->m.layers[i].dilation;
    d->kw = net->m.layers[i].kw; /* a convT layer leaves these 0: square */
    d->stride_w = net->m.layers[i].stride_w;
    d->pad_w = net->m.layers[i].pad_w;
    d->dilation_w = net->m.layers[i].dilation_w;
    d->ws_prefer = net->g->ws_prefer;
    if (net->g->op[i].s2d)
        sf_conv_s2d_desc(d, d);
}
/* Pointers of conv/convT layer i in direction dir for buffer b (conv roles;
 * convT uses the same roles); acc: backward-data's into the input's owner's
 * gradient even where gtmp takes it first (the plan that adds, g_try_acc). */
static void g_ptrs(const sf_cuda_net *net, int i, int dir, int b, void *ws, sf_conv_ptrs *p, int acc = 0)
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
        p->x = o->first[0] || acc ? g->op[s].dy : o->gtmp;
        p->w = o->wal_w ? o->wal_w : g_wd(net, i);
        p->y = o->dy;
    } else {
        p->x = g_in(net, i, 0, b);
        p->w = o->wal_gw ? o->wal_gw : g_gd(net, i);
        p->y = o->dy;
    }
}
/* The workspace kind (WS_*) a conv/convT plan of layer i in direction dir runs with. */
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
    return sf_time_best3(net->s, [&] {
        sf_cuda_bias_act_dt(g->dt, y, g_bias(net, i), outer, L->out_c, inner, g->op[i].relu, net->s);
    });
}

int g_acc_ok(const sf_cuda_net *net, int i)
{
    const gop *o = &net->g->op[i];
    return !net->cfg.no_acc && net->m.layers[i].kind == SF_L_CONV2D && o->want[0] && !o->first[0] && !o->thin &&
           !o->patch && !o->s2d && !o->dw && !o->frozen;
}

/* Replaces conv layer i's backward-data plan *plain (which writes gtmp) with
 * one that adds into the input's owner's gradient (beta 1) where cuDNN has
 * one and, timed, it is faster than *plain plus the add pass it saves
 * (g_add_back: two reads and a write of the input's size; timed here on p's
 * dx buffer added to itself). Sets S->acc[i] when it does. Untimed (tune <=
 * 1), a plan that builds is taken. No plan is no error: *plain stays. */
static void g_try_acc(sf_cuda_net *net, gshape *S, int i, int n, const sf_conv_desc *d, const sf_conv_ptrs *p,
                      size_t ws_limit, sf_conv_plan *plain)
{
    sf_conv_desc da = *d;
    da.accumulate = 1;
    sf_conv_plan ap;
    if (sf_conv_plan_build(net->dnn, &da, SF_CONV_BWD_DATA, ws_limit, net->cfg.tune, net->cfg.tune > 1 ? p : NULL,
                           &ap)) {
        sf_cuda_clear_error();
        return;
    }
    const sf_layer *L = &net->m.layers[i];
    const size_t len = (size_t)n * L->in_c * L->in_h * L->in_w;
    const sf_dtype dt = net->g->dt;
    const float add_ms = plain->ms >= 0.f && ap.ms >= 0.f
                             ? sf_time_best3(net->s, [&] { sf_cuda_add_dt(dt, p->x, p->x, p->x, len, 0, net->s); })
                             : 0.f;
    sf_cuda_clear_error();
    if (plain->ms < 0.f || ap.ms < 0.f || ap.ms < plain->ms + add_ms) {
        sf_conv_plan_destroy(plain);
        *plain = ap;
        S->acc[i] = 1;
    } else {
        sf_conv_plan_destroy(&ap);
    }
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

/* Runs direction dir of depthwise conv layer i (conv_dw.h) for n samples on
 * the conv roles' pointers p (sf_conv_ptrs: x, w, y), without bias or ReLU
 * (the epilogue follows as after a plain cuDNN plan). */
int g_conv_dw_run(sf_cuda_net *net, int i, int n, int dir, const sf_conv_ptrs *p, cudaStream_t s)
{
    const sf_layer *L = &net->m.layers[i];
    const sf_dtype dt = net->g->dt;
    if (dir == SF_CONV_FWD)
        return sf_conv_dw_fwd(dt, p->x, p->w, NULL, p->y, n, L->in_c, L->in_h, L->in_w, L->k, L->stride, L->pad, s);
    if (dir == SF_CONV_BWD_DATA)
        return sf_conv_dw_bwd_data(dt, p->y, p->w, p->x, n, L->in_c, L->in_h, L->in_w, L->k, L->stride, L->pad, s);
    return sf_conv_dw_bwd_filter(dt, p->x, p->y, p->w, n, L->in_c, L->in_h, L->in_w, L->k, L->stride, L->pad,
                                 (float *)net->g->scratch, s);
}

/* Time of direction dir of depthwise layer i's kernel (ms, best of 3 after
 * one untimed run); -1 when it fails (the error is cleared: cuDNN's plan
 * stays). */
static float g_time_dw(sf_cuda_net *net, int i, int n, int dir, const sf_conv_ptrs *p)
{
    int bad = g_conv_dw_run(net, i, n, dir, p, net->s);
    const float best = bad ? 0.f : sf_time_best3(net->s, [&] { bad |= g_conv_dw_run(net, i, n, dir, p, net->s); });
    if (cudaStreamSynchronize(net->s) != cudaSuccess)
        bad = 1;
    if (bad) {
        sf_cuda_clear_error();
        return -1.f;
    }
    return best > 0.f ? best : -1.f;
}

/* Whether direction dir of depthwise layer i runs conv_dw.h's kernel for
 * batch size n: when it times faster than the cuDNN plan chosen for it
 * (a fused forward against the kernel plus the epilogue), or always with
 * cfg.force_dw. Needs timed plans (cfg.tune > 1); untimed, cuDNN's plan
 * stays. */
static void g_choose_dw(sf_cuda_net *net, gshape *S, int i, int n, int dir, const sf_conv_ptrs *p)
{
    const sf_conv_plan *cp = &S->cp[i][dir];
    if (!net->g->op[i].dw)
        return;
    if (net->cfg.force_dw) {
        S->dw[i] |= (unsigned char)(1u << dir);
        return;
    }
    if (net->cfg.tune <= 1 || cp->ms < 0.f)
        return;
    float ms = g_time_dw(net, i, n, dir, p);
    if (ms < 0.f)
        return;
    S->dw_ms[i][dir] = ms;
    if (dir == SF_CONV_FWD && cp->fused)
        ms += g_time_epilogue(net, i, n, p->y);
    if (ms < cp->ms)
        S->dw[i] |= (unsigned char)(1u << dir);
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

void gshape_destroy(gshape *S)
{
    if (!S)
        return;
    /* Every captured graph: the two training ones and the evaluation one. */
    for (int b = 0; b < SF_NET_MAX_BUF; b++)
        for (size_t k = 0; k < sizeof S->exec[b] / sizeof S->exec[b][0]; k++)
            if (S->exec[b][k])
                cudaGraphExecDestroy(S->exec[b][k]);
    for (int i = 0; i < SF_MAX_LAYERS; i++) {
        for (int d = 0; d < 3; d++)
            sf_conv_plan_destroy(&S->cp[i][d]);
        sf_convt_plans_destroy(&S->tp[i]);
        sf_sdpa_plan_destroy(S->sdpa[i]);
        for (int j = 0; j < 2; j++) {
            sf_linear_lt_destroy(S->lt[i][j]);
            sf_linear_lt_destroy(S->ltd[i][j]);
        }
    }
    free(S);
}

/* Whether layer i's forward GEMMs run on cuBLASLt with the bias in their
 * epilogue: a trainable layer (a frozen one runs on the transform stream,
 * whose workspace the cuBLAS handle's is not) whose GEMM has the rows of one
 * matrix (flat features, an NHWC map, tokens; an NCHW map over channels is
 * one GEMM per sample), a bias to fuse and no ReLU folded into it (our bias
 * kernel applies the two in one pass). self_attention's projections always
 * have their biases. */
static int g_lt_wants(const sf_cuda_net *net, int i)
{
    const sf_layer *L = &net->m.layers[i];
    const gop *o = &net->g->op[i];
    if (net->cfg.no_lt || o->frozen)
        return 0;
    if (L->kind == SF_L_SELF_ATTENTION)
        return 1;
    const int rows = o->tok || net->g->lay == SF_LAYOUT_NHWC || L->out_h * L->out_w == 1;
    return L->kind == SF_L_LINEAR && L->n_b > 0 && !o->relu && rows;
}

/* Stand-ins the cuBLASLt algorithms are timed on, one input and one output
 * of bytes each (the widest GEMM of the batch size), the input filled with
 * random values; the workspace is the executor's cuBLAS one, which the
 * plans run with. x NULL where the device has no room (the plans then take
 * cuBLASLt's first algorithm). */
typedef struct lt_tune {
    void *x, *y;
} lt_tune;

static void lt_tune_alloc(sf_cuda_net *net, size_t bytes, lt_tune *t)
{
    memset(t, 0, sizeof *t);
    const gen_net *g = net->g;
    if (cudaMalloc(&t->x, bytes) != cudaSuccess || cudaMalloc(&t->y, bytes) != cudaSuccess ||
        sf_cuda_fill_random_dt(g->dt, t->x, bytes / g->es, 11, 1.f, net->s)) {
        cudaGetLastError();
        sf_cuda_clear_error();
        cudaFree(t->x);
        cudaFree(t->y);
        memset(t, 0, sizeof *t);
    }
}

/* Rows and the widest side of layer i's GEMMs for n samples. */
static void g_lt_shape(const sf_cuda_net *net, int i, int n, int *rows, int *widest)
{
    const sf_layer *L = &net->m.layers[i];
    const int attn = L->kind == SF_L_SELF_ATTENTION;
    *rows = n * (attn ? L->in_h : L->out_h * L->out_w);
    *widest = attn ? 3 * L->in_c : (L->in_c > L->out_c ? L->in_c : L->out_c);
}

/* The cuBLASLt plans of layer i for n samples: the forward of each of its
 * GEMMs and, where that has one, its backward-data GEMM; a GEMM cuBLASLt has
 * no plan for keeps the cuBLAS path (and our bias kernel), and the first such
 * reason is kept for describe. With stand-ins t each plan keeps the
 * fastest of cuBLASLt's first eight candidates on them. Activations sit at 256-byte offsets of their arenas or
 * allocations; 16 bytes is what the plans assume of them, and a call below
 * it takes the cuBLAS path (sf_linear_lt_fwd). */
static void g_lt_plans(sf_cuda_net *net, gshape *S, int i, int n, const lt_tune *t)
{
    const sf_layer *L = &net->m.layers[i];
    const gen_net *g = net->g;
    const int attn = L->kind == SF_L_SELF_ATTENTION;
    int rows, widest;
    g_lt_shape(net, i, n, &rows, &widest);
    for (int j = 0; j < (attn ? 2 : 1); j++) {
        const int wslot = g_proj_slot(L, j, 0), bslot = g_proj_slot(L, j, 1);
        sf_linear_lt_desc d;
        memset(&d, 0, sizeof d);
        d.dt = g->dt;
        d.tf32 = net->cfg.tf32;
        d.rows = rows;
        d.in = L->in_c;
        d.out = attn ? (j ? L->in_c : 3 * L->in_c) : L->out_c;
        d.b = bslot >= 0 ? net->params + L->p_off[bslot] : NULL;
        d.w = E(g->wd, L->p_off[wslot], g->es);
        d.align_act = 16;
        d.ws_bytes = net->blas_ctx.ws_bytes;
        if (t) {
            d.tune = 8;
            d.tx = t->x;
            d.ty = t->y;
            d.tws = net->blas_ctx.ws;
            d.ts = net->s;
        }
        char why[160] = "";
        S->lt_of++;
        int rc = sf_linear_lt_create(&S->lt[i][j], net->lt, &d, why, sizeof why);
        if (rc && g->dt == SF_DT_BF16 && bslot >= 0) {
            /* the bias's bf16 copy (wd holds every parameter), as autocast reads it */
            sf_linear_lt_desc d16 = d;
            d16.b = E(g->wd, L->p_off[bslot], g->es);
            d16.b_bf16 = 1;
            char why16[160] = "";
            rc = sf_linear_lt_create(&S->lt[i][j], net->lt, &d16, why16, sizeof why16);
            S->lt_b16 += rc == 0;
        }
        if (rc) {
            if (!S->lt_why[0])
                snprintf(S->lt_why, sizeof S->lt_why, "layer %d: %s", i, why);
            continue;
        }
        S->lt_n++;
        S->lt_plain += bslot < 0;
        if (!net->cfg.no_lt_tune) { /* its backward-data GEMM, where cuBLASLt has a plan */
            sf_linear_lt_desc dd = d;
            dd.dgrad = 1;
            dd.b = NULL;
            dd.b_bf16 = 0;
            if (sf_linear_lt_create(&S->ltd[i][j], net->lt, &dd, why, sizeof why))
                S->ltd[i][j] = NULL;
        }
        for (sf_linear_lt *p : {S->lt[i][j], S->ltd[i][j]}) {
            int pick, of;
            sf_linear_lt_pick(p, &pick, &of);
            S->lt_timed += of > 1;
            S->lt_other += pick > 0;
        }
    }
}

/* Every layer's cuBLASLt plans for n samples (g_lt_plans), timed where
 * timed (the first batch size's plans, before the arenas exist) and
 * net->cfg.tune > 1, on one pair of stand-ins for all of them. */
static void g_lt_all_plans(sf_cuda_net *net, gshape *S, int n, int timed)
{
    const gen_net *g = net->g;
    size_t bytes = 0;
    for (int i = 0; i < g->nl; i++) {
        int rows, widest;
        g_lt_shape(net, i, n, &rows, &widest);
        if (g_lt_wants(net, i) && g->es * (size_t)rows * (size_t)widest > bytes)
            bytes = g->es * (size_t)rows * (size_t)widest;
    }
    lt_tune t = {NULL, NULL};
    if (bytes && timed && net->cfg.tune > 1 && !net->cfg.no_lt_tune)
        lt_tune_alloc(net, bytes, &t);
    for (int i = 0; i < g->nl; i++)
        if (g_lt_wants(net, i))
            g_lt_plans(net, S, i, n, t.x ? &t : NULL);
    cudaFree(t.x);
    cudaFree(t.y);
}

/* Plans for batch size n; a plan of workspace kind k may use lim[k] bytes and
 * is timed with workspace ws[k], on the layer's own tensors or, with tp, on
 * stand-ins for them (before the arenas exist). */
int g_build_shape(sf_cuda_net *net, int n, void *const ws[3], const size_t lim[3], const timing_ptrs *tp,
                  gshape **out)
{
    gen_net *g = net->g;
    gshape *S = (gshape *)calloc(1, sizeof *S);
    if (!S) {
        sf_cuda_set_error("%s:%d: out of host memory", __FILE__, __LINE__);
        return -1;
    }
    S->n = n;
    g_lt_all_plans(net, S, n, tp != NULL);
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
                    if (dir == SF_CONV_BWD_DATA && g_acc_ok(net, i)) { /* the adding plan's dx too */
                        g_ptrs(net, i, dir, b, ws[k], &pb, 1);
                        if ((a = sf_cuda_ptr_align(pb.x)) < d.align_x) d.align_x = a;
                    }
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
                if (dir == SF_CONV_BWD_DATA && g_acc_ok(net, i)) {
                    sf_conv_ptrs pa;
                    g_ptrs(net, i, dir, 0, ws[k], &pa, 1);
                    if (tp) {
                        pa.x = tp->x;
                        pa.y = tp->y;
                    }
                    g_try_acc(net, S, i, n, &d, &pa, lim[k], &S->cp[i][dir]);
                }
                g_choose_dw(net, S, i, n, dir, &p);
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

gshape *g_find(const sf_cuda_net *net, int n)
{
    for (int i = 0; i < net->g->n_shapes; i++)
        if (net->g->shapes[i]->n == n)
            return net->g->shapes[i];
    return NULL;
}

/* The workspace bytes the plans of S need, by workspace kind. A direction
 * that runs the depthwise kernel never runs its cuDNN plan (kept for
 * describe's comparison), so that plan's workspace is not held: cuDNN's
 * depthwise engines, timed within the build's wide limit, asked for
 * hundreds of MB (mobilenet_v3_large at batch 256 held 580 MB of side
 * workspace that nothing ran with). */
void g_shape_ws(const sf_cuda_net *net, const gshape *S, size_t need[3])
{
    need[0] = need[1] = need[2] = 0;
    for (int i = 0; i < net->g->nl; i++) {
        for (int d = 0; d < 3; d++) {
            const int k = g_ws_kind(net, i, d);
            if ((S->dw[i] >> d) & 1)
                continue;
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

int g_vpacks(sf_cuda_net *net)
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
                if (dir == SF_CONV_BWD_DATA && g_acc_ok(net, i)) {
                    g_ptrs(net, i, dir, b, g_ws_of(net, i, dir), &p, 1);
                    if (sf_conv_vpack_make(&p, &g->op[i].vpa[b]))
                        return -1;
                }
            }
        }
    }
    return 0;
}

/* Appends the printf-formatted text at buf + *at while there is room; *at
 * counts what snprintf would have written, so it may pass len when the
 * text is cut. */
static void g_append(char *buf, size_t len, size_t *at, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void g_append(char *buf, size_t len, size_t *at, const char *fmt, ...)
{
    if (*at >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    const int w = vsnprintf(buf + *at, len - *at, fmt, ap);
    va_end(ap);
    if (w > 0)
        *at += (size_t)w;
}

/* describe's lines on the fusions the executor chose: batchnorms that apply
 * their activation, concat inputs whose ReLU mask the concat applies, and
 * residual adds that write one gradient for both inputs. Appends at buf +
 * at; returns the new end. */
static size_t describe_fusions(const sf_cuda_net *net, char *buf, size_t len, size_t at)
{
    const gen_net *g = net->g;
    if (at < len) {
        int nact = 0, nrelu = 0;
        for (int i = 0; i < g->nl; i++)
            if (net->m.layers[i].kind == SF_L_BATCHNORM2D) {
                nact += g->op[i].bn_act != 0;
                nrelu += g->op[i].relu;
            }
        /* "; 3 followed by leaky_relu, elu, mish run it apart (...)" */
        char apart[192] = "", kinds[120] = "";
        for (int k = 0, at_k = 0; k < SF_L_KIND_COUNT && at_k < (int)sizeof kinds; k++)
            if (g->bn_apart_kinds >> k & 1)
                at_k += snprintf(kinds + at_k, sizeof kinds - (size_t)at_k, "%s%s", at_k ? ", " : "",
                                 sf_layer_kind_name((sf_layer_kind)k));
        if (g->n_bn_apart)
            snprintf(apart, sizeof apart, "; %d followed by %s run it apart (activations the fused kernels do not "
                     "take)", g->n_bn_apart, kinds);
        if (nact + nrelu + g->n_bn_apart)
            g_append(buf, len, &at, "batchnorm: %d followed by ReLU and %d by another activation apply it in their "
                     "own pass (fused)%s\n", nrelu, nact, apart);
    }
    int ncat = 0, nshare = 0, nalias = 0;
    for (int i = 0; i < g->nl; i++) {
        ncat += g->op[i].cat_mask;
        nshare += g->op[i].grad_shared != 0;
        nalias += g->op[i].grad_alias;
    }
    if (ncat)
        g_append(buf, len, &at, "concat: %d inputs made by a layer with a fused ReLU take its mask from the "
                 "concatenation in the backward (their own outputs die at the concat)\n", ncat);
    if (nshare)
        g_append(buf, len, &at, "add: %d residual adds write one input gradient, which their batchnorm input reads "
                 "as its own\n", nshare);
    if (nalias)
        g_append(buf, len, &at, "add: %d residual adds keep their gradient in their residual input's buffer, where "
                 "their branch reads it (no backward pass of their own)\n", nalias);
    return at;
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
            if (L->kind == SF_L_CONV2D && ((S->dw[i] >> d) & 1)) {
                int w = snprintf(buf + at, len - at,
                                 "layer %d %s %d->%d k%d s%d %dx%d %s: engine depthwise kernel (conv_dw.h) %s, "
                                 "%.3f ms (cuDNN engine %lld: %.3f ms)\n",
                                 i, sf_layer_kind_name(L->kind), L->in_c, L->out_c, L->k, L->stride, L->in_h, L->in_w,
                                 dn[d], g->dt == SF_DT_BF16 ? "bf16" : "fp32", S->dw_ms[i][d], (long long)p->engine,
                                 p->ms);
                if (w < 0)
                    break;
                at += (size_t)w;
                continue;
            }
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
                             dn[d], p->fused ? "+bias/relu fused" : p->accumulate ? " adding into the input's gradient" : "", (long long)p->engine, p->tensor_core ? " tc" : "", (long long)p->ws_bytes, p->ms,
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
    if (at < len && S->lt_of) {
        const int all = S->lt_n == S->lt_of;
        int n_ltd = 0;
        for (int i = 0; i < g->nl; i++)
            n_ltd += (S->ltd[i][0] != NULL) + (S->ltd[i][1] != NULL);
        char timed[160] = "";
        if (S->lt_timed)
            snprintf(timed, sizeof timed, "; algorithms timed for %d plans, %d of them on another than cuBLASLt's "
                     "first", S->lt_timed, S->lt_other);
        char plain[96] = "";
        if (S->lt_plain)
            snprintf(plain, sizeof plain, "; %d of them have no bias and run without an epilogue", S->lt_plain);
        int w = snprintf(buf + at, len - at,
                         "linear: cuBLASLt with the bias in the GEMM for %d of %d forward GEMMs (epilogue BIAS%s)%s; "
                         "%d backward-data GEMMs on cuBLASLt%s%s%s\n",
                         S->lt_n, S->lt_of, plain,
                         S->lt_b16 ? "; forward biases read as their bf16 copies (no plan with fp32 ones)" : "",
                         n_ltd, timed, all ? "" : ", the others on cuBLAS: ", all ? "" : S->lt_why);
        if (w > 0)
            at += (size_t)w;
    }
    at = describe_fusions(net, buf, len, at);
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
