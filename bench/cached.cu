/* bench/cached.cu — a model's training step on a device-cached batch
 * (WORKLOADS.md "cached", the caching method of DESIGN.md §3), timed after
 * warm-up steps, in one of two ways (--via):
 *
 *   executor  the executor's step alone (gpu/cuda/executor.h: forward,
 *             cross-entropy, backward, SGD), replayed as a CUDA graph unless
 *             --graphs 0, on one augmented-looking batch kept on the device,
 *             timed with CUDA events: W1's model-only figure. --profile 1
 *             adds the time of each op of one eager step and the plans chosen
 *             (engines, workspaces, memory); --profile 2 also brackets one
 *             more step (a graph replay with --graphs 1) with
 *             cudaProfilerStart/Stop, for `ncu --profile-from-start off`.
 *   backend   the backend vtable's bench() (gpu/backend.h), for W3
 *             (WORKLOADS.md: ResNet-18, batch 1024, bf16) and any other model:
 *               aug+step: one raw uint8 batch cached on the device; each step
 *                         augments it (W3: (x/255 - 0.5)/0.5 into the net's
 *                         layout and type) and trains on it, as PyTorch's
 *                         "device-cached batch" loop does;
 *               step:     the augmented batch cached; the step alone;
 *               eval:     aug+step's batch as evaluation batches (forward only,
 *                         eval-mode batchnorm): the training loop's forward-only
 *                         rate.
 *             The backend restores the training state after each. The plan's
 *             memory lines go to stderr.
 *
 * Build: make bench-bins, which makes build/bench/cached and, beside it,
 * build/bench/w1_cached, a link to it: started under the name w1_cached the
 * program measures --via executor with W1's defaults, under any other name
 * --via backend with W3's. --via names the way under either name; each way
 * keeps its defaults and its output lines.
 *
 * Options (both ways unless marked; defaults executor / backend):
 *   --preset NAME      seed-classifier / resnet18
 *   --spec FILE        a model spec JSON file, or the config.json
 *                      `python -m streamfeed.export` writes (its model.spec), in
 *                      place of a preset, so an exported model's per-op profile
 *                      can be read the same way
 *   --hw N             the input size (0: the model's own)
 *   --batch N          32 / 1024
 *   --precision P      tf32 / bf16 (or fp32)
 *   --layout L         nhwc|nchw / auto|nhwc|nchw (auto: the backend's rule)
 *   --graphs 1|0       replay the step as a CUDA graph
 *   --iters N, --steps N   timed steps: 100 / 30
 *   --warmup N         10 / 5
 *   --momentum M       0 (W1) / 0.9 (W3)
 *   --tune N           cuDNN engine configs timed per convolution (8)
 *   --freeze PREFIX    freeze the layers whose names start with it
 *   --fork --fuse --thin --patch --s2d --bn-fuse --dw  1|0: 0 runs the plainer
 *                      variant of one executor choice (gpu/cuda/exec_switches.h):
 *                      backward-filter after backward-data on one stream, no
 *                      cuDNN fused conv+bias+ReLU, thin 1x1 and non-overlapping
 *                      (patch) convolutions through cuDNN, the stem without the
 *                      space-to-depth form, a batchnorm's residual add or ReLU +
 *                      maxpool as kernels of their own, depthwise convolutions on
 *                      cuDNN alone (never timed against gpu/cuda/conv_dw.h's
 *                      kernels): the same-run comparisons
 *   --lt 1|0           linear layers' (and self_attention's projections')
 *                      forwards as cuBLASLt GEMMs with the bias in their
 *                      epilogue (1), or cuBLAS GEMMs plus the bias kernel (0)
 *                      (gpu/cuda/linear.h)
 *   --acc 1|0          a conv's data gradient into an input whose gradient
 *                      another layer also writes (a residual block's input)
 *                      accumulated by cuDNN's plan, beta 1 (1), or written
 *                      apart and added by a kernel (0)
 *   --share 1|0        a residual add whose input is a batchnorm read by it
 *                      alone writes one gradient, which that batchnorm reads
 *                      as its own (1), or a copy for each input (0)
 *   --lt-tune 1|0      cuBLASLt plans keep the fastest of its candidate
 *                      algorithms and run the backward-data GEMMs too (1),
 *                      or its first candidate, untimed, with the backward
 *                      data on cuBLAS (0)
 *   --profile 0|1|2    (executor) as above
 *   --optim sgd|adamw  (backend)
 *   --one-rank-job 0|1 (backend) 1 builds the backend as rank 0 of a
 *                      data-parallel job of one rank (a store in this process):
 *                      every step then runs the NCCL path (the gradient buckets
 *                      all-reduced beside the backward, distributed.bucket_mb =
 *                      --bucket-mb), whose cost against the same step without
 *                      a job is what the data-parallel path adds on one GPU
 *                      (make bench-multi-gpu's dry run)
 *   --bucket-mb N      (backend) 25
 *
 * Prints one human line (executor: "w1_cached ..."; backend: one per mode)
 * and one JSON line ("bench":"w1_cached" or "cached"); exits 0 with
 * "SKIPPED: no CUDA device" without a GPU, 2 on a bad option.
 */
