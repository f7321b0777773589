/* gpu/ref/webp.c — the WebP decode: libwebp, the format's own library.
 *
 * WebPDecodeRGBInto, as torchvision's decode_webp (mode RGB) and Pillow
 * call it: lossy files with libwebp's default (fancy) chroma upsampling,
 * alpha dropped. It writes into the caller's buffer, so the decode
 * allocates no image of its own.
 */
#include "gpu/ref/ref.h"

#include <stdio.h>

#include <webp/decode.h>

int sf_ref_webp_decode_one(const uint8_t *src, size_t len, int h, int w, uint8_t *dst, char *why, size_t whylen)
{
    int fw = 0, fh = 0;
    if (!WebPGetInfo(src, len, &fw, &fh)) {
        snprintf(why, whylen, "libwebp cannot read the file's header");
        return -1;
    }
    if (fw != w || fh != h) {
        snprintf(why, whylen, "the file is %dx%d (HxW), not the %dx%d its header was read as", fh, fw, h, w);
        return -1;
    }
    if (!WebPDecodeRGBInto(src, len, dst, (size_t)h * w * 3, w * 3)) {
        snprintf(why, whylen, "libwebp refused the file's data");
        return -1;
    }
    return 0;
}
