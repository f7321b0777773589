/* tests/unit/test_jpeg_header.c — the JPEG header reader (server/jpeg_header.h)
 * and the safetensors parser's "jpeg" form that calls it.
 *
 * Real files come from libjpeg-turbo's encoder (every subsampling, grayscale,
 * progressive); the refusals are real files with one field patched, or
 * minimal files built marker by marker, so each error code has its own
 * input. The body-form tests feed every body whole, byte by byte and in
 * random chunks, and check that a bad file fails the parse as soon as its
 * last byte has arrived, naming its index. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#include "gpu/backend.h"
#include "server/jpeg_header.h"
#include "server/safetensors.h"

/* ---- files ---------------------------------------------------------------- */

typedef struct file {
    uint8_t *d;
    size_t len;
} file;

/* A smooth h x w RGB (or gray) image encoded at quality 90. */
static file encode(int h, int w, int subsamp, int progressive)
{
    int gray = subsamp == TJSAMP_GRAY;
    int ch = gray ? 1 : 3;
    uint8_t *px = malloc((size_t)h * w * ch);
    assert_non_null(px);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < ch; c++)
                px[((size_t)y * w + x) * ch + c] = (uint8_t)((x * 255 / w + y * 97 / h + c * 60) & 255);
    tjhandle tj = tjInitCompress();
    assert_non_null(tj);
    unsigned char *out = NULL;
    unsigned long len = 0;
    int flags = progressive ? TJFLAG_PROGRESSIVE : 0;
    assert_int_equal(tjCompress2(tj, px, w, w * ch, h, gray ? TJPF_GRAY : TJPF_RGB, &out, &len, subsamp, 90,
                                 flags),
                     0);
    tjDestroy(tj);
    free(px);
    file f = {malloc(len), len};
    assert_non_null(f.d);
    memcpy(f.d, out, len);
    tjFree(out);
    return f;
}

/* The offset of the SOF segment's marker in a file from encode(). */
static size_t sof_at(const file *f)
{
    for (size_t i = 2; i + 1 < f->len; i++)
        if (f->d[i] == 0xFF && f->d[i + 1] >= 0xC0 && f->d[i + 1] <= 0xC2)
            return i;
    fail_msg("no SOF marker");
    return 0;
}

static sf_jpeg_error parse(const file *f, const sf_jpeg_limits *lim, sf_jpeg_info *info, char *msg)
{
    return sf_jpeg_header_parse(f->d, f->len, lim, info, msg, SF_JPEG_MSG_CAP);
}

static void expect(const file *f, const sf_jpeg_limits *lim, sf_jpeg_error want)
{
    sf_jpeg_info info;
    char msg[SF_JPEG_MSG_CAP];
    sf_jpeg_error e = parse(f, lim, &info, msg);
    if (e != want)
        fail_msg("expected %s, got %s (%s)", sf_jpeg_error_name(want), sf_jpeg_error_name(e), msg);
    if (want != SF_JPEG_OK)
        assert_true(strlen(msg) > 10);
}

/* A minimal file built marker by marker: SOI, SOFn with the given fields,
 * a 1-component SOS header, two bytes of scan data, EOI. */
static file craft(int sof, int prec, int h, int w, int nc, const int *hv)
{
    uint8_t b[160];
    size_t n = 0;
    b[n++] = 0xFF; b[n++] = 0xD8;
    b[n++] = 0xFF; b[n++] = (uint8_t)(0xC0 + sof);
    int seg = 8 + 3 * nc;
    b[n++] = (uint8_t)(seg >> 8); b[n++] = (uint8_t)seg;
    b[n++] = (uint8_t)prec;
    b[n++] = (uint8_t)(h >> 8); b[n++] = (uint8_t)h;
    b[n++] = (uint8_t)(w >> 8); b[n++] = (uint8_t)w;
    b[n++] = (uint8_t)nc;
    for (int k = 0; k < nc; k++) {
        b[n++] = (uint8_t)(k + 1);
        b[n++] = (uint8_t)hv[k];
        b[n++] = 0;
    }
    const uint8_t sos[] = {0xFF, 0xDA, 0x00, 0x08, 0x01, 0x01, 0x00, 0x00, 0x3F, 0x00, 0x12, 0x34, 0xFF, 0xD9};
    memcpy(b + n, sos, sizeof sos);
    n += sizeof sos;
    file f = {malloc(n), n};
    assert_non_null(f.d);
    memcpy(f.d, b, n);
    return f;
}

/* ---- the header reader ------------------------------------------------------- */

