/* tests/gpu/test_augment.cu — the CUDA augmentation (gpu/cuda/augment.cu, the
 * second pass gpu/cuda/aug_post.cu and the mixing gpu/cuda/mix.cu) against the
 * CPU reference (sf_ref_augment, sf_ref_aug_mix: gpu/ref/augment.c), DESIGN.md §8.
 *
 * The cases are a table of pipelines (aug_cases below), one row each: the
 * pipeline as the service reads it, the sources' size, the bounds of the
 * outputs' relative error, and the runs. Each run draws fresh random uint8
 * sources and per-sample parameters, runs the reference and the kernels with
 * the same plan and parameters, and compares every output it names (float32,
 * float32 written 4 bytes off alignment, bf16) by ‖out−ref‖/‖ref‖ with
 * gpu_test.h's check: float32 below the row's tol, bf16 below its tol_bf16, NaN
 * or Inf anywhere failing, and a reference of zeros failing too (it would
 * compare nothing). The device output is filled with NaN before each launch, so
 * any element the kernels fail to write fails the case. A run of fixed-size
 * sources covers both input layouts (NHWC, NCHW) and both output layouts
 * (NCHW, NHWC); a ragged row gives every sample its own random source size
 * (HWC, packed one after the other, sf_aug_gen_ragged), reads them as NHWC
 * only, and checks that the launcher refuses to read them as CHW.
 * The bounds are the same for every geometry: clamped bilinear and nearest
 * taps, the antialias filter (long sums, fused multiply-adds on the device) and
 * its rotated form stay far below 1e-5 relative to the reference, and a bf16
 * output's one rounding (half an ulp, at most 2^-8 of a value) below 1e-2.
 *
 * Usage: test_augment [--seed 0x...] [-k SUBSTRING] [-l]
 *   --seed  the run's seed (printed; a fresh one each run otherwise): each
 *           case's draws are seeded from it and the case's name, so a seed
 *           replays a run, and with -k one case of it
 *   -k      only the cases whose name holds SUBSTRING
 *   -l      print the selected cases, one "case <name>: N checks" line each,
 *           then "test_augment: C cases, N checks", and run nothing (no
 *           device needed); N counts the ok lines a passing run prints
 * Prints one line per output compared, "ok <case> <layouts> (rel X)" or
 * "FAIL <case> <layouts>: ...", then the summary line; exits 1 when any check
 * fails, 2 on a bad option or a filter that selects nothing, and 0 with
 * "SKIPPED: no CUDA device" when there is no device (run_op_test).
 *
 * Build: make build/tests/gpu/test_augment
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gpu/cuda/augment.h"
#include "gpu/cuda/mix.h"
#include "tests/gpu/op_test.h"

/* The outputs a run compares with the reference. */
enum { F32 = 1, F32_MISALIGNED = 2, BF16 = 4 };

/* One case: pipeline json on n sources of c channels. Fixed-size sources are
 * h x w; ragged ones (ragged = 1) each get a random size whose sides lie in
 * [h, w]. tol bounds the float32 outputs' relative error and tol_bf16 the
 * bf16 outputs' (0 where the case has none). Each entry of runs is one run
 * on fresh sources and parameters, naming the outputs it compares. */
struct aug_case {
    const char *name;
    const char *json;
    int ragged;
    int h, w, c, n;
    double tol, tol_bf16;
    std::vector<int> runs;
};

static aug_case pipeline(const char *name, const char *json, int h, int w, int c, int n, double tol,
                         double tol_bf16 = 0, std::vector<int> runs = {F32})
{
    return aug_case{name, json, 0, h, w, c, n, tol, tol_bf16, runs};
}

static aug_case ragged(const char *name, const char *json, int min_side, int max_side, int c, int n, double tol,
                       double tol_bf16 = 0, std::vector<int> runs = {F32})
{
    return aug_case{name, json, 1, min_side, max_side, c, n, tol, tol_bf16, runs};
}

