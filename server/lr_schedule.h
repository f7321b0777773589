/* server/lr_schedule.h — learning-rate schedules (optim.schedule), computed on
 * the host once per optimizer step and passed to the backend with every batch
 * (sf_batch.hyper.lr).
 *
 * The schedule is a pure function of the options and of the optimizer step
 * t (counting from 0, as torch does after t scheduler.step() calls): there is
 * no other state, so a checkpoint's optimizer step count is the scheduler's
 * position and a restored run continues the schedule from it.
 *
 * Each schedule matches the closed form of its torch.optim.lr_scheduler
 * counterpart (StepLR, MultiStepLR, CosineAnnealingLR, OneCycleLR with
 * anneal_strategy="cos"); a linear warmup (LinearLR from warmup_start_factor
 * to 1 over warmup_steps) is composed in front like SequentialLR with the
 * milestone [warmup_steps]: the main schedule then starts at its own step 0. */
#ifndef SF_LR_SCHEDULE_H
#define SF_LR_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

struct sf_config;

#define SF_LR_MAX_MILESTONES 64

typedef enum sf_lr_kind {
    SF_LR_CONSTANT, SF_LR_STEP, SF_LR_MULTISTEP, SF_LR_COSINE, SF_LR_ONE_CYCLE
} sf_lr_kind;

typedef struct sf_lr_sched {
    sf_lr_kind kind;
    double base_lr;                /* optim.lr (not used by one_cycle) */
    int64_t step_size;             /* step */
    double gamma;                  /* step, multistep */
    int n_milestones;              /* multistep: strictly increasing steps */
    int64_t milestones[SF_LR_MAX_MILESTONES];
    int64_t t_max;                 /* cosine */
    double eta_min;                /* cosine */
    double max_lr, pct_start;      /* one_cycle */
    int64_t total_steps;           /* one_cycle */
    double div_factor, final_div_factor; /* one_cycle */
    int64_t warmup_steps;          /* 0: no warmup */
    double warmup_start_factor;    /* (0, 1] */
} sf_lr_sched;

/* The schedule the options describe. 0, or -1 with err saying what is
 * inconsistent (e.g. cosine with optim.t_max 0, milestones not increasing). */
int sf_lr_sched_from_config(const struct sf_config *c, sf_lr_sched *s, char *err, size_t errlen);

/* Parses optim.milestones: a JSON list of at most SF_LR_MAX_MILESTONES
 * strictly increasing non-negative integers. Returns the count, or -1 with err. */
int sf_lr_parse_milestones(const char *text, int64_t *out, char *err, size_t errlen);

/* The learning rate of optimizer step t (0-based). */
double sf_lr_at(const sf_lr_sched *s, uint64_t t);

#endif
