/* gpu/cuda/executor_linear.cu — the executor's GEMM layers: a linear
 * layer's or a projection's forward on cuBLASLt with the bias in the GEMM
 * (or cuBLAS and the bias kernel), the projections' weight gradients, and
 * self_attention's forward and backward around cuDNN's fused attention or
 * the materialised core. Declared in executor_graph.h. */
#include "gpu/cuda/executor_graph.h"

/* A failed call into cuDNN's fused attention, with the reason it gave or ours. */
static int g_sdpa_failed(int i, const char *what)
{
    if (!sf_cuda_last_error()[0])
        sf_cuda_set_error("%s:%d: layer %d (self_attention): cuDNN's fused attention %s failed", __FILE__, __LINE__,
                          i, what);
    return -1;
}

/* Projection j of layer i (a linear layer's 0; self_attention's input
 * projection 0, output projection 1: slots g_proj_slot) over rows x [rows,
 * in] -> y [rows, out], with its bias where it has one: one cuBLASLt GEMM
 * with the bias in its epilogue where S has the plan and the pointers are as
 * aligned as it assumed, else the cuBLAS GEMM and the bias kernel. */
int g_lt_linear_fwd(sf_cuda_net *net, gshape *S, int i, int j, const void *x, int rows, int in, int out, void *y,
                    cudaStream_t s)
{
    const sf_layer *L = &net->m.layers[i];
    const sf_dtype dt = net->g->dt;
    const sf_linear_lt *p = S->lt[i][j];
    const void *w = g_wslot(net, i, g_proj_slot(L, j, 0));
    const int bs = g_proj_slot(L, j, 1);
    const int rc = p ? sf_linear_lt_fwd(p, net->lt, x, w, y, net->blas_ctx.ws, s) : 1;
    if (rc <= 0)
        return rc;
    return sf_linear_fwd_dt(net->blas, dt, x, rows, in, w, out, y, net->cfg.tf32) ||
                   (bs >= 0 && sf_cuda_bias_act_dt(dt, y, net->params + L->p_off[bs], (size_t)rows, out, 1, 0, s))
               ? -1
               : 0;
}

/* The backward-data GEMM of projection j of layer i, dx [rows, in] = dy
 * [rows, out] w: S's cuBLASLt plan where it has one and the pointers are as
 * aligned as it assumed, else cuBLAS. */
int g_lt_linear_bwd_data(sf_cuda_net *net, gshape *S, int i, int j, const void *dy, int rows, int in, int out,
                         void *dx, cudaStream_t s)
{
    const sf_linear_lt *p = S->ltd[i][j];
    const void *w = g_wslot(net, i, g_proj_slot(&net->m.layers[i], j, 0));
    const int rc = p ? sf_linear_lt_bwd_data(p, net->lt, dy, w, dx, net->blas_ctx.ws, s) : 1;
    if (rc <= 0)
        return rc;
    return sf_linear_bwd_data_dt(net->blas, net->g->dt, dy, rows, in, w, out, dx, net->cfg.tf32);
}

/* Its weight gradient and bias gradient (where it has a bias; fp32,
 * overwritten) from x and dy [rows, out]: the bias-gradient kernel and the
 * cuBLAS GEMM (linear.h says why not one cuBLASLt GEMM). */
static int g_proj_wgrad(sf_cuda_net *net, int i, int j, const void *x, void *dy, int rows, int in, int out,
                        cudaStream_t s)
{
    const sf_layer *L = &net->m.layers[i];
    const sf_dtype dt = net->g->dt;
    float *G = net->grads;
    const int bs = g_proj_slot(L, j, 1);
    return (bs >= 0 && sf_cuda_bias_grad_dt(dt, dy, NULL, (size_t)rows, out, 1, G + L->p_off[bs],
                                            (float *)net->g->scratch, s)) ||
                   sf_linear_bwd_filter_dt(net->blas, dt, x, rows, in, dy, out, G + L->p_off[g_proj_slot(L, j, 0)],
                                           net->cfg.tf32)
               ? -1
               : 0;
}

/* self_attention layer i (nn.MultiheadAttention): qkv = x W_in^T + b_in over
 * the n*t tokens, the heads (cuDNN's fused attention or the materialised
 * core), y = o W_out^T + b_out. qkv and o stay for the backward. */
int g_attention_fwd(sf_cuda_net *net, gshape *S, int i, int n, const void *x, void *ws, cudaStream_t s)
{
    gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    gop *o = &g->op[i];
    const int t = L->in_h, c = L->in_c, rows = n * t, tf32 = net->cfg.tf32;
    if (g_lt_linear_fwd(net, S, i, 0, x, rows, c, 3 * c, o->qkv, s))
        return -1;
    if (o->sdpa) {
        if (sf_sdpa_fwd(S->sdpa[i], net->dnn, o->qkv, o->att_o, o->att_stats, ws, s))
            return g_sdpa_failed(i, "forward");
    } else if (sf_attn_core_fwd(net->blas, g->dt, o->qkv, n, t, c, L->heads, g->att_s, o->att_p, o->att_o, tf32, s)) {
        return -1;
    }
    return g_lt_linear_fwd(net, S, i, 1, o->att_o, rows, c, c, o->y, s);
}

/* Its backward from the forward's qkv and o (and weights or statistics):
 * the output projection's gradients and dO, the heads' dqkv, the input
 * projection's gradients and, when wanted, dx. */
int g_attention_bwd(sf_cuda_net *net, gshape *S, int i, int b, int n, void *dx, cudaStream_t s)
{
    gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    gop *o = &g->op[i];
    const int t = L->in_h, c = L->in_c, rows = n * t, tf32 = net->cfg.tf32;
    const sf_dtype dt = g->dt;
    if (g_proj_wgrad(net, i, 1, o->att_o, o->dy, rows, c, c, s) ||
        g_lt_linear_bwd_data(net, S, i, 1, o->dy, rows, c, c, g->att_do, s))
        return -1;
    if (o->sdpa) {
        if (sf_sdpa_bwd(S->sdpa[i], net->dnn, o->qkv, o->att_o, g->att_do, o->att_stats, g->att_dqkv, net->ws, s))
            return g_sdpa_failed(i, "backward");
    } else if (sf_attn_core_bwd(net->blas, dt, o->qkv, o->att_p, g->att_do, n, t, c, L->heads, g->att_s, g->att_dqkv,
                                tf32, s)) {
        return -1;
    }
    if (g_proj_wgrad(net, i, 0, g_in(net, i, 0, b), g->att_dqkv, rows, c, 3 * c, s))
        return -1;
    return dx && g_lt_linear_bwd_data(net, S, i, 0, g->att_dqkv, rows, c, 3 * c, dx, s) ? -1 : 0;
}