/* The case's name: what -k matches and, with the run's seed, its draws' seed. */
static std::string case_name(const aug_case &k)
{
    char s[200];
    if (k.ragged)
        snprintf(s, sizeof s, "%s ragged %d..%d c%d n%d", k.name, k.h, k.w, k.c, k.n);
    else
        snprintf(s, sizeof s, "%s %dx%dx%d n%d", k.name, k.h, k.w, k.c, k.n);
    return s;
}

/* The draws of the case running now: splitmix64 from the case's seed. */
static uint64_t g_rng;

static uint64_t next_u64(void)
{
    g_rng += 0x9E3779B97F4A7C15ull;
    uint64_t z = g_rng;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The seed of a case's draws: the run's seed and the FNV-1a hash of its name. */
static uint64_t case_seed(uint64_t run_seed, const std::string &name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char ch : name)
        h = (h ^ ch) * 0x100000001b3ull;
    return run_seed ^ h;
}

/* got, n samples of c x oh x ow in layout out_nhwc, against the NCHW
 * reference ref within relative error tol (gpu_test.h's check). */
static void check_out(const char *name, std::vector<float> got, int out_nhwc, const std::vector<double> &ref, int n,
                      int c, int oh, int ow, double tol)
{
    size_t nonzero = 0;
    for (double r : ref)
        nonzero += r != 0;
    if (!nonzero) {
        fail(name, "the reference is all zeros, so the comparison would prove nothing");
        return;
    }
    check_v(name, out_nhwc ? to_nchw(got, n, c, oh, ow) : got, ref, tol);
}

/* One run of case k: fresh sources and parameters, every layout combination,
 * the outputs outs names (F32, F32_MISALIGNED, BF16), on stream s. */
