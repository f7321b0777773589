"""The HTTP layer under hostile or careless clients: slow uploads cannot hold
the ring, probes answer on the metrics port when every connection is taken,
framing that two parties could read differently is refused, Host and %00 are
checked, a query too large for libmicrohttpd's memory pool gets its JSON
error and leaves nothing behind, the bearer scheme is case-insensitive, and a
second server cannot bind a port in use."""
import socket
import subprocess
import threading
import time

import pytest
import requests

from sfharness import (BIN, SAFETENSORS, SINK, TINY, built_with_asan, free_port, random_batch, read_reply,
                       st_body, wait_until)


def raw(s, data, timeout=10):
    """Sends raw bytes on a new connection; returns (reply, closed_after):
    whether the server closed the connection after its reply."""
    sock = s.connect(timeout)
    sock.sendall(data)
    r = read_reply(sock)
    sock.settimeout(2)
    try:
        closed = sock.recv(1) == b""
    except (socket.timeout, ConnectionResetError):
        closed = False
    sock.close()
    return r, closed


def post_head(path="/v1/batches", extra="", host="Host: x\r\n", version="HTTP/1.1"):
    return (f"POST {path} {version}\r\n{host}Content-Type: {SAFETENSORS}\r\n{extra}\r\n").encode()


# ---- slow uploads --------------------------------------------------------------


def trickle(sock, body, start, stop, every=0.3):
    """Sends body[start:] one byte every `every` seconds until stop is set or
    the server closes the connection."""
    for i in range(start, len(body)):
        if stop.is_set():
            return
        try:
            sock.sendall(body[i:i + 1])
        except OSError:
            return
        time.sleep(every)


def test_slow_uploads_holding_every_slot_are_evicted_and_a_normal_loader_gets_in(start_server, rng):
    s = start_server(SINK, "--ring.slots", "2", "--ring.full_timeout_ms", "20000",
                     "--http.upload_min_bytes_per_s", "2000")
    body = st_body(*random_batch(rng, 4))
    stop = threading.Event()
    slow = [s.start_upload(body, 400) for _ in range(2)]
    threads = [threading.Thread(target=trickle, args=(k, body, 400, stop), daemon=True) for k in slow]
    for t in threads:
        t.start()
    wait_until(lambda: s.metric("streamfeed_ring_slots", state="filling") == 2, 10)
    t0 = time.monotonic()
    r = s.post_batch(body, timeout=30)
    stop.set()
    # Both trickles are evicted once the 5 s allowance is over; the loader,
    # waiting for a slot meanwhile, takes one of theirs.
    assert r.status_code == 202, r.text
    assert 4 < time.monotonic() - t0 < 15
    m = wait_until(lambda: (lambda m: m if m.get(("streamfeed_uploads_evicted_total",
                                                   frozenset({("reason", "upload_too_slow")}))) == 2 else None)(
        s.metrics()), 10, what="two evictions to be counted")
    assert m[("streamfeed_batches_rejected_total", frozenset({("reason", "upload_too_slow")}))] == 2
    assert m[("streamfeed_ring_slots", frozenset({("state", "filling")}))] == 0
    # The evicted connections were closed.
    for k in slow:
        k.settimeout(5)
        with pytest.raises((ConnectionResetError, BrokenPipeError, OSError)):
            for _ in range(50):
                k.sendall(b"x" * 1024)
                time.sleep(0.05)
    for t in threads:
        t.join(5)
    assert "upload_too_slow" in s.stderr()


def test_an_upload_past_its_deadline_is_evicted_even_when_it_keeps_a_good_rate(start_server, rng):
    s = start_server(SINK, "--ring.slots", "2", "--http.upload_deadline_s", "2",
                     "--http.upload_min_bytes_per_s", "0")
    body = st_body(*random_batch(rng, 64))  # 196 KB at 2 KB per 0.05 s: about 5 s, past the 2 s
    sock = s.start_upload(body, 400)
    wait_until(lambda: s.metric("streamfeed_ring_slots", state="filling") == 1, 10)
    for i in range(400, len(body), 2048):
        try:
            sock.sendall(body[i:i + 2048])
        except OSError:
            break
        time.sleep(0.05)
    wait_until(lambda: s.metric("streamfeed_uploads_evicted_total", reason="upload_deadline_exceeded") == 1, 10)
    assert s.metric("streamfeed_ring_slots", state="filling") == 0
    # The ring is whole again: the next upload is taken at once.
    assert s.post_batch(body).status_code == 202


