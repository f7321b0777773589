/* server/http.c — see http.h. */
#include "server/http.h"
#include "server/http_impl.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <linux/tcp.h> /* struct tcp_info with tcpi_bytes_received (glibc's lacks it) */
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/clock.h"
#include "server/config.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/netaddr.h"
#include "server/text.h"
#include "server/tls.h"


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

/* Finds the route; *allow lists the methods of routes whose path matches.
 * probes_only: the metrics port, where only SF_ROUTE_PROBE routes exist. */
static const sf_route *route_find(const char *method, const char *path, int probes_only,
                                  char *param, size_t cap, char *allow, size_t allow_cap,
                                  int *path_found)
{
    const sf_route *hit = NULL;
    allow[0] = '\0';
    *path_found = 0;
    for (size_t i = 0; i < sf_routes_len; i++) {
        char p[sizeof ((sf_req *)0)->param];
        if (probes_only && !(sf_routes[i].flags & SF_ROUTE_PROBE))
            continue;
        if (!path_match(sf_routes[i].pattern, path, p, sizeof p))
            continue;
        *path_found = 1;
        size_t l = strlen(allow);
        /* HEAD is served wherever GET is (below). */
        snprintf(allow + l, allow_cap - l, "%s%s%s", l ? ", " : "", sf_routes[i].method,
                 strcmp(sf_routes[i].method, "GET") == 0 ? ", HEAD" : "");
        if (!hit && strcmp(sf_routes[i].method, method) == 0) {
            hit = &sf_routes[i];
            snprintf(param, cap, "%s", p);
        }
    }
    /* HEAD is answered as GET by libmicrohttpd (it sends no body). */
    if (!hit && strcmp(method, "HEAD") == 0)
        return route_find("GET", path, probes_only, param, cap, allow, allow_cap, path_found);
    return hit;
}

/* ---- replies ------------------------------------------------------------------ */

