"""Batch ingestion through the real HTTP path: accepted batches and their
state, every way a body can be wrong, the full ring (block, reject, timeout),
clients that go away, the accounting invariant, and the reference loader."""
import json
import os
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

from sfharness import (LOAD_BIN, SINK, TINY, key, learnable_batch, random_batch, raw_body, read_reply,
                      st_body, tensor_header, wait_until)

N, IMG = 2, 2 * 32 * 32 * 3  # the crafted bodies: 2 images of 32x32x3, I64 labels
LAB = N * 8


def good_body(rng, n=2):
    return st_body(*random_batch(rng, n))


# ---- accepted batches --------------------------------------------------------------


def test_a_batch_written_by_safetensors_is_accepted_and_reaches_done_in_sink_mode(start_server, rng):
    s = start_server(SINK, "--ring.slots", "4")
    body_bytes = st_body(*random_batch(rng, 3))
    r = s.post_batch(body_bytes)
    assert r.status_code == 202, r.text
    body = r.json()
    assert isinstance(body["id"], int) and body["id"] >= 1
    assert body["ring"]["slots"] == 4 and 0 <= body["ring"]["free"] <= 4
    assert body["queued"] >= 0
    b = s.wait_batch(body["id"])
    assert b["state"] == "done"
    assert b["id"] == body["id"] and b["kind"] == "train" and b["n"] == 3
    assert b["error"] is None
    m = s.metrics()
    assert m[key("streamfeed_batches_received_total", status="accepted")] == 1
    assert m[key("streamfeed_batches_finished_total", status="done")] == 1
    assert m[key("streamfeed_received_bytes_total")] == len(body_bytes)


def test_a_batch_is_trained_and_reports_loss_accuracy_and_timings_in_train_mode(start_server, rng):
    s = start_server(TINY)
    images, labels = random_batch(rng, 4)
    r = s.post_arrays(images, labels)
    assert r.status_code == 202, r.text
    b = s.wait_batch(r.json()["id"])
    assert b["state"] == "done", b
    assert b["kind"] == "train" and b["n"] == 4 and b["step"] == 1
    assert np.isfinite(b["loss"]) and b["loss"] > 0
    assert 0 <= b["accuracy"] <= 1
    assert set(b["timings"]) >= {"queue_s", "h2d_s", "transform_s", "step_s"}
    assert b["timings"]["step_s"] > 0
    m = s.metrics()
    assert m[key("streamfeed_steps_total")] == 1
    assert m[key("streamfeed_samples_trained_total")] == 4
    assert m[key("streamfeed_loss")] == pytest.approx(b["loss"])


def test_labels_may_be_int32_or_uint8_and_images_nchw(start_server, rng):
    s = start_server(TINY)
    images, labels = random_batch(rng, 2)
    for body in (st_body(images, labels.astype(np.int32)), st_body(images, labels.astype(np.uint8)),
                 st_body(images.transpose(0, 3, 1, 2), labels, layout="NCHW")):
        r = s.post_batch(body, wait=True)
        assert r.status_code == 200 and r.json()["state"] == "done", r.text


def test_a_chunked_upload_without_content_length_is_accepted(start_server, rng):
    s = start_server(TINY)
    body = good_body(rng)

    def chunks():
        for i in range(0, len(body), 1000):
            yield body[i:i + 1000]

    r = s.post_batch(chunks())
    assert r.status_code == 202, r.text
    assert s.wait_batch(r.json()["id"])["state"] == "done"
    assert s.metric("streamfeed_received_bytes_total") == len(body)


def test_batch_ids_increase_from_one(start_server, rng):
    s = start_server(SINK)
    ids = [s.post_batch(good_body(rng)).json()["id"] for _ in range(5)]
    assert ids == list(range(1, 6))


def test_wait_1_returns_the_finished_batch(start_server, rng):
    s = start_server(TINY)
    r = s.post_arrays(*random_batch(rng, 2), wait=True)
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["state"] == "done" and b["step"] == 1 and np.isfinite(b["loss"])
    assert s.batch(b["id"]) == b