static void test_encoder_files_of_every_subsampling_read_back_their_size_and_subsampling(void **state)
{
    static const struct {
        int tj, want;
    } cases[] = {{TJSAMP_444, SF_JPEG_444}, {TJSAMP_422, SF_JPEG_422}, {TJSAMP_420, SF_JPEG_420},
                 {TJSAMP_440, SF_JPEG_440}, {TJSAMP_411, SF_JPEG_411}, {TJSAMP_GRAY, SF_JPEG_GRAY}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        for (int prog = 0; prog < 2; prog++) {
            file f = encode(37, 53, cases[k].tj, prog);
            sf_jpeg_info info;
            char msg[SF_JPEG_MSG_CAP];
            assert_int_equal(parse(&f, NULL, &info, msg), SF_JPEG_OK);
            assert_int_equal(info.h, 37);
            assert_int_equal(info.w, 53);
            assert_int_equal(info.subsamp, cases[k].want);
            assert_int_equal(info.components, cases[k].want == SF_JPEG_GRAY ? 1 : 3);
            assert_int_equal(info.progressive, prog);
            assert_int_equal(info.sof, prog ? 2 : 0);
            free(f.d);
        }
    }
}

static void test_a_file_without_soi_is_jpeg_not_jpeg(void **state)
{
    const uint8_t png[] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A, 0, 0, 0, 13};
    file f = {(uint8_t *)png, sizeof png};
    expect(&f, NULL, SF_JPEG_E_NOT_JPEG);
    file one = {(uint8_t *)png, 1};
    expect(&one, NULL, SF_JPEG_E_NOT_JPEG);
}

static void test_every_cut_of_a_real_file_is_jpeg_truncated(void **state)
{
    file f = encode(24, 40, TJSAMP_420, 0);
    for (size_t len = 2; len < f.len; len++) {
        file cut = {f.d, len};
        sf_jpeg_info info;
        char msg[SF_JPEG_MSG_CAP];
        sf_jpeg_error e = parse(&cut, NULL, &info, msg);
        if (e != SF_JPEG_E_TRUNCATED)
            fail_msg("cut at %zu of %zu: expected jpeg_truncated, got %s (%s)", len, f.len, sf_jpeg_error_name(e),
                     msg);
    }
    expect(&f, NULL, SF_JPEG_OK);
    free(f.d);
}

static void test_trailing_zero_bytes_after_eoi_are_accepted(void **state)
{
    file f = encode(8, 8, TJSAMP_444, 0);
    file g = {malloc(f.len + 5), f.len + 5};
    memcpy(g.d, f.d, f.len);
    memset(g.d + f.len, 0, 5);
    expect(&g, NULL, SF_JPEG_OK);
    free(f.d);
    free(g.d);
}

/* Bytes after EOI (a web server's trailer, a second file, a cut-off copy)
 * are no part of the image: the file is accepted and the decoders are given
 * its bytes up to EOI. */
static void test_bytes_after_eoi_are_accepted_and_left_out_of_the_data_length(void **state)
{
    for (int prog = 0; prog < 2; prog++) {
        file f = encode(24, 40, TJSAMP_420, prog);
        static const char tail[] = "\x17trailer<html>\xff\xd8\xff\xe0 and more";
        const size_t tn = sizeof tail - 1;
        file g = {malloc(f.len + tn), f.len + tn};
        memcpy(g.d, f.d, f.len);
        memcpy(g.d + f.len, tail, tn);
        sf_jpeg_info info;
        char msg[SF_JPEG_MSG_CAP];
        sf_jpeg_error e = parse(&g, NULL, &info, msg);
        if (e != SF_JPEG_OK)
            fail_msg("progressive %d: %s (%s)", prog, sf_jpeg_error_name(e), msg);
        assert_int_equal(info.data_len, (int64_t)f.len);
        assert_int_equal(parse(&f, NULL, &info, msg), SF_JPEG_OK);
        assert_int_equal(info.data_len, (int64_t)f.len);
        free(f.d);
        free(g.d);
    }
}

/* A file cut inside its scan stays refused, whatever follows the cut, as
 * long as no EOI does. */
static void test_a_scan_cut_short_is_jpeg_truncated_even_with_bytes_after_the_cut(void **state)
{
    file f = encode(24, 40, TJSAMP_420, 0);
    const size_t cut = f.len - 20;
    file g = {malloc(cut + 7), cut + 7};
    memcpy(g.d, f.d, cut);
    static const uint8_t junk[7] = {0x17, 0x00, 'a', 'b', 'c', 0x00, 0x01};
    memcpy(g.d + cut, junk, sizeof junk);
    expect(&g, NULL, SF_JPEG_E_TRUNCATED);
    free(f.d);
    free(g.d);
}

static void test_a_bomb_header_in_a_tiny_file_is_refused_by_side_then_by_pixels(void **state)
{
    /* 65535 x 65535 (12.8 GB of RGB) declared by a real file of a few hundred bytes. */
    file f = encode(16, 16, TJSAMP_420, 0);
    assert_true(f.len < 1024);
    size_t s = sof_at(&f);
    f.d[s + 5] = 0xFF; f.d[s + 6] = 0xFF; /* height */
    f.d[s + 7] = 0xFF; f.d[s + 8] = 0xFF; /* width */
    sf_jpeg_limits side = {8192, 0};
    expect(&f, &side, SF_JPEG_E_SIDE_TOO_LARGE);
    sf_jpeg_limits pixels = {0, 16777216};
    expect(&f, &pixels, SF_JPEG_E_TOO_MANY_PIXELS);
    sf_jpeg_info info;
    char msg[SF_JPEG_MSG_CAP];
    assert_int_equal(parse(&f, NULL, &info, msg), SF_JPEG_OK); /* unbounded: only the limits refuse it */
    assert_int_equal(info.h, 65535);
    free(f.d);
}

