/* server/checkpoint_url.h — checkpoint transfers over http(s) with libcurl:
 * a GET into memory for loads and model.init_from, a PUT of a file in memory
 * for saves. One blocking transfer per call, bounded by checkpoint.max_bytes
 * and checkpoint.url_timeout_s; run it on the checkpoint I/O thread or on
 * main's at start-up, never on the engine's or an HTTP thread.
 */
#ifndef SF_CHECKPOINT_URL_H
#define SF_CHECKPOINT_URL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "server/checkpoint.h"

/* "scheme://..." (anything else is a path). */
int sf_ckpt_is_url(const char *s);
/* http:// or https://, the only schemes accepted. */
int sf_ckpt_url_scheme_ok(const char *s);
/* The URL without its query and fragment, for messages and logs (a signed
 * URL carries its credentials there). */
void sf_ckpt_url_redact(const char *url, char *out, size_t cap);

typedef struct sf_ckpt_xfer {
    atomic_int *abort;           /* set: the transfer stops (shutdown) */
    uint8_t *buf;                /* GET: the body (malloc), len bytes */
    size_t len, cap, max;
    int too_large;
    const uint8_t *up;           /* PUT: the file */
    size_t up_len, up_off;
} sf_ckpt_xfer;

/* GET url into x->buf (upload NULL) or PUT upload (up_len bytes). abort_flag
 * (may be NULL) cuts the transfer short when set. 0, or -1 with e (x->buf
 * then NULL). */
int sf_ckpt_url_transfer(const char *url, const uint8_t *upload, size_t up_len, atomic_int *abort_flag,
                         sf_ckpt_xfer *x, sf_ckpt_error *e);

#endif