def test_an_upload_that_moves_is_not_evicted(start_server, rng):
    s = start_server(SINK, "--http.upload_min_bytes_per_s", "2000", "--http.upload_deadline_s", "30")
    body = st_body(*random_batch(rng, 4))  # 12 KB over about 7 s: above 2000 B/s after the allowance
    sock = s.start_upload(body, 400)
    for i in range(400, len(body), 400):
        sock.sendall(body[i:i + 400])
        time.sleep(0.2)
    assert read_reply(sock).status_code == 202
    assert s.metric("streamfeed_uploads_evicted_total", reason="upload_too_slow") == 0


def test_an_upload_trickling_its_safetensors_header_without_a_slot_is_closed_at_the_header_deadline(
        start_server, rng):
    # It takes a ring slot only once its safetensors header is in; until then
    # only the body deadline from the end of its headers holds it.
    s = start_server(SINK, "--http.header_timeout_s", "2")
    body = st_body(*random_batch(rng, 4))
    sock = s.start_upload(body, 8, expect_continue=True)
    t0 = time.monotonic()
    i = 8
    while time.monotonic() - t0 < 10:
        try:
            sock.sendall(body[i:i + 1])
        except OSError:
            break
        i += 1
        time.sleep(0.3)
    took = time.monotonic() - t0
    assert 1.5 < took < 4.5, f"closed after {took:.1f} s"
    assert s.metric("streamfeed_http_errors_total", code="body_timeout") == 1
    assert s.metric("streamfeed_ring_slots", state="filling") == 0
    sock.close()


def test_an_upload_waiting_for_a_slot_longer_than_the_header_deadline_gets_one(start_server, rng):
    s = start_server(SINK, "--ring.slots", "2", "--http.header_timeout_s", "2", "--ring.full_timeout_ms", "10000",
                     "--http.upload_min_bytes_per_s", "0")
    body = st_body(*random_batch(rng, 4))
    holder, other = s.start_upload(body, 400), s.start_upload(body, 400)
    wait_until(lambda: s.metric("streamfeed_ring_slots", state="filling") == 2, 10)
    result = {}
    waiter = threading.Thread(target=lambda: result.update(r=s.post_batch(body, timeout=30)), daemon=True)
    waiter.start()
    wait_until(lambda: s.metric("streamfeed_uploads_waiting") == 1, 10)
    time.sleep(3.5)  # the wait under test: longer than http.header_timeout_s
    holder.sendall(body[400:])
    assert read_reply(holder).status_code == 202
    waiter.join(30)
    assert result["r"].status_code == 202, result["r"].text
    other.sendall(body[400:])
    assert read_reply(other).status_code == 202
    assert s.metric("streamfeed_http_errors_total", code="body_timeout") == 0
    holder.close()
    other.close()


def test_probes_answer_on_the_metrics_port_while_every_main_connection_is_taken(start_server):
    mport = free_port()
    s = start_server(SINK, "--http.max_connections", "4", "--http.metrics_port", mport)
    idle = [s.connect() for _ in range(4)]
    # Each of the four sent a request so that they are accepted, then idles.
    for k in idle:
        k.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_reply(k).status_code == 200
    # The main port has no room left: a fifth connection gets no answer.
    extra = s.connect(timeout=2)
    extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    extra.settimeout(2)
    try:
        got = extra.recv(100)
    except (socket.timeout, ConnectionResetError):
        got = b""
    assert not got.startswith(b"HTTP/1.1 200")
    probe = f"http://127.0.0.1:{mport}"
    assert requests.get(probe + "/healthz", timeout=5).json() == {"status": "ok"}
    assert requests.get(probe + "/readyz", timeout=5).json()["ready"] is True
    assert "streamfeed_build_info" in requests.get(probe + "/metrics", timeout=5).text
    # Only the probes live there.
    r = requests.get(probe + "/v1/config", timeout=5)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = requests.post(probe + "/v1/batches", data=b"x", headers={"Content-Type": SAFETENSORS}, timeout=5)
    assert r.status_code == 404
    for k in idle + [extra]:
        k.close()


def _from(addr, port, timeout=5):
    """A connection to 127.0.0.1:port whose source address is addr (another
    loopback address: a second client host, as the kubelet is to a pod)."""
    k = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    k.settimeout(timeout)
    k.bind((addr, 0))
    k.connect(("127.0.0.1", port))
    return k


