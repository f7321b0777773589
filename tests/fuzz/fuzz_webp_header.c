/* tests/fuzz/fuzz_webp_header.c — libFuzzer target for the WebP header reader
 * (server/webp_header.h) and the safetensors parser's "files" form.
 *
 * The input is one file. Its read must be a known code, stable across a
 * second call, and on success within the limits, with 3 or 4 components and
 * a RIFF container inside the file that ends where its header says; then
 * the file, split in two samples of one body, goes through the body parser
 * (fuzz_image_header.h).
 *
 *   make build/fuzz_webp_header && build/fuzz_webp_header tests/fuzz/corpus_webp_header
 */
#include "tests/fuzz/fuzz_image_header.h"

#include "server/webp_header.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sf_jpeg_info a;
    if (check_reader(sf_webp_header_parse, SF_IMAGE_WEBP, data, size, &a) == SF_JPEG_OK) {
        CHECK(a.components == 3 || a.components == 4);
        CHECK(memcmp(data, "RIFF", 4) == 0 && memcmp(data + 8, "WEBP", 4) == 0);
        const uint32_t riff = data[4] | (uint32_t)data[5] << 8 | (uint32_t)data[6] << 16 | (uint32_t)data[7] << 24;
        CHECK(a.data_len == (int64_t)riff + 8);
    }
    check_body(data, size, "files");
    return 0;
}
