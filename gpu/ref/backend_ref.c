/* gpu/ref/backend_ref.c — the CPU reference backend (sf_backend_i over gpu/ref).
 *
 * Synchronous: submit() runs augmentation, forward, loss, backward and the SGD
 * update at once on the calling (engine) thread, then queues the batch's
 * SLOT_FREE and STEP_DONE events, which poll() hands out. Every buffer is
 * allocated by build() for cfg->max_batch; a step allocates nothing.
 *
 * Activations: one buffer per conv/linear output; relu runs in place on its
 * input (the producer's backward needs only its own input, never its output)
 * and flatten is a view, so both alias their input. Gradients flow through two
 * ping-pong buffers of max_batch * max_act floats.
 *
 * Precision: every precision is computed in fp32 here.
 *
 * Checkpoints: get/set_opt_state are the momentum buffer (zeros until a step
 * with momentum != 0) and the step count. bench runs submit's stages
 * synchronously, without events, and restores parameters, momentum and the
 * step count. No device telemetry (device_stats answers -1).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* clock_gettime, nanosleep (the Makefile defines it too) */
#endif
#include "gpu/common.h"
#include "../backend.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ref.h"

#define REF_FIFO_CAP 4 /* events; max_inflight 1 needs 2 */

typedef struct ref_ctx {
    int built;
    sf_model m;
    sf_train_cfg cfg;
    uint64_t step;

    float *params, *grads, *mom;
    float *input;                 /* [max_batch, in_c, in_h, in_w] augmented batch */
    float *act_buf[SF_MAX_LAYERS]; /* owned output buffers (conv/linear), else NULL */
    float *act[SF_MAX_LAYERS];    /* output of each layer (aliases for relu/flatten) */
    float *g0, *g1;               /* gradient ping-pong, [max_batch * max_act] */
    float *aug_tmp;               /* one sample's geometric output (blur input) */
    size_t aug_tmp_len;           /* floats */
    int32_t *labels;              /* [max_batch] */

    sf_event fifo[REF_FIFO_CAP];
    int head, count;
} ref_ctx;



static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static ref_ctx *ctx_of(sf_backend *be) { return (ref_ctx *)be->ctx; }

/* ---- memory ------------------------------------------------------------- */

static const char *ref_name(sf_backend *be) { return "ref"; }

static void *ref_host_alloc(sf_backend *be, size_t bytes)
{
    size_t sz = (bytes + 63) & ~(size_t)63;
    if (sz < bytes)
        return NULL; /* overflow */
    return aligned_alloc(64, sz ? sz : 64);
}

static void ref_host_free(sf_backend *be, void *p) { free(p); }

static void free_state(ref_ctx *c)
{
    free(c->params);
    free(c->grads);
    free(c->mom);
    free(c->input);
    for (int i = 0; i < SF_MAX_LAYERS; i++)
        free(c->act_buf[i]);
    free(c->g0);
    free(c->g1);
    free(c->aug_tmp);
    free(c->labels);
    sf_event fifo_keep[REF_FIFO_CAP];
    memcpy(fifo_keep, c->fifo, sizeof fifo_keep);
    int head = c->head, count = c->count;
    memset(c, 0, sizeof *c);
    /* Events already queued still belong to the engine. */
    memcpy(c->fifo, fifo_keep, sizeof fifo_keep);
    c->head = head;
    c->count = count;
}

/* calloc of a * b floats with an overflow check; a zero size gives a
 * one-float block so that the pointer is never NULL on success. */
static float *alloc_floats(size_t a, size_t b)
{
    if (b != 0 && a > SIZE_MAX / sizeof(float) / b)
        return NULL;
    size_t n = a * b;
    return calloc(n ? n : 1, sizeof(float));
}

