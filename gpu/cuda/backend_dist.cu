/* gpu/cuda/backend_dist.cu — the CUDA backend's data-parallel side: the
 * executor's hooks that all-reduce a gradient bucket or a batchnorm's sums
 * and broadcast rank 0's running statistics through NCCL, the round a rank
 * joins without a batch, the communicator made at its first use and
 * released when the job ends, and the watchdog that turns a peer that
 * stopped answering into a sticky error instead of a hang.
 */
#include "gpu/cuda/backend_ctx.h"

/* The executor's data-parallel hook (sf_net_cfg.grad_reduce): one bucket's
 * pieces summed over the ranks by NCCL, on the stream the executor gives
 * (beside the backward). Each rank's gradient is already its share of the
 * global mean (ctl.loss.grad_scale = n / global_n, staged per batch). */
int grad_reduce(void *ctx, const sf_grad_piece *pieces, int n, cudaStream_t s)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!sf_nccl_joined(c->nccl)) {
        sf_cuda_set_error("%s:%d: the NCCL communicator is not made yet", __FILE__, __LINE__);
        return -1;
    }
    return sf_nccl_allreduce(c->nccl, pieces, n, s);
}

/* The executor's batchnorm hook (sf_net_cfg.buf_broadcast): rank 0's
 * running statistics to every rank, on the stream the executor gives. */
int buf_broadcast(void *ctx, float *p, size_t n, cudaStream_t s)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!sf_nccl_joined(c->nccl)) {
        sf_cuda_set_error("%s:%d: the NCCL communicator is not made yet", __FILE__, __LINE__);
        return -1;
    }
    return sf_nccl_broadcast(c->nccl, p, n, 0, s);
}

/* The executor's SyncBatchNorm hook (sf_net_cfg.stat_reduce): a
 * batchnorm's per-channel sums added over the ranks, on the stream the
 * executor gives (the reduce stream, in its order with the buckets). */
int stat_reduce(void *ctx, double *p, size_t n, cudaStream_t s)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!sf_nccl_joined(c->nccl)) {
        sf_cuda_set_error("%s:%d: the NCCL communicator is not made yet", __FILE__, __LINE__);
        return -1;
    }
    return sf_nccl_allreduce_f64(c->nccl, p, n, s);
}

/* A data-parallel round this rank joins without a batch (n == 0): the hyper-
 * parameters staged, then a zero gradient (a zero share) through the same
 * all-reduce and optimizer (sf_net_step_empty). Events as for any batch. */
int submit_empty(cuda_ctx *c, const sf_batch *bt, char *err, size_t errlen)
{
    if (!c->built || c->q_count >= c->nbuf) {
        sf_errf(err, errlen, "cuda: no model built, or %d batches in flight", c->q_count);
        return -1;
    }
    const int b = c->next_buf;
    cbuf *B = &c->buf[b];
    entry *e = &c->q[(c->q_head + c->q_count) % CUDA_NBUF];
    memset(e, 0, sizeof *e);
    e->id = bt->id;
    e->token = bt->token;
    e->b = b;
    e->t_submit_ns = now_ns();
    plan_opt(c, b, 0);
    e->opt = B->do_opt;
    sf_sgd_hyper hyp = {bt->hyper.lr, bt->hyper.momentum, bt->hyper.weight_decay, 0.f};
    sf_adamw_hyper ah;
    sf_adamw_hyper_at(&ah, bt->hyper.lr, bt->hyper.beta1, bt->hyper.beta2, bt->hyper.eps, bt->hyper.weight_decay,
                      B->opt_t > 0 ? B->opt_t : 1, c->skips_counted);
    cudaStream_t ts = c->st_transform, cs = c->st_compute;
    int rc = -1;
    /* Buffer b's staging is read by its previous step: wait for it first. */
    if ((hyp.momentum == 0.f || sf_net_use_momentum(c->net) == 0) &&
        cudaStreamWaitEvent(ts, B->done, 0) == cudaSuccess) {
        sf_step_ctl ctl;
        memset(&ctl, 0, sizeof ctl);
        ctl.loss.mix_lam = 1.f;
        ctl.clip_grad_norm = bt->hyper.clip_grad_norm; /* the same clipping as the ranks with a batch */
        ctl.count[0] = 0.f;                            /* trains nothing of the samples announced */
        ctl.count[1] = (float)bt->global_n;
        memcpy(B->h_stage, &hyp, sizeof hyp);
        memcpy(B->h_stage + STAGE_CTL_OFF, &ctl, sizeof ctl);
        memcpy(B->h_stage + STAGE_ADAMW_OFF, &ah, sizeof ah);
        if (cudaEventRecord(B->h2d0, ts) == cudaSuccess &&
            cudaMemcpyAsync(B->d_stage, B->h_stage, STAGE_LABELS_OFF, cudaMemcpyHostToDevice, ts) == cudaSuccess &&
            cudaEventRecord(B->h2d, ts) == cudaSuccess && cudaEventRecord(B->ready, ts) == cudaSuccess &&
            cudaStreamWaitEvent(cs, B->ready, 0) == cudaSuccess && cudaEventRecord(B->step0, cs) == cudaSuccess &&
            sf_net_step_empty(c->net, b, B->do_opt) == 0 && cudaEventRecord(B->done, cs) == cudaSuccess)
            rc = 0;
    }
    c->next_buf = (b + 1) % c->nbuf;
    c->q_count++;
    if (rc != 0) {
        e->status = -1;
        e->no_events = 1;
        sf_scopy(e->err, sizeof e->err, sf_cuda_last_error()[0] ? sf_cuda_last_error() : "cuda: empty round failed");
        cudaStreamSynchronize(ts);
        cudaStreamSynchronize(cs);
        cudaGetLastError();
    }
    return 0;
}

