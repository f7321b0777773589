"""The Python client's own cost: streamfeed.feed() from batches already in
memory against streamfeed-load (C, libcurl) on the same server, same shapes,
same connections, in the same run, repeated in alternation. The ratio
feed/load is the figure; absolute rates depend on the machine.

    python3 bench/client_feed.py                                   # sink mode, W1 shapes, 4 and 8 connections
    python3 bench/client_feed.py --mode train --server-args "--model.preset seed-classifier"   # GPU host
    python3 bench/client_feed.py --url http://gpu-box:8080        # a server already running

By default it starts build/streamfeed in sink mode (pipeline.mode=sink:
batches are received into the ring and discarded), which isolates the upload
path the client is responsible for. It prints one line per run and a JSON
record (--json FILE) with every run, the machine and the commit.
"""
import argparse
import json
import os
import platform
import re
import signal
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python"))
from streamfeed import Client  # noqa: E402

SHAPES = {"w1": (256, 256, 3), "tiny": (32, 32, 3)}


def start_server(binary, args):
    p = subprocess.Popen([binary, "--http.port", "0", "--http.host", "127.0.0.1", "--log.requests", "false",
                          *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        p.kill()
        sys.exit(f"server did not start: {line!r}")
    return p, m.group(1)


def steps(url):
    text = Client(url).metrics()
    for line in text.splitlines():
        if line.startswith('streamfeed_batches_received_total{status="accepted"}'):
            return float(line.split()[-1])
    return 0.0


def run_load(load, url, workload, batch, connections, batches):
    t0 = time.monotonic()
    p = subprocess.run([load, "--url", url, "--workload", workload, "--batch", str(batch), "--connections",
                        str(connections), "--batches", str(batches), "--quiet", "--json"],
                       capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"streamfeed-load failed: {p.stderr[-2000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    # streamfeed-load's own figure (its clock starts after the bodies are
    # generated), so neither side pays for making its data.
    rate = out.get("batches_per_s") or out.get("batches_per_second")
    return float(rate) if rate else batches / wall, out


def run_feed(url, data, connections, batches):
    client = Client(url)
    items = (data[i % len(data)] for i in range(batches))
    summary = client.feed(items, connections=connections, wait_last=False, progress=False)
    if not summary.ok:
        sys.exit(f"feed failed: {summary}")
    client.close()
    return summary.batches / summary.seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "build" / "streamfeed"))
    ap.add_argument("--load", default=str(REPO / "build" / "streamfeed-load"))
    ap.add_argument("--url", help="a running server (default: start --bin)")
    ap.add_argument("--mode", default="sink", choices=["sink", "train"])
    ap.add_argument("--server-args", default="", help="extra server flags")
    ap.add_argument("--workload", default="w1", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--connections", default="4,8")
    ap.add_argument("--batches", type=int, default=400, help="per run")
    ap.add_argument("--rounds", type=int, default=3, help="alternating load/feed rounds; the best of each counts")
    ap.add_argument("--json", help="write the record here")
    a = ap.parse_args()

    h, w, c = SHAPES[a.workload]
    rng = np.random.default_rng(1)
    # As streamfeed-load does (--pool 8): a few distinct bodies, cycled.
    data = [(rng.integers(0, 256, (a.batch, h, w, c), dtype=np.uint8), rng.integers(0, 10, a.batch))
            for _ in range(8)]
    proc = None
    url = a.url
    if not url:
        slot = max(8 << 20, a.batch * h * w * c + (1 << 20))
        args = ["--pipeline.mode", a.mode, "--ring.slot_bytes", str(slot), "--ring.slots", "16",
                *shlex.split(a.server_args)]
        proc, url = start_server(a.bin, args)
    record = {"workload": a.workload, "batch": a.batch, "mode": a.mode, "url": url, "runs": [],
              "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
              "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                       text=True).stdout.strip(),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        run_feed(url, data, 2, 16)  # warm-up: connections, the server's first slots
        for conns in [int(x) for x in a.connections.split(",")]:
            best_load = best_feed = 0.0
            for r in range(a.rounds):
                load_rate, _ = run_load(a.load, url, a.workload, a.batch, conns, a.batches)
                feed_rate = run_feed(url, data, conns, a.batches)
                best_load, best_feed = max(best_load, load_rate), max(best_feed, feed_rate)
                print(f"connections {conns} round {r + 1}: streamfeed-load {load_rate:8.1f} batches/s   "
                      f"feed() {feed_rate:8.1f} batches/s   ratio {feed_rate / load_rate:.2f}", flush=True)
                record["runs"].append({"connections": conns, "round": r + 1, "load_batches_per_s": load_rate,
                                       "feed_batches_per_s": feed_rate})
            print(f"connections {conns} best: streamfeed-load {best_load:.1f}, feed() {best_feed:.1f} "
                  f"batches/s: feed/load = {best_feed / best_load:.2f}", flush=True)
            record.setdefault("best", []).append({"connections": conns, "load": best_load, "feed": best_feed,
                                                  "ratio": best_feed / best_load})
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    if a.json:
        Path(a.json).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
