/* tests/unit/test_png_webp_header.c — the PNG and WebP header readers
 * (server/png_header.h, server/webp_header.h), the format dispatch and the
 * EXIF orientation reader (server/image_header.h).
 *
 * The files are built chunk by chunk here (the readers check structure, not
 * CRCs or compressed data), so each code has an input of its own; the
 * decoders' side is tests/integration/test_png_webp_files.py's. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "gpu/backend.h"
#include "server/image_header.h"
#include "server/png_header.h"
#include "server/webp_header.h"

typedef struct buf {
    uint8_t d[512];
    size_t len;
} buf;

static void put(buf *b, const void *p, size_t n)
{
    assert_true(b->len + n <= sizeof b->d);
    memcpy(b->d + b->len, p, n);
    b->len += n;
}

static void be32(buf *b, uint32_t v)
{
    const uint8_t x[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    put(b, x, 4);
}

static void le32(buf *b, uint32_t v)
{
    const uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, x, 4);
}

/* A chunk with a zero CRC: the reader does not check CRCs. */
static void png_chunk(buf *b, const char *type, const void *data, uint32_t n)
{
    be32(b, n);
    put(b, type, 4);
    if (n) put(b, data, n);
    be32(b, 0);
}

static void png_ihdr(buf *b, uint32_t w, uint32_t h, int depth, int type)
{
    uint8_t d[13] = {0};
    for (int k = 0; k < 4; k++) {
        d[k] = (uint8_t)(w >> (24 - 8 * k));
        d[4 + k] = (uint8_t)(h >> (24 - 8 * k));
    }
    d[8] = (uint8_t)depth;
    d[9] = (uint8_t)type;
    put(b, SF_PNG_SIGNATURE, 8);
    png_chunk(b, "IHDR", d, 13);
}

static buf png(uint32_t w, uint32_t h, int depth, int type)
{
    buf b = {{0}, 0};
    png_ihdr(&b, w, h, depth, type);
    if (type == 3) png_chunk(&b, "PLTE", "\0\0\0", 3);
    png_chunk(&b, "IDAT", "\x78\x9c", 2);
    png_chunk(&b, "IEND", NULL, 0);
    return b;
}

static sf_jpeg_error parse(const buf *b, sf_jpeg_info *info)
{
    static const sf_jpeg_limits lim = {4096, 4096 * 2048};
    char msg[SF_JPEG_MSG_CAP];
    sf_jpeg_error e = sf_image_header_parse(b->d, b->len, &lim, info, msg, sizeof msg);
    assert_true(e == SF_JPEG_OK || msg[0] != '\0');
    return e;
}

static void test_a_png_of_every_colour_type_reads_its_size_and_ends_at_iend(void **state)
{
    (void)state;
    const int types[][2] = {{8, 2}, {16, 2}, {8, 6}, {16, 6}, {1, 0}, {16, 0}, {8, 4}, {4, 3}};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        buf b = png(40, 24, types[k][0], types[k][1]);
        const size_t whole = b.len;
        put(&b, "trailer", 7);
        sf_jpeg_info info;
        assert_int_equal(parse(&b, &info), SF_JPEG_OK);
        assert_int_equal(info.format, SF_IMAGE_PNG);
        assert_int_equal(info.h, 24);
        assert_int_equal(info.w, 40);
        assert_int_equal(info.data_len, (int64_t)whole);
        assert_int_equal(info.orientation, 1);
        assert_int_equal(sf_jpeg_forms(&info), SF_JPEG_FORM_PNG);
    }
}

static void test_every_cut_of_a_png_is_png_truncated(void **state)
{
    (void)state;
    buf b = png(40, 24, 8, 2);
    for (size_t cut = 8; cut < b.len; cut++) {
        buf c = b;
        c.len = cut;
        sf_jpeg_info info;
        assert_int_equal(parse(&c, &info), SF_PNG_E_TRUNCATED);
    }
}

