"""Checkpoints from untrusted sources on the CPU reference backend: non-finite
values are refused on every path into the state (PUT, load by path and URL,
resume, model.init_from); URL transfers are confined (auth, allow-list, no
loopback or metadata addresses, redirects re-checked, no echo of fetched
bytes, credentials redacted); request paths cannot smuggle a NUL or leave
checkpoint.dir through a symlink; oversized bodies are refused before they
are buffered; periodic saves do not wait behind a slow URL."""
import http.server
import os
import subprocess
import threading

import numpy as np
import pytest
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from sfharness import BIN
from test_checkpoint import (AUG, TRAIN, ckpt_files, error_of, get_ckpt, model_step, post_json,
                             put_ckpt, train)


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("STREAMFEED_")}


def run_start(args, timeout=30):
    """Starts the binary with args and returns the finished process (a start
    that is refused exits at once)."""
    return subprocess.run([BIN, "--http.port", "0"] + args, capture_output=True, text=True,
                          timeout=timeout, env=clean_env())


def poisoned(blob, name, value):
    """The checkpoint blob with element 1 of tensor name set to value."""
    t = st_load(blob)
    t[name] = t[name].copy()
    t[name].flat[1] = value
    return st_save(t)


class Files(http.server.BaseHTTPRequestHandler):
    """Serves self.files; /hang answers nothing until released."""
    files = {}
    release = None

    def do_GET(self):
        if self.path == "/hang":
            self.release.wait(60)
            return
        body = self.files.get(self.path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def files():
    handler = type("F", (Files,), {"files": {}, "release": threading.Event()})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield handler, f"http://127.0.0.1:{srv.server_address[1]}"
    handler.release.set()
    srv.shutdown()
    srv.server_close()


# ---- non-finite values ---------------------------------------------------------------------


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_put_of_a_non_finite_tensor_is_400_naming_it_and_changes_nothing(start_server, value):
    s = start_server(TRAIN)
    before = get_ckpt(s)
    r = put_ckpt(s, poisoned(before, "2.weight", value))
    assert (r.status_code, error_of(r)["code"]) == (400, "checkpoint_not_finite"), r.text
    assert error_of(r)["field"] == "2.weight"
    assert get_ckpt(s) == before


def test_non_finite_optimizer_state_and_load_by_path_are_refused(start_server, tmp_path):
    d = tmp_path / "ck"
    s = start_server(TRAIN + ["--checkpoint.dir", str(d)])
    train(s, np.random.default_rng(1), 1)
    before = get_ckpt(s)
    r = put_ckpt(s, poisoned(before, "optim.0.weight.momentum_buffer", np.nan))
    assert (r.status_code, error_of(r)["field"]) == (400, "optim.0.weight.momentum_buffer"), r.text
    (d / "bad.safetensors").write_bytes(poisoned(before, "0.bias", np.inf))
    r = post_json(s, "/v1/checkpoint/load", {"path": "bad.safetensors"})
    assert (r.status_code, error_of(r)["code"], error_of(r)["field"]) == (
        400, "checkpoint_not_finite", "0.bias"), r.text
    assert get_ckpt(s) == before


def test_resume_and_init_from_refuse_a_non_finite_file_with_a_clear_error(start_server, tmp_path):
    d = tmp_path / "ck"
    s = start_server(TRAIN + ["--checkpoint.dir", str(d)])
    assert post_json(s, "/v1/checkpoint/save").status_code == 200
    s.stop()
    (newest,) = ckpt_files(d).values()
    newest.write_bytes(poisoned(newest.read_bytes(), "9.weight", np.nan))
    p = run_start(TRAIN + ["--checkpoint.dir", str(d), "--checkpoint.resume", "true"])
    assert p.returncode == 1, p.stderr
    assert "checkpoint.resume" in p.stderr and "9.weight" in p.stderr and "finite" in p.stderr, p.stderr
    p = run_start(TRAIN + ["--model.init_from", str(newest)])
    assert p.returncode == 1, p.stderr
    assert "model.init_from" in p.stderr and "9.weight" in p.stderr and "finite" in p.stderr, p.stderr


# ---- paths ---------------------------------------------------------------------------------


def raw_post(s, path, text):
    return s.request("POST", path, data=text.encode(), headers={"Content-Type": "application/json"})


def test_a_nul_inside_a_json_path_is_400_and_writes_nothing(start_server, tmp_path):
    d = tmp_path / "ck"
    s = start_server(TRAIN + ["--checkpoint.dir", str(d)])
    for route in ("/v1/checkpoint/save", "/v1/checkpoint/load"):
        r = raw_post(s, route, '{"path": "a.safetensors\\u0000.evil"}')
        assert (r.status_code, error_of(r)["code"]) == (400, "path_invalid"), r.text
    assert not (d / "a.safetensors").exists()
    # An escaped backslash followed by "u0000" is not a NUL: an ordinary (odd) name.
    r = raw_post(s, "/v1/checkpoint/save", '{"path": "b\\\\u0000.safetensors"}')
    assert r.status_code == 200, r.text


def test_a_name_longer_than_the_file_system_allows_is_400_not_500(start_server, tmp_path):
    d = tmp_path / "ck"
    s = start_server(TRAIN + ["--checkpoint.dir", str(d)])
    long = "a" * 300 + ".safetensors"
    for route in ("/v1/checkpoint/save", "/v1/checkpoint/load"):
        r = post_json(s, route, {"path": long})
        assert (r.status_code, error_of(r)["code"]) == (400, "path_invalid"), r.text


def test_load_newest_and_resume_do_not_follow_a_ckpt_symlink_out_of_the_dir(start_server, tmp_path):
    d = tmp_path / "ck"
    s = start_server(TRAIN + ["--checkpoint.dir", str(d)])
    assert post_json(s, "/v1/checkpoint/save").status_code == 200
    train(s, np.random.default_rng(2), 2)
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(get_ckpt(s))
    (d / "ckpt-9999999999.safetensors").symlink_to(outside)
    saved = model_step(s)
    r = post_json(s, "/v1/checkpoint/load")
    assert r.status_code == 200, r.text
    assert r.json()["path"].endswith("ckpt-0000000000.safetensors") and r.json()["step"] == 0
    assert model_step(s) == 0 != saved
    s.stop()
    s = start_server(TRAIN + ["--checkpoint.dir", str(d), "--checkpoint.resume", "true",
                              "--checkpoint.on_shutdown", "false"])
    assert model_step(s) == 0
    assert "symbolic link" in s.stderr()


def test_resume_if_compatible_skips_another_models_checkpoint_loudly(start_server, tmp_path):
    d = tmp_path / "ck"
    s = start_server(TRAIN + ["--checkpoint.dir", str(d)])
    train(s, np.random.default_rng(3), 2)
    assert post_json(s, "/v1/checkpoint/save").status_code == 200
    s.stop()
    other = ('{"input": [3, 32, 32], "classes": 10, "layers": [{"type": "conv2d", "out": 4, "k": 1},'
             ' {"type": "relu"}, {"type": "flatten"}, {"type": "linear", "out": 10}]}')
    args = ["--pipeline.backend", "ref", "--model.spec", other, "--augment.pipeline", AUG,
            "--checkpoint.dir", str(d), "--checkpoint.on_shutdown", "false"]
    # true keeps its meaning: another model's file stops the start.
    p = run_start(args + ["--checkpoint.resume", "true"])
    assert p.returncode == 1 and "another model" in p.stderr, p.stderr
    s = start_server(*args, "--checkpoint.resume", "if_compatible")
    assert model_step(s) == 0
    err = s.stderr()
    assert "if_compatible: SKIPPING" in err and "ckpt-0000000002.safetensors" in err, err
    assert s.config()["checkpoint"]["resume"] == "if_compatible"
    s.stop()
    # The skipped file is still there for the model that wrote it.
    assert 2 in ckpt_files(d)