/* A data-parallel backend's communicator, made at the job's join
 * (cu_dist_join) or else at its first use; a failure is sticky (the job
 * cannot train without it). */
int ensure_nccl(cuda_ctx *c, char *err, size_t errlen)
{
    /* without a model the batch's own check says so (a failed build leaves
     * no NCCL, which is not this backend's fault to make sticky) */
    if (!c->cfg.dist || !c->built || sf_nccl_joined(c->nccl))
        return 0;
    char nerr[sizeof c->sticky_msg];
    if (!c->nccl)
        snprintf(nerr, sizeof nerr, "cuda: NCCL was not loaded at build");
    if (!c->nccl || sf_nccl_join(c->nccl, c->cfg.dist, nerr, sizeof nerr) != 0) {
        c->sticky = 1;
        sf_scopy(c->sticky_msg, sizeof c->sticky_msg, nerr);
        sf_errf(err, errlen, "%s", nerr);
        return -1;
    }
    return 0;
}

/* sf_backend_i.dist_join: the communicator now rather than at the first
 * step (ensure_nccl, which a backend used without the engine's join still
 * reaches at its first step). */
int cu_dist_join(sf_backend *be, char *err, size_t errlen)
{
    cuda_ctx *c = ctx_of(be);
    cudaSetDevice(c->device);
    return ensure_nccl(c, err, errlen);
}

/* sf_backend_i.dist_leave. Together: the graphs that captured the
 * all-reduces go first (the communicator's destruction waits for their
 * references), then the communicator, finalized with the other ranks. A
 * failed job's communicator is left as it is (sf_nccl_leave): tearing it
 * down, even aborting it, can wait for a peer that is gone (on two H200s a
 * survivor that aborted it here after its peer's SIGKILL did not exit
 * within its grace period). */
void cu_dist_leave(sf_backend *be, int together)
{
    cuda_ctx *c = ctx_of(be);
    if (!c->nccl)
        return;
    cudaSetDevice(c->device);
    if (together) {
        cudaStreamSynchronize(c->st_transform);
        cudaStreamSynchronize(c->st_compute);
        if (c->net)
            sf_net_drop_step_graphs(c->net);
    }
    sf_nccl_leave(c->nccl, together);
}

/* A peer that died or stopped answering leaves this rank's all-reduce
 * kernel waiting: past the job's timeout (or on NCCL's own error) the
 * communicator is aborted, the kernels return, and the backend reports the
 * loss (sticky) instead of hanging. */
void nccl_watchdog(cuda_ctx *c)
{
    if (!sf_nccl_joined(c->nccl) || c->sticky || c->q_count == 0)
        return;
    char nerr[200];
    const entry *e = &c->q[c->q_head];
    const uint64_t limit = (uint64_t)c->cfg.dist->timeout_ms * 1000000ull;
    int bad = sf_nccl_check(c->nccl, nerr, sizeof nerr) != 0;
    if (!bad && now_ns() - e->t_submit_ns > limit) {
        snprintf(nerr, sizeof nerr, "the gradient all-reduce did not finish within %d s (distributed.timeout_s)",
                 c->cfg.dist->timeout_ms / 1000);
        bad = 1;
    }
    if (!bad)
        return;
    sf_nccl_abort(c->nccl);
    c->sticky = 1;
    snprintf(c->sticky_msg, sizeof c->sticky_msg, "cuda: NCCL: %s", nerr);
}
