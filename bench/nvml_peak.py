"""Peak device memory of one process as NVML reports it, sampled while it runs:
the method of bench/memory_peak.sh (`nvidia-smi --query-compute-apps`, every
~0.05 s), in Python so that a benchmark script can wrap the process it starts.

    peak = ProcessPeak()            # the device's idle baseline, before the process
    proc = subprocess.Popen(...)
    peak.start(proc.pid)
    proc.wait()
    peak.stop()
    peak.process_mib, peak.device_delta_mib

process_mib is the largest figure NVML gave for that pid (the CUDA context,
the libraries' kernels and every allocation, as the driver counts them);
device_delta_mib the largest device-wide used memory above what was in use
when sampling started, the cross-check where the driver gives no per-process
figure (in a container that sees other pids, for instance). Both are None
where there is no nvidia-smi (the CPU reference backend), so a CPU run
reports no memory rather than a zero.
"""
import ctypes
import shutil
import signal
import subprocess
import threading

SMI_TIMEOUT_S = 10


def _smi(*args):
    try:
        r = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], capture_output=True,
                           text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def device_used_mib():
    out = _smi("--query-gpu=memory.used")
    try:
        return int(out.splitlines()[0]) if out else None
    except (ValueError, IndexError):
        return None


def process_used_mib(pid):
    """The pid's device memory summed over the GPUs it holds, or None when NVML lists no such process."""
    out = _smi("--query-compute-apps=pid,used_memory")
    if out is None:
        return None
    total, seen = 0, False
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
            total += int(parts[1])
            seen = True
    return total if seen else None


def gpu_name():
    out = _smi("--query-gpu=name,driver_version,memory.total")
    return out.splitlines()[0].strip() if out else None


try:  # looked up here, not between fork and exec, where only the call is safe
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None
PR_SET_PDEATHSIG = 1


def die_with_parent():
    """preexec_fn of a measured process: the kernel kills it when the script
    that started it dies (an outer timeout's SIGKILL), so that it cannot hold
    device memory into the next measurement. Linux only; elsewhere nothing."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))


class ProcessPeak:
    """Samples process_used_mib(pid) and the device's used memory on a thread
    from start() to stop() and keeps the largest of each. The baseline of the
    device-wide figure is taken when the object is made: make it before the
    process starts."""

    def __init__(self, interval_s=0.05):
        self.pid = None
        self.interval_s = interval_s
        self.available = shutil.which("nvidia-smi") is not None
        self._base = device_used_mib() if self.available else None
        self.process_mib = None
        self.device_delta_mib = None
        self._stop = threading.Event()
        self._thread = None

    def _sample(self):
        if not self.available:
            return
        p = process_used_mib(self.pid)
        if p is not None and (self.process_mib is None or p > self.process_mib):
            self.process_mib = p
        u = device_used_mib()
        if u is not None and self._base is not None:
            d = max(0, u - self._base)
            if self.device_delta_mib is None or d > self.device_delta_mib:
                self.device_delta_mib = d

    def _run(self):
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def start(self, pid):
        self.pid = pid
        if self.available:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def stop(self):
        """Stops sampling; the figures are the largest seen until now."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2 * SMI_TIMEOUT_S)
            self._thread = None

    def record(self):
        return {"peak_process_mib": self.process_mib, "peak_device_delta_mib": self.device_delta_mib}
