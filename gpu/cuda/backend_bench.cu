/* gpu/cuda/backend_bench.cu — the CUDA backend's diagnose benchmark: bench
 * (the caching method, DESIGN.md §3) runs on the same streams, buffers,
 * events and graphs as submit, with nothing in flight: SF_BENCH_STEP caches one
 * augmented batch in buffer 0 and replays the step; SF_BENCH_AUG_STEP copies
 * the raw batch into every buffer once and times augment + step;
 * SF_BENCH_H2D_AUG_STEP is submit's path from the pinned slot. Parameters and
 * momentum are snapshotted device-to-device before and restored after, the
 * step count likewise; it times with the host clock between full drains.
 */
#include "gpu/cuda/backend_ctx.h"

/* Enqueues warmup + steps steps of batch bt starting from the stage that mode
 * names, on the streams, buffers, events and graphs of submit(); sets *sec to
 * the host wall time of the timed steps, measured between two full drains of
 * both streams. Buffer reuse is throttled as the engine is by max_inflight:
 * before buffer b takes its next batch the host waits for b's last step.
 * Returns 0 or -1 (sf_cuda_last_error set). */
static int bench_run(cuda_ctx *c, const sf_batch *bt, sf_bench_mode mode, int warmup, int steps, double *sec)
{
    const int n = bt->n;
    cudaStream_t cs = c->st_compute, ts = c->st_transform;
    uint64_t t0 = 0;
    if (mode == SF_BENCH_STEP) {
        /* The augmented batch cached in buffer 0: the step alone, back to back
         * on the compute stream (as a device-cached training loop would). */
        c->buf[0].do_opt = 1;
        c->buf[0].opt_t = (int64_t)c->opt_submitted + 1;
        if (enqueue_transform(c, bt, 0))
            return -1;
        SF_CUDA_CHECK(cudaStreamWaitEvent(cs, c->buf[0].ready, 0));
        for (int i = 0; i < warmup + steps; i++) {
            if (i == warmup) {
                SF_CUDA_CHECK(cudaStreamSynchronize(cs));
                t0 = now_ns();
            }
            if (sf_net_step(c->net, 0, n, c->cfg.cuda_graphs, 1))
                return -1;
        }
        SF_CUDA_CHECK(cudaStreamSynchronize(cs));
    } else {
        /* AUG_STEP: the raw batch (and its staging: labels, samples, hyper-
         * parameters) copied to every buffer once, untimed. */
        if (mode == SF_BENCH_AUG_STEP) {
            for (int b = 0; b < c->nbuf; b++)
                if (enqueue_transform(c, bt, b))
                    return -1;
            SF_CUDA_CHECK(cudaStreamSynchronize(ts));
        }
        for (int i = 0; i < warmup + steps; i++) {
            const int b = i % c->nbuf;
            cbuf *B = &c->buf[b];
            if (i == warmup) {
                SF_CUDA_CHECK(cudaStreamSynchronize(ts));
                SF_CUDA_CHECK(cudaStreamSynchronize(cs));
                t0 = now_ns();
            }
            /* max_inflight: buffer b's previous step completes first (then its
             * staging area and inputs are free, as after a harvest). */
            SF_CUDA_CHECK(cudaEventSynchronize(B->done));
            plan_opt(c, b, bt->eval);
            if (mode == SF_BENCH_H2D_AUG_STEP) {
                if (enqueue_transform(c, bt, b))
                    return -1;
            } else {
                /* b's inputs are read by its previous step */
                SF_CUDA_CHECK(cudaStreamWaitEvent(ts, B->done, 0));
                if (enqueue_augment(c, bt, b))
                    return -1;
            }
            if (enqueue_step(c, b, n, 0))
                return -1;
        }
        SF_CUDA_CHECK(cudaStreamSynchronize(ts));
        SF_CUDA_CHECK(cudaStreamSynchronize(cs));
    }
    const uint64_t t1 = now_ns();
    *sec = t1 > t0 ? (double)(t1 - t0) * 1e-9 : 1e-9;
    return 0;
}

