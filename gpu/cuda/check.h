/* gpu/cuda/check.h — one check macro per GPU library (CUDA runtime, cuDNN, cuBLAS).
 *
 * Contract: each macro evaluates `call` once; on failure it records
 *   "file:line: call: error string"
 * into a per-thread last-error buffer, readable with sf_cuda_last_error(), and then
 * `return -1;` from the enclosing function. Use them only in functions returning int
 * (0 = ok, -1 = failed); the caller turns -1 into a failed request: only start-up
 * and a lost device may end the process, so that one bad request never takes the
 * service down.
 *
 * The buffer is thread-local so concurrent request threads do not overwrite each
 * other's message; it keeps the first message after sf_cuda_clear_error() until the
 * next failure overwrites it (the most recent failure wins).
 *
 * The buffer is defined here, as a weak symbol with C linkage, so every translation
 * unit (C or CUDA-C++) that includes this header shares one definition and no .c file
 * has to own it. cuDNN / cuBLAS types are named only inside the macro bodies: include
 * <cudnn.h> / <cublas_v2.h> yourself before using SF_CUDNN_CHECK / SF_CUBLAS_CHECK.
 */
#ifndef SF_GPU_CUDA_CHECK_H
#define SF_GPU_CUDA_CHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <cuda_runtime_api.h>

#define SF_CUDA_ERR_LEN 512

#ifdef __cplusplus
extern "C" {
#endif

/* One buffer per thread, shared by all translation units (weak, C linkage). */
__attribute__((weak)) __thread char sf_cuda_err_buf[SF_CUDA_ERR_LEN];

/* The message of this thread's most recent failure, "" when none. Never NULL. */
static inline const char *sf_cuda_last_error(void) { return sf_cuda_err_buf; }

static inline void sf_cuda_clear_error(void) { sf_cuda_err_buf[0] = '\0'; }

/* Records a message in this thread's buffer (printf format); used by the macros and
 * by launchers that reject their arguments before touching the device. */
static inline void sf_cuda_set_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static inline void sf_cuda_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sf_cuda_err_buf, SF_CUDA_ERR_LEN, fmt, ap);
    va_end(ap);
}

#ifdef __cplusplus
}
#endif

#define SF_CHECK_STR2_(x) #x
#define SF_CHECK_STR_(x) SF_CHECK_STR2_(x)

/* CUDA runtime call returning cudaError_t. */
#define SF_CUDA_CHECK(call)                                                              \
    do {                                                                                 \
        cudaError_t sf_e_ = (call);                                                      \
        if (sf_e_ != cudaSuccess) {                                                      \
            sf_cuda_set_error("%s:%d: %s: %s", __FILE__, __LINE__, #call,                \
                              cudaGetErrorString(sf_e_));                                \
            return -1;                                                                   \
        }                                                                                \
    } while (0)

/* Checks the last kernel launch (configuration errors, e.g. too many threads or too
 * much shared memory). It does not synchronise: faults inside the kernel surface at
 * the next synchronising call. */
#define SF_CUDA_CHECK_LAUNCH()                                                           \
    do {                                                                                 \
        cudaError_t sf_e_ = cudaGetLastError();                                          \
        if (sf_e_ != cudaSuccess) {                                                      \
            sf_cuda_set_error("%s:%d: kernel launch: %s", __FILE__, __LINE__,            \
                              cudaGetErrorString(sf_e_));                                \
            return -1;                                                                   \
        }                                                                                \
    } while (0)

/* cuDNN call returning cudnnStatus_t (include <cudnn.h> first). */
#define SF_CUDNN_CHECK(call)                                                             \
    do {                                                                                 \
        cudnnStatus_t sf_s_ = (call);                                                    \
        if (sf_s_ != CUDNN_STATUS_SUCCESS) {                                             \
            sf_cuda_set_error("%s:%d: %s: %s", __FILE__, __LINE__, #call,                \
                              cudnnGetErrorString(sf_s_));                               \
            return -1;                                                                   \
        }                                                                                \
    } while (0)

/* cuBLAS / cuBLASLt call returning cublasStatus_t (include <cublas_v2.h> or
 * <cublasLt.h> first). */
#define SF_CUBLAS_CHECK(call)                                                            \
    do {                                                                                 \
        cublasStatus_t sf_s_ = (call);                                                   \
        if (sf_s_ != CUBLAS_STATUS_SUCCESS) {                                            \
            sf_cuda_set_error("%s:%d: %s: %s", __FILE__, __LINE__, #call,                \
                              cublasGetStatusString(sf_s_));                             \
            return -1;                                                                   \
        }                                                                                \
    } while (0)

#endif /* SF_GPU_CUDA_CHECK_H */