extern "C" {
#include "collective/collective.h"
#include "collective/kv_table.h"
#include "gpu/aug.h"
#include "gpu/backend.h"
#include "gpu/model.h"
#include "gpu/rng.h"
}

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include <cjson/cJSON.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "gpu/cuda/exec_switches.h"
#include "gpu/cuda/executor.h"
#include "gpu/cuda/program.h"

typedef enum via { VIA_EXECUTOR = 0, VIA_BACKEND } via;

/* What each way prints its lines and messages under. */
static const char *const TAG[2] = {"w1_cached", "cached"};

/* One run's options; the defaults depend on the way (defaults()). */
typedef struct opts {
    via v;
    const char *preset, *spec, *freeze, *layout, *optim;
    sf_precision prec;
    int hw, batch, graphs, steps, warmup, tune, profile, one_rank, bucket_mb;
    float momentum;
    int fork, fuse, thin, patch, s2d, bn_fuse, dw; /* 1: the executor's choice, 0: its plainer variant */
    int lt;   /* 1: cuBLASLt linear forwards, 0: cuBLAS + the bias kernel */
    int acc;  /* 1: backward-data accumulated by cuDNN where it adds, 0: written apart and added */
    int share; /* 1: a residual add's batchnorm input reads the other input's gradient, 0: its own copy */
    int lt_tune; /* 1: timed cuBLASLt algorithms, backward data on cuBLASLt; 0: its first, cuBLAS */
} opts;

static void defaults(via v, opts *o)
{
    memset(o, 0, sizeof *o);
    o->v = v;
    o->freeze = "";
    o->optim = "sgd";
    o->graphs = 1;
    o->tune = 8;
    o->bucket_mb = 25;
    o->fork = o->fuse = o->thin = o->patch = o->s2d = o->bn_fuse = o->dw = o->lt = o->acc = o->share = o->lt_tune = 1;
    if (v == VIA_EXECUTOR) { /* W1: batch 32, TF32, plain SGD */
        o->preset = "seed-classifier";
        o->layout = "nhwc";
        o->prec = SF_PREC_TF32;
        o->batch = 32;
        o->steps = 100;
        o->warmup = 10;
    } else { /* W3: batch 1024, bf16, SGD momentum 0.9 */
        o->preset = "resnet18";
        o->layout = "auto";
        o->prec = SF_PREC_BF16;
        o->batch = 1024;
        o->steps = 30;
        o->warmup = 5;
        o->momentum = 0.9f;
    }
}

/* The options, one row each: where the value goes and which ways take it. */
typedef enum opt_kind { OPT_INT, OPT_FLOAT, OPT_STR, OPT_PREC } opt_kind;
enum { FOR_EXECUTOR = 1, FOR_BACKEND = 2, FOR_BOTH = 3 };
typedef struct opt_row {
    const char *name;
    opt_kind kind;
    size_t off;
    int ways;
} opt_row;

