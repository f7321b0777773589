/* tests/fuzz/fuzz_safetensors.c — libFuzzer target for the safetensors parser.
 *
 * The input is a request body. It is parsed three ways — in one chunk, split at
 * a few points derived from the input's hash, and byte by byte (small inputs) —
 * into a dest of exactly info.dest_bytes, so ASan sees any write past it. The
 * three runs must agree on the outcome, the error code and the dest bytes. A
 * body that parses is then rebuilt with sf_st_header_build (explicit layout
 * metadata, same data section) and must parse again to the same dest.
 *
 *   make fuzz            (FUZZ_SECONDS=60 make fuzz for a shorter run)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/safetensors.h"

#define CHECK(cond) do { if (!(cond)) __builtin_trap(); } while (0)

typedef struct outcome {
    sf_st_state state;
    sf_st_error err;
    int rc;
    uint8_t *dest;
    size_t dest_bytes;
    sf_st_parser p; /* for the data order and info of a success */
} outcome;

static uint64_t fnv1a(const uint8_t *d, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ d[i]) * 1099511628211ull;
    return h;
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* Feeds data split at the sorted cut points (nc of them), or byte by byte when
 * bytewise; leaves the parser in o->p (freed by the caller). */
static void run(outcome *o, const sf_st_limits *lim, const uint8_t *data, size_t size,
                const size_t *cuts, int nc, int bytewise)
{
    memset(o, 0, sizeof *o);
    sf_st_init(&o->p, lim);
    size_t off = 0;
    int ci = 0;
    while (off < size && sf_st_state_of(&o->p) != SF_ST_FAILED) {
        size_t end = size;
        if (bytewise) end = off + 1;
        else {
            while (ci < nc && cuts[ci] <= off) ci++;
            if (ci < nc) end = cuts[ci];
        }
        const uint8_t *d = data + off;
        size_t left = end - off;
        while (left > 0 && sf_st_state_of(&o->p) != SF_ST_FAILED) {
            size_t used = sf_st_feed(&o->p, d, left);
            CHECK(used <= left);
            d += used;
            left -= used;
            if (sf_st_state_of(&o->p) == SF_ST_NEED_DEST) {
                const sf_st_info *in = sf_st_info_of(&o->p);
                CHECK(in != NULL);
                CHECK(in->dest_bytes <= o->p.lim.max_body_bytes);
                CHECK(in->body_len == 8 + in->header_len + in->data_len);
                CHECK(in->dest_bytes >= in->images_bytes + in->labels_bytes);
                o->dest_bytes = (size_t)in->dest_bytes;
                o->dest = malloc(o->dest_bytes ? o->dest_bytes : 1);
                CHECK(o->dest != NULL);
                memset(o->dest, 0xEE, o->dest_bytes);
                sf_st_set_dest(&o->p, o->dest, o->dest_bytes);
            } else if (used == 0) {
                CHECK(sf_st_state_of(&o->p) == SF_ST_FAILED);
            }
        }
        off = end;
    }
    o->rc = sf_st_finish(&o->p);
    o->state = sf_st_state_of(&o->p);
    o->err = sf_st_error_of(&o->p);
    CHECK((o->rc == 0) == (o->state == SF_ST_COMPLETE));
    CHECK((o->rc == 0) == (o->err == SF_ST_OK));
    CHECK(sf_st_error_code(&o->p) != NULL && sf_st_error_message(&o->p) != NULL);
    if (o->rc != 0) CHECK(sf_st_error_message(&o->p)[0] != '\0');
}

static void same(const outcome *a, const outcome *b)
{
    CHECK(a->rc == b->rc);
    CHECK(a->err == b->err);
    if (a->rc == 0) {
        CHECK(a->dest_bytes == b->dest_bytes);
        CHECK(memcmp(a->dest, b->dest, a->dest_bytes) == 0);
    }
}

static void done(outcome *o)
{
    free(o->dest);
    sf_st_free(&o->p);
}

