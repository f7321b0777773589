/* bench/layers_bench.cu — throughput of the CUDA op families at ResNet-18's
 * batch-256 shapes, apart from the tests (tests/gpu/ops/<family>.cu check
 * the same launchers against the reference):
 *  - ResNet-18's convolutions in every direction, bf16 NHWC vs tf32 NHWC vs
 *    tf32 NCHW, with plans chosen as the backend does: time, engine, TFLOP/s;
 *  - BN forward+backward (fp32, both layouts) and maxpool k3 s2 p1 against a
 *    device-to-device copy timed in the same run (achieved bandwidth);
 *  - bf16 NHWC: BN forward/backward at ResNet-18's five BN shapes, the residual
 *    add, the stem maxpool (NHWC and NCHW);
 *  - cuDNN's fused attention (gpu/cuda/sdpa.h) forward and backward at
 *    vit_b_16's and vit_b_32's batch-256 shapes: time, engine, TFLOP/s;
 *  - bf16 NHWC at convnext_tiny's batch-256 shapes (the four stages): the
 *    elementwise passes of its block (LayerNorm2d, erf GELU on the 4x MLP
 *    hidden map, layer scale, stochastic depth), forward and backward,
 *    against a device-to-device copy timed in the same run.
 * Each timed kernel runs as a captured CUDA graph; a BN graph that does not
 * replay bit-equal to its eager run is reported as a failure (the test of that
 * is tests/gpu/ops/batchnorm.cu).
 *
 * Build: make bench-bins (build/bench/layers_bench). Run: build/bench/layers_bench
 * (everything) or build/bench/layers_bench convnext (the ConvNeXt section alone).
 * Prints "throughput: ..." and "perf ..." lines; exits 1 when a kernel fails,
 * 0 with "SKIPPED: no CUDA device" without a GPU.
 */
extern "C" {
#include "gpu/rng.h"
}

#include <string.h>
#include <algorithm>
#include <vector>

#include <cuda_bf16.h>

#include "gpu/cuda/activation.h"
#include "gpu/cuda/batchnorm.h"
#include "gpu/cuda/conv.h"
#include "gpu/cuda/dropout.h"
#include "gpu/cuda/mul.h"
#include "gpu/cuda/norm.h"
#include "gpu/cuda/pointwise.h"
#include "gpu/cuda/pool.h"
#include "gpu/cuda/program.h"
#include "gpu/cuda/sdpa.h"

/* A kernel that fails, or a captured graph that does not replay as its eager
 * run, is a FAIL line and makes the program exit 1; the timings go on. */
static int g_fail = 0;
static void fail(const char *what, const char *why)
{
    g_fail++;
    printf("FAIL %s: %s\n", what, why);
}
static void pass_or_fail(const char *what, int ok, const char *why)
{
    if (ok)
        printf("ok %s\n", what);
    else
        fail(what, why);
}

static const char *lname(sf_layout l) { return l == SF_LAYOUT_NHWC ? "nhwc" : "nchw"; }

/* ---- ResNet-18's convolutions ------------------------------------------------
 * ResNet-18's convolutions at batch 256 with their true spatial sizes (224x224
 * input: stem 224 -> 112, layer1 56, layer2 28, layer3 14, layer4 7), each
 * direction, in bf16 NHWC (KRSC), tf32 NHWC and tf32 NCHW (KCRS), with plans
 * chosen as the backend does (8 candidates timed, as pipeline.cudnn_tune_configs'
 * default, 512 MiB workspace limit). Prints time, engine and TFLOP/s. */

__global__ void k_fill_bf16(uint16_t *p, size_t len, uint64_t seed)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len)
        p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(sf_u01(sf_hash4(seed, i, 0xbf16, 0)) * 2.f - 1.f));
}

struct rn_conv {
    const char *name;
    int c, h, oc, k, stride, pad;
    int count; /* convolutions of this shape in ResNet-18 */
};

static const rn_conv g_rn18[] = {
    {"conv1 7x7/2", 3, 224, 64, 7, 2, 3, 1},
    {"layer1 3x3", 64, 56, 64, 3, 1, 1, 4},
    {"layer2.0 3x3/2", 64, 56, 128, 3, 2, 1, 1},
    {"layer2.0 down 1x1/2", 64, 56, 128, 1, 2, 0, 1},
    {"layer2 3x3", 128, 28, 128, 3, 1, 1, 3},
    {"layer3.0 3x3/2", 128, 28, 256, 3, 2, 1, 1},
    {"layer3.0 down 1x1/2", 128, 28, 256, 1, 2, 0, 1},
    {"layer3 3x3", 256, 14, 256, 3, 1, 1, 3},
    {"layer4.0 3x3/2", 256, 14, 512, 3, 2, 1, 1},
    {"layer4.0 down 1x1/2", 256, 14, 512, 1, 2, 0, 1},
    {"layer4 3x3", 512, 7, 512, 3, 1, 1, 3},
};

