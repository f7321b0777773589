/* gpu/cuda/executor_scale_shift.cu — the executor's per-channel products by
 * parameters: scale_shift (x * weight + bias, learnable: timm's
 * LearnableAffineBlock, ResMLP's Affine) and layer_scale (x * weight, one
 * per channel): the forward, and the backward with the parameters' gradients,
 * fixed-order two-pass reductions through the compute-stream scratch (sized
 * by sf_exec_scratch_need). Declared in executor_graph.h; kernels in mul.cu
 * (the channel scale's, with its shift). */
#include "gpu/cuda/executor_graph.h"

/* One weight for the whole tensor is one channel of a sample's elements (in
 * either layout: every element takes the same value); per channel, the
 * layer's channels in its own layout (a token sequence: rows of channels). */
static void dims(const sf_cuda_net *net, int i, sf_layout *lay, int *c, size_t *hw)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    if (L->kind == SF_L_SCALE_SHIFT && L->num_parameters == 1) {
        *lay = SF_LAYOUT_NCHW, *c = 1, *hw = L->out_elems;
    } else {
        *lay = g->op[i].tok ? SF_LAYOUT_NHWC : g->lay, *c = L->out_ch, *hw = (size_t)L->out_h * L->out_w;
    }
}

static int shifts(const sf_layer *L) { return L->kind == SF_L_SCALE_SHIFT && L->bias; }

int g_scale_shift_fwd(sf_cuda_net *net, int i, int n, const void *x, cudaStream_t s)
{
    const sf_layer *L = &net->m.layers[i];
    sf_layout lay;
    int c;
    size_t hw;
    dims(net, i, &lay, &c, &hw);
    return sf_cuda_channel_scale_fwd_dt(net->g->dt, lay, x, net->params + L->w_off,
                                        shifts(L) ? net->params + L->b_off : NULL, net->g->op[i].y, n, c, hw, s);
}

int g_scale_shift_bwd(sf_cuda_net *net, int i, int b, int n, void *dx, cudaStream_t s)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    sf_layout lay;
    int c;
    size_t hw;
    dims(net, i, &lay, &c, &hw);
    return sf_cuda_channel_scale_bwd_dt(g->dt, lay, g_in(net, i, 0, b), net->params + L->w_off, g->op[i].dy, dx,
                                        net->grads + L->w_off, shifts(L) ? net->grads + L->b_off : NULL, n, c, hw,
                                        (float *)g->scratch, s);
}
