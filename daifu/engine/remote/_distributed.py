"""Distributed jobs (torchrun, or any launcher that sets RANK and WORLD_SIZE).

Three things, all quiet outside an initialized process group of more than
one rank:

* **Peers survive a slow fix.**  A rank that waits for a fix blocks its peers
  in their next collective; gloo (and NCCL) end that collective after the
  process group's timeout.  Every process group the program creates gets its
  timeout extended by the longest a rank of this job may wait for a fix
  (``--wait``; a console: ``DAIFU_PEER_TIMEOUT``, a day by default).  When
  nobody fixes it, the waiting rank gives up as without daifu, exits, and the
  launcher ends its peers at once.

* **Rank-local decisions are checked before they run** (``local_reason``).
  Retrying a statement that already ran a collective on this rank, skipping a
  statement that runs one, or continuing a loop past collectives would put
  this rank's collectives out of step with its peers' (a gloo size-mismatch
  abort, or silently mixed steps).  PyTorch's flight recorder (on by
  default: ``TORCH_FR_BUFFER_SIZE``) lists this rank's recent collectives with
  their Python stacks: the check reads which statements of the crashed
  function issued them.  Where it cannot tell, it refuses.

* **Job decisions are agreed** (``agree``).  A decision for all ranks (``send
  --job``, the console's ``all``, a rule returning ``daifu.all_ranks(...)``)
  runs only when every rank of the job is at the same crash and takes the same
  decision; ranks meet in the process group's store.
"""

from __future__ import annotations

import builtins
import os
import sys
import threading
import time
import types

from ..._errors import PatchError
from ..._record import field
from ..._runtime import RUNTIME, state_record
from ...cells import get as loaded_file
from .._decision import CONTINUE, RETRY, SKIP, Decision
from .._events import TimeoutExtended, emit
from .._job import distributed

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    import ast
    from typing import Any

    from .._crash import Crash

#: how long a rank waits for its peers to take the same job decision (s),
#: unless ``DAIFU_AGREE_TIMEOUT`` says otherwise
AGREE_TIMEOUT_S = 30.0
#: the peers' extra collective timeout while a console may wait (s)
_DAY = 86400.0


def active() -> bool:
    """An initialized process group of several ranks (torchrun, mp.spawn, ...)."""
    return _group() is not None


def _group():
    """The default process group, when there is one of several ranks."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
            return None
        return dist.distributed_c10d._get_default_group()
    except Exception:
        return None


# -- peers survive a slow fix -------------------------------------------------------


def peer_timeout_s(waiters: Any = ()) -> float:
    """How much longer a collective must wait for a rank that waits for a fix
    (``waiters``: the engine's, a person or a control endpoint)."""
    env = os.environ.get("DAIFU_PEER_TIMEOUT")
    if env is not None:
        try:
            return max(0.0, float(env))
        except ValueError:
            pass
    longest = 0.0
    for waiter in waiters:
        wait = getattr(waiter, "wait_s", 0.0)
        if getattr(waiter, "console", False) or wait is None:
            return _DAY
        longest = max(longest, float(wait))
    return longest + 60.0 if longest else 0.0


def extend_collective_timeouts(waiters: Any, on_group: Any = None) -> None:
    """Patch ``torch.distributed.distributed_c10d`` (once it is imported): every
    process group is created with its timeout plus ``peer_timeout_s()`` for
    the engine's waiters then (``waiters()``); then the rank's relay starts,
    and ``on_group()`` is called (the watchdog starts)."""
    c10d: Any = sys.modules.get("torch.distributed.distributed_c10d")
    helper = getattr(c10d, "_new_process_group_helper", None)
    if helper is None or getattr(helper, "_daifu_extended", False):
        if helper is None and c10d is not None:
            _warn("cannot extend process-group timeouts (this PyTorch has no "
                  "_new_process_group_helper): a fix that takes longer than the timeout "
                  "loses the job")
        return

    def _new_process_group_helper(*args, **kwargs):
        import datetime  # lazy: 2.8 ms

        timeout = kwargs.get("timeout")
        extra = peer_timeout_s(waiters())
        if extra and isinstance(timeout, datetime.timedelta):
            kwargs["timeout"] = timeout + datetime.timedelta(seconds=extra)

            emit(TimeoutExtended(group=str(kwargs.get("group_desc") or ""),
                                 timeout_s=timeout.total_seconds(),
                                 extended_s=kwargs["timeout"].total_seconds()))
        made = helper(*args, **kwargs)
        from ._jobstore import start_relay  # lazy: 41.3 ms

        start_relay()  # (once: the ranks on other nodes are reached through the store)
        if on_group is not None:
            on_group()
        return made

    _new_process_group_helper._daifu_extended = True  # type: ignore[attr-defined]
    _new_process_group_helper.__wrapped__ = helper  # type: ignore[attr-defined]
    c10d._new_process_group_helper = _new_process_group_helper


def _agree_timeout() -> float:
    try:
        return max(0.1, float(os.environ.get("DAIFU_AGREE_TIMEOUT", AGREE_TIMEOUT_S)))
    except ValueError:  # a bad value must not cost the decision: the default
        return AGREE_TIMEOUT_S


def _warn(text: str) -> None:
    sys.stderr.write(f"daifu: {text}\n")


# -- rank-local decisions ----------------------------------------------------------


def _collectives() -> list[dict[str, Any]] | None:
    """This rank's recent collectives issued by this thread, oldest first;
    None when the flight recorder is off."""
    try:
        from ._jobstore import flight_recorder_off  # lazy: 41.3 ms

        if flight_recorder_off():
            return None
        import pickle  # lazy: 2.1 ms

        import torch  # lazy: 1.7 s

        dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())  # type: ignore
    except Exception:
        return None
    me = str(threading.get_ident())
    entries = [e for e in dump.get("entries") or [] if str(e.get("thread_id")) == me]
    entries.sort(key=lambda e: e.get("record_id", 0))
    return entries


