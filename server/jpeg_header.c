/* server/jpeg_header.c — see jpeg_header.h. Marker numbers and segment
 * layouts are those of ITU-T T.81 (JPEG) Annex B. */
#include "server/jpeg_header.h"

#include "gpu/backend.h"
#include "server/image_header.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const error_names[SF_JPEG_ERROR_COUNT] = {
    [SF_JPEG_OK] = "ok",
    [SF_JPEG_E_NOT_JPEG] = "jpeg_not_jpeg",
    [SF_JPEG_E_TRUNCATED] = "jpeg_truncated",
    [SF_JPEG_E_MALFORMED] = "jpeg_malformed",
    [SF_JPEG_E_SIDE_TOO_LARGE] = "jpeg_side_too_large",
    [SF_JPEG_E_TOO_MANY_PIXELS] = "jpeg_too_many_pixels",
    [SF_JPEG_E_UNSUPPORTED] = "jpeg_unsupported",
    [SF_PNG_E_TRUNCATED] = "png_truncated",
    [SF_PNG_E_MALFORMED] = "png_malformed",
    [SF_PNG_E_UNSUPPORTED] = "png_unsupported",
    [SF_WEBP_E_TRUNCATED] = "webp_truncated",
    [SF_WEBP_E_MALFORMED] = "webp_malformed",
    [SF_WEBP_E_UNSUPPORTED] = "webp_unsupported",
};

static const char *const subsamp_names[SF_JPEG_SUBSAMP_COUNT] = {
    [SF_JPEG_444] = "444", [SF_JPEG_422] = "422", [SF_JPEG_420] = "420", [SF_JPEG_440] = "440",
    [SF_JPEG_411] = "411", [SF_JPEG_410] = "410", [SF_JPEG_GRAY] = "gray",
};

const char *sf_jpeg_error_name(sf_jpeg_error e)
{
    if ((int)e < 0 || e >= SF_JPEG_ERROR_COUNT) return NULL;
    return error_names[e];
}

unsigned sf_jpeg_forms(const sf_jpeg_info *info)
{
    if (info->format == SF_IMAGE_PNG)
        return SF_JPEG_FORM_PNG;
    if (info->format == SF_IMAGE_WEBP)
        return SF_JPEG_FORM_WEBP;
    unsigned f = 0;
    if (info->progressive)
        f |= SF_JPEG_FORM_PROGRESSIVE;
    else if (info->sof != 0)
        f |= SF_JPEG_FORM_EXTENDED;
    if (info->sof >= 9)
        f |= SF_JPEG_FORM_ARITHMETIC;
    if (info->components == 4)
        f |= SF_JPEG_FORM_CMYK;
    if (info->subsamp == SF_JPEG_411 || info->subsamp == SF_JPEG_410)
        f |= SF_JPEG_FORM_CHROMA_4X;
    return f;
}

const char *sf_jpeg_subsamp_name(sf_jpeg_subsamp s)
{
    if ((int)s < 0 || s >= SF_JPEG_SUBSAMP_COUNT) return NULL;
    return subsamp_names[s];
}

sf_jpeg_error sf_image_fail(sf_jpeg_error e, char *msg, size_t msglen, const char *fmt, ...)
{
    if (msg && msglen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msglen, fmt, ap);
        va_end(ap);
    }
    return e;
}

unsigned sf_jpeg_scan_bound(const sf_jpeg_info *info)
{
    const int64_t px = (int64_t)info->h * info->w;
    const int64_t by_pixels = px > 0 ? SF_JPEG_SCAN_PIXELS / px : SF_JPEG_MAX_SCANS;
    return by_pixels > SF_JPEG_MAX_SCANS ? SF_JPEG_MAX_SCANS
           : by_pixels < SF_JPEG_MIN_SCANS ? SF_JPEG_MIN_SCANS : (unsigned)by_pixels;
}

static unsigned be16(const uint8_t *p) { return (unsigned)p[0] << 8 | p[1]; }

/* The luma's sampling factors over 1x1 chroma, as a subsampling; -1 if none fits. */
static int subsamp_of(int h, int v)
{
    if (h == 1 && v == 1) return SF_JPEG_444;
    if (h == 2 && v == 1) return SF_JPEG_422;
    if (h == 2 && v == 2) return SF_JPEG_420;
    if (h == 1 && v == 2) return SF_JPEG_440;
    if (h == 4 && v == 1) return SF_JPEG_411;
    if (h == 4 && v == 2) return SF_JPEG_410;
    return -1;
}

