/* server/kept_logits.h — the logits of eval batches whose ?wait ran out.
 *
 * POST /v1/batches?mode=eval&return=logits&wait=1 replies with the logits when
 * the batch runs within pipeline.wait_timeout_ms. When the wait runs out first
 * the reply is a 202, and that 202 is a promise: the logits buffer (which the
 * engine may still be writing) is kept here under the batch's id, for
 * GET /v1/batches/{id}/logits, and stops counting against the bound of
 * replies not yet read (server/upload.h sf_xform_out_release_share): what is
 * kept is bounded here instead, three ways, all hot
 * configuration: eval.logits_keep_s (age since the 202), eval.logits_keep_max
 * (batches) and eval.logits_keep_bytes (bytes); the oldest go first, each
 * eviction counted in streamfeed_logits_evicted_total{reason=age|count|bytes}.
 * Every put and eviction is recorded in the job table (sf_jobs_set_logits), so
 * that a GET tells logits that expired (410) from logits never kept (404).
 *
 * Thread-safe (one mutex): HTTP threads put and get, the HTTP timer's tick
 * expires. Lock order: this store's, then the job table's.
 */
#ifndef SF_KEPT_LOGITS_H
#define SF_KEPT_LOGITS_H

#include <stddef.h>
#include <stdint.h>

#include "server/metrics.h"

struct sf_jobs;
typedef struct sf_xform_out sf_xform_out;
typedef struct sf_kept_logits sf_kept_logits;

/* evicted: the counter family labelled reason (may be NULL in unit tests). */
sf_kept_logits *sf_kept_logits_new(struct sf_jobs *jobs, sf_family *evicted);
/* Releases every buffer still kept. */
void sf_kept_logits_destroy(sf_kept_logits *k);
/* Keeps a reference to o (the caller keeps its own) for batch id, evicting
 * the oldest entries as the limits in force require. Returns 0, or -1 when o
 * alone exceeds eval.logits_keep_bytes or memory ran out (nothing is kept and
 * the job is marked expired). */
int sf_kept_logits_put(sf_kept_logits *k, uint64_t id, sf_xform_out *o, uint64_t now_ns);
/* The logits of batch id with a reference for the caller (sf_xform_out_release
 * it), or NULL when none are kept. Expires old entries first. */
sf_xform_out *sf_kept_logits_get(sf_kept_logits *k, uint64_t id, uint64_t now_ns);
/* Evicts what is older than eval.logits_keep_s (the HTTP timer's tick). */
void sf_kept_logits_expire(sf_kept_logits *k, uint64_t now_ns);
/* Batches and bytes kept now (for the metrics). */
void sf_kept_logits_usage(sf_kept_logits *k, int *count, size_t *bytes);

#endif
