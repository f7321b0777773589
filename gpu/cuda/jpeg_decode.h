/* gpu/cuda/jpeg_decode.h — batched JPEG decode on the GPU (nvJPEG) into one
 * device staging area, on the caller's stream.
 *
 * What it is for. An encoded batch (sf_batch.jpeg, gpu/backend.h) is decoded
 * on the caller's stream into one of `stages` staging areas (each holds one
 * batch); the augmentation then reads the decoded images from there. The
 * caller orders the streams: a decode into area k must come after the
 * augmentation that last read area k. The CUDA backend decodes on a stream of
 * its own into two areas by turns, so that the decode of batch N+1 runs
 * beside the augmentation of batch N (and the step of batch N-1), not after
 * it (backend_cuda.cu, docs/DESIGN.md).
 *
 * Backends. nvJPEG has three that take host bitstreams: HARDWARE (the NVJPG
 * engines of A100/H100/H200-class GPUs; baseline, single-scan files, no 4:1:0
 * or 4:1:1), GPU_HYBRID (Huffman decode on the GPU for baseline files in
 * batches above 50, on the CPU otherwise; IDCT and colour on the GPU) and
 * HYBRID (Huffman on the CPU). sf_cuda_jpeg_new creates each one the device
 * and library allow. Under AUTO a batch is placed by sf_cuda_jpeg_rule from
 * what the server read of its headers (sf_batch.jpeg_forms, decoded_bytes):
 * nothing is parsed again per batch. The rule, from the decode-alone
 * measurements of bench/results/2026-11-24-h100-jpeg.md (H100, images/s,
 * hardware vs gpu_hybrid): 256x256 files 16.1k vs 3.7k at batch 32 and
 * 23.3k vs 43.3k at batch 256; 500x375 files 20.7k vs 1.4k at batch 32 and
 * 26.6k vs 22.8k at batch 256. So: a batch with a progressive, extended or
 * 4:1:x file runs on GPU_HYBRID (HYBRID where that could not be created);
 * otherwise a batch of at least SF_CUDA_JPEG_GPU_HUFFMAN_MIN_BATCH files of
 * at most SF_CUDA_JPEG_GPU_HYBRID_MAX_PIXELS pixels on average runs on
 * GPU_HYBRID, and every other one on HARDWARE. The pixel bound lies between
 * the two measured sizes (65 536 and 187 500 pixels; the crossover
 * interpolated on a log scale is near 150 000) and below the crossover on
 * purpose: GPU_HYBRID takes SM time from the training step, the engines do
 * not, and the decode-alone figures do not see that. A batch the engines
 * still refuse (a baseline file of several scans, which the header read does
 * not see) fails nvJPEG's call before any GPU work and runs again on the
 * hybrid backend. A caller may force one backend (jpeg.decoder, the
 * benchmark).
 *
 * Output. Sample i as interleaved RGB (3-channel HWC uint8, rows of 3w bytes)
 * at byte samples[i].src_off of the staging area, samples[i].src_h x src_w:
 * grayscale files give three equal channels. Chroma is upsampled with
 * interpolation (NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION), as libjpeg-turbo's
 * default "fancy" upsampling does; nvJPEG and libjpeg-turbo still differ by
 * IDCT rounding (tests/gpu/test_jpeg_decode.cu states and checks the bound).
 * Bitstreams are decoded strictly (NVJPEG_FLAGS_BITSTREAM_STRICT): damaged
 * scan data fails the file, as it does on the reference backend.
 *
 * Files nvJPEG does not take. Arithmetic-coded files (nvJPEG decodes
 * Huffman-coded ones only) and CMYK and YCCK files (4 components: the batched
 * API used here has no switch for them; nvjpegDecodeParamsSetAllowCMYK is the
 * decoupled API's, and its conversion to RGB is not torchvision's) are
 * decoded with libjpeg-turbo on the calling thread (gpu/ref/input.h: the
 * reference decode, converted to RGB as torchvision converts them) into a
 * pinned buffer and copied into their places of the staging area on the
 * caller's stream; sf_cuda_jpeg_host_decoded counts them. Such files are
 * rare in data sets (ImageNet's training set holds a few dozen CMYK ones).
 *
 * A file a decoder refuses. With b->skip_undecodable it is marked in
 * b->undecodable and the others are decoded into their places (the batch
 * that failed is decoded again one file at a time to find it: the error path
 * only); a batch of which no file decodes is refused. Without, the first
 * refused file refuses the batch.
 *
 * Memory, sized once. The staging areas (3 * max_pixels bytes each) are
 * allocated by sf_cuda_jpeg_new. nvJPEG's own pinned and device buffers are sized there
 * too: the hardware backend by nvjpegDecodeBatchedPreAllocate, and every
 * backend the AUTO rule can pick by decoding one synthetic batch at the
 * bounds (jpeg_decode.cu says which; HYBRID, used only when forced where
 * gpu_hybrid exists, grows on first use), since the hybrid backends have no sizing call and otherwise grow
 * on the first batches with cudaMalloc/cudaFree mid-training. Every nvJPEG
 * allocation goes through counting allocators: sf_cuda_jpeg_memory reports
 * the bytes held and the allocations made after sf_cuda_jpeg_new returned.
 *
 * Lanes. With lanes > 1 (1..SF_CUDA_JPEG_MAX_LANES) a batch of at least
 * SF_CUDA_JPEG_LANE_MIN files per lane is cut into slices of about equal
 * bytes, decoded at the same time by decoders of their own (nvJPEG handles
 * and states, threads, streams) into the same staging area; the call returns
 * when every slice has been submitted (for the engines: decoded) and the
 * caller's stream waits for them all. Each lane holds nvJPEG buffers of its
 * own, sized as lane 0's.
 *
 * Threads: one decoder is used by one thread at a time (the engine thread);
 * its lanes' threads are its own.
 */
