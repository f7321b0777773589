/* server/config.h — the one table of every option.
 *
 * Every option is one row of a typed table (config.c: sf_config_table): its
 * dotted name, type, default, bounds, whether it can change at run time (hot)
 * or only at the next start (restart), and its help text. --help, validation,
 * GET /v1/config, the environment names and the README's table all come from
 * that table.
 *
 * Files: config.c holds the table and the preset recipes; config_checks.c the
 * checks across options that rows name; config_load.c the setters and the
 * loader (defaults, file, environment, command line); config_render.c JSON,
 * --help, markdown and OpenAPI; config_live.c the live copy and PATCH;
 * config_impl.h what those files share.
 *
 * Sources, later ones winning: defaults -> JSON file (--config) -> environment
 * (STREAMFEED_HTTP_PORT for http.port) -> command-line flags (--http.port 8080).
 *
 * The effective configuration is a plain struct (sf_config). The live copy is
 * owned by this module behind a lock: readers take a snapshot
 * (sf_config_get), and PATCH goes through sf_config_patch, which validates the
 * whole result before changing anything. Restart-only fields that a PATCH
 * changes are kept as "pending" and reported, but not applied.
 */
#ifndef SF_CONFIG_H
#define SF_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#define SF_CFG_STR 256
#define SF_CFG_JSON 8192
/* model.spec: an exported torchvision model's layer list runs to ~60 KB
 * (densenet121's 430 layers), so sf_config is ~160 KB: code that runs per
 * batch or per body chunk reads it through sf_config_cur() (a per-thread
 * copy, refreshed on change) rather than copying it. */
#define SF_CFG_SPEC_JSON (128 * 1024)

typedef struct sf_config {
    struct {
        char host[64];
        int port;
        int threads;
        int max_connections;
        int connection_timeout_s;
        int header_timeout_s;
        int max_header_bytes;
        int64_t max_json_bytes;
        char token[SF_CFG_STR];
        int max_json_depth;
        int metrics_port;              /* 0: no probe/metrics listener */
        int64_t upload_min_bytes_per_s; /* 0: no minimum rate */
        int upload_deadline_s;         /* 0: no deadline */
        char tls_cert[1024];           /* PEM paths; both empty: plain HTTP */
        char tls_key[1024];
        char tls_priorities[512];      /* GnuTLS priority string of the HTTPS port */
    } http;
    struct {
        int slots;
        int64_t slot_bytes;
        char full_policy[16];   /* block | reject */
        int full_timeout_ms;
        int retry_after_s;
    } ring;
    struct {
        char mode[16];          /* train | sink */
        char backend[16];       /* auto | ref | cuda */
        int device;
        int overlap;
        int cuda_graphs;
        char layout[8];         /* auto | nchw | nhwc */
        int cudnn_tune_configs;
        int jobs_max;
        int wait_timeout_ms;
    } pipeline;
    struct {
        double default_seconds; /* POST /v1/diagnose without "seconds" (capped at max_seconds) */
        double max_seconds;     /* longest run a request may ask for */
    } diagnose;
    struct {
        int gpu_sample_ms;      /* NVML sampling interval; 0 off */
    } metrics;
    struct {
        char preset[32];
        char spec[SF_CFG_SPEC_JSON]; /* JSON layer list; overrides preset when set */
        char precision[16];     /* fp32 | tf32 | bf16 */
        int64_t seed;
        int max_batch;
        char freeze[48];        /* layer-name prefix of the frozen leading layers; "" none */
        int grad_accum_steps;   /* optimizer step every k batches */
    } model;
    struct {
        char name[16];          /* sgd | adamw */
        double lr;
        double momentum;
        double weight_decay;
        double beta1, beta2, eps; /* AdamW */
        char schedule[16];        /* constant|step|multistep|cosine|one_cycle (server/lr_schedule.h) */
        int64_t step_size;        /* step */
        double gamma;             /* step, multistep */
        char milestones[1024];    /* multistep: JSON list of optimizer steps */
        int64_t t_max;            /* cosine */
        double eta_min;           /* cosine */
        double max_lr, pct_start; /* one_cycle */
        int64_t total_steps;      /* one_cycle */
        double div_factor, final_div_factor; /* one_cycle */
        int64_t warmup_steps;     /* linear warmup in front; 0: none */
        double warmup_start_factor;
        double clip_grad_norm;    /* 0: off; else clip_grad_norm_'s max_norm */
    } optim;
    struct {
        double label_smoothing;   /* CrossEntropyLoss label_smoothing, [0, 1) */
    } loss;
    struct {
        int max_nonfinite_in_row; /* consecutive skipped steps that make readyz false ("diverged") */
    } train;
    struct {
        int max_names;            /* distinct evaluation names (GET /v1/evals) */
        int name_idle_s;          /* a finished name this long untouched may be evicted for a new one */
        int logits_keep_s;        /* a timed-out ?return=logits keeps its logits this long */
        int logits_keep_max;      /* ... for at most this many batches */
        int64_t logits_keep_bytes; /* ... in at most this many bytes (and no larger logits) */
    } eval;
    struct {
        char pipeline[SF_CFG_JSON]; /* JSON list of ops (gpu/aug.h); "": the preset's recipe */
        char eval_pipeline[SF_CFG_JSON]; /* deterministic ops only; "": the preset's recipe */
        int64_t seed;
    } augment;
    struct {
        int max_n, max_h, max_w;
        int max_tensor_header_bytes;
    } limits;
    struct {
        int max_side;            /* largest JPEG height or width */
        int64_t max_pixels;      /* largest h*w of one JPEG */
        int64_t max_batch_pixels; /* largest sum of h*w over a batch's JPEGs: sizes the decode
                                     buffers; 0 turns encoded batches off */
        char decoder[16];        /* auto | hardware | gpu_hybrid | hybrid (CUDA) */
    } jpeg;
    struct {
        char on_undecodable[8];  /* skip | fail */
        char exif_orientation[8]; /* ignore | apply */
    } decode;
    struct {
        char level[16];
        char format[16];        /* text | json */
        int requests;
        int probes; /* log /healthz, /readyz, /metrics requests too */
    } log;
    struct {
        int grace_s;
    } shutdown;
    struct {
        char dir[1024];         /* checkpoint files; "" disables file checkpoints */
        int64_t every_steps;    /* periodic save every N steps; 0 off */
        int keep;               /* ckpt-<step>.safetensors files kept */
        char resume[16];        /* false | true | if_compatible */
        int on_shutdown;
        int64_t max_bytes;      /* PUT body, file read, URL download */
        int url_timeout_s;
        char url_token[2048];
        char url_allow[2048];   /* hosts, networks, URL prefixes a request's URL may name */
        char init_from[2048];   /* model.init_from: path or URL of a state_dict */
    } checkpoint;
    struct {
        int world_size;         /* ranks of the data-parallel job; 1: one process, no collectives */
        int rank;               /* this process's rank; -1 before the loader derives it */
        char rendezvous[256];   /* host:port of rank 0's HTTP listener */
        char host[256];         /* address this rank's collective listens on; "": the host name */
        int verify_every;       /* parameter digest compared every N steps; 0 off */
        int wait_ms;            /* a rank without a batch waits this long before an empty round */
        int join_timeout_s;     /* every rank must join within this */
        int timeout_s;          /* bound of one collective call once joined */
        int bucket_mb;          /* CUDA: gradient all-reduce bucket size, MiB */
        char batchnorm[16];     /* broadcast | local: batchnorm running statistics across ranks */
        int allow_no_token;     /* 1: a job of world_size > 1 may start without http.token */
    } distributed;
} sf_config;

