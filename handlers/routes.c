/* handlers/routes.c — the route table: the one place that maps method and
 * path to a handler, and says which routes are served without the token
 * (SF_ROUTE_OPEN; every other one requires it when http.token is set).
 * openapi/streamfeed.yaml must list exactly these routes, with security on
 * exactly the ones that are not open (tests/integration/test_openapi_routes.py
 * checks both). */
#include "handlers/handlers.h"

static const char *const CT_BATCH[] = {"application/vnd.safetensors", "application/octet-stream", NULL};
static const char *const CT_PATCH[] = {"application/merge-patch+json", "application/json", NULL};
static const char *const CT_DIAGNOSE[] = {"application/json", NULL};
static const char *const CT_KV[] = {"application/octet-stream", NULL};

const sf_route sf_routes[] = {
    {"GET", "/healthz", "healthz", h_healthz, NULL, SF_ROUTE_PROBE | SF_ROUTE_OPEN, NULL},
    {"GET", "/readyz", "readyz", h_readyz, NULL, SF_ROUTE_PROBE | SF_ROUTE_OPEN, NULL},
    {"GET", "/metrics", "metrics", h_metrics, NULL, SF_ROUTE_PROBE | SF_ROUTE_OPEN, NULL},
    {"GET", "/openapi.yaml", "openapi", h_openapi, NULL, SF_ROUTE_OPEN, NULL},
    {"POST", "/v1/diagnose", "diagnose", h_diagnose, NULL, SF_ROUTE_ON_GONE, CT_DIAGNOSE},
    {"GET", "/v1/trace", "trace", h_trace, NULL, 0, NULL},
    {"GET", "/v1/stats", "stats", h_stats, NULL, SF_ROUTE_OPEN, NULL},
    {"GET", "/v1/config", "config", h_config_get, NULL, SF_ROUTE_OPEN, NULL},
    {"PATCH", "/v1/config", "config", h_config_patch, NULL, 0, CT_PATCH},
    {"POST", "/v1/batches", "batches", h_batches_post, &h_batches_stream,
     SF_ROUTE_UPLOAD, CT_BATCH},
    {"GET", "/v1/batches/{id}", "batch", h_batches_get, NULL, 0, NULL},
    {"GET", "/v1/batches/{id}/logits", "batch_logits", h_batches_logits, NULL, 0, NULL},
    {"GET", "/v1/evals", "evals", h_evals_list, NULL, 0, NULL},
    {"GET", "/v1/evals/{name}", "eval", h_evals_get, NULL, 0, NULL},
    {"DELETE", "/v1/evals/{name}", "eval", h_evals_delete, NULL, 0, NULL},
    {"POST", "/v1/transform", "transform", h_transform, &h_transform_stream,
     SF_ROUTE_UPLOAD, CT_BATCH},
    {"GET", "/v1/model", "model", h_model, NULL, 0, NULL},
    {"GET", "/v1/checkpoint", "checkpoint", h_checkpoint_get, &h_checkpoint_get_stream,
     0, NULL},
    {"PUT", "/v1/checkpoint", "checkpoint", h_checkpoint_put, &h_checkpoint_put_stream,
     0, CT_BATCH},
    {"POST", "/v1/checkpoint/save", "checkpoint_save", h_checkpoint_save, &h_checkpoint_json_stream,
     0, h_checkpoint_json_types},
    {"POST", "/v1/checkpoint/load", "checkpoint_load", h_checkpoint_load, &h_checkpoint_json_stream,
     0, h_checkpoint_json_types},
    {"PUT", "/v1/distributed/kv/{key}", "distributed_kv", h_distributed_kv_put, NULL, 0, CT_KV},
    {"GET", "/v1/distributed/kv/{key}", "distributed_kv", h_distributed_kv_get, NULL, 0, NULL},
};
const size_t sf_routes_len = sizeof sf_routes / sizeof sf_routes[0];