/* The SOF segment body (after its length): precision, size, components. */
static sf_jpeg_error parse_sof(int sof, const uint8_t *b, size_t n, const sf_jpeg_limits *lim,
                               sf_jpeg_info *info, char *msg, size_t msglen)
{
    if (n < 6)
        return sf_image_fail(SF_JPEG_E_MALFORMED, msg, msglen, "the SOF%d segment holds %zu bytes; it needs at least 6",
                    sof, n);
    int prec = b[0], h = (int)be16(b + 1), w = (int)be16(b + 3), nc = b[5];
    if (n != 6 + 3 * (size_t)nc)
        return sf_image_fail(SF_JPEG_E_MALFORMED, msg, msglen,
                    "the SOF%d segment holds %zu bytes for %d components; it must hold %d", sof, n, nc,
                    6 + 3 * nc);
    if (prec != 8)
        return sf_image_fail(SF_JPEG_E_UNSUPPORTED, msg, msglen, "%d-bit samples; only 8-bit JPEG is supported", prec);
    if (w == 0)
        return sf_image_fail(SF_JPEG_E_MALFORMED, msg, msglen, "the image width is 0");
    if (h == 0)
        return sf_image_fail(SF_JPEG_E_UNSUPPORTED, msg, msglen,
                    "the height is defined by a DNL marker (height 0 in SOF), which is not supported");
    /* The bounds come before anything else about the image, so that a bomb is
     * named as such even when its other fields are odd too. */
    if (lim && lim->max_side > 0 && (h > lim->max_side || w > lim->max_side))
        return sf_image_fail(SF_JPEG_E_SIDE_TOO_LARGE, msg, msglen, "the image is %dx%d (HxW); jpeg.max_side is %d", h,
                    w, lim->max_side);
    if (lim && lim->max_pixels > 0 && (int64_t)h * w > lim->max_pixels)
        return sf_image_fail(SF_JPEG_E_TOO_MANY_PIXELS, msg, msglen,
                    "the image is %dx%d (HxW), %lld pixels; jpeg.max_pixels is %lld", h, w,
                    (long long)h * w, (long long)lim->max_pixels);
    if (nc != 1 && nc != 3 && nc != 4)
        return sf_image_fail(SF_JPEG_E_UNSUPPORTED, msg, msglen,
                    "%d components; only grayscale (1), colour (3) and CMYK or YCCK (4) are supported", nc);
    int ss = SF_JPEG_GRAY;
    if (nc == 3) {
        int h0 = b[7] >> 4, v0 = b[7] & 15;
        for (int k = 1; k < 3; k++) {
            int hk = b[7 + 3 * k] >> 4, vk = b[7 + 3 * k] & 15;
            if (hk != 1 || vk != 1)
                return sf_image_fail(SF_JPEG_E_UNSUPPORTED, msg, msglen,
                            "component %d is sampled %dx%d; chroma must be sampled 1x1", k, hk, vk);
        }
        ss = subsamp_of(h0, v0);
        if (ss < 0)
            return sf_image_fail(SF_JPEG_E_UNSUPPORTED, msg, msglen,
                        "luma sampled %dx%d over chroma 1x1 is not a supported subsampling", h0, v0);
    } else if (nc == 4) {
        /* CMYK and YCCK go to libjpeg-turbo, which takes any factors 1..4. */
        for (int k = 0; k < 4; k++) {
            int hk = b[7 + 3 * k] >> 4, vk = b[7 + 3 * k] & 15;
            if (hk < 1 || hk > 4 || vk < 1 || vk > 4)
                return sf_image_fail(SF_JPEG_E_MALFORMED, msg, msglen, "component %d is sampled %dx%d; factors are 1..4", k,
                            hk, vk);
        }
        ss = SF_JPEG_444;
    } else if ((b[7] >> 4) < 1 || (b[7] & 15) < 1) {
        return sf_image_fail(SF_JPEG_E_MALFORMED, msg, msglen, "a sampling factor of 0");
    }
    info->h = h;
    info->w = w;
    info->components = nc;
    info->subsamp = ss;
    info->progressive = sof == 2 || sof == 10;
    info->sof = sof;
    return SF_JPEG_OK;
}

