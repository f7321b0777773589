#!/usr/bin/env python3
"""The soak test (`make soak`, not part of `make test`): a real streamfeed (the
tiny model on the CPU reference backend, periodic checkpoints) under N
connections of mixed traffic for a set time, with invariants checked while it
runs and at the end.

Traffic, per connection, chosen at random request by request:
  good batches (some with ?wait=1), bad bodies (each a stable 4xx code),
  slow clients that stay above http.upload_min_bytes_per_s and complete,
  clients too slow for it (evicted: their connection is reset), clients that
  give up mid-upload, config PATCHes of hot options, checkpoint saves, and
  reads (stats, batch states, metrics, model).

Checked:
  - at every sample (every --sample-s, on http.metrics_port):
    accepted = done + failed + pending;
  - zero 5xx replies of any kind;
  - RSS and open file descriptors bounded: the second half's peak no higher
    than the first half's by more than the allowance, and fds under a bound;
  - every evicted upload was one of the too-slow clients;
  - SIGTERM at the end: exit 0 within the grace period, no error line and no
    sanitizer report on stderr.

  python3 tests/soak/soak.py --seconds 600 --connections 32   (STREAMFEED_BIN: the binary)
Exit status 0 when every check held; the summary is printed as JSON.
"""
import argparse
import collections
import json
import os
import random
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from sfharness import (SAFETENSORS, TINY, Server, free_port, key, parse_metrics,  # noqa: E402
                       random_batch, raw_body, st_body, tensor_header)

MIN_RATE = 8192  # http.upload_min_bytes_per_s of the soak server


class Stats:
    def __init__(self):
        self.mu = threading.Lock()
        self.by_kind = collections.defaultdict(collections.Counter)
        self.five_xx = []
        self.unexpected = []

    def count(self, kind, status, detail=""):
        with self.mu:
            self.by_kind[kind][str(status)] += 1
            if isinstance(status, int) and status >= 500:
                self.five_xx.append((kind, status, detail[:300]))

    def odd(self, what):
        with self.mu:
            if len(self.unexpected) < 50:
                self.unexpected.append(what[:300])