static const opt_row OPTS[] = {
    {"--preset", OPT_STR, offsetof(opts, preset), FOR_BOTH},
    {"--spec", OPT_STR, offsetof(opts, spec), FOR_BOTH},
    {"--hw", OPT_INT, offsetof(opts, hw), FOR_BOTH},
    {"--batch", OPT_INT, offsetof(opts, batch), FOR_BOTH},
    {"--precision", OPT_PREC, offsetof(opts, prec), FOR_BOTH},
    {"--layout", OPT_STR, offsetof(opts, layout), FOR_BOTH},
    {"--graphs", OPT_INT, offsetof(opts, graphs), FOR_BOTH},
    {"--iters", OPT_INT, offsetof(opts, steps), FOR_BOTH},
    {"--steps", OPT_INT, offsetof(opts, steps), FOR_BOTH},
    {"--warmup", OPT_INT, offsetof(opts, warmup), FOR_BOTH},
    {"--momentum", OPT_FLOAT, offsetof(opts, momentum), FOR_BOTH},
    {"--tune", OPT_INT, offsetof(opts, tune), FOR_BOTH},
    {"--freeze", OPT_STR, offsetof(opts, freeze), FOR_BOTH},
    {"--fork", OPT_INT, offsetof(opts, fork), FOR_BOTH},
    {"--fuse", OPT_INT, offsetof(opts, fuse), FOR_BOTH},
    {"--thin", OPT_INT, offsetof(opts, thin), FOR_BOTH},
    {"--patch", OPT_INT, offsetof(opts, patch), FOR_BOTH},
    {"--s2d", OPT_INT, offsetof(opts, s2d), FOR_BOTH},
    {"--bn-fuse", OPT_INT, offsetof(opts, bn_fuse), FOR_BOTH},
    {"--dw", OPT_INT, offsetof(opts, dw), FOR_BOTH},
    {"--lt", OPT_INT, offsetof(opts, lt), FOR_BOTH},
    {"--acc", OPT_INT, offsetof(opts, acc), FOR_BOTH},
    {"--share", OPT_INT, offsetof(opts, share), FOR_BOTH},
    {"--lt-tune", OPT_INT, offsetof(opts, lt_tune), FOR_BOTH},
    {"--profile", OPT_INT, offsetof(opts, profile), FOR_EXECUTOR},
    {"--optim", OPT_STR, offsetof(opts, optim), FOR_BACKEND},
    {"--one-rank-job", OPT_INT, offsetof(opts, one_rank), FOR_BACKEND},
    {"--bucket-mb", OPT_INT, offsetof(opts, bucket_mb), FOR_BACKEND},
};

/* The executor's switches the options ask for, for either way. */
static void switches_of(const opts *o, sf_exec_switches *sw)
{
    memset(sw, 0, sizeof *sw);
    sw->no_fork = !o->fork;
    sw->no_fuse = !o->fuse;
    sw->no_thin = !o->thin;
    sw->no_patch = !o->patch;
    sw->no_s2d = !o->s2d;
    sw->no_bn_fuse = !o->bn_fuse;
    sw->no_dw = !o->dw;
    sw->no_lt = o->lt == 0;
    sw->no_acc = o->acc == 0;
    sw->no_share = o->share == 0;
    sw->no_lt_tune = o->lt_tune == 0;
}

static const char *prec_name(sf_precision p) { return p == SF_PREC_BF16 ? "bf16" : p == SF_PREC_TF32 ? "tf32" : "fp32"; }

/* The way: --via when given, else the name the program was started under. */
static int pick_via(int argc, char **argv, via *v)
{
    const char *base = strrchr(argv[0], '/');
    *v = strcmp(base ? base + 1 : argv[0], "w1_cached") == 0 ? VIA_EXECUTOR : VIA_BACKEND;
    for (int i = 1; i + 1 < argc; i += 2)
        if (!strcmp(argv[i], "--via")) {
            if (strcmp(argv[i + 1], "executor") && strcmp(argv[i + 1], "backend")) {
                fprintf(stderr, "cached: --via takes executor or backend, not %s\n", argv[i + 1]);
                return -1;
            }
            *v = strcmp(argv[i + 1], "executor") ? VIA_BACKEND : VIA_EXECUTOR;
        }
    return 0;
}

