/* gpu/host_device.h — SF_HD marks a header-only function that the reference
 * backend (plain C) and the CUDA kernels both call: host and device under
 * nvcc, static inline elsewhere. Included by the headers whose rules must be
 * the same on both sides (gpu/rng.h, gpu/upsample_rule.h). */
#ifndef SF_GPU_HOST_DEVICE_H
#define SF_GPU_HOST_DEVICE_H

#ifdef __CUDACC__
#define SF_HD __host__ __device__ __forceinline__
#else
#define SF_HD static inline
#endif

#endif /* SF_GPU_HOST_DEVICE_H */
