"""Typed replies of the batch endpoints (openapi/streamfeed.yaml: BatchAccepted, Batch).

Each keeps the server's JSON object as ``raw`` and, so that code written
against the dict replies keeps working, answers ``reply["loss"]`` as well as
``reply.loss`` for the server's own keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional


class _Reply:
    raw: Dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)


@dataclass(frozen=True)
class BatchAccepted(_Reply):
    """202 of POST /v1/batches: the batch is in the ring and will be trained.

    Attributes:
        id: the server's batch id (GET /v1/batches/{id}).
        queued: batches waiting in the ring when this one was accepted.
        ring_slots, ring_free: the ring's size and its free slots then.
    """

    id: int
    queued: int
    ring_slots: int
    ring_free: int
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, o: Mapping[str, Any]) -> "BatchAccepted":
        ring = o.get("ring") or {}
        return cls(id=int(o["id"]), queued=int(o.get("queued", 0)), ring_slots=int(ring.get("slots", 0)),
                   ring_free=int(ring.get("free", 0)), raw=dict(o))


@dataclass(frozen=True)
class BatchResult(_Reply):
    """A batch as GET /v1/batches/{id} (or POST ?wait=1) describes it.

    Attributes:
        id: the batch id.
        state: queued, transforming, training, done or failed.
        n: samples in the batch.
        step: the optimizer step it trained in (None until trained).
        loss, accuracy: of its training step (None until done).
        timings: seconds per stage (queue_wait, h2d, transform, step, ...).
        error_code, error_message: why it failed (None unless failed).
    """

    id: int
    state: str
    n: int
    step: Optional[int]
    loss: Optional[float]
    accuracy: Optional[float]
    timings: Dict[str, Any]
    error_code: Optional[str]
    error_message: Optional[str]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @property
    def done(self) -> bool:
        return self.state == "done"

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")

    @classmethod
    def from_json(cls, o: Mapping[str, Any]) -> "BatchResult":
        err = o.get("error") or {}
        step = o.get("step")
        return cls(id=int(o["id"]), state=str(o.get("state")), n=int(o.get("n", 0)),
                   step=None if step is None else int(step), loss=_opt_float(o.get("loss")),
                   accuracy=_opt_float(o.get("accuracy")), timings=dict(o.get("timings") or {}),
                   error_code=err.get("code"), error_message=err.get("message"), raw=dict(o))


def _opt_float(v: Any) -> Optional[float]:
    return None if v is None else float(v)
