"""streamfeed.aio.AsyncClient.feed against the real server: it takes the
loader items the thread-pool feed() takes."""
import asyncio
import io

import numpy as np
from PIL import Image

from streamfeed.aio import AsyncClient
from streamfeed.jpeg import jpeg_batches


def jpeg_bytes(rng, h=32, w=32):
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def test_the_async_feed_takes_jpeg_batches_as_the_thread_feed_does(module_server, rng):
    samples = [(jpeg_bytes(rng), int(k)) for k in rng.integers(0, 10, 12)]
    threaded = module_server.client().feed(list(jpeg_batches(samples, 4)), connections=2, progress=False)
    assert threaded.ok and threaded.batches == 3 and threaded.samples == 12, threaded

    async def main():
        async with AsyncClient(module_server.url) as c:
            return await c.feed(jpeg_batches(samples, 4), connections=2)

    summary = asyncio.run(main())
    assert summary.ok and summary.batches == 3 and summary.samples == 12, summary
    assert summary.bytes == threaded.bytes and summary.last_loss is not None
