/* tests/unit/test_config.c — the option table and the live configuration
 * (server/config.c): defaults, text and JSON setters, validation, the load
 * order of the sources, and PATCH's all-or-nothing split into applied and
 * pending-restart options. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "server/config.h"

static char err[512];
static char field[128];

static cJSON *parse(const char *json)
{
    cJSON *j = cJSON_Parse(json);
    if (!j)
        fail_msg("test JSON does not parse: %s", json);
    return j;
}

/* 1 when the JSON array of strings is exactly the names given (NULL-terminated). */
static int names_are(const cJSON *arr, ...)
{
    va_list ap;
    va_start(ap, arr);
    int i = 0, ok = cJSON_IsArray(arr);
    for (const char *n; ok && (n = va_arg(ap, const char *)); i++) {
        const cJSON *it = cJSON_GetArrayItem(arr, i);
        ok = it && cJSON_IsString(it) && strcmp(it->valuestring, n) == 0;
    }
    va_end(ap);
    return ok && cJSON_GetArraySize(arr) == i;
}

/* ---- defaults ------------------------------------------------------------ */

static void test_defaults_parse_and_hold_the_table_values(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    assert_string_equal(c.http.host, "127.0.0.1");
    assert_int_equal(c.http.port, 8080);
    assert_int_equal(c.http.threads, 4);
    assert_int_equal(c.http.max_json_bytes, 1048576);
    assert_string_equal(c.http.token, "");
    assert_int_equal(c.ring.slots, 8);
    assert_int_equal(c.ring.slot_bytes, 0); /* sized from the model at start */
    assert_string_equal(c.ring.full_policy, "block");
    assert_int_equal(c.ring.full_timeout_ms, 10000);
    assert_string_equal(c.pipeline.mode, "train");
    assert_int_equal(c.pipeline.overlap, 1);
    assert_int_equal(c.pipeline.jobs_max, 4096);
    assert_string_equal(c.model.preset, "seed-classifier");
    assert_string_equal(c.model.spec, "");
    assert_true(c.optim.lr == 0.001);
    assert_true(c.optim.momentum == 0.0);
    assert_string_equal(c.log.level, "info");
    assert_int_equal(c.shutdown.grace_s, 30);
    /* Empty: the preset's recipe, W1's for seed-classifier. */
    assert_string_equal(c.augment.pipeline, "");
    assert_non_null(strstr(sf_config_train_pipeline(&c), "random_crop"));
    assert_null(strstr(sf_config_eval_pipeline(&c), "random_crop"));
    /* The defaults pass every semantic check. */
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), 0);
}

static void test_every_table_row_is_found_by_name_and_names_a_section(void **state)
{
    (void)state;
    assert_true(sf_config_table_len >= 30);
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        assert_ptr_equal(sf_config_find(o->name), o);
        assert_non_null(strchr(o->name, '.'));
        assert_non_null(o->help);
        assert_true(o->offset + o->size <= sizeof(sf_config));
    }
    assert_null(sf_config_find("optim.nope"));
    assert_null(sf_config_find(""));
}

/* ---- set_text: bounds, types, enums ---------------------------------------- */

static void test_set_text_accepts_values_within_bounds_including_the_ends(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "ring.slots", "2", err, sizeof err), 0);
    assert_int_equal(c.ring.slots, 2);
    assert_int_equal(sf_config_set_text(&c, "ring.slots", "4096", err, sizeof err), 0);
    assert_int_equal(c.ring.slots, 4096);
    assert_int_equal(sf_config_set_text(&c, "optim.momentum", "1", err, sizeof err), 0);
    assert_true(c.optim.momentum == 1.0);
    assert_int_equal(sf_config_set_text(&c, "optim.lr", "0.25", err, sizeof err), 0);
    assert_true(c.optim.lr == 0.25);
    assert_int_equal(sf_config_set_text(&c, "ring.slot_bytes", "17179869184", err, sizeof err), 0);
    assert_true(c.ring.slot_bytes == 17179869184LL);
    assert_int_equal(sf_config_set_text(&c, "model.seed", "9007199254740991", err, sizeof err), 0);
    assert_true(c.model.seed == 9007199254740991LL);
}

