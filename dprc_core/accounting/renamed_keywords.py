"""Keywords accepted under an earlier name for one release, with a ``DeprecationWarning``.

:func:`renamed_keyword` wraps a function whose parameter ``new`` was called ``old``: a call
passing ``old=`` is forwarded as ``new=`` with a warning, and one passing both is a
``TypeError``. The wrapped function keeps ``old`` as a keyword-only parameter defaulting to
``None`` (so type checkers accept the old spelling); the wrapper always clears it.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


def take_renamed(kwargs: dict[str, Any], old: str, new: str, where: str, stacklevel: int) -> None:
    """Move ``kwargs[old]`` to ``kwargs[new]`` (warning), or refuse both; in place."""
    if old not in kwargs:
        return
    value = kwargs.pop(old)
    if new in kwargs:
        raise TypeError(f"{where}() got both {new!r} and its deprecated name {old!r}")
    warnings.warn(
        f"{where}(): the keyword {old!r} is deprecated, use {new!r}",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )
    kwargs[new] = value


def renamed_keyword(old: str, new: str) -> Callable[[F], F]:
    """Accept ``old=`` for the parameter ``new`` (see the module docstring)."""

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        where = fn.__qualname__

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get(old) is not None:
                value = kwargs.pop(old)
                if new in signature.bind_partial(*args, **kwargs).arguments:
                    raise TypeError(f"{where}() got both {new!r} and its deprecated name {old!r}")
                kwargs[old] = value
                take_renamed(kwargs, old, new, where, stacklevel=2)
            else:
                kwargs.pop(old, None)
            return fn(*args, **kwargs)

        return cast(F, wrapper)

    return decorate
