"""Names of a package that load on first use (PEP 562), so importing the package stays light."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``where`` maps each name to the submodule that
    defines it (``{"Trainer": ".trainer"}``); a name is imported on first access, then cached.

    >>> import types, sys
    >>> pkg = types.ModuleType("pkg_demo"); sys.modules["pkg_demo"] = pkg
    >>> pkg.__getattr__ = lazy_getattr("pkg_demo", {"dumps": "json"})
    >>> pkg.dumps([1])
    '[1]'
    """

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
