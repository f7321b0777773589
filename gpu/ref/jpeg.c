/* gpu/ref/jpeg.c — the reference JPEG decode: libjpeg-turbo's TurboJPEG API.
 *
 * The oracle of the CUDA backend's nvJPEG decode (tests/gpu/test_jpeg_decode.cu)
 * and the reference backend's decode. Default TurboJPEG settings: the
 * accurate integer IDCT and smooth ("fancy") chroma upsampling, as
 * libjpeg-turbo's own tools, PIL and torchvision's CPU decode use them.
 * Grayscale files come out as three equal channels (TJPF_RGB). A file the
 * library reports anything about, a warning about corrupt data included,
 * fails the batch naming the sample: the decode is strict, so a damaged file
 * never trains as a half-grey image.
 */
#include "gpu/backend.h"
#include "gpu/common.h"
#include "ref.h"

#include <stdio.h>
#include <turbojpeg.h>

int sf_ref_jpeg_decode(const sf_batch *b, uint8_t *dst, size_t cap, char *err, size_t errlen)
{
    if (!b->jpeg || !b->jpeg_off) {
        sf_errf(err, errlen, "ref jpeg: the batch is not encoded");
        return -1;
    }
    tjhandle tj = tjInitDecompress();
    if (!tj) {
        sf_errf(err, errlen, "ref jpeg: %s", tjGetErrorStr2(NULL));
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < b->n && rc == 0; i++) {
        const int64_t o0 = b->jpeg_off[i], o1 = b->jpeg_off[i + 1];
        const int h = b->samples[i].src_h, w = b->samples[i].src_w;
        const size_t off = b->samples[i].src_off;
        unsigned char *src = (unsigned char *)(uintptr_t)(b->jpeg + o0);
        int fw = 0, fh = 0, ss = 0, cs = 0;
        if (off + (size_t)h * w * 3 > cap) {
            sf_errf(err, errlen, "ref jpeg: sample %d (%dx%d) does not fit the decode buffer of %zu bytes", i, h,
                    w, cap);
            rc = -1;
        } else if (tjDecompressHeader3(tj, src, (unsigned long)(o1 - o0), &fw, &fh, &ss, &cs) != 0) {
            sf_errf(err, errlen, "ref jpeg: sample %d: %s", i, tjGetErrorStr2(tj));
            rc = SF_BACKEND_BAD_INPUT;
        } else if (fw != w || fh != h) {
            sf_errf(err, errlen, "ref jpeg: sample %d is %dx%d (HxW), not the %dx%d its header was read as", i,
                    fh, fw, h, w);
            rc = SF_BACKEND_BAD_INPUT;
        } else if (tjDecompress2(tj, src, (unsigned long)(o1 - o0), dst + off, w, w * 3, h, TJPF_RGB,
                                 TJFLAG_LIMITSCANS) != 0) {
            sf_errf(err, errlen, "ref jpeg: sample %d: %s", i, tjGetErrorStr2(tj));
            rc = SF_BACKEND_BAD_INPUT;
        }
    }
    tjDestroy(tj);
    return rc;
}
