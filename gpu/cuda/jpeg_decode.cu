/* gpu/cuda/jpeg_decode.cu — see jpeg_decode.h. nvJPEG does the work; this
 * file chooses its backend per batch, points its outputs into the staging
 * area and names a file nvJPEG refuses. */
#include "gpu/cuda/jpeg_decode.h"
#include "gpu/backend.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvjpeg.h>

#include "gpu/cuda/check.h"
extern "C" {
#include "gpu/ref/input.h" /* the host decode of the files nvJPEG does not take */
}

static const char *status_name(nvjpegStatus_t s)
{
    switch (s) {
    case NVJPEG_STATUS_SUCCESS: return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG: return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "architecture mismatch (no such engine on this device)";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "implementation not supported";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM: return "incomplete bitstream";
    }
    return "unknown status";
}

/* What nvJPEG allocated through the allocators below: every device and
 * pinned buffer of one backend goes through them, so that "sized once" is a
 * count that tests and describe() can read rather than a hope. Updated with
 * atomics: nvJPEG may allocate from its own threads. */
typedef struct nv_mem {
    long long device_bytes, pinned_bytes; /* held now */
    long long allocs;                     /* allocations so far */
} nv_mem;

typedef struct backend_state {
    int ok;                 /* created on this device */
    nvjpegHandle_t h;
    nvjpegJpegState_t st;
    int batch;              /* the batch size nvjpegDecodeBatchedInitialize was last called with; 0 none */
    nv_mem mem;
    char why[96];           /* why it is not available */
    char warm[96];          /* why the build-time decode failed; empty when it ran */
} backend_state;

struct sf_cuda_jpeg {
    int max_batch;
    int64_t max_pixels;
    int stages;
    uint8_t *d_out[SF_CUDA_JPEG_MAX_STAGES]; /* staging areas: 3 * max_pixels bytes each */
    uint8_t *cur;           /* the one the current decode writes */
    size_t out_cap;         /* bytes of one staging area */
    backend_state be[SF_CUDA_JPEG_BACKENDS];
    const unsigned char **data; /* [max_batch] host arrays handed to nvjpegDecodeBatched */
    size_t *lengths;
    nvjpegImage_t *dst;
    sf_cuda_jpeg_backend last;
    /* The files of the current batch nvJPEG decodes, by sample index, and
     * decoded on the host (gpu/ref/image.c: CMYK, YCCK and arithmetic-coded
     * JPEGs, which nvJPEG does not take, EXIF-turned JPEGs, PNG and WebP)
     * into a pinned buffer, then copied into the staging area on the
     * caller's stream. The buffer grows to the largest such batch seen (at
     * most 3 bytes a pixel of jpeg.max_batch_pixels; a service fed JPEGs
     * alone never needs it, so it is not sized at start) and is reused only
     * after `used` has fired. */
    int *order;             /* [max_batch] */
    int n_order;
    uint8_t *on_host;       /* [max_batch] 1: decoded on the host */
    sf_aug_sample *host_samples; /* [max_batch] the host files' parameters, src_off into h_host */
    uint8_t *h_host;        /* pinned */
    size_t h_host_cap;
    int host_decoded;       /* files the last decode decoded on the host */
    /* Completion of the last decode's work on its caller's stream (lanes
     * included): nvJPEG reuses a state's pinned and device buffers, and the
     * hybrid backends' calls return before their copies and kernels have
     * run, so the next decode waits for it on the host before its nvJPEG
     * call. The engines' calls return only when done: then it has fired. */
    cudaEvent_t used;
    int used_pending;
    long long allocs_built; /* nvJPEG allocations (all backends) when sf_cuda_jpeg_new returned */
    int borrowed;           /* d_out belongs to the decoder this one is a lane of */

    /* Lanes (sf_cuda_jpeg_new's lanes > 1): decoders of their own (nvJPEG
     * handles and states) that decode slices of one batch at the same time,
     * each on its own thread and stream, into this decoder's staging areas.
     * lane[l - 1] is lane l; lane 0 is this decoder on the caller's thread. */
    int lanes;
    sf_cuda_jpeg *lane[SF_CUDA_JPEG_MAX_LANES - 1];
    int device;
    pthread_mutex_t mu;
    pthread_cond_t go, fin;
    unsigned gen;           /* a new job for the lanes */
    int pending, quit;
    cudaEvent_t fork;       /* on the caller's stream: the lanes' streams start after it */

    /* As a lane: its thread, stream, the slice it decodes and how that went. */
    sf_cuda_jpeg *owner;
    pthread_t th;
    int has_th;
    cudaStream_t lst;
    cudaEvent_t ldone;
    int job_k, job_i0, job_n;
    const sf_batch *job_b;
    nvjpegStatus_t job_rc;
};

static const nvjpegBackend_t NV_BACKEND[SF_CUDA_JPEG_BACKENDS] = {
    NVJPEG_BACKEND_DEFAULT, NVJPEG_BACKEND_HARDWARE, NVJPEG_BACKEND_GPU_HYBRID, NVJPEG_BACKEND_HYBRID};

const char *sf_cuda_jpeg_backend_name(sf_cuda_jpeg_backend be)
{
    switch (be) {
    case SF_CUDA_JPEG_HARDWARE: return "hardware";
    case SF_CUDA_JPEG_GPU_HYBRID: return "gpu_hybrid";
    case SF_CUDA_JPEG_HYBRID: return "hybrid";
    default: return "auto";
    }
}

/* nvJPEG's allocators (the V2 form carries a context: the backend's nv_mem).
 * Plain cudaMalloc and cudaHostAlloc, as nvJPEG's defaults; they only count.
 * Returns 0 on success, as nvJPEG expects. */
static int mem_dev_malloc(void *ctx, void **p, size_t size, cudaStream_t)
{
    if (cudaMalloc(p, size) != cudaSuccess) {
        cudaGetLastError();
        return 1;
    }
    nv_mem *m = (nv_mem *)ctx;
    __atomic_add_fetch(&m->device_bytes, (long long)size, __ATOMIC_RELAXED);
    __atomic_add_fetch(&m->allocs, 1, __ATOMIC_RELAXED);
    return 0;
}

