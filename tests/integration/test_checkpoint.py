"""Checkpoints through the real HTTP path on the CPU reference backend: the
training state goes out (GET, save) and comes back (PUT, load, resume) bit for
bit, in PyTorch's state_dict naming; bad files change nothing; paths stay in
checkpoint.dir and URLs are http(s) only; periodic saves keep the last K and
survive kill -9; a restart with checkpoint.resume continues the step count and
the loss curve; model.init_from initialises matching parameters."""
import http.server
import json
import os
import re
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save
from safetensors.numpy import save_file as st_save_file

from sfharness import BIN, REPO, key, learnable_batch, wait_until

LISTINGS = REPO / "tests" / "checkpoint_listing"
SAFETENSORS = {"Content-Type": "application/vnd.safetensors"}

AUG = '[{"op":"to_dtype","scale":0.00392157}]'
TINY = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", AUG]
# Momentum 0.9, so the momentum buffers are not zero after a step.
TRAIN = TINY + ["--optim.lr", "0.05", "--optim.momentum", "0.9", "--model.seed", "1"]
# The learnable task of sfharness learns in about ten steps on raw 0..255 input
# (augment.pipeline []); scaled to [0,1] it does not move in 60 steps at these
# rates, so the loss-curve test trains on raw input.
LEARN = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", "[]",
         "--optim.lr", "0.05", "--optim.momentum", "0.9", "--model.seed", "1"]

CKPT_NAME = re.compile(r"^ckpt-(\d+)\.safetensors$")


# ---- helpers --------------------------------------------------------------------


def header_of(blob):
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n])


def listing(preset):
    return [(t["name"], t["shape"], t["dtype"])
            for t in json.loads((LISTINGS / f"{preset}.json").read_text())["state_dict"]]


def tensors_of_header(hdr):
    """[(name, shape, dtype)] in data order, without __metadata__."""
    items = [(k, v) for k, v in hdr.items() if k != "__metadata__"]
    items.sort(key=lambda kv: kv[1]["data_offsets"][0])
    return [(k, v["shape"], v["dtype"]) for k, v in items]


def data_of(blob):
    """The tensors of a checkpoint file: names, shapes, dtypes and bytes,
    without __metadata__ (whose config_hash follows PATCH /v1/config)."""
    (n,) = struct.unpack("<Q", blob[:8])
    return tensors_of_header(header_of(blob)), blob[8 + n:]


def get_ckpt(s, optimizer=True):
    r = s.get("/v1/checkpoint" + ("" if optimizer else "?optimizer=false"))
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/vnd.safetensors"
    return r.content


def put_ckpt(s, body):
    return s.request("PUT", "/v1/checkpoint", data=body, headers=SAFETENSORS)


def post_json(s, path, body=None):
    return s.request("POST", path, json=body if body is not None else {})


def train(s, rng, steps, n=8):
    losses = []
    for _ in range(steps):
        r = s.post_arrays(*learnable_batch(rng, n), wait=True)
        assert r.status_code == 200, r.text
        b = r.json()
        assert b["state"] == "done", b
        losses.append(b["loss"])
    return losses


def model_step(s):
    return s.get("/v1/model").json()["step"]


def ckpt_files(d):
    """{step: path} of the ckpt-<step> files of d."""
    out = {}
    for p in Path(d).iterdir():
        m = CKPT_NAME.match(p.name)
        if m:
            out[int(m.group(1))] = p
    return out


def tmp_files(d):
    return [p.name for p in Path(d).iterdir() if p.name.startswith(".") and ".tmp-" in p.name]


def error_of(r):
    return r.json()["error"]


def kill9(s):
    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait(30)
    s.stop(check=False)


# ---- format ------------------------------------------------------------------------


def test_tiny_checkpoint_is_the_pytorch_state_dict_then_the_optimizer_state(start_server):
    s = start_server(TRAIN)
    blob = get_ckpt(s)
    hdr = header_of(blob)
    names = tensors_of_header(hdr)
    expected = listing("tiny")
    assert names[:len(expected)] == expected
    optim = [(f"optim.{n}.momentum_buffer", shape, dtype) for n, shape, dtype in expected]
    assert names[len(expected):] == optim + [("optim.step", [], "I64")]
    meta = hdr["__metadata__"]
    assert meta["format"] == "streamfeed.checkpoint" and meta["format_version"] == "1"
    assert meta["step"] == "0" and meta["optimizer"] == "sgd" and meta["backend"] == "ref"
    assert re.fullmatch(r"[0-9a-f]{16}", meta["config_hash"])
    # The model travels as a model.spec layer list.
    spec = json.loads(meta["model"])
    assert spec["input"] == [3, 32, 32] and spec["classes"] == 10
    assert [l["name"] for l in spec["layers"]] == [str(i) for i in range(10)]
    # Without the optimizer, exactly the state_dict, which safetensors reads.
    bare = get_ckpt(s, optimizer=False)
    assert tensors_of_header(header_of(bare)) == expected
    sd = st_load(bare)
    assert all(v.dtype == np.float32 for v in sd.values())
    assert int(s.get("/v1/checkpoint").headers["X-Checkpoint-Step"]) == 0


