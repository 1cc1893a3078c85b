"""The micro-batch sizes loop.accumulation judges on, under both meanings of accumulation_steps (issue 28)."""

import torch
from torch import nn

import tropt
from tropt.loop._micro_sizes import train_batch_sizes, unequal_sizes


def _setup(sizes: list[int], k: int, accumulation: str) -> tropt.Setup:
    batches = [(torch.randn(n, 3), torch.randn(n, 1)) for n in sizes]
    return tropt.Setup(nn.Linear(3, 1), lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
                       lambda m: torch.optim.SGD(m.parameters(), lr=0.1), train_data=batches,
                       accumulation_steps=k, accumulation=accumulation)


def test_equal_loader_batches_read_k_at_a_time_are_equal_micro_batches():
    # 15 samples split in 4 is unequal, but 4 loader batches of 15 are 4 equal micro-batches of 15.
    s = _setup([15] * 8, 4, "batches")
    assert train_batch_sizes(s) == [60] and unequal_sizes(train_batch_sizes(s), 4) == []
    split = _setup([15] * 8, 4, "split")
    assert unequal_sizes(train_batch_sizes(split), 4) == [15]


def test_unequal_loader_batches_give_each_steps_total():
    s = _setup([16, 16, 16, 16, 16, 16, 16, 5], 4, "batches")
    assert train_batch_sizes(s) == [64, 53]
