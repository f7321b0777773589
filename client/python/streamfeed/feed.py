"""Draining a data loader into a streamfeed server over several connections.

:func:`feed` takes any iterable of ``(images, labels)`` batches — a
``torch.utils.data.DataLoader``, a generator, a list — and uploads them with a
pool of worker threads, one ``requests.Session`` (keep-alive connection) per
thread. At most ``max_in_flight`` batches are being uploaded or waiting for
their reply, and the loop takes the next batch from the loader only once one
of them is answered, so memory stays bounded however long the loader is: at
most ``max_in_flight + 2`` batches are held (the extra two: the batch waiting
for a free upload slot and the one read ahead to tell the last batch apart).

Errors: back-pressure (429/503 with Retry-After) is retried by the client. A
batch that certainly did not reach the server (its connection could not be
made, or broke before the body was sent) is sent again
(``RetryPolicy.connect_retries`` times); one whose whole body was sent and
that got no reply (a read timeout, a reset while waiting) is never sent again,
since the server may have accepted it: it counts under ``outcome_unknown``.
A deterministic rejection (any other 4xx: a wrong shape, a label out of range)
would hit every later batch too, so by default it stops the feed with
:class:`~streamfeed.errors.FeedAborted` naming the batch and the reason. The
exception is a JPEG file the server refuses by name (a CMYK file, one cut
short: the reply's field is ``"jpeg[i]"``): that file is left out and the rest
of its batch sent again (``skip_bad_files``), counted in ``skipped_files``.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait as _wait_futures
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Set, Tuple

import numpy as np

from . import errors as E
from .jpeg import EncodedBatch, SkippedFile
from .results import BatchResult
from .wire import encode_batch_parts

_END = object()


@dataclass
class FeedSummary:
    """What :func:`feed` did.

    Attributes:
        batches: batches the server accepted.
        samples: images in the accepted batches.
        bytes: body bytes of the accepted batches (safetensors, headers included).
        seconds: wall time of the whole feed.
        errors: batches that finally failed, by the server's error code (a
            step that failed counts under its job error code). Without a reply:
            ``transport_error`` when the batch certainly did not reach the
            server; ``outcome_unknown`` when it was sent whole and no reply
            came, so the server may have accepted and trained it (such a
            batch is never sent again).
        retries: back-pressure retries (429/503 + Retry-After) over all
            batches, those of batches that finally failed included.
        resends: batches sent again because they certainly did not reach the
            server (the connection could not be made, or broke before the
            body was sent), at most ``RetryPolicy.connect_retries`` per batch.
        first_loss: loss of the first batch. It is posted with ``wait=1`` before
            any other, so this is the loss of the model as the feed found it.
        last_loss: loss of the last batch when ``wait_last`` (else None).
        latest_loss: the last training loss seen while feeding (the progress
            bar shows it live), then last_loss when there is one.
        first_id, last_id: server ids of the first and last batch, when accepted.
        submitted: batches taken from the loader.
        skipped_files: JPEG files left out of their batches, by code: refused
            by the server by name (``jpeg_truncated``, ...; the rest of the
            batch was sent again), left out by the server because it could
            not decode their data (``jpeg_undecodable``: the batch trained
            without them; found from the batches' results, asked for once
            they have trained), or left out before sending by
            :func:`~streamfeed.jpeg.jpeg_batches` (``jpeg_not_jpeg``: empty,
            or not a JPEG file). A batch whose every file was refused counts
            under errors too (with the last refusal's code); the others, as
            accepted.
        skipped: the first MAX_SKIPPED_LISTED of them, as
            :class:`~streamfeed.jpeg.SkippedFile` (batch, position, path,
            code, message): what to remove from the data set.
    """

    batches: int = 0
    samples: int = 0
    bytes: int = 0
    seconds: float = 0.0
    errors: Dict[str, int] = field(default_factory=dict)
    retries: int = 0
    first_loss: Optional[float] = None
    last_loss: Optional[float] = None
    first_id: Optional[int] = None
    last_id: Optional[int] = None
    submitted: int = 0
    latest_loss: Optional[float] = None
    resends: int = 0
    skipped_files: Dict[str, int] = field(default_factory=dict)
    skipped: List[SkippedFile] = field(default_factory=list)

    @property
    def failed(self) -> int:
        """Batches that finally failed (the sum of errors)."""
        return sum(self.errors.values())

    @property
    def ok(self) -> bool:
        """True when every batch taken from the loader was accepted."""
        return self.failed == 0 and self.batches == self.submitted

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_second(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        loss = ""
        if self.first_loss is not None:
            loss = f", loss {self.first_loss:.4f}"
            if self.last_loss is not None:
                loss += f" -> {self.last_loss:.4f}"
        errs = f", errors {dict(self.errors)}" if self.errors else ""
        resent = f", {self.resends} resent" if self.resends else ""
        if self.skipped_files:
            resent += f", files left out {dict(self.skipped_files)}"
        return (f"{self.batches}/{self.submitted} batches, {self.samples} samples, "
                f"{self.bytes / 1e6:.1f} MB in {self.seconds:.2f}s "
                f"({self.samples_per_second:.0f} samples/s, {self.bytes_per_second / 1e6:.1f} MB/s), "
                f"{self.retries} retries{resent}{loss}{errs}")


#: Keys of a dict item, tried in order: ours, then those of Hugging Face
#: datasets ("image"/"label", "pixel_values"/"labels"), then torchvision's names.
IMAGE_KEYS = ("images", "image", "pixel_values", "img")
LABEL_KEYS = ("labels", "label", "target", "targets")


def _refuse_one_sample(label: Any, image_key: str, label_key: str) -> None:
    """A dict whose label is one number is one sample, as a Hugging Face
    dataset yields them before batching: the service trains on batches, so
    say how to make them rather than fail on the image's shape."""
    if np.ndim(label) == 0:
        raise TypeError(
            f"this loader item is one sample ({{{image_key!r}: ..., {label_key!r}: {label!r}}}), and feed() "
            "sends batches: batch the dataset first, e.g. torch.utils.data.DataLoader(dataset, batch_size=32) "
            "or, for a Hugging Face dataset, dataset.with_format('numpy').iter(batch_size=32)")


def _unpack(item: Any, keys: Optional[Tuple[str, str]] = None) -> Tuple[Any, Any]:
    """(images, labels) from a loader item: a 2-tuple or 2-list (what a torch
    DataLoader yields), or a mapping: keys=(images_key, labels_key) when given,
    else the first of IMAGE_KEYS and LABEL_KEYS it has."""
    if isinstance(item, Mapping):
        if keys is not None:
            missing = [k for k in keys if k not in item]
            if missing:
                raise KeyError(f"loader item has no key {missing[0]!r} (keys={keys}); its keys: {sorted(item)}")
            _refuse_one_sample(item[keys[1]], keys[0], keys[1])
            return item[keys[0]], item[keys[1]]
        ik = next((k for k in IMAGE_KEYS if k in item), None)
        lk = next((k for k in LABEL_KEYS if k in item), None)
        if ik is None or lk is None:
            raise TypeError(f"a dict loader item needs image and label keys (one of {IMAGE_KEYS} and one of "
                            f"{LABEL_KEYS}); its keys are {sorted(item)}: pass keys=('your_image_key', "
                            "'your_label_key')")
        _refuse_one_sample(item[lk], ik, lk)
        return item[ik], item[lk]
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    raise TypeError(f"a loader item must be (images, labels) or a dict with image and label keys, "
                    f"got {type(item).__name__}")


#: FeedSummary.skipped lists this many files at most (skipped_files counts all).
MAX_SKIPPED_LISTED = 1000


def _note_skip(summary: FeedSummary, batch_index: int, position: int, name: Optional[str], code: str,
               message: str) -> None:
    """Counts a file left out of batch batch_index (caller holds the summary's lock)."""
    summary.skipped_files[code] = summary.skipped_files.get(code, 0) + 1
    if len(summary.skipped) < MAX_SKIPPED_LISTED:
        summary.skipped.append(SkippedFile(batch_index, position, name, code, message))


def _note_left_out(summary: FeedSummary, batch_index: int, item: Any) -> None:
    """Counts the files jpeg_batches() left out of item before sending."""
    for position, name, code, message in item.left_out if isinstance(item, EncodedBatch) else ():
        _note_skip(summary, batch_index, position, name, code, message)


def _leave_out_refused(summary: FeedSummary, batch_index: int, item: Any, e: E.APIError,
                       lock: Any) -> Tuple[bool, Optional[EncodedBatch]]:
    """After rejection e of item, shared by both feeds: when e blames one JPEG
    file by name (field ``"jpeg[i]"``), that file is counted as skipped (under
    lock, the summary's) and the result is (True, item without it), or (True,
    None) when it was the batch's last file; (False, None) when e blames the
    batch. The batch is re-encoded outside the lock."""
    bad = item.refused_file(e.code, e.field) if isinstance(item, EncodedBatch) else None
    if bad is None:
        return False, None
    with lock:
        _note_skip(summary, batch_index, item.position(bad), item.name(bad), e.code, e.message)
        if item.n > 1:
            summary.retries += e.attempts - 1
    return True, item.without(bad) if item.n > 1 else None


#: A message for a file the service left out of its batch: it trained without it.
UNDECODABLE_MESSAGE = "the service could not decode its data; its batch trained without it"


class _LeftOutCheck:
    """The encoded batches accepted with a 202, whose results say later which
    files the service could not decode and left out
    (``decode.on_undecodable: skip``). Each is asked for once it has most
    likely trained: when more than ``lag`` batches were accepted after it,
    and at the end of the feed. Only the files' names and positions are
    kept, never the bodies."""

    def __init__(self, lag: int):
        self.lag = lag
        self.pending: List[Tuple[int, int, int, Optional[List[Optional[str]]], Optional[List[int]]]] = []
        self.mu = threading.Lock()

    def add(self, index: int, batch_id: int, item: EncodedBatch) -> None:
        with self.mu:
            self.pending.append((index, batch_id, item.n, item.names, item.positions))

    def due(self, final: bool) -> List[Tuple[int, int, int, Optional[List[Optional[str]]], Optional[List[int]]]]:
        with self.mu:
            k = len(self.pending) if final else max(0, len(self.pending) - self.lag)
            out, self.pending = self.pending[:k], self.pending[k:]
            return out


def _note_undecodable(summary: FeedSummary, index: int, result: BatchResult,
                      names: Optional[List[Optional[str]]], positions: Optional[List[int]]) -> None:
    """Counts the files the service left out of a batch that trained (caller
    holds the summary's lock)."""
    codes = {int(k["index"]): str(k.get("code") or "jpeg_undecodable")
             for k in (result.raw.get("skipped_samples") or ()) if isinstance(k, Mapping) and "index" in k}
    for i in result.skipped_samples:
        name = names[i] if names is not None and i < len(names) else None
        pos = positions[i] if positions is not None and i < len(positions) else i
        _note_skip(summary, index, pos, name, codes.get(i, "jpeg_undecodable"), UNDECODABLE_MESSAGE)


def _encode_item(item: Any, keys: Optional[Tuple[str, str]], layout: Optional[str]) -> Tuple[Any, int]:
    """(body, samples) of a loader item: an :class:`~streamfeed.jpeg.EncodedBatch`
    (JPEG files: jpeg_batches()) as it is, else ``(images, labels)`` or a dict
    encoded (its inputs checked: TypeError, ValueError). Shared by
    :func:`feed` and ``AsyncClient.feed``, so that both take the same items."""
    if isinstance(item, EncodedBatch):
        return item.body, item.n
    images, labels = _unpack(item, keys)
    body = encode_batch_parts(images, labels, layout)
    n = len(labels) if not hasattr(labels, "shape") else int(labels.shape[0])
    return body, n


def _attach_summary(e: BaseException, summary: "FeedSummary") -> BaseException:
    """e, the exception of a loader that failed mid-feed, carrying what the
    feed did before it as ``e.feed_summary`` (and a note in its traceback)."""
    try:
        setattr(e, "feed_summary", summary)
    except Exception:  # pragma: no cover - an exception type that takes no attributes
        pass
    add_note = getattr(e, "add_note", None)  # Python 3.11+
    if add_note is not None:
        add_note(f"streamfeed: the loader failed after {summary.submitted} batches were taken from it; "
                 f"every one was sent first ({summary})")
    return e


def _make_bar(progress: Optional[bool], total: Optional[int]) -> Any:
    if progress is False:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="batch", desc="streamfeed", smoothing=0.1)