typedef enum sf_cfg_type { SF_CT_INT, SF_CT_INT64, SF_CT_DOUBLE, SF_CT_BOOL, SF_CT_STRING, SF_CT_ENUM, SF_CT_JSON } sf_cfg_type;

enum {
    SF_CF_HOT = 1,       /* applied at once by PATCH */
    SF_CF_SENSITIVE = 2, /* never shown: GET /v1/config prints "***" when set */
    /* PATCH may change it only on a service that has http.token already:
     * on an open one, any client could otherwise close it to everyone else
     * (http.token) or open the checkpoint URL guard to itself
     * (checkpoint.url_allow). Set at start (flag, file, env) it works as any. */
    SF_CF_NEEDS_TOKEN = 4,
    /* May be a URL with credentials (user:password@, a signed query): GET
     * shows it as the logs do, without them; that text sent back keeps the
     * value. */
    SF_CF_URL = 8,
    /* Names a place the service reads, writes, connects to or listens on: a
     * file, a directory, a URL or a network address. PATCH may change it only
     * on a service that has http.token, as SF_CF_NEEDS_TOKEN: on an open one
     * any client could point checkpoint writes at any directory, the next
     * start's weights at its own file, or the service at its own peer. */
    SF_CF_LOCATION = 16,
};
/* The flags that keep PATCH of an option to a service with http.token. */
#define SF_CF_PATCH_NEEDS_TOKEN (SF_CF_NEEDS_TOKEN | SF_CF_LOCATION)

typedef struct sf_cfg_option {
    const char *name;    /* dotted: "http.port" */
    sf_cfg_type type;
    size_t offset, size; /* field in sf_config */
    const char *def;     /* default, as text (parsed like an env value) */
    double min, max;     /* numeric bounds (inclusive); strings: max length from size */
    const char *choices; /* SF_CT_ENUM: "a|b|c" */
    unsigned flags;
    /* Optional semantic check of the value in the context of the whole
     * config (e.g. a JSON model spec that must parse). 0 ok, else -1 + err. */
    int (*check)(const struct sf_config *c, char *err, size_t errlen);
    const char *help;
} sf_cfg_option;

extern const sf_cfg_option sf_config_table[];
extern const size_t sf_config_table_len;

