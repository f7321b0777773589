/* bench/w1_cached.cu — W1's model-only figure: the seed-classifier training
 * step (or another preset's: --preset, --hw for its input size) on a
 * device-cached batch (WORKLOADS.md "cached"), timed with CUDA events
 * over --iters steps after --warmup steps. The step is the backend's own
 * (gpu/cuda/executor.h): forward, cross-entropy, backward, SGD (lr 1e-3, no
 * momentum, as W1), replayed as a CUDA graph unless --graphs 0.
 *
 * Build (from the repository root), listing every .c of gpu/ and gpu/ref/ and
 * every .cu of gpu/cuda/ ($SRC):
 *   nvcc -std=c++17 -arch=sm_90 -O3 -I. -DSF_HAVE_CUDA=1 $SRC bench/w1_cached.cu \
 *        -o build/w1_cached -lcjson -lcudnn -lcublasLt -lcublas
 * Run: build/w1_cached [--preset seed-classifier | --spec FILE] [--hw N] [--batch 32] [--precision tf32|fp32|bf16] [--layout nhwc|nchw]
 *                      [--graphs 1|0] [--iters 100] [--warmup 10] [--momentum 0]
 *                      [--fork 1|0] [--fuse 1|0] [--thin 1|0] [--patch 1|0] [--s2d 1|0] [--bn-fuse 1|0] [--dw 1|0] [--lt 1|2|0] [--tune 8] [--profile 0|1|2]
 * --spec takes a model spec JSON file, or the config.json `python -m
 * streamfeed.export` writes (its model.spec), in place of a preset, so an
 * exported model's per-op profile can be read the same way.
 * Prints one human line and one JSON line; --profile 1 adds the time of each
 * op of one eager step and the plans chosen (engines, workspaces, memory);
 * --profile 2 also brackets one more step (a graph replay with --graphs 1) with
 * cudaProfilerStart/Stop, for `ncu --profile-from-start off`.
 * --dw 0 keeps depthwise NHWC convolutions on cuDNN, never timing
 * gpu/cuda/conv_dw.h's kernels against it (the same-run comparison).
 * --lt 0 runs linear layers (and self_attention's projections) as cuBLAS
 * GEMMs plus the bias kernels instead of cuBLASLt GEMMs with the bias and its
 * gradient in their epilogues (gpu/cuda/linear.h); --lt 2 keeps the
 * cuBLASLt forwards but runs the weight gradients as cuBLAS GEMMs plus the
 * bias-gradient kernel.
 * Exits 0 with "SKIPPED: no CUDA device" without a GPU.
 */
extern "C" {
#include "gpu/model.h"
}

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include <cjson/cJSON.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "gpu/cuda/executor.h"

