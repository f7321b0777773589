/* tests/unit/test_text.c — client text made safe (server/text.c): UTF-8
 * validation at the edges of the encoding, sanitising for error replies, and
 * the log formats (server/log.c) keeping one record on one line and valid
 * UTF-8 whatever a request path holds; JSON text read as exactly one value
 * with no NUL in it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "server/log.h"
#include "server/text.h"

static size_t prefix(const char *s) { return sf_utf8_valid_prefix((const unsigned char *)s, strlen(s)); }

static void test_well_formed_utf8_is_accepted_to_the_last_code_point(void **state)
{
    (void)state;
    assert_int_equal(prefix("plain ascii"), 11);
    assert_int_equal(prefix("caf\xc3\xa9"), 5);              /* U+00E9 */
    assert_int_equal(prefix("\xe2\x82\xac"), 3);             /* U+20AC */
    assert_int_equal(prefix("\xf0\x9f\x98\x80"), 4);         /* U+1F600 */
    assert_int_equal(prefix("\xf4\x8f\xbf\xbf"), 4);         /* U+10FFFF */
    assert_int_equal(prefix("\xed\x9f\xbf"), 3);             /* U+D7FF, just below the surrogates */
}

static void test_ill_formed_sequences_are_found_where_they_start(void **state)
{
    (void)state;
    assert_int_equal(prefix("ab\xff"), 2);                   /* never valid */
    assert_int_equal(prefix("ab\x80"), 2);                   /* stray continuation */
    assert_int_equal(prefix("\xc0\xaf"), 0);                 /* overlong '/' */
    assert_int_equal(prefix("\xe0\x80\xaf"), 0);             /* overlong, 3 bytes */
    assert_int_equal(prefix("\xed\xa0\x80"), 0);             /* a surrogate, U+D800 */
    assert_int_equal(prefix("\xf4\x90\x80\x80"), 0);         /* beyond U+10FFFF */
    assert_int_equal(prefix("x\xe2\x82"), 1);                /* cut short */
    assert_int_equal(prefix("\xc3\x28"), 0);                 /* a lead byte without its continuation */
}

static void test_config_text_refuses_control_characters_and_bad_bytes(void **state)
{
    (void)state;
    assert_true(sf_text_ok(""));
    assert_true(sf_text_ok("models.example.com,caf\xc3\xa9"));
    assert_false(sf_text_ok("\xff\xfe.example.com"));
    assert_false(sf_text_ok("token\n"));
    assert_false(sf_text_ok("a\x7f"));
}

static void test_sanitising_replaces_each_bad_byte_and_keeps_the_rest(void **state)
{
    (void)state;
    char s[] = "/v1/\xff\xfe/caf\xc3\xa9\n\xe2\x82";
    sf_text_sanitize(s);
    assert_string_equal(s, "/v1/?" "?/caf\xc3\xa9?" "?" "?");
    assert_int_equal(prefix(s), strlen(s));
}

/* One record rendered by sf_log_fields, captured from stderr. */
static char *log_record(int json, const char *path)
{
    fflush(stderr);
    char name[] = "/tmp/sf_test_text_XXXXXX";
    int fd = mkstemp(name);
    assert_true(fd >= 0);
    int saved = dup(2);
    dup2(fd, 2);
    sf_log_set_json(json);
    sf_log_field f[] = {SF_LF_STR("path", path)};
    sf_log_fields(SF_LOG_ERROR, "request", f, 1);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    static char buf[4096];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    unlink(name);
    assert_true(n > 0);
    buf[n] = 0;
    return buf;
}

static int lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static void test_a_request_path_cannot_forge_log_lines_or_break_utf8(void **state)
{
    (void)state;
    const char *path = "/v1/batches/1\n2026-11-25T00:00:00.000Z error FORGED\xff";
    char *t = log_record(0, path);
    assert_int_equal(lines(t), 1);
    assert_non_null(strstr(t, "1\\n2026"));
    assert_non_null(strstr(t, "FORGED\\xff"));
    assert_int_equal(prefix(t), strlen(t));
    char *j = log_record(1, path);
    assert_int_equal(lines(j), 1);
    assert_non_null(strstr(j, "1\\u000a2026"));
    assert_non_null(strstr(j, "FORGED\\ufffd"));
    assert_int_equal(prefix(j), strlen(j));
    sf_log_set_json(0);
}

static int whole(const char *text, size_t len, const char **why)
{
    cJSON *j = sf_json_parse_whole(text, len, why);
    cJSON_Delete(j);
    return j != NULL;
}

static void test_json_text_must_be_one_value_without_a_nul(void **state)
{
    (void)state;
    const char *why = NULL;
    /* one value, whitespace around it, escapes that are not a NUL (the
     * fourth is a backslash followed by the text u0000) */
    const char *good[] = {"{\"a\":1}", "  [1,2]\r\n\t ", "\"tab\\tquote\\\"\"", "\"\\\\u0000\"",
                          "\"\\u0001\"", "0"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        assert_true(whole(good[i], strlen(good[i]), &why));
    /* trailing text, two values, a NUL escape in a key or a value, nothing */
    const char *bad[] = {"{\"optim\":{\"lr\":0.3}} xyz", "{\"a\":1}{\"a\":5}", "{\"a\":1},",
                         "{\"optim\\u0000x\":{\"lr\":0.1}}", "{\"t\":\"abc\\u0000-secret\"}",
                         "{\"k\":\"\\u00001\"}", "[1]]]]", "", "   "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why = NULL;
        assert_false(whole(bad[i], strlen(bad[i]), &why));
        assert_non_null(why);
    }
    const char raw[] = {'{', '"', 'a', '"', ':', '"', 'x', '\0', 'y', '"', '}'};
    assert_false(whole(raw, sizeof raw, &why));
    assert_non_null(strstr(why, "NUL"));
    /* the length bounds the text: what lies beyond it is not read */
    assert_true(whole("{\"a\":1} junk", 7, &why));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_well_formed_utf8_is_accepted_to_the_last_code_point),
        cmocka_unit_test(test_ill_formed_sequences_are_found_where_they_start),
        cmocka_unit_test(test_config_text_refuses_control_characters_and_bad_bytes),
        cmocka_unit_test(test_sanitising_replaces_each_bad_byte_and_keeps_the_rest),
        cmocka_unit_test(test_a_request_path_cannot_forge_log_lines_or_break_utf8),
        cmocka_unit_test(test_json_text_must_be_one_value_without_a_nul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
