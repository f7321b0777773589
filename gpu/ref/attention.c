/* gpu/ref/attention.c — reference multi-head self-attention (the
 * self_attention kind, nn.MultiheadAttention as torchvision's encoder
 * calls it), forward and backward, in float and double (_f64), and its
 * hooks: plain softmax attention with every [t, t] weight matrix in memory,
 * the oracle the fused GPU kernels are held to. Contracts in
 * gpu/ref/layers.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>
#include <string.h>

#define SF_REF_SELF "attention.c"
#include "gpu/ref/generic.h"

/* ---- the self_attention layer's hooks (gpu/layers.c) ---------------------- */

/* The layer's saved state for a batch of n, carved from io->save in this
 * order: what the backward takes from the forward (qkv, the attention
 * weights a, the heads' output o), the backward's own intermediates (d_o,
 * dqkv), and the bf16-rounded projection weights of precision=bf16. */
typedef struct att_bufs {
    float *qkv, *a, *o, *d_o, *dqkv, *w_in, *w_out;
} att_bufs;

static size_t att_floats(int t, int c, int h, size_t n, att_bufs *s, float *base)
{
    const size_t rows = n * (size_t)t, sizes[7] = {rows * 3 * c, n * h * (size_t)t * t, rows * c, rows * c,
                                                    rows * 3 * c, (size_t)3 * c * c, (size_t)c * c};
    float **slot[7] = {NULL};
    if (s) {
        float **p[7] = {&s->qkv, &s->a, &s->o, &s->d_o, &s->dqkv, &s->w_in, &s->w_out};
        memcpy(slot, p, sizeof slot);
    }
    size_t at = 0;
    for (int i = 0; i < 7; i++) {
        if (s)
            *slot[i] = base + at;
        at += sizes[i];
    }
    return at;
}

size_t sf_ref_layer_attention_save(const sf_layer *L, size_t nb)
{
    return att_floats(L->in_h, L->in_c, L->heads, nb, NULL, NULL);
}

/* Under precision=bf16 the projections compute with bf16-rounded weights
 * (cuBLAS on bf16 copies, as linear layers do) and q, k, v and the heads'
 * output are stored in bf16 between the three steps, as the fused kernel's
 * inputs and output are; the attention weights stay in fp32 (they live in
 * the kernel's registers). */
void sf_ref_layer_attention_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    const int t = L->in_h, c = L->in_c, rows = io->n * t;
    att_bufs s;
    att_floats(t, c, L->heads, (size_t)io->n, &s, io->save);
    const int wi = sf_attn_slot(L, 0, 0), bi = sf_attn_slot(L, 0, 1), wo = sf_attn_slot(L, 1, 0),
              bo = sf_attn_slot(L, 1, 1);
    const float *w_in = io->p[wi], *w_out = io->p[wo];
    if (io->bf16) {
        for (size_t e = 0; e < (size_t)3 * c * c; e++)
            s.w_in[e] = sf_bf16_round(w_in[e]);
        for (size_t e = 0; e < (size_t)c * c; e++)
            s.w_out[e] = sf_bf16_round(w_out[e]);
        w_in = s.w_in;
        w_out = s.w_out;
    }
    sf_ref_linear_fwd(io->x[0], rows, c, w_in, bi < 0 ? NULL : io->p[bi], 3 * c, s.qkv);
    if (io->bf16)
        sf_bf16_round_n(s.qkv, (size_t)rows * 3 * c);
    sf_ref_attention_core_fwd(s.qkv, io->n, t, c, L->heads, s.a, s.o);
    if (io->bf16)
        sf_bf16_round_n(s.o, (size_t)rows * c);
    sf_ref_linear_fwd(s.o, rows, c, w_out, bo < 0 ? NULL : io->p[bo], c, io->y);
}

/* Takes the state of the training forward of the same batch. The weight
 * gradients stay fp32 under precision=bf16; the intermediate gradients are
 * stored in bf16 as the forward's tensors are. */
void sf_ref_layer_attention_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    const int t = L->in_h, c = L->in_c, rows = io->n * t;
    att_bufs s;
    att_floats(t, c, L->heads, (size_t)io->n, &s, io->save);
    const int wi = sf_attn_slot(L, 0, 0), bi = sf_attn_slot(L, 0, 1), wo = sf_attn_slot(L, 1, 0),
              bo = sf_attn_slot(L, 1, 1);
    const float *w_in = io->bf16 ? s.w_in : io->p[wi], *w_out = io->bf16 ? s.w_out : io->p[wo];
    sf_ref_linear_bwd(s.o, rows, c, w_out, c, io->dy, s.d_o, io->dp[wo], bo < 0 ? NULL : io->dp[bo]);
    if (io->bf16)
        sf_bf16_round_n(s.d_o, (size_t)rows * c);
    sf_ref_attention_core_bwd(s.qkv, s.a, s.d_o, io->n, t, c, L->heads, s.dqkv);
    if (io->bf16)
        sf_bf16_round_n(s.dqkv, (size_t)rows * 3 * c);
    float *dx = io->want[0] ? io->scratch : NULL;
    sf_ref_linear_bwd(io->x[0], rows, c, w_in, 3 * c, s.dqkv, dx, io->dp[wi], bi < 0 ? NULL : io->dp[bi]);
    if (dx)
        io->give(io, 0, dx);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* Per sample and head j (d = c / h values at j*d of each token's q, k and
 * v, which sit at 0, c and 2c of its 3c): a = softmax over keys of
 * q k^T / sqrt(d) ([n, h, t, t]) and o = a v, the heads side by side in each
 * token's c values ([n, t, c]), as nn.MultiheadAttention concatenates them. */
