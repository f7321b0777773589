/* client/streamfeed-load.c — the reference remote data loader and load generator.
 *
 * What it does. It POSTs batches of uint8 images and integer labels, encoded as
 * safetensors bodies (DESIGN.md §4), to POST {url}/v1/batches of a streamfeed
 * server, over N concurrent keep-alive HTTP connections, and reports what the
 * server accepted, how fast, and the training loss when the server tells it.
 * The bodies are either synthetic (the workloads of WORKLOADS.md, optionally
 * with labels that a small model can learn), the *.safetensors files of a
 * directory, or JPEG files sent undecoded in the encoded body form
 * (jpeg + jpeg_offsets + labels): the class folders of a directory
 * (ImageFolder layout), or w1-jpeg's natural-looking 256x256 files, which are
 * generated once into a cache folder.
 *
 * How it is built. Bodies are made once, before the clock starts, into a pool
 * of at most --pool bodies and at most --pool-mb MiB, and then cycled through,
 * so that generation never limits the request rate; libcurl sends each body
 * straight from the pool (CURLOPT_POSTFIELDS, no copy of ours). The connections
 * are spread over --threads worker threads, each of which drives its share with
 * its own libcurl multi handle. An easy handle is one connection: it is reused
 * for every request it makes, so the TCP connection stays open (keep-alive).
 * The main thread only prints progress and, without --wait, asks the server
 * now and then for the loss of a recent batch. The pools of JPEG files live in
 * jpeg_pool.c, the images of the generated ones in natural_image.c, and what
 * the three files share in loader.h.
 *
 * Flow control. Batches are numbered by a shared ticket counter; a connection
 * takes the next ticket when it is idle. With --rate R, ticket k may not start
 * before start + k/R. A 503 or 429 reply puts the same body back on the same
 * connection, to be sent again after the server's Retry-After (capped at
 * --max-backoff-ms; exponential back-off when the header is missing), at most
 * --retries times; the other connections carry on meanwhile. Any other error
 * reply is counted by its error code, printed once per code, and the run goes
 * on with the next batch.
 *
 * Bounds. Connections <= 256, threads <= 64, pool <= 1024 bodies and
 * <= --pool-mb MiB (default 2048), one reply buffer of 64 KiB per connection,
 * at most 64 distinct error codes tracked (the rest count as "other"), retries
 * <= 1000 per batch, each back-off <= --max-backoff-ms.
 *
 * --diagnose sends no batch: it asks the server where its pipeline loses time
 * (POST /v1/diagnose, the caching method) and prints the four stages and the
 * verdict on one screen (or the server's JSON with --json); exit status 0 on
 * a verdict, 1 on an error reply.
 *
 * Exit status: 0 when every batch that was sent was accepted, 1 otherwise
 * (or on a runtime failure), 2 on a usage error. The first SIGINT stops
 * sending new batches and retries and lets the requests in flight finish; a
 * second one aborts those too. The summary is printed either way.
 */
#include <curl/curl.h>
#include <cjson/cJSON.h>

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/jpeg_pool.h"
#include "client/loader.h"
#include "server/safetensors.h"

/* ---- workloads (WORKLOADS.md) -------------------------------------------- */

static const workload WORKLOADS[] = {
    {"w1", 256, 256, 256, 256, 10, 0, "256x256x3, 10 classes, labels [N]", 0},
    {"w2", 256, 256, 256, 256, 10, 1, "256x256x3, per-pixel labels [N,256,256], 10 classes", 0},
    {"w3", 224, 224, 32, 32, 10, 0, "224x224x3 upscaled (nearest) from 32x32 content, 10 classes", 0},
    {"tiny", 32, 32, 32, 32, 10, 0, "32x32x3, 10 classes, labels [N]", 0},
    {"w1-jpeg", 256, 256, 256, 256, 10, 0,
     "W1 as JPEG files: 256x256 natural-looking images, quality 90, generated once into the cache "
     "(--cache-dir) and sent encoded",
     1},
    {"imagenet-jpeg", 375, 500, 375, 500, 10, 0,
     "ImageNet-like JPEG files: 500x375 (WxH) natural-looking images, quality 90, generated once into the "
     "cache and sent encoded (for random_resized_crop to the model's input)",
     1},
};
#define N_WORKLOADS ((int)(sizeof WORKLOADS / sizeof WORKLOADS[0]))

/* ---- options: one table drives getopt_long and --help -------------------- */

enum {
    OPT_URL = 'u', OPT_WORKLOAD = 'w', OPT_BATCH = 'b', OPT_BATCHES = 'n', OPT_SECONDS = 's',
    OPT_CONNECTIONS = 'c', OPT_JSON = 'j', OPT_QUIET = 'q', OPT_HELP = 'h',
    OPT_THREADS = 256, OPT_LEARNABLE, OPT_SEED, OPT_DIR, OPT_RATE, OPT_POOL, OPT_POOL_MB,
    OPT_LABEL_DTYPE, OPT_WAIT, OPT_DRAIN, OPT_TOKEN, OPT_TIMEOUT_MS, OPT_RETRIES,
    OPT_MAX_BACKOFF_MS, OPT_DIAGNOSE, OPT_CACHE_DIR, OPT_PREPARE, OPT_CACERT,
};

typedef struct opt_spec {
    const char *name;
    int has_arg;
    int key;
    const char *metavar;
    const char *help;
} opt_spec;

static const opt_spec OPTS[] = {
    {"url", 1, OPT_URL, "URL", "server base URL (default http://127.0.0.1:8080)"},
    {"workload", 1, OPT_WORKLOAD, "W",
     "w1 | w2 | w3 | tiny | w1-jpeg | imagenet-jpeg (default w1; see below)"},
    {"batch", 1, OPT_BATCH, "N", "samples per batch, 1..65536 (default 32)"},
    {"batches", 1, OPT_BATCHES, "N", "batches to send in all (default 200)"},
    {"seconds", 1, OPT_SECONDS, "S", "send for S seconds instead of a batch count (with --diagnose: the measurement's length)"},
    {"connections", 1, OPT_CONNECTIONS, "N", "concurrent keep-alive connections, 1..256 (default 4)"},
    {"threads", 1, OPT_THREADS, "T",
     "worker threads driving the connections, 1..64 (default min(connections, 8, CPUs/2))"},
    {"learnable", 0, OPT_LEARNABLE, NULL,
     "labels a small model can learn: the class sets the image's hue (noise on top); "
     "w2: the image is 32x32 blocks, each of its class's hue, labelled per pixel"},
    {"seed", 1, OPT_SEED, "S", "seed of the synthetic data (default 1)"},
    {"dir", 1, OPT_DIR, "PATH",
     "send the *.safetensors files of PATH (sorted, round-robin) instead; or, when it has none, the JPEG "
     "files under its class folders PATH/<class>/**/*.jpg as encoded batches of --batch files (labels: "
     "the class folders in sorted order, 0 first, hidden ones included, as torchvision's ImageFolder; "
     "files shuffled by --seed; "
     "at most 1024 batches and --pool-mb; a file that cannot be read or that the service would refuse, "
     "such as a CMYK JPEG, is left out and said on stderr)"},
    {"cache-dir", 1, OPT_CACHE_DIR, "PATH",
     "where w1-jpeg and imagenet-jpeg keep their generated files (default $XDG_CACHE_HOME/streamfeed or "
     "~/.cache/streamfeed)"},
    {"rate", 1, OPT_RATE, "R", "at most R new batches per second overall (default unlimited)"},
    {"pool", 1, OPT_POOL, "K", "distinct bodies generated once and cycled, 1..1024 (default 8)"},
    {"pool-mb", 1, OPT_POOL_MB, "M",
     "memory bound of the pool (generated bodies or --dir files) in MiB (default 2048)"},
    {"label-dtype", 1, OPT_LABEL_DTYPE, "T", "i64 | i32 | u8 (default i64)"},
    {"wait", 0, OPT_WAIT, NULL, "POST with ?wait=1: each reply comes when its batch is trained, with its loss"},
    {"drain", 0, OPT_DRAIN, NULL, "after sending, wait until the last accepted batch is trained (for its loss)"},
    {"token", 1, OPT_TOKEN, "TOKEN", "bearer token (default: $STREAMFEED_TOKEN)"},
    {"cacert", 1, OPT_CACERT, "FILE",
     "PEM file of the CA certificates that an https:// server's certificate must chain to "
     "(default: the system's); the server's name or IP must be in the certificate"},
    {"timeout-ms", 1, OPT_TIMEOUT_MS, "MS", "limit of one request, 0 = none (default 120000)"},
    {"retries", 1, OPT_RETRIES, "N", "resends of one batch after 503/429, 0..1000 (default 20)"},
    {"max-backoff-ms", 1, OPT_MAX_BACKOFF_MS, "MS", "cap of one retry delay (default 5000)"},
    {"diagnose", 0, OPT_DIAGNOSE, NULL,
     "send nothing: ask the server where its pipeline loses time (POST /v1/diagnose, the caching "
     "method; training pauses meanwhile) and print the table; --seconds sets the measurement "
     "length (default: the server's diagnose.default_seconds). Run it while loaders are sending"},
    {"prepare", 0, OPT_PREPARE, NULL,
     "make the pool (and w1-jpeg's or imagenet-jpeg's cached files), print where, and exit without sending"},
    {"json", 0, OPT_JSON, NULL, "print the final summary (or --diagnose's reply) as one JSON object on stdout"},
    {"quiet", 0, OPT_QUIET, NULL, "no progress line and no start-up or per-error messages"},
    {"help", 0, OPT_HELP, NULL, "print this help"},
};
#define N_OPTS ((int)(sizeof OPTS / sizeof OPTS[0]))

