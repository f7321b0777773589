/* gpu/ref/input.h — the reference input pipeline: JPEG decode (jpeg.c) and
 * the augmentation (augment.c). Part of gpu/ref/ref.h, whose first comment
 * states what every reference function promises. */
#ifndef SF_GPU_REF_INPUT_H
#define SF_GPU_REF_INPUT_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/aug.h"

/* ---- encoded-file decode (image.c; jpeg.c, png.c, webp.c) ----------------- */

struct sf_batch;

/* Decodes the n files of the encoded batch b (b->jpeg: JPEG, PNG or WebP,
 * each told apart by its first bytes) into dst, cap bytes: sample i as
 * 3-channel HWC uint8 of samples[i].src_h x src_w at byte samples[i].src_off,
 * turned by its EXIF orientation when b->jpeg_files[i].orientation asks (the
 * src size is then the turned one). 0; SF_BACKEND_BAD_INPUT (gpu/backend.h)
 * with a message naming the sample when a decoder refuses a file; -1
 * otherwise. */
int sf_ref_image_decode(const struct sf_batch *b, uint8_t *dst, size_t cap, char *err, size_t errlen);

/* The same, sample by sample: decodes the samples i with which[i] != 0 (all
 * when which is NULL) and, when bad is not NULL, marks each one a decoder
 * refuses with bad[i] = 1 and goes on with the others (err names the first).
 * Returns the number refused (0..n; with bad NULL the decode stops at the
 * first), or -1 when the batch itself is wrong (a buffer too small). */
int sf_ref_image_decode_some(const struct sf_batch *b, const uint8_t *which, uint8_t *dst, size_t cap,
                             uint8_t *bad, char *err, size_t errlen);

/* One JPEG file at a time (jpeg.c): a decoder holds libjpeg's state for a
 * batch. work_left (may be NULL: unbounded) is the batch's budget of pixel
 * passes, charged per scan. dec_one decodes src[0, len), whose header said
 * h x w, into dst (h x w x 3): 0, or -1 with why filled. */
typedef struct sf_ref_jpeg_dec sf_ref_jpeg_dec;
sf_ref_jpeg_dec *sf_ref_jpeg_dec_new(int64_t *work_left);
int sf_ref_jpeg_dec_one(sf_ref_jpeg_dec *d, const uint8_t *src, size_t len, int h, int w, uint8_t *dst, char *why,
                        size_t whylen);
void sf_ref_jpeg_dec_free(sf_ref_jpeg_dec *d);

/* One PNG file (png.c, libspng) or WebP file (webp.c, libwebp) of h x w
 * into dst (h x w x 3), converted to 8-bit RGB as
 * torchvision.io.decode_image(mode=ImageReadMode.RGB) converts it: gray
 * replicated, a palette expanded, alpha dropped (not composited), 16-bit
 * samples cut to their high byte (torchvision keeps 16 bits, and its
 * to_dtype(torch.uint8, scale=True) shifts them right by 8). 0, or -1 with
 * why filled. */
int sf_ref_png_decode_one(const uint8_t *src, size_t len, int h, int w, uint8_t *dst, char *why, size_t whylen);
int sf_ref_webp_decode_one(const uint8_t *src, size_t len, int h, int w, uint8_t *dst, char *why, size_t whylen);

/* Turns src (h x w x 3, as stored) by EXIF orientation o (1..8) into dst,
 * as PIL.ImageOps.exif_transpose does: 2 mirrors left-right, 3 turns 180
 * degrees, 4 mirrors top-bottom, 5 transposes, 6 turns 90 degrees clockwise,
 * 7 transverses, 8 turns 90 degrees counter-clockwise; dst is w x h for 5..8.
 * src and dst do not overlap. */
void sf_ref_orient(const uint8_t *src, int h, int w, int o, uint8_t *dst);

/* A file of more scans than this is refused (TurboJPEG's TJFLAG_LIMITSCANS
 * bound). */
#define SF_REF_JPEG_MAX_SCANS 500
/* A batch's decode work is bounded at this many scans over each pixel it
 * decodes: legitimate progressive files have about ten (a sequential file
 * one per component group), so a batch of them fits; once a batch has spent
 * it, its remaining files are refused. */
#define SF_REF_JPEG_PASSES_PER_PIXEL 64


/* ---- augmentation ------------------------------------------------------- */

/* Runs the whole plan on n samples. Sample i's image starts at src + s[i].src_off
 * and is s[i].src_h x src_w x plan->c, HWC when nhwc (always, for a ragged plan),
 * else CHW; for a uniform plan that is src = [n,h,w,c] or [n,c,h,w].
 * dst: float [n, c, out_h, out_w]. */
void sf_ref_augment(const sf_aug_plan *plan, const sf_aug_sample *s, int n,
                    const uint8_t *src, int nhwc, float *dst);

/* The stages, exposed for tests of single ops. */
void sf_ref_aug_geometry(const sf_aug_plan *plan, const sf_aug_sample *s,
                         const uint8_t *src1, int nhwc, float *dst1); /* one sample: src1
                                                                         is its image */
void sf_ref_aug_blur(const sf_aug_plan *plan, const sf_aug_sample *s,
                     const float *in1, float *out1);                  /* one sample */
void sf_ref_aug_pointwise(const sf_aug_plan *plan, const sf_aug_sample *s,
                          float *io1);                                /* one sample */
/* The second pass (plan->post: color_jitter, random_erasing and the stages
 * after them), in place on one sample's output; nothing when n_post = 0. */
void sf_ref_aug_post(const sf_aug_plan *plan, const sf_aug_sample *s, float *io1);
/* random_erasing's "random" value of (y, x, channel): a standard normal. */
float sf_ref_aug_erase_noise(uint64_t erase_seed, int y, int x, int ch);
/* The batch-level mixing, in place on the n samples' output io = [n, c,
 * out_h, out_w]: sample i mixed with sample (i - 1) mod n as mix says. */
void sf_ref_aug_mix(const sf_aug_plan *plan, const sf_aug_mix *mix, int n, float *io);

#endif
