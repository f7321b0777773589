"""GET /v1/stats (throughput windows, stage medians and p99, busy ratio,
ring occupancy, last diagnose verdict, GPU reading) and the GPU metrics,
which are absent — not zero — on the CPU reference backend."""
import json

import pytest

from sfharness import SINK, random_batch, wait_until

AUG = '[{"op":"to_dtype","scale":0.00392157}]'
TINY_AUG = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", AUG]
GPU_METRICS = ["streamfeed_gpu_utilization_ratio", "streamfeed_gpu_memory_used_bytes",
               "streamfeed_gpu_memory_total_bytes", "streamfeed_gpu_power_watts"]
STAGES = ["http_receive", "queue_wait", "h2d", "transform", "step"]


def stats(s):
    r = s.get("/v1/stats")
    assert r.status_code == 200, r.text
    return r.json()


def test_stats_of_a_fresh_server_has_every_field_and_nothing_measured(start_server):
    s = start_server(TINY_AUG, "--ring.slots", "4")
    st = stats(s)
    assert set(st) == {"uptime_s", "backend", "steps_total", "samples_total", "throughput", "stages",
                       "compute_busy_ratio", "ring", "diagnose", "gpu", "rank", "world_size"}
    assert (st["rank"], st["world_size"]) == (0, 1)
    assert st["backend"] == "ref" and st["steps_total"] == 0 and st["samples_total"] == 0
    for w in ("10s", "1m"):
        assert st["throughput"][w]["steps"] == 0 and st["throughput"][w]["steps_per_s"] == 0
        assert 0 <= st["throughput"][w]["seconds"] <= st["uptime_s"] + 0.01
    assert st["stages"] == {"steps": 0, **{k: None for k in STAGES}}
    assert st["compute_busy_ratio"] == 0
    assert st["ring"] == {"slots": 4, "free": 4, "filling": 0, "ready": 0, "in_flight": 0, "occupancy": 0}
    assert st["diagnose"] == {"running": False, "last": None}
    assert st["gpu"] is None


def test_stats_after_training_are_consistent_with_the_batches_and_metrics(start_server, rng):
    s = start_server(TINY_AUG)
    n, k = 8, 12
    results = [s.post_arrays(*random_batch(rng, n), wait=True).json() for _ in range(k)]
    st = stats(s)
    assert st["steps_total"] == k and st["samples_total"] == k * n
    m = s.metrics()
    assert m[("streamfeed_steps_total", frozenset())] == k
    for w in ("10s", "1m"):
        tp = st["throughput"][w]
        # The server is younger than either window: it covers all k steps.
        assert tp["steps"] == k, tp
        assert tp["steps_per_s"] == pytest.approx(k / tp["seconds"], rel=1e-6)
        assert tp["samples_per_s"] == pytest.approx(n * tp["steps_per_s"], rel=1e-6)
    assert st["stages"]["steps"] == k
    for name in STAGES:
        d = st["stages"][name]
        assert d is not None and 0 <= d["median_s"] <= d["p99_s"], (name, d)
    steps = sorted(r["timings"]["step_s"] for r in results)
    assert st["stages"]["step"]["p99_s"] == pytest.approx(steps[-1])  # nearest rank of 12: the largest
    assert st["stages"]["step"]["median_s"] == pytest.approx(steps[5])
    assert st["stages"]["h2d"]["p99_s"] == 0  # no host-to-device copy on the CPU
    assert 0 < st["compute_busy_ratio"] <= 1
    ring = st["ring"]
    assert ring["free"] + ring["filling"] + ring["ready"] + ring["in_flight"] == ring["slots"]
    assert ring["occupancy"] == pytest.approx((ring["slots"] - ring["free"]) / ring["slots"])


def test_stats_windows_cover_the_history_sampled_each_second(start_server, rng):
    s = start_server(TINY_AUG)
    s.post_arrays(*random_batch(rng, 4), wait=True)
    # Once the server is older than 10 s... is too slow for CI; the windows
    # grow with uptime instead, by whole samples of one second.
    wait_until(lambda: stats(s)["throughput"]["10s"]["seconds"] >= 2.0, 10, interval=0.1,
               what="two seconds of throughput history")
    st = stats(s)
    assert st["throughput"]["10s"]["steps"] == 1 and st["throughput"]["1m"]["steps"] == 1


def test_stats_shows_the_verdict_of_the_last_diagnose(start_server, rng):
    s = start_server(TINY_AUG)
    s.post_arrays(*random_batch(rng, 4), wait=True)
    r = s.request("POST", "/v1/diagnose", data=json.dumps({"seconds": 0.5}),
                  headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text
    d = r.json()
    last = stats(s)["diagnose"]["last"]
    assert last["id"] == d["id"] and last["verdict"] == d["verdict"]
    assert last["bottleneck"] == d["bottleneck"] and last["suggestion"] == d["suggestion"]
    assert last["steps_per_s"] == {st["stage"]: st["steps_per_s"] for st in d["stages"]}
    assert 0 <= last["age_s"] < 30


def test_gpu_metrics_are_absent_not_zero_on_the_reference_backend(start_server, rng):
    for s in (start_server(TINY_AUG, "--metrics.gpu_sample_ms", "20"), start_server(SINK)):
        if s.args.count("--model.preset"):
            s.post_arrays(*random_batch(rng, 2), wait=True)
        wait_until(lambda: stats(s)["throughput"]["10s"]["seconds"] >= 0.2, 10, what="a few samples")
        text = s.metrics_text()
        samples = [line for line in text.splitlines() if line.startswith("streamfeed_gpu_")]
        assert samples == [], samples
        for name in GPU_METRICS:  # the families are declared, with no series
            assert f"# TYPE {name} gauge" in text
        assert stats(s)["gpu"] is None


def test_gpu_sample_interval_is_a_hot_option(start_server):
    s = start_server(TINY_AUG)
    assert s.config()["metrics"]["gpu_sample_ms"] == 1000
    r = s.patch_config({"metrics": {"gpu_sample_ms": 0}})
    assert r.status_code == 200 and r.json()["applied"] == ["metrics.gpu_sample_ms"], r.text
    assert s.patch_config({"metrics": {"gpu_sample_ms": -1}}).status_code == 400
