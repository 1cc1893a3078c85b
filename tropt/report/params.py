"""The report notebooks' parameters as papermill hands them over, and where their files go.

``papermill -p NAME VALUE`` passes a JSON mapping or list as its text (``splits is a str``), so the notebooks read
such text back as JSON (:func:`structured`), and a missing parameter's hint shows both ways that work: ``tropt report
KIND -p NAME '<json>'`` and ``papermill ... -y '{"NAME": <json>}'`` (:func:`hint`). Files are written only into
the ``output_dir`` the caller gave (``tropt report -o DIR`` always gives one); without it a notebook writes nothing,
never into the current directory or the notebooks' folder (:func:`output_path`)."""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import TroptError


def structured(value: Any, name: str, example: str) -> Any:
    """``value``, or the JSON it holds when papermill passed a mapping or list as text."""
    if not isinstance(value, str) or not value.strip().startswith(("{", "[")):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise TroptError(f"parameter {name}={value!r} is not valid JSON ({exc.msg} at character {exc.pos})",
                         hint(name, example)) from None


def hint(name: str, example: str, kind: str | None = None) -> str:
    """How to pass parameter ``name`` (``example``: its JSON) with tropt report and with papermill."""
    report = f"tropt report {kind} -p {name} '{example}'" if kind else f"-p {name} '{example}' (tropt report)"
    return f"pass {report}, or with papermill -y '{{\"{name}\": {example}}}' (YAML/JSON keeps the type)"


def output_path(output_dir: Any, filename: str) -> str | None:
    """Where to write ``filename``: inside ``output_dir`` (created), or None (write nothing) when none was given."""
    if not output_dir:
        return None
    os.makedirs(os.fspath(output_dir), exist_ok=True)
    return os.path.join(os.fspath(output_dir), filename)
