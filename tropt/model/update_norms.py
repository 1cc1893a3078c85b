"""How :class:`tropt.GradientMonitor` measures the optimizer's update: read exactly from ``torch.optim.SGD``'s own
step where that is possible, else from a copy of the parameters taken before the step (kept in one flat block)."""

from __future__ import annotations

import torch

UpdateRule = tuple[str, list[int], dict]  # (rule, watched parameter indices, param group)


def sgd_update_rules(optimizer: torch.optim.Optimizer, opt_idx: list[int], pid: dict[int, int],
                     params: list[torch.Tensor]) -> list[UpdateRule]:
    """Groups whose update norm the optimizer's own step gives exactly, without a copy of the parameters.

    ``torch.optim.SGD`` (the class itself: a subclass may change ``step``) applies ``p -= lr * d`` with ``d`` the
    gradient (no momentum; weight decay would add ``wd * p``, so only without it) or the new momentum buffer
    (weight decay and dampening are inside the buffer; Nesterov adds a term, so not then). The norm of that
    update is ``lr * ||d||``: the step the optimizer applies, which the parameter difference equals up to the
    rounding of the parameters. ``pid`` maps ``id(parameter)`` to its index in ``params`` (the watched ones).
    Returns (rule, parameter indices with a gradient, group) per such group.
    """
    if type(optimizer) is not torch.optim.SGD or getattr(optimizer, "grad_scale", None) is not None:
        return []
    mine = set(opt_idx)
    out = []
    for group in optimizer.param_groups:
        if group.get("nesterov") or group.get("fused") or group.get("differentiable"):
            continue
        members = [pid[id(p)] for p in group["params"] if id(p) in pid and pid[id(p)] in mine]
        chosen = [params[i] for i in members]
        if not members or any(p.dtype not in (torch.float32, torch.float64) or (p.grad is not None and p.grad.is_sparse)
                              for p in chosen):
            continue
        if group.get("momentum", 0) != 0:
            out.append(("buffer", members, group))
        elif group.get("weight_decay", 0) == 0:
            out.append(("gradient", members, group))
    return out


def flat_copies(params: list[torch.Tensor], indices: list[int], prev: dict[int, torch.Tensor]) -> None:
    """Make ``prev[i]`` a buffer shaped like ``params[i]`` for every ``i`` in ``indices``, all views of one flat
    block per dtype and device, unless each already has one of the right shape.

    Separate per-parameter buffers kept between steps made the CPU allocator hand each step's new gradients fresh
    pages (page faults in every backward, ~3x the monitor's own cost in bench_gradflow); one block leaves the
    gradients' reuse alone.
    """
    if not any(i not in prev or prev[i].shape != params[i].shape for i in indices):
        return
    groups: dict[tuple, list[int]] = {}
    for i in indices:  # one block per dtype and device (mixed-precision models have several)
        groups.setdefault((params[i].dtype, params[i].device), []).append(i)
    for (dtype, device), members in groups.items():
        flat = torch.empty(sum(params[i].numel() for i in members), dtype=dtype, device=device)
        off = 0
        for i in members:
            k = params[i].numel()
            prev[i] = flat[off:off + k].view(params[i].shape)
            off += k