def _line_in(entry: dict[str, Any], code) -> int | None:
    """The line the crashed function was at when it issued ``entry``."""
    last = max((line for _, _, line in code.co_lines() if line is not None),
               default=code.co_firstlineno)
    for frame in entry.get("frames") or ():
        if frame.get("filename") == code.co_filename and frame.get("name") == code.co_name \
                and code.co_firstlineno <= int(frame.get("line") or 0) <= last:
            return int(frame["line"])
    return None


def _chain(entry: dict[str, Any], code) -> list[tuple[str, str, int]]:
    """The entry's Python frames from the crashed function inward."""
    frames = [(f.get("filename"), f.get("name"), int(f.get("line") or 0))
              for f in entry.get("frames") or ()]
    frames.reverse()  # outermost first
    for i, (filename, name, _) in enumerate(frames):
        if filename == code.co_filename and name == code.co_name:
            return frames[i:]
    return []


def _crash_chain(crash: Crash) -> list[tuple[str, str, int]]:
    """The exception's traceback from the crashed frame inward."""
    out = [(crash.filename, crash.frame.f_code.co_name, crash.lineno or 0)]
    tb = crash.exception.__traceback__
    while tb is not None and tb.tb_frame is not crash.frame:
        tb = tb.tb_next
    tb = tb.tb_next if tb is not None else None
    while tb is not None:
        code = tb.tb_frame.f_code
        out.append((code.co_filename, code.co_name, tb.tb_lineno))
        tb = tb.tb_next
    return out


def _issued_in_this_run(entry: dict[str, Any], crash: Crash) -> bool:
    """Was ``entry`` (issued under the failing statement) issued by this
    execution of it, before it failed -- rather than by an earlier iteration's?
    Compares where the collective was issued with where the exception was
    raised, frame by frame from the crashed function inward: a collective at
    an earlier line of the same function ran before the failure.  Where the
    two paths part in different functions, it cannot tell: yes."""
    issued, failed = _chain(entry, crash.frame.f_code), _crash_chain(crash)
    for (f1, n1, l1), (f2, n2, l2) in zip(issued, failed):
        if (f1, n1) != (f2, n2):
            return True
        if l1 != l2:
            return l1 < l2
    return True  # the same call issued it and failed (backward, a collective that raised)


def local_reason(decision: Decision, crash: Crash) -> str | None:
    """Why ``decision`` on this rank alone would put its collectives out of
    step with the other ranks'; None when it would not (or no process group).
    A refusal names what can work instead: another rank-local decision that
    the check allows, or a decision for every rank."""
    if decision not in (RETRY, SKIP, CONTINUE) or _group() is None:
        return None
    entries = _collectives()
    reason = _reason(decision, crash, entries)
    if reason is None:
        return None
    allowed = [d for d in (SKIP, RETRY, CONTINUE) if d is not decision
               and _cell_allows(d, crash) and _reason(d, crash, entries) is None]
    job = ("send it to every rank (python -m daifu send --job PID ..., the console's `all "
           "...`, or a rule returning daifu.all_ranks(...)) if all ranks crashed here")
    if allowed:
        how = f"{allowed[0].value} is safe on this rank alone; or {job}"
    else:
        how = f"{job}; nothing rank-local is safe here"
    return f"{reason}; {how}"


