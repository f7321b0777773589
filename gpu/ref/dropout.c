/* gpu/ref/dropout.c — reference dropout (elementwise), channel dropout
 * (nn.Dropout2d: whole channels of a sample) and stochastic depth
 * (torchvision.ops.stochastic_depth, mode "row": the whole sample), in float
 * and double (_f64), and their hooks. Contracts in gpu/ref/layers.h.
 *
 * The keep/drop decisions are a pure function of the run's seed (mixed with
 * the rank in a data-parallel job), the batch's sequence number, the layer
 * index and the sample (and element) index
 * (gpu/rng.h), so a run is reproducible and the backward draws the very mask
 * the forward used without storing it: the backward of either kind is its
 * forward applied to dy. Evaluation and frozen layers pass x through. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>
#include <string.h>

#include "gpu/rng.h"

#define SF_REF_SELF "dropout.c"
#include "gpu/ref/generic.h"

/* ---- the dropout and stochastic_depth layers' hooks (gpu/layers.c) -------- */

static void mask_apply(const sf_ref_io *io, const float *in, float *out)
{
    const sf_layer *L = io->L;
    if (L->kind == SF_L_DROPOUT)
        sf_ref_dropout_fwd(in, io->n, L->out_elems, L->p, io->seed, io->seq, (uint64_t)io->li, out);
    else if (L->kind == SF_L_DROPOUT2D)
        sf_ref_dropout2d_fwd(in, io->n, L->out_ch, (size_t)L->out_h * L->out_w, L->p, io->seed, io->seq,
                             (uint64_t)io->li, out);
    else
        sf_ref_stochastic_depth_fwd(in, io->n, L->out_elems, L->p, io->seed, io->seq, (uint64_t)io->li, out);
}

void sf_ref_layer_dropout_fwd(const sf_ref_io *io)
{
    if (!io->train || io->L->frozen)
        memcpy(io->y, io->x[0], sizeof(float) * (size_t)io->n * io->L->out_elems);
    else
        mask_apply(io, io->x[0], io->y);
}

void sf_ref_layer_dropout_bwd(const sf_ref_io *io)
{
    if (!io->want[0])
        return;
    mask_apply(io, io->dy, io->scratch);
    io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* Element e of sample i is kept when sf_u01(hash(seed, seq, layer, i*elems + e)) >= p,
 * and then scaled by 1/(1-p); p = 1 drops everything (as PyTorch). */
void SF_FN(sf_ref_dropout_fwd)(const T *x, int n, size_t elems, float p, uint64_t seed, uint64_t seq,
                               uint64_t layer, T *y)
{
    const T scale = p < 1.0f ? (T)1 / ((T)1 - (T)p) : (T)0;
    for (size_t e = 0; e < (size_t)n * elems; e++)
        y[e] = sf_u01(sf_hash4(seed ^ SF_REF_DROPOUT_SALT, seq, layer, e)) >= p ? x[e] * scale : (T)0;
}

/* Channel ch of sample i is kept whole when
 * sf_u01(hash(seed, seq, layer, i*c + ch)) >= p, then scaled by 1/(1-p). */
void SF_FN(sf_ref_dropout2d_fwd)(const T *x, int n, int c, size_t hw, float p, uint64_t seed, uint64_t seq,
                                 uint64_t layer, T *y)
{
    const T scale = p < 1.0f ? (T)1 / ((T)1 - (T)p) : (T)0;
    for (size_t u = 0; u < (size_t)n * c; u++) {
        const int keep = sf_u01(sf_hash4(seed ^ SF_REF_DROPOUT2D_SALT, seq, layer, (uint64_t)u)) >= p;
        for (size_t e = 0; e < hw; e++)
            y[u * hw + e] = keep ? x[u * hw + e] * scale : (T)0;
    }
}

/* Sample i is kept whole when sf_u01(hash(seed, seq, layer, i)) >= p, then scaled by 1/(1-p). */
void SF_FN(sf_ref_stochastic_depth_fwd)(const T *x, int n, size_t elems, float p, uint64_t seed, uint64_t seq,
                                        uint64_t layer, T *y)
{
    const T scale = p < 1.0f ? (T)1 / ((T)1 - (T)p) : (T)0;
    for (int i = 0; i < n; i++) {
        const int keep = sf_u01(sf_hash4(seed ^ SF_REF_DEPTH_SALT, seq, layer, (uint64_t)i)) >= p;
        for (size_t e = 0; e < elems; e++)
            y[(size_t)i * elems + e] = keep ? x[(size_t)i * elems + e] * scale : (T)0;
    }
}

#endif
