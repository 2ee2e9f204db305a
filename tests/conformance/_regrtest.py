"""``python -m test`` (CPython's libregrtest) with two additions, run by
``tests/conformance/run.py`` in the interpreter under test; it imports nothing
from daifu or from this repository.

    python _regrtest.py --results FILE [--daifu ARGS] -- REGRTEST_ARGS ...

* ``--results FILE``: every test module's result, as libregrtest's main process
  receives it from its worker (state, duration, the JUnit XML of each test case,
  the ids of the failing ones and subtests), is appended to FILE as one JSON line
  at once (a run that is cut short keeps what it finished).
* ``--daifu ARGS``: each worker process (``-j N``: every test module runs in one)
  is started as ``python [flags] -m daifu ARGS -m test.libregrtest.worker JSON``
  instead of ``python [flags] -m test.libregrtest.worker JSON``: the test module,
  ``test.support`` and the worker's own code run vaccinated.  Nothing else
  differs between the plain side and the vaccinated side: the main process,
  which only hands out modules and collects results, runs plain on both.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import types

WORKER = "test.libregrtest.worker"

#: the states whose worker output is not kept
QUIET = {"PASSED", "ENV_CHANGED", "SKIPPED", "RESOURCE_DENIED", "DID_NOT_RUN", "FAILED"}


def _patch_workers(daifu_args: list[str]) -> None:
    from test.libregrtest import worker

    def popen(cmd, *args, **kwargs):
        cmd = list(cmd)
        for i in range(len(cmd) - 1):
            if cmd[i] == "-m" and cmd[i + 1] == WORKER:
                cmd[i:i] = ["-m", "daifu", *daifu_args]
                break
        else:  # pragma: no cover (a libregrtest that starts its workers otherwise)
            raise RuntimeError(f"conformance: no '-m {WORKER}' in the worker command {cmd}")
        return subprocess.Popen(cmd, *args, **kwargs)

    shim = types.SimpleNamespace(**{name: getattr(subprocess, name) for name in dir(subprocess)
                                    if not name.startswith("__")})
    shim.Popen = popen
    worker.subprocess = shim  # (create_worker_process calls subprocess.Popen)


def _patch_results(path: str) -> None:
    from test.libregrtest.results import TestResults
    from test.libregrtest.run_workers import RunWorkers

    accumulate = TestResults.accumulate_result
    process = RunWorkers._process_result
    stdout: list[str | None] = [None]

    def _process_result(self, item, *args, **kwargs):
        # (the worker's output, for the "Warning -- " lines that say why a module
        # altered the execution environment: leaked files, threads, ...)
        stdout[0] = None if item[0] else getattr(item[1], "worker_stdout", None)
        try:
            return process(self, item, *args, **kwargs)
        finally:
            stdout[0] = None

    def accumulate_result(self, result, runtests, *args, **kwargs):
        line = {
            "module": result.test_name,
            "state": result.state,
            "duration": result.duration,
            "rerun": bool(getattr(runtests, "rerun", False)),
            "stats": None if result.stats is None else {
                "run": result.stats.tests_run, "failures": result.stats.failures,
                "skipped": result.stats.skipped},
            "errors": result.errors or [],
            "failures": result.failures or [],
            "xml": result.xml_data or [],
            "warnings": [ln[len("Warning -- "):] for ln in (stdout[0] or "").splitlines()
                         if ln.startswith("Warning -- ")],
            # (why a worker died or timed out: the end of what it printed)
            "tail": [] if result.state in QUIET else (stdout[0] or "").splitlines()[-40:],
        }
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
        return accumulate(self, result, runtests, *args, **kwargs)

    TestResults.accumulate_result = accumulate_result
    RunWorkers._process_result = _process_result


def main(argv: list[str]) -> None:
    results = daifu = None
    while argv and argv[0] != "--":
        if argv[0] == "--results":
            results = argv[1]
        elif argv[0] == "--daifu":
            daifu = shlex.split(argv[1])
        else:
            raise SystemExit(f"_regrtest.py: unknown option {argv[0]!r}")
        argv = argv[2:]
    if results is None:
        raise SystemExit("_regrtest.py: --results FILE is required")
    if daifu is not None:
        _patch_workers(daifu)
    _patch_results(results)
    from test.libregrtest.main import main as regrtest

    sys.argv[:] = ["python -m test", *argv[1:]]
    regrtest()


if __name__ == "__main__":
    # (not the repository's directory nor this one: the workers import `test` from
    # the interpreter's library, and nothing of this repository shadows it)
    del sys.path[0]
    main(sys.argv[1:])
