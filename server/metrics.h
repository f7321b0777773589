/* server/metrics.h — a small Prometheus registry: counters, gauges and
 * histograms with fixed buckets and labels, rendered as text format 0.0.4.
 *
 * A family (name, help, type, label names) is registered once at start-up. A
 * child is one combination of label values; sf_metric_child finds or creates
 * it (under the family's lock, so do it once and keep the pointer on hot
 * paths). Updates on a child are lock-free atomics and may come from any
 * thread. The number of children per family is bounded (SF_METRIC_MAX_CHILDREN):
 * beyond it, updates land in one child whose label values are all "overflow",
 * so a misbehaving label can never grow memory without bound.
 *
 * A child that stops meaning anything (an evaluation deleted) is forgotten
 * with sf_metric_forget: it is no longer rendered, but its memory stays,
 * since a hot path may still hold its pointer; asking for the same labels
 * again revives it from zero. A forgotten child keeps its place among the
 * family's SF_METRIC_MAX_CHILDREN, unless the family was declared with
 * sf_metrics_reuse_forgotten.
 *
 * Collectors (sf_metrics_on_collect) run just before rendering, for values
 * that are cheaper to read on demand (ring occupancy, build info).
 */
#ifndef SF_METRICS_H
#define SF_METRICS_H

#include <stddef.h>
#include <stdint.h>

#define SF_METRIC_MAX_LABELS 4
#define SF_METRIC_MAX_CHILDREN 512
#define SF_METRIC_MAX_BUCKETS 24

typedef enum sf_metric_type { SF_COUNTER, SF_GAUGE, SF_HISTOGRAM } sf_metric_type;

typedef struct sf_family sf_family;
typedef struct sf_metric sf_metric;

/* Registers a family. labels: NULL-terminated list of label names (or NULL).
 * Histograms take bucket upper bounds (ascending; +Inf is implicit). */
sf_family *sf_metrics_counter(const char *name, const char *help, const char *const *labels);
sf_family *sf_metrics_gauge(const char *name, const char *help, const char *const *labels);
sf_family *sf_metrics_histogram(const char *name, const char *help, const char *const *labels,
                                const double *buckets, int nbuckets);

/* The child for these label values (as many as the family has labels). */
sf_metric *sf_metric_child(sf_family *f, const char *const *values);
/* The single child of a family without labels. */
sf_metric *sf_metric_only(sf_family *f);
/* Forgets the child of these label values, if it exists: it is not rendered
 * and its values are zero until sf_metric_child asks for the same labels
 * again (which returns the same child, from zero). Thread-safe with
 * rendering. An update through a pointer kept from before is not rendered
 * either, and is dropped when the child is revived. */
void sf_metric_forget(sf_family *f, const char *const *values);
/* Declares that nobody keeps pointers to this family's children across
 * calls (each update asks sf_metric_child, and no sf_metric_forget runs
 * between that and the update): once the family holds SF_METRIC_MAX_CHILDREN
 * children, a new label combination takes over a forgotten child's memory
 * instead of going to the overflow child. Without it, label values that come
 * and go (an evaluation name per epoch) would fill the family for good. */
void sf_metrics_reuse_forgotten(sf_family *f);

void sf_counter_add(sf_metric *m, double v); /* v >= 0 */
void sf_gauge_set(sf_metric *m, double v);
void sf_gauge_add(sf_metric *m, double v);
void sf_hist_observe(sf_metric *m, double v);
double sf_metric_value(sf_metric *m);        /* counter/gauge value; histogram sum */
uint64_t sf_hist_count(sf_metric *m);

/* Convenience for code paths that are not hot: look up and update. */
void sf_counter_inc_l(sf_family *f, const char *const *values, double v);

void sf_metrics_on_collect(void (*fn)(void *ctx), void *ctx);

/* Renders every family; returns a malloc'd NUL-terminated string. */
char *sf_metrics_render(size_t *len);

/* Forgets every family (tests, shutdown). */
void sf_metrics_reset(void);

/* Bucket presets, seconds. */
extern const double sf_buckets_latency[];   /* 100 µs .. 30 s */
extern const int sf_buckets_latency_n;

#endif
