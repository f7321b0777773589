/* client/streamfeed-load.c — the reference remote data loader and load generator.
 *
 * What it does. It POSTs batches of uint8 images and integer labels, encoded as
 * safetensors bodies (DESIGN.md §4), to POST {url}/v1/batches of a streamfeed
 * server, over N concurrent keep-alive HTTP connections, and reports what the
 * server accepted, how fast, and the training loss when the server tells it.
 * The bodies are either synthetic (the workloads of WORKLOADS.md, optionally
 * with labels that a small model can learn), the *.safetensors files of a
 * directory, or JPEG files sent undecoded in the encoded body form
 * (files + files_offsets + labels): the class folders of a directory
 * (ImageFolder layout), or w1-jpeg's natural-looking 256x256 files, which are
 * generated once into a cache folder.
 *
 * How it is built. Bodies are made once, before the clock starts, into a pool
 * of at most --pool bodies and at most --pool-mb MiB, and then cycled through,
 * so that generation never limits the request rate; libcurl sends each body
 * straight from the pool (CURLOPT_POSTFIELDS, no copy of ours). The connections
 * are spread over --threads worker threads, each of which drives its share with
 * its own libcurl multi handle. An easy handle is one connection: it is reused
 * for every request it makes, so the TCP connection stays open (keep-alive).
 * The main thread only prints progress and, without --wait, asks the server
 * now and then for the loss of a recent batch. This file holds that run; the
 * command line is in options.c, the synthetic and *.safetensors pools in
 * body_pool.c, the pools of JPEG files in jpeg_pool.c (their images in
 * natural_image.c), --diagnose in diagnose.c, and what they share in loader.h.
 *
 * Flow control. Batches are numbered by a shared ticket counter; a connection
 * takes the next ticket when it is idle. With --rate R, ticket k may not start
 * before start + k/R. A 503 or 429 reply puts the same body back on the same
 * connection, to be sent again after the server's Retry-After (capped at
 * --max-backoff-ms; exponential back-off when the header is missing), at most
 * --retries times; the other connections carry on meanwhile. Any other error
 * reply is counted by its error code, printed once per code, and the run goes
 * on with the next batch, unless no batch has been accepted yet and
 * max(8, 2 x connections) have been refused: then the run stops, since the
 * rest would be refused too (a --dir of *.safetensors files, sent as they
 * are, goes on).
 *
 * Bounds. Connections <= 256, threads <= 64, pool <= 1024 bodies and
 * <= --pool-mb MiB (default 2048), one reply buffer of 64 KiB per connection,
 * at most 64 distinct error codes tracked (the rest count as "other"), retries
 * <= 1000 per batch, each back-off <= --max-backoff-ms.
 *
 * --diagnose sends no batch: it asks the server where its pipeline loses time
 * (POST /v1/diagnose, the caching method) and prints the four stages and the
 * verdict on one screen (or the server's JSON with --json); exit status 0 on
 * a verdict, 1 on an error reply.
 *
 * Exit status: 0 when every batch that was sent was accepted, 1 otherwise
 * (or on a runtime failure), 2 on a usage error. The first SIGINT stops
 * sending new batches and retries and lets the requests in flight finish; a
 * second one aborts those too. The summary is printed either way.
 */
#include <curl/curl.h>
#include <cjson/cJSON.h>

#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/jpeg_pool.h"
#include "client/loader.h"
#include "server/safetensors.h"

/* ---- small helpers ------------------------------------------------------- */

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

int online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 1024 ? 1024 : (int)n;
}

/* ---- shared run state ---------------------------------------------------- */

typedef struct err_entry {
    char code[ERROR_CODE_LEN];
    uint64_t count;
} err_entry;

/* Counters are atomics written by the workers and read by the main thread;
 * the error table and the loss record are guarded by mu, which also keeps
 * stderr lines whole. */
static struct {
    const options *o;
    const pool *p;
    double t0, deadline;
    atomic_uint_fast64_t next_ticket;
    atomic_uint_fast64_t sent, accepted, rejected, interrupted, retries, errors, failed;
    atomic_uint_fast64_t bytes_accepted, bytes_uploaded;
    atomic_uint_fast64_t undecodable; /* --dir files the service left out: it could not decode them */
    atomic_uint_fast64_t ring;       /* slots << 32 | free, from the last reply; 0: unknown */
    atomic_int_fast64_t max_id;      /* the newest accepted id; -1: none */
    atomic_int_fast64_t min_id;      /* the oldest accepted id; INT64_MAX: none */
    atomic_int_fast64_t queued_at_max; /* "queued" in the reply that carried max_id */
    atomic_int consecutive_transport;
    atomic_int refused_before_any;   /* 4xx replies while nothing was accepted yet */
    atomic_int stop;                 /* 1: start nothing new (fatal condition) */
    atomic_int workers_left;
    atomic_uint_fast64_t t_end_ns;   /* when the last worker finished */
    pthread_mutex_t mu;
    err_entry errs[MAX_ERROR_CODES];
    int nerrs;
    int progress_shown;              /* a \r progress line is on the terminal */
    int64_t first_id, last_id;       /* ids whose losses are known; -1: none */
    double first_loss, last_loss, last_acc;
    int have_acc;
} R = {.mu = PTHREAD_MUTEX_INITIALIZER};

static bool stopping(void)
{
    return g_sigint > 0 || atomic_load(&R.stop);
}

