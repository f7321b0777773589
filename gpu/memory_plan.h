/* gpu/memory_plan.h — placing tensors with known lifetimes in one arena.
 *
 * A tensor lives from slot t0 to slot t1 of a timeline, both included (the
 * executor's slots are the layers' forward and backward passes, DESIGN.md
 * §12). Two tensors may share bytes only when their lifetimes do not overlap.
 * sf_plan_place puts the largest first, each at the lowest 256-byte-aligned
 * offset that overlaps no placed tensor of an overlapping lifetime (greedy;
 * not optimal, and cheap: n^2 comparisons per pass for a few hundred tensors).
 *
 * Plain C, no device: the CUDA executor uses it and the unit tests check it.
 */
#ifndef SF_GPU_MEMORY_PLAN_H
#define SF_GPU_MEMORY_PLAN_H

#include <stddef.h>

#define SF_PLAN_ALIGN 256

typedef struct sf_plan_tensor {
    size_t bytes;  /* a multiple of SF_PLAN_ALIGN keeps every offset aligned */
    int t0, t1;    /* first and last slot, inclusive */
    size_t off;    /* out: its offset in the arena */
} sf_plan_tensor;

/* Places the n tensors t[0..n) points at (the array of pointers is reordered,
 * the tensors are not moved) and returns the arena's size in bytes. */
size_t sf_plan_place(sf_plan_tensor **t, int n);

#endif
