"""JPEG batches through the real HTTP path on the reference backend: they
train, the service decodes them as libjpeg-turbo does, a bad file is refused
naming its index while the next good batch trains, a decompression bomb is
refused while its body is still arriving, and a file whose scan data is
damaged fails its batch with the sample named."""
import io
import json
import os
import subprocess

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from sfharness import (LOAD_BIN, TINY, jpeg_body, key, learnable_batch, learnable_jpeg_batch, read_reply,
                       st_body, to_jpeg, wait_until)

LEARN = TINY + ["--optim.lr", "0.05", "--optim.momentum", "0.9", "--model.seed", "1"]
# The tiny model behind a resize: any source size, W1's 256x256 files included,
# trains it in a few milliseconds a step.
TINY_256 = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline",
            '[{"op":"resize","size":[32,32]},{"op":"to_dtype","scale":0.0039}]']


def test_jpeg_batches_of_the_learnable_task_train_the_tiny_model(start_server):
    s = start_server(LEARN)
    rng = np.random.default_rng(7)
    losses = []
    for step in range(120):
        files, labels = learnable_jpeg_batch(rng)
        r = s.post_batch(jpeg_body(files, labels))
        assert r.status_code == 202, r.text
        b = s.wait_batch(r.json()["id"])
        assert b["state"] == "done", b
        losses.append(b["loss"])
        if len(losses) >= 6 and max(losses[-5:]) < losses[0] / 2:
            break
    assert max(losses[-5:]) < losses[0] / 2, f"loss did not halve: {losses[:5]} ... {losses[-5:]}"
    jpeg_bytes = sum(len(f) for f in files)
    assert jpeg_bytes < 32 * 32 * 32 * 3, "the files should be smaller than their pixels"


def test_the_transform_of_a_jpeg_batch_equals_that_of_its_decoded_pixels(start_server, rng):
    """The service decodes with libjpeg-turbo's defaults, as Pillow does:
    the augmented output of the files and of Pillow's decode agree."""
    s = start_server(TINY)
    imgs = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    imgs[:, 8:24, 8:24] = 200  # some structure, so that the codec has edges to keep
    files = [to_jpeg(imgs[0], subsampling=0), to_jpeg(imgs[1], subsampling=1),
             to_jpeg(imgs[2][:, :, 0], progressive=True)]  # 4:4:4, 4:2:2, progressive grayscale
    decoded = np.stack([np.asarray(Image.open(io.BytesIO(f)).convert("RGB")) for f in files])
    got = s.post_batch(jpeg_body(files, [0, 1, 2]), path="/v1/transform")
    assert got.status_code == 200, got.text
    want = s.post_batch(st_body(decoded, np.array([0, 1, 2])), path="/v1/transform")
    assert want.status_code == 200, want.text
    a, b = st_load(got.content)["images"], st_load(want.content)["images"]
    assert a.shape == (3, 3, 32, 32)
    diff = np.abs(a - b).max()
    assert diff <= 1.0, f"decoded pixels differ by up to {diff} of 255"
    # Grayscale becomes three equal channels.
    assert np.array_equal(a[2, 0], a[2, 1]) and np.array_equal(a[2, 0], a[2, 2])


def test_a_corrupt_sample_is_refused_naming_its_index_and_the_next_good_batch_trains(start_server):
    s = start_server(TINY)
    rng = np.random.default_rng(3)
    files, labels = learnable_jpeg_batch(rng, 4)
    bad = list(files)
    bad[2] = b"GIF89a" + files[2][6:]
    r = s.post_batch(jpeg_body(bad, labels))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "jpeg_not_jpeg"
    assert err["field"] == "jpeg[2]"
    assert "sample 2" in err["message"]
    m = s.metrics()
    assert m[key("streamfeed_batches_rejected_total", reason="jpeg_not_jpeg")] == 1
    r = s.post_batch(jpeg_body(files, labels), wait=True)
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    assert r.json()["step"] == 1


