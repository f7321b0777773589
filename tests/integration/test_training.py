"""Training and preprocessing through the real HTTP path, on the CPU
reference backend: the tiny model learns a learnable task, POST /v1/transform
returns the augmented batch in the documented layout, and augmentation is
reproducible from its seed."""
import json
import struct

import numpy as np
import pytest
from safetensors.numpy import load as st_load

from sfharness import TINY, key, learnable_batch, post_unread, random_batch, read_reply, st_body, wait_until

LEARN = TINY + ["--optim.lr", "0.05", "--optim.momentum", "0.9", "--model.seed", "1"]
MAX_STEPS = 200


def safetensors_metadata(blob):
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]).get("__metadata__", {})


def test_posting_learnable_batches_drives_the_loss_below_half_its_start(start_server):
    s = start_server(LEARN)
    rng = np.random.default_rng(2024)
    losses = []
    for step in range(MAX_STEPS):
        r = s.post_arrays(*learnable_batch(rng, 32))
        assert r.status_code == 202, r.text
        b = s.wait_batch(r.json()["id"])  # GET /v1/batches/{id} until done
        assert b["state"] == "done", b
        assert b["step"] == step + 1
        assert np.isfinite(b["loss"]), b
        losses.append(b["loss"])
        # Five consecutive batches under half the first loss: learnt, not luck.
        if len(losses) >= 6 and max(losses[-5:]) < losses[0] / 2:
            break
    assert max(losses[-5:]) < losses[0] / 2, f"loss did not halve in {MAX_STEPS} steps: {losses[:5]} ... {losses[-5:]}"
    assert losses[0] > 1.5, "the first loss should be near ln(10) for an untrained 10-class model"
    # Fresh batches are classified well: the model learnt the task, not the batches.
    x, y = learnable_batch(rng, 64)
    held_out = s.post_arrays(x, y, wait=True).json()
    assert held_out["accuracy"] >= 0.8, held_out
    m = s.metrics()
    assert m[key("streamfeed_steps_total")] == len(losses) + 1
    assert m[key("streamfeed_samples_trained_total")] == 32 * len(losses) + 64
    assert m[key("streamfeed_loss")] == pytest.approx(held_out["loss"])
    assert s.get("/v1/model").json()["step"] == len(losses) + 1


def test_transform_with_an_identity_pipeline_returns_the_input_as_float32_nchw(start_server, rng):
    s = start_server(TINY)
    images, labels = random_batch(rng, 3)
    for body in (st_body(images), st_body(images, labels),
                 st_body(images.transpose(0, 3, 1, 2), layout="NCHW")):
        r = s.post_batch(body, path="/v1/transform")
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"] == "application/vnd.safetensors"
        out = st_load(r.content)
        assert list(out) == ["images"]
        got = out["images"]
        assert got.dtype == np.float32 and got.shape == (3, 3, 32, 32)
        np.testing.assert_array_equal(got, images.transpose(0, 3, 1, 2).astype(np.float32))
        assert safetensors_metadata(r.content).get("layout") == "NCHW"
    # Preprocessing is no training step.
    assert s.metric("streamfeed_steps_total") == 0


# W1's augmentation (crop 128, resize 256, rotate, blur, normalize): the
# seed-classifier preset's recipe, given explicitly to the tiny model here
# (whose own recipe only normalises).
W1_AUG = ('[{"op":"to_dtype","dtype":"float32","scale":1.0},{"op":"random_crop","size":[128,128]},'
          '{"op":"resize","size":[256,256]},{"op":"random_rotation","degrees":[-45,45]},'
          '{"op":"gaussian_blur","kernel_size":7,"sigma":[0.1,2.0]},{"op":"normalize","mean":[0],"std":[1]}]')

TO_FLOAT32 = '[{"op":"to_dtype","dtype":"float32","scale":1.0}]'


