"""The HTTP client of a streamfeed server.

>>> from streamfeed import Client
>>> c = Client("http://localhost:8080")
>>> c.post_batch(images, labels, wait=True)["loss"]     # doctest: +SKIP
2.30

A :class:`Client` is safe to share between threads: each thread gets its own
``requests.Session`` (one keep-alive connection pool per thread), which is what
:meth:`Client.feed` relies on to upload over several connections at once.
"""
from __future__ import annotations

import email.utils
import json
import random
import re
import threading
import time
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Literal, Mapping, Optional, Tuple,
                    Union, overload)
from urllib.parse import urlsplit

import numpy as np
import requests
import urllib3

from . import errors as E
from .results import BatchAccepted, BatchResult, EvalList, EvalSummary
from .wire import CONTENT_TYPE, Body, decode_tensors, encode_batch_parts

if TYPE_CHECKING:  # feed.py imports this module: the summary type only for checkers
    from .feed import FeedSummary



@dataclass(frozen=True)
class RetryPolicy:
    """How the client retries back-pressure replies.

    A reply of 429 or 503 that carries ``Retry-After`` (the server's "ring
    full" and "ring full timeout" answers) is retried up to ``max_retries``
    times. Each wait is the server's ``Retry-After`` or the exponential
    back-off ``backoff_base * 2**attempt`` (with jitter), whichever is longer,
    capped at ``backoff_max`` seconds. GET requests are also retried on
    connection errors, ``connect_retries`` times (they are idempotent). The
    client never sends a POST again by itself; :func:`streamfeed.feed` sends
    a batch again, ``connect_retries`` times, only when it certainly did not
    reach the server (:class:`~streamfeed.errors.TransportError`: the
    connection could not be made, or broke before the body was sent), never
    after the whole body was sent (:class:`~streamfeed.errors.OutcomeUnknown`:
    the server may have accepted it).
    """

    max_retries: int = 20
    backoff_base: float = 0.05
    backoff_max: float = 5.0
    connect_retries: int = 3

    def delay(self, attempt: int, retry_after: Optional[float]) -> float:
        """Seconds to wait before retry number attempt + 1 (attempt counts from 0)."""
        backoff = min(self.backoff_max, self.backoff_base * float(2 ** min(attempt, 30)))
        backoff *= random.uniform(0.5, 1.0)  # jitter: connections that failed together spread out
        if retry_after is not None:
            backoff = max(backoff, retry_after)
        return min(backoff, self.backoff_max)


def check_url(url: str) -> str:
    """The base URL without its trailing slash; a URL a user will not mean fails here.

    Raises:
        ValueError: no http:// or https:// scheme (``"host:8080"`` parses as a
            scheme "host"), no host, or a query or fragment.
    """
    if not isinstance(url, str):
        raise TypeError(f"url must be a string like 'http://host:8080', got {type(url).__name__}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"url {url!r} needs a scheme and a host: write 'http://{url}' "
                         f"(or https://), e.g. Client('http://localhost:8080')")
    if parts.query or parts.fragment:
        raise ValueError(f"url {url!r}: give the server's base URL, without a query or fragment")
    try:
        parts.port
    except ValueError as e:
        raise ValueError(f"url {url!r}: {e}") from None
    return url.rstrip("/")


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date; None if absent or unparsable."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


#: An evaluation's name, as the server accepts it (openapi/streamfeed.yaml).
EVAL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_eval_name(name: Any) -> str:
    """name if the server would take it as an evaluation's name.

    Raises:
        TypeError: not a string.
        ValueError: not 1 to 64 characters of ``A-Z a-z 0-9 _ . -``.
    """
    if not isinstance(name, str):
        raise TypeError(f"eval must be a string naming the evaluation, got {type(name).__name__}")
    if not EVAL_NAME.fullmatch(name):
        raise ValueError(f"eval {name!r}: an evaluation's name is 1 to 64 characters of A-Z a-z 0-9 _ . -")
    return name


