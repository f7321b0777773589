/* server/tls.c — see tls.h. */
#include "server/tls.h"

#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_CHAIN 16

/* GnuTLS keeps pointers into the pair a session shook hands with for as long
 * as the session lives, so a pair is counted: one reference while it is the
 * current one, and one for each connection that shook hands with it (taken
 * in the retrieve callback, handed to the connection by g.hold, given back
 * by sf_tls_pair_release once libmicrohttpd has freed the session). The last
 * release frees it. */
struct sf_tls_pair {
    gnutls_pcert_st chain[MAX_CHAIN];
    unsigned n;
    gnutls_privkey_t key;
    unsigned refs; /* under g.mu */
};
typedef struct sf_tls_pair tls_pair;

/* What a file was when it was last read: a reload happens when it changes. */
typedef struct file_id {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    int ok;
} file_id;

static struct {
    pthread_mutex_t mu;
    char cert_path[1024], key_path[1024];
    tls_pair *cur;
    sf_tls_hold_fn hold;
    file_id cert_id, key_id;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

int sf_tls_supported(char *err, size_t errlen)
{
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        snprintf(err, errlen, "this libmicrohttpd was built without TLS (GnuTLS)");
        return -1;
    }
    if (MHD_is_feature_supported(MHD_FEATURE_HTTPS_CERT_CALLBACK) != MHD_YES) {
        snprintf(err, errlen, "this libmicrohttpd cannot take a certificate callback (GnuTLS < 3)");
        return -1;
    }
    return 0;
}

int sf_tls_priorities_check(const char *prio, const char *what, char *err, size_t errlen)
{
    gnutls_priority_t pc;
    const char *at = NULL;
    int rc = gnutls_priority_init(&pc, prio, &at);
    if (rc < 0) {
        snprintf(err, errlen, "%s: GnuTLS does not take \"%.200s\" (%s%s%.40s)", what, prio,
                 gnutls_strerror(rc), at ? " at: " : "", at ? at : "");
        return -1;
    }
    gnutls_priority_deinit(pc);
    return 0;
}

static void pair_free(tls_pair *p)
{
    if (!p)
        return;
    for (unsigned i = 0; i < p->n; i++)
        gnutls_pcert_deinit(&p->chain[i]);
    if (p->key)
        gnutls_privkey_deinit(p->key);
    free(p);
}

static void file_id_of(const char *path, file_id *id)
{
    struct stat st;
    memset(id, 0, sizeof *id);
    if (stat(path, &st) != 0)
        return;
    id->dev = st.st_dev;
    id->ino = st.st_ino;
    id->size = st.st_size;
    id->mtime = st.st_mtim;
    id->ok = 1;
}

static int file_id_same(const file_id *a, const file_id *b)
{
    return a->ok == b->ok && a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}

/* The public key of the certificate and the one derived from the private key,
 * compared as DER: a key that is not the certificate's fails every handshake,
 * so it is refused at load time instead. */
static int key_matches(tls_pair *p, char *err, size_t errlen)
{
    gnutls_pubkey_t from_key = NULL;
    gnutls_datum_t a = {0}, b = {0};
    int ok = gnutls_pubkey_init(&from_key) == 0 &&
             gnutls_pubkey_import_privkey(from_key, p->key, 0, 0) == 0 &&
             gnutls_pubkey_export2(from_key, GNUTLS_X509_FMT_DER, &a) == 0 &&
             gnutls_pubkey_export2(p->chain[0].pubkey, GNUTLS_X509_FMT_DER, &b) == 0 &&
             a.size == b.size && memcmp(a.data, b.data, a.size) == 0;
    gnutls_free(a.data);
    gnutls_free(b.data);
    if (from_key)
        gnutls_pubkey_deinit(from_key);
    if (!ok)
        snprintf(err, errlen, "http.tls_key %s is not the private key of the certificate in %s",
                 g.key_path, g.cert_path);
    return ok ? 0 : -1;
}

