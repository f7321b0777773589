/* gpu/cuda/layers.h — the CUDA layers of the training step: cuDNN convolutions
 * through the graph (backend) API, cuBLAS linear layers, and our own kernels for
 * the pointwise ops, the reductions, the loss and the optimizer.
 *
 * Each function here is a launcher: it takes an explicit stream (or a library
 * handle already bound to one), enqueues work, checks the launch and returns
 * 0, or -1 with sf_cuda_last_error() (check.h) set. Nothing here allocates
 * device memory or synchronises, except sf_conv_plan_build, which runs at build
 * time only (it may time candidate engines on the handle's stream).
 *
 * Layouts. Activations are NCHW or NHWC (sf_layout); a cuDNN convolution on NHWC
 * activations takes its filter as KRSC ([oc][k][k][c]), on NCHW as KCRS
 * ([oc][c][k][k], PyTorch's layout). Linear layers use PyTorch's row-major
 * [out, in] weights and [n, features] activations in either layout.
 *
 * Precision. fp32 data is computed in strict fp32, or with TF32 tensor cores
 * where the caller allows it (tf32 flags). bf16 data (sf_dtype) is computed
 * as PyTorch autocast does: bf16 operands, tensor cores allowed, fp32
 * accumulation, each output rounded to bf16 once (the tf32 flags do not apply).
 *
 * Semantics are those of gpu/ref/ref.h, which tests/gpu/test_layers.cu checks.
 * Threads: any host thread may call a launcher; a handle must not be used by
 * two threads at once.
 */
#ifndef SF_GPU_CUDA_LAYERS_H
#define SF_GPU_CUDA_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <cublas_v2.h>

#include "check.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sf_layout { SF_LAYOUT_NCHW = 0, SF_LAYOUT_NHWC = 1 } sf_layout;

/* Element type of activations (and of the weight copies convolutions read):
 * fp32, or bf16 (__nv_bfloat16 bit patterns, rounded to nearest even; math and
 * accumulation in fp32, as autocast). Zero (a memset descriptor) is fp32. */
typedef enum sf_dtype { SF_DT_F32 = 0, SF_DT_BF16 = 1 } sf_dtype;
static inline size_t sf_dtype_size(sf_dtype t) { return t == SF_DT_BF16 ? 2 : 4; }

/* ---- convolutions (cuDNN graph API) -------------------------------------- */

typedef enum sf_conv_dir { SF_CONV_FWD = 0, SF_CONV_BWD_DATA = 1, SF_CONV_BWD_FILTER = 2 } sf_conv_dir;

/* One convolution shape. The output size follows ref.h:
 * oh = (h + 2*pad - k)/stride + 1. */
typedef struct sf_conv_desc {
    int n, c, h, w;          /* input [n, c, h, w] */
    int oc, k, stride, pad;  /* square kernel, symmetric padding */
    sf_layout layout;        /* NHWC activations pair with a KRSC filter */
    int tf32;                /* fp32 data: allow TF32 tensor-core engines (else strict
                                fp32); ignored for bf16 */
    sf_dtype dt;             /* x, w, y element type, in every direction (so for
                                BWD_FILTER dw is bf16 too); bf16: tensor cores
                                allowed, fp32 compute type (accumulation) */
    int align_x, align_w, align_y; /* byte alignment (1..16, a power of 2) of the
                                      pointers that will be bound to x, w, y;
                                      bytes whatever dt is (sf_cuda_ptr_align) */
    /* FWD only: a cuDNN pointwise epilogue fused into the graph,
     * y = relu?(conv(x, w) + b?). The bias tensor (uid 4, [1, oc, 1, 1]) is fp32
     * for either dt and bound through sf_conv_ptrs.b; align_b is its pointer's
     * alignment. The conv result and the sum are fp32 virtual tensors and the
     * pointwise math is fp32; only y has element type dt. For bf16 this is a
     * mixed-type graph: when no engine accepts it (or only engines that compile
     * at run time, see below), sf_conv_plan_build returns -1 with the error set,
     * and the caller falls back to the plain plan plus its own epilogue. */
    int fuse_bias, fuse_relu, align_b;
    int allow_rtc;           /* consider engines that compile at run time (off by default:
                                one picked a fused bf16 engine that gave wrong results for
                                a 2-byte-aligned x; the engine filter does not catch it) */
} sf_conv_desc;

/* "bf16", "tf32" or "fp32": the data type and math of a convolution, for
 * descriptions and messages. For a desc pass (d->dt, d->tf32) (what it allows);
 * for a built plan (p->dt, p->tensor_core) (what its engine does: an fp32 plan
 * on tensor cores computes in TF32). */
static inline const char *sf_conv_prec_name(sf_dtype dt, int tf32_or_tc)
{
    return dt == SF_DT_BF16 ? "bf16" : tf32_or_tc ? "tf32" : "fp32";
}

/* The three tensors of every direction, by role (the tensors' unique ids are
 * 1, 2, 3 in this order):
 *   FWD:        x (read)   w (read)     y (written)
 *   BWD_DATA:   x = dx (written)  w (read)   y = dy (read)
 *   BWD_FILTER: x (read)   w = dw (written)  y = dy (read)
 * Outputs are overwritten (beta = 0). ws: the workspace (>= plan's ws_bytes). */
