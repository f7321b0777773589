"""The client as a new user meets it: a URL without a scheme, float images,
one-hot labels, dict samples, a feed that hits a deterministic rejection,
typed results, the live loss in the progress bar, the asyncio client and
the package's own typing (mypy --strict runs in make client-test)."""
import asyncio
import re
import time
from pathlib import Path

import numpy as np
import pytest

import streamfeed
from streamfeed import BatchAccepted, BatchResult, Client, FeedAborted, encode_batch
from streamfeed.wire import encode_batch_parts

from test_client import colour_batch, random_batch

REPO = Path(__file__).resolve().parents[2]


# ---- construction and inputs (no server) -------------------------------------------------


@pytest.mark.parametrize("url", ["localhost:8080", "gpu-box:8080", "127.0.0.1:8080", "//host:1", "ftp://h:1"])
def test_a_url_without_an_http_scheme_fails_at_construction_saying_what_to_write(url):
    with pytest.raises(ValueError, match=r"needs a scheme and a host: write 'http://"):
        Client(url)


def test_a_url_with_a_scheme_is_accepted_and_normalised():
    assert Client("http://localhost:8080/").url == "http://localhost:8080"
    assert Client("https://[::1]:8443").url == "https://[::1]:8443"


def test_float_images_in_0_1_get_the_conversion_to_uint8_in_the_message():
    c = Client("http://127.0.0.1:9")
    images = np.random.default_rng(1).random((2, 32, 32, 3), dtype=np.float32)
    with pytest.raises(TypeError) as e:
        c.post_batch(images, [0, 1])
    msg = str(e.value)
    assert "uint8" in msg and "* 255" in msg and "astype(np.uint8)" in msg and "ToTensor" in msg
    with pytest.raises(TypeError, match=r"round\(\)\.astype\(np\.uint8\)"):
        c.post_batch(images * 255, [0, 1])
    with pytest.raises(TypeError, match="normalis"):
        c.post_batch(images - 0.5, [0, 1])


def test_torch_float_images_get_the_torch_conversion_in_the_message():
    t = torch_mod().rand(2, 3, 32, 32)
    with pytest.raises(TypeError, match=r"to\(torch\.uint8\)"):
        encode_batch(t, [0, 1])


def test_one_hot_and_float_labels_are_refused_before_anything_is_sent():
    c = Client("http://127.0.0.1:9")  # nothing listens: a request would fail differently
    images = np.zeros((3, 32, 32, 3), np.uint8)
    with pytest.raises(ValueError, match=r"one-hot.*argmax\(1\)"):
        c.post_batch(images, np.eye(10, dtype=np.int64)[[1, 2, 3]])
    with pytest.raises(ValueError, match="one-hot"):
        c.post_batch(images, np.eye(10, dtype=np.float32)[[1, 2, 3]])
    with pytest.raises(TypeError, match=r"class indices.*astype\(np\.int64\)"):
        c.post_batch(images, np.array([1.0, 2.0, 3.0]))


def test_an_empty_batch_is_refused_with_a_value_error_before_anything_is_sent():
    """N=0 failed deep in the encoder with a TypeError about casting a memoryview."""
    with pytest.raises(ValueError, match=r"N=0"):
        encode_batch_parts(np.zeros((0, 32, 32, 3), np.uint8), np.zeros(0, np.int64))
    with pytest.raises(ValueError, match="N=0"):
        Client("http://127.0.0.1:9").post_batch(np.zeros((0, 3, 32, 32), np.uint8), [])
    with pytest.raises(ValueError, match="no pixels"):
        encode_batch_parts(np.zeros((2, 0, 32, 3), np.uint8), [0, 1])


