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
    ├── TransportError            no HTTP reply (connection refused, reset, timeout)
    ├── BatchFailed               the batch was accepted but its step failed (state "failed")
    └── APIError                  an HTTP error reply
        ├── BadRequest            400
        ├── Unauthorized          401
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
    """The request got no HTTP reply: connection refused or reset, or a timeout.

    ``cause`` is the underlying ``requests`` exception."""

    code = "transport_error"

    def __init__(self, message: str, cause: Optional[BaseException] = None):
        super().__init__(message)
        self.message = message
        self.cause = cause


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


class NotFound(APIError):
    """404: no such route, the batch id is unknown or was evicted, no such
    evaluation (``eval_not_found``), or a batch that kept no logits
    (``logits_not_kept``)."""


class MethodNotAllowed(APIError):
    """405: the path exists but not with this method."""


class Conflict(APIError):
    """409: the server's mode or the resource's state cannot do this (e.g.
    transform in sink mode, ``too_many_evals`` for one evaluation name more
    than ``eval.max_names``)."""


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
    """

    def __init__(self, batch: Dict[str, Any]):
        err = batch.get("error") or {}
        self.batch = batch
        self.code = err.get("code") or "batch_failed"
        self.message = err.get("message") or "the batch failed"
        super().__init__(f"batch {batch.get('id')} failed: {self.code}: {self.message}")

    def __reduce__(self) -> Any:
        return (BatchFailed, (self.batch,))


_BY_STATUS = {
    400: BadRequest,
    401: Unauthorized,
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
    batch would share (a 4xx other than back-pressure), or more than
    ``max_errors`` batches failed.

    Attributes:
        summary: the FeedSummary of what was done up to then.
        batch_index: the position in the loader of the rejected batch (None
            when the feed stopped on max_errors).
        error: the APIError of that batch (None likewise).
    """

    def __init__(self, message: str, summary: Any, *, batch_index: Optional[int] = None,
                 error: Optional[APIError] = None):
        super().__init__(message)
        self.summary = summary
        self.batch_index = batch_index
        self.error = error

    def __reduce__(self) -> Any:
        return (_rebuild_feed_aborted, (str(self), self.summary, self.batch_index, self.error))


def _rebuild_feed_aborted(message: str, summary: Any, batch_index: Optional[int],
                          error: Optional[APIError]) -> FeedAborted:
    return FeedAborted(message, summary, batch_index=batch_index, error=error)
