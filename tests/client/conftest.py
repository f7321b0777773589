"""Fixtures of the Python client tests: real streamfeed servers on free ports.

The client package is used installed (``pip install -e client/python``) or,
when it is not, straight from client/python (added to sys.path here).

Environment:
    STREAMFEED_BIN   the server binary (default build/streamfeed)
"""
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
try:
    import streamfeed  # noqa: F401
except ImportError:
    sys.path.insert(0, str(REPO / "client" / "python"))
    import streamfeed  # noqa: F401

from streamfeed.testing import LocalServer  # noqa: E402

BIN = os.environ.get("STREAMFEED_BIN", str(REPO / "build" / "streamfeed"))

# The tiny model (32x32x3 in, 10 classes) on the CPU reference backend, with
# the pipeline x/255 then (x-0.5)/0.25: a small, fast, deterministic server.
AUG = '[{"op":"to_dtype","scale":0.00392157},{"op":"normalize","mean":[0.5],"std":[0.25]}]'
TINY = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", AUG,
        "--log.requests", "false"]

# An error-level log line or a sanitizer report on stderr fails the test that started the server.
_BAD_STDERR = re.compile(r"^\S+ error |\"level\":\"error\"|AddressSanitizer|LeakSanitizer|"
                         r"UndefinedBehaviorSanitizer|runtime error:", re.MULTILINE)


def _require_binary():
    if not os.access(BIN, os.X_OK):
        pytest.exit(f"streamfeed binary not found at {BIN} (build it: make CUDA=0, or set STREAMFEED_BIN)", 2)


class ServerFactory:
    """start(*flags) -> LocalServer; stop_all() stops each with SIGTERM and
    checks that it exited 0 with no error on stderr."""

    def __init__(self, log_dir):
        self.log_dir = str(log_dir)
        self.servers = []

    def __call__(self, *flags, tiny=True, env=None):
        _require_binary()
        args = (TINY if tiny else []) + [str(f) for f in flags]
        s = LocalServer(BIN, args, env=env, log_dir=self.log_dir)
        self.servers.append(s)
        return s

    def stop_all(self):
        problems = []
        for s in self.servers:
            rc = s.stop()
            err = s.stderr()
            if rc != 0:
                problems.append(f"{s.args} exited with {rc} after SIGTERM; stderr:\n{err[-3000:]}")
            elif _BAD_STDERR.search(err):
                problems.append(f"{s.args} logged an error:\n{err[-3000:]}")
            s.cleanup()
        self.servers.clear()
        if problems:
            pytest.fail("\n\n".join(problems))


@pytest.fixture
def start_server(tmp_path):
    """A factory of servers that live for one test."""
    f = ServerFactory(tmp_path)
    yield f
    f.stop_all()


@pytest.fixture(scope="module")
def module_server(tmp_path_factory):
    """One TINY server shared by a module's tests that do not depend on its state."""
    f = ServerFactory(tmp_path_factory.mktemp("servers"))
    yield f()
    f.stop_all()


@pytest.fixture
def rng():
    return np.random.default_rng(20261121)
