/* gpu/aug.h — the augmentation pipeline: its description, its plan for one
 * input shape, and the per-sample random parameters.
 *
 * Flow (DESIGN.md §5):
 *   config JSON list  --sf_aug_parse-->  sf_aug_pipeline   (once per config)
 *   pipeline + input shape --sf_aug_plan--> sf_aug_plan    (once per shape)
 *   plan + (seed, batch seq, sample i) --sf_aug_gen--> sf_aug_sample[n]
 *                                                     (per batch, on the host)
 * A backend consumes the plan and the sample array; it draws no random numbers
 * of its own except through gpu/rng.h keyed by values found in sf_aug_sample,
 * so the CUDA and reference backends compute the same function.
 *
 * Semantics of the composed pipeline (what both backends implement):
 *  1. Geometry. random_crop, center_crop, random_resized_crop, resize,
 *     random_rotation and horizontal_flip compose into one affine map from
 *     output pixel centres to source coordinates (sf_aug_sample.inv), and the
 *     source is sampled once. Pixel centres follow PyTorch's align_corners=False
 *     convention. Both backends evaluate the map from pixel indices with two
 *     fused multiply-adds per coordinate (sf_aug_sample.map, rmap), so they pick
 *     the same taps to the bit.
 *     Edges, as torchvision. Taps clamp to the edge of the clamp box
 *     (sf_aug_sample.clip): the source, or the window of the last crop made
 *     before any resize or rotation (crop, center_crop, random_resized_crop's
 *     crop), since torchvision resizes a crop as an image of its own
 *     (F.resize's bilinear clamps its source index; its antialias filter
 *     renormalises over the taps inside). Only the rotation's outside region
 *     takes the fill (0): the clamped value is multiplied by the coverage of the
 *     rotation's input image at the point (bilinear: the bilinear weight its
 *     pixels would give an all-ones image, as grid_sample(padding_mode="zeros");
 *     nearest: 1 if the nearest pixel is inside, else 0). For a rotation of the
 *     source itself this is exactly v2.functional.rotate(fill=None);
 *     RandomRotation's fill=0 multiplies by that coverage a second time within
 *     one pixel of the border.
 *     Antialias. With "antialias": true (the default of resize and
 *     random_resized_crop, as torchvision v2; the map is filtered when any
 *     resizing op of the list asks for it) and bilinear resampling, a sample is
 *     torch's triangle filter (_upsample_bilinear2d_aa, PIL's): along each
 *     source axis, support a = max(1, source pixels per output pixel) (the norm
 *     of that row of inv), taps j with weight max(0, 1 - |j + 0.5 - s| / a) over
 *     the clamp box, normalised by their sum, with s the point clamped to the
 *     box's pixel centres. a = 1 is bilinear with clamped taps, so a plan uses
 *     the filter only where some axis may shrink (sf_aug_plan.antialias).
 *     Without rotation this is torchvision's resize/resized_crop. With one, the
 *     rotation's input image is what gets filtered, as torchvision resizes
 *     first: the output takes the rotation's bilinear taps on that image (0
 *     outside it), each tap the filtered sample of the source at that pixel's
 *     centre with the supports of the map up to the rotation (sf_aug_sample.pre)
 *     — torchvision's resize-then-rotate, at 4 filtered samples per pixel.
 *     Differences from sequential torchvision ops: without the antialias filter
 *     the map is sampled once where torchvision resamples once per op (sharper,
 *     and no intermediate rounding or clipping to uint8; a bilinear upscale then
 *     a rotation differs by up to 61 of 255 on hard edges, see
 *     tests/unit/test_aug.c); a crop that follows a resize or a rotation does
 *     not narrow the clamp box; a center_crop larger than a ragged source
 *     repeats its edge pixels where torchvision pads with 0; at most one
 *     random_rotation per list.
 *  2. Blur. gaussian_blur (separable, odd kernel ksize, per-sample sigma,
 *     reflect padding as torchvision) on the geometric output.
 *  3. Pointwise ops in list order: to_dtype (x*scale), normalize ((x-mean)/std
 *     per channel), color_convert (RGB->YCbCr, BT.601 full range), random_mask
 *     (pixels chosen with probability ratio, dilated over the 4-neighbourhood
 *     `dilate` times, set to 0 in every channel). The mask bit of a pixel is
 *     sf_u01(sf_hash4(mask_seed, y, x, 0)) < ratio, before dilation.
 *  Blur is linear and commutes with the affine pointwise ops, so its position
 *  among them does not matter; a random_mask listed before gaussian_blur is
 *  rejected by sf_aug_plan since it would not commute.
 *  4. Second pass (sf_aug_plan.post), per sample, from the first color_jitter
 *     or random_erasing on, in list order with the pointwise ops listed after
 *     them (to_dtype, normalize, color_convert; geometry, blur and random_mask
 *     must come before). At most one of each per list.
 *     color_jitter (torchvision.transforms.v2.ColorJitter): per sample, the
 *     factors of brightness b, contrast c, saturation s and the hue shift h
 *     uniform in their ranges (a number x means [max(0, 1-x), 1+x], hue
 *     [-x, x]; a range that is exactly the identity is off), applied in a
 *     random order (a uniform permutation, sample.jitter_order), each clamped
 *     to [0, B]: brightness x*b; contrast x*c + mean*(1-c), mean the image's
 *     grayscale mean (0.2989 R + 0.587 G + 0.114 B; one channel: itself)
 *     before this step; saturation x*s + gray*(1-s) per pixel; hue: RGB ->
 *     HSV, H + h mod 1, -> RGB with torchvision's formulas and clamps at B.
 *     Saturation and hue leave one channel unchanged. Value range: B = 255
 *     times the to_dtype scales before the op: on 0..255 floats (before
 *     to_dtype) B = 255, after to_dtype 1/255 B = 1, which is torchvision on
 *     float images exactly. It needs intensities: listed after normalize or
 *     color_convert it is refused, and it needs 1 or 3 channels. Unlike
 *     torchvision on uint8 tensors, nothing is rounded to integers between the
 *     steps and the gray image used by contrast and saturation is not floored
 *     (uint8 torchvision differs by up to about 1 of 255 per step).
 *     random_erasing (v2.RandomErasing): with probability p, ten tries of an
 *     area fraction uniform in scale and a log-uniform ratio r: box height
 *     round(sqrt(area*r)), width round(sqrt(area/r)), accepted when smaller
 *     than the image along both axes, at a uniform position; no fit: nothing
 *     erased. The box takes `value` per channel (a number broadcasts), or with
 *     "random" standard normal noise per element: Box-Muller in double of two
 *     24-bit uniforms of sf_hash4(sample.erase_seed, y, x, channel), rounded
 *     to float (torchvision draws from torch's generator: same distribution,
 *     other numbers). The values are written as given, on whatever scale the
 *     ops before it leave (e.g. 0 after normalize is the mean).
 *  5. Batch-level mixing (sf_aug_gen_mix, sf_aug_mix), after everything
 *     else, over the batch's output: mixup and cutmix must end the list. One
 *     lam per batch from Beta(alpha, alpha) (Marsaglia-Tsang gamma variates,
 *     keyed by seed and batch seq); sample i is mixed with sample
 *     (i - 1) mod n (torch.roll(x, 1, 0)). mixup: (1 - lam) x_{i-1} + lam x_i.
 *     cutmix: a centre (rx, ry) uniform over the pixels, half sides
 *     int(0.5 sqrt(1 - lam) W) and H, the box clamped to the image takes
 *     x_{i-1}, and lam becomes 1 - box area / image area. "p" (default 1, as
 *     v2.MixUp/CutMix, which always apply): with probability 1 - p a batch is
 *     left unmixed (lam = 1), as RandomApply. Both listed: each batch takes one
 *     of them with probability 1/2 (RandomChoice, torchvision's reference
 *     recipe), then its p. The loss's soft target of sample i is
 *     lam onehot(y_i) + (1 - lam) onehot(y_{i-1}) (sf_batch.mix_lam). Refused
 *     for segmentation models (per-pixel labels) and evaluation pipelines.
 *  Tolerances (tests/unit/test_aug.c, tests/gpu/test_augment.cu): the
 *  reference against torchvision's adjust_* on [0, 1] images: 2e-6 absolute;
 *  CUDA against the reference: the same relative 1e-5 (bf16 1e-2) as the
 *  other ops, where the only differences are contrast's mean (double sums in
 *  another order) and the device's double log/cos of the erasing noise;
 *  mixing rounds as the reference does (two products and a sum, no FMA).
 * Output: float32 NCHW [n, out_c, out_h, out_w] (out_c == in c).
 *
 * Sources. A batch's sources lie in one uint8 buffer; sample i's image starts at
 * byte sf_aug_sample.src_off and is src_h x src_w. Uniform batches (every image
 * in_h x in_w, sf_aug_plan_make) are NHWC or NCHW as the caller says; ragged
 * batches (sf_aug_plan_make_ragged, sf_aug_gen_ragged) are HWC per image, rows
 * tightly packed, plan->c channels, images in sample order. Backends address
 * every sample through src_off/src_h/src_w, which sf_aug_gen fills for uniform
 * batches as well.
 */
