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
    /* The file split in two samples of one body. */
    check_body(data, size, "jpeg");
    return 0;
}
