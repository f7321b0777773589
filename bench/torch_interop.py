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

The presets and their PyTorch modules: tiny and seed-classifier (W1,
bench/pytorch_w1.py's nn.Sequential), seed-encdec (W2: a module with the
nn.Sequential members `encoder` and `decoder` of bench/pytorch_w2.py, so
"encoder.0.weight" ... "decoder.8.bias"), resnet18 (W3:
torchvision.models.resnet18(num_classes=10), BatchNorm buffers included).

seed-encdec segments: its labels are [N,256,256] (u8 here), the loss the mean
cross-entropy over the pixels, so an lr-0 step on one image labelled k
everywhere reads -mean over pixels of log_softmax(logits)[k]; both sides
compare that [images, classes] matrix (PyTorch: log_softmax(y, 1).mean((2,3))).

resnet18 has batchnorm. A training step normalises with the batch's
statistics and moves the running statistics (and num_batches_tracked) even at
lr 0, so for it: the lr-0 check compares the parameters only; the outputs
compared in checks 1 and 2 are training-mode outputs (one image per step,
batch statistics), and PyTorch replays the same forwards in train() mode, so
its running_mean/running_var/num_batches_tracked after them must equal the
service's (relative difference <= --tol-buffers, the counter exactly). Check
2 writes a PyTorch model whose BatchNorm weights, biases and running
statistics are random (num_batches_tracked 7), so the buffers travel too, and
check 3 compares the running statistics after the SGD step as well. With
batchnorm the fp32 gradient is only good to a few 1e-3 (PyTorch's own fp32
step differs from its fp64 step by that much at batch 8), so check 3 compares
the momentum with --tol-step-bn instead of --tol-step, reports the distance of
both fp32 steps to PyTorch's fp64 step, and checks that the service's update
follows its own momentum exactly (p' = p - lr * buf').
  4. eval mode (models with batchnorm; --no-eval-check skips it). The service
     runs batchnorm in eval mode (the running statistics) only in layers
     frozen by model.freeze, which must be a leading run of layers under one
     name prefix. So a second service runs the same layer list (from the
     checkpoint's __metadata__.model) with every layer before the final
     flatten renamed "backbone.<name>" and --model.freeze backbone.; it takes
     the first service's checkpoint (after check 1, trained running
     statistics) with the same renaming by PUT, bit for bit; its lr-0 losses
     are then the eval-mode log-softmax, compared with the torchvision module
     strict-loaded from the original checkpoint in eval() mode. Its frozen
     running statistics must not move.

  5. A training trajectory (--trajectory; every preset without batchnorm
     unless --trajectory-all): from the same weights, 20 SGD steps (momentum,
     weight decay) with linear warmup + cosine (LinearLR, CosineAnnealingLR,
     SequentialLR), clip_grad_norm_ and label smoothing, on the same batches,
     in the service and in PyTorch; each step's loss must agree within
     --tol-trajectory (relative, 1e-4: fp32 on both sides). Then an eval
     batch (?mode=eval) against PyTorch's eval() under torch.no_grad(): loss,
     top-1 and top-5 (torch.topk).
  6. Eval throughput (--eval-throughput PRESET, e.g. resnet18 for W3): the
     service's forward-only eval batches against its own training batches,
     and PyTorch's torch.no_grad() eval and training step, samples/s in the
     same run, with --throughput-batch and --throughput-batches.

    python3 bench/torch_interop.py --bin build/streamfeed --json build/torch_interop.json
    python3 bench/torch_interop.py --preset tiny --backends ref --trajectory-only   # the CPU build
    python3 bench/torch_interop.py --preset resnet18 --backends auto --trajectory-only --trajectory-all \
        --eval-throughput resnet18

Options: --preset tiny,seed-classifier,seed-encdec,resnet18 (the default; a
comma list; --presets is the same option)  --backends auto,ref (ref is slow on
the larger presets: it runs tiny only unless --ref-all)  --device cuda|cpu.
--numpy checks 1 and 2 with a small numpy forward instead of PyTorch (a
self-check of this script on a machine without PyTorch; check 3 is skipped,
and so are the presets with batchnorm).
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
PRESETS = "tiny,seed-classifier,seed-encdec,resnet18"
BUFFER_SUFFIXES = (".running_mean", ".running_var", ".num_batches_tracked")
FROZEN_PREFIX = "backbone."  # check 4: the renamed trunk


# ---- the service ---------------------------------------------------------------------