static void test_a_size_at_the_limits_is_accepted_and_one_more_is_refused(void **state)
{
    file f = encode(30, 40, TJSAMP_444, 0);
    sf_jpeg_limits at = {40, 1200};
    expect(&f, &at, SF_JPEG_OK);
    sf_jpeg_limits side = {39, 0};
    expect(&f, &side, SF_JPEG_E_SIDE_TOO_LARGE);
    sf_jpeg_limits px = {0, 1199};
    expect(&f, &px, SF_JPEG_E_TOO_MANY_PIXELS);
    free(f.d);
}

static void test_12_bit_lossless_hierarchical_dnl_and_five_component_files_are_jpeg_unsupported(void **state)
{
    const int hv1[] = {0x11, 0x11, 0x11, 0x11, 0x11};
    struct {
        int sof, prec, h, nc;
    } cases[] = {
        {1, 12, 16, 3}, /* 12-bit */
        {3, 8, 16, 3},  /* lossless */
        {11, 8, 16, 3}, /* lossless arithmetic */
        {5, 8, 16, 3},  /* hierarchical */
        {13, 8, 16, 3}, /* hierarchical arithmetic */
        {0, 8, 0, 3},   /* height from a DNL marker */
        {0, 8, 16, 5},  /* five components */
        {0, 8, 16, 2},  /* two components */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        file f = craft(cases[k].sof, cases[k].prec, cases[k].h, 16, cases[k].nc, hv1);
        expect(&f, NULL, SF_JPEG_E_UNSUPPORTED);
        free(f.d);
    }
}

/* CMYK and YCCK (4 components) and arithmetic-coded files (SOF9, SOF10) are
 * read, and their forms tell a backend to decode them on the host. */
static void test_cmyk_and_arithmetic_files_are_accepted_with_their_forms(void **state)
{
    const int hv1[] = {0x11, 0x11, 0x11, 0x11};
    struct {
        int sof, nc;
        unsigned forms;
    } cases[] = {
        {0, 4, SF_JPEG_FORM_CMYK},
        {2, 4, SF_JPEG_FORM_CMYK | SF_JPEG_FORM_PROGRESSIVE},
        {9, 3, SF_JPEG_FORM_ARITHMETIC | SF_JPEG_FORM_EXTENDED},
        {10, 3, SF_JPEG_FORM_ARITHMETIC | SF_JPEG_FORM_PROGRESSIVE},
        {1, 3, SF_JPEG_FORM_EXTENDED},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        file f = craft(cases[k].sof, 8, 16, 16, cases[k].nc, hv1);
        sf_jpeg_info info;
        char msg[SF_JPEG_MSG_CAP];
        sf_jpeg_error e = parse(&f, NULL, &info, msg);
        if (e != SF_JPEG_OK)
            fail_msg("SOF%d with %d components: %s (%s)", cases[k].sof, cases[k].nc, sf_jpeg_error_name(e), msg);
        assert_int_equal(info.components, cases[k].nc);
        assert_int_equal(sf_jpeg_forms(&info), cases[k].forms);
        free(f.d);
    }
    const int bad[] = {0x11, 0x11, 0x51, 0x11};
    file f = craft(0, 8, 16, 16, 4, bad);
    expect(&f, NULL, SF_JPEG_E_MALFORMED);
    free(f.d);
}

/* A real progressive file with `extra` more scans (empty scans of the first
 * component) inserted before its EOI. */
static file with_extra_scans(int extra)
{
    file f = encode(16, 16, TJSAMP_420, 1);
    static const uint8_t scan[] = {0xFF, 0xDA, 0x00, 0x08, 0x01, 0x01, 0x00, 0x00, 0x3F, 0x00, 0x12, 0x34};
    size_t n = f.len + (size_t)extra * sizeof scan;
    uint8_t *d = malloc(n);
    assert_non_null(d);
    memcpy(d, f.d, f.len - 2);
    for (int k = 0; k < extra; k++)
        memcpy(d + f.len - 2 + (size_t)k * sizeof scan, scan, sizeof scan);
    memcpy(d + n - 2, f.d + f.len - 2, 2); /* EOI */
    free(f.d);
    return (file){d, n};
}

