/* server/log.c — see log.h. */
#include "server/log.h"
#include "server/text.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

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

/* Escapes text for a log line into dst (always terminated): for a JSON string
 * value (json: quotes, backslashes and control characters as JSON escapes),
 * or for the text format (control characters as \n, \t, \xNN, so one
 * record is one line). Bytes that are not well-formed UTF-8 — a request path
 * may hold any — become U+FFFD (JSON) or \xNN (text). */
static void log_escape(char *dst, size_t cap, const char *src, int json)
{
    size_t o = 0;
    const unsigned char *p = (const unsigned char *)src;
    size_t left = strlen(src);
    while (left && o + 7 < cap) {
        const size_t n = sf_utf8_seq(p, left);
        const unsigned char c = *p;
        if (n == 0 && json) {
            o += (size_t)snprintf(dst + o, cap - o, "\\ufffd");
        } else if (n == 0) {
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
        } else if (json && (c == '"' || c == '\\')) {
            dst[o++] = '\\';
            dst[o++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            if (json)
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

void sf_log_fields(sf_log_level l, const char *msg, const sf_log_field *f, int n)
{
    if (!sf_log_enabled(l))
        return;
    char when[64], line[6144];
    sf_log_time(when, sizeof when);
    size_t o = 0;
    int json = atomic_load(&g_json);
    char esc[2100];
    log_escape(esc, sizeof esc, msg, json);
    if (json)
        o += (size_t)snprintf(line, sizeof line, "{\"time\":\"%s\",\"level\":\"%s\",\"msg\":\"%s\"",
                              when, level_names[l], esc);
    else
        o += (size_t)snprintf(line, sizeof line, "%s %-5s %s", when, level_names[l], esc);
    for (int i = 0; i < n && o < sizeof line; i++) {
        char val[1100];
        if (f[i].s) {
            log_escape(val, sizeof val, f[i].s, json);
            o += (size_t)snprintf(line + o, sizeof line - o, json ? ",\"%s\":\"%s\"" : " %s=%s", f[i].key, val);
        } else {
            fmt_number(val, sizeof val, f[i].num);
            o += (size_t)snprintf(line + o, sizeof line - o, json ? ",\"%s\":%s" : " %s=%s",
                                  f[i].key, val);
        }
    }
    if (o >= sizeof line)
        o = sizeof line - 2;
    if (json)
        snprintf(line + o, sizeof line - o, "}");
    fprintf(stderr, "%s\n", line);
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
