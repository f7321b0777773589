/* gpu/cuda/sdpa.cu — fused (flash) scaled-dot-product attention through
 * cuDNN's graph API: the operation graphs of the forward and the backward, the
 * engine choice, and the runs. Contracts in sdpa.h.
 *
 * Why these graphs. cuDNN recognises attention as a pattern of generic graph
 * operations (matmul, pointwise, reduction, reshape) and hands a graph of that
 * exact shape to its fused attention engine, which keeps each [t, t] tile of
 * scores in registers and shared memory and never writes the matrix out. The
 * graphs below are the ones cuDNN's own C++ frontend builds for a plain
 * (unmasked, dropout-free, equal-heads) attention; their shape is what the
 * engine matches, so they follow it operation for operation, including the
 * multiplication by a pass-by-value 1 in the backward. cuDNN 9.13 added
 * dedicated SDPA operation descriptors (CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD);
 * the frontend builds its forward on the first from 9.13.1 on, but never uses
 * the second: its backward is this composite graph on every release. The
 * composite forward is accepted by every 9.x release too, so both directions
 * here take the one path that compiles and runs on 9.14 and 9.19 alike, and
 * the forward's statistics are the ones the composite backward is built for.
 *
 * Layout. Q, K and V are strided views of the packed [n*t, 3c] matrix: logical
 * [B=n, H=heads, S=t, D=d] with strides (t*3c, d, 3c, 1), at offsets 0, c and
 * 2c; O and dO are [n*t, c] with strides (t*c, d, c, 1). The engine takes K
 * (and, in the backward, V) transposed: the same memory with the last two
 * dimensions and strides swapped.
 *
 * Precision. The matmuls read bf16 and accumulate in fp32; the scores, the
 * softmax and its statistics are fp32 and only the probabilities that feed
 * the second matmul are bf16, as in every flash attention. The backward keeps
 * two fp32 buffers of its own in the caller's workspace (rowsum(dO * O) and
 * the dQ accumulator), which cuDNN 9.6 and later initialise themselves. */
#include "gpu/cuda/sdpa.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "gpu/cuda/check.h"
#include "gpu/cuda/cudnn_graph.h"

/* cuDNN 9.x marks the handle attributes of op graphs and plans deprecated in
 * favour of device-property descriptors, which older 9.x releases lack; the
 * handle attributes work in every 9.x (as in conv.cu). */
#pragma nv_diag_suppress 1444
#pragma nv_diag_suppress 1215
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* Descriptors a plan keeps alive: tensors, operations and graphs of both
 * directions (the backward graph with its padding mask has 35 tensors and 24
 * operations, most with a descriptor of their own). */
#define SF_SDPA_KEEP 192

/* Tensor unique ids: the variant pack binds pointers to the non-virtual
 * ones; the virtual ones (>= 100) only need to be distinct. */
enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_DO, UID_ONE, UID_DQ, UID_DK, UID_DV,
    UID_SOFTMAX_SUM, UID_DQ_ACCUM, UID_SEQ_Q, UID_SEQ_KV, UID_NEG_INF,
    UID_VIRTUAL = 100
};

/* Alignment of the backward's own buffers inside the caller's workspace. */
#define SF_SDPA_WS_ALIGN 256

struct sf_sdpa_plan {
    int n, t, heads, d;
    cudnnBackendDescriptor_t keep[SF_SDPA_KEEP];
    int n_keep;
    int64_t next_virtual;            /* the next virtual tensor's uid */
    cudnnBackendDescriptor_t fwd, bwd; /* execution plans */
    int64_t fwd_engine, bwd_engine;  /* global engine index, -1 unknown */
    size_t fwd_ws, bwd_ws;           /* the cuDNN plans' workspaces */
    size_t off_sum, off_dq, off_bwd_ws; /* the backward's layout of ws */
    size_t ws_bytes;
    /* The backward's full-length padding mask (see bwd_needs_mask): the
     * sequence lengths, n int32 for Q then n for K/V, owned by the plan. */
    int pad_mask;
    int32_t *seq_len;
    size_t seq_kv_off; /* elements from seq_len to the K/V lengths */
    /* Pass-by-value scalars: the variant pack points at these host floats
     * and cuDNN copies the value into the launch, so they must live as long
     * as the plan (a captured CUDA graph holds the copied value). */
    float scale, one, neg_inf;
};

/* ======================================================================== */
/* graph construction                                                       */
/* ======================================================================== */

/* The descriptors plan p keeps alive (cudnn_graph.h). */
static sf_cudnn_keep keep_of(sf_sdpa_plan *p)
{
    const sf_cudnn_keep k = {p->keep, &p->n_keep, SF_SDPA_KEEP, "sdpa plan"};
    return k;
}