/* Fills *o from the command line: 0, or -1 with the reason on stderr. */
static int parse_opts(int argc, char **argv, opts *o)
{
    via v;
    if (pick_via(argc, argv, &v))
        return -1;
    defaults(v, o);
    const char *tag = TAG[v];
    if (argc % 2 == 0) {
        fprintf(stderr, "%s: option %s has no value\n", tag, argv[argc - 1]);
        return -1;
    }
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *val = argv[i + 1];
        if (!strcmp(k, "--via"))
            continue;
        const opt_row *r = NULL;
        for (const opt_row &row : OPTS)
            if (!strcmp(k, row.name))
                r = &row;
        if (!r) {
            fprintf(stderr, "%s: unknown option %s\n", tag, k);
            return -1;
        }
        if (!(r->ways & (v == VIA_EXECUTOR ? FOR_EXECUTOR : FOR_BACKEND))) {
            fprintf(stderr, "%s: %s is an option of --via %s only\n", tag, k,
                    v == VIA_EXECUTOR ? "backend" : "executor");
            return -1;
        }
        char *field = (char *)o + r->off;
        if (r->kind == OPT_INT)
            *(int *)field = atoi(val);
        else if (r->kind == OPT_FLOAT)
            *(float *)field = (float)atof(val);
        else if (r->kind == OPT_STR)
            *(const char **)field = val;
        else if (!strcmp(val, "bf16") || !strcmp(val, "tf32") || !strcmp(val, "fp32"))
            *(sf_precision *)field = !strcmp(val, "bf16") ? SF_PREC_BF16 : !strcmp(val, "fp32") ? SF_PREC_FP32 : SF_PREC_TF32;
        else {
            fprintf(stderr, "%s: --precision takes bf16, tf32 or fp32, not %s\n", tag, val);
            return -1;
        }
    }
    const int lay_ok = !strcmp(o->layout, "nhwc") || !strcmp(o->layout, "nchw") ||
                       (v == VIA_BACKEND && !strcmp(o->layout, "auto"));
    const struct {
        int bad;
        const char *rule;
    } rules[] = {
        {o->batch < 1, "--batch is at least 1"},
        {o->steps < 1, "--iters (--steps) is at least 1"},
        {o->warmup < 0, "--warmup is at least 0"},
        {o->hw != 0 && o->hw < 8, "--hw is 0 (the model's own input size) or at least 8"},
        {o->bucket_mb < 1, "--bucket-mb is at least 1"},
        {o->profile < 0 || o->profile > 2, "--profile takes 0, 1 or 2"},
        {o->lt < 0 || o->lt > 1, "--lt takes 1 or 0"},
        {o->acc < 0 || o->acc > 1, "--acc takes 1 or 0"},
        {o->share < 0 || o->share > 1, "--share takes 1 or 0"},
        {o->lt_tune < 0 || o->lt_tune > 1, "--lt-tune takes 1 or 0"},
        {!lay_ok, v == VIA_EXECUTOR ? "--layout takes nhwc or nchw" : "--layout takes auto, nhwc or nchw"},
        {strcmp(o->optim, "sgd") && strcmp(o->optim, "adamw"), "--optim takes sgd or adamw"},
    };
    for (const auto &r : rules)
        if (r.bad) {
            fprintf(stderr, "%s: %s\n", tag, r.rule);
            return -1;
        }
    return 0;
}

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

/* The model the options name, at the input size and with the frozen layers
 * they ask for. */