def _cell_allows(decision: Decision, crash: Crash) -> bool:
    cell = crash.cell
    return bool(cell.can_retry if decision is RETRY else
                cell.can_skip if decision is SKIP else cell.can_continue)


def _reason(decision: Decision, crash: Crash, entries) -> str | None:
    if entries is None:
        return (f"{decision.value} on rank {_rank()} alone could put its collectives out of "
                f"step, and PyTorch's flight recorder is off (TORCH_FR_BUFFER_SIZE=0) so daifu "
                f"cannot tell")
    code = crash.frame.f_code
    first, last = crash.cell.lineno or crash.lineno or 0, crash.cell.end_lineno or \
        crash.cell.lineno or crash.lineno or 0
    here = [(e, line) for e in entries if (line := _line_in(e, code)) is not None]
    in_statement = [e for e, line in here if first <= line <= last]
    if decision is RETRY:
        if in_statement and here[-1][0] is in_statement[-1] and \
                _issued_in_this_run(in_statement[-1], crash):
            return (f"the failing statement already ran {_name(in_statement[-1])} on rank "
                    f"{_rank()} before it failed; running it again would run that collective "
                    f"twice while the other ranks have gone past it")
        return None
    if decision is SKIP:
        # what the statement ran before it failed is done; what it would have
        # run after the failing point (as an earlier iteration ran it) is left out
        left_out = [e for e in in_statement if not _issued_in_this_run(e, crash)]
        if left_out:
            return (f"skipping the failing statement on rank {_rank()} alone would leave out "
                    f"{_name(left_out[-1])}, which it runs and the other ranks wait in")
        return _unseen(decision, crash, here)
    ran = {id(e) for e in in_statement if _issued_in_this_run(e, crash)}
    left_out = [(line, e) for e, line in here if line > last] + \
        [(line, e) for e, line in here if first <= line <= last and id(e) not in ran]
    if left_out:
        # the first collective it would leave out, as the last iteration ran it
        line, entry = min(left_out, key=lambda item: (item[0], -item[1].get("record_id", 0)))
        return (f"going on with the loop's next item on rank {_rank()} alone would leave out "
                f"{_name(entry)} at line {line}, which the other ranks run in this iteration")
    return _unseen(decision, crash, here)


def _unseen(decision: Decision, crash: Crash, here: list) -> str | None:
    """Why ``decision`` may leave out a collective the flight recorder has not
    seen yet (a first pass through the loop): a call in what it leaves out
    that is, or may reach, ``torch.distributed`` (``_left_out``)."""
    what = ("skipping the rest of the failing statement" if decision is SKIP else
            "going on with the loop's next item")
    calls = _left_out(decision, crash)
    if calls is None:
        if here:
            return None  # (no source to read: the recorder's word, as it saw the code run)
        return (f"{decision.value} on rank {_rank()} alone: this rank has no record yet of "
                f"the collectives {crash.function}() runs, and its source cannot be read, "
                f"so daifu cannot tell whether the other ranks wait for one that "
                f"{decision.value} would leave out")
    if not calls:
        return None
    line, text, verdict = next((c for c in calls if c[2] == "collective"), calls[0])
    if verdict == "collective":
        return (f"{what} on rank {_rank()} alone would leave out {text} at line {line}, a "
                f"collective the other ranks run")
    return (f"{what} on rank {_rank()} alone would leave out {text} at line {line}, which "
            f"may run a collective the other ranks wait in (daifu cannot tell that it runs "
            f"none, and this rank has no record of it running yet)")


# -- what the code a decision leaves out may run (read from the source) -----------------
#
# The flight recorder knows only the collectives this rank has issued: in the
# first pass through a loop, a collective further down the loop body (an
# epoch-end all_reduce) is not in it yet.  So what a rank-local skip or
# continue leaves out is also read from the source: every call in it is
# resolved in the crashed frame (without running anything: attributes are
# looked up statically) and judged.  Only code made of calls that cannot reach
# ``torch.distributed`` -- builtins, methods of builtin types and tensors,
# the standard library -- is left out on one rank alone.

#: where collectives live (a call into these issues one)
_COLLECTIVE = ("torch.distributed", "torch.nn.parallel", "torch._C._distributed")
#: parts of torch besides its C operators known to issue none
_NO_COLLECTIVE = ("torch.autograd.grad_mode", "torch.amp.autocast_mode",
                  "torch.utils._contextlib", "torch._tensor_str")
_UNKNOWN = object()


def _module_verdict(module: str) -> str:
    if module.startswith(_COLLECTIVE):
        return "collective"
    if module.startswith(_NO_COLLECTIVE) or module == "builtins" or (
            not module.startswith("torch") and module.split(".", 1)[0] in
            getattr(sys, "stdlib_module_names", ())):
        return "safe"
    return "unknown"