def test_transform_with_the_w1_pipeline_returns_n_3_256_256_float32(start_server, rng):
    s = start_server("--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", W1_AUG)
    images = rng.integers(0, 256, (2, 256, 256, 3), dtype=np.uint8)
    r = s.post_batch(st_body(images), path="/v1/transform")
    assert r.status_code == 200, r.text
    out = st_load(r.content)["images"]
    assert out.dtype == np.float32 and out.shape == (2, 3, 256, 256)
    assert np.isfinite(out).all()
    assert not np.array_equal(out, images.transpose(0, 3, 1, 2).astype(np.float32))
    # Another input size, same output size: the crop then resize fixes it.
    r = s.post_batch(st_body(rng.integers(0, 256, (1, 200, 300, 3), dtype=np.uint8)), path="/v1/transform")
    assert r.status_code == 200, r.text
    assert st_load(r.content)["images"].shape == (1, 3, 256, 256)


def test_transform_replies_nobody_reads_hold_a_bounded_total_then_transform_busy(start_server, rng):
    # Each reply is 3x256x256 floats x 40 = 31 MB, held until its client has
    # read it; with 2 ring slots of 8 MiB, replies may hold 2 x 8 x 8 MiB =
    # 128 MiB in all: four unread ones fit, a fifth waits (503, Retry-After).
    # What a reply holds is its size, whatever the ops computed, so the
    # pipeline only converts to float32 (W1's blur and rotation of 240
    # images would be most of the test's CPU time).
    s = start_server("--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", TO_FLOAT32,
                     "--ring.slots", "2", "--ring.slot_bytes", str(8 << 20), "--ring.full_timeout_ms", "60000")
    body = st_body(rng.integers(0, 256, (40, 256, 256, 3), dtype=np.uint8))
    conns, statuses = post_unread(s.port, "/v1/transform", body, 6)
    assert sorted(statuses) == [200] * 4 + [503] * 2, statuses
    assert s.metric("streamfeed_http_errors_total", code="transform_busy") == 2
    for k in conns:
        k.close()  # replies dropped unread: their bytes are let go
    wait_until(lambda: s.post_batch(body, path="/v1/transform").status_code == 200, 60,
               what="a transform once the unread replies are gone")


def _w1_transform(start_server, images, seed):
    s = start_server("--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", W1_AUG,
                     "--augment.seed", str(seed))
    r = s.post_batch(st_body(images), path="/v1/transform")
    assert r.status_code == 200, r.text
    s.stop()
    return st_load(r.content)["images"]


def test_the_same_augment_seed_gives_identical_transform_output_across_two_runs(start_server, rng):
    images = rng.integers(0, 256, (2, 160, 160, 3), dtype=np.uint8)
    a = _w1_transform(start_server, images, 7)
    b = _w1_transform(start_server, images, 7)
    c = _w1_transform(start_server, images, 8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c), "a different seed should draw different crops and rotations"


def test_transform_in_sink_mode_is_refused_with_409(start_server, rng):
    s = start_server("--pipeline.mode", "sink")
    r = s.post_batch(st_body(random_batch(rng, 1)[0]), path="/v1/transform")
    assert r.status_code == 409 and r.json()["error"]["code"] == "no_backend"
    assert s.metric("streamfeed_ring_slots", state="filling") == 0


def test_transform_in_sink_mode_is_refused_in_place_of_100_continue(start_server):
    # Known from the head: a client waiting for 100 Continue is not told to
    # send a batch that can only be refused.
    s = start_server("--pipeline.mode", "sink")
    k = s.connect()
    k.sendall(b"POST /v1/transform HTTP/1.1\r\nHost: x\r\nContent-Type: application/vnd.safetensors\r\n"
              b"Content-Length: 1000000\r\nExpect: 100-continue\r\n\r\n")
    r = read_reply(k)
    k.close()
    assert (r.status_code, r.json()["error"]["code"]) == (409, "no_backend"), r.text
    assert s.metric("streamfeed_batches_rejected_total", reason="no_backend") == 1


def test_model_describes_the_tiny_preset(start_server):
    s = start_server(TINY)
    m = s.get("/v1/model").json()
    assert m["preset"] == "tiny" and m["input"] == [3, 32, 32] and m["classes"] == 10
    assert m["backend"] == "ref" and m["step"] == 0
    assert m["params"] == sum(layer["params"] for layer in m["layers"]) > 0
    assert m["layers"][-1]["out"] == [10]


