"""Sharded training state -- FSDP2 (``fully_shard``) and tensor parallelism,
whose parameters are ``DTensor`` shards -- written with
``torch.distributed.checkpoint`` (DCP), the format PyTorch users resume
from, instead of into each rank's ``torch.save`` file.

DCP writes one directory for the whole job (a ``.distcp`` file per rank and
rank 0's ``.metadata``, written last: without it the directory does not
load) in a collective of every rank.  So it is used only where every rank is
known to be there: a preempted job whose ranks agreed on one step
(``persist/_preempt``), each rank's main thread at the header of that step.
Rank 0 names the directory through the job's store once every rank said it
holds sharded state there (``Boundary.shards``); a rank that never says (it
saves from a thread, mid-iteration) makes rank 0 decide against it, and
every rank then saves its shards in its own file, as after a crash (one
rank alone) or a hang (every main thread stuck in a collective).  A
directory that a rank cannot see after the save (a checkpoint directory
local to each node) is not counted on: that rank's file holds its shards too.

The model's and the optimizer's state are taken with
``get_model_state_dict``/``get_optimizer_state_dict`` (the optimizer's by
the parameters' names), and set back with the ``set_`` pair after
``dcp.load`` filled them in.  An optimizer that has not stepped yet is left
to the file (DCP would make its state by a step with zero gradients).
"""

from __future__ import annotations

import os
import sys
import warnings

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

#: a module's or optimizer's entry in a rank's file whose state is in DCP
MARK = "daifu.dcp"


class ShardError(Exception):
    """DCP failed (``torch``'s ``CheckpointException`` is a BaseException:
    it is said as this, in one line)."""


def plan(objects: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The sharded modules among ``objects`` (``_checkpoint.collect``'s),
    and the optimizers that stepped over their parameters:
    ``{"modules": {name: module}, "optimizers": {name: (optimizer, module)}}``,
    or None where no module holds a ``DTensor``."""
    tensor = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(tensor, "DTensor", None)
    if not isinstance(dtensor, type):
        return None
    modules = {name: m for name, m in (objects.get("modules") or {}).items()
               if any(isinstance(p, dtensor) for p in m.parameters())}
    if not modules:
        return None
    owned = {name: {id(p) for p in m.parameters()} for name, m in modules.items()}
    optimizers: dict[str, tuple[Any, Any]] = {}
    for name, opt in (objects.get("optimizers") or {}).items():
        if not getattr(opt, "state", None):
            continue
        params = {id(p) for group in opt.param_groups for p in group["params"]}
        owner = next((m for mname, m in modules.items() if params <= owned[mname]), None)
        if owner is not None:
            optimizers[name] = (opt, owner)
    return {"modules": modules, "optimizers": optimizers}


def _dcp_failed(exc: BaseException) -> ShardError:
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return ShardError(f"torch.distributed.checkpoint: {type(exc).__name__}: {first}")


def write(shards: dict[str, Any], directory: str) -> dict[str, Any]:
    """Write ``shards`` (``plan``'s) into ``directory`` with ``dcp.save``:
    a collective, every rank at once.  The entry a rank's file keeps:
    ``{"dir": directory, "modules": [...], "optimizers": [...]}``.  Raises
    ``ShardError``."""
    try:
        import torch.distributed.checkpoint as dcp  # lazy: 60 ms
        from torch.distributed.checkpoint.state_dict import (  # lazy: 0.1 ms
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        state = {"modules": {n: get_model_state_dict(m) for n, m in shards["modules"].items()},
                 "optimizers": {n: get_optimizer_state_dict(m, o)
                                for n, (o, m) in shards["optimizers"].items()}}
        dcp.save(state, checkpoint_id=directory)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        raise _dcp_failed(exc) from None
    if not os.path.exists(os.path.join(directory, ".metadata")):
        raise ShardError(f"{directory}: rank 0's .metadata is not there from this rank "
                         "(a checkpoint directory not shared between the nodes)")
    return {"dir": directory, "modules": sorted(shards["modules"]),
            "optimizers": sorted(shards["optimizers"])}


def load(entry: dict[str, Any], directory: str, modules: dict[str, Any],
         optimizers: dict[str, Any]) -> None:
    """Set ``modules`` and ``optimizers`` (by the names in the file) from
    the DCP ``directory`` (a collective: every rank resumes at once).
    Raises ``ShardError``."""
    if not os.path.exists(os.path.join(directory, ".metadata")):
        raise ShardError(f"the sharded state's directory {directory} is missing or incomplete "
                         "(no .metadata): it was written by every rank of the job at once")
    owned = {name: {id(p) for p in m.parameters()} for name, m in modules.items()}
    owners: dict[str, Any] = {}
    for name, opt in optimizers.items():
        params = {id(p) for group in opt.param_groups for p in group["params"]}
        owner = next((m for mname, m in modules.items() if params <= owned[mname]), None)
        if owner is None:
            raise ShardError(f"{name}: its parameters are not those of a sharded module passed "
                             "with it; pass the model with its optimizer")
        owners[name] = owner
    try:
        import torch.distributed.checkpoint as dcp  # lazy: 60 ms
        from torch.distributed.checkpoint.state_dict import (  # lazy: 0.1 ms
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        for opt in optimizers.values():
            # (DCP makes a fresh optimizer's state by a step with zero
            # gradients, only where no parameter has a gradient)
            opt.zero_grad(set_to_none=True)
        state: dict[str, dict[str, Any]] = {
            "modules": {n: get_model_state_dict(m) for n, m in modules.items()},
            "optimizers": {n: get_optimizer_state_dict(owners[n], o)
                           for n, o in optimizers.items()}}
        # (each rank reads its own shards: no collective, whatever the others do)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.load(state, checkpoint_id=directory, no_dist=True)
        for name, module in modules.items():
            set_model_state_dict(module, state["modules"][name])
        for name, opt in optimizers.items():
            set_optimizer_state_dict(owners[name], opt, state["optimizers"][name])
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        raise _dcp_failed(exc) from None
    empty = sorted(n for n, o in optimizers.items() if not o.state)
    if empty:
        raise ShardError(f"{', '.join(empty)}: no optimizer state came from {directory}")
