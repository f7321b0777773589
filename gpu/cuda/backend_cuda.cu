/* gpu/cuda/backend_cuda.cu — the CUDA backend: sf_backend_i over the streams,
 * events and batch buffers of docs/DESIGN.md, with the step from executor.h.
 *
 * Per batch, in buffer b (b = submission count mod nbuf):
 *   submit (host):    copy hyper-parameters, labels and the sf_aug_sample array
 *                     into b's pinned staging area (the engine's sample array
 *                     is pageable, and a graph must read hyper-parameters from
 *                     device memory).
 *   decode stream:    (a JPEG batch) wait jpeg_read[k] -> nvJPEG decode from
 *                     the pinned ring slot into staging area k (k = 0, 1 by
 *                     turns) -> jpeg_decoded[k]
 *   transform stream: wait done[b] -> h2d0[b] -> staging H2D, images H2D (from
 *                     the pinned ring slot; for a JPEG batch a wait for
 *                     jpeg_decoded[k] instead) -> h2d[b] -> labels to int32
 *                     -> sf_cuda_augment -> (JPEG) jpeg_read[k] -> ready[b]
 *   compute stream:   wait ready[b] -> step0[b] -> step (graph or eager; it ends
 *                     by copying loss/correct to b's pinned result) -> done[b]
 *   poll (host):      h2d[b] complete -> SF_EV_SLOT_FREE; done[b] complete ->
 *                     SF_EV_STEP_DONE, with stage times from the events. Only
 *                     cudaEventQuery; never a stream or device synchronisation.
 * With cfg->overlap == 0 the three streams are one stream: the same work,
 * serial (one JPEG staging area).
 *
 * Host times of device events come from an anchor event recorded on an idle
 * auxiliary stream at a known host time (renewed every few seconds, since
 * cudaEventElapsedTime is a float of milliseconds).
 *
 * Build options come from sf_train_cfg only: the activation layout
 * (pipeline.layout, AUTO = the rule in cu_build), the cuDNN tuning budget
 * (pipeline.cudnn_tune_configs) and the executor's switches (tests and
 * benchmarks). describe() reports the plan chosen (GET /v1/model).
 *
 * Checkpoints: get/set_opt_state move the momentum buffer (model layout; the
 * KRSC copies exist for weights only and set_params refreshes them) and the
 * step count that STEP_DONE reports.
 *
 * device_stats: NVML through dlopen (nvml.c), keyed by the PCI bus id read at
 * construction; safe from any thread.
 *
 * Failures: a batch that cannot be started returns -1 from submit (no events);
 * one that fails after its copies were queued is finished with a
 * synchronisation (error path only) and reported as STEP_DONE status -1. A
 * failed event query means a sticky device error: every batch in flight fails
 * and health() reports it.
 *
 * Files: backend_ctx.h holds the context and what the backend's files share;
 * backend_dist.cu the data-parallel hooks, empty rounds and watchdog;
 * backend_bench.cu the diagnose benchmark.
 */
#include "gpu/cuda/backend_ctx.h"
#include "gpu/cuda/exec_switches.h"

/* ---- clock ---------------------------------------------------------------- */

static int anchor_init(cuda_ctx *c)
{
    SF_CUDA_CHECK(cudaStreamSynchronize(c->st_aux));
    c->anchor_ns = now_ns();
    SF_CUDA_CHECK(cudaEventRecord(c->anchor, c->st_aux));
    SF_CUDA_CHECK(cudaEventSynchronize(c->anchor));
    c->anchor_ok = 1;
    c->anchor_pending = 0;
    return 0;
}

/* Renews the anchor without waiting: records on the idle auxiliary stream and
 * switches once it has completed. */
static void anchor_tick(cuda_ctx *c)
{
    const uint64_t t = now_ns();
    if (c->anchor_pending) {
        cudaError_t e = cudaEventQuery(c->anchor_next);
        if (e == cudaSuccess) {
            cudaEvent_t x = c->anchor;
            c->anchor = c->anchor_next;
            c->anchor_next = x;
            c->anchor_ns = c->anchor_next_ns;
            c->anchor_pending = 0;
        } else if (e != cudaErrorNotReady) {
            make_sticky(c, "cudaEventQuery(anchor)", e);
        }
        return;
    }
    if (t - c->anchor_ns > ANCHOR_PERIOD_NS) {
        c->anchor_next_ns = now_ns();
        if (cudaEventRecord(c->anchor_next, c->st_aux) == cudaSuccess)
            c->anchor_pending = 1;
    }
}

static uint64_t ev_host_ns(cuda_ctx *c, cudaEvent_t e)
{
    float ms = 0.f;
    if (!c->anchor_ok || cudaEventElapsedTime(&ms, c->anchor, e) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    double t = (double)c->anchor_ns + (double)ms * 1e6;
    return t > 0 ? (uint64_t)t : 0;
}

static double ev_seconds(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0.f;
    if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
        cudaGetLastError();
        return 0.0;
    }
    return (double)ms * 1e-3;
}

/* ---- state ---------------------------------------------------------------- */

static void free_buffers(cuda_ctx *c)
{
    /* The step's graphs captured the communicator's all-reduces, and NCCL
     * holds a reference for each such graph until the graph is destroyed:
     * a communicator destroyed first waits for those references forever. */
    if (c->net) {
        sf_net_destroy(c->net);
        c->net = NULL;
    }
    sf_nccl_free(c->nccl);
    c->nccl = NULL;
    for (int b = 0; b < CUDA_NBUF; b++) {
        cbuf *B = &c->buf[b];
        if (B->h_stage) cudaFreeHost(B->h_stage);
        if (B->h_res) cudaFreeHost(B->h_res);
        if (B->h_logits) cudaFreeHost(B->h_logits);
        if (B->h_kept_labels) cudaFreeHost(B->h_kept_labels);
        free(B->left_out);
        if (B->d_stage) cudaFree(B->d_stage);
        if (B->d_raw) cudaFree(B->d_raw);
        if (B->d_x) cudaFree(B->d_x);
        if (B->d_lab) cudaFree(B->d_lab);
        if (B->d_labraw) cudaFree(B->d_labraw);
        if (B->d_res) cudaFree(B->d_res);
        cudaEvent_t *ev[5] = {&B->h2d0, &B->h2d, &B->ready, &B->step0, &B->done};
        for (int i = 0; i < 5; i++)
            if (*ev[i])
                cudaEventDestroy(*ev[i]);
        memset(B, 0, sizeof *B);
    }
    pthread_mutex_lock(&c->jpeg_mu);
    sf_cuda_jpeg *jpeg = c->jpeg;
    c->jpeg = NULL;
    pthread_mutex_unlock(&c->jpeg_mu);
    sf_cuda_jpeg_free(jpeg);
    free(c->kept_samples);
    free(c->kept_labels);
    c->kept_samples = NULL;
    c->kept_labels = NULL;
    c->built = 0;
}

static void push_ready(cuda_ctx *c, const sf_event *ev)
{
    c->ring[(c->r_head + c->r_count) % RING_CAP] = *ev;
    c->r_count++;
}

/* Moves completed work from the in-flight queue into the ready ring, in order.
 * block: wait for everything (rebuild and destroy only). */
