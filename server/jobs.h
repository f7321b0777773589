/* server/jobs.h — the table of batch jobs and their results.
 *
 * Job ids increase monotonically from 1. The table is a ring of `cap` entries
 * indexed by id % cap: a new job overwrites the entry of the job `cap` ids
 * older, which is long finished because config requires cap to exceed
 * everything that can be in flight (2*ring.slots+64). So eviction of the
 * oldest finished results is implicit, lookups are O(1) and memory is bounded.
 *
 * Counters satisfy, at every instant under the table's lock:
 *   accepted == done + failed + queued + transforming + training.
 * Thread-safe: HTTP threads create and read jobs, the engine updates them.
 */
#ifndef SF_JOBS_H
#define SF_JOBS_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

typedef enum sf_job_state { SF_JOB_QUEUED = 0, SF_JOB_TRANSFORMING, SF_JOB_TRAINING, SF_JOB_DONE, SF_JOB_FAILED, SF_JOB_STATES } sf_job_state;

enum { SF_JOB_KIND_TRAIN = 0, SF_JOB_KIND_TRANSFORM = 1, SF_JOB_KIND_EVAL = 2 };

/* An eval batch's logits after a ?return=logits wait ran out (server/kept_logits.h). */
typedef enum sf_job_logits { SF_JOB_LOGITS_NONE = 0, SF_JOB_LOGITS_KEPT, SF_JOB_LOGITS_EXPIRED } sf_job_logits;

/* Samples left out a job lists by index; samples_trained says how many more there were. */
#define SF_JOB_LISTED_UNDECODABLE 64

typedef struct sf_job {
    uint64_t id;
    sf_job_state state;
    int n;
    int kind;              /* 0 train, 1 transform, 2 eval (SF_JOB_KIND_*) */
    int trained;           /* a step (or an eval forward) ran (not sink mode, not transform) */
    uint64_t step;         /* optimizer step count after this batch */
    double loss, accuracy;
    double top5;           /* eval: share of samples whose label is among the 5 largest logits */
    int skipped;           /* train: the optimizer step was skipped (a NaN/Inf loss or gradient) */
    /* Samples left out because the decoder refused their files
     * (decode.on_undecodable skip): how many, and the first
     * SF_JOB_LISTED_UNDECODABLE indices in order. */
    int n_undecodable;
    int32_t undecodable[SF_JOB_LISTED_UNDECODABLE];
    uint8_t undecodable_format[SF_JOB_LISTED_UNDECODABLE]; /* each one's sf_image_format: its code */
    int files_named_jpeg;  /* the body named its files "jpeg" (the alias), not "files" */
    char eval_name[65];    /* eval: the evaluation it belongs to */
    sf_job_logits logits;  /* eval: its logits kept for GET /v1/batches/{id}/logits, or expired */
    double queue_s, h2d_s, transform_s, step_s;
    uint64_t t_accepted_ns, t_done_ns;
    char err_code[48];
    char err_msg[160];
} sf_job;

typedef struct sf_jobs sf_jobs;

sf_jobs *sf_jobs_new(int cap);
void sf_jobs_destroy(sf_jobs *j);
/* Creates a QUEUED job and returns its id. */
uint64_t sf_jobs_create(sf_jobs *j, int n, int kind);
/* An eval job's evaluation name, shown from the start (failures included). */
void sf_jobs_set_eval_name(sf_jobs *j, uint64_t id, const char *name);
/* Whether the job's logits are kept or expired (server/kept_logits.c). */
void sf_jobs_set_logits(sf_jobs *j, uint64_t id, sf_job_logits l);
/* Copies a job; -1 when unknown or evicted. */
int sf_jobs_get(sf_jobs *j, uint64_t id, sf_job *out);
void sf_jobs_set_state(sf_jobs *j, uint64_t id, sf_job_state s);
/* Final states. */
void sf_jobs_done(sf_jobs *j, const sf_job *result);
void sf_jobs_fail(sf_jobs *j, uint64_t id, const char *code, const char *msg);
/* Counts per state over all jobs ever created (not only those retained). */
void sf_jobs_counts(sf_jobs *j, uint64_t counts[SF_JOB_STATES], uint64_t *accepted);
uint64_t sf_jobs_last_id(sf_jobs *j);

const char *sf_job_state_name(sf_job_state s);
/* Sets a job's samples left out (decode.on_undecodable skip) from n flags:
 * 0 for a sample trained, 1 + its file's sf_image_format for one left out. */
void sf_job_set_undecodable(sf_job *job, const uint8_t *flags, int n);
/* "1,3,7": the listed samples left out, for a header; "" when none. */
void sf_job_undecodable_list(const sf_job *job, char *buf, size_t len);
/* The JSON of GET /v1/batches/{id}. */
cJSON *sf_job_to_json(const sf_job *job);

#endif