static int ref_build(sf_backend *be, const sf_model *m, const sf_train_cfg *cfg, char *err,
                     size_t errlen)
{
    ref_ctx *c = ctx_of(be);
    free_state(c);
    if (!m || !cfg) {
        sf_errf(err, errlen, "ref build: model or config missing");
        return -1;
    }
    if (cfg->max_batch < 1) {
        sf_errf(err, errlen, "ref build: max_batch %d must be >= 1", cfg->max_batch);
        return -1;
    }
    c->m = *m;
    char e2[200];
    if (sf_model_resolve(&c->m, e2, sizeof e2) != 0) {
        sf_errf(err, errlen, "ref build: %s", e2);
        memset(&c->m, 0, sizeof c->m);
        return -1;
    }
    c->cfg = *cfg;
    const size_t nb = (size_t)cfg->max_batch;
    const sf_model *mm = &c->m;
    const size_t in_elems = (size_t)mm->in_c * mm->in_h * mm->in_w;

    c->params = alloc_floats(mm->n_params, 1);
    c->grads = alloc_floats(mm->n_params, 1);
    c->mom = alloc_floats(mm->n_params, 1);
    c->input = alloc_floats(nb, in_elems);
    c->g0 = alloc_floats(nb, mm->max_act);
    c->g1 = alloc_floats(nb, mm->max_act);
    c->aug_tmp_len = in_elems; /* the geometric output has the model's input shape */
    c->aug_tmp = alloc_floats(in_elems, 1);
    c->labels = calloc(nb, sizeof(int32_t));
    int ok = c->params && c->grads && c->mom && c->input && c->g0 && c->g1 && c->aug_tmp && c->labels;
    for (int i = 0; ok && i < mm->n_layers; i++) {
        const sf_layer *L = &mm->layers[i];
        float *prev = i == 0 ? c->input : c->act[i - 1];
        if (L->kind == SF_L_CONV2D || L->kind == SF_L_LINEAR) {
            c->act_buf[i] = alloc_floats(nb, L->out_elems);
            c->act[i] = c->act_buf[i];
            ok = c->act[i] != NULL;
        } else {
            c->act[i] = prev; /* relu in place, flatten a view */
        }
    }
    if (!ok) {
        free_state(c);
        sf_errf(err, errlen, "ref build: out of memory for %s (%zu params, batch %d)", m->preset,
                m->n_params, cfg->max_batch);
        return -1;
    }
    sf_model_init_params(mm, cfg->seed, c->params);
    c->step = 0;
    c->built = 1;
    return 0;
}

static int ref_max_inflight(sf_backend *be) { return 1; }

/* ---- the step ----------------------------------------------------------- */

static void push_event(ref_ctx *c, const sf_event *ev)
{
    /* Room is checked by submit before anything runs. */
    c->fifo[(c->head + c->count) % REF_FIFO_CAP] = *ev;
    c->count++;
}

/* The three stages of sf_ref_augment, with preallocated scratch. */
static void augment(ref_ctx *c, const sf_batch *b, float *out)
{
    const sf_aug_plan *plan = b->plan;
    const size_t in_sz = (size_t)plan->c * plan->in_h * plan->in_w;
    const size_t out_sz = (size_t)plan->c * plan->out_h * plan->out_w;
    for (int i = 0; i < b->n; i++) {
        float *d = out + out_sz * i;
        if (plan->blur_ksize > 1) {
            sf_ref_aug_geometry(plan, &b->samples[i], b->images + in_sz * i, b->nhwc, c->aug_tmp);
            sf_ref_aug_blur(plan, &b->samples[i], c->aug_tmp, d);
        } else {
            sf_ref_aug_geometry(plan, &b->samples[i], b->images + in_sz * i, b->nhwc, d);
        }
        sf_ref_aug_pointwise(plan, &b->samples[i], d);
    }
}

static void forward(ref_ctx *c, int n)
{
    const sf_model *m = &c->m;
    for (int i = 0; i < m->n_layers; i++) {
        const sf_layer *L = &m->layers[i];
        const float *x = i == 0 ? c->input : c->act[i - 1];
        float *y = c->act[i];
        switch (L->kind) {
        case SF_L_CONV2D:
            sf_ref_conv2d_fwd(x, n, L->in_c, L->in_h, L->in_w, c->params + L->w_off,
                              L->n_b ? c->params + L->b_off : NULL, L->out_c, L->k, L->stride, L->pad, y);
            break;
        case SF_L_LINEAR:
            sf_ref_linear_fwd(x, n, L->in_c, c->params + L->w_off, L->n_b ? c->params + L->b_off : NULL,
                              L->out_c, y);
            break;
        case SF_L_RELU:
            sf_ref_relu_fwd(x, (size_t)n * L->out_elems, y);
            break;
        default: /* flatten: a view */
            break;
        }
    }
}

