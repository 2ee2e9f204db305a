"""The long run: generated programs, plain vs vaccinated, until N are compared.

    python -m tests.fuzz.run -n 20000            (make fuzz N=20000)
    python -m tests.fuzz.run --seeds 0:40        (those seeds only)
    python -m tests.fuzz.run --check FILE        (one program, plain vs vaccinated)

Seeds are taken in order from ``--start``; each gives up to four programs
(tests/fuzz/program.py).  A program whose two plain runs differ, or whose plain
run is over its time budget, is not compared.  A difference is shrunk (fewest
statements and expressions that still differ the same way, with
pysource-minimize) and appended to ``OUT/findings.txt`` in the format of
tests/fuzz/kept_programs.txt; the figures go to stdout and ``OUT/summary.json``.
One process: programs run one after the other, each in a forked child.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import signal
import sys
import time
from pathlib import Path

from . import compare, program

ROOT = Path(__file__).resolve().parent.parent.parent
KEPT = Path(__file__).with_name("kept_programs.txt")


def kind_of(verdict: dict) -> tuple:
    """What a shrunk program must keep to count as the same difference."""
    plain, vacc = verdict["plain"], verdict["vaccinated"]
    if vacc is None:
        return ("no vaccinated result", verdict.get("why", "")[:40])
    fields = tuple(k for k in ("stdout", "exception", "message", "lines", "chain", "status")
                   if plain.get(k) != vacc.get(k))
    return ("outcome", fields)


def shrink(source: str, verdict: dict, budget: float, mode: str = "all",
           limit_s: float = 300.0) -> str:
    """The smallest program pysource-minimize finds that differs the same way."""
    from pysource_minimize import StopMinimization, minimize

    wanted = kind_of(verdict)
    deadline = time.monotonic() + limit_s

    def still_differs(candidate: str) -> bool:
        if time.monotonic() > deadline:
            raise StopMinimization
        got = compare.run(candidate, budget, mode)
        return got["verdict"] == "differs" and kind_of(got) == wanted

    try:
        return minimize(source, still_differs)
    except Exception:  # noqa: BLE001 - a shrink that fails keeps the whole program
        return source


def entry(name: str, status: str, found: str, source: str) -> str:
    return f"=== {name} | {status} | {found}\n{source.rstrip()}\n"


def parse_kept(path: Path = KEPT) -> list[dict]:
    """The programs of a kept file: ``[{"name", "status", "found", "source"}]``."""
    out: list[dict] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("=== "):
            name, status, found = (part.strip() for part in line[4:].split(" | ", 2))
            out.append({"name": name, "status": status, "found": found, "source": ""})
        elif out:
            out[-1]["source"] += line
    return out


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=1000, help="programs to compare (default 1000)")
    parser.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--seeds", help="START:END: these seeds only (instead of -n)")
    parser.add_argument("--budget", type=float, default=2.0,
                        help="seconds a plain run may take (default 2)")
    parser.add_argument("--shrink", type=int, default=20,
                        help="shrink at most this many differences (default 20)")
    parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "fuzz",
                        help="folder for findings.txt and summary.json (default .cache/fuzz)")
    parser.add_argument("--mode", choices=sorted(compare.SELECTIONS), default="all",
                        help="what is vaccinated: all (every function, the default), eager "
                        "(python -m daifu's default), lazy (--lazy)")
    parser.add_argument("--kinds", default=",".join(program.KINDS),
                        help=f"programs made from each seed (default {','.join(program.KINDS)})")
    parser.add_argument("--check", type=Path, help="compare this one program and exit")
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if not set(kinds) <= set(program.KINDS):
        parser.error(f"--kinds: one of {', '.join(program.KINDS)}")

    if args.check:
        verdict = compare.run(args.check.read_text(), args.budget, args.mode)
        print(compare.explain(verdict))
        print(f"verdict: {verdict['verdict']}")
        return 0 if verdict["verdict"] == "same" else 1

    args.out.mkdir(parents=True, exist_ok=True)
    findings = args.out / "findings.txt"
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    counts: collections.Counter = collections.Counter()
    seen: set[str] = set()
    shrunk = 0
    first, last = (map(int, args.seeds.split(":")) if args.seeds
                   else (args.start, sys.maxsize))
    started = time.monotonic()
    seed = first
    interrupted = False
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while seed < last and (args.seeds or counts["compared"] < args.n):
            made = program.programs(seed, kinds)
            counts["seeds"] += 1
            counts["not compiled"] += len(kinds) - len(made)
            for kind, source in made:
                verdict = compare.run(source, args.budget, args.mode)
                if verdict["verdict"] == "differs" and verdict["why"] == "over its time budget":
                    # (a busy machine: once more, with five times the time)
                    counts["rerun (time budget)"] += 1
                    verdict = compare.run(source, args.budget * 5, args.mode)
                counts[verdict["verdict"]] += 1
                if verdict["verdict"] in ("same", "differs"):
                    counts["compared"] += 1
                if verdict["verdict"] == "harness":
                    print(f"seed {seed} {kind}: harness: {verdict['why']}", flush=True)
                if verdict["verdict"] != "differs":
                    continue
                print(f"seed {seed} {kind}: DIFFERS\n{compare.explain(verdict)[:3000]}", flush=True)
                small = source
                if shrunk < args.shrink:
                    shrunk += 1
                    small = shrink(source, verdict, args.budget, args.mode)
                if small in seen:
                    continue
                seen.add(small)
                again = compare.run(small, args.budget, args.mode)
                with findings.open("a") as f:
                    f.write(entry(f"seed{seed}-{kind}-{args.mode}-py{python}", "new",
                                  f"{kind_of(verdict)}", small))
                print(f"shrunk to {len(small.splitlines())} lines:\n{small}\n"
                      f"{compare.explain(again)[:3000]}", flush=True)
            seed += 1
            if counts["seeds"] % 100 == 0:
                print(f"[{time.monotonic() - started:7.0f}s] seed {seed}: {dict(counts)}",
                      flush=True)
    except KeyboardInterrupt:  # (Ctrl-C or SIGTERM: the figures so far)
        interrupted = True
    elapsed = time.monotonic() - started
    summary = {"python": platform.python_version(), "mode": args.mode, "kinds": kinds,
               "interrupted": interrupted,
               "first_seed": first, "last_seed": seed - 1,
               "seconds": round(elapsed), **counts}
    (args.out / f"summary-{python}-{args.mode}.json").write_text(
        json.dumps(summary, indent=1) + "\n")
    print(f"Python {summary['python']} ({args.mode}): seeds {first}..{seed - 1}, "
          f"{counts['compared']} programs compared, {counts['same']} identical, "
          f"{counts['differs']} differ ({counts['unstable']} unstable and {counts['slow']} "
          f"over budget not compared; {counts['harness']} harness failures; "
          f"{counts['not compiled']} not compiled) in {elapsed:.0f} s"
          + (" (interrupted)" if interrupted else ""))
    return 1 if counts["differs"] or counts["harness"] else 0


if __name__ == "__main__":
    sys.exit(main())
