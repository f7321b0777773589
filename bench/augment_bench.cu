/* bench/augment_bench.cu — the fused augmentation kernels against the device's
 * own copy bandwidth measured in the same run. Cases:
 *   W1 (WORKLOADS.md W1: 32 x 256x256x3 uint8 NHWC -> random_crop 128 -> resize
 *     256 -> rotation ±45 -> blur k7 sigma [0.1,2] -> normalize mean 0 std 1,
 *     float NCHW), with bf16 output, NHWC output and without the blur;
 *   identity (uint8 -> float, the floor of any pipeline);
 *   rrc224_flip: random_resized_crop 224 + flip + normalize on the same 256x256
 *     sources (the antialiased filter, uniform batch);
 *   imagenet_rrc224_bf16: the ImageNet recipe on JPEG-decoded sources — a ragged
 *     batch (default 256) of HWC images of about 500x375 (each side drawn within
 *     ±12%, one in four portrait), random_resized_crop 224 (scale [0.08, 1],
 *     antialias) + flip + to_dtype + normalize, bf16 NHWC output: what the
 *     service runs for ResNet-18 from JPEG (WORKLOADS.md's ImageNet-like case).
 *
 * The memory bound is (bytes in + bytes out) / copy bandwidth, where the copy
 * bandwidth counts bytes read plus bytes written of a 1 GiB cudaMemcpyAsync
 * device-to-device copy, and bytes in are the whole sources the kernel is given
 * (a crop reads less: crop_bytes in the JSON is the bytes of the crop windows,
 * for a bound on what must be read). Input and output buffers rotate over more
 * than the L2 holds so each launch reads its source from device memory. Times
 * are medians of single launches bracketed by events, after a warm-up;
 * "pipelined" is the mean of back-to-back launches (launch gaps included).
 * copy_us is a cudaMemcpyAsync of the case's own bytes (half of bytes in + out
 * each way) timed the same way: what a copy achieves at that size, launch and
 * ramp included, which the 1 GiB rate of the bound leaves out (W1 batch 32:
 * about 1.3x the bound).
 *
 * Usage: augment_bench [--batch N] [--imagenet-batch N] [--iters N]
 * Prints a table and one JSON line per case.
 * Build: make build/bench/augment_bench (CUDA=1), or
 *        nvcc -std=c++17 -O3 -arch=sm_90 -I. bench/augment_bench.cu \
 *          gpu/cuda/augment.cu gpu/cuda/augment_c[1-4].cu gpu/cuda/aug_post.cu gpu/aug.c \
 *          gpu/ref/augment.c gpu/common.c -lcjson
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "gpu/cuda/augment.h"
#include "gpu/cuda/program.h"

/* Reported in the JSON: the kernel's multiply-add mode (augment_kernels.cuh defaults
 * to SF_AUG_FMA=1; build every file with -DSF_AUG_FMA=0 for the bit-exact one). */
#ifdef SF_AUG_FMA
#define SF_AUG_FMA_BUILD SF_AUG_FMA
#else
#define SF_AUG_FMA_BUILD 1
#endif

#define CK(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                 \
                    cudaGetErrorString(e_));                                              \
            exit(2);                                                                      \
        }                                                                                 \
    } while (0)

static const char *W1_JSON =
    "[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":1.0},"
    "{\"op\":\"random_crop\",\"size\":[128,128]},{\"op\":\"resize\",\"size\":[256,256]},"
    "{\"op\":\"random_rotation\",\"degrees\":[-45,45]},"
    "{\"op\":\"gaussian_blur\",\"kernel_size\":7,\"sigma\":[0.1,2.0]},"
    "{\"op\":\"normalize\",\"mean\":[0],\"std\":[1]}]";