class Service:
    def __init__(self, binary, model_args, backend, ckdir, log, extra=()):
        """model_args: ["--model.preset", name], or a --model.spec and its options.
        extra: more flags, after (so instead of) these."""
        args = [binary, "--http.port", "0", "--http.host", "127.0.0.1", *model_args,
                "--pipeline.backend", backend, "--model.precision", "fp32", "--augment.pipeline", AUG,
                "--augment.eval_pipeline", AUG,
                "--optim.lr", str(LR), "--optim.momentum", str(MOMENTUM), "--model.max_batch", "16",
                "--checkpoint.dir", str(ckdir), "--checkpoint.on_shutdown", "false",
                "--log.requests", "false", *extra]
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
        # A segmentation model's last output is [classes,H,W] with H*W > 1; its labels are [N,H,W].
        last = self.model["layers"][-1]["out"]
        self.segmentation = len(last) == 3 and last[1] * last[2] > 1
        self.label_hw = tuple(last[1:]) if self.segmentation else ()
        self.batchnorm = any(layer["type"] == "batchnorm2d" for layer in self.model["layers"])

    def labels(self, values):
        """Labels for len(values) images: [N] int64 for a classifier; for a
        segmentation model [N,H,W] u8, every pixel of image i labelled values[i]."""
        if not self.segmentation:
            return np.asarray(values, np.int64)
        return np.broadcast_to(np.asarray(values, np.uint8)[:, None, None], (len(values), *self.label_hw)).copy()

    def random_labels(self, rng, n, classes):
        if not self.segmentation:
            return rng.integers(0, classes, n)
        return rng.integers(0, classes, (n, *self.label_hw)).astype(np.uint8)

    def get(self, path, **kw):
        r = self.http.get(self.url + path, timeout=600, **kw)
        r.raise_for_status()
        return r

    def patch(self, patch):
        r = self.http.patch(self.url + "/v1/config", data=json.dumps(patch), timeout=60,
                            headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text

    def post_batch(self, images, labels):
        labels = np.asarray(labels)
        if labels.dtype != np.uint8:  # u8 stays u8 (per-pixel labels); class indices go as int64
            labels = labels.astype(np.int64)
        body = st_save({"images": np.ascontiguousarray(images), "labels": np.ascontiguousarray(labels)})
        r = self.http.post(self.url + "/v1/batches?wait=1", data=body, headers=SAFETENSORS, timeout=600)
        assert r.status_code == 200, r.text
        b = r.json()
        assert b["state"] == "done", b
        return b

    def post_eval(self, images, labels):
        body = st_save({"images": np.ascontiguousarray(images),
                        "labels": np.ascontiguousarray(np.asarray(labels, np.int64))})
        r = self.http.post(self.url + "/v1/batches?wait=1&mode=eval&eval=interop", data=body, headers=SAFETENSORS,
                           timeout=600)
        assert r.status_code == 200, r.text
        b = r.json()
        assert b["state"] == "done" and b["kind"] == "eval", b
        return b

    def post_async(self, body, query=""):
        """Queues a batch (202) and returns its id; a full ring suspends the upload."""
        r = self.http.post(self.url + "/v1/batches" + query, data=body, headers=SAFETENSORS, timeout=600)
        assert r.status_code == 202, r.text
        return r.json()["id"]

    def wait_done(self, bid):
        while True:
            b = self.get(f"/v1/batches/{bid}").json()
            if b["state"] in ("done", "failed"):
                assert b["state"] == "done", b
                return b
            time.sleep(0.002)

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


def differing(a, b, limit=5):
    """Names of the tensors that are not bit-identical (or missing on one side)."""
    names = [k for k in sorted(set(a) | set(b)) if k not in a or k not in b or a[k].dtype != b[k].dtype or
             a[k].shape != b[k].shape or a[k].tobytes() != b[k].tobytes()]
    return names[:limit]


def is_buffer(name):
    return name.endswith(BUFFER_SUFFIXES)


def params_of(sd):
    """The state_dict without the batchnorm buffers (and optimizer state)."""
    return {k: v for k, v in sd.items() if not is_buffer(k) and not k.startswith("optim.")}


def buffers_of(sd):
    return {k: v for k, v in sd.items() if is_buffer(k)}


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm((a - b).ravel()) / max(np.linalg.norm(b.ravel()), 1e-30))


def compare_buffers(mine, service):
    """(max relative difference of the running statistics, whether every
    num_batches_tracked is equal, {name: (mine, service)} of those that differ)."""
    assert mine.keys() == service.keys(), sorted(set(mine) ^ set(service))[:10]
    stats = [rel(mine[k], service[k]) for k in mine if not k.endswith(".num_batches_tracked")]
    nbt = {k: (int(mine[k]), int(service[k])) for k in mine
           if k.endswith(".num_batches_tracked") and int(mine[k]) != int(service[k])}
    return max(stats, default=0.0), not nbt, dict(list(nbt.items())[:3])


def argmax_agrees(ref, got, margin):
    """argmax equal on every row whose top two values in ref differ by more than margin."""
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > margin
    return bool((ref.argmax(1) == got.argmax(1))[clear].all())


def service_log_softmax(svc, images, classes):
    """The service's log-softmax output on images [M,H,W,C] uint8, read from
    the losses of lr-0 steps (see the module comment); for a segmentation
    model its mean over the pixels. Returns (output [M,classes], state before,
    state after: checkpoints without the optimizer). The parameters must not
    move; batchnorm running statistics in training mode do."""
    svc.patch({"optim": {"lr": 0, "momentum": 0, "weight_decay": 0}})
    before = tensors(svc.checkpoint(optimizer=False))
    out = np.zeros((len(images), classes), np.float64)
    for i in range(len(images)):
        for k in range(classes):
            out[i, k] = -svc.post_batch(images[i:i + 1], svc.labels([k]))["loss"]
    after = tensors(svc.checkpoint(optimizer=False))
    assert same_tensors(params_of(before), params_of(after)), "an lr-0 step changed the parameters"
    svc.patch({"optim": {"lr": LR, "momentum": MOMENTUM}})
    return out, before, after


