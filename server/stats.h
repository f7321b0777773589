/* server/stats.h — the compact summary of GET /v1/stats, for people and scripts.
 *
 *   throughput   steps/s and samples/s over the last 10 s and 1 min, from the
 *                sampler's counter history (server/telemetry.h); `seconds` is
 *                the span actually covered (shorter while the server is young);
 *   stages       median and p99 seconds of each stage (HTTP receive, queue
 *                wait, H2D, transform, step) over the engine's step timelines
 *                (the last SF_ENGINE_TRACE_STEPS steps at most), null before
 *                the first step;
 *   compute_busy_ratio  share of the last 10 s (or of the span the timelines
 *                cover, when shorter) during which the compute stream ran a step;
 *   ring         slots by state and occupancy (share not FREE);
 *   diagnose     whether a run is in progress, and the verdict of the last one;
 *   gpu          the last device sample (NVML), null where there is none.
 * Reads only; any HTTP thread.
 */
#ifndef SF_STATS_H
#define SF_STATS_H

#include <cjson/cJSON.h>

struct sf_app;

/* Percentile q in [0,1] of v[0..n) (sorts v; nearest rank). n > 0. */
double sf_stats_percentile(double *v, int n, double q);

cJSON *sf_stats_json(struct sf_app *app);

#endif
