"""A user's first commands: the command line, the start-up messages, the
README's first snippet on a CPU host, and the documents --help and the docs
point to. Each test runs the real binary (or make) as a user would."""
import ctypes
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from sfharness import BIN, LOAD_BIN, REPO, SINK, TINY, wait_until


def run(*args, env=None, timeout=30):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMFEED_")}
    full_env.update(env or {})
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, env=full_env)


# ---- flags --------------------------------------------------------------------------


def test_version_prints_the_version_and_the_commit():
    p = run("--version")
    assert p.returncode == 0, p.stderr
    m = re.fullmatch(r"streamfeed (\S+) \(commit ([0-9a-f]{7,40}|unknown), backend built: (ref|cuda)\)\n",
                     p.stdout)
    assert m, p.stdout
    # The same strings label streamfeed_build_info (test_foundation checks it).


def test_streamfeed_load_version_prints_the_version_and_the_commit():
    p = subprocess.run([LOAD_BIN, "--version"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 0, p.stderr
    m = re.fullmatch(r"streamfeed-load (\S+) \(commit ([0-9a-f]{7,40}|unknown)\)\n", p.stdout)
    assert m, p.stdout
    # Stamped by the build like the server's (unknown only without git).
    assert (m.group(1) == "unknown") == (m.group(2) == "unknown"), p.stdout


@pytest.mark.parametrize("var,meant", [
    ("STREAMFEED_RING_SLOT", "STREAMFEED_RING_SLOTS (ring.slots)"),
    ("STREAMFEED_PORT", "STREAMFEED_HTTP_PORT (http.port)"),
    ("STREAMFEED_HTPP_THREADS", "STREAMFEED_HTTP_THREADS (http.threads)"),
    ("STREAMFEED_LEARNING_RATE_OF_SGD", None),
])
def test_an_unknown_streamfeed_environment_variable_is_warned_about_at_start_with_a_did_you_mean(
        start_server, var, meant):
    s = start_server(SINK, env={var: "4", "STREAMFEED_RING_SLOTS": "8", "STREAMFEED_CONFIG": ""})
    lines = [ln for ln in s.stderr().splitlines() if " warn " in ln]
    assert len(lines) == 1, s.stderr()  # the options and STREAMFEED_CONFIG are not warned about
    assert f"environment {var} is not an option and is ignored" in lines[0], lines[0]
    if meant:
        assert f"did you mean {meant}?" in lines[0], lines[0]
    else:
        assert "did you mean" not in lines[0] and "streamfeed --help lists the options" in lines[0], lines[0]
    assert s.get("/healthz").status_code == 200


@pytest.mark.parametrize("flag,meant", [
    ("--ring.slot", "ring.slots"),
    ("--htpp.port", "http.port"),
    ("--port", "http.port"),
    ("--optim.learning_rate", None),
])
def test_an_unknown_option_gets_a_did_you_mean_when_one_is_close(flag, meant):
    p = run(flag, "3")
    assert p.returncode == 2
    assert f'unknown option "{flag[2:]}"' in p.stderr
    if meant:
        assert f'did you mean "{meant}"?' in p.stderr, p.stderr
    else:
        assert "did you mean" not in p.stderr and "--help" in p.stderr, p.stderr


def test_a_data_parallel_job_without_a_token_is_refused_unless_the_operator_allows_it():
    # One unauthenticated write to rank 0's rendezvous store can break a
    # joining job, so a job needs http.token unless the operator says otherwise.
    p = run("--distributed.world_size", "2", "--distributed.rank", "0", "--http.port", "0")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "needs http.token" in p.stderr and "distributed.allow_no_token" in p.stderr, p.stderr


def test_a_flag_followed_by_another_flag_is_reported_as_missing_its_value():
    p = run("--ring.slots", "--http.port", "0")
    assert p.returncode == 2
    assert "--ring.slots needs a value" in p.stderr, p.stderr
    assert "not a number" not in p.stderr


def test_integer_bounds_print_as_integers_in_errors_and_help():
    p = run("--eval.logits_keep_bytes", "1")
    assert p.returncode == 2
    assert "[4096, 68719476736]" in p.stderr, p.stderr
    h = run("--help").stdout
    assert "int in [4096, 68719476736]" in h
    assert "e+" not in h, [ln for ln in h.splitlines() if "e+" in ln]


# ---- the listening address ------------------------------------------------------------


@pytest.mark.parametrize("host,url_host", [("localhost", "localhost"), ("::1", "[::1]"),
                                           ("[::1]", "[::1]"), ("::", "[::]")])
def test_http_host_takes_host_names_and_ipv6(start_server, host, url_host):
    s = start_server(*SINK, "--http.host", host)
    url = f"http://{'[::1]' if url_host in ('[::1]', '[::]') else 'localhost'}:{s.port}"
    assert requests.get(url + "/healthz", timeout=10).json() == {"status": "ok"}
    if host == "::":
        # "::" is dual stack: IPv4 clients reach it too.
        assert requests.get(f"http://127.0.0.1:{s.port}/healthz", timeout=10).status_code == 200


def test_a_listening_line_with_ipv6_brackets_the_address(tmp_path):
    p = subprocess.Popen([BIN, "--http.port", "0", "--http.host", "::1", *SINK], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    try:
        line = p.stdout.readline()
        assert re.fullmatch(r"streamfeed listening on http://\[::1\]:\d+\n", line), line
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)


def test_a_bad_http_host_fails_before_the_backend_is_initialised():
    # pipeline.backend=cuda fails on a machine without a GPU: the host check
    # must come first, and its message must be the one the user sees.
    p = run("--http.host", "no-such-host.invalid", "--pipeline.backend", "cuda", "--http.port", "0")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "http.host" in p.stderr and "no-such-host.invalid" in p.stderr
    assert "GPU" not in p.stderr


# ---- start-up on a CPU host ------------------------------------------------------------


def test_a_large_preset_on_the_cpu_fallback_is_warned_at_start_and_in_v1_model(start_server):
    s = start_server("--model.preset", "resnet18", "--pipeline.backend", "auto", "--model.max_batch", "2",
                     "--log.requests", "false")
    m = s.get("/v1/model").json()
    if m["backend"] != "ref":
        pytest.skip("a GPU is usable here: there is no CPU fallback to warn about")
    assert len(m["warnings"]) == 1, m["warnings"]
    w = m["warnings"][0]
    assert "CPU reference backend" in w and "resnet18" in w and "--model.preset tiny" in w
    assert re.search(r"^\S+ warn +no usable GPU .*resnet18", s.stderr(), re.MULTILINE), s.stderr()


def test_a_chosen_reference_backend_with_the_tiny_model_has_no_warning(start_server):
    s = start_server(*TINY)
    assert s.get("/v1/model").json()["warnings"] == []
    assert " warn " not in s.stderr()


def _make(*args, build):
    # Without what an outer make passes down: under `make CUDA=0 test`, CUDA=0
    # is in the environment and in MAKEFLAGS, and the choice under test would
    # not be this make's own.
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "-s", "--no-print-directory", f"BUILD={build}", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env)


def test_make_cuda_0_is_remembered_by_later_makes_in_the_same_build_folder(tmp_path):
    # NVCC=/bin/true: a machine where nvcc is found, so that only the
    # remembered choice can keep the build CPU-only.
    build = tmp_path / "build"
    first = _make("CUDA=0", "NVCC=/bin/true", "print-found", build=build)
    assert "CPU reference backend only" in first.stdout, first.stdout + first.stderr
    later = _make("NVCC=/bin/true", "print-found", build=build)
    assert "CPU reference backend only" in later.stdout, later.stdout
    assert "CUDA=0, remembered" in later.stdout
    again = _make("CUDA=1", "NVCC=/bin/true", "print-found", build=build)
    assert "CUDA backend" in again.stdout


def test_without_a_usable_gpu_make_builds_the_cpu_backend_alone_unless_cuda_1_is_given(tmp_path):
    # NVCC=/bin/true: nvcc is found; GPU_USABLE= or =1: what nvidia-smi -L would say.
    cpu = _make("NVCC=/bin/true", "GPU_USABLE=", "print-found", build=tmp_path / "a")
    assert "CPU reference backend only" in cpu.stdout and "no usable GPU" in cpu.stdout, cpu.stdout + cpu.stderr
    asked = _make("NVCC=/bin/true", "GPU_USABLE=", "CUDA=1", "print-found", build=tmp_path / "b")
    assert "CUDA backend" in asked.stdout, asked.stdout
    gpu = _make("NVCC=/bin/true", "GPU_USABLE=1", "print-found", build=tmp_path / "c")
    assert "CUDA backend" in gpu.stdout, gpu.stdout


def test_make_test_compiles_the_cuda_code_and_gpu_tests_where_nvcc_is_found_even_without_a_gpu(tmp_path):
    p = _make("-n", "NVCC=/bin/true", "GPU_USABLE=", "test-builds", build=tmp_path / "a")
    assert "CUDA backend" in p.stdout, p.stdout[-2000:] + p.stderr
    assert re.search(r"^/bin/true .* -c gpu/cuda/\w+\.cu ", p.stdout, re.MULTILINE), p.stdout[-2000:]
    assert re.search(r"^/bin/true .*tests/gpu/test_\w+\.cu ", p.stdout, re.MULTILINE), p.stdout[-2000:]


def test_a_build_folder_that_holds_the_cuda_flavour_keeps_it_without_a_gpu(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    (build / ".flavour-cuda1").touch()
    p = _make("NVCC=/bin/true", "GPU_USABLE=", "print-found", build=build)
    assert "CUDA backend" in p.stdout, p.stdout + p.stderr


def test_make_builds_on_every_core_unless_told_otherwise(tmp_path):
    p = _make("-p", "-q", "print-found", build=tmp_path / "a")
    flags = next(ln for ln in p.stdout.splitlines() if ln.startswith("MAKEFLAGS"))
    assert f"-j{os.cpu_count()}" in flags or f"-j{len(os.sched_getaffinity(0))}" in flags, flags


def test_make_deps_demo_compiles_nothing_before_deps_has_installed_the_packages(tmp_path):
    build = tmp_path / "build"
    p = _make("-p", "-n", "GPU_USABLE=", "deps", "demo", build=build)
    db = p.stdout.splitlines()
    for target in (f"{build}/.flavour-cuda0", "demo", ".venv/.stamp"):
        rule = next((ln for ln in db if ln.startswith(target + ":")), "")
        assert "| deps" in rule or rule.endswith("deps"), f"{target} does not wait for deps: {rule!r}"


def _fake_pip(tmp_path, cpu_index_has_torch):
    """A virtualenv whose pip answers as pip does: the CPU index with or
    without torch, PyPI with it."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    pip = venv / "bin" / "pip"
    fail = "" if cpu_index_has_torch else (
        'case "$*" in *--index-url*) echo "ERROR: Could not find a version that satisfies the requirement torch" >&2; '
        'echo "ERROR: No matching distribution found for torch" >&2; exit 1;; esac\n')
    pip.write_text("#!/bin/sh\n" + fail + "exit 0\n")
    pip.chmod(0o755)
    return venv


@pytest.mark.parametrize("cpu_index_has_torch", [True, False])
def test_installing_torch_prints_no_pip_error_when_an_index_gives_it(tmp_path, cpu_index_has_torch):
    venv = _fake_pip(tmp_path, cpu_index_has_torch)
    p = subprocess.run(["bash", str(REPO / "tests" / "install_torch.sh"), str(venv), "http://cpu.invalid/whl"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "TORCH_PYPI_MIN_FREE_GB": "0"})
    assert p.returncode == 0, p.stderr
    assert "ERROR" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert ("torch from http://cpu.invalid/whl" if cpu_index_has_torch else "torch from PyPI") in p.stdout, p.stdout


def test_the_demo_says_in_one_line_why_it_runs_on_the_cpu(tmp_path):
    if "backend built: cuda" in run("--version").stdout and \
            subprocess.run(["sh", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0:
        pytest.skip("a GPU is usable here: the demo runs on it")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMFEED_")}
    env.update(BUILD=str(Path(BIN).parent), BATCHES="40")
    p = subprocess.run(["bash", str(REPO / "tools" / "demo.sh")], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    why = [ln for ln in p.stdout.splitlines() if ln.startswith("demo: on the CPU")]
    assert len(why) == 1, p.stdout
    assert "no usable GPU" in why[0] or "built without the CUDA backend" in why[0], why[0]
    assert "http://127.0.0.1:" in p.stdout, "the demo serves this machine only"
    assert "batch    40: loss" in p.stdout, p.stdout


def test_the_start_up_reason_tells_cuda_0_apart_from_no_nvcc(tmp_path):
    obj = "gpu/nocuda/backend_nocuda.o"
    off = _make("-n", "CUDA=0", f"{tmp_path / 'a'}/{obj}", build=tmp_path / "a")
    assert "SF_NOCUDA_REASON='\"CUDA=0\"'" in off.stdout, off.stdout + off.stderr
    none = _make("-n", "NVCC=", f"{tmp_path / 'b'}/{obj}", build=tmp_path / "b")
    assert "SF_NOCUDA_REASON='\"no nvcc at build time\"'" in none.stdout, none.stdout + none.stderr


def test_a_cuda_0_build_says_so_when_auto_falls_back(start_server):
    if "backend built: ref" not in run("--version").stdout:
        pytest.skip("the binary under test was built with CUDA")
    s = start_server(*TINY, "--pipeline.backend", "auto")
    wait_until(lambda: "no usable GPU" in s.stderr(), 10, what="the fallback line")
    line = next(ln for ln in s.stderr().splitlines() if "no usable GPU" in ln)
    assert "built without CUDA (CUDA=0" in line or "built without CUDA (no nvcc at build time)" in line or \
        "built without CUDA (no usable GPU on the build host" in line, line


def test_a_cuda_build_on_a_machine_without_the_driver_says_so_when_auto_falls_back(start_server):
    if "backend built: ref" in run("--version").stdout:
        pytest.skip("the binary under test was built without CUDA")
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has an NVIDIA driver library")
    except OSError:
        pass
    s = start_server(*TINY, "--pipeline.backend", "auto")
    wait_until(lambda: "no usable GPU" in s.stderr(), 10, what="the fallback line")
    line = next(ln for ln in s.stderr().splitlines() if "no usable GPU" in ln)
    assert "no NVIDIA driver (libcuda.so.1 is not installed)" in line and "insufficient" not in line, line
    assert line.count("no usable GPU") == 1, line


def _readme_snippet():
    text = (REPO / "README.md").read_text()
    section = text.split("## Posting a batch", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def _make_run_command():
    """The command `make run` starts, as make prints it (nothing is run)."""
    build = Path(BIN).parent
    p = _make("-n", "run", "PORT=0", build=build)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(str(build / "streamfeed")) or
             ln.startswith(f"{build.name}/streamfeed")]
    assert lines, p.stdout + p.stderr
    return shlex.split(lines[-1])[1:]


def test_make_run_serves_this_machine_only_unless_host_is_given():
    args = _make_run_command()
    assert args[args.index("--http.host") + 1] == "127.0.0.1", args
    build = Path(BIN).parent
    p = _make("-n", "run", "PORT=0", "HOST=0.0.0.0", build=build)
    assert "--http.host 0.0.0.0" in p.stdout, p.stdout


def test_the_readme_first_snippet_against_make_run_finishes_within_a_minute_on_this_host(start_server, tmp_path):
    args = _make_run_command()
    s = start_server(*args, "--log.requests", "false")
    if s.get("/v1/model").json()["backend"] != "ref":
        pytest.skip("a GPU is usable here: the CPU path is not the one a user gets")
    code = _readme_snippet().replace("http://localhost:8080", s.url)
    t0 = time.monotonic()
    # The snippet writes batch.safetensors for the curl line after it: in a folder of its own.
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90, cwd=tmp_path)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    assert took < 60, f"the README's first POST took {took:.0f} s on the CPU backend"
    assert "'state': 'done'" in p.stdout, p.stdout


# ---- what --help, the docs and the README cite ------------------------------------------


_DOC_REF = re.compile(r"(?<![\w/.-])((?:\.\./)*[\w./-]*[A-Za-z0-9_-]+\.md)\b")


def _cited_documents(text):
    return {m.group(1) for m in _DOC_REF.finditer(text)}


def test_help_docs_and_readme_cite_only_documents_that_ship_in_the_repository():
    sources = {"--help": run("--help").stdout, "README.md": (REPO / "README.md").read_text()}
    for p in sorted((REPO / "docs").glob("*.md")):
        sources[f"docs/{p.name}"] = p.read_text()
    missing = []
    for where, text in sources.items():
        base = REPO / "docs" if where.startswith("docs/") else REPO
        for ref in _cited_documents(text):
            if not ((REPO / ref).is_file() or (base / ref).is_file()):
                missing.append(f"{where} cites {ref}")
        # the founding design and the workspace's shared/ folder do not ship;
        # docs/DESIGN.md, the project's own, does
        if "shared/" in text or ("DESIGN.md" in text and not (REPO / "docs" / "DESIGN.md").is_file()):
            missing.append(f"{where} mentions a document outside the repository (DESIGN.md, shared/)")
    assert not missing, missing


README_MAX_LINES = 250
# [text](target) in Markdown, outside code blocks; the target up to a space or ")".
_MD_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _shipped_files():
    """The files a clone gets: git's index where the tree is a git checkout,
    else every file on disk (a source archive)."""
    p = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True)
    if p.returncode != 0:
        return {str(f.relative_to(REPO)) for f in REPO.rglob("*") if f.is_file()}
    return set(p.stdout.decode().split("\0")) - {""}


def _github_anchor(heading):
    """The fragment GitHub gives a heading: lower case, punctuation dropped
    (hyphens and underscores kept), each space a hyphen."""
    h = re.sub(r"`", "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def _anchors(text):
    seen, out = {}, set()
    for line in _outside_code(text).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            a = _github_anchor(m.group(1))
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else f"{a}-{n}")
    return out


def _outside_code(text):
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


def _user_guide():
    return ["README.md"] + [f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md"))]


def test_readme_is_a_first_page_of_at_most_250_lines():
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move sections to docs/ (at most {README_MAX_LINES})"


def test_every_link_of_the_readme_and_the_user_guide_leads_to_a_shipped_file_and_heading():
    shipped = _shipped_files()
    dead = []
    for doc in _user_guide():
        src = REPO / doc
        for target in _MD_LINK.findall(_outside_code(src.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: — not ours to check
                continue
            path, _, frag = target.partition("#")
            dest = (src.parent / path).resolve() if path else src.resolve()
            try:
                rel = str(dest.relative_to(REPO))
            except ValueError:
                dead.append(f"{doc}: {target} leaves the repository")
                continue
            if not dest.exists() or (dest.is_file() and rel not in shipped) or \
                    (dest.is_dir() and not any(f.startswith(rel + "/") for f in shipped)):
                dead.append(f"{doc}: {target} (not in the repository)")
            elif frag and dest.suffix == ".md" and frag not in _anchors(dest.read_text()):
                dead.append(f"{doc}: {target} (no heading #{frag} in {rel})")
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_the_link_check_finds_a_dead_file_and_a_dead_heading(tmp_path):
    text = "# Top\n## A section\n[ok](#a-section) [gone](#no-such) [file](missing.md)\n"
    assert "a-section" in _anchors(text) and "no-such" not in _anchors(text)
    assert _MD_LINK.findall(text) == ["#a-section", "#no-such", "missing.md"]
    assert _github_anchor("Where we stand (one H200, commit 6833f64, 2026-11-28)") == \
        "where-we-stand-one-h200-commit-6833f64-2026-11-28"


def test_every_page_of_the_user_guide_is_cited_from_the_readme():
    readme = (REPO / "README.md").read_text()
    cited = {(REPO / t.partition("#")[0]).resolve() for t in _MD_LINK.findall(readme)}
    missing = [d for d in _user_guide()[1:] if (REPO / d).resolve() not in cited]
    assert not missing, f"pages of docs/ the README does not link: {missing}"


def test_the_readme_and_the_user_guide_speak_of_gpus_not_of_our_test_machines():
    words = re.compile(r"\blent\b|\bleases?\b", re.IGNORECASE)
    found = [f"{d}:{i}: {ln.strip()}" for d in _user_guide()
             for i, ln in enumerate((REPO / d).read_text().splitlines(), 1) if words.search(ln)]
    assert not found, found


def test_generated_config_markdown_escapes_pipes_so_every_row_has_seven_cells():
    p = run("--help-markdown")
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("| `")]
    assert len(rows) > 30
    for row in rows:
        cells = re.split(r"(?<!\\)\|", row.strip())[1:-1]
        assert len(cells) == 7, row


def test_help_describes_the_http_pool_as_poll_not_epoll():
    h = run("--help").stdout
    line = next(ln for ln in h.splitlines() if "--http.threads" in ln)
    assert "poll" in line and "epoll" not in h
