/* gpu/cuda/conv.h — 2-D convolutions through cuDNN's graph (backend) API:
 * plans built once per (shape, direction), variant packs that bind pointers,
 * and the launcher that runs a plan. A pointwise convolution for which cuDNN
 * offers no engine gets a plan that runs as cuBLAS GEMMs instead
 * (conv_gemm.h); callers see the same plan, pack and run. Contract and
 * precision: tensor.h; semantics: sf_ref_conv2d_* (gpu/ref/ref.h), checked by
 * tests/gpu/ops/conv.cu and tests/gpu/ops/conv_gemm.cu.
 */
#ifndef SF_GPU_CUDA_CONV_H
#define SF_GPU_CUDA_CONV_H

#include <stddef.h>
#include <stdint.h>

#include <cudnn.h>

#include "gpu/cuda/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- convolutions (cuDNN graph API) -------------------------------------- */

typedef enum sf_conv_dir { SF_CONV_FWD = 0, SF_CONV_BWD_DATA = 1, SF_CONV_BWD_FILTER = 2 } sf_conv_dir;

struct sf_cublas_ctx;

/* One convolution shape. The output size follows ref.h:
 * oh = (h + 2*pad - dilation*(k-1) - 1)/stride + 1. */
typedef struct sf_conv_desc {
    int n, c, h, w;          /* input [n, c, h, w] */
    int oc, k, stride, pad;  /* kernel, stride and padding (each side) along the height */
    int groups, dilation;    /* 0 or 1: a plain convolution. groups g: the filter is
                                [oc, c/g, k, kw] (KCRS; KRSC with NHWC), and cuDNN's
                                graph API reads the group count from the filter's
                                channel dimension; groups = c = oc is depthwise */
    int kw, stride_w, pad_w, dilation_w; /* the same along the width; 0: as along the height
                                (a square window, which every constructor but the
                                executor's conv2d leaves so) */
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
    int accumulate;          /* BWD_DATA only: dx += the data gradient (beta 1), summed in
                                fp32 and rounded once, for an input another layer's
                                gradient reaches too (a residual block's input); engines
                                without beta are left out, and no GEMM plan stands in
                                (the build fails, and the caller writes the gradient apart
                                and adds it) */
    int allow_rtc;           /* consider engines that compile at run time (off by default:
                                one picked a fused bf16 engine that gave wrong results for
                                a 2-byte-aligned x; the engine filter does not catch it) */
    size_t ws_prefer;        /* 0: every engine within the workspace limit competes on
                                time alone. Else an engine that needs more than ws_prefer
                                bytes of workspace is chosen only when it times at least
                                SF_CONV_WIDE_GAIN times faster than the fastest within
                                ws_prefer (or none fits there): a plan's workspace is
                                device memory the model cannot use, so a wide one must pay
                                for itself (VGG's 64->128 3x3 at 112x112, batch 256: the
                                only deterministic engine within 1 GiB ran its backward-
                                data in 209 ms) */
    const struct sf_cublas_ctx *blas; /* the cuBLAS handle (linear.h) GEMM plans run on, lent
                                         by the caller for as long as they exist; NULL: no
                                         GEMM plan (the build fails where it needs one) */
} sf_conv_desc;

#define SF_CONV_WIDE_GAIN 1.25f

/* The window along the width of d (its height's where d leaves it 0). */
typedef struct sf_conv_wdims {
    int k, stride, pad, dilation;
} sf_conv_wdims;
static inline sf_conv_wdims sf_conv_width(const sf_conv_desc *d)
{
    const int dh = d->dilation > 1 ? d->dilation : 1;
    sf_conv_wdims w = {d->kw ? d->kw : d->k, d->stride_w ? d->stride_w : d->stride, d->kw ? d->pad_w : d->pad,
                       d->dilation_w ? d->dilation_w : dh};
    return w;
}
/* 1 when d's window is the same along both axes (what the hand-written
 * convolution paths take; cuDNN takes any). */
