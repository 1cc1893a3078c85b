"""Every user string that reaches a plot is literal text: `$` in a split, column, class or layer name draws (#16)."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import torch
from support import ce_loss
from torch import nn

import tropt
from tropt.errors import TroptError

DOLLAR = "cost_in_$_and_$"


def _draw_all(report) -> list[str]:
    """Draw every result's picture to PNG (where text is laid out); returns the ids that had one."""
    import matplotlib.pyplot as plt

    drawn = []
    for r in report:
        try:
            ax = r.plot()
        except TroptError:
            continue
        fig = ax.figure if hasattr(ax, "figure") else ax
        fig.savefig(io.BytesIO(), format="png")
        plt.close(fig)
        drawn.append(r.check)
    return drawn


def _dollar_splits() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(0)
    n = 300
    y = rng.choice(["$a$", "c $ d $"], n)
    df = pd.DataFrame({DOLLAR: (y == "$a$") + rng.normal(0, 0.01, n), "x": rng.normal(size=n), "label $y$": y,
                       "user_$id$": rng.integers(0, 40, n), "t $": pd.date_range("2024-01-01", periods=n, freq="h")})
    train, test = df.iloc[:200], df.iloc[150:].copy()  # 50 rows copied across: leaks in every plot
    test["label $y$"] = np.where(np.arange(len(test)) % 2, "$a$", test["label $y$"])  # shifted labels
    return {"train $1$": train, "test $2$": test}


def test_data_plots_draw_dollar_names_and_values():
    report = tropt.diagnose(splits=_dollar_splits(), label="label $y$", group="user_$id$", time="t $", checks="data",
                            progress=False)
    assert report["data.target_leakage"].status.value in ("warn", "fail")  # the $-named feature is found and drawn
    drawn = _draw_all(report)
    assert {"data.label_shift", "data.target_leakage", "data.class_coverage"} <= set(drawn), drawn
    assert "data.exact_duplicates" not in drawn  # two splits: one bar, which repeats the summary (#15), is not drawn


def test_model_and_loop_plots_draw_dollar_layer_names():
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleDict({"in_$_and_$": nn.Linear(8, 16), "out$2$": nn.Linear(16, 3)})

        def forward(self, x):
            return self.blocks["out$2$"](torch.relu(self.blocks["in_$_and_$"](x)))

    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    setup = tropt.Setup(Net(), ce_loss, lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                        [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)],
                        num_classes=3)
    report = tropt.diagnose(setup, checks=["model.gradient_flow", "model.activation_stats", "loop.accumulation"],
                            progress=False)
    assert all(r.status.value != "error" for r in report), report.to_frame()
    assert {"model.gradient_flow", "loop.accumulation"} <= set(_draw_all(report))


def test_a_failing_plot_is_a_note_not_a_lost_result(monkeypatch):
    from IPython import display as ipd

    from tropt.report import display as shown

    shown_items = []
    monkeypatch.setattr(ipd, "display", lambda *objs, **k: shown_items.extend(objs))

    class Broken(tropt.CheckResult):
        def plot(self, ax=None):
            raise RuntimeError("the renderer fell over")

    result = Broken("data.exact_duplicates", "fail", "30 rows of test are in train")
    assert shown.show_plot(result) is False
    notes = [o.data for o in shown_items if isinstance(o, ipd.HTML)]
    assert len(notes) == 1 and "could not be drawn" in notes[0] and "the renderer fell over" in notes[0]
    shown_items.clear()
    shown.show_report(tropt.Report([result]))  # the whole report still shows, the finding with it
    assert any("30 rows of test are in train" in getattr(o, "data", "") for o in shown_items if isinstance(o, ipd.HTML))


def test_layers_are_labelled_by_module_class_not_sequential_index():
    import matplotlib.pyplot as plt

    torch.manual_seed(0)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    setup = tropt.Setup(model, ce_loss, lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                        [(x[:16], y[:16]), (x[16:], y[16:])])
    result = tropt.diagnose(setup, checks=["model.gradient_flow"], progress=False)["model.gradient_flow"]
    assert list(result.tables["layers"]["type"]) == ["Linear", "Linear"]
    from tropt.plots.model import plot_gradient_bars

    ax = plot_gradient_bars(result)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0 (Linear)", "2 (Linear)"]
    plt.close(ax.figure)
