/* gpu/aug.c — augmentation pipeline: parsing, planning for one input shape,
 * and the per-sample random parameters. Semantics: gpu/aug.h.
 *
 * Coordinates. An image of W x H pixels spans the continuous rectangle
 * [0,W] x [0,H]; pixel (i,j) has its centre at (j+0.5, i+0.5) (PyTorch's
 * align_corners=False convention). Every geometric op is described by its
 * inverse: the map from a point of its output to the point of its input that
 * lands there. In list order, op k maps image k-1 to image k, so the composed
 * inverse is  inv = inv_1 o inv_2 o ... o inv_K  (output -> source).
 *   random_crop, center_crop (x0,y0):  (x,y) -> (x + x0, y + y0)
 *   resize W,H -> w,h:     (x,y) -> (x * W/w, y * H/h)
 *   random_resized_crop:   its crop (x0,y0,cw,ch), then a resize cw,ch -> w,h
 *   random_rotation a:     (x,y) -> C + R(a) (p - C), C = (W/2, H/2),
 *                          R(a) = [cos a, -sin a; sin a, cos a] with a positive
 *                          angle turning the content counter-clockwise on screen
 *                          (torchvision's convention)
 *   horizontal_flip:       (x,y) -> (W - x, y)
 * The composition is done in double and rounded to float once (inv[6]).
 *
 * Random draws: u = sf_u01(sf_hash4(seed, seq, i, op_index*16 + draw)).
 *   random_crop:  draw 0 -> y0 = min(floor(u*(H-h+1)), H-h); draw 1 -> x0 likewise
 *   random_rotation: draw 0 -> angle = min + u*(max-min) (float, degrees)
 *   horizontal_flip: draw 0 -> flip when u < p
 *   random_resized_crop: attempt a's draws d = 0 (area), 1 (log ratio), 2 (top),
 *                  3 (left) are sf_u01(sf_hash4(sf_hash4(seed, seq, i, op_index*16),
 *                  a, d, SF_AUG_RRC_KEY)); see rrc_window
 *   center_crop:   no draw; offsets round((H-h)/2), round((W-w)/2)
 *   gaussian_blur: draw 0 -> sigma = min + u*(max-min) (float)
 * random_mask: mask_seed = sf_hash4(seed, seq, i, SF_AUG_MASK_KEY).
 *   color_jitter: draws 0..3 -> the factors lo + u*(hi-lo); draws 4..6 -> the
 *                 order, Fisher-Yates from the end (j = 3, 2, 1 takes draw 7-j)
 *   random_erasing: draw 0 -> erase when u < p; attempt a's draws d = 0..3
 *                 (area, log ratio, top, left) as random_resized_crop's, keyed
 *                 with SF_AUG_ERASE_KEY; erase_seed = sf_hash4(seed, seq, i,
 *                 SF_AUG_ERASE_KEY)
 * Batch-level (sf_aug_gen_mix, gpu/aug_mix.c): doubles u_k from sf_hash4(seed, seq,
 *   SF_AUG_MIX_KEY, k): u_0 picks mixup or cutmix when both are listed, u_1 < p
 *   applies it, u_2, u_3 the cutmix centre, u_16 on the gamma variates.
 */
#include "gpu/common.h"
#include "gpu/aug.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gpu/rng.h"

#define SF_AUG_MASK_KEY 0x4D41534Bull /* "MASK" */
#define SF_AUG_RRC_KEY 0x52524321ull  /* "RRC!" */
#define SF_AUG_ERASE_KEY 0x45524153ull /* "ERAS" */
#define SF_AUG_MAX_DIM 16384          /* largest image side, source or output */
#define SF_AUG_MAX_DILATE 32

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* ---- parsing ------------------------------------------------------------ */

/* A finite number. Returns 1 present, 0 absent, -1 wrong type (err filled). */
static int get_num(const cJSON *o, const char *key, double *out, const char *what, char *err,
                   size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        sf_errf(err, errlen, "%s: \"%s\" must be a number", what, key);
        return -1;
    }
    *out = v->valuedouble;
    return 1;
}


static int is_int_in(double v, double lo, double hi)
{
    return v == floor(v) && v >= lo && v <= hi;
}

/* A pair of numbers, [a, b], or (allow_scalar) one number a for [a, a];
 * -1 when v (which may be NULL) is neither. */
static int num_pair(const cJSON *v, int allow_scalar, double d[2])
{
    if (allow_scalar && cJSON_IsNumber(v)) {
        d[0] = d[1] = v->valuedouble;
        return 0;
    }
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 2 && cJSON_IsNumber(cJSON_GetArrayItem(v, 0)) &&
        cJSON_IsNumber(cJSON_GetArrayItem(v, 1))) {
        d[0] = cJSON_GetArrayItem(v, 0)->valuedouble;
        d[1] = cJSON_GetArrayItem(v, 1)->valuedouble;
        return 0;
    }
    return -1;
}

/* "size": [h, w] (or one integer for a square, random_crop only). */
static int get_size(const cJSON *o, int allow_scalar, int *h, int *w, const char *what, char *err,
                    size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "size");
    if (!v) {
        sf_errf(err, errlen, "%s: missing \"size\" ([h,w])", what);
        return -1;
    }
    double d[2];
    if (num_pair(v, allow_scalar, d)) {
        sf_errf(err, errlen, "%s: \"size\" must be [h,w]%s", what, allow_scalar ? " or an integer" : "");
        return -1;
    }
    if (!is_int_in(d[0], 1, SF_AUG_MAX_DIM) || !is_int_in(d[1], 1, SF_AUG_MAX_DIM)) {
        sf_errf(err, errlen, "%s: \"size\" values must be integers in [1,%d]", what, SF_AUG_MAX_DIM);
        return -1;
    }
    *h = (int)d[0];
    *w = (int)d[1];
    return 0;
}

/* A [min,max] range, or one number x meaning [-x,x] (sym) or [x,x]. */
static int get_range(const cJSON *o, const char *key, int sym, float *lo, float *hi,
                     const char *what, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    double d[2];
    if (num_pair(v, 1, d)) {
        sf_errf(err, errlen, "%s: \"%s\" must be [min,max] or a number", what, key);
        return -1;
    }
    double a = d[0], b = d[1];
    if (sym && cJSON_IsNumber(v)) {
        a = -fabs(d[0]);
        b = fabs(d[0]);
    }
    if (!isfinite(a) || !isfinite(b) || a > b) {
        sf_errf(err, errlen, "%s: \"%s\" must be finite with min <= max", what, key);
        return -1;
    }
    *lo = (float)a;
    *hi = (float)b;
    return 0;
}


/* An array of 1..SF_AUG_MAX_C numbers, or one number. Returns the count. */
static int get_vec(const cJSON *o, const char *key, float *out, const char *what, char *err,
                   size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(v)) {
        out[0] = (float)v->valuedouble;
        return 1;
    }
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    if (n < 1 || n > SF_AUG_MAX_C) {
        sf_errf(err, errlen, "%s: \"%s\" must be a number or an array of 1..%d numbers", what, key,
                SF_AUG_MAX_C);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble)) {
            sf_errf(err, errlen, "%s: \"%s\"[%d] must be a finite number", what, key, i);
            return -1;
        }
        out[i] = (float)e->valuedouble;
    }
    return n;
}

static int str_ieq(const char *a, const char *b)
{
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b))
            return 0;
    return *a == *b;
}
/* ---- reading an op's fields --------------------------------------------- */

/* How a JSON field of an op is read and where it goes (aug_field). */
typedef enum aug_field_type {
    AF_SIZE,   /* "size": [h,w] (AF_SCALAR: or one integer for a square), required;
                  off = size_h, off2 = size_w */
    AF_BOOL,   /* true or false -> int (def when absent); off < 0: checked, not kept */
    AF_ANY,    /* accepted and ignored (normalize's "inplace", as torchvision's) */
    AF_NUM,    /* a finite number in [lo,hi] (AF_LO_OPEN: (lo,hi]) -> float; off < 0:
                  checked, not kept */
    AF_INT,    /* an integer in [lo,hi] -> int (AF_PAIR_OK: or [k,k]; AF_ODD: odd) */
    AF_RANGE,  /* [min,max], or one number x for [x,x] (AF_SYM: [-|x|,|x|]), finite,
                  min <= max, min >= lo (AF_LO_OPEN: > lo), max <= hi -> floats at off
                  and off2 (def, def2 when absent) */
    AF_VEC,    /* a number or 1..SF_AUG_MAX_C finite numbers -> float[] at off, required;
                  the count goes to the op's check hook */
    AF_CHOICE, /* one of choices (AF_NOCASE: in any case) -> int, its index, at off
                  (off < 0: checked, not kept) */
    AF_JITTER, /* color_jitter's factor arg (0 brightness .. 3 hue): a range, or x for
                  [1-x,1+x] with the lower end clipped at 0 (hue: [-x,x]) */
    AF_ERASE_VALUE, /* random_erasing's "value": a number, [numbers] or "random" */
} aug_field_type;

