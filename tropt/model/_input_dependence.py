"""Whether the trained model's output depends on its input: the evidence behind "the model ignores its input".

``model.overfit_batch`` compares the model with a zeroed-input baseline trained alike, and a model whose loss does
not beat the baseline's looks as if it ignored its input. Two trajectories can also end close when the model reads
its input but has not yet learned from it: inputs at a tiny scale inside the model, a decoder that memorises random
targets from their prefixes as fast as from the source. Before naming the cause, the check asks the trained model
itself: every sample is given another sample's input (the inputs rolled by one along the batch, the targets kept)
and the outputs are compared. A model that ignores its input gives the same outputs; one that reads it does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..core.batch import map_leaves
from ..result import CheckResult, Status
from ._common import _children_outputs, _loss_output, fmt

if TYPE_CHECKING:
    from ..setup import Setup

# The relative output change above which the model reads its input: far above float round-off (a model that ignores
# its input gives bit-identical outputs here: the same tensors in the same order), far below any real dependence.
READS = 1e-4


def _rolled(t: torch.Tensor, moved: list[bool]) -> torch.Tensor:
    """``t`` with its samples shifted by one (sample i gets sample i-1's input); ``moved`` records a real change."""
    if t.ndim == 0 or t.shape[0] < 2:
        return t
    out = torch.roll(t, 1, 0)
    if not torch.equal(out, t):
        moved[0] = True
    return out


def input_dependence(setup: Setup, ctx: Any, batch: Any, positions: frozenset | None, inputs: set) -> float | None:
    """``||out(rolled inputs) - out|| / ||out||`` for the trained model of ``ctx`` on ``batch``: the model's arguments
    at ``positions`` rolled (or, when the loss never calls the model, the batch tensors at ``inputs``). None when
    rolling changes no input (every sample's input alike, nothing found to roll) or no model output is seen."""
    model, moved = ctx.model, [False]
    try:
        if positions:
            ref = _loss_output(setup, model, batch, ctx)
            out = _loss_output(setup, model, batch, ctx, positions, lambda t: _rolled(t, moved))
        elif positions is None and inputs:
            # The loss never calls the root model (a GAN's m.discriminator(real), an actor-critic's m.q(o, a)): the
            # batch's inputs are rolled, and the outputs of the model's direct children compared.
            rolled = map_leaves(batch, lambda p, t: _rolled(t, moved) if p in inputs else t)
            ref, out = _flat(_children_outputs(setup, model, batch, ctx)), _flat(_children_outputs(setup, model,
                                                                                                   rolled, ctx))
        else:
            return None
    except Exception:  # noqa: BLE001 - a forward that breaks on another sample's input gives no evidence either way
        return None
    if not moved[0] or ref is None or out is None or out.shape != ref.shape:
        return None
    ref64, out64 = ref.detach().double(), out.detach().double()
    return float((out64 - ref64).norm() / ref64.norm().clamp_min(1e-30))


def _flat(outputs: list[torch.Tensor]) -> torch.Tensor | None:
    """The children's outputs as one vector (None when there are none)."""
    return torch.cat([o.detach().flatten().double() for o in outputs]) if outputs else None


def reads_its_input(dependence: float | None) -> bool:
    """Whether the measured dependence shows the model reading its input."""
    return dependence is not None and dependence > READS



def reads_but_slow(c: Any) -> CheckResult:
    """WARN for a model that does not beat its zeroed-input baseline but whose output does depend on its input
    (``c`` is overfit_batch's case): the input has not helped it yet, which is slow learning, not an ignored input."""
    dep = c.metrics["input_dependence"]
    steps = c.opts.steps
    compared = "is worse than" if c.final > c.base_final else "does not clearly beat"
    summary = (f"after {c.ran} steps the loss {fmt(c.final)} {compared} the {fmt(c.base_final)} of the "
               "same model trained on zeroed inputs, but the model does read its input: giving each sample another "
               f"sample's input changes its output by {dep:.1%}. Its input has not helped it yet (slow learning from "
               "the input), which is not a model that ignores it")
    advice = [*c.scale_notes,
              f"Raise the learning rate or the number of steps (steps={steps * 2}) and rerun: a model that reads its "
              "input should pull away from the zeroed-input baseline.",
              "If it still does not, look for where the input's signal fades: its scale inside the model, dead units "
              "(model.activation_stats), vanishing gradients (model.gradient_flow)."]
    return CheckResult("model.overfit_batch", Status.WARN, summary, c.metrics, c.tables, advice, c.series)
