"""Checkpoints between streamfeed and PyTorch, checked end to end on the GPU
host (where PyTorch is). For each preset and backend it starts the service,
trains a few steps, and checks:

  1. service -> PyTorch. GET /v1/checkpoint?optimizer=false loads into the
     PyTorch definition of the preset with
     model.load_state_dict(safetensors.torch.load_file(path)) -- strict, no
     conversion -- and PyTorch's forward output on an input equals the
     service's on the same input.
  2. PyTorch -> service. safetensors.torch.save_file(model.state_dict()) of a
     freshly initialised PyTorch model loads into the service (PUT
     /v1/checkpoint, and POST /v1/checkpoint/load by path); GET gives the same
     tensors back bit for bit, and the forward outputs agree again.
  3. Optimizer state. The optim.<name>.momentum_buffer tensors are SGD's
     momentum_buffer of each parameter: one torch.optim.SGD step from the
     service's state (parameters and momentum) on the same batch gives the
     service's next parameters and momentum, and the same loss.

How the service's forward output is read. The service has no inference
endpoint, and adding one for a test would test the test. Instead: with the
learning rate, momentum and weight decay set to 0 (PATCH /v1/config, hot), a
training step leaves every parameter exactly as it was (the script checks
that bit for bit) and reports the batch's cross-entropy. Posting one image
once per class k, labelled k, gives -log_softmax(logits)[k] for every k: the
service's whole log-softmax output, which fixes its logits up to a constant
that softmax ignores. The input the model sees is what POST /v1/transform
returns for the same image (the pipeline here is to_dtype alone, so the same
bytes augment identically in both paths), and that float tensor is what
PyTorch gets. Both sides compute in fp32: model.precision=fp32 in the service,
TF32 off in PyTorch.

    python3 bench/torch_interop.py --bin build/streamfeed --json build/torch_interop.json

Options: --presets tiny,seed-classifier  --backends auto,ref (ref is slow on
seed-classifier: it runs tiny only unless --ref-all)  --device cuda|cpu.
--numpy checks 1 and 2 with a small numpy forward instead of PyTorch (a
self-check of this script on a machine without PyTorch; check 3 is skipped).
Exit status 0 when every check passed.
"""
import argparse
import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import requests
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

HERE = Path(__file__).resolve().parent
AUG = '[{"op":"to_dtype","scale":0.00392157}]'
LR, MOMENTUM = 0.01, 0.9
SAFETENSORS = {"Content-Type": "application/vnd.safetensors"}


# ---- the service ---------------------------------------------------------------------


class Service:
    def __init__(self, binary, preset, backend, ckdir, log):
        args = [binary, "--http.port", "0", "--http.host", "127.0.0.1", "--model.preset", preset,
                "--pipeline.backend", backend, "--model.precision", "fp32", "--augment.pipeline", AUG,
                "--optim.lr", str(LR), "--optim.momentum", str(MOMENTUM), "--model.max_batch", "16",
                "--checkpoint.dir", str(ckdir), "--checkpoint.on_shutdown", "false",
                "--log.requests", "false"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMFEED_")}
        self.log = open(log, "w+b")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, env=env)
        line, deadline = b"", time.monotonic() + 120
        while b"\n" not in line and time.monotonic() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [], 1)
            if r:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                line += chunk
        m = re.search(rb"listening on http://[^:]+:(\d+)", line)
        if not m:
            self.log.seek(0)
            raise SystemExit(f"the service did not start: {self.log.read().decode()[-2000:]}")
        self.url = f"http://127.0.0.1:{int(m.group(1))}"
        self.http = requests.Session()
        self.model = self.get("/v1/model").json()

    def get(self, path, **kw):
        r = self.http.get(self.url + path, timeout=600, **kw)
        r.raise_for_status()
        return r

    def patch(self, patch):
        r = self.http.patch(self.url + "/v1/config", data=json.dumps(patch), timeout=60,
                            headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text

    def post_batch(self, images, labels):
        body = st_save({"images": np.ascontiguousarray(images), "labels": np.asarray(labels, np.int64)})
        r = self.http.post(self.url + "/v1/batches?wait=1", data=body, headers=SAFETENSORS, timeout=600)
        assert r.status_code == 200, r.text
        b = r.json()
        assert b["state"] == "done", b
        return b

    def transform(self, images):
        r = self.http.post(self.url + "/v1/transform", data=st_save({"images": np.ascontiguousarray(images)}),
                           headers=SAFETENSORS, timeout=600)
        assert r.status_code == 200, r.text
        return st_load(r.content)["images"]

    def checkpoint(self, optimizer=True):
        return self.get("/v1/checkpoint" + ("" if optimizer else "?optimizer=false")).content

    def put(self, blob):
        r = self.http.put(self.url + "/v1/checkpoint", data=blob, headers=SAFETENSORS, timeout=600)
        assert r.status_code == 200, r.text
        return r.json()

    def load(self, path):
        r = self.http.post(self.url + "/v1/checkpoint/load", json={"path": path}, timeout=600)
        assert r.status_code == 200, r.text
        return r.json()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.log.close()
        return rc


def tensors(blob):
    """{name: array} without __metadata__ (whose step and config hash move)."""
    return st_load(blob)


def same_tensors(a, b):
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and
                                        a[k].tobytes() == b[k].tobytes() for k in a)