static int mem_dev_free(void *ctx, void *p, size_t size, cudaStream_t)
{
    if (!p)
        return 0;
    __atomic_sub_fetch(&((nv_mem *)ctx)->device_bytes, (long long)size, __ATOMIC_RELAXED);
    return cudaFree(p) == cudaSuccess ? 0 : 1;
}

static int mem_pinned_malloc(void *ctx, void **p, size_t size, cudaStream_t)
{
    if (cudaHostAlloc(p, size, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        return 1;
    }
    nv_mem *m = (nv_mem *)ctx;
    __atomic_add_fetch(&m->pinned_bytes, (long long)size, __ATOMIC_RELAXED);
    __atomic_add_fetch(&m->allocs, 1, __ATOMIC_RELAXED);
    return 0;
}

static int mem_pinned_free(void *ctx, void *p, size_t size, cudaStream_t)
{
    if (!p)
        return 0;
    __atomic_sub_fetch(&((nv_mem *)ctx)->pinned_bytes, (long long)size, __ATOMIC_RELAXED);
    return cudaFreeHost(p) == cudaSuccess ? 0 : 1;
}

static long long mem_allocs(const sf_cuda_jpeg *j)
{
    long long n = 0;
    for (int k = 1; k < SF_CUDA_JPEG_BACKENDS; k++)
        n += __atomic_load_n(&j->be[k].mem.allocs, __ATOMIC_RELAXED);
    return n;
}

static void prewarm(sf_cuda_jpeg *j);

static int backend_create(sf_cuda_jpeg *j, int k)
{
    backend_state *B = &j->be[k];
    /* Interpolated chroma upsampling: libjpeg-turbo's default, so that the
     * two decoders differ by IDCT rounding only. Strict bitstreams: a damaged
     * file fails, as the reference decode fails on libjpeg-turbo's warnings,
     * rather than training as a partly grey image. */
    const unsigned flags = NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION | NVJPEG_FLAGS_BITSTREAM_STRICT;
    nvjpegDevAllocatorV2_t da = {mem_dev_malloc, mem_dev_free, &B->mem};
    nvjpegPinnedAllocatorV2_t pa = {mem_pinned_malloc, mem_pinned_free, &B->mem};
    nvjpegStatus_t s = nvjpegCreateExV2(NV_BACKEND[k], &da, &pa, flags, &B->h);
    if (s != NVJPEG_STATUS_SUCCESS) {
        B->h = NULL;
        snprintf(B->why, sizeof B->why, "%s", status_name(s));
        return -1;
    }
    if ((s = nvjpegJpegStateCreate(B->h, &B->st)) != NVJPEG_STATUS_SUCCESS) {
        snprintf(B->why, sizeof B->why, "%s", status_name(s));
        return -1;
    }
    if (k == SF_CUDA_JPEG_HARDWARE) {
        /* The engines' buffers for a full batch of average-size images, now
         * rather than at the first batch. Only an optimisation: a failure
         * leaves them to grow on first use. */
        int side = (int)sqrt((double)j->max_pixels / j->max_batch);
        if (side >= 16 && nvjpegDecodeBatchedPreAllocate(B->h, B->st, j->max_batch, side, side, NVJPEG_CSS_444,
                                                        NVJPEG_OUTPUT_RGBI) != NVJPEG_STATUS_SUCCESS)
            cudaGetLastError();
    }
    B->ok = 1;
    return 0;
}

static void backend_destroy(backend_state *B)
{
    if (B->st)
        nvjpegJpegStateDestroy(B->st);
    if (B->h)
        nvjpegDestroy(B->h);
    memset(B, 0, sizeof *B);
}

void sf_cuda_jpeg_free(sf_cuda_jpeg *j)
{
    if (!j)
        return;
    if (j->lanes > 1) {
        pthread_mutex_lock(&j->mu);
        j->quit = 1;
        pthread_cond_broadcast(&j->go);
        pthread_mutex_unlock(&j->mu);
    }
    for (int l = 0; l < SF_CUDA_JPEG_MAX_LANES - 1; l++) {
        sf_cuda_jpeg *L = j->lane[l];
        if (!L)
            continue;
        if (L->has_th)
            pthread_join(L->th, NULL);
        if (L->lst)
            cudaStreamDestroy(L->lst);
        if (L->ldone)
            cudaEventDestroy(L->ldone);
        sf_cuda_jpeg_free(L);
    }
    if (j->lanes > 1) {
        pthread_mutex_destroy(&j->mu);
        pthread_cond_destroy(&j->go);
        pthread_cond_destroy(&j->fin);
        if (j->fork)
            cudaEventDestroy(j->fork);
    }
    for (int k = 1; k < SF_CUDA_JPEG_BACKENDS; k++)
        backend_destroy(&j->be[k]);
    if (j->used)
        cudaEventDestroy(j->used);
    for (int k = 0; k < SF_CUDA_JPEG_MAX_STAGES && !j->borrowed; k++)
        cudaFree(j->d_out[k]);
    free(j->data);
    free(j->lengths);
    free(j->dst);
    free(j->order);
    free(j->on_host);
    free(j->host_samples);
    if (j->h_host)
        cudaFreeHost(j->h_host);
    free(j);
}

static sf_cuda_jpeg *jpeg_make(int max_batch, int64_t max_pixels, int stages, sf_cuda_jpeg *owner, char *err,
                               size_t errlen);
static void *lane_main(void *arg);

sf_cuda_jpeg *sf_cuda_jpeg_new(int max_batch, int64_t max_pixels, int stages, int lanes, char *err, size_t errlen)
{
    if (lanes < 1 || lanes > SF_CUDA_JPEG_MAX_LANES) {
        snprintf(err, errlen, "jpeg decode: lanes %d not in 1..%d", lanes, SF_CUDA_JPEG_MAX_LANES);
        return NULL;
    }
    sf_cuda_jpeg *j = jpeg_make(max_batch, max_pixels, stages, NULL, err, errlen);
    if (!j || lanes == 1)
        return j;
    cudaGetDevice(&j->device);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->go, NULL);
    pthread_cond_init(&j->fin, NULL);
    j->lanes = lanes;
    if (cudaEventCreateWithFlags(&j->fork, cudaEventDisableTiming) != cudaSuccess) {
        snprintf(err, errlen, "jpeg decode: event: %s", cudaGetErrorString(cudaGetLastError()));
        sf_cuda_jpeg_free(j);
        return NULL;
    }
    for (int l = 1; l < lanes; l++) {
        sf_cuda_jpeg *L = jpeg_make(max_batch, max_pixels, stages, j, err, errlen);
        if (!L) {
            sf_cuda_jpeg_free(j);
            return NULL;
        }
        j->lane[l - 1] = L;
        L->owner = j;
        if (cudaStreamCreateWithFlags(&L->lst, cudaStreamNonBlocking) != cudaSuccess ||
            cudaEventCreateWithFlags(&L->ldone, cudaEventDisableTiming) != cudaSuccess) {
            snprintf(err, errlen, "jpeg decode: lane stream: %s", cudaGetErrorString(cudaGetLastError()));
            sf_cuda_jpeg_free(j);
            return NULL;
        }
        if (pthread_create(&L->th, NULL, lane_main, L) != 0) {
            snprintf(err, errlen, "jpeg decode: could not start lane %d's thread", l);
            sf_cuda_jpeg_free(j);
            return NULL;
        }
        L->has_th = 1;
    }
    return j;
}

