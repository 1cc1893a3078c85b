"""What the Setup builders need from an installed framework: its version, checked at call time, and its modules."""
from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any

from ..errors import MissingDependencyError, SetupError


def _parse(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out + [0] * (3 - len(out)))


def supported(dist: str, low: str, high: str, extra: str) -> str:
    """The installed version of distribution ``dist``; raise naming the supported range when it is outside it."""
    try:
        found = metadata.version(dist)
    except metadata.PackageNotFoundError as exc:
        raise MissingDependencyError(f"{dist} is not installed",
                                     f'install it with: pip install "tropt[{extra}]"') from exc
    if not (_parse(low) <= _parse(found) < _parse(high)):
        raise SetupError(
            f"{dist} {found} is installed; tropt's {extra} integration supports {dist} >={low},<{high} "
            "(it relies on the training-loop internals of those versions)",
            f'install a supported version: pip install "{dist}>={low},<{high}"')
    return found


def api_changed(dist: str, low: str, high: str, what: str, exc: BaseException) -> SetupError:
    """The error for an installed version whose API no longer has what a builder relies on."""
    try:
        found = metadata.version(dist)
    except metadata.PackageNotFoundError:
        found = "?"
    return SetupError(
        f"{dist} {found}: {what} is not there as tropt expects ({type(exc).__name__}: {exc}); tropt's integration "
        f"supports {dist} >={low},<{high}",
        f'install a supported version: pip install "{dist}>={low},<{high}", or report the version at tropt\'s '
        "issue tracker")


def import_from(dist: str, low: str, high: str, module: str, *names: str) -> list[Any]:
    """``names`` from ``module``, or an error naming the supported versions when this version moved them."""
    try:
        mod = importlib.import_module(module)
        return [getattr(mod, n) for n in names]
    except (ImportError, AttributeError) as exc:
        raise api_changed(dist, low, high, f"{module}.{'/'.join(names)}", exc) from exc
