"""The Python clients against a streamfeed serving HTTPS (http.tls_cert/key),
with a CA and a server certificate made by the openssl CLI for each test."""
import asyncio
import shutil
import subprocess

import numpy as np
import pytest

from streamfeed import Client
from streamfeed.errors import TransportError

pytestmark = pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl CLI")


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path):
    """A CA (ca.pem) and a certificate for 127.0.0.1 it signed (server.pem/key)."""
    d = tmp_path / "pki"
    d.mkdir()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=streamfeed client test CA", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=d)
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "server.ext", cwd=d)
    return d / "ca.pem", d / "server.pem", d / "server.key"


def batch(n=4):
    rng = np.random.default_rng(7)
    return rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, n)


def test_client_trains_a_batch_over_https_verified_against_the_ca(start_server, pki):
    ca, cert, key = pki
    s = start_server("--http.tls_cert", cert, "--http.tls_key", key)
    assert s.url.startswith("https://")
    c = Client(s.url, verify=str(ca))
    r = c.post_batch(*batch(), wait=True)
    assert r.state == "done" and r.loss is not None
    assert c.health()["status"] == "ok"


def test_client_refuses_a_server_its_ca_did_not_sign(start_server, pki):
    ca, cert, key = pki
    s = start_server("--http.tls_cert", cert, "--http.tls_key", key)
    # The system's CAs do not know the test CA.
    with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
        Client(s.url, verify=True, retry=0).post_batch(*batch())


def test_async_client_trains_a_batch_over_https(start_server, pki):
    pytest.importorskip("httpx")
    from streamfeed.aio import AsyncClient

    ca, cert, key = pki
    s = start_server("--http.tls_cert", cert, "--http.tls_key", key)

    async def run():
        async with AsyncClient(s.url, verify=str(ca)) as c:
            return await c.post_batch(*batch(), wait=True)

    r = asyncio.run(run())
    assert r.state == "done"