typedef struct sf_conv_ptrs {
    void *x, *w, *y, *ws;
    void *b; /* fused bias (uid 4); NULL for plans without a fused bias */
} sf_conv_ptrs;

#define SF_CONV_KEEP 20

/* A finalised execution plan for one (shape, direction), and the descriptors it
 * was built from (kept alive as long as the plan). */
typedef struct sf_conv_plan {
    cudnnBackendDescriptor_t plan;              /* NULL when not built */
    cudnnBackendDescriptor_t keep[SF_CONV_KEEP];
    int n_keep;
    int64_t ws_bytes;                           /* workspace the plan needs */
    int64_t engine;                             /* cuDNN global engine index */
    int tensor_core;                            /* the engine uses tensor cores (TF32 on
                                                   fp32 data, bf16 MMA on bf16 data) */
    int tried;                                  /* candidates finalised and timed */
    int fused;                                  /* the graph has the bias/ReLU epilogue */
    float ms;                                   /* measured time when tuned, else -1 */
    sf_dtype dt;                                /* element type of x, w, y (the desc's) */
} sf_conv_plan;

/* Builds the plan (for FWD with fuse_bias/fuse_relu, the graph conv -> add bias
 * -> ReLU, which needs an engine that fuses it). x, w, y are tensors of type
 * d->dt (CUDNN_DATA_FLOAT or CUDNN_DATA_BFLOAT16); the convolution's compute
 * type is CUDNN_DATA_FLOAT for both. Heuristics (mode A, then fallback) list
 * engine configs, filtered by their numerical and behaviour notes:
 *   - REDUCED_PRECISION_REDUCTION (accumulates below fp32): dropped, any dt;
 *   - DOWN_CONVERT_INPUTS (converts the operands to a narrower type: fp32 to
 *     fp16/bf16, or bf16 to something narrower such as fp16): dropped, any dt
 *     (as before bf16: TF32 engines are recognised by TENSOR_CORE, below);
 *   - TENSOR_CORE: on fp32 data it means TF32 math, kept only when d->tf32;
 *     on bf16 data kept always (the bf16 products are exact and summed in
 *     fp32, which is the precision asked for);
 *   - behaviour RUNTIME_COMPILATION: dropped unless the environment sets
 *     SF_CUDNN_RTC=1.
 * Of the remaining configs the first max_candidates that finalise with a
 * workspace <= ws_limit are kept; when tune is non-NULL each is timed on those
 * buffers (on the handle's stream, synchronously) and the fastest wins, else
 * the first does. Build time only. -1 (error set, naming the shape, layout and
 * precision) when no config is left or a descriptor is rejected. */
int sf_conv_plan_build(cudnnHandle_t h, const sf_conv_desc *d, sf_conv_dir dir, size_t ws_limit,
                       int max_candidates, const sf_conv_ptrs *tune, sf_conv_plan *out);
void sf_conv_plan_destroy(sf_conv_plan *p);

/* A variant pack binds pointers to a plan's tensors; one pack serves any plan of
 * the same direction whose tensors those pointers satisfy (any batch size up to
 * the buffers' capacity). Build time only (allocates host memory). */
int sf_conv_vpack_make(const sf_conv_ptrs *p, cudnnBackendDescriptor_t *vp);
void sf_conv_vpack_destroy(cudnnBackendDescriptor_t vp);

/* Enqueues the convolution on the handle's stream. Capturable. */
int sf_conv_run(cudnnHandle_t h, const sf_conv_plan *p, cudnnBackendDescriptor_t vp);

/* Largest power of two <= 16 dividing the address (for sf_conv_desc.align_*). */
int sf_cuda_ptr_align(const void *p);

/* ---- linear layers (cuBLAS) ------------------------------------------------ */
/* Row-major x [n, in], w [out, in], y [n, out]; outputs overwritten.
 * tf32: CUBLAS_COMPUTE_32F_FAST_TF32, else CUBLAS_COMPUTE_32F. The handle needs a
 * workspace (cublasSetWorkspace) to be capturable; nothing here allocates. */
int sf_linear_fwd(cublasHandle_t h, const float *x, int n, int in, const float *w, int out,
                  float *y, int tf32);                      /* y = x w^T (bias separately) */
int sf_linear_bwd_data(cublasHandle_t h, const float *dy, int n, int in, const float *w, int out,
                       float *dx, int tf32);                /* dx = dy w */
int sf_linear_bwd_filter(cublasHandle_t h, const float *x, int n, int in, const float *dy, int out,
                         float *dw, int tf32);              /* dw = dy^T x */
/* The same with x, w, y, dy, dx of element type dt (bf16: cublasGemmEx with
 * CUDA_R_16BF operands and CUBLAS_COMPUTE_32F, i.e. tensor cores, fp32
 * accumulation, each output rounded once: the call adds
 * CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION to the handle's math mode
 * and restores the mode after); dw is always fp32 (the master
 * gradient: CUDA_R_32F output from bf16 operands); tf32 only matters for
 * SF_DT_F32, where these are exactly the float functions above (which call
 * them). -1 for an unknown dt. */
