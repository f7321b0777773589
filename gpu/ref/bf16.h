/* gpu/ref/bf16.h — bfloat16 rounding, inline. Part of gpu/ref/ref.h. */
#ifndef SF_GPU_REF_BF16_H
#define SF_GPU_REF_BF16_H

#include <stddef.h>
#include <stdint.h>

/* bfloat16 as the upper 16 bits of an IEEE float, rounded to nearest even
 * (as __float2bfloat16_rn; NaN stays a quiet NaN). The reference emulates
 * model.precision=bf16 by rounding tensors through these. */
static inline uint16_t sf_bf16_bits(float f)
{
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7f800000u) == 0x7f800000u && (v.u & 0x007fffffu))
        return (uint16_t)((v.u >> 16) | 0x0040u);
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}
static inline float sf_bf16_float(uint16_t b)
{
    union { uint32_t u; float f; } v = {(uint32_t)b << 16};
    return v.f;
}
static inline float sf_bf16_round(float f) { return sf_bf16_float(sf_bf16_bits(f)); }
static inline void sf_bf16_round_n(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = sf_bf16_round(p[i]);
}

#endif