def test_the_zero_copy_body_is_byte_for_byte_the_safetensors_encoding():
    from safetensors.numpy import save
    rng = np.random.default_rng(3)
    images, labels = random_batch(rng, 5)
    body = encode_batch_parts(images, labels.astype(np.int32))
    assert len(body) == len(body.tobytes())
    # The image part is the caller's memory itself, not a copy.
    assert np.shares_memory(np.frombuffer(body.parts[1], np.uint8), images)
    out = streamfeed.decode_tensors(body.tobytes())
    np.testing.assert_array_equal(out["images"], images)
    np.testing.assert_array_equal(out["labels"], labels)
    ref = streamfeed.decode_tensors(save({"images": images, "labels": labels.astype(np.int64)},
                                         metadata={"layout": "NHWC"}))
    np.testing.assert_array_equal(ref["images"], out["images"])


def torch_mod():
    """torch, or a named skip where tests/install_torch.sh could not install it."""
    return pytest.importorskip("torch")


# ---- typed results ---------------------------------------------------------------------------


def test_post_batch_returns_typed_results(module_server, rng):
    c = module_server.client()
    images, labels = random_batch(rng, 3)
    acc = c.post_batch(images, labels)
    assert isinstance(acc, BatchAccepted) and acc.id >= 1 and acc.ring_slots >= 2 and acc.ring_free >= 0
    done = c.post_batch(images, labels, wait=True)
    assert isinstance(done, BatchResult) and done.done and done.n == 3
    assert isinstance(done.loss, float) and 0 <= done.accuracy <= 1 and done.step >= 1
    assert done.error_code is None and done.timings["step_s"] > 0
    assert done["loss"] == done.loss  # the server's keys still answer as a dict's
    assert isinstance(c.batch(acc.id), BatchResult)


# A user's typed program (make package-test checks it against the installed wheel too).
_TYPED_USE = (REPO / "tests" / "package" / "uses_the_client.py").read_text()


@pytest.fixture(scope="module")
def mypy_on_the_typed_programs(tmp_path_factory):
    """mypy --strict over the typed program (typed_use.py) and the same
    program reading the loss of a batch that was only queued
    (queued_loss.py), in one run, since every run parses numpy's, requests'
    and the client's types again. Returns the error lines by file name, the
    whole report and the exit status."""
    mypy = pytest.importorskip("mypy.api")
    d = tmp_path_factory.mktemp("mypy")
    (d / "typed_use.py").write_text(_TYPED_USE)
    (d / "queued_loss.py").write_text(_TYPED_USE + "\nc.post_batch(images, labels).loss\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MYPYPATH", str(REPO / "client" / "python"))
        out, err, status = mypy.run(["--strict", "--no-incremental", "--cache-dir", str(d / ".mypy_cache"),
                                     "--python-version", "3.10", str(d / "typed_use.py"), str(d / "queued_loss.py")])
    errors = {}
    for line in out.splitlines():
        if ": error:" in line:
            errors.setdefault(Path(line.split(":", 1)[0]).name, []).append(line)
    return errors, out + err, status


def test_mypy_strict_knows_that_wait_true_returns_a_batch_result(mypy_on_the_typed_programs):
    errors, report, status = mypy_on_the_typed_programs
    # The run fails on queued_loss.py alone: nothing in the typed program or
    # in the package it imports is an error.
    assert status == 1 and set(errors) == {"queued_loss.py"}, report


def test_mypy_strict_refuses_a_loss_read_from_a_batch_that_was_only_queued(mypy_on_the_typed_programs):
    errors, report, status = mypy_on_the_typed_programs
    assert status == 1 and any('"BatchAccepted" has no attribute "loss"' in e
                               for e in errors.get("queued_loss.py", [])), report


# ---- feed ------------------------------------------------------------------------------------


def test_feed_stops_at_the_first_deterministic_rejection_and_names_the_batch_and_why(module_server, rng):
    c = module_server.client()
    good = random_batch(rng, 2)
    wrong_shape = (rng.integers(0, 256, (2, 16, 16, 3), dtype=np.uint8), np.array([1, 2]))
    taken = []

    def loader():
        for i in range(50):
            taken.append(i)
            yield wrong_shape if i == 3 else good

    with pytest.raises(FeedAborted) as e:
        c.feed(loader(), connections=2, progress=False)
    assert e.value.batch_index == 3 and e.value.error.code == "shape_mismatch"
    assert e.value.error.status == 422
    msg = str(e.value)
    assert "4th batch of the loader (index 3)" in msg and "shape_mismatch" in msg and "model takes" in msg
    # It stopped: the loader was not drained.
    assert len(taken) < 20, len(taken)
    assert e.value.summary.errors == {"shape_mismatch": 1}


