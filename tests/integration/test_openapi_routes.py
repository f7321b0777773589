"""The OpenAPI spec and the server's route table list exactly the same
(method, path) pairs, the spec and docs/TROUBLESHOOTING.md name every error code
the sources send, and the server serves the spec file byte for byte."""
import re

import yaml

from sfharness import REPO, SINK

ROUTES_C = REPO / "handlers" / "routes.c"
SPEC = REPO / "openapi" / "streamfeed.yaml"
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}

# One row of sf_routes[]: {"GET", "/healthz", "healthz", h_healthz, ...}
_ROUTE_ROW = re.compile(r'\{\s*"([A-Z]+)"\s*,\s*"(/[^"]*)"\s*,')


def routes_from_c():
    src = ROUTES_C.read_text()
    table = src[src.index("sf_routes[]"):]
    table = table[:table.index("};")]
    routes = {(m.group(1), m.group(2)) for m in _ROUTE_ROW.finditer(table)}
    assert routes, "no route rows found in handlers/routes.c"
    return routes


def routes_from_spec():
    spec = yaml.safe_load(SPEC.read_text())
    assert str(spec.get("openapi", "")).startswith("3."), "not an OpenAPI 3 document"
    return {(method.upper(), path) for path, item in spec["paths"].items()
            for method in item if method in HTTP_METHODS}


def test_route_table_parse_finds_the_known_routes():
    routes = routes_from_c()
    assert ("GET", "/healthz") in routes
    assert ("POST", "/v1/batches") in routes
    assert ("GET", "/v1/batches/{id}") in routes


def test_every_route_of_the_server_is_in_the_spec():
    missing = routes_from_c() - routes_from_spec()
    assert not missing, f"routes in handlers/routes.c but not in openapi/streamfeed.yaml: {sorted(missing)}"


def test_every_path_of_the_spec_is_a_route_of_the_server():
    extra = routes_from_spec() - routes_from_c()
    assert not extra, f"operations in openapi/streamfeed.yaml but not in handlers/routes.c: {sorted(extra)}"


def open_routes_from_c():
    """The (method, path) rows of sf_routes[] flagged SF_ROUTE_OPEN."""
    src = ROUTES_C.read_text()
    table = src[src.index("sf_routes[]"):]
    table = table[:table.index("};")]
    rows = re.finditer(r'\{\s*"([A-Z]+)"\s*,\s*"(/[^"]*)"([^{}]*)\}', table)
    return {(m.group(1), m.group(2)) for m in rows if "SF_ROUTE_OPEN" in m.group(3)}


def test_the_spec_asks_for_the_token_on_exactly_the_routes_that_are_not_open():
    spec = yaml.safe_load(SPEC.read_text())
    assert "security" not in spec, "a top-level security would apply to the open routes too"
    guarded = {(method.upper(), path) for path, item in spec["paths"].items()
               for method, op in item.items() if method in HTTP_METHODS and op.get("security")}
    open_routes = open_routes_from_c()
    assert ("GET", "/healthz") in open_routes and ("GET", "/v1/batches/{id}/logits") not in open_routes
    assert guarded == routes_from_c() - open_routes, (
        f"no security in the spec on guarded routes: {sorted(routes_from_c() - open_routes - guarded)}; "
        f"security on open routes: {sorted(guarded & open_routes)}")
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if (method.upper(), path) in guarded:
                assert "401" in op["responses"], (method, path)


def test_get_openapi_yaml_returns_the_spec_file_byte_for_byte(start_server):
    s = start_server(SINK)
    r = s.get("/openapi.yaml")
    assert r.status_code == 200
    assert "yaml" in r.headers["Content-Type"]
    assert r.content == SPEC.read_bytes(), (
        "GET /openapi.yaml differs from openapi/streamfeed.yaml (rebuild the binary after editing the spec)")
    assert yaml.safe_load(r.content)["paths"]


# An error reply's status and code as the sources write them:
# sf_reply_error(r, 409, "no_backend", ...), reject(r, u, 413, "body_too_large", ...),
# fail(e, 400, "path_invalid", "path", ...), and a status chosen with its code:
# fail(e, w ? 400 : 404, w ? "path_invalid" : "checkpoint_not_found", ...).
_ERROR_CODE = re.compile(r'\b([1-5]\d\d)\s*,\s*"([a-z][a-z0-9_]*)"')
_ERROR_CODE_PAIR = re.compile(r'\b([1-5]\d\d)\s*:\s*([1-5]\d\d)\s*,[^,;]*\?\s*"([a-z][a-z0-9_]*)"\s*:\s*"([a-z][a-z0-9_]*)"')


def error_codes_from_sources():
    """{code: {statuses}} for every error code the sources send; the batch
    parser's codes, whose status upload.c chooses, carry no status."""
    codes = {}
    for d in ("server", "handlers", "dist"):
        for f in (REPO / d).glob("*.c"):
            src = f.read_text()
            for m in _ERROR_CODE.finditer(src):
                codes.setdefault(m.group(2), set()).add(int(m.group(1)))
            for m in _ERROR_CODE_PAIR.finditer(src):
                codes.setdefault(m.group(3), set()).add(int(m.group(1)))
                codes.setdefault(m.group(4), set()).add(int(m.group(2)))
    assert len(codes) > 50, sorted(codes)  # the patterns still find the calls
    # The batch parser's codes (server/safetensors.c error_names), sent as
    # the reply's code; bad_call is a caller's bug, never a reply.
    st = (REPO / "server" / "safetensors.c").read_text()
    table = st[st.index("error_names[SF_ST_ERROR_COUNT]"):]
    parser_codes = set(re.findall(r'=\s*"([a-z][a-z0-9_]*)"', table[:table.index("};")])) - {"ok", "bad_call"}
    assert len(parser_codes) > 20, sorted(parser_codes)
    for c in parser_codes:
        codes.setdefault(c, set())
    return codes


def test_every_error_code_the_sources_send_is_in_the_spec():
    spec = SPEC.read_text()
    missing = sorted(c for c in error_codes_from_sources() if not re.search(r"\b" + c + r"\b", spec))
    assert not missing, f"error codes the spec does not name: {missing}"


def test_the_troubleshooting_page_lists_every_error_code_with_a_status_the_sources_send():
    rows = {}
    for line in (REPO / "docs" / "TROUBLESHOOTING.md").read_text().splitlines():
        m = re.match(r"\| `([a-z][a-z0-9_]*)` \| (\d{3}) \|", line)
        if m:
            rows[m.group(1)] = int(m.group(2))
    codes = error_codes_from_sources()
    missing = sorted(set(codes) - set(rows))
    assert not missing, f"error codes docs/TROUBLESHOOTING.md does not list: {missing}"
    wrong = sorted(f"{c}: page {rows[c]}, sources {sorted(s)}" for c, s in codes.items() if s and rows[c] not in s)
    assert not wrong, wrong
