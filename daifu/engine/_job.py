"""Where this process is in a distributed job: its rank, local rank and
world size, the job's identity, and what the ``{rank}``-style placeholders
of a file name stand for here.  Every event carries it (``_events``); the
job file, the journal, the console's ``ranks`` and the job's store read it."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any


def distributed() -> dict[str, Any]:
    """Where this process is in a distributed job (torchrun, or any launcher
    that sets ``RANK`` and ``WORLD_SIZE``): rank, local rank, world size and
    the job's identity; {} outside one.  Every event carries it."""
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return {}
    out: dict[str, Any] = {}
    for key, name in (("rank", "RANK"), ("local_rank", "LOCAL_RANK"),
                      ("world_size", "WORLD_SIZE")):
        try:
            out[key] = int(env[name])
        except (KeyError, ValueError):
            continue
    job = job_identity(env)
    if job:
        out["job"] = job
    return out


def job_file_info() -> dict[str, Any]:
    """``distributed()`` plus the job's store (``MASTER_ADDR:MASTER_PORT``),
    through which clients on any node reach every rank (``_jobstore``): what
    a rank's job file says of its job; {} outside one."""
    info = distributed()
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if info and addr and port:
        info["store"] = f"{addr}:{port}"
    return info


def job_identity(env: Any) -> str | None:
    """One name for every rank of one job, and for no other job's.

    torchrun's run id alone is not that: without ``--standalone`` or
    ``--rdzv-id`` every job gets the run id ``none``, and two such jobs on one
    machine would take each other's commands.  The address of the job's store
    (``MASTER_ADDR:MASTER_PORT``, which torchrun gives every rank of the job
    on every node) is: no two live jobs can listen on one port.  So the
    identity is ``RUN_ID@ADDR:PORT`` (``ADDR:PORT`` when the run id is
    ``none``), or the run id where no store address is set."""
    run_id = env.get("TORCHELASTIC_RUN_ID") or ""
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if addr and port:
        store = f"{addr}:{port}"
        return store if run_id in ("", "none") else f"{run_id}@{store}"
    return run_id or None


#: the file-name placeholders that name a rank
RANK_FIELDS = ("{rank}", "{local_rank}", "{world_size}")


def placeholders() -> dict[str, Any]:
    """What ``{rank}``, ``{local_rank}``, ``{world_size}`` and ``{pid}`` in a
    file name stand for here: the launcher's environment (torchrun), else the
    process group the program made (``mp.spawn`` sets no ``RANK``), else 0, 0
    and 1."""
    where: dict[str, Any] = {"rank": 0, "local_rank": 0, "world_size": 1}
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            where.update(rank=dist.get_rank(), local_rank=dist.get_rank(),
                         world_size=dist.get_world_size())
    except Exception:
        pass
    return {**where, **distributed(), "pid": os.getpid()}


def rank_unknown_yet(path: str) -> bool:
    """Does ``path`` name a rank that only a process group made later can
    tell (no ``RANK`` from a launcher)?"""
    return any(f in path for f in RANK_FIELDS) and "RANK" not in os.environ and \
        not placeholders().get("world_size", 1) > 1
