/* server/config_render.c — the configuration as JSON (GET /v1/config) and the table as --help, markdown (docs/CONFIG.md) and OpenAPI schemas. See config.h. */
#include "server/config.h"
#include "server/config_impl.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/text.h"

/* cJSON prints a number with 15 significant digits whenever that reads back
 * within one ulp (its equality test is approximate), so a seed of 16 digits
 * or a double like 0.9111111111111111 would come back changed from a GET
 * patched back. These are written as the shortest text that reads back to
 * exactly the same value instead. */
static void add_exact_number(cJSON *s, const char *key, double v, int64_t i, int is_int)
{
    char buf[40];
    if (is_int) {
        snprintf(buf, sizeof buf, "%lld", (long long)i);
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, v);
            if (strtod(buf, NULL) == v)
                break;
        }
    }
    cJSON_AddRawToObject(s, key, buf);
}

cJSON *sf_config_to_json(const sf_config *c)
{
    cJSON *root = cJSON_CreateObject();
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        const char *dot = strchr(o->name, '.');
        char sec[64];
        snprintf(sec, sizeof sec, "%.*s", (int)(dot - o->name), o->name);
        cJSON *s = cJSON_GetObjectItemCaseSensitive(root, sec);
        if (!s)
            s = cJSON_AddObjectToObject(root, sec);
        const void *p = sf_cfg_field_cptr(c, o);
        const char *key = dot + 1;
        switch (o->type) {
        case SF_CT_INT:
            cJSON_AddNumberToObject(s, key, *(const int *)p);
            break;
        case SF_CT_INT64:
            add_exact_number(s, key, 0, *(const int64_t *)p, 1);
            break;
        case SF_CT_DOUBLE:
            add_exact_number(s, key, *(const double *)p, 0, 0);
            break;
        case SF_CT_BOOL:
            cJSON_AddBoolToObject(s, key, *(const int *)p);
            break;
        case SF_CT_STRING:
        case SF_CT_ENUM:
            if ((o->flags & SF_CF_SENSITIVE) && ((const char *)p)[0]) {
                cJSON_AddStringToObject(s, key, "***");
            } else if (o->flags & SF_CF_URL) {
                char shown[512];
                sf_url_redact((const char *)p, shown, sizeof shown);
                cJSON_AddStringToObject(s, key, shown);
            } else {
                cJSON_AddStringToObject(s, key, (const char *)p);
            }
            break;
        case SF_CT_JSON: {
            cJSON *v = ((const char *)p)[0] ? cJSON_Parse((const char *)p) : NULL;
            cJSON_AddItemToObject(s, key, v ? v : cJSON_CreateNull());
            break;
        }
        }
    }
    return root;
}

cJSON *sf_config_view_json(const sf_config *c, cJSON **from_preset)
{
    cJSON *root = sf_config_to_json(c);
    cJSON *from = cJSON_CreateObject();
    const char *preset = sf_cfg_recipe_preset(c);
    cJSON *aug = cJSON_GetObjectItemCaseSensitive(root, "augment");
    const struct {
        const char *key, *name, *stored;
        int eval;
    } pipes[] = {
        {"pipeline", "augment.pipeline", c->augment.pipeline, 0},
        {"eval_pipeline", "augment.eval_pipeline", c->augment.eval_pipeline, 1},
    };
    for (size_t i = 0; preset && aug && i < sizeof pipes / sizeof pipes[0]; i++) {
        cJSON *recipe = pipes[i].stored[0] ? NULL : cJSON_Parse(sf_cfg_recipe_of(c, pipes[i].eval));
        if (recipe) {
            cJSON_ReplaceItemInObjectCaseSensitive(aug, pipes[i].key, recipe);
            cJSON_AddStringToObject(from, pipes[i].name, preset);
        }
    }
    *from_preset = from;
    return root;
}

static const char *type_name(sf_cfg_type t)
{
    static const char *const n[] = {"int", "int", "number", "bool", "string", "enum", "json"};
    return n[t];
}

