"""streamfeed.aio.AsyncClient.feed against the real server: it takes the
loader items the thread-pool feed() takes, and a cancelled feed stops its
uploads at once."""
import asyncio
import io
import time

import numpy as np
import pytest
from PIL import Image

from streamfeed import RetryPolicy
from streamfeed import errors as E
from streamfeed.aio import AsyncClient
from streamfeed.jpeg import jpeg_batches
from test_client import random_batch
from test_client_delivery import full_ring_loader


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


def test_cancelling_the_async_feed_cancels_its_uploads_at_once(start_server, rng):
    """Cancelled while its workers wait out 429s (Retry-After 5 s): the feed
    queued an end marker per worker and waited for them to upload every
    queued batch, back-pressure retries included, before the cancellation
    took effect."""
    s = start_server("--ring.slots", "2", "--ring.full_policy", "reject", "--ring.retry_after_s", "5",
                     "--pipeline.mode", "sink")
    probe = s.client()
    holders = []

    def loader():
        return full_ring_loader(s, rng, holders, probe)

    async def main():
        async with AsyncClient(s.url, retry=RetryPolicy(max_retries=3, backoff_max=5.0)) as c:
            task = asyncio.ensure_future(c.feed(loader(), connections=4))
            await asyncio.sleep(1.5)
            t0 = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return time.monotonic() - t0

    try:
        took = asyncio.run(main())
    finally:
        for h in holders:
            h.close()
    assert took < 0.5, f"the cancelled feed ended {took:.1f}s after cancel()"


def test_the_async_feed_stops_with_feed_aborted_when_no_server_answers(rng):
    import socket

    from streamfeed import FeedAborted, TransportError
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens on port now
    taken = []

    def loader():
        for i in range(400):
            taken.append(i)
            yield random_batch(rng, 4)

    async def main():
        async with AsyncClient(f"http://127.0.0.1:{port}") as c:
            await c.feed(loader(), connections=3)

    with pytest.raises(FeedAborted) as e:
        asyncio.run(main())
    assert isinstance(e.value.error, TransportError) and e.value.summary.errors["transport_error"] >= 6
    assert len(taken) < 20, f"the async feed took {len(taken)} batches from the loader of a dead server"


def test_async_feed_refuses_more_connections_than_its_client_pools():
    # The tasks beyond the pool would wait for a connection and fail with
    # httpx's PoolTimeout, counted as transport errors: refused before sending.
    async def main():
        async with AsyncClient("http://127.0.0.1:9", max_connections=2) as c:
            with pytest.raises(ValueError, match="max_connections=4"):
                await c.feed([], connections=4)

    asyncio.run(main())


def test_the_async_feed_leaves_out_a_file_the_server_refuses_by_name(module_server, rng):
    # a 12-bit JPEG: the server's header check refuses it by name
    bad = bytearray(jpeg_bytes(rng))
    bad[next(i for i in range(2, len(bad) - 1) if bad[i] == 0xFF and bad[i + 1] == 0xC0) + 4] = 12
    samples = [(jpeg_bytes(rng), k) for k in range(7)]
    samples.insert(2, (bytes(bad), 9))

    async def main(**kw):
        async with AsyncClient(module_server.url) as c:
            return await c.feed(jpeg_batches(samples, 4, shuffle=False), connections=2, **kw)

    summary = asyncio.run(main())
    assert summary.ok and summary.batches == 2 and summary.samples == 7, summary
    assert summary.skipped_files == {"jpeg_unsupported": 1}
    assert (summary.skipped[0].batch_index, summary.skipped[0].sample) == (0, 2)
    with pytest.raises(E.FeedAborted):
        asyncio.run(main(skip_bad_files=False))


def test_the_async_feed_names_the_files_the_server_could_not_decode(module_server, rng):
    """A file whose header passes but whose Huffman table the decoder
    refuses: the server leaves it out and trains its batch on the rest; the
    feed names it from the batch's result."""
    bad = bytearray(jpeg_bytes(rng))
    bad[bad.index(b"\xff\xc4") + 5] = 0xFF
    samples = [(jpeg_bytes(rng), k % 10) for k in range(11)]
    samples.insert(5, (bytes(bad), 9))

    async def main():
        async with AsyncClient(module_server.url) as c:
            return await c.feed(jpeg_batches(samples, 4, shuffle=False), connections=2)

    summary = asyncio.run(main())
    assert summary.ok and summary.batches == 3 and summary.samples == 12, summary
    assert summary.skipped_files == {"jpeg_undecodable": 1}, summary
    assert (summary.skipped[0].batch_index, summary.skipped[0].sample) == (1, 1)
