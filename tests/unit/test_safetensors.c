/* tests/unit/test_safetensors.c — the incremental safetensors parser and writer.
 *
 * Every body is fed in every chunking (whole, byte by byte, and many random
 * chunk sizes) through the same loop the HTTP layer uses, and the bytes copied
 * into dest are compared with the expected ones. Each error code has a crafted
 * body. Three reference files written by Python's safetensors.numpy.save are
 * embedded below to cross-check the parser and the writer against the format's
 * reference implementation. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/safetensors.h"

/* ---- reference files -------------------------------------------------------
 * Written by safetensors 0.8.0 (numpy 2.4) with:
 *
 *   from safetensors.numpy import save
 *   save({"images": np.arange(36, dtype=np.uint8).reshape(2,3,2,3),
 *         "labels": np.array([1,0], dtype=np.int64)})                      # ref_nhwc_i64
 *   save({"images": (np.arange(8, dtype=np.uint8)*7).reshape(2,1,2,2),
 *         "labels": np.array([[[0,1],[1,0]],[[1,1],[0,0]]], dtype=np.int32)},
 *        metadata={"layout": "NCHW"})                                      # ref_nchw_i32_seg
 *   save({"images": (np.arange(12, dtype=np.uint8)+200).reshape(3,2,2,1),
 *         "labels": np.array([2,0,1], dtype=np.uint8)})                   # ref_u8_images_first
 *
 * The reference writer orders the data section by dtype alignment, so I64 and
 * I32 labels come before the images; with U8 labels the images come first. */
static const unsigned char ref_nhwc_i64[188] = {
    0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7b, 0x22, 0x6c, 0x61, 0x62, 0x65, 0x6c, 0x73,
    0x22, 0x3a, 0x7b, 0x22, 0x64, 0x74, 0x79, 0x70, 0x65, 0x22, 0x3a, 0x22, 0x49, 0x36, 0x34, 0x22,
    0x2c, 0x22, 0x73, 0x68, 0x61, 0x70, 0x65, 0x22, 0x3a, 0x5b, 0x32, 0x5d, 0x2c, 0x22, 0x64, 0x61,
    0x74, 0x61, 0x5f, 0x6f, 0x66, 0x66, 0x73, 0x65, 0x74, 0x73, 0x22, 0x3a, 0x5b, 0x30, 0x2c, 0x31,
    0x36, 0x5d, 0x7d, 0x2c, 0x22, 0x69, 0x6d, 0x61, 0x67, 0x65, 0x73, 0x22, 0x3a, 0x7b, 0x22, 0x64,
    0x74, 0x79, 0x70, 0x65, 0x22, 0x3a, 0x22, 0x55, 0x38, 0x22, 0x2c, 0x22, 0x73, 0x68, 0x61, 0x70,
    0x65, 0x22, 0x3a, 0x5b, 0x32, 0x2c, 0x33, 0x2c, 0x32, 0x2c, 0x33, 0x5d, 0x2c, 0x22, 0x64, 0x61,
    0x74, 0x61, 0x5f, 0x6f, 0x66, 0x66, 0x73, 0x65, 0x74, 0x73, 0x22, 0x3a, 0x5b, 0x31, 0x36, 0x2c,
    0x35, 0x32, 0x5d, 0x7d, 0x7d, 0x20, 0x20, 0x20, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
    0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17,
    0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x21, 0x22, 0x23,
};
static const unsigned char ref_nchw_i32_seg[216] = {
    0xa8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7b, 0x22, 0x5f, 0x5f, 0x6d, 0x65, 0x74, 0x61,
    0x64, 0x61, 0x74, 0x61, 0x5f, 0x5f, 0x22, 0x3a, 0x7b, 0x22, 0x6c, 0x61, 0x79, 0x6f, 0x75, 0x74,
    0x22, 0x3a, 0x22, 0x4e, 0x43, 0x48, 0x57, 0x22, 0x7d, 0x2c, 0x22, 0x6c, 0x61, 0x62, 0x65, 0x6c,
    0x73, 0x22, 0x3a, 0x7b, 0x22, 0x64, 0x74, 0x79, 0x70, 0x65, 0x22, 0x3a, 0x22, 0x49, 0x33, 0x32,
    0x22, 0x2c, 0x22, 0x73, 0x68, 0x61, 0x70, 0x65, 0x22, 0x3a, 0x5b, 0x32, 0x2c, 0x32, 0x2c, 0x32,
    0x5d, 0x2c, 0x22, 0x64, 0x61, 0x74, 0x61, 0x5f, 0x6f, 0x66, 0x66, 0x73, 0x65, 0x74, 0x73, 0x22,
    0x3a, 0x5b, 0x30, 0x2c, 0x33, 0x32, 0x5d, 0x7d, 0x2c, 0x22, 0x69, 0x6d, 0x61, 0x67, 0x65, 0x73,
    0x22, 0x3a, 0x7b, 0x22, 0x64, 0x74, 0x79, 0x70, 0x65, 0x22, 0x3a, 0x22, 0x55, 0x38, 0x22, 0x2c,
    0x22, 0x73, 0x68, 0x61, 0x70, 0x65, 0x22, 0x3a, 0x5b, 0x32, 0x2c, 0x31, 0x2c, 0x32, 0x2c, 0x32,
    0x5d, 0x2c, 0x22, 0x64, 0x61, 0x74, 0x61, 0x5f, 0x6f, 0x66, 0x66, 0x73, 0x65, 0x74, 0x73, 0x22,
    0x3a, 0x5b, 0x33, 0x32, 0x2c, 0x34, 0x30, 0x5d, 0x7d, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x07, 0x0e, 0x15, 0x1c, 0x23, 0x2a, 0x31,
};
static const unsigned char ref_u8_images_first[151] = {
    0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7b, 0x22, 0x69, 0x6d, 0x61, 0x67, 0x65, 0x73,
    0x22, 0x3a, 0x7b, 0x22, 0x64, 0x74, 0x79, 0x70, 0x65, 0x22, 0x3a, 0x22, 0x55, 0x38, 0x22, 0x2c,
    0x22, 0x73, 0x68, 0x61, 0x70, 0x65, 0x22, 0x3a, 0x5b, 0x33, 0x2c, 0x32, 0x2c, 0x32, 0x2c, 0x31,
    0x5d, 0x2c, 0x22, 0x64, 0x61, 0x74, 0x61, 0x5f, 0x6f, 0x66, 0x66, 0x73, 0x65, 0x74, 0x73, 0x22,
    0x3a, 0x5b, 0x30, 0x2c, 0x31, 0x32, 0x5d, 0x7d, 0x2c, 0x22, 0x6c, 0x61, 0x62, 0x65, 0x6c, 0x73,
    0x22, 0x3a, 0x7b, 0x22, 0x64, 0x74, 0x79, 0x70, 0x65, 0x22, 0x3a, 0x22, 0x55, 0x38, 0x22, 0x2c,
    0x22, 0x73, 0x68, 0x61, 0x70, 0x65, 0x22, 0x3a, 0x5b, 0x33, 0x5d, 0x2c, 0x22, 0x64, 0x61, 0x74,
    0x61, 0x5f, 0x6f, 0x66, 0x66, 0x73, 0x65, 0x74, 0x73, 0x22, 0x3a, 0x5b, 0x31, 0x32, 0x2c, 0x31,
    0x35, 0x5d, 0x7d, 0x7d, 0x20, 0x20, 0x20, 0x20, 0xc8, 0xc9, 0xca, 0xcb, 0xcc, 0xcd, 0xce, 0xcf,
    0xd0, 0xd1, 0xd2, 0xd3, 0x02, 0x00, 0x01,
};

/* ---- helpers ---------------------------------------------------------------- */

#define POISON 0xEE

static sf_st_limits test_limits(void)
{
    sf_st_limits l;
    memset(&l, 0, sizeof l);
    l.max_header_bytes = 4096;
    l.max_body_bytes = 1 << 20;
    l.max_n = 64;
    l.max_h = 64;
    l.max_w = 64;
    l.classes = 0;
    l.labels_required = 1;
    return l;
}

enum chunking { WHOLE, BYTE_BY_BYTE, RANDOM };
#define RANDOM_SEEDS 25
#define CHUNKINGS (2 + RANDOM_SEEDS)

