/* server/config_impl.h — what the configuration's files share among themselves:
 * the table's cross-field checks (config_checks.c), field access and setting
 * (config_load.c), validation, and the preset recipes (config.c). Only the
 * server/config*.c files include it; every other module uses config.h. */
#ifndef SF_SERVER_CONFIG_IMPL_H
#define SF_SERVER_CONFIG_IMPL_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "server/config.h"

/* The checks a row names (sf_cfg_option.check), in config_checks.c. Each
 * writes its reason and returns -1 when the options it guards do not fit
 * together. */
int check_model(const sf_config *c, char *err, size_t errlen);
int check_augment(const sf_config *c, char *err, size_t errlen);
int check_slots(const sf_config *c, char *err, size_t errlen);
int check_slot_bytes(const sf_config *c, char *err, size_t errlen);
int check_checkpoint(const sf_config *c, char *err, size_t errlen);
int check_host(const sf_config *c, char *err, size_t errlen);
int check_listeners(const sf_config *c, char *err, size_t errlen);
int check_token(const sf_config *c, char *err, size_t errlen);
int check_tls_priorities(const sf_config *c, char *err, size_t errlen);
int check_schedule(const sf_config *c, char *err, size_t errlen);
int check_distributed(const sf_config *c, char *err, size_t errlen);
int check_eval_augment(const sf_config *c, char *err, size_t errlen);

/* Runs every row's check on c; base (or NULL) is the config the change
 * started from, which decides the option a failure is reported under. */
int sf_cfg_validate_change(const sf_config *c, const sf_config *base, char *err, size_t errlen, char *field,
                           size_t fieldlen);

/* Option o's field in c. */
void *sf_cfg_field_ptr(sf_config *c, const sf_cfg_option *o);
const void *sf_cfg_field_cptr(const sf_config *c, const sf_cfg_option *o);
/* Whether a and b hold the same value of option o. */
int sf_cfg_field_equal(const sf_config *a, const sf_config *b, const sf_cfg_option *o);
/* Sets option o of c from a JSON value, checking its type and bounds. */
int sf_cfg_set_json(sf_config *c, const sf_cfg_option *o, const cJSON *v, char *err, size_t errlen);
/* A bound or value as people write it (integer options as integers). */
const char *sf_cfg_fmt_num(const sf_cfg_option *o, double v, char *buf, size_t cap);

/* The environment variable of option opt: STREAMFEED_ and the name in
 * capitals, dots as underscores. */
void sf_cfg_env_name(const char *opt, char *out, size_t cap);

/* Each preset's train and eval pipelines (augment.pipeline and
 * augment.eval_pipeline when those are empty). */
typedef struct sf_cfg_recipe {
    const char *preset, *train, *eval;
} sf_cfg_recipe;
extern const sf_cfg_recipe sf_cfg_recipes[];
extern const size_t sf_cfg_recipes_len;

/* The preset's train (eval = 0) or eval pipeline, "[]" for a model.spec
 * model or a preset without one. */
const char *sf_cfg_recipe_of(const sf_config *c, int eval);
/* The preset whose recipe sf_cfg_recipe_of gives, or NULL. */
const char *sf_cfg_recipe_preset(const sf_config *c);

#endif
