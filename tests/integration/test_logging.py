"""The log as a collector reads it: JSON lines with real fields, the listening
line in the same format, and no line per probe or scrape unless asked."""
import json
import re
import signal
import subprocess

import requests

from sfharness import BIN, SINK, TINY, random_batch, st_body, wait_until


def json_lines(text):
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def test_json_request_lines_carry_method_path_status_duration_bytes_request_and_batch_ids(start_server, rng):
    s = start_server(*TINY, "--log.format", "json")
    images, labels = random_batch(rng, 2)
    r = s.post_batch(st_body(images, labels), wait=True, headers={"X-Request-Id": "post-one"})
    assert r.status_code == 200, r.text
    bid = r.json()["id"]
    s.get(f"/v1/batches/{bid}", headers={"X-Request-Id": "get-one"})
    wait_until(lambda: '"get-one"' in s.stderr(), 10, what="the GET's log line")
    lines = {ln.get("request_id"): ln for ln in json_lines(s.stderr()) if ln.get("msg") == "request"}
    post, get = lines["post-one"], lines["get-one"]
    for ln in (post, get):
        assert set(ln) >= {"time", "level", "msg", "method", "path", "status", "duration_ms", "bytes",
                           "request_id", "batch_id"}, ln
        assert ln["level"] == "info" and ln["batch_id"] == bid and ln["duration_ms"] >= 0
        assert ln["time"].endswith("Z")
    assert post["method"] == "POST" and post["path"] == "/v1/batches" and post["status"] == 200
    assert post["bytes_in"] == len(st_body(images, labels)) and post["bytes"] > 0
    assert get["method"] == "GET" and get["status"] == 200
    # Every stderr line is JSON in json mode, the start-up lines included.
    assert all(ln.startswith("{") for ln in s.stderr().splitlines() if ln.strip()), s.stderr()


def test_a_4xx_request_line_carries_the_error_code_in_both_log_formats(start_server):
    for fmt in ("json", "text"):
        s = start_server(*TINY, "--log.format", fmt)
        s.post_batch(b"not safetensors at all", headers={"X-Request-Id": f"bad-{fmt}"})
        s.get("/v1/batches/987654", headers={"X-Request-Id": f"missing-{fmt}"})
        s.get("/v1/config", headers={"X-Request-Id": f"fine-{fmt}"})
        wait_until(lambda: f"fine-{fmt}" in s.stderr(), 10, what="the last request's line")
        if fmt == "json":
            lines = {ln.get("request_id"): ln for ln in json_lines(s.stderr()) if ln.get("msg") == "request"}
            assert lines["bad-json"]["status"] == 413 and lines["bad-json"]["error"] == "header_too_large", \
                lines["bad-json"]
            assert lines["missing-json"]["error"] == "batch_not_found"
            assert "error" not in lines["fine-json"]
        else:
            line = next(ln for ln in s.stderr().splitlines() if "request_id=missing-text" in ln)
            assert "error=batch_not_found" in line, line


def test_a_text_request_line_quotes_a_path_with_spaces_so_it_cannot_forge_fields(start_server):
    s = start_server(*TINY, "--log.format", "text")
    s.get("/x%20status=200%20request_id=forged%22%5C", headers={"X-Request-Id": "spoof-text"})
    wait_until(lambda: "spoof-text" in s.stderr(), 10, what="the request's line")
    line = next(ln for ln in s.stderr().splitlines() if "spoof-text" in ln)
    # logfmt: key=value, or key="value" with \" and \\ escaped inside.
    fields = re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line)
    keys = [k for k, _ in fields]
    assert keys.count("status") == 1 and keys.count("request_id") == 1, line
    got = dict(fields)
    assert got["status"] == "404" and got["request_id"] == "spoof-text", line
    assert got["path"] == r'"/x status=200 request_id=forged\"\\"', line


def test_the_listening_line_is_json_in_json_mode():
    p = subprocess.Popen([BIN, "--http.port", "0", "--http.host", "127.0.0.1", "--log.format", "json", *SINK],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ln = json.loads(p.stdout.readline())
        assert ln["level"] == "info" and ln["port"] > 0
        assert ln["url"] == f"http://127.0.0.1:{ln['port']}"
        assert ln["msg"] == f"streamfeed listening on {ln['url']}"
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0


def test_probes_and_scrapes_are_not_logged_unless_log_probes_is_set(start_server):
    s = start_server(*SINK)
    for path in ("/healthz", "/readyz", "/metrics"):
        s.get(path, headers={"X-Request-Id": "probe-quiet" + path.replace("/", "-")})
    s.get("/v1/config", headers={"X-Request-Id": "config-logged"})
    wait_until(lambda: "config-logged" in s.stderr(), 10, what="the config request's line")
    assert "probe-quiet" not in s.stderr()
    assert s.patch_config({"log": {"probes": True}}).status_code == 200
    s.get("/healthz", headers={"X-Request-Id": "probe-logged"})
    wait_until(lambda: "request_id=probe-logged" in s.stderr(), 10, what="the probe's line")


def test_a_stderr_pipe_nobody_reads_costs_log_lines_not_requests_or_training(rng):
    """A log collector that stops reading: the pipe fills, the requests and
    the training go on, the lines that did not fit are counted, and their
    count is logged once the reader is back."""
    p = subprocess.Popen([BIN, "--http.port", "0", "--http.host", "127.0.0.1", *TINY],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", p.stdout.readline().decode())
        url = f"http://127.0.0.1:{m.group(1)}"
        http = requests.Session()
        # About 1.1 KB of log line each (the path is logged): several times
        # the pipe and the writer's buffer together.
        for i in range(3000):
            assert http.get(f"{url}/v1/no-such-route/{i:05d}/" + "x" * 1000, timeout=10).status_code == 404
        images, labels = random_batch(rng, 2)
        r = http.post(f"{url}/v1/batches?wait=1", data=st_body(images, labels),
                      headers={"Content-Type": "application/vnd.safetensors"}, timeout=30)
        assert r.status_code == 200 and r.json()["state"] == "done" and r.json()["step"] == 1, r.text
        assert http.get(f"{url}/healthz", timeout=10).status_code == 200
        metrics = http.get(f"{url}/metrics", timeout=10).text
        dropped = int(re.search(r"^streamfeed_log_lines_dropped_total (\d+)$", metrics, re.M).group(1))
        assert dropped > 0
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    lines = err.decode(errors="replace").splitlines()
    # The kept lines are whole (a request's line is logged when its reply has
    # gone, so two in a row may swap threads and order), the drops are
    # reported, and the shutdown's own lines were still written.
    routes = [ln for ln in lines if "/v1/no-such-route/" in ln]
    seen = [int(x) for x in re.findall(r" path=/v1/no-such-route/(\d{5})/x{1000} status=404 ", "\n".join(routes))]
    assert len(seen) == len(routes) == len(set(seen)) and 0 in seen
    reported = sum(int(x) for x in re.findall(r"log: (\d+) lines dropped", "\n".join(lines)))
    assert reported >= dropped
    assert any(ln.endswith(" stopped") for ln in lines), lines[-5:]