#ifndef SF_GPU_AUG_H
#define SF_GPU_AUG_H

#include <stddef.h>
#include <stdint.h>

#define SF_AUG_MAX_OPS 16
#define SF_AUG_MAX_C 4
#define SF_AUG_MAX_KSIZE 31

typedef enum sf_aug_kind {
    SF_AUG_RANDOM_CROP = 0, /* size [h,w]; uniform top-left over valid positions */
    SF_AUG_RESIZE,          /* size [h,w]; bilinear, align_corners=False, antialias */
    SF_AUG_RANDOM_ROTATION, /* degrees [min,max] uniform, about the centre, fill 0 */
    SF_AUG_HFLIP,           /* p: probability of flipping */
    SF_AUG_GAUSSIAN_BLUR,   /* ksize (odd), sigma [min,max] uniform */
    SF_AUG_NORMALIZE,       /* mean[c], std[c] */
    SF_AUG_COLOR_CONVERT,   /* RGB -> YCbCr; needs c == 3 */
    SF_AUG_RANDOM_MASK,     /* ratio, dilate (iterations of 4-neighbour dilation) */
    SF_AUG_TO_DTYPE,        /* scale: multiply (e.g. 1/255); dtype "float32" */
    SF_AUG_RANDOM_RESIZED_CROP, /* size [h,w]; area scale [min,max], aspect ratio
                                   [min,max] (log-uniform); torchvision's 10 tries,
                                   then its centre-crop fallback; antialias */
    SF_AUG_CENTER_CROP,     /* size [h,w]; top-left round((H-h)/2), round((W-w)/2) */
    SF_AUG_COLOR_JITTER,    /* brightness, contrast, saturation [min,max] factors, hue
                               [min,max] shift; applied in a random order per sample */
    SF_AUG_RANDOM_ERASING,  /* p, scale [min,max], ratio [min,max] (log-uniform), value
                               (per channel, or standard normal noise); 10 tries */
    SF_AUG_MIXUP,           /* alpha (Beta(alpha, alpha)), p; batch-level */
    SF_AUG_CUTMIX,          /* alpha (Beta(alpha, alpha)), p; batch-level */
    SF_AUG_KIND_COUNT
} sf_aug_kind;

