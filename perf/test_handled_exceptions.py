"""Exceptions the program handles itself, raised through vaccinated frames.

Not the normal path of a training loop, but of EAFP code (``try: d[k]``
``except KeyError``) in a library vaccinated with ``DAIFU_ENTRY='*'``: each
vaccinated frame the exception passes has a barrier that must conclude "the
program catches this" and re-raise.  Measured as the cost per raise, plain
vs vaccinated, side by side.
"""

from __future__ import annotations

from conftest import interleaved, record, size
from support_eafp import build


def test_exception_caught_frames_up(benchmark):
    n = size(2000, 50)
    for depth in (0, 5, 20):
        plain, vaccinated = build(depth, vaccinate=False), build(depth, vaccinate=True)
        assert plain(n) == vaccinated(n) == n
        t_plain, t_vacc, _ = interleaved(lambda p=plain: p(n), lambda v=vaccinated: v(n),
                                         size(7, 1))
        record("Handled exceptions (EAFP through vaccinated frames)",
               f"KeyError caught {depth + 2} vaccinated frames up", t_vacc / n * 1e6, "us/raise",
               "", f"plain {t_plain / n * 1e6:.1f} us/raise")
    benchmark.group = "handled-exceptions"
    deep = build(20, vaccinate=True)
    benchmark(lambda: deep(n))