/* ---- small helpers ------------------------------------------------------- */

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

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

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (!s || !*s || *s == '-')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    uint64_t v;
    if (lo < 0 || parse_u64(s, (uint64_t)lo, (uint64_t)hi, &v))
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_double(const char *s, double lo, double hi, double *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
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

static int online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 1024 ? 1024 : (int)n;
}

void pool_free(pool *p)
{
    for (int i = 0; i < p->n; i++)
        free(p->b[i].data);
    free(p->b);
    p->b = NULL;
    p->n = 0;
}

/* Generates the synthetic pool: min(--pool, what fits in --pool-mb) bodies.
 * Returns 0, 1 on a runtime failure, 2 on a usage error. */
static int pool_generate(const options *o, pool *out)
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
static int pool_load_dir(const options *o, pool *out)
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

/* ---- shared run state ---------------------------------------------------- */

typedef struct err_entry {
    char code[ERROR_CODE_LEN];
    uint64_t count;
} err_entry;

/* Counters are atomics written by the workers and read by the main thread;
 * the error table and the loss record are guarded by mu, which also keeps
 * stderr lines whole. */
static struct {
    const options *o;
    const pool *p;
    double t0, deadline;
    atomic_uint_fast64_t next_ticket;
    atomic_uint_fast64_t sent, accepted, rejected, interrupted, retries, errors, failed;
    atomic_uint_fast64_t bytes_accepted, bytes_uploaded;
    atomic_uint_fast64_t ring;       /* slots << 32 | free, from the last reply; 0: unknown */
    atomic_int_fast64_t max_id;      /* the newest accepted id; -1: none */
    atomic_int_fast64_t min_id;      /* the oldest accepted id; INT64_MAX: none */
    atomic_int_fast64_t queued_at_max; /* "queued" in the reply that carried max_id */
    atomic_int consecutive_transport;
    atomic_int stop;                 /* 1: start nothing new (fatal condition) */
    atomic_int workers_left;
    atomic_uint_fast64_t t_end_ns;   /* when the last worker finished */
    pthread_mutex_t mu;
    err_entry errs[MAX_ERROR_CODES];
    int nerrs;
    int progress_shown;              /* a \r progress line is on the terminal */
    int64_t first_id, last_id;       /* ids whose losses are known; -1: none */
    double first_loss, last_loss, last_acc;
    int have_acc;
} R = {.mu = PTHREAD_MUTEX_INITIALIZER};

static bool stopping(void)
{
    return g_sigint > 0 || atomic_load(&R.stop);
}

