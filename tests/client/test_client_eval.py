"""Evaluation through the Python client (sync and asyncio) against the real
server: eval batches' loss, top1 and top5, logits that agree with them,
named evaluations and their bound, deleting a finished evaluation to free
its name (and eval_busy while its batches wait), the 202 whose wait ran out
followed to the kept logits, and the kept-logits errors as typed
exceptions."""
import asyncio
import math

import numpy as np
import pytest

from streamfeed import (BatchAccepted, BatchResult, Client, Conflict, EvalList, EvalSummary, Gone, NotFound,
                        PayloadTooLarge, Unauthorized, encode_batch)

from test_client import colour_batch

# Twelve 256-sample training batches take the tiny model on the reference
# backend about a second: an eval batch queued behind them waits that long.
QUEUED_BATCHES, QUEUED_N = 12, 256
RING = ["--ring.slots", "16"]


def softmax_xent(logits, labels):
    """The mean cross-entropy of float logits [N, K] against class labels [N]."""
    z = logits.astype(np.float64)
    logp = z - z.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    return float(-logp[np.arange(len(labels)), labels].mean())


def top_k(logits, labels, k):
    """The share of samples whose label is among the k largest logits."""
    best = np.argsort(-logits, axis=1)[:, :k]
    return float(np.mean([labels[i] in best[i] for i in range(len(labels))]))


def queue_training_and_shorten_the_wait(c, rng):
    """Queues about a second of training, then sets the server's wait to
    1 ms, so that a return=logits batch posted next is answered 202 while
    it waits its turn. Returns the id the next batch will get."""
    body = encode_batch(*colour_batch(rng, QUEUED_N))
    ids = [c.post_body(body)[0].id for _ in range(QUEUED_BATCHES)]
    c.patch_config({"pipeline": {"wait_timeout_ms": 1}})
    return ids[-1] + 1


def restore_the_wait(c):
    c.patch_config({"pipeline": {"wait_timeout_ms": 60000}})


def logits_through_a_202(c, rng, x, y):
    """c.logits(x, y) for a batch whose POST is answered 202; returns
    (logits, the batch's id), after checking that the server kept them."""
    bid = queue_training_and_shorten_the_wait(c, rng)
    try:
        logits = c.logits(x, y)
    finally:
        restore_the_wait(c)
    b = c.batch(bid)
    assert b.kind == "eval" and b.logits_state == "kept", b.raw
    return logits, bid


# ---- sync ---------------------------------------------------------------------------------


def test_evaluate_returns_loss_top1_and_top5_and_takes_no_step(start_server, rng):
    c = start_server().client()
    for _ in range(2):
        assert c.post_batch(*colour_batch(rng, 8), wait=True).done
    e = c.evaluate(*colour_batch(rng, 8))
    assert isinstance(e, BatchResult) and e.done and e.kind == "eval" and e.eval_name == "default"
    assert e.step == 2 and math.isfinite(e.loss)
    assert 0 <= e.top1 <= e.top5 <= 1 and e.top1 == e.accuracy and e["top5"] == e.top5
    queued = c.evaluate(*colour_batch(rng, 8), eval="later", wait=False)
    assert isinstance(queued, BatchAccepted)
    later = c.wait_batch(queued.id)
    assert later.kind == "eval" and later.eval_name == "later" and later.top5 is not None
    # Training goes on from the same step count: the evals took none.
    assert c.post_batch(*colour_batch(rng, 8), wait=True).step == 3
    train = c.batch(1)
    assert train.kind == "train" and train.top1 is None and train.eval_name is None


def test_logits_have_the_batch_shape_and_agree_with_the_eval_loss_top1_and_top5(start_server, rng):
    c = start_server().client()
    c.post_batch(*colour_batch(rng, 16), wait=True)
    x, y = colour_batch(rng, 5)
    logits = c.logits(x, y)
    assert isinstance(logits, np.ndarray) and logits.shape == (5, 10) and logits.dtype == np.float32
    e = c.evaluate(x, y)
    assert math.isclose(e.loss, softmax_xent(logits, y), rel_tol=1e-5), (e.loss, softmax_xent(logits, y))
    assert e.top1 == float(np.mean(logits.argmax(1) == y))
    assert e.top5 == top_k(logits, y, 5)
    # Eval mode is deterministic: the same batch, the same logits (NCHW too).
    assert np.array_equal(c.logits(np.ascontiguousarray(x.transpose(0, 3, 1, 2)), y), logits)
    # The server scores every eval batch: labels are required, and checked before sending.
    with pytest.raises(ValueError, match="labels are required"):
        c.logits(x, None)
    with pytest.raises(ValueError, match="1 to 64 characters"):
        c.evaluate(x, y, eval="no spaces")


