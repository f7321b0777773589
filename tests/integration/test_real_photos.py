"""Real photographs, re-encoded the ways a crawled data set holds them, through
streamfeed-load --dir, the Python client and POST /v1/transform, on the
reference backend, or on the backend STREAMFEED_PARITY_BACKEND names (cuda on
a GPU host: the GPU's decoders held to the same references).

The photographs ship inside PyPI packages (scikit-learn's china.jpg and
flower.jpg; matplotlib's grace_hopper.jpg when matplotlib is installed) and
are re-encoded with Pillow at test time into JPEG (4:4:4, 4:2:2, 4:2:0,
progressive, restart markers, optimised Huffman, grayscale, CMYK, EXIF
orientation, an ICC profile, a 64 KiB APP segment, bytes after EOI), PNG
(8- and 16-bit RGB, palette, alpha, grayscale) and WebP (lossy, lossless).
Every file trains or is left out by name, none costs its batch, and every
decode equals Pillow's or torchvision's: JPEG within one grey level of
libjpeg-turbo (Pillow's decoder), PNG to the value (torchvision's
decode_image), WebP to the value (libwebp's own output, through
torchvision). On the GPU a progressive JPEG may be within three levels: nvJPEG
computes its inverse DCT of refined coefficients in its own order."""
import os
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageCms
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from sfharness import LOAD_BIN, wait_until

sk_datasets = pytest.importorskip("sklearn.datasets")
torch = pytest.importorskip("torch")
tvio = pytest.importorskip("torchvision.io")

REPO = Path(__file__).resolve().parents[2]
BACKEND = os.environ.get("STREAMFEED_PARITY_BACKEND", "ref")
TRAIN = ["--model.preset", "tiny", "--pipeline.backend", BACKEND, "--augment.pipeline",
         '[{"op":"resize","size":[32,32]},{"op":"to_dtype","scale":0.0039}]']
PIXELS = ["--model.preset", "tiny", "--pipeline.backend", BACKEND, "--augment.pipeline",
          '[{"op":"to_dtype","scale":1.0}]']


def photographs():
    """{name: RGB uint8 array} of the photographs the installed packages hold."""
    out = {n.split(".")[0]: sk_datasets.load_sample_image(n) for n in ("china.jpg", "flower.jpg")}
    try:
        from matplotlib import cbook
        with cbook.get_sample_data("grace_hopper.jpg") as f:
            out["grace_hopper"] = np.asarray(Image.open(f).convert("RGB"))
    except (ImportError, OSError, ValueError):
        pass
    return out


