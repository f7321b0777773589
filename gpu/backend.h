/* gpu/backend.h — the one interface every compute backend implements.
 *
 * A backend owns a device (or the CPU), a built model and its training state.
 * The server talks to it only through this vtable (as ggml-backend does), so
 * server/ never sees CUDA and gpu/ never sees HTTP.
 *
 * Threads: every function except host_alloc/host_free/name is called from the
 * engine thread only (server/engine.c). host_alloc/host_free are called at
 * start-up and shutdown.
 *
 * The batch life cycle seen from the engine:
 *   submit(batch)         the backend starts H2D + augment + step, asynchronously
 *                         where it can (the reference backend runs it at once).
 *   poll()                yields completions, in submission order per kind:
 *     SF_EV_SLOT_FREE       the host slot's bytes have been consumed (H2D done);
 *                           the engine may hand the slot back to the ring.
 *     SF_EV_STEP_DONE       the step finished (or failed) with its result.
 *   Every submitted batch yields exactly one SLOT_FREE and then exactly one
 *   STEP_DONE, also when it fails (status != 0).
 */
#ifndef SF_GPU_BACKEND_H
#define SF_GPU_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/aug.h"
#include "collective/collective.h"
#include "gpu/model.h"

typedef enum sf_precision { SF_PREC_FP32 = 0, SF_PREC_TF32, SF_PREC_BF16 } sf_precision;

/* The optimizer (optim.name), fixed at build time: its state is allocated then. */
typedef enum sf_optim { SF_OPT_SGD = 0, SF_OPT_ADAMW } sf_optim;

typedef enum sf_label_dtype { SF_LABEL_U8 = 0, SF_LABEL_I32, SF_LABEL_I64 } sf_label_dtype;

/* Activation layout on the device (pipeline.layout): AUTO picks the measured
 * best for the precision and model (the CUDA backend documents its rule). */
typedef enum sf_act_layout { SF_ACT_LAYOUT_AUTO = 0, SF_ACT_LAYOUT_NCHW, SF_ACT_LAYOUT_NHWC } sf_act_layout;

/* The CUDA executor's plan switches (gpu/cuda/exec_switches.h), which tests
 * and benchmarks set to compare a plan with its plainer variant. */
struct sf_exec_switches;
/* How the CUDA backend makes its JPEG decoder (gpu/cuda/jpeg_decode.h),
 * which tests set; see sf_train_cfg. */
struct sf_cuda_jpeg_maker;

/* Which nvJPEG backend decodes encoded batches on CUDA (jpeg.decoder). AUTO
 * is the measured per-batch rule of gpu/cuda/jpeg_decode.h; the others force
 * one backend for every batch. The reference backend always uses
 * libjpeg-turbo. */
typedef enum sf_jpeg_decoder {
    SF_JPEG_DECODER_AUTO = 0,
    SF_JPEG_DECODER_HARDWARE,
    SF_JPEG_DECODER_GPU_HYBRID,
    SF_JPEG_DECODER_HYBRID,
} sf_jpeg_decoder;

/* Bits of sf_batch.jpeg_forms: what the server's header reads found among a
 * batch's files, so that a decoder picks its method without reading them
 * again. */
#define SF_JPEG_FORM_PROGRESSIVE 1u  /* some file is progressive (SOF2) */
#define SF_JPEG_FORM_EXTENDED    2u  /* some file is extended sequential (SOF1) */
#define SF_JPEG_FORM_CHROMA_4X   4u  /* some file has 4:1:1 or 4:1:0 chroma */
#define SF_JPEG_FORM_CMYK        8u  /* some file has 4 components (CMYK or YCCK) */
#define SF_JPEG_FORM_ARITHMETIC 16u  /* some file is arithmetic-coded (SOF9, SOF10) */
#define SF_JPEG_FORM_PNG        32u  /* some file is a PNG (decoded on the host, libspng) */
#define SF_JPEG_FORM_WEBP       64u  /* some file is a WebP (decoded on the host, libwebp) */
#define SF_JPEG_FORM_ORIENTED  128u  /* some file is turned by its EXIF orientation
                                        (decode.exif_orientation apply; on the host) */

