"""streamfeed.jpeg: JPEG files posted as they are, from bytes, paths, an
ImageFolder layout and a dataset of (bytes, label) through feed()."""
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from streamfeed import errors as E
from streamfeed.jpeg import encode_jpeg_batch, feed_jpeg, image_folder, jpeg_batches, post_jpeg


def jpeg_bytes(rng, h=32, w=32):
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def test_encode_jpeg_batch_concatenates_the_files_with_their_offsets_and_the_smallest_labels(rng):
    files = [jpeg_bytes(rng), jpeg_bytes(rng), jpeg_bytes(rng)]
    t = st_load(encode_jpeg_batch(files, np.array([2, 0, 1], dtype=np.int64)).body)
    assert t["files"].dtype == np.uint8 and t["files"].tobytes() == b"".join(files)
    assert t["files_offsets"].dtype == np.int64
    assert list(t["files_offsets"]) == [0, len(files[0]), len(files[0]) + len(files[1]), sum(map(len, files))]
    assert t["labels"].dtype == np.uint8 and list(t["labels"]) == [2, 0, 1]


def test_encode_jpeg_batch_refuses_non_jpeg_files_and_label_counts_before_sending(rng):
    with pytest.raises(ValueError, match="sample 1"):
        encode_jpeg_batch([jpeg_bytes(rng), b"\x89PNG\r\n"], [0, 1])
    with pytest.raises(ValueError, match="labels"):
        encode_jpeg_batch([jpeg_bytes(rng)], [0, 1])
    with pytest.raises(ValueError):
        encode_jpeg_batch([], [])


def test_post_jpeg_from_paths_trains_and_a_bad_file_names_its_sample(module_server, rng, tmp_path):
    c = module_server.client()
    paths = []
    for i in range(3):
        p = tmp_path / f"{i}.jpg"
        p.write_bytes(jpeg_bytes(rng))
        paths.append(p)
    b = post_jpeg(c, paths, [0, 1, 2], wait=True)
    assert b["state"] == "done" and b["n"] == 3, b
    good = jpeg_bytes(rng)
    with pytest.raises(E.BadRequest) as ei:
        post_jpeg(c, [good, good[:200] + b"\xff\xd9"], [0, 1])
    assert ei.value.code in ("jpeg_truncated", "jpeg_malformed")
    assert ei.value.field == "files[1]"


def test_image_folder_numbers_the_sorted_class_folders_and_feed_trains_from_its_files(module_server, rng,
                                                                                     tmp_path):
    for cls in ("dog", "cat"):
        (tmp_path / cls).mkdir()
        for i in range(5):
            (tmp_path / cls / f"{i}.jpg").write_bytes(jpeg_bytes(rng))
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    (tmp_path / "dog" / "CAPS.JpEg").write_bytes(jpeg_bytes(rng))  # suffixes in any case, as torchvision
    samples = image_folder(tmp_path)
    assert len(samples) == 11
    assert {p.parent.name: y for p, y in samples} == {"cat": 0, "dog": 1}
    c = module_server.client()
    summary = c.feed(jpeg_batches(samples, 4), connections=2, progress=False)
    assert summary.ok and summary.batches == 3 and summary.samples == 11, summary
    assert summary.last_loss is not None and np.isfinite(summary.last_loss)


def test_image_folder_lists_files_in_torchvisions_order_following_links_but_not_cycles(tmp_path):
    """torchvision's make_dataset walks each class with
    sorted(os.walk(followlinks=True)): a folder's own files come before its
    subfolders' (plain path sorting would put c/b/y before c/x), and a linked
    folder is followed. A link back up the tree is not walked round."""
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    (root / "c" / "b").mkdir(parents=True)
    elsewhere.mkdir()
    for path in (root / "c" / "x.jpg", root / "c" / "b" / "y.jpg", elsewhere / "z.jpg", root / "c" / "a.jpg"):
        path.write_bytes(b"\xff\xd8")
    (root / "c" / "link").symlink_to(elsewhere, target_is_directory=True)
    (root / "c" / "b" / "up").symlink_to(root / "c", target_is_directory=True)  # a cycle
    (root / "d").symlink_to(elsewhere, target_is_directory=True)                # a linked class folder
    got = [(str(p.relative_to(root)), y) for p, y in image_folder(root)]
    assert got == [("c/a.jpg", 0), ("c/x.jpg", 0), ("c/b/y.jpg", 0), ("c/link/z.jpg", 0), ("d/z.jpg", 1)]


