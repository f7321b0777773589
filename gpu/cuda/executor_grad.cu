/* gpu/cuda/executor_grad.cu — the end of a training step: the gradient
 * check's per-layer sums, the data-parallel all-reduce in buckets on the
 * reduce stream (timed in the stream), accumulation, the optimizer and the
 * results' copies to the host; and the step a data-parallel rank without a
 * batch takes so that its collectives match the other ranks'.
 */
#include "gpu/cuda/executor_graph.h"

static const sf_sgd_segs k_no_segs = {};

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
int g_refresh_wd(sf_cuda_net *net, int all, cudaStream_t s)
{
    gen_net *g = net->g;
    if (!g->wcopy)
        return 0;
    const size_t off = all ? 0 : net->m.train_off, len = net->m.n_params - off;
    if (len == 0)
        return 0;
    return sf_cuda_weights_dev(net->params + off, E(g->wd, off, g->es), g->dt, len, NULL, s);
}

/* The 16-byte aligned weight copies of the convs whose weight sits below
 * that alignment (gop.wal_w), from the weights they stand in for (g_wd):
 * all of them (build, set_params, restore) or those in the trainable slice
 * the optimizer updates (after a step; the frozen prefix does not move, and
 * the transform stream may be reading its copies). The plans read only the
 * copies, so every change of the weights must be followed by this, on the
 * stream the change was made on. */
int g_refresh_wal(sf_cuda_net *net, int all, cudaStream_t s)
{
    const gen_net *g = net->g;
    for (int i = 0; i < g->nl; i++) {
        const sf_layer *L = &net->m.layers[i];
        if (g->op[i].wal_w && (all || L->w_off >= net->m.train_off))
            SF_CUDA_CHECK(cudaMemcpyAsync(g->op[i].wal_w, g_wd(net, i), g->es * L->n_w, cudaMemcpyDeviceToDevice, s));
    }
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
int g_norm_layer(sf_cuda_net *net, int i)
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
int g_reduce_bucket(sf_cuda_net *net, int b, int i)
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

/* distributed.batchnorm sync: on the reduce stream, like the buckets,
 * because NCCL needs every rank to issue one communicator's collectives in
 * one order, and the enqueue order on one stream is the executor's, the
 * same on every rank (on the compute stream they would race the buckets'
 * on the reduce stream). The backward of the layers below waits for it, and
 * behind any bucket still being reduced. */
int g_bn_sync_reduce(sf_cuda_net *net, int c, cudaStream_t s)
{
    SF_CUDA_CHECK(cudaEventRecord(net->ev_bn_sums, s));
    SF_CUDA_CHECK(cudaStreamWaitEvent(net->rst, net->ev_bn_sums, 0));
    if (net->cfg.stat_reduce(net->cfg.grad_reduce_ctx, net->g->bn_sums, 2 * (size_t)c + 1, net->rst))
        return -1;
    SF_CUDA_CHECK(cudaEventRecord(net->ev_bn_reduced, net->rst));
    SF_CUDA_CHECK(cudaStreamWaitEvent(s, net->ev_bn_reduced, 0));
    return 0;
}

/* A round joined without a batch: counted when the job's batchnorm count
 * (the summed sums' last element) is not 0. */
__global__ void k_count_empty_round(const double *__restrict__ count, unsigned long long *__restrict__ rounds)
{
    if (*count > 0.0)
        rounds[0]++;
}

/* A trainable batchnorm that syncs: its forward and backward each make one
 * g_bn_sync_reduce. */
static int g_bn_syncs(const sf_cuda_net *net, int i)
{
    return net->g->bn_sums && net->m.layers[i].kind == SF_L_BATCHNORM2D && !net->g->op[i].frozen;
}

/* The end of a training step: the gradient check (norm, clipping
 * coefficient, non-finite skip: sf_grad_state), accumulation, the optimizer
 * (do_opt) and the results' copies to the host. Without accumulation the
 * per-layer sums were made during the backward (g_norm_layer); with it, the
 * check is of the accumulated gradient, at the step that applies it. convert:
 * the bf16 conv weight gradients still need their fp32 copy. With
 * data-parallel training (grad_reduce) the gradient is all-reduced first, and
 * the check, clipping and update are of the all-reduced gradient. */
int g_opt_tail(sf_cuda_net *net, int b, int do_opt, int convert, prof *pf)
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
    /* after either optimizer path (a skipped step left the weights as they
     * were: their copies too) */
    if (do_opt && g_refresh_wal(net, 0, s))
        return -1;
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
    gen_net *g = net->g;
    const size_t off = m->train_off, len = m->n_params - m->train_off;
    SF_CUDA_CHECK(cudaMemsetAsync(net->grads + off, 0, sizeof(float) * len, net->s));
    if (g->wcopy)
        SF_CUDA_CHECK(cudaMemsetAsync(E(g->gd, off, g->es), 0, g->es * len, net->s));
    SF_CUDA_CHECK(cudaMemsetAsync(net->io[b].result, 0, sizeof(sf_xent_out), net->s));
    /* SyncBatchNorm: each trainable batchnorm's forward with no samples
     * (zero sums, a count of 0), so that this rank makes the other ranks'
     * collectives and moves its running statistics (and num_batches_tracked)
     * with the job's */
    if (g->bn_sums) {
        int counted = 0;
        for (int i = g->nf; i < g->nl; i++) {
            const sf_layer *L = &m->layers[i];
            if (!g_bn_syncs(net, i))
                continue;
            if (sf_cuda_bn_sync_fwd_sums_dt(g->dt, NULL, 0, L->in_c, L->in_h, L->in_w, g->lay, g->bn_sums, NULL,
                                            net->s) ||
                g_bn_sync_reduce(net, L->in_c, net->s) ||
                sf_cuda_bn_sync_fwd_dt(g->dt, NULL, 0, L->in_c, L->in_h, L->in_w, g->lay, NULL, NULL, L->eps,
                                       L->momentum, g->bn_sums, g->bufs + L->rm_off, g->bufs + L->rv_off,
                                       g->op[i].save, g->op[i].save + L->out_ch, NULL, NULL, 0, net->s))
                return -1;
            if (!counted) {
                k_count_empty_round<<<1, 1, 0, net->s>>>(g->bn_sums + 2 * (size_t)L->in_c, g->nbt_empty);
                SF_CUDA_CHECK(cudaGetLastError());
                counted = 1;
            }
        }
    }
    /* the same collectives, in the same order, as the other ranks' backward:
     * each syncing batchnorm's sums (zeros), then the bucket its layer closes */
    for (int i = g->nl - 1; i >= g->nf; i--) {
        const sf_layer *L = &m->layers[i];
        if (g_bn_syncs(net, i) &&
            (sf_cuda_bn_sync_bwd_sums_dt(g->dt, NULL, 0, L->in_c, L->in_h, L->in_w, g->lay, NULL, NULL, NULL, NULL,
                                         NULL, NULL, NULL, NULL, NULL, g->bn_sums, NULL, net->s) ||
             g_bn_sync_reduce(net, L->in_c, net->s)))
            return -1;
        if (net->cfg.grad_reduce && !g->gacc && g_reduce_bucket(net, b, i))
            return -1;
    }
    return g_opt_tail(net, b, do_opt, 0, NULL);
}

int sf_net_param_digest(sf_cuda_net *net, uint64_t *digest)
{
    return sf_cuda_digest(net->params, net->m.n_params, digest, net->s);
}
