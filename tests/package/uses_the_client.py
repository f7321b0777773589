"""A user's program as mypy --strict sees it: the client's types are the
ones it promises (py.typed), post_batch(wait=True) is a BatchResult and the
plain post_batch a BatchAccepted. Type-checked, never run."""
from __future__ import annotations

import numpy as np

from streamfeed import BatchAccepted, BatchResult, Client
from streamfeed.aio import AsyncClient

c = Client("http://localhost:8080")
images = np.zeros((2, 32, 32, 3), np.uint8)
labels = np.zeros(2, np.int64)
done: BatchResult = c.post_batch(images, labels, wait=True)
loss: float | None = done.loss
queued: BatchAccepted = c.post_batch(images, labels)
evaluated: BatchResult = c.evaluate(images, labels)


async def main(a: AsyncClient) -> float | None:
    r: BatchResult = await a.post_batch(images, labels, wait=True)
    return r.loss
