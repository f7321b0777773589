"""JPEG files as crawled data sets hold them, through the real HTTP path on
the reference backend: bytes after the end-of-image marker, a file whose
header passes but whose data the decoder refuses (left out of its batch, the
rest trains), CMYK, YCCK-free CMYK from Pillow and arithmetic-coded files
(decoded as torchvision and Pillow do), and a file of a bogus progression
over a large header (it fails fast and delays no good batch)."""
import io
import time

import numpy as np
from PIL import Image
from safetensors.numpy import load as st_load

from sfharness import TINY, jpeg_body, learnable_jpeg_batch, st_body, to_jpeg

# Any source size trains the tiny model behind a resize.
TINY_ANY = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline",
            '[{"op":"resize","size":[32,32]},{"op":"to_dtype","scale":0.0039}]']


def bogus_huffman(f):
    """f with its first DHT's code counts made impossible (more codes of
    length 1 than exist): the header reader passes it, libjpeg refuses it."""
    b = bytearray(f)
    i = b.index(b"\xff\xc4")
    b[i + 5] = 0xFF  # the count of codes of length 1
    return bytes(b)


def test_bytes_after_the_end_of_image_marker_are_accepted_and_train(start_server):
    s = start_server(TINY)
    rng = np.random.default_rng(1)
    files, labels = learnable_jpeg_batch(rng, 3)
    tailed = [files[0] + b"\x17trailer<html></html>", files[1] + b"\x00\x00junk\xff\xd8", files[2]]
    r = s.post_batch(jpeg_body(tailed, labels), wait=True)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "done" and r.json()["skipped_samples"] == [], r.text
    # The decoded pixels are those of the files without their tails.
    a = s.post_batch(jpeg_body(tailed, labels), path="/v1/transform")
    b = s.post_batch(jpeg_body(files, labels), path="/v1/transform")
    assert a.status_code == 200 and b.status_code == 200, (a.text, b.text)
    assert np.array_equal(st_load(a.content)["images"], st_load(b.content)["images"])
    # A scan really cut short stays refused.
    cut = files[1][:len(files[1]) - 30] + b"\x17tail"
    r = s.post_batch(jpeg_body([files[0], cut], [0, 1]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "jpeg_truncated", r.text
    assert r.json()["error"]["field"] == "jpeg[1]"


def test_an_undecodable_sample_is_left_out_and_the_batch_trains_on_the_rest(start_server):
    """The batch trains on the samples decoded: its loss equals that of the
    same batch without the bad file on a twin server; the reply, GET
    /v1/batches/{id} and a counter name the sample left out."""
    rng = np.random.default_rng(2)
    files, labels = learnable_jpeg_batch(rng, 4)
    bad = bogus_huffman(files[1])
    s = start_server(TINY + ["--model.seed", "3"])
    r = s.post_batch(jpeg_body([files[0], bad, files[2], files[3]], labels), wait=True)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["state"] == "done", got
    assert got["skipped_samples"] == [{"index": 1, "field": "jpeg[1]", "code": "jpeg_undecodable"}], got
    assert got["n"] == 4 and got["samples_trained"] == 3, got
    assert s.batch(got["id"])["skipped_samples"] == got["skipped_samples"]
    assert s.metric("streamfeed_samples_undecodable_total") == 1
    assert s.metric("streamfeed_samples_trained_total") == 3
    assert s.metric("streamfeed_steps_total") == 1
    twin = start_server(TINY + ["--model.seed", "3"])
    r = twin.post_batch(jpeg_body([files[0], files[2], files[3]], [labels[0], labels[2], labels[3]]), wait=True)
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    assert abs(r.json()["loss"] - got["loss"]) < 1e-6, (r.json()["loss"], got["loss"])
    assert r.json()["accuracy"] == got["accuracy"]


def test_a_batch_of_which_no_file_decodes_fails_alone_and_the_next_trains(start_server):
    s = start_server(TINY)
    rng = np.random.default_rng(4)
    files, labels = learnable_jpeg_batch(rng, 2)
    r = s.post_batch(jpeg_body([bogus_huffman(f) for f in files], labels), wait=True)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "failed" and r.json()["error"]["code"] == "jpeg_undecodable", r.text
    assert "sample 0" in r.json()["error"]["message"]
    r = s.post_batch(jpeg_body(files, labels), wait=True)
    assert r.status_code == 200 and r.json()["state"] == "done" and r.json()["step"] == 1, r.text


def test_with_on_undecodable_fail_one_bad_file_fails_its_batch(start_server):
    s = start_server(TINY + ["--decode.on_undecodable", "fail"])
    assert s.config()["decode"]["on_undecodable"] == "fail"
    rng = np.random.default_rng(5)
    files, labels = learnable_jpeg_batch(rng, 3)
    r = s.post_batch(jpeg_body([files[0], bogus_huffman(files[1]), files[2]], labels), wait=True)
    assert r.status_code == 200 and r.json()["state"] == "failed", r.text
    assert r.json()["error"]["code"] == "jpeg_undecodable" and "sample 1" in r.json()["error"]["message"]
    assert s.metric("streamfeed_steps_total") == 0
    # The setting is hot: skip from the next batch on.
    assert s.patch_config({"decode": {"on_undecodable": "skip"}}).status_code == 200
    r = s.post_batch(jpeg_body([files[0], bogus_huffman(files[1]), files[2]], labels), wait=True)
    assert r.json()["state"] == "done" and r.json()["samples_trained"] == 2, r.text


def test_the_transform_names_the_samples_its_output_leaves_out(start_server):
    s = start_server(TINY)
    rng = np.random.default_rng(6)
    files, labels = learnable_jpeg_batch(rng, 3)
    r = s.post_batch(jpeg_body([files[0], bogus_huffman(files[1]), files[2]], labels), path="/v1/transform")
    assert r.status_code == 200, r.text
    assert r.headers["Streamfeed-Skipped-Samples"] == "1"
    out = st_load(r.content)["images"]
    assert out.shape == (3, 3, 32, 32) and not out[1].any()
    whole = st_load(s.post_batch(jpeg_body(files, labels), path="/v1/transform").content)["images"]
    assert np.array_equal(out[0], whole[0]) and np.array_equal(out[2], whole[2])
    assert "Streamfeed-Skipped-Samples" not in s.post_batch(jpeg_body(files, labels), path="/v1/transform").headers


def bogus_progression(small, side, scans):
    """A real progressive file of `small` pixels whose SOF declares side x
    side, with `scans` more empty scans: its data runs out in the first
    scan, and each scan would be a pass over side x side pixels."""
    b = bytearray(small)
    i = next(i for i in range(2, len(b) - 1) if b[i] == 0xFF and b[i + 1] == 0xC2)
    b[i + 5:i + 9] = side.to_bytes(2, "big") * 2
    scan = bytes([0xFF, 0xDA, 0x00, 0x08, 0x01, 0x01, 0x00, 0x01, 0x3F, 0x00, 0x12, 0x34])  # AC 1..63 again
    return bytes(b[:-2]) + scan * scans + b"\xff\xd9"


def test_a_bogus_progression_over_a_large_header_fails_fast_and_delays_no_good_batch(start_server):
    s = start_server(TINY_ANY)
    rng = np.random.default_rng(7)
    img = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    bogus = bogus_progression(to_jpeg(img, progressive=True), 4096, 50)
    assert len(bogus) < 10_000
    good = [to_jpeg(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)) for _ in range(2)]
    t0 = time.monotonic()
    r = s.post_batch(jpeg_body([bogus, good[0]], [0, 1]), wait=True)
    bogus_s = time.monotonic() - t0
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    assert [k["index"] for k in r.json()["skipped_samples"]] == [0], r.text
    ids = [s.post_batch(jpeg_body([bogus], [0])).json()["id"] for _ in range(4)]
    t0 = time.monotonic()
    r = s.post_batch(jpeg_body(good, [0, 1]), wait=True)
    good_s = time.monotonic() - t0
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    for i in ids:
        assert s.wait_batch(i)["error"]["code"] == "jpeg_undecodable"
    assert bogus_s < 0.25, f"a batch with the bogus file took {bogus_s:.2f} s"
    assert good_s < 1.0, f"a good batch behind four bogus ones took {good_s:.2f} s"


def test_a_progressive_file_of_more_scans_than_its_size_allows_is_refused_at_its_header(start_server):
    s = start_server(TINY_ANY)
    rng = np.random.default_rng(8)
    img = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    r = s.post_batch(jpeg_body([bogus_progression(to_jpeg(img, progressive=True), 4096, 100)], [0]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "jpeg_unsupported", r.text
    assert "more than 64 scans" in r.json()["error"]["message"]


def photo(rng, h=48, w=64):
    """A smooth image with edges: what a codec keeps well."""
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) * 127 // (h + w))], -1).astype(np.uint8)
    img[h // 4:h // 2, w // 3:w // 2] = rng.integers(0, 256, 3, dtype=np.uint8)
    return img


def test_cmyk_files_decode_as_pillow_converts_them_to_rgb(start_server):
    """Pillow writes Adobe's inverted CMYK; torchvision's decode_jpeg(mode=RGB)
    and Pillow's convert("RGB") turn it into the same RGB, and so does the
    service (within 1 grey level of Pillow)."""
    s = start_server(["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline",
                      '[{"op":"to_dtype","scale":1.0}]'])
    rng = np.random.default_rng(9)
    files, want = [], []
    for q in (75, 95):
        buf = io.BytesIO()
        Image.fromarray(photo(rng, 32, 32)).convert("CMYK").save(buf, format="JPEG", quality=q)
        files.append(buf.getvalue())
        want.append(np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB")))
    assert Image.open(io.BytesIO(files[0])).mode == "CMYK"
    r = s.post_batch(jpeg_body(files, [0, 1]), path="/v1/transform")
    assert r.status_code == 200, r.text
    got = st_load(r.content)["images"].transpose(0, 2, 3, 1)
    diff = np.abs(got - np.stack(want).astype(np.float32)).max()
    assert diff <= 1.0, f"CMYK decodes differ from Pillow's by up to {diff} grey levels"
    r = s.post_batch(jpeg_body(files, [0, 1]), wait=True)
    assert r.json()["state"] == "done" and r.json()["skipped_samples"] == [], r.text


DATA = __import__("pathlib").Path(__file__).parent / "data"


def test_ycck_cmyk_and_arithmetic_coded_files_decode_as_pillow_decodes_them(start_server):
    """Files libjpeg-turbo wrote (tests/integration/data: arithmetic-coded
    sequential 4:2:0 and progressive, YCCK and CMYK with an Adobe marker,
    32x48): the service's decode equals Pillow's to the grey level."""
    s = start_server(["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline",
                      '[{"op":"center_crop","size":[32,32]},{"op":"to_dtype","scale":1.0}]'])
    names = ["arithmetic_420_32x48.jpg", "arithmetic_progressive_32x48.jpg", "ycck_32x48.jpg",
             "cmyk_adobe_32x48.jpg"]
    files = [(DATA / n).read_bytes() for n in names]
    r = s.post_batch(jpeg_body(files, [0, 1, 2, 3]), path="/v1/transform")
    assert r.status_code == 200, r.text
    assert "Streamfeed-Skipped-Samples" not in r.headers
    got = st_load(r.content)["images"].transpose(0, 2, 3, 1)
    for i, f in enumerate(files):
        want = np.asarray(Image.open(io.BytesIO(f)).convert("RGB"))[:, 8:40].astype(np.float32)
        diff = np.abs(got[i] - want).max()
        assert diff <= 1.0, f"{names[i]}: differs from Pillow's decode by up to {diff} grey levels"
    r = s.post_batch(jpeg_body(files, [0, 1, 2, 3]), wait=True)
    assert r.json()["state"] == "done" and r.json()["samples_trained"] == 4, r.text


def test_streamfeed_load_dir_names_the_files_the_service_could_not_decode(start_server, tmp_path):
    """A file whose header passes but whose data the decoder refuses is sent
    (the loader's header check cannot see it); the service leaves it out and
    trains its batch; the loader names it from the batch's result."""
    import json
    import subprocess

    from sfharness import LOAD_BIN
    s = start_server(TINY)
    rng = np.random.default_rng(12)
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(5):
            f = to_jpeg(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
            (tmp_path / c / f"{i}.jpg").write_bytes(bogus_huffman(f) if (c, i) == ("b", 3) else f)
    p = subprocess.run([LOAD_BIN, "--url", s.url, "--drain", "--json", "--dir", str(tmp_path), "--batch", "5",
                        "--batches", "2", "--label-dtype", "u8"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["accepted"] == 2 and summary["rejected"] == 0 and summary["errors"] == {}, summary
    assert summary["undecodable_files"] == 1, summary
    assert s.metric("streamfeed_samples_trained_total") == 9
    lines = [ln for ln in p.stderr.splitlines() if "jpeg_undecodable" in ln]
    assert lines == [f"streamfeed-load: the service left out {tmp_path}/b/3.jpg: jpeg_undecodable (it could not "
                     "decode the file; its batch trained without it)"], p.stderr
    # With --wait the trained batch's reply names it; each pool body's file once, however often it is sent.
    p = subprocess.run([LOAD_BIN, "--url", s.url, "--wait", "--json", "--dir", str(tmp_path), "--batch", "5",
                        "--batches", "6", "--label-dtype", "u8"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1])["undecodable_files"] == 1, p.stdout
    assert sum("b/3.jpg: jpeg_undecodable" in ln for ln in p.stderr.splitlines()) == 1, p.stderr


def padded_photo(h, w, size):
    """A real small JPEG whose SOF declares h x w, padded with COM segments to
    `size` bytes: what the header check sees of a camera file (a sink-mode
    server never decodes it)."""
    b = bytearray(to_jpeg(np.full((16, 16, 3), 128, dtype=np.uint8)))
    i = next(i for i in range(2, len(b) - 1) if b[i] == 0xFF and b[i + 1] == 0xC0)
    b[i + 5:i + 9] = h.to_bytes(2, "big") + w.to_bytes(2, "big")
    pad = bytearray()
    while len(b) + len(pad) < size:
        n = min(65533, size - len(b) - len(pad))
        pad += b"\xff\xfe" + (n + 2).to_bytes(2, "big") + bytes(n)
    return bytes(b[:2] + pad + b[2:])


def test_a_batch_of_eight_phone_photos_and_a_24_megapixel_file_are_accepted_by_default(start_server):
    s = start_server(TINY_ANY + ["--pipeline.mode", "sink"])
    photos = [padded_photo(3000, 4000, 5_000_000) for _ in range(8)]  # 12 MP, 5 MB each
    r = s.post_batch(jpeg_body(photos, list(range(8))))
    assert r.status_code == 202, r.text[:300]
    r = s.post_batch(jpeg_body([padded_photo(4000, 6000, 20_000)], [0]))  # 24 MP
    assert r.status_code == 202, r.text[:300]


def test_every_size_refusal_names_the_option_to_raise(start_server):
    s = start_server(TINY_ANY + ["--ring.slot_bytes", "65536", "--limits.max_n", "2", "--http.max_json_bytes",
                                 "1024", "--jpeg.max_pixels", "80000", "--jpeg.max_batch_pixels", "100000"])
    big = padded_photo(100, 100, 70_000)
    cases = [
        (s.post_batch(jpeg_body([big], [0])), 413, "batch_exceeds_slot", "ring.slot_bytes"),
        (s.post_batch(jpeg_body([padded_photo(100, 100, 2000)] * 3, [0, 1, 2])), 422, "batch_too_large",
         "limits.max_n"),
        (s.post_batch(jpeg_body([padded_photo(400, 400, 2000)], [0])), 422, "jpeg_too_many_pixels",
         "jpeg.max_pixels"),
        (s.post_batch(jpeg_body([padded_photo(250, 250, 2000)] * 2, [0, 1])), 422, "jpeg_batch_too_large",
         "jpeg.max_batch_pixels"),
        (s.request("POST", "/v1/batches", data=b"\0" * 200_000,
                   headers={"Content-Type": "application/vnd.safetensors"}), 413, "body_too_large",
         "ring.slot_bytes"),
        (s.patch_config(b"{" + b" " * 2000 + b"}"), 413, "body_too_large", "http.max_json_bytes"),
    ]
    for r, status, code, option in cases:
        assert r.status_code == status and r.json()["error"]["code"] == code, r.text
        assert option in r.json()["error"]["message"], r.text


def test_streamfeed_load_dir_leaves_out_the_files_over_the_servers_size_bounds(start_server, tmp_path):
    """The loader reads the server's bounds (GET /v1/config) before it makes
    its pool: a file over jpeg.max_pixels or jpeg.max_side is left out,
    named, and no batch is refused for it."""
    import json
    import subprocess

    from sfharness import LOAD_BIN
    s = start_server(TINY_ANY + ["--jpeg.max_pixels", "50000", "--jpeg.max_side", "1000"])
    rng = np.random.default_rng(13)
    (tmp_path / "c").mkdir()
    for i in range(6):
        (tmp_path / "c" / f"{i}.jpg").write_bytes(to_jpeg(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)))
    (tmp_path / "c" / "big.jpg").write_bytes(padded_photo(300, 300, 2000))    # 90 000 pixels
    (tmp_path / "c" / "wide.jpg").write_bytes(padded_photo(10, 2000, 2000))   # wider than 1000
    p = subprocess.run([LOAD_BIN, "--url", s.url, "--drain", "--json", "--dir", str(tmp_path), "--batch", "3",
                        "--batches", "2", "--label-dtype", "u8"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["accepted"] == 2 and summary["rejected"] == 0 and summary["errors"] == {}, summary
    assert any("big.jpg" in ln and "jpeg_too_many_pixels" in ln and "jpeg.max_pixels is 50000" in ln
               for ln in p.stderr.splitlines()), p.stderr
    assert any("wide.jpg" in ln and "jpeg_side_too_large" in ln and "jpeg.max_side is 1000" in ln
               for ln in p.stderr.splitlines()), p.stderr
    assert s.metric("streamfeed_batches_rejected_total", reason="jpeg_too_many_pixels") == 0


def test_an_eval_batch_leaves_out_an_undecodable_file_and_its_logits_row_is_nan(start_server):
    s = start_server(TINY)
    rng = np.random.default_rng(14)
    files, labels = learnable_jpeg_batch(rng, 3)
    r = s.request("POST", "/v1/batches?wait=1&mode=eval&return=logits",
                  data=jpeg_body([files[0], bogus_huffman(files[1]), files[2]], labels),
                  headers={"Content-Type": "application/vnd.safetensors"})
    assert r.status_code == 200, r.text
    assert r.headers["Streamfeed-Skipped-Samples"] == "1"
    logits = st_load(r.content)["logits"]
    assert logits.shape == (3, 10) and np.isnan(logits[1]).all()
    assert np.isfinite(logits[[0, 2]]).all()
    # The kept rows are those of the two files evaluated alone.
    alone = s.request("POST", "/v1/batches?wait=1&mode=eval&return=logits",
                      data=jpeg_body([files[0], files[2]], [labels[0], labels[2]]),
                      headers={"Content-Type": "application/vnd.safetensors"})
    assert np.allclose(st_load(alone.content)["logits"], logits[[0, 2]], rtol=1e-6, atol=1e-6)
