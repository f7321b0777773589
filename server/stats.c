/* server/stats.c — GET /v1/stats. See stats.h. */
#include "server/stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/app.h"
#include "server/diagnose.h"
#include "server/engine.h"
#include "server/clock.h"
#include "server/ring.h"
#include "server/telemetry.h"

#define BUSY_WINDOW_S 10.0

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double sf_stats_percentile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int rank = (int)ceil(q * n); /* nearest rank, 1-based */
    rank = rank < 1 ? 1 : rank > n ? n : rank;
    return v[rank - 1];
}

static void add_rate(cJSON *o, const char *key, sf_telemetry *t, double window)
{
    sf_rate r;
    if (sf_telemetry_rate(t, window, &r))
        memset(&r, 0, sizeof r);
    cJSON *j = cJSON_AddObjectToObject(o, key);
    cJSON_AddNumberToObject(j, "seconds", r.seconds);
    cJSON_AddNumberToObject(j, "steps", r.steps);
    cJSON_AddNumberToObject(j, "steps_per_s", r.steps_per_s);
    cJSON_AddNumberToObject(j, "samples_per_s", r.samples_per_s);
}

/* Adds {"median_s","p99_s"} (or null when v is empty). */
static void add_dist(cJSON *o, const char *key, double *v, int n)
{
    if (n == 0) {
        cJSON_AddNullToObject(o, key);
        return;
    }
    cJSON *j = cJSON_AddObjectToObject(o, key);
    cJSON_AddNumberToObject(j, "median_s", sf_stats_percentile(v, n, 0.5));
    cJSON_AddNumberToObject(j, "p99_s", sf_stats_percentile(v, n, 0.99));
}

static double span_s(uint64_t a, uint64_t b) { return a && b && b >= a ? (double)(b - a) / 1e9 : -1; }

static void add_stages(cJSON *root, const sf_step_record *recs, int k)
{
    double *v = malloc(sizeof *v * (size_t)(k ? k : 1));
    cJSON *st = cJSON_AddObjectToObject(root, "stages");
    int steps = 0;
    for (int i = 0; i < k; i++)
        steps += recs[i].status == 0;
    cJSON_AddNumberToObject(st, "steps", steps);
    if (!v)
        return;
    static const char *const keys[] = {"http_receive", "queue_wait", "h2d", "transform", "step"};
    for (int s = 0; s < 5; s++) {
        int n = 0;
        for (int i = 0; i < k; i++) {
            const sf_step_record *r = &recs[i];
            if (r->status != 0)
                continue;
            double x = s == 0   ? span_s(r->t_recv_start, r->t_ready)
                       : s == 1 ? span_s(r->t_ready, r->t_popped)
                       : s == 2 ? r->h2d_s
                       : s == 3 ? r->transform_s
                                : r->step_s;
            if (x >= 0)
                v[n++] = x;
        }
        add_dist(st, keys[s], v, n);
    }
    free(v);
}

/* Share of the last BUSY_WINDOW_S (or of the span the timelines cover, when
 * the ring does not reach back that far) that the compute stream was busy. */
static double busy_ratio(const sf_step_record *recs, int k, uint64_t now)
{
    uint64_t w = (uint64_t)(BUSY_WINDOW_S * 1e9);
    uint64_t from = now > w ? now - w : 0;
    if (k == SF_ENGINE_TRACE_STEPS && recs[0].t_step_start > from)
        from = recs[0].t_step_start;
    if (now <= from)
        return 0;
    double busy = 0;
    for (int i = 0; i < k; i++) {
        uint64_t a = recs[i].t_step_start, b = recs[i].t_step_end;
        if (!a || b <= a || b <= from || a >= now)
            continue;
        a = a < from ? from : a;
        b = b > now ? now : b;
        busy += (double)(b - a);
    }
    double r = busy / (double)(now - from);
    return r > 1 ? 1 : r;
}