def bad_bodies(rng):
    """Bodies each refused with a 4xx: (name, body, content_type)."""
    good = st_body(*random_batch(rng, 2))
    hdr, nbytes = tensor_header(n=2)
    out = [
        ("truncated", good[:len(good) // 2], SAFETENSORS),
        ("not_json", raw_body(b"{not json", b""), SAFETENSORS),
        ("bad_dtype", raw_body(tensor_header(n=2, images={"dtype": "F99", "shape": [2, 32, 32, 3],
                                                          "data_offsets": [0, 6144]})[0], b"\0" * nbytes), SAFETENSORS),
        ("label_out_of_range", st_body(rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8),
                                       np.array([3, 999], dtype=np.int64)), SAFETENSORS),
        ("wrong_shape", st_body(*random_batch(rng, 2, h=17, w=17)), SAFETENSORS),
        ("header_length_lie", struct.pack("<Q", 1 << 40) + b"{}", SAFETENSORS),
        ("content_type", good, "text/plain"),
        ("empty", b"", SAFETENSORS),
    ]
    return out


def read_status(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    return int(data.split(b" ", 2)[1])


def worker(idx, url, port, stop, stats, goods, bads, seed, ids):
    rnd = random.Random(seed)
    http = requests.Session()
    while not stop.is_set():
        x = rnd.random()
        try:
            if x < 0.50:
                wait = rnd.random() < 0.15
                r = http.post(url + "/v1/batches" + ("?wait=1" if wait else ""), data=rnd.choice(goods),
                              headers={"Content-Type": SAFETENSORS}, timeout=120)
                stats.count("good_wait" if wait else "good", r.status_code, r.text)
                if r.status_code in (200, 202):
                    ids.append(r.json()["id"])
                elif r.status_code not in (429,):
                    stats.odd(f"good batch got {r.status_code}: {r.text}")
            elif x < 0.64:
                name, body, ct = rnd.choice(bads)
                r = http.post(url + "/v1/batches", data=body, headers={"Content-Type": ct}, timeout=60)
                stats.count("bad:" + name, r.status_code, r.text)
                if not 400 <= r.status_code < 500:
                    stats.odd(f"bad body {name} got {r.status_code}: {r.text}")
            elif x < 0.70:
                slow_client(port, rnd.choice(goods), rnd, stats, rate=4 * MIN_RATE)
            elif x < 0.71:
                too_slow_client(port, rnd.choice(goods), stats, stop)
            elif x < 0.75:
                abort_client(port, rnd.choice(goods), rnd, stats)
            elif x < 0.80:
                patch = rnd.choice([{"optim": {"lr": round(rnd.uniform(1e-4, 1e-2), 6)}},
                                    {"ring": {"full_timeout_ms": rnd.choice([30000, 60000])}},
                                    {"log": {"requests": rnd.random() < 0.5}},
                                    {"http": {"upload_deadline_s": rnd.choice([120, 300])}}])
                r = http.patch(url + "/v1/config", data=json.dumps(patch),
                               headers={"Content-Type": "application/merge-patch+json"}, timeout=60)
                stats.count("patch", r.status_code, r.text)
                if r.status_code != 200:
                    stats.odd(f"patch {patch} got {r.status_code}: {r.text}")
            elif x < 0.82:
                r = http.post(url + "/v1/checkpoint/save", json={}, timeout=120)
                stats.count("checkpoint_save", r.status_code, r.text)
                if r.status_code != 200:
                    stats.odd(f"checkpoint save got {r.status_code}: {r.text}")
            else:
                path = rnd.choice(["/v1/stats", "/metrics", "/v1/model", "/v1/config",
                                   f"/v1/batches/{ids[-1] if ids else 1}"])
                r = http.get(url + path, timeout=60)
                stats.count("get", r.status_code, r.text)
                if r.status_code != 200 and not path.startswith("/v1/batches/"):
                    stats.odd(f"GET {path} got {r.status_code}")
        except requests.RequestException as e:
            stats.count("client_error", type(e).__name__)
            stats.odd(f"worker {idx}: {e!r}")
            http = requests.Session()


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def head(body):
    return (f"POST /v1/batches HTTP/1.1\r\nHost: soak\r\nContent-Type: {SAFETENSORS}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()


def slow_client(port, body, rnd, stats, rate):
    """Sends at about `rate` bytes/s, above the server's minimum: must complete."""
    try:
        with connect(port) as s:
            s.sendall(head(body))
            step = max(256, rate // 20)
            for i in range(0, len(body), step):
                s.sendall(body[i:i + step])
                time.sleep(step / rate)
            st = read_status(s)
            stats.count("slow", st)
            if st not in (202, 429):
                stats.odd(f"slow client got {st}")
    except OSError as e:
        stats.count("slow", "reset")
        stats.odd(f"slow client was cut: {e!r}")


def too_slow_client(port, body, stats, stop):
    """Takes a slot, then trickles: must be evicted (its connection reset)."""
    try:
        with connect(port) as s:
            s.sendall(head(body) + body[:512])
            for i in range(512, len(body)):
                if stop.is_set():
                    stats.count("too_slow", "stopped")
                    return
                s.sendall(body[i:i + 1])
                time.sleep(0.5)
            st = read_status(s)
            stats.count("too_slow", st)
            stats.odd(f"a too-slow client completed with {st}")
    except OSError:
        stats.count("too_slow", "evicted")


def abort_client(port, body, rnd, stats):
    with connect(port) as s:
        s.sendall(head(body) + body[:rnd.randrange(1, len(body))])
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stats.count("abort", "sent")


def proc_sample(pid):
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    return rss_kb * 1024, len(os.listdir(f"/proc/{pid}/fd"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--sample-s", type=float, default=2.0)
    ap.add_argument("--rss-allowance-mb", type=float, default=48,
                    help="how far the second half's peak RSS may exceed the first half's")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    # Against an ASan build (SOAK_BIN=build/asan/streamfeed): ASan's quarantine
    # of freed memory (256 MiB by default) grows the RSS for minutes and would
    # hide or fake a trend; a small one keeps the RSS check meaningful.
    os.environ.setdefault("ASAN_OPTIONS", "quarantine_size_mb=8:thread_local_quarantine_size_kb=64")

    rng = np.random.default_rng(a.seed)
    goods = [st_body(*random_batch(rng, int(n))) for n in rng.integers(1, 17, 48)]
    bads = bad_bodies(rng)
    tmp = Path(tempfile.mkdtemp(prefix="streamfeed-soak-"))
    mport = free_port()
    grace = 30
    srv = Server(TINY + ["--ring.slots", "8", "--ring.full_timeout_ms", "60000",
                         "--http.max_connections", str(4 * a.connections + 32),
                         "--http.metrics_port", str(mport), "--log.requests", "false",
                         "--http.upload_min_bytes_per_s", str(MIN_RATE),
                         "--checkpoint.dir", str(tmp / "ck"), "--checkpoint.every_steps", "200",
                         "--checkpoint.keep", "2", "--shutdown.grace_s", str(grace)],
                 log_dir=tmp, name="soak")
    probe = f"http://127.0.0.1:{mport}"
    stats, stop, ids = Stats(), threading.Event(), collections.deque(maxlen=1000)
    failures, samples = [], []
    threads = [threading.Thread(target=worker, args=(i, srv.url, srv.port, stop, stats, goods, bads,
                                                     a.seed * 1000 + i, ids), daemon=True)
               for i in range(a.connections)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    try:
        while time.monotonic() - t0 < a.seconds:
            time.sleep(a.sample_s)
            m = parse_metrics(requests.get(probe + "/metrics", timeout=30).text)
            acc = m.get(key("streamfeed_batches_received_total", status="accepted"), 0)
            done = m.get(key("streamfeed_batches_finished_total", status="done"), 0)
            failed = m.get(key("streamfeed_batches_finished_total", status="failed"), 0)
            pending = m.get(key("streamfeed_batches_pending"), 0)
            rss, fds = proc_sample(srv.proc.pid)
            samples.append({"t": round(time.monotonic() - t0, 1), "accepted": acc, "done": done,
                            "failed": failed, "pending": pending, "rss": rss, "fds": fds,
                            "evicted": m.get(key("streamfeed_uploads_evicted_total", reason="upload_too_slow"), 0)})
            if acc != done + failed + pending:
                failures.append(f"t={samples[-1]['t']}: accepted {acc} != done {done} + failed {failed} "
                                f"+ pending {pending}")
            if not srv.alive():
                failures.append("the server died")
                break
    finally:
        stop.set()
        for t in threads:
            t.join(90)
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        failures.append(f"{len(stuck)} client threads did not finish")
    ts = time.monotonic()
    rc = srv.terminate(grace + 10)
    stop_s = time.monotonic() - ts
    err = srv.stderr()
    try:
        srv.stop(check=True)
    except AssertionError as e:
        failures.append(str(e)[:2000])
    if rc != 0:
        failures.append(f"exit status {rc} after SIGTERM")

    if stats.five_xx:
        failures.append(f"{len(stats.five_xx)} 5xx replies, first: {stats.five_xx[:5]}")
    if stats.unexpected:
        failures.append(f"unexpected outcomes: {stats.unexpected[:10]}")
    half = len(samples) // 2
    if half >= 2:
        rss1 = max(s["rss"] for s in samples[:half])
        rss2 = max(s["rss"] for s in samples[half:])
        if rss2 > rss1 + a.rss_allowance_mb * 2**20:
            failures.append(f"RSS grew: first half peak {rss1 / 2**20:.1f} MiB, second {rss2 / 2**20:.1f} MiB")
    max_fds = max((s["fds"] for s in samples), default=0)
    fd_bound = 4 * a.connections + 64
    if max_fds > fd_bound:
        failures.append(f"{max_fds} open fds, above {fd_bound}")
    evicted = samples[-1]["evicted"] if samples else 0
    too_slow = sum(v for k, v in stats.by_kind["too_slow"].items() if k == "evicted")
    if evicted > too_slow + stats.by_kind["too_slow"].get("stopped", 0):
        failures.append(f"{evicted} evictions but only {too_slow} too-slow clients were cut")

    summary = {
        "seconds": round(time.monotonic() - t0, 1), "connections": a.connections,
        "samples": len(samples), "last_sample": samples[-1] if samples else None,
        "rss_mib": [round(min(s["rss"] for s in samples) / 2**20, 1),
                    round(max(s["rss"] for s in samples) / 2**20, 1)] if samples else None,
        "fds": [min(s["fds"] for s in samples), max_fds] if samples else None,
        "stop_seconds": round(stop_s, 2), "exit_status": rc,
        "requests": {k: dict(v) for k, v in sorted(stats.by_kind.items())},
        "failures": failures,
    }
    print(json.dumps(summary, indent=1))
    if "grace period" in err:
        print("note: the final drain hit the grace period", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
