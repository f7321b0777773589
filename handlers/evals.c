/* handlers/evals.c — GET /v1/evals, GET and DELETE /v1/evals/{name}: the
 * named evaluations' aggregates (server/evals.h). */
#include "handlers/handlers.h"
#include "server/app.h"
#include "server/evals.h"

int h_evals_list(sf_req *r) { return sf_reply_json(r, 200, sf_evals_list_json(r->app->evals)); }

static int bad_name(sf_req *r)
{
    return sf_reply_error(r, 400, "bad_eval_name", "an evaluation name is 1 to %d characters of A-Z a-z 0-9 _ . -",
                          SF_EVAL_NAME_MAX);
}

static int not_found(sf_req *r)
{
    return sf_reply_error(r, 404, "eval_not_found",
                          "no evaluation named \"%s\": none of its batches was accepted, or it was deleted", r->param);
}

int h_evals_get(sf_req *r)
{
    if (!sf_eval_name_valid(r->param))
        return bad_name(r);
    sf_eval_agg a;
    if (sf_evals_get(r->app->evals, r->param, &a))
        return not_found(r);
    return sf_reply_json(r, 200, sf_eval_to_json(&a));
}

/* Frees the name's place among eval.max_names, so that a service running
 * one evaluation per epoch is not refused its seventeenth; the reply is the
 * evaluation as it ended. */
int h_evals_delete(sf_req *r)
{
    if (!sf_eval_name_valid(r->param))
        return bad_name(r);
    sf_eval_agg a;
    switch (sf_evals_delete(r->app->evals, r->param, &a)) {
    case SF_EVAL_DELETED:
        return sf_reply_json(r, 200, sf_eval_to_json(&a));
    case SF_EVAL_BUSY:
        /* Its accepted batches were promised to count towards it. */
        sf_reply_header(r, "Retry-After", "1");
        const unsigned long long pending = (unsigned long long)a.pending;
        return sf_reply_error(r, 409, "eval_busy",
                              "evaluation \"%s\" has %llu accepted batch%s not yet finished, which still count%s "
                              "towards it: retry the DELETE once %s finished",
                              r->param, pending, pending == 1 ? "" : "es",
                              pending == 1 ? "s" : "", pending == 1 ? "it has" : "they have");
    case SF_EVAL_UNKNOWN:
    default:
        return not_found(r);
    }
}
