/* gpu/cuda/conv_gemm.cu — pointwise convolutions as cuBLAS GEMMs: the plan,
 * the fixed-order sum of the per-sample filter gradients, and the run on the
 * lent cuBLAS handle. Contracts and the why: conv_gemm.h. */
#include "gpu/cuda/conv_gemm.h"

#include "gpu/cuda/kernel_common.cuh"
#include "gpu/cuda/linear.h"
#include "gpu/cuda/pointwise.h"

/* How the filter gradient is formed (BWD_FILTER only). */
enum {
    WG_ONE = 0,  /* one GEMM over all n*hw positions (NHWC, hw = 1, or n = 1) straight into dw */
    WG_BATCHED,  /* NCHW: n per-sample products into the workspace, then summed in sample order */
    WG_SEQ,      /* NCHW: one GEMM per sample, beta = 1 after the first, in sample order */
};

struct sf_conv_gemm {
    sf_conv_dir dir;
    sf_dtype dt;
    sf_layout lay;
    int tf32;
    int n, c, oc; /* x [n, c, hw], w [oc, c], y [n, oc, hw] (NCHW; NHWC transposes the last two) */
    size_t hw;
    int epilogue; /* fused forward: bias (ptrs.b when fuse_bias) and ReLU after the GEMM */
    int fuse_bias, relu;
    int wg;            /* WG_*, BWD_FILTER */
    size_t acc_bytes;  /* fp32 products at the workspace's start (256-byte multiple; 0: none) */
    size_t blas_bytes; /* cuBLAS's workspace, after them */
    sf_cublas_ctx blas; /* the lent handle and the workspace to bind it back to */
};

/* ======================================================================== */
/* kernels                                                                  */
/* ======================================================================== */

/* out[i] = sum over b = 0..nb-1 of part[b*k + i], in that order, in fp32, rounded
 * once to T: the per-sample filter gradients of an NCHW convolution (nb = n),
 * or one fp32 product to bf16 (nb = 1). Each element's order is fixed whatever
 * the grid. */
template <typename T>
__global__ void k_sum_samples(const float *__restrict__ part, int nb, size_t k, T *__restrict__ out)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < k; i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int b = 0; b < nb; b++)
            s += part[(size_t)b * k + i];
        out[i] = cu_to<T>(s);
    }
}

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

