"""Helpers of bench/multi_gpu_run.sh, against running streamfeed ranks on
127.0.0.1 (standard library and numpy only):

  samples PORT...                  samples trained so far, summed over the ranks (GET /v1/stats)
  checksum PORT...                 sha256 of each rank's parameters and optimizer state (GET
                                   /v1/checkpoint's tensors, BatchNorm's running statistics
                                   digested apart) and whether all are equal; exit 1 when the
                                   parameters or optimizer state differ.
                                   First waits (up to 120 s) until no rank has a batch queued or in
                                   flight and every rank is at the same step: a rank still
                                   training its queued batches is steps ahead of one that is not
  diff PORT...                     the tensors (parameters, optimizer state, buffers) whose
                                   bytes differ between rank 0 and each other rank, in the
                                   checkpoint's order, with their largest absolute difference
                                   (JSON); exit 1 when any parameter or optimizer tensor differs
  ranks PORT...                    per rank (JSON list): the share of the last 10 s the GPU
                                   computed, the rounds it joined with no batch of its own
                                   (starved of input), and its all-reduces' rounds and mean
                                   seconds, and its stages' median and p99 seconds, as GET
                                   /v1/stats reports them
  losses --two P0,P1 --one P --batch B --steps N
                                   posts the same learnable batches as 2 ranks x B (one batch to
                                   each, at once) and as 1 rank x 2B, and prints both loss
                                   curves and their largest difference (JSON)
"""
import hashlib
import json
import struct
import sys
import threading
import time
import urllib.request

import numpy as np


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=600) as r:
        return r.read()


def post_batch(port, images, labels):
    """images uint8 [n,h,w,3] (NHWC), labels int64 [n], as a safetensors body; waits for the step."""
    tensors = [("images", "U8", list(images.shape), images.tobytes()), ("labels", "I64", list(labels.shape),
                                                                        labels.astype("<i8").tobytes())]
    header, off = {"__metadata__": {"layout": "NHWC"}}, 0
    for name, dt, shape, data in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    body = struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors)
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/batches?wait=1", data=body, method="POST",
                                 headers={"Content-Type": "application/vnd.safetensors"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def quiet_step(ports, timeout=120.0):
    """The step every rank reports once no rank has work queued or in flight
    (twice in a row, 0.2 s apart); None if that does not happen in time."""
    end, last = time.monotonic() + timeout, None
    while time.monotonic() < end:
        now = []
        for p in ports:
            st = json.loads(get(p, "/v1/stats"))
            ring = st["ring"]
            busy = ring["filling"] + ring["ready"] + ring["in_flight"]
            now.append(None if busy else st["steps_total"])
        steps = {json.loads(get(p, "/v1/model"))["step"] for p in ports}
        key = (tuple(now), tuple(sorted(steps)))
        if None not in now and len(steps) == 1 and key == last:
            return steps.pop()
        last = key
        time.sleep(0.2)
    return None


# BatchNorm's running statistics: with distributed.batchnorm broadcast (the
# default, PyTorch DDP's broadcast_buffers) every rank holds rank 0's; with
# local each rank keeps its own. They are digested apart so that a report
# says which of the two differs; parameters and optimizer state must not.
BUFFER_SUFFIXES = (".running_mean", ".running_var", ".num_batches_tracked")


def digests(ckpt):
    """sha256 of the parameters and optimizer state, and of the buffers, of a
    checkpoint (safetensors), each over its tensors in name order."""
    n = struct.unpack("<Q", ckpt[:8])[0]
    header, data = json.loads(ckpt[8:8 + n]), ckpt[8 + n:]
    state, buffers = hashlib.sha256(), hashlib.sha256()
    for name in sorted(k for k in header if k != "__metadata__"):
        a, b = header[name]["data_offsets"]
        h = buffers if name.endswith(BUFFER_SUFFIXES) else state
        h.update(name.encode() + b"\0" + data[a:b])
    return state.hexdigest(), buffers.hexdigest()


def tensors(ckpt):
    """name -> float64 array of a checkpoint's tensors, in the file's order."""
    n = struct.unpack("<Q", ckpt[:8])[0]
    header, data = json.loads(ckpt[8:8 + n]), ckpt[8 + n:]
    kinds = {"F32": "<f4", "BF16": None, "I64": "<i8", "F16": "<f2"}
    out = {}
    for name, t in sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                          key=lambda kv: kv[1]["data_offsets"][0]):
        a, b = t["data_offsets"]
        if t["dtype"] == "BF16":
            raw = np.frombuffer(data[a:b], dtype="<u2").astype(np.uint32) << 16
            out[name] = raw.view(np.float32).astype(np.float64)
        else:
            out[name] = np.frombuffer(data[a:b], dtype=kinds[t["dtype"]]).astype(np.float64)
    return out