enum {
    AF_REQUIRED = 1 << 0, /* absent is an error */
    AF_SCALAR = 1 << 1,   /* SIZE: one integer is a square */
    AF_LO_OPEN = 1 << 2,  /* NUM, RANGE: lo itself is out of bounds */
    AF_SYM = 1 << 3,      /* RANGE: one number x is [-|x|,|x|] */
    AF_PAIR_OK = 1 << 4,  /* INT: [k,k] is k */
    AF_ODD = 1 << 5,      /* INT: odd values only */
    AF_NOCASE = 1 << 6,   /* CHOICE: the strings match in any case */
    /* RANGE: the bounds are checked once the fields after it that carry the
     * flag too have been read (random_resized_crop's and random_erasing's
     * "scale" and "ratio", whose forms are checked before either's bounds). */
    AF_LATE = 1 << 7,
};

#define AF_NONE (-1) /* off of a field that is checked but not kept */
#define OFF(f) ((int)offsetof(sf_aug_op, f))
#define AF_STR_(x) #x
#define AF_STR(x) AF_STR_(x)

typedef struct aug_field {
    const char *key;
    aug_field_type type;
    int off, off2;         /* offsetof(sf_aug_op, ...), or AF_NONE */
    double lo, hi;         /* bounds */
    double def, def2;      /* the value(s) when absent */
    int flags;             /* AF_* */
    const char *const *choices; /* CHOICE: NULL-terminated */
    const char *msg;       /* the bounds message after "aug op i (name): ", where the
                              type's own ("must lie in [lo,hi]") is not the one */
    int arg;               /* JITTER: the factor's index */
} aug_field;

#define AF_END {NULL, AF_ANY, AF_NONE, AF_NONE, 0, 0, 0, 0, 0, NULL, NULL, 0}

static int *op_int(sf_aug_op *op, int off) { return (int *)((char *)op + off); }
static float *op_float(sf_aug_op *op, int off) { return (float *)((char *)op + off); }

/* The bounds message of f: its own, or "\"key\" must lie in [lo,hi]". */
static void bounds_err(const aug_field *f, const char *what, char *err, size_t errlen)
{
    if (f->msg)
        sf_errf(err, errlen, "%s: %s", what, f->msg);
    else
        sf_errf(err, errlen, "%s: \"%s\" must lie in %c%g,%g]", what, f->key,
                (f->flags & AF_LO_OPEN) ? '(' : '[', f->lo, f->hi);
}

static int range_in_bounds(const aug_field *f, sf_aug_op *op)
{
    const float lo = *op_float(op, f->off), hi = *op_float(op, f->off2);
    const int lo_ok = (f->flags & AF_LO_OPEN) ? lo > (float)f->lo : lo >= (float)f->lo;
    return lo_ok && !(hi > (float)f->hi);
}

static int read_jitter(const cJSON *jo, const aug_field *f, sf_aug_op *op, const char *what, char *err,
                       size_t errlen)
{
    const int k = f->arg;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(jo, f->key);
    if (!v || cJSON_IsNull(v))
        return 0;
    const double centre = k == 3 ? 0.0 : 1.0;
    double lo, hi;
    if (cJSON_IsNumber(v)) {
        /* torchvision's _check_input: x means [centre - x, centre + x], the
         * factors' lower end clipped at 0. */
        if (!isfinite(v->valuedouble) || v->valuedouble < 0.0) {
            sf_errf(err, errlen, "%s: \"%s\" as one number must be finite and >= 0", what, f->key);
            return -1;
        }
        lo = centre - v->valuedouble;
        hi = centre + v->valuedouble;
        if (k < 3 && lo < 0.0)
            lo = 0.0;
    } else {
        float flo, fhi;
        if (get_range(jo, f->key, 0, &flo, &fhi, what, err, errlen))
            return -1;
        lo = flo;
        hi = fhi;
    }
    const double bmin = k == 3 ? -0.5 : 0.0, bmax = k == 3 ? 0.5 : 1e6;
    if (!(lo >= bmin && lo <= hi && hi <= bmax)) {
        sf_errf(err, errlen, "%s: \"%s\" must give %s with min <= max", what, f->key,
                k == 3 ? "a shift in [-0.5,0.5]" : "factors in [0,1e6]");
        return -1;
    }
    op->jit_lo[k] = (float)lo;
    op->jit_hi[k] = (float)hi;
    op->jit_on[k] = !(lo == centre && hi == centre);
    return 0;
}

static int read_erase_value(const cJSON *jo, const aug_field *f, sf_aug_op *op, const char *what,
                            char *err, size_t errlen)
{
    const cJSON *jv = cJSON_GetObjectItemCaseSensitive(jo, f->key);
    op->n_erase_value = 1; /* value 0 */
    if (cJSON_IsString(jv)) {
        if (strcmp(jv->valuestring, "random") != 0) {
            sf_errf(err, errlen, "%s: \"value\" must be a number, [numbers] or \"random\"", what);
            return -1;
        }
        op->erase_random = 1;
    } else if (jv) {
        const int nv = get_vec(jo, f->key, op->erase_value, what, err, errlen);
        if (nv < 0)
            return -1;
        op->n_erase_value = nv;
    }
    return 0;
}

/* Reads field f of the op's JSON object into op, checking its form and (but
 * for an AF_LATE range) its bounds. *count receives an AF_VEC's count. */
static int read_field(const cJSON *jo, const aug_field *f, sf_aug_op *op, int *count, const char *what,
                      char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(jo, f->key);
    double d;
    int r;
    switch (f->type) {
    case AF_SIZE:
        return get_size(jo, (f->flags & AF_SCALAR) != 0, op_int(op, f->off), op_int(op, f->off2), what,
                        err, errlen);
    case AF_ANY:
        return 0;
    case AF_BOOL:
        if (v && !cJSON_IsBool(v)) {
            sf_errf(err, errlen, "%s: \"%s\" must be true or false", what, f->key);
            return -1;
        }
        if (f->off != AF_NONE)
            *op_int(op, f->off) = v ? cJSON_IsTrue(v) : (int)f->def;
        return 0;
    case AF_NUM:
        if ((r = get_num(jo, f->key, &d, what, err, errlen)) < 0)
            return -1;
        if (r == 0) {
            if (f->flags & AF_REQUIRED) {
                bounds_err(f, what, err, errlen);
                return -1;
            }
            return 0;
        }
        if (!((f->flags & AF_LO_OPEN) ? d > f->lo : d >= f->lo) || !(d <= f->hi)) {
            bounds_err(f, what, err, errlen);
            return -1;
        }
        if (f->off != AF_NONE)
            *op_float(op, f->off) = (float)d;
        return 0;
    case AF_INT: {
        double kk[2];
        if (f->flags & AF_PAIR_OK) {
            if (num_pair(v, 1, kk))
                kk[0] = kk[1] = -1;
        } else {
            if ((r = get_num(jo, f->key, &kk[0], what, err, errlen)) < 0)
                return -1;
            if (r == 0)
                return 0;
            kk[1] = kk[0];
        }
        if (kk[0] != kk[1] || !is_int_in(kk[0], f->lo, f->hi) ||
            ((f->flags & AF_ODD) && (int)kk[0] % 2 == 0)) {
            if (f->msg)
                bounds_err(f, what, err, errlen);
            else
                sf_errf(err, errlen, "%s: \"%s\" must be an integer in [%g,%g]", what, f->key, f->lo, f->hi);
            return -1;
        }
        *op_int(op, f->off) = (int)kk[0];
        return 0;
    }
    case AF_RANGE:
        if (!v && !(f->flags & AF_REQUIRED))
            return 0;
        if (get_range(jo, f->key, (f->flags & AF_SYM) != 0, op_float(op, f->off), op_float(op, f->off2),
                      what, err, errlen))
            return -1;
        if (!(f->flags & AF_LATE) && !range_in_bounds(f, op)) {
            bounds_err(f, what, err, errlen);
            return -1;
        }
        return 0;
    case AF_VEC:
        return *count = get_vec(jo, f->key, op_float(op, f->off), what, err, errlen);
    case AF_CHOICE: {
        if (!v)
            return 0;
        int pick = -1;
        for (int k = 0; cJSON_IsString(v) && f->choices[k] && pick < 0; k++)
            if ((f->flags & AF_NOCASE) ? str_ieq(v->valuestring, f->choices[k])
                                       : strcmp(v->valuestring, f->choices[k]) == 0)
                pick = k;
        if (pick < 0) {
            bounds_err(f, what, err, errlen);
            return -1;
        }
        if (f->off != AF_NONE)
            *op_int(op, f->off) = pick;
        return 0;
    }
    case AF_JITTER:
        return read_jitter(jo, f, op, what, err, errlen);
    case AF_ERASE_VALUE:
        return read_erase_value(jo, f, op, what, err, errlen);
    }
    return -1;
}

