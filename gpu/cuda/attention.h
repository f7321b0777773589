/* gpu/cuda/attention.h — the core of multi-head self-attention (the
 * self_attention kind between its two projections) with the attention
 * weights materialised: per head S = Q K^T / sqrt(d) through cuBLAS
 * (strided-batched over the samples, reading Q, K and V in place from the
 * packed projection), a row softmax kernel, O = P V; and the backward.
 * The executor runs it for fp32/TF32 nets, and for bf16 nets where cuDNN's
 * fused attention (sdpa.h) has no plan. Contract and element types:
 * tensor.h; semantics: sf_ref_attention_core_fwd/bwd (gpu/ref/attention.c),
 * checked by tests/gpu/ops/attention.cu.
 *
 * Shapes: n samples of t tokens, c = heads * d values per token. qkv is
 * row-major [n*t, 3c] as nn.MultiheadAttention's in_proj makes it (q at
 * column 0, k at c, v at 2c; head j at columns j*d of each); o is [n*t, c]
 * (head j at columns j*d). p, the attention weights, is [n, heads, t, t] of
 * the activations' type, kept from the forward for the backward. s is fp32
 * scratch of sf_attn_s_floats: the scores before the softmax, and in the
 * backward dP. bf16 operands multiply on tensor cores with fp32 accumulation;
 * fp32 with tf32 uses TF32 tensor cores. The row reductions run in a fixed
 * order (deterministic). The cuBLAS handle must be bound to stream st.
 */
#ifndef SF_GPU_CUDA_ATTENTION_H
#define SF_GPU_CUDA_ATTENTION_H

#include <stddef.h>

#include <cublas_v2.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements of p (and floats of s) for this shape: n * heads * t * t. */
size_t sf_attn_p_elems(int n, int t, int heads);

/* o = softmax(q k^T / sqrt(d)) v per sample and head; p keeps the weights. */
int sf_attn_core_fwd(cublasHandle_t h, sf_dtype dt, const void *qkv, int n, int t, int c, int heads, float *s,
                     void *p, void *o, int tf32, cudaStream_t st);

/* dqkv (overwritten, packed as qkv) from d_o [n*t, c]: dV = P^T dO,
 * dP = dO V^T, dS = P * (dP - rowsum(P * dP)), dQ = dS K / sqrt(d),
 * dK = dS^T Q / sqrt(d). p is consumed (it holds dS afterwards). */
int sf_attn_core_bwd(cublasHandle_t h, sf_dtype dt, const void *qkv, void *p, const void *d_o, int n, int t, int c,
                     int heads, float *s, void *dqkv, int tf32, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_ATTENTION_H */