/* Prints one message line on stderr, clearing a progress line first. */
static void msg_locked(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void msg_locked(const char *fmt, ...)
{
    if (R.progress_shown) {
        fputs("\r\033[K", stderr);
        R.progress_shown = 0;
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

/* Counts one failed batch under code; the first time a code is seen its
 * message is printed. */
static void record_error(const char *code, const char *message)
{
    pthread_mutex_lock(&R.mu);
    int i;
    for (i = 0; i < R.nerrs; i++)
        if (strcmp(R.errs[i].code, code) == 0)
            break;
    if (i == R.nerrs) {
        if (R.nerrs >= MAX_ERROR_CODES - 1 && strcmp(code, "other") != 0) {
            /* The last entry is reserved for "other". */
            for (i = 0; i < R.nerrs; i++)
                if (strcmp(R.errs[i].code, "other") == 0)
                    break;
            if (i == R.nerrs)
                snprintf(R.errs[R.nerrs++].code, ERROR_CODE_LEN, "other");
        } else {
            snprintf(R.errs[R.nerrs++].code, ERROR_CODE_LEN, "%s", code);
            if (!R.o->quiet)
                msg_locked("streamfeed-load: error %s: %s\n", code, message && *message ? message : "");
        }
    }
    R.errs[i].count++;
    pthread_mutex_unlock(&R.mu);
    atomic_fetch_add(&R.errors, 1);
}

static void record_loss(int64_t id, double loss, bool have_acc, double acc)
{
    pthread_mutex_lock(&R.mu);
    if (R.first_id < 0 || id < R.first_id) {
        R.first_id = id;
        R.first_loss = loss;
    }
    if (id >= R.last_id) {
        R.last_id = id;
        R.last_loss = loss;
        R.have_acc = have_acc;
        R.last_acc = acc;
    }
    pthread_mutex_unlock(&R.mu);
}

static void atomic_max_i64(atomic_int_fast64_t *a, int64_t v)
{
    int_fast64_t cur = atomic_load(a);
    while (v > cur && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

static void atomic_min_i64(atomic_int_fast64_t *a, int64_t v)
{
    int_fast64_t cur = atomic_load(a);
    while (v < cur && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

/* ---- replies ------------------------------------------------------------- */

static double json_num(const cJSON *o, const char *k, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* Reads a 2xx reply: the batch id, the queue length and ring occupancy (202),
 * or the batch object with its state and loss (200 from ?wait=1). A reply that
 * is not JSON still counts as accepted; it just tells nothing more. */
static void read_accept_reply(const char *text, size_t len)
{
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j)
        return;
    double id = json_num(j, "id", -1);
    const cJSON *ring = cJSON_GetObjectItemCaseSensitive(j, "ring");
    if (cJSON_IsObject(ring)) {
        double slots = json_num(ring, "slots", -1), fr = json_num(ring, "free", -1);
        if (slots >= 0 && fr >= 0 && slots < 4294967296.0 && fr < 4294967296.0)
            atomic_store(&R.ring, ((uint64_t)slots << 32) | (uint64_t)fr);
    }
    if (id >= 0) {
        int64_t iid = (int64_t)id;
        atomic_min_i64(&R.min_id, iid);
        if (iid > atomic_load(&R.max_id)) {
            atomic_store(&R.queued_at_max, (int64_t)json_num(j, "queued", 0));
            atomic_max_i64(&R.max_id, iid);
        }
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "state");
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
        const cJSON *acc = cJSON_GetObjectItemCaseSensitive(j, "accuracy");
        if (cJSON_IsString(st) && strcmp(st->valuestring, "failed") == 0)
            atomic_fetch_add(&R.failed, 1);
        else if (cJSON_IsNumber(loss) && (!cJSON_IsString(st) || strcmp(st->valuestring, "done") == 0))
            record_loss(iid, loss->valuedouble, cJSON_IsNumber(acc), cJSON_IsNumber(acc) ? acc->valuedouble : 0);
    }
    cJSON_Delete(j);
}

/* Reads {"error":{"code","message"}} out of an error reply. Falls back to
 * http_<status> when the body is not that shape. *retry_ms gets the optional
 * "retry_after_ms" field (a finer Retry-After), else 0. */
static void read_error_reply(const char *text, size_t len, long status, char *code, size_t code_cap,
                             char *message, size_t msg_cap, long *retry_ms)
{
    snprintf(code, code_cap, "http_%ld", status);
    snprintf(message, msg_cap, "HTTP %ld with no error object in the reply", status);
    *retry_ms = 0;
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j)
        return;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (cJSON_IsObject(e)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "code");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
        if (cJSON_IsString(c) && c->valuestring[0])
            snprintf(code, code_cap, "%s", c->valuestring);
        if (cJSON_IsString(m))
            snprintf(message, msg_cap, "%s (HTTP %ld)", m->valuestring, status);
        double r = json_num(e, "retry_after_ms", json_num(j, "retry_after_ms", 0));
        if (r > 0 && r < 3.6e6)
            *retry_ms = (long)r;
    }
    cJSON_Delete(j);
}

/* ---- connections and workers --------------------------------------------- */

typedef enum conn_state {
    C_IDLE,    /* holds no batch */
    C_WAITING, /* holds a batch that may start at not_before (rate limit or retry delay) */
    C_RUNNING, /* its request is in the multi handle */
} conn_state;

typedef struct conn {
    CURL *easy;
    conn_state st;
    uint64_t ticket;
    const body *b;
    int attempt;   /* retries made for the current batch */
    int counted;   /* the current batch was counted as sent */
    double not_before;
    char *reply;   /* REPLY_CAP + 1 bytes */
    size_t reply_len;
    uint64_t rng;  /* retry jitter */
} conn;

typedef struct worker {
    int index;
    CURLM *multi;
    conn *conns;
    int nconns;
    struct curl_slist *headers;
    pthread_t tid;
} worker;

static size_t on_reply_data(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    conn *c = userdata;
    size_t n = size * nmemb, room = REPLY_CAP - c->reply_len;
    size_t take = n < room ? n : room; /* the rest of an oversized reply is dropped */
    memcpy(c->reply + c->reply_len, ptr, take);
    c->reply_len += take;
    return n;
}

/* Applies a libcurl option and reports which one failed, with file:line. */
#define CURL_SETOPT(h, opt, val)                                                           \
    do {                                                                                  \
        CURLcode rc_ = curl_easy_setopt((h), (opt), (val));                               \
        if (rc_ != CURLE_OK) {                                                            \
            fprintf(stderr, "streamfeed-load: %s:%d: curl_easy_setopt(%s): %s\n", __FILE__, \
                    __LINE__, #opt, curl_easy_strerror(rc_));                             \
            return -1;                                                                    \
        }                                                                                 \
    } while (0)

/* https:// is verified (peer and host name) against --cacert, or the system's CAs. */
static CURLcode set_tls(CURL *h, const options *o)
{
    return o->cacert ? curl_easy_setopt(h, CURLOPT_CAINFO, o->cacert) : CURLE_OK;
}

static int conn_init(conn *c, const char *url, struct curl_slist *headers, uint64_t seed)
{
    c->reply = malloc(REPLY_CAP + 1);
    c->easy = curl_easy_init();
    c->rng = seed;
    if (!c->reply || !c->easy) {
        fprintf(stderr, "streamfeed-load: could not create a connection\n");
        return -1;
    }
    const options *o = R.o;
    CURL *h = c->easy;
    CURL_SETOPT(h, CURLOPT_URL, url);
    CURL_SETOPT(h, CURLOPT_POST, 1L);
    CURL_SETOPT(h, CURLOPT_HTTPHEADER, headers);
    CURL_SETOPT(h, CURLOPT_WRITEFUNCTION, on_reply_data);
    CURL_SETOPT(h, CURLOPT_WRITEDATA, c);
    CURL_SETOPT(h, CURLOPT_PRIVATE, c);
    CURL_SETOPT(h, CURLOPT_NOSIGNAL, 1L);
    CURL_SETOPT(h, CURLOPT_TCP_NODELAY, 1L);
    CURL_SETOPT(h, CURLOPT_TCP_KEEPALIVE, 1L);
    CURL_SETOPT(h, CURLOPT_USERAGENT, "streamfeed-load/1");
    /* The largest upload buffer libcurl allows: fewer, larger send() calls. */
    CURL_SETOPT(h, CURLOPT_UPLOAD_BUFFERSIZE, UPLOAD_BUFFER);
    CURL_SETOPT(h, CURLOPT_TIMEOUT_MS, o->timeout_ms);
    long ct = o->timeout_ms > 0 && o->timeout_ms < 10000 ? o->timeout_ms : 10000;
    CURL_SETOPT(h, CURLOPT_CONNECTTIMEOUT_MS, ct);
    if (set_tls(h, o) != CURLE_OK) {
        fprintf(stderr, "streamfeed-load: this libcurl cannot take --cacert\n");
        return -1;
    }
    return 0;
}

static void conn_free(conn *c)
{
    if (c->easy)
        curl_easy_cleanup(c->easy);
    free(c->reply);
}

/* Gives an idle connection the next batch, if there is one to send. */
static void conn_take_ticket(conn *c, double now)
{
    const options *o = R.o;
    if (stopping() || (o->seconds > 0 && now >= R.deadline))
        return;
    uint64_t t = atomic_fetch_add(&R.next_ticket, 1);
    if (o->seconds <= 0 && t >= o->batches)
        return;
    c->ticket = t;
    c->b = &R.p->b[t % (uint64_t)R.p->n];
    c->attempt = 0;
    c->counted = 0;
    c->not_before = o->rate > 0 ? R.t0 + (double)t / o->rate : 0;
    c->st = C_WAITING;
}

static int conn_start(worker *w, conn *c)
{
    CURL *h = c->easy;
    if (curl_easy_setopt(h, CURLOPT_POSTFIELDS, (const char *)c->b->data) != CURLE_OK ||
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)c->b->len) != CURLE_OK ||
        curl_multi_add_handle(w->multi, h) != CURLM_OK) {
        return -1;
    }
    c->reply_len = 0;
    if (!c->counted) {
        c->counted = 1;
        atomic_fetch_add(&R.sent, 1);
    } else {
        atomic_fetch_add(&R.retries, 1);
    }
    c->st = C_RUNNING;
    return 0;
}

/* The delay before resending after 503/429: the server's hint, or
 * exponential back-off from 50 ms without one; capped; plus up to 10 % jitter
 * so that the connections do not come back in lock step. */
static double retry_delay_s(conn *c, curl_off_t retry_after_s, long retry_ms)
{
    const options *o = R.o;
    double ms;
    if (retry_ms > 0)
        ms = (double)retry_ms;
    else if (retry_after_s > 0)
        ms = (double)retry_after_s * 1000.0;
    else
        ms = 50.0 * (double)(1ULL << (c->attempt < 20 ? c->attempt : 20));
    if (ms > (double)o->max_backoff_ms)
        ms = (double)o->max_backoff_ms;
    ms *= 1.0 + 0.1 * (double)(rng_next(&c->rng) >> 11) / 9007199254740992.0;
    return ms / 1000.0;
}

static const char *transport_code(CURLcode rc)
{
    switch (rc) {
    case CURLE_COULDNT_CONNECT: return "transport_couldnt_connect";
    case CURLE_COULDNT_RESOLVE_HOST: return "transport_couldnt_resolve_host";
    case CURLE_OPERATION_TIMEDOUT: return "transport_timeout";
    case CURLE_SEND_ERROR: return "transport_send_error";
    case CURLE_RECV_ERROR: return "transport_recv_error";
    case CURLE_GOT_NOTHING: return "transport_got_nothing";
    case CURLE_PARTIAL_FILE: return "transport_partial_reply";
    default: return "transport_other";
    }
}

/* A request has ended: decide what becomes of its batch. */
static void conn_done(worker *w, conn *c, CURLcode res)
{
    const options *o = R.o;
    CURL *h = c->easy;
    long status = 0;
    curl_off_t up = 0, ra = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(h, CURLINFO_SIZE_UPLOAD_T, &up);
    curl_easy_getinfo(h, CURLINFO_RETRY_AFTER, &ra);
    curl_multi_remove_handle(w->multi, h);
    atomic_fetch_add(&R.bytes_uploaded, (uint64_t)(up > 0 ? up : 0));
    c->st = C_IDLE;
    c->reply[c->reply_len] = '\0';

    if (res != CURLE_OK && status == 0) {
        char m[256];
        snprintf(m, sizeof m, "%s (%s)", curl_easy_strerror(res), o->url);
        record_error(transport_code(res), m);
        atomic_fetch_add(&R.rejected, 1);
        /* A server that is not there would otherwise be hammered for the whole
         * run; give up after this many transport failures in a row. */
        int limit = 2 * o->connections < 8 ? 8 : 2 * o->connections;
        if (atomic_fetch_add(&R.consecutive_transport, 1) + 1 >= limit && !atomic_exchange(&R.stop, 1)) {
            pthread_mutex_lock(&R.mu);
            msg_locked("streamfeed-load: %d transport errors in a row; stopping\n", limit);
            pthread_mutex_unlock(&R.mu);
        }
        return;
    }
    atomic_store(&R.consecutive_transport, 0);

    if (status >= 200 && status < 300) {
        atomic_fetch_add(&R.accepted, 1);
        atomic_fetch_add(&R.bytes_accepted, c->b->len);
        read_accept_reply(c->reply, c->reply_len);
        return;
    }
    char code[ERROR_CODE_LEN], message[512];
    long retry_ms;
    read_error_reply(c->reply, c->reply_len, status, code, sizeof code, message, sizeof message, &retry_ms);
    if (status == 503 || status == 429) {
        if (stopping()) {
            atomic_fetch_add(&R.interrupted, 1);
            return;
        }
        if (c->attempt < o->retries) {
            c->not_before = now_s() + retry_delay_s(c, ra, retry_ms);
            c->attempt++;
            c->st = C_WAITING;
            return;
        }
        char m[640];
        snprintf(m, sizeof m, "gave up after %d retries; the last reply was %s: %s", o->retries, code, message);
        record_error("retries_exhausted", m);
        atomic_fetch_add(&R.rejected, 1);
        return;
    }
    record_error(code, message);
    atomic_fetch_add(&R.rejected, 1);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    const options *o = R.o;
    for (;;) {
        double now = now_s(), wake = now + 0.1;
        bool stop = stopping(), hard = g_sigint >= 2;
        int active = 0;
        for (int i = 0; i < w->nconns; i++) {
            conn *c = &w->conns[i];
            if (hard && c->st == C_RUNNING) {
                curl_multi_remove_handle(w->multi, c->easy);
                atomic_fetch_add(&R.interrupted, 1);
                c->st = C_IDLE;
            }
            if (c->st == C_WAITING && (stop || (!c->counted && o->seconds > 0 && now >= R.deadline))) {
                /* A pending retry is abandoned; a batch not yet sent simply
                 * never was. */
                if (c->counted)
                    atomic_fetch_add(&R.interrupted, 1);
                c->st = C_IDLE;
            }
            if (c->st == C_IDLE)
                conn_take_ticket(c, now);
            if (c->st == C_WAITING) {
                if (now >= c->not_before) {
                    if (conn_start(w, c) != 0) {
                        record_error("client_curl", "could not start a request");
                        if (c->counted)
                            atomic_fetch_add(&R.rejected, 1);
                        c->st = C_IDLE;
                        atomic_store(&R.stop, 1);
                    }
                } else if (c->not_before < wake) {
                    wake = c->not_before;
                }
            }
            if (c->st != C_IDLE)
                active++;
        }
        if (active == 0)
            break;
        int running = 0, done = 0;
        curl_multi_perform(w->multi, &running);
        CURLMsg *m;
        int q;
        while ((m = curl_multi_info_read(w->multi, &q))) {
            if (m->msg != CURLMSG_DONE)
                continue;
            conn *c = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&c);
            CURLcode res = m->data.result;
            conn_done(w, c, res);
            done++;
        }
        if (done)
            continue; /* hand the freed connections new work before waiting */
        int timeout_ms = (int)((wake - now) * 1000.0);
        timeout_ms = timeout_ms < 0 ? 0 : timeout_ms > 100 ? 100 : timeout_ms;
        curl_multi_poll(w->multi, NULL, 0, timeout_ms, NULL);
    }
    if (atomic_fetch_sub(&R.workers_left, 1) == 1) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        atomic_store(&R.t_end_ns, (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec);
    }
    return NULL;
}

/* ---- loss polling (main thread) ------------------------------------------ */

typedef struct poller {
    CURL *easy;
    struct curl_slist *headers;
    char *reply;
    size_t reply_len;
    int failures;  /* consecutive; polling stops after a few */
    int first_done; /* the oldest id's loss is known or unknowable */
} poller;

static size_t on_poll_data(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    poller *p = userdata;
    size_t n = size * nmemb, room = REPLY_CAP - p->reply_len;
    size_t take = n < room ? n : room;
    memcpy(p->reply + p->reply_len, ptr, take);
    p->reply_len += take;
    return n;
}

/* GETs one batch; returns 1 when it is trained or failed (its loss recorded),
 * 0 while it is pending, -1 when the server could not say. */
static int poll_batch(poller *p, int64_t id)
{
    if (!p->easy || p->failures >= 5)
        return -1;
    char url[2048];
    snprintf(url, sizeof url, "%s/v1/batches/%" PRId64, R.o->url, id);
    curl_easy_setopt(p->easy, CURLOPT_URL, url);
    p->reply_len = 0;
    long status = 0;
    if (curl_easy_perform(p->easy) != CURLE_OK ||
        curl_easy_getinfo(p->easy, CURLINFO_RESPONSE_CODE, &status) != CURLE_OK || status != 200) {
        p->failures++;
        return -1;
    }
    p->failures = 0;
    cJSON *j = cJSON_ParseWithLength(p->reply, p->reply_len);
    int r = 0;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "state");
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
    const cJSON *acc = cJSON_GetObjectItemCaseSensitive(j, "accuracy");
    if (cJSON_IsString(st) && strcmp(st->valuestring, "failed") == 0) {
        r = 1;
    } else if (cJSON_IsString(st) && strcmp(st->valuestring, "done") == 0) {
        r = 1;
        if (cJSON_IsNumber(loss))
            record_loss(id, loss->valuedouble, cJSON_IsNumber(acc), cJSON_IsNumber(acc) ? acc->valuedouble : 0);
    }
    cJSON_Delete(j);
    return r;
}

/* Asks for the loss of the oldest accepted batch (once) and of the batch that
 * most likely trained last: the newest accepted id minus the queue length its
 * reply reported. Ids are the server's, so with other loaders running the
 * second may be theirs: it is the same model's loss either way. */
static void poll_losses(poller *p)
{
    int64_t mn = atomic_load(&R.min_id), mx = atomic_load(&R.max_id);
    if (mx < 0)
        return;
    if (!p->first_done && poll_batch(p, mn) != 0)
        p->first_done = 1;
    int64_t guess = mx - atomic_load(&R.queued_at_max);
    if (guess < mn)
        guess = mn;
    pthread_mutex_lock(&R.mu);
    int64_t known = R.last_id;
    pthread_mutex_unlock(&R.mu);
    if (guess > known)
        poll_batch(p, guess);
}

static void poller_init(poller *p, const options *o)
{
    memset(p, 0, sizeof *p);
    if (o->wait)
        return; /* losses come with the replies */
    p->reply = malloc(REPLY_CAP);
    p->easy = p->reply ? curl_easy_init() : NULL;
    if (!p->easy)
        return;
    if (o->token) {
        char auth[1024];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o->token);
        p->headers = curl_slist_append(NULL, auth);
        curl_easy_setopt(p->easy, CURLOPT_HTTPHEADER, p->headers);
    }
    curl_easy_setopt(p->easy, CURLOPT_WRITEFUNCTION, on_poll_data);
    curl_easy_setopt(p->easy, CURLOPT_WRITEDATA, p);
    curl_easy_setopt(p->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(p->easy, CURLOPT_TIMEOUT_MS, (long)POLL_TIMEOUT_MS);
    curl_easy_setopt(p->easy, CURLOPT_USERAGENT, "streamfeed-load/1");
    set_tls(p->easy, o);
}

static void poller_free(poller *p)
{
    if (p->easy)
        curl_easy_cleanup(p->easy);
    curl_slist_free_all(p->headers);
    free(p->reply);
}

/* ---- progress and summary ------------------------------------------------ */

static void print_progress(double t, double dt, uint64_t *prev_bytes, uint64_t *prev_acc)
{
    uint64_t sent = atomic_load(&R.sent), acc = atomic_load(&R.accepted);
    uint64_t bytes = atomic_load(&R.bytes_accepted), ring = atomic_load(&R.ring);
    double mbs = dt > 0 ? (double)(bytes - *prev_bytes) / dt / 1e6 : 0;
    double bps = dt > 0 ? (double)(acc - *prev_acc) / dt : 0;
    *prev_bytes = bytes;
    *prev_acc = acc;
    char ringtxt[48] = "-", losstxt[48] = "";
    if (ring) {
        uint64_t slots = ring >> 32, fr = ring & 0xffffffffu;
        snprintf(ringtxt, sizeof ringtxt, "%" PRIu64 "/%" PRIu64, slots >= fr ? slots - fr : 0, slots);
    }
    pthread_mutex_lock(&R.mu);
    if (R.last_id >= 0)
        snprintf(losstxt, sizeof losstxt, "  loss %.4f", R.last_loss);
    fprintf(stderr,
            "\r\033[K%6.1fs  sent %" PRIu64 "  accepted %" PRIu64 "  %.1f MB/s  %.1f batches/s  ring %s"
            "  retries %" PRIu64 "  errors %" PRIu64 "%s",
            t, sent, acc, mbs, bps, ringtxt, (uint64_t)atomic_load(&R.retries),
            (uint64_t)atomic_load(&R.errors), losstxt);
    R.progress_shown = 1;
    pthread_mutex_unlock(&R.mu);
}

static void print_summary(const options *o, double secs)
{
    uint64_t sent = atomic_load(&R.sent), acc = atomic_load(&R.accepted);
    uint64_t bytes = atomic_load(&R.bytes_accepted);
    double mbs = secs > 0 ? (double)bytes / secs / 1e6 : 0;
    double bps = secs > 0 ? (double)acc / secs : 0;

    pthread_mutex_lock(&R.mu);
    if (R.progress_shown) {
        fputs("\r\033[K", stderr);
        R.progress_shown = 0;
    }
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "batches_sent", (double)sent);
        cJSON_AddNumberToObject(j, "accepted", (double)acc);
        cJSON_AddNumberToObject(j, "rejected", (double)atomic_load(&R.rejected));
        cJSON_AddNumberToObject(j, "interrupted", (double)atomic_load(&R.interrupted));
        cJSON_AddNumberToObject(j, "failed", (double)atomic_load(&R.failed));
        cJSON_AddNumberToObject(j, "retries", (double)atomic_load(&R.retries));
        cJSON *e = cJSON_AddObjectToObject(j, "errors");
        for (int i = 0; i < R.nerrs; i++)
            cJSON_AddNumberToObject(e, R.errs[i].code, (double)R.errs[i].count);
        cJSON_AddNumberToObject(j, "bytes", (double)bytes);
        cJSON_AddNumberToObject(j, "bytes_uploaded", (double)atomic_load(&R.bytes_uploaded));
        cJSON_AddNumberToObject(j, "seconds", secs);
        cJSON_AddNumberToObject(j, "mb_per_s", mbs);
        cJSON_AddNumberToObject(j, "batches_per_s", bps);
        if (R.last_id >= 0) {
            cJSON_AddNumberToObject(j, "last_loss", R.last_loss);
            cJSON_AddNumberToObject(j, "first_loss", R.first_loss);
        } else {
            cJSON_AddNullToObject(j, "last_loss");
            cJSON_AddNullToObject(j, "first_loss");
        }
        if (R.last_id >= 0 && R.have_acc)
            cJSON_AddNumberToObject(j, "last_accuracy", R.last_acc);
        else
            cJSON_AddNullToObject(j, "last_accuracy");
        cJSON_AddStringToObject(j, "workload", o->dir ? "dir" : o->wl->name);
        cJSON_AddNumberToObject(j, "batch", o->dir ? 0 : o->batch);
        cJSON_AddNumberToObject(j, "connections", o->connections);
        cJSON_AddBoolToObject(j, "interrupted_by_signal", g_sigint > 0);
        char *s = cJSON_PrintUnformatted(j);
        if (s)
            printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
    } else {
        printf("streamfeed-load: %s%s, %d connection%s%s\n", o->dir ? "files of " : "",
               o->dir ? o->dir : o->wl->name, o->connections, o->connections == 1 ? "" : "s",
               g_sigint ? " (interrupted)" : "");
        printf("  sent %" PRIu64 "  accepted %" PRIu64 "  rejected %" PRIu64 "  interrupted %" PRIu64
               "  retries %" PRIu64 "%s\n",
               sent, acc, (uint64_t)atomic_load(&R.rejected), (uint64_t)atomic_load(&R.interrupted),
               (uint64_t)atomic_load(&R.retries), atomic_load(&R.failed) ? "  (some failed in training)" : "");
        printf("  %.1f MB accepted in %.2f s: %.1f MB/s, %.1f batches/s\n", (double)bytes / 1e6, secs, mbs,
               bps);
        if (R.last_id >= 0) {
            printf("  loss: first %.4f (batch %" PRId64 "), last %.4f (batch %" PRId64 ")", R.first_loss,
                   R.first_id, R.last_loss, R.last_id);
            if (R.have_acc)
                printf(", accuracy %.3f", R.last_acc);
            printf("\n");
        }
        if (R.nerrs) {
            printf("  errors:");
            for (int i = 0; i < R.nerrs; i++)
                printf(" %s %" PRIu64, R.errs[i].code, R.errs[i].count);
            printf("\n");
        }
    }
    fflush(stdout);
    pthread_mutex_unlock(&R.mu);
}

