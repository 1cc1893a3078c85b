"""How much work ``diagnose`` spends per check: ``budget="quick" | "standard" | "thorough"``, and the torch thread
count for tropt's own runs.

"standard" is every check's own defaults. "quick" cuts the steps of the model-side runs for a first answer in
seconds; "thorough" adds steps and seeds. Each check declares its own budgets where it registers
(``@register(..., budgets={"quick": {...}, "thorough": {...}})``); :data:`BUDGETS` gathers them, loading the checks
on first read. A check that declares none runs at its defaults in every budget (the data checks are cheap already).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import TroptError


class _Budgets(dict):
    """budget name -> check id -> keyword options, filled by the checks' registrations; reading it loads them."""

    def table(self, name: str) -> dict[str, dict[str, Any]]:
        """The options table of one budget, without loading the checks (what registration writes into)."""
        return dict.__getitem__(self, name)

    def _load(self) -> None:
        from .registry import load_checks

        load_checks()

    def __getitem__(self, name: str) -> dict[str, dict[str, Any]]:
        self._load()
        return dict.__getitem__(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        self._load()
        return dict.get(self, name, default)

    def items(self):  # type: ignore[override]
        self._load()
        return dict.items(self)

    def values(self):  # type: ignore[override]
        self._load()
        return dict.values(self)


# Filled by the checks' registrations; "standard" is their own defaults (listed in docs/checks/<id>.md).
BUDGETS: _Budgets = _Budgets({"quick": {}, "standard": {}, "thorough": {}})


def budget_options(budget: str, check: str) -> dict[str, Any]:
    """The keyword options ``budget`` gives ``check`` (empty for "standard")."""
    if budget not in BUDGETS:
        raise TroptError(f"budget={budget!r} is not one of {', '.join(BUDGETS)}",
                         "pass budget='quick' for a first answer in seconds, 'standard' (default) or 'thorough'")
    return dict(BUDGETS[budget].get(check, {}))


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return max(1, os.cpu_count() or 1)


def busy_cores() -> float | None:
    """The 1-minute load average (runnable processes), or None where the OS does not report it."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - Windows
        return None


def choose_threads(cores: int | None = None, load: float | None = None) -> int:
    """Intra-op threads for tropt's runs: the cores left idle by other work, at least 1, at most the cores.

    torch's default (one thread per core) on a machine that is already busy makes each thread wait for a core:
    small steps ran about 25x slower. ``load`` is the 1-minute load average (other work on the machine).
    """
    cores = available_cores() if cores is None else cores
    if load is None:
        return cores
    return int(max(1, min(cores, round(cores - load + 0.49))))


def oversubscribed(cores: int | None = None, load: float | None = None) -> str | None:
    """A sentence when other work already keeps every core busy (timings are then slower than on an idle machine),
    else None."""
    cores = available_cores() if cores is None else cores
    load = busy_cores() if load is None else load
    if load is None or load <= cores:
        return None
    return (f"the machine is oversubscribed (load {load:.1f} on {cores} cores): step times and perf.* findings are "
            f"slower than on an idle machine; rerun when it is quieter, or pass threads={choose_threads(cores, load)}")


@contextmanager
def tropt_threads(threads: int | str | None = None) -> Iterator[int]:
    """Run the block with ``threads`` torch intra-op threads, then restore the user's setting; yields the count used.

    None or "auto": the cores other work leaves idle (:func:`choose_threads` from the 1-minute load), capped at
    the user's setting and at the cores this process may use. torch counts the host's cores, and its threads wait
    for each other at every operation: on a 2-core machine under load 8, 300 small full-batch steps took 12.7 s
    with 2 threads and 0.9 s with 1. A number: that many threads.
    """
    import torch

    before = torch.get_num_threads()
    if threads is None or threads == "auto":
        chosen = min(before, choose_threads(load=busy_cores()))
    else:
        chosen = max(1, int(threads))
    torch.set_num_threads(chosen)
    try:
        yield chosen
    finally:
        torch.set_num_threads(before)
