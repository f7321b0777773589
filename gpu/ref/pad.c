/* gpu/ref/pad.c — reference padding of a map's last two dimensions
 * (F.pad, nn.ZeroPad2d, nn.ConstantPad2d, nn.ReflectionPad2d,
 * nn.ReplicationPad2d, nn.CircularPad2d), forward and backward, in float
 * and double (_f64), and the pad layer's hooks. Contracts in
 * gpu/ref/layers.h; the modes and their bounds are PyTorch's. */
#ifndef T
#include "gpu/ref/ref.h"
#include "gpu/ref/layer_io.h"

#include <math.h>

#define SF_REF_SELF "pad.c"
#include "gpu/ref/generic.h"

/* The input index that output index o of an axis reads, its input of size
 * in padded by lo before it; -1 where a constant fills it. The layer's
 * shape rule keeps reflect's pads below in and circular's at most in, so
 * one mirror or one wrap reaches every output. */
int sf_ref_pad_src(int o, int lo, int in, int mode)
{
    int i = o - lo;
    if (i >= 0 && i < in)
        return i;
    switch (mode) {
    case SF_PAD_REFLECT:
        return i < 0 ? -i : 2 * (in - 1) - i;
    case SF_PAD_REPLICATE:
        return i < 0 ? 0 : in - 1;
    case SF_PAD_CIRCULAR:
        return i < 0 ? i + in : i - in;
    default:
        return -1;
    }
}

/* ---- the pad layer's hooks (gpu/layers.c) ------------------------------------ */

void sf_ref_layer_pad_fwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    sf_ref_pad_fwd(io->x[0], io->n, L->out_ch, L->in_h, L->in_w, L->pads, L->mode, L->pad_value, io->y);
}

void sf_ref_layer_pad_bwd(const sf_ref_io *io)
{
    const sf_layer *L = io->L;
    if (!io->want[0])
        return;
    sf_ref_pad_bwd(io->dy, io->n, L->out_ch, L->in_h, L->in_w, L->pads, L->mode, io->scratch);
    io->give(io, 0, io->scratch);
}

#else /* the generic part, compiled once for float and once for double (generic.h) */

/* y [n, c, top + h + bottom, left + w + right] from x [n, c, h, w]: each
 * output reads the input sf_ref_pad_src names along each axis, or value
 * where either axis names none (mode constant). */
void SF_FN(sf_ref_pad_fwd)(const T *x, int n, int c, int h, int w, const int pad[4], int mode, T value, T *y)
{
    const int oh = h + pad[2] + pad[3], ow = w + pad[0] + pad[1];
    for (size_t pl = 0; pl < (size_t)n * c; pl++) {
        const T *xp = x + pl * h * w;
        T *yp = y + pl * oh * ow;
        for (int r = 0; r < oh; r++) {
            const int sr = sf_ref_pad_src(r, pad[2], h, mode);
            for (int q = 0; q < ow; q++) {
                const int sq = sf_ref_pad_src(q, pad[0], w, mode);
                yp[(size_t)r * ow + q] = sr < 0 || sq < 0 ? value : xp[(size_t)sr * w + sq];
            }
        }
    }
}

/* PyTorch's reflection_pad2d_backward, replication_pad2d_backward and the
 * constant and circular pads' autograd: dx zeroed, then each output's dy
 * added into the input it read (in output order), the constant border's
 * dropped. */
void SF_FN(sf_ref_pad_bwd)(const T *dy, int n, int c, int h, int w, const int pad[4], int mode, T *dx)
{
    const int oh = h + pad[2] + pad[3], ow = w + pad[0] + pad[1];
    for (size_t e = 0; e < (size_t)n * c * h * w; e++)
        dx[e] = 0;
    for (size_t pl = 0; pl < (size_t)n * c; pl++) {
        const T *dyp = dy + pl * oh * ow;
        T *dxp = dx + pl * h * w;
        for (int r = 0; r < oh; r++) {
            const int sr = sf_ref_pad_src(r, pad[2], h, mode);
            for (int q = 0; q < ow; q++) {
                const int sq = sf_ref_pad_src(q, pad[0], w, mode);
                if (sr >= 0 && sq >= 0)
                    dxp[(size_t)sr * w + sq] += dyp[(size_t)r * ow + q];
            }
        }
    }
}

#endif
