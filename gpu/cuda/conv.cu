/* gpu/cuda/conv.cu — cuDNN graph-API convolution plans: tensor and operation
 * descriptors, engine heuristics filtered by their numerical notes, optional
 * timing of the candidates, the GEMM plan where no engine is left
 * (conv_gemm.h), variant packs and the run. Contracts in conv.h. */
#include "gpu/cuda/conv.h"
#include "gpu/cuda/conv_gemm.h"
#include "gpu/cuda/cudnn_graph.h"

#include "gpu/cuda/kernel_common.cuh"

/* cuDNN 9.x marks the handle attributes of op graphs and plans deprecated in
 * favour of device-property descriptors, which older 9.x releases lack; the
 * handle attributes work in every 9.x. */
#pragma nv_diag_suppress 1444
#pragma nv_diag_suppress 1215
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

static void dims_strides(int64_t n, int64_t c, int64_t h, int64_t w, sf_layout l, int64_t dims[4],
                         int64_t str[4])
{
    dims[0] = n;
    dims[1] = c;
    dims[2] = h;
    dims[3] = w;
    if (l == SF_LAYOUT_NHWC) {
        str[0] = h * w * c;
        str[1] = 1;
        str[2] = w * c;
        str[3] = c;
    } else {
        str[0] = c * h * w;
        str[1] = h * w;
        str[2] = w;
        str[3] = 1;
    }
}

/* The descriptors plan p keeps alive (cudnn_graph.h). */
static sf_cudnn_keep keep_of(sf_conv_plan *p)
{
    const sf_cudnn_keep k = {p->keep, &p->n_keep, SF_CONV_KEEP, "conv plan"};
    return k;
}

static int keep(sf_conv_plan *p, cudnnBackendDescriptor_t d)
{
    const sf_cudnn_keep k = keep_of(p);
    return sf_cudnn_keep_add(&k, d);
}