def _verdict(obj: Any) -> str:
    """Can calling ``obj`` issue a collective: "collective", "safe" (it cannot
    reach ``torch.distributed``), or "unknown"."""

    if obj is _UNKNOWN:
        return "unknown"
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, (types.BuiltinFunctionType, types.MethodDescriptorType,
                        types.WrapperDescriptorType, types.MethodWrapperType,
                        types.ClassMethodDescriptorType)):
        owner = getattr(obj, "__objclass__", None)
        if owner is None:
            bound = getattr(obj, "__self__", None)
            owner = bound if isinstance(bound, type) else type(bound) if bound is not None \
                and not isinstance(bound, types.ModuleType) else None
        module = getattr(owner, "__module__", None) or getattr(obj, "__module__", None) or ""
        # C code: a collective only where it is torch's distributed bindings
        return "collective" if str(module).startswith(_COLLECTIVE) else "safe"
    if isinstance(obj, type):
        return _module_verdict(obj.__module__ or "")
    if isinstance(obj, types.MethodType):
        obj = obj.__func__
    if isinstance(obj, types.FunctionType):
        return _module_verdict(getattr(obj, "__module__", None) or "")
    return "unknown"  # (an object with __call__, a partial, ...: it may run anything)


def _resolve(node: ast.expr, frame, rebound: set[str]) -> Any:
    """What a call's callee names in ``frame``, looked up without running
    anything (``inspect.getattr_static``); ``_UNKNOWN`` where that cannot be
    told (a name the left-out code binds again, a property, ``__getattr__``)."""
    import ast  # lazy: 2.9 ms
    import inspect  # lazy: 7.2 ms

    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id in rebound:
        return _UNKNOWN
    try:
        scopes = (frame.f_locals, frame.f_globals, vars(builtins))
        obj = next((ns[node.id] for ns in scopes if node.id in ns), _UNKNOWN)
        for n, attr in enumerate(reversed(parts)):
            if obj is _UNKNOWN:
                return _UNKNOWN
            obj = inspect.getattr_static(obj, attr)
            last = n == len(parts) - 1
            if not last and not isinstance(obj, types.ModuleType) and \
                    hasattr(type(obj), "__get__") and not isinstance(obj, type):
                return _UNKNOWN  # (a descriptor on the way: running it is a call)
            if last and isinstance(obj, (property, types.GetSetDescriptorType,
                                         types.MemberDescriptorType)):
                return _UNKNOWN
    except Exception:
        return _UNKNOWN
    return obj


def _calls(nodes: list[ast.AST], frame, rebound: set[str]) -> list[tuple[int, str, str]]:
    """(line, source text, verdict) of every call and implicit call (a ``for``
    over something other than ``range``, a ``with``, an ``await``) in
    ``nodes`` that is not "safe" -- nested functions and classes left out
    (defining one runs nothing of it)."""
    import ast  # lazy: 2.9 ms

    out: list[tuple[int, str, str]] = []
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(getattr(node, "decorator_list", []))
            stack.extend(d for d in node.args.defaults + node.args.kw_defaults if d)
            continue
        if isinstance(node, ast.ClassDef):
            out.append((node.lineno, f"class {node.name}", "unknown"))
            continue
        verdict = ""
        if isinstance(node, ast.Call):
            verdict = _verdict(_resolve(node.func, frame, rebound))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            it = node.iter
            ranged = isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and \
                it.func.id == "range" and _resolve(it.func, frame, rebound) is range
            verdict = "safe" if ranged and isinstance(node, ast.For) else "unknown"
            text = f"for ... in {ast.unparse(it)}"
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            sure = isinstance(node, ast.With) and all(
                isinstance(item.context_expr, ast.Call) and _verdict(_resolve(
                    item.context_expr.func, frame, rebound)) == "safe" for item in node.items)
            verdict = "safe" if sure else "unknown"
            text = "with " + ", ".join(ast.unparse(i.context_expr) for i in node.items)
        elif isinstance(node, (ast.Await, ast.AsyncFor, ast.AsyncWith)):
            verdict = "unknown"
        if verdict and verdict != "safe":
            if isinstance(node, ast.Call) or isinstance(node, ast.Await):
                text = ast.unparse(node)
            out.append((getattr(node, "lineno", 0), text if len(text) <= 60 else
                        text[:57] + "...", verdict))
        stack.extend(ast.iter_child_nodes(node))
    out.sort()
    return out