static void harvest(cuda_ctx *c, int block)
{
    /* SLOT_FREE in submission order */
    for (int k = 0; k < c->q_count && c->r_count < RING_CAP; k++) {
        entry *e = &c->q[(c->q_head + k) % CUDA_NBUF];
        if (e->slot_freed)
            continue;
        if (!e->no_events) {
            cudaError_t r = block ? cudaEventSynchronize(c->buf[e->b].h2d) : cudaEventQuery(c->buf[e->b].h2d);
            if (r == cudaErrorNotReady)
                break;
            if (r != cudaSuccess)
                make_sticky(c, "cudaEventQuery(h2d)", r);
        }
        sf_event ev;
        memset(&ev, 0, sizeof ev);
        ev.kind = SF_EV_SLOT_FREE;
        ev.id = e->id;
        ev.token = e->token;
        ev.status = e->status;
        if (e->status)
            sf_scopy(ev.err, sizeof ev.err, e->err);
        push_ready(c, &ev);
        e->slot_freed = 1;
    }
    /* STEP_DONE in submission order */
    while (c->q_count > 0 && c->r_count < RING_CAP) {
        entry *e = &c->q[c->q_head];
        if (!e->slot_freed)
            break;
        cbuf *B = &c->buf[e->b];
        if (!e->no_events) {
            cudaError_t r = block ? cudaEventSynchronize(B->done) : cudaEventQuery(B->done);
            if (r == cudaErrorNotReady && !c->sticky)
                break;
            if (r != cudaSuccess && r != cudaErrorNotReady)
                make_sticky(c, "cudaEventQuery(done)", r);
        }
        sf_event ev;
        memset(&ev, 0, sizeof ev);
        ev.kind = SF_EV_STEP_DONE;
        ev.id = e->id;
        ev.token = e->token;
        ev.n = e->n;
        if (!e->no_events && c->sticky && e->status == 0) {
            e->status = -1;
            sf_scopy(e->err, sizeof e->err, c->sticky_msg);
        }
        /* The device ran this step's gradient check: its skip is counted
         * there (sf_cuda_grad_state), so it is counted here too, even when
         * the batch is reported failed below. */
        const int ran = e->status == 0 && !e->no_events && c->net;
        const sf_grad_state *gs = ran ? sf_net_grad_state(c->net, e->b) : NULL;
        const int dev_skip = ran && e->opt && gs && gs->skip;
        if (dev_skip) {
            if (c->opt_submitted > 0)
                c->opt_submitted--;
            c->skips_counted++;
        }
        if (e->status == 0 && B->h_res->bad > 0) {
            e->status = -1;
            snprintf(e->err, sizeof e->err, "cuda: %d labels outside [0,%d)", B->h_res->bad, c->m.n_classes);
        }
        ev.status = e->status;
        ev.eval = e->eval;
        if (e->status == 0) {
            ev.loss = B->h_res->loss;
            ev.correct = B->h_res->correct;
            ev.correct5 = B->h_res->correct5;
            ev.n_labels = (int64_t)e->n * (int64_t)c->lps;
            if (dev_skip) {
                /* Nothing changed and the step does not count: AdamW's
                 * step number of later batches follows (a batch already
                 * queued behind this one takes the number below its own on
                 * the device: sf_adamw_hyper). */
                ev.skipped = gs->skip == SF_GRAD_SKIP_EMPTY ? SF_SKIP_EMPTY : SF_SKIP_NONFINITE;
            } else if (e->opt) {
                ev.grad_norm = gs ? gs->norm : 0.f;
                c->steps++;
            }
            /* the engine reads it after each round (the reference backend
             * times its all-reduce in place; here it is known once the step
             * is done, so the figure is that of the last step harvested) */
            if (c->cfg.dist && !e->eval)
                ((sf_dist *)c->cfg.dist)->allreduce_s = sf_net_allreduce_s(c->net, e->b);
            if (e->logits_out && e->n_all > e->n) {
                /* A sample left out has a row of NaN: no logits were computed for it. */
                const size_t row = (size_t)c->m.n_classes * c->lps;
                for (int i = 0, k = 0; i < e->n_all; i++) {
                    float *dst = e->logits_out + (size_t)i * row;
                    if (B->left_out[i]) {
                        for (size_t q = 0; q < row; q++)
                            dst[q] = NAN;
                    } else {
                        memcpy(dst, B->h_logits + (size_t)k++ * row, sizeof(float) * row);
                    }
                }
            } else if (e->logits_out) {
                memcpy(e->logits_out, B->h_logits,
                       sizeof(float) * (size_t)e->n * c->m.n_classes * c->lps);
            }
        } else {
            sf_scopy(ev.err, sizeof ev.err, e->err);
        }
        ev.step = c->steps;
        sf_scopy(ev.decoder, sizeof ev.decoder, e->decoder);
        ev.decode_host_s = e->decode_host_s;
        ev.decoded_on_host = e->decoded_on_host;
        if (!e->no_events) {
            ev.h2d_s = ev_seconds(B->h2d0, B->h2d);
            ev.transform_s = ev_seconds(B->h2d, B->ready);
            ev.step_s = ev_seconds(B->step0, B->done);
            ev.t_h2d_start_ns = ev_host_ns(c, B->h2d0);
            ev.t_transform_start_ns = ev_host_ns(c, B->h2d);
            ev.t_step_start_ns = ev_host_ns(c, B->step0);
            ev.t_step_end_ns = ev_host_ns(c, B->done);
        } else {
            ev.t_h2d_start_ns = ev.t_transform_start_ns = ev.t_step_start_ns = ev.t_step_end_ns = e->t_submit_ns;
        }
        push_ready(c, &ev);
        c->q_head = (c->q_head + 1) % CUDA_NBUF;
        c->q_count--;
    }
}

static int alloc_buffers(cuda_ctx *c)
{
    const size_t nb = (size_t)c->cfg.max_batch;
    const size_t in = (size_t)c->m.in_c * c->m.in_h * c->m.in_w;
    const size_t lab_bytes = ((c->lps > 1 ? 1 : nb) * 8 + 255) & ~(size_t)255;
    c->samples_off = STAGE_LABELS_OFF + lab_bytes;
    c->buf_bytes = 0;
    c->stage_bytes = c->samples_off + nb * sizeof(sf_aug_sample);
    for (int b = 0; b < c->nbuf; b++) {
        cbuf *B = &c->buf[b];
        SF_CUDA_CHECK(cudaHostAlloc((void **)&B->h_stage, c->stage_bytes, cudaHostAllocPortable));
        SF_CUDA_CHECK(cudaHostAlloc((void **)&B->h_res, sizeof(sf_xent_out), cudaHostAllocPortable));
        memset(B->h_res, 0, sizeof(sf_xent_out));
        SF_CUDA_CHECK(cudaMalloc((void **)&B->d_stage, c->stage_bytes));
        B->raw_cap = nb * in; /* grows when larger sources arrive */
        SF_CUDA_CHECK(cudaMalloc((void **)&B->d_raw, B->raw_cap));
        const size_t x_es = c->cfg.precision == SF_PREC_BF16 ? sizeof(uint16_t) : sizeof(float);
        SF_CUDA_CHECK(cudaMalloc((void **)&B->d_x, x_es * nb * in));
        SF_CUDA_CHECK(cudaMalloc((void **)&B->d_lab, sizeof(int32_t) * nb * c->lps));
        if (c->lps > 1)
            SF_CUDA_CHECK(cudaMalloc((void **)&B->d_labraw, sizeof(int64_t) * nb * c->lps));
        SF_CUDA_CHECK(cudaMalloc((void **)&B->d_res, sizeof(sf_xent_out)));
        SF_CUDA_CHECK(cudaEventCreate(&B->h2d0));
        SF_CUDA_CHECK(cudaEventCreate(&B->h2d));
        SF_CUDA_CHECK(cudaEventCreate(&B->ready));
        SF_CUDA_CHECK(cudaEventCreate(&B->step0));
        SF_CUDA_CHECK(cudaEventCreate(&B->done));
        c->buf_bytes += c->stage_bytes + B->raw_cap + x_es * nb * in + sizeof(int32_t) * nb * c->lps +
                        (c->lps > 1 ? sizeof(int64_t) * nb * c->lps : 0) + sizeof(sf_xent_out);
    }
    return 0;
}

/* ---- vtable --------------------------------------------------------------- */

static const char *cu_name(sf_backend *be) { return "cuda"; }

static void *cu_host_alloc(sf_backend *be, size_t bytes)
{
    cuda_ctx *c = ctx_of(be);
    cudaSetDevice(c->device);
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 64, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_host_free(sf_backend *be, void *p)
{
    if (p)
        cudaFreeHost(p);
}

/* The model has a transposed convolution (picks the tf32 layout). */
static int has_convt(const sf_model *m)
{
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].kind == SF_L_CONV_TRANSPOSE2D)
            return 1;
    return 0;
}


/* What the CUDA backend refuses in a build request, before anything is
 * allocated: 0, or -1 with err. */