void sf_config_print_help(const char *prog)
{
    printf("usage: %s [--config FILE] [--SECTION.OPTION VALUE ...]\n"
           "       %s --version | --help | --help-markdown | --help-layers\n\n"
           "Every option can also be set in the JSON config file ({\"section\":{\"option\":v}})\n"
           "and in the environment (STREAMFEED_SECTION_OPTION). Precedence:\n"
           "defaults < file < environment < flags. [hot] options can change at run time\n"
           "through PATCH /v1/config; [hot with http.token] ones only on a service started\n"
           "with a token; the others need a restart, and a PATCH of the [restart; PATCH with\n"
           "http.token] ones (paths, URLs, addresses) is refused on a service without one.\n\n",
           prog, prog);
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        char env[128];
        sf_cfg_env_name(o->name, env, sizeof env);
        const int needs_token = (o->flags & SF_CF_PATCH_NEEDS_TOKEN) != 0;
        printf("  --%-30s %s%s\n", o->name, o->help,
               !(o->flags & SF_CF_HOT) ? (needs_token ? " [restart; PATCH with http.token]" : "")
               : needs_token           ? " [hot with http.token]"
                                       : " [hot]");
        if (o->type == SF_CT_ENUM)
            printf("      %-30s one of %s; default %s; env %s\n", "", o->choices, o->def, env);
        else if (o->type == SF_CT_JSON)
            printf("      %-30s JSON; env %s\n", "", env);
        else if (o->type <= SF_CT_DOUBLE) {
            char lo[32], hi[32];
            printf("      %-30s %s in [%s, %s]; default %s; env %s\n", "", type_name(o->type),
                   sf_cfg_fmt_num(o, o->min, lo, sizeof lo), sf_cfg_fmt_num(o, o->max, hi, sizeof hi), o->def, env);
        }
        else
            printf("      %-30s %s; default \"%s\"; env %s\n", "", type_name(o->type),
                   (o->flags & SF_CF_SENSITIVE) ? "" : o->def, env);
    }
}

/* Prints s as the text of a Markdown table cell: "|" would end the cell. */
static void md_cell(const char *s)
{
    for (; *s; s++) {
        if (*s == '|')
            fputs("\\|", stdout);
        else
            putchar(*s);
    }
}

void sf_config_print_markdown(void)
{
    printf("<!-- Generated by `streamfeed --help-markdown` from the option table in "
           "server/config.c; do not edit. -->\n\n"
           "| option | env | type | default | range / choices | hot | meaning |\n"
           "| --- | --- | --- | --- | --- | --- | --- |\n");
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        char env[128], range[96] = "";
        sf_cfg_env_name(o->name, env, sizeof env);
        if (o->type == SF_CT_ENUM)
            snprintf(range, sizeof range, "%s", o->choices);
        else if (o->type <= SF_CT_DOUBLE) {
            char lo[32], hi[32];
            snprintf(range, sizeof range, "%s … %s", sf_cfg_fmt_num(o, o->min, lo, sizeof lo),
                     sf_cfg_fmt_num(o, o->max, hi, sizeof hi));
        }
        const char *def = o->type == SF_CT_JSON && strlen(o->def) > 24 ? "(see --help)" : o->def;
        printf("| `%s` | `%s` | %s | `", o->name, env, type_name(o->type));
        md_cell(def);
        printf("` | ");
        md_cell(range);
        const int needs_token = (o->flags & SF_CF_PATCH_NEEDS_TOKEN) != 0;
        printf(" | %s | ", !(o->flags & SF_CF_HOT) ? (needs_token ? "restart; PATCH with http.token" : "restart")
                           : needs_token           ? "with http.token"
                                                   : "yes");
        md_cell(o->help);
        printf(" |\n");
    }
    printf("\n## Preset recipes\n\n"
           "The augmentation of a preset when augment.pipeline / augment.eval_pipeline are empty "
           "(a model.spec model: `[]` for both).\n\n");
    for (size_t i = 0; i < sf_cfg_recipes_len; i++)
        printf("- `%s`\n  - train: `%s`\n  - eval: `%s`\n", sf_cfg_recipes[i].preset, sf_cfg_recipes[i].train,
               sf_cfg_recipes[i].eval);
}

