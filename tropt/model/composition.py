"""Loss compositions read off the autograd graph: probabilities fed to a loss that expects logits, and targets that
broadcast against the output.

``loss_fn`` is opaque, so nothing is guessed from names: the loss is computed once with gradients enabled and its
autograd graph is walked from the loss node back. ``cross_entropy`` records ``NllLoss <- LogSoftmax <- x``; when ``x``
is itself a ``Softmax`` or ``Sigmoid`` node (through reshapes only), softmax/sigmoid was applied twice, whether the
squashing sits in the model or in ``loss_fn``. Which of the two holds is read off the model's own output: when its
``grad_fn`` is (or reshapes) the squashing node, the model squashes. Broadcasting is caught from PyTorch's own
``UserWarning`` ("Using a target size ... different to the input size") and, for hand-written losses, by recomputing
the broadcast MSE/L1 on the captured output and the batch's tensors.
"""

from __future__ import annotations

import inspect
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..core.batch import leaves
from ..core.modes import dropout_off
from ..core.objective import output_tensor

if TYPE_CHECKING:
    from ..setup import Setup

# Autograd nodes that only move or relabel values: skipped when looking for what feeds a loss.
_SHAPE_NODES = frozenset({"View", "Reshape", "ReshapeAlias", "UnsafeView", "Squeeze", "Unsqueeze", "Transpose",
                          "Permute", "Expand", "Clone", "ToCopy", "Select", "Slice", "AsStrided", "Alias", "T",
                          "Contiguous", "Flatten", "Index", "_ToCopy"})
_SQUASH = {"SoftmaxBackward0": "softmax", "SigmoidBackward0": "sigmoid"}
_SQUASH_SOURCE = re.compile(r"(?<!log_)(?<!log)\b(softmax|sigmoid|Softmax|Sigmoid)\b")
_LOSS_SOURCE = re.compile(r"mse|l1|MSELoss|L1Loss|huber|smooth|\*\*\s*2|\.pow\(|\.abs\(|\.square\(", re.IGNORECASE)


@dataclass
class LossFinding:
    """One defect in how ``loss_fn`` composes the model's output with a loss."""

    kind: str  # "double_squash" | "broadcast"
    summary: str
    advice: str
    where: str  # "model" | "loss_fn"
    line: str | None = None  # "file.py:12: `code`" when the source could be read
    metrics: dict = field(default_factory=dict)


def _is_shape(node: Any) -> bool:
    return re.sub(r"Backward\d*$", "", type(node).__name__) in _SHAPE_NODES


def _inputs(node: Any) -> list:
    return [f for f, _ in getattr(node, "next_functions", ()) if f is not None and type(f).__name__ != "AccumulateGrad"]


def _prediction_input(node: Any) -> list:
    """The node feeding a loss node's first argument, the prediction (not the target: a teacher's softmax as a soft
    target is fine)."""
    first = getattr(node, "next_functions", ())[:1]
    return [f for f, _ in first if f is not None and type(f).__name__ != "AccumulateGrad"]


def _through_shapes(node: Any, first_only: bool = False) -> list:
    """The first non-shape nodes feeding ``node`` (one per branch; only its first argument with ``first_only``)."""
    out, todo, seen = [], list(_prediction_input(node) if first_only else _inputs(node)), set()
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if _is_shape(n):
            todo.extend(_inputs(n))
        else:
            out.append(n)
    return out


def _walk(root: Any, limit: int = 400) -> list:
    """Nodes of the graph from ``root`` breadth first (bounded: the loss end of the graph is what matters)."""
    order: list[Any] = []
    todo, seen = [root], set()
    while todo and len(order) < limit:
        n = todo.pop(0)
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        order.append(n)
        todo.extend(_inputs(n))
    return order


def _double_squash(loss: torch.Tensor) -> tuple[str, str, Any] | None:
    """(loss name, squash name, squash node) when a logits-expecting loss is fed softmax/sigmoid outputs."""
    if loss.grad_fn is None:
        return None
    for node in _walk(loss.grad_fn):
        name = type(node).__name__
        if name.startswith("NllLoss"):
            for pre in _through_shapes(node, first_only=True):
                if type(pre).__name__ == "LogSoftmaxBackward0":
                    for sq in _through_shapes(pre):
                        if type(sq).__name__ in _SQUASH:
                            return "cross_entropy", _SQUASH[type(sq).__name__], sq
                elif type(pre).__name__ in _SQUASH:  # nll_loss reads log-probabilities, not probabilities
                    return "nll_loss", _SQUASH[type(pre).__name__], pre
        elif name.startswith("BinaryCrossEntropyWithLogits"):
            for pre in _through_shapes(node, first_only=True):
                if type(pre).__name__ in _SQUASH:
                    return "binary_cross_entropy_with_logits", _SQUASH[type(pre).__name__], pre
    return None


