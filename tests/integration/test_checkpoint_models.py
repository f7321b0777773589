"""Checkpoints of models with batchnorm and AdamW on the CPU reference backend:
batchnorm buffers (running_mean, running_var, num_batches_tracked) travel in the
state_dict part under torchvision's names, AdamW's moments under optim.<p>.exp_avg
and .exp_avg_sq; round trips and resume are bit-exact; a checkpoint of the other
optimizer is refused (unless it carries no optimizer state); resnet18's
checkpoint matches torchvision's state_dict listing."""
import json
import struct
import time

import numpy as np
import pytest
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from sfharness import colour_batch
from test_checkpoint import (ckpt_files, error_of, get_ckpt, header_of, listing, model_step, put_ckpt,
                             tensors_of_header)

# A small residual + batchnorm classifier (as in test_models.py).
RES_SPEC = {
    "input": [3, 8, 8], "classes": 4, "layers": [
        {"type": "conv2d", "name": "conv1", "out": 4, "k": 3, "pad": 1, "bias": False},
        {"type": "batchnorm2d", "name": "bn1"}, {"type": "relu", "name": "relu"},
        {"type": "conv2d", "name": "conv2", "out": 4, "k": 3, "pad": 1, "bias": False},
        {"type": "batchnorm2d", "name": "bn2"},
        {"type": "add", "name": "add", "inputs": ["relu", "bn2"]},
        {"type": "maxpool2d", "name": "pool", "k": 2, "stride": 2},
        {"type": "global_avgpool", "name": "avgpool"}, {"type": "flatten", "name": "flatten"},
        {"type": "linear", "name": "fc", "out": 4},
    ]}

# The state_dict of the PyTorch module with these members, in its order.
RES_STATE = [("conv1.weight", [4, 3, 3, 3], "F32")] + [
    (f"bn1.{n}", [4], "F32") for n in ("weight", "bias", "running_mean", "running_var")] + [
    ("bn1.num_batches_tracked", [], "I64"), ("conv2.weight", [4, 4, 3, 3], "F32")] + [
    (f"bn2.{n}", [4], "F32") for n in ("weight", "bias", "running_mean", "running_var")] + [
    ("bn2.num_batches_tracked", [], "I64"), ("fc.weight", [4, 4], "F32"), ("fc.bias", [4], "F32")]
RES_PARAMS = [t for t in RES_STATE if not t[0].endswith(("running_mean", "running_var", "num_batches_tracked"))]

NORM = ('[{"op":"to_dtype","dtype":"float32","scale":0.00392156862745098},'
        '{"op":"normalize","mean":[0.3],"std":[0.3]}]')


def args(opt="sgd", *extra):
    a = ["--model.spec", json.dumps(RES_SPEC), "--pipeline.backend", "ref", "--augment.pipeline", NORM,
         "--model.max_batch", "16", "--model.seed", "3", "--optim.name", opt, "--optim.lr", "0.01"]
    if opt == "sgd":
        a += ["--optim.momentum", "0.9"]
    return a + list(extra)


def batch(i, n=16):
    return colour_batch(np.random.default_rng(1000 + i), n)


def step(s, i):
    b = s.post_arrays(*batch(i), wait=True).json()
    assert b["state"] == "done", b
    return b["loss"]


def assert_same(a, b):
    a, b = st_load(a) if isinstance(a, bytes) else a, st_load(b) if isinstance(b, bytes) else b
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def optim_names(params, opt):
    sfx = ["momentum_buffer"] if opt == "sgd" else ["exp_avg", "exp_avg_sq"]
    return [(f"optim.{n}.{x}", s, d) for x in sfx for n, s, d in params] + [("optim.step", [], "I64")]