def _torchvision_fixture():
    """Images, cases and torchvision's outputs from the committed C fixture
    (tests/unit/data/aug_torchvision.h, made once by
    tools/gen_aug_torchvision_fixture.py)."""
    import pathlib
    import re
    text = (pathlib.Path(__file__).resolve().parents[1] / "unit" / "data" / "aug_torchvision.h").read_text()
    arrays = {}
    for m in re.finditer(r"static const (?:uint8_t|float) (tv_\w+)\[\d+\] = \{([^}]*)\};", text):
        arrays[m.group(1)] = np.array([float(v.rstrip("f")) for v in m.group(2).split(",")])
    hw = [tuple(map(int, p)) for p in re.findall(r"\{(\d+), (\d+)\}", text.split("tv_image_hw")[1].split(";")[0])]
    cases = {}
    for m in re.finditer(r'\{"(\w+)", "((?:[^"\\]|\\.)*)", (\d+), (\d+), (\d+), (tv_out\d+)\}', text):
        name, js, img, oh, ow, out = m.groups()
        h, w = hw[int(img)]
        image = arrays["tv_image%s" % img].astype(np.uint8).reshape(1, h, w, 3)
        cases[name] = (js.replace('\\"', '"'), image, arrays[out].reshape(1, 3, int(oh), int(ow)))
    return cases


@pytest.mark.parametrize("case", ["resize_down_antialias", "center_crop_then_resize_up",
                                  "resize_down_antialias_then_rotate"])
def test_transform_matches_torchvisions_own_output_within_a_hundredth_of_a_level(start_server, case):
    # The same comparison as tests/unit/test_aug.c, through the HTTP path: an
    # antialiased downscale, a crop whose upscale clamps at the crop's edge, and
    # an antialiased downscale then a rotation.
    js, image, want = _torchvision_fixture()[case]
    s = start_server("--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", js)
    r = s.post_batch(st_body(image), path="/v1/transform")
    assert r.status_code == 200, r.text
    got = st_load(r.content)["images"]
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-2


def test_a_cutmix_transform_pastes_each_samples_predecessor_into_one_box_of_the_batch(start_server, rng):
    s = start_server("--model.preset", "tiny", "--pipeline.backend", "ref",
                     "--augment.pipeline", '[{"op":"cutmix"}]')
    # Distinct values per sample, so every output pixel names its source.
    images = (np.arange(4 * 32 * 32 * 3).reshape(4, 32, 32, 3) % 251).astype(np.uint8)
    images[1:] = (images[1:].astype(np.int64) + 61 * np.arange(1, 4)[:, None, None, None]) % 256
    x = images.transpose(0, 3, 1, 2).astype(np.float32)
    for _ in range(10):  # a batch's box may be empty (lam near 1): new batches draw anew
        r = s.post_batch(st_body(images), path="/v1/transform")
        assert r.status_code == 200, r.text
        out = st_load(r.content)["images"]
        pasted = out != x
        if not pasted.any():
            continue
        # One box for the whole batch, every channel, holding the previous sample.
        box = pasted.any(axis=(0, 1))
        ys, xs = np.nonzero(box)
        assert box[ys.min():ys.max() + 1, xs.min():xs.max() + 1].all(), "the pasted region is a rectangle"
        for i in range(4):
            inside = np.zeros((32, 32), bool)
            inside[ys.min():ys.max() + 1, xs.min():xs.max() + 1] = True
            np.testing.assert_array_equal(out[i][:, inside], x[(i - 1) % 4][:, inside])
            np.testing.assert_array_equal(out[i][:, ~inside], x[i][:, ~inside])
        return
    pytest.fail("ten cutmix batches pasted nothing")


def test_batches_train_with_colour_jitter_erasing_and_mixup(start_server, rng):
    s = start_server("--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline",
                     '[{"op":"to_dtype","scale":0.00392156862745098},'
                     '{"op":"color_jitter","brightness":0.4,"contrast":0.4,"saturation":0.4,"hue":0.1},'
                     '{"op":"random_erasing","p":1},{"op":"mixup","alpha":0.2}]')
    for _ in range(3):
        b = s.post_arrays(*random_batch(rng, 8), wait=True).json()
        assert b["state"] == "done", b
        assert np.isfinite(b["loss"]), b
