"""``python -m daifu stacks --job PID``: what every rank of a hung job is doing,
and which rank or collective is out of step.

Each rank answers (through the job's store, ``_jobstore``) with its threads'
Python stacks and its last collectives as PyTorch's flight recorder has them
-- per process group, the collective's sequence number, its name, its input
sizes and the Python line that issued it.  Then:

* **behind**: in a process group, a rank whose last collective has a lower
  sequence number than the others' is behind -- they wait in a collective it
  has not issued yet; where its main thread is says why;
* **out of order or size**: where the ranks issued the same sequence number
  with another collective or other sizes, that collective is named with each
  rank's line (gloo fails there with a size mismatch or hangs; NCCL hangs or
  reduces garbage);
* without the recorder (``TORCH_FR_BUFFER_SIZE=0``), a rank whose main
  thread is not inside ``torch.distributed`` while others are is named.

The flight recorder's *state* of an entry is not used: with gloo it stays
"scheduled" for completed collectives too; sequence numbers are what the
ranks agree on.
"""

from __future__ import annotations

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any


def _short(c: dict) -> str:
    sizes = c.get("sizes")
    return (f"#{c['seq']} {c['name'] or 'collective'}"
            + (f" {sizes}" if sizes not in (None, [], [[]]) else "") + f" at {c['where']}")


def behind_in(collectives: dict[int, list[dict]]) -> tuple[list[int], list[int], dict]:
    """In one process group's records of each rank (its collectives, in
    order): the ranks behind, the ranks ahead (at the highest sequence
    number), and each rank's last collective (None: none yet)."""
    last = {r: (cs[-1] if cs else None) for r, cs in collectives.items()}
    top = max((c["seq"] for c in last.values() if c is not None), default=0)
    ahead = sorted(r for r, c in last.items() if c is not None and c["seq"] == top)
    late = sorted(r for r, c in last.items() if c is None or c["seq"] < top)
    return late, ahead, last


def diagnose(answers: dict[int, dict]) -> list[str]:
    """What is out of step in a job, from its ranks' ``stacks`` answers."""
    lines: list[str] = []
    recorded = {r: a["collectives"] for r, a in answers.items()
                if isinstance(a.get("collectives"), list)}
    if recorded and len(recorded) > 1:
        groups = sorted({c["pg"] for cs in recorded.values() for c in cs})
        for pg in groups:
            mine = {r: [c for c in cs if c["pg"] == pg] for r, cs in recorded.items()}
            late, ahead, last = behind_in(mine)
            label = f"process group {pg}"
            if late and ahead:
                sample = last[ahead[0]]
                assert sample is not None  # (ahead ranks have entries)
                for r in late:
                    theirs = last[r]
                    had = _short(theirs) if theirs is not None else "none yet"
                    lines.append(f"rank {r} is behind in {label}: its last collective is {had}; "
                                 f"rank{'s' if len(ahead) > 1 else ''} "
                                 f"{', '.join(map(str, sorted(ahead)))} issued {_short(sample)} "
                                 f"and wait{'s' if len(ahead) == 1 else ''} in it")
                    at = answers[r].get("at")
                    if at:
                        lines.append(f"  rank {r} is at {at}")
            differing = _first_difference(mine)
            if differing:
                lines.append(f"collective #{differing[0]} of {label} differs between the ranks:")
                for r, c in differing[1]:
                    lines.append(f"  rank {r}: {_short(c)}")
        if lines:
            return lines
    # no recorder (or nothing out of step in it): where the main threads are
    inside = {r for r, a in answers.items() if "torch/distributed" in str(a.get("innermost"))}
    elsewhere = sorted(set(answers) - inside)
    if inside and elsewhere:
        lines.append(f"ranks {', '.join(map(str, sorted(inside)))} wait in a collective; rank"
                     f"{'s' if len(elsewhere) > 1 else ''} {', '.join(map(str, elsewhere))} "
                     f"{'are' if len(elsewhere) > 1 else 'is'} elsewhere (behind):")
        for r in elsewhere:
            lines.append(f"  rank {r}: {answers[r].get('at') or answers[r].get('innermost')}")
    return lines


def _first_difference(mine: dict[int, list[dict]]) -> tuple[int, list[tuple[int, dict]]] | None:
    """The first sequence number that several ranks issued as different
    collectives (name or sizes), with each rank's entry."""
    by_seq: dict[int, dict[int, dict]] = {}
    for r, cs in mine.items():
        for c in cs:
            by_seq.setdefault(c["seq"], {})[r] = c
    for seq in sorted(by_seq):
        entries = by_seq[seq]
        if len(entries) < 2:
            continue
        kinds = {(c["name"], repr(c.get("sizes"))) for c in entries.values()}
        if len(kinds) > 1:
            return seq, sorted(entries.items())
    return None


def render(rank: int, answer: dict[str, Any], where: str) -> list[str]:
    """One rank's answer: its threads' stacks (main thread first) and its last
    collectives."""
    out = [f"=== rank {rank} ({where})"]
    if not answer.get("ok", True) and answer.get("error"):
        return out + [f"  ({answer['error']})"]
    for thread in answer.get("threads") or []:
        out.append(f"Thread {thread['thread']}{' (main)' if thread.get('main') else ''}, "
                   "most recent call last:")
        for filename, lineno, name, line in thread["frames"]:
            out.append(f'  File "{filename}", line {lineno}, in {name}')
            if line:
                out.append(f"    {line}")
    collectives = answer.get("collectives")
    if collectives is None:
        out.append("last collectives: (PyTorch's flight recorder is off)")
    elif collectives:
        out.append("last collectives:")
        out += [f"  group {c['pg']}: {_short(c)}" for c in collectives[-6:]]
    return out