static int keep(sf_sdpa_plan *p, cudnnBackendDescriptor_t d)
{
    const sf_cudnn_keep k = keep_of(p);
    return sf_cudnn_keep_add(&k, d);
}

/* A 4-d tensor. uid 0 takes
 * the next virtual uid. Every pointer bound to these is 16-byte aligned. */
static int tensor(sf_sdpa_plan *p, int64_t uid, cudnnDataType_t dt, const int64_t dims[4], const int64_t str[4],
                  bool is_virtual, cudnnBackendDescriptor_t *out)
{
    if (uid == 0)
        uid = p->next_virtual++;
    const sf_cudnn_keep k = keep_of(p);
    return sf_cudnn_tensor(&k, uid, dt, dims, str, 16, is_virtual, out);
}

/* A virtual fp32 (or dt) tensor of dims with strides. */
static int vtensor(sf_sdpa_plan *p, cudnnDataType_t dt, int64_t a, int64_t b, int64_t c, int64_t d, int64_t sa,
                   int64_t sb, int64_t sc, int64_t sd, cudnnBackendDescriptor_t *out)
{
    const int64_t dims[4] = {a, b, c, d}, str[4] = {sa, sb, sc, sd};
    return tensor(p, 0, dt, dims, str, true, out);
}

/* The pass-by-value fp32 scalar: one element, given the four dimensions of
 * the tensors it meets in a pointwise operation (cuDNN refuses operands of
 * different ranks; the frontend pads a scalar's dimensions with ones the same
 * way before it builds the backend graph). */
static int scalar(sf_sdpa_plan *p, int64_t uid, cudnnBackendDescriptor_t *out)
{
    cudnnBackendDescriptor_t t;
    SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t));
    if (keep(p, t))
        return -1;
    const cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    const int64_t ones[4] = {1, 1, 1, 1}, align = 16;
    const bool by_value = true;
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, ones));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, ones));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value));
    SF_CUDNN_CHECK(cudnnBackendFinalize(t));
    *out = t;
    return 0;
}

/* The operations, each appended to ops (a graph's list, at most 32). */
typedef struct op_list {
    cudnnBackendDescriptor_t v[32];
    int64_t n;
} op_list;

static int push(sf_sdpa_plan *p, op_list *l, cudnnBackendDescriptor_t op)
{
    if (l->n >= 32) {
        sf_cuda_set_error("%s:%d: sdpa graph: too many operations", __FILE__, __LINE__);
        return -1;
    }
    l->v[l->n++] = op;
    return 0;
}

/* c = a b over the last two dimensions, batched over the first two; fp32
 * accumulation. m, n, k: per-batch overrides of the GEMM extents (int32
 * [b, 1, 1, 1] tensors), or NULL. */
static int op_matmul_ov(sf_sdpa_plan *p, op_list *l, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                        cudnnBackendDescriptor_t c, cudnnBackendDescriptor_t m, cudnnBackendDescriptor_t n,
                        cudnnBackendDescriptor_t k)
{
    cudnnBackendDescriptor_t mm, op;
    const cudnnDataType_t ct = CUDNN_DATA_FLOAT;
    SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_MATMUL_DESCRIPTOR, &mm));
    if (keep(p, mm))
        return -1;
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct));
    SF_CUDNN_CHECK(cudnnBackendFinalize(mm));
    SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, &op));
    if (keep(p, op))
        return -1;
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a));
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b));
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c));
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm));
    if (m)
        SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m));
    if (n)
        SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n));
    if (k)
        SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k));
    SF_CUDNN_CHECK(cudnnBackendFinalize(op));
    return push(p, l, op);
}

static int op_matmul(sf_sdpa_plan *p, op_list *l, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                     cudnnBackendDescriptor_t c)
{
    return op_matmul_ov(p, l, a, b, c, NULL, NULL, NULL);
}

/* y = mode(x), mode(x, b) or mode(x, b, tm) (b, tm NULL where the mode takes
 * fewer inputs) computed in prec; axis >= 0 for GEN_INDEX. */
static int op_pw_full(sf_sdpa_plan *p, op_list *l, cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis,
                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t tm,
                      cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op;
    const sf_cudnn_keep k = keep_of(p);
    if (sf_cudnn_pointwise(&k, mode, prec, axis, x, b, tm, y, &op))
        return -1;
    return push(p, l, op);
}

/* y = mode(x) or y = mode(x, b) (b NULL for a unary mode); fp32 math. */
static int op_pw(sf_sdpa_plan *p, op_list *l, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y)
{
    return op_pw_full(p, l, mode, CUDNN_DATA_FLOAT, -1, x, b, NULL, y);
}

