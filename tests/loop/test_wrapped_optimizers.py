"""Optimizers that wrap another (issue: real loops beyond torch's own optimizers): one record per update whether the
wrapper's own step() steps the wrapped optimizer (Lookahead) or the wrapped one is stepped directly (SAM, in
real_loops.py); a closure's gradient read after its first evaluation (LBFGS, in real_loops.py)."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

import tropt
from tropt.core.capture import run_steps, stepping_optimizers
from tropt.result import Status


class Lookahead(torch.optim.Optimizer):
    """k fast steps of the wrapped optimizer, then the slow weights move alpha of the way: its step() calls the
    wrapped optimizer's step(). Like a popular image-model library's, it never calls Optimizer.__init__ and makes
    its own (empty) step-hook dicts, which torch's step wrapper needs."""

    def __init__(self, optimizer: torch.optim.Optimizer, k: int = 2, alpha: float = 0.5) -> None:
        self.optimizer, self.k, self.alpha, self.count = optimizer, k, alpha, 0
        self.param_groups = optimizer.param_groups
        self.defaults = optimizer.defaults
        self.state = optimizer.state
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = OrderedDict(), OrderedDict()
        self.slow = [p.detach().clone() for g in self.param_groups for p in g["params"]]

    @torch.no_grad()
    def step(self, closure=None):
        loss = self.optimizer.step(closure)
        self.count += 1
        if self.count % self.k == 0:
            for p, s in zip((p for g in self.param_groups for p in g["params"]), self.slow):
                s.add_(p - s, alpha=self.alpha)
                p.copy_(s)
        return loss

    def state_dict(self):
        return {"inner": self.optimizer.state_dict(), "count": self.count, "slow": [s.clone() for s in self.slow]}

    def load_state_dict(self, state):
        self.optimizer.load_state_dict(state["inner"])
        self.count = state["count"]
        for s, v in zip(self.slow, state["slow"]):
            s.copy_(v)


def _setup() -> tropt.Setup:
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = x @ torch.randn(8, 1)
    return tropt.Setup(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)),
                       lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
                       optimizer=lambda m: Lookahead(torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)),
                       train_data=[(x[:32], y[:32]), (x[32:], y[32:])])


class HookedLookahead(Lookahead):
    """The same, initialised as an Optimizer (its own step is hooked, and steps the wrapped one inside)."""

    def __init__(self, optimizer: torch.optim.Optimizer, k: int = 2, alpha: float = 0.5) -> None:
        torch.optim.Optimizer.__init__(self, [p for g in optimizer.param_groups for p in g["params"]],
                                       optimizer.defaults)
        super().__init__(optimizer, k, alpha)


@pytest.mark.parametrize("wrapper", [Lookahead, HookedLookahead])
def test_a_wrapped_step_inside_the_wrappers_step_is_one_update(wrapper):
    setup = _setup().replace(optimizer=lambda m: wrapper(torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)))
    ctx = setup.build()
    assert [type(o).__name__ for o in stepping_optimizers(ctx.optimizer)] == [wrapper.__name__, "SGD"]
    records, calls = run_steps(setup, ctx, [setup.split(b, 1) for b in setup.batches(3)])
    assert calls == [1, 1, 1] and len(records) == 3  # not 2 per call: the SGD step is part of Lookahead's
    assert all(r.grad_norm > 0 for r in records)


def test_lookahead_loop_checks_pass():
    results = {r.check: r for r in tropt.diagnose(_setup(),
                                                  checks=["loop.zero_grad", "loop.accumulation", "loop.resume"],
                                                  progress=False).results}
    for cid, r in results.items():
        assert r.status in (Status.PASS, Status.WARN) and r.status is not Status.FAIL, (cid, r.summary)
    assert results["loop.zero_grad"].status is Status.PASS, results["loop.zero_grad"].summary
    assert results["loop.accumulation"].metrics.get("optimizer_steps_per_call", 1) == 1
