"""loop.zero_grad names a carried hidden state that is not detached in its summary, not only in its metrics."""

from __future__ import annotations

from ports import rnn_lm

from tropt.loop import check_zero_grad
from tropt.result import Status


def test_zero_grad_summary_names_the_hidden_state_that_is_not_detached():
    r = check_zero_grad(rnn_lm.word_lm_on_model_setup(attached=True))
    assert r.status in (Status.FAIL, Status.WARN), r.summary
    assert "carried_state_attached" in r.metrics
    assert r.summary.startswith("the hidden state model.hidden is not detached between steps"), r.summary
    assert "cause not isolated" not in r.summary
    assert "detach" in r.advice[0]


def test_zero_grad_healthy_hidden_state_is_not_named():
    r = check_zero_grad(rnn_lm.word_lm_on_model_setup())
    assert r.status is Status.PASS, r.summary
    assert "not detached" not in r.summary