#ifndef SF_GPU_CUDA_JPEG_DECODE_H
#define SF_GPU_CUDA_JPEG_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "gpu/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sf_cuda_jpeg sf_cuda_jpeg;

typedef enum sf_cuda_jpeg_backend {
    SF_CUDA_JPEG_AUTO = 0,   /* the choice described above, per batch */
    SF_CUDA_JPEG_HARDWARE,
    SF_CUDA_JPEG_GPU_HYBRID,
    SF_CUDA_JPEG_HYBRID,
    SF_CUDA_JPEG_BACKENDS
} sf_cuda_jpeg_backend;

#define SF_CUDA_JPEG_MAX_STAGES 2
#define SF_CUDA_JPEG_MAX_LANES 4
#define SF_CUDA_JPEG_LANE_MIN 64 /* files per lane below which a batch is not split */

/* A decoder for batches of at most max_batch files and max_pixels decoded
 * pixels in all, with `stages` staging areas (1..SF_CUDA_JPEG_MAX_STAGES), on
 * the current device. NULL with err when nvJPEG cannot be used at all (no
 * backend could be created, or a staging allocation failed). */
sf_cuda_jpeg *sf_cuda_jpeg_new(int max_batch, int64_t max_pixels, int stages, int lanes, char *err, size_t errlen);
void sf_cuda_jpeg_free(sf_cuda_jpeg *j);

/* Makes a decoder as sf_cuda_jpeg_new does (same arguments). The CUDA backend
 * makes its decoder through one (sf_train_cfg.jpeg_maker; NULL:
 * sf_cuda_jpeg_new itself), so that a test can refuse the decoder without
 * taking the device's memory from the other processes on the device. */
typedef struct sf_cuda_jpeg_maker {
    sf_cuda_jpeg *(*make)(void *ctx, int max_batch, int64_t max_pixels, int stages, int lanes, char *err,
                          size_t errlen);
    void *ctx;
} sf_cuda_jpeg_maker;