static void test_a_file_of_more_scans_than_the_bound_is_jpeg_unsupported(void **state)
{
    (void)state;
    /* Scan data may hold 0xFF only as 0xFF00 or a restart marker: a real
     * progressive file counts its own few scans, not its bytes. */
    file real = encode(64, 64, TJSAMP_444, 1);
    expect(&real, NULL, SF_JPEG_OK);
    free(real.d);
    file ok = with_extra_scans(SF_JPEG_MAX_SCANS - 30); /* the encoder's ~10 + these */
    expect(&ok, NULL, SF_JPEG_OK);
    free(ok.d);
    file bomb = with_extra_scans(SF_JPEG_MAX_SCANS);
    expect(&bomb, NULL, SF_JPEG_E_UNSUPPORTED);
    sf_jpeg_info info;
    char msg[SF_JPEG_MSG_CAP];
    parse(&bomb, NULL, &info, msg);
    assert_non_null(strstr(msg, "more than 500 scans"));
    free(bomb.d);
}

/* Each scan of a progressive file is a pass over the whole image: a large
 * image may have fewer scans than a small one, never fewer than
 * SF_JPEG_MIN_SCANS. */
static void test_the_scan_bound_shrinks_with_the_image_size(void **state)
{
    (void)state;
    file f = with_extra_scans(100);
    expect(&f, NULL, SF_JPEG_OK);
    const size_t sof = sof_at(&f);
    f.d[sof + 5] = 0x10; /* height 4096 */
    f.d[sof + 6] = 0x00;
    f.d[sof + 7] = 0x10; /* width 4096 */
    f.d[sof + 8] = 0x00;
    sf_jpeg_info info;
    char msg[SF_JPEG_MSG_CAP];
    assert_int_equal(parse(&f, NULL, &info, msg), SF_JPEG_E_UNSUPPORTED);
    assert_non_null(strstr(msg, "more than 64 scans"));
    free(f.d);
    sf_jpeg_info big = {.h = 65535, .w = 65535};
    assert_int_equal(sf_jpeg_scan_bound(&big), SF_JPEG_MIN_SCANS);
    sf_jpeg_info small = {.h = 500, .w = 375};
    assert_int_equal(sf_jpeg_scan_bound(&small), SF_JPEG_MAX_SCANS);
}

static void test_chroma_sampled_above_1x1_or_an_odd_luma_factor_is_jpeg_unsupported(void **state)
{
    const int chroma22[] = {0x22, 0x22, 0x11};
    const int luma31[] = {0x31, 0x11, 0x11};
    file a = craft(0, 8, 16, 16, 3, chroma22);
    expect(&a, NULL, SF_JPEG_E_UNSUPPORTED);
    file b = craft(0, 8, 16, 16, 3, luma31);
    expect(&b, NULL, SF_JPEG_E_UNSUPPORTED);
    free(a.d);
    free(b.d);
}

static void test_bad_segment_lengths_markers_and_sof_bodies_are_jpeg_malformed(void **state)
{
    const int hv[] = {0x22, 0x11, 0x11};
    /* A segment length below 2. */
    file f = encode(8, 8, TJSAMP_420, 0);
    f.d[4] = 0x00; f.d[5] = 0x01;
    expect(&f, NULL, SF_JPEG_E_MALFORMED);
    free(f.d);
    /* A byte that is not a marker where one must start. */
    f = encode(8, 8, TJSAMP_420, 0);
    f.d[2] = 0x12;
    expect(&f, NULL, SF_JPEG_E_MALFORMED);
    free(f.d);
    /* SOS before any SOF. */
    const uint8_t nosof[] = {0xFF, 0xD8, 0xFF, 0xDA, 0x00, 0x08, 0x01, 0x01, 0x00, 0x00, 0x3F, 0x00, 0xFF, 0xD9};
    file g = {(uint8_t *)nosof, sizeof nosof};
    expect(&g, NULL, SF_JPEG_E_MALFORMED);
    /* A SOF whose length disagrees with its component count. */
    file h = craft(0, 8, 16, 16, 3, hv);
    h.d[5] = (uint8_t)(h.d[5] - 3);
    expect(&h, NULL, SF_JPEG_E_MALFORMED);
    free(h.d);
    /* Width 0. */
    file w0 = craft(0, 8, 16, 0, 3, hv);
    expect(&w0, NULL, SF_JPEG_E_MALFORMED);
    free(w0.d);
    /* A second SOF. */
    file one = craft(0, 8, 16, 16, 3, hv);
    size_t sof_len = 2 + 8 + 9;
    file two = {malloc(one.len + sof_len), one.len + sof_len};
    memcpy(two.d, one.d, 2 + sof_len);
    memcpy(two.d + 2 + sof_len, one.d + 2, one.len - 2);
    expect(&two, NULL, SF_JPEG_E_MALFORMED);
    free(one.d);
    free(two.d);
}

