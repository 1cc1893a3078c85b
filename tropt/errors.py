"""Errors tropt raises at its boundary.

Every message says what went wrong, why, and how to fix it, in one line a person reads:
``Setup: loss_fn returned a tensor of shape (64,), expected a scalar — reduce it with .mean() or .sum()``.
"""

from __future__ import annotations


class TroptError(ValueError):
    """Bad input or an unusable training setup; the message says what, why and how to fix it.

    Parameters
    ----------
    message
        What went wrong and why.
    fix
        The minimal change that makes it work; appended after an em dash.
    """

    def __init__(self, message: str, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(f"{message} — {fix}" if fix else message)


class SetupError(TroptError):
    """The :class:`tropt.Setup` (model, loss, optimizer, data, step) cannot be used as given."""


class StepError(TroptError):
    """The user's own code (loss_fn, step, factories, state functions) raised or misbehaved."""


class DataError(TroptError):
    """Splits, columns or samples handed to a data check cannot be used as given."""


class CheckSelectionError(TroptError):
    """An unknown or unavailable check id was requested."""


class Cancelled(TroptError):
    """A run was stopped on request: a check's ``callback`` raised it (e.g. a widget's Stop button); it propagates."""

    def __init__(self, message: str = "stopped on request", fix: str | None = None) -> None:
        super().__init__(message, fix)


class MissingDependencyError(TroptError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""


def require(module: str, extra: str):
    """Import an optional dependency lazily, or raise naming the extra that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"{module} is not installed ({exc})", f'install it with: pip install "tropt[{extra}]"'
        ) from exc
