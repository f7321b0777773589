/* bench/cudnn_bn_fusion.cu — whether cuDNN's fused convolution + batchnorm
 * graphs would pay in a training step: for ResNet-50's convolution shapes
 * (bf16, NHWC, batch 256 by default), the fastest engine of three cuDNN
 * graphs, each timed as the best of five runs:
 *
 *   conv       the convolution alone (what the executor runs);
 *   conv+stats the convolution with its output's per-channel sum and sum of
 *              squares in the same graph (a GEN_STATS operation on y): the
 *              batchnorm statistics a training forward would then not read y
 *              for;
 *   sbr+conv+stats the same with the previous batchnorm's scale, bias and
 *              ReLU applied to x inside the graph (MLPerf's ConvBNfprop
 *              pattern), so the previous batchnorm's output is never written;
 *
 * beside the executor's own statistics pass over the same y
 * (sf_cuda_bn_fwd_train_dt with y NULL: the statistics alone) and its apply +
 * ReLU pass over x. The fused graphs pay where their time is below the plain
 * convolution's plus the passes they remove.
 *
 * A benchmark is also a test: each fused graph's sums are checked against a
 * double-precision sum of the y it wrote (relative 1e-4); a graph whose sums
 * are off gets no time and the program exits 1.
 *
 *   build/bench/cudnn_bn_fusion [--batch N]
 *
 * Prints a line per shape and graph, and one JSON line per shape. Exits 0
 * with "SKIPPED: no CUDA device" without a GPU. Results:
 * bench/results/2026-11-30-h200-dgrad-accumulate.md.
 */
#include <cuda_bf16.h>
#include <math.h>
#include <string.h>

#include <vector>

#include "gpu/cuda/batchnorm.h"
#include "gpu/cuda/cudnn_graph.h"
#include "gpu/cuda/program.h"

#define CKDNN(call)                                                                                          \
    do {                                                                                                     \
        cudnnStatus_t st_ = (call);                                                                          \
        if (st_ != CUDNN_STATUS_SUCCESS) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudnnGetErrorString(st_));         \
            return -1;                                                                                       \
        }                                                                                                    \
    } while (0)

struct shape {
    int c, h, oc, k, pad;
};

enum { G_CONV, G_STATS, G_SBR, G_N };
static const char *g_name[G_N] = {"conv", "conv+stats", "sbr+conv+stats"};

/* Tensor uids: x 1, w 2, y 3, sum 4, sqsum 5, scale 6, bias 7; virtual 11-13. */
struct bufs {
    void *x, *w, *y, *ws;
    float *sum, *sq, *scale, *bias;
    size_t ws_bytes;
};

static void nhwc(int64_t n, int64_t c, int64_t h, int64_t w, int64_t d[4], int64_t s[4])
{
    d[0] = n, d[1] = c, d[2] = h, d[3] = w;
    s[0] = h * w * c, s[1] = 1, s[2] = w * c, s[3] = c;
}