/* The defaults of the fields that have one, written before any is read. */
static void field_defaults(const aug_field *fields, sf_aug_op *op)
{
    for (const aug_field *f = fields; f->key; f++) {
        if (f->off == AF_NONE || (f->flags & AF_REQUIRED))
            continue;
        switch (f->type) {
        case AF_BOOL:
        case AF_CHOICE:
        case AF_INT:
            *op_int(op, f->off) = (int)f->def;
            break;
        case AF_NUM:
            *op_float(op, f->off) = (float)f->def;
            break;
        case AF_RANGE:
            *op_float(op, f->off) = (float)f->def;
            *op_float(op, f->off2) = (float)f->def2;
            break;
        default:
            break;
        }
    }
}

/* normalize: mean and std of one value broadcast over the other's count. */
static int normalize_check(sf_aug_op *op, const int *counts, const char *what, char *err, size_t errlen)
{
    const int nm = counts[0], ns = counts[1];
    if (nm != ns && nm != 1 && ns != 1) {
        sf_errf(err, errlen, "%s: \"mean\" has %d values and \"std\" %d", what, nm, ns);
        return -1;
    }
    op->n_mean = nm > ns ? nm : ns;
    for (int i = 1; i < op->n_mean; i++) {
        if (nm == 1)
            op->mean[i] = op->mean[0];
        if (ns == 1)
            op->std[i] = op->std[0];
    }
    /* |std| >= 1e-6: a smaller one scales a 0..255 value past what fp32 and
     * bf16 hold (1e-38 gave infinities and only skipped steps) */
    for (int i = 0; i < op->n_mean; i++)
        if (!(fabsf(op->std[i]) >= 1e-6f)) {
            sf_errf(err, errlen, "%s: \"std\"[%d] must be at least 1e-6 in magnitude", what, i);
            return -1;
        }
    return 0;
}

/* ---- planning: each op's shape rule -------------------------------------- */

/* Where a backend runs an op (aug_op_info.stage). */
typedef enum aug_stage {
    AUG_STAGE_GEOM = 0, /* composed into the affine map: one resampling per pixel */
    AUG_STAGE_BLUR,     /* the separable blur of the geometric output */
    AUG_STAGE_PW,       /* a pointwise stage of the fused pass (sf_aug_plan.pw), or of
                           the second pass when listed after a second-pass op */
    AUG_STAGE_POST,     /* the per-sample second pass (sf_aug_plan.post) */
    AUG_STAGE_MIX,      /* batch-level mixing after everything else (sf_aug_gen_mix) */
} aug_stage;

typedef struct aug_op_info aug_op_info;

/* The state of plan_walk as it goes down the list. */
typedef struct aug_walk {
    const sf_aug_pipeline *p;
    sf_aug_plan *plan;
    const aug_op_info *row; /* the current op's row */
    int i;                  /* the current op's index */
    const char *what;       /* "aug op i (name)" */
    char *err;
    size_t errlen;
    int c;
    int h, w;               /* the current image; 0 x 0 while a ragged source is unsized */
    int blur_at;
    /* Antialias: whether some axis may shrink. scl_* bound the source pixels
     * per pixel of the current image; unknown once a ragged source is
     * resized, and random_resized_crop's scale is random. */
    double scl_x, scl_y;
    int may_shrink, want_aa;
    float value_scale;      /* product of to_dtype scales so far (YCbCr's offset) */
    /* The first color_jitter or random_erasing (later stages run in the
     * second pass), the first mixup or cutmix (only the other may follow
     * it), and whether the values left the intensity scale (normalize,
     * color_convert). */
    int post_at, mix_at, jitter_at, erase_at, not_intensity;
} aug_walk;

/* The current op's pointwise stage (of its row's kind), in the fused pass
 * or, for second-pass rows and once a second-pass op is listed, the second. */
static sf_aug_pw *emit_pw(aug_walk *a);

static int crop_plan(aug_walk *a, const sf_aug_op *op)
{
    if (a->h == 0) {
        sf_errf(a->err, a->errlen, "%s: ragged sources have no fixed size to crop from; "
                "put a resize, random_resized_crop or center_crop before it", a->what);
        return -1;
    }
    if (op->size_h < 1 || op->size_w < 1 || op->size_h > a->h || op->size_w > a->w) {
        sf_errf(a->err, a->errlen, "%s: crop %dx%d does not fit its %dx%d input", a->what, op->size_h,
                op->size_w, a->h, a->w);
        return -1;
    }
    a->h = op->size_h;
    a->w = op->size_w;
    return 0;
}

static int center_crop_plan(aug_walk *a, const sf_aug_op *op)
{
    /* On a ragged source it fixes the size; a smaller sample repeats its
     * edges (gpu/aug.h). */
    if (op->size_h < 1 || op->size_w < 1 || op->size_h > SF_AUG_MAX_DIM || op->size_w > SF_AUG_MAX_DIM ||
        (a->h > 0 && (op->size_h > a->h || op->size_w > a->w))) {
        sf_errf(a->err, a->errlen, "%s: crop %dx%d does not fit its %dx%d input", a->what, op->size_h,
                op->size_w, a->h, a->w);
        return -1;
    }
    a->h = op->size_h;
    a->w = op->size_w;
    return 0;
}

static int resize_plan(aug_walk *a, const sf_aug_op *op)
{
    if (op->size_h < 1 || op->size_w < 1 || op->size_h > SF_AUG_MAX_DIM || op->size_w > SF_AUG_MAX_DIM) {
        sf_errf(a->err, a->errlen, "%s: size %dx%d out of range [1,%d]", a->what, op->size_h, op->size_w,
                SF_AUG_MAX_DIM);
        return -1;
    }
    const int rrc = op->kind == SF_AUG_RANDOM_RESIZED_CROP;
    if (rrc && (!(op->area_min > 0.0f) || op->area_min > op->area_max || !(op->aspect_min > 0.0f) ||
                op->aspect_min > op->aspect_max)) {
        sf_errf(a->err, a->errlen, "%s: scale [%g,%g] / ratio [%g,%g] invalid", a->what,
                (double)op->area_min, (double)op->area_max, (double)op->aspect_min, (double)op->aspect_max);
        return -1;
    }
    a->want_aa |= op->antialias;
    if (a->h == 0 || rrc) {
        a->may_shrink = 1;
    } else {
        a->scl_x *= (double)a->w / op->size_w;
        a->scl_y *= (double)a->h / op->size_h;
    }
    a->h = op->size_h;
    a->w = op->size_w;
    return 0;
}

static int rotation_plan(aug_walk *a, const sf_aug_op *op)
{
    if (a->plan->has_rot) {
        sf_errf(a->err, a->errlen, "%s: only one random_rotation per pipeline", a->what);
        return -1;
    }
    a->plan->has_rot = 1;
    if (op->interp == SF_INTERP_NEAREST)
        a->plan->interp = SF_INTERP_NEAREST;
    /* A turned pixel grid spans up to the larger scale along either axis. */
    a->scl_x = a->scl_y = a->scl_x > a->scl_y ? a->scl_x : a->scl_y;
    return 0;
}

static int blur_plan(aug_walk *a, const sf_aug_op *op)
{
    if (a->blur_at >= 0) {
        sf_errf(a->err, a->errlen, "%s: only one gaussian_blur per pipeline (op %d is one)", a->what,
                a->blur_at);
        return -1;
    }
    if (op->ksize < 1 || op->ksize > SF_AUG_MAX_KSIZE || op->ksize % 2 == 0 || !(op->sigma_min > 0.0f) ||
        op->sigma_min > op->sigma_max) {
        sf_errf(a->err, a->errlen, "%s: kernel_size %d / sigma [%g,%g] invalid", a->what, op->ksize,
                (double)op->sigma_min, (double)op->sigma_max);
        return -1;
    }
    if (a->plan->has_mask) {
        sf_errf(a->err, a->errlen, "%s: random_mask must come after gaussian_blur "
                "(a mask does not commute with a blur)", a->what);
        return -1;
    }
    a->blur_at = a->i;
    a->plan->blur_ksize = op->ksize;
    return 0;
}

static int to_dtype_plan(aug_walk *a, const sf_aug_op *op)
{
    a->value_scale *= op->scale;
    /* A scale of 1 changes no value (x * 1 == x, NaN and -0 included): no
     * stage, so that no pass spends a multiply on it. */
    if (op->scale != 1.0f)
        emit_pw(a)->a[0] = op->scale;
    return 0;
}

