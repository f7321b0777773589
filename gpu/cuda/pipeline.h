/* gpu/cuda/pipeline.h — the training step of a model on the device: parameters,
 * optimizer state, activations, cuDNN plans per batch size, and the step
 * (forward, loss, backward, SGD) enqueued eagerly or replayed as a CUDA graph.
 *
 * The streams, events and batch buffers around it (DESIGN.md §1) live in
 * backend_cuda.cu; this module only enqueues the step of one buffer on one
 * stream. Layers come from layers.h.
 *
 * Ownership: the net owns parameters, gradients, momentum, activations, the
 * cuDNN workspace and its plans and graphs. The per-buffer inputs (sf_net_io:
 * augmented images, int32 labels, hyper-parameters, loss output) belong to the
 * caller, which fills them on its own streams and orders them before the step
 * with events.
 *
 * Memory: every device buffer is allocated by sf_net_create for cfg->max_batch;
 * a step allocates nothing. A batch size seen for the first time gets its
 * plans built (and timed) by sf_net_prepare, synchronously, once.
 *
 * Threads: one thread at a time (the engine thread). Errors: -1 with
 * sf_cuda_last_error() set.
 */
#ifndef SF_GPU_CUDA_PIPELINE_H
#define SF_GPU_CUDA_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

#include "layers.h"
#include "layers_w23.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "../model.h"

#define SF_NET_MAX_BUF 4     /* batch buffers a net can be bound to */
#define SF_NET_MAX_SHAPES 16 /* distinct batch sizes with built plans */

/* One batch buffer's device inputs and outputs. */
typedef struct sf_net_io {
    void *x;                   /* [max_batch, in_c*in_h*in_w] augmented input, net layout and
                                  element type (sf_net_dtype) */
    const int32_t *labels;     /* [max_batch] */
    const sf_sgd_hyper *hyper; /* lr, momentum, weight decay of this batch */
    sf_xent_out *result;       /* device: loss, correct, bad labels */
    sf_xent_out *h_result;     /* pinned host: the step ends by copying result here */
    const sf_adamw_hyper *adamw; /* AdamW hyper-parameters of this batch (step t filled by
                                    the caller); NULL with SGD */
} sf_net_io;

typedef struct sf_net_cfg {
    sf_layout layout;    /* activations; NHWC keeps KRSC copies of k>1 conv weights */
    int tf32;            /* TF32 tensor cores in convolutions and GEMMs */
    int max_batch;
    int nbuf;            /* sf_net_io entries, <= SF_NET_MAX_BUF */
    int tune;            /* engine configs timed per convolution (1: heuristics' pick) */
    int fork;            /* run each conv's backward-filter on a side stream, beside
                            its backward-data (own workspace; joined per layer) */
    int fuse;            /* try cuDNN's fused conv+bias(+ReLU) forward; kept per layer
                            only where it times faster than conv + our epilogue kernel
                            (needs tune > 1) */
    uint64_t seed;       /* parameter initialisation (sf_model_init_params) */
    int adamw;           /* optimizer: 0 SGD, 1 AdamW (general path only) */
    int accum;           /* gradient accumulation steps (> 1: general path only) */
    sf_dtype dt;         /* activations: fp32, or bf16 (general path only: a bf16 net
                            always runs there) */
} sf_net_cfg;

typedef struct sf_cuda_net sf_cuda_net;

/* Builds everything for m and cfg, initialises the parameters, and builds (and
 * times) the plans for max_batch on stream s, synchronously. handles must be
 * bound to s (cudnnSetStream, cublasSetStream) with a cuBLAS workspace set. */
int sf_net_create(sf_cuda_net **out, const sf_model *m, const sf_net_cfg *cfg, const sf_net_io *io,
                  cudnnHandle_t dnn, cublasHandle_t blas, cudaStream_t s);
void sf_net_destroy(sf_cuda_net *net);

/* Layout and element type of the input the net reads (the augmentation writes it). */
sf_layout sf_net_layout(const sf_cuda_net *net);
sf_dtype sf_net_dtype(const sf_cuda_net *net);

