/* gpu/rng.h — counter-based random numbers, identical on host and device.
 *
 * Every random quantity in streamfeed is a pure function of a key
 * (seed, stream, counter...), never of a generator's hidden state, so the CUDA
 * and reference backends compute the same augmentation from the same key and a
 * run is reproducible regardless of thread scheduling.
 *
 * The mixer is splitmix64's finaliser applied to a combination of the words;
 * it is not cryptographic, only well distributed. Header-only so that CUDA
 * kernels can include it (SF_HD marks functions for both sides).
 */
#ifndef SF_GPU_RNG_H
#define SF_GPU_RNG_H

#include <stdint.h>

#include "gpu/host_device.h"

SF_HD uint64_t sf_mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Hash of up to four 64-bit words: the key of one random draw. */
SF_HD uint64_t sf_hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    uint64_t h = sf_mix64(a);
    h = sf_mix64(h ^ b);
    h = sf_mix64(h ^ c);
    return sf_mix64(h ^ d);
}

/* A uniform float in [0, 1) from 24 high bits of a hash: exactly representable,
 * so host and device agree bit for bit. */
SF_HD float sf_u01(uint64_t h)
{
    return (float)(h >> 40) * (1.0f / 16777216.0f);
}

/* floor(u * (range + 1)) clamped to [0, range]: a uniform offset from a
 * uniform u in [0, 1). */
SF_HD int sf_offset_in(float u, int range)
{
    int v = (int)(u * (float)(range + 1));
    return v > range ? range : v < 0 ? 0 : v;
}

#endif
