"""The training loop through the real server on the CPU reference backend:
eval batches (no step, eval-mode batchnorm, named sample-weighted
aggregates, a bounded number of names, logits as safetensors), skipped
non-finite steps and the "diverged" readiness, gradient clipping and label
smoothing against their formulas, and the tiny preset's own recipe."""
import json
import math
import socket

import numpy as np
import pytest
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from sfharness import SLOWDOWN, learnable_batch, post_unread, st_body, wait_until

SAFETENSORS = {"Content-Type": "application/vnd.safetensors"}
AUG = '[{"op":"to_dtype","scale":0.00392157},{"op":"normalize","mean":[0.5],"std":[0.25]}]'
TINY = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", AUG, "--model.seed", "1"]

# A batchnorm model on 32x32 inputs, so that eval mode (running statistics)
# and the buffers are part of what an eval must leave alone.
# Scaling only: an all-zero image stays all zero, so with zero biases every
# feature of it is zero (the non-finite tests rely on it).
SCALED = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline",
          '[{"op":"to_dtype","scale":0.00392157}]', "--model.seed", "1"]

BN_SPEC = {"input": [3, 32, 32], "classes": 10, "layers": [
    {"type": "conv2d", "name": "conv", "out": 4, "k": 3, "stride": 2, "pad": 1, "bias": False},
    {"type": "batchnorm2d", "name": "bn"}, {"type": "relu", "name": "relu"},
    {"type": "global_avgpool", "name": "gap"}, {"type": "flatten", "name": "flat"},
    {"type": "linear", "name": "fc", "out": 10}]}
BN = ["--model.spec", json.dumps(BN_SPEC), "--pipeline.backend", "ref", "--augment.pipeline", AUG,
      "--augment.eval_pipeline", AUG, "--optim.name", "adamw", "--optim.lr", "0.01"]


def post(s, images, labels, query=""):
    return s.request("POST", "/v1/batches?wait=1" + query, data=st_body(images, labels), headers=SAFETENSORS)


def train(s, images, labels):
    r = post(s, images, labels)
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    return r.json()


def evaluate(s, images, labels, name=None):
    r = post(s, images, labels, "&mode=eval" + (f"&eval={name}" if name else ""))
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    return r.json()


def state(s):
    """Every tensor of the full checkpoint: parameters, buffers, optimizer state."""
    r = s.get("/v1/checkpoint")
    assert r.status_code == 200, r.text
    return st_load(r.content), r.headers["X-Checkpoint-Step"]


def softmax_xent(logits, labels, smoothing=0.0):
    z = logits.astype(np.float64)
    logp = z - z.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    k = z.shape[1]
    t = np.full_like(z, smoothing / k)
    t[np.arange(len(labels)), labels] += 1 - smoothing
    return float(-(t * logp).sum(1).mean())


def test_an_eval_between_training_batches_leaves_weights_buffers_and_optimizer_state_bit_identical(start_server):
    s = start_server(*BN)
    rng = np.random.default_rng(1)
    for _ in range(2):
        train(s, *learnable_batch(rng, 8))
    before, step = state(s)
    x, y = learnable_batch(rng, 8)
    e = evaluate(s, x, y)
    assert e["kind"] == "eval" and e["eval"] == "default" and e["step"] == 2
    assert 0 <= e["top1"] <= e["top5"] <= 1 and e["accuracy"] == e["top1"] and math.isfinite(e["loss"])
    after, step_after = state(s)
    assert step_after == step
    assert before.keys() == after.keys()
    for k in before:
        assert np.array_equal(before[k], after[k]), k
    # The same eval again gives the same answer: eval mode is deterministic.
    assert evaluate(s, x, y)["loss"] == e["loss"]
    # Training goes on from the same step count, and the eval took no step.
    assert train(s, *learnable_batch(rng, 8))["step"] == 3
    assert s.metric("streamfeed_steps_total") == 3


