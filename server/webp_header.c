/* server/webp_header.c — see webp_header.h. */
#include "server/webp_header.h"

#include "server/image_header.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static uint32_t le32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint32_t le24(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16; }

/* The size of the image bitstream in chunk fourcc (b[0, n)): 0 and *h, *w,
 * *alpha set, or an error. */
static sf_jpeg_error bitstream_size(const char *fourcc, const uint8_t *b, uint32_t n, uint32_t *h, uint32_t *w,
                                    int *alpha, char *msg, size_t msglen)
{
    if (memcmp(fourcc, "VP8 ", 4) == 0) {
        /* A 3-byte frame tag (bit 0: 0 for a key frame), the start code
         * 9D 01 2A, then 14-bit width and height each with 2 scale bits. */
        if (n < 10)
            return sf_image_fail(SF_WEBP_E_MALFORMED, msg, msglen, "the VP8 chunk holds %u bytes; its frame header needs 10", n);
        if (b[0] & 1)
            return sf_image_fail(SF_WEBP_E_UNSUPPORTED, msg, msglen, "the VP8 frame is not a key frame");
        if (b[3] != 0x9D || b[4] != 0x01 || b[5] != 0x2A)
            return sf_image_fail(SF_WEBP_E_MALFORMED, msg, msglen, "the VP8 frame lacks its start code 9D 01 2A");
        *w = (b[6] | (uint32_t)b[7] << 8) & 0x3FFF;
        *h = (b[8] | (uint32_t)b[9] << 8) & 0x3FFF;
        *alpha = 0;
        return SF_JPEG_OK;
    }
    /* VP8L: the signature 0x2F, then 14 bits width - 1, 14 bits height - 1,
     * 1 bit alpha hint and a 3-bit version that must be 0, LSB first. */
    if (n < 5)
        return sf_image_fail(SF_WEBP_E_MALFORMED, msg, msglen, "the VP8L chunk holds %u bytes; its header needs 5", n);
    if (b[0] != 0x2F)
        return sf_image_fail(SF_WEBP_E_MALFORMED, msg, msglen, "the VP8L chunk lacks its signature 0x2F");
    const uint32_t bits = le32(b + 1);
    if ((bits >> 29) != 0)
        return sf_image_fail(SF_WEBP_E_UNSUPPORTED, msg, msglen, "the VP8L bitstream is version %u; only 0 exists", bits >> 29);
    *w = (bits & 0x3FFF) + 1;
    *h = ((bits >> 14) & 0x3FFF) + 1;
    *alpha = (int)((bits >> 28) & 1);
    return SF_JPEG_OK;
}

static sf_jpeg_error check_bounds(uint32_t h, uint32_t w, const sf_jpeg_limits *lim, char *msg, size_t msglen)
{
    if (h == 0 || w == 0)
        return sf_image_fail(SF_WEBP_E_MALFORMED, msg, msglen, "the image is %ux%u (HxW)", h, w);
    if (lim && lim->max_side > 0 && (h > (uint32_t)lim->max_side || w > (uint32_t)lim->max_side))
        return sf_image_fail(SF_JPEG_E_SIDE_TOO_LARGE, msg, msglen, "the image is %ux%u (HxW); jpeg.max_side is %d", h, w,
                    lim->max_side);
    if (lim && lim->max_pixels > 0 && (int64_t)h * w > lim->max_pixels)
        return sf_image_fail(SF_JPEG_E_TOO_MANY_PIXELS, msg, msglen,
                    "the image is %ux%u (HxW), %lld pixels; jpeg.max_pixels is %lld", h, w, (long long)h * w,
                    (long long)lim->max_pixels);
    return SF_JPEG_OK;
}