/* Prints one message line on stderr, clearing a progress line first. */
static void msg_locked(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void msg_locked(const char *fmt, ...)
{
    if (R.progress_shown) {
        fputs("\r\033[K", stderr);
        R.progress_shown = 0;
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

/* Counts one failed batch under code; the first time a code is seen its
 * message is printed. */
static void record_error(const char *code, const char *message)
{
    pthread_mutex_lock(&R.mu);
    int i;
    for (i = 0; i < R.nerrs; i++)
        if (strcmp(R.errs[i].code, code) == 0)
            break;
    if (i == R.nerrs) {
        if (R.nerrs >= MAX_ERROR_CODES - 1 && strcmp(code, "other") != 0) {
            /* The last entry is reserved for "other". */
            for (i = 0; i < R.nerrs; i++)
                if (strcmp(R.errs[i].code, "other") == 0)
                    break;
            if (i == R.nerrs)
                snprintf(R.errs[R.nerrs++].code, ERROR_CODE_LEN, "other");
        } else {
            snprintf(R.errs[R.nerrs++].code, ERROR_CODE_LEN, "%s", code);
            if (!R.o->quiet)
                msg_locked("streamfeed-load: error %s: %s\n", code, message && *message ? message : "");
        }
    }
    R.errs[i].count++;
    pthread_mutex_unlock(&R.mu);
    atomic_fetch_add(&R.errors, 1);
}

static void record_loss(int64_t id, double loss, bool have_acc, double acc)
{
    pthread_mutex_lock(&R.mu);
    if (R.first_id < 0 || id < R.first_id) {
        R.first_id = id;
        R.first_loss = loss;
    }
    if (id >= R.last_id) {
        R.last_id = id;
        R.last_loss = loss;
        R.have_acc = have_acc;
        R.last_acc = acc;
    }
    pthread_mutex_unlock(&R.mu);
}

static void atomic_max_i64(atomic_int_fast64_t *a, int64_t v)
{
    int_fast64_t cur = atomic_load(a);
    while (v > cur && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

static void atomic_min_i64(atomic_int_fast64_t *a, int64_t v)
{
    int_fast64_t cur = atomic_load(a);
    while (v < cur && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

/* ---- replies ------------------------------------------------------------- */

double json_num(const cJSON *o, const char *k, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* Names, once per pool body, the files of a trained batch (the batch object
 * j of body b) that the service could not decode and left out
 * (decode.on_undecodable skip: "skipped_samples"). */
static void report_left_out(const body *b, const cJSON *j)
{
    const cJSON *sk = cJSON_GetObjectItemCaseSensitive(j, "skipped_samples");
    if (!b->paths || !cJSON_IsArray(sk))
        return;
    const cJSON *e;
    cJSON_ArrayForEach(e, sk) {
        const double i = json_num(e, "index", -1);
        if (i < 0 || i >= b->npaths || !b->paths[(int)i])
            continue;
        atomic_fetch_add(&R.undecodable, 1);
        if (R.o->quiet)
            continue;
        pthread_mutex_lock(&R.mu);
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(e, "code");
        msg_locked("streamfeed-load: the service left out %s: %s (it could not decode the file; "
                   "its batch trained without it)\n", b->paths[(int)i],
                   cJSON_IsString(code) ? code->valuestring : "undecodable");
        pthread_mutex_unlock(&R.mu);
    }
}

/* Reads a 2xx reply: the batch id, the queue length and ring occupancy (202),
 * or the batch object with its state and loss (200 from ?wait=1). A reply that
 * is not JSON still counts as accepted; it just tells nothing more. The
 * first accepted send of each pool body b is remembered (body.first_id), so
 * that the files its batch left out are named once: from this reply when it
 * is the trained batch, else from its result after the run. */
static void read_accept_reply(body *b, const char *text, size_t len)
{
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j)
        return;
    double id = json_num(j, "id", -1);
    int64_t unset = 0;
    if (id > 0 && b->paths && atomic_compare_exchange_strong(&b->first_id, &unset, (int64_t)id))
        report_left_out(b, j);
    const cJSON *ring = cJSON_GetObjectItemCaseSensitive(j, "ring");
    if (cJSON_IsObject(ring)) {
        double slots = json_num(ring, "slots", -1), fr = json_num(ring, "free", -1);
        if (slots >= 0 && fr >= 0 && slots < 4294967296.0 && fr < 4294967296.0)
            atomic_store(&R.ring, ((uint64_t)slots << 32) | (uint64_t)fr);
    }
    if (id >= 0) {
        int64_t iid = (int64_t)id;
        atomic_min_i64(&R.min_id, iid);
        if (iid > atomic_load(&R.max_id)) {
            atomic_store(&R.queued_at_max, (int64_t)json_num(j, "queued", 0));
            atomic_max_i64(&R.max_id, iid);
        }
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "state");
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
        const cJSON *acc = cJSON_GetObjectItemCaseSensitive(j, "accuracy");
        if (cJSON_IsString(st) && strcmp(st->valuestring, "failed") == 0)
            atomic_fetch_add(&R.failed, 1);
        else if (cJSON_IsNumber(loss) && (!cJSON_IsString(st) || strcmp(st->valuestring, "done") == 0))
            record_loss(iid, loss->valuedouble, cJSON_IsNumber(acc), cJSON_IsNumber(acc) ? acc->valuedouble : 0);
    }
    cJSON_Delete(j);
}

/* Reads {"error":{"code","message"}} out of an error reply. Falls back to
 * http_<status> when the body is not that shape. *retry_ms gets the optional
 * "retry_after_ms" field (a finer Retry-After), else 0. */
void read_error_reply(const char *text, size_t len, long status, char *code, size_t code_cap,
                             char *message, size_t msg_cap, long *retry_ms)
{
    snprintf(code, code_cap, "http_%ld", status);
    snprintf(message, msg_cap, "HTTP %ld with no error object in the reply", status);
    *retry_ms = 0;
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j)
        return;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (cJSON_IsObject(e)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "code");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
        if (cJSON_IsString(c) && c->valuestring[0])
            snprintf(code, code_cap, "%s", c->valuestring);
        if (cJSON_IsString(m))
            snprintf(message, msg_cap, "%s (HTTP %ld)", m->valuestring, status);
        double r = json_num(e, "retry_after_ms", json_num(j, "retry_after_ms", 0));
        if (r > 0 && r < 3.6e6)
            *retry_ms = (long)r;
    }
    cJSON_Delete(j);
}

/* ---- connections and workers --------------------------------------------- */

typedef enum conn_state {
    C_IDLE,    /* holds no batch */
    C_WAITING, /* holds a batch that may start at not_before (rate limit or retry delay) */
    C_RUNNING, /* its request is in the multi handle */
} conn_state;

typedef struct conn {
    CURL *easy;
    conn_state st;
    uint64_t ticket;
    const body *b;
    int attempt;   /* retries made for the current batch */
    int counted;   /* the current batch was counted as sent */
    double not_before;
    reply_buf reply; /* REPLY_CAP + 1 bytes */
    uint64_t rng;  /* retry jitter */
} conn;

typedef struct worker {
    int index;
    CURLM *multi;
    conn *conns;
    int nconns;
    struct curl_slist *headers;
    pthread_t tid;
} worker;

size_t reply_buf_write(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    reply_buf *r = userdata;
    size_t n = size * nmemb, room = REPLY_CAP - r->len;
    size_t take = n < room ? n : room; /* the rest of an oversized reply is dropped */
    memcpy(r->data + r->len, ptr, take);
    r->len += take;
    return n;
}

/* Applies a libcurl option and reports which one failed, with file:line. */
#define CURL_SETOPT(h, opt, val)                                                           \
    do {                                                                                  \
        CURLcode rc_ = curl_easy_setopt((h), (opt), (val));                               \
        if (rc_ != CURLE_OK) {                                                            \
            fprintf(stderr, "streamfeed-load: %s:%d: curl_easy_setopt(%s): %s\n", __FILE__, \
                    __LINE__, #opt, curl_easy_strerror(rc_));                             \
            return -1;                                                                    \
        }                                                                                 \
    } while (0)

/* https:// is verified (peer and host name) against --cacert, or the system's CAs. */
CURLcode set_tls(CURL *h, const options *o)
{
    return o->cacert ? curl_easy_setopt(h, CURLOPT_CAINFO, o->cacert) : CURLE_OK;
}

static int conn_init(conn *c, const char *url, struct curl_slist *headers, uint64_t seed)
{
    c->reply.data = malloc(REPLY_CAP + 1);
    c->easy = curl_easy_init();
    c->rng = seed;
    if (!c->reply.data || !c->easy) {
        fprintf(stderr, "streamfeed-load: could not create a connection\n");
        return -1;
    }
    const options *o = R.o;
    CURL *h = c->easy;
    CURL_SETOPT(h, CURLOPT_URL, url);
    CURL_SETOPT(h, CURLOPT_POST, 1L);
    CURL_SETOPT(h, CURLOPT_HTTPHEADER, headers);
    CURL_SETOPT(h, CURLOPT_WRITEFUNCTION, reply_buf_write);
    CURL_SETOPT(h, CURLOPT_WRITEDATA, &c->reply);
    CURL_SETOPT(h, CURLOPT_PRIVATE, c);
    CURL_SETOPT(h, CURLOPT_NOSIGNAL, 1L);
    CURL_SETOPT(h, CURLOPT_TCP_NODELAY, 1L);
    CURL_SETOPT(h, CURLOPT_TCP_KEEPALIVE, 1L);
    CURL_SETOPT(h, CURLOPT_USERAGENT, "streamfeed-load/1");
    /* The largest upload buffer libcurl allows: fewer, larger send() calls. */
    CURL_SETOPT(h, CURLOPT_UPLOAD_BUFFERSIZE, UPLOAD_BUFFER);
    CURL_SETOPT(h, CURLOPT_TIMEOUT_MS, o->timeout_ms);
    long ct = o->timeout_ms > 0 && o->timeout_ms < 10000 ? o->timeout_ms : 10000;
    CURL_SETOPT(h, CURLOPT_CONNECTTIMEOUT_MS, ct);
    if (set_tls(h, o) != CURLE_OK) {
        fprintf(stderr, "streamfeed-load: this libcurl cannot take --cacert\n");
        return -1;
    }
    return 0;
}

static void conn_free(conn *c)
{
    if (c->easy)
        curl_easy_cleanup(c->easy);
    free(c->reply.data);
}

/* Gives an idle connection the next batch, if there is one to send. */
static void conn_take_ticket(conn *c, double now)
{
    const options *o = R.o;
    if (stopping() || (o->seconds > 0 && now >= R.deadline))
        return;
    uint64_t t = atomic_fetch_add(&R.next_ticket, 1);
    if (o->seconds <= 0 && t >= o->batches)
        return;
    c->ticket = t;
    c->b = &R.p->b[t % (uint64_t)R.p->n];
    c->attempt = 0;
    c->counted = 0;
    c->not_before = o->rate > 0 ? R.t0 + (double)t / o->rate : 0;
    c->st = C_WAITING;
}

static int conn_start(worker *w, conn *c)
{
    CURL *h = c->easy;
    if (curl_easy_setopt(h, CURLOPT_POSTFIELDS, (const char *)c->b->data) != CURLE_OK ||
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)c->b->len) != CURLE_OK ||
        curl_multi_add_handle(w->multi, h) != CURLM_OK) {
        return -1;
    }
    c->reply.len = 0;
    if (!c->counted) {
        c->counted = 1;
        atomic_fetch_add(&R.sent, 1);
    } else {
        atomic_fetch_add(&R.retries, 1);
    }
    c->st = C_RUNNING;
    return 0;
}

/* The delay before resending after 503/429: the server's hint, or
 * exponential back-off from 50 ms without one; capped; plus up to 10 % jitter
 * so that the connections do not come back in lock step. */
static double retry_delay_s(conn *c, curl_off_t retry_after_s, long retry_ms)
{
    const options *o = R.o;
    double ms;
    if (retry_ms > 0)
        ms = (double)retry_ms;
    else if (retry_after_s > 0)
        ms = (double)retry_after_s * 1000.0;
    else
        ms = 50.0 * (double)(1ULL << (c->attempt < 20 ? c->attempt : 20));
    if (ms > (double)o->max_backoff_ms)
        ms = (double)o->max_backoff_ms;
    ms *= 1.0 + 0.1 * (double)(rng_next(&c->rng) >> 11) / 9007199254740992.0;
    return ms / 1000.0;
}

static const char *transport_code(CURLcode rc)
{
    switch (rc) {
    case CURLE_COULDNT_CONNECT: return "transport_couldnt_connect";
    case CURLE_COULDNT_RESOLVE_HOST: return "transport_couldnt_resolve_host";
    case CURLE_OPERATION_TIMEDOUT: return "transport_timeout";
    case CURLE_SEND_ERROR: return "transport_send_error";
    case CURLE_RECV_ERROR: return "transport_recv_error";
    case CURLE_GOT_NOTHING: return "transport_got_nothing";
    case CURLE_PARTIAL_FILE: return "transport_partial_reply";
    default: return "transport_other";
    }
}

/* The pools made here are valid bodies, so when the first batches are all
 * refused (a 4xx) and none is accepted, every later one would be too: the
 * model takes another image size (shape_mismatch), a token is missing, ...
 * The run stops after as many as the transport limit, naming the likely
 * fix, instead of sending the rest to be refused. A --dir of *.safetensors
 * files is sent as it is, broken files included on purpose, so it goes on. */
static void stop_if_every_batch_is_refused(const char *code)
{
    const options *o = R.o;
    if ((o->dir && !R.p->encoded) || atomic_load(&R.accepted) > 0)
        return;
    int limit = 2 * o->connections < 8 ? 8 : 2 * o->connections;
    if (atomic_fetch_add(&R.refused_before_any, 1) + 1 < limit || atomic_exchange(&R.stop, 1))
        return;
    const char *hint =
        strcmp(code, "shape_mismatch") == 0
            ? "the server's model takes another image size (GET /v1/model, \"input\"): choose the --workload "
              "that matches it (tiny: 32x32, as `make run` serves without a GPU)"
        : strcmp(code, "unauthorized") == 0 ? "the server requires a token: --token or $STREAMFEED_TOKEN"
                                            : "see the error above";
    pthread_mutex_lock(&R.mu);
    msg_locked("streamfeed-load: the first %d batches were all refused and none was accepted; stopping (%s)\n",
               limit, hint);
    pthread_mutex_unlock(&R.mu);
}

/* A request has ended: decide what becomes of its batch. */
static void conn_done(worker *w, conn *c, CURLcode res)
{
    const options *o = R.o;
    CURL *h = c->easy;
    long status = 0;
    curl_off_t up = 0, ra = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(h, CURLINFO_SIZE_UPLOAD_T, &up);
    curl_easy_getinfo(h, CURLINFO_RETRY_AFTER, &ra);
    curl_multi_remove_handle(w->multi, h);
    atomic_fetch_add(&R.bytes_uploaded, (uint64_t)(up > 0 ? up : 0));
    c->st = C_IDLE;
    c->reply.data[c->reply.len] = '\0';

    if (res != CURLE_OK && status == 0) {
        char m[256];
        snprintf(m, sizeof m, "%s (%s)", curl_easy_strerror(res), o->url);
        record_error(transport_code(res), m);
        atomic_fetch_add(&R.rejected, 1);
        /* A server that is not there would otherwise be hammered for the whole
         * run; give up after this many transport failures in a row. */
        int limit = 2 * o->connections < 8 ? 8 : 2 * o->connections;
        if (atomic_fetch_add(&R.consecutive_transport, 1) + 1 >= limit && !atomic_exchange(&R.stop, 1)) {
            pthread_mutex_lock(&R.mu);
            msg_locked("streamfeed-load: %d transport errors in a row; stopping\n", limit);
            pthread_mutex_unlock(&R.mu);
        }
        return;
    }
    atomic_store(&R.consecutive_transport, 0);

    if (status >= 200 && status < 300) {
        atomic_fetch_add(&R.accepted, 1);
        atomic_fetch_add(&R.bytes_accepted, c->b->len);
        read_accept_reply((body *)c->b, c->reply.data, c->reply.len);
        return;
    }
    char code[ERROR_CODE_LEN], message[512];
    long retry_ms;
    read_error_reply(c->reply.data, c->reply.len, status, code, sizeof code, message, sizeof message, &retry_ms);
    if (status == 503 || status == 429) {
        if (stopping()) {
            atomic_fetch_add(&R.interrupted, 1);
            return;
        }
        if (c->attempt < o->retries) {
            c->not_before = now_s() + retry_delay_s(c, ra, retry_ms);
            c->attempt++;
            c->st = C_WAITING;
            return;
        }
        char m[640];
        snprintf(m, sizeof m, "gave up after %d retries; the last reply was %s: %s", o->retries, code, message);
        record_error("retries_exhausted", m);
        atomic_fetch_add(&R.rejected, 1);
        return;
    }
    record_error(code, message);
    atomic_fetch_add(&R.rejected, 1);
    if (status >= 400 && status < 500)
        stop_if_every_batch_is_refused(code);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    const options *o = R.o;
    for (;;) {
        double now = now_s(), wake = now + 0.1;
        bool stop = stopping(), hard = g_sigint >= 2;
        int active = 0;
        for (int i = 0; i < w->nconns; i++) {
            conn *c = &w->conns[i];
            if (hard && c->st == C_RUNNING) {
                curl_multi_remove_handle(w->multi, c->easy);
                atomic_fetch_add(&R.interrupted, 1);
                c->st = C_IDLE;
            }
            if (c->st == C_WAITING && (stop || (!c->counted && o->seconds > 0 && now >= R.deadline))) {
                /* A pending retry is abandoned; a batch not yet sent simply
                 * never was. */
                if (c->counted)
                    atomic_fetch_add(&R.interrupted, 1);
                c->st = C_IDLE;
            }
            if (c->st == C_IDLE)
                conn_take_ticket(c, now);
            if (c->st == C_WAITING) {
                if (now >= c->not_before) {
                    if (conn_start(w, c) != 0) {
                        record_error("client_curl", "could not start a request");
                        if (c->counted)
                            atomic_fetch_add(&R.rejected, 1);
                        c->st = C_IDLE;
                        atomic_store(&R.stop, 1);
                    }
                } else if (c->not_before < wake) {
                    wake = c->not_before;
                }
            }
            if (c->st != C_IDLE)
                active++;
        }
        if (active == 0)
            break;
        int running = 0, done = 0;
        curl_multi_perform(w->multi, &running);
        CURLMsg *m;
        int q;
        while ((m = curl_multi_info_read(w->multi, &q))) {
            if (m->msg != CURLMSG_DONE)
                continue;
            conn *c = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&c);
            CURLcode res = m->data.result;
            conn_done(w, c, res);
            done++;
        }
        if (done)
            continue; /* hand the freed connections new work before waiting */
        int timeout_ms = (int)((wake - now) * 1000.0);
        timeout_ms = timeout_ms < 0 ? 0 : timeout_ms > 100 ? 100 : timeout_ms;
        curl_multi_poll(w->multi, NULL, 0, timeout_ms, NULL);
    }
    if (atomic_fetch_sub(&R.workers_left, 1) == 1) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        atomic_store(&R.t_end_ns, (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec);
    }
    return NULL;
}

/* ---- loss polling (main thread) ------------------------------------------ */

typedef struct poller {
    CURL *easy;
    struct curl_slist *headers;
    reply_buf reply;
    int failures;  /* consecutive; polling stops after a few */
    int first_done; /* the oldest id's loss is known or unknowable */
} poller;

/* GET /v1/batches/{id} into p->reply: 0 with the reply's status in
 * *status, or -1 when the request itself failed. */
static int get_batch(poller *p, int64_t id, long *status)
{
    char url[2048];
    snprintf(url, sizeof url, "%s/v1/batches/%" PRId64, R.o->url, id);
    curl_easy_setopt(p->easy, CURLOPT_URL, url);
    p->reply.len = 0;
    *status = 0;
    return curl_easy_perform(p->easy) == CURLE_OK &&
                   curl_easy_getinfo(p->easy, CURLINFO_RESPONSE_CODE, status) == CURLE_OK
               ? 0
               : -1;
}

/* GETs one batch; returns 1 when it is trained or failed (its loss recorded),
 * 0 while it is pending, -1 when the server could not say. */
static int poll_batch(poller *p, int64_t id)
{
    if (!p->easy || p->failures >= 5)
        return -1;
    long status = 0;
    if (get_batch(p, id, &status) != 0 || status != 200) {
        p->failures++;
        return -1;
    }
    p->failures = 0;
    cJSON *j = cJSON_ParseWithLength(p->reply.data, p->reply.len);
    int r = 0;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "state");
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
    const cJSON *acc = cJSON_GetObjectItemCaseSensitive(j, "accuracy");
    if (cJSON_IsString(st) && strcmp(st->valuestring, "failed") == 0) {
        r = 1;
    } else if (cJSON_IsString(st) && strcmp(st->valuestring, "done") == 0) {
        r = 1;
        if (cJSON_IsNumber(loss))
            record_loss(id, loss->valuedouble, cJSON_IsNumber(acc), cJSON_IsNumber(acc) ? acc->valuedouble : 0);
    }
    cJSON_Delete(j);
    return r;
}

/* After the run (its batches trained: --drain), names the files each --dir
 * pool body's first accepted batch left out, from that batch's result. A
 * batch whose result the server no longer holds tells nothing. */
static void report_pool_left_out(poller *p, const pool *pl)
{
    for (int k = 0; k < pl->n && p->easy && p->failures < 5; k++) {
        body *b = &pl->b[k];
        const int64_t id = atomic_load(&b->first_id);
        if (!b->paths || id <= 0)
            continue;
        long status = 0;
        if (get_batch(p, id, &status) != 0) {
            p->failures++;
            continue;
        }
        cJSON *j = status == 200 ? cJSON_ParseWithLength(p->reply.data, p->reply.len) : NULL;
        if (j)
            report_left_out(b, j);
        cJSON_Delete(j);
    }
}

/* Asks for the loss of the oldest accepted batch (once) and of the batch that
 * most likely trained last: the newest accepted id minus the queue length its
 * reply reported. Ids are the server's, so with other loaders running the
 * second may be theirs: it is the same model's loss either way. */
static void poll_losses(poller *p)
{
    int64_t mn = atomic_load(&R.min_id), mx = atomic_load(&R.max_id);
    if (mx < 0)
        return;
    if (!p->first_done && poll_batch(p, mn) != 0)
        p->first_done = 1;
    int64_t guess = mx - atomic_load(&R.queued_at_max);
    if (guess < mn)
        guess = mn;
    pthread_mutex_lock(&R.mu);
    int64_t known = R.last_id;
    pthread_mutex_unlock(&R.mu);
    if (guess > known)
        poll_batch(p, guess);
}

static void poller_init(poller *p, const options *o)
{
    memset(p, 0, sizeof *p);
    if (o->wait)
        return; /* losses come with the replies */
    p->reply.data = malloc(REPLY_CAP + 1);
    p->easy = p->reply.data ? curl_easy_init() : NULL;
    if (!p->easy)
        return;
    if (o->token) {
        char auth[1024];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o->token);
        p->headers = curl_slist_append(NULL, auth);
        curl_easy_setopt(p->easy, CURLOPT_HTTPHEADER, p->headers);
    }
    curl_easy_setopt(p->easy, CURLOPT_WRITEFUNCTION, reply_buf_write);
    curl_easy_setopt(p->easy, CURLOPT_WRITEDATA, &p->reply);
    curl_easy_setopt(p->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(p->easy, CURLOPT_TIMEOUT_MS, (long)POLL_TIMEOUT_MS);
    curl_easy_setopt(p->easy, CURLOPT_USERAGENT, "streamfeed-load/1");
    set_tls(p->easy, o);
}

static void poller_free(poller *p)
{
    if (p->easy)
        curl_easy_cleanup(p->easy);
    curl_slist_free_all(p->headers);
    free(p->reply.data);
}

/* ---- progress and summary ------------------------------------------------ */

static void print_progress(double t, double dt, uint64_t *prev_bytes, uint64_t *prev_acc)
{
    uint64_t sent = atomic_load(&R.sent), acc = atomic_load(&R.accepted);
    uint64_t bytes = atomic_load(&R.bytes_accepted), ring = atomic_load(&R.ring);
    double mbs = dt > 0 ? (double)(bytes - *prev_bytes) / dt / 1e6 : 0;
    double bps = dt > 0 ? (double)(acc - *prev_acc) / dt : 0;
    *prev_bytes = bytes;
    *prev_acc = acc;
    char ringtxt[48] = "-", losstxt[48] = "";
    if (ring) {
        uint64_t slots = ring >> 32, fr = ring & 0xffffffffu;
        snprintf(ringtxt, sizeof ringtxt, "%" PRIu64 "/%" PRIu64, slots >= fr ? slots - fr : 0, slots);
    }
    pthread_mutex_lock(&R.mu);
    if (R.last_id >= 0)
        snprintf(losstxt, sizeof losstxt, "  loss %.4f", R.last_loss);
    fprintf(stderr,
            "\r\033[K%6.1fs  sent %" PRIu64 "  accepted %" PRIu64 "  %.1f MB/s  %.1f batches/s  ring %s"
            "  retries %" PRIu64 "  errors %" PRIu64 "%s",
            t, sent, acc, mbs, bps, ringtxt, (uint64_t)atomic_load(&R.retries),
            (uint64_t)atomic_load(&R.errors), losstxt);
    R.progress_shown = 1;
    pthread_mutex_unlock(&R.mu);
}

static void print_summary(const options *o, double secs)
{
    uint64_t sent = atomic_load(&R.sent), acc = atomic_load(&R.accepted);
    uint64_t bytes = atomic_load(&R.bytes_accepted);
    double mbs = secs > 0 ? (double)bytes / secs / 1e6 : 0;
    double bps = secs > 0 ? (double)acc / secs : 0;

    pthread_mutex_lock(&R.mu);
    if (R.progress_shown) {
        fputs("\r\033[K", stderr);
        R.progress_shown = 0;
    }
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "batches_sent", (double)sent);
        cJSON_AddNumberToObject(j, "accepted", (double)acc);
        cJSON_AddNumberToObject(j, "rejected", (double)atomic_load(&R.rejected));
        cJSON_AddNumberToObject(j, "interrupted", (double)atomic_load(&R.interrupted));
        cJSON_AddNumberToObject(j, "failed", (double)atomic_load(&R.failed));
        cJSON_AddNumberToObject(j, "retries", (double)atomic_load(&R.retries));
        cJSON_AddNumberToObject(j, "undecodable_files", (double)atomic_load(&R.undecodable));
        cJSON *e = cJSON_AddObjectToObject(j, "errors");
        for (int i = 0; i < R.nerrs; i++)
            cJSON_AddNumberToObject(e, R.errs[i].code, (double)R.errs[i].count);
        cJSON_AddNumberToObject(j, "bytes", (double)bytes);
        cJSON_AddNumberToObject(j, "bytes_uploaded", (double)atomic_load(&R.bytes_uploaded));
        cJSON_AddNumberToObject(j, "seconds", secs);
        cJSON_AddNumberToObject(j, "mb_per_s", mbs);
        cJSON_AddNumberToObject(j, "batches_per_s", bps);
        if (R.last_id >= 0) {
            cJSON_AddNumberToObject(j, "last_loss", R.last_loss);
            cJSON_AddNumberToObject(j, "first_loss", R.first_loss);
        } else {
            cJSON_AddNullToObject(j, "last_loss");
            cJSON_AddNullToObject(j, "first_loss");
        }
        if (R.last_id >= 0 && R.have_acc)
            cJSON_AddNumberToObject(j, "last_accuracy", R.last_acc);
        else
            cJSON_AddNullToObject(j, "last_accuracy");
        cJSON_AddStringToObject(j, "workload", o->dir ? "dir" : o->wl->name);
        cJSON_AddNumberToObject(j, "batch", o->dir ? 0 : o->batch);
        cJSON_AddNumberToObject(j, "connections", o->connections);
        cJSON_AddBoolToObject(j, "interrupted_by_signal", g_sigint > 0);
        char *s = cJSON_PrintUnformatted(j);
        if (s)
            printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
    } else {
        printf("streamfeed-load: %s%s, %d connection%s%s\n", o->dir ? "files of " : "",
               o->dir ? o->dir : o->wl->name, o->connections, o->connections == 1 ? "" : "s",
               g_sigint ? " (interrupted)" : "");
        printf("  sent %" PRIu64 "  accepted %" PRIu64 "  rejected %" PRIu64 "  interrupted %" PRIu64
               "  retries %" PRIu64 "%s\n",
               sent, acc, (uint64_t)atomic_load(&R.rejected), (uint64_t)atomic_load(&R.interrupted),
               (uint64_t)atomic_load(&R.retries), atomic_load(&R.failed) ? "  (some failed in training)" : "");
        printf("  %.1f MB accepted in %.2f s: %.1f MB/s, %.1f batches/s\n", (double)bytes / 1e6, secs, mbs,
               bps);
        if (R.last_id >= 0) {
            printf("  loss: first %.4f (batch %" PRId64 "), last %.4f (batch %" PRId64 ")", R.first_loss,
                   R.first_id, R.last_loss, R.last_id);
            if (R.have_acc)
                printf(", accuracy %.3f", R.last_acc);
            printf("\n");
        }
        if (R.nerrs) {
            printf("  errors:");
            for (int i = 0; i < R.nerrs; i++)
                printf(" %s %" PRIu64, R.errs[i].code, R.errs[i].count);
            printf("\n");
        }
    }
    fflush(stdout);
    pthread_mutex_unlock(&R.mu);
}