static void test_set_text_rejects_out_of_range_values_naming_the_option(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    const struct { const char *name, *value; } bad[] = {
        {"ring.slots", "1"},       {"ring.slots", "4097"},     {"http.port", "-1"},
        {"http.port", "65536"},    {"optim.momentum", "1.5"},  {"optim.lr", "-0.1"},
        {"optim.lr", "nan"},       {"optim.lr", "inf"},        {"eval.logits_keep_bytes", "4095"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        assert_int_equal(sf_config_set_text(&c, bad[i].name, bad[i].value, err, sizeof err), -1);
        assert_non_null(strstr(err, bad[i].name));
    }
    assert_int_equal(c.ring.slots, 8);
    assert_int_equal(c.http.port, 8080);
}

static void test_set_text_rejects_text_that_is_not_of_the_option_type(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "ring.slots", "3.5", err, sizeof err), -1);
    assert_non_null(strstr(err, "integer"));
    assert_int_equal(sf_config_set_text(&c, "ring.slots", "abc", err, sizeof err), -1);
    assert_int_equal(sf_config_set_text(&c, "ring.slots", "", err, sizeof err), -1);
    assert_int_equal(sf_config_set_text(&c, "ring.slots", "4x", err, sizeof err), -1);
    assert_int_equal(sf_config_set_text(&c, "optim.lr", "fast", err, sizeof err), -1);
    assert_int_equal(sf_config_set_text(&c, "pipeline.overlap", "maybe", err, sizeof err), -1);
    assert_non_null(strstr(err, "pipeline.overlap"));
    assert_int_equal(sf_config_set_text(&c, "model.spec", "[{", err, sizeof err), -1);
    assert_non_null(strstr(err, "model.spec"));
    assert_int_equal(c.ring.slots, 8);
    assert_int_equal(c.pipeline.overlap, 1);
}

static void test_set_text_parses_every_boolean_spelling(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    const char *f[] = {"false", "0", "no"}, *t[] = {"true", "1", "yes"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sf_config_set_text(&c, "log.requests", f[i], err, sizeof err), 0);
        assert_int_equal(c.log.requests, 0);
        assert_int_equal(sf_config_set_text(&c, "log.requests", t[i], err, sizeof err), 0);
        assert_int_equal(c.log.requests, 1);
    }
}

static void test_set_text_accepts_only_the_choices_of_an_enum(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "ring.full_policy", "reject", err, sizeof err), 0);
    assert_string_equal(c.ring.full_policy, "reject");
    assert_int_equal(sf_config_set_text(&c, "ring.full_policy", "drop", err, sizeof err), -1);
    assert_non_null(strstr(err, "block|reject"));
    assert_int_equal(sf_config_set_text(&c, "ring.full_policy", "Block", err, sizeof err), -1);
    assert_int_equal(sf_config_set_text(&c, "ring.full_policy", "bloc", err, sizeof err), -1);
    assert_int_equal(sf_config_set_text(&c, "ring.full_policy", "", err, sizeof err), -1);
    assert_string_equal(c.ring.full_policy, "reject");
}

static void test_a_boolean_widened_into_an_enum_keeps_its_boolean_spellings(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    const char *f[] = {"false", "0", "no"}, *t[] = {"true", "1", "yes"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sf_config_set_text(&c, "checkpoint.resume", t[i], err, sizeof err), 0);
        assert_string_equal(c.checkpoint.resume, "true");
        assert_int_equal(sf_config_set_text(&c, "checkpoint.resume", f[i], err, sizeof err), 0);
        assert_string_equal(c.checkpoint.resume, "false");
    }
    assert_int_equal(sf_config_set_text(&c, "checkpoint.resume", "if_compatible", err, sizeof err), 0);
    assert_string_equal(c.checkpoint.resume, "if_compatible");
    assert_int_equal(sf_config_set_text(&c, "checkpoint.resume", "maybe", err, sizeof err), -1);
    cJSON *j = parse("{\"checkpoint\":{\"resume\":true}}");
    assert_int_equal(sf_config_apply_json(&c, j, err, sizeof err, field, sizeof field), 0);
    cJSON_Delete(j);
    assert_string_equal(c.checkpoint.resume, "true");
    /* Another enum takes no boolean. */
    j = parse("{\"ring\":{\"full_policy\":true}}");
    assert_int_equal(sf_config_apply_json(&c, j, err, sizeof err, field, sizeof field), -1);
    cJSON_Delete(j);
}