/* ---- command line -------------------------------------------------------- */

/* Prints text from column indent (the cursor is there already), breaking
 * lines at spaces before column width. */
static void print_wrapped(FILE *f, const char *text, int indent, int width)
{
    int col = indent;
    const char *p = text;
    while (*p) {
        const char *e = p;
        while (*e && *e != ' ')
            e++;
        int wl = (int)(e - p);
        if (col > indent && col + 1 + wl > width) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fwrite(p, 1, (size_t)wl, f);
        col += wl;
        p = *e ? e + 1 : e;
    }
    fputc('\n', f);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: streamfeed-load [options]\n"
               "POSTs safetensors batches to a streamfeed server (POST {url}/v1/batches) over\n"
               "keep-alive connections and reports throughput, retries, errors and the loss.\n\n");
    for (int i = 0; i < N_OPTS; i++) {
        char left[64];
        const opt_spec *s = &OPTS[i];
        if (s->key < 256)
            snprintf(left, sizeof left, "-%c, --%s%s%s", s->key, s->name, s->has_arg ? " " : "",
                     s->has_arg ? s->metavar : "");
        else
            snprintf(left, sizeof left, "    --%s%s%s", s->name, s->has_arg ? " " : "",
                     s->has_arg ? s->metavar : "");
        fprintf(f, "  %-26s ", left);
        print_wrapped(f, s->help, 29, 79);
    }
    fprintf(f, "\nworkloads:\n");
    for (int i = 0; i < N_WORKLOADS; i++) {
        fprintf(f, "  %-13s ", WORKLOADS[i].name);
        print_wrapped(f, WORKLOADS[i].about, 16, 79);
    }
    fprintf(f, "\n503 and 429 replies are retried with the same body after Retry-After (or back-off),\n"
               "without holding up the other connections; other errors are counted per code.\n"
               "Progress (on a terminal): batches sent/accepted, MB/s and batches/s over the\n"
               "last 0.5 s, ring slots in use/slots from the last reply, retries, errors, loss.\n"
               "MB = 10^6 bytes of accepted bodies. Exit status: 0 when every batch sent was\n"
               "accepted, 1 otherwise, 2 on a usage error. Ctrl-C stops sending and prints the\n"
               "summary; a second Ctrl-C also aborts the requests in flight.\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("streamfeed-load: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n(see --help)\n", stderr);
    return 2;
}

