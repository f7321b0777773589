/* server/image_header.c — see image_header.h. The EXIF layout is that of the
 * TIFF 6.0 specification (an image file directory of 12-byte entries) as
 * EXIF 2.3 §4.6 uses it. */
#include "server/image_header.h"

#include "server/png_header.h"
#include "server/webp_header.h"

#include <stdio.h>
#include <string.h>

static const char *const format_names[SF_IMAGE_FORMAT_COUNT] = {
    [SF_IMAGE_JPEG] = "jpeg", [SF_IMAGE_PNG] = "png", [SF_IMAGE_WEBP] = "webp"};

const char *sf_image_format_name(sf_image_format f)
{
    if ((int)f < 0 || f >= SF_IMAGE_FORMAT_COUNT) return NULL;
    return format_names[f];
}

int sf_image_format_of(const uint8_t *d, size_t len)
{
    if (len >= 2 && d[0] == 0xFF && d[1] == 0xD8) return SF_IMAGE_JPEG;
    if (len >= 8 && memcmp(d, SF_PNG_SIGNATURE, 8) == 0) return SF_IMAGE_PNG;
    if (len >= 12 && memcmp(d, "RIFF", 4) == 0 && memcmp(d + 8, "WEBP", 4) == 0) return SF_IMAGE_WEBP;
    return -1;
}

sf_jpeg_error sf_image_header_parse(const uint8_t *d, size_t len, const sf_jpeg_limits *lim, sf_jpeg_info *info,
                                    char *msg, size_t msglen)
{
    switch (sf_image_format_of(d, len)) {
    case SF_IMAGE_PNG:
        return sf_png_header_parse(d, len, lim, info, msg, msglen);
    case SF_IMAGE_WEBP:
        return sf_webp_header_parse(d, len, lim, info, msg, msglen);
    case SF_IMAGE_JPEG:
        return sf_jpeg_header_parse(d, len, lim, info, msg, msglen);
    default:
        if (msg && msglen)
            snprintf(msg, msglen, "the file (%zu bytes) starts like none of JPEG, PNG or WebP", len);
        return SF_JPEG_E_NOT_JPEG;
    }
}

static unsigned get16(const uint8_t *p, int le) { return le ? p[0] | (unsigned)p[1] << 8 : (unsigned)p[0] << 8 | p[1]; }

static uint32_t get32(const uint8_t *p, int le)
{
    return le ? p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24
              : (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int sf_exif_orientation(const uint8_t *e, size_t len)
{
    if (len >= 6 && memcmp(e, "Exif\0\0", 6) == 0) {
        e += 6;
        len -= 6;
    }
    if (len < 8) return 1;
    int le;
    if (memcmp(e, "II*\0", 4) == 0) le = 1;
    else if (memcmp(e, "MM\0*", 4) == 0) le = 0;
    else return 1;
    const uint32_t ifd = get32(e + 4, le);
    if (ifd < 8 || (uint64_t)ifd + 2 > len) return 1;
    const unsigned count = get16(e + ifd, le);
    for (unsigned k = 0; k < count; k++) {
        const uint64_t at = (uint64_t)ifd + 2 + 12ull * k;
        if (at + 12 > len) return 1;
        const uint8_t *ent = e + at;
        if (get16(ent, le) != 0x0112) continue;
        const unsigned type = get16(ent + 2, le);
        if (get32(ent + 4, le) != 1) return 1;
        /* SHORT as the standard has it; LONG, which some writers use, reads
         * the same in Pillow. */
        const uint32_t v = type == 3 ? get16(ent + 8, le) : type == 4 ? get32(ent + 8, le) : 0;
        return v >= 1 && v <= 8 ? (int)v : 1;
    }
    return 1;
}
