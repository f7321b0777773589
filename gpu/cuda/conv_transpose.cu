/* gpu/cuda/conv_transpose.cu — ConvTranspose2d as the adjoint convolution
 * (conv.cu's plans built for the matching conv direction), its plan cache and
 * its bias/ReLU epilogue (pointwise.cu). Contracts in conv_transpose.h. */
#include "gpu/cuda/conv_transpose.h"

#include "gpu/cuda/pointwise.h"

#include "gpu/cuda/kernel_common.cuh"

/* ======================================================================== */
/* launchers                                                                */
/* ======================================================================== */

/* The conv direction that computes each convT direction (see the header). */
static const sf_conv_dir convt_as_conv[3] = {SF_CONV_BWD_DATA, SF_CONV_FWD, SF_CONV_BWD_FILTER};

static int convt_out(const sf_convt_desc *d, int *oh, int *ow)
{
    *oh = (d->h - 1) * d->stride - 2 * d->pad + d->k;
    *ow = (d->w - 1) * d->stride - 2 * d->pad + d->k;
    return *oh >= 1 && *ow >= 1;
}

/* The convolution whose adjoint the convT is: input [n, oc, oh, ow], weight
 * [c][oc][k][k] as KCRS, output [n, c, h, w]. */
static int convt_conv_desc(const sf_convt_desc *d, sf_conv_desc *cd)
{
    int oh, ow;
    if (d->n < 1 || d->c < 1 || d->h < 1 || d->w < 1 || d->oc < 1 || d->k < 1 || d->stride < 1 || d->pad < 0 ||
        !convt_out(d, &oh, &ow) || (d->dt != SF_DT_F32 && d->dt != SF_DT_BF16)) {
        sf_cuda_set_error("%s:%d: convT n=%d c=%d %dx%d oc=%d k=%d s=%d p=%d dt=%d: bad shape", __FILE__, __LINE__,
                          d->n, d->c, d->h, d->w, d->oc, d->k, d->stride, d->pad, (int)d->dt);
        return -1;
    }
    memset(cd, 0, sizeof *cd);
    cd->n = d->n;
    cd->c = d->oc;
    cd->h = oh;
    cd->w = ow;
    cd->oc = d->c;
    cd->k = d->k;
    cd->stride = d->stride;
    cd->pad = d->pad;
    cd->layout = d->layout;
    cd->tf32 = d->tf32;
    cd->dt = d->dt; /* x, w, y of the convT are y, w, x of the conv: one element type */
    cd->align_x = d->align_y;
    cd->align_w = d->align_w;
    cd->align_y = d->align_x;
    cd->allow_rtc = d->allow_rtc;
    cd->blas = d->blas;
    return 0;
}

static sf_conv_ptrs convt_conv_ptrs(const sf_convt_ptrs *p)
{
    sf_conv_ptrs q;
    q.x = p->y;
    q.w = p->w;
    q.y = p->x;
    q.ws = p->ws;
    q.b = NULL;
    return q;
}

extern "C" void sf_convt_plans_destroy(sf_convt_plans *p)
{
    if (!p)
        return;
    for (int i = 0; i < 3; i++) {
        if (p->vp[i])
            sf_conv_vpack_destroy(p->vp[i]);
        sf_conv_plan_destroy(&p->plan[i]);
    }
    memset(p, 0, sizeof *p);
}

extern "C" int sf_convt_plans_build(cudnnHandle_t h, const sf_convt_desc *d, int dirs, size_t ws_limit,
                                    int max_candidates, const sf_convt_ptrs *tune, sf_convt_plans *out)
{
    memset(out, 0, sizeof *out);
    sf_conv_desc cd;
    if (convt_conv_desc(d, &cd))
        return -1;
    out->d = *d;
    sf_conv_ptrs tp;
    if (tune)
        tp = convt_conv_ptrs(tune);
    for (int dir = 0; dir < 3; dir++) {
        if (!(dirs & (1 << dir)))
            continue;
        if (sf_conv_plan_build(h, &cd, convt_as_conv[dir], ws_limit, max_candidates, tune ? &tp : NULL,
                               &out->plan[dir])) {
            sf_convt_plans_destroy(out);
            return -1;
        }
        out->dirs |= 1 << dir;
    }
    return 0;
}

extern "C" size_t sf_convt_ws_bytes(const sf_convt_plans *p)
{
    size_t m = 0;
    for (int i = 0; i < 3; i++)
        if ((p->dirs & (1 << i)) && (size_t)p->plan[i].ws_bytes > m)
            m = (size_t)p->plan[i].ws_bytes;
    return m;
}

extern "C" int sf_convt_run(cudnnHandle_t h, sf_convt_plans *p, sf_conv_dir dir, const sf_convt_ptrs *ptrs)
{
    if ((int)dir < 0 || (int)dir > 2 || !(p->dirs & (1 << dir))) {
        sf_cuda_set_error("%s:%d: sf_convt_run: direction %d not built", __FILE__, __LINE__, (int)dir);
        return -1;
    }
    if (!p->vp[dir] || memcmp(&p->vp_ptrs[dir], ptrs, sizeof *ptrs) != 0) {
        if (p->vp[dir]) {
            sf_conv_vpack_destroy(p->vp[dir]);
            p->vp[dir] = NULL;
        }
        const sf_conv_ptrs q = convt_conv_ptrs(ptrs);
        if (sf_conv_vpack_make(&q, &p->vp[dir]))
            return -1;
        p->vp_ptrs[dir] = *ptrs;
    }
    return sf_conv_run(h, &p->plan[dir], p->vp[dir]);
}