# ---- PyTorch -----------------------------------------------------------------------------


def torch_model(preset):
    """The PyTorch definition of the preset: W1 is bench/pytorch_w1.py's own,
    W2 bench/pytorch_w2.py's encoder and decoder as the members of one module,
    W3 torchvision's resnet18."""
    import torch.nn as nn
    if preset == "seed-classifier":
        sys.path.insert(0, str(HERE))
        from pytorch_w1 import make_model
        return make_model()
    if preset == "seed-encdec":
        sys.path.insert(0, str(HERE))
        from pytorch_w2 import decoder, encoder

        class EncDec(nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder, self.decoder = encoder(), decoder()

            def forward(self, x):
                return self.decoder(self.encoder(x))

        return EncDec()
    if preset == "resnet18":
        import torchvision
        return torchvision.models.resnet18(num_classes=10)
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
        """model.load_state_dict(safetensors.torch.load_file(path)), strict
        (batchnorm buffers included)."""
        from safetensors.torch import load_file
        model = torch_model(self.preset)
        result = model.load_state_dict(load_file(path), strict=True)
        assert not result.missing_keys and not result.unexpected_keys, result
        return model.to(self.device).eval()

    def fresh(self, seed, path):
        """A freshly initialised model, saved with save_file(model.state_dict()).
        BatchNorm layers get random weights, biases and running statistics and
        num_batches_tracked 7 (the service keeps one counter: equal values
        come back bit for bit), so that check 2 moves the buffers too."""
        from safetensors.torch import save_file
        torch = self.torch
        torch.manual_seed(seed)
        model = torch_model(self.preset)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)
                    m.running_mean.uniform_(-0.2, 0.2)
                    m.running_var.uniform_(0.5, 2.0)
                    m.num_batches_tracked.fill_(7)
        save_file(model.state_dict(), path)
        # nn.Module.to() moves in place: take the host copy first.
        host = {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}
        return model.to(self.device).eval(), host

    def _log_softmax(self, y):
        """log_softmax over the classes; a segmentation output's mean over the pixels."""
        out = self.torch.log_softmax(y.double(), dim=1)
        return (out.mean(dim=(2, 3)) if out.dim() == 4 else out).cpu().numpy()

    def log_softmax(self, model, x):
        """The model's output in its current mode (eval() after load/fresh)."""
        torch = self.torch
        with torch.no_grad():
            return self._log_softmax(model(torch.from_numpy(x).to(self.device)))

    def readout(self, model, x, classes, batchnorm):
        """What service_log_softmax reads, computed here: (log-softmax
        [M,classes], {buffer name: array} after). Without batchnorm, the
        eval-mode output. With it, the service's lr-0 steps run the model in
        training mode on one image at a time, `classes` steps per image: each
        normalises with that image's statistics and moves the running
        statistics; the same forwards in train() mode, in the same order."""
        if not batchnorm:
            return self.log_softmax(model, x), {}
        torch = self.torch
        rows = []
        model.train()
        try:
            with torch.no_grad():
                for i in range(len(x)):
                    xi = torch.from_numpy(x[i:i + 1]).to(self.device)
                    for k in range(classes):
                        y = model(xi)
                        if k == 0:
                            rows.append(self._log_softmax(y))
        finally:
            model.eval()
        bufs = {n: b.detach().cpu().numpy().copy() for n, b in model.named_buffers()}
        return np.concatenate(rows), bufs

    def sgd_step(self, state, x, labels, fp64=False):
        """One torch.optim.SGD step from a full checkpoint's state: returns
        (loss, {name: new param}, {name: new momentum}, {name: buffer after}).
        fp64: the same step in float64 (a reference for the fp32 rounding)."""
        import torch.nn.functional as F
        torch = self.torch
        dt = torch.float64 if fp64 else torch.float32
        model = torch_model(self.preset)
        model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()
                               if not k.startswith("optim.")}, strict=True)
        model = model.to(self.device, dt).train()  # floating point tensors only: the counters stay int64
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        for name, p in model.named_parameters():
            opt.state[p]["momentum_buffer"] = torch.from_numpy(
                state[f"optim.{name}.momentum_buffer"].copy()).to(self.device, dt)
        loss = F.cross_entropy(model(torch.from_numpy(x).to(self.device, dt)),
                               torch.from_numpy(np.asarray(labels, np.int64)).to(self.device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        params = {n: p.detach().cpu().numpy() for n, p in model.named_parameters()}
        moms = {n: opt.state[p]["momentum_buffer"].cpu().numpy() for n, p in model.named_parameters()}
        bufs = {n: b.detach().cpu().numpy() for n, b in model.named_buffers()}
        return float(loss.detach()), params, moms, bufs


class NumpySide:
    """The same checks 1 and 2 without PyTorch: a numpy forward of the layer
    list in the checkpoint's metadata (convolutions and transposed
    convolutions with stride = kernel, no padding, as in the W1/W2 presets; no
    batchnorm). For checking this script, not the interop."""

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
            elif t == "conv_transpose2d":
                k = layer["k"]
                assert layer["stride"] == k and layer.get("pad", 0) == 0, "numpy side: stride must equal k"
                w, b = sd[f"{name}.weight"].astype(np.float64), sd[f"{name}.bias"].astype(np.float64)
                n, _, hh, ww = h.shape
                h = np.einsum("ncxy,coij->noxiyj", h, w).reshape(n, w.shape[1], hh * k, ww * k)
                h = h + b[None, :, None, None]
            elif t == "relu":
                h = np.maximum(h, 0)
            elif t == "flatten":
                h = h.reshape(h.shape[0], -1)
            elif t == "linear":
                h = h @ sd[f"{name}.weight"].astype(np.float64).T + sd[f"{name}.bias"]
            else:
                raise AssertionError(f"numpy side: no {t} layer")
        h = h - h.max(axis=1, keepdims=True)
        h = h - np.log(np.exp(h).sum(axis=1, keepdims=True))
        return h.mean(axis=(2, 3)) if h.ndim == 4 else h

    def readout(self, sd, x, classes, batchnorm):
        assert not batchnorm, "numpy side: no batchnorm"
        return self.log_softmax(sd, x), {}


# ---- the checks ---------------------------------------------------------------------------


def frozen_trunk(spec_json, blob):
    """Check 4's model: the checkpoint's layer list with every layer before
    the last flatten renamed FROZEN_PREFIX + name (inputs named by name
    follow), and the checkpoint's tensors renamed the same way. Returns
    (spec, {name: array})."""
    spec = json.loads(spec_json)
    layers = spec["layers"]
    cut = max(i for i, layer in enumerate(layers) if layer["type"] == "flatten")
    trunk = {layer["name"] for layer in layers[:cut]}
    for layer in layers[:cut]:
        layer["name"] = FROZEN_PREFIX + layer["name"]
        if "inputs" in layer:
            layer["inputs"] = [FROZEN_PREFIX + v if isinstance(v, str) and v in trunk else v
                               for v in layer["inputs"]]
    sd = {(FROZEN_PREFIX + k if k.rsplit(".", 1)[0] in trunk else k): v for k, v in tensors(blob).items()}
    return spec, sd


def metadata(blob):
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + n]).get("__metadata__", {})