/* Queues the decode of b's n files into staging area `stage` on stream s (b->jpeg, b->jpeg_off,
 * b->samples[i].src_off/src_h/src_w; b->jpeg_forms, b->decoded_bytes and b->n
 * pick the backend under AUTO). The files must stay unchanged until that work has completed on
 * s. area_free: the event after which the staging area may be overwritten (the
 * last read of its previous batch), or NULL when nothing queued still reads
 * it. The hybrid backends write the area in s's order, so the caller makes s
 * wait for that event; the hardware engines write it during the call, outside
 * any stream's order, so for them this call waits for area_free on the host
 * first. Returns 0; SF_BACKEND_BAD_INPUT (gpu/backend.h) when nvJPEG refuses a
 * file's data (bad or unsupported JPEG); -1 otherwise. sf_cuda_last_error()
 * names the backend and, when nvJPEG refused a file, the sample (found by
 * decoding the files one by one: the error path only). */
int sf_cuda_jpeg_decode(sf_cuda_jpeg *j, const sf_batch *b, sf_cuda_jpeg_backend want, int stage,
                        cudaEvent_t area_free, cudaStream_t s);

/* The AUTO rule (see above) for a batch of n files of `pixels` decoded
 * pixels in all whose forms are the SF_JPEG_FORM_* bits, given which backends
 * exist. Pure: no nvJPEG call. */
#define SF_CUDA_JPEG_GPU_HUFFMAN_MIN_BATCH 51    /* nvJPEG: GPU Huffman "when batch size is bigger than 50" */
#define SF_CUDA_JPEG_GPU_HYBRID_MAX_PIXELS 131072 /* average pixels per file; see above */
sf_cuda_jpeg_backend sf_cuda_jpeg_rule(int n, int64_t pixels, unsigned forms, int has_hardware, int has_gpu_hybrid);

/* nvJPEG's own buffers, all backends together. */
typedef struct sf_cuda_jpeg_mem {
    size_t device_bytes, pinned_bytes; /* held now */
    size_t staging_bytes;              /* the staging areas (device memory), beside them */
    long long allocs_after_build;      /* allocations since sf_cuda_jpeg_new returned: 0 is "sized once" */
    int warm_failed;                   /* backends whose build-time decode failed (describe says why) */
} sf_cuda_jpeg_mem;
void sf_cuda_jpeg_memory(const sf_cuda_jpeg *j, sf_cuda_jpeg_mem *m);

/* The synthetic file of the build-time decode (jpeg_decode.cu): a baseline
 * 4:4:4 JPEG of side x side. sf_cuda_jpeg_synthetic writes it into out, which
 * holds sf_cuda_jpeg_synthetic_cap(side) bytes, and returns its length. */
size_t sf_cuda_jpeg_synthetic_cap(int side);
size_t sf_cuda_jpeg_synthetic(int side, uint8_t *out);

/* Staging area `stage` (NULL out of range). */
uint8_t *sf_cuda_jpeg_output(const sf_cuda_jpeg *j, int stage);
/* The backend the last decode ran on; SF_CUDA_JPEG_AUTO before any, and
 * when every file of the last batch was decoded on the host. */
sf_cuda_jpeg_backend sf_cuda_jpeg_last(const sf_cuda_jpeg *j);
/* Files of the last decode that libjpeg-turbo decoded on the host. */
int sf_cuda_jpeg_host_decoded(const sf_cuda_jpeg *j);
/* 1 when the backend could be created on this device. */
int sf_cuda_jpeg_has(const sf_cuda_jpeg *j, sf_cuda_jpeg_backend be);
/* "hardware", "gpu_hybrid", "hybrid", "auto". */
const char *sf_cuda_jpeg_backend_name(sf_cuda_jpeg_backend be);
/* One line for the backend's describe(): the backends available, the choice
 * rule, the staging size and nvJPEG's buffers. Returns the length written (snprintf's). */
int sf_cuda_jpeg_describe(const sf_cuda_jpeg *j, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
