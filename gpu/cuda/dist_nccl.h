/* gpu/cuda/dist_nccl.h — the CUDA backend's gradient all-reduce between the
 * ranks of a data-parallel job (NCCL), and the parameter digest on the device.
 *
 * NCCL is loaded at run time (dlopen "libnccl.so.2") when a job of more than
 * one rank builds its communicator, so a single-GPU process (world_size 1)
 * neither needs the library nor calls it. The communicator is made from the
 * job's store (dist/collective.h): rank 0 puts ncclGetUniqueId's id under
 * the key "nccl.id", the others get it, then ncclCommInitRankConfig
 * (non-blocking, bounded by the job's timeout).
 */
#ifndef SF_GPU_CUDA_DIST_NCCL_H
#define SF_GPU_CUDA_DIST_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "dist/collective.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sf_nccl sf_nccl;

/* Joins the NCCL communicator of d's job on the current device. 0, or -1
 * with err (no NCCL, the id never came, the init timed out). */
int sf_nccl_new(sf_nccl **out, const sf_dist *d, char *err, size_t errlen);
/* Enqueues on s: grad[0..len) *= *d_share (this rank's n / global_n, in
 * device memory so a captured graph reads each step's value), then the SUM
 * all-reduce in place. */
int sf_nccl_allreduce(sf_nccl *x, float *grad, size_t len, const float *d_share, cudaStream_t s);
/* 0 healthy; else the communicator's asynchronous error, in err. */
int sf_nccl_check(sf_nccl *x, char *err, size_t errlen);
/* Ends every NCCL operation of the communicator (a peer died or timed out):
 * kernels waiting on a peer return, the communicator is unusable. */
void sf_nccl_abort(sf_nccl *x);
void sf_nccl_free(sf_nccl *x);

/* A digest of n floats of device memory: the XOR over i of a 64-bit mix of
 * (i, the float's bits), so any changed bit changes it and the order of the
 * reduction does not. Synchronous on s. */
int sf_cuda_digest(const float *d, size_t n, uint64_t *out, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
