"""The wire format: batches as safetensors bodies (DESIGN.md §4).

A batch body is a safetensors file with

- ``images``: U8, ``[N,H,W,C]`` (NHWC) or ``[N,C,H,W]`` (NCHW), the layout named
  in ``__metadata__.layout``;
- ``labels``: an integer tensor ``[N]`` (or ``[N,H,W]``), sent as I64.

Inputs may be numpy arrays or torch tensors (torch is never imported here: a
tensor is recognised by its ``detach``/``cpu``/``numpy`` methods), contiguous
or not.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np
from safetensors.numpy import load as _st_load
from safetensors.numpy import save as _st_save

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
        return x.detach().cpu().numpy()
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
        ValueError: bad rank, or an unknown layout.
    """
    arr = to_numpy(images, "images")
    if arr.dtype != np.uint8:
        raise TypeError(f"images must be uint8, got {arr.dtype}")
    if layout is None:
        layout = detect_layout(arr.shape)
    else:
        layout = layout.upper()
        if layout not in ("NHWC", "NCHW"):
            raise ValueError(f"layout must be NHWC or NCHW, got {layout!r}")
        if arr.ndim != 4:
            raise ValueError(f"images must be 4-d, got shape {arr.shape}")
    return np.ascontiguousarray(arr), layout


def prepare_labels(labels: Any, n: int) -> np.ndarray:
    """Returns labels as a contiguous int64 array whose first dimension is n.

    Raises:
        TypeError: the dtype is not an integer type (bool is not accepted).
        ValueError: the first dimension differs from n.
    """
    arr = to_numpy(labels, "labels")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"labels must have an integer dtype, got {arr.dtype}")
    if arr.shape[0] != n:
        raise ValueError(f"{arr.shape[0]} labels for {n} images")
    return np.ascontiguousarray(arr, dtype=np.int64)


def encode_batch(images: Any, labels: Any = None, layout: Optional[str] = None) -> bytes:
    """Encodes a batch as a safetensors body.

    Args:
        images: uint8 ``[N,H,W,C]`` or ``[N,C,H,W]`` (numpy or torch).
        labels: integer ``[N]`` (any int dtype; sent as int64), or None (only
            POST /v1/transform accepts a batch without labels).
        layout: "NHWC" or "NCHW"; guessed from the shape when None.
    """
    img, layout = prepare_images(images, layout)
    tensors = {"images": img}
    if labels is not None:
        tensors["labels"] = prepare_labels(labels, img.shape[0])
    return _st_save(tensors, metadata={"layout": layout})


def decode_tensors(body: bytes) -> dict:
    """Decodes a safetensors body into {name: numpy array}."""
    return _st_load(body)
