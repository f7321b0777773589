/* server/checkpoint_url.c — see checkpoint_url.h. */
#include "server/checkpoint_url.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/checkpoint_format.h"
#include "server/config.h"

#define fail sf_ckpt_fail

int sf_ckpt_is_url(const char *s) { return strstr(s, "://") != NULL; }

int sf_ckpt_url_scheme_ok(const char *s)
{
    return strncasecmp(s, "http://", 7) == 0 || strncasecmp(s, "https://", 8) == 0;
}

/* The URL without its query and fragment, for messages and logs (a signed
 * URL carries its credentials there). */
void sf_ckpt_url_redact(const char *url, char *out, size_t cap)
{
    size_t n = strcspn(url, "?#");
    snprintf(out, cap, "%.*s%s", (int)(n < 400 ? n : 400), url, url[n] ? "?…" : "");
}

static size_t on_recv(char *p, size_t sz, size_t nm, void *ud)
{
    sf_ckpt_xfer *x = ud;
    size_t n = sz * nm;
    if (n > x->max - x->len) {
        x->too_large = 1;
        return 0; /* aborts the transfer */
    }
    if (x->len + n > x->cap) {
        size_t cap = x->cap ? x->cap : (1u << 20);
        while (cap < x->len + n)
            cap *= 2;
        if (cap > x->max)
            cap = x->max;
        uint8_t *nb = realloc(x->buf, cap);
        if (!nb)
            return 0;
        x->buf = nb;
        x->cap = cap;
    }
    memcpy(x->buf + x->len, p, n);
    x->len += n;
    return n;
}

static size_t on_send(char *p, size_t sz, size_t nm, void *ud)
{
    sf_ckpt_xfer *x = ud;
    size_t n = sz * nm, left = x->up_len - x->up_off;
    if (n > left)
        n = left;
    memcpy(p, x->up + x->up_off, n);
    x->up_off += n;
    return n;
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    sf_ckpt_xfer *x = ud;
    return x->abort && atomic_load(x->abort) ? 1 : 0;
}

/* One transfer: GET into x->buf (upload NULL) or PUT of upload. */
int sf_ckpt_url_transfer(const char *url, const uint8_t *upload, size_t up_len, atomic_int *abort_flag,
                         sf_ckpt_xfer *x, sf_ckpt_error *e)
{
    sf_config *c = malloc(sizeof *c);
    if (!c) {
        fail(e, 503, "out_of_memory", NULL, "out of memory");
        return -1;
    }
    sf_config_get(c);
    memset(x, 0, sizeof *x);
    x->abort = abort_flag;
    x->max = (size_t)c->checkpoint.max_bytes;
    x->up = upload;
    x->up_len = up_len;
    char shown[512];
    sf_ckpt_url_redact(url, shown, sizeof shown);
    CURL *h = curl_easy_init();
    if (!h) {
        free(c);
        fail(e, 503, "out_of_memory", NULL, "cannot start a transfer");
        return -1;
    }
    char errbuf[CURL_ERROR_SIZE] = "";
    struct curl_slist *hdrs = NULL;
    curl_easy_setopt(h, CURLOPT_URL, url);
    /* http and https only, for the URL and for any redirect: a redirect to
     * file://, ftp://, ... fails instead of reading the local disk. */
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, upload ? 0L : 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, (long)c->checkpoint.url_timeout_s);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT,
                     (long)(c->checkpoint.url_timeout_s < 30 ? c->checkpoint.url_timeout_s : 30));
    curl_easy_setopt(h, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "streamfeed-checkpoint");
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
    if (c->checkpoint.url_token[0]) {
        /* Sent to the URL's own host only: libcurl drops it on a redirect to another. */
        curl_easy_setopt(h, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
        curl_easy_setopt(h, CURLOPT_XOAUTH2_BEARER, c->checkpoint.url_token);
    }
    if (upload) {
        hdrs = curl_slist_append(hdrs, "Content-Type: application/vnd.safetensors");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_send);
        curl_easy_setopt(h, CURLOPT_READDATA, x);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)up_len);
    } else {
        curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)x->max);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_recv);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    }
    CURLcode rc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    int timeout_s = c->checkpoint.url_timeout_s;
    free(c);
    const char *verb = upload ? "PUT" : "GET";
    if (rc == CURLE_OK && (code < 200 || code > 299)) {
        fail(e, 422, "url_fetch_failed", "url", "%s %s: the server answered %ld", verb, shown, code);
        free(x->buf);
        x->buf = NULL;
        return -1;
    }
    if (rc == CURLE_OK)
        return 0;
    if (x->too_large || rc == CURLE_FILESIZE_EXCEEDED)
        fail(e, 413, "checkpoint_too_large", "url", "GET %s: more than checkpoint.max_bytes (%zu)",
             shown, x->max);
    else if (rc == CURLE_ABORTED_BY_CALLBACK)
        fail(e, 503, "shutting_down", "url", "%s %s: cut short, the service is shutting down", verb,
             shown);
    else if (rc == CURLE_OPERATION_TIMEDOUT)
        fail(e, 422, "url_fetch_failed", "url", "%s %s: no complete transfer within %d s "
             "(checkpoint.url_timeout_s)", verb, shown, timeout_s);
    else
        fail(e, 422, "url_fetch_failed", "url", "%s %s: %s", verb, shown,
             errbuf[0] ? errbuf : curl_easy_strerror(rc));
    free(x->buf);
    x->buf = NULL;
    return -1;
}