def test_feed_jpeg_trains_from_a_dataset_yielding_bytes_and_labels(module_server, rng):
    dataset = ((jpeg_bytes(rng), i % 10) for i in range(7))  # a generator: no len, read lazily
    summary = feed_jpeg(module_server.client(), dataset, 3, shuffle=False, connections=2, progress=False)
    assert summary.ok and summary.batches == 3 and summary.samples == 7, summary


def _labels(batch):
    return [int(y) for y in st_load(batch.body)["labels"]]


def test_jpeg_batches_shuffle_an_image_folder_by_seed_so_batches_mix_the_classes(rng, tmp_path):
    """image_folder() lists its files class by class; batched in that order
    the model trains on one class at a time. jpeg_batches shuffles by seed
    (on by default), as streamfeed-load --dir does by --seed."""
    for cls in ("a", "b", "c", "d"):
        (tmp_path / cls).mkdir()
        for i in range(8):
            (tmp_path / cls / f"{i}.jpg").write_bytes(jpeg_bytes(rng, 8, 8))
    samples = image_folder(tmp_path)
    assert [y for _, y in samples] == sorted(y for _, y in samples)  # class by class
    batches = [_labels(b) for b in jpeg_batches(samples, 4)]
    assert len(batches) == 8 and sorted(sum(batches, [])) == [y for _, y in samples]
    assert sum(len(set(b)) > 1 for b in batches) >= 6, f"the batches run class by class: {batches}"
    assert [_labels(b) for b in jpeg_batches(samples, 4)] == batches  # seed=0 again: the same order
    assert [_labels(b) for b in jpeg_batches(samples, 4, seed=1)] != batches
    unshuffled = [_labels(b) for b in jpeg_batches(samples, 4, shuffle=False)]
    assert unshuffled == [[k] * 4 for k in range(4) for _ in range(2)]
    # A generator cannot be shuffled without reading it whole: refused, saying what to do.
    with pytest.raises(TypeError, match="shuffle=False"):
        jpeg_batches((s for s in samples), 4)
    assert len(list(jpeg_batches((s for s in samples), 4, shuffle=False))) == 8


def twelve_bit_jpeg_bytes(rng, h=32, w=32):
    """A JPEG whose SOF declares 12-bit samples: refused by the server's
    header check as jpeg_unsupported (CMYK files, which crawled data sets
    hold too, are decoded)."""
    b = bytearray(jpeg_bytes(rng, h, w))
    i = next(i for i in range(2, len(b) - 1) if b[i] == 0xFF and b[i + 1] in (0xC0, 0xC2))
    b[i + 4] = 12
    return bytes(b)


def bogus_huffman_jpeg_bytes(rng, h=32, w=32):
    """A JPEG whose header passes but whose Huffman table the decoder refuses
    (more codes of length 1 than exist): left out by the server."""
    b = bytearray(jpeg_bytes(rng, h, w))
    i = b.index(b"\xff\xc4")
    b[i + 5] = 0xFF
    return bytes(b)


def gif_bytes(rng, h=32, w=32):
    """A GIF: a format the service does not decode."""
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(out, format="GIF")
    return out.getvalue()