static int normalize_plan(aug_walk *a, const sf_aug_op *op)
{
    if (op->n_mean != 1 && op->n_mean != a->c) {
        sf_errf(a->err, a->errlen, "%s: %d mean/std values for %d channels", a->what, op->n_mean, a->c);
        return -1;
    }
    sf_aug_pw nz = {0};
    int identity = 1;
    a->not_intensity = 1;
    for (int ch = 0; ch < a->c; ch++) {
        const int j = op->n_mean == 1 ? 0 : ch;
        if (!(op->std[j] != 0.0f)) {
            sf_errf(a->err, a->errlen, "%s: std[%d] is 0", a->what, j);
            return -1;
        }
        nz.a[ch] = op->mean[j];
        nz.b[ch] = 1.0f / op->std[j];
        identity = identity && nz.a[ch] == 0.0f && nz.b[ch] == 1.0f;
    }
    /* Mean 0 and std 1 change no value ((x - 0) * 1 == x): no stage. */
    if (!identity) {
        sf_aug_pw *pw = emit_pw(a);
        memcpy(pw->a, nz.a, sizeof nz.a);
        memcpy(pw->b, nz.b, sizeof nz.b);
    }
    return 0;
}

static int color_convert_plan(aug_walk *a, const sf_aug_op *op)
{
    if (a->c != 3) {
        sf_errf(a->err, a->errlen, "%s: RGB->YCbCr needs 3 channels, the input has %d", a->what, a->c);
        return -1;
    }
    a->not_intensity = 1;
    /* Chroma offset: half the value range, 128 on the 0..255 scale, times the
     * to_dtype scales applied before this op. */
    emit_pw(a)->a[0] = 128.0f * a->value_scale;
    return 0;
}

static int mask_plan(aug_walk *a, const sf_aug_op *op)
{
    if (a->plan->has_mask) {
        sf_errf(a->err, a->errlen, "%s: only one random_mask per pipeline", a->what);
        return -1;
    }
    if (!(op->ratio >= 0.0f && op->ratio <= 1.0f) || op->dilate < 0 || op->dilate > SF_AUG_MAX_DILATE) {
        sf_errf(a->err, a->errlen, "%s: ratio %g / dilate %d out of range", a->what, (double)op->ratio,
                op->dilate);
        return -1;
    }
    sf_aug_pw *pw = emit_pw(a);
    pw->a[0] = op->ratio;
    pw->b[0] = (float)op->dilate;
    a->plan->has_mask = 1;
    return 0;
}

static int jitter_plan(aug_walk *a, const sf_aug_op *op)
{
    if (a->jitter_at >= 0) {
        sf_errf(a->err, a->errlen, "%s: only one color_jitter per pipeline (op %d is one)", a->what,
                a->jitter_at);
        return -1;
    }
    if (a->c != 1 && a->c != 3) {
        sf_errf(a->err, a->errlen, "%s: needs 1 or 3 channels, the input has %d", a->what, a->c);
        return -1;
    }
    if (a->not_intensity || !(a->value_scale > 0.0f)) {
        sf_errf(a->err, a->errlen, "%s: must act on intensities: put it before normalize "
                "and color_convert, after to_dtype scales > 0 only", a->what);
        return -1;
    }
    for (int k = 0; k < 4; k++)
        if (op->jit_on[k] && (k == 3 ? !(op->jit_lo[k] >= -0.5f && op->jit_hi[k] <= 0.5f)
                                     : !(op->jit_lo[k] >= 0.0f))) {
            sf_errf(a->err, a->errlen, "%s: factor range %d invalid", a->what, k);
            return -1;
        }
    a->jitter_at = a->i;
    sf_aug_pw *pw = emit_pw(a);
    for (int k = 0; k < 4; k++)
        pw->a[k] = op->jit_on[k] ? 1.0f : 0.0f;
    /* The clamp bound: 255 on the 0..255 scale, times the to_dtype scales
     * before it (1 after to_dtype's 1/255, as torchvision's float images). */
    pw->b[0] = 255.0f * a->value_scale;
    return 0;
}

static int erasing_plan(aug_walk *a, const sf_aug_op *op)
{
    if (a->erase_at >= 0) {
        sf_errf(a->err, a->errlen, "%s: only one random_erasing per pipeline (op %d is one)", a->what,
                a->erase_at);
        return -1;
    }
    if (!op->erase_random && op->n_erase_value != 1 && op->n_erase_value != a->c) {
        sf_errf(a->err, a->errlen, "%s: %d values for %d channels", a->what, op->n_erase_value, a->c);
        return -1;
    }
    if (!(op->p >= 0.0f && op->p <= 1.0f) || !(op->area_min > 0.0f) || op->area_min > op->area_max ||
        !(op->aspect_min > 0.0f) || op->aspect_min > op->aspect_max) {
        sf_errf(a->err, a->errlen, "%s: p / scale / ratio invalid", a->what);
        return -1;
    }
    a->erase_at = a->i;
    sf_aug_pw *pw = emit_pw(a);
    for (int ch = 0; ch < a->c; ch++)
        pw->a[ch] = op->erase_value[op->n_erase_value == 1 ? 0 : ch];
    pw->b[0] = op->erase_random ? 1.0f : 0.0f;
    return 0;
}

static int mix_plan(aug_walk *a, const sf_aug_op *op)
{
    for (int j = a->mix_at < 0 ? a->p->n_ops : a->mix_at; j < a->i; j++)
        if (a->p->ops[j].kind == op->kind) {
            const char *name = sf_aug_kind_name(op->kind);
            sf_errf(a->err, a->errlen, "%s: only one %s per pipeline (op %d is one)", a->what, name, j);
            return -1;
        }
    if (!(op->alpha > 0.0f) || !(op->p >= 0.0f && op->p <= 1.0f)) {
        sf_errf(a->err, a->errlen, "%s: alpha %g / p %g invalid", a->what, (double)op->alpha, (double)op->p);
        return -1;
    }
    if (a->mix_at < 0)
        a->mix_at = a->i;
    a->plan->has_mix = 1;
    return 0;
}

/* ---- per-sample parameters ---------------------------------------------- */

/* 2x3 affine map: (x,y) -> (m[0]x + m[1]y + m[2], m[3]x + m[4]y + m[5]). */
static void affine_then(double m[6], const double n[6])
{
    /* m := m o n  (apply n first, then m) */
    double r[6];
    r[0] = m[0] * n[0] + m[1] * n[3];
    r[1] = m[0] * n[1] + m[1] * n[4];
    r[2] = m[0] * n[2] + m[1] * n[5] + m[2];
    r[3] = m[3] * n[0] + m[4] * n[3];
    r[4] = m[3] * n[1] + m[4] * n[4];
    r[5] = m[3] * n[2] + m[4] * n[5] + m[5];
    memcpy(m, r, sizeof r);
}

static float draw(uint64_t seed, uint64_t seq, int i, int op, int k)
{
    return sf_u01(sf_hash4(seed, seq, (uint64_t)i, (uint64_t)op * 16u + (uint64_t)k));
}

/* random_resized_crop's draws: value d (0..3) of attempt a (0..9). */
static float draw_rrc(uint64_t seed, uint64_t seq, int i, int op, int a, int d)
{
    const uint64_t key = sf_hash4(seed, seq, (uint64_t)i, (uint64_t)op * 16u);
    return sf_u01(sf_hash4(key, (uint64_t)a, (uint64_t)d, SF_AUG_RRC_KEY));
}

/* Composes the crop of image k at (x0, y0), cw x ch, into m (image k ->
 * source). While m only translates or mirrors the source (clip_live: no resize
 * or rotation yet), the window, in source pixels, also narrows the clamp box. */
static void crop_into(double m[6], int clip[4], int clip_live, int x0, int y0, int cw, int ch,
                      sf_aug_sample *s)
{
    if (clip_live) {
        /* The source positions of the window's first and last pixel centres. */
        const double xa = m[0] * (x0 + 0.5) + m[2], xb = m[0] * (x0 + cw - 0.5) + m[2];
        const double ya = m[4] * (y0 + 0.5) + m[5], yb = m[4] * (y0 + ch - 0.5) + m[5];
        const int lx = (int)floor(fmin(xa, xb)), hx = (int)floor(fmax(xa, xb));
        const int ly = (int)floor(fmin(ya, yb)), hy = (int)floor(fmax(ya, yb));
        /* Intersected with the box so far: a window larger than a ragged source
         * (center_crop) keeps the source's own edges. */
        if (lx > clip[0])
            clip[0] = lx;
        if (ly > clip[1])
            clip[1] = ly;
        if (hx < clip[2])
            clip[2] = hx;
        if (hy < clip[3])
            clip[3] = hy;
    }
    const double t[6] = {1, 0, x0, 0, 1, y0};
    affine_then(m, t);
    s->crop_x = x0;
    s->crop_y = y0;
    s->crop_w = cw;
    s->crop_h = ch;
}