/* y = reduce(x) over the dimensions where y has extent 1; fp32. */
static int op_reduce(sf_sdpa_plan *p, op_list *l, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                     cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t rd, op;
    const cudnnDataType_t ct = CUDNN_DATA_FLOAT;
    SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, &rd));
    if (keep(p, rd))
        return -1;
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode));
    SF_CUDNN_CHECK(cudnnBackendFinalize(rd));
    SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, &op));
    if (keep(p, op))
        return -1;
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x));
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y));
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd));
    SF_CUDNN_CHECK(cudnnBackendFinalize(op));
    return push(p, l, op);
}

/* y = x viewed with y's dimensions and strides (a transpose, in the backward). */
static int op_reshape(sf_sdpa_plan *p, op_list *l, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op;
    SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, &op));
    if (keep(p, op))
        return -1;
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x));
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y));
    SF_CUDNN_CHECK(cudnnBackendFinalize(op));
    return push(p, l, op);
}

static int finish_graph(sf_sdpa_plan *p, cudnnHandle_t h, const op_list *l, cudnnBackendDescriptor_t *graph)
{
    const sf_cudnn_keep k = keep_of(p);
    return sf_cudnn_graph(&k, h, l->v, l->n, graph);
}

/* The tensors both graphs read: Q, K transposed, V (or V transposed), the
 * statistics and the scale. */
typedef struct io_dims {
    int64_t b, hh, s, d, c;
    int64_t q_dims[4], q_str[4];   /* Q, K, V, dQ, dK, dV: [b, h, s, d] in the packed matrix */
    int64_t t_dims[4], t_str[4];   /* K or V transposed: [b, h, d, s] */
    int64_t o_dims[4], o_str[4];   /* O, dO: [b, h, s, d] in [n*t, c] */
    int64_t st_dims[4], st_str[4]; /* statistics, row sums: [b, h, s, 1] */
} io_dims;

static void dims_of(const sf_sdpa_plan *p, io_dims *g)
{
    g->b = p->n;
    g->hh = p->heads;
    g->s = p->t;
    g->d = p->d;
    g->c = (int64_t)p->heads * p->d;
    const int64_t ld = 3 * g->c;
    const int64_t qd[4] = {g->b, g->hh, g->s, g->d}, qs[4] = {g->s * ld, g->d, ld, 1};
    const int64_t td[4] = {g->b, g->hh, g->d, g->s}, ts[4] = {g->s * ld, g->d, 1, ld};
    const int64_t os[4] = {g->s * g->c, g->d, g->c, 1};
    const int64_t sd[4] = {g->b, g->hh, g->s, 1}, ss[4] = {g->hh * g->s, g->s, 1, 1};
    memcpy(g->q_dims, qd, sizeof qd);
    memcpy(g->q_str, qs, sizeof qs);
    memcpy(g->t_dims, td, sizeof td);
    memcpy(g->t_str, ts, sizeof ts);
    memcpy(g->o_dims, qd, sizeof qd);
    memcpy(g->o_str, os, sizeof os);
    memcpy(g->st_dims, sd, sizeof sd);
    memcpy(g->st_str, ss, sizeof ss);
}

/* Forward: S = Q K^T * scale; M = rowmax(S); E = exp(S - M); Z = rowsum(E);
 * stats = M + log(Z); P = E / Z (bf16); O = P V. */
static int build_fwd(sf_sdpa_plan *p, cudnnHandle_t h, cudnnBackendDescriptor_t *graph)
{
    io_dims g;
    dims_of(p, &g);
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f = CUDNN_DATA_FLOAT;
    const int64_t ss = g.s * g.s;
    op_list l = {{0}, 0};
    cudnnBackendDescriptor_t q, kt, v, o, stats, scale, s0, s1, m, dm, e, z, lz, pr;
    if (tensor(p, UID_Q, bf, g.q_dims, g.q_str, false, &q) || tensor(p, UID_K, bf, g.t_dims, g.t_str, false, &kt) ||
        tensor(p, UID_V, bf, g.q_dims, g.q_str, false, &v) || tensor(p, UID_O, bf, g.o_dims, g.o_str, false, &o) ||
        tensor(p, UID_STATS, f, g.st_dims, g.st_str, false, &stats) || scalar(p, UID_SCALE, &scale))
        return -1;
    if (vtensor(p, f, g.b, g.hh, g.s, g.s, g.hh * ss, ss, g.s, 1, &s0) ||
        vtensor(p, f, g.b, g.hh, g.s, g.s, g.hh * ss, ss, g.s, 1, &s1) ||
        vtensor(p, f, g.b, g.hh, g.s, 1, g.hh * g.s, g.s, 1, 1, &m) ||
        vtensor(p, f, g.b, g.hh, g.s, g.s, g.hh * ss, ss, g.s, 1, &dm) ||
        vtensor(p, f, g.b, g.hh, g.s, g.s, g.hh * ss, ss, g.s, 1, &e) ||
        vtensor(p, f, g.b, g.hh, g.s, 1, g.hh * g.s, g.s, 1, 1, &z) ||
        vtensor(p, f, g.b, g.hh, g.s, 1, g.hh * g.s, g.s, 1, 1, &lz) ||
        vtensor(p, bf, g.b, g.hh, g.s, g.s, g.hh * ss, ss, g.s, 1, &pr))
        return -1;
    if (op_matmul(p, &l, q, kt, s0) || op_pw(p, &l, CUDNN_POINTWISE_MUL, s0, scale, s1) ||
        op_reduce(p, &l, CUDNN_REDUCE_TENSOR_MAX, s1, m) || op_pw(p, &l, CUDNN_POINTWISE_SUB, s1, m, dm) ||
        op_pw(p, &l, CUDNN_POINTWISE_EXP, dm, NULL, e) || op_reduce(p, &l, CUDNN_REDUCE_TENSOR_ADD, e, z) ||
        op_pw(p, &l, CUDNN_POINTWISE_LOG, z, NULL, lz) || op_pw(p, &l, CUDNN_POINTWISE_ADD, m, lz, stats) ||
        op_pw(p, &l, CUDNN_POINTWISE_DIV, e, z, pr) || op_matmul(p, &l, pr, v, o))
        return -1;
    return finish_graph(p, h, &l, graph);
}

