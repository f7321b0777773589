"""The asyncio client, for loaders that already run an event loop.

>>> from streamfeed.aio import AsyncClient
>>> async with AsyncClient("http://localhost:8080") as c:       # doctest: +SKIP
...     r = await c.post_batch(images, labels, wait=True)
...     e = await c.evaluate(images, labels, eval="holdout")
...     logits = await c.logits(images, labels)
...     summary = await c.feed(async_batches(), connections=4)

It speaks the same protocol as :class:`streamfeed.Client` over httpx (``pip
install 'streamfeed[async]'``): the same typed replies and exceptions, the
same back-pressure retries (429/503 with Retry-After, capped back-off, sleeping
with ``asyncio.sleep`` so the loop keeps running), the same input checks
before anything is sent, and a :meth:`AsyncClient.feed` with the semantics of
:func:`streamfeed.feed` (first batch waited for, last batch waited for after
every other was accepted, deterministic rejections stop the feed) driven by
``connections`` concurrent tasks instead of threads.
"""
from __future__ import annotations

import asyncio
import ssl
from contextlib import nullcontext
import time
from typing import Any, AsyncIterable, Dict, Iterable, List, Literal, Mapping, Optional, Tuple, Union, overload

import numpy as np

try:
    import httpx
except ImportError as _e:  # pragma: no cover - depends on the installation
    raise ImportError("streamfeed.aio needs httpx: pip install 'streamfeed[async]' (or httpx)") from _e

from . import errors as E
from .client import (RetryPolicy, check_eval_name, check_url, decode_logits, eval_query, labels_for_eval,
                     logits_path, logits_timeout, parse_retry_after, poll_pause)
from .feed import UNDECODABLE_MESSAGE, FeedSummary, _attach_summary, _deterministic, _encode_item, \
    _leave_out_refused, _LeftOutCheck, _note_left_out, _note_skip, _note_undecodable, _ordinal
from .jpeg import EncodedBatch
from .results import BatchAccepted, BatchResult, EvalList, EvalSummary
from .wire import CONTENT_TYPE, Body, encode_batch_parts


#: httpx errors raised before the request was written whole (while connecting,
#: waiting for a pooled connection, or writing): the server cannot have acted
#: on it. Any other httpx.TransportError (a read timeout, a connection closed
#: while waiting for the reply) is an OutcomeUnknown.
_NOT_DELIVERED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.WriteError,
                  httpx.WriteTimeout, httpx.UnsupportedProtocol, httpx.ProxyError)