sf_jpeg_error sf_webp_header_parse(const uint8_t *d, size_t len, const sf_jpeg_limits *lim, sf_jpeg_info *info,
                                   char *msg, size_t msglen)
{
    if (msg && msglen) msg[0] = '\0';
    sf_jpeg_info got;
    memset(&got, 0, sizeof got);
    got.format = SF_IMAGE_WEBP;
    got.orientation = 1;
    got.subsamp = SF_JPEG_444;
    if (len < 12 || memcmp(d, "RIFF", 4) != 0 || memcmp(d + 8, "WEBP", 4) != 0)
        return sf_image_fail(SF_JPEG_E_NOT_JPEG, msg, msglen, "the file (%zu bytes) does not start with RIFF....WEBP", len);
    const uint32_t riff = le32(d + 4);
    if (riff < 4 + 8 || (riff & 1))
        return sf_image_fail(SF_WEBP_E_MALFORMED, msg, msglen, "the RIFF size is %u; it must be even and hold a chunk", riff);
    if ((uint64_t)riff + 8 > len)
        return sf_image_fail(SF_WEBP_E_TRUNCATED, msg, msglen,
                    "the RIFF container declares %llu bytes but the file ends at byte %zu: it is cut short",
                    (unsigned long long)riff + 8, len);
    const size_t end = (size_t)riff + 8;
    size_t pos = 12;
    int chunks = 0, extended = 0, have_image = 0, have_exif = 0;
    uint32_t canvas_h = 0, canvas_w = 0;
    while (pos < end) {
        if (pos + 8 > end)
            return sf_image_fail(SF_WEBP_E_MALFORMED, msg, msglen, "a chunk header at byte %zu crosses the container's end", pos);
        if (++chunks > SF_WEBP_MAX_CHUNKS)
            return sf_image_fail(SF_WEBP_E_UNSUPPORTED, msg, msglen, "more than %d chunks", SF_WEBP_MAX_CHUNKS);
        char fourcc[5] = {0};
        memcpy(fourcc, d + pos, 4);
        const uint32_t n = le32(d + pos + 4);
        const uint8_t *b = d + pos + 8;
        if ((uint64_t)pos + 8 + n > end)
            return sf_image_fail(SF_WEBP_E_MALFORMED, msg, msglen, "chunk %.4s at byte %zu declares %u bytes past the container",
                        fourcc, pos, n);
        const int image = memcmp(fourcc, "VP8 ", 4) == 0 || memcmp(fourcc, "VP8L", 4) == 0;
        if (chunks == 1 && memcmp(fourcc, "VP8X", 4) == 0) {
            if (n < 10)
                return sf_image_fail(SF_WEBP_E_MALFORMED, msg, msglen, "the VP8X chunk holds %u bytes; it needs 10", n);
            if (b[0] & 0x02)
                return sf_image_fail(SF_WEBP_E_UNSUPPORTED, msg, msglen, "an animated WebP; only still images are supported");
            canvas_w = le24(b + 4) + 1;
            canvas_h = le24(b + 7) + 1;
            sf_jpeg_error e = check_bounds(canvas_h, canvas_w, lim, msg, msglen);
            if (e != SF_JPEG_OK) return e;
            got.components = (b[0] & 0x10) ? 4 : 3;
            extended = 1;
        } else if (chunks == 1 && !image) {
            return sf_image_fail(SF_WEBP_E_MALFORMED, msg, msglen, "the first chunk is %.4s; it must be VP8, VP8L or VP8X",
                        fourcc);
        } else if (image) {
            if (have_image)
                return sf_image_fail(SF_WEBP_E_MALFORMED, msg, msglen, "a second image chunk (%.4s) at byte %zu", fourcc, pos);
            uint32_t h = 0, w = 0;
            int alpha = 0;
            sf_jpeg_error e = bitstream_size(fourcc, b, n, &h, &w, &alpha, msg, msglen);
            if (e == SF_JPEG_OK) e = check_bounds(h, w, lim, msg, msglen);
            if (e != SF_JPEG_OK) return e;
            if (extended && (h != canvas_h || w != canvas_w))
                return sf_image_fail(SF_WEBP_E_MALFORMED, msg, msglen, "the image is %ux%u (HxW) on a canvas of %ux%u", h, w,
                            canvas_h, canvas_w);
            got.h = (int32_t)h;
            got.w = (int32_t)w;
            if (!extended) got.components = alpha ? 4 : 3;
            have_image = 1;
            if (!extended) break; /* a simple file holds its image and nothing after it */
        } else if (memcmp(fourcc, "EXIF", 4) == 0 && !have_exif) {
            got.orientation = sf_exif_orientation(b, n);
            have_exif = 1;
        } else if (memcmp(fourcc, "ANMF", 4) == 0 || memcmp(fourcc, "VP8X", 4) == 0) {
            return sf_image_fail(SF_WEBP_E_MALFORMED, msg, msglen, "a %.4s chunk at byte %zu out of place", fourcc, pos);
        }
        pos += 8 + (size_t)n + (n & 1);
    }
    if (!have_image)
        return sf_image_fail(SF_WEBP_E_MALFORMED, msg, msglen, "the container holds no VP8 or VP8L image chunk");
    got.data_len = (int64_t)end;
    *info = got;
    return SF_JPEG_OK;
}