def service_log_softmax(svc, images, classes):
    """The service's log-softmax output on images [M,H,W,C] uint8, read from
    the losses of lr-0 steps (see the module comment)."""
    svc.patch({"optim": {"lr": 0, "momentum": 0, "weight_decay": 0}})
    before = tensors(svc.checkpoint(optimizer=False))
    out = np.zeros((len(images), classes), np.float64)
    for i in range(len(images)):
        for k in range(classes):
            out[i, k] = -svc.post_batch(images[i:i + 1], [k])["loss"]
    after = tensors(svc.checkpoint(optimizer=False))
    assert same_tensors(before, after), "an lr-0 step changed the parameters"
    svc.patch({"optim": {"lr": LR, "momentum": MOMENTUM}})
    return out


# ---- PyTorch -----------------------------------------------------------------------------


def torch_model(preset):
    """The PyTorch definition of the preset: W1 is bench/pytorch_w1.py's own."""
    import torch.nn as nn
    if preset == "seed-classifier":
        sys.path.insert(0, str(HERE))
        from pytorch_w1 import make_model
        return make_model()
    if preset == "tiny":
        layers, c = [nn.Conv2d(3, 4, 1), nn.ReLU()], 4
        for _ in range(3):
            layers += [nn.Conv2d(c, 2 * c, 2, stride=2), nn.ReLU()]
            c *= 2
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(32 * 4 * 4, 10))
    raise SystemExit(f"no PyTorch definition for preset {preset}")