static cudnnDataType_t cudnn_type(sf_dtype dt)
{
    return dt == SF_DT_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

/* align: bytes (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), whatever the element type. */
static int make_tensor_v(sf_conv_plan *p, int64_t uid, cudnnDataType_t dt, const int64_t dims[4],
                         const int64_t str[4], int64_t align, bool is_virtual, cudnnBackendDescriptor_t *out)
{
    const sf_cudnn_keep k = keep_of(p);
    return sf_cudnn_tensor(&k, uid, dt, dims, str, align, is_virtual, out);
}

static int make_tensor(sf_conv_plan *p, int64_t uid, cudnnDataType_t dt, const int64_t dims[4],
                       const int64_t str[4], int64_t align, cudnnBackendDescriptor_t *out)
{
    return make_tensor_v(p, uid, dt, dims, str, align, false, out);
}

/* Builds the graph of (d, dir) into p->keep (the convolution, and for a fused
 * forward the pointwise epilogue); returns the graph. x, w, y have type d->dt;
 * the compute type, the virtual intermediates, the bias and the pointwise math
 * are fp32. */
static int build_graph(cudnnHandle_t h, const sf_conv_desc *d, sf_conv_dir dir, sf_conv_plan *p,
                       cudnnBackendDescriptor_t *graph_out)
{
    const int64_t groups = d->groups > 1 ? d->groups : 1, dilation = d->dilation > 1 ? d->dilation : 1;
    const sf_conv_wdims wd_ = sf_conv_width(d);
    const int64_t oh = (d->h + 2 * d->pad - (dilation * (d->k - 1) + 1)) / d->stride + 1;
    const int64_t ow = (d->w + 2 * wd_.pad - (wd_.dilation * (wd_.k - 1) + 1)) / wd_.stride + 1;
    int64_t xd[4], xs[4], wd[4], ws[4], yd[4], ys[4];
    dims_strides(d->n, d->c, d->h, d->w, d->layout, xd, xs);
    /* KCRS or KRSC; a grouped filter holds c/groups input channels, which is
     * how the graph API is told the group count (it has no attribute for it) */
    dims_strides(d->oc, d->c / groups, d->k, wd_.k, d->layout, wd, ws);
    dims_strides(d->n, d->oc, oh, ow, d->layout, yd, ys);
    cudnnBackendDescriptor_t tx, tw, ty, ty_out = NULL;
    const int fused = dir == SF_CONV_FWD && (d->fuse_bias || d->fuse_relu);
    const cudnnDataType_t et = cudnn_type(d->dt);
    if (make_tensor(p, 1, et, xd, xs, d->align_x, &tx) || make_tensor(p, 2, et, wd, ws, d->align_w, &tw))
        return -1;
    if (fused) {
        /* conv -> fp32 virtual tensor -> (+ fp32 bias) -> (relu) -> y (type dt) */
        if (make_tensor_v(p, 10, CUDNN_DATA_FLOAT, yd, ys, 16, true, &ty) ||
            make_tensor(p, 3, et, yd, ys, d->align_y, &ty_out))
            return -1;
    } else if (make_tensor(p, 3, et, yd, ys, d->align_y, &ty)) {
        return -1;
    }

    cudnnBackendDescriptor_t conv;
    const int64_t pad[2] = {d->pad, wd_.pad}, str[2] = {d->stride, wd_.stride}, dil[2] = {dilation, wd_.dilation};
    const sf_cudnn_keep kc = keep_of(p);
    if (sf_cudnn_conv2d(&kc, pad, str, dil, &conv))
        return -1;

    cudnnBackendDescriptor_t op;
    const float beta = dir == SF_CONV_BWD_DATA && d->accumulate ? 1.f : 0.f;
    if (sf_cudnn_conv_op(&kc, (int)dir, conv, tx, tw, ty, beta, &op))
        return -1;

    cudnnBackendDescriptor_t ops[3] = {op, NULL, NULL};
    int64_t n_ops = 1;
    if (fused) {
        cudnnBackendDescriptor_t cur = ty;
        for (int stage = 0; stage < 2; stage++) {
            if ((stage == 0 && !d->fuse_bias) || (stage == 1 && !d->fuse_relu))
                continue;
            const int last = stage == 1 || !d->fuse_relu;
            cudnnBackendDescriptor_t out_t = ty_out, bt = NULL;
            if (!last && make_tensor_v(p, 11, CUDNN_DATA_FLOAT, yd, ys, 16, true, &out_t))
                return -1;
            if (stage == 0) {
                int64_t bd[4] = {1, d->oc, 1, 1}, bs[4];
                bs[0] = d->oc;
                bs[1] = 1;
                bs[2] = d->layout == SF_LAYOUT_NHWC ? d->oc : 1;
                bs[3] = d->layout == SF_LAYOUT_NHWC ? d->oc : 1;
                if (make_tensor(p, 4, CUDNN_DATA_FLOAT, bd, bs, d->align_b, &bt))
                    return -1;
            }
            cudnnBackendDescriptor_t pop;
            const cudnnPointwiseMode_t mode = stage == 0 ? CUDNN_POINTWISE_ADD : CUDNN_POINTWISE_RELU_FWD;
            const sf_cudnn_keep k = keep_of(p);
            if (sf_cudnn_pointwise(&k, mode, CUDNN_DATA_FLOAT, -1, cur, bt, NULL, out_t, &pop))
                return -1;
            ops[n_ops++] = pop;
            cur = out_t;
        }
    }

    const sf_cudnn_keep k = keep_of(p);
    return sf_cudnn_graph(&k, h, ops, n_ops, graph_out);
}

/* Heuristic results of one mode: *cfgs (count *n), caller destroys. */
static int heuristics(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                      cudnnBackendDescriptor_t **cfgs, int64_t *n)
{
    *cfgs = NULL;
    *n = 0;
    cudnnBackendDescriptor_t heur;
    SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
    cudnnStatus_t st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendFinalize(heur);
    int64_t count = 0;
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                      0, &count, NULL);
    if (st != CUDNN_STATUS_SUCCESS || count <= 0) {
        cudnnBackendDestroyDescriptor(heur);
        return 0; /* no results from this mode: not an error by itself */
    }
    cudnnBackendDescriptor_t *v = (cudnnBackendDescriptor_t *)calloc((size_t)count, sizeof *v);
    if (!v) {
        cudnnBackendDestroyDescriptor(heur);
        sf_cuda_set_error("%s:%d: conv heuristics: out of memory", __FILE__, __LINE__);
        return -1;
    }
    int64_t made = 0;
    for (; made < count; made++)
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &v[made]) != CUDNN_STATUS_SUCCESS)
            break;
    int64_t got = 0;
    st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                  made, &got, v);
    cudnnBackendDestroyDescriptor(heur);
    if (st != CUDNN_STATUS_SUCCESS)
        got = 0;
    for (int64_t i = got; i < made; i++)
        cudnnBackendDestroyDescriptor(v[i]);
    *cfgs = v;
    *n = got;
    return 0;
}

