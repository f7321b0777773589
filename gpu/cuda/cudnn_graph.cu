/* gpu/cuda/cudnn_graph.cu — the cuDNN backend-API builders that conv.cu and
 * sdpa.cu share. Contracts in cudnn_graph.h. */
#include "gpu/cuda/cudnn_graph.h"

#include "gpu/cuda/check.h"

/* cuDNN 9.x marks the handle attributes of op graphs and plans deprecated in
 * favour of device-property descriptors, which older 9.x releases lack; the
 * handle attributes work in every 9.x. */
#pragma nv_diag_suppress 1444
#pragma nv_diag_suppress 1215
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

extern "C" int sf_cudnn_keep_add(const sf_cudnn_keep *k, cudnnBackendDescriptor_t d)
{
    if (*k->n >= k->cap) {
        sf_cuda_set_error("%s:%d: %s: too many descriptors", __FILE__, __LINE__, k->what);
        cudnnBackendDestroyDescriptor(d);
        return -1;
    }
    k->v[(*k->n)++] = d;
    return 0;
}

/* A new descriptor of type t, kept in k. */
static int create(const sf_cudnn_keep *k, cudnnBackendDescriptorType_t t, cudnnBackendDescriptor_t *out)
{
    SF_CUDNN_CHECK(cudnnBackendCreateDescriptor(t, out));
    return sf_cudnn_keep_add(k, *out);
}

extern "C" int sf_cudnn_tensor(const sf_cudnn_keep *k, int64_t uid, cudnnDataType_t dt, const int64_t dims[4],
                               const int64_t str[4], int64_t align, bool is_virtual, cudnnBackendDescriptor_t *out)
{
    cudnnBackendDescriptor_t t;
    if (create(k, CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t))
        return -1;
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
    if (is_virtual)
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual));
    SF_CUDNN_CHECK(cudnnBackendFinalize(t));
    *out = t;
    return 0;
}

extern "C" int sf_cudnn_conv2d(const sf_cudnn_keep *k, const int64_t pad[2], const int64_t str[2],
                               const int64_t dil[2], cudnnBackendDescriptor_t *out)
{
    cudnnBackendDescriptor_t conv;
    if (create(k, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &conv))
        return -1;
    const int64_t nsp = 2;
    const cudnnDataType_t ct = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &nsp));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, str));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil));
    SF_CUDNN_CHECK(cudnnBackendFinalize(conv));
    *out = conv;
    return 0;
}

extern "C" int sf_cudnn_conv_op(const sf_cudnn_keep *k, int dir, cudnnBackendDescriptor_t conv,
                                cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t w, cudnnBackendDescriptor_t y,
                                float beta, cudnnBackendDescriptor_t *out)
{
    /* per direction: the operation type, then the attributes of x, w, y, the
     * convolution, alpha and beta */
    static const struct {
        cudnnBackendDescriptorType_t type;
        cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
    } A[3] = {
        {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
        {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
        {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA},
    };
    if (dir < 0 || dir > 2) {
        sf_cuda_set_error("%s:%d: sf_cudnn_conv_op: direction %d", __FILE__, __LINE__, dir);
        return -1;
    }
    cudnnBackendDescriptor_t op;
    const float alpha = 1.f;
    if (create(k, A[dir].type, &op))
        return -1;
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, A[dir].x, x));
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, A[dir].w, w));
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, A[dir].y, y));
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, A[dir].conv, conv));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, A[dir].alpha, CUDNN_TYPE_FLOAT, 1, &alpha));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(op, A[dir].beta, CUDNN_TYPE_FLOAT, 1, &beta));
    SF_CUDNN_CHECK(cudnnBackendFinalize(op));
    *out = op;
    return 0;
}

extern "C" int sf_cudnn_pointwise(const sf_cudnn_keep *k, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                                  int64_t axis, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                  cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                                  cudnnBackendDescriptor_t *out)
{
    cudnnBackendDescriptor_t pw, op;
    if (create(k, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw))
        return -1;
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec));
    if (axis >= 0)
        SF_CUDNN_CHECK(cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis));
    SF_CUDNN_CHECK(cudnnBackendFinalize(pw));
    if (create(k, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &op))
        return -1;
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw));
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x));
    if (b)
        SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b));
    if (t)
        SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t));
    SF_CUDNN_CHECK(sf_cudnn_set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y));
    SF_CUDNN_CHECK(cudnnBackendFinalize(op));
    *out = op;
    return 0;
}

extern "C" int sf_cudnn_graph(const sf_cudnn_keep *k, cudnnHandle_t h, const cudnnBackendDescriptor_t *ops,
                              int64_t n, cudnnBackendDescriptor_t *out)
{
    cudnnBackendDescriptor_t g;
    if (create(k, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g))
        return -1;
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, ops));
    SF_CUDNN_CHECK(cudnnBackendSetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
    SF_CUDNN_CHECK(cudnnBackendFinalize(g));
    *out = g;
    return 0;
}

extern "C" cudnnStatus_t sf_cudnn_plan(cudnnHandle_t h, cudnnBackendDescriptor_t cfg, cudnnBackendDescriptor_t *plan,
                                       int64_t *ws_bytes)
{
    *plan = NULL;
    *ws_bytes = 0;
    cudnnBackendDescriptor_t p;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    *plan = p;
    st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    if (st == CUDNN_STATUS_SUCCESS)
        st = sf_cudnn_set_desc(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendFinalize(p);
    int64_t cnt = 0;
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt,
                                      ws_bytes);
    return st;
}

extern "C" cudnnStatus_t sf_cudnn_vpack(void *const *ptrs, const int64_t *uids, int64_t n, void *ws,
                                        cudnnBackendDescriptor_t *vp)
{
    *vp = NULL;
    cudnnBackendDescriptor_t v;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &v);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    st = cudnnBackendSetAttribute(v, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(v, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(v, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendFinalize(v);
    if (st != CUDNN_STATUS_SUCCESS) {
        cudnnBackendDestroyDescriptor(v);
        return st;
    }
    *vp = v;
    return st;
}
