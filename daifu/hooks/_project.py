"""The program's own project: the modules beside the script.

Real projects keep their training loop in a module beside the script
(minGPT's ``mingpt/trainer.py``, ``model.py`` next to nanoGPT's
``train.py``, a ``trainer/`` package).  By default daifu vaccinates every
module whose file lives under the script's directory -- for ``-m
pkg.mod``, under the top-level package's directory -- and never one in
site-packages or the standard library (a virtual environment inside the
project included).

The finder asks ``matches`` first, on the module's dotted name alone (its
first component among the names in the project's directory: one listing,
at start-up), then, with the regular spec found, ``refuses`` on its file.
"""

from __future__ import annotations

import os
import sys

from ._patterns import NEVER

#: path components of installed packages
_INSTALLED = frozenset({"site-packages", "dist-packages"})


class Project:
    """The modules under ``root`` that may be vaccinated as the project's."""

    def __init__(self, root: str, names: frozenset[str]):
        self.root = root
        self.names = names
        self._prefix = root.rstrip(os.sep) + os.sep
        #: the interpreter's own trees: the standard library, the venv's
        self._excluded = tuple({os.path.realpath(p).rstrip(os.sep) + os.sep for p in (
            sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)})

    @classmethod
    def of_script(cls, script: str) -> Project | None:
        """The directory holding ``script`` (a file), with the importable
        names in it; None for a directory daifu must not claim."""
        root = os.path.dirname(os.path.realpath(script))
        return cls._at(root, _importable(root))

    @classmethod
    def of_package(cls, package_dir: str, name: str) -> Project | None:
        """For ``-m pkg.mod``: the top-level package's directory, and its name."""
        return cls._at(os.path.realpath(package_dir), frozenset({name}))

    @classmethod
    def _at(cls, root: str, names: frozenset[str]) -> Project | None:
        probe = cls(root, names)
        if not names or probe.refuses(os.path.join(root, "x.py")):
            return None
        return probe

    @classmethod
    def from_env(cls, value: str) -> Project | None:
        """What a child process inherits: ``DAIFU_PROJECT``, ``root:names``."""
        root, _, names = value.rpartition(":")
        if not os.path.isdir(root):
            return None
        return cls._at(root, frozenset(n for n in names.split(",") if n.isidentifier()))

    def to_env(self) -> str:
        return f"{self.root}:{','.join(sorted(self.names))}"

    def matches(self, fullname: str) -> bool:
        first = fullname.partition(".")[0]
        return first in self.names and first not in NEVER

    def refuses(self, origin: str) -> str | None:
        """Why the module at ``origin`` is not the project's, or None."""
        path = os.path.realpath(origin)
        if not path.startswith(self._prefix):
            return f"its file is not under {self.root}"
        if _INSTALLED.intersection(path[len(self._prefix):].split(os.sep)):
            return "an installed package (site-packages)"
        if any(path.startswith(p) for p in self._excluded):
            return "the standard library or the environment's own packages"
        return None

    def describe(self) -> str:
        return f"{self.root} ({', '.join(sorted(self.names))})"


def _importable(root: str) -> frozenset[str]:
    """The names ``import`` can find in ``root``: ``*.py`` files and
    directories with an identifier's name (packages, namespace packages)."""
    names = set()
    try:
        entries = os.scandir(root)
    except OSError:
        return frozenset()
    with entries:
        for entry in entries:
            name = entry.name
            if name.startswith(".") or name == "__pycache__":
                continue
            if name.endswith(".py") and name[:-3].isidentifier():
                names.add(name[:-3])
            elif name.isidentifier():
                try:
                    if entry.is_dir() and not os.path.exists(os.path.join(entry.path,
                                                                          "pyvenv.cfg")):
                        names.add(name)
                except OSError:
                    continue
    return frozenset(names)
