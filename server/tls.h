/* server/tls.h — the HTTPS certificate of the main listener, replaceable while
 * the server runs.
 *
 * libmicrohttpd (built with GnuTLS) asks for the certificate at every TLS
 * handshake through a GnuTLS retrieve callback (MHD_OPTION_HTTPS_CERT_CALLBACK);
 * this module answers with the pair loaded last. A reload reads both files,
 * checks that the key belongs to the certificate, and swaps the pair in for
 * the next handshakes; a pair that does not load leaves the current one in
 * place. Connections already established keep the certificate they shook
 * hands with: each holds a reference to its pair until it closes, and a pair
 * replaced by a reload is freed when its last connection is gone.
 *
 * One certificate per process: the callback has no context argument, so the
 * module keeps its state in one static. Threads: sf_tls_reload and
 * sf_tls_check_files from any thread (main's signal loop); the callback runs
 * on the HTTP threads.
 */
#ifndef SF_TLS_H
#define SF_TLS_H

#include <stddef.h>

/* 0 when prio is a GnuTLS priority string GnuTLS accepts, else -1 with err
 * naming the option (what) and where the string went wrong. */
int sf_tls_priorities_check(const char *prio, const char *what, char *err, size_t errlen);

/* 0 when libmicrohttpd can serve HTTPS with a certificate callback, else -1
 * with the reason. */
int sf_tls_supported(char *err, size_t errlen);
/* Loads the pair. 0, or -1 with err naming the file and what is wrong. */
int sf_tls_init(const char *cert_path, const char *key_path, char *err, size_t errlen);
/* The value of MHD_OPTION_HTTPS_CERT_CALLBACK (a gnutls_certificate_retrieve_function2). */
void *sf_tls_callback(void);
/* Reads the files again. 1 when a new pair is in use, 0 when the files did not
 * change (force=0 only), -1 with err when they do not load (the current pair
 * stays). force=0 reloads only when a file's identity (inode, size, mtime)
 * changed since the last attempt, so a bad file is reported once. */
int sf_tls_reload(int force, char *err, size_t errlen);
/* Frees the current pair (after the daemon has stopped: every connection has
 * released its own). */
void sf_tls_shutdown(void);

/* A certificate pair, counted (tls.c). */
typedef struct sf_tls_pair sf_tls_pair;
/* Called on the connection's thread during a handshake with the GnuTLS
 * session (a gnutls_session_t) and a reference to the pair it was given; the
 * holder gives it back with sf_tls_pair_release once the session is freed. */
typedef void (*sf_tls_hold_fn)(void *session, sf_tls_pair *pair);
void sf_tls_set_hold(sf_tls_hold_fn hold);
void sf_tls_pair_release(sf_tls_pair *pair);

#endif
