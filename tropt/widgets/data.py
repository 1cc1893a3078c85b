"""Stage-1 panel: choose the label / group / time columns, tick checks, Run; a badge, evidence and a plot per check."""

from __future__ import annotations

from typing import Any

from ._base import Action, W, describe_error, error_html, header, result_widget

NONE = "(none)"
_STYLE = {"description_width": "60px"}


def split_columns(splits: Any) -> list | None:
    """The first split's column names (read by tropt's own data reader), or None for arrays / Datasets."""
    from ..data.load import Options, validate_splits
    from ..data.readers import Reader

    name, obj = validate_splits(splits, 1)[0]
    return Reader(obj, name, Options.make()).columns


def _parse(value: str) -> Any:
    """Text box value: None when empty, an int for a position (arrays, tuple samples), else the key."""
    value = value.strip()
    if not value:
        return None
    return int(value) if value.lstrip("-").isdigit() else value


class DataPanel(W.VBox):
    """The ``data.*`` checks on ``splits`` interactively.

    Parameters
    ----------
    splits
        Ordered mapping of split name to data (earlier splits first), as for :func:`tropt.data.check_splits`.
    label, group, time
        Initial column choices.
    """

    def __init__(self, splits: Any, *, label: Any = None, group: Any = None, time: Any = None) -> None:
        from ..registry import specs

        self.splits = splits
        self.problem = W.HTML("")
        try:
            columns = split_columns(splits)
        except Exception as exc:  # noqa: BLE001 - shown in the panel; Run shows it again
            columns = None
            self.problem.value = error_html(*describe_error(exc))
        self.columns = columns
        if columns is not None:
            opts = [NONE] + [str(c) for c in columns]
            self._by_name = {str(c): c for c in columns}

            def pick(desc: str, value: Any) -> Any:
                v = str(value) if value is not None and str(value) in self._by_name else NONE
                return W.Dropdown(options=opts, value=v, description=desc, style=_STYLE, layout=W.Layout(width="260px"))
        else:
            self._by_name = {}

            def pick(desc: str, value: Any) -> Any:
                return W.Text(value="" if value is None else str(value), description=desc, style=_STYLE,
                              placeholder="key or position", layout=W.Layout(width="260px"))
        self.label, self.group, self.time = pick("label", label), pick("group", group), pick("time", time)
        self.specs = [s for s in specs() if s.needs == "splits"]
        self.boxes = {s.id: W.Checkbox(value=True, description=s.title, indent=False, tooltip=s.description,
                                       layout=W.Layout(width="290px")) for s in self.specs}
        self.action = Action("Run data checks", self._job)
        self.results: dict[str, Any] = {}
        names = ", ".join(str(k) for k in splits) if hasattr(splits, "keys") else "?"
        super().__init__([
            header("Data: splits, labels and leakage (data.*)", f"splits: {names} — earlier splits first"),
            self.problem,
            W.HBox([self.label, self.group, self.time]),
            W.GridBox(list(self.boxes.values()), layout=W.Layout(grid_template_columns="repeat(3, 300px)")),
            self.action.box,
        ])
        self.add_class("tropt-panel")
        self.add_class("tropt-data-panel")

    def _value(self, widget: Any) -> Any:
        if isinstance(widget, W.Dropdown):
            return None if widget.value == NONE else self._by_name[widget.value]
        return _parse(widget.value)

    @property
    def options(self) -> dict[str, Any]:
        """The chosen ``label``, ``group`` and ``time``."""
        return {"label": self._value(self.label), "group": self._value(self.group), "time": self._value(self.time)}

    def chosen(self) -> list[Any]:
        return [s for s in self.specs if self.boxes[s.id].value]

    def _job(self, action: Action) -> None:
        from ..data.cache import session
        from ..data.load import Options, load_splits
        from ..diagnosis import run_check
        from ..errors import DataError

        self.results = {}
        self.problem.value = ""
        chosen = self.chosen()
        if not chosen:
            raise DataError("no data check is ticked", "tick at least one check above")
        opts = self.options
        with session():  # scan each split once, shared by the checks (as check_splits does)
            action.tick(0, len(chosen) + 1, "reading the splits")
            # bad input (unknown column, splits that disagree) is one red message, not one ERROR per check
            load_splits(self.splits, Options.make(opts["label"], opts["group"], opts["time"]), progress=False,
                        min_splits=2)
            for i, spec in enumerate(chosen):
                action.tick(i + 1, len(chosen) + 1, f"{spec.id} ({i + 1}/{len(chosen)})")
                result = run_check(spec, self.splits, {**opts, "progress": False})
                self.results[spec.id] = result
                action.show(result_widget(result))
        action.tick(len(chosen) + 1, len(chosen) + 1, None)
