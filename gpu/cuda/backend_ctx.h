/* gpu/cuda/backend_ctx.h — the CUDA backend's context (its streams, events,
 * batch buffers and queue of batches in flight) and the functions its files
 * share: backend_cuda.cu (the vtable, buffers, staging and the step),
 * backend_dist.cu (the data-parallel hooks, empty rounds and watchdog) and
 * backend_bench.cu (the diagnose benchmark) and backend_jpeg.cu (the JPEG
 * decoder's life). Internal to those files; the
 * contract is gpu/backend.h. */
#ifndef SF_GPU_CUDA_BACKEND_CTX_H
#define SF_GPU_CUDA_BACKEND_CTX_H

extern "C" {
#include <nvtx3/nvToolsExt.h>
#include "gpu/batch_check.h"
#include "gpu/backend.h"
}
#include "gpu/layers.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "gpu/cuda/augment.h"
#include "gpu/cuda/mix.h"
#include "gpu/cuda/jpeg_decode.h"
#include "gpu/cuda/nvml.h"
#include "gpu/cuda/executor.h"
#include "gpu/cuda/dist_nccl.h"

#define CUDA_NBUF 3       /* device batch buffers = max_inflight */
#define RING_CAP (4 * CUDA_NBUF)
#define STAGE_LABELS_OFF 256
#define STAGE_CTL_OFF 32   /* sf_step_ctl (loss settings, clipping, the batch sequence) after the SGD hyper-parameters */
#define STAGE_ADAMW_OFF 64 /* sf_adamw_hyper after them */
static_assert(STAGE_CTL_OFF + sizeof(sf_step_ctl) <= STAGE_ADAMW_OFF, "sf_step_ctl overlaps the AdamW hyper-parameters");
static_assert(STAGE_ADAMW_OFF + sizeof(sf_adamw_hyper) <= STAGE_LABELS_OFF, "sf_adamw_hyper overlaps the labels");
#define ANCHOR_PERIOD_NS 2000000000ull
/* nvJPEG decoders working on slices of one large JPEG batch at once
 * (jpeg_decode.h): the ImageNet-like batch of 256 files held the engine
 * thread 24 ms in one call against 11 ms for the same decode alone. */
#define JPEG_LANES 2
#define CUBLAS_WS_BYTES ((size_t)32 << 20)

typedef struct cbuf {
    uint8_t *h_stage;   /* pinned: hyper | labels | samples */
    uint8_t *d_stage;   /* device mirror */
    uint8_t *d_raw;     /* uint8 images */
    size_t raw_cap;
    float *d_x;         /* augmented batch, the net's layout and element type (bf16 nets: half
                           the bytes, through a uint16_t view) */
    int32_t *d_lab;     /* labels as int32 ([n] or [n, out_h, out_w]) */
    uint8_t *d_labraw;  /* segmentation: the raw labels, copied straight from the slot */
    int do_opt;         /* this buffer's batch steps the optimizer (accumulation) */
    int eval;           /* this buffer's batch is an evaluation batch */
    float *h_logits;    /* pinned: the logits of a batch that asks for them (allocated at the
                           first such batch, for max_batch) */
    int64_t opt_t;      /* AdamW: the optimizer step it makes */
    /* An encoded batch with samples left out (sf_batch.skip_undecodable):
     * which ones (to place its logits rows), and, for per-pixel labels,
     * which are copied asynchronously, the kept samples' labels (pinned).
     * Allocated at the first such batch. */
    uint8_t *left_out;  /* [max_batch] */
    uint8_t *h_kept_labels; /* pinned, [max_batch * lps * 8] */
    sf_xent_out *d_res;
    sf_xent_out *h_res; /* pinned */
    cudaEvent_t h2d0, h2d, ready, step0, done;
} cbuf;

