/* server/lr_schedule.c — learning-rate schedules. See lr_schedule.h. */
#include "server/lr_schedule.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/config.h"

int sf_lr_parse_milestones(const char *text, int64_t *out, char *err, size_t errlen)
{
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    if (*p != '[') {
        snprintf(err, errlen, "optim.milestones: expected a JSON list of steps, e.g. [30,60]");
        return -1;
    }
    p++;
    int n = 0;
    for (;;) {
        while (isspace((unsigned char)*p))
            p++;
        if (*p == ']' && n == 0)
            break;
        if (!isdigit((unsigned char)*p)) {
            snprintf(err, errlen, "optim.milestones: expected a non-negative integer at \"%.16s\"", p);
            return -1;
        }
        errno = 0;
        char *end;
        long long v = strtoll(p, &end, 10);
        if (errno || v > 9007199254740991LL) {
            snprintf(err, errlen, "optim.milestones: step out of range");
            return -1;
        }
        if (n == SF_LR_MAX_MILESTONES) {
            snprintf(err, errlen, "optim.milestones: more than %d steps", SF_LR_MAX_MILESTONES);
            return -1;
        }
        if (n > 0 && v <= out[n - 1]) {
            snprintf(err, errlen, "optim.milestones: steps must be strictly increasing");
            return -1;
        }
        out[n++] = v;
        p = end;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == ']')
            break;
        snprintf(err, errlen, "optim.milestones: expected ',' or ']' at \"%.16s\"", p);
        return -1;
    }
    p++;
    while (isspace((unsigned char)*p))
        p++;
    if (*p) {
        snprintf(err, errlen, "optim.milestones: text after the list");
        return -1;
    }
    return n;
}

int sf_lr_sched_from_config(const sf_config *c, sf_lr_sched *s, char *err, size_t errlen)
{
    static const char *const names[] = {"constant", "step", "multistep", "cosine", "one_cycle"};
    memset(s, 0, sizeof *s);
    int kind = -1;
    for (int i = 0; i < 5; i++)
        if (strcmp(c->optim.schedule, names[i]) == 0)
            kind = i;
    if (kind < 0) {
        snprintf(err, errlen, "optim.schedule: unknown schedule \"%s\"", c->optim.schedule);
        return -1;
    }
    s->kind = (sf_lr_kind)kind;
    s->base_lr = c->optim.lr;
    s->step_size = c->optim.step_size;
    s->gamma = c->optim.gamma;
    s->t_max = c->optim.t_max;
    s->eta_min = c->optim.eta_min;
    s->max_lr = c->optim.max_lr;
    s->total_steps = c->optim.total_steps;
    s->pct_start = c->optim.pct_start;
    s->div_factor = c->optim.div_factor;
    s->final_div_factor = c->optim.final_div_factor;
    s->warmup_steps = c->optim.warmup_steps;
    s->warmup_start_factor = c->optim.warmup_start_factor;
    int n = sf_lr_parse_milestones(c->optim.milestones, s->milestones, err, errlen);
    if (n < 0)
        return -1;
    s->n_milestones = n;
    if (s->kind == SF_LR_COSINE && s->t_max < 1) {
        snprintf(err, errlen, "optim.schedule cosine needs optim.t_max >= 1");
        return -1;
    }
    if (s->kind == SF_LR_ONE_CYCLE) {
        if (s->warmup_steps > 0) {
            snprintf(err, errlen, "optim.schedule one_cycle warms up by itself (optim.pct_start): "
                                  "set optim.warmup_steps to 0");
            return -1;
        }
        /* torch divides by both phase lengths: each must be positive. */
        double end1 = s->pct_start * (double)s->total_steps - 1.0;
        if (s->total_steps < 1 || !(end1 > 0) || !(end1 < (double)s->total_steps - 1.0)) {
            snprintf(err, errlen, "optim.schedule one_cycle needs optim.total_steps and "
                                  "optim.pct_start with 1 < pct_start*total_steps < total_steps");
            return -1;
        }
    }
    return 0;
}

/* torch.optim.lr_scheduler._annealing_cos */
static double anneal_cos(double start, double end, double pct)
{
    return end + (start - end) / 2.0 * (cos(M_PI * pct) + 1.0);
}

static double main_lr(const sf_lr_sched *s, uint64_t t)
{
    switch (s->kind) {
    case SF_LR_CONSTANT:
        return s->base_lr;
    case SF_LR_STEP:
        return s->base_lr * pow(s->gamma, (double)(t / (uint64_t)s->step_size));
    case SF_LR_MULTISTEP: {
        int k = 0; /* bisect_right(milestones, t) */
        while (k < s->n_milestones && (uint64_t)s->milestones[k] <= t)
            k++;
        return s->base_lr * pow(s->gamma, (double)k);
    }
    case SF_LR_COSINE:
        return s->eta_min +
               (s->base_lr - s->eta_min) * (1.0 + cos(M_PI * (double)t / (double)s->t_max)) / 2.0;
    case SF_LR_ONE_CYCLE: {
        double initial = s->max_lr / s->div_factor;
        double min_lr = initial / s->final_div_factor;
        /* torch raises past total_steps; here the last value, step
         * total_steps - 1's (min_lr), holds. Clamping at total_steps instead
         * would evaluate the annealing past its end (fraction > 1), which
         * cos() turns back up: step total_steps and every later one trained
         * at the lr of step total_steps - 2. */
        const uint64_t last = s->total_steps > 0 ? (uint64_t)s->total_steps - 1 : 0;
        double st = (double)(t > last ? last : t);
        double end1 = s->pct_start * (double)s->total_steps - 1.0;
        double end2 = (double)s->total_steps - 1.0;
        if (st <= end1)
            return anneal_cos(initial, s->max_lr, st / end1);
        return anneal_cos(s->max_lr, min_lr, (st - end1) / (end2 - end1));
    }
    }
    return s->base_lr;
}

double sf_lr_at(const sf_lr_sched *s, uint64_t t)
{
    uint64_t w = s->warmup_steps > 0 ? (uint64_t)s->warmup_steps : 0;
    if (t < w) {
        /* LinearLR(start_factor, end_factor=1, total_iters=w) on optim.lr. */
        double f = s->warmup_start_factor +
                   (1.0 - s->warmup_start_factor) * (double)t / (double)w;
        return s->base_lr * f;
    }
    return main_lr(s, t - w);
}