static void test_set_text_rejects_a_string_longer_than_its_field(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    char longv[300];
    memset(longv, 'a', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    assert_int_equal(sf_config_set_text(&c, "http.token", longv, err, sizeof err), -1);
    assert_non_null(strstr(err, "http.token"));
    longv[SF_CFG_STR - 1] = '\0'; /* exactly the capacity less the terminator */
    assert_int_equal(sf_config_set_text(&c, "http.token", longv, err, sizeof err), 0);
    assert_int_equal(strlen(c.http.token), SF_CFG_STR - 1);
}

static void test_set_text_rejects_an_unknown_option(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "optim.speed", "1", err, sizeof err), -1);
    assert_non_null(strstr(err, "optim.speed"));
}

/* ---- apply_json ------------------------------------------------------------ */

static void test_apply_json_sets_nested_options_and_null_resets_to_the_default(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    cJSON *j = parse("{\"optim\":{\"lr\":0.5,\"momentum\":0.9},\"ring\":{\"full_policy\":\"reject\"},"
                     "\"log\":{\"requests\":false},\"augment\":{\"pipeline\":[]},"
                     "\"model\":{\"spec\":\"\"}}");
    assert_int_equal(sf_config_apply_json(&c, j, err, sizeof err, field, sizeof field), 0);
    cJSON_Delete(j);
    assert_true(c.optim.lr == 0.5 && c.optim.momentum == 0.9);
    assert_string_equal(c.ring.full_policy, "reject");
    assert_int_equal(c.log.requests, 0);
    assert_string_equal(c.augment.pipeline, "[]");
    assert_string_equal(field, "");
    j = parse("{\"optim\":{\"lr\":null}}");
    assert_int_equal(sf_config_apply_json(&c, j, err, sizeof err, field, sizeof field), 0);
    cJSON_Delete(j);
    assert_true(c.optim.lr == 0.001);
    assert_true(c.optim.momentum == 0.9);
}

static void test_apply_json_names_the_field_of_an_unknown_key(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    cJSON *j = parse("{\"optim\":{\"lr\":0.5,\"speed\":1}}");
    assert_int_equal(sf_config_apply_json(&c, j, err, sizeof err, field, sizeof field), -1);
    assert_string_equal(field, "optim.speed");
    assert_non_null(strstr(err, "optim.speed"));
    cJSON_Delete(j);
    j = parse("{\"nosection\":{\"a\":1}}");
    assert_int_equal(sf_config_apply_json(&c, j, err, sizeof err, field, sizeof field), -1);
    assert_string_equal(field, "nosection.a");
    cJSON_Delete(j);
    j = parse("{\"nosection\":{}}");
    assert_int_equal(sf_config_apply_json(&c, j, err, sizeof err, field, sizeof field), -1);
    assert_string_equal(field, "nosection");
    cJSON_Delete(j);
    j = parse("{\"http\":{}}"); /* a known section, empty: nothing to set */
    assert_int_equal(sf_config_apply_json(&c, j, err, sizeof err, field, sizeof field), 0);
    cJSON_Delete(j);
}