static int load_model(const opts *o, sf_model *m, char *err, size_t errlen)
{
    if (o->spec ? model_from_file(o->spec, m, err, errlen) : sf_model_from_preset(o->preset, m, err, errlen))
        return -1;
    if (o->hw > 0) {
        m->in_h = m->in_w = o->hw;
        if (sf_model_resolve(m, err, errlen))
            return -1;
    }
    return o->freeze[0] ? sf_model_set_freeze(m, o->freeze, err, errlen) : 0;
}

#define CK(x)                                                                                   \
    do {                                                                                         \
        if (!(x)) {                                                                              \
            fprintf(stderr, "w1_cached: %s failed: %s\n", #x, sf_cuda_last_error());             \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

/* --via executor: the executor's step on a batch kept on the device. */
static int run_executor(const opts *o, const sf_model &m, const char *name, const cudaDeviceProp &prop)
{
    const int batch = o->batch, iters = o->steps, graphs = o->graphs;
    const int bf16 = o->prec == SF_PREC_BF16, tf32 = o->prec != SF_PREC_FP32;
    const sf_layout layout = strcmp(o->layout, "nchw") ? SF_LAYOUT_NHWC : SF_LAYOUT_NCHW;
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
    sf_sgd_hyper h = {1e-3f, o->momentum, 0.f, 0.f};
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
    nc.tune = o->tune;
    sf_exec_switches sw;
    switches_of(o, &sw);
    sf_exec_switches_apply(&sw, &nc);
    nc.seed = 1;
    sf_cuda_net *net = NULL;
    const sf_cublas_ctx blas_ctx = {blas, bws, (size_t)32 << 20};
    CK(sf_net_create(&net, &m, &nc, &io, dnn, &blas_ctx, s) == 0);
    if (o->momentum != 0.f) /* the momentum buffer exists once a step asks for it */
        CK(sf_net_use_momentum(net) == 0);

    for (int i = 0; i < o->warmup; i++)
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
    const char *pn = prec_name(o->prec), *ln = layout == SF_LAYOUT_NHWC ? "nhwc" : "nchw";
    printf("w1_cached %s %s batch=%d precision=%s layout=%s graphs=%d momentum=%g fork=%d fuse=%d thin=%d patch=%d s2d=%d bn_fuse=%d dw=%d lt=%d acc=%d share=%d lt_tune=%d: %.1f steps/s "
           "(%.3f ms/step, last loss %.4f)%s\n",
           name, prop.name, batch, pn, ln, graphs, o->momentum, o->fork, o->fuse, o->thin, o->patch, o->s2d,
           o->bn_fuse, o->dw, o->lt, o->acc, o->share, o->lt_tune, sps, ms / iters, hres->loss,
           graphs && sf_net_graph_error(net)[0] ? " [graph capture failed: eager]" : "");
    printf("{\"bench\":\"w1_cached\",\"device\":\"%s\",\"batch\":%d,\"precision\":\"%s\",\"layout\":\"%s\","
           "\"graphs\":%d,\"steps_per_s\":%.2f,\"ms_per_step\":%.4f}\n",
           prop.name, batch, pn, ln, graphs, sps, ms / iters);
    if (o->profile) {
        static char buf[1 << 20]; /* an exported model's profile runs to hundreds of ops */
        if (sf_net_profile(net, 0, batch, buf, sizeof buf) == 0)
            printf("profile %s %s fork=%d (eager, per op; with fork the side stream's work overlaps):\n%s", ln, pn,
                   o->fork, buf);
        sf_net_describe(net, batch, buf, sizeof buf);
        printf("plans %s %s:\n%s", ln, pn, buf);
    }
    if (o->profile == 2) {
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

static const char *AUG_W3 =
    "[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":0.00392156862745098},"
    "{\"op\":\"normalize\",\"mean\":[0.5],\"std\":[0.5]}]";

/* The raw uint8 batch and its labels in the backend's pinned memory: 32x32
 * random images upscaled (nearest) to the input size, as W3 describes. */
static void fill_batch(const sf_model &m, int batch, uint8_t *im, int64_t *lab, size_t nl)
{
    for (int s = 0; s < batch; s++)
        for (int y = 0; y < m.in_h; y++)
            for (int x = 0; x < m.in_w; x++)
                for (int c = 0; c < 3; c++) {
                    const int sy = y * 32 / m.in_h, sx = x * 32 / m.in_w;
                    im[(((size_t)s * m.in_h + y) * m.in_w + x) * 3 + c] =
                        (uint8_t)(sf_hash4(7, (uint64_t)s, (uint64_t)(sy * 32 + sx), (uint64_t)c) >> 56);
                }
    for (size_t i = 0; i < nl; i++)
        lab[i] = (int64_t)(sf_hash4(7, i, 0, 9) % (uint64_t)m.n_classes);
}

/* --via backend: the backend's bench() in its three modes. */
static int run_backend(const opts *o, const sf_model &m, const char *name, const cudaDeviceProp &prop)
{
    const int batch = o->batch, steps = o->steps, warmup = o->warmup;
    const char *prec = prec_name(o->prec), *lay = o->layout;
    char err[300];
    sf_train_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.precision = o->prec;
    cfg.optim = !strcmp(o->optim, "adamw") ? SF_OPT_ADAMW : SF_OPT_SGD;
    cfg.seed = 1;
    cfg.max_batch = batch;
    cfg.overlap = 1;
    cfg.cuda_graphs = o->graphs;
    cfg.device = 0;
    cfg.tune_configs = o->tune;
    sf_exec_switches sw;
    switches_of(o, &sw);
    cfg.sw = &sw;
    cfg.layout = !strcmp(lay, "nchw") ? SF_ACT_LAYOUT_NCHW : !strcmp(lay, "nhwc") ? SF_ACT_LAYOUT_NHWC : SF_ACT_LAYOUT_AUTO;
    /* the job's store in this process, as rank 0 keeps it (collective/kv_table.h) */
    sf_kv_table *kv = sf_kv_table_new(8, 65536); /* a job of one rank: the NCCL id */
    const sf_kv_store store = sf_kv_table_store(kv);
    sf_dist job;
    memset(&job, 0, sizeof job);
    job.rank = 0;
    job.world = 1;
    job.store = &store;
    job.timeout_ms = 60000;
    job.bucket_bytes = (size_t)o->bucket_mb << 20;
    cfg.dist = o->one_rank ? &job : NULL;
    sf_backend *be = sf_backend_cuda_new(0, err, sizeof err);
    if (!be) {
        fprintf(stderr, "cached: %s\n", err);
        return 1;
    }
    if (be->i->build(be, &m, &cfg, err, sizeof err)) {
        fprintf(stderr, "cached: build: %s\n", err);
        return 1;
    }
    /* the plan's memory lines (the per-convolution lines are in GET /v1/model) */
    static char desc[1 << 16];
    size_t dev_bytes = 0;
    if (be->i->describe && be->i->describe(be, desc, sizeof desc, &dev_bytes) == 0)
        for (char *l = strtok(desc, "\n"); l; l = strtok(NULL, "\n"))
            if (strncmp(l, "layer ", 6) != 0)
                fprintf(stderr, "cached: plan: %s\n", l);
    fprintf(stderr, "cached: plan: the backend allocated %zu B of device memory\n", dev_bytes);
    sf_aug_pipeline pipe;
    sf_aug_plan plan;
    if (sf_aug_parse(AUG_W3, &pipe, err, sizeof err) ||
        sf_aug_plan_make(&pipe, m.in_h, m.in_w, 3, &plan, err, sizeof err)) {
        fprintf(stderr, "cached: augmentation: %s\n", err);
        return 1;
    }
    const size_t img = (size_t)batch * m.in_h * m.in_w * 3;
    const size_t nl = (size_t)batch * (m.segmentation ? (size_t)m.out_h * m.out_w : 1);
    uint8_t *im = (uint8_t *)be->i->host_alloc(be, img);
    int64_t *lab = (int64_t *)be->i->host_alloc(be, nl * 8);
    if (!im || !lab) {
        fprintf(stderr, "cached: host_alloc\n");
        return 1;
    }
    fill_batch(m, batch, im, lab, nl);
    std::vector<sf_aug_sample> samples((size_t)batch);
    sf_aug_gen(&pipe, &plan, 7, 0, batch, samples.data());
    sf_batch b;
    memset(&b, 0, sizeof b);
    b.id = 1;
    b.n = batch;
    b.h = m.in_h;
    b.w = m.in_w;
    b.c = 3;
    b.nhwc = 1;
    b.images = im;
    b.label_dtype = SF_LABEL_I64;
    b.labels = lab;
    b.plan = &plan;
    b.samples = samples.data();
    b.hyper.lr = 1e-3f;
    b.hyper.momentum = o->momentum;
    b.hyper.beta1 = 0.9;
    b.hyper.beta2 = 0.999;
    b.hyper.eps = 1e-8f;
    double sec_as = 0, sec_s = 0;
    if (be->i->bench(be, &b, SF_BENCH_AUG_STEP, warmup, steps, &sec_as, err, sizeof err) ||
        be->i->bench(be, &b, SF_BENCH_STEP, warmup, steps, &sec_s, err, sizeof err)) {
        fprintf(stderr, "cached: bench: %s\n", err);
        return 1;
    }
    printf("%s %s batch %d %dx%d: aug+step %.1f samples/s (%.2f ms/step), step only %.1f samples/s (%.2f ms/step) "
           "[%s, layout %s%s]\n",
           name, prec, batch, m.in_h, m.in_w, steps * batch / sec_as, sec_as * 1e3 / steps, steps * batch / sec_s,
           sec_s * 1e3 / steps, prop.name, lay, o->one_rank ? ", one-rank NCCL job" : "");
    /* Evaluation batches (forward only, eval-mode batchnorm) from the same
     * cached raw batch, augmented each step as the training figure. */
    double sec_ev = 0;
    b.eval = 1;
    if (be->i->bench(be, &b, SF_BENCH_AUG_STEP, warmup, steps, &sec_ev, err, sizeof err)) {
        fprintf(stderr, "cached: eval bench: %s\n", err);
        return 1;
    }
    printf("%s %s batch %d %dx%d: eval (aug+forward) %.1f samples/s (%.2f ms/batch), %.2fx aug+step\n", name, prec,
           batch, m.in_h, m.in_w, steps * batch / sec_ev, sec_ev * 1e3 / steps, sec_as / sec_ev);
    printf("{\"bench\":\"cached\",\"device\":\"%s\",\"preset\":\"%s\",\"precision\":\"%s\",\"layout\":\"%s\","
           "\"batch\":%d,\"hw\":%d,\"graphs\":%d,\"steps\":%d,\"aug_step_samples_per_s\":%.1f,"
           "\"step_samples_per_s\":%.1f,\"aug_step_ms\":%.3f,\"step_ms\":%.3f,\"eval_samples_per_s\":%.1f,"
           "\"one_rank_job\":%d,\"bucket_mb\":%d}\n",
           prop.name, name, prec, lay, batch, m.in_h, o->graphs, steps, steps * batch / sec_as,
           steps * batch / sec_s, sec_as * 1e3 / steps, sec_s * 1e3 / steps, steps * batch / sec_ev, o->one_rank,
           o->one_rank ? o->bucket_mb : 0);
    be->i->host_free(be, im);
    be->i->host_free(be, lab);
    be->i->destroy(be);
    sf_kv_table_free(kv);
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse_opts(argc, argv, &o))
        return 2;
    /* Line-buffered even into a file, so a run that dies keeps what it printed. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (skip_without_device())
        return 0;
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    char err[300];
    sf_model m;
    if (load_model(&o, &m, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", TAG[o.v], err);
        return 1;
    }
    /* the lines name the spec file in place of a preset */
    const char *name = o.spec ? o.spec : o.preset;
    return o.v == VIA_EXECUTOR ? run_executor(&o, m, name, prop) : run_backend(&o, m, name, prop);
}
