/* server/png_header.h — reads a PNG file's structure without decoding it.
 *
 * As server/jpeg_header.h does for JPEG: each file of an encoded batch is
 * checked on the host as soon as its last byte has arrived, so that a
 * decompression bomb (a 65535x65535 IHDR in a small file) costs a walk over
 * its chunk headers, never a decode or an allocation.
 *
 * What is read (the PNG specification, ISO/IEC 15948, §5 and §11): the
 * signature; IHDR, which must be the first chunk and hold a valid width,
 * height, bit depth and colour type combination, compression and filter
 * method 0 and interlace 0 or 1; then every chunk header up to IEND, each
 * chunk inside the file, IDAT present, PLTE before IDAT for a palette image.
 * Bytes after IEND are no part of the image (data_len stops there). Chunk
 * CRCs and the compressed data are not checked here: a file damaged there
 * passes and fails its decode (png_undecodable, decode.on_undecodable). An
 * eXIf chunk's orientation is read (server/image_header.h).
 *
 * Every colour type and bit depth is supported: the decoders convert
 * grayscale, palette, alpha and 16-bit images to 8-bit RGB. Refused as
 * unsupported: nothing the specification allows; an animated PNG (acTL)
 * decodes its default image, as Pillow and torchvision do.
 */
#ifndef SF_SERVER_PNG_HEADER_H
#define SF_SERVER_PNG_HEADER_H

#include "server/jpeg_header.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SF_PNG_SIGNATURE "\x89PNG\r\n\x1a\n"

/* The most chunks a file may have before IEND: each costs a few
 * instructions here, and no encoder writes more than a few hundred
 * (a 64 KiB IDAT chunk each, for the largest images jpeg.max_pixels allows). */
#define SF_PNG_MAX_CHUNKS 65536

/* Reads the header of the PNG file data[0, len): fills *info (format
 * SF_IMAGE_PNG, h, w, components 1..4 as the colour type holds them,
 * data_len, orientation) and returns SF_JPEG_OK, or an SF_PNG_E_* error (or
 * a size error, or SF_JPEG_E_NOT_JPEG without the signature) with a sentence
 * in msg. lim may be NULL. */
sf_jpeg_error sf_png_header_parse(const uint8_t *data, size_t len, const sf_jpeg_limits *lim,
                                  sf_jpeg_info *info, char *msg, size_t msglen);

#ifdef __cplusplus
}
#endif

#endif
