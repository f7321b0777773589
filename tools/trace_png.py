"""Draws a GET /v1/trace reply (Chrome trace-event JSON) as a timeline PNG —
the picture in docs/OBSERVABILITY.md is this script's rendering of a real trace.

    python3 tools/trace_png.py trace.json out.png [--ms 12]
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TRACKS = ["HTTP receive", "ring wait", "H2D", "transform stream", "compute stream"]
COLORS = ["#8da0cb", "#e5c494", "#66c2a5", "#fc8d62", "#e78ac3"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--ms", type=float, default=12.0, help="window shown, from the last compute slice backwards")
    a = ap.parse_args()
    t = json.load(open(a.trace))
    names = {e["tid"]: e["args"]["name"] for e in t["traceEvents"] if e.get("ph") == "M" and e["name"] == "thread_name"}
    ev = [e for e in t["traceEvents"] if e.get("ph") == "X"]
    end = max(e["ts"] + e["dur"] for e in ev if names.get(e["tid"]) == "compute stream")
    start = end - a.ms * 1000
    fig, ax = plt.subplots(figsize=(12, 3.2), dpi=110)
    for row, tr in enumerate(TRACKS):
        for e in ev:
            if names.get(e["tid"]) != tr or e["ts"] + e["dur"] < start or e["ts"] > end:
                continue
            x0 = max(e["ts"], start)
            w = min(e["ts"] + e["dur"], end) - x0
            b = e["args"].get("batch", 0)
            ax.broken_barh([((x0 - start) / 1000, max(w, 2) / 1000)], (len(TRACKS) - row - 0.4, 0.8),
                           facecolors=COLORS[row], edgecolors="white", linewidth=0.5)
            if w > 600 and tr in ("compute stream", "HTTP receive"):
                ax.text((x0 - start + w / 2) / 1000, len(TRACKS) - row, str(b), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(TRACKS), 0, -1))
    ax.set_yticklabels(TRACKS)
    ax.set_xlabel("milliseconds")
    ax.set_xlim(0, a.ms)
    ax.set_title(t.get("otherData", {}).get("title", "streamfeed GET /v1/trace"), fontsize=9)
    fig.tight_layout()
    fig.savefig(a.png)


if __name__ == "__main__":
    main()
