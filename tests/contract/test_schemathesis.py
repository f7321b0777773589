"""The live server against its OpenAPI contract (openapi/streamfeed.yaml),
driven by schemathesis: every operation of the spec with its examples,
coverage cases, fuzzed inputs and stateful sequences, under the default checks
(which include response schema conformance) — no request may get a 5xx, and
every reply must match the spec.

schemathesis runs once per module through its CLI (`schemathesis run`, 4.x),
with a generated config file: 25 examples per operation, 2 workers, a fixed
seed (STREAMFEED_SCHEMATHESIS_SEED changes it). Its JSON report is then
asserted on per operation, so a failure names the operation and quotes
schemathesis' own account of it (with a curl line to reproduce it).

What the run leaves out or relaxes, and why:
- Safetensors bodies (batches, transform, checkpoint upload) cannot be
  generated meaningfully from `format: binary`: those operations only ever
  see invalid bodies, so `positive_data_acceptance` is off for them; they
  must still answer each with a documented 4xx, never a 5xx.
- POST /v1/checkpoint/save and /load are not run: a `url` in their bodies
  makes the server connect to that host, and generated URLs name any host.
  Tests here send traffic to loopback only.
- POST /v1/diagnose pauses training for `seconds`; the server under test caps
  it at 0.3 s (diagnose.max_seconds) to keep the run short, so a 400
  seconds_out_of_range is an accepted answer to schema-valid data there.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml

import streamfeed

from contract_helpers import SPEC, start_tiny_server, stop_checked

MAX_EXAMPLES = 25
SEED = int(os.environ.get("STREAMFEED_SCHEMATHESIS_SEED", "20261121"))
RUN_TIMEOUT_S = 150

# Known failures, reported, where the spec is wrong or disagrees with the
# server: (operation, failure code) -> why. The per-operation tests ignore
# them; each has an xfail(strict=True) test below that passes once it is
# fixed, which then fails until the entry is removed here.
KNOWN_SPEC_BUGS = {
    ("PATCH /v1/config", "ST202"): (
        "spec: the Config/ConfigPatch schemas are generated from the option table (types, bounds, "
        "enums, no unknown keys), but some schema-valid patches are still refused by checks JSON "
        "Schema cannot express: cross-field rules (pipeline.jobs_max >= 2*ring.slots+64, periodic "
        "checkpoints need checkpoint.dir), values with a hole in their range (ring.slot_bytes: 0 or "
        "at least 4096) and the semantics of JSON options (model.spec, "
        "augment.pipeline must parse as a model / an augmentation list)."),
}

# Operations left out of the run, with the reason. A `url` in these bodies makes
# the server open a connection to that host (libcurl GET or PUT), and the
# generated ones name arbitrary hosts (the spec's own example names
# models.example.com): a test here may only send traffic to loopback.
EXCLUDED = {
    "postCheckpointSave": "its body's `url` makes the server PUT the checkpoint to any generated host",
    "postCheckpointLoad": "its body's `url` makes the server GET from any generated host",
}

# Operations whose bodies are binary (safetensors) and cannot be generated
# meaningfully from `format: binary`.
BINARY_BODIES = ["postBatch", "postTransform", "putCheckpoint"]

# schemathesis' default for negative_data_rejection, plus 411 and 413.
NEGATIVE_OK = json.dumps(["400", "401", "403", "404", "405", "406", "409", "411", "413", "415", "422",
                          "428", "429", "5xx"])

DIAGNOSE_MAX_S = "0.3"
DIAGNOSE_POSITIVE_OK = json.dumps(["2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"])

_SERVER_ERRORS = {"ServerError", "ContentTypeServerError"}  # not_a_server_error: a 5xx reply


def spec_operations():
    """'METHOD /path' -> operationId for every operation of the spec."""
    spec = yaml.safe_load(SPEC.read_text())
    ops = {}
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method in ("get", "put", "post", "patch", "delete", "head", "options"):
                ops[f"{method.upper()} {path}"] = op["operationId"]
    return ops


ALL_OPERATIONS = spec_operations()
OPERATIONS = {label: op for label, op in ALL_OPERATIONS.items() if op not in EXCLUDED}


def schemathesis_cli():
    exe = Path(sys.executable).with_name("schemathesis")
    if exe.exists():
        return str(exe)
    return shutil.which("schemathesis") or shutil.which("st")


def sections(stdout):
    """schemathesis' failure report split by its '____ METHOD /path ____' headings."""
    out, name = {}, None
    for line in stdout.splitlines():
        s = line.strip()
        if s.startswith("___") and s.endswith("___") and s.strip("_ "):
            name = s.strip("_ ")
            out[name] = []
        elif s.startswith("===") and s.endswith("==="):
            name = None
        elif name:
            out[name].append(line)
    return {k: "\n".join(v).strip() for k, v in out.items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Runs schemathesis against a fresh server; returns {report, stdout,
    alive (the server outlived the run), server_error (its exit check)}."""
    cli = schemathesis_cli()
    if not cli:
        pytest.skip("schemathesis is not installed (pip install -r tests/requirements-client.txt)")
    work = tmp_path_factory.mktemp("schemathesis")
    # A diagnose run pauses training for `seconds` (up to diagnose.max_seconds):
    # short ones keep the whole run within its time budget.
    server = start_tiny_server(work, "--diagnose.default_seconds", "0.2",
                               "--diagnose.max_seconds", DIAGNOSE_MAX_S)
    try:
        # A few real batches, so that GET /v1/batches/{id} also answers 200 with a Batch.
        c = server.client()
        rng = np.random.default_rng(1)
        for n in (1, 2, 3):
            images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
            c.post_batch(images, rng.integers(0, 10, n), wait=True)
        config = work / "schemathesis.toml"
        config.write_text(f'''
base-url = "{server.url}"
# One worker: with two, hypothesis parsed lambda sources from two threads at
# once and CPython 3.11 raised "AST constructor recursion depth mismatch"
# (a schemathesis Runtime Error in two CI runs in a row on 2026-11-24).
workers = 1
seed = {SEED}
request-timeout = 30

[generation]
max-examples = {MAX_EXAMPLES}

# Safetensors bodies cannot be generated from `format: binary`: every body
# schemathesis sends is invalid, so "schema-valid data is accepted" cannot hold.
[[operations]]
include-operation-id = {json.dumps([op for op in BINARY_BODIES if op in OPERATIONS.values()])}
checks.positive_data_acceptance.enabled = false
# Those bodies are also rejected before the query string is looked at, with
# the body's own 4xx: 411 (no length) and 413 (a header length over the limit)
# are right answers to a request that is invalid in its body and its query.
checks.negative_data_rejection.expected-statuses = {NEGATIVE_OK}

# This server's diagnose.max_seconds is {DIAGNOSE_MAX_S}, below the spec's
# maximum of 600 (the option's bound): the spec says a longer `seconds` gets 400
# seconds_out_of_range, so a 400 answers schema-valid data here too.
[[operations]]
include-operation-id = "postDiagnose"
checks.positive_data_acceptance.expected-statuses = {DIAGNOSE_POSITIVE_OK}
''')
        env = dict(os.environ, NO_COLOR="1", COLUMNS="120")
        excluded = [arg for op in EXCLUDED for arg in ("--exclude-operation-id", op)]
        # A run whose report holds a schemathesis "Runtime Error" (a request
        # that raised in the client: seen once in a CI run on 2026-11-21, not
        # reproduced in 11 runs since, with or without CPU load) is kept in
        # full in the work directory and run once more; an error in the second
        # run fails the test.
        for attempt in (1, 2):
            reports = work / f"reports{attempt}"
            try:
                proc = subprocess.run([cli, "--config-file", str(config), "run", str(SPEC), "--no-color",
                                       "--report", "json", "--report-dir", str(reports)] + excluded,
                                      cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      timeout=RUN_TIMEOUT_S, text=True)
            except subprocess.TimeoutExpired as e:
                pytest.fail(f"schemathesis ran over {RUN_TIMEOUT_S}s:\n{(e.stdout or '')[-3000:]}")
            (work / f"stdout{attempt}.txt").write_text(proc.stdout)
            found = sorted(reports.glob("*.json"))
            assert found, f"schemathesis wrote no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}"
            report = json.loads(found[-1].read_text())
            if not report.get("errors") or attempt == 2:
                break
            print(f"schemathesis run 1 reported errors {report['errors']}; full output in "
                  f"{work / 'stdout1.txt'}; running once more", file=sys.stderr)
        alive = server.alive()
    finally:
        server_error = None
        try:
            stop_checked(server)
        except AssertionError as e:
            server_error = str(e)
    return {"report": report, "stdout": proc.stdout, "alive": alive, "server_error": server_error}


def failures_of(run, operation):
    return {f["code"]: f for f in run["report"]["failures"] if operation in f.get("operations", [])}


def test_schemathesis_tested_every_operation_of_the_spec(run):
    r = run["report"]
    assert r["complete"], f"the run stopped early: {r['stop_reason']}\n{run['stdout'][-3000:]}"
    assert r["errors"] == [], f"schemathesis errors:\n{run['stdout'][-3000:]}"
    ops = r["operations"]
    assert ops["total"] == len(ALL_OPERATIONS), ops
    assert ops["selected"] == ops["tested"] == len(OPERATIONS), ops
    labels = {label for f in r["failures"] for label in f.get("operations", [])}
    outside = labels - set(OPERATIONS)
    assert not outside, "failures outside the spec's operations:\n" + "\n\n".join(
        f"{label}:\n{sections(run['stdout']).get(label, '')[:6000]}" for label in outside)
    assert r["test_cases"]["generated"] >= len(OPERATIONS) * 5, r["test_cases"]


def test_no_request_got_a_5xx_and_the_server_stayed_up(run):
    fives = [f for f in run["report"]["failures"] if f["type"] in _SERVER_ERRORS]
    assert not fives, "5xx replies:\n" + "\n\n".join(
        sections(run["stdout"]).get(op, "") for f in fives for op in f["operations"])
    assert run["alive"], "the server died during the run"
    assert run["server_error"] is None, run["server_error"]


@pytest.mark.parametrize("operation", [
    pytest.param(label, id=op, marks=[pytest.mark.skip(reason=f"not run: {EXCLUDED[op]}")] if op in EXCLUDED else [])
    for label, op in sorted(ALL_OPERATIONS.items())])
def test_operation_conforms_to_the_spec(run, operation):
    failures = {code: f for code, f in failures_of(run, operation).items()
                if (operation, code) not in KNOWN_SPEC_BUGS}
    detail = sections(run["stdout"]).get(operation, "(no detail in the output)")
    assert not failures, (f"{operation}: " + ", ".join(f"{c} {f['title']}" for c, f in failures.items())
                          + f"\n{detail[:6000]}")


@pytest.mark.parametrize("operation,code", [
    pytest.param(op, code, id=f"{OPERATIONS.get(op, op)}-{code}",
                 marks=pytest.mark.xfail(strict=True, reason=why))
    for (op, code), why in KNOWN_SPEC_BUGS.items()])
def test_known_spec_bug_is_fixed(run, operation, code):
    assert code not in failures_of(run, operation), sections(run["stdout"]).get(operation, "")[:3000]


@pytest.mark.parametrize("value", ["2", "abc"])
def test_a_wait_value_outside_the_spec_enum_is_refused(tmp_path, value):
    server = start_tiny_server(tmp_path)
    try:
        c = server.client()
        body = streamfeed.encode_batch(np.zeros((1, 32, 32, 3), np.uint8), [0])
        r = requests.post(f"{server.url}/v1/batches", params={"wait": value}, data=body,
                          headers={"Content-Type": "application/vnd.safetensors"}, timeout=30)
        accepted = "streamfeed_batches_received_total{status=\"accepted\"} 0" in c.metrics()
        assert (r.status_code, accepted) == (400, True), r.text
    finally:
        stop_checked(server)
