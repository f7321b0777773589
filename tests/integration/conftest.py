"""Fixtures of the integration suite; the helpers live in sfharness.py."""
import os
from collections import Counter

import numpy as np
import pytest

from sfharness import BIN, ServerFactory

# `make integration` runs the suite on two pytest-xdist workers, a test file
# each at a time (--dist loadfile), so that a file's module-scoped servers
# start once. Files are handed out in the order below, longest first, so
# that the short files fill the gaps at the end rather than one long file
# keeping a worker busy after the other has run out of work. SPREAD_FILES
# hold long numerical comparisons, each test starting its own servers and
# depending on no other: a whole file of them would still be most of the
# run on one worker (the PyTorch parities of the exported families are most
# of the suite's CPU time), so their tests are handed out one at a time.
SPREAD_FILES = ("test_export_parity.py", "test_bf16.py", "test_torch_parity.py")
LONG_FILES = SPREAD_FILES + ("test_distributed_batchnorm_torch.py", "test_training.py", "test_diagnose.py")


def _file_of(nodeid):
    return nodeid.split("::", 1)[0]


def _name_of(nodeid):
    return _file_of(nodeid).rsplit("/", 1)[-1]


def _spread(nodeid):
    return _name_of(nodeid) in SPREAD_FILES


def pytest_collection_modifyitems(config, items):
    """LONG_FILES first, in their order, then the other files, those with
    more tests first (what xdist's own scope ordering does, which the
    scheduler below turns off); a file's tests keep their order."""
    per_file = Counter(_file_of(item.nodeid) for item in items)

    def rank(item):
        name = _name_of(item.nodeid)
        first = LONG_FILES.index(name) if name in LONG_FILES else len(LONG_FILES)
        return first, -per_file[_file_of(item.nodeid)], _file_of(item.nodeid)
    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with each test of a spread file a unit of its own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SpreadFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid):
            return nodeid if _spread(nodeid) else super()._split_scope(nodeid)

    # Scopes in collection order, which pytest_collection_modifyitems chose.
    config.option.loadscopereorder = False
    return SpreadFileScheduling(config, log)


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