def test_jpeg_batches_are_counted_per_decoder_in_the_metrics_and_raw_batches_are_not(start_server):
    s = start_server(TINY)
    rng = np.random.default_rng(5)
    for _ in range(2):
        files, labels = learnable_jpeg_batch(rng, 4)
        r = s.post_batch(jpeg_body(files, labels), wait=True)
        assert r.status_code == 200 and r.json()["state"] == "done", r.text
    images, labels = learnable_batch(rng, 4)
    r = s.post_batch(st_body(images, labels), wait=True)
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    m = s.metrics()
    dec = {"decoder": "libjpeg-turbo"}
    assert m[key("streamfeed_jpeg_batches_total", **dec)] == 2
    assert m[key("streamfeed_jpeg_samples_total", **dec)] == 8
    assert m[key("streamfeed_jpeg_decode_host_seconds_total", **dec)] > 0
    assert m[key("streamfeed_samples_trained_total")] == 12


def test_the_reference_backend_reports_no_decoder_memory_and_no_decoder_failures_before_or_after_jpeg(
        start_server):
    """The decoder's memory is the CUDA backend's (made by the first encoded
    batch, tests/gpu/test_jpeg_decode.cu): the reference decodes into the
    batch's own buffers, so GET /v1/model has no `jpeg_decoder` and the
    gauges have no value, before and after JPEG batches train; the counter of
    batches failed for want of a decoder is there from the start, at 0."""
    s = start_server(TINY)
    text = s.metrics_text()
    for fam, typ in (("streamfeed_jpeg_decoder_device_bytes", "gauge"),
                     ("streamfeed_jpeg_decoder_pinned_bytes", "gauge"),
                     ("streamfeed_jpeg_decoder_unavailable_total", "counter")):
        assert f"# TYPE {fam} {typ}" in text, fam
    assert s.metric("streamfeed_jpeg_decoder_unavailable_total") == 0
    assert "jpeg_decoder" not in s.get("/v1/model").json()
    rng = np.random.default_rng(6)
    files, labels = learnable_jpeg_batch(rng, 4)
    r = s.post_batch(jpeg_body(files, labels), wait=True)
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    assert "jpeg_decoder" not in s.get("/v1/model").json()
    m = s.metrics()
    assert not [k for k in m if k[0].startswith("streamfeed_jpeg_decoder_") and k[0].endswith("_bytes")], m
    assert m[key("streamfeed_jpeg_decoder_unavailable_total")] == 0


# STREAMFEED_PARITY_BACKEND=cuda (with STREAMFEED_BIN naming a CUDA build, on a
# GPU host) runs the checks of the CUDA backend's decoder below.
BACKEND = os.environ.get("STREAMFEED_PARITY_BACKEND", "ref")


@pytest.mark.skipif(BACKEND != "cuda", reason="the JPEG decoder's memory is the CUDA backend's "
                    "(STREAMFEED_PARITY_BACKEND=cuda, STREAMFEED_BIN=build-cuda/streamfeed on a GPU host)")
def test_on_cuda_the_jpeg_decoder_is_made_by_the_first_jpeg_batch_not_at_start_nor_by_raw_batches(start_server):
    """A job that posts raw pixels holds none of the decoder's memory: GET
    /v1/model's `jpeg_decoder` and the gauges say none is made at start and
    after a raw batch trains; the first JPEG batch makes it (at least its
    staging area of 3 bytes a pixel of jpeg.max_batch_pixels) and trains, and
    no batch failed for want of it."""
    px = 4 << 20
    s = start_server(["--model.preset", "tiny", "--pipeline.backend", "cuda", "--jpeg.max_batch_pixels", str(px),
                      "--augment.pipeline", '[{"op":"resize","size":[32,32]},{"op":"to_dtype","scale":0.0039}]'])
    none = {"made": False, "device_bytes": 0, "pinned_bytes": 0}
    assert s.get("/v1/model").json()["jpeg_decoder"] == none
    assert s.metric("streamfeed_jpeg_decoder_device_bytes") == 0
    rng = np.random.default_rng(8)
    images, labels = learnable_batch(rng, 8)
    r = s.post_batch(st_body(images, labels), wait=True)
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    assert s.get("/v1/model").json()["jpeg_decoder"] == none
    files, labels = learnable_jpeg_batch(rng, 8)
    r = s.post_batch(jpeg_body(files, labels), wait=True)
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    dec = s.get("/v1/model").json()["jpeg_decoder"]
    assert dec["made"] is True and dec["device_bytes"] >= 3 * px, dec
    m = s.metrics()
    assert m[key("streamfeed_jpeg_decoder_device_bytes")] == dec["device_bytes"]
    assert m[key("streamfeed_jpeg_decoder_pinned_bytes")] == dec["pinned_bytes"]
    assert m[key("streamfeed_jpeg_decoder_unavailable_total")] == 0


