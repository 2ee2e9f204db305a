"""The runtime: crash barrier entry points, the engine, patches and rules.

This is the package's face: the hooks and ``daifu`` import from here only.
The core decides (``_engine``, ``_barrier``, ``_guards``); its wings are its
interfaces and its memory -- ``human`` (console, report, waiter, break),
``remote`` (run directory, control socket, job store, ranks' agreement,
doctor) and ``persist`` (journal, checkpoint, preemption, resume point).
What other packages use of a wing is named in ``_LAZY`` and imported on
first use: nothing of a wing loads before it is needed.
"""

from __future__ import annotations

from .. import cells as _cells
from .._firstuse import first_use
from .._runtime import RUNTIME
from . import _barrier, _signals
from ._crash import Crash, is_plumbing
from ._decision import ABORT, CONTINUE, RELOAD, RETRY, SKIP, AllRanks, Decision, all_ranks
from ._engine import ENGINE, Engine, EngineSettings, replace
from ._events import ModuleVaccinated, emit
from ._events import configure as configure_events
from ._fastpath import passing as _passing
from ._job import job_file_info, rank_unknown_yet
from ._job import placeholders as event_placeholders
from ._queue import DecisionPatch, ExecPatch, Patch, PatchQueue, ReloadPatch, ReplacePatch
from ._rules import Rule, RuleBook, Where
from .human import _break

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

    from ._loaders import record_sent_indices as record_sent_indices
    from ._preload import settle as settle_preload
    from ._preload import start as start_preload
    from ._signals import install as hold_signals
    from ._watchdog import start as start_watchdog
    from .human._break import ARMED_S as ARMED_S
    from .human._break import serve_break as serve_break
    from .human._waiter import Waiter as Waiter
    from .persist._checkpoint import load_checkpoint as load_checkpoint
    from .persist._checkpoint import restore_rng as restore_rng
    from .persist._journal import Journal as Journal
    from .persist._journal import JournalError as JournalError
    from .persist._journal import Replay as Replay
    from .persist._journal import default_directory as journal_directory
    from .persist._journal import default_path as journal_path
    from .persist._journal import journals as journals
    from .persist._preempt import install as install_preemption
    from .persist._resume import ResumeError as ResumeError
    from .persist._resume import keep_loaders as keep_loaders
    from .persist._resume import keep_stateful_loaders as keep_stateful_loaders
    from .persist._resume import keep_steps as keep_steps
    from .persist._resume import resume as resume
    from .remote._boundary import job_boundary as job_boundary
    from .remote._control import EndpointError as EndpointError
    from .remote._control import Session as Session
    from .remote._control import list_jobs as list_jobs
    from .remote._control import request as request
    from .remote._control import runtime_dir as runtime_dir
    from .remote._distributed import extend_collective_timeouts as extend_collective_timeouts
    from .remote._doctor import diagnose as diagnose
    from .remote._doctor import render as render_diagnosis
    from .remote._jobstore import JobRanks as JobRanks
    from .remote._jobstore import place as place
    from .remote._rundir import register_job as register_job
    from .remote._rundir import running_jobs as running_jobs
    from .remote._rundir import serve_stacks as serve_stacks
    from .remote._rundir import stacks_path as stacks_path
    from .remote._rundir import unregister_job as unregister_job

# the stubs of vaccinated code call the barrier; the engine's state resets with
# the runtime's
_cells.use_barrier(*_barrier.entry(), _barrier.passing, _barrier.upgraded)
RUNTIME.on_reset(ENGINE.reset)
# the wings get what they need of the core here, never by importing it back
_break.wire(busy=ENGINE.busy, passing=_passing)

