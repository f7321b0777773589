/* gpu/cuda/dist_nccl.h — the CUDA backend's gradient all-reduce between the
 * ranks of a data-parallel job (NCCL), and the parameter digest on the device.
 *
 * NCCL is loaded at run time (dlopen "libnccl.so.2") when a data-parallel
 * job's model is built (sf_nccl_open), so a single-GPU process (world_size 1,
 * no job) neither needs the library nor calls it. The communicator is made
 * at the job's first round (sf_nccl_join) from the job's store
 * (collective/collective.h): rank 0 puts ncclGetUniqueId's id under the key
 * "nccl.id", the others get it, then ncclCommInitRankConfig (non-blocking,
 * bounded by the job's timeout).
 *
 * The gradients are summed in place, in the executor's own device memory.
 * They are not registered as NCCL symmetric windows (ncclMemAlloc +
 * ncclCommWindowRegister), although NCCL's window kernels took 2-3 % off a
 * two-rank W1 step: on two H200s with NCCL 2.28.3 the in-place window
 * all-reduce of bf16 gradients left the ranks with different sums (W1 and
 * ResNet-18 in bf16 diverged from the tenth step; the same runs without
 * windows, NCCL_WIN_ENABLE=0, stayed bit-identical), and ranks that drift
 * apart train no model at all.
 */
#ifndef SF_GPU_CUDA_DIST_NCCL_H
#define SF_GPU_CUDA_DIST_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "collective/collective.h"
#include "gpu/cuda/executor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sf_nccl sf_nccl;

/* Loads NCCL for a data-parallel job on the current device: 0, or -1 with
 * err (no libnccl.so.2). No communicator yet. */
int sf_nccl_open(sf_nccl **out, char *err, size_t errlen);
/* Joins the NCCL communicator of d's job. 0, or -1 with err (the id never
 * came, the init failed or timed out). */
int sf_nccl_join(sf_nccl *x, const sf_dist *d, char *err, size_t errlen);
/* 1 once sf_nccl_join has succeeded, until the communicator is aborted or left. */
int sf_nccl_joined(const sf_nccl *x);
/* One line for the backend's plan: the library's version and how the
 * gradients are summed. */
void sf_nccl_describe(const sf_nccl *x, char *buf, size_t len);
/* Enqueues on s the SUM all-reduce, in place, of the n pieces (fp32 or
 * bf16, each summed in its own type), as one NCCL group. Returns once NCCL
 * has enqueued it (a non-blocking communicator's ncclInProgress is waited
 * out, bounded by the job's timeout). */
int sf_nccl_allreduce(sf_nccl *x, const sf_grad_piece *pieces, int n, cudaStream_t s);
/* Enqueues on s the SUM all-reduce, in place, of n doubles (a batchnorm's
 * per-channel sums under distributed.batchnorm sync). Returns once NCCL has
 * enqueued it, as sf_nccl_allreduce. */
int sf_nccl_allreduce_f64(sf_nccl *x, double *p, size_t n, cudaStream_t s);
/* Enqueues on s the broadcast, in place, of n floats from rank root to
 * every rank (batchnorm's running statistics, distributed.batchnorm
 * broadcast). Returns once NCCL has enqueued it, as sf_nccl_allreduce. */
int sf_nccl_broadcast(sf_nccl *x, float *p, size_t n, int root, cudaStream_t s);
/* 0 healthy; else the communicator's asynchronous error, in err. */
int sf_nccl_check(sf_nccl *x, char *err, size_t errlen);
/* Ends every NCCL operation of the communicator (a peer died or timed out):
 * kernels waiting on a peer return, the communicator is unusable. */
void sf_nccl_abort(sf_nccl *x);
/* The job ended for this rank; no other communicator is made. NCCL tears a
 * communicator down with every rank of the host taking part, so:
 * together (every rank leaves in this round): finalized and destroyed now
 * (aborted if that does not complete within 10 s), with the other ranks;
 * otherwise (the job failed, a peer may be dead or stopped): never torn
 * down, not even by sf_nccl_free, since a teardown could wait for that peer
 * for good; its resources go with the process. */
void sf_nccl_leave(sf_nccl *x, int together);
/* The communicator (finalized, or aborted if that does not complete). */
void sf_nccl_free(sf_nccl *x);

/* A digest of n floats of device memory: the XOR over i of a 64-bit mix of
 * (i, the float's bits), so any changed bit changes it and the order of the
 * reduction does not. Synchronous on s. */
int sf_cuda_digest(const float *d, size_t n, uint64_t *out, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
