/* server/netaddr.c — see netaddr.h. */
#include "server/netaddr.h"

#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

/* host without the brackets of "[::1]", into buf. */
static const char *unbracket(const char *host, char *buf, size_t cap)
{
    size_t n = strlen(host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']' && n - 2 < cap) {
        memcpy(buf, host + 1, n - 2);
        buf[n - 2] = '\0';
        return buf;
    }
    return host;
}

int sf_netaddr_resolve(const char *host, int port, struct sockaddr_storage *out,
                       socklen_t *outlen, char *err, size_t errlen)
{
    char buf[256], svc[16];
    const char *h = unbracket(host, buf, sizeof buf);
    if (!h[0]) {
        snprintf(err, errlen, "empty host");
        return -1;
    }
    snprintf(svc, sizeof svc, "%d", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV | AI_NUMERICHOST;
    int rc = getaddrinfo(h, svc, &hints, &res);
    if (rc == EAI_NONAME) {
        /* Not a literal: a host name. AI_ADDRCONFIG keeps to the families
         * this machine has an address of (no IPv6 answer on an IPv4-only host). */
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV | AI_ADDRCONFIG;
        rc = getaddrinfo(h, svc, &hints, &res);
    }
    if (rc != 0 || !res) {
        snprintf(err, errlen, "\"%s\" is not an IP address or a resolvable host name (%s)", host,
                 rc ? gai_strerror(rc) : "no address");
        if (res)
            freeaddrinfo(res);
        return -1;
    }
    memcpy(out, res->ai_addr, res->ai_addrlen);
    *outlen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

void sf_netaddr_url_host(const char *host, char *out, size_t cap)
{
    if (host[0] != '[' && strchr(host, ':'))
        snprintf(out, cap, "[%s]", host);
    else
        snprintf(out, cap, "%s", host);
}