static int build_refused(const cuda_ctx *c, const sf_model *m, const sf_train_cfg *cfg, char *err, size_t errlen)
{
    if (!m || !cfg) {
        sf_errf(err, errlen, "cuda build: model or config missing");
        return -1;
    }
    if (cfg->max_batch < 1) {
        sf_errf(err, errlen, "cuda build: max_batch %d must be >= 1", cfg->max_batch);
        return -1;
    }
    if (cfg->device != c->device) {
        sf_errf(err, errlen, "cuda build: config names device %d but this backend owns device %d", cfg->device,
                c->device);
        return -1;
    }
    if (cfg->grad_accum_steps < 0 || (cfg->optim != SF_OPT_SGD && cfg->optim != SF_OPT_ADAMW)) {
        sf_errf(err, errlen, "cuda build: grad_accum_steps %d or optimizer %d invalid", cfg->grad_accum_steps,
                (int)cfg->optim);
        return -1;
    }
    /* A kind (or a field value) without a CUDA implementation is refused
     * here, naming the layer. */
    for (int i = 0; i < m->n_layers; i++)
        if (sf_layer_cuda_check(m, i, err, errlen) != 0)
            return -1;
    return 0;
}

/* The activation layout of model m at cfg's precision, pipeline.layout
 * overriding. Measured on the W1 step (H100, batch 32, graphs): TF32 tensor
 * cores run best on NHWC (2.19 ms vs 4.05 ms NCHW); strict fp32 runs best on
 * NCHW (5.29 ms vs 6.64 ms NHWC); bf16 tensor cores want NHWC too (H200,
 * ResNet-18 batch 1024: bf16 NHWC 21.2k samples/s; tf32 NHWC 9.1k vs NCHW
 * 3.6k). Transposed convolutions (seed-encdec, tf32, batch 8) run faster
 * NCHW: 0.82 ms vs 0.97 ms per step; in bf16 NHWC wins there too (0.55 ms). */
static sf_layout build_layout(const sf_model *m, const sf_train_cfg *cfg)
{
    if (cfg->layout == SF_ACT_LAYOUT_NCHW)
        return SF_LAYOUT_NCHW;
    if (cfg->layout == SF_ACT_LAYOUT_NHWC)
        return SF_LAYOUT_NHWC;
    return cfg->precision != SF_PREC_FP32 && !(cfg->precision == SF_PREC_TF32 && has_convt(m)) ? SF_LAYOUT_NHWC
                                                                                                : SF_LAYOUT_NCHW;
}

/* The executor's view of the batch buffers: one sf_net_io per buffer. */
static void build_net_io(const cuda_ctx *c, sf_net_io io[SF_NET_MAX_BUF])
{
    memset(io, 0, sizeof(sf_net_io) * SF_NET_MAX_BUF);
    for (int b = 0; b < c->nbuf; b++) {
        io[b].x = c->buf[b].d_x;
        io[b].labels = c->buf[b].d_lab;
        io[b].hyper = (const sf_sgd_hyper *)c->buf[b].d_stage;
        io[b].result = c->buf[b].d_res;
        io[b].h_result = c->buf[b].h_res;
        io[b].adamw = (const sf_adamw_hyper *)(c->buf[b].d_stage + STAGE_ADAMW_OFF);
        io[b].ctl = (const sf_step_ctl *)(c->buf[b].d_stage + STAGE_CTL_OFF);
    }
}

/* The executor's configuration from the training configuration. */
static void build_net_cfg(const cuda_ctx *c, const sf_train_cfg *cfg, sf_net_cfg *nc)
{
    memset(nc, 0, sizeof *nc);
    nc->layout = c->layout;
    nc->tf32 = cfg->precision == SF_PREC_TF32;
    nc->max_batch = cfg->max_batch;
    nc->nbuf = c->nbuf;
    nc->tune = cfg->tune_configs > 0 ? cfg->tune_configs : 8;
    sf_exec_switches_apply(cfg->sw, nc);
    nc->seed = cfg->seed;
    /* Each rank of a data-parallel job draws its own dropout masks (its
     * samples are others than the other ranks' at the same batch index). */
    nc->drop_seed = cfg->seed ^ (cfg->dist ? (uint64_t)cfg->dist->rank << 48 : 0);
    nc->adamw = cfg->optim == SF_OPT_ADAMW;
    nc->accum = c->accum_k;
    nc->dt = cfg->precision == SF_PREC_BF16 ? SF_DT_BF16 : SF_DT_F32;
}

static int cu_build(sf_backend *be, const sf_model *m, const sf_train_cfg *cfg, char *err, size_t errlen)
{
    cuda_ctx *c = ctx_of(be);
    cudaSetDevice(c->device);
    if (c->sticky) {
        sf_errf(err, errlen, "%s", c->sticky_msg);
        return -1;
    }
    /* Work in flight finishes first; its events stay queued for the engine. */
    if (c->q_count > 0) {
        cudaStreamSynchronize(c->st_compute);
        cudaStreamSynchronize(c->st_transform);
        harvest(c, 1);
    }
    free_buffers(c);
    if (build_refused(c, m, cfg, err, errlen))
        return -1;
    c->m = *m;
    char e2[200];
    if (sf_model_resolve(&c->m, e2, sizeof e2) != 0) {
        sf_errf(err, errlen, "cuda build: %s", e2);
        return -1;
    }
    c->cfg = *cfg;
    c->cfg.sw = NULL; /* the caller's, read by this build only */
    c->lps = c->m.segmentation ? (size_t)c->m.out_h * c->m.out_w : 1;
    c->accum_k = cfg->grad_accum_steps > 1 ? cfg->grad_accum_steps : 1;
    c->accum_count = 0;
    c->opt_submitted = 0;
    c->skips_counted = 0;
    c->nbuf = CUDA_NBUF;
    c->next_buf = 0;
    c->st_transform = cfg->overlap ? c->st_transform_own : c->st_compute;
    c->st_decode = cfg->overlap ? c->st_decode_own : c->st_compute;
    c->layout = build_layout(&c->m, cfg);

    sf_cuda_clear_error();
    if (alloc_buffers(c)) {
        sf_errf(err, errlen, "cuda build: %s", sf_cuda_last_error());
        free_buffers(c);
        return -1;
    }
    sf_net_io io[SF_NET_MAX_BUF];
    build_net_io(c, io);
    sf_net_cfg nc;
    build_net_cfg(c, cfg, &nc);
    /* A job of one rank (a benchmark, a test) runs the same NCCL path: what
     * it costs is what a larger job pays beside the transfers. */
    if (cfg->dist) {
        if (sf_nccl_open(&c->nccl, err, errlen) != 0) {
            free_buffers(c);
            return -1;
        }
        nc.grad_reduce = grad_reduce;
        nc.grad_reduce_ctx = c;
        nc.grad_bucket_bytes = cfg->dist->bucket_bytes;
        if (cfg->dist->bn_broadcast)
            nc.buf_broadcast = buf_broadcast;
        if (cfg->dist->bn_sync)
            nc.stat_reduce = stat_reduce;
    }
    const sf_cublas_ctx blas = {c->blas, c->blas_ws, CUBLAS_WS_BYTES};
    if (sf_net_create(&c->net, &c->m, &nc, io, c->dnn, &blas, c->st_compute)) {
        sf_errf(err, errlen, "cuda build: %s", sf_cuda_last_error());
        free_buffers(c);
        return -1;
    }
    c->layout = sf_net_layout(c->net); /* a spatial flatten read by other than linear layers forces NCHW */
    if (anchor_init(c)) {
        sf_errf(err, errlen, "cuda build: %s", sf_cuda_last_error());
        free_buffers(c);
        return -1;
    }
    build_jpeg(c, cfg);
    c->steps = 0;
    c->built = 1;
    return 0;
}

static int cu_max_inflight(sf_backend *be) { return CUDA_NBUF; }

int check_batch(cuda_ctx *c, const sf_batch *b, int need_model, char *err, size_t errlen)
{
    if (need_model && !c->built) {
        sf_errf(err, errlen, "cuda: no model built");
        return -1;
    }
    if (b && b->jpeg && c->jpeg_err[0]) {
        sf_errf(err, errlen, "%s", c->jpeg_err);
        return -1;
    }
    return sf_batch_check(b, need_model ? &c->m : NULL, c->cfg.max_batch, "cuda", err, errlen);
}

