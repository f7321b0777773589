/* server/config_load.c — setting options from text and JSON, and loading the configuration (defaults, file, environment, command line). See config.h. */
#include "server/config.h"
#include "server/config_impl.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/layers.h"
#include "server/text.h"

const sf_cfg_option *sf_config_find(const char *name)
{
    for (size_t i = 0; i < sf_config_table_len; i++)
        if (strcmp(sf_config_table[i].name, name) == 0)
            return &sf_config_table[i];
    return NULL;
}

void *sf_cfg_field_ptr(sf_config *c, const sf_cfg_option *o) { return (char *)c + o->offset; }
const void *sf_cfg_field_cptr(const sf_config *c, const sf_cfg_option *o)
{
    return (const char *)c + o->offset;
}

int sf_cfg_field_equal(const sf_config *a, const sf_config *b, const sf_cfg_option *o)
{
    if (o->type == SF_CT_STRING || o->type == SF_CT_ENUM || o->type == SF_CT_JSON)
        return strcmp((const char *)sf_cfg_field_cptr(a, o), (const char *)sf_cfg_field_cptr(b, o)) == 0;
    return memcmp(sf_cfg_field_cptr(a, o), sf_cfg_field_cptr(b, o), o->size) == 0;
}

static int enum_has(const char *choices, const char *v)
{
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0)
            return 1;
        if (!bar)
            break;
        p = bar + 1;
    }
    return 0;
}

/* A bound or value as people write it: integer options as integers (an int64
 * bound of 2^34 prints as 17179869184, not 1.71799e+10), numbers as %g. */
const char *sf_cfg_fmt_num(const sf_cfg_option *o, double v, char *buf, size_t cap)
{
    if (o->type != SF_CT_DOUBLE && v == floor(v) && fabs(v) < 1e18)
        snprintf(buf, cap, "%lld", (long long)v);
    else
        snprintf(buf, cap, "%g", v);
    return buf;
}

static int set_number(sf_config *c, const sf_cfg_option *o, double v, char *err, size_t errlen)
{
    if (!isfinite(v) || v < o->min || v > o->max) {
        char a[32], b[32], d[32];
        snprintf(err, errlen, "%s: %s is out of range [%s, %s]", o->name, sf_cfg_fmt_num(o, v, a, sizeof a),
                 sf_cfg_fmt_num(o, o->min, b, sizeof b), sf_cfg_fmt_num(o, o->max, d, sizeof d));
        return -1;
    }
    switch (o->type) {
    case SF_CT_INT:
        if (v != floor(v)) {
            snprintf(err, errlen, "%s: expected an integer, got %g", o->name, v);
            return -1;
        }
        *(int *)sf_cfg_field_ptr(c, o) = (int)v;
        return 0;
    case SF_CT_INT64:
        if (v != floor(v)) {
            snprintf(err, errlen, "%s: expected an integer, got %g", o->name, v);
            return -1;
        }
        *(int64_t *)sf_cfg_field_ptr(c, o) = (int64_t)v;
        return 0;
    case SF_CT_DOUBLE:
        *(double *)sf_cfg_field_ptr(c, o) = v;
        return 0;
    default:
        snprintf(err, errlen, "%s: not a number option", o->name);
        return -1;
    }
}

/* An option that was a boolean and grew a third value (checkpoint.resume:
 * false|true|if_compatible) keeps every spelling it accepted as a boolean. */
static int widened_bool(const sf_cfg_option *o)
{
    return o->type == SF_CT_ENUM && enum_has(o->choices, "true") && enum_has(o->choices, "false");
}

