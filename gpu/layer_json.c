/* gpu/layer_json.c — a layer's fields written back as the JSON its spec
 * gave (a checkpoint's spec, GET /v1/model): every field of the kind's row
 * but the inferred ones, the optional ones only where set, and the
 * parameter names the spec renamed. */
#include "gpu/layers.h"

#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>

/* "param_names", as the layer's JSON gave it: each renamed slot under the
 * kind's own suffix. */
static void param_names_to_json(const sf_layer *L, cJSON *obj)
{
    const sf_layer_kind_info *k = sf_layer_info(L->kind);
    sf_param_desc pd[SF_PARAM_SLOTS];
    const int np = k->params ? k->params(L, pd) : 0;
    cJSON *names = NULL;
    for (int j = 0; j < np; j++) {
        if (!L->param_names[j][0])
            continue;
        if (!names)
            names = cJSON_AddObjectToObject(obj, "param_names");
        const int bare = !strcmp(L->param_names[j], SF_PARAM_BARE);
        cJSON_AddStringToObject(names, pd[j].suffix, bare ? "" : L->param_names[j]);
    }
}

void sf_layer_fields_to_json(const sf_layer *L, cJSON *obj)
{
    const sf_layer_kind_info *k = sf_layer_info(L->kind);
    if (!k)
        return;
    param_names_to_json(L, obj);
    for (const sf_layer_field *f = k->fields; f->key; f++) {
        if (f->flags & SF_FF_INFERRED)
            continue;
        const char *p = (const char *)L + f->off;
        const int two = f->type == SF_FT_INT_PAIR || f->type == SF_FT_INT_HW;
        const int w = two ? *(const int *)((const char *)L + SF_FT_SECOND(f)) : 0;
        const double def = f->type == SF_FT_FLOAT ? (float)f->def : f->def;
        /* an optional field at its default is left out; a pair only when both values are */
        if ((f->flags & SF_FF_IF_SET) && sf_layer_field_value(L, f) == def && (!two || w == (int)f->def))
            continue;
        switch (f->type) {
        case SF_FT_INT:
            cJSON_AddNumberToObject(obj, f->key, *(const int *)p);
            break;
        case SF_FT_BOOL:
            cJSON_AddBoolToObject(obj, f->key, *(const int *)p);
            break;
        case SF_FT_FLOAT:
            cJSON_AddNumberToObject(obj, f->key, *(const float *)p);
            break;
        case SF_FT_ENUM:
            cJSON_AddStringToObject(obj, f->key, f->choices[*(const int *)p]);
            break;
        case SF_FT_INT_PAIR:
        case SF_FT_INT_HW: /* HW: one number where both dimensions agree, as a square spec is written */
            if (f->type == SF_FT_INT_HW && w == *(const int *)p) {
                cJSON_AddNumberToObject(obj, f->key, w);
            } else {
                cJSON *a = cJSON_AddArrayToObject(obj, f->key);
                cJSON_AddItemToArray(a, cJSON_CreateNumber(*(const int *)p));
                cJSON_AddItemToArray(a, cJSON_CreateNumber(w));
            }
            break;
        case SF_FT_INT_QUAD: {
            cJSON *a = cJSON_AddArrayToObject(obj, f->key);
            for (int j = 0; j < 4; j++)
                cJSON_AddItemToArray(a, cJSON_CreateNumber(((const int *)p)[j]));
            break;
        }
        }
    }
}
