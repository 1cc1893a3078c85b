"""Setup.build's copies of models that ``copy.deepcopy`` refuses (issue 28, parametrized models).

The hook-based ``torch.nn.utils.spectral_norm`` and ``weight_norm`` (SNGAN, BigGAN, HiFi-GAN discriminators) keep
the weight their forward pre-hook last computed as a plain attribute; after a forward pass with gradients enabled it
is a non-leaf tensor, and ``copy.deepcopy`` raises "Only Tensors created explicitly by the user (graph leaves)
support the deepcopy protocol". Every check then ERRORed with that raw RuntimeError. The copy now takes such
attributes detached (the hooks recompute them at the next forward); the parametrization API copies as before.
"""

from __future__ import annotations

import pytest
import torch
from support import family_ports as fp
from torch import nn

import tropt
from tropt.result import Status
from tropt.testing import untouched

KINDS = ["hooks", "weight_norm", "parametrization"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_normalised_model_after_a_forward_pass_gets_no_error_from_the_model_and_loop_checks(kind):
    setup = fp.spectral_norm_setup(kind)
    with untouched(setup):
        report = tropt.diagnose(setup, checks=["model", "loop"], budget="quick", progress=False)
    errors = {r.check: r.summary for r in report.results if r.status is Status.ERROR}
    assert not errors, errors
    assert report["model.gradient_flow"].status is Status.PASS, report["model.gradient_flow"].summary


@pytest.mark.parametrize("kind", KINDS)
def test_the_copy_is_independent_and_computes_what_the_original_does(kind):
    setup = fp.spectral_norm_setup(kind)
    x = fp.class_batches()[0][0]
    ctx = setup.build()
    original = {n: p for n, p in setup.model.named_parameters()}
    assert all(p is not original[n] for n, p in ctx.model.named_parameters())
    ctx.model.eval()
    setup.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(ctx.model(x), setup.model(x))
    setup.model.train()
    # a copy of a copy that has trained a step (its hooks left a fresh non-leaf weight on it) is made as well
    setup.run_step(ctx, [fp.class_batches()[0]])
    again = setup.build(model=ctx.model)
    assert sum(1 for _ in again.model.parameters()) == sum(1 for _ in ctx.model.parameters())


def test_a_cached_activation_with_a_graph_is_copied_detached_and_the_original_keeps_its_graph():
    from tropt.snapshot import copy_module

    class Caches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 2)
            self.last = None

        def forward(self, x):
            self.last = self.lin(x)
            return self.last

    m = Caches()
    m(torch.randn(4, 3))
    copied = copy_module(m)
    assert copied.last is not None and copied.last.grad_fn is None and not copied.last.requires_grad
    torch.testing.assert_close(copied.last, m.last.detach())
    assert m.last.grad_fn is not None  # the user's module is untouched