/* One file of an encoded batch, as the server's read of its header found it. */
typedef struct sf_jpeg_file {
    int64_t len;      /* its image data: a JPEG's bytes up to and including its EOI marker
                         (a PNG's IEND chunk, a WebP's RIFF container); the bytes after it
                         (which some writers append) go to no decoder */
    unsigned forms;   /* its SF_JPEG_FORM_* bits */
    int orientation;  /* the EXIF orientation to apply, 2..8, which makes the sample's
                         src_h x src_w the turned size (w x h of the file for 5..8);
                         0 or 1: the file as stored */
} sf_jpeg_file;

/* Training settings a backend needs at build time. lr/momentum/wd may change
 * between steps (hot config): they are passed again with every batch. */
typedef struct sf_train_cfg {
    sf_precision precision;
    uint64_t seed;          /* parameter initialisation */
    int max_batch;          /* largest N the backend must be able to run */
    int overlap;            /* CUDA: transform and compute on separate streams */
    int cuda_graphs;        /* CUDA: capture the step as a graph */
    int device;             /* CUDA device ordinal */
    sf_optim optim;         /* SGD (default) or AdamW */
    int grad_accum_steps;   /* optimizer step every k batches (gradients averaged); 0 or 1: every batch */
    sf_act_layout layout;   /* CUDA: activation layout (pipeline.layout) */
    int tune_configs;       /* CUDA: cuDNN engine configs timed per convolution when a plan is
                               built (pipeline.cudnn_tune_configs); 0: the default, 8 */
    const struct sf_exec_switches *sw; /* CUDA: NULL (the server's), or plan switches that
                                          build reads and does not keep */
    int64_t jpeg_max_batch_pixels; /* most decoded pixels of one encoded batch: the decode
                                      buffers (3 bytes a pixel) are sized from it (CUDA: by the
                                      first encoded batch); 0: no encoded batches */
    sf_jpeg_decoder jpeg_decoder;  /* CUDA: the nvJPEG backend, or AUTO (the per-batch rule) */
    /* CUDA, set by tests alone (the server leaves it NULL): how the JPEG
     * decoder is made (gpu/cuda/jpeg_decode.h); NULL is nvJPEG's real one.
     * A test passes one that refuses, to reach a decoder that cannot be made
     * without taking the device's memory from the other processes on it.
     * build copies the struct; its ctx stays valid until destroy. */
    const struct sf_cuda_jpeg_maker *jpeg_maker;
    /* Data-parallel training (collective/collective.h): NULL or world 1 is one
     * process, and nothing below runs. With world > 1 every training batch
     * is one rank's part of a step all ranks take together: after the
     * backward its gradient, scaled by n / global_n, is SUM all-reduced
     * (Gloo on the reference backend, NCCL on CUDA) before the optimizer, so
     * every rank applies the global sample mean. The pointer stays valid
     * until destroy; dist->coll is set before the first batch. */
    const sf_dist *dist;
} sf_train_cfg;

typedef struct sf_hyper {
    float lr, momentum, weight_decay;
    /* AdamW only. The betas stay double, as the config has them: PyTorch
     * forms 1 - beta and the bias corrections 1 - beta^t from the Python
     * floats, and 1 - (float)0.999 is 1.3e-5 (relative) below 0.001, which
     * the second moment exp_avg_sq would carry. */
    double beta1, beta2;
    float eps;
    /* Gradient clipping (optim.clip_grad_norm): 0 is off. Else the gradients
     * about to be applied (after accumulation, before weight decay and the
     * optimizer) are scaled by min(1, clip_grad_norm / (norm + 1e-6)), where
     * norm is the L2 norm over all trainable parameters' gradients, as
     * torch.nn.utils.clip_grad_norm_ does. */
    float clip_grad_norm;
} sf_hyper;

/* A READY ring slot, described for the backend. The bytes stay valid and
 * unchanged until the backend reports SF_EV_SLOT_FREE for this batch. */
