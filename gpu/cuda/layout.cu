/* gpu/cuda/layout.cu — the batched transpose kernel and its launcher, and the
 * pointer alignment query. Contracts in layout.h and tensor.h. */
#include "gpu/cuda/layout.h"

#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* Batched transpose through a padded shared-memory tile. */
__global__ void k_transpose(const float *__restrict__ src, float *__restrict__ dst, int rows, int cols)
{
    __shared__ float tile[32][33];
    const size_t b = blockIdx.z;
    const float *s = src + b * (size_t)rows * cols;
    float *d = dst + b * (size_t)rows * cols;
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        const int r = r0 + k, c = c0 + threadIdx.x;
        if (r < rows && c < cols)
            tile[k][threadIdx.x] = s[(size_t)r * cols + c];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        const int c = c0 + k, r = r0 + threadIdx.x;
        if (r < rows && c < cols)
            d[(size_t)c * rows + r] = tile[threadIdx.x][k];
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

extern "C" int sf_cuda_ptr_align(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int al = 16;
    while (al > 1 && (a % (uintptr_t)al) != 0)
        al >>= 1;
    return al;
}

extern "C" int sf_cuda_transpose(const float *src, float *dst, int batch, int rows, int cols,
                                 cudaStream_t s)
{
    if (batch <= 0 || rows <= 0 || cols <= 0)
        return 0;
    for (int b0 = 0; b0 < batch; b0 += 65535) {
        const int nb = batch - b0 < 65535 ? batch - b0 : 65535;
        const size_t off = (size_t)b0 * rows * cols;
        dim3 grid((unsigned)((cols + 31) / 32), (unsigned)((rows + 31) / 32), (unsigned)nb);
        k_transpose<<<grid, dim3(32, 8), 0, s>>>(src + off, dst + off, rows, cols);
        SF_CUDA_CHECK_LAUNCH();
    }
    return 0;
}
