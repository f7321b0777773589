"""streamfeed — the Python client of a streamfeed training worker.

streamfeed trains a model on batches of raw uint8 images that remote loaders
POST over HTTP as safetensors bodies. This package is such a loader::

    from streamfeed import Client

    client = Client("http://gpu-box:8080", token=None)
    client.post_batch(images, labels)                 # 202: queued
    result = client.post_batch(images, labels, wait=True)   # a BatchResult
    print(result.loss, result.accuracy)

    client.evaluate(images, labels, eval="holdout")   # forward only: loss, top1, top5
    logits = client.logits(images, labels)            # float32 [N, classes]
    client.eval_summary("holdout")                    # sample-weighted over its batches

    summary = client.feed(dataloader, connections=4)  # drain a whole DataLoader
    print(summary)

Images are uint8 numpy arrays or torch tensors, NHWC or NCHW (guessed from the
shape); labels are class indices of any integer dtype. Loader items are
``(images, labels)`` pairs or dicts (``{"image", "label"}`` as Hugging Face
datasets yield them). :mod:`streamfeed.aio` is the asyncio client (httpx). Error replies raise
:class:`~streamfeed.errors.APIError` subclasses carrying the server's error
code; back-pressure (429/503 with Retry-After) is retried with a capped back-off.
"""
from .client import Client, RetryPolicy, check_url, parse_retry_after
from .errors import (APIError, Backpressure, BadRequest, BatchFailed, Conflict, FeedAborted, Forbidden, Gone,
                     MethodNotAllowed, NotFound, OutcomeUnknown, PayloadTooLarge, ServerError,
                     StreamfeedError, TransportError, Unauthorized, Unprocessable, UnsupportedMediaType)
from .feed import FeedSummary, feed
from .results import BatchAccepted, BatchResult, EvalList, EvalSummary
from .wire import Body, decode_tensors, detect_layout, encode_batch, encode_batch_parts

__version__ = "0.1.0"

__all__ = [
    "Client", "RetryPolicy", "FeedSummary", "feed", "encode_batch", "encode_batch_parts", "Body",
    "decode_tensors", "detect_layout", "check_url", "BatchAccepted", "BatchResult", "EvalList", "EvalSummary",
    "parse_retry_after", "StreamfeedError", "TransportError", "OutcomeUnknown", "APIError", "BadRequest", "Unauthorized",
    "Forbidden", "NotFound", "MethodNotAllowed", "Conflict", "Gone", "PayloadTooLarge", "UnsupportedMediaType",
    "Unprocessable", "Backpressure", "ServerError", "BatchFailed", "FeedAborted", "__version__",
]
