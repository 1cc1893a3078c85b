"""Lazy attribute loading for the integration modules, so importing one never imports its framework."""
from __future__ import annotations

import importlib
from typing import Any


def lazy_attrs(module_name: str, names: dict[str, str]):
    """Return a module ``__getattr__`` that imports ``names[attr]`` (a sibling module) on first access."""

    def __getattr__(attr: str) -> Any:
        if attr not in names:
            raise AttributeError(f"module {module_name!r} has no attribute {attr!r}")
        return getattr(importlib.import_module(names[attr], module_name.rpartition(".")[0]), attr)

    return __getattr__
