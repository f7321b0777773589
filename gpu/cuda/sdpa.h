/* gpu/cuda/sdpa.h — multi-head self-attention as cuDNN's fused (flash)
 * scaled-dot-product attention, forward and backward, through the cuDNN graph
 * (backend) API: no [t, t] matrix is ever in device memory. Plans are built
 * once per (n, t, heads, head_dim); the calls are legal inside CUDA-graph
 * stream capture. Semantics: sf_ref_attention_core_fwd/bwd (gpu/ref/layers.h),
 * checked by tests/gpu/ops/sdpa.cu. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#ifdef __cplusplus
extern "C" {
#endif
/* Fused (flash) scaled-dot-product attention through cuDNN's graph API, bf16
 * in/out, fp32 statistics, no mask, no dropout, scale 1/sqrt(head_dim).
 * Q, K and V are read from one packed row-major [n*t, 3*c] matrix as
 * torch.nn.MultiheadAttention's in_proj makes it (c = heads*head_dim; Q at
 * column 0, K at c, V at 2c; head h uses columns h*head_dim..). O is written
 * as row-major [n*t, c] (head h at columns h*head_dim..), ready for out_proj.
 * stats: n*heads*t floats (the softmax log-sum-exp the backward needs). */
typedef struct sf_sdpa_plan sf_sdpa_plan;
/* Builds forward and backward plans for one (n, t, heads, head_dim); returns 0,
 * or -1 with the reason in err (no engine on this GPU/cuDNN, shape unsupported):
 * the caller then uses its own (materialised) attention. ws_bytes: the larger
 * of the two workspaces. */
int sf_sdpa_plan_create(sf_sdpa_plan **out, cudnnHandle_t h, int n, int t, int heads, int head_dim,
                        size_t *ws_bytes, char *err, size_t errlen);
void sf_sdpa_plan_destroy(sf_sdpa_plan *p);
/* Forward on stream s (the handle's stream is set by the call). bf16 = __nv_bfloat16 as void. */
int sf_sdpa_fwd(sf_sdpa_plan *p, cudnnHandle_t h, const void *qkv, void *o, float *stats, void *ws, cudaStream_t s);
/* Backward: writes dQ, dK, dV into dqkv (same packed layout as qkv; overwritten, not accumulated). */
int sf_sdpa_bwd(sf_sdpa_plan *p, cudnnHandle_t h, const void *qkv, const void *o, const void *d_o,
                const float *stats, void *dqkv, void *ws, cudaStream_t s);

/* Additions beyond the executor's interface.
 *
 * Pointers: qkv, o, d_o, dqkv and stats must be 16-byte aligned (head_dim is
 * a multiple of 8, so every head's columns then are too); ws must be at least
 * ws_bytes long and 256-byte aligned (cudaMalloc's alignment), and serves one
 * call at a time (the backward keeps two fp32 buffers of its own in it). A
 * plan is used by one thread at a time. Both calls return 0, or -1 with the
 * reason in sf_cuda_last_error() (gpu/cuda/check.h); neither allocates device
 * memory nor synchronises, so both may be captured into a CUDA graph. The
 * statistics are natural-log log-sum-exps of the scaled scores.
 *
 * Shapes: head_dim a multiple of 8 up to 128, a GPU of sm_80 or newer; other
 * shapes are refused by sf_sdpa_plan_create with the reason.
 *
 * sf_sdpa_plan_describe writes one line naming the cuDNN version, the engines
 * chosen (global index) and the workspace of each direction, for logs and
 * tests; it returns buf. */
const char *sf_sdpa_plan_describe(const sf_sdpa_plan *p, char *buf, size_t len);
#ifdef __cplusplus
}
#endif