static void test_apply_json_names_the_field_of_a_wrong_type(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    const struct { const char *json, *field; } bad[] = {
        {"{\"optim\":{\"lr\":\"0.5\"}}", "optim.lr"},
        {"{\"ring\":{\"slots\":true}}", "ring.slots"},
        {"{\"ring\":{\"slots\":2.5}}", "ring.slots"},
        {"{\"log\":{\"requests\":1}}", "log.requests"},
        {"{\"ring\":{\"full_policy\":3}}", "ring.full_policy"},
        {"{\"ring\":{\"slots\":100000}}", "ring.slots"},
        {"{\"optim\":7}", "optim"},
        {"{\"augment\":{\"pipeline\":\"[{\"}}", "augment.pipeline"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *j = parse(bad[i].json);
        field[0] = '\0';
        assert_int_equal(sf_config_apply_json(&c, j, err, sizeof err, field, sizeof field), -1);
        assert_string_equal(field, bad[i].field);
        cJSON_Delete(j);
    }
    cJSON *arr = parse("[1]");
    assert_int_equal(sf_config_apply_json(&c, arr, err, sizeof err, field, sizeof field), -1);
    cJSON_Delete(arr);
}

/* ---- validate -------------------------------------------------------------- */

static void test_validate_runs_the_semantic_checks_and_names_the_field(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    /* The job table must outsize what can be in flight: 2*slots+64. */
    assert_int_equal(sf_config_set_text(&c, "ring.slots", "4096", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), -1);
    assert_string_equal(field, "ring.slots");
    assert_non_null(strstr(err, "jobs_max"));
    assert_int_equal(sf_config_set_text(&c, "pipeline.jobs_max", "8256", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), 0);

    /* A slot size is 0 (sized from the model at start) or at least 4096. */
    assert_int_equal(sf_config_set_text(&c, "ring.slot_bytes", "4095", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), -1);
    assert_string_equal(field, "ring.slot_bytes");
    assert_non_null(strstr(err, "4095"));
    assert_int_equal(sf_config_set_text(&c, "ring.slot_bytes", "4096", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), 0);
    assert_int_equal(sf_config_set_text(&c, "ring.slot_bytes", "0", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), 0);

    /* Valid JSON that is not a valid augmentation list. */
    assert_int_equal(sf_config_set_text(&c, "augment.pipeline", "[{\"op\":\"spin\"}]", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), -1);
    assert_string_equal(field, "augment.pipeline");
    assert_non_null(strstr(err, "augment.pipeline"));
    assert_int_equal(sf_config_set_text(&c, "augment.pipeline", "[]", err, sizeof err), 0);

    /* A model spec that is JSON but not a model. */
    assert_int_equal(sf_config_set_text(&c, "model.spec", "{\"layers\":7}", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), -1);
    assert_true(strncmp(field, "model.", 6) == 0);
}

static void test_validate_refuses_mixup_or_cutmix_with_a_segmentation_model_either_way_and_in_an_eval_pipeline(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "augment.pipeline", "[{\"op\":\"cutmix\"}]", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), 0); /* a classifier */
    assert_int_equal(sf_config_set_text(&c, "model.preset", "seed-encdec", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), -1);
    assert_non_null(strstr(err, "aug op 0 (cutmix)"));
    assert_non_null(strstr(err, "segmentation"));
    assert_int_equal(sf_config_set_text(&c, "augment.pipeline", "[{\"op\":\"color_jitter\",\"hue\":0.1}]",
                                        err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), 0);
    /* An evaluation never mixes: its pipeline refuses both. */
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "augment.eval_pipeline", "[{\"op\":\"mixup\"}]", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), -1);
    assert_string_equal(field, "augment.eval_pipeline");
    assert_non_null(strstr(err, "mixup"));
}

/* ---- load: defaults < file < env < flags ----------------------------------- */

