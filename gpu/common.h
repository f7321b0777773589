/* gpu/common.h — small helpers shared by both backends, the plain-data
 * modules of gpu/ and the server: one error formatter, one bounded string
 * copy, and the one byte hash (the reference's parameter digest, and the
 * server's fingerprints of a configuration or a model). It depends on
 * nothing of the project, so a module that wants a helper does not pull in
 * the backend's contract; the batch check both backends share is in
 * gpu/batch_check.h. */
#ifndef SF_GPU_COMMON_H
#define SF_GPU_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* snprintf into err when err is not NULL. */
void sf_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Copies s into d of n bytes (n > 0), cut to fit and always terminated. */
static inline void sf_scopy(char *d, size_t n, const char *s)
{
    size_t l = strlen(s);
    if (l >= n)
        l = n - 1;
    memcpy(d, s, l);
    d[l] = '\0';
}

/* FNV-1a's step over n bytes from h. Every hash of the project starts from
 * SF_HASH_SEED, not FNV's published offset basis (its last digit is
 * missing): checkpoint files keep configuration hashes made with it, so it
 * stays. */
#define SF_HASH_SEED 1469598103934665603ull
uint64_t sf_hash_bytes(uint64_t h, const void *p, size_t n);

#ifdef __cplusplus
}
#endif

#endif