static int set_string(sf_config *c, const sf_cfg_option *o, const char *v, char *err, size_t errlen)
{
    if (widened_bool(o)) {
        if (!strcmp(v, "1") || !strcmp(v, "yes"))
            v = "true";
        else if (!strcmp(v, "0") || !strcmp(v, "no"))
            v = "false";
    }
    size_t n = strlen(v);
    if (n >= o->size) {
        snprintf(err, errlen, "%s: value is %zu bytes, at most %zu allowed", o->name, n, o->size - 1);
        return -1;
    }
    /* Values are echoed by GET /v1/config, the logs and the metrics' labels:
     * ill-formed UTF-8 would make each of them invalid for every reader. */
    if (!sf_text_ok(v)) {
        snprintf(err, errlen, "%s: the value is not UTF-8 text (or holds control characters)", o->name);
        return -1;
    }
    if (o->type == SF_CT_ENUM && !enum_has(o->choices, v)) {
        snprintf(err, errlen, "%s: \"%.64s\" is not one of %s", o->name, v, o->choices);
        return -1;
    }
    memcpy(sf_cfg_field_ptr(c, o), v, n + 1);
    return 0;
}

/* Edit distance (insertions, deletions, substitutions) of two short names. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 127 || lb > 127)
        return (size_t)-1;
    size_t row[128];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const sf_cfg_option *sf_config_suggest(const char *name)
{
    const sf_cfg_option *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        /* "port" for "http.port": the option without its section. */
        if (strcmp(strchr(o->name, '.') + 1, name) == 0)
            return o;
        size_t d = edit_distance(name, o->name);
        if (d < best_d) {
            best_d = d;
            best = o;
        }
    }
    /* A third of the name may be wrong (typos, a wrong section), no more:
     * beyond that the suggestion is a guess. */
    size_t limit = strlen(name) / 3 > 2 ? strlen(name) / 3 : 2;
    return best_d <= limit ? best : NULL;
}

static void unknown_option(const char *name, char *err, size_t errlen)
{
    const sf_cfg_option *s = sf_config_suggest(name);
    if (s)
        snprintf(err, errlen, "unknown option \"%s\" (did you mean \"%s\"?)", name, s->name);
    else
        snprintf(err, errlen, "unknown option \"%s\" (--help lists them)", name);
}

int sf_config_set_text(sf_config *c, const char *name, const char *value, char *err, size_t errlen)
{
    const sf_cfg_option *o = sf_config_find(name);
    if (!o) {
        unknown_option(name, err, errlen);
        return -1;
    }
    switch (o->type) {
    case SF_CT_INT:
    case SF_CT_INT64:
    case SF_CT_DOUBLE: {
        char *end;
        errno = 0;
        double v = strtod(value, &end);
        if (errno || end == value || *end) {
            snprintf(err, errlen, "%s: \"%.64s\" is not a number", name, value);
            return -1;
        }
        return set_number(c, o, v, err, errlen);
    }
    case SF_CT_BOOL:
        if (!strcmp(value, "true") || !strcmp(value, "1") || !strcmp(value, "yes"))
            *(int *)sf_cfg_field_ptr(c, o) = 1;
        else if (!strcmp(value, "false") || !strcmp(value, "0") || !strcmp(value, "no"))
            *(int *)sf_cfg_field_ptr(c, o) = 0;
        else {
            snprintf(err, errlen, "%s: \"%.64s\" is not a boolean (true/false)", name, value);
            return -1;
        }
        return 0;
    case SF_CT_JSON: {
        if (!value[0])
            return set_string(c, o, value, err, errlen);
        /* Stored in cJSON's canonical rendering, so the same value always
         * compares equal however it was written (1.0 vs 1, spacing). */
        const char *why = NULL;
        cJSON *j = sf_json_parse_whole(value, strlen(value), &why);
        if (!j) {
            snprintf(err, errlen, "%s: %s", name, why);
            return -1;
        }
        char *canon = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        if (!canon) {
            snprintf(err, errlen, "%s: out of memory", name);
            return -1;
        }
        int rc = set_string(c, o, canon, err, errlen);
        cJSON_free(canon);
        return rc;
    }
    case SF_CT_STRING:
    case SF_CT_ENUM:
        return set_string(c, o, value, err, errlen);
    }
    return -1;
}

