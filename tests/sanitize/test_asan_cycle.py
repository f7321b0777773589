"""A start–requests–stop cycle under AddressSanitizer, LeakSanitizer and UBSan.

`make sanitize-test` builds build/asan/streamfeed with SANITIZE=address,undefined,
runs the whole integration suite against it, then this file with
STREAMFEED_ASAN_BIN pointing at it. Every kind of request —
good batches (trained and waited for), a transform, bad bodies, a body cut
short by a disconnect, config changes, metrics — then SIGTERM: the process must
exit 0 and the sanitizers must report nothing (a leak makes the exit status
non-zero and prints a report).
"""
import os
import re
import signal
import socket
import subprocess

import numpy as np
import pytest
import requests
from safetensors.numpy import save

BIN = os.environ.get("STREAMFEED_ASAN_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="STREAMFEED_ASAN_BIN not set (run make sanitize-test)")


def test_start_requests_stop_cycle_is_clean_under_asan():
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=23")
    p = subprocess.Popen([BIN, "--http.port", "0", "--model.preset", "tiny", "--augment.pipeline",
                          '[{"op":"to_dtype","scale":0.0039}]', "--ring.slots", "2",
                          "--ring.full_timeout_ms", "300"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stdout.readline()
        port = int(re.search(r":(\d+)$", line.strip()).group(1))
        u = f"http://127.0.0.1:{port}"
        rng = np.random.default_rng(1)
        body = save({"images": rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8),
                     "labels": rng.integers(0, 10, 8).astype(np.int64)})
        h = {"Content-Type": "application/vnd.safetensors"}
        for _ in range(4):
            assert requests.post(u + "/v1/batches?wait=1", data=body, headers=h).status_code == 200
        assert requests.post(u + "/v1/batches", data=body, headers=h).status_code == 202
        assert requests.post(u + "/v1/transform", data=body, headers=h).status_code == 200
        assert requests.post(u + "/v1/batches", data=body[:50], headers=h).status_code == 400
        assert requests.post(u + "/v1/batches", data=b"x" * 16, headers=h).status_code in (400, 413)
        assert requests.patch(u + "/v1/config", data="{", headers={"Content-Type": "application/json"}).status_code == 400
        assert requests.patch(u + "/v1/config", json={"optim": {"lr": 0.01}}).status_code == 200
        assert requests.get(u + "/metrics").status_code == 200
        assert requests.get(u + "/nope").status_code == 404
        # A client that goes away mid-upload.
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/vnd.safetensors\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[: len(body) // 2])
        s.close()
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    assert "AddressSanitizer" not in err and "LeakSanitizer" not in err, err[-4000:]
    assert p.returncode == 0, err[-4000:]
