"""The Python client (client/python, package ``streamfeed``) against the real
server binary: batches in every accepted form, training results, the
transform endpoint, typed errors with the server's codes, back-pressure
retries, and feed() draining a loader over several connections until the
model has learnt a learnable task."""
import socket
import threading
import time

import numpy as np
import pytest

import streamfeed
from streamfeed import (Backpressure, BadRequest, Client, FeedAborted, NotFound, RetryPolicy,
                        Unauthorized, Unprocessable, encode_batch, parse_retry_after)
from streamfeed.wire import detect_layout

# Ten well separated colours; the label of an image is the index of its colour.
PALETTE = np.array([(225, 30, 30), (30, 225, 30), (30, 30, 225), (225, 225, 30), (225, 30, 225),
                    (30, 225, 225), (225, 225, 225), (30, 30, 30), (128, 128, 128), (225, 128, 30)],
                   dtype=np.int16)


def colour_batch(rng, n=32, noise=40):
    """A learnable batch: each 32x32x3 image is one of ten colours (its label)
    plus uniform noise in [-noise, noise] per pixel and channel."""
    labels = rng.integers(0, 10, n)
    jitter = rng.integers(-noise, noise + 1, (n, 32, 32, 3), dtype=np.int16)
    images = np.clip(PALETTE[labels][:, None, None, :] + jitter, 0, 255).astype(np.uint8)
    return images, labels


def random_batch(rng, n=4, h=32, w=32, c=3):
    return rng.integers(0, 256, (n, h, w, c), dtype=np.uint8), rng.integers(0, 10, n)


def expected_pipeline(images_nhwc):
    """The TINY servers' augmentation, x/255 then (x - 0.5) / 0.25, as NCHW float32."""
    x = images_nhwc.transpose(0, 3, 1, 2).astype(np.float32)
    return (x * np.float32(0.00392157) - np.float32(0.5)) / np.float32(0.25)


