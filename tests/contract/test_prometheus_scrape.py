"""A real Prometheus server scrapes streamfeed's /metrics once a second while
batches are posted, and its query API sees streamfeed_steps_total rise.

This is the contract with the monitoring side: the exposition parses in
Prometheus itself (not just promtool), the target is healthy, and the counter
a dashboard plots moves with the training. Prometheus comes from the Debian
package `prometheus` (/usr/bin/prometheus); without it the test is skipped,
saying so. Everything listens on 127.0.0.1; every wait polls a condition with
a deadline.
"""
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
import requests

from contract_helpers import start_tiny_server, stop_checked, wait_until

PROMETHEUS = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A Prometheus process scraping one target every second."""

    def __init__(self, work, target):
        self.work = work
        (work / "data").mkdir()
        self.config = work / "prometheus.yml"
        self.config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: streamfeed\n"
            "    metrics_path: /metrics\n"
            "    static_configs:\n"
            f"      - targets: ['{target}']\n")
        self.log_path = work / "prometheus.log"
        self.proc = None
        for _ in range(3):  # the port picked can be taken meanwhile: try another
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self._log = open(self.log_path, "wb")
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.config}", f"--storage.tsdb.path={work / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
                 "--storage.tsdb.retention.time=1h"],
                stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work)
            if self._wait_ready(30.0):
                return
            self.stop()
        pytest.fail(f"Prometheus did not become ready:\n{self.log()[-3000:]}")

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.05)
        return False

    def log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def query(self, expr):
        """The instant vector of expr: [(labels, float value)]."""
        r = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "success", body
        return [(s["metric"], float(s["value"][1])) for s in body["data"]["result"]]

    def value(self, expr):
        """The value of a one-sample query, or None while it has no sample."""
        res = self.query(expr)
        return res[0][1] if len(res) == 1 else None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture
def prometheus_bin():
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.skip(f"Prometheus is not installed ({PROMETHEUS} missing; apt-get install prometheus)")
    return PROMETHEUS


def test_prometheus_scrapes_the_service_and_sees_steps_total_rise_while_batches_are_posted(
        prometheus_bin, tmp_path):
    server = start_tiny_server(tmp_path)
    prom = None
    stop_posting = threading.Event()
    posted = []
    poster = None
    try:
        prom = Prometheus(tmp_path, f"127.0.0.1:{server.port}")
        up = 'up{job="streamfeed"}'
        wait_until(lambda: prom.value(up) == 1.0, timeout=30, what="the streamfeed target to be up")
        # The first scrape has happened: the counter is there, at 0.
        assert wait_until(lambda: prom.value("streamfeed_steps_total") is not None, timeout=15,
                          what="a streamfeed_steps_total sample") is not None
        assert prom.value("streamfeed_steps_total") == 0.0

        client = server.client()
        rng = np.random.default_rng(3)

        def post_batches():
            # Bounded: at most 2000 batches or 60 s, whichever comes first.
            deadline = time.monotonic() + 60
            while not stop_posting.is_set() and len(posted) < 2000 and time.monotonic() < deadline:
                images = rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8)
                posted.append(client.post_batch(images, rng.integers(0, 10, 8), wait=True)["step"])

        poster = threading.Thread(target=post_batches, daemon=True)
        poster.start()
        # Three different, increasing values seen through Prometheus while posting.
        seen = [0.0]

        def rose():
            v = prom.value("streamfeed_steps_total")
            if v is not None and v > seen[-1]:
                seen.append(v)
            return len(seen) >= 4

        wait_until(rose, timeout=30, what=f"streamfeed_steps_total to rise three times (seen {seen})")
        assert seen == sorted(seen) and len(set(seen)) == len(seen), seen
        stop_posting.set()
        poster.join(30)
        assert not poster.is_alive()
        # Once posting stopped, the next scrapes bring Prometheus to the server's own count.
        steps = posted[-1]
        assert client.model()["step"] == steps
        wait_until(lambda: prom.value("streamfeed_steps_total") == steps, timeout=15,
                   what=f"Prometheus to report the final {steps} steps")
        rate = prom.value('rate(streamfeed_steps_total{job="streamfeed"}[1m])')
        assert rate is not None and rate > 0
        assert prom.value('streamfeed_build_info{job="streamfeed"}') == 1.0
        # No sample was dropped as unparsable, and the target stayed healthy.
        assert prom.value('scrape_samples_scraped{job="streamfeed"}') > 50
        assert prom.value(up) == 1.0
    finally:
        stop_posting.set()
        if poster is not None:
            poster.join(30)
        if prom is not None:
            prom.stop()
        stop_checked(server)
