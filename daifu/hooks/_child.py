"""Child processes started with multiprocessing's *spawn* method.

A forked child inherits the parent's hook and vaccinated code.  A spawned
child is a fresh interpreter: the parent rewrites its command line so that the
child first runs ``activate()``, which installs the hook from the inherited
``DAIFU_*`` environment, loads the rules files, and vaccinates the parent's
main script when multiprocessing re-runs it as ``__mp_main__``.  (The
parent's side, the rewrite of the command line, is ``_install.patch_spawn``.)
"""

from __future__ import annotations

import os
import sys
import types

from ._finder import compile_vaccinated


def activate() -> None:
    """Run in a spawned child before multiprocessing's own bootstrap."""
    try:
        from . import _logging  # lazy: 28.8 ms
        from ._config import Config  # lazy: 28.7 ms
        from ._install import install  # lazy: 25.1 ms
        from ._runner import load_fixes  # lazy: 36.9 ms

        cfg = Config.from_env()
        _logging.configure(cfg.log, cfg.log_level, cfg.log_format)
        cfg.setup_engine(cfg.main, interactive=False)
        install(config=cfg)
        load_fixes(cfg.fixes)
        if cfg.main:
            _patch_main_fixup(cfg)
    except Exception as exc:  # never stop the child from running
        sys.stderr.write(f"daifu: could not activate in child process {os.getpid()}: {exc}\n")


def _patch_main_fixup(cfg) -> None:
    import multiprocessing.spawn as spawn  # lazy: 8.2 ms

    original = spawn._fixup_main_from_path  # type: ignore[attr-defined]

    def _fixup_main_from_path(main_path):
        if os.path.abspath(main_path) != os.path.abspath(cfg.main):
            return original(main_path)
        current_main = sys.modules["__main__"]
        main_name = os.path.splitext(os.path.basename(main_path))[0]
        if main_name == "ipython" or getattr(current_main, "__file__", None) == main_path:
            return None
        spawn.old_main_modules.append(current_main)
        main_module = types.ModuleType("__mp_main__")
        try:
            content = _run_path_vaccinated(main_path, "__mp_main__", cfg)
        except SyntaxError:
            raise
        main_module.__dict__.update(content)
        sys.modules["__main__"] = sys.modules["__mp_main__"] = main_module
        return None

    spawn._fixup_main_from_path = _fixup_main_from_path  # type: ignore[attr-defined]


def _run_path_vaccinated(path: str, run_name: str, cfg) -> dict:
    """``runpy.run_path(path, run_name=...)`` with the script vaccinated."""

    with open(path, "rb") as fh:
        source = fh.read()
    code = compile_vaccinated(source, os.path.abspath(path), cfg.selection(module_level=False),
                              run_name)
    module = types.ModuleType(run_name)
    module.__dict__.update(__file__=path, __cached__=None, __loader__=None, __package__="",
                           __spec__=None)
    saved = sys.modules.get(run_name)
    saved_argv0 = sys.argv[0] if sys.argv else None
    sys.modules[run_name] = module
    if sys.argv:
        sys.argv[0] = path
    try:
        exec(code, module.__dict__)
    finally:
        if saved is None:
            sys.modules.pop(run_name, None)
        else:
            sys.modules[run_name] = saved
        if saved_argv0 is not None:
            sys.argv[0] = saved_argv0
    return dict(module.__dict__)
