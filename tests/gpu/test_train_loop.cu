/* tests/gpu/test_train_loop.cu — the training loop's per-batch options through
 * the CUDA backend against the reference backend (gpu/ref/backend_ref.c), on
 * a reduced ResNet-18 (batchnorm, residual blocks, 1000 classes: top-5 means
 * something; 64x64 input, as tests/gpu/test_backend_models.cu: at 32x32 the
 * last blocks' batchnorm sees 8 values a channel and amplifies rounding
 * differences to 2 % of the update even without any option), each case from
 * a common training state:
 *  - a training step with label smoothing, mixed targets (mix_lam) and
 *    clip_grad_norm small enough to clip: loss, top-1/top-5 hits, the
 *    pre-clip gradient norm and the parameter update agree; fp32 and bf16;
 *  - an evaluation batch: loss, hits and logits agree with the reference,
 *    and the CUDA backend's parameters, running statistics, momentum and
 *    step count are bit-identical before and after; the event says eval;
 *  - a non-finite loss (an Inf weight in the classifier): the step is
 *    reported skipped, nothing changes, the step count stays; the next
 *    finite batch trains;
 *  - AdamW behind a skipped step that was still queued when the next
 *    batches were staged: they train as steps 1 and 2, as without it.
 * Throughput of evaluation batches is measured in bench/cached.cu.
 *
 * Usage: test_train_loop [-l] [-s SECTION[,SECTION...]]... (gpu_test.h,
 * test_sections): -l lists the sections, -s runs only those; no argument runs
 * them all. The sections, in order: the training step with options, one per
 * combination (options_fp32_plain, options_fp32_smooth, options_fp32_mix,
 * options_fp32_clip, options_fp32_all, options_bf16_plain,
 * options_bf16_all), then eval, nonfinite and adamw_skip. Each builds the
 * backends itself; all share the setup made before the first (both backends,
 * the model, two batches).
 * Prints "ok <case>" / "FAIL <case>: ..."; exits 1 on failure, 0 with
 * "SKIPPED: no CUDA device" without a GPU.
 */
extern "C" {
#include "gpu/aug.h"
#include "gpu/backend.h"
#include "gpu/model.h"
#include "gpu/rng.h"
}

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>

#include "tests/gpu/gpu_test.h"

#include <cuda_runtime.h>

static const char *AUG_SCALE = "[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":0.00392156862745098}]";

struct one_batch {
    sf_aug_pipeline pipe;
    sf_aug_plan plan;
    uint8_t *im = NULL;
    int64_t *lab = NULL;
    std::vector<sf_aug_sample> samples;
    sf_batch b;
};

static int make_batch(sf_backend *hb, one_batch &ob, int n, int hw, int classes, uint64_t seed)
{
    char err[200];
    if (sf_aug_parse(AUG_SCALE, &ob.pipe, err, sizeof err) ||
        sf_aug_plan_make(&ob.pipe, hw, hw, 3, &ob.plan, err, sizeof err)) {
        fail("augmentation plan: %s", err);
        return -1;
    }
    const size_t img = (size_t)n * hw * hw * 3;
    ob.im = (uint8_t *)hb->i->host_alloc(hb, img);
    ob.lab = (int64_t *)hb->i->host_alloc(hb, sizeof(int64_t) * n);
    if (!ob.im || !ob.lab) {
        fail("host_alloc");
        return -1;
    }
    for (size_t i = 0; i < img; i++)
        ob.im[i] = (uint8_t)(sf_hash4(seed, 0, i, 1) >> 56);
    for (int i = 0; i < n; i++)
        ob.lab[i] = (int64_t)(sf_hash4(seed, 0, i, 2) % (uint64_t)classes);
    ob.samples.resize(n);
    sf_aug_gen(&ob.pipe, &ob.plan, seed, 0, n, ob.samples.data());
    memset(&ob.b, 0, sizeof ob.b);
    ob.b.id = seed;
    ob.b.token = (void *)(uintptr_t)seed;
    ob.b.n = n;
    ob.b.h = ob.b.w = hw;
    ob.b.c = 3;
    ob.b.nhwc = 1;
    ob.b.images = ob.im;
    ob.b.label_dtype = SF_LABEL_I64;
    ob.b.labels = ob.lab;
    ob.b.plan = &ob.plan;
    ob.b.samples = ob.samples.data();
    ob.b.hyper.lr = 0.005f;
    ob.b.hyper.momentum = 0.9f;
    ob.b.hyper.weight_decay = 1e-4f;
    return 0;
}

