"""Corpus for the differential suite (see test_differential.py).

Rules for this file: deterministic functions (no I/O, clocks, randomness, id()
or hash-order dependence); each decorated with ``@cases(args1, args2, ...)``
where every ``argsN`` is a tuple of positional arguments; results must be
comparable with ``==`` (numbers, strings, tuples, lists, dicts, sets, None).
Functions may raise -- the exception type, args and traceback lines are
compared -- and may return generators (they are consumed).
"""


def cases(*arglists):
    def mark(fn):
        fn.cases = arglists
        return fn

    return mark


@cases(([1, 2, 3],), ([],))
def sum_loop(xs):
    total = 0
    for x in xs:
        total += x
    return total


@cases((5,), (0,))
def while_else(n):
    out = []
    while n > 0:
        n -= 2
        out.append(n)
    else:
        out.append("else")
    return out


@cases(([1, 0, 2],), ([3],))
def handles_own_error(xs):
    out = []
    for x in xs:
        try:
            out.append(10 // x)
        except ZeroDivisionError:
            out.append("div0")
    return out


@cases(([1, 0, 2],))
def raises_out(xs):
    out = []
    for x in xs:
        out.append(10 // x)
    return out
