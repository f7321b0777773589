/* gpu/common.c — see common.h and batch_check.h. */
#include "gpu/batch_check.h"

#include <stdarg.h>
#include <stdio.h>

void sf_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int sf_batch_check(const sf_batch *b, const sf_model *m, int max_batch, const char *who, char *err,
                   size_t errlen)
{
    if (!b || !b->plan || !b->samples || (!b->images && !(b->jpeg && b->jpeg_off))) {
        sf_errf(err, errlen, "%s: batch, plan, samples or images missing", who);
        return -1;
    }
    if (b->jpeg && (b->c != 3 || !b->nhwc)) {
        sf_errf(err, errlen, "%s: an encoded batch decodes to 3-channel HWC, not %d channels", who, b->c);
        return -1;
    }
    const sf_aug_plan *p = b->plan;
    if (b->n < 1) {
        sf_errf(err, errlen, "%s: batch of %d samples", who, b->n);
        return -1;
    }
    if (b->h != p->in_h || b->w != p->in_w || b->c != p->c) {
        sf_errf(err, errlen, "%s: images are %dx%dx%d (HxWxC) but the augmentation plan is for %dx%dx%d",
                who, b->h, b->w, b->c, p->in_h, p->in_w, p->c);
        return -1;
    }
    if (!m)
        return 0;
    if (b->n > max_batch) {
        sf_errf(err, errlen, "%s: batch of %d samples exceeds max_batch %d", who, b->n, max_batch);
        return -1;
    }
    if (p->c != m->in_c || p->out_h != m->in_h || p->out_w != m->in_w) {
        sf_errf(err, errlen,
                "%s: augmentation output %dx%dx%d (CxHxW) does not match the model input %dx%dx%d", who,
                p->c, p->out_h, p->out_w, m->in_c, m->in_h, m->in_w);
        return -1;
    }
    if (!b->labels) {
        sf_errf(err, errlen, "%s: labels missing", who);
        return -1;
    }
    if (b->label_dtype != SF_LABEL_U8 && b->label_dtype != SF_LABEL_I32 && b->label_dtype != SF_LABEL_I64) {
        sf_errf(err, errlen, "%s: unknown label dtype %d", who, (int)b->label_dtype);
        return -1;
    }
    return 0;
}

uint64_t sf_hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
