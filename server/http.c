/* server/http.c — see http.h. */
#include "server/http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "server/app.h"
#include "server/log.h"
#include "server/netaddr.h"

#define MAX_EXTRA_HEADERS 4
#define DRAIN_LIMIT (64ull << 20) /* beyond this, an early error closes the connection */

struct sf_req_priv {
    struct MHD_Connection *conn;
    struct sf_http *h;
    char extra[MAX_EXTRA_HEADERS][2][64];
    int nextra;
    /* An error decided while the body still arrives is sent once it ended. */
    struct MHD_Response *pending;
    int pending_status;
    int draining;           /* discard the rest of the body */
    size_t body_cap;
    uint64_t body_limit;
    int handled;            /* the handler has been called at least once */
    /* Waiting. */
    int in_wait_list;
    sf_wait_kind wait_kind;
    uint64_t wait_key;
    uint64_t deadline_ns;
    struct sf_req *wait_next;
};

struct sf_http {
    sf_app *app;
    struct MHD_Daemon *d;
    int port;
    atomic_int active;
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    struct sf_req *waiters;            /* singly linked list */
    uint64_t gen[SF_WAIT_KINDS];
    pthread_t timer;
    int timer_stop;
    sf_metric *m_unmatched_404;
};

uint64_t sf_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- routing ------------------------------------------------------------------ */

/* Matches path against pattern; copies a {param} segment into param. */
static int path_match(const char *pattern, const char *path, char *param, size_t cap)
{
    while (*pattern && *path) {
        if (*pattern == '{') {
            const char *close = strchr(pattern, '}');
            const char *seg_end = strchr(path, '/');
            size_t len = seg_end ? (size_t)(seg_end - path) : strlen(path);
            if (len == 0 || len >= cap)
                return 0;
            memcpy(param, path, len);
            param[len] = '\0';
            pattern = close + 1;
            path += len;
            continue;
        }
        if (*pattern != *path)
            return 0;
        pattern++;
        path++;
    }
    return *pattern == '\0' && *path == '\0';
}

/* Finds the route; *allow lists the methods of routes whose path matches. */
static const sf_route *route_find(const char *method, const char *path, char *param, size_t cap,
                                  char *allow, size_t allow_cap, int *path_found)
{
    const sf_route *hit = NULL;
    allow[0] = '\0';
    *path_found = 0;
    for (size_t i = 0; i < sf_routes_len; i++) {
        char p[64];
        if (!path_match(sf_routes[i].pattern, path, p, sizeof p))
            continue;
        *path_found = 1;
        size_t l = strlen(allow);
        snprintf(allow + l, allow_cap - l, "%s%s", l ? ", " : "", sf_routes[i].method);
        if (!hit && strcmp(sf_routes[i].method, method) == 0) {
            hit = &sf_routes[i];
            snprintf(param, cap, "%s", p);
        }
    }
    /* HEAD is answered as GET by libmicrohttpd (it sends no body). */
    if (!hit && strcmp(method, "HEAD") == 0)
        return route_find("GET", path, param, cap, allow, allow_cap, path_found);
    return hit;
}

/* ---- replies ------------------------------------------------------------------ */

static struct MHD_Response *make_response(sf_req *r, const char *ctype, void *data, size_t len,
                                          void (*free_fn)(void *))
{
    struct MHD_Response *resp;
    if (free_fn)
        resp = MHD_create_response_from_buffer_with_free_callback(len, data, free_fn);
    else
        resp = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return NULL;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    MHD_add_response_header(resp, "X-Request-Id", r->request_id);
    for (int i = 0; i < r->priv->nextra; i++)
        MHD_add_response_header(resp, r->priv->extra[i][0], r->priv->extra[i][1]);
    r->priv->nextra = 0;
    return resp;
}

/* Queues now, or keeps the response for the end of the body when the body is
 * still arriving (we are in an upload-data callback). */
