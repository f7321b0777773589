/* gpu/cuda/executor_prelu.cu — the executor's prelu layer (nn.PReLU): its
 * forward, and its backward with the slopes' gradient, a fixed-order
 * two-pass reduction through the compute-stream scratch (sized by
 * sf_exec_scratch_need). Declared in executor_graph.h; kernels in prelu.cu. */
#include "gpu/cuda/executor_graph.h"

int g_prelu_fwd(sf_cuda_net *net, int i, int n, const void *x, cudaStream_t s)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    return sf_cuda_prelu_fwd_dt(g->dt, g->lay, x, net->params + L->w_off, L->num_parameters, g->op[i].y, n,
                                L->out_ch, (size_t)L->out_h * L->out_w, s);
}

int g_prelu_bwd(sf_cuda_net *net, int i, int b, int n, void *dx, cudaStream_t s)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    return sf_cuda_prelu_bwd_dt(g->dt, g->lay, g_in(net, i, 0, b), net->params + L->w_off, L->num_parameters,
                                g->op[i].dy, dx, net->grads + L->w_off, n, L->out_ch, (size_t)L->out_h * L->out_w,
                                (float *)g->scratch, s);
}
