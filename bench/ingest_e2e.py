"""Drives a running-or-started streamfeed with streamfeed-load and measures the
service's own trained rate from /metrics (steps_total and samples over a
steady window), not the loader's send rate.

    python3 bench/ingest_e2e.py --bin build/streamfeed --load build/streamfeed-load \
        --server-args "--model.preset seed-classifier" --load-args "--workload w1 --batch 32 --connections 8" \
        --batches 600 --label w1_e2e --json out.json

--config FILE starts the service from a config file (an exported model's
config.json); --server-args still win over it. The window counts only batches
trained (batches_finished_total{status="done"}). A run in which the service
refused a batch, a batch failed in training, the loader gave up on one or
read no finite loss for the first and the last batch, the service did not
start or exited, or --timeout passed, reports no figure
(steps_per_s null, the reason under "error") and exits 1; a full ring's
429/503, which the loader retries, is back-pressure and not a refusal.
--nvml-peak records the service process's peak device memory as NVML
reports it (bench/nvml_peak.py, the method of bench/memory_peak.sh).
"""
import argparse
import json
import math
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvml_peak import ProcessPeak, die_with_parent  # noqa: E402

BACK_PRESSURE = ("ring_full", "ring_full_timeout")


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


def tail(path, n=4000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def stop(proc, sig=signal.SIGTERM, wait_s=60):
    """Ends a child this script started, by its pid: sig first, SIGKILL after wait_s."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Deadline(Exception):
    pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/streamfeed")
    ap.add_argument("--load", default="build/streamfeed-load")
    ap.add_argument("--config", help="config file the service starts from (--config of streamfeed)")
    ap.add_argument("--server-args", default="")
    ap.add_argument("--load-args", default="")
    ap.add_argument("--batches", type=int, default=600)
    ap.add_argument("--warmup-steps", type=int, default=30)
    ap.add_argument("--timeout", type=float, default=0,
                    help="seconds the whole run may take, start-up included (0: no limit); then no figure, exit 1")
    ap.add_argument("--nvml-peak", action="store_true",
                    help="record the service process's peak device memory (NVML, per process)")
    ap.add_argument("--server-log", help="file for the service's stderr (default: a temporary file)")
    ap.add_argument("--model-json", help="file for the service's GET /v1/model after the run (its memory "
                    "plan and device_memory_bytes, to set beside NVML's peak)")
    ap.add_argument("--label", default="run")
    ap.add_argument("--json")
    a = ap.parse_args()

    t_start = time.monotonic()

    def left():
        if a.timeout and time.monotonic() - t_start > a.timeout:
            raise Deadline(f"--timeout {a.timeout:g} s passed")

    # SIGTERM (an outer timeout) ends the children too, so no service is
    # left holding the device after this script.
    def on_term(*_):
        raise Deadline("terminated")

    signal.signal(signal.SIGTERM, on_term)
    log_path = a.server_log or tempfile.mkstemp(prefix="streamfeed-e2e-", suffix=".log")[1]
    log = open(log_path, "w")
    cmd = [a.bin, "--http.port", "0", "--log.requests", "false"]
    cmd += ["--config", a.config] if a.config else []
    cmd += shlex.split(a.server_args)
    # The pipeline mode as given (the last one wins, as in the service's own
    # parsing); a --config file's mode is not read, so a sink run names it.
    sargs = shlex.split(a.server_args)
    modes = [sargs[i + 1] for i, k in enumerate(sargs[:-1]) if k == "--pipeline.mode"]
    modes += [k.split("=", 1)[1] for k in sargs if k.startswith("--pipeline.mode=")]
    sink = bool(modes) and modes[-1] == "sink"
    peak = ProcessPeak() if a.nvml_peak else None
    srv = load = None
    res = {"label": a.label, "steps_per_s": None, "samples_per_s": None, "ingest_gb_per_s": None,
           "server_args": a.server_args, "load_args": a.load_args, "config": a.config,
           "batches": a.batches, "warmup_steps": a.warmup_steps}
    batch = None
    m = re.search(r"--batch[ =](\d+)", a.load_args)
    if m:
        batch = int(m.group(1))
    res["batch"] = batch
    error = None
    try:
        srv = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=die_with_parent)
        if peak:
            peak.start(srv.pid)
        # The service prints its address once its model is built (cuDNN's
        # plans chosen, the first graph captured): the deadline covers that.
        while not select.select([srv.stdout], [], [], 0.5)[0]:
            left()
        line = srv.stdout.readline()
        m = re.search(r":(\d+)$", line.strip())
        if not m:
            srv.wait(timeout=30)
            raise Deadline(f"the service did not start (exit {srv.returncode}): {tail(log_path, 1500).strip()}")
        url = f"http://127.0.0.1:{m.group(1)}"
        # --drain: the loader waits for its last batch to train and reads the
        # first and the last batch's losses from the service, so the result
        # carries a loss from each end of the run (checked finite below).
        load = subprocess.Popen([a.load, "--url", url, "--batches", str(a.batches), "--json", "--quiet", "--drain"]
                                + shlex.split(a.load_args), stdout=subprocess.PIPE, text=True,
                                preexec_fn=die_with_parent)
        # Steady window: from warmup_steps trained batches until 90% of them
        # trained (a finished batch is a trained step, or a sunk batch in sink
        # mode); a failed batch is finished but not trained.
        fin = "streamfeed_batches_finished_total"
        byt = "streamfeed_received_bytes_total"

        def done():
            return by_label(url, fin, "status").get("done", 0.0)

        t0 = s0 = b0 = None
        while True:
            left()
            s = done()
            now = time.perf_counter()
            if t0 is None and s >= a.warmup_steps:
                t0, s0, b0 = now, s, metric(url, byt)
            if t0 is not None and s >= 0.9 * a.batches:
                t1, s1, b1 = now, s, metric(url, byt)
                break
            if load.poll() is not None or srv.poll() is not None:
                t1, s1, b1 = now, s, metric(url, byt) if srv.poll() is None else b0
                break
            time.sleep(0.01)
        while load.poll() is None:
            left()
            time.sleep(0.05)
        out = load.stdout.read()
        if srv.poll() is not None:
            raise Deadline(f"the service exited ({srv.returncode}) during the run: {tail(log_path, 1500).strip()}")
        # What ran: the decoder of each JPEG batch (the choice is per batch), the
        # host time spent issuing decodes, and the mean stage times.
        decoders = by_label(url, "streamfeed_jpeg_batches_total", "decoder")
        decode_host = by_label(url, "streamfeed_jpeg_decode_host_seconds_total", "decoder")
        stage_ms = stages(url)
        finished = by_label(url, fin, "status")
        received = by_label(url, "streamfeed_batches_received_total", "status")
        rejected = by_label(url, "streamfeed_batches_rejected_total", "reason")
        skipped = by_label(url, "streamfeed_steps_skipped_total", "reason")
        summary = json.loads(out) if out.strip() else {}
        if a.model_json:
            with urllib.request.urlopen(url + "/v1/model", timeout=10) as r, open(a.model_json, "wb") as f:
                f.write(r.read())
        ok = t0 is not None and t1 > t0 and s1 > s0
        steps_per_s = (s1 - s0) / (t1 - t0) if ok else 0.0
        gb_per_s = (b1 - b0) / (t1 - t0) / 1e9 if ok and b1 is not None else 0.0
        res.update({"steps_per_s": steps_per_s, "samples_per_s": steps_per_s * batch if batch else None,
                    "ingest_gb_per_s": gb_per_s, "window_batches": (s1 - s0) if ok else 0,
                    "window_s": (t1 - t0) if ok else 0, "loader": summary,
                    "batches_finished": finished, "batches_received": received,
                    "batches_rejected": rejected, "steps_skipped": skipped,
                    "jpeg_decoders": decoders,
                    "jpeg_decode_host_ms_per_batch": {k: 1e3 * v / decoders[k] for k, v in decode_host.items()
                                                      if decoders.get(k)},
                    "stage_ms": stage_ms})
        problems = []
        # A full ring is back-pressure the loader retries (it reports what it
        # gave up on); any other reason is a batch the service refused.
        refused = {k: v for k, v in rejected.items() if v and k not in BACK_PRESSURE}
        if refused:
            problems.append(f"batches refused by the service: {refused}")
        if finished.get("failed"):
            problems.append(f"{finished['failed']:.0f} batches failed in training")
        for k in ("rejected", "failed", "interrupted"):
            if summary.get(k):
                problems.append(f"loader: {summary[k]:.0f} {k}")
        if summary.get("errors"):
            problems.append(f"loader errors {summary['errors']}")
        if not summary:
            problems.append(f"loader gave no summary (exit {load.returncode})")
        elif not sink:  # a sunk batch is received and dropped: it has no loss
            for k in ("first_loss", "last_loss"):
                v = summary.get(k)
                if not isinstance(v, (int, float)) or not math.isfinite(v):
                    problems.append(f"loader: {k} is {v!r}, not a finite loss")
        if not ok:
            problems.append(f"no steady window ({s if t0 is None else s1:.0f} batches trained, "
                            f"warm-up {a.warmup_steps})")
        if problems:
            error = "; ".join(problems)
    except Deadline as e:
        error = str(e)
    except Exception as e:  # noqa: BLE001 (a scrape of a service that died: no figure, the children ended)
        error = f"{type(e).__name__}: {e}"
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # A run cut short does not wait out the service's drain.
        stop(load, signal.SIGINT, 10)
        stop(srv, wait_s=15 if error else 60)
        if peak:
            peak.stop()
            res.update(peak.record())
        log.close()
    res["server_log"] = log_path
    if error:
        res.update({"steps_per_s": None, "samples_per_s": None, "ingest_gb_per_s": None, "error": error[:4000]})
        print(f"streamfeed {a.label}: FAILED {error[:1500]}", flush=True)
    else:
        print(f"streamfeed {a.label}: {res['steps_per_s']:.1f} batches/s finished, {res['ingest_gb_per_s']:.2f} "
              f"GB/s ingested (loader {res['loader'].get('mb_per_s', 0):.0f} MB/s)"
              + (f", peak {res['peak_process_mib']} MiB" if res.get("peak_process_mib") is not None else ""),
              flush=True)
        if res["jpeg_decoders"]:
            print(f"  jpeg batches per decoder {res['jpeg_decoders']}, host ms per batch "
                  f"{ {k: round(v, 3) for k, v in res['jpeg_decode_host_ms_per_batch'].items()} }", flush=True)
        print(f"  mean stage ms { {k: round(v, 3) for k, v in res['stage_ms'].items()} }", flush=True)
        if any(res["steps_skipped"].values()):
            print(f"  steps skipped {res['steps_skipped']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if error else 0


if __name__ == "__main__":
    raise SystemExit(main())
