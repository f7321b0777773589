/* server/jpeg_header.h — reads a JPEG file's structure without decoding it.
 *
 * What it is for. A batch body may carry JPEG files instead of pixels
 * (server/safetensors.h, the "jpeg" form). Each file is checked on the host as
 * soon as its last byte has arrived, before any decode: is it a JPEG, is it
 * complete, how large is it, and can the decoders (libjpeg-turbo on the
 * reference backend, nvJPEG on the GPU) take it. A file that fails is refused
 * with a stable code, so that a decompression bomb (a 65535x65535 header in a
 * 1 KB file) costs the service a few hundred bytes of parsing, never a
 * decode or an allocation.
 *
 * What is read. The marker segments from SOI up to the first SOS header:
 * every segment length must stay inside the file, exactly one SOF must come
 * before the first SOS, and the image must end with EOI. Bytes after the
 * first EOI (zero padding, a web server's trailer, a second file) are no
 * part of the image: they are allowed, and data_len tells the decoders where
 * the image ends. A file that ends with EOI (or EOI and zero bytes) and is
 * sequential costs no pass over its scan data; every other file is walked
 * from marker to marker to its first EOI (entropy-coded bytes cannot imitate
 * a marker: 0xFF is followed there by 0x00 or a restart marker), and a file
 * that ends before it is cut short. The entropy-coded data itself is not
 * decoded: a file whose scan data is damaged passes here and fails its
 * decode (the sample is then left out of its batch, or fails it:
 * decode.on_undecodable). Scans are counted on the walk: each one of a
 * progressive file is a pass over the whole image in the decoder, so a small
 * file of hundreds of tiny scans over a large header would cost seconds of
 * decode; more than sf_jpeg_scan_bound (fewer for a larger image) are
 * refused as unsupported.
 *
 * Supported: 8-bit JPEG, baseline (SOF0), extended sequential (SOF1) and
 * progressive (SOF2), Huffman- or arithmetic-coded (SOF9, SOF10); 1
 * component (grayscale, decoded to 3 equal channels), 3 components (YCbCr,
 * or RGB as Adobe marks it) with the luma sampled 1, 2 or 4 times the chroma
 * in each direction and both chroma components at 1x1 (4:4:4, 4:2:2, 4:2:0,
 * 4:4:0, 4:1:1, 4:1:0), or 4 components (CMYK or YCCK, converted to RGB;
 * subsamp reads SF_JPEG_444 for them). Refused as unsupported: 12-bit
 * precision, lossless and hierarchical files, a height defined later by a
 * DNL marker (height 0), a file of more scans than sf_jpeg_scan_bound.
 *
 * Threads and memory: pure functions, no state, no allocation.
 */
#ifndef SF_SERVER_JPEG_HEADER_H
#define SF_SERVER_JPEG_HEADER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Chroma subsampling, named by the luma's sampling factors (H x V) over the
 * chroma's 1x1. SF_JPEG_GRAY has one component. */
typedef enum sf_jpeg_subsamp {
    SF_JPEG_444 = 0, /* 1x1 */
    SF_JPEG_422,     /* 2x1 */
    SF_JPEG_420,     /* 2x2 */
    SF_JPEG_440,     /* 1x2 */
    SF_JPEG_411,     /* 4x1 */
    SF_JPEG_410,     /* 4x2 */
    SF_JPEG_GRAY,
    SF_JPEG_SUBSAMP_COUNT
} sf_jpeg_subsamp;

/* The encoded formats a batch's files may have, told apart by their first
 * bytes (server/image_header.h). */
typedef enum sf_image_format {
    SF_IMAGE_JPEG = 0,
    SF_IMAGE_PNG,
    SF_IMAGE_WEBP,
    SF_IMAGE_FORMAT_COUNT
} sf_image_format;

/* What a valid header says: of a JPEG file here, and of a PNG or WebP file
 * by server/png_header.h and server/webp_header.h, which fill the fields
 * their format has (components, subsamp, progressive and sof are JPEG's).
 * Plain data, stored per sample in the ring slot. */
