"""The in-situ fix for restore_workload.py: a transient failure -> retry,
with timing probes around the engine's work."""

import daifu


@daifu.on(RuntimeError)
def retry_transient(crash):
    probe = crash.globals["probe"]
    probe("rule")          # detection done: the engine called the rule
    probe("patched")       # (a transient error needs no state change)
    return daifu.RETRY     # patch available; the engine resumes the statement
