/* dist/kv_table.h — the rendezvous store rank 0 keeps in memory: what
 * PUT/GET /v1/distributed/kv/{key} read and write (handlers/distributed.c),
 * and rank 0's own sf_kv_store.
 *
 * Bounded: keys of at most SF_KV_MAX_KEY characters of [A-Za-z0-9._-], and
 * the number of keys and the size of a value given when it is made (what a
 * job of its size publishes: sf_coll_store_needs). A key set again is
 * replaced. Thread-safe (HTTP threads and the engine).
 */
#ifndef SF_DIST_KV_TABLE_H
#define SF_DIST_KV_TABLE_H

#include <stddef.h>

#include "dist/collective.h"

#define SF_KV_MAX_KEY 63

typedef struct sf_kv_table sf_kv_table;

/* At most max_entries keys and values of at most max_value bytes; NULL when
 * out of memory. */
sf_kv_table *sf_kv_table_new(int max_entries, size_t max_value);
void sf_kv_table_free(sf_kv_table *t);
int sf_kv_table_max_entries(const sf_kv_table *t);
size_t sf_kv_table_max_value(const sf_kv_table *t);
/* 0 when the key is well formed; else a stable error code. */
const char *sf_kv_key_check(const char *key);
/* 0, or -1 with *code one of kv_key_invalid, kv_value_too_large, kv_full. */
int sf_kv_table_put(sf_kv_table *t, const char *key, const void *val, size_t len, const char **code);
/* 0 found (at most cap bytes copied, *len the full length), 1 not there within
 * timeout_ms (0: do not wait), -1 a malformed key. */
int sf_kv_table_get(sf_kv_table *t, const char *key, void *buf, size_t cap, size_t *len, int timeout_ms);
int sf_kv_table_count(sf_kv_table *t);
sf_kv_store sf_kv_table_store(sf_kv_table *t);

#endif