typedef struct sf_batch {
    uint64_t id;             /* job id (for results) */
    uint64_t seq;            /* batch sequence number (RNG key) */
    void *token;             /* opaque to the backend; returned in events */
    int n, h, w, c;          /* images: n samples of h x w x c uint8 */
    /* Data-parallel training: the samples of this step summed over the ranks
     * (0 when single-process: n). n may be 0 then: an empty contribution
     * (no images, labels, plan or samples) that adds zero gradients, still
     * joins the all-reduce and the optimizer step, and yields SLOT_FREE and
     * STEP_DONE like any batch. The samples each rank trains (n, or 0) are
     * summed with the gradient: a batch announced in global_n and refused
     * once the round began (then its rank submits an empty contribution)
     * leaves a gradient that the backend rescales to the mean over the
     * samples trained, and a step in which none was trained is skipped on
     * every rank (SF_SKIP_EMPTY). */
    int64_t global_n;
    int nhwc;                /* 1: [n,h,w,c]; 0: [n,c,h,w] */
    const uint8_t *images;   /* host pointer (pinned on CUDA); NULL in the encoded form */
    /* The encoded form (jpeg != NULL): n JPEG files whose headers the server
     * has validated, file i at jpeg[jpeg_off[i], jpeg_off[i+1]) (host memory,
     * pinned on CUDA, valid like images). The plan is ragged (gpu/aug.h) and h,
     * w are 0: the backend decodes sample i to 3-channel HWC uint8 of
     * samples[i].src_h x src_w at byte samples[i].src_off of its decode
     * buffer, then augments from there. */
    const uint8_t *jpeg;
    const int64_t *jpeg_off;
    /* NULL, or the n files' lengths and forms (sf_jpeg_file). Read during
     * submit() and transform() only. */
    const sf_jpeg_file *jpeg_files;
    unsigned jpeg_forms;     /* SF_JPEG_FORM_* bits over the files: not every decoder takes
                                every form (nvJPEG's hardware engines take none of them) */
    /* 1: a file the decoder refuses is left out and the batch goes on with
     * the others (decode.on_undecodable skip): the step (or transform) runs
     * on the samples decoded, in their order, and sf_event.n counts them. A
     * batch of which no file decodes is refused as a whole
     * (SF_BACKEND_BAD_INPUT). 0: any refused file refuses the batch. */
    int skip_undecodable;
    /* NULL, or n bytes the backend sets before submit() or transform()
     * returns: 1 for each sample left out, 0 for the others. A transform's
     * output keeps n rows; a row left out is zeros. */
    uint8_t *undecodable;
    size_t decoded_bytes;    /* sum over the samples of h*w*3 */
    sf_label_dtype label_dtype;
    const void *labels;      /* [n] integers in [0, classes) (validated by the server);
                                [n, out_h, out_w] for a segmentation model */
    const sf_aug_plan *plan;     /* the augmentation plan for this shape */
    const sf_aug_sample *samples; /* n per-sample parameters, owned by the engine until SLOT_FREE */
    sf_aug_mix mix;          /* the batch-level mixing of the augmented images (mixup,
                                cutmix; sf_aug_gen_mix); all zero: none */
    sf_hyper hyper;
    /* 1: an evaluation batch. Forward only, in eval mode (batchnorm uses its
     * running statistics); no backward, no optimizer step: parameters,
     * buffers, optimizer state and step count stay untouched. */
    int eval;
    /* NULL, or host float [n, classes] the backend fills with the logits
     * before it reports STEP_DONE (eval batches asked with ?return=logits). */
    float *logits_out;
    /* Cross-entropy label smoothing in [0, 1), torch.nn.CrossEntropyLoss
     * semantics: the target of sample i is (1-s)*t_i + s/classes. */
    float label_smoothing;
    /* 1: no mixing. Else (mixup/cutmix) the target of sample i is
     * mix_lam*onehot(y_i) + (1-mix_lam)*onehot(y_{(i-1) mod n}), the labels
     * rolled by one as torchvision.transforms.v2 MixUp/CutMix make them;
     * label smoothing applies on top, as torch does for probability targets.
     * 0 reads as 1 too, so that a zero-initialised sf_batch is unmixed: a
     * mixing op that draws lam = 0 passes the smallest positive float (the
     * loss differs from lam = 0 by under 1e-37). */
    float mix_lam;
    uint64_t t_ready_ns;     /* host monotonic time the slot became READY (for traces) */
} sf_batch;

