"""Helpers of the integration suite (its fixtures are in conftest.py): a real
streamfeed process and a small HTTP client for it, waiting on conditions,
Prometheus text parsing, and safetensors bodies (valid ones from
safetensors.numpy.save, and hand-crafted broken ones). A module of its own
name, so that test files import it unambiguously even when pytest collects
other directories that have a conftest.py too.

Every server is started on port 0 and the bound port is read from the line
``streamfeed listening on http(s)://HOST:PORT`` it prints on stdout once ready.
Nothing here sleeps for a fixed time: waits poll a condition until it holds or
a deadline passes.

Environment:
    STREAMFEED_BIN   the server binary (default build/streamfeed)
    STREAMFEED_LOAD  the load generator (default build/streamfeed-load)
"""
import io
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from PIL import Image
from safetensors.numpy import save as st_save

REPO = Path(__file__).resolve().parents[2]
BIN = os.environ.get("STREAMFEED_BIN", str(REPO / "build" / "streamfeed"))
LOAD_BIN = os.environ.get("STREAMFEED_LOAD", str(REPO / "build" / "streamfeed-load"))

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0

# Flags that give a small, fast server on the CPU reference backend: the tiny
# model (32x32x3 in, 10 classes) and no augmentation (uint8 -> float only).
TINY = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", "[]"]
SINK = ["--pipeline.mode", "sink"]

SAFETENSORS = "application/vnd.safetensors"

# A log line at level error ("<ts> error <msg>" or {"level":"error"}), or any
# sanitizer report, fails the test that started the server.
_BAD_STDERR = re.compile(
    r"^\S+ error |\"level\":\"error\"|\bERROR\b|AddressSanitizer|LeakSanitizer|"
    r"ThreadSanitizer|UndefinedBehaviorSanitizer|runtime error:",
    re.MULTILINE,
)


# Whether the binary under test is built with AddressSanitizer (`make sanitize-test`).
def built_with_asan():
    try:
        return b"__asan_init" in Path(BIN).read_bytes()
    except OSError:
        return False


# How many times longer the server's own work takes under AddressSanitizer
# and UBSan than in the release build (measured on the reference backend's
# tiny model: a 256-sample evaluation batch 6-7x, a training step 5-6x, on
# a loaded 2-core machine). A test whose deadline is a server option sized
# to that work (distributed.timeout_s, say) multiplies it by this, so that
# the sanitizer run checks the same behaviour rather than the machine's speed.
SLOWDOWN = 6 if built_with_asan() else 1


# For a test that measures the server's RSS: under AddressSanitizer
# (`make sanitize-test`) freed memory would otherwise wait in its quarantine
# (up to 256 MB) instead of being reused. Without ASan the variable does nothing.
NO_ASAN_QUARANTINE = {"ASAN_OPTIONS": ":".join(
    filter(None, [os.environ.get("ASAN_OPTIONS", ""), "quarantine_size_mb=0"]))}


# ---- waiting -----------------------------------------------------------------


def wait_until(cond, timeout=10.0, interval=0.005, what=None):
    """Polls cond() until it returns something other than None or False (or
    another falsy value), and returns that. Fails the test with `what` (or
    cond's name) when timeout seconds pass first. Note that a requests
    Response is falsy for 4xx/5xx: return a status code or a tuple instead."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or getattr(cond, '__name__', cond)}")
        time.sleep(interval)


# ---- Prometheus text ---------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def _unescape(v):
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "\\": "\\", '"': '"'}.get(m.group(1), m.group(0)), v)


def parse_metrics(text):
    """Prometheus text format 0.0.4 -> {(name, frozenset({(label, value)})): float}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"unparsable metrics line: {line!r}"
        name, _, labels, value = m.group(1), m.group(2), m.group(3), m.group(4)
        lab = {}
        pos = 0
        while labels and pos < len(labels):
            lm = _LABEL.match(labels, pos)
            assert lm, f"unparsable labels in: {line!r}"
            lab[lm.group(1)] = _unescape(lm.group(2))
            pos = lm.end()
        out[(name, frozenset(lab.items()))] = float(value)
    return out


def key(name, **labels):
    return (name, frozenset(labels.items()))


