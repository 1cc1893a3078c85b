"""Autograd graphs a step keeps alive between steps, for ``perf.memory``.

After ``backward`` the tensors a graph saved are freed, but its nodes stay alive as long as a tensor with a
``grad_fn`` does: ``ctx.total_loss = ctx.total_loss + loss`` links every step's graph to the next, and a list of
undetached losses keeps each of them. Tensor bytes hardly move, so the allocator does not see it; the node count
does. :func:`held_graphs` names every place a step keeps tensors (plain tensors on ``ctx`` and what
:mod:`tropt.core.carried_state` finds on ``ctx``'s objects, the model and the step's closure) and counts the nodes
reachable from their ``grad_fn`` and the bytes of saved tensors still held (``_saved_*`` attributes).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..core.carried_state import find_slots

MAX_NODES = 100_000  # a walk stops here: a graph this big is a leak whatever its exact size


def _tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """The tensors in ``value`` and in the lists, tuples and dicts it nests (a loss history, a dict of totals)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 8 and isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v, depth + 1)
    elif depth < 8 and isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v, depth + 1)


def _places(ctx: Any, step: Any) -> Iterator[tuple[str, Any]]:
    """(name, value) of every place a step may keep tensors between steps."""
    user = ctx._user_attrs() if hasattr(ctx, "_user_attrs") else {}
    for name, value in user.items():
        if isinstance(value, (torch.Tensor, list, tuple, dict)):
            yield f"ctx.{name}", value
    for slot in find_slots(ctx, step):
        try:
            yield slot.name, slot.get()
        except Exception:  # noqa: BLE001 - a slot that cannot be read holds nothing we can count
            continue


def _saved_bytes(node: Any, seen: set[int]) -> int:
    """Bytes of the tensors ``node`` still saves for backward (0 once backward freed them)."""
    total = 0
    for attr in dir(node):
        if not attr.startswith("_saved_"):
            continue
        try:
            value = getattr(node, attr)
        except RuntimeError:  # freed by backward
            continue
        for t in (value if isinstance(value, (list, tuple)) else (value,)):
            if isinstance(t, torch.Tensor) and t.numel() and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total += t.untyped_storage().nbytes()
    return total


def graph_size(value: Any) -> tuple[int, int]:
    """(nodes, saved-tensor bytes) of the autograd graph reachable from the tensors in ``value``."""
    todo: list[Any] = [t.grad_fn for t in _tensors(value) if t.grad_fn is not None]
    nodes: dict[int, Any] = {}  # kept alive while walking so ids stay unique
    storages: set[int] = set()
    saved = 0
    while todo and len(nodes) < MAX_NODES:
        node = todo.pop()
        if node is None or id(node) in nodes:
            continue
        nodes[id(node)] = node
        saved += _saved_bytes(node, storages)
        todo.extend(n for n, _ in node.next_functions)
    return len(nodes), saved


def held_graphs(ctx: Any, step: Any) -> dict[str, tuple[int, int]]:
    """Every place holding an autograd graph now: name -> (nodes, saved-tensor bytes)."""
    out: dict[str, tuple[int, int]] = {}
    for name, value in _places(ctx, step):
        if value is None or name in out:
            continue
        nodes, saved = graph_size(value)
        if nodes:
            out[name] = (nodes, saved)
    return out


def graph_table(graphs: dict[int, dict[str, tuple[int, int]]]) -> pd.DataFrame:
    """One row per step and place holding a graph: step, held_by, nodes, saved_mib."""
    rows = [{"step": i, "held_by": name, "nodes": nodes, "saved_mib": saved / 2**20}
            for i, held in sorted(graphs.items()) for name, (nodes, saved) in sorted(held.items())]
    return pd.DataFrame(rows, columns=["step", "held_by", "nodes", "saved_mib"])


def growing_graph(graphs: dict[int, dict[str, tuple[int, int]]], growth_steps: int) -> tuple[str, float, int] | None:
    """The place whose graph grows fastest step over step (the first step, which builds state, left out), its
    nodes added per step (the median) and its nodes after the last step; None when no graph grows.

    A graph grows when its node count rose in at least two thirds of the steps and by at least one node per step:
    node counts are exact, so this does not fire on noise."""
    steps = list(range(1, growth_steps))
    best: tuple[str, float, int] | None = None
    for name in sorted({n for i in steps for n in graphs.get(i, {})}):
        counts = np.asarray([graphs.get(i, {}).get(name, (0, 0))[0] for i in steps], dtype=float)
        diffs = np.diff(counts)
        if diffs.size < 2 or np.mean(diffs > 0) < 2 / 3:
            continue
        per_step = float(np.median(diffs))
        if per_step >= 1 and (best is None or per_step > best[1]):
            best = (name, per_step, int(counts[-1]))
    return best
