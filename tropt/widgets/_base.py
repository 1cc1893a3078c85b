"""Plumbing shared by the panels: one long action (Run / Stop / progress / status / error / results), and rendering
of results and figures into widgets.

Panels compute nothing themselves: an action's job calls a check (or ``tropt.diagnose``) and renders what it
returns with ``result._repr_html_()`` and the functions of :mod:`tropt.plots`. Figures are drawn on
``matplotlib.figure.Figure`` objects (no pyplot: no global figure state, no backend switching) and shown as PNG
``Image`` widgets; HTML goes into ``HTML`` widgets. Neither needs an ``Output`` widget, so a job can run in a
background thread: the kernel stays free to receive the Stop click, and the widgets update live.
"""

from __future__ import annotations

import html
import io
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import Cancelled, TroptError, require

W = require("ipywidgets", "widgets")

# One tropt run at a time across all panels: checks snapshot and restore global state (RNG streams) around their
# work, so two runs interleaving in threads could hand each other's state back.
_RUN_LOCK = threading.Lock()

RED = "#cf222e"
STATUS_STYLE = {"idle": "#6e7781", "running": "#0969da", "done": "#1a7f37", "stopped": "#9a6700", "error": RED}


def error_html(message: str, fix: str | None = None) -> str:
    """The red in-panel error: what went wrong and the fix (never a traceback)."""
    e = html.escape
    fix_html = f'<div class="tropt-fix"><b>Fix:</b> {e(fix)}</div>' if fix else ""
    return (f'<div class="tropt-error" style="color:{RED};border-left:4px solid {RED};background:#ffebe9;'
            f'padding:4px 10px;margin:4px 0"><b>Error:</b> {e(message)}{fix_html}</div>')


def describe_error(exc: BaseException) -> tuple[str, str]:
    """(message, fix) of any exception: a TroptError's own, otherwise its type and text and a generic fix."""
    if isinstance(exc, TroptError):
        return exc.message, exc.fix or "check the inputs named in the message"
    return (f"{type(exc).__name__}: {exc}",
            "this came from your code or is unexpected in tropt: run the same check in a cell to see the traceback")


def header(title: str, text: str = "") -> Any:
    """A panel's title line and one-line description."""
    sub = f'<div style="color:#57606a;font-size:90%">{html.escape(text)}</div>' if text else ""
    return W.HTML(f'<div class="tropt-panel-title"><b style="font-size:115%">{html.escape(title)}</b>{sub}</div>')


def figure_png(draw: Callable[[Any], Any], figsize: tuple[float, float] = (7.5, 3.4), dpi: int = 100) -> bytes:
    """Draw on a fresh ``matplotlib.figure.Figure`` (``draw(fig)``) and return it as PNG bytes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    draw(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def image(png: bytes) -> Any:
    """A PNG as an Image widget that shrinks to the panel's width."""
    return W.Image(value=png, format="png", layout=W.Layout(max_width="100%", height="auto"))


def result_plot(result: Any, figsize: tuple[float, float] = (7, 2.8)) -> Any | None:
    """The result's picture (``result.plot(ax=...)``) as an Image widget, or None when it has none."""
    try:
        return image(figure_png(lambda fig: result.plot(ax=fig.add_subplot()), figsize))
    except TroptError:  # nothing to plot for this result
        return None
    except Exception as exc:  # noqa: BLE001 - a broken picture must not hide the verdict
        return W.HTML(f'<div style="color:#6e7781;font-size:85%">no picture: {html.escape(type(exc).__name__)}: '
                      f"{html.escape(str(exc))}</div>")


def result_html(result: Any, open_details: bool = False) -> str:
    """A result's badge, summary and advice, with its metrics and evidence tables in a collapsed details block
    (panels stay short; one click opens the evidence)."""
    from ..result import result_html

    return result_html(result, open_details=open_details)


def result_widget(result: Any, plot: bool = True, figsize: tuple[float, float] = (7, 2.8)) -> Any:
    """A result's badge, summary, advice and evidence (its HTML), with its picture below."""
    parts = [W.HTML(result_html(result))]
    if plot and result.status.value != "skip":  # a skipped check has nothing to draw
        pic = result_plot(result, figsize)
        if pic is not None:
            parts.append(pic)
    return W.VBox(parts, layout=W.Layout(margin="0 0 8px 0"))