/* Builds graph g of shape S at batch n into graph (descriptors in k). */
static int build(cudnnHandle_t h, const sf_cudnn_keep *k, const shape &S, int n, int g, cudnnBackendDescriptor_t *graph)
{
    const int64_t oh = S.h + 2 * S.pad - S.k + 1;
    int64_t xd[4], xs[4], wd[4], ws[4], yd[4], ys[4], cd[4], cs[4], id[4], is[4];
    nhwc(n, S.c, S.h, S.h, xd, xs);
    nhwc(S.oc, S.c, S.k, S.k, wd, ws);
    nhwc(n, S.oc, oh, oh, yd, ys);
    nhwc(1, S.oc, 1, 1, cd, cs);
    nhwc(1, S.c, 1, 1, id, is);
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t tx, tw, ty, ops[5];
    int nops = 0;
    if (sf_cudnn_tensor(k, 1, bf, xd, xs, 16, false, &tx) || sf_cudnn_tensor(k, 2, bf, wd, ws, 16, false, &tw) ||
        sf_cudnn_tensor(k, 3, bf, yd, ys, 16, false, &ty))
        return -1;
    cudnnBackendDescriptor_t cin = tx;
    if (g == G_SBR) { /* relu(x * scale + bias), fp32 math, the conv reads it as bf16 */
        cudnnBackendDescriptor_t tsc, tbi, t1, t2, t3;
        if (sf_cudnn_tensor(k, 6, f32, id, is, 16, false, &tsc) || sf_cudnn_tensor(k, 7, f32, id, is, 16, false, &tbi) ||
            sf_cudnn_tensor(k, 11, f32, xd, xs, 16, true, &t1) || sf_cudnn_tensor(k, 12, f32, xd, xs, 16, true, &t2) ||
            sf_cudnn_tensor(k, 13, bf, xd, xs, 16, true, &t3) ||
            sf_cudnn_pointwise(k, CUDNN_POINTWISE_MUL, f32, -1, tx, tsc, NULL, t1, &ops[nops++]) ||
            sf_cudnn_pointwise(k, CUDNN_POINTWISE_ADD, f32, -1, t1, tbi, NULL, t2, &ops[nops++]) ||
            sf_cudnn_pointwise(k, CUDNN_POINTWISE_RELU_FWD, f32, -1, t2, NULL, NULL, t3, &ops[nops++]))
            return -1;
        cin = t3;
    }
    cudnnBackendDescriptor_t conv, op;
    const int64_t pad[2] = {S.pad, S.pad}, one2[2] = {1, 1};
    if (sf_cudnn_conv2d(k, pad, one2, one2, &conv))
        return -1;
    if (sf_cudnn_conv_op(k, 0, conv, cin, tw, ty, 0.f, &op))
        return -1;
    ops[nops++] = op;
    if (g != G_CONV) {
        cudnnBackendDescriptor_t tsum, tsq, gs;
        const cudnnGenStatsMode_t gm = CUDNN_GENSTATS_SUM_SQSUM;
        if (sf_cudnn_tensor(k, 4, f32, cd, cs, 16, false, &tsum) || sf_cudnn_tensor(k, 5, f32, cd, cs, 16, false, &tsq))
            return -1;
        CKDNN(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR, &gs));
        if (sf_cudnn_keep_add(k, gs))
            return -1;
        CKDNN(cudnnBackendSetAttribute(gs, CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &gm));
        CKDNN(cudnnBackendSetAttribute(gs, CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f32));
        CKDNN(sf_cudnn_set_desc(gs, CUDNN_ATTR_OPERATION_GENSTATS_XDESC, ty));
        CKDNN(sf_cudnn_set_desc(gs, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, tsum));
        CKDNN(sf_cudnn_set_desc(gs, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, tsq));
        CKDNN(cudnnBackendFinalize(gs));
        ops[nops++] = gs;
    }
    return sf_cudnn_graph(k, h, ops, nops, graph);
}

/* Best of five timed runs of run() (ms). */
template <class F> static float best5(cudaStream_t s, F run)
{
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
        float ms = 0.f;
        CU(cudaEventRecord(e0, s));
        run();
        CU(cudaEventRecord(e1, s));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&ms, e0, e1));
        best = ms < best ? ms : best;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return best;
}

/* The fastest engine of graph g over the configs of heuristics mode A (then
 * the fallback list when A has none that runs): *ms, and *engines, how many
 * ran. -1 when the graph is refused. */
