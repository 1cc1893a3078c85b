"""The one lazy-loader: a package's public names, each imported from its module on first access.

``import tropt`` (and ``tropt.experiments``, ``tropt.widgets``, the integrations) must stay fast and import no
heavy library, so their ``__init__`` modules name where each public attribute lives instead of importing it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_attrs(module_name: str, names: dict[str, str], submodules: frozenset[str] | set[str] = frozenset(),
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__``: ``names`` maps an attribute to the module holding it (absolute,
    or relative to ``module_name``'s package when it starts with a dot); ``submodules`` are loaded as attributes.
    A loaded attribute is cached on the module, so the import happens once."""
    package = module_name if module_name in sys.modules and hasattr(sys.modules[module_name], "__path__") \
        else module_name.rpartition(".")[0]

    def __getattr__(attr: str) -> Any:
        if attr in names:
            value = getattr(importlib.import_module(names[attr], package), attr)
            setattr(sys.modules[module_name], attr, value)
            return value
        if attr in submodules:
            return importlib.import_module(f"{module_name}.{attr}")
        raise AttributeError(f"module {module_name!r} has no attribute {attr!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[module_name])) | set(names) | set(submodules))

    return __getattr__, __dir__
