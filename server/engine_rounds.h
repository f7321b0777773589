/* server/engine_rounds.h — the engine's data-parallel rounds
 * (server/engine_rounds.c) and the few parts of the engine (server/engine.c)
 * they drive. Only those two files include it: the rounds see the engine
 * through these calls, never through its struct, so the single-process loop
 * and the rounds each keep their own state. */
#ifndef SF_SERVER_ENGINE_ROUNDS_H
#define SF_SERVER_ENGINE_ROUNDS_H

#include <stddef.h>
#include <stdint.h>

#include "server/engine.h"

/* ---- what engine.c provides ------------------------------------------------ */

/* What the engine was started with (sf_engine_start). */
const sf_engine_ctx *engine_ctx(sf_engine *e);
/* Batches submitted to the backend and not yet harvested. */
int engine_inflight(sf_engine *e);
/* Whether sf_engine_stop asked the engine to stop. */
int engine_stopping(sf_engine *e);
/* The last in-flight wait ends here (sf_engine_stop_by; 0: none). */
uint64_t engine_stop_deadline_ns(sf_engine *e);
/* Polls the backend for up to timeout_us and harvests what completed: the
 * number of events, 0 when nothing is in flight. */
int engine_poll(sf_engine *e, int timeout_us);
/* Whether commands are queued; running them needs nothing in flight. */
int engine_has_cmds(sf_engine *e);
void engine_run_cmds(sf_engine *e);
/* Fails the accepted batch in ring slot slot with code and msg (its job
 * reports why) and releases the slot. */
void engine_fail_batch(sf_engine *e, int slot, const char *code, const char *msg);
/* Serves the transform-only request in ring slot slot. */
void engine_run_transform(sf_engine *e, int slot);
/* Submits the batch in ring slot slot; global_n is the round's sample count
 * over every rank (0 outside the rounds). A batch the backend refuses is
 * failed and its slot released. */
void engine_submit(sf_engine *e, int slot, int64_t global_n);
/* This rank's part of a round without a batch: zero gradient, zero weight.
 * 0, or -1 with err set when the backend refused it. */
int engine_submit_empty(sf_engine *e, int64_t global_n, char *err, size_t errlen);

/* ---- what engine_rounds.c provides ------------------------------------------ */

/* Joins the data-parallel job and trains in rounds with the other ranks
 * until this rank stops or the job ends; then serves commands and fails
 * arriving batches until the engine stops. Runs on the engine thread. */
void engine_rounds(sf_engine *e);

#endif
