"""The service's foundation through its real binary: probes, request ids,
routing errors, limits on requests, error counting, the configuration API and
its sources, --help, auth, the metrics format and SIGTERM draining."""
import json
import re
import shutil
import signal
import subprocess

import numpy as np
import pytest
import requests

from sfharness import (BIN, REPO, SAFETENSORS, SINK, SLOWDOWN, TINY, free_port, key, learnable_batch,
                       random_batch, read_reply, st_body, wait_until)

# ---- the option table, read from the C source it is generated from ------------

_ROW = re.compile(r'\{"([a-z_]+\.[a-z0-9_]+)",\s*SF_CT_(\w+),\s*F\([^)]*\),\s*("(?:[^"\\]|\\.)*"|\w+)')


def config_table():
    """{name: (type, default text or macro name)} from server/config.c."""
    src = (REPO / "server" / "config.c").read_text()
    rows = {m.group(1): (m.group(2), m.group(3)) for m in _ROW.finditer(src)}
    assert len(rows) >= 30, "the option table of server/config.c was not found"
    return rows


def c_macro_string(name):
    """The value of a #define made of adjacent C string literals."""
    src = (REPO / "server" / "config.c").read_text()
    m = re.search(r"#define\s+" + name + r"\s+((?:\s*\\?\s*\"(?:[^\"\\]|\\.)*\")+)", src)
    assert m, f"macro {name} not found"
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1))
    return "".join(p.encode().decode("unicode_escape") for p in parts)


def default_text(text):
    """The default of a table row as the C code sees it: a string literal, or
    a macro made of string literals (W1_AUGMENT)."""
    return json.loads(text) if text.startswith('"') else c_macro_string(text)


def typed_default(typ, text):
    raw = default_text(text)
    if typ == "JSON":
        return json.loads(raw) if raw else None  # "" is unset: GET shows null
    if typ in ("INT", "INT64"):
        return int(float(raw))
    if typ == "DOUBLE":
        return float(raw)
    if typ == "BOOL":
        return raw in ("true", "1", "yes")
    return raw


# ---- probes and request ids ---------------------------------------------------------


def test_healthz_answers_200_with_status_ok(start_server):
    s = start_server(SINK)
    r = s.get("/healthz")
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("application/json")
    assert r.json() == {"status": "ok"}


def test_readyz_is_ready_with_no_reasons_once_listening(start_server):
    s = start_server(TINY)
    r = s.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {"ready": True, "reasons": []}


def test_request_id_is_echoed_when_sent_and_generated_when_not(start_server):
    s = start_server(SINK)
    assert s.get("/healthz", headers={"X-Request-Id": "trace-42.a_b"}).headers["X-Request-Id"] == "trace-42.a_b"
    # Also on error replies.
    assert s.get("/nowhere", headers={"X-Request-Id": "abc"}).headers["X-Request-Id"] == "abc"
    ids = {s.get("/healthz").headers["X-Request-Id"] for _ in range(5)}
    assert len(ids) == 5 and all(ids), "generated ids must be present and unique"
    # An id with a space is not echoed (it could split a log line): a new one is made.
    generated = s.get("/healthz", headers={"X-Request-Id": "two words"}).headers["X-Request-Id"]
    assert generated and generated != "two words"


def test_every_reply_has_a_request_id_header(start_server):
    s = start_server(SINK)
    for method, path in [("GET", "/metrics"), ("GET", "/v1/config"), ("GET", "/openapi.yaml"),
                         ("GET", "/v1/model"), ("GET", "/v1/batches/1"), ("DELETE", "/healthz")]:
        assert s.request(method, path).headers.get("X-Request-Id"), (method, path)


# ---- routing errors -------------------------------------------------------------------


def test_unknown_path_gets_404_not_found_as_json(start_server):
    s = start_server(SINK)
    r = s.get("/v2/nothing")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"
    assert r.json()["error"]["message"]


@pytest.mark.parametrize("method,path,allow", [
    ("DELETE", "/v1/config", {"GET", "HEAD", "PATCH"}),
    ("POST", "/healthz", {"GET", "HEAD"}),
    ("GET", "/v1/batches", {"POST"}),
    ("PUT", "/v1/batches/7", {"GET", "HEAD"}),
])
def test_wrong_method_gets_405_with_an_allow_header(start_server, method, path, allow):
    s = start_server(SINK)
    r = s.request(method, path)
    assert r.status_code == 405
    assert r.json()["error"]["code"] == "method_not_allowed"
    assert {m.strip() for m in r.headers["Allow"].split(",")} == allow


# ---- request limits and error counting ------------------------------------------------

ERROR_FLAGS = SINK + ["--model.preset", "tiny", "--http.max_json_bytes", "1024",
                      "--http.max_header_bytes", "2048", "--http.max_json_depth", "8",
                      "--ring.slot_bytes", "4096"]


def _json_patch(body, ct="application/merge-patch+json"):
    return lambda s: s.request("PATCH", "/v1/config", data=body, headers={"Content-Type": ct})


