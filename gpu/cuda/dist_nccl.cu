/* gpu/cuda/dist_nccl.cu — see dist_nccl.h. Kernels first, then NCCL. */
#include "gpu/cuda/dist_nccl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/cuda/check.h"

#if __has_include(<nccl.h>)
#include <nccl.h>
#define SF_HAVE_NCCL_H 1
#endif

/* ---- kernels --------------------------------------------------------------------- */

__device__ static unsigned long long mix64(unsigned long long z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void k_digest(const float *d, size_t n, unsigned long long *out)
{
    unsigned long long h = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        h ^= mix64(((unsigned long long)i << 32) ^ (unsigned long long)__float_as_uint(d[i]) ^ 0x9e3779b97f4a7c15ull);
    if (h)
        atomicXor(out, h);
}

static unsigned grid_for(size_t len)
{
    size_t g = (len + 255) / 256;
    return (unsigned)(g < 1 ? 1 : (g > 1024 ? 1024 : g));
}

extern "C" int sf_cuda_digest(const float *d, size_t n, uint64_t *out, cudaStream_t s)
{
    unsigned long long *dv = NULL, hv = 0;
    SF_CUDA_CHECK(cudaMallocAsync((void **)&dv, sizeof *dv, s));
    cudaError_t e = cudaMemsetAsync(dv, 0, sizeof *dv, s);
    if (e == cudaSuccess && n) {
        k_digest<<<grid_for(n), 256, 0, s>>>(d, n, dv);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(&hv, dv, sizeof hv, cudaMemcpyDeviceToHost, s);
    cudaFreeAsync(dv, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    SF_CUDA_CHECK(e);
    *out = hv;
    return 0;
}

/* ---- NCCL ------------------------------------------------------------------------- */

#ifdef SF_HAVE_NCCL_H
/* The few entry points used, from the library loaded at run time. */
typedef struct nccl_api {
    void *lib;
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init_config)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*abort_comm)(ncclComm_t);
    ncclResult_t (*finalize)(ncclComm_t);
    ncclResult_t (*destroy)(ncclComm_t);
    const char *(*error_string)(ncclResult_t);
    ncclResult_t (*get_version)(int *);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
} nccl_api;

struct sf_nccl {
    nccl_api api;
    ncclComm_t comm; /* NULL until sf_nccl_join, and again after sf_nccl_leave */
    int aborted;
    int left;      /* sf_nccl_leave: the job ended for this rank */
    int abandoned; /* left when the job failed: never torn down (see sf_nccl_leave) */
    int timeout_ms;
};

static int load_api(nccl_api *a, char *err, size_t errlen)
{
    a->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!a->lib) {
        snprintf(err, errlen, "cuda: data-parallel training needs NCCL: %s", dlerror());
        return -1;
    }
#define SYM(field, name)                                                                                     \
    do {                                                                                                       \
        *(void **)&a->field = dlsym(a->lib, name);                                                             \
        if (!a->field) {                                                                                       \
            snprintf(err, errlen, "cuda: libnccl.so.2 has no %s", name);                                       \
            return -1;                                                                                         \
        }                                                                                                      \
    } while (0)
    SYM(get_unique_id, "ncclGetUniqueId");
    SYM(init_config, "ncclCommInitRankConfig");
    SYM(async_error, "ncclCommGetAsyncError");
    SYM(all_reduce, "ncclAllReduce");
    SYM(group_start, "ncclGroupStart");
    SYM(group_end, "ncclGroupEnd");
    SYM(abort_comm, "ncclCommAbort");
    SYM(finalize, "ncclCommFinalize");
    SYM(destroy, "ncclCommDestroy");
    SYM(error_string, "ncclGetErrorString");
    SYM(get_version, "ncclGetVersion");
    SYM(broadcast, "ncclBroadcast");
#undef SYM
    return 0;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A non-blocking communicator's call (r, what it returned) completes in the
 * background: its state, read every millisecond, leaves ncclInProgress with
 * the outcome. ncclSuccess, its error, or ncclSystemError after timeout_ms. */
static ncclResult_t await_comm(sf_nccl *x, ncclResult_t r, int timeout_ms)
{
    const uint64_t end = now_ms() + (uint64_t)timeout_ms;
    while (r == ncclSuccess || r == ncclInProgress) {
        ncclResult_t st = ncclInProgress;
        if (x->api.async_error(x->comm, &st) != ncclSuccess)
            st = ncclSystemError;
        if (st != ncclInProgress)
            return st;
        if (now_ms() >= end)
            return ncclSystemError;
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    return r;
}

extern "C" int sf_nccl_open(sf_nccl **out, char *err, size_t errlen)
{
    *out = NULL;
    sf_nccl *x = (sf_nccl *)calloc(1, sizeof *x);
    if (!x) {
        snprintf(err, errlen, "cuda: out of memory");
        return -1;
    }
    if (load_api(&x->api, err, errlen) != 0) {
        sf_nccl_free(x);
        return -1;
    }
    *out = x;
    return 0;
}

extern "C" int sf_nccl_join(sf_nccl *x, const sf_dist *d, char *err, size_t errlen)
{
    if (x->comm || x->left) {
        snprintf(err, errlen, "cuda: %s", x->left ? "this rank left its data-parallel job (it ended)"
                                                  : "the NCCL communicator is made already");
        return -1;
    }
    x->timeout_ms = d->timeout_ms;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r;
    if (d->rank == 0) {
        if ((r = x->api.get_unique_id(&id)) != ncclSuccess || d->store->set(d->store->ctx, "nccl.id", &id, sizeof id)) {
            snprintf(err, errlen, "cuda: publishing the NCCL unique id failed: %s",
                     r != ncclSuccess ? x->api.error_string(r) : "the store refused it");
            return -1;
        }
    } else {
        size_t len = 0;
        if (d->store->get(d->store->ctx, "nccl.id", &id, sizeof id, &len, d->timeout_ms) != 0 || len != sizeof id) {
            snprintf(err, errlen, "cuda: rank 0's NCCL unique id did not arrive within %d s", d->timeout_ms / 1000);
            return -1;
        }
    }
    /* Non-blocking, so that a rank that never comes is a timeout here, not a hang. */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    r = await_comm(x, x->api.init_config(&x->comm, d->world, id, d->rank, &cfg), d->timeout_ms);
    if (r != ncclSuccess) {
        snprintf(err, errlen, "cuda: ncclCommInitRankConfig (rank %d of %d) failed or timed out: %s", d->rank,
                 d->world, x->api.error_string(r));
        sf_nccl_abort(x);
        return -1;
    }
    return 0;
}

extern "C" int sf_nccl_joined(const sf_nccl *x) { return x && x->comm && !x->aborted && !x->left; }

extern "C" void sf_nccl_describe(const sf_nccl *x, char *buf, size_t len)
{
    int v = 0;
    if (x->api.get_version(&v) != ncclSuccess)
        v = 0;
    snprintf(buf, len,
             "gradient all-reduce: NCCL %d.%d.%d, in place in ordinary device memory (no symmetric windows: "
             "dist_nccl.h says why)\n",
             v / 10000, v / 100 % 100, v % 100);
}

/* Waits out a non-blocking communicator's ncclInProgress (the call is still
 * being enqueued, e.g. its first use of a connection): the next call may only
 * come once it has. Bounded by the job's timeout. */
static int settle(sf_nccl *x, ncclResult_t r, const char *what)
{
    const uint64_t end = now_ms() + (uint64_t)x->timeout_ms;
    while (r == ncclInProgress) {
        ncclResult_t st = ncclInProgress;
        if (x->api.async_error(x->comm, &st) != ncclSuccess)
            st = ncclSystemError;
        if (st != ncclInProgress) {
            r = st;
            break;
        }
        if (now_ms() >= end) {
            sf_cuda_set_error("%s:%d: %s still in progress after %d ms", __FILE__, __LINE__, what, x->timeout_ms);
            return -1;
        }
        struct timespec ts = {0, 100000L};
        nanosleep(&ts, NULL);
    }
    if (r != ncclSuccess) {
        sf_cuda_set_error("%s:%d: %s: %s", __FILE__, __LINE__, what, x->api.error_string(r));
        return -1;
    }
    return 0;
}

extern "C" int sf_nccl_allreduce(sf_nccl *x, const sf_grad_piece *pieces, int n, cudaStream_t s)
{
    if (x->aborted || !x->comm) {
        sf_cuda_set_error("%s:%d: NCCL communicator %s", __FILE__, __LINE__, x->comm ? "aborted" : "not made yet");
        return -1;
    }
    /* One group: NCCL fuses the pieces' reductions into one launch. */
    if (settle(x, x->api.group_start(), "ncclGroupStart"))
        return -1;
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); i++) {
        const ncclDataType_t t = pieces[i].dt == SF_DT_BF16 ? ncclBfloat16 : ncclFloat32;
        r = x->api.all_reduce(pieces[i].p, pieces[i].p, pieces[i].len, t, ncclSum, x->comm, s);
    }
    const ncclResult_t re = x->api.group_end();
    if (r != ncclSuccess && r != ncclInProgress) {
        sf_cuda_set_error("%s:%d: ncclAllReduce: %s", __FILE__, __LINE__, x->api.error_string(r));
        return -1;
    }
    return settle(x, re, "ncclGroupEnd (the bucket's all-reduce)");
}

