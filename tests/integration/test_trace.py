"""GET /v1/trace: the last steps' timelines as Chrome trace-event JSON that
Perfetto and chrome://tracing open — five tracks in pipeline order, one slice
per batch and stage, edges in order (receive, ring wait, H2D, transform,
compute)."""
import json

import pytest

from sfharness import SINK, random_batch

AUG = '[{"op":"to_dtype","scale":0.00392157}]'
TINY_AUG = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", AUG]
TRACKS = ["HTTP receive", "ring wait", "H2D", "transform stream", "compute stream"]
EPS_US = 0.002  # edges are ns on the host clock, printed in µs


def trace(s, steps=None):
    r = s.get("/v1/trace" + (f"?steps={steps}" if steps is not None else ""))
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    # Strict JSON: no NaN or Infinity, which Perfetto's parser refuses.
    return json.loads(r.text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def tracks_of(t):
    """tid -> track name, from the thread_name metadata; and the process name."""
    meta = [e for e in t["traceEvents"] if e["ph"] == "M"]
    names = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    proc = [e["args"]["name"] for e in meta if e["name"] == "process_name"]
    return names, proc


def slices(t):
    """{track name: {batch id: event}} of the complete events."""
    names, _ = tracks_of(t)
    out = {n: {} for n in names.values()}
    for e in t["traceEvents"]:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0, e
            assert e["name"] == f"batch {e['args']['batch']}"
            out[names[e["tid"]]][e["args"]["batch"]] = e
    return out


def test_trace_has_five_tracks_with_one_slice_per_batch_in_pipeline_order(start_server, rng):
    s = start_server(TINY_AUG)
    results = [s.post_arrays(*random_batch(rng, 4), wait=True).json() for _ in range(6)]
    t = trace(s, 6)
    assert t["displayTimeUnit"] == "ms"
    names, proc = tracks_of(t)
    assert proc == ["streamfeed ref (CPU)"]
    assert [names[tid] for tid in sorted(names)] == TRACKS
    sl = slices(t)
    ids = [r["id"] for r in results]
    for track in TRACKS:
        assert sorted(sl[track]) == ids, track
    for r in results:
        b = r["id"]
        recv, ring, h2d, xf, comp = (sl[track][b] for track in TRACKS)
        end = lambda e: e["ts"] + e["dur"]  # noqa: E731
        # Each stage starts when (or after) the one before it ended.
        assert ring["ts"] >= end(recv) - EPS_US
        assert h2d["ts"] >= end(ring) - EPS_US
        assert xf["ts"] >= end(h2d) - EPS_US
        assert comp["ts"] >= end(xf) - EPS_US
        assert comp["dur"] > 0 and recv["dur"] > 0
        assert comp["args"]["step"] == r["step"] and comp["args"]["n"] == 4
        assert comp["args"]["loss"] == pytest.approx(r["loss"], rel=1e-6)
        # The durations are the batch's own timings.
        assert xf["dur"] == pytest.approx(r["timings"]["transform_s"] * 1e6, abs=0.01)
        assert comp["dur"] == pytest.approx(r["timings"]["step_s"] * 1e6, abs=0.01)
    # One engine, one batch at a time on the CPU: compute slices do not overlap.
    comps = sorted(sl["compute stream"].values(), key=lambda e: e["ts"])
    for a, b in zip(comps, comps[1:]):
        assert b["ts"] >= a["ts"] + a["dur"] - EPS_US
    assert min(e["ts"] for e in t["traceEvents"] if e["ph"] == "X") == 0


def test_steps_selects_the_most_recent_steps_and_defaults_to_100(start_server, rng):
    s = start_server(TINY_AUG)
    ids = [s.post_arrays(*random_batch(rng, 2), wait=True).json()["id"] for _ in range(4)]
    assert sorted(slices(trace(s, 2))["compute stream"]) == ids[-2:]
    assert sorted(slices(trace(s))["compute stream"]) == ids
    assert trace(s, 1024)["otherData"]["steps"] == 4


@pytest.mark.parametrize("steps", ["0", "1025", "-1", "abc", "1.5", "", "+3"])
def test_steps_outside_1_to_1024_is_a_400(start_server, steps):
    s = start_server(TINY_AUG)
    r = s.get(f"/v1/trace?steps={steps}")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "bad_steps" and r.json()["error"]["field"] == "steps"


def test_trace_before_any_step_has_only_the_track_names(start_server):
    for s in (start_server(TINY_AUG), start_server(SINK)):
        t = trace(s)
        assert all(e["ph"] == "M" for e in t["traceEvents"])
        names, proc = tracks_of(t)
        assert sorted(names.values()) == sorted(TRACKS) and proc in (["streamfeed ref (CPU)"], ["streamfeed sink (CPU)"])


def test_trace_names_the_process_after_where_the_steps_ran(start_server, rng):
    # A GPU's ordinal on the cuda backend (tests/unit/test_diagnose_trace.c),
    # never a GPU on the CPU reference backend, whatever pipeline.device says.
    s = start_server(TINY_AUG, "--pipeline.device", "3")
    s.post_arrays(*random_batch(rng, 2), wait=True)
    assert tracks_of(trace(s))[1] == ["streamfeed ref (CPU)"]