/* Walks the scans from the first SOS marker (at byte sos) to the first EOI
 * and sets info->data_len to the bytes up to and including it. In
 * entropy-coded data a 0xFF byte is followed by 0x00 (a stuffed zero) or a
 * restart marker, so every other marker there is a real one: a segment
 * between scans (DHT, DQT, DRI, COM, APPn, or the next scan's SOS) whose
 * length is skipped, or EOI. A file that ends before its EOI is cut short.
 * Scans are counted: in a progressive file each one is a pass over the
 * whole image in the decoder, so a small file of thousands of tiny scans
 * would cost seconds of decode; more than the bound of
 * sf_jpeg_scan_bound are refused as unsupported. A sequential file's scans
 * each carry components of their own, so they are bounded by its component
 * count. */
static sf_jpeg_error walk_scans(const uint8_t *d, size_t sos, size_t len, sf_jpeg_info *info, char *msg,
                                size_t msglen)
{
    const unsigned bound = sf_jpeg_scan_bound(info);
    unsigned scans = 0;
    size_t pos = sos;
    for (;;) {
        /* pos is at a marker's 0xFF (fill bytes may follow) */
        if (pos < len && d[pos] != 0xFF)
            return sf_image_fail(SF_JPEG_E_MALFORMED, msg, msglen, "byte %zu is 0x%02x where a marker must start", pos,
                        d[pos]);
        while (pos < len && d[pos] == 0xFF) pos++;
        if (pos >= len)
            return sf_image_fail(SF_JPEG_E_TRUNCATED, msg, msglen,
                        "the file (%zu bytes) ends before its EOI marker: it is cut short", len);
        const unsigned m = d[pos++];
        if (m == 0xD9) {
            info->data_len = (int64_t)pos;
            return SF_JPEG_OK;
        }
        if (m == 0x00 || m == 0x01 || m == 0xD8 || (m >= 0xD0 && m <= 0xD7) || (m >= 0xC0 && m <= 0xCF &&
                                                                               m != 0xC4 && m != 0xCC))
            return sf_image_fail(SF_JPEG_E_MALFORMED, msg, msglen, "the marker 0xFF%02X at byte %zu is out of place", m,
                        pos - 2);
        if (m == 0xDA && ++scans > bound)
            return sf_image_fail(SF_JPEG_E_UNSUPPORTED, msg, msglen,
                        "more than %u scans (each one a pass over the whole image in the decoder; an "
                        "encoder writes about ten)", bound);
        if (pos + 2 > len)
            return sf_image_fail(SF_JPEG_E_TRUNCATED, msg, msglen,
                        "the file (%zu bytes) ends inside the length of marker 0xFF%02X: it is cut short", len, m);
        const size_t seg = be16(d + pos);
        if (seg < 2)
            return sf_image_fail(SF_JPEG_E_MALFORMED, msg, msglen, "marker 0xFF%02X declares a segment length of %zu", m,
                        seg);
        pos += seg;
        if (pos > len)
            return sf_image_fail(SF_JPEG_E_TRUNCATED, msg, msglen,
                        "the file (%zu bytes) ends inside the segment of marker 0xFF%02X: it is cut short", len, m);
        if (m != 0xDA)
            continue;
        /* Entropy-coded data up to the next marker. */
        for (;;) {
            const uint8_t *p = memchr(d + pos, 0xFF, len - pos);
            if (!p)
                return sf_image_fail(SF_JPEG_E_TRUNCATED, msg, msglen,
                            "the file (%zu bytes) ends inside a scan, before its EOI marker: it is cut short",
                            len);
            size_t q = (size_t)(p - d) + 1;
            while (q < len && d[q] == 0xFF) q++;
            if (q >= len)
                return sf_image_fail(SF_JPEG_E_TRUNCATED, msg, msglen,
                            "the file (%zu bytes) ends inside a scan, before its EOI marker: it is cut short",
                            len);
            if (d[q] == 0x00 || (d[q] >= 0xD0 && d[q] <= 0xD7)) {
                pos = q + 1;
                continue;
            }
            pos = (size_t)(p - d);
            break;
        }
    }
}

