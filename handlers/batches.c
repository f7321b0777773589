/* handlers/batches.c — POST /v1/batches and GET /v1/batches/{id}. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers/handlers.h"
#include "server/app.h"
#include "server/clock.h"
#include "server/evals.h"
#include "server/jobs.h"
#include "server/kept_logits.h"
#include "server/ring.h"
#include "server/upload.h"

/* A query value as it may be quoted in an error message: at most 32
 * printable ASCII characters, any other byte as '?', so that the reply stays
 * valid UTF-8 JSON whatever the client sent. */
static const char *quotable(const char *v, char out[33])
{
    size_t i = 0;
    for (; v[i] && i < 32; i++)
        out[i] = v[i] >= 0x20 && v[i] < 0x7f ? v[i] : '?';
    out[i] = 0;
    return out;
}

/* Refuses a bad query with one reply and one count; returns -1. field names
 * the parameter at fault (NULL when none is). */
static int refuse_query(sf_req *r, int status, const char *code, const char *field, const char *msg)
{
    sf_upload_on_rejected(r, code);
    return sf_reply_error_field(r, status, code, field, "%s", msg), -1;
}

/* The query, checked with the head: a bad one is refused before any body
 * byte is read (a client waiting for 100 Continue is told at once), not
 * after the batch trained. */
static int batches_head(sf_req *r)
{
    char msg[200], q[33];
    const char *w = sf_req_arg(r, "wait");
    if (w && strcmp(w, "0") != 0 && strcmp(w, "1") != 0) {
        snprintf(msg, sizeof msg, "wait must be 0 or 1, not \"%s\"", quotable(w, q));
        return refuse_query(r, 400, "bad_query", "wait", msg);
    }
    const char *mode = sf_req_arg(r, "mode"), *name = sf_req_arg(r, "eval"), *ret = sf_req_arg(r, "return");
    if (mode && strcmp(mode, "train") != 0 && strcmp(mode, "eval") != 0) {
        snprintf(msg, sizeof msg, "mode must be train or eval, not \"%s\"", quotable(mode, q));
        return refuse_query(r, 400, "bad_query", "mode", msg);
    }
    const int eval = mode && strcmp(mode, "eval") == 0;
    if ((name || ret) && !eval)
        return refuse_query(r, 400, "bad_query", name ? "eval" : "return",
                            "eval= and return= go with mode=eval only");
    if (ret && strcmp(ret, "logits") != 0) {
        snprintf(msg, sizeof msg, "return must be logits, not \"%s\"", quotable(ret, q));
        return refuse_query(r, 400, "bad_query", "return", msg);
    }
    if (ret && !(w && strcmp(w, "1") == 0))
        return refuse_query(r, 400, "bad_query", "wait",
                            "return=logits needs wait=1: the logits are the reply (kept for "
                            "GET /v1/batches/{id}/logits only when that wait runs out)");
    if (name && !sf_eval_name_valid(name)) {
        snprintf(msg, sizeof msg, "eval must be 1 to %d characters of A-Z a-z 0-9 _ . -", SF_EVAL_NAME_MAX);
        return refuse_query(r, 400, "bad_eval_name", "eval", msg);
    }
    if (eval && !r->app->backend)
        return refuse_query(r, 409, "no_backend", NULL,
                            "eval batches need a compute backend (pipeline.mode=train)");
    /* Tested here, before the body is read; the name is reserved only
     * when the batch is accepted (sf_upload_commit), so a refused batch
     * creates no evaluation. */
    if (eval && !sf_evals_has_room(r->app->evals, name ? name : SF_EVAL_DEFAULT_NAME,
                                   sf_evals_idle_ns(sf_config_cur()->eval.name_idle_s))) {
        sf_evals_full_message(r->app->evals, msg, sizeof msg);
        return refuse_query(r, 409, "too_many_evals", "eval", msg);
    }
    return 0;
}

static int batches_data(sf_req *r, const uint8_t *data, size_t *len)
{
    return sf_upload_on_data(r, 0, data, len);
}

