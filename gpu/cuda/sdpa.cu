/* gpu/cuda/sdpa.cu — cuDNN's fused attention is not built into this tree:
 * every plan request fails, so the executor runs its materialised attention
 * core (attention.h). */
#include "sdpa.h"

#include <stdio.h>

extern "C" int sf_sdpa_plan_create(sf_sdpa_plan **out, cudnnHandle_t h, int n, int t, int heads, int head_dim,
                                   size_t *ws_bytes, char *err, size_t errlen)
{
    (void)h;
    (void)n;
    (void)t;
    (void)heads;
    (void)head_dim;
    *out = NULL;
    if (ws_bytes)
        *ws_bytes = 0;
    snprintf(err, errlen, "cuDNN SDPA is not built");
    return -1;
}

extern "C" void sf_sdpa_plan_destroy(sf_sdpa_plan *p) { (void)p; }

extern "C" int sf_sdpa_fwd(sf_sdpa_plan *p, cudnnHandle_t h, const void *qkv, void *o, float *stats, void *ws,
                           cudaStream_t s)
{
    return -1;
}

extern "C" int sf_sdpa_bwd(sf_sdpa_plan *p, cudnnHandle_t h, const void *qkv, const void *o, const void *d_o,
                           const float *stats, void *dqkv, void *ws, cudaStream_t s)
{
    return -1;
}
