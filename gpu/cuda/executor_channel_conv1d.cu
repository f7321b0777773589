/* gpu/cuda/executor_channel_conv1d.cu — the executor's channel_conv1d layer
 * (ECA's Conv1d across a pooled map's channels): its forward, and its
 * backward with the weight's and bias's gradients, a fixed-order two-pass
 * reduction through the compute-stream scratch (sized by
 * sf_exec_scratch_need). Declared in executor_graph.h; kernels in
 * channel_conv1d.cu. The parameters stay fp32 under bf16 (k values). */
#include "gpu/cuda/executor_graph.h"

int g_channel_conv1d_fwd(sf_cuda_net *net, int i, int n, const void *x, cudaStream_t s)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    return sf_cuda_channel_conv1d_fwd_dt(g->dt, x, net->params + L->w_off, L->n_b ? net->params + L->b_off : NULL,
                                         L->k, L->pad, g->op[i].y, n, L->out_ch, s);
}

int g_channel_conv1d_bwd(sf_cuda_net *net, int i, int b, int n, void *dx, cudaStream_t s)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    return sf_cuda_channel_conv1d_bwd_dt(g->dt, g_in(net, i, 0, b), net->params + L->w_off, L->k, L->pad,
                                         g->op[i].dy, dx, net->grads + L->w_off,
                                         L->n_b ? net->grads + L->b_off : NULL, n, L->out_ch, (float *)g->scratch, s);
}
