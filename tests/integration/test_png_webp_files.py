"""PNG and WebP files beside JPEG in one encoded batch, through the real HTTP
path on the reference backend: the body's format-neutral tensor names,
every PNG colour type and bit depth decoded as torchvision's
decode_image(mode=RGB) decodes it, WebP as libwebp (Pillow's and
torchvision's decoder) decodes it, a damaged file left out by name with its
format's code, the headers' refusals, and decode.exif_orientation against
PIL.ImageOps.exif_transpose for all eight orientations."""
import io

import numpy as np
import pytest
from PIL import Image, ImageOps
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from sfharness import jpeg_body

torch = pytest.importorskip("torch")
tvio = pytest.importorskip("torchvision.io")

PIXELS = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline",
          '[{"op":"to_dtype","scale":1.0}]']
TRAIN = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline",
         '[{"op":"resize","size":[32,32]},{"op":"to_dtype","scale":0.0039}]']


def files_body(files, labels, names=("files", "files_offsets")):
    offsets = np.zeros(len(files) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(f) for f in files])
    return st_save({names[0]: np.frombuffer(b"".join(files), dtype=np.uint8), names[1]: offsets,
                    "labels": np.asarray(labels, dtype=np.int64)})


def photo(rng, h=24, w=40):
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) * 127 // (h + w))], -1).astype(np.uint8)
    img[h // 4:h // 2, w // 3:w // 2] = rng.integers(0, 256, 3, dtype=np.uint8)
    return img


def encode(im, fmt, **kw):
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def png_variants(rng, h=24, w=40):
    """Every PNG colour type, with 16-bit and low-depth cases, all h x w."""
    rgb = photo(rng, h, w)
    gray = rgb[:, :, 0]
    alpha = rng.integers(0, 256, (h, w), dtype=np.uint8)
    wide = (rgb.astype(np.uint16) * 257 + rng.integers(0, 257, (h, w, 3))).astype(np.uint16)
    out = {
        "rgb8": encode(Image.fromarray(rgb), "PNG"),
        "rgba8": encode(Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), "PNG"),
        "gray8": encode(Image.fromarray(gray, "L"), "PNG"),
        "gray_alpha8": encode(Image.fromarray(np.dstack([gray, alpha]), "LA"), "PNG"),
        "gray16": encode(Image.fromarray(wide[:, :, 0]), "PNG"),
        "gray1": encode(Image.fromarray(gray > 128), "PNG"),
        "palette": encode(Image.fromarray(rgb).quantize(16), "PNG"),
        "palette_trns": encode(Image.fromarray(np.dstack([rgb, alpha]), "RGBA").quantize(16), "PNG"),
    }
    # 16-bit RGB: Pillow cannot write it; numpy + zlib can (one IDAT, filter 0).
    out["rgb16"] = raw_png(wide, 16, 2)
    out["rgba16"] = raw_png(np.dstack([wide, wide[:, :, :1]]), 16, 6)
    return out


