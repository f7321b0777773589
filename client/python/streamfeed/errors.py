"""Exceptions raised by the streamfeed client.

Every error reply of the server has the body
``{"error": {"code": "...", "message": "...", "field": "..."}}``; the client
turns it into an :class:`APIError` subclass chosen by HTTP status, carrying the
server's stable ``code`` (e.g. ``shape_mismatch``, ``ring_full``), its
``message``, the ``status``, the offending ``field`` when there is one, the
``request_id`` (the server's ``X-Request-Id``) and ``retry_after`` (seconds)
when the server sent ``Retry-After``.

Hierarchy::

    StreamfeedError
    ├── TransportError            no HTTP reply, and the request did not reach the server whole
    │   │                         (connection refused, connect timeout, DNS, broken before the
    │   │                         body was sent): a POST may be sent again
    │   └── OutcomeUnknown        no HTTP reply after the whole request was sent (read timeout,
    │                             reset while waiting): the server may have acted on it
    ├── BatchFailed               the batch was accepted but its step failed (state "failed")
    └── APIError                  an HTTP error reply
        ├── BadRequest            400
        ├── Unauthorized          401
        ├── Forbidden             403
        ├── NotFound              404
        ├── MethodNotAllowed      405
        ├── Conflict              409
        ├── Gone                  410
        ├── PayloadTooLarge       413
        ├── UnsupportedMediaType  415
        ├── Unprocessable         422
        ├── Backpressure          429 / 503 with Retry-After (retried before it is raised)
        └── ServerError           other 5xx
"""
from __future__ import annotations

from typing import Any, Dict, Optional


class StreamfeedError(Exception):
    """Base class of every exception this package raises on purpose."""


class TransportError(StreamfeedError):
    """The request got no HTTP reply.

    A TransportError itself (code ``transport_error``) means the request
    certainly did not reach the server whole: the connection could not be made
    (refused, connect timeout, a name that does not resolve, a TLS handshake
    that failed) or broke before the body was sent to its end, so the server
    cannot have acted on it and sending it again is safe. Its subclass
    :class:`OutcomeUnknown` is the other case.

    Attributes:
        cause: the underlying ``requests`` (or ``httpx``) exception.
        sent: False here; True for :class:`OutcomeUnknown`.
        retries: back-pressure retries (429/503 + Retry-After) made before
            this attempt failed.
    """

    code = "transport_error"
    sent = False

    def __init__(self, message: str, cause: Optional[BaseException] = None, *, retries: int = 0):
        super().__init__(message)
        self.message = message
        self.cause = cause
        self.retries = retries

    def __reduce__(self) -> Any:
        return (_rebuild_transport_error, (type(self), self.message, self.retries))


def _rebuild_transport_error(cls: Any, message: str, retries: int) -> Any:
    return cls(message, None, retries=retries)


class OutcomeUnknown(TransportError):
    """The whole request was sent and no reply came (a read timeout, the
    connection reset or closed while waiting for the reply).

    The server may have acted on it: a batch may have been accepted and
    trained. It is never sent again automatically (that could train the batch
    twice); :func:`streamfeed.feed` counts it under ``outcome_unknown``. Raise
    the client's ``timeout`` (``wait_timeout`` for ``wait=True``) when replies
    are slow rather than lost.
    """

    code = "outcome_unknown"
    sent = True


class APIError(StreamfeedError):
    """An HTTP error reply from the server.

    Attributes:
        status: the HTTP status code.
        code: the server's snake_case error code (``"http_<status>"`` when the
            body was not the server's JSON error object).
        message: the server's human-readable message.
        field: the field to blame, when the server named one (PATCH /v1/config).
        request_id: the reply's ``X-Request-Id``.
        retry_after: seconds from ``Retry-After``, or None.
        body: the decoded JSON body, or the raw text when it was not JSON.
        attempts: how many times the request was sent (more than 1 after retries).
    """

    def __init__(self, status: int, code: str, message: str, *, field: Optional[str] = None,
                 request_id: Optional[str] = None, retry_after: Optional[float] = None,
                 body: Any = None, method: str = "", url: str = "", attempts: int = 1):
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.request_id = request_id
        self.retry_after = retry_after
        self.body = body
        self.method = method
        self.url = url
        self.attempts = attempts
        where = f" ({method} {url})" if method else ""
        extra = f" [field {field}]" if field else ""
        super().__init__(f"{status} {code}: {message}{extra}{where}")

    def __reduce__(self) -> Any:  # picklable across process pools
        return (_rebuild_api_error, (type(self), self.status, self.code, self.message, self.__dict__))