static void perf_resnet18(cudnnHandle_t dnn, cudaStream_t s, int batch)
{
    const int nshape = (int)(sizeof g_rn18 / sizeof g_rn18[0]);
    size_t mx = 0, my = 0, mw = 0;
    for (int i = 0; i < nshape; i++) {
        const rn_conv &r = g_rn18[i];
        const size_t oh = (size_t)(r.h + 2 * r.pad - r.k) / r.stride + 1;
        mx = std::max(mx, (size_t)batch * r.c * r.h * r.h);
        my = std::max(my, (size_t)batch * r.oc * oh * oh);
        mw = std::max(mw, (size_t)r.oc * r.c * r.k * r.k);
    }
    /* Buffers sized for fp32; bf16 uses the first half of each. */
    float *x = dalloc<float>(mx), *dx = dalloc<float>(mx), *y = dalloc<float>(my), *dy = dalloc<float>(my),
          *w = dalloc<float>(mw), *dw = dalloc<float>(mw);
    const size_t ws_bytes = (size_t)512 << 20;
    void *ws = dalloc<char>(ws_bytes);
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    struct cfg_t {
        const char *name;
        sf_dtype dt;
        sf_layout lay;
        int tf32;
    } cfgs[3] = {{"bf16 nhwc", SF_DT_BF16, SF_LAYOUT_NHWC, 0},
                 {"tf32 nhwc", SF_DT_F32, SF_LAYOUT_NHWC, 1},
                 {"tf32 nchw", SF_DT_F32, SF_LAYOUT_NCHW, 1}};
    static const char *dn[3] = {"fwd", "dgrad", "wgrad"};
    double total_ms[3] = {0, 0, 0};
    int total_ok[3] = {1, 1, 1};
    printf("perf: ResNet-18 convolutions, batch %d, 224x224; plans tuned over 8 candidates, ws <= 512 MiB\n", batch);
    const uint64_t t0 = now_ns();
    for (int ci = 0; ci < 3; ci++) {
        /* fresh random data per configuration (the data type differs) */
        const cfg_t &cf = cfgs[ci];
        if (cf.dt == SF_DT_BF16) {
            uint16_t *bufs[6] = {(uint16_t *)x, (uint16_t *)dx, (uint16_t *)y, (uint16_t *)dy, (uint16_t *)w,
                                 (uint16_t *)dw};
            const size_t lens[6] = {mx, mx, my, my, mw, mw};
            for (int k = 0; k < 6; k++) {
                k_fill_bf16<<<(unsigned)((lens[k] + 255) / 256), 256, 0, s>>>(bufs[k], lens[k], 100 + k);
                CU(cudaGetLastError());
            }
        } else {
            float *bufs[6] = {x, dx, y, dy, w, dw};
            const size_t lens[6] = {mx, mx, my, my, mw, mw};
            for (int k = 0; k < 6; k++)
                if (sf_cuda_fill_random(bufs[k], lens[k], 100 + k, 1.f, s)) {
                    printf("info perf: fill: %s\n", sf_cuda_last_error());
                    return;
                }
        }
        CU(cudaStreamSynchronize(s));
        for (int i = 0; i < nshape; i++) {
            const rn_conv &r = g_rn18[i];
            const int oh = (r.h + 2 * r.pad - r.k) / r.stride + 1;
            const double flop = 2.0 * batch * oh * oh * (double)r.oc * r.c * r.k * r.k;
            sf_conv_desc d;
            memset(&d, 0, sizeof d);
            d.n = batch; d.c = r.c; d.h = r.h; d.w = r.h; d.oc = r.oc; d.k = r.k; d.stride = r.stride; d.pad = r.pad;
            d.layout = cf.lay;
            d.tf32 = cf.tf32;
            d.dt = cf.dt;
            d.align_x = d.align_w = d.align_y = 16;
            sf_conv_ptrs pf = {x, w, y, ws, NULL}, pd = {dx, w, dy, ws, NULL}, pw = {x, dw, dy, ws, NULL};
            const sf_conv_ptrs *ptrs[3] = {&pf, &pd, &pw};
            for (int dir = 0; dir < 3; dir++) {
                sf_conv_plan p;
                sf_conv_vpack *vp = NULL;
                if (sf_conv_plan_build(dnn, &d, (sf_conv_dir)dir, ws_bytes, 8, ptrs[dir], &p)) {
                    printf("info perf %-20s %s %s: no plan (%s)\n", r.name, dn[dir], cf.name, sf_cuda_last_error());
                    sf_cuda_clear_error();
                    total_ok[ci] = 0;
                    continue;
                }
                if (sf_conv_vpack_make(ptrs[dir], &vp)) {
                    printf("info perf %-20s %s %s: %s\n", r.name, dn[dir], cf.name, sf_cuda_last_error());
                    sf_cuda_clear_error();
                    sf_conv_plan_destroy(&p);
                    total_ok[ci] = 0;
                    continue;
                }
                /* one warm-up, then enough runs for ~20 ms (at least 3, at most 50) */
                int rc = sf_conv_run(dnn, &p, vp);
                CU(cudaStreamSynchronize(s));
                const int reps = p.ms > 0.f ? std::min(50, std::max(3, (int)(20.f / p.ms))) : 5;
                CU(cudaEventRecord(e0, s));
                for (int k = 0; k < reps && !rc; k++)
                    rc = sf_conv_run(dnn, &p, vp);
                CU(cudaEventRecord(e1, s));
                CU(cudaEventSynchronize(e1));
                float ms = 0.f;
                CU(cudaEventElapsedTime(&ms, e0, e1));
                ms /= (float)reps;
                if (rc) {
                    printf("info perf %-20s %s %s: run failed (%s)\n", r.name, dn[dir], cf.name, sf_cuda_last_error());
                    sf_cuda_clear_error();
                    total_ok[ci] = 0;
                } else {
                    printf("perf %-20s n%d %3d->%-3d %3dx%-3d %-5s %s: %8.3f ms %7.1f TFLOP/s  engine %lld%s (%s, of %d)\n",
                           r.name, batch, r.c, r.oc, r.h, r.h, dn[dir], cf.name, ms, flop / (ms * 1e-3) / 1e12,
                           (long long)p.engine, p.tensor_core ? " tc" : "", sf_conv_prec_name(p.dt, p.tensor_core),
                           p.tried);
                    /* the network never needs the stem's input gradient */
                    if (!(i == 0 && dir == SF_CONV_BWD_DATA))
                        total_ms[ci] += ms * r.count;
                }
                fflush(stdout);
                sf_conv_vpack_destroy(vp);
                sf_conv_plan_destroy(&p);
            }
        }
    }
    for (int ci = 0; ci < 3; ci++)
        printf("perf ResNet-18 conv total (fwd + dgrad + wgrad, layer counts, no stem dgrad), batch %d, %s: %.2f ms%s\n",
               batch, cfgs[ci].name, total_ms[ci], total_ok[ci] ? "" : " (incomplete: some plans missing)");
    printf("perf: %.1f s including plan tuning\n", (double)(now_ns() - t0) * 1e-9);
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    cudaFree(x); cudaFree(dx); cudaFree(y); cudaFree(dy); cudaFree(w); cudaFree(dw); cudaFree(ws);
}

