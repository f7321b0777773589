/* gpu/common.h — small helpers shared by both backends and the plain-data
 * modules of gpu/: one error formatter, the one validation of a batch
 * against its augmentation plan and the built model, so the CPU and CUDA
 * backends refuse exactly the same batches with the same messages, and the
 * one byte hash (the reference's parameter digest, and the server's
 * fingerprints of a configuration or a model). */
#ifndef SF_GPU_COMMON_H
#define SF_GPU_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gpu/backend.h"

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

/* Checks b against its plan and, when m is not NULL, against the model built
 * for at most max_batch samples (shape, batch size, labels). who prefixes the
 * message ("cuda", "ref"). 0 when the batch can run, else -1 with err. */
int sf_batch_check(const sf_batch *b, const sf_model *m, int max_batch, const char *who, char *err,
                   size_t errlen);

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