int cu_bench(sf_backend *be, const sf_batch *bt, sf_bench_mode mode, int warmup, int steps, double *seconds,
                    char *err, size_t errlen)
{
    cuda_ctx *c = ctx_of(be);
    cudaSetDevice(c->device);
    if (c->sticky) {
        sf_errf(err, errlen, "%s", c->sticky_msg);
        return -1;
    }
    /* A data-parallel step holds the NCCL all-reduce (captured in its graph):
     * replayed by this rank alone it would wait for peers that are not there. */
    if (c->cfg.dist && c->cfg.dist->world > 1) {
        sf_errf(err, errlen, "cuda: the cached stages replay steps that all-reduce with the other ranks; "
                "diagnose is not available with distributed.world_size > 1 on CUDA");
        return -1;
    }
    /* A job of one rank replays its all-reduce alone (the benchmark of the
     * NCCL path's own cost). */
    if (ensure_nccl(c, err, errlen))
        return -1;
    if (check_batch(c, bt, 1, err, errlen) != 0)
        return -1;
    if (mode != SF_BENCH_STEP && mode != SF_BENCH_AUG_STEP && mode != SF_BENCH_H2D_AUG_STEP) {
        sf_errf(err, errlen, "cuda bench: unknown mode %d", (int)mode);
        return -1;
    }
    if (warmup < 0 || steps < 1 || !seconds) {
        sf_errf(err, errlen, "cuda bench: warmup %d must be >= 0 and steps %d >= 1", warmup, steps);
        return -1;
    }
    if (c->q_count > 0) {
        sf_errf(err, errlen, "cuda bench: %d batches in flight; bench needs an idle backend", c->q_count);
        return -1;
    }
    int64_t bad_val = 0;
    const long long bad_at = bad_label(bt, c->m.n_classes, &bad_val, c->lps);
    if (bad_at >= 0) {
        sf_errf(err, errlen, "cuda bench: label %lld of sample %lld is outside [0,%d)", (long long)bad_val,
                (long long)(bad_at / (long long)c->lps), c->m.n_classes);
        return -1;
    }
    sf_cuda_clear_error();
    if (sf_net_prepare(c->net, bt->n)) {
        sf_errf(err, errlen, "cuda bench: %s", sf_cuda_last_error());
        return -1;
    }
    /* The training state, snapshotted on the device and restored afterwards,
     * also when the run failed part-way. */
    float *snap = NULL;
    if (cudaMalloc((void **)&snap, sizeof(float) * (sf_net_state_floats(c->net) + 1)) != cudaSuccess) {
        cudaGetLastError();
        sf_errf(err, errlen, "cuda bench: no device memory for the %zu-float state snapshot",
                sf_net_state_floats(c->net));
        return -1;
    }
    const uint64_t saved_steps = c->steps, saved_sub = c->opt_submitted;
    const int saved_count = c->accum_count;
    double sec = 0;
    int rc = sf_net_save_state(c->net, snap);
    if (rc == 0)
        rc = bench_run(c, bt, mode, warmup, steps, &sec);
    char msg[SF_CUDA_ERR_LEN];
    sf_scopy(msg, sizeof msg, sf_cuda_last_error());
    /* Drain whatever was queued before the error, then restore. */
    cudaError_t e0 = cudaStreamSynchronize(c->st_decode_own);
    cudaError_t e1 = cudaStreamSynchronize(c->st_transform_own);
    cudaError_t e2 = cudaStreamSynchronize(c->st_compute);
    if (e0 != cudaSuccess || e1 != cudaSuccess || e2 != cudaSuccess) {
        make_sticky(c, "bench", e0 != cudaSuccess ? e0 : e1 != cudaSuccess ? e1 : e2);
        sf_errf(err, errlen, "%s", c->sticky_msg);
        cudaFree(snap);
        return -1;
    }
    cudaGetLastError(); /* a failed enqueue (not a device fault) is not sticky */
    sf_cuda_clear_error();
    int rr = sf_net_restore_state(c->net, snap);
    cudaError_t e3 = cudaStreamSynchronize(c->st_compute);
    cudaFree(snap);
    c->steps = saved_steps;
    c->opt_submitted = saved_sub;
    c->accum_count = saved_count;
    /* the bench's own skips (if any) were never harvested */
    c->skips_counted = 0;
    if (rr == 0)
        rr = sf_net_reset_skips(c->net);
    if (rr || e3 != cudaSuccess) {
        if (e3 != cudaSuccess)
            make_sticky(c, "bench restore", e3);
        sf_errf(err, errlen, "cuda bench: restoring the training state failed: %s",
                e3 != cudaSuccess ? c->sticky_msg : sf_cuda_last_error());
        return -1;
    }
    if (rc) {
        sf_errf(err, errlen, "cuda bench: %s", msg);
        return -1;
    }
    *seconds = sec;
    return 0;
}
