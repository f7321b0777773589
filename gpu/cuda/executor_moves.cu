/* gpu/cuda/executor_moves.cu — the executor's layers that move values with
 * at most a weighted sum of a few: ShuffleNet's channel shuffle, the channel
 * slice, the pixel shuffle and its inverse, upsampling (nearest or
 * bilinear), the pad (its cases in executor_pad.cu), and the token
 * sequences' backward (a transpose, a scatter, a sum over the samples).
 * Declared in executor_graph.h. */
#include "gpu/cuda/executor_graph.h"

/* The kinds g_moves_fwd and g_moves_bwd run. */
int g_is_move(sf_layer_kind k)
{
    switch (k) {
    case SF_L_CHANNEL_SHUFFLE:
    case SF_L_CHANNEL_SLICE:
    case SF_L_PIXEL_SHUFFLE:
    case SF_L_PIXEL_UNSHUFFLE:
    case SF_L_UPSAMPLE:
    case SF_L_PAD:
        return 1;
    default:
        return 0;
    }
}

int g_moves_fwd(sf_cuda_net *net, int i, int n, const void *x, cudaStream_t s)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    void *y = g->op[i].y;
    const size_t hw = (size_t)L->out_h * L->out_w;
    switch (L->kind) {
    case SF_L_CHANNEL_SHUFFLE:
        return sf_cuda_channel_shuffle_dt(g->dt, g->lay, x, n, L->out_ch, hw, L->groups, y, s);
    case SF_L_CHANNEL_SLICE:
        return sf_cuda_channel_slice_fwd_dt(g->dt, g->lay, x, n, L->in_c, hw, L->start, L->count, y, s);
    case SF_L_PIXEL_SHUFFLE: /* the small side is the input */
        return sf_cuda_pixel_shuffle_dt(g->dt, g->lay, x, n, L->out_ch, L->in_h, L->in_w, L->scale, 0, y, s);
    case SF_L_PIXEL_UNSHUFFLE: /* the small side is the output */
        return sf_cuda_pixel_shuffle_dt(g->dt, g->lay, x, n, L->in_c, L->out_h, L->out_w, L->scale, 1, y, s);
    case SF_L_PAD:
        return g_pad_fwd(net, i, n, x, s);
    default: { /* SF_L_UPSAMPLE */
        const sf_up_rule p = sf_layer_up_rule(L);
        return sf_cuda_upsample_fwd_dt(g->dt, g->lay, x, n, L->in_c, &p, y, s);
    }
    }
}

int g_moves_bwd(sf_cuda_net *net, int i, int n, void *dx, cudaStream_t s)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    const void *dy = g->op[i].dy;
    const size_t hw = (size_t)L->out_h * L->out_w;
    switch (L->kind) {
    case SF_L_CHANNEL_SHUFFLE: /* the shuffle by C/groups undoes the one by groups */
        return sf_cuda_channel_shuffle_dt(g->dt, g->lay, dy, n, L->out_ch, hw, L->out_ch / L->groups, dx, s);
    case SF_L_CHANNEL_SLICE:
        /* the input's whole gradient, zero outside the slice: dx is its
         * owner's gradient when this is its first reader (the later readers
         * add theirs through gtmp) */
        return sf_cuda_channel_slice_bwd_dt(g->dt, g->lay, dy, n, L->in_c, hw, L->start, L->count, dx, s);
    case SF_L_PIXEL_SHUFFLE: /* each is the other's backward */
        return sf_cuda_pixel_shuffle_dt(g->dt, g->lay, dy, n, L->out_ch, L->in_h, L->in_w, L->scale, 1, dx, s);
    case SF_L_PIXEL_UNSHUFFLE:
        return sf_cuda_pixel_shuffle_dt(g->dt, g->lay, dy, n, L->in_c, L->out_h, L->out_w, L->scale, 0, dx, s);
    case SF_L_PAD: /* the input's whole gradient, gathered */
        return g_pad_bwd(net, i, n, dx, s);
    default: { /* SF_L_UPSAMPLE: each input pixel's share of the outputs that read it */
        const sf_up_rule p = sf_layer_up_rule(L);
        return sf_cuda_upsample_bwd_dt(g->dt, g->lay, dy, n, L->in_c, &p, dx, s);
    }
    }
}