const sf_stream_ops h_batches_stream = {batches_data, sf_upload_on_done, sf_upload_max_body,
                                        sf_upload_on_rejected, SF_UPLOAD_MAX_BODY_OPTION, batches_head};

static int reply_job(sf_req *r, uint64_t id, int status)
{
    sf_job job;
    if (sf_jobs_get(r->app->jobs, id, &job))
        return sf_reply_error(r, 404, "batch_not_found",
                              "batch %llu is unknown or its result was evicted",
                              (unsigned long long)id);
    return sf_reply_json(r, status, sf_job_to_json(&job));
}

/* ?wait=1: hold the reply until the job is done, without holding a thread. */
static int wait_for_job(sf_req *r, uint64_t id)
{
    const sf_config *c = sf_config_cur();
    for (;;) {
        uint64_t gen = sf_http_gen(r->app->http, SF_WAIT_JOB);
        sf_job job;
        if (sf_jobs_get(r->app->jobs, id, &job))
            return reply_job(r, id, 200);
        sf_upload *u = r->user;
        if (job.state == SF_JOB_DONE && u && u->want_logits) {
            /* the logits, as safetensors: a sample left out (its file did
             * not decode) has a row of NaN, and this header lists them */
            if (job.n_undecodable > 0) {
                char list[1024];
                sf_job_undecodable_list(&job, list, sizeof list);
                sf_reply_header(r, "Streamfeed-Skipped-Samples", list);
            }
            return sf_upload_transform_reply(r);
        }
        if (job.state == SF_JOB_DONE || job.state == SF_JOB_FAILED)
            return sf_reply_json(r, 200, sf_job_to_json(&job));
        if (r->wait == SF_WAIT_TIMEOUT || r->wait == SF_WAIT_SHUTDOWN) {
            if (u && u->want_logits) {
                /* The 202 promises the logits: they are kept for GET
                 * /v1/batches/{id}/logits, which Location names, within
                 * eval.logits_keep_*; this request will not send them, so
                 * they no longer count as a reply its client has yet to read. */
                sf_kept_logits_put(r->app->kept_logits, id, u->out, sf_now_ns());
                sf_xform_out_release_share(u->out);
                char where[64];
                snprintf(where, sizeof where, "/v1/batches/%llu/logits", (unsigned long long)id);
                sf_reply_header(r, "Location", where);
                if (sf_jobs_get(r->app->jobs, id, &job))
                    return reply_job(r, id, 202);
            }
            return sf_reply_json(r, 202, sf_job_to_json(&job)); /* still running: the state so far */
        }
        if (sf_http_wait(r, SF_WAIT_JOB, id, gen, c->pipeline.wait_timeout_ms) == 0)
            return 0;
    }
}

static int wants_wait(sf_req *r)
{
    const char *w = sf_req_arg(r, "wait");
    return w && strcmp(w, "1") == 0;
}

int h_batches_post(sf_req *r)
{
    sf_upload *u = r->user;
    if (u && u->committed) /* woken while waiting for the result */
        return wait_for_job(r, u->job_id);
    uint64_t id;
    if (sf_upload_commit(r, &id))
        return -1;
    if (wants_wait(r)) {
        r->wait = SF_WAIT_NONE;
        return wait_for_job(r, id);
    }
    int counts[SF_SLOT_STATES];
    sf_ring_counts(r->app->ring, counts);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddNumberToObject(o, "queued", counts[SF_SLOT_READY]);
    cJSON *ring = cJSON_AddObjectToObject(o, "ring");
    cJSON_AddNumberToObject(ring, "slots", sf_ring_slots(r->app->ring));
    cJSON_AddNumberToObject(ring, "free", counts[SF_SLOT_FREE]);
    return sf_reply_json(r, 202, o);
}

/* The {id} of the path, or 0 after a 400 reply. */
static uint64_t batch_id_of(sf_req *r)
{
    char *end;
    errno = 0;
    unsigned long long id = strtoull(r->param, &end, 10);
    /* Digits only: strtoull also takes leading blanks and a sign. */
    if (errno || *end || r->param[0] < '0' || r->param[0] > '9' || id == 0) {
        sf_reply_error(r, 400, "bad_batch_id", "batch id \"%s\" is not a positive integer", r->param);
        return 0;
    }
    r->batch_id = id;
    return id;
}

