"""Drives a running-or-started streamfeed with streamfeed-load and measures the
service's own trained rate from /metrics (steps_total and samples over a
steady window), not the loader's send rate.

    python3 bench/ingest_e2e.py --bin build/streamfeed --load build/streamfeed-load \
        --server-args "--model.preset seed-classifier" --load-args "--workload w1 --batch 32 --connections 8" \
        --batches 600 --label w1_e2e --json out.json
"""
import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    return total if found else None


def by_label(url, name, label):
    """{label value: sample} of one labelled family (e.g. the JPEG batches per decoder)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(name + r'\{.*' + label + r'="([^"]*)".*\} (\S+)$', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def stages(url):
    """Mean seconds per batch of each stage histogram over the whole run (on
    CUDA the h2d stage holds a JPEG batch's decode, between the same events)."""
    out = {}
    for st in ("queue_wait", "h2d", "transform", "step"):
        n = metric(url, f"streamfeed_{st}_seconds_count")
        t = metric(url, f"streamfeed_{st}_seconds_sum")
        if n:
            out[st + "_ms"] = 1e3 * t / n
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/streamfeed")
    ap.add_argument("--load", default="build/streamfeed-load")
    ap.add_argument("--server-args", default="")
    ap.add_argument("--load-args", default="")
    ap.add_argument("--batches", type=int, default=600)
    ap.add_argument("--warmup-steps", type=int, default=30)
    ap.add_argument("--label", default="run")
    ap.add_argument("--json")
    a = ap.parse_args()

    srv = subprocess.Popen([a.bin, "--http.port", "0", "--log.requests", "false"] + shlex.split(a.server_args),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = srv.stdout.readline()
    m = re.search(r":(\d+)$", line.strip())
    if not m:
        print(srv.stderr.read(), file=sys.stderr)
        raise SystemExit("server did not start")
    url = f"http://127.0.0.1:{m.group(1)}"
    load = subprocess.Popen([a.load, "--url", url, "--batches", str(a.batches), "--json", "--quiet"]
                            + shlex.split(a.load_args), stdout=subprocess.PIPE, text=True)
    # Steady window: from warmup_steps finished batches until 90% of them
    # finished (a finished batch is a trained step, or a sunk batch in sink mode).
    fin = "streamfeed_batches_finished_total"
    byt = "streamfeed_received_bytes_total"
    t0 = s0 = b0 = None
    while True:
        s = metric(url, fin) or 0
        now = time.perf_counter()
        if t0 is None and s >= a.warmup_steps:
            t0, s0, b0 = now, s, metric(url, byt)
        if t0 is not None and s >= 0.9 * a.batches:
            t1, s1, b1 = now, s, metric(url, byt)
            break
        if load.poll() is not None:
            t1, s1, b1 = now, s, metric(url, byt)
            break
        time.sleep(0.01)
    out, _ = load.communicate(timeout=600)
    # What ran: the decoder of each JPEG batch (the choice is per batch), the
    # host time spent issuing decodes, and the mean stage times.
    decoders = by_label(url, "streamfeed_jpeg_batches_total", "decoder")
    decode_host = by_label(url, "streamfeed_jpeg_decode_host_seconds_total", "decoder")
    stage_ms = stages(url)
    srv.send_signal(signal.SIGTERM)
    srv.wait(timeout=60)
    summary = json.loads(out) if out.strip() else {}
    ok = t0 is not None and t1 > t0
    steps_per_s = (s1 - s0) / (t1 - t0) if ok else 0.0
    gb_per_s = (b1 - b0) / (t1 - t0) / 1e9 if ok else 0.0
    res = {"label": a.label, "steps_per_s": steps_per_s, "ingest_gb_per_s": gb_per_s,
           "window_batches": (s1 - s0) if ok else 0, "loader": summary,
           "jpeg_decoders": decoders,
           "jpeg_decode_host_ms_per_batch": {k: 1e3 * v / decoders[k] for k, v in decode_host.items()
                                             if decoders.get(k)},
           "stage_ms": stage_ms,
           "server_args": a.server_args, "load_args": a.load_args}
    print(f"streamfeed {a.label}: {steps_per_s:.1f} batches/s finished, {gb_per_s:.2f} GB/s ingested "
          f"(loader {summary.get('mb_per_s', 0):.0f} MB/s, {summary.get('errors', {})} errors)", flush=True)
    if decoders:
        print(f"  jpeg batches per decoder {res['jpeg_decoders']}, host ms per batch "
              f"{ {k: round(v, 3) for k, v in res['jpeg_decode_host_ms_per_batch'].items()} }", flush=True)
    print(f"  mean stage ms { {k: round(v, 3) for k, v in stage_ms.items()} }", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