def _ordinal(i: int) -> str:
    suffix = "th" if 10 <= i % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(i % 10, "th")
    return f"{i}{suffix}"


def _deterministic(e: E.APIError) -> bool:
    """A rejection that the same body would get again: a 4xx other than back-pressure."""
    return 400 <= e.status < 500 and not isinstance(e, E.Backpressure) and e.status != 408


#: Seconds between two readings of the live loss for the progress bar.
LOSS_INTERVAL_S = 0.5


def feed(client: Any, loader: Iterable[Any], connections: int = 4, wait_last: bool = True, *,
         max_in_flight: Optional[int] = None, progress: Optional[bool] = None,
         total: Optional[int] = None, max_errors: Optional[int] = None,
         on_error: str = "stop", keys: Optional[Tuple[str, str]] = None,
         layout: Optional[str] = None,
         on_result: Optional[Callable[[int, Any], None]] = None,
         skip_bad_files: bool = True) -> FeedSummary:
    """Uploads every batch of loader and returns a :class:`FeedSummary`.

    Args:
        client: a :class:`streamfeed.Client`.
        loader: an iterable of ``(images, labels)`` batches or of dicts
            (``{"image": ..., "label": ...}`` as Hugging Face datasets yield,
            ``{"images", "labels"}``, or any keys with ``keys=``); images
            uint8 NHWC or NCHW, numpy or torch; or of
            :class:`streamfeed.jpeg.EncodedBatch` (JPEG files:
            ``jpeg_batches(dataset_of_bytes_and_labels, 32)``), sent as they are.
        connections: concurrent uploads (worker threads, each with its own
            keep-alive connection).
        wait_last: post the last batch with ``wait=1`` after every other batch
            was accepted. The server trains batches in the order it accepted
            them, so when feed returns everything accepted has been trained and
            ``last_loss`` is the loss of the final step.
        max_in_flight: batches being uploaded or awaiting their reply, at most
            (default 2 x connections). Bounds the memory held: at most
            max_in_flight + 2 batches are taken from the loader and unanswered.
        progress: a tqdm progress bar showing the live training loss: None
            shows one when tqdm is installed, False never.
        total: the number of batches, for the progress bar (default ``len(loader)``
            when the loader has one).
        on_error: "stop" (default): the first deterministic rejection (a 4xx
            other than back-pressure) raises :class:`~streamfeed.errors.FeedAborted`
            naming the batch and the server's reason. "count": count every
            failure by code in ``summary.errors`` and go on (see max_errors).
        max_errors: with on_error="count", stop after more than this many
            failed batches and raise FeedAborted (None: never stop).
        keys: (images key, labels key) of dict items.
        layout: "NHWC"/"NCHW" for every batch (default: guessed per batch).
        on_result: called as ``on_result(index, reply)`` for each accepted batch
            (index: its position in the loader; reply: a BatchAccepted or, for
            batches posted with wait, a BatchResult), on a worker thread.
        skip_bad_files: for JPEG batches (:func:`~streamfeed.jpeg.jpeg_batches`):
            a file the server refuses by name (``field`` ``"jpeg[i]"``: a CMYK
            file, one cut short, one too large) is left out and the rest of
            its batch sent again, counted in ``summary.skipped_files`` and
            listed in ``summary.skipped``; a batch whose every file is refused
            fails with the last refusal, counted in ``summary.errors``, and
            the feed goes on. False: the refusal fails the batch (and with
            on_error="stop" the feed).

    A KeyboardInterrupt (Ctrl-C) in the calling thread stops the feed: the
    workers' back-pressure waits end at once, the batches not yet sent are
    dropped, and the interrupt reaches the caller once the requests already
    on the wire have ended (within the client's timeout).

    Raises:
        TypeError, ValueError: a batch is not usable (wrong dtype, rank, label
            count, one-hot labels): raised at once, before it is sent, since
            every later batch would fail the same way.
        Exception: the loader's own, once the batches it gave before were
            sent and answered; ``e.feed_summary`` is the FeedSummary so far.
        FeedAborted: a batch was rejected (on_error="stop"), more than
            max_errors batches failed, or 2 x connections batches in a row
            got no reply (the server is gone); ``.batch_index`` and
            ``.error`` say which and why, ``.summary`` what was done.
    """
    if connections < 1:
        raise ValueError("connections must be at least 1")
    if on_error not in ("stop", "count"):
        raise ValueError(f"on_error must be 'stop' or 'count', got {on_error!r}")
    if max_in_flight is None:
        max_in_flight = 2 * connections
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be at least 1")
    if total is None and hasattr(loader, "__len__"):
        try:
            total = len(loader)  # type: ignore[arg-type]
        except TypeError:
            total = None

    return _Feed(client, connections, max_in_flight, progress, total, max_errors, on_error, keys, layout,
                 on_result, skip_bad_files).run(loader, wait_last)