static int send_or_defer(sf_req *r, int status, struct MHD_Response *resp, int body_pending)
{
    if (!resp)
        return -1;
    r->status = status;
    if (body_pending) {
        if (r->priv->pending)
            MHD_destroy_response(r->priv->pending);
        r->priv->pending = resp;
        r->priv->pending_status = status;
        r->priv->draining = 1;
        return 0;
    }
    enum MHD_Result rc = MHD_queue_response(r->priv->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc == MHD_YES ? 0 : -1;
}

/* Set while the upload is still arriving: replies are deferred to its end. */
static __thread int tl_body_pending;

int sf_reply_bytes(sf_req *r, int status, const char *content_type, void *data, size_t len,
                   void (*free_fn)(void *))
{
    r->bytes_out = len;
    return send_or_defer(r, status, make_response(r, content_type, data, len, free_fn),
                         tl_body_pending);
}

int sf_reply_json(sf_req *r, int status, cJSON *body)
{
    char *txt = cJSON_PrintUnformatted(body);
    cJSON_Delete(body);
    if (!txt)
        return -1;
    size_t len = strlen(txt);
    /* A trailing newline makes curl output readable. */
    char *withnl = realloc(txt, len + 2);
    if (withnl) {
        txt = withnl;
        txt[len++] = '\n';
        txt[len] = '\0';
    }
    return sf_reply_bytes(r, status, "application/json", txt, len, free);
}

int sf_reply_error_field(sf_req *r, int status, const char *code, const char *field,
                        const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->app) {
        const char *v[] = {code};
        sf_counter_inc_l(r->app->m.http_errors, v, 1);
    }
    /* Every 429/503 tells the client when to come back (the spec promises it). */
    int has_ra = 0;
    for (int i = 0; i < r->priv->nextra; i++)
        has_ra |= strcasecmp(r->priv->extra[i][0], "Retry-After") == 0;
    if ((status == 429 || status == 503) && !has_ra)
        sf_reply_header(r, "Retry-After", "1");
    cJSON *o = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "code", code);
    cJSON_AddStringToObject(e, "message", msg);
    if (field)
        cJSON_AddStringToObject(e, "field", field);
    SF_DEBUG("request %s: %d %s: %s", r->request_id, status, code, msg);
    return sf_reply_json(r, status, o);
}

void sf_reply_header(sf_req *r, const char *name, const char *value)
{
    if (r->priv->nextra >= MAX_EXTRA_HEADERS)
        return;
    snprintf(r->priv->extra[r->priv->nextra][0], 64, "%s", name);
    snprintf(r->priv->extra[r->priv->nextra][1], 64, "%s", value);
    r->priv->nextra++;
}

const char *sf_req_arg(sf_req *r, const char *name)
{
    return MHD_lookup_connection_value(r->priv->conn, MHD_GET_ARGUMENT_KIND, name);
}

const char *sf_req_header(sf_req *r, const char *name)
{
    return MHD_lookup_connection_value(r->priv->conn, MHD_HEADER_KIND, name);
}

/* ---- waiting ------------------------------------------------------------------ */

uint64_t sf_http_gen(sf_http *h, sf_wait_kind kind)
{
    pthread_mutex_lock(&h->wmu);
    uint64_t g = h->gen[kind];
    pthread_mutex_unlock(&h->wmu);
    return g;
}

static void unlink_waiter_locked(sf_http *h, sf_req *r)
{
    for (sf_req **pp = &h->waiters; *pp; pp = &(*pp)->priv->wait_next) {
        if (*pp == r) {
            *pp = r->priv->wait_next;
            break;
        }
    }
    r->priv->in_wait_list = 0;
    r->priv->wait_next = NULL;
}

int sf_http_wait(sf_req *r, sf_wait_kind kind, uint64_t key, uint64_t gen, int timeout_ms)
{
    sf_http *h = r->priv->h;
    pthread_mutex_lock(&h->wmu);
    if (h->gen[kind] != gen || h->timer_stop) {
        /* A wake came between the caller's test and now: test again. */
        pthread_mutex_unlock(&h->wmu);
        return -1;
    }
    r->wait = SF_WAIT_NONE;
    r->priv->wait_kind = kind;
    r->priv->wait_key = key;
    r->priv->deadline_ns = sf_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    r->priv->wait_next = h->waiters;
    r->priv->in_wait_list = 1;
    h->waiters = r;
    MHD_suspend_connection(r->priv->conn);
    pthread_cond_signal(&h->wcv);
    pthread_mutex_unlock(&h->wmu);
    return 0;
}

