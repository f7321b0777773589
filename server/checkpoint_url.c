/* server/checkpoint_url.c — see checkpoint_url.h. */
#include "server/checkpoint_url.h"
#include "server/text.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/checkpoint_format.h"
#include "server/config.h"
#include "server/log.h"

#define fail sf_ckpt_fail
#define URL_MAX 2048
#define MAX_REDIRECTS 5

int sf_ckpt_is_url(const char *s) { return strstr(s, "://") != NULL; }

int sf_ckpt_url_scheme_ok(const char *s)
{
    return strncasecmp(s, "http://", 7) == 0 || strncasecmp(s, "https://", 8) == 0;
}

/* ---- the rules ----------------------------------------------------------------------- */

/* An address or a network: family AF_INET or AF_INET6, 4 or 16 bytes. */
typedef struct net {
    int family;
    uint8_t a[16];
    int bits;
} net;

static int parse_net(const char *s, size_t n, net *out)
{
    char buf[64];
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *host = buf;
    if (host[0] == '[') { /* "[::1]" as URLs write it */
        char *end = strchr(host, ']');
        if (!end)
            return -1;
        memmove(end, end + 1, strlen(end + 1) + 1);
        host++;
    }
    char *slash = strchr(host, '/');
    int bits = -1;
    if (slash) {
        *slash = '\0';
        char *end;
        long v = strtol(slash + 1, &end, 10);
        if (*end || slash[1] == '\0' || v < 0 || v > 128)
            return -1;
        bits = (int)v;
    }
    if (inet_pton(AF_INET, host, out->a) == 1)
        out->family = AF_INET;
    else if (inet_pton(AF_INET6, host, out->a) == 1)
        out->family = AF_INET6;
    else
        return -1;
    int max = out->family == AF_INET ? 32 : 128;
    if (bits > max)
        return -1;
    out->bits = bits < 0 ? max : bits;
    return 0;
}

static int net_has(const net *n, int family, const uint8_t *a)
{
    if (n->family != family)
        return 0;
    int full = n->bits / 8, rest = n->bits % 8;
    if (memcmp(n->a, a, (size_t)full) != 0)
        return 0;
    return rest == 0 || ((n->a[full] ^ a[full]) & (uint8_t)(0xff << (8 - rest))) == 0;
}

/* Loopback, unspecified, link-local (where cloud metadata services answer)
 * and multicast, and the metadata services elsewhere (AWS's IPv6 address,
 * Alibaba's 100.100.100.200): never a checkpoint store, always worth a
 * forger's try. An IPv6 address that carries an IPv4 one for a translator
 * (NAT64 64:ff9b::/96, 6to4 2002::/16, the old IPv4-compatible ::/96) is
 * also judged by that IPv4 address, which is where a translating network
 * would deliver it. */
static int address_blocked(int family, const uint8_t *a)
{
    static const char *const blocked[] = {
        "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3", "100.100.100.200/32",
        "::/128", "::1/128", "fe80::/10", "ff00::/8", "fd00:ec2::254/128",
    };
    for (size_t i = 0; i < sizeof blocked / sizeof blocked[0]; i++) {
        net n;
        if (parse_net(blocked[i], strlen(blocked[i]), &n) == 0 && net_has(&n, family, a))
            return 1;
    }
    if (family == AF_INET6) {
        static const uint8_t nat64[12] = {0x00, 0x64, 0xff, 0x9b}, compat[12] = {0};
        if (memcmp(a, nat64, 12) == 0 || memcmp(a, compat, 12) == 0)
            return address_blocked(AF_INET, a + 12);
        if (a[0] == 0x20 && a[1] == 0x02)
            return address_blocked(AF_INET, a + 2);
    }
    return 0;
}

/* Calls fn on each entry of checkpoint.url_allow (commas or spaces between);
 * stops at the first that returns 1. */
static int any_entry(const char *list, int (*fn)(const char *e, size_t n, const void *arg), const void *arg)
{
    for (const char *c = list; *c;) {
        c += strspn(c, ", \t");
        size_t n = strcspn(c, ", \t");
        if (n && fn(c, n, arg))
            return 1;
        c += n;
    }
    return 0;
}

typedef struct addr_arg {
    int family;
    const uint8_t *a;
} addr_arg;

static int entry_has_addr(const char *e, size_t n, const void *arg)
{
    const addr_arg *x = arg;
    net nt;
    return parse_net(e, n, &nt) == 0 && net_has(&nt, x->family, x->a);
}

/* scheme://host:port/path of a URL as libcurl will request it: no
 * user:password@ (which could dress evil.example as "http://good.example@"),
 * dot segments removed (so "/ckpt/../admin" does not pass for "/ckpt/"), the
 * default port written out. -1 when it is not a URL with a host. */