def test_with_jpeg_max_batch_pixels_0_a_jpeg_batch_is_refused_from_its_header_and_raw_batches_train(
        start_server):
    s = start_server(TINY + ["--jpeg.max_batch_pixels", "0"])
    rng = np.random.default_rng(4)
    files, labels = learnable_jpeg_batch(rng, 4)
    r = s.post_batch(jpeg_body(files, labels))
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "jpeg_batch_too_large"
    assert "jpeg.max_batch_pixels is 0" in err["message"]
    assert s.metric("streamfeed_batches_rejected_total", reason="jpeg_batch_too_large") == 1
    images, labels = learnable_batch(rng, 4)
    r = s.post_batch(st_body(images, labels), wait=True)
    assert r.status_code == 200 and r.json()["state"] == "done", r.text


def test_a_truncated_sample_and_offsets_that_do_not_tile_the_files_are_refused(start_server):
    s = start_server(TINY)
    rng = np.random.default_rng(4)
    files, labels = learnable_jpeg_batch(rng, 3)
    cut = list(files)
    cut[1] = files[1][: len(files[1]) // 2]
    r = s.post_batch(jpeg_body(cut, labels))
    assert r.status_code == 400 and r.json()["error"]["code"] == "jpeg_truncated", r.text
    assert r.json()["error"]["field"] == "jpeg[1]"
    body = bytearray(jpeg_body(files, labels))
    n = int.from_bytes(body[:8], "little")
    hdr = json.loads(body[8:8 + n])
    o0 = 8 + n + hdr["jpeg_offsets"]["data_offsets"][0]
    body[o0 + 8:o0 + 16] = (0).to_bytes(8, "little")  # offsets[1] = 0: an empty file
    r = s.post_batch(bytes(body))
    assert r.status_code == 400 and r.json()["error"]["code"] == "jpeg_offsets_invalid", r.text
    assert s.metric("streamfeed_batches_rejected_total", reason="jpeg_truncated") == 1
    assert s.metric("streamfeed_batches_rejected_total", reason="jpeg_offsets_invalid") == 1


def bomb(small, side=65535):
    """A real tiny JPEG whose SOF declares side x side pixels."""
    b = bytearray(small)
    i = next(i for i in range(2, len(b) - 1) if b[i] == 0xFF and 0xC0 <= b[i + 1] <= 0xC2)
    b[i + 5:i + 9] = side.to_bytes(2, "big") * 2
    return bytes(b)


def test_a_decompression_bomb_is_refused_while_its_body_is_still_arriving(start_server):
    """65535 x 65535 declared in about 1 KB: the upload is refused once the
    server has read the bomb's bytes, before the rest of the body, so nothing
    was decoded (decoding starts only once a whole batch is in)."""
    s = start_server(TINY)
    rng = np.random.default_rng(5)
    files, labels = learnable_jpeg_batch(rng, 2)
    b = bomb(files[0])
    assert len(b) < 1024
    filler = to_jpeg(rng.integers(0, 256, (512, 512, 3), dtype=np.uint8), quality=95)
    body = st_save({"jpeg_offsets": np.array([0, len(b), len(b) + len(filler)], dtype=np.int64),
                    "labels": np.asarray([0, 1], dtype=np.int64),
                    "jpeg": np.frombuffer(b + filler, dtype=np.uint8)})
    n = int.from_bytes(body[:8], "little")
    hdr = json.loads(body[8:8 + n])
    bomb_end = 8 + n + hdr["jpeg"]["data_offsets"][0] + len(b)
    assert len(body) - bomb_end > 100_000
    sock = s.start_upload(body, bomb_end)
    # Refused (counted, its slot freed) with the rest of the body not yet sent.
    wait_until(lambda: s.metric("streamfeed_batches_rejected_total", reason="jpeg_side_too_large") == 1, 10,
               what="the bomb to be refused")
    assert s.metric("streamfeed_ring_slots", state="filling") == 0
    sock.sendall(body[bomb_end:])  # HTTP/1.1: the reply follows the drained body
    reply = read_reply(sock)
    sock.close()
    assert reply.status_code == 422, reply.text
    err = reply.json()["error"]
    assert err["code"] == "jpeg_side_too_large" and err["field"] == "jpeg[0]"
    assert "65535x65535" in err["message"]
    r = s.post_batch(jpeg_body([bomb(files[0])], [0]))
    assert r.status_code == 422 and r.json()["error"]["code"] == "jpeg_side_too_large"
    s2 = start_server(TINY + ["--jpeg.max_side", "16384", "--jpeg.max_pixels", "1000000"])
    r = s2.post_batch(jpeg_body([bomb(files[0], 16384)], [0]))
    assert r.status_code == 422 and r.json()["error"]["code"] == "jpeg_too_many_pixels", r.text


def test_with_on_undecodable_fail_a_file_with_damaged_scan_data_fails_its_batch_naming_the_sample(
        start_server):
    """The header is valid, so the batch is accepted; the decode then finds the
    scan data cut short and (decode.on_undecodable fail) the batch fails,
    nothing trained. test_jpeg_real_files.py has the default, skip."""
    s = start_server(TINY + ["--decode.on_undecodable", "fail"])
    rng = np.random.default_rng(6)
    files, labels = learnable_jpeg_batch(rng, 3)
    f = files[1]
    sos = f.index(b"\xff\xda")
    damaged = f[: sos + 40] + b"\xff\xd9"
    r = s.post_batch(jpeg_body([files[0], damaged, files[2]], labels))
    assert r.status_code == 202, r.text
    b = s.wait_batch(r.json()["id"])
    assert b["state"] == "failed", b
    # the client's data, told apart from a batch the service could not start (submit_failed)
    assert b["error"]["code"] == "jpeg_undecodable", b
    assert "sample 1" in b["error"]["message"]
    assert s.metric("streamfeed_steps_total") == 0
    # The same files on POST /v1/transform: the client's error, not the service's.
    r = s.post_batch(jpeg_body([files[0], damaged, files[2]], labels), path="/v1/transform")
    assert r.status_code == 422 and r.json()["error"]["code"] == "jpeg_undecodable", r.text
    assert "sample 1" in r.json()["error"]["message"]


def test_a_jpeg_batch_for_a_model_of_other_input_size_is_refused_with_shape_mismatch(start_server):
    s = start_server(TINY)
    rng = np.random.default_rng(8)
    files = [to_jpeg(rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)) for _ in range(2)]
    r = s.post_batch(jpeg_body(files, [0, 1]))
    assert r.status_code == 422 and r.json()["error"]["code"] == "shape_mismatch", r.text
    assert "48x40" in r.json()["error"]["message"]
    assert s.metric("streamfeed_ring_slots", state="free") == s.config()["ring"]["slots"]


