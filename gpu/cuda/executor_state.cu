/* gpu/cuda/executor_state.cu — the net's state at the host boundary: the
 * parameters, optimizer state and buffers in PyTorch's layout (permuted on
 * the host from the device layout, see executor.cu), and the device-side
 * save and restore of the whole state.
 */
#include "gpu/cuda/executor_graph.h"

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

extern "C" int sf_net_get_params(sf_cuda_net *net, float *host) { return g_state_to_host(net, net->params, host); }

extern "C" int sf_net_set_params(sf_cuda_net *net, const float *host)
{
    if (g_state_from_host(net, net->params, host) || g_refresh_wd(net, 1, net->s) || g_refresh_wal(net, 1, net->s))
        return -1;
    SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    return 0;
}

/* The training steps' graphs are dropped, to be captured again at their
 * next use (an exec still running is freed when it completes); the
 * evaluation graphs stay. */
extern "C" void sf_net_drop_step_graphs(sf_cuda_net *net)
{
    gen_net *g = net->g;
    for (int k = 0; k < g->n_shapes; k++)
        for (int b = 0; b < SF_NET_MAX_BUF; b++)
            for (int o = 0; o < 2; o++)
                if (g->shapes[k]->exec[b][o]) {
                    cudaGraphExecDestroy(g->shapes[k]->exec[b][o]);
                    g->shapes[k]->exec[b][o] = NULL;
                }
}

/* SGD keeps a momentum buffer only once a step asks for momentum, as
 * torch.optim.SGD does: a model trained without momentum saves 4 bytes per
 * parameter. The graphs captured before baked the absent buffer into the
 * optimizer's launch, so they are captured again. */
extern "C" int sf_net_use_momentum(sf_cuda_net *net)
{
    if (net->mom)
        return 0;
    if (g_alloc_shift(net, &net->mom, net->m.n_params, net->m.train_off))
        return -1;
    sf_net_drop_step_graphs(net);
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
    if (g->nbt_empty)
        SF_CUDA_CHECK(cudaMemcpyAsync(g->nbt_empty + 1, g->nbt_empty, sizeof *g->nbt_empty, cudaMemcpyDeviceToDevice,
                                      net->s));
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
    if (g->nbt_empty)
        SF_CUDA_CHECK(cudaMemcpyAsync(g->nbt_empty, g->nbt_empty + 1, sizeof *g->nbt_empty, cudaMemcpyDeviceToDevice,
                                      net->s));
    return g_refresh_wd(net, 1, net->s) || g_refresh_wal(net, 1, net->s) ? -1 : 0;
}

extern "C" int sf_net_get_buffers(sf_cuda_net *net, float *host, uint64_t *nbt)
{
    if (net->m.n_buffers) {
        SF_CUDA_CHECK(cudaMemcpyAsync(host, net->g->bufs, sizeof(float) * net->m.n_buffers, cudaMemcpyDeviceToHost,
                                      net->s));
        SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    }
    unsigned long long empty = 0;
    if (nbt && net->g->nbt_empty) {
        SF_CUDA_CHECK(cudaMemcpyAsync(&empty, net->g->nbt_empty, sizeof empty, cudaMemcpyDeviceToHost, net->s));
        SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    }
    if (nbt)
        *nbt = net->g->nbt + empty;
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
    if (net->g->nbt_empty) {
        SF_CUDA_CHECK(cudaMemsetAsync(net->g->nbt_empty, 0, sizeof *net->g->nbt_empty, net->s));
        SF_CUDA_CHECK(cudaStreamSynchronize(net->s));
    }
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
