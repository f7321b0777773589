"""DELETE /v1/evals/{name} through the real server on the CPU reference
backend: a finished evaluation is forgotten (its aggregates, its place among
eval.max_names, its metric series), so a service that runs one named
evaluation per epoch is never refused a name; a name made again starts from
zero; a name whose accepted batches have not all finished is kept (409
eval_busy), since a 202 promised that they count towards it; a batch that
fails still ends; the token guards it like every other write."""
import json
import threading

import numpy as np

from sfharness import jpeg_body, learnable_batch, learnable_jpeg_batch, st_body, wait_until

SAFETENSORS = {"Content-Type": "application/vnd.safetensors"}
AUG = '[{"op":"to_dtype","scale":0.00392157},{"op":"normalize","mean":[0.5],"std":[0.25]}]'
TINY = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", AUG, "--model.seed", "1"]
EVAL_FAMILIES = ("streamfeed_eval_loss", "streamfeed_eval_accuracy", "streamfeed_eval_samples_total")


def post_eval(s, images, labels, name, wait=True, headers=None):
    q = "?mode=eval&eval=" + name + ("&wait=1" if wait else "")
    return s.request("POST", "/v1/batches" + q, data=st_body(images, labels), headers={**SAFETENSORS, **(headers or {})})


def evaluate(s, images, labels, name, headers=None):
    r = post_eval(s, images, labels, name, headers=headers)
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    return r.json()


def delete(s, name, **kw):
    return s.request("DELETE", f"/v1/evals/{name}", **kw)


def error_code(r):
    return r.json()["error"]["code"]


def series_of(s, name):
    """The eval metric lines labelled with this evaluation's name."""
    return [line for line in s.metrics_text().splitlines()
            if line.startswith(EVAL_FAMILIES) and f'eval="{name}"' in line]


def test_deleting_a_finished_evaluation_frees_its_place_for_a_new_name(start_server):
    s = start_server(*TINY, "--eval.max_names", "2")
    x, y = learnable_batch(np.random.default_rng(1), 4)
    evaluate(s, x, y, "epoch-1")
    evaluate(s, x, y, "epoch-1")
    evaluate(s, x, y, "epoch-2")
    r = post_eval(s, x, y, "epoch-3")
    assert r.status_code == 409 and error_code(r) == "too_many_evals", r.text
    before = s.get("/v1/evals/epoch-1").json()

    r = delete(s, "epoch-1")
    assert r.status_code == 200, r.text
    assert r.json() == before and r.json()["batches"] == 2 and r.json()["samples"] == 8
    g = s.get("/v1/evals/epoch-1")
    assert g.status_code == 404 and error_code(g) == "eval_not_found", g.text
    assert [e["name"] for e in s.get("/v1/evals").json()["evals"]] == ["epoch-2"]

    evaluate(s, x, y, "epoch-3")
    assert [e["name"] for e in s.get("/v1/evals").json()["evals"]] == ["epoch-2", "epoch-3"]
    # Full again: the next name waits for the next delete.
    r = post_eval(s, x, y, "epoch-4")
    assert r.status_code == 409 and error_code(r) == "too_many_evals", r.text
    assert delete(s, "epoch-2").status_code == 200
    evaluate(s, x, y, "epoch-4")


def test_names_left_idle_for_eval_name_idle_s_make_room_for_a_new_one_least_recently_used_first(start_server):
    # A client that named eval.max_names evaluations and left locked every
    # new name out (409 too_many_evals) until someone holding the token
    # deleted them, or a restart.
    s = start_server(*TINY, "--eval.max_names", "3")
    x, y = learnable_batch(np.random.default_rng(5), 2)
    for name in ("bogus-1", "bogus-2", "bogus-3"):
        evaluate(s, x, y, name)
    r = post_eval(s, x, y, "mine")
    assert r.status_code == 409 and error_code(r) == "too_many_evals", r.text  # used within 300 s
    assert s.get("/v1/evals/bogus-1").status_code == 200  # a read is a use
    assert s.patch_config({"eval": {"name_idle_s": 1}}).status_code == 200
    # bogus-2 is the least recently used once a second has passed.
    wait_until(lambda: post_eval(s, x, y, "mine").status_code == 200, 10, what="a name evicted for mine")
    assert [e["name"] for e in s.get("/v1/evals").json()["evals"]] == ["bogus-1", "bogus-3", "mine"]
    assert s.get("/v1/evals/bogus-2").status_code == 404 and series_of(s, "bogus-2") == []
    assert s.metric("streamfeed_evals_evicted_total") == 1
    assert s.metric("streamfeed_batches_rejected_total", reason="too_many_evals") >= 1
    assert "evaluation \"bogus-2\" evicted" in s.stderr()


def test_unknown_and_malformed_names_get_stable_codes(start_server):
    s = start_server(*TINY)
    r = delete(s, "nobody")
    assert r.status_code == 404 and error_code(r) == "eval_not_found", r.text
    for bad in ("no%20spaces", "e" * 65, "semi%3Bcolon"):
        r = delete(s, bad)
        assert r.status_code == 400 and error_code(r) == "bad_eval_name", (bad, r.text)
    x, y = learnable_batch(np.random.default_rng(2), 2)
    evaluate(s, x, y, "once")
    assert delete(s, "once").status_code == 200
    r = delete(s, "once")
    assert r.status_code == 404 and error_code(r) == "eval_not_found", r.text
    assert s.metric("streamfeed_http_requests_total", route="eval", code="404") >= 2