#: name -> (module, its name there): what the hooks and ``daifu`` use of the
#: wings and of the parts of the core that start-up does not load
_LAZY: dict[str, tuple[str, str]] = {
    "record_sent_indices": ("_loaders", "record_sent_indices"),
    "hold_signals": ("_signals", "install"),
    "start_preload": ("_preload", "start"),
    "start_watchdog": ("_watchdog", "start"),
    "settle_preload": ("_preload", "settle"),
    # human
    "ARMED_S": ("human._break", "ARMED_S"),
    "serve_break": ("human._break", "serve_break"),
    "Waiter": ("human._waiter", "Waiter"),
    # persist
    "Journal": ("persist._journal", "Journal"),
    "JournalError": ("persist._journal", "JournalError"),
    "Replay": ("persist._journal", "Replay"),
    "journal_path": ("persist._journal", "default_path"),
    "journal_directory": ("persist._journal", "default_directory"),
    "journals": ("persist._journal", "journals"),
    "load_checkpoint": ("persist._checkpoint", "load_checkpoint"),
    "restore_rng": ("persist._checkpoint", "restore_rng"),
    "install_preemption": ("persist._preempt", "install"),
    "job_boundary": ("remote._boundary", "job_boundary"),
    "keep_loaders": ("persist._resume", "keep_loaders"),
    "keep_stateful_loaders": ("persist._resume", "keep_stateful_loaders"),
    "keep_steps": ("persist._resume", "keep_steps"),
    "resume": ("persist._resume", "resume"),
    "ResumeError": ("persist._resume", "ResumeError"),
    # remote
    "EndpointError": ("remote._control", "EndpointError"),
    "Session": ("remote._control", "Session"),
    "list_jobs": ("remote._control", "list_jobs"),
    "request": ("remote._control", "request"),
    "runtime_dir": ("remote._control", "runtime_dir"),
    "diagnose": ("remote._doctor", "diagnose"),
    "render_diagnosis": ("remote._doctor", "render"),
    "JobRanks": ("remote._jobstore", "JobRanks"),
    "place": ("remote._jobstore", "place"),
    "register_job": ("remote._rundir", "register_job"),
    "unregister_job": ("remote._rundir", "unregister_job"),
    "running_jobs": ("remote._rundir", "running_jobs"),
    "serve_stacks": ("remote._rundir", "serve_stacks"),
    "stacks_path": ("remote._rundir", "stacks_path"),
    "extend_collective_timeouts": ("remote._distributed", "extend_collective_timeouts"),
}


def __getattr__(name: str) -> Any:
    return first_use(__name__, _LAZY, globals(), name)


def speedups() -> tuple[str, str]:
    """How the barrier checks a remembered route ("in C", or "in Python:
    why"), and where the program's signal handlers are held back."""

    return _barrier._state.check, ("in C" if _signals._csignals is not None else "in Python")


__all__ = [
    "ABORT",
    "ARMED_S",
    "AllRanks",
    "CONTINUE",
    "Crash",
    "Decision",
    "DecisionPatch",
    "ENGINE",
    "EndpointError",
    "Engine",
    "EngineSettings",
    "ExecPatch",
    "JobRanks",
    "Journal",
    "JournalError",
    "ModuleVaccinated",
    "Patch",
    "PatchQueue",
    "RELOAD",
    "RETRY",
    "ReloadPatch",
    "ReplacePatch",
    "Replay",
    "ResumeError",
    "Rule",
    "RuleBook",
    "SKIP",
    "Session",
    "Waiter",
    "Where",
    "all_ranks",
    "configure_events",
    "diagnose",
    "emit",
    "event_placeholders",
    "extend_collective_timeouts",
    "hold_signals",
    "install_preemption",
    "job_boundary",
    "is_plumbing",
    "job_file_info",
    "journal_directory",
    "journal_path",
    "journals",
    "keep_loaders",
    "keep_stateful_loaders",
    "keep_steps",
    "list_jobs",
    "load_checkpoint",
    "place",
    "rank_unknown_yet",
    "record_sent_indices",
    "register_job",
    "render_diagnosis",
    "replace",
    "request",
    "restore_rng",
    "resume",
    "running_jobs",
    "runtime_dir",
    "serve_break",
    "serve_stacks",
    "settle_preload",
    "speedups",
    "stacks_path",
    "start_preload",
    "start_watchdog",
    "unregister_job",
]
