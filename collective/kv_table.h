/* collective/kv_table.h — the rendezvous store rank 0 keeps in memory: what
 * PUT/GET /v1/distributed/kv/{key} read and write (handlers/distributed.c),
 * and rank 0's own sf_kv_store.
 *
 * It takes only the keys a job of its world size writes (sf_kv_key_check),
 * and has room for every one of them, so no writer can fill it with other
 * keys and keep a rank of the job out. Values are bounded by the size given
 * when it is made (what a job of its size publishes: sf_coll_store_needs).
 * A key set again is replaced. Thread-safe (HTTP threads and the engine).
 */
#ifndef SF_DIST_KV_TABLE_H
#define SF_DIST_KV_TABLE_H

#include <stddef.h>

#include "collective/collective.h"

/* Room for a key in the table: the longest job key is far shorter. */
#define SF_KV_MAX_KEY 63

typedef struct sf_kv_table sf_kv_table;

/* The largest world size a table is made for (distributed.world_size's
 * bound is lower). */
#define SF_KV_MAX_WORLD 65536

/* The keys a job of world ranks writes, and the only ones the table takes:
 *   gloo.rank_N  rank N's host name        (Gloo's connectFullMesh, through
 *   gloo.N       rank N's pairs' addresses  collective/collective_gloo.cc's store,
 *                                           which prefixes "gloo.")
 *   nccl.id      the NCCL unique id rank 0 publishes (gpu/cuda/dist_nccl.cu)
 * with N a rank, 0 to world-1, in decimal without leading zeros (as Gloo
 * writes it: "gloo.01" is no key of a job). */
int sf_kv_job_keys(int world);
/* NULL when key is one of them; else the stable error code kv_key_invalid. */
const char *sf_kv_key_check(const char *key, int world);

/* The store of a job of world ranks (1 to SF_KV_MAX_WORLD): room for its
 * sf_kv_job_keys(world) keys, values of at most max_value bytes; NULL when
 * out of memory or world is out of range. */
sf_kv_table *sf_kv_table_new(int world, size_t max_value);
void sf_kv_table_free(sf_kv_table *t);
int sf_kv_table_world(const sf_kv_table *t);
int sf_kv_table_max_entries(const sf_kv_table *t);
size_t sf_kv_table_max_value(const sf_kv_table *t);
/* 0, or -1 with *code one of kv_key_invalid, kv_value_too_large,
 * out_of_memory, and kv_full: a guard only, since the table has room for
 * every key it takes. */
int sf_kv_table_put(sf_kv_table *t, const char *key, const void *val, size_t len, const char **code);
/* 0 found (at most cap bytes copied, *len the full length), 1 not there within
 * timeout_ms (0: do not wait), -1 a key the job never writes. */
int sf_kv_table_get(sf_kv_table *t, const char *key, void *buf, size_t cap, size_t *len, int timeout_ms);
int sf_kv_table_count(sf_kv_table *t);
sf_kv_store sf_kv_table_store(sf_kv_table *t);

#endif