sf_jpeg_error sf_jpeg_header_parse(const uint8_t *d, size_t len, const sf_jpeg_limits *lim,
                                   sf_jpeg_info *info, char *msg, size_t msglen)
{
    if (msg && msglen) msg[0] = '\0';
    sf_jpeg_info got;
    memset(&got, 0, sizeof got);
    got.format = SF_IMAGE_JPEG;
    got.orientation = 1;
    if (len < 2 || d[0] != 0xFF || d[1] != 0xD8)
        return sf_image_fail(SF_JPEG_E_NOT_JPEG, msg, msglen, "the file (%zu bytes) does not start with a JPEG SOI marker",
                    len);
    int have_sof = 0, have_exif = 0;
    size_t pos = 2;
    for (;;) {
        /* A marker is 0xFF, optional 0xFF fill bytes, then its number. */
        if (pos >= len)
            return sf_image_fail(SF_JPEG_E_TRUNCATED, msg, msglen, "the file ends at byte %zu, before any scan", len);
        if (d[pos] != 0xFF)
            return sf_image_fail(SF_JPEG_E_MALFORMED, msg, msglen, "byte %zu is 0x%02x where a marker must start", pos,
                        d[pos]);
        while (pos < len && d[pos] == 0xFF) pos++;
        if (pos >= len)
            return sf_image_fail(SF_JPEG_E_TRUNCATED, msg, msglen, "the file ends inside a marker at byte %zu", len);
        unsigned m = d[pos++];
        if (m == 0x00 || m == 0xD8 || m == 0xD9 || (m >= 0xD0 && m <= 0xD7) || m == 0x01)
            return sf_image_fail(SF_JPEG_E_MALFORMED, msg, msglen, "the marker 0xFF%02X at byte %zu is out of place", m,
                        pos - 2);
        if (pos + 2 > len)
            return sf_image_fail(SF_JPEG_E_TRUNCATED, msg, msglen, "the file ends inside the length of marker 0xFF%02X", m);
        size_t seg = be16(d + pos);
        if (seg < 2)
            return sf_image_fail(SF_JPEG_E_MALFORMED, msg, msglen, "marker 0xFF%02X declares a segment length of %zu", m,
                        seg);
        if (pos + seg > len)
            return sf_image_fail(SF_JPEG_E_TRUNCATED, msg, msglen,
                        "marker 0xFF%02X at byte %zu declares %zu bytes but the file ends at byte %zu", m,
                        pos - 2, seg, len);
        const uint8_t *body = d + pos + 2;
        size_t n = seg - 2;
        if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
            int sof = (int)(m - 0xC0);
            if (have_sof)
                return sf_image_fail(SF_JPEG_E_MALFORMED, msg, msglen, "a second SOF marker (SOF%d) at byte %zu", sof,
                            pos - 2);
            if (sof == 3 || sof == 7 || sof == 11 || sof == 15)
                return sf_image_fail(SF_JPEG_E_UNSUPPORTED, msg, msglen, "lossless JPEG (SOF%d) is not supported", sof);
            if (sof >= 5 && sof != 9 && sof != 10)
                return sf_image_fail(SF_JPEG_E_UNSUPPORTED, msg, msglen,
                            "hierarchical JPEG (SOF%d) is not supported", sof);
            sf_jpeg_error e = parse_sof(sof, body, n, lim, &got, msg, msglen);
            if (e != SF_JPEG_OK) return e;
            have_sof = 1;
        } else if (m == 0xE1 && !have_exif && n >= 6 && memcmp(body, "Exif\0\0", 6) == 0) {
            /* The first Exif segment is the one Pillow reads. */
            got.orientation = sf_exif_orientation(body, n);
            have_exif = 1;
        } else if (m == 0xDA) {
            if (!have_sof)
                return sf_image_fail(SF_JPEG_E_MALFORMED, msg, msglen, "a scan (SOS) at byte %zu before any SOF marker",
                            pos - 2);
            break;
        }
        pos += seg;
    }
    /* The scan data is not decoded, but its end is found: the decoders stop
     * at the first EOI, and bytes after it (which some writers and web
     * servers append) are no part of the image. A file whose last bytes are
     * EOI (or EOI and zero padding) is complete, and a baseline one costs no
     * pass over its bytes here; any other file is walked to its EOI. */
    size_t end = len;
    while (end > pos && d[end - 1] == 0x00) end--;
    const int ends_with_eoi = end >= pos + 2 && d[end - 2] == 0xFF && d[end - 1] == 0xD9;
    if (ends_with_eoi && !got.progressive) {
        got.data_len = (int64_t)end;
    } else {
        sf_jpeg_error e = walk_scans(d, pos - 2, len, &got, msg, msglen);
        if (e != SF_JPEG_OK) return e;
    }
    *info = got;
    return SF_JPEG_OK;
}
