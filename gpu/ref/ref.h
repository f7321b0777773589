/* gpu/ref/ref.h — the CPU reference of every op and layer.
 *
 * Plain, readable loops: this is the oracle the CUDA backend is tested against
 * (DESIGN.md §8) and the backend of machines without a GPU. No cleverness, no
 * threads, no intrinsics. Every function is pure: it reads its inputs and
 * overwrites its outputs (gradients are written, not accumulated), so a test
 * can poison an output and see that every element was produced.
 *
 * Layouts: activations NCHW float; conv weights [oc, c, k, k]; linear weights
 * [out, in] (PyTorch's layouts). Layers exist in float (the backend) and in
 * double (suffix _f64; the finite-difference tests), generated from one source
 * so the two cannot drift.
 *
 * One header per family, all included here: bf16.h (bfloat16 rounding),
 * input.h (JPEG decode, augmentation), layers.h, loss.h, optimizer.h.
 */
#ifndef SF_GPU_REF_H
#define SF_GPU_REF_H

#include "gpu/ref/bf16.h"
#include "gpu/ref/input.h"
#include "gpu/ref/layers.h"
#include "gpu/ref/loss.h"
#include "gpu/ref/optimizer.h"

#endif
