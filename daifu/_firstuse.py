"""Names a package imports on first use (a module ``__getattr__``, PEP 562).

``cells``, ``engine`` and ``hooks`` name in their ``__init__`` what other
packages use of them; what start-up does not need -- a wing of the engine,
the source reader, the runner -- is listed in a table ``name -> (module,
its name there)`` and imported the first time the name is read.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any


def first_use(package: str, table: dict[str, tuple[str, str]], namespace: dict[str, Any],
              name: str) -> Any:
    """The value of ``package.name``, imported now and kept in ``namespace``
    (the package's globals); ``AttributeError`` for a name not in ``table``."""
    where = table.get(name)
    if where is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{package}.{where[0]}"), where[1])
    namespace[name] = value
    return value