/* Submits one batch and waits for its STEP_DONE. */
static int run_one(sf_backend *be, const sf_batch &b, sf_event &done)
{
    char err[200];
    if (be->i->submit(be, &b, err, sizeof err)) {
        fail("%s submit: %s", be->i->name(be), err);
        return -1;
    }
    const uint64_t t0 = now_ns();
    for (;;) {
        sf_event ev[4];
        const int k = be->i->poll(be, ev, 4, 1000);
        for (int i = 0; i < k; i++)
            if (ev[i].kind == SF_EV_STEP_DONE) {
                done = ev[i];
                if (done.status) {
                    fail("%s step: %s", be->i->name(be), done.err);
                    return -1;
                }
                return 0;
            }
        if (now_ns() - t0 > 120ull * 1000000000ull) {
            fail("%s: no STEP_DONE within 120 s", be->i->name(be));
            return -1;
        }
    }
}

/* The whole training state a step may change. */
struct tstate {
    std::vector<float> p, mom, bufs;
    uint64_t step = 0, nbt = 0;
};

static int get_state(sf_backend *be, const sf_model &m, tstate &st)
{
    st.p.resize(m.n_params);
    st.mom.resize(m.n_params);
    st.bufs.resize(m.n_buffers ? m.n_buffers : 1);
    return be->i->get_params(be, st.p.data()) || be->i->get_opt_state(be, st.mom.data(), &st.step) ||
           be->i->get_buffers(be, st.bufs.data(), &st.nbt);
}

static int set_state(sf_backend *be, const tstate &st)
{
    return be->i->set_params(be, st.p.data()) || be->i->set_opt_state(be, st.mom.data(), st.step) ||
           be->i->set_buffers(be, st.bufs.data(), st.nbt);
}

static bool same_bits(const std::vector<float> &a, const std::vector<float> &b)
{
    return a.size() == b.size() && memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

static double rel(double a, double b) { return fabs(a - b) / (fabs(b) > 1e-30 ? fabs(b) : 1.0); }

/* ||(a - p0) - (b - p0)|| / ||b - p0|| */
static double delta_err(const std::vector<float> &p0, const std::vector<float> &a, const std::vector<float> &b)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < p0.size(); i++) {
        const double da = (double)a[i] - p0[i], db = (double)b[i] - p0[i];
        num += (da - db) * (da - db);
        den += db * db;
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
}

static sf_train_cfg make_cfg(sf_precision prec, int max_batch)
{
    sf_train_cfg c;
    memset(&c, 0, sizeof c);
    c.precision = prec;
    c.seed = 3;
    c.max_batch = max_batch;
    c.overlap = 1;
    c.cuda_graphs = 1;
    return c;
}

/* A training step with smoothing, mixing and clipping from a common state. */
static void options_step(sf_backend *cu, sf_backend *ref, const sf_model &m, sf_precision prec, one_batch &ob,
                         float sm, float lam, float clip)
{
    const char *pn = prec == SF_PREC_BF16 ? "bf16" : "fp32";
    /* test_backend_models' tolerances for this model's first step: the bf16
     * reference emulates bf16 rounding points, not cuDNN's summation order */
    const double tol_loss = prec == SF_PREC_BF16 ? 2e-2 : 1e-4, tol_norm = prec == SF_PREC_BF16 ? 1e-1 : 1e-3,
                 tol_delta = prec == SF_PREC_BF16 ? 0.6 : 2e-2;
    char err[300];
    sf_train_cfg cfg = make_cfg(prec, ob.b.n);
    if (test_build(cu, &m, &cfg, err, sizeof err) || test_build(ref, &m, &cfg, err, sizeof err)) {
        fail("options %s build: %s", pn, err);
        return;
    }
    tstate s0;
    if (get_state(cu, m, s0) || set_state(ref, s0)) {
        fail("options %s: state copy", pn);
        return;
    }
    sf_batch b = ob.b;
    b.label_smoothing = sm;
    b.mix_lam = lam;
    b.hyper.clip_grad_norm = clip;
    sf_event ec, er;
    tstate sc, sr;
    if (run_one(cu, b, ec) || run_one(ref, b, er) || get_state(cu, m, sc) || get_state(ref, m, sr))
        return;
    const double dl = rel(ec.loss, er.loss), dn = rel(ec.grad_norm, er.grad_norm);
    const double dd = delta_err(s0.p, sc.p, sr.p);
    if (isfinite(ec.loss) && dl < tol_loss && dn < tol_norm && dd < tol_delta && er.grad_norm > clip &&
        !ec.skipped && ec.step == er.step && abs(ec.correct - er.correct) <= 1 && abs(ec.correct5 - er.correct5) <= 1)
        ok("options %s: smoothing %g, mix %g, clip %g (norm %.3f): loss %.6f vs %.6f, norm rel %.1e, "
           "update rel %.1e, top-1 %d/%d, top-5 %d/%d",
           pn, sm, lam, clip, er.grad_norm, ec.loss, er.loss, dn, dd, ec.correct, er.correct, ec.correct5, er.correct5);
    else
        fail("options %s smoothing %g mix %g clip %g: loss %.6f vs %.6f (rel %.1e), norm %.4f vs %.4f, update rel "
             "%.2e, top-1 %d/%d, top-5 %d/%d, skipped %d, step %llu/%llu",
             pn, sm, lam, clip, ec.loss, er.loss, dl, ec.grad_norm, er.grad_norm, dd, ec.correct, er.correct, ec.correct5,
             er.correct5, ec.skipped, (unsigned long long)ec.step, (unsigned long long)er.step);
}