def eval_check(args, preset, backend, work, blob, path, side, images, x, classes):
    """Check 4 (see the module comment): the eval-mode output of a service
    whose trunk is frozen against the PyTorch module in eval() mode, both from
    the checkpoint blob (saved at path)."""
    spec, sd = frozen_trunk(metadata(blob)["model"], blob)
    ckdir = work / f"ck-{preset}-{backend}-eval"
    ckdir.mkdir()
    try:
        svc = Service(args.bin, ["--model.spec", json.dumps(spec, separators=(",", ":")),
                                 "--model.freeze", FROZEN_PREFIX], backend, ckdir,
                      work / f"service-{preset}-{backend}-eval.log")
    except SystemExit as e:  # the frozen-trunk model refused: this check fails, the others go on
        return {"error": str(e)[-2000:], "pass": False}
    res = {"backend": svc.model["backend"]}
    ok = True
    try:
        put = svc.put(st_save(sd))
        back = tensors(svc.checkpoint(optimizer=False))
        bitwise = same_tensors(back, sd)
        if not bitwise:
            res["differing_after_put"] = differing(back, sd)
        got, before, after = service_log_softmax(svc, images, classes)
        ref = side.log_softmax(side.load(path), x)  # eval(): the running statistics
        err = float(np.abs(ref - got).max())
        still = {k: v for k, v in buffers_of(after).items() if not k.endswith(".num_batches_tracked")}
        stats_still = same_tensors(still, {k: before[k] for k in still})
        nbt = sorted({int(v) for k, v in after.items() if k.endswith(".num_batches_tracked")})
        nbt0 = sorted({int(v) for k, v in before.items() if k.endswith(".num_batches_tracked")})
        ok = (bitwise and stats_still and err <= args.tol_forward and
              argmax_agrees(ref, got, 0.0) and put["optimizer"] is False)
        res.update({"frozen": FROZEN_PREFIX + "*", "put": put, "bit_identical_after_put": bitwise,
                    "max_abs_log_softmax_diff": err, "frozen_running_stats_unchanged": stats_still,
                    "num_batches_tracked_info": {"before": nbt0, "after_lr0_steps": nbt}})
    except (AssertionError, requests.HTTPError) as e:
        res["error"] = str(e)
        ok = False
    finally:
        res["service_exit"] = svc.stop()
    res["pass"] = bool(ok) and res["service_exit"] == 0
    if not res["pass"]:
        for log in work.glob(f"service-{preset}-{backend}-eval.log"):
            print(log.read_text()[-3000:], file=sys.stderr)
    return res


