/* gpu/ref/png.c — the PNG decode: libspng.
 *
 * libspng rather than libpng: one call decodes any colour type and bit
 * depth to 8-bit RGB (SPNG_FMT_RGB8: gray replicated, a palette expanded,
 * alpha and tRNS dropped, 16-bit samples cut to their high byte), it checks
 * every chunk's CRC and the compressed data, and it needs no setjmp. No
 * gamma or colour transform is applied (SPNG_DECODE_GAMMA is off), as
 * torchvision's decode_image and Pillow apply none.
 *
 * Bounded: the image is limited to the size its header was read as, and
 * ancillary chunks (text, ICC profiles, which libspng may inflate) to the
 * file's own size each and SF_REF_PNG_CHUNK_CACHE in all, so that a small
 * file cannot make the decoder allocate much more than its image.
 */
#include "gpu/ref/ref.h"

#include <stdio.h>
#include <stdlib.h>

#include <spng.h>

/* The most bytes libspng keeps of a file's ancillary chunks. */
#define SF_REF_PNG_CHUNK_CACHE ((size_t)16 << 20)

int sf_ref_png_decode_one(const uint8_t *src, size_t len, int h, int w, uint8_t *dst, char *why, size_t whylen)
{
    spng_ctx *ctx = spng_ctx_new(0);
    if (!ctx) {
        snprintf(why, whylen, "out of memory for the PNG decoder");
        return -1;
    }
    int rc = spng_set_image_limits(ctx, (uint32_t)w, (uint32_t)h);
    if (!rc) rc = spng_set_chunk_limits(ctx, len, SF_REF_PNG_CHUNK_CACHE);
    if (!rc) rc = spng_set_png_buffer(ctx, src, len);
    struct spng_ihdr ihdr;
    if (!rc) rc = spng_get_ihdr(ctx, &ihdr);
    if (!rc && (ihdr.width != (uint32_t)w || ihdr.height != (uint32_t)h)) {
        snprintf(why, whylen, "the file is %ux%u (HxW), not the %dx%d its header was read as", ihdr.height,
                 ihdr.width, h, w);
        spng_ctx_free(ctx);
        return -1;
    }
    size_t need = 0;
    if (!rc) rc = spng_decoded_image_size(ctx, SPNG_FMT_RGB8, &need);
    if (!rc && need != (size_t)h * w * 3) {
        snprintf(why, whylen, "libspng would decode %zu bytes for a %dx%d image", need, h, w);
        spng_ctx_free(ctx);
        return -1;
    }
    if (!rc) rc = spng_decode_image(ctx, dst, need, SPNG_FMT_RGB8, 0);
    spng_ctx_free(ctx);
    if (rc) {
        snprintf(why, whylen, "libspng: %s", spng_strerror(rc));
        return -1;
    }
    return 0;
}
