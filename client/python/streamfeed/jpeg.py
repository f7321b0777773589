"""JPEG, PNG and WebP files as they are on disk: the encoded batch form.

A batch body may carry image files instead of pixels (the service decodes
them: JPEG with nvJPEG on a GPU or libjpeg-turbo on the reference backend,
PNG with libspng and WebP with libwebp on the host; each file is told apart
by its first bytes, so one batch may mix them)::

    files          U8  [total_bytes]   the N files concatenated
    files_offsets  I64 [N+1]           file i is files[off[i]:off[i+1]]
    labels         U8, I32 or I64 [N] (the smallest that holds them)

(``jpeg`` and ``jpeg_offsets`` are the two tensors' older names, which the
service still accepts.)

so a loader reads files and sends them, about ten times fewer bytes than the
decoded pixels, and decodes nothing::

    from streamfeed import Client
    from streamfeed.jpeg import feed_jpeg, image_folder, jpeg_batches, post_jpeg

    client = Client("http://gpu-box:8080")
    post_jpeg(client, ["a.jpg", "b.jpg"], [3, 7], wait=True)
    summary = client.feed(jpeg_batches(image_folder("train/"), 32), connections=8)   # shuffled
    summary = feed_jpeg(client, my_dataset_of_bytes_and_labels, 32, connections=8)

:func:`jpeg_batches` turns a dataset of ``(bytes_or_path, label)`` samples
(encoded files) into batches that :meth:`Client.feed` uploads as they are,
in an order shuffled by ``seed`` (``shuffle=False`` keeps the dataset's
order, and is needed for a generator). The files of a batch may have different sizes when the server's
augmentation fixes the output size (resize, center_crop,
random_resized_crop); otherwise they must have one size (422
``jpeg_sizes_differ``).

Real data sets hold a few files the service cannot decode (ImageNet's
training set has damaged files). They cost those files,
not the feed: :func:`jpeg_batches` leaves out files that are empty or start
like none of JPEG, PNG and WebP and fills the batch with the next ones, and
:func:`streamfeed.feed` leaves out a file the server refuses by name (its
reply's ``field`` is ``"files[3]"``: ``jpeg_unsupported``, ``png_truncated``,
...) and sends the rest of its batch again; a file the service cannot decode
is left out of its batch there (``jpeg_undecodable``, ``png_undecodable``,
``webp_undecodable``). Both are counted in the
summary's ``skipped_files`` and listed, with the file's path, in ``skipped``.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import (TYPE_CHECKING, Any, Dict, FrozenSet, Iterable, Iterator, List, Mapping, Optional, Sequence,
                    Tuple, Union)

import numpy as np
from safetensors.numpy import load as _st_load
from safetensors.numpy import save as _st_save
from .wire import narrow_labels

if TYPE_CHECKING:  # the feed module imports this one
    from .client import Client
    from .feed import FeedSummary
    from .results import BatchAccepted, BatchResult

FileLike = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]
#: A dataset item: (file, label), or a dict of them (see :func:`jpeg_batches`).
Sample = Union[Tuple[FileLike, int], Mapping[str, Any]]

#: File name suffixes image_folder() takes, in any case (as torchvision's
#: ImageFolder compares them): .jpg, .JPEG, .png, .WebP, ...: the formats the
#: service decodes, among those ImageFolder takes.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
#: The same suffixes under their older name.
JPEG_SUFFIXES = IMAGE_SUFFIXES


def read_file(f: FileLike) -> bytes:
    """The bytes of a sample: given as bytes, or read from a path."""
    if isinstance(f, (bytes, bytearray, memoryview)):
        return bytes(f)
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:
            return fh.read()
    raise TypeError(f"an image sample is bytes or a path, got {type(f).__name__}")


#: Codes of an encoded batch's refusal that blame one file, which the reply's
#: field names (``"files[3]"``, or ``"jpeg[3]"`` for a body of the older
#: names): that file is bad, not the loader.
FILE_REFUSALS = frozenset({"jpeg_not_jpeg", "jpeg_truncated", "jpeg_malformed", "jpeg_unsupported",
                           "jpeg_side_too_large", "jpeg_too_many_pixels", "png_truncated", "png_malformed",
                           "png_unsupported", "webp_truncated", "webp_malformed", "webp_unsupported"})
_FILE_FIELD = re.compile(r"^(?:files|jpeg)\[(\d+)\]$")


@dataclass(frozen=True)
class SkippedFile:
    """A file left out of its batch (:attr:`FeedSummary.skipped`).

    Attributes:
        batch_index: the batch's position in the loader.
        sample: the file's position among the samples of that batch as the
            dataset gave them (files left out included).
        name: its path, when the batch was made from paths; else None.
        code: why: the server's error code (``jpeg_unsupported``, ...), or
            for a file left out before sending ``jpeg_not_jpeg`` (empty, or
            starting like none of JPEG, PNG and WebP) or ``file_unreadable``
            (its path could not be read).
        message: the server's message, or the client's.
    """

    batch_index: int
    sample: int
    name: Optional[str]
    code: str
    message: str


class EncodedBatch:
    """A batch body already encoded, which :func:`streamfeed.feed` sends as is.

    Attributes:
        body: the safetensors body.
        n: the number of samples.
        names: each sample's path when it was given as one, else None (or
            None for the whole batch).
        positions: each sample's position among the dataset's samples of this
            batch (files left out count), or None: 0..n-1.
        left_out: the files left out of this batch before sending, as
            ``(position, name, code, message)``.
    """

    __slots__ = ("body", "n", "names", "positions", "left_out")

    def __init__(self, body: bytes, n: int, names: Optional[List[Optional[str]]] = None,
                 positions: Optional[List[int]] = None,
                 left_out: Sequence[Tuple[int, Optional[str], str, str]] = ()):
        self.body = body
        self.n = n
        self.names = names
        self.positions = positions
        self.left_out = list(left_out)

    def __len__(self) -> int:
        return self.n

    def position(self, i: int) -> int:
        return self.positions[i] if self.positions is not None else i

    def name(self, i: int) -> Optional[str]:
        return self.names[i] if self.names is not None else None

    def refused_file(self, code: str, field: Optional[str]) -> Optional[int]:
        """The index of the file a refusal blames (code in FILE_REFUSALS,
        field ``"files[i]"`` or ``"jpeg[i]"``), or None when it blames the batch."""
        m = _FILE_FIELD.match(field or "")
        if code not in FILE_REFUSALS or not m or int(m.group(1)) >= self.n:
            return None
        return int(m.group(1))

    def without(self, i: int) -> "EncodedBatch":
        """This batch without its sample i (n must be at least 2): its file,
        offsets and labels (any dtype and shape [N, ...]) cut; any other
        tensor of the body kept as it is."""
        t = dict(_st_load(self.body))
        fk = "files" if "files" in t else "jpeg"
        ok = "files_offsets" if "files_offsets" in t else "jpeg_offsets"
        off = t[ok]
        data = t[fk].tobytes()
        b, e = int(off[i]), int(off[i + 1])
        t[fk] = np.frombuffer(data[:b] + data[e:], dtype=np.uint8)
        t[ok] = np.concatenate([off[:i], off[i + 1:] - (e - b)]).astype(np.int64)
        if "labels" in t:
            t["labels"] = np.delete(t["labels"], i, axis=0)
        keep = [k for k in range(self.n) if k != i]
        return EncodedBatch(_st_save(t), self.n - 1,
                            [self.name(k) for k in keep] if self.names is not None else None,
                            [self.position(k) for k in keep])


def encode_jpeg_batch(files: Sequence[FileLike], labels: Any) -> EncodedBatch:
    """The body of one batch of JPEG, PNG or WebP files (bytes or paths) and
    integer labels [N].

    Raises:
        ValueError: no files, a label count other than the file count, an
            empty file, or a file that starts like none of JPEG, PNG and WebP
            (caught here, before anything is sent).
    """
    data = [read_file(f) for f in files]
    if not data:
        raise ValueError("a batch needs at least one file")
    lab = np.asarray(labels)
    if lab.ndim != 1 or lab.shape[0] != len(data):
        raise ValueError(f"labels must be [N] with N = {len(data)} files, got shape {lab.shape}")
    if not np.issubdtype(lab.dtype, np.integer):
        raise ValueError(f"labels must be integers, got {lab.dtype}")
    for i, d in enumerate(data):
        why = _not_an_image(d)
        if why is not None:
            raise ValueError(f"sample {i} is not a JPEG, PNG or WebP file: {why}")
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(d) for d in data])
    body = _st_save({"files": np.frombuffer(b"".join(data), dtype=np.uint8),
                     "files_offsets": offsets, "labels": narrow_labels(lab)[0]})
    return EncodedBatch(body, len(data))


def post_jpeg(client: "Client", files: Sequence[FileLike], labels: Any,
              wait: bool = False) -> Union["BatchAccepted", "BatchResult"]:
    """POSTs one batch of JPEG, PNG or WebP files; returns what :meth:`Client.post_batch` returns.

    A bad file is refused with a 400/422 :class:`~streamfeed.errors.APIError`
    whose ``code`` says why (``jpeg_truncated``, ``jpeg_side_too_large``, ...)
    and whose ``field`` names the sample (``"files[3]"``)."""
    return client.post_body(encode_jpeg_batch(files, labels).body, wait)[0]


@dataclass(frozen=True)
class ServerLimits:
    """The bounds a server checks each JPEG file against (``GET /v1/config``),
    so that :func:`jpeg_batches` leaves out, before sending, a file the server
    would refuse for its size: ``jpeg_batches(..., limits=ServerLimits.of(client))``.

    Attributes:
        max_side: ``jpeg.max_side``, the largest height or width.
        max_pixels: ``jpeg.max_pixels``, the most pixels of one file.
        max_batch_pixels: ``jpeg.max_batch_pixels``, the most decoded pixels of a batch.
        max_body_bytes: the largest batch body (``ring.slot_bytes`` of data).
    """

    max_side: int
    max_pixels: int
    max_batch_pixels: int
    max_body_bytes: int

    @classmethod
    def of(cls, client: Any) -> "ServerLimits":
        c = client.config()["config"]
        return cls(max_side=int(c["jpeg"]["max_side"]), max_pixels=int(c["jpeg"]["max_pixels"]),
                   max_batch_pixels=int(c["jpeg"]["max_batch_pixels"]),
                   max_body_bytes=int(c["ring"]["slot_bytes"]))

    def refusal(self, d: bytes) -> Optional[Tuple[str, str]]:
        """(code, message) when the server would refuse the file d for its
        size, as its header check would; None when it would not."""
        if len(d) > self.max_body_bytes:
            return "body_too_large", (f"the file alone ({len(d)} bytes) is more than a batch body may hold "
                                      f"(ring.slot_bytes is {self.max_body_bytes})")
        hw = image_size(d)
        if hw is None:
            return None  # the server's header check says why, if anything
        h, w = hw
        if h > self.max_side or w > self.max_side:
            return "jpeg_side_too_large", f"the image is {h}x{w} (HxW); jpeg.max_side is {self.max_side}"
        if h * w > self.max_pixels:
            return "jpeg_too_many_pixels", (f"the image is {h}x{w} (HxW), {h * w} pixels; jpeg.max_pixels is "
                                            f"{self.max_pixels}")
        if h * w > self.max_batch_pixels:
            return "jpeg_batch_too_large", (f"the image alone has {h * w} pixels; jpeg.max_batch_pixels is "
                                            f"{self.max_batch_pixels}")
        return None


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def image_size(d: bytes) -> Optional[Tuple[int, int]]:
    """(height, width) of a JPEG (its SOF segment), PNG (its IHDR) or WebP
    file (its VP8X canvas, or its VP8 or VP8L header), as stored (before any
    EXIF orientation), or None when it cannot be read there."""
    if d[:8] == PNG_SIGNATURE:
        if len(d) < 24 or d[12:16] != b"IHDR":
            return None
        return int.from_bytes(d[20:24], "big"), int.from_bytes(d[16:20], "big")
    if d[:4] == b"RIFF" and d[8:12] == b"WEBP":
        if len(d) < 30:
            return None
        c, b = d[12:16], d[20:]
        if c == b"VP8X":
            return int.from_bytes(b[7:10], "little") + 1, int.from_bytes(b[4:7], "little") + 1
        if c == b"VP8L":
            bits = int.from_bytes(b[1:5], "little")
            return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
        if c == b"VP8 ":
            return int.from_bytes(b[8:10], "little") & 0x3FFF, int.from_bytes(b[6:8], "little") & 0x3FFF
        return None
    return jpeg_size(d)


def jpeg_size(d: bytes) -> Optional[Tuple[int, int]]:
    """(height, width) from the SOF segment of a JPEG file, or None when the
    markers before it cannot be followed."""
    pos = 2
    while pos + 4 <= len(d):
        if d[pos] != 0xFF:
            return None
        while pos < len(d) and d[pos] == 0xFF:
            pos += 1
        if pos + 3 > len(d):
            return None
        m = d[pos]
        seg = int.from_bytes(d[pos + 1:pos + 3], "big")
        if 0xC0 <= m <= 0xCF and m not in (0xC4, 0xC8, 0xCC):
            if pos + 8 > len(d):
                return None
            return int.from_bytes(d[pos + 4:pos + 6], "big"), int.from_bytes(d[pos + 6:pos + 8], "big")
        if m == 0xDA or seg < 2:
            return None
        pos += 1 + seg
    return None


def jpeg_batches(dataset: Iterable[Sample], batch_size: int, drop_last: bool = False, *,
                 shuffle: bool = True, seed: int = 0,
                 limits: Optional[ServerLimits] = None) -> Iterator[EncodedBatch]:
    """Groups a dataset of ``(bytes_or_path, label)`` samples into encoded
    batches of batch_size, lazily (two batches' files in memory at a time:
    one is held back so that files left out after the last batch's files are
    recorded in it). Files that cannot be read, are empty or do not start
    like a JPEG file are left out (the batch's ``left_out``, which
    :func:`streamfeed.feed` counts) and the next files take their place.

    Args:
        dataset: the samples: ``(bytes_or_path, label)`` pairs, or dicts
            such as a Hugging Face dataset yields with its image column left
            encoded (``ds.cast_column("image", datasets.Image(decode=False))``:
            ``{"image": {"bytes", "path"}, "label"}``). With shuffle (the
            default) it needs ``len()`` and indexing by position: a list (what
            :func:`image_folder` returns), a tuple, a map-style
            ``torch.utils.data.Dataset``, a Hugging Face ``Dataset``.
        batch_size: samples per batch (the last one may be smaller).
        drop_last: leave out a last batch smaller than batch_size.
        shuffle: send the samples in an order drawn from seed, as
            ``streamfeed-load --dir`` shuffles by ``--seed``. On by default:
            :func:`image_folder` lists its files class by class, and sent in
            that order the model would train on one class at a time. False
            sends them in the dataset's own order (the only choice for a
            stream such as a generator, which cannot be shuffled without
            reading it whole).
        seed: the order's seed: the same seed gives the same order; pass the
            epoch number for a new order each epoch.
        limits: the server's bounds (:meth:`ServerLimits.of`): a file over
            them (``jpeg.max_side``, ``jpeg.max_pixels``, a body) is left out
            before sending, with the code the server would refuse it with,
            and the next file takes its place. None: the server refuses such
            a file by name and :func:`streamfeed.feed` sends the rest of its
            batch again.

    Raises:
        ValueError: batch_size below 1; no file of the dataset starts like a
            JPEG file (raised when the dataset ends).
        TypeError: shuffle with a dataset that has no ``len()`` or indexing
            (pass ``shuffle=False``, or a list of its samples).
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    samples: Iterable[Sample] = dataset
    if shuffle:
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise TypeError(f"jpeg_batches shuffles the samples (shuffle=True, the default), which needs a dataset "
                            f"with len() and indexing (a list, image_folder()'s result); a "
                            f"{type(dataset).__name__} has not: pass shuffle=False to send it in its own order, "
                            f"or list() its samples first")
        seq: Any = dataset
        order = np.random.default_rng(seed).permutation(len(seq))
        samples = (seq[int(i)] for i in order)
    return _batches(samples, batch_size, drop_last, limits)


