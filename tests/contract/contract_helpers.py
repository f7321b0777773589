"""Helpers of the contract tests, which check the server as other programs
see it: schemathesis driving it from openapi/streamfeed.yaml, and Prometheus
scraping it.

This is a plain module with a name of its own rather than a conftest.py, so
that `from contract_helpers import ...` cannot pick up another suite's
conftest when pytest collects several test directories at once.

The servers are started with streamfeed.testing.LocalServer (client/python,
installed or taken from the source tree).

Environment:
    STREAMFEED_BIN   the server binary (default build/streamfeed)
"""
import os
import re
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
try:
    import streamfeed  # noqa: F401
except ImportError:
    sys.path.insert(0, str(REPO / "client" / "python"))
    import streamfeed  # noqa: F401

from streamfeed.testing import LocalServer  # noqa: E402

BIN = os.environ.get("STREAMFEED_BIN", str(REPO / "build" / "streamfeed"))
SPEC = REPO / "openapi" / "streamfeed.yaml"

AUG = '[{"op":"to_dtype","scale":0.00392157},{"op":"normalize","mean":[0.5],"std":[0.25]}]'
TINY = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", AUG,
        "--log.requests", "false"]

_BAD_STDERR = re.compile(r"^\S+ error |\"level\":\"error\"|AddressSanitizer|LeakSanitizer|"
                         r"UndefinedBehaviorSanitizer|runtime error:", re.MULTILINE)


def start_tiny_server(log_dir, *flags):
    if not os.access(BIN, os.X_OK):
        pytest.exit(f"streamfeed binary not found at {BIN} (build it: make CUDA=0, or set STREAMFEED_BIN)", 2)
    return LocalServer(BIN, TINY + [str(f) for f in flags], log_dir=str(log_dir))


def stop_checked(server):
    """SIGTERM; the server must exit 0 without an error on stderr."""
    rc = server.stop()
    err = server.stderr()
    server.cleanup()
    assert rc == 0, f"streamfeed exited with {rc} after SIGTERM; stderr:\n{err[-3000:]}"
    bad = _BAD_STDERR.search(err)
    assert not bad, f"streamfeed logged an error ({bad.group(0)!r}):\n{err[-3000:]}"


def wait_until(cond, timeout=10.0, what="a condition", interval=0.01):
    """Polls cond() until it returns a true value, and returns it; fails the
    test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
        interval = min(interval * 2, 0.25)
