/* gpu/cuda/executor.h — the network executor: one training step of any model
 * on the device (forward, loss, backward, optimizer), its parameters, optimizer
 * state, activations, cuDNN plans per batch size, and the step enqueued eagerly
 * or replayed as a CUDA graph. How it runs a model is described at the top of
 * executor.cu.
 *
 * The streams, events and batch buffers around it (docs/DESIGN.md) live in
 * backend_cuda.cu; this module only enqueues the step of one buffer on one
 * stream (and a frozen prefix's forward on the transform stream). The ops come
 * from the op-family headers listed in tensor.h.
 *
 * Ownership: the net owns parameters, gradients, optimizer state, activations,
 * the cuDNN workspaces and its plans and graphs. The per-buffer inputs
 * (sf_net_io: augmented images, int32 labels, hyper-parameters, loss output)
 * belong to the caller, which fills them on its own streams and orders them
 * before the step with events; the net reads buffer b's input in place for as
 * long as b's step runs.
 *
 * Memory: every device buffer is allocated by sf_net_create for cfg->max_batch;
 * a step allocates nothing. A batch size seen for the first time gets its
 * plans built (and timed) by sf_net_prepare, synchronously, once.
 *
 * Threads: one thread at a time (the engine thread). Errors: -1 with
 * sf_cuda_last_error() set.
 */
#ifndef SF_GPU_CUDA_EXECUTOR_H
#define SF_GPU_CUDA_EXECUTOR_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/cuda/activation.h"
#include "gpu/cuda/attention.h"
#include "gpu/cuda/batchnorm.h"
#include "gpu/cuda/channel_conv1d.h"
#include "gpu/cuda/channels.h"
#include "gpu/cuda/log_softmax.h"
#include "gpu/cuda/groupnorm.h"
#include "gpu/cuda/grn.h"
#include "gpu/cuda/upsample.h"
#include "gpu/cuda/concat.h"
#include "gpu/cuda/conv.h"
#include "gpu/cuda/conv_transpose.h"
#include "gpu/cuda/dropout.h"
#include "gpu/cuda/layout.h"
#include "gpu/cuda/linear.h"
#include "gpu/cuda/loss.h"
#include "gpu/cuda/mul.h"
#include "gpu/cuda/pad.h"
#include "gpu/cuda/prelu.h"
#include "gpu/cuda/optimizer.h"
#include "gpu/cuda/pointwise.h"
#include "gpu/cuda/pool.h"
#include "gpu/cuda/tokens.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "gpu/model.h"

#define SF_NET_MAX_BUF 4     /* batch buffers a net can be bound to */
#define SF_NET_MAX_SHAPES 16 /* distinct batch sizes with built plans */

/* The per-batch settings of a step beyond the optimizer's hyper-parameters,
 * in device memory (a captured graph reads the values of each replay). */
typedef struct sf_step_ctl {
    sf_loss_ctl loss;     /* label smoothing, mixing weight, gradient scale */
    float clip_grad_norm; /* 0: no clipping (torch.nn.utils.clip_grad_norm_'s max_norm) */
    /* Data-parallel training (grad_reduce): count[0] is the samples this
     * rank trains in the step (its batch's n; 0 for an empty contribution),
     * all-reduced in place with the last bucket into the samples the ranks
     * trained; count[1] is the samples they announced (sf_batch.global_n),
     * by which every rank's share was scaled. A batch refused after its
     * round began announced samples nobody trained: the gradient check then
     * scales the summed gradient by count[1] / count[0], so the step applies
     * the mean over the samples trained, and skips the step when that is 0.
     * Read only with grad_reduce. */
    float count[2];
    /* The batch's sequence number (sf_batch.seq): the key of its dropout and
     * stochastic-depth draws (dropout.h), read by the kernels of each replay. */
    uint64_t seq;
} sf_step_ctl;

/* One piece of a gradient bucket for the data-parallel hook: len elements
 * of type dt (SF_DT_F32, or SF_DT_BF16 for a bf16 net's convolution weight
 * gradients, which cuDNN writes in bf16) at device address p. */
typedef struct sf_grad_piece {
    void *p;
    size_t len;
    sf_dtype dt;
} sf_grad_piece;

