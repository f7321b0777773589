"""The log as a collector reads it: JSON lines with real fields, the listening
line in the same format, and no line per probe or scrape unless asked."""
import json
import signal
import subprocess

from sfharness import BIN, SINK, TINY, random_batch, wait_until


def json_lines(text):
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def test_json_request_lines_carry_method_path_status_duration_bytes_request_and_batch_ids(start_server, rng):
    s = start_server(*TINY, "--log.format", "json")
    from sfharness import st_body
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
