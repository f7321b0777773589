/* client/natural_image.h — natural-looking synthetic images, the content of
 * streamfeed-load's generated JPEG workloads (w1-jpeg, imagenet-jpeg). */
#ifndef SF_CLIENT_NATURAL_IMAGE_H
#define SF_CLIENT_NATURAL_IMAGE_H

#include <stdint.h>

/* Natural-looking content, so that the files have the size and decode cost
 * of photographs rather than of noise (which JPEG cannot compress) or of flat
 * colour (which it compresses to nothing): a smooth two-colour gradient with a
 * low-frequency ripple, a few soft-edged discs and rectangles, a multi-scale
 * texture and mild per-pixel noise. With a hue (--learnable) the image is tinted halfway
 * towards the class's colour, which the model can learn. */
void natural_image(uint8_t *px, int h, int w, uint64_t s, const uint8_t *hue);

#endif