static void test_bad_ihdr_fields_and_chunk_order_are_png_malformed(void **state)
{
    (void)state;
    sf_jpeg_info info;
    buf b = png(40, 24, 7, 2); /* no such depth */
    assert_int_equal(parse(&b, &info), SF_PNG_E_MALFORMED);
    b = png(40, 24, 8, 5); /* no such colour type */
    assert_int_equal(parse(&b, &info), SF_PNG_E_MALFORMED);
    b = png(0, 24, 8, 2);
    assert_int_equal(parse(&b, &info), SF_PNG_E_MALFORMED);
    /* a palette image without PLTE before its IDAT */
    b = (buf){{0}, 0};
    png_ihdr(&b, 4, 4, 8, 3);
    png_chunk(&b, "IDAT", "x", 1);
    png_chunk(&b, "IEND", NULL, 0);
    assert_int_equal(parse(&b, &info), SF_PNG_E_MALFORMED);
    /* IEND without IDAT */
    b = (buf){{0}, 0};
    png_ihdr(&b, 4, 4, 8, 2);
    png_chunk(&b, "IEND", NULL, 0);
    assert_int_equal(parse(&b, &info), SF_PNG_E_MALFORMED);
    /* a chunk type that is not letters */
    b = png(4, 4, 8, 2);
    b.d[33 + 4] = '1';
    assert_int_equal(parse(&b, &info), SF_PNG_E_MALFORMED);
}

static void test_an_unknown_critical_chunk_is_png_unsupported_and_an_ancillary_one_is_skipped(void **state)
{
    (void)state;
    sf_jpeg_info info;
    buf b = {{0}, 0};
    png_ihdr(&b, 4, 4, 8, 2);
    png_chunk(&b, "teXt", "a\0b", 3);
    png_chunk(&b, "IDAT", "x", 1);
    png_chunk(&b, "IEND", NULL, 0);
    assert_int_equal(parse(&b, &info), SF_JPEG_OK);
    b = (buf){{0}, 0};
    png_ihdr(&b, 4, 4, 8, 2);
    png_chunk(&b, "ABCD", "x", 1);
    png_chunk(&b, "IDAT", "x", 1);
    png_chunk(&b, "IEND", NULL, 0);
    assert_int_equal(parse(&b, &info), SF_PNG_E_UNSUPPORTED);
}

static void test_a_png_bomb_is_refused_by_side_then_by_pixels_before_its_data(void **state)
{
    (void)state;
    sf_jpeg_info info;
    buf b = {{0}, 0};
    png_ihdr(&b, 65535, 16, 8, 2); /* nothing after IHDR: the size is refused first */
    assert_int_equal(parse(&b, &info), SF_JPEG_E_SIDE_TOO_LARGE);
    b = (buf){{0}, 0};
    png_ihdr(&b, 4096, 4096, 8, 2);
    assert_int_equal(parse(&b, &info), SF_JPEG_E_TOO_MANY_PIXELS);
}

/* An EXIF block: "Exif\0\0" when with_prefix, a TIFF header of byte order
 * le, one IFD entry of the orientation tag of the given type. */
static void exif(buf *b, int le, int type, uint32_t o, int with_prefix)
{
    if (with_prefix) put(b, "Exif\0\0", 6);
    uint8_t t[26] = {0};
    memcpy(t, le ? "II*\0" : "MM\0*", 4);
    t[le ? 4 : 7] = 8;  /* IFD at 8 */
    t[le ? 8 : 9] = 1;  /* one entry */
    t[le ? 10 : 11] = 0x12;
    t[le ? 11 : 10] = 0x01;
    t[le ? 12 : 13] = (uint8_t)type;
    t[le ? 14 : 17] = 1; /* count 1 */
    if (type == 3) {
        t[le ? 18 : 19] = (uint8_t)o;
    } else {
        t[le ? 18 : 21] = (uint8_t)o;
    }
    put(b, t, sizeof t);
}