static tls_pair *pair_load(const char *cert_path, const char *key_path, char *err, size_t errlen)
{
    tls_pair *p = calloc(1, sizeof *p);
    gnutls_datum_t cd = {0}, kd = {0};
    int rc;
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if ((rc = gnutls_load_file(cert_path, &cd)) < 0) {
        snprintf(err, errlen, "http.tls_cert %s: cannot read it (%s)", cert_path, gnutls_strerror(rc));
        goto fail;
    }
    if ((rc = gnutls_load_file(key_path, &kd)) < 0) {
        snprintf(err, errlen, "http.tls_key %s: cannot read it (%s)", key_path, gnutls_strerror(rc));
        goto fail;
    }
    p->n = MAX_CHAIN;
    if ((rc = gnutls_pcert_list_import_x509_raw(p->chain, &p->n, &cd, GNUTLS_X509_FMT_PEM,
                                                GNUTLS_X509_CRT_LIST_SORT)) < 0 ||
        p->n == 0) {
        p->n = 0;
        snprintf(err, errlen, "http.tls_cert %s: not a PEM certificate chain of at most %d "
                 "certificates (%s)", cert_path, MAX_CHAIN,
                 rc < 0 ? gnutls_strerror(rc) : "no certificate");
        goto fail;
    }
    if ((rc = gnutls_privkey_init(&p->key)) < 0 ||
        (rc = gnutls_privkey_import_x509_raw(p->key, &kd, GNUTLS_X509_FMT_PEM, NULL, 0)) < 0) {
        snprintf(err, errlen, "http.tls_key %s: not an unencrypted PEM private key (%s)", key_path,
                 gnutls_strerror(rc));
        goto fail;
    }
    if (key_matches(p, err, errlen))
        goto fail;
    gnutls_free(cd.data);
    memset(kd.data, 0, kd.size);
    gnutls_free(kd.data);
    return p;
fail:
    gnutls_free(cd.data);
    if (kd.data) {
        memset(kd.data, 0, kd.size);
        gnutls_free(kd.data);
    }
    pair_free(p);
    return NULL;
}

/* Drops one reference; the last frees the pair. */
static void unref_locked(tls_pair *p)
{
    if (p && --p->refs == 0)
        pair_free(p);
}

void sf_tls_pair_release(sf_tls_pair *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&g.mu);
    unref_locked(p);
    pthread_mutex_unlock(&g.mu);
}

void sf_tls_set_hold(sf_tls_hold_fn hold) { g.hold = hold; }

static int retrieve(gnutls_session_t session, const gnutls_datum_t *req_ca_dn, int nreqs,
                    const gnutls_pk_algorithm_t *pk_algos, int pk_algos_length,
                    gnutls_pcert_st **pcert, unsigned int *pcert_length, gnutls_privkey_t *privkey)
{
    (void)req_ca_dn, (void)nreqs, (void)pk_algos, (void)pk_algos_length;
    pthread_mutex_lock(&g.mu);
    tls_pair *p = g.cur;
    if (p)
        p->refs++;
    pthread_mutex_unlock(&g.mu);
    if (!p)
        return -1;
    /* Without a holder the reference is never given back: the pair then
     * lives until exit, which is safe. */
    if (g.hold)
        g.hold(session, p);
    *pcert = p->chain;
    *pcert_length = p->n;
    *privkey = p->key;
    return 0;
}

void *sf_tls_callback(void) { return (void *)&retrieve; }

int sf_tls_init(const char *cert_path, const char *key_path, char *err, size_t errlen)
{
    if (sf_tls_supported(err, errlen))
        return -1;
    snprintf(g.cert_path, sizeof g.cert_path, "%s", cert_path);
    snprintf(g.key_path, sizeof g.key_path, "%s", key_path);
    file_id_of(cert_path, &g.cert_id);
    file_id_of(key_path, &g.key_id);
    tls_pair *p = pair_load(cert_path, key_path, err, errlen);
    if (!p)
        return -1;
    p->refs = 1;
    pthread_mutex_lock(&g.mu);
    g.cur = p;
    pthread_mutex_unlock(&g.mu);
    return 0;
}

int sf_tls_reload(int force, char *err, size_t errlen)
{
    if (!g.cert_path[0])
        return 0;
    file_id c, k;
    file_id_of(g.cert_path, &c);
    file_id_of(g.key_path, &k);
    if (!force && file_id_same(&c, &g.cert_id) && file_id_same(&k, &g.key_id))
        return 0;
    /* Remember what was tried, good or bad: a broken file is reported once,
     * and again only when it changes. */
    g.cert_id = c;
    g.key_id = k;
    tls_pair *p = pair_load(g.cert_path, g.key_path, err, errlen);
    if (!p)
        return -1;
    p->refs = 1;
    pthread_mutex_lock(&g.mu);
    tls_pair *old = g.cur;
    g.cur = p;
    unref_locked(old); /* freed now, or when its last connection closes */
    pthread_mutex_unlock(&g.mu);
    return 1;
}

void sf_tls_shutdown(void)
{
    pthread_mutex_lock(&g.mu);
    unref_locked(g.cur);
    g.cur = NULL;
    pthread_mutex_unlock(&g.mu);
}