def test_clients_holding_metrics_port_connections_from_one_address_leave_probes_from_another_answering(
        start_server):
    mport = free_port()
    start_server(SINK, "--http.metrics_port", mport)
    # Kept alive, a scraper asking every few seconds would hold its slot for
    # good: the metrics port closes each connection after its reply.
    asking = []
    for _ in range(40):
        k = _from("127.0.0.2", mport)
        k.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        r = read_reply(k)
        assert r.status_code == 200 and r.headers.get("Connection", "").lower() == "close", r.headers
        asking.append(k)
    t0 = time.monotonic()
    while not all(closed_now(k) for k in asking) and time.monotonic() - t0 < 3:
        time.sleep(0.1)
    assert all(closed_now(k) for k in asking), "the metrics port kept a connection open after its reply"
    # A client opening idle connections from one address gets a few of the
    # port's connections; probes from any other address still get theirs.
    idle = []
    for _ in range(300):
        try:
            idle.append(_from("127.0.0.2", mport, timeout=2))
        except OSError:
            break
    for _ in range(6):
        t = time.monotonic()
        r = requests.get(f"http://127.0.0.1:{mport}/healthz", timeout=3)
        assert r.status_code == 200 and (time.monotonic() - t) < 1.0
        time.sleep(0.5)
    for k in asking + idle:
        k.close()


def _trickle(conns, seconds):
    """Sends one byte (a space) a second on each connection; returns the
    indexes of those the server closed within `seconds`."""
    t0, closed = time.monotonic(), set()
    while len(closed) < len(conns) and time.monotonic() - t0 < seconds:
        time.sleep(1)
        for i, k in enumerate(conns):
            try:
                k.sendall(b" ")
            except OSError:
                closed.add(i)
    return closed


def test_connections_trickling_their_headers_are_closed_at_the_header_deadline(start_server):
    # Every main connection sends a request line and then one header byte a
    # second: the idle timeout never fires, the header deadline does.
    s = start_server(SINK, "--http.max_connections", "4", "--http.header_timeout_s", "2")
    slow = [s.connect() for _ in range(4)]
    for k in slow:
        k.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    t0 = time.monotonic()
    closed = _trickle(slow, 8)
    assert len(closed) == 4, f"{len(closed)} of 4 trickling connections were closed"
    assert time.monotonic() - t0 < 6
    assert requests.get(s.url + "/healthz", timeout=5).status_code == 200
    assert s.metric("streamfeed_http_errors_total", code="header_timeout") == 4
    for k in slow:
        k.close()