/* Backward from dlogits (in c->g0). */
static void backward(ref_ctx *c, int n)
{
    const sf_model *m = &c->m;
    float *g = c->g0, *other = c->g1;
    for (int i = m->n_layers - 1; i >= 0; i--) {
        const sf_layer *L = &m->layers[i];
        const float *x = i == 0 ? c->input : c->act[i - 1];
        float *dx = i == 0 ? NULL : other; /* no gradient for the input */
        switch (L->kind) {
        case SF_L_CONV2D:
            sf_ref_conv2d_bwd(x, n, L->in_c, L->in_h, L->in_w, c->params + L->w_off, L->out_c, L->k,
                              L->stride, L->pad, g, dx, c->grads + L->w_off,
                              L->n_b ? c->grads + L->b_off : NULL);
            break;
        case SF_L_LINEAR:
            sf_ref_linear_bwd(x, n, L->in_c, c->params + L->w_off, L->out_c, g, dx, c->grads + L->w_off,
                              L->n_b ? c->grads + L->b_off : NULL);
            break;
        case SF_L_RELU:
            sf_ref_relu_bwd(c->act[i], g, (size_t)n * L->out_elems, g); /* in place */
            continue;
        default: /* flatten: same buffer, same layout */
            continue;
        }
        if (dx) {
            other = g;
            g = dx;
        }
    }
}

static int check_batch(ref_ctx *c, const sf_batch *b, int need_model, char *err, size_t errlen)
{
    if (need_model && !c->built) {
        sf_errf(err, errlen, "ref: no model built");
        return -1;
    }
    return sf_batch_check(b, need_model ? &c->m : NULL, c->cfg.max_batch, "ref", err, errlen);
}

/* Labels to int32; returns the index of the first out-of-range label or -1. */
static int convert_labels(ref_ctx *c, const sf_batch *b, int64_t *bad_value)
{
    for (int i = 0; i < b->n; i++) {
        int64_t v;
        switch (b->label_dtype) {
        case SF_LABEL_U8: v = ((const uint8_t *)b->labels)[i]; break;
        case SF_LABEL_I32: v = ((const int32_t *)b->labels)[i]; break;
        default: v = ((const int64_t *)b->labels)[i]; break;
        }
        if (v < 0 || v >= c->m.n_classes) {
            *bad_value = v;
            return i;
        }
        c->labels[i] = (int32_t)v;
    }
    return -1;
}

/* Forward, loss, backward and the SGD update of the n samples in c->input
 * with the labels in c->labels; counts the step. */
static void train_step(ref_ctx *c, int n, const sf_hyper *h, float *loss, int *correct)
{
    forward(c, n);
    sf_ref_xent(c->act[c->m.n_layers - 1], c->labels, n, c->m.n_classes, loss, c->g0, correct);
    backward(c, n);
    sf_ref_sgd(c->params, c->grads, c->mom, c->m.n_params, h->lr, h->momentum, h->weight_decay);
    c->step++;
}

static int ref_submit(sf_backend *be, const sf_batch *b, char *err, size_t errlen)
{
    ref_ctx *c = ctx_of(be);
    if (check_batch(c, b, 1, err, errlen) != 0)
        return -1;
    if (c->count + 2 > REF_FIFO_CAP) {
        sf_errf(err, errlen, "ref: %d events not yet polled; poll before submitting more", c->count);
        return -1;
    }
    const int n = b->n;
    sf_event ev;

    const uint64_t t0 = now_ns();
    augment(c, b, c->input);
    int64_t bad = 0;
    const int bad_at = convert_labels(c, b, &bad);
    const uint64_t t1 = now_ns();

    /* The slot's bytes (images, labels, samples) are consumed. */
    memset(&ev, 0, sizeof ev);
    ev.kind = SF_EV_SLOT_FREE;
    ev.id = b->id;
    ev.token = b->token;
    push_event(c, &ev);

    memset(&ev, 0, sizeof ev);
    ev.kind = SF_EV_STEP_DONE;
    ev.id = b->id;
    ev.token = b->token;
    ev.n = n;
    if (bad_at >= 0) {
        ev.status = -1;
        snprintf(ev.err, sizeof ev.err, "ref: label %lld of sample %d is outside [0,%d)", (long long)bad,
                 bad_at, c->m.n_classes);
        ev.step = c->step;
        ev.t_h2d_start_ns = t0;
        ev.t_transform_start_ns = t0;
        ev.t_step_start_ns = ev.t_step_end_ns = t1;
        ev.transform_s = (double)(t1 - t0) * 1e-9;
        push_event(c, &ev);
        return 0;
    }

    float loss = 0.0f;
    int correct = 0;
    train_step(c, n, &b->hyper, &loss, &correct);
    const uint64_t t2 = now_ns();

    ev.loss = loss;
    ev.correct = correct;
    ev.step = c->step;
    /* No host-to-device copy on the CPU: a zero-length h2d stage. */
    ev.h2d_s = 0.0;
    ev.t_h2d_start_ns = t0;
    ev.t_transform_start_ns = t0;
    ev.transform_s = (double)(t1 - t0) * 1e-9;
    ev.t_step_start_ns = t1;
    ev.t_step_end_ns = t2;
    ev.step_s = (double)(t2 - t1) * 1e-9;
    push_event(c, &ev);
    return 0;
}

