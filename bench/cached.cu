/* bench/cached.cu — a preset's training step on a device-cached batch through
 * the backend vtable (gpu/backend.h bench(): the caching method of
 * DESIGN.md §3), for W3 (WORKLOADS.md: ResNet-18, batch 1024, bf16) and any
 * other preset:
 *   aug+step: one raw uint8 batch cached on the device; each step augments
 *             it (W3: (x/255 - 0.5)/0.5 into the net's layout and type) and
 *             trains on it, as PyTorch's "device-cached batch" loop does;
 *   step:     the augmented batch cached; the step alone;
 *   eval:     aug+step's batch as evaluation batches (forward only, eval-mode
 *             batchnorm): the training loop's forward-only rate.
 * Timed steps follow warm-up steps; the backend restores the training state.
 *
 * Build: make bench-bins (build/bench/cached). Run:
 *   build/bench/cached [--preset resnet18] [--batch 1024] [--hw 224]
 *       [--precision bf16|tf32|fp32] [--optim sgd|adamw] [--graphs 1|0]
 *       [--steps 30] [--warmup 5] [--freeze PREFIX] [--layout auto|nhwc|nchw] [--momentum 0.9]
 *       [--one-rank-job 0|1] [--bucket-mb 25] [--patch 1|0] [--s2d 1|0] [--bn-fuse 1|0] [--thin 1|0]
 *       [--dw 1|0]
 * The layout follows the backend's rule unless --layout nhwc|nchw names one.
 * --one-rank-job 1 builds the backend as rank 0 of a data-parallel job of one
 * rank (a store in this process): every step then runs the NCCL path (the
 * gradient buckets all-reduced beside the backward, distributed.bucket_mb =
 * --bucket-mb), whose cost against the same step without a job is what the
 * data-parallel path adds on one GPU (make bench-multi-gpu's dry run).
 * --patch 0 and --thin 0 run the convolutions gpu/cuda/conv_patch.h and
 * conv_thin.h take through cuDNN instead, --s2d 0 the stem without
 * gpu/cuda/conv_s2d.h's space-to-depth form, --bn-fuse 0 a batchnorm's
 * residual add or ReLU + maxpool as kernels of their own, not in one pass
 * with the batchnorm, --dw 0 depthwise convolutions on cuDNN alone, never
 * timed against gpu/cuda/conv_dw.h's kernels (the same-run comparisons).
 * Prints one human line per mode and one JSON line; exits 0 with
 * "SKIPPED: no CUDA device" without a GPU.
 */
extern "C" {
#include "collective/collective.h"
#include "collective/kv_table.h"
#include "gpu/aug.h"
#include "gpu/backend.h"
#include "gpu/model.h"
#include "gpu/rng.h"
}

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include <cuda_runtime.h>

#include "gpu/cuda/exec_switches.h"

static const char *AUG_W3 =
    "[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":0.00392156862745098},"
    "{\"op\":\"normalize\",\"mean\":[0.5],\"std\":[0.5]}]";

