/* server/webp_header.h — reads a WebP file's structure without decoding it.
 *
 * As server/jpeg_header.h does for JPEG: each file of an encoded batch is
 * checked on the host as soon as its last byte has arrived, its size bounded
 * before any decode.
 *
 * What is read (RFC 9649, the WebP container and the VP8L bitstream header;
 * RFC 6386 §9.1 for the VP8 frame header): the RIFF header, whose size must
 * lie inside the file (bytes after the container are no part of the image:
 * data_len stops there); the chunks inside it, each inside the container;
 * one image: a simple file's first chunk "VP8 " (lossy) or "VP8L"
 * (lossless), or an extended file's "VP8X" canvas followed by an optional
 * "ALPH" and one "VP8 " or "VP8L" whose size is the canvas's. An EXIF
 * chunk's orientation is read (server/image_header.h). The compressed data is
 * not decoded: a file damaged there passes and fails its decode
 * (webp_undecodable, decode.on_undecodable).
 *
 * Refused as unsupported: animated files (VP8X's animation flag), which
 * torchvision's decode_image refuses too; a VP8 frame that is not a key
 * frame; a VP8L version other than 0.
 */
#ifndef SF_SERVER_WEBP_HEADER_H
#define SF_SERVER_WEBP_HEADER_H

#include "server/jpeg_header.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most chunks a container may have: no writer makes more than a handful
 * (VP8X, ICCP, ALPH, the image, EXIF, XMP). */
#define SF_WEBP_MAX_CHUNKS 64

/* Reads the header of the WebP file data[0, len): fills *info (format
 * SF_IMAGE_WEBP, h, w, components 3 or 4 (with alpha), data_len,
 * orientation) and returns SF_JPEG_OK, or an SF_WEBP_E_* error (or a size
 * error, or SF_JPEG_E_NOT_JPEG without "RIFF" and "WEBP") with a sentence in
 * msg. lim may be NULL. */
sf_jpeg_error sf_webp_header_parse(const uint8_t *data, size_t len, const sf_jpeg_limits *lim,
                                   sf_jpeg_info *info, char *msg, size_t msglen);

#ifdef __cplusplus
}
#endif

#endif
