/* client/jpeg_pool.c — see jpeg_pool.h. */
#include "client/jpeg_pool.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <turbojpeg.h>

#include "client/natural_image.h"
#include "server/image_header.h"

/* A body of the encoded form: files_offsets I64 [N+1], labels [N], files U8
 * [total] (the order Python's safetensors writes, offsets first, so the
 * server checks each file as soon as it has arrived). */

typedef struct jfile {
    char *path;
    int label;
} jfile;

/* snprintf for paths; -1 when the result would not fit. */
static int pathf(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int pathf(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* .jpg, .jpeg, .png or .webp in any case: the formats the service decodes,
 * among the extensions torchvision's ImageFolder takes. */
static int is_image_name(const char *n)
{
    size_t l = strlen(n);
    return (l > 4 && (strcasecmp(n + l - 4, ".jpg") == 0 || strcasecmp(n + l - 4, ".png") == 0)) ||
           (l > 5 && (strcasecmp(n + l - 5, ".jpeg") == 0 || strcasecmp(n + l - 5, ".webp") == 0));
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void jfiles_free(jfile *f, int n)
{
    for (int i = 0; i < n; i++)
        free(f[i].path);
    free(f);
}

/* Folders below a class folder are followed this deep at most (symbolic
 * links are followed, as torchvision's os.walk(followlinks=True) does, so a
 * link cycle must end somewhere). */
#define MAX_DIR_DEPTH 16

/* Appends the image files (.jpg, .jpeg, .png, .webp) under dir (its subfolders included, as
 * torchvision's ImageFolder walks them) with this label. Returns 0 or -1. */
static int add_class_files(const char *dir, int label, int depth, jfile **f, int *n, int *cap)
{
    struct dirent **ents = NULL;
    int ne = scandir(dir, &ents, NULL, alphasort), rc = 0;
    for (int e = 0; e < ne; e++) {
        const char *dn = ents[e]->d_name;
        char p[PATH_MAX];
        struct stat st;
        if (rc != 0 || *n >= MAX_DIR_FILES || strcmp(dn, ".") == 0 || strcmp(dn, "..") == 0 ||
            pathf(p, sizeof p, "%s/%s", dir, dn) || stat(p, &st) != 0) {
            free(ents[e]);
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            if (depth < MAX_DIR_DEPTH)
                rc = add_class_files(p, label, depth + 1, f, n, cap);
        } else if (S_ISREG(st.st_mode) && is_image_name(dn)) {
            if (*n == *cap) {
                int nc = *cap ? *cap * 2 : 256;
                jfile *nf = realloc(*f, (size_t)nc * sizeof **f);
                if (nf) {
                    *f = nf;
                    *cap = nc;
                } else {
                    rc = -1;
                }
            }
            if (rc == 0) {
                (*f)[*n].path = strdup(p);
                (*f)[*n].label = label;
                if (!(*f)[*n].path)
                    rc = -1;
                else
                    (*n)++;
            }
        }
        free(ents[e]);
    }
    free(ents);
    return rc;
}

/* The JPEG files of an ImageFolder layout, root/<class>/.../<file>.jpg:
 * classes are the subfolders in sorted order (label 0 first), as
 * torchvision's ImageFolder numbers them. Returns the count (0: none), or
 * -1. */
static int list_image_folder(const char *root, int quiet, jfile **out, int *nclasses)
{
    struct dirent **cls = NULL;
    int nc = scandir(root, &cls, NULL, alphasort), n = 0, cap = 0, k = 0, rc = 0;
    jfile *f = NULL;
    *nclasses = 0;
    if (nc < 0)
        return -1;
    for (int c = 0; c < nc && rc == 0; c++) {
        char sub[PATH_MAX];
        /* Hidden folders are classes too (a stray .ipynb_checkpoints shifts
         * every label after it), as torchvision numbers them: the labels
         * must match those of an ImageFolder over the same folder. */
        const char *dn = cls[c]->d_name;
        if (strcmp(dn, ".") == 0 || strcmp(dn, "..") == 0 || pathf(sub, sizeof sub, "%s/%s", root, dn) ||
            !is_dir(sub))
            continue;
        const int before = n;
        rc = add_class_files(sub, k, 0, &f, &n, &cap);
        if (rc == 0 && n == before && n < MAX_DIR_FILES && !quiet)
            fprintf(stderr,
                    "streamfeed-load: class folder %s holds no image file (.jpg, .jpeg, .png, .webp); it still counts "
                    "as class %d, as "
                    "torchvision's ImageFolder numbers the classes (which refuses such a folder)\n",
                    sub, k);
        k++;
    }
    for (int c = 0; c < nc; c++)
        free(cls[c]);
    free(cls);
    if (rc != 0) {
        jfiles_free(f, n);
        return -1;
    }
    *out = f;
    *nclasses = k;
    return n;
}

static uint8_t *read_whole(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f)
        return NULL;
    uint8_t *b = NULL;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        b = malloc((size_t)st.st_size);
        if (b && fread(b, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
            free(b);
            b = NULL;
        }
        *len = (size_t)st.st_size;
    }
    fclose(f);
    return b;
}

/* Why the service would refuse the file data[0, len) (empty, of no format it
 * decodes, cut short, 12-bit, ...: its own header check, with its size bounds when
 * o has them from GET /v1/config), into why; 0 when it would take it. */
static int refused_file(const options *o, const uint8_t *data, size_t len, char *why, size_t cap)
{
    if (o->srv_slot_bytes > 0 && len > (uint64_t)o->srv_slot_bytes) {
        snprintf(why, cap, "body_too_large: the file alone (%zu bytes) is more than a batch body may hold "
                 "(ring.slot_bytes is %" PRId64 ")", len, o->srv_slot_bytes);
        return 1;
    }
    const sf_jpeg_limits lim = {(int)o->srv_max_side, o->srv_max_pixels};
    sf_jpeg_info info;
    char msg[SF_JPEG_MSG_CAP];
    sf_jpeg_error e = sf_image_header_parse(data, len, &lim, &info, msg, sizeof msg);
    if (e != SF_JPEG_OK) {
        snprintf(why, cap, "%s: %s", sf_jpeg_error_name(e), msg);
        return 1;
    }
    if (o->srv_max_batch_pixels > 0 && (int64_t)info.h * info.w > o->srv_max_batch_pixels) {
        snprintf(why, cap, "jpeg_batch_too_large: the image alone has %lld pixels; jpeg.max_batch_pixels is %" PRId64,
                 (long long)info.h * info.w, o->srv_max_batch_pixels);
        return 1;
    }
    return 0;
}

/* Files left out of the pool, one line each up to this many, then a count. */
#define LEFT_OUT_LINES 10

/* Builds the pool from the files: shuffled by --seed (a class-sorted order
 * would give single-class batches), then cut into batches of --batch, the
 * last one filled from the start again; at most MAX_POOL bodies and
 * --pool-mb. A file that cannot be read or that the service would refuse
 * (real data sets hold a few: ImageNet's CMYK JPEGs, its PNG named .JPEG)
 * is left out, said on stderr, and the next file takes its place: one bad
 * file would otherwise have its whole batch refused at every send. Returns
 * 0, 1 or 2. */
static int pool_from_jpegs(const options *o, jfile *f, int n, pool *out)
{
    uint64_t s = o->seed * 0x9e3779b97f4a7c15ULL + 17;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_next(&s) % (uint64_t)(i + 1));
        jfile t = f[i];
        f[i] = f[j];
        f[j] = t;
    }
    const int bsz = o->batch;
    int nb = (n + bsz - 1) / bsz;
    if (nb > MAX_POOL)
        nb = MAX_POOL;
    out->b = calloc((size_t)nb, sizeof *out->b);
    uint8_t **data = calloc((size_t)bsz, sizeof *data);
    size_t *lens = calloc((size_t)bsz, sizeof *lens);
    int64_t *off = calloc((size_t)bsz + 1, sizeof *off);
    const jfile **used = calloc((size_t)bsz, sizeof *used); /* the files of the batch being made */
    uint8_t *labels = calloc((size_t)bsz, 8);
    int rc = out->b && data && lens && off && labels && used ? 0 : 1;
    out->encoded = 1;
    out->labels = sf_st_dtype_name(o->label_dtype);
    const uint64_t capb = o->pool_mb * 1024 * 1024;
    size_t next = 0;     /* the next file to take, modulo n */
    int left_out = 0;    /* distinct files left out */
    size_t bad_run = 0;  /* files left out in a row: n of them means none is usable */
    for (int b = 0; rc == 0 && b < nb; b++) {
        size_t total = 0;
        for (int i = 0; rc == 0 && i < bsz;) {
            const int first_pass = next < (size_t)n;
            const jfile *jf = &f[next++ % (size_t)n];
            char why[SF_JPEG_MSG_CAP + 40] = "";
            lens[i] = 0;
            errno = 0;
            data[i] = read_whole(jf->path, &lens[i]);
            if (!data[i])
                snprintf(why, sizeof why, "cannot read it (%s)", errno ? strerror(errno) : "empty");
            else if (refused_file(o, data[i], lens[i], why, sizeof why))
                free(data[i]), data[i] = NULL;
            if (!data[i]) {
                if (first_pass && ++left_out <= LEFT_OUT_LINES && !o->quiet)
                    fprintf(stderr, "streamfeed-load: leaving out %s: %s\n", jf->path, why);
                if (++bad_run >= (size_t)n) {
                    fprintf(stderr, "streamfeed-load: no file of the %d is one the service can decode (the last: "
                                    "%s: %s)\n", n, jf->path, why);
                    rc = 2;
                }
                continue;
            }
            bad_run = 0;
            used[i] = jf;
            off[i] = (int64_t)total;
            total += lens[i];
            put_label(labels, (size_t)i, o->label_dtype, jf->label);
            i++;
        }
        off[bsz] = (int64_t)total;
        sf_st_tensor_desc t[3] = {
            {.name = "files_offsets", .dtype = SF_ST_I64, .ndim = 1, .shape = {bsz + 1}},
            {.name = "labels", .dtype = o->label_dtype, .ndim = 1, .shape = {bsz}},
            {.name = "files", .dtype = SF_ST_U8, .ndim = 1, .shape = {(int64_t)total}},
        };
        size_t hl = rc == 0 ? sf_st_header_build(NULL, 0, t, 3, NULL) : 0;
        size_t lb = (size_t)bsz * (size_t)sf_st_dtype_size(o->label_dtype);
        size_t len = hl + 8 * ((size_t)bsz + 1) + lb + total;
        if (rc == 0 && (hl == 0 || out->bytes + len > capb)) {
            if (out->n == 0) {
                fprintf(stderr, "streamfeed-load: one batch of JPEG files is larger than --pool-mb %" PRIu64 "\n",
                        o->pool_mb);
                rc = 2;
            } else if (!o->quiet) {
                fprintf(stderr, "streamfeed-load: using the first %d of %d batches (--pool-mb %" PRIu64 ")\n",
                        out->n, nb, o->pool_mb);
            }
            for (int i = 0; i < bsz; i++)
                free(data[i]), data[i] = NULL;
            break;
        }
        uint8_t *body = rc == 0 ? malloc(len) : NULL;
        if (rc == 0 && !body)
            rc = 1;
        if (rc == 0) {
            sf_st_header_build((char *)body, hl, t, 3, NULL);
            uint8_t *p = body + hl;
            for (int i = 0; i <= bsz; i++, p += 8)
                for (int k = 0; k < 8; k++)
                    p[k] = (uint8_t)((uint64_t)off[i] >> (8 * k));
            memcpy(p, labels, lb);
            p += lb;
            for (int i = 0; i < bsz; i++) {
                memcpy(p, data[i], lens[i]);
                p += lens[i];
            }
            out->b[out->n].data = body;
            out->b[out->n].len = len;
            /* The paths, so that a file the service leaves out is named. */
            out->b[out->n].paths = calloc((size_t)bsz, sizeof(char *));
            for (int i = 0; out->b[out->n].paths && i < bsz; i++)
                if ((out->b[out->n].paths[i] = strdup(used[i]->path)) != NULL)
                    out->b[out->n].npaths = i + 1;
            out->n++;
            out->bytes += len;
        }
        for (int i = 0; i < bsz; i++)
            free(data[i]), data[i] = NULL;
    }
    free(data);
    free(lens);
    free(off);
    free(labels);
    free(used);
    if (rc == 0 && left_out > 0 && !o->quiet)
        fprintf(stderr, "streamfeed-load: left out %d of the %d files the pool read (unreadable, or refused by "
                        "the service's header check)\n", left_out, next < (size_t)n ? (int)next : n);
    if (rc != 0)
        pool_free(out);
    return rc;
}

