/* server/jobs.c — see jobs.h. */
#include "server/jobs.h"

#include "server/image_header.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct sf_jobs {
    pthread_mutex_t mu;
    int cap;
    sf_job *e;
    uint64_t next_id;
    uint64_t counts[SF_JOB_STATES];
};

sf_jobs *sf_jobs_new(int cap)
{
    sf_jobs *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->e = calloc((size_t)cap, sizeof *j->e);
    if (!j->e) {
        free(j);
        return NULL;
    }
    j->cap = cap;
    j->next_id = 1;
    pthread_mutex_init(&j->mu, NULL);
    return j;
}

void sf_jobs_destroy(sf_jobs *j)
{
    if (!j)
        return;
    pthread_mutex_destroy(&j->mu);
    free(j->e);
    free(j);
}

static sf_job *find(sf_jobs *j, uint64_t id)
{
    sf_job *e = &j->e[id % (uint64_t)j->cap];
    return (id != 0 && e->id == id) ? e : NULL;
}

uint64_t sf_jobs_create(sf_jobs *j, int n, int kind)
{
    pthread_mutex_lock(&j->mu);
    uint64_t id = j->next_id++;
    sf_job *e = &j->e[id % (uint64_t)j->cap];
    memset(e, 0, sizeof *e);
    e->id = id;
    e->n = n;
    e->kind = kind;
    e->state = SF_JOB_QUEUED;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    e->t_accepted_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    j->counts[SF_JOB_QUEUED]++;
    pthread_mutex_unlock(&j->mu);
    return id;
}

void sf_jobs_set_eval_name(sf_jobs *j, uint64_t id, const char *name)
{
    pthread_mutex_lock(&j->mu);
    sf_job *e = find(j, id);
    if (e)
        snprintf(e->eval_name, sizeof e->eval_name, "%s", name);
    pthread_mutex_unlock(&j->mu);
}

void sf_jobs_set_logits(sf_jobs *j, uint64_t id, sf_job_logits l)
{
    pthread_mutex_lock(&j->mu);
    sf_job *e = find(j, id);
    if (e)
        e->logits = l;
    pthread_mutex_unlock(&j->mu);
}

int sf_jobs_get(sf_jobs *j, uint64_t id, sf_job *out)
{
    pthread_mutex_lock(&j->mu);
    sf_job *e = find(j, id);
    if (e)
        *out = *e;
    pthread_mutex_unlock(&j->mu);
    return e ? 0 : -1;
}

static void set_state_locked(sf_jobs *j, sf_job *e, sf_job_state s)
{
    j->counts[e->state]--;
    e->state = s;
    j->counts[s]++;
}

void sf_jobs_set_state(sf_jobs *j, uint64_t id, sf_job_state s)
{
    pthread_mutex_lock(&j->mu);
    sf_job *e = find(j, id);
    if (e && e->state < SF_JOB_DONE)
        set_state_locked(j, e, s);
    pthread_mutex_unlock(&j->mu);
}

void sf_jobs_done(sf_jobs *j, const sf_job *r)
{
    pthread_mutex_lock(&j->mu);
    sf_job *e = find(j, r->id);
    if (e && e->state < SF_JOB_DONE) {
        sf_job_state prev = e->state;
        uint64_t t0 = e->t_accepted_ns;
        int kind = e->kind;
        sf_job_logits logits = e->logits; /* set by the request, not the engine */
        *e = *r;
        e->t_accepted_ns = t0;
        e->kind = kind;
        e->logits = logits;
        e->state = prev;
        set_state_locked(j, e, SF_JOB_DONE);
    }
    pthread_mutex_unlock(&j->mu);
}

void sf_jobs_fail(sf_jobs *j, uint64_t id, const char *code, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    sf_job *e = find(j, id);
    if (e && e->state < SF_JOB_DONE) {
        snprintf(e->err_code, sizeof e->err_code, "%s", code);
        snprintf(e->err_msg, sizeof e->err_msg, "%s", msg);
        set_state_locked(j, e, SF_JOB_FAILED);
    }
    pthread_mutex_unlock(&j->mu);
}

void sf_jobs_counts(sf_jobs *j, uint64_t counts[SF_JOB_STATES], uint64_t *accepted)
{
    pthread_mutex_lock(&j->mu);
    memcpy(counts, j->counts, sizeof j->counts);
    *accepted = j->next_id - 1;
    pthread_mutex_unlock(&j->mu);
}

uint64_t sf_jobs_last_id(sf_jobs *j)
{
    pthread_mutex_lock(&j->mu);
    uint64_t id = j->next_id - 1;
    pthread_mutex_unlock(&j->mu);
    return id;
}

const char *sf_job_state_name(sf_job_state s)
{
    static const char *const names[] = {"queued", "transforming", "training", "done", "failed"};
    return (unsigned)s < SF_JOB_STATES ? names[s] : "unknown";
}