/* A decoder; a lane of owner (which holds the staging areas) when owner is set. */
static sf_cuda_jpeg *jpeg_make(int max_batch, int64_t max_pixels, int stages, sf_cuda_jpeg *owner, char *err,
                               size_t errlen)
{
    if (max_batch < 1 || max_pixels < 1 || stages < 1 || stages > SF_CUDA_JPEG_MAX_STAGES) {
        snprintf(err, errlen, "jpeg decode: max_batch %d and max_pixels %lld must be >= 1, stages %d in 1..%d",
                 max_batch, (long long)max_pixels, stages, SF_CUDA_JPEG_MAX_STAGES);
        return NULL;
    }
    sf_cuda_jpeg *j = (sf_cuda_jpeg *)calloc(1, sizeof *j);
    if (!j) {
        snprintf(err, errlen, "jpeg decode: out of memory");
        return NULL;
    }
    j->max_batch = max_batch;
    j->max_pixels = max_pixels;
    j->data = (const unsigned char **)calloc((size_t)max_batch, sizeof *j->data);
    j->lengths = (size_t *)calloc((size_t)max_batch, sizeof *j->lengths);
    j->dst = (nvjpegImage_t *)calloc((size_t)max_batch, sizeof *j->dst);
    j->order = (int *)calloc((size_t)max_batch, sizeof *j->order);
    j->on_host = (uint8_t *)calloc((size_t)max_batch, 1);
    j->host_samples = (sf_aug_sample *)calloc((size_t)max_batch, sizeof *j->host_samples);
    if (!j->data || !j->lengths || !j->dst || !j->order || !j->on_host || !j->host_samples) {
        snprintf(err, errlen, "jpeg decode: out of memory");
        sf_cuda_jpeg_free(j);
        return NULL;
    }
    int any = 0;
    for (int k = 1; k < SF_CUDA_JPEG_BACKENDS; k++) {
        if (backend_create(j, k) == 0) {
            any = 1;
        } else {
            char why[sizeof j->be[k].why];
            memcpy(why, j->be[k].why, sizeof why);
            backend_destroy(&j->be[k]);
            memcpy(j->be[k].why, why, sizeof why);
        }
    }
    cudaGetLastError(); /* an unavailable backend leaves no error behind */
    if (!any) {
        snprintf(err, errlen, "jpeg decode: no nvJPEG backend could be created on this device");
        sf_cuda_jpeg_free(j);
        return NULL;
    }
    j->out_cap = (size_t)max_pixels * 3;
    j->stages = stages;
    j->lanes = 1;
    if (cudaEventCreateWithFlags(&j->used, cudaEventDisableTiming) != cudaSuccess) {
        snprintf(err, errlen, "jpeg decode: event: %s", cudaGetErrorString(cudaGetLastError()));
        j->used = NULL;
        sf_cuda_jpeg_free(j);
        return NULL;
    }
    if (owner) {
        j->borrowed = 1;
        for (int k = 0; k < stages; k++)
            j->d_out[k] = owner->d_out[k];
    }
    for (int k = 0; k < stages && !owner; k++) {
        cudaError_t ce = cudaMalloc((void **)&j->d_out[k], j->out_cap);
        if (ce != cudaSuccess) {
            snprintf(err, errlen, "jpeg decode: cudaMalloc of %zu bytes for staging area %d of %d: %s", j->out_cap,
                     k + 1, stages, cudaGetErrorString(ce));
            cudaGetLastError();
            j->d_out[k] = NULL;
            sf_cuda_jpeg_free(j);
            return NULL;
        }
    }
    prewarm(j);
    j->allocs_built = mem_allocs(j);
    return j;
}

uint8_t *sf_cuda_jpeg_output(const sf_cuda_jpeg *j, int stage)
{
    return stage >= 0 && stage < j->stages ? j->d_out[stage] : NULL;
}

void sf_cuda_jpeg_memory(const sf_cuda_jpeg *j, sf_cuda_jpeg_mem *m)
{
    memset(m, 0, sizeof *m);
    for (int k = 1; k < SF_CUDA_JPEG_BACKENDS; k++) {
        m->device_bytes += (size_t)__atomic_load_n(&j->be[k].mem.device_bytes, __ATOMIC_RELAXED);
        m->pinned_bytes += (size_t)__atomic_load_n(&j->be[k].mem.pinned_bytes, __ATOMIC_RELAXED);
        m->warm_failed += j->be[k].ok && j->be[k].warm[0] &&
                          !(k == SF_CUDA_JPEG_HYBRID && j->be[SF_CUDA_JPEG_GPU_HYBRID].ok);
    }
    m->staging_bytes = j->out_cap * (size_t)j->stages;
    m->allocs_after_build = mem_allocs(j) - j->allocs_built;
    for (int l = 0; l < j->lanes - 1; l++) {
        sf_cuda_jpeg_mem lm;
        sf_cuda_jpeg_memory(j->lane[l], &lm);
        m->device_bytes += lm.device_bytes;
        m->pinned_bytes += lm.pinned_bytes;
        m->allocs_after_build += lm.allocs_after_build;
        m->warm_failed += lm.warm_failed;
    }
}