/* transform()'s and submit()'s return when the batch's data, not the
 * backend, failed: a JPEG file whose header passed but whose data the
 * decoder refuses. */
#define SF_BACKEND_BAD_INPUT (-2)
/* submit()'s and transform()'s return when an encoded batch's decoder, made
 * by the first encoded batch, could not be made (most often: the device
 * memory it needs is held by training). Nothing of the batch ran and nothing
 * of the decoder is kept; the next encoded batch tries again. */
#define SF_BACKEND_NO_DECODER (-3)

typedef enum sf_event_kind { SF_EV_SLOT_FREE = 1, SF_EV_STEP_DONE = 2 } sf_event_kind;

/* Why an optimizer step was skipped (sf_event.skipped). */
enum { SF_SKIP_NONFINITE = 1, SF_SKIP_EMPTY = 2 };

typedef struct sf_event {
    sf_event_kind kind;
    uint64_t id;
    void *token;
    int status;              /* 0 ok; else failed, message in err */
    char err[160];
    /* STEP_DONE only: */
    float loss;              /* mean over the batch */
    int correct;             /* samples (pixels) whose argmax equals the label */
    int correct5;            /* samples whose label is among the 5 largest logits (torch.topk
                                order: ties go to the lower class index); with fewer than 5
                                classes every sample counts */
    int n;
    int64_t n_labels;        /* labels scored: n, or n*H*W for segmentation; 0 means n */
    uint64_t step;           /* optimizer steps taken so far, this one included */
    float grad_norm;         /* L2 norm of the gradients applied at this step, before clipping;
                                0 when no optimizer step ran (eval, mid-accumulation) */
    int skipped;             /* the optimizer step was skipped (parameters, optimizer state and
                                step count unchanged): SF_SKIP_NONFINITE, the loss or a
                                gradient was NaN/Inf; SF_SKIP_EMPTY, a data-parallel step in
                                which no rank trained a sample (every batch of the round was
                                refused after the round began); 0 otherwise */
    int eval;                /* the batch's eval flag, echoed */
    double h2d_s, transform_s, step_s; /* stage durations (device events on CUDA) */
    uint64_t t_h2d_start_ns, t_transform_start_ns, t_step_start_ns, t_step_end_ns;
                             /* host monotonic times of the stage edges (0 if unknown) */
    /* An encoded batch: the decoder that ran ("hardware", "gpu_hybrid",
     * "hybrid" on CUDA, "libjpeg-turbo" on the reference backend; empty for a
     * raw batch), and the host time the submitting thread spent issuing the
     * decode (all of it on the reference backend; on CUDA the nvJPEG call,
     * which includes the hybrid backends' CPU Huffman decoding). */
    char decoder[16];
    double decode_host_s;
    /* An encoded batch on CUDA: its files libjpeg-turbo decoded on the host
     * (CMYK, YCCK, arithmetic-coded: forms nvJPEG does not take); the
     * decoder above ran the others ("libjpeg-turbo" when it ran them all). */
    int decoded_on_host;
} sf_event;

typedef struct sf_backend sf_backend;

/* Where a diagnose measurement starts (DESIGN.md §3, the caching method). */
typedef enum sf_bench_mode {
    SF_BENCH_STEP = 1,         /* one augmented batch cached on the device: step only */
    SF_BENCH_AUG_STEP = 2,     /* one raw uint8 batch cached on the device: augment + step */
    SF_BENCH_H2D_AUG_STEP = 3, /* one raw batch in pinned host memory: H2D + augment + step */
} sf_bench_mode;