static inline int sf_conv_square(const sf_conv_desc *d)
{
    const sf_conv_wdims w = sf_conv_width(d);
    return w.k == d->k && w.stride == d->stride && w.pad == d->pad && w.dilation == (d->dilation > 1 ? d->dilation : 1);
}

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
 * Outputs are overwritten (beta = 0), except dx under sf_conv_desc.accumulate.
 * ws: the workspace (>= plan's ws_bytes). */
typedef struct sf_conv_ptrs {
    void *x, *w, *y, *ws;
    void *b; /* fused bias (uid 4); NULL for plans without a fused bias */
} sf_conv_ptrs;

#define SF_CONV_KEEP 20

struct sf_conv_gemm;

/* A finalised execution plan for one (shape, direction), and the descriptors it
 * was built from (kept alive as long as the plan); or, with gemm set, the
 * cuBLAS form of a pointwise convolution (conv_gemm.h: plan and keep empty,
 * engine -1, tried 0). */
typedef struct sf_conv_plan {
    cudnnBackendDescriptor_t plan;              /* NULL when not built or a GEMM plan */
    struct sf_conv_gemm *gemm;                  /* non-NULL: runs as cuBLAS GEMMs */
    cudnnBackendDescriptor_t keep[SF_CONV_KEEP];
    int n_keep;
    int64_t ws_bytes;                           /* workspace the plan needs */
    int64_t engine;                             /* cuDNN global engine index */
    int tensor_core;                            /* the engine uses tensor cores (TF32 on
                                                   fp32 data, bf16 MMA on bf16 data) */
    int tried;                                  /* candidates finalised and timed */
    int fused;                                  /* the graph has the bias/ReLU epilogue */
    int accumulate;                             /* BWD_DATA adds into dx (the desc's) */
    float ms;                                   /* measured time when tuned, else -1 */
    sf_dtype dt;                                /* element type of x, w, y (the desc's) */
} sf_conv_plan;

/* A plan that can run: a cuDNN engine's or a GEMM one. */
static inline int sf_conv_plan_built(const sf_conv_plan *p) { return p->plan != NULL || p->gemm != NULL; }

/* Builds the plan (for FWD with fuse_bias/fuse_relu, the graph conv -> add bias
 * -> ReLU, which needs an engine that fuses it). x, w, y are tensors of type
 * d->dt (CUDNN_DATA_FLOAT or CUDNN_DATA_BFLOAT16); the convolution's compute
 * type is CUDNN_DATA_FLOAT for both. Heuristics (mode A, then fallback) list
 * engine configs, filtered by their numerical and behaviour notes:
 *   - REDUCED_PRECISION_REDUCTION (accumulates below fp32): dropped, any dt;
 *   - DOWN_CONVERT_INPUTS (converts the operands to a narrower type: fp32 to
 *     fp16/bf16, or bf16 to something narrower such as fp16): dropped, any dt
 *     (TF32 engines are recognised by TENSOR_CORE, below);
 *   - TENSOR_CORE: on fp32 data it means TF32 math, kept only when d->tf32;
 *     on bf16 data kept always (the bf16 products are exact and summed in
 *     fp32, which is the precision asked for);
 *   - behaviour RUNTIME_COMPILATION: dropped unless d->allow_rtc.
 * Of the remaining configs the first max_candidates that finalise with a
 * workspace <= ws_limit are kept; when tune is non-NULL each is timed on those
 * buffers (on the handle's stream, synchronously) and the fastest wins, else
 * the first does; with d->ws_prefer, among those within ws_prefer unless a
 * wider one wins by SF_CONV_WIDE_GAIN (timed) or none is within it. When no config is left (or cuDNN rejects the graph) and the
 * convolution is pointwise and unfused, the plan is the GEMM one
 * (conv_gemm.h; a fused one is refused, and the caller runs the plain plan
 * plus its own epilogue). Build time only. -1 (error set, naming the shape,
 * layout and precision) when neither exists. */
int sf_conv_plan_build(cudnnHandle_t h, const sf_conv_desc *d, sf_conv_dir dir, size_t ws_limit,
                       int max_candidates, const sf_conv_ptrs *tune, sf_conv_plan *out);
void sf_conv_plan_destroy(sf_conv_plan *p);

/* A variant pack binds pointers to a plan's tensors; one pack serves any plan of
 * the same direction whose tensors those pointers satisfy (any batch size up to
 * the buffers' capacity), cuDNN or GEMM. It holds cuDNN's variant pack and
 * the pointers themselves (which the GEMM plans read). Build time only
 * (allocates host memory); destroy accepts NULL. */
typedef struct sf_conv_vpack sf_conv_vpack;
int sf_conv_vpack_make(const sf_conv_ptrs *p, sf_conv_vpack **vp);
void sf_conv_vpack_destroy(sf_conv_vpack *vp);

/* Enqueues the convolution on the handle's stream. Capturable. */
int sf_conv_run(cudnnHandle_t h, const sf_conv_plan *p, const sf_conv_vpack *vp);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_CONV_H */
