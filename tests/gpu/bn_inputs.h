/* tests/gpu/bn_inputs.h — a BatchNorm2d case's inputs and their double
 * reference, which the BatchNorm tests share: the op family's
 * (tests/gpu/ops/batchnorm.cu) and the split BatchNorm of
 * distributed.batchnorm sync (tests/gpu/test_batchnorm_sync.cu), whose two
 * ranks together must compute what one BatchNorm2d computes on the whole
 * batch. Header-only, included after op_test.h (rand_fill, to_d). */
#ifndef SF_TESTS_GPU_BN_INPUTS_H
#define SF_TESTS_GPU_BN_INPUTS_H

#include <initializer_list>
#include <vector>

#include "gpu/cuda/pointwise.h"
#include "tests/gpu/op_test.h"

/* The eps and momentum of every case: PyTorch's defaults. */
static const float k_bn_eps = 1e-5f, k_bn_mom = 0.1f;

/* A case's inputs, drawn in this order: x (an offset mean: the statistics
 * must not cancel) and a second activation (dy, or the residual) as dt holds
 * them, then the fp32 parameters and running statistics; and the double
 * reference's training forward on them: y (NCHW, before any ReLU), the saved
 * statistics and the updated running ones. */
struct bn_ref {
    std::vector<float> x, dy, gamma, beta, rm, rv;
    std::vector<double> xd, gd, yr, smr, sir, rmr, rvr;
};

static __attribute__((unused)) bn_ref bn_draw(sf_dtype dt, int n, int c, int h, int w)
{
    const size_t len = (size_t)n * c * h * w;
    bn_ref r;
    r.x.resize(len);
    r.dy.resize(len);
    r.gamma.resize(c);
    r.beta.resize(c);
    r.rm.resize(c);
    r.rv.resize(c);
    rand_fill_dt(r.x, dt, 2.f, 3.f);
    rand_fill_dt(r.dy, dt, 1.f);
    rand_fill(r.gamma, 0.5f, 1.f);
    rand_fill(r.beta, 0.5f);
    rand_fill(r.rm, 0.5f);
    rand_fill(r.rv, 0.4f, 1.f);
    r.xd = to_d(r.x);
    r.gd = to_d(r.gamma);
    r.rmr = to_d(r.rm);
    r.rvr = to_d(r.rv);
    r.yr.resize(len);
    r.smr.resize(c);
    r.sir.resize(c);
    const std::vector<double> bd = to_d(r.beta);
    sf_ref_bn2d_fwd_train_f64(r.xd.data(), n, c, h, w, r.gd.data(), bd.data(), k_bn_eps, k_bn_mom, r.rmr.data(),
                              r.rvr.data(), r.smr.data(), r.sir.data(), r.yr.data());
    return r;
}

/* A case drawn on the device, for the checks that compare the device with
 * itself (a captured graph's replay, a backward with y and without): the
 * activations x, y, dy, dx of element type dt and shape [n, c, h, w], the
 * per-channel fp32 tensors, and the launchers' scratch for layout L; x, dy,
 * gamma and beta drawn in that order, the running statistics 0 and 1. */
struct bn_dev_case {
    size_t len, bytes; /* an activation's elements and bytes */
    void *x, *y, *dy, *dx, *scr;
    float *g, *b, *rm, *rv, *sm, *si, *dg, *db;
};

/* 0, or the failing fill's result with sf_cuda_last_error() set. */
static __attribute__((unused)) int bn_dev_case_make(bn_dev_case &t, sf_dtype dt, int n, int c, int h, int w,
                                                    sf_layout L, cudaStream_t s)
{
    t.len = (size_t)n * c * h * w;
    t.bytes = t.len * sf_dtype_size(dt);
    for (void **p : {&t.x, &t.y, &t.dy, &t.dx})
        *p = dalloc<char>(t.bytes);
    for (float **p : {&t.g, &t.b, &t.rm, &t.rv, &t.sm, &t.si, &t.dg, &t.db})
        *p = dalloc<float>(c);
    t.scr = dalloc<char>(sf_cuda_bn_scratch_bytes(n, c, h, w, L));
    return sf_cuda_fill_random_dt(dt, t.x, t.len, g_seed++, 2.f, s) ||
           sf_cuda_fill_random_dt(dt, t.dy, t.len, g_seed++, 1.f, s) || sf_cuda_fill_random(t.g, c, g_seed++, 1.f, s) ||
           sf_cuda_fill_random(t.b, c, g_seed++, 1.f, s) || sf_cuda_fill(t.rm, c, 0.f, s) ||
           sf_cuda_fill(t.rv, c, 1.f, s);
}

static __attribute__((unused)) void bn_dev_case_free(bn_dev_case &t)
{
    for (void *p : {t.x, t.y, t.dy, t.dx, t.scr})
        cudaFree(p);
    for (float *p : {t.g, t.b, t.rm, t.rv, t.sm, t.si, t.dg, t.db})
        cudaFree(p);
}

#endif