def _reaches(start: Any, target: Any) -> bool:
    """Whether ``target`` is ``start`` or reached from it through shape-only nodes."""
    todo, seen = [start], set()
    while todo:
        n = todo.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        if n is target:
            return True
        if _is_shape(n):
            todo.extend(_inputs(n))
    return False


def source_line(fn: Any, pattern: re.Pattern) -> str | None:
    """``file:line: `code``` of the first line of ``fn``'s source matching ``pattern`` (None when unreadable)."""
    target = fn
    if not (inspect.isfunction(target) or inspect.ismethod(target)):
        # fetches the __call__ method to read its source, not a test of callability
        target = getattr(type(fn), "forward", None) or getattr(type(fn), "__call__", None)  # noqa: B004
    try:
        lines, start = inspect.getsourcelines(target)
        path = inspect.getsourcefile(target) or "?"
    except (OSError, TypeError):
        return None
    for i, text in enumerate(lines):
        code = text.split("#", 1)[0]
        if pattern.search(code):
            return f"{path.rsplit('/', 1)[-1]}:{start + i}: `{text.strip()}`"
    return None


def _model_squash_site(model: nn.Module, node: Any, squash: str, seen: dict) -> str:
    """Where in the model the squashing happens: a Softmax/Sigmoid module whose output carries ``node``, else the
    line of the deepest user-written module's ``forward`` whose output carries it."""
    hits = [name for name, grad_fn in seen.items() if grad_fn is not None and _reaches(grad_fn, node)]
    for name in hits:
        m = model.get_submodule(name)
        if isinstance(m, (nn.Softmax, nn.Sigmoid)):
            return f"the model's {type(m).__name__} module `{name}`"
    users = [n for n in hits if not type(model.get_submodule(n)).__module__.startswith("torch.")]
    for name in sorted(users, key=lambda n: -1 if n == "" else n.count("."), reverse=True):
        line = source_line(model.get_submodule(name).forward, _SQUASH_SOURCE)
        if line:
            return f"the model's forward ({line})" if name == "" else f"the forward of `{name}` ({line})"
    return f"the model's last operation ({squash})"


def loss_findings(setup: Setup, model: nn.Module, batch: Any, ctx: Any = None) -> list[LossFinding]:
    """Run ``loss_fn`` once with gradients on and name double squashing and broadcasting in it (see module doc)."""
    outputs: list[torch.Tensor] = []
    squash_out: dict[str, Any] = {}

    def root_hook(module: nn.Module, args: Any, out: Any) -> None:
        t = output_tensor(out)
        if t is not None:
            outputs.append(t)

    def module_hook(name: str):
        def hook(module: nn.Module, args: Any, out: Any) -> None:
            t = output_tensor(out)
            if t is not None:
                squash_out[name] = t.grad_fn  # which module's output carries a squashing node (see _model_squash_site)
        return hook

    handles = [model.register_forward_hook(root_hook)]
    handles += [m.register_forward_hook(module_hook(n)) for n, m in model.named_modules()]
    try:
        torch.manual_seed(0)
        with torch.enable_grad(), dropout_off(model), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if ctx is not None:
                with ctx.autocast():
                    loss = setup.loss(model, batch)
            else:
                loss = setup.loss(model, batch)
    finally:
        for h in handles:
            h.remove()
    out = outputs[0] if len(outputs) == 1 else None
    found = []
    squash = _double_squash(loss)
    if squash is not None:
        found.append(_squash_finding(setup, model, out, squash, squash_out))
    broadcast = _broadcast(setup, loss, out, batch, caught)
    if broadcast is not None:
        found.append(broadcast)
    return found


def _squash_finding(setup: Setup, model: nn.Module, out: torch.Tensor | None, squash: tuple, seen: dict) -> LossFinding:
    loss_name, what, node = squash
    in_model = out is not None and out.grad_fn is not None and _reaches(out.grad_fn, node)
    expects = {"cross_entropy": "applies log_softmax itself and expects raw logits",
               "nll_loss": "expects log-probabilities (log_softmax), not probabilities",
               "binary_cross_entropy_with_logits": "applies the sigmoid itself and expects raw logits"}[loss_name]
    if in_model:
        site = _model_squash_site(model, node, what, seen)
        line: str | None = site
        summary = (f"{what} is applied before {loss_name}, which {expects}: the {what} sits in {site}, so the model's "
                   f"outputs are bounded probabilities and the loss can barely fall")
        advice = (f"Remove the {what} from {site} and return raw logits (apply {what} only when you need "
                  "probabilities at inference)" + ("; or use log_softmax with nll_loss" if what == "softmax" else "")
                  + ".")
    else:
        line, holder = source_line(setup.loss_fn, _SQUASH_SOURCE), "loss_fn"
        if line is None:  # a loss computed inside the model (labels= of a Hugging Face-style model)
            line = next((found for m in model.modules() if not type(m).__module__.startswith("torch.")
                         for found in [source_line(m.forward, _SQUASH_SOURCE)] if found), None)
            holder = "the loss computed in the model's forward" if line else holder
        at = f" ({line})" if line else ""
        summary = (f"{what} is applied before {loss_name}, which {expects}: {holder}{at} squashes the model's logits "
                   f"before the loss, so the loss can barely fall")
        advice = (f"In {'loss_fn' if holder == 'loss_fn' else 'the model forward'}{at}, pass the raw logits to "
                  f"{loss_name} (drop the {what})"
                  + ("; or use log_softmax with nll_loss" if what == "softmax" and loss_name == "nll_loss" else "")
                  + ".")
    return LossFinding("double_squash", summary, advice, "model" if in_model else "loss_fn", line,
                       {"loss": loss_name, "squash": what, "squash_in": "model" if in_model else "loss_fn"})


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.reshape(-1).double(), b.reshape(-1).double()
    return float(a @ b / (a.norm() * b.norm()).clamp_min(1e-30))