class TorchSide:
    def __init__(self, preset, device):
        import torch
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        self.torch, self.preset, self.device = torch, preset, device

    def load(self, path):
        """model.load_state_dict(safetensors.torch.load_file(path)), strict."""
        from safetensors.torch import load_file
        model = torch_model(self.preset)
        result = model.load_state_dict(load_file(path))
        assert not result.missing_keys and not result.unexpected_keys, result
        return model.to(self.device).eval()

    def fresh(self, seed, path):
        from safetensors.torch import save_file
        self.torch.manual_seed(seed)
        model = torch_model(self.preset)
        save_file(model.state_dict(), path)
        # nn.Module.to() moves in place: take the host copy first.
        host = {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}
        return model.to(self.device).eval(), host

    def log_softmax(self, model, x):
        torch = self.torch
        with torch.no_grad():
            y = model(torch.from_numpy(x).to(self.device))
            return torch.log_softmax(y.double(), dim=1).cpu().numpy()

    def sgd_step(self, state, x, labels):
        """One torch.optim.SGD step from a full checkpoint's state: returns
        (loss, {name: new param}, {name: new momentum})."""
        import torch.nn.functional as F
        torch = self.torch
        model = torch_model(self.preset)
        model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()
                               if not k.startswith("optim.")})
        model = model.to(self.device).train()
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        for name, p in model.named_parameters():
            opt.state[p]["momentum_buffer"] = torch.from_numpy(
                state[f"optim.{name}.momentum_buffer"].copy()).to(self.device)
        loss = F.cross_entropy(model(torch.from_numpy(x).to(self.device)),
                               torch.from_numpy(np.asarray(labels, np.int64)).to(self.device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        params = {n: p.detach().cpu().numpy() for n, p in model.named_parameters()}
        moms = {n: opt.state[p]["momentum_buffer"].cpu().numpy() for n, p in model.named_parameters()}
        return float(loss), params, moms


class NumpySide:
    """The same checks 1 and 2 without PyTorch: a numpy forward of the layer
    list in the checkpoint's metadata (convolutions with stride = kernel, no
    padding, as in the presets). For checking this script, not the interop."""

    def __init__(self, preset, device):
        self.spec = None

    def load(self, path):
        blob = Path(path).read_bytes()
        n = int.from_bytes(blob[:8], "little")
        meta = json.loads(blob[8:8 + n]).get("__metadata__", {})
        if "model" in meta:
            self.spec = json.loads(meta["model"])
        return tensors(blob)

    def fresh(self, seed, path):
        rng = np.random.default_rng(seed)
        sd = {}
        for name, v in self.current.items():
            sd[name] = (rng.uniform(-1, 1, v.shape) / math.sqrt(max(1, v[0].size))).astype(np.float32)
        Path(path).write_bytes(st_save(sd))
        return sd, sd

    def log_softmax(self, sd, x):
        h = x.astype(np.float64)
        for layer in self.spec["layers"]:
            t, name = layer["type"], layer["name"]
            if t == "conv2d":
                k = layer["k"]
                assert layer["stride"] == k and layer["pad"] == 0, "numpy side: stride must equal k"
                w, b = sd[f"{name}.weight"].astype(np.float64), sd[f"{name}.bias"].astype(np.float64)
                n, c, hh, ww = h.shape
                p = h.reshape(n, c, hh // k, k, ww // k, k)
                h = np.einsum("ncxiyj,ocij->noxy", p, w) + b[None, :, None, None]
            elif t == "relu":
                h = np.maximum(h, 0)
            elif t == "flatten":
                h = h.reshape(h.shape[0], -1)
            elif t == "linear":
                h = h @ sd[f"{name}.weight"].astype(np.float64).T + sd[f"{name}.bias"]
        h = h - h.max(axis=1, keepdims=True)
        return h - np.log(np.exp(h).sum(axis=1, keepdims=True))


# ---- the checks ---------------------------------------------------------------------------


def run_one(args, preset, backend, work):
    side_cls = NumpySide if args.numpy else TorchSide
    ckdir = work / f"ck-{preset}-{backend}"
    ckdir.mkdir()
    svc = Service(args.bin, preset, backend, ckdir, work / f"service-{preset}-{backend}.log")
    res = {"preset": preset, "backend_asked": backend, "backend": svc.model["backend"],
           "params": svc.model["params"], "checks": {}}
    ok = True
    try:
        c, h, w = svc.model["input"]
        classes = svc.model["classes"]
        rng = np.random.default_rng(args.seed)
        # A few steps, so the state is neither the initialisation nor free of momentum.
        for _ in range(args.steps):
            svc.post_batch(rng.integers(0, 256, (8, h, w, c), dtype=np.uint8), rng.integers(0, classes, 8))
        images = rng.integers(0, 256, (args.images, h, w, c), dtype=np.uint8)
        x = svc.transform(images)
        side = side_cls(preset, args.device)

        # 1. service -> PyTorch
        p1 = ckdir / "from_service.safetensors"
        p1.write_bytes(svc.checkpoint(optimizer=False))
        model = side.load(str(p1))
        if args.numpy:
            side.current = model  # the shapes for fresh()
        ref = side.log_softmax(model, x)
        got = service_log_softmax(svc, images, classes)
        err = float(np.abs(ref - got).max())
        passed = err <= args.tol_forward and bool((ref.argmax(1) == got.argmax(1)).all())
        res["checks"]["service_to_torch"] = {"load_state_dict": "strict, ok", "max_abs_log_softmax_diff": err,
                                             "pass": passed}
        ok &= passed

        # 2. PyTorch -> service
        p2 = ckdir / "from_torch.safetensors"
        model2, sd2 = side.fresh(args.seed + 1, str(p2))
        put = svc.put(p2.read_bytes())
        back = tensors(svc.checkpoint(optimizer=False))
        bitwise = same_tensors(back, {k: np.ascontiguousarray(v) for k, v in sd2.items()})
        ref2 = side.log_softmax(model2, x)
        got2 = service_log_softmax(svc, images, classes)
        err2 = float(np.abs(ref2 - got2).max())
        svc.post_batch(images[:1], [0])  # move the state, then load the file by path
        svc.load(p2.name)
        by_path = same_tensors(tensors(svc.checkpoint(optimizer=False)), back)
        passed = bitwise and by_path and err2 <= args.tol_forward and put["optimizer"] is False
        res["checks"]["torch_to_service"] = {"put": put, "bit_identical_after_put": bitwise,
                                             "bit_identical_after_load_by_path": by_path,
                                             "max_abs_log_softmax_diff": err2, "pass": passed}
        ok &= passed

        # 3. optimizer state: one SGD step on both sides from the same state
        if not args.numpy:
            for _ in range(2):  # momentum != 0 from here
                svc.post_batch(rng.integers(0, 256, (8, h, w, c), dtype=np.uint8), rng.integers(0, classes, 8))
            s0 = tensors(svc.checkpoint())
            bx = rng.integers(0, 256, (8, h, w, c), dtype=np.uint8)
            by = rng.integers(0, classes, 8)
            loss_s = svc.post_batch(bx, by)["loss"]
            s1 = tensors(svc.checkpoint())
            loss_t, p_t, m_t = side.sgd_step(s0, svc.transform(bx), by)

            def rel(a, b):
                return float(np.linalg.norm((a - b).ravel()) / max(np.linalg.norm(b.ravel()), 1e-30))

            # The momentum buffers carry the gradient (buf' = 0.9 buf + g) without
            # the cancellation of p' - p in fp32, so they are the tight check;
            # the update p' - p is reported for information.
            mom = max(rel(m_t[n], s1[f"optim.{n}.momentum_buffer"]) for n in m_t)
            par = max(rel(p_t[n], s1[n]) for n in p_t)
            upd = max(rel(p_t[n].astype(np.float64) - s0[n], s1[n].astype(np.float64) - s0[n]) for n in p_t)
            moved = all(not np.array_equal(s1[n], s0[n]) for n in p_t)
            step_ok = int(s1["optim.step"]) == int(s0["optim.step"]) + 1
            loss_err = abs(loss_t - loss_s)
            passed = (mom <= args.tol_step and par <= 1e-5 and moved and step_ok and
                      loss_err <= args.tol_forward)
            res["checks"]["sgd_step"] = {"loss_service": loss_s, "loss_torch": loss_t, "loss_abs_diff": loss_err,
                                         "max_rel_momentum_diff": mom, "max_rel_param_diff": par,
                                         "max_rel_update_diff_info": upd, "every_param_moved": moved,
                                         "optim_step_advanced": step_ok, "pass": passed}
            ok &= passed
    except AssertionError as e:
        res["error"] = str(e)
        ok = False
    finally:
        res["service_exit"] = svc.stop()
    res["pass"] = bool(ok) and res["service_exit"] == 0
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/streamfeed")
    ap.add_argument("--presets", default="tiny,seed-classifier")
    ap.add_argument("--backends", default="auto,ref")
    ap.add_argument("--ref-all", action="store_true", help="also run seed-classifier on the ref backend (slow)")
    ap.add_argument("--device", default=None, help="PyTorch device (default: cuda when available)")
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol-forward", type=float, default=2e-3, help="max |log_softmax difference|")
    ap.add_argument("--tol-step", type=float, default=2e-3, help="max relative difference of the momentum after an SGD step")
    ap.add_argument("--numpy", action="store_true", help="self-check without PyTorch (checks 1 and 2)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not args.numpy and args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    results = []
    with tempfile.TemporaryDirectory(prefix="torch_interop-") as tmp:
        work = Path(tmp)
        for preset in args.presets.split(","):
            for backend in args.backends.split(","):
                if backend == "ref" and preset != "tiny" and not args.ref_all:
                    continue
                t0 = time.monotonic()
                r = run_one(args, preset, backend, work)
                r["seconds"] = round(time.monotonic() - t0, 1)
                results.append(r)
                print(json.dumps(r, indent=1, default=str), flush=True)
                if not r["pass"]:
                    for log in work.glob(f"service-{preset}-{backend}.log"):
                        print(log.read_text()[-3000:], file=sys.stderr)
    report = {"device": args.device, "numpy": args.numpy, "results": results,
              "pass": all(r["pass"] for r in results)}
    print("torch_interop:", "PASS" if report["pass"] else "FAIL",
          " ".join(f"{r['preset']}/{r['backend']}={'ok' if r['pass'] else 'FAIL'}" for r in results))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
