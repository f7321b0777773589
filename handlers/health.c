/* handlers/health.c — GET /healthz (alive) and GET /readyz (ready). */
#include "handlers/handlers.h"
#include "server/app.h"

int h_healthz(sf_req *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    return sf_reply_json(r, 200, o);
}

int h_readyz(sf_req *r)
{
    cJSON *reasons;
    int rc = sf_app_ready(r->app, &reasons);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "ready", rc == 0);
    cJSON_AddItemToObject(o, "reasons", reasons);
    return sf_reply_json(r, rc == 0 ? 200 : 503, o);
}
