/* server/png_header.c — see png_header.h. */
#include "server/png_header.h"

#include "server/image_header.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* The IHDR body (13 bytes): size, bounds, and a colour type and bit depth
 * that go together (§11.2.2, Table 11.1). */
static sf_jpeg_error parse_ihdr(const uint8_t *b, const sf_jpeg_limits *lim, sf_jpeg_info *info, char *msg,
                                size_t msglen)
{
    const uint32_t w = be32(b), h = be32(b + 4);
    const int depth = b[8], type = b[9];
    if (w == 0 || h == 0 || w > 0x7FFFFFFFu || h > 0x7FFFFFFFu)
        return sf_image_fail(SF_PNG_E_MALFORMED, msg, msglen, "IHDR gives the image %ux%u (HxW); each side is 1..2^31-1", h, w);
    /* The bounds come first, so that a bomb is named as such. */
    if (lim && lim->max_side > 0 && (h > (uint32_t)lim->max_side || w > (uint32_t)lim->max_side))
        return sf_image_fail(SF_JPEG_E_SIDE_TOO_LARGE, msg, msglen, "the image is %ux%u (HxW); jpeg.max_side is %d", h, w,
                    lim->max_side);
    if (lim && lim->max_pixels > 0 && (int64_t)h * w > lim->max_pixels)
        return sf_image_fail(SF_JPEG_E_TOO_MANY_PIXELS, msg, msglen,
                    "the image is %ux%u (HxW), %lld pixels; jpeg.max_pixels is %lld", h, w, (long long)h * w,
                    (long long)lim->max_pixels);
    int ok, comps;
    switch (type) {
    case 0: ok = depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16; comps = 1; break;
    case 2: ok = depth == 8 || depth == 16; comps = 3; break;
    case 3: ok = depth == 1 || depth == 2 || depth == 4 || depth == 8; comps = 3; break;
    case 4: ok = depth == 8 || depth == 16; comps = 2; break;
    case 6: ok = depth == 8 || depth == 16; comps = 4; break;
    default:
        return sf_image_fail(SF_PNG_E_MALFORMED, msg, msglen, "IHDR's colour type is %d; PNG has 0, 2, 3, 4 and 6", type);
    }
    if (!ok)
        return sf_image_fail(SF_PNG_E_MALFORMED, msg, msglen, "IHDR's bit depth %d is not one colour type %d allows", depth,
                    type);
    if (b[10] != 0 || b[11] != 0 || b[12] > 1)
        return sf_image_fail(SF_PNG_E_MALFORMED, msg, msglen,
                    "IHDR's compression, filter and interlace methods are %d, %d, %d; PNG has 0, 0 and 0 or 1",
                    b[10], b[11], b[12]);
    info->h = (int32_t)h;
    info->w = (int32_t)w;
    info->components = comps;
    return SF_JPEG_OK;
}

sf_jpeg_error sf_png_header_parse(const uint8_t *d, size_t len, const sf_jpeg_limits *lim, sf_jpeg_info *info,
                                  char *msg, size_t msglen)
{
    if (msg && msglen) msg[0] = '\0';
    sf_jpeg_info got;
    memset(&got, 0, sizeof got);
    got.format = SF_IMAGE_PNG;
    got.orientation = 1;
    got.subsamp = SF_JPEG_444;
    if (len < 8 || memcmp(d, SF_PNG_SIGNATURE, 8) != 0)
        return sf_image_fail(SF_JPEG_E_NOT_JPEG, msg, msglen, "the file (%zu bytes) does not start with the PNG signature",
                    len);
    size_t pos = 8;
    int chunks = 0, have_plte = 0, have_idat = 0, have_exif = 0;
    for (;;) {
        if (pos + 8 > len)
            return sf_image_fail(SF_PNG_E_TRUNCATED, msg, msglen,
                        "the file (%zu bytes) ends at byte %zu, inside a chunk header and before IEND: it is cut short",
                        len, len < pos ? pos : len);
        const uint32_t n = be32(d + pos);
        const uint8_t *type = d + pos + 4;
        char name[5] = {0};
        for (int k = 0; k < 4; k++) {
            const uint8_t c = type[k];
            if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')))
                return sf_image_fail(SF_PNG_E_MALFORMED, msg, msglen, "the chunk at byte %zu has a type that is not 4 letters",
                            pos);
            name[k] = (char)c;
        }
        if (n > 0x7FFFFFFFu)
            return sf_image_fail(SF_PNG_E_MALFORMED, msg, msglen, "chunk %s at byte %zu declares %u bytes; at most 2^31-1",
                        name, pos, n);
        if (++chunks > SF_PNG_MAX_CHUNKS)
            return sf_image_fail(SF_PNG_E_UNSUPPORTED, msg, msglen, "more than %d chunks before IEND", SF_PNG_MAX_CHUNKS);
        const uint8_t *body = d + pos + 8;
        if ((uint64_t)pos + 12 + n > len)
            return sf_image_fail(SF_PNG_E_TRUNCATED, msg, msglen,
                        "chunk %s at byte %zu declares %u bytes but the file ends at byte %zu: it is cut short", name,
                        pos, n, len);
        if (chunks == 1) {
            if (memcmp(name, "IHDR", 4) != 0 || n != 13)
                return sf_image_fail(SF_PNG_E_MALFORMED, msg, msglen, "the first chunk is %s of %u bytes; it must be IHDR of 13",
                            name, n);
            sf_jpeg_error e = parse_ihdr(body, lim, &got, msg, msglen);
            if (e != SF_JPEG_OK) return e;
        } else if (memcmp(name, "IHDR", 4) == 0) {
            return sf_image_fail(SF_PNG_E_MALFORMED, msg, msglen, "a second IHDR chunk at byte %zu", pos);
        } else if (memcmp(name, "PLTE", 4) == 0) {
            have_plte = 1;
        } else if (memcmp(name, "IDAT", 4) == 0) {
            if (d[16 + 9] == 3 && !have_plte) /* IHDR's colour type */
                return sf_image_fail(SF_PNG_E_MALFORMED, msg, msglen, "a palette image's IDAT at byte %zu comes before PLTE", pos);
            have_idat = 1;
        } else if (memcmp(name, "eXIf", 4) == 0 && !have_exif) {
            got.orientation = sf_exif_orientation(body, n);
            have_exif = 1;
        } else if (memcmp(name, "IEND", 4) == 0) {
            if (n != 0)
                return sf_image_fail(SF_PNG_E_MALFORMED, msg, msglen, "IEND at byte %zu declares %u bytes; it is empty", pos, n);
            if (!have_idat)
                return sf_image_fail(SF_PNG_E_MALFORMED, msg, msglen, "IEND at byte %zu comes before any IDAT chunk", pos);
            got.data_len = (int64_t)(pos + 12 + n);
            *info = got;
            return SF_JPEG_OK;
        } else if (!(type[0] & 0x20)) {
            /* A critical chunk this reader does not know: a decoder must
             * refuse the file (§5.4), so it is refused here. */
            return sf_image_fail(SF_PNG_E_UNSUPPORTED, msg, msglen, "an unknown critical chunk %s at byte %zu", name, pos);
        }
        pos += 12 + (size_t)n;
    }
}
