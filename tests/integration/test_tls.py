"""HTTPS on the main port (http.tls_cert, http.tls_key), with a CA and server
certificates made by the openssl CLI for each test: requests and
streamfeed-load --cacert verify it end to end, SIGHUP and a change of the
files swap the certificate for new connections while the server runs, a
pair that does not load leaves the current one in place, the metrics port
stays plain HTTP, TLS 1.0/1.1 and static RSA are refused unless
http.tls_priorities allows them, and a stalled handshake is closed."""
import shutil
import signal
import socket
import ssl
import subprocess
import time

import pytest
import requests

from sfharness import (BIN, LOAD_BIN, NO_ASAN_QUARANTINE, SINK, TINY, free_port, random_batch, read_reply, st_body,
                       wait_until)

pytestmark = pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl CLI")


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=streamfeed test CA",
            cwd=d)
    return d / "ca.pem"


def make_cert(d, name, cn="127.0.0.1"):
    """A server certificate for 127.0.0.1 and localhost signed by d's CA:
    d/name.pem and d/name.key."""
    (d / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                   "extendedKeyUsage=serverAuth\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d / f"{name}.pem", d / f"{name}.key"


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def make_rsa_cert(d, name):
    """A server certificate with an RSA key (static RSA key exchange needs one)."""
    (d / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", "/CN=127.0.0.1", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d / f"{name}.pem", d / f"{name}.key"


def handshake(port, ca, version=None, ciphers=None):
    """The protocol version and cipher a client offering only `version` (an
    ssl.TLSVersion) and, for TLS 1.2 and older, only `ciphers` (an OpenSSL
    list) gets, or None when the handshake fails."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(ca))
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    if ciphers:
        ctx.set_ciphers(ciphers + ":@SECLEVEL=0")  # let OpenSSL itself offer the old ones
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                return tls.version(), tls.cipher()[0]
        except (ssl.SSLError, ConnectionError):
            return None


def served_cert(port, ca):
    """The DER certificate the server presents to a new connection."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)


def der(pem):
    return ssl.PEM_cert_to_DER_cert(pem.read_text())


@pytest.fixture
def pki(tmp_path):
    d = tmp_path / "pki"
    d.mkdir()
    ca = make_ca(d)
    cert, key = make_cert(d, "server")
    return d, ca, cert, key


def test_https_serves_batches_and_probes_verified_against_the_ca(start_server, rng, pki):
    d, ca, cert, key = pki
    mport = free_port()
    s = start_server(TINY, "--http.tls_cert", cert, "--http.tls_key", key, "--http.metrics_port", mport,
                     "--http.token", "t0ken", verify=str(ca))
    assert s.url.startswith("https://")
    assert s.get("/healthz").json() == {"status": "ok"}
    r = s.post_arrays(*random_batch(rng, 4), wait=True, headers={"Authorization": "Bearer t0ken"})
    assert r.status_code == 200 and r.json()["state"] == "done"
    assert served_cert(s.port, ca) == der(cert)
    # Plain HTTP to the HTTPS port gets no HTTP reply.
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{s.port}/healthz", timeout=5)
    # Without the CA the certificate is not trusted.
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(s.url + "/healthz", timeout=5)
    # The metrics port stays plain HTTP for probes and scrapers.
    assert requests.get(f"http://127.0.0.1:{mport}/readyz", timeout=5).json()["ready"] is True


def test_streamfeed_load_sends_over_https_with_cacert(start_server, pki):
    d, ca, cert, key = pki
    s = start_server(SINK, "--http.tls_cert", cert, "--http.tls_key", key, verify=str(ca))
    r = subprocess.run([LOAD_BIN, "--url", s.url, "--cacert", str(ca), "--workload", "tiny",
                        "--batch", "8", "--batches", "20", "--connections", "4", "--quiet", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert s.metric("streamfeed_batches_received_total", status="accepted") == 20
    # Without the CA the loader refuses the server (and says so).
    r = subprocess.run([LOAD_BIN, "--url", s.url, "--workload", "tiny", "--batch", "8", "--batches", "2",
                        "--retries", "0", "--quiet", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0


def test_sighup_swaps_the_certificate_for_new_connections(start_server, pki):
    d, ca, cert, key = pki
    live_cert, live_key = d / "live.pem", d / "live.key"
    shutil.copy(cert, live_cert)
    shutil.copy(key, live_key)
    s = start_server(SINK, "--http.tls_cert", live_cert, "--http.tls_key", live_key, verify=str(ca))
    assert s.get("/healthz").status_code == 200  # a kept-alive connection with the first certificate
    assert served_cert(s.port, ca) == der(cert)
    cert2, key2 = make_cert(d, "renewed")
    shutil.copy(cert2, live_cert)
    shutil.copy(key2, live_key)
    s.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "TLS certificate reloaded" in s.stderr(), 10)
    assert served_cert(s.port, ca) == der(cert2)
    assert s.get("/healthz").status_code == 200
    assert s.alive()


def test_many_reloads_free_the_pairs_no_connection_uses_and_an_older_connection_still_completes(
        start_server, pki):
    d, ca, cert, key = pki
    s = start_server(SINK, "--http.tls_cert", cert, "--http.tls_key", key, verify=str(ca),
                     env=NO_ASAN_QUARANTINE)
    ctx = ssl.create_default_context(cafile=str(ca))
    old = ctx.wrap_socket(socket.create_connection(("127.0.0.1", s.port), timeout=10),
                          server_hostname="127.0.0.1")
    get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    old.sendall(get)
    assert read_reply(old).status_code == 200

    def reload(n):
        for _ in range(n):
            done = s.stderr().count("TLS certificate reloaded") + 1
            s.proc.send_signal(signal.SIGHUP)
            wait_until(lambda: s.stderr().count("TLS certificate reloaded") >= done, 10)

    reload(100)
    before = rss_bytes(s.proc.pid)
    reload(1500)
    grown = rss_bytes(s.proc.pid) - before
    # A pair kept until exit costs about 4 KB of RSS: 1500 would be about 6 MB.
    assert grown < 2_000_000, f"RSS grew by {grown} bytes over 1500 reloads"
    # The connection from before every reload still works on its pair.
    old.sendall(get)
    assert read_reply(old).status_code == 200
    old.close()
    assert s.get("/healthz").status_code == 200


def test_a_changed_certificate_file_is_picked_up_without_a_signal(start_server, pki):
    d, ca, cert, key = pki
    live_cert, live_key = d / "live.pem", d / "live.key"
    shutil.copy(cert, live_cert)
    shutil.copy(key, live_key)
    s = start_server(SINK, "--http.tls_cert", live_cert, "--http.tls_key", live_key, verify=str(ca))
    cert2, key2 = make_cert(d, "renewed")
    # As a secret volume is updated: new files renamed over the old ones.
    shutil.copy(key2, d / "tmp.key")
    shutil.copy(cert2, d / "tmp.pem")
    (d / "tmp.key").rename(live_key)
    (d / "tmp.pem").rename(live_cert)
    wait_until(lambda: served_cert(s.port, ca) == der(cert2), 15, interval=0.5,
               what="the renewed certificate to be served")


def test_a_reload_that_does_not_load_keeps_the_current_certificate(start_server, pki):
    d, ca, cert, key = pki
    live_cert, live_key = d / "live.pem", d / "live.key"
    shutil.copy(cert, live_cert)
    shutil.copy(key, live_key)
    s = start_server(SINK, "--http.tls_cert", live_cert, "--http.tls_key", live_key, verify=str(ca))
    other_cert, _ = make_cert(d, "other")
    shutil.copy(other_cert, live_cert)  # the key no longer matches the certificate
    s.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "not reloaded" in s.stderr(), 10)
    assert "is not the private key of the certificate" in s.stderr()
    assert served_cert(s.port, ca) == der(cert)
    assert s.get("/healthz").status_code == 200


@pytest.mark.parametrize("case", ["key_mismatch", "missing_key", "garbage_cert", "only_cert"])
def test_a_bad_tls_configuration_fails_the_start_naming_the_file(pki, case):
    d, ca, cert, key = pki
    other_cert, _ = make_cert(d, "other")
    (d / "garbage.pem").write_text("not a certificate\n")
    args = {"key_mismatch": ["--http.tls_cert", other_cert, "--http.tls_key", key],
            "missing_key": ["--http.tls_cert", cert, "--http.tls_key", d / "nope.key"],
            "garbage_cert": ["--http.tls_cert", d / "garbage.pem", "--http.tls_key", key],
            "only_cert": ["--http.tls_cert", cert]}[case]
    r = subprocess.run([BIN, "--http.port", "0", *SINK, *map(str, args)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode != 0
    want = {"key_mismatch": "is not the private key", "missing_key": "nope.key",
            "garbage_cert": "garbage.pem", "only_cert": "go together"}[case]
    assert want in r.stderr, r.stderr


def test_a_stalled_handshake_and_a_trickled_request_line_are_closed_at_the_header_deadline(start_server, pki):
    # The head's deadline runs from the accept on the TLS port too: a client
    # that stops mid-handshake, one that never starts it, and one that
    # trickles its request line through an established session.
    d, ca, cert, key = pki
    s = start_server(SINK, "--http.tls_cert", cert, "--http.tls_key", key, "--http.header_timeout_s", "2",
                     verify=str(ca))
    stalled = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    stalled.sendall(b"\x16\x03\x01\x02\x00\x01")  # the start of a ClientHello record
    silent = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    ctx = ssl.create_default_context(cafile=str(ca))
    trickler = ctx.wrap_socket(socket.create_connection(("127.0.0.1", s.port), timeout=10),
                               server_hostname="127.0.0.1")
    trickler.sendall(b"GET /")
    t0 = time.monotonic()
    ends = {}
    while len(ends) < 3 and time.monotonic() - t0 < 10:
        for name, k in (("stalled", stalled), ("silent", silent)):
            if name not in ends:
                try:
                    if k.recv(100, socket.MSG_DONTWAIT) == b"":
                        ends[name] = time.monotonic() - t0
                except BlockingIOError:
                    pass
                except OSError:
                    ends[name] = time.monotonic() - t0
        if "trickler" not in ends:
            try:
                trickler.sendall(b"a")
            except OSError:
                ends["trickler"] = time.monotonic() - t0
        time.sleep(0.25)
    assert set(ends) == {"stalled", "silent", "trickler"}, ends
    assert all(t < 4.5 for t in ends.values()), ends
    assert s.get("/healthz").status_code == 200
    for k in (stalled, silent, trickler):
        k.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_tls_1_1_and_static_rsa_are_refused_and_tls_1_2_and_1_3_with_ecdhe_are_taken(start_server, pki):
    d, ca, _, _ = pki
    cert, key = make_rsa_cert(d, "rsa")
    s = start_server(SINK, "--http.tls_cert", cert, "--http.tls_key", key, verify=str(ca))
    assert handshake(s.port, ca, ssl.TLSVersion.TLSv1_1, "DEFAULT") is None
    assert handshake(s.port, ca, ssl.TLSVersion.TLSv1, "DEFAULT") is None
    assert handshake(s.port, ca, ssl.TLSVersion.TLSv1_2, "AES128-GCM-SHA256:AES256-SHA") is None
    assert handshake(s.port, ca, ssl.TLSVersion.TLSv1_2, "ECDHE-RSA-AES128-GCM-SHA256") == \
        ("TLSv1.2", "ECDHE-RSA-AES128-GCM-SHA256")
    assert handshake(s.port, ca, ssl.TLSVersion.TLSv1_3)[0] == "TLSv1.3"
    assert s.get("/healthz").status_code == 200
    assert s.config()["http"]["tls_priorities"] == "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-RSA"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_http_tls_priorities_lets_an_operator_take_static_rsa(start_server, pki):
    d, ca, _, _ = pki
    cert, key = make_rsa_cert(d, "rsa")
    s = start_server(SINK, "--http.tls_cert", cert, "--http.tls_key", key,
                     "--http.tls_priorities", "NORMAL:-VERS-ALL:+VERS-TLS1.2:+RSA", verify=str(ca))
    assert handshake(s.port, ca, ssl.TLSVersion.TLSv1_2, "AES128-GCM-SHA256") == ("TLSv1.2", "AES128-GCM-SHA256")
    assert handshake(s.port, ca, ssl.TLSVersion.TLSv1_3) is None


def test_a_priority_string_gnutls_refuses_fails_the_start_naming_the_option():
    r = subprocess.run([BIN, "--http.port", "0", "--http.tls_priorities", "NORMAL:+NO-SUCH-THING"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "http.tls_priorities" in r.stderr and "NO-SUCH-THING" in r.stderr, r.stderr