/* An evaluation batch changes nothing; its loss, hits and logits agree. */
static void eval_batch(sf_backend *cu, sf_backend *ref, const sf_model &m, one_batch &ob, one_batch &train_b)
{
    char err[300];
    sf_train_cfg cfg = make_cfg(SF_PREC_FP32, ob.b.n);
    if (test_build(cu, &m, &cfg, err, sizeof err) || test_build(ref, &m, &cfg, err, sizeof err)) {
        fail("eval build: %s", err);
        return;
    }
    /* one training step first, so running statistics and momentum are not the initial ones */
    sf_event e0;
    if (run_one(cu, train_b.b, e0))
        return;
    tstate s0, s1;
    if (get_state(cu, m, s0) || set_state(ref, s0)) {
        fail("eval: state copy");
        return;
    }
    const size_t nlog = (size_t)ob.b.n * m.n_classes;
    std::vector<float> lc(nlog, NAN), lr(nlog, NAN);
    sf_batch b = ob.b;
    b.eval = 1;
    b.logits_out = lc.data();
    sf_event ec, er;
    if (run_one(cu, b, ec))
        return;
    b.logits_out = lr.data();
    if (run_one(ref, b, er) || get_state(cu, m, s1))
        return;
    const bool unchanged = same_bits(s0.p, s1.p) && same_bits(s0.mom, s1.mom) && same_bits(s0.bufs, s1.bufs) &&
                           s0.step == s1.step && s0.nbt == s1.nbt;
    double num = 0, den = 0;
    for (size_t i = 0; i < nlog; i++) {
        num += ((double)lc[i] - lr[i]) * ((double)lc[i] - lr[i]);
        den += (double)lr[i] * lr[i];
    }
    const double dlog = den > 0 ? sqrt(num / den) : INFINITY;
    const double dl = rel(ec.loss, er.loss);
    if (unchanged && ec.eval == 1 && dl < 1e-4 && dlog < 1e-4 && ec.correct == er.correct &&
        ec.correct5 == er.correct5 && ec.step == s0.step && ec.grad_norm == 0.f)
        ok("eval batch: state bit-identical, loss %.6f vs %.6f, logits rel %.1e, top-1 %d, top-5 %d", ec.loss,
           er.loss, dlog, ec.correct, ec.correct5);
    else
        fail("eval batch: unchanged %d (step %llu->%llu, nbt %llu->%llu), eval flag %d, loss %.6f vs %.6f, logits "
             "rel %.2e, top-1 %d/%d, top-5 %d/%d, event step %llu",
             unchanged, (unsigned long long)s0.step, (unsigned long long)s1.step, (unsigned long long)s0.nbt,
             (unsigned long long)s1.nbt, ec.eval, ec.loss, er.loss, dlog, ec.correct, er.correct, ec.correct5,
             er.correct5, (unsigned long long)ec.step);
}