/* Rebuilds the header of a body that parsed and checks it parses the same. */
static void round_trip(const outcome *o, const sf_st_limits *lim, const uint8_t *data, size_t size)
{
    const sf_st_info *in = sf_st_info_of(&o->p);
    sf_st_tensor_desc img = {.name = "images", .dtype = SF_ST_U8, .ndim = 4};
    img.shape[0] = in->n;
    img.shape[1] = in->nhwc ? in->h : in->c;
    img.shape[2] = in->nhwc ? in->w : in->h;
    img.shape[3] = in->nhwc ? in->c : in->w;
    sf_st_tensor_desc t[2];
    int nt = 1;
    t[0] = img;
    if (in->has_labels) {
        sf_st_tensor_desc lab = {.name = "labels", .dtype = in->label_dtype, .ndim = in->label_ndim};
        for (int i = 0; i < in->label_ndim; i++) lab.shape[i] = in->label_shape[i];
        if (o->p.labels_begin < o->p.images_begin) { t[0] = lab; t[1] = img; }
        else t[1] = lab;
        nt = 2;
    }
    const char *meta = in->nhwc ? "{\"layout\":\"NHWC\"}" : "{\"layout\":\"NCHW\"}";
    size_t hb = sf_st_header_build(NULL, 0, t, nt, meta);
    CHECK(hb >= 16 && hb % 8 == 0);
    size_t data_off = (size_t)(8 + in->header_len);
    CHECK(data_off + in->data_len == size);
    size_t len = hb + (size_t)in->data_len;
    uint8_t *body = malloc(len);
    CHECK(body != NULL);
    CHECK(sf_st_header_build((char *)body, hb, t, nt, meta) == hb);
    memcpy(body + hb, data + data_off, (size_t)in->data_len);
    sf_st_limits l2 = *lim;
    l2.max_body_bytes = 0; /* the rebuilt header may be longer than the original */
    l2.max_header_bytes = 0;
    outcome r;
    run(&r, &l2, body, len, NULL, 0, 0);
    CHECK(r.rc == 0);
    CHECK(r.dest_bytes == o->dest_bytes);
    CHECK(memcmp(r.dest, o->dest, o->dest_bytes) == 0);
    done(&r);
    free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t h = fnv1a(data, size);
    sf_st_limits lim;
    memset(&lim, 0, sizeof lim);
    lim.max_header_bytes = 4096;
    lim.max_body_bytes = 1 << 20;
    lim.max_n = 256;
    lim.max_h = 256;
    lim.max_w = 256;
    lim.classes = (h & 1) ? 10 : 0;
    lim.labels_required = (h >> 1) & 1;

    size_t cuts[3];
    int nc = 0;
    if (size > 1) {
        uint64_t r = h >> 2;
        for (; nc < 3; nc++) {
            cuts[nc] = 1 + (size_t)(r % (size - 1));
            r = r / (size - 1) + (r >> 29) * 0x9E3779B97F4A7C15ull;
        }
        /* One cut at the end of the header when the length field is readable:
         * the chunk boundary the HTTP layer sees most often. */
        if (size >= 8) {
            uint64_t hl = 0;
            for (int i = 7; i >= 0; i--) hl = (hl << 8) | data[i];
            if (hl < size - 8) cuts[(h >> 40) % 3] = (size_t)(8 + hl);
        }
        qsort(cuts, (size_t)nc, sizeof cuts[0], cmp_size);
    }

    outcome whole, split;
    run(&whole, &lim, data, size, NULL, 0, 0);
    run(&split, &lim, data, size, cuts, nc, 0);
    same(&whole, &split);
    if (size <= 600) {
        outcome bytes;
        run(&bytes, &lim, data, size, NULL, 0, 1);
        same(&whole, &bytes);
        done(&bytes);
    }
    if (whole.rc == 0) round_trip(&whole, &lim, data, size);
    done(&whole);
    done(&split);
    return 0;
}
