/* gpu/common.h — small helpers shared by both backends and the plain-data
 * modules of gpu/: one error formatter, and the one validation of a batch
 * against its augmentation plan and the built model, so the CPU and CUDA
 * backends refuse exactly the same batches with the same messages. */
#ifndef SF_GPU_COMMON_H
#define SF_GPU_COMMON_H

#include <stddef.h>

#include "gpu/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* snprintf into err when err is not NULL. */
void sf_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Checks b against its plan and, when m is not NULL, against the model built
 * for at most max_batch samples (shape, batch size, labels). who prefixes the
 * message ("cuda", "ref"). 0 when the batch can run, else -1 with err. */
int sf_batch_check(const sf_batch *b, const sf_model *m, int max_batch, const char *who, char *err,
                   size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