static int canonical(const char *url, char *out, size_t cap)
{
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL;
    int rc = -1;
    if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_PATH, &path, 0) == CURLUE_OK)
        rc = (size_t)snprintf(out, cap, "%s://%s:%s%s", scheme, host, port, path) < cap ? 0 : -1;
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_url_cleanup(u);
    if (rc == 0) { /* scheme and host compare without case, the path with */
        char *path_at = strchr(strstr(out, "://") + 3, '/');
        for (char *c = out; c < path_at; c++)
            *c = (char)tolower((unsigned char)*c);
    }
    return rc;
}

typedef struct host_arg {
    const char *url, *host;
} host_arg;

/* A '.', '/' or '\\' written percent-encoded: a server that decodes it before
 * resolving the path would read "/ckpt/%2e%2e/admin" as "/admin", which
 * canonical() cannot see (it removes only literal dot segments). */
static int has_encoded_separator(const char *s)
{
    for (const char *p = strchr(s, '%'); p; p = strchr(p + 1, '%'))
        if ((p[1] == '2' && (p[2] == 'e' || p[2] == 'E' || p[2] == 'f' || p[2] == 'F')) ||
            (p[1] == '5' && (p[2] == 'c' || p[2] == 'C')))
            return 1;
    return 0;
}

static int entry_has_host(const char *e, size_t n, const void *arg)
{
    const host_arg *x = arg;
    if (n > 3 && memmem(e, n, "://", 3)) {
        char entry[URL_MAX], want[URL_MAX], have[URL_MAX];
        if (n >= sizeof entry)
            return 0;
        memcpy(entry, e, n);
        entry[n] = '\0';
        /* A URL prefix admits no path that could leave it once decoded. */
        return canonical(entry, want, sizeof want) == 0 && canonical(x->url, have, sizeof have) == 0 &&
               strncmp(have, want, strlen(want)) == 0 && !has_encoded_separator(have + strlen(want));
    }
    net nt;
    if (parse_net(e, n, &nt) == 0) {
        uint8_t a[16];
        int fam = inet_pton(AF_INET, x->host, a) == 1 ? AF_INET : inet_pton(AF_INET6, x->host, a) == 1 ? AF_INET6 : 0;
        return fam && net_has(&nt, fam, a);
    }
    if (n > 2 && e[0] == '*' && e[1] == '.') {
        e++;
        n--;
    }
    size_t hl = strlen(x->host);
    if (e[0] == '.') /* a domain: its hosts, not the domain's own name */
        return hl > n && strncasecmp(x->host + hl - n, e, n) == 0;
    return hl == n && strncasecmp(x->host, e, n) == 0;
}

/* The URL's host, without the brackets of an IPv6 literal. */
static int host_of(const char *url, char *host, size_t cap)
{
    CURLU *u = curl_url();
    char *h = NULL;
    int rc = -1;
    if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &h, CURLU_URLDECODE) == CURLUE_OK && h && h[0]) {
        size_t n = strlen(h);
        const char *s = h;
        if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
            s = h + 1;
            n -= 2;
        }
        if (n < cap && !memchr(s, '\0', n)) {
            memcpy(host, s, n);
            host[n] = '\0';
            rc = 0;
        }
    }
    curl_free(h);
    curl_url_cleanup(u);
    return rc;
}

/* The URL's origin, "scheme://host:port" in lower case with the scheme's
 * default port filled in: where a credential may go (as browsers and
 * libcurl's own redirect rule decide it). */
static int origin_of(const char *url, char *out, size_t cap)
{
    CURLU *u = curl_url();
    char *scheme = NULL, *port = NULL, host[256];
    int rc = -1;
    if (u && host_of(url, host, sizeof host) == 0 && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
        int n = snprintf(out, cap, "%s://%s:%s", scheme, host, port);
        if (n > 0 && (size_t)n < cap) {
            for (char *c = out; *c; c++)
                *c = (char)tolower((unsigned char)*c);
            rc = 0;
        }
    }
    curl_free(scheme);
    curl_free(port);
    curl_url_cleanup(u);
    return rc;
}

