"""Typed replies of the batch and evaluation endpoints (openapi/streamfeed.yaml:
BatchAccepted, Batch, Eval).

Each keeps the server's JSON object as ``raw`` and, so that code written
against the dict replies keeps working, answers ``reply["loss"]`` as well as
``reply.loss`` for the server's own keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple


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
        loss, accuracy: of its training step, or of an eval batch's forward
            pass (None until done).
        timings: seconds per stage (queue_wait, h2d, transform, step, ...).
        error_code, error_message: why it failed (None unless failed).
        kind: "train", "eval" (``mode=eval``) or "transform".
        top1, top5: an eval batch's share of samples whose label is the
            largest logit (the same as ``accuracy``) or among the 5 largest;
            None for training batches and until done.
        eval_name: the evaluation an eval batch counts towards (``eval=``,
            "default" when none was named); None for training batches.
        logits_state: "kept" or "expired" for an eval batch whose
            ``return=logits`` wait ran out (whether GET
            /v1/batches/{id}/logits still has its logits); None otherwise.
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
    # After raw, with defaults: code that builds a BatchResult positionally keeps working.
    kind: str = "train"
    top1: Optional[float] = None
    top5: Optional[float] = None
    eval_name: Optional[str] = None
    logits_state: Optional[str] = None
    #: The samples (by index) left out because the service could not decode
    #: their files (``decode.on_undecodable: skip``): the batch trained the
    #: others. At most 64 are listed; ``samples_trained`` counts the rest.
    skipped_samples: Tuple[int, ...] = ()
    samples_trained: Optional[int] = None

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
                   error_code=err.get("code"), error_message=err.get("message"), raw=dict(o),
                   kind=str(o.get("kind") or "train"), top1=_opt_float(o.get("top1")),
                   top5=_opt_float(o.get("top5")), eval_name=o.get("eval"), logits_state=o.get("logits"),
                   skipped_samples=tuple(int(k["index"]) for k in (o.get("skipped_samples") or ())
                                         if isinstance(k, Mapping) and "index" in k),
                   samples_trained=None if o.get("samples_trained") is None else int(o["samples_trained"]))


@dataclass(frozen=True)
class EvalSummary(_Reply):
    """One named evaluation as GET /v1/evals/{name} describes it: the
    sample-weighted aggregates of every eval batch sent with ``eval=name``.

    Attributes:
        name: the evaluation's name ("default" for eval batches sent without one).
        batches: its finished batches; failed_batches: those that failed.
        pending_batches: batches accepted and not yet ended: ``delete_eval``
            answers ``eval_busy`` until it is 0 (0 from a service that does
            not report it).
        samples: the samples (pixels, for a segmentation model) scored.
        loss, top1, top5: sample-weighted means over its batches; None before
            the first batch finished (or, for loss, when it is not finite).
        first_step, last_step: the optimizer step counts when its first and
            its latest batch ran (None before the first).
    """

    name: str
    batches: int
    samples: int
    failed_batches: int
    pending_batches: int
    loss: Optional[float]
    top1: Optional[float]
    top5: Optional[float]
    first_step: Optional[int]
    last_step: Optional[int]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, o: Mapping[str, Any]) -> "EvalSummary":
        return cls(name=str(o["name"]), batches=int(o.get("batches", 0)), samples=int(o.get("samples", 0)),
                   failed_batches=int(o.get("failed_batches", 0)),
                   pending_batches=int(o.get("pending_batches", 0)), loss=_opt_float(o.get("loss")),
                   top1=_opt_float(o.get("top1")), top5=_opt_float(o.get("top5")),
                   first_step=_opt_int(o.get("first_step")), last_step=_opt_int(o.get("last_step")),
                   raw=dict(o))


@dataclass(frozen=True)
class EvalList(_Reply):
    """GET /v1/evals: every evaluation, in the order of its first batch.

    Iterating yields the :class:`EvalSummary` of each; ``len()`` counts them.

    Attributes:
        evals: the evaluations.
        max_names: how many may exist (``eval.max_names``); an eval batch
            naming one more evicts one idle for ``eval.name_idle_s``, or is
            refused with 409 ``too_many_evals`` when none is
            (``Client.delete_eval`` frees one).
    """

    evals: List[EvalSummary]
    max_names: int
    raw: Dict[str, Any] = field(repr=False, compare=False)

    def __iter__(self) -> Iterator[EvalSummary]:
        return iter(self.evals)

    def __len__(self) -> int:
        return len(self.evals)

    def names(self) -> List[str]:
        """The evaluations' names, in the order of their first batch."""
        return [e.name for e in self.evals]

    @classmethod
    def from_json(cls, o: Mapping[str, Any]) -> "EvalList":
        return cls(evals=[EvalSummary.from_json(e) for e in o.get("evals") or []],
                   max_names=int(o.get("max_names", 0)), raw=dict(o))


def _opt_int(v: Any) -> Optional[int]:
    return None if v is None else int(v)


def _opt_float(v: Any) -> Optional[float]:
    return None if v is None else float(v)