typedef struct entry {
    uint64_t id;
    void *token;
    int n, b;
    int status;         /* 0 ok, -1 failed */
    char err[160];
    int no_events;      /* failed before or after its GPU work was waited for: nothing to query */
    int slot_freed;     /* SLOT_FREE generated */
    int opt;            /* the step ran the optimizer (counts in the step counter) */
    int eval;           /* an evaluation batch */
    float *logits_out;  /* the engine's buffer for this batch's logits, or NULL */
    uint64_t t_submit_ns;
    char decoder[16];   /* an encoded batch: the nvJPEG backend that ran it */
    double decode_host_s; /* host time in the nvJPEG call */
    int decoded_on_host; /* an encoded batch: its files libjpeg-turbo decoded on the host */
    int n_all;          /* the batch's samples, those left out included (n: those kept) */
} entry;

typedef struct cuda_ctx {
    int device;
    int built;
    sf_model m;
    sf_train_cfg cfg;
    sf_layout layout;

    cudaStream_t st_compute, st_transform_own, st_aux;
    cudaStream_t st_transform; /* st_transform_own, or st_compute without overlap */
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    void *blas_ws;
    sf_cuda_net *net;

    cbuf buf[CUDA_NBUF];
    int nbuf;
    int next_buf;
    size_t stage_bytes, samples_off;
    size_t buf_bytes;   /* device memory of the batch buffers, as allocated at build */

    entry q[CUDA_NBUF];
    int q_head, q_count;
    sf_event ring[RING_CAP];
    int r_head, r_count;
    uint64_t steps;
    size_t lps;          /* labels per sample: 1, or out_h*out_w for segmentation */
    int accum_k, accum_count; /* gradient accumulation, counted at submit */
    uint64_t opt_submitted;   /* optimizer steps enqueued (AdamW's t) */
    unsigned skips_counted;   /* skipped steps harvested (sf_adamw_hyper.skips_counted); the net's
                                 device count and this one are zeroed together */

    cudaEvent_t anchor, anchor_next;
    uint64_t anchor_ns, anchor_next_ns;
    int anchor_ok, anchor_pending;

    int sticky;
    char sticky_msg[256];

    /* Data-parallel training (cfg.dist): NCCL, loaded at build (the
     * gradients' memory comes from it); its communicator is made at the
     * first round (every rank has joined the job by then). */
    sf_nccl *nccl;

    char pci_bus_id[32]; /* for NVML (device_stats); "" when unknown */

    /* transform(): its own scratch on the auxiliary stream */
    uint8_t *t_raw;
    size_t t_raw_cap;
    float *t_out;
    size_t t_out_cap;
    sf_aug_sample *t_samples;
    int t_samples_cap;

    /* Encoded batches: nvJPEG decodes them on the decode stream into its two
     * staging areas by turns; the augmentation on the transform stream reads
     * them (jpeg_decode.h). jpeg_decoded[k]: area k holds its batch;
     * jpeg_read[k]: the augmentation that read area k is done, so the next
     * decode may overwrite it. Without overlap one area on the one stream.
     * The decoder (staging areas and nvJPEG's buffers, 2.6 GiB on an H200 at
     * the defaults) is made by the first encoded batch that reaches submit()
     * or transform() (make_jpeg), so that a job posting raw pixels holds
     * none of it; it is kept until the next build or destroy. jpeg is NULL
     * until then, and always when cfg.jpeg_max_batch_pixels is 0 (jpeg_err
     * says so). jpeg_mu guards the pointer for decoder_memory(), which any
     * thread may call: the engine thread changes it under the lock and
     * reads it without. */
    sf_cuda_jpeg *jpeg;
    pthread_mutex_t jpeg_mu;
    char jpeg_err[160];
    sf_cuda_jpeg_maker jpeg_maker; /* the build's cfg.jpeg_maker, copied; make NULL: sf_cuda_jpeg_new */
    long long jpeg_not_made;       /* encoded batches refused since build: the decoder could not be made */
    /* An encoded batch's kept samples when some were left out
     * (decode_encoded): parameters and labels, in order; [max_batch]. */
    sf_aug_sample *kept_samples;
    uint8_t *kept_labels;   /* [max_batch * 8] */
    cudaStream_t st_decode_own;
    cudaStream_t st_decode;     /* st_decode_own, or st_compute without overlap */
    cudaEvent_t jpeg_decoded[SF_CUDA_JPEG_MAX_STAGES], jpeg_read[SF_CUDA_JPEG_MAX_STAGES];
    int jpeg_stages, jpeg_next; /* areas in use; the one the next batch decodes into */
    int jpeg_cur;               /* the area of the batch being queued */
    double jpeg_host_s;  /* the last encoded batch's host time in the nvJPEG call */
} cuda_ctx;

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline cuda_ctx *ctx_of(sf_backend *be) { return (cuda_ctx *)be->ctx; }