static void conn_set_phase(sf_http *h, sf_conn *c, conn_phase phase);

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
        MHD_add_response_header(resp, r->priv->extra[i].name, r->priv->extra[i].value);
    r->priv->nextra = 0;
    /* While draining, a kept-alive connection would only bring the next
     * request to a server that is going away: close it after this reply. The
     * metrics port closes every connection after its reply: a probe or a
     * scrape is one request, and a slot kept alive there is one a probe
     * cannot have (PROBE_MAX_CONNECTIONS). */
    if (r->priv->l->probes_only || atomic_load(r->priv->h->ctx.draining))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
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
        /* The rest of the body is drained: within http.header_timeout_s from
         * now, if nothing timed the body so far (an upload that held a slot). */
        if (r->priv->c && r->priv->c->phase == PHASE_FREE)
            conn_set_phase(r->priv->h, r->priv->c, PHASE_BODY);
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
    char msg[512], fld[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* Messages and fields quote what the client sent (a path, a header, a
     * JSON key): the reply must stay valid UTF-8 JSON whatever that was. */
    sf_text_sanitize(msg);
    if (field) {
        snprintf(fld, sizeof fld, "%s", field);
        sf_text_sanitize(fld);
        field = fld;
    }
    if (r->priv->h) {
        const char *v[] = {code};
        sf_counter_inc_l(r->priv->h->ctx.errors, v, 1);
    }
    snprintf(r->priv->error_code, sizeof r->priv->error_code, "%s", code);
    /* Every 429/503 tells the client when to come back (the spec promises it). */
    int has_ra = 0;
    for (int i = 0; i < r->priv->nextra; i++)
        has_ra |= strcasecmp(r->priv->extra[i].name, "Retry-After") == 0;
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
    snprintf(r->priv->extra[r->priv->nextra].name, sizeof r->priv->extra[0].name, "%s", name);
    snprintf(r->priv->extra[r->priv->nextra].value, sizeof r->priv->extra[0].value, "%s", value);
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

/* ---- the request deadline --------------------------------------------------- */

/* libmicrohttpd's connection timeout is an idle timeout: a client sending a
 * byte every few seconds keeps a connection forever, and
 * http.max_connections of them lock everyone else out. So the timer thread
 * bounds each phase of a connection (conn_phase) and shuts down the socket of
 * one that overstays (the connection then ends as if the client had left;
 * counted as streamfeed_http_errors_total{code}):
 *   - a request's head (TLS handshake, request line and headers) has
 *     http.header_timeout_s from the connection's accept or, on a kept-alive
 *     connection, from the first byte after the previous request, seen by
 *     the sweep in the socket's TCP_INFO byte count ("header_timeout");
 *   - a body that is buffered (JSON) or drained after a refusal, and an
 *     upload's body until it holds a ring slot, get as long again from the
 *     end of the headers ("body_timeout"); an upload that holds a slot is
 *     bounded by the slow-upload sweep (server/upload.c), and a wait for a
 *     slot by its own timeout, after which the allowance starts again;
 *   - a body streamed to its route (a checkpoint PUT) gets
 *     http.upload_deadline_s ("upload_deadline_exceeded").
 * Between requests a kept-alive connection is held by the idle timeout. A
 * connection leaves h->conns in NOTIFY_CONNECTION CLOSED, which libmicrohttpd
 * runs before it closes the socket, so the descriptor shut down is always the
 * connection's own. */
static void conn_set_phase(sf_http *h, sf_conn *c, conn_phase phase)
{
    if (!c || c->phase == phase)
        return;
    pthread_mutex_lock(&h->wmu);
    c->phase = phase;
    c->from_ns = sf_now_ns();
    c->expired = 0;
    pthread_mutex_unlock(&h->wmu);
}

/* Bytes the socket has received so far (TCP_INFO), or UINT64_MAX when the
 * kernel does not say. */
static uint64_t socket_bytes_received(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
        return UINT64_MAX;
    return ti.tcpi_bytes_received;
}

static void sweep_locked(sf_http *h, uint64_t now)
{
    const sf_config *c = sf_config_cur();
    const uint64_t head_limit = (uint64_t)c->http.header_timeout_s * 1000000000ull;
    const uint64_t upload_limit = (uint64_t)c->http.upload_deadline_s * 1000000000ull;
    for (sf_conn *k = h->conns; k; k = k->next) {
        if (k->expired || k->phase == PHASE_FREE)
            continue;
        if (k->waiting)
            continue; /* suspended: bounded by the wait's own timeout */
        uint64_t from = k->from_ns, limit = head_limit;
        const char *code = "header_timeout";
        if (k->phase == PHASE_IDLE) {
            if (!k->head_seen_ns) {
                uint64_t got = socket_bytes_received(k->fd);
                if (got == UINT64_MAX || got == k->idle_bytes)
                    continue;
                k->head_seen_ns = now; /* the next request began within the last tick */
            }
            from = k->head_seen_ns;
        } else if (k->phase == PHASE_BODY) {
            code = "body_timeout";
        } else if (k->phase == PHASE_STREAM) {
            code = "upload_deadline_exceeded";
            limit = upload_limit;
        }
        if (limit == 0 || now - from < limit) /* upload_deadline_s 0: no deadline */
            continue;
        k->expired = 1;
        shutdown(k->fd, SHUT_RDWR);
        const char *v[] = {code};
        sf_counter_inc_l(h->ctx.errors, v, 1);
        SF_DEBUG("a connection ran past its deadline (%s): closed", code);
    }
}

/* Resumes waiters whose deadline passed and, once a second, sweeps the header
 * deadline. Sleeps on a condition variable until the nearest deadline (or a
 * new waiter), so it costs nothing when idle. */
static void *timer_main(void *arg)
{
    sf_http *h = arg;
    uint64_t next_tick = sf_now_ns() + TICK_NS;
    pthread_mutex_lock(&h->wmu);
    while (!h->timer_stop) {
        uint64_t now = sf_now_ns();
        if (now >= next_tick && h->tick) {
            /* The tick takes its own locks (and may wake waiters): not under wmu. */
            pthread_mutex_unlock(&h->wmu);
            h->tick(h->tick_ctx);
            pthread_mutex_lock(&h->wmu);
            now = sf_now_ns();
            next_tick = now + TICK_NS;
            sweep_locked(h, now);
            sf_http_sweep_gone_locked(h);
        }
        uint64_t next = next_tick > now ? next_tick : now + TICK_NS;
        for (sf_req *r = h->waiters, *n; r; r = n) {
            n = r->priv->wait_next;
            if (r->priv->deadline_ns <= now)
                sf_http_resume_locked(h, r, SF_WAIT_TIMEOUT);
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

/* What on_headers needs to know about the request's header lines, in one pass. */
typedef struct header_scan {
    size_t bytes;            /* total size, as counted against http.max_header_bytes */
    int hosts;               /* Host lines */
    const char *host;        /* the first Host value */
    int content_lengths;     /* Content-Length lines */
    int cl_conflict;         /* two of them with different values */
    int cl_bad;              /* a value that is not plain digits */
    const char *cl;          /* the first value */
    const char *te;          /* the first Transfer-Encoding, if any (libmicrohttpd frames by it) */
    int tes;                 /* Transfer-Encoding lines */
    int expect_continue;     /* Expect: 100-continue */
} header_scan;

static int all_digits(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return 0;
    return 1;
}

/* The query's keys, to find one given twice: sf_req_arg reads the first, and
 * a client (or a filter in front) meaning the other would be misread. */
typedef struct {
    const char *key[MAX_QUERY_ARGS];
    int n;
    const char *dup;  /* a key given twice, or NULL */
    const char *bare; /* a key without "=value" ("?wait"), or NULL */
    int too_many;
} query_scan;

static enum MHD_Result scan_query(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    query_scan *q = cls;
    if (!value) {
        /* sf_req_arg would take it for absent, while "wait=" is refused. */
        q->bare = key;
        return MHD_NO;
    }
    for (int i = 0; i < q->n; i++)
        if (strcmp(q->key[i], key) == 0) {
            q->dup = q->key[i];
            return MHD_NO;
        }
    if (q->n == MAX_QUERY_ARGS) {
        q->too_many = 1;
        return MHD_NO;
    }
    q->key[q->n++] = key;
    return MHD_YES;
}

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value)
{
    header_scan *sc = cls;
    (void)kind;
    sc->bytes += strlen(key) + (value ? strlen(value) : 0) + 4;
    if (strcasecmp(key, "Host") == 0) {
        if (sc->hosts++ == 0)
            sc->host = value ? value : "";
    }
    else if (strcasecmp(key, "Expect") == 0 && value && strcasecmp(value, "100-continue") == 0)
        sc->expect_continue = 1;
    else if (strcasecmp(key, "Transfer-Encoding") == 0) {
        if (sc->tes++ == 0)
            sc->te = value ? value : "";
    }
    else if (strcasecmp(key, "Content-Length") == 0) {
        const char *v = value ? value : "";
        if (!all_digits(v))
            sc->cl_bad = 1;
        if (sc->content_lengths++ == 0)
            sc->cl = v;
        else if (strcmp(sc->cl, v) != 0)
            sc->cl_conflict = 1;
    }
    return MHD_YES;
}

/* Whether a Host value is uri-host [":" port] (RFC 9112 3.2, RFC 3986 3.2.2):
 * a bracketed IP literal or a reg-name of unreserved and sub-delims
 * characters and %-escapes, then an optional port of digits. Empty is
 * allowed (a target without an authority). */
static int host_ok(const char *v)
{
    const char *p = v;
    if (*p == '[') {
        const char *close = strchr(p, ']');
        if (!close || close == p + 1)
            return 0;
        for (p++; p < close; p++)
            if (!isalnum((unsigned char)*p) && !strchr(":.%-_~", *p))
                return 0;
        p++;
    } else {
        for (; *p && *p != ':'; p++)
            if (!isalnum((unsigned char)*p) && !strchr("-._~!$&'()*+,;=%", *p))
                return 0;
    }
    if (*p == ':')
        for (p++; *p; p++)
            if (*p < '0' || *p > '9')
                return 0;
    return *p == '\0';
}

/* Compares the presented token with the configured one in time that depends
 * on neither: both are hashed to SHA-256 first, so the comparison always runs
 * over 32 bytes whatever the lengths, and a mismatch's position says nothing. */
static int token_ok(const char *given, size_t given_len, const char *want)
{
    unsigned char a[32], b[32];
    if (gnutls_hash_fast(GNUTLS_DIG_SHA256, given, given_len, a) < 0 ||
        gnutls_hash_fast(GNUTLS_DIG_SHA256, want, strlen(want), b) < 0)
        return 0;
    unsigned diff = 0;
    for (size_t i = 0; i < sizeof a; i++)
        diff |= (unsigned)(a[i] ^ b[i]);
    return diff == 0;
}

/* Authorization: <scheme> <credentials>, where the scheme is matched without
 * regard to case (RFC 9110 11.1) and one or more spaces may follow it. */
static int bearer_ok(const char *auth, const char *want)
{
    if (!auth || strncasecmp(auth, "Bearer", 6) != 0 || auth[6] != ' ')
        return 0;
    const char *t = auth + 6;
    while (*t == ' ')
        t++;
    size_t n = strlen(t);
    while (n && (t[n - 1] == ' ' || t[n - 1] == '\t'))
        n--;
    return n > 0 && token_ok(t, n, want);
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

/* The checks of a request's head that need no route: its size, its framing,
 * Host and the path's encoding. Returns 0, or -1 with the error reply made. */
static int check_head(sf_req *r, header_scan sc, const char *version, const sf_config *cfgp)
{
#define cfg (*cfgp)
    /* The request target is part of the head: libmicrohttpd alone would take
     * one as large as its connection pool (over 1 MB) and hand it to every
     * route, log line and error message. */
    if (r->priv->uri_len > (size_t)cfg.http.max_header_bytes)
        return sf_reply_error(r, 414, "uri_too_long", "the request target is %zu bytes; the limit is %d",
                              r->priv->uri_len, cfg.http.max_header_bytes),
               -1;
    if (sc.bytes + r->priv->uri_len > (size_t)cfg.http.max_header_bytes)
        return sf_reply_error(r, 431, "headers_too_large",
                              "the request target and headers are %zu bytes; the limit is %d",
                              sc.bytes + r->priv->uri_len, cfg.http.max_header_bytes),
               -1;
    /* Framing that two parties could read differently (RFC 9112 6.3) is how
     * requests are smuggled past a proxy: refuse it, and close the connection
     * rather than guess where the body ends. */
    if (sc.te && sc.cl) {
        tl_body_pending = 0;
        sf_reply_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
        return sf_reply_error(r, 400, "content_length_with_transfer_encoding",
                              "a request may carry Content-Length or Transfer-Encoding, not both"),
               -1;
    }
    if (sc.cl_conflict || sc.cl_bad) {
        tl_body_pending = 0;
        sf_reply_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
        return sf_reply_error(r, 400, "bad_content_length",
                              sc.cl_conflict ? "the request carries Content-Length headers with "
                                               "different values"
                                             : "Content-Length must be a decimal number"),
               -1;
    }
    /* Two Transfer-Encoding lines are read by libmicrohttpd by the first and
     * by some proxies by the last (or as a list); HTTP/1.0 has no chunked
     * framing, so a proxy speaking it would not see where the body ends
     * (RFC 9112 6.1: such framing is faulty). */
    if (sc.tes > 1 || (sc.te && version && strcmp(version, MHD_HTTP_VERSION_1_0) == 0)) {
        tl_body_pending = 0;
        sf_reply_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
        if (sc.tes > 1)
            return sf_reply_error(r, 400, "bad_transfer_encoding",
                                  "the request carries %d Transfer-Encoding headers; at most one is allowed", sc.tes),
                   -1;
        return sf_reply_error(r, 400, "bad_transfer_encoding",
                              "Transfer-Encoding is not HTTP/1.0 framing: send Content-Length"),
               -1;
    }
    if (sc.te && strcasecmp(sc.te, "chunked") != 0) {
        tl_body_pending = 0;
        sf_reply_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
        return sf_reply_error(r, 501, "transfer_encoding_not_implemented",
                              "Transfer-Encoding \"%.40s\" is not implemented; only chunked is",
                              sc.te),
               -1;
    }
    /* HTTP/1.1 requires exactly one Host (RFC 9112 3.2); HTTP/1.0 may omit it. */
    if (sc.hosts > 1)
        return sf_reply_error(r, 400, "bad_host",
                              "the request carries %d Host headers; exactly one is allowed",
                              sc.hosts),
               -1;
    if (sc.hosts == 0 && version && strcmp(version, MHD_HTTP_VERSION_1_1) == 0)
        return sf_reply_error(r, 400, "bad_host", "an HTTP/1.1 request must carry a Host header"),
               -1;
    if (sc.host && !host_ok(sc.host))
        return sf_reply_error(r, 400, "bad_host", "the Host header \"%.64s\" is not a host name or address "
                              "with an optional port", sc.host),
               -1;
    /* Routes match the decoded path: an encoded '/' would reach a route
     * that a proxy's rules on the raw path (allow /v1/batches only) never
     * saw, and no route takes one in a segment. */
    if (r->priv->bad_uri)
        return sf_reply_error(r, 400, "bad_path", "%s",
                              r->priv->bad_uri == 1 ? "the request target contains %00 (an encoded NUL byte)"
                                                    : "the request's path contains %2F (an encoded '/'), "
                                                      "which no route takes"),
               -1;
    return 0;
#undef cfg
}

/* First call: headers are in. Returns 0 to go on, -1 when an error reply was
 * made (deferred when a body follows). */
static int on_headers(sf_req *r, struct MHD_Connection *conn, const char *method, const char *url,
                      const char *version)
{
    sf_http *h = r->priv->h;
    const sf_config *cfgp = sf_config_cur();
#define cfg (*cfgp)
    header_scan sc = {0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, scan_header, &sc);
    uint64_t content_length = sc.cl ? strtoull(sc.cl, NULL, 10) : 0;
    r->priv->content_length = sc.te ? 0 : content_length;
    int has_body = (sc.cl && content_length > 0) || sc.te;
    /* Errors found now are sent after the body, unless the body is too big to
     * drain, or the client waits to be told before it sends it (Expect:
     * 100-continue): such a client gets the error at once, in place of
     * libmicrohttpd's 100 Continue, and the connection closes rather than
     * take a body sent for nothing. */
    tl_body_pending = has_body && content_length <= DRAIN_LIMIT && !sc.expect_continue;
    /* The route, looked up first so that a refusal of the head below is
     * counted under it, and an upload's by its route's rejection counter
     * (stream_rejected); a request without one gets its 404 or 405 after
     * the checks of its framing. */
    char allow[128];
    int path_found;
    r->route = route_find(method, url, r->priv->l->probes_only, r->param, sizeof r->param, allow,
                          sizeof allow, &path_found);

    if (check_head(r, sc, version, cfgp) != 0) {
        stream_rejected(r, r->priv->error_code);
        return -1;
    }

    if (!r->route) {
        if (path_found) {
            sf_reply_header(r, "Allow", allow);
            sf_reply_error(r, 405, "method_not_allowed", "%s is not allowed on %s; allowed: %s",
                           method, url, allow);
        } else {
            sf_reply_error(r, 404, "not_found", "no route for %s %s%s", method, url,
                           r->priv->l->probes_only ? " on the metrics port (GET /metrics, "
                                                     "/healthz and /readyz only)"
                                                   : "");
        }
        return -1;
    }
    query_scan qs = {.n = 0};
    MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, scan_query, &qs);
    qs.too_many |= r->priv->query_cut;
    if (qs.dup || qs.bare || qs.too_many) {
        if (qs.bare)
            sf_reply_error_field(r, 400, "bad_query", qs.bare,
                                 "the query parameter \"%.64s\" has no value; give it as name=value", qs.bare);
        else if (qs.dup)
            sf_reply_error_field(r, 400, "bad_query", qs.dup,
                                 "the query parameter \"%.64s\" is given twice; each may be given once", qs.dup);
        else
            sf_reply_error(r, 400, "bad_query", "more than %d query parameters", MAX_QUERY_ARGS);
        stream_rejected(r, "bad_query");
        return -1;
    }
    const sf_route *rt = r->route;
    if (!(rt->flags & SF_ROUTE_OPEN) && cfg.http.token[0] &&
        !bearer_ok(MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization"),
                   cfg.http.token)) {
        sf_reply_header(r, "WWW-Authenticate", "Bearer");
        sf_reply_error(r, 401, "unauthorized", "a valid bearer token is required for %s %s",
                       method, rt->pattern);
        stream_rejected(r, "unauthorized");
        return -1;
    }
    if ((rt->flags & SF_ROUTE_UPLOAD) && atomic_load(h->ctx.draining)) {
        /* A batch whose request began after SIGTERM is not taken: the loader
         * goes elsewhere now instead of after the drain (docs/OPERATIONS.md). */
        sf_reply_error(r, 503, "shutting_down", "the service is shutting down");
        stream_rejected(r, "shutting_down");
        return -1;
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
    if (rt->stream && rt->stream->on_head && rt->stream->on_head(r) != 0)
        return -1;
    r->priv->body_limit = rt->stream ? rt->stream->max_body(r->app) : (uint64_t)cfg.http.max_json_bytes;
    r->priv->body_option = rt->stream ? rt->stream->max_body_option : "http.max_json_bytes";
    if (sc.cl && content_length > r->priv->body_limit) {
        tl_body_pending = 0; /* too big to drain: reply now, the connection closes */
        sf_reply_error(r, 413, "body_too_large", "body of %llu bytes exceeds the limit of %llu%s%s%s",
                       (unsigned long long)content_length, (unsigned long long)r->priv->body_limit,
                       r->priv->body_option ? " (" : "", r->priv->body_option ? r->priv->body_option : "",
                       r->priv->body_option ? ")" : "");
        stream_rejected(r, "body_too_large");
        return -1;
    }
    return 0;
#undef cfg
}

static int buffer_body(sf_req *r, const char *data, size_t len)
{
    if (r->body_len + len > r->priv->body_limit) {
        sf_reply_error(r, 413, "body_too_large", "body exceeds the limit of %llu bytes%s%s%s",
                       (unsigned long long)r->priv->body_limit, r->priv->body_option ? " (" : "",
                       r->priv->body_option ? r->priv->body_option : "", r->priv->body_option ? ")" : "");
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

static void req_end(sf_req *r, enum MHD_RequestTerminationCode toe);

static sf_req *req_new(struct sf_listener *l, struct MHD_Connection *conn)
{
    sf_req *r = calloc(1, sizeof *r + sizeof(struct sf_req_priv));
    if (!r)
        return NULL;
    r->priv = (struct sf_req_priv *)(r + 1);
    r->priv->conn = conn;
    r->priv->h = l->h;
    r->priv->l = l;
    r->priv->fd = -1;
    r->app = l->h->ctx.app;
    r->t_start_ns = sf_now_ns();
    return r;
}

/* libmicrohttpd shows the request target here before it decodes it: the one
 * place where an encoded NUL (%00), which would cut the decoded path short,
 * or an encoded '/' in the path can be seen. The request state starts here.
 *
 * It is also the one place before libmicrohttpd splits the query into its
 * arguments, each a record in the connection's memory pool. A query of tens
 * of thousands of arguments overflows the pool, and 0.9.75 then drops the
 * request: no reply, no completion callback, and a parse that scans the rest
 * of the query once per argument. A target over http.max_header_bytes (414)
 * or with more than MAX_QUERY_ARGS arguments (400 bad_query) is refused in
 * on_headers anyway, so its query is cut here, in libmicrohttpd's own
 * buffer, which the target points into and which it only reads afterwards:
 * the request then goes on with no arguments and gets its JSON reply. */
static void *uri_cb(void *cls, const char *uri, struct MHD_Connection *conn)
{
    struct sf_listener *l = cls;
    sf_req *r = req_new(l, conn);
    if (r && uri) {
        r->priv->uri_len = strlen(uri);
        const char *q = strchr(uri, '?');
        for (const char *p = strchr(uri, '%'); p && !r->priv->bad_uri; p = strchr(p + 1, '%')) {
            if (p[1] == '0' && p[2] == '0')
                r->priv->bad_uri = 1;
            else if ((!q || p < q) && p[1] == '2' && (p[2] == 'F' || p[2] == 'f'))
                r->priv->bad_uri = 2;
        }
        if (q) {
            size_t args = 1;
            for (const char *p = strchr(q + 1, '&'); p && args <= MAX_QUERY_ARGS; p = strchr(p + 1, '&'))
                args++;
            if (args > MAX_QUERY_ARGS || r->priv->uri_len > (size_t)sf_config_cur()->http.max_header_bytes) {
                ((char *)q)[1] = '\0';
                r->priv->query_cut = 1;
            }
        }
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    sf_conn *c = ci ? ci->socket_context : NULL;
    if (c) {
        /* A request libmicrohttpd dropped without completing it. */
        if (c->req)
            req_end(c->req, MHD_REQUEST_TERMINATED_WITH_ERROR);
        c->req = r;
        if (c->phase == PHASE_IDLE) {
            /* The head of a request on a kept-alive connection: its deadline
             * runs from its first byte, if the sweep saw it. */
            pthread_mutex_lock(&l->h->wmu);
            c->phase = PHASE_HEAD;
            c->from_ns = c->head_seen_ns ? c->head_seen_ns : sf_now_ns();
            c->expired = 0;
            pthread_mutex_unlock(&l->h->wmu);
        }
    }
    if (r) {
        r->priv->c = c;
        r->priv->fd = c ? c->fd : -1;
    }
    return r;
}

/* sf_tls_hold_fn: a handshake took a reference to a certificate pair for its
 * connection (libmicrohttpd sets the session's pointer to it). */
static void tls_hold(void *session, sf_tls_pair *pair)
{
    struct MHD_Connection *conn = gnutls_session_get_ptr(session);
    const union MHD_ConnectionInfo *ci =
        conn ? MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT) : NULL;
    sf_conn *c = ci ? ci->socket_context : NULL;
    if (!c)
        return; /* no connection state to keep it: the pair lives until exit */
    sf_tls_pair_release(c->tls_pair); /* a second handshake on one connection */
    c->tls_pair = pair;
}

/* NOTIFY_CONNECTION: a connection's deadline state lives from its accept to
 * its close (the request deadline above). */
static void conn_cb(void *cls, struct MHD_Connection *conn, void **socket_context,
                    enum MHD_ConnectionNotificationCode code)
{
    struct sf_listener *l = cls;
    sf_http *h = l->h;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        sf_conn *c = calloc(1, sizeof *c);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!c || !ci) {
            /* Without it the connection has only libmicrohttpd's idle timeout. */
            free(c);
            *socket_context = NULL;
            return;
        }
        c->l = l;
        c->fd = ci->connect_fd;
        c->phase = PHASE_HEAD;
        pthread_mutex_lock(&h->wmu);
        c->from_ns = sf_now_ns();
        c->next = h->conns;
        if (h->conns)
            h->conns->prev = c;
        h->conns = c;
        pthread_mutex_unlock(&h->wmu);
        *socket_context = c;
        return;
    }
    sf_conn *c = *socket_context;
    if (!c)
        return;
    *socket_context = NULL;
    if (c->req) {
        c->req->priv->c = NULL;
        req_end(c->req, MHD_REQUEST_TERMINATED_WITH_ERROR);
    }
    sf_tls_pair_release(c->tls_pair);
    pthread_mutex_lock(&h->wmu);
    if (c->prev)
        c->prev->next = c->next;
    else
        h->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    pthread_mutex_unlock(&h->wmu);
    free(c);
}

/* Sets the socket's receive low-water mark for the rest of an upload, once
 * its handler has taken a chunk. Without it the HTTP thread, which reads
 * faster than one loader writes, sleeps in poll() after every read and is
 * woken for each few TCP segments: on loopback about 41 wake-ups and 50 reads
 * of 127 KB per W1 body, and each wake-up is paid on the sender's CPU
 * (docs/DESIGN.md §1, "What one connection costs"). With the mark, poll()
 * reports the socket once a block of the body is queued.
 *
 * The mark never exceeds the body bytes still to come from the socket
 * (Content-Length, less the bytes libmicrohttpd read: those it was told are
 * consumed and those left in its buffer), so the last block always wakes
 * the thread, and the mark is back to 1 once the body is in: the next
 * request's head sees the kernel's default. A closed or reset connection is readable whatever the
 * mark. It stays off for chunked bodies (the length is unknown), with TLS
 * (records and plaintext buffered by the TLS library do not map to socket
 * bytes), and when http.upload_min_bytes_per_s is 0 (a loader may then be
 * as slow as it likes, and must not be held to a block size); otherwise it
 * is bounded so that a loader at that rate fills it within
 * RECV_LOWAT_LAG_MS and within half the idle timeout. */
static void recv_lowat_update(sf_req *r, size_t unconsumed)
{
    struct sf_req_priv *p = r->priv;
    if (p->fd < 0)
        return;
    uint64_t taken = p->body_taken + unconsumed;
    uint64_t left = p->content_length > taken ? p->content_length - taken : 0;
    uint64_t rate = (uint64_t)sf_config_cur()->http.upload_min_bytes_per_s;
    uint64_t lag_ms = (uint64_t)r->priv->h->ctx.cfg->http.connection_timeout_s * 500u;
    if (lag_ms > RECV_LOWAT_LAG_MS)
        lag_ms = RECV_LOWAT_LAG_MS;
    uint64_t mark = rate * lag_ms / 1000u;
    if (mark > RECV_LOWAT_MAX)
        mark = RECV_LOWAT_MAX;
    if (mark > left)
        mark = left;
    int want = mark > 1 ? (int)mark : 1;
    if (want == (p->lowat ? p->lowat : 1))
        return;
    if (setsockopt(p->fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0)
        p->lowat = want;
}

/* A body chunk: to the route's stream, the buffer, or away while draining.
 * *size is left at the bytes not consumed. */
static enum MHD_Result on_body_chunk(sf_req *r, const char *data, size_t *size)
{
    tl_body_pending = 1;
    size_t len = *size;
    r->bytes_in += len;
    if (r->priv->draining || r->priv->pending) {
        *size = 0;
        tl_body_pending = 0;
        /* Draining costs too much: close. libmicrohttpd 0.9.75 queues a
         * reply only before the first body byte or after the last, so the
         * error cannot be sent from here. */
        return r->bytes_in > DRAIN_LIMIT + r->priv->body_limit ? MHD_NO : MHD_YES;
    }
    if (r->route->stream) {
        r->bytes_in -= len;
        size_t left = len;
        int rc = r->route->stream->on_data(r, (const uint8_t *)data, &left);
        r->bytes_in += len - left;
        *size = rc < 0 ? 0 : left;
        if (rc == SF_STREAM_CLOSE) {
            tl_body_pending = 0;
            return MHD_NO;
        }
    } else {
        buffer_body(r, data, len);
        *size = 0;
    }
    tl_body_pending = 0;
    return MHD_YES;
}

/* The path of a request target in absolute form ("http://host/v1/batches"),
 * which a server must accept (RFC 9112 3.2.2) and libmicrohttpd hands over
 * as sent: routes match the path alone. The authority names this server (the
 * Host check still applies to the request's own Host line). */
static const char *origin_path(const char *url)
{
    size_t skip = strncasecmp(url, "http://", 7) == 0 ? 7 : strncasecmp(url, "https://", 8) == 0 ? 8 : 0;
    if (!skip)
        return url;
    const char *p = strchr(url + skip, '/');
    return p ? p : "/";
}

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls)
{
    struct sf_listener *l = cls;
    sf_http *h = l->h;
    sf_req *r = *con_cls;
    if (!r) {
        /* uri_cb could not allocate: nothing can be answered. */
        return MHD_NO;
    }
    if (!r->priv->started) {
        r->priv->started = 1;
        r->method = method;
        url = origin_path(url);
        r->path = url; /* r->priv->fd was taken in uri_cb */
        make_request_id(r, conn);
        if (!l->probes_only)
            atomic_fetch_add(&h->active, 1);
        on_headers(r, conn, method, url, version);
        /* The headers are complete; the body's deadline starts (a request
         * without a body leaves it at its next call, just below). */
        const int streamed = r->route && r->route->stream && !r->priv->pending && !r->priv->draining;
        conn_set_phase(h, r->priv->c,
                       streamed && !(r->route->flags & SF_ROUTE_UPLOAD) ? PHASE_STREAM : PHASE_BODY);
        tl_body_pending = 0;
        return MHD_YES;
    }

    if (r->wait == SF_WAIT_GONE)
        return MHD_NO; /* nobody reads the reply: closed, ended as 499 (req_end) */
    if (*upload_data_size > 0) {
        size_t offered = *upload_data_size;
        enum MHD_Result rc = on_body_chunk(r, upload_data, upload_data_size);
        r->priv->body_taken += offered - *upload_data_size;
        if (rc == MHD_YES && !l->probes_only && !h->tls)
            recv_lowat_update(r, *upload_data_size);
        return rc;
    }

    /* The body is complete (or there was none): an upload that took a slot
     * left the timed phases then, and takes no lock here. */
    tl_body_pending = 0;
    conn_set_phase(h, r->priv->c, PHASE_FREE);
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
    sf_log_field f[10];
    int n = 0;
    f[n++] = SF_LF_STR("method", r->method);
    f[n++] = SF_LF_STR("path", r->path);
    f[n++] = SF_LF_NUM("status", status);
    f[n++] = SF_LF_NUM("duration_ms", dur * 1e3);
    f[n++] = SF_LF_NUM("bytes", r->bytes_out);
    f[n++] = SF_LF_NUM("bytes_in", r->bytes_in);
    f[n++] = SF_LF_STR("request_id", r->request_id);
    /* The reply's error code: a 4xx says what the client got wrong without
     * a second look at the reply or the metrics. */
    if (r->priv->error_code[0])
        f[n++] = SF_LF_STR("error", r->priv->error_code);
    if (r->batch_id)
        f[n++] = SF_LF_NUM("batch_id", r->batch_id);
    if (!ok)
        f[n++] = SF_LF_STR("note", "connection ended early");
    sf_log_fields(SF_LOG_INFO, "request", f, n);
}

/* The status of the reply libmicrohttpd queued itself, refusing a request its
 * parser could not take (a malformed header line, a bad Content-Length or
 * chunk size, an unsupported version), or 0 when it queued none: the reply
 * is still queued when the completion callback runs for such a request. */
static int mhd_status_of(const sf_req *r)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->priv->conn, MHD_CONNECTION_INFO_HTTP_STATUS);
    return ci ? (int)ci->http_status : 0;
}

/* Ends a request: its route's on_done, the metrics and the log line. From
 * libmicrohttpd's completion callback, or when the connection closes on a
 * request that libmicrohttpd dropped without one. */
static void req_end(sf_req *r, enum MHD_RequestTerminationCode toe)
{
    struct sf_listener *l = r->priv->l;
    sf_http *h = l->h;
    if (r->priv->c) {
        r->priv->c->req = NULL;
        /* A kept-alive connection waits for its next request's first byte. */
        uint64_t got = socket_bytes_received(r->priv->c->fd);
        pthread_mutex_lock(&h->wmu);
        r->priv->c->phase = PHASE_IDLE;
        r->priv->c->from_ns = sf_now_ns();
        r->priv->c->head_seen_ns = 0;
        r->priv->c->idle_bytes = got;
        r->priv->c->expired = 0;
        pthread_mutex_unlock(&h->wmu);
    }
    if (!r->priv->started) {
        /* Ended before its headers were complete: the client left, or
         * libmicrohttpd refused the request itself (a malformed request line
         * or header, an unsupported HTTP version, headers larger than its
         * memory pool). Those replies are its own fixed HTML: 0.9.75 has no
         * hook to render them, so they are not in the JSON error shape; the
         * reason is in its log line (debug level). Such a refusal is counted
         * under the route "unmatched" with the status sent; a client that
         * left mid-head got no reply and is not counted. */
        const int sent = mhd_status_of(r);
        if (sent) {
            char code[8];
            snprintf(code, sizeof code, "%d", sent);
            const char *rc[] = {"unmatched", code};
            sf_counter_inc_l(h->ctx.requests, rc, 1);
        }
        SF_DEBUG("a request ended before its headers were complete (code %d, status %d)", (int)toe, sent);
        free(r);
        return;
    }
    pthread_mutex_lock(&h->wmu);
    if (r->priv->in_wait_list)
        sf_http_unlink_waiter_locked(h, r);
    pthread_mutex_unlock(&h->wmu);
    int ok = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK;
    if (!ok && !r->status && r->priv->handled && (r->route->flags & SF_ROUTE_ON_GONE)) {
        /* Its handler ran and had not replied: it waits for something it
         * started, which nobody will read now. */
        r->wait = SF_WAIT_GONE;
        r->route->handler(r);
    }
    if (r->route && r->route->stream && r->route->stream->on_done)
        r->route->stream->on_done(r, ok);
    if (r->priv->pending)
        MHD_destroy_response(r->priv->pending);

    double dur = (double)(sf_now_ns() - r->t_start_ns) / 1e9;
    /* Not replied by its route: libmicrohttpd refused the body (a bad chunk
     * size) with its own reply, or the client went away (499). */
    int status = ok ? r->status : r->status ? r->status : mhd_status_of(r) ? mhd_status_of(r) : 499;
    const char *route = r->route ? r->route->name : "unmatched";
    char code[8];
    snprintf(code, sizeof code, "%d", status);
    const char *rc[] = {route, code};
    sf_counter_inc_l(h->ctx.requests, rc, 1);
    const char *rl[] = {route};
    sf_hist_observe(sf_metric_child(h->ctx.duration, rl), dur);
    if (request_log_wanted(sf_config_cur(), route))
        log_request(r, status, dur, ok);
    free(r->body);
    free(r);
    if (!l->probes_only)
        atomic_fetch_sub(&h->active, 1);
}

static void completed_cb(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    sf_req *r = *con_cls;
    if (!r)
        return;
    *con_cls = NULL;
    req_end(r, toe);
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

/* Binds and listens on host:port ourselves, so that a port in use is reported
 * as such (libmicrohttpd only says it could not start), and so that the
 * socket can be shut down for the drain. SO_REUSEADDR lets a restart bind
 * while the last run's connections sit in TIME_WAIT; SO_REUSEPORT, which would
 * let a second process listen on the same port and share its connections, is
 * deliberately not set. */
/* A listening socket of our own (libmicrohttpd gets it by MHD_OPTION_LISTEN_SOCKET,
 * so it can be quiesced and closed on our schedule). No SO_REUSEPORT: a second
 * server on the same port must fail, not share its connections. The host may be
 * a name or an IPv4/IPv6 address (server/netaddr.c); "::" also takes IPv4
 * clients (dual stack), as 0.0.0.0 does on IPv4. */
static int listen_on(const char *what, const char *host, int port, char *err, size_t errlen)
{
    struct sockaddr_storage addr;
    socklen_t addr_len;
    char why[256];
    if (sf_netaddr_resolve(host, port, &addr, &addr_len, why, sizeof why)) {
        snprintf(err, errlen, "http.host: %s", why);
        return -1;
    }
    int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "cannot create the %s socket: %s", what, strerror(errno));
        return -1;
    }
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (addr.ss_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, (struct sockaddr *)&addr, addr_len) != 0 || listen(fd, LISTEN_BACKLOG) != 0) {
        int e = errno;
        snprintf(err, errlen, "cannot listen on %s:%d (%s): %s%s", host, port, what, strerror(e),
                 e == EADDRINUSE ? " (another process, perhaps another streamfeed, holds it)" : "");
        close(fd);
        return -1;
    }
    return fd;
}