def test_files_of_different_sizes_train_as_one_ragged_batch_when_the_augmentation_fixes_the_size(start_server):
    """A resize maps every source to the model's input, so a batch may mix
    sizes; its transform equals that of each decoded image alone."""
    s = start_server(TINY_256)
    rng = np.random.default_rng(10)
    shapes = [(40, 56), (32, 32), (100, 80), (17, 300)]
    files = []
    for h, w in shapes:
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        img[h // 4:h // 2, w // 4:w // 2] = 230
        files.append(to_jpeg(img))
    r = s.post_batch(jpeg_body(files, [0, 1, 2, 3]), wait=True)
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    got = s.post_batch(jpeg_body(files, [0, 1, 2, 3]), path="/v1/transform")
    assert got.status_code == 200, got.text
    out = st_load(got.content)["images"]
    assert out.shape == (4, 3, 32, 32)
    for i, f in enumerate(files):
        pixels = np.asarray(Image.open(io.BytesIO(f)).convert("RGB"))[None]
        one = s.post_batch(st_body(pixels, np.array([0])), path="/v1/transform")
        assert one.status_code == 200, one.text
        diff = np.abs(out[i] - st_load(one.content)["images"][0]).max()
        assert diff <= 1.0 * 0.0039 + 1e-6, f"sample {i} {shapes[i]}: differs by {diff}"


def test_files_of_different_sizes_are_refused_naming_one_when_the_augmentation_needs_one_size(start_server):
    s = start_server(TINY)
    rng = np.random.default_rng(11)
    files = [to_jpeg(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)),
             to_jpeg(rng.integers(0, 256, (40, 32, 3), dtype=np.uint8))]
    r = s.post_batch(jpeg_body(files, [0, 1]))
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "jpeg_sizes_differ" and err["field"] == "jpeg[1]"
    assert "40x32" in err["message"]


