/* tests/fuzz/fuzz_image_header.h — what the JPEG, PNG and WebP header
 * targets share: the checks every successful read must pass, and the file split in
 * two samples of one "files" body through the safetensors parser.
 *
 * Included by one target each (static functions, no state; the JPEG target
 * checks its reader's richer result itself and leaves check_reader unused,
 * and sends its bodies under the "jpeg" alias). */
#ifndef SF_TESTS_FUZZ_IMAGE_HEADER_H
#define SF_TESTS_FUZZ_IMAGE_HEADER_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/image_header.h"
#include "server/safetensors.h"

#define CHECK(cond) do { if (!(cond)) __builtin_trap(); } while (0)

static const sf_jpeg_limits LIM = {4096, 4096 * 1024};

/* Feeds body in chunks of at most chunk bytes (0: whole) and finishes. */
static int run_body(sf_st_parser *p, const uint8_t *body, size_t len, size_t chunk, uint8_t **dest)
{
    sf_st_limits lim;
    memset(&lim, 0, sizeof lim);
    lim.max_n = 8;
    lim.jpeg_max_side = LIM.max_side;
    lim.jpeg_max_pixels = LIM.max_pixels;
    sf_st_init(p, &lim);
    *dest = NULL;
    size_t off = 0;
    while (off < len && sf_st_state_of(p) != SF_ST_FAILED) {
        size_t n = chunk && chunk < len - off ? chunk : len - off;
        const uint8_t *d = body + off;
        size_t left = n;
        while (left > 0 && sf_st_state_of(p) != SF_ST_FAILED) {
            size_t used = sf_st_feed(p, d, left);
            d += used;
            left -= used;
            if (sf_st_state_of(p) == SF_ST_NEED_DEST) {
                size_t cap = (size_t)sf_st_info_of(p)->dest_bytes;
                *dest = malloc(cap ? cap : 1);
                CHECK(*dest);
                sf_st_set_dest(p, *dest, cap);
            } else if (used == 0) {
                CHECK(sf_st_state_of(p) == SF_ST_FAILED);
            }
        }
        off += n;
    }
    return sf_st_finish(p);
}

/* Reads data with parse (a format's reader) and checks its verdict: a known
 * code, the same on a second call, and on success a size within the limits,
 * the format's own, and an image that ends inside the file. Returns the
 * verdict; *info is filled on success. */
static sf_jpeg_error check_reader(sf_jpeg_error (*parse)(const uint8_t *, size_t, const sf_jpeg_limits *,
                                                         sf_jpeg_info *, char *, size_t),
                                  sf_image_format format, const uint8_t *data, size_t size, sf_jpeg_info *info)
{
    sf_jpeg_info b;
    char msg[SF_JPEG_MSG_CAP];
    memset(info, 0, sizeof *info);
    sf_jpeg_error ea = parse(data, size, &LIM, info, msg, sizeof msg);
    CHECK(sf_jpeg_error_name(ea) != NULL);
    CHECK(memchr(msg, '\0', sizeof msg) != NULL);
    memset(&b, 0, sizeof b);
    CHECK(parse(data, size, &LIM, &b, NULL, 0) == ea);
    if (ea != SF_JPEG_OK)
        return ea;
    CHECK(memcmp(info, &b, sizeof b) == 0);
    CHECK(info->format == (int32_t)format);
    CHECK(info->h >= 1 && info->w >= 1 && info->h <= LIM.max_side && info->w <= LIM.max_side);
    CHECK((int64_t)info->h * info->w <= LIM.max_pixels);
    CHECK(info->orientation >= 1 && info->orientation <= 8);
    CHECK(info->data_len >= 12 && (size_t)info->data_len <= size);
    /* The dispatcher reads it the same way. */
    sf_jpeg_info c;
    CHECK(sf_image_header_parse(data, size, &LIM, &c, NULL, 0) == SF_JPEG_OK);
    CHECK(memcmp(&c, info, sizeof c) == 0);
    return ea;
}

/* The file, split in two at a point derived from its hash, as a two-sample
 * body in two chunkings, its tensors named files and files_offsets
 * ("files", or the alias "jpeg"): both runs agree, and the outcome is the
 * readers' verdict on the first half that fails. */
static void check_body(const uint8_t *data, size_t size, const char *files)
{
    if (size < 2 || size > 1 << 16)
        return;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++) h = (h ^ data[i]) * 1099511628211ull;
    size_t cut = 1 + (size_t)(h % (size - 1));
    sf_jpeg_info a, b;
    sf_jpeg_error e0 = sf_image_header_parse(data, cut, &LIM, &a, NULL, 0);
    sf_jpeg_error e1 = sf_image_header_parse(data + cut, size - cut, &LIM, &b, NULL, 0);
    int64_t off[3] = {0, (int64_t)cut, (int64_t)size};
    char offsets[32];
    snprintf(offsets, sizeof offsets, "%s_offsets", files);
    sf_st_tensor_desc t[2] = {{offsets, SF_ST_I64, 1, {3}}, {files, SF_ST_U8, 1, {(int64_t)size}}};
    size_t hl = sf_st_header_build(NULL, 0, t, 2, NULL);
    CHECK(hl > 0);
    size_t len = hl + sizeof off + size;
    uint8_t *body = malloc(len);
    CHECK(body);
    CHECK(sf_st_header_build((char *)body, hl, t, 2, NULL) == hl);
    memcpy(body + hl, off, sizeof off);
    memcpy(body + hl + sizeof off, data, size);
    sf_st_parser p1, p2;
    uint8_t *d1, *d2;
    int r1 = run_body(&p1, body, len, 0, &d1);
    int r2 = run_body(&p2, body, len, 1 + (size_t)(h >> 32) % 97, &d2);
    CHECK(r1 == r2 && sf_st_error_of(&p1) == sf_st_error_of(&p2));
    CHECK(sf_st_bad_sample(&p1) == sf_st_bad_sample(&p2));
    sf_jpeg_error want = e0 != SF_JPEG_OK ? e0 : e1;
    if (want == SF_JPEG_OK) {
        CHECK(r1 == 0);
        CHECK(sf_st_info_of(&p1)->jpeg_pixels == (int64_t)a.h * a.w + (int64_t)b.h * b.w);
    } else {
        CHECK(r1 == -1);
        CHECK(sf_st_error_of(&p1) == (sf_st_error)(SF_ST_E_JPEG_NOT_JPEG + (want - SF_JPEG_E_NOT_JPEG)));
        CHECK(sf_st_bad_sample(&p1) == (e0 != SF_JPEG_OK ? 0 : 1));
    }
    free(d1);
    free(d2);
    sf_st_free(&p1);
    sf_st_free(&p2);
    free(body);
}

#endif