/* torchvision's RandomResizedCrop.make_params on an h x w image: ten tries of
 * area fraction u in [amin, amax] and log-uniform aspect ratio r, width
 * round(sqrt(area*r)), height round(sqrt(area/r)) (half to even, as Python's
 * round), until the crop fits; then the centre crop of the clamped ratio. */
static void rrc_window(const sf_aug_op *op, uint64_t seed, uint64_t seq, int i, int k, int h, int w,
                       int *x0, int *y0, int *cw, int *ch)
{
    const double area = (double)h * w;
    const double lr0 = log((double)op->aspect_min), lr1 = log((double)op->aspect_max);
    for (int a = 0; a < 10; a++) {
        const double target = area * (op->area_min + draw_rrc(seed, seq, i, k, a, 0) *
                                                         (double)(op->area_max - op->area_min));
        const double ratio = exp(lr0 + draw_rrc(seed, seq, i, k, a, 1) * (lr1 - lr0));
        const int tw = (int)rint(sqrt(target * ratio)), th = (int)rint(sqrt(target / ratio));
        if (tw > 0 && tw <= w && th > 0 && th <= h) {
            *cw = tw;
            *ch = th;
            *y0 = sf_offset_in(draw_rrc(seed, seq, i, k, a, 2), h - th);
            *x0 = sf_offset_in(draw_rrc(seed, seq, i, k, a, 3), w - tw);
            return;
        }
    }
    const double in_ratio = (double)w / h;
    if (in_ratio < op->aspect_min) {
        *cw = w;
        *ch = (int)rint(w / (double)op->aspect_min);
    } else if (in_ratio > op->aspect_max) {
        *ch = h;
        *cw = (int)rint(h * (double)op->aspect_max);
    } else {
        *cw = w;
        *ch = h;
    }
    *cw = *cw < 1 ? 1 : *cw > w ? w : *cw;
    *ch = *ch < 1 ? 1 : *ch > h ? h : *ch;
    *y0 = (h - *ch) / 2;
    *x0 = (w - *cw) / 2;
}

/* torchvision's RandomErasing.make_params on an h x w image: ten tries of
 * area fraction u in [amin, amax] and log-uniform aspect ratio r, box height
 * round(sqrt(area*r)) and width round(sqrt(area/r)) (half to even), until the
 * box is smaller than the image along both axes; then a uniform position. No
 * fit in ten tries: no erasing (box stays 0). Draws as random_resized_crop's,
 * keyed with SF_AUG_ERASE_KEY. */
static void erase_window(const sf_aug_op *op, uint64_t seed, uint64_t seq, int i, int k, int h, int w,
                         int box[4])
{
    const double area = (double)h * w;
    const double lr0 = log((double)op->aspect_min), lr1 = log((double)op->aspect_max);
    const uint64_t key = sf_hash4(seed, seq, (uint64_t)i, (uint64_t)k * 16u);
    for (int a = 0; a < 10; a++) {
        const double target = area * (op->area_min + sf_u01(sf_hash4(key, (uint64_t)a, 0, SF_AUG_ERASE_KEY)) *
                                                         (double)(op->area_max - op->area_min));
        const double ratio = exp(lr0 + sf_u01(sf_hash4(key, (uint64_t)a, 1, SF_AUG_ERASE_KEY)) * (lr1 - lr0));
        const int eh = (int)rint(sqrt(target * ratio)), ew = (int)rint(sqrt(target / ratio));
        if (!(eh < h && ew < w))
            continue;
        box[1] = sf_offset_in(sf_u01(sf_hash4(key, (uint64_t)a, 2, SF_AUG_ERASE_KEY)), h - eh);
        box[0] = sf_offset_in(sf_u01(sf_hash4(key, (uint64_t)a, 3, SF_AUG_ERASE_KEY)), w - ew);
        box[2] = eh > 0 ? ew : 0; /* an empty box erases nothing */
        box[3] = ew > 0 ? eh : 0;
        return;
    }
}

/* torchvision's center_crop offset along one axis: round((n - c) / 2) (half to
 * even); a crop larger than the image starts -((c - n) // 2), where torchvision
 * places the image inside its zero padding. */
static int center_offset(int n, int c)
{
    return n >= c ? (int)rint((n - c) / 2.0) : -((c - n) / 2);
}


/* ---- per-sample parameters: each op's draws ----------------------------- */

/* The state of gen_one as it goes down the list for sample i. */
typedef struct aug_gen {
    uint64_t seed, seq;
    int i;
    const sf_aug_plan *plan;
    sf_aug_sample *s;
    double m[6];   /* image k -> source, starting at k = 0 */
    double mr[6];  /* the map at the rotation: its input -> source */
    int clip_live; /* no resize or rotation yet: a crop narrows the clamp box */
    int h, w;      /* the current image */
} aug_gen;

static void random_crop_gen(aug_gen *g, const sf_aug_op *op, int k)
{
    /* h >= size_h and w >= size_w: checked by the plan */
    const int y0 = sf_offset_in(draw(g->seed, g->seq, g->i, k, 0), g->h - op->size_h);
    const int x0 = sf_offset_in(draw(g->seed, g->seq, g->i, k, 1), g->w - op->size_w);
    crop_into(g->m, g->s->clip, g->clip_live, x0, y0, op->size_w, op->size_h, g->s);
    g->h = op->size_h;
    g->w = op->size_w;
}

static void center_crop_gen(aug_gen *g, const sf_aug_op *op, int k)
{
    crop_into(g->m, g->s->clip, g->clip_live, center_offset(g->w, op->size_w),
              center_offset(g->h, op->size_h), op->size_w, op->size_h, g->s);
    g->h = op->size_h;
    g->w = op->size_w;
}

static void random_resized_crop_gen(aug_gen *g, const sf_aug_op *op, int k)
{
    int x0, y0, cw, ch;
    rrc_window(op, g->seed, g->seq, g->i, k, g->h, g->w, &x0, &y0, &cw, &ch);
    crop_into(g->m, g->s->clip, g->clip_live, x0, y0, cw, ch, g->s);
    const double t[6] = {(double)cw / op->size_w, 0, 0, 0, (double)ch / op->size_h, 0};
    affine_then(g->m, t);
    g->clip_live = 0;
    g->h = op->size_h;
    g->w = op->size_w;
}

static void resize_gen(aug_gen *g, const sf_aug_op *op, int k)
{
    const double t[6] = {(double)g->w / op->size_w, 0, 0, 0, (double)g->h / op->size_h, 0};
    affine_then(g->m, t);
    g->clip_live = 0;
    g->h = op->size_h;
    g->w = op->size_w;
}

static void rotation_gen(aug_gen *g, const sf_aug_op *op, int k)
{
    sf_aug_sample *s = g->s;
    double *m = g->m;
    /* The map so far only scales, translates and mirrors (one rotation per
     * list): kept to invert per axis for this image's coverage (rmap). */
    memcpy(g->mr, m, sizeof g->mr);
    s->pre[0] = (float)m[0];
    s->pre[1] = (float)m[2];
    s->pre[2] = (float)m[4];
    s->pre[3] = (float)m[5];
    s->rot_w = (float)g->w;
    s->rot_h = (float)g->h;
    /* Antialias filters the rotation's input image, as torchvision's resize
     * before its rotate: the supports are this map's scales. */
    s->aa[0] = (float)fmax(1.0, fabs(m[0]));
    s->aa[1] = (float)fmax(1.0, fabs(m[4]));
    g->clip_live = 0;
    const float u = draw(g->seed, g->seq, g->i, k, 0);
    const float ang = op->deg_min + u * (op->deg_max - op->deg_min);
    const double a = (double)ang * (M_PI / 180.0);
    const double ca = cos(a), sa = sin(a);
    const double cx = g->w * 0.5, cy = g->h * 0.5;
    /* source = C + R (p - C), R = [ca, -sa; sa, ca] */
    const double t[6] = {ca, -sa, cx - ca * cx + sa * cy, sa, ca, cy - sa * cx - ca * cy};
    affine_then(m, t);
    s->angle_deg = ang;
}

static void hflip_gen(aug_gen *g, const sf_aug_op *op, int k)
{
    if (draw(g->seed, g->seq, g->i, k, 0) < op->p) {
        const double t[6] = {-1, 0, (double)g->w, 0, 1, 0};
        affine_then(g->m, t);
        g->s->flip ^= 1;
    }
}