static void add_ring(cJSON *root, sf_app *app)
{
    if (!app->ring) {
        cJSON_AddNullToObject(root, "ring");
        return;
    }
    int c[SF_SLOT_STATES];
    sf_ring_counts(app->ring, c);
    int slots = sf_ring_slots(app->ring);
    cJSON *r = cJSON_AddObjectToObject(root, "ring");
    cJSON_AddNumberToObject(r, "slots", slots);
    cJSON_AddNumberToObject(r, "free", c[SF_SLOT_FREE]);
    cJSON_AddNumberToObject(r, "filling", c[SF_SLOT_FILLING]);
    cJSON_AddNumberToObject(r, "ready", c[SF_SLOT_READY]);
    cJSON_AddNumberToObject(r, "in_flight", c[SF_SLOT_IN_FLIGHT]);
    cJSON_AddNumberToObject(r, "occupancy", slots ? (double)(slots - c[SF_SLOT_FREE]) / slots : 0);
}

static void add_diagnose(cJSON *root, uint64_t now)
{
    sf_diag_result d;
    int running = 0;
    int have = sf_diagnose_last(&d, &running) == 0;
    cJSON *o = cJSON_AddObjectToObject(root, "diagnose");
    cJSON_AddBoolToObject(o, "running", running);
    if (!have) {
        cJSON_AddNullToObject(o, "last");
        return;
    }
    cJSON *l = cJSON_AddObjectToObject(o, "last");
    cJSON_AddNumberToObject(l, "id", (double)d.id);
    cJSON_AddStringToObject(l, "verdict", sf_diag_verdict_code(d.verdict));
    cJSON_AddStringToObject(l, "bottleneck", sf_diag_verdict_label(d.verdict));
    cJSON_AddStringToObject(l, "suggestion", d.suggestion);
    cJSON_AddNumberToObject(l, "age_s", now > d.t_done_ns ? (double)(now - d.t_done_ns) / 1e9 : 0);
    cJSON *rates = cJSON_AddObjectToObject(l, "steps_per_s");
    for (int s = 0; s < SF_DIAG_STAGES; s++)
        cJSON_AddNumberToObject(rates, sf_diag_stage_key((sf_diag_stage_id)s), d.stage[s].steps_per_s);
}

static void add_gpu(cJSON *root, sf_app *app)
{
    sf_device_stats ds;
    if (sf_telemetry_device(app->telemetry, &ds)) {
        cJSON_AddNullToObject(root, "gpu");
        return;
    }
    cJSON *g = cJSON_AddObjectToObject(root, "gpu");
    cJSON_AddNumberToObject(g, "device", app->cfg.pipeline.device);
    cJSON_AddStringToObject(g, "name", ds.name);
    /* A reading the driver does not give is negative: null here. */
    const char *keys[] = {"utilization_ratio", "memory_used_bytes", "memory_total_bytes", "power_watts"};
    const double vals[] = {ds.utilization_ratio, ds.memory_used_bytes, ds.memory_total_bytes,
                           ds.power_watts};
    for (int i = 0; i < 4; i++) {
        if (vals[i] >= 0)
            cJSON_AddNumberToObject(g, keys[i], vals[i]);
        else
            cJSON_AddNullToObject(g, keys[i]);
    }
}

cJSON *sf_stats_json(sf_app *app)
{
    uint64_t now = sf_now_ns();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "uptime_s", (double)(now - app->t_start_ns) / 1e9);
    cJSON_AddStringToObject(o, "backend", app->backend_name ? app->backend_name : "none");
    cJSON_AddNumberToObject(o, "steps_total", sf_metric_value(sf_metric_only(app->m.steps)));
    cJSON_AddNumberToObject(o, "samples_total",
                            sf_metric_value(sf_metric_only(app->m.samples_trained)));
    cJSON *tp = cJSON_AddObjectToObject(o, "throughput");
    add_rate(tp, "10s", app->telemetry, 10);
    add_rate(tp, "1m", app->telemetry, 60);

    sf_step_record *recs = malloc(sizeof *recs * SF_ENGINE_TRACE_STEPS);
    int k = recs && app->engine ? sf_engine_trace(app->engine, recs, SF_ENGINE_TRACE_STEPS) : 0;
    add_stages(o, recs, k);
    cJSON_AddNumberToObject(o, "compute_busy_ratio", busy_ratio(recs, k, now));
    free(recs);

    add_ring(o, app);
    add_diagnose(o, now);
    add_gpu(o, app);
    return o;
}