static const char *W1_NOBLUR_JSON =
    "[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":1.0},"
    "{\"op\":\"random_crop\",\"size\":[128,128]},{\"op\":\"resize\",\"size\":[256,256]},"
    "{\"op\":\"random_rotation\",\"degrees\":[-45,45]},"
    "{\"op\":\"normalize\",\"mean\":[0],\"std\":[1]}]";

/* ImageNet-style training geometry on the same sources: random_resized_crop to
 * 224 (antialiased where the crop shrinks), flip, normalize. */
static const char *RRC224_JSON =
    "[{\"op\":\"random_resized_crop\",\"size\":[224,224]},{\"op\":\"horizontal_flip\"},"
    "{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":0.00392156862},"
    "{\"op\":\"normalize\",\"mean\":[0.485,0.456,0.406],\"std\":[0.229,0.224,0.225]}]";

static float median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* Device-to-device copy bandwidth, bytes read + written per second. */
static double copy_bandwidth(void)
{
    const size_t bytes = (size_t)1 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 0x5A, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int i = 0; i < 13; i++) {
        CK(cudaEventRecord(e0));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (i >= 3) ms.push_back(t);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * bytes / (median(ms) * 1e-3);
}

struct Result {
    float med_us, pipe_us, copy_us;
    double bytes_in, bytes_out, crop_bytes;
};

/* One case: a pipeline, a batch, uniform 256x256x3 sources or ragged ones. */
struct Cfg {
    const char *name, *json;
    int bf16, out_nhwc, ragged;
};

/* xorshift64: the bench's sources and sizes, the same every run. */
static uint64_t xs(uint64_t &r)
{
    r ^= r << 13; r ^= r >> 7; r ^= r << 17;
    return r;
}