void sf_config_defaults(sf_config *c)
{
    memset(c, 0, sizeof *c);
    char err[256];
    for (size_t i = 0; i < sf_config_table_len; i++) {
        if (sf_config_set_text(c, sf_config_table[i].name, sf_config_table[i].def, err, sizeof err)) {
            /* A default that does not parse is a bug in the table itself. */
            fprintf(stderr, "config table: %s\n", err);
            abort();
        }
    }
}

/* Sets one option from a JSON value (file and PATCH syntax). */
int sf_cfg_set_json(sf_config *c, const sf_cfg_option *o, const cJSON *v, char *err, size_t errlen)
{
    if (cJSON_IsNull(v))
        return sf_config_set_text(c, o->name, o->def, err, errlen);
    switch (o->type) {
    case SF_CT_INT:
    case SF_CT_INT64:
    case SF_CT_DOUBLE:
        if (!cJSON_IsNumber(v)) {
            snprintf(err, errlen, "%s: expected a number", o->name);
            return -1;
        }
        return set_number(c, o, v->valuedouble, err, errlen);
    case SF_CT_BOOL:
        if (!cJSON_IsBool(v)) {
            snprintf(err, errlen, "%s: expected true or false", o->name);
            return -1;
        }
        *(int *)sf_cfg_field_ptr(c, o) = cJSON_IsTrue(v);
        return 0;
    case SF_CT_STRING:
    case SF_CT_ENUM:
        if (widened_bool(o) && cJSON_IsBool(v))
            return set_string(c, o, cJSON_IsTrue(v) ? "true" : "false", err, errlen);
        if (!cJSON_IsString(v)) {
            snprintf(err, errlen, "%s: expected a string", o->name);
            return -1;
        }
        /* GET shows a set secret as "***", and a URL without its
         * credentials: sending that back keeps the value. */
        if ((o->flags & SF_CF_SENSITIVE) && strcmp(v->valuestring, "***") == 0)
            return 0;
        if (o->flags & SF_CF_URL) {
            char shown[512];
            sf_url_redact((const char *)sf_cfg_field_cptr(c, o), shown, sizeof shown);
            if (strcmp(v->valuestring, shown) == 0)
                return 0;
        }
        return set_string(c, o, v->valuestring, err, errlen);
    case SF_CT_JSON: {
        /* A JSON option takes a JSON value or a string holding JSON. */
        if (cJSON_IsString(v))
            return sf_config_set_text(c, o->name, v->valuestring, err, errlen);
        char *txt = cJSON_PrintUnformatted(v);
        if (!txt) {
            snprintf(err, errlen, "%s: out of memory", o->name);
            return -1;
        }
        int rc = sf_config_set_text(c, o->name, txt, err, errlen);
        cJSON_free(txt);
        return rc;
    }
    }
    return -1;
}

/* 1 when some option is named "sec.<name>". */
static int section_known(const char *sec)
{
    const size_t n = strlen(sec);
    for (size_t i = 0; i < sf_config_table_len; i++)
        if (strncmp(sf_config_table[i].name, sec, n) == 0 && sf_config_table[i].name[n] == '.')
            return 1;
    return 0;
}

int sf_config_apply_json(sf_config *c, const cJSON *obj, char *err, size_t errlen, char *field,
                         size_t fieldlen)
{
    if (field && fieldlen)
        field[0] = '\0';
    if (!cJSON_IsObject(obj)) {
        snprintf(err, errlen, "configuration must be a JSON object of sections");
        return -1;
    }
    for (const cJSON *sec = obj->child; sec; sec = sec->next) {
        if (!cJSON_IsObject(sec)) {
            if (field)
                snprintf(field, fieldlen, "%s", sec->string);
            snprintf(err, errlen, "%s: expected an object of options (e.g. {\"%s\":{...}})",
                     sec->string, sec->string);
            return -1;
        }
        if (!sec->child && !section_known(sec->string)) {
            /* An empty unknown section is a typo, not a no-op (a key in one
             * is refused below, naming the option). */
            if (field)
                snprintf(field, fieldlen, "%s", sec->string);
            snprintf(err, errlen, "unknown section \"%.64s\" (GET /v1/config lists them)", sec->string);
            return -1;
        }
        for (const cJSON *kv = sec->child; kv; kv = kv->next) {
            char name[128];
            snprintf(name, sizeof name, "%s.%s", sec->string, kv->string);
            if (field)
                snprintf(field, fieldlen, "%s", name);
            const sf_cfg_option *o = sf_config_find(name);
            if (!o) {
                unknown_option(name, err, errlen);
                return -1;
            }
            if (sf_cfg_set_json(c, o, kv, err, errlen))
                return -1;
        }
    }
    if (field && fieldlen)
        field[0] = '\0';
    return 0;
}