void SF_FN(sf_ref_attention_core_fwd)(const T *qkv, int n, int t, int c, int h, T *a, T *o)
{
    const int d = c / h;
    const T scale = (T)1 / SF_SQRT((T)d);
    const size_t ld = (size_t)3 * c;
    for (int ni = 0; ni < n; ni++)
        for (int j = 0; j < h; j++) {
            const T *q = qkv + (size_t)ni * t * ld + (size_t)j * d, *k = q + c, *v = q + 2 * c;
            for (int i = 0; i < t; i++) {
                T *ar = a + (((size_t)ni * h + j) * t + i) * t;
                T mx = -INFINITY;
                for (int u = 0; u < t; u++) {
                    T s = 0;
                    for (int e = 0; e < d; e++)
                        s += q[(size_t)i * ld + e] * k[(size_t)u * ld + e];
                    ar[u] = s * scale;
                    if (ar[u] > mx)
                        mx = ar[u];
                }
                T sum = 0;
                for (int u = 0; u < t; u++) {
                    ar[u] = SF_EXP(ar[u] - mx);
                    sum += ar[u];
                }
                for (int u = 0; u < t; u++)
                    ar[u] /= sum;
                T *orow = o + ((size_t)ni * t + i) * c + (size_t)j * d;
                for (int e = 0; e < d; e++) {
                    T acc = 0;
                    for (int u = 0; u < t; u++)
                        acc += ar[u] * v[(size_t)u * ld + e];
                    orow[e] = acc;
                }
            }
        }
}

/* The gradient of qkv from d_o, the gradient of o, with the forward's a:
 * dv = a^T d_o; dp = d_o v^T; ds = a * (dp - rowsum(a * dp));
 * dq = ds k / sqrt(d); dk = ds^T q / sqrt(d). dqkv is overwritten. */
void SF_FN(sf_ref_attention_core_bwd)(const T *qkv, const T *a, const T *d_o, int n, int t, int c, int h, T *dqkv)
{
    const int d = c / h;
    const T scale = (T)1 / SF_SQRT((T)d);
    const size_t ld = (size_t)3 * c;
    for (size_t e = 0; e < (size_t)n * t * ld; e++)
        dqkv[e] = 0;
    for (int ni = 0; ni < n; ni++)
        for (int j = 0; j < h; j++) {
            const size_t base = (size_t)ni * t * ld + (size_t)j * d;
            const T *q = qkv + base, *k = q + c, *v = q + 2 * c;
            T *dq = dqkv + base, *dk = dq + c, *dv = dq + 2 * c;
            for (int i = 0; i < t; i++) {
                const T *ar = a + (((size_t)ni * h + j) * t + i) * t;
                const T *go = d_o + ((size_t)ni * t + i) * c + (size_t)j * d;
                /* rowsum(a * dp), with dp[u] = go . v[u] */
                T rs = 0;
                for (int u = 0; u < t; u++) {
                    T dp = 0;
                    for (int e = 0; e < d; e++)
                        dp += go[e] * v[(size_t)u * ld + e];
                    rs += ar[u] * dp;
                }
                for (int u = 0; u < t; u++) {
                    T dp = 0;
                    for (int e = 0; e < d; e++)
                        dp += go[e] * v[(size_t)u * ld + e];
                    const T ds = ar[u] * (dp - rs) * scale;
                    for (int e = 0; e < d; e++) {
                        dq[(size_t)i * ld + e] += ds * k[(size_t)u * ld + e];
                        dk[(size_t)u * ld + e] += ds * q[(size_t)i * ld + e];
                        dv[(size_t)u * ld + e] += ar[u] * go[e];
                    }
                }
            }
        }
}

/* The whole layer: qkv = x w_in^T + b_in over the n*t tokens, the heads
 * (above), y = o w_out^T + b_out. qkv, a and o are kept for the backward. */
void SF_FN(sf_ref_attention_fwd)(const T *x, int n, int t, int c, int h, const T *w_in, const T *b_in,
                                 const T *w_out, const T *b_out, T *qkv, T *a, T *o, T *y)
{
    SF_FN(sf_ref_linear_fwd)(x, n * t, c, w_in, b_in, 3 * c, qkv);
    SF_FN(sf_ref_attention_core_fwd)(qkv, n, t, c, h, a, o);
    SF_FN(sf_ref_linear_fwd)(o, n * t, c, w_out, b_out, c, y);
}

/* Its backward from the forward's qkv, a and o; d_o ([n, t, c]) and dqkv
 * ([n, t, 3c]) are work space; dx may be NULL. */
void SF_FN(sf_ref_attention_bwd)(const T *x, int n, int t, int c, int h, const T *w_in, const T *w_out,
                                 const T *qkv, const T *a, const T *o, const T *dy, T *d_o, T *dqkv, T *dx,
                                 T *dw_in, T *db_in, T *dw_out, T *db_out)
{
    SF_FN(sf_ref_linear_bwd)(o, n * t, c, w_out, c, dy, d_o, dw_out, db_out);
    SF_FN(sf_ref_attention_core_bwd)(qkv, a, d_o, n, t, c, h, dqkv);
    SF_FN(sf_ref_linear_bwd)(x, n * t, c, w_in, 3 * c, dqkv, dx, dw_in, db_in);
}

#endif