/* The key is the whole descriptor (every field, dt and the lent cuBLAS
 * handle included), so a bf16 and an fp32 set of one shape are two entries.
 * Compared field by field: the pointer leaves padding in the struct. */
static int convt_desc_same(const sf_convt_desc *a, const sf_convt_desc *b)
{
    return a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w && a->oc == b->oc && a->k == b->k &&
           a->stride == b->stride && a->pad == b->pad && a->layout == b->layout && a->tf32 == b->tf32 &&
           a->dt == b->dt && a->align_x == b->align_x && a->align_w == b->align_w && a->align_y == b->align_y &&
           a->allow_rtc == b->allow_rtc && a->blas == b->blas;
}

extern "C" sf_convt_plans *sf_convt_cache_get(cudnnHandle_t h, sf_convt_cache *c, const sf_convt_desc *d,
                                              int dirs, size_t ws_limit, int max_candidates)
{
    for (int i = 0; i < c->n; i++)
        if (convt_desc_same(&c->e[i].d, d) && (c->e[i].dirs & dirs) == dirs)
            return &c->e[i];
    /* A set of this shape lacking a direction is rebuilt in place with the union. */
    int slot = -1;
    for (int i = 0; i < c->n; i++)
        if (convt_desc_same(&c->e[i].d, d)) {
            dirs |= c->e[i].dirs;
            sf_convt_plans_destroy(&c->e[i]);
            slot = i;
            break;
        }
    if (slot < 0) {
        if (c->n >= SF_CONVT_CACHE_MAX) {
            sf_cuda_set_error("%s:%d: sf_convt_cache_get: cache full (%d shapes)", __FILE__, __LINE__,
                              SF_CONVT_CACHE_MAX);
            return NULL;
        }
        slot = c->n;
    }
    if (sf_convt_plans_build(h, d, dirs, ws_limit, max_candidates, NULL, &c->e[slot])) {
        /* keep the cache dense: move the last entry into a freed middle slot */
        if (slot < c->n) {
            c->n--;
            if (slot != c->n) {
                c->e[slot] = c->e[c->n];
                memset(&c->e[c->n], 0, sizeof c->e[c->n]);
            }
        }
        return NULL;
    }
    if (slot == c->n)
        c->n++;
    return &c->e[slot];
}

extern "C" void sf_convt_cache_destroy(sf_convt_cache *c)
{
    for (int i = 0; i < c->n; i++)
        sf_convt_plans_destroy(&c->e[i]);
    c->n = 0;
}

/* The convT output's view for the bias: [n*oh*ow, oc, 1] (NHWC) or [n, oc, oh*ow]. */
static int convt_bias_view(const char *fn, const sf_convt_desc *d, size_t *outer, size_t *inner)
{
    int oh, ow;
    if (!convt_out(d, &oh, &ow)) {
        sf_cuda_set_error("%s:%d: %s: bad shape", __FILE__, __LINE__, fn);
        return -1;
    }
    if (d->layout == SF_LAYOUT_NHWC) {
        *outer = (size_t)d->n * oh * ow;
        *inner = 1;
    } else {
        *outer = (size_t)d->n;
        *inner = (size_t)oh * ow;
    }
    return 0;
}

/* The fp32 wrappers take fp32 tensors: a bf16 descriptor needs the _dt ones. */
static int convt_f32_only(const char *fn, const sf_convt_desc *d)
{
    if (d->dt == SF_DT_F32)
        return 0;
    sf_cuda_set_error("%s:%d: %s: descriptor of element type %d (use %s_dt)", __FILE__, __LINE__, fn, (int)d->dt, fn);
    return -1;
}

extern "C" int sf_convt_bias_act(const sf_convt_desc *d, float *y, const float *b, int relu, cudaStream_t s)
{
    size_t outer, inner;
    if (convt_f32_only("sf_convt_bias_act", d) || convt_bias_view("sf_convt_bias_act", d, &outer, &inner))
        return -1;
    return sf_cuda_bias_act(y, b, outer, d->oc, inner, relu, s);
}

extern "C" int sf_convt_bias_grad(const sf_convt_desc *d, float *dy, const float *y, float *db, float *scratch,
                                  cudaStream_t s)
{
    size_t outer, inner;
    if (convt_f32_only("sf_convt_bias_grad", d) || convt_bias_view("sf_convt_bias_grad", d, &outer, &inner))
        return -1;
    return sf_cuda_bias_grad(dy, y, outer, d->oc, inner, db, scratch, s);
}

extern "C" int sf_convt_bias_act_dt(const sf_convt_desc *d, void *y, const float *b, int relu, cudaStream_t s)
{
    size_t outer, inner;
    if (convt_bias_view("sf_convt_bias_act_dt", d, &outer, &inner))
        return -1;
    return sf_cuda_bias_act_dt(d->dt, y, b, outer, d->oc, inner, relu, s);
}

extern "C" int sf_convt_bias_grad_dt(const sf_convt_desc *d, void *dy, const void *y, float *db, float *scratch,
                                     cudaStream_t s)
{
    size_t outer, inner;
    if (convt_bias_view("sf_convt_bias_grad_dt", d, &outer, &inner))
        return -1;
    return sf_cuda_bias_grad_dt(d->dt, dy, y, outer, d->oc, inner, db, scratch, s);
}
