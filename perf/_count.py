"""Run one workload once, for instruction counting under callgrind:
``python perf/_count.py WORKLOAD plain|vaccinated N``.

Both modes import and compile the same things; only the code run differs, so
the difference of two runs with different N isolates the loop itself.  The
workload runs inside ``operator.call`` (the C function ``_operator_call``,
which nothing else here calls): callgrind's ``--toggle-collect`` counts it
alone, not the start-up (importing torch: billions of instructions, whose
count moves by more than the loop's between two processes)."""

from __future__ import annotations

import operator
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    workload, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    import workloads

    if workload.startswith("train-"):
        import torch

        torch.set_num_threads(1)
        plain, vacc = workloads.compile_both(workloads.TRAINING, "training")
        ns = workloads.load(vacc if mode == "vaccinated" else plain)
        kind = workload.split("-", 1)[1]
        data = ns["make_data"](kind, n, 16)
        model = ns["make_model"](kind)
        operator.call(ns["train"], model, data)
    elif workload == "module-level":
        import torch

        torch.set_num_threads(1)
        plain, vacc = workloads.compile_both(workloads.MODULE_LEVEL, "module_level", True)
        operator.call(workloads.load, vacc if mode == "vaccinated" else plain, STEPS=n)
    else:
        plain, vacc = workloads.compile_both(workloads.TIGHT, "tight")
        ns = workloads.load(vacc if mode == "vaccinated" else plain)
        operator.call(ns[workload], n)


if __name__ == "__main__":
    main()