static void test_error_and_subsampling_names_are_stable(void **state)
{
    assert_string_equal(sf_jpeg_error_name(SF_JPEG_OK), "ok");
    assert_string_equal(sf_jpeg_error_name(SF_JPEG_E_NOT_JPEG), "jpeg_not_jpeg");
    assert_string_equal(sf_jpeg_error_name(SF_JPEG_E_TRUNCATED), "jpeg_truncated");
    assert_string_equal(sf_jpeg_error_name(SF_JPEG_E_MALFORMED), "jpeg_malformed");
    assert_string_equal(sf_jpeg_error_name(SF_JPEG_E_SIDE_TOO_LARGE), "jpeg_side_too_large");
    assert_string_equal(sf_jpeg_error_name(SF_JPEG_E_TOO_MANY_PIXELS), "jpeg_too_many_pixels");
    assert_string_equal(sf_jpeg_error_name(SF_JPEG_E_UNSUPPORTED), "jpeg_unsupported");
    assert_null(sf_jpeg_error_name(SF_JPEG_ERROR_COUNT));
    assert_string_equal(sf_jpeg_subsamp_name(SF_JPEG_420), "420");
    assert_string_equal(sf_jpeg_subsamp_name(SF_JPEG_GRAY), "gray");
    /* The parser's codes for one file are the reader's, in its order. */
    for (int e = SF_JPEG_E_NOT_JPEG; e < SF_JPEG_ERROR_COUNT; e++)
        assert_string_equal(sf_st_error_name((sf_st_error)(SF_ST_E_JPEG_NOT_JPEG + (e - SF_JPEG_E_NOT_JPEG))),
                            sf_jpeg_error_name((sf_jpeg_error)e));
}

/* ---- the "jpeg" body form ----------------------------------------------------- */

#define NF 4

typedef struct body {
    uint8_t *d;
    size_t len;
    size_t file_end[NF]; /* body offset just past file i */
} body;

/* A body of the nf files with I64 labels 0..nf-1; order: 0 offsets, labels,
 * jpeg (as Python's safetensors writes it: by dtype size, then name); 1 jpeg
 * first. */
static body make_body(file *f, int nf, int order)
{
    int64_t off[NF + 1] = {0};
    for (int i = 0; i < nf; i++) off[i + 1] = off[i] + (int64_t)f[i].len;
    int64_t lab[NF];
    for (int i = 0; i < nf; i++) lab[i] = i;
    sf_st_tensor_desc tj = {"jpeg", SF_ST_U8, 1, {off[nf]}};
    sf_st_tensor_desc to = {"jpeg_offsets", SF_ST_I64, 1, {nf + 1}};
    sf_st_tensor_desc tl = {"labels", SF_ST_I64, 1, {nf}};
    sf_st_tensor_desc t[3];
    if (order == 0) { t[0] = to; t[1] = tl; t[2] = tj; }
    else { t[0] = tj; t[1] = to; t[2] = tl; }
    size_t hl = sf_st_header_build(NULL, 0, t, 3, NULL);
    assert_true(hl > 0);
    body b;
    memset(&b, 0, sizeof b);
    b.len = hl + (size_t)off[nf] + 8 * (size_t)(nf + 1) + 8 * (size_t)nf;
    b.d = malloc(b.len);
    assert_non_null(b.d);
    assert_int_equal(sf_st_header_build((char *)b.d, hl, t, 3, NULL), hl);
    size_t at = hl;
    for (int k = 0; k < 3; k++) {
        if (t[k].name == tj.name) {
            for (int i = 0; i < nf; i++) {
                memcpy(b.d + at, f[i].d, f[i].len);
                at += f[i].len;
                b.file_end[i] = at;
            }
        } else if (t[k].name == to.name) {
            memcpy(b.d + at, off, 8 * (size_t)(nf + 1)); /* little-endian host */
            at += 8 * (size_t)(nf + 1);
        } else {
            memcpy(b.d + at, lab, 8 * (size_t)nf);
            at += 8 * (size_t)nf;
        }
    }
    assert_int_equal(at, b.len);
    return b;
}

static sf_st_limits jpeg_limits(void)
{
    sf_st_limits l;
    memset(&l, 0, sizeof l);
    l.max_n = 64;
    l.classes = 10;
    l.labels_required = 1;
    l.jpeg_max_side = 4096;
    l.jpeg_max_pixels = 1 << 22;
    return l;
}

/* Feeds len bytes of the body in chunks of at most chunk bytes (0: whole);
 * allocates dest at NEED_DEST (the caller frees it). */
static void feed(sf_st_parser *p, const uint8_t *d, size_t len, size_t chunk, uint8_t **dest)
{
    size_t off = 0;
    while (off < len && sf_st_state_of(p) != SF_ST_FAILED) {
        size_t n = chunk && chunk < len - off ? chunk : len - off;
        const uint8_t *q = d + off;
        size_t left = n;
        while (left > 0 && sf_st_state_of(p) != SF_ST_FAILED) {
            size_t used = sf_st_feed(p, q, left);
            q += used;
            left -= used;
            if (sf_st_state_of(p) == SF_ST_NEED_DEST) {
                size_t cap = (size_t)sf_st_info_of(p)->dest_bytes;
                *dest = malloc(cap);
                assert_non_null(*dest);
                memset(*dest, 0xEE, cap);
                sf_st_set_dest(p, *dest, cap);
            }
        }
        off += n;
    }
}