static void run_case(const aug_case &k, const char *cname, int outs, cudaStream_t s)
{
    char err[256];
    sf_aug_pipeline pipe;
    sf_aug_plan plan;
    if (sf_aug_parse(k.json, &pipe, err, sizeof err) != 0 ||
        (k.ragged ? sf_aug_plan_make_ragged(&pipe, k.c, &plan, err, sizeof err)
                  : sf_aug_plan_make(&pipe, k.h, k.w, k.c, &plan, err, sizeof err)) != 0) {
        fail(subname(cname, "plan"), err);
        return;
    }
    const int n = k.n, c = k.c, oh = plan.out_h, ow = plan.out_w;
    std::vector<sf_aug_sample> smp(n);
    sf_aug_mix mix;
    size_t in_sz = 0;
    if (k.ragged) {
        std::vector<int> hw(2 * n);
        for (int i = 0; i < 2 * n; i++)
            hw[i] = k.h + (int)(next_u64() % (uint64_t)(k.w - k.h + 1));
        for (int i = 0; i < n; i++)
            in_sz += (size_t)c * hw[2 * i] * hw[2 * i + 1];
        sf_aug_gen_ragged(&pipe, &plan, next_u64(), next_u64() % 1000000, n, hw.data(), smp.data());
    } else {
        in_sz = (size_t)n * k.h * k.w * c;
        sf_aug_gen(&pipe, &plan, next_u64(), next_u64() % 1000000, n, smp.data());
        /* The batch-level mixing (none unless the list has mixup or cutmix). */
        sf_aug_gen_mix(&pipe, &plan, next_u64(), next_u64() % 1000000, n, &mix);
    }
    std::vector<uint8_t> nhwc(in_sz);
    for (size_t i = 0; i < in_sz; i++)
        nhwc[i] = (uint8_t)(next_u64() >> 56);

    const size_t out_sz = (size_t)n * c * oh * ow;
    uint8_t *d_src = dalloc<uint8_t>(in_sz);
    sf_aug_sample *d_smp = dalloc<sf_aug_sample>(n);
    float *d_out = dalloc<float>(out_sz + 4);
    up(d_smp, smp);
    std::vector<float> ref(out_sz);
    /* Ragged sources are HWC only; fixed-size ones are read in both layouts. */
    for (int in_nhwc = 1; in_nhwc >= (k.ragged ? 1 : 0); in_nhwc--) {
        const std::vector<uint8_t> src = in_nhwc ? nhwc : to_nchw(nhwc, n, c, k.h, k.w);
        sf_ref_augment(&plan, smp.data(), n, src.data(), in_nhwc, ref.data());
        if (!k.ragged)
            sf_ref_aug_mix(&plan, &mix, n, ref.data());
        const std::vector<double> refd = to_d(ref);
        up(d_src, src);
        for (int out_nhwc = 0; out_nhwc <= 1; out_nhwc++) {
            const sf_layout in_l = in_nhwc ? SF_LAYOUT_NHWC : SF_LAYOUT_NCHW,
                            out_l = out_nhwc ? SF_LAYOUT_NHWC : SF_LAYOUT_NCHW;
            for (const int out : {F32, F32_MISALIGNED, BF16}) {
                if (!(outs & out))
                    continue;
                const int bf16 = out == BF16;
                char name[300];
                if (k.ragged)
                    snprintf(name, sizeof name, "%s ->%s%s", cname, lname(out_l), bf16 ? " bf16" : "");
                else
                    snprintf(name, sizeof name, "%s %s->%s%s", cname, lname(in_l), lname(out_l),
                             bf16 ? " bf16" : out == F32_MISALIGNED ? " misaligned" : "");
                /* 4 bytes off: the scalar store path */
                void *dst = out == F32_MISALIGNED ? (void *)(d_out + 1) : (void *)d_out;
                poison(d_out, sizeof(float) * (out_sz + 4));
                int rc = bf16 ? sf_cuda_augment_bf16(&plan, d_smp, n, d_src, in_nhwc, (uint16_t *)dst, out_nhwc, s)
                              : sf_cuda_augment(&plan, d_smp, n, d_src, in_nhwc, (float *)dst, out_nhwc, s);
                if (rc == 0 && !k.ragged)
                    rc = sf_cuda_aug_mix(&plan, &mix, n, dst, bf16, out_nhwc, s);
                if (!ran_ok(s, name, rc))
                    continue;
                check_out(name, bf16 ? downb((const uint16_t *)dst, out_sz) : down((const float *)dst, out_sz),
                          out_nhwc, refd, n, c, oh, ow, bf16 ? k.tol_bf16 : k.tol);
            }
        }
    }
    if (k.ragged) {
        /* Ragged sources are HWC: the launcher refuses to read them as CHW. */
        sf_cuda_clear_error();
        pass_or_fail(subname(cname, "ragged_sources_read_as_chw_are_refused"),
                     sf_cuda_augment(&plan, d_smp, n, d_src, 0, d_out, 0, s) == -1 &&
                         strstr(sf_cuda_last_error(), "ragged") != NULL,
                     sf_cuda_last_error());
    }
    CU(cudaFree(d_src));
    CU(cudaFree(d_smp));
    CU(cudaFree(d_out));
}

/* The lines run_case prints for case k when every launch succeeds: one per
 * output, input layout and output layout, and a ragged run's refusal. */
static int case_checks(const aug_case &k)
{
    int lines = 0;
    for (const int outs : k.runs)
        lines += (k.ragged ? 2 : 4) * __builtin_popcount(outs) + k.ragged;
    return lines;
}

/* The launcher rejects what it cannot run, with a message, and n == 0 is a no-op. */
static const char *const k_errors_name = "launcher_rejects_bad_arguments_and_names_them";