/* A non-finite loss skips the step; the next finite batch trains. */
static void nonfinite_step(sf_backend *cu, const sf_model &m, one_batch &ob)
{
    char err[300];
    sf_train_cfg cfg = make_cfg(SF_PREC_FP32, ob.b.n);
    if (test_build(cu, &m, &cfg, err, sizeof err)) {
        fail("non-finite build: %s", err);
        return;
    }
    tstate s0, s1, s2;
    if (get_state(cu, m, s0))
        return;
    /* an Inf weight in the classifier (the last layer's first weight) */
    tstate bad = s0;
    bad.p[m.layers[m.n_layers - 1].w_off] = INFINITY;
    sf_event e1, e2;
    if (set_state(cu, bad) || run_one(cu, ob.b, e1) || get_state(cu, m, s1))
        return;
    const bool unchanged = same_bits(bad.p, s1.p) && same_bits(bad.mom, s1.mom) && s1.step == bad.step;
    if (e1.skipped == 1 && unchanged && e1.step == s0.step && !isfinite(e1.loss))
        ok("non-finite loss: step skipped, parameters and momentum bit-identical, step count %llu",
           (unsigned long long)e1.step);
    else
        fail("non-finite loss: skipped %d, unchanged %d, loss %g, step %llu (was %llu)", e1.skipped, unchanged,
             e1.loss, (unsigned long long)e1.step, (unsigned long long)s0.step);
    if (set_state(cu, s0) || run_one(cu, ob.b, e2) || get_state(cu, m, s2))
        return;
    if (!e2.skipped && isfinite(e2.loss) && !same_bits(s0.p, s2.p) && e2.step == s0.step + 1 && e2.grad_norm > 0)
        ok("after a skipped step a finite batch trains (step %llu, norm %.3f)", (unsigned long long)e2.step,
           e2.grad_norm);
    else
        fail("finite batch after a skip: skipped %d, loss %g, changed %d, step %llu", e2.skipped, e2.loss,
             !same_bits(s0.p, s2.p), (unsigned long long)e2.step);
}

/* Submits the batches back to back (each staged before the ones ahead of
 * it have run) and collects their STEP_DONE events in order. */
static int run_queued(sf_backend *be, const std::vector<sf_batch> &bs, std::vector<sf_event> &done)
{
    char err[200];
    for (const sf_batch &b : bs)
        if (be->i->submit(be, &b, err, sizeof err)) {
            fail("%s submit: %s", be->i->name(be), err);
            return -1;
        }
    const uint64_t t0 = now_ns();
    while (done.size() < bs.size()) {
        sf_event ev[4];
        const int k = be->i->poll(be, ev, 4, 1000);
        for (int i = 0; i < k; i++)
            if (ev[i].kind == SF_EV_STEP_DONE) {
                if (ev[i].status) {
                    fail("%s step: %s", be->i->name(be), ev[i].err);
                    return -1;
                }
                done.push_back(ev[i]);
            }
        if (now_ns() - t0 > 120ull * 1000000000ull) {
            fail("%s: %zu of %zu STEP_DONE within 120 s", be->i->name(be), done.size(), bs.size());
            return -1;
        }
    }
    return 0;
}

/* AdamW's step number behind a skipped step: after one non-finite batch
 * (label smoothing NaN makes every logit's gradient NaN; a NaN mix_lam would
 * read as "no mixing"), another queued ahead of two finite ones, all staged
 * before that skip is known, must train what the two finite batches train
 * alone (steps 1 and 2 of torch.optim.AdamW; skipped ones are not steps).
 * Numbered 2 and 3, the first update would be 0.74x of step 1's (bias
 * corrections), far outside the device's run-to-run spread. */