void sf_cfg_env_name(const char *opt, char *out, size_t cap)
{
    size_t o = (size_t)snprintf(out, cap, "STREAMFEED_");
    for (const char *p = opt; *p && o + 1 < cap; p++)
        out[o++] = (*p == '.') ? '_' : (char)toupper((unsigned char)*p);
    out[o] = '\0';
}

static int load_file(sf_config *c, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "--config %s: %s", path, strerror(errno));
        return -1;
    }
    /* A config file is small; bound it so a wrong path (a device, a dataset) fails fast. */
    enum { MAX = 1 << 20 };
    char *buf = malloc(MAX + 1);
    size_t n = buf ? fread(buf, 1, MAX + 1, f) : 0;
    fclose(f);
    if (!buf || n > MAX) {
        free(buf);
        snprintf(err, errlen, "--config %s: missing or larger than 1 MiB", path);
        return -1;
    }
    buf[n] = '\0';
    const char *why = NULL;
    cJSON *j = sf_json_parse_whole(buf, n, &why);
    free(buf);
    if (!j) {
        snprintf(err, errlen, "--config %s: %s", path, why);
        return -1;
    }
    char e2[512], fld[128];
    int rc = sf_config_apply_json(c, j, e2, sizeof e2, fld, sizeof fld);
    cJSON_Delete(j);
    if (rc)
        snprintf(err, errlen, "--config %s: %s", path, e2);
    return rc;
}

/* distributed.rank -1: a StatefulSet names its pods <name>-<ordinal> and the
 * pod's host name is its name, so the ordinal is the rank. Read here, once,
 * so the rest of the service sees a plain number. */
static void derive_rank(sf_config *c)
{
    /* One process: no rank to derive (the service answers rank 0 then). */
    if (c->distributed.rank >= 0 || c->distributed.world_size <= 1)
        return;
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0)
        return;
    const char *dash = strrchr(host, '-');
    if (!dash || !dash[1])
        return;
    char *end;
    long n = strtol(dash + 1, &end, 10);
    if (*end == '\0' && n >= 0 && n < 1024)
        c->distributed.rank = (int)n;
}

/* STREAMFEED_* names that are not options but are read elsewhere: the config
 * file's path (below) and streamfeed-load's bearer token. */
static const char *const env_not_options[] = {"STREAMFEED_CONFIG", "STREAMFEED_TOKEN"};

/* What sf_config_load found in the environment that names no option. A
 * mistyped variable would otherwise be ignored in silence (a flag is refused,
 * but the environment is shared with other programs, so it is only warned
 * about). Bounded: the first ENV_WARN_MAX. */
enum { ENV_WARN_MAX = 16 };
static char env_warnings[ENV_WARN_MAX][384];
static int n_env_warnings;

/* The option whose variable is nearest to `var` (STREAMFEED_RING_SLOT ->
 * ring.slots, STREAMFEED_PORT -> http.port), or NULL when none is close:
 * sf_config_suggest's rule, on the variables' spelling. */
static const sf_cfg_option *suggest_env(const char *var)
{
    const char *given = var + strlen("STREAMFEED_");
    const sf_cfg_option *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        char name[128];
        sf_cfg_env_name(o->name, name, sizeof name);
        const char *key = name + strlen("STREAMFEED_") + (size_t)(strchr(o->name, '.') - o->name) + 1;
        if (strcmp(key, given) == 0)
            return o;
        size_t d = edit_distance(given, name + strlen("STREAMFEED_"));
        if (d < best_d) {
            best_d = d;
            best = o;
        }
    }
    size_t limit = strlen(given) / 3 > 2 ? strlen(given) / 3 : 2;
    return best_d <= limit ? best : NULL;
}

