/* gpu/cuda/program.h — what a standalone program that drives the CUDA
 * launchers directly shares: the GPU tests (tests/gpu, whose harness
 * gpu_test.h builds on this) and the CUDA benchmarks in bench/. No part of the
 * service includes it: its helpers end the program on a CUDA error, which a
 * request path must never do (gpu/cuda/check.h is the service's way).
 *
 * It holds CU (a CUDA call that exits naming the call and file:line), device
 * buffers (dalloc, up, down, poison), device 0's blocking stream and a cuDNN
 * handle on it, the SKIPPED line a program prints without a device, and a
 * host clock. Header-only: each test or benchmark is one program. */
#ifndef SF_GPU_CUDA_PROGRAM_H
#define SF_GPU_CUDA_PROGRAM_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <vector>

#include <cuda_runtime.h>
#include <cudnn.h>

#define CU(call)                                                                                     \
    do {                                                                                             \
        cudaError_t e_ = (call);                                                                     \
        if (e_ != cudaSuccess) {                                                                     \
            printf("FAIL cuda: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

/* Monotonic nanoseconds. */
static __attribute__((unused)) uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Whether this machine has no CUDA device. Then it prints the line every GPU
 * test and benchmark prints in that case, "SKIPPED: no CUDA device", and the
 * program exits 0: make gpu-test on a machine without a GPU still builds and
 * starts every test, and reads the line. */
static __attribute__((unused)) int skip_without_device(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("SKIPPED: no CUDA device\n");
        return 1;
    }
    return 0;
}

/* Device 0 and a blocking stream on it: the programs' uploads and NaN fills
 * go through the legacy stream (cudaMemcpy, cudaMemset), which such a stream
 * waits for. */
static __attribute__((unused)) cudaStream_t test_stream(void)
{
    CU(cudaSetDevice(0));
    cudaStream_t s;
    CU(cudaStreamCreate(&s));
    return s;
}

/* A cuDNN handle on stream s, its version printed. When cuDNN does not start
 * it prints a FAIL line and the program exits 1, as CU does. */
static __attribute__((unused)) cudnnHandle_t test_cudnn(cudaStream_t s)
{
    cudnnHandle_t dnn;
    if (cudnnCreate(&dnn) != CUDNN_STATUS_SUCCESS) {
        printf("FAIL setup: cudnnCreate\n");
        exit(1);
    }
    cudnnSetStream(dnn, s);
    printf("cuDNN %zu\n", cudnnGetVersion());
    return dnn;
}

template <typename T> static T *dalloc(size_t n)
{
    T *p = NULL;
    CU(cudaMalloc((void **)&p, (n ? n : 1) * sizeof(T)));
    return p;
}

template <typename T> static void up(T *d, const std::vector<T> &h)
{
    CU(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T> static std::vector<T> down(const T *d, size_t n)
{
    std::vector<T> h(n);
    CU(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

/* All-ones bytes: a float NaN, a bf16 NaN, an integer -1. */
static __attribute__((unused)) void poison(void *d, size_t bytes) { CU(cudaMemset(d, 0xff, bytes)); }

#endif