class AsyncClient:
    """An asyncio client of one streamfeed server (see :class:`streamfeed.Client`).

    Args:
        url, token, timeout, wait_timeout, retry: as for :class:`streamfeed.Client`.
        max_connections: the connection pool's size (feed's ``connections``
            tasks share it).
    """

    def __init__(self, url: str, token: Optional[str] = None, timeout: float = 60.0,
                 wait_timeout: float = 120.0, retry: Union[RetryPolicy, int, None] = None,
                 max_connections: int = 16, verify: Union[bool, str] = True):
        self.url = check_url(url)
        self.max_connections = int(max_connections)
        self.timeout = float(timeout)
        self.wait_timeout = max(float(wait_timeout), self.timeout)
        self.retry = RetryPolicy() if retry is None else RetryPolicy(max_retries=retry) if isinstance(retry, int) else retry
        headers = {"User-Agent": "streamfeed-python-async/0.1"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # verify: as Client's (a CA bundle path, True for the system's, False to skip)
        tls: Union[bool, ssl.SSLContext] = ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers, verify=tls,
                                       limits=httpx.Limits(max_connections=max_connections),
                                       timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient({self.url!r})"

    def _error(self, resp: httpx.Response, method: str, attempts: int) -> E.APIError:
        try:
            body: Any = resp.json()
        except ValueError:
            body = resp.text
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict) and "code" in err:
            code, message, field = str(err["code"]), str(err.get("message", "")), err.get("field")
        else:
            code, message, field = f"http_{resp.status_code}", (resp.text or resp.reason_phrase)[:500], None
        cls = E.error_class(resp.status_code, "Retry-After" in resp.headers)
        return cls(resp.status_code, code, message, field=field, request_id=resp.headers.get("X-Request-Id"),
                   retry_after=parse_retry_after(resp.headers.get("Retry-After")), body=body,
                   method=method, url=str(resp.request.url), attempts=attempts)

    async def _send(self, method: str, path: str, *, params: Optional[Dict[str, str]] = None,
                    content: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None,
                    timeout: Optional[float] = None) -> Tuple[httpx.Response, int]:
        retries = 0
        t = self.timeout if timeout is None else timeout
        while True:
            try:
                resp = await self._http.request(method, path, params=params, content=content, headers=headers,
                                                timeout=httpx.Timeout(t, connect=min(t, 10.0)))
            except httpx.TransportError as e:
                if method == "GET" and retries < min(self.retry.connect_retries, self.retry.max_retries):
                    await asyncio.sleep(self.retry.delay(retries, None))
                    retries += 1
                    continue
                if isinstance(e, _NOT_DELIVERED):
                    raise E.TransportError(f"{method} {self.url}{path}: {e}", e, retries=retries) from e
                raise E.OutcomeUnknown(f"{method} {self.url}{path}: no reply after the request was sent, so the "
                                       f"server may have acted on it: {e}", e, retries=retries) from e
            if resp.status_code < 400:
                return resp, retries
            if (resp.status_code in (429, 503) and "Retry-After" in resp.headers
                    and retries < self.retry.max_retries):
                await asyncio.sleep(self.retry.delay(retries, parse_retry_after(resp.headers.get("Retry-After"))))
                retries += 1
                continue
            raise self._error(resp, method, retries + 1)

    async def _json(self, method: str, path: str, **kw: Any) -> Dict[str, Any]:
        resp, _ = await self._send(method, path, **kw)
        out: Dict[str, Any] = resp.json()
        return out

    # ---- batches -----------------------------------------------------------------

    async def post_body(self, body: Union[bytes, Body], wait: bool = False, *,
                        query: Optional[Mapping[str, str]] = None
                        ) -> Tuple[Union[BatchAccepted, BatchResult], int]:
        """POSTs an encoded safetensors body; returns (reply, retries) as Client.post_body."""
        # httpx takes one bytes body: joined once here (its async transport
        # copies into its write buffer anyway).
        data = body.tobytes() if isinstance(body, Body) else body
        params = dict(query or {})
        if wait:
            params["wait"] = "1"
        resp, retries = await self._send("POST", "/v1/batches", params=params or None,
                                         content=data, headers={"Content-Type": CONTENT_TYPE},
                                         timeout=self.wait_timeout if wait else None)
        reply = resp.json()
        if not wait:
            return BatchAccepted.from_json(reply), retries
        result = BatchResult.from_json(reply)
        if not result.finished:
            result = await self.wait_batch(result.id, timeout=self.wait_timeout)
        if result.state == "failed":
            raise E.BatchFailed(result.raw, retries)
        return result, retries

    @overload
    async def post_batch(self, images: Any, labels: Any, wait: Literal[False] = ..., *,
                   layout: Optional[str] = ...) -> BatchAccepted: ...

    @overload
    async def post_batch(self, images: Any, labels: Any, wait: Literal[True], *,
                   layout: Optional[str] = ...) -> BatchResult: ...

    @overload
    async def post_batch(self, images: Any, labels: Any, wait: bool, *,
                   layout: Optional[str] = ...) -> Union[BatchAccepted, BatchResult]: ...

    async def post_batch(self, images: Any, labels: Any, wait: bool = False, *,
                         layout: Optional[str] = None) -> Union[BatchAccepted, BatchResult]:
        """Submits one batch (see Client.post_batch); inputs are checked before sending."""
        if labels is None:
            raise ValueError("labels are required to train")
        return (await self.post_body(encode_batch_parts(images, labels, layout), wait))[0]

    # ---- evaluation ----------------------------------------------------------------

    @overload
    async def evaluate(self, images: Any, labels: Any, *, eval: Optional[str] = ..., wait: Literal[True] = ...,
                 layout: Optional[str] = ...) -> BatchResult: ...

    @overload
    async def evaluate(self, images: Any, labels: Any, *, eval: Optional[str] = ..., wait: Literal[False],
                 layout: Optional[str] = ...) -> BatchAccepted: ...

    @overload
    async def evaluate(self, images: Any, labels: Any, *, eval: Optional[str] = ..., wait: bool,
                 layout: Optional[str] = ...) -> Union[BatchAccepted, BatchResult]: ...

    async def evaluate(self, images: Any, labels: Any, *, eval: Optional[str] = None, wait: bool = True,
                       layout: Optional[str] = None) -> Union[BatchAccepted, BatchResult]:
        """Submits one evaluation batch (POST /v1/batches?mode=eval); see Client.evaluate.

        Returns the finished :class:`BatchResult` (``loss``, ``top1``,
        ``top5``) with wait (the default), else a :class:`BatchAccepted`."""
        body = encode_batch_parts(images, labels_for_eval(labels), layout)
        return (await self.post_body(body, wait, query=eval_query(eval)))[0]

    async def logits(self, images: Any, labels: Any, *, eval: Optional[str] = None,
                     layout: Optional[str] = None) -> np.ndarray:
        """The model's logits for an eval batch (``return=logits``); see Client.logits.

        A 202 (the server's wait ran out first) is followed to the kept logits
        (its ``Location``) until wait_timeout has passed since the POST.

        Raises:
            Gone, NotFound, PayloadTooLarge, BatchFailed, TimeoutError: as Client.logits.
        """
        body = encode_batch_parts(images, labels_for_eval(labels), layout).tobytes()
        deadline = time.monotonic() + self.wait_timeout
        resp, _ = await self._send("POST", "/v1/batches", params=eval_query(eval, logits=True), content=body,
                                   headers={"Content-Type": CONTENT_TYPE}, timeout=self.wait_timeout)
        if resp.status_code == 202:
            batch_id = int(resp.json()["id"])
            return await self._kept_logits(batch_id, logits_path(batch_id, resp.headers.get("Location")),
                                           deadline)
        return decode_logits(resp.headers.get("Content-Type", ""), resp.content, resp.json)

    async def batch_logits(self, batch_id: int, wait: bool = True) -> Optional[np.ndarray]:
        """GET /v1/batches/{id}/logits: the logits an eval batch kept; see
        Client.batch_logits (None without wait while the batch has not run)."""
        path = logits_path(batch_id)
        if wait:
            return await self._kept_logits(int(batch_id), path, time.monotonic() + self.wait_timeout)
        resp = await self._get_logits(int(batch_id), path, wait=False)
        if resp.status_code == 202:
            return None
        return decode_logits(resp.headers.get("Content-Type", ""), resp.content, resp.json)

    async def _get_logits(self, batch_id: int, path: str, wait: bool) -> httpx.Response:
        try:
            resp, _ = await self._send("GET", path, params={"wait": "1"} if wait else None,
                                       timeout=self.wait_timeout if wait else None)
        except E.Conflict as e:
            if e.code != "batch_failed":
                raise
            try:
                failed = await self.batch(batch_id)
            except E.NotFound:
                raise e from None
            raise E.BatchFailed(failed.raw) from e
        return resp

    async def _kept_logits(self, batch_id: int, path: str, deadline: float) -> np.ndarray:
        """GET path?wait=1 until the logits come, pausing after a quick 202 (as Client's)."""
        interval = 0.005
        while True:
            sent = time.monotonic()
            resp = await self._get_logits(batch_id, path, wait=True)
            if resp.status_code != 202:
                return decode_logits(resp.headers.get("Content-Type", ""), resp.content, resp.json)
            now = time.monotonic()
            if now >= deadline:
                raise logits_timeout(batch_id, self.wait_timeout)
            pause, interval = poll_pause(sent, now, interval, deadline)
            if pause > 0:
                await asyncio.sleep(pause)

    async def evals(self) -> EvalList:
        """GET /v1/evals: every evaluation and ``max_names`` (see Client.evals)."""
        return EvalList.from_json(await self._json("GET", "/v1/evals"))

    async def eval_summary(self, name: str) -> EvalSummary:
        """GET /v1/evals/{name}: one evaluation's aggregates (see Client.eval_summary)."""
        return EvalSummary.from_json(await self._json("GET", f"/v1/evals/{check_eval_name(name)}"))

    async def delete_eval(self, name: str) -> EvalSummary:
        """DELETE /v1/evals/{name}: forgets a finished evaluation and frees its
        name, returning it as it ended (see Client.delete_eval: Conflict
        ``eval_busy`` while batches of it have not finished, NotFound
        ``eval_not_found``)."""
        return EvalSummary.from_json(await self._json("DELETE", f"/v1/evals/{check_eval_name(name)}"))

    # ---- batch state -------------------------------------------------------------

    async def batch(self, batch_id: int) -> BatchResult:
        return BatchResult.from_json(await self._json("GET", f"/v1/batches/{int(batch_id)}"))

    async def wait_batch(self, batch_id: int, timeout: float = 60.0) -> BatchResult:
        deadline = time.monotonic() + timeout
        interval = 0.005
        while True:
            b = await self.batch(batch_id)
            if b.finished:
                return b
            if time.monotonic() >= deadline:
                raise TimeoutError(f"batch {batch_id} still {b.state} after {timeout}s")
            await asyncio.sleep(interval)
            interval = min(interval * 2, 0.25)

    async def model(self) -> Dict[str, Any]:
        return await self._json("GET", "/v1/model")

    async def health(self) -> Dict[str, Any]:
        return await self._json("GET", "/healthz")

    # ---- feed -------------------------------------------------------------------------

    async def feed(self, loader: Union[AsyncIterable[Any], Iterable[Any]], connections: int = 4,
                   wait_last: bool = True, *, on_error: str = "stop",
                   keys: Optional[Tuple[str, str]] = None, layout: Optional[str] = None,
                   skip_bad_files: bool = True) -> FeedSummary:
        """Uploads every batch of an async (or plain) iterable; see :func:`streamfeed.feed`.

        Items are those :func:`streamfeed.feed` takes: ``(images, labels)``,
        dicts, or :class:`streamfeed.jpeg.EncodedBatch` (``jpeg_batches()``);
        a JPEG file the server refuses by name is left out of its batch as
        there (``skip_bad_files``).
        Cancelling the task that awaits it cancels the uploads in flight at
        once.

        Raises:
            TypeError, ValueError: an unusable batch, before it is sent; more
                connections than the client's max_connections.
            FeedAborted: a deterministic rejection (on_error="stop"), or 2 x
                connections batches in a row without a reply.
        """
        if connections < 1:
            raise ValueError("connections must be at least 1")
        if connections > self.max_connections:
            # The tasks beyond the pool would wait for a pooled connection
            # and fail with httpx's PoolTimeout, counted as transport errors.
            raise ValueError(f"connections ({connections}) exceeds this client's pool "
                             f"(max_connections={self.max_connections}); create the AsyncClient with "
                             f"max_connections={connections} or more")
        if on_error not in ("stop", "count"):
            raise ValueError(f"on_error must be 'stop' or 'count', got {on_error!r}")
        return await _AsyncFeed(self, connections, on_error, keys, layout, skip_bad_files).run(loader, wait_last)