static void resume_locked(sf_http *h, sf_req *r, sf_wait_state why)
{
    unlink_waiter_locked(h, r);
    r->wait = why;
    MHD_resume_connection(r->priv->conn);
}

void sf_http_wake(sf_http *h, sf_wait_kind kind, uint64_t key)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->wmu);
    h->gen[kind]++;
    for (sf_req *r = h->waiters, *next; r; r = next) {
        next = r->priv->wait_next;
        if (r->priv->wait_kind == kind && (key == UINT64_MAX || r->priv->wait_key == key))
            resume_locked(h, r, SF_WAIT_WOKEN);
    }
    pthread_mutex_unlock(&h->wmu);
}

void sf_http_wake_all(sf_http *h)
{
    pthread_mutex_lock(&h->wmu);
    h->timer_stop = 1; /* no new waits from now on */
    for (int k = 0; k < SF_WAIT_KINDS; k++)
        h->gen[k]++;
    while (h->waiters)
        resume_locked(h, h->waiters, SF_WAIT_SHUTDOWN);
    pthread_cond_broadcast(&h->wcv);
    pthread_mutex_unlock(&h->wmu);
}

/* Resumes waiters whose deadline passed. Sleeps on a condition variable until
 * the nearest deadline (or a new waiter), so it costs nothing when idle. */