static void test_a_jpeg_body_in_any_chunking_and_order_lands_files_offsets_labels_and_headers_in_dest(void **state)
{
    file f[NF] = {encode(20, 30, TJSAMP_420, 0), encode(20, 30, TJSAMP_444, 1), encode(20, 30, TJSAMP_GRAY, 0),
                  encode(20, 30, TJSAMP_422, 0)};
    static const size_t chunks[] = {0, 1, 7, 64, 1000};
    for (int order = 0; order < 2; order++) {
        body b = make_body(f, NF, order);
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
            sf_st_limits lim = jpeg_limits();
            sf_st_parser p;
            sf_st_init(&p, &lim);
            uint8_t *dest = NULL;
            feed(&p, b.d, b.len, chunks[c], &dest);
            if (sf_st_finish(&p) != 0)
                fail_msg("order %d chunk %zu: %s (%s)", order, chunks[c], sf_st_error_code(&p),
                         sf_st_error_message(&p));
            const sf_st_info *in = sf_st_info_of(&p);
            assert_int_equal(in->encoded, 1);
            assert_int_equal(in->n, NF);
            assert_int_equal(in->c, 3);
            assert_int_equal(in->jpeg_pixels, NF * 20 * 30);
            assert_int_equal(in->jpeg_max_h, 20);
            assert_int_equal(in->jpeg_max_w, 30);
            assert_int_equal(in->labels_dest_off % 64, 0);
            assert_int_equal(in->jpeg_offsets_dest_off % 64, 0);
            assert_int_equal(in->jpeg_info_dest_off % 64, 0);
            const int64_t *off = (const int64_t *)(const void *)(dest + in->jpeg_offsets_dest_off);
            const int64_t *lab = (const int64_t *)(const void *)(dest + in->labels_dest_off);
            const sf_jpeg_info *ji = (const sf_jpeg_info *)(const void *)(dest + in->jpeg_info_dest_off);
            for (int i = 0; i < NF; i++) {
                assert_int_equal(off[i + 1] - off[i], f[i].len);
                assert_memory_equal(dest + off[i], f[i].d, f[i].len);
                assert_int_equal(lab[i], i);
                assert_int_equal(ji[i].h, 20);
                assert_int_equal(ji[i].w, 30);
            }
            assert_int_equal(ji[1].progressive, 1);
            assert_int_equal(ji[2].subsamp, SF_JPEG_GRAY);
            assert_int_equal(ji[3].subsamp, SF_JPEG_422);
            free(dest);
            sf_st_free(&p);
        }
        free(b.d);
    }
    for (int i = 0; i < NF; i++) free(f[i].d);
}

static void test_a_bad_file_fails_as_soon_as_its_last_byte_arrives_naming_its_index(void **state)
{
    file f[NF] = {encode(16, 16, TJSAMP_420, 0), encode(16, 16, TJSAMP_420, 0), encode(16, 16, TJSAMP_420, 0),
                  encode(16, 16, TJSAMP_420, 0)};
    f[2].d[0] = 'X'; /* not a JPEG */
    body b = make_body(f, NF, 0);
    sf_st_limits lim = jpeg_limits();
    sf_st_parser p;
    sf_st_init(&p, &lim);
    uint8_t *dest = NULL;
    feed(&p, b.d, b.file_end[2] - 1, 1, &dest);
    assert_int_equal(sf_st_state_of(&p), SF_ST_DATA); /* files 0 and 1 passed */
    feed(&p, b.d + b.file_end[2] - 1, 1, 0, &dest);
    assert_int_equal(sf_st_state_of(&p), SF_ST_FAILED);
    assert_string_equal(sf_st_error_code(&p), "jpeg_not_jpeg");
    assert_int_equal(sf_st_bad_sample(&p), 2);
    assert_non_null(strstr(sf_st_error_message(&p), "sample 2"));
    free(dest);
    sf_st_free(&p);
    free(b.d);
    for (int i = 0; i < NF; i++) free(f[i].d);
}

static void expect_body_error(file *f, int order, const sf_st_limits *lim, const char *code, int64_t sample)
{
    body b = make_body(f, NF, order);
    sf_st_parser p;
    sf_st_init(&p, lim);
    uint8_t *dest = NULL;
    feed(&p, b.d, b.len, 13, &dest);
    assert_int_equal(sf_st_finish(&p), -1);
    if (strcmp(sf_st_error_code(&p), code) != 0)
        fail_msg("expected %s, got %s (%s)", code, sf_st_error_code(&p), sf_st_error_message(&p));
    assert_int_equal(sf_st_bad_sample(&p), sample);
    free(dest);
    sf_st_free(&p);
    free(b.d);
}