def test_eval_aggregates_are_sample_weighted_over_the_batches_of_a_name(start_server):
    s = start_server(*TINY)
    rng = np.random.default_rng(2)
    train(s, *learnable_batch(rng, 8))
    a = evaluate(s, *learnable_batch(rng, 2), name="holdout")
    b = evaluate(s, *learnable_batch(rng, 6), name="holdout")
    r = s.get("/v1/evals/holdout")
    assert r.status_code == 200, r.text
    g = r.json()
    assert g["batches"] == 2 and g["samples"] == 8 and g["first_step"] == 1 and g["last_step"] == 1
    assert math.isclose(g["loss"], (2 * a["loss"] + 6 * b["loss"]) / 8, rel_tol=1e-6)
    assert math.isclose(g["top1"], (2 * a["top1"] + 6 * b["top1"]) / 8, rel_tol=1e-9)
    assert math.isclose(g["top5"], (2 * a["top5"] + 6 * b["top5"]) / 8, rel_tol=1e-9)
    assert [e["name"] for e in s.get("/v1/evals").json()["evals"]] == ["holdout"]
    assert math.isclose(s.metric("streamfeed_eval_loss", eval="holdout"), g["loss"], rel_tol=1e-6)
    assert math.isclose(s.metric("streamfeed_eval_accuracy", eval="holdout", k="5"), g["top5"], rel_tol=1e-9)
    assert s.metric("streamfeed_eval_samples_total", eval="holdout") == 8
    assert s.get("/v1/evals/nobody").status_code == 404


def test_the_number_of_eval_names_is_bounded_and_one_more_is_refused(start_server):
    s = start_server(*TINY, "--eval.max_names", "2")
    rng = np.random.default_rng(3)
    x, y = learnable_batch(rng, 2)
    evaluate(s, x, y, name="a")
    evaluate(s, x, y, name="b")
    r = post(s, x, y, "&mode=eval&eval=c")
    assert r.status_code == 409 and r.json()["error"]["code"] == "too_many_evals", r.text
    # A known name is still fine, queued (202) too: the batch names its evaluation.
    queued = s.request("POST", "/v1/batches?mode=eval&eval=a", data=st_body(x, y), headers=SAFETENSORS)
    assert queued.status_code == 202, queued.text
    b = s.wait_batch(queued.json()["id"])
    assert b["kind"] == "eval" and b["eval"] == "a" and b["state"] == "done"
    assert s.get("/v1/evals/a").json()["batches"] == 2
    assert s.metric("streamfeed_batches_rejected_total", reason="too_many_evals") == 1
    bad = post(s, x, y, "&mode=eval&eval=no%20spaces")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_eval_name"


def test_a_refused_eval_batch_creates_no_evaluation(start_server):
    # Refused batches (a body that is no safetensors file, a label out of
    # range) name evaluations that must not take eval.max_names: a name is
    # made known by its first accepted batch.
    s = start_server(*TINY, "--eval.max_names", "2")
    rng = np.random.default_rng(4)
    x, y = learnable_batch(rng, 2)
    for i in range(3):
        r = s.request("POST", f"/v1/batches?wait=1&mode=eval&eval=junk{i}", data=b"garbage!", headers=SAFETENSORS)
        assert 400 <= r.status_code < 500, r.text
    bad = post(s, x, np.full_like(y, 1000), "&mode=eval&eval=badlabel")
    assert 400 <= bad.status_code < 500, bad.text
    assert s.get("/v1/evals").json()["evals"] == []
    evaluate(s, x, y, name="a")
    evaluate(s, x, y)  # the default name
    assert [e["name"] for e in s.get("/v1/evals").json()["evals"]] == ["a", "default"]


def test_an_eval_name_of_the_longest_length_is_readable_by_its_route(start_server):
    s = start_server(*TINY)
    rng = np.random.default_rng(5)
    name = "e" * 64
    evaluate(s, *learnable_batch(rng, 2), name=name)
    r = s.get(f"/v1/evals/{name}")
    assert r.status_code == 200 and r.json()["name"] == name, r.text