def eval_query(name: Optional[str], logits: bool = False) -> Dict[str, str]:
    """The query of an eval batch: ``mode=eval``, ``eval=name`` when named,
    ``return=logits`` (which the server takes with ``wait=1`` only)."""
    q = {"mode": "eval"}
    if name is not None:
        q["eval"] = check_eval_name(name)
    if logits:
        q["return"] = "logits"
        q["wait"] = "1"
    return q


def labels_for_eval(labels: Any) -> Any:
    """labels, refusing None: the server scores every eval batch against its labels."""
    if labels is None:
        raise ValueError("labels are required: the server scores every eval batch against them "
                         "(its loss, top1 and top5), logits included")
    return labels


def logits_path(batch_id: int, location: Optional[str] = None) -> str:
    """The path of a batch's kept logits: the 202's ``Location`` when it is a
    path, else the documented GET /v1/batches/{id}/logits."""
    if location and location.startswith("/"):
        return location
    return f"/v1/batches/{int(batch_id)}/logits"


def decode_logits(content_type: str, content: bytes, reply: Callable[[], Any]) -> np.ndarray:
    """The ``logits`` tensor of a 200 reply of ``return=logits`` or GET
    /v1/batches/{id}/logits, as the server sent it (float32 ``[N, classes]``,
    ``[N, classes, H, W]`` for a segmentation model).

    A JSON 200 instead is the final state of a batch that failed (reply()
    decodes it).

    Raises:
        BatchFailed: the batch failed.
        StreamfeedError: a reply that is neither.
    """
    if content_type.split(";")[0].strip() == CONTENT_TYPE:
        tensors = decode_tensors(content)
        if "logits" not in tensors:
            raise E.StreamfeedError(f"the logits reply has no 'logits' tensor (it has {sorted(tensors)})")
        return tensors["logits"]
    body = reply()
    if isinstance(body, dict) and body.get("state") == "failed":
        raise E.BatchFailed(body)
    raise E.StreamfeedError(f"expected the logits as safetensors, got {content_type or 'no content type'}: "
                            f"{str(body)[:300]}")


def poll_pause(sent: float, now: float, interval: float, deadline: float) -> Tuple[float, float]:
    """(seconds to sleep, next interval) after a 202 of a kept-logits GET sent
    at sent: a reply that came sooner than interval (a server with a short
    wait) is followed by a pause, so that polling does not spin; the interval
    doubles up to 0.25 s. Shared by Client and AsyncClient."""
    pause = min(interval - (now - sent), deadline - now) if now - sent < interval else 0.0
    return pause, min(interval * 2, 0.25)


def logits_timeout(batch_id: int, timeout: float) -> TimeoutError:
    """The TimeoutError of logits that did not come within the client's wait_timeout."""
    return TimeoutError(f"batch {batch_id} had not run after {timeout}s; the server keeps its logits "
                        f"(eval.logits_keep_s): ask again with batch_logits({batch_id})")


class _TrackedBody:
    """A request body (bytes or a :class:`Body`) that records whether it was
    written to the socket to its end.

    urllib3 sends an iterable body part by part and asks for the next part
    only once the previous one was written, so ``done`` becomes True only after
    the last part left; a request that failed with ``done`` still False never
    reached the server whole (its connection was never made, or broke during
    the upload), and the server cannot have accepted it."""

    __slots__ = ("data", "nbytes", "done")

    def __init__(self, data: Union[bytes, bytearray, memoryview, Body]):
        self.data = data
        self.nbytes = len(data) if isinstance(data, Body) else memoryview(data).nbytes
        self.done = False

    def __len__(self) -> int:  # requests sends a Content-Length, not chunks
        return self.nbytes

    def __iter__(self) -> Iterator[Any]:
        self.done = False
        if isinstance(self.data, Body):
            yield from self.data.parts
        else:
            yield self.data
        self.done = True


