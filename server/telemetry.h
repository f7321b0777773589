/* server/telemetry.h — the sampler: one thread that reads, on an interval,
 * what is too slow to read per scrape or cannot be reconstructed later.
 *
 *  - The device (NVML on CUDA, through backend->i->device_stats), every
 *    metrics.gpu_sample_ms (hot; 0 turns it off): the gauges
 *      streamfeed_gpu_utilization_ratio{gpu}, streamfeed_gpu_memory_used_bytes{gpu},
 *      streamfeed_gpu_memory_total_bytes{gpu}, streamfeed_gpu_power_watts{gpu}
 *    with gpu="<pipeline.device>". A gauge's child is created at its first
 *    known value, so where the backend has no telemetry (the reference
 *    backend, a driver without NVML) or the driver does not give a reading
 *    (negative in sf_device_stats, e.g. power on some boards) the series is
 *    absent, not zero. A later failed sample leaves the last values in place.
 *  - The throughput counters (streamfeed_steps_total, _samples_trained_total)
 *    once a second, into a bounded history (SF_TELEMETRY_HISTORY samples), so
 *    that GET /v1/stats can give rates over the last 10 s and 1 min at any
 *    step rate (the trace ring holds only the last SF_ENGINE_TRACE_STEPS steps).
 *
 * Threads: start/stop from main; the query functions from any thread.
 */
#ifndef SF_TELEMETRY_H
#define SF_TELEMETRY_H

#include <stddef.h>

#include "gpu/backend.h"

struct sf_app;
typedef struct sf_telemetry sf_telemetry;

#define SF_TELEMETRY_HISTORY 128 /* one-second samples: a little over 2 minutes */

/* Starts the thread (after the HTTP server, so the backend and metrics exist). */
sf_telemetry *sf_telemetry_start(struct sf_app *app, char *err, size_t errlen);
/* Stops and frees it; call before the backend is destroyed. NULL is fine. */
void sf_telemetry_stop(sf_telemetry *t);

/* The last valid device sample: 0 and *out, or -1 when there is none. */
int sf_telemetry_device(sf_telemetry *t, sf_device_stats *out);

typedef struct sf_rate {
    double seconds;        /* span actually covered (shorter than asked while young) */
    double steps_per_s, samples_per_s;
    double steps, samples; /* completed in that span */
} sf_rate;

/* Throughput over the last window_s seconds, ending now: 0 and *out, or -1
 * when there is no history yet. */
int sf_telemetry_rate(sf_telemetry *t, double window_s, sf_rate *out);

#endif