# ---- the reference loader ---------------------------------------------------------



def run_load(s, *args):
    p = subprocess.run([LOAD_BIN, "--url", s.url, "--drain", "--json", "--quiet", *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_streamfeed_load_dir_leaves_out_the_files_the_service_would_refuse(start_server, tmp_path):
    """A crawled data set's few bad files (a GIF named .jpg, an empty or cut
    file) are left out of the pool, said on stderr, and the next files fill
    their batches: no batch is refused. Its CMYK JPEGs train, and so does
    its PNG named .JPEG (ImageNet holds one): a file's format is its first
    bytes, not its name."""
    s = start_server(TINY)
    rng = np.random.default_rng(11)

    def img():
        return rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for i in range(5):
        (tmp_path / "a" / f"{i}.jpg").write_bytes(to_jpeg(img()))
        (tmp_path / "b" / f"{i}.JPEG").write_bytes(to_jpeg(img()))  # any case, as torchvision
    cmyk = io.BytesIO()
    Image.fromarray(img()).convert("CMYK").save(cmyk, format="JPEG")
    (tmp_path / "a" / "cmyk.jpg").write_bytes(cmyk.getvalue())
    png = io.BytesIO()
    Image.fromarray(img()).save(png, format="PNG")
    (tmp_path / "b" / "png.JPEG").write_bytes(png.getvalue())
    gif = io.BytesIO()
    Image.fromarray(img()).save(gif, format="GIF")
    (tmp_path / "b" / "gif.jpg").write_bytes(gif.getvalue())
    (tmp_path / "b" / "empty.jpg").write_bytes(b"")
    (tmp_path / "a" / "cut.jpg").write_bytes(to_jpeg(img())[:200])
    p = subprocess.run([LOAD_BIN, "--url", s.url, "--drain", "--json", "--dir", f"{tmp_path}//", "--batch", "5",
                        "--batches", "4", "--label-dtype", "u8"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["accepted"] == 4 and summary["rejected"] == 0 and summary["errors"] == {}, summary
    assert s.metric("streamfeed_samples_trained_total") == 20
    assert "cmyk.jpg" not in p.stderr and "png.JPEG" not in p.stderr, p.stderr
    for name, code in (("gif.jpg", "jpeg_not_jpeg"),
                       ("empty.jpg", "cannot read it (empty)"), ("cut.jpg", "jpeg_truncated")):
        assert any(name in ln and code in ln for ln in p.stderr.splitlines()), (name, p.stderr)
    # "--dir train//": the paths said are train/<class>/<file>, not train//<class>.
    assert f"{tmp_path}/a/cut.jpg" in p.stderr and f"{tmp_path}//" not in p.stderr, p.stderr
    assert "left out 3 of the 15 files" in p.stderr, p.stderr
    # Nothing the service can decode: said, and no batch is sent.
    bad = tmp_path / "bad"
    (bad / "c").mkdir(parents=True)
    (bad / "c" / "x.jpg").write_bytes(gif.getvalue())
    p = subprocess.run([LOAD_BIN, "--url", s.url, "--dir", str(bad), "--quiet"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "no file of the 1 is one the service can decode" in p.stderr, p.stderr


def test_streamfeed_load_dir_numbers_hidden_class_folders_as_torchvision_does(start_server, tmp_path):
    """torchvision's ImageFolder counts every subfolder as a class, hidden ones
    (a stray .ipynb_checkpoints) included; the loader's labels must match it.
    Ten classes before c9 make c9's label 10, which the tiny model (10
    classes) refuses: the refusal shows the numbering."""
    s = start_server(TINY)
    rng = np.random.default_rng(12)
    (tmp_path / ".ipynb_checkpoints").mkdir()
    for k in range(10):
        (tmp_path / f"c{k}").mkdir()
    (tmp_path / "c9" / "nested").mkdir()
    for i in range(4):
        # one in a subfolder: ImageFolder walks the class folder's whole tree
        where = tmp_path / "c9" / ("nested" if i == 3 else "")
        (where / f"{i}.jpg").write_bytes(to_jpeg(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)))
    p = subprocess.run([LOAD_BIN, "--url", s.url, "--drain", "--json", "--dir", str(tmp_path), "--batch",
                        "4", "--batches", "1"], capture_output=True, text=True, timeout=120)
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["accepted"] == 0 and summary["rejected"] == 1, summary
    assert list(summary["errors"]) == ["label_out_of_range"], summary
    assert "4 image files in 11 class folders" in p.stderr, p.stderr
    assert ".ipynb_checkpoints holds no image file (.jpg, .jpeg, .png, .webp); it still counts as class 0" in p.stderr, \
        p.stderr
    (tmp_path / ".ipynb_checkpoints").rmdir()
    summary = run_load(s, "--dir", str(tmp_path), "--batch", "4", "--batches", "1")
    assert summary["accepted"] == 1 and summary["errors"] == {}, summary


def test_streamfeed_load_w1_jpeg_generates_its_files_once_and_they_train(start_server, tmp_path):
    s = start_server(TINY_256)
    cache = tmp_path / "cache"
    summary = run_load(s, "--workload", "w1-jpeg", "--cache-dir", str(cache), "--pool", "2", "--batch", "8",
                       "--batches", "6")
    assert summary["accepted"] == 6 and summary["failed"] == 0 and summary["errors"] == {}, summary
    (folder,) = cache.iterdir()
    files = sorted(folder.glob("*/*.jpg"))
    assert len(files) == 16 and len({f.parent.name for f in files}) == 10
    first = files[0].read_bytes()
    im = Image.open(io.BytesIO(first))
    assert im.size == (256, 256) and im.format == "JPEG"
    px = np.asarray(im, dtype=np.float64)
    assert 4_000 < len(first) < 100_000, "quality-90 files of natural content, neither flat nor noise"
    assert px.std() > 10
    # Bytes on the wire: the files, not their pixels.
    assert summary["bytes"] < 6 * 8 * 256 * 256 * 3 / 4
    mtime = files[0].stat().st_mtime_ns
    run_load(s, "--workload", "w1-jpeg", "--cache-dir", str(cache), "--pool", "2", "--batch", "8", "--batches", "2")
    assert files[0].stat().st_mtime_ns == mtime, "the cached files were made again"
    assert s.metric("streamfeed_steps_total") == 8


def test_streamfeed_load_dir_sends_the_jpegs_of_class_folders_as_encoded_batches(start_server, tmp_path):
    s = start_server(TINY)
    rng = np.random.default_rng(9)
    for cls in ("b_second", "a_first"):
        (tmp_path / cls).mkdir()
        for i in range(3):
            (tmp_path / cls / f"{i}.jpg").write_bytes(to_jpeg(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)))
    (tmp_path / "a_first" / "readme.txt").write_text("not an image")
    summary = run_load(s, "--dir", str(tmp_path), "--batch", "6", "--batches", "3", "--label-dtype", "u8")
    assert summary["accepted"] == 3 and summary["errors"] == {}, summary
    assert s.metric("streamfeed_samples_trained_total") == 18
    empty = tmp_path / "empty"
    empty.mkdir()
    p = subprocess.run([LOAD_BIN, "--url", s.url, "--dir", str(empty), "--quiet"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "class folder" in p.stderr


def test_streamfeed_load_sends_labels_in_the_smallest_dtype_the_classes_need(tmp_path):
    def prepared(*args):
        p = subprocess.run([LOAD_BIN, "--prepare", "--batch", "4", *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return p.stdout
    assert "labels U8" in prepared("--workload", "tiny")
    assert "labels I64" in prepared("--workload", "tiny", "--label-dtype", "i64")
    tiny = to_jpeg(np.zeros((8, 8, 3), np.uint8))
    for k in range(257):  # one class more than U8 holds
        (tmp_path / f"c{k:03d}").mkdir()
        (tmp_path / f"c{k:03d}" / "0.jpg").write_bytes(tiny)
    assert "labels I32" in prepared("--dir", str(tmp_path))