typedef enum sf_interp { SF_INTERP_BILINEAR = 0, SF_INTERP_NEAREST = 1 } sf_interp;

typedef struct sf_aug_op {
    sf_aug_kind kind;
    int size_h, size_w;          /* random_crop, center_crop, resize, random_resized_crop */
    int antialias;               /* resize, random_resized_crop (default 1) */
    float area_min, area_max;    /* random_resized_crop "scale" */
    float aspect_min, aspect_max;/* random_resized_crop "ratio" */
    float deg_min, deg_max;      /* random_rotation */
    sf_interp interp;            /* random_rotation: resampling of the composed map */
    float p;                     /* horizontal_flip */
    int ksize;                   /* gaussian_blur */
    float sigma_min, sigma_max;  /* gaussian_blur */
    float mean[SF_AUG_MAX_C], std[SF_AUG_MAX_C]; /* normalize (one value broadcasts) */
    int n_mean;                  /* values given for mean/std */
    float ratio;                 /* random_mask */
    int dilate;                  /* random_mask */
    float scale;                 /* to_dtype */
    /* color_jitter: factor ranges of brightness (0), contrast (1), saturation
     * (2) and the hue shift (3); jit_on[k] = 0 where the factor is absent (or
     * is the identity range, as torchvision drops it). */
    float jit_lo[4], jit_hi[4];
    int jit_on[4];
    /* random_erasing: p, scale in area_min/max, ratio in aspect_min/max. */
    int erase_random;            /* value "random": standard normal noise */
    float erase_value[SF_AUG_MAX_C];
    int n_erase_value;           /* values given (1 broadcasts) */
    float alpha;                 /* mixup, cutmix (p is their probability) */
} sf_aug_op;

typedef struct sf_aug_pipeline {
    int n_ops;
    sf_aug_op ops[SF_AUG_MAX_OPS];
} sf_aug_pipeline;