def differing(ports):
    """Per other rank, the tensors that differ from rank 0's."""
    ref = tensors(get(ports[0], "/v1/checkpoint"))
    report, bad = [], False
    for p in ports[1:]:
        other = tensors(get(p, "/v1/checkpoint"))
        rows = []
        for name, a in ref.items():
            b = other.get(name)
            if b is None or b.shape != a.shape or not np.array_equal(a, b):
                d = float(np.max(np.abs(a - b))) if b is not None and b.shape == a.shape else None
                n = int(np.count_nonzero(a != b)) if b is not None and b.shape == a.shape else None
                rows.append({"tensor": name, "max_abs_diff": d, "elements_differing": n, "elements": int(a.size)})
                bad |= not name.endswith(BUFFER_SUFFIXES)
        report.append({"port": int(p), "differing": len(rows), "first": rows[:12], "last": rows[-4:]})
    return report, bad


def learnable(rng, n, side):
    """A bright square whose position is the class (as the tests' learnable batches)."""
    labels = rng.integers(0, 10, n)
    images = rng.integers(0, 20, (n, side, side, 3), dtype=np.uint8)
    cell = side // 4
    for i, k in enumerate(labels):
        r, c = divmod(int(k), 4)
        images[i, r * cell + 2:(r + 1) * cell - 2, c * cell + 2:(c + 1) * cell - 2, :] = 100
    return images, labels


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "samples":
        print(sum(json.loads(get(p, "/v1/stats"))["samples_total"] for p in args))
    elif cmd == "ranks":
        out = []
        for p in args:
            st = json.loads(get(p, "/v1/stats"))
            d = st.get("distributed", {})
            out.append({"port": int(p), "rank": st.get("rank", 0), "compute_busy_ratio": st.get("compute_busy_ratio"),
                        "empty_contributions": d.get("empty_contributions", 0),
                        "allreduce_rounds": d.get("allreduce_rounds", 0),
                        "allreduce_mean_s": d.get("allreduce_mean_s", 0), "ring": st.get("ring"),
                        "stages": st.get("stages")})
        print(json.dumps(out))
    elif cmd == "checksum":
        step = quiet_step(args)
        pairs = [digests(get(p, "/v1/checkpoint")) for p in args]
        sums = [a for a, _ in pairs]
        equal = step is not None and len(set(sums)) == 1
        print(json.dumps({"ranks": len(sums), "step": step, "sha256": sums, "identical": equal,
                          "batchnorm_statistics_identical": len({b for _, b in pairs}) == 1}))
        sys.exit(0 if equal else 1)
    elif cmd == "diff":
        step = quiet_step(args)
        report, bad = differing(args)
        print(json.dumps({"step": step, "ranks": report}))
        sys.exit(1 if bad or step is None else 0)
    elif cmd == "losses":
        opts = dict(zip(args[::2], args[1::2]))
        two = [int(p) for p in opts["--two"].split(",")]
        one, b, steps = int(opts["--one"]), int(opts["--batch"]), int(opts["--steps"])
        side = int(opts.get("--side", "32"))
        rng = np.random.default_rng(7)
        rounds = [(learnable(rng, b, side), learnable(rng, b, side)) for _ in range(steps)]
        curve2, curve1 = [], []
        for a, c in rounds:
            out = [None, None]
            ts = [threading.Thread(target=lambda i, x: out.__setitem__(i, post_batch(two[i], *x)), args=(i, x))
                  for i, x in enumerate((a, c))]
            [t.start() for t in ts]
            [t.join() for t in ts]
            curve2.append((out[0]["loss"] + out[1]["loss"]) / 2)
            r = post_batch(one, np.concatenate([a[0], c[0]]), np.concatenate([a[1], c[1]]))
            curve1.append(r["loss"])
        diff = float(np.max(np.abs(np.array(curve2) - np.array(curve1))))
        print(json.dumps({"two_ranks_x_b": curve2, "one_rank_x_2b": curve1, "max_abs_diff": diff, "batch": b}))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