static int ref_poll(sf_backend *be, sf_event *ev, int max, int timeout_us)
{
    ref_ctx *c = ctx_of(be);
    if (c->count == 0) {
        /* Nothing can complete while we wait (the backend is synchronous),
         * but the contract lets poll block up to timeout_us; do so, so that
         * an idle engine loop does not spin. */
        if (timeout_us > 0) {
            struct timespec ts = {timeout_us / 1000000, (long)(timeout_us % 1000000) * 1000};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
        }
        return 0;
    }
    int k = 0;
    while (k < max && c->count > 0) {
        ev[k++] = c->fifo[c->head];
        c->head = (c->head + 1) % REF_FIFO_CAP;
        c->count--;
    }
    return k;
}

static int ref_transform(sf_backend *be, const sf_batch *b, float *out, char *err, size_t errlen)
{
    ref_ctx *c = ctx_of(be);
    if (check_batch(c, b, 0, err, errlen) != 0)
        return -1;
    if (!out) {
        sf_errf(err, errlen, "ref: output buffer missing");
        return -1;
    }
    if (b->plan->blur_ksize > 1 &&
        (size_t)b->plan->c * b->plan->out_h * b->plan->out_w > c->aug_tmp_len) {
        /* Not the model's shape (or no model): the stages' one-off path. */
        sf_ref_augment(b->plan, b->samples, b->n, b->images, b->nhwc, out);
        return 0;
    }
    augment(c, b, out);
    return 0;
}

static int ref_get_params(sf_backend *be, float *dst)
{
    ref_ctx *c = ctx_of(be);
    if (!c->built)
        return -1;
    memcpy(dst, c->params, sizeof(float) * c->m.n_params);
    return 0;
}

static int ref_set_params(sf_backend *be, const float *src)
{
    ref_ctx *c = ctx_of(be);
    if (!c->built)
        return -1;
    memcpy(c->params, src, sizeof(float) * c->m.n_params);
    return 0;
}

static int ref_health(sf_backend *be, char *err, size_t errlen) { return 0; }

/* ---- optimizer state ------------------------------------------------------ */

/* The momentum buffer is zeroed by build and touched only by steps with
 * momentum != 0, so it reads as zeros until momentum is first used. */
static int ref_get_opt_state(sf_backend *be, float *momentum, uint64_t *step)
{
    ref_ctx *c = ctx_of(be);
    if (!c->built)
        return -1;
    if (momentum)
        memcpy(momentum, c->mom, sizeof(float) * c->m.n_params);
    if (step)
        *step = c->step;
    return 0;
}

static int ref_set_opt_state(sf_backend *be, const float *momentum, uint64_t step)
{
    ref_ctx *c = ctx_of(be);
    if (!c->built)
        return -1;
    if (momentum)
        memcpy(c->mom, momentum, sizeof(float) * c->m.n_params);
    else
        memset(c->mom, 0, sizeof(float) * c->m.n_params);
    c->step = step;
    return 0;
}

/* ---- the caching method ----------------------------------------------------- */

/* The stages of submit, synchronously, without events: each timed step runs
 * from the stage that mode names on the CPU's "device" (host memory):
 *   SF_BENCH_STEP          b augmented once into c->input; the step alone.
 *   SF_BENCH_AUG_STEP      b's images copied once to a private buffer; then
 *                          augmentation (and label conversion) + step.
 *   SF_BENCH_H2D_AUG_STEP  exactly submit's path from the slot's bytes (there
 *                          is no host-to-device copy on the CPU).
 * Parameters, momentum and the step count are restored afterwards. */
