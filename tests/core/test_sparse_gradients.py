"""Sparse gradients (nn.Embedding(sparse=True)) are read by tropt's recorders, and a failure of tropt's own hook
inside optimizer.step() is tropt's, not the user's step's."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.result import Status

CHECKS = ["model.gradient_flow", "model.overfit_batch", "loop.zero_grad", "dynamics.loss_curve"]
# loop.accumulation's cause predictions densify too: see the last test.


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 4, sparse=True)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(x).mean(1))


def _batches() -> list:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(8):
        x = torch.randint(0, 20, (16, 3), generator=g)
        out.append((x, (x[:, 0] % 2)))
    return out


def _loss(model: nn.Module, batch: tuple) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def _optimizers(kind: str):
    if kind == "sgd":
        return lambda m: torch.optim.SGD(m.parameters(), lr=0.5)
    return (lambda m: torch.optim.SparseAdam(list(m.emb.parameters()), lr=0.05),
            lambda m: torch.optim.Adam(m.head.parameters(), lr=0.05))


def _step(ctx, micro_batches):
    for o in ctx.optimizers:
        o.zero_grad()
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
    for o in ctx.optimizers:
        o.step()


@pytest.mark.parametrize("kind", ["sgd", "sparse_adam"])
def test_sparse_embedding_gradients_are_judged_not_errors(kind: str) -> None:
    torch.manual_seed(0)
    setup = tropt.Setup(Bag(), _loss, _optimizers(kind), _batches(), step=_step, num_classes=2)
    report = tropt.diagnose(setup, checks=CHECKS, budget="quick", progress=False)
    for r in report.results:
        assert r.status is not Status.ERROR, f"{r.check}: {r.summary}"
    flow = {r.check: r for r in report.results}["model.gradient_flow"]
    assert flow.status is Status.PASS, flow.summary


def test_monitor_sparse_norms_equal_the_dense_ones() -> None:
    torch.manual_seed(0)
    model = Bag()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batches()[0]
    with tropt.GradientMonitor(model, full_every=1, detail=True) as mon:
        F.cross_entropy(model(x), y).backward()
        dense = model.emb.weight.grad.to_dense()
        opt.step()
    row = mon.frame().set_index("name").loc["emb.weight"]
    assert row["grad_norm"] == pytest.approx(float(dense.norm()), rel=1e-6)
    assert row["zero_fraction"] == pytest.approx(float((dense == 0).float().mean()), rel=1e-6)


def test_a_failure_inside_tropts_hook_is_not_blamed_on_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from tropt.model import monitor

    def broken(*a, **k):
        raise RuntimeError("synthetic failure of tropt's own hook")

    monkeypatch.setattr(monitor.GradientMonitor, "_record_grads", broken)
    torch.manual_seed(0)
    setup = tropt.Setup(Bag(), _loss, _optimizers("sgd"), _batches(), step=_step, num_classes=2)
    r = tropt.diagnose(setup, checks=["model.gradient_flow"], budget="quick", progress=False).results[0]
    assert r.status is Status.ERROR
    assert "your step function" not in r.summary and "synthetic failure" in r.summary
    assert "tropt" in r.summary and "inside optimizer.step()" in r.summary


def test_accumulation_names_a_missing_division_by_k_with_sparse_gradients():
    """The cause predictions copy each parameter's gradient: a sparse one is made dense first (it raised before)."""
    from ports.tabular import dlrm_setup

    from tropt.loop import check_accumulation

    def summed(ctx, micro_batches):
        ctx.optimizer.zero_grad()
        for mb in micro_batches:
            ctx.loss_fn(ctx.model, mb).backward()  # the planted bug: no / K
        ctx.optimizer.step()

    r = check_accumulation(dlrm_setup(sparse=True).replace(accumulation_steps=2, step=summed), progress=False)
    assert r.status is Status.FAIL, r.summary
    assert "micro-batch losses are summed" in r.summary, r.summary
