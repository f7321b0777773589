/* collective/kv_client.h — the rendezvous store of ranks > 0: rank 0's
 * /v1/distributed/kv/{key} over HTTP (libcurl), as an sf_kv_store.
 *
 * Bounded: every request has a timeout, a get retries (key not there yet,
 * rank 0 not listening yet) until its own timeout, a set that got no answer
 * says so (1) for its caller to retry, and the last failure is kept with the
 * rendezvous address for the error the operator reads.
 */
#ifndef SF_DIST_KV_CLIENT_H
#define SF_DIST_KV_CLIENT_H

#include <stddef.h>

#include "collective/collective.h"

typedef struct sf_kv_client sf_kv_client;

/* rendezvous: "host:port" (http://) or a full http:// or https:// base URL;
 * token: the bearer token of rank 0 ("" none). */
sf_kv_client *sf_kv_client_new(const char *rendezvous, const char *token, char *err, size_t errlen);
sf_kv_store sf_kv_client_store(sf_kv_client *c);
/* The last failure, naming the rendezvous address ("" none), copied into
 * out: any thread may ask while the join runs. */
void sf_kv_client_error(sf_kv_client *c, char *out, size_t cap);
void sf_kv_client_free(sf_kv_client *c);

#endif
