"""Turns a bench/run.sh output folder into one JSON summary and a markdown table.

    python3 bench/report.py build/bench-out > report.md   (also writes summary.json there)
"""
import glob
import json
import os
import re
import sys


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def jload(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    d = sys.argv[1]
    s = {"gpu": read(os.path.join(d, "gpu.txt")), "commit": read(os.path.join(d, "commit.txt")),
         "date": read(os.path.join(d, "date.txt")), "w1_cached": {}, "augment": {}, "http": {},
         "ingest": {}, "memcpy": {}, "loopback": {}, "pytorch": {}}
    for line in read(os.path.join(d, "w1_cached.txt")).splitlines():
        m = re.search(r"batch=(\d+) precision=(\w+) layout=(\w+) graphs=(\d) momentum=([\d.e+-]+)"
                      r"(?: fork=(\d) fuse=(\d))?: ([\d.]+) steps/s", line)
        if m:
            # The executor's default switches keep the plain key (the headline
            # figure); a variant names what it changed.
            key = f"b{m[1]}_{m[2]}_{m[3]}_graphs{m[4]}"
            key += "" if float(m[5]) == 0 else f"_momentum{m[5]}"
            key += "" if m[6] in (None, "1") else "_nofork"
            key += "" if m[7] in (None, "1") else "_nofuse"
            s["w1_cached"][key] = float(m[8])
    for line in read(os.path.join(d, "augment.txt")).splitlines():
        if line.startswith("{"):
            j = json.loads(line)
            s["augment"][j["config"]] = j
    for line in read(os.path.join(d, "memcpy.jsonl")).splitlines():
        if line.startswith("{"):
            j = json.loads(line)
            s["memcpy"][j["threads"]] = j["gb_per_s"]
    for line in read(os.path.join(d, "loopback.jsonl")).splitlines():
        if line.startswith("{"):
            j = json.loads(line)
            s["loopback"][j["flows"]] = j["gb_per_s"]
    for f in glob.glob(os.path.join(d, "w1_*_http*.json")):
        j = jload(f)
        if j and j.get("steps_per_s") is not None:  # a failed run has no figure
            s["http"][j["label"]] = j["steps_per_s"]
    for f in glob.glob(os.path.join(d, "ingest_c*.json")):
        j = jload(f)
        if j and j.get("steps_per_s") is not None:
            s["ingest"][j["label"]] = {"gb_per_s": j["ingest_gb_per_s"], "batches_per_s": j["steps_per_s"]}
    pt = jload(os.path.join(d, "pytorch_w1_b32.json"))
    if pt:
        s["pytorch"] = pt["steps_per_s"]
        s["torch"] = pt.get("torch")
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(s, f, indent=1)

    out = [f"# Benchmarks — {s['gpu']}, commit {s['commit']}, {s['date']}", ""]
    cached = s["w1_cached"].get("b32_tf32_nhwc_graphs1")
    http = s["http"].get("w1_b32_http")
    pt = s["pytorch"]
    best_model = max([v for k, v in pt.items() if k.startswith("cached") or k == "compile"], default=None)
    best_e2e = max([v for k, v in pt.items() if k.startswith("gpu_aug")], default=None)
    out += ["## W1, batch 32 (steps/s; TF32 convolutions on both sides)", "",
            "| what | steps/s | ratio |", "| --- | ---: | --- |"]
    if cached:
        out.append(f"| streamfeed, device-cached step (model upper bound) | {cached:.1f} | 1.00 |")
    for k, v in sorted(s["http"].items()):
        r = f"{v / cached:.2f}x of cached" if cached else ""
        out.append(f"| streamfeed `{k}` (loader → HTTP → ring → H2D → augment → step) | {v:.1f} | {r} |")
    for k, v in sorted(pt.items()):
        out.append(f"| PyTorch `{k}` | {v:.1f} | |")
    out.append("")
    if cached and best_model:
        out.append(f"- streamfeed device-cached / PyTorch best model-only: **{cached / best_model:.2f}x**")
    if http and best_e2e:
        out.append(f"- streamfeed over HTTP / PyTorch best end-to-end: **{http / best_e2e:.2f}x**")
    if http and best_model:
        out.append(f"- streamfeed over HTTP / PyTorch best model-only (a batch already on the GPU): **{http / best_model:.2f}x**")
    out.append("")
    if s["w1_cached"]:
        out += ["## streamfeed device-cached step, variants", "", "| variant | steps/s |", "| --- | ---: |"]
        out += [f"| {k} | {v:.1f} |" for k, v in s["w1_cached"].items()]
        out.append("")
    if s["augment"]:
        out += ["## Augmentation alone (batch 32, 256x256x3)", "",
                "| config | µs/batch | images/s | GB/s | x memory bound |", "| --- | ---: | ---: | ---: | ---: |"]
        for k, j in s["augment"].items():
            out.append(f"| {k} | {j['median_us']:.1f} | {j['images_per_s']:.0f} | {j['achieved_gbps']:.0f} | {j['x_of_bound']:.2f} |")
        out.append(f"\nDevice-to-device copy bandwidth measured in the same run: {next(iter(s['augment'].values()))['copy_gbps']:.0f} GB/s.")
        out.append("")
    if s["ingest"]:
        out += ["## Ingest only (sink mode, W1 batch-32 bodies of 6.3 MB, loopback)", "",
                "| connections | GB/s | batches/s |", "| --- | ---: | ---: |"]
        for k in sorted(s["ingest"], key=lambda x: int(x.split("_c")[1])):
            v = s["ingest"][k]
            out.append(f"| {k.split('_c')[1]} | {v['gb_per_s']:.2f} | {v['batches_per_s']:.0f} |")
        out.append("")
        if s["memcpy"]:
            out.append("Ceiling, plain memcpy of the same bodies: " + ", ".join(
                f"{t} thread(s) {g:.1f} GB/s" for t, g in sorted(s["memcpy"].items(), key=lambda x: int(x[0]))))
        if s["loopback"]:
            out.append("\nCeiling, raw TCP over loopback (bench/loopback_bw: one copy each side, no HTTP): " + ", ".join(
                f"{t} connection(s) {g:.1f} GB/s" for t, g in sorted(s["loopback"].items(), key=lambda x: int(x[0]))))
    print("\n".join(out))


if __name__ == "__main__":
    main()