typedef struct sf_jpeg_info {
    int32_t h, w;         /* image height and width in pixels */
    int32_t components;   /* 1, 3 or 4 (decoded to 3 channels in every case) */
    int32_t subsamp;      /* sf_jpeg_subsamp */
    int32_t progressive;  /* 1: SOF2 or SOF10 */
    int32_t sof;          /* the SOF marker's number: 0 baseline, 1 extended, 2 progressive,
                             9 arithmetic sequential, 10 arithmetic progressive */
    int64_t data_len;     /* bytes up to and including the first EOI marker (PNG: the IEND
                             chunk; WebP: the RIFF container): what the decoders are given
                             (bytes after it are no part of the image) */
    int32_t format;       /* sf_image_format */
    int32_t orientation;  /* the EXIF orientation tag, 1..8; 1 when the file has none */
} sf_jpeg_info;

/* The bounds a header is checked against; 0 means unbounded. */
typedef struct sf_jpeg_limits {
    int max_side;         /* largest height or width */
    int64_t max_pixels;   /* largest h * w */
} sf_jpeg_limits;

/* Every way a file is refused, one stable code each (sf_jpeg_error_name). */
typedef enum sf_jpeg_error {
    SF_JPEG_OK = 0,
    SF_JPEG_E_NOT_JPEG,      /* jpeg_not_jpeg: no SOI marker at byte 0 */
    SF_JPEG_E_TRUNCATED,     /* jpeg_truncated: the file ends inside a segment, before SOS, or without EOI */
    SF_JPEG_E_MALFORMED,     /* jpeg_malformed: a bad marker, segment length or SOF body */
    SF_JPEG_E_SIDE_TOO_LARGE,  /* jpeg_side_too_large: height or width over max_side */
    SF_JPEG_E_TOO_MANY_PIXELS, /* jpeg_too_many_pixels: h * w over max_pixels */
    SF_JPEG_E_UNSUPPORTED,   /* jpeg_unsupported: see the list above */
    SF_PNG_E_TRUNCATED,      /* png_truncated: the file ends inside a chunk or before IEND */
    SF_PNG_E_MALFORMED,      /* png_malformed: a bad chunk length, order or IHDR field */
    SF_PNG_E_UNSUPPORTED,    /* png_unsupported: server/png_header.h's list */
    SF_WEBP_E_TRUNCATED,     /* webp_truncated: the file ends inside its RIFF container */
    SF_WEBP_E_MALFORMED,     /* webp_malformed: a bad RIFF size, chunk or bitstream header */
    SF_WEBP_E_UNSUPPORTED,   /* webp_unsupported: server/webp_header.h's list */
    SF_JPEG_ERROR_COUNT
} sf_jpeg_error;

#define SF_JPEG_MSG_CAP 160

/* The most scans (SOS markers) a file may have: SF_JPEG_MAX_SCANS, and
 * fewer for a large image, since each scan of a progressive file is a pass
 * over the whole image in the decoder: at most SF_JPEG_SCAN_PIXELS / (h * w)
 * scans, but never fewer than SF_JPEG_MIN_SCANS (encoders write about ten;
 * mozjpeg's optimised progressions about twenty). */
#define SF_JPEG_MAX_SCANS 500
#define SF_JPEG_MIN_SCANS 40
#define SF_JPEG_SCAN_PIXELS (1ll << 30)

/* The scan bound above for a file of info's size. */
unsigned sf_jpeg_scan_bound(const sf_jpeg_info *info);

/* Reads the header of the file data[0, len). Fills *info (on success) and
 * returns SF_JPEG_OK, or returns the error with a sentence in msg (msg may be
 * NULL). lim may be NULL (unbounded). */
sf_jpeg_error sf_jpeg_header_parse(const uint8_t *data, size_t len, const sf_jpeg_limits *lim,
                                   sf_jpeg_info *info, char *msg, size_t msglen);

/* The SF_JPEG_FORM_* bits (gpu/backend.h) of a file whose header was read
 * (SF_JPEG_FORM_PNG or SF_JPEG_FORM_WEBP alone for those formats): what a
 * backend picks its decoder by. */
unsigned sf_jpeg_forms(const sf_jpeg_info *info);

/* Writes the message (printf-style) into msg when there is room, and
 * returns e: how each format's header reader (JPEG, PNG, WebP) refuses. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
sf_jpeg_error sf_image_fail(sf_jpeg_error e, char *msg, size_t msglen, const char *fmt, ...);

/* "jpeg_not_jpeg", ..., "png_truncated", ...; "ok" for SF_JPEG_OK; NULL when
 * out of range. */
const char *sf_jpeg_error_name(sf_jpeg_error e);
/* "444", "422", "420", "440", "411", "410", "gray"; NULL when out of range. */
const char *sf_jpeg_subsamp_name(sf_jpeg_subsamp s);

#ifdef __cplusplus
}
#endif

#endif
