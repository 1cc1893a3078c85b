"""Test helpers: the shared no-mutation assertion every check's tests use.

>>> with untouched(setup):          # or untouched(df_train, df_test), untouched(model, optimizer)
...     tropt.loop.check_accumulation(setup)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from .snapshot import Snapshot, _same


def _data_leaves(data: Any, out: list[torch.Tensor | np.ndarray]) -> None:
    if isinstance(data, (torch.Tensor, np.ndarray)):
        out.append(data)
    elif isinstance(data, dict):
        for v in data.values():
            _data_leaves(v, out)
    elif isinstance(data, (list, tuple)):
        for v in data:
            _data_leaves(v, out)
    elif isinstance(data, torch.utils.data.TensorDataset):
        out.extend(data.tensors)
    elif isinstance(data, torch.utils.data.DataLoader):
        _data_leaves(data.dataset, out)


class _Watch:
    """Before/after state of everything reachable from the objects a test hands over."""

    def __init__(self, objects: tuple[Any, ...]) -> None:
        from .setup import Setup

        stateful: list[Any] = []
        self.frames: list[tuple[pd.DataFrame, pd.DataFrame]] = []
        self.arrays: list[tuple[Any, Any]] = []
        self.setups: list[tuple[Any, dict]] = []
        for obj in objects:
            if isinstance(obj, Setup):
                stateful.append(obj.model)
                self.setups.append((obj, {k: v for k, v in vars(obj).items() if k != "_validated"}))
                leaves: list[Any] = []
                _data_leaves(obj.train_data, leaves)
                _data_leaves(obj.val_data, leaves)
                self.arrays += [(x, _copy_array(x)) for x in leaves]
            elif isinstance(obj, pd.DataFrame):
                self.frames.append((obj, obj.copy(deep=True)))
            elif isinstance(obj, (torch.Tensor, np.ndarray)):
                self.arrays.append((obj, _copy_array(obj)))
            elif isinstance(obj, (nn.Module, torch.optim.Optimizer)) or hasattr(obj, "state_dict"):
                stateful.append(obj)
            elif isinstance(obj, (list, tuple, dict)):
                leaves = []
                _data_leaves(obj, leaves)
                self.arrays += [(x, _copy_array(x)) for x in leaves]
            else:
                raise TypeError(f"untouched() cannot watch a {type(obj).__name__}")
        self.stateful = stateful
        self.before = Snapshot.take(stateful)

    def problems(self) -> list[str]:
        out = self.before.diff(Snapshot.take(self.stateful))
        for live, saved in self.frames:
            try:
                pd.testing.assert_frame_equal(live, saved, check_exact=True, check_freq=False)
                if live.attrs != saved.attrs:
                    out.append("DataFrame.attrs changed")
            except AssertionError as exc:
                out.append(f"DataFrame changed: {str(exc).splitlines()[0]}")
        for live, saved in self.arrays:
            if not _same(live if isinstance(live, np.ndarray) else live.detach(), saved):
                out.append(f"{type(live).__name__} of shape {tuple(live.shape)} changed (values, dtype or device)")
        for setup, fields in self.setups:
            for key, value in fields.items():
                if getattr(setup, key) is not value:
                    out.append(f"Setup.{key} was replaced")
        return out


def _copy_array(x: Any) -> Any:
    return x.copy() if isinstance(x, np.ndarray) else x.detach().clone()


@contextmanager
def untouched(*objects: Any) -> Iterator[None]:
    """Assert that the block leaves ``objects`` exactly as they were.

    Watches Setups (model parameters, buffers, grads, modes, hooks, the data tensors, the Setup's fields),
    modules, optimizers, schedulers, scalers, DataFrames (values, dtypes, index, attrs), arrays and tensors, plus
    the torch / numpy / python RNG states and torch's grad mode and default dtype. Raises ``AssertionError``
    listing every difference.
    """
    watch = _Watch(objects)
    yield
    problems = watch.problems()
    if problems:
        raise AssertionError("the user's objects were modified:\n  - " + "\n  - ".join(problems))


def assert_untouched(fn: Callable[..., Any], *objects: Any) -> Any:
    """Call ``fn()`` inside :func:`untouched` over ``objects``; return what it returned."""
    with untouched(*objects):
        return fn()


__all__ = ["assert_untouched", "untouched"]
