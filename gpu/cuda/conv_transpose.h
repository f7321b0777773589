/* gpu/cuda/conv_transpose.h — ConvTranspose2d as plans over conv.h's cuDNN
 * convolutions, with a small plan cache and the bias/ReLU epilogue of its
 * output. Contract: tensor.h; semantics: sf_ref_convt2d_* (gpu/ref/ref.h),
 * checked by tests/gpu/ops/conv_transpose.cu.
 */
#ifndef SF_GPU_CUDA_CONV_TRANSPOSE_H
#define SF_GPU_CUDA_CONV_TRANSPOSE_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/cuda/conv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- ConvTranspose2d (cuDNN graph API) ------------------------------------ */
/* ConvTranspose2d(c -> oc, k, stride, pad) with weight [c, oc, k, k] is the
 * adjoint of Conv2d(oc -> c) with the same weight read as KCRS ([K=c][C=oc]):
 *   convT forward      = conv backward-data (convT x plays conv dy, convT y conv dx)
 *   convT backward-data = conv forward       (convT dy is conv x, convT dx conv y)
 *   convT backward-filter = conv backward-filter (x = convT dy, dy = convT x)
 * so the plans are sf_conv_plan (conv.h) built for that conv. Output size
 * oh = (h - 1)*stride - 2*pad + k (output_padding 0), as ref.h.
 * Weight layout on the device: NCHW activations take PyTorch's [c][oc][k][k];
 * NHWC activations take [c][k][k][oc] (the conv's KRSC). */

typedef struct sf_convt_desc {
    int n, c, h, w;          /* input [n, c, h, w] */
    int oc, k, stride, pad;  /* output channels, square kernel, symmetric padding */
    sf_layout layout;
    int tf32;                /* allow TF32 tensor-core engines */
    sf_dtype dt;             /* x, w, y element type (tensor.h) */
    int align_x, align_w, align_y; /* byte alignment (1..16) of the pointers bound
                                      to x (input or its grad), w, y (output or its grad) */
    int allow_rtc;           /* as sf_conv_desc.allow_rtc */
    const struct sf_cublas_ctx *blas; /* as sf_conv_desc.blas */
} sf_convt_desc;

/* Pointers by role, the same in every direction (compare sf_conv_ptrs):
 *   FWD:        x (read)        w (read)        y (written)
 *   BWD_DATA:   x = dx (written) w (read)       y = dy (read)
 *   BWD_FILTER: x (read)        w = dw (written) y = dy (read)
 * Outputs are overwritten. ws: workspace of at least the plan's ws_bytes. */
typedef struct sf_convt_ptrs {
    void *x, *w, *y, *ws;
} sf_convt_ptrs;

/* Directions to build, as a mask: a frozen layer needs only the forward. */
#define SF_CONVT_DIR_FWD (1 << SF_CONV_FWD)
#define SF_CONVT_DIR_BWD_DATA (1 << SF_CONV_BWD_DATA)
#define SF_CONVT_DIR_BWD_FILTER (1 << SF_CONV_BWD_FILTER)
#define SF_CONVT_DIR_ALL 7

/* The plans of one convT shape, owned by the caller (zero it before the first
 * build). plan[dir] is indexed by sf_conv_dir in the convT's own sense. Each
 * direction also caches one variant pack and the pointers it binds, so a run
 * with the same pointers (the steady state, and any captured graph) allocates
 * nothing. */
typedef struct sf_convt_plans {
    sf_convt_desc d;
    int dirs;                               /* built directions (mask) */
    sf_conv_plan plan[3];
    sf_conv_vpack *vp[3];                   /* cached variant pack, or NULL */
    sf_convt_ptrs vp_ptrs[3];               /* the pointers vp[dir] binds */
} sf_convt_plans;

/* Builds the plans of the directions in `dirs`, as sf_conv_plan_build does
 * (ws_limit, max_candidates; tune non-NULL times the candidates on those
 * buffers, synchronously). Build time only. On failure nothing is kept. */
int sf_convt_plans_build(cudnnHandle_t h, const sf_convt_desc *d, int dirs, size_t ws_limit,
                         int max_candidates, const sf_convt_ptrs *tune, sf_convt_plans *out);
void sf_convt_plans_destroy(sf_convt_plans *p);
/* Largest workspace any built direction needs (bytes). */
size_t sf_convt_ws_bytes(const sf_convt_plans *p);

/* Enqueues direction dir on the handle's stream. Rebinds the cached variant
 * pack when the pointers differ from the last call's (host allocation: do it
 * at build time or before capture, not in the hot loop). Capturable. */
int sf_convt_run(cudnnHandle_t h, sf_convt_plans *p, sf_conv_dir dir, const sf_convt_ptrs *ptrs);

/* A small cache of plan sets keyed by shape (the batch size is part of it), for
 * callers that meet a few shapes. The caller owns and zeroes it. */
#define SF_CONVT_CACHE_MAX 16
typedef struct sf_convt_cache {
    int n;
    sf_convt_plans e[SF_CONVT_CACHE_MAX];
} sf_convt_cache;
/* The plan set of d (all of `dirs` built), building it on a miss; NULL with the
 * error set when it cannot be built or the cache is full. */
sf_convt_plans *sf_convt_cache_get(cudnnHandle_t h, sf_convt_cache *c, const sf_convt_desc *d, int dirs,
                                   size_t ws_limit, int max_candidates);
void sf_convt_cache_destroy(sf_convt_cache *c);

/* Bias of the convT output y [n, oc, oh, ow] (in its layout): y += b[oc], with an
 * optional ReLU (a wrapper over sf_cuda_bias_act). These two fp32 wrappers
 * refuse a descriptor whose dt is not SF_DT_F32 (the _dt ones below take it). */
int sf_convt_bias_act(const sf_convt_desc *d, float *y, const float *b, int relu, cudaStream_t s);
/* db[oc] = sum of dy over n, oh, ow; when y (the ReLU output) is non-NULL, dy is
 * first masked in place (ReLU backward). Deterministic; scratch of
 * sf_cuda_bias_grad_scratch(oc) floats (a wrapper over sf_cuda_bias_grad). */
int sf_convt_bias_grad(const sf_convt_desc *d, float *dy, const float *y, float *db, float *scratch,
                       cudaStream_t s);

int sf_convt_bias_act_dt(const sf_convt_desc *d, void *y, const float *b, int relu, cudaStream_t s);   /* d->dt */
int sf_convt_bias_grad_dt(const sf_convt_desc *d, void *dy, const void *y, float *db, float *scratch,
                          cudaStream_t s);                                                           /* d->dt */

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_CONV_TRANSPOSE_H */