/* Backward, from the forward's statistics (no [t, t] saved):
 *   Dsum = rowsum(dO * O) * 1              (fp32, in the workspace)
 *   P = exp(Q K^T * scale - stats)         dV = P^T dO
 *   dS = (dO V^T - Dsum) * P * scale       dK = dS^T Q
 *   dQ = dS K, accumulated in fp32 (in the workspace), then copied to bf16. */
static int build_bwd(sf_sdpa_plan *p, cudnnHandle_t h, cudnnBackendDescriptor_t *graph)
{
    io_dims g;
    dims_of(p, &g);
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f = CUDNN_DATA_FLOAT;
    const int64_t ss = g.s * g.s, b = g.b, hh = g.hh, s = g.s, d = g.d;
    op_list l = {{0}, 0};
    cudnnBackendDescriptor_t q, kt, vt, o, d_o, stats, scale, one, dq, dk, dv, dsum, dq_acc;
    const int64_t acc_str[4] = {hh * s * d, s * d, d, 1};
    if (tensor(p, UID_Q, bf, g.q_dims, g.q_str, false, &q) || tensor(p, UID_K, bf, g.t_dims, g.t_str, false, &kt) ||
        tensor(p, UID_V, bf, g.t_dims, g.t_str, false, &vt) || tensor(p, UID_O, bf, g.o_dims, g.o_str, false, &o) ||
        tensor(p, UID_DO, bf, g.o_dims, g.o_str, false, &d_o) ||
        tensor(p, UID_STATS, f, g.st_dims, g.st_str, false, &stats) || scalar(p, UID_SCALE, &scale) ||
        scalar(p, UID_ONE, &one) || tensor(p, UID_DQ, bf, g.q_dims, g.q_str, false, &dq) ||
        tensor(p, UID_DK, bf, g.q_dims, g.q_str, false, &dk) || tensor(p, UID_DV, bf, g.q_dims, g.q_str, false, &dv) ||
        tensor(p, UID_SOFTMAX_SUM, f, g.st_dims, g.st_str, false, &dsum) ||
        tensor(p, UID_DQ_ACCUM, f, g.q_dims, acc_str, false, &dq_acc))
        return -1;

    /* rowsum(dO * O), through the strides cuDNN's frontend gives the product */
    cudnnBackendDescriptor_t dox, rs;
    if (vtensor(p, f, b, hh, s, d, hh * s * d, s * d, hh * d, 1, &dox) ||
        vtensor(p, f, b, hh, s, 1, hh * s, s, 1, 1, &rs) || op_pw(p, &l, CUDNN_POINTWISE_MUL, d_o, o, dox) ||
        op_reduce(p, &l, CUDNN_REDUCE_TENSOR_ADD, dox, rs) || op_pw(p, &l, CUDNN_POINTWISE_MUL, rs, one, dsum))
        return -1;

    /* the full-length padding mask's sequence lengths and its fill value */
    cudnnBackendDescriptor_t sq = NULL, skv = NULL, ninf = NULL;
    if (p->pad_mask) {
        const int64_t ld[4] = {b, 1, 1, 1}, ls[4] = {1, 1, 1, 1};
        if (tensor(p, UID_SEQ_Q, CUDNN_DATA_INT32, ld, ls, false, &sq) ||
            tensor(p, UID_SEQ_KV, CUDNN_DATA_INT32, ld, ls, false, &skv) || scalar(p, UID_NEG_INF, &ninf))
            return -1;
    }

    /* P, recomputed from the statistics, and dV */
    cudnnBackendDescriptor_t s0, s1, s2, pe, pt;
    if (vtensor(p, f, b, hh, s, s, hh * ss, ss, s, 1, &s0) || vtensor(p, f, b, hh, s, s, hh * ss, ss, s, 1, &s1) ||
        vtensor(p, f, b, hh, s, s, hh * ss, ss, s, 1, &s2) || vtensor(p, f, b, hh, s, s, hh * ss, ss, s, 1, &pe) ||
        vtensor(p, bf, b, hh, s, s, hh * ss, ss, 1, s, &pt))
        return -1;
    if (op_matmul_ov(p, &l, q, kt, s0, sq, skv, NULL) || op_pw(p, &l, CUDNN_POINTWISE_MUL, s0, scale, s1))
        return -1;
    if (p->pad_mask) {
        /* scores outside [0, seq_len_q) x [0, seq_len_kv) become -inf: none
         * here, the lengths being t, yet the mask changes which kernel runs */
        cudnnBackendDescriptor_t ri, ci, rm, cm, pm, s1m;
        const cudnnDataType_t i32 = CUDNN_DATA_INT32, bo = CUDNN_DATA_BOOLEAN;
        if (vtensor(p, i32, b, hh, s, s, hh * ss, ss, s, 1, &ri) || vtensor(p, i32, b, hh, s, s, hh * ss, ss, s, 1, &ci) ||
            vtensor(p, bo, b, hh, s, s, hh * ss, ss, s, 1, &rm) || vtensor(p, bo, b, hh, s, s, hh * ss, ss, s, 1, &cm) ||
            vtensor(p, bo, b, hh, s, s, hh * ss, ss, s, 1, &pm) || vtensor(p, f, b, hh, s, s, hh * ss, ss, s, 1, &s1m))
            return -1;
        if (op_pw_full(p, &l, CUDNN_POINTWISE_GEN_INDEX, i32, 2, s1, NULL, NULL, ri) ||
            op_pw_full(p, &l, CUDNN_POINTWISE_GEN_INDEX, i32, 3, s1, NULL, NULL, ci) ||
            op_pw_full(p, &l, CUDNN_POINTWISE_CMP_LT, bo, -1, ri, sq, NULL, rm) ||
            op_pw_full(p, &l, CUDNN_POINTWISE_CMP_LT, bo, -1, ci, skv, NULL, cm) ||
            op_pw_full(p, &l, CUDNN_POINTWISE_LOGICAL_AND, bo, -1, rm, cm, NULL, pm) ||
            op_pw_full(p, &l, CUDNN_POINTWISE_BINARY_SELECT, f, -1, s1, ninf, pm, s1m))
            return -1;
        s1 = s1m;
    }
    if (op_pw(p, &l, CUDNN_POINTWISE_SUB, s1, stats, s2) || op_pw(p, &l, CUDNN_POINTWISE_EXP, s2, NULL, pe) ||
        op_reshape(p, &l, pe, pt) || op_matmul_ov(p, &l, pt, d_o, dv, skv, NULL, sq))
        return -1;

    /* dS and dK */
    cudnnBackendDescriptor_t dp, dp1, dp2, ds, dst;
    if (vtensor(p, f, b, hh, s, s, hh * ss, ss, s, 1, &dp) || vtensor(p, f, b, hh, s, s, hh * ss, ss, s, 1, &dp1) ||
        vtensor(p, f, b, hh, s, s, hh * ss, ss, s, 1, &dp2) || vtensor(p, f, b, hh, s, s, hh * ss, ss, s, 1, &ds) ||
        vtensor(p, bf, b, hh, s, s, hh * ss, ss, 1, s, &dst))
        return -1;
    if (op_matmul_ov(p, &l, d_o, vt, dp, sq, skv, NULL) || op_pw(p, &l, CUDNN_POINTWISE_SUB, dp, dsum, dp1) ||
        op_pw(p, &l, CUDNN_POINTWISE_MUL, dp1, pe, dp2) || op_pw(p, &l, CUDNN_POINTWISE_MUL, dp2, scale, ds) ||
        op_reshape(p, &l, ds, dst) || op_matmul_ov(p, &l, dst, q, dk, skv, NULL, sq))
        return -1;

    /* dQ = dS K: K un-transposed as a view, fp32 accumulator, then bf16 */
    cudnnBackendDescriptor_t k;
    if (vtensor(p, bf, b, hh, s, d, g.q_str[0], g.q_str[1], g.q_str[2], g.q_str[3], &k) ||
        op_reshape(p, &l, kt, k) || op_matmul_ov(p, &l, ds, k, dq_acc, sq, NULL, skv) ||
        op_pw(p, &l, CUDNN_POINTWISE_IDENTITY, dq_acc, NULL, dq))
        return -1;
    return finish_graph(p, h, &l, graph);
}

