"""The augmentation's table of pipelines (tests/gpu/test_augment.cu): where
the CUDA flavour is built, the cases test_augment lists and the checks a
passing run of them prints, which need no device. The counts pin the table,
so that a dropped row or run fails here rather than going unnoticed on the
GPU."""
import os
import re
import subprocess
from pathlib import Path

import pytest

from sfharness import BIN

TEST_AUGMENT = Path(BIN).parent / "tests" / "gpu" / "test_augment"

# 67 pipelines and the launcher's refusals; the ok lines of a passing run.
CASES = 68
CHECKS = 355


def _test_augment(*args):
    if not os.access(TEST_AUGMENT, os.X_OK):
        pytest.skip(f"{TEST_AUGMENT} is not built (a build without the CUDA backend)")
    return subprocess.run([str(TEST_AUGMENT), *args], capture_output=True, text=True, timeout=60)


def _listed(p):
    return {m[1]: int(m[2]) for m in re.finditer(r"^case (.+): (\d+) checks?$", p.stdout, re.MULTILINE)}


def test_listing_counts_every_case_and_check_without_a_device():
    p = _test_augment("-l")
    assert p.returncode == 0, p.stdout + p.stderr
    cases = _listed(p)
    names = re.findall(r"^case (.+): ", p.stdout, re.MULTILINE)
    assert len(names) == CASES and len(cases) == CASES, "two cases share a name, so -k cannot tell them apart"
    assert sum(cases.values()) == CHECKS
    assert f"test_augment: {CASES} cases, {CHECKS} checks" in p.stdout


def test_a_substring_selects_the_cases_that_hold_it():
    p = _test_augment("-l", "-k", "ragged")
    assert p.returncode == 0, p.stdout + p.stderr
    cases = _listed(p)
    assert len(cases) == 6 and all(" ragged " in n for n in cases), cases
    # two output layouts and the refusal of CHW sources per ragged run
    assert sum(cases.values()) == 18


def test_a_filter_that_selects_nothing_is_refused():
    p = _test_augment("-l", "-k", "no such pipeline")
    assert p.returncode == 2
    assert "no case matches the filter" in p.stderr