int pool_load_jpeg_dir(const options *o, const char *root, pool *out)
{
    jfile *f = NULL;
    int nclasses = 0;
    int n = list_image_folder(root, o->quiet, &f, &nclasses);
    if (n < 0) {
        fprintf(stderr, "streamfeed-load: --dir %s: %s\n", root, strerror(errno));
        return 2;
    }
    if (n == 0) {
        fprintf(stderr,
                "streamfeed-load: --dir %s holds no *.safetensors file and no class folder of image files "
                "(PATH/<class>/<name>.jpg, .jpeg, .png or .webp)\n",
                root);
        return 2;
    }
    if (!o->quiet)
        fprintf(stderr, "streamfeed-load: %d image files in %d class folders of %s\n", n, nclasses, root);
    snprintf(out->jpeg_dir, sizeof out->jpeg_dir, "%s", root);
    /* The folders, not the workload, say how many classes there are. */
    options with_labels = *o;
    if (o->label_auto)
        with_labels.label_dtype = label_dtype_for(nclasses);
    int rc = pool_from_jpegs(&with_labels, f, n, out);
    jfiles_free(f, n);
    return rc;
}

/* Where w1-jpeg keeps its files: --cache-dir, else $XDG_CACHE_HOME/streamfeed,
 * ~/.cache/streamfeed, or /tmp/streamfeed-cache. */
