"""Ingest on one and on eight connections next to its two ceilings, in one run:
plain memcpy of the same bodies (bench/memcpy_bw, 1 and 8 threads) and raw
TCP over loopback with one copy on each side (bench/loopback_bw, 1 and 8
connections). The service runs in sink mode (batches are received into the
ring and discarded), fed W1 batch-32 bodies (6.3 MB) by streamfeed-load over
loopback, measured by bench/ingest_e2e.py from the server's own byte counter.
The four measurements alternate for --rounds rounds and each figure is the
median of its rounds, so the ratios come from one run on one machine.

    make CUDA=0 build/streamfeed build/streamfeed-load bench-bins   # or plain make on a GPU host
    python3 bench/ingest_ceiling.py --json build/bench-out/ingest_ceiling.json

The marks (WORKLOADS.md): one connection >= 0.8x single-thread memcpy, eight
connections >= 10 GB/s. On loopback both ends share the host's cores and the
sender's CPU also runs the receiving side's TCP input, so loopback_bw is the
most one connection can carry here whatever the service does.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVER_ARGS = "--pipeline.mode sink --ring.slots 32 --http.threads 8"


def run_json(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(p.stdout.strip().splitlines()[-1])


def ingest(a, connections, tmp):
    out = os.path.join(tmp, f"ingest_c{connections}.json")
    subprocess.run([sys.executable, str(REPO / "bench" / "ingest_e2e.py"), "--bin", a.bin, "--load", a.load,
                    "--server-args", SERVER_ARGS,
                    "--load-args", f"--workload w1 --batch 32 --connections {connections} --pool 16",
                    "--batches", str(a.batches), "--label", f"ingest_c{connections}", "--json", out],
                   check=True, stdout=subprocess.DEVNULL, timeout=1200)
    with open(out) as f:
        return json.load(f)["ingest_gb_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(REPO / "build" / "streamfeed"))
    ap.add_argument("--load", default=str(REPO / "build" / "streamfeed-load"))
    ap.add_argument("--bench-dir", default=str(REPO / "build" / "bench"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=2000, help="bodies per ingest measurement")
    ap.add_argument("--json", help="write every round and the medians here")
    a = ap.parse_args()

    memcpy = os.path.join(a.bench_dir, "memcpy_bw")
    loopback = os.path.join(a.bench_dir, "loopback_bw")
    series = {k: [] for k in ("memcpy_1", "memcpy_8", "loopback_1", "loopback_8", "ingest_1", "ingest_8")}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            series["memcpy_1"].append(run_json([memcpy, "1", "400"])["gb_per_s"])
            series["memcpy_8"].append(run_json([memcpy, "8", "100"])["gb_per_s"])
            series["loopback_1"].append(run_json([loopback, "1", "400"])["gb_per_s"])
            series["loopback_8"].append(run_json([loopback, "8", "100"])["gb_per_s"])
            series["ingest_1"].append(ingest(a, 1, tmp))
            series["ingest_8"].append(ingest(a, 8, tmp))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in series.items()), flush=True)
    med = {k: statistics.median(v) for k, v in series.items()}
    ratios = {
        "ingest_1_over_memcpy_1": med["ingest_1"] / med["memcpy_1"],
        "ingest_1_over_loopback_1": med["ingest_1"] / med["loopback_1"],
        "loopback_1_over_memcpy_1": med["loopback_1"] / med["memcpy_1"],
        "ingest_8_over_loopback_8": med["ingest_8"] / med["loopback_8"],
    }
    print()
    print(f"| GB/s (median of {a.rounds}) | 1 | 8 |")
    print("| --- | ---: | ---: |")
    print(f"| memcpy (threads) | {med['memcpy_1']:.2f} | {med['memcpy_8']:.2f} |")
    print(f"| TCP loopback, raw (connections) | {med['loopback_1']:.2f} | {med['loopback_8']:.2f} |")
    print(f"| streamfeed sink ingest (connections) | {med['ingest_1']:.2f} | {med['ingest_8']:.2f} |")
    print()
    print(f"one connection: {ratios['ingest_1_over_memcpy_1']:.2f}x single-thread memcpy (mark 0.8), "
          f"{ratios['ingest_1_over_loopback_1']:.2f}x raw loopback; raw loopback itself is "
          f"{ratios['loopback_1_over_memcpy_1']:.2f}x memcpy")
    print(f"eight connections: {med['ingest_8']:.2f} GB/s (mark 10), {ratios['ingest_8_over_loopback_8']:.2f}x raw loopback")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        with open(a.json, "w") as f:
            json.dump({"machine": platform.node(), "cpus": os.cpu_count(), "commit": commit, "rounds": series,
                       "median_gb_per_s": med, "ratios": ratios}, f, indent=1)


if __name__ == "__main__":
    main()
