/* gpu/memory_plan.c — see memory_plan.h. */
#include "gpu/memory_plan.h"

#include <stdlib.h>

static int larger_first(const void *a, const void *b)
{
    const sf_plan_tensor *x = *(const sf_plan_tensor *const *)a, *y = *(const sf_plan_tensor *const *)b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : 0;
}

size_t sf_plan_place(sf_plan_tensor **t, int n)
{
    if (n <= 0)
        return 0; /* qsort's array may not be NULL, even for no elements */
    qsort(t, (size_t)n, sizeof *t, larger_first);
    size_t top = 0;
    for (int k = 0; k < n; k++) {
        sf_plan_tensor *o = t[k];
        size_t off = 0;
        /* Move past every placed neighbour in time that it collides with,
         * until a pass finds no collision. */
        for (int again = 1; again;) {
            again = 0;
            for (int j = 0; j < k; j++) {
                const sf_plan_tensor *p = t[j];
                if (p->t1 < o->t0 || o->t1 < p->t0)
                    continue; /* lifetimes apart */
                if (off < p->off + p->bytes && p->off < off + o->bytes) {
                    off = (p->off + p->bytes + SF_PLAN_ALIGN - 1) & ~(size_t)(SF_PLAN_ALIGN - 1);
                    again = 1;
                }
            }
        }
        o->off = off;
        if (off + o->bytes > top)
            top = off + o->bytes;
    }
    return top;
}
