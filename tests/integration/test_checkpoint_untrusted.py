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