class _Feed:
    """One call of :func:`feed`: the state its worker threads share (the
    summary, the stop flag, the in-flight slots, the sessions they opened)
    behind one lock, and the steps of the feed as methods."""

    def __init__(self, client: Any, connections: int, max_in_flight: int, progress: Optional[bool],
                 total: Optional[int], max_errors: Optional[int], on_error: str,
                 keys: Optional[Tuple[str, str]], layout: Optional[str],
                 on_result: Optional[Callable[[int, Any], None]], skip_bad_files: bool) -> None:
        self.client = client
        self.connections = connections
        self.max_errors = max_errors
        self.on_error = on_error
        self.keys = keys
        self.layout = layout
        self.on_result = on_result
        self.skip_bad_files = skip_bad_files
        self.summary = FeedSummary()
        self.lock = threading.Lock()
        self.left_out = _LeftOutCheck(lag=2 * max_in_flight) if skip_bad_files else None
        self.slots = threading.BoundedSemaphore(max_in_flight)
        self.stop = threading.Event()
        self.fatal: List[BaseException] = []
        self.bar = _make_bar(progress, total)
        # Batches that did not reach the server are sent again connect_retries
        # times, as Client retries GETs: never when the policy retries nothing
        # (retry=0).
        policy = getattr(client, "retry", None)
        self.connect_retries = min(int(getattr(policy, "connect_retries", 0)),
                                   int(getattr(policy, "max_retries", 0)))
        # Batches in a row that got no reply at all: a server that is gone (or
        # answers nothing) stops the feed after 2 x connections of them, as
        # streamfeed-load does, rather than failing every batch of the loader.
        self.no_reply = 0
        self.max_no_reply = 2 * connections
        # The requests sessions (one per thread, each with a keep-alive
        # connection) that this feed's threads made: closed when the feed ends,
        # since the client would otherwise keep them, and their sockets, open.
        self.sessions: Set[Any] = set()
        self.session_of = getattr(client, "_session", None)
        self.done_feeding = threading.Event()
        # An exception of the loader itself ends the loop like its end, so that
        # the batches it gave are still sent; it is raised after them.
        self.loader_error: List[Exception] = []

    def show(self, loss: Optional[float]) -> None:
        if self.bar is None:
            return
        post: Dict[str, Any] = {"retries": self.summary.retries}
        if loss is not None:
            post["loss"] = f"{loss:.4f}"
        self.bar.set_postfix(post, refresh=False)

    def record_error(self, code: str, retries: int) -> None:
        with self.lock:
            summary = self.summary
            summary.errors[code] = summary.errors.get(code, 0) + 1
            summary.retries += retries
            if self.max_errors is not None and summary.failed > self.max_errors:
                self.stop.set()

    def fail_feed(self, message: str, index: int, e: E.StreamfeedError) -> None:
        """Stops the feed with FeedAborted (the first reason only); lock held."""
        if not self.fatal:
            self.fatal.append(E.FeedAborted(message, self.summary, batch_index=index, error=e))
        self.stop.set()

    def abort(self, index: int, e: E.APIError) -> None:
        with self.lock:
            self.fail_feed(f"the {_ordinal(index + 1)} batch of the loader (index {index}) was rejected: {e}. "
                           f"Every later batch would be too; fix the loader, or pass on_error='count' to go on",
                           index, e)

    def answered(self) -> None:
        with self.lock:
            self.no_reply = 0

    def unanswered(self, index: int, e: E.TransportError) -> None:
        with self.lock:
            self.no_reply += 1
            if self.no_reply >= self.max_no_reply:
                self.fail_feed(f"{self.no_reply} batches in a row got no reply from "
                               f"{getattr(self.client, 'url', 'the server')} "
                               f"(the last, index {index}: {e}); is the server up?", index, e)

    def post(self, index: int, body: Any, wait: bool) -> Any:
        """client.post_body, sending again (bounded) only a batch that
        certainly did not reach the server: never after an OutcomeUnknown."""
        attempt = 0
        while True:
            try:
                return self.client.post_body(body, wait, cancel=self.stop)
            except E.TransportError as e:
                if e.sent or attempt >= self.connect_retries or \
                        self.stop.wait(self.client.retry.delay(attempt, None)):
                    raise
                attempt += 1
                with self.lock:
                    self.summary.resends += 1

    def own_session(self) -> None:
        if self.session_of is not None:
            s = self.session_of()
            with self.lock:
                self.sessions.add(s)

    def check_left_out(self, final: bool) -> None:
        """Asks for the results of the encoded batches accepted with a 202
        that have most likely trained by now (all of them when final)."""
        if self.left_out is None:
            return
        client, summary = self.client, self.summary
        for index, bid, n, names, positions in self.left_out.due(final):
            try:
                res = client.wait_batch(bid, timeout=getattr(client, "timeout", 60.0)) if final \
                    else client.batch(bid)
            except (E.StreamfeedError, TimeoutError):
                continue  # evicted from the server's job table, or the server is gone: nothing to say
            with self.lock:
                if res.done:
                    _note_undecodable(summary, index, res, names, positions)
                elif res.state == "failed" and res.error_code == "jpeg_undecodable":
                    # no file of the batch decoded: the step never ran
                    summary.errors["jpeg_undecodable"] = summary.errors.get("jpeg_undecodable", 0) + 1
                    for i in range(n):
                        pos = positions[i] if positions is not None else i
                        _note_skip(summary, index, pos, names[i] if names is not None else None,
                                   "jpeg_undecodable", res.error_message or UNDECODABLE_MESSAGE)

    def send(self, index: int, item: Any, wait: bool) -> Optional[Tuple[Any, Any, int, int, Any]]:
        """Posts one batch, leaving out the files the server refuses by name
        (skip_bad_files). (reply, retries, samples, body bytes, the item as
        sent), or None when the batch failed (counted, and the feed stopped
        where on_error and the failure say so)."""
        summary, skip = self.summary, self.skip_bad_files
        body, n = _encode_item(item, self.keys, self.layout)
        while True:
            try:
                reply, retries = self.post(index, body, wait)
                return reply, retries, n, len(body), item
            except E.APIError as e:
                self.answered()
                file_refused, smaller = _leave_out_refused(summary, index, item, e, self.lock) \
                    if skip else (False, None)
                if smaller is not None:
                    item = smaller
                    body, n = item.body, item.n
                    continue
                self.record_error(e.code, e.attempts - 1)
                # A batch whose every file was refused by name says
                # nothing of the loader's other batches.
                if self.on_error == "stop" and _deterministic(e) and not file_refused:
                    self.abort(index, e)
                return None
            except E.BatchFailed as e:
                # Accepted, but its step failed: count it as an error, not a batch.
                self.answered()
                self.record_error(e.code, e.retries)
                if e.code == "jpeg_undecodable" and isinstance(item, EncodedBatch) and skip:
                    with self.lock:  # no file of it decoded (or, with on_undecodable fail, one did not)
                        for i in range(item.n):
                            _note_skip(summary, index, item.position(i), item.name(i), e.code, str(e))
                return None
            except E.TransportError as e:
                self.record_error(e.code, e.retries)
                self.unanswered(index, e)
                return None

    def accepted(self, index: int, item: Any, wait: bool, is_last: bool, reply: Any, retries: int, n: int,
                 nbytes: int) -> None:
        """Counts an accepted batch in the summary and hands its reply on."""
        self.answered()
        summary = self.summary
        with self.lock:
            summary.batches += 1
            summary.samples += n
            summary.bytes += nbytes
            summary.retries += retries
            bid = reply.id
            loss = reply.loss if isinstance(reply, BatchResult) else None
            if index == 0:
                summary.first_id = bid
                summary.first_loss = loss
            if is_last:
                summary.last_id = bid
                if wait:
                    summary.last_loss = loss
            if loss is not None:
                summary.latest_loss = loss
            if isinstance(item, EncodedBatch) and isinstance(reply, BatchResult):
                _note_undecodable(summary, index, reply, item.names, item.positions)
            self.show(summary.latest_loss)
        if isinstance(item, EncodedBatch) and not isinstance(reply, BatchResult) and self.left_out is not None:
            self.left_out.add(index, bid, item)
            self.check_left_out(False)
        if self.on_result is not None:
            self.on_result(index, reply)

    def work(self, index: int, item: Any, wait: bool, is_last: bool) -> None:
        """One batch, on a worker thread."""
        try:
            self.own_session()
            with self.lock:
                _note_left_out(self.summary, index, item)
            sent = self.send(index, item, wait)
            if sent is not None:
                reply, retries, n, nbytes, item = sent
                self.accepted(index, item, wait, is_last, reply, retries, n, nbytes)
        except BaseException as e:  # a usage error: stop everything and re-raise in the caller
            with self.lock:
                self.fatal.append(e)
            self.stop.set()
        finally:
            self.slots.release()
            if self.bar is not None:
                self.bar.update(1)

    def watch_loss(self) -> None:
        """The live loss: the server's latest step, read every LOSS_INTERVAL_S
        while the bar is shown (a 202 reply carries no loss: training follows)."""
        self.own_session()
        while not self.done_feeding.wait(LOSS_INTERVAL_S):
            try:
                loss = self.client.training_loss()
            except E.StreamfeedError:
                continue
            if loss is not None:
                with self.lock:
                    self.summary.latest_loss = loss
                    self.show(loss)
                self.bar.refresh()

    def pull(self, it: Iterator[Any]) -> Any:
        try:
            return next(it, _END)
        except Exception as e:
            self.loader_error.append(e)
            return _END

    def submit_all(self, loader: Iterable[Any], wait_last: bool, pool: ThreadPoolExecutor) -> None:
        """Hands every batch of the loader to the pool, in order, the first
        alone and the last (wait_last) after every other was accepted."""
        stop = self.stop
        futures: Set[Any] = set()
        it = iter(loader)
        nxt = self.pull(it)
        index = 0
        while nxt is not _END and not stop.is_set():
            item = nxt
            nxt = self.pull(it)
            is_last = nxt is _END and not self.loader_error
            wait = index == 0
            if is_last and wait_last:
                # Everything before must be accepted first, so that the last
                # batch is also the last one the server trains.
                _wait_futures(futures)
                if stop.is_set():
                    break
                wait = True
            self.slots.acquire()
            if stop.is_set():
                self.slots.release()
                break
            with self.lock:
                self.summary.submitted += 1
            f = pool.submit(self.work, index, item, wait, is_last)
            if index == 0:
                # The first loss is that of the model as the feed found it:
                # nothing else is sent before the first step has run.
                f.result()
            futures.add(f)
            futures = {f for f in futures if not f.done()}
            index += 1
        _wait_futures(futures)

    def run(self, loader: Iterable[Any], wait_last: bool) -> FeedSummary:
        summary, bar = self.summary, self.bar
        t0 = time.monotonic()
        watcher = threading.Thread(target=self.watch_loss, name="streamfeed-loss", daemon=True) \
            if bar is not None else None
        if watcher is not None:
            watcher.start()
        pool = ThreadPoolExecutor(max_workers=self.connections, thread_name_prefix="streamfeed-feed")
        try:
            self.submit_all(loader, wait_last, pool)
            if not self.stop.is_set():
                self.check_left_out(True)
        except BaseException:
            self.stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            pool.shutdown(wait=True)
            self.done_feeding.set()
            if watcher is not None:
                watcher.join()
            drop = getattr(self.client, "_drop_sessions", None)
            if drop is not None:
                drop(self.sessions)
            summary.seconds = time.monotonic() - t0
            if bar is not None:
                bar.close()
        if self.loader_error:
            raise _attach_summary(self.loader_error[0], summary)
        if self.fatal:
            raise self.fatal[0]
        if self.max_errors is not None and summary.failed > self.max_errors:
            raise E.FeedAborted(f"stopped after {summary.failed} failed batches: {summary}", summary)
        return summary
