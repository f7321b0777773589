/* tests/unit/test_ref_jpeg.c — the reference JPEG decode (gpu/ref/jpeg.c)
 * on files libjpeg-turbo's own encoder writes: sample by sample with the
 * refused ones marked, only the samples asked for, and its bounds: a file's
 * first warning ends its decode, and a batch's scans are bounded over its
 * pixels (SF_REF_JPEG_PASSES_PER_PIXEL). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "gpu/backend.h"
#include "gpu/ref/ref.h"

typedef struct file {
    unsigned char *d;
    unsigned long len;
} file;

/* A 64x64 colour image at quality 90: baseline, or progressive with one scan
 * per DC component and per AC coefficient of each component (3 + 3 x 63 =
 * 192 scans, a valid progression far above the ten an encoder writes). */
static file encode(int many_scans)
{
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    file f = {NULL, 0};
    jpeg_mem_dest(&c, &f.d, &f.len);
    c.image_width = c.image_height = 64;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 90, TRUE);
    static jpeg_scan_info scans[3 + 3 * 63];
    if (many_scans) {
        int k = 0;
        for (int comp = 0; comp < 3; comp++)
            scans[k++] = (jpeg_scan_info){1, {comp}, 0, 0, 0, 0};
        for (int comp = 0; comp < 3; comp++)
            for (int ss = 1; ss <= 63; ss++)
                scans[k++] = (jpeg_scan_info){1, {comp}, ss, ss, 0, 0};
        c.scan_info = scans;
        c.num_scans = k;
    }
    jpeg_start_compress(&c, TRUE);
    unsigned char row[64 * 3];
    while (c.next_scanline < 64) {
        for (int x = 0; x < 64; x++)
            for (int ch = 0; ch < 3; ch++)
                row[3 * x + ch] = (unsigned char)((x * 4 + (int)c.next_scanline * 2 + ch * 80) & 255);
        JSAMPROW r = row;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    return f;
}

/* A batch of the files, each decoded to 64x64x3 at its own place. */
typedef struct batch {
    unsigned char *bytes;
    int64_t off[17]; /* n + 1 offsets for up to 16 files */
    sf_aug_sample smp[16];
    sf_batch b;
} batch;

static void make(batch *bt, file *f, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += f[i].len;
    bt->bytes = malloc(total);
    assert_non_null(bt->bytes);
    bt->off[0] = 0;
    for (int i = 0; i < n; i++) {
        memcpy(bt->bytes + bt->off[i], f[i].d, f[i].len);
        bt->off[i + 1] = bt->off[i] + (int64_t)f[i].len;
        memset(&bt->smp[i], 0, sizeof bt->smp[i]);
        bt->smp[i].src_h = bt->smp[i].src_w = 64;
        bt->smp[i].src_off = (size_t)i * 64 * 64 * 3;
    }
    memset(&bt->b, 0, sizeof bt->b);
    bt->b.n = n;
    bt->b.c = 3;
    bt->b.nhwc = 1;
    bt->b.jpeg = bt->bytes;
    bt->b.jpeg_off = bt->off;
    bt->b.samples = bt->smp;
    bt->b.decoded_bytes = (size_t)n * 64 * 64 * 3;
}

static void test_a_refused_file_is_marked_and_the_others_decode_in_their_places(void **state)
{
    (void)state;
    file f[3] = {encode(0), encode(0), encode(0)};
    /* sample 1: more codes of length 1 than exist in its first Huffman table */
    for (unsigned long k = 2; k + 5 < f[1].len; k++)
        if (f[1].d[k] == 0xFF && f[1].d[k + 1] == 0xC4) {
            f[1].d[k + 5] = 0xFF;
            break;
        }
    batch bt;
    make(&bt, f, 3);
    uint8_t *px = malloc(bt.b.decoded_bytes), bad[3] = {0, 0, 0};
    char err[200];
    assert_int_equal(sf_ref_image_decode_some(&bt.b, NULL, px, bt.b.decoded_bytes, bad, err, sizeof err), 1);
    assert_int_equal(bad[0] + 2 * bad[1] + 4 * bad[2], 2);
    assert_non_null(strstr(err, "sample 1"));
    /* the others decode as they do alone */
    uint8_t *one = malloc(64 * 64 * 3);
    batch alone;
    make(&alone, &f[2], 1);
    assert_int_equal(sf_ref_image_decode(&alone.b, one, 64 * 64 * 3, err, sizeof err), 0);
    assert_memory_equal(px + 2 * 64 * 64 * 3, one, 64 * 64 * 3);
    /* without marks the first refusal refuses the batch */
    assert_int_equal(sf_ref_image_decode(&bt.b, px, bt.b.decoded_bytes, err, sizeof err), SF_BACKEND_BAD_INPUT);
    /* only the samples asked for are decoded */
    const uint8_t which[3] = {0, 0, 1};
    memset(px, 0xEE, bt.b.decoded_bytes);
    assert_int_equal(sf_ref_image_decode_some(&bt.b, which, px, bt.b.decoded_bytes, bad, err, sizeof err), 0);
    assert_int_equal(px[0], 0xEE);
    assert_memory_equal(px + 2 * 64 * 64 * 3, one, 64 * 64 * 3);
    free(one);
    free(px);
    free(alone.bytes);
    free(bt.bytes);
    for (int i = 0; i < 3; i++)
        free(f[i].d);
}

static void test_a_batch_spends_at_most_its_scan_budget_over_its_pixels(void **state)
{
    (void)state;
    /* 192 scans over 64x64 pixels alone: three times the budget. */
    file many = encode(1);
    batch bt;
    make(&bt, &many, 1);
    uint8_t *px = malloc(16 * 64 * 64 * 3), bad[16] = {0};
    char err[200];
    assert_int_equal(sf_ref_image_decode_some(&bt.b, NULL, px, 16 * 64 * 64 * 3, bad, err, sizeof err), 1);
    assert_non_null(strstr(err, "decode budget"));
    free(bt.bytes);
    /* The same file among fifteen baseline ones: the batch's budget is
     * 64 scans over sixteen images, and it decodes. */
    file f[16];
    f[0] = many;
    for (int i = 1; i < 16; i++)
        f[i] = encode(0);
    make(&bt, f, 16);
    memset(bad, 0, sizeof bad);
    if (sf_ref_image_decode_some(&bt.b, NULL, px, 16 * 64 * 64 * 3, bad, err, sizeof err) != 0)
        fail_msg("a batch within its budget refused a file: %s", err);
    free(bt.bytes);
    for (int i = 0; i < 16; i++)
        free(f[i].d);
    free(px);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_refused_file_is_marked_and_the_others_decode_in_their_places),
        cmocka_unit_test(test_a_batch_spends_at_most_its_scan_budget_over_its_pixels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