def a_real_data_set(rng, tmp_path):
    """Thirteen files as a crawled data set has them: nine good JPEGs, a
    12-bit JPEG and a file cut short (both refused by the server, by name), a
    GIF named .jpg and an empty file (both left out before sending)."""
    kinds = ["ok", "12bit", "ok", "ok", "gif", "ok", "cut", "ok", "ok", "empty", "ok", "ok", "ok"]
    samples = []
    for i, kind in enumerate(kinds):
        good = jpeg_bytes(rng)
        data = {"ok": good, "12bit": twelve_bit_jpeg_bytes(rng), "gif": gif_bytes(rng), "cut": good[:300] + b"\xff\xd9",
                "empty": b""}[kind]
        p = tmp_path / f"{i:02d}-{kind}.jpg"
        p.write_bytes(data)
        samples.append((p, i % 10))
    return samples


def test_feed_leaves_out_the_files_a_real_data_set_has_and_trains_on_the_rest(module_server, rng, tmp_path):
    samples = a_real_data_set(rng, tmp_path)
    summary = module_server.client().feed(jpeg_batches(samples, 4, shuffle=False), connections=2, progress=False)
    # Nine good files: the client fills each batch with the next good file,
    # and the server's refusals cost their file alone.
    assert summary.ok and summary.samples == 9 and not summary.errors, summary
    assert summary.skipped_files.get("jpeg_unsupported") == 1
    assert summary.skipped_files.get("jpeg_not_jpeg") == 2
    assert sum(summary.skipped_files.values()) == 4, summary.skipped_files
    named = {Path(s.name).name: s for s in summary.skipped}
    assert set(named) == {"01-12bit.jpg", "04-gif.jpg", "06-cut.jpg", "09-empty.jpg"}
    assert named["01-12bit.jpg"].code == "jpeg_unsupported" and named["01-12bit.jpg"].batch_index == 0
    assert named["01-12bit.jpg"].sample == 1
    assert named["06-cut.jpg"].code in ("jpeg_truncated", "jpeg_malformed")
    assert "empty" in named["09-empty.jpg"].message
    assert "files left out" in str(summary)


def test_with_skip_bad_files_off_a_refused_file_stops_the_feed_as_before(module_server, rng, tmp_path):
    samples = a_real_data_set(rng, tmp_path)
    with pytest.raises(E.FeedAborted) as ei:
        module_server.client().feed(jpeg_batches(samples, 4, shuffle=False), connections=1, progress=False,
                                    skip_bad_files=False)
    assert ei.value.error.code == "jpeg_unsupported" and ei.value.error.field == "files[1]"


def test_jpeg_batches_keep_their_size_and_a_data_set_without_a_jpeg_is_refused(rng):
    files = [jpeg_bytes(rng, 8, 8) for _ in range(6)]
    data = [files[0], b"", files[1], gif_bytes(rng, 8, 8), files[2], files[3], files[4], files[5], b"\x00"]
    batches = list(jpeg_batches([(d, i) for i, d in enumerate(data)], 3, shuffle=False))
    assert [b.n for b in batches] == [3, 3]
    assert _labels(batches[0]) == [0, 2, 4] and _labels(batches[1]) == [5, 6, 7]
    assert [(p, c) for p, _, c, _ in batches[0].left_out] == [(1, "jpeg_not_jpeg"), (3, "jpeg_not_jpeg")]
    # the file after the last batch's files is recorded in that batch
    assert [(p, c) for p, _, c, _ in batches[1].left_out] == [(3, "jpeg_not_jpeg")]
    # one batch without its middle file: the rest, in order, with their positions
    smaller = batches[0].without(1)
    assert smaller.n == 2 and _labels(smaller) == [0, 4] and smaller.positions == [0, 4]
    assert st_load(smaller.body)["files"].tobytes() == files[0] + files[2]
    with pytest.raises(ValueError, match="no JPEG, PNG or WebP file"):
        list(jpeg_batches([(b"", 0), (gif_bytes(rng), 1)], 2, shuffle=False))
    # A path that cannot be read (gone since it was listed) is left out too.
    (only,) = jpeg_batches([("/nonexistent/streamfeed/x.jpg", 0), (files[0], 1)], 1, shuffle=False)
    assert _labels(only) == [1]
    assert [(p, n, c) for p, n, c, _ in only.left_out] == [(0, "/nonexistent/streamfeed/x.jpg", "file_unreadable")]


