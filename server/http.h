/* server/http.h — the HTTP daemon (libmicrohttpd), routing, replies and
 * suspended requests.
 *
 * Threads: libmicrohttpd runs a poll() thread pool (http.threads). Every route
 * callback runs on one of those threads, for one request at a time; a request
 * is never handled by two threads at once. sf_http_wake may be called from any
 * thread (the engine wakes requests waiting for a slot or a result).
 *
 * A request's life:
 *   1. headers arrive: the route is matched (404, 405 with Allow), header size,
 *      auth, Content-Type and Content-Length are checked by this module;
 *   2. body chunks: a streaming route's on_data consumes them (and may suspend
 *      the request, leaving bytes unconsumed, until a wake); other routes get
 *      their body buffered up to http.max_json_bytes;
 *   3. the body is complete: the route's handler runs; it replies, or waits
 *      (sf_http_wait) and runs again when woken or timed out; a client that
 *      goes away meanwhile ends the request (SF_WAIT_GONE, SF_ROUTE_ON_GONE);
 *   4. completion: on_done (streaming routes) releases what the request held,
 *      one log line is written and the metrics are updated.
 * An error decided while a body is still arriving is kept, the rest of the body
 * is drained (bounded by the route's limit) and the error is sent at the end,
 * so the client reads the reply instead of a reset connection.
 *
 * Handlers hold no state: whatever a request needs lives in sf_req (user).
 */
#ifndef SF_HTTP_H
#define SF_HTTP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

typedef struct sf_req sf_req;
typedef struct sf_http sf_http;
struct sf_app;
struct sf_config;
struct sf_family;

enum {
    /* Served without the bearer token even when one is configured. Every
     * other route requires it: whatever reads or changes training data or
     * state (a batch's result, its logits, an evaluation, the model, the
     * step timelines), so that a route added without thought is closed.
     * The open ones are listed in docs/OPERATIONS.md ("Who needs the token"). */
    SF_ROUTE_OPEN = 1,
    SF_ROUTE_PROBE = 2,  /* also served on http.metrics_port (probes, scrapes) */
    SF_ROUTE_UPLOAD = 4, /* a batch upload: refused (503) once the drain began */
    /* Its handler is called once more, with r->wait == SF_WAIT_GONE, when
     * the request ends unanswered after the handler ran (its client went
     * away while it waited), to stop what the request started; it must
     * neither reply nor wait then. The request ends as 499 either way. */
    SF_ROUTE_ON_GONE = 8,
    /* A route streams its body when it has stream ops; its accepted
     * Content-Types are its content_types list. */
};

/* on_data's return value that ends the connection without a reply:
 * libmicrohttpd 0.9.75 can queue a reply only before the first body byte or
 * after the last, so a request refused mid-body either drains the rest (-1)
 * or is closed (this). */
#define SF_STREAM_CLOSE (-2)

typedef struct sf_stream_ops {
    /* Consumes a body chunk: sets *len to the bytes NOT consumed (0 = all).
     * Returns 0 to go on, 1 when it suspended the request (sf_http_wait),
     * -1 after sf_reply_error (the rest of the body is then drained), or
     * SF_STREAM_CLOSE to close the connection at once. */
    int (*on_data)(sf_req *r, const uint8_t *data, size_t *len);
    /* Called once when the request ends, completed (ok=1) or aborted (ok=0). */
    void (*on_done)(sf_req *r, int ok);
    /* Largest body accepted for this route (bytes), from config. */
    uint64_t (*max_body)(struct sf_app *app);
    /* Told when this module refused the request before the route saw a body
     * byte (401, 413, 415), so the route can count the rejection. */
    void (*on_rejected)(sf_req *r, const char *code);
    /* The option(s) that set max_body, named in a 413 so that its reader
     * knows what to raise; NULL: the route takes no body. */
    const char *max_body_option;
    /* Optional: checks what the head alone decides (the query) once this
     * module's own checks passed, before any body byte is taken, so that a
     * client waiting for 100 Continue gets the refusal instead. Returns 0,
     * or -1 after sf_reply_error (counted by the route itself). */
    int (*on_head)(sf_req *r);
} sf_stream_ops;

typedef int (*sf_handler_fn)(sf_req *r);

typedef struct sf_route {
    const char *method;
    const char *pattern; /* "/v1/batches/{id}": one {param} segment allowed */
    const char *name;    /* metrics label */
    sf_handler_fn handler;
    const sf_stream_ops *stream;
    unsigned flags;
    const char *const *content_types; /* accepted request Content-Types (NULL: any) */
} sf_route;

/* The route table (handlers/routes.c). */
extern const sf_route sf_routes[];
extern const size_t sf_routes_len;

/* Why a wait ended. SF_WAIT_GONE: the client closed or reset its
 * connection while the request waited (the timer looks once a second), so
 * no reply will be read; the request ends (see SF_ROUTE_ON_GONE). */
typedef enum sf_wait_state {
    SF_WAIT_NONE = 0,
    SF_WAIT_WOKEN,
    SF_WAIT_TIMEOUT,
    SF_WAIT_SHUTDOWN,
    SF_WAIT_GONE
} sf_wait_state;

typedef enum sf_wait_kind { SF_WAIT_SLOT = 0, SF_WAIT_JOB = 1, SF_WAIT_CMD = 2, SF_WAIT_KINDS } sf_wait_kind;

