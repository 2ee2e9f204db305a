"""``%load_ext daifu`` in IPython: cells are vaccinated, rules and the console
work on them.  Each test drives a real ``InteractiveShell`` in a child
process (its singleton and its compiler must not leak into other tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import IPython  # noqa: F401 - in the test extra: a missing IPython fails, never skips

DRIVER = '''
import json, sys, types
if {notebook!r}:
    sys.modules["ipykernel"] = types.ModuleType("ipykernel")  # what a Jupyter kernel has
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
results = []
for cell in json.loads(sys.argv[1]):
    r = ip.run_cell(cell)
    results.append([r.success, repr(r.result), repr(r.error_in_exec)])
print("RESULTS " + json.dumps(results))
'''


def run_cells(tmp_path, cells, stdin="", notebook=False, env=None):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(notebook=notebook))
    proc = subprocess.run([sys.executable, str(driver), json.dumps(cells)], cwd=tmp_path,
                          input=stdin, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DAIFU_LOG_LEVEL": "warning", **(env or {})})
    assert proc.returncode == 0, proc.stderr
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULTS ")][-1]
    return json.loads(line[len("RESULTS "):]), proc


DEFS = textwrap.dedent('''
    import daifu
    table = {}

    @daifu.on(KeyError, where="lookup")
    def fill(crash):
        crash.globals["table"][crash.vars["key"]] = 21
        return daifu.RETRY

    def lookup(key):
        value = table[key]
        return value * 2
''')


def test_a_function_defined_in_a_cell_is_fixed_by_a_rule(tmp_path):
    results, proc = run_cells(tmp_path, ["%load_ext daifu", DEFS, "[lookup(k) for k in 'ab']"])
    assert results[2] == [True, "[42, 42]", "None"]
    assert "cells are vaccinated" in proc.stderr


def test_a_loop_at_the_top_of_a_cell_goes_on_after_a_fix(tmp_path):
    cell = textwrap.dedent('''
        import daifu

        @daifu.on(ZeroDivisionError)
        def skip_it(crash):
            return daifu.CONTINUE

        seen = []
        for d in [1, 0, 2]:
            seen.append(10 // d)
        seen
    ''')
    results, _ = run_cells(tmp_path, ["%load_ext daifu", cell])
    assert results[1] == [True, "[10, 5]", "None"]
    plain, _ = run_cells(tmp_path, [cell])  # without the extension: the cell fails
    assert plain[0][0] is False and "ZeroDivisionError" in plain[0][2]


def test_without_a_fix_the_cell_fails_as_without_daifu(tmp_path):
    results, proc = run_cells(tmp_path, ["%load_ext daifu", "def f(d):\n    return 1 // d",
                                         "f(0)"])
    assert results[2][0] is False and "ZeroDivisionError" in results[2][2]


def test_the_console_opens_in_the_notebook(tmp_path):
    # a Jupyter kernel's input() asks the front end; here it reads the pipe
    cells = ["%load_ext daifu",
             "table = {}\ndef lookup(key):\n    value = table[key]\n    return value * 2",
             "lookup('b')"]
    results, proc = run_cells(tmp_path, cells, stdin="p key\nexec table['b'] = 4\nretry\n",
                              notebook=True)
    assert results[2] == [True, "8", "None"], proc.stdout + proc.stderr
    assert "KeyError" in proc.stdout and "'b'" in proc.stdout  # the report, in the cell
    # the cells named as IPython names them, not by their compiler's file name
    # (the driver's run_cell keeps no history: every cell is In[1])
    assert "at Cell In[1], line 3 in lookup()" in proc.stdout, proc.stdout
    assert "Cell In[1], line 3, in lookup" in proc.stdout and "<ipython-input-" not in proc.stdout


def test_unload_stops_vaccinating(tmp_path):
    cells = ["%load_ext daifu", "%unload_ext daifu", DEFS, "lookup('a')"]
    results, _ = run_cells(tmp_path, cells)
    assert results[3][0] is False and "KeyError" in results[3][2]
