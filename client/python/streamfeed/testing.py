"""Starting a local streamfeed server for tests and examples.

:class:`LocalServer` runs the server binary on a free port (``--http.port 0``)
of the loopback interface and reads the port back from the line
``streamfeed listening on http://HOST:PORT`` that the server prints on stdout
once it is ready. Nothing here sleeps for a fixed time: start-up waits on that
line, shutdown on the process's exit, each with a deadline.
"""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

from .client import Client

_LISTENING = re.compile(r"streamfeed listening on (https?)://(?:\[[^\]]*\]|[^:\s/\[]+):(\d+)")


class LocalServer:
    """One streamfeed process on 127.0.0.1 and a free port.

    Args:
        binary: path of the ``streamfeed`` executable.
        args: extra flags, e.g. ``["--model.preset", "tiny"]``.
        env: extra environment variables. The caller's own ``STREAMFEED_*``
            variables are not passed on, so that the flags alone configure it.
        start_timeout: seconds to wait for the listening line.
        log_dir: where the server's stderr is written (a temporary directory
            by default); :meth:`stderr` reads it back. It is also the
            server's working directory, so that relative paths it writes
            (checkpoints, say) land there and not in the caller's directory.

    Use as a context manager, or call :meth:`stop`; ``returncode`` is the exit
    status after SIGTERM (0 for a clean shutdown).
    """

    def __init__(self, binary: str, args: Iterable[str] = (), env: Optional[Dict[str, str]] = None,
                 start_timeout: float = 30.0, log_dir: Optional[str] = None, host: str = "127.0.0.1"):
        self.args = [str(binary), "--http.port", "0", "--http.host", host] + [str(a) for a in args]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMFEED_")}
        full_env.update(env or {})
        self._tmp = None
        if log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="streamfeed-")
            log_dir = self._tmp.name
        self.stderr_path = Path(log_dir) / f"streamfeed-{os.getpid()}-{id(self)}.stderr"
        self._stderr = open(self.stderr_path, "w+b")
        self.returncode: Optional[int] = None
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self._stderr,
                                     stdin=subprocess.DEVNULL, env=full_env, cwd=log_dir)
        line = self._read_line(start_timeout)
        m = _LISTENING.search(line)
        if not m:
            self.proc.kill()
            self.proc.wait()
            self._stderr.close()
            raise RuntimeError(f"no listening line from {self.args}: stdout={line!r}, "
                               f"stderr={self.stderr_path.read_text(errors='replace')[-2000:]!r}")
        self.host = host
        self.port = int(m.group(2))
        self.url = f"{m.group(1)}://{host}:{self.port}"

    def _read_line(self, timeout: float) -> str:
        assert self.proc.stdout is not None  # Popen(stdout=PIPE)
        fd = self.proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + timeout
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
        return buf.decode(errors="replace")

    def client(self, **kw: Any) -> Client:
        """A :class:`Client` of this server (keyword arguments go to Client)."""
        return Client(self.url, **kw)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        """Everything the server wrote on stderr so far."""
        try:
            if not self._stderr.closed:
                self._stderr.flush()
            return self.stderr_path.read_bytes().decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> Optional[int]:
        """SIGTERM, then wait up to timeout seconds (then SIGKILL). Returns the
        exit status of the SIGTERM (None when it had to be killed)."""
        if self.returncode is not None or self.proc.stdout is None or self.proc.stdout.closed:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.returncode = None
        self.proc.stdout.close()
        self._stderr.close()
        return self.returncode

    def cleanup(self) -> None:
        """Removes the stderr log (and the temporary directory, if one was made)."""
        try:
            self.stderr_path.unlink()
        except OSError:
            pass
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> "LocalServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.cleanup()