def test_seed_classifier_checkpoint_matches_the_w1_pytorch_state_dict_listing(start_server):
    # 45M parameters; only the header is read (the server builds the whole file).
    s = start_server("--model.preset", "seed-classifier", "--pipeline.backend", "ref",
                     "--model.max_batch", "1", "--ring.slots", "2")
    r = s.get("/v1/checkpoint", stream=True, timeout=120)
    assert r.status_code == 200, r.text
    head = r.raw.read(8)
    (n,) = struct.unpack("<Q", head)
    hdr = json.loads(r.raw.read(n))
    total = int(r.headers["Content-Length"])
    r.close()
    expected = listing("seed-classifier")
    names = tensors_of_header(hdr)
    assert names[:len(expected)] == expected
    assert names[len(expected):-1] == [(f"optim.{a}.momentum_buffer", b, c) for a, b, c in expected]
    n_params = sum(int(np.prod(shape)) for _, shape, _ in expected)
    assert n_params == 44_787_754
    assert total == 8 + n + 2 * 4 * n_params + 8
    assert s.get("/v1/model").json()["params"] == n_params


# ---- round trips --------------------------------------------------------------------


def test_get_put_get_round_trip_is_bit_identical_and_training_continues_identically(start_server):
    s = start_server(TRAIN)
    rng = np.random.default_rng(1)
    train(s, rng, 3)
    a = get_ckpt(s)
    sd = st_load(a)
    assert int(sd["optim.step"]) == 3 and header_of(a)["__metadata__"]["step"] == "3"
    assert any(np.abs(v).sum() > 0 for k, v in sd.items() if k.endswith(".momentum_buffer"))
    # Two more steps on known batches: the state moves on.
    later = [learnable_batch(rng, 8) for _ in range(2)]
    for x, y in later:
        assert s.post_arrays(x, y, wait=True).json()["state"] == "done"
    b = get_ckpt(s)
    assert b != a and model_step(s) == 5
    # Back to step 3: the same bytes come out again.
    r = put_ckpt(s, a)
    assert r.status_code == 200, r.text
    assert r.json() == {**r.json(), "step": 3, "optimizer": True, "tensors": 21, "bytes": len(a)}
    assert get_ckpt(s) == a
    assert model_step(s) == 3
    # The same two batches from the restored state reproduce step 5 bit for
    # bit: parameters, momentum and step count all came back.
    for x, y in later:
        assert s.post_arrays(x, y, wait=True).json()["step"] in (4, 5)
    assert get_ckpt(s) == b
    m = s.metrics()
    assert m[key("streamfeed_checkpoint_loads_total", status="ok")] == 1


def test_put_without_optimizer_state_zeroes_momentum_and_keeps_the_step(start_server):
    s = start_server(TRAIN)
    rng = np.random.default_rng(2)
    train(s, rng, 2)
    bare = get_ckpt(s, optimizer=False)
    meta_less = st_save(st_load(bare))  # the same tensors, without our __metadata__
    train(s, rng, 2)
    r = put_ckpt(s, meta_less)
    assert r.status_code == 200, r.text
    assert r.json()["optimizer"] is False and r.json()["step"] == 4
    full = st_load(get_ckpt(s))
    for name, v in st_load(bare).items():
        np.testing.assert_array_equal(full[name], v)
        assert not full[f"optim.{name}.momentum_buffer"].any()
    assert int(full["optim.step"]) == 4 and model_step(s) == 4


def _bad_bodies():
    """(id, function(state_dict) -> body, code, field)."""
    def rename(sd):
        sd["2.weights"] = sd.pop("2.weight")
        return st_save(sd)

    def missing(sd):
        del sd["9.bias"]
        return st_save(sd)

    def shape(sd):
        sd["4.weight"] = np.ascontiguousarray(sd["4.weight"].transpose(1, 0, 2, 3))
        return st_save(sd)

    def dtype(sd):
        sd["0.bias"] = sd["0.bias"].astype(np.float64)
        return st_save(sd)

    def half(sd):
        sd["9.weight"] = sd["9.weight"].astype(np.float16)
        return st_save(sd)

    def momentum_missing(sd):
        del sd["optim.9.bias.momentum_buffer"]
        return st_save(sd)

    def momentum_shape(sd):
        sd["optim.6.bias.momentum_buffer"] = np.zeros(31, np.float32)
        return st_save(sd)

    def step_dtype(sd):
        sd["optim.step"] = np.array(3.0, np.float32)
        return st_save(sd)

    def truncated(sd):
        return st_save(sd)[:-100]

    def not_safetensors(sd):
        return b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1} " + b"\0" * 64

    return [
        ("wrong_name", rename, "checkpoint_tensor_unknown", "2.weights"),
        ("missing", missing, "checkpoint_tensor_missing", "9.bias"),
        ("wrong_shape", shape, "checkpoint_tensor_mismatch", "4.weight"),
        ("wrong_dtype_f64", dtype, "checkpoint_tensor_mismatch", "0.bias"),
        ("wrong_dtype_f16", half, "checkpoint_tensor_mismatch", "9.weight"),
        ("momentum_missing", momentum_missing, "checkpoint_tensor_missing", "optim.9.bias.momentum_buffer"),
        ("momentum_shape", momentum_shape, "checkpoint_tensor_mismatch", "optim.6.bias.momentum_buffer"),
        ("step_dtype", step_dtype, "checkpoint_tensor_mismatch", "optim.step"),
        ("truncated", truncated, "checkpoint_invalid", None),
        ("not_safetensors", not_safetensors, "checkpoint_invalid", None),
    ]