extern "C" int sf_nccl_allreduce_f64(sf_nccl *x, double *p, size_t n, cudaStream_t s)
{
    if (x->aborted || !x->comm) {
        sf_cuda_set_error("%s:%d: NCCL communicator %s", __FILE__, __LINE__, x->comm ? "aborted" : "not made yet");
        return -1;
    }
    return settle(x, x->api.all_reduce(p, p, n, ncclFloat64, ncclSum, x->comm, s),
                  "ncclAllReduce (a batchnorm's sums)");
}

extern "C" int sf_nccl_broadcast(sf_nccl *x, float *p, size_t n, int root, cudaStream_t s)
{
    if (x->aborted || !x->comm) {
        sf_cuda_set_error("%s:%d: NCCL communicator %s", __FILE__, __LINE__, x->comm ? "aborted" : "not made yet");
        return -1;
    }
    return settle(x, x->api.broadcast(p, p, n, ncclFloat32, root, x->comm, s), "ncclBroadcast");
}

extern "C" int sf_nccl_check(sf_nccl *x, char *err, size_t errlen)
{
    if (!x->comm) {
        snprintf(err, errlen, "the NCCL communicator is not made yet");
        return -1;
    }
    if (x->aborted) {
        snprintf(err, errlen, "the NCCL communicator was aborted (a peer died or timed out)");
        return -1;
    }
    ncclResult_t st = ncclSuccess;
    if (x->api.async_error(x->comm, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
        snprintf(err, errlen, "NCCL: %s", x->api.error_string(st));
        return -1;
    }
    return 0;
}

extern "C" void sf_nccl_abort(sf_nccl *x)
{
    if (x && x->comm && !x->aborted) {
        x->api.abort_comm(x->comm);
        x->aborted = 1;
    }
}

/* A healthy communicator is finalized (its operations flushed) before it is
 * destroyed, which a non-blocking one does in the background: waited for up
 * to NCCL_FINALIZE_MS, then aborted, so that process exit never waits on a
 * peer that is already gone. */
#define NCCL_FINALIZE_MS 10000

static void release(sf_nccl *x)
{
    if (x->comm && !x->aborted) {
        if (await_comm(x, x->api.finalize(x->comm), NCCL_FINALIZE_MS) == ncclSuccess)
            x->api.destroy(x->comm);
        else
            x->api.abort_comm(x->comm);
    }
    x->comm = NULL;
}

extern "C" void sf_nccl_leave(sf_nccl *x, int together)
{
    if (!x)
        return;
    if (together)
        release(x);
    else
        x->abandoned = 1;
    x->left = 1;
}

extern "C" void sf_nccl_free(sf_nccl *x)
{
    if (!x)
        return;
    /* An abandoned communicator's threads still run NCCL's code: the
     * library stays mapped, as the communicator does, until the process
     * ends. */
    if (!x->abandoned) {
        release(x);
        if (x->api.lib)
            dlclose(x->api.lib);
    }
    free(x);
}

#else /* no nccl.h at build time */

struct sf_nccl {
    int unused;
};

extern "C" int sf_nccl_open(sf_nccl **out, char *err, size_t errlen)
{
    *out = NULL;
    snprintf(err, errlen, "cuda: built without nccl.h: data-parallel training needs NCCL at build time");
    return -1;
}
extern "C" int sf_nccl_join(sf_nccl *x, const sf_dist *d, char *err, size_t errlen) { return -1; }
extern "C" int sf_nccl_joined(const sf_nccl *x) { return 0; }
extern "C" void sf_nccl_describe(const sf_nccl *x, char *buf, size_t len) { snprintf(buf, len, "\n"); }
extern "C" int sf_nccl_allreduce(sf_nccl *x, const sf_grad_piece *pieces, int n, cudaStream_t s)
{
    return -1;
}
extern "C" int sf_nccl_allreduce_f64(sf_nccl *x, double *p, size_t n, cudaStream_t s) { return -1; }
extern "C" int sf_nccl_broadcast(sf_nccl *x, float *p, size_t n, int root, cudaStream_t s) { return -1; }
extern "C" int sf_nccl_check(sf_nccl *x, char *err, size_t errlen) { return -1; }
extern "C" void sf_nccl_abort(sf_nccl *x) {}
extern "C" void sf_nccl_leave(sf_nccl *x, int together) {}
extern "C" void sf_nccl_free(sf_nccl *x) {}
#endif