static void *timer_main(void *arg)
{
    sf_http *h = arg;
    pthread_mutex_lock(&h->wmu);
    while (!h->timer_stop) {
        uint64_t now = sf_now_ns(), next = now + 1000000000ull;
        for (sf_req *r = h->waiters, *n; r; r = n) {
            n = r->priv->wait_next;
            if (r->priv->deadline_ns <= now)
                resume_locked(h, r, SF_WAIT_TIMEOUT);
            else if (r->priv->deadline_ns < next)
                next = r->priv->deadline_ns;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t wake = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (next - now);
        ts.tv_sec = (time_t)(wake / 1000000000ull);
        ts.tv_nsec = (long)(wake % 1000000000ull);
        pthread_cond_timedwait(&h->wcv, &h->wmu, &ts);
    }
    pthread_mutex_unlock(&h->wmu);
    return NULL;
}

/* ---- request handling ------------------------------------------------------- */

static enum MHD_Result sum_headers(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value)
{
    size_t *total = cls;
    *total += strlen(key) + (value ? strlen(value) : 0) + 4;
    return MHD_YES;
}

static void make_request_id(sf_req *r, struct MHD_Connection *conn)
{
    const char *given = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
    if (given && *given && strlen(given) < sizeof r->request_id) {
        /* Echo a caller's id only if it is printable ASCII without spaces. */
        int ok = 1;
        for (const char *p = given; *p && ok; p++)
            ok = *p > 32 && *p < 127;
        if (ok) {
            snprintf(r->request_id, sizeof r->request_id, "%s", given);
            return;
        }
    }
    static _Atomic uint64_t counter;
    uint64_t c = atomic_fetch_add(&counter, 1);
    snprintf(r->request_id, sizeof r->request_id, "%016llx-%llu",
             (unsigned long long)(sf_now_ns() ^ ((uint64_t)getpid() << 40)),
             (unsigned long long)c);
}

static int content_type_ok(const sf_route *rt, const char *ct)
{
    if (!rt->content_types)
        return 1;
    if (!ct)
        return 0;
    size_t n = strcspn(ct, "; \t");
    for (int i = 0; rt->content_types[i]; i++)
        if (strlen(rt->content_types[i]) == n && strncasecmp(ct, rt->content_types[i], n) == 0)
            return 1;
    return 0;
}

/* Lets a streaming route count a refusal made here, before it saw the body. */
static void stream_rejected(sf_req *r, const char *code)
{
    if (r->route && r->route->stream && r->route->stream->on_rejected)
        r->route->stream->on_rejected(r, code);
}

/* First call: headers are in. Returns 0 to go on, -1 when an error reply was
 * made (deferred when a body follows). */
static int on_headers(sf_req *r, struct MHD_Connection *conn, const char *method, const char *url)
{
    sf_app *app = r->app;
    const sf_config *cfgp = sf_config_cur();
#define cfg (*cfgp)
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    uint64_t content_length = cl ? strtoull(cl, NULL, 10) : 0;
    int has_body = (cl && content_length > 0) ||
                   MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Transfer-Encoding");
    /* Errors found now are sent after the body, unless the body is too big to drain. */
    tl_body_pending = has_body && content_length <= DRAIN_LIMIT;

    size_t hdr = 0;
    MHD_get_connection_values(conn, MHD_HEADER_KIND, sum_headers, &hdr);
    if (hdr > (size_t)cfg.http.max_header_bytes)
        return sf_reply_error(r, 431, "headers_too_large",
                              "request headers are %zu bytes; the limit is %d", hdr,
                              cfg.http.max_header_bytes),
               -1;

    char allow[128];
    int path_found;
    r->route = route_find(method, url, r->param, sizeof r->param, allow, sizeof allow, &path_found);
    if (!r->route) {
        if (path_found) {
            sf_reply_header(r, "Allow", allow);
            sf_reply_error(r, 405, "method_not_allowed", "%s is not allowed on %s; allowed: %s",
                           method, url, allow);
        } else {
            sf_reply_error(r, 404, "not_found", "no route for %s %s", method, url);
        }
        return -1;
    }
    const sf_route *rt = r->route;
    if ((rt->flags & SF_ROUTE_AUTH) && cfg.http.token[0]) {
        const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
        size_t tl = strlen(cfg.http.token);
        int ok = a && strncmp(a, "Bearer ", 7) == 0 && strlen(a + 7) == tl;
        /* Constant-time comparison: no early exit on the first differing byte. */
        unsigned diff = 0;
        for (size_t i = 0; ok && i < tl; i++)
            diff |= (unsigned)(a[7 + i] ^ cfg.http.token[i]);
        if (!ok || diff) {
            sf_reply_header(r, "WWW-Authenticate", "Bearer");
            sf_reply_error(r, 401, "unauthorized", "a valid bearer token is required for %s %s",
                           method, rt->pattern);
            stream_rejected(r, "unauthorized");
            return -1;
        }
    }
    if (has_body && !content_type_ok(rt, MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                                     "Content-Type"))) {
        const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Type");
        sf_reply_error(r, 415, "unsupported_media_type",
                       "Content-Type %s is not accepted by %s %s (accepted: %s%s%s)",
                       ct ? ct : "(none)", method, rt->pattern, rt->content_types[0],
                       rt->content_types[1] ? ", " : "",
                       rt->content_types[1] ? rt->content_types[1] : "");
        stream_rejected(r, "unsupported_media_type");
        return -1;
    }
    r->priv->body_limit = rt->stream ? rt->stream->max_body(app) : (uint64_t)cfg.http.max_json_bytes;
    if (cl && content_length > r->priv->body_limit) {
        tl_body_pending = 0; /* too big to drain: reply now, the connection closes */
        sf_reply_error(r, 413, "body_too_large", "body of %llu bytes exceeds the limit of %llu",
                       (unsigned long long)content_length,
                       (unsigned long long)r->priv->body_limit);
        stream_rejected(r, "body_too_large");
        return -1;
    }
    return 0;
#undef cfg
}