static void test_a_bomb_a_truncated_file_and_a_12_bit_file_are_refused_with_their_index(void **state)
{
    for (int order = 0; order < 2; order++) {
        file f[NF] = {encode(16, 16, TJSAMP_420, 0), encode(16, 16, TJSAMP_420, 0),
                      encode(16, 16, TJSAMP_420, 0), encode(16, 16, TJSAMP_420, 0)};
        size_t s = sof_at(&f[1]);
        f[1].d[s + 5] = 0xFF; f[1].d[s + 6] = 0xFF; f[1].d[s + 7] = 0xFF; f[1].d[s + 8] = 0xFF;
        sf_st_limits lim = jpeg_limits();
        expect_body_error(f, order, &lim, "jpeg_side_too_large", 1);
        lim.jpeg_max_side = 0;
        expect_body_error(f, order, &lim, "jpeg_too_many_pixels", 1);
        free(f[1].d);
        f[1] = encode(16, 16, TJSAMP_420, 0);
        f[3].len -= 10; /* cut short: no EOI */
        lim = jpeg_limits();
        expect_body_error(f, order, &lim, "jpeg_truncated", 3);
        f[3].len += 10;
        const int hv[] = {0x11, 0x11, 0x11, 0x11};
        free(f[0].d);
        f[0] = craft(0, 12, 16, 16, 3, hv);
        expect_body_error(f, order, &lim, "jpeg_unsupported", 0);
        for (int i = 0; i < NF; i++) free(f[i].d);
    }
}

static void test_more_decoded_pixels_than_the_batch_bound_is_jpeg_batch_too_large(void **state)
{
    file f[NF] = {encode(16, 16, TJSAMP_420, 0), encode(16, 16, TJSAMP_420, 0), encode(16, 16, TJSAMP_420, 0),
                  encode(16, 16, TJSAMP_420, 0)};
    sf_st_limits lim = jpeg_limits();
    lim.jpeg_max_batch_pixels = 3 * 256;
    expect_body_error(f, 0, &lim, "jpeg_batch_too_large", 3);
    lim.jpeg_max_batch_pixels = 4 * 256;
    body b = make_body(f, NF, 0);
    sf_st_parser p;
    sf_st_init(&p, &lim);
    uint8_t *dest = NULL;
    feed(&p, b.d, b.len, 0, &dest);
    assert_int_equal(sf_st_finish(&p), 0);
    free(dest);
    sf_st_free(&p);
    free(b.d);
    for (int i = 0; i < NF; i++) free(f[i].d);
}

/* A body with the given offsets (written over a valid body's). */
static void expect_offsets_error(const int64_t *off)
{
    file f[NF] = {encode(8, 8, TJSAMP_444, 0), encode(8, 8, TJSAMP_444, 0), encode(8, 8, TJSAMP_444, 0),
                  encode(8, 8, TJSAMP_444, 0)};
    body b = make_body(f, NF, 0);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | b.d[i];
    memcpy(b.d + 8 + hl, off, 8 * (NF + 1));
    sf_st_limits lim = jpeg_limits();
    sf_st_parser p;
    sf_st_init(&p, &lim);
    uint8_t *dest = NULL;
    /* Refused once the offsets are in, before any file byte. */
    feed(&p, b.d, 8 + hl + 8 * (NF + 1), 0, &dest);
    assert_int_equal(sf_st_state_of(&p), SF_ST_FAILED);
    assert_string_equal(sf_st_error_code(&p), "jpeg_offsets_invalid");
    assert_int_equal(sf_st_bad_sample(&p), -1);
    free(dest);
    sf_st_free(&p);
    free(b.d);
    for (int i = 0; i < NF; i++) free(f[i].d);
}

static void test_offsets_not_from_zero_not_rising_or_not_ending_at_the_total_are_jpeg_offsets_invalid(void **state)
{
    file f = encode(8, 8, TJSAMP_444, 0);
    int64_t L = (int64_t)f.len;
    free(f.d);
    const int64_t from1[NF + 1] = {1, L, 2 * L, 3 * L, 4 * L};
    const int64_t empty[NF + 1] = {0, L, L, 3 * L, 4 * L};
    const int64_t falling[NF + 1] = {0, 2 * L, L, 3 * L, 4 * L};
    const int64_t short_end[NF + 1] = {0, L, 2 * L, 3 * L, 4 * L - 1};
    expect_offsets_error(from1);
    expect_offsets_error(empty);
    expect_offsets_error(falling);
    expect_offsets_error(short_end);
}