int h_batches_get(sf_req *r)
{
    uint64_t id = batch_id_of(r);
    if (!id)
        return -1;
    /* This route answers at once. A wait=1 here would be read as a wait that
     * did not happen, and any other value is refused as on every route. */
    const char *w = sf_req_arg(r, "wait");
    char q[33];
    if (w && strcmp(w, "1") == 0)
        return sf_reply_error_field(r, 400, "bad_query", "wait",
                                    "GET /v1/batches/{id} does not wait (wait may only be 0 here); "
                                    "POST /v1/batches?wait=1 and GET /v1/batches/{id}/logits?wait=1 do");
    if (w && strcmp(w, "0") != 0)
        return sf_reply_error_field(r, 400, "bad_query", "wait", "wait must be 0 or 1, not \"%s\"",
                                    quotable(w, q));
    return reply_job(r, id, 200);
}

/* GET /v1/batches/{id}/logits[?wait=1]: the logits a timed-out ?return=logits
 * left behind (server/kept_logits.h); with wait=1, once the batch ran. */
/* Replies with kept logits and lets go of this reference. */
static int reply_kept(sf_req *r, sf_xform_out *o)
{
    int rc = sf_xform_out_reply(r, o);
    sf_xform_out_release(o);
    return rc;
}

int h_batches_logits(sf_req *r)
{
    uint64_t id = batch_id_of(r);
    if (!id)
        return -1;
    const char *w = sf_req_arg(r, "wait");
    if (w && strcmp(w, "0") != 0 && strcmp(w, "1") != 0) {
        char q[33];
        return sf_reply_error_field(r, 400, "bad_query", "wait", "wait must be 0 or 1, not \"%s\"",
                                    quotable(w, q));
    }
    const sf_config *c = sf_config_cur();
    for (;;) {
        uint64_t gen = sf_http_gen(r->app->http, SF_WAIT_JOB);
        sf_job job;
        if (sf_jobs_get(r->app->jobs, id, &job)) {
            /* The batch's entry was evicted (pipeline.jobs_max newer batches)
             * while its logits are still kept: the 202 promised them until
             * they are let go, so they stay readable. */
            sf_xform_out *o = sf_kept_logits_get(r->app->kept_logits, id, sf_now_ns());
            return o ? reply_kept(r, o) : reply_job(r, id, 200);
        }
        if (job.logits == SF_JOB_LOGITS_NONE)
            return sf_reply_error(r, 404, "logits_not_kept",
                                  "batch %llu's logits were not kept: only a ?mode=eval&return=logits&wait=1 "
                                  "whose wait ran out (a 202) keeps them",
                                  (unsigned long long)id);
        if (job.state == SF_JOB_FAILED)
            return sf_reply_error(r, 409, "batch_failed", "batch %llu failed (%s): it has no logits",
                                  (unsigned long long)id, job.err_code);
        sf_xform_out *o = NULL;
        if (job.logits == SF_JOB_LOGITS_EXPIRED ||
            (job.state == SF_JOB_DONE && !(o = sf_kept_logits_get(r->app->kept_logits, id, sf_now_ns()))))
            return sf_reply_error(r, 410, "logits_expired",
                                  "batch %llu's logits were let go (eval.logits_keep_s, "
                                  "eval.logits_keep_max or eval.logits_keep_bytes)",
                                  (unsigned long long)id);
        if (o)
            return reply_kept(r, o);
        if (!(w && strcmp(w, "1") == 0) || r->wait == SF_WAIT_TIMEOUT || r->wait == SF_WAIT_SHUTDOWN)
            return sf_reply_json(r, 202, sf_job_to_json(&job)); /* still running: the state so far */
        if (sf_http_wait(r, SF_WAIT_JOB, id, gen, c->pipeline.wait_timeout_ms) == 0)
            return 0;
    }
}
