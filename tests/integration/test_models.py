"""Models beyond a convolution chain, over HTTP on the CPU reference backend: a small
segmentation model (frozen encoder, transposed-conv decoder) trains on per-pixel
labels posted as [N,H,W]; a residual + batchnorm model trains with AdamW and
gradient accumulation; label shapes are checked against the model."""
import json

import numpy as np

from sfharness import BIN, colour_batch, st_body

SEG_SPEC = {
    "input": [3, 8, 8], "classes": 2, "layers": [
        {"type": "conv2d", "name": "encoder.0", "out": 8, "k": 1},
        {"type": "relu", "name": "encoder.1"},
        {"type": "conv2d", "name": "decoder.0", "out": 8, "k": 2, "stride": 2},
        {"type": "relu", "name": "decoder.1"},
        {"type": "conv_transpose2d", "name": "decoder.2", "out": 8, "k": 2, "stride": 2},
        {"type": "relu", "name": "decoder.3"},
        {"type": "conv2d", "name": "decoder.4", "out": 2, "k": 1},
    ]}

RES_SPEC = {
    "input": [3, 8, 8], "classes": 4, "layers": [
        {"type": "conv2d", "name": "conv1", "out": 4, "k": 3, "pad": 1, "bias": False},
        {"type": "batchnorm2d", "name": "bn1"}, {"type": "relu", "name": "relu"},
        {"type": "conv2d", "name": "conv2", "out": 4, "k": 3, "pad": 1, "bias": False},
        {"type": "batchnorm2d", "name": "bn2"},
        {"type": "add", "name": "add", "inputs": ["relu", "bn2"]},
        {"type": "global_avgpool", "name": "avgpool"}, {"type": "flatten", "name": "flatten"},
        {"type": "linear", "name": "fc", "out": 4},
    ]}

NORM = ('[{"op":"to_dtype","dtype":"float32","scale":0.00392156862745098},'
        '{"op":"normalize","mean":[0.3],"std":[0.3]}]')


def args(spec, *extra):
    return ["--model.spec", json.dumps(spec), "--pipeline.backend", "ref", "--augment.pipeline", NORM,
            "--model.max_batch", "16", *extra]


def seg_batch(rng, n=16):
    labels = rng.integers(0, 2, size=(n, 8, 8), dtype=np.uint8)
    images = rng.integers(0, 80, size=(n, 8, 8, 3)).astype(np.uint8) + (labels[..., None] * 120).astype(np.uint8)
    return images, labels


def test_segmentation_model_with_a_frozen_encoder_trains_on_per_pixel_labels(start_server, rng):
    s = start_server(args(SEG_SPEC, "--model.freeze", "encoder", "--optim.lr", "0.1", "--optim.momentum", "0.9"))
    losses = []
    for step in range(150):
        r = s.post_arrays(*seg_batch(rng))
        assert r.status_code == 202, r.text
        b = s.wait_batch(r.json()["id"])
        assert b["state"] == "done", b
        assert b["step"] == step + 1
        losses.append(b["loss"])
        if len(losses) >= 6 and max(losses[-5:]) < losses[0] / 2:
            break
    assert max(losses[-5:]) < losses[0] / 2, f"{losses[:5]} ... {losses[-5:]}"
    held = s.post_arrays(*seg_batch(rng), wait=True).json()
    assert held["accuracy"] >= 0.9, held  # pixel accuracy


def test_segmentation_model_refuses_per_sample_labels_and_wrong_label_shapes(start_server, rng):
    s = start_server(args(SEG_SPEC))
    images, labels = seg_batch(rng, 2)
    r = s.post_batch(st_body(images, labels[:, 0, 0].copy()))
    assert r.status_code == 422 and r.json()["error"]["code"] == "labels_shape_unsupported", r.text
    r = s.post_batch(st_body(images, labels[:, :4, :4].copy()))
    # Masks that do not match the images are refused by the parser already.
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_shape", r.text


def test_classifier_still_refuses_per_pixel_labels(start_server, rng):
    s = start_server(args(RES_SPEC))
    images, labels = seg_batch(rng, 2)
    r = s.post_batch(st_body(images, labels))
    assert r.status_code == 422 and r.json()["error"]["code"] == "labels_shape_unsupported", r.text


def test_residual_batchnorm_model_trains_with_adamw_and_gradient_accumulation(start_server, rng):
    s = start_server(args(RES_SPEC, "--optim.name", "adamw", "--optim.lr", "0.01",
                          "--model.grad_accum_steps", "2"))
    losses = []
    for i in range(300):
        b = s.post_arrays(*colour_batch(rng), wait=True).json()
        assert b["state"] == "done", b
        assert b["step"] == (i + 1) // 2  # optimizer steps
        losses.append(b["loss"])
        if len(losses) >= 12 and np.mean(losses[-10:]) < np.mean(losses[:10]) / 2:
            break
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) / 2, f"{losses[:5]} ... {losses[-5:]}"


def test_bad_freeze_prefix_is_refused_at_start(start_server):
    import subprocess
    out = subprocess.run([BIN, *args(SEG_SPEC, "--model.freeze", "decoder"),
                          "--http.port", "0"], capture_output=True, text=True, timeout=20)
    assert out.returncode != 0
    assert "must lead" in out.stderr, out.stderr
