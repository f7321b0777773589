/* collective/kv_client.c — see kv_client.h. */
#include "collective/kv_client.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KV_REQUEST_TIMEOUT_MS 5000L
#define KV_RETRY_MS 100L

struct sf_kv_client {
    char base[512];
    char auth[2100];
    char last_err[512];
    pthread_mutex_t mu;
};

typedef struct sink {
    uint8_t *buf;
    size_t cap, len;
} sink;

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    sink *s = ud;
    size_t bytes = size * n;
    if (s->len < s->cap) {
        size_t take = s->cap - s->len < bytes ? s->cap - s->len : bytes;
        memcpy(s->buf + s->len, p, take);
    }
    s->len += bytes; /* the full length, so the caller sees a value larger than its buffer */
    return bytes;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* fmt takes the rendezvous base URL first. */
static void set_err(sf_kv_client *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char msg[sizeof c->last_err];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->mu);
    memcpy(c->last_err, msg, sizeof msg);
    pthread_mutex_unlock(&c->mu);
}

/* One request: the HTTP status, or -1 when rank 0 did not answer (err set). */
static long request(sf_kv_client *c, const char *method, const char *key, const void *val, size_t len, sink *out)
{
    CURL *h = curl_easy_init();
    if (!h)
        return -1;
    char url[700];
    snprintf(url, sizeof url, "%s/v1/distributed/kv/%s", c->base, key);
    struct curl_slist *hdr = NULL;
    if (c->auth[0])
        hdr = curl_slist_append(hdr, c->auth);
    hdr = curl_slist_append(hdr, "Content-Type: application/octet-stream");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, KV_REQUEST_TIMEOUT_MS);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, KV_REQUEST_TIMEOUT_MS);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    sink discard = {0};
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out ? out : &discard);
    if (!strcmp(method, "PUT")) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PUT");
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, val);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    CURLcode rc = curl_easy_perform(h);
    long status = -1;
    if (rc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    else
        set_err(c, "the rendezvous %s (rank 0) did not answer %s: %s", c->base, key, curl_easy_strerror(rc));
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return status;
}

/* Why rank 0 refused a request: the message of its error reply, or what a
 * 401 means here. */
static void refusal(long status, const sink *reply, char *out, size_t cap)
{
    if (status == 401) {
        snprintf(out, cap, "distributed ranks need the same http.token");
        return;
    }
    cJSON *j = cJSON_ParseWithLength((const char *)reply->buf, reply->len < reply->cap ? reply->len : reply->cap);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "message");
    snprintf(out, cap, "%s", cJSON_IsString(m) ? m->valuestring : "no error message");
    cJSON_Delete(j);
}

static int kv_set(void *ctx, const char *key, const void *val, size_t len)
{
    sf_kv_client *c = ctx;
    uint8_t body[600];
    sink reply = {body, sizeof body, 0};
    long st = request(c, "PUT", key, val, len, &reply);
    if (st == 200 || st == 204)
        return 0;
    if (st < 0)
        return 1; /* no answer: request() kept why */
    char why[400];
    refusal(st, &reply, why, sizeof why);
    set_err(c, "the rendezvous %s refused key %s with HTTP %ld: %s", c->base, key, st, why);
    return -1;
}

static int kv_get(void *ctx, const char *key, void *buf, size_t cap, size_t *len, int timeout_ms)
{
    sf_kv_client *c = ctx;
    const uint64_t end = now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        sink s = {buf, cap, 0};
        long st = request(c, "GET", key, NULL, 0, &s);
        if (st == 200) {
            *len = s.len;
            return 0;
        }
        if (st >= 0 && st != 404) {
            char why[400];
            refusal(st, &s, why, sizeof why);
            set_err(c, "the rendezvous %s answered key %s with HTTP %ld: %s", c->base, key, st, why);
            return -1;
        }
        if (st == 404)
            set_err(c, "the rendezvous %s has no key %s yet: a rank has not joined", c->base, key);
        if (now_ms() >= end)
            return 1;
        struct timespec ts = {0, KV_RETRY_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
}

sf_kv_client *sf_kv_client_new(const char *rendezvous, const char *token, char *err, size_t errlen)
{
    if (!rendezvous || !rendezvous[0] || strlen(rendezvous) > 400) {
        snprintf(err, errlen, "distributed.rendezvous is empty or too long");
        return NULL;
    }
    sf_kv_client *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    if (!strncmp(rendezvous, "http://", 7) || !strncmp(rendezvous, "https://", 8))
        snprintf(c->base, sizeof c->base, "%s", rendezvous);
    else
        snprintf(c->base, sizeof c->base, "http://%s", rendezvous);
    size_t n = strlen(c->base);
    while (n > 0 && c->base[n - 1] == '/')
        c->base[--n] = '\0';
    if (token && token[0])
        snprintf(c->auth, sizeof c->auth, "Authorization: Bearer %s", token);
    return c;
}

sf_kv_store sf_kv_client_store(sf_kv_client *c)
{
    sf_kv_store s = {c, kv_set, kv_get};
    return s;
}

void sf_kv_client_error(sf_kv_client *c, char *out, size_t cap)
{
    pthread_mutex_lock(&c->mu);
    snprintf(out, cap, "%s", c->last_err);
    pthread_mutex_unlock(&c->mu);
}

void sf_kv_client_free(sf_kv_client *c)
{
    if (!c)
        return;
    pthread_mutex_destroy(&c->mu);
    free(c);
}