/* One batch buffer's device inputs and outputs. */
typedef struct sf_net_io {
    void *x;                   /* [max_batch, in_c*in_h*in_w] augmented input, net layout and
                                  element type (sf_net_dtype) */
    const int32_t *labels;     /* [max_batch] (segmentation: [max_batch, out_h*out_w]) */
    const sf_sgd_hyper *hyper; /* lr, momentum, weight decay of this batch */
    sf_xent_out *result;       /* device: loss, correct, bad labels */
    sf_xent_out *h_result;     /* pinned host: the step ends by copying result here */
    const sf_adamw_hyper *adamw; /* AdamW hyper-parameters of this batch (step t filled by
                                    the caller); NULL with SGD */
    const sf_step_ctl *ctl;    /* loss settings and clipping of this batch; NULL: none */
} sf_net_io;

/* The plan options: what the net is built for, and how. The fields after
 * `dt` are the executor's own switches; zero is the measured best, and only
 * tests and benchmarks set them (to compare a fused or forked plan with the
 * plain one). */
typedef struct sf_net_cfg {
    sf_layout layout;    /* activations; NHWC keeps KRSC copies of k>1 conv weights. A model
                            that flattens a tensor with spatial extent for anything but
                            linear layers runs NCHW whatever this says (PyTorch's flatten
                            order): sf_net_layout tells */
    int tf32;            /* TF32 tensor cores in convolutions and GEMMs */
    int max_batch;
    int nbuf;            /* sf_net_io entries, <= SF_NET_MAX_BUF */
    int tune;            /* engine configs timed per convolution (1: heuristics' pick) */
    uint64_t seed;       /* parameter initialisation (sf_model_init_params) */
    uint64_t drop_seed;  /* the seed of dropout and stochastic-depth draws (dropout.h): the run's
                            seed, mixed with the rank in a data-parallel job as the reference
                            backend mixes it */
    int adamw;           /* optimizer: 0 SGD, 1 AdamW */
    int accum;           /* gradient accumulation steps (> 1: the optimizer runs every accum-th) */
    sf_dtype dt;         /* activations: fp32, or bf16 */
    int no_fork;         /* 1: each conv's backward-filter runs after its backward-data on
                            the compute stream instead of beside it on a side stream */
    int no_fuse;         /* 1: never use cuDNN's fused conv+bias(+ReLU) forward (else kept per
                            layer where it times faster than conv + epilogue; needs tune > 1) */
    int keep_relu;       /* 1: ReLUs stay separate kernels instead of being fused into
                            their producers */
    int allow_rtc;       /* 1: consider cuDNN engines that compile at run time (sf_conv_desc) */
    /* Data-parallel training: called once the gradient pieces of a bucket
     * are complete on stream s, before accumulation and the optimizer; it
     * enqueues their SUM all-reduce on s (in place, one group), so a
     * captured step holds it. Each rank's gradient is already weighted by
     * its share of the job's samples (sf_loss_ctl.grad_scale). Without
     * accumulation the buckets are runs of consecutive layers of at least
     * grad_bucket_bytes (the last one smaller; 0: the whole gradient), each
     * reduced on a stream of its own as soon as the backward has produced
     * it, in the backward's order, while the backward goes on, and a bf16
     * net's convolution weight gradients are reduced in bf16 where cuDNN
     * wrote them; with accumulation the whole fp32 gradient once, on the
     * step's stream after the backward. Every rank calls it in the same
     * order with the same pieces (sf_net_step_empty included). NULL: one
     * process. */
    int (*grad_reduce)(void *ctx, const sf_grad_piece *pieces, int n, cudaStream_t s);
    void *grad_reduce_ctx;
    /* Data-parallel training with grad_reduce: enqueues on s, at the end of
     * every training step and empty round (so that every rank calls it alike),
     * the broadcast of batchnorm's running statistics (n floats at p) from
     * rank 0 to every rank (distributed.batchnorm broadcast); ctx is
     * grad_reduce_ctx. NULL: each rank keeps its own. */
    int (*buf_broadcast)(void *ctx, float *p, size_t n, cudaStream_t s);
    /* Data-parallel training with grad_reduce, distributed.batchnorm sync
     * (torch.nn.SyncBatchNorm): enqueues on s the SUM all-reduce, in place,
     * of a training batchnorm's n per-channel sums at p (doubles, the
     * layout of sf_cuda_bn_sync_*), between the two halves of its forward
     * and of its backward; ctx is grad_reduce_ctx. s is the reduce stream,
     * so that these collectives and the buckets' keep one order on every
     * rank. Every rank calls it for every trainable batchnorm of every step
     * (sf_net_step_empty included), forward in layer order, backward in
     * reverse. NULL: each rank normalises over its own batch. */
    int (*stat_reduce)(void *ctx, double *p, size_t n, cudaStream_t s);
    size_t grad_bucket_bytes;
    int no_thin;         /* 1: run thin 1x1 convolutions (conv_thin.h) through cuDNN too */
    int no_patch;        /* 1: run non-overlapping convolutions' backward (conv_patch.h) through cuDNN too */
    int no_dw;           /* 1: run depthwise NHWC convolutions on cuDNN alone, never timing conv_dw.h's kernels */
    int force_dw;        /* 1: run them on conv_dw.h's kernels in every direction, untimed (tests of that path) */
    int no_s2d;          /* 1: run strided few-channel convolutions as they are, not in their
                            space-to-depth form (conv_s2d.h) */
    int no_bn_fuse;      /* 1: a residual add after a batchnorm, or a batchnorm + ReLU's maxpool,
                            run as kernels of their own, not in one pass with the batchnorm */
    int no_lt;           /* 1: linear layers with a bias (and self_attention's projections) as
                            cuBLAS GEMMs plus our bias kernel, not cuBLASLt GEMMs with the bias
                            in their epilogue (linear.h) */
    int no_acc;          /* 1: a conv's data gradient into an input another layer's gradient
                            reaches too is written apart and added, never accumulated by cuDNN's
                            plan (sf_conv_desc.accumulate) */
    int no_share;        /* 1: a residual add writes both inputs' gradients, never one that a
                            batchnorm input reads as its own (gop.dy_of) */
    int no_lt_tune;      /* 1: cuBLASLt plans take its first algorithm untimed and backward-data
                            GEMMs stay on cuBLAS (linear.h: sf_linear_lt_desc.tune) */
} sf_net_cfg;

