/* client/options.c — streamfeed-load's command line: the workloads it can
 * send, one table of options that drives both getopt_long and --help, and
 * their parsing and bounds. parse_args fills the options record that every
 * other file of the loader reads and none writes.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/loader.h"

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

/* The build names the version (git describe) and the commit; a build without
 * them (a compiler called by hand) says so rather than failing. */
#ifndef SF_VERSION
#define SF_VERSION "unknown"
#endif
#ifndef SF_COMMIT
#define SF_COMMIT "unknown"
#endif

/* ---- options: one table drives getopt_long and --help -------------------- */

enum {
    OPT_URL = 'u', OPT_WORKLOAD = 'w', OPT_BATCH = 'b', OPT_BATCHES = 'n', OPT_SECONDS = 's',
    OPT_CONNECTIONS = 'c', OPT_JSON = 'j', OPT_QUIET = 'q', OPT_HELP = 'h',
    OPT_THREADS = 256, OPT_LEARNABLE, OPT_SEED, OPT_DIR, OPT_RATE, OPT_POOL, OPT_POOL_MB,
    OPT_LABEL_DTYPE, OPT_WAIT, OPT_DRAIN, OPT_TOKEN, OPT_TIMEOUT_MS, OPT_RETRIES,
    OPT_MAX_BACKOFF_MS, OPT_DIAGNOSE, OPT_CACHE_DIR, OPT_PREPARE, OPT_CACERT, OPT_VERSION,
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
    {"label-dtype", 1, OPT_LABEL_DTYPE, "T", "auto | i64 | i32 | u8 (default auto: the smallest that holds the classes)"},
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
    {"version", 0, OPT_VERSION, NULL, "print the version and commit, as streamfeed --version does"},
};
#define N_OPTS ((int)(sizeof OPTS / sizeof OPTS[0]))

sf_st_dtype label_dtype_for(int64_t classes)
{
    return classes <= 256 ? SF_ST_U8 : classes <= INT32_MAX ? SF_ST_I32 : SF_ST_I64;
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

/* ---- command line -------------------------------------------------------- */

/* Prints text from column indent (the cursor is there already), breaking
 * lines at spaces before column width. */
void print_wrapped(FILE *f, const char *text, int indent, int width)
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

/* What parse_args tracks across options besides o itself. */
typedef struct seen_options {
    bool batches, seconds; /* --batches, --seconds given */
    int threads;           /* --threads, 0 when not given */
} seen_options;

/* Applies option ch with argument a (optarg) to o. Returns -1 to go on,
 * else the exit status. */
static int apply_option(int ch, const char *a, options *o, seen_options *seen, char **argv)
{
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
        seen->batches = true;
        break;
    case OPT_SECONDS:
        if (parse_double(a, 0.001, 1e7, &o->seconds))
            return usage_error("--seconds must be a number in 0.001..1e7");
        seen->seconds = true;
        break;
    case OPT_CONNECTIONS:
        if (parse_int(a, 1, MAX_CONNECTIONS, &o->connections))
            return usage_error("--connections must be an integer in 1..%d", MAX_CONNECTIONS);
        break;
    case OPT_THREADS:
        if (parse_int(a, 1, MAX_THREADS, &seen->threads))
            return usage_error("--threads must be an integer in 1..%d", MAX_THREADS);
        break;
    case OPT_LEARNABLE:
        o->learnable = 1;
        break;
    case OPT_SEED:
        if (parse_u64(a, 0, UINT64_MAX, &o->seed))
            return usage_error("--seed must be a non-negative integer");
        break;
    case OPT_DIR: {
        /* "train/" as a shell completes it: paths are joined with '/',
         * so the files would read train//class/x.jpg in messages. */
        size_t n = strlen(optarg); /* argv's strings are the program's to modify */
        while (n > 1 && optarg[n - 1] == '/')
            optarg[--n] = '\0';
        o->dir = optarg;
        break;
    }
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
        o->label_auto = strcmp(a, "auto") == 0;
        if (o->label_auto)
            break; /* resolved once the workload is known */
        if (strcmp(a, "i64") == 0)
            o->label_dtype = SF_ST_I64;
        else if (strcmp(a, "i32") == 0)
            o->label_dtype = SF_ST_I32;
        else if (strcmp(a, "u8") == 0)
            o->label_dtype = SF_ST_U8;
        else
            return usage_error("--label-dtype must be auto, i64, i32 or u8, not '%s'", a);
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
    case OPT_VERSION:
        printf("streamfeed-load %s (commit %s)\n", SF_VERSION, SF_COMMIT);
        return 0;
    default:
        if (optopt && optopt < 256 && optopt != '?')
            return usage_error("option -%c is unknown or needs a value", optopt);
        return usage_error("unknown option or missing value: %s", argv[optind - 1]);
    }
    return -1;
}

/* Fills o from argv. Returns -1 to go on, else the exit status. */
int parse_args(int argc, char **argv, options *o)
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
        .connections = 4, .seed = 1, .pool = 8, .pool_mb = 2048, .label_dtype = SF_ST_U8, .label_auto = 1,
        .timeout_ms = 120000, .retries = 20, .max_backoff_ms = 5000, .token = getenv("STREAMFEED_TOKEN"),
    };
    seen_options seen = {0};
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, so, lo, NULL)) != -1) {
        const int rc = apply_option(ch, optarg, o, &seen, argv);
        if (rc != -1)
            return rc;
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (o->label_auto)
        o->label_dtype = label_dtype_for(o->wl->classes);
    if (seen.batches && seen.seconds)
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
    int threads = seen.threads;
    if (threads == 0) {
        threads = online_cpus() / 2;
        threads = threads < 1 ? 1 : threads > 8 ? 8 : threads;
    }
    o->threads = threads > o->connections ? o->connections : threads;
    return -1;
}