def _connect_failed(e: BaseException) -> bool:
    """A requests exception raised while making the connection (refused,
    connect timeout, DNS, the TLS handshake): nothing of the request was sent."""
    if isinstance(e, (requests.ConnectTimeout, requests.exceptions.SSLError)):
        return True
    reason = getattr(e.args[0], "reason", None) if e.args else None
    return isinstance(reason, urllib3.exceptions.NewConnectionError)  # includes NameResolutionError


def transport_error(method: str, url: str, e: BaseException, body: Optional[_TrackedBody],
                    retries: int) -> E.TransportError:
    """The TransportError of a request that got no reply: OutcomeUnknown when
    the whole request may have reached the server (its body was written to its
    end, or, without a tracked body, the connection had been made)."""
    if body is not None:
        delivered = body.done
    else:
        delivered = not _connect_failed(e)
    if delivered:
        return E.OutcomeUnknown(f"{method} {url}: no reply after the request was sent, so the server may have "
                                f"acted on it: {e}", e, retries=retries)
    return E.TransportError(f"{method} {url}: {e}", e, retries=retries)


class Client:
    """A client of one streamfeed server.

    Args:
        url: the server's base URL, e.g. ``http://gpu-box:8080``.
        token: the bearer token when the server has ``http.token`` set; sent
            as ``Authorization: Bearer <token>`` on every request.
        timeout: seconds allowed to connect, to send a body and to wait for
            its reply. A full ring holds an upload unread for up to the
            server's ``ring.full_timeout_ms`` before it answers 503 with
            ``Retry-After``: keep timeout above that (the default 60 s is
            above the server's default 10 s), or a suspended upload fails
            with :class:`~streamfeed.errors.TransportError` instead of
            getting the 503 that is retried.
        wait_timeout: read timeout of requests that wait for a training step
            (``wait=True``); keep it above the server's ``pipeline.wait_timeout_ms``.
        retry: the back-pressure retry policy (:class:`RetryPolicy`), or an int
            (max retries with the default back-off), 0 to never retry
            (feed() then sends no batch again either).
        verify: for an ``https://`` server: the CA bundle (a path) that signed
            its certificate, True for the system's CAs (the default), or
            False to skip verification (never across a network you do not
            trust). Given per request, so it wins over ``REQUESTS_CA_BUNDLE``.

    Methods return the server's JSON replies as dicts (see openapi/streamfeed.yaml)
    and raise :class:`streamfeed.errors.APIError` subclasses for error replies.
    """

    def __init__(self, url: str, token: Optional[str] = None, timeout: float = 60.0,
                 wait_timeout: float = 120.0, retry: Union[RetryPolicy, int, None] = None,
                 verify: Union[bool, str, None] = None):
        self.url = check_url(url)
        self.token = token
        self.verify = verify
        self.timeout = float(timeout)
        self.wait_timeout = max(float(wait_timeout), self.timeout)
        if retry is None:
            retry = RetryPolicy()
        elif isinstance(retry, int):
            retry = RetryPolicy(max_retries=retry)
        self.retry: RetryPolicy = retry
        self._local = threading.local()
        self._sessions: List[requests.Session] = []
        self._lock = threading.Lock()

    # ---- plumbing ----------------------------------------------------------------

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = requests.Session()
            if self.token:
                s.headers["Authorization"] = f"Bearer {self.token}"
            s.headers["User-Agent"] = "streamfeed-python/0.1"
            self._local.session = s
            with self._lock:
                self._sessions.append(s)
        return s

    def _drop_sessions(self, sessions: Iterable[requests.Session]) -> None:
        """Closes sessions whose threads have ended (feed()'s workers) and
        forgets them: a thread's session is otherwise held here, with its
        open connection, for as long as the client lives."""
        sessions = list(sessions)
        gone = {id(s) for s in sessions}
        with self._lock:
            self._sessions = [s for s in self._sessions if id(s) not in gone]
        for s in sessions:
            s.close()

    def close(self) -> None:
        """Closes every thread's connections. The client stays usable (it reconnects)."""
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for s in sessions:
            s.close()
        self._local = threading.local()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def _error(self, resp: requests.Response, method: str, url: str, attempts: int) -> E.APIError:
        try:
            body = resp.json()
        except ValueError:
            body = resp.text
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict) and "code" in err:
            code, message, field = str(err["code"]), str(err.get("message", "")), err.get("field")
        else:
            code, message, field = f"http_{resp.status_code}", (resp.text or resp.reason or "")[:500], None
        has_ra = "Retry-After" in resp.headers
        cls = E.error_class(resp.status_code, has_ra)
        return cls(resp.status_code, code, message, field=field,
                   request_id=resp.headers.get("X-Request-Id"),
                   retry_after=parse_retry_after(resp.headers.get("Retry-After")), body=body,
                   method=method, url=url, attempts=attempts)

    def _send(self, method: str, path: str, *, params: Optional[Dict[str, str]] = None, data: Any = None,
              headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
              ok: Tuple[int, ...] = (), cancel: Optional[threading.Event] = None
              ) -> Tuple[requests.Response, int]:
        """Sends one request with the retry policy.

        Returns (response, retries). A status >= 400 raises an APIError, except
        the statuses listed in ok. When cancel is set (before or during a
        back-pressure wait) no retry follows: the last reply's APIError is
        raised at once."""
        url = self.url + path
        timeout = self.timeout if timeout is None else timeout
        retries = 0
        while True:
            body = _TrackedBody(data) if isinstance(data, (bytes, bytearray, memoryview, Body)) else None
            try:
                extra: Dict[str, Any] = {} if self.verify is None else {"verify": self.verify}
                resp = self._session().request(method, url, params=params,
                                               data=data if body is None else body, headers=headers,
                                               timeout=(timeout, timeout), **extra)
            except requests.ConnectionError as e:
                if method == "GET" and retries < min(self.retry.connect_retries, self.retry.max_retries):
                    time.sleep(self.retry.delay(retries, None))
                    retries += 1
                    continue
                raise transport_error(method, url, e, body, retries) from e
            except requests.RequestException as e:
                raise transport_error(method, url, e, body, retries) from e
            if resp.status_code < 400 or resp.status_code in ok:
                return resp, retries
            if (resp.status_code in (429, 503) and "Retry-After" in resp.headers
                    and retries < self.retry.max_retries):
                delay = self.retry.delay(retries, parse_retry_after(resp.headers.get("Retry-After")))
                if cancel is not None:
                    err = self._error(resp, method, url, retries + 1)
                    resp.close()
                    if cancel.wait(delay):
                        raise err
                else:
                    resp.close()
                    time.sleep(delay)
                retries += 1
                continue
            raise self._error(resp, method, url, retries + 1)

    def _json(self, method: str, path: str, **kw: Any) -> Dict[str, Any]:
        resp, _ = self._send(method, path, **kw)
        out: Dict[str, Any] = resp.json()
        return out

    # ---- batches -----------------------------------------------------------------

    def post_body(self, body: Union[bytes, Body], wait: bool = False, *,
                  query: Optional[Mapping[str, str]] = None, cancel: Optional[threading.Event] = None
                  ) -> Tuple[Union[BatchAccepted, BatchResult], int]:
        """POSTs an already encoded safetensors body to /v1/batches.

        body is bytes or a :class:`streamfeed.wire.Body` (its parts are written
        to the socket as they are, without being joined into one copy). query
        holds further query parameters (``{"mode": "eval"}``: see evaluate()).
        cancel, when given, cuts the back-pressure retries short once it is
        set: the last reply's :class:`~streamfeed.errors.Backpressure` is
        raised without waiting (feed() passes its stop event).

        Returns (reply, retries): the reply is a :class:`BatchAccepted` or,
        with wait, the finished :class:`BatchResult`.

        Raises:
            BatchFailed: wait was set and the batch's step failed.
            APIError: the server rejected the batch (after the retries, for back-pressure).
        """
        params = dict(query or {})
        if wait:
            params["wait"] = "1"
        resp, retries = self._send("POST", "/v1/batches", params=params or None,
                                   data=body, headers={"Content-Type": CONTENT_TYPE},
                                   timeout=self.wait_timeout if wait else None, cancel=cancel)
        reply = resp.json()
        if not wait:
            return BatchAccepted.from_json(reply), retries
        result = BatchResult.from_json(reply)
        if not result.finished:
            # The server's wait ended first (pipeline.wait_timeout_ms): poll.
            result = self.wait_batch(result.id, timeout=self.wait_timeout)
        if result.state == "failed":
            raise E.BatchFailed(result.raw, retries)
        return result, retries

    @overload
    def post_batch(self, images: Any, labels: Any, wait: Literal[False] = ..., *,
                   layout: Optional[str] = ...) -> BatchAccepted: ...

    @overload
    def post_batch(self, images: Any, labels: Any, wait: Literal[True], *,
                   layout: Optional[str] = ...) -> BatchResult: ...

    @overload
    def post_batch(self, images: Any, labels: Any, wait: bool, *,
                   layout: Optional[str] = ...) -> Union[BatchAccepted, BatchResult]: ...

    def post_batch(self, images: Any, labels: Any, wait: bool = False, *,
                   layout: Optional[str] = None) -> Union[BatchAccepted, BatchResult]:
        """Submits one batch for training.

        Args:
            images: uint8 images, numpy array or torch tensor, ``[N,H,W,C]`` or
                ``[N,C,H,W]``. The layout is guessed from the shape (last dim in
                {1,3,4}: NHWC; else dim 1 in {1,3,4}: NCHW) unless given.
            labels: integer class labels ``[N]`` of any int dtype (sent in the smallest
                dtype that holds them: U8 below 256 classes).
            wait: wait until the batch has been trained and return its result.
            layout: "NHWC" or "NCHW" to override the guess.

        Returns:
            Without wait, a :class:`BatchAccepted` (``id``, ``queued``,
            ``ring_slots``, ``ring_free``). With wait, the finished
            :class:`BatchResult` (``id``, ``state`` "done", ``loss``,
            ``accuracy``, ``step``, ``timings``, ...).

        Raises:
            TypeError, ValueError: bad inputs (checked before anything is sent).
            Backpressure: the ring stayed full through every retry.
            APIError: any other error reply, with the server's code.
            BatchFailed: wait was set and the step failed.
        """
        if labels is None:
            raise ValueError("labels are required to train; use transform() for images alone")
        return self.post_body(encode_batch_parts(images, labels, layout), wait)[0]

    # ---- evaluation ----------------------------------------------------------------

    @overload
    def evaluate(self, images: Any, labels: Any, *, eval: Optional[str] = ..., wait: Literal[True] = ...,
                 layout: Optional[str] = ...) -> BatchResult: ...

    @overload
    def evaluate(self, images: Any, labels: Any, *, eval: Optional[str] = ..., wait: Literal[False],
                 layout: Optional[str] = ...) -> BatchAccepted: ...

    @overload
    def evaluate(self, images: Any, labels: Any, *, eval: Optional[str] = ..., wait: bool,
                 layout: Optional[str] = ...) -> Union[BatchAccepted, BatchResult]: ...

    def evaluate(self, images: Any, labels: Any, *, eval: Optional[str] = None, wait: bool = True,
                 layout: Optional[str] = None) -> Union[BatchAccepted, BatchResult]:
        """Submits one evaluation batch (POST /v1/batches?mode=eval).

        The server runs it forward only, in eval mode (batchnorm on its running
        statistics), with ``augment.eval_pipeline``, on the weights left by
        every training batch sent before it; nothing is updated. It counts
        towards the evaluation named eval (GET /v1/evals/{name}).

        Args:
            images, labels, layout: as for :meth:`post_batch` (labels are
                required: the batch is scored against them).
            eval: the evaluation's name (1 to 64 of ``A-Z a-z 0-9 _ . -``);
                None counts it towards "default".
            wait: wait until it ran and return its result (the default).

        Returns:
            With wait, the finished :class:`BatchResult` (``kind`` "eval",
            ``loss``, ``top1``, ``top5``, ``eval_name``, ``step``: the training
            steps before it). Without, a :class:`BatchAccepted`.

        Raises:
            TypeError, ValueError: bad inputs or name (checked before anything is sent).
            Conflict: code ``too_many_evals``: eval would be one name more than
                the server's ``eval.max_names``, none of which has been idle for
                ``eval.name_idle_s`` (:meth:`delete_eval` frees one).
            APIError, Backpressure, BatchFailed: as for :meth:`post_batch`.
        """
        body = encode_batch_parts(images, labels_for_eval(labels), layout)
        return self.post_body(body, wait, query=eval_query(eval))[0]

    def logits(self, images: Any, labels: Any, *, eval: Optional[str] = None,
               layout: Optional[str] = None) -> np.ndarray:
        """The model's logits for a batch (POST /v1/batches?mode=eval&return=logits&wait=1).

        The batch is an evaluation batch like :meth:`evaluate`'s (it counts
        towards the evaluation eval too). When the server's wait
        (``pipeline.wait_timeout_ms``) runs out before the batch ran, its
        202 names where the logits are kept; they are fetched from there
        (GET /v1/batches/{id}/logits?wait=1) until the client's wait_timeout
        has passed since the POST.

        Args:
            images, layout: as for :meth:`post_batch`.
            labels: required: the server scores every eval batch (its loss,
                top1 and top5), logits included.
            eval: the evaluation's name, as for :meth:`evaluate`.

        Returns:
            The logits as the server sends them: float32 ``[N, classes]``
            (``[N, classes, H, W]`` for a segmentation model).

        Raises:
            PayloadTooLarge: code ``logits_too_large``: the logits alone exceed
                the server's ``eval.logits_keep_bytes`` (refused before the batch ran).
            Gone: code ``logits_expired``: the kept logits were let go before
                they were fetched.
            TimeoutError: the batch had not run within wait_timeout seconds
                (the server still keeps the logits: :meth:`batch_logits`).
            BatchFailed: the batch's forward failed.
            TypeError, ValueError, APIError, Backpressure: as for :meth:`evaluate`.
        """
        body = encode_batch_parts(images, labels_for_eval(labels), layout)
        deadline = time.monotonic() + self.wait_timeout
        resp, _ = self._send("POST", "/v1/batches", params=eval_query(eval, logits=True), data=body,
                             headers={"Content-Type": CONTENT_TYPE}, timeout=self.wait_timeout)
        if resp.status_code == 202:
            # The server's wait ran out first: it keeps the logits where Location says.
            batch_id = int(resp.json()["id"])
            return self._kept_logits(batch_id, logits_path(batch_id, resp.headers.get("Location")), deadline)
        return decode_logits(resp.headers.get("Content-Type", ""), resp.content, resp.json)

    def batch_logits(self, batch_id: int, wait: bool = True) -> Optional[np.ndarray]:
        """The logits an eval batch kept when its ``return=logits`` wait ran
        out (GET /v1/batches/{id}/logits). A read does not consume them.

        Args:
            batch_id: the batch's id (the 202's ``id``).
            wait: wait until the batch ran, up to the client's wait_timeout.

        Returns:
            float32 ``[N, classes]`` (as :meth:`logits`); without wait, None
            while the batch has not run yet.

        Raises:
            NotFound: code ``logits_not_kept`` (the batch kept none: a training
                batch, or an eval batch whose logits were the POST's reply)
                or ``batch_not_found`` (no such batch, or forgotten).
            Gone: code ``logits_expired``: they were kept and have been let go
                (``eval.logits_keep_s``, ``eval.logits_keep_max``,
                ``eval.logits_keep_bytes``).
            BatchFailed: the batch failed and has no logits.
            TimeoutError: with wait, the batch had not run within wait_timeout.
        """
        path = logits_path(batch_id)
        if wait:
            return self._kept_logits(int(batch_id), path, time.monotonic() + self.wait_timeout)
        resp = self._get_logits(int(batch_id), path, wait=False)
        if resp.status_code == 202:
            return None
        return decode_logits(resp.headers.get("Content-Type", ""), resp.content, resp.json)

    def _get_logits(self, batch_id: int, path: str, wait: bool) -> requests.Response:
        """One GET of kept logits; a batch that failed raises BatchFailed with its state."""
        try:
            resp, _ = self._send("GET", path, params={"wait": "1"} if wait else None,
                                 timeout=self.wait_timeout if wait else None)
        except E.Conflict as e:
            if e.code != "batch_failed":
                raise
            try:
                failed = self.batch(batch_id)
            except E.NotFound:
                raise e from None
            raise E.BatchFailed(failed.raw) from e
        return resp

    def _kept_logits(self, batch_id: int, path: str, deadline: float) -> np.ndarray:
        """GET path?wait=1 until the logits come, or TimeoutError after deadline.

        Each GET waits on the server (``pipeline.wait_timeout_ms``); a 202 that
        comes back sooner than the polling interval (a server with a short
        wait) is followed by a pause, so that the loop does not spin."""
        interval = 0.005
        while True:
            sent = time.monotonic()
            resp = self._get_logits(batch_id, path, wait=True)
            if resp.status_code != 202:
                return decode_logits(resp.headers.get("Content-Type", ""), resp.content, resp.json)
            now = time.monotonic()
            if now >= deadline:
                raise logits_timeout(batch_id, self.wait_timeout)
            pause, interval = poll_pause(sent, now, interval, deadline)
            if pause > 0:
                time.sleep(pause)

    def evals(self) -> EvalList:
        """GET /v1/evals: every evaluation (an :class:`EvalList` of
        :class:`EvalSummary`, in the order of their first batch) and ``max_names``."""
        return EvalList.from_json(self._json("GET", "/v1/evals"))

    def eval_summary(self, name: str) -> EvalSummary:
        """GET /v1/evals/{name}: one evaluation's sample-weighted loss, top1 and
        top5 over all its batches (:class:`EvalSummary`).

        Raises:
            NotFound: code ``eval_not_found``: no eval batch with that name was
                accepted, or the evaluation was deleted.
            TypeError, ValueError: not a name the server would take.
        """
        return EvalSummary.from_json(self._json("GET", f"/v1/evals/{check_eval_name(name)}"))

    def delete_eval(self, name: str) -> EvalSummary:
        """DELETE /v1/evals/{name}: forgets a finished evaluation and frees its
        name, returning it as it ended (:class:`EvalSummary`).

        The server keeps at most ``eval.max_names`` evaluations: a job that
        runs one per epoch deletes each once it has read it, and a later
        batch of the same name starts a new evaluation from zero. Its metric
        series leave /metrics too. Not sent again on a lost connection: the
        second try would find it deleted.

        Raises:
            Conflict: code ``eval_busy``: batches of it that the server
                accepted have not finished (they still count towards it; the
                message says how many, ``retry_after`` is set): wait for them
                (:meth:`wait_batch`) and delete again.
            NotFound: code ``eval_not_found``: no such evaluation (never
                accepted, or already deleted).
            Unauthorized: the server has a token and this client lacks it.
            TypeError, ValueError: not a name the server would take.
        """
        return EvalSummary.from_json(self._json("DELETE", f"/v1/evals/{check_eval_name(name)}"))

    # ---- batch state -------------------------------------------------------------

    def batch(self, batch_id: int) -> BatchResult:
        """GET /v1/batches/{id}: the batch's state, loss, accuracy and timings."""
        return BatchResult.from_json(self._json("GET", f"/v1/batches/{int(batch_id)}"))

    def training_loss(self) -> Optional[float]:
        """The loss of the server's latest training step (``streamfeed_loss``
        of /metrics), or None before the first step. feed() shows it live."""
        for line in self.metrics().splitlines():
            if line.startswith("streamfeed_loss "):
                return float(line.split()[1])
        return None

    def wait_batch(self, batch_id: int, timeout: float = 60.0) -> BatchResult:
        """Polls a batch until it is done or failed and returns it.

        Raises:
            TimeoutError: it did not finish within timeout seconds.
        """
        deadline = time.monotonic() + timeout
        interval = 0.005
        while True:
            b = self.batch(batch_id)
            if b.finished:
                return b
            if time.monotonic() >= deadline:
                raise TimeoutError(f"batch {batch_id} still {b.state} after {timeout}s")
            time.sleep(interval)
            interval = min(interval * 2, 0.25)

    def transform(self, images: Any, labels: Any = None, *, layout: Optional[str] = None) -> np.ndarray:
        """Runs the server's augmentation only (POST /v1/transform).

        Args:
            images: uint8 ``[N,H,W,C]`` or ``[N,C,H,W]`` (numpy or torch).
            labels: optional; not needed to transform.

        Returns:
            float32 numpy array ``[N,C,H,W]``: the augmented batch exactly as a
            training step would see it.
        """
        body = encode_batch_parts(images, labels, layout)
        resp, _ = self._send("POST", "/v1/transform", data=body,
                             headers={"Content-Type": CONTENT_TYPE}, timeout=self.wait_timeout)
        return decode_tensors(resp.content)["images"]

    def feed(self, loader: Iterable[Any], connections: int = 4, wait_last: bool = True,
             **kw: Any) -> "FeedSummary":
        """Uploads every (images, labels) batch of loader over several connections.

        See :func:`streamfeed.feed.feed` for the arguments; returns a
        :class:`streamfeed.feed.FeedSummary`."""
        from .feed import feed
        return feed(self, loader, connections=connections, wait_last=wait_last, **kw)

    # ---- configuration, model, probes ------------------------------------------------

    def config(self) -> Dict[str, Any]:
        """GET /v1/config: ``{"config": {section: {key: value}}, "pending_restart": [...]}``."""
        return self._json("GET", "/v1/config")

    def patch_config(self, patch: Dict[str, Any]) -> Dict[str, Any]:
        """PATCH /v1/config with a JSON merge patch, e.g. ``{"optim": {"lr": 0.05}}``.

        Returns ``{"config", "applied", "pending_restart"}``: hot fields are
        applied at once, restart-only ones are listed as pending.

        Raises:
            BadRequest: code ``config_invalid``, with ``field`` naming the
                offending option; nothing was changed.
        """
        return self._json("PATCH", "/v1/config", data=json.dumps(patch),
                          headers={"Content-Type": "application/merge-patch+json"})

    def model(self) -> Dict[str, Any]:
        """GET /v1/model: preset, input shape [C,H,W], classes, params, layers, step."""
        return self._json("GET", "/v1/model")

    def health(self) -> Dict[str, Any]:
        """GET /healthz: ``{"status": "ok"}`` while the process serves HTTP."""
        return self._json("GET", "/healthz")

    def readiness(self) -> Dict[str, Any]:
        """GET /readyz: ``{"ready": bool, "reasons": [...]}`` (a 503 is an answer here, not an error)."""
        return self._json("GET", "/readyz", ok=(503,))

    def ready(self) -> bool:
        """True when the server is ready to accept batches (GET /readyz is 200)."""
        return bool(self.readiness().get("ready"))

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Polls /readyz until ready (connection errors count as not ready).

        Raises:
            TimeoutError: not ready within timeout seconds.
        """
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                r = self.readiness()
                if r.get("ready"):
                    return
                last = r
            except E.StreamfeedError as e:
                last = e
            time.sleep(0.05)
        raise TimeoutError(f"{self.url} not ready after {timeout}s: {last}")

    def metrics(self) -> str:
        """GET /metrics: the Prometheus text exposition."""
        resp, _ = self._send("GET", "/metrics")
        return resp.text
