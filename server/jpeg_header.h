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
 * before the first SOS, and the file must end with EOI (trailing zero bytes,
 * which some writers pad with, are allowed). The entropy-coded data itself is
 * not decoded: a file whose scan data is damaged passes here and fails its
 * decode (the batch then fails, naming the sample). A progressive file's
 * scans are counted (SOS markers, which entropy-coded bytes cannot
 * imitate): each one is a pass over the whole image in the decoder, so a
 * small file of thousands of tiny scans would cost seconds of decode; more
 * than SF_JPEG_MAX_SCANS are refused as unsupported (libjpeg-turbo's
 * TJFLAG_LIMITSCANS bound, also for progressive files only; an encoder
 * writes about ten).
 *
 * Supported: 8-bit Huffman JPEG, baseline (SOF0), extended sequential (SOF1)
 * and progressive (SOF2); 1 component (grayscale, decoded to 3 equal
 * channels) or 3 components (YCbCr, or RGB as Adobe marks it) with the luma
 * sampled 1, 2 or 4 times the chroma in each direction and both chroma
 * components at 1x1 (4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1, 4:1:0). Refused as
 * unsupported: 4 components (CMYK, YCCK), 12-bit precision, lossless,
 * hierarchical and arithmetic-coded files, a height defined later by a DNL
 * marker (height 0), a progressive file of more than SF_JPEG_MAX_SCANS scans.
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

/* What a valid header says. Plain data, stored per sample in the ring slot. */
typedef struct sf_jpeg_info {
    int32_t h, w;         /* image height and width in pixels */
    int32_t components;   /* 1 or 3 (decoded to 3 channels either way) */
    int32_t subsamp;      /* sf_jpeg_subsamp */
    int32_t progressive;  /* 1: SOF2 */
    int32_t sof;          /* the SOF marker's number: 0 baseline, 1 extended, 2 progressive */
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
    SF_JPEG_ERROR_COUNT
} sf_jpeg_error;

#define SF_JPEG_MSG_CAP 160

/* The most scans (SOS markers) a file may have. */
#define SF_JPEG_MAX_SCANS 500

/* Reads the header of the file data[0, len). Fills *info (on success) and
 * returns SF_JPEG_OK, or returns the error with a sentence in msg (msg may be
 * NULL). lim may be NULL (unbounded). */
sf_jpeg_error sf_jpeg_header_parse(const uint8_t *data, size_t len, const sf_jpeg_limits *lim,
                                   sf_jpeg_info *info, char *msg, size_t msglen);

/* "jpeg_not_jpeg", ...; "ok" for SF_JPEG_OK; NULL when out of range. */
const char *sf_jpeg_error_name(sf_jpeg_error e);
/* "444", "422", "420", "440", "411", "410", "gray"; NULL when out of range. */
const char *sf_jpeg_subsamp_name(sf_jpeg_subsamp s);

#ifdef __cplusplus
}
#endif

#endif
