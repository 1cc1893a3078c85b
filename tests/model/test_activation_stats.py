"""model.activation_stats: dead rectifier units and saturated sigmoid/tanh layers are found and named."""

from __future__ import annotations

import pytest
import torch
from support.model_fixtures import mlp, problems, run, setup_for
from torch import nn

import tropt
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


class FunctionalRelu(nn.Module):
    """Linear layers with F.relu in forward(): no activation module to hook, only the Linear outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 64), nn.Linear(64, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_a_check_that_judged_no_unit_is_a_skip_with_the_reason():
    m = FunctionalRelu()
    with torch.no_grad():
        m.a.bias.fill_(-10.0)  # every unit dead: invisible without an activation module, so never a PASS
    r = run(check_activation_stats, setup_for(m))
    assert r.status is Status.SKIP, r.summary
    assert "no activation module ran" in r.summary and "functionally" in r.summary
    assert r.metrics["judged_layers"] == 0 and r.metrics["hooked_layers"] == 2  # the Linear outputs were seen


def tiny_gpt2_setup():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    model = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(0, 100, (4, 16), generator=g)} for _ in range(4)]
    return tropt.Setup(model, lambda m, b: m(input_ids=b["input_ids"], labels=b["input_ids"]).loss,
                       lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), batches)


def test_gpt2_mlp_activations_are_hooked_and_judged():
    """GPT-2's MLP activation is transformers' NewGELUActivation (not an nn.GELU) and its projections are Conv1D (not
    nn.Linear): both are recognised, so the check judges the 2 x 128 MLP units instead of PASSing on lm_head alone."""
    r = run(check_activation_stats, tiny_gpt2_setup(), steps=2)
    layers = r.tables["layers"]
    acts = layers[layers["kind"] == "rectifier"].drop_duplicates("layer")
    assert list(acts["layer"]) == ["transformer.h.0.mlp.act", "transformer.h.1.mlp.act"]
    assert set(acts["type"]) == {"NewGELUActivation"} and set(acts["units"]) == {128}
    assert {"transformer.h.0.mlp.c_fc", "transformer.h.1.attn.c_proj"} <= set(layers["layer"])  # Conv1D outputs
    assert r.metrics["judged_layers"] == 2 and r.metrics["judged_units"] == 256
    assert r.status is Status.PASS and "2 activation layers (256 units) judged" in r.summary, r.summary


# ------------------------------------------------------------------ losses that differentiate inside themselves
def test_a_wgan_gp_critic_is_judged_with_its_gradient_penalty_evaluated_with_gradients():
    from support.grad_penalty import critic, wgan_gp_setup

    r = run(check_activation_stats, wgan_gp_setup(), n_batches=2, steps=5)
    assert r.status is Status.PASS, r.summary
    assert set(r.tables["layers"]["phase"]) == {"init", "train", "after"}
    dead = run(check_activation_stats, wgan_gp_setup(critic(bias=-20.0)), n_batches=2, steps=5)
    assert dead.status is Status.FAIL and "dead units" in dead.summary, dead.summary
