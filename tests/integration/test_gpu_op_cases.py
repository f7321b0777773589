"""The GPU op case table (tests/gpu/op_cases.cu) and its driver test_ops:
what make builds from it, and, where the CUDA flavour is built, the cases it
lists and selects, which need no device. The counts pin every op family's
cases, so that a row dropped from the table fails here rather than going
unnoticed on the GPU."""
import os
import re
import subprocess
from pathlib import Path

import pytest

from sfharness import BIN, REPO

TEST_OPS = Path(BIN).parent / "tests" / "gpu" / "test_ops"

CASES_PER_FAMILY = {
    "activation": 253,
    "attention": 15,
    "batchnorm": 102,
    "channel_conv1d": 17,
    "channels": 45,
    "concat": 17,
    "conv": 263,
    "conv_dw": 50,
    "conv_gemm": 64,
    "conv_transpose": 37,
    "dropout": 109,
    "groupnorm": 65,
    "grn": 21,
    "layout": 2,
    "linear": 78,
    "log_softmax": 9,
    "loss": 27,
    "mul": 92,
    "norm": 100,
    "optimizer": 14,
    "pad": 61,
    "pointwise": 73,
    "pool": 208,
    "prelu": 33,
    "sdpa": 10,
    "tokens": 36,
    "upsample": 49,
}


def _make_dry_run(build):
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "-n", "--no-print-directory", f"BUILD={build}", "NVCC=/bin/true", "GPU_USABLE=",
                           "test-builds"], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def _test_ops(*args):
    if not os.access(TEST_OPS, os.X_OK):
        pytest.skip(f"{TEST_OPS} is not built (a build without the CUDA backend)")
    return subprocess.run([str(TEST_OPS), *args], capture_output=True, text=True, timeout=60)


def test_make_compiles_every_op_family_file_and_links_them_into_test_ops(tmp_path):
    p = _make_dry_run(tmp_path / "b")
    families = sorted(f.stem for f in (REPO / "tests" / "gpu" / "ops").glob("*.cu"))
    assert families == sorted(CASES_PER_FAMILY), families
    for fam in families:
        assert re.search(rf"^/bin/true .* -c tests/gpu/ops/{fam}\.cu ", p.stdout, re.MULTILINE), fam
    link = [line for line in p.stdout.splitlines() if "tests/gpu/test_ops.cu" in line and " -o " in line]
    assert len(link) == 1, p.stdout[-2000:]
    for fam in families:
        assert f"tests/gpu/ops/{fam}.cu.o" in link[0], fam


def test_listing_counts_every_op_familys_cases_without_a_device():
    p = _test_ops("-l")
    assert p.returncode == 0, p.stdout + p.stderr
    counts = {m[1]: int(m[2]) for m in re.finditer(r"^test_ops (\w+): (\d+) cases$", p.stdout, re.MULTILINE)}
    assert counts == CASES_PER_FAMILY
    assert f"test_ops: {sum(CASES_PER_FAMILY.values())} cases" in p.stdout
    names = re.findall(r"^case (.+)$", p.stdout, re.MULTILINE)
    assert len(names) == sum(CASES_PER_FAMILY.values())
    assert len(set(names)) == len(names), "two cases share a name, so -k cannot tell them apart"


def test_a_family_and_a_substring_select_the_cases_that_hold_both():
    p = _test_ops("-l", "-o", "mul", "-k", "bf16 nhwc")
    assert p.returncode == 0, p.stdout + p.stderr
    names = re.findall(r"^case (.+)$", p.stdout, re.MULTILINE)
    assert len(names) == 23
    assert all(n.startswith("mul ") and "bf16 nhwc" in n for n in names), names


def test_an_unknown_family_or_a_filter_that_selects_nothing_exits_2():
    unknown = _test_ops("-o", "convolution")
    assert unknown.returncode == 2 and "-o names no op family" in unknown.stderr
    nothing = _test_ops("-o", "mul", "-k", "fp64")
    assert nothing.returncode == 2 and "no case matches" in nothing.stderr
