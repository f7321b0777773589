/* handlers/metrics.c — GET /metrics, Prometheus text format 0.0.4. */
#include <stdlib.h>

#include "handlers/handlers.h"
#include "server/metrics.h"

int h_metrics(sf_req *r)
{
    size_t len;
    char *txt = sf_metrics_render(&len);
    if (!txt)
        return sf_reply_error(r, 503, "out_of_memory", "cannot render the metrics");
    return sf_reply_bytes(r, 200, "text/plain; version=0.0.4; charset=utf-8", txt, len, free);
}
