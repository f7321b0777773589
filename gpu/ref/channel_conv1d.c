/* gpu/ref/channel_conv1d.c — reference one-channel 1-D convolution across a
 * sample's channels (ECA's Conv1d(1, 1, k) on x.mean((2, 3)).view(n, 1, -1)),
 * forward and backward in float and double (_f64), and the channel_conv1d
 * layer's hooks. Contracts in gpu/ref/layers.h. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#define SF_REF_SELF "channel_conv1d.c"
#include "gpu/ref/generic.h"

/* ---- the channel_conv1d layer's hooks (gpu/layers.c) ------------------------ */

/* The input is a [C,1,1] map or [C] features: out_ch values per sample. */
void sf_ref_layer_channel_conv1d_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_channel_conv1d_fwd(io->x[0], io->n, L->out_ch, io->w, io->b, L->k, L->pad, io->y);
}

void sf_ref_layer_channel_conv1d_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_channel_conv1d_bwd(io->x[0], io->n, L->out_ch, io->w, L->k, L->pad, io->dy,
                              io->want[0] ? io->scratch : NULL, io->dw, io->db);
    if (io->want[0])
        io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

void SF_FN(sf_ref_channel_conv1d_fwd)(const T *x, int n, int c, const T *w, const T *b, int k, int pad, T *y)
{
    for (int ni = 0; ni < n; ni++)
        for (int i = 0; i < c; i++) {
            T acc = b ? b[0] : (T)0;
            for (int j = 0; j < k; j++) {
                const int s = i + j - pad;
                if (s >= 0 && s < c)
                    acc += w[j] * x[(size_t)ni * c + s];
            }
            y[(size_t)ni * c + i] = acc;
        }
}

/* The parameters' sums run over the whole batch: double accumulators (see
 * generic.h). */
void SF_FN(sf_ref_channel_conv1d_bwd)(const T *x, int n, int c, const T *w, int k, int pad, const T *dy, T *dx,
                                      T *dw, T *db)
{
    for (int j = 0; j < k; j++) {
        double acc = 0;
        for (int ni = 0; ni < n; ni++)
            for (int i = 0; i < c; i++) {
                const int s = i + j - pad;
                if (s >= 0 && s < c)
                    acc += (double)dy[(size_t)ni * c + i] * x[(size_t)ni * c + s];
            }
        dw[j] = (T)acc;
    }
    if (db) {
        double acc = 0;
        for (size_t e = 0; e < (size_t)n * c; e++)
            acc += dy[e];
        db[0] = (T)acc;
    }
    if (!dx)
        return;
    for (int ni = 0; ni < n; ni++)
        for (int s = 0; s < c; s++) {
            T acc = 0;
            for (int j = 0; j < k; j++) {
                const int i = s - j + pad;
                if (i >= 0 && i < c)
                    acc += w[j] * dy[(size_t)ni * c + i];
            }
            dx[(size_t)ni * c + s] = acc;
        }
}

#endif