def _rebuild_api_error(cls: Any, status: int, code: str, message: str, state: Dict[str, Any]) -> Any:
    e = cls.__new__(cls)
    Exception.__init__(e, f"{status} {code}: {message}")
    e.__dict__.update(state)
    return e


class BadRequest(APIError):
    """400: a malformed request (bad JSON, bad safetensors header, bad parameter)."""


class Unauthorized(APIError):
    """401: a token is configured on the server and the request lacked it."""


class Forbidden(APIError):
    """403: the request is authenticated (or needs none) but may not do this:
    a checkpoint URL the server may not be sent to (``url_not_allowed``), or
    a config option only a server with a token lets a request change
    (``config_needs_token``)."""


class NotFound(APIError):
    """404: no such route, the batch id is unknown or was evicted, no such
    evaluation (``eval_not_found``: never accepted, or deleted), or a batch
    that kept no logits (``logits_not_kept``)."""


class MethodNotAllowed(APIError):
    """405: the path exists but not with this method."""


class Conflict(APIError):
    """409: the server's mode or the resource's state cannot do this (e.g.
    transform in sink mode, ``too_many_evals`` for one evaluation name more
    than ``eval.max_names``, ``eval_busy`` for deleting an evaluation whose
    accepted batches have not all finished: ``retry_after`` is set, and a
    delete once they have finished succeeds). Not retried by the client."""


class Gone(APIError):
    """410: the resource existed and has been let go (``logits_expired``: the
    kept logits of an eval batch outlived ``eval.logits_keep_s`` or were
    evicted by ``eval.logits_keep_max`` / ``eval.logits_keep_bytes``)."""


class PayloadTooLarge(APIError):
    """413: the body, the safetensors header or the batch exceeds a limit."""


class UnsupportedMediaType(APIError):
    """415: the Content-Type is not accepted by the endpoint."""


class Unprocessable(APIError):
    """422: a well-formed batch that cannot be used (shape vs model, labels out of range)."""


class Backpressure(APIError):
    """429 or 503 with ``Retry-After``: the ring is full or the server is
    overloaded. The client retries these (bounded, capped back-off) and raises
    this only once the retries are used up."""


class ServerError(APIError):
    """Any other 5xx reply."""


class BatchFailed(StreamfeedError):
    """A batch was accepted, but its step failed on the server.

    Attributes:
        batch: the server's batch object (GET /v1/batches/{id}).
        code, message: from ``batch["error"]``.
        retries: back-pressure retries (429/503 + Retry-After) before the
            batch was accepted.
    """

    def __init__(self, batch: Dict[str, Any], retries: int = 0):
        err = batch.get("error") or {}
        self.batch = batch
        self.retries = retries
        self.code = err.get("code") or "batch_failed"
        self.message = err.get("message") or "the batch failed"
        super().__init__(f"batch {batch.get('id')} failed: {self.code}: {self.message}")

    def __reduce__(self) -> Any:
        return (BatchFailed, (self.batch, self.retries))


_BY_STATUS = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: Gone,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: Unprocessable,
}


def error_class(status: int, retry_after_present: bool) -> "type[APIError]":
    """The APIError subclass for a reply status."""
    if status in (429, 503) and retry_after_present:
        return Backpressure
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status >= 500:
        return ServerError
    return APIError


class FeedAborted(StreamfeedError):
    """Client.feed stopped early: a batch was rejected for a reason every later
    batch would share (a 4xx other than back-pressure), more than
    ``max_errors`` batches failed, or the server stopped answering (a run of
    consecutive transport failures).

    Attributes:
        summary: the FeedSummary of what was done up to then.
        batch_index: the position in the loader of the rejected batch, or of
            the last batch of the run of transport failures (None when the
            feed stopped on max_errors).
        error: the APIError of that batch, or the last TransportError of the
            run (None likewise).
    """

    def __init__(self, message: str, summary: Any, *, batch_index: Optional[int] = None,
                 error: Optional[StreamfeedError] = None):
        super().__init__(message)
        self.summary = summary
        self.batch_index = batch_index
        self.error = error

    def __reduce__(self) -> Any:
        return (_rebuild_feed_aborted, (str(self), self.summary, self.batch_index, self.error))


def _rebuild_feed_aborted(message: str, summary: Any, batch_index: Optional[int],
                          error: Optional[StreamfeedError]) -> FeedAborted:
    return FeedAborted(message, summary, batch_index=batch_index, error=error)