static int buffer_body(sf_req *r, const char *data, size_t len)
{
    if (r->body_len + len > r->priv->body_limit) {
        sf_reply_error(r, 413, "body_too_large", "body exceeds the limit of %llu bytes",
                       (unsigned long long)r->priv->body_limit);
        return -1;
    }
    if (r->body_len + len + 1 > r->priv->body_cap) {
        size_t cap = r->priv->body_cap ? r->priv->body_cap : 4096;
        while (cap < r->body_len + len + 1)
            cap *= 2;
        char *nb = realloc(r->body, cap);
        if (!nb) {
            sf_reply_error(r, 503, "out_of_memory", "cannot buffer the request body");
            return -1;
        }
        r->body = nb;
        r->priv->body_cap = cap;
    }
    memcpy(r->body + r->body_len, data, len);
    r->body_len += len;
    r->body[r->body_len] = '\0';
    return 0;
}

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls)
{
    sf_http *h = cls;
    sf_req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r + sizeof(struct sf_req_priv));
        if (!r)
            return MHD_NO;
        r->priv = (struct sf_req_priv *)(r + 1);
        r->priv->conn = conn;
        r->priv->h = h;
        r->app = h->app;
        r->method = method;
        r->path = url;
        r->t_start_ns = sf_now_ns();
        make_request_id(r, conn);
        atomic_fetch_add(&h->active, 1);
        *con_cls = r;
        if (on_headers(r, conn, method, url) != 0) {
            tl_body_pending = 0;
            return MHD_YES;
        }
        tl_body_pending = 0;
        return MHD_YES;
    }

    if (*upload_data_size > 0) {
        /* Body chunk. */
        tl_body_pending = 1;
        size_t len = *upload_data_size;
        r->bytes_in += len;
        if (r->priv->draining || r->priv->pending) {
            *upload_data_size = 0;
            if (r->bytes_in > DRAIN_LIMIT + r->priv->body_limit) {
                /* Draining costs too much: send the error now and close. */
                tl_body_pending = 0;
                struct MHD_Response *p = r->priv->pending;
                r->priv->pending = NULL;
                if (p) {
                    MHD_queue_response(conn, (unsigned)r->priv->pending_status, p);
                    MHD_destroy_response(p);
                }
            }
            tl_body_pending = 0;
            return MHD_YES;
        }
        if (r->route->stream) {
            r->bytes_in -= len;
            size_t left = len;
            int rc = r->route->stream->on_data(r, (const uint8_t *)upload_data, &left);
            r->bytes_in += len - left;
            *upload_data_size = rc < 0 ? 0 : left;
        } else {
            buffer_body(r, upload_data, len);
            *upload_data_size = 0;
        }
        tl_body_pending = 0;
        return MHD_YES;
    }

    /* The body is complete (or there was none). */
    tl_body_pending = 0;
    if (r->priv->pending) {
        struct MHD_Response *p = r->priv->pending;
        r->priv->pending = NULL;
        enum MHD_Result rc = MHD_queue_response(conn, (unsigned)r->priv->pending_status, p);
        MHD_destroy_response(p);
        return rc;
    }
    if (r->status)
        return MHD_YES; /* replied already (e.g. an early 413) */
    r->priv->handled = 1;
    r->route->handler(r);
    return MHD_YES;
}

/* Probes and scrapes arrive every few seconds from machines, not people:
 * logged only with log.probes. */
static int request_log_wanted(const sf_config *c, const char *route)
{
    if (!c->log.requests)
        return 0;
    int probe = !strcmp(route, "healthz") || !strcmp(route, "readyz") || !strcmp(route, "metrics");
    return !probe || c->log.probes;
}

/* The request log line: one event with its fields (JSON members in json mode). */
static void log_request(const sf_req *r, int status, double dur, int ok)
{
    sf_log_field f[9];
    int n = 0;
    f[n++] = SF_LF_STR("method", r->method);
    f[n++] = SF_LF_STR("path", r->path);
    f[n++] = SF_LF_NUM("status", status);
    f[n++] = SF_LF_NUM("duration_ms", dur * 1e3);
    f[n++] = SF_LF_NUM("bytes", r->bytes_out);
    f[n++] = SF_LF_NUM("bytes_in", r->bytes_in);
    f[n++] = SF_LF_STR("request_id", r->request_id);
    if (r->batch_id)
        f[n++] = SF_LF_NUM("batch_id", r->batch_id);
    if (!ok)
        f[n++] = SF_LF_STR("note", "connection ended early");
    sf_log_fields(SF_LOG_INFO, "request", f, n);
}

