"""What the step recorder reads as a param group's learning rate (tropt.core.capture.group_lr), and the optimizers
without a float learning rate (issue 28): Hugging Face's ``Adafactor(relative_step=True)`` takes ``lr=None`` and
schedules its own relative step. Its lr is recorded as the step it applies, an lr tropt cannot read as NaN
(unknown), and neither is a crash blamed on the user's step nor a "learning rate 0"."""

from __future__ import annotations

import math

import pytest
import torch
from support import family_ports as fp
from torch import nn

import tropt
from tropt.core.capture import StepRecorder
from tropt.result import Status
from tropt.testing import untouched

pytest.importorskip("transformers")


def _one_step(opt_factory) -> list[float]:
    setup = tropt.Setup(fp.class_mlp(), fp.class_ce, opt_factory, fp.class_batches())
    ctx = setup.build()
    with StepRecorder(ctx, capture="lr") as rec:
        for batch in fp.class_batches(3):
            setup.run_step(ctx, [batch])
    return [r.lrs[0] for r in rec.records]


def test_adafactor_relative_step_is_recorded_as_the_step_it_applies():
    # warmup_init: the relative step at optimizer step t is min(1e-6 * t, 1 / sqrt(t)).
    assert _one_step(fp.adafactor) == pytest.approx([1e-6, 2e-6, 3e-6])


def test_adafactor_without_warm_up_applies_its_constant_relative_step():
    from transformers.optimization import Adafactor

    lrs = _one_step(lambda m: Adafactor(m.parameters(), lr=None, relative_step=True, warmup_init=False))
    assert lrs == pytest.approx([1e-2, 1e-2, 1e-2])  # min(1e-2, 1/sqrt(t)) for t <= 3


def test_learning_rates_that_are_no_number_are_unknown_not_zero_or_a_crash():
    from tropt.core.capture import group_lr

    p = nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.5)
    assert group_lr(opt, {"params": [p], "lr": 0.5}) == 0.5
    assert group_lr(opt, {"params": [p], "lr": torch.tensor(0.25)}) == 0.25  # a tensor lr (capturable optimizers)
    assert group_lr(opt, {"params": [p], "lr": 0}) == 0.0
    for odd in (None, "1e-3", object()):
        assert math.isnan(group_lr(opt, {"params": [p], "lr": odd}))
    assert math.isnan(group_lr(opt, {"params": [p]}))  # no "lr" key at all


def test_healthy_adafactor_gets_no_fail_or_error_from_the_model_and_loop_checks():
    setup = fp.adafactor_setup()
    with untouched(setup):
        report = tropt.diagnose(setup, checks=["model", "loop"], budget="quick", progress=False)
    bad = {r.check: (r.status.value, r.summary) for r in report.results if r.status in (Status.FAIL, Status.ERROR)}
    assert not bad, bad
    # The checks that read learning rates ran, not skipped.
    ran = {r.check for r in report.results if r.status is Status.PASS}
    assert {"model.gradient_flow", "loop.zero_grad", "loop.accumulation", "loop.resume"} <= ran, report.to_frame()
