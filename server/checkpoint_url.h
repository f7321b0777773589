/* server/checkpoint_url.h — checkpoint transfers over http(s) with libcurl:
 * a GET into a file for loads and model.init_from, a PUT of a file in memory
 * for saves. One blocking transfer per call, bounded in bytes and by
 * checkpoint.url_timeout_s; run it on the checkpoint URL thread or on main's
 * at start-up, never on the engine's or an HTTP thread.
 *
 * Where a request may send the service (the server-side request forgery
 * rules). A URL from a request is taken only when the service requires auth
 * (http.token set) or checkpoint.url_allow lists hosts. When url_allow is not
 * empty the URL's host must be listed: a name ("models.example.com"), a
 * domain (".example.com" or "*.example.com"), an address or network
 * ("10.1.2.3", "10.0.0.0/8", "::1") or a URL prefix ("https://h/ckpt/").
 * Whatever the list says about names, the service never connects to a
 * loopback, unspecified, link-local (cloud metadata: 169.254.169.254,
 * fd00:ec2::254) or multicast address unless url_allow lists that address or
 * a network holding it. The address is checked on the socket libcurl is about
 * to connect (CURLOPT_OPENSOCKETFUNCTION), after name resolution, so DNS
 * rebinding cannot pass a name check and then connect elsewhere. Redirects are
 * followed here, not by libcurl, each one checked against the same rules (and
 * the bearer token sent to the first host only). Proxies from the environment
 * are not used. Messages name the URL without user:password@, query or
 * fragment, never echo bytes or lengths of what was fetched, and a failed
 * connection reads "the transfer failed" whatever the cause (an open port and
 * a closed one look the same); the cause goes to the log.
 */
#ifndef SF_CHECKPOINT_URL_H
#define SF_CHECKPOINT_URL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "server/checkpoint_format.h"

/* "scheme://..." (anything else is a path). */
int sf_ckpt_is_url(const char *s);
/* http:// or https://, the only schemes accepted. */
int sf_ckpt_url_scheme_ok(const char *s);
/* The rules above for a URL a request gave (from_request: the auth rule
 * applies too); 0, or -1 with e (400 url_invalid / url_scheme_not_allowed,
 * 403 url_not_allowed). */
int sf_ckpt_url_check(const char *url, int from_request, sf_ckpt_error *e);

/* GET url into fd (upload NULL; at most max bytes, written from offset 0) or
 * PUT upload (up_len bytes). confined 1: the address and redirect rules above
 * apply (every URL from a request); 0: the operator's own model.init_from.
 * abort_flag (may be NULL) cuts the transfer short when set. *got: the bytes
 * received (GET). 0, or -1 with e. */
int sf_ckpt_url_transfer(const char *url, int confined, int fd, uint64_t max, const uint8_t *upload,
                         size_t up_len, atomic_int *abort_flag, uint64_t *got, sf_ckpt_error *e);

#endif
