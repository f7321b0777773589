/* server/http_impl.h — the HTTP daemon's private state, shared by http.c
 * (listeners, requests, replies, deadlines) and http_wait.c (suspended
 * requests and their wake-ups). No other file includes it. */
#ifndef SF_SERVER_HTTP_IMPL_H
#define SF_SERVER_HTTP_IMPL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "server/http.h"
#include "server/tls.h"

#define MAX_EXTRA_HEADERS 4
/* No route takes more than a few query arguments; a request with more gets
 * 400 bad_query, and libmicrohttpd is given none of them (uri_cb). */
#define MAX_QUERY_ARGS 32
#define EXTRA_HEADER_VALUE_MAX 1024
#define DRAIN_LIMIT (64ull << 20) /* beyond this, an early error closes the connection */
#define LISTEN_BACKLOG SOMAXCONN
/* The metrics port serves short requests from probes and scrapers only. It
 * closes each connection after its reply (http.c: make_response), so a
 * client cannot keep a slot by asking again; a client address holds at most
 * PROBE_MAX_PER_IP of the PROBE_MAX_CONNECTIONS (a kubelet runs up to three
 * probes at once, a scraper one), so a client that opens idle connections
 * from one address leaves room for the probes from every other. */
#define PROBE_MAX_CONNECTIONS 256
#define PROBE_MAX_PER_IP 16
#define PROBE_TIMEOUT_S 10
#define TICK_NS 1000000000ull
/* An upload's socket reports readable only once this much of the body is
 * queued (SO_RCVLOWAT), or the rest of the body if that is less: see
 * recv_lowat_update. Half of libmicrohttpd's read buffer (half its memory
 * pool, listener_start), so one read takes all that woke it. */
#define RECV_LOWAT_MAX (256u << 10)
/* An upload that keeps http.upload_min_bytes_per_s fills the mark within
 * this: its bytes reach the slow-upload sweep (5 s allowance) and
 * libmicrohttpd's idle timeout at most this late. */
#define RECV_LOWAT_LAG_MS 4000u

/* One listening socket and its daemon: the main port (every route), or the
 * metrics port (GET /metrics, /healthz, /readyz only). */
struct sf_listener {
    struct sf_http *h;
    struct MHD_Daemon *d;
    int fd;          /* the socket we bound; libmicrohttpd accepts on it */
    int port;
    int probes_only;
    int quiesced;    /* no longer accepting: the fd is ours to close */
};

/* The phases of a connection that the deadline sweep times (sweep_locked). */
typedef enum conn_phase {
    PHASE_HEAD,  /* its request's head is incomplete: from accept, or from the
                    first byte after the previous request on a kept-alive connection */
    PHASE_BODY,  /* a body that is buffered or drained, or an upload's body before
                    it holds a ring slot: from the end of the headers */
    PHASE_STREAM, /* a body streamed to its route (a checkpoint PUT): from the headers */
    PHASE_IDLE,  /* between two requests: the next one's first byte is looked for */
    PHASE_FREE,  /* not timed here: a handler runs or waits with its own timeout,
                    a reply is sent, or an upload holds a slot (the slow-upload sweep) */
} conn_phase;

/* One accepted connection, from libmicrohttpd's NOTIFY_CONNECTION STARTED to
 * CLOSED, which it runs before it closes the socket: while the connection is
 * in h->conns, its fd is its own. */
typedef struct sf_conn {
    struct sf_listener *l;
    int fd;
    /* Written only by the connection's own thread, under wmu (so that thread
     * may read it without the lock). */
    conn_phase phase;
    /* Under wmu. from_ns: when the timed phase began; head_seen_ns: for an
     * idle connection, when the sweep first saw bytes of its next request (0
     * before); idle_bytes: the socket's bytes received when it went idle;
     * expired: the sweep shut it down (counted once); waiting: its request
     * is suspended in sf_http_wait. */
    uint64_t from_ns;
    uint64_t head_seen_ns;
    uint64_t idle_bytes;
    int expired;
    int waiting;
    /* The request in progress, owned by the connection until libmicrohttpd
     * completes it: one it drops without its completion callback (0.9.75 does
     * for a request line whose query overflows its memory pool) is ended
     * when the connection closes. Only the connection's thread touches it. */
    struct sf_req *req;
    /* The TLS certificate pair its session shook hands with, given back when
     * the connection closes (libmicrohttpd has freed the session by then). */
    sf_tls_pair *tls_pair;
    struct sf_conn *prev, *next;
} sf_conn;

struct sf_req_priv {
    struct MHD_Connection *conn;
    struct sf_http *h;
    struct sf_listener *l;
    sf_conn *c;             /* the connection it arrived on */
    int started;            /* access_cb has seen this request */
    int bad_uri;            /* the raw request target carries %00 (1), or %2F in its path (2) */
    int query_cut;          /* its query had more than MAX_QUERY_ARGS arguments, or the target was
                               over http.max_header_bytes: libmicrohttpd was given none of them */
    size_t uri_len;         /* the raw request target's length, counted against http.max_header_bytes */
    int fd;                 /* the connection's socket (for sf_req_abort) */
    struct {
        char name[64];
        char value[EXTRA_HEADER_VALUE_MAX]; /* a transform's list of samples left out: up to 1 KB */
    } extra[MAX_EXTRA_HEADERS];
    int nextra;
    /* An error decided while the body still arrives is sent once it ended. */
    struct MHD_Response *pending;
    int pending_status;
    int draining;           /* discard the rest of the body */
    char error_code[64];    /* the code of the error reply sent, for the request's log line */
    size_t body_cap;
    uint64_t body_limit;
    const char *body_option; /* the option(s) setting body_limit, for the 413's message */
    int handled;            /* the handler has been called at least once */
    uint64_t content_length; /* the declared body length; 0 when none or chunked */
    uint64_t body_taken;    /* body bytes libmicrohttpd was told are consumed */
    int lowat;              /* the SO_RCVLOWAT set on fd; 0: the kernel's default, 1 */
    /* Waiting. */
    int in_wait_list;
    sf_wait_kind wait_kind;
    uint64_t wait_key;
    uint64_t deadline_ns;
    struct sf_req *wait_next;
    int gone;               /* its client went away while it waited (under wmu) */
};

struct sf_http {
    sf_http_ctx ctx;                   /* what it needs of the process (sf_http_start) */
    struct sf_listener main, probe;
    int tls;
    atomic_int active;                 /* requests in progress on the main port */
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    struct sf_req *waiters;            /* singly linked list */
    uint64_t gen[SF_WAIT_KINDS];
    int closed;                        /* sf_http_wake_all ran: no new waits */
    pthread_t timer;
    int timer_started, timer_stop;
    void (*tick)(void *ctx);           /* run about once a second by the timer thread */
    void *tick_ctx;
    sf_conn *conns;                    /* every open connection of both ports (under wmu) */
};

/* Takes r off h's wait list (h->wmu held). */
void sf_http_unlink_waiter_locked(sf_http *h, sf_req *r);
/* Resumes a waiting request, saying why its wait ended (h->wmu held). */
void sf_http_resume_locked(sf_http *h, sf_req *r, sf_wait_state why);
/* Resumes, with SF_WAIT_GONE, each waiting request whose client closed or
 * reset its connection (h->wmu held; the timer's tick). */
void sf_http_sweep_gone_locked(sf_http *h);

#endif