def wait_until(cond, timeout=10.0, what="a condition"):
    """Polls cond() until it is true; fails the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    interval = 0.002
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
        interval = min(interval * 2, 0.1)


def metric(text, name, **labels):
    """One sample of a Prometheus text exposition (0.0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head == name and not labels or head == f"{name}{{{want}}}":
            return float(value)
    return 0.0


# ---- encoding (no server) ------------------------------------------------------------


def test_layout_is_guessed_from_the_shape():
    assert detect_layout((2, 32, 32, 3)) == "NHWC"
    assert detect_layout((2, 32, 32, 1)) == "NHWC"
    assert detect_layout((2, 3, 32, 32)) == "NCHW"
    assert detect_layout((2, 4, 16, 8)) == "NCHW"
    with pytest.raises(ValueError, match="layout"):
        detect_layout((2, 5, 32, 32))
    with pytest.raises(ValueError, match="4-d"):
        detect_layout((32, 32, 3))


def test_encode_batch_writes_uint8_images_the_smallest_labels_and_the_layout():
    images = np.zeros((2, 3, 8, 8), np.uint8)
    body = encode_batch(images, np.array([1, 2], np.int64))
    out = streamfeed.decode_tensors(body)
    assert out["images"].dtype == np.uint8 and out["images"].shape == (2, 3, 8, 8)
    assert out["labels"].dtype == np.uint8 and list(out["labels"]) == [1, 2]
    import json
    import struct
    (n,) = struct.unpack("<Q", body[:8])
    assert json.loads(body[8:8 + n])["__metadata__"] == {"layout": "NCHW"}


@pytest.mark.parametrize("values,dtype", [([0, 255], np.uint8), ([0, 256], np.int32), ([-100, 3], np.int32),
                                          ([0, 2**31], np.int64)])
def test_labels_go_in_the_smallest_dtype_that_holds_every_value(values, dtype):
    images = np.zeros((2, 8, 8, 3), np.uint8)
    out = streamfeed.decode_tensors(encode_batch(images, np.array(values, np.int64)))
    assert out["labels"].dtype == dtype and list(out["labels"]) == values
    seg = np.array(values, np.int16 if max(values) < 2**15 else np.int64).reshape(2, 1, 1) * np.ones((2, 8, 8), int)
    assert streamfeed.decode_tensors(encode_batch(images, seg))["labels"].dtype == dtype


def test_bad_inputs_are_refused_before_anything_is_sent():
    c = Client("http://127.0.0.1:9")  # nothing listens there: a request would fail differently
    ok = np.zeros((2, 32, 32, 3), np.uint8)
    with pytest.raises(TypeError, match="uint8"):
        c.post_batch(ok.astype(np.float32), [0, 1])
    with pytest.raises(TypeError, match="integer"):
        c.post_batch(ok, np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="3 labels for 2 images"):
        c.post_batch(ok, [0, 1, 2])
    with pytest.raises(ValueError, match="layout"):
        c.post_batch(np.zeros((2, 5, 7, 9), np.uint8), [0, 1])


def test_retry_delay_honours_retry_after_and_is_capped():
    p = RetryPolicy(max_retries=5, backoff_base=0.1, backoff_max=3.0)
    assert 0.05 <= p.delay(0, None) <= 0.1
    assert p.delay(0, 2.0) == 2.0            # the server's Retry-After is a floor
    assert p.delay(0, 3600.0) == 3.0         # ... within the cap
    assert p.delay(20, None) <= 3.0          # exponential, capped
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


# ---- batches ---------------------------------------------------------------------------


def test_post_batch_accepts_nhwc_numpy_and_the_batch_is_trained(module_server, rng):
    c = module_server.client()
    images, labels = random_batch(rng, 5)
    reply = c.post_batch(images, labels)
    assert isinstance(reply["id"], int) and reply["id"] >= 1
    assert reply["ring"]["slots"] >= 2 and reply["queued"] >= 0
    b = c.wait_batch(reply["id"], timeout=30)
    assert b["state"] == "done" and b["n"] == 5 and b["kind"] == "train", b
    assert np.isfinite(b["loss"]) and 0 <= b["accuracy"] <= 1


@pytest.mark.parametrize("label_dtype", [np.int64, np.int32, np.int16, np.uint8, np.uint16])
def test_post_batch_accepts_nchw_numpy_and_labels_of_any_int_dtype(module_server, rng, label_dtype):
    c = module_server.client()
    images, labels = random_batch(rng, 3)
    b = c.post_batch(images.transpose(0, 3, 1, 2), labels.astype(label_dtype), wait=True)
    assert b["state"] == "done" and b["n"] == 3, b


def test_post_batch_accepts_non_contiguous_views(module_server, rng):
    c = module_server.client()
    images, labels = random_batch(rng, 6)
    nchw = np.ascontiguousarray(images.transpose(0, 3, 1, 2))
    b = c.post_batch(nchw.transpose(0, 2, 3, 1)[::2], labels[::2], wait=True)  # NHWC view, strided
    assert b["state"] == "done" and b["n"] == 3, b


def test_wait_true_returns_the_step_loss_and_accuracy(module_server, rng):
    c = module_server.client()
    step0 = c.model()["step"]
    b = c.post_batch(*random_batch(rng, 8), wait=True)
    assert b["state"] == "done" and b["error"] is None
    assert isinstance(b["loss"], float) and b["loss"] > 0
    assert 0 <= b["accuracy"] <= 1 and b["step"] > step0
    assert b["timings"]["step_s"] > 0
    assert c.batch(b["id"]) == b


def torch_mod():
    """torch, or a named skip where tests/install_torch.sh could not install it."""
    return pytest.importorskip("torch")


def test_torch_tensors_are_accepted_in_both_layouts(module_server, rng):
    torch = torch_mod()
    c = module_server.client()
    images, labels = random_batch(rng, 4)
    t = torch.from_numpy(images)
    for imgs in (t, t.permute(0, 3, 1, 2)):  # NHWC, then an NCHW (non-contiguous) view
        b = c.post_batch(imgs, torch.from_numpy(labels).to(torch.int32), wait=True)
        assert b["state"] == "done" and b["n"] == 4, b
    out = c.transform(t.permute(0, 3, 1, 2))
    np.testing.assert_allclose(out, expected_pipeline(images), rtol=1e-5, atol=1e-5)


def test_feed_drains_a_torch_dataloader(module_server, rng):
    torch = torch_mod()
    from torch.utils.data import DataLoader, TensorDataset
    images, labels = random_batch(rng, 40)
    loader = DataLoader(TensorDataset(torch.from_numpy(images), torch.from_numpy(labels)), batch_size=8)
    summary = module_server.client().feed(loader, connections=2, progress=False)
    assert summary.ok and summary.batches == len(loader) == 5 and summary.samples == 40, summary
    assert summary.last_loss is not None


# ---- transform ------------------------------------------------------------------------------


def test_transform_returns_float32_nchw_with_the_configured_pipeline(module_server, rng):
    c = module_server.client()
    images, _ = random_batch(rng, 3)
    out = c.transform(images)
    assert out.dtype == np.float32 and out.shape == (3, 3, 32, 32)
    np.testing.assert_allclose(out, expected_pipeline(images), rtol=1e-5, atol=1e-5)
    # The same batch sent NCHW gives the same result: the layout travelled with it.
    np.testing.assert_array_equal(c.transform(images.transpose(0, 3, 1, 2)), out)


def test_transform_with_the_identity_pipeline_returns_the_input_as_float(start_server, rng):
    s = start_server("--augment.pipeline", "[]")
    c = s.client()
    images, labels = random_batch(rng, 4)
    expected = images.transpose(0, 3, 1, 2).astype(np.float32)
    np.testing.assert_array_equal(c.transform(images), expected)
    np.testing.assert_array_equal(c.transform(images.transpose(0, 3, 1, 2), labels), expected)
    assert c.model()["step"] == 0  # preprocessing is no training step


# ---- configuration, model, probes -----------------------------------------------------------


def test_config_model_health_and_readiness(start_server):
    s = start_server("--optim.lr", "0.001")
    c = s.client()
    assert c.health() == {"status": "ok"}
    assert c.ready() is True and c.readiness() == {"ready": True, "reasons": []}
    cfg = c.config()
    assert cfg["config"]["model"]["preset"] == "tiny" and cfg["pending_restart"] == []
    m = c.model()
    assert m["input"] == [3, 32, 32] and m["classes"] == 10 and m["backend"] == "ref"
    assert m["params"] == sum(layer["params"] for layer in m["layers"])
    r = c.patch_config({"optim": {"lr": 0.02}, "ring": {"slots": 4}})
    assert "optim.lr" in r["applied"] and "ring.slots" in r["pending_restart"]
    assert c.config()["config"]["optim"]["lr"] == pytest.approx(0.02)
    assert "streamfeed_steps_total" in c.metrics()


# ---- errors ------------------------------------------------------------------------------------


def test_error_replies_raise_typed_exceptions_with_the_servers_code(module_server, rng):
    c = module_server.client()
    images, labels = random_batch(rng, 2)
    with pytest.raises(Unprocessable) as e:
        c.post_batch(images[:, :16], labels)  # 16x32 images; the model takes 32x32
    assert e.value.status == 422 and e.value.code == "shape_mismatch"
    assert "model takes" in e.value.message and e.value.request_id
    with pytest.raises(Unprocessable) as e:
        c.post_batch(images, [3, 10])  # 10 classes: label 10 is out of range
    assert e.value.code == "label_out_of_range"
    with pytest.raises(BadRequest) as e:
        c.patch_config({"optim": {"lr": 20}})
    assert (e.value.status, e.value.code, e.value.field) == (400, "config_invalid", "optim.lr")
    with pytest.raises(BadRequest) as e:
        c.patch_config({"no_such_section": {"x": 1}})
    assert e.value.code == "config_invalid"
    with pytest.raises(NotFound) as e:
        c.batch(10 ** 12)
    assert e.value.code == "batch_not_found" and e.value.status == 404
    assert isinstance(e.value, streamfeed.APIError) and isinstance(e.value, streamfeed.StreamfeedError)


def test_a_token_is_sent_when_given_and_its_absence_raises_unauthorized(start_server, rng):
    s = start_server("--http.token", "s3cret")
    images, labels = random_batch(rng, 2)
    with pytest.raises(Unauthorized) as e:
        s.client().post_batch(images, labels)
    assert e.value.code == "unauthorized" and e.value.status == 401
    with pytest.raises(Unauthorized):
        s.client(token="wrong").patch_config({"optim": {"lr": 0.01}})
    assert s.client(token="s3cret").post_batch(images, labels, wait=True)["state"] == "done"
    with pytest.raises(Unauthorized):
        s.client().model()  # reading the model needs it too
    assert s.client(token="s3cret").model()["classes"] == 10
    assert s.client().config()["config"]["http"]["token"] == "***"  # GET /v1/config is open


def test_an_option_only_a_server_with_a_token_lets_a_request_change_raises_forbidden(module_server):
    with pytest.raises(streamfeed.Forbidden) as e:
        module_server.client().patch_config({"checkpoint": {"url_allow": "10.0.0.0/8"}})
    assert (e.value.status, e.value.code, e.value.field) == (403, "config_needs_token", "checkpoint.url_allow")
    assert isinstance(e.value, streamfeed.APIError)


def test_an_unreachable_server_raises_transport_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens on port now
    c = Client(f"http://127.0.0.1:{port}", retry=RetryPolicy(max_retries=1, backoff_base=0.001))
    with pytest.raises(streamfeed.TransportError):
        c.post_batch(np.zeros((1, 32, 32, 3), np.uint8), [0])  # a POST is never resent
    with pytest.raises(streamfeed.TransportError):
        c.health()  # a GET is, connect_retries times, then gives up


# ---- back-pressure -------------------------------------------------------------------------------


def _hold_slot(port, body):
    """Starts an upload of body and sends only part of it: the server has
    accepted its header and holds a ring slot (FILLING) until it ends."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = (f"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/vnd.safetensors\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    s.sendall(head + body[:len(body) // 2])
    return s


def test_a_full_ring_is_retried_then_raises_backpressure_with_the_code(start_server, rng):
    s = start_server("--ring.slots", "2", "--ring.full_policy", "reject", "--ring.retry_after_s", "0")
    images, labels = random_batch(rng, 4)
    body = encode_batch(images, labels)
    holders = [_hold_slot(s.port, body) for _ in range(2)]
    try:
        c = s.client(retry=RetryPolicy(max_retries=3, backoff_base=0.001, backoff_max=0.01))

        def rejected_so_far():
            return metric(c.metrics(), "streamfeed_batches_rejected_total", reason="ring_full")

        # Both slots are FILLING once the server has read both headers.
        wait_until(lambda: metric(c.metrics(), "streamfeed_ring_slots", state="filling") == 2,
                   what="both ring slots to be held by the partial uploads")
        before = rejected_so_far()
        with pytest.raises(Backpressure) as e:
            c.post_batch(images, labels)
        assert e.value.status == 429 and e.value.code == "ring_full"
        assert e.value.retry_after == 0.0 and e.value.attempts == 4
        assert rejected_so_far() - before == 4  # the first try and 3 retries
    finally:
        for h in holders:
            h.close()
    # The aborted uploads give their slots back: the next batch gets in.
    ok = s.client().post_batch(images, labels, wait=True)
    assert ok["state"] == "done"


def test_feed_over_four_connections_into_a_two_slot_rejecting_ring_retries_and_delivers_all(start_server, rng):
    s = start_server("--ring.slots", "2", "--ring.full_policy", "reject", "--ring.retry_after_s", "0")
    c = s.client(retry=RetryPolicy(max_retries=200, backoff_base=0.002, backoff_max=0.05))
    batches = [random_batch(rng, 64) for _ in range(60)]
    summary = c.feed(iter(batches), connections=4, progress=False)
    assert summary.errors == {}, summary
    assert summary.batches == summary.submitted == 60 and summary.ok
    assert summary.retries > 0, "4 connections never found the 2-slot ring full"
    text = c.metrics()
    assert metric(text, "streamfeed_batches_received_total", status="accepted") == 60
    assert metric(text, "streamfeed_batches_rejected_total", reason="ring_full") == summary.retries
    assert metric(text, "streamfeed_steps_total") == 60  # wait_last: everything was trained


# ---- feed -------------------------------------------------------------------------------------------


def test_feed_over_a_generator_summarises_and_the_loss_falls_on_a_learnable_task(start_server):
    # lr 0.005 with momentum 0.9 learns this steadily; at 0.05 (and now and
    # then at 0.01) the loss spikes after it has fallen, and may not recover.
    s = start_server("--optim.lr", "0.005", "--optim.momentum", "0.9")
    c = s.client()
    n_batches, n = 250, 32
    rng = np.random.default_rng(7)
    sizes = []

    def loader():
        for _ in range(n_batches):
            images, labels = colour_batch(rng, n)
            sizes.append(len(encode_batch(images, labels)))
            yield images, labels

    summary = c.feed(loader(), connections=4, progress=False)
    assert summary.errors == {} and summary.retries == 0
    assert summary.batches == summary.submitted == n_batches
    assert summary.samples == n_batches * n
    assert summary.bytes == sum(sizes)
    assert summary.seconds > 0 and summary.samples_per_second > 0
    assert summary.first_id == 1 and summary.last_id == n_batches
    assert summary.first_loss > 1.5, "an untrained 10-class model starts near ln(10)"
    # One batch's loss is noisy; the mean of the last ten tells whether it learnt.
    tail = [c.batch(i) for i in range(n_batches - 9, n_batches + 1)]
    losses = [b["loss"] for b in tail]
    assert losses[-1] == summary.last_loss < summary.first_loss, summary
    assert np.mean(losses) < summary.first_loss / 2, f"the last 10 losses {losses} vs the first {summary.first_loss}"
    assert np.mean([b["accuracy"] for b in tail]) >= 0.6, tail
    assert c.model()["step"] == n_batches


def test_feed_holds_a_bounded_number_of_batches(module_server, rng):
    c = module_server.client()
    max_in_flight, taken, answered = 3, [0], []
    lock = threading.Lock()
    worst = [0]

    def loader():
        for _ in range(40):
            with lock:
                worst[0] = max(worst[0], taken[0] - len(answered))
            taken[0] += 1
            yield random_batch(rng, 2)

    def on_result(index, reply):
        with lock:
            answered.append(index)

    summary = c.feed(loader(), connections=2, max_in_flight=max_in_flight, on_result=on_result,
                     progress=False)
    assert summary.batches == 40 and sorted(answered) == list(range(40))
    # Taken from the loader and not yet answered: the in-flight ones, the one
    # waiting for a slot and the look-ahead that tells the last batch apart.
    assert worst[0] <= max_in_flight + 2, worst[0]


def test_feed_with_on_error_count_counts_rejected_batches_by_code_and_goes_on(module_server, rng):
    c = module_server.client()
    good = random_batch(rng, 2)
    wrong_shape = (rng.integers(0, 256, (2, 16, 16, 3), dtype=np.uint8), np.array([1, 2]))
    bad_label = (good[0], np.array([1, 11]))
    items = [good, wrong_shape, good, bad_label, wrong_shape, good]
    summary = c.feed(items, connections=2, progress=False, on_error="count")
    assert summary.errors == {"shape_mismatch": 2, "label_out_of_range": 1}, summary
    assert summary.batches == 3 and summary.submitted == 6 and not summary.ok
    assert summary.samples == 6 and summary.last_loss is not None
    with pytest.raises(FeedAborted) as e:
        c.feed([wrong_shape] * 10, connections=1, max_in_flight=1, max_errors=2, progress=False,
               on_error="count")
    assert e.value.summary.errors == {"shape_mismatch": 3}
    assert e.value.summary.submitted == 3 and e.value.summary.batches == 0


def test_feed_raises_at_once_on_unusable_items(module_server, rng):
    c = module_server.client()
    images, labels = random_batch(rng, 2)
    with pytest.raises(TypeError, match="uint8"):
        c.feed([(images, labels), (images.astype(np.float32), labels)] * 3, connections=1, progress=False)
    with pytest.raises(TypeError, match="loader item"):
        c.feed([images], progress=False)


def test_feed_accepts_dict_items_and_shows_progress_with_tqdm(module_server, rng, capsys):
    pytest.importorskip("tqdm")
    c = module_server.client()
    items = [{"images": im, "labels": lab} for im, lab in (random_batch(rng, 2) for _ in range(5))]
    summary = c.feed(items, connections=2, progress=True)
    assert summary.batches == 5 and summary.ok
    err = capsys.readouterr().err
    assert "5/5" in err and "batch" in err