sf_cuda_jpeg_backend sf_cuda_jpeg_last(const sf_cuda_jpeg *j) { return j->last; }

int sf_cuda_jpeg_has(const sf_cuda_jpeg *j, sf_cuda_jpeg_backend be)
{
    return be > SF_CUDA_JPEG_AUTO && be < SF_CUDA_JPEG_BACKENDS && j->be[be].ok;
}

int sf_cuda_jpeg_describe(const sf_cuda_jpeg *j, char *buf, size_t len)
{
    sf_cuda_jpeg_mem m;
    sf_cuda_jpeg_memory(j, &m);
    char warm[3 * 112] = "";
    size_t at = 0;
    for (int k = 1; k < SF_CUDA_JPEG_BACKENDS; k++)
        if (j->be[k].ok && j->be[k].warm[0] && at < sizeof warm)
            at += (size_t)snprintf(warm + at, sizeof warm - at, "; %s not sized at start (%s)",
                                   sf_cuda_jpeg_backend_name((sf_cuda_jpeg_backend)k), j->be[k].warm);
    return snprintf(buf, len,
                    "jpeg decode: nvJPEG, hardware %s, gpu_hybrid %s, hybrid %s; a batch runs on hardware when "
                    "available and every file is baseline, except batches of >= %d files of <= %d pixels on "
                    "average, which run on gpu_hybrid; %d lane(s), a batch of >= %d files per lane split across them; "
                    "staging %d x %zu MiB; nvJPEG buffers %zu MiB device, %zu MiB pinned, sized at start%s\n",
                    j->be[SF_CUDA_JPEG_HARDWARE].ok ? "yes" : "no", j->be[SF_CUDA_JPEG_GPU_HYBRID].ok ? "yes" : "no",
                    j->be[SF_CUDA_JPEG_HYBRID].ok ? "yes" : "no", SF_CUDA_JPEG_GPU_HUFFMAN_MIN_BATCH,
                    SF_CUDA_JPEG_GPU_HYBRID_MAX_PIXELS, j->lanes, SF_CUDA_JPEG_LANE_MIN, j->stages, j->out_cap >> 20, m.device_bytes >> 20, m.pinned_bytes >> 20,
                    warm);
}

sf_cuda_jpeg_backend sf_cuda_jpeg_rule(int n, int64_t pixels, unsigned forms, int has_hardware, int has_gpu_hybrid)
{
    const sf_cuda_jpeg_backend hybrid = has_gpu_hybrid ? SF_CUDA_JPEG_GPU_HYBRID : SF_CUDA_JPEG_HYBRID;
    if (!has_hardware || (forms & (SF_JPEG_FORM_PROGRESSIVE | SF_JPEG_FORM_EXTENDED | SF_JPEG_FORM_CHROMA_4X)))
        return hybrid;
    /* Every file is baseline with a chroma layout the engines take. gpu_hybrid
     * decodes Huffman on the GPU only above SF_CUDA_JPEG_GPU_HUFFMAN_MIN_BATCH
     * files; there, on small files, it outran the engines (see the header). */
    if (has_gpu_hybrid && n >= SF_CUDA_JPEG_GPU_HUFFMAN_MIN_BATCH && n > 0 &&
        pixels <= (int64_t)n * SF_CUDA_JPEG_GPU_HYBRID_MAX_PIXELS)
        return SF_CUDA_JPEG_GPU_HYBRID;
    return SF_CUDA_JPEG_HARDWARE;
}

static sf_cuda_jpeg_backend choose(sf_cuda_jpeg *j, const sf_batch *b, sf_cuda_jpeg_backend want)
{
    if (want != SF_CUDA_JPEG_AUTO)
        return want;
    /* From what the server read of every header (sf_batch.jpeg_forms and
     * decoded_bytes): nothing is parsed again here, on the engine thread. A
     * file the engines still refuse (a baseline file of several scans, which
     * the header read cannot see) fails the call at once and the batch runs
     * on the hybrid backend (sf_cuda_jpeg_decode). */
    return sf_cuda_jpeg_rule(b->n, (int64_t)(b->decoded_bytes / 3), b->jpeg_forms,
                             j->be[SF_CUDA_JPEG_HARDWARE].ok, j->be[SF_CUDA_JPEG_GPU_HYBRID].ok);
}

/* Decodes the n files of j->data/lengths into j->dst with backend k. */
static nvjpegStatus_t decode_arrays(sf_cuda_jpeg *j, int k, int n, cudaStream_t s)
{
    backend_state *B = &j->be[k];
    nvjpegStatus_t st;
    if (B->batch != n) {
        if ((st = nvjpegDecodeBatchedInitialize(B->h, B->st, n, 1, NVJPEG_OUTPUT_RGBI)) != NVJPEG_STATUS_SUCCESS) {
            B->batch = 0;
            return st;
        }
        B->batch = n;
    }
    st = nvjpegDecodeBatched(B->h, B->st, j->data, j->lengths, j->dst, s);
    if (st != NVJPEG_STATUS_SUCCESS)
        B->batch = 0; /* a failed batch needs a fresh initialisation */
    return st;
}

/* File i's JPEG data: up to its EOI when the server found bytes after it. */
static size_t file_len(const sf_batch *b, int i)
{
    const int64_t whole = b->jpeg_off[i + 1] - b->jpeg_off[i];
    if (b->jpeg_files && b->jpeg_files[i].len > 0 && b->jpeg_files[i].len < whole)
        return (size_t)b->jpeg_files[i].len;
    return (size_t)whole;
}

/* Decodes samples order[i0, i0 + n) of b (samples [i0, i0 + n) when order
 * is NULL) with backend k. */
