"""POST /v1/diagnose (the caching method) and streamfeed-load --diagnose, on
the CPU reference backend: four stages in pipeline order with a verdict, the
ingest verdict for a slow loader, training paused (batches wait in the ring
and are all trained) and the training state unchanged afterwards."""
import json
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
from safetensors.numpy import load as st_load

from sfharness import LOAD_BIN, SINK, built_with_asan, key, random_batch, st_body, wait_until

AUG = '[{"op":"to_dtype","scale":0.00392157}]'
TINY_AUG = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", AUG]
STAGES = ["device_augmented", "device_raw", "host_pinned", "live"]
VERDICTS = {"ingest": "ingest: loaders or network", "h2d": "host-to-device copy",
            "augmentation": "augmentation", "compute-bound": "compute-bound"}
# On the CPU, augmentation (to_dtype) and the "H2D" stage cost next to
# nothing, so stages 2 and 3 run at stage 1's rate; what separates them is the
# machine's noise (shared CI cores), hence the slack.
SLACK = 1.2
JSON_CT = {"Content-Type": "application/json"}


def diagnose(s, seconds=None, headers=None, **kw):
    body = json.dumps({} if seconds is None else {"seconds": seconds})
    kw.setdefault("timeout", 120)
    return s.request("POST", "/v1/diagnose", data=body, headers={**JSON_CT, **(headers or {})}, **kw)


def diagnose_in_background(s, seconds):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", diagnose(s, seconds)), daemon=True)
    t.start()
    wait_until(lambda: s.get("/v1/stats").json()["diagnose"]["running"] or "r" in out, 10,
               what="the diagnose to start")
    return t, out


def check_consistent(d):
    """The invariants of every diagnosis."""
    assert [st["stage"] for st in d["stages"]] == STAGES
    rates = [st["steps_per_s"] for st in d["stages"]]
    n = d["batch"]["n"]
    for st in d["stages"][:3]:
        assert st["steps"] >= 5 and st["seconds"] > 0 and st["steps_per_s"] > 0, st
        # The rate is the best of the rounds: at least the mean over all of them.
        assert st["steps_per_s"] >= st["steps"] / st["seconds"] * (1 - 1e-9), st
    for st in d["stages"]:
        if st["stage"] != "live":  # live: the sizes of the batches that came
            assert st["samples_per_s"] == pytest.approx(st["steps_per_s"] * n, rel=1e-6), st
        assert st["samples_per_s"] >= 0
        assert st["ratio"] == pytest.approx(st["steps_per_s"] / rates[0], rel=1e-6, abs=1e-12)
    assert d["stages"][0]["ratio"] == 1
    drops = [d["drops"][k] for k in ("augmentation", "h2d", "ingest")]
    for k in range(3):
        assert drops[k] == pytest.approx(max(0.0, 1 - rates[k + 1] / rates[k]), abs=1e-9), (k, rates, drops)
    assert d["verdict"] in VERDICTS and d["bottleneck"] == VERDICTS[d["verdict"]]
    worst = max(range(3), key=lambda k: drops[k])
    expected = "compute-bound" if drops[worst] <= d["threshold"] else ["augmentation", "h2d", "ingest"][worst]
    assert d["verdict"] == expected, d
    assert d["suggestion"].endswith(".") and len(d["suggestion"]) > 20


def stage1_is_fastest(d):
    """The step alone is the upper bound, within noise."""
    rates = [st["steps_per_s"] for st in d["stages"]]
    return rates[0] * SLACK >= rates[1] and rates[0] * SLACK >= rates[2]