/* ---- main ---------------------------------------------------------------- */

/* --dir: the server's bounds on one JPEG file, from GET /v1/config, so that
 * the pool leaves out, naming them, the files the server would refuse for
 * their size. Quietly nothing when the server cannot say (not up yet, an
 * older server): it then refuses such files itself, by name. */
static void read_server_limits(options *o)
{
    CURL *h = curl_easy_init();
    reply_buf rep = {malloc(REPLY_CAP + 1), 0};
    struct curl_slist *hl = NULL;
    if (!h || !rep.data)
        goto out;
    char url[2048], auth[1024];
    snprintf(url, sizeof url, "%s/v1/config", o->url);
    if (o->token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o->token);
        hl = curl_slist_append(NULL, auth);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, reply_buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &rep);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "streamfeed-load/1");
    set_tls(h, o);
    long status = 0;
    if (curl_easy_perform(h) != CURLE_OK || curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status) != CURLE_OK ||
        status != 200)
        goto out;
    cJSON *j = cJSON_ParseWithLength(rep.data, rep.len);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "config");
    const cJSON *jp = cJSON_GetObjectItemCaseSensitive(c, "jpeg");
    const cJSON *ring = cJSON_GetObjectItemCaseSensitive(c, "ring");
    if (cJSON_IsObject(jp) && cJSON_IsObject(ring)) {
        o->srv_max_side = (int64_t)json_num(jp, "max_side", 0);
        o->srv_max_pixels = (int64_t)json_num(jp, "max_pixels", 0);
        o->srv_max_batch_pixels = (int64_t)json_num(jp, "max_batch_pixels", 0);
        o->srv_slot_bytes = (int64_t)json_num(ring, "slot_bytes", 0);
    }
    cJSON_Delete(j);
