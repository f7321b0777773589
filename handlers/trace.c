/* handlers/trace.c — GET /v1/trace?steps=N: the last N steps' timelines as
 * Chrome trace-event JSON (server/trace.h), for Perfetto or chrome://tracing. */
#include <errno.h>
#include <stdlib.h>

#include "handlers/handlers.h"
#include "server/app.h"
#include "server/engine.h"
#include "server/trace.h"

#define DEFAULT_STEPS 100

int h_trace(sf_req *r)
{
    long steps = DEFAULT_STEPS;
    const char *a = sf_req_arg(r, "steps");
    if (a) {
        char *end;
        errno = 0;
        steps = strtol(a, &end, 10);
        if (errno || *a < '0' || *a > '9' || *end || steps < 1 || steps > SF_ENGINE_TRACE_STEPS)
            return sf_reply_error_field(r, 400, "bad_steps", "steps",
                                        "steps must be an integer in [1, %d]", SF_ENGINE_TRACE_STEPS);
    }
    sf_step_record *recs = malloc(sizeof *recs * (size_t)steps);
    if (!recs) {
        sf_reply_header(r, "Retry-After", "1");
        return sf_reply_error(r, 503, "out_of_memory", "cannot copy %ld step records", steps);
    }
    int n = r->app->engine ? sf_engine_trace(r->app->engine, recs, (int)steps) : 0;
    cJSON *t = sf_trace_render(recs, n, r->app->backend_name, r->app->cfg.pipeline.device);
    free(recs);
    return sf_reply_json(r, 200, t);
}
