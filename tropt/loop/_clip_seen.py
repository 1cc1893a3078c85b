"""The gradients as the step's clip saw them, for ``loop.ddp``: a snapshot of every parameter's ``.grad`` when the
first call of ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_`` / ``clip_grads_with_norm_`` starts.

What the losses asked for (autograd's gradients, summed over the backward passes) is not what the clip and
``optimizer.step()`` see when the step rescales the gradients in between (fairseq's ``multiply_grads`` by
``world_size / sample_size``). Comparing the gradients at the clip's entry keeps what clipping hides (a 2× gradient
clipped to norm 1 steps like the right one) and judges the step's own rescaling as the optimizer receives it.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import torch

from ._clip_probe import _codes


class ClipSeen:
    """Context manager: ``grads`` holds {parameter name: gradient as numpy, or None} at the first clip call's entry,
    empty when no clip call was seen or another profiler was active (``watching`` False)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.grads: dict[str, np.ndarray | None] = {}
        self.watching = False
        self._codes = _codes()

    def _profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call" or self.grads or frame.f_code not in self._codes:
            return
        try:
            self.grads = {name: (None if p.grad is None else p.grad.detach().cpu().float().numpy().copy())
                          for name, p in self.module.named_parameters() if p.requires_grad}
        except Exception:  # noqa: BLE001 - watching must never break the user's step
            self.grads = {}

    def __enter__(self) -> ClipSeen:
        if sys.getprofile() is None and self._codes:
            self.watching = True
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.watching:
            sys.setprofile(None)
