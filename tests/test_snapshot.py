"""The snapshot/restore guard and the shared no-mutation helper: they detect what they are shown and restore on
errors."""

import random

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from tropt.snapshot import preserved
from tropt.testing import assert_untouched, untouched


def _objects():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.1), nn.Linear(4, 2))
    model.eval()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt, sched


def _train_a_bit(model, opt, sched):
    model.train()
    for _ in range(3):
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        sched.step()
    model[0].weight.requires_grad_(False)
    model.register_forward_hook(lambda *a: None)
    opt.register_step_pre_hook(lambda *a: None)
    np.random.rand()
    random.random()
    torch.set_grad_enabled(False)


@pytest.mark.parametrize("mutation, expected", [
    (lambda m, o, s: m.train(), "training mode False -> True"),
    (lambda m, o, s: m[0].weight.data.add_(1), "tensor 0.weight: values"),
    (lambda m, o, s: m[1].running_mean.add_(1), "tensor 1.running_mean: values"),
    (lambda m, o, s: setattr(m[0].weight, "grad", None), "tensor 0.weight: .grad changed"),
    (lambda m, o, s: m[3].bias.requires_grad_(False), "requires_grad True -> False"),
    (lambda m, o, s: m[2].register_forward_pre_hook(lambda *a: None), "_forward_pre_hooks changed"),
    (lambda m, o, s: setattr(m[0], "weight", nn.Parameter(torch.zeros(4, 4))), "parameter objects replaced"),
    (lambda m, o, s: m.double(), "values, dtype or device changed"),
    (lambda m, o, s: o.param_groups[0].update(lr=1.0), "Adam: state_dict changed"),
    (lambda m, o, s: s.step(), "StepLR: state_dict changed"),
    (lambda m, o, s: o.register_step_post_hook(lambda *a: None), "_optimizer_step_post_hooks changed"),
    (lambda m, o, s: torch.rand(1), "torch CPU RNG state advanced"),
    (lambda m, o, s: np.random.rand(), "numpy global RNG state advanced"),
    (lambda m, o, s: random.random(), "python random state advanced"),
])
def test_untouched_detects_each_mutation(mutation, expected):
    model, opt, sched = _objects()
    with pytest.raises(AssertionError, match="modified") as info, untouched(model, opt, sched):
        mutation(model, opt, sched)
    assert expected in str(info.value)


def test_untouched_passes_when_nothing_changes():
    model, opt, sched = _objects()
    x = torch.randn(2, 4)
    with untouched(model, opt, sched):
        model(x)  # eval-mode forward: no state change
    assert assert_untouched(lambda: 42, model) == 42


def test_untouched_watches_dataframes_and_arrays():
    df = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    with pytest.raises(AssertionError, match="DataFrame changed"), untouched(df):
        df.loc[0, "a"] = 9
    arr = np.zeros(3)
    with pytest.raises(AssertionError, match="ndarray of shape"), untouched(arr):
        arr[1] = 1
    with untouched(df):
        df.sort_values("a").assign(c=1)  # copies are fine


def test_preserved_restores_everything_even_on_exception():
    model, opt, sched = _objects()
    weight = model[0].weight
    with untouched(model, opt, sched), pytest.raises(RuntimeError, match="boom"), preserved(model, opt, sched):
        _train_a_bit(model, opt, sched)
        model.double()
        raise RuntimeError("boom")
    assert model[0].weight is weight and torch.is_grad_enabled()


def test_preserved_restores_dtype_change_and_replaced_parameter():
    model, opt, _sched = _objects()
    original = model[0].weight
    with untouched(model, opt), preserved(model, opt):
        model[0].weight = nn.Parameter(torch.ones(4, 4))
        model.half()
    assert model[0].weight is original and original.dtype == torch.float32
