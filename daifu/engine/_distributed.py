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

import os
import sys
import threading

from ._decision import CONTINUE, RETRY, SKIP, Decision

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

    from ._crash import Crash

#: how long a rank waits for its peers to take the same job decision (s),
#: unless ``DAIFU_AGREE_TIMEOUT`` says otherwise
AGREE_TIMEOUT_S = 30.0
#: the peers' extra collective timeout while a console may wait (s)
_DAY = 86400.0


def flight_recorder_off() -> bool:
    """PyTorch's flight recorder keeps each rank's recent collectives (2000 by
    default); the user can turn it off with ``TORCH_FR_BUFFER_SIZE=0``."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value) <= 0
            except ValueError:
                return False
    return False


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


def peer_timeout_s() -> float:
    """How much longer a collective must wait for a rank that waits for a fix."""
    env = os.environ.get("DAIFU_PEER_TIMEOUT")
    if env is not None:
        try:
            return max(0.0, float(env))
        except ValueError:
            pass
    from . import ENGINE

    longest = 0.0
    for waiter in ENGINE.waiters:
        wait = getattr(waiter, "wait_s", 0.0)
        if getattr(waiter, "console", False) or wait is None:
            return _DAY
        longest = max(longest, float(wait))
    return longest + 60.0 if longest else 0.0


def extend_collective_timeouts() -> None:
    """Patch ``torch.distributed.distributed_c10d`` (once it is imported): every
    process group is created with its timeout plus ``peer_timeout_s()``."""
    c10d: Any = sys.modules.get("torch.distributed.distributed_c10d")
    helper = getattr(c10d, "_new_process_group_helper", None)
    if helper is None or getattr(helper, "_daifu_extended", False):
        if helper is None and c10d is not None:
            _warn("cannot extend process-group timeouts (this PyTorch has no "
                  "_new_process_group_helper): a fix that takes longer than the timeout "
                  "loses the job")
        return

    def _new_process_group_helper(*args, **kwargs):
        import datetime

        timeout = kwargs.get("timeout")
        extra = peer_timeout_s()
        if extra and isinstance(timeout, datetime.timedelta):
            kwargs["timeout"] = timeout + datetime.timedelta(seconds=extra)
            from ._events import TimeoutExtended, emit

            emit(TimeoutExtended(group=str(kwargs.get("group_desc") or ""),
                                 timeout_s=timeout.total_seconds(),
                                 extended_s=kwargs["timeout"].total_seconds()))
        made = helper(*args, **kwargs)
        from ._jobstore import start_relay

        start_relay()  # (once: the ranks on other nodes are reached through the store)
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
        if flight_recorder_off():
            return None
        import pickle

        import torch

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
    if not here:
        return (f"{decision.value} on rank {_rank()} alone: this rank has no record yet of "
                f"the collectives {crash.function}() runs, so daifu cannot tell whether "
                f"the other ranks wait for one that {decision.value} would leave out")
    if decision is SKIP:
        # what the statement ran before it failed is done; what it would have
        # run after the failing point (as an earlier iteration ran it) is left out
        left_out = [e for e in in_statement if not _issued_in_this_run(e, crash)]
        if left_out:
            return (f"skipping the failing statement on rank {_rank()} alone would leave out "
                    f"{_name(left_out[-1])}, which it runs and the other ranks wait in")
        return None
    ran = {id(e) for e in in_statement if _issued_in_this_run(e, crash)}
    left_out = [(line, e) for e, line in here if line > last] + \
        [(line, e) for e, line in here if first <= line <= last and id(e) not in ran]
    if left_out:
        # the first collective it would leave out, as the last iteration ran it
        line, entry = min(left_out, key=lambda item: (item[0], -item[1].get("record_id", 0)))
        return (f"going on with the loop's next item on rank {_rank()} alone would leave out "
                f"{_name(entry)} at line {line}, which the other ranks run in this iteration")
    return None


def _name(entry: dict[str, Any]) -> str:
    name = str(entry.get("profiling_name") or "a collective").split(":")[-1]
    return f"{name} (collective #{entry.get('collective_seq_id', '?')})"


def _rank() -> str:
    return os.environ.get("RANK", "?")


# -- job decisions ---------------------------------------------------------------

_rounds = 0
_rounds_lock = threading.Lock()
#: how long an agreement waits for its peers before it asks whether they are
#: at a crash at all (``mark_at_crash``)
AGREE_GRACE_S = 2.0


def _crash_key(rank: int) -> str:
    return f"daifu/at-crash/{rank}"


def mark_at_crash(on: bool) -> None:
    """Say in the job's store whether this rank is handling a crash (an
    agreement's peers read it to fail fast).  Never raises."""
    if not active():
        return
    try:
        dist = sys.modules["torch.distributed"]
        store = dist.distributed_c10d._get_default_store()
        store.set(_crash_key(dist.get_rank()), "1" if on else "0")
    except Exception:
        pass


