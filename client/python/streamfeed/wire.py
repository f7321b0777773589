"""The wire format: batches as safetensors bodies (DESIGN.md §4).

A batch body is a safetensors file with

- ``images``: U8, ``[N,H,W,C]`` (NHWC) or ``[N,C,H,W]`` (NCHW), the layout named
  in ``__metadata__.layout``;
- ``labels``: an integer tensor ``[N]`` (or ``[N,H,W]``), sent in the smallest
  dtype that holds its values (U8, I32 or I64: :func:`narrow_labels`).

Inputs may be numpy arrays or torch tensors (torch is never imported here: a
tensor is recognised by its ``detach``/``cpu``/``numpy`` methods), contiguous
or not.
"""
from __future__ import annotations

import json
import struct
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
from safetensors.numpy import load as _st_load

#: Channel counts that identify the channel axis when the layout is guessed.
CHANNEL_COUNTS = (1, 3, 4)

#: The content type of a batch body.
CONTENT_TYPE = "application/vnd.safetensors"


def to_numpy(x: Any, what: str = "array") -> np.ndarray:
    """Returns x as a numpy array without copying when possible.

    Accepts numpy arrays, torch tensors (moved to the CPU, detached) and
    anything ``np.asarray`` takes (lists)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and hasattr(x, "cpu") and hasattr(x, "numpy"):  # torch.Tensor
        out: np.ndarray = x.detach().cpu().numpy()
        return out
    try:
        return np.asarray(x)
    except Exception as e:  # pragma: no cover - odd inputs
        raise TypeError(f"{what}: cannot convert {type(x).__name__} to an array") from e


def detect_layout(shape: Tuple[int, ...]) -> str:
    """Guesses the layout of a 4-d image batch from its shape.

    The last dimension in {1, 3, 4} means NHWC; otherwise dimension 1 in
    {1, 3, 4} means NCHW. NHWC wins when both could hold (e.g. ``[N,3,8,3]``):
    pass ``layout=`` explicitly for such shapes.

    Raises:
        ValueError: the shape is not 4-d, or neither rule applies.
    """
    if len(shape) != 4:
        raise ValueError(f"images must be 4-d (N,H,W,C or N,C,H,W), got shape {tuple(shape)}")
    if shape[3] in CHANNEL_COUNTS:
        return "NHWC"
    if shape[1] in CHANNEL_COUNTS:
        return "NCHW"
    raise ValueError(f"cannot tell the layout of images of shape {tuple(shape)}: neither the last "
                     f"dimension nor dimension 1 is a channel count in {CHANNEL_COUNTS}; pass layout=")


def prepare_images(images: Any, layout: Optional[str] = None) -> Tuple[np.ndarray, str]:
    """Returns (contiguous uint8 array, layout) for an image batch.

    Raises:
        TypeError: the dtype is not uint8 (the server trains on raw bytes;
            convert on purpose rather than by accident).
        ValueError: bad rank, an unknown layout, or no pixels (N=0, or a
            dimension of 0): the server refuses an empty batch.
    """
    arr = to_numpy(images, "images")
    if arr.dtype != np.uint8:
        raise TypeError(_not_uint8_message(arr))
    if arr.size == 0:
        what = "no samples (N=0)" if arr.ndim and arr.shape[0] == 0 else "no pixels"
        raise ValueError(f"images of shape {tuple(arr.shape)} hold {what}: a batch needs at least one "
                         "image (a loader's last, empty batch? skip it)")
    if layout is None:
        layout = detect_layout(arr.shape)
    else:
        layout = layout.upper()
        if layout not in ("NHWC", "NCHW"):
            raise ValueError(f"layout must be NHWC or NCHW, got {layout!r}")
        if arr.ndim != 4:
            raise ValueError(f"images must be 4-d, got shape {arr.shape}")
    return np.ascontiguousarray(arr), layout


def _not_uint8_message(arr: np.ndarray) -> str:
    """Why images of another dtype are refused, and how to convert them."""
    msg = f"images must be uint8 (the server augments raw bytes), got {arr.dtype}"
    if np.issubdtype(arr.dtype, np.floating) and arr.size:
        lo, hi = float(np.nanmin(arr)), float(np.nanmax(arr))
        if 0.0 <= lo and hi <= 1.0:
            msg += (f" with values in [{lo:.3g}, {hi:.3g}]: images scaled to [0, 1] (e.g. by "
                    "ToTensor()) convert back with (images * 255).round().clip(0, 255) then "
                    ".astype(np.uint8) (numpy) or .to(torch.uint8) (torch); better, drop "
                    "ToTensor/Normalize from the loader and let the server's augment.pipeline "
                    "scale and normalise")
        elif 0.0 <= lo and hi <= 255.0:
            msg += (f" with values in [{lo:.3g}, {hi:.3g}]: convert with "
                    "images.round().astype(np.uint8) (numpy) or .to(torch.uint8) (torch)")
        else:
            msg += (f" with values in [{lo:.3g}, {hi:.3g}] (normalised?): send the raw uint8 "
                    "images and configure the normalisation in the server's augment.pipeline")
    return msg


_LABEL_DTYPES = ((np.uint8, "U8"), (np.int32, "I32"), (np.int64, "I64"))


def narrow_labels(arr: np.ndarray) -> Tuple[np.ndarray, str]:
    """Returns integer labels in the smallest dtype the service takes that
    holds every value (U8 for class indices below 256, else I32, else I64),
    contiguous, with the dtype's safetensors name. Labels are a large part of
    a segmentation batch ([N,H,W] per pixel): as int64 they are 8 times the
    bytes of the same labels as uint8, and the wire is what bounds such a job."""
    lo = int(arr.min()) if arr.size else 0
    hi = int(arr.max()) if arr.size else 0
    for dt, name in _LABEL_DTYPES:
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return np.ascontiguousarray(arr, dtype=dt), name
    raise ValueError(f"labels span {lo}..{hi}, beyond int64")


def prepare_labels(labels: Any, n: int) -> np.ndarray:
    """Returns labels as a contiguous integer array whose first dimension is n,
    in the smallest dtype that holds them (:func:`narrow_labels`).

    Labels are class indices: ``[N]`` for classification, ``[N,H,W]`` for
    segmentation. One-hot or soft labels (``[N,K]`` floats or 0/1 rows) and
    float labels are refused here, before anything is sent, with the fix.

    Raises:
        TypeError: the dtype is not an integer type (bool and floats are not accepted).
        ValueError: the first dimension differs from n, or the labels are one-hot.
    """
    arr = to_numpy(labels, "labels")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim == 2 and arr.shape[0] == n and arr.shape[1] > 1:
        raise ValueError(f"labels of shape {tuple(arr.shape)} look one-hot (or soft): send class "
                         "indices [N] instead, e.g. labels.argmax(1)")
    if not np.issubdtype(arr.dtype, np.integer):
        hint = ""
        if np.issubdtype(arr.dtype, np.floating):
            hint = (": labels are class indices; convert whole-number floats with "
                    "labels.astype(np.int64) (numpy) or labels.long() (torch)")
        raise TypeError(f"labels must have an integer dtype, got {arr.dtype}{hint}")
    if arr.shape[0] != n:
        raise ValueError(f"{arr.shape[0]} labels for {n} images")
    return narrow_labels(arr)[0]


def encode_batch(images: Any, labels: Any = None, layout: Optional[str] = None) -> bytes:
    """Encodes a batch as a safetensors body.

    Args:
        images: uint8 ``[N,H,W,C]`` or ``[N,C,H,W]`` (numpy or torch).
        labels: integer ``[N]`` (any int dtype; sent in the smallest dtype that
            holds them, :func:`narrow_labels`), or None (only
            POST /v1/transform accepts a batch without labels).
        layout: "NHWC" or "NCHW"; guessed from the shape when None.
    """
    return b"".join(encode_batch_parts(images, labels, layout))


class Body:
    """A batch body as its parts: the safetensors header, then the tensors'
    memory itself (no copy). Iterating yields the parts; ``len()`` is the
    total byte count, so ``requests`` sends it with a Content-Length (not
    chunked) and writes each part to the socket as it is."""

    def __init__(self, parts: List[Any]):
        self.parts = parts
        self.nbytes = sum(memoryview(p).nbytes for p in parts)

    def __len__(self) -> int:
        return self.nbytes

    def __iter__(self) -> Iterator[Any]:
        return iter(self.parts)

    def tobytes(self) -> bytes:
        return b"".join(self.parts)


def encode_batch_parts(images: Any, labels: Any = None, layout: Optional[str] = None) -> Body:
    """Encodes a batch as a safetensors body without copying the tensors.

    The body of :func:`encode_batch` (the same bytes), as a :class:`Body`: a
    small header and views of the (contiguous) image and label memory. This
    is what the client sends: a copy of a multi-megabyte batch per request,
    made while holding the GIL, is what bounds a Python loader's rate.
    """
    img, layout = prepare_images(images, layout)
    tensors: List[Tuple[str, str, np.ndarray]] = [("images", "U8", img)]
    if labels is not None:
        lab = prepare_labels(labels, img.shape[0])
        tensors.append(("labels", {np.dtype(d): nm for d, nm in _LABEL_DTYPES}[lab.dtype], lab))
    header: Dict[str, Any] = {"__metadata__": {"layout": layout}}
    off = 0
    for name, dtype, arr in tensors:
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + arr.nbytes]}
        off += arr.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    parts: List[Any] = [struct.pack("<Q", len(text)) + text]
    parts += [arr.data.cast("B") for _, _, arr in tensors]
    return Body(parts)


def decode_tensors(body: bytes) -> Dict[str, np.ndarray]:
    """Decodes a safetensors body into {name: numpy array}."""
    out: Dict[str, np.ndarray] = _st_load(body)
    return out
