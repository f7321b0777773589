"""The layout rules of docs/DESIGN.md §2, kept by the suite rather than by
memory: tools/structure_report.py measures every service function and file
with lizard and exits 1 when one is over its bound."""
import subprocess
import sys

from sfharness import REPO


def test_every_service_function_and_file_is_within_the_layout_bounds():
    p = subprocess.run([sys.executable, str(REPO / "tools" / "structure_report.py")], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
