"""The runtime: crash barrier entry points, the engine, patches and rules."""

from ._crash import Crash
from ._decision import ABORT, CONTINUE, RETRY, SKIP, Decision
from ._engine import ENGINE, Engine
from ._queue import DecisionPatch, ExecPatch, Patch, PatchQueue, ReplacePatch
from ._replace import replace
from ._rules import Rule, RuleBook

__all__ = [
    "ABORT",
    "CONTINUE",
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
    "ReplacePatch",
    "Rule",
    "RuleBook",
    "replace",
]
