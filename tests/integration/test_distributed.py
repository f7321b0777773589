"""Data-parallel training on the CPU reference backend: 2 and 4 ranks of the
tiny model on localhost (each on port 0; ranks > 0 get rank 0's address as
distributed.rendezvous), batches posted to different ranks.

With STREAMFEED_PARITY_BACKEND=cuda (a GPU host) the tests named in ON_GPUS,
the faults and the identical-ranks checks, run their ranks on the CUDA
backend instead, rank r on GPU r, all-reducing over NCCL; a job of more
ranks than the host has GPUs is skipped, and the other tests, whose bounds
are the reference backend's, are skipped by name.

The loss comparison: a round of 2 ranks x B samples and one rank with the
same 2B samples in one batch apply the same gradient up to the order of the
float32 sums (a rank scales its mean by B/2B before the SUM all-reduce; one
rank divides its sum by 2B). The two runs' losses stay within LOSS_TOL of
each other over the steps here (measured: 7e-7 over 8 steps); a step that paired the wrong batches, or
divided by the wrong count, is off by far more (see the test).
"""
import json
import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
import requests
from safetensors.numpy import load as st_load

from sfharness import (BIN, SAFETENSORS, SLOWDOWN, TINY, free_port, jpeg_body, learnable_batch, learnable_jpeg_batch, st_body,
                       wait_until)

BACKEND = os.environ.get("STREAMFEED_PARITY_BACKEND", "ref")
ON_GPUS = {
    "test_ranks_fed_different_batches_keep_bit_identical_parameters",
    "test_a_rank_killed_mid_run_makes_the_others_unready_with_a_reason_and_refuse_batches",
    "test_ranks_that_update_differently_are_reported_as_diverged",
    "test_a_job_stopped_by_stopping_all_its_ranks_trains_every_batch_it_accepted",
    "test_a_rank_stopped_alone_exits_at_once_and_leaves_the_others_up_and_unready",
    "test_a_rank_killed_inside_a_round_leaves_no_accepted_batch_pending_and_no_survivor_hung",
    "test_a_rank_stopped_for_twice_the_wait_and_resumed_rejoins_and_the_ranks_stay_identical",
    "test_rank_0_lost_while_it_writes_checkpoints_then_the_restarted_job_resumes_identical",
}


@pytest.fixture(autouse=True)
def _ranks_backend(request):
    if BACKEND != "ref" and request.node.originalname not in ON_GPUS:
        pytest.skip(f"a reference-backend test: STREAMFEED_PARITY_BACKEND={BACKEND} runs the ON_GPUS tests only")


def need_gpus(world):
    """Skips a job of more ranks than the host has GPUs (on the CUDA backend)."""
    if BACKEND != "ref" and world > gpu_count():
        pytest.skip(f"{world} ranks need {world} GPUs, this host has {gpu_count()}")


def gpu_count():
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU ")) if r.returncode == 0 else 0

B = 16
STEPS = 8
LOSS_TOL = 1e-5
# A batch's partner on the other ranks arrives within this (the test posts
# the ranks' batches of one step at the same time); the wait is the bound.
WAIT_MS = 2000


def dist_flags(world, rank, rendezvous=None, *extra):
    base = TINY if BACKEND == "ref" else [*TINY, "--pipeline.backend", BACKEND, "--pipeline.device", str(rank)]
    f = base + ["--model.max_batch", str(2 * B), "--optim.lr", "0.05", "--optim.momentum", "0.9",
                "--distributed.world_size", str(world), "--distributed.rank", str(rank),
                "--distributed.host", "127.0.0.1", "--distributed.join_timeout_s", "20",
                "--distributed.verify_every", "1", "--distributed.allow_no_token", "true"]
    if rendezvous:
        f += ["--distributed.rendezvous", rendezvous]
    return f + list(extra)


def start_job(start_server, world, *extra, rank_extra=None):
    """world ranks; rank_extra[r]: flags of rank r only. Waits for /readyz on all."""
    rank_extra = rank_extra or {}
    need_gpus(world)
    r0 = start_server(dist_flags(world, 0, None, *extra, *rank_extra.get(0, [])))
    ranks = [r0] + [start_server(dist_flags(world, r, f"127.0.0.1:{r0.port}", *extra, *rank_extra.get(r, [])))
                    for r in range(1, world)]
    for s in ranks:
        wait_until(lambda s=s: s.get("/readyz").status_code == 200, timeout=30, what="every rank joined")
    return ranks


def post_round(ranks, batches):
    """Posts batches[i] to ranks[i] at the same time (None: nothing to that
    rank) and returns the results, in rank order."""
    out = [None] * len(ranks)

    def one(i):
        im, lb = batches[i]
        r = ranks[i].post_arrays(im, lb, wait=True, timeout=60)
        out[i] = (r.status_code, r.json())

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(ranks)) if batches[i] is not None]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def parameters(server):
    r = server.get("/v1/checkpoint")
    assert r.status_code == 200, r.text
    return st_load(r.content)


def assert_bit_identical(ranks):
    ref = parameters(ranks[0])
    for s in ranks[1:]:
        other = parameters(s)
        assert sorted(other) == sorted(ref)
        for name, t in ref.items():
            assert t.dtype == other[name].dtype and t.tobytes() == other[name].tobytes(), f"{name} differs"


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_fed_different_batches_keep_bit_identical_parameters(start_server, rng, world):
    ranks = start_job(start_server, world, "--distributed.wait_ms", "20")
    last = 0
    for step in range(STEPS):
        # Every rank gets a batch in even steps; in odd ones only some do (the
        # others contribute empty rounds), so uneven arrival is covered too.
        batches = [learnable_batch(rng, n=B) if step % 2 == 0 or r % 2 == 0 else None
                   for r in range(world)]
        for res in post_round(ranks, batches):
            assert res is None or (res[0] == 200 and res[1]["state"] == "done"), res
            last = max(last, res[1]["step"] if res else 0)
    # Batches posted together meet in one round unless one arrives more than
    # wait_ms after the others (a loaded machine): then they take two, so the
    # job may be past STEPS. A rank that contributed the last round empty
    # finishes it a moment after the rank whose batch reply the test read.
    assert last >= STEPS
    wait_until(lambda: {s.get("/v1/model").json()["step"] for s in ranks} == {last}, timeout=10,
               what="every rank at the last step")
    assert_bit_identical(ranks)
    for r, s in enumerate(ranks):
        st = s.get("/v1/stats").json()
        assert (st["rank"], st["world_size"]) == (r, world)
        assert st["distributed"]["state"] == "training"


BN_SPEC = {
    "input": [3, 8, 8], "classes": 4, "layers": [
        {"type": "conv2d", "name": "conv1", "out": 4, "k": 3, "pad": 1, "bias": False},
        {"type": "batchnorm2d", "name": "bn1"}, {"type": "relu", "name": "relu"},
        {"type": "global_avgpool", "name": "avgpool"}, {"type": "flatten", "name": "flatten"},
        {"type": "linear", "name": "fc", "out": 4},
    ]}
BN_STATS = (".running_mean", ".running_var", ".num_batches_tracked")


def bn_job(start_server, rng, mode, port_after=None):
    """Two reference-backend ranks of the batchnorm model, distributed.batchnorm
    mode, trained three rounds on batches drawn from rng; their checkpoints."""
    spec = ["--model.spec", json.dumps(BN_SPEC), "--pipeline.backend", "ref", "--augment.pipeline", "[]",
            "--model.max_batch", str(B), "--optim.momentum", "0.9", "--distributed.wait_ms", "2000",
            "--distributed.batchnorm", mode]
    r0 = start_server(dist_flags(2, 0, None) + spec)
    r1 = start_server(dist_flags(2, 1, f"127.0.0.1:{r0.port}") + spec)
    ranks = [r0, r1]
    for s in ranks:
        wait_until(lambda s=s: s.get("/readyz").status_code == 200, timeout=30, what="every rank joined")
    for _ in range(3):
        batches = [(rng.integers(0, 256, (B, 8, 8, 3), dtype=np.uint8), rng.integers(0, 4, B))
                   for _ in ranks]
        for res in post_round(ranks, batches):
            assert res[0] == 200 and res[1]["state"] == "done", res
    out = [parameters(r0), parameters(r1)]
    for s in ranks:
        s.stop()
    return out