static int bound_port(int fd)
{
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    if (a.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
    return ntohs(((struct sockaddr_in *)&a)->sin_port);
}

static int listener_start(sf_http *h, struct sf_listener *l, int probes_only, int port, char *err,
                          size_t errlen)
{
    const sf_config *c = h->ctx.cfg;
    l->h = h;
    l->probes_only = probes_only;
    l->fd = listen_on(probes_only ? "http.metrics_port" : "http.port", c->http.host, port, err,
                      errlen);
    if (l->fd < 0)
        return -1;
    l->port = bound_port(l->fd);
    /* poll(), not epoll: libmicrohttpd 0.9.75's edge-triggered epoll mode
     * misses an end of stream that arrives with the last bytes of a body (a
     * loader killed mid-upload), leaving its ring slot FILLING until the
     * connection timeout (tests/integration/test_ingest.py). Each pool thread
     * polls its own share of at most http.max_connections sockets.
     * MHD_ALLOW_SUSPEND_RESUME brings MHD_USE_ITC, which MHD_quiesce_daemon
     * needs in this mode. */
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (probes_only) {
        l->d = MHD_start_daemon(
            flags, 0, NULL, NULL, access_cb, l, MHD_OPTION_LISTEN_SOCKET, l->fd,
            MHD_OPTION_CONNECTION_LIMIT, (unsigned)PROBE_MAX_CONNECTIONS,
            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)PROBE_MAX_PER_IP,
            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)PROBE_TIMEOUT_S,
            MHD_OPTION_URI_LOG_CALLBACK, uri_cb, l, MHD_OPTION_NOTIFY_COMPLETED, completed_cb, l,
            MHD_OPTION_NOTIFY_CONNECTION, conn_cb, l,
            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h, MHD_OPTION_END);
    } else {
        /* Memory per connection: headers (bounded by http.max_header_bytes,
         * which on_headers enforces with a JSON 431; twice that here is a
         * backstop) plus a large read buffer so uploads arrive in big chunks. */
        size_t mem = (size_t)c->http.max_header_bytes * 2 + (1u << 20);
        if (h->tls)
            flags |= MHD_USE_TLS;
        l->d = MHD_start_daemon(
            flags, 0, NULL, NULL, access_cb, l, MHD_OPTION_LISTEN_SOCKET, l->fd,
            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)c->http.threads, MHD_OPTION_CONNECTION_LIMIT,
            (unsigned)c->http.max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
            (unsigned)c->http.connection_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, mem,
            MHD_OPTION_URI_LOG_CALLBACK, uri_cb, l, MHD_OPTION_NOTIFY_COMPLETED, completed_cb, l,
            MHD_OPTION_NOTIFY_CONNECTION, conn_cb, l,
            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,
            /* Without TLS the list ends here and the TLS options are not read. */
            h->tls ? MHD_OPTION_HTTPS_CERT_CALLBACK : MHD_OPTION_END, sf_tls_callback(),
            MHD_OPTION_HTTPS_PRIORITIES, c->http.tls_priorities, MHD_OPTION_END);
    }
    if (!l->d) {
        snprintf(err, errlen, "libmicrohttpd could not start on %s:%d (see the debug log)",
                 c->http.host, l->port);
        close(l->fd);
        l->fd = -1;
        return -1;
    }
    return 0;
}