static int sum_samples(sf_dtype dt, const float *part, int nb, size_t k, void *out, cudaStream_t s)
{
    const unsigned g = cu_ew_blocks(k);
    if (dt == SF_DT_BF16)
        k_sum_samples<cu_bf16><<<g, CU_TPB, 0, s>>>(part, nb, k, (cu_bf16 *)out);
    else
        k_sum_samples<float><<<g, CU_TPB, 0, s>>>(part, nb, k, (float *)out);
    SF_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ---- the plan ------------------------------------------------------------ */

extern "C" int sf_conv_gemm_ok(const sf_conv_desc *d)
{
    /* cuBLAS's dimensions are ints: n*hw is the row count of the NHWC GEMMs */
    return d->k == 1 && d->stride == 1 && d->pad == 0 && sf_conv_square(d) && d->groups <= 1 && d->dilation <= 1 &&
           (d->dt == SF_DT_F32 || d->dt == SF_DT_BF16) && d->n >= 1 && d->c >= 1 && d->oc >= 1 && d->h >= 1 &&
           d->w >= 1 && (double)d->n * d->h * d->w <= 2147483647.0;
}

static size_t round256(size_t b) { return (b + 255) & ~(size_t)255; }

static cublasComputeType_t compute_type(const sf_conv_gemm *g)
{
    return g->dt == SF_DT_F32 && g->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

/* Binds the lent cuBLAS handle to stream s and to the plan's part of ws
 * (none when ws leaves it unaligned or there is none). */
static int bind(const sf_conv_gemm *g, cudaStream_t s, void *ws)
{
    SF_CUBLAS_CHECK(cublasSetStream(g->blas.h, s));
    void *bws = ws ? (char *)ws + g->acc_bytes : NULL;
    size_t bytes = g->blas_bytes;
    if (!bws || bytes == 0 || ((uintptr_t)bws & 255u)) {
        bws = NULL;
        bytes = 0;
    }
    SF_CUBLAS_CHECK(cublasSetWorkspace(g->blas.h, bws, bytes));
    return 0;
}

/* Binds the lent handle back to the stream it had, the lender's workspace
 * and the math mode it had; every step is tried, the first failure returned. */
static cublasStatus_t bind_back(const sf_conv_gemm *g, cudaStream_t home, cublasMath_t mode)
{
    cublasStatus_t st = cublasSetStream(g->blas.h, home);
    const cublasStatus_t st_ws = cublasSetWorkspace(g->blas.h, g->blas.ws, g->blas.ws_bytes);
    const cublasStatus_t st_mode = sf_cublas_strict_end(g->blas.h, mode);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = st_ws;
    return st == CUBLAS_STATUS_SUCCESS ? st_mode : st;
}

/* dw = sum over samples of dy[n] x[n]^T, column-major: dw^T [c, oc]. */
static int run_wgrad(const sf_conv_gemm *g, const sf_conv_ptrs *p, cudaStream_t s)
{
    const cudaDataType_t t = g->dt == SF_DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t ct = compute_type(g);
    const float one = 1.f, zero = 0.f;
    const size_t es = sf_dtype_size(g->dt), k = (size_t)g->c * g->oc;
    if (g->wg == WG_ONE) {
        /* positions as rows: x [R, c], dy [R, oc] row-major are column-major
         * [c, R] and [oc, R]; dw^T [c, oc] = x . dy^T, k = R. NCHW with n = 1
         * is x^T [hw, c] and dy^T [hw, oc] column-major: dw^T = x^T' . dy^T. */
        const int rows = (int)((size_t)g->n * g->hw);
        if (g->lay == SF_LAYOUT_NHWC || g->hw == 1)
            SF_CUBLAS_CHECK(cublasGemmEx(g->blas.h, CUBLAS_OP_N, CUBLAS_OP_T, g->c, g->oc, rows, &one, p->x, t, g->c,
                                         p->y, t, g->oc, &zero, p->w, t, g->c, ct, CUBLAS_GEMM_DEFAULT));
        else
            SF_CUBLAS_CHECK(cublasGemmEx(g->blas.h, CUBLAS_OP_T, CUBLAS_OP_N, g->c, g->oc, (int)g->hw, &one, p->x, t,
                                         (int)g->hw, p->y, t, (int)g->hw, &zero, p->w, t, g->c, ct,
                                         CUBLAS_GEMM_DEFAULT));
        return 0;
    }
    /* NCHW, per sample: x[n] is column-major [hw, c], dy[n] [hw, oc];
     * dw^T [c, oc] = x[n]^T . dy[n], k = hw. */
    const int hwi = (int)g->hw;
    const long long sx = (long long)g->c * hwi, sy = (long long)g->oc * hwi;
    if (g->wg == WG_BATCHED) {
        SF_CUBLAS_CHECK(cublasGemmStridedBatchedEx(g->blas.h, CUBLAS_OP_T, CUBLAS_OP_N, g->c, g->oc, hwi, &one, p->x, t,
                                                   hwi, sx, p->y, t, hwi, sy, &zero, p->ws, CUDA_R_32F, g->c,
                                                   (long long)k, g->n, ct, CUBLAS_GEMM_DEFAULT));
        return sum_samples(g->dt, (const float *)p->ws, g->n, k, p->w, s);
    }
    /* WG_SEQ: fp32 accumulates in dw itself, bf16 in one fp32 product in the
     * workspace that is then rounded once */
    void *acc = g->dt == SF_DT_F32 ? p->w : p->ws;
    for (int i = 0; i < g->n; i++)
        SF_CUBLAS_CHECK(cublasGemmEx(g->blas.h, CUBLAS_OP_T, CUBLAS_OP_N, g->c, g->oc, hwi, &one,
                                     (const char *)p->x + es * (size_t)i * sx, t, hwi,
                                     (const char *)p->y + es * (size_t)i * sy, t, hwi, i ? &one : &zero, acc,
                                     CUDA_R_32F, g->c, ct, CUBLAS_GEMM_DEFAULT));
    if (g->dt != SF_DT_F32)
        return sum_samples(g->dt, (const float *)p->ws, 1, k, p->w, s);
    return 0;
}

/* The plan's GEMMs (and epilogue) on the bound handle, stream s. */
static int run_dir(const sf_conv_gemm *g, const sf_conv_ptrs *p, cudaStream_t s)
{
    switch (g->dir) {
    case SF_CONV_FWD:
        if (sf_linear_map_fwd_dt(g->blas.h, g->dt, g->lay, p->x, g->n, g->hw, g->c, p->w, g->oc, p->y, g->tf32))
            return -1;
        if (g->epilogue) {
            const size_t outer = g->lay == SF_LAYOUT_NHWC ? (size_t)g->n * g->hw : (size_t)g->n,
                         inner = g->lay == SF_LAYOUT_NHWC ? 1 : g->hw;
            return sf_cuda_bias_act_dt(g->dt, p->y, g->fuse_bias ? (const float *)p->b : NULL, outer, g->oc, inner,
                                       g->relu, s);
        }
        return 0;
    case SF_CONV_BWD_DATA:
        return sf_linear_map_bwd_data_dt(g->blas.h, g->dt, g->lay, p->y, g->n, g->hw, g->c, p->w, g->oc, p->x,
                                         g->tf32);
    case SF_CONV_BWD_FILTER:
        return run_wgrad(g, p, s);
    }
    sf_cuda_set_error("%s:%d: sf_conv_gemm_run: direction %d", __FILE__, __LINE__, (int)g->dir);
    return -1;
}

extern "C" int sf_conv_gemm_run(cudnnHandle_t h, const sf_conv_plan *plan, const sf_conv_ptrs *p)
{
    const sf_conv_gemm *g = plan->gemm;
    if (!g || !p) {
        sf_cuda_set_error("%s:%d: sf_conv_gemm_run: not a GEMM plan, or no pointers", __FILE__, __LINE__);
        return -1;
    }
    if (g->acc_bytes && !p->ws) {
        sf_cuda_set_error("%s:%d: sf_conv_gemm_run: the plan needs %zu bytes of workspace, none bound", __FILE__,
                          __LINE__, g->acc_bytes);
        return -1;
    }
    /* The handle is lent bound to its owner's stream and workspace: each run
     * binds it to h's stream (which the caller may have moved, as the
     * executor does for a forked backward-filter) and to the plan's own part
     * of ws (which no concurrent run shares), and binds it back after; the
     * strict math mode holds for all of the run's GEMMs, fp32 ones included. */
    cudaStream_t s, home;
    cublasMath_t mode;
    SF_CUDNN_CHECK(cudnnGetStream(h, &s));
    SF_CUBLAS_CHECK(cublasGetStream(g->blas.h, &home));
    SF_CUBLAS_CHECK(sf_cublas_strict_begin(g->blas.h, &mode));
    int rc = bind(g, s, p->ws);
    if (!rc)
        rc = run_dir(g, p, s);
    const cublasStatus_t st = bind_back(g, home, mode);
    if (st != CUBLAS_STATUS_SUCCESS && !rc) {
        sf_cuda_set_error("%s:%d: sf_conv_gemm_run: binding the cuBLAS handle back: %s", __FILE__, __LINE__,
                          cublasGetStatusString(st));
        return -1;
    }
    return rc;
}

/* Median of 3 timed runs after a warm-up, on h's stream; < 0 on failure. */
static float time_gemm(cudnnHandle_t h, const sf_conv_plan *plan, const sf_conv_ptrs *p)
{
    cudaStream_t s;
    if (cudnnGetStream(h, &s) != CUDNN_STATUS_SUCCESS || sf_conv_gemm_run(h, plan, p) ||
        cudaStreamSynchronize(s) != cudaSuccess)
        return -1.f;
    cudaEvent_t e[4];
    for (int i = 0; i < 4; i++)
        if (cudaEventCreate(&e[i]) != cudaSuccess) {
            for (int j = 0; j < i; j++)
                cudaEventDestroy(e[j]);
            return -1.f;
        }
    float t[3] = {-1.f, -1.f, -1.f};
    int ok = cudaEventRecord(e[0], s) == cudaSuccess;
    for (int r = 0; ok && r < 3; r++)
        ok = sf_conv_gemm_run(h, plan, p) == 0 && cudaEventRecord(e[r + 1], s) == cudaSuccess;
    ok = ok && cudaEventSynchronize(e[3]) == cudaSuccess;
    for (int r = 0; ok && r < 3; r++)
        ok = cudaEventElapsedTime(&t[r], e[r], e[r + 1]) == cudaSuccess;
    for (int i = 0; i < 4; i++)
        cudaEventDestroy(e[i]);
    if (!ok)
        return -1.f;
    float a = t[0], b = t[1], c = t[2], x;
    if (a > b) { x = a; a = b; b = x; }
    if (b > c) { x = b; b = c; c = x; }
    if (a > b) { x = a; a = b; b = x; }
    return b;
}

extern "C" void sf_conv_gemm_destroy(sf_conv_plan *p)
{
    if (!p || !p->gemm)
        return;
    free(p->gemm);
    p->gemm = NULL;
}

extern "C" int sf_conv_gemm_build(cudnnHandle_t h, const sf_conv_desc *d, sf_conv_dir dir, size_t ws_limit,
                                  const sf_conv_ptrs *tune, sf_conv_plan *out)
{
    memset(out, 0, sizeof *out);
    out->engine = -1;
    out->ms = -1.f;
    if ((unsigned)dir > SF_CONV_BWD_FILTER || !sf_conv_gemm_ok(d)) {
        sf_cuda_set_error("%s:%d: conv gemm: dir %d n=%d c=%d %dx%d oc=%d k=%d s=%d p=%d g=%d dil=%d dt=%d: not a "
                          "pointwise convolution the GEMM path takes",
                          __FILE__, __LINE__, (int)dir, d->n, d->c, d->h, d->w, d->oc, d->k, d->stride, d->pad,
                          d->groups, d->dilation, (int)d->dt);
        return -1;
    }
    if (!d->blas) {
        sf_cuda_set_error("%s:%d: conv gemm: dir %d n=%d c=%d oc=%d: no cuBLAS handle lent (sf_conv_desc.blas)",
                          __FILE__, __LINE__, (int)dir, d->n, d->c, d->oc);
        return -1;
    }
    /* A cuDNN engine refused just before (the reason this path is taken) can
     * leave an error pending in the CUDA runtime, which the first launch check
     * of a run would report as its own; that error is cuDNN's, handled. */
    (void)cudaGetLastError();
    sf_conv_gemm *g = (sf_conv_gemm *)calloc(1, sizeof *g);
    if (!g) {
        sf_cuda_set_error("%s:%d: conv gemm: out of host memory", __FILE__, __LINE__);
        return -1;
    }
    g->dir = dir;
    g->dt = d->dt;
    g->lay = d->layout;
    g->tf32 = d->dt == SF_DT_F32 && d->tf32;
    g->n = d->n;
    g->c = d->c;
    g->oc = d->oc;
    g->hw = (size_t)d->h * d->w;
    g->epilogue = dir == SF_CONV_FWD && (d->fuse_bias || d->fuse_relu);
    g->fuse_bias = g->epilogue && d->fuse_bias;
    g->relu = g->epilogue && d->fuse_relu;
    g->wg = WG_ONE;
    if (dir == SF_CONV_BWD_FILTER && g->lay == SF_LAYOUT_NCHW && g->hw > 1 && g->n > 1) {
        const size_t all = round256(sizeof(float) * (size_t)g->n * g->c * g->oc);
        const size_t one = round256(sizeof(float) * (size_t)g->c * g->oc);
        if (all <= ws_limit) {
            g->wg = WG_BATCHED;
            g->acc_bytes = all;
        } else {
            g->wg = WG_SEQ;
            g->acc_bytes = g->dt == SF_DT_F32 ? 0 : one;
        }
    }
    if (g->acc_bytes > ws_limit) {
        sf_cuda_set_error("%s:%d: conv gemm bwd_filter n=%d c=%d oc=%d: needs %zu bytes of workspace, the limit is "
                          "%zu",
                          __FILE__, __LINE__, g->n, g->c, g->oc, g->acc_bytes, ws_limit);
        free(g);
        return -1;
    }
    const size_t left = (ws_limit - g->acc_bytes) & ~(size_t)255;
    g->blas_bytes = left < SF_CONV_GEMM_BLAS_WS ? left : SF_CONV_GEMM_BLAS_WS;
    g->blas = *d->blas;
    out->gemm = g;
    out->ws_bytes = (int64_t)(g->acc_bytes + g->blas_bytes);
    out->tensor_core = d->dt == SF_DT_BF16 || g->tf32;
    out->fused = g->epilogue;
    out->dt = d->dt;
    if (tune) {
        out->ms = time_gemm(h, out, tune);
        if (out->ms < 0.f) {
            char why[SF_CUDA_ERR_LEN];
            snprintf(why, sizeof why, "%s", sf_cuda_last_error());
            sf_cuda_set_error("conv gemm n=%d c=%d oc=%d hw=%zu: timing run failed: %s", g->n, g->c, g->oc, g->hw,
                              why);
            sf_conv_gemm_destroy(out);
            return -1;
        }
    }
    return 0;
}