typedef struct sf_cuda_net sf_cuda_net;

/* Builds everything for m and cfg, initialises the parameters, and builds (and
 * times) the plans for max_batch on stream s, synchronously. The handles must
 * be bound to s (cudnnSetStream, cublasSetStream), blas->h to the workspace
 * blas->ws (cublasSetWorkspace); the net keeps a copy of *blas and lends it
 * to the convolutions that run as cuBLAS GEMMs (conv_gemm.h). */
int sf_net_create(sf_cuda_net **out, const sf_model *m, const sf_net_cfg *cfg, const sf_net_io *io,
                  cudnnHandle_t dnn, const sf_cublas_ctx *blas, cudaStream_t s);
void sf_net_destroy(sf_cuda_net *net);

/* Layout and element type of the input the net reads (the augmentation writes it). */
sf_layout sf_net_layout(const sf_cuda_net *net);
sf_dtype sf_net_dtype(const sf_cuda_net *net);

/* Makes batch size n runnable: builds its plans once (synchronous on s). */
int sf_net_prepare(sf_cuda_net *net, int n);

/* Frozen prefix (model.freeze): sf_net_frozen_fwd enqueues the frozen layers'
 * forward of buffer b on stream s (the transform stream, after augmentation)
 * with its own workspace; its output lands in b's boundary buffer, which the
 * step of b reads. A no-op without frozen layers. */
int sf_net_frozen_fwd(sf_cuda_net *net, int b, int n, cudaStream_t s);

/* Enqueues one step on s for buffer b (0 <= b < nbuf) and n samples (prepared):
 * forward, loss, backward, then the optimizer when do_opt (else the gradient
 * is only accumulated), and the copy of the result to io[b].h_result.
 * graph: capture the step once per (b, n, do_opt) and replay it; else run it
 * eagerly. A capture that fails falls back to eager for good
 * (sf_net_graph_error says why). */
int sf_net_step(sf_cuda_net *net, int b, int n, int graph, int do_opt);
const char *sf_net_graph_error(const sf_cuda_net *net); /* "" when none */
/* A data-parallel round this rank joins without a batch: a zero gradient
 * through grad_reduce, accumulation and the optimizer (when do_opt), a zero
 * result in io[b]; eager, on the net's stream. */
int sf_net_step_empty(sf_cuda_net *net, int b, int do_opt);
/* The digest of the parameters (sf_cuda_digest over the device layout),
 * synchronous; nothing may be in flight. */
