/* client/loader.h — what the files of streamfeed-load share: its limits, the
 * workload and option records, the body pool, and a few helpers.
 *
 * streamfeed-load.c holds the run (connections, retries, progress, summary);
 * options.c the command line; body_pool.c the synthetic pool and a --dir of
 * *.safetensors files; jpeg_pool.c the pools of JPEG files (a --dir of class
 * folders, the cache of generated workloads); natural_image.c the images
 * those are made of; diagnose.c --diagnose.
 * Everything here is read-only once the pool is made, except g_sigint.
 */
#ifndef SF_CLIENT_LOADER_H
#define SF_CLIENT_LOADER_H

#include <curl/curl.h>
#include <cjson/cJSON.h>

#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "server/safetensors.h"

/* ---- limits -------------------------------------------------------------- */

#define MAX_CONNECTIONS 256
#define MAX_THREADS 64
#define MAX_POOL 1024
#define MAX_POOL_MB (1024 * 1024)       /* 1 TiB: a sanity bound, not a target */
#define MAX_BATCH 65536                  /* the server's default max N */
#define MAX_RETRIES 1000
#define MAX_DIR_FILES 100000
#define REPLY_CAP (64 * 1024)            /* reply bytes kept per request */
#define MAX_ERROR_CODES 64
#define ERROR_CODE_LEN 64
#define UPLOAD_BUFFER (2L * 1024 * 1024) /* libcurl's largest upload buffer */
#define SEG_BLOCK 32                     /* learnable segmentation: label block edge, pixels */
#define PROGRESS_PERIOD 0.5              /* seconds between progress lines and loss polls */
#define POLL_TIMEOUT_MS 2000             /* one loss poll (GET) at most */
#define DEFAULT_DRAIN_MS 60000           /* --drain without --timeout-ms */

/* ---- workloads (WORKLOADS.md) -------------------------------------------- */

typedef struct workload {
    const char *name;
    int h, w;         /* the image size sent */
    int src_h, src_w; /* the content's resolution; upscaled by nearest to h x w */
    int classes;
    int segmentation; /* 1: labels are [N,H,W] per pixel */
    const char *about;
    int jpeg;         /* 1: JPEG files of h x w, generated once into the cache */
} workload;

#define MAX_SRC_PIXELS (64 * 64) /* content resolution bound of an upscaled workload */
#define MAX_CLASSES 16           /* bound of workload.classes (the hue table) */

/* ---- options ------------------------------------------------------------- */

typedef struct options {
    const char *url;
    const workload *wl;
    int batch;
    uint64_t batches;
    double seconds;     /* > 0: time mode */
    int connections;
    int threads;
    int learnable;
    uint64_t seed;
    const char *dir;
    const char *cache_dir; /* w1-jpeg: where the generated files are kept */
    double rate;        /* > 0: rate limit */
    int pool;
    uint64_t pool_mb;
    sf_st_dtype label_dtype;
    /* --label-dtype auto (the default): label_dtype is the smallest integer
     * type that holds every class index (U8 up to 256 classes), so labels
     * cost the least of the body; per-pixel labels are most of a W2 batch. */
    int label_auto;
    int wait;
    int drain;
    const char *token;
    const char *cacert; /* CA file for https://; NULL: the system's */
    long timeout_ms;
    int retries;
    long max_backoff_ms;
    int json;
    int quiet;
    int diagnose;       /* --diagnose: POST /v1/diagnose and print the table */
    int prepare;        /* --prepare: make the pool and exit */
    /* --dir: the server's bounds on a JPEG file (GET /v1/config before the
     * pool is made; all 0 when it could not be read): a file over them is
     * left out of the pool, named, as the server would refuse it. */
    int64_t srv_max_side, srv_max_pixels, srv_max_batch_pixels, srv_slot_bytes;
} options;

/* ---- the body pool ------------------------------------------------------- */

typedef struct body {
    uint8_t *data;
    size_t len;
    /* A --dir body: its files' paths, in the body's order (NULL otherwise),
     * and the server's id of its first accepted send (0 until then): its
     * result names the files the service could not decode and left out. */
    char **paths;
    int npaths;
    _Atomic int64_t first_id;
} body;

typedef struct pool {
    body *b;
    int n;
    size_t bytes;
    int encoded; /* bodies of JPEG files (made from --dir class folders or w1-jpeg) */
    char jpeg_dir[PATH_MAX]; /* the folder the JPEG files were read from ("" for other pools): --prepare prints it */
    const char *labels; /* the labels' dtype name as sent ("U8"), NULL when the bodies came made */
} pool;

void pool_free(pool *p);

/* ---- helpers ------------------------------------------------------------- */

/* SIGINTs received (the handler counts them; generation and the run stop). */
extern volatile sig_atomic_t g_sigint;

/* Monotonic seconds. */
double now_s(void);

/* splitmix64: a fast, well-mixed 64-bit generator; good enough for pixels. */
static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Writes a little-endian integer label of the given dtype at element i. */
void put_label(uint8_t *dst, size_t i, sf_st_dtype dt, int64_t v);

/* The smallest label dtype that holds class indices 0..classes-1. */
sf_st_dtype label_dtype_for(int64_t classes);

/* --learnable: the colour of each class, which the images are tinted with. */
void class_hues(uint8_t hue[MAX_CLASSES][3], int classes);

/* ---- what each file offers the others ----------------------------------- */

/* options.c: fills o from argv. Returns -1 to go on, else the exit status. */
int parse_args(int argc, char **argv, options *o);

/* options.c: prints text from column indent (the cursor is there already),
 * breaking lines at spaces before column width. */
void print_wrapped(FILE *f, const char *text, int indent, int width);

/* body_pool.c: the synthetic pool, min(--pool, what fits in --pool-mb)
 * bodies; and the *.safetensors files of --dir (or, without any, its JPEG
 * class folders). Each returns 0, 1 on a runtime failure, 2 on a usage error. */
int pool_generate(const options *o, pool *out);
int pool_load_dir(const options *o, pool *out);

/* diagnose.c: one POST /v1/diagnose, printed. Returns the exit status. */
int run_diagnose(const options *o);

/* streamfeed-load.c: online CPUs, 1..1024. */
int online_cpus(void);

/* streamfeed-load.c: the number under key k of a JSON object, else dflt. */
double json_num(const cJSON *o, const char *k, double dflt);

/* streamfeed-load.c: {"error":{"code","message"}} of an error reply, else
 * http_<status>; *retry_ms gets its optional retry_after_ms, else 0. */
void read_error_reply(const char *text, size_t len, long status, char *code, size_t code_cap, char *message,
                      size_t msg_cap, long *retry_ms);

/* A reply's first REPLY_CAP bytes (data holds REPLY_CAP + 1, for a NUL). */
typedef struct reply_buf {
    char *data;
    size_t len;
} reply_buf;

/* streamfeed-load.c: libcurl's write callback into a reply_buf (its
 * CURLOPT_WRITEDATA); what does not fit is read and dropped. */
size_t reply_buf_write(char *ptr, size_t size, size_t nmemb, void *userdata);

/* streamfeed-load.c: https:// is verified against --cacert, or the system's CAs. */
CURLcode set_tls(CURL *h, const options *o);

#endif