static void find_unknown_env(void)
{
    extern char **environ;
    n_env_warnings = 0;
    for (char **e = environ; e && *e && n_env_warnings < ENV_WARN_MAX; e++) {
        if (strncmp(*e, "STREAMFEED_", 11) != 0)
            continue;
        char var[128];
        size_t n = strcspn(*e, "=");
        if (n >= sizeof var)
            n = sizeof var - 1;
        memcpy(var, *e, n);
        var[n] = '\0';
        int known = 0;
        for (size_t i = 0; i < sizeof env_not_options / sizeof env_not_options[0]; i++)
            known |= strcmp(var, env_not_options[i]) == 0;
        for (size_t i = 0; i < sf_config_table_len && !known; i++) {
            char name[128];
            sf_cfg_env_name(sf_config_table[i].name, name, sizeof name);
            known = strcmp(var, name) == 0;
        }
        if (known)
            continue;
        const sf_cfg_option *s = suggest_env(var);
        char meant[160] = "";
        if (s) {
            char name[128];
            sf_cfg_env_name(s->name, name, sizeof name);
            snprintf(meant, sizeof meant, "did you mean %s (%s)?", name, s->name);
        }
        snprintf(env_warnings[n_env_warnings++], sizeof env_warnings[0],
                 "environment %s is not an option and is ignored (%s)", var,
                 s ? meant : "streamfeed --help lists the options; each is STREAMFEED_SECTION_OPTION");
    }
}

int sf_config_env_warnings(const char *out[], int max)
{
    int n = n_env_warnings < max ? n_env_warnings : max;
    for (int i = 0; i < n; i++)
        out[i] = env_warnings[i];
    return n;
}

int sf_config_load(sf_config *c, int argc, char **argv, char *err, size_t errlen)
{
    sf_config_defaults(c);
    const char *path = getenv("STREAMFEED_CONFIG");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            sf_config_print_help(argv[0]);
            return 1;
        }
        if (!strcmp(argv[i], "--help-markdown")) {
            sf_config_print_markdown();
            return 1;
        }
        if (!strcmp(argv[i], "--help-layers")) {
            sf_layer_kinds_markdown(stdout);
            return 1;
        }
        if (!strcmp(argv[i], "--help-openapi")) {
            sf_config_print_openapi();
            return 1;
        }
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            path = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9))
            path = argv[i] + 9;
    }
    if (path && path[0] && load_file(c, path, err, errlen))
        return -1;
    find_unknown_env();
    for (size_t i = 0; i < sf_config_table_len; i++) {
        char name[128];
        sf_cfg_env_name(sf_config_table[i].name, name, sizeof name);
        const char *v = getenv(name);
        if (v && sf_config_set_text(c, sf_config_table[i].name, v, err, errlen)) {
            char tmp[512];
            snprintf(tmp, sizeof tmp, "environment %s: %s", name, err);
            snprintf(err, errlen, "%s", tmp);
            return -1;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument \"%s\" (see --help)", a);
            return -1;
        }
        a += 2;
        char name[128];
        const char *val;
        const char *eq = strchr(a, '=');
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - a), a);
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
            /* "--ring.slots --http.port 0": the next word is an option, so
             * the value is missing (no option value starts with "--"). */
            if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) {
                if (!strcmp(name, "config") || sf_config_find(name))
                    snprintf(err, errlen, "--%s needs a value%s%s", name,
                             i + 1 < argc ? ", got the option " : "", i + 1 < argc ? argv[i + 1] : "");
                else
                    unknown_option(name, err, errlen);
                return -1;
            }
            val = argv[++i];
        }
        if (!strcmp(name, "config"))
            continue;
        if (sf_config_set_text(c, name, val, err, errlen))
            return -1;
    }
    derive_rank(c);
    char fld[128];
    return sf_config_validate(c, err, errlen, fld, sizeof fld);
}