class _AsyncFeed:
    """One call of :meth:`AsyncClient.feed`: the state its worker tasks share
    (one event loop: no lock) and the steps of the feed as methods."""

    def __init__(self, client: AsyncClient, connections: int, on_error: str, keys: Optional[Tuple[str, str]],
                 layout: Optional[str], skip_bad_files: bool) -> None:
        self.client = client
        self.connections = connections
        self.on_error = on_error
        self.keys = keys
        self.layout = layout
        self.skip_bad_files = skip_bad_files
        self.summary = FeedSummary()
        self.queue: "asyncio.Queue[Optional[Tuple[int, Any, bool]]]" = asyncio.Queue(maxsize=connections)
        self.fatal: List[BaseException] = []
        self.stop = asyncio.Event()
        self.no_reply = 0  # batches in a row without a reply: 2 x connections stop the feed, as feed()'s
        # JPEG batches accepted with a 202: their results name the files the
        # server could not decode and left out, as in feed().
        self.left_out = _LeftOutCheck(lag=4 * connections) if skip_bad_files else None
        # An exception of the loader itself ends the feed like its end, so
        # that the batches it gave are still sent; it is raised after them.
        self.loader_error: List[Exception] = []

    async def check_left_out(self, final: bool) -> None:
        if self.left_out is None:
            return
        client, summary = self.client, self.summary
        for index, bid, n, names, positions in self.left_out.due(final):
            try:
                res = await (client.wait_batch(bid, timeout=client.timeout) if final else client.batch(bid))
            except (E.StreamfeedError, TimeoutError):
                continue  # evicted from the server's job table, or the server is gone
            if res.done:
                _note_undecodable(summary, index, res, names, positions)
            elif res.state == "failed" and res.error_code == "jpeg_undecodable":
                summary.errors["jpeg_undecodable"] = summary.errors.get("jpeg_undecodable", 0) + 1
                for i in range(n):
                    _note_skip(summary, index, positions[i] if positions is not None else i,
                               names[i] if names is not None else None, "jpeg_undecodable",
                               res.error_message or UNDECODABLE_MESSAGE)

    def give_up(self, message: str, index: int, e: E.StreamfeedError) -> None:
        """Stops the feed with FeedAborted (the first reason only)."""
        if not self.fatal:
            self.fatal.append(E.FeedAborted(message, self.summary, batch_index=index, error=e))
        self.stop.set()

    async def send(self, index: int, item: Any, wait: bool, body: Any,
                   n: int) -> Optional[Tuple[Any, Any, int, int, Any]]:
        """Posts one batch (item, encoded as body of n samples), leaving out
        the files the server refuses by name (skip_bad_files). (reply,
        retries, samples, body bytes, the item as sent), or None when the
        batch failed (counted, and the feed stopped where on_error and the
        failure say so)."""
        summary = self.summary
        while True:
            try:
                reply, retries = await self.client.post_body(body, wait)
                return reply, retries, n, len(body), item
            except E.TransportError as e:
                summary.errors[e.code] = summary.errors.get(e.code, 0) + 1
                summary.retries += e.retries
                self.no_reply += 1
                if self.no_reply >= 2 * self.connections:
                    self.give_up(f"{self.no_reply} batches in a row got no reply from {self.client.url} (the last, "
                                 f"index {index}: {e}); is the server up?", index, e)
                return None
            except E.APIError as e:
                self.no_reply = 0
                file_refused, smaller = _leave_out_refused(summary, index, item, e, nullcontext()) \
                    if self.skip_bad_files else (False, None)
                if smaller is not None:
                    item = smaller
                    body, n = item.body, item.n
                    continue
                summary.errors[e.code] = summary.errors.get(e.code, 0) + 1
                summary.retries += e.attempts - 1
                # A batch whose every file was refused by name says
                # nothing of the loader's other batches.
                if self.on_error == "stop" and _deterministic(e) and not file_refused:
                    self.give_up(f"the {_ordinal(index + 1)} batch of the loader (index {index}) was rejected: {e}",
                                 index, e)
                return None
            except E.BatchFailed as e:
                self.no_reply = 0
                summary.errors[e.code] = summary.errors.get(e.code, 0) + 1
                summary.retries += e.retries
                if e.code == "jpeg_undecodable" and isinstance(item, EncodedBatch) and self.skip_bad_files:
                    for i in range(item.n):
                        _note_skip(summary, index, item.position(i), item.name(i), e.code, str(e))
                return None

    async def one(self, index: int, item: Any, wait: bool, is_last: bool) -> None:
        summary = self.summary
        _note_left_out(summary, index, item)
        body, n = _encode_item(item, self.keys, self.layout)
        summary.submitted += 1
        sent = await self.send(index, item, wait, body, n)
        if sent is None:
            return
        reply, retries, n, nbytes, item = sent
        self.no_reply = 0
        summary.batches += 1
        summary.samples += n
        summary.bytes += nbytes
        summary.retries += retries
        loss = reply.loss if isinstance(reply, BatchResult) else None
        if index == 0:
            summary.first_id, summary.first_loss = reply.id, loss
        if is_last:
            summary.last_id = reply.id
            if wait:
                summary.last_loss = loss
        if loss is not None:
            summary.latest_loss = loss
        if isinstance(item, EncodedBatch):
            if isinstance(reply, BatchResult):
                _note_undecodable(summary, index, reply, item.names, item.positions)
            elif self.left_out is not None:
                self.left_out.add(index, reply.id, item)
                await self.check_left_out(False)

    async def worker(self) -> None:
        while True:
            job = await self.queue.get()
            if job is None:
                return
            if not self.stop.is_set():
                try:
                    await self.one(job[0], job[1], False, job[2])
                except Exception as e:  # a usage error: stop and re-raise in the caller
                    self.fatal.append(e)
                    self.stop.set()

    async def run(self, loader: Union[AsyncIterable[Any], Iterable[Any]], wait_last: bool) -> FeedSummary:
        summary, stop = self.summary, self.stop
        t0 = time.monotonic()

        async def items() -> Any:
            if hasattr(loader, "__aiter__"):
                async for x in loader:
                    yield x
            else:
                for x in loader:
                    yield x

        it = items().__aiter__()
        _end = object()

        async def next_item() -> Any:
            try:
                return await it.__anext__()
            except StopAsyncIteration:
                return _end
            except Exception as e:
                self.loader_error.append(e)
                return _end

        cur = await next_item()
        if cur is _end:
            summary.seconds = time.monotonic() - t0
            if self.loader_error:
                raise _attach_summary(self.loader_error[0], summary)
            return summary
        nxt = await next_item()
        # The first batch alone, waited for: its loss is the model's as the feed found it.
        await self.one(0, cur, True, nxt is _end and not self.loader_error)
        tasks = [asyncio.ensure_future(self.worker()) for _ in range(self.connections)]
        index = 1
        last: Optional[Tuple[int, Any]] = None
        try:
            while nxt is not _end and not stop.is_set():
                cur, nxt = nxt, await next_item()
                is_last = nxt is _end and not self.loader_error
                if is_last and wait_last:
                    last = (index, cur)
                    break
                await self.queue.put((index, cur, is_last))
                index += 1
            for _ in tasks:
                await self.queue.put(None)
            await asyncio.gather(*tasks)
        except BaseException:
            # Cancelled: the workers are cancelled, not drained (they were
            # left to upload every queued batch, back-pressure waits
            # included, before the cancellation took effect).
            stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        if last is not None and not stop.is_set():
            # After every other batch was accepted: the last one trained is this one.
            await self.one(last[0], last[1], True, True)
        if not stop.is_set():
            await self.check_left_out(True)
        summary.seconds = time.monotonic() - t0
        if self.loader_error:
            raise _attach_summary(self.loader_error[0], summary)
        if self.fatal:
            raise self.fatal[0]
        return summary