static void listener_stop(struct sf_listener *l)
{
    if (l->d)
        MHD_stop_daemon(l->d);
    /* libmicrohttpd closes the socket, unless it was quiesced: then it is ours. */
    if (l->quiesced && l->fd >= 0)
        close(l->fd);
    l->d = NULL;
    l->fd = -1;
}

sf_http *sf_http_start(const sf_http_ctx *ctx, char *err, size_t errlen)
{
    sf_http *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->ctx = *ctx;
    h->main.fd = h->probe.fd = -1;
    pthread_mutex_init(&h->wmu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->wcv, &ca);
    pthread_condattr_destroy(&ca);
    if (ctx->publish)
        *ctx->publish = h;

    const sf_config *c = ctx->cfg;
    if (c->http.tls_cert[0]) {
        if (sf_tls_init(c->http.tls_cert, c->http.tls_key, err, errlen))
            goto fail;
        sf_tls_set_hold(tls_hold);
        h->tls = 1;
    }
    if (listener_start(h, &h->main, 0, c->http.port, err, errlen))
        goto fail;
    if (c->http.metrics_port && listener_start(h, &h->probe, 1, c->http.metrics_port, err, errlen))
        goto fail;
    if (pthread_create(&h->timer, NULL, timer_main, h) != 0) {
        snprintf(err, errlen, "cannot start the HTTP timer thread");
        goto fail;
    }
    h->timer_started = 1;
    return h;
fail:
    listener_stop(&h->main);
    listener_stop(&h->probe);
    if (h->tls)
        sf_tls_shutdown();
    pthread_mutex_destroy(&h->wmu);
    pthread_cond_destroy(&h->wcv);
    if (ctx->publish)
        *ctx->publish = NULL;
    free(h);
    return NULL;
}