#: Keys of a dict sample, tried in order (those of Hugging Face datasets first).
SAMPLE_IMAGE_KEYS = ("image", "img", "jpeg", "file", "path")
SAMPLE_LABEL_KEYS = ("label", "labels", "target", "class", "y")


def _sample(item: Any) -> Tuple[FileLike, int]:
    """(file, label) of a dataset item: a pair, or a dict such as a Hugging
    Face dataset yields with its image column left encoded
    (``cast_column("image", Image(decode=False))``): ``{"image": {"bytes":
    ..., "path": ...}, "label": 3}``, the bytes taken when there are some,
    else the path."""
    if isinstance(item, Mapping):
        ik = next((k for k in SAMPLE_IMAGE_KEYS if k in item), None)
        lk = next((k for k in SAMPLE_LABEL_KEYS if k in item), None)
        if ik is None or lk is None:
            raise TypeError(f"a dict sample needs a file key (one of {SAMPLE_IMAGE_KEYS}) and a label key (one of "
                            f"{SAMPLE_LABEL_KEYS}); its keys are {sorted(item)}")
        f = item[ik]
        if isinstance(f, Mapping):  # Hugging Face's encoded Image: {"bytes", "path"}
            f = f.get("bytes") if f.get("bytes") is not None else f.get("path")
            if f is None:
                raise TypeError(f"sample {ik!r} has neither bytes nor a path")
        elif hasattr(f, "size") and hasattr(f, "mode"):
            raise TypeError(f"sample {ik!r} is a decoded image ({type(f).__name__}); jpeg_batches sends files as "
                            "they are: give bytes or a path (a Hugging Face dataset: "
                            "ds.cast_column('image', datasets.Image(decode=False)))")
        return f, int(item[lk])
    f, y = item
    return f, int(y)


