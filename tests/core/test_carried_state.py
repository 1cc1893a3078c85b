"""tropt.core.carried_state with known answers: tensor state a step carries outside ctx's own fields is found,
named, snapshotted and restored (issue 27 §2, issue 28 "State carried outside ctx")."""

from __future__ import annotations

import torch
from torch import nn

from tropt.core.capture import TrainingState
from tropt.core.carried_state import CarriedState, carried_state_names
from tropt.training import StepContext


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(3, 4)
        self.lin = nn.Linear(4, 2)
        self.register_buffer("count", torch.zeros(()))
        self.rnn.hidden = None  # set by forward: a carried state one level down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, h = self.rnn(x, self.rnn.hidden)
        self.rnn.hidden = h.detach()
        return self.lin(out)


class Carrier:
    def __init__(self) -> None:
        self.h: torch.Tensor | None = None
        self.pair = (torch.zeros(2), torch.zeros(2))


def make_ctx(model: nn.Module | None = None) -> StepContext:
    model = model or Holder()
    return StepContext(model, torch.optim.SGD(model.parameters(), lr=0.1), None, None,
                       lambda m, b: m(b).pow(2).mean(), None, 1, torch.device("cpu"))


def closure_step():
    hidden = None
    state = {"h": None}

    def step(ctx, micro_batches):
        nonlocal hidden
        hidden = torch.ones(2) if hidden is None else hidden + 1
        state["h"] = hidden * 2
        ctx.model(micro_batches[0]).pow(2).mean().backward()

    return step


def test_finds_module_attributes_ctx_objects_and_closure_variables_but_not_parameters_or_buffers():
    ctx = make_ctx()
    ctx.carrier = Carrier()
    step = closure_step()
    step(ctx, [torch.randn(2, 1, 3)])
    names = carried_state_names(ctx, step)
    assert {"model.rnn.hidden", "ctx.carrier.pair", "step.hidden", "step.state['h']"} <= set(names)
    # parameters, buffers and nn.RNN's own list of its weights (_flat_weights) are never carried state
    assert not [n for n in names if "weight" in n or "count" in n or "bias" in n], names
    assert "ctx.carrier.h" not in names  # it holds None: a candidate kept in snapshots, not named


def test_restore_puts_back_what_the_step_changed_and_names_it():
    ctx = make_ctx()
    ctx.carrier = Carrier()
    step = closure_step()
    x = torch.randn(2, 1, 3)
    step(ctx, [x])
    snap = CarriedState.take(ctx, step)
    before = ctx.model.rnn.hidden.clone()
    step(ctx, [torch.randn(2, 1, 3)])
    ctx.carrier.h = torch.full((2,), 7.0)
    assert set(snap.changed()) == {"model.rnn.hidden", "step.hidden", "step.state['h']", "ctx.carrier.h"}
    snap.restore()
    assert snap.changed() == []
    assert torch.equal(ctx.model.rnn.hidden, before)
    assert ctx.carrier.h is None  # it held None at the snapshot
    assert step.__closure__ is not None
    cell = dict(zip(step.__code__.co_freevars, step.__closure__))["hidden"]
    assert torch.equal(cell.cell_contents, torch.ones(2))


def test_an_attribute_set_after_the_snapshot_is_removed_and_an_attached_state_is_reported():
    model = nn.Linear(3, 3)
    ctx = make_ctx(model)
    snap = CarriedState.take(ctx)
    model.cache = model(torch.randn(1, 3))  # still attached to the graph
    assert snap.changed() == ["model.cache"]
    assert CarriedState.take(ctx).attached == ["model.cache"]
    snap.restore()
    assert not hasattr(model, "cache")


def test_training_state_restores_the_carried_state_with_the_rest():
    ctx = make_ctx()
    step = closure_step()
    step(ctx, [torch.randn(2, 1, 3)])
    state = TrainingState(ctx, step)
    hidden = ctx.model.rnn.hidden.clone()
    weight = ctx.model.lin.weight.detach().clone()
    ctx.optimizer.step()
    step(ctx, [torch.randn(2, 1, 3)])
    state.restore()
    assert torch.equal(ctx.model.rnn.hidden, hidden) and torch.equal(ctx.model.lin.weight, weight)
    assert state.carried.changed() == []


def test_training_state_snapshots_every_optimizer_on_ctx_optimizers():
    ctx = make_ctx()
    second = torch.optim.Adam(ctx.model.lin.parameters(), lr=0.1)
    ctx.more_optimizers = (second,)  # a two-optimizer Setup's second one: ctx.optimizers lists both
    state = TrainingState(ctx)
    ctx.model(torch.randn(2, 1, 3)).pow(2).mean().backward()
    second.step()
    assert second.state  # Adam's moments now exist
    state.restore()
    assert not any(second.state.values())


def test_a_weight_spectral_norm_recomputes_each_forward_is_not_carried_state():
    model = nn.utils.spectral_norm(nn.Linear(3, 3))
    model(torch.randn(2, 3))  # sets model.weight, a plain attribute computed from weight_orig
    assert "weight" in vars(model)
    assert carried_state_names(make_ctx(model)) == []


def test_a_dataset_the_step_closes_over_is_data_not_carried_state():
    data = torch.utils.data.TensorDataset(torch.randn(8, 3))

    class Windows(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.tokens = torch.arange(10)

        def __len__(self) -> int:
            return 5

        def __getitem__(self, i):
            return self.tokens[i:i + 2]

    windows = Windows()

    def step(ctx, micro_batches):
        return data, windows

    assert carried_state_names(make_ctx(), step) == []


def test_a_callable_step_object_carries_its_attributes():
    class Step:
        def __init__(self) -> None:
            self.hidden: torch.Tensor | None = None

        def __call__(self, ctx, micro_batches):
            self.hidden = torch.zeros(2) if self.hidden is None else self.hidden + 1

    step = Step()
    ctx = make_ctx()
    step(ctx, [])
    snap = CarriedState.take(ctx, step)
    step(ctx, [])
    assert snap.changed() == ["step.hidden"]
    snap.restore()
    assert torch.equal(step.hidden, torch.zeros(2))
