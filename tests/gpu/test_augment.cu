/* tests/gpu/test_augment.cu — the CUDA augmentation (gpu/cuda/augment.cu) against
 * the CPU reference (sf_ref_augment, gpu/ref/augment.c), DESIGN.md §8.
 *
 * Every case draws fresh random uint8 images (a new seed each run, printed; set
 * `--seed 0x...` replays one), runs the reference and the kernel with the
 * same plan and per-sample parameters, and compares by ‖out−ref‖/‖ref‖:
 * float32 < 1e-5, bf16 < 1e-2; NaN never passes. The device output is filled
 * with NaN before each run so any element the kernel fails to write fails the
 * case. Each case runs for both input layouts (NHWC, NCHW) and both output
 * layouts (NCHW, NHWC). Ragged cases give every sample its own random source
 * size (HWC, packed one after the other, sf_aug_gen_ragged) and run NHWC only.
 * The tolerance is the same for every geometry: clamped bilinear and nearest
 * taps, the antialias filter (long sums, fused multiply-adds on the device) and
 * its rotated form stay far below 1e-5 relative to the reference.
 *
 * Prints one line per case: "ok <name> (...)" or "FAIL <name>: rel err X, worst
 * elements ...". Exits 1 when any case fails, 0 otherwise; prints
 * "SKIPPED: no CUDA device" and exits 0 when there is no device.
 *
 * The colour jitter, erasing and mixing cases run the second pass
 * (gpu/cuda/aug_post.cu) and the mixing (gpu/cuda/mix.cu) after the kernel,
 * with the same tolerances.
 *
 * Build: nvcc -std=c++17 -O3 -arch=sm_90 -I. tests/gpu/test_augment.cu \
 *          gpu/cuda/augment.cu gpu/cuda/augment_c[1-4].cu gpu/cuda/aug_post.cu gpu/cuda/mix.cu \
 *          gpu/aug.c gpu/ref/augment.c gpu/common.c -lcjson
 */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <vector>

#include "gpu/cuda/augment.h"
#include "gpu/cuda/mix.h"
extern "C" {
#include "gpu/ref/ref.h"
}

#include "tests/gpu/gpu_test.h"

static uint64_t g_rng;

