"""model.activation_stats: dead rectifier units and saturated sigmoid/tanh layers are found and named."""

from __future__ import annotations

import torch
from support.model_fixtures import mlp, problems, run, setup_for
from torch import nn

from tropt.model import check_activation_stats
from tropt.result import Status


def negative_bias_relu() -> nn.Sequential:
    m = mlp()
    with torch.no_grad():
        m[0].bias.fill_(-10.0)
    return m


def test_relu_with_strongly_negative_biases_has_dead_units():
    r = run(check_activation_stats, setup_for(negative_bias_relu()))
    assert r.status is Status.FAIL and "dead units" in r.summary
    dead = r.tables["problems"]
    row = dead[(dead["layer"] == "1") & (dead["phase"] == "init")]
    assert len(row) == 1 and row["value"].iloc[0] == 1.0
    assert "1 (ReLU) 100% never active [init]" in r.summary


def test_saturated_tanh_warns():
    m = mlp(act=nn.Tanh)
    with torch.no_grad():
        m[0].weight.mul_(30.0)
    r = run(check_activation_stats, setup_for(m))
    assert r.status is Status.WARN and "saturation" in r.summary
    assert "1" in problems(r, "layer")
