"""What tropt's own hooks need to read any gradient, and to own their failures.

A gradient may be sparse (``nn.Embedding(sparse=True)``, ``EmbeddingBag(sparse=True)``: a COO tensor), and most
dense ops (``torch._foreach_norm``, ``count_nonzero`` on a view, comparisons) do not take it. :func:`norm_view` gives
a tensor with the same L2/L1/max norms, non-zero and non-finite counts (the coalesced values, no densifying);
:func:`dense` densifies where a copy is kept and compared entry by entry.

A hook tropt registers runs inside the user's ``optimizer.step()`` or ``backward()``: an exception escaping it
would be reported as the user's step raising. :func:`owned_hook` turns it into a :class:`tropt.errors.TroptError`
that names tropt's hook, which ``Setup.run_step`` passes through unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ..errors import TroptError

F = TypeVar("F", bound=Callable[..., Any])


def dense(g: torch.Tensor) -> torch.Tensor:
    """``g`` as a strided tensor: a sparse gradient densified (same values), a dense one returned as is."""
    return g if g.layout == torch.strided else g.to_dense()


def norm_view(g: torch.Tensor) -> torch.Tensor:
    """A strided tensor with ``g``'s norms and its non-zero and non-finite entry counts: ``g`` itself when dense, the
    values of the coalesced COO tensor when sparse (the entries it leaves out are exact zeros), else ``g`` densified."""
    if g.layout == torch.strided:
        return g
    if g.layout == torch.sparse_coo:
        return g.coalesce().values()
    return g.to_dense()


def owned_hook(what: str) -> Callable[[F], F]:
    """Decorate one of tropt's hooks: an exception other than a TroptError becomes a TroptError naming ``what``
    (e.g. "the gradient monitor's optimizer-step hook") as tropt's failure, with the original chained."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def hooked(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except TroptError:
                raise
            except Exception as exc:
                raise TroptError(
                    f"tropt's {what} failed inside optimizer.step() or backward() ({type(exc).__name__}: {exc}); "
                    "this is a limitation of tropt, not an error in your step",
                    "this is unexpected: report it to tropt with the traceback"
                ) from exc
        return hooked  # type: ignore[return-value]
    return wrap