def test_files_the_server_cannot_decode_are_reported_by_path_and_their_batches_train(module_server, rng,
                                                                                     tmp_path):
    """A file whose header passes but whose data the decoder refuses is left
    out by the server (decode.on_undecodable: skip): its batch trains on the
    others, and the feed names the file from the batch's result, for batches
    accepted with a 202 as for the last one, posted with wait."""
    samples = []
    for i in range(12):
        p = tmp_path / f"{i:02d}.jpg"
        p.write_bytes(bogus_huffman_jpeg_bytes(rng) if i in (2, 11) else jpeg_bytes(rng))
        samples.append((p, i % 10))
    summary = module_server.client().feed(jpeg_batches(samples, 4, shuffle=False), connections=2, progress=False)
    assert summary.ok and summary.batches == 3 and not summary.errors, summary
    assert summary.skipped_files == {"jpeg_undecodable": 2}, summary
    named = sorted((Path(f.name).name, f.batch_index, f.sample, f.code) for f in summary.skipped)
    assert named == [("02.jpg", 0, 2, "jpeg_undecodable"), ("11.jpg", 2, 3, "jpeg_undecodable")], named
    # A batch of which no file decodes fails alone; the feed goes on and names its files.
    samples = [(jpeg_bytes(rng), 0), (bogus_huffman_jpeg_bytes(rng), 1), (jpeg_bytes(rng), 2)]
    summary = module_server.client().feed(jpeg_batches(samples, 1, shuffle=False), connections=1, progress=False)
    assert summary.errors == {"jpeg_undecodable": 1} and summary.skipped_files == {"jpeg_undecodable": 1}, summary


def test_a_batch_whose_every_file_is_refused_fails_alone_without_stopping_the_feed(module_server, rng):
    samples = [(jpeg_bytes(rng), 0), (twelve_bit_jpeg_bytes(rng), 1), (jpeg_bytes(rng), 2)]
    summary = module_server.client().feed(jpeg_batches(samples, 1, shuffle=False), connections=1, progress=False)
    assert summary.batches == 2 and summary.samples == 2, summary
    assert summary.errors == {"jpeg_unsupported": 1} and summary.skipped_files == {"jpeg_unsupported": 1}
    # Two 12-bit files in one batch of two: both left out, the batch fails, the feed goes on.
    samples = [(jpeg_bytes(rng), 0), (jpeg_bytes(rng), 1), (twelve_bit_jpeg_bytes(rng), 2),
               (twelve_bit_jpeg_bytes(rng), 3),
               (jpeg_bytes(rng), 4), (jpeg_bytes(rng), 5)]
    summary = module_server.client().feed(jpeg_batches(samples, 2, shuffle=False), connections=1, progress=False)
    assert summary.batches == 2 and summary.samples == 4, summary
    assert summary.errors == {"jpeg_unsupported": 1} and summary.skipped_files == {"jpeg_unsupported": 2}
    assert sorted((f.batch_index, f.sample) for f in summary.skipped) == [(1, 0), (1, 1)]


def test_without_keeps_the_labels_shape_and_dtype_and_drop_last_with_few_files_sends_nothing(rng):
    files = [jpeg_bytes(rng, 8, 8) for _ in range(3)]
    b = encode_jpeg_batch(files, [4, 5, 6])
    t = dict(st_load(b.body))
    t["labels"] = np.array([[4, 0], [5, 1], [6, 2]], dtype=np.int32)
    two = type(b)(st_save(t), 3).without(0)
    out = st_load(two.body)
    assert out["labels"].dtype == np.int32 and out["labels"].tolist() == [[5, 1], [6, 2]]
    assert out["files"].tobytes() == files[1] + files[2]
    assert out["files_offsets"].tolist() == [0, len(files[1]), len(files[1]) + len(files[2])]
    # fewer JPEG files than one batch, one bad file: drop_last sends nothing, and says nothing is wrong
    assert list(jpeg_batches([(files[0], 0), (b"", 1)], 4, drop_last=True, shuffle=False)) == []