def run_one(args, preset, backend, work):
    side_cls = NumpySide if args.numpy else TorchSide
    ckdir = work / f"ck-{preset}-{backend}"
    ckdir.mkdir()
    svc = Service(args.bin, ["--model.preset", preset], backend, ckdir, work / f"service-{preset}-{backend}.log")
    res = {"preset": preset, "backend_asked": backend, "backend": svc.model["backend"],
           "params": svc.model["params"], "checks": {}}
    if args.numpy and svc.batchnorm:
        res["skipped"] = "the numpy self-check has no batchnorm forward"
        res["service_exit"] = svc.stop()
        res["pass"] = res["service_exit"] == 0
        return res
    ok = True
    try:
        c, h, w = svc.model["input"]
        classes = svc.model["classes"]
        bn, seg = svc.batchnorm, svc.segmentation
        # Segmentation: a mean over 65536 pixels flattens the classes' differences;
        # argmax is compared only where the top two are clearly apart.
        margin = 2 * args.tol_forward if seg else 0.0
        rng = np.random.default_rng(args.seed)
        # A few steps, so the state is neither the initialisation nor free of momentum.
        for _ in range(args.steps):
            svc.post_batch(rng.integers(0, 256, (8, h, w, c), dtype=np.uint8), svc.random_labels(rng, 8, classes))
        images = rng.integers(0, 256, (args.images, h, w, c), dtype=np.uint8)
        x = svc.transform(images)
        side = side_cls(preset, args.device)

        # 1. service -> PyTorch
        p1 = ckdir / "from_service.safetensors"
        p1.write_bytes(svc.checkpoint(optimizer=False))
        model = side.load(str(p1))
        if args.numpy:
            side.current = model  # the shapes for fresh()
        ref, ref_bufs = side.readout(model, x, classes, bn)
        got, _, after = service_log_softmax(svc, images, classes)
        err = float(np.abs(ref - got).max())
        passed = err <= args.tol_forward and argmax_agrees(ref, got, margin)
        chk = {"load_state_dict": "strict, ok", "max_abs_log_softmax_diff": err}
        if bn:
            stats, nbt_ok, nbt_diff = compare_buffers(ref_bufs, buffers_of(after))
            chk.update({"mode": "train (batch statistics; see the module comment)",
                        "running_stats_max_rel_diff": stats, "num_batches_tracked_equal": nbt_ok})
            if nbt_diff:
                chk["num_batches_tracked_torch_service"] = nbt_diff
            passed = passed and stats <= args.tol_buffers and nbt_ok
        chk["pass"] = passed
        res["checks"]["service_to_torch"] = chk
        ok &= passed

        # 4. eval mode (batchnorm models): a second service with the trunk frozen
        if bn and not args.no_eval_check:
            pe = ckdir / "from_service_after_lr0.safetensors"
            blob = svc.checkpoint(optimizer=False)
            pe.write_bytes(blob)
            r4 = eval_check(args, preset, backend, work, blob, str(pe), side, images, x, classes)
            res["checks"]["eval_mode"] = r4
            ok &= r4["pass"]

        # 2. PyTorch -> service
        p2 = ckdir / "from_torch.safetensors"
        model2, sd2 = side.fresh(args.seed + 1, str(p2))
        put = svc.put(p2.read_bytes())
        back = tensors(svc.checkpoint(optimizer=False))
        # np.asarray, not np.ascontiguousarray: that makes a 0-d num_batches_tracked [1]
        bitwise = same_tensors(back, {k: np.asarray(v, order="C") for k, v in sd2.items()})
        ref2, ref2_bufs = side.readout(model2, x, classes, bn)
        got2, _, after2 = service_log_softmax(svc, images, classes)
        err2 = float(np.abs(ref2 - got2).max())
        svc.post_batch(images[:1], svc.labels([0]))  # move the state, then load the file by path
        svc.load(p2.name)
        by_path = same_tensors(tensors(svc.checkpoint(optimizer=False)), back)
        passed = (bitwise and by_path and err2 <= args.tol_forward and argmax_agrees(ref2, got2, margin) and
                  put["optimizer"] is False)
        chk = {"put": put, "bit_identical_after_put": bitwise, "bit_identical_after_load_by_path": by_path,
               "max_abs_log_softmax_diff": err2}
        if not bitwise:
            chk["differing_after_put"] = differing(back, sd2)
        if bn:
            stats, nbt_ok, nbt_diff = compare_buffers(ref2_bufs, buffers_of(after2))
            chk.update({"mode": "train (batch statistics)", "running_stats_max_rel_diff": stats,
                        "num_batches_tracked_equal": nbt_ok})
            if nbt_diff:
                chk["num_batches_tracked_torch_service"] = nbt_diff
            passed = passed and stats <= args.tol_buffers and nbt_ok
        chk["pass"] = passed
        res["checks"]["torch_to_service"] = chk
        ok &= passed

        # 3. optimizer state: one SGD step on both sides from the same state
        if not args.numpy:
            for _ in range(2):  # momentum != 0 from here
                svc.post_batch(rng.integers(0, 256, (8, h, w, c), dtype=np.uint8),
                               svc.random_labels(rng, 8, classes))
            s0 = tensors(svc.checkpoint())
            bx = rng.integers(0, 256, (8, h, w, c), dtype=np.uint8)
            by = svc.random_labels(rng, 8, classes)
            loss_s = svc.post_batch(bx, by)["loss"]
            s1 = tensors(svc.checkpoint())
            loss_t, p_t, m_t, b_t = side.sgd_step(s0, svc.transform(bx), by)

            # The momentum buffers carry the gradient (buf' = 0.9 buf + g) without
            # the cancellation of p' - p in fp32, so they are the tight check;
            # the update p' - p is reported for information.
            mom, worst = max((rel(m_t[n], s1[f"optim.{n}.momentum_buffer"]), n) for n in m_t)
            par = max(rel(p_t[n], s1[n]) for n in p_t)
            upd = max(rel(p_t[n].astype(np.float64) - s0[n], s1[n].astype(np.float64) - s0[n]) for n in p_t)
            # A parameter whose update is below half an fp32 ulp stays put (seed-encdec's
            # encoder.0: a 1x1 conv whose gradient is a mean over 65536 pixels); so must
            # it in PyTorch's fp32 step from the same state: the two sets must agree.
            still = [n for n in p_t if np.array_equal(s1[n], s0[n])]
            still_t = [n for n in p_t if np.array_equal(p_t[n], s0[n])]
            moved = still == still_t and len(still) < len(p_t)
            step_ok = int(s1["optim.step"]) == int(s0["optim.step"]) + 1
            loss_err = abs(loss_t - loss_s)
            tol_step = args.tol_step_bn if bn else args.tol_step
            passed = mom <= tol_step and moved and step_ok and loss_err <= args.tol_forward
            chk = {"loss_service": loss_s, "loss_torch": loss_t, "loss_abs_diff": loss_err,
                   "max_rel_momentum_diff": mom, "max_rel_momentum_diff_at": worst, "max_rel_param_diff": par,
                   "max_rel_update_diff_info": upd, "every_param_moved": not still,
                   "moved_as_in_torch": moved, "optim_step_advanced": step_ok}
            if still or still_t:
                chk["params_not_moved"] = {"service": still[:5], "torch": still_t[:5]}
            if not bn:
                passed = passed and par <= 1e-5
            else:
                # With batchnorm the fp32 gradient itself is only good to a few 1e-3
                # (PyTorch's fp32 step differs from its fp64 step by that much), so
                # the momentum is compared with --tol-step-bn and the fp64 step is
                # reported; the parameter update must follow the service's own
                # momentum exactly: p' = p - lr * buf'.
                _, _, m64, _ = side.sgd_step(s0, svc.transform(bx), by, fp64=True)
                rule = max(rel(s0[n] - np.float32(LR) * s1[f"optim.{n}.momentum_buffer"], s1[n]) for n in p_t)
                chk.update({"max_rel_momentum_diff_service_vs_fp64": max(
                                rel(s1[f"optim.{n}.momentum_buffer"], m64[n]) for n in m64),
                            "max_rel_momentum_diff_torch_fp32_vs_fp64": max(rel(m_t[n], m64[n]) for n in m64),
                            "max_rel_update_rule_diff": rule})
                passed = passed and rule <= 1e-6
                stats, nbt_ok, nbt_diff = compare_buffers(b_t, buffers_of(s1))
                chk.update({"running_stats_max_rel_diff": stats, "num_batches_tracked_equal": nbt_ok})
                if nbt_diff:
                    chk["num_batches_tracked_torch_service"] = nbt_diff
                passed = passed and stats <= args.tol_buffers and nbt_ok
            chk["pass"] = passed
            res["checks"]["sgd_step"] = chk
            ok &= passed
    except (AssertionError, requests.HTTPError) as e:
        res["error"] = str(e)
        ok = False
    finally:
        res["service_exit"] = svc.stop()
    res["pass"] = bool(ok) and res["service_exit"] == 0
    return res