/* ======================================================================== */
/* engine choice                                                            */
/* ======================================================================== */

/* What the heuristics offered, for the message when nothing could be used:
 * per mode the count, and per tried config its engine and why it failed. */
typedef struct why_buf {
    char s[768];
    size_t at;
} why_buf;

static void why_add(why_buf *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void why_add(why_buf *w, const char *fmt, ...)
{
    if (w->at >= sizeof w->s - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    const int k = vsnprintf(w->s + w->at, sizeof w->s - w->at, fmt, ap);
    va_end(ap);
    if (k > 0)
        w->at = w->at + (size_t)k < sizeof w->s ? w->at + (size_t)k : sizeof w->s - 1;
}

/* cuDNN's message for its most recent failure on this thread, "" when none. */
static void cudnn_reason(char *buf, size_t len)
{
    buf[0] = '\0';
    cudnnGetLastErrorString(buf, len);
}

static int64_t cfg_engine(cudnnBackendDescriptor_t cfg)
{
    cudnnBackendDescriptor_t eng;
    int64_t idx = -1, cnt = 0;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS)
        return -1;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cnt, &eng) ==
        CUDNN_STATUS_SUCCESS)
        cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, &idx);
    cudnnBackendDestroyDescriptor(eng);
    return idx;
}

/* The first engine config of heuristics mode A, then of FALLBACK, that
 * finalizes into a plan: cuDNN ranks the fused attention engine first when it
 * supports the graph, and no other engine executes these graphs. Numerical
 * notes are not filtered: the fused engine is a tensor-core bf16 engine with
 * fp32 accumulation by construction of the graph. */
