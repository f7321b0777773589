/* server/log.c — see log.h. */
#include "server/log.h"
#include "server/clock.h"
#include "server/text.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static atomic_int g_level = SF_LOG_INFO;
static atomic_int g_json = 0;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void sf_log_set_level(sf_log_level l) { atomic_store(&g_level, (int)l); }
void sf_log_set_json(int json) { atomic_store(&g_json, json ? 1 : 0); }
int sf_log_enabled(sf_log_level l) { return (int)l >= atomic_load(&g_level); }

int sf_log_level_parse(const char *s, sf_log_level *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (sf_log_level)i;
            return 0;
        }
    }
    return -1;
}

enum { LOG_TEXT = 0, LOG_JSON = 1, LOG_TEXT_FIELD = 2 };

/* Escapes text for a log line into dst (always terminated; cap > 8): for a
 * JSON string value (LOG_JSON: quotes, backslashes and control characters as
 * JSON escapes), or for the text format (LOG_TEXT, LOG_TEXT_FIELD: control
 * characters as \n, \t, \xNN, so one record is one line). Bytes that are
 * not well-formed UTF-8 — a request path may hold any — become U+FFFD (JSON)
 * or \xNN (text). */
static void log_escape(char *dst, size_t cap, const char *src, int mode)
{
    size_t o = 0;
    /* A text field's value with a space, '=' or '"' (a request path may hold
     * any) is quoted, with '"' and '\\' escaped inside, as logfmt quotes it:
     * unquoted, "GET /x%20status=200" would log as a second status field. */
    const int quote = mode == LOG_TEXT_FIELD && (!*src || strpbrk(src, " =\""));
    if (quote)
        dst[o++] = '"';
    const unsigned char *p = (const unsigned char *)src;
    size_t left = strlen(src);
    while (left && o + 7 < cap) {
        const size_t n = sf_utf8_seq(p, left);
        const unsigned char c = *p;
        if (n == 0 && mode == LOG_JSON) {
            o += (size_t)snprintf(dst + o, cap - o, "\\ufffd");
        } else if (n == 0) {
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
        } else if ((mode == LOG_JSON || quote) && (c == '"' || c == '\\')) {
            dst[o++] = '\\';
            dst[o++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            if (mode == LOG_JSON)
                o += (size_t)snprintf(dst + o, cap - o, "\\u%04x", c);
            else if (c == '\n' || c == '\r' || c == '\t')
                o += (size_t)snprintf(dst + o, cap - o, "\\%c", c == '\n' ? 'n' : c == '\r' ? 'r' : 't');
            else
                o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
        } else if (n <= cap - 1 - o) {
            memcpy(dst + o, p, n);
            o += n;
        } else {
            break;
        }
        p += n ? n : 1;
        left -= n ? n : 1;
    }
    if (quote)
        dst[o++] = '"';
    dst[o] = '\0';
}

void sf_log_time(char *out, int cap)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(out, (size_t)cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
}

/* A number as JSON and text show it: integers without a fraction. */
static void fmt_number(char *out, size_t cap, double v)
{
    if (v == (double)(long long)v && v > -1e15 && v < 1e15)
        snprintf(out, cap, "%lld", (long long)v);
    else if (isfinite(v))
        snprintf(out, cap, "%.3f", v);
    else
        snprintf(out, cap, "null");
}

/* ---- the writer ----------------------------------------------------------------
 *
 * A pipe or a socket on stderr (a container runtime's log FIFO, a collector)
 * can stop being read; a thread blocked writing to it would stall whatever it
 * was doing — a request, a probe, the training loop. Once sf_log_start has
 * seen such a stderr, lines go into a bounded buffer that one thread writes
 * out; when the buffer is full a line is dropped and counted, and the count
 * is logged once the reader has caught up. A regular file, a terminal or
 * /dev/null is written directly, in the caller, whether or not sf_log_start
 * has run: its writes do not wait on a reader, and a line is there as soon as the call
 * returns. */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t more;     /* the writer waits for lines */
    pthread_cond_t progress; /* sf_log_flush waits for bytes to be written */
    char *buf;
    size_t head, len;        /* a ring of SF_LOG_BUFFER_BYTES */
    uint64_t appended;       /* bytes ever put in the ring */
    uint64_t written;        /* bytes ever written out of it */
    uint64_t unreported;     /* lines dropped since the last report */
    int reporting;           /* the writer is logging a report of drops */
    int fd;                  /* stderr's descriptor as sf_log_start found it */
    atomic_int running;
    _Atomic uint64_t dropped;
} W = {.mu = PTHREAD_MUTEX_INITIALIZER};

