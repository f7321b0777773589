/* client/body_pool.c — the bodies streamfeed-load sends, made before the
 * clock starts: the synthetic workloads (uint8 images with random or
 * learnable labels, generated on every CPU) and the *.safetensors files of a
 * --dir, sent as they are. The pools of JPEG files are in jpeg_pool.c.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "client/jpeg_pool.h"
#include "client/loader.h"
#include "server/safetensors.h"

static void rng_fill(uint8_t *p, size_t n, uint64_t *s)
{
    while (n >= 8) {
        uint64_t v = rng_next(s);
        memcpy(p, &v, 8);
        p += 8;
        n -= 8;
    }
    if (n > 0) {
        uint64_t v = rng_next(s);
        memcpy(p, &v, n);
    }
}

void put_label(uint8_t *dst, size_t i, sf_st_dtype dt, int64_t v)
{
    switch (dt) {
    case SF_ST_U8:
        dst[i] = (uint8_t)v;
        break;
    case SF_ST_I32:
        for (int k = 0; k < 4; k++)
            dst[i * 4 + (size_t)k] = (uint8_t)((uint64_t)v >> (8 * k));
        break;
    default: /* I64 */
        for (int k = 0; k < 8; k++)
            dst[i * 8 + (size_t)k] = (uint8_t)((uint64_t)v >> (8 * k));
        break;
    }
}

/* ---- the body pool ------------------------------------------------------- */

/* The layout of one generated body: header, images [N,H,W,3] U8, labels. */
typedef struct body_plan {
    const options *o;
    const char *header; /* the safetensors header, the same for every body */
    size_t header_len;
    size_t images_bytes;
    size_t labels_bytes;
    size_t len;
    uint8_t hue[MAX_CLASSES][3]; /* learnable: the colour of each class */
} body_plan;

void class_hues(uint8_t hue[MAX_CLASSES][3], int classes)
{
    /* Classes sit evenly on the hue circle. A hue survives crops, rotations,
     * flips, blur and per-sample standardisation, so the learnable task stays
     * learnable whatever augmentation the server applies. */
    for (int k = 0; k < classes && k < MAX_CLASSES; k++) {
        double th = 2.0 * M_PI * k / classes;
        for (int c = 0; c < 3; c++)
            hue[k][c] = (uint8_t)lround(128.0 + 80.0 * cos(th - 2.0 * M_PI * c / 3.0));
    }
}

/* Fills n pixels (3 bytes each) with the colour rgb plus noise in [-40, 40]
 * per channel. One 64-bit draw gives the noise of two pixels (7 bits a
 * channel), which keeps this loop cheap enough for gigabyte pools. */