static void test_load_applies_file_then_env_then_flags(void **state)
{
    (void)state;
    char path[] = "/tmp/sf_test_config_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *json = "{\"optim\":{\"lr\":0.1,\"momentum\":0.2,\"weight_decay\":0.3},"
                       "\"ring\":{\"retry_after_s\":7}}";
    assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    setenv("STREAMFEED_OPTIM_MOMENTUM", "0.5", 1);
    setenv("STREAMFEED_OPTIM_WEIGHT_DECAY", "0.6", 1);
    char *argv[] = {"streamfeed", "--config", path, "--optim.weight_decay", "0.9", "--ring.slots=5", NULL};
    sf_config c;
    int rc = sf_config_load(&c, 6, argv, err, sizeof err);
    unsetenv("STREAMFEED_OPTIM_MOMENTUM");
    unsetenv("STREAMFEED_OPTIM_WEIGHT_DECAY");
    unlink(path);
    assert_int_equal(rc, 0);
    assert_true(c.optim.lr == 0.1);
    assert_true(c.optim.momentum == 0.5);
    assert_true(c.optim.weight_decay == 0.9);
    assert_int_equal(c.ring.retry_after_s, 7);
    assert_int_equal(c.ring.slots, 5);
    assert_int_equal(c.http.port, 8080);
}

static void test_load_fails_on_a_bad_flag_env_or_file(void **state)
{
    (void)state;
    sf_config c;
    char *a1[] = {"streamfeed", "--ring.slots", "1", NULL};
    assert_int_equal(sf_config_load(&c, 3, a1, err, sizeof err), -1);
    assert_non_null(strstr(err, "ring.slots"));
    char *a2[] = {"streamfeed", "--optim.lr", NULL};
    assert_int_equal(sf_config_load(&c, 2, a2, err, sizeof err), -1);
    assert_non_null(strstr(err, "needs a value"));
    char *a3[] = {"streamfeed", "stray", NULL};
    assert_int_equal(sf_config_load(&c, 2, a3, err, sizeof err), -1);
    setenv("STREAMFEED_HTTP_THREADS", "0", 1);
    char *a4[] = {"streamfeed", NULL};
    int rc = sf_config_load(&c, 1, a4, err, sizeof err);
    unsetenv("STREAMFEED_HTTP_THREADS");
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, "STREAMFEED_HTTP_THREADS"));
    char *a5[] = {"streamfeed", "--config", "/nonexistent/streamfeed.json", NULL};
    assert_int_equal(sf_config_load(&c, 3, a5, err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent/streamfeed.json"));
}

static void test_presets_bring_their_recipes_and_an_explicit_pipeline_overrides(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "model.preset", "tiny", err, sizeof err), 0);
    assert_non_null(strstr(sf_config_train_pipeline(&c), "normalize"));
    assert_null(strstr(sf_config_train_pipeline(&c), "random"));
    assert_int_equal(sf_config_set_text(&c, "model.preset", "resnet18", err, sizeof err), 0);
    assert_non_null(strstr(sf_config_train_pipeline(&c), "random_resized_crop"));
    assert_non_null(strstr(sf_config_eval_pipeline(&c), "center_crop"));
    assert_int_equal(sf_config_set_text(&c, "augment.pipeline", "[]", err, sizeof err), 0);
    assert_string_equal(sf_config_train_pipeline(&c), "[]");
    assert_int_equal(sf_config_set_text(&c, "model.spec",
                                        "{\"input\":[3,8,8],\"classes\":2,\"layers\":[{\"type\":\"flatten\","
                                        "\"name\":\"f\"},{\"type\":\"linear\",\"name\":\"fc\",\"out\":2}]}",
                                        err, sizeof err), 0);
    assert_string_equal(sf_config_eval_pipeline(&c), "[]");
}

static void test_an_eval_pipeline_with_a_random_op_is_refused_naming_it(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "augment.eval_pipeline",
                                        "[{\"op\":\"center_crop\",\"size\":[8,8]},{\"op\":\"random_rotation\","
                                        "\"degrees\":[-5,5]}]", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), -1);
    assert_string_equal(field, "augment.eval_pipeline");
    assert_non_null(strstr(err, "random_rotation"));
    assert_non_null(strstr(err, "deterministic"));
}

/* ---- to_json ---------------------------------------------------------------- */