def _not_an_image(d: bytes) -> Optional[str]:
    if not d:
        return "an empty file"
    if not (d[:2] == b"\xff\xd8" or d[:8] == PNG_SIGNATURE or (d[:4] == b"RIFF" and d[8:12] == b"WEBP")):
        return f"the file ({len(d)} bytes) starts like none of JPEG, PNG and WebP"
    return None


def _recorded_batch(files: List[bytes], labels: List[int], names: List[Optional[str]], positions: List[int],
                    left: List[Tuple[int, Optional[str], str, str]]) -> EncodedBatch:
    """The encoded batch of files, with where each came from and what was left out."""
    return EncodedBatch(encode_jpeg_batch(files, labels).body, len(files), names, positions, left)


def _batches(samples: Iterable[Sample], batch_size: int, drop_last: bool,
             limits: Optional[ServerLimits] = None) -> Iterator[EncodedBatch]:
    """Batches of batch_size JPEG files. A file that is empty or does not
    start like a JPEG file is left out (recorded in the batch's left_out) and
    the next one takes its place. One batch is held back, so that files left
    out after the last batch's files are recorded in it."""
    files: List[bytes] = []
    labels: List[int] = []
    names: List[Optional[str]] = []
    positions: List[int] = []
    left: List[Tuple[int, Optional[str], str, str]] = []
    seen = 0  # samples of the batch being filled, left out ones included
    good = 0  # JPEG files in the whole dataset
    held: Optional[EncodedBatch] = None
    for item in samples:
        f, y = _sample(item)
        name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else None
        try:
            d = read_file(f)
        except OSError as e:  # gone since it was listed, no permission: that file, not the run
            left.append((seen, name, "file_unreadable", f"left out before sending: {e}"))
            seen += 1
            continue
        why = _not_an_image(d)
        over = limits.refusal(d) if limits is not None and why is None else None
        if why is not None:
            left.append((seen, name, "jpeg_not_jpeg", f"left out before sending: {why}"))
        elif over is not None:
            left.append((seen, name, over[0], f"left out before sending: {over[1]}"))
        else:
            good += 1
            files.append(d)
            labels.append(int(y))
            names.append(name)
            positions.append(seen)
        seen += 1
        if len(files) == batch_size:
            if held is not None:
                yield held
            held = _recorded_batch(files, labels, names, positions, left)
            files, labels, names, positions, left, seen = [], [], [], [], [], 0
    if files and not drop_last:
        if held is not None:
            yield held
        held, left = _recorded_batch(files, labels, names, positions, left), []
    if held is None:
        if left and not good:
            raise ValueError(f"no JPEG, PNG or WebP file among the data set's {len(left)} samples (the first: "
                             f"{left[0][1] or 'sample 0'}: {left[0][3]})")
        return  # (with drop_last, fewer JPEG files than one batch: nothing to send)
    if left:
        # After the last batch: recorded in it, positions counted on from its end.
        base = max([held.position(i) for i in range(held.n)] + [p for p, *_ in held.left_out]) + 1
        held.left_out.extend((base + p, nm, c, m) for p, nm, c, m in left)
    yield held