static void blur_gen(aug_gen *g, const sf_aug_op *op, int k)
{
    const float u = draw(g->seed, g->seq, g->i, k, 0);
    const float sigma = op->sigma_min + u * (op->sigma_max - op->sigma_min);
    g->s->sigma = sigma;
    /* torchvision _get_gaussian_kernel1d: x = -(k-1)/2 .. (k-1)/2,
     * pdf = exp(-0.5 (x/sigma)^2), normalised to sum 1. */
    double wsum = 0.0, wk[SF_AUG_MAX_KSIZE];
    const int ks = op->ksize, half = (ks - 1) / 2;
    for (int j = 0; j < ks; j++) {
        const double x = (double)(j - half) / sigma;
        wk[j] = exp(-0.5 * x * x);
        wsum += wk[j];
    }
    for (int j = 0; j < ks; j++)
        g->s->blur_w[j] = (float)(wk[j] / wsum);
}

static void jitter_gen(aug_gen *g, const sf_aug_op *op, int k)
{
    sf_aug_sample *s = g->s;
    for (int f = 0; f < 4; f++) {
        const float u = draw(g->seed, g->seq, g->i, k, f);
        s->jitter[f] = op->jit_lo[f] + u * (op->jit_hi[f] - op->jit_lo[f]);
    }
    /* torchvision's randperm(4): a uniform permutation, here by Fisher-Yates
     * with draws 4..6. */
    for (int f = 0; f < 4; f++)
        s->jitter_order[f] = (uint8_t)f;
    for (int j = 3; j > 0; j--) {
        const int r = sf_offset_in(draw(g->seed, g->seq, g->i, k, 7 - j), j);
        const uint8_t t = s->jitter_order[j];
        s->jitter_order[j] = s->jitter_order[r];
        s->jitter_order[r] = t;
    }
}

static void erasing_gen(aug_gen *g, const sf_aug_op *op, int k)
{
    if (draw(g->seed, g->seq, g->i, k, 0) < op->p)
        erase_window(op, g->seed, g->seq, g->i, k, g->plan->out_h, g->plan->out_w, g->s->erase);
    g->s->erase_seed = sf_hash4(g->seed, g->seq, (uint64_t)g->i, SF_AUG_ERASE_KEY);
}

/* ---- the op table ------------------------------------------------------- */

/* One row per op: everything that parsing, planning and drawing know of it.
 * sf_aug_parse, plan_walk and gen_one loop over the rows; the backends run
 * the plan's stages (sf_aug_plan: the map, blur_ksize, pw, post, has_mix),
 * each row naming the stage it becomes. */
struct aug_op_info {
    const char *name;          /* JSON "op" */
    const aug_field *fields;   /* in the order they are read; terminated by AF_END */
    /* Checks across fields once all are read; counts[k] is field k's AF_VEC
     * count. NULL: none. */
    int (*check)(sf_aug_op *op, const int *counts, const char *what, char *err, size_t errlen);
    aug_stage stage;
    sf_aug_pw_kind pw;         /* AUG_STAGE_PW, AUG_STAGE_POST: the stage's kind */
    int first_pass;            /* must come before the second-pass ops (it acts on, or
                                  is, the geometric output) */
    /* The shape rule: checks the op against the walk so far (input size,
     * channels, order) and updates it. */
    int (*plan)(aug_walk *a, const sf_aug_op *op);
    /* The per-sample draws (the host half of the op's reference semantics:
     * both backends read what it writes); NULL: the op draws nothing. */
    void (*gen)(aug_gen *g, const sf_aug_op *op, int k);
};

static const char *const interp_choices[] = {"bilinear", "nearest", NULL};
static const char *const ycbcr_choices[] = {"ycbcr", NULL};
static const char *const rgb_choices[] = {"rgb", NULL};
static const char *const float32_choices[] = {"float32", NULL};

#define F_SIZE(flags) {"size", AF_SIZE, OFF(size_h), OFF(size_w), 1, SF_AUG_MAX_DIM, 0, 0, AF_REQUIRED | (flags), NULL, NULL, 0}
#define F_ANTIALIAS {"antialias", AF_BOOL, OFF(antialias), AF_NONE, 0, 1, 1, 0, 0, NULL, NULL, 0}
#define F_P(def) {"p", AF_NUM, OFF(p), AF_NONE, 0, 1, def, 0, 0, NULL, NULL, 0}
#define F_SCALE(lo, hi) {"scale", AF_RANGE, OFF(area_min), OFF(area_max), 0, 1, lo, hi, AF_LO_OPEN | AF_LATE, NULL, NULL, 0}
#define F_RATIO(lo, hi) {"ratio", AF_RANGE, OFF(aspect_min), OFF(aspect_max), 1e-3, 1e3, lo, hi, AF_LATE, NULL, NULL, 0}
#define F_JITTER(key, k) {key, AF_JITTER, AF_NONE, AF_NONE, 0, 0, 0, 0, 0, NULL, NULL, k}

static const aug_field crop_fields[] = {F_SIZE(AF_SCALAR), AF_END};
static const aug_field resize_fields[] = {F_SIZE(0), F_ANTIALIAS, AF_END};
/* torchvision's defaults: scale [0.08, 1], ratio [3/4, 4/3] */
static const aug_field rrc_fields[] = {
    F_SIZE(AF_SCALAR), F_ANTIALIAS, F_SCALE(0.08f, 1.0f), F_RATIO(3.0f / 4.0f, 4.0f / 3.0f), AF_END};
static const aug_field rotation_fields[] = {
    {"degrees", AF_RANGE, OFF(deg_min), OFF(deg_max), -3600, 3600, 0, 0, AF_REQUIRED | AF_SYM, NULL, NULL, 0},
    {"interpolation", AF_CHOICE, OFF(interp), AF_NONE, 0, 0, SF_INTERP_BILINEAR, 0, AF_NOCASE, interp_choices,
     "\"interpolation\" must be \"bilinear\" or \"nearest\"", 0},
    {"fill", AF_NUM, AF_NONE, AF_NONE, 0, 0, 0, 0, 0, NULL, "only \"fill\": 0 is supported", 0},
    AF_END};
static const aug_field hflip_fields[] = {F_P(0.5), AF_END};
static const aug_field blur_fields[] = {
    {"kernel_size", AF_INT, OFF(ksize), AF_NONE, 1, SF_AUG_MAX_KSIZE, 0, 0, AF_REQUIRED | AF_PAIR_OK | AF_ODD,
     NULL, "\"kernel_size\" must be an odd integer in [1," AF_STR(SF_AUG_MAX_KSIZE) "] (or [k,k])", 0},
    /* torchvision's default sigma [0.1, 2.0] */
    {"sigma", AF_RANGE, OFF(sigma_min), OFF(sigma_max), 0, 1000, 0.1f, 2.0f, AF_LO_OPEN, NULL, NULL, 0},
    AF_END};
static const aug_field normalize_fields[] = {
    {"mean", AF_VEC, OFF(mean), AF_NONE, 0, 0, 0, 0, AF_REQUIRED, NULL, NULL, 0},
    {"std", AF_VEC, OFF(std), AF_NONE, 0, 0, 0, 0, AF_REQUIRED, NULL, NULL, 0},
    {"inplace", AF_ANY, AF_NONE, AF_NONE, 0, 0, 0, 0, 0, NULL, NULL, 0},
    AF_END};
static const aug_field color_convert_fields[] = {
    {"to", AF_CHOICE, AF_NONE, AF_NONE, 0, 0, 0, 0, AF_NOCASE, ycbcr_choices,
     "only \"to\": \"ycbcr\" is supported", 0},
    {"from", AF_CHOICE, AF_NONE, AF_NONE, 0, 0, 0, 0, AF_NOCASE, rgb_choices,
     "only \"from\": \"rgb\" is supported", 0},
    AF_END};
static const aug_field mask_fields[] = {
    {"ratio", AF_NUM, OFF(ratio), AF_NONE, 0, 1, 0, 0, AF_REQUIRED, NULL, "\"ratio\" must be a number in [0,1]", 0},
    {"dilate", AF_INT, OFF(dilate), AF_NONE, 0, SF_AUG_MAX_DILATE, 0, 0, 0, NULL, NULL, 0},
    AF_END};
static const aug_field to_dtype_fields[] = {
    {"dtype", AF_CHOICE, AF_NONE, AF_NONE, 0, 0, 0, 0, 0, float32_choices,
     "only \"dtype\": \"float32\" is supported", 0},
    {"scale", AF_NUM, OFF(scale), AF_NONE, -DBL_MAX, DBL_MAX, 1, 0, 0, NULL, NULL, 0},
    AF_END};
static const aug_field jitter_fields[] = {
    F_JITTER("brightness", 0), F_JITTER("contrast", 1), F_JITTER("saturation", 2), F_JITTER("hue", 3), AF_END};