static void add_num_or_null(cJSON *o, const char *k, int has, double v)
{
    if (has)
        cJSON_AddNumberToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

void sf_job_set_undecodable(sf_job *job, const uint8_t *flags, int n)
{
    job->n_undecodable = 0;
    for (int i = 0; flags && i < n; i++) {
        if (!flags[i])
            continue;
        if (job->n_undecodable < SF_JOB_LISTED_UNDECODABLE) {
            job->undecodable[job->n_undecodable] = i;
            job->undecodable_format[job->n_undecodable] = (uint8_t)(flags[i] - 1);
        }
        job->n_undecodable++;
    }
}

void sf_job_undecodable_list(const sf_job *job, char *buf, size_t len)
{
    size_t at = 0;
    if (len)
        buf[0] = '\0';
    const int listed = job->n_undecodable < SF_JOB_LISTED_UNDECODABLE ? job->n_undecodable
                                                                      : SF_JOB_LISTED_UNDECODABLE;
    for (int k = 0; k < listed && at < len; k++) {
        int w = snprintf(buf + at, len - at, "%s%d", k ? "," : "", (int)job->undecodable[k]);
        if (w < 0 || (size_t)w >= len - at) {
            buf[at] = '\0'; /* a cut list ends at the last whole index */
            break;
        }
        at += (size_t)w;
    }
}

cJSON *sf_job_to_json(const sf_job *job)
{
    cJSON *o = cJSON_CreateObject();
    int done = job->state == SF_JOB_DONE;
    int train = (job->kind == SF_JOB_KIND_TRAIN || job->kind == SF_JOB_KIND_EVAL) && job->trained;
    cJSON_AddNumberToObject(o, "id", (double)job->id);
    cJSON_AddStringToObject(o, "state", sf_job_state_name(job->state));
    cJSON_AddStringToObject(o, "kind", job->kind == SF_JOB_KIND_TRAIN       ? "train"
                                       : job->kind == SF_JOB_KIND_EVAL ? "eval"
                                                                       : "transform");
    cJSON_AddNumberToObject(o, "n", job->n);
    add_num_or_null(o, "step", done && train, (double)job->step);
    add_num_or_null(o, "loss", done && train, job->loss);
    add_num_or_null(o, "accuracy", done && train, job->accuracy);
    if (job->kind == SF_JOB_KIND_EVAL) {
        /* An eval batch's accuracy is its top-1; top-5 and its evaluation's name beside it. */
        add_num_or_null(o, "top1", done && train, job->accuracy);
        add_num_or_null(o, "top5", done && train, job->top5);
        cJSON_AddStringToObject(o, "eval", job->eval_name);
        if (job->logits != SF_JOB_LOGITS_NONE)
            cJSON_AddStringToObject(o, "logits", job->logits == SF_JOB_LOGITS_KEPT ? "kept" : "expired");
    }
    if (job->kind == SF_JOB_KIND_TRAIN) {
        if (done && job->skipped)
            cJSON_AddStringToObject(o, "skipped", "nonfinite");
        else
            cJSON_AddNullToObject(o, "skipped");
    }
    /* The samples the decoder refused and the batch left out
     * (decode.on_undecodable skip): the first SF_JOB_LISTED_UNDECODABLE by
     * index, and how many were trained, so that a longer list shows as cut. */
    cJSON *sk = cJSON_AddArrayToObject(o, "skipped_samples");
    const int listed = job->n_undecodable < SF_JOB_LISTED_UNDECODABLE ? job->n_undecodable
                                                                      : SF_JOB_LISTED_UNDECODABLE;
    for (int k = 0; k < listed; k++) {
        cJSON *e = cJSON_CreateObject();
        char field[32];
        snprintf(field, sizeof field, "%s[%d]", job->files_named_jpeg ? "jpeg" : "files", (int)job->undecodable[k]);
        const char *fmt = sf_image_format_name((sf_image_format)job->undecodable_format[k]);
        char code[32];
        snprintf(code, sizeof code, "%s_undecodable", fmt ? fmt : "jpeg");
        cJSON_AddNumberToObject(e, "index", job->undecodable[k]);
        cJSON_AddStringToObject(e, "field", field);
        cJSON_AddStringToObject(e, "code", code);
        cJSON_AddItemToArray(sk, e);
    }
    add_num_or_null(o, "samples_trained", done && train, (double)(job->n - job->n_undecodable));
    cJSON *t = cJSON_AddObjectToObject(o, "timings");
    add_num_or_null(t, "queue_s", done, job->queue_s);
    add_num_or_null(t, "h2d_s", done, job->h2d_s);
    add_num_or_null(t, "transform_s", done, job->transform_s);
    add_num_or_null(t, "step_s", done && train, job->step_s);
    if (job->state == SF_JOB_FAILED) {
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "code", job->err_code);
        cJSON_AddStringToObject(e, "message", job->err_msg);
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    return o;
}
