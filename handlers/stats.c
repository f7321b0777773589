/* handlers/stats.c — GET /v1/stats: the compact summary (server/stats.h). */
#include "handlers/handlers.h"
#include "server/app.h"
#include "server/distributed.h"
#include "server/stats.h"

/* Which rank answered: a loader behind a Service reaches any of them. */
void h_add_rank(sf_app *app, cJSON *o)
{
    cJSON_AddNumberToObject(o, "rank", sf_distributed_rank(app->dist));
    cJSON_AddNumberToObject(o, "world_size", sf_distributed_world(app->dist));
    if (app->dist)
        sf_distributed_to_json(app->dist, cJSON_AddObjectToObject(o, "distributed"));
}

int h_stats(sf_req *r)
{
    cJSON *o = sf_stats_json(r->app);
    h_add_rank(r->app, o);
    return sf_reply_json(r, 200, o);
}