def test_batchnorm_buffers_are_rank_0s_on_every_rank_by_default_and_each_ranks_own_when_local(start_server):
    # Each rank normalises with its own batch's statistics (no SyncBatchNorm),
    # so the gradient, hence every parameter and momentum buffer, is the job's
    # either way. broadcast (the default, PyTorch DDP's broadcast_buffers):
    # rank 0's running statistics go to every rank after each round, so both
    # checkpoints are rank 0's, whose statistics are those of its own batches,
    # exactly what rank 0 keeps in local mode. local: each rank's own.
    bcast = bn_job(start_server, np.random.default_rng(11), "broadcast")
    local = bn_job(start_server, np.random.default_rng(11), "local")
    for a, b in (bcast, local):
        assert sorted(a) == sorted(b)
        stats = [n for n in a if n.endswith(BN_STATS)]
        assert stats and any(n.startswith("optim.") for n in a)
        for name in a:
            if name not in stats:
                assert a[name].tobytes() == b[name].tobytes(), f"{name} differs between the ranks"
    a, b = bcast
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), f"broadcast: {name} differs between the ranks"
    la, lb = local
    assert la["bn1.running_mean"].tobytes() != lb["bn1.running_mean"].tobytes()
    for name in (n for n in a if n.endswith(BN_STATS)):
        assert a[name].tobytes() == la[name].tobytes(), f"broadcast: {name} is not rank 0's own"
    for name in a:
        if not name.endswith(BN_STATS):
            assert a[name].tobytes() == la[name].tobytes(), f"{name}: the buffers' mode changed the training"


