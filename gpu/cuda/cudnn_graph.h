/* gpu/cuda/cudnn_graph.h — the pieces of cuDNN's backend (graph) API that
 * the convolution plans (conv.cu) and the fused attention plans (sdpa.cu)
 * both build (and bench/cudnn_bn_fusion.cu): the list of descriptors a plan
 * keeps alive, tensor descriptors, convolution descriptors and operations,
 * pointwise operations, operation graphs, execution plans from
 * an engine config, variant packs, and the attribute setter for a descriptor
 * operand. Each builder sets the attributes in the order cuDNN's own
 * frontend does and finalizes what it made.
 *
 * Errors: the int functions return -1 with sf_cuda_last_error() set (check.h)
 * and leave nothing unkept; the cudnnStatus_t ones return cuDNN's status for
 * callers that weigh a refusal (an engine config that does not finalize is a
 * candidate less, not an error). Build time only: they allocate host memory.
 */
#ifndef SF_GPU_CUDA_CUDNN_GRAPH_H
#define SF_GPU_CUDA_CUDNN_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include <cudnn.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The descriptors a plan keeps alive until it is destroyed (its owner
 * destroys v[0..*n), last first): the owner's array of cap entries and its
 * count. what names the owner in the error when the array is full. */
typedef struct sf_cudnn_keep {
    cudnnBackendDescriptor_t *v;
    int *n;
    int cap;
    const char *what;
} sf_cudnn_keep;

/* Appends d to k; when k is full, destroys d and fails. */
int sf_cudnn_keep_add(const sf_cudnn_keep *k, cudnnBackendDescriptor_t d);

/* cudnnBackendSetAttribute for one descriptor operand (attributes of type
 * CUDNN_TYPE_BACKEND_DESCRIPTOR with one element). */
static inline cudnnStatus_t sf_cudnn_set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                                              cudnnBackendDescriptor_t v)
{
    return cudnnBackendSetAttribute(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

/* A finalized 4-d tensor descriptor, kept in k: element type dt, dims and
 * strides, unique id uid, byte alignment align (of the pointers that will be
 * bound to it, whatever dt is), virtual or not. */
int sf_cudnn_tensor(const sf_cudnn_keep *k, int64_t uid, cudnnDataType_t dt, const int64_t dims[4],
                    const int64_t str[4], int64_t align, bool is_virtual, cudnnBackendDescriptor_t *out);

/* A finalized pointwise operation y = mode(x), mode(x, b) or mode(x, b, t)
 * (b, t NULL where the mode takes fewer inputs) with math precision prec;
 * axis >= 0 sets CUDNN_ATTR_POINTWISE_AXIS (GEN_INDEX). The pointwise
 * descriptor and the operation are kept in k. */
int sf_cudnn_pointwise(const sf_cudnn_keep *k, cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis,
                       cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t,
                       cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t *out);

/* A finalized 2-d cross-correlation descriptor with fp32 accumulation (for
 * fp32 and bf16 data), padding pad on both sides, strides str and dilations
 * dil, each as [height, width]; kept in k. */
int sf_cudnn_conv2d(const sf_cudnn_keep *k, const int64_t pad[2], const int64_t str[2], const int64_t dil[2],
                    cudnnBackendDescriptor_t *out);

/* A finalized convolution operation of direction dir (0 forward, 1
 * backward-data, 2 backward-filter: sf_conv_dir's order) on conv, with the
 * three tensors by role as conv.h's sf_conv_ptrs names them (x or dx, w or
 * dw, y or dy), alpha 1 and beta (1: the output is added into); kept in k. */
int sf_cudnn_conv_op(const sf_cudnn_keep *k, int dir, cudnnBackendDescriptor_t conv, cudnnBackendDescriptor_t x,
                     cudnnBackendDescriptor_t w, cudnnBackendDescriptor_t y, float beta,
                     cudnnBackendDescriptor_t *out);

/* A finalized operation graph of the n operations ops on handle h, kept in k. */
int sf_cudnn_graph(const sf_cudnn_keep *k, cudnnHandle_t h, const cudnnBackendDescriptor_t *ops, int64_t n,
                   cudnnBackendDescriptor_t *out);

/* An execution plan of engine config cfg on h, finalized, and the workspace
 * it needs (*ws_bytes). *plan is NULL when the plan descriptor could not be
 * created; otherwise it is set whatever the status, and the caller destroys
 * it (it is not kept). */
cudnnStatus_t sf_cudnn_plan(cudnnHandle_t h, cudnnBackendDescriptor_t cfg, cudnnBackendDescriptor_t *plan,
                            int64_t *ws_bytes);

/* A finalized variant pack binding the n pointers ptrs to the tensors of
 * unique ids uids, and the workspace ws. On success the caller destroys *vp;
 * on failure *vp is NULL. */
cudnnStatus_t sf_cudnn_vpack(void *const *ptrs, const int64_t *uids, int64_t n, void *ws,
                             cudnnBackendDescriptor_t *vp);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_CUDNN_GRAPH_H */
