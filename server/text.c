/* server/text.c — UTF-8 validation and sanitising (server/text.h). */
#include "server/text.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

size_t sf_utf8_seq(const unsigned char *s, size_t avail)
{
    if (avail == 0)
        return 0;
    const unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 1;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 2;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 3;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (avail <= n)
        return 0;
    for (size_t k = 1; k <= n; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n + 1;
}

size_t sf_utf8_valid_prefix(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        const size_t n = sf_utf8_seq(s + i, len - i);
        if (!n)
            return i;
        i += n;
    }
    return len;
}

static int is_control(unsigned char c) { return c < 0x20 || c == 0x7F; }

int sf_text_ok(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    const size_t len = strlen(s);
    for (size_t i = 0; i < len; i++)
        if (is_control(p[i]))
            return 0;
    return sf_utf8_valid_prefix(p, len) == len;
}

void sf_text_sanitize(char *s)
{
    unsigned char *p = (unsigned char *)s;
    size_t len = strlen(s), i = 0;
    while (i < len) {
        const size_t n = sf_utf8_seq(p + i, len - i);
        if (n == 0 || (n == 1 && is_control(p[i]))) {
            p[i++] = '?';
            continue;
        }
        i += n;
    }
}

/* A NUL in the text: a raw byte anywhere, or a \u0000 escape in a string. */
static int json_has_nul(const char *buf, size_t len)
{
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        const char ch = buf[i];
        if (ch == '\0')
            return 1;
        if (!in_str) {
            in_str = ch == '"';
            continue;
        }
        if (ch == '"') {
            in_str = 0;
        } else if (ch == '\\' && i + 1 < len) {
            if (buf[i + 1] == 'u' && i + 5 < len && !memcmp(buf + i + 2, "0000", 4))
                return 1;
            i++; /* the escaped character, so that \\ and \" are not read again */
        }
    }
    return 0;
}

cJSON *sf_json_parse_whole(const char *buf, size_t len, const char **why)
{
    if (json_has_nul(buf, len)) {
        *why = "the JSON text holds a NUL character (a raw byte or \\u0000)";
        return NULL;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!j) {
        *why = "not valid JSON";
        return NULL;
    }
    for (const char *p = end; p && p < buf + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(j);
            *why = "more text follows the JSON value";
            return NULL;
        }
    return j;
}

void sf_url_redact(const char *url, char *out, size_t cap)
{
    const char *rest = url, *sep = strstr(url, "://");
    size_t head = 0;
    if (sep) {
        head = (size_t)(sep + 3 - url);
        const char *auth = sep + 3;
        size_t alen = strcspn(auth, "/?#");
        const char *at = NULL;
        for (const char *c = auth; c < auth + alen; c++)
            if (*c == '@')
                at = c;
        rest = at ? at + 1 : auth;
    }
    size_t n = strcspn(rest, "?#");
    snprintf(out, cap, "%.*s%.*s%s", (int)(head < 16 ? head : 16), url, (int)(n < 400 ? n : 400), rest,
             rest[n] ? "?…" : "");
}
