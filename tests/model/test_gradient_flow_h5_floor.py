"""model.gradient_flow's comparison with PyTorch's default initialisation, under the noise-floor discipline (issue 27
§1): both models are evaluated on the same RNG stream (paired), on two streams, and ``metrics["noise_floor"]`` says
how much the loss's own randomness moves the norms."""

from __future__ import annotations

import torch
from support.model_fixtures import adam, ce, mlp, run, setup_for

from tropt.model import check_gradient_flow
from tropt.result import Status


def _randomly_scaled_loss(m, b):
    """A loss whose scale is drawn per call (1 to 1e6): its gradient norm is a matter of the draw, not the weights."""
    return ce(m, b) * 10.0 ** (6 * torch.rand(1))


def test_a_stochastic_loss_cannot_fake_an_initialisation_explosion():
    # Seed 27: the first draw scales by 10^5.9, the second by 10^0.5. Before, the model's own initialisation drew
    # the first and the default initialisation the second: a >1e3 ratio, a false "exploding gradients at
    # initialisation".
    setup = setup_for(mlp(), loss=_randomly_scaled_loss, opt=adam()).replace(seed=27)
    r = run(check_gradient_flow, setup, explode_growth=1e9)  # the init comparison alone is under test
    assert r.status is Status.PASS, r.summary
    assert r.metrics["init_grad_ratio"] < 10 and r.metrics["noise_floor"] > 0.5, r.metrics


def test_a_huge_initialisation_still_explodes_under_a_stochastic_loss_and_the_floor_is_reported():
    def noisy(m, b):
        return ce(m, (b[0] + 0.3 * torch.randn_like(b[0]), b[1]))

    m = mlp()
    with torch.no_grad():
        m[0].weight.mul_(1e4)
    r = run(check_gradient_flow, setup_for(m, loss=noisy, opt=adam()))
    assert r.status is Status.FAIL and "exploding gradients at initialisation" in r.summary, r.summary
    assert 0 < r.metrics["noise_floor"] < 0.5
    clean = run(check_gradient_flow, setup_for(mlp(), opt=adam()))
    assert clean.status is Status.PASS and clean.metrics["noise_floor"] == 0.0