def test_named_evaluations_are_sample_weighted_listed_and_bounded(start_server, rng):
    c = start_server("--eval.max_names", "2").client()
    c.post_batch(*colour_batch(rng, 8), wait=True)
    a = c.evaluate(*colour_batch(rng, 2), eval="holdout")
    b = c.evaluate(*colour_batch(rng, 6), eval="holdout")
    g = c.eval_summary("holdout")
    assert isinstance(g, EvalSummary) and g.name == "holdout"
    assert g.batches == 2 and g.samples == 8 and g.failed_batches == 0 and g.pending_batches == 0
    assert g.first_step == g.last_step == 1
    assert math.isclose(g.loss, (2 * a.loss + 6 * b.loss) / 8, rel_tol=1e-6)
    assert math.isclose(g.top1, (2 * a.top1 + 6 * b.top1) / 8, rel_tol=1e-9)
    assert math.isclose(g.top5, (2 * a.top5 + 6 * b.top5) / 8, rel_tol=1e-9)
    c.evaluate(*colour_batch(rng, 2), eval="val.v2")
    listed = c.evals()
    assert isinstance(listed, EvalList) and listed.names() == ["holdout", "val.v2"] and listed.max_names == 2
    assert len(listed) == 2 and [e.samples for e in listed] == [8, 2]
    with pytest.raises(Conflict) as e:
        c.evaluate(*colour_batch(rng, 2), eval="third")
    assert e.value.code == "too_many_evals" and e.value.status == 409
    with pytest.raises(NotFound) as e:
        c.eval_summary("nobody")
    assert e.value.code == "eval_not_found"


def test_delete_eval_returns_the_final_summary_and_frees_the_name(start_server, rng):
    c = start_server("--eval.max_names", "2").client()
    c.evaluate(*colour_batch(rng, 3), eval="epoch-1")
    c.evaluate(*colour_batch(rng, 5), eval="epoch-1")
    c.evaluate(*colour_batch(rng, 2), eval="epoch-2")
    with pytest.raises(Conflict) as e:
        c.evaluate(*colour_batch(rng, 2), eval="epoch-3")
    assert e.value.code == "too_many_evals"
    before = c.eval_summary("epoch-1")
    final = c.delete_eval("epoch-1")
    assert isinstance(final, EvalSummary) and final == before and final.batches == 2 and final.samples == 8
    assert c.evals().names() == ["epoch-2"]
    with pytest.raises(NotFound) as e:
        c.eval_summary("epoch-1")
    assert e.value.code == "eval_not_found"
    with pytest.raises(NotFound) as e:
        c.delete_eval("epoch-1")
    assert e.value.code == "eval_not_found" and e.value.method == "DELETE"
    # The freed place takes a new name; the old name comes back from zero.
    c.evaluate(*colour_batch(rng, 2), eval="epoch-3")
    c.delete_eval("epoch-2")
    again = c.evaluate(*colour_batch(rng, 4), eval="epoch-1")
    g = c.eval_summary("epoch-1")
    assert g.batches == 1 and g.samples == 4 and math.isclose(g.loss, again.loss, rel_tol=1e-6)
    # Checked before sending, like every name.
    with pytest.raises(ValueError, match="1 to 64 characters"):
        c.delete_eval("no spaces")


def test_delete_eval_of_a_name_whose_accepted_batches_wait_raises_eval_busy(start_server, rng):
    c = start_server(*RING).client()
    body = encode_batch(*colour_batch(rng, QUEUED_N))
    for _ in range(QUEUED_BATCHES):
        c.post_body(body)
    queued = c.evaluate(*colour_batch(rng, 4), eval="late", wait=False)
    assert isinstance(queued, BatchAccepted)
    with pytest.raises(Conflict) as e:
        c.delete_eval("late")
    assert e.value.code == "eval_busy" and e.value.status == 409 and e.value.retry_after == 1
    assert "1 accepted batch not yet finished" in e.value.message
    assert c.batch(queued.id).state in ("queued", "transforming", "training"), "it finished before the DELETE"
    # Once it finished it counted, and the name goes.
    assert c.wait_batch(queued.id).done
    assert c.delete_eval("late").batches == 1


def test_delete_eval_needs_the_token_of_a_server_that_has_one(start_server, rng):
    s = start_server("--http.token", "t0k")
    c = Client(s.url, token="t0k")
    c.evaluate(*colour_batch(rng, 2), eval="guarded")
    with pytest.raises(Unauthorized) as e:
        Client(s.url).delete_eval("guarded")
    assert e.value.code == "unauthorized"
    assert c.delete_eval("guarded").name == "guarded"


