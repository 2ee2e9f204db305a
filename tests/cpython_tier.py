"""Run one CPython ``Lib/test`` module under unittest, leaving out the tests
listed in ``EXCLUDED`` (each with the reason it cannot hold for vaccinated
code), as ``python -m unittest test.X`` would otherwise.

    python -m daifu --modules test.X --entry '**' tests/cpython_tier.py test.X
"""

from __future__ import annotations

import importlib
import sys
import unittest

#: module -> {test id suffix: why it inspects something daifu changes by design}
EXCLUDED: dict[str, dict[str, str]] = {
    "test_patma": {
        # introspects the bytecode of a function defined in the test: every
        # jump must carry a line number.  daifu appends stubs whose jumps carry
        # none, on purpose: an instruction with a line makes a tracer see a
        # line event (3.12+ has this test; the behaviour it guards is the
        # compiler's, not affected)
        "TestSourceLocations.test_jump_threading": "bytecode introspection",
    },
}


def _tests(suite):
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            yield from _tests(test)
        else:
            yield test


def main(name: str) -> int:
    module = importlib.import_module(name)
    skip = EXCLUDED.get(name.rpartition(".")[2], {})
    loaded = unittest.defaultTestLoader.loadTestsFromModule(module)
    kept = [t for t in _tests(loaded) if not any(t.id().endswith(s) for s in skip)]
    left_out = sum(1 for _ in _tests(loaded)) - len(kept)
    result = unittest.TextTestRunner(verbosity=1).run(unittest.TestSuite(kept))
    print(f"(left out {left_out} test(s) that inspect daifu's own bytecode)", file=sys.stderr)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
