/* gpu/cuda/timing.cuh — how the planners time a candidate (a fused conv
 * plan, a depthwise kernel, a cuBLASLt algorithm) before choosing it: the
 * best of three runs on one stream, bracketed by events. C++ only (.cu). */
#ifndef SF_GPU_CUDA_TIMING_CUH
#define SF_GPU_CUDA_TIMING_CUH

#include <cuda_runtime.h>

/* Milliseconds of run() on stream s, the best of 3; 0 when it cannot be
 * timed. run() enqueues its work on s. */
template <class F> static float sf_time_best3(cudaStream_t s, F run)
{
    cudaEvent_t e[2];
    if (cudaEventCreate(&e[0]) != cudaSuccess)
        return 0.f;
    if (cudaEventCreate(&e[1]) != cudaSuccess) {
        cudaEventDestroy(e[0]);
        return 0.f;
    }
    float best = 1e30f;
    for (int r = 0; r < 3; r++) {
        float ms = 0.f;
        cudaEventRecord(e[0], s);
        run();
        cudaEventRecord(e[1], s);
        if (cudaEventSynchronize(e[1]) == cudaSuccess && cudaEventElapsedTime(&ms, e[0], e[1]) == cudaSuccess &&
            ms < best)
            best = ms;
    }
    cudaEventDestroy(e[0]);
    cudaEventDestroy(e[1]);
    return best < 1e30f ? best : 0.f;
}

#endif /* SF_GPU_CUDA_TIMING_CUH */
