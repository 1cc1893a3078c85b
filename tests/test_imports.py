"""The layout's import rules (docs/architecture.md, "Who may import what"), read from the code itself:

- no import cycle among tropt's modules at module level (imports inside functions and ``TYPE_CHECKING`` blocks are
  lazy and do not count);
- no package imports another package's private module (``tropt.model._common`` from ``tropt.data``) or a private
  name from another package, anywhere (inside functions too);
- the core (``tropt/core``, the core types at the top level) and the stage packages (data, model, loop, dynamics,
  perf) never import ``experiments``, ``report``, ``widgets`` or ``integrations``, anywhere; the core imports no
  stage package.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "tropt"
STAGES = ("data", "model", "loop", "dynamics", "perf")
UPPER = ("experiments", "report", "widgets", "integrations")
# Top-level modules that span the stages (they may import any package): the public API, the runner, the CLI, and
# the run identity (it fingerprints splits with stage 1's own scan, reusing the one the data checks made). Every
# other top-level module is a core type or core machinery.
RUNNERS = {"tropt", "tropt.diagnosis", "tropt.cli", "tropt.identity"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (absolute)
    names: tuple[str, ...]
    lineno: int
    eager: bool  # at module level, outside TYPE_CHECKING


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path) -> list[Import]:
    module = module_name(path)
    package = _package_of(module, path)
    found: list[Import] = []

    def visit(node: ast.AST, eager: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.body:
                    visit(ast.Module(body=[sub], type_ignores=[]), False)
                for sub in child.orelse:
                    visit(ast.Module(body=[sub], type_ignores=[]), eager)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.startswith("tropt"):
                    names = tuple(a.name for a in child.names)
                    # `from . import x` may import a submodule x
                    for name in names:
                        candidate = f"{target}.{name}"
                        if (ROOT.parent / candidate.replace(".", "/")).with_suffix(".py").exists() or (
                                ROOT.parent / candidate.replace(".", "/") / "__init__.py").exists():
                            found.append(Import(module, candidate, (), child.lineno, eager))
                    found.append(Import(module, target, names, child.lineno, eager))
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith("tropt"):
                        found.append(Import(module, alias.name, (), child.lineno, eager))
            else:
                visit(child, eager)

    visit(ast.parse(path.read_text(encoding="utf-8")), True)
    return found


ALL = [imp for path in sorted(ROOT.rglob("*.py")) for imp in imports_of(path)]


def top_package(module: str) -> str:
    """``tropt.data.sources`` -> ``data``; a top-level module (``tropt.setup``) -> ``tropt``."""
    parts = module.split(".")
    if len(parts) >= 2 and (ROOT / parts[1]).is_dir():
        return parts[1]
    return "tropt"


def is_private(module: str) -> bool:
    return any(part.startswith("_") and part != "__init__" for part in module.split(".")[1:])


def test_the_import_reader_sees_the_imports_it_must_judge():
    """The rules below are only as good as this reader: it must find known imports, eager and lazy."""
    by_source = {(i.source, i.target, i.eager) for i in ALL}
    assert ("tropt.core.batch", "tropt.errors", True) in by_source
    assert any(i.source == "tropt.result" and i.target == "tropt.verdict" and not i.eager for i in ALL)
    assert any(i.source == "tropt" and not i.eager for i in ALL)  # the TYPE_CHECKING block


def cycles(imports: list[Import]) -> list[list[str]]:
    """Module-level import cycles among the modules of ``imports``."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.eager and imp.target != imp.source:
            graph.setdefault(imp.source, set()).add(imp.target)
    # a submodule importing its own package's __init__ is Python's normal order, not a cycle between modules
    for source, targets in graph.items():
        targets.discard(source.rpartition(".")[0])
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def dfs(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                dfs(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            dfs(node, [])
    return found


def private_cross_imports(imports: list[Import]) -> list[str]:
    """Imports of another package's private module or private name."""
    bad = []
    for imp in imports:
        if top_package(imp.source) == top_package(imp.target):
            continue
        if is_private(imp.target):
            bad.append(f"{imp.source}:{imp.lineno} imports private module {imp.target}")
        private_names = [n for n in imp.names if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))]
        if private_names:
            bad.append(f"{imp.source}:{imp.lineno} imports private {private_names} from {imp.target}")
    return bad


def _is_core(module: str) -> bool:
    pkg = top_package(module)
    return pkg == "core" or (pkg == "tropt" and module not in RUNNERS)


def upward_imports(imports: list[Import], layer: str) -> list[str]:
    """Imports from ``layer`` ("core" or a stage) of a package above it."""
    bad = []
    for imp in imports:
        in_layer = _is_core(imp.source) if layer == "core" else top_package(imp.source) == layer
        dst = top_package(imp.target)
        if in_layer and (dst in UPPER or (layer == "core" and dst in STAGES)):
            bad.append(f"{imp.source}:{imp.lineno} imports {imp.target}")
    return bad


def test_the_rules_find_planted_violations():
    """Known answers: a planted cycle, private cross-import and upward imports are each found; allowed ones are not."""
    planted = [
        Import("tropt.data.scan", "tropt.data.cache", ("session",), 1, True),
        Import("tropt.data.cache", "tropt.data.scan", ("scan",), 2, True),  # a cycle
        Import("tropt.loop.zero_grad", "tropt.model._common", ("fmt",), 3, False),  # private module, lazily
        Import("tropt.loop.zero_grad", "tropt.result", ("_badge",), 4, True),  # private name
        Import("tropt.perf.memory", "tropt.integrations.live", (), 5, False),  # a stage importing upward
        Import("tropt.core.batch", "tropt.data.scan", (), 6, False),  # the core importing a stage
        Import("tropt.data._common", "tropt.data.scan", (), 7, True),  # allowed: its own package
        Import("tropt.verdict", "tropt.result", ("_badge",), 8, True),  # allowed: the same (top-level) package
        Import("tropt.diagnosis", "tropt.experiments.plan", (), 9, False),  # allowed: a spanning module
    ]
    assert cycles(planted) == [["tropt.data.scan", "tropt.data.cache", "tropt.data.scan"]]
    found = [b.split(" ")[0] for b in private_cross_imports(planted)]
    assert found == ["tropt.loop.zero_grad:3", "tropt.loop.zero_grad:4"]
    assert upward_imports(planted, "perf") == ["tropt.perf.memory:5 imports tropt.integrations.live"]
    assert upward_imports(planted, "core") == ["tropt.core.batch:6 imports tropt.data.scan"]


def test_no_import_cycle_at_module_level():
    found = cycles(ALL)
    assert found == [], "module-level import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_no_private_cross_package_import():
    bad = private_cross_imports(ALL)
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize("layer", ["core", *STAGES])
def test_lower_layers_never_import_upward(layer):
    bad = upward_imports(ALL, layer)
    assert bad == [], "\n".join(bad)