typedef struct sf_device_stats {
    int valid;                   /* 0: fields unknown */
    double utilization_ratio;    /* GPU busy share, 0..1, over the driver's sample period */
    double memory_used_bytes;
    double memory_total_bytes;
    double power_watts;
    char name[64];
} sf_device_stats;

/* What the encoded batches' decoder holds (sf_backend_i.decoder_memory). */
typedef struct sf_decoder_memory {
    int made;            /* 1 once the first encoded batch made it */
    size_t device_bytes; /* staging areas and the decoder's own device buffers */
    size_t pinned_bytes; /* the decoder's own pinned host buffers */
    long long not_made;  /* encoded batches refused since build because it could not be made */
} sf_decoder_memory;

typedef struct sf_backend_i {
    const char *(*name)(sf_backend *be);                 /* "ref", "cuda" */
    /* Host memory for ring slots: pinned on CUDA, 64-byte aligned on the CPU. */
    void *(*host_alloc)(sf_backend *be, size_t bytes);
    void (*host_free)(sf_backend *be, void *p);
    /* Builds model + optimizer state; initialises parameters from cfg->seed.
     * May be called again to rebuild (all state is replaced). */
    int (*build)(sf_backend *be, const sf_model *m, const sf_train_cfg *cfg,
                 char *err, size_t errlen);
    /* Batches that may be submitted and not yet STEP_DONE at once. */
    int (*max_inflight)(sf_backend *be);
    /* Starts a batch. Returns 0, or -1 (err filled) when it could not even be
     * started, SF_BACKEND_BAD_INPUT when its data was refused,
     * SF_BACKEND_NO_DECODER when its decoder could not be made; then no
     * events follow for it. */
    int (*submit)(sf_backend *be, const sf_batch *b, char *err, size_t errlen);
    /* Writes up to max completions into ev and returns their count; waits up
     * to timeout_us for the first one when none is ready. */
    int (*poll)(sf_backend *be, sf_event *ev, int max, int timeout_us);
    /* Augmentation only, synchronous: out is float [n, c, out_h, out_w].
     * 0; SF_BACKEND_BAD_INPUT when the decoder refuses a sample's JPEG data
     * (the client's error: err names the sample); SF_BACKEND_NO_DECODER when
     * an encoded batch's decoder could not be made; -1 on any other failure. */
    int (*transform)(sf_backend *be, const sf_batch *b, float *out, char *err, size_t errlen);
    /* Parameters as one flat float buffer in sf_model layout (n_params floats).
     * Called with nothing in flight. */
    int (*get_params)(sf_backend *be, float *dst);
    int (*set_params)(sf_backend *be, const float *src);
    /* 0 when healthy; else a reason (e.g. device lost) in err. */
    int (*health)(sf_backend *be, char *err, size_t errlen);
    void (*destroy)(sf_backend *be);

    /* ---- training state beyond the parameters (checkpoints) ------------- */
    /* The optimizer state: SGD momentum buffers (AdamW: exp_avg) in sf_model
     * layout (n_params floats; written as zeros when momentum has never been
     * used, and for frozen parameters, so a checkpoint always has them) and
     * the optimizer step count. Called with
     * nothing in flight. */
    int (*get_opt_state)(sf_backend *be, float *momentum, uint64_t *step);
    int (*set_opt_state)(sf_backend *be, const float *momentum, uint64_t step);

    /* ---- the caching method (POST /v1/diagnose) -------------------------- */
    /* Runs `steps` training steps of batch b, after `warmup` more, starting
     * from the stage named by mode, and returns the elapsed wall seconds of
     * the timed steps in *seconds. Called with nothing in flight. The training
     * state (parameters, optimizer state, step count) is left as it was
     * found: the backend restores it. */
    int (*bench)(sf_backend *be, const sf_batch *b, sf_bench_mode mode, int warmup, int steps,
                 double *seconds, char *err, size_t errlen);

    /* ---- device telemetry (NVML on CUDA) ---------------------------------- */
    /* May be called from any thread. Returns -1 where the backend has no
     * device telemetry (then metrics are absent, not zero). */
    int (*device_stats)(sf_backend *be, sf_device_stats *out);

    /* ---- model buffers and AdamW (optional: NULL where the backend has none) */
    /* The model's buffers (n_buffers floats in sf_model layout: batchnorm
     * running_mean/var) and the one num_batches_tracked counter. Called with
     * nothing in flight. */
    int (*get_buffers)(sf_backend *be, float *dst, uint64_t *num_batches_tracked);
    int (*set_buffers)(sf_backend *be, const float *src, uint64_t num_batches_tracked);
    /* With optim AdamW, get/set_opt_state's buffer is exp_avg (first moment)
     * and this one is exp_avg_sq (n_params floats, sf_model layout; zeros for
     * frozen parameters). With SGD it reads as zeros and writes are ignored. */
    int (*get_opt_sq)(sf_backend *be, float *exp_avg_sq);
    int (*set_opt_sq)(sf_backend *be, const float *exp_avg_sq);

    /* ---- the plan (optional) ----------------------------------------------- */
    /* After build: what the backend chose, as plain text lines (layout,
     * precision, per-convolution engines and fused epilogues, the memory
     * plan), and in *device_bytes the device memory it allocated for the
     * model and its batch buffers (its own figure; the process also holds
     * the CUDA context and the libraries' kernels). 0, or -1 where there is
     * nothing to say. */
    int (*describe)(sf_backend *be, char *buf, size_t len, size_t *device_bytes);

    /* ---- data-parallel checks -------------------------------------------- */
    /* A hash of the parameter bytes (FNV-1a over the sf_model layout): equal
     * on every rank of a data-parallel job that kept its parameters
     * identical. Called with nothing in flight. */
    int (*param_digest)(sf_backend *be, uint64_t *digest);

    /* ---- what the backend computes in (optional) ----------------------------- */
    /* The precision the backend computes a model built for `asked` in, where
     * that differs (the reference computes tf32 as plain fp32). NULL: `asked`. */
    sf_precision (*precision_in_force)(sf_backend *be, sf_precision asked);

    /* ---- what the encoded batches' decoder holds (optional) ---------------- */
    /* May be called from any thread. Fills *out with what the decoder holds
     * now: nothing before the first encoded batch, which makes it, so a job
     * that posts raw pixels holds none. 0; -1 where the backend holds nothing
     * of its own for decoding (the reference decodes into the batch's
     * buffers). NULL: as -1. */
    int (*decoder_memory)(sf_backend *be, sf_decoder_memory *out);

    /* ---- joining and leaving a data-parallel job (optional) ----------------- */
    /* Makes the backend's own collectives of the job (NCCL's communicator)
     * through the job's rendezvous store, called by every rank once the
     * job's settings are agreed, before its first round: the store is rank
     * 0's main port, which a rank that drains closes, so nothing may wait
     * for it to be reached later (a job stopped before its first step would
     * have waited there for its grace period). 0, or -1 with err. NULL:
     * nothing of the job's is the backend's. */
    int (*dist_join)(sf_backend *be, char *err, size_t errlen);
    /* The job ended for this rank: the backend releases its own collectives
     * now. together: every rank leaves in this same round (a stop they all
     * saw), so they tear down together, as NCCL needs every rank of a host
     * to take part (a rank that kept its communicator until its exit would
     * wait there for the other ranks' exits); 0: the job failed, a peer
     * may be gone, and nothing may wait for it. Called with nothing in
     * flight; the backend trains no more data-parallel steps afterwards.
     * NULL: nothing of the job's is the backend's. */
    void (*dist_leave)(sf_backend *be, int together);
} sf_backend_i;

struct sf_backend {
    const sf_backend_i *i;
    void *ctx;
};

/* Constructors. sf_backend_cuda_new returns NULL (reason in err) when there is
 * no usable GPU or the binary was built without CUDA. */
sf_backend *sf_backend_ref_new(char *err, size_t errlen);
sf_backend *sf_backend_cuda_new(int device, char *err, size_t errlen);

#endif
