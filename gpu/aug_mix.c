/* gpu/aug_mix.c — batch-level mixing (mixup, cutmix): the per-batch draws
 * that choose the op, whether it applies, lam and cutmix's box. Semantics:
 * gpu/aug.h (stage 5); the draws are listed in gpu/aug.c's opening comment.
 * Both backends mix from the sf_aug_mix drawn here, so they mix alike. */
#include "gpu/aug.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "gpu/rng.h"

#define SF_AUG_MIX_KEY 0x4D495855ull /* "MIXU" */

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

float sf_aug_mix_loss_lam(const sf_aug_mix *mix)
{
    return mix->lam > 0.0f ? mix->lam : FLT_MIN;
}

/* Draw k of batch seq's mixing: a uniform double in [0, 1). */
static double mix_u(uint64_t seed, uint64_t seq, uint64_t k)
{
    return (double)(sf_hash4(seed, seq, SF_AUG_MIX_KEY, k) >> 11) * 0x1p-53;
}

/* A standard normal (Box-Muller) from draws k, k+1. */
static double mix_normal(uint64_t seed, uint64_t seq, uint64_t k)
{
    const double u1 = 1.0 - mix_u(seed, seq, k); /* (0, 1]: log is finite */
    const double u2 = mix_u(seed, seq, k + 1);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Gamma(a, 1) by Marsaglia and Tsang's method (a < 1: Gamma(a + 1) times
 * U^(1/a)), drawing from counter *k on. The rejection loop is bounded; its
 * acceptance rate is above 95%, so the bound is never reached in practice. */
static double mix_gamma(uint64_t seed, uint64_t seq, double a, uint64_t *k)
{
    double boost = 1.0;
    if (a < 1.0) {
        boost = pow(1.0 - mix_u(seed, seq, (*k)++), 1.0 / a);
        a += 1.0;
    }
    const double d = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (int tries = 0; tries < 64; tries++) {
        const double x = mix_normal(seed, seq, *k);
        const double u = 1.0 - mix_u(seed, seq, *k + 2);
        *k += 3;
        double v = 1.0 + c * x;
        if (v <= 0.0)
            continue;
        v = v * v * v;
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v))
            return d * v * boost;
    }
    return d * boost;
}

void sf_aug_gen_mix(const sf_aug_pipeline *p, const sf_aug_plan *plan, uint64_t seed, uint64_t seq,
                    int n, sf_aug_mix *out)
{
    memset(out, 0, sizeof *out);
    out->kind = SF_MIX_NONE;
    out->lam = 1.0f;
    if (!plan->has_mix || n < 2)
        return; /* a batch of one mixed with itself is itself, labels included */
    const sf_aug_op *mixup = NULL, *cutmix = NULL;
    for (int k = 0; k < p->n_ops; k++) {
        if (p->ops[k].kind == SF_AUG_MIXUP)
            mixup = &p->ops[k];
        else if (p->ops[k].kind == SF_AUG_CUTMIX)
            cutmix = &p->ops[k];
    }
    /* Both listed: one of them per batch with equal probability, as
     * torchvision's RandomChoice([MixUp, CutMix]) of its reference recipes. */
    const sf_aug_op *op = mixup && cutmix ? (mix_u(seed, seq, 0) < 0.5 ? mixup : cutmix)
                                          : mixup ? mixup : cutmix;
    if (!op || !(mix_u(seed, seq, 1) < op->p))
        return;
    uint64_t k = 16;
    const double x = mix_gamma(seed, seq, op->alpha, &k);
    const double y = mix_gamma(seed, seq, op->alpha, &k);
    const double lam = x + y > 0.0 ? x / (x + y) : (x >= y ? 1.0 : 0.0);
    if (op->kind == SF_AUG_MIXUP) {
        out->kind = SF_MIX_MIXUP;
        out->lam = (float)lam;
        return;
    }
    /* v2.CutMix: a centre uniform over the pixels, half-sides
     * int(0.5 sqrt(1 - lam) W) and H, clamped to the image; lam becomes
     * 1 - box area / image area. */
    const int W = plan->out_w, H = plan->out_h;
    const int rx = sf_offset_in((float)mix_u(seed, seq, 2), W - 1);
    const int ry = sf_offset_in((float)mix_u(seed, seq, 3), H - 1);
    const double r = 0.5 * sqrt(1.0 - lam);
    const int rw = (int)(r * W), rh = (int)(r * H);
    out->kind = SF_MIX_CUTMIX;
    out->box[0] = rx - rw < 0 ? 0 : rx - rw;
    out->box[1] = ry - rh < 0 ? 0 : ry - rh;
    out->box[2] = rx + rw > W ? W : rx + rw;
    out->box[3] = ry + rh > H ? H : ry + rh;
    out->lam = (float)(1.0 - (double)(out->box[2] - out->box[0]) * (out->box[3] - out->box[1]) /
                                 ((double)W * H));
}
