/* server/trace.c — Chrome trace-event JSON of step timelines. See trace.h. */
#include "server/trace.h"

#include <stdio.h>
#include <string.h>

const char *const sf_trace_track_names[SF_TRACE_TRACKS] = {
    "HTTP receive", "ring wait", "H2D", "transform stream", "compute stream",
};

#define PID 1

static cJSON *meta(const char *what, int tid, const char *key, cJSON *value)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", what);
    cJSON_AddStringToObject(e, "ph", "M");
    cJSON_AddNumberToObject(e, "pid", PID);
    cJSON_AddNumberToObject(e, "tid", tid);
    cJSON *args = cJSON_AddObjectToObject(e, "args");
    cJSON_AddItemToObject(args, key, value);
    return e;
}

/* Microseconds from base, keeping nanosecond precision. */
static double us(uint64_t t, uint64_t base) { return (double)(t - base) / 1000.0; }

static void slice(cJSON *events, const sf_step_record *r, int tid, uint64_t t0, uint64_t t1,
                  uint64_t base)
{
    if (!t0 || !t1 || t1 < t0 || t0 < base)
        return;
    char name[40];
    snprintf(name, sizeof name, "batch %llu", (unsigned long long)r->id);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", name);
    cJSON_AddStringToObject(e, "cat", sf_trace_track_names[tid - 1]);
    cJSON_AddStringToObject(e, "ph", "X");
    cJSON_AddNumberToObject(e, "pid", PID);
    cJSON_AddNumberToObject(e, "tid", tid);
    cJSON_AddNumberToObject(e, "ts", us(t0, base));
    cJSON_AddNumberToObject(e, "dur", us(t1, base) - us(t0, base));
    cJSON *args = cJSON_AddObjectToObject(e, "args");
    cJSON_AddNumberToObject(args, "batch", (double)r->id);
    cJSON_AddNumberToObject(args, "n", r->n);
    if (tid == 5) {
        cJSON_AddNumberToObject(args, "step", (double)r->step);
        if (r->status == 0)
            cJSON_AddNumberToObject(args, "loss", r->loss);
        else
            cJSON_AddStringToObject(args, "status", "failed");
    }
    cJSON_AddItemToArray(events, e);
}

static uint64_t min_nonzero(uint64_t a, uint64_t b) { return !a ? b : !b ? a : a < b ? a : b; }

cJSON *sf_trace_render(const sf_step_record *recs, int n, const char *backend, int device)
{
    uint64_t base = 0;
    for (int i = 0; i < n; i++) {
        const sf_step_record *r = &recs[i];
        uint64_t t = min_nonzero(min_nonzero(r->t_recv_start, r->t_ready),
                                 min_nonzero(min_nonzero(r->t_popped, r->t_h2d_start),
                                             min_nonzero(r->t_transform_start, r->t_step_start)));
        base = min_nonzero(base, t);
    }
    cJSON *root = cJSON_CreateObject();
    cJSON *events = cJSON_AddArrayToObject(root, "traceEvents");
    char pname[48];
    if (backend && strcmp(backend, "cuda") == 0)
        snprintf(pname, sizeof pname, "streamfeed gpu%d", device);
    else
        snprintf(pname, sizeof pname, "streamfeed %.16s (CPU)", backend ? backend : "ref");
    cJSON_AddItemToArray(events, meta("process_name", 0, "name", cJSON_CreateString(pname)));
    for (int t = 1; t <= SF_TRACE_TRACKS; t++) {
        cJSON_AddItemToArray(events, meta("thread_name", t, "name",
                                          cJSON_CreateString(sf_trace_track_names[t - 1])));
        /* Tracks in pipeline order, not alphabetical. */
        cJSON_AddItemToArray(events, meta("thread_sort_index", t, "sort_index", cJSON_CreateNumber(t)));
    }
    for (int i = 0; i < n; i++) {
        const sf_step_record *r = &recs[i];
        slice(events, r, 1, r->t_recv_start, r->t_ready, base);
        slice(events, r, 2, r->t_ready, r->t_popped, base);
        slice(events, r, 3, r->t_h2d_start, r->t_transform_start, base);
        if (r->t_transform_start)
            slice(events, r, 4, r->t_transform_start,
                  r->t_transform_start + (uint64_t)(r->transform_s * 1e9 + 0.5), base);
        slice(events, r, 5, r->t_step_start, r->t_step_end, base);
    }
    cJSON_AddStringToObject(root, "displayTimeUnit", "ms");
    cJSON *other = cJSON_AddObjectToObject(root, "otherData");
    cJSON_AddStringToObject(other, "clock", "host CLOCK_MONOTONIC");
    cJSON_AddNumberToObject(other, "base_ns", (double)base);
    cJSON_AddNumberToObject(other, "steps", n);
    return root;
}