static int choose_plan(cudnnHandle_t h, cudnnBackendDescriptor_t graph, cudnnBackendDescriptor_t *plan_out,
                       int64_t *engine, size_t *ws, why_buf *why)
{
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    const char *mode_name[2] = {"A", "FALLBACK"};
    *plan_out = NULL;
    for (int mi = 0; mi < 2 && !*plan_out; mi++) {
        cudnnBackendDescriptor_t heur;
        SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
        cudnnStatus_t st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[mi]);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendFinalize(heur);
        int64_t count = 0;
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                          &count, NULL);
        if (st != CUDNN_STATUS_SUCCESS || count <= 0) {
            why_add(why, " heuristics %s: %s, %lld configs;", mode_name[mi], cudnnGetErrorString(st),
                    (long long)count);
            cudnnBackendDestroyDescriptor(heur);
            continue;
        }
        if (count > 64)
            count = 64;
        cudnnBackendDescriptor_t cfgs[64];
        int64_t made = 0, got = 0;
        for (; made < count; made++)
            if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[made]) != CUDNN_STATUS_SUCCESS)
                break;
        st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, made, &got,
                                      cfgs);
        cudnnBackendDestroyDescriptor(heur);
        if (st != CUDNN_STATUS_SUCCESS)
            got = 0;
        why_add(why, " heuristics %s: %lld configs:", mode_name[mi], (long long)got);
        for (int64_t i = 0; i < got && !*plan_out; i++) {
            const int64_t eidx = cfg_engine(cfgs[i]);
            cudnnBackendDescriptor_t plan;
            int64_t wsb = 0;
            st = sf_cudnn_plan(h, cfgs[i], &plan, &wsb);
            if (!plan)
                break;
            if (st == CUDNN_STATUS_SUCCESS && wsb >= 0) {
                *plan_out = plan;
                *engine = eidx;
                *ws = (size_t)wsb;
            } else {
                /* cuDNN's own sentence says which check refused the config */
                char reason[160];
                cudnn_reason(reason, sizeof reason);
                why_add(why, " engine %lld: %s (%s);", (long long)eidx, cudnnGetErrorString(st), reason);
                cudnnBackendDestroyDescriptor(plan);
            }
        }
        for (int64_t i = 0; i < made; i++)
            cudnnBackendDestroyDescriptor(cfgs[i]);
    }
    return 0;
}

/* ======================================================================== */
/* plans and runs                                                           */
/* ======================================================================== */

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* cuDNN up to 9.15.0 computes wrong (NaN) gradients in the fused backward
 * when the key length is not a multiple of its 128-row tile and no padding
 * mask is given (cudnn-frontend issue 160); the frontend then adds a padding
 * mask with every sequence at full length, which selects the kernel variant
 * that bounds the tail tile. The same is done here, on the cuDNN that runs. */
static int bwd_needs_mask(int t) { return t % 128 != 0 && cudnnGetVersion() <= 91500; }

extern "C" void sf_sdpa_plan_destroy(sf_sdpa_plan *p)
{
    if (!p)
        return;
    if (p->fwd)
        cudnnBackendDestroyDescriptor(p->fwd);
    if (p->bwd)
        cudnnBackendDestroyDescriptor(p->bwd);
    if (p->seq_len)
        cudaFree(p->seq_len);
    for (int i = p->n_keep - 1; i >= 0; i--)
        cudnnBackendDestroyDescriptor(p->keep[i]);
    free(p);
}