static void fill_hue_noise(uint8_t *dst, size_t n, const uint8_t rgb[3], uint64_t *s)
{
    for (size_t i = 0; i < n; i += 2) {
        uint64_t r = rng_next(s);
        for (size_t k = i; k < i + 2 && k < n; k++, r >>= 21) {
            for (int c = 0; c < 3; c++) {
                int v = (int)rgb[c] + (int)(((r >> (7 * c)) & 127) * 81 >> 7) - 40;
                dst[k * 3 + (size_t)c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        }
    }
}

/* Nearest-neighbour upscale of one 3-channel image. A destination row that
 * maps to the same source row as the previous one is a copy of it. */
static void upscale_nearest(uint8_t *dst, int h, int w, const uint8_t *src, int sh, int sw)
{
    const size_t drow_bytes = (size_t)w * 3;
    int prev_sy = -1;
    for (int y = 0; y < h; y++) {
        int sy = (int)((int64_t)y * sh / h);
        uint8_t *drow = dst + (size_t)y * drow_bytes;
        if (sy == prev_sy) {
            memcpy(drow, drow - drow_bytes, drow_bytes);
            continue;
        }
        const uint8_t *srow = src + (size_t)sy * (size_t)sw * 3;
        for (int x = 0; x < w; x++) {
            const uint8_t *sp = srow + (size_t)((int64_t)x * sw / w) * 3;
            drow[(size_t)x * 3] = sp[0];
            drow[(size_t)x * 3 + 1] = sp[1];
            drow[(size_t)x * 3 + 2] = sp[2];
        }
        prev_sy = sy;
    }
}

/* Generates body number idx into b (already allocated, plan->len bytes). */
static void generate_body(const body_plan *p, uint64_t idx, uint8_t *out)
{
    const options *o = p->o;
    const workload *wl = o->wl;
    const int n = o->batch, h = wl->h, w = wl->w, sh = wl->src_h, sw = wl->src_w;
    const size_t img = (size_t)h * (size_t)w * 3, src_img = (size_t)sh * (size_t)sw * 3;
    uint8_t *images = out + p->header_len;
    uint8_t *labels = images + p->images_bytes;
    /* The low-resolution content of one sample (w3: 32x32x3), when the
     * workload upscales it; MAX_SRC_PIXELS bounds it. */
    uint8_t src_buf[MAX_SRC_PIXELS * 3];
    uint8_t *src = (sh != h || sw != w) ? src_buf : NULL;

    memcpy(out, p->header, p->header_len);

    for (int i = 0; i < n; i++) {
        /* Each sample has its own stream, so a body does not depend on how
         * generation is split over threads. */
        uint64_t s = o->seed * 0x100000001b3ULL ^ (idx << 24) ^ (uint64_t)i;
        rng_next(&s);
        uint8_t *dst = images + (size_t)i * img;
        if (wl->segmentation) {
            size_t px0 = (size_t)i * (size_t)h * (size_t)w;
            if (!o->learnable) {
                rng_fill(dst, img, &s);
                for (size_t k = 0; k < (size_t)h * (size_t)w; k++)
                    put_label(labels, px0 + k, o->label_dtype,
                              (int64_t)(rng_next(&s) % (uint64_t)wl->classes));
                continue;
            }
            /* Blocks of SEG_BLOCK x SEG_BLOCK pixels, each of one class's hue:
             * every pixel's label is a function of its (noisy) colour. */
            for (int by = 0; by < h; by += SEG_BLOCK) {
                for (int bx = 0; bx < w; bx += SEG_BLOCK) {
                    int cls = (int)(rng_next(&s) % (uint64_t)wl->classes);
                    for (int y = by; y < by + SEG_BLOCK && y < h; y++) {
                        int x1 = bx + SEG_BLOCK < w ? bx + SEG_BLOCK : w;
                        fill_hue_noise(dst + ((size_t)y * (size_t)w + (size_t)bx) * 3,
                                       (size_t)(x1 - bx), p->hue[cls], &s);
                        for (int x = bx; x < x1; x++)
                            put_label(labels, px0 + (size_t)y * (size_t)w + (size_t)x,
                                      o->label_dtype, cls);
                    }
                }
            }
            continue;
        }
        int cls = (int)(rng_next(&s) % (uint64_t)wl->classes);
        put_label(labels, (size_t)i, o->label_dtype, cls);
        uint8_t *content = src ? src : dst;
        if (o->learnable)
            fill_hue_noise(content, (size_t)sh * (size_t)sw, p->hue[cls], &s);
        else
            rng_fill(content, src_img, &s);
        if (src)
            upscale_nearest(dst, h, w, src, sh, sw);
    }
}

typedef struct gen_job {
    const body_plan *plan;
    pool *pool;
    atomic_int next;
} gen_job;

volatile sig_atomic_t g_sigint;

static void *gen_thread(void *arg)
{
    gen_job *j = arg;
    for (;;) {
        int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->pool->n || g_sigint)
            break;
        generate_body(j->plan, (uint64_t)i, j->pool->b[i].data);
    }
    return NULL;
}

void pool_free(pool *p)
{
    for (int i = 0; i < p->n; i++) {
        free(p->b[i].data);
        for (int k = 0; k < p->b[i].npaths; k++)
            free(p->b[i].paths[k]);
        free(p->b[i].paths);
    }
    free(p->b);
    p->b = NULL;
    p->n = 0;
}

/* Generates the synthetic pool: min(--pool, what fits in --pool-mb) bodies.
 * Returns 0, 1 on a runtime failure, 2 on a usage error. */
int pool_generate(const options *o, pool *out)
{
    const workload *wl = o->wl;
    body_plan p = {.o = o};
    if (wl->classes > MAX_CLASSES ||
        ((wl->src_h != wl->h || wl->src_w != wl->w) && wl->src_h * wl->src_w > MAX_SRC_PIXELS)) {
        fprintf(stderr, "streamfeed-load: workload %s exceeds the generator's bounds\n", wl->name);
        return 1;
    }
    const int64_t n = o->batch;
    sf_st_tensor_desc t[2] = {
        {.name = "images", .dtype = SF_ST_U8, .ndim = 4, .shape = {n, wl->h, wl->w, 3}},
        {.name = "labels", .dtype = o->label_dtype, .ndim = 1, .shape = {n}},
    };
    if (wl->segmentation) {
        t[1].ndim = 3;
        t[1].shape[1] = wl->h;
        t[1].shape[2] = wl->w;
    }
    const char *meta = "{\"layout\":\"NHWC\"}";
    size_t hl = sf_st_header_build(NULL, 0, t, 2, meta);
    char *hdr = hl ? malloc(hl) : NULL;
    if (!hdr || sf_st_header_build(hdr, hl, t, 2, meta) != hl) {
        fprintf(stderr, "streamfeed-load: could not build the safetensors header\n");
        free(hdr);
        return 1;
    }
    p.header = hdr;
    p.header_len = hl;
    p.images_bytes = (size_t)n * (size_t)wl->h * (size_t)wl->w * 3;
    size_t label_elems = (size_t)n * (wl->segmentation ? (size_t)wl->h * (size_t)wl->w : 1);
    p.labels_bytes = label_elems * (size_t)sf_st_dtype_size(o->label_dtype);
    p.len = hl + p.images_bytes + p.labels_bytes;
    class_hues(p.hue, wl->classes);

    uint64_t cap = o->pool_mb * 1024 * 1024;
    if (p.len > cap) {
        fprintf(stderr,
                "streamfeed-load: one body is %.1f MiB, more than --pool-mb %" PRIu64
                "; raise --pool-mb or lower --batch\n",
                (double)p.len / 1048576.0, o->pool_mb);
        free(hdr);
        return 2;
    }
    int k = o->pool;
    if ((uint64_t)k * p.len > cap)
        k = (int)(cap / p.len);
    out->b = calloc((size_t)k, sizeof *out->b);
    out->labels = sf_st_dtype_name(o->label_dtype);
    if (!out->b) {
        free(hdr);
        return 1;
    }
    for (int i = 0; i < k; i++) {
        out->b[i].data = malloc(p.len);
        if (!out->b[i].data) {
            fprintf(stderr, "streamfeed-load: out of memory allocating body %d of %d (%zu bytes)\n",
                    i + 1, k, p.len);
            out->n = i;
            pool_free(out);
            free(hdr);
            return 1;
        }
        out->b[i].len = p.len;
        out->n = i + 1;
    }
    out->bytes = (size_t)k * p.len;

    gen_job j = {.plan = &p, .pool = out};
    int nt = online_cpus();
    if (nt > k)
        nt = k;
    if (nt > MAX_THREADS)
        nt = MAX_THREADS;
    pthread_t tids[MAX_THREADS];
    int started = 0;
    for (int i = 1; i < nt; i++) {
        if (pthread_create(&tids[i], NULL, gen_thread, &j) != 0)
            break;
        started = i;
    }
    gen_thread(&j);
    for (int i = 1; i <= started; i++)
        pthread_join(tids[i], NULL);
    free(hdr);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Loads the *.safetensors files of o->dir, sorted by name, until --pool-mb is
 * reached. The files are sent as they are (a directory of deliberately broken
 * files is a test of the server's error replies). Returns 0, 1 or 2. */
int pool_load_dir(const options *o, pool *out)
{
    DIR *d = opendir(o->dir);
    if (!d) {
        fprintf(stderr, "streamfeed-load: --dir %s: %s\n", o->dir, strerror(errno));
        return 2;
    }
    char **names = NULL;
    int nn = 0, cap = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) && nn < MAX_DIR_FILES) {
        size_t l = strlen(e->d_name);
        if (l <= 12 || strcmp(e->d_name + l - 12, ".safetensors") != 0)
            continue;
        if (nn == cap) {
            cap = cap ? cap * 2 : 64;
            char **nv = realloc(names, (size_t)cap * sizeof *names);
            if (!nv) {
                rc = 1;
                break;
            }
            names = nv;
        }
        if (!(names[nn] = strdup(e->d_name))) {
            rc = 1;
            break;
        }
        nn++;
    }
    closedir(d);
    if (rc == 0 && nn == 0) {
        free(names);
        return pool_load_jpeg_dir(o, o->dir, out);
    }
    if (rc == 0) {
        qsort(names, (size_t)nn, sizeof *names, cmp_str);
        out->b = calloc((size_t)nn, sizeof *out->b);
        if (!out->b)
            rc = 1;
    }
    uint64_t capb = o->pool_mb * 1024 * 1024;
    for (int i = 0; rc == 0 && i < nn; i++) {
        char path[PATH_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", o->dir, names[i]);
        FILE *f = fopen(path, "rb");
        if (!f || fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
            fprintf(stderr, "streamfeed-load: %s: %s\n", path, f ? "not a regular file" : strerror(errno));
            if (f)
                fclose(f);
            rc = 2;
            break;
        }
        size_t len = (size_t)st.st_size;
        if ((uint64_t)out->bytes + len > capb) {
            fclose(f);
            if (out->n == 0) {
                fprintf(stderr, "streamfeed-load: %s is larger than --pool-mb %" PRIu64 "\n", path,
                        o->pool_mb);
                rc = 2;
            } else if (!o->quiet) {
                fprintf(stderr, "streamfeed-load: using the first %d of %d files (--pool-mb %" PRIu64 ")\n",
                        out->n, nn, o->pool_mb);
            }
            break;
        }
        uint8_t *buf = malloc(len ? len : 1);
        if (!buf || fread(buf, 1, len, f) != len) {
            fprintf(stderr, "streamfeed-load: %s: could not read %zu bytes\n", path, len);
            free(buf);
            fclose(f);
            rc = 1;
            break;
        }
        fclose(f);
        out->b[out->n].data = buf;
        out->b[out->n].len = len;
        out->n++;
        out->bytes += len;
    }
    for (int i = 0; i < nn; i++)
        free(names[i]);
    free(names);
    if (rc != 0)
        pool_free(out);
    return rc;
}