static nvjpegStatus_t run(sf_cuda_jpeg *j, int k, const sf_batch *b, const int *order, int i0, int n,
                          cudaStream_t s)
{
    for (int i = 0; i < n; i++) {
        const int si = order ? order[i0 + i] : i0 + i;
        const sf_aug_sample *sm = &b->samples[si];
        j->data[i] = b->jpeg + b->jpeg_off[si];
        j->lengths[i] = file_len(b, si);
        memset(&j->dst[i], 0, sizeof j->dst[i]);
        j->dst[i].channel[0] = j->cur + sm->src_off;
        j->dst[i].pitch[0] = (size_t)sm->src_w * 3;
    }
    return decode_arrays(j, k, n, s);
}

/* A lane's thread: waits for a job (owner->gen), decodes its slice on its
 * own stream, reports. */
static void *lane_main(void *arg)
{
    sf_cuda_jpeg *L = (sf_cuda_jpeg *)arg, *j = L->owner;
    cudaSetDevice(j->device);
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        while (j->gen == seen && !j->quit)
            pthread_cond_wait(&j->go, &j->mu);
        if (j->quit) {
            pthread_mutex_unlock(&j->mu);
            return NULL;
        }
        seen = j->gen;
        pthread_mutex_unlock(&j->mu);
        L->job_rc = L->job_n > 0 ? run(L, L->job_k, L->job_b, NULL, L->job_i0, L->job_n, L->lst)
                                 : NVJPEG_STATUS_SUCCESS;
        pthread_mutex_lock(&j->mu);
        j->pending--;
        pthread_cond_signal(&j->fin);
        pthread_mutex_unlock(&j->mu);
    }
}

/* Decodes b with backend k across the lanes: slices of about equal bytes,
 * lane 0 on this thread and stream s, the others on theirs after an event
 * on s; s then waits for every lane. The first failure's status. */
static nvjpegStatus_t run_lanes(sf_cuda_jpeg *j, int k, const sf_batch *b, cudaStream_t s)
{
    const int nl = j->lanes;
    const int64_t total = b->jpeg_off[b->n] - b->jpeg_off[0];
    int start[SF_CUDA_JPEG_MAX_LANES + 1];
    start[0] = 0;
    start[nl] = b->n;
    for (int l = 1, i = 0; l < nl; l++) {
        const int64_t cut = b->jpeg_off[0] + total * l / nl;
        while (i < b->n && b->jpeg_off[i] < cut)
            i++;
        /* at least one file per lane before and after */
        i = i < start[l - 1] + 1 ? start[l - 1] + 1 : i;
        i = i > b->n - (nl - l) ? b->n - (nl - l) : i;
        start[l] = i;
    }
    if (cudaEventRecord(j->fork, s) != cudaSuccess)
        return NVJPEG_STATUS_EXECUTION_FAILED;
    for (int l = 1; l < nl; l++) {
        sf_cuda_jpeg *L = j->lane[l - 1];
        if (cudaStreamWaitEvent(L->lst, j->fork, 0) != cudaSuccess)
            return NVJPEG_STATUS_EXECUTION_FAILED;
        L->cur = j->cur;
        L->job_k = k;
        L->job_b = b;
        L->job_i0 = start[l];
        L->job_n = start[l + 1] - start[l];
    }
    pthread_mutex_lock(&j->mu);
    j->pending = nl - 1;
    j->gen++;
    pthread_cond_broadcast(&j->go);
    pthread_mutex_unlock(&j->mu);
    nvjpegStatus_t st = run(j, k, b, NULL, 0, start[1], s);
    pthread_mutex_lock(&j->mu);
    while (j->pending > 0)
        pthread_cond_wait(&j->fin, &j->mu);
    pthread_mutex_unlock(&j->mu);
    for (int l = 1; l < nl; l++) {
        sf_cuda_jpeg *L = j->lane[l - 1];
        if (st == NVJPEG_STATUS_SUCCESS)
            st = L->job_rc;
        if (cudaEventRecord(L->ldone, L->lst) != cudaSuccess || cudaStreamWaitEvent(s, L->ldone, 0) != cudaSuccess)
            st = st == NVJPEG_STATUS_SUCCESS ? NVJPEG_STATUS_EXECUTION_FAILED : st;
    }
    return st;
}

/* ---- sizing nvJPEG's buffers at start -------------------------------------
 *
 * nvJPEG sizes its hybrid backends' buffers (coefficients, bitstream copies,
 * per-image state) when a batch needs them and keeps the largest: left alone
 * they grow on the first batches, with cudaMalloc/cudaFree (device-wide
 * synchronisations) in the middle of training, and again whenever a larger
 * batch comes. The library has no call that sizes them from bounds (only the
 * hardware backend's nvjpegDecodeBatchedPreAllocate), so sf_cuda_jpeg_new
 * decodes one synthetic batch at the bounds on every backend that the AUTO
 * rule can pick (hybrid only where gpu_hybrid is missing): max_batch files
 * of side x side, side = sqrt(max_pixels / max_batch), 4:4:4 (the most
 * coefficients per pixel of any layout the server lets in) with about 0.38
 * bytes of entropy-coded data per pixel (twice the 0.17-0.19 of the quality-90
 * files of bench/results/2026-11-24-h100-jpeg.md). The allocators above count
 * what nvJPEG allocates after that (sf_cuda_jpeg_memory): the GPU test
 * decodes batches of other sizes and layouts and asserts the count stays 0. */

#define SYNTH_AC 31 /* coded AC coefficients per block: 3 + 2*31 bits per 8x8 block */

static void put16(uint8_t *o, size_t *at, int v)
{
    o[(*at)++] = (uint8_t)(v >> 8);
    o[(*at)++] = (uint8_t)v;
}

/* See jpeg_decode.h. */
size_t sf_cuda_jpeg_synthetic_cap(int side)
{
    const size_t blocks = 3 * (size_t)((side + 7) / 8) * (size_t)((side + 7) / 8);
    const size_t bits = blocks * (1 + 2 * SYNTH_AC + 2);
    /* Markers and tables, the data, and stuffing of the padded last byte. */
    return 256 + bits / 8 + 4;
}

