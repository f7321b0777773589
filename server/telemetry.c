/* server/telemetry.c — the sampler thread. See telemetry.h. */
#include "server/telemetry.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/app.h"
#include "server/clock.h"
#include "server/log.h"

#define COUNTER_PERIOD_NS 1000000000ull
#define MIN_DEVICE_PERIOD_MS 10

typedef struct sample {
    uint64_t t_ns;
    double steps, samples;
} sample;

struct sf_telemetry {
    sf_app *app;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    /* Under mu: */
    sample hist[SF_TELEMETRY_HISTORY];
    int hist_n, hist_head; /* hist_head: where the next sample goes */
    sf_device_stats dev;
    int have_dev;
    /* Thread only: gauge children, each created at its first known value. */
    sf_metric *g_util, *g_used, *g_total, *g_power;
};

static void read_counters(sf_app *app, sample *s)
{
    s->t_ns = sf_now_ns();
    s->steps = sf_metric_value(sf_metric_only(app->m.steps));
    s->samples = sf_metric_value(sf_metric_only(app->m.samples_trained));
}

static void sample_counters(sf_telemetry *t)
{
    sample s;
    read_counters(t->app, &s);
    pthread_mutex_lock(&t->mu);
    t->hist[t->hist_head] = s;
    t->hist_head = (t->hist_head + 1) % SF_TELEMETRY_HISTORY;
    if (t->hist_n < SF_TELEMETRY_HISTORY)
        t->hist_n++;
    pthread_mutex_unlock(&t->mu);
}

/* Sets one device gauge, creating its child at its first known value: a
 * reading the driver does not give (negative, e.g. power on some boards)
 * leaves that series absent. */
static void set_device_gauge(sf_telemetry *t, sf_family *f, sf_metric **m, double v)
{
    if (!(v >= 0))
        return;
    if (!*m) {
        char ord[16];
        snprintf(ord, sizeof ord, "%d", t->app->cfg.pipeline.device);
        const char *lv[] = {ord};
        *m = sf_metric_child(f, lv);
    }
    sf_gauge_set(*m, v);
}

static void sample_device(sf_telemetry *t)
{
    sf_backend *be = t->app->backend;
    sf_device_stats ds;
    memset(&ds, 0, sizeof ds);
    if (be->i->device_stats(be, &ds) != 0 || !ds.valid)
        return;
    sf_app_metrics *m = &t->app->m;
    set_device_gauge(t, m->gpu_utilization, &t->g_util, ds.utilization_ratio);
    set_device_gauge(t, m->gpu_memory_used, &t->g_used, ds.memory_used_bytes);
    set_device_gauge(t, m->gpu_memory_total, &t->g_total, ds.memory_total_bytes);
    set_device_gauge(t, m->gpu_power, &t->g_power, ds.power_watts);
    pthread_mutex_lock(&t->mu);
    t->dev = ds;
    t->have_dev = 1;
    pthread_mutex_unlock(&t->mu);
}

static void *telemetry_main(void *arg)
{
    sf_telemetry *t = arg;
    sf_backend *be = t->app->backend;
    int device = be && be->i->device_stats;
    /* The first counter sample was taken by sf_telemetry_start. */
    uint64_t next_device = sf_now_ns(), next_counters = next_device + COUNTER_PERIOD_NS;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        pthread_mutex_unlock(&t->mu);
        uint64_t now = sf_now_ns();
        if (now >= next_counters) {
            sample_counters(t);
            next_counters += COUNTER_PERIOD_NS;
            if (next_counters <= now) /* fell behind (suspended): no burst of catch-up samples */
                next_counters = now + COUNTER_PERIOD_NS;
        }
        uint64_t wake = next_counters;
        if (device) {
            sf_config c;
            sf_config_get(&c);
            if (c.metrics.gpu_sample_ms > 0) {
                uint64_t period = (uint64_t)(c.metrics.gpu_sample_ms < MIN_DEVICE_PERIOD_MS
                                                 ? MIN_DEVICE_PERIOD_MS
                                                 : c.metrics.gpu_sample_ms) * 1000000ull;
                if (next_device > now + period) /* the interval was shortened */
                    next_device = now;
                if (now >= next_device) {
                    sample_device(t);
                    next_device = now + period;
                }
                if (next_device < wake)
                    wake = next_device;
            }
        }
        pthread_mutex_lock(&t->mu);
        if (t->stop)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t dt = wake > sf_now_ns() ? wake - sf_now_ns() : 0;
        uint64_t abs = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + dt;
        ts.tv_sec = (time_t)(abs / 1000000000ull);
        ts.tv_nsec = (long)(abs % 1000000000ull);
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

sf_telemetry *sf_telemetry_start(sf_app *app, char *err, size_t errlen)
{
    sf_telemetry *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    t->app = app;
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (!(app->backend && app->backend->i->device_stats))
        SF_DEBUG("telemetry: the %s backend has no device telemetry; streamfeed_gpu_* stay absent",
                 app->backend_name ? app->backend_name : "sink");
    /* The history's first sample is taken here, before the daemon serves a
     * request, not when the new thread is first scheduled: on a loaded host
     * that can come after the first step, and the windows would miss it. */
    sample_counters(t);
    if (pthread_create(&t->thread, NULL, telemetry_main, t)) {
        snprintf(err, errlen, "cannot start the telemetry thread");
        sf_telemetry_stop(t);
        return NULL;
    }
    t->started = 1;
    return t;
}

void sf_telemetry_stop(sf_telemetry *t)
{
    if (!t)
        return;
    if (t->started) {
        pthread_mutex_lock(&t->mu);
        t->stop = 1;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->thread, NULL);
    }
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

int sf_telemetry_device(sf_telemetry *t, sf_device_stats *out)
{
    if (!t)
        return -1;
    pthread_mutex_lock(&t->mu);
    int rc = t->have_dev ? 0 : -1;
    if (t->have_dev)
        *out = t->dev;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int sf_telemetry_rate(sf_telemetry *t, double window_s, sf_rate *out)
{
    if (!t)
        return -1;
    sample now;
    read_counters(t->app, &now);
    uint64_t w = (uint64_t)(window_s * 1e9);
    uint64_t from = now.t_ns > w ? now.t_ns - w : 0;
    pthread_mutex_lock(&t->mu);
    if (t->hist_n == 0) {
        pthread_mutex_unlock(&t->mu);
        return -1;
    }
    /* The newest sample at or before the window's start, so the span covers
     * the whole window (by up to one period more); the oldest one while the
     * history is younger than the window. */
    int oldest = (t->hist_head - t->hist_n + SF_TELEMETRY_HISTORY) % SF_TELEMETRY_HISTORY;
    sample base = t->hist[oldest];
    for (int i = 0; i < t->hist_n; i++) {
        const sample *s = &t->hist[(oldest + i) % SF_TELEMETRY_HISTORY];
        if (s->t_ns > from)
            break;
        base = *s;
    }
    pthread_mutex_unlock(&t->mu);
    double secs = now.t_ns > base.t_ns ? (double)(now.t_ns - base.t_ns) / 1e9 : 0;
    out->seconds = secs;
    out->steps = now.steps - base.steps;
    out->samples = now.samples - base.samples;
    out->steps_per_s = secs > 0 ? out->steps / secs : 0;
    out->samples_per_s = secs > 0 ? out->samples / secs : 0;
    return 0;
}