# ---- format ------------------------------------------------------------------------


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_batchnorm_buffers_are_in_the_state_dict_and_the_optimizer_state_is_named_as_pytorch(start_server, opt):
    s = start_server(args(opt))
    for i in range(3):
        step(s, i)
    blob = get_ckpt(s)
    hdr = header_of(blob)
    names = tensors_of_header(hdr)
    n_state = len(RES_STATE)
    # The state_dict part (parameters, then the buffers), then the optimizer state.
    assert sorted(names[:n_state]) == sorted(RES_STATE)
    assert names[:len(RES_PARAMS)] == RES_PARAMS
    assert names[n_state:] == optim_names(RES_PARAMS, opt)
    meta = hdr["__metadata__"]
    assert meta["optimizer"] == opt and meta["step"] == "3"
    spec = json.loads(meta["model"])
    assert [l["name"] for l in spec["layers"]] == [l["name"] for l in RES_SPEC["layers"]]
    assert spec["layers"][5]["inputs"] == ["relu", "bn2"]
    sd = st_load(blob)
    for bn in ("bn1", "bn2"):
        nbt = sd[f"{bn}.num_batches_tracked"]
        assert nbt.dtype == np.int64 and nbt.shape == () and int(nbt) == 3
        # Trained running statistics: no longer the initial 0 and 1.
        assert np.all(sd[f"{bn}.running_mean"] != 0) and np.all(sd[f"{bn}.running_var"] != 1)
    assert int(sd["optim.step"]) == 3
    for n, _, _ in RES_PARAMS:
        first = sd[f"optim.{n}.{'momentum_buffer' if opt == 'sgd' else 'exp_avg'}"]
        assert np.any(first != 0), n
        if opt == "adamw":
            assert np.all(sd[f"optim.{n}.exp_avg_sq"] >= 0) and np.any(sd[f"optim.{n}.exp_avg_sq"] > 0), n
    # Without the optimizer: exactly the state_dict that PyTorch's strict load takes.
    bare = header_of(get_ckpt(s, optimizer=False))
    assert sorted(tensors_of_header(bare)) == sorted(RES_STATE)


# ---- round trips --------------------------------------------------------------------


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_round_trip_is_bit_identical_with_running_stats_and_moments_and_training_continues_identically(
        start_server, opt):
    s = start_server(args(opt))
    for i in range(4):
        step(s, i)
    a = get_ckpt(s)
    loss_a = step(s, 10)
    after_a = get_ckpt(s)
    assert st_load(after_a)["bn1.running_mean"].tobytes() != st_load(a)["bn1.running_mean"].tobytes()
    r = put_ckpt(s, a)
    assert r.status_code == 200, r.text
    assert_same(get_ckpt(s), a)
    # The same batch from the same state: the same loss, the same state after, bit for bit.
    assert step(s, 10) == loss_a
    assert_same(get_ckpt(s), after_a)
    # A fresh server takes the file too (PUT into another process).
    s2 = start_server(args(opt))
    assert put_ckpt(s2, a).status_code == 200
    assert_same(get_ckpt(s2), a)
    assert step(s2, 10) == loss_a
    assert_same(get_ckpt(s2), after_a)


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_resume_continues_running_stats_and_moments_exactly_as_an_uninterrupted_run(start_server, tmp_path, opt):
    d = tmp_path / "ck"
    flags = args(opt, "--checkpoint.dir", str(d), "--checkpoint.resume", "true")
    s = start_server(flags)
    for i in range(5):
        step(s, i)
    s.stop()  # SIGTERM: the final checkpoint
    assert ckpt_files(d).keys() == {5}
    s2 = start_server(flags)
    assert model_step(s2) == 5
    resumed = [step(s2, i) for i in range(5, 8)]
    state_resumed = get_ckpt(s2)
    whole = start_server(args(opt))
    uninterrupted = [step(whole, i) for i in range(8)]
    assert resumed == uninterrupted[5:]  # bit-exact: the reference backend is deterministic
    assert_same(state_resumed, get_ckpt(whole))
    assert int(st_load(state_resumed)["bn2.num_batches_tracked"]) == 8


# ---- refusals -----------------------------------------------------------------------