def test_diagnose_reports_four_stages_in_pipeline_order_and_a_verdict(start_server, rng):
    s = start_server(TINY_AUG)
    # The last trained batch sets the measured batch's shape: N=8, NCHW, I32 labels.
    images, labels = random_batch(rng, 8)
    body = st_body(images.transpose(0, 3, 1, 2).copy(), labels.astype(np.int32), layout="NCHW")
    assert s.post_batch(body, wait=True).json()["state"] == "done"
    r = diagnose(s, 1.5)
    assert r.status_code == 200, r.text
    d = r.json()
    check_consistent(d)
    seen = []
    # Under AddressSanitizer the stages' relative costs are the sanitizer's:
    # its allocator and shadow checks fall unevenly on them, and CI once saw
    # the host_pinned stage beat the step alone by 1.2-1.6x in three runs in
    # a row. The order is the release build's to check; the invariants above
    # hold in both.
    for _ in range(0 if built_with_asan() else 2):
        if stage1_is_fastest(d):
            break
        # A neighbour's load on a shared CI machine can still bend a run
        # (each stage's rate is already its best of five rounds), and a
        # neighbouring test's load can last as long as two runs (seen once
        # under ASan beside a checkpoint test): a later run must agree.
        seen.append([st["steps_per_s"] for st in d["stages"]])
        time.sleep(1)
        d = diagnose(s, 1.5).json()
        check_consistent(d)
    assert built_with_asan() or stage1_is_fastest(d), seen + [[st["steps_per_s"] for st in d["stages"]]]
    assert d["seconds"] == 1.5 and d["backend"] == "ref" and d["threshold"] == pytest.approx(0.15)
    assert d["batch"] == {"n": 8, "h": 32, "w": 32, "c": 3, "layout": "NCHW", "label_dtype": "I32",
                          "source": "last_batch"}
    # Each cached stage runs about a third of the time asked for: its step
    # count comes from a two-step calibration, so a neighbour's load that
    # slows the timed rounds and not the calibration stretches it, which a
    # sanitizer build's slower steps on a loaded CI machine did to 5.3 s.
    longest = 9.0 if built_with_asan() else 4.5
    assert 0.75 <= sum(st["seconds"] for st in d["stages"][:3]) <= longest, d["stages"]
    assert d["stages"][3]["seconds"] == pytest.approx(1.5)
    stats = s.get("/v1/stats").json()["diagnose"]
    assert stats["running"] is False
    assert stats["last"]["id"] == d["id"] and stats["last"]["verdict"] == d["verdict"]


def test_diagnose_before_any_batch_measures_the_model_input_and_names_ingest(start_server):
    s = start_server(TINY_AUG)
    r = diagnose(s)  # no seconds: diagnose.default_seconds
    assert r.status_code == 200, r.text
    d = r.json()
    check_consistent(d)
    assert d["seconds"] == 3
    assert d["batch"] == {"n": 32, "h": 32, "w": 32, "c": 3, "layout": "NHWC", "label_dtype": "I64",
                          "source": "model_input"}
    assert d["stages"][3]["steps"] == 0 and d["stages"][3]["steps_per_s"] == 0
    assert d["verdict"] == "ingest" and d["drops"]["ingest"] == 1
    assert "No batch was trained" in d["suggestion"]