static void test_to_json_nests_sections_and_masks_the_token(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    cJSON *j = sf_config_to_json(&c);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "http"), "token")->valuestring, "");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "model"), "spec")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "augment"), "pipeline")));
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "ring"), "slots")->valueint, 8);
    size_t n = 0;
    for (cJSON *s = j->child; s; s = s->next)
        n += (size_t)cJSON_GetArraySize(s);
    assert_int_equal(n, sf_config_table_len);
    cJSON_Delete(j);
    assert_int_equal(sf_config_set_text(&c, "http.token", "hunter2", err, sizeof err), 0);
    j = sf_config_to_json(&c);
    char *txt = cJSON_PrintUnformatted(j);
    assert_null(strstr(txt, "hunter2"));
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "http"), "token")->valuestring, "***");
    cJSON_free(txt);
    cJSON_Delete(j);
}

static void test_to_json_writes_int64_and_double_options_exactly(void **state)
{
    (void)state;
    sf_config c, back;
    sf_config_defaults(&c);
    /* 16 digits, and a double that 15 digits only approximate: cJSON's own
     * printing would round both (found by tests/fuzz/fuzz_config_patch.c). */
    assert_int_equal(sf_config_set_text(&c, "model.seed", "1234567890123457", err, sizeof err), 0);
    assert_int_equal(sf_config_set_text(&c, "optim.momentum", "0.9111111111111111", err, sizeof err), 0);
    cJSON *j = sf_config_to_json(&c);
    char *txt = cJSON_PrintUnformatted(j);
    assert_non_null(strstr(txt, "\"seed\":1234567890123457"));
    cJSON *parsed = cJSON_Parse(txt);
    sf_config_defaults(&back);
    char field[64];
    assert_int_equal(sf_config_apply_json(&back, parsed, err, sizeof err, field, sizeof field), 0);
    assert_true(back.model.seed == c.model.seed);
    assert_true(back.optim.momentum == c.optim.momentum);
    cJSON_Delete(parsed);
    cJSON_free(txt);
    cJSON_Delete(j);
}

/* ---- the live configuration and PATCH -------------------------------------- */

static int changes_seen;
static double lr_seen;
static void on_change_hook(const sf_config *c)
{
    changes_seen++;
    lr_seen = c->optim.lr;
}

static int live_setup(void **state)
{
    (void)state;
    sf_config c;
    sf_config_defaults(&c);
    sf_config_live_init(&c);
    changes_seen = 0;
    sf_config_on_change(on_change_hook);
    return 0;
}

static int patch_text(const char *json, cJSON **applied, cJSON **pending)
{
    cJSON *p = parse(json);
    *applied = *pending = NULL;
    field[0] = '\0';
    int rc = sf_config_patch(p, applied, pending, err, sizeof err, field, sizeof field);
    cJSON_Delete(p);
    return rc;
}

static void test_patch_is_all_or_nothing(void **state)
{
    (void)state;
    sf_config before, after;
    sf_config_get(&before);
    cJSON *ap, *pe;
    assert_int_equal(patch_text("{\"optim\":{\"lr\":0.5},\"ring\":{\"slots\":4},"
                                "\"log\":{\"level\":\"loud\"}}", &ap, &pe), -1);
    assert_string_equal(field, "log.level");
    assert_null(ap);
    assert_null(pe);
    sf_config_get(&after);
    assert_memory_equal(&before, &after, sizeof before);
    cJSON *pending = sf_config_pending();
    assert_int_equal(cJSON_GetArraySize(pending), 0);
    cJSON_Delete(pending);
    assert_int_equal(changes_seen, 0);
    /* A patch whose values pass alone but not together (semantic check). */
    assert_int_equal(patch_text("{\"ring\":{\"slots\":4096}}", &ap, &pe), -1);
    assert_string_equal(field, "ring.slots");
    sf_config_get(&after);
    assert_memory_equal(&before, &after, sizeof before);
}

