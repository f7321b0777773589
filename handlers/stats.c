/* handlers/stats.c — GET /v1/stats: the compact summary (server/stats.h). */
#include "handlers/handlers.h"
#include "server/app.h"
#include "server/stats.h"

int h_stats(sf_req *r) { return sf_reply_json(r, 200, sf_stats_json(r->app)); }