static void test_the_exif_orientation_is_read_in_either_byte_order_and_a_damaged_block_reads_1(void **state)
{
    (void)state;
    for (int le = 0; le < 2; le++) {
        for (uint32_t o = 1; o <= 8; o++) {
            buf b = {{0}, 0};
            exif(&b, le, 3, o, le);
            assert_int_equal(sf_exif_orientation(b.d, b.len), (int)o);
        }
        buf l = {{0}, 0};
        exif(&l, le, 4, 6, 0); /* LONG, as some writers store it */
        assert_int_equal(sf_exif_orientation(l.d, l.len), 6);
        buf n = {{0}, 0};
        exif(&n, le, 3, 9, 0); /* no such orientation */
        assert_int_equal(sf_exif_orientation(n.d, n.len), 1);
        /* Cut anywhere before the end of its entry (8 + 2 + 12 bytes), the
         * block reads 1. */
        for (size_t cut = 0; cut < 22; cut++)
            assert_int_equal(sf_exif_orientation(l.d, cut), 1);
        assert_int_equal(sf_exif_orientation(l.d, 22), 6);
    }
}

static void test_a_png_exif_chunk_gives_its_orientation(void **state)
{
    (void)state;
    buf e = {{0}, 0};
    exif(&e, 0, 3, 6, 0);
    buf b = {{0}, 0};
    png_ihdr(&b, 40, 24, 8, 2);
    png_chunk(&b, "IDAT", "x", 1);
    png_chunk(&b, "eXIf", e.d, (uint32_t)e.len); /* after IDAT, as Pillow reads it too */
    png_chunk(&b, "IEND", NULL, 0);
    sf_jpeg_info info;
    assert_int_equal(parse(&b, &info), SF_JPEG_OK);
    assert_int_equal(info.orientation, 6);
    assert_int_equal(info.h, 24); /* the stored size: turning is the upload's choice */
}

static void riff(buf *b, size_t body)
{
    put(b, "RIFF", 4);
    le32(b, (uint32_t)(4 + body));
    put(b, "WEBP", 4);
}

/* A VP8L chunk header of w x h (with the alpha hint). */
static void vp8l(buf *b, uint32_t w, uint32_t h, int alpha)
{
    put(b, "VP8L", 4);
    le32(b, 6);
    const uint32_t bits = (w - 1) | (h - 1) << 14 | (uint32_t)alpha << 28;
    const uint8_t d[6] = {0x2F, (uint8_t)bits, (uint8_t)(bits >> 8), (uint8_t)(bits >> 16), (uint8_t)(bits >> 24), 0};
    put(b, d, 6);
}

static void vp8(buf *b, uint32_t w, uint32_t h)
{
    put(b, "VP8 ", 4);
    le32(b, 10);
    const uint8_t d[10] = {0x10, 0, 0, 0x9D, 0x01, 0x2A, (uint8_t)w, (uint8_t)(w >> 8), (uint8_t)h, (uint8_t)(h >> 8)};
    put(b, d, 10);
}

static void vp8x(buf *b, uint8_t flags, uint32_t w, uint32_t h)
{
    put(b, "VP8X", 4);
    le32(b, 10);
    const uint8_t d[10] = {flags, 0, 0, 0, (uint8_t)(w - 1), (uint8_t)((w - 1) >> 8), (uint8_t)((w - 1) >> 16),
                           (uint8_t)(h - 1), (uint8_t)((h - 1) >> 8), (uint8_t)((h - 1) >> 16)};
    put(b, d, 10);
}

static void test_simple_and_extended_webp_files_read_their_size_and_end_at_their_container(void **state)
{
    (void)state;
    sf_jpeg_info info;
    buf b = {{0}, 0};
    riff(&b, 14);
    vp8l(&b, 40, 24, 1);
    const size_t whole = b.len;
    put(&b, "\0tail", 5);
    assert_int_equal(parse(&b, &info), SF_JPEG_OK);
    assert_int_equal(info.format, SF_IMAGE_WEBP);
    assert_int_equal(info.h, 24);
    assert_int_equal(info.w, 40);
    assert_int_equal(info.components, 4);
    assert_int_equal(info.data_len, (int64_t)whole);
    assert_int_equal(sf_jpeg_forms(&info), SF_JPEG_FORM_WEBP);

    b = (buf){{0}, 0};
    riff(&b, 18);
    vp8(&b, 40, 24);
    assert_int_equal(parse(&b, &info), SF_JPEG_OK);
    assert_int_equal(info.w, 40);
    assert_int_equal(info.components, 3);

    buf e = {{0}, 0};
    exif(&e, 1, 3, 8, 1);
    b = (buf){{0}, 0};
    riff(&b, 18 + 18 + 8 + e.len);
    vp8x(&b, 0x08, 40, 24);
    vp8(&b, 40, 24);
    put(&b, "EXIF", 4);
    le32(&b, (uint32_t)e.len);
    put(&b, e.d, e.len);
    assert_int_equal(parse(&b, &info), SF_JPEG_OK);
    assert_int_equal(info.orientation, 8);
    assert_int_equal(info.h, 24);
}

