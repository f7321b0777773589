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
 * Batch-level (sf_aug_gen_mix): doubles u_k from sf_hash4(seed, seq,
 *   SF_AUG_MIX_KEY, k): u_0 picks mixup or cutmix when both are listed, u_1 < p
 *   applies it, u_2, u_3 the cutmix centre, u_16 on the gamma variates.
 */
#include "gpu/common.h"
#include "aug.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "rng.h"

#define SF_AUG_MASK_KEY 0x4D41534Bull /* "MASK" */
#define SF_AUG_RRC_KEY 0x52524321ull  /* "RRC!" */
#define SF_AUG_ERASE_KEY 0x45524153ull /* "ERAS" */
#define SF_AUG_MIX_KEY 0x4D495855ull   /* "MIXU" */
#define SF_AUG_MAX_DIM 16384          /* largest image side, source or output */
#define SF_AUG_MAX_DILATE 32

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif



static const char *const kind_names[SF_AUG_KIND_COUNT] = {
    [SF_AUG_RANDOM_CROP] = "random_crop",
    [SF_AUG_RESIZE] = "resize",
    [SF_AUG_RANDOM_ROTATION] = "random_rotation",
    [SF_AUG_HFLIP] = "horizontal_flip",
    [SF_AUG_GAUSSIAN_BLUR] = "gaussian_blur",
    [SF_AUG_NORMALIZE] = "normalize",
    [SF_AUG_COLOR_CONVERT] = "color_convert",
    [SF_AUG_RANDOM_MASK] = "random_mask",
    [SF_AUG_TO_DTYPE] = "to_dtype",
    [SF_AUG_RANDOM_RESIZED_CROP] = "random_resized_crop",
    [SF_AUG_CENTER_CROP] = "center_crop",
    [SF_AUG_COLOR_JITTER] = "color_jitter",
    [SF_AUG_RANDOM_ERASING] = "random_erasing",
    [SF_AUG_MIXUP] = "mixup",
    [SF_AUG_CUTMIX] = "cutmix",
};

const char *sf_aug_kind_name(sf_aug_kind k)
{
    if ((int)k < 0 || k >= SF_AUG_KIND_COUNT)
        return "unknown";
    return kind_names[k];
}

int sf_aug_mix_op(const sf_aug_pipeline *p)
{
    for (int k = 0; k < p->n_ops; k++)
        if (p->ops[k].kind == SF_AUG_MIXUP || p->ops[k].kind == SF_AUG_CUTMIX)
            return k;
    return -1;
}

static int is_geom(sf_aug_kind k)
{
    return k == SF_AUG_RANDOM_CROP || k == SF_AUG_RESIZE || k == SF_AUG_RANDOM_ROTATION ||
           k == SF_AUG_HFLIP || k == SF_AUG_RANDOM_RESIZED_CROP || k == SF_AUG_CENTER_CROP;
}

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

