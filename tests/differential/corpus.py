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


def seen_by_daifu(*case_indices, why):
    """A documented limitation (docs/limitations.md): daifu sees an exception
    that the program handles.  The harness asserts that results are still
    identical *and* that daifu did see it, so fixing the limitation shows up."""

    def mark(fn):
        fn.seen_by_daifu = (case_indices, why)
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


import contextlib
import functools
import itertools
import operator
from collections import OrderedDict, defaultdict, deque, namedtuple

# ---------------------------------------------------------------------------
# helpers: exceptions, context managers, iterators, small classes
# ---------------------------------------------------------------------------


class CorpusError(Exception):
    pass


class ValidationError(CorpusError):
    def __init__(self, field, reason):
        super().__init__(field, reason)
        self.field = field
        self.reason = reason


class RetryableError(CorpusError):
    pass


class FatalError(Exception):
    pass


class Recorder:
    """Context manager that records enter/exit order into a shared list."""

    def __init__(self, log, name, suppress=False):
        self.log = log
        self.name = name
        self.suppress = suppress

    def __enter__(self):
        self.log.append("enter " + self.name)
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.log.append("exit " + self.name)
        else:
            self.log.append("exit %s %s" % (self.name, exc_type.__name__))
        return self.suppress


class Suppressor:
    """Suppresses the given exception types."""

    def __init__(self, *types_):
        self.types = types_
        self.caught = []

    def __enter__(self):
        return self.caught

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, self.types):
            self.caught.append(exc_type.__name__)
            return True
        return False


class FailingEnter:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("failing enter")
        raise CorpusError("enter failed")

    def __exit__(self, *exc):
        self.log.append("never")
        return False


class FailingExit:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, exc_type, exc, tb):
        self.log.append("exit")
        raise FatalError("exit failed")


class Counter:
    def __init__(self, start=0):
        self.value = start
        self.items = [0, 0, 0]
        self.data = {"a": 0}

    def bump(self, by=1):
        self.value += by
        return self.value


