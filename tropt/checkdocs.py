"""The page per check id (``docs/checks/<id>.md``, shipped in the package): what a check does, what its statuses
mean, the usual causes with the minimal fix for each, its thresholds and its cost.

``tropt.explain("loop.accumulation")`` shows the page in a notebook (its ``_repr_markdown_``); at a Python prompt and in
``print(tropt.explain(...))`` it is the page's text.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .errors import CheckSelectionError


def check_doc_path(check: str) -> Path:
    """The shipped Markdown page of a check id (it may not exist for an id without a page)."""
    return Path(str(resources.files("tropt") / "docs" / "checks" / f"{check}.md"))


@dataclass(frozen=True)
class CheckDoc:
    """A check's page: shown as Markdown in a notebook, as its text elsewhere."""

    check: str
    text: str

    def _repr_markdown_(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:  # what a Python prompt shows for ``tropt.explain(id)``: the page, not a dataclass
        return self.text


def explain(check: str) -> CheckDoc:
    """The "what this means" page of a check id: what it does, its statuses, causes and fixes, thresholds, cost."""
    path = check_doc_path(check)
    if not path.is_file():
        from .registry import PUBLIC_IDS

        raise CheckSelectionError(f"no page for check {check!r}",
                                  f"choose one of: {', '.join(PUBLIC_IDS)}" if check not in PUBLIC_IDS
                                  else "reinstall tropt")
    return CheckDoc(check, path.read_text(encoding="utf-8"))
