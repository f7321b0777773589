/* tests/fuzz/fuzz_png_header.c — libFuzzer target for the PNG header reader
 * (server/png_header.h) and the safetensors parser's "files" form.
 *
 * The input is one file. Its read must be a known code, stable across a
 * second call, and on success within the limits, with a colour type's
 * component count and an image that ends with an IEND chunk inside the file;
 * then the file, split in two samples of one body, goes through the body
 * parser (fuzz_image_header.h).
 *
 *   make build/fuzz_png_header && build/fuzz_png_header tests/fuzz/corpus_png_header
 */
#include "tests/fuzz/fuzz_image_header.h"

#include "server/png_header.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sf_jpeg_info a;
    if (check_reader(sf_png_header_parse, SF_IMAGE_PNG, data, size, &a) == SF_JPEG_OK) {
        CHECK(a.components >= 1 && a.components <= 4);
        CHECK(memcmp(data, SF_PNG_SIGNATURE, 8) == 0);
        CHECK(memcmp(data + a.data_len - 8, "IEND", 4) == 0);
    }
    check_body(data, size, "files");
    return 0;
}
