"""tropt.core.noise_floor with known answers: streams change only the step's own draws and leave the caller's RNG as
it was; means of repeats of one distribution are inside the spread, a 4x scale is far outside it."""

from __future__ import annotations

import random

import numpy as np
import torch

from tropt.core.noise_floor import Repeats, in_expectation, repeat, reseed, scale_fit


def test_streams_differ_and_the_callers_rng_is_restored():
    torch.manual_seed(123)
    np.random.seed(7)
    random.seed(9)
    expected = (torch.rand(3), np.random.rand(), random.random())
    torch.manual_seed(123)
    np.random.seed(7)
    random.seed(9)

    def draw(stream: int) -> tuple:
        reseed(0, stream)
        return torch.randn(4), np.random.rand(), random.random()

    draws = repeat(draw, [0, 0, 1])
    assert torch.equal(draws[0][0], draws[1][0]) and draws[0][1:] == draws[1][1:]  # one stream: the same draws
    assert not torch.equal(draws[0][0], draws[2][0]) and draws[0][1] != draws[2][1]  # another: other draws
    after = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(after[0], expected[0]) and after[1:] == expected[1:]


def _noisy(mean: torch.Tensor, r: int, seed: int, noise: float = 1.0) -> Repeats:
    g = torch.Generator().manual_seed(seed)
    return Repeats.of([{"w": mean + noise * torch.randn(mean.shape, generator=g)} for _ in range(r)])


def test_same_expectation_is_inside_the_spread_and_a_4x_scale_is_outside_with_its_factor():
    mean = torch.linspace(-1, 1, 200)
    a, b = _noisy(mean, 8, 1), _noisy(mean, 8, 2)
    same = in_expectation(a, b)
    assert same.inside and same.rel_diff > 0.1  # noisy means differ, but by chance
    scaled = in_expectation(a, _noisy(4 * mean, 8, 3, noise=4.0))
    assert not scaled.inside and abs(scaled.scale - 4) < 0.5
    fit = scale_fit(_noisy(4 * mean, 8, 3, noise=4.0), a)
    assert fit.matches(4.0) and fit.excludes(1.0)


def test_a_deterministic_configuration_has_zero_spread():
    mean = torch.arange(5.0)
    rep = Repeats.of([{"w": mean.clone()} for _ in range(3)])
    assert rep.spread == 0.0 and rep.floor == 0.0
    assert in_expectation(rep, rep).inside