def _raw_headers_only(path, content_length, ct="application/vnd.safetensors"):
    """Sends only the request head of an upload whose declared length is over
    the limit; the server must answer without waiting for the body."""
    def go(s):
        sock = s.connect()
        try:
            sock.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ct}\r\n"
                          f"Content-Length: {content_length}\r\n\r\n").encode())
            return read_reply(sock)
        finally:
            sock.close()
    return go


def _chunked(parts):
    def gen():
        yield from parts
    return gen()


ERROR_CASES = [
    ("json_body_over_max_json_bytes", _json_patch(b"{" + b" " * 2000 + b"}"), 413, "body_too_large"),
    ("chunked_json_body_over_max_json_bytes",
     lambda s: s.request("PATCH", "/v1/config", data=_chunked([b"{" + b" " * 600] * 3 + [b"}"]),
                         headers={"Content-Type": "application/json"}), 413, "body_too_large"),
    ("batch_content_length_over_the_body_limit", _raw_headers_only("/v1/batches", 10**9), 413, "body_too_large"),
    ("batch_data_over_the_slot_size",  # 2 x 32x32x3 + labels > ring.slot_bytes 4096
     lambda s: s.post_arrays(*random_batch(np.random.default_rng(1), 2)), 413, "batch_exceeds_slot"),
    ("headers_over_max_header_bytes", lambda s: s.get("/healthz", headers={"X-Filler": "f" * 3000}),
     431, "headers_too_large"),
    ("request_target_over_max_header_bytes", lambda s: s.get("/healthz?pad=" + "p" * 3000), 414, "uri_too_long"),
    ("request_target_and_headers_together_over_max_header_bytes",
     lambda s: s.get("/healthz?pad=" + "p" * 1200, headers={"X-Filler": "f" * 1200}), 431, "headers_too_large"),
    ("patch_with_text_plain", _json_patch(b'{"optim":{"lr":0.5}}', "text/plain"), 415, "unsupported_media_type"),
    ("batch_with_application_json",
     lambda s: s.post_batch(b"{}", content_type="application/json"), 415, "unsupported_media_type"),
    ("malformed_json", _json_patch(b'{"optim": {"lr": 0.5'), 400, "json_invalid"),
    # cJSON alone stops at the end of the first value: the rest must not be ignored
    ("json_with_trailing_text", _json_patch(b'{"optim": {"lr": 0.3}} xyz'), 400, "json_invalid"),
    ("two_json_values_in_a_row", _json_patch(b'{"optim":{"lr":0.4}}{"optim":{"lr":5}}'), 400, "json_invalid"),
    # a NUL would end the C string: a key or a token read shorter than sent
    ("json_key_with_a_nul_escape", _json_patch(b'{"optim\\u0000x":{"lr":0.1}}'), 400, "json_invalid"),
    ("json_value_with_a_nul_escape", _json_patch(b'{"http":{"token":"abc\\u0000-long-secret"}}'), 400,
     "json_invalid"),
    ("json_nested_deeper_than_the_limit", _json_patch(("[" * 20 + "]" * 20).encode()), 400, "json_too_deep"),
    ("empty_json_body", _json_patch(b""), 400, "body_empty"),
    ("unknown_path", lambda s: s.get("/v1/unknown"), 404, "not_found"),
    ("wrong_method", lambda s: s.request("DELETE", "/metrics"), 405, "method_not_allowed"),
    ("batch_id_not_a_number", lambda s: s.get("/v1/batches/abc"), 400, "bad_batch_id"),
    ("batch_id_with_a_sign", lambda s: s.get("/v1/batches/+1"), 400, "bad_batch_id"),
    ("batch_id_with_a_blank", lambda s: s.get("/v1/batches/%201"), 400, "bad_batch_id"),
    ("batch_id_unknown", lambda s: s.get("/v1/batches/999999"), 404, "batch_not_found"),
]


@pytest.fixture(scope="module")
def limits_server(module_server_factory):
    return module_server_factory(ERROR_FLAGS)


@pytest.mark.parametrize("name,send,status,code", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_error_reply_has_its_status_and_code_is_counted_and_the_server_keeps_serving(
        limits_server, name, send, status, code):
    s = limits_server
    before = s.metrics()
    r = send(s)
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert r.headers.get("X-Request-Id")
    after = s.metrics()
    k = key("streamfeed_http_errors_total", code=code)
    assert after.get(k, 0) - before.get(k, 0) == 1
    # The server still serves.
    assert s.get("/healthz").status_code == 200
    assert s.get("/readyz").status_code == 200


def test_json_nested_exactly_to_the_limit_is_parsed_and_brackets_in_strings_do_not_count(start_server):
    s = start_server(SINK, "--http.max_json_depth", "8")

    def nested(depth):
        return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)

    # Depth 8 parses (then fails as a config), depth 9 does not parse at all.
    assert s.patch_config(nested(8)).json()["error"]["code"] == "config_invalid"
    assert s.patch_config(nested(9)).json()["error"]["code"] == "json_too_deep"
    r = s.patch_config('{"optim":{"lr":"' + "[" * 40 + '"}}')
    assert r.json()["error"] == {"code": "config_invalid", "message": r.json()["error"]["message"],
                                 "field": "optim.lr"}