static uint64_t next_u64(void)
{
    g_rng += 0x9E3779B97F4A7C15ull;
    uint64_t z = g_rng;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

struct Case {
    const char *name;
    const char *json;
    int h, w, c, n;
};

static float bf16_to_float(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Compares got (in layout out_nhwc) with ref (NCHW). Returns 1 when it passes. */
static int compare(const char *name, const float *got, const float *ref, int n, int c, int oh,
                   int ow, int out_nhwc, double tol)
{
    const size_t total = (size_t)n * c * oh * ow;
    double num = 0.0, den = 0.0, maxabs = 0.0;
    size_t nan_count = 0;
    /* The five largest differences, for the failure message. */
    struct W { double d; size_t i; float g, r; } worst[5] = {};
    for (size_t i = 0; i < total; i++) {
        size_t x = i % ow, y = (i / ow) % oh, ch = (i / ((size_t)ow * oh)) % c, s = i / ((size_t)ow * oh * c);
        size_t gi = out_nhwc ? ((s * oh + y) * ow + x) * c + ch : i;
        const float g = got[gi], r = ref[i];
        double d = (double)g - (double)r;
        if (isnan(g) || isnan(r)) {
            nan_count++;
            d = INFINITY;
        }
        if (isfinite(d)) num += d * d;
        den += (double)r * r;
        double ad = fabs(d);
        if (isfinite(ad) && ad > maxabs) maxabs = ad;
        if (ad > worst[4].d) {
            int k = 4;
            while (k > 0 && ad > worst[k - 1].d) { worst[k] = worst[k - 1]; k--; }
            worst[k] = W{ad, i, g, r};
        }
    }
    const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    const int pass = nan_count == 0 && rel < tol && den > 0;
    if (pass) {
        g_ok++;
        printf("ok %s (rel err %.3g, max abs %.3g)\n", name, rel, maxabs);
        return 1;
    }
    g_fail++;
    printf("FAIL %s: rel err %.3g (tol %.0e), %zu NaN, |ref| %.3g, worst elements", name, rel, tol,
           nan_count, sqrt(den));
    for (int k = 0; k < 5 && worst[k].d > 0; k++) {
        size_t i = worst[k].i;
        printf(" [n%zu c%zu y%zu x%zu] got %.7g want %.7g;", i / ((size_t)ow * oh * c),
               (i / ((size_t)ow * oh)) % c, (i / ow) % oh, i % ow, worst[k].g, worst[k].r);
    }
    printf("\n");
    return 0;
}

/* Waits for the device; returns 1 when the launches (rc, the first failing
 * launcher's result) and the device succeeded, else counts and prints the
 * failure under name. */
static int launched(const char *name, int rc)
{
    const cudaError_t se = cudaDeviceSynchronize();
    if (rc == 0 && se == cudaSuccess)
        return 1;
    g_fail++;
    printf("FAIL %s: rc %d: %s / %s\n", name, rc, sf_cuda_last_error(), cudaGetErrorString(se));
    return 0;
}

/* n bf16 values from the device, as floats. */
static void down_bf16(std::vector<float> &out, const uint16_t *d, size_t n)
{
    std::vector<uint16_t> b(n);
    CU(cudaMemcpy(b.data(), d, sizeof(uint16_t) * n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        out[i] = bf16_to_float(b[i]);
}

/* Runs one case in all four layout combinations, float32 and (when bf16) bf16 output. */
static void run_case(const Case &cs, int bf16, int misalign)
{
    char err[256];
    sf_aug_pipeline pipe;
    sf_aug_plan plan;
    if (sf_aug_parse(cs.json, &pipe, err, sizeof err) != 0 ||
        sf_aug_plan_make(&pipe, cs.h, cs.w, cs.c, &plan, err, sizeof err) != 0) {
        g_fail++;
        printf("FAIL %s: plan: %s\n", cs.name, err);
        return;
    }
    const int n = cs.n, c = cs.c, h = cs.h, w = cs.w, oh = plan.out_h, ow = plan.out_w;
    std::vector<sf_aug_sample> smp(n);
    sf_aug_gen(&pipe, &plan, next_u64(), next_u64() % 1000000, n, smp.data());
    /* The batch-level mixing (none unless the list has mixup or cutmix). */
    sf_aug_mix mix;
    sf_aug_gen_mix(&pipe, &plan, next_u64(), next_u64() % 1000000, n, &mix);

    const size_t in_sz = (size_t)n * h * w * c, out_sz = (size_t)n * c * oh * ow;
    std::vector<uint8_t> nhwc(in_sz), nchw(in_sz);
    for (size_t i = 0; i < in_sz; i++) nhwc[i] = (uint8_t)(next_u64() >> 56);
    for (int s = 0; s < n; s++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                for (int ch = 0; ch < c; ch++)
                    nchw[(((size_t)s * c + ch) * h + y) * w + x] = nhwc[(((size_t)s * h + y) * w + x) * c + ch];

    uint8_t *d_src;
    sf_aug_sample *d_smp;
    float *d_out;
    CU(cudaMalloc(&d_src, in_sz));
    CU(cudaMalloc(&d_smp, sizeof(sf_aug_sample) * n));
    CU(cudaMalloc(&d_out, sizeof(float) * (out_sz + 4)));
    CU(cudaMemcpy(d_smp, smp.data(), sizeof(sf_aug_sample) * n, cudaMemcpyHostToDevice));
    std::vector<float> ref(out_sz), got(out_sz);
    std::vector<float> gotbf(out_sz);
    float *d_dst = d_out + (misalign ? 1 : 0); /* 4 bytes off: the scalar store path */

    for (int in_nhwc = 1; in_nhwc >= 0; in_nhwc--) {
        const std::vector<uint8_t> &src = in_nhwc ? nhwc : nchw;
        sf_ref_augment(&plan, smp.data(), n, src.data(), in_nhwc, ref.data());
        sf_ref_aug_mix(&plan, &mix, n, ref.data());
        CU(cudaMemcpy(d_src, src.data(), in_sz, cudaMemcpyHostToDevice));
        for (int out_nhwc = 0; out_nhwc <= 1; out_nhwc++) {
            char name[200];
            snprintf(name, sizeof name, "%s %dx%dx%d n%d %s->%s%s", cs.name, h, w, c, n,
                     in_nhwc ? "nhwc" : "nchw", out_nhwc ? "nhwc" : "nchw", misalign ? " misaligned" : "");
            CU(cudaMemset(d_out, 0xFF, sizeof(float) * (out_sz + 4))); /* NaN everywhere */
            int rc = sf_cuda_augment(&plan, d_smp, n, d_src, in_nhwc, d_dst, out_nhwc, 0);
            if (rc == 0)
                rc = sf_cuda_aug_mix(&plan, &mix, n, d_dst, 0, out_nhwc, 0);
            if (!launched(name, rc))
                continue;
            CU(cudaMemcpy(got.data(), d_dst, sizeof(float) * out_sz, cudaMemcpyDeviceToHost));
            compare(name, got.data(), ref.data(), n, c, oh, ow, out_nhwc, 1e-5);

            if (!bf16) continue;
            snprintf(name, sizeof name, "%s %dx%dx%d n%d %s->%s bf16", cs.name, h, w, c, n,
                     in_nhwc ? "nhwc" : "nchw", out_nhwc ? "nhwc" : "nchw");
            uint16_t *d_b = reinterpret_cast<uint16_t *>(d_out);
            CU(cudaMemset(d_out, 0xFF, sizeof(float) * (out_sz + 4)));
            rc = sf_cuda_augment_bf16(&plan, d_smp, n, d_src, in_nhwc, d_b, out_nhwc, 0);
            if (rc == 0)
                rc = sf_cuda_aug_mix(&plan, &mix, n, d_b, 1, out_nhwc, 0);
            if (!launched(name, rc))
                continue;
            down_bf16(gotbf, d_b, out_sz);
            compare(name, gotbf.data(), ref.data(), n, c, oh, ow, out_nhwc, 1e-2);
        }
    }
    CU(cudaFree(d_src));
    CU(cudaFree(d_smp));
    CU(cudaFree(d_out));
}

/* A ragged batch: n samples of random sizes in [min_side, max_side], packed HWC,
 * through sf_aug_plan_make_ragged / sf_aug_gen_ragged, float32 (or, with bf16,
 * bf16 within 1e-2) NCHW and NHWC out. */
static void run_ragged_case(const char *cname, const char *json, int c, int n, int min_side,
                            int max_side, int bf16 = 0)
{
    char err[256];
    sf_aug_pipeline pipe;
    sf_aug_plan plan;
    if (sf_aug_parse(json, &pipe, err, sizeof err) != 0 ||
        sf_aug_plan_make_ragged(&pipe, c, &plan, err, sizeof err) != 0) {
        g_fail++;
        printf("FAIL %s: plan: %s\n", cname, err);
        return;
    }
    const int oh = plan.out_h, ow = plan.out_w;
    std::vector<int> hw(2 * n);
    size_t in_sz = 0;
    for (int i = 0; i < 2 * n; i++) hw[i] = min_side + (int)(next_u64() % (uint64_t)(max_side - min_side + 1));
    for (int i = 0; i < n; i++) in_sz += (size_t)c * hw[2 * i] * hw[2 * i + 1];
    std::vector<sf_aug_sample> smp(n);
    sf_aug_gen_ragged(&pipe, &plan, next_u64(), next_u64() % 1000000, n, hw.data(), smp.data());
    std::vector<uint8_t> src(in_sz);
    for (size_t i = 0; i < in_sz; i++) src[i] = (uint8_t)(next_u64() >> 56);
    const size_t out_sz = (size_t)n * c * oh * ow;
    std::vector<float> ref(out_sz), got(out_sz);
    sf_ref_augment(&plan, smp.data(), n, src.data(), 1, ref.data());

    uint8_t *d_src;
    sf_aug_sample *d_smp;
    float *d_out;
    CU(cudaMalloc(&d_src, in_sz));
    CU(cudaMalloc(&d_smp, sizeof(sf_aug_sample) * n));
    CU(cudaMalloc(&d_out, sizeof(float) * out_sz));
    CU(cudaMemcpy(d_src, src.data(), in_sz, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_smp, smp.data(), sizeof(sf_aug_sample) * n, cudaMemcpyHostToDevice));
    for (int out_nhwc = 0; out_nhwc <= 1; out_nhwc++) {
        char name[200];
        snprintf(name, sizeof name, "%s ragged %d..%d c%d n%d ->%s", cname, min_side, max_side, c, n,
                 out_nhwc ? "nhwc" : "nchw");
        if (bf16) strncat(name, " bf16", sizeof name - strlen(name) - 1);
        CU(cudaMemset(d_out, 0xFF, sizeof(float) * out_sz));
        int rc = bf16 ? sf_cuda_augment_bf16(&plan, d_smp, n, d_src, 1, reinterpret_cast<uint16_t *>(d_out),
                                             out_nhwc, 0)
                      : sf_cuda_augment(&plan, d_smp, n, d_src, 1, d_out, out_nhwc, 0);
        if (!launched(name, rc))
            continue;
        if (bf16) {
            down_bf16(got, reinterpret_cast<const uint16_t *>(d_out), out_sz);
        } else {
            CU(cudaMemcpy(got.data(), d_out, sizeof(float) * out_sz, cudaMemcpyDeviceToHost));
        }
        compare(name, got.data(), ref.data(), n, c, oh, ow, out_nhwc, bf16 ? 1e-2 : 1e-5);
    }
    /* Ragged sources are HWC: the launcher refuses to read them as CHW. */
    sf_cuda_clear_error();
    const int refused = sf_cuda_augment(&plan, d_smp, n, d_src, 0, d_out, 0, 0) == -1 &&
                        strstr(sf_cuda_last_error(), "ragged") != NULL;
    printf("%s %s ragged_sources_read_as_chw_are_refused\n", refused ? "ok" : "FAIL", cname);
    refused ? g_ok++ : g_fail++;
    CU(cudaFree(d_src));
    CU(cudaFree(d_smp));
    CU(cudaFree(d_out));
}

/* The launcher rejects what it cannot run, with a message, and n == 0 is a no-op. */
static void check_errors(void)
{
    char err[256];
    sf_aug_pipeline pipe;
    sf_aug_plan plan;
    if (sf_aug_parse(R"([{"op":"gaussian_blur","kernel_size":5}])", &pipe, err, sizeof err) ||
        sf_aug_plan_make(&pipe, 16, 16, 3, &plan, err, sizeof err)) {
        g_fail++;
        printf("FAIL launcher_rejects_bad_arguments: plan: %s\n", err);
        return;
    }
    float *d_dst;
    uint8_t *d_src;
    sf_aug_sample *d_smp;
    CU(cudaMalloc(&d_dst, 4 * 16 * 16 * 3));
    CU(cudaMalloc(&d_src, 16 * 16 * 3));
    CU(cudaMalloc(&d_smp, sizeof(sf_aug_sample)));
    int ok = 1;
    sf_aug_plan bad = plan;
    bad.blur_ksize = 4;
    sf_cuda_clear_error();
    ok &= sf_cuda_augment(&bad, d_smp, 1, d_src, 1, d_dst, 0, 0) == -1 &&
          strstr(sf_cuda_last_error(), "blur_ksize") != NULL;
    bad = plan;
    bad.c = 5;
    ok &= sf_cuda_augment(&bad, d_smp, 1, d_src, 1, d_dst, 0, 0) == -1 &&
          strstr(sf_cuda_last_error(), "augment.cu:") != NULL;
    ok &= sf_cuda_augment(&plan, d_smp, 1, NULL, 1, d_dst, 0, 0) == -1;
    ok &= sf_cuda_augment(&plan, d_smp, 0, d_src, 1, d_dst, 0, 0) == 0;
    CU(cudaDeviceSynchronize());
    printf("%s launcher_rejects_bad_arguments_and_names_them (last: \"%s\")\n", ok ? "ok" : "FAIL",
           sf_cuda_last_error());
    ok ? g_ok++ : g_fail++;
    CU(cudaFree(d_dst));
    CU(cudaFree(d_src));
    CU(cudaFree(d_smp));
}

/* The seed main() read from the command line (--seed 0x... replays a run), or
 * NULL: a fresh one. */
static const char *g_seed_arg = NULL;

/* Every case on the default stream, which the launchers are given here (the
 * harness's stream goes unused). */
static void run_cases(cudaStream_t)
{
    const char *es = g_seed_arg;
    uint64_t seed = es ? strtoull(es, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    g_rng = seed;
    printf("test_augment: seed 0x%llx (--seed 0x%llx replays it)\n", (unsigned long long)seed,
           (unsigned long long)seed);

    static const char *W1 =
        R"([{"op":"to_dtype","dtype":"float32","scale":1.0},)"
        R"({"op":"random_crop","size":[128,128]},{"op":"resize","size":[256,256]},)"
        R"({"op":"random_rotation","degrees":[-45,45]},)"
        R"({"op":"gaussian_blur","kernel_size":7,"sigma":[0.1,2.0]},)"
        R"({"op":"normalize","mean":[0],"std":[1]}])";
    /* Single ops on odd shapes. */
    const Case single[] = {
        {"identity", "[]", 33, 47, 3, 3},
        {"to_dtype", R"([{"op":"to_dtype","scale":0.00392156862}])", 33, 47, 3, 3},
        {"random_crop", R"([{"op":"random_crop","size":[17,29]}])", 33, 47, 3, 4},
        {"resize_up", R"([{"op":"resize","size":[50,71]}])", 33, 47, 3, 3},
        {"resize_down_half", R"([{"op":"resize","size":[16,24]}])", 32, 48, 3, 3},
        {"resize_down_odd", R"([{"op":"resize","size":[13,19]}])", 33, 47, 3, 3},
        {"resize_down_no_antialias", R"([{"op":"resize","size":[13,19],"antialias":false}])", 33, 47, 3, 3},
        {"resize_down_by_9_antialias", R"([{"op":"resize","size":[5,7]}])", 45, 63, 3, 2},
        {"center_crop", R"([{"op":"center_crop","size":[20,31]}])", 33, 47, 3, 3},
        {"center_crop_resize_up_clamps_at_the_crop", R"([{"op":"center_crop","size":[9,12]},{"op":"resize","size":[40,50]}])", 33, 47, 3, 3},
        {"random_resized_crop", R"([{"op":"random_resized_crop","size":[24,20]}])", 48, 64, 3, 6},
        {"random_resized_crop_no_antialias", R"([{"op":"random_resized_crop","size":[24,20],"antialias":false}])", 48, 64, 3, 6},
        {"random_resized_crop_fallback", R"([{"op":"random_resized_crop","size":[16,16],"scale":[0.9,1],"ratio":[3,4]}])", 40, 40, 3, 3},
        {"resize_down_then_rotation_antialias", R"([{"op":"resize","size":[19,23]},{"op":"random_rotation","degrees":[-40,40]}])", 33, 47, 3, 4},
        {"rotation_bilinear", R"([{"op":"random_rotation","degrees":[-45,45]}])", 33, 47, 3, 4},
        {"rotation_nearest", R"([{"op":"random_rotation","degrees":[-180,180],"interpolation":"nearest"}])", 33, 47, 3, 4},
        {"resize_nearest_ties", R"([{"op":"resize","size":[16,24]},{"op":"random_rotation","degrees":0,"interpolation":"nearest"}])", 32, 48, 3, 3},
        {"hflip_always", R"([{"op":"horizontal_flip","p":1.0}])", 33, 47, 3, 3},
        {"hflip_half", R"([{"op":"horizontal_flip"}])", 33, 47, 3, 6},
        {"blur_k7", R"([{"op":"gaussian_blur","kernel_size":7,"sigma":[0.1,2.0]}])", 33, 47, 3, 4},
        {"blur_k3", R"([{"op":"gaussian_blur","kernel_size":3,"sigma":[0.5,1.5]}])", 33, 47, 3, 3},
        {"blur_k1", R"([{"op":"gaussian_blur","kernel_size":1}])", 33, 47, 3, 2},
        {"blur_k31", R"([{"op":"gaussian_blur","kernel_size":31,"sigma":[3,9]}])", 33, 47, 3, 2},
        {"blur_k31_wider_than_image", R"([{"op":"gaussian_blur","kernel_size":31,"sigma":[3,9]}])", 9, 13, 3, 2},
        {"normalize", R"([{"op":"normalize","mean":[120,110,100],"std":[60,50,40]}])", 33, 47, 3, 3},
        {"color_convert", R"([{"op":"color_convert","to":"ycbcr"}])", 33, 47, 3, 3},
        {"color_convert_scaled", R"([{"op":"to_dtype","scale":0.00392156862},{"op":"color_convert"}])", 33, 47, 3, 3},
        {"mask_d0", R"([{"op":"random_mask","ratio":0.2,"dilate":0}])", 33, 47, 3, 3},
        {"mask_d1", R"([{"op":"random_mask","ratio":0.05,"dilate":1}])", 33, 47, 3, 3},
        {"mask_d5", R"([{"op":"random_mask","ratio":0.01,"dilate":5}])", 33, 47, 3, 3},
        {"mask_d32", R"([{"op":"random_mask","ratio":0.0005,"dilate":32}])", 70, 90, 3, 2},
        /* The separable antialias kernel: output tiles cut by the image edge in
         * both directions (67 = 64 + 3 rows, 37 = 32 + 5 columns), with the
         * mask stage after it; a shrink by 5 whose source rows overflow its row
         * buffer, and one by 40 whose taps overflow its tables: both take the
         * per-pixel path inside the same kernel. */
        {"rrc_tiles_cut_by_the_edge", R"([{"op":"random_resized_crop","size":[67,37]},{"op":"horizontal_flip"},)"
                                      R"({"op":"random_mask","ratio":0.02,"dilate":2}])", 90, 75, 3, 5},
        {"resize_down_by_5_overflows_the_row_buffer", R"([{"op":"resize","size":[66,40]}])", 330, 41, 3, 2},
        {"resize_down_by_40_overflows_the_tap_tables", R"([{"op":"resize","size":[15,20]}])", 600, 800, 3, 1},
        /* A rotation's tiles wholly inside its input skip the coverage: small
         * angles on an image of partial tiles, with and without a blur halo,
         * bilinear and nearest, and a blur wider than the image (halo folded
         * more than once). */
        {"rotation_small_angle_blur_partial_tiles", R"([{"op":"random_rotation","degrees":[-6,6]},{"op":"gaussian_blur","kernel_size":5}])", 150, 101, 3, 4},
        {"rotation_small_angle_partial_tiles", R"([{"op":"random_rotation","degrees":[-6,6]}])", 150, 101, 3, 4},
        {"rotation_nearest_small_angle_blur", R"([{"op":"random_rotation","degrees":[-6,6],"interpolation":"nearest"},{"op":"gaussian_blur","kernel_size":3}])", 150, 101, 3, 4},
        /* Bilinear blur tiles stage their source footprint in shared memory:
         * taps at the crop's edge (the staged box repeats it), and a shrink
         * whose footprint does not fit (the byte gathers instead). */
        {"center_crop_resize_up_blur_clamps_at_the_crop", R"([{"op":"center_crop","size":[9,12]},{"op":"resize","size":[40,50]},{"op":"gaussian_blur","kernel_size":3}])", 33, 47, 3, 3},
        {"resize_down_no_antialias_blur_footprint_too_big", R"([{"op":"resize","size":[20,24],"antialias":false},{"op":"gaussian_blur","kernel_size":5}])", 200, 240, 3, 2},
        {"rotation_blur_k31_wider_than_image", R"([{"op":"random_rotation","degrees":[-10,10]},{"op":"gaussian_blur","kernel_size":31,"sigma":[3,9]}])", 9, 13, 3, 2},
    };
    /* Channel counts and compositions. */
    const Case combo[] = {
        {"rotation_bilinear", R"([{"op":"random_rotation","degrees":[-45,45]}])", 33, 47, 1, 3},
        {"rotation_bilinear", R"([{"op":"random_rotation","degrees":[-45,45]}])", 33, 47, 4, 3},
        {"crop_resize_blur_normalize", R"([{"op":"random_crop","size":[20,30]},{"op":"resize","size":[37,41]},{"op":"gaussian_blur","kernel_size":5},{"op":"normalize","mean":[0.5],"std":[0.25]}])", 33, 47, 1, 3},
        {"crop_resize_blur_normalize", R"([{"op":"random_crop","size":[20,30]},{"op":"resize","size":[37,41]},{"op":"gaussian_blur","kernel_size":5},{"op":"normalize","mean":[1,2,3,4],"std":[5,6,7,8]}])", 33, 47, 4, 3},
        {"normalize_c1", R"([{"op":"normalize","mean":[100],"std":[30]}])", 33, 47, 1, 2},
        {"blur_mask_c4", R"([{"op":"gaussian_blur","kernel_size":9,"sigma":[1,3]},{"op":"random_mask","ratio":0.03,"dilate":2}])", 33, 47, 4, 3},
        {"everything", R"([{"op":"to_dtype","scale":0.00392156862},{"op":"random_crop","size":[40,50]},)"
                       R"({"op":"resize","size":[45,61]},{"op":"random_rotation","degrees":[-30,30]},)"
                       R"({"op":"horizontal_flip"},{"op":"gaussian_blur","kernel_size":5,"sigma":[0.3,1.2]},)"
                       R"({"op":"normalize","mean":[0.485,0.456,0.406],"std":[0.229,0.224,0.225]},)"
                       R"({"op":"color_convert"},{"op":"random_mask","ratio":0.02,"dilate":3}])", 48, 64, 3, 5},
        {"everything_nearest", R"([{"op":"random_crop","size":[40,50]},{"op":"resize","size":[45,61]},)"
                       R"({"op":"random_rotation","degrees":[-30,30],"interpolation":"nearest"},)"
                       R"({"op":"horizontal_flip"},{"op":"gaussian_blur","kernel_size":7},)"
                       R"({"op":"random_mask","ratio":0.02,"dilate":1},{"op":"normalize","mean":[128],"std":[64]}])", 48, 64, 3, 5},
        {"blur_mask_c2_aligned", R"([{"op":"random_rotation","degrees":[-20,20]},{"op":"gaussian_blur","kernel_size":11,"sigma":[1,4]},{"op":"random_mask","ratio":0.01,"dilate":4}])", 64, 64, 2, 3},
        {"resize_blur_c1_aligned", R"([{"op":"resize","size":[40,64]},{"op":"gaussian_blur","kernel_size":3}])", 33, 47, 1, 3},
        {"W1", W1, 256, 256, 3, 32},
        {"imagenet_like", R"([{"op":"random_resized_crop","size":[56,56]},{"op":"horizontal_flip"},)"
                          R"({"op":"to_dtype","scale":0.00392156862},)"
                          R"({"op":"normalize","mean":[0.485,0.456,0.406],"std":[0.229,0.224,0.225]}])", 75, 100, 3, 8},
        {"rrc_rotation_blur", R"([{"op":"random_resized_crop","size":[40,36]},{"op":"random_rotation","degrees":[-30,30]},)"
                              R"({"op":"gaussian_blur","kernel_size":5}])", 60, 70, 3, 4},
    };
    /* The second pass and the batch-level mixing: colour jitter on either value
     * scale, erasing with constant or noise values, mixup and cutmix after them. */
    const Case second[] = {
        {"color_jitter_0_255", R"([{"op":"color_jitter","brightness":0.4,"contrast":0.4,"saturation":0.4,"hue":0.1}])", 33, 47, 3, 8},
        {"color_jitter_0_1_after_crop", R"([{"op":"random_resized_crop","size":[40,36]},{"op":"to_dtype","scale":0.00392156862},)"
                                        R"({"op":"color_jitter","brightness":0.8,"contrast":[0.2,1.8],"saturation":0.9,"hue":0.5},)"
                                        R"({"op":"normalize","mean":[0.485,0.456,0.406],"std":[0.229,0.224,0.225]}])", 60, 70, 3, 8},
        {"color_jitter_c1_contrast_only", R"([{"op":"color_jitter","contrast":[0.1,3]}])", 33, 47, 1, 4},
        {"random_erasing_value", R"([{"op":"to_dtype","scale":0.00392156862},{"op":"random_erasing","p":1,"value":[0.1,0.2,0.3]}])", 33, 47, 3, 6},
        {"random_erasing_random_after_normalize", R"([{"op":"normalize","mean":[128],"std":[64]},{"op":"random_erasing","p":0.7,"value":"random"}])", 33, 47, 3, 6},
        {"mixup", R"([{"op":"random_crop","size":[30,40]},{"op":"mixup","alpha":0.4}])", 33, 47, 3, 7},
        {"cutmix", R"([{"op":"random_crop","size":[30,40]},{"op":"cutmix"}])", 33, 47, 3, 7},
        {"imagenet_recipe", R"([{"op":"random_resized_crop","size":[56,56]},{"op":"horizontal_flip"},)"
                            R"({"op":"to_dtype","scale":0.00392156862},{"op":"color_jitter","brightness":0.4,"contrast":0.4,"saturation":0.4},)"
                            R"({"op":"normalize","mean":[0.485,0.456,0.406],"std":[0.229,0.224,0.225]},)"
                            R"({"op":"random_erasing","p":0.25},{"op":"mixup","alpha":0.2},{"op":"cutmix","alpha":1}])", 75, 100, 3, 16},
    };
    for (const Case &cs : single) run_case(cs, 0, 0);
    for (const Case &cs : combo) run_case(cs, 0, 0);
    for (const Case &cs : second) run_case(cs, 1, 0);
    run_case(second[1], 0, 1);
    /* bf16 output and a misaligned float output on a few cases. */
    run_case(single[14], 1, 0); /* rotation_bilinear */
    run_case(single[19], 1, 0); /* blur_k7 */
    run_case(single[10], 1, 0); /* random_resized_crop */
    run_case(combo[6], 1, 0);
    run_case(combo[10], 1, 0); /* W1 */
    run_case(single[31], 1, 0); /* rrc_tiles_cut_by_the_edge */
    run_case(combo[2], 0, 1);
    run_case(combo[6], 0, 1);
    /* Ragged sources: every geometry mode, with and without a blur tile. */
    run_ragged_case("rrc_antialias", R"([{"op":"random_resized_crop","size":[32,40]},{"op":"horizontal_flip"}])",
                    3, 7, 9, 120);
    run_ragged_case("resize_bilinear_rotation_blur", R"([{"op":"resize","size":[33,47],"antialias":false},)"
                    R"({"op":"random_rotation","degrees":[-45,45]},{"op":"gaussian_blur","kernel_size":7}])",
                    3, 6, 5, 90);
    run_ragged_case("rotation_nearest_then_center_crop", R"([{"op":"random_rotation","degrees":[-90,90],"interpolation":"nearest"},)"
                    R"({"op":"center_crop","size":[30,30]},{"op":"random_mask","ratio":0.02,"dilate":1}])",
                    1, 5, 20, 70);
    run_ragged_case("resize_antialias_rotation_c4", R"([{"op":"resize","size":[24,28]},{"op":"random_rotation","degrees":[-20,20]}])",
                    4, 5, 30, 100);
    run_ragged_case("imagenet_like_224", R"([{"op":"random_resized_crop","size":[224,224]},{"op":"horizontal_flip"},)"
                    R"({"op":"normalize","mean":[124,116,104],"std":[58,57,57]}])", 3, 16, 300, 520);
    /* The ImageNet recipe as the service runs it for a bf16 net: odd-sized
     * sources, bf16 output. */
    run_ragged_case("imagenet_like_224_odd_sources", R"([{"op":"random_resized_crop","size":[224,224]},{"op":"horizontal_flip"},)"
                    R"({"op":"to_dtype","scale":0.00392156862},)"
                    R"({"op":"normalize","mean":[0.485,0.456,0.406],"std":[0.229,0.224,0.225]}])", 3, 8, 301, 517, 1);
    check_errors();
}

int main(int argc, char **argv)
{
    g_seed_arg = argc > 2 && strcmp(argv[1], "--seed") == 0 ? argv[2] : NULL;
    return run_op_test("test_augment", run_cases);
}
