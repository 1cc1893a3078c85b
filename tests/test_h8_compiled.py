"""torch.compile'd models under diagnosis (issue 28): the batch dimension marked dynamic, tropt's hooks untraced,
the compiles counted, and the user's compiled model left as it was. Backend "eager": dynamo's recompiles without
inductor's C++ build (the recompiles are dynamo's, whatever the backend)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tropt
from tropt.core.compiled import CompileLog, compiled_modules, mark_batch_dynamic, should_mark, untraced

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # each test counts its own compiles
    yield
    torch._dynamo.reset()


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _run(model: nn.Module, sizes: list[int], mark: bool) -> CompileLog:
    batches = [torch.randn(n, 8) for n in sizes]
    with CompileLog() as log:
        for b in (mark_batch_dynamic(model, batches) if mark else batches):
            model(b).sum().backward()
    return log


def test_marked_micro_batches_compile_once_for_every_size() -> None:
    log = _run(torch.compile(_mlp(), backend="eager"), [32, 24, 8, 5, 32], mark=True)
    assert log.compiles == 1, log.reasons


def test_unmarked_micro_batches_recompile_at_a_new_size() -> None:
    # the control: dynamo compiles 32 statically, then recompiles dynamic at 24
    log = _run(torch.compile(_mlp(), backend="eager"), [32, 24, 8, 5, 32], mark=False)
    assert log.compiles == 2 and log.recompiles == 1, log.reasons
    assert "size mismatch" in log.reasons[0]


def test_dynamic_false_is_the_users_choice() -> None:
    model = torch.compile(_mlp(), backend="eager", dynamic=False)
    batches = [torch.randn(4, 8)]
    assert not should_mark(model) and not should_mark(nn.Sequential(model))
    assert mark_batch_dynamic(model, batches) is batches


def test_an_uncompiled_model_gets_its_batches_back() -> None:
    batches = [(torch.randn(4, 8), torch.zeros(4))]
    assert compiled_modules(_mlp()) == []
    assert mark_batch_dynamic(_mlp(), batches) is batches
    assert mark_batch_dynamic(torch.compile(_mlp(), backend="eager"), batches, batch_dim=None) is batches


def test_the_users_tensors_are_never_marked() -> None:
    x, y = torch.randn(4, 8), torch.zeros(4)
    model = nn.Sequential(nn.Linear(8, 2), torch.compile(nn.Linear(2, 2), backend="eager"))
    assert [n for n, _ in compiled_modules(model)] == ["1"]
    (mx, my), = mark_batch_dynamic(model, [(x, y)])
    assert my is not y and torch.equal(my, y)
    assert mx is not x and mx.data_ptr() == x.data_ptr() and torch.equal(mx, x)
    assert not hasattr(x, "_dynamo_weak_dynamic_indices") and hasattr(mx, "_dynamo_weak_dynamic_indices")
    assert mark_batch_dynamic(model, [{"x": x, "n": 3}])[0]["n"] == 3


def _hooked(wrap: bool) -> CompileLog:
    model = torch.compile(_mlp(), backend="eager")
    seen: list[float] = []

    def hook(module: nn.Module, args: object, out: torch.Tensor) -> None:
        seen.append(float(out.max()))  # Python state: traced, each value would become a guard

    model._orig_mod[0].register_forward_hook(untraced(hook, model) if wrap else hook)
    with CompileLog() as log:
        for _ in range(4):
            model(torch.randn(8, 8)).sum().backward()
    assert len(seen) == 4
    return log


def test_an_untraced_hook_never_recompiles_the_model() -> None:
    assert _hooked(wrap=True).recompiles == 0


def test_a_traced_hook_recompiles_the_model() -> None:
    assert _hooked(wrap=False).recompiles >= 2  # the control


def test_a_hook_on_an_uncompiled_model_is_left_as_it_is() -> None:
    def hook(*_: object) -> None:
        return None

    assert untraced(hook, _mlp()) is hook
    assert untraced(hook, torch.compile(_mlp(), backend="eager")) is not hook


def test_compile_log_note() -> None:
    assert CompileLog().note() is None
    log = _run(torch.compile(_mlp(), backend="eager"), [6, 7], mark=False)
    assert log.note().startswith("torch.compile: 2 compile(s), 1 of them recompiles")


def _diagnose_compiled(monkeypatch: pytest.MonkeyPatch | None) -> CompileLog:
    if monkeypatch is not None:  # the insertion proposed for Setup.loss (tropt/setup.py, owned elsewhere)
        from tropt.setup import Setup

        plain = Setup.loss
        monkeypatch.setattr(Setup, "loss", lambda self, m, b: plain(self, m, mark_batch_dynamic(m, [b])[0]))
    mlp = _mlp()
    model = torch.compile(mlp, backend="eager")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ctx = model.dynamo_ctx
    data = [(torch.randn(32, 8), torch.randint(0, 3, (32,))) for _ in range(4)]
    setup = tropt.Setup(model, lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]),
                        optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1), train_data=data,
                        accumulation_steps=2)
    checks = ["model.init_loss", "model.gradient_flow", "loop.zero_grad", "loop.accumulation", "loop.resume"]
    with CompileLog() as log:
        report = tropt.diagnose(setup, checks=checks, budget="quick", progress=False)
    assert all(r.status.value in ("pass", "warn", "skip") for r in report.results), report.to_frame()
    assert log.limit_hits == 0
    # the user's compiled model is untouched: same wrapper, same module, same weights, same compile settings
    assert model._orig_mod is mlp and model.dynamo_ctx is ctx and model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    return log


@pytest.mark.slow
def test_diagnosis_of_a_compiled_mlp_compiles_a_bounded_number_of_times() -> None:
    log = _diagnose_compiled(None)
    # 1 first compile + grad mode (no_grad probes) + function-mode spies + one batch size (64 then 32)
    assert log.compiles <= 7, log.reasons


@pytest.mark.slow
def test_marked_batches_spare_the_diagnosis_every_size_recompile(monkeypatch: pytest.MonkeyPatch) -> None:
    log = _diagnose_compiled(monkeypatch)
    assert not [r for r in log.reasons if "size mismatch" in r], log.reasons
    assert log.compiles <= 7, log.reasons