/* Pointwise stage, in list order, after the geometric and blur stages. */
typedef enum sf_aug_pw_kind {
    SF_PW_SCALE = 0,  /* x *= a[0] */
    SF_PW_NORMALIZE,  /* x = (x - a[c]) * b[c]   (b = 1/std) */
    SF_PW_YCBCR,      /* RGB -> YCbCr; a[0] is the chroma offset: 128 times the
                         scales applied before it, so it commutes with to_dtype */
    SF_PW_MASK,       /* random mask with ratio a[0], dilate (int)b[0] */
    SF_PW_JITTER,     /* colour jitter: a[k] = 1 where factor k (brightness, contrast,
                         saturation, hue) is on; b[0] = the clamp bound; parameters
                         and order in sf_aug_sample.jitter / jitter_order */
    SF_PW_ERASE       /* random erasing: the box in sf_aug_sample.erase; value a[c]
                         per channel, or b[0] = 1: noise keyed by erase_seed */
} sf_aug_pw_kind;

typedef struct sf_aug_pw {
    sf_aug_pw_kind kind;
    float a[SF_AUG_MAX_C], b[SF_AUG_MAX_C];
} sf_aug_pw;

/* A pipeline resolved for one input shape (or for ragged sources). Plain data,
 * copyable to the device. */
typedef struct sf_aug_plan {
    int in_h, in_w, c;        /* source image per sample; in_h = in_w = 0 when ragged */
    int ragged;               /* 1: every sample has its own size (sf_aug_sample.src_*) */
    int out_h, out_w;         /* after geometry */
    sf_interp interp;         /* resampling of the composed map */
    int has_geom;             /* 0: identity map (a plain uint8->float conversion) */
    int has_rot;              /* a random_rotation: multiply by its coverage */
    int antialias;            /* resample with the triangle filter (sf_aug_sample.aa) */
    int blur_ksize;           /* 0: no blur */
    int n_pw;
    sf_aug_pw pw[SF_AUG_MAX_OPS];
    int has_mask;             /* a SF_PW_MASK stage exists */
    /* The per-sample pointwise stages from the first color_jitter or
     * random_erasing on, in list order: they run after the stages above, as a
     * second pass over each sample's output (contrast needs the image's mean).
     * n_post = 0 when the list has neither op. */
    int n_post;
    sf_aug_pw post[SF_AUG_MAX_OPS];
    int has_mix;              /* a mixup or cutmix op: sf_aug_gen_mix draws per batch */
} sf_aug_plan;

/* Per-sample random parameters, generated once per batch on the host. */
typedef struct sf_aug_sample {
    float inv[6];        /* source (x,y) = inv[0..2]·(ox,oy,1), inv[3..5]·(ox,oy,1);
                            ox, oy are output pixel centres (i + 0.5); the result is
                            in continuous source coordinates (pixel centre = i + 0.5).
                            The composed map as drawn: for logs and tests */
    float map[6];        /* the same map as the backends evaluate it, from output pixel
                            indices to source pixel units with centres at integers:
                            fx = fmaf(map[0], x, fmaf(map[1], y, map[2])),
                            fy = fmaf(map[3], x, fmaf(map[4], y, map[5])) (one fused
                            rounding each, so host and device agree to the bit) */
    float rmap[6];       /* likewise output pixel (x, y) -> the rotation's input image,
                            centres at integers (plan->has_rot): ru, rv */
    float sigma;         /* gaussian_blur sigma (0 when no blur) */
    float blur_w[SF_AUG_MAX_KSIZE]; /* normalised 1-D Gaussian weights, ksize of them */
    uint64_t mask_seed;  /* key of the random mask */
    int src_h, src_w;    /* this sample's source image */
    size_t src_off;      /* byte offset of its first byte in the batch's source buffer */
    int clip[4];         /* clamp box: source pixels x in [clip[0], clip[2]], y in
                            [clip[1], clip[3]] (inclusive, inside the source) */
    float pre[4];        /* the rotation's input -> source (centres at i + 0.5 both):
                            x = pre[0]*x' + pre[1], y = pre[2]*y' + pre[3] (plan->has_rot) */
    float rot_w, rot_h;  /* the rotation's input size (plan->has_rot) */
    float aa[2];         /* antialias support along source x and y, >= 1
                            (plan->antialias; else 0) */
    float jitter[4];     /* color_jitter: brightness, contrast, saturation factors and
                            the hue shift (those off in the stage are unused) */
    uint8_t jitter_order[4]; /* the order they apply in: a permutation of 0..3 */
    int erase[4];        /* random_erasing box in output pixels: x, y, w, h; w = 0: none */
    uint64_t erase_seed; /* key of the "random" erasing noise */
    /* For logs, tests and traces; backends use only the fields above. */
    int crop_x, crop_y, crop_w, crop_h; /* the last crop, in its input's pixels */
    int flip;
    float angle_deg;
} sf_aug_sample;