extern "C" int sf_sdpa_plan_create(sf_sdpa_plan **out, cudnnHandle_t h, int n, int t, int heads, int head_dim,
                                   size_t *ws_bytes, char *err, size_t errlen)
{
    *out = NULL;
    *ws_bytes = 0;
    char what[96];
    snprintf(what, sizeof what, "sdpa n=%d t=%d heads=%d head_dim=%d", n, t, heads, head_dim);
    /* The fused engine needs the head dimension a multiple of 8 (16-byte
     * rows of bf16) and supports up to 128 on every 9.x release and GPU. */
    if (n < 1 || t < 1 || heads < 1 || head_dim < 8 || head_dim > 128 || head_dim % 8 != 0 ||
        (int64_t)n * t * 3 * heads * head_dim > ((int64_t)1 << 40)) {
        snprintf(err, errlen, "%s: shape unsupported (head_dim a multiple of 8 in 8..128, all sizes >= 1)", what);
        return -1;
    }
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        snprintf(err, errlen, "%s: cannot read the device's compute capability", what);
        return -1;
    }
    if (major < 8) {
        snprintf(err, errlen, "%s: cuDNN's fused attention needs sm_80 or newer; this GPU is sm_%d%d", what, major,
                 minor);
        return -1;
    }
    sf_sdpa_plan *p = (sf_sdpa_plan *)calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "%s: out of memory", what);
        return -1;
    }
    p->n = n;
    p->t = t;
    p->heads = heads;
    p->d = head_dim;
    p->next_virtual = UID_VIRTUAL;
    p->fwd_engine = p->bwd_engine = -1;
    p->scale = 1.f / sqrtf((float)head_dim);
    p->one = 1.f;
    p->neg_inf = -INFINITY;
    p->pad_mask = bwd_needs_mask(t);
    if (p->pad_mask) {
        /* the lengths are constant, so they are written once, here, outside
         * any capture; 16-byte aligned halves */
        p->seq_kv_off = round_up((size_t)n, 4);
        std::vector<int32_t> len(2 * p->seq_kv_off, t);
        if (cudaMalloc((void **)&p->seq_len, len.size() * sizeof(int32_t)) != cudaSuccess ||
            cudaMemcpy(p->seq_len, len.data(), len.size() * sizeof(int32_t), cudaMemcpyHostToDevice) != cudaSuccess) {
            snprintf(err, errlen, "%s: cannot allocate the backward's %zu sequence lengths", what, len.size());
            (void)cudaGetLastError();
            sf_sdpa_plan_destroy(p);
            return -1;
        }
    }

    const size_t cudnn_v = cudnnGetVersion();
    cudnnBackendDescriptor_t gf = NULL, gb = NULL;
    sf_cuda_clear_error();
    if (build_fwd(p, h, &gf) || build_bwd(p, h, &gb)) {
        char reason[256];
        cudnn_reason(reason, sizeof reason);
        snprintf(err, errlen, "%s: cuDNN %zu (headers %d) rejected the %s graph: %s [cuDNN: %s]", what, cudnn_v,
                 CUDNN_VERSION, gf ? "backward" : "forward", sf_cuda_last_error(), reason);
        sf_sdpa_plan_destroy(p);
        return -1;
    }
    why_buf wf, wb;
    wf.at = wb.at = 0;
    wf.s[0] = wb.s[0] = '\0';
    if (choose_plan(h, gf, &p->fwd, &p->fwd_engine, &p->fwd_ws, &wf) ||
        choose_plan(h, gb, &p->bwd, &p->bwd_engine, &p->bwd_ws, &wb)) {
        snprintf(err, errlen, "%s: cuDNN %zu: %s", what, cudnn_v, sf_cuda_last_error());
        sf_sdpa_plan_destroy(p);
        return -1;
    }
    if (!p->fwd || !p->bwd) {
        snprintf(err, errlen, "%s on sm_%d%d: cuDNN %zu (headers %d) has no engine for the %s graph:%s", what, major,
                 minor, cudnn_v, CUDNN_VERSION, p->fwd ? "backward" : "forward", p->fwd ? wb.s : wf.s);
        sf_sdpa_plan_destroy(p);
        return -1;
    }
    const size_t sum_b = (size_t)n * heads * t * sizeof(float);
    const size_t dq_b = (size_t)n * heads * t * head_dim * sizeof(float);
    p->off_sum = 0;
    p->off_dq = round_up(sum_b, SF_SDPA_WS_ALIGN);
    p->off_bwd_ws = p->off_dq + round_up(dq_b, SF_SDPA_WS_ALIGN);
    const size_t bwd_total = p->off_bwd_ws + p->bwd_ws;
    p->ws_bytes = bwd_total > p->fwd_ws ? bwd_total : p->fwd_ws;
    *ws_bytes = p->ws_bytes;
    *out = p;
    return 0;
}