static uint8_t *craft_body(const char *json, size_t data_len, size_t *len)
{
    size_t hl = strlen(json);
    *len = 8 + hl + data_len;
    uint8_t *b = calloc(1, *len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    return b;
}

static void expect_header_error(const char *json, size_t data_len, const char *code)
{
    size_t len;
    uint8_t *b = craft_body(json, data_len, &len);
    sf_st_limits lim = jpeg_limits();
    sf_st_parser p;
    sf_st_init(&p, &lim);
    uint8_t *dest = NULL;
    feed(&p, b, len, 0, &dest);
    assert_int_equal(sf_st_state_of(&p), SF_ST_FAILED);
    if (strcmp(sf_st_error_code(&p), code) != 0)
        fail_msg("%s: expected %s, got %s (%s)", json, code, sf_st_error_code(&p), sf_st_error_message(&p));
    assert_null(dest); /* refused at the header: no data byte was needed */
    free(b);
    sf_st_free(&p);
}

static void test_jpeg_headers_that_mix_forms_or_have_wrong_shapes_are_refused_at_the_header(void **state)
{
    expect_header_error("{\"images\":{\"dtype\":\"U8\",\"shape\":[1,1,1,3],\"data_offsets\":[0,3]},"
                        "\"jpeg\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[3,7]},"
                        "\"jpeg_offsets\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[7,23]},"
                        "\"labels\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[23,24]}}",
                        24, "bad_tensor");
    expect_header_error("{\"jpeg\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                        "\"labels\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[4,5]}}",
                        5, "bad_tensor");
    expect_header_error("{\"jpeg\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                        "\"jpeg_offsets\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[4,12]},"
                        "\"labels\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[12,13]}}",
                        13, "unsupported_dtype");
    expect_header_error("{\"jpeg\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                        "\"jpeg_offsets\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[4,12]},"
                        "\"labels\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[12,12]}}",
                        12, "bad_shape");
    expect_header_error("{\"jpeg\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                        "\"jpeg_offsets\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[4,20]},"
                        "\"labels\":{\"dtype\":\"U8\",\"shape\":[1,2,2],\"data_offsets\":[20,24]}}",
                        24, "bad_shape");
    expect_header_error("{\"jpeg\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                        "\"jpeg_offsets\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[4,20]},"
                        "\"labels\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[20,22]}}",
                        22, "label_count_mismatch");
    expect_header_error("{\"jpeg\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                        "\"jpeg_offsets\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[5,21]},"
                        "\"labels\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[21,22]}}",
                        22, "data_not_contiguous");
    expect_header_error("{\"jpeg\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                        "\"jpeg_offsets\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[3,19]},"
                        "\"labels\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[19,20]}}",
                        20, "offsets_overlap");
    expect_header_error("{\"jpeg\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                        "\"jpeg_offsets\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[4,20]}}",
                        20, "missing_labels");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encoder_files_of_every_subsampling_read_back_their_size_and_subsampling),
        cmocka_unit_test(test_a_file_without_soi_is_jpeg_not_jpeg),
        cmocka_unit_test(test_a_file_of_more_scans_than_the_bound_is_jpeg_unsupported),
        cmocka_unit_test(test_every_cut_of_a_real_file_is_jpeg_truncated),
        cmocka_unit_test(test_the_scan_bound_shrinks_with_the_image_size),
        cmocka_unit_test(test_bytes_after_eoi_are_accepted_and_left_out_of_the_data_length),
        cmocka_unit_test(test_a_scan_cut_short_is_jpeg_truncated_even_with_bytes_after_the_cut),
        cmocka_unit_test(test_trailing_zero_bytes_after_eoi_are_accepted),
        cmocka_unit_test(test_a_bomb_header_in_a_tiny_file_is_refused_by_side_then_by_pixels),
        cmocka_unit_test(test_a_size_at_the_limits_is_accepted_and_one_more_is_refused),
        cmocka_unit_test(test_12_bit_lossless_hierarchical_dnl_and_five_component_files_are_jpeg_unsupported),
        cmocka_unit_test(test_cmyk_and_arithmetic_files_are_accepted_with_their_forms),
        cmocka_unit_test(test_chroma_sampled_above_1x1_or_an_odd_luma_factor_is_jpeg_unsupported),
        cmocka_unit_test(test_bad_segment_lengths_markers_and_sof_bodies_are_jpeg_malformed),
        cmocka_unit_test(test_error_and_subsampling_names_are_stable),
        cmocka_unit_test(test_a_jpeg_body_in_any_chunking_and_order_lands_files_offsets_labels_and_headers_in_dest),
        cmocka_unit_test(test_a_bad_file_fails_as_soon_as_its_last_byte_arrives_naming_its_index),
        cmocka_unit_test(test_a_bomb_a_truncated_file_and_a_12_bit_file_are_refused_with_their_index),
        cmocka_unit_test(test_more_decoded_pixels_than_the_batch_bound_is_jpeg_batch_too_large),
        cmocka_unit_test(test_offsets_not_from_zero_not_rising_or_not_ending_at_the_total_are_jpeg_offsets_invalid),
        cmocka_unit_test(test_jpeg_headers_that_mix_forms_or_have_wrong_shapes_are_refused_at_the_header),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
