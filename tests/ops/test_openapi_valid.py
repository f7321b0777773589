"""openapi/streamfeed.yaml is a valid OpenAPI 3.1 document that describes the
server's route table and keeps the API-wide conventions (error body,
X-Request-Id, Retry-After, bearer auth)."""

from __future__ import annotations

import copy
import re

import jsonschema
import pytest
import yaml
from openapi_spec_validator import validate
from openapi_spec_validator.readers import read_from_filename

from opshelpers import REPO

SPEC_PATH = REPO / "openapi" / "streamfeed.yaml"

# The server's route table. A route added to or removed from the server must
# change this list and the spec together.
ROUTES = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/v1/config"),
    ("PATCH", "/v1/config"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches/{id}"),
    ("GET", "/v1/batches/{id}/logits"),
    ("GET", "/v1/evals"),
    ("GET", "/v1/evals/{name}"),
    ("DELETE", "/v1/evals/{name}"),
    ("POST", "/v1/transform"),
    ("GET", "/v1/model"),
    ("GET", "/openapi.yaml"),
    ("POST", "/v1/diagnose"),
    ("GET", "/v1/trace"),
    ("GET", "/v1/stats"),
    ("GET", "/v1/checkpoint"),
    ("PUT", "/v1/checkpoint"),
    ("POST", "/v1/checkpoint/save"),
    ("POST", "/v1/checkpoint/load"),
    ("PUT", "/v1/distributed/kv/{key}"),
    ("GET", "/v1/distributed/kv/{key}"),
}
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


@pytest.fixture(scope="module")
def spec() -> dict:
    with open(SPEC_PATH) as f:
        return yaml.safe_load(f)


def operations(spec):
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield method.upper(), path, op


def resolve(spec: dict, node: dict) -> dict:
    while "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), f"only local references are used: {ref}"
        node = spec
        for part in ref[2:].split("/"):
            node = node[part]
    return node


def responses(spec):
    for method, path, op in operations(spec):
        for status, resp in op["responses"].items():
            yield method, path, str(status), resolve(spec, resp)


def test_spec_validates_as_openapi_3_1():
    spec_dict, base_uri = read_from_filename(str(SPEC_PATH))
    assert str(spec_dict["openapi"]).startswith("3.1"), "the spec must be OpenAPI 3.1"
    validate(spec_dict, base_uri=base_uri)  # raises on any violation


def server_routes() -> set[tuple[str, str]]:
    """The route table in handlers/routes.c when it is in the tree, else ROUTES."""
    path = REPO / "handlers" / "routes.c"
    if not path.is_file():
        return ROUTES
    found = set(re.findall(r'\{\s*"(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS)",\s*"(/[^"]*)"', path.read_text()))
    assert found, "handlers/routes.c has no routes this test can read"
    return found


def test_spec_describes_exactly_the_server_routes(spec):
    described = {(m, p) for m, p, _ in operations(spec)}
    routes = server_routes()
    assert described - routes == set(), "routes in the spec the server does not have"
    assert routes - described == set(), "server routes missing from the spec"
    assert routes == ROUTES, "the route table changed: update ROUTES here and the spec"


def test_every_operation_has_a_unique_operation_id(spec):
    ids = [op.get("operationId") for _, _, op in operations(spec)]
    assert all(ids), "every operation needs an operationId"
    assert len(ids) == len(set(ids))


def test_every_response_carries_x_request_id(spec):
    missing = [
        f"{m} {p} {s}"
        for m, p, s, resp in responses(spec)
        if "X-Request-Id" not in resp.get("headers", {})
    ]
    assert not missing, f"responses without an X-Request-Id header: {missing}"


def test_every_error_response_uses_the_error_schema(spec):
    error_ref = "#/components/schemas/Error"
    bad = []
    for m, p, s, resp in responses(spec):
        if not s.startswith(("4", "5")) or (p == "/readyz" and s == "503"):
            continue  # /readyz 503 is the readiness body, by design
        schema = resp.get("content", {}).get("application/json", {}).get("schema", {})
        if schema.get("$ref") != error_ref:
            bad.append(f"{m} {p} {s}")
    assert not bad, f"error responses not using {error_ref}: {bad}"


def test_throttling_responses_carry_retry_after(spec):
    bad = [
        f"{m} {p} {s}"
        for m, p, s, resp in responses(spec)
        if s in ("429", "503") and p != "/readyz" and "Retry-After" not in resp.get("headers", {})
    ]
    assert not bad, f"429/503 responses without Retry-After: {bad}"


def test_batch_upload_documents_every_rejection_status(spec):
    op = spec["paths"]["/v1/batches"]["post"]
    assert {"200", "202", "400", "401", "411", "413", "415", "422", "429", "503"} <= set(
        map(str, op["responses"])
    )
    body = op["requestBody"]["content"]
    assert {"application/vnd.safetensors", "application/octet-stream"} <= set(body)


def test_mutating_operations_take_an_optional_bearer_token(spec):
    scheme = spec["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for method, path in [("post", "/v1/batches"), ("patch", "/v1/config")]:
        security = spec["paths"][path][method].get("security", [])
        assert {"bearerAuth": []} in security, f"{method.upper()} {path} must declare bearerAuth"
        # The token is only required when one is configured.
        assert {} in security, f"{method.upper()} {path}: auth must be optional ({{}} alternative)"
        assert "401" in map(str, spec["paths"][path][method]["responses"])


def test_config_patch_takes_merge_patch_and_plain_json(spec):
    content = spec["paths"]["/v1/config"]["patch"]["requestBody"]["content"]
    assert {"application/merge-patch+json", "application/json"} <= set(content)


def test_examples_match_their_schemas(spec):
    """Each example in the spec validates against the schema beside it."""
    checked = 0
    for m, p, s, resp in responses(spec):
        for media, body in resp.get("content", {}).items():
            if "example" not in body or "json" not in media:
                continue
            schema = copy.deepcopy(body["schema"])
            schema["components"] = spec["components"]  # so #/components/... resolves
            jsonschema.Draft202012Validator(schema).validate(body["example"])
            checked += 1
    assert checked >= 8, "the spec should keep examples for its JSON responses"