def test_feed_takes_hugging_face_style_dict_samples_and_a_key_mapping(module_server, rng):
    c = module_server.client()
    hf = [{"image": im, "label": lab} for im, lab in (random_batch(rng, 2) for _ in range(3))]
    assert c.feed(hf, connections=1, progress=False).batches == 3
    pix = [{"pixel_values": im, "labels": lab} for im, lab in (random_batch(rng, 2) for _ in range(2))]
    assert c.feed(pix, connections=1, progress=False).batches == 2
    own = [{"x": im, "y": lab} for im, lab in (random_batch(rng, 2) for _ in range(2))]
    assert c.feed(own, connections=1, progress=False, keys=("x", "y")).batches == 2
    with pytest.raises(TypeError, match=r"keys=\("):
        c.feed(own, connections=1, progress=False)


def test_per_sample_dicts_as_a_hugging_face_dataset_yields_them_get_told_to_batch(module_server, rng):
    c = module_server.client()
    images, labels = random_batch(rng, 2)
    samples = [{"image": images[i], "label": int(labels[i])} for i in range(2)]
    with pytest.raises(TypeError, match=r"one sample .*batch the dataset first.*DataLoader.*iter\(batch_size=32\)"):
        c.feed(samples, connections=1, progress=False)
    own = [{"x": images[0], "y": np.int64(3)}]
    with pytest.raises(TypeError, match=r"one sample"):
        c.feed(own, connections=1, progress=False, keys=("x", "y"))


def test_the_progress_bar_shows_the_live_loss_while_feeding(start_server, capsys):
    s = start_server("--optim.lr", "0.005", "--optim.momentum", "0.9")
    c = s.client()
    rng = np.random.default_rng(5)

    def loader():
        # Slow enough that the bar is redrawn several times between the first
        # and the last batch.
        for _ in range(40):
            time.sleep(0.06)
            yield colour_batch(rng, 16)

    summary = c.feed(loader(), connections=2, progress=True)
    assert summary.ok
    err = capsys.readouterr().err
    shown = re.findall(r"loss=([0-9.]+)", err)
    # Not the first batch's loss until the last: several distinct values.
    distinct = set(shown)
    assert len(distinct) >= 3, shown
    assert summary.latest_loss == summary.last_loss


# ---- asyncio ------------------------------------------------------------------------------------


def test_the_asyncio_client_posts_checks_inputs_and_feeds(module_server, rng):
    from streamfeed.aio import AsyncClient

    async def async_batches(n):
        for _ in range(n):
            await asyncio.sleep(0)
            yield random_batch(rng, 2)

    async def main():
        with pytest.raises(ValueError, match="needs a scheme"):
            AsyncClient("localhost:8080")
        async with AsyncClient(module_server.url) as c:
            acc = await c.post_batch(*random_batch(rng, 2))
            assert isinstance(acc, BatchAccepted)
            done = await c.post_batch(*random_batch(rng, 2), wait=True)
            assert isinstance(done, BatchResult) and done.done and done.loss is not None
            with pytest.raises(TypeError, match="uint8"):
                await c.post_batch(np.zeros((2, 32, 32, 3), np.float32), [0, 1])
            summary = await c.feed(async_batches(12), connections=3)
            assert summary.ok and summary.batches == 12 and summary.last_loss is not None, summary
            wrong = (rng.integers(0, 256, (2, 16, 16, 3), dtype=np.uint8), np.array([1, 2]))
            with pytest.raises(FeedAborted) as e:
                await c.feed([random_batch(rng, 2), wrong] + [random_batch(rng, 2)] * 5, connections=1)
            assert e.value.batch_index == 1

    asyncio.run(main())