int sf_ckpt_url_check(const char *url, int from_request, sf_ckpt_error *e)
{
    char shown[512];
    sf_url_redact(url, shown, sizeof shown);
    if (strlen(url) >= URL_MAX) {
        fail(e, 400, "request_invalid", "url", "url is longer than %d bytes", URL_MAX - 1);
        return -1;
    }
    if (!sf_ckpt_url_scheme_ok(url)) {
        fail(e, 400, "url_scheme_not_allowed", "url", "only http:// and https:// URLs are allowed");
        return -1;
    }
    char host[256];
    if (host_of(url, host, sizeof host) != 0) {
        fail(e, 400, "url_invalid", "url", "%s is not a URL with a host", shown);
        return -1;
    }
    sf_config *c = malloc(sizeof *c);
    if (!c) {
        fail(e, 503, "out_of_memory", NULL, "out of memory");
        return -1;
    }
    sf_config_get(c);
    int rc = 0;
    if (from_request && !c->http.token[0] && !c->checkpoint.url_allow[0]) {
        fail(e, 403, "url_not_allowed", "url",
             "checkpoint URLs are taken only from authenticated requests (set http.token) or for the "
             "hosts of checkpoint.url_allow");
        rc = -1;
    } else if (c->checkpoint.url_allow[0]) {
        host_arg h = {url, host};
        if (!any_entry(c->checkpoint.url_allow, entry_has_host, &h)) {
            fail(e, 403, "url_not_allowed", "url", "%s: its host is not in checkpoint.url_allow", shown);
            rc = -1;
        }
    }
    free(c);
    return rc;
}

/* ---- the transfer ----------------------------------------------------------------------- */

typedef struct xfer {
    atomic_int *abort;
    int fd, confined;
    uint64_t len, max;
    int too_large, write_failed, blocked;
    const uint8_t *up;
    size_t up_len, up_off;
    char allow[sizeof ((sf_config *)0)->checkpoint.url_allow];
} xfer;

static size_t on_recv(char *p, size_t sz, size_t nm, void *ud)
{
    xfer *x = ud;
    size_t n = sz * nm;
    if (n > x->max - x->len) {
        x->too_large = 1;
        return 0; /* aborts the transfer */
    }
    for (size_t done = 0; done < n;) {
        ssize_t w = pwrite(x->fd, p + done, n - done, (off_t)(x->len + done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            x->write_failed = errno ? errno : EIO;
            return 0;
        }
        done += (size_t)w;
    }
    x->len += n;
    return n;
}

static size_t on_send(char *p, size_t sz, size_t nm, void *ud)
{
    xfer *x = ud;
    size_t n = sz * nm, left = x->up_len - x->up_off;
    if (n > left)
        n = left;
    memcpy(p, x->up + x->up_off, n);
    x->up_off += n;
    return n;
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    xfer *x = ud;
    return x->abort && atomic_load(x->abort) ? 1 : 0;
}

/* Every connection libcurl opens, redirects included, comes here with the
 * resolved address: the one place a check cannot be raced by DNS. */
static curl_socket_t on_open(void *ud, curlsocktype purpose, struct curl_sockaddr *sa)
{
    xfer *x = ud;
    uint8_t a[16];
    int family = sa->family;
    if (family == AF_INET) {
        memcpy(a, &((const struct sockaddr_in *)&sa->addr)->sin_addr, 4);
    } else if (family == AF_INET6) {
        memcpy(a, &((const struct sockaddr_in6 *)&sa->addr)->sin6_addr, 16);
        static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(a, mapped, 12) == 0) { /* ::ffff:a.b.c.d is a.b.c.d */
            memmove(a, a + 12, 4);
            family = AF_INET;
        }
    } else {
        x->blocked = 1;
        return CURL_SOCKET_BAD;
    }
    addr_arg arg = {family, a};
    if (x->confined && address_blocked(family, a) && !any_entry(x->allow, entry_has_addr, &arg)) {
        x->blocked = 1;
        return CURL_SOCKET_BAD;
    }
    return socket(sa->family, sa->socktype, sa->protocol);
}