/* torchvision's defaults: p 0.5, scale [0.02, 0.33], ratio [0.3, 3.3] */
static const aug_field erasing_fields[] = {
    F_P(0.5), F_SCALE(0.02f, 0.33f), F_RATIO(0.3f, 3.3f),
    {"value", AF_ERASE_VALUE, AF_NONE, AF_NONE, 0, 0, 0, 0, 0, NULL, NULL, 0},
    {"inplace", AF_BOOL, AF_NONE, AF_NONE, 0, 1, 0, 0, 0, NULL, NULL, 0},
    AF_END};
/* torchvision's alpha 1; v2.MixUp and v2.CutMix always apply (p 1) */
static const aug_field mix_fields[] = {
    {"alpha", AF_NUM, OFF(alpha), AF_NONE, 0, 1000, 1, 0, AF_LO_OPEN, NULL, NULL, 0}, F_P(1.0), AF_END};

static const aug_op_info aug_ops[SF_AUG_KIND_COUNT] = {
    [SF_AUG_RANDOM_CROP] = {.name = "random_crop", .fields = crop_fields, .stage = AUG_STAGE_GEOM,
                            .first_pass = 1, .plan = crop_plan, .gen = random_crop_gen},
    [SF_AUG_RESIZE] = {.name = "resize", .fields = resize_fields, .stage = AUG_STAGE_GEOM, .first_pass = 1,
                       .plan = resize_plan, .gen = resize_gen},
    [SF_AUG_RANDOM_ROTATION] = {.name = "random_rotation", .fields = rotation_fields, .stage = AUG_STAGE_GEOM,
                                .first_pass = 1, .plan = rotation_plan, .gen = rotation_gen},
    [SF_AUG_HFLIP] = {.name = "horizontal_flip", .fields = hflip_fields, .stage = AUG_STAGE_GEOM,
                      .first_pass = 1, .plan = NULL, .gen = hflip_gen},
    [SF_AUG_GAUSSIAN_BLUR] = {.name = "gaussian_blur", .fields = blur_fields, .stage = AUG_STAGE_BLUR,
                              .first_pass = 1, .plan = blur_plan, .gen = blur_gen},
    [SF_AUG_NORMALIZE] = {.name = "normalize", .fields = normalize_fields, .check = normalize_check,
                          .stage = AUG_STAGE_PW, .pw = SF_PW_NORMALIZE, .plan = normalize_plan},
    [SF_AUG_COLOR_CONVERT] = {.name = "color_convert", .fields = color_convert_fields, .stage = AUG_STAGE_PW,
                              .pw = SF_PW_YCBCR, .plan = color_convert_plan},
    [SF_AUG_RANDOM_MASK] = {.name = "random_mask", .fields = mask_fields, .stage = AUG_STAGE_PW,
                            .pw = SF_PW_MASK, .first_pass = 1, .plan = mask_plan},
    [SF_AUG_TO_DTYPE] = {.name = "to_dtype", .fields = to_dtype_fields, .stage = AUG_STAGE_PW,
                         .pw = SF_PW_SCALE, .plan = to_dtype_plan},
    [SF_AUG_RANDOM_RESIZED_CROP] = {.name = "random_resized_crop", .fields = rrc_fields,
                                    .stage = AUG_STAGE_GEOM, .first_pass = 1, .plan = resize_plan,
                                    .gen = random_resized_crop_gen},
    [SF_AUG_CENTER_CROP] = {.name = "center_crop", .fields = crop_fields, .stage = AUG_STAGE_GEOM,
                            .first_pass = 1, .plan = center_crop_plan, .gen = center_crop_gen},
    [SF_AUG_COLOR_JITTER] = {.name = "color_jitter", .fields = jitter_fields, .stage = AUG_STAGE_POST,
                             .pw = SF_PW_JITTER, .plan = jitter_plan, .gen = jitter_gen},
    [SF_AUG_RANDOM_ERASING] = {.name = "random_erasing", .fields = erasing_fields, .stage = AUG_STAGE_POST,
                               .pw = SF_PW_ERASE, .plan = erasing_plan, .gen = erasing_gen},
    [SF_AUG_MIXUP] = {.name = "mixup", .fields = mix_fields, .stage = AUG_STAGE_MIX, .plan = mix_plan},
    [SF_AUG_CUTMIX] = {.name = "cutmix", .fields = mix_fields, .stage = AUG_STAGE_MIX, .plan = mix_plan},
};

/* The row of kind k, or NULL for a kind outside the table. */
static const aug_op_info *op_row(sf_aug_kind k)
{
    return (int)k < 0 || k >= SF_AUG_KIND_COUNT ? NULL : &aug_ops[k];
}

const char *sf_aug_kind_name(sf_aug_kind k)
{
    const aug_op_info *row = op_row(k);
    return row ? row->name : "unknown";
}

int sf_aug_mix_op(const sf_aug_pipeline *p)
{
    for (int k = 0; k < p->n_ops; k++) {
        const aug_op_info *row = op_row(p->ops[k].kind);
        if (row && row->stage == AUG_STAGE_MIX)
            return k;
    }
    return -1;
}

static sf_aug_pw *emit_pw(aug_walk *a)
{
    sf_aug_plan *plan = a->plan;
    const int post = a->row->stage == AUG_STAGE_POST || a->post_at >= 0;
    sf_aug_pw *pw = post ? &plan->post[plan->n_post++] : &plan->pw[plan->n_pw++];
    pw->kind = a->row->pw;
    return pw;
}

/* ---- parsing ------------------------------------------------------------ */

/* The allowed keys of a row: "op" and its fields'. */
static int check_fields(const cJSON *o, const aug_field *fields, const char *what, char *err, size_t errlen)
{
    for (const cJSON *it = o->child; it; it = it->next) {
        int ok = it->string && strcmp(it->string, "op") == 0;
        for (const aug_field *f = fields; f->key && !ok; f++)
            ok = it->string && strcmp(it->string, f->key) == 0;
        if (!ok) {
            sf_errf(err, errlen, "%s: unknown field \"%.40s\"", what, it->string ? it->string : "");
            return -1;
        }
    }
    return 0;
}

/* The bounds of the AF_LATE ranges read so far. */
static int check_late(const aug_field *const *late, int *n_late, sf_aug_op *op, const char *what, char *err,
                      size_t errlen)
{
    for (int k = 0; k < *n_late; k++)
        if (!range_in_bounds(late[k], op)) {
            bounds_err(late[k], what, err, errlen);
            return -1;
        }
    *n_late = 0;
    return 0;
}

static int parse_op(const cJSON *jo, int idx, sf_aug_op *op, char *err, size_t errlen)
{
    char what[64];
    memset(op, 0, sizeof *op);
    if (!cJSON_IsObject(jo)) {
        sf_errf(err, errlen, "aug op %d: must be an object", idx);
        return -1;
    }
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(jo, "op");
    if (!cJSON_IsString(jn)) {
        sf_errf(err, errlen, "aug op %d: missing string \"op\"", idx);
        return -1;
    }
    int kind = -1;
    for (int k = 0; k < SF_AUG_KIND_COUNT; k++)
        if (strcmp(jn->valuestring, aug_ops[k].name) == 0)
            kind = k;
    if (kind < 0) {
        sf_errf(err, errlen, "aug op %d (%.40s): unknown op", idx, jn->valuestring);
        return -1;
    }
    const aug_op_info *row = &aug_ops[kind];
    op->kind = (sf_aug_kind)kind;
    snprintf(what, sizeof what, "aug op %d (%s)", idx, row->name);
    if (check_fields(jo, row->fields, what, err, errlen))
        return -1;
    field_defaults(row->fields, op);
    int counts[8] = {0};
    const aug_field *late[4];
    int n_late = 0;
    for (int k = 0; row->fields[k].key; k++) {
        const aug_field *f = &row->fields[k];
        if (!(f->flags & AF_LATE) && check_late(late, &n_late, op, what, err, errlen))
            return -1;
        if (read_field(jo, f, op, &counts[k], what, err, errlen) < 0)
            return -1;
        if (f->flags & AF_LATE)
            late[n_late++] = f;
    }
    if (check_late(late, &n_late, op, what, err, errlen))
        return -1;
    return row->check ? row->check(op, counts, what, err, errlen) : 0;
}

int sf_aug_parse(const char *json, sf_aug_pipeline *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (!json) {
        sf_errf(err, errlen, "augmentation list missing");
        return -1;
    }
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        sf_errf(err, errlen, "augmentation list is not valid JSON");
        return -1;
    }
    int rc = -1;
    if (!cJSON_IsArray(root)) {
        sf_errf(err, errlen, "augmentation list must be a JSON array");
        goto out;
    }
    int n = cJSON_GetArraySize(root);
    if (n > SF_AUG_MAX_OPS) {
        sf_errf(err, errlen, "augmentation list has %d ops (at most %d)", n, SF_AUG_MAX_OPS);
        goto out;
    }
    int i = 0;
    for (const cJSON *it = root->child; it; it = it->next, i++)
        if (parse_op(it, i, &p->ops[i], err, errlen) != 0)
            goto out;
    p->n_ops = n;
    rc = 0;