/* Parses the config's JSON array, e.g.
 *   [{"op":"to_dtype","dtype":"float32","scale":1.0},
 *    {"op":"random_crop","size":[128,128]}, {"op":"resize","size":[256,256]},
 *    {"op":"random_rotation","degrees":[-45,45]},
 *    {"op":"gaussian_blur","kernel_size":7,"sigma":[0.1,2.0]},
 *    {"op":"normalize","mean":[0],"std":[1]}]
 * An empty array is the identity (uint8 -> float). Fails naming the op index. */
int sf_aug_parse(const char *json, sf_aug_pipeline *p, char *err, size_t errlen);

/* Resolves the pipeline for a source of in_h x in_w x c. Fails (naming the op)
 * when a crop is larger than its input, c does not fit normalize/colour, etc. */
int sf_aug_plan_make(const sf_aug_pipeline *p, int in_h, int in_w, int c,
                     sf_aug_plan *plan, char *err, size_t errlen);

/* Resolves the pipeline for ragged sources of c channels: every sample has its
 * own height and width, and the geometric ops must map them all to one output
 * size. Some op before the end of the geometry must fix the size (resize,
 * random_resized_crop, center_crop); an op that needs a known input size before
 * that (random_crop) is refused naming it, as is a list that never fixes the
 * size. The plan has ragged = 1 and in_h = in_w = 0. */
int sf_aug_plan_make_ragged(const sf_aug_pipeline *p, int c, sf_aug_plan *plan, char *err,
                            size_t errlen);

/* Draws the per-sample parameters of samples [0, n) of batch `seq` under
 * `seed`: a pure function of (seed, seq, sample index, pipeline, source size).
 * For a uniform plan; src_h/src_w are the plan's and src_off = i*c*in_h*in_w
 * (the sample's offset in an NHWC or NCHW batch), so a backend may always
 * address a sample through them. */
void sf_aug_gen(const sf_aug_pipeline *p, const sf_aug_plan *plan, uint64_t seed,
                uint64_t seq, int n, sf_aug_sample *out);

/* The same for a ragged plan: src_hw holds 2n integers, (h, w) of each sample,
 * each in [1, 16384]; the samples' images lie one after the other, HWC uint8
 * with plan->c channels and tightly packed rows, so src_off is the running sum
 * of c*h*w. A uniform plan works too (its own size must then equal src_hw). */
void sf_aug_gen_ragged(const sf_aug_pipeline *p, const sf_aug_plan *plan, uint64_t seed,
                       uint64_t seq, int n, const int *src_hw, sf_aug_sample *out);

/* The batch-level mixing of one batch (mixup / cutmix): sample i of the
 * output is mixed with sample (i - 1) mod n of the per-sample output. */
typedef enum sf_aug_mix_kind { SF_MIX_NONE = 0, SF_MIX_MIXUP = 1, SF_MIX_CUTMIX = 2 } sf_aug_mix_kind;

typedef struct sf_aug_mix {
    sf_aug_mix_kind kind;
    float lam;     /* the weight of sample i's own label: 1 with no mixing; CutMix's
                      is 1 - box area / image area */
    int box[4];    /* CutMix: x1, y1, x2, y2 (half-open) of the pasted region */
} sf_aug_mix;

/* Draws batch `seq`'s mixing under `seed` for n samples (a pure function of
 * seed, seq, the pipeline and the plan's output size). A plan without mixup
 * or cutmix, or n < 2, gives SF_MIX_NONE with lam = 1. */
void sf_aug_gen_mix(const sf_aug_pipeline *p, const sf_aug_plan *plan, uint64_t seed, uint64_t seq,
                    int n, sf_aug_mix *out);

/* The lam the loss reads (sf_batch.mix_lam): mix->lam, where 0 (the whole
 * target from the previous sample) becomes the smallest positive float,
 * since a mix_lam of 0 reads as "no mixing". */
float sf_aug_mix_loss_lam(const sf_aug_mix *mix);

/* The index of the list's first mixup or cutmix, or -1: such a list is
 * refused for segmentation models (the labels are per pixel) and as an
 * evaluation pipeline (evaluation does not mix). */
int sf_aug_mix_op(const sf_aug_pipeline *p);

const char *sf_aug_kind_name(sf_aug_kind k);

#endif