struct sf_req {
    struct sf_app *app;
    const sf_route *route;
    const char *method;
    const char *path;
    /* The {param} segment, if the pattern has one: up to 127 bytes (an
     * evaluation's name is up to 64 characters); a longer one matches no route. */
    char param[128];
    char request_id[64];
    void *user;                /* per-request state of a streaming route */
    char *body;                /* buffered body (non-streaming routes), NUL-terminated */
    size_t body_len;
    uint64_t bytes_in;
    uint64_t t_start_ns;
    int status;                /* status sent (0 until replied) */
    size_t bytes_out;
    sf_wait_state wait;        /* why the last wait ended */
    uint64_t batch_id;         /* the batch this request created or reads (0: none), for the log */
    /* private to http.c */
    struct sf_req_priv *priv;
};

/* What the daemon needs of the process, and no more: the configuration it
 * was started with, the drain flag, its metric families, and where to
 * publish itself. The app pointer is handed on to handlers (sf_req.app) and
 * to streaming routes; the daemon never looks inside it. */
typedef struct sf_http_ctx {
    struct sf_app *app;
    const struct sf_config *cfg;  /* as started: ports, TLS files, timeouts */
    atomic_int *draining;         /* set: uploads are refused and kept-alive
                                     connections closed after their reply */
    /* streamfeed_http_requests_total{route,code}, _request_duration_seconds{route},
     * _errors_total{code} */
    struct sf_family *requests, *duration, *errors;
    struct sf_http **publish;     /* set to the daemon before it listens, and to
                                     NULL when it stops; NULL: not published */
} sf_http_ctx;

/* Starts the daemon on cfg's host:port (0 = any free port; the bound port is
 * returned by sf_http_port), with TLS when http.tls_cert is set, and the
 * probe-only listener on http.metrics_port when it is not 0. A port another
 * process holds is an error that says so. ctx is copied. */
sf_http *sf_http_start(const sf_http_ctx *ctx, char *err, size_t errlen);
int sf_http_port(const sf_http *h);
int sf_http_metrics_port(const sf_http *h); /* 0 when off */
int sf_http_tls(const sf_http *h);          /* 1 when the main port speaks HTTPS */
/* Shutdown, in this order: sf_http_quiesce (the main port accepts no new
 * connection and refuses them at once; connections already open go on),
 * sf_http_wake_all (every wait ends with SF_WAIT_SHUTDOWN and no new wait
 * starts: suspended requests reply now), sf_http_stop (both listeners close,
 * the metrics port last). */
void sf_http_quiesce(sf_http *h);
void sf_http_wake_all(sf_http *h);
void sf_http_stop(sf_http *h);
/* Requests being handled on the main port right now (for draining). */
int sf_http_active(const sf_http *h);
/* Runs fn(ctx) about once a second on the HTTP timer thread (the slow-upload
 * sweep of server/upload.c). fn must not block. */
void sf_http_set_tick(sf_http *h, void (*fn)(void *ctx), void *ctx);
/* Re-reads the TLS certificate and key (SIGHUP: force=1; the periodic check
 * for changed files: force=0). 1 reloaded, 0 nothing to do, -1 kept the old
 * pair (logged). */
int sf_http_tls_reload(sf_http *h, int force);

/* ---- replies: exactly one per request ------------------------------------ */
int sf_reply_json(sf_req *r, int status, cJSON *body);          /* takes ownership of body */
int sf_reply_bytes(sf_req *r, int status, const char *content_type, void *data, size_t len,
                   void (*free_fn)(void *)); /* free_fn(data) after sending; NULL: copied */
/* The one function for error replies: {"error":{"code","message"[,"field"]}},
 * counted in streamfeed_http_errors_total{code}. */
int sf_reply_error_field(sf_req *r, int status, const char *code, const char *field,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* The common case: no field to name. */
#define sf_reply_error(r, status, code, ...) sf_reply_error_field(r, status, code, NULL, __VA_ARGS__)
/* Adds a header to the reply that will be sent next (e.g. Retry-After). */
void sf_reply_header(sf_req *r, const char *name, const char *value);

/* Ends the request's connection from another thread without a reply (the
 * slow-upload sweep): its socket is shut down, libmicrohttpd closes it on its
 * next poll and on_done runs with ok=0 on the request's own thread. The
 * caller must know the request is still alive (its on_done has not returned). */
void sf_req_abort(sf_req *r);

/* The body's deadline (http.header_timeout_s from the end of the headers)
 * no longer applies: the caller bounds the rest of the body (an upload that
 * took a ring slot, held to the slow-upload sweep). On the request's thread. */
void sf_req_deadline_done(sf_req *r);

/* Query-string argument, or NULL. */
const char *sf_req_arg(sf_req *r, const char *name);
const char *sf_req_header(sf_req *r, const char *name);

/* ---- waiting without holding a thread ------------------------------------ */
/* Generation of a wait kind: read it BEFORE testing the condition you will
 * wait for, and pass it to sf_http_wait; if a wake of that kind happened in
 * between, the wait returns -1 at once and the caller tests again. */
/* Requests suspended in sf_http_wait on waits of this kind right now (for
 * the metrics: uploads waiting for a ring slot). */
int sf_http_waiting(sf_http *h, sf_wait_kind kind);
uint64_t sf_http_gen(sf_http *h, sf_wait_kind kind);
/* Suspends the request until sf_http_wake(kind, key) or the timeout. Returns 0
 * when suspended (return from the callback; it runs again later with r->wait
 * saying why), -1 when the caller should test its condition again now. */
int sf_http_wait(sf_req *r, sf_wait_kind kind, uint64_t key, uint64_t gen, int timeout_ms);
/* Wakes every request waiting on (kind, key); key UINT64_MAX wakes all of the kind. */
void sf_http_wake(sf_http *h, sf_wait_kind kind, uint64_t key);


#endif
