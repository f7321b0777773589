/* server/trace.h — step timelines as Chrome trace-event JSON (GET /v1/trace).
 *
 * The engine keeps the timelines of the last SF_ENGINE_TRACE_STEPS steps in
 * host monotonic nanoseconds (server/engine.h: sf_step_record; on CUDA the
 * device events are converted to host time by the backend). This module
 * renders them in the Trace Event Format that Perfetto (ui.perfetto.dev) and
 * chrome://tracing open:
 *   {"traceEvents":[...], "displayTimeUnit":"ms", "otherData":{...}}
 * One process ("streamfeed gpu<device>", or "streamfeed ref (CPU)") with one track (tid) per stage, in
 * pipeline order:
 *   1 HTTP receive      t_recv_start -> t_ready       the body streamed into a slot
 *   2 ring wait         t_ready -> t_popped           READY in the ring
 *   3 H2D               t_h2d_start -> t_transform_start
 *   4 transform stream  t_transform_start + transform_s
 *   5 compute stream    t_step_start -> t_step_end
 * Each slice is a complete event ("ph":"X", ts and dur in microseconds from
 * the earliest edge shown, ns precision), named "batch <id>", with args
 * {batch, step, n, loss}. Edges the backend did not report (0) leave their
 * slice out. Track and process names are metadata events ("ph":"M").
 *
 * Pure functions of their input; no locks.
 */
#ifndef SF_TRACE_H
#define SF_TRACE_H

#include <cjson/cJSON.h>

#include "server/engine.h"

enum { SF_TRACE_TRACKS = 5 };

/* The track names, by tid - 1. */
extern const char *const sf_trace_track_names[SF_TRACE_TRACKS];

/* The trace of recs[0..n) (oldest first). The process is named after where
 * the steps ran: "streamfeed gpu<device>" on the cuda backend, else
 * "streamfeed <backend> (CPU)". */
cJSON *sf_trace_render(const sf_step_record *recs, int n, const char *backend, int device);

#endif
