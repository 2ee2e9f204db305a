"""Recovery in each kind of position: retry and skip, with outer state intact."""

from __future__ import annotations

import pytest

import daifu
from daifu.engine import ENGINE
from daifu.engine._events import capture

from .support import crashes, vaccinate


def retry_setting(**values):
    """A rule that assigns variables in the crashed frame, then retries."""

    @daifu.on(Exception)
    def rule(crash):
        rule.seen.append((crash.function, crash.statement, crash.attempt, crash.kind))
        for name, value in values.items():
            crash.vars[name] = value
        return daifu.RETRY

    rule.seen = []
    return rule


def skipping():
    @daifu.on(Exception)
    def rule(crash):
        rule.seen.append((crash.statement, crash.kind))
        return daifu.SKIP

    rule.seen = []
    return rule


SOURCE = '''
class Tracked:
    def __init__(self, log, name):
        self.log, self.name = log, name
    def __enter__(self):
        self.log.append(("enter", self.name))
        return self
    def __exit__(self, et, ev, tb):
        self.log.append(("exit", self.name, et.__name__ if et else None))
        return False


def top_level(xs):
    out = []
    for x in xs:
        y = 12 // x
        out.append(y)
    return out


def in_if_else(xs):
    out = []
    for x in xs:
        if x % 2:
            out.append(("odd", 9 // (x - 3)))
        else:
            out.append(("even", 8 // x))
    return out


def in_try(xs):
    log = []
    for x in xs:
        try:
            log.append(6 // x)
        except KeyError:
            log.append("key")
        finally:
            log.append("finally")
    return log


def in_with(xs):
    log = []
    for x in xs:
        with Tracked(log, x):
            log.append(("value", 6 // x))
    return log


def three_deep(a, b, c):
    seen = []
    for i in a:
        for j in b:
            for k in c:
                seen.append((i, j, k, 100 // (i + j + k - 4)))
    return seen


class Flaky:
    """An iterator whose __next__ fails once at item 3 and survives."""
    def __init__(self, n):
        self.n, self.i, self.failed = n, 0, False
    def __iter__(self):
        return self
    def __next__(self):
        if self.i == 3 and not self.failed:
            self.failed = True
            raise OSError("transient read error")
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i


def header(n):
    got = []
    for v in Flaky(n):
        got.append(v)
    else:
        got.append("else")
    return got


def pipeline():
    for i in range(5):
        if i == 2:
            raise ValueError("bad sample")
        yield i


def consume_dead_generator():
    got = []
    for v in pipeline():
        got.append(v)
    return got


def batches(data):
    for i in range(len(data)):
        yield 10 // data[i]


def consume_vaccinated_generator(data):
    return [b for b in batches(data)]


def while_condition(limit):
    n, out = 0, []
    while 10 // (limit - n) > 1:
        out.append(n)
        n += 1
    return out


def in_except_body(xs):
    out = []
    for x in xs:
        try:
            out.append(x["k"])
        except TypeError:
            out.append(10 // x)
    return out


def closure_counter(xs):
    total = 0
    def add(v):
        nonlocal total
        total += 100 // v
    for x in xs:
        add(x)
    return total
'''


@pytest.fixture(params=["vaccinated", "armed"])
def m(request):
    """The module vaccinated at import, and armed (``cells._armed``: each
    function rewritten at its first exception, its frame moved onto the new
    code): the same recoveries."""
    return vaccinate(SOURCE, armed=request.param == "armed")


def test_retry_top_level_of_loop_body(m):
    rule = retry_setting(x=3)
    assert m["top_level"]([1, 0, 2]) == [12, 4, 6]
    assert rule.seen == [("top_level", "y = 12 // x", 1, "statement")]


def test_skip_top_level_of_loop_body(m):
    rule = skipping()
    # the failing assignment is skipped: y keeps the value of the previous iteration
    assert m["top_level"]([1, 0, 2]) == [12, 12, 6]
    assert rule.seen == [("y = 12 // x", "statement")]


