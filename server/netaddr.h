/* server/netaddr.h — the listening address: http.host as a socket address.
 *
 * http.host may be an IPv4 literal (0.0.0.0), an IPv6 literal with or without
 * brackets (::, [::1]) or a host name (localhost). The config check resolves
 * it before anything else starts, so a wrong host fails the start with a
 * clear message instead of after the backend initialised; the HTTP module
 * resolves it again to bind.
 */
#ifndef SF_NETADDR_H
#define SF_NETADDR_H

#include <stddef.h>
#include <sys/socket.h>

/* Fills *out (and *outlen) with the first address of host for a TCP listener
 * on port. Returns 0, or -1 with a message in err. Literals never query DNS. */
int sf_netaddr_resolve(const char *host, int port, struct sockaddr_storage *out,
                       socklen_t *outlen, char *err, size_t errlen);

/* host as it appears in a URL: IPv6 literals in brackets, others unchanged. */
void sf_netaddr_url_host(const char *host, char *out, size_t cap);

#endif
