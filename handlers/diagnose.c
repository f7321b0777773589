/* handlers/diagnose.c — POST /v1/diagnose: the caching method (server/diagnose.h).
 *
 * The body is optional: {"seconds": s} (default diagnose.default_seconds, at
 * most diagnose.max_seconds, and a quarter of distributed.timeout_s on a rank
 * of a data-parallel job). The run is an engine command; the request is
 * suspended until it finished (SF_WAIT_CMD), and keeps nothing but the run's
 * id (in r->user), so a client that goes away leaves nothing behind; its run
 * is cancelled then (SF_ROUTE_ON_GONE), so that training does not stay
 * paused for a result nobody reads.
 */
#include <stdint.h>
#include <string.h>

#include "handlers/handlers.h"
#include "server/app.h"
#include "server/diagnose.h"
#include "server/distributed.h"

/* Longest hold of the reply: the run itself takes about `seconds` (plus the
 * calibration steps and the batches in flight ahead of it). */
static int wait_limit_ms(double seconds) { return (int)(seconds * 4000.0) + 60000; }

static int parse_seconds(sf_req *r, double *seconds)
{
    sf_config c;
    sf_config_get(&c);
    /* On a rank of a data-parallel job the other ranks wait for this one in
     * the next round, up to distributed.timeout_s, while its engine runs the
     * diagnosis (up to about 4 x seconds with calibration and the batches
     * ahead of it: wait_limit_ms): longer runs would break the job. */
    double max = c.diagnose.max_seconds;
    const int dist = sf_distributed_world(r->app->dist) > 1;
    if (dist && max > c.distributed.timeout_s / 4.0)
        max = c.distributed.timeout_s / 4.0;
    *seconds = c.diagnose.default_seconds < max ? c.diagnose.default_seconds : max;
    if (!r->body || r->body_len == 0)
        return 0;
    cJSON *j = h_parse_json_body(r);
    if (!j)
        return -1;
    if (!cJSON_IsObject(j)) {
        sf_reply_error(r, 400, "body_not_object",
                       "the body must be a JSON object like {\"seconds\": 3}");
        goto out;
    }
    for (const cJSON *kv = j->child; kv; kv = kv->next) {
        if (strcmp(kv->string, "seconds") != 0) {
            sf_reply_error_field(r, 400, "unknown_field", kv->string,
                                 "unknown field \"%.64s\"; the body takes only \"seconds\"",
                                 kv->string);
            goto out;
        }
    }
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "seconds");
    if (s) {
        if (!cJSON_IsNumber(s)) {
            sf_reply_error_field(r, 400, "seconds_invalid", "seconds", "seconds must be a number");
            goto out;
        }
        if (!(s->valuedouble >= 0.1 && s->valuedouble <= max)) {
            sf_reply_error_field(r, 400, "seconds_out_of_range", "seconds", "seconds must be in [0.1, %g] (%s)", max,
                                 max < c.diagnose.max_seconds
                                     ? "a quarter of distributed.timeout_s on a rank of a data-parallel job"
                                     : "diagnose.max_seconds");
            goto out;
        }
        *seconds = s->valuedouble;
    }
out:
    cJSON_Delete(j);
    return r->status ? -1 : 0;
}

static int start(sf_req *r, uint64_t *id, double *seconds)
{
    if (parse_seconds(r, seconds))
        return -1;
    if (atomic_load(&r->app->draining)) {
        sf_reply_header(r, "Retry-After", "1");
        return sf_reply_error(r, 503, "shutting_down", "the service is shutting down"), -1;
    }
    char err[256];
    switch (sf_diagnose_start(r->app, *seconds, id, err, sizeof err)) {
    case SF_DIAG_OK:
        return 0;
    case SF_DIAG_E_RUNNING:
        return sf_reply_error(r, 409, "diagnose_running", "%s", err), -1;
    case SF_DIAG_E_NO_BACKEND:
        return sf_reply_error(r, 409, "no_backend", "%s", err), -1;
    case SF_DIAG_E_UNSUPPORTED:
        return sf_reply_error(r, 501, "diagnose_unsupported", "%s", err), -1;
    case SF_DIAG_E_NOMEM:
        sf_reply_header(r, "Retry-After", "1");
        return sf_reply_error(r, 503, "out_of_memory", "%s", err), -1;
    case SF_DIAG_E_JOINING:
        sf_reply_header(r, "Retry-After", "5");
        return sf_reply_error(r, 503, "distributed_unavailable", "%s", err), -1;
    default:
        sf_reply_header(r, "Retry-After", "1");
        return sf_reply_error(r, 503, "engine_busy", "%s", err), -1;
    }
}

