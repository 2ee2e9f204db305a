"""The runtime: crash barrier entry points, the engine, patches and rules."""

from ._crash import Crash
from ._decision import ABORT, CONTINUE, RELOAD, RETRY, SKIP, Decision
from ._engine import ENGINE, Engine
from ._queue import DecisionPatch, ExecPatch, Patch, PatchQueue, ReloadPatch, ReplacePatch
from ._replace import replace
from ._rules import Rule, RuleBook

__all__ = [
    "ABORT",
    "CONTINUE",
    "RELOAD",
    "ENGINE",
    "RETRY",
    "SKIP",
    "Crash",
    "Decision",
    "DecisionPatch",
    "Engine",
    "ExecPatch",
    "Patch",
    "PatchQueue",
    "ReloadPatch",
    "ReplacePatch",
    "Rule",
    "RuleBook",
    "replace",
]
