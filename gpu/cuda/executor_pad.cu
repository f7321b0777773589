/* gpu/cuda/executor_pad.cu — the executor's pad layer (F.pad and the
 * nn.*Pad2d modules): its forward, and its backward into dx, the input's
 * whole gradient (a gather: written, not accumulated). It runs as one of the
 * moves (g_is_move, executor_moves.cu), which call these. Declared in
 * executor_graph.h; kernels in pad.cu. */
#include "gpu/cuda/executor_graph.h"

int g_pad_fwd(sf_cuda_net *net, int i, int n, const void *x, cudaStream_t s)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    return sf_cuda_pad_fwd_dt(g->dt, g->lay, x, n, L->out_ch, L->in_h, L->in_w, L->pads, L->mode, L->pad_value,
                              g->op[i].y, s);
}

int g_pad_bwd(sf_cuda_net *net, int i, int n, void *dx, cudaStream_t s)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    return sf_cuda_pad_bwd_dt(g->dt, g->lay, g->op[i].dy, n, L->out_ch, L->in_h, L->in_w, L->pads, L->mode, dx, s);
}
