"""Fixtures of the integration suite; the helpers live in sfharness.py."""
import os

import numpy as np
import pytest

from sfharness import BIN, ServerFactory


@pytest.fixture(scope="session", autouse=True)
def _binaries_exist():
    if not os.access(BIN, os.X_OK):
        pytest.exit(f"streamfeed binary not found at {BIN} (build it: make CUDA=0, or set STREAMFEED_BIN)", 2)


@pytest.fixture
def start_server(tmp_path):
    """start_server(*flags, env=None) -> Server on port 0; every server it
    started gets SIGTERM at teardown and must exit 0 with a clean stderr."""
    f = ServerFactory(tmp_path)
    yield f
    f.stop_all()


@pytest.fixture(scope="module")
def module_server_factory(tmp_path_factory):
    """Like start_server, for servers shared by a module's tests."""
    f = ServerFactory(tmp_path_factory.mktemp("servers"))
    yield f
    f.stop_all()


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