# ---- 5. the trajectory, and 6. eval throughput --------------------------------------

TRAJ_LR, TRAJ_MOMENTUM, TRAJ_WD = 0.05, 0.9, 1e-4
TRAJ_WARMUP, TRAJ_START, TRAJ_TMAX, TRAJ_ETA = 5, 0.1, 15, 0.001
TRAJ_CLIP, TRAJ_SMOOTHING, TRAJ_STEPS, TRAJ_BATCH = 0.5, 0.1, 20, 8
TRAJ_FLAGS = ["--optim.lr", str(TRAJ_LR), "--optim.momentum", str(TRAJ_MOMENTUM),
              "--optim.weight_decay", str(TRAJ_WD), "--optim.schedule", "cosine",
              "--optim.t_max", str(TRAJ_TMAX), "--optim.eta_min", str(TRAJ_ETA),
              "--optim.warmup_steps", str(TRAJ_WARMUP), "--optim.warmup_start_factor", str(TRAJ_START),
              "--optim.clip_grad_norm", str(TRAJ_CLIP), "--loss.label_smoothing", str(TRAJ_SMOOTHING)]


def trajectory_check(args, preset, backend, work):
    """Check 5: 20 steps of warmup + cosine, clipping and label smoothing from
    the same weights, per-step loss against PyTorch; then one eval batch."""
    import torch
    import torch.nn.functional as F
    ckdir = work / f"ck-traj-{preset}-{backend}"
    ckdir.mkdir()
    svc = Service(args.bin, ["--model.preset", preset], backend, ckdir, work / f"service-traj-{preset}-{backend}.log",
                  TRAJ_FLAGS)
    res = {"check": "trajectory", "preset": preset, "backend": svc.model["backend"], "steps": TRAJ_STEPS}
    ok = True
    try:
        c, h, w = svc.model["input"]
        classes = svc.model["classes"]
        side = TorchSide(preset, args.device)
        p0 = ckdir / "start.safetensors"
        p0.write_bytes(svc.checkpoint(optimizer=False))
        model = side.load(str(p0)).train()
        opt = torch.optim.SGD(model.parameters(), lr=TRAJ_LR, momentum=TRAJ_MOMENTUM, weight_decay=TRAJ_WD)
        sched = torch.optim.lr_scheduler.SequentialLR(
            opt, [torch.optim.lr_scheduler.LinearLR(opt, start_factor=TRAJ_START, total_iters=TRAJ_WARMUP),
                  torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=TRAJ_TMAX, eta_min=TRAJ_ETA)],
            milestones=[TRAJ_WARMUP])
        rng = np.random.default_rng(args.seed + 5)
        worst, rows, clipped = 0.0, [], 0
        for t in range(TRAJ_STEPS):
            images = rng.integers(0, 256, (TRAJ_BATCH, h, w, c), dtype=np.uint8)
            labels = rng.integers(0, classes, TRAJ_BATCH)
            got = svc.post_batch(images, labels)
            x = torch.from_numpy(svc.transform(images)).to(args.device)
            y = torch.from_numpy(labels).to(args.device)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y, label_smoothing=TRAJ_SMOOTHING)
            loss.backward()
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), TRAJ_CLIP))
            clipped += norm > TRAJ_CLIP
            opt.step()
            sched.step()
            d = abs(got["loss"] - float(loss)) / max(abs(float(loss)), 1e-12)
            worst = max(worst, d)
            rows.append({"step": t + 1, "loss_service": got["loss"], "loss_torch": float(loss), "rel_diff": d,
                         "grad_norm_torch": norm})
        res.update({"max_rel_loss_diff": worst, "steps_clipped_in_torch": int(clipped), "per_step": rows})
        ok &= worst <= args.tol_trajectory and got["step"] == TRAJ_STEPS
        # The eval batch: eval() under no_grad, the same smoothing.
        images = rng.integers(0, 256, (TRAJ_BATCH, h, w, c), dtype=np.uint8)
        labels = rng.integers(0, classes, TRAJ_BATCH)
        e = svc.post_eval(images, labels)
        model.eval()
        with torch.no_grad():
            out = model(torch.from_numpy(svc.transform(images)).to(args.device))
            y = torch.from_numpy(labels).to(args.device)
            loss_t = float(F.cross_entropy(out, y, label_smoothing=TRAJ_SMOOTHING))
            top1 = float((out.argmax(1) == y).float().mean())
            top5 = float((out.topk(min(5, classes), 1).indices == y[:, None]).any(1).float().mean())
        ed = abs(e["loss"] - loss_t) / max(abs(loss_t), 1e-12)
        res["eval"] = {"loss_service": e["loss"], "loss_torch": loss_t, "rel_diff": ed,
                       "top1_service": e["top1"], "top1_torch": top1, "top5_service": e["top5"], "top5_torch": top5,
                       "step_service": e["step"]}
        ok &= ed <= args.tol_trajectory and e["top1"] == top1 and e["top5"] == top5 and e["step"] == TRAJ_STEPS
    except (AssertionError, requests.HTTPError) as ex:
        res["error"] = str(ex)
        ok = False
    finally:
        res["service_exit"] = svc.stop()
    res["pass"] = bool(ok) and res["service_exit"] == 0
    return res


