/* handlers/model.c — GET /v1/model: layers, shapes, parameter counts. */
#include <string.h>

#include "gpu/layers.h"
#include "handlers/handlers.h"
#include "server/app.h"
#include "server/jobs.h"

int h_model(sf_req *r)
{
    const sf_app *app = r->app;
    const sf_model *m = &app->model;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "preset", m->preset);
    cJSON *in = cJSON_AddArrayToObject(o, "input");
    cJSON_AddItemToArray(in, cJSON_CreateNumber(m->in_c));
    cJSON_AddItemToArray(in, cJSON_CreateNumber(m->in_h));
    cJSON_AddItemToArray(in, cJSON_CreateNumber(m->in_w));
    cJSON_AddNumberToObject(o, "classes", m->n_classes);
    cJSON_AddNumberToObject(o, "params", (double)m->n_params);
    /* What the backend computes in, and what was asked for where they differ
     * (tf32 on the reference backend, which has no tensor cores to round for). */
    const char *prec = app->precision ? app->precision : app->cfg.model.precision;
    cJSON_AddStringToObject(o, "precision", prec);
    if (strcmp(prec, app->cfg.model.precision) != 0)
        cJSON_AddStringToObject(o, "precision_configured", app->cfg.model.precision);
    cJSON_AddNumberToObject(o, "step", (double)atomic_load(&((sf_app *)app)->step));
    cJSON_AddStringToObject(o, "backend", app->backend_name ? app->backend_name : "none");
    if (app->plan) {
        cJSON_AddNumberToObject(o, "device_memory_bytes", (double)app->plan_device_bytes);
        /* one string per line of the backend's description */
        cJSON *plan = cJSON_AddArrayToObject(o, "plan");
        for (const char *p = app->plan; *p;) {
            const char *e = strchr(p, '\n');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            char line[512];
            if (n >= sizeof line)
                n = sizeof line - 1;
            memcpy(line, p, n);
            line[n] = '\0';
            if (n)
                cJSON_AddItemToArray(plan, cJSON_CreateString(line));
            p += e ? (size_t)(e - p) + 1 : strlen(p);
        }
    }
    /* What the encoded batches' decoder holds now, beside the plan's figure
     * (the model's and the batch buffers', fixed at build): the CUDA backend
     * makes it by the first encoded batch, so a job that never posted one
     * shows none. Absent where the backend holds no decoder of its own. */
    sf_decoder_memory dm;
    if (app->backend && app->backend->i->decoder_memory &&
        app->backend->i->decoder_memory(app->backend, &dm) == 0) {
        cJSON *jd = cJSON_AddObjectToObject(o, "jpeg_decoder");
        cJSON_AddBoolToObject(jd, "made", dm.made);
        cJSON_AddNumberToObject(jd, "device_bytes", (double)dm.device_bytes);
        cJSON_AddNumberToObject(jd, "pinned_bytes", (double)dm.pinned_bytes);
    }
    cJSON *warnings = cJSON_AddArrayToObject(o, "warnings");
    if (app->model_warning[0])
        cJSON_AddItemToArray(warnings, cJSON_CreateString(app->model_warning));
    cJSON *layers = cJSON_AddArrayToObject(o, "layers");
    for (int i = 0; i < m->n_layers; i++) {
        const sf_layer *l = &m->layers[i];
        cJSON *lj = cJSON_CreateObject();
        cJSON_AddStringToObject(lj, "name", l->name);
        cJSON_AddStringToObject(lj, "type", sf_layer_kind_name(l->kind));
        cJSON *out = cJSON_AddArrayToObject(lj, "out");
        if (l->tokens) {
            /* A token sequence reads as PyTorch's per-sample [T, C]. */
            cJSON_AddItemToArray(out, cJSON_CreateNumber(l->out_h));
            cJSON_AddItemToArray(out, cJSON_CreateNumber(l->out_ch));
        } else {
            cJSON_AddItemToArray(out, cJSON_CreateNumber(l->out_ch));
            if (!sf_layer_out_is_features(l)) {
                cJSON_AddItemToArray(out, cJSON_CreateNumber(l->out_h));
                cJSON_AddItemToArray(out, cJSON_CreateNumber(l->out_w));
            }
        }
        cJSON_AddNumberToObject(lj, "params", (double)sf_layer_param_count(l));
        cJSON_AddItemToArray(layers, lj);
    }
    return sf_reply_json(r, 200, o);
}
