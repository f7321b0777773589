/* server/metrics.c — see metrics.h. */
#include "server/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FAMILIES 96
#define MAX_COLLECTORS 16
#define LABEL_VALUE_MAX 96

/* A double stored as its bits, updated by compare-and-swap. */
typedef _Atomic uint64_t atomic_f64;

static double f64_load(atomic_f64 *a)
{
    uint64_t b = atomic_load_explicit(a, memory_order_relaxed);
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static void f64_store(atomic_f64 *a, double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    atomic_store_explicit(a, b, memory_order_relaxed);
}

static void f64_add(atomic_f64 *a, double v)
{
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed), nw;
    do {
        double d;
        memcpy(&d, &old, sizeof d);
        d += v;
        memcpy(&nw, &d, sizeof nw);
    } while (!atomic_compare_exchange_weak_explicit(a, &old, nw, memory_order_relaxed,
                                                    memory_order_relaxed));
}

struct sf_metric {
    sf_family *fam;
    int hidden; /* forgotten (sf_metric_forget): not rendered; under fam->mu */
    char values[SF_METRIC_MAX_LABELS][LABEL_VALUE_MAX];
    atomic_f64 value; /* counter/gauge value, histogram sum */
    _Atomic uint64_t buckets[SF_METRIC_MAX_BUCKETS + 1]; /* per-bucket (non-cumulative) counts; last is +Inf */
};

struct sf_family {
    char name[96];
    char help[256];
    sf_metric_type type;
    int nlabels;
    char labels[SF_METRIC_MAX_LABELS][48];
    int nbuckets;
    double bounds[SF_METRIC_MAX_BUCKETS];
    pthread_mutex_t mu;
    int nchildren;
    int reuse_forgotten; /* sf_metrics_reuse_forgotten */
    sf_metric *children[SF_METRIC_MAX_CHILDREN];
    sf_metric *overflow;
};

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static sf_family *families[MAX_FAMILIES];
static int nfamilies;
static struct {
    void (*fn)(void *);
    void *ctx;
} collectors[MAX_COLLECTORS];
static int ncollectors;

const double sf_buckets_latency[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                     0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5,
                                     5,      10,      30};
const int sf_buckets_latency_n = sizeof sf_buckets_latency / sizeof sf_buckets_latency[0];

static sf_family *family_new(const char *name, const char *help, sf_metric_type type,
                             const char *const *labels, const double *buckets, int nbuckets)
{
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < nfamilies; i++) {
        /* Registering twice returns the same family (idempotent start-up code). */
        if (strcmp(families[i]->name, name) == 0) {
            sf_family *f = families[i];
            pthread_mutex_unlock(&reg_mu);
            return f;
        }
    }
    sf_family *f = NULL;
    if (nfamilies < MAX_FAMILIES && (f = calloc(1, sizeof *f))) {
        snprintf(f->name, sizeof f->name, "%s", name);
        snprintf(f->help, sizeof f->help, "%s", help);
        f->type = type;
        for (int i = 0; labels && labels[i] && i < SF_METRIC_MAX_LABELS; i++)
            snprintf(f->labels[f->nlabels++], sizeof f->labels[0], "%s", labels[i]);
        f->nbuckets = nbuckets < SF_METRIC_MAX_BUCKETS ? nbuckets : SF_METRIC_MAX_BUCKETS;
        for (int i = 0; i < f->nbuckets; i++)
            f->bounds[i] = buckets[i];
        pthread_mutex_init(&f->mu, NULL);
        families[nfamilies++] = f;
    }
    pthread_mutex_unlock(&reg_mu);
    if (!f) {
        fprintf(stderr, "metrics: cannot register %s (registry full or out of memory)\n", name);
        abort(); /* start-up only: a registry too small is a build bug */
    }
    return f;
}

sf_family *sf_metrics_counter(const char *name, const char *help, const char *const *labels)
{
    return family_new(name, help, SF_COUNTER, labels, NULL, 0);
}
sf_family *sf_metrics_gauge(const char *name, const char *help, const char *const *labels)
{
    return family_new(name, help, SF_GAUGE, labels, NULL, 0);
}
sf_family *sf_metrics_histogram(const char *name, const char *help, const char *const *labels,
                                const double *buckets, int nbuckets)
{
    return family_new(name, help, SF_HISTOGRAM, labels, buckets, nbuckets);
}

static sf_metric *child_new(sf_family *f, const char *const *values)
{
    sf_metric *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->fam = f;
    for (int i = 0; i < f->nlabels; i++)
        snprintf(m->values[i], LABEL_VALUE_MAX, "%s", values ? values[i] : "");
    return m;
}