def _at_crash(store: Any, rank: int) -> bool:
    try:
        return bool(store.check([_crash_key(rank)])) and store.get(_crash_key(rank)) == b"1"
    except Exception:
        return True  # unknown: wait the whole agreement timeout, as before


def agree(decision: Decision, crash: Crash) -> None:
    """Wait until every rank of the job takes ``decision`` at the same crash;
    raise ``PatchError`` with the reason when they do not (in time)."""
    from .._errors import PatchError

    group = _group()
    if group is None:
        return
    dist = sys.modules["torch.distributed"]
    global _rounds
    with _rounds_lock:
        _rounds += 1
        n = _rounds
    world, rank = dist.get_world_size(), dist.get_rank()
    mine = f"{crash.where}|{crash.statement}|{decision.value}"
    import datetime

    timeout = _agree_timeout()
    key = f"daifu/agree/{n}/{rank}"
    store = None
    absent: list[int] = []
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(key, mine)
        keys = [f"daifu/agree/{n}/{r}" for r in range(world)]
        grace = min(timeout, AGREE_GRACE_S)
        try:
            store.wait(keys, datetime.timedelta(seconds=grace))
        except Exception:
            # fail fast: a peer that is not at a crash (it runs on, or waits
            # in a collective whose timeout nobody extends) cannot take it
            absent = [r for r in range(world) if r != rank and not _at_crash(store, r)]
            if absent:
                raise
            store.wait(keys, datetime.timedelta(seconds=max(timeout - grace, 0.1)))
        theirs = {r: store.get(k).decode() for r, k in enumerate(keys)}
    except Exception as exc:
        with _rounds_lock:
            _rounds -= 1  # this round never happened; the next try reuses its number
        try:  # and a later round must not find this rank's answer to this one
            if store is not None:
                store.delete_key(key)
        except Exception:
            pass
        if absent:
            names = ", ".join(map(str, absent))
            raise PatchError(f"{decision.value} for all ranks: rank{'s' if len(absent) > 1 else ''}"
                             f" {names} {'are' if len(absent) > 1 else 'is'} not at a crash (it "
                             "runs on, or waits in a collective), so it cannot take it; refused "
                             f"after {min(timeout, AGREE_GRACE_S):g}s -- fix the crashed rank "
                             "alone (a rank-local rule or the console)") from None
        raise PatchError(f"{decision.value} for all ranks: not every rank of the job took it "
                         f"within {timeout:g}s (DAIFU_AGREE_TIMEOUT) -- a rank that did "
                         f"not crash here waits in a collective; fix the crashed rank alone "
                         f"({type(exc).__name__})") from None
    other = {r: v for r, v in theirs.items() if v != mine}
    if other:
        r, v = next(iter(other.items()))
        where, _, rest = v.partition("|")
        raise PatchError(f"{decision.value} for all ranks: rank {r} is at a different crash or "
                         f"decision ({where}: {rest.rsplit('|', 1)[-1]}), so the ranks would not "
                         f"stay in step")