def test_a_slow_loader_gives_the_ingest_verdict(start_server):
    s = start_server(TINY_AUG)
    loader = subprocess.Popen([LOAD_BIN, "--url", s.url, "--workload", "tiny", "--batch", "8", "--rate", "2",
                               "--connections", "1", "--seconds", "60", "--quiet"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The live window (3 s) must be full of the loader's traffic.
        wait_until(lambda: s.metric("streamfeed_steps_total") >= 8, 30, interval=0.1,
                   what="8 steps from the loader")
        r = diagnose(s, 3)
        assert r.status_code == 200, r.text
        d = r.json()
        check_consistent(d)
        live = d["stages"][3]
        assert 0.5 <= live["steps_per_s"] <= 4, live  # --rate 2
        assert live["samples_per_s"] == pytest.approx(8 * live["steps_per_s"])
        assert d["verdict"] == "ingest", d
        assert d["drops"]["ingest"] > 0.5
        assert "arrive slower" in d["suggestion"]
    finally:
        loader.send_signal(signal.SIGINT)
        out, err = loader.communicate(timeout=30)
    assert loader.returncode == 0, (out, err)


def test_batches_posted_during_a_diagnose_wait_in_the_ring_and_are_all_trained(start_server, rng):
    s = start_server(TINY_AUG)
    assert s.post_arrays(*random_batch(rng, 4), wait=True).json()["state"] == "done"
    t, out = diagnose_in_background(s, 3)
    ids = []
    for _ in range(5):
        r = s.post_arrays(*random_batch(rng, 4))
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    # Training is paused: while the diagnose runs, none of them trains.
    if s.get("/v1/stats").json()["diagnose"]["running"]:
        states = [s.batch(i)["state"] for i in ids]
        still = s.get("/v1/stats").json()["diagnose"]["running"]
        if still:
            assert states == ["queued"] * 5, states
    t.join(60)
    assert out["r"].status_code == 200, out["r"].text
    for i in ids:
        assert s.wait_batch(i)["state"] == "done"
    m = s.metrics()
    assert m[key("streamfeed_steps_total")] == 6
    assert m[key("streamfeed_batches_finished_total", status="done")] == 6
    assert m[key("streamfeed_batches_finished_total", status="failed")] == 0
    # The steps are numbered on from before the diagnose: its steps do not count.
    assert [s.batch(i)["step"] for i in ids] == [2, 3, 4, 5, 6]


def test_a_diagnose_whose_client_went_away_stops_and_training_resumes(start_server, rng):
    # The run is an engine command: training pauses for its whole length. Its
    # client's connection was not looked at while the request waited, so a
    # client that gave up (or a stranger that asked for 30 s and left) kept
    # training paused until the run ended.
    s = start_server(TINY_AUG, "--diagnose.max_seconds", "30")
    assert s.post_arrays(*random_batch(rng, 4), wait=True).json()["state"] == "done"
    body = json.dumps({"seconds": 30}).encode()
    k = socket.create_connection(("127.0.0.1", s.port))
    k.sendall(b"POST /v1/diagnose HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    wait_until(lambda: s.get("/v1/stats").json()["diagnose"]["running"], 10, what="the diagnose to start")
    r = s.post_arrays(*random_batch(rng, 4))
    assert r.status_code == 202, r.text
    k.close()
    # It ends before its next stretch of steps (30 / 15 s at most), not in 30 s.
    wait_until(lambda: not s.get("/v1/stats").json()["diagnose"]["running"], 15,
               what="the diagnose to stop once its client left")
    assert s.wait_batch(r.json()["id"])["state"] == "done"
    assert "diagnose cancelled: its client went away" in s.stderr()
    wait_until(lambda: s.metric("streamfeed_http_requests_total", route="diagnose", code="499") == 1, 5,
               what="the request counted as 499")
    assert diagnose(s, 0.3).status_code == 200  # and the next one runs


def test_diagnose_of_a_segmentation_model_gives_its_batch_a_label_per_output_pixel(start_server):
    # The diagnose batch had N labels where the model scores N x H x W: the
    # reference backend refused the labels it read past them, and a device
    # would have read past the buffer.
    spec = {"input": [3, 8, 8], "classes": 4, "layers": [{"type": "conv2d", "name": "head", "out": 4, "k": 1}]}
    s = start_server("--model.spec", json.dumps(spec), "--pipeline.backend", "ref", "--augment.pipeline", "[]",
                     "--model.max_batch", "8")
    r = diagnose(s, 0.3)
    assert r.status_code == 200, r.text
    check_consistent(r.json())


def _checkpoint_tensors(s):
    """The colleague's GET /v1/checkpoint, when this build has it: {name: array}."""
    r = s.get("/v1/checkpoint")
    if r.status_code != 200:
        return None
    return st_load(r.content)


def test_training_state_after_a_diagnose_equals_the_state_before(start_server, rng):
    """Two servers with the same seeds train X, Y, Z; one runs a diagnose
    between X and Y. The reference backend is deterministic, so the losses
    and step numbers of Y and Z are bit-identical only if the diagnose left
    the parameters, the momentum buffers (momentum 0.9: Z depends on them)
    and the step count exactly as they were."""
    flags = TINY_AUG + ["--optim.lr", "0.05", "--optim.momentum", "0.9", "--model.seed", "7"]
    batches = [random_batch(rng, 16) for _ in range(3)]
    a, b = start_server(flags), start_server(flags)
    ra = [a.post_arrays(*x, wait=True).json() for x in batches]
    rb = [b.post_arrays(*batches[0], wait=True).json()]
    before = _checkpoint_tensors(b)
    d = diagnose(b, 1.5)
    assert d.status_code == 200, d.text
    after = _checkpoint_tensors(b)
    if before is not None:
        assert before.keys() == after.keys()
        for k in before:
            np.testing.assert_array_equal(before[k], after[k], err_msg=k)
    assert b.get("/v1/model").json()["step"] == 1
    rb += [b.post_arrays(*x, wait=True).json() for x in batches[1:]]
    assert [x["state"] for x in ra + rb] == ["done"] * 6
    assert [(x["step"], x["loss"], x["accuracy"]) for x in rb] == [(x["step"], x["loss"], x["accuracy"]) for x in ra]


def test_only_one_diagnose_runs_at_a_time(start_server):
    s = start_server(TINY_AUG)
    t, out = diagnose_in_background(s, 2)
    if "r" not in out:
        r = diagnose(s, 0.5)
        if "r" not in out:  # the first one was still running when this one came
            assert r.status_code == 409, r.text
            assert r.json()["error"]["code"] == "diagnose_running"
    t.join(60)
    assert out["r"].status_code == 200
    assert diagnose(s, 0.3).status_code == 200  # and the next one may run


def test_concurrent_diagnose_requests_get_their_result_or_409_never_a_500(start_server):
    # A requester woken for its run's end may be answered only after another
    # request has started the next run: it still gets its own result. Each
    # finished run is one chance of that; 30 of them under 16 clients showed
    # it about once in ten runs before the fix. That chance comes at a run's
    # end, whatever the run measured, so the runs measure a batch of one
    # sample (model.max_batch 1): a run then lasts about the time asked for,
    # where the default batch of 32 made the minimum steps of each stage the
    # larger part of the run (about 1.3 s a run in the release build, 8 s
    # under AddressSanitizer), at the same chance per run. The release
    # build's run asks for thirty runs, the sanitizer's for six; the deadlines
    # only bound a machine much busier than CI's, since the workers stop as
    # soon as they have enough.
    s = start_server(TINY_AUG, "--model.max_batch", "1")
    codes, lock = {}, threading.Lock()
    need = 6 if built_with_asan() else 30
    deadline = time.monotonic() + (180 if built_with_asan() else 90)

    def worker():
        while time.monotonic() < deadline:
            with lock:
                if codes.get((200, "ok"), 0) >= need:
                    return
            r = diagnose(s, 0.1)
            c = (r.status_code, "ok" if r.status_code == 200 else r.json()["error"]["code"])
            with lock:
                codes[c] = codes.get(c, 0) + 1

    ts = [threading.Thread(target=worker) for _ in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(240)
    assert set(codes) <= {(200, "ok"), (409, "diagnose_running")}, codes
    assert codes.get((200, "ok"), 0) >= need, codes


@pytest.mark.parametrize("body,ctype,status,code", [
    ('{"seconds": 0}', "application/json", 400, "seconds_out_of_range"),
    ('{"seconds": 0.05}', "application/json", 400, "seconds_out_of_range"),
    ('{"seconds": 10.5}', "application/json", 400, "seconds_out_of_range"),
    ('{"seconds": "3"}', "application/json", 400, "seconds_invalid"),
    ('{"seconds": null}', "application/json", 400, "seconds_invalid"),
    ('{"seconds": 1, "steps": 3}', "application/json", 400, "unknown_field"),
    ('[1]', "application/json", 400, "body_not_object"),
    ('{"seconds":', "application/json", 400, "json_invalid"),
    ('{"seconds": 1}', "text/plain", 415, "unsupported_media_type"),
])
def test_diagnose_rejects_a_bad_body_with_its_own_code(start_server, body, ctype, status, code):
    # The closing run only has to end: on a batch of one it takes its 0.3 s,
    # not the minimum steps of a batch of 32 (seconds under AddressSanitizer).
    s = start_server(TINY_AUG, "--diagnose.default_seconds", "0.3", "--model.max_batch", "1")
    r = s.request("POST", "/v1/diagnose", data=body, headers={"Content-Type": ctype})
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code
    assert diagnose(s).status_code == 200  # nothing was left running


def test_diagnose_max_seconds_is_hot_and_bounds_the_request(start_server):
    s = start_server(TINY_AUG, "--model.max_batch", "1")  # the run's batch is not under test
    assert s.patch_config({"diagnose": {"max_seconds": 0.5}}).status_code == 200
    r = diagnose(s, 0.6)
    assert r.status_code == 400 and r.json()["error"]["field"] == "seconds"
    assert "0.5" in r.json()["error"]["message"]
    # The default is capped at the maximum too.
    d = diagnose(s).json()
    assert d["seconds"] == 0.5


def test_diagnose_needs_the_token_when_one_is_set(start_server):
    s = start_server(TINY_AUG, "--http.token", "sesame", "--diagnose.default_seconds", "0.3", "--model.max_batch", "1")
    assert diagnose(s).status_code == 401
    assert diagnose(s, headers={"Authorization": "Bearer sesame"}).status_code == 200


def test_diagnose_in_sink_mode_is_a_conflict(start_server):
    s = start_server(SINK)
    r = diagnose(s, 1)
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "no_backend"


def test_streamfeed_load_diagnose_prints_a_one_screen_table_and_exits_0(start_server, rng):
    s = start_server(TINY_AUG)
    assert s.post_arrays(*random_batch(rng, 8), wait=True).json()["state"] == "done"
    p = subprocess.run([LOAD_BIN, "--url", s.url, "--diagnose", "--seconds", "1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, (p.stdout, p.stderr)
    lines = p.stdout.rstrip("\n").split("\n")
    assert len(lines) <= 24 and max(len(x) for x in lines) <= 80, p.stdout
    for row in ("(1) step: augmented", "(2) augment+step: raw", "(3) H2D+augment+step", "(4) live"):
        assert sum(row in x for x in lines) == 1, (row, p.stdout)
    verdict = [x for x in lines if x.startswith("verdict: ")]
    assert len(verdict) == 1 and verdict[0][len("verdict: "):] in VERDICTS.values(), p.stdout
    assert "batch: 8 x 32x32x3 NHWC, labels I64 (as the last trained batch)" in p.stdout
    # --json prints the server's reply as it is.
    p = subprocess.run([LOAD_BIN, "--url", s.url, "--diagnose", "--seconds", "0.5", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    check_consistent(json.loads(p.stdout))


def test_streamfeed_load_diagnose_exits_1_with_the_error_code_when_refused(start_server):
    s = start_server(SINK)
    p = subprocess.run([LOAD_BIN, "--url", s.url, "--diagnose"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert "no_backend" in p.stderr


def test_a_client_that_goes_away_during_a_diagnose_leaves_nothing_behind(start_server):
    s = start_server(TINY_AUG, "--model.max_batch", "1")  # the run's batch is not under test
    body = json.dumps({"seconds": 1}).encode()
    sock = s.connect()
    sock.sendall(b"POST /v1/diagnose HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    wait_until(lambda: s.get("/v1/stats").json()["diagnose"]["running"], 10, what="the diagnose to start")
    s.reset(sock)
    # The run ends (cancelled, or finished first: it is a second long), and
    # the next one runs.
    wait_until(lambda: not s.get("/v1/stats").json()["diagnose"]["running"], 30, interval=0.05,
               what="the abandoned diagnose to end")
    assert diagnose(s, 0.3).status_code == 200
    assert s.get("/v1/stats").json()["diagnose"]["last"] is not None


def test_sigterm_during_a_diagnose_answers_it_and_exits_0(start_server):
    s = start_server(TINY_AUG)
    t, out = diagnose_in_background(s, 3)
    assert s.terminate() == 0
    t.join(30)
    r = out["r"]
    assert r.status_code in (200, 503), r.text
    if r.status_code == 503:
        assert r.json()["error"]["code"] == "shutting_down" and "Retry-After" in r.headers
    s.stop()  # checks stderr: no error line, no sanitizer report