static int same_labels(const sf_family *f, const sf_metric *m, const char *const *values)
{
    for (int l = 0; l < f->nlabels; l++)
        if (strncmp(m->values[l], values[l], LABEL_VALUE_MAX - 1) != 0)
            return 0;
    return 1;
}

/* Back to zero: a forgotten child, and one revived or relabelled. */
static void child_zero(sf_metric *m)
{
    f64_store(&m->value, 0);
    for (int b = 0; b <= SF_METRIC_MAX_BUCKETS; b++)
        atomic_store_explicit(&m->buckets[b], 0, memory_order_relaxed);
}

sf_metric *sf_metric_child(sf_family *f, const char *const *values)
{
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < f->nchildren; i++) {
        sf_metric *m = f->children[i];
        if (same_labels(f, m, values)) {
            if (m->hidden) {
                /* Revived: what was added through an old pointer while it
                 * was forgotten is not this series' past. */
                child_zero(m);
                m->hidden = 0;
            }
            pthread_mutex_unlock(&f->mu);
            return m;
        }
    }
    sf_metric *m = NULL;
    if (f->nchildren < SF_METRIC_MAX_CHILDREN) {
        m = child_new(f, values);
        if (m)
            f->children[f->nchildren++] = m;
    } else if (f->reuse_forgotten) {
        for (int i = 0; i < f->nchildren && !m; i++) {
            if (f->children[i]->hidden) {
                m = f->children[i];
                for (int l = 0; l < f->nlabels; l++)
                    snprintf(m->values[l], LABEL_VALUE_MAX, "%s", values[l]);
                child_zero(m);
                m->hidden = 0;
            }
        }
    }
    if (!m) {
        if (!f->overflow) {
            const char *ov[SF_METRIC_MAX_LABELS] = {"overflow", "overflow", "overflow", "overflow"};
            f->overflow = child_new(f, ov);
        }
        m = f->overflow;
    }
    pthread_mutex_unlock(&f->mu);
    return m;
}

void sf_metric_forget(sf_family *f, const char *const *values)
{
    if (!f || (f->nlabels > 0 && !values))
        return;
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < f->nchildren; i++) {
        sf_metric *m = f->children[i];
        if (same_labels(f, m, values)) {
            m->hidden = 1;
            child_zero(m);
            break;
        }
    }
    pthread_mutex_unlock(&f->mu);
}

void sf_metrics_reuse_forgotten(sf_family *f)
{
    pthread_mutex_lock(&f->mu);
    f->reuse_forgotten = 1;
    pthread_mutex_unlock(&f->mu);
}

sf_metric *sf_metric_only(sf_family *f) { return sf_metric_child(f, NULL); }

void sf_counter_add(sf_metric *m, double v)
{
    if (m && v >= 0)
        f64_add(&m->value, v);
}
void sf_gauge_set(sf_metric *m, double v)
{
    if (m)
        f64_store(&m->value, v);
}
void sf_gauge_add(sf_metric *m, double v)
{
    if (m)
        f64_add(&m->value, v);
}

void sf_hist_observe(sf_metric *m, double v)
{
    if (!m || isnan(v))
        return;
    sf_family *f = m->fam;
    int b = 0;
    while (b < f->nbuckets && v > f->bounds[b])
        b++;
    atomic_fetch_add_explicit(&m->buckets[b], 1, memory_order_relaxed);
    f64_add(&m->value, v);
}

double sf_metric_value(sf_metric *m) { return m ? f64_load(&m->value) : 0; }

uint64_t sf_hist_count(sf_metric *m)
{
    uint64_t n = 0;
    for (int b = 0; m && b <= m->fam->nbuckets; b++)
        n += atomic_load_explicit(&m->buckets[b], memory_order_relaxed);
    return n;
}

void sf_counter_inc_l(sf_family *f, const char *const *values, double v)
{
    sf_counter_add(sf_metric_child(f, values), v);
}

void sf_metrics_on_collect(void (*fn)(void *ctx), void *ctx)
{
    pthread_mutex_lock(&reg_mu);
    if (ncollectors < MAX_COLLECTORS) {
        collectors[ncollectors].fn = fn;
        collectors[ncollectors].ctx = ctx;
        ncollectors++;
    }
    pthread_mutex_unlock(&reg_mu);
}

/* ---- rendering --------------------------------------------------------------- */

typedef struct buf {
    char *p;
    size_t len, cap;
    int oom;
} buf;

