/* gpu/cuda/jpeg_decode.cu — see jpeg_decode.h. nvJPEG does the work; this
 * file chooses its backend per batch, points its outputs into the staging
 * area and names a file nvJPEG refuses. */
#include "gpu/cuda/jpeg_decode.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvjpeg.h>

#include "gpu/cuda/check.h"

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

typedef struct backend_state {
    int ok;                 /* created on this device */
    nvjpegHandle_t h;
    nvjpegJpegState_t st;
    nvjpegJpegStream_t js;  /* for nvjpegDecodeBatchedSupported (hardware) */
    int batch;              /* the batch size nvjpegDecodeBatchedInitialize was last called with; 0 none */
    char why[96];           /* why it is not available */
} backend_state;

struct sf_cuda_jpeg {
    int max_batch;
    int64_t max_pixels;
    uint8_t *d_out;         /* staging: 3 * max_pixels bytes */
    size_t out_cap;
    backend_state be[SF_CUDA_JPEG_BACKENDS];
    const unsigned char **data; /* [max_batch] host arrays handed to nvjpegDecodeBatched */
    size_t *lengths;
    nvjpegImage_t *dst;
    sf_cuda_jpeg_backend last;
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

static int backend_create(sf_cuda_jpeg *j, int k)
{
    backend_state *B = &j->be[k];
    /* Interpolated chroma upsampling: libjpeg-turbo's default, so that the
     * two decoders differ by IDCT rounding only. Strict bitstreams: a damaged
     * file fails, as the reference decode fails on libjpeg-turbo's warnings,
     * rather than training as a partly grey image. */
    const unsigned flags = NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION | NVJPEG_FLAGS_BITSTREAM_STRICT;
    nvjpegStatus_t s = nvjpegCreateEx(NV_BACKEND[k], NULL, NULL, flags, &B->h);
    if (s != NVJPEG_STATUS_SUCCESS) {
        B->h = NULL;
        snprintf(B->why, sizeof B->why, "%s", status_name(s));
        return -1;
    }
    if ((s = nvjpegJpegStateCreate(B->h, &B->st)) != NVJPEG_STATUS_SUCCESS ||
        (s = nvjpegJpegStreamCreate(B->h, &B->js)) != NVJPEG_STATUS_SUCCESS) {
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
    if (B->js)
        nvjpegJpegStreamDestroy(B->js);
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
    for (int k = 1; k < SF_CUDA_JPEG_BACKENDS; k++)
        backend_destroy(&j->be[k]);
    cudaFree(j->d_out);
    free(j->data);
    free(j->lengths);
    free(j->dst);
    free(j);
}

sf_cuda_jpeg *sf_cuda_jpeg_new(int max_batch, int64_t max_pixels, char *err, size_t errlen)
{
    if (max_batch < 1 || max_pixels < 1) {
        snprintf(err, errlen, "jpeg decode: max_batch %d and max_pixels %lld must be >= 1", max_batch,
                 (long long)max_pixels);
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
    if (!j->data || !j->lengths || !j->dst) {
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
    cudaError_t ce = cudaMalloc((void **)&j->d_out, j->out_cap);
    if (ce != cudaSuccess) {
        snprintf(err, errlen, "jpeg decode: cudaMalloc of %zu bytes for the staging area: %s", j->out_cap,
                 cudaGetErrorString(ce));
        cudaGetLastError();
        j->d_out = NULL;
        sf_cuda_jpeg_free(j);
        return NULL;
    }
    return j;
}

uint8_t *sf_cuda_jpeg_output(const sf_cuda_jpeg *j) { return j->d_out; }

sf_cuda_jpeg_backend sf_cuda_jpeg_last(const sf_cuda_jpeg *j) { return j->last; }

int sf_cuda_jpeg_has(const sf_cuda_jpeg *j, sf_cuda_jpeg_backend be)
{
    return be > SF_CUDA_JPEG_AUTO && be < SF_CUDA_JPEG_BACKENDS && j->be[be].ok;
}

int sf_cuda_jpeg_describe(const sf_cuda_jpeg *j, char *buf, size_t len)
{
    return snprintf(buf, len,
                    "jpeg decode: nvJPEG, hardware %s, gpu_hybrid %s, hybrid %s; a batch runs on hardware when "
                    "available and every file is baseline, else on gpu_hybrid; staging %zu MiB\n",
                    j->be[SF_CUDA_JPEG_HARDWARE].ok ? "yes" : "no", j->be[SF_CUDA_JPEG_GPU_HYBRID].ok ? "yes" : "no",
                    j->be[SF_CUDA_JPEG_HYBRID].ok ? "yes" : "no", j->out_cap >> 20);
}

/* Whether the hardware engines take every file of b (nvJPEG's own check). */
static int hardware_takes(sf_cuda_jpeg *j, const sf_batch *b)
{
    backend_state *B = &j->be[SF_CUDA_JPEG_HARDWARE];
    for (int i = 0; i < b->n; i++) {
        int unsupported = 1;
        const int64_t o0 = b->jpeg_off[i], o1 = b->jpeg_off[i + 1];
        if (nvjpegJpegStreamParseHeader(B->h, b->jpeg + o0, (size_t)(o1 - o0), B->js) != NVJPEG_STATUS_SUCCESS ||
            nvjpegDecodeBatchedSupported(B->h, B->js, &unsupported) != NVJPEG_STATUS_SUCCESS || unsupported)
            return 0;
    }
    return 1;
}

static sf_cuda_jpeg_backend choose(sf_cuda_jpeg *j, const sf_batch *b, sf_cuda_jpeg_backend want)
{
    if (want != SF_CUDA_JPEG_AUTO)
        return want;
    if (j->be[SF_CUDA_JPEG_HARDWARE].ok && !b->jpeg_progressive && hardware_takes(j, b))
        return SF_CUDA_JPEG_HARDWARE;
    return j->be[SF_CUDA_JPEG_GPU_HYBRID].ok ? SF_CUDA_JPEG_GPU_HYBRID : SF_CUDA_JPEG_HYBRID;
}

/* Decodes samples [i0, i0 + n) of b with backend k. */
static nvjpegStatus_t run(sf_cuda_jpeg *j, int k, const sf_batch *b, int i0, int n, cudaStream_t s)
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
    for (int i = 0; i < n; i++) {
        const sf_aug_sample *sm = &b->samples[i0 + i];
        j->data[i] = b->jpeg + b->jpeg_off[i0 + i];
        j->lengths[i] = (size_t)(b->jpeg_off[i0 + i + 1] - b->jpeg_off[i0 + i]);
        memset(&j->dst[i], 0, sizeof j->dst[i]);
        j->dst[i].channel[0] = j->d_out + sm->src_off;
        j->dst[i].pitch[0] = (size_t)sm->src_w * 3;
    }
    st = nvjpegDecodeBatched(B->h, B->st, j->data, j->lengths, j->dst, s);
    if (st != NVJPEG_STATUS_SUCCESS)
        B->batch = 0; /* a failed batch needs a fresh initialisation */
    return st;
}

int sf_cuda_jpeg_decode(sf_cuda_jpeg *j, const sf_batch *b, sf_cuda_jpeg_backend want, cudaStream_t s)
{
    if (!b->jpeg || !b->jpeg_off || !b->samples || b->n < 1 || b->n > j->max_batch) {
        sf_cuda_set_error("jpeg decode: not an encoded batch of 1..%d files", j->max_batch);
        return -1;
    }
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
    const sf_cuda_jpeg_backend k = choose(j, b, want);
    if (!sf_cuda_jpeg_has(j, k)) {
        sf_cuda_set_error("jpeg decode: the nvJPEG %s backend is not available on this device (%s)",
                          sf_cuda_jpeg_backend_name(k), j->be[k].why);
        return -1;
    }
    j->last = k;
    nvjpegStatus_t st = run(j, k, b, 0, b->n, s);
    if (st == NVJPEG_STATUS_SUCCESS)
        return 0;
    if (want == SF_CUDA_JPEG_AUTO && k == SF_CUDA_JPEG_HARDWARE) {
        /* The engines refused what their check accepted: the batch runs on
         * the hybrid backend, which takes every file the header reader lets in. */
        const sf_cuda_jpeg_backend h =
            j->be[SF_CUDA_JPEG_GPU_HYBRID].ok ? SF_CUDA_JPEG_GPU_HYBRID : SF_CUDA_JPEG_HYBRID;
        if (j->be[h].ok) {
            j->last = h;
            if (run(j, h, b, 0, b->n, s) == NVJPEG_STATUS_SUCCESS)
                return 0;
        }
    }
    const sf_cuda_jpeg_backend kf = j->last;
    /* Error path: find the file nvJPEG refuses, one at a time. */
    for (int i = 0; i < b->n; i++) {
        nvjpegStatus_t si = run(j, kf, b, i, 1, s);
        if (si != NVJPEG_STATUS_SUCCESS) {
            sf_cuda_set_error("jpeg decode (nvJPEG %s): sample %d: %s", sf_cuda_jpeg_backend_name(kf), i,
                              status_name(si));
            cudaStreamSynchronize(s);
            cudaGetLastError();
            return -1;
        }
    }
    sf_cuda_set_error("jpeg decode (nvJPEG %s): the batch of %d files failed (%s) though each decodes alone",
                      sf_cuda_jpeg_backend_name(kf), b->n, status_name(st));
    cudaStreamSynchronize(s);
    cudaGetLastError();
    return -1;
}
