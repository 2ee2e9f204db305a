"""Exceptions the program handles itself, raised through vaccinated frames.

Not the normal path of a training loop, but of EAFP code (``try: d[k]``
``except KeyError``) in a library vaccinated with ``DAIFU_ENTRY='*'``: each
vaccinated frame the exception passes has a barrier that must conclude "the
program catches this" and re-raise.  Measured as the cost per raise, plain
vs vaccinated, side by side.
"""

from __future__ import annotations

import pytest
from conftest import ASSERT, interleaved, record, size
from support_eafp import ROWS, build, build_own, build_row


def test_exception_caught_by_its_own_function():
    """The commonest EAFP: the raising function's own ``except KeyError``
    (its stub tests the clause and re-raises to it, no call)."""
    n = size(20000, 200)
    plain, vaccinated = build_own(vaccinate=False), build_own(vaccinate=True)
    assert plain(n) == vaccinated(n) == n
    t_plain, t_vacc, _ = interleaved(lambda: plain(n), lambda: vaccinated(n), size(7, 1))
    ratio = t_vacc / t_plain
    record("Handled exceptions (EAFP through vaccinated frames)",
           "KeyError caught by the raising function itself", t_vacc / n * 1e6, "us/raise",
           "<= 3x plain", f"{ratio:.1f}x plain's {t_plain / n * 1e6:.2f} us/raise")
    if ASSERT:
        assert ratio <= 3.0


def _python_barrier():
    """Make the stubs call the Python barrier (what runs where daifu's C
    extension is not built: no quick check first); returns the function that
    puts back the ones they called (None: that one is the Python barrier
    already)."""
    from daifu.cells._cell import P_BARRIER, P_QUICK
    from daifu.engine import _barrier

    shipped = _barrier.passing[P_BARRIER], _barrier.passing[P_QUICK]
    if shipped[0] is _barrier.barrier:
        return None
    _barrier.passing[P_BARRIER] = _barrier.barrier
    _barrier.passing[P_QUICK] = _barrier.NO_QUICK_CHECK.__call__

    def restore():
        _barrier.passing[P_BARRIER], _barrier.passing[P_QUICK] = shipped
    return restore


def test_exception_caught_frames_up(benchmark):
    n = size(2000, 50)
    per_raise = {}
    section = "Handled exceptions (EAFP through vaccinated frames)"
    for depth in (0, 5, 20):
        plain, vaccinated = build(depth, vaccinate=False), build(depth, vaccinate=True)
        assert plain(n) == vaccinated(n) == n
        t_plain, t_vacc, _ = interleaved(lambda p=plain: p(n), lambda v=vaccinated: v(n),
                                         size(7, 1))
        restore = _python_barrier()
        if restore is not None:  # (the same, through the Python barrier)
            try:
                t_plain2, t_py, _ = interleaved(lambda p=plain: p(n), lambda v=vaccinated: v(n),
                                                size(7, 1))
            finally:
                restore()
            t_py *= t_plain / t_plain2  # (the ratio to plain, at the first run's plain)
        per_raise[depth] = (t_plain / n * 1e6, t_vacc / n * 1e6)
        record(section, f"KeyError caught {depth + 2} vaccinated frames up", t_vacc / n * 1e6,
               "us/raise", "<= 3x plain",
               f"{t_vacc / t_plain:.1f}x plain's {t_plain / n * 1e6:.2f} us/raise")
        if restore is not None:
            record(section, "  without daifu's C extension (the Python barrier)", t_py / n * 1e6,
                   "us/raise", "", f"{t_py / t_plain:.1f}x plain")
        if ASSERT:
            assert t_vacc / t_plain <= 3.0, (depth + 2, t_vacc / t_plain)
    # what each further frame adds (5 -> 20 frames deeper): the first barrier's
    # check of the remembered route through that caller, and its stub letting
    # the exception pass
    plain_frame = (per_raise[20][0] - per_raise[5][0]) / 15
    vacc_frame = (per_raise[20][1] - per_raise[5][1]) / 15
    ratio = vacc_frame / plain_frame
    record(section, "  each further vaccinated frame", vacc_frame, "us", "<= 3x plain per frame",
           f"{ratio:.1f}x plain's {plain_frame:.2f} us")
    record(section, "  once per raise (the first barrier, 2 frames up)",
           per_raise[0][1] - per_raise[0][0], "us", "",
           "the stub's barrier call and the check of the remembered route")
    if ASSERT:
        assert ratio <= 3.0
    benchmark.group = "handled-exceptions"
    deep = build(20, vaccinate=True)
    benchmark(lambda: deep(n))


#: the rows of issue 33's table that meet <= 3x plain (asserted by ``make
#: bench``); the others are measured and reported, their target not met yet
MET = {"tuple", "with", "module", "hasattr", "stopiteration"}
#: the rows that meet <= 4x plain without daifu's C extension (the Python
#: barrier, where the extension cannot be built)
MET_WITHOUT_C = {"with", "module", "hasattr", "stopiteration"}


@pytest.mark.parametrize("row", list(ROWS))
def test_handled_exception_kinds(row):
    """Each kind of handled exception in issue 33's table, plain vs
    vaccinated, with the C route check and with the Python barrier."""
    n = size(20000, 200)
    plain, vaccinated = build_row(row, vaccinate=False), build_row(row, vaccinate=True)
    assert plain(n) == vaccinated(n) == n
    t_plain, t_vacc, _ = interleaved(lambda: plain(n), lambda: vaccinated(n), size(7, 1))
    ratio = t_vacc / t_plain
    section = "Handled exceptions (EAFP through vaccinated frames)"
    record(section, ROWS[row][0], t_vacc / n * 1e6, "us/raise",
           "<= 3x plain" if row in MET else "<= 3x plain (not met)",
           f"{ratio:.1f}x plain's {t_plain / n * 1e6:.2f} us/raise")
    restore = _python_barrier()
    py_ratio = None
    if restore is not None:
        try:
            t_plain2, t_py, _ = interleaved(lambda: plain(n), lambda: vaccinated(n), size(7, 1))
        finally:
            restore()
        py_ratio = t_py / t_plain2
        record(section, "  without daifu's C extension (the Python barrier)", t_py / n * 1e6,
               "us/raise", "<= 4x plain" if row in MET_WITHOUT_C else "<= 4x plain (not met)",
               f"{py_ratio:.1f}x plain's {t_plain2 / n * 1e6:.2f} us/raise")
    if ASSERT and row in MET:
        assert ratio <= 3.0, (row, ratio)
    if ASSERT and row in MET_WITHOUT_C and py_ratio is not None:
        assert py_ratio <= 4.0, (row, "the Python barrier", py_ratio)
