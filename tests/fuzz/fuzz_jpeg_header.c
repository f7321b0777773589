/* tests/fuzz/fuzz_jpeg_header.c — libFuzzer target for the JPEG header reader
 * and the safetensors parser's "jpeg" form.
 *
 * The input is one file. It is read by sf_jpeg_header_parse, whose result
 * must be a known code, stable across a second call, and, on success, sizes
 * within the limits and a subsampling that matches the component count. The
 * same file, split in two at a point derived from its hash, is then sent as a
 * two-sample "jpeg" body through the safetensors parser in two chunkings;
 * both runs must agree, and the parser's outcome must be the verdict of the
 * reader of each half's format (server/image_header.h) on the first of the
 * two files that fails (or success when both pass).
 *
 *   make build/fuzz_jpeg_header && build/fuzz_jpeg_header tests/fuzz/corpus_jpeg_header
 */
#include "tests/fuzz/fuzz_image_header.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sf_jpeg_info a, b;
    char msg[SF_JPEG_MSG_CAP];
    sf_jpeg_error ea = sf_jpeg_header_parse(data, size, &LIM, &a, msg, sizeof msg);
    CHECK(sf_jpeg_error_name(ea) != NULL);
    CHECK(memchr(msg, '\0', sizeof msg) != NULL);
    sf_jpeg_error eb = sf_jpeg_header_parse(data, size, &LIM, &b, NULL, 0);
    CHECK(ea == eb);
    if (ea == SF_JPEG_OK) {
        CHECK(memcmp(&a, &b, sizeof a) == 0);
        CHECK(a.h >= 1 && a.w >= 1 && a.h <= LIM.max_side && a.w <= LIM.max_side);
        CHECK((int64_t)a.h * a.w <= LIM.max_pixels);
        CHECK((a.components == 1) == (a.subsamp == SF_JPEG_GRAY));
        CHECK(a.components == 1 || a.components == 3 || a.components == 4);
        CHECK((a.sof >= 0 && a.sof <= 2) || a.sof == 9 || a.sof == 10);
        CHECK(a.progressive == (a.sof == 2 || a.sof == 10));
        /* the image ends inside the file, after its headers */
        CHECK(a.data_len >= 4 && (size_t)a.data_len <= size);
        CHECK(data[a.data_len - 2] == 0xFF && data[a.data_len - 1] == 0xD9);
    }
    if (size < 2 || size > 1 << 16)
        return 0;

    /* The file split in two samples of one body. */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++) h = (h ^ data[i]) * 1099511628211ull;
    size_t cut = 1 + (size_t)(h % (size - 1));
    sf_jpeg_error e0 = sf_image_header_parse(data, cut, &LIM, &a, NULL, 0);
    sf_jpeg_error e1 = sf_image_header_parse(data + cut, size - cut, &LIM, &b, NULL, 0);
    int64_t off[3] = {0, (int64_t)cut, (int64_t)size};
    sf_st_tensor_desc t[2] = {{"jpeg_offsets", SF_ST_I64, 1, {3}}, {"jpeg", SF_ST_U8, 1, {(int64_t)size}}};
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
        const sf_st_info *in = sf_st_info_of(&p1);
        CHECK(in->jpeg_pixels == (int64_t)a.h * a.w + (int64_t)b.h * b.w);
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
    return 0;
}