/* Fills o from argv. Returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, options *o)
{
    struct option lo[N_OPTS + 1];
    char so[3 * N_OPTS + 1];
    size_t sl = 0;
    for (int i = 0; i < N_OPTS; i++) {
        lo[i] = (struct option){OPTS[i].name, OPTS[i].has_arg ? required_argument : no_argument, NULL, OPTS[i].key};
        if (OPTS[i].key < 256) {
            so[sl++] = (char)OPTS[i].key;
            if (OPTS[i].has_arg)
                so[sl++] = ':';
        }
    }
    lo[N_OPTS] = (struct option){0, 0, 0, 0};
    so[sl] = '\0';

    *o = (options){
        .url = "http://127.0.0.1:8080", .wl = &WORKLOADS[0], .batch = 32, .batches = 200,
        .connections = 4, .seed = 1, .pool = 8, .pool_mb = 2048, .label_dtype = SF_ST_I64,
        .timeout_ms = 120000, .retries = 20, .max_backoff_ms = 5000, .token = getenv("STREAMFEED_TOKEN"),
    };
    bool have_batches = false, have_seconds = false;
    int threads = 0, ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, so, lo, NULL)) != -1) {
        const char *a = optarg;
        uint64_t u;
        switch (ch) {
        case OPT_URL:
            o->url = a;
            break;
        case OPT_WORKLOAD: {
            int i;
            for (i = 0; i < N_WORKLOADS && strcmp(a, WORKLOADS[i].name) != 0; i++)
                ;
            if (i == N_WORKLOADS)
                return usage_error("--workload must be w1, w2, w3, tiny, w1-jpeg or imagenet-jpeg, not '%s'",
                                   a);
            o->wl = &WORKLOADS[i];
            break;
        }
        case OPT_BATCH:
            if (parse_int(a, 1, MAX_BATCH, &o->batch))
                return usage_error("--batch must be an integer in 1..%d", MAX_BATCH);
            break;
        case OPT_BATCHES:
            if (parse_u64(a, 1, 1000000000000ULL, &o->batches))
                return usage_error("--batches must be a positive integer");
            have_batches = true;
            break;
        case OPT_SECONDS:
            if (parse_double(a, 0.001, 1e7, &o->seconds))
                return usage_error("--seconds must be a number in 0.001..1e7");
            have_seconds = true;
            break;
        case OPT_CONNECTIONS:
            if (parse_int(a, 1, MAX_CONNECTIONS, &o->connections))
                return usage_error("--connections must be an integer in 1..%d", MAX_CONNECTIONS);
            break;
        case OPT_THREADS:
            if (parse_int(a, 1, MAX_THREADS, &threads))
                return usage_error("--threads must be an integer in 1..%d", MAX_THREADS);
            break;
        case OPT_LEARNABLE:
            o->learnable = 1;
            break;
        case OPT_SEED:
            if (parse_u64(a, 0, UINT64_MAX, &o->seed))
                return usage_error("--seed must be a non-negative integer");
            break;
        case OPT_DIR:
            o->dir = a;
            break;
        case OPT_CACHE_DIR:
            o->cache_dir = a;
            break;
        case OPT_RATE:
            if (parse_double(a, 1e-6, 1e6, &o->rate))
                return usage_error("--rate must be a number in 1e-6..1e6 (batches per second)");
            break;
        case OPT_POOL:
            if (parse_int(a, 1, MAX_POOL, &o->pool))
                return usage_error("--pool must be an integer in 1..%d", MAX_POOL);
            break;
        case OPT_POOL_MB:
            if (parse_u64(a, 1, MAX_POOL_MB, &o->pool_mb))
                return usage_error("--pool-mb must be an integer in 1..%d", MAX_POOL_MB);
            break;
        case OPT_LABEL_DTYPE:
            if (strcmp(a, "i64") == 0)
                o->label_dtype = SF_ST_I64;
            else if (strcmp(a, "i32") == 0)
                o->label_dtype = SF_ST_I32;
            else if (strcmp(a, "u8") == 0)
                o->label_dtype = SF_ST_U8;
            else
                return usage_error("--label-dtype must be i64, i32 or u8, not '%s'", a);
            break;
        case OPT_WAIT:
            o->wait = 1;
            break;
        case OPT_DRAIN:
            o->drain = 1;
            break;
        case OPT_TOKEN:
            o->token = a;
            break;
        case OPT_CACERT:
            if (access(a, R_OK) != 0)
                return usage_error("--cacert %s cannot be read", a);
            o->cacert = a;
            break;
        case OPT_TIMEOUT_MS:
            if (parse_u64(a, 0, 86400000, &u))
                return usage_error("--timeout-ms must be an integer in 0..86400000");
            o->timeout_ms = (long)u;
            break;
        case OPT_RETRIES:
            if (parse_int(a, 0, MAX_RETRIES, &o->retries))
                return usage_error("--retries must be an integer in 0..%d", MAX_RETRIES);
            break;
        case OPT_MAX_BACKOFF_MS:
            if (parse_u64(a, 1, 600000, &u))
                return usage_error("--max-backoff-ms must be an integer in 1..600000");
            o->max_backoff_ms = (long)u;
            break;
        case OPT_JSON:
            o->json = 1;
            break;
        case OPT_DIAGNOSE:
            o->diagnose = 1;
            break;
        case OPT_PREPARE:
            o->prepare = 1;
            break;
        case OPT_QUIET:
            o->quiet = 1;
            break;
        case OPT_HELP:
            usage(stdout);
            return 0;
        default:
            if (optopt && optopt < 256 && optopt != '?')
                return usage_error("option -%c is unknown or needs a value", optopt);
            return usage_error("unknown option or missing value: %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (have_batches && have_seconds)
        return usage_error("give --batches or --seconds, not both");
    if (strncmp(o->url, "http://", 7) != 0 && strncmp(o->url, "https://", 8) != 0)
        return usage_error("--url must start with http:// or https://");
    if (strlen(o->url) > 1900)
        return usage_error("--url is too long");
    {
        /* "http://host:8080/" names the same server as without the slash:
         * the API's paths are appended to it ("//v1/batches" is no route). */
        static char url[1901];
        snprintf(url, sizeof url, "%s", o->url);
        size_t n = strlen(url);
        while (n > 8 && url[n - 1] == '/')
            url[--n] = '\0';
        o->url = url;
    }
    if (o->token && strlen(o->token) > 900)
        return usage_error("--token is too long");
    if (o->token && !*o->token)
        o->token = NULL;
    if (threads == 0) {
        threads = online_cpus() / 2;
        threads = threads < 1 ? 1 : threads > 8 ? 8 : threads;
    }
    o->threads = threads > o->connections ? o->connections : threads;
    return -1;
}