def post_jpeg_round(ranks, bodies):
    """Posts bodies[i] (JPEG batch bodies) to ranks[i] at the same time, waiting for each reply.
    The threads start their posts together: a rank with a batch joins its
    round at once, and one whose batch is still on its way joins without
    it if its wait for a batch ends in between (see WAIT_MS)."""
    out = [None] * len(ranks)
    start = threading.Barrier(len(ranks))

    def post(i):
        start.wait()
        out[i] = ranks[i].post_batch(bodies[i], wait=True, timeout=60)

    ts = [threading.Thread(target=post, args=(i,)) for i in range(len(ranks))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert [r.status_code for r in out] == [200] * len(ranks), [r.text for r in out]
    return [r.json() for r in out]


# The tests of batches refused once their round began: a file the decoder
# refuses fails its whole batch (the default, skip, leaves the sample out:
# test_a_sample_left_out_on_one_rank_makes_the_step_the_mean_over_the_samples_trained).
FAIL_UNDECODABLE = ["--decode.on_undecodable", "fail"]


def cut_scan(files, i):
    """files with file i's scan data cut short: its header passes the upload's
    check, and the decoder refuses it in the step."""
    sos = files[i].index(b"\xff\xda")
    return files[:i] + [files[i][:sos + 40] + b"\xff\xd9"] + files[i + 1:]


def test_a_batch_whose_file_the_decoder_refuses_fails_alone_and_the_job_trains_on(start_server, rng):
    # The header is valid, so the batch is accepted and enters a round; its
    # scan data is cut short, so the decoder refuses it in the step. Its rank
    # used to leave the step's gradient all-reduce out: the other rank's
    # all-reduce then met the next round's control message, Gloo aborted
    # rank 0's process, and the job was lost. Now the rank joins the step
    # with an empty contribution and only that batch fails.
    ranks = start_job(start_server, 2, *FAIL_UNDECODABLE, "--distributed.wait_ms", str(WAIT_MS))
    files, labels = learnable_jpeg_batch(rng, 3)
    replies = [post_jpeg_round(ranks, [jpeg_body(f, labels), jpeg_body(files, labels)])
               for f in (cut_scan(files, 1), files)]
    assert [[b["state"] for b in r] for r in replies] == [["failed", "done"], ["done", "done"]], replies
    assert "sample 1" in replies[0][0]["error"]["message"], replies[0][0]
    for s in ranks:
        assert s.get("/readyz").status_code == 200, s.get("/readyz").text
        assert s.alive()
    wait_until(lambda: {s.get("/v1/model").json()["step"] for s in ranks} == {2}, timeout=10,
               what="both ranks at step 2")
    assert_bit_identical(ranks)


def test_a_sample_left_out_on_one_rank_makes_the_step_the_mean_over_the_samples_trained(start_server, rng):
    # Rank 0 announces 3 samples and trains 2 (its file 1 does not decode);
    # rank 1 trains 3. The step must be the mean over the 5 samples trained,
    # as one process training those 5 in one batch takes it (the tiny model
    # has no batchnorm, so the batch split does not matter), not a mean that
    # counts the sample left out.
    ranks = start_job(start_server, 2, "--distributed.wait_ms", str(WAIT_MS))
    files, labels = learnable_jpeg_batch(rng, 3)
    other, other_labels = learnable_jpeg_batch(rng, 3)
    replies = post_jpeg_round(ranks, [jpeg_body(cut_scan(files, 1), labels), jpeg_body(other, other_labels)])
    assert [r["state"] for r in replies] == ["done", "done"], replies
    assert [k["index"] for k in replies[0]["skipped_samples"]] == [1] and replies[0]["samples_trained"] == 2
    wait_until(lambda: {s.get("/v1/model").json()["step"] for s in ranks} == {1}, timeout=10,
               what="both ranks at step 1")
    assert ranks[0].metric("streamfeed_samples_trained_total") == 2
    assert_bit_identical(ranks)
    job = parameters(ranks[1])
    for s in ranks:
        s.stop()
    kept = [files[0], files[2]] + list(other)
    kept_labels = np.concatenate([np.asarray(labels)[[0, 2]], np.asarray(other_labels)])
    alone = single_after(start_server, [jpeg_body(kept, kept_labels)])
    for name in alone:
        if not name.startswith("optim."):
            assert np.allclose(job[name], alone[name], rtol=1e-5, atol=1e-7), \
                f"{name}: the job's step is not the mean over the 5 samples trained"


def single_after(start_server, bodies, *extra):
    """The parameters of one process (the job's optimizer flags) after training bodies in order."""
    single = start_server(TINY + ["--model.max_batch", str(2 * B), "--optim.lr", "0.05", "--optim.momentum", "0.9",
                                  *extra])
    before = parameters(single)
    for body in bodies:
        r = single.post_batch(body, wait=True, timeout=60)
        assert r.status_code == 200 and r.json()["state"] == "done", r.text
    after = parameters(single)
    trained = [n for n in after if not n.endswith(BN_STATS) and not n.startswith("optim.")]
    assert trained and any(not np.array_equal(before[n], after[n]) for n in trained)
    return after


def assert_same_update(job, alone):
    for name in alone:
        if not name.endswith(BN_STATS):
            assert alone[name].tobytes() == job[name].tobytes(), f"{name}: the job's step is not the batches' mean"


@pytest.mark.parametrize("extra", [
    [],
    ["--optim.clip_grad_norm", "0.01"],
    ["--optim.name", "adamw"],
    ["--model.precision", "bf16", "--optim.clip_grad_norm", "0.01", "--optim.weight_decay", "0.01"],
], ids=["sgd", "clip", "adamw", "bf16-clip-wd"])
def test_a_step_whose_other_batch_was_refused_applies_the_mean_over_the_samples_trained(start_server, rng, extra):
    # Rank 0's batch is refused once the round has begun, after its 3
    # samples were counted in the round's global_n (6): rank 1's gradient,
    # scaled by 3/6 for the all-reduce, must still be applied as the mean
    # over the 3 samples trained, as one process training that batch alone
    # would. Halved (the samples announced but never trained kept in the
    # mean), rank 1's update differs from the single process's; with
    # clipping, the norm that decides the coefficient must be the mean's.
    ranks = start_job(start_server, 2, *FAIL_UNDECODABLE, "--distributed.wait_ms", str(WAIT_MS), *extra)
    files, labels = learnable_jpeg_batch(rng, 3)
    other, other_labels = learnable_jpeg_batch(rng, 3)
    replies = post_jpeg_round(ranks, [jpeg_body(cut_scan(files, 1), labels), jpeg_body(other, other_labels)])
    assert [r["state"] for r in replies] == ["failed", "done"], replies
    wait_until(lambda: {s.get("/v1/model").json()["step"] for s in ranks} == {1}, timeout=10,
               what="both ranks at step 1")
    assert ranks[0].metric("streamfeed_distributed_empty_contributions_total") == 1
    assert_bit_identical(ranks)
    job = parameters(ranks[1])
    for s in ranks:
        s.stop()
    # The scale 3/6 and its correction 6/3 are powers of two: the update is
    # the single process's to the bit, the optimizer state included.
    assert_same_update(job, single_after(start_server, [jpeg_body(other, other_labels)], *extra))


def test_with_accumulation_a_round_whose_other_batch_was_refused_adds_the_mean_over_the_samples_trained(
        start_server, rng):
    # grad_accum_steps 2: round 1 trains only rank 1's X (rank 0's batch
    # refused), round 2 trains Y on both ranks; one process accumulating X
    # then Y applies the same bits.
    acc = ["--model.grad_accum_steps", "2", "--optim.clip_grad_norm", "0.01"]
    ranks = start_job(start_server, 2, *FAIL_UNDECODABLE, "--distributed.wait_ms", str(WAIT_MS), *acc)
    f0, l0 = learnable_jpeg_batch(rng, 3)
    x, lx = learnable_jpeg_batch(rng, 3)
    y, ly = learnable_jpeg_batch(rng, 3)
    r = post_jpeg_round(ranks, [jpeg_body(cut_scan(f0, 1), l0), jpeg_body(x, lx)])
    assert [v["state"] for v in r] == ["failed", "done"], r
    r = post_jpeg_round(ranks, [jpeg_body(y, ly)] * 2)
    assert [v["state"] for v in r] == ["done", "done"], r
    wait_until(lambda: {s.get("/v1/model").json()["step"] for s in ranks} == {1}, timeout=10,
               what="both ranks at step 1")
    assert_bit_identical(ranks)
    job = parameters(ranks[1])
    for s in ranks:
        s.stop()
    assert_same_update(job, single_after(start_server, [jpeg_body(x, lx), jpeg_body(y, ly)], *acc))


def test_with_accumulation_a_group_in_which_no_rank_trained_is_skipped(start_server, rng):
    # grad_accum_steps 2: group 1 trains (step 1, momentum set); both
    # rounds of group 2 are refused on every rank, so nobody trained a
    # sample of that step: skipped, as a single round is without
    # accumulation (taken, the momentum would move the weights).
    ranks = start_job(start_server, 2, *FAIL_UNDECODABLE, "--distributed.wait_ms", str(WAIT_MS),
                      "--model.grad_accum_steps", "2")
    files, labels = learnable_jpeg_batch(rng, 3)
    for _ in range(2):
        r = post_jpeg_round(ranks, [jpeg_body(files, labels)] * 2)
        assert [x["state"] for x in r] == ["done", "done"], r
    wait_until(lambda: {s.get("/v1/model").json()["step"] for s in ranks} == {1}, timeout=10,
               what="both ranks at step 1")
    before = parameters(ranks[0])
    empty0 = [s.metric("streamfeed_distributed_empty_contributions_total") for s in ranks]
    for _ in range(2):
        r = post_jpeg_round(ranks, [jpeg_body(cut_scan(files, 0), labels), jpeg_body(cut_scan(files, 2), labels)])
        assert [x["state"] for x in r] == ["failed", "failed"], r
    # (generous timeouts: the sanitizer build on a busy CI host is slow; a
    # wait that is met returns at once)
    for s, e0 in zip(ranks, empty0):
        wait_until(lambda s=s, e0=e0: s.metric("streamfeed_distributed_empty_contributions_total") == e0 + 2,
                   timeout=30, what="both empty rounds done")
        wait_until(lambda s=s: s.metric("streamfeed_steps_skipped_total", reason="no_samples") == 1, timeout=30,
                   what="the skipped step counted")
        assert s.get("/v1/model").json()["step"] == 1
    after = parameters(ranks[0])
    for name in before:
        assert before[name].tobytes() == after[name].tobytes(), f"{name} changed in a group nobody trained"
    assert_bit_identical(ranks)


def test_a_step_in_which_every_rank_s_batch_was_refused_is_skipped_on_every_rank(start_server, rng):
    # Every batch of the round is refused after it began: nobody trained a
    # sample, so no rank may take the step. Taken with a zero gradient, it
    # would still move the weights by the momentum of the round before and
    # count a step.
    ranks = start_job(start_server, 2, *FAIL_UNDECODABLE, "--distributed.wait_ms", str(WAIT_MS))
    files, labels = learnable_jpeg_batch(rng, 3)
    replies = post_jpeg_round(ranks, [jpeg_body(files, labels)] * 2)
    assert [r["state"] for r in replies] == ["done", "done"], replies
    wait_until(lambda: {s.get("/v1/model").json()["step"] for s in ranks} == {1}, timeout=10,
               what="both ranks at step 1")
    before = parameters(ranks[0])
    assert 'streamfeed_steps_skipped_total{reason="no_samples"} 0' in ranks[0].metrics_text()
    replies = post_jpeg_round(ranks, [jpeg_body(cut_scan(files, 0), labels), jpeg_body(cut_scan(files, 2), labels)])
    assert [r["state"] for r in replies] == ["failed", "failed"], replies
    for s in ranks:
        wait_until(lambda s=s: s.metric("streamfeed_steps_skipped_total", reason="no_samples") == 1, timeout=10,
                   what="the skipped step counted")
        assert s.metric("streamfeed_steps_skipped_total", reason="nonfinite") == 0
        assert s.get("/v1/model").json()["step"] == 1
        assert s.get("/readyz").status_code == 200, s.get("/readyz").text
    after = parameters(ranks[0])
    for name in before:
        assert before[name].tobytes() == after[name].tobytes(), f"{name} changed in a step nobody trained"
    assert_bit_identical(ranks)
    # and the job trains on
    replies = post_jpeg_round(ranks, [jpeg_body(files, labels)] * 2)
    assert [r["state"] for r in replies] == ["done", "done"], replies
    wait_until(lambda: {s.get("/v1/model").json()["step"] for s in ranks} == {2}, timeout=10,
               what="both ranks at step 2")
    assert_bit_identical(ranks)


def test_rank_0_writes_its_periodic_checkpoints_at_steps_where_it_had_no_batch(start_server, rng, tmp_path):
    # Loaders may reach rank 1 only: rank 0 then joins every step with an
    # empty contribution, and those steps are the job's like any other. Its
    # periodic checkpoints were tied to its own batches and never written.
    ranks = start_job(start_server, 2, "--distributed.wait_ms", "20",
                      rank_extra={0: ["--checkpoint.dir", str(tmp_path), "--checkpoint.every_steps", "2",
                                      "--checkpoint.keep", "10"]})
    for step in range(1, 5):
        im, lb = learnable_batch(rng, n=B)
        r = ranks[1].post_arrays(im, lb, wait=True)
        assert r.status_code == 200 and r.json()["state"] == "done", r.text
        if step == 2:
            # a save due while the last one is still being written is
            # skipped (by design): step 4's waits for step 2's
            wait_until(lambda: ranks[0].metric("streamfeed_checkpoints_total", status="ok") == 1, timeout=10,
                       what="rank 0's save of step 2")
    want = ["ckpt-0000000002.safetensors", "ckpt-0000000004.safetensors"]
    wait_until(lambda: sorted(p.name for p in tmp_path.glob("ckpt-*")) == want, timeout=10,
               what="rank 0's checkpoints at steps 2 and 4")


def test_a_rank_stopped_between_rounds_leaves_within_one_wait_and_rank_0_keeps_its_final_checkpoint(
        start_server, rng, tmp_path):
    # A stop that arrived while the rank waited for a batch went into the
    # round after next: with wait_ms 3 s and a 5 s grace period rank 0
    # overran its grace and exited without its final checkpoint.
    ranks = start_job(start_server, 2, "--distributed.wait_ms", "3000", "--shutdown.grace_s", "5",
                      rank_extra={0: ["--checkpoint.dir", str(tmp_path)]})
    for res in post_round(ranks, [learnable_batch(rng, n=B), learnable_batch(rng, n=B)]):
        assert res[0] == 200 and res[1]["state"] == "done", res
    ranks[0].stop()
    assert [p.name for p in tmp_path.glob("ckpt-*")] == ["ckpt-0000000001.safetensors"], \
        ranks[0]._last_stderr[-2000:]
    assert "without a final checkpoint" not in ranks[0]._last_stderr


def test_two_ranks_of_batch_b_follow_the_loss_curve_of_one_rank_of_batch_2b(start_server, rng):
    rounds = [(learnable_batch(rng, n=B), learnable_batch(rng, n=B)) for _ in range(STEPS)]
    ranks = start_job(start_server, 2, "--distributed.wait_ms", str(WAIT_MS))
    two = []
    for a, b in rounds:
        res = post_round(ranks, [a, b])
        assert all(r[0] == 200 for r in res), res
        assert res[0][1]["step"] == res[1][1]["step"]
        two.append((res[0][1]["loss"] * B + res[1][1]["loss"] * B) / (2 * B))
    for s in ranks:
        s.stop()
    single = start_server(TINY + ["--model.max_batch", str(2 * B), "--optim.lr", "0.05",
                                  "--optim.momentum", "0.9"])
    one = []
    for a, b in rounds:
        im = np.concatenate([a[0], b[0]])
        lb = np.concatenate([a[1], b[1]])
        r = single.post_arrays(im, lb, wait=True)
        assert r.status_code == 200, r.text
        one.append(r.json()["loss"])
    diff = np.abs(np.array(two) - np.array(one))
    assert diff.max() < LOSS_TOL, (two, one)
    # The comparison can fail: the loss falls by far more than the tolerance
    # over these steps, so a rank that stepped on its own batch alone (no
    # all-reduce) or a mean over the wrong count would be caught.
    assert one[0] - one[-1] > 100 * LOSS_TOL, one


def test_a_rank_without_batches_joins_with_empty_contributions_that_are_counted(start_server, rng):
    ranks = start_job(start_server, 2, "--distributed.wait_ms", "20")
    for _ in range(3):
        im, lb = learnable_batch(rng, n=B)
        r = ranks[0].post_arrays(im, lb, wait=True)
        assert r.status_code == 200 and r.json()["state"] == "done", r.text
    wait_until(lambda: ranks[1].get("/v1/model").json()["step"] == 3, timeout=10, what="rank 1 at step 3")
    assert ranks[0].get("/v1/model").json()["step"] == 3
    assert ranks[1].metric("streamfeed_distributed_empty_contributions_total") == 3
    assert ranks[0].metric("streamfeed_distributed_empty_contributions_total") == 0
    assert_bit_identical(ranks)


def test_a_patch_on_rank_1_applies_on_rank_0_at_the_same_step(start_server, rng):
    ranks = start_job(start_server, 2, "--distributed.wait_ms", str(WAIT_MS))
    post_round(ranks, [learnable_batch(rng, n=B), learnable_batch(rng, n=B)])
    r = ranks[1].patch_config({"optim": {"lr": 0.01, "momentum": 0.5}})
    assert r.status_code == 200, r.text
    # The same reply as a single process: lists of option names.
    assert sorted(r.json()["applied"]) == ["optim.lr", "optim.momentum"], r.text
    assert r.json()["pending_restart"] == [], r.text
    # The reply comes after the round that applied it on every rank.
    for s in ranks:
        c = s.config()["optim"]
        assert (c["lr"], c["momentum"]) == (0.01, 0.5)
    for _ in range(3):
        post_round(ranks, [learnable_batch(rng, n=B), learnable_batch(rng, n=B)])
    # Had one rank switched a step earlier than the other, their updates would differ.
    assert_bit_identical(ranks)
    bad = ranks[0].patch_config({"optim": {"lr": -1}})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "config_invalid"


def test_a_rank_killed_mid_run_makes_the_others_unready_with_a_reason_and_refuse_batches(start_server, rng):
    # A survivor whose connection to the dead rank resets sees the loss at
    # once; one that only waits on the other survivor sees it when its
    # collective call times out (distributed.timeout_s), so the wait below
    # must outlast that bound (under the sanitizers it was reached at 10 s).
    ranks = start_job(start_server, 3, "--distributed.wait_ms", "20", "--distributed.timeout_s", "5")
    post_round(ranks, [learnable_batch(rng, n=B)] * 3)
    ranks[2].proc.kill()
    ranks[2].proc.wait()
    for s in ranks[:2]:
        reasons = wait_until(lambda s=s: (lambda r: r.json()["reasons"] if r.status_code == 503 else None)(
            s.get("/readyz")), timeout=20, what="readyz false after a peer died")
        assert any("lost the other ranks" in x for x in reasons), reasons
        im, lb = learnable_batch(rng, n=B)
        r = s.post_arrays(im, lb, wait=True)
        assert r.status_code == 503 and r.json()["error"]["code"] == "distributed_unavailable", r.text
    for s in ranks:
        s.stop(check=False)  # the survivors logged the loss as an error, as they must
    for s in ranks[:2]:
        assert s.proc.returncode == 0
        assert "lost the other ranks" in s._last_stderr


def test_ranks_that_update_differently_are_reported_as_diverged(start_server, rng):
    # Rank 1 was started with another learning rate: the same all-reduced
    # gradient, different updates, so the digest check of the first step
    # must see it. (A different optimizer is refused at the join.)
    ranks = start_job(start_server, 2, "--distributed.wait_ms", "20", rank_extra={1: ["--optim.lr", "0.01"]})
    im, lb = learnable_batch(rng, n=B)
    assert ranks[0].post_arrays(im, lb, wait=True).status_code == 200
    for s in ranks:
        reasons = wait_until(lambda s=s: (lambda r: r.json()["reasons"] if r.status_code == 503 else None)(
            s.get("/readyz")), timeout=10, what="readyz false after divergence")
        assert any("diverged across ranks" in x for x in reasons), reasons
    for s in ranks:
        s.stop(check=False)  # the divergence is logged as an error, as it must be
        assert s.proc.returncode == 0


def test_diagnose_on_a_rank_still_joining_is_refused_at_once(start_server):
    # The engine runs no command until every rank has joined: a diagnose
    # queued then would wait out the whole join window.
    r0 = start_server(dist_flags(2, 0, None, "--distributed.join_timeout_s", "600"))
    r = r0.request("POST", "/v1/diagnose", json={"seconds": 0.1}, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "distributed_unavailable", r.text
    assert r0.get("/v1/stats").json()["diagnose"]["running"] is False
    r0.stop(check=False)


def test_the_rendezvous_store_requires_the_token_and_a_rank_without_it_never_joins(start_server):
    r0 = start_server(dist_flags(2, 0, None, "--http.token", "s3cret"))
    h = {"Content-Type": "application/octet-stream"}
    assert r0.request("PUT", "/v1/distributed/kv/probe", data=b"x", headers=h).status_code == 401
    assert r0.get("/v1/distributed/kv/probe").status_code == 401
    auth = {"Authorization": "Bearer s3cret"}
    # nccl.id: a key of the job that no rank reads on the reference backend.
    assert r0.request("PUT", "/v1/distributed/kv/nccl.id", data=b"\x00\x01", headers={**h, **auth}).status_code == 204
    got = r0.get("/v1/distributed/kv/nccl.id", headers=auth)
    assert got.status_code == 200 and got.content == b"\x00\x01"
    assert r0.get("/v1/distributed/kv/gloo.rank_1", headers=auth).json()["error"]["code"] == "kv_key_not_found"
    bad = r0.request("PUT", "/v1/distributed/kv/bad~key", data=b"x", headers={**h, **auth})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "kv_key_invalid"
    big = r0.request("PUT", "/v1/distributed/kv/nccl.id", data=b"x" * 65537, headers={**h, **auth})
    assert big.status_code == 413 and big.json()["error"]["code"] == "kv_value_too_large"
    # A rank with the wrong token is refused by the store and says so, naming the address.
    r1 = start_server(dist_flags(2, 1, f"127.0.0.1:{r0.port}", "--http.token", "wrong"))
    reasons = wait_until(lambda: (lambda r: r.json()["reasons"] if any(
        "could not join" in x for x in r.json()["reasons"]) else None)(r1.get("/readyz")), timeout=15,
        what="rank 1 to give up joining")
    assert any(f"127.0.0.1:{r0.port}" in x and "401" in x for x in reasons), reasons
    r1.stop(check=False)
    assert r1.proc.returncode == 0
    # A lone process serves no store.
    lone = start_server(TINY)
    assert lone.get("/v1/distributed/kv/probe").json()["error"]["code"] == "not_rendezvous"


def test_rank_0s_store_takes_only_the_keys_of_the_job_so_junk_cannot_keep_a_rank_out(start_server, rng):
    # The store had room for 2 keys per rank and 8 more, of any name: with no
    # token set, 10 PUTs of junk keys filled a 2-rank job's store, rank 1's
    # gloo.rank_1 was refused (507 kv_full) and neither rank ever got ready.
    r0 = start_server(dist_flags(2, 0, None))
    h = {"Content-Type": "application/octet-stream"}
    junk = [f"junk{i}" for i in range(12)] + [
        "gloo.2", "gloo.rank_2",  # ranks the job does not have
        "gloo.01", "gloo.rank_00", "gloo.1.", "nccl.id0", "gloo.x",  # no spelling the job writes
    ]
    for key in junk:
        r = r0.request("PUT", f"/v1/distributed/kv/{key}", data=b"x", headers=h)
        assert r.status_code == 400, (key, r.status_code, r.text)
        err = r.json()["error"]
        assert err["code"] == "kv_key_invalid" and "gloo.rank_N or gloo.N" in err["message"], r.text
    r = r0.get("/v1/distributed/kv/junk0")
    assert r.status_code == 400 and r.json()["error"]["code"] == "kv_key_invalid", r.text
    assert r0.metric("streamfeed_http_errors_total", code="kv_key_invalid") >= len(junk) + 1
    # A key of the job is taken (nccl.id: no rank reads it on the reference
    # backend), and rank 1 then joins: its own keys still fit.
    assert r0.request("PUT", "/v1/distributed/kv/nccl.id", data=b"x", headers=h).status_code == 204
    r1 = start_server(dist_flags(2, 1, f"127.0.0.1:{r0.port}"))
    for s in (r0, r1):
        wait_until(lambda s=s: s.get("/readyz").status_code == 200, timeout=30, what="every rank joined")
    for res in post_round([r0, r1], [learnable_batch(rng, n=B), learnable_batch(rng, n=B)]):
        assert res[0] == 200 and res[1]["state"] == "done", res
    assert_bit_identical([r0, r1])


def test_only_rank_0_writes_checkpoints_and_no_rank_restores_one_while_training(start_server, tmp_path):
    ranks = start_job(start_server, 2, "--distributed.wait_ms", "20", "--checkpoint.dir", str(tmp_path))
    r = ranks[1].request("POST", "/v1/checkpoint/save", json={})
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_rank_zero", r.text
    assert ranks[0].request("POST", "/v1/checkpoint/save", json={}).status_code == 200
    r = ranks[0].request("POST", "/v1/checkpoint/load", json={})
    assert r.status_code == 409 and r.json()["error"]["code"] == "distributed_restore_refused", r.text


def test_a_checkpoint_read_on_an_idle_rank_is_not_held_for_the_rounds_wait(start_server, rng):
    # Idle ranks meet once per distributed.wait_ms (4 s here). A read posted
    # to the engine used to end the rank's wait, then sit in the round's
    # control all-reduce until the other rank's wait was over: the second of
    # two reads in a row, starting just after a round, took the whole 4 s.
    # A command runs in the wait instead, as it would between any two rounds.
    ranks = start_job(start_server, 2, "--distributed.timeout_s", "10", "--distributed.wait_ms", "4000")
    for res in post_round(ranks, [learnable_batch(rng, n=B), learnable_batch(rng, n=B)]):
        assert res[0] == 200 and res[1]["state"] == "done", res
    t0 = time.monotonic()
    for s in (ranks[1], ranks[0], ranks[1]):
        assert s.get("/v1/checkpoint").status_code == 200
    took = time.monotonic() - t0
    assert took < 2, f"three checkpoint reads took {took:.1f} s"
    assert_bit_identical(ranks)
    for res in post_round(ranks, [learnable_batch(rng, n=B), learnable_batch(rng, n=B)]):
        assert res[0] == 200 and res[1]["state"] == "done" and res[1]["step"] == 2, res


def test_a_rank_fed_a_steady_stream_of_evaluation_batches_still_takes_its_rounds(start_server, rng):
    """Evaluation batches are a rank's own business, served between rounds;
    served back to back they kept rank 1 out of the rounds for as long as its
    ring held one, so rank 0's step waited in the control all-reduce until
    distributed.timeout_s broke the job for good.

    The round deadline must still outlast one evaluation batch, which a rank
    does not interrupt: 3 s is about 8 times a 256-sample batch of the tiny
    model in the release build, and SLOWDOWN times it under AddressSanitizer,
    where the batch takes 6-7 times as long. The six streams want up to 12
    ring slots of the 8 there are, so an upload waits for one; under
    AddressSanitizer the wait can outlast ring.full_timeout_ms, and the reply
    is then the back-pressure refusal, 503 ring_full_timeout with
    Retry-After, which a stream retries after that time as a client would,
    a few times in a row at most. Any other refusal fails the test, the
    distributed_unavailable of a broken job among them.
    """
    timeout_s = 3 * SLOWDOWN
    ranks = start_job(start_server, 2, "--distributed.wait_ms", "20", "--distributed.timeout_s", str(timeout_s),
                      "--model.max_batch", "256")
    stop = threading.Event()
    accepted, refused, retried = [], [], []
    im, lb = learnable_batch(rng, n=256)
    eval_body = st_body(im, lb)

    def evaluate():
        in_a_row = 0
        with requests.Session() as s:
            while not stop.is_set():
                r = s.post(ranks[1].url + "/v1/batches?mode=eval", data=eval_body,
                           headers={"Content-Type": SAFETENSORS}, timeout=60)
                if r.status_code == 202:
                    accepted.append(r.json()["id"])
                    in_a_row = 0
                elif (r.status_code == 503 and r.json()["error"]["code"] == "ring_full_timeout"
                      and "Retry-After" in r.headers and in_a_row < 3):
                    retried.append(r.text)
                    in_a_row += 1
                    stop.wait(float(r.headers["Retry-After"]))
                else:
                    refused.append((r.status_code, r.text))
                    return

    def evaluated():
        return ranks[1].metric("streamfeed_eval_samples_total", eval="default") or 0

    loaders = [threading.Thread(target=evaluate) for _ in range(6)]
    for t in loaders:
        t.start()
    try:
        # Every slot of rank 1's ring has held an evaluation batch.
        wait_until(lambda: len(accepted) >= 8 or refused, timeout=20 * SLOWDOWN,
                   what="rank 1 busy with evaluation batches")
        before = evaluated()
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s + 2:  # beyond distributed.timeout_s
            im, lb = learnable_batch(rng, n=B)
            r = ranks[0].post_arrays(im, lb, wait=True, timeout=60)
            assert r.status_code == 200 and r.json()["state"] == "done", r.text
        assert evaluated() > before, "rank 1 evaluated nothing while rank 0 trained"
    finally:
        stop.set()
        for t in loaders:
            t.join()
    assert refused == [], refused
    for s in ranks:
        assert s.get("/readyz").status_code == 200, s.get("/readyz").text


def test_a_patch_that_one_rank_refuses_applies_on_no_rank(start_server, rng, tmp_path):
    # The ranks differ in restart-only options: only rank 0 has a
    # checkpoint.dir (docs/OPERATIONS.md), so checkpoint.every_steps is valid
    # there and not on rank 1. Rank 1 used to refuse the whole patch alone
    # while rank 0 applied it and answered 200, and the ranks trained on
    # with different learning rates.
    ranks = start_job(start_server, 2, "--distributed.wait_ms", "20",
                      rank_extra={0: ["--checkpoint.dir", str(tmp_path)]})
    r = ranks[0].patch_config({"optim": {"lr": 0.01}, "checkpoint": {"every_steps": 1000}})
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["code"] == "config_invalid" and e["field"] == "checkpoint.every_steps", r.text
    assert "rank 1" in e["message"], r.text
    # The other way round: valid on rank 1 once checkpoint.dir is there too
    # (pending a restart), but every_steps applies now, and rank 1 has no
    # checkpoint.dir now; rank 0 used to apply it anyway. (With a token the
    # reply is 400 config_invalid; this job has none, and on an open service
    # a path is refused by PATCH before any rank sees it.)
    r = ranks[1].patch_config({"checkpoint": {"dir": str(tmp_path), "every_steps": 10}})
    assert r.status_code == 403 and r.json()["error"]["code"] == "config_needs_token", r.text
    r = ranks[1].patch_config({"checkpoint": {"every_steps": 10}})
    assert r.status_code == 400 and r.json()["error"]["code"] == "config_invalid", r.text
    for s in ranks:
        c = s.config()
        assert (c["optim"]["lr"], c["checkpoint"]["every_steps"]) == (0.05, 0), c
        assert s.get("/v1/config").json()["pending_restart"] == []
    post_round(ranks, [learnable_batch(rng, n=B), learnable_batch(rng, n=B)])
    assert_bit_identical(ranks)
    for s in ranks:
        assert s.get("/readyz").status_code == 200, s.get("/readyz").text


def test_checkpoint_reads_and_saves_on_a_rank_still_joining_are_refused_at_once(start_server, tmp_path):
    # Both are engine commands, and the engine runs none until every rank has
    # joined: the request waited out the whole join window unanswered.
    r0 = start_server(dist_flags(2, 0, None, "--distributed.join_timeout_s", "600",
                                 "--checkpoint.dir", str(tmp_path)))
    for method, path, kw in [("GET", "/v1/checkpoint", {}), ("POST", "/v1/checkpoint/save", {"json": {}})]:
        r = r0.request(method, path, timeout=10, **kw)
        assert r.status_code == 503 and r.json()["error"]["code"] == "distributed_unavailable", r.text
        assert "joining" in r.json()["error"]["message"], r.text
    r0.stop(check=False)
    assert r0.proc.returncode == 0


def test_a_rank_stopped_while_still_joining_fails_its_accepted_batches_and_exits_at_once(start_server, rng):
    # A batch accepted while the rank joins can only train once every rank
    # has joined; a shutdown meanwhile ends the job anyway. The drain used to
    # wait the whole grace period for that batch, with the join going on.
    r0 = start_server(dist_flags(2, 0, None, "--distributed.join_timeout_s", "600", "--shutdown.grace_s", "20"))
    im, lb = learnable_batch(rng, n=B)
    accepted = r0.post_arrays(im, lb)
    assert accepted.status_code == 202, accepted.text
    waiting = {}
    t = threading.Thread(target=lambda: waiting.setdefault("r", r0.post_arrays(im, lb, wait=True, timeout=60)))
    t.start()
    wait_until(lambda: r0.metric("streamfeed_batches_pending") == 2, what="both batches accepted")
    t0 = time.monotonic()
    assert r0.terminate() == 0
    assert time.monotonic() - t0 < 5, "the drain waited for batches that could not train"
    t.join()
    r = waiting["r"]
    assert r.json()["state"] == "failed", r.text
    assert r.json()["error"]["code"] == "distributed_unavailable", r.text
    r0.stop(check=False)


def join_failure(server):
    """The reason a rank gives for a failed join, once it has given up."""
    reasons = server.get("/readyz").json()["reasons"]
    return next((x for x in reasons if "could not join" in x), None)


def test_a_rank_started_before_rank_0_listens_waits_for_it_then_joins_and_trains(start_server, rng):
    # Ranks start in any order (the pods of a StatefulSet, the processes of
    # one script). Rank 1 comes first, its rendezvous a port nobody listens
    # on yet: it used to fail its join at once on the refused connection,
    # while rank 0, started a moment later, waited out its join timeout.
    port = free_port()
    r1 = start_server(dist_flags(2, 1, f"127.0.0.1:{port}"))

    def waiting_reason():
        reasons = r1.get("/readyz").json()["reasons"]
        return next((x for x in reasons if "last store error" in x), None)

    # While it waits, its readiness says for what.
    reason = wait_until(waiting_reason, timeout=10, what="rank 1 to report the unanswered rendezvous")
    assert f"127.0.0.1:{port}" in reason and "did not answer" in reason, reason
    assert join_failure(r1) is None
    r0 = start_server(dist_flags(2, 0, None, "--http.port", str(port)))
    assert r0.port == port
    for s in (r0, r1):
        wait_until(lambda s=s: s.get("/readyz").status_code == 200, timeout=30, what="every rank joined")
    for res in post_round([r0, r1], [learnable_batch(rng, n=B), learnable_batch(rng, n=B)]):
        assert res[0] == 200 and res[1]["state"] == "done", res
    assert_bit_identical([r0, r1])


def test_a_second_process_claiming_a_rank_of_a_running_job_is_refused_at_once_and_the_job_trains_on(
        start_server, rng):
    # Once rank 0 has joined, every rank has published its keys: the store
    # takes no more. A second rank 1 used to replace the running rank 1's
    # keys and then wait in Gloo's connect for 30 s, past its join timeout.
    ranks = start_job(start_server, 2, "--distributed.wait_ms", "20")
    post_round(ranks, [learnable_batch(rng, n=B), learnable_batch(rng, n=B)])
    twin = start_server(dist_flags(2, 1, f"127.0.0.1:{ranks[0].port}"))
    reason = wait_until(lambda: join_failure(twin), timeout=5, what="the second rank 1 to give up")
    assert "409" in reason and "every rank of its data-parallel job has joined" in reason, reason
    assert ranks[0].metric("streamfeed_http_errors_total", code="rendezvous_closed") >= 1
    twin.stop(check=False)  # the failed join is logged as an error, as it must be
    assert twin.proc.returncode == 0
    for res in post_round(ranks, [learnable_batch(rng, n=B), learnable_batch(rng, n=B)]):
        assert res[0] == 200 and res[1]["state"] == "done", res
    assert_bit_identical(ranks)


def test_a_rank_that_comes_after_rank_0_gave_up_waiting_is_told_why(start_server):
    r0 = start_server(dist_flags(2, 0, None, "--distributed.join_timeout_s", "1"))
    wait_until(lambda: join_failure(r0), timeout=10, what="rank 0 to give up")
    r1 = start_server(dist_flags(2, 1, f"127.0.0.1:{r0.port}"))
    reason = wait_until(lambda: join_failure(r1), timeout=5, what="rank 1 to give up")
    # Not a bare "connection refused" from rank 0's closed listener.
    assert "409" in reason and "stopped waiting for the other ranks" in reason, reason
    for s in (r0, r1):
        s.stop(check=False)
        assert s.proc.returncode == 0


def test_rank_0s_store_holds_what_every_rank_of_the_largest_job_publishes(start_server):
    # Gloo publishes two keys per rank: its host name (gloo.rank_N) and the
    # addresses of its pairs with every other rank (gloo.N: a 136-byte
    # sockaddr_storage and sequence number per peer), and on GPUs rank 0
    # adds nccl.id. A store of 256 keys of 64 KiB at most turned away the
    # 129th rank of a job (and every rank of one over 481 ranks) although
    # distributed.world_size goes up to 1024. Rank 0 joins here and waits
    # for gloo.1 first, so the test publishes that last: rank 0 reads none
    # of the made-up addresses before the store has taken all of them.
    world = 1024
    r0 = start_server(dist_flags(world, 0, None, "--distributed.join_timeout_s", "600",
                                 "--log.requests", "false"))
    h = {"Content-Type": "application/octet-stream"}
    blob = b"\x00" * (136 * (world - 1))
    with requests.Session() as s:
        def put(key, value):
            r = s.put(f"{r0.url}/v1/distributed/kv/{key}", data=value, headers=h, timeout=30)
            assert r.status_code == 204, (key, r.status_code, r.text)
        for n in range(1, world):
            put(f"gloo.rank_{n}", b"127.0.0.1")
        for n in range(2, world):
            put(f"gloo.{n}", blob)
        put("nccl.id", b"\x00" * 128)
        put("gloo.1", blob)
    # Its join fails on the made-up addresses, and closing a thousand Gloo
    # pairs takes seconds: nothing of it is under test.
    r0.proc.kill()
    r0.stop(check=False)


def test_patches_waiting_for_their_round_when_a_peer_dies_are_answered_503_distributed_unavailable(
        start_server, rng):
    # A job that broke is the service's failure, not a bad patch: they were
    # answered 400 config_invalid.
    ranks = start_job(start_server, 2, "--distributed.wait_ms", "20", "--distributed.timeout_s", "30")
    # A round first: the ranks have ended their start (rank 0's state
    # broadcast) and take rounds.
    post_round(ranks, [learnable_batch(rng, n=B), None])
    ranks[1].proc.send_signal(signal.SIGSTOP)  # no round can end now
    replies = []
    threads = [threading.Thread(target=lambda lr=lr: replies.append(ranks[0].patch_config({"optim": {"lr": lr}})))
               for lr in (0.01, 0.02, 0.03, 0.04, 0.06, 0.07, 0.08, 0.09, 0.1)]
    for t in threads:
        t.start()
    # One more than the queue holds: the first reply is the one refused, so
    # the other eight wait for their round.
    wait_until(lambda: replies, timeout=10, what="the patch the full queue refuses")
    assert replies[0].status_code == 503 and "already waiting" in replies[0].text, replies[0].text
    ranks[1].proc.kill()
    ranks[1].proc.wait()
    for t in threads:
        t.join()
    assert len(replies) == 9, "a patch got no answer"
    for r in replies[1:]:
        assert r.status_code == 503 and r.json()["error"]["code"] == "distributed_unavailable", r.text
        assert "lost the other ranks" in r.json()["error"]["message"], r.text
    assert ranks[0].config()["optim"]["lr"] == 0.05
    for s in ranks:
        s.stop(check=False)  # the loss is logged as an error, as it must be


def test_ranks_started_with_different_world_sizes_say_so(start_server):
    # Each rank publishes the addresses of its pairs with every other rank:
    # ranks of different world sizes read values of an unexpected length,
    # which Gloo reported as "sizeof(impl_) == bytes.size(). 136 vs 272".
    r0 = start_server(dist_flags(2, 0, None))
    r1 = start_server(dist_flags(3, 1, f"127.0.0.1:{r0.port}"))
    for s in (r0, r1):
        reason = wait_until(lambda s=s: join_failure(s), timeout=10, what="the join to fail")
        assert "every rank needs the same distributed.world_size" in reason, reason
        s.stop(check=False)  # the failed join is logged as an error, as it must be
        assert s.proc.returncode == 0


@pytest.mark.parametrize("flags, named", [
    (["--distributed.verify_every", "3"], "distributed.verify_every (this rank {}, lowest 1, highest 3)"),
    (["--model.grad_accum_steps", "2"], "model.grad_accum_steps (this rank {}, lowest 1, highest 2)"),
    (["--model.spec", json.dumps(BN_SPEC)], "the model"),
    (["--optim.name", "adamw"], "optim.name"),
])
def test_ranks_that_differ_in_what_shapes_the_collectives_refuse_the_job_naming_it(start_server, flags, named):
    # Such ranks joined and then paired collectives of different sizes: Gloo
    # aborted rank 0's process at the first mismatched all-reduce (a rank
    # with another verify_every, accumulation or model), losing what it had
    # accepted. The join now compares them and every rank says which.
    r0 = start_server(dist_flags(2, 0, None))
    r1 = start_server(dist_flags(2, 1, f"127.0.0.1:{r0.port}", *flags))

    def differ(s):
        return next((x for x in s.get("/readyz").json()["reasons"] if "the ranks differ in" in x), None)

    for s, own in ((r0, 1), (r1, int(flags[1]) if flags[1].isdigit() else None)):
        reason = wait_until(lambda s=s: differ(s), timeout=10, what="the job to be refused")
        assert f"the ranks differ in {named.format(own)}" in reason, reason
        assert "every rank of a job needs the same" in reason, reason
    rng = np.random.default_rng(3)
    im, lb = learnable_batch(rng, n=B)
    r = r0.post_arrays(im, lb, wait=True)
    assert r.status_code == 503 and r.json()["error"]["code"] == "distributed_unavailable", r.text
    for s in (r0, r1):
        assert s.alive()
        s.stop(check=False)  # the refused job is logged as an error, as it must be
        assert s.proc.returncode == 0


def test_ranks_whose_models_differ_only_in_a_field_the_shapes_do_not_show_refuse_the_job(start_server):
    # Two models of equal shapes and parameter counts, one with batchnorm eps
    # 1e-5 and one with 1e-3: the ranks joined and trained two different
    # models under one gradient. The model's fingerprint covers every field.
    other = json.loads(json.dumps(BN_SPEC))
    other["layers"][1]["eps"] = 1e-3
    spec = ["--pipeline.backend", "ref", "--augment.pipeline", "[]"]
    r0 = start_server(dist_flags(2, 0, None, "--model.spec", json.dumps(BN_SPEC), *spec))
    r1 = start_server(dist_flags(2, 1, f"127.0.0.1:{r0.port}", "--model.spec", json.dumps(other), *spec))

    def differ(s):
        return next((x for x in s.get("/readyz").json()["reasons"] if "the ranks differ in" in x), None)

    for s in (r0, r1):
        reason = wait_until(lambda s=s: differ(s), timeout=10, what="the job to be refused")
        assert "the ranks differ in the model" in reason, reason
    for s in (r0, r1):
        s.stop(check=False)  # the refused job is logged as an error, as it must be
        assert s.proc.returncode == 0


def test_a_rank_cannot_be_made_to_wait_or_diagnose_long_enough_to_time_the_job_out(start_server, rng):
    # The other ranks wait in a round for a rank that waits for a batch
    # (distributed.wait_ms) or runs a diagnosis on its engine, but only up
    # to distributed.timeout_s: a PATCH of wait_ms to 5 s or a 3 s diagnosis
    # under a 2 s timeout broke the whole job.
    ranks = start_job(start_server, 2, "--distributed.timeout_s", "2", "--distributed.wait_ms", "20")
    r = ranks[1].patch_config({"distributed": {"wait_ms": 5000}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["field"]) == ("config_invalid", "distributed.wait_ms"), err
    assert "at most half of distributed.timeout_s" in err["message"], err
    r = ranks[1].request("POST", "/v1/diagnose", json={"seconds": 3})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "seconds_out_of_range" and "[0.1, 0.5]" in err["message"], err
    assert "distributed.timeout_s" in err["message"], err
    for res in post_round(ranks, [learnable_batch(rng, n=B), learnable_batch(rng, n=B)]):
        assert res[0] == 200 and res[1]["state"] == "done", res
    for s in ranks:
        assert s.get("/readyz").status_code == 200


def test_a_job_whose_wait_is_over_half_its_timeout_does_not_start():
    flags = dist_flags(2, 0, None, "--distributed.timeout_s", "2", "--distributed.wait_ms", "1500")
    r = subprocess.run([BIN, "--http.port", "0", *flags], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r
    assert "distributed.wait_ms (1500) must be at most half of distributed.timeout_s (2 s)" in r.stderr, r.stderr


def test_a_job_stopped_by_stopping_all_its_ranks_trains_every_batch_it_accepted(start_server, rng):
    # SIGTERM reaches the ranks of one job milliseconds apart. The rank that
    # drained first (one batch) ended the job at once, and the other rank's
    # queued batches failed with distributed_unavailable; now a stopped rank
    # lingers, sees the others shutting down too, and the job drains as one.
    ranks = start_job(start_server, 2, "--distributed.wait_ms", "300")
    out = []

    def post(s, batch):
        r = s.post_arrays(*batch, wait=True, timeout=60)
        out.append((r.status_code, r.json()))

    ts = [threading.Thread(target=post, args=(s, learnable_batch(rng, n=B))) for s in [ranks[0]] * 4 + [ranks[1]]]
    for t in ts:
        t.start()
    # Every batch accepted before the signal (a slow thread's post that the
    # closed listener refuses was never accepted); rank 0's last ones still
    # wait for their rounds then, 300 ms apart while rank 1 has none.
    wait_until(lambda: sum(s.metric("streamfeed_batches_received_total", status="accepted") or 0
                           for s in ranks) >= 5, timeout=30, what="every batch accepted")
    for s in ranks:
        s.proc.send_signal(signal.SIGTERM)
    for t in ts:
        t.join(60)
    assert len(out) == 5 and all(code == 200 and b["state"] == "done" for code, b in out), out
    for s in ranks:
        s.stop()


@pytest.mark.parametrize("alone", [0, 1])
def test_a_rank_stopped_alone_exits_at_once_and_leaves_the_others_up_and_unready(start_server, rng, alone):
    # SIGTERM to one rank only (a pod deleted, a node drained): it drains,
    # waits a second for the others to show that they stop too, ends the job
    # and exits; the others stay up, not ready, refusing batches until they
    # are stopped as well. Its exit waits for nothing of theirs: on CUDA ranks
    # NCCL's teardown, in which every rank of the host takes part, once kept
    # a rank stopped alone alive until the others were stopped too.
    ranks = start_job(start_server, 2, "--distributed.wait_ms", "20")
    for res in post_round(ranks, [learnable_batch(rng, n=B)] * 2):
        assert res[0] == 200 and res[1]["state"] == "done", res
    t0 = time.monotonic()
    rc = ranks[alone].terminate()
    took = time.monotonic() - t0
    assert rc == 0, f"rank {alone}, stopped alone, had not exited {took:.0f} s after its SIGTERM"
    assert took < (10 if SLOWDOWN == 1 else 30), f"rank {alone}, stopped alone, took {took:.1f} s to exit"
    other = ranks[1 - alone]
    reasons = wait_until(lambda: (lambda r: r.json()["reasons"] if r.status_code == 503 else None)(
        other.get("/readyz")), timeout=10, what="the other rank unready once the job stopped")
    assert any("the data-parallel job stopped" in x for x in reasons), reasons
    im, lb = learnable_batch(rng, n=B)
    r = other.post_arrays(im, lb, wait=True)
    assert r.status_code == 503 and r.json()["error"]["code"] == "distributed_unavailable", r.text
    assert other.get("/healthz").status_code == 200


# ---- faults: a rank killed, stopped, or rank 0 lost while it writes a checkpoint ----


def test_a_rank_killed_inside_a_round_leaves_no_accepted_batch_pending_and_no_survivor_hung(start_server, rng):
    # Rank 0 holds an accepted batch inside the round while rank 1 waits for
    # a batch of its own; rank 1 is killed then (SIGKILL: no goodbye). Rank 0
    # must see the loss, turn unready with a reason, and give its accepted
    # batch a final state: nothing accepted may stay queued forever.
    ranks = start_job(start_server, 2, "--distributed.wait_ms", "2000", "--distributed.timeout_s", "5")
    for res in post_round(ranks, [learnable_batch(rng, n=B)] * 2):
        assert res[0] == 200 and res[1]["state"] == "done", res
    im, lb = learnable_batch(rng, n=B)
    r = ranks[0].post_arrays(im, lb)
    assert r.status_code == 202, r.text
    bid = r.json()["id"]
    wait_until(lambda: ranks[0].get("/v1/stats").json()["ring"]["in_flight"] >= 1 or
               ranks[0].batch(bid)["state"] not in ("queued",), timeout=5, what="rank 0's batch in its round")
    ranks[1].proc.kill()
    ranks[1].proc.wait()
    t0 = time.monotonic()
    final = ranks[0].wait_batch(bid, timeout=15)
    assert final["state"] in ("done", "failed"), final
    if final["state"] == "failed":
        assert final["error"]["code"] == "distributed_unavailable", final
    reasons = wait_until(lambda: (lambda x: x.json()["reasons"] if x.status_code == 503 else None)(
        ranks[0].get("/readyz")), timeout=15, what="rank 0 unready after its peer died")
    assert any("lost the other ranks" in x for x in reasons), reasons
    assert time.monotonic() - t0 < 5 + 10, "the survivor took longer than distributed.timeout_s to notice"
    # every batch rank 0 accepted has its answer: none is left pending
    assert ranks[0].metric("streamfeed_batches_pending") == 0, ranks[0].metrics_text()[-3000:]
    for s in ranks:
        s.stop(check=False)  # the survivor logged the loss as an error, as it must
    assert ranks[0].proc.returncode == 0


def test_a_rank_stopped_for_twice_the_wait_and_resumed_rejoins_and_the_ranks_stay_identical(start_server, rng):
    # SIGSTOP for 2 x wait_ms (well inside distributed.timeout_s): the other
    # rank waits in the round, the job goes on after SIGCONT, no batch is
    # lost, and the ranks end bit-identical and ready.
    wait_ms = 300
    ranks = start_job(start_server, 2, "--distributed.wait_ms", str(wait_ms), "--distributed.timeout_s", "10")
    for res in post_round(ranks, [learnable_batch(rng, n=B)] * 2):
        assert res[0] == 200 and res[1]["state"] == "done", res
    ranks[1].proc.send_signal(signal.SIGSTOP)
    try:
        im, lb = learnable_batch(rng, n=B)
        r = ranks[0].post_arrays(im, lb)
        assert r.status_code == 202, r.text
        bid = r.json()["id"]
        time.sleep(2 * wait_ms / 1000)  # the fault itself is a duration: the stop lasts twice the wait
    finally:
        ranks[1].proc.send_signal(signal.SIGCONT)
    assert ranks[0].wait_batch(bid, timeout=20)["state"] == "done"
    for _ in range(3):
        for res in post_round(ranks, [learnable_batch(rng, n=B)] * 2):
            assert res[0] == 200 and res[1]["state"] == "done", res
    last = ranks[0].get("/v1/model").json()["step"]
    wait_until(lambda: {s.get("/v1/model").json()["step"] for s in ranks} == {last}, timeout=10,
               what="both ranks at the same step")
    assert_bit_identical(ranks)
    for s in ranks:
        assert s.get("/readyz").status_code == 200
    for s in ranks:
        s.stop()


def test_rank_0_lost_while_it_writes_checkpoints_then_the_restarted_job_resumes_identical(
        start_server, rng, tmp_path):
    # Rank 0 checkpoints every step and is killed right after a round, while
    # its save may be under way. Rank 1 turns unready. Restarted, rank 0
    # resumes from the last complete checkpoint (never a torn one) and
    # broadcasts it: both ranks start from its step with the same state.
    ckpt = ["--checkpoint.dir", str(tmp_path), "--checkpoint.every_steps", "1", "--checkpoint.keep", "3"]
    ranks = start_job(start_server, 2, "--distributed.wait_ms", "20", "--distributed.timeout_s", "5",
                      rank_extra={0: ckpt})
    for _ in range(4):
        for res in post_round(ranks, [learnable_batch(rng, n=B)] * 2):
            assert res[0] == 200 and res[1]["state"] == "done", res
    # Four posts are at least four rounds, more where one rank's batch came
    # later than distributed.wait_ms after the other's (each then trains in
    # a round of its own, the other rank contributing none): the job's step
    # is read, not assumed.
    reached = ranks[0].get("/v1/model").json()["step"]
    assert 4 <= reached <= 8, reached
    # Saves run beside training: on a loaded machine none had finished by
    # the fourth step once. The kill must find one complete checkpoint (and
    # may still land in a later save).
    wait_until(lambda: any(tmp_path.glob("ckpt-*.safetensors")), timeout=30, what="rank 0's first checkpoint")
    ranks[0].proc.kill()
    ranks[0].proc.wait()
    reasons = wait_until(lambda: (lambda x: x.json()["reasons"] if x.status_code == 503 else None)(
        ranks[1].get("/readyz")), timeout=15, what="rank 1 unready after rank 0 died")
    assert any("lost the other ranks" in x for x in reasons), reasons
    for s in ranks:
        s.stop(check=False)  # rank 1 logged the loss as an error, as it must
    saved = sorted(p.name for p in tmp_path.glob("ckpt-*.safetensors"))
    assert saved, list(tmp_path.iterdir())
    resumed = start_job(start_server, 2, "--distributed.wait_ms", "20", "--distributed.timeout_s", "5",
                        rank_extra={0: ckpt + ["--checkpoint.resume", "true"]})
    steps = {s.get("/v1/model").json()["step"] for s in resumed}
    assert len(steps) == 1 and 1 <= steps.pop() <= reached, (steps, reached)
    assert_bit_identical(resumed)
    for res in post_round(resumed, [learnable_batch(rng, n=B)] * 2):
        assert res[0] == 200 and res[1]["state"] == "done", res
    assert_bit_identical(resumed)
    for s in resumed:
        s.stop()