class Countdown:
    """Iterator class: counts down, raising StopIteration at zero."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if self.n <= 0:
            raise StopIteration
        self.n -= 1
        return self.n


class ExplodingIterator:
    """Yields values and raises ValueError at a given position."""

    def __init__(self, values, fail_at):
        self.values = list(values)
        self.fail_at = fail_at
        self.pos = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.pos == self.fail_at:
            self.pos += 1
            raise ValueError("exploded at %d" % (self.pos - 1))
        if self.pos >= len(self.values):
            raise StopIteration
        value = self.values[self.pos]
        self.pos += 1
        return value


class Point:
    __match_args__ = ("x", "y")

    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    def __repr__(self):
        return "Point(%r, %r)" % (self.x, self.y)


class Circle:
    __match_args__ = ("center", "radius")

    def __init__(self, center, radius):
        self.center = center
        self.radius = radius


Pair = namedtuple("Pair", "left right")

COUNTER = 0
EVENTS = []
REGISTRY = {}


# ---------------------------------------------------------------------------
# plain loops
# ---------------------------------------------------------------------------


@cases(([3, 1, 2],), ([],), ([5, -5, 7],))
def for_else_search_not_found(xs):
    for i, x in enumerate(xs):
        if x < 0:
            result = ("found", i)
            break
    else:
        result = ("not found", len(xs))
    return result


@cases((10,), (0,), (-3,))
def while_else_with_break(n):
    steps = []
    while n > 0:
        if n == 4:
            steps.append("break")
            break
        steps.append(n)
        n -= 3
    else:
        steps.append("exhausted")
    return steps


@cases((4,), (1,))
def nested_loops_three_deep(n):
    out = []
    for i in range(n):
        for j in range(i):
            k = 0
            while k < j:
                if (i + j + k) % 3 == 0:
                    k += 1
                    continue
                out.append((i, j, k))
                k += 1
    return out


@cases(([[1, 2], [3, -1, 4], [5]],), ([[1], [2]],))
def nested_break_with_flag(rows):
    found = None
    for r, row in enumerate(rows):
        for c, value in enumerate(row):
            if value < 0:
                found = (r, c)
                break
        if found is not None:
            break
    return found


@cases(([1, 2, 3, 4, 5, 6],), ([],))
def continue_skips_odd(xs):
    acc = []
    for x in xs:
        if x % 2:
            continue
        acc.append(x * x)
    return acc


@cases(([4, 8, 15, 16, 23, 42], 15), ([1, 2], 9))
def early_return_search(xs, target):
    for i, x in enumerate(xs):
        if x == target:
            return i
    return -1


@cases((20,), (1,))
def while_with_complex_condition(limit):
    a, b = 0, 1
    seq = []
    while b < limit and len(seq) < 10:
        seq.append(b)
        a, b = b, a + b
    return seq


@cases(([[1, 2], [3, 4]],), ([[1, 2], [3]],))
def matrix_transpose_loops(m):
    rows = len(m)
    cols = len(m[0])
    out = [[None] * rows for _ in range(cols)]
    for i in range(rows):
        for j in range(cols):
            out[j][i] = m[i][j]
    return out


@cases(({"a": 1, "b": 2, "c": 3},), ({},), ({"x": "s"},))
def dict_items_loop_build(d):
    inverted = {}
    total = 0
    for key, value in sorted(d.items()):
        inverted[value] = key
        total += value
    return inverted, total


@cases(([5, 3, 8, 1],), ([],))
def manual_bubble_sort(xs):
    xs = list(xs)
    n = len(xs)
    swapped = True
    while swapped:
        swapped = False
        for i in range(1, n):
            if xs[i - 1] > xs[i]:
                xs[i - 1], xs[i] = xs[i], xs[i - 1]
                swapped = True
        n -= 1
    return xs


@cases((7,), (0,), (-1,))
def raise_inside_nested_while(n):
    i = 0
    out = []
    while i < 3:
        j = 0
        while j < 3:
            out.append(n // (i - j + n - 7) if n >= 0 else [][n])
            j += 1
        i += 1
    return out


# ---------------------------------------------------------------------------
# try / except / else / finally
# ---------------------------------------------------------------------------


@cases(("12",), ("x",), (None,))
def try_except_else_finally_order(s):
    log = []
    try:
        log.append("try")
        value = int(s)
    except ValueError as e:
        log.append("except " + type(e).__name__)
        value = -1
    else:
        log.append("else")
    finally:
        log.append("finally")
    return log, value


@cases(([1, 0, "a", None, 4],), ([2],))
def multiple_except_clauses_in_loop(xs):
    out = []
    for x in xs:
        try:
            out.append(12 // x)
        except ZeroDivisionError:
            out.append("zero")
        except TypeError as e:
            out.append("type:" + str(e.args[0])[:20])
    return out


@cases(([{"k": 1}, [], {}, None],), ([{"k": 3}],))
def tuple_except_clause(items):
    out = []
    for item in items:
        try:
            out.append(item["k"])
        except (KeyError, TypeError) as e:
            out.append(type(e).__name__)
    return out


@cases((3,), (0,), (5,))
def bare_except_swallows(n):
    results = []
    for i in range(n):
        try:
            if i == 1:
                raise CorpusError("one")
            if i == 3:
                [][0]
            results.append(i)
        except:  # noqa: E722
            results.append("caught")
    return results


@cases((0,), (1,), (2,))
def reraise_bare(mode):
    log = []
    try:
        try:
            if mode == 0:
                return "no error"
            raise KeyError(mode)
        except KeyError:
            log.append("inner")
            raise
    except KeyError as e:
        log.append(("outer", e.args))
        if mode == 2:
            raise
    return log


@cases(("5",), ("five",))
def raise_from_translation(text):
    try:
        return int(text)
    except ValueError as e:
        raise ValidationError("text", "not a number") from e


@cases((["1", "2", "x", "4"],), (["1"],))
def exception_translation_in_loop(values):
    total = 0
    for pos, v in enumerate(values):
        try:
            total += int(v)
        except ValueError:
            raise CorpusError("bad value at", pos) from None
    return total


@cases((1,), (2,), (3,))
def conditional_reraise(code):
    try:
        if code == 1:
            raise RetryableError("retry me")
        raise FatalError("fatal", code)
    except CorpusError as e:
        return "handled " + e.args[0]
    except FatalError as e:
        if e.args[1] == 3:
            raise
        return "fatal swallowed"


@cases((0,), (1,))
def exception_raised_in_except(n):
    try:
        1 / n
    except ZeroDivisionError:
        raise ValueError("from handler")
    return "fine"


@cases((True,), (False,))
def exception_raised_in_finally(fail):
    log = []
    try:
        log.append("body")
        if fail:
            raise KeyError("body")
    finally:
        log.append("finally")
        if fail:
            raise IndexError("finally replaces")
    return log


@cases((True,), (False,))
def finally_return_swallows(fail):
    log = []

    def inner():
        try:
            log.append("try")
            if fail:
                raise RuntimeError("lost")
            return "try value"
        finally:
            log.append("finally")
            return "finally value"  # noqa: B012

    return inner(), log


@cases(([1, 2, 0, 4],), ([],))
def finally_continue_swallows_in_loop(xs):
    out = []
    for x in xs:
        try:
            out.append(10 // x)
        finally:
            out.append("f")
            continue  # noqa: B012
    return out


@cases(([3, 0, 5],), ([1],))
def finally_break_swallows_in_loop(xs):
    out = []
    for x in xs:
        try:
            out.append(6 // x)
        finally:
            if x == 0:
                break  # noqa: B012
    else:
        out.append("no break")
    return out


@cases((0,), (1,), (2,), (3,))
def nested_try_four_levels(mode):
    log = []
    try:
        try:
            try:
                if mode == 0:
                    raise KeyError("k")
                if mode == 1:
                    raise ValueError("v")
                if mode == 2:
                    raise TypeError("t")
            except KeyError:
                log.append("L3")
            finally:
                log.append("F3")
        except ValueError:
            log.append("L2")
    except TypeError:
        log.append("L1")
    else:
        log.append("else")
    return log


@cases((3,), (6,))
def return_inside_try_in_loop(n):
    log = []
    for i in range(n):
        try:
            if i == 4:
                return log, "returned"
            log.append(i)
        finally:
            log.append("f%d" % i)
    return log, "done"


@cases(([1, 2, 3],), ([1, "x", 3],))
def break_inside_try_else(xs):
    out = []
    for x in xs:
        try:
            y = x * 2 + 0
        except TypeError:
            out.append("te")
        else:
            if y > 4:
                break
            out.append(y)
        finally:
            out.append("fin")
    return out


@cases(([0, 1, 2],), ([5, 0],))
def while_try_continue(xs):
    i = 0
    out = []
    while i < len(xs):
        x = xs[i]
        i += 1
        try:
            if x == 0:
                continue
            out.append(100 // x)
        except ZeroDivisionError:
            out.append("unreachable")
        finally:
            out.append("f")
    return out


@cases((5,), (2,))
def exception_var_used_after(n):
    saved = None
    for i in range(n):
        try:
            if i == 3:
                raise CorpusError("at", i)
        except CorpusError as e:
            saved = e.args
    return saved


@cases((1,), (0,))
def exception_var_is_deleted(n):
    try:
        1 // n
    except ZeroDivisionError as err:
        msg = str(err)
    else:
        msg = "ok"
    try:
        return msg, err  # noqa: F821
    except NameError as e2:
        return msg, "deleted:" + type(e2).__name__


@cases(([1, 2, 3],), ([1, 0, 3],))
def try_in_finally_in_loop(xs):
    out = []
    for x in xs:
        try:
            out.append(x)
        finally:
            try:
                out.append(6 // x)
            except ZeroDivisionError:
                out.append("inner caught")
    return out


@cases((0,), (1,), (2,))
def exception_context_chain(mode):
    try:
        try:
            raise KeyError("first")
        except KeyError:
            if mode == 0:
                raise ValueError("second")
            if mode == 1:
                raise ValueError("second") from None
            return "swallowed"
    except ValueError as e:
        return (type(e.__context__).__name__, e.__suppress_context__,
                e.__cause__ is None)


@cases(([1, 2, "3", 4],), ([],))
def error_list_accumulator(values):
    errors = []
    good = []
    for idx, value in enumerate(values):
        try:
            if not isinstance(value, int):
                raise ValidationError(idx, "not int")
            good.append(value)
        except ValidationError as e:
            errors.append((e.field, e.reason))
    if errors:
        raise CorpusError(errors)
    return good


@cases((2,), (10,))
def retry_loop_with_counter(fail_times):
    attempts = 0
    while True:
        attempts += 1
        try:
            if attempts <= fail_times:
                raise RetryableError(attempts)
            return "ok after", attempts
        except RetryableError:
            if attempts >= 5:
                raise
            continue


@cases((True,), (False,))
def except_star_free_group_handling(fail):
    try:
        if fail:
            raise ExceptionGroup("grp", [ValueError(1), KeyError(2)])
        return "none"
    except ExceptionGroup as eg:
        return sorted(type(e).__name__ for e in eg.exceptions)


@cases((["a", "bb", "ccc"],), (["a", 1],))
def except_star_clauses(items):
    log = []
    try:
        errors = []
        for item in items:
            if not isinstance(item, str):
                errors.append(TypeError(item))
            elif len(item) > 2:
                errors.append(ValueError(item))
        if errors:
            raise ExceptionGroup("bad", errors)
    except* ValueError as eg:
        log.append(("value", [e.args for e in eg.exceptions]))
    except* TypeError as eg:
        log.append(("type", [e.args for e in eg.exceptions]))
    return log


@cases((1,), (2,))
def except_star_reraise_unhandled(n):
    try:
        raise ExceptionGroup("g", [KeyError(n)] * n)
    except* ValueError:
        n = -1
    return n


# ---------------------------------------------------------------------------
# with statements
# ---------------------------------------------------------------------------


@cases((False,), (True,))
def with_recorder_order(fail):
    log = []
    with Recorder(log, "a"):
        log.append("body")
        if fail:
            raise KeyError("in with")
    return log


@cases((0,), (1,), (2,))
def nested_with_suppress_inner(mode):
    log = []
    with Recorder(log, "outer"):
        with Recorder(log, "inner", suppress=True):
            log.append("body")
            if mode == 1:
                raise ValueError("suppressed")
        log.append("after inner")
        if mode == 2:
            raise TypeError("escapes")
    return log


@cases((False,), (True,))
def multiple_items_one_with(fail):
    log = []
    with Recorder(log, "a") as a, Recorder(log, "b") as b, Recorder(log, "c"):
        log.append(a.name + b.name)
        if fail:
            raise CorpusError("multi")
    return log


@cases(([1, 2, 3, 4],), ([],))
def with_in_loop_break_continue(xs):
    log = []
    for x in xs:
        with Recorder(log, str(x)):
            if x == 2:
                continue
            if x == 3:
                break
            log.append(x * 10)
    return log


@cases((5,), (1,))
def with_in_loop_return(n):
    log = []
    i = 0
    while i < n:
        with Recorder(log, "w%d" % i):
            if i == 2:
                return log
        i += 1
    return log + ["end"]


@cases(([1, 0, 2, "x", 3],), ([1],))
def suppressor_in_loop(xs):
    out = []
    for x in xs:
        with Suppressor(ZeroDivisionError, TypeError) as caught:
            out.append(6 // x)
        out.extend(caught)
    return out


@cases(([4, 0, 2],),)
def suppressor_does_not_catch_other(xs):
    out = []
    for x in xs:
        with Suppressor(TypeError):
            out.append(8 // x)
    return out


@cases((),)
def with_failing_enter():
    log = []
    try:
        with FailingEnter(log):
            log.append("body")
    except CorpusError as e:
        log.append(e.args[0])
    return log


@cases((False,), (True,))
def with_failing_exit(body_fails):
    log = []
    try:
        with FailingExit(log):
            if body_fails:
                raise KeyError("body")
            log.append("body done")
    except FatalError as e:
        log.append((e.args, type(e.__context__).__name__))
    return log


@cases((False,),)
def with_failing_exit_escapes(body_fails):
    log = []
    with FailingExit(log):
        log.append(body_fails)
    return log


@contextlib.contextmanager
def tag(log, name):
    log.append("<" + name + ">")
    try:
        yield name.upper()
    finally:
        log.append("</" + name + ">")


@contextlib.contextmanager
def swallow(log, *types_):
    try:
        yield
    except types_ as e:
        log.append("swallowed " + type(e).__name__)


@cases((False,), (True,))
def contextmanager_generator_basic(fail):
    log = []
    with tag(log, "div") as t:
        log.append(t)
        with tag(log, "span"):
            if fail:
                raise ValueError("inside span")
            log.append("text")
    return log


@cases(([1, 0, 3],), ([0, "a"],))
def contextmanager_swallow_in_loop(xs):
    log = []
    for x in xs:
        with swallow(log, ZeroDivisionError):
            log.append(9 // x)
    return log


@cases((["1", "x", "3"],),)
def contextlib_suppress_loop(items):
    out = []
    for item in items:
        with contextlib.suppress(ValueError):
            out.append(int(item))
            continue
        out.append("bad")
    return out


@cases((3,), (0,))
def exitstack_callbacks(n):
    log = []
    with contextlib.ExitStack() as stack:
        for i in range(n):
            stack.callback(log.append, "cb%d" % i)
            stack.enter_context(Recorder(log, "r%d" % i))
        log.append("body")
    return log


@cases((2,), (4,))
def exitstack_with_error(fail_at):
    log = []
    try:
        with contextlib.ExitStack() as stack:
            for i in range(4):
                stack.enter_context(Recorder(log, str(i)))
                if i == fail_at:
                    raise CorpusError(i)
    except CorpusError as e:
        log.append(e.args)
    return log


@cases((1,), (3,))
def exitstack_pop_all(n):
    log = []
    with contextlib.ExitStack() as stack:
        for i in range(n):
            stack.enter_context(Recorder(log, str(i)))
        kept = stack.pop_all()
    log.append("after with")
    kept.close()
    return log


@cases(([1, 2, 3],), ([1, 2, 0],))
def with_inside_try_inside_loop(xs):
    log = []
    for x in xs:
        try:
            with Recorder(log, "x"):
                log.append(6 // x)
        except ZeroDivisionError:
            log.append("handled")
        finally:
            log.append("|")
    return log


@cases((True,), (False,))
def with_in_finally(fail):
    log = []
    try:
        if fail:
            raise KeyError("k")
    except KeyError:
        log.append("caught")
    finally:
        with Recorder(log, "fin"):
            log.append("cleanup")
    return log


@cases(([1, 2, 3],), ([3, 2, 1],))
def with_suppress_break_interaction(xs):
    log = []
    for x in xs:
        with Recorder(log, "s", suppress=True):
            if x == 2:
                raise ValueError(x)
            if x == 3:
                break
            log.append(x)
    return log


@cases((4,),)
def nested_with_in_nested_loops(n):
    log = []
    for i in range(n):
        with Recorder(log, "i%d" % i):
            for j in range(i):
                with Recorder(log, "j%d" % j, suppress=(j == 1)):
                    if j == 1:
                        raise KeyError(j)
                    if i == 3:
                        break
    return log


@cases((0,), (1,))
def with_as_tuple_target(mode):
    log = []
    with Recorder(log, "a") as (rec):
        name = rec.name
    holder = {}
    with Recorder(log, "b") as holder["rec"]:
        pass
    if mode:
        with Recorder(log, "c") as (x, y):  # unpacking a Recorder fails
            pass
    return log, name, holder["rec"].name


# ---------------------------------------------------------------------------
# match statements
# ---------------------------------------------------------------------------


@cases(([0, 1, 2, "x", None, 3.5],),)
def match_literals_in_loop(values):
    out = []
    for v in values:
        match v:
            case 0:
                out.append("zero")
            case 1 | 2:
                out.append("small")
            case "x":
                out.append("ex")
            case None:
                out.append("none")
            case _:
                out.append("other")
    return out


@cases(([[1], [1, 2], [1, 2, 3, 4], [], (5, 6), "ab"],),)
def match_sequence_patterns(items):
    out = []
    for item in items:
        match item:
            case []:
                out.append("empty")
            case [x]:
                out.append(("one", x))
            case [x, y]:
                out.append(("two", x + y))
            case [first, *rest] if len(rest) > 2:
                out.append(("many", first, rest))
            case _:
                out.append("?")
    return out


@cases(([{"op": "add", "a": 1, "b": 2}, {"op": "neg", "a": 5}, {"op": "div", "a": 1, "b": 0}],),
       ([{"op": "noop"}, {"x": 1}],))
def match_mapping_interpreter(instrs):
    out = []
    for ins in instrs:
        match ins:
            case {"op": "add", "a": a, "b": b}:
                out.append(a + b)
            case {"op": "neg", "a": a}:
                out.append(-a)
            case {"op": "div", "a": a, "b": b}:
                out.append(a / b)
            case {"op": op, **rest}:
                out.append((op, rest))
            case _:
                raise ValueError("bad instr", ins)
    return out


@cases(([(0, 0), (1, 0), (2, 2), (0, 0, 3), (1, 1, 1), 7],),)
def match_class_patterns_with_guards(specs):
    shapes = []
    for spec in specs:
        if isinstance(spec, tuple) and len(spec) == 3:
            shapes.append(Circle(Point(spec[0], spec[1]), spec[2]))
        elif isinstance(spec, tuple):
            shapes.append(Point(*spec))
        else:
            shapes.append(spec)
    out = []
    for s in shapes:
        match s:
            case Point(0, 0):
                out.append("origin")
            case Point(x, 0):
                out.append(("x-axis", x))
            case Point(x, y) if x == y:
                out.append(("diag", x))
            case Circle(Point(x=cx, y=cy), radius=r) if r > 1:
                out.append(("circle", cx, cy, r))
            case int(n):
                out.append(("int", n))
    return out


@cases(([("move", 1, 2), ("stop",), ("say", "hi"), ("move", 1)],), ([("jump",)],))
def match_command_tuples_while(cmds):
    pos = [0, 0]
    log = []
    i = 0
    while i < len(cmds):
        match cmds[i]:
            case ("move", dx, dy):
                pos[0] += dx
                pos[1] += dy
            case ("move", dx):
                pos[0] += dx
            case ("say", str() as text):
                log.append(text)
            case ("stop",):
                break
            case other:
                raise CorpusError("unknown", other)
        i += 1
    return pos, log, i


@cases(([1, "a", [1, 2], {"k": 1}, ("pair", 1, 2), 2.5],),)
def match_or_and_as_patterns(items):
    out = []
    items = [Pair(*it[1:]) if isinstance(it, tuple) else it for it in items]
    for it in items:
        match it:
            case (int() | float()) as num:
                out.append(("num", num))
            case str() as s:
                out.append(("str", s))
            case Pair(left=l, right=r):
                out.append(("pair", l, r))
            case [a, b] | (a, b):
                out.append(("seq", a, b))
            case {"k": v}:
                out.append(("map", v))
    return out


@cases(([[1, [2, 3]], [4, [5]], [6, 7]],),)
def match_nested_in_nested_loops(rows):
    out = []
    for row in rows:
        for attempt in range(2):
            match row:
                case [a, [b, c]] if attempt == 0:
                    out.append(a + b + c)
                case [a, [b]]:
                    out.append(a * b)
                    break
                case [a, int(b)]:
                    out.append(a - b)
                    continue
                case _:
                    out.append("skip")
    return out


@cases((["1", "x"],),)
def match_guard_raises(values):
    out = []
    for v in values:
        match v:
            case str() if int(v) > 0:
                out.append(v)
            case _:
                out.append("-")
    return out


# ---------------------------------------------------------------------------
# global / nonlocal / closures / lambdas
# ---------------------------------------------------------------------------


def _bump_counter(by):
    global COUNTER
    COUNTER += by
    if COUNTER > 10:
        raise OverflowError("counter", COUNTER)
    return COUNTER


@cases((3,), (6,))
def global_counter_in_loop(n):
    global COUNTER
    COUNTER = 0
    seen = []
    for i in range(n):
        seen.append(_bump_counter(i))
    return seen, COUNTER


@cases((["a", "b", "a"],),)
def global_dict_registry(names):
    global REGISTRY
    REGISTRY = {}
    for n in names:
        REGISTRY[n] = REGISTRY.get(n, 0) + 1
    del REGISTRY["b"]
    return sorted(REGISTRY.items())


@cases((4,), (0,))
def nonlocal_counter_closure(n):
    count = 0

    def incr(by=1):
        nonlocal count
        count += by
        return count

    results = [incr(i) for i in range(n)]
    return results, count


@cases((5,),)
def nonlocal_in_nested_twice(n):
    total = 0

    def outer():
        def inner(x):
            nonlocal total
            total += x
            if total > 8:
                raise CorpusError("too big", total)
        for i in range(n):
            inner(i)
        return total
    try:
        return outer()
    except CorpusError as e:
        return e.args


@cases((3,),)
def closures_capture_loop_variable(n):
    fns = []
    for i in range(n):
        fns.append(lambda i=i: i * 10)
    late = [lambda: i for i in range(n)]
    return [f() for f in fns], [f() for f in late]


@cases((2, 5), (0, 1))
def closure_factory_counter(start, steps):
    def make_counter(start):
        value = start

        def step():
            nonlocal value
            value += 1
            return 10 // value

        return step

    c = make_counter(start - 1)
    return [c() for _ in range(steps)]


@cases(([3, 1, 2],), ([1, "a"],))
def lambda_sort_keys(xs):
    by_neg = sorted(xs, key=lambda x: -x)
    pairs = list(map(lambda x: (x, x * x), xs))
    return by_neg, pairs


@cases((4,),)
def recursive_closure_fib(n):
    memo = {}

    def fib(k):
        if k in memo:
            return memo[k]
        r = k if k < 2 else fib(k - 1) + fib(k - 2)
        memo[k] = r
        return r

    return [fib(i) for i in range(n + 6)], len(memo)


@cases(([1, 2, 3],),)
def functools_reduce_partial(xs):
    add = functools.partial(operator.add, 100)
    total = functools.reduce(lambda a, b: a * 2 + b, xs, 0)
    return [add(x) for x in xs], total


# ---------------------------------------------------------------------------
# comprehensions
# ---------------------------------------------------------------------------


@cases((5,),)
def comprehension_kinds(n):
    lst = [i * i for i in range(n) if i % 2 == 0]
    st = {i % 3 for i in range(n)}
    dct = {i: str(i) for i in range(n) if i}
    gen = sum(i for i in range(n))
    return lst, st, dct, gen


@cases((3,),)
def nested_comprehensions(n):
    grid = [[(i, j) for j in range(i)] for i in range(n)]
    flat = [x for row in grid for x in row if x[0] != x[1]]
    nested_dict = {i: {j: i * j for j in range(i)} for i in range(n)}
    return grid, flat, nested_dict


@cases(([1, 2, 0, 4],), ([1, 2],))
def comprehension_raises(xs):
    return [12 // x for x in xs]


@cases(([1, 2, 0, 4],),)
def comprehension_raise_caught_in_loop(xs):
    out = []
    for k in range(len(xs)):
        try:
            out.append([12 // x for x in xs[k:]])
        except ZeroDivisionError:
            out.append("z")
    return out


@cases(({"a": 1, "b": None},),)
def dict_comprehension_key_error(d):
    good = {k: v for k, v in d.items() if v is not None}
    return {k: d[k + "x"] for k in good}


@cases(([3, 7, 1, 9],),)
def generator_expression_any_all(xs):
    return (any(x > 8 for x in xs), all(x > 0 for x in xs),
            max((x for x in xs if x < 5), default=None), next((x for x in xs if x > 100), "none"))


@cases(([1, 2, 3, 4, 5],),)
def walrus_in_comprehension(xs):
    running = 0
    sums = [running := running + x for x in xs]
    big = [y for x in xs if (y := x * x) > 5]
    return sums, big, running


@cases((["3", "0", "x"],),)
def comprehension_with_nested_function_call(items):
    def parse(s):
        return 6 // int(s)

    return {s: parse(s) for s in items}


@cases(([[1, 2], [3], []],),)
def generator_expression_next_stopiteration(rows):
    out = []
    for row in rows:
        it = (x * 2 for x in row)
        try:
            out.append(next(it))
        except StopIteration:
            out.append("empty")
    return out


# ---------------------------------------------------------------------------
# generators
# ---------------------------------------------------------------------------


@cases((4,), (0,))
def simple_generator(n):
    for i in range(n):
        yield i * i


@cases((3,),)
def generator_yield_from(n):
    def inner(k):
        for j in range(k):
            yield ("inner", j)
        return k * 100

    total = 0
    for i in range(n):
        total += yield from inner(i)
        yield ("total", total)


@cases(([1, 2, 0, 3],), ([1, 2],))
def generator_raises_midway(xs):
    for x in xs:
        yield 6 // x


@cases((5,),)
def generator_try_finally_consumed(n):
    log = []

    def gen():
        try:
            for i in range(n):
                yield i
        finally:
            log.append("gen finally")

    collected = []
    for v in gen():
        collected.append(v)
        if v == 2:
            break
    return collected, log


@cases((3,), (0,))
def generator_close_runs_finally(n):
    log = []

    def gen():
        try:
            i = 0
            while True:
                yield i
                i += 1
        except GeneratorExit:
            log.append("exit")
            raise
        finally:
            log.append("finally")

    g = gen()
    got = [next(g) for _ in range(n)]
    g.close()
    return got, log


@cases(([1, 2, 3],), ([1, "x"],))
def generator_send_accumulator(values):
    def averager():
        total = 0
        count = 0
        avg = None
        while True:
            value = yield avg
            if value is None:
                return
            total += value
            count += 1
            avg = total / count

    g = averager()
    next(g)
    out = []
    for v in values:
        out.append(g.send(v))
    return out


@cases((2,), (5,))
def generator_throw_handled(n):
    log = []

    def gen():
        for i in range(n):
            try:
                yield i
            except RetryableError as e:
                log.append(("retry", e.args))
                yield "recovered"

    g = gen()
    out = [next(g)]
    out.append(g.throw(RetryableError("again")))
    out.extend(g)
    return out, log


@cases((3,),)
def generator_throw_unhandled(n):
    def gen():
        for i in range(n):
            yield i

    g = gen()
    next(g)
    return g.throw(KeyError("thrown"))


@cases(([3, 1, 2],),)
def generator_pipeline(xs):
    def numbers(seq):
        for x in seq:
            yield x

    def doubled(it):
        for x in it:
            yield x * 2

    def limited(it, k):
        for i, x in enumerate(it):
            if i >= k:
                return
            yield x

    return list(limited(doubled(numbers(xs)), 2)), sum(doubled(numbers(xs)))


@cases((2,),)
def generator_return_value_stopiteration(n):
    def gen():
        yield n
        return "done-%d" % n

    g = gen()
    first = next(g)
    try:
        next(g)
    except StopIteration as stop:
        return first, stop.value
    return "never"


@cases((3,),)
def generator_stopiteration_inside_becomes_runtimeerror(n):
    def gen():
        yield 1
        raise StopIteration("bad")

    return list(gen())


@cases(([1, 2, 3],),)
def generator_with_with_statement(xs):
    log = []

    def gen():
        for x in xs:
            with Recorder(log, "g%d" % x):
                yield x

    out = []
    for v in gen():
        out.append(v)
    return out, log


@cases(([1, 0, 2],),)
def generator_yields_inside_except(xs):
    for x in xs:
        try:
            yield 4 // x
        except ZeroDivisionError:
            yield "div0"
        finally:
            yield "f"


@cases((4,),)
def generator_infinite_with_islice(n):
    def naturals():
        k = 0
        while True:
            yield k
            k += 1

    return list(itertools.islice(naturals(), n)), list(itertools.takewhile(lambda v: v < n, naturals()))


@cases(([[1, 2], [3, [4, [5]]]],),)
def recursive_generator_flatten(tree):
    def flatten(node):
        if isinstance(node, list):
            for child in node:
                yield from flatten(child)
        else:
            yield node

    return list(flatten(tree))


# ---------------------------------------------------------------------------
# del, walrus, unpacking, augmented assignment, asserts
# ---------------------------------------------------------------------------


@cases((3,), (0,))
def del_local_then_use(n):
    x = n * 2
    y = x + 1
    del x
    if n:
        return y
    return x  # noqa: F821


@cases(([1, 2, 3, 4, 5, 6],),)
def del_list_items_in_loop(xs):
    xs = list(xs)
    i = 0
    while i < len(xs):
        if xs[i] % 2 == 0:
            del xs[i]
        else:
            i += 1
    del xs[:1]
    return xs


@cases(({"a": 1, "b": 2, "c": 3},), ({"a": 1},))
def del_dict_keys_in_loop(d):
    for key in ["b", "c"]:
        del d[key]
    return d


@cases((3,),)
def del_inside_loop_rebinding(n):
    out = []
    for i in range(n):
        tmp = [i] * i
        out.append(len(tmp))
        del tmp
    try:
        tmp  # noqa: B018
    except NameError as e:
        out.append(type(e).__name__)
    return out


@cases((["a", "bb", "", "ccc"],),)
def walrus_while_condition(items):
    items = list(items)
    out = []
    while items and (item := items.pop(0)):
        out.append(item.upper())
    return out, items


@cases((100,), (1,))
def walrus_while_halving(n):
    steps = []
    while (n := n // 2) > 0:
        steps.append(n)
    return steps


@cases(([1, 2, 3, 4],), ([1],), ([],))
def star_assignment_extended_unpacking(xs):
    first, *middle, last = xs
    *init, tail = xs
    head, *_ = xs
    return first, middle, last, init, tail, head


@cases(([(1, 2, 3), (4, 5, 6)],), ([(1, 2), (3,)],))
def unpacking_in_for_targets(rows):
    out = []
    for a, *rest in rows:
        out.append((a, rest))
    for i, (x, y, *z) in enumerate(rows):
        out.append((i, x + y, z))
    return out


@cases(((1, 2),), ((1, 2, 3),), (5,))
def failing_unpacking(value):
    a, b = value
    return a + b


@cases(([("a", 1), ("b", 2)],),)
def nested_unpacking_dict_items(pairs):
    d = dict(pairs)
    out = []
    for (k, v), (k2, v2) in zip(d.items(), sorted(d.items(), reverse=True)):
        out.append(k + k2 + str(v + v2))
    (p, q), r = ("xy", 3)
    return out, p, q, r


@cases((2,), (3,))
def augmented_assignment_subscripts_attributes(n):
    c = Counter()
    grid = [[0] * n for _ in range(n)]
    d = {"k": [1]}
    for i in range(n):
        c.value += i
        c.items[i % 3] += 1
        c.data["a"] -= i
        grid[i][i] *= 5
        grid[i][0] += i
        d["k"] += [i]
    c.items[n] += 1
    return c.value, c.items, c.data, grid, d


@cases(("abc",),)
def augmented_assignment_variety(s):
    x = 10
    x += 5
    x -= 3
    x *= 2
    x //= 5
    x **= 2
    x %= 7
    x <<= 3
    x >>= 1
    x |= 1
    x &= 0xFF
    x ^= 0x0F
    f = 1.5
    f /= 2
    s += "d"
    s *= 2
    return x, f, s


@cases((5,), (-1,), (0,))
def assert_with_and_without_message(n):
    assert isinstance(n, int)
    for i in range(n):
        assert i < 10, ("loop", i)
    assert n != 0
    assert n > 0, "n must be positive: %d" % n
    return n


@cases(([1, 2, 3],), ([1, -2],))
def assert_caught_in_loop(xs):
    bad = []
    for x in xs:
        try:
            assert x > 0, x
        except AssertionError as e:
            bad.append(e.args)
    return bad


# ---------------------------------------------------------------------------
# expressions: comparisons, conditionals, short-circuit
# ---------------------------------------------------------------------------


@cases(([1, 5, 10, 15, -3],),)
def chained_comparisons(xs):
    out = []
    for x in xs:
        out.append((0 < x < 10, 1 <= x <= 10 < 20, x == x != x + 1, -5 < x > 3))
    return out


@cases(([0, 1, 2, 3, None, ""],),)
def conditional_expressions(xs):
    return ["zero" if x == 0 else "odd" if isinstance(x, int) and x % 2 else "even"
            if isinstance(x, int) else "falsy" if not x else "?" for x in xs]


@cases(([0, 2, None, [], "s"],),)
def boolean_short_circuit_avoids_error(xs):
    out = []
    for x in xs:
        out.append(x is not None and x != [] and x != "s" and 10 // x if x else x or "default")
    return out


@cases(({"a": {"b": {"c": 1}}},), ({"a": {}},), ({},))
def short_circuit_nested_lookup(d):
    found = "a" in d and "b" in d["a"] and d["a"]["b"]["c"]
    fallback = d.get("a") or {"none": True}
    return found, fallback, d["a"]["b"]


@cases((3, 4), (0, 0), (-1, 2))
def comparison_chain_with_side_effects(a, b):
    calls = []

    def val(x):
        calls.append(x)
        return x

    result = val(a) < val(b) < val(a + b) < val(10)
    return result, calls


# ---------------------------------------------------------------------------
# classes with methods containing loops
# ---------------------------------------------------------------------------


class Inventory:
    def __init__(self):
        self.stock = {}
        self.history = []

    def add(self, item, qty):
        if qty <= 0:
            raise ValidationError("qty", "must be positive")
        self.stock[item] = self.stock.get(item, 0) + qty
        self.history.append(("add", item, qty))

    def remove(self, item, qty):
        have = self.stock[item]
        if have < qty:
            raise CorpusError("insufficient", item, have, qty)
        self.stock[item] = have - qty
        if not self.stock[item]:
            del self.stock[item]

    def bulk(self, ops):
        done = 0
        for op, item, qty in ops:
            try:
                getattr(self, op)(item, qty)
                done += 1
            except ValidationError as e:
                self.history.append(("invalid", e.field))
        return done


@cases(([("add", "a", 3), ("add", "b", 0), ("remove", "a", 3)],),
       ([("add", "a", 1), ("remove", "a", 2)],),
       ([("remove", "z", 1)],),
       ([("steal", "a", 1)],))
def inventory_bulk_operations(ops):
    inv = Inventory()
    done = inv.bulk(ops)
    return done, inv.stock, inv.history


class Matrix:
    def __init__(self, rows):
        self.rows = [list(r) for r in rows]

    def __mul__(self, other):
        n, m, p = len(self.rows), len(other.rows), len(other.rows[0])
        out = []
        for i in range(n):
            row = []
            for j in range(p):
                s = 0
                for k in range(m):
                    s += self.rows[i][k] * other.rows[k][j]
                row.append(s)
            out.append(row)
        return Matrix(out)

    def power(self, e):
        result = Matrix([[int(i == j) for j in range(len(self.rows))] for i in range(len(self.rows))])
        while e:
            result = result * self
            e -= 1
        return result


@cases(([[1, 1], [1, 0]], 5), ([[1, 2]], 2), ([[2]], 0))
def matrix_class_power(rows, e):
    return Matrix(rows).power(e).rows


class Stack:
    def __init__(self):
        self._items = []

    def push(self, x):
        self._items.append(x)

    def pop(self):
        try:
            return self._items.pop()
        except IndexError:
            raise CorpusError("pop from empty stack") from None

    def __len__(self):
        return len(self._items)


@cases(("3 4 + 2 *",), ("1 +",), ("4 0 /",), ("1 2",))
def rpn_calculator_with_stack(expr):
    st = Stack()
    ops = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.floordiv}
    for tok in expr.split():
        if tok in ops:
            b = st.pop()
            a = st.pop()
            st.push(ops[tok](a, b))
        else:
            st.push(int(tok))
    if len(st) != 1:
        raise ValueError("leftover", len(st))
    return st.pop()


class Node:
    def __init__(self, value, children=()):
        self.value = value
        self.children = list(children)

    def total(self):
        s = self.value
        for c in self.children:
            s += c.total()
        return s

    def find(self, value):
        if self.value == value:
            return [self.value]
        for c in self.children:
            path = c.find(value)
            if path:
                return [self.value] + path
        return None


@cases((5,), (99,), ("bad",))
def tree_class_recursion(target):
    tree = Node(1, [Node(2, [Node(4), Node(5)]), Node(3, [Node(6, [Node(7)])])])
    return tree.total(), tree.find(target), tree.find(7)


class Shape:
    sides = 0

    def describe(self):
        return "%s with %d sides" % (type(self).__name__, self.sides)

    def area(self):
        raise NotImplementedError(type(self).__name__)


class Square(Shape):
    sides = 4

    def __init__(self, s):
        self.s = s

    def area(self):
        return self.s * self.s


class Triangle(Shape):
    sides = 3


@cases(([2, 3],), ([2, None],))
def class_inheritance_polymorphism(spec):
    shapes = [Square(spec[0]), Triangle() if spec[1] is None else Square(spec[1])]
    out = []
    for sh in shapes:
        out.append(sh.describe())
        out.append(sh.area())
    return out


@cases((2,), (4,))
def class_defined_inside_function(n):
    class Local:
        count = 0

        def __init__(self):
            Local.count += 1
            self.id = Local.count

    objs = [Local() for _ in range(n)]
    return [o.id for o in objs], Local.count, objs[3].id if n > 3 else None


@cases(("x",), ("missing",))
def attribute_error_escapes(attr):
    c = Counter(3)
    c.x = 7
    return getattr(c, attr) + c.value


@cases((0,), (1,))
def property_and_dunder_methods(n):
    class Temp:
        def __init__(self, c):
            self._c = c

        @property
        def f(self):
            return self._c * 9 / 5 + 32

        @f.setter
        def f(self, value):
            if value < -459.67:
                raise ValueError("below absolute zero")
            self._c = (value - 32) * 5 / 9

        def __lt__(self, other):
            return self._c < other._c

    ts = [Temp(c) for c in (30, 10, 20)]
    ts.sort()
    t = ts[0]
    t.f = 212
    out = [t._c, [x._c for x in ts]]
    t.f = -500 * n
    return out


# ---------------------------------------------------------------------------
# recursion, arguments, formatting, sorting
# ---------------------------------------------------------------------------


@cases((5,), (0,), (-1,))
def recursive_factorial(n):
    if n < 0:
        raise ValueError("negative", n)
    if n == 0:
        return 1
    return n * recursive_factorial(n - 1)


@cases(([3, [1, [2, [0]]]],), ([1, [2, "x"]],))
def recursive_nested_sum(tree):
    total = 0
    for item in tree:
        if isinstance(item, list):
            total += recursive_nested_sum(item)
        else:
            total += 10 // item if item else 0
    return total


@cases((8,), (2,))
def mutual_recursion_even_odd(n):
    def is_even(k):
        return True if k == 0 else is_odd(k - 1)

    def is_odd(k):
        return False if k == 0 else is_even(k - 1)

    return [is_even(i) for i in range(n)], is_odd(n)


@cases((1,), (1, 2), (1, 2, 3, 4))
def default_and_star_args(a, b=10, *rest, **kw):
    return a, b, rest, kw


@cases((False,), (True,))
def keyword_only_args_calls(fail):
    def f(a, *, key, flag=False):
        return (a, key, flag)

    def g(*args, **kwargs):
        return args, sorted(kwargs.items())

    out = [f(1, key=2), f(3, key=4, flag=True), g(1, 2, x=3, y=4), g(*[1, 2], **{"z": 0})]
    try:
        f(1, 2)
    except TypeError:
        out.append("positional refused")
    if fail:
        out.append(f(5))
    return out


@cases(([1, 2],),)
def mutable_default_argument(xs):
    def append_to(x, acc=[]):  # noqa: B006
        acc.append(x)
        return list(acc)

    return [append_to(x) for x in xs], append_to(0, [])


@cases(("alice", 3, 2.5), ("bob", 0, 1.0))
def string_formatting_variety(name, count, ratio):
    a = "%s has %d items (%.2f)" % (name, count, ratio)
    b = "{0} has {1:03d} items ({2:.1f})".format(name, count, ratio)
    c = f"{name!r:>8}|{count:<4}|{ratio:+.3e}|{count * ratio:g}"
    d = f"{'nested ' + name.upper()}{'!' * count}"
    e = "{n}-{c}".format(n=name, c=count) + format(count, "b")
    return [a, b, c, d, e, "%(x)s" % {"x": name}]


@cases((3,),)
def string_formatting_errors(n):
    out = []
    for fmt, args in [("%d", "x"), ("{0} {1}", (1,)), ("%s %s", (1,)), ("{:d}", ("s",))]:
        try:
            out.append(fmt % args if "%" in fmt else fmt.format(*args))
        except (TypeError, IndexError, ValueError) as e:
            out.append(type(e).__name__)
    return out, "%0*d" % (n, 7)


@cases(([3, 1, 2],), ([3, "a", 2],), ([],))
def sort_with_key_that_raises(xs):
    def key(x):
        if not isinstance(x, int):
            raise ValidationError("key", x)
        return -x

    return sorted(xs, key=key)


@cases((["banana", "Apple", "cherry", "apple"],),)
def sort_stable_multi_key(words):
    by_len = sorted(words, key=len)
    by_lower_then_orig = sorted(words, key=lambda w: (w.lower(), w))
    words.sort(key=str.lower, reverse=True)
    return by_len, by_lower_then_orig, words


@cases(([(2, "b"), (1, "a"), (2, "a")],), ([(1, "a"), ("x", "b")],))
def sort_tuples_comparison_error(pairs):
    return sorted(pairs), min(pairs), max(pairs, key=operator.itemgetter(1))


@cases(([5, 2, 9],), ([5, None],))
def sort_caught_inside_loop(xs):
    attempts = []
    for reverse in (False, True):
        try:
            attempts.append(sorted(xs, reverse=reverse))
        except TypeError:
            attempts.append("unorderable")
    return attempts


# ---------------------------------------------------------------------------
# iterator classes
# ---------------------------------------------------------------------------


@cases((4,), (0,))
def iterator_class_countdown(n):
    out = []
    for v in Countdown(n):
        out.append(v)
    it = Countdown(2)
    out.append(next(it))
    out.append(next(it))
    out.append(next(it, "exhausted"))
    return out


@cases(([1, 2, 3], 2), ([1, 2, 3], 9))
def iterator_class_raises_value_error(values, fail_at):
    out = []
    for v in ExplodingIterator(values, fail_at):
        out.append(v)
    return out


@cases(([1, 2, 3, 4], 1),)
def iterator_errors_caught_and_resumed(values, fail_at):
    it = ExplodingIterator(values, fail_at)
    out = []
    while True:
        try:
            out.append(next(it))
        except ValueError as e:
            out.append(e.args[0])
        except StopIteration:
            break
    return out


@cases((3,),)
def iterator_protocol_manual_for(n):
    it = iter(Countdown(n))
    out = []
    while True:
        try:
            value = next(it)
        except StopIteration:
            out.append("stop")
            break
        else:
            out.append(value)
    return out


@cases(([1, 2, 3], [4, 5]),)
def zip_map_filter_chains(a, b):
    zipped = list(zip(a, b))
    strict_failed = None
    try:
        list(zip(a, b, strict=True))
    except ValueError as e:
        strict_failed = str(e)
    return zipped, list(map(operator.mul, a, b)), list(filter(None, [0, *a, None])), strict_failed


@cases((["a", "b", "c"],),)
def itertools_combinations(xs):
    return (list(itertools.combinations(xs, 2)), list(itertools.product(xs[:2], repeat=2)),
            list(itertools.accumulate([1, 2, 3])), list(itertools.chain(xs, [1])),
            [(k, len(list(g))) for k, g in itertools.groupby("aabccc")])


@cases((5,),)
def class_with_getitem_iteration(n):
    class Seq:
        def __getitem__(self, i):
            if i >= n:
                raise IndexError(i)
            return i * 3

    return list(Seq()), 6 in Seq(), Seq()[1]


# ---------------------------------------------------------------------------
# integer / float edge cases
# ---------------------------------------------------------------------------


@cases((7, 2), (-7, 2), (7, -2), (7, 0))
def integer_division_semantics(a, b):
    return a // b, a % b, divmod(a, b), -a // b


@cases((2,), (10,))
def big_integer_arithmetic(k):
    big = 2 ** (64 * k)
    return big % 1000007, (big - 1).bit_length(), big >> (64 * k - 3), str(big)[:10]


@cases((0.1, 0.2), (1e308, 10.0), (1.0, 0.0))
def float_edge_cases(a, b):
    s = a + b
    p = a * b
    return s == 0.30000000000000004, p == float("inf"), (a / b).is_integer()


@cases((3.7,), (-3.7,), (float("nan"),), (float("inf"),))
def float_to_int_conversion(x):
    return round(x), int(x), x.__floor__(), round(x, 1)


@cases(("42",), ("0x1F",), ("1_000",), (" 7 ",), ("4.5",))
def int_parsing_edge_cases(s):
    return int(s, 0) if s.startswith("0x") else int(s)


@cases((10,),)
def integer_overflow_to_float(n):
    out = []
    for e in range(n):
        try:
            out.append(float(10 ** (e * 100)))
        except OverflowError:
            out.append("overflow")
    return out


@cases((1, 3), (2, 0))
def float_division_by_zero(a, b):
    return a / b, a % b if b else None


# ---------------------------------------------------------------------------
# long functions with many locals
# ---------------------------------------------------------------------------


@cases((3,), (7,), (0,))
def long_function_many_locals(n):
    v1 = n + 1
    v2 = v1 * 2
    v3 = v2 - 3
    v4 = v3 ** 2
    v5 = v4 % 7
    v6 = [v1, v2, v3]
    v7 = {"a": v4, "b": v5}
    v8 = tuple(v6)
    v9 = sum(v8)
    v10 = v9 // max(v5, 1)
    v11 = str(v10)
    v12 = v11 * 2
    v13 = len(v12)
    v14 = v13 + v1
    v15 = [x * v14 for x in v6]
    v16 = sorted(v15, reverse=True)
    v17 = v16[0] - v16[-1]
    v18 = v17 or -1
    v19 = v7["a"] + v7["b"]
    v20 = v19 // v18
    v21 = (v20, v19, v18)
    v22 = v21[0] + v21[2]
    v23 = v22 * v1
    v24 = 100 // (v23 - 24) if v23 != 24 else "hit"
    return [v1, v2, v3, v4, v5, v9, v10, v12, v14, v17, v20, v22, v23, v24]


@cases(([3, 1, 4, 1, 5, 9, 2, 6],), ([],), ([1, "x"],))
def long_function_statistics(xs):
    count = 0
    total = 0
    minimum = None
    maximum = None
    evens = 0
    odds = 0
    runs = []
    current = []
    prev = None
    for x in xs:
        count += 1
        total += x
        if minimum is None or x < minimum:
            minimum = x
        if maximum is None or x > maximum:
            maximum = x
        if x % 2 == 0:
            evens += 1
        else:
            odds += 1
        if prev is not None and x < prev:
            runs.append(current)
            current = []
        current.append(x)
        prev = x
    if current:
        runs.append(current)
    mean = total / count if count else None
    spread = maximum - minimum if count else 0
    longest = max(runs, key=len) if runs else []
    return count, total, minimum, maximum, evens, odds, mean, spread, longest, len(runs)


@cases(("the quick brown fox jumps over the lazy dog the end",), ("",))
def long_function_text_processing(text):
    words = text.split()
    freq = {}
    for w in words:
        freq[w] = freq.get(w, 0) + 1
    letters = defaultdict(int)
    for w in words:
        for ch in w:
            letters[ch] += 1
    top_words = sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    top_letters = sorted(letters.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    lengths = [len(w) for w in words]
    avg = sum(lengths) / len(lengths) if lengths else 0.0
    capital = " ".join(w.capitalize() for w in words)
    acronym = "".join(w[0] for w in words).upper()
    reversed_words = " ".join(reversed(words))
    palins = sorted({w for w in words if w == w[::-1]})
    vowels = sum(1 for ch in text if ch in "aeiou")
    longest = max(words, key=len) if words else None
    return top_words, top_letters, avg, capital, acronym, reversed_words, palins, vowels, longest


@cases((5,), (12,))
def long_state_machine(n):
    state = "start"
    trace = []
    value = 0
    steps = 0
    while state != "done":
        steps += 1
        if steps > 50:
            raise RuntimeError("runaway", state, value)
        trace.append(state)
        if state == "start":
            value = n
            state = "check"
        elif state == "check":
            state = "even" if value % 2 == 0 else "odd"
        elif state == "even":
            value //= 2
            state = "check" if value > 1 else "done"
        elif state == "odd":
            value = value * 3 + 1 if value > 1 else value
            state = "check" if value > 1 else "done"
    return trace[:8], value, steps


# ---------------------------------------------------------------------------
# deep nesting and deep call chains
# ---------------------------------------------------------------------------


@cases(([[1, 2], [0, 3], ["a"]],), ([[1]],))
def deeply_nested_control_flow(data):
    log = []
    for i, row in enumerate(data):
        try:
            for j, x in enumerate(row):
                with Recorder(log, "%d%d" % (i, j)):
                    try:
                        if x == 0:
                            raise ZeroDivisionError("zero")
                        while x > 1:
                            x -= 1
                            if x == 2:
                                continue
                            log.append(("x", x))
                    except ZeroDivisionError as e:
                        log.append(e.args[0])
                        break
                    finally:
                        log.append("f")
        except TypeError:
            log.append("typeerror")
        else:
            log.append("row ok")
    return log


def _level3(x):
    return {"a": 1}[x]


def _level2(x):
    values = []
    for k in x:
        values.append(_level3(k))
    return values


def _level1(x):
    try:
        return _level2(x)
    finally:
        EVENTS.append("level1 finally")


@cases((["a"],), (["a", "b"],))
def exception_escapes_three_frames(keys):
    EVENTS.clear()
    return _level1(keys), list(EVENTS)


@cases((["a", "b"],),)
def exception_three_frames_caught(keys):
    EVENTS.clear()
    try:
        _level1(keys)
    except KeyError as e:
        return e.args, list(EVENTS)


def _recurse_then_fail(depth):
    if depth == 0:
        raise CorpusError("bottom")
    return _recurse_then_fail(depth - 1) + 1


@cases((0,), (5,))
def exception_from_recursion_depth(depth):
    return _recurse_then_fail(depth)


@cases((4,),)
def exception_through_lambda_and_comprehension(n):
    f = lambda k: [10 // (k - i) for i in range(n)]  # noqa: E731
    return f(n), f(2)


@cases((3,),)
def exception_through_method_and_generator(n):
    class Source:
        def values(self):
            for i in range(n, -1, -1):
                yield 12 // i

    src = Source()
    return [v for v in src.values()]


@cases(([1, 2, 3],),)
def exception_through_sort_key_in_nested_call(xs):
    def key(x):
        return 1 / (x - 2)

    def outer():
        return sorted(xs, key=key)

    return outer()


@cases(([{"user": {"name": "a"}}, {"user": {}}],), ([{"user": {"name": "b"}}],))
def exception_translated_across_frames(records):
    def get_name(rec):
        try:
            return rec["user"]["name"]
        except KeyError as e:
            raise ValidationError("name", "missing") from e

    names = []
    for rec in records:
        names.append(get_name(rec))
    return names


# ---------------------------------------------------------------------------
# more control-flow combinations
# ---------------------------------------------------------------------------


@cases(([1, 2, 0, 4],), ([1, 2],))
def break_inside_except(xs):
    out = []
    for x in xs:
        try:
            out.append(8 // x)
        except ZeroDivisionError:
            out.append("stop")
            break
    else:
        out.append("completed")
    return out


@cases(([1, "a", 2, None],),)
def continue_inside_except_while(xs):
    out = []
    i = -1
    while i + 1 < len(xs):
        i += 1
        try:
            value = xs[i] + 1
        except TypeError:
            continue
        out.append(value)
    return out


@cases(([3, 0, 1],), ([3, 1],))
def return_inside_except_in_loop(xs):
    seen = []
    for x in xs:
        try:
            seen.append(3 // x)
        except ZeroDivisionError:
            return "early", seen
    return "late", seen


@cases((3,), (0,))
def return_in_try_overridden_by_finally_in_loop(n):
    results = []
    for i in range(n):
        def f(i=i):
            try:
                return "try%d" % i
            finally:
                if i % 2:
                    return "finally%d" % i  # noqa: B012
        results.append(f())
    return results


@cases(([1, 2, 3],), ([1, 0, 3],))
def exception_in_else_block(xs):
    log = []
    for x in xs:
        try:
            y = x + 1
        except TypeError:
            log.append("never")
        else:
            try:
                log.append(y // x)
            except ZeroDivisionError:
                log.append("else caught")
    return log


@cases((0,), (1,))
def exception_in_else_escapes(n):
    try:
        value = 10
    except ValueError:
        value = 0
    else:
        value = value // n
    finally:
        EVENTS.append("done")
    return value


@cases(([2, 4, 6],), ([2, 3, 4],))
def for_else_with_try_in_body(xs):
    log = []
    for x in xs:
        try:
            if x % 2:
                raise ValueError(x)
        except ValueError as e:
            log.append(("odd", e.args[0]))
            break
        finally:
            log.append(x)
    else:
        log.append("all even")
    return log


@cases((4,),)
def while_else_continue_and_else_runs(n):
    i = 0
    out = []
    while i < n:
        i += 1
        if i % 2:
            continue
        out.append(i)
    else:
        out.append("else-ran")
    return out


@cases((3, 3), (2, 5))
def triple_nested_loop_break_out_via_exception(a, b):
    class Found(Exception):
        pass

    try:
        for i in range(a):
            for j in range(b):
                for k in range(3):
                    if i * j * k == 4:
                        raise Found(i, j, k)
    except Found as f:
        return f.args
    return None


@cases(([1, 2, 3],), ([1, -2, 3],))
def try_finally_nested_in_while_with_break(xs):
    log = []
    i = 0
    while True:
        try:
            try:
                if i >= len(xs):
                    break
                if xs[i] < 0:
                    raise ValueError(xs[i])
                log.append(xs[i])
            finally:
                log.append("inner")
        except ValueError:
            log.append("neg")
        finally:
            i += 1
    return log, i


@cases((2,), (3,))
def raise_in_finally_after_break(n):
    log = []
    for i in range(5):
        try:
            if i == 1:
                break
        finally:
            log.append(i)
            if n == 3:
                raise CorpusError("in finally", i)
    return log


@cases(([1, 2],),)
def except_handler_with_nested_try_finally(xs):
    log = []
    for x in xs:
        try:
            raise KeyError(x)
        except KeyError as e:
            try:
                log.append(("handling", e.args[0]))
                if x == 2:
                    raise ValueError("nested")
            except ValueError:
                log.append("nested caught")
            finally:
                log.append("nested finally")
    return log


@cases((1,), (2,), (3,))
def exception_hierarchy_catch_order(code):
    errs = {1: ValidationError("f", "r"), 2: RetryableError("r"), 3: LookupError("l")}
    try:
        raise errs[code]
    except ValidationError as e:
        return "validation", e.field
    except CorpusError as e:
        return "corpus", e.args
    except (KeyError, IndexError):
        return "never"


@cases((["ok", "key", "idx", "val"],),)
def dispatch_exceptions_in_loop(kinds):
    out = []
    for kind in kinds:
        try:
            if kind == "key":
                {}["missing"]
            elif kind == "idx":
                [][1]
            elif kind == "val":
                int("zz")
            out.append("ok")
        except LookupError as e:
            out.append(type(e).__name__)
        except Exception as e:  # noqa: BLE001
            out.append(("generic", type(e).__name__))
    return out


@cases((0,), (1,))
def with_return_inside_try_finally(mode):
    log = []

    def f():
        with Recorder(log, "w"):
            try:
                if mode:
                    raise KeyError("x")
                return "returned"
            finally:
                log.append("finally")

    try:
        return f(), log
    except KeyError:
        return "escaped", log


# ---------------------------------------------------------------------------
# data structures
# ---------------------------------------------------------------------------


@cases(([("a", 1), ("b", 2), ("a", 3)],),)
def defaultdict_grouping(pairs):
    groups = defaultdict(list)
    for k, v in pairs:
        groups[k].append(v)
    plain = {}
    for k, v in pairs:
        plain.setdefault(k, []).append(v)
    return dict(groups), plain


@cases((5,), (0,))
def deque_rotation_and_pop(n):
    d = deque(range(n))
    d.rotate(2)
    out = list(d)
    while d:
        out.append(d.popleft() if len(d) % 2 else d.pop())
    return out, (d.pop() if n == 0 else "empty")


@cases(([3, 1, 2],), ([99, 1],))
def ordered_dict_moves(keys):
    od = OrderedDict()
    for k in keys:
        od[k] = k * k
    od.move_to_end(keys[0])
    first = next(iter(od))
    od.popitem(last=False)
    return list(od.items()), first, od.pop(99)


@cases(([1, 2, 3],), ([1, 2, 2],))
def set_operations(xs):
    s = set(xs)
    t = {2, 3, 4}
    if len(s) != len(xs):
        raise ValueError("duplicates", sorted(s))
    return s | t, s & t, s - t, s ^ t, sorted(s.union(t))


@cases(({"a": 1},), ({},))
def dict_mutation_during_iteration(d):
    for k in d:
        d[k + k] = 1
    return d


@cases(([1, 2, 3],),)
def list_slicing_assignments(xs):
    xs = list(xs) * 3
    xs[1:3] = ["a", "b", "c"]
    xs[::4] = [0] * len(xs[::4])
    del xs[-2:]
    ys = xs[::-1]
    xs[len(xs):] = [9]
    return xs, ys, xs[100:], xs[-100:2]


@cases((3, "left"), (2, "missing"))
def namedtuple_usage(n, attr):
    pairs = [Pair(i, i * i) for i in range(n)]
    lefts = [p.left for p in pairs]
    p2 = pairs[-1]._replace(right=0)
    return lefts, p2, p2._asdict(), getattr(pairs[0], attr)


# ---------------------------------------------------------------------------
# more generators and consumers
# ---------------------------------------------------------------------------


@cases(([1, 2, 3, 4],),)
def consume_generator_with_early_break(xs):
    log = []

    def gen():
        try:
            for x in xs:
                log.append(("yield", x))
                yield x
        finally:
            log.append("closed")

    total = 0
    g = gen()
    for v in g:
        total += v
        if total > 2:
            break
    g.close()
    return total, log


@cases((3,),)
def generator_expression_in_loop_with_state(n):
    out = []
    for i in range(n):
        gen = (j * i for j in range(i + 1))
        out.append(list(gen))
        out.append(list(gen))
    return out


@cases(([1, 2, 3],),)
def generator_send_none_and_values(xs):
    def echo():
        received = []
        while True:
            v = yield len(received)
            if v == "stop":
                return received
            received.append(v)

    g = echo()
    out = [next(g)]
    for x in xs:
        out.append(g.send(x))
    try:
        g.send("stop")
    except StopIteration as e:
        out.append(e.value)
    return out


@cases((4,), (1,))
def generator_yield_inside_while_try(n):
    i = 0
    while i < n:
        try:
            if i == 2:
                raise KeyError(i)
            yield i
        except KeyError as e:
            yield ("caught", e.args[0])
        i += 1
    yield "end"


@cases((3,),)
def generator_raises_after_yield_from(n):
    def inner():
        yield 1
        yield 2

    yield from inner()
    yield from range(n)
    raise CorpusError("after delegation")


@cases(([1, 2, 3],),)
def generator_function_returns_early(xs):
    for x in xs:
        if x == 2:
            return
        yield x


# ---------------------------------------------------------------------------
# misc statements
# ---------------------------------------------------------------------------


@cases((5,),)
def pass_and_ellipsis_statements(n):
    out = []
    for i in range(n):
        if i % 2:
            pass
        else:
            ...
            out.append(i)
    class Empty:
        pass
    return out, Empty.__name__


@cases(("abc", 1), ("abc", 10), ("", 0))
def string_indexing_and_methods(s, i):
    return s[i], s.upper().center(7, "*"), s.find("z"), s.index(s[0])


@cases(([1, 2, 3],), ({"a": 1},), (5,))
def len_and_iter_type_errors(obj):
    total = 0
    for item in obj:
        total += len(str(item))
    return total, len(obj)


@cases((5, 3), (3, 5))
def lambda_in_default_and_conditional_call(a, b):
    pick = (lambda: a - b) if a > b else (lambda: b // (a - 3))
    return pick()


@cases(("x = 1; y = 2",), ("x = ; y",))
def parse_assignments_with_validation(text):
    result = {}
    for part in text.split(";"):
        name, _, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not value:
            raise ValidationError(name, "empty value")
        result[name] = int(value)
    return result


@cases(([5, 3, 8],), ([],))
def min_max_empty_sequence(xs):
    return min(xs), max(xs), sum(xs) / len(xs)


@cases((3,), (4,))
def nested_function_default_raises_on_call(n):
    def f(x, scale=n):
        return x // (scale - 3)

    out = []
    for k in (6, 4):
        try:
            out.append(f(k))
        except ZeroDivisionError:
            out.append(f(k, scale=1))
    return out, f(1)


@cases((2,), (5,))
def isinstance_dispatch_loop(n):
    values = [1, "s", 2.5, [1], (2,), {"k": 3}, None, True][:n + 3]
    out = []
    for v in values:
        if isinstance(v, bool):
            out.append("bool")
        elif isinstance(v, int):
            out.append("int")
        elif isinstance(v, (list, tuple)):
            out.append("seq%d" % len(v))
        elif isinstance(v, dict):
            out.append(sorted(v))
        elif v is None:
            raise TypeError("None not allowed")
        else:
            out.append(type(v).__name__)
    return out


# ---------------------------------------------------------------------------
# exceptions handled by the language machinery or by callers
# ---------------------------------------------------------------------------


class LazyAttrs:
    def __init__(self, data):
        self.data = data

    @property
    def first(self):
        return self.data[0]

    @property
    def broken(self):
        return self.not_there


class Proxy:
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)


class FallbackAttrs:
    @property
    def value(self):
        return self._missing

    def __getattr__(self, name):
        return "fallback " + name


class IndexedSeq:
    """Old-style sequence protocol: iteration stops at IndexError."""

    def __init__(self, items):
        self.items = items

    def __getitem__(self, i):
        return self.items[i] * 2


class DelegatingIterator:
    def __init__(self, items):
        self.it = iter(items)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.it) + 1


def _divide(a, b):
    return a // b


def _pick_type(log, exc_type):
    log.append("clause evaluated")
    return exc_type


@cases(([1, 2],), ([],))
def getattr_default_swallows_attribute_error(data):
    obj = LazyAttrs(data)
    return getattr(obj, "broken", "default"), hasattr(obj, "broken"), getattr(obj, "first", None)


@cases((["x", "real"],),)
def hasattr_on_proxy(names):
    p = Proxy("text")
    return [hasattr(p, n) for n in names] + [p.upper()]


@cases((),)
def property_attribute_error_falls_back_to_getattr():
    return FallbackAttrs().value, FallbackAttrs().other


@cases(([1, 2, 3],), ([],))
def getitem_sequence_protocol_iteration(items):
    seq = IndexedSeq(items)
    out = [x for x in seq]
    out.append(4 in IndexedSeq(items))
    return out


@cases(([1, 2, 3],),)
def delegating_iterator_stopiteration(items):
    out = []
    for x in DelegatingIterator(items):
        out.append(x)
    out.append(list(DelegatingIterator(items[:1])))
    out.append(next(DelegatingIterator([]), "empty"))
    return out


@cases((0,), (2,))
def suppress_in_caller_frame(b):
    with contextlib.suppress(ZeroDivisionError):
        return _divide(10, b)
    return "suppressed"


@cases(([1, 0, 2],),)
def try_in_caller_of_helper_in_loop(xs):
    out = []
    for x in xs:
        try:
            out.append(_divide(6, x))
        except ZeroDivisionError:
            out.append("caught in caller")
    return out


@cases((0,), (1,))
def except_clause_expression_side_effects(x):
    log = []
    try:
        log.append(1 // x)
    except _pick_type(log, ZeroDivisionError):
        log.append("caught")
    return log


@cases((0,), ("a",), (5,))
def except_clause_from_local_tuple(x):
    handled = (ZeroDivisionError, TypeError)
    names = {"zero": ZeroDivisionError}
    try:
        return 10 // x
    except names["zero"]:
        return "zero"
    except handled as e:
        return type(e).__name__


@cases(([1, 0, 3],), ([0],))
def nested_suppress_and_recorder(xs):
    log = []
    for x in xs:
        with Recorder(log, "outer"):
            with contextlib.suppress(ZeroDivisionError):
                with Recorder(log, "inner"):
                    log.append(3 // x)
    return log


@cases(([1, 0, 3],),)
def suppress_outside_reraising_handler(xs):
    log = []
    for x in xs:
        with contextlib.suppress(ZeroDivisionError):
            try:
                with Recorder(log, "r"):
                    log.append(3 // x)
            except ZeroDivisionError:
                log.append("seen")
                raise
    return log


@cases((0,), (1,))
def conditional_suppress_custom_exit(x):
    log = []
    with Recorder(log, "maybe", suppress=(x == 0)):
        log.append(5 // x)
    return log


@cases(([1, 0],),)
def generator_consumed_inside_try(xs):
    def gen():
        for x in xs:
            yield 4 // x

    out = []
    try:
        for v in gen():
            out.append(v)
    except ZeroDivisionError:
        out.append("gen failed")
    return out


@cases(([3, 0, 1],),)
def generator_expression_caught_by_consumer(xs):
    try:
        return sum(12 // x for x in xs)
    except ZeroDivisionError:
        return "sum failed"


@cases(([2, 0, 1],),)
def lambda_key_error_caught_by_caller(xs):
    try:
        return sorted(xs, key=lambda x: 1 / x)
    except ZeroDivisionError as e:
        return str(e)


@cases((0,), (2,))
def exception_at_nonzero_stack_depth(x):
    def f(*args):
        return list(args)

    out = []
    for i in range(3):
        try:
            out.append(f(i, i * 2, f(i, 10 // (x - i)), "tail"))
        except ZeroDivisionError:
            out.append(("z", i))
    return out


@cases(({"a": 1},), ({},))
def augmented_subscript_with_failing_rhs(d):
    counts = {"a": 0}
    for key in ["a", "b"]:
        try:
            counts[key] += d[key]
        except KeyError as e:
            counts.setdefault("missing", []).append(e.args[0])
    return counts


@cases(([1, 2],), ([1, 0],))
def failure_in_for_header_iterable(xs):
    out = []
    for x in xs:
        try:
            for y in range(4 // x):
                out.append(y)
        except ZeroDivisionError:
            out.append("header failed")
    for z in [10 // x for x in xs]:
        out.append(z)
    return out


@cases((0,), (1,))
def failure_in_with_item_expression(x):
    log = []
    try:
        with Recorder(log, "a"), Recorder(log, str(1 // x)):
            log.append("body")
    except ZeroDivisionError:
        log.append("item failed")
    return log


@cases(([1, 2],), ([0, 2],))
def failure_in_match_subject_and_guard(xs):
    out = []
    for x in xs:
        try:
            match 10 // x:
                case 10:
                    out.append("ten")
                case n if 5 // (n - 5) > 0:
                    out.append(n)
        except ZeroDivisionError:
            out.append("z")
    return out


@cases((0,), (1,))
def failure_in_return_inside_finally_loop(x):
    log = []
    for i in range(2):
        try:
            log.append(i)
        finally:
            if i == 1:
                return log, 1 // x  # noqa: B012
    return log


@cases((["a"],), (["a", "b"],), (["a", "zz"],))
def failure_in_fstring_and_assert_message(keys):
    d = {"a": 1, "b": 2}
    out = []
    for k in keys:
        out.append(f"{k}={d[k]:>3}")
    assert len(out) < 2, "too many: %s" % d[keys[-1]]
    return out


@cases(([1, 2],), ([1, 0],))
def failure_inside_yield_expression(xs):
    acc = 0
    for x in xs:
        got = yield (acc, 10 // x)
        acc += got or 0


@cases(([1, 2, 3],), ([1, 0, 3],))
def failure_in_del_and_star_unpack(xs):
    d = {x: x for x in xs}
    out = []
    for x in xs:
        try:
            head, *rest = [1 // x, x]
            del d[x - 1 if x > 2 else x]
            out.append((head, rest))
        except (ZeroDivisionError, KeyError) as e:
            out.append(type(e).__name__)
    return out, sorted(d)


@cases((1,), (0,))
def exception_in_except_handler_caught_outside(x):
    log = []
    for i in range(2):
        try:
            try:
                [][i]
            except IndexError:
                log.append(10 // x)
        except ZeroDivisionError:
            log.append("outer")
    return log


@cases((0,), (1,))
def exception_in_finally_caught_outside(x):
    log = []
    for i in range(2):
        try:
            try:
                log.append(i)
            finally:
                log.append(10 // x)
        except ZeroDivisionError:
            log.append("outer")
            continue
        log.append("after")
    return log


@cases((0,), (3,))
def exception_in_while_condition(x):
    i = 0
    out = []
    try:
        while 6 // (x - i) > 1:
            out.append(i)
            i += 1
    except ZeroDivisionError:
        out.append("cond failed")
    return out


@cases(([3, 1, 2],), ([3, None],))
def comparison_failure_inside_sort_in_loop(xs):
    out = []
    for _ in range(2):
        try:
            out.append(sorted(xs))
        except TypeError:
            out.append("incomparable")
        xs = xs[::-1]
    return out


# ---------------------------------------------------------------------------
# exception state: __context__, sys.exc_info, handler analysis
# ---------------------------------------------------------------------------


def _exc_name():
    import sys

    exc = sys.exc_info()[1]
    return None if exc is None else type(exc).__name__


@seen_by_daifu(1, why="a finally block replaces the exception with one that is caught")
@cases(({},), ({"k": 1},))
def context_of_error_in_finally(d):
    try:
        try:
            return d["k"] // 0
        finally:
            d["missing"]
    except KeyError as e:
        return e.args, type(e.__context__).__name__


@cases(([],), ([5],))
def context_of_error_in_except_handler(xs):
    try:
        try:
            xs[0] // 0
        except (IndexError, ZeroDivisionError) as first:
            marker = type(first).__name__
            {}[marker]
    except KeyError as e:
        return e.args, type(e.__context__).__name__, e.__context__.args


@cases((0,), (1,))
def exc_info_restored_after_inner_handlers(x):
    seen = []
    try:
        {}["outer"]
    except KeyError:
        seen.append(_exc_name())
        for i in range(2):
            try:
                seen.append(10 // (x - i))
            except ZeroDivisionError:
                seen.append(_exc_name())
            seen.append(_exc_name())
    seen.append(_exc_name())
    return seen


@cases(([1, 0, 2],),)
def exc_info_inside_with_inside_handler(xs):
    log = []
    for x in xs:
        try:
            [][x]
        except IndexError:
            try:
                with Recorder(log, "h"):
                    log.append(4 // x)
            except ZeroDivisionError:
                log.append(_exc_name())
            log.append(_exc_name())
    log.append(_exc_name())
    return log


@cases((True,), (False,))
def handler_translates_or_reraises(strict):
    data = {}
    try:
        try:
            return data["key"]
        except KeyError:
            if strict:
                raise ValueError("strict lookup failed")
            raise
    except ValueError as e:
        return "translated", e.args
    except KeyError as e:
        return "reraised", e.args


@cases((1,), (2,))
def handler_rebinds_name_then_raises(mode):
    try:
        try:
            return [][mode]
        except IndexError as e:
            e = CorpusError("rebound", mode)
            raise e
    except CorpusError as err:
        return err.args


@cases((0,), (1,))
def handler_reraises_after_cleanup_loop(x):
    log = []
    try:
        try:
            log.append(1 // x)
        except ZeroDivisionError:
            for i in range(3):
                log.append(i)
                if i == 1:
                    break
            raise
    except ArithmeticError as e:
        log.append(type(e).__name__)
    return log


class ErrorPolicy:
    def __init__(self):
        self.lookups = 0

    @property
    def error(self):
        self.lookups += 1
        return KeyError


@cases(("a",), ("zz",))
def except_clause_attribute_property_side_effect(key):
    policy = ErrorPolicy()
    d = {"a": 1}
    for _ in range(2):
        try:
            d[key] += 1
        except policy.error:
            d[key] = 0
    return d, policy.lookups


@cases((3,), (0,))
def system_exit_caught_by_function(code):
    import sys

    def quit_now(c):
        if c:
            sys.exit(c)
        return "no exit"

    try:
        return quit_now(code)
    except SystemExit as e:
        return "exit", e.code


@cases((2,),)
def keyboard_interrupt_like_base_exception(n):
    class Stop(BaseException):
        pass

    def work(i):
        return [Stop][i - n]()

    out = []
    for i in range(n + 1):
        try:
            out.append(type(work(i)).__name__)
        except BaseException as e:  # noqa: BLE001
            out.append(("base", type(e).__name__))
    return out


@cases(([1, 0, 2],), ([0],))
def exitstack_with_suppress_in_loop(xs):
    out = []
    for x in xs:
        with contextlib.ExitStack() as stack:
            stack.enter_context(contextlib.suppress(ZeroDivisionError))
            stack.enter_context(Recorder(out, "r"))
            out.append(4 // x)
    return out


@cases((0,), (1,))
def suppress_wraps_try_with_reraising_handler_in_callee(x):
    def callee():
        try:
            return 1 // x
        except ZeroDivisionError:
            raise

    with contextlib.suppress(ZeroDivisionError):
        return callee()
    return "suppressed"


@cases((0,), (1,))
def error_in_nested_with_inside_except_inside_suppress(x):
    log = []
    with contextlib.suppress(ZeroDivisionError):
        try:
            {}["k"]
        except KeyError:
            with Recorder(log, "inner"):
                log.append(1 // x)
        log.append("after try")
    return log


@cases(([1, 0],),)
def error_caught_by_try_around_generator_resume(xs):
    log = []

    def gen():
        for x in xs:
            with Recorder(log, "g"):
                yield 2 // x

    g = gen()
    while True:
        try:
            log.append(next(g))
        except ZeroDivisionError:
            log.append("gen error")
            break
        except StopIteration:
            break
    return log


@cases((True,), (False,))
def handler_translates_before_bare_raise(strict):
    data = {}
    try:
        try:
            return data["key"]
        except KeyError:
            if strict:
                raise ValueError("strict lookup failed")
            raise
    except ValueError as e:
        return "translated", e.args


@cases(("a",), ("zz",))
def except_clause_property_side_effect_in_caller(key):
    policy = ErrorPolicy()

    def lookup(d):
        return d[key]

    try:
        return lookup({"a": 1}), policy.lookups
    except policy.error:
        return "missing", policy.lookups


@cases(([1, 2, 3],), ([1, 2, 0],))
def error_replaced_in_finally_in_loop(xs):
    log = []
    for x in xs:
        try:
            try:
                log.append(6 // x)
            finally:
                log.append(int("%d" % x))
        except ZeroDivisionError:
            log.append("never replaced")
    return log
