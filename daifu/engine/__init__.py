"""The runtime: crash barrier entry points, the engine, patches and rules."""

from .. import cells as _cells
from .._runtime import RUNTIME
from . import _barrier
from ._crash import Crash
from ._decision import ABORT, CONTINUE, RELOAD, RETRY, SKIP, AllRanks, Decision, all_ranks
from ._engine import ENGINE, Engine, EngineSettings, replace
from ._guards import passing as _passing
from ._queue import DecisionPatch, ExecPatch, Patch, PatchQueue, ReloadPatch, ReplacePatch
from ._rules import Rule, RuleBook
from .human import _break

# the stubs of vaccinated code call the barrier; the engine's state resets with
# the runtime's
_cells.use_barrier(_barrier.entry(), _barrier.passing)
RUNTIME.on_reset(ENGINE.reset)
# the wings get what they need of the core here, never by importing it back
_break.wire(busy=ENGINE.busy, passing=_passing)

__all__ = [
    "ABORT",
    "CONTINUE",
    "RELOAD",
    "ENGINE",
    "RETRY",
    "SKIP",
    "AllRanks",
    "Crash",
    "Decision",
    "DecisionPatch",
    "Engine",
    "EngineSettings",
    "ExecPatch",
    "Patch",
    "PatchQueue",
    "ReloadPatch",
    "ReplacePatch",
    "Rule",
    "RuleBook",
    "all_ranks",
    "replace",
]