const sf_cfg_option *sf_config_find(const char *name);
/* The option a mistyped name most likely meant ("port" -> http.port,
 * "ring.slot" -> ring.slots), or NULL when none is close. */
const sf_cfg_option *sf_config_suggest(const char *name);

/* The augmentation pipelines in force: augment.pipeline / eval_pipeline when
 * set, else the recipe of model.preset (a model.spec model: [] for both). */
const char *sf_config_train_pipeline(const sf_config *c);
const char *sf_config_eval_pipeline(const sf_config *c);

/* The model the configuration names: model.spec when set, else model.preset
 * (model.freeze not applied). 0, or -1 with err. */
struct sf_model;
int sf_config_model(const sf_config *c, struct sf_model *m, char *err, size_t errlen);

/* Fills c with every default. */
void sf_config_defaults(sf_config *c);
/* Sets one option from text (env/flag syntax). 0, or -1 with err naming the option. */
int sf_config_set_text(sf_config *c, const char *name, const char *value, char *err, size_t errlen);
/* Applies a nested JSON object {"http":{"port":8080}} (file syntax; merge-patch
 * semantics: null resets an option to its default). Unknown keys, wrong types
 * and out-of-range values fail naming the field; on failure c may be partly
 * changed, so callers apply to a copy. changed (optional) receives the names. */
int sf_config_apply_json(sf_config *c, const cJSON *obj, char *err, size_t errlen, char *field,
                         size_t fieldlen);
/* Runs every option's bounds and semantic checks on a complete config. */
int sf_config_validate(const sf_config *c, char *err, size_t errlen, char *field, size_t fieldlen);
/* Loads defaults, then the file (if path), env, then argv flags. --help prints
 * usage and returns 1; errors return -1 with err. *config_path gets --config. */
int sf_config_load(sf_config *c, int argc, char **argv, char *err, size_t errlen);
/* The warnings of the last sf_config_load about STREAMFEED_* variables that
 * name no option, each with the option meant where one is close: at most max
 * into out (text owned by the loader). Returns how many. */
int sf_config_env_warnings(const char *out[], int max);
/* Nested JSON of the config; sensitive values masked. int64 and double
 * options are raw items holding their exact text (cJSON would round them to
 * 15 digits): print the tree, do not read their valuedouble. */
cJSON *sf_config_to_json(const sf_config *c);
/* The configuration as GET /v1/config shows it: sf_config_to_json, with each
 * augmentation pipeline that is empty replaced by the recipe of model.preset
 * it runs, and {"augment.pipeline": "<preset>", ...} in *from_preset naming
 * those (an empty object when none). A patch of such a view back is no
 * change: a pipeline patched to the recipe it already runs stays empty. */
cJSON *sf_config_view_json(const sf_config *c, cJSON **from_preset);
/* Prints --help generated from the table. */
void sf_config_print_help(const char *prog);
/* Prints the table as markdown (docs/CONFIG.md; --help-markdown). */
void sf_config_print_markdown(void);
/* Prints the Config and ConfigPatch schemas of openapi/streamfeed.yaml
 * (--help-openapi; tools/gen_openapi_config.py splices them in). */
void sf_config_print_openapi(void);

/* ---- the live configuration ---------------------------------------------- */
void sf_config_live_init(const sf_config *c);
/* Copies the current effective config. Any thread. */
void sf_config_get(sf_config *out);
/* The current effective config for hot paths: a per-thread copy refreshed
 * only when a PATCH changed something, so a request does not copy the whole
 * table (~25 KB) several times. Valid until this thread's next call. */
const sf_config *sf_config_cur(void);
/* A number that changes whenever the live config changes (a PATCH applied):
 * lets a hot path keep something derived from the config until it moves. */
uint64_t sf_config_generation(void);
/* Applies a JSON merge patch to the live config atomically: validates the
 * complete result first; on success, hot options take effect at once and
 * restart-only ones become pending. Fills *applied / *pending with arrays of
 * names (caller frees). Returns 0, or -1 with err and the offending field. */
int sf_config_patch(const cJSON *patch, cJSON **applied, cJSON **pending, char *err,
                    size_t errlen, char *field, size_t fieldlen);
/* The checks of sf_config_patch alone: 0 when it would apply, else -1 with
 * err and the offending field; nothing changes. */
int sf_config_patch_check(const cJSON *patch, char *err, size_t errlen, char *field, size_t fieldlen);

/* The first option with SF_CF_PATCH_NEEDS_TOKEN that a merge patch would change
 * from its value in cur, or NULL (the same value patched back is no change,
 * so a GET's config patches back). */
const sf_cfg_option *sf_config_patch_needs_token(const cJSON *patch, const sf_config *cur);
/* Names of restart-only options changed by PATCH since start (caller frees). */
cJSON *sf_config_pending(void);
/* Hook run (with the new config) after hot options changed. */
void sf_config_on_change(void (*fn)(const sf_config *c));

#endif