static void cache_root(const options *o, char *out, size_t cap)
{
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (o->cache_dir)
        snprintf(out, cap, "%s", o->cache_dir);
    else if (x && *x)
        snprintf(out, cap, "%s/streamfeed", x);
    else if (home && *home)
        snprintf(out, cap, "%s/.cache/streamfeed", home);
    else
        snprintf(out, cap, "/tmp/streamfeed-cache");
}

static int mkdir_p(const char *path)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (char *q = p + 1; *q; q++) {
        if (*q == '/') {
            *q = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return -1;
            *q = '/';
        }
    }
    return mkdir(p, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

int pool_generate_jpeg(const options *o, pool *out)
{
    const workload *wl = o->wl;
    const int count = o->pool * o->batch;
    char root[PATH_MAX - 128], dir[PATH_MAX], tmp[PATH_MAX];
    cache_root(o, root, sizeof root);
    if (pathf(dir, sizeof dir, "%s/%s-%dx%d-q90-s%" PRIu64 "-n%d%s", root, wl->name, wl->h, wl->w, o->seed,
              count, o->learnable ? "-learnable" : "")) {
        fprintf(stderr, "streamfeed-load: the cache path under %s is too long\n", root);
        return 2;
    }
    if (!is_dir(dir)) {
        double t0 = now_s();
        if (pathf(tmp, sizeof tmp, "%s.tmp-%ld", dir, (long)getpid())) {
            fprintf(stderr, "streamfeed-load: the cache path %s is too long\n", dir);
            return 2;
        }
        uint8_t hue[MAX_CLASSES][3];
        class_hues(hue, wl->classes);
        uint8_t *px = malloc((size_t)wl->h * (size_t)wl->w * 3);
        tjhandle tj = tjInitCompress();
        int rc = px && tj && mkdir_p(tmp) == 0 ? 0 : 1;
        for (int k = 0; rc == 0 && k < wl->classes; k++) {
            char cdir[PATH_MAX];
            rc = pathf(cdir, sizeof cdir, "%s/%d", tmp, k) == 0 && mkdir(cdir, 0755) == 0 ? 0 : 1;
        }
        for (int i = 0; rc == 0 && i < count && !g_sigint; i++) {
            int cls = i % wl->classes;
            natural_image(px, wl->h, wl->w, o->seed * 0x100000001b3ULL ^ ((uint64_t)i << 20),
                          o->learnable ? hue[cls] : NULL);
            unsigned char *jpg = NULL;
            unsigned long len = 0;
            if (tjCompress2(tj, px, wl->w, wl->w * 3, wl->h, TJPF_RGB, &jpg, &len, TJSAMP_420, 90, 0) != 0) {
                fprintf(stderr, "streamfeed-load: JPEG encode failed: %s\n", tjGetErrorStr2(tj));
                rc = 1;
                break;
            }
            char p[PATH_MAX];
            FILE *f = pathf(p, sizeof p, "%s/%d/%06d.jpg", tmp, cls, i) ? NULL : fopen(p, "wb");
            if (!f || fwrite(jpg, 1, len, f) != len)
                rc = 1;
            if (f && fclose(f) != 0)
                rc = 1;
            tjFree(jpg);
        }
        if (tj)
            tjDestroy(tj);
        free(px);
        if (rc != 0 || g_sigint || rename(tmp, dir) != 0) {
            fprintf(stderr, "streamfeed-load: could not generate %s: %s\n", dir, strerror(errno));
            return 1;
        }
        if (!o->quiet)
            fprintf(stderr, "streamfeed-load: generated %d JPEG files in %s (%.1f s)\n", count, dir, now_s() - t0);
    }
    return pool_load_jpeg_dir(o, dir, out);
}
