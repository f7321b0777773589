"""Draining a data loader into a streamfeed server over several connections.

:func:`feed` takes any iterable of ``(images, labels)`` batches — a
``torch.utils.data.DataLoader``, a generator, a list — and uploads them with a
pool of worker threads, one ``requests.Session`` (keep-alive connection) per
thread. At most ``max_in_flight`` batches are being uploaded or waiting for
their reply, and the loop takes the next batch from the loader only once one
of them is answered, so memory stays bounded however long the loader is: at
most ``max_in_flight + 2`` batches are held (the extra two: the batch waiting
for a free upload slot and the one read ahead to tell the last batch apart).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait as _wait_futures
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Mapping, Optional

from . import errors as E
from .jpeg import EncodedBatch
from .wire import encode_batch

_END = object()


@dataclass
class FeedSummary:
    """What :func:`feed` did.

    Attributes:
        batches: batches the server accepted.
        samples: images in the accepted batches.
        bytes: body bytes of the accepted batches (safetensors, headers included).
        seconds: wall time of the whole feed.
        errors: batches that finally failed, by the server's error code
            (``transport_error`` when there was no reply; a step that failed
            counts under its job error code).
        retries: back-pressure retries (429/503 + Retry-After) over all batches.
        first_loss: loss of the first batch. It is posted with ``wait=1`` before
            any other, so this is the loss of the model as the feed found it.
        last_loss: loss of the last batch when ``wait_last`` (else None).
        first_id, last_id: server ids of the first and last batch, when accepted.
        submitted: batches taken from the loader.
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
        return (f"{self.batches}/{self.submitted} batches, {self.samples} samples, "
                f"{self.bytes / 1e6:.1f} MB in {self.seconds:.2f}s "
                f"({self.samples_per_second:.0f} samples/s, {self.bytes_per_second / 1e6:.1f} MB/s), "
                f"{self.retries} retries{loss}{errs}")


def _unpack(item: Any):
    """(images, labels) from a loader item: a 2-tuple or 2-list (what a torch
    DataLoader yields), or a mapping with "images" and "labels"."""
    if isinstance(item, Mapping):
        return item["images"], item["labels"]
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    raise TypeError(f"a loader item must be (images, labels) or {{'images': ..., 'labels': ...}}, "
                    f"got {type(item).__name__}")


def _make_bar(progress: Optional[bool], total: Optional[int]):
    if progress is False:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="batch", desc="streamfeed", smoothing=0.1)


def feed(client: Any, loader: Iterable, connections: int = 4, wait_last: bool = True, *,
         max_in_flight: Optional[int] = None, progress: Optional[bool] = None,
         total: Optional[int] = None, max_errors: Optional[int] = None,
         layout: Optional[str] = None,
         on_result: Optional[Callable[[int, Dict[str, Any]], None]] = None) -> FeedSummary:
    """Uploads every batch of loader and returns a :class:`FeedSummary`.

    Args:
        client: a :class:`streamfeed.Client`.
        loader: an iterable of ``(images, labels)`` (or ``{"images", "labels"}``)
            batches; images uint8 NHWC or NCHW, numpy or torch; or of
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
        progress: a tqdm progress bar: None shows one when tqdm is installed,
            False never.
        total: the number of batches, for the progress bar (default ``len(loader)``
            when the loader has one).
        max_errors: stop after more than this many failed batches and raise
            :class:`streamfeed.errors.FeedAborted` (None: never stop, count them).
        layout: "NHWC"/"NCHW" for every batch (default: guessed per batch).
        on_result: called as ``on_result(index, reply)`` for each accepted batch
            (index: its position in the loader), on a worker thread.

    Raises:
        TypeError, ValueError: a batch is not usable (wrong dtype, rank, label
            count): raised at once, since every later batch would fail the same way.
        FeedAborted: more than max_errors batches failed.
    """
    if connections < 1:
        raise ValueError("connections must be at least 1")
    if max_in_flight is None:
        max_in_flight = 2 * connections
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be at least 1")
    if total is None and hasattr(loader, "__len__"):
        try:
            total = len(loader)  # type: ignore[arg-type]
        except TypeError:
            total = None

    summary = FeedSummary()
    lock = threading.Lock()
    slots = threading.BoundedSemaphore(max_in_flight)
    stop = threading.Event()
    fatal: list = []
    bar = _make_bar(progress, total)
    t0 = time.monotonic()

    def record_error(code: str, retries: int) -> None:
        with lock:
            summary.errors[code] = summary.errors.get(code, 0) + 1
            summary.retries += retries
            if max_errors is not None and summary.failed > max_errors:
                stop.set()

    def work(index: int, item: Any, wait: bool, is_last: bool) -> None:
        try:
            if isinstance(item, EncodedBatch):  # e.g. JPEG files (streamfeed.jpeg.jpeg_batches)
                body, n = item.body, item.n
            else:
                images, labels = _unpack(item)
                body = encode_batch(images, labels, layout)
                n = len(labels) if not hasattr(labels, "shape") else int(labels.shape[0])
            try:
                reply, retries = client.post_body(body, wait)
            except E.APIError as e:
                record_error(e.code, e.attempts - 1)
                return
            except E.BatchFailed as e:
                # Accepted, but its step failed: count it as an error, not a batch.
                record_error(e.code, 0)
                return
            except E.TransportError:
                record_error("transport_error", 0)
                return
            with lock:
                summary.batches += 1
                summary.samples += n
                summary.bytes += len(body)
                summary.retries += retries
                bid = reply.get("id")
                if index == 0:
                    summary.first_id = bid
                    summary.first_loss = reply.get("loss")
                if is_last:
                    summary.last_id = bid
                    if wait:
                        summary.last_loss = reply.get("loss")
                if bar is not None:
                    post = {"retries": summary.retries}
                    loss = summary.last_loss if summary.last_loss is not None else summary.first_loss
                    if loss is not None:
                        post["loss"] = f"{loss:.4f}"
                    bar.set_postfix(post, refresh=False)
            if on_result is not None:
                on_result(index, reply)
        except BaseException as e:  # a usage error: stop everything and re-raise in the caller
            with lock:
                fatal.append(e)
            stop.set()
        finally:
            slots.release()
            if bar is not None:
                bar.update(1)

    pool = ThreadPoolExecutor(max_workers=connections, thread_name_prefix="streamfeed-feed")
    futures: set = set()
    try:
        it = iter(loader)
        nxt = next(it, _END)
        index = 0
        while nxt is not _END and not stop.is_set():
            item = nxt
            nxt = next(it, _END)
            is_last = nxt is _END
            wait = index == 0
            if is_last and wait_last:
                # Everything before must be accepted first, so that the last
                # batch is also the last one the server trains.
                _wait_futures(futures)
                wait = True
            slots.acquire()
            if stop.is_set():
                slots.release()
                break
            with lock:
                summary.submitted += 1
            f = pool.submit(work, index, item, wait, is_last)
            if index == 0:
                # The first loss is that of the model as the feed found it:
                # nothing else is sent before the first step has run.
                f.result()
            futures.add(f)
            futures = {f for f in futures if not f.done()}
            index += 1
        _wait_futures(futures)
    except BaseException:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)
        summary.seconds = time.monotonic() - t0
        if bar is not None:
            bar.close()
    if fatal:
        raise fatal[0]
    if max_errors is not None and summary.failed > max_errors:
        raise E.FeedAborted(f"stopped after {summary.failed} failed batches: {summary}", summary)
    return summary