int main(int argc, char **argv)
{
    const char *preset = "resnet18", *prec = "bf16", *optim = "sgd", *freeze = "", *lay = "auto";
    int batch = 1024, hw = 224, graphs = 1, steps = 30, warmup = 5, one_rank = 0, bucket_mb = 25, patch = 1, s2d = 1, bn_fuse = 1, thin = 1, dw = 1;
    float momentum = 0.9f; /* W3's SGD; W1 and W2 train without */
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--preset")) preset = v;
        else if (!strcmp(k, "--batch")) batch = atoi(v);
        else if (!strcmp(k, "--hw")) hw = atoi(v);
        else if (!strcmp(k, "--precision")) prec = v;
        else if (!strcmp(k, "--optim")) optim = v;
        else if (!strcmp(k, "--graphs")) graphs = atoi(v);
        else if (!strcmp(k, "--momentum")) momentum = (float)atof(v);
        else if (!strcmp(k, "--steps")) steps = atoi(v);
        else if (!strcmp(k, "--warmup")) warmup = atoi(v);
        else if (!strcmp(k, "--freeze")) freeze = v;
        else if (!strcmp(k, "--layout")) lay = v;
        else if (!strcmp(k, "--one-rank-job")) one_rank = atoi(v);
        else if (!strcmp(k, "--patch")) patch = atoi(v);
        else if (!strcmp(k, "--s2d")) s2d = atoi(v);
        else if (!strcmp(k, "--bn-fuse")) bn_fuse = atoi(v);
        else if (!strcmp(k, "--thin")) thin = atoi(v);
        else if (!strcmp(k, "--dw")) dw = atoi(v);
        else if (!strcmp(k, "--bucket-mb")) bucket_mb = atoi(v);
        else {
            fprintf(stderr, "cached: unknown option %s\n", k);
            return 2;
        }
    }
    if (batch < 1 || hw < 8 || steps < 1 || warmup < 0 || bucket_mb < 1) {
        fprintf(stderr, "cached: bad --batch/--hw/--steps/--warmup/--bucket-mb\n");
        return 2;
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("SKIPPED: no CUDA device\n");
        return 0;
    }
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    char err[300];
    sf_model m;
    if (sf_model_from_preset(preset, &m, err, sizeof err)) {
        fprintf(stderr, "cached: %s\n", err);
        return 1;
    }
    if (strcmp(preset, "resnet18") == 0)
        m.in_h = m.in_w = hw;
    if (sf_model_resolve(&m, err, sizeof err) || (freeze[0] && sf_model_set_freeze(&m, freeze, err, sizeof err))) {
        fprintf(stderr, "cached: %s\n", err);
        return 1;
    }
    sf_train_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.precision = !strcmp(prec, "bf16") ? SF_PREC_BF16 : !strcmp(prec, "fp32") ? SF_PREC_FP32 : SF_PREC_TF32;
    cfg.optim = !strcmp(optim, "adamw") ? SF_OPT_ADAMW : SF_OPT_SGD;
    cfg.seed = 1;
    cfg.max_batch = batch;
    cfg.overlap = 1;
    cfg.cuda_graphs = graphs;
    cfg.device = 0;
    sf_exec_switches sw;
    memset(&sw, 0, sizeof sw);
    sw.no_patch = !patch;
    sw.no_s2d = !s2d;
    sw.no_bn_fuse = !bn_fuse;
    sw.no_thin = !thin;
    sw.no_dw = !dw;
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
    job.bucket_bytes = (size_t)bucket_mb << 20;
    cfg.dist = one_rank ? &job : NULL;
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
    /* 32x32 random images upscaled (nearest) to hw x hw, as W3 describes */
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
    b.hyper.momentum = momentum;
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
           preset, prec, batch, m.in_h, m.in_w, steps * batch / sec_as, sec_as * 1e3 / steps, steps * batch / sec_s,
           sec_s * 1e3 / steps, prop.name, lay, one_rank ? ", one-rank NCCL job" : "");
    /* Evaluation batches (forward only, eval-mode batchnorm) from the same
     * cached raw batch, augmented each step as the training figure. */
    double sec_ev = 0;
    b.eval = 1;
    if (be->i->bench(be, &b, SF_BENCH_AUG_STEP, warmup, steps, &sec_ev, err, sizeof err)) {
        fprintf(stderr, "cached: eval bench: %s\n", err);
        return 1;
    }
    printf("%s %s batch %d %dx%d: eval (aug+forward) %.1f samples/s (%.2f ms/batch), %.2fx aug+step\n", preset, prec,
           batch, m.in_h, m.in_w, steps * batch / sec_ev, sec_ev * 1e3 / steps, sec_as / sec_ev);
    printf("{\"bench\":\"cached\",\"device\":\"%s\",\"preset\":\"%s\",\"precision\":\"%s\",\"layout\":\"%s\","
           "\"batch\":%d,\"hw\":%d,\"graphs\":%d,\"steps\":%d,\"aug_step_samples_per_s\":%.1f,"
           "\"step_samples_per_s\":%.1f,\"aug_step_ms\":%.3f,\"step_ms\":%.3f,\"eval_samples_per_s\":%.1f,"
           "\"one_rank_job\":%d,\"bucket_mb\":%d}\n",
           prop.name, preset, prec, lay, batch, m.in_h, graphs, steps, steps * batch / sec_as,
           steps * batch / sec_s, sec_as * 1e3 / steps, sec_s * 1e3 / steps, steps * batch / sec_ev, one_rank,
           one_rank ? bucket_mb : 0);
    be->i->host_free(be, im);
    be->i->host_free(be, lab);
    be->i->destroy(be);
    sf_kv_table_free(kv);
    return 0;
}
