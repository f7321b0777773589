/* tests/gpu/backend_harness.h — what the backend tests (test_backend.cu,
 * test_backend_models.cu) share to drive a backend through its vtable: the
 * batches of a run, their pixels and labels drawn from a seed and their
 * hyper-parameters changing from step to step, and the loop that submits
 * them and reads the events back. Both backends of a comparison are given
 * the same batch_set, so they see the same bytes and the same augmentation
 * parameters. Header-only, included after gpu_test.h, gpu/aug.h,
 * gpu/backend.h and gpu/rng.h: each test is one program. */
#ifndef SF_TESTS_GPU_BACKEND_HARNESS_H
#define SF_TESTS_GPU_BACKEND_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <vector>

/* Pixels scaled to [0, 1], nothing else: the augmentation every model
 * comparison runs unless it tests an augmentation. */
static __attribute__((unused)) const char *AUG_SCALE =
    "[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":0.00392156862745098}]";

/* The build options of a comparison: seed 42 on device 0. */
static __attribute__((unused)) sf_train_cfg make_cfg(sf_precision prec, int max_batch, int overlap, int graphs)
{
    sf_train_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.precision = prec;
    cfg.seed = 42;
    cfg.max_batch = max_batch;
    cfg.overlap = overlap;
    cfg.cuda_graphs = graphs;
    cfg.device = 0;
    return cfg;
}

struct batch_set {
    sf_aug_pipeline pipe;
    sf_aug_plan plan;
    int n = 0, h = 0, w = 0, c = 0;
    std::vector<uint8_t *> images; /* pinned, one per step */
    std::vector<void *> labels;    /* pinned, one per step, of the set's label dtype */
    std::vector<std::vector<sf_aug_sample>> samples;
    std::vector<sf_batch> b;
};

/* steps batches of n samples h x w x c (NHWC, u8) through the augmentation
 * aug, with lps labels per sample ([n] or [n, lh, lw]) of dtype dt below
 * classes, all drawn from seed; hb allocates the pinned host memory. The
 * hyper-parameters change from step to step: lr at the first step and
 * lr_later after it, weight decay 1e-3 at the third step and 1e-4 at the
 * others, momentum 0.9, and AdamW's betas (0.9, 0.999) and eps 1e-8, which
 * SGD does not read. 0, or -1 with a FAIL line. */
static __attribute__((unused)) int make_batch_set(sf_backend *hb, batch_set &bs, const char *aug, int steps, int n,
                                                  int h, int w, int c, int classes, size_t lps, sf_label_dtype dt,
                                                  uint64_t seed, float lr, float lr_later)
{
    char err[200];
    if (sf_aug_parse(aug, &bs.pipe, err, sizeof err) || sf_aug_plan_make(&bs.pipe, h, w, c, &bs.plan, err, sizeof err)) {
        fail("augmentation plan: %s", err);
        return -1;
    }
    bs.n = n;
    bs.h = h;
    bs.w = w;
    bs.c = c;
    const size_t img = (size_t)n * h * w * c, nl = (size_t)n * lps;
    const size_t lsz = dt == SF_LABEL_U8 ? 1 : dt == SF_LABEL_I32 ? 4 : 8;
    for (int s = 0; s < steps; s++) {
        uint8_t *im = (uint8_t *)hb->i->host_alloc(hb, img);
        void *lab = hb->i->host_alloc(hb, nl * lsz);
        if (!im || !lab) {
            fail("host_alloc");
            return -1;
        }
        for (size_t i = 0; i < img; i++)
            im[i] = (uint8_t)(sf_hash4(seed, s, i, 1) >> 56);
        for (size_t i = 0; i < nl; i++) {
            const uint64_t v = sf_hash4(seed, s, i, 2) % (uint64_t)classes;
            if (dt == SF_LABEL_U8)
                ((uint8_t *)lab)[i] = (uint8_t)v;
            else if (dt == SF_LABEL_I32)
                ((int32_t *)lab)[i] = (int32_t)v;
            else
                ((int64_t *)lab)[i] = (int64_t)v;
        }
        bs.images.push_back(im);
        bs.labels.push_back(lab);
        bs.samples.push_back(std::vector<sf_aug_sample>(n));
        sf_aug_gen(&bs.pipe, &bs.plan, seed, (uint64_t)s, n, bs.samples.back().data());
    }
    for (int s = 0; s < steps; s++) {
        sf_batch b;
        memset(&b, 0, sizeof b);
        b.id = 1000 + s;
        b.seq = s;
        b.token = (void *)(uintptr_t)(5000 + s);
        b.n = n;
        b.h = h;
        b.w = w;
        b.c = c;
        b.nhwc = 1;
        b.images = bs.images[s];
        b.label_dtype = dt;
        b.labels = bs.labels[s];
        b.plan = &bs.plan;
        b.samples = bs.samples[s].data();
        b.hyper.lr = s == 0 ? lr : lr_later;
        b.hyper.momentum = 0.9f;
        b.hyper.weight_decay = s == 2 ? 1e-3f : 1e-4f;
        b.hyper.beta1 = 0.9;
        b.hyper.beta2 = 0.999;
        b.hyper.eps = 1e-8f;
        b.t_ready_ns = now_ns();
        bs.b.push_back(b);
    }
    return 0;
}