extern "C" const char *sf_sdpa_plan_describe(const sf_sdpa_plan *p, char *buf, size_t len)
{
    snprintf(buf, len, "sdpa n=%d t=%d heads=%d head_dim=%d: cuDNN %zu, fwd engine %lld (ws %zu), "
             "bwd engine %lld (ws %zu + %zu own%s), workspace %zu bytes",
             p->n, p->t, p->heads, p->d, (size_t)cudnnGetVersion(), (long long)p->fwd_engine, p->fwd_ws,
             (long long)p->bwd_engine, p->bwd_ws, p->off_bwd_ws, p->pad_mask ? ", full-length padding mask" : "",
             p->ws_bytes);
    return buf;
}

/* Binds n pointers to their uids and runs plan on the handle's stream. The
 * variant pack is host-side only (no device allocation) and may go once the
 * call is enqueued, so it is made per call: the pointers change per call. */
static int run(cudnnHandle_t h, cudnnBackendDescriptor_t plan, void *const *ptrs, const int64_t *uids, int64_t n,
               void *ws)
{
    cudnnBackendDescriptor_t vp;
    cudnnStatus_t st = sf_cudnn_vpack(ptrs, uids, n, ws, &vp);
    if (st == CUDNN_STATUS_SUCCESS) {
        st = cudnnBackendExecute(h, plan, vp);
        cudnnBackendDestroyDescriptor(vp);
    }
    if (st != CUDNN_STATUS_SUCCESS) {
        sf_cuda_set_error("%s:%d: sdpa execute: %s", __FILE__, __LINE__, cudnnGetErrorString(st));
        return -1;
    }
    return 0;
}

static int aligned16(const void *q) { return ((uintptr_t)q & 15) == 0; }

extern "C" int sf_sdpa_fwd(sf_sdpa_plan *p, cudnnHandle_t h, const void *qkv, void *o, float *stats, void *ws,
                           cudaStream_t s)
{
    if (!p || !p->fwd || !aligned16(qkv) || !aligned16(o) || !aligned16(stats) ||
        ((uintptr_t)ws & (SF_SDPA_WS_ALIGN - 1))) {
        sf_cuda_set_error("%s:%d: sf_sdpa_fwd: no plan, or a pointer not aligned (16 bytes; ws 256)", __FILE__,
                          __LINE__);
        return -1;
    }
    SF_CUDNN_CHECK(cudnnSetStream(h, s));
    const size_t c = (size_t)p->heads * p->d;
    char *base = (char *)qkv;
    void *ptrs[6] = {base, base + c * 2, base + 2 * c * 2, o, stats, &p->scale};
    const int64_t uids[6] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE};
    return run(h, p->fwd, ptrs, uids, 6, ws);
}

extern "C" int sf_sdpa_bwd(sf_sdpa_plan *p, cudnnHandle_t h, const void *qkv, const void *o, const void *d_o,
                           const float *stats, void *dqkv, void *ws, cudaStream_t s)
{
    if (!p || !p->bwd || !aligned16(qkv) || !aligned16(o) || !aligned16(d_o) || !aligned16(stats) ||
        !aligned16(dqkv) || !ws || ((uintptr_t)ws & (SF_SDPA_WS_ALIGN - 1))) {
        sf_cuda_set_error("%s:%d: sf_sdpa_bwd: no plan or workspace, or a pointer not aligned (16 bytes; ws 256)",
                          __FILE__, __LINE__);
        return -1;
    }
    SF_CUDNN_CHECK(cudnnSetStream(h, s));
    const size_t c = (size_t)p->heads * p->d;
    char *base = (char *)qkv, *dbase = (char *)dqkv, *w = (char *)ws;
    void *ptrs[16] = {base, base + c * 2, base + 2 * c * 2, (void *)o, (void *)d_o, (void *)stats, &p->scale,
                      &p->one, dbase, dbase + c * 2, dbase + 2 * c * 2, w + p->off_sum, w + p->off_dq,
                      p->seq_len, p->seq_len + p->seq_kv_off, &p->neg_inf};
    const int64_t uids[16] = {UID_Q, UID_K, UID_V, UID_O, UID_DO, UID_STATS, UID_SCALE, UID_ONE,
                              UID_DQ, UID_DK, UID_DV, UID_SOFTMAX_SUM, UID_DQ_ACCUM, UID_SEQ_Q, UID_SEQ_KV, UID_NEG_INF};
    return run(h, p->bwd, ptrs, uids, p->pad_mask ? 16 : 13, w + p->off_bwd_ws);
}