def test_a_deleted_evaluation_leaves_the_metrics_and_a_new_one_of_that_name_starts_from_zero(start_server):
    s = start_server(*TINY)
    rng = np.random.default_rng(3)
    evaluate(s, *learnable_batch(rng, 6), "holdout")
    evaluate(s, *learnable_batch(rng, 2), "other")
    assert s.metric("streamfeed_eval_samples_total", eval="holdout") == 6
    assert len(series_of(s, "holdout")) == 4  # loss, top-1, top-5, samples

    assert delete(s, "holdout").status_code == 200
    assert series_of(s, "holdout") == []
    # The other evaluation's series stay as they were.
    assert s.metric("streamfeed_eval_samples_total", eval="other") == 2
    assert len(series_of(s, "other")) == 4

    b = evaluate(s, *learnable_batch(rng, 3), "holdout")
    assert s.metric("streamfeed_eval_samples_total", eval="holdout") == 3
    assert abs(s.metric("streamfeed_eval_loss", eval="holdout") - b["loss"]) <= 1e-6 * abs(b["loss"])
    assert abs(s.metric("streamfeed_eval_accuracy", eval="holdout", k="1") - b["top1"]) < 1e-9
    g = s.get("/v1/evals/holdout").json()
    assert g["batches"] == 1 and g["samples"] == 3 and g["failed_batches"] == 0


def test_delete_needs_the_token_when_one_is_set(start_server):
    s = start_server(*TINY, "--http.token", "t0ken")
    auth = {"Authorization": "Bearer t0ken"}
    x, y = learnable_batch(np.random.default_rng(4), 2)
    evaluate(s, x, y, "guarded", headers=auth)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = delete(s, "guarded", headers=headers)
        assert r.status_code == 401 and error_code(r) == "unauthorized", r.text
        assert r.headers.get("WWW-Authenticate") == "Bearer"
    assert s.get("/v1/evals/guarded").status_code == 401  # reads need it too
    assert s.get("/v1/evals/guarded", headers=auth).status_code == 200
    r = delete(s, "guarded", headers=auth)
    assert r.status_code == 200 and r.json()["name"] == "guarded", r.text


def diagnose_in_background(s, seconds):
    """Training pauses while a diagnose runs (it is an engine command):
    batches accepted meanwhile wait in the ring, accepted and unfinished."""
    out = {}

    def run():
        out["r"] = s.request("POST", "/v1/diagnose", data=json.dumps({"seconds": seconds}),
                             headers={"Content-Type": "application/json"}, timeout=120)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_until(lambda: s.get("/v1/stats").json()["diagnose"]["running"] or "r" in out, 10,
               what="the diagnose to start")
    assert "r" not in out, out["r"].text
    return t, out


def test_a_name_with_accepted_batches_not_yet_finished_is_kept_with_eval_busy(start_server):
    s = start_server(*TINY)
    rng = np.random.default_rng(5)
    x, y = learnable_batch(rng, 4)
    evaluate(s, x, y, "epoch")
    t, out = diagnose_in_background(s, 1.5)
    ids = []
    for _ in range(2):
        r = post_eval(s, x, y, "epoch", wait=False)
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    assert [s.batch(i)["state"] for i in ids] == ["queued", "queued"]

    r = delete(s, "epoch")
    assert s.get("/v1/stats").json()["diagnose"]["running"], "the diagnose ended before the DELETE"
    assert r.status_code == 409 and error_code(r) == "eval_busy", r.text
    assert "2 accepted batches not yet finished" in r.json()["error"]["message"], r.text
    assert r.headers.get("Retry-After") == "1"
    # Refused, it changed nothing: the evaluation and its series are there,
    # and GET says what the DELETE waits for.
    g = s.get("/v1/evals/epoch").json()
    assert g["batches"] == 1 and g["pending_batches"] == 2, g
    assert s.metric("streamfeed_eval_samples_total", eval="epoch") == 4

    t.join(60)
    assert out["r"].status_code == 200, out["r"].text
    for i in ids:
        assert s.wait_batch(i)["state"] == "done"
    # The promise kept: both batches counted before the name went.
    assert s.get("/v1/evals/epoch").json()["pending_batches"] == 0
    r = delete(s, "epoch")
    assert r.status_code == 200, r.text
    assert r.json()["batches"] == 3 and r.json()["samples"] == 12 and r.json()["pending_batches"] == 0


def test_an_eval_batch_that_fails_after_it_was_accepted_still_ends(start_server):
    # A JPEG whose header is valid (accepted: 202) and whose scan data is
    # cut short fails in the engine with decode.on_undecodable fail: it
    # counts as a failed batch of its evaluation and is no longer pending.
    s = start_server(*TINY, "--decode.on_undecodable", "fail")
    rng = np.random.default_rng(6)
    files, labels = learnable_jpeg_batch(rng, 3)
    sos = files[1].index(b"\xff\xda")
    files[1] = files[1][: sos + 40] + b"\xff\xd9"
    r = s.request("POST", "/v1/batches?mode=eval&eval=broken", data=jpeg_body(files, labels), headers=SAFETENSORS)
    assert r.status_code == 202, r.text
    assert s.wait_batch(r.json()["id"])["state"] == "failed"
    r = delete(s, "broken")
    assert r.status_code == 200, r.text
    assert r.json()["failed_batches"] == 1 and r.json()["batches"] == 0
