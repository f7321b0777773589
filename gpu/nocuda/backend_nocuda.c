/* gpu/nocuda/backend_nocuda.c — the CUDA constructor of a build without nvcc
 * (the Makefile compiles this file only when CUDA=0). */
#include "../backend.h"

#include <stdio.h>

sf_backend *sf_backend_cuda_new(int device, char *err, size_t errlen)
{
    (void)device;
    if (err && errlen)
        snprintf(err, errlen, "built without CUDA (no nvcc at build time); use the ref backend");
    return NULL;
}
