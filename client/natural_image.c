/* client/natural_image.c — see natural_image.h. The same seed gives the same
 * image on every machine: only the loader's splitmix64 and libm. */
#include "client/natural_image.h"

#include <math.h>
#include <stdlib.h>

#include "client/loader.h"

void natural_image(uint8_t *px, int h, int w, uint64_t s, const uint8_t *hue)
{
    double c0[3], c1[3];
    for (int c = 0; c < 3; c++) {
        c0[c] = (double)(rng_next(&s) % 256);
        c1[c] = (double)(rng_next(&s) % 256);
    }
    double th = (double)(rng_next(&s) % 6283) / 1000.0, dx = cos(th), dy = sin(th);
    double fx = (double)(1 + rng_next(&s) % 4) / w, fy = (double)(1 + rng_next(&s) % 4) / h;
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            double t = ((x - w / 2.0) * dx + (y - h / 2.0) * dy) / (0.75 * (w + h)) + 0.5;
            double rip = 18.0 * sin(2 * M_PI * (fx * x + fy * y));
            for (int c = 0; c < 3; c++)
                px[((size_t)y * w + x) * 3 + c] = (uint8_t)fmin(255, fmax(0, c0[c] + (c1[c] - c0[c]) * t + rip));
        }
    }
    int shapes = 3 + (int)(rng_next(&s) % 4);
    for (int k = 0; k < shapes; k++) {
        double cx = (double)(rng_next(&s) % (uint64_t)w), cy = (double)(rng_next(&s) % (uint64_t)h);
        double r = (double)(w / 16 + (int)(rng_next(&s) % (uint64_t)(w / 4)));
        int disc = (int)(rng_next(&s) & 1);
        double col[3];
        for (int c = 0; c < 3; c++)
            col[c] = (double)(rng_next(&s) % 256);
        for (int y = 0; y < h; y++) {
            for (int x = 0; x < w; x++) {
                /* Signed distance to the edge (negative inside), for a 2-pixel soft edge. */
                double d = disc ? hypot(x - cx, y - cy) - r : fmax(fabs(x - cx), fabs(y - cy) * 1.5) - r;
                double a = d <= -1 ? 1 : d >= 1 ? 0 : (1 - d) / 2;
                if (a <= 0)
                    continue;
                uint8_t *p = px + ((size_t)y * w + x) * 3;
                for (int c = 0; c < 3; c++)
                    p[c] = (uint8_t)(p[c] * (1 - a) + col[c] * a + 0.5);
            }
        }
    }
    /* Texture: value noise of four octaves (cells of 32 down to 4 pixels,
     * bilinear between random lattice values), the fine detail photographs
     * have and JPEG spends most of its bytes on. */
    int8_t *lat = malloc((size_t)(w / 4 + 2) * (size_t)(h / 4 + 2));
    for (int cell = 32, amp = 14; lat && cell >= 4; cell /= 2, amp = amp * 3 / 4) {
        const int gw = w / cell + 2, gh = h / cell + 2;
        for (int k = 0; k < gw * gh; k++)
            lat[k] = (int8_t)((int)(rng_next(&s) % 255) - 127);
        for (int y = 0; y < h; y++) {
            const int gy = y / cell;
            const double fy = (double)(y % cell) / cell;
            for (int x = 0; x < w; x++) {
                const int gx = x / cell;
                const double fx = (double)(x % cell) / cell;
                const double v = (lat[gy * gw + gx] * (1 - fx) + lat[gy * gw + gx + 1] * fx) * (1 - fy) +
                                 (lat[(gy + 1) * gw + gx] * (1 - fx) + lat[(gy + 1) * gw + gx + 1] * fx) * fy;
                const int d = (int)lround(v * amp / 127.0);
                uint8_t *p = px + ((size_t)y * w + x) * 3;
                for (int c = 0; c < 3; c++) {
                    const int q = p[c] + d;
                    p[c] = (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
                }
            }
        }
    }
    free(lat);
    for (size_t i = 0; i < (size_t)h * (size_t)w * 3; i += 8) {
        uint64_t r = rng_next(&s);
        for (size_t k = i; k < i + 8 && k < (size_t)h * (size_t)w * 3; k++, r >>= 8) {
            int v = px[k] + (int)((r & 15) + ((r >> 4) & 15)) / 2 - 7; /* triangular, about +-7 */
            if (hue)
                v = (v + hue[k % 3]) / 2;
            px[k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
}