def test_logits_whose_server_wait_ran_out_are_fetched_from_where_the_202_says(start_server, rng):
    c = start_server(*RING).client()
    x, y = colour_batch(rng, 5)
    kept, bid = logits_through_a_202(c, rng, x, y)
    assert kept.shape == (5, 10) and kept.dtype == np.float32
    # Nothing trained since: the same weights answer the same logits in the POST's reply.
    assert np.array_equal(c.logits(x, y), kept)
    # Kept, not consumed: the GET route answers them again, waiting or not.
    assert np.array_equal(c.batch_logits(bid), kept)
    assert np.array_equal(c.batch_logits(bid, wait=False), kept)


def test_kept_logits_that_were_let_go_or_never_kept_raise_gone_and_not_found(start_server, rng):
    c = start_server(*RING, "--eval.logits_keep_max", "1", "--eval.logits_keep_bytes", "4096").client()
    x, y = colour_batch(rng, 3)
    _, first = logits_through_a_202(c, rng, x, y)
    _, second = logits_through_a_202(c, rng, x, y)
    # One more than eval.logits_keep_max: the first batch's logits were let go.
    with pytest.raises(Gone) as e:
        c.batch_logits(first)
    assert e.value.code == "logits_expired" and e.value.status == 410
    assert c.batch(first).logits_state == "expired"
    assert c.batch_logits(second).shape == (3, 10)
    with pytest.raises(NotFound) as e:
        c.batch_logits(1)  # a training batch
    assert e.value.code == "logits_not_kept"
    with pytest.raises(NotFound) as e:
        c.batch_logits(999999, wait=False)
    assert e.value.code == "batch_not_found"
    # 128 x 10 floats are 5120 bytes: more than a 202 could keep, refused up front.
    with pytest.raises(PayloadTooLarge) as e:
        c.logits(*colour_batch(rng, 128))
    assert e.value.code == "logits_too_large"


def test_logits_that_do_not_come_within_the_wait_timeout_raise_timeout_error_naming_the_batch(start_server, rng):
    s = start_server(*RING)
    c = s.client()
    impatient = Client(s.url, timeout=0.2, wait_timeout=0.2)
    x, y = colour_batch(rng, 4)
    bid = queue_training_and_shorten_the_wait(c, rng)
    try:
        with pytest.raises(TimeoutError, match=rf"batch_logits\({bid}\)"):
            impatient.logits(x, y)
    finally:
        restore_the_wait(c)
    # The server kept them: they come once the queue has drained.
    assert c.batch_logits(bid).shape == (4, 10)


# ---- asyncio ------------------------------------------------------------------------------


def test_the_asyncio_client_evaluates_returns_logits_and_follows_a_202(start_server, rng):
    from streamfeed.aio import AsyncClient

    s = start_server(*RING)
    c = s.client()
    x, y = colour_batch(rng, 5)

    async def main():
        async with AsyncClient(s.url) as a:
            await a.post_batch(*colour_batch(rng, 16), wait=True)
            e = await a.evaluate(x, y, eval="holdout")
            assert isinstance(e, BatchResult) and e.kind == "eval" and e.eval_name == "holdout" and e.step == 1
            logits = await a.logits(x, y, eval="holdout")
            assert logits.shape == (5, 10) and logits.dtype == np.float32
            assert math.isclose(e.loss, softmax_xent(logits, y), rel_tol=1e-5)
            assert e.top1 == float(np.mean(logits.argmax(1) == y)) and e.top5 == top_k(logits, y, 5)
            g = await a.eval_summary("holdout")
            assert g.batches == 2 and g.samples == 10 and math.isclose(g.loss, e.loss, rel_tol=1e-6)
            assert (await a.evals()).names() == ["holdout"]
            with pytest.raises(NotFound) as nf:
                await a.eval_summary("nobody")
            assert nf.value.code == "eval_not_found"
            d = await a.delete_eval("holdout")
            assert isinstance(d, EvalSummary) and d == g
            assert (await a.evals()).names() == []
            with pytest.raises(NotFound) as nf:
                await a.delete_eval("holdout")
            assert nf.value.code == "eval_not_found"
            with pytest.raises(NotFound) as nf:
                await a.batch_logits(1)
            assert nf.value.code == "logits_not_kept"
            with pytest.raises(ValueError, match="labels are required"):
                await a.evaluate(x, None)

            # The 202 of a wait that ran out, followed to the kept logits.
            bid = queue_training_and_shorten_the_wait(c, rng)
            try:
                kept = await a.logits(x, y)
            finally:
                restore_the_wait(c)
            b = await a.batch(bid)
            assert b.logits_state == "kept", b.raw
            assert np.array_equal(kept, await a.logits(x, y))
            assert np.array_equal(await a.batch_logits(bid, wait=False), kept)

    asyncio.run(main())