static void check_errors(cudaStream_t s)
{
    char err[256];
    sf_aug_pipeline pipe;
    sf_aug_plan plan;
    if (sf_aug_parse(R"([{"op":"gaussian_blur","kernel_size":5}])", &pipe, err, sizeof err) ||
        sf_aug_plan_make(&pipe, 16, 16, 3, &plan, err, sizeof err)) {
        fail(subname(k_errors_name, "plan"), err);
        return;
    }
    float *d_dst = dalloc<float>(16 * 16 * 3);
    uint8_t *d_src = dalloc<uint8_t>(16 * 16 * 3);
    sf_aug_sample *d_smp = dalloc<sf_aug_sample>(1);
    int ok = 1;
    sf_aug_plan bad = plan;
    bad.blur_ksize = 4;
    sf_cuda_clear_error();
    ok &= sf_cuda_augment(&bad, d_smp, 1, d_src, 1, d_dst, 0, s) == -1 &&
          strstr(sf_cuda_last_error(), "blur_ksize") != NULL;
    bad = plan;
    bad.c = 5;
    ok &= sf_cuda_augment(&bad, d_smp, 1, d_src, 1, d_dst, 0, s) == -1 &&
          strstr(sf_cuda_last_error(), "augment.cu:") != NULL;
    ok &= sf_cuda_augment(&plan, d_smp, 1, NULL, 1, d_dst, 0, s) == -1;
    ok &= sf_cuda_augment(&plan, d_smp, 0, d_src, 1, d_dst, 0, s) == 0;
    CU(cudaStreamSynchronize(s));
    char name[300];
    snprintf(name, sizeof name, "%s (last: \"%s\")", k_errors_name, sf_cuda_last_error());
    pass_or_fail(name, ok, "a bad argument was accepted or not named");
    CU(cudaFree(d_dst));
    CU(cudaFree(d_src));
    CU(cudaFree(d_smp));
}