static void test_webp_refusals_have_their_codes(void **state)
{
    (void)state;
    sf_jpeg_info info;
    buf b = {{0}, 0};
    riff(&b, 14);
    vp8l(&b, 40, 24, 0);
    b.len -= 1;
    assert_int_equal(parse(&b, &info), SF_WEBP_E_TRUNCATED);

    b = (buf){{0}, 0};
    riff(&b, 18 + 18);
    vp8x(&b, 0x02, 40, 24); /* animated */
    vp8(&b, 40, 24);
    assert_int_equal(parse(&b, &info), SF_WEBP_E_UNSUPPORTED);

    b = (buf){{0}, 0};
    riff(&b, 18 + 18);
    vp8x(&b, 0, 41, 24); /* a canvas that is not the image's size */
    vp8(&b, 40, 24);
    assert_int_equal(parse(&b, &info), SF_WEBP_E_MALFORMED);

    b = (buf){{0}, 0};
    riff(&b, 18 + 18);
    vp8x(&b, 0, 9000, 24);
    vp8(&b, 9000, 24);
    assert_int_equal(parse(&b, &info), SF_JPEG_E_SIDE_TOO_LARGE);

    b = (buf){{0}, 0};
    riff(&b, 18);
    vp8(&b, 40, 24);
    b.d[12 + 8 + 3] = 0; /* no start code */
    assert_int_equal(parse(&b, &info), SF_WEBP_E_MALFORMED);

    b = (buf){{0}, 0};
    riff(&b, 18);
    put(&b, "ABCD", 4);
    le32(&b, 10);
    put(&b, "0123456789", 10);
    assert_int_equal(parse(&b, &info), SF_WEBP_E_MALFORMED);
}

static void test_a_file_of_no_known_format_is_jpeg_not_jpeg_and_formats_are_named(void **state)
{
    (void)state;
    sf_jpeg_info info;
    buf b = {{0}, 0};
    put(&b, "GIF89a\0\0\0\0\0\0", 12);
    assert_int_equal(parse(&b, &info), SF_JPEG_E_NOT_JPEG);
    assert_int_equal(sf_image_format_of(b.d, b.len), -1);
    assert_string_equal(sf_image_format_name(SF_IMAGE_JPEG), "jpeg");
    assert_string_equal(sf_image_format_name(SF_IMAGE_PNG), "png");
    assert_string_equal(sf_image_format_name(SF_IMAGE_WEBP), "webp");
    assert_null(sf_image_format_name(SF_IMAGE_FORMAT_COUNT));
    assert_string_equal(sf_jpeg_error_name(SF_PNG_E_TRUNCATED), "png_truncated");
    assert_string_equal(sf_jpeg_error_name(SF_WEBP_E_UNSUPPORTED), "webp_unsupported");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_png_of_every_colour_type_reads_its_size_and_ends_at_iend),
        cmocka_unit_test(test_every_cut_of_a_png_is_png_truncated),
        cmocka_unit_test(test_bad_ihdr_fields_and_chunk_order_are_png_malformed),
        cmocka_unit_test(test_an_unknown_critical_chunk_is_png_unsupported_and_an_ancillary_one_is_skipped),
        cmocka_unit_test(test_a_png_bomb_is_refused_by_side_then_by_pixels_before_its_data),
        cmocka_unit_test(test_the_exif_orientation_is_read_in_either_byte_order_and_a_damaged_block_reads_1),
        cmocka_unit_test(test_a_png_exif_chunk_gives_its_orientation),
        cmocka_unit_test(test_simple_and_extended_webp_files_read_their_size_and_end_at_their_container),
        cmocka_unit_test(test_webp_refusals_have_their_codes),
        cmocka_unit_test(test_a_file_of_no_known_format_is_jpeg_not_jpeg_and_formats_are_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
