/* gpu/pool_rule.h — a pooling window's output size by PyTorch's rule
 * (max_pool2d and avg_pool2d, ceil_mode included), one definition for the
 * layer's shape inference (gpu/layers.c) and the CUDA launchers
 * (gpu/cuda/pool.cu), so the two cannot disagree on a boundary size. */
#ifndef SF_GPU_POOL_RULE_H
#define SF_GPU_POOL_RULE_H

#include "gpu/host_device.h"

/* PyTorch's pooling_output_shape: floor((in + 2p - k + (ceil ? s-1 : 0)) / s) + 1,
 * the division rounding down, then with ceil_mode one less if the last
 * window would start past the input and its left padding. So with ceil_mode
 * a kernel larger than the input still gives one window (a 2x2 map, kernel 3,
 * stride 2: one output over the whole map), and a size below 1 (the kernel
 * does not fit at all) is what PyTorch refuses as "output size is too small". */
SF_HD int sf_pool_out_size(int in, int k, int s, int p, int ceil_mode)
{
    const int num = in + 2 * p - k + (ceil_mode ? s - 1 : 0);
    if (num < 0 || s < 1)
        return 0; /* floor(num / s) + 1 <= 0 */
    int out = num / s + 1;
    if (ceil_mode && (out - 1) * s >= in + p)
        out--;
    return out;
}

#endif /* SF_GPU_POOL_RULE_H */