uint64_t sf_log_dropped(void) { return atomic_load(&W.dropped); }

/* Writes all of p; what cannot be written (a closed reader: EPIPE, SIGPIPE
 * being ignored) is discarded. */
static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            poll(&pf, 1, 100);
        } else {
            return;
        }
    }
}

static void emit(const char *line, size_t n)
{
    if (!atomic_load(&W.running)) {
        /* stdio's lock keeps concurrent lines whole */
        fwrite(line, 1, n, stderr);
        return;
    }
    pthread_mutex_lock(&W.mu);
    if (SF_LOG_BUFFER_BYTES - W.len >= n) {
        const size_t tail = (W.head + W.len) % SF_LOG_BUFFER_BYTES;
        const size_t first = n < SF_LOG_BUFFER_BYTES - tail ? n : SF_LOG_BUFFER_BYTES - tail;
        memcpy(W.buf + tail, line, first);
        memcpy(W.buf, line + first, n - first);
        W.len += n;
        W.appended += n;
        pthread_cond_signal(&W.more);
    } else {
        W.unreported++;
        atomic_fetch_add(&W.dropped, 1);
    }
    pthread_mutex_unlock(&W.mu);
}

/* The length of the next write from p[0, n): at most PIPE_BUF bytes, which a
 * pipe takes whole, so that nothing else written to it (another process on
 * the same stderr) lands inside a line; up to the last newline in them when
 * there is one. */
static size_t write_span(const char *p, size_t n)
{
    if (n <= PIPE_BUF)
        return n;
    for (size_t k = PIPE_BUF; k > 0; k--)
        if (p[k - 1] == '\n')
            return k;
    return PIPE_BUF;
}

static void *writer_main(void *arg)
{
    (void)arg;
    /* Signals belong to the thread that waits for them. */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_mutex_lock(&W.mu);
    for (;;) {
        if (W.len == 0 && W.unreported) {
            const uint64_t k = W.unreported;
            W.unreported = 0;
            W.reporting = 1;
            pthread_mutex_unlock(&W.mu);
            char msg[200];
            snprintf(msg, sizeof msg,
                     "log: %llu lines dropped: stderr was read more slowly than lines came "
                     "(streamfeed_log_lines_dropped_total)", (unsigned long long)k);
            const sf_log_field f = SF_LF_NUM("dropped", k);
            sf_log_fields(SF_LOG_WARN, msg, &f, 1);
            pthread_mutex_lock(&W.mu);
            W.reporting = 0;
            pthread_cond_broadcast(&W.progress);
            continue;
        }
        if (W.len == 0) {
            pthread_cond_wait(&W.more, &W.mu);
            continue;
        }
        /* Producers only append after head + len: the span written here
         * stays as it is while the lock is released. */
        const char *p = W.buf + W.head;
        const size_t n = write_span(p, W.len < SF_LOG_BUFFER_BYTES - W.head ? W.len : SF_LOG_BUFFER_BYTES - W.head);
        pthread_mutex_unlock(&W.mu);
        write_all(W.fd, p, n);
        pthread_mutex_lock(&W.mu);
        W.head = (W.head + n) % SF_LOG_BUFFER_BYTES;
        W.len -= n;
        W.written += n;
        pthread_cond_broadcast(&W.progress);
    }
    return NULL;
}