# ---- the configuration API --------------------------------------------------------


def test_get_config_shows_every_option_with_its_default(start_server):
    s = start_server(SINK)  # the only flags: mode, port and host
    cfg = s.config()
    table = config_table()
    for name, (typ, default) in table.items():
        sec, opt = name.split(".")
        assert opt in cfg.get(sec, {}), f"{name} missing from GET /v1/config"
        # the harness's own flags; the pipelines, shown as the preset's recipe they run;
        # the slot size, shown as the bytes its default (0) came to for the model
        if name in ("pipeline.mode", "http.port", "http.host", "augment.pipeline", "augment.eval_pipeline",
                    "ring.slot_bytes"):
            continue
        assert cfg[sec][opt] == typed_default(typ, default), name
    assert typed_default(*table["ring.slot_bytes"]) == 0 and cfg["ring"]["slot_bytes"] == 64 << 20
    assert sum(len(v) for v in cfg.values()) == len(table), "GET /v1/config has options the table lacks"


def test_get_config_masks_the_token(start_server):
    s = start_server(SINK, "--http.token", "hunter2")
    r = s.get("/v1/config")
    assert r.json()["config"]["http"]["token"] == "***"
    assert "hunter2" not in r.text


def test_patch_with_one_bad_field_among_good_ones_changes_nothing_and_names_it(start_server):
    s = start_server(SINK)
    before = s.config()
    r = s.patch_config({"optim": {"lr": 0.5, "momentum": 7}, "log": {"level": "debug"}})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "config_invalid"
    assert err["field"] == "optim.momentum"
    assert "optim.momentum" in err["message"]
    assert s.config() == before
    assert s.get("/v1/config").json()["pending_restart"] == []