def feed_jpeg(client: "Client", dataset: Iterable[Sample], batch_size: int, *,
              shuffle: bool = True, seed: int = 0, **feed_kwargs: Any) -> "FeedSummary":
    """Feeds a dataset of ``(bytes_or_path, label)`` samples in batches of
    batch_size: ``client.feed(jpeg_batches(dataset, batch_size, shuffle=shuffle,
    seed=seed, limits=ServerLimits.of(client)), **feed_kwargs)`` (a generator
    needs ``shuffle=False``: see :func:`jpeg_batches`): files over the
    server's size bounds are left out before sending. Returns the
    :class:`~streamfeed.feed.FeedSummary`."""
    return client.feed(jpeg_batches(dataset, batch_size, shuffle=shuffle, seed=seed, limits=ServerLimits.of(client)),
                       **feed_kwargs)


def image_folder(root: Union[str, "os.PathLike[str]"]) -> List[Tuple[Path, int]]:
    """The image files of an ImageFolder layout: ``root/<class>/<file>.jpg``
    (``.jpeg``, ``.png``, ``.webp``).

    Classes are the subfolder names in sorted order (label 0 is the first),
    and within a class the files come in the order torchvision's ImageFolder
    gives them (folders walked sorted, symbolic links to folders followed, a
    folder's own files before its subfolders'), so with the same folder the
    i-th sample here is the i-th sample there. The list runs class by class:
    :func:`jpeg_batches` shuffles it (by default) before batching.
    Returns ``[(path, label), ...]``."""
    root = Path(root)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    out: List[Tuple[Path, int]] = []
    for k, c in enumerate(classes):
        out.extend((p, k) for p in _class_files(root / c))
    return out


def _class_files(top: Path) -> List[Path]:
    """One class folder's JPEG files as torchvision's make_dataset lists them:
    ``sorted(os.walk(top, followlinks=True))``, each folder's file names
    sorted. One difference: a link back to a folder the walk is already inside
    (a cycle) is not entered, where a bare walk would go round it until the
    path grew too long, so a crawled data set with such a link lists each file
    once. A link to a folder elsewhere is followed as torchvision follows it."""
    inside: Dict[str, FrozenSet[Tuple[int, int]]] = {}  # folder -> (device, inode) of it and all above
    walked: List[Tuple[str, List[str]]] = []
    for folder, dirs, files in os.walk(top, followlinks=True):
        st = os.stat(folder)
        here = (st.st_dev, st.st_ino)
        above = inside.get(os.path.dirname(folder), frozenset())
        if here in above:
            dirs[:] = []
            continue
        inside[folder] = above | {here}
        walked.append((folder, files))
    return [Path(folder) / f
            for folder, files in sorted(walked)
            for f in sorted(files)
            if Path(f).suffix.lower() in IMAGE_SUFFIXES and (Path(folder) / f).is_file()]