/* Reads the engine's notes: returns 1 when the config is acceptable for data
 * of type dt (the rule is spelled out at sf_conv_plan_build in conv.h):
 *   REDUCED_PRECISION_REDUCTION  never (accumulation below fp32);
 *   DOWN_CONVERT_INPUTS          never (fp32 operands narrowed to fp16/bf16, or
 *                                bf16 operands narrowed further, e.g. to fp16,
 *                                which loses bf16's range);
 *   TENSOR_CORE                  bf16: always (bf16 MMA, fp32 accumulation);
 *                                fp32: only with tf32 (the MMA is TF32);
 *   RUNTIME_COMPILATION          only with allow_rtc.
 * *tc reports the TENSOR_CORE note whether or not the config is kept. */
static int cfg_ok(cudnnBackendDescriptor_t cfg, sf_dtype dt, int tf32, int allow_rtc, int64_t *engine_idx, int *tc)
{
    cudnnBackendDescriptor_t eng;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS)
        return 0;
    int64_t cnt = 0;
    int ok = cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                      &cnt, &eng) == CUDNN_STATUS_SUCCESS;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    cudnnBackendBehaviorNote_t beh[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    int64_t nn = 0, nb = 0;
    *tc = 0;
    *engine_idx = -1;
    if (ok) {
        if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                     CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes) != CUDNN_STATUS_SUCCESS)
            nn = 0;
        if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                     CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &nb, beh) != CUDNN_STATUS_SUCCESS)
            nb = 0;
        cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, engine_idx);
    }
    const int tc_allowed = dt == SF_DT_BF16 || tf32;
    for (int64_t i = 0; ok && i < nn; i++) {
        if (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
            notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
            ok = 0;
        if (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE) {
            *tc = 1;
            if (!tc_allowed)
                ok = 0;
        }
    }
    for (int64_t i = 0; ok && i < nb; i++)
        if (beh[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION && !allow_rtc)
            ok = 0;
    cudnnBackendDestroyDescriptor(eng);
    return ok;
}

/* Times one plan on the handle's stream: median of 3 after a warm-up; <0 on failure. */
static float time_plan(cudnnHandle_t h, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t vp)
{
    cudaStream_t s;
    if (cudnnGetStream(h, &s) != CUDNN_STATUS_SUCCESS)
        return -1.f;
    if (cudnnBackendExecute(h, plan, vp) != CUDNN_STATUS_SUCCESS)
        return -1.f;
    if (cudaStreamSynchronize(s) != cudaSuccess)
        return -1.f;
    cudaEvent_t e[4];
    for (int i = 0; i < 4; i++)
        if (cudaEventCreate(&e[i]) != cudaSuccess) {
            for (int j = 0; j < i; j++)
                cudaEventDestroy(e[j]);
            return -1.f;
        }
    float t[3] = {-1.f, -1.f, -1.f};
    int ok = cudaEventRecord(e[0], s) == cudaSuccess;
    for (int r = 0; ok && r < 3; r++) {
        ok = cudnnBackendExecute(h, plan, vp) == CUDNN_STATUS_SUCCESS &&
             cudaEventRecord(e[r + 1], s) == cudaSuccess;
    }
    ok = ok && cudaEventSynchronize(e[3]) == cudaSuccess;
    for (int r = 0; ok && r < 3; r++)
        ok = cudaEventElapsedTime(&t[r], e[r], e[r + 1]) == cudaSuccess;
    for (int i = 0; i < 4; i++)
        cudaEventDestroy(e[i]);
    if (!ok)
        return -1.f;
    /* median of three */
    float a = t[0], b = t[1], c = t[2];
    if (a > b) { float x = a; a = b; b = x; }
    if (b > c) { float x = b; b = c; c = x; }
    if (a > b) { float x = a; a = b; b = x; }
    return b;
}

/* cuDNN's variant pack and the pointers it binds (a GEMM plan reads those). */
struct sf_conv_vpack {
    cudnnBackendDescriptor_t vp;
    sf_conv_ptrs p;
};

extern "C" void sf_conv_plan_destroy(sf_conv_plan *p)
{
    if (!p)
        return;
    sf_conv_gemm_destroy(p);
    if (p->plan)
        cudnnBackendDestroyDescriptor(p->plan);
    for (int i = p->n_keep - 1; i >= 0; i--)
        cudnnBackendDestroyDescriptor(p->keep[i]);
    memset(p, 0, sizeof *p);
}

/* A timed candidate of sf_conv_plan_build: its plan and config (owned). */
struct cand {
    cudnnBackendDescriptor_t plan, cfg;
    float ms;
    int64_t ws, engine;
    int tc;
};

static void cand_drop(cand *c)
{
    if (c->plan)
        cudnnBackendDestroyDescriptor(c->plan);
    if (c->cfg)
        cudnnBackendDestroyDescriptor(c->cfg);
    *c = cand{};
}

extern "C" int sf_conv_plan_build(cudnnHandle_t h, const sf_conv_desc *d, sf_conv_dir dir, size_t ws_limit,
                                  int max_candidates, const sf_conv_ptrs *tune, sf_conv_plan *out)
{
    memset(out, 0, sizeof *out);
    out->ms = -1.f;
    out->engine = -1;
    static const char *dir_name[3] = {"fwd", "bwd_data", "bwd_filter"};
    if ((unsigned)dir > SF_CONV_BWD_FILTER || (d->dt != SF_DT_F32 && d->dt != SF_DT_BF16)) {
        sf_cuda_set_error("%s:%d: sf_conv_plan_build: direction %d, dtype %d", __FILE__, __LINE__, (int)dir,
                          (int)d->dt);
        return -1;
    }
    out->dt = d->dt;
    /* without an engine, an unfused pointwise convolution runs as GEMMs; a fused
     * one is refused, and its callers use the plain plan */
    const int accumulate = dir == SF_CONV_BWD_DATA && d->accumulate;
    const int gemm_fallback = sf_conv_gemm_ok(d) && !(dir == SF_CONV_FWD && (d->fuse_bias || d->fuse_relu)) &&
                              !accumulate;
    cudnnBackendDescriptor_t graph;
    if (build_graph(h, d, dir, out, &graph)) {
        /* cuDNN rejected a descriptor (for a bf16 fused graph: possibly the
         * mixed-type epilogue); name the convolution in the message. */
        char why[SF_CUDA_ERR_LEN];
        snprintf(why, sizeof why, "%s", sf_cuda_last_error());
        sf_conv_plan_destroy(out);
        char gemm_why[SF_CUDA_ERR_LEN] = "";
        if (gemm_fallback) {
            if (sf_conv_gemm_build(h, d, dir, ws_limit, tune, out) == 0)
                return 0;
            snprintf(gemm_why, sizeof gemm_why, "; GEMM path: %.400s", sf_cuda_last_error());
        }
        const sf_conv_wdims wd = sf_conv_width(d);
        sf_cuda_set_error("conv %s%s n=%d c=%d %dx%d oc=%d k=%dx%d s=%dx%d p=%dx%d g=%d dil=%dx%d %s %s: graph rejected: %s%s",
                          dir_name[dir], dir == SF_CONV_FWD && (d->fuse_bias || d->fuse_relu) ? "+bias/relu"
                                         : accumulate                                            ? "+acc"
                                                                                                 : "",
                          d->n, d->c, d->h, d->w, d->oc, d->k, wd.k, d->stride, wd.stride, d->pad, wd.pad,
                          d->groups > 1 ? d->groups : 1, d->dilation > 1 ? d->dilation : 1, wd.dilation,
                          d->layout == SF_LAYOUT_NHWC ? "nhwc" : "nchw",
                          sf_conv_prec_name(d->dt, d->tf32), why, gemm_why);
        return -1;
    }
    const int allow_rtc = d->allow_rtc;
    if (max_candidates < 1)
        max_candidates = 1;

    sf_conv_vpack *vp = NULL;
    if (tune && sf_conv_vpack_make(tune, &vp)) {
        sf_conv_plan_destroy(out);
        return -1;
    }

    /* two winners: the fastest within the preferred workspace (slot 0) and
     * the fastest needing more (slot 1); see sf_conv_desc.ws_prefer */
    const size_t prefer = d->ws_prefer && d->ws_prefer < ws_limit ? d->ws_prefer : ws_limit;
    cand win[2] = {};
    int tried = 0;
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int mi = 0; mi < 2 && !win[0].plan && !win[1].plan; mi++) {
        cudnnBackendDescriptor_t *cfgs = NULL;
        int64_t ncfg = 0;
        if (heuristics(graph, modes[mi], &cfgs, &ncfg)) {
            if (vp)
                sf_conv_vpack_destroy(vp);
            sf_conv_plan_destroy(out);
            return -1;
        }
        for (int64_t i = 0; i < ncfg; i++) {
            int64_t eidx;
            int tc;
            int use = tried < max_candidates && cfg_ok(cfgs[i], d->dt, d->tf32, allow_rtc, &eidx, &tc);
            cudnnBackendDescriptor_t plan = NULL;
            int64_t wsb = 0;
            if (use)
                use = sf_cudnn_plan(h, cfgs[i], &plan, &wsb) == CUDNN_STATUS_SUCCESS && wsb >= 0 &&
                      (size_t)wsb <= ws_limit;
            float ms = 0.f;
            if (use) {
                tried++;
                if (vp) {
                    ms = time_plan(h, plan, vp->vp);
                    use = ms >= 0.f;
                }
            }
            cand *w = &win[(size_t)wsb > prefer];
            if (use && (!w->plan || ms < w->ms)) {
                cand_drop(w);
                *w = cand{plan, cfgs[i], ms, wsb, eidx, tc};
                cfgs[i] = NULL;
            } else if (plan) {
                cudnnBackendDestroyDescriptor(plan);
            }
            if (!vp && win[0].plan)
                break; /* untimed: the heuristics' first usable config within ws_prefer */
        }
        for (int64_t i = 0; i < ncfg; i++)
            if (cfgs[i])
                cudnnBackendDestroyDescriptor(cfgs[i]);
        free(cfgs);
    }
    const int wide = win[1].plan && (!win[0].plan || (vp && win[1].ms * SF_CONV_WIDE_GAIN <= win[0].ms));
    cand_drop(&win[!wide]);
    const cand c = win[wide];
    cudnnBackendDescriptor_t best = c.plan, best_cfg = c.cfg;
    if (best) {
        out->ws_bytes = c.ws;
        out->engine = c.engine;
        out->tensor_core = c.tc;
        out->ms = vp ? c.ms : -1.f;
    }
    if (vp)
        sf_conv_vpack_destroy(vp);
    out->tried = tried;
    out->fused = dir == SF_CONV_FWD && (d->fuse_bias || d->fuse_relu);
    out->accumulate = accumulate;
    if (!best) {
        const int fused = out->fused;
        sf_conv_plan_destroy(out);
        char gemm_why[SF_CUDA_ERR_LEN] = "";
        if (gemm_fallback) {
            if (sf_conv_gemm_build(h, d, dir, ws_limit, tune, out) == 0)
                return 0;
            snprintf(gemm_why, sizeof gemm_why, "; GEMM path: %.400s", sf_cuda_last_error());
        }
        const sf_conv_wdims wd = sf_conv_width(d);
        sf_cuda_set_error("%s:%d: conv %s%s n=%d c=%d %dx%d oc=%d k=%dx%d s=%dx%d p=%dx%d g=%d dil=%dx%d %s %s: no usable "
                          "cuDNN engine (workspace limit %zu bytes)%s",
                          __FILE__, __LINE__, dir_name[dir], fused ? "+bias/relu" : accumulate ? "+acc" : "", d->n,
                          d->c, d->h, d->w,
                          d->oc, d->k, wd.k, d->stride, wd.stride, d->pad, wd.pad, d->groups > 1 ? d->groups : 1,
                          d->dilation > 1 ? d->dilation : 1, wd.dilation, d->layout == SF_LAYOUT_NHWC ? "nhwc" : "nchw",
                          sf_conv_prec_name(d->dt, d->tf32),
                          ws_limit, gemm_why);
        return -1;
    }
    if (keep(out, best_cfg)) {
        cudnnBackendDestroyDescriptor(best);
        sf_conv_plan_destroy(out);
        return -1;
    }
    out->plan = best;
    return 0;
}