static void test_patch_applies_hot_options_and_keeps_restart_only_ones_pending(void **state)
{
    (void)state;
    cJSON *ap, *pe;
    assert_int_equal(patch_text("{\"optim\":{\"lr\":0.5},\"ring\":{\"slots\":4}}", &ap, &pe), 0);
    assert_true(names_are(ap, "optim.lr", NULL));
    assert_true(names_are(pe, "ring.slots", NULL));
    cJSON_Delete(ap);
    cJSON_Delete(pe);
    sf_config c;
    sf_config_get(&c);
    assert_true(c.optim.lr == 0.5);
    assert_int_equal(c.ring.slots, 8); /* not applied */
    assert_int_equal(changes_seen, 1);
    assert_true(lr_seen == 0.5);
    cJSON *pending = sf_config_pending();
    assert_true(names_are(pending, "ring.slots", NULL));
    cJSON_Delete(pending);

    /* A second patch keeps the pending change and adds to it. */
    assert_int_equal(patch_text("{\"http\":{\"threads\":2}}", &ap, &pe), 0);
    assert_true(names_are(ap, NULL));
    assert_true(names_are(pe, "http.threads", "ring.slots", NULL));
    cJSON_Delete(ap);
    cJSON_Delete(pe);
    assert_int_equal(changes_seen, 1); /* nothing hot changed: no hook */

    /* Setting restart-only options back to the running values clears them. */
    assert_int_equal(patch_text("{\"ring\":{\"slots\":8},\"http\":{\"threads\":null}}", &ap, &pe), 0);
    assert_true(names_are(pe, NULL));
    cJSON_Delete(ap);
    cJSON_Delete(pe);

    /* A value equal to the current one is not reported as applied. */
    assert_int_equal(patch_text("{\"optim\":{\"lr\":0.5}}", &ap, &pe), 0);
    assert_true(names_are(ap, NULL));
    cJSON_Delete(ap);
    cJSON_Delete(pe);
}

static void test_patch_validates_against_pending_values_too(void **state)
{
    (void)state;
    cJSON *ap, *pe;
    /* 2*2100+64 > 4096: slots 2100 alone is rejected by the jobs_max check... */
    assert_int_equal(patch_text("{\"ring\":{\"slots\":2100}}", &ap, &pe), -1);
    assert_string_equal(field, "ring.slots");
    /* ...but with a pending jobs_max large enough both become pending together. */
    assert_int_equal(patch_text("{\"ring\":{\"slots\":2100},\"pipeline\":{\"jobs_max\":5000}}", &ap, &pe), 0);
    assert_true(names_are(pe, "ring.slots", "pipeline.jobs_max", NULL));
    cJSON_Delete(ap);
    cJSON_Delete(pe);
    /* Lowering the pending jobs_max again now conflicts with the pending
     * slots: the error is the option this patch set. */
    assert_int_equal(patch_text("{\"pipeline\":{\"jobs_max\":4096}}", &ap, &pe), -1);
    assert_string_equal(field, "pipeline.jobs_max");
}

/* A check guarding several options reports the one at fault: the one the
 * patch set, else the one its message names, never merely the first option
 * that lists the check; and the message names it once. */
