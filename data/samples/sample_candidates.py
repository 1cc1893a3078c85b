"""Candidates for the bundled sample
(``tropt report compare -p candidates data/samples/sample_candidates.py:make_candidates``)."""

from __future__ import annotations

import torch


def make_candidates() -> dict:
    """SGD with momentum instead of the sample's AdamW, and the sample's learning rate times 3."""
    return {
        "sgd": {"optimizer": lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)},
        "lr_x3": {"lr": 9e-3},
    }
