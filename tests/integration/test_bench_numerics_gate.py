"""The benchmarks' numerics gate (bench/families_check.py) passes a service
that computes the step as PyTorch does and fails one that does not: a lost
gradient, a wrong forward pass. bench/families_run.sh and bench/w3_run.sh
report no figure without it, so a gate that could not fail would let a wrong
model's speed through again."""
import json
import sys

import numpy as np
import pytest

from sfharness import BIN, REPO, built_with_asan

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
sys.path.insert(0, str(REPO / "bench"))
import families_check  # noqa: E402  (needs torch)


def run_gate(tmp_path, *args):
    return families_check.main(["--bin", BIN, "--status", str(tmp_path), *args])


@pytest.mark.skipif(built_with_asan(), reason="numerics only; the server paths are the parity tests'")
def test_the_gate_passes_the_service_on_an_exported_family(tmp_path):
    assert run_gate(tmp_path, "--size", "64", "--batch", "4", "--precision", "fp32,tf32", "squeezenet1_1") == 0
    res = json.loads((tmp_path / "squeezenet1_1" / "check.json").read_text())
    assert res["ok"] and res["error"] is None and not res["failed"]
    # every parameter's gradient and both precisions were compared
    assert res["compared"] == 2 * (2 + 1 + 52)
    assert {r["what"] for r in res["summary"]} == {f"{p}: {w}" for p in ("fp32", "tf32")
                                                  for w in ("eval logits", "loss", "all gradients (52 tensors)")}


def synthetic(rng, names, scale=1.0):
    grads = {n: rng.standard_normal(s).astype(np.float32) * scale for n, s in names.items()}
    return {"logits": rng.standard_normal((4, 10)).astype(np.float32), "loss": 2.3, "grads": grads,
            "buffers": {"bn.running_mean": rng.standard_normal(8).astype(np.float32)}}


def service_of(ref):
    state = {f"optim.{n}.momentum_buffer": g.copy() for n, g in ref["grads"].items()}
    state["bn.running_mean"] = ref["buffers"]["bn.running_mean"].copy()
    return {"logits": ref["logits"].copy(), "loss": ref["loss"], "state": state}


NAMES = {"conv.weight": (8, 3, 3, 3), "bn.weight": (8,), "fc.weight": (10, 8)}


def near(rng, run, noise):
    """run with every quantity moved by noise (relative)."""
    out = {"logits": run["logits"] * (1 + noise * rng.standard_normal(run["logits"].shape)).astype(np.float32),
           "loss": run["loss"] * (1 + noise),
           "grads": {n: g * (1 + noise * rng.standard_normal(g.shape)).astype(np.float32)
                     for n, g in run["grads"].items()},
           "buffers": {n: b * (1 + noise) for n, b in run["buffers"].items()}}
    return out


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_the_gate_fails_a_lost_gradient_and_a_wrong_forward_pass(precision):
    rng = np.random.default_rng(0)
    ref = synthetic(rng, NAMES)
    low = near(rng, ref, 1e-3)
    floors = families_check.FLOORS[precision]
    assert all(r["ok"] for r in families_check.compare(service_of(ref), ref, low, floors))

    lost = service_of(ref)
    lost["state"]["optim.conv.weight.momentum_buffer"][:] = 0
    failed = [r["what"] for r in families_check.compare(lost, ref, low, floors) if not r["ok"]]
    assert "gradient of conv.weight" in failed and "all gradients (3 tensors)" in failed

    wrong = service_of(ref)
    wrong["logits"] = wrong["logits"] * 1.3
    failed = [r["what"] for r in families_check.compare(wrong, ref, low, floors) if not r["ok"]]
    assert failed == ["eval logits"]

    # where PyTorch's own low-precision run is far off, the bound widens to four times that
    # distance, and past UNCHECKED_AT the tensor is reported as unchecked, not failed
    noisy_low = near(rng, ref, 0.5)
    rows = families_check.compare(lost, ref, noisy_low, floors)
    conv = next(r for r in rows if r["what"] == "gradient of conv.weight")
    assert conv["unchecked"] and conv["bound"] >= families_check.UNCHECKED_AT


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_gradient_that_is_noise_in_float32_is_bounded_by_the_references_own_distance_from_float64(precision):
    # conv.weight's gradient is zero in exact arithmetic (the float64 run): the float32
    # reference and PyTorch's low-precision run share one rounding noise, the service has
    # another. Without the float64 run the gate fails it; with it, the bound widens to four
    # times the reference's own distance from exact, and only that tensor's
    rng = np.random.default_rng(2)
    ref = synthetic(rng, NAMES)
    low = near(rng, ref, 1e-3)
    floors = families_check.FLOORS[precision]
    exact = dict(ref, grads=dict(ref["grads"], **{"conv.weight": ref["grads"]["conv.weight"] * 1e-9}))
    sf = service_of(ref)
    sf["state"]["optim.conv.weight.momentum_buffer"] = rng.standard_normal(NAMES["conv.weight"]).astype(np.float32)
    failed = [r["what"] for r in families_check.compare(sf, ref, low, floors) if not r["ok"]]
    assert "gradient of conv.weight" in failed
    rows = families_check.compare(sf, ref, low, floors, exact)
    conv = next(r for r in rows if r["what"] == "gradient of conv.weight")
    assert conv["ok"] and conv["unchecked"] and conv["reference_rel"] > 1e8
    assert all(r["ok"] and r["reference_rel"] < 1e-6 for r in rows if r is not conv)
    assert next(r for r in rows if r["what"].startswith("all gradients"))["what"] == "all gradients (2 tensors)"

    # a lost gradient where the reference is exact still fails
    sf["state"]["optim.fc.weight.momentum_buffer"][:] = 0
    failed = [r["what"] for r in families_check.compare(sf, ref, low, floors, exact) if not r["ok"]]
    assert "gradient of fc.weight" in failed and "all gradients (2 tensors)" in failed


def test_a_missing_gradient_in_the_checkpoint_is_an_error_not_a_pass():
    rng = np.random.default_rng(1)
    ref = synthetic(rng, NAMES)
    sf = service_of(ref)
    del sf["state"]["optim.fc.weight.momentum_buffer"]
    with pytest.raises(RuntimeError, match="fc.weight"):
        families_check.compare(sf, ref, ref, families_check.FLOORS["fp32"])


@pytest.mark.skipif(built_with_asan(), reason="numerics only; the server paths are the parity tests'")
def test_the_gate_passes_a_preset_started_from_its_pytorch_modules_weights(tmp_path):
    # --preset: the service's own model (bench/run.sh gates W1's seed-classifier this way,
    # bench/w3_run.sh W3's resnet18), its weights taken from bench/torch_interop.py's module
    assert run_gate(tmp_path, "--preset", "--size", "32", "--batch", "4", "--precision", "fp32", "tiny") == 0
    res = json.loads((tmp_path / "tiny" / "check.json").read_text())
    assert res["ok"] and res["preset"] and res["classes"] == 10
    assert res["compared"] == 2 + 1 + 10  # logits, loss, all gradients, and five layers' weight and bias