/* Every case, in the order they run. */
static std::vector<aug_case> aug_cases()
{
    std::vector<aug_case> t;
    static const char *W1 =
        R"([{"op":"to_dtype","dtype":"float32","scale":1.0},)"
        R"({"op":"random_crop","size":[128,128]},{"op":"resize","size":[256,256]},)"
        R"({"op":"random_rotation","degrees":[-45,45]},)"
        R"({"op":"gaussian_blur","kernel_size":7,"sigma":[0.1,2.0]},)"
        R"({"op":"normalize","mean":[0],"std":[1]}])";
    /* Single ops on odd shapes. */
    t.push_back(pipeline("identity", "[]", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("to_dtype", R"([{"op":"to_dtype","scale":0.00392156862}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("random_crop", R"([{"op":"random_crop","size":[17,29]}])", 33, 47, 3, 4, 1e-5));
    t.push_back(pipeline("resize_up", R"([{"op":"resize","size":[50,71]}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("resize_down_half", R"([{"op":"resize","size":[16,24]}])", 32, 48, 3, 3, 1e-5));
    t.push_back(pipeline("resize_down_odd", R"([{"op":"resize","size":[13,19]}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("resize_down_no_antialias", R"([{"op":"resize","size":[13,19],"antialias":false}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("resize_down_by_9_antialias", R"([{"op":"resize","size":[5,7]}])", 45, 63, 3, 2, 1e-5));
    t.push_back(pipeline("center_crop", R"([{"op":"center_crop","size":[20,31]}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("center_crop_resize_up_clamps_at_the_crop", R"([{"op":"center_crop","size":[9,12]},{"op":"resize","size":[40,50]}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("random_resized_crop", R"([{"op":"random_resized_crop","size":[24,20]}])", 48, 64, 3, 6, 1e-5, 1e-2, {F32, F32 | BF16}));
    t.push_back(pipeline("random_resized_crop_no_antialias", R"([{"op":"random_resized_crop","size":[24,20],"antialias":false}])", 48, 64, 3, 6, 1e-5));
    t.push_back(pipeline("random_resized_crop_fallback", R"([{"op":"random_resized_crop","size":[16,16],"scale":[0.9,1],"ratio":[3,4]}])", 40, 40, 3, 3, 1e-5));
    t.push_back(pipeline("resize_down_then_rotation_antialias", R"([{"op":"resize","size":[19,23]},{"op":"random_rotation","degrees":[-40,40]}])", 33, 47, 3, 4, 1e-5));
    t.push_back(pipeline("rotation_bilinear", R"([{"op":"random_rotation","degrees":[-45,45]}])", 33, 47, 3, 4, 1e-5, 1e-2, {F32, F32 | BF16}));
    t.push_back(pipeline("rotation_nearest", R"([{"op":"random_rotation","degrees":[-180,180],"interpolation":"nearest"}])", 33, 47, 3, 4, 1e-5));
    t.push_back(pipeline("resize_nearest_ties", R"([{"op":"resize","size":[16,24]},{"op":"random_rotation","degrees":0,"interpolation":"nearest"}])", 32, 48, 3, 3, 1e-5));
    t.push_back(pipeline("hflip_always", R"([{"op":"horizontal_flip","p":1.0}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("hflip_half", R"([{"op":"horizontal_flip"}])", 33, 47, 3, 6, 1e-5));
    t.push_back(pipeline("blur_k7", R"([{"op":"gaussian_blur","kernel_size":7,"sigma":[0.1,2.0]}])", 33, 47, 3, 4, 1e-5, 1e-2, {F32, F32 | BF16}));
    t.push_back(pipeline("blur_k3", R"([{"op":"gaussian_blur","kernel_size":3,"sigma":[0.5,1.5]}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("blur_k1", R"([{"op":"gaussian_blur","kernel_size":1}])", 33, 47, 3, 2, 1e-5));
    t.push_back(pipeline("blur_k31", R"([{"op":"gaussian_blur","kernel_size":31,"sigma":[3,9]}])", 33, 47, 3, 2, 1e-5));
    t.push_back(pipeline("blur_k31_wider_than_image", R"([{"op":"gaussian_blur","kernel_size":31,"sigma":[3,9]}])", 9, 13, 3, 2, 1e-5));
    t.push_back(pipeline("normalize", R"([{"op":"normalize","mean":[120,110,100],"std":[60,50,40]}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("color_convert", R"([{"op":"color_convert","to":"ycbcr"}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("color_convert_scaled", R"([{"op":"to_dtype","scale":0.00392156862},{"op":"color_convert"}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("mask_d0", R"([{"op":"random_mask","ratio":0.2,"dilate":0}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("mask_d1", R"([{"op":"random_mask","ratio":0.05,"dilate":1}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("mask_d5", R"([{"op":"random_mask","ratio":0.01,"dilate":5}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("mask_d32", R"([{"op":"random_mask","ratio":0.0005,"dilate":32}])", 70, 90, 3, 2, 1e-5));
    /* The separable antialias kernel: output tiles cut by the image edge in
     * both directions (67 = 64 + 3 rows, 37 = 32 + 5 columns), with the
     * mask stage after it; a shrink by 5 whose source rows overflow its row
     * buffer, and one by 40 whose taps overflow its tables: both take the
     * per-pixel path inside the same kernel. */
    t.push_back(pipeline("rrc_tiles_cut_by_the_edge", R"([{"op":"random_resized_crop","size":[67,37]},{"op":"horizontal_flip"},)"
                                                      R"({"op":"random_mask","ratio":0.02,"dilate":2}])", 90, 75, 3, 5, 1e-5, 1e-2, {F32, F32 | BF16}));
    t.push_back(pipeline("resize_down_by_5_overflows_the_row_buffer", R"([{"op":"resize","size":[66,40]}])", 330, 41, 3, 2, 1e-5));
    t.push_back(pipeline("resize_down_by_40_overflows_the_tap_tables", R"([{"op":"resize","size":[15,20]}])", 600, 800, 3, 1, 1e-5));
    /* A rotation's tiles wholly inside its input skip the coverage: small
     * angles on an image of partial tiles, with and without a blur halo,
     * bilinear and nearest, and a blur wider than the image (halo folded
     * more than once). */
    t.push_back(pipeline("rotation_small_angle_blur_partial_tiles", R"([{"op":"random_rotation","degrees":[-6,6]},{"op":"gaussian_blur","kernel_size":5}])", 150, 101, 3, 4, 1e-5));
    t.push_back(pipeline("rotation_small_angle_partial_tiles", R"([{"op":"random_rotation","degrees":[-6,6]}])", 150, 101, 3, 4, 1e-5));
    t.push_back(pipeline("rotation_nearest_small_angle_blur", R"([{"op":"random_rotation","degrees":[-6,6],"interpolation":"nearest"},{"op":"gaussian_blur","kernel_size":3}])", 150, 101, 3, 4, 1e-5));
    /* Bilinear blur tiles stage their source footprint in shared memory:
     * taps at the crop's edge (the staged box repeats it), and a shrink
     * whose footprint does not fit (the byte gathers instead). */
    t.push_back(pipeline("center_crop_resize_up_blur_clamps_at_the_crop", R"([{"op":"center_crop","size":[9,12]},{"op":"resize","size":[40,50]},{"op":"gaussian_blur","kernel_size":3}])", 33, 47, 3, 3, 1e-5));
    t.push_back(pipeline("resize_down_no_antialias_blur_footprint_too_big", R"([{"op":"resize","size":[20,24],"antialias":false},{"op":"gaussian_blur","kernel_size":5}])", 200, 240, 3, 2, 1e-5));
    t.push_back(pipeline("rotation_blur_k31_wider_than_image", R"([{"op":"random_rotation","degrees":[-10,10]},{"op":"gaussian_blur","kernel_size":31,"sigma":[3,9]}])", 9, 13, 3, 2, 1e-5));
    /* Channel counts and compositions. */
    t.push_back(pipeline("rotation_bilinear", R"([{"op":"random_rotation","degrees":[-45,45]}])", 33, 47, 1, 3, 1e-5));
    t.push_back(pipeline("rotation_bilinear", R"([{"op":"random_rotation","degrees":[-45,45]}])", 33, 47, 4, 3, 1e-5));
    t.push_back(pipeline("crop_resize_blur_normalize", R"([{"op":"random_crop","size":[20,30]},{"op":"resize","size":[37,41]},{"op":"gaussian_blur","kernel_size":5},{"op":"normalize","mean":[0.5],"std":[0.25]}])", 33, 47, 1, 3, 1e-5, 0, {F32, F32_MISALIGNED}));
    t.push_back(pipeline("crop_resize_blur_normalize", R"([{"op":"random_crop","size":[20,30]},{"op":"resize","size":[37,41]},{"op":"gaussian_blur","kernel_size":5},{"op":"normalize","mean":[1,2,3,4],"std":[5,6,7,8]}])", 33, 47, 4, 3, 1e-5));
    t.push_back(pipeline("normalize_c1", R"([{"op":"normalize","mean":[100],"std":[30]}])", 33, 47, 1, 2, 1e-5));
    t.push_back(pipeline("blur_mask_c4", R"([{"op":"gaussian_blur","kernel_size":9,"sigma":[1,3]},{"op":"random_mask","ratio":0.03,"dilate":2}])", 33, 47, 4, 3, 1e-5));
    t.push_back(pipeline("everything", R"([{"op":"to_dtype","scale":0.00392156862},{"op":"random_crop","size":[40,50]},)"
                                       R"({"op":"resize","size":[45,61]},{"op":"random_rotation","degrees":[-30,30]},)"
                                       R"({"op":"horizontal_flip"},{"op":"gaussian_blur","kernel_size":5,"sigma":[0.3,1.2]},)"
                                       R"({"op":"normalize","mean":[0.485,0.456,0.406],"std":[0.229,0.224,0.225]},)"
                                       R"({"op":"color_convert"},{"op":"random_mask","ratio":0.02,"dilate":3}])", 48, 64, 3, 5, 1e-5, 1e-2, {F32, F32 | BF16, F32_MISALIGNED}));
    t.push_back(pipeline("everything_nearest", R"([{"op":"random_crop","size":[40,50]},{"op":"resize","size":[45,61]},)"
                                       R"({"op":"random_rotation","degrees":[-30,30],"interpolation":"nearest"},)"
                                       R"({"op":"horizontal_flip"},{"op":"gaussian_blur","kernel_size":7},)"
                                       R"({"op":"random_mask","ratio":0.02,"dilate":1},{"op":"normalize","mean":[128],"std":[64]}])", 48, 64, 3, 5, 1e-5));
    t.push_back(pipeline("blur_mask_c2_aligned", R"([{"op":"random_rotation","degrees":[-20,20]},{"op":"gaussian_blur","kernel_size":11,"sigma":[1,4]},{"op":"random_mask","ratio":0.01,"dilate":4}])", 64, 64, 2, 3, 1e-5));
    t.push_back(pipeline("resize_blur_c1_aligned", R"([{"op":"resize","size":[40,64]},{"op":"gaussian_blur","kernel_size":3}])", 33, 47, 1, 3, 1e-5));
    t.push_back(pipeline("W1", W1, 256, 256, 3, 32, 1e-5, 1e-2, {F32, F32 | BF16}));
    t.push_back(pipeline("imagenet_like", R"([{"op":"random_resized_crop","size":[56,56]},{"op":"horizontal_flip"},)"
                                          R"({"op":"to_dtype","scale":0.00392156862},)"
                                          R"({"op":"normalize","mean":[0.485,0.456,0.406],"std":[0.229,0.224,0.225]}])", 75, 100, 3, 8, 1e-5));
    t.push_back(pipeline("rrc_rotation_blur", R"([{"op":"random_resized_crop","size":[40,36]},{"op":"random_rotation","degrees":[-30,30]},)"
                                              R"({"op":"gaussian_blur","kernel_size":5}])", 60, 70, 3, 4, 1e-5));
    /* The second pass and the batch-level mixing: colour jitter on either value
     * scale, erasing with constant or noise values, mixup and cutmix after them. */
    t.push_back(pipeline("color_jitter_0_255", R"([{"op":"color_jitter","brightness":0.4,"contrast":0.4,"saturation":0.4,"hue":0.1}])", 33, 47, 3, 8, 1e-5, 1e-2, {F32 | BF16}));
    t.push_back(pipeline("color_jitter_0_1_after_crop", R"([{"op":"random_resized_crop","size":[40,36]},{"op":"to_dtype","scale":0.00392156862},)"
                                                        R"({"op":"color_jitter","brightness":0.8,"contrast":[0.2,1.8],"saturation":0.9,"hue":0.5},)"
                                                        R"({"op":"normalize","mean":[0.485,0.456,0.406],"std":[0.229,0.224,0.225]}])", 60, 70, 3, 8, 1e-5, 1e-2, {F32 | BF16, F32_MISALIGNED}));
    t.push_back(pipeline("color_jitter_c1_contrast_only", R"([{"op":"color_jitter","contrast":[0.1,3]}])", 33, 47, 1, 4, 1e-5, 1e-2, {F32 | BF16}));
    t.push_back(pipeline("random_erasing_value", R"([{"op":"to_dtype","scale":0.00392156862},{"op":"random_erasing","p":1,"value":[0.1,0.2,0.3]}])", 33, 47, 3, 6, 1e-5, 1e-2, {F32 | BF16}));
    t.push_back(pipeline("random_erasing_random_after_normalize", R"([{"op":"normalize","mean":[128],"std":[64]},{"op":"random_erasing","p":0.7,"value":"random"}])", 33, 47, 3, 6, 1e-5, 1e-2, {F32 | BF16}));
    t.push_back(pipeline("mixup", R"([{"op":"random_crop","size":[30,40]},{"op":"mixup","alpha":0.4}])", 33, 47, 3, 7, 1e-5, 1e-2, {F32 | BF16}));
    t.push_back(pipeline("cutmix", R"([{"op":"random_crop","size":[30,40]},{"op":"cutmix"}])", 33, 47, 3, 7, 1e-5, 1e-2, {F32 | BF16}));
    t.push_back(pipeline("imagenet_recipe", R"([{"op":"random_resized_crop","size":[56,56]},{"op":"horizontal_flip"},)"
                                            R"({"op":"to_dtype","scale":0.00392156862},{"op":"color_jitter","brightness":0.4,"contrast":0.4,"saturation":0.4},)"
                                            R"({"op":"normalize","mean":[0.485,0.456,0.406],"std":[0.229,0.224,0.225]},)"
                                            R"({"op":"random_erasing","p":0.25},{"op":"mixup","alpha":0.2},{"op":"cutmix","alpha":1}])", 75, 100, 3, 16, 1e-5, 1e-2, {F32 | BF16}));
    /* Ragged sources: every geometry mode, with and without a blur tile. */
    t.push_back(ragged("rrc_antialias", R"([{"op":"random_resized_crop","size":[32,40]},{"op":"horizontal_flip"}])",
                       9, 120, 3, 7, 1e-5));
    t.push_back(ragged("resize_bilinear_rotation_blur", R"([{"op":"resize","size":[33,47],"antialias":false},)"
                       R"({"op":"random_rotation","degrees":[-45,45]},{"op":"gaussian_blur","kernel_size":7}])",
                       5, 90, 3, 6, 1e-5));
    t.push_back(ragged("rotation_nearest_then_center_crop", R"([{"op":"random_rotation","degrees":[-90,90],"interpolation":"nearest"},)"
                       R"({"op":"center_crop","size":[30,30]},{"op":"random_mask","ratio":0.02,"dilate":1}])",
                       20, 70, 1, 5, 1e-5));
    t.push_back(ragged("resize_antialias_rotation_c4", R"([{"op":"resize","size":[24,28]},{"op":"random_rotation","degrees":[-20,20]}])",
                       30, 100, 4, 5, 1e-5));
    t.push_back(ragged("imagenet_like_224", R"([{"op":"random_resized_crop","size":[224,224]},{"op":"horizontal_flip"},)"
                       R"({"op":"normalize","mean":[124,116,104],"std":[58,57,57]}])", 300, 520, 3, 16, 1e-5));
    /* The ImageNet recipe as the service runs it for a bf16 net: odd-sized
     * sources, bf16 output. */
    t.push_back(ragged("imagenet_like_224_odd_sources", R"([{"op":"random_resized_crop","size":[224,224]},{"op":"horizontal_flip"},)"
                       R"({"op":"to_dtype","scale":0.00392156862},)"
                       R"({"op":"normalize","mean":[0.485,0.456,0.406],"std":[0.229,0.224,0.225]}])", 301, 517, 3, 8,
                       1e-5, 1e-2, {BF16}));
    return t;
}

/* The run's seed (--seed) and the -k filter, from main(). */
static uint64_t g_run_seed;
static const char *g_key = NULL;

static int selected(const std::string &name) { return !g_key || name.find(g_key) != std::string::npos; }

/* The selected cases on the harness's stream s, then the launcher's refusals. */
static void run_cases(cudaStream_t s)
{
    printf("test_augment: seed 0x%llx (--seed 0x%llx replays it)\n", (unsigned long long)g_run_seed,
           (unsigned long long)g_run_seed);
    for (const aug_case &k : aug_cases()) {
        const std::string name = case_name(k);
        if (!selected(name))
            continue;
        g_rng = case_seed(g_run_seed, name);
        for (const int outs : k.runs)
            run_case(k, name.c_str(), outs, s);
    }
    if (selected(k_errors_name))
        check_errors(s);
}

static int usage(const char *why)
{
    fprintf(stderr, "test_augment: %s\nusage: test_augment [--seed 0x...] [-k SUBSTRING] [-l]\n", why);
    return 2;
}

int main(int argc, char **argv)
{
    const char *seed = NULL;
    int list = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-l"))
            list = 1;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = argv[++i];
        else if (!strcmp(argv[i], "-k") && i + 1 < argc)
            g_key = argv[++i];
        else
            return usage("unknown option, or one without its value");
    }
    g_run_seed = seed ? strtoull(seed, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    int cases = 0, checks = 0;
    for (const aug_case &k : aug_cases()) {
        const std::string name = case_name(k);
        if (!selected(name))
            continue;
        cases++;
        checks += case_checks(k);
        if (list)
            printf("case %s: %d check%s\n", name.c_str(), case_checks(k), case_checks(k) == 1 ? "" : "s");
    }
    if (selected(k_errors_name)) {
        cases++;
        checks++;
        if (list)
            printf("case %s: 1 check\n", k_errors_name);
    }
    if (!cases)
        return usage("no case matches the filter");
    if (list) {
        printf("test_augment: %d cases, %d checks\n", cases, checks);
        return 0;
    }
    return run_op_test("test_augment", run_cases);
}
