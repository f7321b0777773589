/* gpu/cuda/tokens.h — the token-sequence layers of a Vision Transformer
 * (to_tokens, class_token, pos_embedding, select_token), forward and
 * backward. Contract and element types: tensor.h; semantics: gpu/ref/tokens.c
 * (sf_ref_transpose, sf_ref_prepend_token_*, sf_ref_add_bcast_*,
 * sf_ref_select_token_*), checked by tests/gpu/ops/tokens.cu.
 *
 * A token sequence is [n, t, c], token-major (the c values of a token are
 * contiguous), which is a [c, t, 1] map stored NHWC. Activations are of type
 * dt; the parameters (the class token [c], the position embedding [t*c]) and
 * their gradients are fp32. The parameter gradients are sums over the batch
 * in sample order, one thread per element (no atomics: equal inputs give
 * bit-equal gradients), and are overwritten.
 */
#ifndef SF_GPU_CUDA_TOKENS_H
#define SF_GPU_CUDA_TOKENS_H

#include <stddef.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A map x [n, c, hw] in layout lay as tokens y [n, hw, c]: a transpose per
 * sample for NCHW, a copy for NHWC (the bytes are already token-major). */
int sf_cuda_tokens_from_map_dt(sf_dtype dt, sf_layout lay, const void *x, int n, int c, size_t hw, void *y,
                               cudaStream_t s);
/* The backward: tokens dy [n, hw, c] to the map's gradient dx in layout lay. */
int sf_cuda_tokens_to_map_dt(sf_dtype dt, sf_layout lay, const void *dy, int n, int c, size_t hw, void *dx,
                             cudaStream_t s);

/* y [n, t+1, c]: token 0 is cls (fp32 [c]), tokens 1.. are x [n, t, c]. */
int sf_cuda_prepend_token_fwd_dt(sf_dtype dt, const void *x, int n, int t, int c, const float *cls, void *y,
                                 cudaStream_t s);
/* dx [n, t, c] = dy's tokens 1.. (dx may be NULL); dcls [c] = the sum over
 * the samples of dy's token 0 (NULL: not wanted). */
int sf_cuda_prepend_token_bwd_dt(sf_dtype dt, const void *dy, int n, int t, int c, void *dx, float *dcls,
                                 cudaStream_t s);

/* y[n][e] = x[n][e] + p[e] over [n, len] (p fp32, broadcast over samples). */
int sf_cuda_add_bcast_fwd_dt(sf_dtype dt, const void *x, int n, size_t len, const float *p, void *y,
                             cudaStream_t s);
/* dp[e] = sum over the samples of dy[n][e] (the input's gradient is dy). */
int sf_cuda_add_bcast_bwd_dt(sf_dtype dt, const void *dy, int n, size_t len, float *dp, cudaStream_t s);

/* y [n, c] = token 0 of x [n, t, c]. */
int sf_cuda_select_token_fwd_dt(sf_dtype dt, const void *x, int n, int t, int c, void *y, cudaStream_t s);
/* dx [n, t, c]: token 0 is dy [n, c], every other token 0. */
int sf_cuda_select_token_bwd_dt(sf_dtype dt, const void *dy, int n, int t, int c, void *dx, cudaStream_t s);

/* y [n, c] = the mean of tokens start..t-1 of x [n, t, c] (start < t). */
int sf_cuda_token_mean_fwd_dt(sf_dtype dt, const void *x, int n, int t, int c, int start, void *y,
                              cudaStream_t s);
/* dx [n, t, c]: dy / (t - start) on tokens start..t-1, 0 on the others. */
int sf_cuda_token_mean_bwd_dt(sf_dtype dt, const void *dy, int n, int t, int c, int start, void *dx,
                              cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_TOKENS_H */
