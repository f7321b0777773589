/* gpu/batch_check.h — the one validation of a batch against its augmentation
 * plan and the built model, so that the CPU and CUDA backends refuse exactly
 * the same batches with the same messages (implemented in gpu/common.c). */
#ifndef SF_GPU_BATCH_CHECK_H
#define SF_GPU_BATCH_CHECK_H

#include <stddef.h>

#include "gpu/backend.h"
#include "gpu/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checks b against its plan and, when m is not NULL, against the model built
 * for at most max_batch samples (shape, batch size, labels). who prefixes the
 * message ("cuda", "ref"). 0 when the batch can run, else -1 with err. */
int sf_batch_check(const sf_batch *b, const sf_model *m, int max_batch, const char *who, char *err,
                   size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