/* ---- --diagnose ------------------------------------------------------------ */

typedef struct diag_reply {
    char *data;
    size_t len;
} diag_reply;

static size_t on_diag_data(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    diag_reply *r = userdata;
    size_t n = size * nmemb, room = REPLY_CAP - r->len;
    size_t take = n < room ? n : room;
    memcpy(r->data + r->len, ptr, take);
    r->len += take;
    return n;
}

static const char *diag_str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* The reply of POST /v1/diagnose as one screen: the four stages, the drop
 * each stage causes, the verdict and its suggestion. */
static void print_diagnosis(const options *o, const cJSON *j)
{
    static const char *const rows[3] = {
        "(1) step: augmented, on device",
        "(2) augment+step: raw, on device",
        "(3) H2D+augment+step: pinned host",
    };
    static const char *const drop_keys[3] = {"augmentation", "h2d", "ingest"};
    static const char *const drop_names[3] = {"augment", "H2D", "ingest"};
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "batch");
    const cJSON *stages = cJSON_GetObjectItemCaseSensitive(j, "stages");
    const cJSON *drops = cJSON_GetObjectItemCaseSensitive(j, "drops");
    double thr = json_num(j, "threshold", 0.15);
    printf("diagnose %s: backend %s, %.3g s\n", o->url, diag_str(j, "backend"), json_num(j, "seconds", 0));
    printf("batch: %d x %dx%dx%d %s, labels %s (%s)\n\n", (int)json_num(b, "n", 0), (int)json_num(b, "h", 0),
           (int)json_num(b, "w", 0), (int)json_num(b, "c", 0), diag_str(b, "layout"), diag_str(b, "label_dtype"),
           strcmp(diag_str(b, "source"), "last_batch") == 0 ? "as the last trained batch"
                                                           : "no batch yet: the model's input");
    printf("  %-34s %8s %9s %5s  %s\n", "stage", "steps/s", "samples/s", "vs(1)", "lost");
    for (int i = 0; i < 4; i++) {
        const cJSON *st = cJSON_GetArrayItem(stages, i);
        char label[48], lost[32] = "";
        if (i == 3)
            snprintf(label, sizeof label, "(4) live: last %.3g s of traffic", json_num(st, "seconds", 0));
        else
            snprintf(label, sizeof label, "%s", rows[i]);
        if (i > 0) {
            double d = json_num(drops, drop_keys[i - 1], 0);
            snprintf(lost, sizeof lost, "%3.0f%% %s%s", 100 * d, drop_names[i - 1], d > thr ? " <--" : "");
        }
        printf("  %-34s %8.1f %9.0f %5.2f%s%s\n", label, json_num(st, "steps_per_s", 0),
               json_num(st, "samples_per_s", 0), json_num(st, "ratio", 0), lost[0] ? "  " : "", lost);
    }
    printf("\nverdict: %s\n", diag_str(j, "bottleneck"));
    fputs("  ", stdout);
    print_wrapped(stdout, diag_str(j, "suggestion"), 2, 79);
    printf("(a stage is named when it loses more than %.0f%% of the rate before it;\n"
           " stages 1-3 use a cached batch while training pauses; the state is restored)\n",
           100 * thr);
}