out:
    curl_slist_free_all(hl);
    if (h)
        curl_easy_cleanup(h);
    free(rep.data);
}

static void on_sigint(int sig)
{
    (void)sig;
    if (g_sigint < 2)
        g_sigint++;
    if (g_sigint >= 2)
        signal(SIGINT, SIG_DFL); /* a third Ctrl-C ends the process at once */
}

/* The workers' header lists, multi handles and slices of the connections.
 * 1 when every one was set up. */
static int setup_workers(const options *o, worker *workers, conn *conns, const char *post_url,
                         const char *auth)
{
    int setup_ok = conns != NULL;
    for (int t = 0; setup_ok && t < o->threads; t++) {
        worker *w = &workers[t];
        w->index = t;
        /* Each worker has its own header list and multi handle: nothing of
         * libcurl's is shared between threads. "Expect:" turns off the
         * 100-continue round trip libcurl would otherwise make per request. */
        struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/vnd.safetensors");
        if (hl)
            hl = curl_slist_append(hl, "Expect:");
        if (hl)
            hl = curl_slist_append(hl, "Accept: application/json");
        if (hl && o->token)
            hl = curl_slist_append(hl, auth);
        w->headers = hl;
        w->multi = curl_multi_init();
        if (!hl || !w->multi) {
            setup_ok = 0;
            break;
        }
        /* Each worker drives one contiguous slice of the connections; the
         * slices differ in size by at most one. */
        w->nconns = o->connections / o->threads + (t < o->connections % o->threads);
    }
    for (int t = 0, at = 0; setup_ok && t < o->threads; t++) {
        worker *w = &workers[t];
        w->conns = &conns[at];
        for (int i = 0; i < w->nconns && setup_ok; i++)
            if (conn_init(&w->conns[i], post_url, w->headers, o->seed ^ (0x5bd1e995ULL * (uint64_t)(at + i + 1))) != 0)
                setup_ok = 0;
        at += w->nconns;
    }

    return setup_ok;
}