extern "C" int sf_conv_vpack_make(const sf_conv_ptrs *p, sf_conv_vpack **out)
{
    sf_conv_vpack *pack = (sf_conv_vpack *)calloc(1, sizeof *pack);
    if (!pack) {
        sf_cuda_set_error("%s:%d: variant pack: out of host memory", __FILE__, __LINE__);
        return -1;
    }
    pack->p = *p;
    cudnnBackendDescriptor_t v;
    void *ptrs[4] = {p->x, p->w, p->y, p->b};
    const int64_t uids[4] = {1, 2, 3, 4};
    const int64_t np = p->b ? 4 : 3;
    const cudnnStatus_t st = sf_cudnn_vpack(ptrs, uids, np, p->ws, &v);
    if (st != CUDNN_STATUS_SUCCESS) {
        free(pack);
        sf_cuda_set_error("%s:%d: variant pack: %s", __FILE__, __LINE__, cudnnGetErrorString(st));
        return -1;
    }
    pack->vp = v;
    *out = pack;
    return 0;
}

extern "C" void sf_conv_vpack_destroy(sf_conv_vpack *vp)
{
    if (!vp)
        return;
    if (vp->vp)
        cudnnBackendDestroyDescriptor(vp->vp);
    free(vp);
}

extern "C" int sf_conv_run(cudnnHandle_t h, const sf_conv_plan *p, const sf_conv_vpack *vp)
{
    if (!sf_conv_plan_built(p) || !vp) {
        sf_cuda_set_error("%s:%d: sf_conv_run: plan or variant pack missing", __FILE__, __LINE__);
        return -1;
    }
    if (p->gemm)
        return sf_conv_gemm_run(h, p, &vp->p);
    SF_CUDNN_CHECK(cudnnBackendExecute(h, p->plan, vp->vp));
    return 0;
}
