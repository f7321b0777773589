/* gpu/cuda/dist_nccl.h — the CUDA backend's gradient all-reduce between the
 * ranks of a data-parallel job (NCCL), and the parameter digest on the device.
 *
 * NCCL is loaded at run time (dlopen "libnccl.so.2") when a data-parallel
 * job's model is built (sf_nccl_open), so a single-GPU process (world_size 1,
 * no job) neither needs the library nor calls it. The communicator is made
 * at the job's first round (sf_nccl_join) from the job's store
 * (dist/collective.h): rank 0 puts ncclGetUniqueId's id under the key
 * "nccl.id", the others get it, then ncclCommInitRankConfig (non-blocking,
 * bounded by the job's timeout).
 *
 * The gradients the all-reduce sums live in memory from sf_nccl_alloc:
 * ncclMemAlloc's (CUDA virtual memory that NCCL can map into the peers'
 * address spaces), which the join registers as symmetric windows
 * (ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC) once every rank has
 * said that all of its blocks are such memory. NCCL's kernels for windows
 * read the peer's half of each bucket straight over NVLink and write the sum
 * into both, instead of passing it through the communicator's own buffers:
 * fewer thread blocks beside the backward and less memory traffic
 * (bench/results/2026-11-27-h200x2-w1-symmetric-windows.md). Where the
 * library predates windows (NCCL < 2.27, at run time or in the nccl.h of
 * the build) the blocks are cudaMalloc's; where ncclMemAlloc fails on any
 * rank, no rank registers windows, and every rank runs the ordinary kernels.
 * The communicator owns the windows: they go with it, and the blocks are
 * freed after it (sf_nccl_free), never while a peer may still map them.
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

/* Loads NCCL for a data-parallel job on the current device: 0, or -1 with
 * err (no libnccl.so.2). No communicator yet. */
int sf_nccl_open(sf_nccl **out, char *err, size_t errlen);
/* The executor's gradient memory (sf_net_cfg.grad_alloc): bytes of device
 * memory in *p that stay valid until sf_nccl_free, registered as a window
 * at the join. Only before the join (the registration is collective). 0, or
 * -1 with sf_cuda_last_error() set. */
int sf_nccl_alloc(void *x, void **p, size_t bytes);
/* Joins the NCCL communicator of d's job and registers the blocks of
 * sf_nccl_alloc as symmetric windows where every rank can. 0, or -1 with err
 * (the id never came, the init or the registration failed or timed out). */
int sf_nccl_join(sf_nccl *x, const sf_dist *d, char *err, size_t errlen);
/* 1 once sf_nccl_join has succeeded, until the communicator is aborted. */
int sf_nccl_joined(const sf_nccl *x);
/* One line for the backend's plan: the library's version and where the
 * gradients are (symmetric windows, or why not). */
void sf_nccl_describe(const sf_nccl *x, char *buf, size_t len);
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
/* The communicator (finalized, or aborted if that does not complete), then
 * the blocks of sf_nccl_alloc: after the net that used them is destroyed. */
void sf_nccl_free(sf_nccl *x);

/* A digest of n floats of device memory: the XOR over i of a 64-bit mix of
 * (i, the float's bits), so any changed bit changes it and the order of the
 * reduction does not. Synchronous on s. */
int sf_cuda_digest(const float *d, size_t n, uint64_t *out, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
