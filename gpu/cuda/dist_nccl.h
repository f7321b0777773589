/* gpu/cuda/dist_nccl.h — the CUDA backend's gradient all-reduce between the
 * ranks of a data-parallel job (NCCL), and the parameter digest on the device.
 *
 * NCCL is loaded at run time (dlopen "libnccl.so.2") when a data-parallel
 * job builds its communicator, so a single-GPU process (world_size 1, no
 * job) neither needs the library nor calls it. The communicator is made from the
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
#include "gpu/cuda/executor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sf_nccl sf_nccl;

/* Joins the NCCL communicator of d's job on the current device. 0, or -1
 * with err (no NCCL, the id never came, the init timed out). */
int sf_nccl_new(sf_nccl **out, const sf_dist *d, char *err, size_t errlen);
/* Enqueues on s the SUM all-reduce, in place, of the n pieces (fp32 or
 * bf16, each summed in its own type), as one NCCL group. Returns once NCCL
 * has enqueued it (a non-blocking communicator's ncclInProgress is waited
 * out, bounded by the job's timeout). */
int sf_nccl_allreduce(sf_nccl *x, const sf_grad_piece *pieces, int n, cudaStream_t s);
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