static int ref_bench(sf_backend *be, const sf_batch *b, sf_bench_mode mode, int warmup, int steps,
                     double *seconds, char *err, size_t errlen)
{
    ref_ctx *c = ctx_of(be);
    if (check_batch(c, b, 1, err, errlen) != 0)
        return -1;
    if (mode != SF_BENCH_STEP && mode != SF_BENCH_AUG_STEP && mode != SF_BENCH_H2D_AUG_STEP) {
        sf_errf(err, errlen, "ref bench: unknown mode %d", (int)mode);
        return -1;
    }
    if (warmup < 0 || steps < 1 || !seconds) {
        sf_errf(err, errlen, "ref bench: warmup %d must be >= 0 and steps %d >= 1", warmup, steps);
        return -1;
    }
    int64_t bad = 0;
    const int bad_at = convert_labels(c, b, &bad);
    if (bad_at >= 0) {
        sf_errf(err, errlen, "ref bench: label %lld of sample %d is outside [0,%d)", (long long)bad, bad_at,
                c->m.n_classes);
        return -1;
    }
    const size_t np = c->m.n_params;
    const size_t img_bytes = (size_t)b->n * b->h * b->w * b->c;
    float *save_p = alloc_floats(np, 1), *save_m = alloc_floats(np, 1);
    uint8_t *raw = mode == SF_BENCH_AUG_STEP ? malloc(img_bytes ? img_bytes : 1) : NULL;
    if (!save_p || !save_m || (mode == SF_BENCH_AUG_STEP && !raw)) {
        free(save_p);
        free(save_m);
        free(raw);
        sf_errf(err, errlen, "ref bench: out of memory");
        return -1;
    }
    memcpy(save_p, c->params, sizeof(float) * np);
    memcpy(save_m, c->mom, sizeof(float) * np);
    const uint64_t save_step = c->step;

    sf_batch cached = *b;
    if (mode == SF_BENCH_AUG_STEP) {
        memcpy(raw, b->images, img_bytes);
        cached.images = raw;
    }
    if (mode == SF_BENCH_STEP)
        augment(c, b, c->input);
    uint64_t t0 = 0;
    for (int i = 0; i < warmup + steps; i++) {
        if (i == warmup)
            t0 = now_ns();
        if (mode != SF_BENCH_STEP) {
            augment(c, &cached, c->input);
            convert_labels(c, &cached, &bad);
        }
        float loss = 0.0f;
        int correct = 0;
        train_step(c, b->n, &b->hyper, &loss, &correct);
    }
    const uint64_t t1 = now_ns();
    double s = (double)(t1 - t0) * 1e-9;
    *seconds = s > 0 ? s : 1e-9; /* a clock that did not move still ran the steps */

    memcpy(c->params, save_p, sizeof(float) * np);
    memcpy(c->mom, save_m, sizeof(float) * np);
    c->step = save_step;
    free(save_p);
    free(save_m);
    free(raw);
    return 0;
}

/* No device telemetry on the CPU. */
static int ref_device_stats(sf_backend *be, sf_device_stats *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    return -1;
}

static void ref_destroy(sf_backend *be)
{
    if (!be)
        return;
    ref_ctx *c = ctx_of(be);
    if (c) {
        free_state(c);
        free(c);
    }
    free(be);
}

static const sf_backend_i ref_vtable = {
    .name = ref_name,
    .host_alloc = ref_host_alloc,
    .host_free = ref_host_free,
    .build = ref_build,
    .max_inflight = ref_max_inflight,
    .submit = ref_submit,
    .poll = ref_poll,
    .transform = ref_transform,
    .get_params = ref_get_params,
    .set_params = ref_set_params,
    .health = ref_health,
    .destroy = ref_destroy,
    .get_opt_state = ref_get_opt_state,
    .set_opt_state = ref_set_opt_state,
    .bench = ref_bench,
    .device_stats = ref_device_stats,
};

sf_backend *sf_backend_ref_new(char *err, size_t errlen)
{
    sf_backend *be = calloc(1, sizeof *be);
    ref_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        sf_errf(err, errlen, "ref: out of memory");
        return NULL;
    }
    be->i = &ref_vtable;
    be->ctx = c;
    return be;
}
