/* tests/fuzz/fuzz_config_patch.c — libFuzzer target for PATCH /v1/config.
 *
 * The input is a request body. It goes where the handler sends it: parsed by
 * cJSON, then applied to the live configuration as a JSON merge patch
 * (sf_config_patch), which validates the whole result — bounds, enums, string
 * lengths, and the semantic checks that parse a model spec or an augmentation
 * pipeline — before it changes anything. Each input starts from the defaults.
 * Checked besides ASan and UBSan:
 *   - a refused patch changes nothing (effective and pending alike) and says why;
 *   - an accepted patch names what it applied and what waits for a restart;
 *   - GET /v1/config's rendering of the result is valid JSON and, patched back
 *     (masked secrets as "***"), changes nothing.
 *
 *   make fuzz-long FUZZ_SECONDS=3600    (every target; see tests/fuzz/RESULTS.md)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/config.h"

#define CHECK(cond) do { if (!(cond)) __builtin_trap(); } while (0)

static sf_config *defaults;

static int same_config(const sf_config *a, const sf_config *b)
{
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        if (memcmp((const char *)a + o->offset, (const char *)b + o->offset, o->size) != 0)
            return 0;
    }
    return 1;
}

static char *pending_text(void)
{
    cJSON *p = sf_config_pending();
    char *t = cJSON_PrintUnformatted(p);
    cJSON_Delete(p);
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!defaults) {
        defaults = malloc(sizeof *defaults);
        sf_config_defaults(defaults);
    }
    sf_config_live_init(defaults);
    cJSON *patch = cJSON_ParseWithLength((const char *)data, size);
    if (!patch)
        return 0;

    sf_config *before = malloc(sizeof *before), *after = malloc(sizeof *after);
    sf_config_get(before);
    char *pend_before = pending_text();
    cJSON *applied = NULL, *pending = NULL;
    char err[512] = "", field[128] = "";
    int rc = sf_config_patch(patch, &applied, &pending, err, sizeof err, field, sizeof field);
    sf_config_get(after);
    if (rc != 0) {
        CHECK(err[0] != '\0');
        CHECK(same_config(before, after));
        char *pend_after = pending_text();
        CHECK(strcmp(pend_before, pend_after) == 0);
        free(pend_after);
    } else {
        CHECK(cJSON_IsArray(applied) && cJSON_IsArray(pending));
        /* What GET /v1/config shows, patched back, changes nothing. */
        cJSON *view = sf_config_to_json(after);
        char *txt = cJSON_PrintUnformatted(view);
        CHECK(txt != NULL);
        cJSON *again = cJSON_Parse(txt);
        CHECK(again != NULL);
        cJSON *ap2 = NULL, *pe2 = NULL;
        int rc2 = sf_config_patch(again, &ap2, &pe2, err, sizeof err, field, sizeof field);
        CHECK(rc2 == 0);
        CHECK(cJSON_GetArraySize(ap2) == 0);
        sf_config *third = malloc(sizeof *third);
        sf_config_get(third);
        CHECK(same_config(after, third));
        free(third);
        cJSON_Delete(ap2);
        cJSON_Delete(pe2);
        cJSON_Delete(again);
        cJSON_free(txt);
        cJSON_Delete(view);
    }
    cJSON_Delete(applied);
    cJSON_Delete(pending);
    free(pend_before);
    free(before);
    free(after);
    cJSON_Delete(patch);
    return 0;
}