def test_returned_logits_have_the_batch_shape_and_match_the_reply_of_a_second_eval(start_server):
    s = start_server(*TINY)
    rng = np.random.default_rng(4)
    train(s, *learnable_batch(rng, 8))
    x, y = learnable_batch(rng, 5)
    r = post(s, x, y, "&mode=eval&return=logits")
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/vnd.safetensors", r.text
    logits = st_load(r.content)["logits"]
    assert logits.shape == (5, 10) and logits.dtype == np.float32
    again = post(s, x, y, "&mode=eval&return=logits")
    assert np.array_equal(st_load(again.content)["logits"], logits)
    e = evaluate(s, x, y)
    assert math.isclose(e["loss"], softmax_xent(logits, y), rel_tol=1e-5)
    assert e["top1"] == float(np.mean(logits.argmax(1) == y))
    # The logits are the reply, so they need wait=1.
    nowait = s.request("POST", "/v1/batches?mode=eval&return=logits", data=st_body(x, y), headers=SAFETENSORS)
    assert nowait.status_code == 400 and nowait.json()["error"]["code"] == "bad_query"


def timed_out_logits_eval(s, rng, x, y):
    """Queues about a second of training (12 batches of 256 samples in the
    release build, a SLOWDOWN-th of them under AddressSanitizer, whose
    server takes that much longer over each), then posts an eval batch with
    return=logits and a 1 ms wait, which runs out while the batch waits its
    turn: the reply is the 202 of a batch still queued."""
    body = st_body(*learnable_batch(rng, 256))
    for _ in range(12 // SLOWDOWN):
        assert s.post_batch(body).status_code == 202
    assert s.patch_config({"pipeline": {"wait_timeout_ms": 1}}).status_code == 200
    r = post(s, x, y, "&mode=eval&return=logits")
    assert s.patch_config({"pipeline": {"wait_timeout_ms": 60000}}).status_code == 200
    assert r.status_code == 202 and r.json()["state"] != "done", r.text
    assert r.json()["logits"] == "kept"
    assert r.headers["Location"] == f"/v1/batches/{r.json()['id']}/logits"
    return r.json()["id"]


def test_logits_whose_wait_ran_out_are_kept_and_match_those_of_a_wait_that_did_not(start_server):
    s = start_server(*TINY, "--ring.slots", "16")
    rng = np.random.default_rng(5)
    x, y = learnable_batch(rng, 5)
    bid = timed_out_logits_eval(s, rng, x, y)
    r = s.get(f"/v1/batches/{bid}/logits?wait=1")
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/vnd.safetensors", r.text
    kept = st_load(r.content)["logits"]
    assert kept.shape == (5, 10) and kept.dtype == np.float32
    # Nothing trained since: the same weights give the same logits in a reply.
    direct = post(s, x, y, "&mode=eval&return=logits")
    assert direct.status_code == 200, direct.text
    assert np.array_equal(st_load(direct.content)["logits"], kept)
    # Kept, not consumed: a second GET gets them again.
    assert s.get(f"/v1/batches/{bid}/logits").content == r.content
    assert s.batch(bid)["logits"] == "kept"
    assert s.metric("streamfeed_logits_kept") == 1
    assert s.metric("streamfeed_logits_kept_bytes") == len(r.content)


def test_kept_logits_are_bounded_and_unknown_or_expired_ids_get_stable_codes(start_server):
    s = start_server(*TINY, "--ring.slots", "16", "--eval.logits_keep_max", "1")
    rng = np.random.default_rng(6)
    x, y = learnable_batch(rng, 3)
    first = timed_out_logits_eval(s, rng, x, y)
    second = timed_out_logits_eval(s, rng, x, y)
    # One more than eval.logits_keep_max: the oldest goes, counted.
    assert s.batch(first)["logits"] == "expired"
    r = s.get(f"/v1/batches/{first}/logits")
    assert r.status_code == 410 and r.json()["error"]["code"] == "logits_expired", r.text
    assert s.metric("streamfeed_logits_evicted_total", reason="count") == 1
    assert s.get(f"/v1/batches/{second}/logits?wait=1").status_code == 200
    # A training batch has no logits; an id never issued no batch.
    r = s.get("/v1/batches/1/logits")
    assert r.status_code == 404 and r.json()["error"]["code"] == "logits_not_kept", r.text
    r = s.get("/v1/batches/999999/logits")
    assert r.status_code == 404 and r.json()["error"]["code"] == "batch_not_found", r.text
    r = s.get("/v1/batches/x/logits")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_batch_id", r.text
    # Age: eval.logits_keep_s after its 202, the timer lets the second go.
    assert s.patch_config({"eval": {"logits_keep_s": 1}}).status_code == 200
    wait_until(lambda: s.metric("streamfeed_logits_evicted_total", reason="age") == 1, 10,
               what="the kept logits to age out")
    assert s.get(f"/v1/batches/{second}/logits").status_code == 410
    assert s.metric("streamfeed_logits_kept") == 0 and s.metric("streamfeed_logits_kept_bytes") == 0


def test_kept_logits_stay_readable_after_the_batch_entry_is_evicted(start_server):
    # pipeline.jobs_max newer batches evict the batch's entry; its logits are
    # still kept (and counted), so they must still be served until let go.
    s = start_server(*TINY, "--ring.slots", "16", "--pipeline.jobs_max", "96")
    rng = np.random.default_rng(8)
    x, y = learnable_batch(rng, 4)
    bid = timed_out_logits_eval(s, rng, x, y)
    r = s.get(f"/v1/batches/{bid}/logits?wait=1")
    assert r.status_code == 200, r.text
    small = st_body(*learnable_batch(rng, 2))
    for _ in range(100):
        assert s.post_batch(small).status_code == 202
    wait_until(lambda: s.get(f"/v1/batches/{bid}").status_code == 404, 60, what="the entry's eviction")
    again = s.get(f"/v1/batches/{bid}/logits")
    assert again.status_code == 200 and again.content == r.content, again.text
    assert s.metric("streamfeed_logits_kept") == 1


def test_logits_larger_than_what_may_be_kept_are_refused_before_the_batch_runs(start_server):
    s = start_server(*TINY, "--eval.logits_keep_bytes", "4096")
    rng = np.random.default_rng(7)
    # 128 x 10 floats are 5120 bytes: a 202 could not keep them.
    r = post(s, *learnable_batch(rng, 128), "&mode=eval&return=logits")
    assert r.status_code == 413 and r.json()["error"]["code"] == "logits_too_large", r.text
    assert s.metric("streamfeed_batches_rejected_total", reason="logits_too_large") == 1
    assert post(s, *learnable_batch(rng, 64), "&mode=eval&return=logits").status_code == 200


SEG_SPEC = {"input": [3, 32, 32], "classes": 1024, "layers": [{"type": "conv2d", "name": "head", "out": 1024, "k": 1}]}


def seg_logits_server(start_server, *flags):
    """A server whose eval logits are 28 MiB a batch of 7 (4 MiB a sample),
    and which may hold 2 x 8 x 4 MiB = 64 MiB of replies not yet read."""
    return start_server("--model.spec", json.dumps(SEG_SPEC), "--pipeline.backend", "ref", "--augment.pipeline",
                        "[]", "--augment.eval_pipeline", "[]", "--ring.slots", "2", "--ring.slot_bytes",
                        str(4 << 20), *flags)


def seg_body(rng):
    return st_save({"images": rng.integers(0, 256, (7, 32, 32, 3), dtype=np.uint8),
                    "labels": rng.integers(0, 256, (7, 32, 32), dtype=np.uint8)})


def test_logits_replies_nobody_reads_hold_a_bounded_total_then_logits_busy(start_server):
    # A segmentation model's logits are classes x 4 bytes a pixel: here 4 MiB
    # a sample, 28 MiB for a batch of 7 (21 KB of pixels), held from the
    # batch's commit until its client has read the reply. With 2 ring slots
    # of 4 MiB unread replies may hold 2 x 8 x 4 MiB = 64 MiB, as transforms'
    # do: two fit, the others get 503 (Retry-After) instead of each holding
    # 28 MiB more for as long as its client stays connected.
    s = seg_logits_server(start_server)
    body = seg_body(np.random.default_rng(3))
    conns, statuses = post_unread(s.port, "/v1/batches?mode=eval&return=logits&wait=1", body, 5)
    assert sorted(statuses) == [200] * 2 + [503] * 3, statuses
    assert s.metric("streamfeed_batches_rejected_total", reason="logits_busy") == 3
    for k in conns:
        k.close()  # replies dropped unread: their bytes are let go
    wait_until(lambda: s.request("POST", "/v1/batches?wait=1&mode=eval&return=logits", data=body,
                                 headers=SAFETENSORS).status_code == 200, 60,
               what="a logits reply once the unread replies are gone")


def test_logits_kept_after_their_wait_ran_out_do_not_count_as_unread_replies(start_server):
    # A 202 hands its logits to the kept store, bounded by eval.logits_keep_*
    # (256 MiB here). They used to count against the unread replies' 64 MiB
    # until evicted too, so three timed-out waits made every later
    # return=logits batch 503 logits_busy for eval.logits_keep_s.
    s = seg_logits_server(start_server, "--pipeline.wait_timeout_ms", "0")
    body = seg_body(np.random.default_rng(4))
    ids = []
    for _ in range(4):
        r = s.request("POST", "/v1/batches?mode=eval&return=logits&wait=1", data=body, headers=SAFETENSORS)
        assert r.status_code == 202 and r.json()["logits"] == "kept", r.text
        ids.append(r.json()["id"])
    assert s.metric("streamfeed_batches_rejected_total", reason="logits_busy") == 0
    assert s.patch_config({"pipeline": {"wait_timeout_ms": 60000}}).status_code == 200
    for i in ids:
        assert s.get(f"/v1/batches/{i}/logits?wait=1").status_code == 200


def test_a_logits_reply_whose_client_went_away_while_it_waited_no_longer_counts_as_unread(start_server):
    # A small segmentation model: 8 KiB of logits a sample, 768 KiB for 96,
    # from 24 KiB of input; 4 ring slots of 64 KiB let unread replies hold
    # 4 x 8 x 64 KiB = 2 MiB: two fit, a third does not. A diagnose pauses
    # training, so the two wait for their batches. Their clients leave: the
    # waits were not looked at until their 60 s timeout, and the 202 that
    # ended them kept the logits, so the bound stayed taken for that long.
    spec = {"input": [3, 8, 8], "classes": 32, "layers": [{"type": "conv2d", "name": "head", "out": 32, "k": 1}]}
    s = start_server("--model.spec", json.dumps(spec), "--pipeline.backend", "ref", "--augment.pipeline", "[]",
                     "--augment.eval_pipeline", "[]", "--ring.slots", "4", "--ring.slot_bytes", str(64 << 10),
                     "--model.max_batch", "96", "--diagnose.max_seconds", "30")
    rng = np.random.default_rng(6)
    body = st_save({"images": rng.integers(0, 256, (96, 8, 8, 3), dtype=np.uint8),
                    "labels": rng.integers(0, 32, (96, 8, 8), dtype=np.uint8)})
    diag = json.dumps({"seconds": 30}).encode()
    d = socket.create_connection(("127.0.0.1", s.port))
    d.sendall(b"POST /v1/diagnose HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(diag), diag))
    wait_until(lambda: s.get("/v1/stats").json()["diagnose"]["running"], 10, what="the diagnose to start")
    path = "/v1/batches?mode=eval&return=logits&wait=1"
    waiting = []
    for _ in range(2):
        k = socket.create_connection(("127.0.0.1", s.port))
        k.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/vnd.safetensors\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        waiting.append(k)
    wait_until(lambda: s.get("/v1/batches/2").status_code == 200, 10, what="both batches accepted")
    r = s.request("POST", path, data=body, headers=SAFETENSORS)
    assert (r.status_code, r.json()["error"]["code"]) == (503, "logits_busy"), r.text
    for k in waiting:
        k.close()
    wait_until(lambda: s.metric("streamfeed_http_requests_total", route="batches", code="499") == 2, 10,
               what="both waits ended as their clients left")
    assert s.patch_config({"pipeline": {"wait_timeout_ms": 0}}).status_code == 200
    r = s.request("POST", path, data=body, headers=SAFETENSORS)
    assert r.status_code == 202 and r.json()["logits"] == "kept", r.text
    d.close()  # the diagnose stops too, and the three batches run
    assert s.patch_config({"pipeline": {"wait_timeout_ms": 60000}}).status_code == 200
    assert s.get(f"/v1/batches/{r.json()['id']}/logits?wait=1").status_code == 200
    assert s.metric("streamfeed_batches_rejected_total", reason="logits_busy") == 1


def overflowing_checkpoint(s):
    """The server's checkpoint with every fc weight at 3e38 and every bias at
    0: a batch with any positive feature overflows the logits (a NaN loss),
    while an all-zero batch has zero features and finite logits (the bias)."""
    sd, _ = state(s)
    w = next(k for k, v in sd.items() if v.shape == (10, 512) and not k.startswith("optim"))
    out = {}
    for k, v in sd.items():
        v = v.copy()
        if k == w:
            v[:] = 3e38
        elif k.endswith(".bias") and not k.startswith("optim"):
            v[:] = 0
        out[k] = v
    return st_save(out)


def test_a_non_finite_step_is_skipped_and_the_next_batch_trains(start_server):
    s = start_server(*SCALED)
    rng = np.random.default_rng(5)
    train(s, *learnable_batch(rng, 4))
    r = s.request("PUT", "/v1/checkpoint", data=overflowing_checkpoint(s), headers=SAFETENSORS)
    assert r.status_code == 200, r.text
    before, step = state(s)
    x, y = learnable_batch(rng, 4)
    bad = train(s, x, y)
    assert bad["skipped"] == "nonfinite" and bad["step"] == 1 and bad["loss"] is None
    after, step_after = state(s)
    assert step_after == step
    for k in before:
        assert np.array_equal(before[k], after[k]), k
    assert s.metric("streamfeed_steps_skipped_total", reason="nonfinite") == 1
    zeros = np.zeros((4, 32, 32, 3), np.uint8)
    ok = train(s, zeros, y)
    assert ok["skipped"] is None and ok["step"] == 2 and math.isfinite(ok["loss"])


def test_consecutive_skipped_steps_turn_readyz_false_as_diverged_until_a_step_trains(start_server):
    s = start_server(*SCALED, "--train.max_nonfinite_in_row", "3")
    rng = np.random.default_rng(6)
    train(s, *learnable_batch(rng, 4))
    good = s.get("/v1/checkpoint").content
    assert s.request("PUT", "/v1/checkpoint", data=overflowing_checkpoint(s), headers=SAFETENSORS).status_code == 200
    for i in range(3):
        assert s.get("/readyz").status_code == 200, i
        assert train(s, *learnable_batch(rng, 4))["skipped"] == "nonfinite"
    r = s.get("/readyz")
    assert r.status_code == 503 and any(m.startswith("diverged") for m in r.json()["reasons"]), r.text
    # A checkpoint restore clears it.
    assert s.request("PUT", "/v1/checkpoint", data=good, headers=SAFETENSORS).status_code == 200
    assert s.get("/readyz").status_code == 200
    # So does a step that trains again.
    assert s.request("PUT", "/v1/checkpoint", data=overflowing_checkpoint(s), headers=SAFETENSORS).status_code == 200
    for _ in range(3):
        train(s, *learnable_batch(rng, 4))
    assert s.get("/readyz").status_code == 503
    train(s, np.zeros((4, 32, 32, 3), np.uint8), np.zeros(4, np.int64))
    assert s.get("/readyz").status_code == 200


def fc_step(s, rng, extra):
    """One SGD step (lr 1, no momentum) from the same start with the given
    flags; returns (parameters before, after, the pre-clip norm histogram sum)."""
    srv = s(*TINY, "--optim.lr", "1", *extra)
    p0, _ = state(srv)
    train(srv, *learnable_batch(np.random.default_rng(7), 8))
    p1, _ = state(srv)
    return p0, p1, srv.metric("streamfeed_grad_norm_sum")


def test_clipping_with_a_tiny_max_norm_scales_the_step_by_the_clip_coefficient(start_server):
    p0, p1, norm = fc_step(start_server, None, [])
    _, c1, norm_c = fc_step(start_server, None, ["--optim.clip_grad_norm", "0.001"])
    assert norm > 0 and math.isclose(norm, norm_c, rel_tol=1e-9)  # the pre-clip norm
    coef = np.float32(0.001) / (np.float32(norm) + np.float32(1e-6))
    # The unclipped update is the gradient (lr 1): its norm is the one reported.
    g = {k: p0[k] - p1[k] for k in p0 if not k.startswith("optim")}
    assert math.isclose(math.sqrt(sum(float((v.astype(np.float64) ** 2).sum()) for v in g.values())), norm,
                        rel_tol=1e-4)
    for k, gk in g.items():
        want = p0[k] - gk * coef
        assert np.allclose(c1[k], want, rtol=0, atol=1e-6 * np.abs(p0[k]).max() + 1e-9), k


def test_label_smoothing_loss_matches_the_cross_entropy_formula(start_server):
    s = start_server(*TINY, "--loss.label_smoothing", "0.2")
    rng = np.random.default_rng(8)
    x, y = learnable_batch(rng, 6)
    logits = st_load(post(s, x, y, "&mode=eval&return=logits").content)["logits"]
    e = evaluate(s, x, y)
    assert math.isclose(e["loss"], softmax_xent(logits, y, 0.2), rel_tol=1e-5)
    assert not math.isclose(e["loss"], softmax_xent(logits, y, 0.0), rel_tol=1e-3)
    # Hot: a PATCH applies to the next batch.
    assert s.patch_config({"loss": {"label_smoothing": 0}}).status_code == 200
    assert math.isclose(evaluate(s, x, y)["loss"], softmax_xent(logits, y, 0.0), rel_tol=1e-5)


def test_the_tiny_preset_trains_32x32_batches_with_no_other_flag(start_server):
    s = start_server("--model.preset", "tiny", "--pipeline.backend", "ref")
    rng = np.random.default_rng(9)
    reply = train(s, *learnable_batch(rng, 8))
    assert reply["step"] == 1 and math.isfinite(reply["loss"])
    assert evaluate(s, *learnable_batch(rng, 4))["kind"] == "eval"


def test_a_random_op_in_the_eval_pipeline_is_refused_at_start_naming_the_option():
    import os
    import subprocess
    from sfharness import BIN
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMFEED_")}
    p = subprocess.run([BIN, "--http.port", "0", *TINY, "--augment.eval_pipeline",
                        '[{"op":"horizontal_flip","p":0.5}]'], capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "augment.eval_pipeline" in p.stderr and "deterministic" in p.stderr


def test_a_bad_mode_is_refused_with_valid_json_whatever_its_bytes(start_server):
    s = start_server(*TINY)
    x, y = learnable_batch(np.random.default_rng(10), 2)
    r = s.request("POST", "/v1/batches?mode=%FF%FEval", data=st_body(x, y), headers=SAFETENSORS)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "bad_query" and "??val" in r.json()["error"]["message"]
