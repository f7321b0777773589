/* gpu/ref/jpeg.c — the reference JPEG decode: libjpeg-turbo's libjpeg API.
 * One file at a time; gpu/ref/image.c runs a batch's files through it and
 * the PNG and WebP decoders.
 *
 * The oracle of the CUDA backend's nvJPEG decode (tests/gpu/test_jpeg_decode.cu),
 * the reference backend's decode, and the CUDA backend's host decode of the
 * files nvJPEG does not take (CMYK, YCCK, arithmetic-coded). The settings are
 * libjpeg's defaults, as TurboJPEG, libjpeg-turbo's own tools, PIL and
 * torchvision's CPU decode use them: the accurate integer IDCT and smooth
 * ("fancy") chroma upsampling. Grayscale files come out as three equal
 * channels; CMYK and YCCK files (libjpeg converts YCCK to CMYK) as RGB by
 * torchvision.io.decode_jpeg(mode=ImageReadMode.RGB)'s conversion, which is
 * Pillow's: each channel is k - k * (255 - c) / 255, rounded, on the values
 * as stored (Adobe writers store CMYK inverted, which is what makes this the
 * product c * k / 255).
 *
 * Strict and bounded. The libjpeg API rather than TurboJPEG's, for what it
 * lets a caller stop: the first warning (corrupt data, a bogus progression,
 * a premature end) ends the file's decode at once, where libjpeg would go on
 * over the rest of a damaged image, so that a damaged file never trains as a
 * half-grey image and costs no more than the scans before its damage; and a
 * progress hook ends a file past SF_REF_JPEG_MAX_SCANS scans (TurboJPEG's
 * TJFLAG_LIMITSCANS bound; the server's header check applies a tighter one
 * for large images) or a batch past its work budget
 * (SF_REF_JPEG_PASSES_PER_PIXEL scans over each of its pixels).
 */
#include "gpu/ref/ref.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

/* The error manager: an error or a warning jumps out of the decode with its
 * message; trace messages (level > 0) are ignored. */
typedef struct ref_jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} ref_jerr;

/* The progress hook's state: the scan bound and the batch's work left. */
typedef struct ref_jprog {
    struct jpeg_progress_mgr pub;
    ref_jerr *err;
    int64_t *work_left;     /* pixel passes the batch may still spend; NULL: unbounded */
    int64_t pass_pixels;    /* the image's pixels: one scan's worth of work */
    int scans_seen;
} ref_jprog;

static void on_error(j_common_ptr ci)
{
    ref_jerr *e = (ref_jerr *)(void *)ci->err;
    (*ci->err->format_message)(ci, e->msg);
    longjmp(e->jb, 1);
}

static void on_message(j_common_ptr ci, int level)
{
    if (level >= 0)
        return;
    ref_jerr *e = (ref_jerr *)(void *)ci->err;
    (*ci->err->format_message)(ci, e->msg);
    longjmp(e->jb, 1);
}

/* Called by libjpeg between rows and scans. A new input scan is a pass over
 * the whole image (for a progressive file), so the batch's budget is
 * charged per scan, and the first scan of every file is charged too. */
static void on_progress(j_common_ptr ci)
{
    ref_jprog *p = (ref_jprog *)(void *)ci->progress;
    const j_decompress_ptr d = (j_decompress_ptr)ci;
    if (!ci->is_decompressor || d->input_scan_number <= p->scans_seen)
        return;
    p->scans_seen = d->input_scan_number;
    if (p->scans_seen > SF_REF_JPEG_MAX_SCANS) {
        snprintf(p->err->msg, sizeof p->err->msg, "more than %d scans", SF_REF_JPEG_MAX_SCANS);
        longjmp(p->err->jb, 1);
    }
    if (p->work_left) {
        if (*p->work_left < p->pass_pixels) {
            snprintf(p->err->msg, sizeof p->err->msg,
                     "the batch's decode budget (%d scans over each of its pixels) is spent before this file's "
                     "scan %d", SF_REF_JPEG_PASSES_PER_PIXEL, p->scans_seen);
            longjmp(p->err->jb, 1);
        }
        *p->work_left -= p->pass_pixels;
    }
}

/* torchvision's and Pillow's CMYK to RGB, per channel. */
static inline uint8_t cmyk_channel(int k, int cmy)
{
    int v = k * (255 - cmy) + 128;
    v = ((v >> 8) + v) >> 8;
    const int out = k - v;
    return (uint8_t)(out < 0 ? 0 : out > 255 ? 255 : out);
}