int sf_linear_fwd_dt(cublasHandle_t h, sf_dtype dt, const void *x, int n, int in, const void *w, int out,
                     void *y, int tf32);
int sf_linear_bwd_data_dt(cublasHandle_t h, sf_dtype dt, const void *dy, int n, int in, const void *w, int out,
                          void *dx, int tf32);
int sf_linear_bwd_filter_dt(cublasHandle_t h, sf_dtype dt, const void *x, int n, int in, const void *dy, int out,
                            float *dw, int tf32);

/* ---- pointwise ops and reductions ----------------------------------------- */
/* Tensors with a channel axis are viewed as [outer, c, inner]:
 * NCHW: outer = n, inner = h*w;  NHWC: outer = n*h*w, inner = 1;  [n, f]: outer = n, inner = 1. */

/* y = act(y + bias[c]) in place; bias may be NULL; relu 0/1. */
int sf_cuda_bias_act(float *y, const float *bias, size_t outer, int c, size_t inner, int relu,
                     cudaStream_t s);
/* y = max(x, 0) (NaN propagates, as torch.relu); x == y allowed. */
int sf_cuda_relu_fwd(const float *x, float *y, size_t len, cudaStream_t s);
/* dx = y > 0 ? dy : 0; dx == dy allowed. */
int sf_cuda_relu_bwd(const float *y, const float *dy, float *dx, size_t len, cudaStream_t s);

/* Floats of scratch sf_cuda_bias_grad needs for c channels. */
size_t sf_cuda_bias_grad_scratch(int c);
/* Backward of act(x + bias): when y (the forward output) is non-NULL, first
 * dy = y > 0 ? dy : 0 in place (relu backward); then, when db is non-NULL,
 * db[c] = sum over outer and inner of dy. Deterministic (fixed-order two-pass
 * reduction through scratch). */
int sf_cuda_bias_grad(float *dy, const float *y, size_t outer, int c, size_t inner, float *db,
                      float *scratch, cudaStream_t s);

/* Softmax cross-entropy over logits [n, k] with int32 labels, as sf_ref_xent:
 * out->loss = mean loss, out->correct = samples whose (first) argmax is the
 * label, out->bad = labels outside [0, k) (their loss and gradient are NaN);
 * dlogits = (softmax - onehot) / n. One block; deterministic. */
typedef struct sf_xent_out {
    float loss;
    int correct;
    int bad;
    int pad_;
} sf_xent_out;
int sf_cuda_xent(const float *logits, const int32_t *labels, int n, int k, float *dlogits,
                 sf_xent_out *out, cudaStream_t s);

/* Labels to int32. dtype: 0 uint8, 1 int32, 2 int64 (sf_label_dtype). */
int sf_cuda_labels_i32(const void *src, int dtype, int n, int32_t *dst, cudaStream_t s);

/* SGD with PyTorch semantics, as sf_ref_sgd, over one flat buffer of len
 * floats, in one launch; the hyper-parameters are read from device memory so a
 * captured graph picks up new values.
 *   p, m: parameters and momentum in model layout (PyTorch's).
 *   g:    gradients, in model layout except inside `segs`.
 *   segs: conv weights kept in KRSC device layout for NHWC convolutions: inside
 *         segment s, model index off + (o*c + ci)*rs + t  (t = ky*k + kx) holds
 *         device index off + (o*rs + t)*c + ci; g is read at the device index and
 *         the updated weight is also written to wdev at the device index.
 * The arithmetic rounds as the reference does (no fused multiply-add), so equal
 * gradients give bit-equal parameters. */
typedef struct sf_sgd_hyper {
    float lr, momentum, weight_decay, pad_;
} sf_sgd_hyper;
typedef struct sf_perm_seg {
    size_t off, len; /* floats, model offsets */
    int c, rs;       /* input channels, kernel taps (k*k) */
} sf_perm_seg;
#define SF_SGD_MAX_SEGS 64
typedef struct sf_sgd_segs {
    int n;
    sf_perm_seg s[SF_SGD_MAX_SEGS];
} sf_sgd_segs;
int sf_cuda_sgd(float *p, const float *g, float *m, float *wdev, size_t len,
                const sf_sgd_hyper *d_hyper, const sf_sgd_segs *segs, cudaStream_t s);

/* dst[b][c][r] = src[b][r][c] for b < batch, r < rows, c < cols (a batched
 * transpose: NHWC <-> NCHW activations, KCRS <-> KRSC filters). */
int sf_cuda_transpose(const float *src, float *dst, int batch, int rows, int cols, cudaStream_t s);

/* Fills with uniform values in [-scale, scale) keyed by seed (for timing on
 * real-looking data), or with one value (NaN poisoning in tests). */
int sf_cuda_fill_random(float *p, size_t len, uint64_t seed, float scale, cudaStream_t s);
int sf_cuda_fill(float *p, size_t len, float v, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_LAYERS_H */