@pytest.mark.parametrize("have,want", [("sgd", "adamw"), ("adamw", "sgd")])
def test_optimizer_mismatch_is_400_naming_the_tensor_unless_the_file_has_no_optimizer_state(
        start_server, have, want):
    src = start_server(args(have))
    for i in range(2):
        step(src, i)
    full, bare = get_ckpt(src), get_ckpt(src, optimizer=False)
    s = start_server(args(want))
    step(s, 7)
    before = get_ckpt(s)
    r = put_ckpt(s, full)
    assert r.status_code == 400, r.text
    e = error_of(r)
    assert e["code"] == "checkpoint_optimizer_mismatch", e
    assert e["field"].startswith("optim.conv1.weight.") and e["field"] in e["message"], e
    assert f"optim.name={want}" in e["message"], e
    assert_same(get_ckpt(s), before)  # nothing changed
    # Only optim.step from the other optimizer: refused by the metadata.
    only_step = st_load(bare)
    only_step["optim.step"] = np.array(2, dtype=np.int64)
    r = put_ckpt(s, st_save(only_step, metadata=header_of(full)["__metadata__"]))
    assert r.status_code == 400 and error_of(r)["code"] == "checkpoint_optimizer_mismatch", r.text
    # Without optimizer tensors: the parameters and buffers load, the optimizer starts anew.
    r = put_ckpt(s, bare)
    assert r.status_code == 200, r.text
    got = st_load(get_ckpt(s))
    for k, v in st_load(bare).items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    for k, v in got.items():
        if k.startswith("optim.") and k != "optim.step":
            assert not np.any(v), k
    assert int(got["optim.step"]) == 2  # the file's step (its metadata)


def _bad(sd, name, value=None, drop=False):
    sd = dict(sd)
    if drop:
        del sd[name]
    else:
        sd[name] = value
    return st_save(sd)


def test_bad_buffers_are_400_naming_the_tensor_and_change_nothing(start_server):
    s = start_server(args("adamw"))
    step(s, 0)
    before = get_ckpt(s)
    sd = st_load(before)
    cases = [
        (_bad(sd, "bn1.running_var", np.ones(5, np.float32)), "checkpoint_tensor_mismatch", "bn1.running_var"),
        (_bad(sd, "bn2.running_mean", np.zeros(4, np.float64)), "checkpoint_tensor_mismatch", "bn2.running_mean"),
        (_bad(sd, "bn1.num_batches_tracked", np.zeros(2, np.int64)), "checkpoint_tensor_mismatch",
         "bn1.num_batches_tracked"),
        (_bad(sd, "bn1.num_batches_tracked", np.array(1.0, np.float32)), "checkpoint_tensor_mismatch",
         "bn1.num_batches_tracked"),
        (_bad(sd, "bn2.num_batches_tracked", drop=True), "checkpoint_tensor_missing", "bn2.num_batches_tracked"),
        (_bad(sd, "bn1.running_mean", drop=True), "checkpoint_tensor_missing", "bn1.running_mean"),
        (_bad(sd, "optim.fc.bias.exp_avg_sq", drop=True), "checkpoint_tensor_missing", "optim.fc.bias.exp_avg_sq"),
        (_bad(sd, "bn3.running_mean", np.zeros(4, np.float32)), "checkpoint_tensor_unknown", "bn3.running_mean"),
    ]
    for body, code, field in cases:
        r = put_ckpt(s, body)
        assert r.status_code == 400, (field, r.text)
        e = error_of(r)
        assert e["code"] == code and e["field"] == field and field in e["message"], e
    assert_same(get_ckpt(s), before)


