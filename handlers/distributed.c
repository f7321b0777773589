/* handlers/distributed.c — PUT/GET /v1/distributed/kv/{key}: rank 0's
 * rendezvous store (collective/kv_table.h), where the ranks of a data-parallel job
 * publish their addresses (and the NCCL unique id) to find each other.
 * Served by rank 0 only; the bearer token is required when set. */
#include <stdlib.h>
#include <string.h>

#include "collective/kv_table.h"
#include "handlers/handlers.h"
#include "server/app.h"
#include "server/distributed.h"

static sf_kv_table *table_or_refuse(sf_req *r)
{
    sf_kv_table *t = sf_distributed_table(r->app->dist);
    if (!t) {
        sf_reply_error(r, 409, "not_rendezvous",
                       "this process is not rank 0 of a data-parallel job (distributed.world_size > 1): "
                       "it serves no rendezvous store");
        return NULL;
    }
    /* Only the keys the job writes: the store has room for all of them and
     * for nothing else, so other keys can neither fill it nor keep a rank
     * out (collective/kv_table.h). */
    const int world = sf_kv_table_world(t);
    const char *bad = sf_kv_key_check(r->param, world);
    if (bad) {
        sf_reply_error_field(r, 400, bad, "key",
                             "a key is one the ranks of this job write: gloo.rank_N or gloo.N with N a rank "
                             "from 0 to %d (no leading zeros), or nccl.id",
                             world - 1);
        return NULL;
    }
    return t;
}

int h_distributed_kv_put(sf_req *r)
{
    sf_kv_table *t = table_or_refuse(r);
    if (!t)
        return -1;
    /* Every rank publishes its keys before rank 0 can connect to it, so once
     * rank 0's join has ended no rank has anything left to write: a process
     * that does (a rank started twice, or one too late) would only replace
     * the keys of the rank it claims to be, and wait for a connection that
     * never comes. */
    sf_dist_state st = sf_distributed_state(r->app->dist, NULL, 0);
    if (st != SF_DIST_JOINING)
        return sf_reply_error(r, 409, "rendezvous_closed", "rank 0 takes no more rendezvous keys: %s",
                              st == SF_DIST_BROKEN ? "it stopped waiting for the other ranks (its /readyz says why)"
                                                   : "every rank of its data-parallel job has joined (is this "
                                                     "rank running twice?)");
    const char *code = NULL;
    if (sf_kv_table_put(t, r->param, r->body, r->body_len, &code) != 0) {
        if (!strcmp(code, "kv_value_too_large"))
            return sf_reply_error(r, 413, code, "a value holds at most %zu bytes", sf_kv_table_max_value(t));
        if (!strcmp(code, "out_of_memory"))
            return sf_reply_error(r, 503, code, "out of memory");
        /* Not reached: the table has room for every key it takes. */
        return sf_reply_error(r, 409, code, "the store holds at most %d keys", sf_kv_table_max_entries(t));
    }
    return sf_reply_bytes(r, 204, "application/octet-stream", NULL, 0, NULL);
}

int h_distributed_kv_get(sf_req *r)
{
    sf_kv_table *t = table_or_refuse(r);
    if (!t)
        return -1;
    const size_t cap = sf_kv_table_max_value(t);
    void *buf = malloc(cap ? cap : 1);
    if (!buf)
        return sf_reply_error(r, 503, "out_of_memory", "out of memory");
    size_t len = 0;
    if (sf_kv_table_get(t, r->param, buf, cap, &len, 0) != 0) {
        free(buf);
        return sf_reply_error(r, 404, "kv_key_not_found", "no rank has published \"%s\" yet", r->param);
    }
    return sf_reply_bytes(r, 200, "application/octet-stream", buf, len, free);
}
