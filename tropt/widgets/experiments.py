"""Stage-7 panel: compare candidates against the Setup over seeds under one budget, with live curves (seed bands)
and the decision table. The panel calls :func:`tropt.compare` and draws with :mod:`tropt.plots.experiments`."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from ._base import Action, Throttle, W, figure_png, header, image

if TYPE_CHECKING:
    from ..setup import Setup

_STYLE = {"description_width": "110px"}
_WIDE = W.Layout(width="380px")


class ComparePanel(W.VBox):
    """``tropt.compare`` interactively: choose candidates and seeds, Run and Stop, live validation curves with seed
    bands, then the decision table, the per-candidate table and the quality/cost trade-off.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup` (the baseline).
    candidates
        ``{name: overrides}`` as for :func:`tropt.compare`; default: the Setup's learning rate × 0.3 and × 3.
    steps
        Initial step budget per run.
    compare_kwargs
        Passed to :func:`tropt.compare` (e.g. ``reinit=True``, ``guardrails=...``, ``early_stopping=3``).
    """

    def __init__(self, setup: Setup, candidates: dict | None = None, *, steps: int = 200,
                 **compare_kwargs: Any) -> None:
        from ..experiments.candidates import lr_candidates, validate_candidates

        self.setup = setup
        note = ""
        if candidates is not None:
            self.candidates = validate_candidates(candidates)
        else:
            try:
                self.candidates = lr_candidates(setup)
            except Exception as exc:  # noqa: BLE001 - the panel still opens; Compare shows why it cannot run
                self.candidates, note = {}, f"no default candidates: the optimizer could not be built ({exc})"
        self.compare_kwargs = compare_kwargs
        self.comparison: Any = None
        self.choose = W.SelectMultiple(options=list(self.candidates), value=tuple(self.candidates),
                                       rows=min(6, len(self.candidates)), description="candidates", style=_STYLE,
                                       layout=_WIDE)
        self.seeds = W.IntSlider(value=3, min=1, max=8, description="seeds", continuous_update=False, style=_STYLE,
                                 layout=_WIDE)
        self.steps = W.IntSlider(value=steps, min=10, max=max(2000, steps), step=10, description="steps / run",
                                 continuous_update=False, style=_STYLE, layout=_WIDE)
        self.action = Action("Compare", self._job, icon="balance-scale")
        super().__init__([header("Compare candidates (tropt.compare)",
                                 "The Setup is the baseline; every candidate runs on your step over the same seeds, "
                                 "data order and budget. A candidate is adopted only when its paired interval clears "
                                 "the minimum effect (Holm-corrected across candidates)."),
                          W.HBox([self.choose, W.VBox([self.seeds, self.steps])]),
                          W.HTML(f'<div style="color:#6e7781">{html.escape(note)}</div>' if note else ""),
                          self.action.box])
        self.add_class("tropt-panel")
        self.add_class("tropt-compare-panel")

    def _live_png(self, partial: Any) -> bytes:
        from ..plots.experiments import plot_curves

        return figure_png(lambda fig: plot_curves(partial, ax=fig.add_subplot()), (7.5, 3.0))

    def _job(self, action: Action) -> None:
        from ..errors import TroptError
        from ..experiments.budget import Budget
        from ..experiments.comparison import Comparison
        from ..experiments.evaluation import higher_is_better
        from ..experiments.orchestration import compare
        from ..plots.experiments import plot_curves, plot_tradeoff

        self.comparison = None
        chosen = [n for n in self.choose.value if n in self.candidates]
        if not chosen:
            raise TroptError("no candidate is selected", "select at least one candidate in the list (ctrl/shift-click)")
        cands = {n: self.candidates[n] for n in chosen}
        n_seeds, steps = int(self.seeds.value), int(self.steps.value)
        total = (len(cands) + 1) * n_seeds
        metric = self.compare_kwargs.get("metric") or self.setup.metric
        meta = {"higher_is_better": higher_is_better(metric), "candidates": {"baseline": {}, **{n: {} for n in cands}}}
        curves: dict[tuple, dict] = {}
        finished = {"runs": 0}
        throttle = Throttle(0.5)
        live = image(b"")
        action.live.children = (live,)

        def redraw() -> None:
            records = [{"candidate": c, "seed": s, "curves": v} for (c, s), v in curves.items()]
            partial = Comparison(records, dict(meta))
            live.value = figure_png(lambda fig: plot_curves(partial, ax=fig.add_subplot()), (7.5, 3.0))

        def callback(info: dict) -> None:
            if info.get("event") == "eval":
                c = curves.setdefault((info["candidate"], info["seed"]), {"eval_step": []})
                c["eval_step"].append(info["step"])
                scores = {k: v for k, v in info.items() if k not in ("event", "candidate", "seed", "step", "total")}
                for k, v in scores.items():
                    c.setdefault(k, []).append(v)
                meta.setdefault("metric", next(iter(scores), "val_loss"))
                frac = min(info["step"] / max(steps, 1), 1.0)
                action.tick(finished["runs"] + frac, total,
                            f"run {finished['runs'] + 1}/{total}: {info['candidate']}, seed {info['seed']}, "
                            f"step {info['step']}")
                if throttle():
                    redraw()
            else:
                finished["runs"] += 1
                action.tick(finished["runs"], total, f"{finished['runs']}/{total} runs done")

        comparison = compare(self.setup, cands, budget=Budget(steps=steps), seeds=tuple(range(n_seeds)), progress=False,
                             callback=callback, **self.compare_kwargs)
        self.comparison = comparison
        action.live.children = ()
        action.show(W.HTML(comparison._repr_html_()),
                    image(figure_png(lambda fig: plot_curves(comparison, ax=fig.add_subplot()), (7.5, 3.0))),
                    image(figure_png(lambda fig: plot_tradeoff(comparison, ax=fig.add_subplot()), (7.5, 3.4))))
