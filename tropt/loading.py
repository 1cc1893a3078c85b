"""Load the user's objects from a spec string: ``path/to/file.py:function`` or ``package.module:function``."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

from .errors import SetupError, StepError, TroptError


def load_callable(spec: str) -> Callable:
    """Import the function named by ``spec`` ("file.py:func" or "module:func")."""
    if not isinstance(spec, str) or ":" not in spec:
        raise TroptError(f"cannot load {spec!r}: expected 'path/to/file.py:function' or 'module:function'",
                         "e.g. --setup data/samples/sample_setup.py:make_setup")
    target, _, name = spec.rpartition(":")
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = os.path.abspath(target)
        if not os.path.isfile(path):
            raise TroptError(f"cannot load {spec!r}: the file {target} does not exist",
                             "check the path (relative paths start at the current directory)")
        mod_name = f"_tropt_user_{abs(hash(path))}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        if module_spec is None or module_spec.loader is None:
            raise TroptError(f"cannot load {spec!r}: {target} is not a Python module", "give a .py file")
        module = importlib.util.module_from_spec(module_spec)
        # Let the file import its neighbours, as running it as a script would.
        sys.path.insert(0, os.path.dirname(path))
        try:
            sys.modules[mod_name] = module
            module_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(mod_name, None)
            raise StepError(f"importing {target} raised {type(exc).__name__}: {exc}",
                            "fix the error in that file") from exc
        finally:
            sys.path.remove(os.path.dirname(path))
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise TroptError(f"cannot load {spec!r}: module {target!r} is not importable ({exc})",
                             "check the name and that it is installed") from exc
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        names = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise TroptError(f"cannot load {spec!r}: {target} has no function {name!r}",
                         f"choose one of: {', '.join(names) or '(none)'}")
    return fn


def load_setup(spec: str) -> Any:
    """Call the function named by ``spec`` and check it returned a :class:`tropt.Setup`."""
    from .setup import Setup

    fn = load_callable(spec)
    try:
        setup = fn()
    except TroptError:
        raise
    except Exception as exc:
        raise StepError(f"{spec} raised {type(exc).__name__}: {exc}",
                        "fix the setup function; it is called with no arguments") from exc
    if not isinstance(setup, Setup):
        raise SetupError(f"{spec} returned a {type(setup).__name__}, expected a tropt.Setup",
                         "end the function with: return tropt.Setup(model, loss_fn, optimizer, train_data, ...)")
    return setup