def test_wait_1_answers_202_with_the_state_so_far_when_the_wait_times_out(start_server, rng):
    s = start_server(TINY, "--pipeline.wait_timeout_ms", "0")
    # A batch queued behind a big one (tens of ms of training) is not done
    # when its zero-length wait ends.
    s.post_arrays(*learnable_batch(rng, 256))
    r = s.post_arrays(*random_batch(rng, 2), wait=True)
    assert r.status_code == 202, r.text
    assert r.json()["state"] in ("queued", "transforming", "training")
    assert s.wait_batch(r.json()["id"])["state"] == "done"


def test_results_older_than_jobs_max_are_evicted_and_answer_404(start_server, rng):
    # jobs_max must be at least 2*ring.slots+64: 68 with two slots.
    s = start_server(SINK, "--ring.slots", "2", "--pipeline.jobs_max", "68")
    body = good_body(rng)
    ids = [s.post_batch(body).json()["id"] for _ in range(71)]
    assert ids[-1] == 71
    s.wait_batch(71)
    for old in (1, 2, 3):
        r = s.get(f"/v1/batches/{old}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "batch_not_found"
    assert s.batch(4)["state"] == "done"


def test_hot_limits_apply_to_the_next_upload(start_server, rng):
    s = start_server(SINK)
    body = good_body(rng)
    assert s.post_batch(body).status_code == 202
    assert s.patch_config({"limits": {"max_h": 16}}).json()["applied"] == ["limits.max_h"]
    r = s.post_batch(body)
    assert r.status_code == 422 and r.json()["error"]["code"] == "image_too_large"
    assert s.patch_config({"limits": {"max_h": None}}).status_code == 200
    assert s.post_batch(body).status_code == 202


# ---- bad bodies ------------------------------------------------------------------


def _hdr(**kw):
    return tensor_header(N, **kw)


def _with(mutate):
    """A crafted body whose header dict `mutate` edits (data stays valid)."""
    h, nbytes = _hdr()
    mutate(h)
    return raw_body(h, bytes(nbytes))


def _label_body(values, dtype=np.int64):
    images = np.zeros((len(values), 32, 32, 3), np.uint8)
    return st_body(images, np.array(values, dtype=dtype))


def _set(path, value):
    def m(h):
        d = h
        for p in path[:-1]:
            d = d[p]
        d[path[-1]] = value
    return m


BAD_BODIES = [
    ("header_length_below_two", lambda: raw_body(b"", header_len=0, pad=False), 400, "header_length_invalid"),
    ("header_length_larger_than_the_body",
     lambda: raw_body(_hdr()[0], b"", header_len=20000), 400, "body_too_short"),
    ("header_length_larger_than_the_limit",
     lambda: raw_body(_hdr()[0], bytes(IMG + LAB), header_len=10**6), 413, "header_too_large"),
    ("header_not_json", lambda: raw_body("{not json at all}"), 400, "header_not_json"),
    ("header_not_an_object", lambda: raw_body("[1, 2, 3]"), 400, "header_not_object"),
    ("header_nested_too_deep", lambda: raw_body('{"images":{"shape":[[[[1]]]]}}'), 400, "header_too_deep"),
    ("header_with_a_duplicate_tensor",
     lambda: raw_body(json.dumps(_hdr()[0])[:-1] + ',"images":' + json.dumps(_hdr()[0]["images"]) + "}",
                      bytes(IMG + LAB)), 400, "duplicate_key"),
    ("header_with_an_unknown_tensor",
     lambda: _with(_set(["extra"], {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]})), 400, "unknown_tensor"),
    ("unknown_dtype", lambda: _with(_set(["images", "dtype"], "Q9")), 400, "unknown_dtype"),
    ("float_images", lambda: _with(_set(["images", "dtype"], "F32")), 400, "unsupported_dtype"),
    ("float_labels", lambda: _with(_set(["labels", "dtype"], "F64")), 400, "unsupported_dtype"),
    ("negative_dimension", lambda: _with(_set(["images", "shape"], [2, -32, 32, 3])), 400, "bad_shape"),
    ("no_channel_dimension", lambda: _with(_set(["images", "shape"], [2, 32, 32, 2])), 400, "bad_layout"),
    ("shape_times_dtype_is_not_the_byte_range",
     lambda: _with(_set(["labels", "data_offsets"], [IMG, IMG + LAB + 8])), 400, "shape_size_mismatch"),
    ("offsets_that_begin_after_they_end",
     lambda: _with(_set(["labels", "data_offsets"], [IMG + LAB, IMG])), 400, "bad_offsets"),
    ("offsets_out_of_bounds_of_json_integers",
     lambda: _with(_set(["labels", "data_offsets"], [IMG, 2**60])), 400, "bad_offsets"),
    ("overlapping_offsets",
     lambda: _with(_set(["labels", "data_offsets"], [IMG - 8, IMG - 8 + LAB])), 400, "offsets_overlap"),
    ("offsets_with_a_hole",
     lambda: _with(_set(["labels", "data_offsets"], [IMG + 8, IMG + 8 + LAB])), 400, "data_not_contiguous"),
    ("missing_images", lambda: _with(lambda h: h.pop("images")), 400, "missing_images"),
    ("missing_labels",
     lambda: raw_body({"images": _hdr()[0]["images"]}, bytes(IMG)), 400, "missing_labels"),
    ("more_labels_than_images",
     lambda: raw_body({"images": _hdr()[0]["images"],
                       "labels": {"dtype": "I64", "shape": [3], "data_offsets": [IMG, IMG + 24]}},
                      bytes(IMG + 24)), 400, "label_count_mismatch"),
    ("image_taller_than_limits_max_h", lambda: st_body(np.zeros((1, 65, 32, 3), np.uint8), np.zeros(1, np.int64)),
     422, "image_too_large"),
    ("batch_larger_than_limits_max_n", lambda: st_body(*random_batch(np.random.default_rng(0), 17)),
     422, "batch_too_large"),
    ("label_equal_to_the_class_count", lambda: _label_body([3, 10]), 422, "label_out_of_range"),
    ("negative_label", lambda: _label_body([-1, 0]), 422, "label_out_of_range"),
    ("uint8_label_out_of_range", lambda: _label_body([0, 255], np.uint8), 422, "label_out_of_range"),
    ("body_longer_than_the_header_says", lambda: good_body(np.random.default_rng(0)) + b"\x00", 400, "body_too_long"),
    ("body_shorter_than_the_header_says", lambda: good_body(np.random.default_rng(0))[:-1], 400, "body_too_short"),
    ("body_cut_inside_the_length", lambda: b"\x10\x00\x00", 400, "body_too_short"),
    ("empty_body", lambda: b"", 400, "body_empty"),
    ("images_of_another_size_than_the_model_takes",
     lambda: st_body(np.zeros((1, 16, 16, 3), np.uint8), np.zeros(1, np.int64)), 422, "shape_mismatch"),
    ("per_pixel_labels_for_a_classifier",
     lambda: st_body(np.zeros((1, 32, 32, 3), np.uint8), np.zeros((1, 32, 32), np.int64)),
     422, "labels_shape_unsupported"),
]


