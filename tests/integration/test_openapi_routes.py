"""The OpenAPI spec and the server's route table list exactly the same
(method, path) pairs, and the server serves the spec file byte for byte."""
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


def test_get_openapi_yaml_returns_the_spec_file_byte_for_byte(start_server):
    s = start_server(SINK)
    r = s.get("/openapi.yaml")
    assert r.status_code == 200
    assert "yaml" in r.headers["Content-Type"]
    assert r.content == SPEC.read_bytes(), (
        "GET /openapi.yaml differs from openapi/streamfeed.yaml (rebuild the binary after editing the spec)")
    assert yaml.safe_load(r.content)["paths"]