class Action:
    """One long action of a panel: a Run button, a Stop button, a progress bar, a status line, the red error area,
    a live area (updated while it runs) and the results.

    ``job(action)`` does the work; it reports progress with :meth:`tick`, which raises
    :class:`tropt.errors.Cancelled` once Stop was pressed, so passing ``action.callback`` to a check ends the run
    at the check's next step. Errors end up in :attr:`message` (red, with the fix); the Run button is disabled
    while running and always re-enabled afterwards.

    Attributes
    ----------
    state
        ``"idle"``, ``"running"``, ``"done"``, ``"stopped"`` or ``"error"``.
    threaded
        Run the job in a background thread (the default; the kernel stays responsive so Stop can be clicked).
    """

    threaded = True

    def __init__(self, label: str, job: Callable[[Action], Any], *, icon: str = "play") -> None:
        self.job = job
        self.label = label
        self.run_button = W.Button(description=label, button_style="primary", icon=icon,
                                   layout=W.Layout(width="auto", min_width="150px"))
        self.stop_button = W.Button(description="Stop", button_style="warning", icon="stop", disabled=True,
                                    tooltip="end the run at its next step", layout=W.Layout(width="90px"))
        self.progress = W.FloatProgress(value=0.0, min=0.0, max=1.0, bar_style="info", layout=W.Layout(width="220px"))
        self.status = W.HTML(self._status_html("idle", "idle"))
        self.message = W.HTML("")
        self.live = W.VBox()
        self.results = W.VBox()
        self.box = W.VBox([W.HBox([self.run_button, self.stop_button, self.progress, self.status],
                                  layout=W.Layout(align_items="center")),
                           self.message, self.live, self.results])
        self.box.add_class("tropt-action")
        self.state = "idle"
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._done.set()
        self.run_button.on_click(lambda _b: self.start())
        self.stop_button.on_click(lambda _b: self.stop())

    # ------------------------------------------------------------------ state
    @staticmethod
    def _status_html(state: str, text: str) -> str:
        return (f'<span class="tropt-action-status" data-state="{state}" '
                f'style="color:{STATUS_STYLE[state]};margin-left:8px">{html.escape(text)}</span>')

    def set_status(self, text: str, state: str | None = None) -> None:
        self.status.value = self._status_html(state or self.state, text)

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    # ------------------------------------------------------------------ control
    def start(self) -> None:
        """Start the job (ignored while it runs)."""
        if self.running:
            return
        self._done.clear()
        self._stop.clear()
        self.state = "running"
        self.error = None
        self.run_button.disabled = True
        self.stop_button.disabled = False
        self.message.value = ""
        self.live.children = ()
        self.results.children = ()
        self.progress.bar_style = "info"
        self.progress.max = 1.0
        self.progress.value = 0.0
        self.set_status("running…")
        if self.threaded:
            self._thread = threading.Thread(target=self._run, name=f"tropt-{self.label}", daemon=True)
            self._thread.start()
        else:
            self._run()

    def stop(self) -> None:
        """Ask the job to end at its next step."""
        if self.running:
            self._stop.set()
            self.stop_button.disabled = True
            self.set_status("stopping at the next step…")

    def wait(self, timeout: float | None = 120) -> bool:
        """Block until the job ended (tests); True when it did."""
        return self._done.wait(timeout)

    def _run(self) -> None:
        start = time.perf_counter()
        locked = False
        try:
            while not (locked := _RUN_LOCK.acquire(timeout=0.2)):
                self.set_status("waiting for another panel's run to finish…")
                self.check_stop()
            start = time.perf_counter()
            self.job(self)
        except Cancelled:
            self.state = "stopped"
            self.progress.bar_style = "warning"
            self.set_status(f"stopped by Stop after {time.perf_counter() - start:.1f} s")
        except BaseException as exc:  # noqa: BLE001 - the panel shows it; never a traceback in the notebook
            self.state = "error"
            self.error = exc
            self.progress.bar_style = "danger"
            self.message.value = error_html(*describe_error(exc))
            self.set_status("error")
        else:
            self.state = "done"
            self.progress.bar_style = "success"
            self.progress.value = self.progress.max
            self.set_status(f"done in {time.perf_counter() - start:.1f} s")
        finally:
            if locked:
                _RUN_LOCK.release()
            self.run_button.disabled = False
            self.stop_button.disabled = True
            self._done.set()

    # ------------------------------------------------------------------ for jobs
    def tick(self, done: float, total: float, text: str | None = None) -> None:
        """Report progress (``done`` of ``total``); raises Cancelled once Stop was pressed."""
        if self._stop.is_set():
            raise Cancelled("stopped by the Stop button")
        if total and total > 0:
            self.progress.max = float(total)
            self.progress.value = float(min(done, total))
        if text is not None:
            self.set_status(text)

    def check_stop(self) -> None:
        """Raise Cancelled once Stop was pressed."""
        if self._stop.is_set():
            raise Cancelled("stopped by the Stop button")

    def callback(self, info: dict) -> None:
        """A check's per-step ``callback``: progress from its ``step``/``total``, and Stop."""
        self.tick(info.get("step", 0), info.get("total", 0),
                  f"{info.get('check', '')} step {info.get('step', 0)}/{info.get('total', '?')}")

    def show(self, *children: Any) -> None:
        """Append widgets to the results."""
        self.results.children = tuple(self.results.children) + tuple(children)


class Throttle:
    """True at most every ``interval`` seconds (live redraws must not slow the run they show)."""

    def __init__(self, interval: float = 0.4) -> None:
        self.interval = interval
        self._last = -float("inf")

    def __call__(self, force: bool = False) -> bool:
        now = time.perf_counter()
        if force or now - self._last >= self.interval:
            self._last = now
            return True
        return False


def spec_text(check_id: str) -> tuple[str, str]:
    """(title, description) of a registered check, for panel headers."""
    from ..registry import find_spec

    spec = find_spec(check_id)
    return (spec.title, spec.description) if spec else (check_id, "")