def test_jpeg_batches_take_hugging_face_style_dict_samples_with_encoded_images(module_server, rng, tmp_path):
    """A Hugging Face dataset with its image column left encoded
    (cast_column("image", Image(decode=False))) yields {"image": {"bytes",
    "path"}, "label"}: bytes when the parquet holds them, else a path."""
    p = tmp_path / "on-disk.jpg"
    p.write_bytes(jpeg_bytes(rng))
    samples = [{"image": {"bytes": jpeg_bytes(rng), "path": "ignored.jpg"}, "label": 1},
               {"image": {"bytes": None, "path": str(p)}, "label": 2},
               {"img": jpeg_bytes(rng), "target": 3},
               {"image": {"bytes": twelve_bit_jpeg_bytes(rng), "path": None}, "label": 4}]
    batches = list(jpeg_batches(samples, 4, shuffle=False))
    assert len(batches) == 1 and _labels(batches[0]) == [1, 2, 3, 4]
    assert batches[0].names == [None, str(p), None, None]
    summary = module_server.client().feed(batches, connections=1, progress=False)
    assert summary.ok and summary.samples == 3 and summary.skipped_files == {"jpeg_unsupported": 1}, summary
    with pytest.raises(TypeError, match="decode=False"):
        list(jpeg_batches([{"image": Image.new("RGB", (4, 4)), "label": 0}], 1, shuffle=False))
    with pytest.raises(TypeError, match="label key"):
        list(jpeg_batches([{"image": jpeg_bytes(rng)}], 1, shuffle=False))


def test_feed_jpeg_leaves_out_files_over_the_servers_size_bounds_before_sending(module_server, rng, tmp_path):
    """The server's bounds come from GET /v1/config: a file over jpeg.max_side
    or jpeg.max_pixels is left out before it is sent, named, with the code
    the server would refuse it with and the option in its message."""
    from streamfeed.jpeg import ServerLimits, jpeg_size

    def declared(h, w):
        b = bytearray(jpeg_bytes(rng))
        i = next(i for i in range(2, len(b) - 1) if b[i] == 0xFF and b[i + 1] == 0xC0)
        b[i + 5:i + 9] = h.to_bytes(2, "big") + w.to_bytes(2, "big")
        return bytes(b)

    c = module_server.client()
    lim = ServerLimits.of(c)
    assert lim.max_pixels >= 24_000_000 and lim.max_body_bytes >= 40 << 20, lim  # photographs by default
    samples = []
    for i, data in enumerate([jpeg_bytes(rng), declared(lim.max_side + 1, 8), jpeg_bytes(rng),
                              declared(8000, 8000), jpeg_bytes(rng)]):
        p = tmp_path / f"{i}.jpg"
        p.write_bytes(data)
        samples.append((p, i))
    assert jpeg_size(samples[3][0].read_bytes()) == (8000, 8000)
    summary = feed_jpeg(c, samples, 3, shuffle=False, connections=1, progress=False)
    assert summary.ok and summary.samples == 3 and not summary.errors, summary
    named = {Path(f.name).name: f for f in summary.skipped}
    assert named["1.jpg"].code == "jpeg_side_too_large" and "jpeg.max_side" in named["1.jpg"].message
    assert named["3.jpg"].code == "jpeg_too_many_pixels" and "jpeg.max_pixels" in named["3.jpg"].message
    assert all(f.message.startswith("left out before sending") for f in summary.skipped), summary.skipped