/* The context of a backend whose model is built and whose device is not in a
 * sticky error state, with its device made current; NULL otherwise. */
static inline cuda_ctx *usable_ctx(sf_backend *be)
{
    cuda_ctx *c = ctx_of(be);
    cudaSetDevice(c->device);
    return (c->built && !c->sticky) ? c : NULL;
}

static inline void make_sticky(cuda_ctx *c, const char *what, cudaError_t e)
{
    if (c->sticky)
        return;
    c->sticky = 1;
    snprintf(c->sticky_msg, sizeof c->sticky_msg, "cuda: %s: %s", what, cudaGetErrorString(e));
}

/* backend_cuda.cu: the batch's checks (sf_batch_check against the built
 * model); the index of the first label outside [0, classes), or -1; whether
 * the next batch of buffer b steps the optimizer, and AdamW's t. */
int check_batch(cuda_ctx *c, const sf_batch *b, int need_model, char *err, size_t errlen);
long long bad_label(const sf_batch *b, int classes, int64_t *val, size_t lps);
void plan_opt(cuda_ctx *c, int b, int eval);
/* The stages of buffer b's batch on the transform stream (enqueue_transform:
 * the copies, then enqueue_augment; 0, 1 when it failed before any copy was
 * queued, -1 after) and on the compute stream (enqueue_step). */
int enqueue_transform(cuda_ctx *c, const sf_batch *bt, int b);
int enqueue_augment(cuda_ctx *c, const sf_batch *bt, int b);
int enqueue_step(cuda_ctx *c, int b, int n, int want_logits);

/* backend_dist.cu: the executor's data-parallel hooks (sf_net_cfg.grad_reduce,
 * buf_broadcast and stat_reduce, ctx the cuda_ctx), a round this rank joins
 * without a batch, the communicator made at its first use, the watchdog
 * that aborts a collective a peer left waiting, and sf_backend_i.dist_leave. */
int grad_reduce(void *ctx, const sf_grad_piece *pieces, int n, cudaStream_t s);
int buf_broadcast(void *ctx, float *p, size_t n, cudaStream_t s);
int stat_reduce(void *ctx, double *p, size_t n, cudaStream_t s);
int submit_empty(cuda_ctx *c, const sf_batch *bt, char *err, size_t errlen);
int ensure_nccl(cuda_ctx *c, char *err, size_t errlen);
void nccl_watchdog(cuda_ctx *c);
int cu_dist_join(sf_backend *be, char *err, size_t errlen);
void cu_dist_leave(sf_backend *be, int together);

/* backend_jpeg.cu: the build's preparation for encoded batches (the kept
 * samples' arrays, the maker), the decoder made by the first encoded batch
 * (0; -1 when decoding is off; SF_BACKEND_NO_DECODER when it cannot be made,
 * counted, the next batch trying again), and sf_backend_i.decoder_memory. */
void build_jpeg(cuda_ctx *c, const sf_train_cfg *cfg);
int make_jpeg(cuda_ctx *c, char *err, size_t errlen);
int cu_decoder_memory(sf_backend *be, sf_decoder_memory *out);

/* backend_bench.cu: sf_backend_i.bench, the caching method (DESIGN.md §3). */
int cu_bench(sf_backend *be, const sf_batch *bt, sf_bench_mode mode, int warmup, int steps, double *seconds,
             char *err, size_t errlen);

#endif /* SF_GPU_CUDA_BACKEND_CTX_H */