int sf_log_flush(int timeout_ms)
{
    if (!atomic_load(&W.running)) {
        fflush(stderr);
        return 0;
    }
    const struct timespec until = sf_deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&W.mu);
    /* Every byte logged before this call, and the report of any drop until
     * then (the writer logs it once the ring is empty). Lines other threads
     * log meanwhile are not waited for, unless a report comes after them. */
    uint64_t target = W.appended;
    int rc = 0, done = 0;
    while (!done && rc == 0) {
        if (W.unreported || W.reporting) {
            rc = pthread_cond_timedwait(&W.progress, &W.mu, &until);
            if (!W.unreported && !W.reporting && W.appended > target)
                target = W.appended; /* the report is in the ring now */
        } else if (W.written >= target) {
            done = 1;
        } else {
            rc = pthread_cond_timedwait(&W.progress, &W.mu, &until);
        }
    }
    done = done || (!W.unreported && !W.reporting && W.written >= target);
    pthread_mutex_unlock(&W.mu);
    return done ? 0 : -1;
}

void sf_log_raw(const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    size_t o = n < 0 ? 0 : (size_t)n < sizeof line - 1 ? (size_t)n : sizeof line - 2;
    line[o++] = '\n';
    emit(line, o);
}

static void flush_at_exit(void) { sf_log_flush(SF_LOG_EXIT_FLUSH_MS); }

int sf_log_start(void)
{
    struct stat st;
    if (atomic_load(&W.running) || fstat(STDERR_FILENO, &st) != 0 ||
        !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))
        return 0;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&W.progress, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&W.more, NULL);
    W.buf = malloc(SF_LOG_BUFFER_BYTES);
    /* A descriptor of its own: the writer keeps writing where stderr
     * pointed at the start even if descriptor 2 is later pointed elsewhere. */
    W.fd = W.buf ? fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3) : -1;
    pthread_t th;
    if (W.fd < 0 || pthread_create(&th, NULL, writer_main, NULL) != 0) {
        if (W.fd >= 0)
            close(W.fd);
        free(W.buf);
        W.buf = NULL;
        return -1; /* lines keep going straight to stderr */
    }
    pthread_detach(th);
    fflush(stderr);
    atomic_store(&W.running, 1);
    atexit(flush_at_exit);
    return 1;
}

void sf_log_fields(sf_log_level l, const char *msg, const sf_log_field *f, int n)
{
    if (!sf_log_enabled(l))
        return;
    char when[64], line[6144];
    sf_log_time(when, sizeof when);
    size_t o = 0;
    int json = atomic_load(&g_json);
    char esc[2100];
    log_escape(esc, sizeof esc, msg, json ? LOG_JSON : LOG_TEXT);
    if (json)
        o += (size_t)snprintf(line, sizeof line, "{\"time\":\"%s\",\"level\":\"%s\",\"msg\":\"%s\"",
                              when, level_names[l], esc);
    else
        o += (size_t)snprintf(line, sizeof line, "%s %-5s %s", when, level_names[l], esc);
    for (int i = 0; i < n && o < sizeof line; i++) {
        char val[1100];
        if (f[i].s) {
            log_escape(val, sizeof val, f[i].s, json ? LOG_JSON : LOG_TEXT_FIELD);
            o += (size_t)snprintf(line + o, sizeof line - o, json ? ",\"%s\":\"%s\"" : " %s=%s", f[i].key, val);
        } else {
            fmt_number(val, sizeof val, f[i].num);
            o += (size_t)snprintf(line + o, sizeof line - o, json ? ",\"%s\":%s" : " %s=%s",
                                  f[i].key, val);
        }
    }
    /* room for the closing brace and the newline */
    if (o > sizeof line - 3)
        o = sizeof line - 3;
    if (json)
        line[o++] = '}';
    line[o++] = '\n';
    emit(line, o);
}

void sf_log(sf_log_level l, const char *fmt, ...)
{
    if (!sf_log_enabled(l))
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sf_log_fields(l, msg, NULL, 0);
}