/* Times one configuration. */
static Result bench(const Cfg &cfg, int batch, int iters)
{
    char err[256];
    sf_aug_pipeline pipe;
    sf_aug_plan plan;
    const int C = 3;
    if (sf_aug_parse(cfg.json, &pipe, err, sizeof err) ||
        (cfg.ragged ? sf_aug_plan_make_ragged(&pipe, C, &plan, err, sizeof err)
                    : sf_aug_plan_make(&pipe, 256, 256, C, &plan, err, sizeof err))) {
        fprintf(stderr, "%s: plan: %s\n", cfg.name, err);
        exit(2);
    }
    /* Enough buffers that one rotation is well over the 50-60 MB L2: uniform
     * 10 x 6.3 MB in + 4 x 25 MB out at batch 32; ragged 3 x ~140 MB in. */
    const int NIN = cfg.ragged ? 3 : 10, NOUT = 4;
    uint64_t r = 0x12345678ull;
    std::vector<std::vector<int>> hw(NIN, std::vector<int>(2 * batch));
    std::vector<size_t> in_sz(NIN);
    for (int i = 0; i < NIN; i++) {
        size_t sz = 0;
        for (int k = 0; k < batch; k++) {
            int h = 256, w = 256;
            if (cfg.ragged) {
                h = 375 + (int)(xs(r) % 91) - 45; /* 330..420 */
                w = 500 + (int)(xs(r) % 121) - 60; /* 440..560 */
                if (xs(r) % 4 == 0) std::swap(h, w);
            }
            hw[i][2 * k] = h;
            hw[i][2 * k + 1] = w;
            sz += (size_t)C * h * w;
        }
        in_sz[i] = sz;
    }
    const size_t out_elems = (size_t)batch * C * plan.out_h * plan.out_w;
    const size_t out_sz = out_elems * (cfg.bf16 ? 2 : 4);
    std::vector<uint8_t *> d_in(NIN);
    std::vector<sf_aug_sample *> d_smp(NIN);
    std::vector<void *> d_out(NOUT);
    std::vector<sf_aug_sample> smp(batch);
    double crop_bytes = 0;
    for (int i = 0; i < NIN; i++) {
        std::vector<uint8_t> h(in_sz[i]);
        for (size_t k = 0; k < in_sz[i]; k++) h[k] = (uint8_t)(xs(r) >> 24);
        CK(cudaMalloc(&d_in[i], in_sz[i]));
        CK(cudaMemcpy(d_in[i], h.data(), in_sz[i], cudaMemcpyHostToDevice));
        if (cfg.ragged)
            sf_aug_gen_ragged(&pipe, &plan, 42, (uint64_t)i, batch, hw[i].data(), smp.data());
        else
            sf_aug_gen(&pipe, &plan, 42, (uint64_t)i, batch, smp.data());
        if (i == 0)
            for (int k = 0; k < batch; k++)
                crop_bytes += (double)C * (smp[k].clip[2] - smp[k].clip[0] + 1) *
                              (smp[k].clip[3] - smp[k].clip[1] + 1);
        CK(cudaMalloc(&d_smp[i], sizeof(sf_aug_sample) * batch));
        CK(cudaMemcpy(d_smp[i], smp.data(), sizeof(sf_aug_sample) * batch, cudaMemcpyHostToDevice));
    }
    for (int i = 0; i < NOUT; i++) CK(cudaMalloc(&d_out[i], out_sz));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    auto launch = [&](int it) {
        int rc = cfg.bf16 ? sf_cuda_augment_bf16(&plan, d_smp[it % NIN], batch, d_in[it % NIN], 1,
                                                 (uint16_t *)d_out[it % NOUT], cfg.out_nhwc, s)
                          : sf_cuda_augment(&plan, d_smp[it % NIN], batch, d_in[it % NIN], 1,
                                            (float *)d_out[it % NOUT], cfg.out_nhwc, s);
        if (rc) {
            fprintf(stderr, "sf_cuda_augment: %s\n", sf_cuda_last_error());
            exit(2);
        }
    };
    for (int i = 0; i < 20; i++) launch(i);
    CK(cudaStreamSynchronize(s));

    std::vector<cudaEvent_t> ev(2 * iters);
    for (auto &e : ev) CK(cudaEventCreate(&e));
    /* The median of iters single operations, each bracketed by events. */
    auto median_us = [&](auto &&op) {
        for (int i = 0; i < iters; i++) {
            CK(cudaEventRecord(ev[2 * i], s));
            op(i);
            CK(cudaEventRecord(ev[2 * i + 1], s));
        }
        CK(cudaStreamSynchronize(s));
        std::vector<float> ms(iters);
        for (int i = 0; i < iters; i++) CK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
        return median(ms) * 1e3f;
    };
    const float med_us = median_us(launch);
    CK(cudaEventRecord(ev[0], s));
    for (int i = 0; i < iters; i++) launch(i);
    CK(cudaEventRecord(ev[1], s));
    CK(cudaStreamSynchronize(s));
    float tot;
    CK(cudaEventElapsedTime(&tot, ev[0], ev[1]));
    /* The same-size copy: bytes in + out moved as one device-to-device copy
     * of half as many bytes, timed like the kernel. Each copy reads a buffer
     * last written NC/2 copies before, over 240 MB of traffic ago, so it
     * comes from device memory as the kernel's source does. */
    double in_all = 0;
    for (int i = 0; i < NIN; i++) in_all += (double)in_sz[i] / NIN;
    const size_t half = (size_t)((in_all + (double)out_sz) / 2) & ~(size_t)255;
    const int NC = std::min(64, std::max(4, 2 * (int)(240e6 / (2.0 * half) + 1)));
    std::vector<void *> cb(NC);
    for (auto &p : cb) {
        CK(cudaMalloc(&p, half));
        CK(cudaMemsetAsync(p, 0x5A, half, s));
    }
    auto copy = [&](int i) {
        CK(cudaMemcpyAsync(cb[(i + NC / 2) % NC], cb[i % NC], half, cudaMemcpyDeviceToDevice, s));
    };
    for (int i = 0; i < NC; i++) copy(i);
    const float copy_us = median_us(copy);
    for (auto &p : cb) CK(cudaFree(p));
    for (auto &e : ev) CK(cudaEventDestroy(e));
    for (int i = 0; i < NIN; i++) {
        CK(cudaFree(d_in[i]));
        CK(cudaFree(d_smp[i]));
    }
    for (int i = 0; i < NOUT; i++) CK(cudaFree(d_out[i]));
    CK(cudaStreamDestroy(s));
    /* Bytes of one launch: the mean over the rotating inputs. */
    double in_mean = 0;
    for (int i = 0; i < NIN; i++) in_mean += (double)in_sz[i] / NIN;
    return Result{med_us, tot * 1e3f / iters, copy_us, in_mean, (double)out_sz, crop_bytes};
}