static void completed_cb(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    sf_http *h = cls;
    sf_req *r = *con_cls;
    if (!r)
        return;
    *con_cls = NULL;
    pthread_mutex_lock(&h->wmu);
    if (r->priv->in_wait_list)
        unlink_waiter_locked(h, r);
    pthread_mutex_unlock(&h->wmu);
    int ok = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK;
    if (r->route && r->route->stream && r->route->stream->on_done)
        r->route->stream->on_done(r, ok);
    if (r->priv->pending)
        MHD_destroy_response(r->priv->pending);

    double dur = (double)(sf_now_ns() - r->t_start_ns) / 1e9;
    int status = ok ? r->status : (r->status ? r->status : 499);
    const char *route = r->route ? r->route->name : "unmatched";
    char code[8];
    snprintf(code, sizeof code, "%d", status);
    const char *rc[] = {route, code};
    sf_counter_inc_l(h->app->m.http_requests, rc, 1);
    const char *rl[] = {route};
    sf_hist_observe(sf_metric_child(h->app->m.http_duration, rl), dur);
    if (request_log_wanted(sf_config_cur(), route))
        log_request(r, status, dur, ok);
    free(r->body);
    free(r);
    atomic_fetch_sub(&h->active, 1);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    SF_DEBUG("libmicrohttpd: %s", msg);
}

sf_http *sf_http_start(sf_app *app, char *err, size_t errlen)
{
    sf_http *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->app = app;
    pthread_mutex_init(&h->wmu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->wcv, &ca);
    pthread_condattr_destroy(&ca);
    app->http = h;

    const sf_config *c = &app->cfg;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    char why[256];
    if (sf_netaddr_resolve(c->http.host, c->http.port, &addr, &addr_len, why, sizeof why)) {
        snprintf(err, errlen, "http.host: %s", why);
        free(h);
        app->http = NULL;
        return NULL;
    }
    /* Memory per connection: headers (bounded by http.max_header_bytes, which
     * on_headers enforces with a JSON 431; twice that here is a backstop) plus
     * a large read buffer so uploads arrive in big chunks. */
    size_t mem = (size_t)c->http.max_header_bytes * 2 + (1u << 20);
    /* poll(), not epoll: libmicrohttpd 0.9.75's edge-triggered epoll mode
     * misses an end of stream that arrives with the last bytes of a body (a
     * loader killed mid-upload), leaving its ring slot FILLING until the
     * connection timeout (tests/integration/test_ingest.py). Each pool thread
     * polls its own share of at most http.max_connections sockets. */
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    /* "::" also takes IPv4 clients (dual stack), as 0.0.0.0 does on IPv4. */
    if (addr.ss_family == AF_INET6)
        flags |= MHD_USE_DUAL_STACK;
    h->d = MHD_start_daemon(
        flags, (uint16_t)c->http.port, NULL, NULL, access_cb, h, MHD_OPTION_SOCK_ADDR, &addr,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)c->http.threads, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)c->http.max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)c->http.connection_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, mem,
        MHD_OPTION_NOTIFY_COMPLETED, completed_cb, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_END);
    if (!h->d) {
        snprintf(err, errlen, "cannot listen on %s:%d (in use, or not permitted)", c->http.host,
                 c->http.port);
        free(h);
        app->http = NULL;
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : c->http.port;
    pthread_create(&h->timer, NULL, timer_main, h);
    return h;
}

int sf_http_port(const sf_http *h) { return h->port; }
int sf_http_active(const sf_http *h) { return atomic_load(&((sf_http *)h)->active); }

void sf_http_stop(sf_http *h)
{
    if (!h)
        return;
    sf_http_wake_all(h);
    pthread_join(h->timer, NULL);
    MHD_stop_daemon(h->d);
    pthread_mutex_destroy(&h->wmu);
    pthread_cond_destroy(&h->wcv);
    h->app->http = NULL;
    free(h);
}
