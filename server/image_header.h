/* server/image_header.h — reads an encoded image file's header, whatever its
 * format, without decoding it.
 *
 * A batch's encoded files (server/safetensors.h, the "files" form) may be
 * JPEG, PNG or WebP, each told apart by its first bytes (the magic bytes, as
 * libmagic and Pillow tell them: FF D8 for JPEG, the 8-byte PNG signature,
 * "RIFF" and "WEBP" for WebP), never by a name or a field of the body. Each
 * format's reader (server/jpeg_header.h, png_header.h, webp_header.h) checks
 * its file against the same limits before any decode and fills one
 * sf_jpeg_info; a file of none of the three is refused as jpeg_not_jpeg,
 * the code a file that is not a JPEG has always had.
 *
 * The EXIF orientation. JPEG (an APP1 "Exif" segment), PNG (an eXIf chunk)
 * and WebP (an EXIF chunk) carry the same TIFF-structured EXIF block;
 * sf_exif_orientation reads its orientation tag, which the decoders apply
 * when decode.exif_orientation is "apply".
 *
 * Threads and memory: pure functions, no state, no allocation.
 */
#ifndef SF_SERVER_IMAGE_HEADER_H
#define SF_SERVER_IMAGE_HEADER_H

#include "server/jpeg_header.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The format data[0, len) starts like, or -1 when it is none of them. */
int sf_image_format_of(const uint8_t *data, size_t len);

/* "jpeg", "png", "webp"; NULL when out of range. */
const char *sf_image_format_name(sf_image_format f);

/* Reads the header of the file data[0, len) by its format, as
 * sf_jpeg_header_parse does for a JPEG file. */
sf_jpeg_error sf_image_header_parse(const uint8_t *data, size_t len, const sf_jpeg_limits *lim,
                                    sf_jpeg_info *info, char *msg, size_t msglen);

/* The orientation tag (0x0112) of the first image directory of a TIFF-structured
 * EXIF block (starting "II*\0" or "MM\0*"; a leading "Exif\0\0" is skipped),
 * 1..8; 1 when the block has none, holds another value, or is damaged: a
 * damaged EXIF block costs its orientation, never its image. */
int sf_exif_orientation(const uint8_t *exif, size_t len);

#ifdef __cplusplus
}
#endif

#endif