def test_a_pytorch_written_state_dict_with_buffers_loads(start_server):
    # What safetensors.torch.save_file(model.state_dict()) writes: torch names, no
    # __metadata__ of ours, num_batches_tracked an I64 scalar per batchnorm layer.
    rng = np.random.default_rng(5)
    sd = {}
    for name, shape, dtype in RES_STATE:
        if dtype == "I64":
            sd[name] = np.array(7 if name.startswith("bn1") else 9, dtype=np.int64)
        elif name.endswith("running_var"):
            sd[name] = rng.uniform(0.5, 2, size=shape).astype(np.float32)
        else:
            sd[name] = rng.standard_normal(shape).astype(np.float32)
    s = start_server(args("adamw"))
    step(s, 0)
    r = put_ckpt(s, st_save(sd, metadata={"format": "pt"}))
    assert r.status_code == 200, r.text
    got = st_load(get_ckpt(s, optimizer=False))
    for k, v in sd.items():
        if not k.endswith("num_batches_tracked"):
            np.testing.assert_array_equal(got[k], v, err_msg=k)
    # The service keeps one counter: the largest of the file's.
    assert int(got["bn1.num_batches_tracked"]) == 9 and int(got["bn2.num_batches_tracked"]) == 9
    # And it trains on from there.
    step(s, 1)
    assert int(st_load(get_ckpt(s))["bn1.num_batches_tracked"]) == 10


# ---- resnet18 ---------------------------------------------------------------------


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_resnet18_checkpoint_matches_the_torchvision_state_dict_listing(start_server, opt):
    t0 = time.monotonic()
    s = start_server("--model.preset", "resnet18", "--pipeline.backend", "ref", "--model.max_batch", "1",
                     "--ring.slots", "2", "--optim.name", opt)
    expected = listing("resnet18")
    params = [t for t in expected if not t[0].endswith(("running_mean", "running_var", "num_batches_tracked"))]
    for with_opt in (False, True):
        r = s.get("/v1/checkpoint" + ("" if with_opt else "?optimizer=false"), stream=True, timeout=120)
        assert r.status_code == 200, r.text
        (n,) = struct.unpack("<Q", r.raw.read(8))
        raw = r.raw.read(n)
        hdr = json.loads(raw)
        total = int(r.headers["Content-Length"])
        if not with_opt:
            body = r.raw.read()
        r.close()
        names = tensors_of_header(hdr)
        assert sorted(names[:len(expected)]) == sorted(expected)
        assert names[:len(params)] == params  # the parameter block, in state_dict order
        n_params = sum(int(np.prod(shape)) for _, shape, _ in params)
        n_bufs = sum(int(np.prod(shape)) for name, shape, _ in expected if name.endswith(("mean", "var")))
        n_bn = sum(1 for t in expected if t[0].endswith("num_batches_tracked"))
        assert (n_params, n_bufs, n_bn) == (11_181_642, 9_600, 20)
        state = 4 * n_params + 4 * n_bufs + 8 * n_bn
        if with_opt:
            assert names[len(expected):] == optim_names(params, opt)
            assert total == 8 + n + state + (1 if opt == "sgd" else 2) * 4 * n_params + 8
        else:
            assert names == names[:len(expected)] and total == 8 + n + state
            assert hdr["__metadata__"]["optimizer"] == opt
            sd = st_load(struct.pack("<Q", n) + raw + body)
            assert np.all(sd["layer4.1.bn2.running_var"] == 1) and not np.any(sd["bn1.running_mean"])
            assert int(sd["layer2.0.downsample.1.num_batches_tracked"]) == 0
            assert np.all(sd["bn1.weight"] == 1) and sd["fc.weight"].shape == (10, 512)
    assert s.get("/v1/model").json()["params"] == 11_181_642
    assert time.monotonic() - t0 < 120


def test_init_from_takes_batchnorm_running_statistics_with_the_parameters(start_server, tmp_path):
    src = start_server(args("sgd"))
    for i in range(2):
        step(src, i)
    sd = st_load(get_ckpt(src, optimizer=False))
    part = {k: v for k, v in sd.items() if k.startswith(("conv1.", "bn1."))}
    path = tmp_path / "backbone.safetensors"
    path.write_bytes(st_save(part, metadata={"format": "pt"}))
    s = start_server(args("sgd", "--model.init_from", str(path)))
    got = st_load(get_ckpt(s, optimizer=False))
    for k, v in part.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    assert np.all(got["bn2.running_var"] == 1) and not np.any(got["bn2.running_mean"])
    assert int(got["bn2.num_batches_tracked"]) == 2  # one counter: the file's