int main(int argc, char **argv)
{
    int batch = 32, imagenet_batch = 256, iters = 300;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--imagenet-batch")) imagenet_batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
    }
    if (skip_without_device())
        return 0;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const double bw = copy_bandwidth();
    printf("augment_bench: %s, %d SMs, L2 %d MB; device-to-device copy %.0f GB/s (read+write)\n",
           prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, bw * 1e-9);
    const Cfg cfgs[] = {
        {"W1", W1_JSON, 0, 0, 0},
        {"W1_bf16", W1_JSON, 1, 0, 0},
        {"W1_out_nhwc", W1_JSON, 0, 1, 0},
        {"W1_noblur", W1_NOBLUR_JSON, 0, 0, 0},
        {"identity", "[]", 0, 0, 0},
        {"rrc224_flip", RRC224_JSON, 0, 0, 0},
        {"imagenet_rrc224_bf16", RRC224_JSON, 1, 1, 1},
    };
    printf("%-21s %6s %10s %10s %12s %9s %9s %9s %9s %8s %8s %7s\n", "config", "batch", "median_us", "pipe_us",
           "images/s", "MB_in", "MB_out", "GB/s", "bound_us", "x_bound", "copy_us", "x_copy");
    for (const Cfg &c : cfgs) {
        const int b = c.ragged ? imagenet_batch : batch;
        Result r = bench(c, b, iters);
        const double bytes = r.bytes_in + r.bytes_out;
        const double gbs = bytes / (r.med_us * 1e-6) * 1e-9;
        const double bound_us = bytes / bw * 1e6;
        const double ips = b / (r.med_us * 1e-6);
        printf("%-21s %6d %10.2f %10.2f %12.0f %9.1f %9.1f %9.0f %9.2f %8.2f %8.2f %7.2f\n", c.name, b, r.med_us,
               r.pipe_us, ips, r.bytes_in * 1e-6, r.bytes_out * 1e-6, gbs, bound_us, r.med_us / bound_us,
               r.copy_us, r.med_us / r.copy_us);
        printf("{\"bench\":\"augment\",\"config\":\"%s\",\"device\":\"%s\",\"batch\":%d,"
               "\"median_us\":%.3f,\"pipelined_us\":%.3f,\"images_per_s\":%.0f,\"bytes_in\":%.0f,"
               "\"bytes_out\":%.0f,\"crop_bytes\":%.0f,\"bytes\":%.0f,\"achieved_gbps\":%.1f,"
               "\"copy_gbps\":%.1f,\"ratio_to_copy\":%.3f,\"bound_us\":%.3f,\"x_of_bound\":%.3f,"
               "\"same_size_copy_us\":%.3f,\"x_of_same_size_copy\":%.3f,\"fma\":%d}\n",
               c.name, prop.name, b, r.med_us, r.pipe_us, ips, r.bytes_in, r.bytes_out, r.crop_bytes,
               bytes, gbs, bw * 1e-9, gbs / (bw * 1e-9), bound_us, r.med_us / bound_us, r.copy_us,
               r.med_us / r.copy_us, SF_AUG_FMA_BUILD);
    }
    return 0;
}