/* One option's JSON schema as YAML flow mapping. Patch schemas also take
 * null (reset to the default). A JSON option takes any JSON value. */
static void print_option_schema(const sf_cfg_option *o, int patch)
{
    const char *null_t = patch ? ", \"null\"" : "";
    switch (o->type) {
    case SF_CT_INT:
    case SF_CT_INT64:
        printf("{type: [integer%s], minimum: %.17g, maximum: %.17g}", null_t, o->min, o->max);
        break;
    case SF_CT_DOUBLE:
        printf("{type: [number%s], minimum: %.17g, maximum: %.17g}", null_t, o->min, o->max);
        break;
    case SF_CT_BOOL:
        printf("{type: [boolean%s]}", null_t);
        break;
    case SF_CT_STRING:
        printf("{type: [string%s], maxLength: %zu}", null_t, o->size - 1);
        break;
    case SF_CT_ENUM: {
        printf("{enum: [");
        const char *p = o->choices;
        int first = 1;
        while (*p) {
            size_t n = strcspn(p, "|");
            printf("%s\"%.*s\"", first ? "" : ", ", (int)n, p);
            first = 0;
            p += n;
            if (*p == '|')
                p++;
        }
        printf("%s]}", patch ? ", null" : "");
        break;
    }
    case SF_CT_JSON:
        printf("{description: \"JSON (or a string holding JSON)\"}");
        break;
    }
}

void sf_config_print_openapi(void)
{
    printf("    # Generated by `streamfeed --help-openapi` from the option table in server/config.c\n"
           "    # (make docs); tests check it is current. Do not edit by hand.\n");
    for (int patch = 0; patch < 2; patch++) {
        printf("    %s:\n      type: object\n", patch ? "ConfigPatch" : "Config");
        printf("      description: \"%s\"\n",
               patch ? "A JSON merge patch of the configuration (only the options to change); "
                       "null resets an option to its default."
                     : "The effective configuration, by section, then by option.");
        printf("      additionalProperties: false\n      properties:\n");
        /* Sections in order of first appearance; a section's options may be
         * spread over the table (rows are grouped by feature). */
        for (size_t i = 0; i < sf_config_table_len; i++) {
            const char *name = sf_config_table[i].name;
            size_t slen = (size_t)(strchr(name, '.') - name);
            int seen = 0;
            for (size_t k = 0; k < i && !seen; k++)
                seen = strncmp(sf_config_table[k].name, name, slen + 1) == 0;
            if (seen)
                continue;
            printf("        %.*s:\n          type: object\n          additionalProperties: false\n",
                   (int)slen, name);
            if (!patch) {
                printf("          required: [");
                int first = 1;
                for (size_t j = i; j < sf_config_table_len; j++)
                    if (strncmp(sf_config_table[j].name, name, slen + 1) == 0) {
                        printf("%s%s", first ? "" : ", ", sf_config_table[j].name + slen + 1);
                        first = 0;
                    }
                printf("]\n");
            }
            printf("          properties:\n");
            for (size_t j = i; j < sf_config_table_len; j++) {
                const sf_cfg_option *o = &sf_config_table[j];
                if (strncmp(o->name, name, slen + 1) != 0)
                    continue;
                printf("            %s: ", o->name + slen + 1);
                /* GET masks a set secret as "***", beyond the enum/length rules. */
                if (!patch && (o->flags & SF_CF_SENSITIVE))
                    printf("{type: string}");
                else
                    print_option_schema(o, patch);
                printf("\n");
            }
        }
    }
}
