"""Makes the client package importable for the contract tests: installed
(pip install -e client/python) or, when it is not, from the source tree.
The helpers live in contract_helpers.py (imported by name, so they must not
be in a conftest.py: another suite's conftest could shadow them)."""
import sys
from pathlib import Path

try:
    import streamfeed  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "client" / "python"))