int sf_http_port(const sf_http *h) { return h->main.port; }
int sf_http_metrics_port(const sf_http *h) { return h->probe.d ? h->probe.port : 0; }
int sf_http_tls(const sf_http *h) { return h->tls; }
int sf_http_active(const sf_http *h) { return atomic_load(&((sf_http *)h)->active); }

void sf_http_set_tick(sf_http *h, void (*fn)(void *ctx), void *ctx)
{
    pthread_mutex_lock(&h->wmu);
    h->tick = fn;
    h->tick_ctx = ctx;
    pthread_mutex_unlock(&h->wmu);
}

void sf_http_quiesce(sf_http *h)
{
    if (!h || !h->main.d || h->main.quiesced)
        return;
    if (MHD_quiesce_daemon(h->main.d) == MHD_INVALID_SOCKET) {
        SF_WARN("http: cannot stop accepting connections (libmicrohttpd refused to quiesce)");
        return;
    }
    h->main.quiesced = 1;
    /* No thread accepts on it any more; shutting the listening socket down
     * (it stays open until the daemon stops) makes the kernel refuse new
     * connections at once instead of queueing them in the backlog. */
    shutdown(h->main.fd, SHUT_RDWR);
}

void sf_req_deadline_done(sf_req *r)
{
    conn_set_phase(r->priv->h, r->priv->c, PHASE_FREE);
}