def closed_now(sock):
    """Whether the server has closed this connection (without blocking)."""
    try:
        return sock.recv(65536, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_a_flood_trickling_request_lines_is_cut_at_the_header_deadline_and_probes_keep_answering(
        start_server):
    # 250 connections, more than the main port takes, send "GET /" and then a
    # byte every half second, never completing the request line; ten more
    # send nothing. Each has http.header_timeout_s from its accept, and those
    # beyond http.max_connections wait in the listen backlog until the first
    # are cut: two rounds of 2 s, each up to a second late (the sweep's tick),
    # seen by a loop that takes about a second a round.
    mport = free_port()
    s = start_server(SINK, "--http.max_connections", "200", "--http.header_timeout_s", "2",
                     "--http.metrics_port", mport)
    t0 = time.monotonic()
    silent = [s.connect() for _ in range(10)]
    flood = [s.connect() for _ in range(250)]
    for k in flood:
        try:
            k.sendall(b"GET /")
        except OSError:
            pass  # beyond http.max_connections: closed at once
    open_ = set(range(len(flood)))
    probe_ms, main_ok_at = [], None
    while open_ and time.monotonic() - t0 < 12:
        for i in list(open_):
            if closed_now(flood[i]):
                open_.discard(i)
                continue
            try:
                flood[i].sendall(b"a")
            except OSError:
                open_.discard(i)
        t = time.monotonic()
        assert requests.get(f"http://127.0.0.1:{mport}/healthz", timeout=5).status_code == 200
        probe_ms.append((time.monotonic() - t) * 1e3)
        if main_ok_at is None:
            try:
                if requests.get(s.url + "/healthz", timeout=0.5).status_code == 200:
                    main_ok_at = time.monotonic() - t0
            except requests.exceptions.RequestException:
                pass
        time.sleep(0.5)
    elapsed = time.monotonic() - t0
    assert not open_, f"{len(open_)} trickling connections still open after {elapsed:.1f} s"
    assert elapsed < 9.5, f"the trickling connections took {elapsed:.1f} s to be closed"
    assert all(closed_now(k) for k in silent)
    assert max(probe_ms) < 1000, f"the metrics port took up to {max(probe_ms):.0f} ms"
    assert main_ok_at is not None and main_ok_at < 9.5, f"the main port answered at {main_ok_at}"
    assert s.get("/healthz").status_code == 200
    assert s.metric("streamfeed_http_errors_total", code="header_timeout") >= 200
    for k in flood + silent:
        k.close()


def test_a_kept_alive_connection_trickling_its_next_request_line_is_cut_at_the_header_deadline(
        start_server):
    s = start_server(SINK, "--http.header_timeout_s", "2")
    k = s.connect()
    k.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_reply(k).status_code == 200
    # Idle for longer than the header deadline: only the idle timeout holds an idle connection.
    time.sleep(2.5)
    k.sendall(b"GET /")
    t0 = time.monotonic()
    while not closed_now(k) and time.monotonic() - t0 < 8:
        try:
            k.sendall(b"a")
        except OSError:
            break
        time.sleep(0.5)
    # The deadline runs from the first byte, seen by the once-a-second sweep.
    assert 1.5 < time.monotonic() - t0 < 5.5, f"closed after {time.monotonic() - t0:.1f} s"
    assert s.metric("streamfeed_http_errors_total", code="header_timeout") == 1
    k.close()


def test_bodies_trickled_after_the_headers_are_closed_at_their_deadline(start_server, tmp_path):
    # The headers arrive whole, then a body byte a second: a JSON body, one a
    # 401 drains (refused from the headers; a token is set), and a checkpoint
    # PUT (streamed, held to http.upload_deadline_s: a service with a backend,
    # as one without refuses it from the head). The idle timeout never
    # fires; each request's deadline does, and a normal client still gets in.
    s = start_server(*TINY, "--http.max_connections", "4", "--http.header_timeout_s", "2",
                     "--http.upload_deadline_s", "3", "--http.token", "t0k")
    auth = "Authorization: Bearer t0k\r\n"
    heads = [f"PATCH /v1/config HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n",
             "POST /v1/checkpoint/save HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
             f"PUT /v1/checkpoint HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/vnd.safetensors\r\n"]
    slow = [s.connect() for _ in heads]
    for k, head in zip(slow, heads):
        k.sendall(f"{head}Content-Length: 50000\r\n\r\n{{".encode())  # under the tiny model's checkpoint size
    closed = _trickle(slow, 10)
    assert closed == {0, 1, 2}, f"closed: {closed}"
    assert requests.get(s.url + "/healthz", timeout=5).status_code == 200
    assert s.metric("streamfeed_http_errors_total", code="body_timeout") == 2
    assert s.metric("streamfeed_http_errors_total", code="upload_deadline_exceeded") == 1
    for k in slow:
        k.close()
    # A body that keeps within the deadline is served as ever.
    k = s.connect()
    first, rest = b'{"optim": ', b'{"lr": 0.25}}'
    k.sendall(f"PATCH /v1/config HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
              f"Content-Length: {len(first + rest)}\r\nConnection: close\r\n\r\n".encode() + first)
    time.sleep(1)
    k.sendall(rest)
    reply = b""
    while chunk := k.recv(65536):
        reply += chunk
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    k.close()


def test_metrics_port_equal_to_the_main_port_is_refused_at_start():
    r = subprocess.run([BIN, "--http.port", "18080", "--http.metrics_port", "18080"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "http.metrics_port must differ" in r.stderr


# ---- framing, Host, path, auth ---------------------------------------------------


def test_requests_libmicrohttpd_refuses_itself_are_counted_with_the_status_it_sent(start_server):
    # A malformed header line, a Content-Length with a sign or a bad chunk
    # size is answered by libmicrohttpd's own parser (an HTML page); such
    # refusals must still show in streamfeed_http_requests_total, the series
    # an operator watches for a client sending garbage.
    s = start_server(SINK)
    for req in (post_head(extra="Content-Length: +5\r\n") + b"hello",
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"):
        r, closed = raw(s, req)
        assert r.status_code == 400 and closed
    r, _ = raw(s, post_head(extra="Transfer-Encoding: chunked\r\n") + b"zz\r\n")
    assert r.status_code == 400
    assert s.metric("streamfeed_http_requests_total", route="unmatched", code="400") == 2
    # The chunked body's refusal came after the route had its head: counted
    # under the route with the status sent, not as a client that went away.
    assert s.metric("streamfeed_http_requests_total", route="batches", code="400") == 1
    assert s.metric("streamfeed_http_requests_total", route="batches", code="499") == 0


def test_two_different_content_lengths_get_400_and_the_connection_closes(start_server, rng):
    s = start_server(SINK)
    body = st_body(*random_batch(rng, 2))
    r, closed = raw(s, post_head(extra=f"Content-Length: {len(body)}\r\nContent-Length: {len(body) + 5}\r\n") + body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_content_length"
    assert closed
    assert s.metric("streamfeed_batches_received_total", status="accepted") == 0
    # The same value twice is one length, which RFC 9110 8.6 lets a recipient accept.
    r, _ = raw(s, post_head(extra=f"Content-Length: {len(body)}\r\nContent-Length: {len(body)}\r\n") + body)
    assert r.status_code == 202


def test_content_length_with_transfer_encoding_gets_400_and_the_connection_closes(start_server, rng):
    s = start_server(SINK)
    body = st_body(*random_batch(rng, 2))
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    r, closed = raw(s, post_head(extra=f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n") + chunked)
    assert r.status_code == 400 and r.json()["error"]["code"] == "content_length_with_transfer_encoding"
    assert closed
    assert s.metric("streamfeed_batches_received_total", status="accepted") == 0


def test_a_transfer_encoding_other_than_chunked_gets_501(start_server):
    s = start_server(SINK)
    r, closed = raw(s, post_head(extra="Transfer-Encoding: gzip\r\n") + b"xxxx")
    assert r.status_code == 501 and r.json()["error"]["code"] == "transfer_encoding_not_implemented"
    assert closed


def test_two_transfer_encodings_or_one_on_http_1_0_get_400_and_the_connection_closes(start_server, rng):
    # libmicrohttpd frames the body by the first Transfer-Encoding line; a
    # proxy in front may go by the last, or, on HTTP/1.0, by neither: the two
    # would split the stream into different requests.
    s = start_server(SINK)
    body = st_body(*random_batch(rng, 2))
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    for extra, version in (("Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n", "HTTP/1.1"),
                           ("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "HTTP/1.1"),
                           ("Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", "HTTP/1.1"),
                           ("Transfer-Encoding: chunked\r\n", "HTTP/1.0")):
        r, closed = raw(s, post_head(extra=extra, version=version) + chunked)
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_transfer_encoding", (extra, version, r.text)
        assert closed, (extra, version)
    assert s.metric("streamfeed_batches_received_total", status="accepted") == 0
    # Each refusal is counted as a refused batch, under its route.
    assert s.metric("streamfeed_batches_rejected_total", reason="bad_transfer_encoding") == 4
    assert s.metric("streamfeed_http_requests_total", route="batches", code="400") == 4
    # One chunked line on HTTP/1.1 is the framing that works.
    r, _ = raw(s, post_head(extra="Transfer-Encoding: chunked\r\n") + chunked)
    assert r.status_code == 202, r.text


def test_a_client_waiting_for_100_continue_gets_an_error_known_from_the_head_at_once(start_server, rng):
    # The client sends its body only after 100 Continue: a refusal the head
    # already decides (auth, route, method, Content-Type) comes instead of
    # it, and the body is never sent.
    s = start_server(SINK, "--http.token", "t0k")
    body = st_body(*random_batch(rng, 2))
    cases = (
        (f"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: {SAFETENSORS}\r\n", 401, "unauthorized"),
        (f"POST /v1/nowhere HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0k\r\n"
         f"Content-Type: {SAFETENSORS}\r\n", 404, "not_found"),
        ("POST /v1/batches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0k\r\n"
         "Content-Type: text/plain\r\n", 415, "unsupported_media_type"),
    )
    for head, status, code in cases:
        k = s.connect()
        k.sendall((head + f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n").encode())
        r = read_reply(k)
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), (head, r.status_code, r.text)
        k.close()
    # A request the head does not refuse still gets its 100 Continue and is served.
    k = s.start_upload(body, len(body), headers="Authorization: Bearer t0k\r\n", expect_continue=True)
    assert read_reply(k).status_code == 202
    k.close()


@pytest.mark.parametrize("query,code,field", [
    ("wait=2", "bad_query", "wait"),
    ("mode=eval&eval=a%20b", "bad_eval_name", "eval"),
    ("return=logits", "bad_query", "return"),
])
def test_a_batch_whose_query_is_refused_gets_the_error_in_place_of_100_continue(start_server, query, code, field):
    # The query is part of the head: a client waiting for 100 Continue must
    # not be told to send a body that is refused for its query, and a batch
    # posted without a body is refused for its query too, not for the body.
    s = start_server(SINK)
    k = s.connect()
    k.sendall(f"POST /v1/batches?{query} HTTP/1.1\r\nHost: x\r\nContent-Type: {SAFETENSORS}\r\n"
              f"Content-Length: 50000000\r\nExpect: 100-continue\r\n\r\n".encode())
    r = read_reply(k)
    assert (r.status_code, r.json()["error"]["code"], r.json()["error"].get("field")) == (400, code, field), r.text
    k.close()
    r, _ = raw(s, post_head(path=f"/v1/batches?{query}", extra="Content-Length: 0\r\n"))
    assert (r.status_code, r.json()["error"]["code"]) == (400, code), r.text
    assert s.metric("streamfeed_batches_rejected_total", reason=code) == 2
    assert s.metric("streamfeed_batches_rejected_total", reason="body_empty") == 0


def test_a_request_target_in_absolute_form_is_routed_by_its_path(start_server, rng):
    # RFC 9112 3.2.2: a server must accept "http://host/path" as the target.
    s = start_server(SINK)
    r, _ = raw(s, b"GET http://127.0.0.1/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text
    r, _ = raw(s, b"GET HTTPS://x HTTP/1.1\r\nHost: x\r\n\r\n")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    body = st_body(*random_batch(rng, 2))
    r, _ = raw(s, post_head(path="http://127.0.0.1/v1/batches", extra=f"Content-Length: {len(body)}\r\n") + body)
    assert r.status_code == 202, r.text


def test_http_1_1_without_host_gets_400_and_http_1_0_without_host_is_served(start_server):
    s = start_server(SINK)
    r, _ = raw(s, b"GET /healthz HTTP/1.1\r\n\r\n")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_host"
    r, _ = raw(s, b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_host"
    r, _ = raw(s, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert r.status_code == 200


def test_a_host_header_that_is_not_a_host_and_port_gets_400(start_server):
    # RFC 9112 3.2: a Host field with an invalid value is a 400, as
    # TROUBLESHOOTING.md says; a proxy and this server could read it apart.
    s = start_server(SINK)

    def status(host):
        k = s.connect()
        k.sendall(b"GET /healthz HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
        r = read_reply(k)
        k.close()
        return r.status_code, r.json().get("error", {}).get("code")

    for host in (b"a b", b"a/b", b"a\x01b", b"exa\xffmple", b"a@b", b"x:8o", b"[::1", b"x/../y:80"):
        assert status(host) == (400, "bad_host"), host
    for host in (b"x", b"", b"[::1]:80", b"example.com:8080", b"x:", b"127.0.0.1", b"a-b.c_d~e"):
        assert status(host) == (200, None), host


@pytest.mark.parametrize("target", ["/healthz%00", "/healthz%00/x", "/v1/batches/1%00", "/healthz?x=%00"])
def test_an_encoded_nul_in_the_target_gets_400(start_server, target):
    s = start_server(SINK)
    r, _ = raw(s, f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_path"


@pytest.mark.parametrize("target", ["/v1%2Fconfig", "/v1/batches/1%2flogits", "/v1/evals/a%2Fb"])
def test_an_encoded_slash_in_the_path_gets_400_not_another_route(start_server, target):
    s = start_server(SINK)
    r, _ = raw(s, f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_path", r.text
    # In a query value it is only a character.
    r, _ = raw(s, b"GET /healthz?x=a%2Fb HTTP/1.1\r\nHost: x\r\n\r\n")
    assert r.status_code == 200


@pytest.mark.parametrize("body,key", [
    (b'{"optim":{"lr":0.1},"optim":{"lr":0.2}}', "optim"),
    (b'{"optim":{"lr":0.1,"momentum":0.5,"lr":0.2}}', "lr"),
])
def test_a_json_body_with_a_key_twice_in_one_object_is_refused(start_server, body, key):
    # Which value would win is left open by JSON; a filter in front may read the other.
    s = start_server(SINK)
    before = s.config()
    r = s.request("PATCH", "/v1/config", data=body, headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert (e["code"], e["field"]) == ("json_duplicate_key", key), e
    assert s.config() == before
    # The same key in two different objects is no duplicate.
    r = s.request("PATCH", "/v1/config", data=b'{"optim":{"lr":0.2},"ring":{"full_policy":"block"}}',
                  headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path,key", [
    ("/v1/trace?steps=1&steps=5000", "steps"),
    ("/v1/batches/1/logits?wait=0&wait=1", "wait"),
    ("/healthz?a=1&b=2&a=3", "a"),
    ("/v1/batches/1/logits?wait", "wait"),
])
def test_a_query_parameter_given_twice_or_without_a_value_is_refused(start_server, path, key):
    # sf_req_arg reads the first; a client or a filter meaning the other would
    # be misread. A bare "?wait" read as absent would silently not wait.
    s = start_server(SINK)
    r = s.get(path)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["field"]) == ("bad_query", key), r.text
    r = s.get("/v1/trace?steps=2&other=1")
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("query", ["wait=abc", "wait=", "wait=2", "wait=1"])
def test_a_batch_read_with_a_wait_it_cannot_honour_gets_400_bad_query(start_server, rng, query):
    s = start_server(SINK)
    bid = s.post_arrays(*random_batch(rng, 2)).json()["id"]
    r = s.get(f"/v1/batches/{bid}?{query}")
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["field"]) == ("bad_query", "wait")
    assert s.get(f"/v1/batches/{bid}?wait=0").status_code == 200
    assert s.get(f"/v1/batches/{bid}").status_code == 200


@pytest.mark.parametrize("query,code,field", [
    ("wait=2", "bad_query", "wait"),
    ("mode=test", "bad_query", "mode"),
    ("eval=x", "bad_query", "eval"),
    ("return=logits&wait=1", "bad_query", "return"),
    ("mode=eval&return=probs&wait=1", "bad_query", "return"),
    ("mode=eval&return=logits", "bad_query", "wait"),
    ("mode=eval&eval=a%20b", "bad_eval_name", "eval"),
])
def test_a_batch_posted_with_a_bad_query_value_is_refused_naming_the_parameter(start_server, rng, query, code,
                                                                               field):
    # TROUBLESHOOTING.md: for bad_query, "field names the parameter"; the
    # upload route refused these with the code alone.
    s = start_server(*TINY)
    r = s.post_batch(st_body(*random_batch(rng, 2)), path="/v1/batches?" + query)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"].get("field")) == (code, field), r.text
    assert s.metric("streamfeed_batches_rejected_total", reason=code) == 1


def test_a_logits_read_with_a_bad_wait_is_refused_naming_the_parameter(start_server):
    s = start_server(SINK)
    r = s.get("/v1/batches/1/logits?wait=yes")
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"].get("field")) == ("bad_query", "wait"), r.text


def patch_config_raw(body, content_type=b"application/json"):
    return (b"PATCH /v1/config HTTP/1.1\r\nHost: x\r\nContent-Type: " + content_type +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


@pytest.mark.parametrize("request_bytes", [
    b"GET /%ff%fe HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/batches/%ff HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: \xff\xfe\r\nContent-Length: 2\r\n\r\n{}",
    patch_config_raw(b'{"log":{"level":"\xff\xfe"}}'),
    patch_config_raw(b'{"\xff\xfe\\n":1}'),
])
def test_error_replies_stay_utf8_json_whatever_bytes_the_client_sent(start_server, request_bytes):
    s = start_server(SINK)
    r, _ = raw(s, request_bytes)  # RawReply decodes the body as UTF-8: raises on ill-formed bytes
    assert 400 <= r.status_code < 500
    assert r.json()["error"]["code"]


def test_a_config_string_that_is_not_utf8_text_is_refused_and_the_config_stays_readable(start_server):
    s = start_server(SINK + ["--http.token", "t0k"])  # url_allow changes by PATCH only with a token
    body = b'{"checkpoint":{"url_allow":"\xff\xfe.example.com"}}'
    r = s.request("PATCH", "/v1/config", data=body,
                  headers={"Content-Type": "application/json", "Authorization": "Bearer t0k"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "config_invalid", r.text
    r = s.get("/v1/config")
    assert r.status_code == 200
    r.content.decode("utf-8")
    assert r.json()


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_bearer_scheme_is_matched_without_regard_to_case(start_server, rng, scheme):
    s = start_server(SINK, "--http.token", "s3cret")
    body = st_body(*random_batch(rng, 1))
    assert s.post_batch(body, headers={"Authorization": f"{scheme} s3cret"}).status_code == 202
    assert s.post_batch(body, headers={"Authorization": f"{scheme}  s3cret"}).status_code == 202


@pytest.mark.parametrize("auth", ["Bearer s3cre", "Bearer s3cret2", "Bearer ", "Bearers3cret",
                                  "Basic czNjcmV0", "s3cret", "Bearer S3CRET"])
def test_a_wrong_or_malformed_token_gets_401(start_server, rng, auth):
    s = start_server(SINK, "--http.token", "s3cret")
    r = s.post_batch(st_body(*random_batch(rng, 1)), headers={"Authorization": auth})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"


# ---- request targets libmicrohttpd cannot hold ------------------------------------

# About 20 000 arguments overflow libmicrohttpd 0.9.75's per-connection memory
# pool while it splits the query, which it then drops without a reply or a
# completion callback.
MANY_ARGS_TARGET = "/healthz?" + "a=b&" * 20000


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_a_query_of_thousands_of_arguments_gets_414_at_once_and_the_descriptors_next_owner_is_untouched(
        start_server):
    s = start_server(SINK, "--http.header_timeout_s", "2")
    t0 = time.monotonic()
    r, closed = raw(s, f"GET {MANY_ARGS_TARGET} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert r.status_code == 414 and r.json()["error"]["code"] == "uri_too_long", r.text
    assert closed and time.monotonic() - t0 < 2
    # The next connection, which gets the same descriptor number, is kept
    # alive past the header deadline of the request before it: it is not shut.
    k = s.connect()
    k.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_reply(k).status_code == 200
    time.sleep(3.5)  # the idle gap under test: longer than http.header_timeout_s
    k.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_reply(k).status_code == 200
    k.close()
    assert s.metric("streamfeed_http_errors_total", code="uri_too_long") == 1
    assert s.metric("streamfeed_http_errors_total", code="header_timeout") == 0


def test_a_query_with_more_arguments_than_any_route_takes_gets_400_bad_query(start_server):
    s = start_server(SINK)
    for n in (33, 1500):
        r = s.get("/healthz?" + "&".join(f"k{i}=1" for i in range(n)))
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_query", r.text
    assert s.get("/v1/trace?" + "&".join(f"k{i}=1" for i in range(32))).status_code == 200


def test_requests_with_thousands_of_query_arguments_each_end_and_leave_no_memory_behind(start_server):
    # Each used to leak its request object (about 1 KB). Under ASan the
    # allocator's own caches move RSS by megabytes, and LeakSanitizer's report
    # at exit is the check instead (sfharness fails a test on it).
    s = start_server(SINK, "--log.requests", "false")
    req = f"GET {MANY_ARGS_TARGET} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()

    def send(n):
        for _ in range(n):
            k = s.connect()
            k.sendall(req)
            while k.recv(65536):
                pass
            k.close()

    send(300)
    before = rss_bytes(s.proc.pid)
    send(3000)
    grown = rss_bytes(s.proc.pid) - before
    assert s.metric("streamfeed_http_requests_total", route="healthz", code="414") == 3300
    if not built_with_asan():
        assert grown < 1_000_000, f"RSS grew by {grown} bytes over 3000 requests"


# ---- one server per port ------------------------------------------------------------


def test_a_second_server_on_a_port_in_use_fails_to_start_and_the_first_keeps_serving(start_server):
    first = start_server(SINK)
    r = subprocess.run([BIN, "--http.host", "127.0.0.1", "--http.port", str(first.port), *SINK],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{first.port}" in r.stderr and "Address already in use" in r.stderr
    for _ in range(20):  # every connection reaches the first server
        assert first.get("/healthz").status_code == 200
    assert first.metric("streamfeed_http_requests_total", route="healthz", code="200") == 20


def test_a_metrics_port_in_use_fails_the_start_naming_it(start_server):
    first = start_server(SINK)
    r = subprocess.run([BIN, "--http.host", "127.0.0.1", "--http.port", "0", "--http.metrics_port",
                        str(first.port), *SINK], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "(http.metrics_port)" in r.stderr and "in use" in r.stderr