/* A baseline, interleaved 4:4:4 JPEG of side x side (any side >= 1: the
 * blocks cover ceil(side / 8) in each direction). Its own Huffman tables
 * hold only the symbols it uses: DC category 0 ("0"), AC run 0 / size 1 ("0",
 * then one bit: 1 for +1) and end of block ("10"); quantisation 1 everywhere.
 * Every block codes DC difference 0 and SYNTH_AC coefficients of +1. The bit
 * pattern never holds eight ones in a row, so only the padded last byte can
 * need a stuffed zero. Returns the length written into o (synth_cap bytes). */
size_t sf_cuda_jpeg_synthetic(int side, uint8_t *o)
{
    size_t at = 0;
    put16(o, &at, 0xFFD8); /* SOI */
    put16(o, &at, 0xFFDB); /* DQT: table 0, 8-bit, all ones */
    put16(o, &at, 67);
    o[at++] = 0x00;
    for (int i = 0; i < 64; i++)
        o[at++] = 1;
    put16(o, &at, 0xFFC0); /* SOF0 */
    put16(o, &at, 17);
    o[at++] = 8;
    put16(o, &at, side);
    put16(o, &at, side);
    o[at++] = 3;
    for (int c = 1; c <= 3; c++) {
        o[at++] = (uint8_t)c;
        o[at++] = 0x11;
        o[at++] = 0;
    }
    put16(o, &at, 0xFFC4); /* DHT: DC table 0, one code of length 1 */
    put16(o, &at, 2 + 1 + 16 + 1);
    o[at++] = 0x00;
    for (int i = 0; i < 16; i++)
        o[at++] = i == 0 ? 1 : 0;
    o[at++] = 0x00;
    put16(o, &at, 0xFFC4); /* DHT: AC table 0, codes of length 1 and 2 */
    put16(o, &at, 2 + 1 + 16 + 2);
    o[at++] = 0x10;
    for (int i = 0; i < 16; i++)
        o[at++] = i < 2 ? 1 : 0;
    o[at++] = 0x01;
    o[at++] = 0x00;
    put16(o, &at, 0xFFDA); /* SOS: the three components, tables 0/0 */
    put16(o, &at, 12);
    o[at++] = 3;
    for (int c = 1; c <= 3; c++) {
        o[at++] = (uint8_t)c;
        o[at++] = 0x00;
    }
    o[at++] = 0;
    o[at++] = 63;
    o[at++] = 0;
    unsigned acc = 0;
    int nbits = 0;
#define SYNTH_BITS(v, len)                                              \
    do {                                                                \
        acc = (acc << (len)) | (unsigned)(v);                           \
        nbits += (len);                                                 \
        while (nbits >= 8) {                                            \
            nbits -= 8;                                                 \
            o[at++] = (uint8_t)(acc >> nbits);                          \
        }                                                               \
        acc &= (1u << nbits) - 1;                                       \
    } while (0)
    const size_t blocks = 3 * (size_t)((side + 7) / 8) * (size_t)((side + 7) / 8);
    for (size_t blk = 0; blk < blocks; blk++) {
        SYNTH_BITS(0, 1);         /* DC: category 0 */
        for (int k = 0; k < SYNTH_AC; k++)
            SYNTH_BITS(1, 2);     /* AC: "0" (run 0, size 1), then "1" (+1) */
        SYNTH_BITS(2, 2);         /* EOB: "10" */
    }
    if (nbits > 0) {
        /* Pad with ones; a byte of all ones is followed by a stuffed zero. */
        const uint8_t last = (uint8_t)((acc << (8 - nbits)) | ((1u << (8 - nbits)) - 1));
        o[at++] = last;
        if (last == 0xFF)
            o[at++] = 0x00;
    }
#undef SYNTH_BITS
    put16(o, &at, 0xFFD9); /* EOI */
    return at;
}

/* Decodes the synthetic batch at the bounds on every backend (see above).
 * A backend whose decode fails keeps a reason in warm (describe() shows it)
 * and grows its buffers on first use instead. */
static void prewarm(sf_cuda_jpeg *j)
{
    int side = (int)sqrt((double)j->max_pixels / j->max_batch);
    side = side > 16384 ? 16384 : side;
    for (int k = 1; k < SF_CUDA_JPEG_BACKENDS; k++)
        j->be[k].warm[0] = '\0';
    if (side < 8) {
        for (int k = 1; k < SF_CUDA_JPEG_BACKENDS; k++)
            snprintf(j->be[k].warm, sizeof j->be[k].warm, "the bounds give files under 8x8");
        return;
    }
    uint8_t *file = (uint8_t *)malloc(sf_cuda_jpeg_synthetic_cap(side));
    cudaStream_t s = NULL;
    if (!file || cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        free(file);
        for (int k = 1; k < SF_CUDA_JPEG_BACKENDS; k++)
            snprintf(j->be[k].warm, sizeof j->be[k].warm, "out of memory for the synthetic batch");
        return;
    }
    const size_t len = sf_cuda_jpeg_synthetic(side, file);
    const size_t img = (size_t)side * side * 3;
    for (int k = 1; k < SF_CUDA_JPEG_BACKENDS; k++) {
        backend_state *B = &j->be[k];
        if (!B->ok)
            continue;
        /* The CPU-Huffman backend runs only where gpu_hybrid could not be
         * created, or when forced: its buffers (coefficients in pinned host
         * memory as well) are not worth holding otherwise. */
        if (k == SF_CUDA_JPEG_HYBRID && j->be[SF_CUDA_JPEG_GPU_HYBRID].ok) {
            snprintf(B->warm, sizeof B->warm, "only used when forced");
            continue;
        }
        /* The same file max_batch times: nvJPEG sizes by what it decodes,
         * not by where the bytes come from. */
        for (int i = 0; i < j->max_batch; i++) {
            j->data[i] = file;
            j->lengths[i] = len;
            memset(&j->dst[i], 0, sizeof j->dst[i]);
            j->dst[i].channel[0] = j->d_out[0] + (size_t)i * img;
            j->dst[i].pitch[0] = (size_t)side * 3;
        }
        nvjpegStatus_t st = decode_arrays(j, k, j->max_batch, s);
        cudaError_t ce = cudaStreamSynchronize(s);
        if (st != NVJPEG_STATUS_SUCCESS || ce != cudaSuccess) {
            snprintf(B->warm, sizeof B->warm, "%s",
                     st != NVJPEG_STATUS_SUCCESS ? status_name(st) : cudaGetErrorString(ce));
            cudaGetLastError();
        }
    }
    cudaStreamDestroy(s);
    free(file);
}