/* --diagnose: one POST /v1/diagnose. Exit status 0 on a verdict, 1 on an
 * error reply or a transport failure. */
static int run_diagnose(const options *o)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "streamfeed-load: curl_global_init failed\n");
        return 1;
    }
    char url[2048], body[64] = "";
    snprintf(url, sizeof url, "%s/v1/diagnose", o->url);
    if (o->seconds > 0)
        snprintf(body, sizeof body, "{\"seconds\":%.6g}", o->seconds);
    diag_reply rep = {malloc(REPLY_CAP + 1), 0};
    CURL *h = curl_easy_init();
    struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/json");
    if (hl)
        hl = curl_slist_append(hl, "Accept: application/json");
    if (hl && o->token) {
        char auth[1024];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o->token);
        hl = curl_slist_append(hl, auth);
    }
    int rc = 1;
    if (!rep.data || !h || !hl) {
        fprintf(stderr, "streamfeed-load: could not set up the request\n");
        goto out;
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_diag_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &rep);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, o->timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "streamfeed-load/1");
    set_tls(h, o);
    if (!o->quiet && isatty(STDERR_FILENO))
        fprintf(stderr, "streamfeed-load: diagnosing %s (training pauses meanwhile)...\n", o->url);
    CURLcode cr = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    rep.data[rep.len] = '\0';
    if (cr != CURLE_OK) {
        fprintf(stderr, "streamfeed-load: POST %s: %s\n", url, curl_easy_strerror(cr));
        goto out;
    }
    if (status != 200) {
        char code[ERROR_CODE_LEN], message[512];
        long retry_ms;
        read_error_reply(rep.data, rep.len, status, code, sizeof code, message, sizeof message, &retry_ms);
        fprintf(stderr, "streamfeed-load: diagnose failed: %s: %s\n", code, message);
        goto out;
    }
    cJSON *j = cJSON_ParseWithLength(rep.data, rep.len);
    if (!j || !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "stages")) ||
        cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "stages")) != 4) {
        fprintf(stderr, "streamfeed-load: the diagnose reply is not the expected JSON\n");
        cJSON_Delete(j);
        goto out;
    }
    if (o->json)
        printf("%s\n", rep.data);
    else
        print_diagnosis(o, j);
    fflush(stdout);
    cJSON_Delete(j);
    rc = 0;