/* Makes batch size n runnable: builds its plans once (synchronous on s). */
int sf_net_prepare(sf_cuda_net *net, int n);

/* Enqueues one step on s for buffer b (0 <= b < nbuf) and n samples (prepared):
 * forward, loss, backward, SGD, and the copy of the result to io[b].h_result.
 * graph: capture the step once per (b, n) and replay it; else run it eagerly.
 * A capture that fails falls back to eager for good (sf_net_graph_error says why). */
int sf_net_step(sf_cuda_net *net, int b, int n, int graph);
const char *sf_net_graph_error(const sf_cuda_net *net); /* "" when none */

/* ---- the general path (W2/W3 features) --------------------------------------
 * A model with any W2/W3 feature (conv_transpose2d, batchnorm2d, maxpool2d,
 * global_avgpool, add / explicit inputs, freeze, segmentation, AdamW,
 * accumulation) or bf16 activations runs on a layer-graph executor in the
 * layout cfg asks for (NCHW when a flatten of a tensor with spatial extent
 * needs PyTorch's order: sf_net_layout says which) with activations of type
 * cfg->dt, ReLUs fused into their producers. Chain models of W1 in fp32/tf32
 * keep the op-list path above unchanged.
 *
 * Frozen prefix: sf_net_frozen_fwd enqueues the frozen layers' forward of
 * buffer b on stream s (the transform stream, after augmentation), with its
 * own cuDNN handle and workspace; its output lands in b's boundary buffer,
 * which the step of b reads. A no-op without frozen layers. */
int sf_net_general(const sf_cuda_net *net);       /* 1: the general path */
int sf_net_has_frozen(const sf_cuda_net *net);
int sf_net_frozen_fwd(sf_cuda_net *net, int b, int n, cudaStream_t s);
/* sf_net_step with the optimizer on (do_opt) or off (accumulation only). */
int sf_net_step_ex(sf_cuda_net *net, int b, int n, int graph, int do_opt);
/* Running statistics (n_buffers floats) and num_batches_tracked. */
int sf_net_get_buffers(sf_cuda_net *net, float *host, uint64_t *nbt);
int sf_net_set_buffers(sf_cuda_net *net, const float *host, uint64_t nbt);
/* AdamW exp_avg_sq (n_params floats; zeros with SGD, writes ignored). */
int sf_net_get_sq(sf_cuda_net *net, float *host);
int sf_net_set_sq(sf_cuda_net *net, const float *host);
/* Drops a partly accumulated gradient. */
int sf_net_reset_accum(sf_cuda_net *net);

/* Parameters in model layout (n_params floats). Synchronous; nothing may be in flight. */
int sf_net_get_params(sf_cuda_net *net, float *host);
int sf_net_set_params(sf_cuda_net *net, const float *host);

/* The SGD momentum buffer in model layout (n_params floats; it has no KRSC
 * copy: the SGD kernel reads and writes it in model layout). Zeros until a step
 * with momentum != 0 runs. Synchronous; nothing may be in flight. */
int sf_net_get_momentum(sf_cuda_net *net, float *host);
int sf_net_set_momentum(sf_cuda_net *net, const float *host);

/* A device-side snapshot of the training state: parameters then momentum,
 * sf_net_state_floats() floats of device memory. Both enqueue device-to-device
 * copies on the net's stream (ordered after the steps queued there) and do not
 * synchronise; restore also refreshes the KRSC weight copies. */
size_t sf_net_state_floats(const sf_cuda_net *net);
int sf_net_save_state(sf_cuda_net *net, float *dev);
int sf_net_restore_state(sf_cuda_net *net, const float *dev);

/* Diagnostics: runs one eager step of buffer b (it updates the parameters
 * like any step) with an event after every op, synchronously, and writes one
 * line per op with its time. */
int sf_net_profile(sf_cuda_net *net, int b, int n, char *buf, size_t len);

/* One line per convolution plan of batch size n: engine, workspace, time. */
void sf_net_describe(const sf_cuda_net *net, int n, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_PIPELINE_H */