#define CK(x)                                                                                   \
    do {                                                                                         \
        if (!(x)) {                                                                              \
            fprintf(stderr, "w1_cached: %s failed: %s\n", #x, sf_cuda_last_error());             \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)
#define CU(x)                                                                                   \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "w1_cached: %s: %s\n", #x, cudaGetErrorString(e_));                  \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

/* The model of a spec file: a bare spec, or a config file's model.spec. */
static int model_from_file(const char *path, sf_model *m, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open", path);
        return -1;
    }
    std::vector<char> text;
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        text.insert(text.end(), chunk, chunk + got);
    fclose(f);
    text.push_back('\0');
    cJSON *root = cJSON_Parse(text.data());
    if (!root) {
        snprintf(err, errlen, "%s: not valid JSON", path);
        return -1;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *sp = model ? cJSON_GetObjectItemCaseSensitive(model, "spec") : root;
    char *js = sp ? cJSON_PrintUnformatted(sp) : NULL;
    const int rc = js ? sf_model_from_json(js, m, err, errlen) : -1;
    if (!js)
        snprintf(err, errlen, "%s: no model.spec", path);
    free(js);
    cJSON_Delete(root);
    return rc;
}

int main(int argc, char **argv)
{
    int batch = 32, tf32 = 1, bf16 = 0, graphs = 1, iters = 100, warmup = 10, tune = 8, fork = 1, fuse = 1, thin = 1, patch = 1, s2d = 1, bn_fuse = 1, dw = 1, lt = 1, profile = 0;
    float momentum = 0.f;
    const char *preset = "seed-classifier", *spec = NULL;
    int hw = 0; /* 0: the preset's own input size */
    sf_layout layout = SF_LAYOUT_NHWC;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--batch")) batch = atoi(v);
        else if (!strcmp(k, "--preset")) preset = v;
        else if (!strcmp(k, "--spec")) spec = v;
        else if (!strcmp(k, "--hw")) hw = atoi(v);
        else if (!strcmp(k, "--precision")) tf32 = strcmp(v, "fp32") != 0, bf16 = !strcmp(v, "bf16");
        else if (!strcmp(k, "--layout")) layout = strcmp(v, "nchw") ? SF_LAYOUT_NHWC : SF_LAYOUT_NCHW;
        else if (!strcmp(k, "--graphs")) graphs = atoi(v);
        else if (!strcmp(k, "--iters")) iters = atoi(v);
        else if (!strcmp(k, "--warmup")) warmup = atoi(v);
        else if (!strcmp(k, "--momentum")) momentum = (float)atof(v);
        else if (!strcmp(k, "--tune")) tune = atoi(v);
        else if (!strcmp(k, "--fork")) fork = atoi(v);
        else if (!strcmp(k, "--fuse")) fuse = atoi(v);
        else if (!strcmp(k, "--thin")) thin = atoi(v);
        else if (!strcmp(k, "--dw")) dw = atoi(v);
        else if (!strcmp(k, "--lt")) lt = atoi(v);
        else if (!strcmp(k, "--patch")) patch = atoi(v);
        else if (!strcmp(k, "--s2d")) s2d = atoi(v);
        else if (!strcmp(k, "--bn-fuse")) bn_fuse = atoi(v);
        else if (!strcmp(k, "--profile")) profile = atoi(v);
        else {
            fprintf(stderr, "w1_cached: unknown option %s\n", k);
            return 2;
        }
    }
    if (batch < 1 || iters < 1 || warmup < 0) {
        fprintf(stderr, "w1_cached: bad --batch/--iters/--warmup\n");
        return 2;
    }
    /* Line-buffered even into a file, so a run that dies keeps what it printed. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("SKIPPED: no CUDA device\n");
        return 0;
    }
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    char err[200];
    sf_model m;
    if (spec ? model_from_file(spec, &m, err, sizeof err) : sf_model_from_preset(preset, &m, err, sizeof err)) {
        fprintf(stderr, "w1_cached: %s\n", err);
        return 1;
    }
    if (spec)
        preset = spec;
    if (hw > 0) {
        m.in_h = m.in_w = hw;
        if (sf_model_resolve(&m, err, sizeof err)) {
            fprintf(stderr, "w1_cached: %s\n", err);
            return 1;
        }
    }

    cudaStream_t s;
    /* the highest priority, as the backend's compute stream */
    int lo_prio = 0, hi_prio = 0;
    CU(cudaDeviceGetStreamPriorityRange(&lo_prio, &hi_prio));
    CU(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, hi_prio));
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    if (cudnnCreate(&dnn) != CUDNN_STATUS_SUCCESS || cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "w1_cached: cuDNN/cuBLAS handles\n");
        return 1;
    }
    cudnnSetStream(dnn, s);
    cublasSetStream(blas, s);
    void *bws;
    CU(cudaMalloc(&bws, (size_t)32 << 20));
    cublasSetWorkspace(blas, bws, (size_t)32 << 20);

    const size_t in = (size_t)m.in_c * m.in_h * m.in_w;
    const sf_dtype dt = bf16 ? SF_DT_BF16 : SF_DT_F32;
    void *x;
    int32_t *lab;
    sf_sgd_hyper *hyp;
    sf_xent_out *res, *hres;
    CU(cudaMalloc(&x, sf_dtype_size(dt) * batch * in));
    CU(cudaMalloc(&lab, sizeof(int32_t) * batch));
    CU(cudaMalloc(&hyp, sizeof *hyp));
    CU(cudaMalloc(&res, sizeof *res));
    CU(cudaHostAlloc(&hres, sizeof *hres, 0));
    std::vector<int32_t> hl(batch);
    for (int i = 0; i < batch; i++)
        hl[i] = (i * 7) % m.n_classes;
    CU(cudaMemcpyAsync(lab, hl.data(), 4 * batch, cudaMemcpyHostToDevice, s));
    sf_sgd_hyper h = {1e-3f, momentum, 0.f, 0.f};
    CU(cudaMemcpyAsync(hyp, &h, sizeof h, cudaMemcpyHostToDevice, s));
    /* one augmented-looking batch kept on the device (never zeros) */
    CK(sf_cuda_fill_random_dt(dt, x, (size_t)batch * in, 2024, 1.f, s) == 0);

    sf_net_io io = {x, lab, hyp, res, hres, NULL, NULL};
    sf_net_cfg nc;
    memset(&nc, 0, sizeof nc);
    nc.layout = layout;
    nc.tf32 = tf32;
    nc.dt = dt;
    nc.max_batch = batch;
    nc.nbuf = 1;
    nc.tune = tune;
    nc.no_fork = !fork;
    nc.no_fuse = !fuse;
    nc.no_thin = !thin;
    nc.no_dw = !dw;
    nc.no_lt = lt == 0;
    nc.no_lt_wgrad = lt == 2;
    nc.no_patch = !patch;
    nc.no_s2d = !s2d;
    nc.no_bn_fuse = !bn_fuse;
    nc.seed = 1;
    sf_cuda_net *net = NULL;
    const sf_cublas_ctx blas_ctx = {blas, bws, (size_t)32 << 20};
    CK(sf_net_create(&net, &m, &nc, &io, dnn, &blas_ctx, s) == 0);
    if (momentum != 0.f) /* the momentum buffer exists once a step asks for it */
        CK(sf_net_use_momentum(net) == 0);

    for (int i = 0; i < warmup; i++)
        CK(sf_net_step(net, 0, batch, graphs, 1) == 0);
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    CU(cudaEventRecord(e0, s));
    for (int i = 0; i < iters; i++)
        CK(sf_net_step(net, 0, batch, graphs, 1) == 0);
    CU(cudaEventRecord(e1, s));
    CU(cudaEventSynchronize(e1));
    float ms = 0.f;
    CU(cudaEventElapsedTime(&ms, e0, e1));
    const double sps = 1000.0 * iters / ms;
    const char *pn = bf16 ? "bf16" : tf32 ? "tf32" : "fp32", *ln = layout == SF_LAYOUT_NHWC ? "nhwc" : "nchw";
    printf("w1_cached %s %s batch=%d precision=%s layout=%s graphs=%d momentum=%g fork=%d fuse=%d thin=%d patch=%d s2d=%d bn_fuse=%d dw=%d lt=%d: %.1f steps/s "
           "(%.3f ms/step, last loss %.4f)%s\n",
           preset, prop.name, batch, pn, ln, graphs, momentum, fork, fuse, thin, patch, s2d, bn_fuse, dw, lt, sps, ms / iters, hres->loss,
           graphs && sf_net_graph_error(net)[0] ? " [graph capture failed: eager]" : "");
    printf("{\"bench\":\"w1_cached\",\"device\":\"%s\",\"batch\":%d,\"precision\":\"%s\",\"layout\":\"%s\","
           "\"graphs\":%d,\"steps_per_s\":%.2f,\"ms_per_step\":%.4f}\n",
           prop.name, batch, pn, ln, graphs, sps, ms / iters);
    if (profile) {
        static char buf[1 << 20]; /* an exported model's profile runs to hundreds of ops */
        if (sf_net_profile(net, 0, batch, buf, sizeof buf) == 0)
            printf("profile %s %s fork=%d (eager, per op; with fork the side stream's work overlaps):\n%s", ln, pn,
                   fork, buf);
        sf_net_describe(net, batch, buf, sizeof buf);
        printf("plans %s %s:\n%s", ln, pn, buf);
    }
    if (profile == 2) {
        CU(cudaStreamSynchronize(s));
        cudaProfilerStart();
        CK(sf_net_step(net, 0, batch, graphs, 1) == 0);
        CU(cudaStreamSynchronize(s));
        cudaProfilerStop();
    }
    sf_net_destroy(net);
    cudaFree(x);
    cudaFree(lab);
    cudaFree(hyp);
    cudaFree(res);
    cudaFreeHost(hres);
    cudaFree(bws);
    cudnnDestroy(dnn);
    cublasDestroy(blas);
    cudaStreamDestroy(s);
    return 0;
}
