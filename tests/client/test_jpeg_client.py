"""streamfeed.jpeg: JPEG files posted as they are, from bytes, paths, an
ImageFolder layout and a dataset of (bytes, label) through feed()."""
import io

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load as st_load

from streamfeed import errors as E
from streamfeed.jpeg import encode_jpeg_batch, feed_jpeg, image_folder, jpeg_batches, post_jpeg


def jpeg_bytes(rng, h=32, w=32):
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def test_encode_jpeg_batch_concatenates_the_files_with_their_offsets_and_int64_labels(rng):
    files = [jpeg_bytes(rng), jpeg_bytes(rng), jpeg_bytes(rng)]
    t = st_load(encode_jpeg_batch(files, np.array([2, 0, 1], dtype=np.uint8)).body)
    assert t["jpeg"].dtype == np.uint8 and t["jpeg"].tobytes() == b"".join(files)
    assert t["jpeg_offsets"].dtype == np.int64
    assert list(t["jpeg_offsets"]) == [0, len(files[0]), len(files[0]) + len(files[1]), sum(map(len, files))]
    assert t["labels"].dtype == np.int64 and list(t["labels"]) == [2, 0, 1]


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
    assert ei.value.field == "jpeg[1]"


def test_image_folder_numbers_the_sorted_class_folders_and_feed_trains_from_its_files(module_server, rng,
                                                                                     tmp_path):
    for cls in ("dog", "cat"):
        (tmp_path / cls).mkdir()
        for i in range(5):
            (tmp_path / cls / f"{i}.jpg").write_bytes(jpeg_bytes(rng))
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    samples = image_folder(tmp_path)
    assert len(samples) == 10
    assert {p.parent.name: y for p, y in samples} == {"cat": 0, "dog": 1}
    c = module_server.client()
    summary = c.feed(jpeg_batches(samples, 4), connections=2, progress=False)
    assert summary.ok and summary.batches == 3 and summary.samples == 10, summary
    assert summary.last_loss is not None and np.isfinite(summary.last_loss)


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