static void bput(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bput(buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t ncap = b->cap * 2 + (size_t)n;
        char *np = realloc(b->p, ncap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
}

/* Label values escape \, " and newline (text format 0.0.4). */
static void put_escaped(buf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            bput(b, "\\\\");
        else if (*s == '"')
            bput(b, "\\\"");
        else if (*s == '\n')
            bput(b, "\\n");
        else
            bput(b, "%c", *s);
    }
}

static void put_labels(buf *b, const sf_metric *m, const char *extra_name, const char *extra_val)
{
    const sf_family *f = m->fam;
    if (f->nlabels == 0 && !extra_name)
        return;
    bput(b, "{");
    for (int i = 0; i < f->nlabels; i++) {
        bput(b, "%s%s=\"", i ? "," : "", f->labels[i]);
        put_escaped(b, m->values[i]);
        bput(b, "\"");
    }
    if (extra_name)
        bput(b, "%s%s=\"%s\"", f->nlabels ? "," : "", extra_name, extra_val);
    bput(b, "}");
}

static void put_value(buf *b, double v)
{
    if (isinf(v))
        bput(b, v > 0 ? "+Inf" : "-Inf");
    else if (isnan(v))
        bput(b, "NaN");
    else
        bput(b, "%.17g", v);
}

static void put_help(buf *b, const char *help)
{
    for (const char *s = help; *s; s++) {
        if (*s == '\\')
            bput(b, "\\\\");
        else if (*s == '\n')
            bput(b, "\\n");
        else
            bput(b, "%c", *s);
    }
}

static void render_child(buf *b, const sf_family *f, sf_metric *m)
{
    if (f->type != SF_HISTOGRAM) {
        bput(b, "%s", f->name);
        put_labels(b, m, NULL, NULL);
        bput(b, " ");
        put_value(b, f64_load(&m->value));
        bput(b, "\n");
        return;
    }
    uint64_t cum = 0;
    for (int i = 0; i <= f->nbuckets; i++) {
        cum += atomic_load_explicit(&m->buckets[i], memory_order_relaxed);
        char le[32];
        if (i < f->nbuckets)
            snprintf(le, sizeof le, "%.15g", f->bounds[i]);
        else
            snprintf(le, sizeof le, "+Inf");
        bput(b, "%s_bucket", f->name);
        put_labels(b, m, "le", le);
        bput(b, " %llu\n", (unsigned long long)cum);
    }
    bput(b, "%s_sum", f->name);
    put_labels(b, m, NULL, NULL);
    bput(b, " ");
    put_value(b, f64_load(&m->value));
    bput(b, "\n%s_count", f->name);
    put_labels(b, m, NULL, NULL);
    bput(b, " %llu\n", (unsigned long long)cum);
}

/* Scrapes run one at a time: a collector reads a source (getrusage, the job
 * counts) and then sets a value, so two concurrent scrapes could set an older
 * reading after a newer one and a counter would go backwards. */
static pthread_mutex_t render_mu = PTHREAD_MUTEX_INITIALIZER;

static char *render_locked(size_t *len);

char *sf_metrics_render(size_t *len)
{
    pthread_mutex_lock(&render_mu);
    char *txt = render_locked(len);
    pthread_mutex_unlock(&render_mu);
    return txt;
}

static char *render_locked(size_t *len)
{
    pthread_mutex_lock(&reg_mu);
    int nc = ncollectors;
    pthread_mutex_unlock(&reg_mu);
    for (int i = 0; i < nc; i++)
        collectors[i].fn(collectors[i].ctx);

    buf b = {malloc(16384), 0, 16384, 0};
    if (!b.p)
        return NULL;
    b.p[0] = '\0';
    static const char *const tnames[] = {"counter", "gauge", "histogram"};
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < nfamilies; i++) {
        sf_family *f = families[i];
        pthread_mutex_lock(&f->mu);
        /* A labelled family with no child yet renders only HELP/TYPE: absent,
         * not zero, as Prometheus convention wants for unseen label values. */
        bput(&b, "# HELP %s ", f->name);
        put_help(&b, f->help);
        bput(&b, "\n# TYPE %s %s\n", f->name, tnames[f->type]);
        for (int c = 0; c < f->nchildren; c++)
            if (!f->children[c]->hidden)
                render_child(&b, f, f->children[c]);
        if (f->overflow)
            render_child(&b, f, f->overflow);
        pthread_mutex_unlock(&f->mu);
    }
    pthread_mutex_unlock(&reg_mu);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    if (len)
        *len = b.len;
    return b.p;
}

void sf_metrics_reset(void)
{
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < nfamilies; i++) {
        sf_family *f = families[i];
        for (int c = 0; c < f->nchildren; c++)
            free(f->children[c]);
        free(f->overflow);
        pthread_mutex_destroy(&f->mu);
        free(f);
    }
    nfamilies = 0;
    ncollectors = 0;
    pthread_mutex_unlock(&reg_mu);
}