@pytest.fixture(scope="module")
def strict_server(module_server_factory):
    return module_server_factory(TINY, "--limits.max_h", "64", "--limits.max_n", "16", "--ring.slots", "4")


@pytest.mark.parametrize("name,make,status,code", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_body_gets_its_own_code_and_reason_and_the_next_good_batch_is_accepted(
        strict_server, rng, name, make, status, code):
    s = strict_server
    before = s.metrics()
    r = s.post_batch(make())
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code, r.text
    assert r.json()["error"]["message"]
    after = s.metrics()

    def delta(k):
        return after.get(k, 0) - before.get(k, 0)

    assert delta(key("streamfeed_batches_rejected_total", reason=code)) == 1
    assert delta(key("streamfeed_batches_received_total", status="rejected")) == 1
    assert delta(key("streamfeed_batches_received_total", status="accepted")) == 0
    assert delta(key("streamfeed_http_errors_total", code=code)) == 1
    # The slot (if one was taken) is back, and the service goes on.
    assert after[key("streamfeed_ring_slots", state="filling")] == 0
    ok = s.post_arrays(*random_batch(rng, 2), wait=True)
    assert ok.status_code == 200 and ok.json()["state"] == "done", ok.text


def test_wrong_content_type_gets_415_and_the_next_batch_is_accepted(start_server, rng):
    s = start_server(SINK)
    body = good_body(rng)
    for ct in ("text/plain", "application/json", None):
        r = s.post_batch(body, content_type=ct)
        assert r.status_code == 415, (ct, r.text)
        assert r.json()["error"]["code"] == "unsupported_media_type"
    assert s.post_batch(body, content_type="application/octet-stream").status_code == 202
    assert s.post_batch(body, content_type="application/vnd.safetensors; charset=binary").status_code == 202


def test_uploads_rejected_by_the_http_layer_are_counted_as_rejected_batches(start_server, rng):
    s = start_server(SINK, "--ring.slot_bytes", "4096")
    s.post_batch(good_body(rng, 1), content_type="text/plain")
    sock = s.connect()
    sock.sendall(b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/vnd.safetensors\r\n"
                 b"Content-Length: 1000000000\r\n\r\n")
    assert read_reply(sock).status_code == 413
    sock.close()
    m = s.metrics()
    assert m.get(key("streamfeed_batches_rejected_total", reason="unsupported_media_type"), 0) == 1
    assert m.get(key("streamfeed_batches_rejected_total", reason="body_too_large"), 0) == 1
    assert m[key("streamfeed_batches_received_total", status="rejected")] == 2


def test_the_default_slot_holds_one_raw_batch_of_model_max_batch(start_server, rng):
    """ring.slot_bytes 0 (the default) sizes a slot from the model: ResNet-18's
    224x224x3 at model.max_batch 512 is 73.5 MiB of pixels and int64 labels, so
    74 MiB, and a batch over the old fixed 64 MiB is taken; a small model keeps
    64 MiB; a size given is kept as it is."""
    big = start_server(SINK, "--model.preset", "resnet18", "--model.max_batch", "512")
    assert big.config()["ring"]["slot_bytes"] == 74 << 20
    body = st_body(*random_batch(rng, 460, 224, 224))
    assert len(body) > 64 << 20
    r = big.post_batch(body)
    assert r.status_code == 202, r.text
    small = start_server(SINK)
    assert small.config()["ring"]["slot_bytes"] == 64 << 20
    given = start_server(SINK, "--model.preset", "resnet18", "--model.max_batch", "512", "--ring.slot_bytes", "4096")
    assert given.config()["ring"]["slot_bytes"] == 4096


# ---- a full ring -------------------------------------------------------------------


def _fill_ring_with_half_sent_uploads(s, body, slots):
    """Holds every slot FILLING: each upload sends its header and part of its data."""
    socks = [s.start_upload(body, len(body) - 100) for _ in range(slots)]
    wait_until(lambda: s.metric("streamfeed_ring_slots", state="filling") == slots, 10,
               what=f"{slots} slots FILLING")
    return socks


def _post_in_thread(s, body):
    out = {}

    def run():
        t0 = time.monotonic()
        out["r"] = s.post_batch(body)
        out["elapsed"] = time.monotonic() - t0

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_full_ring_with_block_policy_suspends_the_upload_then_completes_it_when_a_slot_frees(start_server, rng):
    s = start_server(SINK, "--ring.slots", "2", "--ring.full_policy", "block", "--ring.full_timeout_ms", "30000")
    body = good_body(rng)
    holders = _fill_ring_with_half_sent_uploads(s, body, 2)
    t, out = _post_in_thread(s, body)
    # While both slots are held, the third upload gets no reply...
    t.join(0.5)
    assert t.is_alive() and "r" not in out, "the upload was answered although no slot was free"
    # ...and once one upload completes and its slot is consumed, it is accepted.
    holders[0].sendall(body[len(body) - 100:])
    assert read_reply(holders[0]).status_code == 202
    t.join(10)
    assert not t.is_alive()
    assert out["r"].status_code == 202, out["r"].text
    assert s.wait_batch(out["r"].json()["id"])["state"] == "done"
    for h in holders:
        h.close()
    wait_until(lambda: s.metric("streamfeed_ring_slots", state="free") == 2, 10)


def test_full_ring_with_reject_policy_answers_429_with_retry_after(start_server, rng):
    s = start_server(SINK, "--ring.slots", "2", "--ring.full_policy", "reject", "--ring.retry_after_s", "3")
    body = good_body(rng)
    holders = _fill_ring_with_half_sent_uploads(s, body, 2)
    r = s.post_batch(body)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "ring_full"
    assert r.headers["Retry-After"] == "3"
    assert s.metric("streamfeed_batches_rejected_total", reason="ring_full") == 1
    for h in holders:
        h.close()
    wait_until(lambda: s.metric("streamfeed_ring_slots", state="free") == 2, 10)
    assert s.post_batch(body).status_code == 202


def test_full_ring_with_block_policy_answers_503_with_retry_after_once_the_timeout_passes(start_server, rng):
    s = start_server(SINK, "--ring.slots", "2", "--ring.full_policy", "block", "--ring.full_timeout_ms", "300")
    body = good_body(rng)
    holders = _fill_ring_with_half_sent_uploads(s, body, 2)
    t0 = time.monotonic()
    r = s.post_batch(body)
    elapsed = time.monotonic() - t0
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "ring_full_timeout"
    assert r.headers["Retry-After"] == "1"
    assert 0.28 <= elapsed < 3.0, elapsed
    assert s.metric("streamfeed_batches_rejected_total", reason="ring_full_timeout") == 1
    for h in holders:
        h.close()


def test_full_policy_is_hot_and_switches_block_to_reject(start_server, rng):
    s = start_server(SINK, "--ring.slots", "2", "--ring.full_timeout_ms", "30000")
    body = good_body(rng)
    holders = _fill_ring_with_half_sent_uploads(s, body, 2)
    assert s.patch_config({"ring": {"full_policy": "reject"}}).json()["applied"] == ["ring.full_policy"]
    assert s.post_batch(body).status_code == 429
    for h in holders:
        h.close()


# ---- clients that go away ----------------------------------------------------------


def test_client_that_disconnects_mid_upload_frees_its_slot_and_counts_as_aborted(start_server, rng):
    s = start_server(TINY, "--ring.slots", "2")
    body = good_body(rng)
    sock = s.start_upload(body, len(body) // 2)
    wait_until(lambda: s.metric("streamfeed_ring_slots", state="filling") == 1, 10)
    s.reset(sock)
    wait_until(lambda: s.metric("streamfeed_ring_slots", state="filling") == 0, 10, what="the slot to be freed")
    wait_until(lambda: s.metric("streamfeed_batches_rejected_total", reason="aborted") == 1, 10)
    m = s.metrics()
    assert m[key("streamfeed_ring_slots", state="free")] == 2
    assert m[key("streamfeed_batches_received_total", status="rejected")] == 1
    assert m[key("streamfeed_batches_received_total", status="accepted")] == 0
    assert m[key("streamfeed_batches_pending")] == 0
    r = s.post_batch(body, wait=True)
    assert r.status_code == 200 and r.json()["id"] == 1 and r.json()["state"] == "done"


def test_client_that_disconnects_while_waiting_for_a_slot_leaks_nothing(start_server, rng):
    s = start_server(SINK, "--ring.slots", "2", "--ring.full_timeout_ms", "30000")
    body = good_body(rng)
    holders = _fill_ring_with_half_sent_uploads(s, body, 2)
    # Header and a little data: the header is valid, no slot is free, so the
    # upload is suspended (or about to be: the outcome is the same); then its
    # client goes away, and so do the two holding slots.
    waiting = s.start_upload(body, 300, expect_continue=True)
    s.reset(waiting)
    for h in holders:
        s.reset(h)
    wait_until(lambda: s.metric("streamfeed_http_requests_total", route="batches", code="499") == 3, 10,
               what="three uploads ended by their clients")
    wait_until(lambda: s.metric("streamfeed_ring_slots", state="free") == 2, 10)
    m = s.metrics()
    assert m[key("streamfeed_ring_slots", state="filling")] == 0
    # The two that held slots are counted; the third is counted only when the
    # server had read some of its body (see the xfail test below).
    assert m[key("streamfeed_batches_rejected_total", reason="aborted")] >= 2
    assert m[key("streamfeed_batches_received_total", status="accepted")] == 0
    assert s.post_batch(body).status_code == 202


def test_client_that_disconnects_after_the_request_head_counts_as_aborted(start_server, rng):
    s = start_server(SINK)
    body = good_body(rng)
    s.reset(s.start_upload(body, 0, expect_continue=True))
    wait_until(lambda: s.metric("streamfeed_http_requests_total", route="batches", code="499") == 1, 10)
    assert s.metric("streamfeed_batches_rejected_total", reason="aborted") == 1


def test_client_whose_close_arrives_with_its_last_bytes_frees_its_slot_at_once(start_server, rng):
    s = start_server(SINK, "--ring.slots", "4")
    body = good_body(rng)
    head = (f"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/vnd.safetensors\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    for _ in range(4):
        sock = s.connect()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)  # head, data and FIN leave together
        sock.sendall(head + body[:300])
        sock.close()
    wait_until(lambda: s.metric("streamfeed_http_requests_total", route="batches", code="499") == 4, 3,
               what="the server to see four clients gone")
    assert s.metric("streamfeed_ring_slots", state="filling") == 0


# ---- reading a body in blocks (the socket's receive low-water mark) --------------


def _head(body, connection="keep-alive"):
    return (f"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/vnd.safetensors\r\n"
            f"Content-Length: {len(body)}\r\nConnection: {connection}\r\n\r\n").encode()


def test_a_body_of_several_read_blocks_and_the_next_request_on_its_connection_are_answered_at_once(
        start_server, rng):
    # The server reads an upload in blocks of up to 256 KiB; the last block of
    # this 786 KB body is smaller, and the next request's head is a few bytes.
    # Both must wake the server as soon as they are in, not after the idle
    # timeout.
    s = start_server(SINK, "--http.connection_timeout_s", "30")
    body = st_body(*random_batch(rng, 4, 256, 256))
    sock = s.connect(timeout=5)
    for _ in range(2):
        sock.sendall(_head(body) + body)
        r = read_reply(sock)
        assert r.status_code == 202, r.text
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_reply(sock).status_code == 200
    sock.close()
    assert s.metric("streamfeed_batches_received_total", status="accepted") == 2


def test_an_upload_above_the_minimum_rate_is_not_timed_out_while_it_fills_a_read_block(start_server, rng):
    # 120 KB at about 40 KB/s, above http.upload_min_bytes_per_s (16 KB/s),
    # with a 2 s idle timeout: the server must see its bytes well within 2 s,
    # so the block it waits for is bounded by that rate (16 KB here), not
    # 256 KiB (which this upload would take 3 s to fill).
    s = start_server(SINK, "--http.connection_timeout_s", "2", "--http.upload_min_bytes_per_s", "16384")
    body = st_body(*random_batch(rng, 2, 100, 200))
    sock = s.connect(timeout=10)
    sock.sendall(_head(body, "close"))
    step = 4000
    for i in range(0, len(body), step):
        sock.sendall(body[i:i + step])
        time.sleep(step / 40000)
    r = read_reply(sock)
    assert r.status_code == 202, r.text
    assert s.metric("streamfeed_batches_received_total", status="accepted") == 1


# ---- accounting -------------------------------------------------------------------


def test_after_a_burst_accepted_equals_finished_plus_pending(start_server, rng):
    s = start_server(TINY, "--ring.slots", "2", "--ring.full_timeout_ms", "60000")
    bodies = [st_body(*random_batch(rng, 8)) for _ in range(4)]
    results, errors = [], []

    def client(i):
        import requests
        with requests.Session() as sess:
            for k in range(4):
                try:
                    r = sess.post(s.url + "/v1/batches", data=bodies[(i + k) % 4],
                                  headers={"Content-Type": "application/vnd.safetensors"}, timeout=60)
                    results.append((r.status_code, r.json().get("id")))
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sorted(code for code, _ in results) == [202] * 24
    ids = sorted(i for _, i in results)
    assert ids == list(range(1, 25)), "every accepted batch has its own id, with no gap"

    def balanced():
        m = s.metrics()
        accepted = m[key("streamfeed_batches_received_total", status="accepted")]
        finished = (m[key("streamfeed_batches_finished_total", status="done")] +
                    m[key("streamfeed_batches_finished_total", status="failed")])
        pending = m[key("streamfeed_batches_pending")]
        return accepted == finished + pending and (accepted, finished, pending)

    accepted, _, _ = wait_until(balanced, 10, what="accepted == done + failed + pending")
    assert accepted == 24
    wait_until(lambda: s.metric("streamfeed_batches_pending") == 0, 60, what="the queue to drain")
    assert balanced() == (24, 24, 0)
    assert s.metric("streamfeed_steps_total") == 24
    assert s.metric("streamfeed_samples_trained_total") == 24 * 8
    assert all(s.batch(i)["state"] == "done" for i in ids)


# ---- the reference loader ---------------------------------------------------------


def test_streamfeed_load_drives_a_two_slot_ring_full_and_back_without_error(start_server):
    s = start_server(TINY, "--ring.slots", "2", "--ring.full_timeout_ms", "60000")
    seen_free = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            seen_free.append(s.metric("streamfeed_ring_slots", state="free"))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        p = subprocess.run([LOAD_BIN, "--url", s.url, "--workload", "tiny", "--batch", "64", "--batches", "16",
                            "--connections", "4", "--learnable", "--drain", "--json", "--quiet"],
                           capture_output=True, text=True, timeout=120)
    finally:
        done.set()
        watcher.join(10)
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["batches_sent"] == 16
    assert summary["accepted"] == 16
    assert summary["rejected"] == 0 and summary["failed"] == 0 and summary["errors"] == {}
    assert min(seen_free) == 0, "the ring never filled up"
    wait_until(lambda: s.metric("streamfeed_ring_slots", state="free") == 2, 30, what="the ring to empty")
    m = s.metrics()
    assert m[key("streamfeed_batches_received_total", status="accepted")] == 16
    assert m[key("streamfeed_batches_finished_total", status="done")] == 16
    assert m[key("streamfeed_steps_total")] == 16


def test_streamfeed_load_takes_a_base_url_with_a_trailing_slash(start_server):
    s = start_server(SINK)
    p = subprocess.run([LOAD_BIN, "--url", s.url + "//", "--workload", "tiny", "--batch", "8", "--batches", "3",
                        "--json", "--quiet"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["accepted"] == 3 and summary["errors"] == {}, summary


@pytest.mark.parametrize("extra, flags, code, hint", [
    ([], [], "shape_mismatch", "choose the --workload that matches it"),                 # w1 at a tiny model
    (["--http.token", "t0k"], ["--workload", "tiny"], "unauthorized", "--token or $STREAMFEED_TOKEN"),
])
def test_streamfeed_load_stops_when_its_first_batches_are_all_refused(start_server, extra, flags, code, hint):
    # Its own pools are valid bodies: when the first ones are all refused,
    # the rest would be too. It stops after max(8, 2 x connections) and says
    # why, rather than sending thousands of batches to be refused.
    s = start_server(TINY, *extra)
    p = subprocess.run([LOAD_BIN, "--url", s.url, "--batches", "500", "--connections", "2", "--json"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "STREAMFEED_TOKEN": ""})
    assert p.returncode == 1, p.stdout + p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["accepted"] == 0 and 8 <= summary["batches_sent"] <= 10, summary
    assert list(summary["errors"]) == [code], summary
    assert "the first 8 batches were all refused" in p.stderr and hint in p.stderr, p.stderr


def test_streamfeed_load_help_exits_0():
    p = subprocess.run([LOAD_BIN, "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0
    assert "--url" in p.stdout + p.stderr


# ---- known defects (strict xfail: they turn into failures once fixed) --------------


def test_sink_mode_observes_queue_wait_once_per_batch(start_server, rng):
    s = start_server(SINK)
    for _ in range(3):
        assert s.post_batch(good_body(rng), wait=True).status_code == 200
    assert s.metric("streamfeed_queue_wait_seconds_count") == 3


def test_trained_batch_reports_the_time_it_waited_in_the_queue(start_server, rng):
    s = start_server(TINY)
    b = s.post_arrays(*random_batch(rng, 2), wait=True).json()
    assert b["state"] == "done"
    assert b["timings"]["queue_s"] > 0