/* Decodes one file into dst (h x w x 3). 0, or -1 with why filled. row4 is a
 * scratch row of at least 4 * w bytes for CMYK files (NULL when none). */
static int decode_one(struct jpeg_decompress_struct *ci, ref_jerr *je, ref_jprog *jp, const uint8_t *src,
                      size_t len, int h, int w, uint8_t *dst, uint8_t **row4, size_t *row4_cap, char *why,
                      size_t whylen)
{
    if (setjmp(je->jb)) {
        snprintf(why, whylen, "%s", je->msg);
        jpeg_abort_decompress(ci);
        return -1;
    }
    jp->scans_seen = 0;
    jp->pass_pixels = (int64_t)h * w;
    jpeg_mem_src(ci, src, (unsigned long)len);
    if (jpeg_read_header(ci, TRUE) != JPEG_HEADER_OK) {
        snprintf(why, whylen, "the file holds tables only, no image");
        jpeg_abort_decompress(ci);
        return -1;
    }
    if ((int)ci->image_width != w || (int)ci->image_height != h) {
        snprintf(why, whylen, "the file is %ux%u (HxW), not the %dx%d its header was read as", ci->image_height,
                 ci->image_width, h, w);
        jpeg_abort_decompress(ci);
        return -1;
    }
    const int cmyk = ci->jpeg_color_space == JCS_CMYK || ci->jpeg_color_space == JCS_YCCK;
    ci->out_color_space = cmyk ? JCS_CMYK : JCS_EXT_RGB;
    ci->dct_method = JDCT_ISLOW;
    ci->do_fancy_upsampling = TRUE;
    if (cmyk && *row4_cap < (size_t)w * 4) {
        /* Only CMYK files need a row of their own; it grows to the widest one
         * and lives for the batch. */
        uint8_t *r = realloc(*row4, (size_t)w * 4);
        if (!r) {
            snprintf(why, whylen, "out of memory for a CMYK row of %d pixels", w);
            jpeg_abort_decompress(ci);
            return -1;
        }
        *row4 = r;
        *row4_cap = (size_t)w * 4;
    }
    jpeg_start_decompress(ci);
    while (ci->output_scanline < ci->output_height) {
        uint8_t *out = dst + (size_t)ci->output_scanline * w * 3;
        if (!cmyk) {
            /* Straight into the output, as many rows as the upsampler makes
             * at once (TurboJPEG's way: no copy through a row of its own). */
            JSAMPROW rows[16];
            unsigned k = ci->output_height - ci->output_scanline;
            k = k < 16 ? k : 16;
            for (unsigned r = 0; r < k; r++)
                rows[r] = out + (size_t)r * w * 3;
            jpeg_read_scanlines(ci, rows, k);
            continue;
        }
        JSAMPROW row = *row4;
        jpeg_read_scanlines(ci, &row, 1);
        for (int x = 0; x < w; x++) {
            const uint8_t *q = *row4 + 4 * x;
            out[3 * x + 0] = cmyk_channel(q[3], q[0]);
            out[3 * x + 1] = cmyk_channel(q[3], q[1]);
            out[3 * x + 2] = cmyk_channel(q[3], q[2]);
        }
    }
    jpeg_finish_decompress(ci);
    return 0;
}

struct sf_ref_jpeg_dec {
    struct jpeg_decompress_struct ci;
    ref_jerr je;
    ref_jprog jp;
    uint8_t *row4;          /* a CMYK file's scratch row; grows to the widest one */
    size_t row4_cap;
};

sf_ref_jpeg_dec *sf_ref_jpeg_dec_new(int64_t *work_left)
{
    sf_ref_jpeg_dec *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->ci.err = jpeg_std_error(&d->je.pub);
    d->je.pub.error_exit = on_error;
    d->je.pub.emit_message = on_message;
    jpeg_create_decompress(&d->ci);
    d->jp.pub.progress_monitor = on_progress;
    d->jp.err = &d->je;
    d->jp.work_left = work_left;
    d->ci.progress = &d->jp.pub;
    return d;
}

int sf_ref_jpeg_dec_one(sf_ref_jpeg_dec *d, const uint8_t *src, size_t len, int h, int w, uint8_t *dst, char *why,
                        size_t whylen)
{
    d->je.msg[0] = '\0';
    return decode_one(&d->ci, &d->je, &d->jp, src, len, h, w, dst, &d->row4, &d->row4_cap, why, whylen);
}

void sf_ref_jpeg_dec_free(sf_ref_jpeg_dec *d)
{
    if (!d)
        return;
    jpeg_destroy_decompress(&d->ci);
    free(d->row4);
    free(d);
}