def _source_of(crash: Crash) -> tuple[Any, ast.stmt, list[ast.AST]] | None:
    """(the crashed function's AST, the failing statement, the path of nodes
    from the function down to it), from the source the frame runs; None where
    it cannot be read."""
    import ast  # lazy: 2.9 ms

    from ...cells import ModuleSource, cells_of, original_code, source_for_file  # lazy: 9.5 ms

    try:
        code = crash.frame.f_code
        plain = original_code(code)
        info = cells_of(code)
        loaded = loaded_file(plain.co_filename)
        msrc = ModuleSource(info.source, plain.co_filename) if info is not None and \
            info.source is not None else loaded.msrc if loaded is not None else \
            source_for_file(plain.co_filename)
        if msrc is None:
            return None
        scope: Any = msrc.scope_for(plain)
        cell = crash.cell
        stmt = msrc.statements(scope).lookup((cell.lineno, cell.end_lineno, cell.col,
                                              cell.end_col)) if scope is not None else None
    except Exception:
        return None
    if stmt is None:
        return None
    path: list[ast.AST] = []

    def find(node: ast.AST) -> bool:
        path.append(node)
        if node is stmt:
            return True
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt) and not isinstance(child, (
                    ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and find(child):
                return True
        path.pop()
        return False

    for top in scope.body:
        if find(top):
            return scope, stmt, [scope, *path]
    return None


def _after(node: ast.AST, stmt: ast.stmt) -> bool:
    return (node.lineno, node.col_offset) >= (  # type: ignore[attr-defined]
        stmt.end_lineno, stmt.end_col_offset)


def _still_to_run(stmt: ast.stmt, position: tuple | None) -> list[ast.AST]:
    """The parts of the failing statement that would still run after the
    instruction that failed: calls that enclose it (``f(x[k])``: ``f``) and
    those that start after it.  Of a compound statement, its header only."""
    import ast  # lazy: 2.9 ms

    head: list[ast.AST]
    if isinstance(stmt, (ast.If, ast.While)):
        head = [stmt.test]
    elif isinstance(stmt, (ast.For, ast.AsyncFor)):
        head = [stmt.iter]
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        head = [i.context_expr for i in stmt.items]
    elif isinstance(stmt, ast.Match):
        head = [stmt.subject]
    else:
        head = [stmt]
    if not position or None in position:
        return head
    line, end_line, col, end_col = position
    out: list[ast.AST] = []
    for part in head:
        for node in ast.walk(part):
            if not isinstance(node, ast.Call):
                continue
            start = (node.lineno, node.col_offset)
            end = (node.end_lineno, node.end_col_offset)
            if start >= (end_line, end_col) or (start <= (line, col) and (end_line, end_col)
                                                 <= end and (start, end) != ((line, col),
                                                                            (end_line, end_col))):
                out.append(ast.Call(func=node.func, args=[], keywords=[], lineno=node.lineno,
                                    col_offset=node.col_offset, end_lineno=node.end_lineno,
                                    end_col_offset=node.end_col_offset))
    return out


def _left_out(decision: Decision, crash: Crash) -> list[tuple[int, str, str]] | None:
    """The calls ``decision`` (skip or continue) would leave out that may run
    a collective -- (line, text, verdict) --, read from the source; None
    where the source cannot be read."""
    import ast  # lazy: 2.9 ms

    found = _source_of(crash)
    if found is None:
        return None
    _, stmt, path = found
    nodes = _still_to_run(stmt, crash.position)
    if decision is CONTINUE and crash.kind != "loop-header":
        loops = [i for i, n in enumerate(path) if isinstance(n, (ast.For, ast.AsyncFor))
                 and n is not stmt]
        if not loops:
            return None
        loop: Any = path[loops[-1]]
        around = set(map(id, path))
        # the rest of the loop's body, and all of each `while` between the loop
        # and the statement (continuing the `for` leaves their next rounds out)
        for node in path[loops[-1] + 1:]:
            if isinstance(node, ast.While) and node is not stmt:
                nodes += [node.test, *node.body]
        blocks = [loop.body]
        while blocks:
            for node in blocks.pop():
                if _after(node, stmt):
                    nodes.append(node)
                elif id(node) in around and node is not stmt:
                    blocks += [getattr(node, name) for name in ("body", "orelse", "finalbody")
                               if getattr(node, name, None)]
                    blocks += [h.body for h in getattr(node, "handlers", ())]
                    blocks += [c.body for c in getattr(node, "cases", ())]
    bound = {t.id for n in nodes for t in ast.walk(n) if isinstance(t, ast.Name) and
             isinstance(t.ctx, (ast.Store, ast.Del))}
    return _calls(nodes, crash.frame, bound)


def _name(entry: dict[str, Any]) -> str:
    name = str(entry.get("profiling_name") or "a collective").split(":")[-1]
    return f"{name} (collective #{entry.get('collective_seq_id', '?')})"


def _rank() -> str:
    return os.environ.get("RANK", "?")


# -- job decisions ---------------------------------------------------------------
#
# The ranks meet in the job's store, which anyone who can reach its port may
# read and write (docs/architecture.md, "Security").  So every value a rank
# reads there is sealed with this user's key (``_seal``) for its place --
# the job, the round, the rank, the phase -- and one that is not is dropped
# (``store.dropped``).  A sealed value can still be replayed: a rank's value
# from an earlier attempt of the same round.  So a round has two phases:
# each rank posts its decision with a fresh nonce, then the nonces of every
# value it read; a rank goes on only when every rank posted the same
# nonces -- its own fresh one among them: each peer took part in *this*
# attempt, and all took the same values.


@state_record
class _Rounds:
    """This rank's agreements (``RUNTIME.parts``)."""

    #: how many agreement rounds this rank began (each round's number)
    rounds: int = 0
    rounds_lock: threading.Lock = field(default_factory=threading.Lock)
    #: is this rank handling a crash now (``mark_at_crash``)?
    at_crash_here: bool = False
    #: this user's key, read once (``_key``)
    key: bytes | None = None

    def __repr__(self) -> str:  # (never the key)
        return (f"_Rounds(rounds={self.rounds}, at_crash_here={self.at_crash_here}, "
                f"key={'set' if self.key is not None else None})")


_state = RUNTIME.part(__name__, _Rounds())

#: how long an agreement waits for its peers before it asks whether they are
#: at a crash at all (``mark_at_crash``)
AGREE_GRACE_S = 2.0


def _key() -> bytes:
    """This user's daifu key (``_seal.load_key``); raises ``SealError``."""
    if _state.key is None:
        from ._seal import load_key  # lazy: 12.4 ms

        _state.key = load_key(create=True)
    return _state.key


def _job() -> str:
    return str(distributed().get("job") or "")


def _world() -> tuple[Any, int, int]:
    """(the default process group's store, the world size, this rank)."""
    dist = sys.modules["torch.distributed"]
    return dist.distributed_c10d._get_default_store(), dist.get_world_size(), dist.get_rank()


def _crash_key(rank: int) -> str:
    return f"daifu/at-crash/{rank}"


def at_crash_here() -> bool:
    """Is this rank handling a crash (the watchdog's peers then wait for it)?"""
    return _state.at_crash_here


def mark_at_crash(on: bool) -> None:
    """Say in the job's store, sealed, whether this rank is handling a crash
    (an agreement's peers read it to fail fast).  Never raises."""
    _state.at_crash_here = bool(on)
    if not active():
        return
    try:
        from ._seal import seal  # lazy: 12.4 ms

        store, _, rank = _world()
        store.set(_crash_key(rank), seal(_key(), f"at-crash|{_job()}|{rank}",
                                         {"on": bool(on), "t": time.time()}))
    except Exception:
        pass


def _at_crash(store: Any, rank: int) -> bool:
    """Is ``rank`` handling a crash, as its sealed mark says?  A mark that is
    not the rank's (forged, moved) is dropped and counts as unknown: the
    agreement then waits its whole timeout, as without a mark."""
    from ._jobstore import dropped  # lazy: 41.3 ms
    from ._seal import SealError, unseal  # lazy: 12.4 ms

    name = _crash_key(rank)
    try:
        if not store.check([name]):
            return False
        text = store.get(name)
    except Exception:
        return True  # unknown: wait the whole agreement timeout
    try:
        return unseal(_key(), f"at-crash|{_job()}|{rank}", text).get("on") is True
    except SealError:
        dropped(name, f"not sealed for rank {rank}'s at-crash mark with this user's key: "
                      "forged, or moved from another rank or job")
        return True


class _NotAgreed(Exception):
    def __init__(self, absent: list[int] | None = None, forged: list[str] | None = None):
        super().__init__()
        self.absent, self.forged = absent or [], forged or []


class _Meeting:
    """Round ``n`` of this job's decisions for all ranks, in ``store`` (see above)."""

    def __init__(self, store: Any, key: bytes, job: str, n: int, world: int, rank: int):
        self.store, self.key, self.job, self.n = store, key, job, n
        self.world, self.rank = world, rank
        self.forged: dict[str, bytes] = {}  # key -> the value not sealed for it

    def name(self, rank: int, phase: str = "agree") -> str:
        return f"daifu/agree/{self.n}/{rank}" + ("/seen" if phase == "seen" else "")

    def _read(self, rank: int, phase: str) -> dict | None:
        """A rank's sealed value of ``phase`` ("agree", "seen"), or None (not
        there yet, or not sealed for it: dropped and named once)."""
        from ._jobstore import dropped  # lazy: 41.3 ms
        from ._seal import SealError, unseal  # lazy: 12.4 ms

        name = self.name(rank, phase)
        try:
            if not self.store.check([name]):
                return None
            text = bytes(self.store.get(name))
        except Exception:
            return None
        try:
            value = unseal(self.key, f"{phase}|{self.job}|{self.n}|{rank}", text)
        except SealError:
            if self.forged.get(name) != text:
                self.forged[name] = text
                dropped(name, f"not sealed for rank {rank}'s {phase} of round {self.n} of "
                              "this job with this user's key: forged, altered, another "
                              "user's, or moved from another rank, round or job")
            return None
        self.forged.pop(name, None)
        if phase == "agree" and not all(isinstance(value.get(f), str)
                                        for f in ("what", "nonce", "refuse")):
            return None
        if phase == "seen" and not isinstance(value.get("nonces"), dict):
            return None
        return value

    def _wait(self, names: list[str], seconds: float) -> None:
        """Until every key in ``names`` exists, at most ``seconds`` (a wait in
        the store, not a poll; keys holding a forged value exist already: the
        caller reads again a little later)."""
        import datetime  # lazy: 2.8 ms

        try:
            self.store.wait(names, datetime.timedelta(seconds=max(0.05, seconds)))
        except Exception:
            pass

    def run(self, mine: str, refuse: str, timeout: float) -> dict[int, dict]:
        """Every rank's value for this round (raises ``_NotAgreed``)."""
        from ._seal import seal  # lazy: 12.4 ms

        nonce = os.urandom(12).hex()
        own = {"what": mine, "nonce": nonce, "refuse": refuse}
        self.store.set(self.name(self.rank), seal(
            self.key, f"agree|{self.job}|{self.n}|{self.rank}", own))
        values = {self.rank: own}
        start = time.monotonic()
        end, grace = start + timeout, start + min(timeout, AGREE_GRACE_S)
        asked = False
        while len(values) < self.world:
            missing = [r for r in range(self.world) if r not in values]
            now = time.monotonic()
            if not asked and now >= grace:
                # fail fast: a peer that is not at a crash (it runs on, or waits
                # in a collective whose timeout nobody extends) cannot take it
                asked = True
                absent = [r for r in missing if not _at_crash(self.store, r)]
                if absent:
                    raise _NotAgreed(absent=absent)
            if now >= end:
                raise _NotAgreed(forged=sorted(self.forged))
            limit = (end if asked else grace) - now
            self._wait([self.name(r) for r in missing], min(limit, 0.25) if self.forged
                       else limit)
            for r in missing:
                value = self._read(r, "agree")
                if value is not None:
                    values[r] = value
            if self.forged and len(values) < self.world:
                time.sleep(0.05)
        # phase 2: every rank saw the same values, this attempt's (each
        # peer's list holds this rank's fresh nonce); once all values are
        # here the peers are known to be at it: a little longer than the timeout
        end = max(end, time.monotonic() + AGREE_GRACE_S)
        seen = self._post_seen(values)
        agreed = {self.rank}
        while len(agreed) < self.world:
            if time.monotonic() >= end:
                raise _NotAgreed(forged=sorted(self.forged))
            pending = [r for r in range(self.world) if r not in agreed]
            self._wait([self.name(r, "seen") for r in pending], min(end - time.monotonic(),
                                                                   0.25))
            differ = False
            for r in pending:
                theirs = self._read(r, "seen")
                if theirs is None:
                    continue
                if theirs["nonces"] == seen:
                    agreed.add(r)
                else:
                    differ = True
            if differ:  # a peer read other values (a stale or replayed one): read again
                changed = False
                for r in range(self.world):
                    value = self._read(r, "agree") if r != self.rank else None
                    if value is not None and value["nonce"] != values[r]["nonce"]:
                        values[r], changed = value, True
                if changed:
                    seen, agreed = self._post_seen(values), {self.rank}
            if len(agreed) < self.world:
                time.sleep(0.02)  # (a key that holds a forged value exists: no wait)
        return values

    def _post_seen(self, values: dict[int, dict]) -> dict[str, str]:
        from ._seal import seal  # lazy: 12.4 ms

        seen = {str(r): v["nonce"] for r, v in sorted(values.items())}
        self.store.set(self.name(self.rank, "seen"), seal(
            self.key, f"seen|{self.job}|{self.n}|{self.rank}", {"nonces": seen}))
        return seen

    def withdraw(self) -> None:
        """This rank's values of the round are gone (a later attempt of the
        round must not find them).  Never raises."""
        for phase in ("agree", "seen"):
            try:
                self.store.delete_key(self.name(self.rank, phase))
            except Exception:
                pass


def agree(decision: Decision, crash: Crash) -> None:
    """Wait until every rank of the job takes ``decision`` at the same crash;
    raise ``PatchError`` with the reason when they do not (in time), or when
    one of them cannot take it (``_job_reason``)."""
    from ._seal import SealError  # lazy: 12.4 ms

    group = _group()
    if group is None:
        return
    try:
        key = _key()
    except SealError as exc:
        raise PatchError(f"{decision.value} for all ranks: {exc} -- the ranks agree through "
                         "the job's store, sealed with this user's daifu key "
                         "(DAIFU_JOB_KEY_FILE)") from None
    with _state.rounds_lock:
        _state.rounds += 1
        n = _state.rounds
    store, world, rank = _world()
    mine = f"{crash.where}|{crash.statement}|{decision.value}"
    timeout = _agree_timeout()
    meeting = _Meeting(store, key, _job(), n, world, rank)
    try:
        theirs = meeting.run(mine, _job_reason(decision, crash) or "", timeout)
    except Exception as exc:
        with _state.rounds_lock:
            _state.rounds -= 1  # this round never happened; the next try reuses its number
        meeting.withdraw()  # and a later round must not find this rank's answer to this one
        absent = exc.absent if isinstance(exc, _NotAgreed) else []
        forged = exc.forged if isinstance(exc, _NotAgreed) else []
        if absent:
            names = ", ".join(map(str, absent))
            raise PatchError(f"{decision.value} for all ranks: rank{'s' if len(absent) > 1 else ''}"
                             f" {names} {'are' if len(absent) > 1 else 'is'} not at a crash (it "
                             "runs on, or waits in a collective), so it cannot take it; refused "
                             f"after {min(timeout, AGREE_GRACE_S):g}s -- fix the crashed rank "
                             "alone (a rank-local rule or the console)") from None
        why = "a rank that did not crash here waits in a collective"
        if forged:
            why = (f"what the job's store holds for {', '.join(forged)} is not sealed by a "
                   "rank of this job (dropped: see the store.dropped events)")
        elif not isinstance(exc, _NotAgreed):
            why += f" ({type(exc).__name__}: {exc})"
        raise PatchError(f"{decision.value} for all ranks: not every rank of the job took it "
                         f"within {timeout:g}s (DAIFU_AGREE_TIMEOUT) -- {why}; fix the crashed "
                         "rank alone") from None
    other = {r: v["what"] for r, v in sorted(theirs.items()) if v["what"] != mine}
    if other:
        r, v = next(iter(other.items()))
        where, _, rest = v.partition("|")
        raise PatchError(f"{decision.value} for all ranks: rank {r} is at a different crash or "
                         f"decision ({where}: {rest.rsplit('|', 1)[-1]}), so the ranks would not "
                         f"stay in step")
    refused = [(r, v["refuse"]) for r, v in sorted(theirs.items()) if v["refuse"]]
    if refused:  # (every rank read the same values: every rank refuses)
        raise PatchError(f"{decision.value} for all ranks refused: {refused[0][1]}")


def _job_reason(decision: Decision, crash: Crash) -> str | None:
    """Why this rank cannot take ``decision`` together with every other rank:
    a retry of a statement that already ran a collective in this execution
    would run it again on every rank -- in step, but an in-place all_reduce
    reduces twice.  Refused (rather than retried with the reduced tensors
    restored: daifu does not know which tensors a collective changed in place)."""
    if decision is not RETRY:
        return None
    entries = _collectives()
    if not entries:
        return None  # (the flight recorder off: docs/limitations.md)
    code = crash.frame.f_code
    first, last = crash.cell.lineno or crash.lineno or 0, crash.cell.end_lineno or \
        crash.cell.lineno or crash.lineno or 0
    here = [(e, line) for e in entries if (line := _line_in(e, code)) is not None]
    in_statement = [e for e, line in here if first <= line <= last]
    if in_statement and here[-1][0] is in_statement[-1] and \
            _issued_in_this_run(in_statement[-1], crash):
        return (f"the failing statement already ran {_name(in_statement[-1])} on rank "
                f"{_rank()} before it failed; retried on every rank it would run that "
                "collective again (in step, but an in-place all_reduce would reduce twice) "
                "-- instead, on every rank: exec what the statement should have made, then "
                "skip (the console's `all exec ...`, `all skip`), or `all next`")
    return None
