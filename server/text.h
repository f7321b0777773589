/* server/text.h — client text made safe to store, echo and log: UTF-8
 * validation, and the replacements error replies and log lines use, so that
 * a reply stays valid UTF-8 JSON and a log line stays one line whatever
 * bytes a client sent; and JSON text read as exactly one value. */
#ifndef SF_TEXT_H
#define SF_TEXT_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* The length (1..4) of the well-formed UTF-8 sequence at s, of at most avail
 * bytes; 0 when it is not one (a stray continuation byte, an overlong form, a
 * surrogate, beyond U+10FFFF, or cut short). */
size_t sf_utf8_seq(const unsigned char *s, size_t avail);
/* The offset of the first ill-formed sequence of s[0..len), or len. */
size_t sf_utf8_valid_prefix(const unsigned char *s, size_t len);
/* 1 when s is well-formed UTF-8 without control characters (U+0000..U+001F,
 * U+007F): what a configuration value may hold. */
int sf_text_ok(const char *s);
/* In place: every byte of an ill-formed sequence and every control character
 * becomes '?'. */
void sf_text_sanitize(char *s);

/* The JSON value that buf[0..len) is, as a whole; NULL with *why (a static
 * string) when it is not valid JSON, when anything but whitespace follows
 * the value (cJSON alone stops at the value's end, so "{...} junk" or two
 * objects in a row would pass as the first), or when it holds a NUL, as a
 * raw byte or a \u0000 escape: C strings end there, so a key or a value
 * would be read shorter than it was sent (a bearer token cut at the NUL). */
cJSON *sf_json_parse_whole(const char *buf, size_t len, const char **why);

/* The URL without user:password@, query and fragment (at most its first 400
 * bytes of path), for replies and logs: a signed URL carries its credentials
 * in the query. Text without "://" loses only a query. */
void sf_url_redact(const char *url, char *out, size_t cap);

#endif