static void adamw_behind_skip(sf_backend *cu, const sf_model &m, one_batch &ob1, one_batch &ob2)
{
    char err[300];
    sf_train_cfg cfg = make_cfg(SF_PREC_FP32, ob1.b.n);
    cfg.optim = SF_OPT_ADAMW;
    if (test_build(cu, &m, &cfg, err, sizeof err)) {
        fail("adamw behind a skip, build: %s", err);
        return;
    }
    sf_batch g1 = ob1.b, g2 = ob2.b;
    for (sf_batch *b : {&g1, &g2}) {
        b->hyper.lr = 1e-3f;
        b->hyper.momentum = 0.f;
        b->hyper.beta1 = 0.9;
        b->hyper.beta2 = 0.999;
        b->hyper.eps = 1e-8f;
        b->hyper.weight_decay = 0.01f;
    }
    sf_batch bad = g1;
    bad.label_smoothing = NAN;
    tstate s0, sa, sb;
    std::vector<float> sq0(m.n_params), sqa(m.n_params), sqb(m.n_params);
    /* A first skip harvested before the rest is staged, so that the host's
     * count of skips is not zero either (the device's reaches 2 before g1). */
    std::vector<sf_event> e0, ea, eb;
    if (get_state(cu, m, s0) || cu->i->get_opt_sq(cu, sq0.data()) || run_queued(cu, {bad}, e0) ||
        run_queued(cu, {bad, g1, g2}, ea) ||
        get_state(cu, m, sa) || cu->i->get_opt_sq(cu, sqa.data()) || set_state(cu, s0) ||
        cu->i->set_opt_sq(cu, sq0.data()) || run_queued(cu, {g1, g2}, eb) || get_state(cu, m, sb) ||
        cu->i->get_opt_sq(cu, sqb.data())) {
        fail("adamw behind a skip: a run or a state copy failed");
        return;
    }
    const bool events = e0.size() == 1 && e0[0].skipped == SF_SKIP_NONFINITE && ea.size() == 3 && eb.size() == 2 &&
                        ea[0].skipped == SF_SKIP_NONFINITE && !ea[1].skipped &&
                        !ea[2].skipped && ea[1].step == s0.step + 1 && ea[2].step == s0.step + 2 &&
                        eb[1].step == s0.step + 2 && sa.step == sb.step;
    const double dp = delta_err(s0.p, sa.p, sb.p), dm = delta_err(s0.mom, sa.mom, sb.mom),
                 dv = delta_err(sq0, sqa, sqb);
    if (events && dp < 2e-2 && dm < 2e-2 && dv < 2e-2)
        ok("adamw behind a queued skipped step: steps %llu, %llu as without it (update rel %.1e, exp_avg %.1e, "
           "exp_avg_sq %.1e; bit-identical %d)",
           (unsigned long long)ea[1].step, (unsigned long long)ea[2].step, dp, dm, dv,
           same_bits(sa.p, sb.p) && same_bits(sqa, sqb));
    else
        fail("adamw behind a queued skipped step: events %d (skipped %d, steps %llu %llu / %llu, final %llu/%llu), "
             "update rel %.2e, exp_avg %.2e, exp_avg_sq %.2e",
             events, ea.empty() ? -1 : ea[0].skipped, ea.size() > 1 ? (unsigned long long)ea[1].step : 0ull,
             ea.size() > 2 ? (unsigned long long)ea[2].step : 0ull,
             eb.size() > 1 ? (unsigned long long)eb[1].step : 0ull, (unsigned long long)sa.step,
             (unsigned long long)sb.step, dp, dm, dv);
}

/* The training steps with options, one section each: smoothing, mix_lam,
 * clip_grad_norm. */
static const struct {
    const char *section;
    sf_precision prec;
    float sm, lam, clip;
} OPTION_STEPS[] = {
    {"options_fp32_plain", SF_PREC_FP32, 0.f, 1.f, 0.f},   {"options_fp32_smooth", SF_PREC_FP32, 0.1f, 1.f, 0.f},
    {"options_fp32_mix", SF_PREC_FP32, 0.f, 0.7f, 0.f},    {"options_fp32_clip", SF_PREC_FP32, 0.f, 1.f, 0.25f},
    {"options_fp32_all", SF_PREC_FP32, 0.1f, 0.7f, 0.25f}, {"options_bf16_plain", SF_PREC_BF16, 0.f, 1.f, 0.f},
    {"options_bf16_all", SF_PREC_BF16, 0.1f, 0.7f, 0.25f},
};

int main(int argc, char **argv)
{
    test_sections sec("test_train_loop", {"options_fp32_plain", "options_fp32_smooth", "options_fp32_mix",
                                          "options_fp32_clip", "options_fp32_all", "options_bf16_plain",
                                          "options_bf16_all", "eval", "nonfinite", "adamw_skip"});
    const int arg_rc = sec.args(argc, argv);
    if (arg_rc >= 0)
        return arg_rc;
    if (skip_without_device())
        return 0;
    sf_backend *cu, *ref;
    if (cuda_and_ref_backends(&cu, &ref))
        return 1;
    sf_model m;
    if (resnet18_at(64, &m))
        return 1;
    one_batch b1, b2;
    if (make_batch(cu, b1, 8, 64, m.n_classes, 41) || make_batch(cu, b2, 8, 64, m.n_classes, 42))
        return 1;
    g_layout = SF_ACT_LAYOUT_NHWC;
    /* Each case builds the backends itself and starts from the state it reads
     * back or sets: none needs an earlier one. */
    for (const auto &o : OPTION_STEPS)
        if (sec.run(o.section))
            options_step(cu, ref, m, o.prec, b1, o.sm, o.lam, o.clip);
    if (sec.run("eval"))
        eval_batch(cu, ref, m, b2, b1);
    if (sec.run("nonfinite"))
        nonfinite_step(cu, m, b1);
    if (sec.run("adamw_skip"))
        adamw_behind_skip(cu, m, b1, b2);
    cu->i->host_free(cu, b1.im);
    cu->i->host_free(cu, b1.lab);
    cu->i->host_free(cu, b2.im);
    cu->i->host_free(cu, b2.lab);
    cu->i->destroy(cu);
    ref->i->destroy(ref);
    return report("test_train_loop");
}