void sf_req_abort(sf_req *r)
{
    if (r->priv->fd >= 0)
        shutdown(r->priv->fd, SHUT_RDWR);
}

int sf_http_tls_reload(sf_http *h, int force)
{
    if (!h || !h->tls)
        return 0;
    char err[512];
    int rc = sf_tls_reload(force, err, sizeof err);
    if (rc > 0)
        SF_INFO("http: TLS certificate reloaded from %s", h->ctx.cfg->http.tls_cert);
    else if (rc < 0)
        SF_WARN("http: TLS certificate not reloaded, the previous one stays in use: %s", err);
    return rc;
}

void sf_http_stop(sf_http *h)
{
    if (!h)
        return;
    sf_http_wake_all(h);
    if (h->timer_started) {
        pthread_mutex_lock(&h->wmu);
        h->timer_stop = 1;
        pthread_cond_broadcast(&h->wcv);
        pthread_mutex_unlock(&h->wmu);
        pthread_join(h->timer, NULL);
    }
    listener_stop(&h->main);
    /* The metrics port goes last: probes see readyz false until the end. */
    listener_stop(&h->probe);
    if (h->tls)
        sf_tls_shutdown();
    pthread_mutex_destroy(&h->wmu);
    pthread_cond_destroy(&h->wcv);
    if (h->ctx.publish)
        *h->ctx.publish = NULL;
    free(h);
}