def encode(im, fmt, **kw):
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def with_app_segment(f, size=65533):
    """f with an APP15 segment of size bytes right after SOI (camera makers
    write such maker notes and previews)."""
    seg = b"\xff\xef" + (size + 2).to_bytes(2, "big") + bytes(range(256)) * (size // 256) + bytes(size % 256)
    return f[:2] + seg + f[2:]


def png16(rgb):
    """A 16-bit RGB PNG of rgb (each value v as v * 257 + a low byte of noise)."""
    import struct
    import zlib
    wide = rgb.astype(np.uint16) * 257 + (np.arange(rgb.size, dtype=np.uint16).reshape(rgb.shape) % 200)
    h, w = rgb.shape[:2]
    raw = b"".join(b"\x00" + wide[y].astype(">u2").tobytes() for y in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def variants(rgb):
    """{variant: file bytes} of one photograph."""
    im = Image.fromarray(rgb)
    exif = Image.Exif()
    exif[0x0112] = 6
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    alpha = np.dstack([rgb, (np.arange(rgb.shape[0] * rgb.shape[1]) % 256).reshape(rgb.shape[:2]).astype(np.uint8)])
    base = encode(im, "JPEG", quality=90)
    return {
        "444.jpg": encode(im, "JPEG", quality=90, subsampling=0),
        "422.jpg": encode(im, "JPEG", quality=90, subsampling=1),
        "420.jpg": base,
        "progressive.jpg": encode(im, "JPEG", quality=85, progressive=True),
        "restart.jpg": encode(im, "JPEG", quality=90, restart_marker_blocks=4),
        "optimized.jpg": encode(im, "JPEG", quality=75, optimize=True),
        "gray.jpg": encode(im.convert("L"), "JPEG", quality=90),
        "cmyk.jpg": encode(im.convert("CMYK"), "JPEG", quality=90),
        "exif_rotated.jpg": encode(im, "JPEG", quality=90, exif=exif.tobytes()),
        "icc.jpg": encode(im, "JPEG", quality=90, icc_profile=srgb),
        "large_app.jpg": with_app_segment(base),
        "trailing.jpg": base + b"\x00\x00<html>trailer</html>",
        "rgb8.png": encode(im, "PNG"),
        "rgb16.png": png16(rgb),
        "palette.png": encode(im.quantize(64), "PNG"),
        "alpha.png": encode(Image.fromarray(alpha, "RGBA"), "PNG"),
        "gray.png": encode(im.convert("L"), "PNG"),
        "lossy.webp": encode(im, "WEBP", quality=80),
        "lossless.webp": encode(im, "WEBP", lossless=True),
    }


def reference_rgb(name, f):
    """The decode the service must match: Pillow's for JPEG (libjpeg-turbo,
    CMYK converted as torchvision converts it), torchvision's decode_image
    for PNG (16-bit taken to its high byte) and WebP."""
    if name.endswith(".jpg"):
        tol = 3.0 if BACKEND == "cuda" and name.startswith("progressive") else 1.0
        return np.asarray(Image.open(io.BytesIO(f)).convert("RGB")), tol
    t = tvio.decode_image(torch.frombuffer(bytearray(f), dtype=torch.uint8), mode=tvio.ImageReadMode.RGB)
    if t.dtype == torch.uint16:
        t = (t.to(torch.int32) >> 8).to(torch.uint8)
    return t.permute(1, 2, 0).numpy(), 0.0


@pytest.fixture(scope="module")
def photo_files():
    """[(photo, variant, bytes)] for every photograph and variant."""
    out = []
    for p, rgb in sorted(photographs().items()):
        for v, f in variants(rgb).items():
            out.append((p, v, f))
    return out


def files_body(files, labels):
    offsets = np.zeros(len(files) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(f) for f in files])
    return st_save({"files": np.frombuffer(b"".join(files), dtype=np.uint8), "files_offsets": offsets,
                    "labels": np.asarray(labels, dtype=np.int64)})


def test_every_variant_of_every_photograph_decodes_as_pillow_or_torchvision_decodes_it(start_server, photo_files):
    s = start_server(PIXELS)
    assert len(photo_files) >= 2 * 19
    for p, v, f in photo_files:
        r = s.post_batch(files_body([f], [0]), path="/v1/transform")
        assert r.status_code == 200, (p, v, r.text)
        assert "Streamfeed-Skipped-Samples" not in r.headers, (p, v)
        got = st_load(r.content)["images"][0].transpose(1, 2, 0)
        want, tol = reference_rgb(v, f)
        assert got.shape == want.shape, (p, v, got.shape, want.shape)
        diff = np.abs(got - want.astype(np.float32))
        print(f"{BACKEND} {p}/{v}: largest difference {diff.max():g} levels (bound {tol:g})")
        assert diff.max() <= tol, f"{p}/{v}: {int((diff > tol).sum())} values differ by more than {tol}, " \
                                  f"up to {diff.max()}"


def damaged(f):
    """A PNG whose IDAT data is damaged: its header passes, its decode fails."""
    b = bytearray(f)
    i = b.index(b"IDAT") + 40
    b[i:i + 64] = bytes(64)
    return bytes(b)


def image_folder(tmp_path, photo_files):
    """An ImageFolder of the variants, one class per photograph, plus one
    damaged PNG in the first class; returns the damaged file's path."""
    classes = sorted({p for p, _, _ in photo_files})
    for p, v, f in photo_files:
        d = tmp_path / p
        d.mkdir(exist_ok=True)
        (d / v).write_bytes(f)
    bad = tmp_path / classes[0] / "zz_damaged.png"
    bad.write_bytes(damaged(next(f for p, v, f in photo_files if v == "rgb8.png")))
    return bad


def test_streamfeed_load_dir_trains_every_variant_and_names_the_one_file_it_cannot_decode(start_server, tmp_path,
                                                                                          photo_files):
    s = start_server(TRAIN)
    bad = image_folder(tmp_path, photo_files)
    n = len(photo_files) + 1
    p = subprocess.run([LOAD_BIN, "--url", s.url, "--wait", "--json", "--dir", str(tmp_path), "--batch", "8",
                        "--batches", str((n + 7) // 8), "--label-dtype", "u8", "--seed", "1"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert "leaving out" not in p.stderr, p.stderr  # every file passes the loader's header check
    assert summary["rejected"] == 0 and summary["errors"] == {}, summary
    assert summary["undecodable_files"] == 1, summary
    named = [ln for ln in p.stderr.splitlines() if "left out" in ln]
    assert named == [f"streamfeed-load: the service left out {bad}: png_undecodable (it could not decode the "
                     "file; its batch trained without it)"], p.stderr


def test_the_python_client_feeds_the_folder_and_names_the_one_file_it_cannot_decode(start_server, tmp_path,
                                                                                   photo_files):
    try:
        import streamfeed  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "client" / "python"))
    from streamfeed import Client
    from streamfeed.jpeg import feed_jpeg, image_folder as folder_samples

    s = start_server(TRAIN)
    bad = image_folder(tmp_path, photo_files)
    samples = folder_samples(tmp_path)
    assert len(samples) == len(photo_files) + 1
    summary = feed_jpeg(Client(s.url), samples, 8, seed=1)
    assert summary.errors == {}, summary
    assert summary.skipped_files == {"png_undecodable": 1}, summary
    assert [(Path(k.name), k.code) for k in summary.skipped] == [(bad, "png_undecodable")], summary.skipped
    wait_until(lambda: s.metric("streamfeed_samples_trained_total") >= len(photo_files), 60,
               what="every decodable file to train")
    assert s.metric("streamfeed_samples_trained_total") == len(photo_files)