def _broadcast_shapes(loss: torch.Tensor, out: torch.Tensor | None, batch: Any) -> tuple | None:
    """(loss name, output shape, target shape, broadcast shape, target path) when the loss's gradient with respect to
    the output is the broadcast MSE/L1's and not the element-wise one's.

    The gradient, not the value, decides: a fresh model's nearly constant output gives both pairings nearly the same
    value, but the element-wise gradient follows each sample's own target while the broadcast one follows their mean.
    """
    if out is None or not out.ndim or not out.requires_grad or not loss.requires_grad:
        return None
    try:
        (grad,) = torch.autograd.grad(loss, out, retain_graph=True, allow_unused=True)
    except RuntimeError:
        return None
    if grad is None or not bool(torch.isfinite(grad).all()) or float(grad.abs().max()) == 0.0:
        return None
    for path, y in leaves(batch):
        if y is out or not y.ndim or y.shape == out.shape or y.numel() != out.numel() or not y.is_floating_point():
            continue
        o = out.detach().float().requires_grad_(True)
        t = y.detach().to(o.device).float()
        try:
            diff = o - t
        except RuntimeError:
            continue
        if diff.numel() <= o.numel():
            continue
        for name, fn in (("mse", lambda d: d.pow(2).mean()), ("l1", lambda d: d.abs().mean())):
            (g_b,) = torch.autograd.grad(fn(o - t), o)
            (g_e,) = torch.autograd.grad(fn(o.reshape(-1) - t.reshape(-1)), o)
            if _cosine(grad, g_b) > 0.999 and _cosine(grad, g_e) < 0.99:
                return name, tuple(o.shape), tuple(t.shape), tuple(diff.shape), path
    return None


def _broadcast(setup: Setup, loss: torch.Tensor, out: torch.Tensor | None, batch: Any,
               caught: list) -> LossFinding | None:
    """A regression loss whose output and target shapes differ and broadcast (PyTorch's warning, or the value)."""
    message = next((w for w in caught if issubclass(w.category, UserWarning) and "target size" in str(w.message)
                    and "input size" in str(w.message)), None)
    shapes = _broadcast_shapes(loss, out, batch)
    if message is None and shapes is None:
        return None
    if shapes is not None:
        name, so, sy, sb, path = shapes
        target = "batch" + "".join(f"[{p!r}]" for p in path)
        what = (f"the {name} loss compares the output of shape {so} with the target {target} of shape {sy}: they "
                f"broadcast to {sb}, so every prediction is scored against every target")
    else:
        name, so, sy = "regression", None, None
        assert message is not None  # both None returned above
        what = ("the loss broadcasts the output against a target of another shape "
                f"(PyTorch: {str(message.message).split('.')[0]})")
    line = None
    if message is not None and not os.path.abspath(message.filename).startswith(os.path.dirname(torch.__file__)):
        try:
            with open(message.filename) as fh:
                code = fh.readlines()[message.lineno - 1].strip()
        except (OSError, IndexError):
            code = ""
        line = f"{message.filename.rsplit('/', 1)[-1]}:{message.lineno}: `{code}`"
    if line is None:
        line = source_line(setup.loss_fn, _LOSS_SOURCE)
    at = f" ({line})" if line else ""
    fix = (f"squeeze the output to {sy} (out.squeeze(-1)) or reshape the target to {so} (y.view_as(out))"
           if so is not None else "make the output and the target the same shape (out.squeeze(-1) or y.view_as(out))")
    return LossFinding("broadcast", what,
                       f"In loss_fn{at}, {fix} so the loss compares each prediction with its own target.",
                       "loss_fn", line, {"loss": name, "output_shape": str(so), "target_shape": str(sy)})