/* ---- capture and throughput at ResNet-18's batch-256 shapes -------------- */

static float time_ms(cudaStream_t s, cudaGraphExec_t ge, int reps)
{
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    CU(cudaGraphLaunch(ge, s)); /* warm-up */
    CU(cudaEventRecord(a, s));
    for (int r = 0; r < reps; r++)
        CU(cudaGraphLaunch(ge, s));
    CU(cudaEventRecord(b, s));
    CU(cudaEventSynchronize(b));
    float ms = 0.f;
    CU(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / reps;
}

typedef int (*enqueue_fn)(void *ctx, cudaStream_t s);

/* Captures fn into a graph (the kernels must be capturable: no sync, no alloc). */
static int capture(cudaStream_t s, enqueue_fn fn, void *ctx, cudaGraphExec_t *ge)
{
    cudaGraph_t g;
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    int rc = fn(ctx, s);
    cudaError_t e = cudaStreamEndCapture(s, &g);
    if (rc || e != cudaSuccess)
        return -1;
    e = cudaGraphInstantiate(ge, g, 0);
    cudaGraphDestroy(g);
    return e == cudaSuccess ? 0 : -1;
}

struct rn_ctx {
    int n, c, h, w;
    sf_layout L;
    float *x, *y, *dy, *dx, *g, *b, *rm, *rv, *sm, *si, *dg, *db, *copy_dst;
    int32_t *am;
    void *scr;
    int pk, ps, pp; /* maxpool */
    size_t copy_bytes;
};

static int enq_bn(void *v, cudaStream_t s)
{
    rn_ctx *c = (rn_ctx *)v;
    return sf_cuda_bn_fwd_train(c->x, c->n, c->c, c->h, c->w, c->L, c->g, c->b, 1e-5f, 0.1f, c->rm, c->rv, c->sm,
                                c->si, c->y, 0, c->scr, s) ||
           sf_cuda_bn_bwd(c->x, c->n, c->c, c->h, c->w, c->L, c->g, c->sm, c->si, c->dy, NULL, c->dx, c->dg, c->db,
                          c->scr, s);
}
static int enq_mp_fwd(void *v, cudaStream_t s)
{
    rn_ctx *c = (rn_ctx *)v;
    return sf_cuda_maxpool_fwd(c->x, c->n, c->c, c->h, c->w, c->pk, c->ps, c->pp, c->L, c->y, c->am, s);
}
static int enq_mp_bwd(void *v, cudaStream_t s)
{
    rn_ctx *c = (rn_ctx *)v;
    return sf_cuda_maxpool_bwd(c->dy, c->am, c->n, c->c, c->h, c->w, c->pk, c->ps, c->pp, c->L, c->dx, s);
}
static int enq_copy(void *v, cudaStream_t s)
{
    rn_ctx *c = (rn_ctx *)v;
    return cudaMemcpyAsync(c->copy_dst, c->x, c->copy_bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess ? 0 : -1;
}

/* BN at 56x56x64 and maxpool k3 s2 p1 of 112x112x64, batch 256, both layouts:
 * a captured graph of each must replay bit-equal to the eager run, and the
 * achieved bandwidth (bytes each kernel must move, over time) is printed next
 * to a device-to-device copy of the largest tensor. */
static double bench_resnet(cudaStream_t s)
{
    const int N = 256, C = 64;
    const size_t big = (size_t)N * C * 112 * 112, bn_len = (size_t)N * C * 56 * 56;
    rn_ctx c;
    memset(&c, 0, sizeof c);
    c.x = dalloc<float>(big);
    c.dx = dalloc<float>(big);
    c.y = dalloc<float>(bn_len);
    c.dy = dalloc<float>(bn_len);
    c.am = dalloc<int32_t>(bn_len);
    c.g = dalloc<float>(C); c.b = dalloc<float>(C); c.rm = dalloc<float>(C); c.rv = dalloc<float>(C);
    c.sm = dalloc<float>(C); c.si = dalloc<float>(C); c.dg = dalloc<float>(C); c.db = dalloc<float>(C);
    c.copy_dst = c.dx;
    c.copy_bytes = big * 4;
    size_t scr_b = sf_cuda_bn_scratch_bytes(N, C, 56, 56, SF_LAYOUT_NCHW);
    size_t scr_b2 = sf_cuda_bn_scratch_bytes(N, C, 56, 56, SF_LAYOUT_NHWC);
    c.scr = dalloc<char>(scr_b > scr_b2 ? scr_b : scr_b2);
    if (sf_cuda_fill_random(c.x, big, 11, 1.f, s) || sf_cuda_fill_random(c.dy, bn_len, 12, 1.f, s) ||
        sf_cuda_fill(c.g, C, 1.f, s) || sf_cuda_fill(c.b, C, 0.f, s) || sf_cuda_fill(c.rm, C, 0.f, s) ||
        sf_cuda_fill(c.rv, C, 1.f, s)) {
        fail("bench setup", sf_cuda_last_error());
        return 0;
    }
    CU(cudaStreamSynchronize(s));

    cudaGraphExec_t gcopy;
    if (capture(s, enq_copy, &c, &gcopy)) {
        fail("bench copy capture", "capture failed");
        return 0;
    }
    const float copy_ms = time_ms(s, gcopy, 10);
    const double copy_gbs = 2.0 * c.copy_bytes / (copy_ms * 1e6);
    printf("throughput: device-to-device copy of %.0f MB: %.3f ms, %.0f GB/s (read + write)\n", c.copy_bytes / 1e6,
           copy_ms, copy_gbs);
    cudaGraphExecDestroy(gcopy);

    for (int lay = 0; lay < 2; lay++) {
        c.L = (sf_layout)lay;
        char nm[160];
        /* BN forward + backward at 56x56x64 */
        c.n = N; c.c = C; c.h = 56; c.w = 56;
        if (enq_bn(&c, s)) {
            fail("bench bn eager", sf_cuda_last_error());
            continue;
        }
        CU(cudaStreamSynchronize(s));
        std::vector<float> dx0 = down(c.dx, bn_len), dg0 = down(c.dg, C);
        cudaGraphExec_t gbn;
        snprintf(nm, sizeof nm, "bn fwd+bwd n256 c64 56x56 %s: captured graph replays bit-equal", lname(c.L));
        if (capture(s, enq_bn, &c, &gbn)) {
            fail(nm, "capture failed");
            continue;
        }
        poison(c.dx, bn_len * 4);
        CU(cudaGraphLaunch(gbn, s));
        CU(cudaStreamSynchronize(s));
        std::vector<float> dx1 = down(c.dx, bn_len), dg1 = down(c.dg, C);
        pass_or_fail(nm, memcmp(dx0.data(), dx1.data(), bn_len * 4) == 0 && memcmp(dg0.data(), dg1.data(), C * 4) == 0,
                     "replay differs from the eager run (non-deterministic)");
        const float bn_ms = time_ms(s, gbn, 20);
        /* fwd: x twice (stats, normalise) + y; bwd: x, dy twice (sums, dx) + dx */
        const double bn_bytes = 8.0 * bn_len * 4;
        printf("throughput: bn fwd+bwd n256 c64 56x56 %s: %.3f ms, %.0f GB/s (%.0f%% of copy; 8 tensor passes)\n",
               lname(c.L), bn_ms, bn_bytes / (bn_ms * 1e6), 100.0 * bn_bytes / (bn_ms * 1e6) / copy_gbs);
        cudaGraphExecDestroy(gbn);

        /* maxpool k3 s2 p1: 112x112 -> 56x56 */
        c.h = 112; c.w = 112; c.pk = 3; c.ps = 2; c.pp = 1;
        cudaGraphExec_t gf, gb;
        if (capture(s, enq_mp_fwd, &c, &gf) || capture(s, enq_mp_bwd, &c, &gb)) {
            fail("bench maxpool capture", sf_cuda_last_error());
            continue;
        }
        const float f_ms = time_ms(s, gf, 20), b_ms = time_ms(s, gb, 20);
        const double f_bytes = (double)big * 4 + 2.0 * bn_len * 4, b_bytes = 2.0 * bn_len * 4 + (double)big * 4;
        printf("throughput: maxpool fwd n256 c64 112x112 k3s2p1 %s: %.3f ms, %.0f GB/s (%.0f%% of copy)\n", lname(c.L),
               f_ms, f_bytes / (f_ms * 1e6), 100.0 * f_bytes / (f_ms * 1e6) / copy_gbs);
        printf("throughput: maxpool bwd n256 c64 112x112 k3s2p1 %s: %.3f ms, %.0f GB/s (%.0f%% of copy)\n", lname(c.L),
               b_ms, b_bytes / (b_ms * 1e6), 100.0 * b_bytes / (b_ms * 1e6) / copy_gbs);
        cudaGraphExecDestroy(gf);
        cudaGraphExecDestroy(gb);
    }
    cudaFree(c.x); cudaFree(c.dx); cudaFree(c.y); cudaFree(c.dy); cudaFree(c.am); cudaFree(c.g); cudaFree(c.b);
    cudaFree(c.rm); cudaFree(c.rv); cudaFree(c.sm); cudaFree(c.si); cudaFree(c.dg); cudaFree(c.db); cudaFree(c.scr);
    return copy_gbs;
}

/* ---- bf16 NHWC throughput at ResNet-18's batch-256 shapes ------------------ */

struct bf_ctx {
    int n, c, h, w, relu;
    sf_layout L;
    void *x, *y, *dy, *dx;
    float *g, *b, *rm, *rv, *sm, *si, *dg, *db;
    int32_t *am;
    void *scr;
};

static int enq_bf_bn_fwd(void *v, cudaStream_t s)
{
    bf_ctx *c = (bf_ctx *)v;
    return sf_cuda_bn_fwd_train_dt(SF_DT_BF16, c->x, c->n, c->c, c->h, c->w, c->L, c->g, c->b, 1e-5f, 0.1f, c->rm,
                                   c->rv, c->sm, c->si, NULL, c->y, c->relu, c->scr, s);
}
static int enq_bf_bn_bwd(void *v, cudaStream_t s)
{
    bf_ctx *c = (bf_ctx *)v;
    return sf_cuda_bn_bwd_dt(SF_DT_BF16, c->x, c->n, c->c, c->h, c->w, c->L, c->g, c->b, c->sm, c->si, c->dy,
                             c->relu ? c->y : NULL, c->dx, c->dg, c->db, c->scr, s);
}
static int enq_bf_bn(void *v, cudaStream_t s) { return enq_bf_bn_fwd(v, s) || enq_bf_bn_bwd(v, s); }
static int enq_bf_mp_fwd(void *v, cudaStream_t s)
{
    bf_ctx *c = (bf_ctx *)v;
    return sf_cuda_maxpool_fwd_dt(SF_DT_BF16, c->x, c->n, c->c, c->h, c->w, 3, 2, 1, 0, c->L, c->y, c->am, NULL, s);
}
static int enq_bf_mp_bwd(void *v, cudaStream_t s)
{
    bf_ctx *c = (bf_ctx *)v;
    return sf_cuda_maxpool_bwd_dt(SF_DT_BF16, c->dy, c->am, c->n, c->c, c->h, c->w, 3, 2, 1, 0, c->L, c->dx, s);
}
static int enq_bf_add(void *v, cudaStream_t s)
{
    bf_ctx *c = (bf_ctx *)v;
    return sf_cuda_add_dt(SF_DT_BF16, c->x, c->dy, c->y, (size_t)c->n * c->c * c->h * c->w, 1, s);
}

/* Times a captured enqueue; NAN when it cannot be captured (reported). */
static float bf_time(cudaStream_t s, enqueue_fn fn, void *ctx, const char *what, int reps)
{
    cudaGraphExec_t ge;
    if (capture(s, fn, ctx, &ge)) {
        fail(what, "capture failed");
        return NAN;
    }
    const float ms = time_ms(s, ge, reps);
    cudaGraphExecDestroy(ge);
    return ms;
}

static void bf_line(const char *what, float ms, double bytes, double copy_gbs, const char *note)
{
    if (!(ms > 0))
        return;
    const double gbs = bytes / (ms * 1e6);
    printf("throughput: %s: %.3f ms, %.0f GB/s (%.0f%% of copy%s%s)\n", what, ms, gbs, 100.0 * gbs / copy_gbs,
           note ? "; " : "", note ? note : "");
}

/* bf16, NHWC (the target configuration) at batch 256: BN forward (training,
 * +ReLU and without) and backward at ResNet-18's five BN shapes, maxpool
 * k3 s2 p1 of the stem (NHWC and NCHW), and the residual add (+ReLU) at the
 * BN shapes. A captured BN forward+backward must replay bit-equal to the
 * eager run. Bytes are what each kernel must move (tensor passes x 2 bytes;
 * argmax int32), over the device-to-device copy bandwidth measured above. */
static void bench_bf16(cudaStream_t s, double copy_gbs)
{
    const int N = 256;
    struct {
        int c, hw;
    } shapes[5] = {{64, 112}, {64, 56}, {128, 28}, {256, 14}, {512, 7}};
    const size_t big = (size_t)N * 64 * 112 * 112, pooled = (size_t)N * 64 * 56 * 56;
    bf_ctx c;
    memset(&c, 0, sizeof c);
    c.x = dalloc<char>(big * 2);
    c.y = dalloc<char>(big * 2);
    c.dy = dalloc<char>(big * 2);
    c.dx = dalloc<char>(big * 2);
    c.am = dalloc<int32_t>(pooled);
    c.g = dalloc<float>(512); c.b = dalloc<float>(512); c.rm = dalloc<float>(512); c.rv = dalloc<float>(512);
    c.sm = dalloc<float>(512); c.si = dalloc<float>(512); c.dg = dalloc<float>(512); c.db = dalloc<float>(512);
    size_t scr_b = 0;
    for (int k = 0; k < 5; k++) {
        const size_t b = sf_cuda_bn_scratch_bytes(N, shapes[k].c, shapes[k].hw, shapes[k].hw, SF_LAYOUT_NHWC);
        scr_b = b > scr_b ? b : scr_b;
    }
    c.scr = dalloc<char>(scr_b);
    if (sf_cuda_fill_random_dt(SF_DT_BF16, c.x, big, 21, 2.f, s) ||
        sf_cuda_fill_random_dt(SF_DT_BF16, c.dy, big, 22, 1.f, s) || sf_cuda_fill(c.g, 512, 1.f, s) ||
        sf_cuda_fill(c.b, 512, 0.f, s) || sf_cuda_fill(c.rm, 512, 0.f, s) || sf_cuda_fill(c.rv, 512, 1.f, s)) {
        fail("bench bf16 setup", sf_cuda_last_error());
        return;
    }
    CU(cudaStreamSynchronize(s));
    c.L = SF_LAYOUT_NHWC;
    c.n = N;
    char nm[200];
    for (int k = 0; k < 5; k++) {
        c.c = shapes[k].c;
        c.h = c.w = shapes[k].hw;
        const size_t len = (size_t)N * c.c * c.h * c.w;
        for (int relu = 1; relu >= 0; relu--) {
            c.relu = relu;
            snprintf(nm, sizeof nm, "bn bf16 nhwc n%d c%d %dx%d%s", N, c.c, c.h, c.w, relu ? " +relu" : "");
            /* eager, then a captured replay: bit-equal (deterministic) */
            if (enq_bf_bn(&c, s)) {
                fail(nm, sf_cuda_last_error());
                continue;
            }
            CU(cudaStreamSynchronize(s));
            std::vector<uint16_t> dx0(len), dx1(len);
            std::vector<float> dg0 = down(c.dg, c.c);
            CU(cudaMemcpy(dx0.data(), c.dx, len * 2, cudaMemcpyDeviceToHost));
            cudaGraphExec_t ge;
            char sub[260];
            snprintf(sub, sizeof sub, "%s fwd+bwd: captured graph replays bit-equal", nm);
            if (capture(s, enq_bf_bn, &c, &ge)) {
                fail(sub, "capture failed");
                continue;
            }
            poison(c.dx, len * 2);
            CU(cudaGraphLaunch(ge, s));
            CU(cudaStreamSynchronize(s));
            cudaGraphExecDestroy(ge);
            CU(cudaMemcpy(dx1.data(), c.dx, len * 2, cudaMemcpyDeviceToHost));
            std::vector<float> dg1 = down(c.dg, c.c);
            pass_or_fail(sub, dx0 == dx1 && memcmp(dg0.data(), dg1.data(), c.c * 4) == 0,
                         "replay differs from the eager run (non-deterministic)");
            const float fms = bf_time(s, enq_bf_bn_fwd, &c, nm, 20), bms = bf_time(s, enq_bf_bn_bwd, &c, nm, 20);
            snprintf(sub, sizeof sub, "%s fwd", nm);
            bf_line(sub, fms, 3.0 * len * 2, copy_gbs, "3 passes: x, x, y");
            snprintf(sub, sizeof sub, "%s bwd", nm);
            bf_line(sub, bms, (relu ? 7.0 : 5.0) * len * 2, copy_gbs,
                    relu ? "7 passes: x, dy, y, then x, dy, y, dx" : "5 passes: x, dy, then x, dy, dx");
        }
        snprintf(nm, sizeof nm, "add+relu bf16 n%d c%d %dx%d", N, c.c, c.h, c.w);
        bf_line(nm, bf_time(s, enq_bf_add, &c, nm, 20), 3.0 * len * 2, copy_gbs, "a, b, y");
    }
    /* maxpool k3 s2 p1: 112x112 -> 56x56, c 64 */
    c.c = 64;
    c.h = c.w = 112;
    for (int lay = 1; lay >= 0; lay--) {
        c.L = (sf_layout)lay;
        snprintf(nm, sizeof nm, "maxpool fwd bf16 %s n%d c64 112x112 k3s2p1", lname(c.L), N);
        bf_line(nm, bf_time(s, enq_bf_mp_fwd, &c, nm, 20), 2.0 * big + 2.0 * pooled + 4.0 * pooled, copy_gbs,
                "x, y, argmax");
        snprintf(nm, sizeof nm, "maxpool bwd bf16 %s n%d c64 112x112 k3s2p1", lname(c.L), N);
        bf_line(nm, bf_time(s, enq_bf_mp_bwd, &c, nm, 20), 2.0 * pooled + 4.0 * pooled + 2.0 * big, copy_gbs,
                "dy, argmax, dx");
    }
    cudaFree(c.x); cudaFree(c.y); cudaFree(c.dy); cudaFree(c.dx); cudaFree(c.am); cudaFree(c.g); cudaFree(c.b);
    cudaFree(c.rm); cudaFree(c.rv); cudaFree(c.sm); cudaFree(c.si); cudaFree(c.dg); cudaFree(c.db); cudaFree(c.scr);
}

/* ---- fused attention ---------------------------------------------------------
 * vit_b_16 (t = 197) and vit_b_32 (t = 50) at batch 256: 12 heads of 64. The
 * forward does 4 n h t^2 d flops (two matmuls), the backward 10 n h t^2 d
 * (five: the scores again, dV, dP, dK, dQ). Each direction runs as a captured
 * graph, as the executor runs it. */

struct att_ctx {
    sf_sdpa_plan *p;
    cudnnHandle_t h;
    uint16_t *qkv, *o, *d_o, *dqkv;
    float *stats;
    void *ws;
};
static int enq_att_fwd(void *v, cudaStream_t s)
{
    att_ctx *c = (att_ctx *)v;
    return sf_sdpa_fwd(c->p, c->h, c->qkv, c->o, c->stats, c->ws, s);
}
static int enq_att_bwd(void *v, cudaStream_t s)
{
    att_ctx *c = (att_ctx *)v;
    return sf_sdpa_bwd(c->p, c->h, c->qkv, c->o, c->d_o, c->stats, c->dqkv, c->ws, s);
}

static void bench_attention(cudnnHandle_t dnn, cudaStream_t s)
{
    const int n = 256, heads = 12, d = 64, ts[2] = {197, 50};
    for (int k = 0; k < 2; k++) {
        const int t = ts[k], c = heads * d;
        char nm[160], err[1024], desc[300];
        snprintf(nm, sizeof nm, "attention bf16 n%d t%d heads%d d%d", n, t, heads, d);
        att_ctx a;
        size_t ws = 0;
        if (sf_sdpa_plan_create(&a.p, dnn, n, t, heads, d, &ws, err, sizeof err)) {
            fail(nm, err);
            continue;
        }
        printf("   %s\n", sf_sdpa_plan_describe(a.p, desc, sizeof desc));
        const size_t rows = (size_t)n * t;
        a.h = dnn;
        a.qkv = dalloc<uint16_t>(rows * 3 * c);
        a.dqkv = dalloc<uint16_t>(rows * 3 * c);
        a.o = dalloc<uint16_t>(rows * c);
        a.d_o = dalloc<uint16_t>(rows * c);
        a.stats = dalloc<float>((size_t)n * heads * t);
        a.ws = ws ? (void *)dalloc<char>(ws) : NULL;
        k_fill_bf16<<<(unsigned)((rows * 3 * c + 255) / 256), 256, 0, s>>>(a.qkv, rows * 3 * c, 71);
        k_fill_bf16<<<(unsigned)((rows * c + 255) / 256), 256, 0, s>>>(a.d_o, rows * c, 72);
        CU(cudaStreamSynchronize(s));
        /* the forward first, eagerly: the backward reads its O and statistics */
        if (enq_att_fwd(&a, s)) {
            fail(nm, sf_cuda_last_error());
        } else {
            const double fl = (double)n * heads * t * t * d;
            const float fms = bf_time(s, enq_att_fwd, &a, nm, 20), bms = bf_time(s, enq_att_bwd, &a, nm, 20);
            if (fms > 0 && bms > 0)
                printf("perf %s: fwd %.3f ms (%.0f TFLOP/s), bwd %.3f ms (%.0f TFLOP/s), workspace %.1f MiB\n", nm,
                       fms, 4 * fl / (fms * 1e9), bms, 10 * fl / (bms * 1e9), ws / 1048576.0);
        }
        cudaFree(a.qkv); cudaFree(a.dqkv); cudaFree(a.o); cudaFree(a.d_o); cudaFree(a.stats);
        if (a.ws)
            cudaFree(a.ws);
        sf_sdpa_plan_destroy(a.p);
    }
}

/* ---- bf16 NHWC elementwise passes at convnext_tiny's batch-256 shapes --------
 * Each stage's block: LayerNorm2d over c channels, the erf GELU over the MLP's
 * 4c hidden channels, layer scale and stochastic depth (p 0.1) over c, each
 * direction as a captured graph. A captured LayerNorm backward and layer-scale
 * backward must replay their parameter gradients bit-equal to the eager run
 * (the fixed reduction orders). Bytes are the tensor passes each kernel must
 * make (x 2 bytes), over a device-to-device copy of the largest map. */

struct cx_ctx {
    int n, c, hw;
    void *x, *y, *dy, *dx, *copy_dst;
    float *g, *b, *mean, *rstd, *dg, *db, *cs_scr;
    void *ln_scr;
    uint64_t *seq;
    size_t copy_bytes;
};
static size_t cx_len(const cx_ctx *c) { return (size_t)c->n * c->c * c->hw * c->hw; }
static int enq_cx_ln_fwd(void *v, cudaStream_t s)
{
    cx_ctx *c = (cx_ctx *)v;
    return sf_cuda_layernorm_fwd_dt(SF_DT_BF16, c->x, c->n, c->c, (size_t)c->hw * c->hw, SF_LAYOUT_NHWC, c->g, c->b,
                                    1e-6f, c->y, c->mean, c->rstd, s);
}
static int enq_cx_ln_bwd(void *v, cudaStream_t s)
{
    cx_ctx *c = (cx_ctx *)v;
    return sf_cuda_layernorm_bwd_dt(SF_DT_BF16, c->x, c->dy, c->n, c->c, (size_t)c->hw * c->hw, SF_LAYOUT_NHWC, c->g,
                                    c->mean, c->rstd, c->dx, 0, c->dg, c->db, c->ln_scr, s);
}
static int enq_cx_gelu_fwd(void *v, cudaStream_t s)
{
    cx_ctx *c = (cx_ctx *)v;
    return sf_cuda_act_fwd_dt(SF_DT_BF16, SF_CUDA_ACT_GELU, sf_cuda_act_prm{}, c->x, c->y, cx_len(c), s);
}
static int enq_cx_gelu_bwd(void *v, cudaStream_t s)
{
    cx_ctx *c = (cx_ctx *)v;
    return sf_cuda_act_bwd_dt(SF_DT_BF16, SF_CUDA_ACT_GELU, sf_cuda_act_prm{}, c->x, c->dy, c->dx, cx_len(c), s);
}
static int enq_cx_ls_fwd(void *v, cudaStream_t s)
{
    cx_ctx *c = (cx_ctx *)v;
    return sf_cuda_channel_scale_fwd_dt(SF_DT_BF16, SF_LAYOUT_NHWC, c->x, c->g, NULL, c->y, c->n, c->c,
                                        (size_t)c->hw * c->hw, s);
}
static int enq_cx_ls_bwd(void *v, cudaStream_t s)
{
    cx_ctx *c = (cx_ctx *)v;
    return sf_cuda_channel_scale_bwd_dt(SF_DT_BF16, SF_LAYOUT_NHWC, c->x, c->g, c->dy, c->dx, c->dg, NULL, c->n, c->c,
                                        (size_t)c->hw * c->hw, c->cs_scr, s);
}
static int enq_cx_sd(void *v, cudaStream_t s)
{
    cx_ctx *c = (cx_ctx *)v;
    return sf_cuda_dropout_dt(SF_DT_BF16, SF_LAYOUT_NHWC, c->x, c->y, c->n, c->c, (size_t)c->hw * c->hw, 0.1f, 7,
                              c->seq, 3, SF_DROP_SAMPLE, s);
}
static int enq_cx_copy(void *v, cudaStream_t s)
{
    cx_ctx *c = (cx_ctx *)v;
    return cudaMemcpyAsync(c->copy_dst, c->x, c->copy_bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess ? 0 : -1;
}

/* The parameter gradients dg (and db when nb) of an eager run of fn, then of a
 * captured replay: bit-equal, or a FAIL line. */
static void cx_replay_check(cudaStream_t s, enqueue_fn fn, cx_ctx *c, int nb, const char *what)
{
    if (fn(c, s)) {
        fail(what, sf_cuda_last_error());
        return;
    }
    CU(cudaStreamSynchronize(s));
    const std::vector<float> g0 = down(c->dg, c->c), b0 = nb ? down(c->db, c->c) : std::vector<float>();
    cudaGraphExec_t ge;
    if (capture(s, fn, c, &ge)) {
        fail(what, "capture failed");
        return;
    }
    poison(c->dg, (size_t)c->c * 4);
    CU(cudaGraphLaunch(ge, s));
    CU(cudaStreamSynchronize(s));
    cudaGraphExecDestroy(ge);
    const std::vector<float> g1 = down(c->dg, c->c), b1 = nb ? down(c->db, c->c) : std::vector<float>();
    pass_or_fail(what, g0 == g1 && b0 == b1, "replay differs from the eager run (non-deterministic)");
}

static void bench_convnext(cudaStream_t s)
{
    const int N = 256;
    const struct {
        int c, hw;
    } stages[4] = {{96, 56}, {192, 28}, {384, 14}, {768, 7}};
    const size_t big = (size_t)N * 4 * 96 * 56 * 56; /* the largest map: stage 1's MLP hidden */
    cx_ctx c;
    memset(&c, 0, sizeof c);
    c.x = dalloc<char>(big * 2);
    c.y = dalloc<char>(big * 2);
    c.dy = dalloc<char>(big * 2);
    c.dx = dalloc<char>(big * 2);
    c.g = dalloc<float>(4 * 768); c.b = dalloc<float>(4 * 768); c.dg = dalloc<float>(4 * 768);
    c.db = dalloc<float>(4 * 768);
    c.mean = dalloc<float>((size_t)N * 56 * 56);
    c.rstd = dalloc<float>((size_t)N * 56 * 56);
    c.cs_scr = dalloc<float>(sf_cuda_channel_scale_scratch(768));
    size_t ln_b = 0;
    for (int k = 0; k < 4; k++) {
        const size_t hw = (size_t)stages[k].hw * stages[k].hw, b = sf_cuda_layernorm_scratch_bytes(N, stages[k].c, hw,
                                                                                                     SF_LAYOUT_NHWC);
        ln_b = b > ln_b ? b : ln_b;
    }
    c.ln_scr = dalloc<char>(ln_b);
    c.seq = dalloc<uint64_t>(1);
    CU(cudaMemset(c.seq, 0, sizeof(uint64_t)));
    if (sf_cuda_fill_random_dt(SF_DT_BF16, c.x, big, 31, 2.f, s) ||
        sf_cuda_fill_random_dt(SF_DT_BF16, c.dy, big, 32, 1.f, s) || sf_cuda_fill(c.g, 4 * 768, 1.f, s) ||
        sf_cuda_fill(c.b, 4 * 768, 0.f, s)) {
        fail("bench convnext setup", sf_cuda_last_error());
        return;
    }
    CU(cudaStreamSynchronize(s));
    c.n = N;
    c.copy_dst = c.y;
    c.copy_bytes = big * 2;
    const float copy_ms = bf_time(s, enq_cx_copy, &c, "convnext copy", 10);
    if (!(copy_ms > 0))
        return;
    const double copy_gbs = 2.0 * big * 2 / (copy_ms * 1e6);
    printf("throughput: convnext device-to-device copy %.0f MB: %.3f ms, %.0f GB/s (read + write)\n",
           big * 2 / 1e6, copy_ms, copy_gbs);
    char nm[120], sub[260];
    for (int k = 0; k < 4; k++) {
        c.c = stages[k].c;
        c.hw = stages[k].hw;
        const double len2 = (double)cx_len(&c) * 2; /* one bf16 pass over the stage's map */
        snprintf(nm, sizeof nm, "convnext bf16 nhwc n%d c%d %dx%d", N, c.c, c.hw, c.hw);
        if (enq_cx_ln_fwd(&c, s)) {
            fail(nm, sf_cuda_last_error());
            continue;
        }
        snprintf(sub, sizeof sub, "%s layernorm bwd: captured graph replays dweight, dbias bit-equal", nm);
        cx_replay_check(s, enq_cx_ln_bwd, &c, 1, sub);
        snprintf(sub, sizeof sub, "%s layer scale bwd: captured graph replays dscale bit-equal", nm);
        cx_replay_check(s, enq_cx_ls_bwd, &c, 0, sub);
        snprintf(sub, sizeof sub, "%s layernorm fwd", nm);
        bf_line(sub, bf_time(s, enq_cx_ln_fwd, &c, sub, 20), 2 * len2, copy_gbs, "x, y");
        snprintf(sub, sizeof sub, "%s layernorm bwd", nm);
        bf_line(sub, bf_time(s, enq_cx_ln_bwd, &c, sub, 20), 5 * len2, copy_gbs, "x, dy, dx, then x, dy");
        snprintf(sub, sizeof sub, "%s layer scale fwd", nm);
        bf_line(sub, bf_time(s, enq_cx_ls_fwd, &c, sub, 20), 2 * len2, copy_gbs, "x, y");
        snprintf(sub, sizeof sub, "%s layer scale bwd", nm);
        bf_line(sub, bf_time(s, enq_cx_ls_bwd, &c, sub, 20), 4 * len2, copy_gbs, "x, dy, then dy, dx");
        snprintf(sub, sizeof sub, "%s stochastic depth p 0.1", nm);
        bf_line(sub, bf_time(s, enq_cx_sd, &c, sub, 20), 1.9 * len2, copy_gbs, "kept samples' x, y");
        c.c *= 4; /* the MLP's hidden map */
        snprintf(sub, sizeof sub, "%s gelu fwd (c%d)", nm, c.c);
        bf_line(sub, bf_time(s, enq_cx_gelu_fwd, &c, sub, 20), 2 * 4 * len2, copy_gbs, "x, y");
        snprintf(sub, sizeof sub, "%s gelu bwd (c%d)", nm, c.c);
        bf_line(sub, bf_time(s, enq_cx_gelu_bwd, &c, sub, 20), 3 * 4 * len2, copy_gbs, "x, dy, dx");
    }
    cudaFree(c.x); cudaFree(c.y); cudaFree(c.dy); cudaFree(c.dx); cudaFree(c.g); cudaFree(c.b); cudaFree(c.dg);
    cudaFree(c.db); cudaFree(c.mean); cudaFree(c.rstd); cudaFree(c.cs_scr); cudaFree(c.ln_scr); cudaFree(c.seq);
}

int main(int argc, char **argv)
{
    const int convnext_only = argc > 1 && strcmp(argv[1], "convnext") == 0;
    if (argc > 1 && !convnext_only) {
        fprintf(stderr, "usage: layers_bench [convnext]\n");
        return 2;
    }
    if (skip_without_device())
        return 0;
    cudaStream_t s = test_stream();
    if (!convnext_only) {
        cudnnHandle_t dnn = test_cudnn(s);
        perf_resnet18(dnn, s, 256);
        const double copy_gbs = bench_resnet(s);
        if (copy_gbs > 0)
            bench_bf16(s, copy_gbs);
        bench_attention(dnn, s);
    }
    bench_convnext(s);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("FAIL device: %s\n", cudaGetErrorString(e));
        g_fail++;
    }
    printf("layers_bench: %d failed\n", g_fail);
    return g_fail ? 1 : 0;
}
