/* gpu/nocuda/backend_nocuda.c — the CUDA constructor of a build without nvcc
 * (the Makefile compiles this file only when CUDA=0, given or for want of nvcc). */
#include "gpu/backend.h"

#include <stdio.h>

#ifndef SF_NOCUDA_REASON
#define SF_NOCUDA_REASON "no nvcc at build time"
#endif

sf_backend *sf_backend_cuda_new(int device, char *err, size_t errlen)
{
    (void)device;
    if (err && errlen)
        snprintf(err, errlen, "built without CUDA (%s); use the ref backend", SF_NOCUDA_REASON);
    return NULL;
}