/* Runs the workers to the end of the load (or an interrupt) with progress
 * and loss polling, then, with --drain, waits for the last batch to train.
 * Returns the seconds the load took. */
static double run_workers(options *o, pool *p, worker *workers, bool tty)
{
    double t_start = now_s(), secs = 0;
    R.t0 = t_start;
    R.deadline = t_start + o->seconds;
    atomic_store(&R.workers_left, o->threads);
    int started = 0;
    for (int t = 0; t < o->threads; t++) {
        if (pthread_create(&workers[t].tid, NULL, worker_main, &workers[t]) != 0) {
            fprintf(stderr, "streamfeed-load: could not start worker thread %d\n", t);
            atomic_store(&R.stop, 1);
            atomic_fetch_sub(&R.workers_left, o->threads - t);
            break;
        }
        started++;
    }

    poller pl;
    poller_init(&pl, o);
    uint64_t prev_bytes = 0, prev_acc = 0;
    double last_tick = t_start;
    int sig_seen = 0;
    while (atomic_load(&R.workers_left) > 0) {
        sleep_s(0.05);
        double now = now_s();
        if (g_sigint > sig_seen) {
            /* The handler only counts; the message is printed here. */
            sig_seen = g_sigint;
            if (!o->quiet) {
                pthread_mutex_lock(&R.mu);
                msg_locked(sig_seen == 1 ? "streamfeed-load: interrupted; finishing the requests in flight "
                                           "(Ctrl-C again to abort them)\n"
                                         : "streamfeed-load: aborting the requests in flight\n");
                pthread_mutex_unlock(&R.mu);
            }
        }
        if (now - last_tick < PROGRESS_PERIOD)
            continue;
        if (!o->wait)
            poll_losses(&pl);
        if (tty)
            print_progress(now - t_start, now - last_tick, &prev_bytes, &prev_acc);
        last_tick = now;
    }
    for (int t = 0; t < started; t++)
        pthread_join(workers[t].tid, NULL);
    uint64_t end_ns = atomic_load(&R.t_end_ns);
    secs = end_ns ? (double)end_ns * 1e-9 - t_start : now_s() - t_start;

    /* --drain: wait until the newest accepted batch has trained, so that
     * the summary carries the final loss. */
    if (o->drain && !o->wait && atomic_load(&R.max_id) >= 0) {
        double limit = now_s() + (o->timeout_ms > 0 ? (double)o->timeout_ms : DEFAULT_DRAIN_MS) / 1000.0;
        int64_t last = atomic_load(&R.max_id);
        if (tty) {
            pthread_mutex_lock(&R.mu);
            msg_locked("streamfeed-load: sent; waiting for batch %" PRId64 " to train\n", last);
            pthread_mutex_unlock(&R.mu);
        }
        while (g_sigint == 0 && now_s() < limit) {
            int r = poll_batch(&pl, last);
            if (r == 1 || (r < 0 && pl.failures >= 5))
                break;
            sleep_s(0.2);
        }
        if (!pl.first_done)
            poll_batch(&pl, atomic_load(&R.min_id));
        report_pool_left_out(&pl, p);
    } else if (!o->wait && atomic_load(&R.max_id) >= 0) {
        poll_losses(&pl); /* one last look, without waiting */
    }
    poller_free(&pl);
    return secs;
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (o.diagnose)
        return run_diagnose(&o);

    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);

    R.o = &o;
    R.first_id = R.last_id = -1;
    atomic_store(&R.max_id, -1);
    atomic_store(&R.min_id, INT64_MAX);

    pool p = {0};
    double g0 = now_s();
    if (o.dir && !o.prepare)
        read_server_limits(&o);
    rc = o.dir ? pool_load_dir(&o, &p) : o.wl->jpeg ? pool_generate_jpeg(&o, &p) : pool_generate(&o, &p);
    if (rc != 0)
        return rc;
    if (o.prepare) {
        printf("%d bodies, %.1f MiB%s%s%s%s\n", p.n, (double)p.bytes / 1048576.0, p.labels ? ", labels " : "",
               p.labels ? p.labels : "", p.jpeg_dir[0] ? ", files in " : "", p.jpeg_dir);
        pool_free(&p);
        return 0;
    }
    if (!o.quiet && !g_sigint)
        fprintf(stderr,
                "streamfeed-load: pool of %d %s, %.1f MiB in all (bound --pool-mb %" PRIu64 "), %s%s%sready in %.2f s; "
                "%d connection%s on %d thread%s to %s\n",
                p.n, o.dir && !p.encoded ? "files" : "bodies", (double)p.bytes / 1048576.0, o.pool_mb,
                p.labels ? "labels " : "", p.labels ? p.labels : "", p.labels ? ", " : "", now_s() - g0,
                o.connections, o.connections == 1 ? "" : "s", o.threads, o.threads == 1 ? "" : "s", o.url);
    R.p = &p;

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "streamfeed-load: curl_global_init failed\n");
        pool_free(&p);
        return 1;
    }

    char post_url[2048];
    snprintf(post_url, sizeof post_url, "%s/v1/batches%s", o.url, o.wait ? "?wait=1" : "");
    char auth[1024] = "";
    if (o.token)
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o.token);

    worker workers[MAX_THREADS];
    conn *conns = calloc((size_t)o.connections, sizeof *conns);
    memset(workers, 0, sizeof workers);
    int setup_ok = setup_workers(&o, workers, conns, post_url, auth);
    const bool tty = isatty(STDERR_FILENO) && !o.quiet;
    double secs = 0;
    if (setup_ok && !g_sigint)
        secs = run_workers(&o, &p, workers, tty);

    print_summary(&o, secs);

    for (int t = 0; t < o.threads; t++) {
        for (int i = 0; conns && i < workers[t].nconns; i++)
            conn_free(&workers[t].conns[i]);
        if (workers[t].multi)
            curl_multi_cleanup(workers[t].multi);
        curl_slist_free_all(workers[t].headers);
    }
    free(conns);
    curl_global_cleanup();
    pool_free(&p);

    if (!setup_ok)
        return 1;
    uint64_t sent = atomic_load(&R.sent);
    return sent > 0 && atomic_load(&R.accepted) == sent ? 0 : 1;
}