static __attribute__((unused)) void free_batches(sf_backend *hb, batch_set &bs)
{
    for (auto p : bs.images)
        hb->i->host_free(hb, p);
    for (auto p : bs.labels)
        hb->i->host_free(hb, p);
    bs.images.clear();
    bs.labels.clear();
}

/* One STEP_DONE: what it reported and when its transform and step ran. */
struct ev_rec {
    float loss;
    int correct;
    int64_t n_labels;
    uint64_t step;
    uint64_t t_tr0, t_tr1, t_s0, t_s1;
};

/* What a run of steps reported: a record per STEP_DONE, and whether the
 * events came as the vtable promises (why: the last way they did not). */
struct run_log {
    std::vector<ev_rec> ev;
    int events_ok = 1;
    char why[200] = "";
};

/* Submits batches [from, to) of bs, keeping up to max_inflight in flight,
 * and appends each STEP_DONE's record to log.ev. Checks the events on the
 * way into log: one SLOT_FREE then one STEP_DONE per batch, each kind in
 * submission order, the sample count, monotone stage times and, unless
 * step_counter is NULL, the step counter (*step_counter counts the steps
 * across calls). 0, or -1 with a FAIL line when a submit or a step failed
 * or the steps took longer than limit_s seconds. */
static __attribute__((unused)) int run_steps(sf_backend *be, batch_set &bs, int from, int to, uint64_t *step_counter,
                                             run_log &log, int limit_s = 120)
{
    const int maxin = be->i->max_inflight(be);
    int next = from, freed = from, done = from, inflight = 0;
    char err[200];
    const uint64_t t_start = now_ns();
    while (done < to) {
        while (next < to && inflight < maxin) {
            bs.b[next].t_ready_ns = now_ns();
            if (be->i->submit(be, &bs.b[next], err, sizeof err)) {
                fail("%s submit of batch %d: %s", be->i->name(be), next, err);
                return -1;
            }
            next++;
            inflight++;
        }
        sf_event ev[8];
        int k = be->i->poll(be, ev, 8, 1000);
        if (now_ns() - t_start > (uint64_t)limit_s * 1000000000ull) {
            fail("%s: steps did not complete within %d s", be->i->name(be), limit_s);
            return -1;
        }
        for (int i = 0; i < k; i++) {
            const sf_event *e = &ev[i];
            if (e->kind == SF_EV_SLOT_FREE) {
                if (freed >= next || e->id != bs.b[freed].id || e->token != bs.b[freed].token) {
                    log.events_ok = 0;
                    snprintf(log.why, sizeof log.why, "SLOT_FREE for id %llu out of order (expected %llu)",
                             (unsigned long long)e->id, (unsigned long long)(freed < to ? bs.b[freed].id : 0));
                }
                freed++;
            } else if (e->kind == SF_EV_STEP_DONE) {
                if (done >= freed || e->id != bs.b[done].id || e->token != bs.b[done].token) {
                    log.events_ok = 0;
                    snprintf(log.why, sizeof log.why, "STEP_DONE for id %llu before its SLOT_FREE or out of order",
                             (unsigned long long)e->id);
                }
                if (e->status != 0) {
                    fail("%s step %d failed: %s", be->i->name(be), done, e->err);
                    return -1;
                }
                if (step_counter) {
                    (*step_counter)++;
                    if (e->step != *step_counter) {
                        log.events_ok = 0;
                        snprintf(log.why, sizeof log.why, "step counter %llu, expected %llu",
                                 (unsigned long long)e->step, (unsigned long long)*step_counter);
                    }
                }
                if (e->n != bs.n) {
                    log.events_ok = 0;
                    snprintf(log.why, sizeof log.why, "n %d, expected %d", e->n, bs.n);
                }
                const uint64_t tnow = now_ns();
                if (!(e->t_h2d_start_ns <= e->t_transform_start_ns && e->t_transform_start_ns <= e->t_step_start_ns &&
                      e->t_step_start_ns <= e->t_step_end_ns && e->t_h2d_start_ns > 0 &&
                      e->t_step_end_ns <= tnow + 1000000ull && e->step_s > 0 && e->transform_s >= 0 && e->h2d_s >= 0)) {
                    log.events_ok = 0;
                    snprintf(log.why, sizeof log.why,
                             "stage times not monotone: h2d %llu tr %llu step %llu..%llu now %llu (s %g %g %g)",
                             (unsigned long long)e->t_h2d_start_ns, (unsigned long long)e->t_transform_start_ns,
                             (unsigned long long)e->t_step_start_ns, (unsigned long long)e->t_step_end_ns,
                             (unsigned long long)tnow, e->h2d_s, e->transform_s, e->step_s);
                }
                ev_rec r = {e->loss, e->correct, e->n_labels, e->step, e->t_transform_start_ns,
                            e->t_transform_start_ns + (uint64_t)(e->transform_s * 1e9), e->t_step_start_ns,
                            e->t_step_end_ns};
                log.ev.push_back(r);
                done++;
                inflight--;
            }
        }
    }
    return 0;
}

/* ||(a - p0) - (b - p0)|| / ||b - p0|| over [from, to) */
static __attribute__((unused)) double delta_err(const std::vector<float> &p0, const std::vector<float> &a,
                                                const std::vector<float> &b, size_t from, size_t to)
{
    double num = 0, den = 0;
    for (size_t i = from; i < to; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        double da = (double)a[i] - p0[i], db = (double)b[i] - p0[i];
        num += (da - db) * (da - db);
        den += db * db;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
