"""When the Python client sends a batch again and when it must not, how it
reports a batch whose outcome it cannot know, and what feed() leaves behind
(threads, sessions, sockets) and how fast it stops.

Most of these use a stand-in server on a socket (StandIn): a script of what
to do with each POST (answer it, reset the connection halfway through the
body, read it whole and never answer), so that each case happens on purpose
and the test can count the POSTs that arrived."""
import json
import re
import socket
import struct
import threading
import time

import numpy as np
import pytest

from streamfeed import Backpressure, Client, OutcomeUnknown, RetryPolicy, TransportError, encode_batch
from test_client import metric, wait_until


def random_batch(rng, n=2, side=32):
    return rng.integers(0, 256, (n, side, side, 3), dtype=np.uint8), rng.integers(0, 10, n)


def _reply(conn, status=200, body=None, headers=""):
    body = json.dumps(body if body is not None else {
        "id": 1, "state": "done", "n": 2, "step": 1, "loss": 2.3, "accuracy": 0.5,
        "timings": {}, "error": None}).encode()
    reason = {200: "OK", 202: "Accepted", 503: "Service Unavailable"}.get(status, "X")
    conn.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n{headers}"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


def _reset(conn):
    """Closes with SO_LINGER 0: the peer sees ECONNRESET."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


class StandIn:
    """A one-thread HTTP/1.1 server that reads each request's head and hands
    the connection to script(n, conn, head, length), n counting requests from
    0. The script reads the body itself (read_body) or not. ``heads`` keeps
    every request head seen; a script that returns False closes the connection."""

    def __init__(self, script):
        self.script = script
        self.heads = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @staticmethod
    def read_body(conn, rest, length):
        body = rest
        while len(body) < length:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            body += chunk
        return body

    def _serve(self):
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn):
        try:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                m = re.search(rb"(?i)content-length: *(\d+)", head)
                n = len(self.heads)
                self.heads.append(head)
                keep = self.script(n, conn, head, int(m.group(1)) if m else 0, rest)
                if keep is False:
                    return
                data = b""
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def posts(self):
        return [h for h in self.heads if h.startswith(b"POST /v1/batches")]

    def close(self):
        self.closed.set()
        self.sock.close()


@pytest.fixture
def stand_in():
    made = []

    def make(script):
        s = StandIn(script)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


FAST = RetryPolicy(connect_retries=3, backoff_base=0.001, backoff_max=0.01)


# ---- a batch sent whole is never sent again --------------------------------------------------------


def test_a_read_timeout_after_the_whole_batch_was_sent_is_outcome_unknown_and_never_resent(stand_in, rng):
    """The server read the whole batch (it may have accepted it) and its reply
    is late: re-sending would train the batch twice."""
    def never_answer(n, conn, head, length, rest):
        StandIn.read_body(conn, rest, length)
        time.sleep(3)
        return False

    srv = stand_in(never_answer)
    c = Client(srv.url, timeout=0.3, wait_timeout=0.3, retry=FAST)
    with pytest.raises(OutcomeUnknown) as e:
        c.post_batch(*random_batch(rng))
    assert isinstance(e.value, TransportError) and e.value.sent and e.value.code == "outcome_unknown"
    assert "may have" in str(e.value)
    summary = c.feed([random_batch(rng)], connections=1, progress=False)
    assert len(srv.posts()) == 2, "feed() sent a batch again after the server had read it whole"
    assert summary.errors == {"outcome_unknown": 1} and summary.batches == 0, summary
    assert "outcome_unknown" in str(summary)


def test_a_reset_while_waiting_for_the_reply_is_outcome_unknown_and_never_resent(stand_in, rng):
    def reset_after_body(n, conn, head, length, rest):
        StandIn.read_body(conn, rest, length)
        if n == 0:
            _reset(conn)
            return False
        _reply(conn)

    srv = stand_in(reset_after_body)
    c = Client(srv.url, retry=FAST)
    summary = c.feed([random_batch(rng)], connections=1, progress=False)
    assert len(srv.posts()) == 1, "feed() sent a batch again after the server had read it whole"
    assert summary.errors == {"outcome_unknown": 1}, summary


# ---- a batch that did not reach the server is sent again ------------------------------------------------


def test_a_batch_whose_connection_broke_during_the_upload_is_sent_again(stand_in, rng):
    """The first connection is reset with most of the body unread (the
    client is still writing it): the server cannot have the batch, so feed()
    sends it again."""
    def reset_halfway(n, conn, head, length, rest):
        if n < 2:  # post_batch's, then feed()'s first try
            StandIn.read_body(conn, rest, length // 8)
            _reset(conn)
            return False
        StandIn.read_body(conn, rest, length)
        _reply(conn)

    srv = stand_in(reset_halfway)
    c = Client(srv.url, retry=FAST)
    big = random_batch(rng, n=64, side=256)  # 12 MB: far more than the socket buffers hold
    with pytest.raises(TransportError) as e:
        c.post_batch(*big)
    assert not isinstance(e.value, OutcomeUnknown) and not e.value.sent
    summary = c.feed([big], connections=1, progress=False)
    assert len(srv.posts()) == 3  # the post_batch, then the feed's first try and its resend
    assert summary.ok and summary.batches == 1 and summary.first_loss == 2.3, summary
    # A resend is not a back-pressure retry: summary.retries counts only those.
    assert summary.resends == 1 and summary.retries == 0, summary


def test_retry_0_sends_no_batch_again(stand_in, rng):
    """retry=0 is "never retry": feed() still sent a batch whose connection
    broke connect_retries (3) more times."""
    def always_reset(n, conn, head, length, rest):
        StandIn.read_body(conn, rest, length // 8)
        _reset(conn)
        return False

    srv = stand_in(always_reset)
    summary = Client(srv.url, retry=0).feed([random_batch(rng, n=64, side=256)], connections=1, progress=False)
    assert len(srv.posts()) == 1, f"retry=0 sent the batch {len(srv.posts())} times"
    assert summary.errors == {"transport_error": 1} and summary.resends == 0, summary


def test_a_refused_connection_is_a_transport_error_not_an_unknown_outcome(rng):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    c = Client(f"http://127.0.0.1:{port}", retry=FAST)
    with pytest.raises(TransportError) as e:
        c.post_batch(*random_batch(rng))
    assert type(e.value) is TransportError and e.value.code == "transport_error"


# ---- a suspended upload waits for the server's answer --------------------------------------------------


def _hold_slot(port, body):
    """Starts an upload of body and sends only half of it: the server holds a
    ring slot (FILLING) for it until the connection ends."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall((f"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/vnd.safetensors\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body[:len(body) // 2])
    return s


def full_ring_loader(s, rng, holders, probe):
    """100 small batches; after the first two, two partial uploads (kept in
    holders) hold both of the server's ring slots, so every later batch meets
    a full ring."""
    for i in range(100):
        if i == 2:
            holders.extend(_hold_slot(s.port, encode_batch(*random_batch(rng, 8))) for _ in range(2))
            wait_until(lambda: metric(probe.metrics(), "streamfeed_ring_slots", state="filling") == 2,
                       what="both ring slots to be held by the partial uploads")
        yield random_batch(rng, 4)


def test_an_upload_suspended_by_a_full_ring_gets_the_servers_503_after_more_than_10s(start_server, rng):
    """A full ring holds an upload unread for ring.full_timeout_ms, then
    answers 503 with Retry-After. The client sent the body under a 10 s cap
    whatever its timeout, so with the server waiting 11 s it gave up first
    with a TransportError instead of getting the 503 it can retry."""
    s = start_server("--ring.slots", "2", "--ring.full_timeout_ms", "11000", "--pipeline.mode", "sink",
                     "--model.max_batch", "1024", "--ring.slot_bytes", str(64 << 20),
                     "--http.upload_min_bytes_per_s", "0")
    small = encode_batch(*random_batch(rng, 8))
    holders = [_hold_slot(s.port, small) for _ in range(2)]
    try:
        c = s.client(timeout=15, retry=0)
        wait_until(lambda: metric(c.metrics(), "streamfeed_ring_slots", state="filling") == 2,
                   what="both ring slots to be held by the partial uploads")
        big = random_batch(rng, 1024)  # 3 MB: the client is still writing it when the server stops reading
        t0 = time.monotonic()
        with pytest.raises(Backpressure) as e:
            c.post_batch(*big)
        assert e.value.status == 503 and e.value.retry_after is not None, e.value
        assert time.monotonic() - t0 >= 10.5
    finally:
        for h in holders:
            h.close()


# ---- what a feed leaves behind ------------------------------------------------------------------------------


def _open_fds():
    import os
    return len(os.listdir("/proc/self/fd"))


def test_feed_closes_the_sessions_and_sockets_of_its_threads(start_server, rng):
    """Each worker thread makes a requests session (a keep-alive socket) that
    the client kept in its list after the thread was gone: every feed leaked
    connections x (session + socket)."""
    s = start_server("--pipeline.mode", "sink")
    c = s.client()
    batches = [random_batch(rng, 4)] * 12
    c.feed(batches, connections=4, progress=False)  # the first feed's imports and the like
    before = _open_fds()
    for _ in range(8):
        summary = c.feed(batches, connections=4, progress=False)
        assert summary.ok, summary
    assert c._sessions == [], f"{len(c._sessions)} sessions of ended feed threads are still held"
    assert _open_fds() <= before + 1, "every feed left sockets open"
    # The client stays usable from this thread and from a new feed.
    assert c.health()["status"] == "ok"
    assert c.feed(batches, connections=2, progress=False).ok


def test_feed_closes_its_sessions_when_it_stops_on_an_exception(start_server, rng):
    s = start_server("--pipeline.mode", "sink")
    c = s.client()

    def loader():
        for i in range(6):
            yield random_batch(rng, 4)
        raise RuntimeError("the loader broke")

    with pytest.raises(RuntimeError, match="the loader broke"):
        c.feed(loader(), connections=3, progress=False)
    assert c._sessions == []


# ---- stopping -------------------------------------------------------------------------------------------------


def test_ctrl_c_during_a_feed_against_a_full_ring_returns_at_once(start_server, rng):
    """Ctrl-C while every worker waits out a 429's Retry-After: the workers'
    waits ended only with their retries (here 3 x 5 s each, 20 x 5 s by
    default), and feed() joined them before the KeyboardInterrupt reached
    the caller."""
    import os
    import signal
    s = start_server("--ring.slots", "2", "--ring.full_policy", "reject", "--ring.retry_after_s", "5",
                     "--pipeline.mode", "sink")
    c = s.client(retry=RetryPolicy(max_retries=3, backoff_max=5.0))
    probe = s.client()
    holders = []

    def loader():
        return full_ring_loader(s, rng, holders, probe)

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    feeding = threading.Event()
    feeding.set()

    def ctrl_c():  # as Ctrl-C: to the process; never once the test has left feed()
        if feeding.is_set():
            os.kill(os.getpid(), signal.SIGINT)
    timer = threading.Timer(1.5, ctrl_c)
    try:
        timer.start()
        timer_started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            c.feed(loader(), connections=4, progress=False)
        stopped = time.monotonic()
        took = stopped - (timer_started + 1.5)
    finally:
        # A SIGINT that left the timer after feed() returned must land here,
        # not as a KeyboardInterrupt in whatever test this worker runs next.
        feeding.clear()
        timer.cancel()
        try:
            timer.join(5)
            time.sleep(0.01)  # the handler runs in this thread, at its next step
        except KeyboardInterrupt:
            pass
        signal.signal(signal.SIGINT, old)
        for h in holders:
            h.close()
    assert took < 1.0, f"the KeyboardInterrupt reached the caller {took:.1f}s after Ctrl-C"
    assert c._sessions == []


def test_feed_stops_with_feed_aborted_when_the_server_is_gone(start_server, rng):
    """The server dies mid-feed: every later batch failed with a transport
    error, and feed() drained the whole loader, returning a summary and no
    exception. It now stops after 2 x connections batches in a row without
    a reply, as streamfeed-load does."""
    import os
    import signal

    from streamfeed import FeedAborted

    s = start_server()
    start_server.servers.remove(s)  # killed here: not one to stop and check for a clean exit
    taken = []
    try:
        c = s.client(retry=RetryPolicy(backoff_base=0.001, backoff_max=0.01))

        def loader():
            for i in range(400):
                if i == 20:
                    os.kill(s.proc.pid, signal.SIGKILL)
                    s.proc.wait()
                taken.append(i)
                yield random_batch(rng, 8)

        with pytest.raises(FeedAborted) as e:
            c.feed(loader(), connections=4, progress=False)
    finally:
        s.stop()
        s.cleanup()
    summary = e.value.summary
    assert isinstance(e.value.error, TransportError) and "in a row" in str(e.value)
    assert 8 <= sum(summary.errors.values()) <= 8 + 2 * 4, summary  # 2 x connections, and those in flight
    assert set(summary.errors) <= {"transport_error", "outcome_unknown"}, summary
    assert len(taken) < 60, f"feed() took {len(taken)} batches from the loader of a dead server"


def test_a_loader_that_fails_still_gets_the_batches_it_gave_sent_and_the_summary(stand_in, rng):
    """The loader raises after 5 batches while the server answers slowly:
    feed() cancelled the batches handed to its pool but not yet started and
    raised the loader's exception with no word of what had been sent."""
    def slow(n, conn, head, length, rest):
        StandIn.read_body(conn, rest, length)
        time.sleep(0.3)
        _reply(conn)

    srv = stand_in(slow)

    def loader():
        for _ in range(5):
            yield random_batch(rng)
        raise RuntimeError("disk error at batch 5")

    with pytest.raises(RuntimeError, match="disk error") as e:
        Client(srv.url).feed(loader(), connections=2, progress=False)
    assert len(srv.posts()) == 5, f"{len(srv.posts())} of the 5 batches the loader gave were sent"
    summary = e.value.feed_summary
    assert summary.submitted == summary.batches == 5 and summary.errors == {}, summary
    assert summary.last_id is None  # no batch was the loader's last


def test_an_async_loader_that_fails_still_gets_the_batches_it_gave_sent_and_the_summary(stand_in, rng):
    import asyncio

    from streamfeed.aio import AsyncClient

    def slow(n, conn, head, length, rest):
        StandIn.read_body(conn, rest, length)
        time.sleep(0.2)
        _reply(conn)

    srv = stand_in(slow)

    async def loader():
        for _ in range(5):
            yield random_batch(rng)
        raise RuntimeError("disk error at batch 5")

    async def main():
        async with AsyncClient(srv.url) as c:
            await c.feed(loader(), connections=2)

    with pytest.raises(RuntimeError, match="disk error") as e:
        asyncio.run(main())
    assert len(srv.posts()) == 5, f"{len(srv.posts())} of the 5 batches the loader gave were sent"
    assert e.value.feed_summary.batches == 5, e.value.feed_summary
