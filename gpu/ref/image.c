/* gpu/ref/image.c — a batch's encoded files through their decoders: JPEG
 * (jpeg.c, libjpeg-turbo), PNG (png.c, libspng), WebP (webp.c, libwebp),
 * each told apart by its first bytes, then turned by its EXIF orientation
 * where the batch asks (decode.exif_orientation apply).
 *
 * The reference backend decodes every file here; the CUDA backend decodes
 * here, on the host, the files nvJPEG does not take, and uploads them.
 */
#include "gpu/backend.h"
#include "gpu/common.h"
#include "gpu/ref/ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sf_ref_orient(const uint8_t *src, int h, int w, int o, uint8_t *dst)
{
    const int turned = o >= 5 && o <= 8;
    const int oh = turned ? w : h, ow = turned ? h : w;
    for (int y = 0; y < oh; y++) {
        for (int x = 0; x < ow; x++) {
            int sy, sx;
            switch (o) {
            case 2: sy = y; sx = w - 1 - x; break;
            case 3: sy = h - 1 - y; sx = w - 1 - x; break;
            case 4: sy = h - 1 - y; sx = x; break;
            case 5: sy = x; sx = y; break;
            case 6: sy = h - 1 - x; sx = y; break;
            case 7: sy = h - 1 - x; sx = w - 1 - y; break;
            case 8: sy = x; sx = w - 1 - y; break;
            default: sy = y; sx = x; break;
            }
            memcpy(dst + ((size_t)y * ow + x) * 3, src + ((size_t)sy * w + sx) * 3, 3);
        }
    }
}

/* A growing scratch image for the files that are turned after decoding. */
typedef struct scratch {
    uint8_t *p;
    size_t cap;
} scratch;

static uint8_t *scratch_get(scratch *s, size_t need)
{
    if (need > s->cap) {
        uint8_t *q = realloc(s->p, need);
        if (!q)
            return NULL;
        s->p = q;
        s->cap = need;
    }
    return s->p;
}

/* Decodes file src[0, len) of stored size h x w into dst by its format. */
static int decode_file(sf_ref_jpeg_dec *jd, const uint8_t *src, size_t len, int h, int w, uint8_t *dst, char *why,
                       size_t whylen)
{
    if (len >= 8 && src[0] == 0x89 && src[1] == 'P')
        return sf_ref_png_decode_one(src, len, h, w, dst, why, whylen);
    if (len >= 12 && memcmp(src, "RIFF", 4) == 0)
        return sf_ref_webp_decode_one(src, len, h, w, dst, why, whylen);
    return sf_ref_jpeg_dec_one(jd, src, len, h, w, dst, why, whylen);
}

int sf_ref_image_decode_some(const sf_batch *b, const uint8_t *which, uint8_t *dst, size_t cap, uint8_t *bad,
                             char *err, size_t errlen)
{
    if (!b->jpeg || !b->jpeg_off) {
        sf_errf(err, errlen, "ref decode: the batch is not encoded");
        return -1;
    }
    /* The batch's JPEG work budget: SF_REF_JPEG_PASSES_PER_PIXEL scans over
     * every pixel it decodes, so that a batch of legitimate progressive
     * files (about ten scans each) fits and files of many scans cannot
     * together hold the engine for longer than that. */
    int64_t work_left = (int64_t)(b->decoded_bytes / 3) * SF_REF_JPEG_PASSES_PER_PIXEL;
    if (b->decoded_bytes == 0)
        for (int i = 0; i < b->n; i++)
            work_left += (int64_t)b->samples[i].src_h * b->samples[i].src_w * SF_REF_JPEG_PASSES_PER_PIXEL;
    sf_ref_jpeg_dec *jd = sf_ref_jpeg_dec_new(&work_left);
    if (!jd) {
        sf_errf(err, errlen, "ref decode: out of memory for the JPEG decoder");
        return -1;
    }
    scratch turn = {NULL, 0};
    int refused = 0;
    int rc = 0;
    for (int i = 0; i < b->n && rc == 0; i++) {
        if (which && !which[i])
            continue;
        const int64_t o0 = b->jpeg_off[i], o1 = b->jpeg_off[i + 1];
        int64_t n = o1 - o0;
        const sf_jpeg_file *f = b->jpeg_files ? &b->jpeg_files[i] : NULL;
        if (f && f->len > 0 && f->len < n)
            n = f->len;
        const int o = f && f->orientation >= 2 && f->orientation <= 8 ? f->orientation : 1;
        const int h = b->samples[i].src_h, w = b->samples[i].src_w;
        /* The file's stored size: the sample's, untransposed. */
        const int fh = o >= 5 ? w : h, fw = o >= 5 ? h : w;
        const size_t off = b->samples[i].src_off;
        char why[256];
        if (off + (size_t)h * w * 3 > cap) {
            sf_errf(err, errlen, "ref decode: sample %d (%dx%d) does not fit the decode buffer of %zu bytes", i, h, w,
                    cap);
            rc = -1;
            break;
        }
        uint8_t *into = dst + off;
        if (o != 1 && !(into = scratch_get(&turn, (size_t)h * w * 3))) {
            sf_errf(err, errlen, "ref decode: out of memory turning sample %d (%dx%d)", i, h, w);
            rc = -1;
            break;
        }
        if (decode_file(jd, b->jpeg + o0, (size_t)n, fh, fw, into, why, sizeof why) != 0) {
            if (refused == 0)
                sf_errf(err, errlen, "ref decode: sample %d: %s", i, why);
            refused++;
            if (bad)
                bad[i] = 1;
            else
                rc = SF_BACKEND_BAD_INPUT;
            continue;
        }
        if (o != 1)
            sf_ref_orient(into, fh, fw, o, dst + off);
    }
    sf_ref_jpeg_dec_free(jd);
    free(turn.p);
    if (rc == -1)
        return -1;
    return refused;
}

int sf_ref_image_decode(const sf_batch *b, uint8_t *dst, size_t cap, char *err, size_t errlen)
{
    const int rc = sf_ref_image_decode_some(b, NULL, dst, cap, NULL, err, errlen);
    return rc > 0 ? SF_BACKEND_BAD_INPUT : rc;
}