/* An optional probability "p" in [0,1]; *p keeps its default when absent. */
static int get_p(const cJSON *o, float *p, const char *what, char *err, size_t errlen)
{
    double d;
    int r = get_num(o, "p", &d, what, err, errlen);
    if (r == 1 && (d < 0.0 || d > 1.0)) {
        sf_errf(err, errlen, "%s: \"p\" must lie in [0,1]", what);
        return -1;
    }
    if (r == 1)
        *p = (float)d;
    return r < 0 ? -1 : 0;
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

/* random_resized_crop's and random_erasing's "scale" (area fraction, in
 * (0,1]) and "ratio" (aspect, in [0.001,1000]) ranges, over the defaults
 * already in op. */
static int parse_scale_ratio(const cJSON *jo, sf_aug_op *op, const char *what, char *err, size_t errlen)
{
    if (cJSON_GetObjectItemCaseSensitive(jo, "scale") &&
        get_range(jo, "scale", 0, &op->area_min, &op->area_max, what, err, errlen))
        return -1;
    if (cJSON_GetObjectItemCaseSensitive(jo, "ratio") &&
        get_range(jo, "ratio", 0, &op->aspect_min, &op->aspect_max, what, err, errlen))
        return -1;
    if (!(op->area_min > 0.0f) || op->area_max > 1.0f) {
        sf_errf(err, errlen, "%s: \"scale\" must lie in (0,1]", what);
        return -1;
    }
    if (!(op->aspect_min >= 1e-3f) || op->aspect_max > 1e3f) {
        sf_errf(err, errlen, "%s: \"ratio\" must lie in [0.001,1000]", what);
        return -1;
    }
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

static int check_keys(const cJSON *o, const char *const *allowed, const char *what, char *err,
                      size_t errlen)
{
    for (const cJSON *it = o->child; it; it = it->next) {
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = it->string && strcmp(it->string, *a) == 0;
        if (!ok) {
            sf_errf(err, errlen, "%s: unknown field \"%.40s\"", what, it->string ? it->string : "");
            return -1;
        }
    }
    return 0;
}

/* "antialias": a boolean, true when absent (torchvision v2's default). */
static int get_antialias(const cJSON *o, int *out, const char *what, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "antialias");
    if (v && !cJSON_IsBool(v)) {
        sf_errf(err, errlen, "%s: \"antialias\" must be true or false", what);
        return -1;
    }
    *out = !v || cJSON_IsTrue(v);
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
        if (strcmp(jn->valuestring, kind_names[k]) == 0)
            kind = k;
    if (kind < 0) {
        sf_errf(err, errlen, "aug op %d (%.40s): unknown op", idx, jn->valuestring);
        return -1;
    }
    op->kind = (sf_aug_kind)kind;
    snprintf(what, sizeof what, "aug op %d (%s)", idx, kind_names[kind]);
    double d;
    int r;

    switch (op->kind) {
    case SF_AUG_RANDOM_CROP: {
        static const char *const keys[] = {"op", "size", NULL};
        if (check_keys(jo, keys, what, err, errlen) || get_size(jo, 1, &op->size_h, &op->size_w, what, err, errlen))
            return -1;
        break;
    }
    case SF_AUG_RESIZE: {
        static const char *const keys[] = {"op", "size", "antialias", NULL};
        if (check_keys(jo, keys, what, err, errlen) || get_size(jo, 0, &op->size_h, &op->size_w, what, err, errlen))
            return -1;
        if (get_antialias(jo, &op->antialias, what, err, errlen))
            return -1;
        break;
    }
    case SF_AUG_CENTER_CROP: {
        static const char *const keys[] = {"op", "size", NULL};
        if (check_keys(jo, keys, what, err, errlen) || get_size(jo, 1, &op->size_h, &op->size_w, what, err, errlen))
            return -1;
        break;
    }
    case SF_AUG_RANDOM_RESIZED_CROP: {
        static const char *const keys[] = {"op", "size", "scale", "ratio", "antialias", NULL};
        if (check_keys(jo, keys, what, err, errlen) || get_size(jo, 1, &op->size_h, &op->size_w, what, err, errlen) ||
            get_antialias(jo, &op->antialias, what, err, errlen))
            return -1;
        op->area_min = 0.08f; /* torchvision's defaults */
        op->area_max = 1.0f;
        op->aspect_min = 3.0f / 4.0f;
        op->aspect_max = 4.0f / 3.0f;
        if (parse_scale_ratio(jo, op, what, err, errlen))
            return -1;
        break;
    }
    case SF_AUG_RANDOM_ROTATION: {
        static const char *const keys[] = {"op", "degrees", "interpolation", "fill", NULL};
        if (check_keys(jo, keys, what, err, errlen) ||
            get_range(jo, "degrees", 1, &op->deg_min, &op->deg_max, what, err, errlen))
            return -1;
        if (op->deg_min < -3600.0f || op->deg_max > 3600.0f) {
            sf_errf(err, errlen, "%s: \"degrees\" must lie in [-3600,3600]", what);
            return -1;
        }
        op->interp = SF_INTERP_BILINEAR;
        const cJSON *ji = cJSON_GetObjectItemCaseSensitive(jo, "interpolation");
        if (ji) {
            if (cJSON_IsString(ji) && str_ieq(ji->valuestring, "bilinear"))
                op->interp = SF_INTERP_BILINEAR;
            else if (cJSON_IsString(ji) && str_ieq(ji->valuestring, "nearest"))
                op->interp = SF_INTERP_NEAREST;
            else {
                sf_errf(err, errlen, "%s: \"interpolation\" must be \"bilinear\" or \"nearest\"", what);
                return -1;
            }
        }
        if ((r = get_num(jo, "fill", &d, what, err, errlen)) < 0)
            return -1;
        if (r == 1 && d != 0.0) {
            sf_errf(err, errlen, "%s: only \"fill\": 0 is supported", what);
            return -1;
        }
        break;
    }
    case SF_AUG_HFLIP: {
        static const char *const keys[] = {"op", "p", NULL};
        if (check_keys(jo, keys, what, err, errlen))
            return -1;
        op->p = 0.5f;
        if (get_p(jo, &op->p, what, err, errlen))
            return -1;
        break;
    }
    case SF_AUG_GAUSSIAN_BLUR: {
        static const char *const keys[] = {"op", "kernel_size", "sigma", NULL};
        if (check_keys(jo, keys, what, err, errlen))
            return -1;
        double kk[2];
        if (num_pair(cJSON_GetObjectItemCaseSensitive(jo, "kernel_size"), 1, kk))
            kk[0] = kk[1] = -1;
        const double k0 = kk[0];
        if (kk[0] != kk[1] || !is_int_in(k0, 1, SF_AUG_MAX_KSIZE) || ((int)k0 % 2) == 0) {
            sf_errf(err, errlen, "%s: \"kernel_size\" must be an odd integer in [1,%d] (or [k,k])", what,
                    SF_AUG_MAX_KSIZE);
            return -1;
        }
        op->ksize = (int)k0;
        op->sigma_min = 0.1f;
        op->sigma_max = 2.0f; /* torchvision's default */
        if (cJSON_GetObjectItemCaseSensitive(jo, "sigma") &&
            get_range(jo, "sigma", 0, &op->sigma_min, &op->sigma_max, what, err, errlen))
            return -1;
        if (!(op->sigma_min > 0.0f) || op->sigma_max > 1000.0f) {
            sf_errf(err, errlen, "%s: \"sigma\" must lie in (0,1000]", what);
            return -1;
        }
        break;
    }
    case SF_AUG_NORMALIZE: {
        static const char *const keys[] = {"op", "mean", "std", "inplace", NULL};
        if (check_keys(jo, keys, what, err, errlen))
            return -1;
        int nm = get_vec(jo, "mean", op->mean, what, err, errlen);
        if (nm < 0)
            return -1;
        int ns = get_vec(jo, "std", op->std, what, err, errlen);
        if (ns < 0)
            return -1;
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
        /* |std| >= 1e-6: a smaller one scales a 0..255 value past what fp32
         * and bf16 hold (1e-38 gave infinities and only skipped steps) */
        for (int i = 0; i < op->n_mean; i++)
            if (!(fabsf(op->std[i]) >= 1e-6f)) {
                sf_errf(err, errlen, "%s: \"std\"[%d] must be at least 1e-6 in magnitude", what, i);
                return -1;
            }
        break;
    }
    case SF_AUG_COLOR_CONVERT: {
        static const char *const keys[] = {"op", "to", "from", NULL};
        if (check_keys(jo, keys, what, err, errlen))
            return -1;
        const cJSON *jt = cJSON_GetObjectItemCaseSensitive(jo, "to");
        const cJSON *jf = cJSON_GetObjectItemCaseSensitive(jo, "from");
        if (jt && !(cJSON_IsString(jt) && str_ieq(jt->valuestring, "ycbcr"))) {
            sf_errf(err, errlen, "%s: only \"to\": \"ycbcr\" is supported", what);
            return -1;
        }
        if (jf && !(cJSON_IsString(jf) && str_ieq(jf->valuestring, "rgb"))) {
            sf_errf(err, errlen, "%s: only \"from\": \"rgb\" is supported", what);
            return -1;
        }
        break;
    }
    case SF_AUG_RANDOM_MASK: {
        static const char *const keys[] = {"op", "ratio", "dilate", NULL};
        if (check_keys(jo, keys, what, err, errlen))
            return -1;
        if ((r = get_num(jo, "ratio", &d, what, err, errlen)) <= 0 || d < 0.0 || d > 1.0) {
            if (r >= 0)
                sf_errf(err, errlen, "%s: \"ratio\" must be a number in [0,1]", what);
            return -1;
        }
        op->ratio = (float)d;
        op->dilate = 0;
        if ((r = get_num(jo, "dilate", &d, what, err, errlen)) < 0)
            return -1;
        if (r == 1) {
            if (!is_int_in(d, 0, SF_AUG_MAX_DILATE)) {
                sf_errf(err, errlen, "%s: \"dilate\" must be an integer in [0,%d]", what, SF_AUG_MAX_DILATE);
                return -1;
            }
            op->dilate = (int)d;
        }
        break;
    }
    case SF_AUG_TO_DTYPE: {
        static const char *const keys[] = {"op", "dtype", "scale", NULL};
        if (check_keys(jo, keys, what, err, errlen))
            return -1;
        const cJSON *jd = cJSON_GetObjectItemCaseSensitive(jo, "dtype");
        if (jd && !(cJSON_IsString(jd) && strcmp(jd->valuestring, "float32") == 0)) {
            sf_errf(err, errlen, "%s: only \"dtype\": \"float32\" is supported", what);
            return -1;
        }
        op->scale = 1.0f;
        if ((r = get_num(jo, "scale", &d, what, err, errlen)) < 0)
            return -1;
        if (r == 1)
            op->scale = (float)d;
        break;
    }
    case SF_AUG_COLOR_JITTER: {
        static const char *const keys[] = {"op", "brightness", "contrast", "saturation", "hue", NULL};
        static const char *const names[4] = {"brightness", "contrast", "saturation", "hue"};
        if (check_keys(jo, keys, what, err, errlen))
            return -1;
        for (int k = 0; k < 4; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(jo, names[k]);
            if (!v || cJSON_IsNull(v))
                continue;
            const double centre = k == 3 ? 0.0 : 1.0;
            double lo, hi;
            if (cJSON_IsNumber(v)) {
                /* torchvision's _check_input: x means [centre - x, centre + x],
                 * the factors' lower end clipped at 0. */
                if (!isfinite(v->valuedouble) || v->valuedouble < 0.0) {
                    sf_errf(err, errlen, "%s: \"%s\" as one number must be finite and >= 0", what, names[k]);
                    return -1;
                }
                lo = centre - v->valuedouble;
                hi = centre + v->valuedouble;
                if (k < 3 && lo < 0.0)
                    lo = 0.0;
            } else {
                float flo, fhi;
                if (get_range(jo, names[k], 0, &flo, &fhi, what, err, errlen))
                    return -1;
                lo = flo;
                hi = fhi;
            }
            const double bmin = k == 3 ? -0.5 : 0.0, bmax = k == 3 ? 0.5 : 1e6;
            if (!(lo >= bmin && lo <= hi && hi <= bmax)) {
                sf_errf(err, errlen, "%s: \"%s\" must give %s with min <= max", what, names[k],
                        k == 3 ? "a shift in [-0.5,0.5]" : "factors in [0,1e6]");
                return -1;
            }
            op->jit_lo[k] = (float)lo;
            op->jit_hi[k] = (float)hi;
            op->jit_on[k] = !(lo == centre && hi == centre);
        }
        break;
    }
    case SF_AUG_RANDOM_ERASING: {
        static const char *const keys[] = {"op", "p", "scale", "ratio", "value", "inplace", NULL};
        if (check_keys(jo, keys, what, err, errlen))
            return -1;
        op->p = 0.5f; /* torchvision's defaults */
        op->area_min = 0.02f;
        op->area_max = 0.33f;
        op->aspect_min = 0.3f;
        op->aspect_max = 3.3f;
        if (get_p(jo, &op->p, what, err, errlen))
            return -1;
        if (parse_scale_ratio(jo, op, what, err, errlen))
            return -1;
        const cJSON *jv = cJSON_GetObjectItemCaseSensitive(jo, "value");
        op->n_erase_value = 1; /* value 0 */
        if (cJSON_IsString(jv)) {
            if (strcmp(jv->valuestring, "random") != 0) {
                sf_errf(err, errlen, "%s: \"value\" must be a number, [numbers] or \"random\"", what);
                return -1;
            }
            op->erase_random = 1;
        } else if (jv) {
            const int nv = get_vec(jo, "value", op->erase_value, what, err, errlen);
            if (nv < 0)
                return -1;
            op->n_erase_value = nv;
        }
        const cJSON *ji = cJSON_GetObjectItemCaseSensitive(jo, "inplace");
        if (ji && !cJSON_IsBool(ji)) {
            sf_errf(err, errlen, "%s: \"inplace\" must be true or false", what);
            return -1;
        }
        break;
    }
    case SF_AUG_MIXUP:
    case SF_AUG_CUTMIX: {
        static const char *const keys[] = {"op", "alpha", "p", NULL};
        if (check_keys(jo, keys, what, err, errlen))
            return -1;
        op->alpha = 1.0f; /* torchvision's default */
        op->p = 1.0f;     /* v2.MixUp / v2.CutMix always apply */
        if ((r = get_num(jo, "alpha", &d, what, err, errlen)) < 0)
            return -1;
        if (r == 1) {
            if (!(d > 0.0 && d <= 1000.0)) {
                sf_errf(err, errlen, "%s: \"alpha\" must lie in (0,1000]", what);
                return -1;
            }
            op->alpha = (float)d;
        }
        if (get_p(jo, &op->p, what, err, errlen))
            return -1;
        break;
    }
    default:
        sf_errf(err, errlen, "%s: unknown op", what);
        return -1;
    }
    return 0;
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

/* The next pointwise stage: of the fused pass, or of the second pass. */
static sf_aug_pw *next_pw(sf_aug_plan *plan, int post)
{
    return post ? &plan->post[plan->n_post++] : &plan->pw[plan->n_pw++];
}

/* Walks the list for an in_h x in_w source, or for ragged sources when
 * in_h = in_w = 0: then h = w = 0 stands for "each sample's own size" until an
 * op fixes the size. */
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
    int h = in_h, w = in_w;
    int blur_at = -1;
    /* Antialias: whether some axis may shrink. scl_* bound the source pixels per
     * pixel of the current image; unknown once a ragged source is resized, and
     * random_resized_crop's scale is random. */
    double scl_x = 1.0, scl_y = 1.0;
    int may_shrink = 0, want_aa = 0;
    float value_scale = 1.0f; /* product of to_dtype scales so far (for YCbCr's offset) */
    /* The first color_jitter or random_erasing (later stages run in the second
     * pass), the first mixup or cutmix (only the other may follow it), and
     * whether the values left the intensity scale (normalize, color_convert). */
    int post_at = -1, mix_at = -1, jitter_at = -1, erase_at = -1, not_intensity = 0;

    for (int i = 0; i < p->n_ops; i++) {
        const sf_aug_op *op = &p->ops[i];
        const char *name = sf_aug_kind_name(op->kind);
        if (is_geom(op->kind))
            plan->has_geom = 1;
        if (mix_at >= 0 && op->kind != SF_AUG_MIXUP && op->kind != SF_AUG_CUTMIX) {
            sf_errf(err, errlen, "aug op %d (%s): batch-level %s (op %d) must come last", i, name,
                    sf_aug_kind_name(p->ops[mix_at].kind), mix_at);
            return -1;
        }
        if (post_at >= 0 && (is_geom(op->kind) || op->kind == SF_AUG_GAUSSIAN_BLUR ||
                             op->kind == SF_AUG_RANDOM_MASK)) {
            sf_errf(err, errlen, "aug op %d (%s): must come before %s (op %d), which acts on the "
                    "geometric output", i, name, sf_aug_kind_name(p->ops[post_at].kind), post_at);
            return -1;
        }
        switch (op->kind) {
        case SF_AUG_RANDOM_CROP:
            if (h == 0) {
                sf_errf(err, errlen, "aug op %d (%s): ragged sources have no fixed size to crop from; "
                        "put a resize, random_resized_crop or center_crop before it", i, name);
                return -1;
            }
            if (op->size_h < 1 || op->size_w < 1 || op->size_h > h || op->size_w > w) {
                sf_errf(err, errlen, "aug op %d (%s): crop %dx%d does not fit its %dx%d input", i, name,
                        op->size_h, op->size_w, h, w);
                return -1;
            }
            h = op->size_h;
            w = op->size_w;
            break;
        case SF_AUG_CENTER_CROP:
            /* On a ragged source it fixes the size; a smaller sample repeats its
             * edges (gpu/aug.h). */
            if (op->size_h < 1 || op->size_w < 1 || op->size_h > SF_AUG_MAX_DIM ||
                op->size_w > SF_AUG_MAX_DIM || (h > 0 && (op->size_h > h || op->size_w > w))) {
                sf_errf(err, errlen, "aug op %d (%s): crop %dx%d does not fit its %dx%d input", i, name,
                        op->size_h, op->size_w, h, w);
                return -1;
            }
            h = op->size_h;
            w = op->size_w;
            break;
        case SF_AUG_RESIZE:
        case SF_AUG_RANDOM_RESIZED_CROP:
            if (op->size_h < 1 || op->size_w < 1 || op->size_h > SF_AUG_MAX_DIM ||
                op->size_w > SF_AUG_MAX_DIM) {
                sf_errf(err, errlen, "aug op %d (%s): size %dx%d out of range [1,%d]", i, name,
                        op->size_h, op->size_w, SF_AUG_MAX_DIM);
                return -1;
            }
            if (op->kind == SF_AUG_RANDOM_RESIZED_CROP &&
                (!(op->area_min > 0.0f) || op->area_min > op->area_max || !(op->aspect_min > 0.0f) ||
                 op->aspect_min > op->aspect_max)) {
                sf_errf(err, errlen, "aug op %d (%s): scale [%g,%g] / ratio [%g,%g] invalid", i, name,
                        (double)op->area_min, (double)op->area_max, (double)op->aspect_min,
                        (double)op->aspect_max);
                return -1;
            }
            want_aa |= op->antialias;
            if (h == 0 || op->kind == SF_AUG_RANDOM_RESIZED_CROP) {
                may_shrink = 1;
            } else {
                scl_x *= (double)w / op->size_w;
                scl_y *= (double)h / op->size_h;
            }
            h = op->size_h;
            w = op->size_w;
            break;
        case SF_AUG_RANDOM_ROTATION:
            if (plan->has_rot) {
                sf_errf(err, errlen, "aug op %d (%s): only one random_rotation per pipeline", i, name);
                return -1;
            }
            plan->has_rot = 1;
            if (op->interp == SF_INTERP_NEAREST)
                plan->interp = SF_INTERP_NEAREST;
            /* A turned pixel grid spans up to the larger scale along either axis. */
            scl_x = scl_y = scl_x > scl_y ? scl_x : scl_y;
            break;
        case SF_AUG_HFLIP:
            break;
        case SF_AUG_GAUSSIAN_BLUR:
            if (blur_at >= 0) {
                sf_errf(err, errlen, "aug op %d (%s): only one gaussian_blur per pipeline (op %d is one)",
                        i, name, blur_at);
                return -1;
            }
            if (op->ksize < 1 || op->ksize > SF_AUG_MAX_KSIZE || op->ksize % 2 == 0 ||
                !(op->sigma_min > 0.0f) || op->sigma_min > op->sigma_max) {
                sf_errf(err, errlen, "aug op %d (%s): kernel_size %d / sigma [%g,%g] invalid", i, name,
                        op->ksize, (double)op->sigma_min, (double)op->sigma_max);
                return -1;
            }
            if (plan->has_mask) {
                sf_errf(err, errlen, "aug op %d (%s): random_mask must come after gaussian_blur "
                        "(a mask does not commute with a blur)", i, name);
                return -1;
            }
            blur_at = i;
            plan->blur_ksize = op->ksize;
            break;
        case SF_AUG_TO_DTYPE: {
            value_scale *= op->scale;
            /* A scale of 1 changes no value (x * 1 == x, NaN and -0 included):
             * no stage, so that no pass spends a multiply on it. */
            if (op->scale == 1.0f)
                break;
            sf_aug_pw *pw = next_pw(plan, post_at >= 0);
            pw->kind = SF_PW_SCALE;
            pw->a[0] = op->scale;
            break;
        }
        case SF_AUG_NORMALIZE: {
            if (op->n_mean != 1 && op->n_mean != c) {
                sf_errf(err, errlen, "aug op %d (%s): %d mean/std values for %d channels", i, name,
                        op->n_mean, c);
                return -1;
            }
            sf_aug_pw nz = {.kind = SF_PW_NORMALIZE};
            int identity = 1;
            not_intensity = 1;
            for (int ch = 0; ch < c; ch++) {
                int j = op->n_mean == 1 ? 0 : ch;
                if (!(op->std[j] != 0.0f)) {
                    sf_errf(err, errlen, "aug op %d (%s): std[%d] is 0", i, name, j);
                    return -1;
                }
                nz.a[ch] = op->mean[j];
                nz.b[ch] = 1.0f / op->std[j];
                identity = identity && nz.a[ch] == 0.0f && nz.b[ch] == 1.0f;
            }
            /* Mean 0 and std 1 change no value ((x - 0) * 1 == x): no stage. */
            if (!identity)
                *next_pw(plan, post_at >= 0) = nz;
            break;
        }
        case SF_AUG_COLOR_CONVERT: {
            if (c != 3) {
                sf_errf(err, errlen, "aug op %d (%s): RGB->YCbCr needs 3 channels, the input has %d", i,
                        name, c);
                return -1;
            }
            sf_aug_pw *pw = next_pw(plan, post_at >= 0);
            not_intensity = 1;
            pw->kind = SF_PW_YCBCR;
            /* Chroma offset: half the value range, 128 on the 0..255 scale,
             * times the to_dtype scales applied before this op. */
            pw->a[0] = 128.0f * value_scale;
            break;
        }
        case SF_AUG_RANDOM_MASK: {
            if (plan->has_mask) {
                sf_errf(err, errlen, "aug op %d (%s): only one random_mask per pipeline", i, name);
                return -1;
            }
            if (!(op->ratio >= 0.0f && op->ratio <= 1.0f) || op->dilate < 0 ||
                op->dilate > SF_AUG_MAX_DILATE) {
                sf_errf(err, errlen, "aug op %d (%s): ratio %g / dilate %d out of range", i, name,
                        (double)op->ratio, op->dilate);
                return -1;
            }
            sf_aug_pw *pw = next_pw(plan, post_at >= 0);
            pw->kind = SF_PW_MASK;
            pw->a[0] = op->ratio;
            pw->b[0] = (float)op->dilate;
            plan->has_mask = 1;
            break;
        }
        case SF_AUG_COLOR_JITTER: {
            if (jitter_at >= 0) {
                sf_errf(err, errlen, "aug op %d (%s): only one color_jitter per pipeline (op %d is one)", i,
                        name, jitter_at);
                return -1;
            }
            if (c != 1 && c != 3) {
                sf_errf(err, errlen, "aug op %d (%s): needs 1 or 3 channels, the input has %d", i, name, c);
                return -1;
            }
            if (not_intensity || !(value_scale > 0.0f)) {
                sf_errf(err, errlen, "aug op %d (%s): must act on intensities: put it before normalize "
                        "and color_convert, after to_dtype scales > 0 only", i, name);
                return -1;
            }
            for (int k = 0; k < 4; k++)
                if (op->jit_on[k] && (k == 3 ? !(op->jit_lo[k] >= -0.5f && op->jit_hi[k] <= 0.5f)
                                             : !(op->jit_lo[k] >= 0.0f)) ) {
                    sf_errf(err, errlen, "aug op %d (%s): factor range %d invalid", i, name, k);
                    return -1;
                }
            jitter_at = i;
            if (post_at < 0)
                post_at = i;
            sf_aug_pw *pw = next_pw(plan, 1);
            pw->kind = SF_PW_JITTER;
            for (int k = 0; k < 4; k++)
                pw->a[k] = op->jit_on[k] ? 1.0f : 0.0f;
            /* The clamp bound: 255 on the 0..255 scale, times the to_dtype
             * scales before it (1 after to_dtype's 1/255, as torchvision's
             * float images). */
            pw->b[0] = 255.0f * value_scale;
            break;
        }
        case SF_AUG_RANDOM_ERASING: {
            if (erase_at >= 0) {
                sf_errf(err, errlen, "aug op %d (%s): only one random_erasing per pipeline (op %d is one)",
                        i, name, erase_at);
                return -1;
            }
            if (!op->erase_random && op->n_erase_value != 1 && op->n_erase_value != c) {
                sf_errf(err, errlen, "aug op %d (%s): %d values for %d channels", i, name,
                        op->n_erase_value, c);
                return -1;
            }
            if (!(op->p >= 0.0f && op->p <= 1.0f) || !(op->area_min > 0.0f) ||
                op->area_min > op->area_max || !(op->aspect_min > 0.0f) ||
                op->aspect_min > op->aspect_max) {
                sf_errf(err, errlen, "aug op %d (%s): p / scale / ratio invalid", i, name);
                return -1;
            }
            erase_at = i;
            if (post_at < 0)
                post_at = i;
            sf_aug_pw *pw = next_pw(plan, 1);
            pw->kind = SF_PW_ERASE;
            for (int ch = 0; ch < c; ch++)
                pw->a[ch] = op->erase_value[op->n_erase_value == 1 ? 0 : ch];
            pw->b[0] = op->erase_random ? 1.0f : 0.0f;
            break;
        }
        case SF_AUG_MIXUP:
        case SF_AUG_CUTMIX:
            for (int j = mix_at < 0 ? p->n_ops : mix_at; j < i; j++)
                if (p->ops[j].kind == op->kind) {
                    sf_errf(err, errlen, "aug op %d (%s): only one %s per pipeline (op %d is one)", i, name,
                            name, j);
                    return -1;
                }
            if (!(op->alpha > 0.0f) || !(op->p >= 0.0f && op->p <= 1.0f)) {
                sf_errf(err, errlen, "aug op %d (%s): alpha %g / p %g invalid", i, name, (double)op->alpha,
                        (double)op->p);
                return -1;
            }
            if (mix_at < 0)
                mix_at = i;
            plan->has_mix = 1;
            break;
        default:
            sf_errf(err, errlen, "aug op %d: unknown kind %d", i, (int)op->kind);
            return -1;
        }
    }
    if (h == 0) {
        sf_errf(err, errlen, "ragged sources need a resize, random_resized_crop or center_crop that "
                "fixes the output size; the augmentation list has none");
        return -1;
    }
    plan->out_h = h;
    plan->out_w = w;
    /* Where no axis can shrink the filter is bilinear with clamped taps: the
     * plain path computes the same function faster. */
    plan->antialias = want_aa && plan->interp == SF_INTERP_BILINEAR &&
                      (may_shrink || scl_x > 1.0 || scl_y > 1.0);
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

/* floor(u * (range + 1)) clamped to [0, range]: a uniform offset. */
static int offset_in(float u, int range)
{
    int v = (int)(u * (float)(range + 1));
    return v > range ? range : v < 0 ? 0 : v;
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
            *y0 = offset_in(draw_rrc(seed, seq, i, k, a, 2), h - th);
            *x0 = offset_in(draw_rrc(seed, seq, i, k, a, 3), w - tw);
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
        box[1] = offset_in(sf_u01(sf_hash4(key, (uint64_t)a, 2, SF_AUG_ERASE_KEY)), h - eh);
        box[0] = offset_in(sf_u01(sf_hash4(key, (uint64_t)a, 3, SF_AUG_ERASE_KEY)), w - ew);
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

/* The parameters of sample i, whose source is src_h x src_w at byte src_off. */
static void gen_one(const sf_aug_pipeline *p, const sf_aug_plan *plan, uint64_t seed,
                    uint64_t seq, int i, int src_h, int src_w, size_t src_off, sf_aug_sample *s)
{
    memset(s, 0, sizeof *s); /* plan->antialias reads aa only when set below */
    s->src_h = src_h;
    s->src_w = src_w;
    s->src_off = src_off;
    s->clip[2] = src_w - 1;
    s->clip[3] = src_h - 1;
    int clip_live = 1;
    double m[6] = {1, 0, 0, 0, 1, 0}; /* image k -> source, starting at k = 0 */
    double mr[6] = {1, 0, 0, 0, 1, 0}; /* the map at the rotation: its input -> source */
    int h = src_h, w = src_w;

    for (int k = 0; k < p->n_ops; k++) {
        const sf_aug_op *op = &p->ops[k];
        switch (op->kind) {
        case SF_AUG_RANDOM_CROP: {
            /* h >= size_h and w >= size_w: checked by the plan */
            const int y0 = offset_in(draw(seed, seq, i, k, 0), h - op->size_h);
            const int x0 = offset_in(draw(seed, seq, i, k, 1), w - op->size_w);
            crop_into(m, s->clip, clip_live, x0, y0, op->size_w, op->size_h, s);
            h = op->size_h;
            w = op->size_w;
            break;
        }
        case SF_AUG_CENTER_CROP:
            crop_into(m, s->clip, clip_live, center_offset(w, op->size_w), center_offset(h, op->size_h),
                      op->size_w, op->size_h, s);
            h = op->size_h;
            w = op->size_w;
            break;
        case SF_AUG_RANDOM_RESIZED_CROP: {
            int x0, y0, cw, ch;
            rrc_window(op, seed, seq, i, k, h, w, &x0, &y0, &cw, &ch);
            crop_into(m, s->clip, clip_live, x0, y0, cw, ch, s);
            const double t[6] = {(double)cw / op->size_w, 0, 0, 0, (double)ch / op->size_h, 0};
            affine_then(m, t);
            clip_live = 0;
            h = op->size_h;
            w = op->size_w;
            break;
        }
        case SF_AUG_RESIZE: {
            const double t[6] = {(double)w / op->size_w, 0, 0, 0, (double)h / op->size_h, 0};
            affine_then(m, t);
            clip_live = 0;
            h = op->size_h;
            w = op->size_w;
            break;
        }
        case SF_AUG_RANDOM_ROTATION: {
            /* The map so far only scales, translates and mirrors (one rotation
             * per list): kept to invert per axis for this image's coverage (rmap). */
            memcpy(mr, m, sizeof mr);
            s->pre[0] = (float)m[0];
            s->pre[1] = (float)m[2];
            s->pre[2] = (float)m[4];
            s->pre[3] = (float)m[5];
            s->rot_w = (float)w;
            s->rot_h = (float)h;
            /* Antialias filters the rotation's input image, as torchvision's
             * resize before its rotate: the supports are this map's scales. */
            s->aa[0] = (float)fmax(1.0, fabs(m[0]));
            s->aa[1] = (float)fmax(1.0, fabs(m[4]));
            clip_live = 0;
            float u = draw(seed, seq, i, k, 0);
            float ang = op->deg_min + u * (op->deg_max - op->deg_min);
            double a = (double)ang * (M_PI / 180.0);
            double ca = cos(a), sa = sin(a);
            double cx = w * 0.5, cy = h * 0.5;
            /* source = C + R (p - C), R = [ca, -sa; sa, ca] */
            const double t[6] = {ca, -sa, cx - ca * cx + sa * cy, sa, ca, cy - sa * cx - ca * cy};
            affine_then(m, t);
            s->angle_deg = ang;
            break;
        }
        case SF_AUG_HFLIP: {
            if (draw(seed, seq, i, k, 0) < op->p) {
                const double t[6] = {-1, 0, (double)w, 0, 1, 0};
                affine_then(m, t);
                s->flip ^= 1;
            }
            break;
        }
        case SF_AUG_GAUSSIAN_BLUR: {
            float u = draw(seed, seq, i, k, 0);
            float sigma = op->sigma_min + u * (op->sigma_max - op->sigma_min);
            s->sigma = sigma;
            /* torchvision _get_gaussian_kernel1d: x = -(k-1)/2 .. (k-1)/2,
             * pdf = exp(-0.5 (x/sigma)^2), normalised to sum 1. */
            double wsum = 0.0, wk[SF_AUG_MAX_KSIZE];
            int ks = op->ksize, half = (ks - 1) / 2;
            for (int j = 0; j < ks; j++) {
                double x = (double)(j - half) / sigma;
                wk[j] = exp(-0.5 * x * x);
                wsum += wk[j];
            }
            for (int j = 0; j < ks; j++)
                s->blur_w[j] = (float)(wk[j] / wsum);
            break;
        }
        case SF_AUG_COLOR_JITTER: {
            for (int f = 0; f < 4; f++) {
                const float u = draw(seed, seq, i, k, f);
                s->jitter[f] = op->jit_lo[f] + u * (op->jit_hi[f] - op->jit_lo[f]);
            }
            /* torchvision's randperm(4): a uniform permutation, here by
             * Fisher-Yates with draws 4..6. */
            for (int f = 0; f < 4; f++)
                s->jitter_order[f] = (uint8_t)f;
            for (int j = 3; j > 0; j--) {
                const int r = offset_in(draw(seed, seq, i, k, 7 - j), j);
                const uint8_t t = s->jitter_order[j];
                s->jitter_order[j] = s->jitter_order[r];
                s->jitter_order[r] = t;
            }
            break;
        }
        case SF_AUG_RANDOM_ERASING:
            if (draw(seed, seq, i, k, 0) < op->p)
                erase_window(op, seed, seq, i, k, plan->out_h, plan->out_w, s->erase);
            s->erase_seed = sf_hash4(seed, seq, (uint64_t)i, SF_AUG_ERASE_KEY);
            break;
        default:
            break; /* pointwise ops draw nothing here */
        }
    }
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

/* ---- batch-level mixing ------------------------------------------------- */

float sf_aug_mix_loss_lam(const sf_aug_mix *mix)
{
    return mix->lam > 0.0f ? mix->lam : FLT_MIN;
}

/* Draw k of batch seq's mixing: a uniform double in [0, 1). */
static double mix_u(uint64_t seed, uint64_t seq, uint64_t k)
{
    return (double)(sf_hash4(seed, seq, SF_AUG_MIX_KEY, k) >> 11) * 0x1p-53;
}

/* A standard normal (Box-Muller) from draws k, k+1. */
static double mix_normal(uint64_t seed, uint64_t seq, uint64_t k)
{
    const double u1 = 1.0 - mix_u(seed, seq, k); /* (0, 1]: log is finite */
    const double u2 = mix_u(seed, seq, k + 1);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Gamma(a, 1) by Marsaglia and Tsang's method (a < 1: Gamma(a + 1) times
 * U^(1/a)), drawing from counter *k on. The rejection loop is bounded; its
 * acceptance rate is above 95%, so the bound is never reached in practice. */
static double mix_gamma(uint64_t seed, uint64_t seq, double a, uint64_t *k)
{
    double boost = 1.0;
    if (a < 1.0) {
        boost = pow(1.0 - mix_u(seed, seq, (*k)++), 1.0 / a);
        a += 1.0;
    }
    const double d = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (int tries = 0; tries < 64; tries++) {
        const double x = mix_normal(seed, seq, *k);
        const double u = 1.0 - mix_u(seed, seq, *k + 2);
        *k += 3;
        double v = 1.0 + c * x;
        if (v <= 0.0)
            continue;
        v = v * v * v;
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v))
            return d * v * boost;
    }
    return d * boost;
}

void sf_aug_gen_mix(const sf_aug_pipeline *p, const sf_aug_plan *plan, uint64_t seed, uint64_t seq,
                    int n, sf_aug_mix *out)
{
    memset(out, 0, sizeof *out);
    out->kind = SF_MIX_NONE;
    out->lam = 1.0f;
    if (!plan->has_mix || n < 2)
        return; /* a batch of one mixed with itself is itself, labels included */
    const sf_aug_op *mixup = NULL, *cutmix = NULL;
    for (int k = 0; k < p->n_ops; k++) {
        if (p->ops[k].kind == SF_AUG_MIXUP)
            mixup = &p->ops[k];
        else if (p->ops[k].kind == SF_AUG_CUTMIX)
            cutmix = &p->ops[k];
    }
    /* Both listed: one of them per batch with equal probability, as
     * torchvision's RandomChoice([MixUp, CutMix]) of its reference recipes. */
    const sf_aug_op *op = mixup && cutmix ? (mix_u(seed, seq, 0) < 0.5 ? mixup : cutmix)
                                          : mixup ? mixup : cutmix;
    if (!op || !(mix_u(seed, seq, 1) < op->p))
        return;
    uint64_t k = 16;
    const double x = mix_gamma(seed, seq, op->alpha, &k);
    const double y = mix_gamma(seed, seq, op->alpha, &k);
    const double lam = x + y > 0.0 ? x / (x + y) : (x >= y ? 1.0 : 0.0);
    if (op->kind == SF_AUG_MIXUP) {
        out->kind = SF_MIX_MIXUP;
        out->lam = (float)lam;
        return;
    }
    /* v2.CutMix: a centre uniform over the pixels, half-sides
     * int(0.5 sqrt(1 - lam) W) and H, clamped to the image; lam becomes
     * 1 - box area / image area. */
    const int W = plan->out_w, H = plan->out_h;
    const int rx = offset_in((float)mix_u(seed, seq, 2), W - 1);
    const int ry = offset_in((float)mix_u(seed, seq, 3), H - 1);
    const double r = 0.5 * sqrt(1.0 - lam);
    const int rw = (int)(r * W), rh = (int)(r * H);
    out->kind = SF_MIX_CUTMIX;
    out->box[0] = rx - rw < 0 ? 0 : rx - rw;
    out->box[1] = ry - rh < 0 ? 0 : ry - rh;
    out->box[2] = rx + rw > W ? W : rx + rw;
    out->box[3] = ry + rh > H ? H : ry + rh;
    out->lam = (float)(1.0 - (double)(out->box[2] - out->box[0]) * (out->box[3] - out->box[1]) /
                                 ((double)W * H));
}