static void test_a_cross_option_error_names_the_option_at_fault(void **state)
{
    (void)state;
    cJSON *ap, *pe;
    assert_int_equal(patch_text("{\"optim\":{\"schedule\":\"multistep\",\"milestones\":[30,10]}}", &ap, &pe), -1);
    assert_string_equal(field, "optim.milestones");
    assert_non_null(strstr(err, "increasing"));
    assert_int_equal(strncmp(err, "optim.milestones: ", 18), 0);
    assert_null(strstr(err + 1, "optim.milestones: optim.milestones"));
    assert_int_equal(patch_text("{\"optim\":{\"gamma\":0.5}}", &ap, &pe), 0);
    cJSON_Delete(ap);
    cJSON_Delete(pe);
    /* Options whose rule is checked beside another's: each carries it. */
    assert_int_equal(patch_text("{\"checkpoint\":{\"every_steps\":5}}", &ap, &pe), -1);
    assert_string_equal(field, "checkpoint.every_steps");
    assert_int_equal(patch_text("{\"checkpoint\":{\"resume\":\"true\"}}", &ap, &pe), -1);
    assert_string_equal(field, "checkpoint.resume");
    assert_int_equal(patch_text("{\"distributed\":{\"rank\":3}}", &ap, &pe), -1);
    assert_string_equal(field, "distributed.rank");

    /* Not through a patch (a file, flags): the option the message names. */
    sf_config c;
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "http.tls_key", "/etc/key.pem", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), -1);
    assert_string_equal(field, "http.tls_cert");
    assert_non_null(strstr(err, "go together"));
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "checkpoint.resume", "true", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), -1);
    assert_string_equal(field, "checkpoint.resume");
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "distributed.world_size", "2", err, sizeof err), 0);
    assert_int_equal(sf_config_set_text(&c, "distributed.rank", "0", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), -1);
    assert_string_equal(field, "distributed.world_size");
    assert_non_null(strstr(err, "needs http.token"));
    assert_int_equal(sf_config_set_text(&c, "http.token", "t0k", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), 0);
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "distributed.world_size", "2", err, sizeof err), 0);
    assert_int_equal(sf_config_set_text(&c, "distributed.rank", "1", err, sizeof err), 0);
    assert_int_equal(sf_config_set_text(&c, "distributed.allow_no_token", "true", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), -1);
    assert_string_equal(field, "distributed.rendezvous");
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "optim.schedule", "multistep", err, sizeof err), 0);
    assert_int_equal(sf_config_set_text(&c, "optim.milestones", "[5,5]", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), -1);
    assert_string_equal(field, "optim.milestones");
    /* The metrics port against the main one: the option the message names first. */
    sf_config_defaults(&c);
    assert_int_equal(sf_config_set_text(&c, "http.metrics_port", "8080", err, sizeof err), 0);
    assert_int_equal(sf_config_set_text(&c, "http.port", "8080", err, sizeof err), 0);
    assert_int_equal(sf_config_validate(&c, err, sizeof err, field, sizeof field), -1);
    assert_string_equal(field, "http.metrics_port");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_parse_and_hold_the_table_values),
        cmocka_unit_test(test_every_table_row_is_found_by_name_and_names_a_section),
        cmocka_unit_test(test_set_text_accepts_values_within_bounds_including_the_ends),
        cmocka_unit_test(test_set_text_rejects_out_of_range_values_naming_the_option),
        cmocka_unit_test(test_set_text_rejects_text_that_is_not_of_the_option_type),
        cmocka_unit_test(test_set_text_parses_every_boolean_spelling),
        cmocka_unit_test(test_set_text_accepts_only_the_choices_of_an_enum),
        cmocka_unit_test(test_a_boolean_widened_into_an_enum_keeps_its_boolean_spellings),
        cmocka_unit_test(test_set_text_rejects_a_string_longer_than_its_field),
        cmocka_unit_test(test_set_text_rejects_an_unknown_option),
        cmocka_unit_test(test_apply_json_sets_nested_options_and_null_resets_to_the_default),
        cmocka_unit_test(test_apply_json_names_the_field_of_an_unknown_key),
        cmocka_unit_test(test_apply_json_names_the_field_of_a_wrong_type),
        cmocka_unit_test(test_validate_runs_the_semantic_checks_and_names_the_field),
        cmocka_unit_test(test_load_applies_file_then_env_then_flags),
        cmocka_unit_test(test_load_fails_on_a_bad_flag_env_or_file),
        cmocka_unit_test(test_presets_bring_their_recipes_and_an_explicit_pipeline_overrides),
        cmocka_unit_test(test_an_eval_pipeline_with_a_random_op_is_refused_naming_it),
        cmocka_unit_test(test_to_json_nests_sections_and_masks_the_token),
        cmocka_unit_test(test_to_json_writes_int64_and_double_options_exactly),
        cmocka_unit_test_setup(test_patch_is_all_or_nothing, live_setup),
        cmocka_unit_test_setup(test_patch_applies_hot_options_and_keeps_restart_only_ones_pending, live_setup),
        cmocka_unit_test_setup(test_patch_validates_against_pending_values_too, live_setup),
        cmocka_unit_test_setup(test_a_cross_option_error_names_the_option_at_fault, live_setup),
        cmocka_unit_test(test_validate_refuses_mixup_or_cutmix_with_a_segmentation_model_either_way_and_in_an_eval_pipeline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