static int time_graph(cudnnHandle_t h, cudaStream_t s, const shape &S, int n, int g, const bufs &B, float *ms,
                      int *engines)
{
    cudnnBackendDescriptor_t keep[24];
    int nk = 0;
    const sf_cudnn_keep k = {keep, &nk, 24, "bench graph"};
    cudnnBackendDescriptor_t graph;
    *ms = -1.f;
    *engines = 0;
    int rc = build(h, &k, S, n, g, &graph);
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int mi = 0; mi < 2 && !rc && *engines == 0; mi++) {
        cudnnBackendDescriptor_t heur;
        int64_t cnt = 0;
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur) != CUDNN_STATUS_SUCCESS)
            break;
        if (sf_cudnn_set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph) != CUDNN_STATUS_SUCCESS ||
            cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[mi]) !=
                CUDNN_STATUS_SUCCESS ||
            cudnnBackendFinalize(heur) != CUDNN_STATUS_SUCCESS ||
            cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &cnt,
                                     NULL) != CUDNN_STATUS_SUCCESS) {
            cudnnBackendDestroyDescriptor(heur);
            continue;
        }
        std::vector<cudnnBackendDescriptor_t> cfg((size_t)cnt);
        for (auto &c : cfg)
            cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &c);
        int64_t got = 0;
        if (cnt > 0)
            cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, cnt, &got,
                                     cfg.data());
        for (int64_t ci = 0; ci < got && ci < 12; ci++) {
            cudnnBackendDescriptor_t plan = NULL, vp = NULL;
            int64_t wsb = 0;
            void *ptrs[7] = {B.x, B.w, B.y, B.sum, B.sq, B.scale, B.bias};
            const int64_t uids[7] = {1, 2, 3, 4, 5, 6, 7}, np = g == G_CONV ? 3 : g == G_STATS ? 5 : 7;
            if (sf_cudnn_plan(h, cfg[ci], &plan, &wsb) == CUDNN_STATUS_SUCCESS && (size_t)wsb <= B.ws_bytes &&
                sf_cudnn_vpack(ptrs, uids, np, B.ws, &vp) == CUDNN_STATUS_SUCCESS &&
                cudnnBackendExecute(h, plan, vp) == CUDNN_STATUS_SUCCESS && cudaStreamSynchronize(s) == cudaSuccess) {
                const float t = best5(s, [&] { cudnnBackendExecute(h, plan, vp); });
                *ms = *ms < 0.f || t < *ms ? t : *ms;
                (*engines)++;
            }
            cudaGetLastError();
            if (vp)
                cudnnBackendDestroyDescriptor(vp);
            if (plan)
                cudnnBackendDestroyDescriptor(plan);
        }
        for (auto &c : cfg)
            cudnnBackendDestroyDescriptor(c);
        cudnnBackendDestroyDescriptor(heur);
    }
    while (nk > 0)
        cudnnBackendDestroyDescriptor(keep[--nk]);
    return rc || *engines == 0 ? -1 : 0;
}

/* Whether the graph's sums are those of the y it wrote (relative 1e-4 of each
 * channel's scale); prints the worst. */