int sf_net_param_digest(sf_cuda_net *net, uint64_t *digest);
/* An evaluation step of buffer b: the forward in eval mode (batchnorm on its
 * running statistics, which stay as they are), the loss and hits into
 * io[b].result and its host copy; no backward, no optimizer, no state
 * written. Replayed as its own graph like sf_net_step. */
int sf_net_eval(sf_cuda_net *net, int b, int n, int graph);
/* Buffer b's last gradient check (pinned host memory, valid once its step
 * has completed): the pre-clip norm, the clipping scale, and skip = 1 when
 * the loss or a gradient was NaN/Inf and the optimizer changed nothing. All
 * zero after an evaluation step or a step that did not run the optimizer. */
const sf_grad_state *sf_net_grad_state(const sf_cuda_net *net, int b);
/* Data-parallel training: the seconds buffer b's last step spent in its
 * gradient all-reduces (the collectives alone, summed over the buckets),
 * valid once the step is done. */
double sf_net_allreduce_s(const sf_cuda_net *net, int b);
/* Enqueues on the net's stream the copy of buffer b's last step's logits
 * (fp32, sf_model's layout: [n, classes] or [n, classes, out_h, out_w]) to
 * host; call it right after that step, before the next one. */
int sf_net_copy_logits(sf_cuda_net *net, int b, int n, float *host);

/* The training state crosses here in PyTorch's layout (sf_model's: n_params
 * floats); the net keeps it in its device layout and permutes on the host.
 * Parameters: synchronous; nothing may be in flight. */
int sf_net_get_params(sf_cuda_net *net, float *host);
int sf_net_set_params(sf_cuda_net *net, const float *host);

/* The SGD momentum buffer (AdamW: exp_avg). Zeros until a step with
 * momentum != 0 runs. Synchronous; nothing in flight. With SGD the buffer
 * exists only from sf_net_use_momentum on: the caller calls it before it
 * enqueues a step whose hyper-parameters have momentum != 0 (a set of
 * nonzero momentum calls it too). */
int sf_net_use_momentum(sf_cuda_net *net);
/* The training steps' CUDA graphs dropped (captured again at their next
 * use): a data-parallel rank leaving its job drops the graphs that captured
 * its all-reduces, each of which holds a reference on the communicator
 * that its destruction waits for. Nothing in flight. */
void sf_net_drop_step_graphs(sf_cuda_net *net);
int sf_net_get_momentum(sf_cuda_net *net, float *host);
int sf_net_set_momentum(sf_cuda_net *net, const float *host);
/* AdamW exp_avg_sq (n_params floats; zeros with SGD, writes ignored). */
int sf_net_get_sq(sf_cuda_net *net, float *host);
int sf_net_set_sq(sf_cuda_net *net, const float *host);
/* Running statistics (n_buffers floats) and num_batches_tracked. */
int sf_net_get_buffers(sf_cuda_net *net, float *host, uint64_t *nbt);
int sf_net_set_buffers(sf_cuda_net *net, const float *host, uint64_t nbt);
/* Drops a partly accumulated gradient. */
int sf_net_reset_accum(sf_cuda_net *net);
/* Zeroes the device's count of skipped steps (sf_adamw_hyper.skips_counted
 * counts from the same zero), with nothing in flight. */
int sf_net_reset_skips(sf_cuda_net *net);

/* A device-side snapshot of the training state (parameters, optimizer state,
 * running statistics, accumulated gradient), sf_net_state_floats() floats of
 * device memory. Both enqueue device-to-device copies on the net's stream
 * (ordered after the steps queued there) and do not synchronise; restore also
 * refreshes the device copies of the weights. */
size_t sf_net_state_floats(const sf_cuda_net *net);
int sf_net_save_state(sf_cuda_net *net, float *dev);
int sf_net_restore_state(sf_cuda_net *net, const float *dev);

/* Diagnostics: runs one eager step of buffer b (it updates the parameters
 * like any step) with an event after every layer, synchronously, and writes
 * one line per layer with its time. */
int sf_net_profile(sf_cuda_net *net, int b, int n, char *buf, size_t len);

/* One line per convolution plan of batch size n (engine, fused epilogue,
 * workspace, time), then layout, precision and workspaces. */
void sf_net_describe(const sf_cuda_net *net, int n, char *buf, size_t len);
/* Device memory the net holds (everything it allocated). */
size_t sf_net_device_bytes(const sf_cuda_net *net);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_EXECUTOR_H */
