/* handlers/handlers.h — every endpoint's handler, for the route table.
 *
 * A handler parses and validates its request, calls into server/ (or gpu/
 * through the backend), and renders the reply. It keeps no state of its own:
 * anything a request needs across callbacks lives in sf_req.user.
 */
#ifndef SF_HANDLERS_H
#define SF_HANDLERS_H

#include "server/http.h"

int h_healthz(sf_req *r);
int h_readyz(sf_req *r);
int h_metrics(sf_req *r);
int h_config_get(sf_req *r);
int h_config_patch(sf_req *r);
int h_batches_post(sf_req *r);
int h_batches_get(sf_req *r);
int h_batches_logits(sf_req *r);
int h_evals_list(sf_req *r);
int h_evals_get(sf_req *r);
int h_evals_delete(sf_req *r);
int h_transform(sf_req *r);
int h_model(sf_req *r);
int h_openapi(sf_req *r);

extern const sf_stream_ops h_batches_stream;
extern const sf_stream_ops h_transform_stream;

/* Parses a JSON request body with the configured depth bound; replies 400 and
 * returns NULL when it is not acceptable. */
cJSON *h_parse_json_body(sf_req *r);

/* Seeing the pipeline: diagnose (caching method), trace (Chrome JSON), stats. */
int h_diagnose(sf_req *r);
int h_trace(sf_req *r);
int h_stats(sf_req *r);
/* rank, world_size (and the job's state with world_size > 1) into a reply. */
void h_add_rank(struct sf_app *app, cJSON *o);

/* Rank 0's rendezvous store: PUT/GET /v1/distributed/kv/{key}. */
int h_distributed_kv_put(sf_req *r);
int h_distributed_kv_get(sf_req *r);

/* Checkpoints: GET/PUT /v1/checkpoint, POST /v1/checkpoint/save and /load. */
int h_checkpoint_get(sf_req *r);
int h_checkpoint_put(sf_req *r);
int h_checkpoint_save(sf_req *r);
int h_checkpoint_load(sf_req *r);
extern const sf_stream_ops h_checkpoint_get_stream;
extern const sf_stream_ops h_checkpoint_put_stream;
extern const sf_stream_ops h_checkpoint_json_stream;
extern const char *const h_checkpoint_json_types[];

#endif