def raw_png(a, depth, ctype):
    import struct
    import zlib

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    h, w = a.shape[:2]
    rows = a.astype(">u2").tobytes() if depth == 16 else a.astype(np.uint8).tobytes()
    stride = len(rows) // h
    raw = b"".join(b"\x00" + rows[y * stride:(y + 1) * stride] for y in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def torchvision_rgb8(f):
    """torchvision's decode_image(mode=RGB), 16-bit samples taken to 8 as its
    to_dtype(torch.uint8, scale=True) takes them (the high byte)."""
    t = tvio.decode_image(torch.frombuffer(bytearray(f), dtype=torch.uint8), mode=tvio.ImageReadMode.RGB)
    if t.dtype == torch.uint16:
        t = (t.to(torch.int32) >> 8).to(torch.uint8)
    return t.permute(1, 2, 0).numpy()


def transform_pixels(s, files, names=("files", "files_offsets")):
    r = s.post_batch(files_body(files, list(range(len(files))), names), path="/v1/transform")
    assert r.status_code == 200, r.text
    assert "Streamfeed-Skipped-Samples" not in r.headers, r.headers
    return st_load(r.content)["images"].transpose(0, 2, 3, 1)


def test_every_png_colour_type_decodes_as_torchvision_decode_image_rgb(start_server):
    s = start_server(PIXELS)
    variants = png_variants(np.random.default_rng(1))
    names = sorted(variants)
    got = transform_pixels(s, [variants[k] for k in names])
    for i, k in enumerate(names):
        want = torchvision_rgb8(variants[k]).astype(np.float32)
        diff = np.abs(got[i] - want)
        assert diff.max() == 0, f"{k}: {int((diff > 0).sum())} values differ, by up to {diff.max()}"


def test_webp_lossy_and_lossless_decode_as_libwebp_decodes_them(start_server):
    s = start_server(PIXELS)
    rng = np.random.default_rng(2)
    rgb = photo(rng)
    rgba = Image.fromarray(np.dstack([rgb, rng.integers(0, 256, rgb.shape[:2], dtype=np.uint8)]), "RGBA")
    files = {"lossy": encode(Image.fromarray(rgb), "WEBP", quality=80),
             "lossless": encode(Image.fromarray(rgb), "WEBP", lossless=True),
             "lossy_alpha": encode(rgba, "WEBP", quality=80),
             "lossless_alpha": encode(rgba, "WEBP", lossless=True)}
    names = sorted(files)
    got = transform_pixels(s, [files[k] for k in names])
    for i, k in enumerate(names):
        want = torchvision_rgb8(files[k]).astype(np.float32)
        assert np.array_equal(got[i], want), f"{k}: differs from libwebp's decode by up to {np.abs(got[i] - want).max()}"
    assert np.array_equal(got[names.index("lossless")], rgb.astype(np.float32))


def test_jpeg_png_and_webp_train_in_one_batch_under_either_tensor_name(start_server):
    s = start_server(TRAIN)
    rng = np.random.default_rng(3)
    rgb = Image.fromarray(photo(rng))
    files = [encode(rgb, "JPEG"), encode(rgb, "PNG"), encode(rgb, "WEBP")]
    for names in (("files", "files_offsets"), ("jpeg", "jpeg_offsets")):
        r = s.post_batch(files_body(files, [0, 1, 2], names), wait=True)
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "done" and r.json()["samples_trained"] == 3, r.text
    r = s.post_batch(files_body(files, [0, 1, 2], ("files", "jpeg_offsets")), wait=True)
    assert r.status_code == 200 and r.json()["samples_trained"] == 3, r.text
    # One role under both of its names is refused.
    offsets = np.array([0, len(files[0])], dtype=np.int64)
    body = st_save({"files": np.frombuffer(files[0], np.uint8), "jpeg": np.frombuffer(files[0], np.uint8),
                    "files_offsets": offsets, "labels": np.zeros(1, np.int64)})
    r = s.post_batch(body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "duplicate_key", r.text
    assert "alias" in r.json()["error"]["message"]


def damaged_png(f):
    """f with a byte of its IDAT data flipped: its header passes, its CRC
    (and its data) do not."""
    b = bytearray(f)
    i = b.index(b"IDAT") + 8
    b[i] ^= 0xFF
    return bytes(b)


def damaged_webp(f):
    """f with its compressed data after the headers zeroed."""
    b = bytearray(f)
    for k in range(40, len(b)):
        b[k] = 0
    return bytes(b)


@pytest.mark.parametrize("names", [("files", "files_offsets"), ("jpeg", "jpeg_offsets")])
def test_an_undecodable_png_or_webp_is_left_out_by_name_and_the_rest_trains(start_server, names):
    s = start_server(TRAIN)
    rng = np.random.default_rng(4)
    rgb = Image.fromarray(photo(rng, 48, 64))
    png, webp = encode(rgb, "PNG"), encode(rgb, "WEBP", lossless=True)
    files = [png, damaged_png(png), encode(rgb, "JPEG"), damaged_webp(webp), webp]
    r = s.post_batch(files_body(files, [0, 1, 2, 3, 0], names), wait=True)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["state"] == "done" and got["samples_trained"] == 3, got
    f = names[0]
    assert got["skipped_samples"] == [{"index": 1, "field": f"{f}[1]", "code": "png_undecodable"},
                                      {"index": 3, "field": f"{f}[3]", "code": "webp_undecodable"}], got


@pytest.mark.parametrize("case,code", [
    ("png_cut", "png_truncated"), ("png_no_ihdr", "png_malformed"), ("png_depth", "png_malformed"),
    ("webp_cut", "webp_truncated"), ("webp_bad_start", "webp_malformed"), ("gif", "jpeg_not_jpeg"),
    ("png_bomb", "jpeg_too_many_pixels"), ("webp_bomb", "jpeg_side_too_large")])
def test_a_bad_png_or_webp_header_is_refused_with_its_code_naming_the_file(start_server, case, code):
    s = start_server(TRAIN + ["--jpeg.max_side", "8192", "--jpeg.max_pixels", "1000000"])
    rng = np.random.default_rng(5)
    rgb = Image.fromarray(photo(rng))
    png, webp = encode(rgb, "PNG"), encode(rgb, "WEBP")
    bomb = bytearray(raw_png(np.zeros((4, 4, 3), np.uint8), 8, 2))
    bomb[16:24] = (4000).to_bytes(4, "big") + (4000).to_bytes(4, "big")
    vp8x = bytearray(b"RIFF" + (4 + 18 + len(webp) - 12).to_bytes(4, "little") + b"WEBP" + b"VP8X"
                     + (10).to_bytes(4, "little") + bytes(4) + (9999).to_bytes(3, "little")
                     + (9999).to_bytes(3, "little") + webp[12:])
    bad = {"png_cut": png[:-20], "png_no_ihdr": png[:12] + b"IHDX" + png[16:],
           "png_depth": png[:24] + b"\x07" + png[25:], "webp_cut": webp[:-10],
           "webp_bad_start": webp[:12] + b"ABCD" + webp[16:], "gif": b"GIF89a" + bytes(40),
           "png_bomb": bytes(bomb), "webp_bomb": bytes(vp8x)}[case]
    r = s.post_batch(files_body([png, bad], [0, 1]))
    assert r.status_code in (400, 422), r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["field"] == "files[1]", r.text


def exif_with_orientation(o):
    e = Image.Exif()
    e[0x0112] = o
    return e.tobytes()


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_exif_orientation_apply_turns_every_orientation_as_pillow_exif_transpose(start_server, fmt):
    rng = np.random.default_rng(6)
    base = Image.fromarray(photo(rng, 24, 40))
    files = [encode(base, fmt, exif=exif_with_orientation(o), **({"lossless": True} if fmt == "WEBP" else {}))
             for o in range(1, 9)]
    s = start_server(PIXELS + ["--decode.exif_orientation", "apply"])
    ignore = start_server(PIXELS)
    for o, f in zip(range(1, 9), files):
        want = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(f))).convert("RGB")).astype(np.float32)
        assert Image.open(io.BytesIO(f)).getexif().get(0x0112) == o
        got = transform_pixels(s, [f])[0]
        assert got.shape == want.shape, (o, got.shape, want.shape)
        assert np.abs(got - want).max() <= (1.0 if fmt == "JPEG" else 0.0), f"orientation {o}"
        stored = np.asarray(Image.open(io.BytesIO(f)).convert("RGB")).astype(np.float32)
        as_stored = transform_pixels(ignore, [f])[0]
        assert as_stored.shape == stored.shape and np.abs(as_stored - stored).max() <= 1.0, f"orientation {o}"
