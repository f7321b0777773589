/* handlers/evals.c — GET /v1/evals and GET /v1/evals/{name}: the named
 * evaluations' aggregates (server/evals.h). */
#include "handlers/handlers.h"
#include "server/app.h"
#include "server/evals.h"

int h_evals_list(sf_req *r) { return sf_reply_json(r, 200, sf_evals_list_json(r->app->evals)); }

int h_evals_get(sf_req *r)
{
    if (!sf_eval_name_valid(r->param))
        return sf_reply_error(r, 400, "bad_eval_name", "an evaluation name is 1 to %d characters of A-Z a-z 0-9 _ . -",
                              SF_EVAL_NAME_MAX);
    sf_eval_agg a;
    if (sf_evals_get(r->app->evals, r->param, &a))
        return sf_reply_error(r, 404, "eval_not_found", "no eval batch named \"%s\" was accepted", r->param);
    return sf_reply_json(r, 200, sf_eval_to_json(&a));
}
