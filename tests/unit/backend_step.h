/* tests/unit/backend_step.h — one training batch through a backend, for the
 * tests that drive the reference backend directly: a batch of uint8 NHWC
 * images and uint8 labels with its augmentation plan, and a submit that polls
 * the batch's two events. Include after <cmocka.h>. */
#ifndef SF_TESTS_BACKEND_STEP_H
#define SF_TESTS_BACKEND_STEP_H

#include <math.h>
#include <stdint.h>

#include "gpu/backend.h"

/* n images of h x w x c (NHWC) and their labels, augmented by plan and s, at
 * learning rate lr with AdamW's usual beta1, beta2 and eps (SGD ignores
 * them). The caller sets ids, momentum and whatever else its test varies. */
static inline sf_batch u8_nhwc_batch(int n, int h, int w, int c, const uint8_t *images,
                                     const uint8_t *labels, const sf_aug_plan *plan,
                                     const sf_aug_sample *s, float lr)
{
    sf_batch b = {0};
    b.n = n;
    b.h = h;
    b.w = w;
    b.c = c;
    b.nhwc = 1;
    b.images = images;
    b.label_dtype = SF_LABEL_U8;
    b.labels = labels;
    b.plan = plan;
    b.samples = s;
    b.hyper.lr = lr;
    b.hyper.beta1 = 0.9f;
    b.hyper.beta2 = 0.999f;
    b.hyper.eps = 1e-8f;
    return b;
}

/* Submits b and polls its two events, SLOT_FREE then STEP_DONE; returns
 * STEP_DONE, whose status is the caller's to check. */
static inline sf_event submit_step(sf_backend *be, const sf_batch *b)
{
    char why[256];
    if (be->i->submit(be, b, why, sizeof why) != 0)
        fail_msg("submit: %s", why);
    sf_event ev[4];
    assert_int_equal(be->i->poll(be, ev, 4, 0), 2);
    assert_int_equal(ev[0].kind, SF_EV_SLOT_FREE);
    assert_int_equal(ev[1].kind, SF_EV_STEP_DONE);
    return ev[1];
}

/* submit_step, for a step that must succeed with a finite loss. */
static inline sf_event trained_step(sf_backend *be, const sf_batch *b)
{
    sf_event ev = submit_step(be, b);
    if (ev.status != 0)
        fail_msg("step: %s", ev.err);
    assert_true(isfinite(ev.loss));
    return ev;
}

#endif