int sf_ckpt_url_transfer(const char *url, int confined, int fd, uint64_t max, const uint8_t *upload,
                         size_t up_len, atomic_int *abort_flag, uint64_t *got, sf_ckpt_error *e)
{
    sf_config *c = malloc(sizeof *c);
    CURL *h = curl_easy_init();
    if (!c || !h) {
        free(c);
        curl_easy_cleanup(h);
        fail(e, 503, "out_of_memory", NULL, "cannot start a transfer");
        return -1;
    }
    sf_config_get(c);
    xfer x = {.abort = abort_flag, .fd = fd, .confined = confined, .max = max, .up = upload, .up_len = up_len};
    snprintf(x.allow, sizeof x.allow, "%s", c->checkpoint.url_allow);
    const char *verb = upload ? "PUT" : "GET";
    char shown[512], cur[URL_MAX], first_origin[300] = "", origin[300];
    sf_url_redact(url, shown, sizeof shown);
    snprintf(cur, sizeof cur, "%s", url);
    origin_of(url, first_origin, sizeof first_origin);
    char errbuf[CURL_ERROR_SIZE] = "";
    struct curl_slist *hdrs = NULL;
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    /* Redirects are followed below, each checked like the first URL. */
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_PROXY, ""); /* no proxy from the environment: it would hide the address */
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, (long)c->checkpoint.url_timeout_s);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT,
                     (long)(c->checkpoint.url_timeout_s < 30 ? c->checkpoint.url_timeout_s : 30));
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "streamfeed-checkpoint");
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, &x);
    curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, on_open);
    curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, &x);
    if (upload) {
        hdrs = curl_slist_append(hdrs, "Content-Type: application/vnd.safetensors");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_send);
        curl_easy_setopt(h, CURLOPT_READDATA, &x);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)up_len);
    } else {
        /* An announced length over the bound fails before a byte is stored. */
        curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_recv);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
    }
    CURLcode rc = CURLE_OK;
    long code = 0;
    int result = -1;
    for (int hop = 0;; hop++) {
        x.len = 0;
        x.up_off = 0;
        if (!upload && ftruncate(fd, 0) != 0) {
            fail(e, 500, "checkpoint_read_failed", NULL, "cannot reset the download file: %s", strerror(errno));
            goto out;
        }
        curl_easy_setopt(h, CURLOPT_URL, cur);
        /* The bearer token goes to the first URL's origin only: never to a
         * redirect's other host, nor to another port or scheme of the same
         * host (another service there, or plain http after https). */
        int same_origin = first_origin[0] && origin_of(cur, origin, sizeof origin) == 0 &&
                          strcmp(origin, first_origin) == 0;
        if (c->checkpoint.url_token[0] && same_origin) {
            curl_easy_setopt(h, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
            curl_easy_setopt(h, CURLOPT_XOAUTH2_BEARER, c->checkpoint.url_token);
        } else {
            curl_easy_setopt(h, CURLOPT_XOAUTH2_BEARER, NULL);
            curl_easy_setopt(h, CURLOPT_HTTPAUTH, CURLAUTH_NONE);
        }
        rc = curl_easy_perform(h);
        code = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
        char *next = NULL;
        if (rc != CURLE_OK || code < 300 || code > 399 || upload)
            break;
        curl_easy_getinfo(h, CURLINFO_REDIRECT_URL, &next);
        if (!next)
            break;
        if (hop == MAX_REDIRECTS) {
            fail(e, 422, "url_fetch_failed", "url", "GET %s: more than %d redirects", shown, MAX_REDIRECTS);
            goto out;
        }
        if (confined ? sf_ckpt_url_check(next, 0, e) != 0 : !sf_ckpt_url_scheme_ok(next)) {
            if (!confined)
                fail(e, 400, "url_scheme_not_allowed", "url", "only http:// and https:// URLs are followed");
            char why[sizeof e->msg];
            snprintf(why, sizeof why, "%s", e->msg);
            char msg[sizeof e->msg + 256];
            snprintf(msg, sizeof msg, "GET %.200s redirects where the service may not go: %s", shown, why);
            size_t n = strnlen(msg, sizeof e->msg - 1);
            memcpy(e->msg, msg, n);
            e->msg[n] = '\0';
            if (e->status == 400) { /* another scheme: the url given was fine, its fetch failed */
                e->status = 422;
                snprintf(e->code, sizeof e->code, "url_fetch_failed");
            }
            goto out;
        }
        snprintf(cur, sizeof cur, "%s", next);
    }
    if (rc == CURLE_OK && (code < 200 || code > 299)) {
        fail(e, 422, "url_fetch_failed", "url", "%s %s: the server answered %ld", verb, shown, code);
    } else if (rc == CURLE_OK) {
        if (got)
            *got = x.len;
        result = 0;
    } else if (x.blocked) {
        fail(e, 403, "url_not_allowed", "url",
             "%s %s: its address is loopback, link-local (cloud metadata) or multicast; list the "
             "address in checkpoint.url_allow to allow it", verb, shown);
    } else if (x.too_large || rc == CURLE_FILESIZE_EXCEEDED) {
        fail(e, 413, "checkpoint_too_large", "url",
             "GET %s: larger than the largest checkpoint accepted (%llu bytes: this model's whole "
             "state, or checkpoint.max_bytes if smaller)", shown, (unsigned long long)max);
    } else if (rc == CURLE_ABORTED_BY_CALLBACK) {
        fail(e, 503, "shutting_down", "url", "%s %s: cut short, the service is shutting down", verb, shown);
    } else if (x.write_failed) {
        fail(e, 500, "checkpoint_read_failed", NULL, "GET %s: cannot store the download: %s", shown,
             strerror(x.write_failed));
    } else {
        /* One sentence for every other failure: refused, reset, timed out or
         * not HTTP look alike to the caller, so the service is no port
         * scanner. The operator's log has the cause. */
        SF_WARN("checkpoint: %s %s failed: %s", verb, shown, errbuf[0] ? errbuf : curl_easy_strerror(rc));
        fail(e, 422, "url_fetch_failed", "url", "%s %s: the transfer failed", verb, shown);
    }
out:
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    free(c);
    return result;
}
