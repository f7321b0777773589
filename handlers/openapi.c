/* handlers/openapi.c — GET /openapi.yaml: the spec, embedded at build time
 * (the Makefile links openapi/streamfeed.yaml into the binary with ld -b binary). */
#include "handlers/handlers.h"

extern const char _binary_openapi_streamfeed_yaml_start[];
extern const char _binary_openapi_streamfeed_yaml_end[];

int h_openapi(sf_req *r)
{
    size_t len = (size_t)(_binary_openapi_streamfeed_yaml_end - _binary_openapi_streamfeed_yaml_start);
    return sf_reply_bytes(r, 200, "application/yaml", (void *)_binary_openapi_streamfeed_yaml_start,
                          len, NULL);
}