static int decode_batch(sf_cuda_jpeg *j, const sf_batch *b, sf_cuda_jpeg_backend want, int stage,
                        cudaEvent_t area_free, cudaStream_t s);

int sf_cuda_jpeg_decode(sf_cuda_jpeg *j, const sf_batch *b, sf_cuda_jpeg_backend want, int stage,
                        cudaEvent_t area_free, cudaStream_t s)
{
    /* the last decode's use of the states is over (see `used`) */
    if (j->used_pending && cudaEventSynchronize(j->used) != cudaSuccess) {
        sf_cuda_set_error("jpeg decode: the previous decode failed on the device: %s",
                          cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    j->used_pending = 0;
    const int rc = decode_batch(j, b, want, stage, area_free, s);
    if (cudaEventRecord(j->used, s) == cudaSuccess)
        j->used_pending = 1;
    else
        cudaGetLastError();
    return rc;
}

/* The files of b nvJPEG does not take, decoded on this thread (libjpeg-turbo,
 * libspng, libwebp: gpu/ref/image.c) into the pinned buffer and copied into
 * the staging area on s. With skipping, a file the host decoder refuses is
 * marked in b->undecodable; else it fails the batch. 0, SF_BACKEND_BAD_INPUT or -1 (sf_cuda_last_error). */
static int decode_on_host(sf_cuda_jpeg *j, const sf_batch *b, int skip, cudaStream_t s)
{
    size_t need = 0;
    for (int i = 0; i < b->n; i++) {
        j->host_samples[i] = b->samples[i];
        if (!j->on_host[i])
            continue;
        j->host_samples[i].src_off = need;
        need += (size_t)b->samples[i].src_h * (size_t)b->samples[i].src_w * 3;
    }
    if (need > j->h_host_cap) {
        /* Grows outside the steady state: CMYK and arithmetic files are
         * rare, so the buffer is not held for them from the start. The last
         * decode's copies out of it are done (sf_cuda_jpeg_decode waited
         * for `used`). */
        if (j->h_host)
            cudaFreeHost(j->h_host);
        j->h_host = NULL;
        j->h_host_cap = 0;
        if (cudaHostAlloc((void **)&j->h_host, need, cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();
            j->h_host = NULL;
            sf_cuda_set_error("jpeg decode: no pinned memory (%zu bytes) for the files decoded on the host", need);
            return -1;
        }
        j->h_host_cap = need;
    }
    sf_batch hb = *b;
    hb.samples = j->host_samples;
    hb.decoded_bytes = need;
    char err[200];
    const int rc = sf_ref_image_decode_some(&hb, j->on_host, j->h_host, j->h_host_cap, skip ? b->undecodable : NULL,
                                           err, sizeof err);
    if (rc < 0 || (rc > 0 && !skip)) {
        sf_cuda_set_error("jpeg decode (on the host: libjpeg-turbo, libspng, libwebp): %s", err);
        return rc < 0 ? -1 : SF_BACKEND_BAD_INPUT;
    }
    for (int i = 0; i < b->n; i++) {
        if (!j->on_host[i] || (skip && b->undecodable[i]))
            continue;
        const sf_aug_sample *sm = &b->samples[i];
        const size_t bytes = (size_t)sm->src_h * (size_t)sm->src_w * 3;
        if (cudaMemcpyAsync(j->cur + sm->src_off, j->h_host + j->host_samples[i].src_off, bytes,
                            cudaMemcpyHostToDevice, s) != cudaSuccess) {
            sf_cuda_set_error("jpeg decode: copying a host-decoded file: %s", cudaGetErrorString(cudaGetLastError()));
            return -1;
        }
        j->host_decoded++;
    }
    return 0;
}

/* The nvJPEG files (order[0, n_order)) one at a time with backend kf, after
 * their batch failed: the refused ones are marked (skip) or the first fails
 * the batch. Each call waits for the one before it on s: a hybrid backend's
 * host phase refills the state's pinned buffers, which the previous call's
 * copies on s may not have read yet (a busy GPU left files of such a batch
 * unwritten or holding another file's pixels). The error path only, so the
 * waits cost the steady state nothing. 0, SF_BACKEND_BAD_INPUT or -1
 * (sf_cuda_last_error). */
static int decode_one_by_one(sf_cuda_jpeg *j, const sf_batch *b, sf_cuda_jpeg_backend kf, int skip, cudaStream_t s,
                             nvjpegStatus_t batch_st)
{
    int refused = 0;
    /* the failed batch call's own queued work, and the error it may leave */
    cudaStreamSynchronize(s);
    cudaGetLastError();
    for (int p = 0; p < j->n_order; p++) {
        const int i = j->order[p];
        nvjpegStatus_t si = run(j, kf, b, j->order, p, 1, s);
        if (si == NVJPEG_STATUS_SUCCESS) {
            const cudaError_t ce = cudaStreamSynchronize(s);
            if (ce != cudaSuccess) {
                sf_cuda_set_error("jpeg decode (nvJPEG %s): sample %d: %s", sf_cuda_jpeg_backend_name(kf), i,
                                  cudaGetErrorString(ce));
                cudaGetLastError();
                return -1;
            }
            continue;
        }
        const int bad = si == NVJPEG_STATUS_BAD_JPEG || si == NVJPEG_STATUS_JPEG_NOT_SUPPORTED ||
                        si == NVJPEG_STATUS_INCOMPLETE_BITSTREAM;
        if (refused == 0 || !skip)
            sf_cuda_set_error("jpeg decode (nvJPEG %s): sample %d: %s", sf_cuda_jpeg_backend_name(kf), i,
                              status_name(si));
        if (!skip || !bad) {
            cudaStreamSynchronize(s);
            cudaGetLastError();
            return bad ? SF_BACKEND_BAD_INPUT : -1;
        }
        b->undecodable[i] = 1;
        refused++;
        /* a failed call leaves the stream's error behind it */
        cudaStreamSynchronize(s);
        cudaGetLastError();
    }
    if (refused == 0) {
        sf_cuda_set_error("jpeg decode (nvJPEG %s): the batch of %d files failed (%s) though each decodes alone",
                          sf_cuda_jpeg_backend_name(kf), j->n_order, status_name(batch_st));
        cudaStreamSynchronize(s);
        cudaGetLastError();
        return -1;
    }
    return 0;
}

static int decode_batch(sf_cuda_jpeg *j, const sf_batch *b, sf_cuda_jpeg_backend want, int stage,
                        cudaEvent_t area_free, cudaStream_t s)
{
    j->host_decoded = 0;
    j->n_order = 0;
    if (!b->jpeg || !b->jpeg_off || !b->samples || b->n < 1 || b->n > j->max_batch) {
        sf_cuda_set_error("jpeg decode: not an encoded batch of 1..%d files", j->max_batch);
        return -1;
    }
    if (stage < 0 || stage >= j->stages) {
        sf_cuda_set_error("jpeg decode: staging area %d of %d", stage, j->stages);
        return -1;
    }
    j->cur = j->d_out[stage];
    size_t need = 0;
    for (int i = 0; i < b->n; i++) {
        const sf_aug_sample *sm = &b->samples[i];
        size_t end = sm->src_off + (size_t)sm->src_h * (size_t)sm->src_w * 3;
        need = end > need ? end : need;
    }
    if (need > j->out_cap) {
        sf_cuda_set_error("jpeg decode: the batch decodes to %zu bytes; the staging area holds %zu "
                          "(jpeg.max_batch_pixels)", need, j->out_cap);
        return -1;
    }
    const int skip = b->skip_undecodable && b->undecodable;
    if (b->undecodable)
        memset(b->undecodable, 0, (size_t)b->n);
    /* Which files nvJPEG takes: every JPEG but CMYK, YCCK, arithmetic-coded
     * and those turned by their EXIF orientation. PNG and WebP files (told
     * by their forms, or by a first byte that is not a JPEG's) decode on the
     * host with libspng and libwebp. */
    int n_host = 0;
    for (int i = 0; i < b->n; i++) {
        const unsigned f = b->jpeg_files ? b->jpeg_files[i].forms : 0;
        j->on_host[i] = (f & (SF_JPEG_FORM_CMYK | SF_JPEG_FORM_ARITHMETIC | SF_JPEG_FORM_PNG | SF_JPEG_FORM_WEBP |
                              SF_JPEG_FORM_ORIENTED)) != 0 ||
                        b->jpeg[b->jpeg_off[i]] != 0xFF;
        if (j->on_host[i])
            n_host++;
        else
            j->order[j->n_order++] = i;
    }
    j->last = SF_CUDA_JPEG_AUTO;
    if (j->n_order > 0) {
        const sf_cuda_jpeg_backend k = choose(j, b, want);
        if (!sf_cuda_jpeg_has(j, k)) {
            sf_cuda_set_error("jpeg decode: the nvJPEG %s backend is not available on this device (%s)",
                              sf_cuda_jpeg_backend_name(k), j->be[k].why);
            return -1;
        }
        j->last = k;
        /* The engines write the area while the call runs, whatever s still has
         * queued: the area's last reader must be done (sf_cuda_jpeg_decode). */
        if (k == SF_CUDA_JPEG_HARDWARE && area_free && cudaEventSynchronize(area_free) != cudaSuccess) {
            sf_cuda_set_error("jpeg decode: waiting for the staging area's last reader: %s",
                              cudaGetErrorString(cudaGetLastError()));
            return -1;
        }
        /* Lanes cut the batch by sample index: only a batch nvJPEG takes whole. */
        int split = n_host == 0 && j->lanes > 1 && b->n >= SF_CUDA_JPEG_LANE_MIN * j->lanes;
        for (int l = 0; split && l < j->lanes - 1; l++)
            split = sf_cuda_jpeg_has(j->lane[l], k);
        nvjpegStatus_t st = split ? run_lanes(j, k, b, s) : run(j, k, b, j->order, 0, j->n_order, s);
        if (st != NVJPEG_STATUS_SUCCESS) {
            if (split) {
                /* the lanes' streams may still hold work queued before the failure */
                for (int l = 0; l < j->lanes - 1; l++)
                    cudaStreamSynchronize(j->lane[l]->lst);
                cudaGetLastError();
            }
            int done = 0;
            if (want == SF_CUDA_JPEG_AUTO && k == SF_CUDA_JPEG_HARDWARE) {
                /* The engines refused what their check accepted: the batch runs on
                 * the hybrid backend, which takes every file the header reader lets in. */
                const sf_cuda_jpeg_backend h =
                    j->be[SF_CUDA_JPEG_GPU_HYBRID].ok ? SF_CUDA_JPEG_GPU_HYBRID : SF_CUDA_JPEG_HYBRID;
                if (j->be[h].ok) {
                    j->last = h;
                    done = run(j, h, b, j->order, 0, j->n_order, s) == NVJPEG_STATUS_SUCCESS;
                }
            }
            /* Error path: find the files nvJPEG refuses, one at a time (each
             * good one is decoded into its place on the way). */
            int rc = done ? 0 : decode_one_by_one(j, b, j->last, skip, s, st);
            if (rc != 0)
                return rc;
        }
    }
    if (n_host > 0) {
        const int rc = decode_on_host(j, b, skip, s);
        if (rc != 0)
            return rc;
    }
    if (skip) {
        int left = 0;
        for (int i = 0; i < b->n; i++)
            left += !b->undecodable[i];
        if (left == 0)
            return SF_BACKEND_BAD_INPUT; /* sf_cuda_last_error names the first file */
    }
    return 0;
}

int sf_cuda_jpeg_host_decoded(const sf_cuda_jpeg *j)
{
    return j->host_decoded;
}