static size_t label_size(sf_label_dtype d) { return d == SF_LABEL_U8 ? 1 : d == SF_LABEL_I32 ? 4 : 8; }

/* Index of the first label outside [0, classes), or -1. */
long long bad_label(const sf_batch *b, int classes, int64_t *val, size_t lps)
{
    const long long cnt = (long long)b->n * (long long)lps;
    if (lps > 1) {
        /* segmentation: a vectorisable scan first, the position only on failure */
        int any = 0;
        if (b->label_dtype == SF_LABEL_U8) {
            const uint8_t *p = (const uint8_t *)b->labels;
            uint8_t mx = 0;
            for (long long i = 0; i < cnt; i++)
                mx = p[i] > mx ? p[i] : mx;
            any = mx >= classes;
        } else if (b->label_dtype == SF_LABEL_I32) {
            const int32_t *p = (const int32_t *)b->labels;
            uint32_t mx = 0;
            for (long long i = 0; i < cnt; i++)
                mx = (uint32_t)p[i] > mx ? (uint32_t)p[i] : mx;
            any = mx >= (uint32_t)classes;
        } else {
            const int64_t *p = (const int64_t *)b->labels;
            uint64_t mx = 0;
            for (long long i = 0; i < cnt; i++)
                mx = (uint64_t)p[i] > mx ? (uint64_t)p[i] : mx;
            any = mx >= (uint64_t)classes;
        }
        if (!any)
            return -1;
    }
    for (long long i = 0; i < cnt; i++) {
        int64_t v;
        switch (b->label_dtype) {
        case SF_LABEL_U8: v = ((const uint8_t *)b->labels)[i]; break;
        case SF_LABEL_I32: v = ((const int32_t *)b->labels)[i]; break;
        default: v = ((const int64_t *)b->labels)[i]; break;
        }
        if (v < 0 || v >= classes) {
            *val = v;
            return i;
        }
    }
    return -1;
}