static int sums_ok(const char *what, const bufs &B, size_t ny, int oc)
{
    std::vector<__nv_bfloat16> y(ny);
    std::vector<float> sum(oc), sq(oc);
    CU(cudaMemcpy(y.data(), B.y, ny * 2, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(sum.data(), B.sum, 4 * (size_t)oc, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(sq.data(), B.sq, 4 * (size_t)oc, cudaMemcpyDeviceToHost));
    std::vector<double> rs(oc, 0.0), rq(oc, 0.0);
    for (size_t e = 0; e < ny; e++) {
        const double v = __bfloat162float(y[e]);
        rs[e % oc] += v;
        rq[e % oc] += v * v;
    }
    double worst = 0.0;
    for (int c = 0; c < oc; c++) {
        worst = fmax(worst, fabs(sum[c] - rs[c]) / (sqrt(rq[c]) + fabs(rs[c]) + 1e-30));
        worst = fmax(worst, fabs(sq[c] - rq[c]) / (rq[c] + 1e-30));
    }
    printf("  %s: sums against the y it wrote, worst relative %.2e\n", what, worst);
    return worst <= 1e-4;
}

int main(int argc, char **argv)
{
    int n = 256;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            n = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: cudnn_bn_fusion [--batch N]\n");
            return 2;
        }
    }
    if (skip_without_device())
        return 0;
    cudaStream_t s = test_stream();
    cudnnHandle_t h;
    if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS || cudnnSetStream(h, s) != CUDNN_STATUS_SUCCESS) {
        printf("FAIL: cudnnCreate\n");
        return 1;
    }
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("cudnn_bn_fusion: %s, cuDNN %zu, bf16 NHWC, batch %d\n", prop.name, cudnnGetVersion(), n);
    /* ResNet-50's stride-1 convolutions of each stage (c, h, oc, k, pad) */
    const shape shapes[] = {{256, 56, 64, 1, 0},  {64, 56, 64, 3, 1},  {64, 56, 256, 1, 0}, {512, 28, 128, 1, 0},
                            {128, 28, 128, 3, 1}, {256, 14, 256, 3, 1}, {256, 14, 1024, 1, 0}};
    int bad = 0;
    for (const shape &S : shapes) {
        const size_t nx = (size_t)n * S.c * S.h * S.h, ny = (size_t)n * S.oc * S.h * S.h,
                     nw = (size_t)S.oc * S.c * S.k * S.k;
        bufs B;
        B.ws_bytes = (size_t)256 << 20;
        const size_t bn_scratch = sf_cuda_bn_scratch_bytes(n, S.oc, S.h, S.h, SF_LAYOUT_NHWC);
        float *stat;
        void *bscratch;
        CU(cudaMalloc(&B.x, nx * 2));
        CU(cudaMalloc(&B.w, nw * 2));
        CU(cudaMalloc(&B.y, ny * 2));
        CU(cudaMalloc(&B.ws, B.ws_bytes));
        CU(cudaMalloc(&B.sum, 4 * (size_t)S.oc));
        CU(cudaMalloc(&B.sq, 4 * (size_t)S.oc));
        CU(cudaMalloc(&B.scale, 4 * (size_t)S.c));
        CU(cudaMalloc(&B.bias, 4 * (size_t)S.c));
        CU(cudaMalloc(&stat, 8 * 4 * (size_t)(S.oc > S.c ? S.oc : S.c)));
        CU(cudaMalloc(&bscratch, bn_scratch > 0 ? bn_scratch : 1));
        {
            std::vector<__nv_bfloat16> hx(nx), hw(nw);
            uint32_t r = 12345;
            auto next = [&] { r = r * 1664525u + 1013904223u; return (float)(r >> 8) / 16777216.f * 2.f - 1.f; };
            for (auto &v : hx) v = __float2bfloat16(next());
            for (auto &v : hw) v = __float2bfloat16(next() * 0.1f);
            CU(cudaMemcpy(B.x, hx.data(), nx * 2, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(B.w, hw.data(), nw * 2, cudaMemcpyHostToDevice));
            std::vector<float> ones((size_t)(S.oc > S.c ? S.oc : S.c), 1.f), zeros(ones.size(), 0.f);
            CU(cudaMemcpy(B.scale, ones.data(), 4 * (size_t)S.c, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(B.bias, zeros.data(), 4 * (size_t)S.c, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(stat, ones.data(), 4 * (size_t)S.oc, cudaMemcpyHostToDevice)); /* gamma */
            CU(cudaMemcpy(stat + S.oc, zeros.data(), 4 * (size_t)S.oc, cudaMemcpyHostToDevice)); /* beta */
        }
        float *gam = stat, *bet = stat + S.oc, *rm = stat + 2 * S.oc, *rv = stat + 3 * S.oc, *sm = stat + 4 * S.oc,
              *si = stat + 5 * S.oc;
        printf("n%d c%d %dx%d oc%d k%d (y %.0f MB)\n", n, S.c, S.h, S.h, S.oc, S.k, ny * 2 / 1e6);
        float ms[G_N];
        for (int g = 0; g < G_N; g++) {
            int engines = 0;
            if (time_graph(h, s, S, n, g, B, &ms[g], &engines)) {
                printf("  %-15s no engine ran\n", g_name[g]);
                ms[g] = -1.f;
                continue;
            }
            printf("  %-15s %.4f ms (fastest of %d engines)\n", g_name[g], ms[g], engines);
            if (g != G_CONV && !sums_ok(g_name[g], B, ny, S.oc)) {
                printf("FAIL %s: wrong sums, no figure\n", g_name[g]);
                ms[g] = -1.f;
                bad = 1;
            }
        }
        /* the executor's passes those graphs would remove */
        const float stats_ms = best5(s, [&] {
            sf_cuda_bn_fwd_train_dt(SF_DT_BF16, B.y, n, S.oc, S.h, S.h, SF_LAYOUT_NHWC, gam, bet, 1e-5f, 0.1f, rm, rv,
                                    sm, si, NULL, NULL, 0, bscratch, s);
        });
        printf("  executor's statistics pass over y: %.4f ms\n", stats_ms);
        printf("{\"bench\":\"cudnn_bn_fusion\",\"device\":\"%s\",\"batch\":%d,\"c\":%d,\"hw\":%d,\"oc\":%d,\"k\":%d,"
               "\"conv_ms\":%.4f,\"conv_stats_ms\":%.4f,\"sbr_conv_stats_ms\":%.4f,\"stats_pass_ms\":%.4f}\n",
               prop.name, n, S.c, S.h, S.oc, S.k, ms[G_CONV], ms[G_STATS], ms[G_SBR], stats_ms);
        cudaFree(B.x), cudaFree(B.w), cudaFree(B.y), cudaFree(B.ws), cudaFree(B.sum), cudaFree(B.sq);
        cudaFree(B.scale), cudaFree(B.bias), cudaFree(stat), cudaFree(bscratch);
    }
    cudnnDestroy(h);
    return bad;
}