def test_put_with_a_wrong_name_shape_or_dtype_is_400_naming_the_tensor_and_changes_nothing(start_server):
    s = start_server(TRAIN)
    train(s, np.random.default_rng(3), 2)
    before = get_ckpt(s)
    for what, make, code, field in _bad_bodies():
        r = put_ckpt(s, make(st_load(before)))
        assert r.status_code == 400, (what, r.text)
        e = error_of(r)
        assert e["code"] == code, (what, e)
        if field:
            assert e["field"] == field and field in e["message"], (what, e)
        assert get_ckpt(s) == before, f"{what}: the state changed after a refused PUT"
    assert model_step(s) == 2
    r = s.request("PUT", "/v1/checkpoint", data=b"", headers=SAFETENSORS)
    assert r.status_code == 400 and error_of(r)["code"] == "body_empty"
    r = s.request("PUT", "/v1/checkpoint", data=before, headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    assert get_ckpt(s) == before
    assert s.metric("streamfeed_checkpoint_loads_total", status="failed") == len(_bad_bodies())


def test_step_counts_of_10_15_and_above_are_refused_and_10_15_minus_1_round_trips(start_server, tmp_path):
    """optim.step 2^63-1 used to be taken, wrap to a negative step at the next
    save, and leave a newest ckpt-<step> file that load and resume refuse.
    Replies print the step as a cJSON number, exact digits below 10^15 only
    (2^53 - 1 came back as 9.00719925474099e+15): that is the bound."""
    d = tmp_path / "ck"
    s = start_server(TRAIN + ["--checkpoint.dir", str(d)])
    rng = np.random.default_rng(4)
    train(s, rng, 1)
    assert post_json(s, "/v1/checkpoint/save").status_code == 200
    good = get_ckpt(s)
    meta = header_of(good)["__metadata__"]
    sd = st_load(good)

    def refused(r, field):
        assert r.status_code == 400, r.text
        e = error_of(r)
        assert (e["code"], e["field"]) == ("checkpoint_tensor_mismatch", field), e
        assert "999999999999999" in e["message"] and "JSON" in e["message"], e

    for step in (10**15, 2**53, 2**63 - 1):
        sd["optim.step"] = np.array(step, np.int64)
        refused(put_ckpt(s, st_save(sd, metadata=meta)), "optim.step")
    (d / "big.safetensors").write_bytes(st_save(sd, metadata=meta))
    refused(post_json(s, "/v1/checkpoint/load", {"path": "big.safetensors"}), "optim.step")
    # Without optim.step the metadata's step is the one taken: bounded too.
    bare = st_load(get_ckpt(s, optimizer=False))
    refused(put_ckpt(s, st_save(bare, metadata={**meta, "step": str(10**15)})), "step")
    assert get_ckpt(s) == good and model_step(s) == 1

    top = 10**15 - 1
    sd["optim.step"] = np.array(top, np.int64)
    r = put_ckpt(s, st_save(sd, metadata=meta))
    assert r.status_code == 200 and r.json()["step"] == top, r.text
    assert re.search(r'"step":\s*999999999999999[,}]', s.get("/v1/model").text)
    assert int(st_load(get_ckpt(s))["optim.step"]) == top
    # One more step goes past the bound: saving that state is refused rather
    # than leaving a newest file that rotates the loadable ones away.
    r = s.post_arrays(*learnable_batch(rng, 8), wait=True)
    assert r.json()["step"] == top + 1 and model_step(s) == top + 1, r.text
    r = post_json(s, "/v1/checkpoint/save")
    assert r.status_code == 500 and "999999999999999" in error_of(r)["message"], r.text
    assert list(ckpt_files(d)) == [1]
    r = post_json(s, "/v1/checkpoint/load")
    assert r.status_code == 200 and r.json()["step"] == 1, r.text


def test_a_checkpoint_written_by_python_safetensors_with_torch_names_loads(start_server, tmp_path):
    """What safetensors.torch.save_file(model.state_dict()) writes, emulated
    with numpy: the state_dict names, F32, no metadata of ours."""
    s = start_server(TRAIN + ["--checkpoint.dir", str(tmp_path / "ck")])
    rng = np.random.default_rng(4)
    sd = {name: rng.standard_normal(shape).astype(np.float32) for name, shape, _ in listing("tiny")}
    body = st_save(sd, metadata={"format": "pt"})
    r = put_ckpt(s, body)
    assert r.status_code == 200, r.text
    assert r.json()["optimizer"] is False
    got = st_load(get_ckpt(s, optimizer=False))
    assert list(got) == list(sd) or set(got) == set(sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(got[k], v)
    # The same through a file and POST /v1/checkpoint/load.
    sd2 = {k: (v * 0.5).astype(np.float32) for k, v in sd.items()}
    st_save_file(sd2, str(tmp_path / "ck" / "from_torch.safetensors"))
    r = post_json(s, "/v1/checkpoint/load", {"path": "from_torch.safetensors"})
    assert r.status_code == 200, r.text
    got = st_load(get_ckpt(s, optimizer=False))
    for k, v in sd2.items():
        np.testing.assert_array_equal(got[k], v)
    # And training runs from it.
    assert s.post_arrays(*learnable_batch(rng, 8), wait=True).json()["state"] == "done"


# ---- save and load by path ---------------------------------------------------------------


def test_save_and_load_by_path_stay_inside_checkpoint_dir(start_server, tmp_path):
    d = tmp_path / "ck"
    s = start_server(TRAIN + ["--checkpoint.dir", str(d)])
    rng = np.random.default_rng(5)
    train(s, rng, 2)
    r = post_json(s, "/v1/checkpoint/save", {"path": "a.safetensors"})
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["path"] == str((d / "a.safetensors").resolve()) and res["step"] == 2
    saved = (d / "a.safetensors").read_bytes()
    assert res["bytes"] == len(saved)
    assert saved == get_ckpt(s)
    # Absolute inside the directory works too; a subdirectory that exists.
    (d / "sub").mkdir()
    r = post_json(s, "/v1/checkpoint/save", {"path": str(d / "sub" / "b.safetensors"), "optimizer": False})
    assert r.status_code == 200, r.text
    assert r.json()["optimizer"] is False
    assert "optim.step" not in header_of((d / "sub" / "b.safetensors").read_bytes())
    train(s, rng, 2)
    assert get_ckpt(s) != saved
    r = post_json(s, "/v1/checkpoint/load", {"path": "a.safetensors"})
    assert r.status_code == 200, r.text
    assert r.json()["step"] == 2 and r.json()["optimizer"] is True
    assert get_ckpt(s) == saved and model_step(s) == 2

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.safetensors").write_bytes(saved)
    os.symlink(outside, d / "link")
    for body in ({"path": "/etc/passwd"}, {"path": "../outside/x.safetensors"},
                 {"path": str(outside / "x.safetensors")}, {"path": "link/x.safetensors"},
                 {"path": "sub/../../outside/x.safetensors"}):
        for op in ("load", "save"):
            r = post_json(s, f"/v1/checkpoint/{op}", body)
            assert r.status_code == 400, (op, body, r.text)
            assert error_of(r)["code"] == "path_not_allowed", (op, body, r.text)
    assert not (outside / "y.safetensors").exists()
    for body, code, status in (({"path": "nope.safetensors"}, "checkpoint_not_found", 404),
                               ({"path": ".hidden"}, "path_invalid", 400),
                               ({"path": "a.safetensors", "url": "http://127.0.0.1:1/x"}, "request_invalid", 400),
                               ({"file": "a.safetensors"}, "request_invalid", 400),
                               ({"path": 3}, "request_invalid", 400)):
        r = post_json(s, "/v1/checkpoint/load", body)
        assert (r.status_code, error_of(r)["code"]) == (status, code), (body, r.text)
    # A save onto a directory, or below a file, is the request's fault.
    for body in ({"path": "sub"}, {"path": "a.safetensors/x.safetensors"}):
        r = post_json(s, "/v1/checkpoint/save", body)
        assert (r.status_code, error_of(r)["code"]) == (400, "path_invalid"), (body, r.text)
    assert get_ckpt(s) == saved


def test_paths_need_a_checkpoint_dir_and_a_sink_server_has_no_checkpoints(start_server):
    s = start_server(TRAIN)
    for op in ("save", "load"):
        r = post_json(s, f"/v1/checkpoint/{op}", {"path": "x.safetensors"})
        assert (r.status_code, error_of(r)["code"]) == (409, "checkpoint_dir_unset"), r.text
        r = post_json(s, f"/v1/checkpoint/{op}")
        assert (r.status_code, error_of(r)["code"]) == (409, "checkpoint_dir_unset"), r.text
    sink = start_server("--pipeline.mode", "sink")
    assert sink.get("/v1/checkpoint").status_code == 409
    assert error_of(put_ckpt(sink, b"x" * 16))["code"] == "no_backend"
    assert post_json(sink, "/v1/checkpoint/save").status_code == 409
    m = sink.metrics()
    assert m[key("streamfeed_checkpoints_total", status="ok")] == 0


def test_checkpoint_options_need_a_dir_and_are_in_the_config(start_server):
    p = subprocess.run([BIN, "--http.port", "0", "--pipeline.mode", "sink", "--checkpoint.every_steps", "5"],
                       capture_output=True, text=True, timeout=30,
                       env={k: v for k, v in os.environ.items() if not k.startswith("STREAMFEED_")})
    assert p.returncode == 2 and "checkpoint.dir" in p.stderr, p.stderr
    s = start_server(TRAIN + ["--checkpoint.url_token", "s3cr3t"])
    c = s.config()
    assert c["checkpoint"]["url_token"] == "***"
    assert c["checkpoint"]["keep"] == 3 and c["model"]["init_from"] == ""


# ---- URLs ---------------------------------------------------------------------------------


class _Store(http.server.BaseHTTPRequestHandler):
    """GET serves files, PUT stores bodies, both record the Authorization
    header; /redirect-file and /redirect-http answer 302."""
    files = {}
    auth = []

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.auth.append(self.headers.get("Authorization"))
        if self.path == "/redirect-file":
            self.send_response(302)
            self.send_header("Location", "file:///etc/passwd")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/redirect-http":
            self.send_response(302)
            self.send_header("Location", "/a.safetensors")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = self.files.get(self.path.split("?")[0])
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        self.auth.append(self.headers.get("Authorization"))
        n = int(self.headers["Content-Length"])
        self.files[self.path] = self.rfile.read(n)
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def store():
    handler = type("Store", (_Store,), {"files": {}, "auth": []})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv, handler, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_load_and_save_by_url_are_http_only_with_the_bearer_token(start_server, store):
    srv, handler, base = store
    # The store is on loopback, which URL transfers reach only when listed.
    s = start_server(TRAIN + ["--checkpoint.url_token", "s3cr3t", "--checkpoint.url_allow", "127.0.0.1"])
    rng = np.random.default_rng(6)
    train(s, rng, 2)
    a = get_ckpt(s)
    handler.files["/a.safetensors"] = a
    train(s, rng, 2)
    r = post_json(s, "/v1/checkpoint/load", {"url": f"{base}/a.safetensors?sig=secret"})
    assert r.status_code == 200, r.text
    assert r.json()["url"] == f"{base}/a.safetensors?…"  # the query (a signature) is not echoed
    assert get_ckpt(s) == a and model_step(s) == 2
    assert handler.auth[-1] == "Bearer s3cr3t"
    # A redirect to http is followed; one to file:// is refused by libcurl.
    train(s, rng, 1)
    assert post_json(s, "/v1/checkpoint/load", {"url": f"{base}/redirect-http"}).status_code == 200
    assert get_ckpt(s) == a
    r = post_json(s, "/v1/checkpoint/load", {"url": f"{base}/redirect-file"})
    assert (r.status_code, error_of(r)["code"]) == (422, "url_fetch_failed"), r.text
    r = post_json(s, "/v1/checkpoint/load", {"url": f"{base}/missing.safetensors"})
    assert (r.status_code, error_of(r)["code"]) == (422, "url_fetch_failed"), r.text
    assert "404" in error_of(r)["message"]
    for url in ("file:///etc/passwd", "ftp://127.0.0.1/a", "gopher://x", "/etc/passwd"):
        r = post_json(s, "/v1/checkpoint/load", {"url": url})
        assert (r.status_code, error_of(r)["code"]) == (400, "url_scheme_not_allowed"), (url, r.text)
    # Save by HTTP PUT.
    r = post_json(s, "/v1/checkpoint/save", {"url": f"{base}/up/b.safetensors"})
    assert r.status_code == 200, r.text
    assert handler.files["/up/b.safetensors"] == get_ckpt(s)
    assert handler.auth[-1] == "Bearer s3cr3t"
    # Downloads are bounded by checkpoint.max_bytes.
    assert s.patch_config({"checkpoint": {"max_bytes": 4096}}).status_code == 200
    r = post_json(s, "/v1/checkpoint/load", {"url": f"{base}/a.safetensors"})
    assert (r.status_code, error_of(r)["code"]) == (413, "checkpoint_too_large"), r.text
    r = put_ckpt(s, a)
    assert r.status_code == 413, r.text
    assert data_of(get_ckpt(s)) == data_of(a)


# ---- periodic saves, kill -9, resume -----------------------------------------------------------


def test_rotation_and_resume_count_only_the_service_s_own_checkpoint_names(start_server, tmp_path):
    d = tmp_path / "ck"
    s = start_server(TRAIN + ["--checkpoint.dir", str(d), "--checkpoint.keep", "1"])
    rng = np.random.default_rng(9)
    train(s, rng, 2)
    # A save under a rotating checkpoint's name would be ranked by the step in
    # its name: refused in checkpoint.dir itself, a plain name below it.
    for name in ("ckpt-9999999999.safetensors", str(d / "ckpt-0000000001.safetensors")):
        r = post_json(s, "/v1/checkpoint/save", {"path": name})
        assert (r.status_code, error_of(r)["code"], error_of(r)["field"]) == (400, "path_reserved", "path"), r.text
    (d / "sub").mkdir()
    assert post_json(s, "/v1/checkpoint/save", {"path": "sub/ckpt-9999999999.safetensors"}).status_code == 200
    assert post_json(s, "/v1/checkpoint/save", {"path": "mine.safetensors"}).status_code == 200
    # Files that only look like one (not the service's zero-padded form) are
    # neither deleted by rotation nor taken for the newest.
    for name in ("ckpt-1.safetensors", "ckpt-09999999999.safetensors", "ckpt-10.safetensors"):
        (d / name).write_bytes((d / "mine.safetensors").read_bytes())
    for step in (3, 4):
        train(s, rng, 1)
        r = post_json(s, "/v1/checkpoint/save", {})
        assert r.status_code == 200 and r.json()["step"] == step, r.text
        assert Path(r.json()["path"]).name == f"ckpt-{step:010d}.safetensors"
        assert Path(r.json()["path"]).exists()
    assert sorted(p.name for p in d.glob("ckpt-*")) == [
        "ckpt-0000000004.safetensors", "ckpt-09999999999.safetensors", "ckpt-1.safetensors", "ckpt-10.safetensors"]
    train(s, rng, 1)
    r = post_json(s, "/v1/checkpoint/load", {})
    assert r.status_code == 200 and r.json()["step"] == 4, r.text
    assert model_step(s) == 4


def test_with_gradient_accumulation_periodic_saves_fall_on_optimizer_steps_once_each(start_server, tmp_path):
    # The hook ran for every batch: a batch inside an accumulation group left
    # the step where it was, so step 0 was saved after the first batch and
    # every save was written twice.
    d = tmp_path / "ck"
    s = start_server(TRAIN + ["--checkpoint.dir", str(d), "--checkpoint.every_steps", "2",
                              "--checkpoint.keep", "10", "--model.grad_accum_steps", "2"])
    rng = np.random.default_rng(8)
    # A save due while the last one is still being written is skipped (by
    # design): the next two steps wait for the first save.
    train(s, rng, 4)  # 2 optimizer steps
    wait_until(lambda: s.metric("streamfeed_checkpoints_total", status="ok") == 1, 30, what="the save of step 2")
    train(s, rng, 4)  # 2 more
    wait_until(lambda: sorted(ckpt_files(d)) == [2, 4], 30, what="the checkpoints of steps 2 and 4")
    wait_until(lambda: s.metric("streamfeed_checkpoints_total", status="ok") == 2, 10, what="two saves")
    assert s.metric("streamfeed_checkpoints_total", status="skipped") == 0


def test_periodic_saves_keep_the_last_k_files(start_server, tmp_path):
    d = tmp_path / "ck"
    s = start_server(TRAIN + ["--checkpoint.dir", str(d), "--checkpoint.every_steps", "2",
                              "--checkpoint.keep", "3"])

    def saves(m=None):
        m = m or s.metrics()
        return {st: m.get(key("streamfeed_checkpoints_total", status=st), 0) for st in ("ok", "failed", "skipped")}

    rng = np.random.default_rng(7)
    for step in range(1, 11):
        train(s, rng, 1)
        # One write at a time: wait for it, so that none is skipped.
        wait_until(lambda: sum(saves().values()) == step // 2, 30, what=f"the checkpoint of step {step}")
    m = s.metrics()
    assert saves(m) == {"ok": 5, "failed": 0, "skipped": 0}
    files = ckpt_files(d)
    assert sorted(files) == [6, 8, 10]
    assert m[key("streamfeed_checkpoint_last_step")] == 10
    assert m[key("streamfeed_checkpoint_seconds_count")] == 5
    for step, p in files.items():
        sd = st_load(p.read_bytes())
        assert int(sd["optim.step"]) == step
    assert tmp_files(d) == []
    # Hot: every step, keep 2. Batches queued back to back: a save that comes
    # due while the last one is still being written is skipped and counted.
    assert s.patch_config({"checkpoint": {"every_steps": 1, "keep": 2}}).status_code == 200
    for _ in range(20):
        assert s.post_arrays(*learnable_batch(rng, 8)).status_code == 202
    wait_until(lambda: sum(saves().values()) == 25, 60, what="20 more checkpoints written or skipped")
    counts = saves()
    assert counts["failed"] == 0 and counts["ok"] >= 6
    files = ckpt_files(d)
    assert len(files) == 2 and max(files) == s.metric("streamfeed_checkpoint_last_step")
    assert all(int(st_load(p.read_bytes())["optim.step"]) == st for st, p in files.items())


def test_kill_9_during_saves_leaves_a_newest_file_that_resume_loads(start_server, tmp_path):
    d = tmp_path / "ck"
    flags = TRAIN + ["--checkpoint.dir", str(d), "--checkpoint.every_steps", "1",
                     "--checkpoint.keep", "3", "--ring.slots", "16"]
    rng = np.random.default_rng(9)
    step = 0
    # Each run is killed after this many of its own steps (of the 15 it is
    # sent), so every run gets past its resume point whatever the last run saved.
    for kill_after in (5, 7, 11):
        s = start_server(flags + ["--checkpoint.resume", "true"])
        assert model_step(s) == step
        # Batches queued without waiting: the engine trains and saves while we kill it.
        for _ in range(15):
            assert s.post_arrays(*learnable_batch(rng, 8)).status_code == 202
        # Killed once it trained and a save of this run landed: the first
        # write's fsync may take longer than the steps do on a busy disk.
        wait_until(lambda: (s.metric("streamfeed_steps_total") >= kill_after
                            and max(ckpt_files(d), default=-1) > step) or None, 60,
                   what="some steps and a checkpoint of them")
        kill9(s)
        files = ckpt_files(d)
        assert files, "no checkpoint written before the kill"
        for st, p in files.items():  # every visible file is complete
            assert int(st_load(p.read_bytes())["optim.step"]) == st
        step = max(files)
    # A torn file named like the newest checkpoint (a copy cut short, as a
    # crash without the rename would leave) and a stale temporary file.
    newest = ckpt_files(d)[step]
    torn = d / f"ckpt-{step + 100:010d}.safetensors"
    torn.write_bytes(newest.read_bytes()[:-1000])
    (d / f".ckpt-{step + 200:010d}.safetensors.tmp-1-1").write_bytes(b"partial")
    s = start_server(flags + ["--checkpoint.resume", "true"])
    assert model_step(s) == step
    resumed, want = st_load(get_ckpt(s)), st_load(newest.read_bytes())
    assert set(resumed) == set(want)
    for k in want:
        np.testing.assert_array_equal(resumed[k], want[k])
    assert tmp_files(d) == [], "the stale temporary file was not removed at start"
    s.stop()
    assert f"skipping {torn.resolve()}" in s.stderr()


def test_restart_with_resume_continues_the_step_count_and_the_loss(start_server, tmp_path):
    d = tmp_path / "ck"
    flags = LEARN + ["--checkpoint.dir", str(d), "--checkpoint.resume", "true"]
    s = start_server(flags)
    rng = np.random.default_rng(10)
    losses = train(s, rng, 30, n=32)
    first = losses[0]
    assert first > 1.5 and max(losses[-5:]) < first / 2, losses
    s.stop()  # SIGTERM: the final checkpoint
    assert ckpt_files(d).keys() == {30}
    assert "step 30 saved" in s.stderr()
    s2 = start_server(flags)
    assert model_step(s2) == 30
    after = [s2.post_arrays(*learnable_batch(rng, 32), wait=True).json() for _ in range(3)]
    assert [b["step"] for b in after] == [31, 32, 33]
    assert max(b["loss"] for b in after) < first / 2, (losses[-5:], after)
    # A fresh start from the seed restarts high: the resumed run really resumed.
    fresh = start_server(LEARN)
    assert fresh.post_arrays(*learnable_batch(rng, 32), wait=True).json()["loss"] > 1.5
    # The resumed run's own final checkpoint.
    s2.stop()
    assert ckpt_files(d).keys() == {30, 33}


def test_resume_refuses_a_checkpoint_of_another_model(start_server, tmp_path):
    d = tmp_path / "ck"
    s = start_server(TRAIN + ["--checkpoint.dir", str(d)])
    assert post_json(s, "/v1/checkpoint/save").status_code == 200
    s.stop()
    other = json.dumps({"input": [3, 32, 32], "classes": 10, "layers": [
        {"type": "conv2d", "out": 4, "k": 1}, {"type": "relu"}, {"type": "flatten"},
        {"type": "linear", "out": 10}]})
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMFEED_")}
    p = subprocess.run([BIN, "--http.port", "0", "--pipeline.backend", "ref", "--model.spec", other,
                        "--augment.pipeline", AUG, "--checkpoint.dir", str(d), "--checkpoint.resume", "true"],
                       capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode == 1, p.stderr
    assert "checkpoint.resume" in p.stderr and "another model" in p.stderr, p.stderr


# ---- model.init_from ---------------------------------------------------------------------------


def test_init_from_initialises_the_parameters_it_names(start_server, tmp_path, store):
    srv, handler, base = store
    ref = st_load(get_ckpt(start_server(TRAIN), optimizer=False))
    rng = np.random.default_rng(11)
    # A "pre-trained backbone": the first two layers, plus tensors of a head
    # this model does not have.
    backbone = {"0.weight": rng.standard_normal((4, 3, 1, 1)).astype(np.float32),
                "0.bias": rng.standard_normal(4).astype(np.float32),
                "2.weight": rng.standard_normal((8, 4, 2, 2)).astype(np.float32),
                "decoder.0.weight": np.zeros((3, 3), np.float32)}
    path = tmp_path / "backbone.safetensors"
    st_save_file(backbone, str(path))
    handler.files["/backbone.safetensors"] = path.read_bytes()
    signed = f"http://user:pa55@{base[len('http://'):]}/backbone.safetensors?sig=S3CR3T"
    for src in (str(path), f"{base}/backbone.safetensors", signed):
        s = start_server(TRAIN + ["--model.init_from", src])
        got = st_load(get_ckpt(s, optimizer=False))
        for k in ("0.weight", "0.bias", "2.weight"):
            np.testing.assert_array_equal(got[k], backbone[k])
        for k in ("2.bias", "4.weight", "9.weight", "9.bias"):
            np.testing.assert_array_equal(got[k], ref[k])
        assert "3 of 10 parameter tensors initialised" in s.stderr()
        assert s.post_arrays(*learnable_batch(rng, 8), wait=True).json()["state"] == "done"
        # The configuration shows a URL as the logs do: no user:password@, no
        # signed query; that text patched back keeps the value.
        shown = s.config()["model"]["init_from"]
        assert "pa55" not in shown and "S3CR3T" not in shown and "pa55" not in s.stderr(), shown
        assert shown == (src if src != signed else f"{base}/backbone.safetensors?…"), shown
        r = s.patch_config({"model": {"init_from": shown}})
        assert r.status_code == 200 and r.json()["pending_restart"] == [], r.text
    # A tensor of the right name and the wrong shape stops the start.
    backbone["0.weight"] = np.zeros((4, 3), np.float32)
    st_save_file(backbone, str(path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMFEED_")}
    p = subprocess.run([BIN, "--http.port", "0"] + TRAIN + ["--model.init_from", str(path)],
                       capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode == 1 and "0.weight" in p.stderr, p.stderr


def test_init_from_fills_an_encoder_named_like_the_pytorch_module(start_server, tmp_path):
    """The frozen-encoder case: layers named as PyTorch's nested modules name
    them take a backbone's state_dict as it was saved."""
    spec = json.dumps({"input": [3, 32, 32], "classes": 10, "layers": [
        {"type": "conv2d", "name": "encoder.0", "out": 4, "k": 1}, {"type": "relu", "name": "encoder.1"},
        {"type": "conv2d", "name": "encoder.2", "out": 8, "k": 2, "stride": 2},
        {"type": "relu", "name": "encoder.3"}, {"type": "flatten", "name": "flatten"},
        {"type": "linear", "name": "head", "out": 10}]})
    rng = np.random.default_rng(13)
    encoder = {"encoder.0.weight": rng.standard_normal((4, 3, 1, 1)).astype(np.float32),
               "encoder.0.bias": rng.standard_normal(4).astype(np.float32),
               "encoder.2.weight": rng.standard_normal((8, 4, 2, 2)).astype(np.float32),
               "encoder.2.bias": rng.standard_normal(8).astype(np.float32)}
    path = tmp_path / "encoder.safetensors"
    st_save_file(encoder, str(path))
    s = start_server("--pipeline.backend", "ref", "--augment.pipeline", AUG, "--model.spec", spec,
                     "--model.init_from", str(path))
    got = st_load(get_ckpt(s, optimizer=False))
    assert list(got)[:4] == list(encoder) or set(encoder) <= set(got)
    for k, v in encoder.items():
        np.testing.assert_array_equal(got[k], v)
    assert got["head.weight"].shape == (10, 8 * 16 * 16)


# ---- while training runs ---------------------------------------------------------------------


def test_checkpoints_taken_while_training_runs_are_whole_steps(start_server, tmp_path):
    """GET, save and PUT interleaved with a stream of batches: every snapshot
    is the state after a completed step (its step count agrees everywhere),
    snapshots come in step order, nothing is lost or fails, and a client that
    goes away mid-download leaves nothing behind."""
    d = tmp_path / "ck"
    s = start_server(TRAIN + ["--checkpoint.dir", str(d), "--checkpoint.every_steps", "3",
                              "--ring.slots", "16"])
    rng = np.random.default_rng(12)
    stop = threading.Event()
    posted = []

    def feed():
        while not stop.is_set() and len(posted) < 120:
            r = s.post_arrays(*learnable_batch(rng, 8))
            if r.status_code == 202:
                posted.append(r.json()["id"])

    t = threading.Thread(target=feed)
    t.start()
    steps = []
    try:
        for i in range(25):
            r = s.get("/v1/checkpoint")
            assert r.status_code == 200, r.text
            sd, meta = st_load(r.content), header_of(r.content)["__metadata__"]
            step = int(sd["optim.step"])
            assert step == int(meta["step"]) == int(r.headers["X-Checkpoint-Step"])
            steps.append(step)
            if i % 5 == 0:
                assert post_json(s, "/v1/checkpoint/save", {"path": f"s{i}.safetensors"}).status_code == 200
            if i % 7 == 0:
                assert put_ckpt(s, r.content).status_code == 200
            if i % 6 == 0:  # a download abandoned after its first bytes
                c = s.connect()
                c.sendall(b"GET /v1/checkpoint HTTP/1.1\r\nHost: x\r\n\r\n")
                assert c.recv(16)
                s.reset(c)
    finally:
        stop.set()
        t.join()
    assert steps == sorted(steps) and steps[-1] > steps[0]
    for bid in posted:
        assert s.wait_batch(bid)["state"] == "done"
    m = s.metrics()
    assert m[key("streamfeed_checkpoints_total", status="failed")] == 0
    assert m[key("streamfeed_checkpoint_loads_total", status="failed")] == 0
