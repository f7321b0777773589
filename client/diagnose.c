/* client/diagnose.c — streamfeed-load --diagnose: sends no batch, asks the
 * server where its pipeline loses time (POST /v1/diagnose) and prints the
 * four stages, the drop each causes and the verdict on one screen, or the
 * server's JSON as it is with --json.
 */
#include <curl/curl.h>
#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/loader.h"

static const char *diag_str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* The reply of POST /v1/diagnose as one screen: the four stages, the drop
 * each stage causes, the verdict and its suggestion. */
static void print_diagnosis(const options *o, const cJSON *j)
{
    static const char *const rows[3] = {
        "(1) step: augmented, on device",
        "(2) augment+step: raw, on device",
        "(3) H2D+augment+step: pinned host",
    };
    static const char *const drop_keys[3] = {"augmentation", "h2d", "ingest"};
    static const char *const drop_names[3] = {"augment", "H2D", "ingest"};
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "batch");
    const cJSON *stages = cJSON_GetObjectItemCaseSensitive(j, "stages");
    const cJSON *drops = cJSON_GetObjectItemCaseSensitive(j, "drops");
    double thr = json_num(j, "threshold", 0.15);
    printf("diagnose %s: backend %s, %.3g s\n", o->url, diag_str(j, "backend"), json_num(j, "seconds", 0));
    printf("batch: %d x %dx%dx%d %s, labels %s (%s)\n\n", (int)json_num(b, "n", 0), (int)json_num(b, "h", 0),
           (int)json_num(b, "w", 0), (int)json_num(b, "c", 0), diag_str(b, "layout"), diag_str(b, "label_dtype"),
           strcmp(diag_str(b, "source"), "last_batch") == 0 ? "as the last trained batch"
                                                           : "no batch yet: the model's input");
    printf("  %-34s %8s %9s %5s  %s\n", "stage", "steps/s", "samples/s", "vs(1)", "lost");
    for (int i = 0; i < 4; i++) {
        const cJSON *st = cJSON_GetArrayItem(stages, i);
        char label[48], lost[32] = "";
        if (i == 3)
            snprintf(label, sizeof label, "(4) live: last %.3g s of traffic", json_num(st, "seconds", 0));
        else
            snprintf(label, sizeof label, "%s", rows[i]);
        if (i > 0) {
            double d = json_num(drops, drop_keys[i - 1], 0);
            snprintf(lost, sizeof lost, "%3.0f%% %s%s", 100 * d, drop_names[i - 1], d > thr ? " <--" : "");
        }
        printf("  %-34s %8.1f %9.0f %5.2f%s%s\n", label, json_num(st, "steps_per_s", 0),
               json_num(st, "samples_per_s", 0), json_num(st, "ratio", 0), lost[0] ? "  " : "", lost);
    }
    printf("\nverdict: %s\n", diag_str(j, "bottleneck"));
    fputs("  ", stdout);
    print_wrapped(stdout, diag_str(j, "suggestion"), 2, 79);
    printf("(a stage is named when it loses more than %.0f%% of the rate before it;\n"
           " stages 1-3 use a cached batch while training pauses; the state is restored)\n",
           100 * thr);
}

/* --diagnose: one POST /v1/diagnose. Exit status 0 on a verdict, 1 on an
 * error reply or a transport failure. */
int run_diagnose(const options *o)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "streamfeed-load: curl_global_init failed\n");
        return 1;
    }
    char url[2048], body[64] = "";
    snprintf(url, sizeof url, "%s/v1/diagnose", o->url);
    if (o->seconds > 0)
        snprintf(body, sizeof body, "{\"seconds\":%.6g}", o->seconds);
    reply_buf rep = {malloc(REPLY_CAP + 1), 0};
    CURL *h = curl_easy_init();
    struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/json");
    if (hl)
        hl = curl_slist_append(hl, "Accept: application/json");
    if (hl && o->token) {
        char auth[1024];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o->token);
        hl = curl_slist_append(hl, auth);
    }
    int rc = 1;
    if (!rep.data || !h || !hl) {
        fprintf(stderr, "streamfeed-load: could not set up the request\n");
        goto out;
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, reply_buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &rep);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, o->timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "streamfeed-load/1");
    set_tls(h, o);
    if (!o->quiet && isatty(STDERR_FILENO))
        fprintf(stderr, "streamfeed-load: diagnosing %s (training pauses meanwhile)...\n", o->url);
    CURLcode cr = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    rep.data[rep.len] = '\0';
    if (cr != CURLE_OK) {
        fprintf(stderr, "streamfeed-load: POST %s: %s\n", url, curl_easy_strerror(cr));
        goto out;
    }
    if (status != 200) {
        char code[ERROR_CODE_LEN], message[512];
        long retry_ms;
        read_error_reply(rep.data, rep.len, status, code, sizeof code, message, sizeof message, &retry_ms);
        fprintf(stderr, "streamfeed-load: diagnose failed: %s: %s\n", code, message);
        goto out;
    }
    cJSON *j = cJSON_ParseWithLength(rep.data, rep.len);
    if (!j || !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "stages")) ||
        cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "stages")) != 4) {
        fprintf(stderr, "streamfeed-load: the diagnose reply is not the expected JSON\n");
        cJSON_Delete(j);
        goto out;
    }
    if (o->json)
        printf("%s\n", rep.data);
    else
        print_diagnosis(o, j);
    fflush(stdout);
    cJSON_Delete(j);
    rc = 0;
out:
    curl_slist_free_all(hl);
    if (h)
        curl_easy_cleanup(h);
    free(rep.data);
    curl_global_cleanup();
    return rc;
}
