"""Installing the hook in this process (and making spawned children do it too)."""

from __future__ import annotations

import os
import sys
from types import TracebackType

from .._runtime import RUNTIME, state_record
from ..cells import use_dynamo
from ..engine import ENGINE, hold_signals, start_preload
from . import _logging
from ._config import Config
from ._finder import DaifuFinder, vaccinate_in_place


@state_record
class _Installed:
    """What ``install`` did to this process (``RUNTIME.parts``)."""

    #: the finder on ``sys.meta_path``
    finder: DaifuFinder | None = None
    #: ``ensure_engine`` set the engine up (once per process)
    engine_ready: bool = False


_state = RUNTIME.part(__name__, _Installed())


class Installation:
    """Handle returned by ``install``; a context manager."""

    def __init__(self, finder: DaifuFinder):
        self.finder = finder

    def uninstall(self) -> None:
        uninstall()

    def __enter__(self) -> Installation:
        return self

    def __exit__(self, et: type | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.uninstall()


#: what a spawned child runs first (``_child.activate``)
_PREFIX = "import daifu.hooks._child as _daifu_child; _daifu_child.activate(); "


def patch_spawn() -> None:
    """Make multiprocessing's spawn command line activate daifu first."""
    import multiprocessing.spawn as spawn  # lazy: 14.4 ms

    if getattr(spawn.get_command_line, "_daifu", False):
        return
    original = spawn.get_command_line

    def get_command_line(**kwds):
        cmd = original(**kwds)
        if "-c" in cmd:
            i = cmd.index("-c") + 1
            if not cmd[i].startswith(_PREFIX):
                cmd[i] = _PREFIX + cmd[i]
        return cmd

    get_command_line._daifu = True  # type: ignore[attr-defined]
    spawn.get_command_line = get_command_line


def install(modules: str | None = None, entry: str | None = None,
            config: Config | None = None) -> Installation:
    """Put daifu's finder first on ``sys.meta_path`` (replacing an earlier one)."""
    cfg = config or Config.from_env()
    if modules is not None:
        cfg.modules = modules
    if entry is not None:
        cfg.entry = tuple(x.strip() for x in entry.split(",") if x.strip()) or ("*",)
    cfg.validate()
    cfg.apply()
    uninstall()

    # patched now if the program imported them, else when it does (never
    # import multiprocessing or torch for a program that does not use them):
    # spawned children must activate daifu; worker DataLoaders remember the
    # indices of the batches in flight (a retry of a failed batch needs them)
    # ``torch.compile`` runs first-call stubs as they are (``cells._lazy``)
    # and compiles the original code of vaccinated functions (``cells._dynamo``)
    # (what they call is imported then: the resume point's and the
    # distributed hooks' modules are no part of a start that needs none)
    def loaders() -> None:
        from ..engine import keep_loaders, record_sent_indices  # lazy: 2.3 ms

        record_sent_indices()
        if ENGINE.checkpoint:
            keep_loaders()

    def steps() -> None:
        if ENGINE.checkpoint:
            from ..engine import keep_steps  # lazy: 2.3 ms

            keep_steps()

    def stateful() -> None:
        if ENGINE.checkpoint:
            from ..engine import keep_stateful_loaders  # lazy: 2.3 ms

            keep_stateful_loaders()

    def collectives() -> None:
        from ..engine import extend_collective_timeouts  # lazy: 0.9 ms

        extend_collective_timeouts(lambda: ENGINE.waiters, on_group=_start_watchdog)

    patches = {"multiprocessing.spawn": lambda: patch_spawn(),
               "torch.utils.data.dataloader": loaders,
               # the resume point: the RNG and the loaders' positions at each
               # optimizer step and the header after it (engine/persist/_resume.py)
               "torch.optim.optimizer": steps,
               "torchdata.stateful_dataloader.stateful_dataloader": stateful,
               "torch._dynamo.eval_frame": lambda: use_dynamo(),
               "torch._dynamo.convert_frame": lambda: _compile_original(),
               # a rank waiting for a fix must not time its peers out
               "torch.distributed.distributed_c10d": collectives}
    later = {name: patch for name, patch in patches.items() if name not in sys.modules}
    _state.finder = DaifuFinder(cfg.matcher, cfg.selection(), on_import=later,
                          project=cfg.the_project(), explain=cfg.explain)
    sys.meta_path.insert(0, _state.finder)
    for name, patch in patches.items():
        if name not in later:
            patch()
    _vaccinate_imported(cfg)

    hold_signals()  # the program's signal handlers never run in daifu's code
    start_preload()  # what the first crash imports, a few seconds from now
    return Installation(_state.finder)


def _start_watchdog() -> None:
    """A process group was made: this rank's hang watchdog (engine/_watchdog.py)."""
    from ..engine import start_watchdog  # lazy: 11.1 ms

    start_watchdog(ENGINE)


def _compile_original() -> None:
    from ..cells import trace_original  # lazy: 1.2 ms

    trace_original()


def _vaccinate_imported(cfg: Config) -> None:
    """Modules ``DAIFU_MODULES`` names that were imported before the hook was
    installed (by the interpreter's start-up, by daifu, by the program before
    ``daifu.install()``) are vaccinated in place."""
    finder = _state.finder
    if finder is None or not (cfg.matcher or finder.project is not None):
        return

    for name, module in list(sys.modules.items()):
        if module is not None and name != "__main__" \
                and finder.claims(name, getattr(module, "__file__", None)):
            vaccinate_in_place(module, cfg.selection())


def uninstall() -> None:
    if _state.finder is not None:
        try:
            sys.meta_path.remove(_state.finder)
        except ValueError:
            pass
        _state.finder = None


def current() -> DaifuFinder | None:
    return _state.finder


def ensure_engine() -> None:
    """``daifu.install()`` and ``@daifu.vaccinate`` under plain ``python``: the
    engine gets what the runner gives it -- the journal, ``--wait`` /
    ``DAIFU_WAIT``, the console on a terminal, ``DAIFU_LOG`` -- once per
    process, unless the runner (or an earlier call) set it up."""

    if _state.engine_ready or ENGINE.journal is not None:
        return
    _state.engine_ready = True
    cfg = Config.from_env()
    if cfg.log or os.environ.get("DAIFU_LOG_LEVEL"):
        _logging.configure(cfg.log, cfg.log_level, cfg.log_format)
    cfg.setup_engine(sys.argv[0] if sys.argv and sys.argv[0] else None, interactive=True)