def test_retry_and_skip_inside_if_else(m):
    retry_setting(x=1)
    # x=3 is odd and fails in the odd branch; x=1 re-enters that statement only
    assert m["in_if_else"]([2, 3, 4]) == [("even", 4), ("odd", 9 // -2), ("even", 2)]
    ENGINE.reset()
    skipping()
    assert m["in_if_else"]([2, 3, 0]) == [("even", 4)]


def test_retry_inside_try_runs_finally_once(m):
    retry_setting(x=2)
    assert m["in_try"]([1, 0, 3]) == [6, "finally", 3, "finally", 2, "finally"]


def test_retry_inside_with_keeps_context_entered(m):
    retry_setting(x=2)
    log = m["in_with"]([1, 0])
    assert log == [
        ("enter", 1), ("value", 6), ("exit", 1, None),
        ("enter", 0), ("value", 3), ("exit", 0, None),  # __exit__ never saw the error
    ]


def test_skip_inside_with(m):
    skipping()
    log = m["in_with"]([0, 3])
    assert log == [("enter", 0), ("exit", 0, None), ("enter", 3), ("value", 2), ("exit", 3, None)]


def test_nested_three_deep_outer_iterators_intact(m):
    fixes = []

    @daifu.on(ZeroDivisionError)
    def bump(crash):
        fixes.append(dict(i=crash.vars["i"], j=crash.vars["j"], k=crash.vars["k"]))
        crash.vars["k"] = crash.vars["k"] + 10
        return daifu.RETRY

    seen = m["three_deep"]([1, 2], [1, 2], [1, 2])
    # every combination visited exactly once, in order
    expected = [(i, j) for i in (1, 2) for j in (1, 2) for _ in (1, 2)]
    assert [(i, j) for i, j, _, _ in seen] == expected
    assert len(seen) == 8
    assert fixes == [{"i": 1, "j": 1, "k": 2}, {"i": 1, "j": 2, "k": 1}, {"i": 2, "j": 1, "k": 1}]


def test_skip_three_deep(m):
    skipping()
    seen = m["three_deep"]([1, 2], [1, 2], [1, 2])
    assert len(seen) == 5  # the three failing combinations skipped, nothing else lost


def test_retry_loop_header_calls_next_on_same_iterator():
    # an iterator daifu did not vaccinate (a library's): the header is the
    # only place to retry; calling next() again is allowed, and what it may
    # do is said
    rule = retry_setting()
    ns = vaccinate(SOURCE, entries=("header",))
    with capture() as events:
        assert ns["header"](5) == [1, 2, 3, 4, 5, "else"]
    assert rule.seen == [("header", "for v in Flaky(n):", 1, "loop-header")]
    resumed = [e for e in events if e["event"] == "crash.resumed"]
    assert "calling next() again skips the item" in resumed[0]["note"]


ITERATOR = """
class Table:
    def __init__(self, rows):
        self.rows, self.i = rows, 0
    def __iter__(self):
        return self
    def __next__(self):
        self.i += 1
        if self.i > 4:
            raise StopIteration
        return self.rows[self.i]

def read(rows):
    return [row for row in Table(rows)] + [sum(x for x in Table(rows))]
"""


def test_a_vaccinated_iterator_takes_its_crash_itself():
    # a class's __next__ run by a for loop goes through C that catches only
    # StopIteration: its crash is taken in __next__, where the failing
    # statement can be retried -- at the loop's header next() would run
    # __next__ again on an iterator that has moved on (item 2 lost)
    seen = []

    @daifu.on(KeyError)
    def add_the_row(crash):
        seen.append((crash.function, crash.statement))
        crash.vars["self"].rows[2] = 20
        return daifu.RETRY

    ns = vaccinate(ITERATOR)
    assert ns["read"]({1: 10, 3: 30, 4: 40}) == [10, 20, 30, 40, 100]
    assert seen == [("Table.__next__", "return self.rows[self.i]")]


def test_retry_at_a_header_after_a_vaccinated_iterator_raised_is_refused(m):
    # Flaky.__next__ fails at a raise (no retry, no skip there): at the
    # header, next() would start __next__ again on an iterator that may have
    # moved on -- refused, with the reason, rather than drop an item silently
    seen = []

    @daifu.on(OSError)
    def retry(crash):
        seen.append((crash.function, crash.can_retry, crash.retry_reason))
        return daifu.RETRY

    with crashes(OSError, match="transient"):
        m["header"](5)
    assert [(f, ok) for f, ok, _ in seen] == [("header", False)]
    assert "may have moved past the item it was producing" in seen[0][2]


def test_skip_loop_header_ends_loop(m):
    skipping()
    assert m["header"](5) == [1, 2, 3, "else"]


def test_retry_on_dead_generator_is_refused(m):
    seen = []

    @daifu.on(ValueError)
    def try_retry(crash):
        seen.append((crash.kind, crash.can_retry))
        return daifu.RETRY

    # the generator is not vaccinated here: the crash reaches the consumer's header
    ns = vaccinate(SOURCE, entries=("consume_dead_generator",))
    with crashes(ValueError, match="bad sample"):
        ns["consume_dead_generator"]()
    assert seen == [("loop-header", False)]


def test_crash_inside_vaccinated_generator_is_recovered_inside_it(m):
    @daifu.on(ZeroDivisionError)
    def fix(crash):
        assert crash.function == "batches"
        crash.vars["data"][crash.vars["i"]] = 5
        return daifu.RETRY

    assert m["consume_vaccinated_generator"]([1, 0, 2]) == [10, 2, 5]


def test_retry_while_condition(m):
    retry_setting(limit=100)
    assert m["while_condition"](3) == [0, 1, 2]  # retried condition is false: loop ends


def test_retry_statement_in_except_body(m):
    retry_setting(x=5)
    assert m["in_except_body"]([{"k": 1}, 0]) == [1, 2]


def test_vars_write_reaches_closure_cell(m):
    @daifu.on(ZeroDivisionError)
    def fix(crash):
        assert crash.function == "closure_counter.<locals>.add"
        crash.vars["v"] = 50
        return daifu.RETRY

    assert m["closure_counter"]([10, 0, 20]) == 10 + 2 + 5


def test_exec_patch_in_frame(m):
    @daifu.on(ZeroDivisionError)
    def fix(crash):
        crash.exec("x = 4\nextra_global = 'made by exec'")
        return daifu.RETRY

    assert m["top_level"]([0]) == [3]
    assert m["extra_global"] == "made by exec"


def test_attempt_cap_gives_up_with_original_exception(m):
    attempts = []

    @daifu.on(ZeroDivisionError)
    def always(crash):
        attempts.append(crash.attempt)
        return daifu.RETRY

    ENGINE.max_attempts = 3
    try:
        with crashes(ZeroDivisionError):
            m["top_level"]([0])
    finally:
        ENGINE.max_attempts = 5
    assert attempts == [1, 2, 3]
    assert ENGINE.stats["gave_up"] == 1


@pytest.mark.parametrize("lazy", [False, True])
def test_attempt_cap_holds_when_the_failing_statement_is_a_return(lazy):
    # the function's only cell is its last: its retry copy lies right after
    # it, and the two must stay apart in the exception table, or a failed
    # retry looks like a first attempt and a RETRY rule loops for ever
    ns = vaccinate("""
        def scale(x):
            return 1 / x

        def train(xs):
            out = []
            for x in xs:
                out.append(scale(x))
            return out
        """, entries=("*",), lazy=lazy)
    attempts = []

    @daifu.on(ZeroDivisionError)
    def always(crash):
        attempts.append((crash.function, crash.attempt))
        if len(attempts) > 20:
            return daifu.ABORT  # the cap did not hold: stop the loop, fail below
        return daifu.RETRY

    ENGINE.max_attempts = 3
    try:
        with crashes(ZeroDivisionError):
            ns["train"]([1, 0])
    finally:
        ENGINE.max_attempts = 5
    taken_in = attempts[0][0]
    assert [a for f, a in attempts if f == taken_in] == [1, 2, 3]
    assert len(attempts) < 20


def test_attempts_reset_after_a_successful_retry(m):
    attempts = []

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        attempts.append(crash.attempt)
        crash.vars["x"] = 1
        return daifu.RETRY

    m["top_level"]([0, 2, 0, 0])
    assert attempts == [1, 1, 1]
    assert ENGINE.stats["recovered"] == 3


def test_module_level_loop_recovered():
    @daifu.on(ZeroDivisionError)
    def fix(crash):
        crash.vars["d"] = 1
        return daifu.RETRY

    ns = vaccinate(
        """
        results = []
        for d in [2, 0, 5]:
            results.append(10 // d)
        """,
        module_level=True,
    )
    assert ns["results"] == [5, 10, 2]


CONTINUE_SOURCE = '''
def train(batches):
    seen = []
    for batch in batches:
        if batch < 0:
            raise ValueError(f"corrupt batch {batch}")
        loss = 10 // batch
        seen.append(loss)
    return seen


def guarded(batches, log):
    for batch in batches:
        with open_ctx(log):
            log.append(10 // batch)
    return log


class open_ctx:
    def __init__(self, log):
        self.log = log
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.log.append("exit")
'''


def test_continue_skips_rest_of_iteration_including_raise_guard():
    m = vaccinate(CONTINUE_SOURCE)
    seen = []

    @daifu.on((ValueError, ZeroDivisionError))
    def next_batch(crash):
        seen.append((crash.statement, crash.can_continue))
        return daifu.CONTINUE

    assert m["train"]([5, -1, 0, 2]) == [2, 5]
    assert seen == [('raise ValueError(f"corrupt batch {batch}")', True),
                    ("loss = 10 // batch", True)]


def test_continue_refused_across_with_block():
    m = vaccinate(CONTINUE_SOURCE)
    reasons = []

    @daifu.on(ZeroDivisionError)
    def next_batch(crash):
        reasons.append(crash.continue_reason)
        return daifu.CONTINUE

    with crashes(ZeroDivisionError):
        m["guarded"]([0], [])
    assert reasons and "with" in reasons[0]


LEAVING = '''
def returns(box, token):
    for _ in range(1):
        pass
    return 100 // box[0]

def caught_on_retry(box, token):
    try:
        for _ in range(1):
            y = box[0]
    except KeyError:
        return "caught"
    return y
'''


def test_a_retry_that_returns_or_raises_again_is_over_and_frees_the_frame(engine):
    import gc
    import weakref

    class Token:
        pass

    m = vaccinate(LEAVING)
    retry_setting(box=[4])
    token = Token()
    ref = weakref.ref(token)
    assert m["returns"]([0], token) == 25  # the retried statement is the return itself
    del token
    gc.collect()
    assert engine.stats["recovered"] == 1 and ref() is None  # nothing kept the frame
    engine.reset()
    retry_setting(box={})  # the retry raises KeyError, which the function catches
    token = Token()
    ref = weakref.ref(token)
    assert m["caught_on_retry"]([], token) == "caught"
    del token
    gc.collect()
    assert ref() is None and not engine._pending


YIELDS = """
ready = False

def need(x):
    if not ready:
        raise ValueError("not ready")
    return x

def running_total():
    total = 0
    while True:
        total = total + (yield total) + need(1)
"""


def test_retry_of_a_statement_that_already_yielded_never_yields_again():
    # re-executing the whole statement would yield again: the value sent in
    # lost, one item too many.  Either the retry starts after the yield (3.13:
    # the part after it is a cell of its own, the sent value on its stack)
    # or it is refused, with the reason (3.11)
    seen = []

    @daifu.on(ValueError, where="running_total")
    def retry(crash):
        seen.append((crash.can_retry, crash.retry_reason))
        crash.globals["ready"] = True
        return daifu.RETRY

    ns = vaccinate(YIELDS)
    gen = ns["running_total"]()
    next(gen)
    try:
        resumed = gen.send(10)
    except BaseException as exc:  # (a catch-all here: daifu still takes the crash)
        resumed = exc
    assert len(seen) == 1
    if seen[0][0]:
        assert (resumed, gen.send(20)) == (11, 32)
    else:
        assert isinstance(resumed, ValueError) and "already yielded" in seen[0][1]
    # before the yield, the statement is retried as any other
    ns["ready"] = True
    gen = ns["running_total"]()
    assert (next(gen), gen.send(10), gen.send(20)) == (0, 11, 32)