/* Forward of the token-sequence kinds (to_tokens, to_map, class_token,
 * pos_embedding, select_token, token_mean, transpose_tokens) of layer i over
 * n samples of x. */
int g_tokens_fwd(sf_cuda_net *net, int i, int n, const void *x, cudaStream_t s)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    const sf_dtype dt = g->dt;
    void *y = g->op[i].y;
    const float *w = net->params + L->w_off;
    switch (L->kind) {
    case SF_L_TO_TOKENS:
        return sf_cuda_tokens_from_map_dt(dt, g->lay, x, n, L->in_c, (size_t)L->in_h * L->in_w, y, s);
    case SF_L_TO_MAP: /* tokens [h*w, C] as the map in the net's layout: to_tokens' backward move */
        return sf_cuda_tokens_to_map_dt(dt, g->lay, x, n, L->in_c, (size_t)L->in_h, y, s);
    case SF_L_CLASS_TOKEN:
        return sf_cuda_prepend_token_fwd_dt(dt, x, n, L->in_h, L->in_c, w, y, s);
    case SF_L_POS_EMBEDDING:
        return sf_cuda_add_bcast_fwd_dt(dt, x, n, L->out_elems, w, y, s);
    case SF_L_SELECT_TOKEN:
        return sf_cuda_select_token_fwd_dt(dt, x, n, L->in_h, L->in_c, y, s);
    case SF_L_TOKEN_MEAN:
        return sf_cuda_token_mean_fwd_dt(dt, x, n, L->in_h, L->in_c, L->start, y, s);
    default: /* SF_L_TRANSPOSE_TOKENS: [T, C] read as a [T, C] NCHW map, to_tokens' transpose */
        return sf_cuda_tokens_from_map_dt(dt, SF_LAYOUT_NCHW, x, n, L->in_h, (size_t)L->in_c, y, s);
    }
}

/* Backward of the token-sequence kinds (to_tokens, to_map, class_token,
 * pos_embedding, select_token, token_mean, transpose_tokens) of layer i over n samples, into dx (NULL:
 * not wanted) and the layer's parameter gradient. */
int g_tokens_bwd(sf_cuda_net *net, int i, int n, void *dx, size_t in_len, cudaStream_t s)
{
    const gen_net *g = net->g;
    const sf_layer *L = &net->m.layers[i];
    const gop *o = &g->op[i];
    const sf_dtype dt = g->dt;
    switch (L->kind) {
    case SF_L_TO_TOKENS:
        return dx && sf_cuda_tokens_to_map_dt(dt, g->lay, o->dy, n, L->in_c, (size_t)L->in_h * L->in_w, dx, s) ? -1
                                                                                                               : 0;
    case SF_L_TO_MAP: /* the map's gradient back to tokens */
        return dx && sf_cuda_tokens_from_map_dt(dt, g->lay, o->dy, n, L->in_c, (size_t)L->in_h, dx, s) ? -1 : 0;
    case SF_L_CLASS_TOKEN:
        return sf_cuda_prepend_token_bwd_dt(dt, o->dy, n, L->in_h, L->in_c, dx, net->grads + L->w_off, s) ? -1 : 0;
    case SF_L_POS_EMBEDDING: /* the input's gradient is dy itself */
        if (sf_cuda_add_bcast_bwd_dt(dt, o->dy, n, L->out_elems, net->grads + L->w_off, s))
            return -1;
        if (dx)
            SF_CUDA_CHECK(cudaMemcpyAsync(dx, o->dy, g->es * in_len, cudaMemcpyDeviceToDevice, s));
        return 0;
    case SF_L_TOKEN_MEAN:
        return dx && sf_cuda_token_mean_bwd_dt(dt, o->dy, n, L->in_h, L->in_c, L->start, dx, s) ? -1 : 0;
    case SF_L_TRANSPOSE_TOKENS: /* dy [C, T] back to [T, C] */
        return dx && sf_cuda_tokens_from_map_dt(dt, SF_LAYOUT_NCHW, o->dy, n, L->in_c, (size_t)L->in_h, dx, s) ? -1
                                                                                                                : 0;
    default: /* SF_L_SELECT_TOKEN */
        return dx && sf_cuda_select_token_bwd_dt(dt, o->dy, n, L->in_h, L->in_c, dx, s) ? -1 : 0;
    }
}
