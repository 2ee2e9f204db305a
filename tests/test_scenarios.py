"""The crash benchmark (tests/scenarios/): every case recovered and proved.

The full run with the restore-time table is ``python -m tests.scenarios.run``
(see docs/benchmark.md); this suite runs the same proof per case.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="PyTorch not available")

from .scenarios.run import load_cases, run_case  # noqa: E402

pytestmark = pytest.mark.slow
CASES = load_cases()


#: the cases fixed in situ, and those resumed from a checkpoint in a new
#: process (``"mode": "resume"``: ``make test`` runs them in its other lane,
#: with tests/test_resume.py)
IN_SITU = [c for c in CASES if c.meta.get("mode") not in ("resume", "watch")]
RESUMED = [c for c in CASES if c.meta.get("mode") == "resume"]
#: distributed jobs that only look hung, or have a straggler: they run to
#: their end unchanged (in the other lane too, with tests/test_hang.py)
WATCHED = [c for c in CASES if c.meta.get("mode") == "watch"]


def _proved(case, tmp_path) -> None:
    result = run_case(case, tmp_path)
    assert result.ok, "\n".join(result.problems)
    assert result.recovered
    if case.meta.get("exact", True):
        assert result.exact
    assert result.restore_ms is not None and result.restart_s is not None


@pytest.mark.parametrize("case", IN_SITU, ids=[c.name for c in IN_SITU])
def test_case_recovered_in_situ_and_exact(case, tmp_path):
    _proved(case, tmp_path)


@pytest.mark.parametrize("case", RESUMED, ids=[c.name for c in RESUMED])
def test_case_resumed_from_its_checkpoint_and_exact(case, tmp_path):
    _proved(case, tmp_path)


@pytest.mark.parametrize("case", WATCHED, ids=[c.name for c in WATCHED])
def test_case_watched_runs_unchanged_and_names_only_its_straggler(case, tmp_path):
    result = run_case(case, tmp_path)
    assert result.ok, "\n".join(result.problems)
    assert result.recovered and result.exact


def test_benchmark_covers_the_scenarios_families_and_patch_kinds():
    scenarios = {c.meta["scenario"] for c in CASES}
    assert scenarios >= {"API misuse", "tensor mismatch", "out of memory", "device contention",
                         "path problem", "exceptional data", "non-deterministic runtime error"}
    assert {c.meta["family"] for c in CASES} >= {"vision CNN", "language model",
                                                 "reinforcement learning"}
    patches = " ".join(c.meta["patch"] for c in CASES)
    for kind in ("retry", "exec", "replace", "edit running loop", "skip"):
        assert kind in patches, kind
    assert len(CASES) >= 16
    # hangs: one named and survived, a straggler named, three false alarms silent
    assert any(c.meta.get("hang") for c in RESUMED)
    assert {c.meta["scenario"] for c in WATCHED} >= {
        "straggler", "false alarm: slow first step", "false alarm: long evaluation on rank 0",
        "false alarm: slow checkpoint write"}
    assert any(c.meta.get("mutating_call") for c in CASES)  # a non-idempotent case
    # framework-driven code, reached with default settings (first-call vaccination)
    frameworks = {m for c in CASES for m in c.meta.get("requires", [])}
    assert {"lightning", "transformers"} <= frameworks
    loader = [c for c in CASES if c.meta.get("loader_workers") is not None]
    assert {c.meta["loader_workers"] for c in loader} >= {0, 2}
    # distributed (torchrun, 2 ranks): a rule on one rank, a broadcast to all
    # ranks, a fix after the process-group timeout, a refused desynchronising decision
    ranked = [c for c in CASES if c.meta.get("ranks")]
    assert any(c.meta.get("waiting_ranks", 1) == 2 for c in ranked)
    assert any(c.meta.get("session_delay_s", 0) > 3 for c in ranked)
    assert any(c.meta.get("refused") for c in ranked)
    # two simulated nodes reached through the job's store; two jobs side by side
    assert any(c.meta.get("nodes", 1) > 1 for c in ranked)
    assert any(c.meta.get("concurrent") for c in ranked)
    assert any((c.programs / "fix.py").exists() and not c.meta.get("refused")
               for c in ranked)
    # resumed from daifu's checkpoint (not fixed in situ): after a crash and
    # after SIGTERM, with a shuffled loader's workers and the program's own RNGs
    resumed = [c for c in CASES if c.meta.get("mode") == "resume"]
    assert any(c.meta.get("sigterm_after") for c in resumed)
    assert any(not c.meta.get("sigterm_after") and c.meta.get("loader_workers") for c in resumed)
    assert {c.meta["family"] for c in resumed} >= {"vision CNN", "language model",
                                                   "reinforcement learning"}