out:
    cJSON_Delete(root);
    if (rc != 0)
        memset(p, 0, sizeof *p);
    return rc;
}


/* ---- plan --------------------------------------------------------------- */

/* Walks the list for an in_h x in_w source, or for ragged sources when
 * in_h = in_w = 0: then h = w = 0 stands for "each sample's own size" until an
 * op fixes the size. The order rules that hold for every op are here; each
 * op's own rule is its row's plan hook. */
static int plan_walk(const sf_aug_pipeline *p, int in_h, int in_w, int c, sf_aug_plan *plan,
                     char *err, size_t errlen)
{
    memset(plan, 0, sizeof *plan);
    const int ragged = in_h == 0 && in_w == 0;
    if ((!ragged && (in_h < 1 || in_w < 1 || in_h > SF_AUG_MAX_DIM || in_w > SF_AUG_MAX_DIM)) ||
        c < 1 || c > SF_AUG_MAX_C) {
        sf_errf(err, errlen, "augmentation input %dx%dx%d out of range (H,W in [1,%d], C in [1,%d])",
                in_h, in_w, c, SF_AUG_MAX_DIM, SF_AUG_MAX_C);
        return -1;
    }
    if (p->n_ops < 0 || p->n_ops > SF_AUG_MAX_OPS) {
        sf_errf(err, errlen, "augmentation list has %d ops (at most %d)", p->n_ops, SF_AUG_MAX_OPS);
        return -1;
    }
    plan->in_h = in_h;
    plan->in_w = in_w;
    plan->c = c;
    plan->ragged = ragged;
    plan->has_geom = ragged; /* ragged sources always need the map */
    plan->interp = SF_INTERP_BILINEAR;
    aug_walk a = {.p = p, .plan = plan, .err = err, .errlen = errlen, .c = c, .h = in_h, .w = in_w,
                  .blur_at = -1, .scl_x = 1.0, .scl_y = 1.0, .value_scale = 1.0f, .post_at = -1,
                  .mix_at = -1, .jitter_at = -1, .erase_at = -1};
    char what[64];

    for (int i = 0; i < p->n_ops; i++) {
        const sf_aug_op *op = &p->ops[i];
        const aug_op_info *row = op_row(op->kind);
        const char *name = sf_aug_kind_name(op->kind);
        if (row && row->stage == AUG_STAGE_GEOM)
            plan->has_geom = 1;
        if (a.mix_at >= 0 && !(row && row->stage == AUG_STAGE_MIX)) {
            sf_errf(err, errlen, "aug op %d (%s): batch-level %s (op %d) must come last", i, name,
                    sf_aug_kind_name(p->ops[a.mix_at].kind), a.mix_at);
            return -1;
        }
        if (a.post_at >= 0 && row && row->first_pass) {
            sf_errf(err, errlen, "aug op %d (%s): must come before %s (op %d), which acts on the "
                    "geometric output", i, name, sf_aug_kind_name(p->ops[a.post_at].kind), a.post_at);
            return -1;
        }
        if (!row) {
            sf_errf(err, errlen, "aug op %d: unknown kind %d", i, (int)op->kind);
            return -1;
        }
        snprintf(what, sizeof what, "aug op %d (%s)", i, name);
        a.row = row;
        a.i = i;
        a.what = what;
        if (row->stage == AUG_STAGE_POST && a.post_at < 0)
            a.post_at = i;
        if (row->plan && row->plan(&a, op))
            return -1;
    }
    if (a.h == 0) {
        sf_errf(err, errlen, "ragged sources need a resize, random_resized_crop or center_crop that "
                "fixes the output size; the augmentation list has none");
        return -1;
    }
    plan->out_h = a.h;
    plan->out_w = a.w;
    /* Where no axis can shrink the filter is bilinear with clamped taps: the
     * plain path computes the same function faster. */
    plan->antialias = a.want_aa && plan->interp == SF_INTERP_BILINEAR &&
                      (a.may_shrink || a.scl_x > 1.0 || a.scl_y > 1.0);
    return 0;
}

int sf_aug_plan_make(const sf_aug_pipeline *p, int in_h, int in_w, int c, sf_aug_plan *plan,
                     char *err, size_t errlen)
{
    if (in_h == 0 && in_w == 0) { /* plan_walk's ragged marker is not a size */
        memset(plan, 0, sizeof *plan);
        sf_errf(err, errlen, "augmentation input %dx%dx%d out of range (H,W in [1,%d], C in [1,%d])",
                in_h, in_w, c, SF_AUG_MAX_DIM, SF_AUG_MAX_C);
        return -1;
    }
    return plan_walk(p, in_h, in_w, c, plan, err, errlen);
}

int sf_aug_plan_make_ragged(const sf_aug_pipeline *p, int c, sf_aug_plan *plan, char *err,
                            size_t errlen)
{
    return plan_walk(p, 0, 0, c, plan, err, errlen);
}

/* The parameters of sample i, whose source is src_h x src_w at byte src_off:
 * each op's row draws its part, then the composed map is written out. */
static void gen_one(const sf_aug_pipeline *p, const sf_aug_plan *plan, uint64_t seed,
                    uint64_t seq, int i, int src_h, int src_w, size_t src_off, sf_aug_sample *s)
{
    memset(s, 0, sizeof *s); /* plan->antialias reads aa only when set below */
    s->src_h = src_h;
    s->src_w = src_w;
    s->src_off = src_off;
    s->clip[2] = src_w - 1;
    s->clip[3] = src_h - 1;
    aug_gen g = {.seed = seed, .seq = seq, .i = i, .plan = plan, .s = s, .m = {1, 0, 0, 0, 1, 0},
                 .mr = {1, 0, 0, 0, 1, 0}, .clip_live = 1, .h = src_h, .w = src_w};

    for (int k = 0; k < p->n_ops; k++) {
        const aug_op_info *row = op_row(p->ops[k].kind);
        if (row && row->gen)
            row->gen(&g, &p->ops[k], k);
    }
    const double *m = g.m, *mr = g.mr;
    for (int j = 0; j < 6; j++)
        s->inv[j] = (float)m[j];
    /* Pixel indices in, centres at integers out: the +0.5 of the output
     * centres and the -0.5 of the source's folded into the constant terms. */
    s->map[0] = (float)m[0];
    s->map[1] = (float)m[1];
    s->map[2] = (float)(m[2] + 0.5 * (m[0] + m[1]) - 0.5);
    s->map[3] = (float)m[3];
    s->map[4] = (float)m[4];
    s->map[5] = (float)(m[5] + 0.5 * (m[3] + m[4]) - 0.5);
    if (plan->has_rot) {
        /* The rotation's input is the source through mr's per-axis inverse. */
        s->rmap[0] = (float)(m[0] / mr[0]);
        s->rmap[1] = (float)(m[1] / mr[0]);
        s->rmap[2] = (float)((m[2] + 0.5 * (m[0] + m[1]) - mr[2]) / mr[0] - 0.5);
        s->rmap[3] = (float)(m[3] / mr[4]);
        s->rmap[4] = (float)(m[4] / mr[4]);
        s->rmap[5] = (float)((m[5] + 0.5 * (m[3] + m[4]) - mr[5]) / mr[4] - 0.5);
    }
    if (plan->antialias && !plan->has_rot) {
        /* Source pixels per output pixel along each source axis. */
        s->aa[0] = (float)fmax(1.0, hypot(m[0], m[1]));
        s->aa[1] = (float)fmax(1.0, hypot(m[3], m[4]));
    }
    s->mask_seed = sf_hash4(seed, seq, (uint64_t)i, SF_AUG_MASK_KEY);
}

void sf_aug_gen(const sf_aug_pipeline *p, const sf_aug_plan *plan, uint64_t seed, uint64_t seq,
                int n, sf_aug_sample *out)
{
    const size_t in_sz = (size_t)plan->c * plan->in_h * plan->in_w;
    for (int i = 0; i < n; i++)
        gen_one(p, plan, seed, seq, i, plan->in_h, plan->in_w, in_sz * (size_t)i, &out[i]);
}

void sf_aug_gen_ragged(const sf_aug_pipeline *p, const sf_aug_plan *plan, uint64_t seed,
                       uint64_t seq, int n, const int *src_hw, sf_aug_sample *out)
{
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const int h = src_hw[2 * i], w = src_hw[2 * i + 1];
        gen_one(p, plan, seed, seq, i, h, w, off, &out[i]);
        off += (size_t)plan->c * (size_t)h * (size_t)w;
    }
}