/* A failure before the slot's bytes were handed to a copy: the batch is not started. */
#define NOT_STARTED(call)                                                                        \
    do {                                                                                         \
        cudaError_t nse_ = (call);                                                               \
        if (nse_ != cudaSuccess) {                                                               \
            sf_cuda_set_error("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(nse_)); \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

/* The device half of the transform stream's work for buffer b, once its
 * staging area and images are on the device: labels to int32, augmentation,
 * ready[b]. */
/* NVTX ranges around each stage's enqueue, with the batch id as payload, so
 * Nsight Systems shows (and projects onto the GPU rows) the same stages as
 * GET /v1/trace. Without a profiler attached they cost a function call. */
static int enqueue_augment_inner(cuda_ctx *c, const sf_batch *bt, int b);

static void nvtx_push(const char *name, uint64_t id)
{
    nvtxEventAttributes_t a = {};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
    a.payload.ullValue = id;
    nvtxRangePushEx(&a);
}

int enqueue_augment(cuda_ctx *c, const sf_batch *bt, int b)
{
    nvtx_push("streamfeed transform", bt->id);
    int rc = enqueue_augment_inner(c, bt, b);
    nvtxRangePop();
    return rc;
}

static int enqueue_augment_inner(cuda_ctx *c, const sf_batch *bt, int b)
{
    cbuf *B = &c->buf[b];
    cudaStream_t ts = c->st_transform;
    const int n = bt->n;
    if (sf_cuda_labels_i32(c->lps > 1 ? (const void *)B->d_labraw : (const void *)(B->d_stage + STAGE_LABELS_OFF),
                           (int)bt->label_dtype, (int)((size_t)n * c->lps), B->d_lab, ts))
        return -1;
    const sf_aug_sample *d_samples = (const sf_aug_sample *)(B->d_stage + c->samples_off);
    /* An encoded batch was decoded into staging area jpeg_cur. */
    const uint8_t *src = bt->jpeg ? sf_cuda_jpeg_output(c->jpeg, c->jpeg_cur) : B->d_raw;
    /* bf16 nets read bf16 input: the transform writes half the bytes */
    if (sf_net_dtype(c->net) == SF_DT_BF16) {
        if (sf_cuda_augment_bf16(bt->plan, d_samples, n, src, bt->nhwc, (uint16_t *)B->d_x,
                                 c->layout == SF_LAYOUT_NHWC, ts))
            return -1;
    } else if (sf_cuda_augment(bt->plan, d_samples, n, src, bt->nhwc, B->d_x, c->layout == SF_LAYOUT_NHWC, ts)) {
        return -1;
    }
    /* The staging area is read: the decode two batches on may overwrite it. */
    if (bt->jpeg)
        SF_CUDA_CHECK(cudaEventRecord(c->jpeg_read[c->jpeg_cur], ts));
    /* Batch-level mixing reads other samples' output: after the whole batch. */
    if (bt->mix.kind != SF_MIX_NONE &&
        sf_cuda_aug_mix(bt->plan, &bt->mix, n, B->d_x, sf_net_dtype(c->net) == SF_DT_BF16,
                        c->layout == SF_LAYOUT_NHWC, ts))
        return -1;
    /* The frozen encoder (DESIGN.md §1): its output is what the step reads. */
    if (sf_net_frozen_fwd(c->net, b, n, ts))
        return -1;
    SF_CUDA_CHECK(cudaEventRecord(B->ready, ts));
    return 0;
}

/* Accumulation: whether the next batch steps the optimizer, and AdamW's t. */
void plan_opt(cuda_ctx *c, int b, int eval)
{
    cbuf *B = &c->buf[b];
    B->eval = eval;
    if (eval) { /* no optimizer, not part of an accumulation group */
        B->do_opt = 0;
        B->opt_t = (int64_t)c->opt_submitted + 1;
        return;
    }
    c->accum_count++;
    B->do_opt = c->accum_count >= c->accum_k;
    if (B->do_opt) {
        c->accum_count = 0;
        c->opt_submitted++;
    }
    B->opt_t = (int64_t)c->opt_submitted + (B->do_opt ? 0 : 1);
}

/* The nvJPEG backend jpeg.decoder asks for (SF_CUDA_JPEG_AUTO: the rule). */
static sf_cuda_jpeg_backend jpeg_want(const cuda_ctx *c)
{
    switch (c->cfg.jpeg_decoder) {
    case SF_JPEG_DECODER_HARDWARE: return SF_CUDA_JPEG_HARDWARE;
    case SF_JPEG_DECODER_GPU_HYBRID: return SF_CUDA_JPEG_GPU_HYBRID;
    case SF_JPEG_DECODER_HYBRID: return SF_CUDA_JPEG_HYBRID;
    default: return SF_CUDA_JPEG_AUTO;
    }
}

/* An encoded batch is decoded first, on the decode stream, into the
 * staging area the augmentation two encoded batches back read (jpeg_read):
 * the decode of this batch runs beside the augmentation of the previous one
 * instead of after it. It does not wait for buffer b's previous step
 * (done[b]): it writes only its staging area; the transform stream waits for
 * it (enqueue_transform). A file the decoder refuses either fails the
 * submission before anything is queued for buffer b (SF_BACKEND_BAD_INPUT),
 * as on the reference backend: in a data-parallel round the engine then
 * joins the step with an empty contribution; or, with skipping, is left out:
 * *out is then the batch of the samples kept, in order (their parameters in
 * c->kept_samples, their labels in c->kept_labels or, per pixel, buffer b's
 * pinned h_kept_labels), and buffer b's left_out says which went. The host
 * time of the call is reported per batch (STEP_DONE's decode_host_s): the
 * hybrid backends decode Huffman on this thread, and a call that blocks here
 * delays the next submission. 0, SF_BACKEND_BAD_INPUT or -1
 * (sf_cuda_last_error). */
static int decode_encoded(cuda_ctx *c, const sf_batch *bt, int b, sf_batch *out)
{
    *out = *bt;
    if (!bt->jpeg)
        return 0;
    const int k = c->jpeg_next;
    const cudaStream_t ds = c->st_decode;
    const uint64_t t0 = now_ns();
    cudaError_t ce = cudaStreamWaitEvent(ds, c->jpeg_read[k], 0);
    int rc = ce != cudaSuccess;
    /* jpeg_read[k] also goes to the decoder: the hardware engines write
     * the area during the call, outside the stream's order, so there the
     * host waits for it (with one area, the augmentation queued just
     * before; without that wait the engines overwrote pixels it had not
     * read yet). */
    if (!rc)
        rc = sf_cuda_jpeg_decode(c->jpeg, bt, jpeg_want(c), k, c->jpeg_read[k], ds);
    c->jpeg_host_s = (double)(now_ns() - t0) * 1e-9;
    if (!rc) {
        ce = cudaEventRecord(c->jpeg_decoded[k], ds);
        rc = ce != cudaSuccess;
    }
    if (rc) {
        if (ce != cudaSuccess)
            sf_cuda_set_error("cuda: the JPEG decode's stream ordering: %s", cudaGetErrorString(ce));
        return rc == SF_BACKEND_BAD_INPUT ? SF_BACKEND_BAD_INPUT : -1;
    }
    c->jpeg_cur = k;
    c->jpeg_next = (k + 1) % c->jpeg_stages;
    int kept = bt->n;
    for (int i = 0; bt->undecodable && i < bt->n; i++)
        kept -= bt->undecodable[i] != 0;
    if (kept == bt->n)
        return 0;
    cbuf *B = &c->buf[b];
    const size_t lsz = label_size(bt->label_dtype) * c->lps;
    if (!B->left_out && !(B->left_out = (uint8_t *)malloc((size_t)c->cfg.max_batch))) {
        sf_cuda_set_error("cuda: out of memory for the samples left out");
        return -1;
    }
    if (c->lps > 1 && !B->h_kept_labels &&
        cudaHostAlloc((void **)&B->h_kept_labels, (size_t)c->cfg.max_batch * c->lps * 8, 0) != cudaSuccess) {
        cudaGetLastError();
        B->h_kept_labels = NULL;
        sf_cuda_set_error("cuda: no pinned memory for the labels of the samples kept");
        return -1;
    }
    /* Buffer b's previous batch was harvested: its per-pixel labels' copy
     * out of h_kept_labels has completed. */
    uint8_t *lab = c->lps > 1 ? B->h_kept_labels : c->kept_labels;
    memcpy(B->left_out, bt->undecodable, (size_t)bt->n);
    for (int i = 0, q = 0; i < bt->n; i++) {
        if (bt->undecodable[i])
            continue;
        c->kept_samples[q] = bt->samples[i];
        memcpy(lab + (size_t)q * lsz, (const uint8_t *)bt->labels + (size_t)i * lsz, lsz);
        q++;
    }
    out->n = kept;
    out->samples = c->kept_samples;
    out->labels = lab;
    return 0;
}

/* Queues the transform-stream half of a batch (an encoded one decoded by
 * decode_encoded). Returns 0; 1 when it failed before any copy was queued;
 * -1 when it failed after. */
int enqueue_transform(cuda_ctx *c, const sf_batch *bt, int b)
{
    cbuf *B = &c->buf[b];
    cudaStream_t ts = c->st_transform;
    const int n = bt->n;
    /* A JPEG batch needs no raw buffer: it is decoded into the JPEG staging area. */
    const size_t img_bytes = bt->jpeg ? 0 : (size_t)n * bt->h * bt->w * bt->c;
    if (img_bytes > B->raw_cap) {
        /* A larger source shape than seen so far: grow (outside the steady
         * state; buffer b is idle, its last batch was harvested). */
        NOT_STARTED(cudaStreamSynchronize(ts));
        cudaFree(B->d_raw);
        B->d_raw = NULL;
        B->raw_cap = 0;
        if (cudaMalloc((void **)&B->d_raw, img_bytes) != cudaSuccess) {
            sf_cuda_set_error("cuda: cudaMalloc of %zu bytes for source images failed", img_bytes);
            cudaGetLastError();
            return 1;
        }
        B->raw_cap = img_bytes;
    }
    /* Host staging: buffer b's previous batch was harvested, so its copies
     * out of this area have completed. */
    sf_sgd_hyper hyp = {bt->hyper.lr, bt->hyper.momentum, bt->hyper.weight_decay, 0.f};
    if (hyp.momentum != 0.f && sf_net_use_momentum(c->net))
        return 1;
    memcpy(B->h_stage, &hyp, sizeof hyp);
    sf_step_ctl ctl;
    memset(&ctl, 0, sizeof ctl);
    ctl.loss.label_smoothing = bt->label_smoothing;
    ctl.loss.mix_lam = bt->eval ? 1.f : bt->mix_lam;
    ctl.loss.grad_scale = bt->global_n > 0 ? (float)bt->n / (float)bt->global_n : 1.0f;
    ctl.clip_grad_norm = bt->hyper.clip_grad_norm;
    ctl.count[0] = (float)n;
    ctl.count[1] = bt->global_n > 0 ? (float)bt->global_n : (float)n;
    ctl.seq = bt->seq;
    memcpy(B->h_stage + STAGE_CTL_OFF, &ctl, sizeof ctl);
    sf_adamw_hyper ah;
    sf_adamw_hyper_at(&ah, bt->hyper.lr, bt->hyper.beta1, bt->hyper.beta2, bt->hyper.eps, bt->hyper.weight_decay,
                      B->opt_t > 0 ? B->opt_t : 1, c->skips_counted);
    memcpy(B->h_stage + STAGE_ADAMW_OFF, &ah, sizeof ah);
    if (c->lps == 1)
        memcpy(B->h_stage + STAGE_LABELS_OFF, bt->labels, (size_t)n * label_size(bt->label_dtype));
    memcpy(B->h_stage + c->samples_off, bt->samples, (size_t)n * sizeof(sf_aug_sample));
    const size_t stage_used = c->samples_off + (size_t)n * sizeof(sf_aug_sample);

    /* Buffer b's inputs (staging, images, augmented batch, labels) are read by
     * its previous step on the compute stream: wait for that step to finish
     * before overwriting them. */
    NOT_STARTED(cudaStreamWaitEvent(ts, B->done, 0));
    NOT_STARTED(cudaEventRecord(B->h2d0, ts));
    NOT_STARTED(cudaMemcpyAsync(B->d_stage, B->h_stage, stage_used, cudaMemcpyHostToDevice, ts));
    nvtx_push("streamfeed h2d", bt->id);
    cudaError_t ce = cudaSuccess;
    if (!bt->jpeg)
        ce = cudaMemcpyAsync(B->d_raw, bt->images, img_bytes, cudaMemcpyHostToDevice, ts);
    else
        ce = cudaStreamWaitEvent(ts, c->jpeg_decoded[c->jpeg_cur], 0);
    if (ce == cudaSuccess && c->lps > 1)
        ce = cudaMemcpyAsync(B->d_labraw, bt->labels, (size_t)n * c->lps * label_size(bt->label_dtype),
                             cudaMemcpyHostToDevice, ts);
    if (ce == cudaSuccess)
        ce = cudaEventRecord(B->h2d, ts);
    nvtxRangePop();
    SF_CUDA_CHECK(ce);
    return enqueue_augment(c, bt, b);
}

int enqueue_step(cuda_ctx *c, int b, int n, int want_logits)
{
    cbuf *B = &c->buf[b];
    cudaStream_t cs = c->st_compute;
    /* The step reads the augmented batch, labels and hyper-parameters that the
     * transform stream wrote for buffer b. */
    SF_CUDA_CHECK(cudaStreamWaitEvent(cs, B->ready, 0));
    SF_CUDA_CHECK(cudaEventRecord(B->step0, cs));
    nvtx_push("streamfeed step", (uint64_t)b);
    int rs = B->eval ? sf_net_eval(c->net, b, n, c->cfg.cuda_graphs)
                     : sf_net_step(c->net, b, n, c->cfg.cuda_graphs, B->do_opt);
    nvtxRangePop();
    if (rs || (want_logits && sf_net_copy_logits(c->net, b, n, B->h_logits)))
        return -1;
    SF_CUDA_CHECK(cudaEventRecord(B->done, cs));
    return 0;
}

static int cu_submit(sf_backend *be, const sf_batch *bt_in, char *err, size_t errlen)
{
    cuda_ctx *c = ctx_of(be);
    cudaSetDevice(c->device);
    if (c->sticky) {
        sf_errf(err, errlen, "%s", c->sticky_msg);
        return -1;
    }
    /* The first data-parallel round: every rank has joined the job (the
     * engine's rounds start after the join), so NCCL's init can complete. */
    if (ensure_nccl(c, err, errlen))
        return -1;
    if (bt_in->n == 0 && bt_in->global_n > 0 && sf_nccl_joined(c->nccl))
        return submit_empty(c, bt_in, err, errlen);
    if (check_batch(c, bt_in, 1, err, errlen) != 0)
        return -1;
    if (c->q_count >= c->nbuf) {
        sf_errf(err, errlen, "cuda: %d batches in flight (max_inflight %d); poll first", c->q_count, c->nbuf);
        return -1;
    }
    if (bt_in->jpeg) {
        const int mrc = make_jpeg(c, err, errlen);
        if (mrc != 0)
            return mrc;
    }
    sf_cuda_clear_error();
    const int b = c->next_buf;
    /* An encoded batch is decoded first: a file the decoder refuses fails
     * the submission before anything is queued, or is left out (bt is then
     * the batch of the samples kept). */
    sf_batch kept;
    const int drc = decode_encoded(c, bt_in, b, &kept);
    if (drc != 0) {
        sf_errf(err, errlen, "cuda: %s", sf_cuda_last_error());
        cudaGetLastError();
        return drc;
    }
    const sf_batch *bt = &kept;
    /* A batch size seen for the first time gets its plans (once, synchronous). */
    if (sf_net_prepare(c->net, bt->n)) {
        sf_errf(err, errlen, "cuda: %s", sf_cuda_last_error());
        return -1;
    }
    entry *e = &c->q[(c->q_head + c->q_count) % CUDA_NBUF];
    memset(e, 0, sizeof *e);
    e->id = bt->id;
    e->token = bt->token;
    e->n = bt->n;
    e->n_all = bt_in->n;
    e->b = b;
    e->t_submit_ns = now_ns();
    if (bt->jpeg) {
        const sf_cuda_jpeg_backend ran = sf_cuda_jpeg_last(c->jpeg);
        e->decoded_on_host = sf_cuda_jpeg_host_decoded(c->jpeg);
        sf_scopy(e->decoder, sizeof e->decoder,
              ran == SF_CUDA_JPEG_AUTO ? "libjpeg-turbo" : sf_cuda_jpeg_backend_name(ran));
        e->decode_host_s = c->jpeg_host_s;
    }

    int64_t bad_val = 0;
    const long long bad_at = bad_label(bt, c->m.n_classes, &bad_val, c->lps);
    if (bad_at >= 0) {
        /* Rejected like the reference backend: nothing runs, the slot is free at once. */
        e->status = -1;
        e->no_events = 1;
        snprintf(e->err, sizeof e->err, "cuda: label %lld of sample %lld is outside [0,%d)", (long long)bad_val,
                 (long long)(bad_at / (long long)c->lps), c->m.n_classes);
        c->q_count++;
        return 0;
    }

    const int saved_count = c->accum_count;
    const uint64_t saved_sub = c->opt_submitted;
    plan_opt(c, b, bt->eval);
    e->opt = c->buf[b].do_opt;
    e->eval = bt->eval;
    e->logits_out = bt->logits_out;
    if (bt->logits_out && !c->buf[b].h_logits &&
        cudaHostAlloc((void **)&c->buf[b].h_logits,
                      sizeof(float) * (size_t)c->cfg.max_batch * c->m.n_classes * c->lps, 0) != cudaSuccess) {
        cudaGetLastError();
        c->buf[b].h_logits = NULL;
        c->accum_count = saved_count;
        c->opt_submitted = saved_sub;
        sf_errf(err, errlen, "cuda: no pinned memory for the logits of %d samples", c->cfg.max_batch);
        return -1;
    }
    int rt = enqueue_transform(c, bt, b);
    if (rt != 0) {
        /* Nothing of the step was queued: the batch is no optimizer step and
         * no round of an accumulation group. (In a data-parallel round the
         * engine then adds an empty contribution, which counts the step.) */
        c->accum_count = saved_count;
        c->opt_submitted = saved_sub;
    }
    if (rt == 1) {
        sf_errf(err, errlen, "cuda: %s", sf_cuda_last_error());
        cudaGetLastError();
        return -1;
    }
    int rs = rt == 0 ? enqueue_step(c, b, bt->n, bt->logits_out != NULL) : -1;
    c->next_buf = (b + 1) % c->nbuf;
    c->q_count++;
    if (rs != 0) {
        /* Error path only: wait for what was queued, so the slot and buffer
         * are known to be idle, then report the batch failed. */
        e->status = -1;
        e->no_events = 1;
        sf_scopy(e->err, sizeof e->err, sf_cuda_last_error());
        cudaError_t e0 = cudaStreamSynchronize(c->st_decode);
        cudaError_t e1 = cudaStreamSynchronize(c->st_transform);
        cudaError_t e2 = cudaStreamSynchronize(c->st_compute);
        if (e0 != cudaSuccess)
            make_sticky(c, "cudaStreamSynchronize(decode)", e0);
        else if (e1 != cudaSuccess)
            make_sticky(c, "cudaStreamSynchronize(transform)", e1);
        else if (e2 != cudaSuccess)
            make_sticky(c, "cudaStreamSynchronize(compute)", e2);
        cudaGetLastError();
    }
    return 0;
}

static int cu_poll(sf_backend *be, sf_event *ev, int max, int timeout_us)
{
    cuda_ctx *c = ctx_of(be);
    cudaSetDevice(c->device);
    if (max <= 0)
        return 0;
    const uint64_t deadline = now_ns() + (uint64_t)(timeout_us > 0 ? timeout_us : 0) * 1000ull;
    for (;;) {
        anchor_tick(c);
        nccl_watchdog(c);
        harvest(c, 0);
        if (c->r_count > 0 || now_ns() >= deadline)
            break;
        /* Nothing ready: sleep briefly between queries. */
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    int k = 0;
    while (k < max && c->r_count > 0) {
        ev[k++] = c->ring[c->r_head];
        c->r_head = (c->r_head + 1) % RING_CAP;
        c->r_count--;
    }
    return k;
}

static int grow(void **p, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return 0;
    if (*p)
        cudaFree(*p);
    *p = NULL;
    *cap = 0;
    SF_CUDA_CHECK(cudaMalloc(p, bytes));
    *cap = bytes;
    return 0;
}

static int cu_transform(sf_backend *be, const sf_batch *b, float *out, char *err, size_t errlen)
{
    cuda_ctx *c = ctx_of(be);
    cudaSetDevice(c->device);
    if (c->sticky) {
        sf_errf(err, errlen, "%s", c->sticky_msg);
        return -1;
    }
    if (check_batch(c, b, 0, err, errlen) != 0)
        return -1;
    if (b->jpeg) {
        if (!c->built) {
            sf_errf(err, errlen, "cuda: no model built, whose config sizes the JPEG decoder");
            return -1;
        }
        const int mrc = make_jpeg(c, err, errlen);
        if (mrc != 0)
            return mrc;
    }
    if (!out) {
        sf_errf(err, errlen, "cuda: output buffer missing");
        return -1;
    }
    const sf_aug_plan *p = b->plan;
    const size_t n = (size_t)b->n;
    const size_t src = n * b->h * b->w * b->c;
    const size_t dst = n * p->c * p->out_h * p->out_w;
    cudaStream_t s = c->st_aux;
    sf_cuda_clear_error();
    size_t out_cap = c->t_out_cap, smp_cap = (size_t)c->t_samples_cap * sizeof(sf_aug_sample);
    int rc = grow((void **)&c->t_raw, &c->t_raw_cap, src);
    if (!rc && dst * sizeof(float) > c->t_out_cap) {
        rc = grow((void **)&c->t_out, &out_cap, dst * sizeof(float));
        c->t_out_cap = rc ? 0 : dst * sizeof(float);
    }
    if (!rc) {
        rc = grow((void **)&c->t_samples, &smp_cap, n * sizeof(sf_aug_sample));
        c->t_samples_cap = rc ? 0 : (int)(smp_cap / sizeof(sf_aug_sample));
    }
    /* An encoded batch: the staging areas are the training path's, so its
     * decodes and the augmentations that read them complete before this
     * decode overwrites area 0; the engine queues no more until this call
     * returns. */
    int bad_input = 0; /* nvJPEG refused a file: the client's error */
    const sf_aug_sample *smp = b->samples;
    int kept = b->n;
    if (!rc && b->jpeg) {
        rc = cudaStreamSynchronize(c->st_decode) != cudaSuccess ||
             cudaStreamSynchronize(c->st_transform) != cudaSuccess;
        if (!rc) {
            const int drc = sf_cuda_jpeg_decode(c->jpeg, b, jpeg_want(c), 0, NULL, s);
            bad_input = drc == SF_BACKEND_BAD_INPUT;
            rc = drc != 0;
        }
        /* Samples left out: the kept ones are augmented, in order. */
        for (int i = 0; !rc && b->undecodable && i < b->n; i++)
            if (b->undecodable[i])
                kept--;
        if (!rc && kept < b->n) {
            for (int i = 0, q = 0; i < b->n; i++)
                if (!b->undecodable[i])
                    c->kept_samples[q++] = b->samples[i];
            smp = c->kept_samples;
        }
    } else if (!rc)
        rc = cudaMemcpyAsync(c->t_raw, b->images, src, cudaMemcpyHostToDevice, s) != cudaSuccess;
    if (!rc)
        rc = cudaMemcpyAsync(c->t_samples, smp, (size_t)kept * sizeof(sf_aug_sample), cudaMemcpyHostToDevice, s) !=
             cudaSuccess;
    if (!rc)
        rc = sf_cuda_augment(p, c->t_samples, kept, b->jpeg ? sf_cuda_jpeg_output(c->jpeg, 0) : c->t_raw, b->nhwc,
                             c->t_out, 0, s);
    if (!rc)
        rc = sf_cuda_aug_mix(p, &b->mix, kept, c->t_out, 0, 0, s);
    const size_t row = (size_t)p->c * p->out_h * p->out_w;
    if (!rc)
        rc = cudaMemcpyAsync(out, c->t_out, (size_t)kept * row * sizeof(float), cudaMemcpyDeviceToHost, s) !=
             cudaSuccess;
    cudaError_t se = cudaStreamSynchronize(s);
    if (se != cudaSuccess) {
        make_sticky(c, "transform", se);
        sf_errf(err, errlen, "%s", c->sticky_msg);
        return -1;
    }
    if (rc) {
        const char *m = sf_cuda_last_error();
        sf_errf(err, errlen, "cuda transform: %s", *m ? m : cudaGetErrorString(cudaGetLastError()));
        cudaGetLastError();
        return bad_input ? SF_BACKEND_BAD_INPUT : -1;
    }
    if (kept < b->n) {
        /* The kept samples' rows move to their places, from the last one
         * down (a row only ever moves up the buffer); a row left out is
         * zeros, as on the reference backend. */
        for (int i = b->n - 1, q = kept - 1; i >= 0; i--) {
            if (b->undecodable[i]) {
                memset(out + (size_t)i * row, 0, sizeof(float) * row);
            } else {
                if (q != i)
                    memmove(out + (size_t)i * row, out + (size_t)q * row, sizeof(float) * row);
                q--;
            }
        }
    }
    return 0;
}

static int cu_get_params(sf_backend *be, float *dst)
{
    cuda_ctx *c = usable_ctx(be);
    if (!c)
        return -1;
    return sf_net_get_params(c->net, dst);
}

static int cu_set_params(sf_backend *be, const float *src)
{
    cuda_ctx *c = usable_ctx(be);
    if (!c)
        return -1;
    return sf_net_set_params(c->net, src);
}

static int cu_health(sf_backend *be, char *err, size_t errlen)
{
    cuda_ctx *c = ctx_of(be);
    cudaSetDevice(c->device);
    if (!c->sticky) {
        cudaError_t e = cudaStreamQuery(c->st_compute);
        if (e != cudaSuccess && e != cudaErrorNotReady)
            make_sticky(c, "compute stream", e);
    }
    if (c->sticky) {
        sf_errf(err, errlen, "%s", c->sticky_msg);
        return -1;
    }
    return 0;
}

/* ---- optimizer state ------------------------------------------------------- */

static int cu_get_opt_state(sf_backend *be, float *momentum, uint64_t *step)
{
    cuda_ctx *c = usable_ctx(be);
    if (!c)
        return -1;
    if (momentum && sf_net_get_momentum(c->net, momentum))
        return -1;
    if (step)
        *step = c->steps;
    return 0;
}

static int cu_set_opt_state(sf_backend *be, const float *momentum, uint64_t step)
{
    cuda_ctx *c = usable_ctx(be);
    if (!c)
        return -1;
    if (momentum) {
        if (sf_net_set_momentum(c->net, momentum))
            return -1;
    } else {
        /* No momentum given: the state of a net that never used it. */
        float *z = (float *)calloc(c->m.n_params ? c->m.n_params : 1, sizeof(float));
        if (!z)
            return -1;
        int rc = sf_net_set_momentum(c->net, z);
        free(z);
        if (rc)
            return -1;
    }
    c->steps = step;
    c->opt_submitted = step;
    c->skips_counted = 0;
    c->accum_count = 0; /* a partly accumulated gradient is not state */
    return sf_net_reset_accum(c->net) || sf_net_reset_skips(c->net) ? -1 : 0;
}

static int cu_get_buffers(sf_backend *be, float *dst, uint64_t *nbt)
{
    cuda_ctx *c = usable_ctx(be);
    if (!c)
        return -1;
    return sf_net_get_buffers(c->net, dst, nbt);
}

static int cu_set_buffers(sf_backend *be, const float *src, uint64_t nbt)
{
    cuda_ctx *c = usable_ctx(be);
    if (!c)
        return -1;
    return sf_net_set_buffers(c->net, src, nbt);
}

static int cu_get_opt_sq(sf_backend *be, float *dst)
{
    cuda_ctx *c = usable_ctx(be);
    if (!c)
        return -1;
    return sf_net_get_sq(c->net, dst);
}

static int cu_set_opt_sq(sf_backend *be, const float *src)
{
    cuda_ctx *c = usable_ctx(be);
    if (!c)
        return -1;
    return sf_net_set_sq(c->net, src);
}

/* ---- telemetry ------------------------------------------------------------ */

/* NVML (nvml.c); the bus id was read at construction, so this touches no
 * CUDA state and may run on any thread. */
static int cu_device_stats(sf_backend *be, sf_device_stats *out)
{
    cuda_ctx *c = ctx_of(be);
    return sf_nvml_device_stats(c->pci_bus_id, out);
}

static void cu_destroy(sf_backend *be)
{
    if (!be)
        return;
    cuda_ctx *c = ctx_of(be);
    if (c) {
        cudaSetDevice(c->device);
        if (c->st_compute)
            cudaStreamSynchronize(c->st_compute);
        if (c->st_transform_own)
            cudaStreamSynchronize(c->st_transform_own);
        if (c->st_decode_own)
            cudaStreamSynchronize(c->st_decode_own);
        free_buffers(c);
        if (c->t_raw) cudaFree(c->t_raw);
        if (c->t_out) cudaFree(c->t_out);
        if (c->t_samples) cudaFree(c->t_samples);
        if (c->blas) cublasDestroy(c->blas);
        if (c->blas_ws) cudaFree(c->blas_ws);
        if (c->dnn) cudnnDestroy(c->dnn);
        if (c->anchor) cudaEventDestroy(c->anchor);
        if (c->anchor_next) cudaEventDestroy(c->anchor_next);
        if (c->st_compute) cudaStreamDestroy(c->st_compute);
        if (c->st_transform_own) cudaStreamDestroy(c->st_transform_own);
        if (c->st_decode_own) cudaStreamDestroy(c->st_decode_own);
        for (int k = 0; k < SF_CUDA_JPEG_MAX_STAGES; k++) {
            if (c->jpeg_decoded[k]) cudaEventDestroy(c->jpeg_decoded[k]);
            if (c->jpeg_read[k]) cudaEventDestroy(c->jpeg_read[k]);
        }
        if (c->st_aux) cudaStreamDestroy(c->st_aux);
        pthread_mutex_destroy(&c->jpeg_mu);
        free(c);
    }
    free(be);
}

/* The plan of the built model: the net's description at max_batch, then the
 * device memory the backend holds beside it (batch buffers, staging). */
static int cu_describe(sf_backend *be, char *buf, size_t len, size_t *device_bytes)
{
    cuda_ctx *c = ctx_of(be);
    if (!c->built || len == 0)
        return -1;
    sf_net_describe(c->net, c->cfg.max_batch, buf, len);
    *device_bytes = sf_net_device_bytes(c->net) + c->buf_bytes;
    size_t at = strlen(buf);
    if (at < len) {
        if (c->jpeg) {
            sf_cuda_jpeg_describe(c->jpeg, buf + at, len - at);
            at = strlen(buf);
            if (jpeg_want(c) != SF_CUDA_JPEG_AUTO && at < len)
                snprintf(buf + at, len - at, "jpeg decode: jpeg.decoder forces %s for every batch\n",
                         sf_cuda_jpeg_backend_name(jpeg_want(c)));
            /* The staging area and nvJPEG's device buffers are the backend's too. */
            sf_cuda_jpeg_mem jm;
            sf_cuda_jpeg_memory(c->jpeg, &jm);
            *device_bytes += jm.staging_bytes + jm.device_bytes;
        } else if (c->jpeg_err[0])
            snprintf(buf + at, len - at, "jpeg decode: unavailable (%s)\n", c->jpeg_err);
        else
            snprintf(buf + at, len - at,
                     "jpeg decode: no decoder held; the first encoded batch makes it (%lld encoded batch(es) "
                     "refused so far because it could not be made)\n",
                     c->jpeg_not_made);
        at = strlen(buf);
    }
    if (c->nccl && at < len) {
        sf_nccl_describe(c->nccl, buf + at, len - at);
        at = strlen(buf);
    }
    size_t fr = 0, tot = 0;
    if (at < len && cudaMemGetInfo(&fr, &tot) == cudaSuccess)
        snprintf(buf + at, len - at, "device: %zu B of %zu B in use by all processes\n", tot - fr, tot);
    return 0;
}

static int cu_param_digest(sf_backend *be, uint64_t *digest)
{
    cuda_ctx *c = ctx_of(be);
    cudaSetDevice(c->device);
    if (!c->built || sf_net_param_digest(c->net, digest) != 0)
        return -1;
    return 0;
}

static const sf_backend_i cuda_vtable = {
    cu_name, cu_host_alloc, cu_host_free, cu_build, cu_max_inflight, cu_submit, cu_poll,
    cu_transform, cu_get_params, cu_set_params, cu_health, cu_destroy,
    cu_get_opt_state, cu_set_opt_state, cu_bench, cu_device_stats,
    cu_get_buffers, cu_set_buffers, cu_get_opt_sq, cu_set_opt_sq, cu_describe,
    cu_param_digest,
    NULL, /* precision_in_force: the CUDA backend computes in model.precision as asked */
    cu_decoder_memory,
    cu_dist_join,
    cu_dist_leave,
};

__global__ void k_probe(int *p)
{
    if (p)
        *p = 1;
}

static int init_ctx(cuda_ctx *c, char *err, size_t errlen)
{
    /* The compute stream gets the higher priority: the step is the critical
     * path, augmentation and decoding fill the gaps. (The decode stream at
     * the compute stream's priority did not move the ImageNet-like JPEG rate
     * on the H100: bench/results/2026-11-24-h100-data-parallel-jpeg-lanes-w2.md.)
     * One level below the highest where the device has three or more: a
     * data-parallel step's gradient all-reduce runs above it (executor_grad.cu). */
    int lo = 0, hi = 0;
    cudaDeviceGetStreamPriorityRange(&lo, &hi);
    const int compute_prio = lo - hi >= 2 ? hi + 1 : hi;
    if (cudaStreamCreateWithPriority(&c->st_compute, cudaStreamNonBlocking, compute_prio) != cudaSuccess ||
        cudaStreamCreateWithPriority(&c->st_transform_own, cudaStreamNonBlocking, lo) != cudaSuccess ||
        cudaStreamCreateWithPriority(&c->st_decode_own, cudaStreamNonBlocking, lo) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->st_aux, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreate(&c->anchor) != cudaSuccess || cudaEventCreate(&c->anchor_next) != cudaSuccess) {
        sf_errf(err, errlen, "cuda: stream/event creation failed: %s", cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    c->st_transform = c->st_transform_own;
    c->st_decode = c->st_decode_own;
    for (int k = 0; k < SF_CUDA_JPEG_MAX_STAGES; k++)
        if (cudaEventCreateWithFlags(&c->jpeg_decoded[k], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&c->jpeg_read[k], cudaEventDisableTiming) != cudaSuccess) {
            sf_errf(err, errlen, "cuda: event creation failed: %s", cudaGetErrorString(cudaGetLastError()));
            return -1;
        }
    cudnnStatus_t ds = cudnnCreate(&c->dnn);
    if (ds != CUDNN_STATUS_SUCCESS) {
        sf_errf(err, errlen, "cuda: cudnnCreate: %s", cudnnGetErrorString(ds));
        return -1;
    }
    if (cudnnGetVersion() < 90000) {
        sf_errf(err, errlen, "cuda: cuDNN %zu found, 9.x needed", cudnnGetVersion());
        return -1;
    }
    cudnnSetStream(c->dnn, c->st_compute);
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        sf_errf(err, errlen, "cuda: cublasCreate failed");
        return -1;
    }
    /* An explicit workspace keeps cuBLAS from allocating inside a captured graph. */
    if (cudaMalloc(&c->blas_ws, CUBLAS_WS_BYTES) != cudaSuccess ||
        cublasSetStream(c->blas, c->st_compute) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(c->blas, c->blas_ws, CUBLAS_WS_BYTES) != CUBLAS_STATUS_SUCCESS) {
        sf_errf(err, errlen, "cuda: cuBLAS setup failed");
        return -1;
    }
    return 0;
}

extern "C" sf_backend *sf_backend_cuda_new(int device, char *err, size_t errlen)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        /* Without the driver library at all the runtime says "CUDA driver
         * version is insufficient", which sends the reader to upgrade a
         * driver that is not there. */
        void *driver = e == cudaErrorInsufficientDriver ? dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) : NULL;
        if (e == cudaErrorInsufficientDriver && !driver)
            sf_errf(err, errlen, "cuda: no NVIDIA driver (libcuda.so.1 is not installed)");
        else
            sf_errf(err, errlen, "cuda: %s", e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        if (driver)
            dlclose(driver);
        cudaGetLastError();
        return NULL;
    }
    if (device < 0 || device >= count) {
        sf_errf(err, errlen, "cuda: device %d does not exist (%d found)", device, count);
        return NULL;
    }
    if ((e = cudaSetDevice(device)) != cudaSuccess) {
        sf_errf(err, errlen, "cuda: cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
        return NULL;
    }
    cudaFuncAttributes fa;
    if ((e = cudaFuncGetAttributes(&fa, k_probe)) != cudaSuccess) {
        cudaDeviceProp prop;
        cudaGetDeviceProperties(&prop, device);
        sf_errf(err, errlen, "cuda: device %d (%s, compute capability %d.%d) cannot run this build's kernels "
                "(built for sm_90): %s", device, prop.name, prop.major, prop.minor, cudaGetErrorString(e));
        cudaGetLastError();
        return NULL;
    }
    sf_backend *be = (sf_backend *)calloc(1, sizeof *be);
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        sf_errf(err, errlen, "cuda: out of memory");
        return NULL;
    }
    c->device = device;
    pthread_mutex_init(&c->jpeg_mu, NULL);
    if (cudaDeviceGetPCIBusId(c->pci_bus_id, (int)sizeof c->pci_bus_id, device) != cudaSuccess) {
        cudaGetLastError();
        c->pci_bus_id[0] = '\0'; /* NVML then takes its only device, if it has one */
    }
    be->i = &cuda_vtable;
    be->ctx = c;
    if (init_ctx(c, err, errlen)) {
        cu_destroy(be);
        return NULL;
    }
    return be;
}
