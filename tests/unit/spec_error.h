/* tests/unit/spec_error.h — the check the model-spec tests share: a JSON
 * spec that sf_model_from_json must refuse with a message naming what is
 * wrong. Include after <cmocka.h> and gpu/model.h. */
#ifndef SF_TESTS_UNIT_SPEC_ERROR_H
#define SF_TESTS_UNIT_SPEC_ERROR_H

#include <string.h>

/* js is refused, and the message holds needle1 and (unless NULL) needle2. */
static void expect_json_error(const char *js, const char *needle1, const char *needle2)
{
    static sf_model m;
    static char why[256];
    why[0] = 0;
    assert_int_equal(sf_model_from_json(js, &m, why, sizeof why), -1);
    if (!strstr(why, needle1) || (needle2 && !strstr(why, needle2)))
        fail_msg("error \"%s\" should mention \"%s\" and \"%s\"", why, needle1, needle2 ? needle2 : "");
}

#endif /* SF_TESTS_UNIT_SPEC_ERROR_H */