# ---- safetensors bodies --------------------------------------------------------


def st_body(images, labels=None, layout=None):
    """A valid body written by the format's reference implementation."""
    tensors = {"images": np.ascontiguousarray(images)}
    if labels is not None:
        tensors["labels"] = np.ascontiguousarray(labels)
    return st_save(tensors, metadata={"layout": layout} if layout else None)


def raw_body(header, data=b"", header_len=None, pad=True):
    """A hand-made body: 8-byte little-endian length, header, data.

    header: a dict (dumped as JSON), str or bytes. header_len overrides the
    length field (to lie about it). pad adds spaces to a multiple of 8 bytes,
    as the reference writer does."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode()
    if pad and len(header) % 8:
        header += b" " * (8 - len(header) % 8)
    n = len(header) if header_len is None else header_len
    return struct.pack("<Q", n) + header + data


def tensor_header(n=2, h=32, w=32, c=3, label_dtype="I64", images_first=True, **override):
    """The header dict of an images+labels body with the data laid back to
    back; override replaces or adds top-level entries (None removes one)."""
    img_bytes = n * h * w * c
    lab_size = {"I64": 8, "I32": 4, "U8": 1}.get(label_dtype, 8)
    lab_bytes = n * lab_size
    if images_first:
        img_off, lab_off = [0, img_bytes], [img_bytes, img_bytes + lab_bytes]
    else:
        lab_off, img_off = [0, lab_bytes], [lab_bytes, lab_bytes + img_bytes]
    hdr = {
        "images": {"dtype": "U8", "shape": [n, h, w, c], "data_offsets": img_off},
        "labels": {"dtype": label_dtype, "shape": [n], "data_offsets": lab_off},
    }
    for k, v in override.items():
        if v is None:
            hdr.pop(k, None)
        else:
            hdr[k] = v
    return hdr, img_bytes + lab_bytes


# ---- learnable synthetic data for the tiny model ------------------------------

GRID_ROWS, GRID_COLS, CELL = 3, 4, 8  # 10 classes on a 3x4 grid of 8x8 cells of a 32x32 image


def learnable_batch(rng, n=32, noise=20, bright=100):
    """Images [n,32,32,3] uint8 of low-amplitude noise in [0, noise) with a
    bright 6x6 square in grid cell k (row-major over a 3x4 grid of 8x8 cells)
    for class k; labels int64 [n]. Position alone decides the class: with
    --augment.pipeline '[]' (raw 0..255 floats), SGD lr 0.05 and momentum 0.9
    the tiny model halves its loss within about ten steps of 32 samples.
    (Brighter squares make the first steps large enough to kill ReLUs.)"""
    labels = rng.integers(0, 10, n)
    images = rng.integers(0, noise, (n, 32, 32, 3), dtype=np.uint8)
    for i, k in enumerate(labels):
        r, c = divmod(int(k), GRID_COLS)
        images[i, r * CELL + 2:(r + 1) * CELL, c * CELL + 2:(c + 1) * CELL, :] = bright
    return images, labels.astype(np.int64)


def to_jpeg(img, quality=90, subsampling=2, progressive=False):
    """One HxWx3 (or HxW gray) uint8 image as JPEG bytes (Pillow; subsampling 2 is 4:2:0)."""
    out = io.BytesIO()
    Image.fromarray(img).save(out, format="JPEG", quality=quality, subsampling=subsampling,
                              progressive=progressive)
    return out.getvalue()


def jpeg_body(files, labels):
    offsets = np.zeros(len(files) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(f) for f in files])
    return st_save({"jpeg": np.frombuffer(b"".join(files), dtype=np.uint8), "jpeg_offsets": offsets,
                    "labels": np.asarray(labels, dtype=np.int64)})


def learnable_jpeg_batch(rng, n=32):
    images, labels = learnable_batch(rng, n)
    return [to_jpeg(im) for im in images], labels


def colour_batch(rng, n=16):
    """Images [n,8,8,3] uint8 for the 4-class models on 8x8 inputs: noise in
    [0, 100), with channel k brightened by 100 for classes k < 3 (class 3
    stays dark); labels uint8 [n]."""
    labels = rng.integers(0, 4, size=n, dtype=np.uint8)
    images = rng.integers(0, 100, size=(n, 8, 8, 3)).astype(np.uint8)
    for i, q in enumerate(labels):
        if q < 3:
            images[i, :, :, q] += 100
    return images, labels


def random_batch(rng, n=4, h=32, w=32, c=3):
    images = rng.integers(0, 256, (n, h, w, c), dtype=np.uint8)
    labels = rng.integers(0, 10, n).astype(np.int64)
    return images, labels


# ---- raw HTTP replies ----------------------------------------------------------------


def _content_length(data):
    m = re.search(rb"Content-Length: (\d+)", data, re.I)
    return int(m.group(1)) if m else 0


class RawReply:
    """The parts of an HTTP reply read from a raw socket that the tests use
    (the same names as a requests Response)."""

    def __init__(self, raw):
        assert raw, "the connection closed without a reply"
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        self.status_code = int(lines[0].split()[1])
        self.headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        self.text = body.decode()

    def json(self):
        return json.loads(self.text)


def read_reply(sock):
    """Reads one HTTP reply (with a Content-Length) from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _content_length(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return RawReply(data)


# ---- the server ------------------------------------------------------------------


def post_unread(port, path, body, n):
    """n connections each POST body to path and read only their reply's
    status line, the rest left on the server (a small receive buffer, so
    that the reply's bytes stay there): what clients that never read their
    transform or logits replies hold. Returns the open sockets (close them
    to drop the replies) and the statuses, in connection order."""
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/vnd.safetensors\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    conns = []
    for _ in range(n):
        k = socket.socket()
        k.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
        k.settimeout(120)
        k.connect(("127.0.0.1", port))
        k.sendall(head + body)
        conns.append(k)
    statuses = []
    for k in conns:
        line = b""
        while not line.endswith(b"\r\n"):
            line += k.recv(1)
        statuses.append(int(line.split()[1]))
    return conns, statuses


def free_port():
    """A TCP port free right now (for options that cannot take 0, such as
    http.metrics_port, where 0 means off)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One running streamfeed process and a client for it. verify: the CA
    file for an HTTPS server (requests' verify=)."""

    def __init__(self, args, env=None, log_dir=None, name="streamfeed", verify=None):
        self.args = [BIN, "--http.port", "0", "--http.host", "127.0.0.1"] + list(args)
        # The test's own STREAMFEED_* variables only: an option set in the
        # environment of the test runner must not leak into the server, and
        # the runner's own (STREAMFEED_BIN) would be warned about as unknown.
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMFEED_")}
        full_env.update(env or {})
        self.stderr_path = Path(log_dir or "/tmp") / f"{name}-{os.getpid()}-{id(self)}.stderr"
        self._stderr = open(self.stderr_path, "w+b")
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self._stderr,
                                     stdin=subprocess.DEVNULL, env=full_env)
        self.stopped = False
        self._last_stderr = ""
        line = self._read_line(START_TIMEOUT_S)
        m = re.search(r"streamfeed listening on (https?)://(?:\[[^\]]*\]|[^:\s/\[]+):(\d+)", line)
        if not m:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"no listening line from {self.args}: stdout={line!r}, "
                                 f"stderr={self.stderr()!r}")
        self.port = int(m.group(2))
        self.url = f"{m.group(1)}://127.0.0.1:{self.port}"
        self.http = requests.Session()
        # Passed with each request: a session's verify loses to REQUESTS_CA_BUNDLE.
        self.verify = verify

    def _read_line(self, timeout):
        fd = self.proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + timeout
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
        return buf.decode(errors="replace")

    # -- plain HTTP --
    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def request(self, method, path, **kw):
        kw.setdefault("timeout", 30 * SLOWDOWN)
        if self.verify is not None:
            kw.setdefault("verify", self.verify)
        return self.http.request(method, self.url + path, **kw)

    def patch_config(self, patch, headers=None, **kw):
        h = {"Content-Type": "application/merge-patch+json"}
        h.update(headers or {})
        data = patch if isinstance(patch, (bytes, str)) else json.dumps(patch)
        return self.request("PATCH", "/v1/config", data=data, headers=h, **kw)

    def config(self):
        r = self.get("/v1/config")
        assert r.status_code == 200, r.text
        return r.json()["config"]

    # -- batches --
    def post_batch(self, body, wait=False, content_type=SAFETENSORS, headers=None, path="/v1/batches", **kw):
        h = {"Content-Type": content_type} if content_type else {}
        h.update(headers or {})
        return self.request("POST", path + ("?wait=1" if wait else ""), data=body, headers=h, **kw)

    def post_arrays(self, images, labels=None, wait=False, **kw):
        return self.post_batch(st_body(images, labels), wait=wait, **kw)

    def batch(self, bid):
        r = self.get(f"/v1/batches/{bid}")
        assert r.status_code == 200, r.text
        return r.json()

    def wait_batch(self, bid, states=("done", "failed"), timeout=30.0 * SLOWDOWN):
        return wait_until(lambda: (lambda b: b if b["state"] in states else None)(self.batch(bid)),
                          timeout, interval=0.01, what=f"batch {bid} to reach {states}")

    # -- metrics --
    def metrics_text(self):
        r = self.get("/metrics")
        assert r.status_code == 200, r.text
        return r.text

    def metrics(self):
        return parse_metrics(self.metrics_text())

    def metric(self, name, **labels):
        return self.metrics().get(key(name, **labels), 0.0)

    # -- raw sockets (partial uploads, oversize headers) --
    def connect(self, timeout=30.0):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def start_upload(self, body, send_bytes, path="/v1/batches", content_type=SAFETENSORS,
                     expect_continue=False, headers=""):
        """Opens a connection, sends the request head with the full
        Content-Length (and `headers`, more header lines each ending in
        CRLF) and only the first send_bytes of the body.

        With expect_continue, the head carries "Expect: 100-continue" and the
        body bytes go only after the server's "100 Continue", which proves the
        request head was parsed and the request exists on the server."""
        s = self.connect()
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n" + headers
                + ("Expect: 100-continue\r\n" if expect_continue else "")
                + "Connection: close\r\n\r\n").encode()
        if expect_continue:
            s.sendall(head)
            interim = b""
            while b"\r\n\r\n" not in interim:
                chunk = s.recv(1)
                assert chunk, "the connection closed before 100 Continue"
                interim += chunk
            assert interim.startswith(b"HTTP/1.1 100"), interim
            if send_bytes:
                s.sendall(body[:send_bytes])
        else:
            s.sendall(head + body[:send_bytes])
        return s

    @staticmethod
    def reset(sock):
        """Closes a raw connection with a TCP reset (SO_LINGER 0), which the
        server sees at once; a plain close right after sending may leave a FIN
        that arrives with the data and goes unnoticed until the idle timeout."""
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()

    # -- lifecycle --
    def stderr(self):
        if not self._stderr.closed:
            self._stderr.flush()
        try:
            return self.stderr_path.read_bytes().decode(errors="replace")
        except OSError:
            return self._last_stderr

    def alive(self):
        return self.proc.poll() is None

    def terminate(self, timeout=STOP_TIMEOUT_S):
        """SIGTERM, then the exit status (None if it did not exit in time)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, check=True):
        if self.stopped:
            return
        self.stopped = True
        self.http.close()
        rc = self.terminate()
        if rc is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        err = self._last_stderr = self.stderr()
        self._stderr.close()
        if check:
            assert rc == 0, f"streamfeed exited with {rc} after SIGTERM; stderr:\n{err[-4000:]}"
            bad = _BAD_STDERR.search(err)
            assert not bad, f"stderr has an error report ({bad.group(0)!r}):\n{err[-4000:]}"
        try:
            self.stderr_path.unlink()
        except OSError:
            pass


class ServerFactory:
    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.servers = []

    def __call__(self, *args, env=None, verify=None):
        flat = []
        for a in args:
            flat.extend(a if isinstance(a, (list, tuple)) else [a])
        s = Server([str(x) for x in flat], env=env, log_dir=self.log_dir, verify=verify)
        self.servers.append(s)
        return s

    def stop_all(self):
        errors = []
        for s in self.servers:
            try:
                s.stop()
            except AssertionError as e:  # stop every server, then report
                errors.append(str(e))
        self.servers.clear()
        if errors:
            pytest.fail("\n\n".join(errors))