out:
    curl_slist_free_all(hl);
    if (h)
        curl_easy_cleanup(h);
    free(rep.data);
    curl_global_cleanup();
    return rc;
}

/* ---- main ---------------------------------------------------------------- */

static void on_sigint(int sig)
{
    (void)sig;
    if (g_sigint < 2)
        g_sigint++;
    if (g_sigint >= 2)
        signal(SIGINT, SIG_DFL); /* a third Ctrl-C ends the process at once */
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (o.diagnose)
        return run_diagnose(&o);

    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);

    R.o = &o;
    R.first_id = R.last_id = -1;
    atomic_store(&R.max_id, -1);
    atomic_store(&R.min_id, INT64_MAX);

    pool p = {0};
    double g0 = now_s();
    rc = o.dir ? pool_load_dir(&o, &p) : o.wl->jpeg ? pool_generate_jpeg(&o, &p) : pool_generate(&o, &p);
    if (rc != 0)
        return rc;
    if (o.prepare) {
        printf("%d bodies, %.1f MiB%s%s\n", p.n, (double)p.bytes / 1048576.0, p.jpeg_dir[0] ? ", files in " : "",
               p.jpeg_dir);
        pool_free(&p);
        return 0;
    }
    if (!o.quiet && !g_sigint)
        fprintf(stderr,
                "streamfeed-load: pool of %d %s, %.1f MiB in all (bound --pool-mb %" PRIu64 "), ready in %.2f s; "
                "%d connection%s on %d thread%s to %s\n",
                p.n, o.dir && !p.encoded ? "files" : "bodies", (double)p.bytes / 1048576.0, o.pool_mb, now_s() - g0,
                o.connections, o.connections == 1 ? "" : "s", o.threads, o.threads == 1 ? "" : "s", o.url);
    R.p = &p;

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "streamfeed-load: curl_global_init failed\n");
        pool_free(&p);
        return 1;
    }

    char post_url[2048];
    snprintf(post_url, sizeof post_url, "%s/v1/batches%s", o.url, o.wait ? "?wait=1" : "");
    char auth[1024] = "";
    if (o.token)
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o.token);

    worker workers[MAX_THREADS];
    conn *conns = calloc((size_t)o.connections, sizeof *conns);
    memset(workers, 0, sizeof workers);
    int setup_ok = conns != NULL;
    for (int t = 0; setup_ok && t < o.threads; t++) {
        worker *w = &workers[t];
        w->index = t;
        /* Each worker has its own header list and multi handle: nothing of
         * libcurl's is shared between threads. "Expect:" turns off the
         * 100-continue round trip libcurl would otherwise make per request. */
        struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/vnd.safetensors");
        if (hl)
            hl = curl_slist_append(hl, "Expect:");
        if (hl)
            hl = curl_slist_append(hl, "Accept: application/json");
        if (hl && o.token)
            hl = curl_slist_append(hl, auth);
        w->headers = hl;
        w->multi = curl_multi_init();
        if (!hl || !w->multi) {
            setup_ok = 0;
            break;
        }
        /* Each worker drives one contiguous slice of the connections; the
         * slices differ in size by at most one. */
        w->nconns = o.connections / o.threads + (t < o.connections % o.threads);
    }
    for (int t = 0, at = 0; setup_ok && t < o.threads; t++) {
        worker *w = &workers[t];
        w->conns = &conns[at];
        for (int i = 0; i < w->nconns && setup_ok; i++)
            if (conn_init(&w->conns[i], post_url, w->headers, o.seed ^ (0x5bd1e995ULL * (uint64_t)(at + i + 1))) != 0)
                setup_ok = 0;
        at += w->nconns;
    }

    const bool tty = isatty(STDERR_FILENO) && !o.quiet;
    double t_start = now_s(), secs = 0;
    if (setup_ok && !g_sigint) {
        R.t0 = t_start;
        R.deadline = t_start + o.seconds;
        atomic_store(&R.workers_left, o.threads);
        int started = 0;
        for (int t = 0; t < o.threads; t++) {
            if (pthread_create(&workers[t].tid, NULL, worker_main, &workers[t]) != 0) {
                fprintf(stderr, "streamfeed-load: could not start worker thread %d\n", t);
                atomic_store(&R.stop, 1);
                atomic_fetch_sub(&R.workers_left, o.threads - t);
                break;
            }
            started++;
        }

        poller pl;
        poller_init(&pl, &o);
        uint64_t prev_bytes = 0, prev_acc = 0;
        double last_tick = t_start;
        int sig_seen = 0;
        while (atomic_load(&R.workers_left) > 0) {
            sleep_s(0.05);
            double now = now_s();
            if (g_sigint > sig_seen) {
                /* The handler only counts; the message is printed here. */
                sig_seen = g_sigint;
                if (!o.quiet) {
                    pthread_mutex_lock(&R.mu);
                    msg_locked(sig_seen == 1 ? "streamfeed-load: interrupted; finishing the requests in flight "
                                               "(Ctrl-C again to abort them)\n"
                                             : "streamfeed-load: aborting the requests in flight\n");
                    pthread_mutex_unlock(&R.mu);
                }
            }
            if (now - last_tick < PROGRESS_PERIOD)
                continue;
            if (!o.wait)
                poll_losses(&pl);
            if (tty)
                print_progress(now - t_start, now - last_tick, &prev_bytes, &prev_acc);
            last_tick = now;
        }
        for (int t = 0; t < started; t++)
            pthread_join(workers[t].tid, NULL);
        uint64_t end_ns = atomic_load(&R.t_end_ns);
        secs = end_ns ? (double)end_ns * 1e-9 - t_start : now_s() - t_start;

        /* --drain: wait until the newest accepted batch has trained, so that
         * the summary carries the final loss. */
        if (o.drain && !o.wait && atomic_load(&R.max_id) >= 0) {
            double limit = now_s() + (o.timeout_ms > 0 ? (double)o.timeout_ms : DEFAULT_DRAIN_MS) / 1000.0;
            int64_t last = atomic_load(&R.max_id);
            if (tty) {
                pthread_mutex_lock(&R.mu);
                msg_locked("streamfeed-load: sent; waiting for batch %" PRId64 " to train\n", last);
                pthread_mutex_unlock(&R.mu);
            }
            while (g_sigint == 0 && now_s() < limit) {
                int r = poll_batch(&pl, last);
                if (r == 1 || (r < 0 && pl.failures >= 5))
                    break;
                sleep_s(0.2);
            }
            if (!pl.first_done)
                poll_batch(&pl, atomic_load(&R.min_id));
        } else if (!o.wait && atomic_load(&R.max_id) >= 0) {
            poll_losses(&pl); /* one last look, without waiting */
        }
        poller_free(&pl);
    }

    print_summary(&o, secs);

    for (int t = 0; t < o.threads; t++) {
        for (int i = 0; conns && i < workers[t].nconns; i++)
            conn_free(&workers[t].conns[i]);
        if (workers[t].multi)
            curl_multi_cleanup(workers[t].multi);
        curl_slist_free_all(workers[t].headers);
    }
    free(conns);
    curl_global_cleanup();
    pool_free(&p);

    if (!setup_ok)
        return 1;
    uint64_t sent = atomic_load(&R.sent);
    return sent > 0 && atomic_load(&R.accepted) == sent ? 0 : 1;
}