static uint32_t rng_next(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* Feeds body in the given chunking through the loop the HTTP layer uses. At
 * NEED_DEST it allocates a dest of exactly dest_bytes - shrink bytes (poisoned;
 * the caller frees *dest) and hands it over. Returns sf_st_finish(). */
static int feed_body(sf_st_parser *p, const uint8_t *body, size_t len, int chunking,
                     uint32_t seed, uint8_t **dest, size_t shrink)
{
    uint32_t rng = seed * 2654435761u + 1;
    size_t off = 0;
    *dest = NULL;
    while (off < len && sf_st_state_of(p) != SF_ST_FAILED) {
        size_t chunk = len - off;
        if (chunking == BYTE_BY_BYTE) {
            chunk = 1;
        } else if (chunking == RANDOM) {
            uint32_t r = rng_next(&rng);
            size_t bound = (r & 3) == 0 ? len : (r & 3) == 1 ? 64 : 7;
            chunk = 1 + (rng_next(&rng) % bound);
            if (chunk > len - off) chunk = len - off;
        }
        const uint8_t *d = body + off;
        size_t left = chunk;
        while (left > 0 && sf_st_state_of(p) != SF_ST_FAILED) {
            size_t used = sf_st_feed(p, d, left);
            assert_true(used <= left);
            d += used;
            left -= used;
            if (sf_st_state_of(p) == SF_ST_NEED_DEST) {
                const sf_st_info *in = sf_st_info_of(p);
                assert_non_null(in);
                size_t cap = (size_t)in->dest_bytes - shrink;
                *dest = malloc(cap ? cap : 1);
                assert_non_null(*dest);
                memset(*dest, POISON, cap);
                sf_st_set_dest(p, *dest, cap);
            } else if (used == 0) {
                assert_int_equal(sf_st_state_of(p), SF_ST_FAILED);
            }
        }
        off += chunk;
    }
    return sf_st_finish(p);
}

/* A crafted body: the 8-byte length, the JSON text as given, data_len data bytes
 * (the counting pattern i*7+1, or zeros). */
static uint8_t *craft(const char *json, size_t data_len, int zeros, size_t *out_len)
{
    size_t hl = strlen(json);
    size_t len = 8 + hl + data_len;
    uint8_t *b = malloc(len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = zeros ? 0 : (uint8_t)(i * 7 + 1);
    *out_len = len;
    return b;
}

/* Asserts that the body fails with code in every chunking; with header_only,
 * also that it fails when only the 8 + header bytes were fed (nothing of the
 * data section was needed to reject it). */
static void expect_error_lim(const sf_st_limits *lim, const uint8_t *body, size_t len,
                             const char *code, int header_only)
{
    for (int k = 0; k < CHUNKINGS; k++) {
        sf_st_parser p;
        uint8_t *dest = NULL;
        sf_st_init(&p, lim);
        int rc = feed_body(&p, body, len, k < 2 ? k : RANDOM, (uint32_t)k, &dest, 0);
        assert_int_equal(rc, -1);
        assert_int_equal(sf_st_state_of(&p), SF_ST_FAILED);
        if (strcmp(sf_st_error_code(&p), code) != 0)
            fail_msg("chunking %d: expected %s, got %s (%s)", k, code, sf_st_error_code(&p),
                     sf_st_error_message(&p));
        assert_true(strlen(sf_st_error_message(&p)) > 10);
        free(dest);
        sf_st_free(&p);
    }
    if (header_only && len >= 8) {
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = (hl << 8) | body[i];
        size_t cut = 8 + hl < len ? (size_t)(8 + hl) : len;
        sf_st_parser p;
        sf_st_init(&p, lim);
        sf_st_feed(&p, body, cut);
        assert_int_equal(sf_st_state_of(&p), SF_ST_FAILED);
        assert_string_equal(sf_st_error_code(&p), code);
        assert_null(sf_st_info_of(&p));
        sf_st_free(&p);
    }
}

/* Crafts a body from a header JSON and data length and expects a header error. */
static void expect_header_error(const sf_st_limits *lim, const char *json, size_t data_len, const char *code)
{
    size_t len;
    uint8_t *b = craft(json, data_len, 1, &len);
    expect_error_lim(lim, b, len, code, 1);
    free(b);
}

static void expect_header_error_default(const char *json, size_t data_len, const char *code)
{
    sf_st_limits l = test_limits();
    expect_header_error(&l, json, data_len, code);
}

/* A valid batch, built independently of the writer, with the expected dest. */
typedef struct batch_spec {
    int n, h, w, c, nhwc;
    const char *layout_meta; /* NULL: no __metadata__ */
    int has_labels;
    sf_st_dtype label_dtype;
    int label_ndim; /* 1 or 3 */
    int labels_first;
    int label_mod; /* label values are (i*7+3) % label_mod */
} batch_spec;

typedef struct batch {
    uint8_t *body;
    size_t body_len;
    uint8_t *expect; /* what dest must hold (POISON in the alignment gap) */
    size_t dest_bytes, images_bytes, labels_bytes, labels_off, label_count;
} batch;

static void put_le(uint8_t *p, uint64_t v, int size)
{
    for (int i = 0; i < size; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static batch make_batch(const batch_spec *s)
{
    batch b;
    memset(&b, 0, sizeof b);
    b.images_bytes = (size_t)s->n * s->h * s->w * s->c;
    int lsz = sf_st_dtype_size(s->label_dtype);
    b.label_count = s->has_labels ? (s->label_ndim == 1 ? (size_t)s->n : (size_t)s->n * s->h * s->w) : 0;
    b.labels_bytes = b.label_count * (size_t)lsz;
    b.labels_off = s->has_labels ? (b.images_bytes + 63) / 64 * 64 : 0;
    b.dest_bytes = s->has_labels ? b.labels_off + b.labels_bytes : b.images_bytes;

    size_t ib = s->has_labels && s->labels_first ? b.labels_bytes : 0;
    size_t lb = s->labels_first ? 0 : b.images_bytes;
    char json[1024], img[256], lab[256] = "", meta[128] = "";
    if (s->nhwc)
        snprintf(img, sizeof img, "\"images\":{\"dtype\":\"U8\",\"shape\":[%d,%d,%d,%d],\"data_offsets\":[%zu,%zu]}",
                 s->n, s->h, s->w, s->c, ib, ib + b.images_bytes);
    else
        snprintf(img, sizeof img, "\"images\":{\"dtype\":\"U8\",\"shape\":[%d,%d,%d,%d],\"data_offsets\":[%zu,%zu]}",
                 s->n, s->c, s->h, s->w, ib, ib + b.images_bytes);
    if (s->has_labels) {
        if (s->label_ndim == 1)
            snprintf(lab, sizeof lab, ",\"labels\":{\"shape\":[%d],\"dtype\":\"%s\",\"data_offsets\":[%zu,%zu]}",
                     s->n, sf_st_dtype_name(s->label_dtype), lb, lb + b.labels_bytes);
        else
            snprintf(lab, sizeof lab, ", \"labels\" : {\"data_offsets\":[%zu,%zu],\"dtype\":\"%s\",\"shape\":[%d,%d,%d]}",
                     lb, lb + b.labels_bytes, sf_st_dtype_name(s->label_dtype), s->n, s->h, s->w);
    }
    if (s->layout_meta) snprintf(meta, sizeof meta, "\"__metadata__\":{\"source\":\"unit\",\"layout\":\"%s\"},", s->layout_meta);
    snprintf(json, sizeof json, "{%s%s%s}  \n", meta, img, lab);

    size_t hl = strlen(json);
    b.body_len = 8 + hl + b.images_bytes + b.labels_bytes;
    b.body = malloc(b.body_len);
    b.expect = malloc(b.dest_bytes);
    assert_non_null(b.body);
    assert_non_null(b.expect);
    memset(b.expect, POISON, b.dest_bytes);
    put_le(b.body, hl, 8);
    memcpy(b.body + 8, json, hl);
    uint8_t *data = b.body + 8 + hl;
    for (size_t i = 0; i < b.images_bytes; i++) {
        uint8_t v = (uint8_t)(i * 31 + 7);
        data[ib + i] = v;
        b.expect[i] = v;
    }
    for (size_t i = 0; i < b.label_count; i++) {
        uint64_t v = (uint64_t)((i * 7 + 3) % (size_t)s->label_mod);
        put_le(data + lb + i * (size_t)lsz, v, lsz);
        put_le(b.expect + b.labels_off + i * (size_t)lsz, v, lsz);
    }
    return b;
}

static void free_batch(batch *b)
{
    free(b->body);
    free(b->expect);
}

/* Parses the batch in every chunking and checks info and dest. */
static void expect_batch_parses(const batch_spec *s, const sf_st_limits *lim)
{
    batch b = make_batch(s);
    for (int k = 0; k < CHUNKINGS; k++) {
        sf_st_parser p;
        uint8_t *dest = NULL;
        sf_st_init(&p, lim);
        int rc = feed_body(&p, b.body, b.body_len, k < 2 ? k : RANDOM, (uint32_t)k, &dest, 0);
        if (rc != 0) fail_msg("chunking %d: %s: %s", k, sf_st_error_code(&p), sf_st_error_message(&p));
        assert_int_equal(sf_st_state_of(&p), SF_ST_COMPLETE);
        assert_string_equal(sf_st_error_code(&p), "ok");
        const sf_st_info *in = sf_st_info_of(&p);
        assert_non_null(in);
        assert_int_equal(in->n, s->n);
        assert_int_equal(in->h, s->h);
        assert_int_equal(in->w, s->w);
        assert_int_equal(in->c, s->c);
        assert_int_equal(in->nhwc, s->nhwc);
        assert_int_equal(in->has_labels, s->has_labels);
        assert_int_equal(in->images_bytes, b.images_bytes);
        assert_int_equal(in->labels_bytes, b.labels_bytes);
        assert_int_equal(in->labels_dest_off, b.labels_off);
        assert_int_equal(in->dest_bytes, b.dest_bytes);
        assert_int_equal(in->body_len, b.body_len);
        assert_int_equal(in->data_len, b.images_bytes + b.labels_bytes);
        assert_int_equal(8 + in->header_len + in->data_len, b.body_len);
        if (s->has_labels) {
            assert_int_equal(in->label_dtype, s->label_dtype);
            assert_int_equal(in->label_ndim, s->label_ndim);
            assert_int_equal(in->label_shape[0], s->n);
            if (s->label_ndim == 3) {
                assert_int_equal(in->label_shape[1], s->h);
                assert_int_equal(in->label_shape[2], s->w);
            }
        } else {
            assert_int_equal(in->label_ndim, 0);
        }
        assert_non_null(dest);
        assert_memory_equal(dest, b.expect, b.dest_bytes);
        free(dest);
        sf_st_free(&p);
    }
    free_batch(&b);
}

static batch_spec spec_nhwc_i64(void)
{
    batch_spec s = {.n = 4, .h = 5, .w = 3, .c = 3, .nhwc = 1, .has_labels = 1,
                    .label_dtype = SF_ST_I64, .label_ndim = 1, .label_mod = 10};
    return s;
}

/* ---- happy paths ------------------------------------------------------------ */

static void test_an_nhwc_batch_with_i64_labels_lands_in_dest_in_every_chunking(void **st)
{
    sf_st_limits l = test_limits();
    batch_spec s = spec_nhwc_i64();
    expect_batch_parses(&s, &l);
}

static void test_an_nchw_batch_is_recognised_by_its_shape_without_metadata(void **st)
{
    sf_st_limits l = test_limits();
    batch_spec s = {.n = 3, .h = 6, .w = 5, .c = 1, .nhwc = 0, .has_labels = 1,
                    .label_dtype = SF_ST_I32, .label_ndim = 1, .label_mod = 10};
    expect_batch_parses(&s, &l);
}

static void test_the_metadata_layout_decides_between_nhwc_and_nchw(void **st)
{
    sf_st_limits l = test_limits();
    /* [2,3,4,3]: by shape it would be NHWC; the metadata says NCHW (C=3, H=4, W=3). */
    batch_spec s = {.n = 2, .h = 4, .w = 3, .c = 3, .nhwc = 0, .layout_meta = "NCHW", .has_labels = 1,
                    .label_dtype = SF_ST_U8, .label_ndim = 1, .label_mod = 10};
    expect_batch_parses(&s, &l);
    batch_spec t = {.n = 2, .h = 3, .w = 4, .c = 4, .nhwc = 1, .layout_meta = "NHWC", .has_labels = 1,
                    .label_dtype = SF_ST_I64, .label_ndim = 3, .label_mod = 5};
    expect_batch_parses(&t, &l);
}

static void test_i32_and_u8_labels_are_accepted(void **st)
{
    sf_st_limits l = test_limits();
    batch_spec s = spec_nhwc_i64();
    s.label_dtype = SF_ST_I32;
    expect_batch_parses(&s, &l);
    s.label_dtype = SF_ST_U8;
    expect_batch_parses(&s, &l);
}

static void test_segmentation_labels_of_shape_n_h_w_are_accepted(void **st)
{
    sf_st_limits l = test_limits();
    l.classes = 21;
    batch_spec s = {.n = 2, .h = 7, .w = 9, .c = 3, .nhwc = 1, .has_labels = 1,
                    .label_dtype = SF_ST_I64, .label_ndim = 3, .label_mod = 21};
    expect_batch_parses(&s, &l);
    s.label_dtype = SF_ST_U8;
    s.nhwc = 0;
    expect_batch_parses(&s, &l);
}

static void test_labels_stored_before_images_still_land_after_the_images_in_dest(void **st)
{
    sf_st_limits l = test_limits();
    batch_spec s = spec_nhwc_i64();
    s.labels_first = 1;
    expect_batch_parses(&s, &l);
    s.label_ndim = 3;
    s.label_dtype = SF_ST_I32;
    expect_batch_parses(&s, &l);
}

static void test_images_without_labels_parse_in_labels_optional_mode(void **st)
{
    sf_st_limits l = test_limits();
    l.labels_required = 0;
    batch_spec s = spec_nhwc_i64();
    s.has_labels = 0;
    expect_batch_parses(&s, &l);
    /* labels are still accepted, and checked, when present */
    s.has_labels = 1;
    expect_batch_parses(&s, &l);
}

static void test_label_values_below_the_class_count_pass_the_check(void **st)
{
    sf_st_limits l = test_limits();
    l.classes = 10;
    batch_spec s = spec_nhwc_i64();
    expect_batch_parses(&s, &l);
    s.label_dtype = SF_ST_I32;
    s.labels_first = 1;
    expect_batch_parses(&s, &l);
}

static void test_a_header_padded_with_spaces_and_limits_of_zero_use_defaults(void **st)
{
    /* NULL limits: defaults; labels not required */
    batch_spec s = spec_nhwc_i64();
    s.has_labels = 0;
    expect_batch_parses(&s, NULL);
}

static void test_feed_stops_at_the_end_of_the_header_and_waits_for_a_dest(void **st)
{
    sf_st_limits l = test_limits();
    batch_spec s = spec_nhwc_i64();
    batch b = make_batch(&s);
    sf_st_parser p;
    sf_st_init(&p, &l);
    assert_int_equal(sf_st_state_of(&p), SF_ST_HEADER);
    assert_null(sf_st_info_of(&p));
    size_t used = sf_st_feed(&p, b.body, b.body_len);
    const sf_st_info *in = sf_st_info_of(&p);
    assert_non_null(in);
    assert_int_equal(used, 8 + in->header_len);
    assert_int_equal(sf_st_state_of(&p), SF_ST_NEED_DEST);
    /* in NEED_DEST nothing is consumed */
    assert_int_equal(sf_st_feed(&p, b.body + used, b.body_len - used), 0);
    assert_int_equal(sf_st_state_of(&p), SF_ST_NEED_DEST);
    uint8_t *dest = malloc(b.dest_bytes);
    memset(dest, POISON, b.dest_bytes);
    sf_st_set_dest(&p, dest, b.dest_bytes);
    assert_int_equal(sf_st_state_of(&p), SF_ST_DATA);
    assert_int_equal(sf_st_feed(&p, b.body + used, b.body_len - used), b.body_len - used);
    assert_int_equal(sf_st_state_of(&p), SF_ST_COMPLETE);
    assert_int_equal(sf_st_finish(&p), 0);
    assert_int_equal(sf_st_finish(&p), 0);
    assert_memory_equal(dest, b.expect, b.dest_bytes);
    /* reset: the same parser takes the next body */
    sf_st_reset(&p);
    assert_int_equal(sf_st_state_of(&p), SF_ST_HEADER);
    memset(dest, POISON, b.dest_bytes);
    used = sf_st_feed(&p, b.body, b.body_len);
    sf_st_set_dest(&p, dest, b.dest_bytes);
    sf_st_feed(&p, b.body + used, b.body_len - used);
    assert_int_equal(sf_st_finish(&p), 0);
    assert_memory_equal(dest, b.expect, b.dest_bytes);
    sf_st_free(&p);
    sf_st_free(&p); /* idempotent */
    free(dest);
    free_batch(&b);
}

/* ---- reference files ---------------------------------------------------------- */

static void check_reference(const unsigned char *body, size_t len, const sf_st_limits *lim,
                            int n, int h, int w, int c, int nhwc, sf_st_dtype ldt, int lndim,
                            const uint8_t *images, size_t images_bytes, const int64_t *labels, size_t nlabels)
{
    for (int k = 0; k < CHUNKINGS; k++) {
        sf_st_parser p;
        uint8_t *dest = NULL;
        sf_st_init(&p, lim);
        int rc = feed_body(&p, body, len, k < 2 ? k : RANDOM, (uint32_t)k, &dest, 0);
        if (rc != 0) fail_msg("%s: %s", sf_st_error_code(&p), sf_st_error_message(&p));
        const sf_st_info *in = sf_st_info_of(&p);
        assert_int_equal(in->n, n);
        assert_int_equal(in->h, h);
        assert_int_equal(in->w, w);
        assert_int_equal(in->c, c);
        assert_int_equal(in->nhwc, nhwc);
        assert_int_equal(in->label_dtype, ldt);
        assert_int_equal(in->label_ndim, lndim);
        assert_int_equal(in->body_len, len);
        assert_int_equal(in->header_len % 8, 0);
        assert_memory_equal(dest, images, images_bytes);
        int sz = sf_st_dtype_size(ldt);
        for (size_t i = 0; i < nlabels; i++) {
            int64_t v = 0;
            memcpy(&v, dest + in->labels_dest_off + i * (size_t)sz, (size_t)sz); /* little-endian host */
            assert_int_equal(v, labels[i]);
        }
        free(dest);
        sf_st_free(&p);
    }
}

static void test_files_written_by_python_safetensors_parse(void **st)
{
    sf_st_limits l = test_limits();
    l.classes = 3;
    uint8_t img[36];
    for (int i = 0; i < 36; i++) img[i] = (uint8_t)i;
    const int64_t lab1[2] = {1, 0};
    check_reference(ref_nhwc_i64, sizeof ref_nhwc_i64, &l, 2, 3, 2, 3, 1, SF_ST_I64, 1, img, 36, lab1, 2);

    for (int i = 0; i < 8; i++) img[i] = (uint8_t)(i * 7);
    const int64_t lab2[8] = {0, 1, 1, 0, 1, 1, 0, 0};
    check_reference(ref_nchw_i32_seg, sizeof ref_nchw_i32_seg, &l, 2, 2, 2, 1, 0, SF_ST_I32, 3, img, 8, lab2, 8);

    for (int i = 0; i < 12; i++) img[i] = (uint8_t)(i + 200);
    const int64_t lab3[3] = {2, 0, 1};
    check_reference(ref_u8_images_first, sizeof ref_u8_images_first, &l, 3, 2, 2, 1, 1, SF_ST_U8, 1, img, 12, lab3, 3);
}

static void test_the_writer_reproduces_the_python_reference_headers_byte_for_byte(void **st)
{
    char buf[512];
    sf_st_tensor_desc t1[2] = {
        {.name = "labels", .dtype = SF_ST_I64, .ndim = 1, .shape = {2}},
        {.name = "images", .dtype = SF_ST_U8, .ndim = 4, .shape = {2, 3, 2, 3}},
    };
    size_t n = sf_st_header_build(buf, sizeof buf, t1, 2, NULL);
    assert_int_equal(n, 8 + 128);
    assert_memory_equal(buf, ref_nhwc_i64, n);

    sf_st_tensor_desc t2[2] = {
        {.name = "labels", .dtype = SF_ST_I32, .ndim = 3, .shape = {2, 2, 2}},
        {.name = "images", .dtype = SF_ST_U8, .ndim = 4, .shape = {2, 1, 2, 2}},
    };
    n = sf_st_header_build(buf, sizeof buf, t2, 2, "{\"layout\":\"NCHW\"}");
    assert_int_equal(n, 8 + 168);
    assert_memory_equal(buf, ref_nchw_i32_seg, n);

    sf_st_tensor_desc t3[2] = {
        {.name = "images", .dtype = SF_ST_U8, .ndim = 4, .shape = {3, 2, 2, 1}},
        {.name = "labels", .dtype = SF_ST_U8, .ndim = 1, .shape = {3}},
    };
    n = sf_st_header_build(buf, sizeof buf, t3, 2, NULL);
    assert_int_equal(n, 8 + 128);
    assert_memory_equal(buf, ref_u8_images_first, n);
}

static void test_a_built_header_round_trips_through_the_parser(void **st)
{
    sf_st_limits l = test_limits();
    l.classes = 7;
    sf_st_tensor_desc t[2] = {
        {.name = "images", .dtype = SF_ST_U8, .ndim = 4, .shape = {5, 3, 8, 6}},
        {.name = "labels", .dtype = SF_ST_I64, .ndim = 3, .shape = {5, 8, 6}},
    };
    size_t need = sf_st_header_build(NULL, 0, t, 2, "{\"layout\":\"NCHW\",\"note\":\"a \\\"quoted\\\" \\\\ value\"}");
    assert_true(need > 8);
    assert_int_equal(need % 8, 0);
    char small[16];
    assert_int_equal(sf_st_header_build(small, sizeof small, t, 2,
                                        "{\"layout\":\"NCHW\",\"note\":\"a \\\"quoted\\\" \\\\ value\"}"),
                     need);
    size_t images = 5 * 3 * 8 * 6, labels = 5 * 8 * 6 * 8;
    size_t len = need + images + labels;
    uint8_t *body = malloc(len);
    assert_int_equal(sf_st_header_build((char *)body, need, t, 2,
                                        "{\"layout\":\"NCHW\",\"note\":\"a \\\"quoted\\\" \\\\ value\"}"),
                     need);
    size_t loff = 768; /* align_up(720, 64) */
    uint8_t *expect = malloc(loff + labels);
    memset(expect, POISON, loff + labels);
    for (size_t i = 0; i < images; i++) body[need + i] = expect[i] = (uint8_t)(i ^ 0x5a);
    for (size_t i = 0; i < labels / 8; i++) {
        put_le(body + need + images + i * 8, i % 7, 8);
        put_le(expect + loff + i * 8, i % 7, 8);
    }
    for (int k = 0; k < CHUNKINGS; k++) {
        sf_st_parser p;
        uint8_t *dest = NULL;
        sf_st_init(&p, &l);
        int rc = feed_body(&p, body, len, k < 2 ? k : RANDOM, (uint32_t)k, &dest, 0);
        if (rc != 0) fail_msg("%s: %s", sf_st_error_code(&p), sf_st_error_message(&p));
        const sf_st_info *in = sf_st_info_of(&p);
        assert_int_equal(in->nhwc, 0);
        assert_int_equal(in->c, 3);
        assert_int_equal(in->h, 8);
        assert_int_equal(in->w, 6);
        assert_int_equal(in->labels_dest_off, loff);
        assert_int_equal(in->dest_bytes, loff + labels);
        assert_memory_equal(dest, expect, loff + labels);
        free(dest);
        sf_st_free(&p);
    }
    free(body);
    free(expect);
}

static void test_the_writer_rejects_invalid_descriptions(void **st)
{
    char buf[256];
    sf_st_tensor_desc ok = {.name = "x", .dtype = SF_ST_F32, .ndim = 2, .shape = {2, 3}};
    assert_true(sf_st_header_build(buf, sizeof buf, &ok, 1, NULL) > 0);
    sf_st_tensor_desc t = ok;
    t.name = NULL;
    assert_int_equal(sf_st_header_build(buf, sizeof buf, &t, 1, NULL), 0);
    t = ok;
    t.name = "__metadata__";
    assert_int_equal(sf_st_header_build(buf, sizeof buf, &t, 1, NULL), 0);
    t = ok;
    t.dtype = SF_ST_DTYPE_COUNT;
    assert_int_equal(sf_st_header_build(buf, sizeof buf, &t, 1, NULL), 0);
    t = ok;
    t.ndim = 9;
    assert_int_equal(sf_st_header_build(buf, sizeof buf, &t, 1, NULL), 0);
    t = ok;
    t.shape[1] = -1;
    assert_int_equal(sf_st_header_build(buf, sizeof buf, &t, 1, NULL), 0);
    t = ok;
    t.shape[0] = INT64_MAX;
    assert_int_equal(sf_st_header_build(buf, sizeof buf, &t, 1, NULL), 0);
    sf_st_tensor_desc two[2] = {ok, ok};
    assert_int_equal(sf_st_header_build(buf, sizeof buf, two, 2, NULL), 0);
    assert_int_equal(sf_st_header_build(buf, sizeof buf, &ok, 1, "[1]"), 0);
    assert_int_equal(sf_st_header_build(buf, sizeof buf, &ok, 1, "{\"a\":1}"), 0);
    assert_int_equal(sf_st_header_build(buf, sizeof buf, &ok, 1, "not json"), 0);
    /* zero tensors: a valid, empty header */
    assert_int_equal(sf_st_header_build(buf, sizeof buf, NULL, 0, NULL), 16);
    assert_memory_equal(buf + 8, "{}      ", 8);
}

static void test_dtype_names_sizes_and_parsing_agree(void **st)
{
    for (int d = 0; d < SF_ST_DTYPE_COUNT; d++) {
        sf_st_dtype out;
        const char *name = sf_st_dtype_name((sf_st_dtype)d);
        assert_non_null(name);
        assert_true(sf_st_dtype_size((sf_st_dtype)d) > 0);
        assert_int_equal(sf_st_dtype_parse(name, &out), 0);
        assert_int_equal(out, d);
    }
    sf_st_dtype out;
    assert_int_equal(sf_st_dtype_parse("u8", &out), -1);
    assert_int_equal(sf_st_dtype_parse("F4", &out), -1);
    assert_int_equal(sf_st_dtype_parse(NULL, &out), -1);
    assert_null(sf_st_dtype_name(SF_ST_DTYPE_COUNT));
    assert_int_equal(sf_st_dtype_size(SF_ST_DTYPE_COUNT), 0);
    assert_int_equal(sf_st_dtype_size(SF_ST_I64), 8);
    assert_int_equal(sf_st_dtype_size(SF_ST_BF16), 2);
    for (int e = 0; e < SF_ST_ERROR_COUNT; e++) assert_non_null(sf_st_error_name((sf_st_error)e));
    assert_null(sf_st_error_name(SF_ST_ERROR_COUNT));
}

/* ---- errors --------------------------------------------------------------- */

/* images [2,3,2,3] U8 = 36 bytes, labels [2] I64 = 16 bytes */
#define IMG_OK "\"images\":{\"dtype\":\"U8\",\"shape\":[2,3,2,3],\"data_offsets\":[0,36]}"
#define LAB_OK "\"labels\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[36,52]}"
#define LAB(dtype, shape, b, e) "\"labels\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"
#define IMG(dtype, shape, b, e) "\"images\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void test_a_header_length_below_two_is_header_length_invalid(void **st)
{
    sf_st_limits l = test_limits();
    uint8_t zero[16] = {0};
    expect_error_lim(&l, zero, sizeof zero, "header_length_invalid", 0);
    uint8_t one[16] = {1, 0, 0, 0, 0, 0, 0, 0, '{'};
    expect_error_lim(&l, one, sizeof one, "header_length_invalid", 0);
}

static void test_a_header_longer_than_the_limit_is_header_too_large(void **st)
{
    sf_st_limits l = test_limits();
    uint8_t b[16] = {0x01, 0x10, 0, 0, 0, 0, 0, 0, '{'}; /* 4097 > 4096 */
    expect_error_lim(&l, b, sizeof b, "header_too_large", 0);
    uint8_t huge[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    expect_error_lim(&l, huge, sizeof huge, "header_too_large", 0);
}

static void test_a_header_that_is_not_json_is_header_not_json(void **st)
{
    expect_header_error_default("{\"images\":", 0, "header_not_json");
    expect_header_error_default("{\"images\":{}} x", 0, "header_not_json");
    expect_header_error_default("{\"images\" 1}", 0, "header_not_json");
    expect_header_error_default("{\"ima\nges\":1}", 0, "header_not_json");
    expect_header_error_default("{\"images\":{\"dtype\":\"U8\"}}\x01", 0, "header_not_json");
    expect_header_error_default("{\"\xff\xfe\":1}", 0, "header_not_json");
    /* an escaped NUL would truncate the name to "images" */
    expect_header_error_default("{\"images\\u0000x\":{}, " IMG_OK "}", 36, "header_not_json");
    /* a raw NUL before the padding */
    static const uint8_t nul[12] = {4, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, ' '};
    sf_st_limits l = test_limits();
    expect_error_lim(&l, nul, sizeof nul, "header_not_json", 1);
}

static void test_a_header_that_is_not_an_object_is_header_not_object(void **st)
{
    expect_header_error_default("[1,2,3]", 0, "header_not_object");
    expect_header_error_default("\"images\"", 0, "header_not_object");
    expect_header_error_default("42      ", 0, "header_not_object");
}

static void test_a_header_nested_deeper_than_four_is_header_too_deep(void **st)
{
    expect_header_error_default("{\"images\":{\"dtype\":\"U8\",\"shape\":[[[[2]]],3,2,3],\"data_offsets\":[0,36]}}", 36,
                                "header_too_deep");
    /* rejected while the header is still arriving, long before its end */
    sf_st_limits l = test_limits();
    char json[2000];
    memset(json, ' ', sizeof json);
    memcpy(json, "{\"a\":[[[[[[[[", 13);
    json[sizeof json - 1] = '\0';
    size_t len;
    uint8_t *b = craft(json, 0, 1, &len);
    sf_st_parser p;
    sf_st_init(&p, &l);
    sf_st_feed(&p, b, 8 + 13);
    assert_int_equal(sf_st_state_of(&p), SF_ST_FAILED);
    assert_string_equal(sf_st_error_code(&p), "header_too_deep");
    sf_st_free(&p);
    free(b);
    /* brackets inside strings do not count */
    expect_header_error_default("{\"__metadata__\":{\"x\":\"[[[[[[{{{{\"}," IMG_OK "}", 36, "missing_labels");
}

static void test_a_name_given_twice_is_duplicate_key(void **st)
{
    expect_header_error_default("{" IMG_OK "," LAB_OK "," IMG_OK "}", 52, "duplicate_key");
    expect_header_error_default("{\"images\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[2,3,2,3],\"data_offsets\":[0,36]}," LAB_OK "}",
                                52, "duplicate_key");
    expect_header_error_default("{\"__metadata__\":{\"layout\":\"NHWC\",\"layout\":\"NCHW\"}," IMG_OK "," LAB_OK "}",
                                52, "duplicate_key");
}

static void test_metadata_that_is_not_an_object_of_strings_is_bad_metadata(void **st)
{
    expect_header_error_default("{\"__metadata__\":[]," IMG_OK "," LAB_OK "}", 52, "bad_metadata");
    expect_header_error_default("{\"__metadata__\":{\"epoch\":3}," IMG_OK "," LAB_OK "}", 52, "bad_metadata");
}

static void test_a_tensor_other_than_images_and_labels_is_unknown_tensor(void **st)
{
    expect_header_error_default("{" IMG_OK "," LAB_OK ",\"weights\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[52,56]}}",
                                56, "unknown_tensor");
    expect_header_error_default("{\"Images\":{}}", 0, "unknown_tensor");
}

static void test_a_malformed_tensor_entry_is_bad_tensor(void **st)
{
    expect_header_error_default("{\"images\":[1]," LAB_OK "}", 52, "bad_tensor");
    expect_header_error_default("{\"images\":{\"dtype\":\"U8\",\"shape\":[2,3,2,3]}," LAB_OK "}", 52, "bad_tensor");
    expect_header_error_default("{\"images\":{\"dtype\":8,\"shape\":[2,3,2,3],\"data_offsets\":[0,36]}," LAB_OK "}", 52,
                                "bad_tensor");
    expect_header_error_default("{\"images\":{\"dtype\":\"U8\",\"shape\":[2,3,2,3],\"data_offsets\":[0,36],\"x\":1}," LAB_OK "}",
                                52, "bad_tensor");
}

static void test_a_body_without_images_is_missing_images(void **st)
{
    expect_header_error_default("{" LAB_OK "}", 16, "missing_images");
    expect_header_error_default("{}", 0, "missing_images");
    expect_header_error_default("{\"__metadata__\":{}}", 0, "missing_images");
}

static void test_a_body_without_labels_is_missing_labels_when_labels_are_required(void **st)
{
    expect_header_error_default("{" IMG_OK "}", 36, "missing_labels");
}

static void test_a_dtype_name_the_format_does_not_know_is_unknown_dtype(void **st)
{
    expect_header_error_default("{" IMG("X9", "[2,3,2,3]", 0, 36) "," LAB_OK "}", 52, "unknown_dtype");
    expect_header_error_default("{" IMG_OK "," LAB("i64", "[2]", 36, 52) "}", 52, "unknown_dtype");
}

static void test_a_known_dtype_the_service_cannot_use_is_unsupported_dtype(void **st)
{
    expect_header_error_default("{" IMG("F32", "[2,3,2,3]", 0, 144) "," LAB("I64", "[2]", 144, 160) "}", 160,
                                "unsupported_dtype");
    expect_header_error_default("{" IMG_OK "," LAB("I16", "[2]", 36, 40) "}", 40, "unsupported_dtype");
    expect_header_error_default("{" IMG_OK "," LAB("I8", "[2]", 36, 38) "}", 38, "unsupported_dtype");
    expect_header_error_default("{" IMG_OK "," LAB("U16", "[2]", 36, 40) "}", 40, "unsupported_dtype");
    expect_header_error_default("{" IMG_OK "," LAB("F4", "[2]", 36, 37) "}", 37, "unsupported_dtype");
    expect_header_error_default("{" IMG_OK "," LAB("F8_E4M3FNUZ", "[2]", 36, 38) "}", 38, "unsupported_dtype");
}

static void test_a_shape_of_the_wrong_rank_or_size_is_bad_shape(void **st)
{
    expect_header_error_default("{" IMG("U8", "[2,3,6]", 0, 36) "," LAB_OK "}", 52, "bad_shape");
    expect_header_error_default("{" IMG("U8", "[2,3,2,3,1]", 0, 36) "," LAB_OK "}", 52, "bad_shape");
    expect_header_error_default("{" IMG("U8", "[2,0,2,3]", 0, 0) "," LAB("I64", "[2]", 0, 16) "}", 16, "bad_shape");
    expect_header_error_default("{" IMG("U8", "[2,-3,2,3]", 0, 36) "," LAB_OK "}", 52, "bad_shape");
    expect_header_error_default("{" IMG("U8", "[2,3.5,2,3]", 0, 36) "," LAB_OK "}", 52, "bad_shape");
    expect_header_error_default("{" IMG("U8", "2", 0, 36) "," LAB_OK "}", 52, "bad_shape");
    /* 2 channels with an explicit layout */
    expect_header_error_default("{\"__metadata__\":{\"layout\":\"NHWC\"}," IMG("U8", "[2,3,3,2]", 0, 36) "," LAB_OK "}",
                                52, "bad_shape");
    /* labels of rank 2, and masks of the wrong size */
    expect_header_error_default("{" IMG_OK "," LAB("I64", "[2,1]", 36, 52) "}", 52, "bad_shape");
    expect_header_error_default("{" IMG_OK "," LAB("U8", "[2,3,3]", 36, 54) "}", 54, "bad_shape");
}

static void test_a_layout_that_cannot_be_decided_is_bad_layout(void **st)
{
    expect_header_error_default("{\"__metadata__\":{\"layout\":\"CHWN\"}," IMG_OK "," LAB_OK "}", 52, "bad_layout");
    expect_header_error_default("{" IMG("U8", "[2,5,5,5]", 0, 250) "," LAB("I64", "[2]", 250, 266) "}", 266,
                                "bad_layout");
}

static void test_offsets_that_disagree_with_shape_and_dtype_are_shape_size_mismatch(void **st)
{
    expect_header_error_default("{" IMG("U8", "[2,3,2,3]", 0, 35) "," LAB("I64", "[2]", 35, 51) "}", 51,
                                "shape_size_mismatch");
    expect_header_error_default("{" IMG_OK "," LAB("I32", "[2]", 36, 52) "}", 52, "shape_size_mismatch");
}

static void test_malformed_data_offsets_are_bad_offsets(void **st)
{
    expect_header_error_default("{" IMG("U8", "[2,3,2,3]", 36, 0) "," LAB_OK "}", 52, "bad_offsets");
    expect_header_error_default("{\"images\":{\"dtype\":\"U8\",\"shape\":[2,3,2,3],\"data_offsets\":[0]}," LAB_OK "}", 52,
                                "bad_offsets");
    expect_header_error_default("{\"images\":{\"dtype\":\"U8\",\"shape\":[2,3,2,3],\"data_offsets\":[0,36,52]}," LAB_OK "}",
                                52, "bad_offsets");
    expect_header_error_default("{\"images\":{\"dtype\":\"U8\",\"shape\":[2,3,2,3],\"data_offsets\":[-1,35]}," LAB_OK "}",
                                52, "bad_offsets");
    expect_header_error_default(
        "{\"images\":{\"dtype\":\"U8\",\"shape\":[2,3,2,3],\"data_offsets\":[1e300,1e300]}," LAB_OK "}", 52,
        "bad_offsets");
    expect_header_error_default("{\"images\":{\"dtype\":\"U8\",\"shape\":[2,3,2,3],\"data_offsets\":\"0,36\"}," LAB_OK "}",
                                52, "bad_offsets");
}

static void test_overlapping_tensors_are_offsets_overlap(void **st)
{
    expect_header_error_default("{" IMG_OK "," LAB("I64", "[2]", 30, 46) "}", 46, "offsets_overlap");
    expect_header_error_default("{" IMG_OK "," LAB("I64", "[2]", 10, 26) "}", 36, "offsets_overlap");
}

static void test_a_hole_in_the_data_section_is_data_not_contiguous(void **st)
{
    expect_header_error_default("{" IMG_OK "," LAB("I64", "[2]", 40, 56) "}", 56, "data_not_contiguous");
    expect_header_error_default("{" IMG("U8", "[2,3,2,3]", 20, 56) "," LAB("I64", "[2]", 0, 16) "}", 56,
                                "data_not_contiguous");
    expect_header_error_default("{" IMG("U8", "[2,3,2,3]", 4, 40) "," LAB("I64", "[2]", 40, 56) "}", 56,
                                "data_not_contiguous");
    sf_st_limits l = test_limits();
    l.labels_required = 0;
    expect_header_error(&l, "{" IMG("U8", "[2,3,2,3]", 8, 44) "}", 44, "data_not_contiguous");
}

static void test_a_label_count_other_than_n_is_label_count_mismatch(void **st)
{
    expect_header_error_default("{" IMG_OK "," LAB("I64", "[3]", 36, 60) "}", 60, "label_count_mismatch");
    expect_header_error_default("{" IMG_OK "," LAB("U8", "[1,3,2]", 36, 42) "}", 42, "label_count_mismatch");
}

static void test_images_higher_or_wider_than_the_limit_are_image_too_large(void **st)
{
    sf_st_limits l = test_limits();
    l.max_h = 2;
    expect_header_error(&l, "{" IMG_OK "," LAB_OK "}", 52, "image_too_large");
    l = test_limits();
    l.max_w = 1;
    expect_header_error(&l, "{" IMG_OK "," LAB_OK "}", 52, "image_too_large");
    /* huge dimensions never overflow the size computation */
    expect_header_error_default("{" IMG("U8", "[2,9007199254740992,9007199254740992,3]", 0, 36) "," LAB_OK "}", 52,
                                "image_too_large");
}

static void test_more_samples_than_the_limit_is_batch_too_large(void **st)
{
    sf_st_limits l = test_limits();
    l.max_n = 1;
    expect_header_error(&l, "{" IMG_OK "," LAB_OK "}", 52, "batch_too_large");
}

static void test_a_body_declaring_more_than_the_limit_is_body_too_large(void **st)
{
    sf_st_limits l = test_limits();
    const char *json = "{" IMG_OK "," LAB_OK "}";
    l.max_body_bytes = 8 + strlen(json) + 51;
    expect_header_error(&l, json, 52, "body_too_large");
    l.max_body_bytes = 8 + strlen(json) + 52; /* exactly at the limit: fine */
    size_t len;
    uint8_t *b = craft(json, 52, 1, &len);
    sf_st_parser p;
    uint8_t *dest;
    sf_st_init(&p, &l);
    assert_int_equal(feed_body(&p, b, len, WHOLE, 0, &dest, 0), 0);
    free(dest);
    sf_st_free(&p);
    /* a header alone larger than the body limit fails at the length */
    l.max_body_bytes = 100;
    uint8_t hl[8] = {200, 0, 0, 0, 0, 0, 0, 0};
    sf_st_init(&p, &l);
    assert_int_equal(sf_st_feed(&p, hl, 8), 8);
    assert_string_equal(sf_st_error_code(&p), "body_too_large");
    sf_st_free(&p);
    free(b);
}

static void test_one_byte_past_the_declared_end_is_body_too_long_at_once(void **st)
{
    sf_st_limits l = test_limits();
    batch_spec s = spec_nhwc_i64();
    batch b = make_batch(&s);
    uint8_t *longer = malloc(b.body_len + 5);
    memcpy(longer, b.body, b.body_len);
    memset(longer + b.body_len, 0, 5);
    expect_error_lim(&l, longer, b.body_len + 1, "body_too_long", 0);
    expect_error_lim(&l, longer, b.body_len + 5, "body_too_long", 0);
    /* byte by byte: COMPLETE after the last byte, FAILED at the first extra one */
    sf_st_parser p;
    uint8_t *dest;
    sf_st_init(&p, &l);
    feed_body(&p, b.body, b.body_len, BYTE_BY_BYTE, 0, &dest, 0);
    assert_int_equal(sf_st_state_of(&p), SF_ST_COMPLETE);
    assert_int_equal(sf_st_feed(&p, longer + b.body_len, 1), 0);
    assert_int_equal(sf_st_state_of(&p), SF_ST_FAILED);
    assert_string_equal(sf_st_error_code(&p), "body_too_long");
    assert_int_equal(sf_st_finish(&p), -1);
    free(dest);
    sf_st_free(&p);
    free(longer);
    free_batch(&b);
}

static void test_a_body_that_ends_early_is_body_too_short_at_finish(void **st)
{
    sf_st_limits l = test_limits();
    batch_spec s = spec_nhwc_i64();
    batch b = make_batch(&s);
    size_t cuts[] = {0, 3, 8, 20, b.body_len - b.images_bytes - b.labels_bytes, b.body_len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        for (int k = 0; k < CHUNKINGS; k++) {
            sf_st_parser p;
            uint8_t *dest;
            sf_st_init(&p, &l);
            int rc = feed_body(&p, b.body, cuts[i], k < 2 ? k : RANDOM, (uint32_t)k, &dest, 0);
            assert_int_equal(rc, -1);
            assert_string_equal(sf_st_error_code(&p), "body_too_short");
            assert_true(strlen(sf_st_error_message(&p)) > 10);
            free(dest);
            sf_st_free(&p);
        }
    }
    free_batch(&b);
}

static void test_a_label_at_or_above_the_class_count_is_label_out_of_range_with_its_index(void **st)
{
    sf_st_limits l = test_limits();
    l.classes = 10;
    const sf_st_dtype dts[3] = {SF_ST_I64, SF_ST_I32, SF_ST_U8};
    for (int d = 0; d < 3; d++) {
        for (int first = 0; first < 2; first++) {
            batch_spec s = spec_nhwc_i64();
            s.label_dtype = dts[d];
            s.labels_first = first;
            s.label_ndim = 3;
            batch b = make_batch(&s);
            int sz = sf_st_dtype_size(dts[d]);
            size_t data = b.body_len - b.images_bytes - b.labels_bytes;
            size_t lab0 = data + (first ? 0 : b.images_bytes);
            /* element 13 becomes 10 (== classes), element 40 becomes 200 */
            put_le(b.body + lab0 + 13 * (size_t)sz, 10, sz);
            put_le(b.body + lab0 + 40 * (size_t)sz, 200, sz);
            for (int k = 0; k < CHUNKINGS; k++) {
                sf_st_parser p;
                uint8_t *dest;
                sf_st_init(&p, &l);
                int rc = feed_body(&p, b.body, b.body_len, k < 2 ? k : RANDOM, (uint32_t)k, &dest, 0);
                assert_int_equal(rc, -1);
                assert_string_equal(sf_st_error_code(&p), "label_out_of_range");
                assert_int_equal(sf_st_bad_label_index(&p), 13);
                assert_int_equal(sf_st_bad_label_value(&p), 10);
                assert_non_null(strstr(sf_st_error_message(&p), "13"));
                free(dest);
                sf_st_free(&p);
            }
            free_batch(&b);
        }
    }
    /* negative labels are out of range too */
    batch_spec s = spec_nhwc_i64();
    s.label_dtype = SF_ST_I32;
    batch b = make_batch(&s);
    put_le(b.body + b.body_len - b.labels_bytes + 4, (uint64_t)-100, 4);
    sf_st_parser p;
    uint8_t *dest;
    sf_st_init(&p, &l);
    assert_int_equal(feed_body(&p, b.body, b.body_len, BYTE_BY_BYTE, 0, &dest, 0), -1);
    assert_string_equal(sf_st_error_code(&p), "label_out_of_range");
    assert_int_equal(sf_st_bad_label_index(&p), 1);
    assert_int_equal(sf_st_bad_label_value(&p), -100);
    free(dest);
    sf_st_free(&p);
    free_batch(&b);
}

static void test_labels_are_checked_as_soon_as_they_are_complete_before_the_images(void **st)
{
    sf_st_limits l = test_limits();
    l.classes = 2;
    batch_spec s = spec_nhwc_i64();
    s.labels_first = 1;
    batch b = make_batch(&s); /* label values up to 9 */
    sf_st_parser p;
    sf_st_init(&p, &l);
    size_t used = sf_st_feed(&p, b.body, b.body_len);
    uint8_t *dest = malloc(b.dest_bytes);
    sf_st_set_dest(&p, dest, b.dest_bytes);
    sf_st_feed(&p, b.body + used, b.labels_bytes); /* only the labels */
    assert_int_equal(sf_st_state_of(&p), SF_ST_FAILED);
    assert_string_equal(sf_st_error_code(&p), "label_out_of_range");
    assert_int_equal(sf_st_finish(&p), -1);
    sf_st_free(&p);
    free(dest);
    free_batch(&b);
}

static void test_a_slot_smaller_than_dest_bytes_is_slot_too_small(void **st)
{
    sf_st_limits l = test_limits();
    batch_spec s = spec_nhwc_i64();
    batch b = make_batch(&s);
    for (int k = 0; k < CHUNKINGS; k++) {
        sf_st_parser p;
        uint8_t *dest;
        sf_st_init(&p, &l);
        assert_int_equal(feed_body(&p, b.body, b.body_len, k < 2 ? k : RANDOM, (uint32_t)k, &dest, 1), -1);
        assert_string_equal(sf_st_error_code(&p), "slot_too_small");
        assert_non_null(sf_st_info_of(&p));
        free(dest);
        sf_st_free(&p);
    }
    sf_st_parser p;
    sf_st_init(&p, &l);
    sf_st_feed(&p, b.body, b.body_len);
    sf_st_set_dest(&p, NULL, 1 << 20);
    assert_string_equal(sf_st_error_code(&p), "slot_too_small");
    sf_st_free(&p);
    free_batch(&b);
}

static void test_calls_out_of_order_fail_with_bad_call_not_a_crash(void **st)
{
    sf_st_parser p;
    uint8_t dest[8];
    sf_st_init(&p, NULL);
    assert_string_equal(sf_st_error_code(&p), "ok");
    assert_string_equal(sf_st_error_message(&p), "");
    sf_st_set_dest(&p, dest, sizeof dest);
    assert_string_equal(sf_st_error_code(&p), "bad_call");
    assert_int_equal(sf_st_feed(&p, dest, sizeof dest), 0);
    assert_int_equal(sf_st_finish(&p), -1);
    sf_st_free(&p);
}


/* ---- whole files (sf_st_file_read) ------------------------------------------------------ */

/* A file of the given header JSON and data_len data bytes (0x11 each). */
static uint8_t *file_of(const char *json, size_t data_len, size_t *len)
{
    size_t hl = strlen(json);
    *len = 8 + hl + data_len;
    uint8_t *f = malloc(*len);
    assert_non_null(f);
    for (int i = 0; i < 8; i++) f[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(f + 8, json, hl);
    memset(f + 8 + hl, 0x11, data_len);
    return f;
}

static sf_st_error read_error(const char *json, size_t data_len)
{
    size_t len;
    uint8_t *f = file_of(json, data_len, &len);
    sf_st_file sf;
    int rc = sf_st_file_read(&sf, f, len, 0, 100);
    sf_st_error e = rc == 0 ? SF_ST_OK : sf.err;
    if (rc == 0) sf_st_file_free(&sf);
    else assert_true(sf.msg[0] != '\0');
    free(f);
    return e;
}

static void test_a_file_reads_with_any_tensor_names_and_its_metadata(void **state)
{
    const char *json = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"b.weight\":{\"dtype\":\"F32\",\"shape\":[2,1,1,1,1],\"data_offsets\":[4,12]},"
                       "\"a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[12,20]},"
                       "\"c\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    size_t len;
    uint8_t *f = file_of(json, 20, &len);
    sf_st_file sf;
    assert_int_equal(sf_st_file_read(&sf, f, len, 0, 100), 0);
    assert_int_equal(sf.n, 3);
    assert_string_equal(sf.tensors[0].name, "b.weight");
    assert_int_equal(sf.tensors[0].ndim, 5);
    assert_int_equal(sf.tensors[0].begin, 4);
    assert_int_equal(sf.tensors[1].ndim, 0);
    assert_int_equal(sf.data_len, 20);
    assert_ptr_equal(sf.data, f + 8 + strlen(json));
    assert_string_equal(sf_st_file_meta(&sf, "format"), "pt");
    assert_null(sf_st_file_meta(&sf, "step"));
    sf_st_file_free(&sf);
    free(f);
}

static void test_a_file_breaking_the_container_rules_fails_with_the_upload_parsers_codes(void **state)
{
    assert_int_equal(read_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12),
                     SF_ST_E_DATA_NOT_CONTIGUOUS);
    assert_int_equal(read_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8),
                     SF_ST_E_OFFSETS_OVERLAP);
    assert_int_equal(read_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8),
                     SF_ST_E_DUPLICATE_KEY);
    assert_int_equal(read_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4),
                     SF_ST_E_SHAPE_SIZE_MISMATCH);
    assert_int_equal(read_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 5),
                     SF_ST_E_BODY_TOO_LONG);
    assert_int_equal(read_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4),
                     SF_ST_E_BODY_TOO_SHORT);
    assert_int_equal(read_error("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
                     SF_ST_E_HEADER_NOT_JSON);
    assert_int_equal(read_error("{\"__metadata__\":{\"step\":1}}", 0), SF_ST_E_BAD_METADATA);
    assert_int_equal(read_error("[1]", 0), SF_ST_E_HEADER_NOT_OBJECT);
    assert_int_equal(read_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[[[1]]],\"data_offsets\":[0,4]}}", 4),
                     SF_ST_E_HEADER_TOO_DEEP);
    sf_st_file sf;
    uint8_t tiny[4] = {0};
    assert_int_equal(sf_st_file_read(&sf, tiny, sizeof tiny, 0, 100), -1);
    assert_int_equal(sf.err, SF_ST_E_BODY_TOO_SHORT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_an_nhwc_batch_with_i64_labels_lands_in_dest_in_every_chunking),
        cmocka_unit_test(test_an_nchw_batch_is_recognised_by_its_shape_without_metadata),
        cmocka_unit_test(test_the_metadata_layout_decides_between_nhwc_and_nchw),
        cmocka_unit_test(test_i32_and_u8_labels_are_accepted),
        cmocka_unit_test(test_segmentation_labels_of_shape_n_h_w_are_accepted),
        cmocka_unit_test(test_labels_stored_before_images_still_land_after_the_images_in_dest),
        cmocka_unit_test(test_images_without_labels_parse_in_labels_optional_mode),
        cmocka_unit_test(test_label_values_below_the_class_count_pass_the_check),
        cmocka_unit_test(test_a_header_padded_with_spaces_and_limits_of_zero_use_defaults),
        cmocka_unit_test(test_feed_stops_at_the_end_of_the_header_and_waits_for_a_dest),
        cmocka_unit_test(test_files_written_by_python_safetensors_parse),
        cmocka_unit_test(test_the_writer_reproduces_the_python_reference_headers_byte_for_byte),
        cmocka_unit_test(test_a_built_header_round_trips_through_the_parser),
        cmocka_unit_test(test_the_writer_rejects_invalid_descriptions),
        cmocka_unit_test(test_dtype_names_sizes_and_parsing_agree),
        cmocka_unit_test(test_a_header_length_below_two_is_header_length_invalid),
        cmocka_unit_test(test_a_header_longer_than_the_limit_is_header_too_large),
        cmocka_unit_test(test_a_header_that_is_not_json_is_header_not_json),
        cmocka_unit_test(test_a_header_that_is_not_an_object_is_header_not_object),
        cmocka_unit_test(test_a_header_nested_deeper_than_four_is_header_too_deep),
        cmocka_unit_test(test_a_name_given_twice_is_duplicate_key),
        cmocka_unit_test(test_metadata_that_is_not_an_object_of_strings_is_bad_metadata),
        cmocka_unit_test(test_a_tensor_other_than_images_and_labels_is_unknown_tensor),
        cmocka_unit_test(test_a_malformed_tensor_entry_is_bad_tensor),
        cmocka_unit_test(test_a_body_without_images_is_missing_images),
        cmocka_unit_test(test_a_body_without_labels_is_missing_labels_when_labels_are_required),
        cmocka_unit_test(test_a_dtype_name_the_format_does_not_know_is_unknown_dtype),
        cmocka_unit_test(test_a_known_dtype_the_service_cannot_use_is_unsupported_dtype),
        cmocka_unit_test(test_a_shape_of_the_wrong_rank_or_size_is_bad_shape),
        cmocka_unit_test(test_a_layout_that_cannot_be_decided_is_bad_layout),
        cmocka_unit_test(test_offsets_that_disagree_with_shape_and_dtype_are_shape_size_mismatch),
        cmocka_unit_test(test_malformed_data_offsets_are_bad_offsets),
        cmocka_unit_test(test_overlapping_tensors_are_offsets_overlap),
        cmocka_unit_test(test_a_hole_in_the_data_section_is_data_not_contiguous),
        cmocka_unit_test(test_a_label_count_other_than_n_is_label_count_mismatch),
        cmocka_unit_test(test_images_higher_or_wider_than_the_limit_are_image_too_large),
        cmocka_unit_test(test_more_samples_than_the_limit_is_batch_too_large),
        cmocka_unit_test(test_a_body_declaring_more_than_the_limit_is_body_too_large),
        cmocka_unit_test(test_one_byte_past_the_declared_end_is_body_too_long_at_once),
        cmocka_unit_test(test_a_body_that_ends_early_is_body_too_short_at_finish),
        cmocka_unit_test(test_a_label_at_or_above_the_class_count_is_label_out_of_range_with_its_index),
        cmocka_unit_test(test_labels_are_checked_as_soon_as_they_are_complete_before_the_images),
        cmocka_unit_test(test_a_slot_smaller_than_dest_bytes_is_slot_too_small),
        cmocka_unit_test(test_calls_out_of_order_fail_with_bad_call_not_a_crash),
        cmocka_unit_test(test_a_file_reads_with_any_tensor_names_and_its_metadata),
        cmocka_unit_test(test_a_file_breaking_the_container_rules_fails_with_the_upload_parsers_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