/* A data-parallel rank adds the stage its peers share: the gradient
 * all-reduce. It cannot be replayed alone (the other ranks must take part),
 * so it is the live mean of the rounds so far, measured by the backend. */
static cJSON *with_allreduce(sf_app *app, cJSON *o)
{
    h_add_rank(app, o);
    if (!app->dist)
        return o;
    uint64_t rounds = 0;
    double total = 0;
    sf_distributed_allreduce_totals(app->dist, &rounds, &total);
    cJSON *stages = cJSON_GetObjectItemCaseSensitive(o, "stages");
    const cJSON *first = stages ? cJSON_GetArrayItem(stages, 0) : NULL;
    const cJSON *r0 = first ? cJSON_GetObjectItemCaseSensitive(first, "steps_per_s") : NULL;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "stage", "allreduce");
    cJSON_AddStringToObject(j, "description",
                            "all-reduce: interconnect (the gradient all-reduce of the live steps, as the "
                            "backend timed it; ratio: its rate over step only's)");
    cJSON_AddNumberToObject(j, "steps", (double)rounds);
    cJSON_AddNumberToObject(j, "seconds", total);
    const double rate = total > 0 ? (double)rounds / total : 0;
    cJSON_AddNumberToObject(j, "steps_per_s", rate);
    cJSON_AddNumberToObject(j, "samples_per_s", 0);
    cJSON_AddNumberToObject(j, "ratio", r0 && r0->valuedouble > 0 ? rate / r0->valuedouble : 0);
    cJSON_AddItemToArray(stages, j);
    return o;
}

int h_diagnose(sf_req *r)
{
    uint64_t id = (uint64_t)(uintptr_t)r->user;
    double seconds = 0;
    if (!id) {
        if (start(r, &id, &seconds))
            return -1;
        r->user = (void *)(uintptr_t)id;
        r->wait = SF_WAIT_NONE;
    }
    if (r->wait == SF_WAIT_GONE) {
        sf_diagnose_cancel(id);
        return 0;
    }
    for (;;) {
        uint64_t gen = sf_http_gen(r->app->http, SF_WAIT_CMD);
        sf_diag_result res;
        int st = sf_diagnose_result(id, &res);
        if (st < 0)
            return sf_reply_error(r, 500, "internal", "diagnose %llu was superseded",
                                  (unsigned long long)id);
        if (st > 0) {
            if (res.status != 0)
                return sf_reply_error(r, 500, "diagnose_failed", "%s",
                                      res.err[0] ? res.err : "the diagnosis failed");
            return sf_reply_json(r, 200, with_allreduce(r->app, sf_diag_result_to_json(&res)));
        }
        if (r->wait == SF_WAIT_SHUTDOWN) {
            sf_reply_header(r, "Retry-After", "1");
            return sf_reply_error(r, 503, "shutting_down", "the service is shutting down");
        }
        if (r->wait == SF_WAIT_TIMEOUT) {
            sf_reply_header(r, "Retry-After", "1");
            return sf_reply_error(r, 503, "diagnose_timeout",
                                  "diagnose %llu is still running; GET /v1/stats shows its verdict "
                                  "when it ends",
                                  (unsigned long long)id);
        }
        if (seconds <= 0) {
            sf_config c;
            sf_config_get(&c);
            seconds = c.diagnose.max_seconds;
        }
        if (sf_http_wait(r, SF_WAIT_CMD, id, gen, wait_limit_ms(seconds)) == 0)
            return 0;
    }
}