def test_patch_of_a_hot_field_applies_at_once(start_server, rng):
    s = start_server(TINY)
    r = s.patch_config({"optim": {"lr": 0.0125}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["applied"] == ["optim.lr"]
    assert body["pending_restart"] == []
    assert body["config"]["optim"]["lr"] == 0.0125
    assert s.config()["optim"]["lr"] == 0.0125
    # The next step trains with it.
    assert s.post_arrays(*random_batch(rng, 2), wait=True).json()["state"] == "done"
    assert s.metric("streamfeed_learning_rate") == 0.0125


def test_patch_of_a_restart_only_field_is_pending_and_not_applied(start_server, rng):
    s = start_server(SINK, "--ring.slots", "4")
    r = s.patch_config({"ring": {"slots": 6}})
    assert r.status_code == 200, r.text
    assert r.json()["applied"] == []
    assert r.json()["pending_restart"] == ["ring.slots"]
    assert r.json()["config"]["ring"]["slots"] == 4
    got = s.get("/v1/config").json()
    assert got["config"]["ring"]["slots"] == 4
    assert got["pending_restart"] == ["ring.slots"]
    # The ring still has the slots it started with.
    assert s.post_arrays(*random_batch(rng, 1)).json()["ring"]["slots"] == 4
    m = s.metrics()
    assert sum(m[key("streamfeed_ring_slots", state=st)] for st in ("free", "filling", "ready", "in_flight")) == 4
    # Setting it back to the running value clears the pending change.
    r = s.patch_config({"ring": {"slots": 4}})
    assert r.json()["pending_restart"] == []


def test_patch_with_a_hot_and_a_restart_only_field_splits_applied_and_pending(start_server):
    s = start_server(SINK)
    r = s.patch_config({"optim": {"momentum": 0.5}, "http": {"threads": 2}})
    assert r.status_code == 200, r.text
    assert r.json()["applied"] == ["optim.momentum"]
    assert r.json()["pending_restart"] == ["http.threads"]
    cfg = s.config()
    assert cfg["optim"]["momentum"] == 0.5 and cfg["http"]["threads"] == 4


@pytest.mark.parametrize("patch,field", [
    ({"optim": {"learning_rate": 0.1}}, "optim.learning_rate"),
    ({"nosuchsection": {"x": 1}}, "nosuchsection.x"),
    ({"optim": 0.1}, "optim"),
    ({"optim": {"lr": "fast"}}, "optim.lr"),
    ({"ring": {"full_policy": "drop"}}, "ring.full_policy"),
    ({"log": {"requests": "yes"}}, "log.requests"),
])
def test_patch_with_an_unknown_key_or_wrong_type_is_rejected_naming_the_field(start_server, patch, field):
    s = start_server(SINK)
    before = s.config()
    r = s.patch_config(patch)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "config_invalid"
    assert r.json()["error"]["field"] == field
    assert s.config() == before


@pytest.mark.parametrize("patch,field", [
    ({"optim": {"schedule": "multistep", "milestones": [30, 10]}}, "optim.milestones"),
    ({"ring": {"slots": 4096}}, "ring.slots"),
    ({"pipeline": {"jobs_max": 64}}, "pipeline.jobs_max"),
])
def test_a_patch_breaking_a_rule_between_options_names_the_option_it_set(start_server, patch, field):
    s = start_server(SINK)
    before = s.config()
    r = s.patch_config(patch)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "config_invalid" and err["field"] == field, err
    assert err["message"].startswith(field + ": ") and err["message"].count(field + ": ") == 1, err
    assert s.config() == before


def test_get_config_shows_the_preset_recipe_in_force_and_says_it_is_the_presets(start_server):
    s = start_server(SINK, "--model.preset", "tiny")
    reply = s.get("/v1/config").json()
    aug = reply["config"]["augment"]
    assert isinstance(aug["pipeline"], list) and aug["pipeline"], aug
    assert aug["pipeline"][0]["op"] == "to_dtype" and aug["pipeline"][-1]["op"] == "normalize", aug
    assert isinstance(aug["eval_pipeline"], list) and aug["eval_pipeline"], aug
    assert reply["from_preset"] == {"augment.pipeline": "tiny", "augment.eval_pipeline": "tiny"}
    assert "## Preset recipes" in (REPO / "docs" / "CONFIG.md").read_text()


def test_a_pipeline_that_is_set_is_shown_as_set_and_not_as_the_presets(start_server):
    mine = [{"op": "to_dtype", "dtype": "float32", "scale": 1 / 255}]
    s = start_server(SINK, "--model.preset", "tiny", "--augment.pipeline", json.dumps(mine))
    reply = s.get("/v1/config").json()
    assert reply["config"]["augment"]["pipeline"][0]["op"] == "to_dtype"
    assert len(reply["config"]["augment"]["pipeline"]) == 1
    assert reply["from_preset"] == {"augment.eval_pipeline": "tiny"}


def test_patching_the_preset_recipe_back_keeps_the_pipeline_following_the_preset(start_server):
    s = start_server(SINK, "--model.preset", "tiny")
    aug = s.config()["augment"]
    r = s.patch_config({"augment": {"pipeline": aug["pipeline"]}})
    assert r.status_code == 200, r.text
    assert r.json()["pending_restart"] == [] and r.json()["from_preset"]["augment.pipeline"] == "tiny"


def test_v1_model_says_fp32_on_the_reference_backend_which_computes_tf32_in_fp32(start_server):
    s = start_server(*TINY, "--pipeline.backend", "ref", "--model.precision", "tf32")
    m = s.get("/v1/model").json()
    assert m["backend"] == "ref"
    assert m["precision"] == "fp32" and m["precision_configured"] == "tf32", m


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_v1_model_says_the_precision_asked_for_where_the_reference_computes_in_it(start_server, precision):
    s = start_server(*TINY, "--pipeline.backend", "ref", "--model.precision", precision)
    m = s.get("/v1/model").json()
    assert m["precision"] == precision and "precision_configured" not in m, m


def test_patching_back_the_config_that_get_returned_changes_nothing(start_server):
    s = start_server(SINK)
    cfg = s.config()
    r = s.patch_config(cfg)
    assert r.status_code == 200, r.text
    assert r.json()["applied"] == []
    assert r.json()["pending_restart"] == []


def test_patch_that_is_not_an_object_is_rejected(start_server):
    s = start_server(SINK)
    r = s.patch_config([1, 2])
    assert r.status_code == 400 and r.json()["error"]["code"] == "config_invalid"


def test_patch_whose_hot_part_needs_a_restart_only_part_is_rejected_and_get_patched_back_still_works(
        start_server, tmp_path):
    # checkpoint.every_steps would apply now, checkpoint.dir only at the next
    # start: periodic saves without a directory. Found by tests/fuzz/fuzz_config_patch.c.
    # (checkpoint.dir changes by PATCH only with a token.)
    s = start_server(SINK, "--http.token", "t")
    auth = {"Authorization": "Bearer t"}
    r = s.patch_config({"checkpoint": {"dir": str(tmp_path), "every_steps": 5}}, headers=auth)
    assert r.status_code == 400 and r.json()["error"]["code"] == "config_invalid"
    assert "restart-only ones only at the next start" in r.json()["error"]["message"]
    assert s.config()["checkpoint"]["every_steps"] == 0
    view = s.config()
    view["http"]["token"] = "t"  # shown as "***"
    assert s.patch_config(view, headers=auth).status_code == 200


def test_patch_null_resets_an_option_to_its_default(start_server):
    s = start_server(SINK, "--optim.weight_decay", "0.25")
    r = s.patch_config({"optim": {"weight_decay": None}})
    assert r.status_code == 200, r.text
    assert s.config()["optim"]["weight_decay"] == 0


def test_log_requests_is_hot(start_server):
    s = start_server(SINK)
    s.get("/v1/stats", headers={"X-Request-Id": "logged-before"})
    assert s.patch_config({"log": {"requests": False}}).status_code == 200
    s.get("/v1/stats", headers={"X-Request-Id": "not-logged-after"})
    assert s.patch_config({"log": {"requests": True}}).status_code == 200
    s.get("/v1/stats", headers={"X-Request-Id": "logged-again"})
    wait_until(lambda: "id=logged-again" in s.stderr(), 5, what="the request log line")
    err = s.stderr()
    assert "id=logged-before" in err and "id=not-logged-after" not in err


# ---- --help and configuration sources -------------------------------------------


def test_help_lists_every_option_of_the_table():
    p = subprocess.run([BIN, "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    listed = set(re.findall(r"^\s+--([a-z_]+\.[a-z0-9_]+)\s", p.stdout, re.MULTILINE))
    assert listed == set(config_table())
    for name in config_table():
        assert "STREAMFEED_" + name.upper().replace(".", "_") in p.stdout, name


def test_config_sources_take_precedence_defaults_then_file_then_env_then_flags(start_server, tmp_path):
    cfg_file = tmp_path / "streamfeed.json"
    cfg_file.write_text(json.dumps({"optim": {"lr": 0.1, "momentum": 0.2, "weight_decay": 0.3},
                                    "ring": {"retry_after_s": 7}}))
    s = start_server(SINK, "--config", str(cfg_file), "--optim.weight_decay", "0.9",
                     env={"STREAMFEED_OPTIM_MOMENTUM": "0.5", "STREAMFEED_OPTIM_WEIGHT_DECAY": "0.6",
                          "STREAMFEED_RING_FULL_TIMEOUT_MS": "1234"})
    cfg = s.config()
    assert cfg["optim"]["lr"] == 0.1             # file over default
    assert cfg["optim"]["momentum"] == 0.5       # env over file
    assert cfg["optim"]["weight_decay"] == 0.9   # flag over env and file
    assert cfg["ring"]["retry_after_s"] == 7     # file only
    assert cfg["ring"]["full_timeout_ms"] == 1234  # env only
    assert cfg["ring"]["slots"] == 8             # default


def test_config_file_can_come_from_the_environment(start_server, tmp_path):
    cfg_file = tmp_path / "c.json"
    cfg_file.write_text(json.dumps({"limits": {"max_n": 77}}))
    s = start_server(SINK, env={"STREAMFEED_CONFIG": str(cfg_file)})
    assert s.config()["limits"]["max_n"] == 77


@pytest.mark.parametrize("args,env,needle", [
    (["--optim.lr", "fast"], {}, "optim.lr"),
    (["--ring.slots", "1"], {}, "ring.slots"),
    (["--no.such", "1"], {}, "no.such"),
    (["--ring.full_policy", "drop"], {}, "ring.full_policy"),
    ([], {"STREAMFEED_HTTP_THREADS": "0"}, "STREAMFEED_HTTP_THREADS"),
    (["--augment.pipeline", "[{\"op\":\"spin\"}]"], {}, "augment.pipeline"),
    (["--model.preset", "seed-encdec", "--augment.pipeline", "[{\"op\":\"mixup\"}]"], {}, "segmentation"),
    # pipelines no batch could pass: refused at start, not as every batch's 422
    (["--augment.pipeline", "[{\"op\":\"mixup\"},{\"op\":\"to_dtype\",\"dtype\":\"float32\"}]"], {},
     "must come last"),
    (["--augment.eval_pipeline", "[{\"op\":\"resize\",\"size\":[16,16]},{\"op\":\"center_crop\",\"size\":[32,32]}]"],
     {}, "augment.eval_pipeline"),
    (["--augment.pipeline", "[{\"op\":\"normalize\",\"mean\":[0.5],\"std\":[1e-38]}]"], {}, "1e-6"),
])
def test_invalid_configuration_exits_2_naming_the_option(args, env, needle, tmp_path):
    import os
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMFEED_")}
    full_env.update(env)
    p = subprocess.run([BIN, "--http.port", "0", "--pipeline.mode", "sink"] + args, capture_output=True,
                       text=True, timeout=30, env=full_env)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert needle in p.stderr
    assert "listening" not in p.stdout


def test_invalid_config_file_exits_2_naming_the_file_and_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"optim": {"lr": 99}}))
    p = subprocess.run([BIN, "--config", str(bad), "--http.port", "0"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert str(bad) in p.stderr and "optim.lr" in p.stderr


@pytest.mark.parametrize("text,why", [
    ('{"optim": {"lr": 0.01}} trailing', "more text follows"),
    ('{"http": {"token": "abc\\u0000-rest"}}', "NUL"),
])
def test_a_config_file_that_is_not_one_json_value_exits_2(tmp_path, text, why):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    p = subprocess.run([BIN, "--config", str(bad), "--http.port", "0"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2, p.stderr
    assert str(bad) in p.stderr and why in p.stderr


# ---- metrics ------------------------------------------------------------------------


FAMILIES = {
    "streamfeed_jpeg_decoder_unavailable_total": "counter",
    "streamfeed_jpeg_decoder_device_bytes": "gauge", "streamfeed_jpeg_decoder_pinned_bytes": "gauge",
    "streamfeed_http_requests_total": "counter", "streamfeed_http_errors_total": "counter",
    "streamfeed_batches_received_total": "counter", "streamfeed_batches_rejected_total": "counter",
    "streamfeed_batches_finished_total": "counter", "streamfeed_batches_pending": "gauge",
    "streamfeed_received_bytes_total": "counter", "streamfeed_steps_total": "counter",
    "streamfeed_samples_trained_total": "counter", "streamfeed_loss": "gauge",
    "streamfeed_ring_slots": "gauge", "streamfeed_queue_wait_seconds": "histogram",
    "streamfeed_h2d_seconds": "histogram", "streamfeed_transform_seconds": "histogram",
    "streamfeed_step_seconds": "histogram", "streamfeed_build_info": "gauge",
    "process_start_time_seconds": "gauge", "process_cpu_seconds_total": "counter",
    "process_resident_memory_bytes": "gauge", "process_virtual_memory_bytes": "gauge",
    "process_open_fds": "gauge", "process_max_fds": "gauge",
}


def test_metrics_expose_every_documented_family_with_its_type(start_server, rng):
    s = start_server(TINY, "--ring.slots", "3")
    s.post_arrays(*random_batch(rng, 2), wait=True)
    text = s.metrics_text()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    for fam, typ in FAMILIES.items():
        assert types.get(fam) == typ, fam
    m = s.metrics()
    assert sum(v for (n, labels), v in m.items() if n == "streamfeed_ring_slots") == 3
    assert m[key("streamfeed_ring_slots", state="free")] == 3
    build = [dict(labels) for (n, labels), v in m.items() if n == "streamfeed_build_info" and v == 1]
    assert build and build[0]["backend"] == "ref"
    version = subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout
    assert f"streamfeed {build[0]['version']} (commit {build[0]['commit']}," in version
    assert m[key("streamfeed_steps_total")] == 1
    assert m[key("streamfeed_step_seconds_count")] == 1


def test_promtool_accepts_the_metrics(start_server, rng):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not found: install the Debian package prometheus")
    s = start_server(TINY)
    # Populate labelled families: a trained batch, a rejected one, an error.
    s.post_arrays(*random_batch(rng, 2), wait=True)
    s.post_batch(b"\x00" * 3)
    s.get("/nope")
    p = subprocess.run([promtool, "check", "metrics"], input=s.metrics_text(), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert not p.stdout.strip() and not p.stderr.strip(), p.stdout + p.stderr


# ---- auth -------------------------------------------------------------------------


def test_with_a_token_mutating_routes_need_the_bearer_token(start_server, rng):
    s = start_server(TINY, "--http.token", "s3cret")
    body = st_body(*random_batch(rng, 2))
    good = {"Authorization": "Bearer s3cret"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                    {"Authorization": "Bearer s3cret2"}, {"Authorization": "Basic czNjcmV0"}):
        for r in (s.post_batch(body, headers=headers),
                  s.post_batch(st_body(random_batch(rng, 1)[0]), path="/v1/transform", headers=headers),
                  s.patch_config({"optim": {"lr": 0.5}}, headers=headers)):
            assert r.status_code == 401, (headers, r.text)
            assert r.json()["error"]["code"] == "unauthorized"
            assert r.headers.get("WWW-Authenticate", "").startswith("Bearer")
    assert s.config()["optim"]["lr"] == 0.001
    # The open routes (docs/OPERATIONS.md lists them) answer without it.
    for path in ("/healthz", "/readyz", "/metrics", "/v1/config", "/v1/stats", "/openapi.yaml"):
        assert s.get(path).status_code == 200, path
    # The right token works.
    assert s.post_batch(body, headers=good).status_code == 202
    assert s.patch_config({"optim": {"lr": 0.5}}, headers=good).status_code == 200
    assert s.metric("streamfeed_http_errors_total", code="unauthorized") == 15


def test_with_a_token_reading_results_logits_evaluations_model_or_trace_needs_it_too(start_server, rng):
    # Batch ids are sequential: without the token on reads, any client could
    # read another's results and kept logits by counting.
    # A wait of 0 ms runs out before the batch is done (it is queued behind
    # a big one, tens of ms of training: alone, a tiny eval batch can finish
    # before the handler looks): the logits are kept for
    # GET /v1/batches/2/logits, which the 202 names.
    s = start_server(TINY, "--http.token", "s3cret", "--pipeline.wait_timeout_ms", "0")
    good = {"Authorization": "Bearer s3cret"}
    assert s.post_batch(st_body(*learnable_batch(rng, 256)), headers=good).status_code == 202
    r = s.post_batch(st_body(*learnable_batch(rng, 64)), path="/v1/batches?mode=eval&eval=mine&return=logits&wait=1",
                     headers=good)
    assert r.status_code == 202 and r.headers["Location"] == "/v1/batches/2/logits", r.text
    wait_until(lambda: s.get("/v1/evals/mine", headers=good).json()["batches"] == 1, 30,
               what="the eval batch to finish")
    reads = ["/v1/batches/2", "/v1/batches/2/logits", "/v1/evals", "/v1/evals/mine", "/v1/model", "/v1/trace"]
    for path in reads:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = s.get(path, headers=headers)
            assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthorized"), (path, r.text)
            assert r.headers.get("WWW-Authenticate") == "Bearer"
        assert s.get(path, headers=good).status_code == 200, path
    assert s.metric("streamfeed_http_errors_total", code="unauthorized") == 2 * len(reads)


# Every option that names a file, directory, URL or address (SF_CF_LOCATION
# in server/config.c), with a value its own checks would take.
LOCATION_PATCHES = {
    "http.host": "0.0.0.0",
    "http.tls_cert": "/tmp/stranger.pem",
    "http.tls_key": "/tmp/stranger.key",
    "checkpoint.dir": "/tmp/stranger",
    "model.init_from": "http://stranger.example/weights.safetensors",
    "distributed.rendezvous": "stranger.example:8080",
    "distributed.host": "stranger.example",
}


def test_an_open_service_refuses_a_patch_of_a_path_url_or_address_and_one_with_a_token_takes_it(start_server):
    # checkpoint.dir patched on an open service applied at the next start:
    # any client could send the checkpoints' writes to a directory of its choosing.
    s = start_server(SINK)
    before = s.config()
    for name, value in LOCATION_PATCHES.items():
        section, option = name.split(".")
        r = s.patch_config({"optim": {"lr": 0.5}, section: {option: value}})
        err = r.json()["error"]
        assert (r.status_code, err["code"], err["field"]) == (403, "config_needs_token", name), r.text
        assert "http.token" in err["message"], err
    assert s.config() == before and s.get("/v1/config").json()["pending_restart"] == []
    assert s.metric("streamfeed_http_errors_total", code="config_needs_token") == len(LOCATION_PATCHES)
    assert s.patch_config(before).status_code == 200  # the same values back change nothing
    t = start_server(SINK, "--http.token", "t")
    r = t.patch_config({"checkpoint": {"dir": "/tmp/elsewhere"}}, headers={"Authorization": "Bearer t"})
    assert r.status_code == 200 and r.json()["pending_restart"] == ["checkpoint.dir"], r.text


def test_a_token_rotated_by_patch_guards_the_next_requests(start_server, rng):
    s = start_server(SINK + ["--http.token", "old"])
    r = s.patch_config({"http": {"token": "n3w"}}, headers={"Authorization": "Bearer old"})
    assert r.status_code == 200 and r.json()["applied"] == ["http.token"]
    assert r.json()["config"]["http"]["token"] == "***"
    body = st_body(*random_batch(rng, 1))
    assert s.post_batch(body).status_code == 401
    assert s.post_batch(body, headers={"Authorization": "Bearer old"}).status_code == 401
    assert s.post_batch(body, headers={"Authorization": "Bearer n3w"}).status_code == 202
    # Clearing it (null: back to the empty default) opens the routes again,
    assert s.patch_config({"http": {"token": None}}, headers={"Authorization": "Bearer n3w"}).status_code == 200
    assert s.post_batch(body).status_code == 202
    # and then no client can close them to the others: a restart does.
    r = s.patch_config({"http": {"token": "mine"}})
    assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["field"]) == (
        403, "config_needs_token", "http.token"), r.text
    assert s.post_batch(body).status_code == 202
    assert s.metric("streamfeed_http_errors_total", code="config_needs_token") == 1


def test_a_token_no_header_could_present_is_refused_at_start_and_by_patch(start_server, rng):
    # Authorization is read with the spaces around the token dropped and
    # libmicrohttpd ends a value at a NUL: a token with spaces, tabs or bytes
    # outside visible ASCII could never be presented, and set by PATCH it
    # would lock every client out until a restart.
    for bad in ("abc ", " abc", "a b", "a\tb", "caf\u00e9"):
        p = subprocess.run([BIN, "--http.port", "0", "--http.token", bad] + SINK, capture_output=True,
                           text=True, timeout=30)
        assert p.returncode == 2 and "http.token" in p.stderr, (bad, p.returncode, p.stderr)
    s = start_server(SINK + ["--http.token", "old"])
    auth = {"Authorization": "Bearer old"}
    for bad in ("abc ", " abc", "a b", "x\u0001y"):
        r = s.patch_config({"http": {"token": bad}}, headers=auth)
        assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["field"]) == (
            400, "config_invalid", "http.token"), (bad, r.text)
    # Nothing changed: the old token still guards the routes.
    body = st_body(*random_batch(rng, 1))
    assert s.post_batch(body).status_code == 401
    assert s.post_batch(body, headers=auth).status_code == 202


def test_without_a_token_mutating_routes_are_open(start_server, rng):
    s = start_server(SINK)
    assert s.post_arrays(*random_batch(rng, 1)).status_code == 202
    assert s.patch_config({"optim": {"lr": 0.5}}).status_code == 200


# ---- SIGTERM ----------------------------------------------------------------------


def test_sigterm_turns_readyz_503_while_draining_refuses_new_batches_and_exits_0(start_server, rng):
    mport = free_port()
    # 16 ring slots hold the batches, so no upload waits for a slot; the
    # grace period outlasts their training under AddressSanitizer too.
    s = start_server(TINY, "--optim.lr", "0.01", "--http.metrics_port", mport, "--ring.slots", "16",
                     "--shutdown.grace_s", str(30 * SLOWDOWN))
    body = st_body(*learnable_batch(rng, 256))
    # Queue about a second of training so the drain can be watched: 12 x 256
    # samples in the release build, a SLOWDOWN-th of them under
    # AddressSanitizer, whose server takes that much longer over each.
    queued = 12 // SLOWDOWN
    ids = [s.post_batch(body).json()["id"] for _ in range(queued)]
    keep = s.connect()  # kept alive from before the signal: it may still send a request
    keep.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_reply(keep).status_code == 200
    s.proc.send_signal(signal.SIGTERM)
    probe = f"http://127.0.0.1:{mport}"
    ready = wait_until(lambda: (lambda r: r.status_code == 503 and r.json())(requests.get(probe + "/readyz")),
                       10, what="readyz to turn 503 after SIGTERM")
    assert ready["ready"] is False and ready["reasons"]
    keep.sendall(f"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: {SAFETENSORS}\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    r = read_reply(keep)
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
    # Reads still work while draining, on the metrics port (the main port
    # refuses new connections).
    assert requests.get(probe + "/metrics").status_code == 200
    assert s.proc.wait(60) == 0
    # Every batch accepted before the signal finished within the grace period
    # (otherwise the drain logs "grace period ... over").
    assert "grace period" not in s.stderr()
    assert len(ids) == queued


def test_sigterm_answers_an_upload_waiting_for_a_slot_with_503_and_exits_0(start_server, rng):
    s = start_server(SINK, "--ring.slots", "2", "--ring.full_timeout_ms", "60000")
    body = st_body(*random_batch(rng, 2))
    holders = [s.start_upload(body, 300) for _ in range(2)]
    wait_until(lambda: s.metric("streamfeed_ring_slots", state="filling") == 2, 10)
    # The third upload must be waiting on the server before the signal: a
    # connection still in the listen backlog is a new connection, refused
    # (reset) by the drain, not a request it answers.
    waiting = s.start_upload(body, len(body))
    wait_until(lambda: s.metric("streamfeed_uploads_waiting") == 1, 10, what="the third upload to wait for a slot")
    s.proc.send_signal(signal.SIGTERM)
    r = read_reply(waiting)
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "shutting_down"
    # The two holders are requests in progress, which the drain waits for:
    # their clients give up, and the process ends without waiting for the
    # slow-upload sweep to evict them.
    for sock in holders + [waiting]:
        sock.close()
    assert s.proc.wait(60) == 0


def test_counters_put_the_unit_before_total_and_no_bespoke_uptime_is_exported(start_server):
    s = start_server(SINK)
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", s.metrics_text(), re.MULTILINE))
    assert "streamfeed_uptime_seconds" not in types
    # Prometheus naming: the base unit comes before the _total suffix of a counter.
    misplaced = [n for n, t in types.items() if t == "counter" and
                 re.search(r"_total_(bytes|seconds)$|_(bytes|seconds)_received_total$", n)]
    assert not misplaced and "streamfeed_bytes_received_total" not in types, misplaced


def test_process_metrics_describe_this_process(start_server):
    import os
    import time
    s = start_server(SINK)
    m = s.metrics()
    start = m[key("process_start_time_seconds")]
    assert time.time() - 600 < start <= time.time()
    with open(f"/proc/{s.proc.pid}/statm") as f:
        rss_pages = int(f.read().split()[1])
    rss = m[key("process_resident_memory_bytes")]
    assert 0.5 * rss_pages * os.sysconf("SC_PAGE_SIZE") < rss < 2 * rss_pages * os.sysconf("SC_PAGE_SIZE")
    fds = len(os.listdir(f"/proc/{s.proc.pid}/fd"))
    assert abs(m[key("process_open_fds")] - fds) <= 4
    assert m[key("process_max_fds")] >= m[key("process_open_fds")]
    assert m[key("process_cpu_seconds_total")] >= 0