def eval_throughput(args, preset, backend, work):
    """Check 6 (a measurement): samples/s of the service's eval and training
    batches and of PyTorch's no_grad eval and training step, same run."""
    import torch
    import torch.nn.functional as F
    ckdir = work / f"ck-rate-{preset}-{backend}"
    ckdir.mkdir()
    B, K = args.throughput_batch, args.throughput_batches
    # Ring slots big enough for a batch of the largest preset input (256x256x3,
    # seed-classifier; resnet18 takes 224x224x3): the default slot holds 8 MB.
    slot = B * 3 * 256 * 256 + (1 << 20)
    svc = Service(args.bin, ["--model.preset", preset], backend, ckdir, work / f"service-rate-{preset}-{backend}.log",
                  ["--model.max_batch", str(B), "--model.precision", args.throughput_precision,
                   "--ring.slot_bytes", str(slot), "--ring.slots", "4"])
    res = {"check": "eval_throughput", "preset": preset, "backend": svc.model["backend"], "batch": B, "batches": K,
           "precision": args.throughput_precision}
    try:
        c, h, w = svc.model["input"]
        classes = svc.model["classes"]
        rng = np.random.default_rng(args.seed + 6)
        body = st_save({"images": rng.integers(0, 256, (B, h, w, c), dtype=np.uint8),
                        "labels": rng.integers(0, classes, B).astype(np.int64)})

        def service_rate(query):
            for _ in range(3):  # warm-up
                svc.wait_done(svc.post_async(body, query))
            t0 = time.perf_counter()
            last = None
            for _ in range(K):
                last = svc.post_async(body, query)
            svc.wait_done(last)
            return B * K / (time.perf_counter() - t0)

        res["service_train_samples_per_s"] = service_rate("")
        res["service_eval_samples_per_s"] = service_rate("?mode=eval")
        res["service_eval_over_train"] = res["service_eval_samples_per_s"] / res["service_train_samples_per_s"]
        side = TorchSide(preset, args.device)
        model = torch_model(preset).to(args.device)
        x = torch.from_numpy(svc.transform(np.frombuffer(st_load(body)["images"].tobytes(), np.uint8)
                                           .reshape(B, h, w, c))).to(args.device)
        y = torch.randint(0, classes, (B,), device=args.device)
        dt = torch.bfloat16 if args.throughput_precision == "bf16" else None
        if args.device.startswith("cuda"):
            # PyTorch's fast path for convolutions on tensor cores (as bench/pytorch_w3.py).
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
            torch.backends.cudnn.benchmark = True
            torch.backends.cudnn.allow_tf32 = args.throughput_precision == "tf32"
            torch.backends.cuda.matmul.allow_tf32 = args.throughput_precision == "tf32"
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def sync():
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()

        def torch_rate(step):
            for _ in range(3):
                step()
            sync()
            t0 = time.perf_counter()
            for _ in range(K):
                step()
            sync()
            return B * K / (time.perf_counter() - t0)

        def train_step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=dt, enabled=dt is not None):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()

        def eval_step():
            with torch.no_grad(), torch.autocast("cuda", dtype=dt, enabled=dt is not None):
                model(x)

        model.train()
        res["torch_train_samples_per_s"] = torch_rate(train_step)
        model.eval()
        res["torch_eval_samples_per_s"] = torch_rate(eval_step)
        res["torch_eval_over_train"] = res["torch_eval_samples_per_s"] / res["torch_train_samples_per_s"]
        res["mark_eval_over_train_2_5x"] = res["service_eval_over_train"] >= 2.5
        del side
    except (AssertionError, requests.HTTPError) as ex:
        res["error"] = str(ex)
    finally:
        res["service_exit"] = svc.stop()
    # A measurement, not a check: it passes when it ran.
    res["pass"] = "error" not in res and res["service_exit"] == 0
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/streamfeed")
    ap.add_argument("--preset", "--presets", dest="presets", default=PRESETS,
                    help=f"comma list of presets (default {PRESETS})")
    ap.add_argument("--backends", default="auto,ref")
    ap.add_argument("--ref-all", action="store_true",
                    help="also run the presets other than tiny on the ref backend (slow; resnet18 very)")
    ap.add_argument("--device", default=None, help="PyTorch device (default: cuda when available)")
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol-forward", type=float, default=2e-3, help="max |log_softmax difference|")
    ap.add_argument("--tol-step", type=float, default=2e-3, help="max relative difference of the momentum after an SGD step")
    ap.add_argument("--tol-step-bn", type=float, default=2e-2,
                    help="--tol-step for models with batchnorm (see check 3 in the code)")
    ap.add_argument("--tol-buffers", type=float, default=1e-3,
                    help="max relative difference of a batchnorm running_mean/running_var")
    ap.add_argument("--no-eval-check", action="store_true",
                    help="skip check 4 (eval mode through a frozen trunk) for the batchnorm presets")
    ap.add_argument("--numpy", action="store_true", help="self-check without PyTorch (checks 1 and 2)")
    ap.add_argument("--trajectory", action="store_true", help="also run check 5 (the trajectory and an eval batch)")
    ap.add_argument("--trajectory-only", action="store_true", help="run check 5 (and 6 if asked) only")
    ap.add_argument("--trajectory-all", action="store_true",
                    help="check 5 on the batchnorm presets too (their fp32 gradients agree only to ~1e-3)")
    ap.add_argument("--tol-trajectory", type=float, default=1e-4, help="max relative loss difference per step")
    ap.add_argument("--eval-throughput", default=None, help="comma list of presets for check 6 (W3: resnet18)")
    ap.add_argument("--throughput-batch", type=int, default=256)
    ap.add_argument("--throughput-batches", type=int, default=20)
    ap.add_argument("--throughput-precision", default="bf16", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.trajectory = args.trajectory or args.trajectory_only
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
                if args.trajectory and not args.numpy and (args.trajectory_all or preset in ("tiny", "seed-classifier")):
                    t0 = time.monotonic()
                    r = trajectory_check(args, preset, backend, work)
                    r["seconds"] = round(time.monotonic() - t0, 1)
                    results.append(r)
                    print(json.dumps(r, indent=1, default=str), flush=True)
                if args.trajectory_only:
                    continue
                t0 = time.monotonic()
                r = run_one(args, preset, backend, work)
                r["seconds"] = round(time.monotonic() - t0, 1)
                results.append(r)
                print(json.dumps(r, indent=1, default=str), flush=True)
                if not r["pass"]:
                    for log in work.glob(f"service-{preset}-{backend}.log"):
                        print(log.read_text()[-3000:], file=sys.stderr)
        for preset in (args.eval_throughput.split(",") if args.eval_throughput else []):
            for backend in args.backends.split(","):
                r = eval_throughput(args, preset, backend, work)
                results.append(r)
                print(json.dumps(r, indent=1, default=str), flush=True)
    report = {"device": args.device, "numpy": args.numpy, "results": results,
              "pass": all(r["pass"] for r in results)}
    print("torch_interop:", "PASS" if report["pass"] else "FAIL",
          " ".join(f"{r.get('check', 'interop')}:{r['preset']}/{r['backend']}="
                   f"{'skipped' if r.get('skipped') else 'ok' if r['pass'] else 'FAIL'}"
                   for r in results))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
